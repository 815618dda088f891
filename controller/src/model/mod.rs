//! The ingress-nginx model, built purely from a [`Snapshot`].
//!
//! The output is split the way the data plane needs it:
//! - [`Structure`]: servers, locations and global settings. It is rendered
//!   into nginx.conf, and a change to it is the only thing that reloads.
//! - `backends`: ingress-nginx's `Backend` JSON (endpoints, algorithm,
//!   affinity, canary). It is pushed to the module and never reloads.

pub mod annotations;
mod backends;
pub mod basic_auth;
mod build;
pub mod catalogue;
pub mod class;
pub mod client_auth;
pub mod config_map;
pub mod endpoints;
pub mod external_auth;
pub mod header_sets;
pub mod http_settings;
pub mod l4_services;
pub mod log_format;
pub mod mirror;
pub mod names;
pub mod otel;
pub mod proxy_settings;
pub mod real_ip;
pub mod snippet;
pub mod ssl_settings;
pub mod stream_settings;
pub mod tls;
pub mod upstream_kind;
pub mod values;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

pub use crate::snapshot::ServiceKey;
pub use backends::BackendInputs;
pub use build::{build, build_with, fingerprint, update_endpoints, BuildOptions};
pub use endpoints::AddressPolicy;

use annotations::Cors;
use config_map::GlobalConfig;
use values::{Host, RedirectUrl, RewriteTarget, Seconds, Size, UrlPath};

/// The name of the catch-all backend, as ingress-nginx calls it.
pub const DEFAULT_BACKEND: &str = "upstream-default-backend";

/// Everything rendered into nginx.conf. Two equal structures render equal
/// files, so comparing structures decides whether a reload is needed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Structure {
    pub global: GlobalConfig,
    pub listen: Listen,
    /// Not serialized: the renderer gives the template these one at a time
    /// (`render::structure_value`).
    #[serde(skip)]
    pub servers: Vec<Server>,
    /// Whether `--default-backend-service` gave a catch-all backend; without
    /// it the default server answers 404 itself.
    pub has_default_backend: bool,
    pub server_names_hash: ServerNamesHash,
    /// `add-headers`: added to every response (`always`), in every server
    /// and in every location with headers of its own.
    pub add_headers: Vec<header_sets::Header>,
    /// `proxy-set-headers`: sent upstream from every Ingress location.
    pub proxy_set_headers: Vec<header_sets::Header>,
    /// DNS servers for `resolver` (only when a location resolves an auth
    /// host per request).
    pub resolvers: Vec<String>,
    /// A location caches auth responses (`auth-cache-key`): the
    /// `auth_cache` zone is declared.
    pub auth_cache: bool,
    /// `from-to-www-redirect` servers.
    pub redirect_servers: Vec<RedirectServer>,
    /// `stream {}` servers of `tcp-services` and `udp-services`, by port.
    pub stream_servers: Vec<StreamServer>,
    /// One server per Gateway port; its routes are pushed, not rendered.
    pub gateway_servers: Vec<crate::gateway::translate::GatewayServer>,
    /// Gateway TCP, UDP and TLS passthrough listeners' servers (`stream{}`).
    pub gateway_stream_servers: Vec<crate::gateway::translate::GatewayServer>,
    /// `--enable-ssl-passthrough`: the SNI map (passthrough hosts, and
    /// every other name, terminated); `None` when passthrough is off (the HTTP servers then listen on
    /// the HTTPS port themselves).
    pub passthrough: Option<Passthrough>,
    /// The balancer upstreams the locations use (`upstream_balancer`
    /// always: the default backend and error pages use it), one per kind
    /// of connection ([`upstream_kind`]).
    pub balancers: std::collections::BTreeSet<String>,
    /// Basic-auth user files and client CA bundles, by name (under
    /// `<conf-dir>/auth/`). Only
    /// their names reach nginx.conf.
    #[serde(skip)]
    pub auth_files: BTreeMap<String, String>,
}

/// `server_names_hash_bucket_size` and `_max_size`, sized from the names
/// (as ingress-nginx does): with nginx's defaults a single host name of
/// 54 characters fails `nginx -t` ("could not build server_names_hash").
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ServerNamesHash {
    pub bucket_size: usize,
    pub max_size: usize,
}

