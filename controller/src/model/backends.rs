//! Backends: ingress-nginx's `Backend` JSON for every Service port the
//! servers route to, with its endpoints, algorithm, affinity and canary.
//!
//! Each backend is checked with the module's own validator
//! ([`lua_compat::validate_backend`]) before it goes anywhere: a value the
//! module would refuse drops that backend alone (its paths answer 503) with
//! a report, instead of making the module refuse the whole push for every
//! tenant.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use lua_compat::wire;

use super::annotations::Annotations;
use super::config_map::GlobalConfig;
use super::endpoints::{self, AddressPolicy, PortRef};
use super::{Report, Server};
use crate::snapshot::Snapshot;

/// A Service port some location or canary refers to.
#[derive(Debug, Clone)]
pub struct BackendRef {
    pub namespace: String,
    pub service: String,
    /// `Number(-1)`: the Service's first port (default backends).
    pub port: PortRef,
    /// Annotations of the first (oldest) Ingress that refers to it.
    pub annotations: Annotations,
    pub canary: bool,
}

/// The backends, and what was refused on the way.
pub struct Built {
    pub backends: BTreeMap<String, wire::Backend>,
    pub problems: Vec<Report>,
    /// Backend name → `Service ns/name`.
    pub objects: BTreeMap<String, String>,
}

/// Services and EndpointSlices indexed by `(namespace, service)`, so that
/// resolving N backends stays O(N) against thousands of objects.
struct Index<'s> {
    services: HashMap<(String, String), &'s Service>,
    slices: HashMap<(String, String), Vec<&'s EndpointSlice>>,
}

fn ns_of(m: &ObjectMeta) -> String {
    m.namespace.clone().unwrap_or_else(|| "default".into())
}

impl<'s> Index<'s> {
    fn new(snap: &'s Snapshot) -> Self {
        let services = snap
            .services
            .iter()
            .map(|s| ((ns_of(&s.metadata), s.metadata.name.clone().unwrap_or_default()), &**s))
            .collect();
        let mut slices: HashMap<(String, String), Vec<&EndpointSlice>> = HashMap::new();
        for slice in &snap.slices {
            if let Some(svc) = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(endpoints::SERVICE_NAME_LABEL))
            {
                slices
                    .entry((ns_of(&slice.metadata), svc.clone()))
                    .or_default()
                    .push(slice);
            }
        }
        Index { services, slices }
    }
}

pub fn build(
    snap: &Snapshot,
    refs: BTreeMap<String, BackendRef>,
    alternatives: &BTreeMap<String, BTreeSet<String>>,
    servers: &[Server],
    global: &GlobalConfig,
    policy: &AddressPolicy,
) -> Built {
    let index = Index::new(snap);
    let mut out = Built {
        backends: BTreeMap::new(),
        problems: Vec::new(),
        objects: BTreeMap::new(),
    };
    // Canary backends whose Ingress says `affinity-canary-behavior: legacy`.
    let legacy: BTreeSet<String> = refs
        .iter()
        .filter(|(_, r)| r.canary && r.annotations.affinity_canary_legacy)
        .map(|(n, _)| n.clone())
        .collect();
    for (name, r) in refs {
        let object = format!("Service {}/{}", r.namespace, r.service);
        let svc_key = (r.namespace.clone(), r.service.clone());
        let svc = index.services.get(&svc_key).copied();
        let port = svc.and_then(|s| match &r.port {
            PortRef::Number(-1) => s.spec.as_ref()?.ports.as_ref()?.first(),
            p => p.find(s),
        });
        let mut report = |what: &str, reason: String| {
            out.problems.push(Report {
                object: object.clone(),
                what: what.into(),
                reason,
            })
        };
        let endpoints = match (svc, port) {
            (Some(svc), Some(port)) => {
                let resolved = endpoints::resolve(
                    svc,
                    port,
                    index.slices.get(&svc_key).map_or(&[][..], Vec::as_slice),
                    r.annotations.service_upstream,
                    policy,
                );
                for why in resolved.refused {
                    report("endpoints", format!("{why}; refused for backend {name}"));
                }
                resolved.endpoints
            }
            (Some(_), None) => {
                report(
                    "port",
                    format!("has no port {}; backend {name} has no endpoints", r.port.suffix()),
                );
                Vec::new()
            }
            (None, _) => {
                report("service", format!("not found; backend {name} has no endpoints"));
                Vec::new()
            }
        };
        // ingress-nginx's `default-backend` annotation: a Service with no
        // endpoints is served by the named Service of the same namespace
        // (its first port). Here that is a push, not a reload.
        let endpoints = match (&r.annotations.default_backend, endpoints.is_empty() && !r.canary) {
            (Some(fallback), true) => {
                let key = (r.namespace.clone(), fallback.clone());
                let fallback_svc = index.services.get(&key).copied();
                let fallback_port = fallback_svc.and_then(|s| s.spec.as_ref()?.ports.as_ref()?.first());
                match (fallback_svc, fallback_port) {
                    (Some(s), Some(p)) => {
                        let slices = index.slices.get(&key).map_or(&[][..], Vec::as_slice);
                        endpoints::resolve(s, p, slices, false, policy).endpoints
                    }
                    _ => Vec::new(),
                }
            }
            _ => endpoints,
        };
        let external = svc.and_then(|s| s.spec.as_ref()).and_then(|s| s.type_.as_deref()) == Some("ExternalName");
        let b = wire_backend(&name, &r, endpoints, external, alternatives, servers, global);
        match lua_compat::validate_backend(&b) {
            Ok(()) => {
                out.objects.insert(name.clone(), object.clone());
                out.backends.insert(name, b);
            }
            Err(e) => report(
                "backend",
                format!("backend {name} refused ({e}); its paths answer 503 until this is fixed"),
            ),
        }
    }
    share_affinity_with_canaries(&mut out.backends, alternatives, &legacy);
    out
}

