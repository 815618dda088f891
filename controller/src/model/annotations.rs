//! `nginx.ingress.kubernetes.io/*` annotations, parsed into typed values.
//!
//! Each annotation is parsed on its own: a bad value drops that annotation
//! only and yields a [`Problem`] saying why, so one typo never takes a whole
//! Ingress down and no raw user string survives into the model.

use std::collections::BTreeMap;

use serde::Serialize;

use super::basic_auth::{self, SecretType};
use super::catalogue;
use super::proxy_settings::{self as proxy, HttpVersion, ProxyOverrides, ProxyRedirect, Rewrite};
use super::snippet::{self, Snippet};
use super::values::{
    error_status, number_in, parse_cidrs, HeaderName, Host, Invalid, Origin, RedirectUrl, RewriteTarget, Seconds, Size,
    UrlPath,
};

pub const PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// Largest `limit-rps`: far above any per-client rate anyone limits to.
pub const MAX_RPS: u32 = 1_000_000;
/// Largest `limit-rate`/`limit-rate-after` in kilobytes (1 TB).
pub const MAX_RATE_KB: u64 = 1 << 30;
/// Largest `proxy-next-upstream-tries`.
pub const MAX_TRIES: u32 = 1_000;

/// A refused or ignored annotation, reported as a log line and an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub annotation: String,
    pub reason: String,
}

/// The protocol nginx speaks to the backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendProtocol {
    #[default]
    Http,
    Https,
    Grpc,
    Grpcs,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Cors {
    pub allow_origin: Vec<Origin>,
    pub allow_methods: Vec<HeaderName>,
    pub allow_headers: Vec<HeaderName>,
    pub expose_headers: Vec<HeaderName>,
    pub allow_credentials: bool,
    pub max_age: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Canary {
    pub weight: i64,
    pub weight_total: i64,
    pub by_header: String,
    pub by_header_value: String,
    pub by_header_pattern: String,
    pub by_cookie: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Affinity {
    pub mode: String,
    pub cookie_name: String,
    pub path: String,
    pub domain: String,
    pub expires: String,
    pub max_age: String,
    pub secure: bool,
    pub samesite: String,
    pub conditional_samesite_none: bool,
    pub change_on_failure: bool,
}

/// `auth-type: basic`: where the users are and the realm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasicAuthRef {
    pub secret: String,
    pub secret_type: SecretType,
    pub realm: String,
}

/// Everything this controller understands from one Ingress's annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Annotations {
    // Backend (dynamic) settings: they only reach the JSON pushed to nginx.
    pub load_balance: Option<String>,
    pub upstream_hash_by: Option<String>,
    pub upstream_hash_by_subset: bool,
    pub upstream_hash_by_subset_size: Option<i64>,
    pub affinity: Option<Affinity>,
    pub canary: Option<Canary>,
    pub service_upstream: bool,
    /// Buffers, bodies, cookie and redirect rewriting, HTTP version and
    /// retry deadline (see `proxy_settings`).
    pub proxy: ProxyOverrides,
    /// `auth-type: basic` with `auth-secret` (a Secret of the Ingress's
    /// namespace), `auth-secret-type` and `auth-realm`.
    pub basic_auth: Option<BasicAuthRef>,
    /// `from-to-www-redirect`: `www.<host>` redirects to the host, or the
    /// bare name to a `www.` host.
    pub from_to_www_redirect: bool,
    /// `x-forwarded-prefix`: sent upstream as `X-Forwarded-Prefix`.
    pub x_forwarded_prefix: Option<UrlPath>,
    /// `enable-access-log: "false"` turns the access log off here.
    pub enable_access_log: Option<bool>,
    /// `enable-opentelemetry`: trace here (over the ConfigMap's key).
    pub enable_opentelemetry: Option<bool>,
    /// `opentelemetry-trust-incoming-span`.
    pub opentelemetry_trust_incoming_span: Option<bool>,
    /// `opentelemetry-operation-name`.
    pub opentelemetry_operation_name: Option<super::otel::OperationName>,
    /// `enable-rewrite-log`: nginx logs each rewrite (at notice level).
    pub enable_rewrite_log: bool,
    /// `disable-proxy-intercept-errors`: with `custom-http-errors`, the
    /// backend's own error pages pass through unchanged.
    pub disable_proxy_intercept_errors: bool,
    /// `connection-proxy-header`: the `Connection` header sent upstream.
    pub connection_header: Option<HeaderName>,
    /// `affinity-canary-behavior: legacy` on a canary Ingress: its backend
    /// does not share the primary's session affinity.
    pub affinity_canary_legacy: bool,
    /// `enable-global-auth` (default true).
    pub enable_global_auth: Option<bool>,
    /// `auth-url` and its companions (external authentication).
    pub external_auth: Option<super::external_auth::AuthSpec>,
    /// `custom-headers`: a header set (a ConfigMap of the controller's
    /// namespace) added to this Ingress's responses.
    pub custom_headers: Option<super::header_sets::SetRef>,
    /// `mirror-target` and its companions.
    pub mirror: Option<super::mirror::MirrorSpec>,
    /// `relative-redirects`: nginx's own redirects keep a relative
    /// `Location`.
    pub relative_redirects: Option<bool>,
    /// `satisfy: any`: one access check passing is enough (allowlist or
    /// authentication), instead of all of them.
    pub satisfy_any: bool,
    /// `auth-tls-secret` and its companions (client certificates).
    pub auth_tls: Option<super::client_auth::AuthTlsRef>,

    // Location and server (structural) settings.
    pub rewrite_target: Option<RewriteTarget>,
    pub use_regex: bool,
    pub ssl_redirect: Option<bool>,
    pub force_ssl_redirect: bool,
    /// `ssl-passthrough`: TLS for the Ingress's hosts is not terminated;
    /// the HTTPS port routes it by SNI to the backend of path `/` (needs
    /// `--enable-ssl-passthrough`).
    pub ssl_passthrough: bool,
    pub preserve_trailing_slash: bool,
    pub use_port_in_redirects: bool,
    pub app_root: Option<UrlPath>,
    pub permanent_redirect: Option<(RedirectUrl, u16)>,
    pub temporal_redirect: Option<(RedirectUrl, u16)>,
    pub proxy_body_size: Option<Size>,
    pub proxy_connect_timeout: Option<Seconds>,
    pub proxy_read_timeout: Option<Seconds>,
    pub proxy_send_timeout: Option<Seconds>,
    pub proxy_next_upstream: Option<Vec<String>>,
    pub proxy_next_upstream_tries: Option<u32>,
    pub proxy_buffering: Option<bool>,
    pub backend_protocol: BackendProtocol,
    /// `proxy-ssl-server-name`: send a TLS server name to HTTPS and GRPCS
    /// backends.
    pub proxy_ssl_server_name: bool,
    /// `proxy-ssl-name`: the server name sent (a literal host name).
    pub proxy_ssl_name: Option<Host>,
    pub upstream_vhost: Option<Host>,
    pub cors: Option<Cors>,
    pub allow_source_range: Vec<String>,
    pub deny_source_range: Vec<String>,
    pub limit_rps: Option<u32>,
    pub limit_connections: Option<u32>,
    /// `limit-rpm`: requests per minute per client.
    pub limit_rpm: Option<u32>,
    /// `limit-burst-multiplier` (default 5): burst = rate × this.
    pub limit_burst_multiplier: Option<u32>,
    /// `limit-allowlist` (`limit-whitelist`): clients no limit applies to.
    pub limit_allowlist: Vec<String>,
    /// `limit-rate` and `limit-rate-after`, in kilobytes (per second).
    pub limit_rate: Option<u64>,
    pub limit_rate_after: Option<u64>,
    pub server_alias: Vec<Host>,
    pub default_backend: Option<String>,
    pub custom_http_errors: Vec<u16>,
    pub configuration_snippet: Option<Snippet>,
    pub server_snippet: Option<Snippet>,
    /// Annotations that may restrict access and are not honoured as
    /// written: access control this controller does not implement (or
    /// that is invalid), and allowed snippets the snippet policy refuses
    /// (a snippet may hold `deny` or `auth_*` rules). An Ingress that has
    /// any fails closed: its paths answer 503, never the unprotected
    /// backend.
    pub fails_closed: Vec<String>,
}

