//! The controller's ConfigMap: global settings with ingress-nginx's names and
//! defaults. Any change here is structural (it reloads), as in ingress-nginx.

use std::collections::BTreeMap;

use serde::Serialize;

use super::annotations::Problem;
use super::http_settings::HttpSettings;
use super::proxy_settings::ProxyDefaults;
use super::real_ip::RealIp;
use super::ssl_settings;
use super::stream_settings::StreamSettings;
use super::values::{error_status, number_in, HeaderName, Invalid, Seconds, Size};

/// Typed global settings. Unknown or invalid keys are reported and ignored.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct GlobalConfig {
    /// `0` means `auto`.
    pub worker_processes: u32,
    pub max_worker_connections: u32,
    pub worker_shutdown_timeout: Seconds,
    pub load_balance: String,
    pub upstream_keepalive_connections: u32,
    pub upstream_keepalive_timeout: Seconds,
    pub upstream_keepalive_requests: u32,
    pub proxy_connect_timeout: Seconds,
    pub proxy_read_timeout: Seconds,
    pub proxy_send_timeout: Seconds,
    pub proxy_body_size: Size,
    pub proxy_next_upstream: Vec<String>,
    pub proxy_next_upstream_tries: u32,
    pub proxy_buffering: bool,
    pub ssl_redirect: bool,
    pub hsts: bool,
    pub hsts_max_age: u32,
    pub hsts_include_subdomains: bool,
    /// `hsts-preload`: `; preload` in the header.
    pub hsts_preload: bool,
    /// `use-http2`: HTTP/2 on the listeners (ALPN `h2` on TLS; like
    /// ingress-nginx, cleartext clients may also start with the HTTP/2
    /// preface).
    pub use_http2: bool,
    /// `use-http3`: HTTP/3 over QUIC on the HTTPS port (UDP), announced with
    /// `Alt-Svc`. Off by default.
    pub use_http3: bool,
    /// The `ssl-*` keys.
    pub ssl: super::ssl_settings::SslSettings,
    pub http_redirect_code: u16,
    /// `no-tls-redirect-locations`: locations whose path starts with one
    /// of these are never redirected to HTTPS (ACME HTTP-01 challenges must
    /// stay reachable over plain HTTP).
    pub no_tls_redirect_locations: Vec<String>,
    /// `global-auth-url` and its companions: external authentication for
    /// every location whose Ingress does not opt out (`enable-global-auth:
    /// "false"`) or bring its own `auth-url`.
    pub global_auth: Option<super::external_auth::AuthSpec>,
    /// An invalid `global-auth-url`: the locations it would protect fail
    /// closed (503) rather than open.
    pub global_auth_refused: Option<String>,
    /// `no-auth-locations`: path prefixes global authentication skips
    /// (ACME challenges by default).
    pub no_auth_locations: Vec<String>,
    pub use_forwarded_headers: bool,
    pub keep_alive: Seconds,
    pub enable_access_log: bool,
    /// `relative-redirects`: nginx's own redirects (a directory's trailing
    /// slash) keep a relative `Location` (`absolute_redirect off`).
    pub relative_redirects: bool,
    /// Send `X-Request-ID` upstream, generating one when the client sent
    /// none (ingress-nginx's `generate-request-id`). Generating costs a
    /// random-number call per request.
    pub generate_request_id: bool,
    pub allow_snippet_annotations: bool,
    pub custom_http_errors: Vec<u16>,
    /// Proxy buffers, bodies and rewrites for every location.
    pub proxy: ProxyDefaults,
    /// Plain `http {}` settings (client buffers, hashes, headers, gzip).
    pub http: HttpSettings,
    /// The client address behind trusted proxies.
    pub real_ip: RealIp,
    /// The `proxy-stream-*` keys of the layer-4 servers.
    pub stream: StreamSettings,
    /// `add-headers`: a header set added to every response.
    pub add_headers: Option<super::header_sets::SetRef>,
    /// `global-allowed-response-headers`: the header names `custom-headers`
    /// may set (lower case), as ingress-nginx requires since v1.12.
    pub allowed_response_headers: Vec<String>,
    /// `proxy-set-headers`: a header set sent upstream from every location.
    pub proxy_set_headers: Option<super::header_sets::SetRef>,
    /// The access log's format and the log files.
    pub log: super::log_format::LogFormat,
    /// Lower bounds for the computed `server_names_hash_*` sizes.
    pub server_name_hash_bucket_size: usize,
    pub server_name_hash_max_size: usize,
    /// OpenTelemetry tracing (`enable-opentelemetry`, `otel-*`, …).
    pub otel: super::otel::OtelGlobal,
}

