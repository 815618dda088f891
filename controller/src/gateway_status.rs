//! Gateway API status, written by the leader only (see [`crate::leader`]):
//! GatewayClasses of our `controllerName`, their Gateways, and our parent
//! entries of HTTPRoutes (other controllers' entries are kept). What to
//! write is pure ([`crate::gateway::status`]); this task compares it with
//! what the objects hold and patches the `status` subresource only where
//! it differs, with the object's `resourceVersion` so that a concurrent
//! write is retried on the next round rather than overwritten.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gateway_api_types::backendtlspolicies::BackendTlsPolicy;
use gateway_api_types::gatewayclasses::GatewayClass;
use gateway_api_types::gateways::Gateway;
use gateway_api_types::grpcroutes::GrpcRoute;
use gateway_api_types::httproutes::HttpRoute;
use gateway_api_types::listenersets::ListenerSet;
use gateway_api_types::tcproutes::TcpRoute;
use gateway_api_types::tlsroutes::TlsRoute;
use gateway_api_types::udproutes::UdpRoute;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::gateway::route::RouteKind;
use crate::gateway::status::{conditions_json, desired, Addresses, Desired, ParentStatus, SUPPORTED_FEATURES};
use crate::gateway::translate::translate;
use crate::snapshot::{key, Snapshot};

#[derive(Debug, Clone)]
pub struct GatewayStatusOptions {
    pub controller_name: String,
    pub base_port: u16,
    /// The controller's own ports (never Gateway ports).
    pub reserved: crate::model::l4_services::ReservedPorts,
    /// `status.addresses` of every Gateway (`--publish-status-address`),
    /// unless each Gateway has a Service of its own:
    pub addresses: Vec<String>,
    /// A Service per Gateway (`--gateway-service-selector`); its address
    /// is the Gateway's.
    pub services: Option<crate::gateway::services::ServiceOptions>,
    pub period: Duration,
    /// Route status writes in flight at once
    /// (`--gateway-status-concurrency`).
    pub writes_in_flight: usize,
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map_or_else(|_| "1970-01-01T00:00:00Z".to_string(), |t| t.to_string())
}

fn address_json(a: &str) -> Value {
    let kind = if a.parse::<std::net::IpAddr>().is_ok() {
        "IPAddress"
    } else {
        "Hostname"
    };
    json!({"type": kind, "value": a})
}

/// The status `want` gives an object whose current status is `have`
/// (times kept where a condition did not change).
fn class_status(conds: &[crate::gateway::status::Cond], generation: i64, have: &Value, now: &str) -> Value {
    json!({
        "conditions": conditions_json(conds, generation, have.get("conditions"), now),
        "supportedFeatures": SUPPORTED_FEATURES.iter().map(|f| json!({"name": f})).collect::<Vec<_>>(),
    })
}

/// `status.listeners` of a Gateway or a ListenerSet (times kept from the
/// entry of the same name in `have`).
fn listeners_json(
    want: &[crate::gateway::status::ListenerStatus],
    generation: i64,
    have: &Value,
    now: &str,
) -> Vec<Value> {
    let old_listeners = have.get("listeners").and_then(Value::as_array);
    want.iter()
        .map(|l| {
            let old = old_listeners.and_then(|o| o.iter().find(|e| e["name"] == l.name.as_str()));
            json!({
                "name": l.name,
                "attachedRoutes": l.attached,
                "supportedKinds": l.kinds.iter().map(|k| json!({"group": "gateway.networking.k8s.io", "kind": k})).collect::<Vec<_>>(),
                "conditions": conditions_json(&l.conditions, generation, old.and_then(|o| o.get("conditions")), now),
            })
        })
        .collect()
}

