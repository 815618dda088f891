//! Keeps one Service per Gateway (see [`crate::gateway::services`]) beside
//! the Gateway, and its EndpointSlices naming the nginx Pods, the leader
//! only: creates and updates them with server-side apply, deletes those
//! whose Gateway is gone, and reads back each Gateway's address for its
//! status.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Api;

use crate::gateway::addresses::Infrastructure;
use crate::gateway::services::{
    addresses, cluster_ips, desired, endpoint_slices, list_selector, slice_list_selector, ServiceOptions,
    GATEWAY_ANNOTATION,
};
use crate::gateway::translate::GatewayServer;

/// Field manager of the applies.
const MANAGER: &str = "dynamic-balancer-gateway";

/// Whether `have` already says what `want` asks (type, selector, ports,
/// annotations): only then is no apply sent.
fn same(want: &Service, have: &Service) -> bool {
    let (Some(w), Some(h)) = (&want.spec, &have.spec) else {
        return false;
    };
    let ports = |s: &k8s_openapi::api::core::v1::ServiceSpec| {
        s.ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone(), p.port, p.target_port.clone()))
            .collect::<Vec<_>>()
    };
    // The labels and annotations the Service should carry: ours and the
    // Gateway's `spec.infrastructure` ones (one it no longer asks for is
    // dropped by the next apply, which any other change sends).
    let carries = |want: &Option<BTreeMap<String, String>>, have: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    carries(&want.metadata.labels, &have.metadata.labels)
        && carries(&want.metadata.annotations, &have.metadata.annotations)
        && w.type_ == h.type_
        && w.selector == h.selector
        && w.load_balancer_ip
            .as_ref()
            .is_none_or(|ip| h.load_balancer_ip.as_ref() == Some(ip))
        && !needs_new_cluster_ip(want, have)
        && {
            let have = ports(h);
            ports(w).iter().all(|p| have.contains(p))
        }
        && want
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GATEWAY_ANNOTATION))
            == have
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(GATEWAY_ANNOTATION))
}

/// Whether `want` asks for a cluster IP that `have` does not have: a
/// cluster IP cannot change, so the Service is made anew.
fn needs_new_cluster_ip(want: &Service, have: &Service) -> bool {
    cluster_ips(want).is_some_and(|w| cluster_ips(have).as_ref() != Some(&w))
}

/// Whether the cluster would take `service` as it is (a dry-run create
/// under another name): a static address it refuses (outside the Service
/// range, taken, a second one of one family) fails here, before the
/// Service that serves the Gateway now is deleted for it.
async fn would_accept(api: &Api<Service>, service: &Service) -> Result<(), kube::Error> {
    let mut probe = service.clone();
    let name = probe.metadata.name.clone().unwrap_or_default();
    probe.metadata.name = Some(format!("{}-p", &name[..name.len().min(61)]));
    probe.metadata.resource_version = None;
    api.create(
        &PostParams {
            dry_run: true,
            ..PostParams::default()
        },
        &probe,
    )
    .await
    .map(|_| ())
}

/// Our objects of kind `K` (by `namespace/name`): in every namespace, or
/// only in the watched one and, `with_own_namespace`, the controller's own
/// (where an earlier version kept the Services, to delete them; it made no
/// EndpointSlices, and the chart grants none there).
async fn list_ours<K>(
    client: &kube::Client,
    opts: &ServiceOptions,
    selector: &str,
    with_own_namespace: bool,
) -> kube::Result<BTreeMap<String, K>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let params = ListParams::default().labels(selector);
    let lists = match &opts.watch_namespace {
        None => vec![Api::<K>::all(client.clone()).list(&params).await?],
        Some(ns) => {
            let mut lists = vec![Api::<K>::namespaced(client.clone(), ns).list(&params).await?];
            if with_own_namespace && *ns != opts.namespace {
                lists.push(
                    Api::<K>::namespaced(client.clone(), &opts.namespace)
                        .list(&params)
                        .await?,
                );
            }
            lists
        }
    };
    Ok(lists
        .into_iter()
        .flat_map(|l| l.items)
        .map(|o| {
            let meta = o.meta();
            (
                format!(
                    "{}/{}",
                    meta.namespace.as_deref().unwrap_or_default(),
                    meta.name.as_deref().unwrap_or_default()
                ),
                o,
            )
        })
        .collect())
}

