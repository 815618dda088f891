//! The model builder: a pure function from [`Snapshot`] to [`Model`].
//!
//! Ingresses are visited oldest first; whatever two of them both claim (a
//! host and path, a server alias, a backend name) goes to the older one, so
//! a newer Ingress, perhaps another tenant's, can never take it over.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressRule};
use sha2::{Digest, Sha256};

use super::annotations::{Annotations, Problem};
use super::backends::{self, BackendRef};
use super::class::ClassFilter;
use super::config_map::GlobalConfig;
use super::endpoints::{AddressPolicy, PortRef};
use super::names::{BackendId, Names};
use super::values::{is_object_name, Host, PathRegex, UrlPath};
use super::{
    tls, ErrorPage, Listen, Location, Match, MetricLabels, Model, Quarantine, Report, Server, ServerNamesHash,
    Structure, DEFAULT_BACKEND,
};
use crate::snapshot::{key, Snapshot};

mod aliases;
mod canary;
mod stream;
mod www_redirect;

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub class: ClassFilter,
    /// `--allow-snippet-annotations` (the ConfigMap key can also allow them).
    pub allow_snippets: bool,
    /// What allowed snippets may do (`--snippet-allowed-path`).
    pub snippet_policy: super::snippet::Policy,
    /// `--default-backend-service namespace/name`.
    pub default_backend_service: Option<(String, String)>,
    /// `--default-ssl-certificate namespace/name`: the TLS Secret served to
    /// handshakes no host's certificate matches (else the generated one).
    pub default_ssl_certificate: Option<(String, String)>,
    /// `--watch-namespace`; `None` watches all.
    pub namespace: Option<String>,
    pub listen: Listen,
    /// Which endpoint addresses are accepted.
    pub endpoints: AddressPolicy,
    /// DNS servers for names nginx resolves per request (an `auth-url`
    /// host): `--resolver`, else `/etc/resolv.conf`'s.
    pub resolvers: Vec<std::net::IpAddr>,
    /// The ports no `tcp-services`/`udp-services` entry may take.
    pub stream_reserved: super::l4_services::ReservedPorts,
    /// `--enable-ssl-passthrough`: `stream {}` takes the HTTPS port, routes
    /// passthrough hosts by SNI and every other connection to the HTTP
    /// servers' TLS listener.
    pub ssl_passthrough: bool,
    /// `--gateway-controller-name`: the GatewayClasses served.
    pub gateway_controller_name: String,
    /// `--gateway-base-port` (see [`crate::gateway::translate`]).
    pub gateway_base_port: u16,
}

impl Default for BuildOptions {
    /// ingress-nginx's defaults: class `nginx` of `k8s.io/ingress-nginx`,
    /// every namespace, ports 80, 443 and 10246 on all addresses, no
    /// snippets, no default backend, local endpoints refused.
    fn default() -> Self {
        BuildOptions {
            class: ClassFilter {
                class: "nginx".into(),
                controller: "k8s.io/ingress-nginx".into(),
                without_class: false,
            },
            allow_snippets: false,
            snippet_policy: super::snippet::Policy::default(),
            default_backend_service: None,
            default_ssl_certificate: None,
            namespace: None,
            listen: Listen {
                address: "0.0.0.0".into(),
                http_port: 80,
                https_port: 443,
                api_port: 10246,
            },
            endpoints: AddressPolicy::default(),
            resolvers: Vec::new(),
            stream_reserved: super::l4_services::ReservedPorts {
                http: 80,
                https: 443,
                api: 10246,
                metrics: 10254,
                webhook: None,
            },
            ssl_passthrough: false,
            gateway_controller_name: crate::gateway::translate::CONTROLLER_NAME.into(),
            gateway_base_port: 0,
        }
    }
}

#[derive(Default)]
struct ServerAcc {
    aliases: Vec<Host>,
    /// Age rank and `namespace/name` of the Ingress whose annotations gave
    /// the aliases and the snippet (the first one to define the host).
    owner: Option<(usize, String)>,
    tls: Option<String>,
    snippet: Option<super::snippet::Snippet>,
    /// The owner's `auth-tls-secret`, read (or why it cannot be).
    client_auth: Option<Result<super::client_auth::ClientAuth, String>>,
    /// Locations by their conflict key `(path, pathType)`.
    locations: BTreeMap<(String, String), Vec<Location>>,
    /// Every rendered `location` (match and path) and its Ingress: two
    /// Ingress paths can render the same nginx location (`Exact /a` and
    /// `Prefix /a`), which nginx refuses as a duplicate.
    rendered: BTreeMap<(Match, String), String>,
}

struct Builder<'s> {
    snap: &'s Snapshot,
    opts: &'s BuildOptions,
    global: GlobalConfig,
    /// The policy snippets are judged by, when they are allowed at all.
    snippets: Option<&'s super::snippet::Policy>,
    servers: BTreeMap<String, ServerAcc>,
    backends: BTreeMap<String, BackendRef>,
    names: Names,
    certificates: BTreeMap<String, tls::Pair>,
    problems: Vec<Report>,
    regex_hosts: BTreeSet<String>,
    /// Primary backend → its canary backends.
    alternatives: BTreeMap<String, BTreeSet<String>>,
    /// Basic-auth user files by name.
    auth_files: BTreeMap<String, String>,
    /// `from-to-www-redirect`: (host, Ingress) in age order.
    www_requests: Vec<(String, String)>,
    /// Numbers the external-auth locations (each gets its own internal
    /// location and, with keepalive, upstream block).
    auth_seq: usize,
    /// `ssl-passthrough` hosts → the backend of their `/` path.
    passthrough: BTreeMap<String, String>,
    /// Services the layer-4 ports were checked against.
    structural_services: BTreeSet<super::ServiceKey>,
}

/// Builds with nothing quarantined.
pub fn build(snap: &Snapshot, opts: &BuildOptions) -> Model {
    build_with(snap, opts, &Quarantine::default())
}

