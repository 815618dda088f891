//! Static Gateway addresses (`spec.addresses`): the addresses a Gateway
//! asks for, checked before its Service is made with them.
//!
//! This controller can give a Gateway an IP address only (its Service's
//! cluster IP, or the load balancer IP it asks for): any other address
//! type makes the Gateway not Accepted (`UnsupportedAddress`). An IP the
//! cluster refuses (outside the Service range, or taken) leaves the
//! Service without it, and the Gateway not Programmed
//! (`AddressNotUsable`) until the address changes.

use std::collections::BTreeMap;
use std::net::IpAddr;

use gateway_api_types::gateways::Gateway;

/// The address type this controller serves (the spec's default).
pub const IP_ADDRESS: &str = "IPAddress";

/// The IP addresses `g` asks for, in its order (empty: any address), or
/// why it cannot have them.
pub fn requested(g: &Gateway) -> Result<Vec<IpAddr>, String> {
    let mut out = Vec::new();
    for a in g.spec.addresses.iter().flatten() {
        let type_ = a.r#type.as_deref().unwrap_or(IP_ADDRESS);
        let value = a.value.as_deref().unwrap_or("");
        if type_ != IP_ADDRESS {
            return Err(format!(
                "address {value:?} of type {type_:?}: only {IP_ADDRESS} addresses are supported"
            ));
        }
        let ip: IpAddr = value
            .parse()
            .map_err(|_| format!("address {value:?} is not an IP address"))?;
        // No address a Service or load balancer may not stand for: the
        // node's own loopback, "any", a multicast group, or a link-local
        // one (169.254.169.254 is the cloud metadata service).
        if !is_unicast_global_or_private(&ip) {
            return Err(format!(
                "address {value:?} is loopback, unspecified, multicast or link-local"
            ));
        }
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

/// What a Gateway asks of the resources made for it (its Service): the
/// static addresses it can have, and `spec.infrastructure`'s labels and
/// annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Infrastructure {
    pub addresses: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

fn is_unicast_global_or_private(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback() || v4.is_unspecified() || v4.is_multicast() || v4.is_link_local() || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || v6.is_unicast_link_local()
                || v6.to_ipv4_mapped().is_some())
        }
    }
}

/// Every Gateway's [`Infrastructure`], by `namespace/name` (Gateways that
/// ask for nothing are left out; so are addresses that cannot be had).
pub fn by_gateway<'a>(gateways: impl Iterator<Item = &'a Gateway>) -> BTreeMap<String, Infrastructure> {
    gateways
        .filter_map(|g| {
            let infra = g.spec.infrastructure.as_ref();
            let found = Infrastructure {
                addresses: requested(g).unwrap_or_default().iter().map(IpAddr::to_string).collect(),
                labels: infra.and_then(|i| i.labels.clone()).unwrap_or_default(),
                annotations: infra.and_then(|i| i.annotations.clone()).unwrap_or_default(),
            };
            (found != Infrastructure::default()).then(|| (crate::snapshot::key(&g.metadata), found))
        })
        .collect()
}

/// Why `g`'s `spec.infrastructure.parametersRef` cannot be used, if it
/// has one: this controller defines no parameters kind, so any reference
/// is one it cannot read (the spec's `InvalidParameters`).
pub fn invalid_parameters(g: &Gateway) -> Option<String> {
    let r = g.spec.infrastructure.as_ref()?.parameters_ref.as_ref()?;
    Some(format!(
        "parametersRef {}/{} {:?}: this controller takes no parameters resource",
        if r.group.is_empty() { "core" } else { &r.group },
        r.kind,
        r.name
    ))
}

/// The requested addresses `assigned` lacks (all of them must be had).
pub fn missing<'a>(requested: &'a [IpAddr], assigned: &[String]) -> Vec<&'a IpAddr> {
    requested
        .iter()
        .filter(|ip| !assigned.iter().any(|a| a.parse::<IpAddr>().ok().as_ref() == Some(*ip)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway(addresses: serde_json::Value) -> Gateway {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"namespace": "infra", "name": "gw"},
            "spec": {"gatewayClassName": "c", "addresses": addresses,
                     "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}))
        .unwrap()
    }

    #[test]
    fn ip_addresses_are_taken_and_other_types_refused() {
        let g = gateway(serde_json::json!([{"value": "10.96.0.50"}, {"type": "IPAddress", "value": "fd00::5"}]));
        assert_eq!(
            requested(&g).unwrap(),
            ["10.96.0.50".parse::<IpAddr>().unwrap(), "fd00::5".parse().unwrap()]
        );
        let fake =
            gateway(serde_json::json!([{"type": "test/fake-invalid-type", "value": "x"}, {"value": "10.0.0.1"}]));
        assert!(requested(&fake).unwrap_err().contains("only IPAddress"));
        let host = gateway(serde_json::json!([{"type": "Hostname", "value": "gw.example.com"}]));
        assert!(requested(&host).is_err());
        let bad = gateway(serde_json::json!([{"value": "10.0.0.300"}]));
        assert!(requested(&bad).unwrap_err().contains("not an IP"));
        for hostile in [
            "127.0.0.1",
            "0.0.0.0",
            "169.254.169.254",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            let g = gateway(serde_json::json!([{"value": hostile}]));
            assert!(requested(&g).unwrap_err().contains("loopback"), "{hostile}");
        }
        assert_eq!(
            by_gateway([&g, &fake].into_iter())["infra/gw"].addresses,
            ["10.96.0.50", "fd00::5"]
        );
    }

    #[test]
    fn infrastructure_metadata_and_parameters() {
        let mut g = gateway(serde_json::json!([]));
        assert!(by_gateway([&g].into_iter()).is_empty(), "asks for nothing");
        assert_eq!(invalid_parameters(&g), None);
        g.spec.infrastructure = serde_json::from_value(serde_json::json!({
            "labels": {"team": "a"}, "annotations": {"lb.example.com/internal": "true"},
            "parametersRef": {"group": "example.com", "kind": "Params", "name": "p"}}))
        .unwrap();
        let i = &by_gateway([&g].into_iter())["infra/gw"];
        assert_eq!(
            (
                i.labels["team"].as_str(),
                i.annotations["lb.example.com/internal"].as_str()
            ),
            ("a", "true")
        );
        assert!(invalid_parameters(&g).unwrap().contains("example.com/Params"));
    }

    #[test]
    fn every_requested_address_must_be_assigned() {
        let want = ["10.96.0.50".parse::<IpAddr>().unwrap()];
        assert!(missing(&want, &["10.96.0.50".into()]).is_empty());
        assert_eq!(missing(&want, &["10.96.0.7".into()]), [&want[0]]);
        assert_eq!(missing(&want, &[]), [&want[0]]);
    }
}
