//! `dynamic_balancer_routes`: Gateway API routing at request time.
//!
//! A REWRITE-phase handler. For a location that names a listener, it finds
//! the request's rule in the worker's compiled route table
//! ([`crate::backends::routes_cache`], matching in
//! [`lua_compat::routes::matcher`]) and applies it:
//!
//! - no rule: 404, as the spec says for a request no route matches;
//! - a `RequestRedirect`: the redirect, answered here;
//! - otherwise a backend chosen by weight goes into `$proxy_upstream_name`,
//!   which the location's `dynamic_balancer` upstream routes by; no usable
//!   backend: 500 (the spec's answer for an invalid backend ref);
//! - request header modifiers change the headers the proxy sends, a
//!   `URLRewrite` changes the `Host` header and the URI it sends;
//! - response header modifiers are left for [`super::gateway_headers`].
//!
//! Nothing is reloaded for any of this: a new table reaches the next
//! request of every worker.

use std::rc::Rc;

use lua_compat::routes::matcher::{Compiled, CompiledRule, Lookup, RequestView};
use lua_compat::routes::rewrite::{location, rewritten_path, RedirectFrom};
use lua_compat::routes::weighted;
use lua_compat::routes::HeaderModifier;
use ngx::ffi::{
    ngx_http_request_t, ngx_int_t, NGX_DECLINED, NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_HTTP_NOT_FOUND, NGX_LOG_ERR,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, Request};
use ngx::ngx_log_error;

use crate::backends::routes_cache;
use crate::conf::{own_variable, read_variable, zone_of};
use crate::http::https_redirect::{client_scheme, send_redirect};
use crate::nginx::guard::ffi_guard;
use crate::nginx::headers::{self, Side};
use crate::nginx::module::Module;
use crate::nginx::request::{header_in, pool_box};
use crate::nginx::variables::{self, Own, Read};

/// The rule a request matched, kept for the response header filter. The
/// table is held so that the rule outlives a table change.
pub struct Matched {
    _table: Rc<Compiled>,
    rule: *const CompiledRule,
}

impl Matched {
    /// The rule's response header modifier, if it has one.
    pub fn response_headers(&self) -> Option<&HeaderModifier> {
        // SAFETY: `rule` points into `_table`, which this value keeps alive.
        unsafe { &*self.rule }.rule.filters.response_headers.as_ref()
    }
}

struct View<'r> {
    req: &'r Request,
}

fn ngx_bytes(s: &ngx::ffi::ngx_str_t) -> &[u8] {
    if s.len == 0 || s.data.is_null() {
        return &[];
    }
    // SAFETY: nginx's strings in a live request point at `len` bytes in its
    // pool or buffers.
    unsafe { std::slice::from_raw_parts(s.data, s.len) }
}

impl RequestView for View<'_> {
    fn host(&self) -> &[u8] {
        read_variable(self.req, Read::Host).unwrap_or_default()
    }
    fn path(&self) -> &[u8] {
        ngx_bytes(&self.req.as_ref().uri)
    }
    fn method(&self) -> &[u8] {
        ngx_bytes(&self.req.as_ref().method_name)
    }
    fn header(&self, lower: &str) -> Option<&[u8]> {
        header_in(self.req, lower.as_bytes())
    }
    fn args(&self) -> &[u8] {
        ngx_bytes(&self.req.as_ref().args)
    }
}

/// The REWRITE phase handler: nginx calls it with a live request, on the
/// event loop. It declines in locations without `dynamic_balancer_routes`.
pub unsafe extern "C" fn rewrite_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    ffi_guard("gateway routes", NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t, || {
        // SAFETY: nginx runs phase handlers with a live request, on the
        // event loop, and holds no reference into it meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        let Some(listener) = Module::location_conf(req).and_then(|l| l.routes) else {
            return NGX_DECLINED as ngx_int_t;
        };
        // SAFETY: the directive stored an argument in the configuration
        // pool, which outlives the request.
        let listener = unsafe { std::slice::from_raw_parts(listener.data, listener.len) };
        let listener = std::str::from_utf8(listener).unwrap_or_default();
        route(req, listener)
    })
}

