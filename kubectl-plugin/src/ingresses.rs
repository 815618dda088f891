//! `ingresses`: one row per Ingress rule path, with ingress-nginx's
//! plugin's columns (its `HOST+PATH`, `TLS`, `ENDPOINTS`, …), computed
//! from the Ingresses and EndpointSlices alone.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use serde_json::{json, Value};

/// One row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub namespace: String,
    pub ingress: String,
    pub class: String,
    pub host_path: String,
    pub addresses: String,
    pub tls: bool,
    pub service: String,
    pub port: String,
    /// Ready endpoints of the Service (distinct addresses); `None` for a
    /// resource backend.
    pub endpoints: Option<usize>,
}

/// The rows, by namespace, Ingress, then in the rules' order.
pub fn rows(ingresses: &[Ingress], slices: &[EndpointSlice]) -> Vec<Row> {
    let ready = ready_endpoints(slices);
    let mut out = Vec::new();
    let mut sorted: Vec<&Ingress> = ingresses.iter().collect();
    sorted.sort_by_key(|i| (i.metadata.namespace.clone(), i.metadata.name.clone()));
    for ing in sorted {
        let ns = ing.metadata.namespace.clone().unwrap_or_default();
        let name = ing.metadata.name.clone().unwrap_or_default();
        let Some(spec) = &ing.spec else { continue };
        let class = spec
            .ingress_class_name
            .clone()
            .or_else(|| {
                ing.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("kubernetes.io/ingress.class").cloned())
            })
            .unwrap_or_default();
        let addresses = ing
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|a| a.ip.clone().or_else(|| a.hostname.clone()))
            .collect::<Vec<_>>()
            .join(",");
        let tls_hosts: Vec<&str> = spec
            .tls
            .iter()
            .flatten()
            .flat_map(|t| t.hosts.iter().flatten())
            .map(String::as_str)
            .collect();
        let row = |host_path: String, host: Option<&str>, backend: &IngressBackend| {
            let (service, port, endpoints) = describe(&ns, backend, &ready);
            Row {
                namespace: ns.clone(),
                ingress: name.clone(),
                class: class.clone(),
                host_path,
                addresses: addresses.clone(),
                tls: host.is_some_and(|h| tls_hosts.iter().any(|t| covers(t, h))),
                service,
                port,
                endpoints,
            }
        };
        if let Some(b) = &spec.default_backend {
            out.push(row("(default backend)".into(), None, b));
        }
        for rule in spec.rules.iter().flatten() {
            let host = rule.host.as_deref();
            let shown = host.unwrap_or("*");
            let Some(http) = &rule.http else { continue };
            for p in &http.paths {
                let path = p.path.as_deref().unwrap_or("/");
                out.push(row(format!("{shown}{path}"), host, &p.backend));
            }
        }
    }
    out
}

/// A TLS host entry (or a certificate's name) covers a host exactly or by
/// one wildcard label.
pub fn covers(tls: &str, host: &str) -> bool {
    if tls.eq_ignore_ascii_case(host) {
        return true;
    }
    match (tls.strip_prefix("*."), host.split_once('.')) {
        (Some(suffix), Some((_, rest))) => rest.eq_ignore_ascii_case(suffix),
        _ => false,
    }
}

fn describe(
    ns: &str,
    backend: &IngressBackend,
    ready: &BTreeMap<(String, String), BTreeSet<String>>,
) -> (String, String, Option<usize>) {
    if let Some(s) = &backend.service {
        let port = s
            .port
            .as_ref()
            .and_then(|p| p.number.map(|n| n.to_string()).or_else(|| p.name.clone()))
            .unwrap_or_default();
        let n = ready.get(&(ns.to_string(), s.name.clone())).map_or(0, BTreeSet::len);
        return (s.name.clone(), port, Some(n));
    }
    if let Some(r) = &backend.resource {
        return (format!("{}/{}", r.kind, r.name), String::new(), None);
    }
    (String::new(), String::new(), None)
}

