//! Backends: ingress-nginx's `Backend` JSON for every Service port the
//! servers route to, with its endpoints, algorithm, affinity and canary.
//!
//! Each backend is checked with the module's own validator
//! ([`lua_compat::validate_backend`]) before it goes anywhere: a value the
//! module would refuse drops that backend alone (its paths answer 503) with
//! a report, instead of making the module refuse the whole push for every
//! tenant.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use lua_compat::wire;

use super::annotations::Annotations;
use super::config_map::GlobalConfig;
use super::endpoints::{self, AddressPolicy, PortRef};
use super::{Report, Server};
use crate::snapshot::{ServiceKey, Snapshot};

/// A Service port some location or canary refers to.
#[derive(Debug, Clone)]
pub struct BackendRef {
    pub namespace: String,
    pub service: String,
    /// `Number(-1)`: the Service's first port (default backends).
    pub port: PortRef,
    /// Annotations of the first (oldest) Ingress that refers to it, shared
    /// with that Ingress's other backends.
    pub annotations: Arc<Annotations>,
    pub canary: bool,
    /// A Gateway API rule's session persistence, for the rule's own copy
    /// of a Service port (no Ingress shares that backend).
    pub session: Option<wire::SessionAffinityConfig>,
}

impl BackendRef {
    /// The Services its endpoints come from: its own, and the
    /// `default-backend` annotation's, which serves when it has none.
    fn services(&self) -> impl Iterator<Item = ServiceKey> + '_ {
        std::iter::once((self.namespace.clone(), self.service.clone())).chain(
            self.annotations
                .default_backend
                .iter()
                .map(|f| (self.namespace.clone(), f.clone())),
        )
    }
}

/// What the backends are resolved from, besides the Services and
/// EndpointSlices: everything the Ingresses and the ConfigMap decided. It
/// is kept with the model, so that an endpoint change resolves only the
/// backends of the Services it touched.
#[derive(Debug, Default)]
pub struct BackendInputs {
    /// Every backend the servers (and layer-4 ports) route to, by name.
    pub refs: BTreeMap<String, BackendRef>,
    /// Primary backend → its canary backends.
    alternatives: BTreeMap<String, BTreeSet<String>>,
    /// Canary → its primary.
    primaries: BTreeMap<String, String>,
    /// Canary backends whose Ingress says `affinity-canary-behavior: legacy`.
    legacy: BTreeSet<String>,
    /// Backend with cookie affinity → host → the Ingress paths where the
    /// module issues its cookie.
    cookie_paths: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    /// Service → the backends resolved from it.
    by_service: HashMap<ServiceKey, Vec<String>>,
    /// Services the structure itself depends on (layer-4 ports exist only
    /// while their Service has the port): a change to one is structural.
    pub structural_services: BTreeSet<ServiceKey>,
    /// Services Gateway API routes name, with the shape the route table
    /// was built from ([`crate::gateway::translate::referenced_services`]):
    /// a change of shape is structural, a change of endpoints is not.
    pub gateway_services: BTreeMap<ServiceKey, crate::gateway::translate::ServiceShape>,
    /// The ConfigMap's `load-balance`, for backends that do not set one.
    load_balance: String,
}

