//! External authentication: ingress-nginx's `auth-url` family (and the
//! ConfigMap's `global-auth-*`), rendered with nginx's `auth_request`.
//!
//! Every request to a protected location first makes a subrequest to the
//! auth service: 2xx lets it through (with the headers named in
//! `auth-response-headers` copied upstream), 401 and 403 answer the client
//! (401 becomes a redirect to `auth-signin` when set), anything else is a
//! 500. The values are parsed here into a grammar nginx cannot misread: URLs
//! are `http(s)://host[:port]` plus a plain path and query in which only a
//! short list of nginx variables may appear ([`URL_VARIABLES`]).
//!
//! Tenant safety: the auth URL's host is where nginx connects, so it gets
//! the same policy as endpoints. An IP on this host (loopback, link-local,
//! this-host) is refused unless local endpoints are allowed, and never on a
//! port of nginx or the controller; `localhost` in any spelling is refused.
//! `$host` in the host part (oauth2-proxy's documented
//! `https://$host/oauth2/auth`) is replaced by the server's name when the
//! configuration is built, so a client's `Host` header never chooses where
//! nginx connects; it is refused on the catch-all and wildcard servers,
//! whose `$host` is whatever the client sends.

use std::net::IpAddr;

use serde::Serialize;

use super::endpoints::AddressPolicy;
use super::values::{HeaderName, Host, Invalid};

/// Variables an auth URL, sign-in URL, redirect or cache key may name:
/// request facts, no secrets of the configuration. `$pass_access_scheme`
/// and `$pass_server_port` are the template's; `$escaped_request_uri` the
/// module's.
pub const URL_VARIABLES: &[&str] = &[
    "host",
    "http_host",
    "scheme",
    "request_uri",
    "escaped_request_uri",
    "uri",
    "args",
    "request_method",
    "remote_addr",
    "remote_user",
    "server_name",
    "server_port",
    "pass_access_scheme",
    "pass_server_port",
];

/// Variable prefixes a cache key may use (`auth-cache-key`), e.g.
/// `$http_authorization$cookie__oauth2_proxy`.
const KEY_VARIABLE_PREFIXES: &[&str] = &["http_", "cookie_", "arg_"];

/// Methods `auth-method` may name.
const METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT",
];

/// Whether `$name` may appear in a URL or cache key.
pub fn known_variable(name: &str, key: bool) -> bool {
    URL_VARIABLES.contains(&name)
        || (key
            && KEY_VARIABLE_PREFIXES.iter().any(|p| {
                name.strip_prefix(p).is_some_and(|rest| {
                    !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                })
            }))
}

/// Checks text made of `plain` bytes and `$name` variables (names that
/// [`known_variable`] accepts); `${name}` is accepted too.
fn check_text(s: &str, plain: impl Fn(u8) -> bool, key: bool, what: &str) -> Result<(), Invalid> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'$' {
            let braced = bytes.get(i + 1) == Some(&b'{');
            let start = i + 1 + usize::from(braced);
            let mut end = start;
            while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
                end += 1;
            }
            let name = &s[start..end];
            if name.is_empty() || !known_variable(&name.to_ascii_lowercase(), key) {
                return Err(Invalid(format!(
                    "{what}: ${name} is not a variable allowed here (allowed: ${}, and in cache keys $http_*, $cookie_*, $arg_*): {s:?}",
                    URL_VARIABLES.join(", $")
                )));
            }
            if braced {
                if bytes.get(end) != Some(&b'}') {
                    return Err(Invalid(format!("{what}: unclosed ${{: {s:?}")));
                }
                end += 1;
            }
            i = end;
        } else if plain(b) {
            i += 1;
        } else {
            return Err(Invalid(format!("{what}: {:?} is not allowed: {s:?}", b as char)));
        }
    }
    Ok(())
}

/// The bytes of a URL's path and query (RFC 3986's unreserved and
/// sub-delimiters that are inert in nginx syntax).
fn url_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"/-._~%!*+,=:@?&".contains(&b)
}

