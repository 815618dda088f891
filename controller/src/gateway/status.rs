//! The status the Gateway API asks of a controller, computed purely from
//! the snapshot and the translation: GatewayClass `Accepted` and
//! `supportedFeatures`; Gateway `Accepted`/`Programmed`, each listener's
//! conditions and attached route count, and `addresses`; each HTTPRoute's
//! parent entry (`Accepted`, `ResolvedRefs`) for every Gateway of ours it
//! names. [`crate::gateway_status`] writes it (the leader only).

use std::collections::BTreeMap;

use gateway_api_types::gateways::Gateway;
use serde_json::{json, Value};

use super::hostnames::intersect;
use super::listener_sets::{attached_to, Attachment, Owner};
use super::route::Route;
use super::translate::{admits, GatewayModel};
use crate::snapshot::{key, Snapshot};

/// The features GatewayClass `status.supportedFeatures` advertises: what
/// is built and tested (the conformance suite infers what to run from it).
/// Sorted by name, as the API requires.
pub const SUPPORTED_FEATURES: &[&str] = &[
    "BackendTLSPolicy",
    "BackendTLSPolicySANValidation",
    "ClusterTrustBundle",
    "GRPCRoute",
    "GRPCRouteNamedRouteRule",
    "GRPCRouteRequestHeaderModifier",
    "Gateway",
    "GatewayAddressEmpty",
    "GatewayBackendClientCertificate",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayHTTPListenerIsolation",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "GatewayInfrastructure",
    "GatewayPort8080",
    "GatewayRouteHostnameIntersectionPrecedence",
    "GatewayStaticAddresses",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteBackendURLRewrite",
    "HTTPRouteCORS",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteRetryCodes",
    "HTTPRouteRetryConnectionError",
    "HTTPRouteSchemeRedirect",
    "ListenerSet",
    "ReferenceGrant",
    "TCPRoute",
    "TLSRoute",
    "TLSRouteModeTerminate",
    "UDPRoute",
];

use super::condition::cond;

/// Ancestor entries a policy's status holds (the CRD's `maxItems`).
pub const MAX_POLICY_ANCESTORS: usize = 16;
pub use super::condition::Cond;

#[derive(Debug, Clone, PartialEq)]
pub struct ListenerStatus {
    pub name: String,
    pub attached: i32,
    pub conditions: Vec<Cond>,
    /// `supportedKinds` (of the Gateway API group).
    pub kinds: Vec<&'static str>,
}

/// The route kinds a listener supports (what `allowedRoutes.kinds` asks
/// that this controller serves on its protocol, else the protocol's
/// default), and whether `allowedRoutes.kinds` names one it cannot serve.
pub fn listener_kinds(l: &gateway_api_types::gateways::GatewayListeners) -> (Vec<&'static str>, bool) {
    let serves: Vec<&'static str> = super::translate::ServerProtocol::of(l)
        .map(|p| p.kinds().iter().map(|k| k.name()).collect())
        .unwrap_or_default();
    let Some(asked) = l.allowed_routes.as_ref().and_then(|a| a.kinds.as_ref()) else {
        return (serves, false);
    };
    let mut kinds = Vec::new();
    let mut invalid = false;
    for k in asked {
        let group_ok = k.group.as_deref().unwrap_or(super::translate::GROUP) == super::translate::GROUP;
        match serves.iter().find(|s| group_ok && **s == k.kind) {
            Some(s) if !kinds.contains(s) => kinds.push(*s),
            Some(_) => {}
            None => invalid = true,
        }
    }
    (kinds, invalid)
}

#[derive(Debug, Clone, PartialEq)]
pub struct GatewayStatus {
    pub conditions: Vec<Cond>,
    pub listeners: Vec<ListenerStatus>,
    pub addresses: Vec<String>,
    /// `attachedListenerSets`: the ListenerSets it takes that are
    /// Accepted.
    pub attached_listener_sets: i32,
}