impl ServerNamesHash {
    pub fn for_servers(servers: &[Server], extra: &[&str], global: &GlobalConfig) -> Self {
        let names = servers
            .iter()
            .flat_map(|s| std::iter::once(s.hostname.as_str()).chain(s.aliases.iter().map(|a| a.as_str())))
            .chain(extra.iter().copied());
        let (count, longest) = names.fold((0usize, 0usize), |(n, l), name| (n + 1, l.max(name.len())));
        // One element is a pointer plus the name and two bytes, aligned to
        // a pointer; a bucket also ends with a null pointer.
        let word = 8;
        let element = word + (longest + 2).div_ceil(word) * word;
        // Enough buckets that nginx finds a size where every bucket fits.
        let max_size = (count * 4).next_power_of_two().max(global.server_name_hash_max_size);
        // Above 10,000 buckets (and under 100 a name) nginx tries only the
        // last 1,000 sizes below the maximum; at a quarter full some bucket
        // then always holds several names, and with room for one nginx
        // warned on every reload ("could not build optimal
        // server_names_hash", 50,000 hosts). Room for four costs no memory:
        // nginx allocates what the names take, not the bucket size.
        let per_bucket = if max_size > 10_000 { 4 } else { 1 };
        let bucket_size = (per_bucket * element + word)
            .next_power_of_two()
            .max(64)
            .max(global.server_name_hash_bucket_size);
        ServerNamesHash { bucket_size, max_size }
    }
}

/// A server that only redirects `from` to the host `to`
/// (`from-to-www-redirect`).
/// A layer-4 port: a `stream {}` server that forwards to a backend. Its
/// port and flags are structure (a new `listen` reloads); its endpoints are
/// the backend's, pushed without a reload.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct StreamServer {
    pub port: u16,
    pub protocol: l4_services::L4Protocol,
    pub backend: String,
    /// `listen ... proxy_protocol`: the client sends the PROXY protocol.
    pub decode_proxy: bool,
    /// `proxy_protocol on`: send the PROXY protocol to the upstream.
    pub encode_proxy: bool,
    /// The entry's value, canonical, for the rendered comment.
    pub source: String,
}

/// `--enable-ssl-passthrough`'s `stream {}` server on the HTTPS port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Passthrough {
    /// The SNI map.
    pub entries: Vec<PassthroughHost>,
    /// The hosts that pass through (no HTTP/3 for them: QUIC cannot).
    pub hosts: Vec<String>,
    /// `proxy_timeout` of the hop, in seconds.
    pub timeout: u32,
}

/// An entry of the passthrough server's SNI map: TLS for `key` goes,
/// unterminated, to `backend`; an empty `backend` terminates at nginx.
/// `key` is the host as a `map` key (escaped where it is a map keyword).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct PassthroughHost {
    pub key: String,
    pub backend: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct RedirectServer {
    pub from: String,
    pub to: String,
}