pub use super::catalogue::is_access_control;

impl From<&Canary> for lua_compat::wire::TrafficShapingPolicy {
    fn from(c: &Canary) -> Self {
        lua_compat::wire::TrafficShapingPolicy {
            weight: c.weight,
            weight_total: c.weight_total,
            header: c.by_header.clone(),
            header_value: c.by_header_value.clone(),
            header_pattern: c.by_header_pattern.clone(),
            cookie: c.by_cookie.clone(),
        }
    }
}

impl From<&Affinity> for lua_compat::wire::SessionAffinityConfig {
    fn from(a: &Affinity) -> Self {
        lua_compat::wire::SessionAffinityConfig {
            name: "cookie".into(),
            mode: a.mode.clone(),
            cookie: lua_compat::wire::CookieSessionAffinity {
                name: a.cookie_name.clone(),
                path: a.path.clone(),
                domain: a.domain.clone(),
                expires: a.expires.clone(),
                maxage: a.max_age.clone(),
                secure: a.secure,
                samesite: a.samesite.clone(),
                conditional_samesite_none: a.conditional_samesite_none,
                change_on_failure: a.change_on_failure,
                locations: Default::default(),
            },
        }
    }
}

pub use super::values::parse_bool;

fn parse_int<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, Invalid> {
    s.trim().parse().map_err(|_| Invalid(format!("not {what}: {s:?}")))
}

/// Words made of `[A-Za-z0-9_-]` only: algorithm names, cookie names.
fn parse_word(s: &str, what: &str) -> Result<String, Invalid> {
    let t = s.trim();
    if t.is_empty() || t.len() > 256 || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(Invalid(format!("not {what}: {s:?}")));
    }
    Ok(t.to_string())
}