/// A canary backend takes its primary's session affinity (ingress-nginx's
/// default `sticky` canary behaviour): a client the canary served keeps its
/// cookie, and the module keeps routing it to the canary. With `legacy` on
/// the canary Ingress, the canary keeps its own (usually none).
fn share_affinity_with_canaries(
    backends: &mut BTreeMap<String, wire::Backend>,
    alternatives: &BTreeMap<String, BTreeSet<String>>,
    legacy: &BTreeSet<String>,
) {
    for (primary, canaries) in alternatives {
        let Some(affinity) = backends
            .get(primary)
            .map(|b| b.session_affinity.clone())
            .filter(|a| !a.name.is_empty())
        else {
            continue;
        };
        for c in canaries.iter().filter(|c| !legacy.contains(*c)) {
            if let Some(b) = backends.get_mut(c) {
                b.session_affinity = affinity.clone();
            }
        }
    }
}

fn wire_backend(
    name: &str,
    r: &BackendRef,
    endpoints: Vec<wire::Endpoint>,
    external: bool,
    alternatives: &BTreeMap<String, BTreeSet<String>>,
    servers: &[Server],
    global: &GlobalConfig,
) -> wire::Backend {
    let a = &r.annotations;
    let mut b = wire::Backend {
        name: name.to_string(),
        service: external.then(|| serde_json::json!({ "spec": { "type": "ExternalName" } })),
        port: match &r.port {
            PortRef::Number(n) => wire::ServicePort::Number(i64::from((*n).max(0))),
            PortRef::Name(s) => wire::ServicePort::Name(s.clone()),
        },
        endpoints,
        load_balance: a.load_balance.clone().unwrap_or_else(|| global.load_balance.clone()),
        no_server: r.canary,
        alternative_backends: alternatives
            .get(name)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default(),
        ..Default::default()
    };
    b.upstream_hash_by = wire::UpstreamHashByConfig {
        hash_by: a.upstream_hash_by.clone().unwrap_or_default(),
        subset: a.upstream_hash_by_subset,
        subset_size: a.upstream_hash_by_subset_size.unwrap_or(if a.upstream_hash_by_subset {
            lua_compat::algorithm::DEFAULT_SUBSET_SIZE as i64
        } else {
            0
        }),
    };
    if let Some(c) = a.canary.as_ref().filter(|_| r.canary) {
        b.traffic_shaping = wire::TrafficShapingPolicy::from(c);
    }
    if let Some(aff) = &a.affinity {
        b.session_affinity = wire::SessionAffinityConfig::from(aff);
        // The module issues the cookie only where `$location_path` (the
        // Ingress path, which the template sets) is listed for the host.
        let cookie = &mut b.session_affinity.cookie;
        for s in servers {
            for l in s.locations.iter().filter(|l| l.backend == name) {
                if let Some(path) = &l.location_path {
                    let paths = cookie.locations.entry(s.hostname.clone()).or_default();
                    if !paths.contains(path) {
                        paths.push(path.clone());
                    }
                }
            }
        }
    }
    b
}
