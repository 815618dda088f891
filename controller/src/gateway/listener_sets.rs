//! ListenerSets: listeners that another object (often another namespace's
//! team) adds to a Gateway, when the Gateway allows it.
//!
//! A Gateway takes ListenerSets only through `spec.allowedListeners`
//! (`from`: `None`, the default, `Same`, `All` or `Selector`). The
//! listeners of the ListenerSets it takes join its own on its servers
//! (nginx `server`s per port), after its own and in precedence order
//! (oldest first, then by `namespace/name`), so that a conflict (the same
//! port and hostname, or another protocol on a port) always refuses the
//! later listener and never one already served. Routes reach a
//! ListenerSet's listeners only by naming the ListenerSet as a parent: a
//! route that names the Gateway attaches to the Gateway's own listeners.

use gateway_api_types::gateways::{Gateway, GatewayAllowedListenersNamespacesFrom as From, GatewayListeners};
use gateway_api_types::httproutes::HttpRouteParentRefs;
use gateway_api_types::listenersets::ListenerSet;

use super::grants::GROUP;
use crate::snapshot::{key, Snapshot};

/// The kind routes name as a parent.
pub const KIND: &str = "ListenerSet";

/// The object a listener belongs to: a Gateway (its own listeners) or a
/// ListenerSet attached to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner<'a> {
    /// `Gateway` or `ListenerSet`.
    pub kind: &'static str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl<'a> Owner<'a> {
    pub fn gateway(g: &'a Gateway) -> Owner<'a> {
        Owner {
            kind: "Gateway",
            namespace: g.metadata.namespace.as_deref().unwrap_or("default"),
            name: g.metadata.name.as_deref().unwrap_or(""),
        }
    }

    pub fn listener_set(ls: &'a ListenerSet) -> Owner<'a> {
        Owner {
            kind: KIND,
            namespace: ls.metadata.namespace.as_deref().unwrap_or("default"),
            name: ls.metadata.name.as_deref().unwrap_or(""),
        }
    }

    /// The key its listeners' states are filed under: `namespace/name`
    /// for a Gateway, `ListenerSet/namespace/name` for a ListenerSet (a
    /// namespace name has no `/`, so the two never meet).
    pub fn key(&self) -> String {
        match self.kind {
            "Gateway" => format!("{}/{}", self.namespace, self.name),
            kind => format!("{kind}/{}/{}", self.namespace, self.name),
        }
    }

    /// Whether a route in `route_ns` names this object as its parent.
    pub fn named_by(&self, parent: &HttpRouteParentRefs, route_ns: &str) -> bool {
        parent.group.as_deref().unwrap_or(GROUP) == GROUP
            && parent.kind.as_deref().unwrap_or("Gateway") == self.kind
            && parent.name == self.name
            && parent.namespace.as_deref().unwrap_or(route_ns) == self.namespace
    }
}

/// A ListenerSet that names one of our Gateways as its parent.
#[derive(Debug)]
pub struct Attachment<'a> {
    pub set: &'a ListenerSet,
    /// Its listeners, in the Gateway's listener type (the two have the
    /// same fields); `None` for one that does not convert.
    pub listeners: Vec<Option<GatewayListeners>>,
    /// Whether the Gateway's `allowedListeners` takes it.
    pub allowed: bool,
}

impl<'a> Attachment<'a> {
    pub fn owner(&self) -> Owner<'a> {
        Owner::listener_set(self.set)
    }
}

/// The `namespace/name` of the Gateway a ListenerSet names, if it names
/// a Gateway.
pub fn parent_gateway(ls: &ListenerSet) -> Option<(String, String)> {
    let p = &ls.spec.parent_ref;
    let is_gateway =
        p.group.as_deref().unwrap_or(GROUP) == GROUP && p.kind.as_deref().unwrap_or("Gateway") == "Gateway";
    is_gateway.then(|| {
        let ns = p
            .namespace
            .clone()
            .or_else(|| ls.metadata.namespace.clone())
            .unwrap_or_else(|| "default".into());
        (ns, p.name.clone())
    })
}

/// Whether `gateway`'s `allowedListeners` takes ListenerSets from `ns`.
pub fn allows(snap: &Snapshot, gateway: &Gateway, ns: &str) -> bool {
    let namespaces = gateway
        .spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    let gw_ns = gateway.metadata.namespace.as_deref().unwrap_or("default");
    match namespaces.and_then(|n| n.from.clone()).unwrap_or(From::None) {
        From::None => false,
        From::Same => ns == gw_ns,
        From::All => true,
        From::Selector => {
            let Some(selector) = namespaces.and_then(|n| n.selector.as_ref()) else {
                return false;
            };
            // The same label selector type as `allowedRoutes`' (one
            // evaluation of Kubernetes' rules).
            let Ok(selector) = serde_json::to_value(selector).and_then(serde_json::from_value) else {
                return false;
            };
            super::namespaces::selected(snap, &selector, ns)
        }
    }
}