/// Builds the model, leaving out the Ingresses in `quarantine` whose
/// fingerprint has not changed since nginx refused them.
pub fn build_with(snap: &Snapshot, opts: &BuildOptions, quarantine: &Quarantine) -> Model {
    let (global, config_problems) = snap
        .config_map
        .as_ref()
        .map(|cm| GlobalConfig::parse(&cm.data.clone().unwrap_or_default()))
        .unwrap_or_default();
    let mut b = Builder {
        snap,
        opts,
        snippets: (opts.allow_snippets || global.allow_snippet_annotations).then_some(&opts.snippet_policy),
        global,
        servers: BTreeMap::new(),
        backends: BTreeMap::new(),
        names: Names::default(),
        certificates: BTreeMap::new(),
        problems: Vec::new(),
        regex_hosts: BTreeSet::new(),
        alternatives: BTreeMap::new(),
        auth_files: BTreeMap::new(),
        www_requests: Vec::new(),
        auth_seq: 0,
        passthrough: BTreeMap::new(),
        structural_services: BTreeSet::new(),
    };
    if let Some(cm) = &snap.config_map {
        b.report_all(&format!("ConfigMap {}", key(&cm.metadata)), config_problems);
    }
    // Before any Ingress: layer-4 backend names are the operator's.
    let stream_servers = b.add_stream_services();

    let mut fingerprints = BTreeMap::new();
    let mut parsed: Vec<(&Ingress, Arc<Annotations>)> = Vec::new();
    for ing in b.ours() {
        let ing_key = key(&ing.metadata);
        let print = fingerprint(snap, ing);
        fingerprints.insert(ing_key.clone(), print.clone());
        if let Some(q) = quarantine.0.get(&ing_key).filter(|q| q.fingerprint == print) {
            b.report(
                ing,
                "quarantine",
                format!(
                    "left out of nginx.conf because nginx refused the configuration it produces ({}); any change to it is tried again",
                    q.reason
                ),
            );
            continue;
        }
        let raw = ing.metadata.annotations.clone().unwrap_or_default();
        let (a, problems) = Annotations::parse(&raw, b.snippets);
        b.report_all(&format!("Ingress {ing_key}"), problems);
        parsed.push((ing, Arc::new(a)));
    }

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
    let gateways = b.add_gateways();
    let mut model = b.finish();
    if let Some(structure) = &mut model.structure {
        let structure = Arc::make_mut(structure);
        structure.stream_servers = stream_servers;
        let (stream, http): (Vec<_>, Vec<_>) = gateways.servers.into_iter().partition(|g| g.protocol.is_stream());
        // Gateway servers send HTTP/2 cleartext backends' requests
        // (GRPCRoutes) through the gRPC balancer, there from their first
        // server on so that the first GRPCRoute needs no reload.
        if !http.is_empty() {
            let h2c = super::upstream_kind::UpstreamKind {
                protocol: crate::model::annotations::BackendProtocol::Grpc,
                server_name: None,
            };
            structure.balancers.insert(h2c.upstream());
        }
        structure.gateway_servers = http;
        structure.gateway_stream_servers = stream;
    }
    model.routes = Arc::new(gateways.table);
    model.fingerprints = Arc::new(fingerprints);
    model
}

/// What an Ingress's rendering depends on: its annotations and spec, and
/// the TLS Secrets it names. A quarantined Ingress is tried again as soon
/// as any of these changes.
pub fn fingerprint(snap: &Snapshot, ing: &Ingress) -> String {
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(&ing.metadata.annotations).unwrap_or_default());
    h.update(serde_json::to_vec(&ing.spec).unwrap_or_default());
    let ns = ing.metadata.namespace.as_deref().unwrap_or("default");
    for secret in ing
        .spec
        .iter()
        .flat_map(|s| s.tls.iter().flatten())
        .filter_map(|t| t.secret_name.as_deref())
    {
        let found = snap.secrets.iter().find(|s| {
            s.metadata.namespace.as_deref().unwrap_or("default") == ns && s.metadata.name.as_deref() == Some(secret)
        });
        h.update(secret.as_bytes());
        h.update(serde_json::to_vec(&found.map(|s| &s.data)).unwrap_or_default());
    }
    h.finalize().iter().take(12).map(|b| format!("{b:02x}")).collect()
}

impl<'s> Builder<'s> {
    /// The Gateway API objects this controller owns: their route table and
    /// servers; their Service ports become backends like an Ingress's
    /// (claimed after every Ingress's, so Ingress backend names carry over).
    fn add_gateways(&mut self) -> crate::gateway::translate::GatewayModel {
        let (snap, opts) = (self.snap, self.opts);
        // The controller's own ports and those of `tcp-services` and
        // `udp-services`: a Gateway port on one would fail nginx's bind
        // for everyone.
        let reserved = super::l4_services::gateway_reserved(&opts.stream_reserved, snap);
        let mut claimed = Vec::new();
        let names = &mut self.names;
        let model = crate::gateway::translate::translate(
            snap,
            &opts.gateway_controller_name,
            opts.gateway_base_port,
            &reserved,
            |r| {
                let name = names.claim(match &r.session {
                    None => BackendId::Service {
                        namespace: r.namespace.clone(),
                        service: r.name.clone(),
                        port: r.port.to_string(),
                    },
                    Some(session) => BackendId::GatewaySession {
                        namespace: r.namespace.clone(),
                        service: r.name.clone(),
                        port: r.port.to_string(),
                        session: session.digest(),
                    },
                });
                claimed.push((name.clone(), r.clone()));
                name
            },
        );
        for (id, pair) in &model.certificates {
            self.certificates.insert(id.clone(), pair.clone());
        }
        for (name, r) in claimed {
            self.backends.entry(name).or_insert_with(|| BackendRef {
                namespace: r.namespace,
                service: r.name,
                port: PortRef::Number(i32::from(r.port)),
                annotations: Default::default(),
                canary: false,
                session: r.session.map(|s| s.affinity),
            });
        }
        for (object, reason) in &model.problems {
            self.problems.push(Report {
                object: object.clone(),
                what: "gateway".into(),
                reason: reason.clone(),
            });
        }
        model
    }

