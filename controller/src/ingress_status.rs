//! Ingress status: `status.loadBalancer.ingress` of every Ingress of our
//! class, written by the leader only (see [`crate::leader`]).
//!
//! GitOps tools (Argo CD, Flux) keep an Ingress "Progressing" until this is
//! filled, and external-dns reads it. The address comes, as in
//! ingress-nginx, from `--publish-status-address` (a fixed list) or from the
//! `--publish-service` Service: its LoadBalancer IPs and hostnames and its
//! external IPs (a ClusterIP Service gives its cluster IP, an ExternalName
//! one its name). The decision is pure ([`addresses`], [`differs`]); the
//! task only reads, compares and patches the `status` subresource, never
//! the spec.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use kube::api::{ListParams, Patch, PatchParams};
use kube::Api;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::model::class::ClassFilter;
use crate::snapshot::Snapshot;

/// Where the published address comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publish {
    /// `--publish-service namespace/name`.
    Service { namespace: String, name: String },
    /// `--publish-status-address a,b,...` (IPs or hostnames).
    Addresses(Vec<String>),
}

/// The addresses to publish, sorted and without duplicates. `service` is
/// the publish Service when [`Publish::Service`] is used.
pub fn addresses(publish: &Publish, service: Option<&Service>) -> Vec<IngressLoadBalancerIngress> {
    let mut raw: Vec<String> = match publish {
        Publish::Addresses(list) => list.clone(),
        Publish::Service { .. } => service.map(service_addresses).unwrap_or_default(),
    };
    raw.sort();
    raw.dedup();
    raw.into_iter().map(|a| entry(&a)).collect()
}

fn entry(address: &str) -> IngressLoadBalancerIngress {
    if address.parse::<std::net::IpAddr>().is_ok() {
        IngressLoadBalancerIngress {
            ip: Some(address.to_string()),
            ..Default::default()
        }
    } else {
        IngressLoadBalancerIngress {
            hostname: Some(address.to_string()),
            ..Default::default()
        }
    }
}

/// ingress-nginx's `statusAddressFromService`.
fn service_addresses(svc: &Service) -> Vec<String> {
    let spec = svc.spec.clone().unwrap_or_default();
    let external: Vec<String> = spec.external_ips.clone().unwrap_or_default();
    match spec.type_.as_deref().unwrap_or("ClusterIP") {
        "ExternalName" => spec.external_name.into_iter().collect(),
        "LoadBalancer" => {
            let mut out: Vec<String> = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
                .collect();
            out.extend(external);
            out
        }
        _ if !external.is_empty() => external,
        _ => spec.cluster_ip.into_iter().filter(|ip| ip != "None").collect(),
    }
}

/// The Ingress's published addresses, in the same form as [`addresses`].
fn current(ing: &Ingress) -> Vec<(Option<String>, Option<String>)> {
    let mut v: Vec<_> = ing
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .map(|i| (i.ip.clone(), i.hostname.clone()))
        .collect();
    v.sort();
    v
}

/// Whether the Ingress's status must be written.
pub fn differs(ing: &Ingress, want: &[IngressLoadBalancerIngress]) -> bool {
    let mut w: Vec<_> = want.iter().map(|i| (i.ip.clone(), i.hostname.clone())).collect();
    w.sort();
    current(ing) != w
}

/// Everything the status task needs.
#[derive(Clone)]
pub struct StatusOptions {
    pub publish: Option<Publish>,
    pub class: ClassFilter,
    /// How often the leader re-checks even without a change (ingress-nginx
    /// syncs status every 60 s: the publish Service may live outside the
    /// watched namespace).
    pub period: Duration,
}

async fn desired(client: &kube::Client, publish: &Publish) -> kube::Result<Vec<IngressLoadBalancerIngress>> {
    match publish {
        Publish::Service { namespace, name } => {
            let svc = Api::<Service>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await?;
            if svc.is_none() {
                tracing::warn!(service = %format!("{namespace}/{name}"), "--publish-service does not exist");
            }
            Ok(addresses(publish, svc.as_ref()))
        }
        Publish::Addresses(_) => Ok(addresses(publish, None)),
    }
}