/// The host of an auth or sign-in URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub enum UrlHost {
    Name(Host),
    Ip(IpAddr),
    /// `$host`: the server's name for `auth-url`, the request's for
    /// `auth-signin`.
    RequestHost,
    /// `$http_host` (sign-in only: the client's own `Host`, port included).
    HttpHost,
}

/// `http(s)://host[:port]` and a path and query.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct AuthUrl {
    pub https: bool,
    pub host: UrlHost,
    pub port: Option<u16>,
    /// Path and query, empty or starting with `/` or `?`.
    pub tail: String,
}

impl AuthUrl {
    pub fn parse(s: &str, what: &str) -> Result<Self, Invalid> {
        let s = s.trim();
        if s.len() > 2048 {
            return Err(Invalid(format!("{what} is longer than 2048 bytes")));
        }
        let (https, rest) = if let Some(r) = s.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = s.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(Invalid(format!("{what} is not an http(s) URL: {s:?}")));
        };
        // The authority ends at the path, the query, or a variable that
        // starts the path (`https://mirror.example.com$request_uri`).
        let host_variable = ["${host}", "$host", "${http_host}", "$http_host"]
            .iter()
            .find(|v| rest.starts_with(**v))
            .map_or(0, |v| v.len());
        let split = rest[host_variable..]
            .find(['/', '?', '$'])
            .map_or(rest.len(), |i| i + host_variable);
        let (authority, tail) = rest.split_at(split);
        let (host, port) = split_port(authority).ok_or_else(|| Invalid(format!("{what}: bad port: {s:?}")))?;
        let host = match host {
            "$host" | "${host}" => UrlHost::RequestHost,
            "$http_host" | "${http_host}" => UrlHost::HttpHost,
            h => {
                let bare = h.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(h);
                if let Ok(ip) = bare.parse::<IpAddr>() {
                    if ip.is_ipv6() != h.starts_with('[') {
                        return Err(Invalid(format!("{what}: an IPv6 address goes in brackets: {s:?}")));
                    }
                    UrlHost::Ip(ip)
                } else if h.starts_with("*.") {
                    return Err(Invalid(format!("{what}: a wildcard is not a host: {s:?}")));
                } else {
                    UrlHost::Name(Host::parse(h).map_err(|_| Invalid(format!("{what}: not a host name: {s:?}")))?)
                }
            }
        };
        if host == UrlHost::HttpHost && port.is_some() {
            return Err(Invalid(format!("{what}: $http_host carries its own port: {s:?}")));
        }
        check_text(tail, url_byte, false, what)?;
        Ok(AuthUrl {
            https,
            host,
            port,
            tail: tail.to_string(),
        })
    }

    /// The URL with the host written as `host` (and the port, if any).
    fn with_host(&self, host: &str) -> String {
        let scheme = if self.https { "https" } else { "http" };
        let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
        format!("{scheme}://{host}{port}{}", self.tail)
    }

    /// The host as written in a URL (`$host` kept).
    fn host_text(&self) -> String {
        match &self.host {
            UrlHost::Name(h) => h.as_str().to_string(),
            UrlHost::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
            UrlHost::Ip(ip) => ip.to_string(),
            UrlHost::RequestHost => "$host".into(),
            UrlHost::HttpHost => "$http_host".into(),
        }
    }

    /// Where nginx connects for this URL on `server`, checked against the
    /// address policy: `$host` becomes the server's name (refused on the
    /// catch-all and wildcard servers, where the client picks it).
    pub fn connect_host(&self, server: &str, policy: &AddressPolicy, what: &str) -> Result<String, String> {
        Ok(match &self.host {
            UrlHost::RequestHost if server == "_" || server.starts_with("*.") => {
                return Err(format!(
                    "{what} with $host on {}: the client would choose where nginx connects; name the host",
                    if server == "_" {
                        "the catch-all server"
                    } else {
                        "a wildcard host"
                    }
                ))
            }
            UrlHost::RequestHost => server.to_string(),
            UrlHost::HttpHost => {
                return Err(format!(
                    "{what} cannot use $http_host (the client's header) as its host"
                ))
            }
            UrlHost::Name(h) => {
                if let Some(why) = super::endpoints::refuse_external_name(h.as_str()) {
                    return Err(format!("{what} host: {why}"));
                }
                h.as_str().to_string()
            }
            UrlHost::Ip(ip) => {
                let port = self.port.unwrap_or(if self.https { 443 } else { 80 });
                // A cloud's metadata service answers 2xx: as an auth service
                // it would let everyone in. Refused even where local
                // endpoints are allowed.
                let link_local = match ip.to_canonical() {
                    IpAddr::V4(v4) => v4.is_link_local(),
                    IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
                };
                if link_local {
                    return Err(format!(
                        "{what} host: {ip} is a link-local address (a metadata service)"
                    ));
                }
                if let Some(why) = policy.refuses(*ip, port) {
                    return Err(format!("{what} host: {why}"));
                }
                self.host_text()
            }
        })
    }

    /// The URL with its host settled by [`AuthUrl::connect_host`].
    pub fn settled(&self, host: &str) -> String {
        self.with_host(host)
    }

    /// Whether nginx must resolve the host per request (a name).
    pub fn is_named(&self) -> bool {
        !matches!(self.host, UrlHost::Ip(_))
    }

    fn has_query(&self) -> bool {
        self.tail.contains('?')
    }

    fn query_names(&self, name: &str) -> bool {
        let Some((_, query)) = self.tail.split_once('?') else {
            return false;
        };
        query.split('&').any(|kv| kv.split('=').next() == Some(name))
    }
}

