//! The input of the model builder: every object the controller watches, as
//! one consistent snapshot. Both sources (Kubernetes watchers and the
//! manifest directory) produce exactly this type.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use gateway_api_types::backendtlspolicies::BackendTlsPolicy;
use gateway_api_types::gatewayclasses::GatewayClass;
use gateway_api_types::gateways::Gateway;
use gateway_api_types::grpcroutes::GrpcRoute;
use gateway_api_types::httproutes::HttpRoute;
use gateway_api_types::listenersets::ListenerSet;
use gateway_api_types::referencegrants::ReferenceGrant;
use gateway_api_types::tcproutes::TcpRoute;
use gateway_api_types::tlsroutes::TlsRoute;
use gateway_api_types::udproutes::UdpRoute;
use k8s_openapi::api::certificates::v1beta1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// `(namespace, name)` of a Service.
pub type ServiceKey = (String, String);

/// The label by which an EndpointSlice names its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Objects are shared (`Arc`), not owned: in cluster mode they are the
/// reflector stores' own, so a snapshot costs a vector of pointers, not a
/// second copy of every object (at 10,000 Ingresses, Services and
/// EndpointSlices that copy was tens of megabytes, made again on every
/// change).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub ingresses: Vec<Arc<Ingress>>,
    pub classes: Vec<Arc<IngressClass>>,
    pub services: Vec<Arc<Service>>,
    pub slices: Vec<Arc<EndpointSlice>>,
    pub secrets: Vec<Arc<Secret>>,
    /// The controller's own ConfigMap (`--configmap`), if it exists.
    pub config_map: Option<Arc<ConfigMap>>,
    /// The other ConfigMaps of the controller's namespace: the header sets
    /// its `add-headers` and `proxy-set-headers` name.
    pub header_config_maps: Vec<Arc<ConfigMap>>,
    /// `--tcp-services-configmap`, if set and it exists.
    pub tcp_services: Option<Arc<ConfigMap>>,
    /// `--udp-services-configmap`, if set and it exists.
    pub udp_services: Option<Arc<ConfigMap>>,
    /// Gateway API objects (see [`crate::gateway`]).
    pub gateway_classes: Vec<Arc<GatewayClass>>,
    pub gateways: Vec<Arc<Gateway>>,
    /// ListenerSets: listeners other namespaces add to a Gateway that
    /// allows them (`spec.allowedListeners`).
    pub listener_sets: Vec<Arc<ListenerSet>>,
    pub http_routes: Vec<Arc<HttpRoute>>,
    pub grpc_routes: Vec<Arc<GrpcRoute>>,
    pub tcp_routes: Vec<Arc<TcpRoute>>,
    pub tls_routes: Vec<Arc<TlsRoute>>,
    pub udp_routes: Vec<Arc<UdpRoute>>,
    pub reference_grants: Vec<Arc<ReferenceGrant>>,
    /// Namespaces, for `allowedRoutes.namespaces.selector` (watched with
    /// Gateway API only).
    pub namespaces: Vec<Arc<Namespace>>,
    /// ConfigMaps of every watched namespace that Gateways may name as
    /// client CA bundles (watched with Gateway API only; each keeps only
    /// its `ca.crt`).
    pub ca_bundles: Vec<Arc<ConfigMap>>,
    /// BackendTLSPolicies: TLS from Gateway routes to Service ports.
    pub backend_tls_policies: Vec<Arc<BackendTlsPolicy>>,
    /// ClusterTrustBundles (`certificates.k8s.io/v1beta1`): CA bundles
    /// that Gateways and BackendTLSPolicies may name, cluster-wide (empty
    /// when the cluster does not serve them).
    pub cluster_trust_bundles: Vec<Arc<ClusterTrustBundle>>,
}

/// The key of a CA bundle ConfigMap (Gateway API's and Kubernetes' own
/// `kube-root-ca.crt` convention).
pub const CA_BUNDLE_KEY: &str = "ca.crt";

/// What changed from one snapshot to the next, as far as the model cares.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Only Services and EndpointSlices: these Services' (by name, and by
    /// the slices' `kubernetes.io/service-name`). Only the backends
    /// resolved from them need resolving again.
    Endpoints(BTreeSet<ServiceKey>),
    /// Anything else: build the model in full.
    Other,
}

