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
    ListCertificates,
    GetCertificate(&'a str),
    PutCertificate(&'a str),
    DeleteCertificate(&'a str),
    /// `GET /configuration/servers`: the host → certificate id map.
    GetServers,
    /// `PUT /configuration/servers`: replaces the map.
    PutServers,
    /// `POST /configuration/servers`: ingress-nginx's additive body.
    PostServers,
    /// `GET /configuration/metrics`: request metrics, Prometheus text.
    Metrics,
    /// `GET /configuration/routes`: the Gateway API route table.
    GetRoutes,
    /// `PUT /configuration/routes`: replaces it.
    PutRoutes,
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
const CERTIFICATES: &str = "/configuration/certificates";
const SERVERS: &str = "/configuration/servers";
const METRICS: &str = "/configuration/metrics";
const ROUTES: &str = "/configuration/routes";

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
    if path == METRICS {
        return match method {
            Method::Get => Ok(Action::Metrics),
            _ => Err(RouteError::MethodNotAllowed("GET")),
        };
    }
    if path == ROUTES {
        return match method {
            Method::Get => Ok(Action::GetRoutes),
            Method::Put => Ok(Action::PutRoutes),
            _ => Err(RouteError::MethodNotAllowed("GET, PUT")),
        };
    }
    if path == SERVERS {
        return match method {
            Method::Get => Ok(Action::GetServers),
            Method::Put => Ok(Action::PutServers),
            Method::Post => Ok(Action::PostServers),
            _ => Err(RouteError::MethodNotAllowed("GET, PUT, POST")),
        };
    }
    if path == CERTIFICATES || path == "/configuration/certificates/" {
        return match method {
            Method::Get => Ok(Action::ListCertificates),
            _ => Err(RouteError::MethodNotAllowed("GET")),
        };
    }
    if let Some(id) = path.strip_prefix(CERTIFICATES).and_then(|rest| rest.strip_prefix('/')) {
        if id.is_empty() || id.contains('/') {
            return Err(RouteError::NotFound);
        }
        return match method {
            Method::Get => Ok(Action::GetCertificate(id)),
            Method::Put => Ok(Action::PutCertificate(id)),
            Method::Delete => Ok(Action::DeleteCertificate(id)),
            _ => Err(RouteError::MethodNotAllowed("GET, PUT, DELETE")),
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

/// Headers that proxies add. A request that carries one came through a
/// proxy (nginx's own public port among them: the rendered template sets
/// several), never straight from the controller, and is refused.
pub const PROXY_HEADERS: [&str; 6] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "via",
];

/// Why a request may not use the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denied {
    /// 403: it carries this proxy header.
    Proxied(&'static str),
    /// 401: a token is configured and the request lacks it (or has another).
    Unauthorized,
}

/// Checks a request's headers against the API's access rules: no proxy
/// headers, and `Authorization: Bearer <token>` when a token is set. The
/// token comparison takes the same time wherever the first difference is.
pub fn check_access<'a>(
    headers: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    token: Option<&[u8]>,
) -> Result<(), Denied> {
    let mut presented: Option<&[u8]> = None;
    let mut authorizations = 0;
    for (name, value) in headers {
        if let Some(h) = PROXY_HEADERS.iter().find(|h| name.eq_ignore_ascii_case(h.as_bytes())) {
            return Err(Denied::Proxied(h));
        }
        if name.eq_ignore_ascii_case(b"authorization") {
            authorizations += 1;
            presented = bearer(value);
        }
    }
    let Some(token) = token else { return Ok(()) };
    match presented {
        Some(p) if authorizations == 1 && constant_time_eq(p, token) => Ok(()),
        _ => Err(Denied::Unauthorized),
    }
}

/// The credentials of `Bearer <token>` (the scheme is case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at(value.iter().position(|b| *b == b' ')?);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| rest.trim_ascii())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a configured token is usable: long enough to resist guessing,
/// and made of characters that survive a header unchanged.
pub fn check_token(token: &[u8]) -> Result<(), String> {
    if token.len() < 16 {
        return Err("the API token must be at least 16 characters".into());
    }
    if token.len() > 4096 || !token.iter().all(|b| b.is_ascii_graphic()) {
        return Err("the API token must be at most 4096 printable characters without spaces".into());
    }
    Ok(())
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
    /// The shared per-endpoint state (passive health, connections, EWMA).
    pub endpoint_table: EndpointTableStatus,
    /// Workers that died holding the zone's lock and were cleared.
    pub lock_recovered: u64,
    /// With `dynamic_balancer_state`: the state file's last write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_file: Option<StateFileStatus>,
}

/// `state_file` of `/configuration/status`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct StateFileStatus {
    pub path: String,
    /// The zone generation whose backends the file holds (0: none yet).
    /// DNS re-resolutions change no backend's JSON and are not written.
    pub generation: u64,
    /// The last attempt's failure, e.g. `"lock: Permission denied (os
    /// error 13)"`; null after a success.
    pub error: Option<String>,
    /// How long the last successful write took, in microseconds.
    pub write_us: u64,
}

/// `endpoint_table` of `/configuration/status`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct EndpointTableStatus {
    /// Slots the zone has given the table so far (it grows as endpoints
    /// arrive; freed slots are reused).
    pub capacity: u64,
    pub tracked: u64,
    /// Endpoints routed without shared state because the zone had no room
    /// for theirs; a larger `dynamic_balancer_zone` gives them room.
    pub untracked: u64,
    /// Endpoints whose slot went to another backend's below its fair
    /// share, since the zone was created.
    pub evicted: u64,
    /// Zone bytes the table holds.
    pub bytes: u64,
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
    /// Whether the endpoint has shared state; an untracked one (the zone
    /// had no room) routes without passive health, connections and EWMA.
    pub tracked: bool,
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
    fn certificate_routes() {
        assert_eq!(
            route(Method::Get, "/configuration/certificates"),
            Ok(Action::ListCertificates)
        );
        assert_eq!(
            route(Method::Put, "/configuration/certificates/a_b"),
            Ok(Action::PutCertificate("a_b"))
        );
        assert_eq!(
            route(Method::Delete, "/configuration/certificates/x"),
            Ok(Action::DeleteCertificate("x"))
        );
        assert_eq!(
            route(Method::Get, "/configuration/certificates/x/y"),
            Err(RouteError::NotFound)
        );
        assert_eq!(
            route(Method::Post, "/configuration/certificates"),
            Err(RouteError::MethodNotAllowed("GET"))
        );
        assert_eq!(route(Method::Post, "/configuration/servers"), Ok(Action::PostServers));
        assert_eq!(route(Method::Put, "/configuration/servers"), Ok(Action::PutServers));
        assert_eq!(route(Method::Get, "/configuration/servers"), Ok(Action::GetServers));
    }

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
        assert_eq!(route(Get, "/configuration/metrics"), Ok(Action::Metrics));
        assert_eq!(
            route(Post, "/configuration/metrics"),
            Err(RouteError::MethodNotAllowed("GET"))
        );
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
            "/configuration/metrics/x",
        ] {
            assert_eq!(route(Get, missing), Err(RouteError::NotFound), "{missing}");
        }
    }

    #[test]
    fn access_needs_the_token_and_no_proxy_headers() {
        let token = Some(&b"0123456789abcdef0123"[..]);
        let h = |pairs: &[(&'static str, &'static str)]| -> Vec<(&'static [u8], &'static [u8])> {
            pairs.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())).collect()
        };
        assert_eq!(check_access(h(&[("Host", "x")]), None), Ok(()));
        assert_eq!(check_access(h(&[]), token), Err(Denied::Unauthorized));
        assert_eq!(
            check_access(h(&[("Authorization", "Bearer 0123456789abcdef0123")]), token),
            Ok(())
        );
        assert_eq!(
            check_access(h(&[("authorization", "bearer  0123456789abcdef0123 ")]), token),
            Ok(())
        );
        for bad in [
            "Bearer 0123456789abcdef012",
            "Bearer 0123456789abcdef01234",
            "Basic 0123456789abcdef0123",
            "Bearer",
        ] {
            assert_eq!(
                check_access(h(&[("Authorization", bad)]), token),
                Err(Denied::Unauthorized),
                "{bad}"
            );
        }
        let twice = h(&[
            ("Authorization", "Bearer wrong"),
            ("Authorization", "Bearer 0123456789abcdef0123"),
        ]);
        assert_eq!(check_access(twice, token), Err(Denied::Unauthorized));
        let proxied = h(&[
            ("Authorization", "Bearer 0123456789abcdef0123"),
            ("X-Forwarded-For", "203.0.113.9"),
        ]);
        assert_eq!(check_access(proxied, token), Err(Denied::Proxied("x-forwarded-for")));
        assert_eq!(
            check_access(h(&[("X-REAL-IP", "1.2.3.4")]), None),
            Err(Denied::Proxied("x-real-ip"))
        );
        assert!(check_token(b"short").is_err());
        assert!(check_token(b"has a space in it!!").is_err());
        assert!(check_token(b"0123456789abcdef").is_ok());
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
