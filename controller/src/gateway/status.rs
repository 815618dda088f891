//! The status the Gateway API asks of a controller, computed purely from
//! the snapshot and the translation: GatewayClass `Accepted` and
//! `supportedFeatures`; Gateway `Accepted`/`Programmed`, each listener's
//! conditions and attached route count, and `addresses`; each HTTPRoute's
//! parent entry (`Accepted`, `ResolvedRefs`) for every Gateway of ours it
//! names. [`crate::gateway_status`] writes it (the leader only).

use std::collections::BTreeMap;

use gateway_api_types::gateways::Gateway;
use gateway_api_types::httproutes::HttpRoute;
use serde_json::{json, Value};

use super::hostnames::intersect;
use super::translate::{admits, names_gateway, GatewayModel};
use crate::snapshot::{key, Snapshot};

/// The features GatewayClass `status.supportedFeatures` advertises: what
/// is built and tested (the conformance suite infers what to run from it).
pub const SUPPORTED_FEATURES: &[&str] = &[
    "Gateway",
    "HTTPRoute",
    "ReferenceGrant",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteMethodMatching",
    "HTTPRouteResponseHeaderModification",
    "HTTPRoutePortRedirect",
    "HTTPRouteSchemeRedirect",
    "HTTPRoutePathRedirect",
    "HTTPRouteHostRewrite",
    "HTTPRoutePathRewrite",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolWebSocket",
];

/// A condition without its times (added when written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