/// Compares two snapshots by object identity: both sources keep an
/// unchanged object's `Arc` from one snapshot to the next (the reflector
/// stores, the manifest reader's per-file cache), so a pointer comparison
/// per object tells what changed, without comparing contents. An object
/// replaced by an equal copy counts as changed, which costs only work.
pub fn change(old: &Snapshot, new: &Snapshot) -> Change {
    let same_one = |a: &Option<Arc<ConfigMap>>, b: &Option<Arc<ConfigMap>>| match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    };
    let others_same = same_objects(&old.ingresses, &new.ingresses)
        && same_objects(&old.classes, &new.classes)
        && same_objects(&old.secrets, &new.secrets)
        && same_objects(&old.header_config_maps, &new.header_config_maps)
        && same_one(&old.config_map, &new.config_map)
        && same_one(&old.tcp_services, &new.tcp_services)
        && same_one(&old.udp_services, &new.udp_services)
        && same_objects(&old.gateway_classes, &new.gateway_classes)
        && same_objects(&old.gateways, &new.gateways)
        && same_objects(&old.listener_sets, &new.listener_sets)
        && same_objects(&old.http_routes, &new.http_routes)
        && same_objects(&old.grpc_routes, &new.grpc_routes)
        && same_objects(&old.tcp_routes, &new.tcp_routes)
        && same_objects(&old.tls_routes, &new.tls_routes)
        && same_objects(&old.udp_routes, &new.udp_routes)
        && same_objects(&old.reference_grants, &new.reference_grants)
        && same_objects(&old.namespaces, &new.namespaces)
        && same_objects(&old.ca_bundles, &new.ca_bundles)
        && same_objects(&old.backend_tls_policies, &new.backend_tls_policies)
        && same_objects(&old.cluster_trust_bundles, &new.cluster_trust_bundles);
    if !others_same {
        return Change::Other;
    }
    let mut services = BTreeSet::new();
    for svc in changed_objects(&old.services, &new.services) {
        services.insert(service_key(&svc.metadata, svc.metadata.name.as_deref()));
    }
    for slice in changed_objects(&old.slices, &new.slices) {
        let owner = slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL));
        if let Some(owner) = owner {
            services.insert(service_key(&slice.metadata, Some(owner)));
        }
    }
    Change::Endpoints(services)
}

/// Whether `new` differs from `old` in EndpointSlices only, none of them
/// `relevant` (in the old snapshot or the new). Gateway API status depends
/// on no slice of a route's backend (a backend resolves with no ready
/// endpoint, as the spec says), so the status writer has nothing to do for
/// such a change, the most frequent one in a busy cluster; the slices it
/// keeps for the Gateways' own Services are the relevant ones.
pub fn only_slices_changed(old: &Snapshot, new: &Snapshot, relevant: impl Fn(&EndpointSlice) -> bool) -> bool {
    matches!(change(old, new), Change::Endpoints(_))
        && same_objects(&old.services, &new.services)
        && !changed_objects(&old.slices, &new.slices)
            .into_iter()
            .any(|s| relevant(s))
}

fn service_key(meta: &ObjectMeta, name: Option<&str>) -> ServiceKey {
    (
        meta.namespace.as_deref().unwrap_or("default").to_string(),
        name.unwrap_or_default().to_string(),
    )
}

/// Whether both hold exactly the same objects (in any order).
fn same_objects<K>(a: &[Arc<K>], b: &[Arc<K>]) -> bool {
    a.len() == b.len() && changed_objects(a, b).is_empty()
}

/// The objects in one of `a` and `b` but not the other (by identity).
/// Both sources keep their objects in a stable order (file order; a
/// store's map, where an update keeps its place), so comparing position
/// by position usually leaves only the few that changed to compare as
/// sets, without hashing every object. When many positions differ
/// (objects came or went), all are compared as sets.
fn changed_objects<'a, K>(a: &'a [Arc<K>], b: &'a [Arc<K>]) -> Vec<&'a Arc<K>> {
    const FEW: usize = 64;
    let (mut from_a, mut from_b) = (Vec::new(), Vec::new());
    if a.len() == b.len() {
        for (x, y) in a.iter().zip(b) {
            if !Arc::ptr_eq(x, y) {
                from_a.push(x);
                from_b.push(y);
                if from_a.len() > FEW {
                    break;
                }
            }
        }
    }
    let (a, b): (Vec<&Arc<K>>, Vec<&Arc<K>>) = if a.len() == b.len() && from_a.len() <= FEW {
        (from_a, from_b)
    } else {
        (a.iter().collect(), b.iter().collect())
    };
    let in_a: HashSet<*const K> = a.iter().map(|x| Arc::as_ptr(x)).collect();
    let in_b: HashSet<*const K> = b.iter().map(|x| Arc::as_ptr(x)).collect();
    let gone = a.iter().filter(|x| !in_b.contains(&Arc::as_ptr(x)));
    let came = b.iter().filter(|x| !in_a.contains(&Arc::as_ptr(x)));
    gone.chain(came).copied().collect()
}

