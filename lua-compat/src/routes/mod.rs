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
//! - [`weighted`]: the backend of a rule, by weight.
//!
//! GRPCRoutes come as the same rules: a gRPC method is a path
//! (`/service/method`), and their backends speak [`BackendProtocol::H2c`].

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
