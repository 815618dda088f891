//! Resolving a Service port to the endpoints nginx should use.

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use lua_compat::wire::{Endpoint, Port};

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// How an Ingress names a Service port: by number or by name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortRef {
    Number(i32),
    Name(String),
}

impl PortRef {
    /// The `<port>` part of ingress-nginx's `<ns>-<svc>-<port>` name.
    pub fn suffix(&self) -> String {
        match self {
            PortRef::Number(n) => n.to_string(),
            PortRef::Name(s) => s.clone(),
        }
    }

    pub fn find<'s>(&self, svc: &'s Service) -> Option<&'s ServicePort> {
        let ports = svc.spec.as_ref()?.ports.as_ref()?;
        ports.iter().find(|p| match self {
            PortRef::Number(n) => p.port == *n,
            PortRef::Name(name) => p.name.as_deref() == Some(name),
        })
    }
}

/// The endpoints of `svc`'s port `port`, sorted for stable output.
///
/// - ExternalName Services give one endpoint, the name itself (the module
///   resolves it when the backend is written).
/// - `service_upstream` gives the ClusterIP, as the annotation asks.
/// - Otherwise the ready addresses of the Service's EndpointSlices whose
///   port name matches; a `ready` condition that is absent counts as ready,
///   as the EndpointSlice API specifies.
///
/// `slices` are the EndpointSlices labelled with this Service's name.
pub fn resolve(svc: &Service, port: &ServicePort, slices: &[&EndpointSlice], service_upstream: bool) -> Vec<Endpoint> {
    let spec = svc.spec.as_ref();
    let target_number = match &port.target_port {
        Some(IntOrString::Int(n)) => *n,
        _ => port.port,
    };
    if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
        return spec
            .and_then(|s| s.external_name.clone())
            .map(|name| endpoint(name, target_number))
            .into_iter()
            .collect();
    }
    if service_upstream {
        return spec
            .and_then(|s| s.cluster_ip.clone())
            .filter(|ip| ip != "None" && !ip.is_empty())
            .map(|ip| endpoint(ip, port.port))
            .into_iter()
            .collect();
    }
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref().unwrap_or("");
    let mut out: Vec<Endpoint> = Vec::new();
    for slice in slices {
        let owned = slice.metadata.namespace.as_deref().unwrap_or("default") == ns
            && slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .map(String::as_str)
                == Some(name);
        if !owned {
            continue;
        }
        let slice_port = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or("") == port.name.as_deref().unwrap_or(""));
        let Some(number) = slice_port.and_then(|p| p.port) else {
            continue;
        };
        for ep in slice.endpoints.iter().flatten() {
            if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            for addr in &ep.addresses {
                out.push(endpoint(addr.clone(), number));
            }
        }
    }
    out.sort_by(|a, b| (&a.address, a.port.0).cmp(&(&b.address, b.port.0)));
    out.dedup_by(|a, b| a.address == b.address && a.port.0 == b.port.0);
    out
}

fn endpoint(address: String, port: i32) -> Endpoint {
    Endpoint {
        address,
        port: Port(u16::try_from(port).unwrap_or(0)),
        weight: None,
    }
}