fn one_of(s: &str, allowed: &[&str], what: &str) -> Result<String, Invalid> {
    let t = s.trim();
    if allowed.contains(&t) {
        Ok(t.to_string())
    } else {
        Err(Invalid(format!("{what} must be one of {}: {s:?}", allowed.join(", "))))
    }
}

/// A hash key for `upstream-hash-by`: nginx variables and literal text. It
/// is only ever sent as JSON, but is still kept to a plain grammar.
fn parse_hash_key(s: &str) -> Result<String, Invalid> {
    let t = s.trim();
    let ok =
        !t.is_empty() && t.len() <= 256 && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"$_-{}:/.".contains(&b));
    if ok {
        Ok(t.to_string())
    } else {
        Err(Invalid(format!("not an upstream-hash-by key: {s:?}")))
    }
}

/// Free-text values that only travel as JSON (cookie paths, header values,
/// header patterns): printable and bounded.
fn parse_json_text(s: &str, what: &str) -> Result<String, Invalid> {
    if s.len() > 1024 || s.chars().any(char::is_control) {
        return Err(Invalid(format!("not {what}: {s:?}")));
    }
    Ok(s.to_string())
}

fn parse_list<T>(s: &str, f: impl Fn(&str) -> Result<T, Invalid>) -> Result<Vec<T>, Invalid> {
    s.split(',').map(str::trim).filter(|p| !p.is_empty()).map(f).collect()
}

fn parse_redirect_code(s: &str, allowed: &[u16]) -> Result<u16, Invalid> {
    let code: u16 = parse_int(s, "an HTTP status")?;
    if allowed.contains(&code) {
        Ok(code)
    } else {
        Err(Invalid(format!("redirect code must be one of {allowed:?}: {s:?}")))
    }
}

const NEXT_UPSTREAM: &[&str] = &[
    "error",
    "timeout",
    "invalid_header",
    "http_500",
    "http_502",
    "http_503",
    "http_504",
    "http_403",
    "http_404",
    "http_429",
    "non_idempotent",
    "off",
];

/// Whether `backend-protocol` asks for TLS to the backend.
fn tls_backend<'r>(get: &dyn Fn(&str) -> Option<&'r str>) -> bool {
    get("backend-protocol").is_some_and(|p| matches!(p.trim().to_ascii_uppercase().as_str(), "HTTPS" | "GRPCS"))
}

impl Annotations {
    /// Parses every annotation under [`PREFIX`]. Snippets are refused unless
    /// `snippets` gives the policy they are judged by (snippets allowed);
    /// then they are kept in canonical form ([`Snippet`]).
    pub fn parse(raw: &BTreeMap<String, String>, snippets: Option<&snippet::Policy>) -> (Annotations, Vec<Problem>) {
        let mut a = Annotations::default();
        let mut problems = Vec::new();
        let get = |key: &str| raw.get(&format!("{PREFIX}{key}")).map(String::as_str);
        for (key, value) in raw {
            let Some(name) = key.strip_prefix(PREFIX) else { continue };
            if let Err(e) = a.apply(name, value, snippets, &get) {
                // Access control that is not honoured as written (refused,
                // invalid, or missing what it needs) fails closed: one rule
                // for every such annotation, never the unprotected backend.
                let reason = if is_access_control(name) {
                    if !a.fails_closed.iter().any(|n| n == name) {
                        a.fails_closed.push(name.to_string());
                    }
                    if e.0.contains("fails closed") {
                        e.0
                    } else {
                        format!("{}; the Ingress fails closed (503)", e.0)
                    }
                } else {
                    e.0
                };
                problems.push(Problem {
                    annotation: key.clone(),
                    reason,
                });
            }
        }
        (a, problems)
    }