fn gateway_status(want: &crate::gateway::status::GatewayStatus, generation: i64, have: &Value, now: &str) -> Value {
    let mut status = json!({
        "conditions": conditions_json(&want.conditions, generation, have.get("conditions"), now),
        "addresses": want.addresses.iter().map(|a| address_json(a)).collect::<Vec<_>>(),
        "listeners": listeners_json(&want.listeners, generation, have, now),
    });
    // Written once there is something to count (or to set back to 0): a
    // Gateway CRD older than v1.5 prunes the field, and writing it there
    // every round would change nothing.
    if want.attached_listener_sets > 0 || have.get("attachedListenerSets").is_some() {
        status["attachedListenerSets"] = json!(want.attached_listener_sets);
    }
    status
}

fn listener_set_status(
    want: &crate::gateway::status::ListenerSetStatus,
    generation: i64,
    have: &Value,
    now: &str,
) -> Value {
    json!({
        "conditions": conditions_json(&want.conditions, generation, have.get("conditions"), now),
        "listeners": listeners_json(&want.listeners, generation, have, now),
    })
}

fn route_status(
    want: &[crate::gateway::status::ParentStatus],
    controller_name: &str,
    generation: i64,
    have: &Value,
    now: &str,
) -> Value {
    entries_status(want, controller_name, generation, have, now, "parents", "parentRef")
}

/// A policy's status: its `ancestors`, each as a route's parent entry with
/// `ancestorRef` for `parentRef`.
fn policy_status(
    want: &[crate::gateway::status::ParentStatus],
    controller_name: &str,
    generation: i64,
    have: &Value,
    now: &str,
) -> Value {
    entries_status(want, controller_name, generation, have, now, "ancestors", "ancestorRef")
}

/// Our entries of a `list` of per-parent statuses (`parents` of a route,
/// `ancestors` of a policy), after the entries of other controllers, which
/// are kept as they are.
fn entries_status(
    want: &[crate::gateway::status::ParentStatus],
    controller_name: &str,
    generation: i64,
    have: &Value,
    now: &str,
    list: &str,
    reference: &str,
) -> Value {
    let old: Vec<Value> = have.get(list).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut parents: Vec<Value> = old
        .iter()
        .filter(|p| p["controllerName"] != controller_name)
        .cloned()
        .collect();
    for p in want {
        let previous = old
            .iter()
            .find(|o| o["controllerName"] == controller_name && o[reference] == p.parent_ref);
        parents.push(json!({
            reference: p.parent_ref,
            "controllerName": controller_name,
            "conditions": conditions_json(&p.conditions, generation, previous.and_then(|o| o.get("conditions")), now),
        }));
    }
    json!({ list: parents })
}

/// Our parent entries to write on a route: what `want` says, or none (so
/// that ours are removed) for a route none of our Gateways takes any more
/// (its parent deleted, its `parentRefs` pointed elsewhere) that still
/// carries entries of ours; `None`: not ours to write.
fn parents_to_write<'a>(
    want: Option<&'a Vec<ParentStatus>>,
    have: &Value,
    controller_name: &str,
) -> Option<&'a [ParentStatus]> {
    match want {
        Some(w) => Some(w),
        None => has_entries_of(have, "parents", controller_name).then_some(&[]),
    }
}

fn has_entries_of(have: &Value, list: &str, controller_name: &str) -> bool {
    have.get(list)
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|e| e["controllerName"] == controller_name))
}

/// Whether `want`'s keys hold the same values in `have`.
fn differs(want: &Value, have: &Value) -> bool {
    want.as_object()
        .is_some_and(|w| w.iter().any(|(k, v)| have.get(k) != Some(v)))
}

async fn patch<K>(api: Api<K>, name: &str, resource_version: Option<&str>, status: Value) -> kube::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let body = json!({"metadata": {"resourceVersion": resource_version}, "status": status});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map(drop)
}

