//! One Service per Gateway, in the Gateway's namespace: its address.
//!
//! The Gateway API gives each Gateway its own address (`status.addresses`),
//! and two Gateways may both listen on port 80 and route `/` differently
//! (the core conformance test `HTTPRouteMultipleGateways`). One nginx
//! serves them all, so each Gateway port gets an nginx port of its own
//! (`--gateway-base-port`) and each Gateway a Service of its own that maps
//! its ports onto those nginx ports.
//!
//! The Service lives beside its Gateway (the spec's "infrastructure" of a
//! Gateway, `GatewayInfrastructure`): its owner can see it, the Gateway's
//! `spec.infrastructure` labels and annotations (a load balancer's
//! settings) land in the Gateway owner's namespace rather than the
//! controller's, and it is owned by the Gateway, so the garbage collector
//! deletes it with the Gateway. A Service selects Pods of its own
//! namespace only, so it has no selector: this controller writes its
//! EndpointSlice, one endpoint per nginx Pod (`--gateway-service-selector`
//! in the controller's namespace), as the EndpointSlice controller would.
//!
//! Pure: what the Services and EndpointSlices should be, and what address
//! a Service gives. [`crate::gateway_services`] applies them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use super::addresses::Infrastructure;
use super::translate::{GatewayServer, ServerProtocol};

/// Marks the Services this controller keeps for Gateways.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "dynamic-balancer-gateway");
/// The Gateway's name (the label the Gateway API reserves for the
/// resources of a Gateway's infrastructure), when it fits a label value.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// `namespace/name` of the Gateway (any length, unlike a label).
pub const GATEWAY_ANNOTATION: &str = "dynamic-balancer.dev/gateway";
/// The controller instance the Service belongs to (the value of
/// `--gateway-controller-name`, hashed to fit a label value), so two
/// controllers in one namespace never delete each other's Services.
pub const OWNER_LABEL: &str = "dynamic-balancer.dev/gateway-owner";

/// The label that says which controller keeps an EndpointSlice.
pub const SLICE_MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// `endpointslice.kubernetes.io/managed-by` of the EndpointSlices this
/// controller writes (the EndpointSlice controller leaves them alone).
pub const SLICE_MANAGER: &str = "gateway-services.dynamic-balancer.dev";

/// Whether `slice` is one of the Gateways' own (any controller instance's:
/// a change to it matters to whichever keeps it).
pub fn is_gateway_slice(slice: &EndpointSlice) -> bool {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SLICE_MANAGED_BY_LABEL))
        .is_some_and(|m| m == SLICE_MANAGER)
}

/// How the Services are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceOptions {
    /// The controller's namespace (where the nginx Pods run).
    pub namespace: String,
    /// `--watch-namespace`: the only namespace whose Gateways are served
    /// (and so the only one where their Services are kept); `None`: all.
    pub watch_namespace: Option<String>,
    /// Labels of the Pods that run nginx (`--gateway-service-selector`).
    pub selector: BTreeMap<String, String>,
    /// `ClusterIP` or `LoadBalancer`.
    pub type_: ServiceType,
    /// `--gateway-controller-name`.
    pub controller_name: String,
}

impl ServiceOptions {
    /// The label selector (`key=value,...`) of the nginx Pods.
    pub fn pod_selector(&self) -> String {
        self.selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServiceType {
    /// The Gateway's address is the Service's cluster IP (reachable inside
    /// the cluster, and from nodes).
    #[value(name = "ClusterIP")]
    ClusterIP,
    /// The Gateway's address is what the load balancer assigns; until
    /// then the Gateway is not Programmed (`AddressNotAssigned`).
    #[value(name = "LoadBalancer")]
    LoadBalancer,
}

impl ServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::ClusterIP => "ClusterIP",
            ServiceType::LoadBalancer => "LoadBalancer",
        }
    }
}

fn short_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest[..5].iter().map(|b| format!("{b:02x}")).collect()
}

/// The Service's name: `gw-`, as much of the Gateway's name as fits, and a
/// hash of `namespace/name` (Gateways of one name in two namespaces get
/// two Services). Always a DNS-1035 label of at most 63 characters.
pub fn service_name(gateway: &str) -> String {
    let name = gateway.rsplit('/').next().unwrap_or(gateway);
    let mut stem: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(63 - 3 - 1 - 10)
        .collect();
    while stem.ends_with('-') {
        stem.pop();
    }
    if stem.is_empty() {
        format!("gw-{}", short_hash(gateway))
    } else {
        format!("gw-{stem}-{}", short_hash(gateway))
    }
}

