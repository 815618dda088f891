//! The model builder: a pure function from [`Snapshot`] to [`Model`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use lua_compat::wire;
use sha2::{Digest, Sha256};

use super::annotations::{Annotations, Problem};
use super::class::ClassFilter;
use super::config_map::GlobalConfig;
use super::endpoints::{self, PortRef};
use super::values::{is_object_name, Host, PathRegex, UrlPath};
use super::{ErrorPage, Listen, Location, Match, Model, Report, Server, Structure, DEFAULT_BACKEND};
use crate::snapshot::{key, Snapshot};

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub class: ClassFilter,
    /// `--allow-snippet-annotations` (the ConfigMap key can also allow them).
    pub allow_snippets: bool,
    /// `--default-backend-service namespace/name`.
    pub default_backend_service: Option<(String, String)>,
    /// `--watch-namespace`; `None` watches all.
    pub namespace: Option<String>,
    pub listen: Listen,
}

/// A Service port some location or canary refers to.
#[derive(Debug, Clone)]
struct BackendRef {
    namespace: String,
    service: String,
    port: PortRef,
    /// Annotations of the first (oldest) Ingress that refers to it.
    annotations: Annotations,
    canary: bool,
}

#[derive(Default)]
struct ServerAcc {
    aliases: Vec<Host>,
    tls: Option<String>,
    snippet: Option<String>,
    /// Locations by their conflict key `(path, pathType)`.
    locations: BTreeMap<(String, String), Vec<Location>>,
}

struct Builder<'s> {
    snap: &'s Snapshot,
    opts: &'s BuildOptions,
    global: GlobalConfig,
    allow_snippets: bool,
    servers: BTreeMap<String, ServerAcc>,
    backends: BTreeMap<String, BackendRef>,
    certificates: BTreeMap<String, Vec<u8>>,
    problems: Vec<Report>,
    regex_hosts: BTreeSet<String>,
    /// Primary backend → its canary backends.
    alternatives: BTreeMap<String, BTreeSet<String>>,
}

pub fn build(snap: &Snapshot, opts: &BuildOptions) -> Model {
    let (global, config_problems) = snap
        .config_map
        .as_ref()
        .map(|cm| GlobalConfig::parse(&cm.data.clone().unwrap_or_default()))
        .unwrap_or_default();
    let mut b = Builder {
        snap,
        opts,
        allow_snippets: opts.allow_snippets || global.allow_snippet_annotations,
        global,
        servers: BTreeMap::new(),
        backends: BTreeMap::new(),
        certificates: BTreeMap::new(),
        problems: Vec::new(),
        regex_hosts: BTreeSet::new(),
        alternatives: BTreeMap::new(),
    };
    if let Some(cm) = &snap.config_map {
        b.report_all(&format!("ConfigMap {}", key(&cm.metadata)), config_problems);
    }

    let ingresses = b.ours();
    let parsed: Vec<(&Ingress, Annotations)> = ingresses
        .into_iter()
        .map(|ing| {
            let raw = ing.metadata.annotations.clone().unwrap_or_default();
            let (a, problems) = Annotations::parse(&raw, b.allow_snippets);
            b.report_all(&format!("Ingress {}", key(&ing.metadata)), problems);
            if a.configuration_snippet.is_some() || a.server_snippet.is_some() {
                tracing::warn!(ingress = %key(&ing.metadata), "snippet annotation accepted: it is rendered verbatim into nginx.conf (risky)");
            }
            (ing, a)
        })
        .collect();

    // use-regex (or rewrite-target) on any Ingress of a host turns every
    // path of that host into a regex, as ingress-nginx does.
    for (ing, a) in &parsed {
        if a.use_regex || a.rewrite_target.is_some() {
            for rule in ing.spec.iter().flat_map(|s| s.rules.iter().flatten()) {
                b.regex_hosts
                    .insert(rule.host.clone().unwrap_or_else(|| "_".into()).to_ascii_lowercase());
            }
        }
    }
    for (id, (ing, a)) in parsed.iter().enumerate() {
        if a.canary.is_none() {
            b.add_primary(id, ing, a);
        }
    }
    for (ing, a) in &parsed {
        if a.canary.is_some() {
            b.add_canary(ing, a);
        }
    }
    b.finish()
}

