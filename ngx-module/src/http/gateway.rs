//! `dynamic_balancer_routes`: Gateway API routing at request time.
//!
//! A REWRITE-phase handler. For a location that names a listener, it finds
//! the request's rule in the worker's compiled route table
//! ([`crate::backends::routes_cache`], matching in
//! [`lua_compat::routes::matcher`]) and applies it:
//!
//! - no rule: 404, as the spec says for a request no route matches (a
//!   gRPC call gets `UNIMPLEMENTED`, see [`super::grpc_status`]);
//! - a `RequestRedirect`: the redirect, answered here;
//! - otherwise a backend chosen by weight goes into `$proxy_upstream_name`,
//!   which the location's `dynamic_balancer` upstream routes by; no usable
//!   backend: 500 (the spec's answer for an invalid backend ref);
//! - request header modifiers change the headers the proxy sends, a
//!   `URLRewrite` changes the `Host` header and the URI it sends;
//! - response header modifiers are left for [`super::gateway_headers`];
//! - a backend that speaks HTTP/2 cleartext (a GRPCRoute's, an `h2c`
//!   Service port) needs `grpc_pass`, which the location's `proxy_pass`
//!   is not: the request goes on to the named location the directive's
//!   second argument gives.
//!
//! Nothing is reloaded for any of this: a new table reaches the next
//! request of every worker.

use lua_compat::routes::matcher::{CompiledModifier, CompiledRule, RequestView};
use lua_compat::routes::rewrite::{location, rewritten_path, RedirectFrom};
use lua_compat::routes::weighted;
use lua_compat::routes::{BackendProtocol, Rule, ValidationMode};
use ngx::ffi::{
    ngx_http_request_t, ngx_int_t, NGX_DECLINED, NGX_DONE, NGX_HTTP_BAD_REQUEST, NGX_HTTP_INTERNAL_SERVER_ERROR,
    NGX_HTTP_MISDIRECTED_REQUEST, NGX_HTTP_NOT_FOUND, NGX_LOG_ERR, NGX_LOG_INFO,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, Request};
use ngx::ngx_log_error;

use crate::backends::worker_cache::lookup;
use crate::backends::{canary, routes_cache};
use crate::conf::{own_variable, read_variable, request_host, zone_of, ListenerMemo};
use crate::http::gateway_cors;
use crate::http::gateway_matched::Matched;
use crate::http::gateway_mirror;
use crate::http::grpc_status::{self, GrpcAnswer};
use crate::http::https_redirect::{client_scheme, send_redirect};
use crate::nginx::guard::ffi_guard;
use crate::nginx::headers::{self, Side};
use crate::nginx::module::Module;
use crate::nginx::request::{client_certificate_verified, header_in, pool_box, ssl_server_name, str_bytes};

use crate::nginx::variables::{self, Own, Read};
use crate::shm::zone::Zone;

struct View<'r> {
    req: &'r Request,
}

impl RequestView for View<'_> {
    fn host(&self) -> &[u8] {
        request_host(self.req)
    }
    fn path(&self) -> &[u8] {
        str_bytes(&self.req.as_ref().uri)
    }
    fn method(&self) -> &[u8] {
        str_bytes(&self.req.as_ref().method_name)
    }
    fn header(&self, lower: &str) -> Option<&[u8]> {
        header_in(self.req, lower.as_bytes())
    }
    fn args(&self) -> &[u8] {
        str_bytes(&self.req.as_ref().args)
    }
}

/// The REWRITE phase handler: nginx calls it with a live request, on the
/// event loop. It declines in locations without `dynamic_balancer_routes`.
pub unsafe extern "C" fn rewrite_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    ffi_guard("gateway routes", NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t, || {
        // SAFETY: nginx runs phase handlers with a live request, on the
        // event loop, and holds no reference into it meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        let Some(lcf) = Module::location_conf(req) else {
            return NGX_DECLINED as ngx_int_t;
        };
        let Some(listener) = lcf.routes else {
            return NGX_DECLINED as ngx_int_t;
        };
        // SAFETY: the directive stored an argument in the configuration
        // pool, which outlives the request.
        let listener = unsafe { std::slice::from_raw_parts(listener.data, listener.len) };
        let rc = match gateway_mirror::mirror_index(req) {
            Some(i) => route_copy(req, i),
            None => route(req, listener, &lcf.routes_memo),
        };
        let (next, which) = match rc {
            H2C => (lcf.routes_h2c, "HTTP/2 cleartext (an @h2c location)"),
            TLS => (lcf.routes_tls, "HTTP/1.1 over TLS (an @tls location)"),
            H2_TLS => (lcf.routes_grpcs, "HTTP/2 over TLS (an @grpcs location)"),
            rc => return rc,
        };
        let Some(mut next) = next else {
            ngx_log_error!(
                NGX_LOG_ERR,
                req.log(),
                "dynamic_balancer: a route's backend speaks {} but this location's dynamic_balancer_routes names no location for it",
                which
            );
            return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
        };
        // The request goes on in the named location (grpc_pass, or the
        // TLS proxy) with the backend, headers and URI already set: the
        // variables and headers survive the jump, only module contexts are
        // cleared.
        // SAFETY: a live request; `next` names a location of the
        // configuration (nginx answers 500 itself if it does not exist).
        // nginx counts the jump as a reference to the request, which the
        // NGX_DONE finalization gives back, as its own modules do after an
        // internal redirect from a phase handler.
        unsafe {
            ngx::ffi::ngx_http_named_location(r, &mut next);
            ngx::ffi::ngx_http_finalize_request(r, ngx::ffi::NGX_DONE as ngx_int_t);
        }
        NGX_DONE as ngx_int_t
    })
}