/// A ListenerSet's status: its conditions and its listeners' (none while
/// its Gateway does not take it).
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerSetStatus {
    pub conditions: Vec<Cond>,
    pub listeners: Vec<ListenerStatus>,
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
    /// ListenerSets naming one of our Gateways: `namespace/name` → status.
    pub listener_sets: BTreeMap<String, ListenerSetStatus>,
    /// `namespace/name` → our parent entries.
    pub routes: BTreeMap<String, Vec<ParentStatus>>,
    /// BackendTLSPolicy `namespace/name` → our ancestor entries (one per
    /// Gateway whose routes send to its ports; none: ours are removed).
    pub policies: BTreeMap<String, Vec<ParentStatus>>,
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
    // Each ListenerSet naming one of our Gateways, with that Gateway's key.
    let sets: Vec<(String, Attachment)> = ours
        .iter()
        .flat_map(|g| attached_to(snap, g).into_iter().map(|a| (key(&g.metadata), a)))
        .collect();
    for route in super::translate::all_routes(snap, &mut Vec::new()) {
        let route_key = route.key();
        let parents = route_parents(snap, &route, &ours, &sets, model, &mut attached);
        if parents.is_empty() {
            continue;
        }
        out.routes.insert(route_key, parents);
    }
    for g in &ours {
        let gw_key = key(&g.metadata);
        let owner = Owner::gateway(g).key();
        let listeners: Vec<ListenerStatus> = g
            .spec
            .listeners
            .iter()
            .map(|l| listener_status(model, &owner, l, &attached))
            .collect();
        // Listeners of the ListenerSets it takes count as its own for
        // whether it is served (it is what carries them).
        let sets_served = sets.iter().filter(|(k, a)| *k == gw_key && a.allowed).any(|(_, a)| {
            let owner = a.owner().key();
            a.listeners.iter().flatten().any(|l| {
                let k = (owner.clone(), l.name.clone());
                model.listeners.get(&k).is_some_and(Result::is_ok) && !model.unresolved_listeners.contains_key(&k)
            })
        });
        let any_served = listeners.iter().any(programmed) || sets_served;
        let assigned = match addresses {
            Addresses::Published(a) => Some(a.to_vec()),
            Addresses::PerGateway(m) => m.get(&gw_key).cloned(),
        };
        // Some listeners served, others not: still Accepted, with the
        // reason that says some are not valid (the spec's rule).
        let accepted = accepted_served(listeners.iter().any(|l| !programmed(l)), "Gateway accepted");
        let requested = super::addresses::requested(g);
        let unusable = match (&requested, &assigned) {
            (Ok(ips), Some(have)) if !ips.is_empty() => {
                let missing = super::addresses::missing(ips, have);
                (!missing.is_empty()).then(|| {
                    format!(
                        "the cluster did not give the Gateway's Service {} (outside the Service range, taken, or not one per IP family)",
                        missing.iter().map(|ip| ip.to_string()).collect::<Vec<_>>().join(", ")
                    )
                })
            }
            _ => None,
        };
        let conditions = if let Some(why) = super::addresses::invalid_parameters(g) {
            vec![
                cond("Accepted", false, "InvalidParameters", why.clone()),
                cond("Programmed", false, "Invalid", why),
            ]
        } else if let Err(why) = &requested {
            vec![
                cond("Accepted", false, "UnsupportedAddress", why.clone()),
                cond("Programmed", false, "Invalid", why.clone()),
            ]
        } else if let (true, Some(why)) = (any_served, &unusable) {
            vec![accepted, cond("Programmed", false, "AddressNotUsable", why.clone())]
        } else if any_served && assigned.is_none() && requested.as_ref().is_ok_and(|r| !r.is_empty()) {
            vec![
                accepted,
                cond(
                    "Programmed",
                    false,
                    "AddressNotUsable",
                    "the cluster did not give the Gateway's Service the address it asks for (outside the Service range, or taken)",
                ),
            ]
        } else if any_served && assigned.is_none() {
            vec![
                accepted,
                cond(
                    "Programmed",
                    false,
                    "AddressNotAssigned",
                    "the Gateway's Service has no address yet",
                ),
            ]
        } else if any_served {
            vec![
                accepted,
                cond("Programmed", true, "Programmed", "nginx serves its listeners"),
            ]
        } else {
            vec![
                cond("Accepted", false, "ListenersNotValid", "no listener can be served"),
                cond("Programmed", false, "Invalid", "no listener can be served"),
            ]
        };
        let mut conditions = conditions;
        // The Gateway's own references (its backend client certificate).
        conditions.push(match model.gateway_refs.get(&gw_key) {
            Some((reason, message)) => cond("ResolvedRefs", false, reason, message.clone()),
            None => cond("ResolvedRefs", true, "ResolvedRefs", "all references resolved"),
        });
        if super::frontend_tls::insecure_fallback(g) {
            conditions.push(cond(
                "InsecureFrontendValidationMode",
                true,
                "ConfigurationChanged",
                "client certificate validation is AllowInsecureFallback: clients without a valid certificate are let in",
            ));
        }
        let gateway_accepted = conditions.iter().any(|c| c.type_ == "Accepted" && c.status);
        let gateway_programmed = conditions.iter().any(|c| c.type_ == "Programmed" && c.status);
        let mut taken = 0;
        for (_, set) in sets.iter().filter(|(k, _)| *k == gw_key) {
            let status = listener_set_status(model, set, (gateway_accepted, gateway_programmed), &attached);
            if status.conditions.iter().any(|c| c.type_ == "Accepted" && c.status) {
                taken += 1;
            }
            out.listener_sets.insert(key(&set.set.metadata), status);
        }
        out.gateways.insert(
            gw_key,
            GatewayStatus {
                conditions,
                listeners,
                addresses: assigned.unwrap_or_default(),
                attached_listener_sets: taken,
            },
        );
    }
    for (policy, (conditions, gateways)) in &model.backend_tls_status {
        // The CRD keeps at most 16 ancestors; a longer list would be
        // refused whole (and retried forever).
        let ancestors = gateways
            .iter()
            .filter(|g| out.gateways.contains_key(*g))
            .take(MAX_POLICY_ANCESTORS)
            .map(|g| {
                let (ns, name) = g.split_once('/').unwrap_or(("default", g));
                ParentStatus {
                    parent_ref: serde_json::json!({
                        "group": super::translate::GROUP,
                        "kind": "Gateway",
                        "namespace": ns,
                        "name": name,
                    }),
                    conditions: conditions.clone(),
                }
            })
            .collect();
        out.policies.insert(policy.clone(), ancestors);
    }
    out
}

/// `Accepted` of a Gateway or ListenerSet that serves some listeners:
/// with the reason that says others are not valid, when some are not
/// (the spec's rule).
fn accepted_served(some_invalid: bool, message: &str) -> Cond {
    if some_invalid {
        cond(
            "Accepted",
            true,
            "ListenersNotValid",
            "some listeners are not valid; the others are served",
        )
    } else {
        cond("Accepted", true, "Accepted", message.to_string())
    }
}

/// Whether a listener's status says nginx serves it.
fn programmed(l: &ListenerStatus) -> bool {
    l.conditions.iter().any(|c| c.type_ == "Programmed" && c.status)
}

/// The conditions of one listener (a Gateway's own or a ListenerSet's,
/// filed under `owner`) and its attached route count.
fn listener_status(
    model: &GatewayModel,
    owner: &str,
    l: &gateway_api_types::gateways::GatewayListeners,
    attached: &BTreeMap<(String, String), i32>,
) -> ListenerStatus {
    let lkey = (owner.to_string(), l.name.clone());
    let state = model
        .listeners
        .get(&lkey)
        .cloned()
        .unwrap_or(Err(("Pending".into(), "not translated".into())));
    let mut conditions = match (&state, model.unresolved_listeners.get(&lkey)) {
        (_, Some((reason, message))) => vec![
            cond("Accepted", true, "Accepted", "listener accepted"),
            cond("Programmed", false, "Invalid", message.clone()),
            cond("ResolvedRefs", false, reason, message.clone()),
            cond("Conflicted", false, "NoConflicts", "no conflicts"),
        ],
        (Ok(()), None) => vec![
            cond("Accepted", true, "Accepted", "listener accepted"),
            cond("Programmed", true, "Programmed", "nginx serves it"),
            cond("ResolvedRefs", true, "ResolvedRefs", "all references resolved"),
            cond("Conflicted", false, "NoConflicts", "no conflicts"),
        ],
        // A listener refused for another's port or hostname: the spec
        // gives the conflict's reason to all three conditions.
        (Err((reason, message)), None) if reason == "ProtocolConflict" || reason == "HostnameConflict" => vec![
            cond("Accepted", false, reason, message.clone()),
            cond("Programmed", false, reason, message.clone()),
            cond("ResolvedRefs", true, "ResolvedRefs", "all references resolved"),
            cond("Conflicted", true, reason, message.clone()),
        ],
        (Err((reason, message)), None) => vec![
            cond("Accepted", false, reason, message.clone()),
            cond("Programmed", false, "Invalid", message.clone()),
            cond("ResolvedRefs", true, "ResolvedRefs", "all references resolved"),
            cond("Conflicted", false, "NoConflicts", "no conflicts"),
        ],
    };
    let (kinds, invalid_kinds) = listener_kinds(l);
    // A listener refused for its port's protocol serves no kind (the
    // conformance suite checks this for TLS modes mixed on one port).
    let kinds = match &state {
        Err((reason, _)) if reason == "ProtocolConflict" => Vec::new(),
        _ => kinds,
    };
    // Client CA references that do not (all) resolve.
    if let Some((reason, message)) = model.ca_refs.get(&lkey) {
        if let Some(c) = conditions.iter_mut().find(|c| c.type_ == "ResolvedRefs") {
            *c = cond("ResolvedRefs", false, reason, message.clone());
        }
    }
    if invalid_kinds {
        if let Some(c) = conditions.iter_mut().find(|c| c.type_ == "ResolvedRefs") {
            *c = cond(
                "ResolvedRefs",
                false,
                "InvalidRouteKinds",
                "allowedRoutes.kinds names a kind this listener's protocol cannot serve (HTTP and HTTPS: HTTPRoute, GRPCRoute; TLS: TLSRoute; TCP: TCPRoute; UDP: UDPRoute)",
            );
        }
    }
    ListenerStatus {
        name: l.name.clone(),
        attached: attached.get(&lkey).copied().unwrap_or(0),
        conditions,
        kinds,
    }
}

