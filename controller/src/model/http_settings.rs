//! ConfigMap keys that become plain `http {}` (and `events {}`) directives
//! with ingress-nginx's names and defaults: client buffers and timeouts,
//! keepalive, hash sizes, header handling, limit status codes, response
//! headers and compression. None of them is evaluated per request beyond
//! what nginx itself does with the value.

use serde::Serialize;

use super::values::{number_in, HeaderName, Invalid, Seconds, Size};

/// ingress-nginx's `gzip-types` default.
pub const GZIP_TYPES: &str = "application/atom+xml application/javascript application/x-javascript application/json application/rss+xml application/vnd.ms-fontobject application/x-font-ttf application/x-web-app-manifest+json application/xhtml+xml application/xml font/opentype image/svg+xml image/x-icon text/css text/javascript text/plain text/x-component";

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct HttpSettings {
    pub client_header_buffer_size: Size,
    pub client_header_timeout: Seconds,
    /// `large-client-header-buffers`: number and size.
    pub large_client_header_buffers: (u32, Size),
    pub client_body_timeout: Seconds,
    pub keep_alive_requests: u32,
    /// `upstream-keepalive-time`, nginx time syntax (`1h`).
    pub upstream_keepalive_time: String,
    pub proxy_headers_hash_max_size: u32,
    pub proxy_headers_hash_bucket_size: u32,
    pub variables_hash_max_size: u32,
    pub variables_hash_bucket_size: u32,
    pub map_hash_bucket_size: u32,
    pub server_tokens: bool,
    pub underscores_in_headers: bool,
    pub ignore_invalid_headers: bool,
    pub enable_multi_accept: bool,
    pub http2_max_concurrent_streams: u32,
    pub limit_req_status_code: u16,
    pub limit_conn_status_code: u16,
    /// `hide-headers`: response headers of the backends not passed on.
    pub hide_headers: Vec<HeaderName>,
    /// `allow-backend-server-header`: pass the backend's `Server` header.
    pub allow_backend_server_header: bool,
    /// `limit-rate`/`limit-rate-after` for every location, in kilobytes
    /// (0: off), as ingress-nginx renders them.
    pub limit_rate: u64,
    pub limit_rate_after: u64,
    /// `block-cidrs`, `block-user-agents`, `block-referers`.
    pub block: Block,
    /// `error-log-level`; `None` keeps `--error-log-level`.
    pub error_log_level: Option<String>,
    /// `skip-access-log-urls`: request URIs (exact) never logged.
    pub skip_access_log_urls: Vec<String>,
    /// `enable-access-log-for-default-backend` (default false, as in
    /// ingress-nginx: requests no Ingress matches are not logged).
    pub access_log_for_default_backend: bool,
    pub gzip: Option<Gzip>,
    /// The gzip keys, kept while `use-gzip` is off.
    #[serde(skip)]
    pub gzip_settings: Gzip,
}

/// Clients refused on every server: by address (`deny`, 403), by
/// `User-Agent` or by `Referer` (a `map` and a 403). A string is matched
/// exactly; `~` (case-sensitive) or `~*` starts a PCRE2 regex.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Block {
    pub cidrs: Vec<String>,
    pub user_agents: Vec<String>,
    pub referers: Vec<String>,
}

/// A `block-user-agents`/`block-referers` item: printable ASCII without
/// nginx syntax (`$ ; { } # " '`; the renderer quotes it as one token
/// anyway); a regex must compile. Use `.` for a `;` in a user agent.
fn map_pattern(t: &str) -> bool {
    let printable = !t.is_empty()
        && t.len() <= 512
        && t.bytes()
            .all(|b| (b' '..=b'~').contains(&b) && !b"$;{}#\"'".contains(&b));
    match t.strip_prefix("~*").or_else(|| t.strip_prefix('~')) {
        Some(re) => printable && super::values::compile_like_nginx(re).is_ok(),
        None => printable,
    }
}