async fn write(client: &kube::Client, ing: &Ingress, want: &[IngressLoadBalancerIngress]) -> kube::Result<()> {
    let ns = ing.metadata.namespace.as_deref().unwrap_or("default");
    let name = ing.metadata.name.as_deref().unwrap_or_default();
    let patch = json!({"status": {"loadBalancer": {"ingress": want}}});
    Api::<Ingress>::namespaced(client.clone(), ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Writes the status of every Ingress of our class whose status differs.
/// Returns how many were written.
async fn sync_once(client: &kube::Client, opts: &StatusOptions, publish: &Publish, snap: &Snapshot) -> usize {
    let want = match desired(client, publish).await {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "reading the publish Service failed");
            return 0;
        }
    };
    let mut written = 0;
    for ing in &snap.ingresses {
        if !opts.class.accepts(ing, &snap.classes) || !differs(ing, &want) {
            continue;
        }
        match write(client, ing, &want).await {
            Ok(()) => written += 1,
            Err(e) => tracing::warn!(
                ingress = %crate::snapshot::key(&ing.metadata),
                error = %e,
                "writing Ingress status failed"
            ),
        }
    }
    written
}

/// [`task`] as a task of the current runtime (see
/// [`crate::source::cluster::spawn`] for why the library spawns it).
pub fn spawn(
    client: kube::Client,
    opts: StatusOptions,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    leading: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(task(client, opts, snapshots, leading))
}

/// Runs until the process ends: whenever this replica leads and the
/// snapshot changes (or every `period`), brings status up to date.
pub async fn task(
    client: kube::Client,
    opts: StatusOptions,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    mut leading: watch::Receiver<bool>,
) {
    let Some(publish) = opts.publish.clone() else {
        tracing::info!("no --publish-service or --publish-status-address: Ingress status is not written");
        return;
    };
    loop {
        if *leading.borrow_and_update() {
            let snap = snapshots.borrow_and_update().clone();
            let n = sync_once(&client, &opts, &publish, &snap).await;
            if n > 0 {
                tracing::info!(ingresses = n, "updated Ingress status");
            }
        }
        tokio::select! {
            r = snapshots.changed() => if r.is_err() { return },
            r = leading.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(opts.period) => {}
        }
    }
}

/// `--update-status-on-shutdown`: the leader empties the status of our
/// Ingresses when it stops, unless other replicas of the same Deployment
/// still run (one of them leads next and keeps the address), as
/// ingress-nginx does. Replicas are the Pods with this Pod's labels
/// (`POD_NAME`/`POD_NAMESPACE` from the downward API); without them the
/// controller runs alone.
pub async fn clear_on_shutdown(client: &kube::Client, opts: &StatusOptions, snap: &Snapshot) {
    if others_running(client).await {
        tracing::info!("other replicas run: leaving Ingress status to the next leader");
        return;
    }
    let mut cleared = 0;
    for ing in &snap.ingresses {
        if !opts.class.accepts(ing, &snap.classes) || !differs(ing, &[]) {
            continue;
        }
        match write(client, ing, &[]).await {
            Ok(()) => cleared += 1,
            Err(e) => tracing::warn!(error = %e, "clearing Ingress status failed"),
        }
    }
    tracing::info!(ingresses = cleared, "cleared Ingress status at shutdown");
}