/// Where nginx listens; from the command line, never from users.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Listen {
    pub address: String,
    pub http_port: u16,
    pub https_port: u16,
    pub api_port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Server {
    /// A validated host name, or `_` for the catch-all server.
    pub hostname: String,
    pub aliases: Vec<Host>,
    /// A TLS Secret of an Ingress covers the host: `ssl-redirect` applies.
    /// Which certificate is served is pushed, not rendered
    /// ([`Model::tls_hosts`]), so a renewal or another Secret never reloads.
    pub tls: bool,
    pub locations: Vec<Location>,
    /// `server-snippet`, only when snippets are allowed; judged and in
    /// canonical form.
    pub snippet: Option<snippet::Snippet>,
    /// `app-root` of the first location that has one (its Ingress, the
    /// path): `/` on this host redirects there, whatever paths the Ingress
    /// serves.
    pub app_root: Option<(String, UrlPath)>,
    /// `auth-tls-*` of the host's first Ingress: client certificates.
    pub client_auth: Option<client_auth::ClientAuth>,
    /// Named error locations this server's locations use.
    pub error_pages: Vec<ErrorPage>,
    /// No location covers `/`: the template adds the default one (the
    /// default backend, or a 404).
    pub fallback: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Match {
    /// `location = /path`
    Exact,
    /// `location /path`
    Prefix,
    /// `location ~* "^regex"`
    Regex,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ErrorPage {
    pub name: String,
    pub code: u16,
    pub backend: String,
}

/// ingress-nginx's request-metric labels of a location; the host is the
/// server's. `path` is the Ingress path rule as written, never a request URI,
/// so the number of series is bounded by the Ingresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct MetricLabels {
    pub namespace: String,
    pub ingress: String,
    pub service: String,
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Location {
    pub path: String,
    #[serde(rename = "match")]
    pub match_: Match,
    /// The backend (`<ns>-<svc>-<port>`) this location sends traffic to.
    pub backend: String,
    /// The source Ingress, `namespace/name` (validated Kubernetes names).
    pub ingress: String,
    /// The labels of this location's request metrics.
    pub metrics: MetricLabels,
    /// A unique small id, used to name this location's limit zones.
    pub id: usize,
    /// The access-control annotations this controller does not implement,
    /// when the Ingress has any: the location answers 503 (fails closed).
    pub closed: Option<String>,
    /// The Ingress path, for `$location_path` (cookie affinity issues its
    /// cookie only where the backend lists it); only with affinity.
    pub location_path: Option<String>,
    pub rewrite_target: Option<RewriteTarget>,
    /// Redirect plain HTTP to HTTPS when the host has TLS (`ssl-redirect`).
    pub ssl_redirect: bool,
    /// Redirect plain HTTP to HTTPS in any case (`force-ssl-redirect`).
    /// Both are off for `no-tls-redirect-locations`.
    pub force_ssl_redirect: bool,
    /// Keep a trailing `/` in HTTPS redirects (`preserve-trailing-slash`).
    pub preserve_trailing_slash: bool,
    /// Name the HTTPS port in HTTPS redirects (`use-port-in-redirects`).
    pub use_port_in_redirects: bool,
    pub app_root: Option<UrlPath>,
    pub redirect: Option<(u16, RedirectUrl)>,
    pub proxy_body_size: Size,
    pub proxy_connect_timeout: Seconds,
    pub proxy_read_timeout: Seconds,
    pub proxy_send_timeout: Seconds,
    pub proxy_next_upstream: Vec<String>,
    pub proxy_next_upstream_tries: u32,
    pub proxy_buffering: bool,
    /// The Ingress's proxy overrides (only these are rendered in the
    /// location; the ConfigMap's values are in `http {}`).
    pub proxy: proxy_settings::ProxyOverrides,
    pub connection_header: Option<values::HeaderName>,
    pub x_forwarded_prefix: Option<UrlPath>,
    /// `auth-type: basic`: the realm and the user file.
    pub basic_auth: Option<basic_auth::BasicAuth>,
    /// `custom-headers`: added to this location's responses (`always`).
    pub custom_headers: Vec<header_sets::Header>,
    /// `mirror-target`: each request is also sent there.
    pub mirror: Option<mirror::Mirror>,
    /// `relative-redirects` when the Ingress sets it (else the ConfigMap's
    /// in `http {}`).
    pub relative_redirects: Option<bool>,
    /// `satisfy any`: the allowlist or the authentication suffices.
    pub satisfy_any: bool,
    /// `auth-url` (or the ConfigMap's `global-auth-url`).
    pub external_auth: Option<external_auth::ExternalAuth>,
    /// `false` turns the access log off in this location.
    pub access_log: bool,
    /// OpenTelemetry tracing, when this location is traced.
    pub otel: Option<otel::LocationOtel>,
    pub rewrite_log: bool,
    /// Whether `proxy_intercept_errors` is on (custom-http-errors, unless
    /// `disable-proxy-intercept-errors`).
    pub intercept_errors: bool,
    /// The protocol and TLS identity of its upstream connections, which
    /// choose its balancer upstream ([`upstream_kind`]).
    pub upstream: upstream_kind::UpstreamKind,
    pub upstream_vhost: Option<Host>,
    pub cors: Option<Cors>,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub limit_rps: Option<u32>,
    pub limit_connections: Option<u32>,
    pub limit_rpm: Option<u32>,
    /// Burst of `limit_req`: the rate times `limit-burst-multiplier`.
    pub limit_burst_multiplier: u32,
    /// Clients the request and connection limits do not apply to.
    pub limit_allowlist: Vec<String>,
    /// `limit_rate`/`limit_rate_after` in kilobytes; `None` inherits the
    /// ConfigMap's (rendered in `http {}`).
    pub limit_rate: Option<u64>,
    pub limit_rate_after: Option<u64>,
    /// The ConfigMap's `block-cidrs`, repeated in a location with its own
    /// allow/deny rules (nginx inherits access rules only into a location
    /// that has none).
    pub block_cidrs: Vec<String>,
    /// custom-http-errors: codes sent to a named error location.
    pub error_pages: Vec<ErrorPage>,
    /// `configuration-snippet`, as [`Server::snippet`].
    pub snippet: Option<snippet::Snippet>,
}

/// What one build produced.
///
/// The parts that do not change with endpoints are shared (`Arc`): an
/// endpoint change ([`update_endpoints`]) makes a new model that points at
/// the previous one's structure, certificates and fingerprints, and
/// replaces only the backends of the Services that changed. The tasks
/// downstream tell "unchanged" by pointer before they compare.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub structure: Option<Arc<Structure>>,
    pub backends: BTreeMap<String, Arc<lua_compat::wire::Backend>>,
    /// Certificates for the module, by id (`<ns>_<secret>`).
    pub certificates: Arc<BTreeMap<String, tls::Pair>>,
    /// Host → certificate id, for the module's servers map (`_`: the
    /// default certificate, `--default-ssl-certificate`).
    pub tls_hosts: Arc<BTreeMap<String, String>>,
    /// Everything refused or ignored, for logs, events and metrics: the
    /// structure's problems, then each backend's.
    pub problems: Vec<Report>,
    /// Each Ingress's [`fingerprint`], by `namespace/name`.
    pub fingerprints: Arc<BTreeMap<String, String>>,
    /// What the backends were resolved from, to resolve some again.
    pub inputs: Arc<BackendInputs>,
    /// The problems of each backend (a Service not found, an endpoint
    /// refused), replaced with it.
    pub backend_problems: BTreeMap<String, Vec<Report>>,
    /// The problems of everything but the backends.
    pub structure_problems: Arc<Vec<Report>>,
    /// The snapshot it was built from (set by the sync loop), so that the
    /// structural path can build it again without a quarantined Ingress.
    pub snapshot: Option<Arc<crate::snapshot::Snapshot>>,
    /// The Gateway API route table, pushed to the module (never rendered).
    pub routes: Arc<lua_compat::routes::RouteTable>,
}

impl Model {
    /// The object a backend comes from (`Service ns/name`), to report a
    /// backend the module refuses.
    pub fn backend_object(&self, name: &str) -> Option<String> {
        self.inputs
            .refs
            .get(name)
            .map(|r| format!("Service {}/{}", r.namespace, r.service))
    }
}

/// Ingresses left out of nginx.conf because nginx refused what they render
/// (see the structural path in `sync`), by `namespace/name`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quarantine(pub BTreeMap<String, Quarantined>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The Ingress's fingerprint when it was refused: a change lifts it.
    pub fingerprint: String,
    /// nginx's message.
    pub reason: String,
}

