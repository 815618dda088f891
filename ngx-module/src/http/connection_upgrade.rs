//! `$dynamic_upgrade` and `$dynamic_connection_upgrade`: the WebSocket
//! headers a proxied request sends upstream, read from the `Upgrade` header
//! nginx already parsed (`r->headers_in.upgrade`).
//!
//! ingress-nginx writes them as `$http_upgrade` and a `map` over it
//! (`default upgrade; '' '';`). `$http_upgrade` walks the whole header list,
//! and the map evaluates a complex value and a hash lookup: about 380
//! instructions per request that these two variables do not spend. The
//! values are the same for a request with at most one `Upgrade` header: the
//! client's Upgrade value, and `upgrade` when it is not empty, else empty
//! (so with upstream keepalive no `Connection` header is sent). With
//! several, `$http_upgrade` joins them with `, ` while this is the first,
//! the one nginx itself keeps as the request's `Upgrade`.

use ngx::ffi::{ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t, NGX_OK};

use ngx::http::Request;

use crate::nginx::variables;

/// The request's first `Upgrade` header value, if any.
fn upgrade(req: &Request) -> Option<&[u8]> {
    // SAFETY: a live request's `headers_in.upgrade` is null or a header in
    // its pool, whose `value` holds `len` bytes; the pool outlives `req`.
    unsafe {
        let h = req.as_ref().headers_in.upgrade.as_ref()?;
        (!h.value.data.is_null()).then(|| std::slice::from_raw_parts(h.value.data, h.value.len))
    }
}

/// The get handler of `$dynamic_upgrade`: nginx calls it with a live
/// request and the variable's value slot (cached for the request).
pub unsafe extern "C" fn upgrade_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    let body = |req: &mut Request, v: &mut ngx_http_variable_value_t| {
        match upgrade(req) {
            // SAFETY: the header lives in the request's pool, which outlives
            // every read of the cached value.
            Some(value) => unsafe { variables::fill_borrowed(v, value) },
            None => variables::fill_not_found(v),
        }
        NGX_OK as ngx_int_t
    };
    // SAFETY: nginx calls a get handler with a live request and its value
    // slot, which nothing else borrows during the call.
    unsafe { variables::get_handler("$dynamic_upgrade", r, v, body) }
}

/// The get handler of `$dynamic_connection_upgrade`: `upgrade` when the
/// request has a non-empty `Upgrade` header, else empty. nginx calls it with
/// a live request and the variable's value slot (cached for the request).
pub unsafe extern "C" fn connection_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    let body = |req: &mut Request, v: &mut ngx_http_variable_value_t| {
        match upgrade(req) {
            // SAFETY: a static string outlives every request.
            Some(value) if !value.is_empty() => unsafe { variables::fill_borrowed(v, b"upgrade") },
            _ => variables::fill_empty(v),
        }
        NGX_OK as ngx_int_t
    };
    // SAFETY: nginx calls a get handler with a live request and its value
    // slot, which nothing else borrows during the call.
    unsafe { variables::get_handler("$dynamic_connection_upgrade", r, v, body) }
}