/// Writes the status of the routes of one kind that differs from what
/// `want` says; returns what was written, each with its result.
async fn sync_routes<K>(
    client: &kube::Client,
    opts: &GatewayStatusOptions,
    want: &Desired,
    now: &str,
    routes: &[Arc<K>],
    kind: RouteKind,
    status_of: impl Fn(&K) -> Value,
) -> Vec<(String, kube::Result<()>)>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    use futures::StreamExt;
    let mut writes = Vec::new();
    for route in routes {
        let meta = route.meta();
        let have = status_of(route);
        let Some(w) = parents_to_write(want.routes.get(&kind.key(meta)), &have, &opts.controller_name) else {
            continue;
        };
        let status = route_status(w, &opts.controller_name, meta.generation.unwrap_or(0), &have, now);
        if differs(&status, &have) {
            let api = Api::<K>::namespaced(client.clone(), meta.namespace.as_deref().unwrap_or("default"));
            let name = meta.name.clone().unwrap_or_default();
            let resource_version = meta.resource_version.clone();
            let what = format!("{} {}", kind.name(), key(meta));
            writes.push(async move { (what, patch(api, &name, resource_version.as_deref(), status).await) });
        }
    }
    futures::stream::iter(writes)
        .buffer_unordered(opts.writes_in_flight.max(1))
        .collect()
        .await
}

/// Each Gateway's `status.addresses` values as the cluster holds them.
fn addresses_in_status(snap: &Snapshot) -> BTreeMap<String, Vec<String>> {
    snap.gateways
        .iter()
        .filter_map(|g| {
            let values: Vec<String> = g
                .status
                .as_ref()?
                .addresses
                .iter()
                .flatten()
                .map(|a| a.value.clone())
                .collect();
            (!values.is_empty()).then(|| (key(&g.metadata), values))
        })
        .collect()
}

/// What one pass did.
struct Pass {
    /// Statuses written.
    written: usize,
    /// A Gateway still waits for its Service's address, or keeping the
    /// Services failed: look again soon.
    pending: bool,
    /// Everything was written and nothing waits: until an input of the
    /// status changes, another pass would write nothing.
    clean: bool,
}

