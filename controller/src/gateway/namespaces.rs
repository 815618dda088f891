//! Namespace label selectors, as listeners' `allowedRoutes` and
//! Gateways' `allowedListeners` use them: evaluated against the labels of
//! the watched Namespaces (Kubernetes' rules).

use std::collections::BTreeMap;

use crate::snapshot::Snapshot;

/// Whether the watched Namespace `ns` has labels `sel` selects.
pub(crate) fn selected(
    snap: &Snapshot,
    sel: &gateway_api_types::gateways::GatewayListenersAllowedRoutesNamespacesSelector,
    ns: &str,
) -> bool {
    let labels = snap
        .namespaces
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(ns))
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default();
    selects(sel, &labels)
}

/// Whether a label selector selects `labels` (Kubernetes semantics: every
/// `matchLabels` pair and every expression must hold; an unknown operator
/// selects nothing). An empty selector selects every namespace.
fn selects(
    sel: &gateway_api_types::gateways::GatewayListenersAllowedRoutesNamespacesSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    let pairs = sel.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let expressions = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    pairs && expressions
}
