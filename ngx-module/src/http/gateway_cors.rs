//! The HTTPRoute `CORS` filter at request time: the route handler answers
//! a preflight itself ([`answer_preflight`]), and the response header
//! filter adds the allow headers to the backend's answer to an actual
//! cross-origin request ([`add_to_response`]). What to write comes from
//! [`lua_compat::routes::cors`].

use lua_compat::routes::cors::{classify, CompiledCors, Kind};
use ngx::ffi::{ngx_int_t, NGX_HTTP_NO_CONTENT};
use ngx::http::Request;

use crate::http::https_redirect::send_status;
use crate::nginx::headers::{self, Side};
use crate::nginx::request::{header_in, header_in_joined, str_bytes};

/// The request's CORS headers, detached from the borrow of `req`.
fn kind<'a>(req: &Request) -> Kind<'a> {
    let method = str_bytes(&req.as_ref().method_name);
    let origin = header_in(req, b"origin");
    // Only a preflight's are read: a request's headers are a list walk each.
    let preflight = method == b"OPTIONS" && origin.is_some();
    let k = classify(
        method,
        origin,
        preflight
            .then(|| header_in(req, b"access-control-request-method"))
            .flatten(),
        preflight
            .then(|| header_in_joined(req, b"access-control-request-headers"))
            .flatten(),
    );
    // SAFETY: every slice points into the request's header buffers or pool
    // (a joined copy), which live as long as the request; the borrow of
    // `req` is dropped so the caller can write its response headers.
    unsafe { detach(k) }
}

/// # Safety
/// The slices in `k` outlive every use the caller makes of the result.
unsafe fn detach<'a>(k: Kind<'_>) -> Kind<'a> {
    // SAFETY: the caller's contract; `Kind` only holds byte slices.
    let d = |s: &[u8]| -> &'a [u8] { unsafe { std::slice::from_raw_parts(s.as_ptr(), s.len()) } };
    match k {
        Kind::NotCors => Kind::NotCors,
        Kind::Actual { origin } => Kind::Actual { origin: d(origin) },
        Kind::Preflight {
            origin,
            method,
            headers,
        } => Kind::Preflight {
            origin: d(origin),
            method: d(method),
            headers: headers.map(d),
        },
    }
}

/// Answers a preflight request (204 with the allow headers, none when the
/// origin is not allowed); `None` for any other request, which goes on.
///
/// # Safety
/// `cors` lives as long as the request (in the table its `Matched` holds).
pub unsafe fn answer_preflight(req: &mut Request, cors: &CompiledCors) -> Option<ngx_int_t> {
    let Kind::Preflight {
        origin,
        method,
        headers: asked,
    } = kind(req)
    else {
        return None;
    };
    for (h, v) in cors.preflight(origin, method, asked) {
        // SAFETY: the header and its value live as long as the request
        // (this function's contract; the values are the request's own).
        unsafe { headers::set_with(req, Side::Response, h, v) };
    }
    Some(send_status(req, NGX_HTTP_NO_CONTENT as u16))
}

/// Adds the allow headers to the response of an actual cross-origin
/// request from an allowed origin, and `Vary: Origin` to every response
/// of the rule. A preflight was answered already.
///
/// # Safety
/// As [`answer_preflight`].
pub unsafe fn add_to_response(req: &mut Request, cors: &CompiledCors) {
    let origin = match kind(req) {
        Kind::Preflight { .. } => return,
        Kind::Actual { origin } => Some(origin),
        Kind::NotCors => None,
    };
    for (h, v) in cors.response(origin) {
        // SAFETY: as in `answer_preflight`. `Vary` is added to the
        // backend's own; the allow headers replace any it sent.
        unsafe {
            if &*h.lower == "vary" {
                headers::add_with(req, Side::Response, h, v);
            } else {
                headers::set_with(req, Side::Response, h, v);
            }
        }
    }
}