/// Whether an object of that name that we did not list (so without our
/// labels) is in the way: it belongs to someone else, and an apply would
/// take it over.
async fn someone_elses<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    matches!(api.get_opt(name).await, Ok(Some(_)) | Err(_))
}

/// What of an EndpointSlice decides where traffic goes, and its owner
/// (fields the apiserver fills in, such as zones and hints, left out).
fn slice_summary(s: &EndpointSlice) -> serde_json::Value {
    let endpoints: Vec<_> = s
        .endpoints
        .iter()
        .flatten()
        .map(|e| {
            let c = e.conditions.clone().unwrap_or_default();
            serde_json::json!([e.addresses, c.ready, c.serving, c.terminating])
        })
        .collect();
    let ports: Vec<_> = s
        .ports
        .iter()
        .flatten()
        .map(|p| serde_json::json!([p.name, p.port, p.protocol]))
        .collect();
    // The owner too: a slice of a Service made anew (another static
    // address) still names the old one until it is applied again, and the
    // garbage collector would delete it.
    let owners: Vec<_> = s
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| o.uid.as_str())
        .collect();
    serde_json::json!([s.address_type, endpoints, ports, owners])
}

/// Brings the Services and their EndpointSlices up to date with
/// `servers`; returns each Gateway's addresses (`namespace/name` →
/// addresses; a Gateway whose Service has no address yet is absent).
/// `owners`: each Gateway's uid, by `namespace/name`.
pub async fn sync(
    client: &kube::Client,
    opts: &ServiceOptions,
    servers: &[GatewayServer],
    infra: &BTreeMap<String, Infrastructure>,
    owners: &BTreeMap<String, String>,
) -> kube::Result<BTreeMap<String, Vec<String>>> {
    let existing: BTreeMap<String, Service> =
        list_ours(client, opts, &list_selector(&opts.controller_name), true).await?;
    let slices: BTreeMap<String, EndpointSlice> =
        list_ours(client, opts, &slice_list_selector(&opts.controller_name), false).await?;
    let pods = Api::<Pod>::namespaced(client.clone(), &opts.namespace)
        .list(&ListParams::default().labels(&opts.pod_selector()))
        .await?
        .items;
    let want = desired(servers, opts, infra, owners);
    let mut want_slices = BTreeSet::new();
    let mut out = BTreeMap::new();
    for (key, service) in &want {
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let namespace = service.metadata.namespace.as_deref().unwrap_or_default();
        let api: Api<Service> = Api::namespaced(client.clone(), namespace);
        let gateway = service
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GATEWAY_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        let have = existing.get(key);
        if have.is_none() && someone_elses(&api, name).await {
            tracing::warn!(service = %key, gateway = %gateway, "a Service of that name that this controller does not manage is in the way; the Gateway gets no address until it is renamed or deleted");
            continue;
        }
        let current = match have {
            Some(h) if same(service, h) => h.clone(),
            _ => {
                if have.is_some_and(|h| needs_new_cluster_ip(service, h)) {
                    // The Gateway asks for another static address: its
                    // address changes anyway, so the Service is replaced,
                    // if the cluster will take the new one (else the old
                    // Service keeps serving, and the Gateway says
                    // AddressNotUsable).
                    if let Err(e) = would_accept(&api, service).await {
                        tracing::warn!(service = %key, gateway = %gateway, error = %e, "the cluster refuses the address the Gateway asks for; its Service keeps its address");
                        if let Some(a) = have.and_then(|h| addresses(h, opts.type_)) {
                            out.insert(gateway, a);
                        }
                        if let Some(h) = have {
                            keep_slices(h, &mut want_slices);
                        }
                        continue;
                    }
                    if let Err(e) = api.delete(name, &DeleteParams::default()).await {
                        tracing::warn!(service = %key, gateway = %gateway, error = %e, "replacing the Gateway's Service for its new address failed; retried on the next round");
                        if let Some(h) = have {
                            keep_slices(h, &mut want_slices);
                        }
                        continue;
                    }
                    tracing::info!(service = %key, gateway = %gateway, "deleted the Gateway's Service to give it the address it asks for");
                }
                let applied = api
                    .patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(service))
                    .await;
                match applied {
                    Ok(s) => {
                        tracing::info!(service = %key, gateway = %gateway, "applied the Gateway's Service");
                        s
                    }
                    Err(e) => {
                        // A static address the cluster refuses (outside the
                        // Service range, taken) lands here: the Gateway then
                        // says AddressNotUsable.
                        tracing::warn!(service = %key, gateway = %gateway, error = %e, "applying the Gateway's Service failed; retried on the next round");
                        // The Service as it is keeps its endpoints.
                        if let Some(h) = have {
                            keep_slices(h, &mut want_slices);
                        }
                        continue;
                    }
                }
            }
        };
        let slice_api: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
        // The slices follow the Service this controller wants (its ports
        // only; the cluster's copy gives the uid): a port someone else
        // added to the Service gets no endpoint, so it cannot reach
        // another Gateway's nginx port or the controller's own.
        let mut basis = service.clone();
        basis.metadata.uid = current.metadata.uid.clone();
        for slice in endpoint_slices(&basis, &pods) {
            let slice_name = slice.metadata.name.clone().unwrap_or_default();
            let slice_key = format!("{namespace}/{slice_name}");
            want_slices.insert(slice_key.clone());
            let have = slices.get(&slice_key);
            if have.is_some_and(|h| slice_summary(h) == slice_summary(&slice)) {
                continue;
            }
            if have.is_none() && someone_elses(&slice_api, &slice_name).await {
                tracing::warn!(endpointslice = %slice_key, gateway = %gateway, "an EndpointSlice of that name that this controller does not manage is in the way");
                continue;
            }
            match slice_api
                .patch(&slice_name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&slice))
                .await
            {
                Ok(_) => {
                    tracing::info!(endpointslice = %slice_key, gateway = %gateway, endpoints = slice.endpoints.as_ref().map_or(0, Vec::len), "applied the Gateway Service's EndpointSlice")
                }
                Err(e) => {
                    tracing::warn!(endpointslice = %slice_key, gateway = %gateway, error = %e, "applying the Gateway Service's EndpointSlice failed; retried on the next round")
                }
            }
        }
        if let Some(a) = addresses(&current, opts.type_) {
            out.insert(gateway, a);
        }
    }
    for (stale, s) in existing.iter().filter(|(k, _)| !want.contains_key(*k)) {
        let api: Api<Service> = Api::namespaced(client.clone(), s.metadata.namespace.as_deref().unwrap_or_default());
        match api
            .delete(s.metadata.name.as_deref().unwrap_or_default(), &this_one(&s.metadata))
            .await
        {
            Ok(_) => tracing::info!(service = %stale, "deleted the Service of a Gateway that is gone"),
            Err(e) => tracing::warn!(service = %stale, error = %e, "deleting a stale Gateway Service failed"),
        }
    }
    // A Service deleted above takes its slices with it (they are owned by
    // it); a family whose Pods are gone loses its slice here.
    for (stale, s) in slices.iter().filter(|(k, _)| !want_slices.contains(*k)) {
        let api: Api<EndpointSlice> =
            Api::namespaced(client.clone(), s.metadata.namespace.as_deref().unwrap_or_default());
        match api
            .delete(s.metadata.name.as_deref().unwrap_or_default(), &this_one(&s.metadata))
            .await
        {
            Ok(_) => tracing::info!(endpointslice = %stale, "deleted a stale Gateway EndpointSlice"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                tracing::warn!(endpointslice = %stale, error = %e, "deleting a stale Gateway EndpointSlice failed")
            }
        }
    }
    Ok(out)
}

/// A delete of exactly the object listed (not one made anew under its
/// name since).
fn this_one(meta: &kube::api::ObjectMeta) -> DeleteParams {
    DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: meta.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

/// Marks the slices of `service` as wanted (its Service is kept as it is).
fn keep_slices(service: &Service, want: &mut BTreeSet<String>) {
    let ns = service.metadata.namespace.as_deref().unwrap_or_default();
    let name = service.metadata.name.as_deref().unwrap_or_default();
    want.insert(format!("{ns}/{name}"));
    want.insert(format!("{ns}/{name}-ipv6"));
}
