//! The route table: Gateway API HTTPRoutes as the module applies them, with
//! no reload.
//!
//! The controller resolves Gateways, listeners, hostnames, parent refs and
//! backend refs, and orders every match the way the Gateway API specifies
//! (hostname, then exact over prefix path, longest path, method, number of
//! header and query matches, route age and name, rule order). It pushes the
//! result as one JSON document (`PUT /configuration/routes`); the module
//! keeps it in its zone, each worker compiles it once per change
//! ([`matcher::Compiled`]) and, per request, takes the first match of the
//! request's host group. Nothing here is nginx syntax: every value is typed
//! and validated ([`validate`]) before it is stored.
//!
//! - [`validate`]: parsing with the JSON path of the first bad value;
//! - [`matcher`]: the compiled table and the per-request lookup;
//! - [`rewrite`]: redirect locations and rewritten paths;
//! - [`cors`]: the CORS filter's answers;
//! - [`weighted`]: the backend of a rule, by weight.
//!
//! GRPCRoutes come as the same rules: a gRPC method is a path
//! (`/service/method`), and their backends speak [`BackendProtocol::H2c`].

pub mod cors;
pub mod header;
pub mod matcher;
pub mod rewrite;
pub mod validate;
pub mod weighted;

use serde::{Deserialize, Serialize};

/// `PUT /configuration/routes`: every listener's routes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteTable {
    pub listeners: Vec<ListenerRoutes>,
    /// TLS to backends (a Gateway API BackendTLSPolicy on a Service port),
    /// by backend name: requests to these backends, from any listener,
    /// go over TLS, verified as each entry says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_tls: Vec<BackendTls>,
}

/// How nginx connects to one backend over TLS and what it accepts from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendTls {
    /// The backend (a Service port) this applies to.
    pub backend: String,
    /// Sent as SNI; without `subjectAltNames`, also the name the backend's
    /// certificate must carry.
    pub hostname: String,
    /// The CAs the backend's chain must end at, PEM; absent: the system's
    /// trusted CAs (the policy's `wellKnownCACertificates: System`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<String>,
    /// When present, the backend's certificate must carry one of these
    /// (instead of `hostname`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<SubjectAltName>,
}

/// A name a backend's certificate may carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", deny_unknown_fields)]
pub enum SubjectAltName {
    /// A DNS name (`*.` may lead), matched as certificate host names are.
    Hostname(String),
    /// A URI SAN (SPIFFE ids, say), matched exactly.
    #[serde(rename = "URI")]
    Uri(String),
}

/// The routes of one nginx `server` (a Gateway's port): the name its
/// `dynamic_balancer_routes` directive gives.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenerRoutes {
    pub name: String,
    /// The port clients connect to (the Gateway listener's), for redirects
    /// that keep it.
    pub port: u16,
    /// Host groups; a request uses the group of its exact host, else of the
    /// longest wildcard that covers it, else `*`.
    pub hosts: Vec<HostRoutes>,
    /// What matches point at, shared by the host groups.
    pub rules: Vec<Rule>,
    /// An HTTPS server's certificates by SNI (a Gateway's HTTPS listeners:
    /// their hostnames, `*` for one without). Ids name certificates of
    /// `/configuration/certificates`; a handshake on this server takes
    /// the exact host's, else the longest wildcard's, else `*`'s, before
    /// the Ingress servers map. Empty on an HTTP server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<ListenerCertificate>,
    /// An HTTPS server's client certificate validation (the Gateway's
    /// `spec.tls.frontend` for this port): asked for in every handshake
    /// and checked against these CAs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_validation: Option<ClientValidation>,
    /// The certificate nginx shows backends reached over TLS from this
    /// server, when they ask for one (the Gateway's
    /// `spec.tls.backend.clientCertificateRef`): a certificate id of
    /// `/configuration/certificates`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_client_certificate: Option<String>,
    /// A TLS listener in `Passthrough` mode: the client's own TLS goes to
    /// the backend unopened, so nothing is originated over TLS from here
    /// and BackendTLSPolicies on its backends do not apply (wrapping the
    /// client's TLS in a second one would only break it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls_passthrough: bool,
}