    fn report_all(&mut self, object: &str, problems: Vec<Problem>) {
        for p in problems {
            self.problems.push(Report {
                object: object.to_string(),
                what: p.annotation,
                reason: p.reason,
            });
        }
    }

    /// The headers of the set `key` (`add-headers`, `proxy-set-headers`)
    /// names: a ConfigMap of the controller's own namespace. Problems are
    /// reported; a missing set adds nothing.
    fn header_set(&mut self, r: Option<super::header_sets::SetRef>, setting: &str) -> Vec<super::header_sets::Header> {
        let (Some(r), Some(own)) = (r, self.snap.config_map.clone()) else {
            return Vec::new();
        };
        let own_ns = own.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let object = format!("ConfigMap {}", key(&own.metadata));
        let what = format!("ConfigMap key {setting}");
        if r.namespace.as_deref().is_some_and(|ns| ns != own_ns) {
            self.problems.push(Report {
                object,
                what,
                reason: format!("only ConfigMaps of the controller's namespace {own_ns} are read; ignored"),
            });
            return Vec::new();
        }
        let Some(cm) = self.find_header_set(&r.name, &own_ns) else {
            self.problems.push(Report {
                object,
                what,
                reason: format!("ConfigMap {own_ns}/{} not found; no headers", r.name),
            });
            return Vec::new();
        };
        let (headers, problems) = super::header_sets::headers(cm);
        for p in problems {
            self.problems.push(Report {
                object: format!("ConfigMap {}", key(&cm.metadata)),
                what: format!("{setting} header"),
                reason: p,
            });
        }
        headers
    }