/// Brings the Gateways' Services and every status up to date once.
async fn sync_once(
    client: &kube::Client,
    opts: &GatewayStatusOptions,
    snap: &Snapshot,
    last_addresses: &mut Option<BTreeMap<String, Vec<String>>>,
    listener_sets_ours: &mut std::collections::BTreeSet<String>,
) -> Pass {
    let mut failed = false;
    let reserved = crate::model::l4_services::gateway_reserved(&opts.reserved, snap);
    let model = translate(snap, &opts.controller_name, opts.base_port, &reserved, |r| {
        format!("{}-{}-{}", r.namespace, r.name, r.port)
    });
    let per_gateway = match &opts.services {
        Some(services) => match crate::gateway_services::sync(
            client,
            services,
            &model.servers,
            &crate::gateway::addresses::by_gateway(snap.gateways.iter().map(|g| &**g)),
            &snap
                .gateways
                .iter()
                .filter_map(|g| Some((key(&g.metadata), g.metadata.uid.clone()?)))
                .collect(),
        )
        .await
        {
            Ok(found) => {
                *last_addresses = Some(found.clone());
                Some(found)
            }
            Err(e) => {
                // The rest of the status (classes, routes, policies) is
                // still written; Gateways keep the addresses last seen.
                tracing::warn!(error = %e, "keeping the Gateways' Services failed; retried soon");
                failed = true;
                // Before the first success (a new leader), what each
                // Gateway's status already says: a failing round never
                // takes a Gateway's address away.
                Some(last_addresses.clone().unwrap_or_else(|| addresses_in_status(snap)))
            }
        },
        None => None,
    };
    let pending = failed
        || per_gateway
            .as_ref()
            .is_some_and(|found| model.servers.iter().any(|s| !found.contains_key(&s.gateway)));
    let addresses = match &per_gateway {
        Some(found) => Addresses::PerGateway(found),
        None => Addresses::Published(&opts.addresses),
    };
    let want: Desired = desired(snap, &model, &opts.controller_name, addresses);
    let now = now();
    let mut written = 0;
    let mut write_failed = false;
    let mut report = |what: String, r: kube::Result<()>| match r {
        Ok(()) => written += 1,
        Err(e) => {
            write_failed = true;
            tracing::warn!(object = %what, error = %e, "writing Gateway API status failed; retried on the next round")
        }
    };
    for c in &snap.gateway_classes {
        let name = c.metadata.name.clone().unwrap_or_default();
        let Some(conds) = want.classes.get(&name) else { continue };
        let have = serde_json::to_value(&c.status).unwrap_or(Value::Null);
        let status = class_status(conds, c.metadata.generation.unwrap_or(0), &have, &now);
        if differs(&status, &have) {
            let r = patch(
                Api::<GatewayClass>::all(client.clone()),
                &name,
                c.metadata.resource_version.as_deref(),
                status,
            )
            .await;
            report(format!("GatewayClass {name}"), r);
        }
    }
    for g in &snap.gateways {
        let k = key(&g.metadata);
        let Some(w) = want.gateways.get(&k) else { continue };
        let have = serde_json::to_value(&g.status).unwrap_or(Value::Null);
        let status = gateway_status(w, g.metadata.generation.unwrap_or(0), &have, &now);
        if differs(&status, &have) {
            let ns = g.metadata.namespace.as_deref().unwrap_or("default");
            let api = Api::<Gateway>::namespaced(client.clone(), ns);
            let r = patch(
                api,
                g.metadata.name.as_deref().unwrap_or(""),
                g.metadata.resource_version.as_deref(),
                status,
            )
            .await;
            report(format!("Gateway {k}"), r);
        }
    }
    // A ListenerSet this leader has written whose Gateway is gone: its
    // status says so rather than keeping the last Accepted (nothing in a
    // ListenerSet's status names its controller, so only ours are known).
    let orphan = crate::gateway::status::ListenerSetStatus {
        conditions: ["Accepted", "Programmed"]
            .into_iter()
            .map(|t| {
                crate::gateway::condition::cond(t, false, "ParentNotAccepted", "the parent Gateway does not exist")
            })
            .collect(),
        listeners: Vec::new(),
    };
    let gateway_keys: std::collections::BTreeSet<String> = snap.gateways.iter().map(|g| key(&g.metadata)).collect();
    listener_sets_ours.retain(|k| snap.listener_sets.iter().any(|ls| key(&ls.metadata) == *k));
    for ls in &snap.listener_sets {
        let k = key(&ls.metadata);
        let parent_exists = crate::gateway::listener_sets::parent_gateway(ls)
            .is_some_and(|(ns, name)| gateway_keys.contains(&format!("{ns}/{name}")));
        let w = match want.listener_sets.get(&k) {
            Some(w) => {
                listener_sets_ours.insert(k.clone());
                w
            }
            None if listener_sets_ours.contains(&k) && !parent_exists => &orphan,
            // Another controller's Gateway (now): its to write.
            None => {
                listener_sets_ours.remove(&k);
                continue;
            }
        };
        let have = serde_json::to_value(&ls.status).unwrap_or(Value::Null);
        let status = listener_set_status(w, ls.metadata.generation.unwrap_or(0), &have, &now);
        if differs(&status, &have) {
            let ns = ls.metadata.namespace.as_deref().unwrap_or("default");
            let r = patch(
                Api::<ListenerSet>::namespaced(client.clone(), ns),
                ls.metadata.name.as_deref().unwrap_or(""),
                ls.metadata.resource_version.as_deref(),
                status,
            )
            .await;
            report(format!("ListenerSet {k}"), r);
        }
    }
    let http = |r: &HttpRoute| serde_json::to_value(&r.status).unwrap_or(Value::Null);
    for (what, r) in sync_routes(client, opts, &want, &now, &snap.http_routes, RouteKind::Http, http).await {
        report(what, r);
    }
    let grpc = |r: &GrpcRoute| serde_json::to_value(&r.status).unwrap_or(Value::Null);
    for (what, r) in sync_routes(client, opts, &want, &now, &snap.grpc_routes, RouteKind::Grpc, grpc).await {
        report(what, r);
    }
    let tcp = |r: &TcpRoute| serde_json::to_value(&r.status).unwrap_or(Value::Null);
    for (what, r) in sync_routes(client, opts, &want, &now, &snap.tcp_routes, RouteKind::Tcp, tcp).await {
        report(what, r);
    }
    let tls = |r: &TlsRoute| serde_json::to_value(&r.status).unwrap_or(Value::Null);
    for (what, r) in sync_routes(client, opts, &want, &now, &snap.tls_routes, RouteKind::Tls, tls).await {
        report(what, r);
    }
    let udp = |r: &UdpRoute| serde_json::to_value(&r.status).unwrap_or(Value::Null);
    for (what, r) in sync_routes(client, opts, &want, &now, &snap.udp_routes, RouteKind::Udp, udp).await {
        report(what, r);
    }
    for p in &snap.backend_tls_policies {
        let k = key(&p.metadata);
        let Some(w) = want.policies.get(&k) else { continue };
        let have = serde_json::to_value(&p.status).unwrap_or(Value::Null);
        let ours_before = has_entries_of(&have, "ancestors", &opts.controller_name);
        // A policy none of our Gateways uses, with no entry of ours: not
        // ours to write.
        if w.is_empty() && !ours_before {
            continue;
        }
        let status = policy_status(
            w,
            &opts.controller_name,
            p.metadata.generation.unwrap_or(0),
            &have,
            &now,
        );
        if differs(&status, &have) {
            let ns = p.metadata.namespace.as_deref().unwrap_or("default");
            let r = patch(
                Api::<BackendTlsPolicy>::namespaced(client.clone(), ns),
                p.metadata.name.as_deref().unwrap_or(""),
                p.metadata.resource_version.as_deref(),
                status,
            )
            .await;
            report(format!("BackendTLSPolicy {k}"), r);
        }
    }
    Pass {
        written,
        pending,
        clean: !pending && !write_failed,
    }
}

