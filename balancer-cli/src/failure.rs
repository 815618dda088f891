//! What went wrong, and the exit code that says so.
//!
//! The codes separate what a script reacts to differently: the API refused
//! the request (fix the input), the API failed (retry later, grow the
//! zone), nothing answered (is nginx up?), the command line was wrong.

use crate::transport::TransportError;

/// The exit codes, as `--help` and the book (`docs/src/reference/api.md`) list them.
pub mod code {
    pub const OK: u8 = 0;
    /// The API answered 4xx (or any other non-2xx below 500).
    pub const API_REFUSED: u8 = 1;
    /// Usage: bad flags (clap's own code), an unreadable file, a bad
    /// `--endpoint`, a backend the flags describe that the API would refuse.
    pub const USAGE: u8 = 2;
    /// No answer: refused connection, missing socket, timeout, a broken
    /// connection or something that does not speak HTTP.
    pub const UNREACHABLE: u8 = 3;
    /// The API answered 5xx (507: the zone is full).
    pub const API_FAILED: u8 = 4;
    /// `watch --count`: workers still behind when the wait ended.
    pub const BEHIND: u8 = 5;
}

/// The exit-code table of `--help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  the API refused the request (4xx); its JSON error is printed
  2  usage error (flags, files, an --endpoint or backend that is invalid)
  3  no answer: connection refused, no socket, timeout, not HTTP
  4  the API failed (5xx; 507: dynamic_balancer_zone is full)
  5  watch --count: workers had not caught up when the wait ended";

#[derive(Debug)]
pub enum Failure {
    Usage(String),
    /// A non-2xx answer.
    Api {
        method: String,
        path: String,
        status: u16,
        reason: String,
        body: Vec<u8>,
    },
    Transport {
        method: String,
        path: String,
        error: TransportError,
    },
    Behind(String),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Usage(_) => code::USAGE,
            Failure::Api { status, .. } if *status >= 500 => code::API_FAILED,
            Failure::Api { .. } => code::API_REFUSED,
            Failure::Transport { .. } => code::UNREACHABLE,
            Failure::Behind(_) => code::BEHIND,
        }
    }

    /// The line printed to stderr. An API error shows the method, the path
    /// and the status, then the API's JSON body as it came (its `error`
    /// and, for a bad value, the JSON `path` of that value).
    pub fn message(&self) -> String {
        match self {
            Failure::Usage(m) | Failure::Behind(m) => format!("error: {m}"),
            Failure::Api {
                method,
                path,
                status,
                reason,
                body,
            } => {
                let status = if reason.is_empty() {
                    status.to_string()
                } else {
                    format!("{status} {reason}")
                };
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                let shown = if text.is_empty() {
                    "(empty body)".to_string()
                } else if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() {
                    text.to_string()
                } else {
                    // Not the API's JSON (another server on that port?):
                    // its first line, shortened.
                    let first = text.lines().next().unwrap_or_default();
                    let cut: String = first.chars().take(200).collect();
                    format!("(not JSON) {cut}")
                };
                format!("error: {method} {path}: {status} {shown}")
            }
            Failure::Transport { method, path, error } => format!("error: {method} {path}: {error}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, reason: &str, body: &str) -> Failure {
        Failure::Api {
            method: "GET".into(),
            path: "/configuration/backends/x".into(),
            status,
            reason: reason.into(),
            body: body.into(),
        }
    }

    #[test]
    fn codes_and_messages() {
        let missing = api(404, "Not Found", "{\"error\":\"no backend named \\\"x\\\"\"}\n");
        assert_eq!(missing.exit_code(), 1);
        assert_eq!(
            missing.message(),
            r#"error: GET /configuration/backends/x: 404 Not Found {"error":"no backend named \"x\""}"#
        );
        assert_eq!(api(507, "Insufficient Storage", "{}").exit_code(), 4);
        assert_eq!(
            api(500, "", "").message(),
            "error: GET /configuration/backends/x: 500 (empty body)"
        );
        assert_eq!(api(302, "Found", "").exit_code(), 1);
        assert_eq!(
            api(502, "Bad Gateway", "<html>\n<head>").message(),
            "error: GET /configuration/backends/x: 502 Bad Gateway (not JSON) <html>"
        );
        let t = Failure::Transport {
            method: "GET".into(),
            path: "/configuration/status".into(),
            error: TransportError::Connect("cannot connect to http://127.0.0.1:1: refused".into()),
        };
        assert_eq!(t.exit_code(), 3);
        assert_eq!(
            t.message(),
            "error: GET /configuration/status: cannot connect to http://127.0.0.1:1: refused"
        );
        assert_eq!(Failure::Usage("x".into()).exit_code(), code::USAGE);
        assert_eq!(Failure::Behind("x".into()).exit_code(), code::BEHIND);
    }
}