/// Mutual TLS on one HTTPS server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientValidation {
    /// The trusted CA certificates, PEM (one or more `CERTIFICATE`
    /// blocks): a client's chain must end at one of them.
    pub ca_certificates: String,
    #[serde(default)]
    pub mode: ValidationMode,
}

/// What happens to a client without a valid certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValidationMode {
    /// The handshake fails (Gateway API's default).
    #[default]
    AllowValidOnly,
    /// The certificate is asked for and verified, but the connection goes
    /// on without one or with one that fails; the backend decides.
    AllowInsecureFallback,
}

/// One HTTPS listener's certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenerCertificate {
    /// `example.com`, `*.example.com` or `*`.
    pub hostname: String,
    /// A certificate id (`lua_compat::certificates::check_id`).
    pub certificate: String,
}

/// The matches one request host can reach, in precedence order: the first
/// that matches wins.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostRoutes {
    /// `example.com`, `*.example.com` (one or more labels) or `*`.
    pub hostname: String,
    pub matches: Vec<RouteMatch>,
}

/// One HTTPRoute match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteMatch {
    pub path: PathMatch,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<ValueMatch>,
    /// Index into the listener's `rules`.
    pub rule: u32,
}

/// How the path matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", deny_unknown_fields)]
pub enum PathMatch {
    Exact(String),
    /// Element-wise: `/a` matches `/a`, `/a/` and `/a/b`, not `/ab`.
    PathPrefix(String),
    RegularExpression(String),
}

impl Default for PathMatch {
    fn default() -> Self {
        PathMatch::PathPrefix("/".into())
    }
}

/// A header (name case-insensitive) or query parameter (name exact) match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValueMatch {
    pub name: String,
    pub value: String,
    #[serde(default)]
    pub regex: bool,
}

/// What a match leads to: one HTTPRoute rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    /// `namespace/name` of the HTTPRoute, for logs and `$gateway_route`.
    pub route: String,
    /// The rule's `name`, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Filters::is_empty")]
    pub filters: Filters,
    /// Empty: the rule answers 500 (it has no usable backend), unless a
    /// redirect filter answers first.
    #[serde(default)]
    pub backends: Vec<WeightedBackend>,
    #[serde(default, skip_serializing_if = "Timeouts::is_empty")]
    pub timeouts: Timeouts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// The rule's `sessionPersistence`: its backends are the controller's
    /// per-rule copies whose `sessionAffinityConfig` carries the session
    /// (cookie or header). A request that carries a session of one of them
    /// goes to that backend whatever the weights say, so a weighted split
    /// does not move an established session.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub session_persistence: bool,
}

/// An HTTPRoute rule's `retry`: the request is tried again, up to
/// `attempts` more times, on a connection error, a timeout, or a response
/// with one of `codes` (those nginx can retry on:
/// [`validate::RETRYABLE_CODES`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retry {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<u16>,
    pub attempts: u32,
}

/// An HTTPRoute rule's `timeouts`, in milliseconds (left out: none).
/// The module bounds the wait for the backend's response by them: 504
/// when one runs out (see the module's `http::gateway_upstream`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timeouts {
    /// From the request's arrival to the backend's response, retries
    /// included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<u32>,
    /// One attempt at a backend: connecting, sending, and each wait for
    /// its response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<u32>,
}

impl Timeouts {
    pub fn is_empty(&self) -> bool {
        self.request.is_none() && self.backend_request.is_none()
    }

    /// The upstream timers these timeouts give a request `elapsed_ms`
    /// after it arrived: `(attempt, total)`, the bound of each connect,
    /// send and read, and of all attempts together (`None`: the
    /// location's own). Never 0, which nginx takes as "no timer": a
    /// request already over its time gets 1 ms.
    pub fn timers(&self, elapsed_ms: u64) -> (Option<u64>, Option<u64>) {
        let total = self.request.map(|r| u64::from(r).saturating_sub(elapsed_ms).max(1));
        let attempt = match (self.backend_request.map(u64::from), total) {
            (Some(b), Some(t)) => Some(b.min(t)),
            (b, t) => b.or(t),
        };
        (attempt, total)
    }
}