fn map_patterns(v: &str, what: &str) -> Result<Vec<String>, Invalid> {
    let items: Vec<String> = v
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(String::from)
        .collect();
    if items.len() > 1024 || !items.iter().all(|i| map_pattern(i)) {
        return Err(Invalid(format!(
            "{what} must be comma-separated strings or ~regexes, printable, without $: {v:?}"
        )));
    }
    Ok(items)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Gzip {
    pub level: u32,
    pub min_length: u64,
    /// MIME types (`type/subtype`).
    pub types: Vec<String>,
    /// `gzip-disable`: one user-agent regex (or `msie6`), rendered as one
    /// quoted token as ingress-nginx renders it.
    pub disable: Option<String>,
}

impl Default for Gzip {
    fn default() -> Self {
        Gzip {
            level: 1,
            min_length: 256,
            types: GZIP_TYPES.split(' ').map(String::from).collect(),
            disable: None,
        }
    }
}

impl Default for HttpSettings {
    /// ingress-nginx's defaults.
    fn default() -> Self {
        let size = |s| Size::parse(s).expect("valid default");
        HttpSettings {
            client_header_buffer_size: size("1k"),
            client_header_timeout: Seconds(60),
            large_client_header_buffers: (4, size("8k")),
            client_body_timeout: Seconds(60),
            keep_alive_requests: 1000,
            upstream_keepalive_time: "1h".into(),
            proxy_headers_hash_max_size: 512,
            proxy_headers_hash_bucket_size: 64,
            variables_hash_max_size: 2048,
            variables_hash_bucket_size: 256,
            map_hash_bucket_size: 64,
            server_tokens: false,
            underscores_in_headers: false,
            ignore_invalid_headers: true,
            enable_multi_accept: true,
            http2_max_concurrent_streams: 128,
            limit_req_status_code: 503,
            limit_conn_status_code: 503,
            hide_headers: Vec::new(),
            allow_backend_server_header: false,
            limit_rate: 0,
            limit_rate_after: 0,
            block: Block::default(),
            error_log_level: None,
            skip_access_log_urls: Vec::new(),
            access_log_for_default_backend: false,
            gzip: None,
            gzip_settings: Gzip::default(),
        }
    }
}

use super::values::parse_bool as flag;

/// A hash size nginx accepts: a power of two (bucket sizes are rounded up
/// to the cache line anyway; a power of two keeps the value meaningful).
fn hash_size(v: &str, range: std::ops::RangeInclusive<u32>, what: &str) -> Result<u32, Invalid> {
    let n = number_in(v, range, what)?;
    if !n.is_power_of_two() {
        return Err(Invalid(format!("{what} must be a power of two: {v:?}")));
    }
    Ok(n)
}

/// A client-side buffer size: 1k to 64k (nginx allocates one per
/// connection, or up to `large-client-header-buffers` of them).
fn header_buffer(v: &str, what: &str) -> Result<Size, Invalid> {
    let s = Size::parse(v)?;
    if !(1024..=65536).contains(&s.bytes()) {
        return Err(Invalid(format!("{what} must be between 1k and 64k: {v:?}")));
    }
    Ok(s)
}

/// nginx's time syntax, bounded to a week: `90`, `90s`, `5m`, `1h`, `1d`.
fn nginx_time(v: &str, what: &str) -> Result<String, Invalid> {
    let t = v.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => 0,
    };
    match digits.parse::<u64>() {
        Ok(n) if scale > 0 && n * scale <= 7 * 86_400 => Ok(format!("{n}{}", if unit.is_empty() { "s" } else { unit })),
        _ => Err(Invalid(format!(
            "{what} is not a time such as 90s, 5m or 1h (at most a week): {v:?}"
        ))),
    }
}

/// A status for limit_req/limit_conn refusals: nginx takes 400-599.
fn limit_status(v: &str, what: &str) -> Result<u16, Invalid> {
    number_in(v, 400..=599, what)
}

/// A MIME type for `gzip_types`: `type/subtype` of token characters.
fn mime_type(t: &str) -> bool {
    let token = |s: &str| {
        !s.is_empty() && s.len() <= 127 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#&-^_.+".contains(&b))
    };
    matches!(t.split_once('/'), Some((a, b)) if token(a) && token(b)) || t == "*"
}

/// A `gzip_disable` value: `msie6`, or a user-agent regex that PCRE2
/// compiles as nginx compiles it (caseless): printable ASCII without `$`
/// (the renderer quotes it as one token).
fn user_agent_regex(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 256
        && t.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'$')
        && super::values::compile_like_nginx(t).is_ok()
}