fn cond(type_: &'static str, status: bool, reason: &str, message: impl Into<String>) -> Cond {
    Cond {
        type_,
        status,
        reason: reason.into(),
        message: message.into(),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListenerStatus {
    pub name: String,
    pub attached: i32,
    pub conditions: Vec<Cond>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GatewayStatus {
    pub conditions: Vec<Cond>,
    pub listeners: Vec<ListenerStatus>,
    pub addresses: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParentStatus {
    /// The parent ref as the route wrote it.
    pub parent_ref: Value,
    pub conditions: Vec<Cond>,
}

/// Everything to write, by object.
#[derive(Debug, Default)]
pub struct Desired {
    /// GatewayClass name → conditions.
    pub classes: BTreeMap<String, Vec<Cond>>,
    /// `namespace/name` → status.
    pub gateways: BTreeMap<String, GatewayStatus>,
    /// `namespace/name` → our parent entries.
    pub routes: BTreeMap<String, Vec<ParentStatus>>,
}

/// Where a Gateway's `status.addresses` come from.
#[derive(Debug, Clone, Copy)]
pub enum Addresses<'a> {
    /// The same for every Gateway (`--publish-status-address`).
    Published(&'a [String]),
    /// Each Gateway's own Service (`--gateway-service-selector`), by
    /// `namespace/name`; a Gateway absent has no address yet.
    PerGateway(&'a BTreeMap<String, Vec<String>>),
}

/// What this controller's objects' status should say.
pub fn desired(snap: &Snapshot, model: &GatewayModel, controller_name: &str, addresses: Addresses) -> Desired {
    let mut out = Desired::default();
    for c in snap
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == controller_name)
    {
        out.classes.insert(
            c.metadata.name.clone().unwrap_or_default(),
            vec![cond("Accepted", true, "Accepted", "handled by dynamic-balancer")],
        );
    }
    let ours: Vec<&Gateway> = snap
        .gateways
        .iter()
        .map(|g| &**g)
        .filter(|g| out.classes.contains_key(&g.spec.gateway_class_name))
        .collect();
    let mut attached: BTreeMap<(String, String), i32> = BTreeMap::new();
    for route in &snap.http_routes {
        let route_key = key(&route.metadata);
        let parents = route_parents(route, &ours, model, &mut attached);
        if parents.is_empty() {
            continue;
        }
        out.routes.insert(route_key, parents);
    }
    for g in &ours {
        let gw_key = key(&g.metadata);
        let mut listeners = Vec::new();
        let mut any_served = false;
        for l in &g.spec.listeners {
            let state = model
                .listeners
                .get(&(gw_key.clone(), l.name.clone()))
                .cloned()
                .unwrap_or(Err(("Pending".into(), "not translated".into())));
            let conditions = match &state {
                Ok(()) => {
                    any_served = true;
                    vec![
                        cond("Accepted", true, "Accepted", "listener accepted"),
                        cond("Programmed", true, "Programmed", "nginx serves it"),
                        cond("ResolvedRefs", true, "ResolvedRefs", "all references resolved"),
                        cond("Conflicted", false, "NoConflicts", "no conflicts"),
                    ]
                }
                Err((reason, message)) => vec![
                    cond("Accepted", false, reason, message.clone()),
                    cond("Programmed", false, "Invalid", message.clone()),
                    cond("ResolvedRefs", true, "ResolvedRefs", "all references resolved"),
                    cond("Conflicted", false, "NoConflicts", "no conflicts"),
                ],
            };
            listeners.push(ListenerStatus {
                name: l.name.clone(),
                attached: attached.get(&(gw_key.clone(), l.name.clone())).copied().unwrap_or(0),
                conditions,
            });
        }
        let assigned = match addresses {
            Addresses::Published(a) => Some(a.to_vec()),
            Addresses::PerGateway(m) => m.get(&gw_key).cloned(),
        };
        let conditions = if any_served && assigned.is_none() {
            vec![
                cond("Accepted", true, "Accepted", "Gateway accepted"),
                cond(
                    "Programmed",
                    false,
                    "AddressNotAssigned",
                    "the Gateway's Service has no address yet",
                ),
            ]
        } else if any_served {
            vec![
                cond("Accepted", true, "Accepted", "Gateway accepted"),
                cond("Programmed", true, "Programmed", "nginx serves its listeners"),
            ]
        } else {
            vec![
                cond("Accepted", false, "ListenersNotValid", "no listener can be served"),
                cond("Programmed", false, "Invalid", "no listener can be served"),
            ]
        };
        out.gateways.insert(
            gw_key,
            GatewayStatus {
                conditions,
                listeners,
                addresses: assigned.unwrap_or_default(),
            },
        );
    }
    out
}

/// Our parent entries of one route, counting its attachments per
/// listener into `attached`.
fn route_parents(
    route: &HttpRoute,
    ours: &[&Gateway],
    model: &GatewayModel,
    attached: &mut BTreeMap<(String, String), i32>,
) -> Vec<ParentStatus> {
    let route_ns = route.metadata.namespace.as_deref().unwrap_or("default");
    let route_key = key(&route.metadata);
    let hostnames = route.spec.hostnames.clone().unwrap_or_default();
    let mut out = Vec::new();
    for parent in route.spec.parent_refs.iter().flatten() {
        let Some(g) = ours.iter().find(|g| {
            names_gateway(
                parent,
                route_ns,
                g.metadata.namespace.as_deref().unwrap_or("default"),
                g.metadata.name.as_deref().unwrap_or(""),
            )
        }) else {
            continue;
        };
        let gw_key = key(&g.metadata);
        let gw_ns = g.metadata.namespace.as_deref().unwrap_or("default");
        let candidates: Vec<_> = g
            .spec
            .listeners
            .iter()
            .filter(|l| parent.section_name.as_ref().is_none_or(|s| *s == l.name))
            .filter(|l| parent.port.is_none_or(|p| p == l.port))
            .collect();
        let served: Vec<_> = candidates
            .iter()
            .filter(|l| {
                model
                    .listeners
                    .get(&(gw_key.clone(), l.name.clone()))
                    .is_some_and(Result::is_ok)
            })
            .collect();
        let admitted: Vec<_> = served.iter().filter(|l| admits(l, route_ns, gw_ns)).collect();
        let matching: Vec<_> = admitted
            .iter()
            .filter(|l| !intersect(l.hostname.as_deref(), &hostnames).is_empty())
            .collect();
        let accepted = if candidates.is_empty() {
            cond(
                "Accepted",
                false,
                "NoMatchingParent",
                "no listener of the Gateway matches sectionName and port",
            )
        } else if served.is_empty() {
            cond("Accepted", false, "NoMatchingParent", "no matching listener is served")
        } else if admitted.is_empty() {
            cond(
                "Accepted",
                false,
                "NotAllowedByListeners",
                "the listeners' allowedRoutes do not admit this route",
            )
        } else if matching.is_empty() {
            cond(
                "Accepted",
                false,
                "NoMatchingListenerHostname",
                "no listener hostname intersects the route's hostnames",
            )
        } else if let Some(why) = model.invalid.get(&route_key) {
            cond("Accepted", false, "UnsupportedValue", why.clone())
        } else {
            for l in &matching {
                *attached.entry((gw_key.clone(), l.name.clone())).or_default() += 1;
            }
            cond("Accepted", true, "Accepted", "route accepted")
        };
        let resolved = match model.unresolved.get(&route_key) {
            Some((reason, message)) => cond("ResolvedRefs", false, reason, message.clone()),
            None => cond("ResolvedRefs", true, "ResolvedRefs", "all references resolved"),
        };
        out.push(ParentStatus {
            parent_ref: serde_json::to_value(parent).unwrap_or(Value::Null),
            conditions: vec![accepted, resolved],
        });
    }
    out
}

/// `conditions` as the API stores them: with `observedGeneration`, and
/// the `lastTransitionTime` of the same condition in `existing` when its
/// status did not change (else `now`).
pub fn conditions_json(conditions: &[Cond], generation: i64, existing: Option<&Value>, now: &str) -> Value {
    let old = existing.and_then(Value::as_array);
    Value::Array(
        conditions
            .iter()
            .map(|c| {
                let status = if c.status { "True" } else { "False" };
                let since = old
                    .and_then(|o| {
                        o.iter()
                            .find(|e| e["type"] == c.type_ && e["status"] == status)
                            .and_then(|e| e["lastTransitionTime"].as_str())
                    })
                    .unwrap_or(now);
                json!({
                    "type": c.type_,
                    "status": status,
                    "reason": c.reason,
                    "message": c.message,
                    "observedGeneration": generation,
                    "lastTransitionTime": since,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::translate::{translate, CONTROLLER_NAME};
    use std::sync::Arc;

    fn snap(docs: &[Value]) -> Snapshot {
        let mut s = Snapshot::default();
        for d in docs {
            match d["kind"].as_str().unwrap() {
                "GatewayClass" => s
                    .gateway_classes
                    .push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "Gateway" => s.gateways.push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "HTTPRoute" => s.http_routes.push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "Service" => s.services.push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                _ => unreachable!(),
            }
        }
        s
    }

    fn route(ns: &str, name: &str, hostnames: &[&str], backend_ns: &str) -> Value {
        json!({"kind": "HTTPRoute", "metadata": {"namespace": ns, "name": name},
               "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}], "hostnames": hostnames,
                        "rules": [{"backendRefs": [{"name": "web", "namespace": backend_ns, "port": 80}]}]}})
    }

    #[test]
    fn routes_gateways_and_classes_get_the_spec_conditions() {
        let s = snap(&[
            json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
            json!({"kind": "GatewayClass", "metadata": {"name": "theirs"}, "spec": {"controllerName": "example.com/other"}}),
            json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": "gw"}, "spec": {"gatewayClassName": "ours", "listeners": [
                {"name": "web", "protocol": "HTTP", "port": 8000, "hostname": "*.example.com", "allowedRoutes": {"namespaces": {"from": "All"}}},
                {"name": "tls", "protocol": "HTTPS", "port": 8443}]}}),
            json!({"kind": "Service", "metadata": {"namespace": "app", "name": "web"}, "spec": {"ports": [{"port": 80}]}}),
            route("app", "ok", &["a.example.com"], "app"),
            route("app", "elsewhere", &["a.other.test"], "app"),
            route("app", "cross", &["b.example.com"], "secret"),
        ]);
        let model = translate(&s, CONTROLLER_NAME, 0, &[], |r| {
            format!("{}-{}-{}", r.namespace, r.name, r.port)
        });
        let published = ["192.0.2.1".to_string()];
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::Published(&published));
        assert_eq!(d.classes.keys().collect::<Vec<_>>(), ["ours"]);
        let reason = |route: &str, i: usize| d.routes[route][0].conditions[i].reason.clone();
        assert_eq!(reason("app/ok", 0), "Accepted");
        assert_eq!(reason("app/ok", 1), "ResolvedRefs");
        assert_eq!(reason("app/elsewhere", 0), "NoMatchingListenerHostname");
        assert_eq!(reason("app/cross", 0), "Accepted");
        assert_eq!(reason("app/cross", 1), "RefNotPermitted");
        let gw = &d.gateways["infra/gw"];
        assert!(gw.conditions.iter().all(|c| c.status));
        assert_eq!(gw.listeners[0].attached, 2);
        assert_eq!(gw.listeners[1].conditions[0].reason, "UnsupportedProtocol");
        assert_eq!(gw.addresses, ["192.0.2.1"]);

        // With a Service per Gateway: not Programmed until it has an address.
        let none = BTreeMap::new();
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::PerGateway(&none));
        let programmed = &d.gateways["infra/gw"].conditions[1];
        assert_eq!(
            (programmed.status, programmed.reason.as_str()),
            (false, "AddressNotAssigned")
        );
        let some = BTreeMap::from([("infra/gw".to_string(), vec!["10.0.0.9".to_string()])]);
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::PerGateway(&some));
        assert!(d.gateways["infra/gw"].conditions.iter().all(|c| c.status));
        assert_eq!(d.gateways["infra/gw"].addresses, ["10.0.0.9"]);
    }

    #[test]
    fn transition_times_survive_an_unchanged_status() {
        let c = [cond("Accepted", true, "Accepted", "ok")];
        let first = conditions_json(&c, 1, None, "2026-11-28T00:00:00Z");
        let again = conditions_json(&c, 2, Some(&first), "2026-11-28T01:00:00Z");
        assert_eq!(again[0]["lastTransitionTime"], "2026-11-28T00:00:00Z");
        assert_eq!(again[0]["observedGeneration"], 2);
        let flipped = conditions_json(
            &[cond("Accepted", false, "X", "no")],
            3,
            Some(&first),
            "2026-11-28T02:00:00Z",
        );
        assert_eq!(flipped[0]["lastTransitionTime"], "2026-11-28T02:00:00Z");
    }
}
