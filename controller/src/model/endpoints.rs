//! Resolving a Service port to the endpoints nginx should use, refusing the
//! addresses no tenant may point nginx at (see [`AddressPolicy`]).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use lua_compat::wire::{Endpoint, Port};

pub use crate::snapshot::SERVICE_NAME_LABEL;

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

/// Which endpoint addresses are accepted. Loopback, link-local and
/// this-host addresses ([`lua_compat::address::forbidden`]) reach the node
/// itself: the module's API, the controller's metrics, the kubelet, a cloud
/// metadata service. Whoever can create a Service (an `ExternalName`) or an
/// EndpointSlice must not get the public port proxied there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// `--allow-local-endpoints`: accept local EndpointSlice addresses, for
    /// a manifest directory whose upstreams run on the same host. An
    /// `ExternalName` of the local host stays refused.
    pub allow_local: bool,
    /// Ports that even then may not be named on the local host: the
    /// module's API, the controller's metrics, nginx's own listeners.
    pub reserved_ports: Vec<u16>,
}

impl AddressPolicy {
    /// Why an EndpointSlice (or ClusterIP) address is refused.
    pub fn refuses(&self, ip: IpAddr, port: u16) -> Option<String> {
        let why = lua_compat::address::forbidden(ip)?;
        if !self.allow_local {
            return Some(format!("{ip} is {why}"));
        }
        self.reserved_ports
            .contains(&port)
            .then(|| format!("{ip}:{port} is {why} on a port of the controller or nginx itself"))
    }
}

/// The endpoints of a Service port, and the addresses refused.
#[derive(Debug, Default)]
pub struct Resolved {
    pub endpoints: Vec<Endpoint>,
    pub refused: Vec<String>,
}

/// Why an `ExternalName` is refused: the local host in any spelling, or a
/// "name" that `getaddrinfo` would read as an address.
pub fn refuse_external_name(name: &str) -> Option<String> {
    if let Some(why) = lua_compat::address::forbidden_external_name(name) {
        return Some(format!("externalName {name:?} is {why}"));
    }
    if name.parse::<IpAddr>().is_err() && lua_compat::address::is_numeric_address(name) {
        return Some(format!(
            "externalName {name:?} is an IPv4 address in disguise (inet_aton form)"
        ));
    }
    None
}

/// The endpoints of `svc`'s port `port`, sorted for stable output.
///
/// - ExternalName Services give one endpoint, the name itself (the module
///   resolves it, and refuses local addresses it resolves to).
/// - `service_upstream` gives the ClusterIP, as the annotation asks.
/// - Otherwise the ready addresses of the Service's EndpointSlices whose
///   port name matches; a `ready` condition that is absent counts as ready,
///   as the EndpointSlice API specifies. FQDN slices are not supported.
///
/// `slices` are the EndpointSlices labelled with this Service's name.
pub fn resolve(
    svc: &Service,
    port: &ServicePort,
    slices: &[&EndpointSlice],
    service_upstream: bool,
    policy: &AddressPolicy,
) -> Resolved {
    let spec = svc.spec.as_ref();
    let mut out = Resolved::default();
    let target_number = match &port.target_port {
        Some(IntOrString::Int(n)) => *n,
        _ => port.port,
    };
    if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
        let Some(name) = spec.and_then(|s| s.external_name.clone()) else {
            return out;
        };
        match refuse_external_name(&name) {
            Some(why) => out.refused.push(why),
            None => out.endpoints.push(endpoint(name, target_number)),
        }
        return out;
    }
    let accept = |out: &mut Resolved, address: &str, port: i32| match address.parse::<IpAddr>() {
        Err(_) => out.refused.push(format!("{address:?} is not an IP address")),
        Ok(ip) => match policy.refuses(ip, u16::try_from(port).unwrap_or(0)) {
            Some(why) => out.refused.push(why),
            None => out.endpoints.push(endpoint(ip.to_string(), port)),
        },
    };
    if service_upstream {
        if let Some(ip) = spec
            .and_then(|s| s.cluster_ip.clone())
            .filter(|ip| ip != "None" && !ip.is_empty())
        {
            accept(&mut out, &ip, port.port);
        }
        return out;
    }
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref().unwrap_or("");
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
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            out.refused.push(format!(
                "EndpointSlice {} has addressType {:?}; only IPv4 and IPv6 are supported",
                slice.metadata.name.as_deref().unwrap_or(""),
                slice.address_type
            ));
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
        if !(1..=65535).contains(&number) {
            out.refused.push(format!("port {number} is not a port"));
            continue;
        }
        for ep in slice.endpoints.iter().flatten() {
            if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            for addr in &ep.addresses {
                accept(&mut out, addr, number);
            }
        }
    }
    out.endpoints
        .sort_by(|a, b| (&a.address, a.port.0).cmp(&(&b.address, b.port.0)));
    out.endpoints
        .dedup_by(|a, b| a.address == b.address && a.port.0 == b.port.0);
    out.refused.sort();
    out.refused.dedup();
    out
}