impl HttpSettings {
    /// Applies one ConfigMap key; `None` if the key is not one of these.
    pub fn apply(&mut self, key: &str, v: &str) -> Option<Result<(), Invalid>> {
        let r = (|| {
            // Lists are split on spaces; a newline or tab is never meant.
            let spaced = matches!(key, "large-client-header-buffers" | "gzip-types");
            if spaced && v.chars().any(char::is_control) {
                return Err(Invalid(format!("{key} has a control character: {v:?}")));
            }
            match key {
                "client-header-buffer-size" => self.client_header_buffer_size = header_buffer(v, key)?,
                "client-header-timeout" => self.client_header_timeout = Seconds::parse(v)?,
                "large-client-header-buffers" => {
                    let words: Vec<&str> = v.split_whitespace().collect();
                    let [n, size] = words.as_slice() else {
                        return Err(Invalid(format!("{key} must be NUMBER SIZE, such as \"4 8k\": {v:?}")));
                    };
                    let n = number_in(n, 1..=64, key)?;
                    self.large_client_header_buffers = (n, header_buffer(size, key)?);
                }
                "client-body-timeout" => self.client_body_timeout = Seconds::parse(v)?,
                "keep-alive-requests" => self.keep_alive_requests = number_in(v, 1..=1_000_000_000, key)?,
                "upstream-keepalive-time" => self.upstream_keepalive_time = nginx_time(v, key)?,
                "proxy-headers-hash-max-size" => self.proxy_headers_hash_max_size = hash_size(v, 64..=1 << 20, key)?,
                "proxy-headers-hash-bucket-size" => {
                    self.proxy_headers_hash_bucket_size = hash_size(v, 32..=65536, key)?
                }
                "variables-hash-max-size" => self.variables_hash_max_size = hash_size(v, 64..=1 << 20, key)?,
                "variables-hash-bucket-size" => self.variables_hash_bucket_size = hash_size(v, 32..=65536, key)?,
                "map-hash-bucket-size" => self.map_hash_bucket_size = hash_size(v, 32..=65536, key)?,
                "server-tokens" => self.server_tokens = flag(v)?,
                "enable-underscores-in-headers" => self.underscores_in_headers = flag(v)?,
                "ignore-invalid-headers" => self.ignore_invalid_headers = flag(v)?,
                "enable-multi-accept" => self.enable_multi_accept = flag(v)?,
                "http2-max-concurrent-streams" => self.http2_max_concurrent_streams = number_in(v, 1..=65535, key)?,
                "limit-req-status-code" => self.limit_req_status_code = limit_status(v, key)?,
                "limit-conn-status-code" => self.limit_conn_status_code = limit_status(v, key)?,
                "hide-headers" => {
                    self.hide_headers = v
                        .split(',')
                        .map(str::trim)
                        .filter(|h| !h.is_empty())
                        .map(HeaderName::parse)
                        .collect::<Result<_, _>>()?
                }
                "allow-backend-server-header" => self.allow_backend_server_header = flag(v)?,
                "limit-rate" => self.limit_rate = number_in(v, 0..=super::annotations::MAX_RATE_KB, key)?,
                "limit-rate-after" => self.limit_rate_after = number_in(v, 0..=super::annotations::MAX_RATE_KB, key)?,
                "block-cidrs" => self.block.cidrs = super::values::parse_cidrs(v)?,
                "error-log-level" => {
                    let levels = ["debug", "info", "notice", "warn", "error", "crit", "alert", "emerg"];
                    if !levels.contains(&v.trim()) {
                        return Err(Invalid(format!("{key} must be one of {}: {v:?}", levels.join(", "))));
                    }
                    self.error_log_level = Some(v.trim().to_string());
                }
                "skip-access-log-urls" => {
                    self.skip_access_log_urls = v
                        .split(',')
                        .map(str::trim)
                        .filter(|u| !u.is_empty())
                        .map(|u| super::values::UrlPath::parse(u).map(|p| p.as_str().to_string()))
                        .collect::<Result<_, _>>()?
                }
                "enable-access-log-for-default-backend" => self.access_log_for_default_backend = flag(v)?,
                "block-user-agents" => self.block.user_agents = map_patterns(v, key)?,
                "block-referers" => self.block.referers = map_patterns(v, key)?,
                "use-gzip" => self.gzip = flag(v)?.then(Gzip::default),
                "gzip-level" => self.gzip_settings.level = number_in(v, 1..=9, key)?,
                "gzip-min-length" => self.gzip_settings.min_length = number_in(v, 0..=1 << 30, key)?,
                "gzip-types" => {
                    let types: Vec<String> = v.split_whitespace().map(String::from).collect();
                    if types.is_empty() || types.len() > 256 || !types.iter().all(|t| mime_type(t)) {
                        return Err(Invalid(format!("{key} must be MIME types separated by spaces: {v:?}")));
                    }
                    // nginx always compresses text/html, and warns when it is listed.
                    self.gzip_settings.types = types.into_iter().filter(|t| t != "text/html").collect();
                }
                "gzip-disable" => {
                    let t = v.trim();
                    if !user_agent_regex(t) {
                        return Err(Invalid(format!("{key} must be msie6 or a user-agent regex: {v:?}")));
                    }
                    self.gzip_settings.disable = Some(t.to_string());
                }
                _ => return Ok(false),
            }
            Ok(true)
        })();
        match r {
            Ok(false) => None,
            Ok(true) => Some(Ok(())),
            Err(e) => Some(Err(e)),
        }
    }