/// Ready endpoint addresses per (namespace, Service), over its slices.
fn ready_endpoints(slices: &[EndpointSlice]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out: BTreeMap<_, BTreeSet<String>> = BTreeMap::new();
    for s in slices {
        let Some(svc) = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
        else {
            continue;
        };
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        let set = out.entry((ns, svc.clone())).or_default();
        for e in s.endpoints.iter().flatten() {
            // Absent `ready` means ready (discovery.k8s.io/v1).
            if e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true) {
                set.extend(e.addresses.iter().cloned());
            }
        }
    }
    out
}

pub fn table(rows: &[Row], with_namespace: bool) -> String {
    let mut header = vec![];
    if with_namespace {
        header.push("NAMESPACE");
    }
    header.extend([
        "INGRESS NAME",
        "HOST+PATH",
        "ADDRESSES",
        "TLS",
        "SERVICE",
        "SERVICE PORT",
        "ENDPOINTS",
    ]);
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut v = vec![];
            if with_namespace {
                v.push(r.namespace.clone());
            }
            v.extend([
                r.ingress.clone(),
                r.host_path.clone(),
                r.addresses.clone(),
                if r.tls { "YES".into() } else { "NO".into() },
                r.service.clone(),
                r.port.clone(),
                r.endpoints.map_or("-".into(), |n| n.to_string()),
            ]);
            v
        })
        .collect();
    controller::inspect::table(&header, &body)
}

pub fn json(rows: &[Row]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                json!({
                    "namespace": r.namespace,
                    "ingress": r.ingress,
                    "class": r.class,
                    "hostPath": r.host_path,
                    "addresses": r.addresses,
                    "tls": r.tls,
                    "service": r.service,
                    "servicePort": r.port,
                    "endpoints": r.endpoints,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_per_path_with_tls_and_ready_endpoints() {
        let ing: Ingress = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {
                "ingressClassName": "nginx",
                "tls": [{"hosts": ["*.shop.test"], "secretName": "tls"}],
                "defaultBackend": {"service": {"name": "fallback", "port": {"name": "http"}}},
                "rules": [
                    {"host": "www.shop.test", "http": {"paths": [
                        {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
                        {"path": "/static", "pathType": "Prefix", "backend": {"resource": {"apiGroup": "k8s.example.com", "kind": "StorageBucket", "name": "assets"}}}
                    ]}},
                    {"http": {"paths": [
                        {"path": "/api", "pathType": "Prefix", "backend": {"service": {"name": "api", "port": {"number": 8080}}}}
                    ]}}
                ]
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "198.19.0.1"}, {"hostname": "lb.example"}]}}
        }))
        .unwrap();
        let slice = |name: &str, svc: &str, eps: Value| -> EndpointSlice {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "shop", "labels": {"kubernetes.io/service-name": svc}},
                "addressType": "IPv4",
                "endpoints": eps
            }))
            .unwrap()
        };
        let slices = vec![
            slice(
                "web-a",
                "web",
                json!([
                    {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                    {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
                    {"addresses": ["10.0.0.3"]}
                ]),
            ),
            // The same address in a second slice (another port) counts once.
            slice("web-b", "web", json!([{"addresses": ["10.0.0.1"]}])),
        ];
        let r = rows(&[ing], &slices);
        let view: Vec<(&str, bool, &str, &str, Option<usize>)> = r
            .iter()
            .map(|r| {
                (
                    r.host_path.as_str(),
                    r.tls,
                    r.service.as_str(),
                    r.port.as_str(),
                    r.endpoints,
                )
            })
            .collect();
        assert_eq!(
            view,
            [
                ("(default backend)", false, "fallback", "http", Some(0)),
                ("www.shop.test/", true, "web", "80", Some(2)),
                ("www.shop.test/static", true, "StorageBucket/assets", "", None),
                ("*/api", false, "api", "8080", Some(0)),
            ]
        );
        assert_eq!(r[0].addresses, "198.19.0.1,lb.example");
        assert_eq!(r[0].class, "nginx");
        let t = table(&r, false);
        assert!(t.starts_with("INGRESS NAME"), "{t}");
        assert!(t.contains("www.shop.test/static"), "{t}");
    }

    #[test]
    fn a_wildcard_covers_one_label_only() {
        assert!(covers("*.a.test", "x.a.test"));
        assert!(!covers("*.a.test", "y.x.a.test"));
        assert!(!covers("*.a.test", "a.test"));
        assert!(covers("A.test", "a.TEST"));
    }
}