impl<'s> Builder<'s> {
    fn report_all(&mut self, object: &str, problems: Vec<Problem>) {
        for p in problems {
            self.problems.push(Report {
                object: object.to_string(),
                what: p.annotation,
                reason: p.reason,
            });
        }
    }

    fn report(&mut self, ing: &Ingress, what: &str, reason: impl Into<String>) {
        self.problems.push(Report {
            object: format!("Ingress {}", key(&ing.metadata)),
            what: what.to_string(),
            reason: reason.into(),
        });
    }

    /// Ingresses of our class and namespace, oldest first; ties broken by
    /// `namespace/name` descending (ingress-nginx's `sortIngressSlice`).
    fn ours(&self) -> Vec<&'s Ingress> {
        let mut v: Vec<&Ingress> = self
            .snap
            .ingresses
            .iter()
            .filter(|i| {
                self.opts
                    .namespace
                    .as_deref()
                    .is_none_or(|ns| i.metadata.namespace.as_deref() == Some(ns))
            })
            .filter(|i| self.opts.class.accepts(i, &self.snap.classes))
            .collect();
        v.sort_by(|a, b| {
            let t = |i: &Ingress| i.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(a).cmp(&t(b)).then_with(|| key(&b.metadata).cmp(&key(&a.metadata)))
        });
        v
    }

    fn backend_ref(
        &mut self,
        ing: &Ingress,
        backend: &IngressBackend,
        a: &Annotations,
        canary: bool,
    ) -> Option<String> {
        let ns = ing.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let Some(svc) = &backend.service else {
            self.report(ing, "backend", "resource backends are not supported; path ignored");
            return None;
        };
        let port = match &svc.port {
            Some(p) if p.number.is_some() => PortRef::Number(p.number.unwrap_or_default()),
            Some(p) if p.name.is_some() => PortRef::Name(p.name.clone().unwrap_or_default()),
            _ => {
                self.report(
                    ing,
                    "backend",
                    format!("service {} has no port; path ignored", svc.name),
                );
                return None;
            }
        };
        if !is_object_name(&svc.name) || !is_object_name(&port.suffix().to_ascii_lowercase()) {
            self.report(ing, "backend", format!("invalid service reference {:?}", svc.name));
            return None;
        }
        let name = format!("{ns}-{}-{}", svc.name, port.suffix());
        self.backends.entry(name.clone()).or_insert_with(|| BackendRef {
            namespace: ns,
            service: svc.name.clone(),
            port,
            annotations: a.clone(),
            canary,
        });
        Some(name)
    }

    fn add_primary(&mut self, id: usize, ing: &Ingress, a: &Annotations) {
        let Some(spec) = &ing.spec else { return };
        let ing_key = key(&ing.metadata);
        for tls in spec.tls.iter().flatten() {
            let Some(secret) = tls.secret_name.as_deref() else {
                continue;
            };
            let Some(file) = self.certificate(ing, secret) else {
                continue;
            };
            for host in tls.hosts.iter().flatten() {
                match Host::parse(host) {
                    Ok(h) => {
                        let server = self.servers.entry(h.as_str().to_string()).or_default();
                        server.tls.get_or_insert_with(|| file.clone());
                    }
                    Err(e) => self.report(ing, "spec.tls.hosts", e.0),
                }
            }
        }
        let rules = spec.rules.as_deref().unwrap_or_default();
        if rules.is_empty() {
            if let Some(db) = &spec.default_backend {
                if let Some(backend) = self.backend_ref(ing, db, a, false) {
                    let loc = self.location(id, &ing_key, "/", Match::Prefix, backend, a);
                    self.insert(ing, "_", ("/".into(), "Prefix".into()), vec![loc]);
                }
            }
        }
        for rule in rules {
            let host = match rule.host.as_deref() {
                None | Some("") => "_".to_string(),
                Some(h) => match Host::parse(h) {
                    Ok(h) => h.as_str().to_string(),
                    Err(e) => {
                        self.report(ing, "spec.rules.host", e.0);
                        continue;
                    }
                },
            };
            let server = self.servers.entry(host.clone()).or_default();
            if server.locations.is_empty() && server.aliases.is_empty() {
                server.aliases = a.server_alias.clone();
                server.snippet = a.server_snippet.clone();
            }
            for path in rule.http.iter().flat_map(|h| h.paths.iter()) {
                let Some(backend) = self.backend_ref(ing, &path.backend, a, false) else {
                    continue;
                };
                let raw = path.path.clone().unwrap_or_else(|| "/".into());
                let Some(locs) = self.locations_for(id, ing, &host, &raw, &path.path_type, &backend, a) else {
                    continue;
                };
                self.insert(ing, &host, (raw, path.path_type.clone()), locs);
            }
        }
    }

    /// The nginx locations for one Ingress path.
    #[allow(clippy::too_many_arguments)]
    fn locations_for(
        &mut self,
        id: usize,
        ing: &Ingress,
        host: &str,
        raw: &str,
        path_type: &str,
        backend: &str,
        a: &Annotations,
    ) -> Option<Vec<Location>> {
        let ing_key = key(&ing.metadata);
        let regex = self.regex_hosts.contains(host);
        let checked = if regex && path_type == "ImplementationSpecific" {
            PathRegex::parse(raw).map(|r| r.as_str().to_string())
        } else {
            UrlPath::parse(raw).map(|p| p.as_str().to_string())
        };
        let path = match checked {
            Ok(p) => p,
            Err(e) => {
                self.report(ing, "spec.rules.http.paths.path", e.0);
                return None;
            }
        };
        let backend = backend.to_string();
        let one = |b: &mut Self, path: String, m: Match| b.location(id, &ing_key, &path, m, backend.clone(), a);
        Some(match (path_type, regex) {
            ("Exact", false) => vec![one(self, path, Match::Exact)],
            ("Exact", true) => vec![one(self, format!("^{path}$"), Match::Regex)],
            ("Prefix", false) => {
                // Prefix matches whole path elements: /foo serves /foo and
                // /foo/..., never /foobar.
                let trimmed = path.trim_end_matches('/');
                if trimmed.is_empty() {
                    vec![one(self, "/".into(), Match::Prefix)]
                } else {
                    vec![
                        one(self, trimmed.to_string(), Match::Exact),
                        one(self, format!("{trimmed}/"), Match::Prefix),
                    ]
                }
            }
            ("Prefix", true) => vec![one(self, format!("^{}", path.trim_end_matches('/')), Match::Regex)],
            ("ImplementationSpecific", false) => vec![one(self, path, Match::Prefix)],
            ("ImplementationSpecific", true) => vec![one(self, format!("^{path}"), Match::Regex)],
            (other, _) => {
                self.report(
                    ing,
                    "spec.rules.http.paths.pathType",
                    format!("unknown pathType {other:?}"),
                );
                return None;
            }
        })
    }

    fn insert(&mut self, ing: &Ingress, host: &str, conflict: (String, String), locs: Vec<Location>) {
        let server = self.servers.entry(host.to_string()).or_default();
        if let Some(existing) = server.locations.get(&conflict) {
            let owner = existing.first().map(|l| l.ingress.clone()).unwrap_or_default();
            let reason = format!(
                "host {host} path {} ({}) is already served by Ingress {owner}; ignored",
                conflict.0, conflict.1
            );
            self.report(ing, "spec.rules", reason);
            return;
        }
        server.locations.insert(conflict, locs);
    }

    fn location(&mut self, id: usize, ing: &str, path: &str, m: Match, backend: String, a: &Annotations) -> Location {
        let g = &self.global;
        let error_backend = match &a.default_backend {
            Some(svc) => {
                let ns = ing.split('/').next().unwrap_or("default").to_string();
                let name = format!("custom-default-backend-{ns}-{svc}");
                self.backends.entry(name.clone()).or_insert_with(|| BackendRef {
                    namespace: ns,
                    service: svc.clone(),
                    port: PortRef::Number(-1),
                    annotations: Annotations::default(),
                    canary: false,
                });
                Some(name)
            }
            None => self
                .opts
                .default_backend_service
                .as_ref()
                .map(|_| DEFAULT_BACKEND.to_string()),
        };
        let codes = if a.custom_http_errors.is_empty() {
            &g.custom_http_errors
        } else {
            &a.custom_http_errors
        };
        let error_pages = match &error_backend {
            Some(eb) => codes
                .iter()
                .map(|c| ErrorPage {
                    name: format!("@custom_{eb}_{c}"),
                    code: *c,
                    backend: eb.clone(),
                })
                .collect(),
            None => Vec::new(),
        };
        Location {
            path: path.to_string(),
            match_: m,
            backend,
            ingress: ing.to_string(),
            id,
            rewrite_target: a.rewrite_target.clone(),
            ssl_redirect: a.ssl_redirect.unwrap_or(g.ssl_redirect),
            force_ssl_redirect: a.force_ssl_redirect,
            app_root: a.app_root.clone(),
            redirect: a
                .permanent_redirect
                .clone()
                .or_else(|| a.temporal_redirect.clone())
                .map(|(url, code)| (code, url)),
            proxy_body_size: a.proxy_body_size.clone().unwrap_or_else(|| g.proxy_body_size.clone()),
            proxy_connect_timeout: a.proxy_connect_timeout.unwrap_or(g.proxy_connect_timeout),
            proxy_read_timeout: a.proxy_read_timeout.unwrap_or(g.proxy_read_timeout),
            proxy_send_timeout: a.proxy_send_timeout.unwrap_or(g.proxy_send_timeout),
            proxy_next_upstream: a
                .proxy_next_upstream
                .clone()
                .unwrap_or_else(|| g.proxy_next_upstream.clone()),
            proxy_next_upstream_tries: a.proxy_next_upstream_tries.unwrap_or(g.proxy_next_upstream_tries),
            proxy_buffering: a.proxy_buffering.unwrap_or(g.proxy_buffering),
            backend_protocol: a.backend_protocol,
            upstream_vhost: a.upstream_vhost.clone(),
            cors: a.cors.clone(),
            allow: a.allow_source_range.clone(),
            deny: a.deny_source_range.clone(),
            limit_rps: a.limit_rps,
            limit_connections: a.limit_connections,
            error_pages,
            snippet: a.configuration_snippet.clone(),
        }
    }

    /// Writes nothing: returns the file name a TLS Secret will have and
    /// records its PEM. The name carries a content hash, so a renewed
    /// certificate is a new file and the reload that loads it is explicit.
    fn certificate(&mut self, ing: &Ingress, secret: &str) -> Option<String> {
        let ns = ing.metadata.namespace.as_deref().unwrap_or("default");
        let found = self.snap.secrets.iter().find(|s| {
            s.metadata.namespace.as_deref().unwrap_or("default") == ns && s.metadata.name.as_deref() == Some(secret)
        });
        let data = found.and_then(|s| s.data.as_ref());
        let (Some(crt), Some(key_pem)) = (data.and_then(|d| d.get("tls.crt")), data.and_then(|d| d.get("tls.key")))
        else {
            self.report(
                ing,
                "spec.tls.secretName",
                format!("Secret {ns}/{secret} is missing or has no tls.crt/tls.key"),
            );
            return None;
        };
        let looks_pem = |b: &[u8]| b.starts_with(b"-----BEGIN ") && b.is_ascii();
        if !looks_pem(&crt.0) || !looks_pem(&key_pem.0) || !is_object_name(secret) {
            self.report(
                ing,
                "spec.tls.secretName",
                format!("Secret {ns}/{secret} does not hold PEM data"),
            );
            return None;
        }
        let mut pem = crt.0.clone();
        if !pem.ends_with(b"\n") {
            pem.push(b'\n');
        }
        pem.extend_from_slice(&key_pem.0);
        let digest = Sha256::digest(&pem);
        let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
        let file = format!("{ns}-{secret}-{hex}.pem");
        self.certificates.insert(file.clone(), pem);
        Some(file)
    }

    fn add_canary(&mut self, ing: &Ingress, a: &Annotations) {
        let Some(spec) = &ing.spec else { return };
        for rule in spec.rules.iter().flatten() {
            let host = rule
                .host
                .as_deref()
                .filter(|h| !h.is_empty())
                .unwrap_or("_")
                .to_ascii_lowercase();
            for path in rule.http.iter().flat_map(|h| h.paths.iter()) {
                let conflict = (path.path.clone().unwrap_or_else(|| "/".into()), path.path_type.clone());
                let primary = self
                    .servers
                    .get(&host)
                    .and_then(|s| s.locations.get(&conflict))
                    .and_then(|l| l.first())
                    .map(|l| l.backend.clone());
                let Some(primary) = primary else {
                    self.report(
                        ing,
                        "canary",
                        format!(
                            "no primary Ingress serves host {host} path {}; canary ignored",
                            conflict.0
                        ),
                    );
                    continue;
                };
                let Some(canary) = self.backend_ref(ing, &path.backend, a, true) else {
                    continue;
                };
                if !self.backends.get(&canary).is_some_and(|b| b.canary) {
                    self.report(
                        ing,
                        "canary",
                        format!("backend {canary} already serves as a primary; canary ignored"),
                    );
                    continue;
                }
                if canary == primary {
                    continue;
                }
                self.alternatives.entry(primary).or_default().insert(canary);
            }
        }
    }

    fn finish(mut self) -> Model {
        let default = self.opts.default_backend_service.clone();
        if let Some((ns, svc)) = &default {
            self.backends.insert(
                DEFAULT_BACKEND.to_string(),
                BackendRef {
                    namespace: ns.clone(),
                    service: svc.clone(),
                    port: PortRef::Number(-1),
                    annotations: Annotations::default(),
                    canary: false,
                },
            );
        }
        self.servers.entry("_".to_string()).or_default();
        let servers: Vec<Server> = std::mem::take(&mut self.servers)
            .into_iter()
            .map(|(hostname, acc)| server(hostname, acc))
            .collect();
        let backends = self.wire_backends(&servers);
        Model {
            structure: Some(Structure {
                global: self.global,
                listen: self.opts.listen.clone(),
                servers,
                has_default_backend: default.is_some(),
            }),
            backends,
            certificates: self.certificates,
            problems: self.problems,
        }
    }

    fn wire_backends(&mut self, servers: &[Server]) -> BTreeMap<String, wire::Backend> {
        let mut out = BTreeMap::new();
        // Indexes, so resolving N backends stays O(N) rather than O(N²)
        // against thousands of Services and EndpointSlices.
        let ns_of = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            m.namespace.clone().unwrap_or_else(|| "default".into())
        };
        let services: HashMap<(String, String), &Service> = self
            .snap
            .services
            .iter()
            .map(|s| ((ns_of(&s.metadata), s.metadata.name.clone().unwrap_or_default()), s))
            .collect();
        let mut slices: HashMap<(String, String), Vec<&EndpointSlice>> = HashMap::new();
        for slice in &self.snap.slices {
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
        for (name, r) in std::mem::take(&mut self.backends) {
            let svc_key = (r.namespace.clone(), r.service.clone());
            let svc = services.get(&svc_key).copied();
            let port = svc.and_then(|s| match &r.port {
                PortRef::Number(-1) => s.spec.as_ref()?.ports.as_ref()?.first(),
                p => p.find(s),
            });
            let object = format!("Service {}/{}", r.namespace, r.service);
            let endpoints = match (svc, port) {
                (Some(svc), Some(port)) => endpoints::resolve(
                    svc,
                    port,
                    slices.get(&svc_key).map_or(&[][..], Vec::as_slice),
                    r.annotations.service_upstream,
                ),
                (Some(_), None) => {
                    self.problems.push(Report {
                        object,
                        what: "port".into(),
                        reason: format!("has no port {}; backend {name} has no endpoints", r.port.suffix()),
                    });
                    Vec::new()
                }
                (None, _) => {
                    self.problems.push(Report {
                        object,
                        what: "service".into(),
                        reason: format!("not found; backend {name} has no endpoints"),
                    });
                    Vec::new()
                }
            };
            let external = svc.and_then(|s| s.spec.as_ref()).and_then(|s| s.type_.as_deref()) == Some("ExternalName");
            let a = &r.annotations;
            let mut b = wire::Backend {
                name: name.clone(),
                service: external.then(|| serde_json::json!({ "spec": { "type": "ExternalName" } })),
                port: match &r.port {
                    PortRef::Number(n) => wire::ServicePort::Number(i64::from((*n).max(0))),
                    PortRef::Name(s) => wire::ServicePort::Name(s.clone()),
                },
                endpoints,
                load_balance: a
                    .load_balance
                    .clone()
                    .unwrap_or_else(|| self.global.load_balance.clone()),
                no_server: r.canary,
                alternative_backends: self
                    .alternatives
                    .get(&name)
                    .map(|s| s.iter().cloned().collect())
                    .unwrap_or_default(),
                ..Default::default()
            };
            b.upstream_hash_by.hash_by = a.upstream_hash_by.clone().unwrap_or_default();
            b.upstream_hash_by.subset = a.upstream_hash_by_subset;
            b.upstream_hash_by.subset_size =
                a.upstream_hash_by_subset_size
                    .unwrap_or(if a.upstream_hash_by_subset { 3 } else { 0 });
            if let Some(c) = a.canary.as_ref().filter(|_| r.canary) {
                b.traffic_shaping = wire::TrafficShapingPolicy {
                    weight: c.weight,
                    weight_total: c.weight_total,
                    header: c.by_header.clone(),
                    header_value: c.by_header_value.clone(),
                    header_pattern: c.by_header_pattern.clone(),
                    cookie: c.by_cookie.clone(),
                };
            }
            if let Some(aff) = &a.affinity {
                let cookie = &mut b.session_affinity.cookie;
                b.session_affinity.name = "cookie".into();
                b.session_affinity.mode = aff.mode.clone();
                cookie.name = aff.cookie_name.clone();
                cookie.path = aff.path.clone();
                cookie.domain = aff.domain.clone();
                cookie.expires = aff.expires.clone();
                cookie.maxage = aff.max_age.clone();
                cookie.secure = aff.secure;
                cookie.samesite = aff.samesite.clone();
                cookie.conditional_samesite_none = aff.conditional_samesite_none;
                cookie.change_on_failure = aff.change_on_failure;
                for s in servers {
                    for l in s
                        .locations
                        .iter()
                        .filter(|l| l.backend == name && l.match_ != Match::Regex)
                    {
                        cookie
                            .locations
                            .entry(s.hostname.clone())
                            .or_default()
                            .push(l.path.clone());
                    }
                }
            }
            out.insert(name, b);
        }
        out
    }
}

/// Orders a server's locations (longest path first, which is what regex
/// locations need; prefix and exact ones are order-free in nginx) and
/// collects the named error locations they use.
fn server(hostname: String, acc: ServerAcc) -> Server {
    let tls = acc.tls;
    let mut locations: Vec<Location> = acc.locations.into_values().flatten().collect();
    for l in &mut locations {
        l.ssl_redirect &= tls.is_some();
    }
    locations.sort_by(|a, b| b.path.len().cmp(&a.path.len()).then_with(|| b.path.cmp(&a.path)));
    let mut error_pages: Vec<ErrorPage> = locations.iter().flat_map(|l| l.error_pages.iter().cloned()).collect();
    error_pages.sort_by(|a, b| a.name.cmp(&b.name));
    error_pages.dedup_by(|a, b| a.name == b.name);
    let covers_root = locations
        .iter()
        .any(|l| (l.match_ == Match::Prefix && l.path == "/") || (l.match_ == Match::Regex && l.path == "^/"));
    Server {
        hostname,
        aliases: acc.aliases,
        tls,
        locations,
        snippet: acc.snippet,
        error_pages,
        fallback: !covers_root,
    }
}