/// The ListenerSets naming `gateway` as their parent, in precedence order
/// (oldest first, then by `namespace/name`), allowed or not.
pub fn attached_to<'a>(snap: &'a Snapshot, gateway: &Gateway) -> Vec<Attachment<'a>> {
    let gw = (
        gateway.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
        gateway.metadata.name.clone().unwrap_or_default(),
    );
    let mut sets: Vec<&ListenerSet> = snap
        .listener_sets
        .iter()
        .map(|ls| &**ls)
        .filter(|ls| parent_gateway(ls).as_ref() == Some(&gw))
        .collect();
    sets.sort_by_key(|ls| (ls.metadata.creation_timestamp.clone(), key(&ls.metadata)));
    sets.into_iter()
        .map(|set| Attachment {
            set,
            listeners: set
                .spec
                .listeners
                .iter()
                .map(|l| serde_json::to_value(l).and_then(serde_json::from_value).ok())
                .collect(),
            allowed: allows(snap, gateway, set.metadata.namespace.as_deref().unwrap_or("default")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn gateway(allowed: serde_json::Value) -> Gateway {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": "infra"},
            "spec": {"gatewayClassName": "c", "listeners": [], "allowedListeners": allowed},
        }))
        .unwrap()
    }

    fn set(ns: &str, name: &str, created: &str, parent: serde_json::Value) -> Arc<ListenerSet> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "ListenerSet",
                "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
                "spec": {"parentRef": parent, "listeners": [
                    {"name": "l", "port": 80, "protocol": "HTTP", "hostname": "a.example",
                     "allowedRoutes": {"namespaces": {"from": "All"}}},
                ]},
            }))
            .unwrap(),
        )
    }

    fn namespace(name: &str, labels: serde_json::Value) -> Arc<k8s_openapi::api::core::v1::Namespace> {
        Arc::new(serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap())
    }

    #[test]
    fn gateways_take_no_listener_sets_unless_they_say_so() {
        let snap = Snapshot {
            namespaces: vec![
                namespace("infra", json!({})),
                namespace("team-a", json!({"listeners": "yes"})),
                namespace("team-b", json!({})),
            ],
            ..Default::default()
        };
        let g = serde_json::from_value::<Gateway>(json!({
            "metadata": {"name": "gw", "namespace": "infra"},
            "spec": {"gatewayClassName": "c", "listeners": []},
        }))
        .unwrap();
        assert!(!allows(&snap, &g, "infra"), "absent allowedListeners is None");
        assert!(!allows(
            &snap,
            &gateway(json!({"namespaces": {"from": "None"}})),
            "infra"
        ));
        let same = gateway(json!({"namespaces": {"from": "Same"}}));
        assert!(allows(&snap, &same, "infra") && !allows(&snap, &same, "team-a"));
        assert!(allows(
            &snap,
            &gateway(json!({"namespaces": {"from": "All"}})),
            "team-b"
        ));
        let selector =
            gateway(json!({"namespaces": {"from": "Selector", "selector": {"matchLabels": {"listeners": "yes"}}}}));
        assert!(allows(&snap, &selector, "team-a"));
        assert!(!allows(&snap, &selector, "team-b"));
        assert!(!allows(
            &snap,
            &gateway(json!({"namespaces": {"from": "Selector"}})),
            "team-a"
        ));
    }

    #[test]
    fn listener_sets_come_in_precedence_order_with_their_own_parent_namespace() {
        let to_gw = json!({"name": "gw", "namespace": "infra"});
        let snap = Snapshot {
            namespaces: vec![namespace("infra", json!({})), namespace("team", json!({}))],
            listener_sets: vec![
                set("team", "b", "2026-01-01T00:00:01Z", to_gw.clone()),
                set("infra", "z", "2026-01-01T00:00:00Z", json!({"name": "gw"})),
                set("infra", "a", "2026-01-01T00:00:01Z", to_gw.clone()),
                set("infra", "other", "2026-01-01T00:00:00Z", json!({"name": "gw2"})),
                set(
                    "infra",
                    "service",
                    "2026-01-01T00:00:00Z",
                    json!({"name": "gw", "kind": "Service", "group": ""}),
                ),
            ],
            ..Default::default()
        };
        let g = gateway(json!({"namespaces": {"from": "Same"}}));
        let found: Vec<(String, bool)> = attached_to(&snap, &g)
            .iter()
            .map(|a| (a.owner().key(), a.allowed))
            .collect();
        assert_eq!(
            found,
            [
                ("ListenerSet/infra/z".to_string(), true),
                ("ListenerSet/infra/a".to_string(), true),
                ("ListenerSet/team/b".to_string(), false),
            ]
        );
        let first = &attached_to(&snap, &g)[0];
        let l = first.listeners[0].as_ref().expect("converts");
        assert_eq!(
            (l.name.as_str(), l.port, l.hostname.as_deref()),
            ("l", 80, Some("a.example"))
        );
    }

    #[test]
    fn owners_are_named_by_their_own_kind_only() {
        let g = gateway(json!(null));
        let ls = set("infra", "gw", "2026-01-01T00:00:00Z", json!({"name": "gw"}));
        let parent = |v: serde_json::Value| serde_json::from_value::<HttpRouteParentRefs>(v).unwrap();
        let by_gateway = parent(json!({"name": "gw"}));
        let by_set = parent(json!({"name": "gw", "kind": "ListenerSet", "group": GROUP}));
        assert!(Owner::gateway(&g).named_by(&by_gateway, "infra"));
        assert!(!Owner::gateway(&g).named_by(&by_set, "infra"));
        assert!(Owner::listener_set(&ls).named_by(&by_set, "infra"));
        assert!(!Owner::listener_set(&ls).named_by(&by_gateway, "infra"));
        assert!(!Owner::listener_set(&ls).named_by(&by_set, "elsewhere"));
        assert_ne!(Owner::gateway(&g).key(), Owner::listener_set(&ls).key());
    }
}