/// `current` (an nginx timer, 0 for none) bounded by `limit`: never
/// lengthened.
pub fn cut_timer(current: u64, limit: u64) -> u64 {
    if current == 0 || current > limit {
        limit
    } else {
        current
    }
}

#[cfg(test)]
mod timeouts_tests {
    use super::*;

    #[test]
    fn timers_follow_the_spec_and_never_lengthen() {
        let t = |request, backend_request| Timeouts {
            request,
            backend_request,
        };
        assert_eq!(t(None, Some(500)).timers(9_999), (Some(500), None));
        assert_eq!(t(Some(10_000), None).timers(2_500), (Some(7_500), Some(7_500)));
        assert_eq!(t(Some(10_000), Some(500)).timers(2_500), (Some(500), Some(7_500)));
        assert_eq!(t(Some(1_000), Some(5_000)).timers(800), (Some(200), Some(200)));
        assert_eq!(
            t(Some(100), None).timers(5_000),
            (Some(1), Some(1)),
            "over time: at once"
        );
        assert_eq!(cut_timer(60_000, 500), 500);
        assert_eq!(cut_timer(100, 500), 100);
        assert_eq!(cut_timer(0, 500), 500, "no timer becomes the limit");
    }
}

/// The rule's filters, at most one of each kind (as the spec allows for
/// the ones below).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Filters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Rewrite>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<cors::Cors>,
    /// `RequestMirror` filters (a rule may have several): each gets a copy
    /// of the request, whose answer is thrown away.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<Mirror>,
}

/// One `RequestMirror`: the backend that gets a copy of the request, for
/// `numerator` of every `denominator` requests (1/1: all of them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mirror {
    pub backend: String,
    #[serde(default, skip_serializing_if = "BackendProtocol::is_http1")]
    pub protocol: BackendProtocol,
    #[serde(default = "one")]
    pub numerator: u32,
    #[serde(default = "one")]
    pub denominator: u32,
}

fn one() -> u32 {
    1
}

impl Mirror {
    /// Whether a request whose random draw is `draw` is mirrored.
    pub fn takes(&self, draw: u64) -> bool {
        self.numerator >= self.denominator || draw % u64::from(self.denominator.max(1)) < u64::from(self.numerator)
    }
}

impl Filters {
    pub fn is_empty(&self) -> bool {
        self == &Filters::default()
    }
}

/// RequestHeaderModifier / ResponseHeaderModifier.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderModifier {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<Header>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<Header>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Header {
    pub name: String,
    pub value: String,
}

/// RequestRedirect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Redirect {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
    pub status_code: u16,
}

/// URLRewrite.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rewrite {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
}

/// How a redirect or rewrite changes the path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", deny_unknown_fields)]
pub enum PathModifier {
    ReplaceFullPath(String),
    /// Replaces what a `PathPrefix` match matched; only valid on rules
    /// whose matches are all prefixes (the controller checks).
    ReplacePrefixMatch(String),
}

/// One backend of a rule. `backend: None` stands for a backend ref that
/// does not resolve: its share of the requests gets 500, as the spec says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeightedBackend {
    pub backend: Option<String>,
    pub weight: u32,
    /// The backend ref's own `RequestHeaderModifier`, applied after the
    /// rule's when this backend is chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderModifier>,
    /// The backend ref's own `URLRewrite`: it replaces the rule's (host
    /// and path each) when this backend is chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Rewrite>,
    /// How nginx talks to it: HTTP/1.1 (the default) or HTTP/2 without
    /// TLS (a GRPCRoute's backends, a Service port whose `appProtocol` is
    /// `kubernetes.io/h2c`).
    #[serde(default, skip_serializing_if = "BackendProtocol::is_http1")]
    pub protocol: BackendProtocol,
}

/// The protocol nginx speaks to a backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendProtocol {
    /// `proxy_pass`, HTTP/1.1 (WebSocket upgrades included).
    #[default]
    Http1,
    /// HTTP/2 with prior knowledge over plain TCP: the location's
    /// `dynamic_balancer_routes` names where such requests go (a named
    /// location with `grpc_pass`).
    H2c,
}

impl BackendProtocol {
    pub fn is_http1(&self) -> bool {
        *self == BackendProtocol::Http1
    }
}