fn route(req: &mut Request, listener: &str) -> ngx_int_t {
    let log = req.log();
    let Some(zone) = zone_of(req) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    let Some(table) = routes_cache::current(&zone, |e| {
        ngx_log_error!(
            NGX_LOG_ERR,
            log,
            "dynamic_balancer: the stored route table does not compile: {e}"
        );
    }) else {
        return NGX_HTTP_NOT_FOUND as ngx_int_t;
    };
    let (found, port) = {
        let view = View { req };
        match table.find(listener, &view) {
            Lookup::Found(f) => (f, table.listener(listener).map_or(80, |l| l.port)),
            Lookup::NoRoute | Lookup::NoListener => return NGX_HTTP_NOT_FOUND as ngx_int_t,
        }
    };
    let rule = &found.rule.rule;
    if let Some(redirect) = &rule.filters.redirect {
        let raw = read_variable(req, Read::RequestUri).unwrap_or(b"/");
        let raw_path = raw.split(|b| *b == b'?').next().unwrap_or(raw);
        let path = if redirect.path.is_some() {
            ngx_bytes(&req.as_ref().uri)
        } else {
            raw_path
        };
        let target = location(
            redirect,
            &RedirectFrom {
                scheme: std::str::from_utf8(client_scheme(req)).unwrap_or("http"),
                host: read_variable(req, Read::Host).unwrap_or_default(),
                listener_port: port,
                path,
                prefix_len: found.prefix_len,
                args: ngx_bytes(&req.as_ref().args),
            },
        );
        return send_redirect(req, redirect.status_code, &target);
    }
    let chosen = weighted::pick(&rule.backends, found.rule.total_weight, fastrand::u64(..));
    let Some(backend) = chosen.and_then(|b| b.backend.as_deref()) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    let Some(index) = Module::main_conf(req).map(|m| m.read_variables[Read::UpstreamName as usize]) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    variables::set(req, index, backend.as_bytes());
    if let Some(m) = &rule.filters.request_headers {
        modify(req, Side::Request, m);
    }
    if let Some(rewrite) = &rule.filters.rewrite {
        if let Some(host) = &rewrite.hostname {
            headers::set(req, Side::Request, "Host", host);
        }
        if let Some(m) = &rewrite.path {
            let path = rewritten_path(m, ngx_bytes(&req.as_ref().uri), found.prefix_len);
            let Some(data) = variables::pool_copy(req, &path) else {
                return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
            };
            let r = req.as_mut();
            r.uri = ngx::ffi::ngx_str_t { len: path.len(), data };
            // The proxy sends `uri` (escaped) and `args`, not the client's
            // request line, once the URI changed.
            r.set_valid_unparsed_uri(0);
        }
    }
    if rule.filters.response_headers.is_some() {
        let matched = Matched {
            _table: table.clone(),
            rule: std::ptr::from_ref(found.rule),
        };
        // SAFETY: a live request's pool is live; the value is dropped by
        // the pool's cleanup, after the header filter ran.
        let Some(p) = (unsafe { pool_box(req.as_ref().pool, matched) }) else {
            return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
        };
        if let Some(index) = own_variable(req, Own::GatewayRoute) {
            variables::set_opaque(req, index, p.as_ptr().cast());
        }
    }
    NGX_DECLINED as ngx_int_t
}

/// Applies a header modifier in the spec's order: set, add, remove.
pub fn modify(req: &mut Request, side: Side, m: &HeaderModifier) {
    for h in &m.set {
        headers::set(req, side, &h.name, &h.value);
    }
    for h in &m.add {
        headers::add(req, side, &h.name, &h.value);
    }
    for name in &m.remove {
        headers::remove(req, side, name);
    }
}

/// The rule the request matched, if it has response headers to change.
pub fn matched(req: &Request) -> Option<&Matched> {
    let p = variables::get_opaque(req, own_variable(req, Own::GatewayRoute)?);
    // SAFETY: only `route` stores this variable's opaque value: a `Matched`
    // in the request's pool, alive as long as the request.
    unsafe { p.cast::<Matched>().as_ref() }
}