    /// The ConfigMap `namespace/name` among the header sets.
    fn find_header_set(&self, name: &str, namespace: &str) -> Option<&'s k8s_openapi::api::core::v1::ConfigMap> {
        let snap: &'s Snapshot = self.snap;
        snap.header_config_maps
            .iter()
            .find(|c| {
                c.metadata.name.as_deref() == Some(name)
                    && c.metadata.namespace.as_deref().unwrap_or("default") == namespace
            })
            .map(|c| &**c)
    }

    /// A header set an annotation of `ing` names (`custom-headers`,
    /// `auth-proxy-set-headers`): a ConfigMap of the controller's
    /// namespace; with `allowed`, only the names it lists (lower case).
    /// Problems are reported once; refused headers are left out.
    fn header_set_for(
        &mut self,
        ing: &str,
        annotation: &str,
        r: &super::header_sets::SetRef,
        allowed: Option<&[String]>,
    ) -> (Vec<super::header_sets::Header>, bool) {
        let own_ns = self
            .snap
            .config_map
            .as_ref()
            .and_then(|c| c.metadata.namespace.clone())
            .unwrap_or_else(|| "ingress-nginx".into());
        if r.namespace.as_deref().is_some_and(|ns| ns != own_ns) {
            let why = format!("only ConfigMaps of the controller's namespace {own_ns} are read; ignored");
            self.report_once(ing, annotation, why);
            return (Vec::new(), false);
        }
        let Some(cm) = self.find_header_set(&r.name, &own_ns) else {
            self.report_once(
                ing,
                annotation,
                format!("ConfigMap {own_ns}/{} not found; no headers", r.name),
            );
            return (Vec::new(), false);
        };
        let (headers, problems) = super::header_sets::headers(cm);
        let whole = problems.is_empty();
        for p in problems {
            self.report_once(ing, annotation, p);
        }
        let Some(allowed) = allowed else {
            return (headers, whole);
        };
        let (kept, refused): (Vec<_>, Vec<_>) = headers
            .into_iter()
            .partition(|h| allowed.contains(&h.name.as_str().to_ascii_lowercase()));
        let whole = whole && refused.is_empty();
        for h in refused {
            let why = format!(
                "{} is not in the ConfigMap's global-allowed-response-headers; left out",
                h.name.as_str()
            );
            self.report_once(ing, annotation, why);
        }
        (kept, whole)
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
            .map(|i| &**i)
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
        a: &Arc<Annotations>,
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
        let name = self.names.claim(BackendId::Service {
            namespace: ns.clone(),
            service: svc.name.clone(),
            port: port.suffix(),
        });
        self.backends.entry(name.clone()).or_insert_with(|| BackendRef {
            namespace: ns,
            service: svc.name.clone(),
            port,
            annotations: a.clone(),
            canary,
            session: None,
        });
        Some(name)
    }

    fn add_primary(&mut self, id: usize, ing: &Ingress, a: &Arc<Annotations>) {
        let Some(spec) = &ing.spec else { return };
        let ing_key = key(&ing.metadata);
        for t in spec.tls.iter().flatten() {
            let Some(secret) = t.secret_name.as_deref() else {
                continue;
            };
            let Some(id) = self.certificate(ing, secret) else {
                continue;
            };
            for host in t.hosts.iter().flatten() {
                match Host::parse(host) {
                    Ok(h) => {
                        let server = self.servers.entry(h.as_str().to_string()).or_default();
                        server.tls.get_or_insert_with(|| id.clone());
                    }
                    Err(e) => self.report(ing, "spec.tls.hosts", e.0),
                }
            }
        }
        let rules = spec.rules.as_deref().unwrap_or_default();
        if rules.is_empty() {
            if let Some(db) = &spec.default_backend {
                if let Some(backend) = self.backend_ref(ing, db, a, false) {
                    let loc = self.location(id, &ing_key, "_", "/", "/", Match::Prefix, backend, a);
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
            if a.from_to_www_redirect {
                self.www_requests.push((host.clone(), ing_key.clone()));
            }
            let owns = self.servers.get(&host).is_none_or(|s| s.owner.is_none());
            let client_auth = match &a.auth_tls {
                Some(r) if owns => Some(self.client_auth(&ing_key, r)),
                _ => None,
            };
            let server = self.servers.entry(host.clone()).or_default();
            if server.owner.is_none() {
                server.owner = Some((id, ing_key.clone()));
                server.aliases = a.server_alias.clone();
                server.snippet = a.server_snippet.clone();
                server.client_auth = client_auth;
            }
            if a.ssl_passthrough {
                self.add_passthrough(ing, a, &host, rule);
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

    /// `ssl-passthrough` on one rule: its host's TLS goes, unterminated, to
    /// the backend of its `/` path. Only the Ingress that owns the host
    /// (the oldest to define it) decides; the catch-all host cannot pass
    /// through, as SNI names a host.
    fn add_passthrough(&mut self, ing: &Ingress, a: &Arc<Annotations>, host: &str, rule: &IngressRule) {
        let ing_key = key(&ing.metadata);
        if !self.opts.ssl_passthrough {
            self.report(
                ing,
                "ssl-passthrough",
                "ignored: the controller runs without --enable-ssl-passthrough",
            );
            return;
        }
        if host == "_" {
            self.report(
                ing,
                "ssl-passthrough",
                "ignored on a rule without a host (SNI names a host)",
            );
            return;
        }
        let owner = self
            .servers
            .get(host)
            .and_then(|s| s.owner.as_ref())
            .map(|o| o.1.clone());
        if owner.as_deref() != Some(ing_key.as_str()) {
            self.report(
                ing,
                "ssl-passthrough",
                format!(
                    "ignored for {host}: the host belongs to Ingress {}",
                    owner.unwrap_or_default()
                ),
            );
            return;
        }
        let root = rule
            .http
            .iter()
            .flat_map(|h| h.paths.iter())
            .find(|p| p.path.as_deref().unwrap_or("/") == "/");
        let Some(path) = root else {
            self.report(
                ing,
                "ssl-passthrough",
                format!("ignored for {host}: no path \"/\" names the backend"),
            );
            return;
        };
        if let Some(backend) = self.backend_ref(ing, &path.backend, a, false) {
            self.passthrough.entry(host.to_string()).or_insert(backend);
        }
    }

    /// The nginx locations for one Ingress path. ingress-nginx's rules: a
    /// Prefix path `/a` matches whole path elements (`location = /a` plus
    /// `location /a/`); on a host in regex mode every path is a
    /// case-insensitive regex anchored at the start, kept as written, so
    /// that `/a/` and `/a` stay distinct and the longer one is tried first.
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
        let one =
            |b: &mut Self, at: String, m: Match| b.location(id, &ing_key, host, &at, &path, m, backend.clone(), a);
        Some(match (path_type, regex) {
            ("Exact", false) => vec![one(self, path.clone(), Match::Exact)],
            ("Exact", true) => vec![one(self, format!("^{path}$"), Match::Regex)],
            ("Prefix", false) => {
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
            ("Prefix", true) => vec![one(self, format!("^{path}"), Match::Regex)],
            ("ImplementationSpecific", false) => vec![one(self, path.clone(), Match::Prefix)],
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

    /// Adds one Ingress path's locations to a server. The older Ingress
    /// keeps a path both claim. A Prefix path's extra exact location gives
    /// way silently to an explicit Exact path (as in ingress-nginx).
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
        let companion = conflict.1 == "Prefix" && locs.len() == 2;
        let mut kept = Vec::new();
        let mut clash = None;
        for (i, l) in locs.into_iter().enumerate() {
            let rendered = (l.match_.clone(), l.path.clone());
            match server.rendered.get(&rendered) {
                Some(_) if companion && i == 0 => {}
                Some(owner) => clash = Some((l.path.clone(), owner.clone())),
                None => kept.push(l),
            }
        }
        if let Some((path, owner)) = clash {
            let reason = format!(
                "host {host} path {} ({}) renders location {path}, which Ingress {owner} already has; ignored",
                conflict.0, conflict.1
            );
            self.report(ing, "spec.rules", reason);
            return;
        }
        for l in &kept {
            server
                .rendered
                .insert((l.match_.clone(), l.path.clone()), l.ingress.clone());
        }
        server.locations.insert(conflict, kept);
    }

    #[allow(clippy::too_many_arguments)]
    fn location(
        &mut self,
        id: usize,
        ing: &str,
        host: &str,
        path: &str,
        ingress_path: &str,
        m: Match,
        backend: String,
        a: &Annotations,
    ) -> Location {
        let (basic_auth, mut auth_refused) = match &a.basic_auth {
            Some(r) => match self.basic_auth(ing, r) {
                Ok(b) => (Some(b), None),
                Err(why) => (None, Some(why)),
            },
            None => (None, None),
        };
        if let Some(why) = self.client_auth_refused(ing, host, a) {
            auth_refused = auth_refused.or(Some(why));
        }
        let custom_headers = match &a.custom_headers {
            Some(r) => {
                let allowed = self.global.allowed_response_headers.clone();
                self.header_set_for(ing, "custom-headers", r, Some(&allowed)).0
            }
            None => Vec::new(),
        };
        let mirror = a.mirror.as_ref().and_then(|m| {
            self.auth_seq += 1;
            m.resolve(host, self.auth_seq, &self.opts.endpoints)
                .and_then(|m| {
                    if m.needs_resolver && self.opts.resolvers.is_empty() {
                        Err(
                            "mirror-target names a host and no DNS server is known (--resolver, /etc/resolv.conf)"
                                .into(),
                        )
                    } else {
                        Ok(m)
                    }
                })
                .map_err(|why| self.report_once(ing, "mirror-target", format!("{why}; not mirrored")))
                .ok()
        });
        let external_auth = match self.external_auth(ing, host, ingress_path, a) {
            Ok(e) => e,
            Err(why) => {
                auth_refused = auth_refused.or(Some(why));
                None
            }
        };
        let g = &self.global;
        let error_backend = match &a.default_backend {
            Some(svc) => {
                let ns = ing.split('/').next().unwrap_or("default").to_string();
                let name = self.names.claim(BackendId::CustomDefault {
                    namespace: ns.clone(),
                    service: svc.clone(),
                });
                self.backends.entry(name.clone()).or_insert_with(|| BackendRef {
                    namespace: ns,
                    service: svc.clone(),
                    port: PortRef::Number(-1),
                    annotations: Default::default(),
                    canary: false,
                    session: None,
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
        let (namespace, name) = ing.split_once('/').unwrap_or(("", ing));
        let metrics = MetricLabels {
            namespace: namespace.to_string(),
            ingress: name.to_string(),
            service: self
                .backends
                .get(&backend)
                .map(|b| b.service.clone())
                .unwrap_or_default(),
            path: ingress_path.to_string(),
        };
        let mut proxy = a.proxy.clone();
        let blamed = proxy.first_buffer_annotation();
        if let Err(e) = proxy.settle_buffers(&g.proxy) {
            let report = Report {
                object: format!("Ingress {ing}"),
                what: format!("{}{blamed}", super::annotations::PREFIX),
                reason: format!("{e}; the buffer annotations are ignored"),
            };
            // A Prefix path renders two locations: one report.
            if !self.problems.contains(&report) {
                self.problems.push(report);
            }
        }
        let g = &self.global;
        let service_port = self.backends.get(&backend).map(|b| b.port.suffix()).unwrap_or_default();
        let otel = super::otel::for_location(
            &g.otel,
            a.enable_opentelemetry,
            a.opentelemetry_trust_incoming_span,
            a.opentelemetry_operation_name.as_ref(),
            &[
                ("service_name", metrics.service.as_str()),
                ("namespace", metrics.namespace.as_str()),
                ("ingress_name", metrics.ingress.as_str()),
                ("service_port", service_port.as_str()),
                ("location_path", ingress_path),
            ],
        );
        // ingress-nginx's force_no_ssl_redirect: the Ingress path starts
        // with one of `no-tls-redirect-locations` (ACME challenges).
        let no_tls_redirect = g
            .no_tls_redirect_locations
            .iter()
            .any(|prefix| ingress_path.starts_with(prefix.as_str()));
        Location {
            path: path.to_string(),
            match_: m,
            backend,
            ingress: ing.to_string(),
            metrics,
            id,
            closed: (!a.fails_closed.is_empty())
                .then(|| a.fails_closed.join(", "))
                .or(auth_refused),
            location_path: a.affinity.as_ref().map(|_| ingress_path.to_string()),
            rewrite_target: a.rewrite_target.clone(),
            ssl_redirect: a.ssl_redirect.unwrap_or(g.ssl_redirect) && !no_tls_redirect,
            force_ssl_redirect: a.force_ssl_redirect && !no_tls_redirect,
            preserve_trailing_slash: a.preserve_trailing_slash,
            use_port_in_redirects: a.use_port_in_redirects,
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
            proxy,
            connection_header: a.connection_header.clone(),
            x_forwarded_prefix: a.x_forwarded_prefix.clone(),
            basic_auth,
            satisfy_any: a.satisfy_any,
            custom_headers,
            mirror,
            relative_redirects: a.relative_redirects,
            external_auth,
            access_log: a.enable_access_log.unwrap_or(true),
            otel,
            rewrite_log: a.enable_rewrite_log,
            intercept_errors: !error_pages.is_empty() && !a.disable_proxy_intercept_errors,
            upstream: super::upstream_kind::UpstreamKind {
                protocol: a.backend_protocol,
                server_name: a.proxy_ssl_server_name.then(|| a.proxy_ssl_name.clone()).flatten(),
            },
            upstream_vhost: a.upstream_vhost.clone(),
            cors: a.cors.clone(),
            allow: a.allow_source_range.clone(),
            deny: a.deny_source_range.clone(),
            limit_rps: a.limit_rps,
            limit_connections: a.limit_connections,
            limit_rpm: a.limit_rpm,
            limit_burst_multiplier: a.limit_burst_multiplier.unwrap_or(5),
            limit_allowlist: a.limit_allowlist.clone(),
            limit_rate: a.limit_rate,
            limit_rate_after: a.limit_rate_after,
            block_cidrs: if a.allow_source_range.is_empty() && a.deny_source_range.is_empty() {
                Vec::new()
            } else {
                g.http.block.cidrs.clone()
            },
            error_pages,
            snippet: a.configuration_snippet.clone(),
        }
    }

    /// Reads the CA bundle of an `auth-tls-secret` (of the Ingress's own
    /// namespace) into a file; an error is reported.
    fn client_auth(
        &mut self,
        ing: &str,
        r: &super::client_auth::AuthTlsRef,
    ) -> Result<super::client_auth::ClientAuth, String> {
        let ns = ing.split_once('/').map_or("default", |(ns, _)| ns);
        let (secret_ns, name) = r.secret.split_once('/').unwrap_or((ns, &r.secret));
        let result = if secret_ns != ns {
            Err(format!(
                "auth-tls-secret {} is in another namespace; only Secrets of the Ingress's own namespace are read",
                r.secret
            ))
        } else {
            let secret = self.snap.secrets.iter().find(|s| {
                s.metadata.namespace.as_deref().unwrap_or("default") == ns && s.metadata.name.as_deref() == Some(name)
            });
            match secret {
                None => Err(format!("auth-tls-secret {ns}/{name} not found")),
                Some(s) => super::client_auth::ca_bundle(s).map_err(|e| format!("auth-tls-secret {ns}/{name}: {e}")),
            }
        };
        match result {
            Ok(pem) => {
                let file = super::client_auth::file_name(ns, name, &pem);
                self.auth_files.insert(file.clone(), pem);
                Ok(super::client_auth::ClientAuth {
                    file,
                    verify_client: r.verify_client.clone(),
                    depth: r.depth,
                    error_page: r.error_page.clone(),
                    pass_certificate: r.pass_certificate,
                    match_cn: r.match_cn.clone(),
                    secret: format!("{ns}/{name}"),
                })
            }
            Err(why) => {
                self.report_once(ing, "auth-tls-secret", format!("{why}; the Ingress fails closed (503)"));
                Err(why)
            }
        }
    }

    /// Why a location of `ing` on `host` closes for client certificates:
    /// the host's owner could not read its Secret, or sets other ones than
    /// this Ingress asks for.
    fn client_auth_refused(&mut self, ing: &str, host: &str, a: &Annotations) -> Option<String> {
        let r = a.auth_tls.as_ref()?;
        let server = self.servers.get(host)?;
        let owner = server.owner.as_ref().map(|(_, o)| o.clone()).unwrap_or_default();
        let ns = ing.split_once('/').map_or("default", |(ns, _)| ns);
        let wanted = if r.secret.contains('/') {
            r.secret.clone()
        } else {
            format!("{ns}/{}", r.secret)
        };
        let why = match &server.client_auth {
            Some(Err(why)) => return Some(why.clone()),
            Some(Ok(ca)) if ca.secret == wanted => return None,
            Some(Ok(ca)) => format!(
                "host {host} verifies client certificates against {} (set by its first Ingress {owner}), not {wanted}",
                ca.secret
            ),
            None => format!(
                "host {host} does not ask for client certificates: its first Ingress {owner} sets no auth-tls-secret"
            ),
        };
        self.report_once(
            ing,
            "auth-tls-secret",
            format!("{why}; this Ingress's paths fail closed (503)"),
        );
        Some(why)
    }

    /// Reports a problem with an annotation of `ing` once (an Ingress path
    /// can render two locations).
    fn report_once(&mut self, ing: &str, annotation: &str, reason: String) {
        let report = Report {
            object: format!("Ingress {ing}"),
            what: format!("{}{annotation}", super::annotations::PREFIX),
            reason,
        };
        if !self.problems.contains(&report) {
            self.problems.push(report);
        }
    }

    /// The external authentication of a location: the Ingress's `auth-url`,
    /// else the ConfigMap's `global-auth-url` unless the Ingress opts out or
    /// the path is in `no-auth-locations`. An error (reported once) closes
    /// the location.
    fn external_auth(
        &mut self,
        ing: &str,
        host: &str,
        ingress_path: &str,
        a: &Annotations,
    ) -> Result<Option<super::external_auth::ExternalAuth>, String> {
        let g = &self.global;
        let (spec, what) = match &a.external_auth {
            Some(spec) => (spec, "auth-url"),
            None => {
                let global = a.enable_global_auth != Some(false)
                    && !g.no_auth_locations.iter().any(|p| ingress_path.starts_with(p.as_str()));
                if !global {
                    return Ok(None);
                }
                if let Some(why) = &g.global_auth_refused {
                    return Err(format!("global-auth-url is invalid ({why})"));
                }
                match &g.global_auth {
                    Some(spec) => (spec, "global-auth-url"),
                    None => return Ok(None),
                }
            }
        };
        self.auth_seq += 1;
        let resolved = spec.resolve(host, self.auth_seq, &self.opts.endpoints).and_then(|e| {
            if e.needs_resolver && self.opts.resolvers.is_empty() {
                Err(format!(
                    "{what} host {} is resolved per request and no DNS server is known (--resolver, /etc/resolv.conf)",
                    e.host_header
                ))
            } else {
                Ok(e)
            }
        });
        let headers_ref = spec.proxy_set_headers.clone();
        // Headers the auth service expects: a set not read whole closes the
        // location (access control not honoured as written).
        let resolved = resolved.and_then(|mut e| {
            if let Some(r) = &headers_ref {
                let (headers, whole) = self.header_set_for(ing, "auth-proxy-set-headers", r, None);
                if !whole {
                    return Err(format!("auth-proxy-set-headers {} cannot be read whole", r.name));
                }
                e.proxy_set_headers = headers;
            }
            Ok(e)
        });
        resolved.map(Some).map_err(|why| {
            let report = Report {
                object: format!("Ingress {ing}"),
                what: if what == "auth-url" {
                    format!("{}auth-url", super::annotations::PREFIX)
                } else {
                    "ConfigMap key global-auth-url".into()
                },
                reason: format!("{why}; the location fails closed (503)"),
            };
            if !self.problems.contains(&report) {
                self.problems.push(report);
            }
            why
        })
    }

    /// The user file of an Ingress's `auth-type: basic`, recorded under its
    /// name; an error (reported once) closes the location.
    fn basic_auth(
        &mut self,
        ing: &str,
        r: &super::annotations::BasicAuthRef,
    ) -> Result<super::basic_auth::BasicAuth, String> {
        let (ns, ingress) = ing.split_once('/').unwrap_or(("default", ing));
        let (secret_ns, name) = r.secret.split_once('/').unwrap_or((ns, &r.secret));
        let result = if secret_ns != ns {
            Err(format!(
                "auth-secret {} is in another namespace; only Secrets of the Ingress's own namespace are read",
                r.secret
            ))
        } else {
            let secret = self.snap.secrets.iter().find(|s| {
                s.metadata.namespace.as_deref().unwrap_or("default") == ns && s.metadata.name.as_deref() == Some(name)
            });
            match secret {
                None => Err(format!("auth-secret {ns}/{name} not found")),
                Some(s) => {
                    super::basic_auth::user_file(s, r.secret_type).map_err(|e| format!("auth-secret {ns}/{name}: {e}"))
                }
            }
        };
        match result {
            Ok(content) => {
                let file = super::basic_auth::file_name(ns, ingress, &content);
                self.auth_files.insert(file.clone(), content);
                Ok(super::basic_auth::BasicAuth {
                    realm: r.realm.clone(),
                    file,
                })
            }
            Err(why) => {
                let report = Report {
                    object: format!("Ingress {ing}"),
                    what: format!("{}auth-secret", super::annotations::PREFIX),
                    reason: format!("{why}; the Ingress fails closed (503)"),
                };
                if !self.problems.contains(&report) {
                    self.problems.push(report);
                }
                Err(why)
            }
        }
    }

    /// The module's id of the Ingress's TLS Secret (see
    /// [`tls::from_secret`]); its PEMs are recorded, problems are reported.
    fn certificate(&mut self, ing: &Ingress, secret: &str) -> Option<String> {
        let ns = ing.metadata.namespace.as_deref().unwrap_or("default");
        match tls::from_secret(&self.snap.secrets, ns, secret) {
            Ok(cert) => {
                for w in &cert.warnings {
                    self.report(ing, "spec.tls.secretName", format!("Secret {ns}/{secret}: {w}"));
                }
                self.certificates.insert(cert.id.clone(), cert.pair);
                Some(cert.id)
            }
            Err(e) => {
                self.report(ing, "spec.tls.secretName", e);
                None
            }
        }
    }

    fn finish(mut self) -> Model {
        let default = self.opts.default_backend_service.clone();
        if let Some((ns, svc)) = &default {
            let name = self.names.claim(BackendId::Default);
            self.backends.insert(
                name,
                BackendRef {
                    namespace: ns.clone(),
                    service: svc.clone(),
                    port: PortRef::Number(-1),
                    annotations: Default::default(),
                    canary: false,
                    session: None,
                },
            );
        }
        self.settle_aliases();
        self.servers.entry("_".to_string()).or_default();
        let mut tls_hosts = BTreeMap::new();
        for (host, acc) in &self.servers {
            if let Some(id) = &acc.tls {
                tls_hosts.insert(host.clone(), id.clone());
                for alias in &acc.aliases {
                    tls_hosts
                        .entry(alias.as_str().to_string())
                        .or_insert_with(|| id.clone());
                }
            }
        }
        let redirect_servers = self.www_redirects(&mut tls_hosts);
        if let Some((ns, name)) = self.opts.default_ssl_certificate.clone() {
            match tls::from_secret(&self.snap.secrets, &ns, &name) {
                Ok(cert) => {
                    tls_hosts.insert(lua_compat::certificates::DEFAULT_HOST.to_string(), cert.id.clone());
                    self.certificates.insert(cert.id, cert.pair);
                }
                Err(e) => self.problems.push(Report {
                    object: format!("Secret {ns}/{name}"),
                    what: "--default-ssl-certificate".into(),
                    reason: format!("{e}; the generated default certificate is served instead"),
                }),
            }
        }
        let servers: Vec<Server> = std::mem::take(&mut self.servers)
            .into_iter()
            .map(|(hostname, acc)| server(hostname, acc))
            .collect();
        let redirect_names: Vec<&str> = redirect_servers.iter().map(|r| r.from.as_str()).collect();
        let server_names_hash = ServerNamesHash::for_servers(&servers, &redirect_names, &self.global);
        if self.opts.ssl_passthrough && (self.global.use_forwarded_headers || self.global.real_ip.enable_real_ip) {
            if let Some(cm) = &self.snap.config_map {
                self.problems.push(Report {
                    object: format!("ConfigMap {}", key(&cm.metadata)),
                    what: "use-forwarded-headers".into(),
                    reason: "with --enable-ssl-passthrough the client's address ($remote_addr) comes from the PROXY protocol of the HTTPS port's stream hop; X-Forwarded-For does not set it (the forwarded scheme and port are still used)".into(),
                });
            }
        }
        let passthrough = self.opts.ssl_passthrough.then(|| {
            passthrough_server(
                std::mem::take(&mut self.passthrough),
                &servers,
                &redirect_names,
                &self.global,
            )
        });
        let auths = || {
            servers
                .iter()
                .flat_map(|s| &s.locations)
                .filter_map(|l| l.external_auth.as_ref())
        };
        let mirrors_resolve = servers
            .iter()
            .flat_map(|s| &s.locations)
            .any(|l| l.mirror.as_ref().is_some_and(|m| m.needs_resolver));
        let resolvers = if auths().any(|a| a.needs_resolver) || mirrors_resolve {
            self.opts
                .resolvers
                .iter()
                .map(|ip| match ip {
                    std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                    v4 => v4.to_string(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let auth_cache = auths().any(|a| a.cache_key.is_some());
        let add_headers = self.header_set(self.global.add_headers.clone(), "add-headers");
        let proxy_set_headers = self.header_set(self.global.proxy_set_headers.clone(), "proxy-set-headers");
        let mut inputs = backends::BackendInputs::new(
            std::mem::take(&mut self.backends),
            std::mem::take(&mut self.alternatives),
            &servers,
            &self.global,
            std::mem::take(&mut self.structural_services),
        );
        inputs.gateway_services = crate::gateway::translate::referenced_services(self.snap);
        let (mut resolved, mut backend_problems) = (BTreeMap::new(), BTreeMap::new());
        backends::resolve(
            self.snap,
            &inputs,
            &inputs.all(),
            &self.opts.endpoints,
            &mut resolved,
            &mut backend_problems,
        );
        let mut model = Model {
            structure: Some(Arc::new(Structure {
                balancers: std::iter::once(super::upstream_kind::PLAIN.to_string())
                    .chain(
                        servers
                            .iter()
                            .flat_map(|s| s.locations.iter().map(|l| l.upstream.upstream())),
                    )
                    .collect(),
                resolvers,
                auth_cache,
                add_headers,
                proxy_set_headers,
                global: self.global,
                listen: self.opts.listen.clone(),
                servers,
                has_default_backend: default.is_some(),
                server_names_hash,
                redirect_servers,
                stream_servers: Vec::new(),
                gateway_servers: Vec::new(),
                gateway_stream_servers: Vec::new(),
                passthrough,
                auth_files: self.auth_files,
            })),
            backends: resolved,
            certificates: Arc::new(self.certificates),
            tls_hosts: Arc::new(tls_hosts),
            problems: Vec::new(),
            fingerprints: Arc::default(),
            inputs: Arc::new(inputs),
            backend_problems,
            structure_problems: Arc::new(self.problems),
            snapshot: None,
            routes: Arc::default(),
        };
        model.problems = all_problems(&model.structure_problems, &model.backend_problems);
        model
    }
}

/// The structure's problems, then each backend's, in name order.
fn all_problems(structure: &[Report], backends: &BTreeMap<String, Vec<Report>>) -> Vec<Report> {
    structure.iter().chain(backends.values().flatten()).cloned().collect()
}

/// The model after an endpoint change: `prev` with the backends resolved
/// from `services` resolved again from `snap`, everything else shared with
/// `prev`. The work is that of the backends touched, not of the cluster.
/// `None` when the change is not an endpoint change after all (a Service
/// a layer-4 port depends on), or `prev` has no structure: build in full.
pub fn update_endpoints(
    prev: &Model,
    snap: &Snapshot,
    services: &BTreeSet<super::ServiceKey>,
    opts: &BuildOptions,
) -> Option<Model> {
    prev.structure.as_ref()?;
    if services.iter().any(|s| prev.inputs.structural_services.contains(s)) {
        return None;
    }
    // A Service a route names came or went, or changed its ports: the
    // route table resolves backend refs against them.
    let reshaped = |s: &super::ServiceKey| {
        prev.inputs
            .gateway_services
            .get(s)
            .is_some_and(|shape| *shape != crate::gateway::translate::service_shape(snap, s))
    };
    if services.iter().any(reshaped) {
        return None;
    }
    let names = prev.inputs.dependents(services);
    let mut model = Model {
        structure: prev.structure.clone(),
        backends: prev.backends.clone(),
        certificates: prev.certificates.clone(),
        tls_hosts: prev.tls_hosts.clone(),
        problems: Vec::new(),
        fingerprints: prev.fingerprints.clone(),
        inputs: prev.inputs.clone(),
        backend_problems: prev.backend_problems.clone(),
        structure_problems: prev.structure_problems.clone(),
        snapshot: None,
        routes: prev.routes.clone(),
    };
    if !names.is_empty() {
        backends::resolve(
            snap,
            &model.inputs,
            &names,
            &opts.endpoints,
            &mut model.backends,
            &mut model.backend_problems,
        );
    }
    model.problems = all_problems(&model.structure_problems, &model.backend_problems);
    Some(model)
}

/// The passthrough server: its SNI map, each passthrough host to its
/// backend and every other server name and alias to `""` (terminated at
/// nginx), and its idle timeout. The explicit entries matter: in a
/// `hostnames` map an exact name wins over a wildcard, so a tenant's
/// passthrough `*.example.com` cannot capture another tenant's
/// `shop.example.com`.
fn passthrough_server(
    passthrough: BTreeMap<String, String>,
    servers: &[Server],
    redirect_names: &[&str],
    global: &GlobalConfig,
) -> super::Passthrough {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    let names = servers
        .iter()
        .flat_map(|s| std::iter::once(s.hostname.as_str()).chain(s.aliases.iter().map(|a| a.as_str())))
        .chain(redirect_names.iter().copied())
        .filter(|n| *n != "_");
    for name in names {
        map.insert(name.to_ascii_lowercase(), String::new());
    }
    let hosts: Vec<String> = passthrough.keys().cloned().collect();
    map.extend(passthrough);
    let entries = map
        .into_iter()
        .map(|(host, backend)| super::PassthroughHost {
            key: map_key(&host),
            backend,
        })
        .collect();
    // The hop relays the terminated HTTPS of every location too: it must
    // never close a connection that the HTTP side still keeps (a
    // WebSocket with a long proxy-read-timeout), so it takes the longest
    // timeout that any of them has.
    let locations = servers.iter().flat_map(|s| &s.locations);
    let timeout = [
        global.stream.timeout.0,
        global.proxy_read_timeout.0,
        global.proxy_send_timeout.0,
        global.keep_alive.0,
    ]
    .into_iter()
    .chain(locations.flat_map(|l| [l.proxy_read_timeout.0, l.proxy_send_timeout.0]))
    .max()
    .unwrap_or(600);
    super::Passthrough {
        entries,
        hosts,
        timeout,
    }
}

/// A host as a `map` key: the words the map block gives a meaning to
/// (`default`, `include`, `hostnames`, `volatile`, all valid one-label
/// host names) are escaped with `\`, which nginx strips.
fn map_key(host: &str) -> String {
    if ["default", "include", "hostnames", "volatile"].contains(&host) {
        format!("\\{host}")
    } else {
        host.to_string()
    }
}

/// Orders a server's locations (longest path first, which is what regex
/// locations need; prefix and exact ones are order-free in nginx) and
/// collects the named error locations they use.
fn server(hostname: String, acc: ServerAcc) -> Server {
    let tls = acc.tls.is_some();
    let mut locations: Vec<Location> = acc.locations.into_values().flatten().collect();
    for l in &mut locations {
        l.ssl_redirect &= tls;
    }
    locations.sort_by(|a, b| b.path.len().cmp(&a.path.len()).then_with(|| b.path.cmp(&a.path)));
    let mut error_pages: Vec<ErrorPage> = locations.iter().flat_map(|l| l.error_pages.iter().cloned()).collect();
    error_pages.sort_by(|a, b| a.name.cmp(&b.name));
    error_pages.dedup_by(|a, b| a.name == b.name);
    let app_root = locations
        .iter()
        .find_map(|l| l.app_root.clone().map(|a| (l.ingress.clone(), a)));
    let covers_root = locations
        .iter()
        .any(|l| (l.match_ == Match::Prefix && l.path == "/") || (l.match_ == Match::Regex && l.path == "^/"));
    Server {
        hostname,
        aliases: acc.aliases,
        tls,
        locations,
        snippet: acc.snippet,
        client_auth: acc.client_auth.and_then(Result::ok),
        app_root,
        error_pages,
        fallback: !covers_root,
    }
}