/// The ConfigMaps a source picks out by `namespace/name`: the controller's
/// own (`--configmap`) and the layer-4 ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigMapRefs {
    pub config_map: (String, String),
    pub tcp_services: Option<(String, String)>,
    pub udp_services: Option<(String, String)>,
}

impl From<(String, String)> for ConfigMapRefs {
    fn from(config_map: (String, String)) -> Self {
        ConfigMapRefs {
            config_map,
            ..Default::default()
        }
    }
}

/// `namespace/name` of any object, for logs and conflict reports.
pub fn key(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(ns: &str, name: &str) -> Arc<Service> {
        Arc::new(serde_json::from_value(serde_json::json!({"metadata": {"namespace": ns, "name": name}})).unwrap())
    }

    fn slice(ns: &str, name: &str, owner: &str) -> Arc<EndpointSlice> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": owner}},
                "addressType": "IPv4", "endpoints": []
            }))
            .unwrap(),
        )
    }

    fn keys(v: &[(&str, &str)]) -> Change {
        Change::Endpoints(v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    }

    #[test]
    fn only_a_slice_change_leaves_gateway_status_alone() {
        let (a, sa) = (service("team-a", "web"), slice("team-a", "web-1", "web"));
        let old = Snapshot {
            services: vec![a.clone()],
            slices: vec![sa.clone()],
            ..Default::default()
        };
        let same = Snapshot {
            services: vec![a.clone()],
            slices: vec![sa.clone()],
            ..Default::default()
        };
        let none = |_: &EndpointSlice| false;
        assert!(only_slices_changed(&old, &same, none));
        let new_slice = Snapshot {
            services: vec![a.clone()],
            slices: vec![slice("team-a", "web-1", "web")],
            ..Default::default()
        };
        assert!(only_slices_changed(&old, &new_slice, none));
        // ... unless the slice is one the caller cares about.
        let web_1 = |s: &EndpointSlice| s.metadata.name.as_deref() == Some("web-1");
        assert!(!only_slices_changed(&old, &new_slice, web_1));
        // A Service edited (its ports decide a route's ResolvedRefs).
        let new_service = Snapshot {
            services: vec![service("team-a", "web")],
            slices: vec![sa.clone()],
            ..Default::default()
        };
        assert!(!only_slices_changed(&old, &new_service, none));
        let route: Arc<HttpRoute> = Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "team-a", "name": "r"}, "spec": {}
            }))
            .unwrap(),
        );
        let new_route = Snapshot {
            services: vec![a],
            slices: vec![sa],
            http_routes: vec![route],
            ..Default::default()
        };
        assert!(!only_slices_changed(&old, &new_route, none));
    }

    #[test]
    fn endpoint_changes_name_their_services() {
        let (a, b) = (service("team-a", "web"), service("team-b", "api"));
        let (sa, sb) = (slice("team-a", "web-1", "web"), slice("team-b", "api-1", "api"));
        let old = Snapshot {
            services: vec![a.clone(), b.clone()],
            slices: vec![sa.clone(), sb.clone()],
            ..Default::default()
        };
        // The same objects, in another order: nothing changed.
        let same = Snapshot {
            services: vec![b.clone(), a.clone()],
            slices: vec![sb.clone(), sa.clone()],
            ..Default::default()
        };
        assert_eq!(change(&old, &same), keys(&[]));
        // A slice replaced: its Service's backends only.
        let moved = Snapshot {
            slices: vec![slice("team-a", "web-1", "web"), sb.clone()],
            ..same.clone()
        };
        assert_eq!(change(&old, &moved), keys(&[("team-a", "web")]));
        // A Service removed, a slice added.
        let grown = Snapshot {
            services: vec![a.clone()],
            slices: vec![sa.clone(), sb.clone(), slice("team-c", "db-1", "db")],
            ..Default::default()
        };
        assert_eq!(change(&old, &grown), keys(&[("team-b", "api"), ("team-c", "db")]));
    }

    #[test]
    fn anything_else_is_a_full_change() {
        let old = Snapshot::default();
        let ing: Arc<Ingress> =
            Arc::new(serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap());
        let new = Snapshot {
            ingresses: vec![ing.clone()],
            ..Default::default()
        };
        assert_eq!(change(&old, &new), Change::Other);
        // The same Ingress, a copy of it: a change (identity, not content).
        let copy = Snapshot {
            ingresses: vec![Arc::new((*ing).clone())],
            ..Default::default()
        };
        assert_eq!(change(&new, &copy), Change::Other);
        let cm: Arc<ConfigMap> = Arc::new(Default::default());
        let with_cm = Snapshot {
            config_map: Some(cm),
            ..Default::default()
        };
        assert_eq!(change(&old, &with_cm), Change::Other);
    }
}