/// `host[:port]` → (host, port); `None` for a bad port.
fn split_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let colon = if authority.starts_with('[') {
        authority.find(']').map(|end| end + 1).filter(|&i| i < authority.len())
    } else {
        authority.rfind(':')
    };
    match colon {
        None => Some((authority, None)),
        Some(i) => {
            if authority.as_bytes()[i] != b':' {
                return None;
            }
            let port: u16 = authority[i + 1..].parse().ok().filter(|p| *p > 0)?;
            Some((&authority[..i], Some(port)))
        }
    }
}

/// `auth-method`.
pub fn method(v: &str) -> Result<String, Invalid> {
    let m = v.trim().to_ascii_uppercase();
    if METHODS.contains(&m.as_str()) {
        Ok(m)
    } else {
        Err(Invalid(format!(
            "auth-method must be one of {}: {v:?}",
            METHODS.join(", ")
        )))
    }
}

/// `auth-signin-redirect-param`: a query parameter name.
pub fn redirect_param(v: &str) -> Result<String, Invalid> {
    let t = v.trim();
    if t.is_empty() || t.len() > 64 || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(Invalid(format!("not a query parameter name: {v:?}")));
    }
    Ok(t.to_string())
}

/// `auth-response-headers`: header names, comma-separated.
pub fn response_headers(v: &str) -> Result<Vec<HeaderName>, Invalid> {
    let list: Vec<HeaderName> = v
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(HeaderName::parse)
        .collect::<Result<_, _>>()?;
    if list.len() > 64 {
        return Err(Invalid("more than 64 auth-response-headers".into()));
    }
    Ok(list)
}

/// `auth-request-redirect`: the `X-Auth-Request-Redirect` value, a URL or
/// a path (with allowed variables).
pub fn request_redirect(v: &str) -> Result<String, Invalid> {
    let t = v.trim();
    if t.starts_with("http://") || t.starts_with("https://") {
        AuthUrl::parse(t, "auth-request-redirect")?;
    } else if !t.starts_with('/') && !t.starts_with('$') {
        return Err(Invalid(format!("auth-request-redirect is not a URL or a path: {v:?}")));
    } else if t.len() > 2048 {
        return Err(Invalid("auth-request-redirect is longer than 2048 bytes".into()));
    } else {
        check_text(t, url_byte, false, "auth-request-redirect")?;
    }
    Ok(t.to_string())
}

/// `auth-cache-key`: literal text and variables, e.g.
/// `$remote_user$http_authorization`.
pub fn cache_key(v: &str) -> Result<String, Invalid> {
    let t = v.trim();
    if t.is_empty() || t.len() > 512 {
        return Err(Invalid(format!("auth-cache-key must be 1 to 512 bytes: {v:?}")));
    }
    check_text(
        t,
        |b| b.is_ascii_alphanumeric() || b"-_.:/@".contains(&b),
        true,
        "auth-cache-key",
    )?;
    Ok(t.to_string())
}

