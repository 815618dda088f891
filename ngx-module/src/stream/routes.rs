//! Gateway API TCPRoutes, UDPRoutes and TLSRoutes at connection time.
//!
//! A stream `server{}` with `dynamic_balancer_routes listener;` takes its
//! backend, per connection, from that listener's entry of the route table
//! the HTTP half keeps ([`crate::backends::routes_cache`]): the controller
//! gives a TCP or UDP listener one host group (`*`) whose first match is
//! the oldest route's rule, and a TLS passthrough listener a host group per
//! route hostname, looked up by the client's TLS server name
//! (`$ssl_preread_server_name`, or the handshake's SNI where the server
//! terminates TLS, see [`super::tls`]), lower-cased and without a trailing
//! dot, as an HTTP request's host is. The rule's backend is chosen by weight,
//! as for HTTP; a backend a BackendTLSPolicy covers is reached over TLS
//! ([`super::backend_tls`]). Nothing here reloads: a new table reaches
//! the next connection of every worker.

use std::rc::Rc;

use lua_compat::routes::matcher::{sni_host, Compiled, Lookup, RequestView};
use lua_compat::routes::weighted;
use ngx::ffi::{ngx_log_t, ngx_stream_session_t, NGX_LOG_ERR, NGX_LOG_WARN};
use ngx::ngx_log_error;

use crate::backends::routes_cache;
use crate::nginx::request::servername;
use crate::shm::zone::Zone;

/// A connection as the matcher sees it: a host (the TLS server name,
/// lower-cased; empty without one) and nothing else to match on.
struct Connection {
    host: Vec<u8>,
}

impl RequestView for Connection {
    fn host(&self) -> &[u8] {
        &self.host
    }
    fn path(&self) -> &[u8] {
        b"/"
    }
    fn method(&self) -> &[u8] {
        b""
    }
    fn header(&self, _lower: &str) -> Option<&[u8]> {
        None
    }
    fn args(&self) -> &[u8] {
        b""
    }
}

/// The TLS server name of session `s`: its handshake's when the server
/// terminated TLS (`dynamic_balancer_ssl_routes`), else what
/// `ssl_preread` read (empty without one).
///
/// # Safety
/// `s` is a live session on its worker's event loop.
unsafe fn server_name<'s>(s: *mut ngx_stream_session_t) -> &'s [u8] {
    // SAFETY: a live session's connection is live; `ssl` is null or its
    // TLS state, whose `SSL` lives as long as the connection.
    let ssl = unsafe { (*s).connection.as_ref().and_then(|c| c.ssl.as_ref()) };
    if let Some(ssl) = ssl {
        // SAFETY: as above.
        return unsafe { servername(ssl.connection) }.unwrap_or_default();
    }
    // SAFETY: this function's contract.
    unsafe { super::conf::variable(s, "ssl_preread_server_name") }.unwrap_or_default()
}

/// The backend `listener`'s routes chose for a session.
pub struct Routed {
    /// The backend's name in the zone.
    pub name: String,
    /// The route that chose it, for the logs of a backend reached over
    /// TLS; `None` otherwise (not copied for every plain connection).
    pub route: Option<String>,
    /// A BackendTLSPolicy says the backend is reached over TLS (see
    /// [`super::backend_tls`]).
    pub tls: bool,
    /// The table the session was routed by.
    pub table: Rc<Compiled>,
}

/// The backend `listener`'s routes choose for session `s`, or `None`
/// (logged) when no route takes the connection or its rule has no usable
/// backend: the connection is then closed.
///
/// # Safety
/// `s` is a live session on its worker's event loop; `log` is its log.
pub unsafe fn backend(
    s: *mut ngx_stream_session_t,
    zone: &Zone,
    listener: &[u8],
    log: *mut ngx_log_t,
) -> Option<Routed> {
    let table = routes_cache::current(zone, |e| {
        ngx_log_error!(
            NGX_LOG_ERR,
            log,
            "dynamic_balancer: the stored route table does not compile: {e}"
        );
    })?;
    // SAFETY: this function's contract (`s` live, on its event loop) is
    // `server_name`'s.
    let sni = unsafe { server_name(s) };
    let conn = Connection { host: sni_host(sni) };
    let found = match table.find(listener, &conn) {
        Lookup::Found(f) => f,
        Lookup::NoRoute | Lookup::NoListener => {
            ngx_log_error!(
                NGX_LOG_WARN,
                log,
                "dynamic_balancer: no route of \"{}\" takes this connection (server name \"{}\"); closing it",
                String::from_utf8_lossy(listener).escape_debug(),
                String::from_utf8_lossy(&conn.host).escape_debug()
            );
            return None;
        }
    };
    let rule = &found.rule.rule;
    let chosen = weighted::pick(&rule.backends, found.rule.total_weight, fastrand::u64(..))?;
    let Some(name) = rule.backends[chosen].backend.clone() else {
        ngx_log_error!(
            NGX_LOG_WARN,
            log,
            "dynamic_balancer: route {} has no usable backend for this connection; closing it",
            rule.route.escape_debug()
        );
        return None;
    };
    let tls = found.rule.backend_tls.get(chosen).copied().unwrap_or(false);
    let route = tls.then(|| rule.route.to_string());
    Some(Routed {
        name,
        route,
        tls,
        table,
    })
}