/// The owner label's value for `controller_name`.
pub fn owner_value(controller_name: &str) -> String {
    short_hash(controller_name)
}

/// A label selector string for the Services of `controller_name`.
pub fn list_selector(controller_name: &str) -> String {
    format!(
        "{}={},{}={}",
        MANAGED_BY.0,
        MANAGED_BY.1,
        OWNER_LABEL,
        owner_value(controller_name)
    )
}

/// The Services the Gateways' servers need, by `namespace/name`.
/// `owners`: each Gateway's uid, by `namespace/name` (a Gateway without
/// one yet gets its Service on a later round). `infra`: what Gateways ask of their Service, by `namespace/name`
/// ([`super::addresses::by_gateway`]): static addresses (the cluster
/// IP(s) of a `ClusterIP` Service, the load balancer IP of a
/// `LoadBalancer` one) and `spec.infrastructure`'s labels and annotations
/// (a load balancer's settings, say), under this controller's own, which
/// win.
pub fn desired(
    servers: &[GatewayServer],
    opts: &ServiceOptions,
    infra: &BTreeMap<String, Infrastructure>,
    owners: &BTreeMap<String, String>,
) -> BTreeMap<String, Service> {
    let mut ports: BTreeMap<&str, Vec<&GatewayServer>> = BTreeMap::new();
    for s in servers {
        ports.entry(s.gateway.as_str()).or_default().push(s);
    }
    let mut out = BTreeMap::new();
    for (gateway, servers) in ports {
        let Some(uid) = owners.get(gateway) else { continue };
        let name = service_name(gateway);
        let (gw_namespace, gw_name) = gateway.split_once('/').unwrap_or(("default", gateway));
        let asked = infra.get(gateway);
        let mut labels = asked.map(|i| i.labels.clone()).unwrap_or_default();
        labels.extend([
            (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
            (OWNER_LABEL.to_string(), owner_value(&opts.controller_name)),
        ]);
        let mut annotations = asked.map(|i| i.annotations.clone()).unwrap_or_default();
        annotations.insert(GATEWAY_ANNOTATION.to_string(), gateway.to_string());
        if gw_name.len() <= 63 {
            labels.insert(GATEWAY_NAME_LABEL.to_string(), gw_name.to_string());
        }
        let mut service_ports: Vec<ServicePort> = servers
            .iter()
            .map(|s| ServicePort {
                // A UDP port may share its number with a TCP one; names must differ.
                name: Some(match s.protocol {
                    ServerProtocol::Udp => format!("udp-{}", s.port),
                    _ => format!("port-{}", s.port),
                }),
                protocol: Some(
                    if s.protocol == ServerProtocol::Udp {
                        "UDP"
                    } else {
                        "TCP"
                    }
                    .into(),
                ),
                port: i32::from(s.port),
                target_port: Some(IntOrString::Int(i32::from(s.nginx_port))),
                ..ServicePort::default()
            })
            .collect();
        service_ports.sort_by_key(|p| p.port);
        let service = Service {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(gw_namespace.to_string()),
                labels: Some(labels),
                annotations: Some(annotations),
                owner_references: Some(vec![OwnerReference {
                    api_version: "gateway.networking.k8s.io/v1".into(),
                    kind: "Gateway".into(),
                    name: gw_name.to_string(),
                    uid: uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(opts.type_.as_str().into()),
                // No selector: the EndpointSlice below names the nginx
                // Pods, which live in another namespace.
                selector: None,
                ports: Some(service_ports),
                ..static_address(opts.type_, asked.map(|i| &i.addresses))
            }),
            status: None,
        };
        out.insert(format!("{gw_namespace}/{name}"), service);
    }
    out
}

/// Whether `pod` serves: its Ready condition (readiness gates included),
/// whether or not it is being deleted; the EndpointSlice controller's
/// `serving`. A terminating Pod serves while nginx drains.
fn pod_serving(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `pod` has ended (its IP may already be another Pod's).
fn pod_ended(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The EndpointSlices of `service` (as the cluster holds it: it needs its
/// uid): one per IP family the `pods` have, each endpoint an nginx Pod
/// with its readiness, each port the Service port's nginx port under the
/// Service port's name (how kube-proxy pairs them). Pods without an
/// address yet are left out; a family without Pods gets no slice.
pub fn endpoint_slices(service: &Service, pods: &[Pod]) -> Vec<EndpointSlice> {
    let (Some(name), Some(namespace), Some(uid)) = (
        service.metadata.name.as_ref(),
        service.metadata.namespace.as_ref(),
        service.metadata.uid.as_ref(),
    ) else {
        return Vec::new();
    };
    let ports: Vec<EndpointPort> = service
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .filter_map(|p| match &p.target_port {
            Some(IntOrString::Int(n)) => Some(EndpointPort {
                name: p.name.clone(),
                port: Some(*n),
                protocol: p.protocol.clone(),
                app_protocol: None,
            }),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for (family, v6) in [("IPv4", false), ("IPv6", true)] {
        let mut endpoints: Vec<Endpoint> = pods
            .iter()
            .filter(|pod| !pod_ended(pod))
            .filter_map(|pod| {
                let status = pod.status.as_ref()?;
                let ip = status
                    .pod_ips
                    .iter()
                    .flatten()
                    .map(|a| a.ip.as_str())
                    .chain(status.pod_ip.as_deref())
                    .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
                    .find(|a| a.is_ipv6() == v6)?;
                let serving = pod_serving(pod);
                let terminating = pod.metadata.deletion_timestamp.is_some();
                Some(Endpoint {
                    addresses: vec![ip.to_string()],
                    conditions: Some(EndpointConditions {
                        ready: Some(serving && !terminating),
                        serving: Some(serving),
                        terminating: Some(terminating),
                    }),
                    node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                    target_ref: Some(ObjectReference {
                        kind: Some("Pod".into()),
                        namespace: pod.metadata.namespace.clone(),
                        name: pod.metadata.name.clone(),
                        uid: pod.metadata.uid.clone(),
                        ..ObjectReference::default()
                    }),
                    ..Endpoint::default()
                })
            })
            .collect();
        if endpoints.is_empty() {
            continue;
        }
        endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
        let slice_name = if v6 { format!("{name}-ipv6") } else { name.clone() };
        out.push(EndpointSlice {
            metadata: ObjectMeta {
                name: Some(slice_name),
                namespace: Some(namespace.clone()),
                labels: Some(slice_labels(service)),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Service".into(),
                    name: name.clone(),
                    uid: uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            address_type: family.to_string(),
            endpoints: Some(endpoints),
            ports: Some(ports.clone()),
        });
    }
    out
}

/// An EndpointSlice's labels: the Service it serves, that we manage it,
/// and (copied from the Service) which controller instance owns it.
fn slice_labels(service: &Service) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (
            "kubernetes.io/service-name".to_string(),
            service.metadata.name.clone().unwrap_or_default(),
        ),
        (SLICE_MANAGED_BY_LABEL.to_string(), SLICE_MANAGER.to_string()),
    ]);
    if let Some(owner) = service.metadata.labels.as_ref().and_then(|l| l.get(OWNER_LABEL)) {
        labels.insert(OWNER_LABEL.to_string(), owner.clone());
    }
    labels
}

/// A label selector string for the EndpointSlices of `controller_name`.
pub fn slice_list_selector(controller_name: &str) -> String {
    format!(
        "{SLICE_MANAGED_BY_LABEL}={SLICE_MANAGER},{OWNER_LABEL}={}",
        owner_value(controller_name)
    )
}

/// The part of a Service's spec that gives it the addresses its Gateway
/// asks for (nothing when it asks for none). Two addresses are one per IP
/// family (the cluster refuses anything else, and the Gateway then says
/// `AddressNotUsable`).
fn static_address(type_: ServiceType, requested: Option<&Vec<String>>) -> ServiceSpec {
    let Some(ips) = requested.filter(|ips| !ips.is_empty()) else {
        return ServiceSpec::default();
    };
    match type_ {
        ServiceType::ClusterIP => ServiceSpec {
            cluster_ip: Some(ips[0].clone()),
            cluster_ips: Some(ips.clone()),
            ip_family_policy: (ips.len() > 1).then(|| "RequireDualStack".to_string()),
            ..ServiceSpec::default()
        },
        ServiceType::LoadBalancer => ServiceSpec {
            load_balancer_ip: Some(ips[0].clone()),
            ..ServiceSpec::default()
        },
    }
}

/// Every family's cluster IP a Service has or asks for (`clusterIPs`, a
/// dual-stack Service's two; else `clusterIP`); `None` for none.
pub fn cluster_ips(service: &Service) -> Option<Vec<String>> {
    let spec = service.spec.as_ref()?;
    spec.cluster_ips
        .clone()
        .filter(|ips| !ips.is_empty())
        .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
}

/// The addresses a Gateway's Service gives it, or `None` while it has
/// none yet (a LoadBalancer without an ingress entry).
pub fn addresses(service: &Service, type_: ServiceType) -> Option<Vec<String>> {
    let found: Vec<String> = match type_ {
        ServiceType::ClusterIP => cluster_ips(service)
            .unwrap_or_default()
            .into_iter()
            .filter(|ip| !ip.is_empty() && ip != "None")
            .collect(),
        ServiceType::LoadBalancer => service
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .map(|ingress| {
                ingress
                    .iter()
                    .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
                    .collect()
            })
            .unwrap_or_default(),
    };
    (!found.is_empty()).then_some(found)
}

/// Parses `key=value,key=value` (`--gateway-service-selector`).
pub fn parse_selector(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not key=value"))?;
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() || k.len() > 317 || v.len() > 63 {
            return Err(format!("{part:?} is not a label"));
        }
        let ok = |s: &str| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        };
        if !ok(k) || !ok(v) || v.contains('/') {
            return Err(format!("{part:?} is not a label"));
        }
        out.insert(k.to_string(), v.to_string());
    }
    if out.is_empty() {
        return Err("an empty selector would select every Pod of the namespace".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uids() -> BTreeMap<String, String> {
        ["infra/a", "infra/b", "infra/dns"]
            .iter()
            .map(|g| (g.to_string(), format!("uid-{g}")))
            .collect()
    }

    fn key(gateway: &str) -> String {
        let (ns, _) = gateway.split_once('/').unwrap();
        format!("{ns}/{}", service_name(gateway))
    }

    fn server(gateway: &str, port: u16, nginx_port: u16) -> GatewayServer {
        GatewayServer {
            name: format!("{gateway}/{port}"),
            nginx_port,
            gateway: gateway.into(),
            port,
            ssl: false,
            protocol: ServerProtocol::Http,
        }
    }

    fn opts() -> ServiceOptions {
        ServiceOptions {
            namespace: "ingress".into(),
            watch_namespace: None,
            selector: BTreeMap::from([("app".into(), "ctl".into())]),
            type_: ServiceType::ClusterIP,
            controller_name: "dynamic-balancer.dev/gateway-controller".into(),
        }
    }

    #[test]
    fn a_udp_port_may_share_its_number_with_a_tcp_port() {
        let mut udp = server("infra/dns", 53, 18001);
        udp.protocol = ServerProtocol::Udp;
        let want = desired(
            &[server("infra/dns", 53, 18000), udp],
            &opts(),
            &BTreeMap::new(),
            &uids(),
        );
        let ports = want
            .values()
            .next()
            .unwrap()
            .spec
            .as_ref()
            .unwrap()
            .ports
            .clone()
            .unwrap();
        let got: Vec<_> = ports
            .iter()
            .map(|p| (p.name.clone().unwrap(), p.protocol.clone().unwrap(), p.port))
            .collect();
        assert_eq!(
            got,
            [
                ("port-53".into(), "TCP".into(), 53),
                ("udp-53".into(), "UDP".into(), 53)
            ]
        );
    }

    #[test]
    fn names_are_dns_labels_and_distinct_per_namespace() {
        let a = service_name("infra/same-namespace");
        let b = service_name("other/same-namespace");
        assert_ne!(a, b);
        assert!(a.starts_with("gw-same-namespace-"), "{a}");
        let long = service_name(&format!("ns/{}", "a.b".repeat(80)));
        assert!(long.len() <= 63, "{long}");
        for n in [a, b, long, service_name("ns/-.-")] {
            assert!(n.len() <= 63);
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{n}"
            );
            assert!(
                n.starts_with(|c: char| c.is_ascii_lowercase()) && !n.ends_with('-'),
                "{n}"
            );
        }
    }

    #[test]
    fn one_service_per_gateway_with_its_ports_mapped() {
        let servers = [
            server("infra/a", 80, 20000),
            server("infra/a", 8080, 20001),
            server("infra/b", 80, 20002),
        ];
        let want = desired(&servers, &opts(), &BTreeMap::new(), &uids());
        assert_eq!(want.len(), 2);
        let a = &want[&key("infra/a")];
        let ports = a.spec.as_ref().unwrap().ports.as_ref().unwrap();
        assert_eq!(ports.len(), 2);
        assert_eq!(
            (ports[0].port, ports[0].target_port.clone()),
            (80, Some(IntOrString::Int(20000)))
        );
        assert_eq!(ports[1].port, 8080);
        let labels = a.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[GATEWAY_NAME_LABEL], "a");
        assert_eq!(a.metadata.annotations.as_ref().unwrap()[GATEWAY_ANNOTATION], "infra/a");
        assert_eq!(a.metadata.namespace.as_deref(), Some("infra"), "beside its Gateway");
        let owner = &a.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Gateway", "a", "uid-infra/a")
        );
        assert_eq!(a.spec.as_ref().unwrap().selector, None);
        let unknown = desired(&[server("infra/new", 80, 20003)], &opts(), &BTreeMap::new(), &uids());
        assert!(unknown.is_empty(), "no uid yet: no Service yet");
    }

    #[test]
    fn a_static_address_becomes_the_cluster_ip_or_the_load_balancer_ip() {
        let asks = |addresses: &[&str]| Infrastructure {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            ..Infrastructure::default()
        };
        let requested = BTreeMap::from([("infra/a".to_string(), asks(&["10.96.0.50"]))]);
        let servers = [server("infra/a", 80, 20000), server("infra/b", 80, 20001)];
        let want = desired(&servers, &opts(), &requested, &uids());
        let a = want[&key("infra/a")].spec.clone().unwrap();
        assert_eq!(a.cluster_ip.as_deref(), Some("10.96.0.50"));
        assert_eq!(a.cluster_ips, Some(vec!["10.96.0.50".to_string()]));
        assert_eq!(a.ip_family_policy, None);
        assert_eq!(want[&key("infra/b")].spec.as_ref().unwrap().cluster_ip, None);
        let lb = ServiceOptions {
            type_: ServiceType::LoadBalancer,
            ..opts()
        };
        let a = desired(&servers, &lb, &requested, &uids())[&key("infra/a")]
            .spec
            .clone()
            .unwrap();
        assert_eq!(
            (a.cluster_ip, a.load_balancer_ip.as_deref()),
            (None, Some("10.96.0.50"))
        );
        let dual = BTreeMap::from([("infra/a".to_string(), asks(&["10.96.0.50", "fd00::50"]))]);
        let a = desired(&servers, &opts(), &dual, &uids())[&key("infra/a")]
            .spec
            .clone()
            .unwrap();
        assert_eq!(a.ip_family_policy.as_deref(), Some("RequireDualStack"));
    }

    #[test]
    fn infrastructure_labels_and_annotations_go_under_ours() {
        let infra = BTreeMap::from([(
            "infra/a".to_string(),
            Infrastructure {
                labels: BTreeMap::from([
                    ("team".to_string(), "a".to_string()),
                    (MANAGED_BY.0.to_string(), "someone-else".to_string()),
                ]),
                annotations: BTreeMap::from([
                    ("lb.example.com/internal".to_string(), "true".to_string()),
                    (GATEWAY_ANNOTATION.to_string(), "other/gw".to_string()),
                ]),
                ..Infrastructure::default()
            },
        )]);
        let svc = &desired(&[server("infra/a", 80, 20000)], &opts(), &infra, &uids())[&key("infra/a")];
        let labels = svc.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "a");
        assert_eq!(labels[MANAGED_BY.0], MANAGED_BY.1, "ours win");
        let annotations = svc.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["lb.example.com/internal"], "true");
        assert_eq!(annotations[GATEWAY_ANNOTATION], "infra/a", "ours win");
    }

    #[test]
    fn addresses_wait_for_the_load_balancer() {
        let mut svc = desired(&[server("infra/a", 80, 20000)], &opts(), &BTreeMap::new(), &uids())
            .into_values()
            .next()
            .unwrap();
        assert_eq!(addresses(&svc, ServiceType::ClusterIP), None);
        svc.spec.as_mut().unwrap().cluster_ip = Some("10.0.0.7".into());
        assert_eq!(addresses(&svc, ServiceType::ClusterIP), Some(vec!["10.0.0.7".into()]));
        assert_eq!(addresses(&svc, ServiceType::LoadBalancer), None);
        svc.spec.as_mut().unwrap().cluster_ips = Some(vec!["10.0.0.7".into(), "fd00::7".into()]);
        assert_eq!(
            addresses(&svc, ServiceType::ClusterIP),
            Some(vec!["10.0.0.7".into(), "fd00::7".into()]),
            "both families"
        );
    }

    fn pod(name: &str, ips: &[&str], ready: bool, deleting: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ingress", "name": name, "uid": format!("uid-{name}"),
                         "deletionTimestamp": deleting.then_some("2026-11-28T00:00:00Z")},
            "spec": {"nodeName": "node-1", "containers": []},
            "status": {"podIP": ips.first(), "podIPs": ips.iter().map(|ip| serde_json::json!({"ip": ip})).collect::<Vec<_>>(),
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                       "containerStatuses": [{"name": "c", "ready": ready, "restartCount": 0, "image": "i", "imageID": ""}]}
        }))
        .unwrap()
    }

    #[test]
    fn endpoint_slices_name_the_nginx_pods_per_family_under_the_service_port_names() {
        let mut udp = server("infra/a", 53, 20001);
        udp.protocol = ServerProtocol::Udp;
        let mut svc = desired(&[server("infra/a", 80, 20000), udp], &opts(), &BTreeMap::new(), &uids())
            .remove(&key("infra/a"))
            .unwrap();
        assert!(
            endpoint_slices(&svc, &[]).is_empty(),
            "no uid: the Service is not made yet"
        );
        svc.metadata.uid = Some("svc-uid".into());
        let pods = [
            pod("nginx-b", &["10.1.0.9", "fd00::9"], true, false),
            pod("nginx-a", &["10.1.0.2"], false, false),
            pod("nginx-old", &["10.1.0.5"], true, true),
            pod("pending", &[], false, false),
            {
                let mut ended = pod("ended", &["10.1.0.7"], false, false);
                ended.status.as_mut().unwrap().phase = Some("Failed".into());
                ended
            },
        ];
        let slices = endpoint_slices(&svc, &pods);
        assert_eq!(slices.len(), 2, "one per family");
        let v4 = &slices[0];
        assert_eq!(v4.address_type, "IPv4");
        assert_eq!(v4.metadata.name, svc.metadata.name);
        assert_eq!(v4.metadata.namespace.as_deref(), Some("infra"));
        let labels = v4.metadata.labels.as_ref().unwrap();
        assert_eq!(
            labels["kubernetes.io/service-name"],
            *svc.metadata.name.as_ref().unwrap()
        );
        assert_eq!(labels["endpointslice.kubernetes.io/managed-by"], SLICE_MANAGER);
        assert!(is_gateway_slice(v4));
        assert!(!is_gateway_slice(&EndpointSlice::default()));
        for value in labels.values().chain(svc.metadata.labels.as_ref().unwrap().values()) {
            // The apiserver's rule for label values (selectors refuse others).
            let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            assert!(
                value.len() <= 63
                    && value.chars().all(inner)
                    && value.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && value.ends_with(|c: char| c.is_ascii_alphanumeric()),
                "{value:?} is a label value"
            );
        }
        assert_eq!(labels[OWNER_LABEL], owner_value(&opts().controller_name));
        assert_eq!(v4.metadata.owner_references.as_ref().unwrap()[0].uid, "svc-uid");
        let got: Vec<_> = v4
            .endpoints
            .iter()
            .flatten()
            .map(|e| {
                let c = e.conditions.as_ref().unwrap();
                (
                    e.addresses[0].as_str(),
                    c.ready.unwrap(),
                    c.serving.unwrap(),
                    c.terminating.unwrap(),
                    e.target_ref.as_ref().unwrap().name.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("10.1.0.2", false, false, false, "nginx-a"),
                ("10.1.0.5", false, true, true, "nginx-old"),
                ("10.1.0.9", true, true, false, "nginx-b"),
            ]
        );
        let ports: Vec<_> = v4
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap(), p.port.unwrap(), p.protocol.clone().unwrap()))
            .collect();
        assert_eq!(
            ports,
            [
                ("udp-53".to_string(), 20001, "UDP".to_string()),
                ("port-80".to_string(), 20000, "TCP".to_string())
            ]
        );
        assert_eq!(slices[1].address_type, "IPv6");
        assert!(slices[1].metadata.name.as_ref().unwrap().ends_with("-ipv6"));
        let v6 = slices[1].endpoints.as_ref().unwrap();
        assert_eq!(v6.len(), 1);
        assert_eq!(v6[0].addresses, ["fd00::9"]);
    }

    #[test]
    fn selectors_are_labels() {
        assert_eq!(
            parse_selector("app.kubernetes.io/name=x, app.kubernetes.io/component=controller")
                .unwrap()
                .len(),
            2
        );
        assert!(parse_selector("").is_err());
        assert!(parse_selector("a").is_err());
        assert!(parse_selector("a=b c").is_err());
        assert!(parse_selector("a=b/c").is_err());
    }
}