    /// Called once every key is read: `use-gzip` takes the `gzip-*` keys
    /// whatever their order in the ConfigMap.
    pub fn finish(&mut self) {
        if self.gzip.is_some() {
            self.gzip = Some(self.gzip_settings.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(pairs: &[(&str, &str)]) -> (HttpSettings, Vec<String>) {
        let mut h = HttpSettings::default();
        let mut errors = Vec::new();
        for (k, v) in pairs {
            match h.apply(k, v) {
                Some(Err(e)) => errors.push(format!("{k}: {e}")),
                None => errors.push(format!("{k}: not mine")),
                Some(Ok(())) => {}
            }
        }
        h.finish();
        (h, errors)
    }

    #[test]
    fn values_are_typed_and_bounded() {
        let (h, e) = apply(&[
            ("large-client-header-buffers", "8 16k"),
            ("keep-alive-requests", "500"),
            ("upstream-keepalive-time", "30m"),
            ("hide-headers", "X-Powered-By, Server"),
            ("limit-req-status-code", "429"),
            ("gzip-level", "5"),
            ("use-gzip", "true"),
            ("gzip-types", "text/html application/json"),
            ("gzip-disable", "MSIE [1-6]\\."),
        ]);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(h.large_client_header_buffers.0, 8);
        assert_eq!(h.upstream_keepalive_time, "30m");
        assert_eq!(h.hide_headers.len(), 2);
        let g = h.gzip.unwrap();
        assert_eq!(
            (g.level, g.types.as_slice()),
            (5, ["application/json".to_string()].as_slice())
        );
        assert_eq!(g.disable.as_deref(), Some("MSIE [1-6]\\."));

        let (_, e) = apply(&[
            ("large-client-header-buffers", "4 8k; evil"),
            ("client-header-buffer-size", "1m"),
            ("upstream-keepalive-time", "1y"),
            ("proxy-headers-hash-max-size", "1000"),
            ("limit-conn-status-code", "200"),
            ("hide-headers", "X-A;"),
            ("gzip-types", "text/html; x"),
            ("gzip-disable", "$http_user_agent"),
            ("gzip-disable", "(unclosed"),
            ("no-such-key", "1"),
        ]);
        assert_eq!(e.len(), 10, "{e:?}");
    }

    #[test]
    fn blocks_take_strings_and_regexes() {
        let (h, e) = apply(&[
            ("block-cidrs", "192.0.2.0/24, 2001:db8::/32"),
            ("block-user-agents", "~*bot, curl/7.0"),
            ("block-referers", "~*spam\\.example"),
        ]);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(h.block.user_agents, ["~*bot", "curl/7.0"]);
        let (_, e) = apply(&[
            ("block-user-agents", "~*(unclosed"),
            ("block-referers", "$http_host"),
            ("block-cidrs", "not-a-cidr"),
        ]);
        assert_eq!(e.len(), 3, "{e:?}");
    }

    #[test]
    fn gzip_is_off_unless_asked() {
        let (h, _) = apply(&[("gzip-level", "9")]);
        assert!(h.gzip.is_none());
    }
}