/// `auth-cache-duration`: `proxy_cache_valid` entries, comma-separated,
/// each `[code ...|any] time` (default `200 202 401 5m`).
pub fn cache_duration(v: &str) -> Result<Vec<String>, Invalid> {
    let mut out = Vec::new();
    for entry in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let words: Vec<&str> = entry.split_whitespace().collect();
        let Some((time, codes)) = words.split_last() else {
            continue;
        };
        if !is_time(time) {
            return Err(Invalid(format!(
                "auth-cache-duration: {time:?} is not a time such as 5m"
            )));
        }
        for c in codes {
            let ok = *c == "any" || c.parse::<u16>().is_ok_and(|n| (100..=599).contains(&n));
            if !ok {
                return Err(Invalid(format!(
                    "auth-cache-duration: {c:?} is not a status code or any"
                )));
            }
        }
        out.push(words.join(" "));
    }
    if out.is_empty() || out.len() > 16 {
        return Err(Invalid(format!("auth-cache-duration needs 1 to 16 entries: {v:?}")));
    }
    Ok(out)
}

/// An nginx time (`ngx_parse_time`): digits with a unit, bounded to a year.
fn is_time(s: &str) -> bool {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &s[digits.len()..];
    let scale: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return false,
    };
    !digits.is_empty()
        && digits.len() <= 9
        && digits.bytes().all(|b| b.is_ascii_digit())
        && digits.parse::<u64>().is_ok_and(|n| n * scale <= 365 * 86_400)
}

/// The keepalive pool of `auth-keepalive`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Keepalive {
    pub connections: u32,
    pub requests: u32,
    pub timeout: u32,
}

/// What the annotations (or the ConfigMap) ask for, before it is tied to a
/// server.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct AuthSpec {
    pub url: AuthUrl,
    pub method: Option<String>,
    pub signin: Option<AuthUrl>,
    pub signin_redirect_param: String,
    pub response_headers: Vec<HeaderName>,
    pub request_redirect: Option<String>,
    pub cache_key: Option<String>,
    pub cache_duration: Vec<String>,
    pub always_set_cookie: bool,
    /// `auth-proxy-set-headers`: a header set sent to the auth service.
    pub proxy_set_headers: Option<super::header_sets::SetRef>,
    pub keepalive: Option<Keepalive>,
}

/// Checks one companion key (`method`, `signin`, ... without the prefix);
/// `None` for a name that is not one.
pub fn check_companion(suffix: &str, v: &str) -> Option<Result<(), Invalid>> {
    let r = match suffix {
        "method" => method(v).map(drop),
        "signin" => AuthUrl::parse(v, "auth-signin").map(drop),
        "signin-redirect-param" => redirect_param(v).map(drop),
        "response-headers" => response_headers(v).map(drop),
        "request-redirect" => request_redirect(v).map(drop),
        "cache-key" => cache_key(v).map(drop),
        "cache-duration" => cache_duration(v).map(drop),
        "always-set-cookie" | "keepalive-share-vars" => super::values::parse_bool(v).map(drop),
        "proxy-set-headers" => super::header_sets::SetRef::parse(v).map(drop),
        "keepalive" => super::values::number_in::<u32>(v, 0..=65535, "auth-keepalive").map(drop),
        "keepalive-requests" => super::values::number_in::<u32>(v, 1..=1_000_000, "auth-keepalive-requests").map(drop),
        "keepalive-timeout" => super::values::number_in::<u32>(v, 1..=86_400, "auth-keepalive-timeout").map(drop),
        _ => return None,
    };
    Some(r)
}