async fn others_running(client: &kube::Client) -> bool {
    let (Ok(name), Ok(ns)) = (std::env::var("POD_NAME"), std::env::var("POD_NAMESPACE")) else {
        return false;
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let Ok(Some(me)) = pods.get_opt(&name).await else {
        return false;
    };
    let labels = me.metadata.labels.unwrap_or_default();
    let selector: Vec<String> = labels
        .iter()
        .filter(|(k, _)| k.starts_with("app.kubernetes.io/"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if selector.is_empty() {
        return false;
    }
    match pods.list(&ListParams::default().labels(&selector.join(","))).await {
        Ok(list) => list.items.iter().any(|p| {
            p.metadata.name.as_deref() != Some(name.as_str())
                && p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        }),
        // Unknown: keep the status rather than blank a live address.
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::{IngressLoadBalancerStatus, IngressStatus};

    fn svc(type_: &str, lb: &[&str], external: &[&str], cluster_ip: &str) -> Service {
        let lb: Vec<serde_json::Value> = lb
            .iter()
            .map(|a| match a.parse::<std::net::IpAddr>() {
                Ok(_) => json!({"ip": a}),
                Err(_) => json!({"hostname": a}),
            })
            .collect();
        let mut spec = json!({"type": type_, "clusterIP": cluster_ip});
        if !external.is_empty() {
            spec["externalIPs"] = json!(external);
        }
        if type_ == "ExternalName" {
            spec["externalName"] = json!("lb.example.com");
        }
        serde_json::from_value(json!({"spec": spec, "status": {"loadBalancer": {"ingress": lb}}})).unwrap()
    }

    fn flat(v: &[IngressLoadBalancerIngress]) -> Vec<String> {
        v.iter()
            .map(|i| i.ip.clone().or_else(|| i.hostname.clone()).unwrap())
            .collect()
    }

    const SVC: Publish = Publish::Addresses(Vec::new());

    fn by_service() -> Publish {
        Publish::Service {
            namespace: "ingress".into(),
            name: "ctl".into(),
        }
    }

    #[test]
    fn a_load_balancer_service_publishes_its_ips_hostnames_and_external_ips() {
        let s = svc(
            "LoadBalancer",
            &["203.0.113.9", "lb.example.net"],
            &["198.51.100.1"],
            "10.0.0.1",
        );
        assert_eq!(
            flat(&addresses(&by_service(), Some(&s))),
            ["198.51.100.1", "203.0.113.9", "lb.example.net"]
        );
        let got = addresses(&by_service(), Some(&s));
        assert_eq!(got[2].hostname.as_deref(), Some("lb.example.net"));
        assert_eq!(got[2].ip, None);
    }

    #[test]
    fn other_service_types_follow_ingress_nginx() {
        assert_eq!(
            flat(&addresses(&by_service(), Some(&svc("ClusterIP", &[], &[], "10.0.0.7")))),
            ["10.0.0.7"]
        );
        assert_eq!(
            flat(&addresses(
                &by_service(),
                Some(&svc("NodePort", &[], &["192.0.2.4"], "10.0.0.7"))
            )),
            ["192.0.2.4"]
        );
        assert_eq!(
            flat(&addresses(&by_service(), Some(&svc("ExternalName", &[], &[], "")))),
            ["lb.example.com"]
        );
        assert!(addresses(&by_service(), Some(&svc("ClusterIP", &[], &[], "None"))).is_empty());
        assert!(addresses(&by_service(), None).is_empty());
        assert!(addresses(&SVC, None).is_empty());
    }

    #[test]
    fn fixed_addresses_are_sorted_and_deduplicated() {
        let p = Publish::Addresses(vec!["b.example".into(), "192.0.2.1".into(), "b.example".into()]);
        assert_eq!(flat(&addresses(&p, None)), ["192.0.2.1", "b.example"]);
    }

    #[test]
    fn only_a_different_set_needs_a_write() {
        let want = addresses(&Publish::Addresses(vec!["192.0.2.1".into(), "a.example".into()]), None);
        let mut ing = Ingress::default();
        assert!(differs(&ing, &want));
        assert!(!differs(&ing, &[]));
        let mut reversed = want.clone();
        reversed.reverse();
        ing.status = Some(IngressStatus {
            load_balancer: Some(IngressLoadBalancerStatus {
                ingress: Some(reversed),
            }),
        });
        assert!(!differs(&ing, &want), "order does not matter");
        assert!(differs(&ing, &want[..1]));
    }
}