impl Default for GlobalConfig {
    fn default() -> Self {
        GlobalConfig {
            worker_processes: 0,
            max_worker_connections: 16384,
            worker_shutdown_timeout: Seconds(240),
            load_balance: "round_robin".into(),
            upstream_keepalive_connections: 320,
            upstream_keepalive_timeout: Seconds(60),
            upstream_keepalive_requests: 10000,
            proxy_connect_timeout: Seconds(5),
            proxy_read_timeout: Seconds(60),
            proxy_send_timeout: Seconds(60),
            proxy_body_size: Size::parse("1m").expect("valid default"),
            proxy_next_upstream: vec!["error".into(), "timeout".into()],
            proxy_next_upstream_tries: 3,
            proxy_buffering: false,
            ssl_redirect: true,
            hsts: true,
            hsts_max_age: 31_536_000,
            hsts_include_subdomains: true,
            hsts_preload: false,
            use_http2: true,
            use_http3: false,
            ssl: Default::default(),
            http_redirect_code: 308,
            no_tls_redirect_locations: vec!["/.well-known/acme-challenge".into()],
            global_auth: None,
            global_auth_refused: None,
            no_auth_locations: vec!["/.well-known/acme-challenge".into()],
            use_forwarded_headers: false,
            keep_alive: Seconds(75),
            enable_access_log: true,
            relative_redirects: false,
            generate_request_id: true,
            allow_snippet_annotations: false,
            custom_http_errors: Vec::new(),
            proxy: ProxyDefaults::default(),
            http: HttpSettings::default(),
            real_ip: RealIp::default(),
            stream: StreamSettings::default(),
            add_headers: None,
            allowed_response_headers: Vec::new(),
            proxy_set_headers: None,
            log: Default::default(),
            server_name_hash_bucket_size: 64,
            server_name_hash_max_size: 1024,
            otel: Default::default(),
        }
    }
}

fn flag(v: &str) -> Result<bool, Invalid> {
    match v.trim() {
        "true" | "True" | "TRUE" | "1" | "t" | "T" => Ok(true),
        "false" | "False" | "FALSE" | "0" | "f" | "F" => Ok(false),
        _ => Err(Invalid(format!("not a boolean: {v:?}"))),
    }
}

/// A comma-separated list of path prefixes (`no-tls-redirect-locations`,
/// `no-auth-locations`): each a plain URL path.
fn url_path_prefixes(v: &str) -> Result<Vec<String>, Invalid> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let path = super::values::UrlPath::parse(item).map_err(|_| Invalid(format!("not a path prefix: {item:?}")))?;
        out.push(path.as_str().to_string());
    }
    Ok(out)
}

fn number<T: std::str::FromStr>(v: &str) -> Result<T, Invalid> {
    v.trim().parse().map_err(|_| Invalid(format!("not a number: {v:?}")))
}