/// A ListenerSet's status: not taken (`NotAllowed`), its Gateway not
/// accepted, or accepted while at least one of its listeners is served
/// (and Programmed once its Gateway is: `(accepted, programmed)`).
fn listener_set_status(
    model: &GatewayModel,
    set: &Attachment,
    (gateway_accepted, gateway_programmed): (bool, bool),
    attached: &BTreeMap<(String, String), i32>,
) -> ListenerSetStatus {
    let both = |reason: &str, message: &str| {
        vec![
            cond("Accepted", false, reason, message.to_string()),
            cond("Programmed", false, reason, message.to_string()),
        ]
    };
    if !set.allowed {
        return ListenerSetStatus {
            conditions: both(
                "NotAllowed",
                "the Gateway's spec.allowedListeners does not take ListenerSets from this namespace",
            ),
            listeners: Vec::new(),
        };
    }
    if !gateway_accepted {
        return ListenerSetStatus {
            conditions: both("ParentNotAccepted", "the parent Gateway is not accepted"),
            listeners: Vec::new(),
        };
    }
    let owner = set.owner().key();
    let listeners: Vec<ListenerStatus> = set
        .set
        .spec
        .listeners
        .iter()
        .zip(&set.listeners)
        .map(|(raw, l)| match l {
            Some(l) => listener_status(model, &owner, l, attached),
            None => ListenerStatus {
                name: raw.name.clone(),
                attached: 0,
                conditions: vec![
                    cond("Accepted", false, "Invalid", "the listener could not be read"),
                    cond("Programmed", false, "Invalid", "the listener could not be read"),
                ],
                kinds: Vec::new(),
            },
        })
        .collect();
    let conditions = if listeners.iter().any(programmed) {
        vec![
            accepted_served(listeners.iter().any(|l| !programmed(l)), "ListenerSet accepted"),
            if gateway_programmed {
                cond("Programmed", true, "Programmed", "nginx serves its valid listeners")
            } else {
                cond(
                    "Programmed",
                    false,
                    "ParentNotProgrammed",
                    "its listeners are configured; the parent Gateway is not programmed yet (no address)",
                )
            },
        ]
    } else {
        both("ListenersNotValid", "none of its listeners can be served")
    };
    ListenerSetStatus { conditions, listeners }
}