impl AuthSpec {
    /// The spec from `get(suffix)` (`url`, `method`, ...). An invalid
    /// companion is left out here: [`check_companion`] reports it on its own
    /// key. `per_ingress` enables keepalive (ingress-nginx has no global one).
    pub fn parse<'a>(get: &dyn Fn(&str) -> Option<&'a str>, per_ingress: bool) -> Result<Option<AuthSpec>, Invalid> {
        let Some(url) = get("url") else { return Ok(None) };
        let url = AuthUrl::parse(url, "auth-url")?;
        let cache_key = get("cache-key").and_then(|v| cache_key(v).ok());
        let keepalive = per_ingress
            .then(|| get("keepalive").and_then(|v| v.trim().parse::<u32>().ok()))
            .flatten()
            .filter(|n| (1..=65535).contains(n))
            // A host chosen per server has no single upstream block.
            .filter(|_| matches!(url.host, UrlHost::Name(_) | UrlHost::Ip(_)))
            .map(|connections| Keepalive {
                connections,
                requests: get("keepalive-requests")
                    .and_then(|v| super::values::number_in(v, 1..=1_000_000, "").ok())
                    .unwrap_or(1000),
                timeout: get("keepalive-timeout")
                    .and_then(|v| super::values::number_in(v, 1..=86_400, "").ok())
                    .unwrap_or(60),
            });
        Ok(Some(AuthSpec {
            method: get("method").and_then(|v| method(v).ok()),
            signin: get("signin").and_then(|v| AuthUrl::parse(v, "auth-signin").ok()),
            signin_redirect_param: get("signin-redirect-param")
                .and_then(|v| redirect_param(v).ok())
                .unwrap_or_else(|| "rd".into()),
            response_headers: get("response-headers")
                .and_then(|v| response_headers(v).ok())
                .unwrap_or_default(),
            request_redirect: get("request-redirect").and_then(|v| request_redirect(v).ok()),
            cache_duration: match &cache_key {
                Some(_) => get("cache-duration")
                    .and_then(|v| cache_duration(v).ok())
                    .unwrap_or_else(|| vec!["200 202 401 5m".into()]),
                None => Vec::new(),
            },
            cache_key,
            always_set_cookie: get("always-set-cookie").is_some_and(|v| super::values::parse_bool(v) == Ok(true)),
            proxy_set_headers: get("proxy-set-headers").and_then(|v| super::header_sets::SetRef::parse(v).ok()),
            keepalive,
            url,
        }))
    }

    /// The spec tied to a server (`server` is its name, `_` for the
    /// catch-all) and checked against the address policy.
    pub fn resolve(&self, server: &str, id: usize, policy: &AddressPolicy) -> Result<ExternalAuth, String> {
        let host = self.url.connect_host(server, policy, "auth-url")?;
        let url = self.url.with_host(&host);
        let upstream = self.keepalive.as_ref().map(|k| AuthUpstream {
            name: format!("auth_external_{id}"),
            server: format!(
                "{host}:{}",
                self.url.port.unwrap_or(if self.url.https { 443 } else { 80 })
            ),
            keepalive: k.clone(),
            url: format!(
                "{}://auth_external_{id}{}",
                if self.url.https { "https" } else { "http" },
                self.url.tail
            ),
        });
        let signin = self.signin.as_ref().map(|s| {
            let base = s.with_host(&s.host_text());
            let param = &self.signin_redirect_param;
            if s.query_names(param) {
                base
            } else {
                let sep = if s.has_query() { '&' } else { '?' };
                format!("{base}{sep}{param}=$pass_access_scheme://$http_host$escaped_request_uri")
            }
        });
        Ok(ExternalAuth {
            id,
            needs_resolver: upstream.is_none() && !matches!(self.url.host, UrlHost::Ip(_)),
            host_header: host,
            url,
            upstream,
            method: self.method.clone(),
            signin,
            response_headers: self
                .response_headers
                .iter()
                .map(|h| ResponseHeader {
                    upstream_variable: format!("upstream_http_{}", h.as_str().to_ascii_lowercase().replace('-', "_")),
                    name: h.clone(),
                })
                .collect(),
            request_redirect: self.request_redirect.clone(),
            cache_key: self.cache_key.clone(),
            cache_duration: self
                .cache_duration
                .iter()
                .map(|d| d.split_whitespace().map(str::to_string).collect())
                .collect(),
            always_set_cookie: self.always_set_cookie,
            proxy_set_headers: Vec::new(),
        })
    }
}

