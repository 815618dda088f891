//! `dynamic_balancer_https_redirect`: plain-HTTP requests to a location are
//! answered with a redirect to HTTPS, as ingress-nginx's
//! `lua_ingress.rewrite()` does for `ssl-redirect` and `force-ssl-redirect`
//! (the decision and the target are [`lua_compat::https_redirect`]).
//!
//! A REWRITE-phase handler, so it runs where the Lua ran and where an
//! `if (...) { return ...; }` would, before access checks and limits. The
//! `if` it replaces costs the rewrite module's script engine (an engine and
//! a stack from the pool, a variable through a `map`, a comparison) on
//! every request of the location; this is a flag test and one variable.
//! The answer is nginx's own redirect (`ngx_http_send_response`, as
//! `return code URL` sends it): same status line, `Location` and body.

use lua_compat::https_redirect;
use ngx::ffi::{
    ngx_http_complex_value_t, ngx_http_request_t, ngx_http_send_response, ngx_int_t, ngx_str_t, ngx_uint_t,
    NGX_DECLINED, NGX_HTTP_INTERNAL_SERVER_ERROR,
};
use ngx::http::{HttpModuleLocationConf, Request};

use crate::conf::{read_variable, request_host};
use crate::http::forwarded;
use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;
use crate::nginx::request;
use crate::nginx::variables::{self, Read};

/// The scheme the client used: `$dynamic_pass_access_scheme`, read once
/// per request and shared with the headers sent upstream.
pub(crate) fn client_scheme(req: &Request) -> &[u8] {
    read_variable(req, Read::PassAccessScheme).unwrap_or_else(|| forwarded::own_scheme(req))
}

/// The host the redirect names: the first `X-Forwarded-Host` element when
/// the location trusts forwarded headers and it is a host, else `$host`.
fn target_host(req: &Request) -> &[u8] {
    let forwarded = forwarded::trusted(req)
        .then(|| request::header_in(req, b"x-forwarded-host"))
        .flatten()
        .and_then(https_redirect::forwarded_host);
    forwarded.unwrap_or_else(|| request_host(req))
}

/// Answers `code` with no body (a 204 to a CORS preflight); returns what
/// the phase handler returns.
pub(crate) fn send_status(req: &Request, code: u16) -> ngx_int_t {
    send_redirect(req, code, b"")
}

/// Answers `code` with `location` as nginx's `return` does (for a code
/// that is no redirect, `location` is the body); returns what the phase
/// handler returns.
pub(crate) fn send_redirect(req: &Request, code: u16, location: &[u8]) -> ngx_int_t {
    let r = req.as_ref();
    let Some(data) = variables::pool_copy(req, location) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    // SAFETY: all-zero is a valid complex value (no scripts); with
    // `lengths` null nginx takes `value` as it is.
    let mut cv: ngx_http_complex_value_t = unsafe { std::mem::zeroed() };
    cv.value = ngx_str_t {
        len: location.len(),
        data,
    };
    // SAFETY: `req` is the live request (nginx holds no reference into it
    // during this phase handler); the `Location` value lives in its pool,
    // and `cv` is only read during the call.
    unsafe {
        ngx_http_send_response(
            std::ptr::from_ref(r).cast_mut(),
            ngx_uint_t::from(code),
            std::ptr::null_mut(),
            &mut cv,
        )
    }
}

/// The REWRITE phase handler: nginx calls it with a live request, on the
/// event loop. It declines unless the location redirects and the request
/// came over plain HTTP.
pub unsafe extern "C" fn rewrite_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    ffi_guard("https redirect", NGX_DECLINED as ngx_int_t, || {
        // SAFETY: nginx runs phase handlers with a live request, on the
        // event loop, and holds no reference into it meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        let Some(rule) = Module::location_conf(req).and_then(|l| l.https_redirect.flatten()) else {
            return NGX_DECLINED as ngx_int_t;
        };
        if !https_redirect::is_plain_http(client_scheme(req)) {
            return NGX_DECLINED as ngx_int_t;
        }
        let uri = read_variable(req, Read::RequestUri).unwrap_or(b"/");
        let location = https_redirect::location(&rule, target_host(req), uri);
        send_redirect(req, rule.code, &location)
    })
}