/// Our parent entries of one route, counting its attachments per
/// listener into `attached`. A parent is one of our Gateways (its own
/// listeners) or a ListenerSet naming one (that set's listeners).
fn route_parents(
    snap: &Snapshot,
    any: &Route,
    ours: &[&Gateway],
    sets: &[(String, Attachment)],
    model: &GatewayModel,
    attached: &mut BTreeMap<(String, String), i32>,
) -> Vec<ParentStatus> {
    let route = &*any.http;
    let route_ns = route.metadata.namespace.as_deref().unwrap_or("default");
    let route_key = any.key();
    let hostnames = route.spec.hostnames.clone().unwrap_or_default();
    let mut out = Vec::new();
    for parent in route.spec.parent_refs.iter().flatten() {
        let found: Option<(Owner, Vec<&gateway_api_types::gateways::GatewayListeners>, bool)> = ours
            .iter()
            .find(|g| Owner::gateway(g).named_by(parent, route_ns))
            .map(|g| (Owner::gateway(g), g.spec.listeners.iter().collect(), true))
            .or_else(|| {
                sets.iter()
                    .find(|(_, a)| a.owner().named_by(parent, route_ns))
                    .map(|(_, a)| (a.owner(), a.listeners.iter().flatten().collect(), a.allowed))
            });
        let Some((owner, listeners, allowed)) = found else {
            continue;
        };
        let gw_key = owner.key();
        let gw_ns = owner.namespace;
        if !allowed {
            out.push(ParentStatus {
                parent_ref: serde_json::to_value(parent).unwrap_or(Value::Null),
                conditions: vec![
                    cond(
                        "Accepted",
                        false,
                        "NoMatchingParent",
                        "the ListenerSet's Gateway does not take it (spec.allowedListeners)",
                    ),
                    cond("ResolvedRefs", true, "ResolvedRefs", "all references resolved"),
                ],
            });
            continue;
        }
        let candidates: Vec<_> = listeners
            .into_iter()
            .filter(|l| parent.section_name.as_ref().is_none_or(|s| *s == l.name))
            .filter(|l| parent.port.is_none_or(|p| p == l.port))
            .collect();
        let served: Vec<_> = candidates
            .iter()
            .filter(|l| {
                // A listener whose certificate does not resolve is not
                // served, but routes still attach to it (and are counted).
                let k = (gw_key.clone(), l.name.clone());
                model.listeners.get(&k).is_some_and(Result::is_ok) || model.unresolved_listeners.contains_key(&k)
            })
            .collect();
        let admitted: Vec<_> = served
            .iter()
            .filter(|l| admits(snap, l, any.kind, route_ns, gw_ns))
            .collect();
        let matching: Vec<_> = admitted
            .iter()
            .filter(|l| !intersect(l.hostname.as_deref(), &hostnames).is_empty())
            .collect();
        let accepted = if candidates.is_empty() {
            cond(
                "Accepted",
                false,
                "NoMatchingParent",
                "no listener of the parent matches sectionName and port",
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

/// Condition types this controller writes only while they hold, and
/// removes after (not another controller's to keep).
const WRITTEN_WHEN_TRUE: &[&str] = &["InsecureFrontendValidationMode"];

/// `conditions` as the API stores them: with `observedGeneration`, and
/// the `lastTransitionTime` of the same condition in `existing` when its
/// status did not change (else `now`).
/// Conditions of a type this controller does not write (another
/// controller's, a policy's) are kept as they are, after ours.
pub fn conditions_json(conditions: &[Cond], generation: i64, existing: Option<&Value>, now: &str) -> Value {
    let old = existing.and_then(Value::as_array);
    let foreign = old
        .into_iter()
        .flatten()
        .filter(|e| !conditions.iter().any(|c| e["type"] == c.type_))
        .filter(|e| !WRITTEN_WHEN_TRUE.iter().any(|t| e["type"] == *t))
        .cloned();
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
            .chain(foreign)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::translate::{translate, CONTROLLER_NAME, MAX_PORTS_PER_GATEWAY};
    use lua_compat::routes::ValidationMode;
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
                "GRPCRoute" => s.grpc_routes.push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "TCPRoute" => s.tcp_routes.push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "TLSRoute" => s.tls_routes.push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "UDPRoute" => s.udp_routes.push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "Service" => s.services.push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "Secret" => s.secrets.push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "Namespace" => s.namespaces.push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "ConfigMap" => s.ca_bundles.push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "ReferenceGrant" => s
                    .reference_grants
                    .push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "BackendTLSPolicy" => s
                    .backend_tls_policies
                    .push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
                "ListenerSet" => s
                    .listener_sets
                    .push(Arc::new(serde_json::from_value(d.clone()).unwrap())),
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

    /// A route of `kind` to Service `app/web` through listener `section`
    /// of `infra/gw`.
    fn kind_route(kind: &str, name: &str, section: &str, hostnames: &[&str]) -> Value {
        json!({"kind": kind, "metadata": {"namespace": "infra", "name": name},
               "spec": {"parentRefs": [{"name": "gw", "sectionName": section}], "hostnames": hostnames,
                        "rules": [{"backendRefs": [{"name": "web", "namespace": "infra", "port": 80}]}]}})
    }

    #[test]
    fn supported_features_are_sorted_and_distinct() {
        assert!(
            SUPPORTED_FEATURES.windows(2).all(|w| w[0] < w[1]),
            "{SUPPORTED_FEATURES:?}"
        );
        assert!(SUPPORTED_FEATURES.len() <= 64, "the API takes at most 64");
    }

    #[test]
    fn reserved_ports_are_per_transport() {
        let s = snap(&[
            json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
            json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": "gw"}, "spec": {"gatewayClassName": "ours", "listeners": [
                {"name": "tcp", "protocol": "TCP", "port": 53},
                {"name": "udp", "protocol": "UDP", "port": 53}]}}),
        ]);
        // 53/UDP is a udp-services port: the UDP listener cannot have it.
        let model = translate(&s, CONTROLLER_NAME, 0, &[(53, true)], |r| r.name.clone());
        let state = |l: &str| model.listeners[&("infra/gw".to_string(), l.to_string())].clone();
        assert!(state("tcp").is_ok());
        assert_eq!(state("udp").unwrap_err().0, "PortUnavailable");
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::Published(&[]));
        let udp = &d.gateways["infra/gw"].listeners[1];
        assert_eq!(
            (udp.conditions[0].status, udp.conditions[0].reason.as_str()),
            (false, "PortUnavailable")
        );
    }

    #[test]
    fn each_listener_protocol_takes_its_route_kinds() {
        let s = snap(&[
            json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
            json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": "gw"}, "spec": {"gatewayClassName": "ours", "listeners": [
                {"name": "web", "protocol": "HTTP", "port": 80},
                {"name": "tcp", "protocol": "TCP", "port": 5432},
                {"name": "udp", "protocol": "UDP", "port": 5432},
                {"name": "tls", "protocol": "TLS", "port": 443, "tls": {"mode": "Passthrough"}},
                {"name": "term", "protocol": "TLS", "port": 8443, "tls": {"mode": "Terminate"}},
                {"name": "sctp", "protocol": "SCTP", "port": 9000}]}}),
            json!({"kind": "Service", "metadata": {"namespace": "infra", "name": "web"}, "spec": {"ports": [{"port": 80}]}}),
            kind_route("GRPCRoute", "grpc", "web", &[]),
            kind_route("TCPRoute", "db", "tcp", &[]),
            kind_route("UDPRoute", "dns", "udp", &[]),
            kind_route("TLSRoute", "site", "tls", &["site.example.com"]),
            // A TCPRoute on the HTTP listener is not allowed there.
            kind_route("TCPRoute", "lost", "web", &[]),
        ]);
        let model = translate(&s, CONTROLLER_NAME, 0, &[], |r| {
            format!("{}-{}-{}", r.namespace, r.name, r.port)
        });
        let protocols: Vec<_> = model
            .servers
            .iter()
            .map(|g| (g.name.as_str(), g.protocol.name()))
            .collect();
        assert_eq!(
            protocols,
            [
                ("infra/gw/443", "TLS"),
                ("infra/gw/5432", "TCP"),
                ("infra/gw/5432/udp", "UDP"),
                ("infra/gw/80", "HTTP")
            ]
        );
        let listener = |name: &str| model.table.listeners.iter().find(|l| l.name == name).unwrap();
        // TCP and UDP: every connection; TLS: by the route's hostname.
        assert_eq!(listener("infra/gw/5432").hosts[0].hostname, "*");
        assert_eq!(listener("infra/gw/5432/udp").rules[0].route, "infra/dns");
        let tls_hosts: Vec<_> = listener("infra/gw/443")
            .hosts
            .iter()
            .map(|h| (h.hostname.as_str(), h.matches.len()))
            .collect();
        assert!(tls_hosts.contains(&("site.example.com", 1)), "{tls_hosts:?}");
        assert!(
            !tls_hosts.contains(&("*", 1)),
            "no route for other server names: {tls_hosts:?}"
        );
        assert_eq!(listener("infra/gw/80").rules[0].route, "infra/grpc");
        assert_eq!(
            listener("infra/gw/80").rules[0].backends[0].protocol,
            lua_compat::routes::BackendProtocol::H2c
        );
        // TLS in Terminate mode (the default) needs its certificate.
        assert_eq!(
            model.unresolved_listeners[&("infra/gw".into(), "term".into())].0,
            "InvalidCertificateRef"
        );
        assert_eq!(
            model.listeners[&("infra/gw".into(), "sctp".into())]
                .as_ref()
                .unwrap_err()
                .0,
            "UnsupportedProtocol"
        );

        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::Published(&[]));
        for route in [
            "GRPCRoute/infra/grpc",
            "TCPRoute/infra/db",
            "UDPRoute/infra/dns",
            "TLSRoute/infra/site",
        ] {
            assert_eq!(d.routes[route][0].conditions[0].reason, "Accepted", "{route}");
        }
        assert_eq!(
            d.routes["TCPRoute/infra/lost"][0].conditions[0].reason,
            "NotAllowedByListeners"
        );
        let gw = &d.gateways["infra/gw"];
        let kinds: Vec<_> = gw
            .listeners
            .iter()
            .map(|l| (l.name.as_str(), l.kinds.clone(), l.attached))
            .collect();
        assert_eq!(
            kinds,
            [
                ("web", vec!["HTTPRoute", "GRPCRoute"], 1),
                ("tcp", vec!["TCPRoute"], 1),
                ("udp", vec!["UDPRoute"], 1),
                ("tls", vec!["TLSRoute"], 1),
                ("term", vec!["TLSRoute"], 0),
                ("sctp", vec![], 0)
            ]
        );
    }

    #[test]
    fn a_rule_with_a_filter_it_cannot_apply_applies_none_of_them() {
        let s = snap(&[
            json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
            json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": "gw"}, "spec": {"gatewayClassName": "ours",
                "listeners": [{"name": "web", "protocol": "HTTP", "port": 8080}]}}),
            json!({"kind": "Service", "metadata": {"namespace": "infra", "name": "web"}, "spec": {"ports": [{"port": 80}]}}),
            json!({"kind": "HTTPRoute", "metadata": {"namespace": "infra", "name": "guarded"},
                "spec": {"parentRefs": [{"name": "gw"}], "rules": [{
                    "filters": [
                        {"type": "ExtensionRef", "extensionRef": {"group": "auth.example.com", "kind": "Policy", "name": "p"}},
                        {"type": "CORS", "cors": {"allowOrigins": ["*"]}},
                        {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "web", "port": 80}}}],
                    "backendRefs": [{"name": "web", "port": 80}]}]}}),
        ]);
        let model = translate(&s, CONTROLLER_NAME, 0, &[], |r| format!("{}-{}", r.namespace, r.name));
        let rule = &model.table.listeners[0].rules[0];
        assert!(rule.backends.is_empty(), "its requests get 500");
        assert!(
            rule.filters.is_empty(),
            "no preflight answered, no copy made: {:?}",
            rule.filters
        );
    }

    #[test]
    fn static_addresses_are_ip_addresses_the_cluster_gave() {
        let s = |addresses: serde_json::Value| {
            snap(&[
                json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
                json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": "gw"}, "spec": {"gatewayClassName": "ours",
                    "addresses": addresses, "listeners": [{"name": "web", "protocol": "HTTP", "port": 8080}]}}),
            ])
        };
        let programmed = |snap: &Snapshot, assigned: Option<&str>| {
            let model = translate(snap, CONTROLLER_NAME, 0, &[], |r| format!("{}-{}", r.namespace, r.name));
            let per_gateway: BTreeMap<String, Vec<String>> = assigned
                .map(|a| ("infra/gw".to_string(), vec![a.to_string()]))
                .into_iter()
                .collect();
            let d = desired(snap, &model, CONTROLLER_NAME, Addresses::PerGateway(&per_gateway));
            let gw = &d.gateways["infra/gw"];
            let c = |t: &str| {
                let c = gw.conditions.iter().find(|c| c.type_ == t).unwrap();
                (c.status, c.reason.to_string())
            };
            (c("Accepted"), c("Programmed"), gw.addresses.clone())
        };
        let fake = s(json!([{"type": "test/fake-invalid-type", "value": "x"}, {"value": "198.19.16.200"}]));
        assert_eq!(
            programmed(&fake, Some("198.19.16.9")).0,
            (false, "UnsupportedAddress".into())
        );
        let refused = s(json!([{"value": "198.51.100.7"}, {"value": "198.19.16.200"}]));
        assert_eq!(programmed(&refused, None).1, (false, "AddressNotUsable".into()));
        assert_eq!(
            programmed(&refused, Some("198.19.16.9")).1,
            (false, "AddressNotUsable".into())
        );
        let usable = s(json!([{"type": "IPAddress", "value": "198.19.16.200"}]));
        assert_eq!(
            programmed(&usable, Some("198.19.16.200")),
            (
                (true, "Accepted".into()),
                (true, "Programmed".into()),
                vec!["198.19.16.200".to_string()]
            )
        );
    }

    #[test]
    fn listener_sets_join_their_gateway_and_the_later_listener_loses_a_conflict() {
        let http = |name: &str, port: u16, host: &str| {
            json!({"name": name, "protocol": "HTTP", "port": port, "hostname": host,
                   "allowedRoutes": {"namespaces": {"from": "All"}}})
        };
        let set = |ns: &str, name: &str, created: &str, listeners: Value| {
            json!({"kind": "ListenerSet", "metadata": {"namespace": ns, "name": name, "creationTimestamp": created},
                   "spec": {"parentRef": {"name": "gw", "namespace": "infra"}, "listeners": listeners}})
        };
        let parent_route = |name: &str, parent: Value| {
            json!({"kind": "HTTPRoute", "metadata": {"namespace": "infra", "name": name},
                   "spec": {"parentRefs": [parent],
                            "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}})
        };
        let s = snap(&[
            json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
            json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": "gw"}, "spec": {
                "gatewayClassName": "ours", "allowedListeners": {"namespaces": {"from": "Same"}},
                "listeners": [http("own", 80, "gw.example")]}}),
            json!({"kind": "Service", "metadata": {"namespace": "infra", "name": "web"}, "spec": {"ports": [{"port": 80}]}}),
            set(
                "infra",
                "ls-a",
                "2026-01-01T00:00:00Z",
                json!([
                    http("a", 80, "a.example"),
                    http("dup", 80, "GW.example"),
                    {"name": "tcp", "protocol": "TCP", "port": 80},
                    http("extra", 8080, "e.example"),
                ]),
            ),
            set(
                "infra",
                "ls-b",
                "2026-01-01T00:00:01Z",
                json!([http("late", 80, "a.example")]),
            ),
            set(
                "other",
                "ls-c",
                "2026-01-01T00:00:00Z",
                json!([http("c", 80, "c.example")]),
            ),
            parent_route("to-gateway", json!({"name": "gw"})),
            parent_route(
                "to-set",
                json!({"name": "ls-a", "kind": "ListenerSet", "group": "gateway.networking.k8s.io"}),
            ),
            parent_route("set-listener-by-gateway", json!({"name": "gw", "sectionName": "a"})),
            parent_route(
                "to-refused-set",
                json!({"name": "ls-c", "namespace": "other", "kind": "ListenerSet", "group": "gateway.networking.k8s.io"}),
            ),
        ]);
        let model = translate(&s, CONTROLLER_NAME, 0, &[], |r| {
            format!("{}-{}-{}", r.namespace, r.name, r.port)
        });
        // The set's new port is a server of the Gateway's.
        let servers: Vec<_> = model.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(servers, ["infra/gw/80", "infra/gw/8080"]);
        // Each host serves the routes of the object they named.
        let routes_of = |listener: &str, host: &str| -> Vec<String> {
            let l = model.table.listeners.iter().find(|l| l.name == listener).unwrap();
            let group = l.hosts.iter().find(|h| h.hostname == host).unwrap();
            group
                .matches
                .iter()
                .map(|m| l.rules[m.rule as usize].route.clone())
                .collect()
        };
        assert_eq!(routes_of("infra/gw/80", "gw.example"), ["infra/to-gateway"]);
        assert_eq!(routes_of("infra/gw/80", "a.example"), ["infra/to-set"]);
        assert_eq!(routes_of("infra/gw/8080", "e.example"), ["infra/to-set"]);
        assert!(model.table.listeners[0].hosts.iter().all(|h| h.hostname != "c.example"));

        let published = ["192.0.2.1".to_string()];
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::Published(&published));
        let gw = &d.gateways["infra/gw"];
        assert_eq!(gw.attached_listener_sets, 1);
        assert_eq!(gw.listeners.len(), 1, "a Gateway's status lists its own listeners");
        assert_eq!(gw.listeners[0].attached, 1);
        let a = &d.listener_sets["infra/ls-a"];
        assert_eq!(
            (a.conditions[0].status, a.conditions[0].reason.as_str()),
            (true, "ListenersNotValid")
        );
        assert_eq!(
            (a.conditions[1].status, a.conditions[1].reason.as_str()),
            (true, "Programmed")
        );
        let conds = |l: &ListenerStatus| -> Vec<(String, bool, String)> {
            l.conditions
                .iter()
                .map(|c| (c.type_.to_string(), c.status, c.reason.clone()))
                .collect()
        };
        let by_name = |name: &str| a.listeners.iter().find(|l| l.name == name).unwrap();
        assert!(programmed(by_name("a")) && programmed(by_name("extra")));
        assert_eq!((by_name("a").attached, by_name("extra").attached), (1, 1));
        for (name, reason) in [("dup", "HostnameConflict"), ("tcp", "ProtocolConflict")] {
            let c = conds(by_name(name));
            for t in ["Accepted", "Programmed"] {
                assert!(c.contains(&(t.to_string(), false, reason.to_string())), "{name}: {c:?}");
            }
            assert!(
                c.contains(&("Conflicted".to_string(), true, reason.to_string())),
                "{name}: {c:?}"
            );
        }
        // A listener refused for its port's protocol serves no kind; one
        // refused for its hostname keeps its protocol's.
        assert!(by_name("tcp").kinds.is_empty());
        assert_eq!(by_name("dup").kinds, vec!["HTTPRoute", "GRPCRoute"]);
        // Everything ls-b has is taken by the older ls-a.
        let b = &d.listener_sets["infra/ls-b"];
        assert_eq!(
            (b.conditions[0].status, b.conditions[0].reason.as_str()),
            (false, "ListenersNotValid")
        );
        assert_eq!(conds(&b.listeners[0])[0].2, "HostnameConflict");
        let c = &d.listener_sets["other/ls-c"];
        assert!(c.conditions.iter().all(|c| !c.status && c.reason == "NotAllowed"));
        // Route parents.
        let accepted = |route: &str| {
            let p = &d.routes[route][0].conditions[0];
            (p.status, p.reason.clone())
        };
        assert_eq!(accepted("infra/to-gateway"), (true, "Accepted".to_string()));
        assert_eq!(accepted("infra/to-set"), (true, "Accepted".to_string()));
        assert_eq!(
            accepted("infra/set-listener-by-gateway"),
            (false, "NoMatchingParent".to_string())
        );
        assert_eq!(
            accepted("infra/to-refused-set"),
            (false, "NoMatchingParent".to_string())
        );
    }

    #[test]
    fn a_listener_set_never_takes_what_a_broken_listener_claims_nor_shifts_other_gateways_ports() {
        let listener = |name: &str, protocol: &str, port: u16, host: &str, secret: Option<&str>| {
            let mut l = json!({"name": name, "protocol": protocol, "port": port, "hostname": host});
            if let Some(secret) = secret {
                l["tls"] = json!({"certificateRefs": [{"name": secret}]});
            }
            l
        };
        let gateway = |name: &str, created: &str, listeners: Value| {
            json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": name, "creationTimestamp": created},
                   "spec": {"gatewayClassName": "ours", "allowedListeners": {"namespaces": {"from": "All"}},
                            "listeners": listeners}})
        };
        let s = snap(&[
            json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
            // The Gateway's HTTPS listener waits for its Secret.
            gateway(
                "gw",
                "2026-01-01T00:00:00Z",
                json!([listener("secure", "HTTPS", 443, "secure.example", Some("missing"))]),
            ),
            gateway(
                "later",
                "2026-01-01T00:00:05Z",
                json!([listener("web", "HTTP", 80, "later.example", None)]),
            ),
            tls_secret("team", "cert"),
            json!({"kind": "ListenerSet", "metadata": {"namespace": "team", "name": "grab", "creationTimestamp": "2026-01-01T00:00:01Z"},
            "spec": {"parentRef": {"name": "gw", "namespace": "infra"}, "listeners": [
                listener("same-host", "HTTPS", 443, "secure.example", Some("cert")),
                listener("plain", "HTTP", 443, "other.example", None),
                listener("new-port", "HTTP", 8080, "team.example", None),
            ]}}),
        ]);
        let model = translate(&s, CONTROLLER_NAME, 18000, &[], |r| {
            format!("{}-{}-{}", r.namespace, r.name, r.port)
        });
        let state = |owner: &str, name: &str| model.listeners.get(&(owner.to_string(), name.to_string())).cloned();
        let reason = |owner: &str, name: &str| state(owner, name).and_then(|r| r.err()).map(|e| e.0);
        assert_eq!(
            reason("ListenerSet/team/grab", "same-host").as_deref(),
            Some("HostnameConflict")
        );
        assert_eq!(
            reason("ListenerSet/team/grab", "plain").as_deref(),
            Some("ProtocolConflict")
        );
        assert_eq!(state("ListenerSet/team/grab", "new-port"), Some(Ok(())));
        assert!(
            model.certificates.is_empty(),
            "no tenant certificate for the Gateway's host"
        );
        // The Gateways' own ports first: the set's port comes after `later`'s.
        let ports: BTreeMap<&str, u16> = model.servers.iter().map(|s| (s.name.as_str(), s.nginx_port)).collect();
        assert_eq!(
            ports,
            BTreeMap::from([("infra/later/80", 18000), ("infra/gw/8080", 18001)])
        );

        // The Gateway serves only its ListenerSet's listener: it is still
        // accepted (some listeners not valid), and so is the set.
        let published = ["192.0.2.1".to_string()];
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::Published(&published));
        let gw = &d.gateways["infra/gw"];
        assert_eq!(
            (gw.conditions[0].status, gw.conditions[0].reason.as_str()),
            (true, "ListenersNotValid")
        );
        assert_eq!(gw.attached_listener_sets, 1);
        let set = &d.listener_sets["team/grab"];
        assert!(
            set.conditions[0].status && set.conditions[1].status,
            "{:?}",
            set.conditions
        );
        // Without an address yet, the set is not Programmed either.
        let none = BTreeMap::new();
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::PerGateway(&none));
        let programmed = &d.listener_sets["team/grab"].conditions[1];
        assert_eq!(
            (programmed.status, programmed.reason.as_str()),
            (false, "ParentNotProgrammed")
        );
    }

    #[test]
    fn listener_sets_open_no_more_than_a_gateways_share_of_ports() {
        let http = |name: String, port: u16| json!({"name": name, "protocol": "HTTP", "port": port});
        let set = |name: &str, created: &str, listeners: Vec<Value>| {
            json!({"kind": "ListenerSet", "metadata": {"namespace": "team", "name": name, "creationTimestamp": created},
                   "spec": {"parentRef": {"name": "gw", "namespace": "infra"}, "listeners": listeners}})
        };
        let s = snap(&[
            json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
            json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": "gw", "creationTimestamp": "2026-01-01T00:00:00Z"},
                   "spec": {"gatewayClassName": "ours", "allowedListeners": {"namespaces": {"from": "All"}},
                            "listeners": [http("web".into(), 80)]}}),
            set(
                "many",
                "2026-01-01T00:00:01Z",
                (0..64).map(|i| http(format!("l{i}"), 9000 + i)).collect(),
            ),
            set(
                "late",
                "2026-01-01T00:00:02Z",
                vec![
                    json!({"name": "shared", "protocol": "HTTP", "port": 80, "hostname": "late.example"}),
                    http("new".into(), 7000),
                ],
            ),
        ]);
        let model = translate(&s, CONTROLLER_NAME, 0, &[], |r| {
            format!("{}-{}-{}", r.namespace, r.name, r.port)
        });
        let state = |owner: &str, name: &str| model.listeners.get(&(owner.to_string(), name.to_string())).cloned();
        let reason = |owner: &str, name: &str| state(owner, name).and_then(|r| r.err()).map(|e| e.0);
        assert_eq!(model.servers.len(), MAX_PORTS_PER_GATEWAY);
        assert_eq!(state("ListenerSet/team/many", "l62"), Some(Ok(())));
        assert_eq!(
            reason("ListenerSet/team/many", "l63").as_deref(),
            Some("PortUnavailable"),
            "the Gateway's own port and 63 of the set's make 64"
        );
        assert_eq!(
            state("ListenerSet/team/late", "shared"),
            Some(Ok(())),
            "a port the Gateway has costs nothing"
        );
        assert_eq!(
            reason("ListenerSet/team/late", "new").as_deref(),
            Some("PortUnavailable")
        );
        assert!(model
            .problems
            .iter()
            .any(|(object, message)| object == "ListenerSet team/late" && message.contains("64 ports")));
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
        // HTTPS without a certificate: accepted, its reference unresolved.
        assert_eq!(gw.listeners[1].conditions[2].reason, "InvalidCertificateRef");
        assert_eq!(gw.conditions[0].reason, "ListenersNotValid");
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

    fn tls_secret(ns: &str, name: &str) -> Value {
        let (crt, key) = crate::model::tls::tests::self_signed("example.org", -1, 30);
        let b64 = |b: &[u8]| openssl::base64::encode_block(b);
        json!({"kind": "Secret", "metadata": {"namespace": ns, "name": name}, "type": "kubernetes.io/tls",
               "data": {"tls.crt": b64(&crt), "tls.key": b64(&key)}})
    }

    /// `(type, status, reason)` of each condition of listener `name` of
    /// `infra/gw`.
    fn listener_conditions(d: &Desired, name: &str) -> Vec<(&'static str, bool, String)> {
        d.gateways["infra/gw"]
            .listeners
            .iter()
            .find(|l| l.name == name)
            .unwrap()
            .conditions
            .iter()
            .map(|c| (c.type_, c.status, c.reason.clone()))
            .collect()
    }

    #[test]
    fn https_listeners_take_their_certificates_or_say_why_not() {
        let https = |name: &str, hostname: Option<&str>, secret_ns: &str, secret: &str| {
            let mut l = json!({"name": name, "protocol": "HTTPS", "port": 443,
                "tls": {"certificateRefs": [{"name": secret, "namespace": secret_ns}]}});
            if let Some(h) = hostname {
                l["hostname"] = json!(h);
            }
            l
        };
        let s = snap(&[
            json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
            json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": "gw"}, "spec": {"gatewayClassName": "ours", "listeners": [
                https("any", None, "infra", "cert"),
                https("named", Some("second.example.org"), "certs", "granted"),
                https("missing", Some("a.test"), "infra", "nope"),
                https("ungranted", Some("b.test"), "other", "cert"),
                {"name": "kind", "protocol": "HTTPS", "port": 443, "hostname": "c.test",
                 "tls": {"certificateRefs": [{"name": "x", "kind": "ConfigMap"}]}},
                {"name": "plain", "protocol": "HTTP", "port": 443}]}}),
            tls_secret("infra", "cert"),
            tls_secret("certs", "granted"),
            tls_secret("other", "cert"),
            json!({"kind": "ReferenceGrant", "metadata": {"namespace": "certs", "name": "g"}, "spec": {
                "from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "infra"}],
                "to": [{"group": "", "kind": "Secret"}]}}),
        ]);
        let model = translate(&s, CONTROLLER_NAME, 0, &[], |r| format!("{}-{}", r.namespace, r.name));
        assert_eq!(model.servers.len(), 1);
        assert!(model.servers[0].ssl);
        let certs = &model.table.listeners[0].certificates;
        assert_eq!(
            certs
                .iter()
                .map(|c| (c.hostname.as_str(), c.certificate.as_str()))
                .collect::<Vec<_>>(),
            [("*", "infra_cert"), ("second.example.org", "certs_granted")]
        );
        assert!(model.certificates.contains_key("infra_cert") && model.certificates.contains_key("certs_granted"));
        let published = Vec::new();
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::Published(&published));
        let listener = |name: &str| listener_conditions(&d, name);
        assert!(listener("any").contains(&("Programmed", true, "Programmed".into())));
        assert!(listener("named").contains(&("Programmed", true, "Programmed".into())));
        assert!(listener("missing").contains(&("ResolvedRefs", false, "InvalidCertificateRef".into())));
        assert!(listener("missing").contains(&("Programmed", false, "Invalid".into())));
        assert!(listener("ungranted").contains(&("ResolvedRefs", false, "RefNotPermitted".into())));
        assert!(listener("kind").contains(&("ResolvedRefs", false, "InvalidCertificateRef".into())));
        assert!(listener("plain").contains(&("Accepted", false, "ProtocolConflict".into())));
    }

    #[test]
    fn client_ca_references_are_checked_per_port() {
        let (ca, _) = crate::model::tls::tests::self_signed("clients.example.org", -1, 30);
        let ca = String::from_utf8(ca).unwrap();
        let https = |name: &str, port: u16, hostname: &str| {
            json!({"name": name, "protocol": "HTTPS", "port": port, "hostname": hostname,
                   "tls": {"certificateRefs": [{"name": "cert"}]}})
        };
        let cm = |name: &str| json!({"group": "", "kind": "ConfigMap", "name": name});
        let gateway = |mode: &str| {
            json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": "gw"}, "spec": {
                "gatewayClassName": "ours",
                "tls": {"frontend": {
                    "default": {"validation": {"caCertificateRefs": [cm("ca")], "mode": mode}},
                    "perPort": [
                        {"port": 7443, "tls": {"validation": {"caCertificateRefs": [cm("missing")]}}},
                        {"port": 8443, "tls": {"validation": {"caCertificateRefs": [
                            {"group": "", "kind": "Service", "name": "web"}]}}},
                        {"port": 6443, "tls": {"validation": {"caCertificateRefs": [
                            {"group": "", "kind": "ConfigMap", "name": "ca", "namespace": "other"}]}}},
                        {"port": 80, "tls": {"validation": {"caCertificateRefs": [cm("missing")]}}}]}},
                "listeners": [https("https", 443, "a.test"), https("unresolved", 7443, "b.test"),
                              https("kind", 8443, "c.test"), https("grant", 6443, "d.test"),
                              {"name": "http", "protocol": "HTTP", "port": 80}]}})
        };
        let docs = |mode: &str| {
            snap(&[
                json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
                gateway(mode),
                tls_secret("infra", "cert"),
                json!({"kind": "ConfigMap", "metadata": {"namespace": "infra", "name": "ca"}, "data": {"ca.crt": ca}}),
                json!({"kind": "ConfigMap", "metadata": {"namespace": "other", "name": "ca"}, "data": {"ca.crt": ca}}),
            ])
        };
        let s = docs("AllowValidOnly");
        let model = translate(&s, CONTROLLER_NAME, 0, &[], |r| format!("{}-{}", r.namespace, r.name));
        // Port 443 validates; the HTTP port ignores its (bad) entry.
        let served: Vec<_> = model
            .table
            .listeners
            .iter()
            .map(|l| (l.port, l.client_validation.as_ref().map(|v| v.mode)))
            .collect();
        assert_eq!(served, [(443, Some(ValidationMode::AllowValidOnly)), (80, None)]);
        let published = Vec::new();
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::Published(&published));
        let listener = listener_conditions;
        for name in ["https", "http"] {
            for t in ["Accepted", "Programmed", "ResolvedRefs"] {
                assert!(listener(&d, name).iter().any(|c| c.0 == t && c.1), "{name} {t}");
            }
        }
        for (name, reason) in [
            ("unresolved", "InvalidCACertificateRef"),
            ("kind", "InvalidCACertificateKind"),
            ("grant", "RefNotPermitted"),
        ] {
            let l = listener(&d, name);
            assert!(l.contains(&("ResolvedRefs", false, reason.into())), "{name}: {l:?}");
            assert!(
                l.contains(&("Accepted", false, "NoValidCACertificate".into())),
                "{name}: {l:?}"
            );
            assert!(l.iter().any(|c| c.0 == "Programmed" && !c.1), "{name}: {l:?}");
        }
        let insecure = |d: &Desired| {
            d.gateways["infra/gw"]
                .conditions
                .iter()
                .any(|c| c.type_ == "InsecureFrontendValidationMode" && c.status && c.reason == "ConfigurationChanged")
        };
        assert!(!insecure(&d));
        let s = docs("AllowInsecureFallback");
        let model = translate(&s, CONTROLLER_NAME, 0, &[], |r| format!("{}-{}", r.namespace, r.name));
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::Published(&published));
        assert!(insecure(&d));
        // Back to AllowValidOnly: the condition goes, not kept as foreign.
        let before = conditions_json(&d.gateways["infra/gw"].conditions, 1, None, "t0");
        let s = docs("AllowValidOnly");
        let model = translate(&s, CONTROLLER_NAME, 0, &[], |r| format!("{}-{}", r.namespace, r.name));
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::Published(&published));
        let after = conditions_json(&d.gateways["infra/gw"].conditions, 2, Some(&before), "t1");
        assert!(!after.to_string().contains("InsecureFrontendValidationMode"), "{after}");
    }

    #[test]
    fn listeners_admit_routes_by_namespace_selector() {
        let s = snap(&[
            json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
            json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": "gw"}, "spec": {"gatewayClassName": "ours", "listeners": [
                {"name": "web", "protocol": "HTTP", "port": 80, "allowedRoutes": {"namespaces": {"from": "Selector",
                    "selector": {"matchLabels": {"team": "a"},
                                 "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod"]}]}}}}]}}),
            json!({"kind": "Namespace", "metadata": {"name": "a", "labels": {"team": "a"}}}),
            json!({"kind": "Namespace", "metadata": {"name": "a-prod", "labels": {"team": "a", "env": "prod"}}}),
            json!({"kind": "Namespace", "metadata": {"name": "b", "labels": {"team": "b"}}}),
            json!({"kind": "Service", "metadata": {"namespace": "a", "name": "web"}, "spec": {"ports": [{"port": 80}]}}),
            route("a", "r", &[], "a"),
            route("a-prod", "r", &[], "a-prod"),
            route("b", "r", &[], "b"),
        ]);
        let model = translate(&s, CONTROLLER_NAME, 0, &[], |r| format!("{}-{}", r.namespace, r.name));
        let published = Vec::new();
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::Published(&published));
        let accepted = |route: &str| d.routes[route][0].conditions[0].reason.clone();
        assert_eq!(accepted("a/r"), "Accepted");
        assert_eq!(accepted("a-prod/r"), "NotAllowedByListeners");
        assert_eq!(accepted("b/r"), "NotAllowedByListeners");
    }

    #[test]
    fn route_kinds_and_partly_invalid_gateways() {
        let s = snap(&[
            json!({"kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": CONTROLLER_NAME}}),
            json!({"kind": "Gateway", "metadata": {"namespace": "infra", "name": "gw"}, "spec": {"gatewayClassName": "ours", "listeners": [
                {"name": "http", "protocol": "HTTP", "port": 80,
                 "allowedRoutes": {"kinds": [{"kind": "InvalidRoute"}, {"kind": "HTTPRoute"}]}},
                {"name": "odd", "protocol": "INVALID", "port": 1111}]}}),
        ]);
        let model = translate(&s, CONTROLLER_NAME, 0, &[], |r| format!("{}-{}", r.namespace, r.name));
        let published = Vec::new();
        let d = desired(&s, &model, CONTROLLER_NAME, Addresses::Published(&published));
        let gw = &d.gateways["infra/gw"];
        let accepted = &gw.conditions[0];
        assert_eq!((accepted.status, accepted.reason.as_str()), (true, "ListenersNotValid"));
        assert_eq!(gw.listeners[0].kinds, ["HTTPRoute"]);
        let resolved = gw.listeners[0]
            .conditions
            .iter()
            .find(|c| c.type_ == "ResolvedRefs")
            .unwrap();
        assert_eq!(
            (resolved.status, resolved.reason.as_str()),
            (false, "InvalidRouteKinds")
        );
        assert!(gw.listeners[1].kinds.is_empty());
        assert_eq!(gw.listeners[1].conditions[0].reason, "UnsupportedProtocol");
    }

    #[test]
    fn foreign_conditions_are_kept() {
        let have = json!([
            {"type": "Accepted", "status": "False", "reason": "Pending", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "example.com/Audited", "status": "True", "reason": "Seen", "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
        let out = conditions_json(
            &[cond("Accepted", true, "Accepted", "ok")],
            2,
            Some(&have),
            "2026-11-28T00:00:00Z",
        );
        let out = out.as_array().unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[0]["type"].as_str(), out[0]["status"].as_str()),
            (Some("Accepted"), Some("True"))
        );
        assert_eq!(out[1], have[1]);
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
