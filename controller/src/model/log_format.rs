//! The access log's format and files: ingress-nginx's `log-format-upstream`
//! (its `upstreaminfo` format by default), `log-format-escape-json`,
//! `log-format-escape-none`, `access-log-path` and `error-log-path`.
//!
//! A format names nginx variables; an unknown one would fail `nginx -t`
//! and hold back every reload, so only known variables are accepted
//! ([`variable_allowed`]): nginx's request, response, connection, upstream
//! and TLS facts, header and cookie prefixes, and ingress-nginx's
//! `$proxy_upstream_name`, `$proxy_alternative_upstream_name` and
//! `$req_id`, which the module provides.

use serde::Serialize;

use super::values::Invalid;

/// ingress-nginx's default `log-format-upstream`.
pub const UPSTREAMINFO: &str = "$remote_addr - $remote_user [$time_local] \"$request\" $status $body_bytes_sent \"$http_referer\" \"$http_user_agent\" $request_length $request_time [$proxy_upstream_name] [$proxy_alternative_upstream_name] $upstream_addr $upstream_response_length $upstream_response_time $upstream_status $req_id";

const VARIABLES: &[&str] = &[
    "args",
    "body_bytes_sent",
    "bytes_sent",
    "connection",
    "connection_requests",
    "document_uri",
    "dynamic_request_id",
    "gzip_ratio",
    "host",
    "hostname",
    "http2",
    "http3",
    "https",
    // The template's `geo` for a literal "$" (always defined).
    "literal_dollar",
    "msec",
    "pass_access_scheme",
    "pass_server_port",
    "pid",
    "pipe",
    "proxy_add_x_forwarded_for",
    "proxy_alternative_upstream_name",
    "proxy_upstream_name",
    "query_string",
    "realip_remote_addr",
    "realip_remote_port",
    "remote_addr",
    "remote_port",
    "remote_user",
    "req_id",
    "request",
    "request_completion",
    "request_id",
    "request_length",
    "request_method",
    "request_time",
    "request_uri",
    "scheme",
    "server_addr",
    "server_name",
    "server_port",
    "server_protocol",
    "ssl_cipher",
    "ssl_client_i_dn",
    "ssl_client_s_dn",
    "ssl_client_verify",
    "ssl_early_data",
    "ssl_protocol",
    "ssl_server_name",
    "ssl_session_reused",
    "status",
    "time_iso8601",
    "time_local",
    "upstream_addr",
    "upstream_bytes_received",
    "upstream_bytes_sent",
    "upstream_cache_status",
    "upstream_connect_time",
    "upstream_header_time",
    "upstream_response_length",
    "upstream_response_time",
    "upstream_status",
    "uri",
];

const PREFIXES: &[&str] = &[
    "http_",
    "sent_http_",
    "cookie_",
    "arg_",
    "upstream_http_",
    "upstream_cookie_",
];

/// Whether a log format may name `$name`.
pub fn variable_allowed(name: &str) -> bool {
    VARIABLES.contains(&name)
        || PREFIXES.iter().any(|p| {
            name.strip_prefix(p)
                .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        })
}

/// The `$name`s of `text` (`${name}` too), or the first problem.
pub fn variables(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        let after = &rest[at + 1..];
        let (braced, body) = match after.strip_prefix('{') {
            Some(b) => (true, b),
            None => (false, after),
        };
        let len = body
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .count();
        if len == 0 {
            return Err("a `$` that starts no variable".into());
        }
        out.push(&body[..len]);
        let mut tail = &body[len..];
        if braced {
            tail = tail.strip_prefix('}').ok_or("an unclosed `${`")?;
        }
        rest = tail;
    }
    Ok(out)
}

/// `log-format-upstream`: printable, at most 4096 bytes, known variables.
pub fn format(v: &str) -> Result<String, Invalid> {
    let t = v.trim();
    if t.is_empty() || t.len() > 4096 || t.chars().any(char::is_control) {
        return Err(Invalid(
            "log-format-upstream must be 1 to 4096 printable bytes on one line".into(),
        ));
    }
    for name in variables(t).map_err(|e| Invalid(format!("log-format-upstream: {e}")))? {
        if !variable_allowed(name) {
            return Err(Invalid(format!(
                "log-format-upstream: ${name} is not a variable nginx knows here (ingress-nginx's $namespace, $ingress_name, $service_name and $service_port are not provided)"
            )));
        }
    }
    Ok(t.to_string())
}