/// An `auth-response-headers` entry: the header sent upstream and the
/// variable of the auth response it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ResponseHeader {
    pub name: HeaderName,
    pub upstream_variable: String,
}

/// `auth-keepalive`: an upstream block for the auth service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct AuthUpstream {
    pub name: String,
    /// `host:port` (a name is resolved when nginx loads the configuration,
    /// as in ingress-nginx).
    pub server: String,
    pub keepalive: Keepalive,
    /// The URL through the upstream block.
    pub url: String,
}

/// External authentication of one location, ready to render.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ExternalAuth {
    /// Names the internal auth location (`/_external-auth-<id>`), the
    /// sign-in location and the keepalive upstream.
    pub id: usize,
    /// The auth URL with its host settled.
    pub url: String,
    /// The `Host` header of the auth request.
    pub host_header: String,
    pub upstream: Option<AuthUpstream>,
    /// The host is a name nginx resolves per request (`resolver`).
    pub needs_resolver: bool,
    pub method: Option<String>,
    /// The sign-in URL with its redirect parameter.
    pub signin: Option<String>,
    pub response_headers: Vec<ResponseHeader>,
    pub request_redirect: Option<String>,
    pub cache_key: Option<String>,
    /// `proxy_cache_valid` arguments, one list per directive.
    pub cache_duration: Vec<Vec<String>>,
    pub always_set_cookie: bool,
    /// `auth-proxy-set-headers`, read by the builder.
    pub proxy_set_headers: Vec<super::header_sets::Header>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pairs: &[(&str, &str)]) -> Option<AuthSpec> {
        let get = |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        AuthSpec::parse(&get, true).unwrap()
    }

    #[test]
    fn urls_keep_to_their_grammar() {
        for ok in [
            "http://oauth2-proxy.auth.svc.cluster.local/oauth2/auth",
            "https://$host/oauth2/auth",
            "http://10.0.0.5:4180/auth?x=1&y=$request_uri",
            "http://[fd00::5]:8080/",
            "https://auth.example.com",
            "https://mirror.example.com$request_uri",
            "https://$host$request_uri",
        ] {
            AuthUrl::parse(ok, "auth-url").unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "ftp://x/",
            "http://a b/",
            "http://x/\"; return 200; #",
            "http://x/${secret}",
            "http://x/$ssl_client_raw_cert",
            "http://x/a;b",
            "http://x/{}",
            "http://x:99999/",
            "http://x:0/",
            "http://fd00::5/",
            "http://*.example.com/",
            "http://x/\nproxy_pass http://y/",
            "http:///path",
        ] {
            assert!(AuthUrl::parse(bad, "auth-url").is_err(), "{bad}");
        }
    }

    #[test]
    fn host_variable_becomes_the_server_name_and_is_refused_where_the_client_chooses() {
        let s = spec(&[("url", "https://$host/oauth2/auth")]).unwrap();
        let p = AddressPolicy::default();
        let a = s.resolve("app.example.com", 1, &p).unwrap();
        assert_eq!(a.url, "https://app.example.com/oauth2/auth");
        assert!(a.needs_resolver);
        assert!(s.resolve("_", 1, &p).unwrap_err().contains("catch-all"));
        assert!(s.resolve("*.example.com", 1, &p).unwrap_err().contains("wildcard"));
    }

    #[test]
    fn local_addresses_follow_the_endpoint_policy() {
        let strict = AddressPolicy::default();
        for url in [
            "http://127.0.0.1:4180/auth",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::1]/",
            "http://localhost/",
            "http://LOCALHOST/",
            "http://0x7f.1/",
        ] {
            let get = |k: &str| (k == "url").then_some(url);
            let refused = match AuthSpec::parse(&get, true) {
                Ok(s) => s.unwrap().resolve("a.example.com", 1, &strict).is_err(),
                Err(_) => true,
            };
            assert!(refused, "{url}");
        }
        let local = AddressPolicy {
            allow_local: true,
            reserved_ports: vec![10246],
        };
        let s = spec(&[("url", "http://127.0.0.1:4180/auth")]).unwrap();
        assert!(!s.resolve("a", 1, &local).unwrap().needs_resolver);
        let metadata = spec(&[("url", "http://169.254.169.254/latest/meta-data/")]).unwrap();
        assert!(metadata.resolve("a", 1, &local).is_err(), "never the metadata service");
        let mapped = spec(&[("url", "http://[::ffff:169.254.169.254]/")]).unwrap();
        assert!(mapped.resolve("a", 1, &local).is_err());
        let api = spec(&[("url", "http://127.0.0.1:10246/configuration/backends")]).unwrap();
        assert!(
            api.resolve("a", 1, &local).is_err(),
            "the module's API is never an auth service"
        );
    }

    #[test]
    fn signin_gets_its_redirect_parameter_unless_it_has_one() {
        let p = AddressPolicy::default();
        let with = |signin: &str, param: Option<&str>| {
            let mut pairs = vec![("url", "http://auth.example.com/"), ("signin", signin)];
            if let Some(param) = param {
                pairs.push(("signin-redirect-param", param));
            }
            spec(&pairs)
                .unwrap()
                .resolve("a.example.com", 1, &p)
                .unwrap()
                .signin
                .unwrap()
        };
        assert_eq!(
            with("https://$host/oauth2/start", None),
            "https://$host/oauth2/start?rd=$pass_access_scheme://$http_host$escaped_request_uri"
        );
        assert_eq!(
            with("https://login.example.com/start?x=1", Some("return_to")),
            "https://login.example.com/start?x=1&return_to=$pass_access_scheme://$http_host$escaped_request_uri"
        );
        assert_eq!(
            with("https://$host/oauth2/start?rd=$escaped_request_uri", None),
            "https://$host/oauth2/start?rd=$escaped_request_uri"
        );
    }

    #[test]
    fn companions_are_checked_on_their_own() {
        assert!(check_companion("method", "get").unwrap().is_ok());
        assert!(check_companion("method", "GET; return 200").unwrap().is_err());
        assert!(check_companion("response-headers", "X-User, X-Email").unwrap().is_ok());
        assert!(check_companion("response-headers", "X-User X-Email").unwrap().is_err());
        assert!(check_companion("cache-key", "$remote_user$http_authorization")
            .unwrap()
            .is_ok());
        assert!(check_companion("cache-key", "$request_body").unwrap().is_err());
        assert!(check_companion("cache-duration", "200 202 401 5m, any 30s")
            .unwrap()
            .is_ok());
        assert!(check_companion("cache-duration", "200 5x").unwrap().is_err());
        assert!(check_companion("cache-duration", "700 5m").unwrap().is_err());
        assert!(check_companion("keepalive", "70000").unwrap().is_err());
        assert!(check_companion("request-redirect", "/next?x=$request_uri")
            .unwrap()
            .is_ok());
        assert!(check_companion("request-redirect", "javascript:alert(1)")
            .unwrap()
            .is_err());
        assert!(check_companion("url", "x").is_none());
    }

    #[test]
    fn keepalive_needs_one_host() {
        let s = spec(&[("url", "http://10.1.2.3/auth"), ("keepalive", "10")]).unwrap();
        let a = s.resolve("a.example.com", 7, &AddressPolicy::default()).unwrap();
        let u = a.upstream.unwrap();
        assert_eq!(
            (u.server.as_str(), u.url.as_str()),
            ("10.1.2.3:80", "http://auth_external_7/auth")
        );
        assert_eq!((u.keepalive.requests, u.keepalive.timeout), (1000, 60));
        let s = spec(&[("url", "http://$host/auth"), ("keepalive", "10")]).unwrap();
        assert!(s.keepalive.is_none());
    }

    #[test]
    fn cache_duration_defaults_with_a_key() {
        let s = spec(&[("url", "http://a.example.com/"), ("cache-key", "$http_authorization")]).unwrap();
        assert_eq!(s.cache_duration, vec!["200 202 401 5m".to_string()]);
        let s = spec(&[("url", "http://a.example.com/"), ("cache-duration", "1m")]).unwrap();
        assert!(s.cache_duration.is_empty(), "no key, no cache");
    }
}