    fn apply<'r>(
        &mut self,
        name: &str,
        v: &str,
        snippets: Option<&snippet::Policy>,
        get: &dyn Fn(&str) -> Option<&'r str>,
    ) -> Result<(), Invalid> {
        match name {
            "load-balance" => {
                self.load_balance = Some(one_of(v, &["round_robin", "ewma", "least_conn"], "load-balance")?)
            }
            "upstream-hash-by" => self.upstream_hash_by = Some(parse_hash_key(v)?),
            "upstream-hash-by-subset" => self.upstream_hash_by_subset = parse_bool(v)?,
            "upstream-hash-by-subset-size" => {
                let n: i64 = parse_int(v, "a subset size")?;
                if !(1..=1000).contains(&n) {
                    return Err(Invalid(format!("subset size must be 1..1000: {v:?}")));
                }
                self.upstream_hash_by_subset_size = Some(n);
            }
            "affinity" => {
                one_of(v, &["cookie"], "affinity")?;
                self.affinity = Some(Self::affinity(get)?);
            }
            "affinity-mode" if get("affinity").is_some() => {}
            // Read on a canary Ingress, with or without its own affinity.
            "affinity-canary-behavior" => {
                self.affinity_canary_legacy = one_of(v, &["sticky", "legacy"], "affinity-canary-behavior")? == "legacy"
            }
            n if n.starts_with("session-cookie-") && get("affinity").is_some() => {}
            n if n.starts_with("session-cookie-") || n.starts_with("affinity-") => {
                return Err(Invalid("ignored: it needs affinity: cookie".into()))
            }
            "canary" => {
                if parse_bool(v)? {
                    self.canary = Some(Self::canary(get)?);
                }
            }
            n if n.starts_with("canary-") && get("canary").is_some() => {}
            n if n.starts_with("canary-") => return Err(Invalid("ignored: it needs canary: \"true\"".into())),
            "service-upstream" => self.service_upstream = parse_bool(v)?,
            "rewrite-target" => self.rewrite_target = Some(RewriteTarget::parse(v)?),
            "use-regex" => self.use_regex = parse_bool(v)?,
            "ssl-redirect" => self.ssl_redirect = Some(parse_bool(v)?),
            "force-ssl-redirect" => self.force_ssl_redirect = parse_bool(v)?,
            "ssl-passthrough" => self.ssl_passthrough = parse_bool(v)?,
            "preserve-trailing-slash" => self.preserve_trailing_slash = parse_bool(v)?,
            "use-port-in-redirects" => self.use_port_in_redirects = parse_bool(v)?,
            "app-root" => self.app_root = Some(UrlPath::parse(v)?),
            "permanent-redirect" => {
                let code = get("permanent-redirect-code").map_or(Ok(301), |c| parse_redirect_code(c, &[301, 308]))?;
                self.permanent_redirect = Some((RedirectUrl::parse(v)?, code));
            }
            "temporal-redirect" => {
                let code =
                    get("temporal-redirect-code").map_or(Ok(302), |c| parse_redirect_code(c, &[302, 303, 307]))?;
                self.temporal_redirect = Some((RedirectUrl::parse(v)?, code));
            }
            "permanent-redirect-code" | "temporal-redirect-code" => {}
            "proxy-body-size" => self.proxy_body_size = Some(Size::parse(v)?),
            "proxy-connect-timeout" => self.proxy_connect_timeout = Some(Seconds::parse(v)?),
            "proxy-read-timeout" => self.proxy_read_timeout = Some(Seconds::parse(v)?),
            "proxy-send-timeout" => self.proxy_send_timeout = Some(Seconds::parse(v)?),
            "proxy-next-upstream" => {
                let words = v
                    .split_whitespace()
                    .map(|w| one_of(w, NEXT_UPSTREAM, "proxy-next-upstream"))
                    .collect::<Result<Vec<_>, _>>()?;
                if words.is_empty() {
                    return Err(Invalid("proxy-next-upstream is empty".into()));
                }
                self.proxy_next_upstream = Some(words);
            }
            "proxy-next-upstream-tries" => {
                self.proxy_next_upstream_tries = Some(number_in(v, 0..=MAX_TRIES, "proxy-next-upstream-tries")?)
            }
            "proxy-buffering" => {
                self.proxy_buffering = Some(one_of(v, &["on", "off"], "proxy-buffering")? == "on");
            }
            "proxy-buffer-size" => self.proxy.buffer_size = Some(proxy::buffer_size(v, name)?),
            "proxy-buffers-number" => self.proxy.buffers_number = Some(proxy::buffers_number(v)?),
            "proxy-busy-buffers-size" => self.proxy.busy_buffers_size = Some(proxy::buffer_size(v, name)?),
            "proxy-max-temp-file-size" => self.proxy.max_temp_file_size = Some(proxy::max_temp_file_size(v)?),
            "proxy-request-buffering" => self.proxy.request_buffering = Some(proxy::on_off(v, name)?),
            "client-body-buffer-size" => self.proxy.client_body_buffer_size = Some(proxy::body_buffer_size(v)?),
            "proxy-http-version" => self.proxy.http_version = Some(HttpVersion::parse(v)?),
            "proxy-cookie-domain" => self.proxy.cookie_domain = Some(Rewrite::cookie_domain(v)?),
            "proxy-cookie-path" => self.proxy.cookie_path = Some(Rewrite::cookie_path(v)?),
            "proxy-redirect-from" => self.proxy.redirect = ProxyRedirect::parse(v, get("proxy-redirect-to"))?,
            "proxy-redirect-to" if get("proxy-redirect-from").is_some() => {}
            "proxy-redirect-to" => return Err(Invalid("ignored: it needs proxy-redirect-from".into())),
            "proxy-next-upstream-timeout" => self.proxy.next_upstream_timeout = Some(Seconds::parse(v)?),
            "from-to-www-redirect" => self.from_to_www_redirect = parse_bool(v)?,
            "x-forwarded-prefix" => self.x_forwarded_prefix = Some(UrlPath::parse(v.trim())?),
            "enable-access-log" => self.enable_access_log = Some(parse_bool(v)?),
            "enable-opentelemetry" => self.enable_opentelemetry = Some(parse_bool(v)?),
            "opentelemetry-trust-incoming-span" => self.opentelemetry_trust_incoming_span = Some(parse_bool(v)?),
            "opentelemetry-operation-name" => {
                self.opentelemetry_operation_name = Some(super::otel::OperationName::parse(v)?)
            }
            "enable-rewrite-log" => self.enable_rewrite_log = parse_bool(v)?,
            "disable-proxy-intercept-errors" => self.disable_proxy_intercept_errors = parse_bool(v)?,
            "connection-proxy-header" => {
                // A header value, one token: `keep-alive`, `close`, `upgrade`.
                self.connection_header = Some(HeaderName::parse(v).map_err(|_| {
                    Invalid(format!(
                        "connection-proxy-header must be one token such as keep-alive: {v:?}"
                    ))
                })?)
            }
            "backend-protocol" => {
                self.backend_protocol = match v.trim().to_ascii_uppercase().as_str() {
                    "HTTP" => BackendProtocol::Http,
                    "HTTPS" => BackendProtocol::Https,
                    "GRPC" => BackendProtocol::Grpc,
                    "GRPCS" => BackendProtocol::Grpcs,
                    _ => {
                        return Err(Invalid(format!(
                            "backend-protocol must be HTTP, HTTPS, GRPC or GRPCS: {v:?}"
                        )))
                    }
                }
            }
            "proxy-ssl-server-name" | "proxy-ssl-name" if !tls_backend(get) => {
                return Err(Invalid("ignored: it needs backend-protocol: HTTPS or GRPCS".into()))
            }
            "proxy-ssl-server-name" => {
                let on = one_of(v, &["on", "off"], "proxy-ssl-server-name")? == "on";
                if on && get("proxy-ssl-name").is_none() {
                    return Err(Invalid(
                        "ignored: it needs proxy-ssl-name (ingress-nginx would send its upstream's name, \
                         upstream_balancer, which no certificate matches); no server name is sent"
                            .into(),
                    ));
                }
                self.proxy_ssl_server_name = on;
            }
            "proxy-ssl-name" if get("proxy-ssl-server-name").map(str::trim) != Some("on") => {
                return Err(Invalid("ignored: it needs proxy-ssl-server-name: on".into()))
            }
            "proxy-ssl-name" => {
                let t = v.trim();
                if t.contains('$') {
                    return Err(Invalid(format!(
                        "proxy-ssl-name must be a literal host name: upstream connections are kept alive per \
                         server name, so a name chosen per request could reuse another name's connection: {v:?}"
                    )));
                }
                self.proxy_ssl_name = Some(Host::parse(t)?)
            }
            "upstream-vhost" => self.upstream_vhost = Some(Host::parse(v.trim())?),
            "enable-cors" => {
                if parse_bool(v)? {
                    self.cors = Some(Self::cors(get)?);
                }
            }
            n if n.starts_with("cors-") && get("enable-cors").is_some() => {}
            n if n.starts_with("cors-") => return Err(Invalid("ignored: it needs enable-cors: \"true\"".into())),
            "whitelist-source-range" | "allowlist-source-range" => self.allow_source_range = parse_cidrs(v)?,
            "denylist-source-range" => self.deny_source_range = parse_cidrs(v)?,
            // nginx refuses a rate or connection limit of 0 (ingress-nginx
            // reads 0 as "off"), and a connection limit above 65535.
            "limit-rps" => self.limit_rps = Some(number_in(v, 0..=MAX_RPS, "limit-rps")?).filter(|n| *n > 0),
            "limit-rpm" => self.limit_rpm = Some(number_in(v, 0..=MAX_RPS * 60, "limit-rpm")?).filter(|n| *n > 0),
            "limit-burst-multiplier" => {
                self.limit_burst_multiplier = Some(number_in(v, 1..=100, "limit-burst-multiplier")?)
            }
            "limit-allowlist" | "limit-whitelist" => self.limit_allowlist = parse_cidrs(v)?,
            // Kilobytes, as ingress-nginx renders them (`limit_rate Nk`).
            "limit-rate" => self.limit_rate = Some(number_in(v, 0..=MAX_RATE_KB, "limit-rate")?),
            "limit-rate-after" => self.limit_rate_after = Some(number_in(v, 0..=MAX_RATE_KB, "limit-rate-after")?),
            "limit-connections" => {
                self.limit_connections = Some(number_in(v, 0..=65535, "limit-connections")?).filter(|n| *n > 0)
            }
            "server-alias" => self.server_alias = parse_list(v, Host::parse)?,
            "default-backend" => {
                let t = v.trim();
                if !super::values::is_object_name(t) {
                    return Err(Invalid(format!("not a Service name: {v:?}")));
                }
                self.default_backend = Some(t.to_string());
            }
            "custom-http-errors" => self.custom_http_errors = parse_list(v, error_status)?,
            "configuration-snippet" | "server-snippet" => {
                let Some(policy) = snippets else {
                    return Err(Invalid(
                        "snippet annotations are disabled; start with --allow-snippet-annotations to accept them"
                            .into(),
                    ));
                };
                let text = Snippet::parse(v, policy).map_err(|e| {
                    self.fails_closed.push(name.to_string());
                    Invalid(format!(
                        "{e}; the Ingress fails closed (503) until the snippet is fixed, as it may hold access rules"
                    ))
                })?;
                if name == "server-snippet" {
                    self.server_snippet = text;
                } else {
                    self.configuration_snippet = text;
                }
            }
            "auth-type" => match v.trim() {
                "basic" => {
                    let Some(secret) = get("auth-secret") else {
                        self.fails_closed.push(name.to_string());
                        return Err(Invalid(
                            "auth-type basic needs auth-secret; the Ingress fails closed (503) until it has one".into(),
                        ));
                    };
                    self.basic_auth = Some(Self::basic_auth(secret, get).inspect_err(|_| {
                        self.fails_closed.push("auth-secret".into());
                    })?);
                }
                _ => {
                    self.fails_closed.push(name.to_string());
                    return Err(Invalid(format!(
                        "auth-type must be basic (nginx has no digest authentication): {v:?}; the Ingress fails closed (503)"
                    )));
                }
            },
            "auth-secret" | "auth-secret-type" | "auth-realm" if get("auth-type").is_some() => {}
            "auth-secret" | "auth-secret-type" | "auth-realm" => {
                return Err(Invalid("ignored: it needs auth-type".into()))
            }
            "enable-global-auth" => self.enable_global_auth = Some(parse_bool(v)?),
            "auth-url" => {
                let get_auth = |k: &str| get(&format!("auth-{k}"));
                match super::external_auth::AuthSpec::parse(&get_auth, true) {
                    Ok(spec) => self.external_auth = spec,
                    Err(e) => {
                        self.fails_closed.push(name.to_string());
                        return Err(Invalid(format!("{e}; the Ingress fails closed (503)")));
                    }
                }
            }
            n if n
                .strip_prefix("auth-")
                .and_then(|c| super::external_auth::check_companion(c, v))
                .is_some() =>
            {
                if get("auth-url").is_none() {
                    return Err(Invalid("ignored: it needs auth-url".into()));
                }
                let companion = &n["auth-".len()..];
                super::external_auth::check_companion(companion, v).unwrap_or(Ok(()))?;
            }
            "mirror-target" => {
                let get_mirror = |k: &str| get(&format!("mirror-{k}"));
                self.mirror = Some(super::mirror::MirrorSpec::parse(v, &get_mirror)?);
            }
            n if n
                .strip_prefix("mirror-")
                .and_then(|c| super::mirror::check_companion(c, v))
                .is_some() =>
            {
                if get("mirror-target").is_none() {
                    return Err(Invalid("ignored: it needs mirror-target".into()));
                }
                super::mirror::check_companion(&n["mirror-".len()..], v).unwrap_or(Ok(()))?;
            }
            "custom-headers" => self.custom_headers = Some(super::header_sets::SetRef::parse(v)?),
            "relative-redirects" => self.relative_redirects = Some(parse_bool(v)?),
            "satisfy" => self.satisfy_any = one_of(v, &["all", "any"], "satisfy")? == "any",
            "auth-tls-secret" => {
                let get_tls = |k: &str| get(&format!("auth-tls-{k}"));
                match super::client_auth::AuthTlsRef::parse(v, &get_tls) {
                    Ok(r) => self.auth_tls = Some(r),
                    Err(e) => {
                        self.fails_closed.push(name.to_string());
                        return Err(Invalid(format!("{e}; the Ingress fails closed (503)")));
                    }
                }
            }
            n if n
                .strip_prefix("auth-tls-")
                .and_then(|c| super::client_auth::check_companion(c, v))
                .is_some() =>
            {
                let companion = &n["auth-tls-".len()..];
                if get("auth-tls-secret").is_none() {
                    // A subject check is meant to restrict: without the CA it
                    // cannot, so the Ingress closes rather than opens.
                    if companion == "match-cn" {
                        self.fails_closed.push(n.to_string());
                        return Err(Invalid(
                            "auth-tls-match-cn needs auth-tls-secret; the Ingress fails closed (503)".into(),
                        ));
                    }
                    return Err(Invalid("ignored: it needs auth-tls-secret".into()));
                }
                super::client_auth::check_companion(companion, v).unwrap_or(Ok(()))?;
            }
            n if is_access_control(n) => {
                self.fails_closed.push(n.to_string());
                let why = catalogue::annotation(n).map_or("not implemented", |e| e.status.note());
                return Err(Invalid(format!(
                    "not supported ({why}); the Ingress fails closed: its paths answer 503 until the annotation is removed"
                )));
            }
            n => return Err(Invalid(catalogue::unsupported_reason(catalogue::annotation(n)))),
        }
        Ok(())
    }

    /// The secret (`name`, or `namespace/name` of the Ingress's own
    /// namespace, which the builder checks), its type and the realm.
    fn basic_auth<'r>(secret: &str, get: &dyn Fn(&str) -> Option<&'r str>) -> Result<BasicAuthRef, Invalid> {
        let secret = secret.trim();
        let name = secret.rsplit('/').next().unwrap_or(secret);
        if !super::values::is_object_name(name) || secret.matches('/').count() > 1 {
            return Err(Invalid(format!(
                "auth-secret is not a Secret name: {secret:?}; the Ingress fails closed"
            )));
        }
        Ok(BasicAuthRef {
            secret: secret.to_string(),
            secret_type: get("auth-secret-type").map_or(Ok(SecretType::AuthFile), SecretType::parse)?,
            realm: get("auth-realm").map_or_else(|| Ok("Authentication Required".into()), basic_auth::realm)?,
        })
    }

    fn affinity<'r>(get: &dyn Fn(&str) -> Option<&'r str>) -> Result<Affinity, Invalid> {
        let text = |k: &str| {
            get(k)
                .map(|v| parse_json_text(v, k))
                .transpose()
                .map(Option::unwrap_or_default)
        };
        let flag = |k: &str| get(k).map(parse_bool).transpose().map(Option::unwrap_or_default);
        Ok(Affinity {
            mode: get("affinity-mode")
                .map(|v| one_of(v, &["balanced", "persistent"], "affinity-mode"))
                .transpose()?
                .unwrap_or_else(|| "balanced".into()),
            cookie_name: get("session-cookie-name")
                .map(|v| parse_word(v, "a cookie name"))
                .transpose()?
                .unwrap_or_else(|| "INGRESSCOOKIE".into()),
            path: text("session-cookie-path")?,
            domain: text("session-cookie-domain")?,
            expires: get("session-cookie-expires")
                .map(|v| parse_int::<u64>(v, "seconds").map(|n| n.to_string()))
                .transpose()?
                .unwrap_or_default(),
            max_age: get("session-cookie-max-age")
                .map(|v| parse_int::<u64>(v, "seconds").map(|n| n.to_string()))
                .transpose()?
                .unwrap_or_default(),
            secure: flag("session-cookie-secure")?,
            samesite: get("session-cookie-samesite")
                .map(|v| one_of(v, &["None", "Lax", "Strict"], "session-cookie-samesite"))
                .transpose()?
                .unwrap_or_default(),
            conditional_samesite_none: flag("session-cookie-conditional-samesite-none")?,
            change_on_failure: flag("session-cookie-change-on-failure")?,
        })
    }

    fn canary<'r>(get: &dyn Fn(&str) -> Option<&'r str>) -> Result<Canary, Invalid> {
        let weight_total = get("canary-weight-total").map_or(Ok(100), |v| parse_int::<i64>(v, "a weight total"))?;
        let weight = get("canary-weight").map_or(Ok(0), |v| parse_int::<i64>(v, "a weight"))?;
        if weight_total <= 0 || !(0..=weight_total).contains(&weight) {
            return Err(Invalid(format!(
                "canary-weight {weight} must be within 0..={weight_total}"
            )));
        }
        let text = |k: &str| {
            get(k)
                .map(|v| parse_json_text(v, k))
                .transpose()
                .map(Option::unwrap_or_default)
        };
        Ok(Canary {
            weight,
            weight_total,
            by_header: get("canary-by-header")
                .map(|v| HeaderName::parse(v).map(|h| h.as_str().to_string()))
                .transpose()?
                .unwrap_or_default(),
            by_header_value: text("canary-by-header-value")?,
            by_header_pattern: text("canary-by-header-pattern")?,
            by_cookie: get("canary-by-cookie")
                .map(|v| parse_word(v, "a cookie name"))
                .transpose()?
                .unwrap_or_default(),
        })
    }

    fn cors<'r>(get: &dyn Fn(&str) -> Option<&'r str>) -> Result<Cors, Invalid> {
        let headers = |k: &str, default: &str| parse_list(get(k).unwrap_or(default), HeaderName::parse);
        Ok(Cors {
            allow_origin: parse_list(get("cors-allow-origin").unwrap_or("*"), Origin::parse)?,
            allow_methods: headers("cors-allow-methods", "GET, PUT, POST, DELETE, PATCH, OPTIONS")?,
            allow_headers: headers(
                "cors-allow-headers",
                "DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization",
            )?,
            expose_headers: headers("cors-expose-headers", "")?,
            allow_credentials: get("cors-allow-credentials").map_or(Ok(true), parse_bool)?,
            max_age: get("cors-max-age").map_or(Ok(1728000), |v| parse_int(v, "seconds"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)], snippets: bool) -> (Annotations, Vec<Problem>) {
        let raw = pairs
            .iter()
            .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
            .collect();
        Annotations::parse(&raw, snippets.then_some(&snippet::Policy::default()))
    }

    #[test]
    fn valid_values_are_typed() {
        let (a, p) = parse(
            &[
                ("proxy-read-timeout", "120"),
                ("proxy-body-size", "8m"),
                ("ssl-redirect", "false"),
                ("whitelist-source-range", "10.0.0.0/8,192.168.1.1"),
                ("backend-protocol", "GRPC"),
                ("permanent-redirect", "https://example.com/new"),
                ("permanent-redirect-code", "308"),
                ("canary", "true"),
                ("canary-weight", "30"),
                ("affinity", "cookie"),
                ("session-cookie-name", "route"),
            ],
            false,
        );
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(a.proxy_read_timeout, Some(Seconds(120)));
        assert_eq!(a.ssl_redirect, Some(false));
        assert_eq!(a.allow_source_range, ["10.0.0.0/8", "192.168.1.1"]);
        assert_eq!(a.backend_protocol, BackendProtocol::Grpc);
        assert_eq!(a.permanent_redirect.unwrap().1, 308);
        assert_eq!(a.canary.unwrap().weight, 30);
        assert_eq!(a.affinity.unwrap().cookie_name, "route");
    }

    #[test]
    fn a_bad_value_drops_only_that_annotation() {
        let (a, p) = parse(&[("proxy-read-timeout", "soon"), ("proxy-send-timeout", "9")], false);
        assert_eq!(a.proxy_read_timeout, None);
        assert_eq!(a.proxy_send_timeout, Some(Seconds(9)));
        assert_eq!(p.len(), 1);
        assert!(p[0].reason.contains("timeout"), "{p:?}");
    }

    #[test]
    fn snippets_need_the_flag() {
        let (a, p) = parse(&[("configuration-snippet", "more_set_headers x;")], false);
        assert!(a.configuration_snippet.is_none() && p[0].reason.contains("disabled"));
        let (a, p) = parse(&[("configuration-snippet", "more_set_headers x;")], true);
        assert!(a.configuration_snippet.is_some() && p.is_empty());
        // Allowed, a snippet is still judged: one that leaves its block is
        // refused like any invalid value.
        let (a, p) = parse(&[("server-snippet", "} ssl_engine /tmp/x.so; server {")], true);
        assert!(
            a.server_snippet.is_none() && p[0].reason.contains("not a complete list"),
            "{p:?}"
        );
    }

    #[test]
    fn unknown_annotations_are_reported() {
        let (_, p) = parse(&[("http2-push-preload", "true"), ("no-such-thing", "1")], false);
        assert!(p[0].reason.contains("not supported"), "{p:?}");
        assert!(p[1].reason.contains("not an ingress-nginx name"), "{p:?}");
    }

    #[test]
    fn fails_closed_fails_closed() {
        let (a, p) = parse(
            &[
                ("auth-type", "digest"),
                ("auth-secret", "basic-auth"),
                // An auth-url that cannot be used: closed, never open.
                ("auth-url", "https://auth.example/check; allow all"),
                ("satisfy", "sometimes"),
                ("enable-modsecurity", "true"),
                ("enable-global-auth", "false"),
                ("http2-push-preload", "true"),
            ],
            false,
        );
        assert_eq!(
            a.fails_closed,
            ["auth-type", "auth-url", "enable-modsecurity", "satisfy"]
        );
        assert!(
            p.iter().filter(|p| p.reason.contains("fails closed")).count() == 4,
            "{p:?}"
        );
        assert!(p
            .iter()
            .any(|p| p.annotation.ends_with("http2-push-preload") && p.reason.contains("ignored")));
        assert!(!p.iter().any(|p| p.annotation.ends_with("enable-global-auth")));
    }

    #[test]
    fn basic_auth_needs_its_secret() {
        let (a, p) = parse(
            &[
                ("auth-type", "basic"),
                ("auth-secret", "team/users"),
                ("auth-realm", "Team"),
            ],
            false,
        );
        assert!(p.is_empty(), "{p:?}");
        let b = a.basic_auth.unwrap();
        assert_eq!((b.secret.as_str(), b.realm.as_str()), ("team/users", "Team"));
        let (a, p) = parse(&[("auth-type", "basic")], false);
        assert!(a.basic_auth.is_none() && a.fails_closed == ["auth-type"], "{p:?}");
        let (a, _) = parse(&[("auth-type", "basic"), ("auth-secret", "a/b/c")], false);
        assert!(a.basic_auth.is_none() && !a.fails_closed.is_empty());
        let (a, _) = parse(
            &[("auth-type", "basic"), ("auth-secret", "users"), ("auth-realm", "\"$x")],
            false,
        );
        assert!(a.basic_auth.is_none() && !a.fails_closed.is_empty());
        let (_, p) = parse(&[("auth-secret", "users")], false);
        assert!(p[0].reason.contains("needs auth-type"), "{p:?}");
    }

    #[test]
    fn canary_weight_must_fit_the_total() {
        let (a, p) = parse(&[("canary", "true"), ("canary-weight", "300")], false);
        assert!(a.canary.is_none() && p.len() == 1);
    }
}
