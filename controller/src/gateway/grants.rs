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

/// A Secret reference of a Gateway (a listener's certificate, its backend
/// client certificate), as the generated types spell them.
pub(crate) struct SecretRef<'a> {
    pub group: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
}

/// The TLS certificate a `from_kind` (Gateway, ListenerSet) in `gw_ns`
/// refers to: a core Secret, in another namespace only with a
/// ReferenceGrant from that kind. Otherwise the condition
/// reason and message: `invalid` (with `what` naming the reference) or
/// `RefNotPermitted`.
pub(crate) fn gateway_secret(
    snap: &Snapshot,
    from_kind: &str,
    gw_ns: &str,
    r: &SecretRef,
    what: &str,
    invalid: &str,
) -> Result<crate::model::tls::Certificate, (String, String)> {
    let refused = |m: String| (invalid.to_string(), m);
    let group = r.group.unwrap_or("");
    let kind = r.kind.unwrap_or("Secret");
    if !group.is_empty() || kind != "Secret" {
        return Err(refused(format!(
            "{what} {group}/{kind} {:?}: only core Secrets are supported",
            r.name
        )));
    }
    let ns = r.namespace.unwrap_or(gw_ns);
    if ns != gw_ns && !granted_to(snap, from_kind, gw_ns, ns, "Secret", r.name) {
        return Err((
            "RefNotPermitted".into(),
            format!(
                "Secret {ns}/{} is in another namespace and no ReferenceGrant there allows it",
                r.name
            ),
        ));
    }
    crate::model::tls::from_secret(&snap.secrets, ns, r.name).map_err(refused)
}
