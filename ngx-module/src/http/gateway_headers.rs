//! The response half of the Gateway API filters: `ResponseHeaderModifier`
//! and the `CORS` allow headers, applied in a header filter to the
//! response of a request that [`super::gateway`] routed by a rule with one.

use std::ptr;

use ngx::ffi::{ngx_http_output_header_filter_pt, ngx_http_request_t, ngx_int_t, NGX_ERROR};
use ngx::http::Request;

use crate::http::gateway::modify;
use crate::http::gateway_cors;
use crate::http::gateway_matched::matched;
use crate::nginx::guard::ffi_guard;
use crate::nginx::headers::Side;

static mut NEXT: ngx_http_output_header_filter_pt = None;

/// Puts the filter at the head of the header filter chain.
///
/// # Safety
/// Configuration time only (postconfiguration), on nginx's only thread.
pub unsafe fn install() {
    // SAFETY: configuration runs on nginx's only thread, before any request
    // reads either static (this function's contract).
    unsafe {
        NEXT = ngx::ffi::ngx_http_top_header_filter;
        ngx::ffi::ngx_http_top_header_filter = Some(header_filter);
    }
}

/// nginx calls it with a live request, on the event loop, before the
/// response header is sent.
unsafe extern "C" fn header_filter(r: *mut ngx_http_request_t) -> ngx_int_t {
    ffi_guard("gateway response headers", NGX_ERROR as ngx_int_t, || {
        // SAFETY: `install` wrote NEXT at configuration time, before any
        // request; request time only reads it, on the event loop.
        let next = unsafe { NEXT }.expect("the header filter chain has a tail");
        // SAFETY: nginx calls header filters with a live request, on the
        // event loop, and holds no reference into it meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        if let Some(rule) = matched(req).map(|m| std::ptr::from_ref(m.rule())) {
            // SAFETY: the rule lives in the route table that the request's
            // `Matched` (in its pool) keeps alive.
            let rule = unsafe { &*rule };
            if let Some(m) = &rule.response_headers {
                // SAFETY: as above.
                unsafe { modify(req, Side::Response, m) };
            }
            if let Some(cors) = &rule.cors {
                // SAFETY: as above.
                unsafe { gateway_cors::add_to_response(req, cors) };
            }
        }
        // SAFETY: the next filter of the chain, with the live request.
        unsafe { next(ptr::from_mut(req.as_mut())) }
    })
}
