//! `$dynamic_pass_access_scheme` and `$dynamic_pass_server_port`: the scheme
//! and port the client used, as ingress-nginx's `$pass_access_scheme` and
//! `$pass_server_port` give them. Under `dynamic_balancer_forwarded_headers
//! on` (ingress-nginx's `use-forwarded-headers`: a load balancer in front is
//! trusted) they are its `X-Forwarded-Proto` and `X-Forwarded-Port` when
//! present and not empty; otherwise, and always when it is off, the
//! connection's own `$scheme` and `$server_port`.
//!
//! ingress-nginx sets them in Lua; a template writes them as a `map` each
//! over `$http_x_forwarded_*`: a complex value for the key, a hash lookup, a
//! complex value for the result, about 350 instructions apiece per request,
//! and `$server_port` formats its number with `ngx_sprintf` (another 250).
//! Here a header is one pass over the header list comparing lengths, the
//! port is the listening socket's, formatted by hand, and nginx caches
//! both for the request. Repeated headers are joined by `, `, as
//! `$http_x_forwarded_proto` joins them.

use lua_compat::addr_text::{port_decimal, port_digits};
use ngx::ffi::{ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t, sockaddr_in, sockaddr_in6, NGX_OK};
use ngx::http::{HttpModuleLocationConf, Request};

use crate::conf::read_variable;
use crate::nginx::module::Module;
use crate::nginx::request;
use crate::nginx::variables::{self, Read};

/// Whether the request's location trusts `X-Forwarded-*` headers.
pub fn trusted(req: &Request) -> bool {
    Module::location_conf(req).is_some_and(|l| l.forwarded_headers == Some(true))
}

/// The scheme of the request's own connection, as `$scheme`.
pub fn own_scheme(req: &Request) -> &'static [u8] {
    // SAFETY: a live request's connection outlives it.
    if unsafe { (*req.connection()).ssl.is_null() } {
        b"http"
    } else {
        b"https"
    }
}

/// A trusted, non-empty `X-Forwarded-*` header (joined when repeated).
fn forwarded<'r>(req: &'r Request, lowercase_name: &'static [u8]) -> Option<&'r [u8]> {
    if !trusted(req) {
        return None;
    }
    request::header_in_joined(req, lowercase_name).filter(|v| !v.is_empty())
}

/// The get handler of `$dynamic_pass_access_scheme`: nginx calls it with a
/// live request and the variable's value slot, once per request.
pub unsafe extern "C" fn scheme_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    let body = |req: &mut Request, v: &mut ngx_http_variable_value_t| {
        let scheme = forwarded(req, b"x-forwarded-proto").unwrap_or_else(|| own_scheme(req));
        // SAFETY: the header (or its joined copy) is in the request's pool,
        // a static string otherwise: both outlive the cached value.
        unsafe { variables::fill_borrowed(v, scheme) };
        NGX_OK as ngx_int_t
    };
    // SAFETY: nginx calls a get handler with a live request and its value
    // slot, which nothing else borrows during the call.
    unsafe { variables::get_handler("$dynamic_pass_access_scheme", r, v, body) }
}

/// The port the connection was accepted on: the listening socket's, which
/// is what `getsockname` gives `$server_port` for TCP and QUIC.
enum ListeningPort<'a> {
    /// The digits of the listener's `addr_text` (`ip:port`, `[ip6]:port`),
    /// which nginx formatted once for the cycle: no formatting per request.
    Text(&'a [u8]),
    Number(u16),
}

fn listening_port(req: &Request) -> Option<ListeningPort<'_>> {
    // SAFETY: a live request's connection outlives it, and a connection a
    // listener accepted keeps a pointer to that listener (the cycle's).
    let ls = unsafe { (*req.connection()).listening.as_ref() }?;
    if ls.sockaddr.is_null() {
        return None;
    }
    // SAFETY: `sockaddr` is the listener's address, `socklen` bytes; the
    // family says which layout it has.
    let port = unsafe {
        match i32::from((*ls.sockaddr).sa_family) {
            libc::AF_INET => u16::from_be((*ls.sockaddr.cast::<sockaddr_in>()).sin_port),
            libc::AF_INET6 => u16::from_be((*ls.sockaddr.cast::<sockaddr_in6>()).sin6_port),
            // A unix socket has no port: behind ssl-passthrough's stream
            // hop, the port the client connected to is the PROXY
            // protocol's destination port.
            _ => return proxy_protocol_port(req).map(ListeningPort::Number),
        }
    };
    if !ls.addr_text.data.is_null() {
        // SAFETY: nginx keeps `addr_text` (`len` bytes in the cycle's pool)
        // for the cycle, which outlives its requests.
        let text = unsafe { std::slice::from_raw_parts(ls.addr_text.data, ls.addr_text.len) };
        if let Some(digits) = port_digits(text) {
            return Some(ListeningPort::Text(digits));
        }
    }
    Some(ListeningPort::Number(port))
}

/// The destination port of the connection's PROXY protocol header, if it
/// had one.
fn proxy_protocol_port(req: &Request) -> Option<u16> {
    // SAFETY: a live request's connection outlives it; `proxy_protocol` is
    // null or the header nginx parsed into the connection's pool.
    let pp = unsafe { (*req.connection()).proxy_protocol.as_ref() }?;
    // nginx stores the port in host byte order (ngx_atoi or ntohs).
    (pp.dst_port != 0).then_some(pp.dst_port)
}

/// The get handler of `$dynamic_pass_server_port`: nginx calls it with a
/// live request and the variable's value slot, once per request.
pub unsafe extern "C" fn port_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    let body = |req: &mut Request, v: &mut ngx_http_variable_value_t| {
        if let Some(port) = forwarded(req, b"x-forwarded-port") {
            // SAFETY: the header (or its joined copy) is in the request's
            // pool, which outlives the cached value.
            unsafe { variables::fill_borrowed(v, port) };
            return NGX_OK as ngx_int_t;
        }
        match listening_port(req) {
            Some(ListeningPort::Text(digits)) => {
                // SAFETY: `addr_text` lives as long as the cycle, which
                // outlives every read of this variable's cached value.
                unsafe { variables::fill_borrowed(v, digits) };
                return NGX_OK as ngx_int_t;
            }
            Some(ListeningPort::Number(port)) => {
                let mut buf = [0u8; 5];
                return variables::fill(req, v, port_decimal(port, &mut buf));
            }
            None => {}
        }
        // A unix socket without a PROXY header: whatever `$server_port` says.
        match read_variable(req, Read::ServerPort) {
            // SAFETY: `$server_port` is in the request's pool, which
            // outlives every read of this variable's cached value.
            Some(port) => unsafe { variables::fill_borrowed(v, port) },
            None => variables::fill_not_found(v),
        }
        NGX_OK as ngx_int_t
    };
    // SAFETY: nginx calls a get handler with a live request and its value
    // slot, which nothing else borrows during the call.
    unsafe { variables::get_handler("$dynamic_pass_server_port", r, v, body) }
}
