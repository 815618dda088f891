//! The part of the cluster a review has to look at.
//!
//! Building the whole model for every review costs what a reload costs (at
//! 10,000 Ingresses, 150 ms of CPU each), and any caller can ask for
//! reviews. But the verdict on one Ingress depends only on objects that
//! can interact with it: Ingresses that name one of its hosts (path
//! conflicts, canaries, aliases, `www.` redirects, the catch-all server),
//! the Services and EndpointSlices those Ingresses reference, the Secrets
//! they name, and the cluster-wide settings (classes, ConfigMaps). [`related`]
//! keeps exactly those; a test checks, over every golden case, that each
//! Ingress gets the same problems from the scoped snapshot as from the
//! whole one.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::model::endpoints::SERVICE_NAME_LABEL;
use crate::model::BuildOptions;
use crate::snapshot::Snapshot;

const ALIAS: &str = "nginx.ingress.kubernetes.io/server-alias";

/// The host names an Ingress claims (rules, aliases), as written; a rule
/// without a host claims the catch-all server, `""`.
fn names(ing: &Ingress) -> impl Iterator<Item = &str> {
    let hosts = ing
        .spec
        .iter()
        .flat_map(|s| s.rules.iter().flatten())
        .map(|r| r.host.as_deref().unwrap_or("").trim());
    let aliases = ing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALIAS))
        .into_iter()
        .flat_map(|a| a.split(','))
        .map(str::trim)
        .filter(|a| !a.is_empty());
    hosts.chain(aliases)
}

/// `name` without a leading `www.` (`from-to-www-redirect` makes a host
/// and its `www.` twin serve each other): two names interact when their
/// bare forms are equal.
fn bare(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    match lower.strip_prefix("www.") {
        Some(rest) => rest.to_string(),
        None => lower,
    }
}

/// Whether `name`'s bare form is one of `claimed`, without allocating
/// (this runs for every Ingress of the cluster).
fn claims(claimed: &HashSet<String>, name: &str) -> bool {
    let rest = match name.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("www.") => &name[4..],
        _ => name,
    };
    if rest.bytes().any(|b| b.is_ascii_uppercase()) {
        return claimed.contains(&bare(name));
    }
    claimed.contains(rest)
}

/// `(namespace, name)` pairs grouped for lookups by borrowed names.
fn by_namespace(set: &BTreeSet<(String, String)>) -> HashMap<&str, HashSet<&str>> {
    let mut by_ns: HashMap<&str, HashSet<&str>> = HashMap::new();
    for (ns, name) in set {
        by_ns.entry(ns.as_str()).or_default().insert(name.as_str());
    }
    by_ns
}

fn namespace(ing: &Ingress) -> &str {
    ing.metadata.namespace.as_deref().unwrap_or("default")
}

fn backend_services(ing: &Ingress) -> impl Iterator<Item = &str> {
    let spec = ing.spec.iter();
    let default = spec.clone().filter_map(|s| s.default_backend.as_ref());
    let paths = spec
        .flat_map(|s| s.rules.iter().flatten())
        .filter_map(|r| r.http.as_ref())
        .flat_map(|h| h.paths.iter().map(|p| &p.backend));
    default
        .chain(paths)
        .filter_map(|b: &IngressBackend| b.service.as_ref().map(|s| s.name.as_str()))
}

/// The snapshot reduced to what can change `candidate`'s verdict; the
/// candidate itself is not added (the caller puts it in).
pub fn related(snap: &Snapshot, candidate: &Ingress, opts: &BuildOptions) -> Snapshot {
    let claimed: HashSet<String> = names(candidate).map(bare).collect();
    let catch_all = candidate.spec.as_ref().is_some_and(|s| s.default_backend.is_some());
    let ingresses: Vec<Arc<Ingress>> = snap
        .ingresses
        .iter()
        .filter(|i| {
            (catch_all && i.spec.as_ref().is_some_and(|s| s.default_backend.is_some()))
                || names(i).any(|n| claims(&claimed, n))
        })
        .cloned()
        .collect();

    let mut services: BTreeSet<(String, String)> = BTreeSet::new();
    let mut secrets: BTreeSet<(String, String)> = BTreeSet::new();
    for ing in ingresses.iter().map(Arc::as_ref).chain([candidate]) {
        let ns = namespace(ing).to_string();
        services.extend(backend_services(ing).map(|s| (ns.clone(), s.to_string())));
        for tls in ing.spec.iter().flat_map(|s| s.tls.iter().flatten()) {
            if let Some(name) = &tls.secret_name {
                secrets.insert((ns.clone(), name.clone()));
            }
        }
        // Annotations name Services (`default-backend`) and Secrets
        // (`auth-secret`, `auth-tls-secret`, ...), as `name` or `ns/name`:
        // every value is kept as a possible reference, which costs only
        // a lookup.
        for value in ing.metadata.annotations.iter().flat_map(|a| a.values()) {
            let v = value.trim();
            let (vns, name) = v.split_once('/').unwrap_or((&ns, v));
            services.insert((vns.to_string(), name.to_string()));
            secrets.insert((vns.to_string(), name.to_string()));
        }
    }
    if let Some((ns, name)) = &opts.default_backend_service {
        services.insert((ns.clone(), name.clone()));
    }
    if let Some((ns, name)) = &opts.default_ssl_certificate {
        secrets.insert((ns.clone(), name.clone()));
    }
    // Looked up by borrowed names: the filters below run over every
    // Service, EndpointSlice and Secret of the cluster.
    let (services, secrets) = (by_namespace(&services), by_namespace(&secrets));
    let has = |set: &HashMap<&str, HashSet<&str>>, ns: Option<&str>, name: &str| {
        set.get(ns.unwrap_or("default"))
            .is_some_and(|names| names.contains(name))
    };
    let meta_has = |set: &HashMap<&str, HashSet<&str>>, m: &ObjectMeta| {
        has(set, m.namespace.as_deref(), m.name.as_deref().unwrap_or(""))
    };
    Snapshot {
        ingresses,
        classes: snap.classes.clone(),
        services: snap
            .services
            .iter()
            .filter(|s| meta_has(&services, &s.metadata))
            .cloned()
            .collect(),
        slices: snap
            .slices
            .iter()
            .filter(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .is_some_and(|svc| has(&services, s.metadata.namespace.as_deref(), svc))
            })
            .cloned()
            .collect(),
        secrets: snap
            .secrets
            .iter()
            .filter(|s| meta_has(&secrets, &s.metadata))
            .cloned()
            .collect(),
        config_map: snap.config_map.clone(),
        header_config_maps: snap.header_config_maps.clone(),
        tcp_services: snap.tcp_services.clone(),
        udp_services: snap.udp_services.clone(),
        ..Default::default()
    }
}