/// [`task`] as a task of the current runtime (see
/// [`crate::source::cluster::spawn`] for why the library spawns it).
pub fn spawn(
    client: kube::Client,
    opts: GatewayStatusOptions,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    leading: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(task(client, opts, snapshots, leading))
}

/// Runs until the process ends: whenever this replica leads and the
/// snapshot changes (or every `period`), brings status up to date.
pub async fn task(
    client: kube::Client,
    opts: GatewayStatusOptions,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    mut leading: watch::Receiver<bool>,
) {
    // The nginx Pods' comings and goings (a new Pod IP after a restart)
    // reach the Gateways' EndpointSlices at once, not at the next period.
    // (The sender lives as long as this task: a closed channel would wake
    // the loop for ever.)
    let (pods_tx, mut pods_changed) = watch::channel(());
    if let Some(services) = &opts.services {
        let pods_tx = pods_tx.clone();
        let api = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &services.namespace);
        let selector = services.pod_selector();
        tokio::spawn(async move {
            use futures::StreamExt;
            use kube::runtime::{watcher, WatchStreamExt};
            let events = watcher(api, watcher::Config::default().labels(&selector))
                .default_backoff()
                .touched_objects();
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(_) => {
                        if pods_tx.send(()).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "watching the nginx Pods for the Gateways' EndpointSlices"),
                }
            }
        });
    }
    let mut last_addresses = None;
    let mut listener_sets_ours = std::collections::BTreeSet::new();
    // The snapshot of the last clean pass, and whether only a new snapshot
    // woke the loop: a snapshot that differs from it in EndpointSlices only
    // (endpoint churn, most of a busy cluster's changes), none of them the
    // Gateways' own, skips the pass and the three LISTs of the Gateways'
    // Services it starts with. The period (counted from the last pass, so
    // that churn never postpones it), the nginx Pods and a new leadership
    // always run one.
    let mut synced: Option<Arc<Snapshot>> = None;
    let mut woke_by_snapshot = false;
    let mut last_pass = tokio::time::Instant::now();
    loop {
        let mut pending = false;
        let leads = *leading.borrow_and_update();
        if leads {
            let snap = snapshots.borrow_and_update().clone();
            let unchanged = woke_by_snapshot
                && last_pass.elapsed() < opts.period
                && synced.as_ref().is_some_and(|old| {
                    crate::snapshot::only_slices_changed(old, &snap, crate::gateway::services::is_gateway_slice)
                });
            if unchanged {
                tracing::trace!("only EndpointSlices changed; Gateway API status stays");
            } else {
                let pass = sync_once(&client, &opts, &snap, &mut last_addresses, &mut listener_sets_ours).await;
                last_pass = tokio::time::Instant::now();
                pending = pass.pending;
                synced = pass.clean.then_some(snap);
                if pass.written > 0 {
                    tracing::info!(objects = pass.written, "updated Gateway API status");
                }
            }
        } else {
            synced = None;
        }
        // A Service without its address yet (a load balancer assigning
        // one) is looked at again soon, not at the next period.
        let wait = if pending {
            Duration::from_secs(2).min(opts.period)
        } else if leads {
            opts.period.saturating_sub(last_pass.elapsed())
        } else {
            opts.period
        };
        woke_by_snapshot = false;
        tokio::select! {
            r = snapshots.changed() => {
                if r.is_err() { return }
                woke_by_snapshot = true;
            }
            r = leading.changed() => if r.is_err() { return },
            _ = pods_changed.changed() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        let _ = &pods_tx;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::status::Cond;

    /// A route's parents: another controller's entry, then ours for `gw`.
    fn parents_of_two_controllers(gw: &str) -> Value {
        json!({"parents": [
            {"parentRef": {"name": "other"}, "controllerName": "example.com/x", "conditions": []},
            {"parentRef": {"name": gw}, "controllerName": "me", "conditions": [
                {"type": "Accepted", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        ]})
    }

    #[test]
    fn other_controllers_parent_entries_are_kept() {
        let have = parents_of_two_controllers("gw");
        let want = [ParentStatus {
            parent_ref: json!({"name": "gw"}),
            conditions: vec![Cond {
                type_: "Accepted",
                status: true,
                reason: "Accepted".into(),
                message: "ok".into(),
            }],
        }];
        let status = route_status(&want, "me", 4, &have, "2026-11-28T00:00:00Z");
        let parents = status["parents"].as_array().unwrap();
        assert_eq!(parents.len(), 2);
        assert_eq!(parents[0]["controllerName"], "example.com/x");
        assert_eq!(
            parents[1]["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
        // Written once, the same status does not differ any more.
        let again = route_status(&want, "me", 4, &status, "2026-11-28T05:00:00Z");
        assert!(!differs(&again, &status));
    }

    #[test]
    fn a_route_none_of_our_gateways_takes_loses_only_our_entries() {
        let have = parents_of_two_controllers("deleted-gw");
        let w = parents_to_write(None, &have, "me").expect("ours to clean up");
        assert!(w.is_empty());
        let status = route_status(w, "me", 2, &have, "2026-11-29T00:00:00Z");
        assert_eq!(
            status,
            json!({"parents": [{"parentRef": {"name": "other"}, "controllerName": "example.com/x", "conditions": []}]})
        );
        assert!(differs(&status, &have));
        // Once written, nothing of ours is left: the route is not ours.
        assert!(parents_to_write(None, &status, "me").is_none());
        assert!(parents_to_write(None, &json!({}), "me").is_none());
        let want = vec![];
        assert!(parents_to_write(Some(&want), &json!({}), "me").is_some());
    }
}