/// `route`'s answers for a request whose backend is not reached with the
/// location's own `proxy_pass`: not nginx codes, so they cannot be
/// mistaken for one. HTTP/2 cleartext, HTTP/1.1 over TLS, HTTP/2 over TLS.
const H2C: ngx_int_t = -1000;
const TLS: ngx_int_t = -1001;
const H2_TLS: ngx_int_t = -1002;

/// Where a request to a backend of `protocol` (over TLS or not) goes on.
fn continue_in(protocol: BackendProtocol, tls: bool) -> ngx_int_t {
    match (protocol, tls) {
        (BackendProtocol::Http1, false) => NGX_DECLINED as ngx_int_t,
        (BackendProtocol::H2c, false) => H2C,
        (BackendProtocol::Http1, true) => TLS,
        (BackendProtocol::H2c, true) => H2_TLS,
    }
}

/// Points a mirror copy (see [`gateway_mirror`]) at its mirror backend;
/// nothing else of the rule applies to it again.
fn route_copy(req: &mut Request, index: usize) -> ngx_int_t {
    let Some((mirror, tls)) = gateway_mirror::mirror_of(req, index) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    let Some(index) = Module::main_conf(req).map(|m| m.read_variables[Read::UpstreamName as usize]) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    // SAFETY: the name lives in the route table the main request holds,
    // longer than this copy.
    unsafe { variables::set_borrowed(req, index, mirror.backend.as_bytes()) };
    continue_in(mirror.protocol, tls)
}

