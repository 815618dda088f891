//! Routes and bodies of the `/configuration` API.
//!
//! The routes ingress-nginx's `configuration.lua` serves for backends are kept
//! byte for byte (`POST`/`GET /configuration/backends`); per-backend routes and
//! `/configuration/status` are ours. Routing is pure so it is tested here; the
//! module only feeds it the method and the decoded URI path.

use serde::Serialize;

/// An HTTP method, as far as routing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
    Other,
}

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action<'a> {
    ListBackends,
    ReplaceBackends,
    GetBackend(&'a str),
    PutBackend(&'a str),
    DeleteBackend(&'a str),
    Status,
    Health,
}

/// Why a request has no action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteError {
    /// 404.
    NotFound,
    /// 405; the value is the `Allow` header.
    MethodNotAllowed(&'static str),
}

const BACKENDS: &str = "/configuration/backends";
const STATUS: &str = "/configuration/status";
const HEALTH: &str = "/configuration/health";

/// Maps a method and a decoded URI path (no query string) to an action.
pub fn route(method: Method, path: &str) -> Result<Action<'_>, RouteError> {
    if path == BACKENDS || path == "/configuration/backends/" {
        return match method {
            Method::Get => Ok(Action::ListBackends),
            Method::Post => Ok(Action::ReplaceBackends),
            _ => Err(RouteError::MethodNotAllowed("GET, POST")),
        };
    }
    if path == STATUS || path == HEALTH {
        return match method {
            Method::Get if path == STATUS => Ok(Action::Status),
            Method::Get => Ok(Action::Health),
            _ => Err(RouteError::MethodNotAllowed("GET")),
        };
    }
    match path.strip_prefix(BACKENDS).and_then(|rest| rest.strip_prefix('/')) {
        Some(name) if !name.is_empty() && !name.contains('/') => match method {
            Method::Get => Ok(Action::GetBackend(name)),
            Method::Put => Ok(Action::PutBackend(name)),
            Method::Delete => Ok(Action::DeleteBackend(name)),
            _ => Err(RouteError::MethodNotAllowed("GET, PUT, DELETE")),
        },
        _ => Err(RouteError::NotFound),
    }
}

/// The body of every error answer: `{"error": "...", "path": "..."}`, where
/// `path` is the JSON path of the bad value when there is one.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ErrorBody<'a> {
    pub error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<&'a str>,
}

impl ErrorBody<'_> {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("JSON encoding of an error body")
    }
}

/// `GET /configuration/status`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Status {
    /// Bumped by every successful write.
    pub generation: u64,
    pub backends: u64,
    pub endpoints: u64,
    pub zone: ZoneUsage,
    /// The generation each live worker has applied; equal to `generation`
    /// once every worker routes by the latest write.
    pub workers: Vec<WorkerStatus>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ZoneUsage {
    pub name: String,
    pub size: u64,
    pub used: u64,
}

/// One endpoint of `GET /configuration/health`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EndpointHealth {
    pub backend: String,
    pub endpoint: String,
    /// Out of rotation for every worker (passive health).
    pub down: bool,
    /// Failed attempts counted towards `maxFails`.
    pub fails: u32,
    /// Attempts in progress, over all workers.
    pub connections: u32,
    /// EWMA of connect + response time, seconds, decayed to now.
    pub ewma: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct WorkerStatus {
    pub pid: i64,
    pub generation: u64,
}

/// Joins stored canonical JSON objects into one array without re-parsing.
pub fn json_array<'a>(items: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = vec![b'['];
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.push(b']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        use Method::*;
        assert_eq!(route(Post, "/configuration/backends"), Ok(Action::ReplaceBackends));
        assert_eq!(route(Get, "/configuration/backends"), Ok(Action::ListBackends));
        assert_eq!(
            route(Get, "/configuration/backends/web-80"),
            Ok(Action::GetBackend("web-80"))
        );
        assert_eq!(
            route(Put, "/configuration/backends/web-80"),
            Ok(Action::PutBackend("web-80"))
        );
        assert_eq!(
            route(Delete, "/configuration/backends/a"),
            Ok(Action::DeleteBackend("a"))
        );
        assert_eq!(route(Get, "/configuration/status"), Ok(Action::Status));
        assert_eq!(route(Get, "/configuration/health"), Ok(Action::Health));
        assert_eq!(
            route(Put, "/configuration/backends"),
            Err(RouteError::MethodNotAllowed("GET, POST"))
        );
        assert_eq!(
            route(Post, "/configuration/backends/a"),
            Err(RouteError::MethodNotAllowed("GET, PUT, DELETE"))
        );
        assert_eq!(
            route(Post, "/configuration/status"),
            Err(RouteError::MethodNotAllowed("GET"))
        );
        for missing in [
            "/",
            "/configuration",
            "/configuration/backendsx",
            "/configuration/backends/a/b",
            "/configuration/certs",
        ] {
            assert_eq!(route(Get, missing), Err(RouteError::NotFound), "{missing}");
        }
    }

    #[test]
    fn bodies() {
        let e = ErrorBody {
            error: "bad \"x\"",
            path: Some("[0].name"),
        };
        assert_eq!(e.to_json(), br#"{"error":"bad \"x\"","path":"[0].name"}"#);
        assert_eq!(
            ErrorBody {
                error: "not found",
                path: None
            }
            .to_json(),
            br#"{"error":"not found"}"#
        );
        assert_eq!(json_array([&b"{}"[..], b"{\"a\":1}"]), b"[{},{\"a\":1}]");
        assert_eq!(json_array([]), b"[]");
    }
}