impl GlobalConfig {
    pub fn parse(data: &BTreeMap<String, String>) -> (GlobalConfig, Vec<Problem>) {
        let mut c = GlobalConfig::default();
        let mut problems = Vec::new();
        for (key, v) in data {
            let grouped = (c.proxy.apply(key, v))
                .or_else(|| c.http.apply(key, v))
                .or_else(|| c.real_ip.apply(key, v))
                .or_else(|| c.stream.apply(key, v))
                .or_else(|| c.log.apply(key, v));
            let result: Result<(), Invalid> = grouped.unwrap_or_else(|| {
                match key.as_str() {
                    "worker-processes" => {
                        c.worker_processes = if v.trim() == "auto" {
                            0
                        } else {
                            number_in(v, 1..=256, "worker-processes")?
                        };
                    }
                    "max-worker-connections" => {
                        c.max_worker_connections = number_in(v, 1..=1_048_576, "max-worker-connections")?
                    }
                    "worker-shutdown-timeout" => c.worker_shutdown_timeout = Seconds::parse(v)?,
                    "load-balance" => {
                        if !["round_robin", "ewma", "least_conn"].contains(&v.trim()) {
                            return Err(Invalid(format!("unknown load-balance: {v:?}")));
                        }
                        c.load_balance = v.trim().into();
                    }
                    "upstream-keepalive-connections" => {
                        // 0 turns upstream keepalive off (nginx itself refuses `keepalive 0`).
                        c.upstream_keepalive_connections =
                            number_in(v, 0..=1_000_000, "upstream-keepalive-connections")?
                    }
                    "upstream-keepalive-timeout" => c.upstream_keepalive_timeout = Seconds::parse(v)?,
                    "upstream-keepalive-requests" => {
                        c.upstream_keepalive_requests = number_in(v, 1..=u32::MAX, "upstream-keepalive-requests")?
                    }
                    "proxy-connect-timeout" => c.proxy_connect_timeout = Seconds::parse(v)?,
                    "proxy-read-timeout" => c.proxy_read_timeout = Seconds::parse(v)?,
                    "proxy-send-timeout" => c.proxy_send_timeout = Seconds::parse(v)?,
                    "proxy-body-size" => c.proxy_body_size = Size::parse(v)?,
                    "proxy-next-upstream" => {
                        let words: Vec<String> = v.split_whitespace().map(String::from).collect();
                        let known = ["error", "timeout", "invalid_header", "http_500", "http_502", "http_503"];
                        let extra = ["http_504", "http_403", "http_404", "http_429", "non_idempotent", "off"];
                        if words.is_empty() || !words.iter().all(|w| known.contains(&&**w) || extra.contains(&&**w)) {
                            return Err(Invalid(format!("not a proxy-next-upstream list: {v:?}")));
                        }
                        c.proxy_next_upstream = words;
                    }
                    "proxy-next-upstream-tries" => {
                        c.proxy_next_upstream_tries =
                            number_in(v, 0..=super::annotations::MAX_TRIES, "proxy-next-upstream-tries")?
                    }
                    "proxy-buffering" => c.proxy_buffering = v.trim() == "on",
                    "ssl-redirect" => c.ssl_redirect = flag(v)?,
                    "hsts" => c.hsts = flag(v)?,
                    "hsts-max-age" => c.hsts_max_age = number(v)?,
                    "hsts-include-subdomains" => c.hsts_include_subdomains = flag(v)?,
                    "hsts-preload" => c.hsts_preload = flag(v)?,
                    "use-http2" => c.use_http2 = flag(v)?,
                    "use-http3" => c.use_http3 = flag(v)?,
                    "ssl-protocols" => c.ssl.protocols = ssl_settings::protocols(v)?,
                    "ssl-ciphers" => c.ssl.ciphers = ssl_settings::ciphers(v)?,
                    "ssl-prefer-server-ciphers" => c.ssl.prefer_server_ciphers = flag(v)?,
                    "ssl-session-cache" => c.ssl.session_cache = flag(v)?,
                    "ssl-session-cache-size" => c.ssl.session_cache_size = ssl_settings::cache_size(v)?,
                    "ssl-session-timeout" => c.ssl.session_timeout = ssl_settings::time(v, "ssl-session-timeout")?,
                    "ssl-session-tickets" => c.ssl.session_tickets = flag(v)?,
                    "ssl-ecdh-curve" => c.ssl.ecdh_curve = ssl_settings::ecdh_curve(v)?,
                    "ssl-early-data" => c.ssl.early_data = flag(v)?,
                    "http-redirect-code" => {
                        let code = number(v)?;
                        if ![301, 302, 307, 308].contains(&code) {
                            return Err(Invalid(format!(
                                "http-redirect-code must be 301, 302, 307 or 308: {v:?}"
                            )));
                        }
                        c.http_redirect_code = code;
                    }
                    "no-tls-redirect-locations" => c.no_tls_redirect_locations = url_path_prefixes(v)?,
                    "global-allowed-response-headers" => {
                        c.allowed_response_headers = v
                            .split(',')
                            .map(str::trim)
                            .filter(|h| !h.is_empty())
                            .map(|h| HeaderName::parse(h).map(|n| n.as_str().to_ascii_lowercase()))
                            .collect::<Result<_, _>>()?
                    }
                    "add-headers" => c.add_headers = Some(super::header_sets::SetRef::parse(v)?),
                    "proxy-set-headers" => c.proxy_set_headers = Some(super::header_sets::SetRef::parse(v)?),
                    "no-auth-locations" => c.no_auth_locations = url_path_prefixes(v)?,
                    "global-auth-url" => {
                        if let Err(e) = super::external_auth::AuthUrl::parse(v, "global-auth-url") {
                            // The value stays out of nginx.conf (the closed
                            // locations' comment quotes this).
                            c.global_auth_refused = Some("not a usable http(s) URL".into());
                            return Err(Invalid(format!(
                                "{e}; locations under global authentication fail closed (503)"
                            )));
                        }
                    }
                    k if k
                        .strip_prefix("global-auth-")
                        .and_then(|c| super::external_auth::check_companion(c, v))
                        .is_some() =>
                    {
                        let companion = &k["global-auth-".len()..];
                        if companion.starts_with("keepalive") {
                            return Err(Invalid(
                                "not an ingress-nginx key (auth-keepalive is per Ingress)".into(),
                            ));
                        }
                        if !data.contains_key("global-auth-url") {
                            return Err(Invalid("ignored: it needs global-auth-url".into()));
                        }
                        super::external_auth::check_companion(companion, v).unwrap_or(Ok(()))?;
                    }
                    "use-forwarded-headers" => c.use_forwarded_headers = flag(v)?,
                    "keep-alive" => c.keep_alive = Seconds::parse(v)?,
                    "disable-access-log" => c.enable_access_log = !flag(v)?,
                    "enable-access-log" => c.enable_access_log = flag(v)?,
                    "relative-redirects" => c.relative_redirects = flag(v)?,
                    "allow-snippet-annotations" => c.allow_snippet_annotations = flag(v)?,
                    "generate-request-id" => c.generate_request_id = flag(v)?,
                    k if super::otel::KEYS.contains(&k) => c.otel.apply(k, v, flag)?,
                    "server-name-hash-bucket-size" => {
                        let n: usize = number_in(v, 32..=65536, "server-name-hash-bucket-size")?;
                        if !n.is_power_of_two() {
                            return Err(Invalid(format!(
                                "server-name-hash-bucket-size must be a power of two: {v:?}"
                            )));
                        }
                        c.server_name_hash_bucket_size = n;
                    }
                    "server-name-hash-max-size" => {
                        c.server_name_hash_max_size = number_in(v, 512..=1 << 22, "server-name-hash-max-size")?
                    }
                    "custom-http-errors" => {
                        c.custom_http_errors = v
                            .split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(error_status)
                            .collect::<Result<_, _>>()?;
                    }
                    k => {
                        return Err(Invalid(super::catalogue::unsupported_reason(
                            super::catalogue::config_map_key(k),
                        )))
                    }
                }
                Ok(())
            });
            // A global-auth key not honoured as written: the locations global
            // authentication covers fail closed rather than open.
            if result.is_err() && key.starts_with("global-auth-") && data.contains_key("global-auth-url") {
                c.global_auth_refused.get_or_insert_with(|| format!("{key} is invalid"));
            }
            if let Err(e) = result {
                problems.push(Problem {
                    annotation: format!("ConfigMap key {key}"),
                    reason: e.0,
                });
            }
        }
        let get_auth = |k: &str| data.get(&format!("global-auth-{k}")).map(String::as_str);
        c.global_auth = super::external_auth::AuthSpec::parse(&get_auth, false).ok().flatten();
        c.http.finish();
        if let Err(e) = c.proxy.settle_buffers() {
            problems.push(Problem {
                annotation: "ConfigMap key proxy-buffers-number".into(),
                reason: format!(
                    "{e}; proxy-buffer-size, proxy-buffers-number and proxy-busy-buffers-size keep their defaults"
                ),
            });
        }
        // QUIC carries TLS 1.3 only: without it every HTTP/3 handshake
        // would fail, so HTTP/3 stays off and the operator is told.
        if c.use_http3 && !c.ssl.protocols.iter().any(|p| p == "TLSv1.3") {
            c.use_http3 = false;
            problems.push(Problem {
                annotation: "ConfigMap key use-http3".into(),
                reason: "HTTP/3 needs TLSv1.3 in ssl-protocols; HTTP/3 stays off".into(),
            });
        }
        (c, problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_typed_and_bad_ones_reported() {
        let data = [
            ("proxy-read-timeout", "90"),
            ("worker-processes", "2"),
            ("hsts", "maybe"),
            ("x", "y"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (c, p) = GlobalConfig::parse(&data);
        assert_eq!(c.proxy_read_timeout, Seconds(90));
        assert_eq!(c.worker_processes, 2);
        assert!(c.hsts);
        assert_eq!(p.len(), 2);
    }

    #[test]
    fn http3_needs_tls_1_3() {
        let parse = |pairs: &[(&str, &str)]| {
            GlobalConfig::parse(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        };
        let (c, p) = parse(&[("use-http3", "true")]);
        assert!(c.use_http3 && p.is_empty());
        let (c, p) = parse(&[("use-http3", "true"), ("ssl-protocols", "TLSv1.2")]);
        assert!(!c.use_http3);
        assert!(p[0].reason.contains("TLSv1.3"), "{p:?}");
        assert!(!parse(&[]).0.use_http3, "off by default");
    }
}