fn endpoint(address: String, port: i32) -> Endpoint {
    Endpoint {
        address,
        port: Port(u16::try_from(port).unwrap_or(0)),
        weight: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(json: serde_json::Value) -> Service {
        serde_json::from_value(json).unwrap()
    }

    fn slice(address_type: &str, addrs: &[&str], port: i32) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "t", "name": "s1", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": address_type,
            "ports": [{"name": "http", "port": port}],
            "endpoints": [{"addresses": addrs}]
        }))
        .unwrap()
    }

    fn web() -> (Service, ServicePort) {
        let s = svc(serde_json::json!({"metadata": {"namespace": "t", "name": "web"},
            "spec": {"ports": [{"name": "http", "port": 80}], "clusterIP": "127.0.0.1"}}));
        let p = s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].clone();
        (s, p)
    }

    #[test]
    fn local_endpoint_addresses_are_refused_unless_allowed() {
        let (s, p) = web();
        let sl = slice("IPv4", &["10.0.0.1", "127.0.0.1", "169.254.169.254", "0.0.0.0"], 8080);
        let strict = resolve(&s, &p, &[&sl], false, &AddressPolicy::default());
        assert_eq!(strict.endpoints.len(), 1);
        assert_eq!(strict.refused.len(), 3, "{:?}", strict.refused);
        let local = AddressPolicy {
            allow_local: true,
            reserved_ports: vec![10246],
        };
        assert_eq!(resolve(&s, &p, &[&sl], false, &local).endpoints.len(), 4);
        // Even then, never the controller's own ports.
        let api = slice("IPv4", &["127.0.0.1"], 10246);
        let r = resolve(&s, &p, &[&api], false, &local);
        assert!(r.endpoints.is_empty() && r.refused[0].contains("port of the controller"));
        // service-upstream's ClusterIP follows the same rule.
        assert!(resolve(&s, &p, &[], true, &AddressPolicy::default())
            .endpoints
            .is_empty());
    }

    #[test]
    fn fqdn_slices_and_garbage_addresses_are_refused() {
        let (s, p) = web();
        let fqdn = slice("FQDN", &["db.example.com"], 80);
        assert!(resolve(&s, &p, &[&fqdn], false, &AddressPolicy::default()).refused[0].contains("FQDN"));
        let bad = slice("IPv4", &["10.0.0.300", "fd00::1"], 80);
        let r = resolve(&s, &p, &[&bad], false, &AddressPolicy::default());
        assert_eq!(r.endpoints.len(), 1);
        assert!(r.refused[0].contains("not an IP address"));
    }

    #[test]
    fn external_names_of_the_local_host_are_refused() {
        for name in [
            "localhost",
            "a.localhost",
            "127.0.0.1",
            "::1",
            "169.254.169.254",
            "0x7f000001",
            "127.1",
        ] {
            assert!(refuse_external_name(name).is_some(), "{name}");
        }
        for name in ["db.example.com", "10.1.2.3", "my-svc.ns.svc.cluster.local"] {
            assert!(refuse_external_name(name).is_none(), "{name}");
        }
    }
}