impl fmt::Display for Quarantine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<&str> = self.0.keys().map(String::as_str).collect();
        f.write_str(&keys.join(", "))
    }
}

/// One refused value, tied to the object it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// `Ingress ns/name`, `ConfigMap ns/name`, ...
    pub object: String,
    pub what: String,
    pub reason: String,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.what, self.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sized(names: &[String]) -> ServerNamesHash {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        ServerNamesHash::for_servers(&[], &names, &GlobalConfig::default())
    }

    /// A hash element: a pointer, then the name and two bytes, aligned.
    fn element(name: &str) -> usize {
        8 + (name.len() + 2).div_ceil(8) * 8
    }

    #[test]
    fn a_few_names_keep_nginx_defaults_and_many_get_room_for_collisions() {
        let few: Vec<String> = (0..10).map(|i| format!("h{i}.example.com")).collect();
        assert_eq!(sized(&few).bucket_size, 64);
        // 50,000 names: nginx tries only sizes near the maximum, where a
        // bucket holds several names; four must fit.
        let many: Vec<String> = (0..50_000).map(|i| format!("h{i}.example.com")).collect();
        let hash = sized(&many);
        assert_eq!(hash.max_size, 262_144);
        assert!(
            hash.bucket_size >= 4 * element(&many[49_999]) + 8,
            "{}",
            hash.bucket_size
        );
        assert!(hash.bucket_size.is_power_of_two());
    }
}