impl BackendInputs {
    pub fn new(
        refs: BTreeMap<String, BackendRef>,
        alternatives: BTreeMap<String, BTreeSet<String>>,
        servers: &[Server],
        global: &GlobalConfig,
        structural_services: BTreeSet<ServiceKey>,
    ) -> Self {
        let legacy = refs
            .iter()
            .filter(|(_, r)| r.canary && r.annotations.affinity_canary_legacy)
            .map(|(n, _)| n.clone())
            .collect();
        let primaries = alternatives
            .iter()
            .flat_map(|(p, cs)| cs.iter().map(move |c| (c.clone(), p.clone())))
            .collect();
        let mut by_service: HashMap<ServiceKey, Vec<String>> = HashMap::new();
        for (name, r) in &refs {
            for svc in r.services() {
                by_service.entry(svc).or_default().push(name.clone());
            }
        }
        // One pass over the locations, not one per backend: with thousands
        // of sticky backends that would be quadratic.
        let mut cookie_paths: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
        for s in servers {
            for l in &s.locations {
                let sticky = refs.get(&l.backend).is_some_and(|r| r.annotations.affinity.is_some());
                if let (true, Some(path)) = (sticky, &l.location_path) {
                    let paths = cookie_paths
                        .entry(l.backend.clone())
                        .or_default()
                        .entry(s.hostname.clone())
                        .or_default();
                    if !paths.contains(path) {
                        paths.push(path.clone());
                    }
                }
            }
        }
        BackendInputs {
            refs,
            alternatives,
            primaries,
            legacy,
            cookie_paths,
            by_service,
            structural_services,
            gateway_services: BTreeMap::new(),
            load_balance: global.load_balance.clone(),
        }
    }

    /// Every backend resolved from one of `services`, with the canaries of
    /// those that are primaries (they share the primary's affinity).
    pub fn dependents<'a>(&self, services: impl IntoIterator<Item = &'a ServiceKey>) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for svc in services {
            for name in self.by_service.get(svc).into_iter().flatten() {
                out.insert(name.clone());
                out.extend(self.alternatives.get(name).into_iter().flatten().cloned());
            }
        }
        out
    }

    /// Every backend.
    pub fn all(&self) -> BTreeSet<String> {
        self.refs.keys().cloned().collect()
    }
}

/// Services and EndpointSlices indexed by `(namespace, service)`, so that
/// resolving N backends stays O(N) against thousands of objects.
struct Index<'s> {
    services: HashMap<ServiceKey, &'s Service>,
    slices: HashMap<ServiceKey, Vec<&'s EndpointSlice>>,
}

fn ns_of(m: &ObjectMeta) -> &str {
    m.namespace.as_deref().unwrap_or("default")
}

impl<'s> Index<'s> {
    /// The Services and slices of the `wanted` Services, or all of them.
    /// An endpoint change wants one or two: comparing each object's name
    /// with them costs less than hashing it.
    fn new(snap: &'s Snapshot, wanted: Option<&[(&str, &str)]>) -> Self {
        let keep = |ns: &str, name: &str| wanted.is_none_or(|w| w.iter().any(|(n, s)| *s == name && *n == ns));
        let services = snap
            .services
            .iter()
            .filter_map(|s| {
                let (ns, name) = (ns_of(&s.metadata), s.metadata.name.as_deref().unwrap_or_default());
                keep(ns, name).then(|| ((ns.to_string(), name.to_string()), &**s))
            })
            .collect();
        let mut slices: HashMap<ServiceKey, Vec<&EndpointSlice>> = HashMap::new();
        for slice in &snap.slices {
            let Some(svc) = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(endpoints::SERVICE_NAME_LABEL))
            else {
                continue;
            };
            let ns = ns_of(&slice.metadata);
            if keep(ns, svc) {
                slices.entry((ns.to_string(), svc.clone())).or_default().push(slice);
            }
        }
        Index { services, slices }
    }
}