/// `access-log-path`, `error-log-path`: an absolute path of plain
/// characters (`/dev/stdout` in a container).
pub fn path(v: &str, key: &str) -> Result<String, Invalid> {
    let t = v.trim();
    let ok = t.starts_with('/')
        && t.len() <= 1024
        && !t.split('/').any(|part| part == "..")
        && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"/_.-".contains(&b));
    if !ok {
        return Err(Invalid(format!(
            "{key} must be an absolute path of plain characters: {v:?}"
        )));
    }
    // What the check of every rendered configuration lets nginx write
    // ([`crate::file_check`]): a ConfigMap naming anything else would
    // block every reload.
    let stream = matches!(t, "/dev/stdout" | "/dev/stderr" | "/dev/null");
    if !stream && !t.starts_with("/var/log/") {
        return Err(Invalid(format!(
            "{key} must be /dev/stdout, /dev/stderr or a file under /var/log: {v:?}"
        )));
    }
    Ok(t.to_string())
}

/// The access log's settings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct LogFormat {
    pub format: String,
    /// `escape=json` or `escape=none` (nginx's default escaping otherwise).
    pub escape: Option<&'static str>,
    pub access_log_path: Option<String>,
    pub error_log_path: Option<String>,
}

impl Default for LogFormat {
    fn default() -> Self {
        LogFormat {
            format: UPSTREAMINFO.to_string(),
            escape: None,
            access_log_path: None,
            error_log_path: None,
        }
    }
}

impl LogFormat {
    /// Applies one ConfigMap key; `None` if it is not a logging key.
    pub fn apply(&mut self, key: &str, v: &str) -> Option<Result<(), Invalid>> {
        let r = (|| {
            match key {
                "log-format-upstream" => self.format = format(v)?,
                "log-format-escape-json" => {
                    if super::values::parse_bool(v)? {
                        self.escape = Some("json");
                    }
                }
                "log-format-escape-none" => {
                    if super::values::parse_bool(v)? && self.escape.is_none() {
                        self.escape = Some("none");
                    }
                }
                "access-log-path" | "http-access-log-path" => self.access_log_path = Some(path(v, key)?),
                "error-log-path" => self.error_log_path = Some(path(v, key)?),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_and_json_formats_are_accepted() {
        assert!(format(UPSTREAMINFO).is_ok());
        let json = r#"{"time": "$time_iso8601", "status": $status, "upstream": "$proxy_upstream_name", "ua": "${http_user_agent}", "id": "$req_id"}"#;
        assert!(format(json).is_ok());
    }

    #[test]
    fn unknown_variables_and_breakouts_are_refused() {
        for bad in [
            "$remote_addr $namespace",
            "$remote_addr\n; ssl_engine x",
            "$ssl_client_raw_cert_x",
            "${unclosed",
            "cost $ alone",
            "",
        ] {
            assert!(format(bad).is_err(), "{bad:?}");
        }
        assert!(variable_allowed("http_x_forwarded_for") && !variable_allowed("http_"));
    }

    #[test]
    fn paths_are_plain_and_absolute() {
        assert!(path("/dev/stdout", "access-log-path").is_ok());
        assert!(path("/var/log/nginx/access.log", "access-log-path").is_ok());
        for bad in [
            "logs/a.log",
            "/var/log/../../etc/passwd",
            "/tmp/a b",
            "syslog:server=x",
            "/proc/self/fd/1",
            "/etc/ingress-controller/nginx.conf",
            "/var/log",
        ] {
            assert!(path(bad, "access-log-path").is_err(), "{bad}");
        }
    }

    #[test]
    fn json_escaping_wins_over_none() {
        let mut l = LogFormat::default();
        l.apply("log-format-escape-none", "true").unwrap().unwrap();
        l.apply("log-format-escape-json", "true").unwrap().unwrap();
        assert_eq!(l.escape, Some("json"));
        assert!(l.apply("something-else", "1").is_none());
    }
}
