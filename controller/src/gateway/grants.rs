//! ReferenceGrants: whether an object of the Gateway API may refer to one
//! in another namespace.

use crate::snapshot::Snapshot;

/// The Gateway API's group.
pub(crate) const GROUP: &str = "gateway.networking.k8s.io";

/// Whether a ReferenceGrant in `target_ns` lets a `from_kind` (of the
/// Gateway API group) in `from_ns` refer to the core `to_kind` `name`.
pub fn granted_to(snap: &Snapshot, from_kind: &str, from_ns: &str, target_ns: &str, to_kind: &str, name: &str) -> bool {
    snap.reference_grants
        .iter()
        .filter(|g| g.metadata.namespace.as_deref().unwrap_or("default") == target_ns)
        .any(|g| {
            g.spec
                .from
                .iter()
                .any(|f| f.group == GROUP && f.kind == from_kind && f.namespace == from_ns)
                && g.spec
                    .to
                    .iter()
                    .any(|t| t.group.is_empty() && t.kind == to_kind && t.name.as_deref().is_none_or(|n| n == name))
        })
}