/// Resolves the backends `names` from the snapshot's Services and
/// EndpointSlices, replacing their entries (and problems) in `backends`
/// and `problems`: all of them on a full build, those of the Services
/// that changed on an endpoint change.
pub fn resolve(
    snap: &Snapshot,
    inputs: &BackendInputs,
    names: &BTreeSet<String>,
    policy: &AddressPolicy,
    backends: &mut BTreeMap<String, Arc<wire::Backend>>,
    problems: &mut BTreeMap<String, Vec<Report>>,
) {
    // A few Services are looked for by name; many (a full build, a
    // re-list) are indexed all at once.
    let mut wanted: Vec<(&str, &str)> = Vec::new();
    for r in names.iter().filter_map(|n| inputs.refs.get(n)) {
        wanted.push((&r.namespace, &r.service));
        if let Some(f) = &r.annotations.default_backend {
            wanted.push((&r.namespace, f));
        }
        if wanted.len() > 16 {
            break;
        }
    }
    let index = Index::new(snap, (wanted.len() <= 16).then_some(&wanted[..]));
    for name in names {
        backends.remove(name);
        problems.remove(name);
        let Some(r) = inputs.refs.get(name) else { continue };
        let (backend, reports) = resolve_one(name, r, &index, inputs, policy);
        if let Some(b) = backend {
            backends.insert(name.clone(), Arc::new(b));
        }
        if !reports.is_empty() {
            problems.insert(name.clone(), reports);
        }
    }
    share_affinity_with_canaries(backends, inputs, names);
}

/// One backend, and what was refused on the way.
fn resolve_one(
    name: &str,
    r: &BackendRef,
    index: &Index<'_>,
    inputs: &BackendInputs,
    policy: &AddressPolicy,
) -> (Option<wire::Backend>, Vec<Report>) {
    let object = format!("Service {}/{}", r.namespace, r.service);
    let mut reports = Vec::new();
    let mut report = |what: &str, reason: String| {
        reports.push(Report {
            object: object.clone(),
            what: what.into(),
            reason,
        })
    };
    let svc_key = (r.namespace.clone(), r.service.clone());
    let svc = index.services.get(&svc_key).copied();
    let port = svc.and_then(|s| match &r.port {
        PortRef::Number(-1) => s.spec.as_ref()?.ports.as_ref()?.first(),
        p => p.find(s),
    });
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
    let b = wire_backend(name, r, endpoints, external, inputs);
    match lua_compat::validate_backend(&b) {
        Ok(()) => (Some(b), reports),
        Err(e) => {
            report(
                "backend",
                format!("backend {name} refused ({e}); its paths answer 503 until this is fixed"),
            );
            (None, reports)
        }
    }
}

/// A canary backend takes its primary's session affinity (ingress-nginx's
/// default `sticky` canary behaviour): a client the canary served keeps its
/// cookie, and the module keeps routing it to the canary. With `legacy` on
/// the canary Ingress, the canary keeps its own (usually none). Only the
/// canaries among `names` (just resolved) are visited.
fn share_affinity_with_canaries(
    backends: &mut BTreeMap<String, Arc<wire::Backend>>,
    inputs: &BackendInputs,
    names: &BTreeSet<String>,
) {
    for canary in names.iter().filter(|c| !inputs.legacy.contains(*c)) {
        let Some(primary) = inputs.primaries.get(canary) else {
            continue;
        };
        let Some(affinity) = backends
            .get(primary)
            .map(|b| b.session_affinity.clone())
            .filter(|a| !a.name.is_empty())
        else {
            continue;
        };
        if let Some(b) = backends.get_mut(canary) {
            Arc::make_mut(b).session_affinity = affinity;
        }
    }
}

fn wire_backend(
    name: &str,
    r: &BackendRef,
    endpoints: Vec<wire::Endpoint>,
    external: bool,
    inputs: &BackendInputs,
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
        load_balance: a.load_balance.clone().unwrap_or_else(|| inputs.load_balance.clone()),
        no_server: r.canary,
        alternative_backends: inputs
            .alternatives
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
    if let Some(session) = &r.session {
        b.session_affinity = session.clone();
    } else if let Some(aff) = &a.affinity {
        b.session_affinity = wire::SessionAffinityConfig::from(aff);
        // The module issues the cookie only where `$location_path` (the
        // Ingress path, which the template sets) is listed for the host.
        if let Some(paths) = inputs.cookie_paths.get(name) {
            b.session_affinity.cookie.locations = paths.clone();
        }
    }
    b
}