fn route(req: &mut Request, listener: &[u8], memo: &ListenerMemo) -> ngx_int_t {
    let log = req.log();
    let Some(zone) = zone_of(req) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    let Some(found) = routes_cache::current_listener(&zone, memo, listener, |e| {
        ngx_log_error!(
            NGX_LOG_ERR,
            log,
            "dynamic_balancer: the stored route table does not compile: {e}"
        );
    }) else {
        return NGX_HTTP_NOT_FOUND as ngx_int_t;
    };
    let Some(held) = found else {
        return refuse(req, GrpcAnswer::NoRoute);
    };
    let l = held.get();
    // HTTPS: a request whose Host belongs to another listener than the
    // one its connection's SNI chose is answered 421, as the spec asks.
    if l.has_certificates() {
        let host = request_host(req);
        let sni = ssl_server_name(req).and_then(lua_compat::certificates::sni_key);
        if sni.is_some_and(|sni| l.misdirected(sni.as_bytes(), host)) {
            return NGX_HTTP_MISDIRECTED_REQUEST as ngx_int_t;
        }
        // The handshake required a valid client certificate; a session
        // resumed from before validation was on (or from another CA
        // bundle's failure in fallback) did not go through it: refused as
        // nginx's `ssl_verify_client on` refuses (400).
        if l.client_validation
            .as_ref()
            .is_some_and(|v| v.mode == ValidationMode::AllowValidOnly)
            && !client_certificate_verified(req)
        {
            ngx_log_error!(
                NGX_LOG_INFO,
                log,
                "dynamic_balancer: the client sent no valid certificate on a listener that requires one"
            );
            return NGX_HTTP_BAD_REQUEST as ngx_int_t;
        }
    }
    let port = l.port;
    let found = {
        let view = View { req };
        match l.find(&view) {
            Some(f) => f,
            None => return refuse(req, GrpcAnswer::NoRoute),
        }
    };
    let found_prefix = found.prefix_len;
    let compiled: *const CompiledRule = found.rule;
    // SAFETY: the rule was found among the listener's.
    let matched = unsafe { Matched::new(held, compiled) };
    // SAFETY: a live request's pool is live; the value is dropped by the
    // pool's cleanup, when the request ends.
    let Some(p) = (unsafe { pool_box(req.as_ref().pool, matched) }) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    // Every later hook finds the rule through this variable; the backend
    // TLS hook in particular is installed only for a request that has it,
    // so a request without it must not go on (it could reach a TLS backend
    // unverified).
    let Some(slot) = own_variable(req, Own::GatewayRoute) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    variables::set_opaque(req, slot, p.as_ptr().cast());
    // SAFETY: the rule lives in the table that `Matched`, in the request's
    // pool, keeps alive until the request ends; every header and name the
    // request is given below points into it.
    let compiled = unsafe { &*compiled };
    let rule = &compiled.rule;
    if let Some(cors) = &compiled.cors {
        // SAFETY: as above.
        if let Some(rc) = unsafe { gateway_cors::answer_preflight(req, cors) } {
            return rc;
        }
    }
    if let Some(redirect) = &rule.filters.redirect {
        let raw = read_variable(req, Read::RequestUri).unwrap_or(b"/");
        let raw_path = raw.split(|b| *b == b'?').next().unwrap_or(raw);
        let path = if redirect.path.is_some() {
            str_bytes(&req.as_ref().uri)
        } else {
            raw_path
        };
        let target = location(
            redirect,
            &RedirectFrom {
                scheme: std::str::from_utf8(client_scheme(req)).unwrap_or("http"),
                host: request_host(req),
                listener_port: port,
                path,
                prefix_len: found_prefix,
                args: str_bytes(&req.as_ref().args),
            },
        );
        return send_redirect(req, redirect.status_code, &target);
    }
    let chosen = match session_backend(req, &zone, rule) {
        Some(i) => i,
        None => match weighted::pick(&rule.backends, compiled.total_weight, fastrand::u64(..)) {
            Some(i) => i,
            None => return refuse(req, GrpcAnswer::NoBackend),
        },
    };
    let Some(backend) = rule.backends[chosen].backend.as_deref() else {
        return refuse(req, GrpcAnswer::NoBackend);
    };
    let Some(index) = Module::main_conf(req).map(|m| m.read_variables[Read::UpstreamName as usize]) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    // SAFETY: the backend name lives in that table too.
    unsafe { variables::set_borrowed(req, index, backend.as_bytes()) };
    if let Some(m) = &compiled.request_headers {
        // SAFETY: the modifier lives in that table too.
        unsafe { modify(req, Side::Request, m) };
    }
    if let Some(Some(m)) = compiled.backend_request_headers.get(chosen) {
        // SAFETY: as above.
        unsafe { modify(req, Side::Request, m) };
    }
    // A backend's own URLRewrite replaces the rule's, part by part.
    let backend_rewrite = rule.backends[chosen].rewrite.as_ref();
    let host = match compiled.backend_rewrite_host.get(chosen) {
        Some(Some(h)) => Some(h),
        _ => compiled.rewrite_host.as_ref(),
    };
    if let Some(host) = host {
        // SAFETY: as above.
        unsafe { headers::set(req, Side::Request, host) };
    }
    let path_modifier = backend_rewrite
        .and_then(|w| w.path.as_ref())
        .or_else(|| rule.filters.rewrite.as_ref().and_then(|w| w.path.as_ref()));
    if let Some(m) = path_modifier {
        let path = rewritten_path(m, str_bytes(&req.as_ref().uri), found_prefix);
        let Some(data) = variables::pool_copy(req, &path) else {
            return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
        };
        let r = req.as_mut();
        r.uri = ngx::ffi::ngx_str_t { len: path.len(), data };
        // The proxy sends `uri` (escaped) and `args`, not the client's
        // request line, once the URI changed.
        r.set_valid_unparsed_uri(0);
    }
    continue_in(
        rule.backends[chosen].protocol,
        compiled.backend_tls.get(chosen).copied().unwrap_or(false),
    )
}

/// A rule with session persistence: the backend whose session the request
/// carries (its cookie or header names that backend), so a weighted split
/// does not move an established session. A backend whose weight went to 0
/// takes no sessions any more; within the backend, its sticky selector
/// follows the session to its endpoint.
fn session_backend(req: &Request, zone: &Zone, rule: &Rule) -> Option<usize> {
    if !rule.session_persistence || rule.backends.len() < 2 {
        return None;
    }
    rule.backends.iter().position(|b| {
        b.weight > 0
            && b.backend
                .as_deref()
                .and_then(|name| lookup(zone, name.as_bytes()))
                .is_some_and(|backend| canary::is_affinitized(req, &backend))
    })
}

/// The answer to a request no route takes (404) or whose rule has no
/// usable backend (500), as a gRPC status for a gRPC call.
fn refuse(req: &mut Request, answer: GrpcAnswer) -> ngx_int_t {
    if grpc_status::is_grpc(req) {
        return grpc_status::send(req, answer);
    }
    match answer {
        GrpcAnswer::NoRoute => NGX_HTTP_NOT_FOUND as ngx_int_t,
        GrpcAnswer::NoBackend => NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t,
    }
}

/// Applies a header modifier in the spec's order: set, add, remove.
///
/// # Safety
/// `m` lives as long as the request (it is in a table the request holds).
pub unsafe fn modify(req: &mut Request, side: Side, m: &CompiledModifier) {
    for h in &m.set {
        // SAFETY: this function's contract.
        unsafe { headers::set(req, side, h) };
    }
    for h in &m.add {
        // SAFETY: this function's contract.
        unsafe { headers::add(req, side, h) };
    }
    for h in &m.remove {
        headers::remove(req, side, &h.name);
    }
}
