//! Keeps one Service per Gateway (see [`crate::gateway::services`]) in the
//! controller's namespace, the leader only: creates and updates them with
//! server-side apply, deletes those whose Gateway is gone, and reads back
//! each Gateway's address for its status.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Api;

use crate::gateway::addresses::Infrastructure;
use crate::gateway::services::{addresses, cluster_ips, desired, list_selector, ServiceOptions, GATEWAY_ANNOTATION};
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
        && ports(w) == ports(h)
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

/// Brings the Services up to date with `servers`; returns each Gateway's
/// addresses (`namespace/name` → addresses; a Gateway whose Service has
/// no address yet is absent).
pub async fn sync(
    client: &kube::Client,
    opts: &ServiceOptions,
    servers: &[GatewayServer],
    infra: &BTreeMap<String, Infrastructure>,
) -> kube::Result<BTreeMap<String, Vec<String>>> {
    let api: Api<Service> = Api::namespaced(client.clone(), &opts.namespace);
    let existing = api
        .list(&ListParams::default().labels(&list_selector(&opts.controller_name)))
        .await?;
    let want = desired(servers, opts, infra);
    let mut out = BTreeMap::new();
    for (name, service) in &want {
        let gateway = service
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GATEWAY_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        let have = existing
            .items
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(name.as_str()));
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
                        tracing::warn!(service = %name, gateway = %gateway, error = %e, "the cluster refuses the address the Gateway asks for; its Service keeps its address");
                        if let Some(a) = have.and_then(|h| addresses(h, opts.type_)) {
                            out.insert(gateway, a);
                        }
                        continue;
                    }
                    if let Err(e) = api.delete(name, &DeleteParams::default()).await {
                        tracing::warn!(service = %name, gateway = %gateway, error = %e, "replacing the Gateway's Service for its new address failed; retried on the next round");
                        continue;
                    }
                    tracing::info!(service = %name, gateway = %gateway, "deleted the Gateway's Service to give it the address it asks for");
                }
                let applied = api
                    .patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(service))
                    .await;
                match applied {
                    Ok(s) => {
                        tracing::info!(service = %name, gateway = %gateway, "applied the Gateway's Service");
                        s
                    }
                    Err(e) => {
                        // A static address the cluster refuses (outside the
                        // Service range, taken) lands here: the Gateway then
                        // says AddressNotUsable.
                        tracing::warn!(service = %name, gateway = %gateway, error = %e, "applying the Gateway's Service failed; retried on the next round");
                        continue;
                    }
                }
            }
        };
        if let Some(a) = addresses(&current, opts.type_) {
            out.insert(gateway, a);
        }
    }
    for stale in existing
        .items
        .iter()
        .filter_map(|s| s.metadata.name.as_deref())
        .filter(|n| !want.contains_key(*n))
    {
        match api.delete(stale, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(service = %stale, "deleted the Service of a Gateway that is gone"),
            Err(e) => tracing::warn!(service = %stale, error = %e, "deleting a stale Gateway Service failed"),
        }
    }
    Ok(out)
}
