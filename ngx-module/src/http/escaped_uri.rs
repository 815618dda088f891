//! `$escaped_request_uri`: `$request_uri` escaped as one URI component
//! ([`lua_compat::escape`]). ingress-nginx makes it with set-misc's
//! `set_escape_uri` for the `rd=` parameter of the external-authentication
//! sign-in redirect, and users write it in `auth-signin` URLs; the same
//! name keeps those annotations working. Only the sign-in redirect reads
//! it, so it costs nothing on the proxied path.

use ngx::ffi::{ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t};
use ngx::http::Request;

use crate::nginx::variables;

/// The get handler of `$escaped_request_uri`: nginx calls it with a live
/// request and the variable's value slot.
pub unsafe extern "C" fn variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    let body = |req: &mut Request, v: &mut ngx_http_variable_value_t| {
        let uri = req.as_ref().unparsed_uri;
        let raw: &[u8] = if uri.data.is_null() || uri.len == 0 {
            b""
        } else {
            // SAFETY: `unparsed_uri` points at `len` bytes of the request
            // line, in the request's buffers, live with the request.
            unsafe { std::slice::from_raw_parts(uri.data, uri.len) }
        };
        variables::fill(req, v, &lua_compat::escape::component(raw))
    };
    // SAFETY: nginx calls a get handler with a live request and its value
    // slot, which nothing else borrows during the call.
    unsafe { variables::get_handler("$escaped_request_uri", r, v, body) }
}
