//! The API location's body limit, enforced while the body streams in.
//!
//! The API location takes `client_max_body_size` over from nginx (so that an
//! oversize body is answered in JSON), which also turns off nginx's own check
//! on chunked and HTTP/2 bodies. This request-body filter puts the limit back:
//! past it, the rest of the body is read and dropped rather than stored (nginx
//! discards bodies the same way), and the handler answers 413 once the body
//! has ended. Neither memory nor the temp file grows past the limit.

use std::ptr;

use ngx::ffi::{
    ngx_buf_t, ngx_chain_t, ngx_http_request_body_filter_pt, ngx_http_request_t, ngx_int_t, ngx_pcalloc, NGX_ERROR,
};
use ngx::http::{HttpModuleLocationConf, Request};

use crate::http::request_ctx::{self, BodyBudget};
use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;

static mut NEXT: ngx_http_request_body_filter_pt = None;

/// Installs the filter (postconfiguration).
///
/// # Safety
/// Called once per configuration, before any request.
pub unsafe fn install() {
    // SAFETY: configuration runs on nginx's only thread, before any request
    // reads either static (this function's contract).
    unsafe {
        NEXT = ngx::ffi::ngx_http_top_request_body_filter;
        ngx::ffi::ngx_http_top_request_body_filter = Some(filter);
    }
}

/// The budget of a request that is an API write (set by the handler before it
/// reads the body), if it is one.
///
/// # Safety
/// As [`request_ctx::pending_write`]: no other reference to the request's
/// state is live while the result is used, and the result does not outlive
/// the request.
unsafe fn budget<'a>(req: &Request) -> Option<&'a mut BodyBudget> {
    // SAFETY: the caller keeps the result unique and within the request's
    // life (this function's contract).
    unsafe { request_ctx::pending_write(req) }.map(|p| &mut p.budget)
}

fn buf_size(b: &ngx_buf_t) -> i64 {
    // SAFETY: pointers of a live buffer; in-memory data wins over file data,
    // as in ngx_buf_size().
    unsafe {
        if b.temporary() != 0 || b.memory() != 0 || b.mmap() != 0 {
            b.last.offset_from(b.pos) as i64
        } else {
            b.file_last - b.file_pos
        }
    }
}

/// The request body filter: nginx calls it on the event loop with a live
/// request and the chain of body buffers just read (possibly null).
unsafe extern "C" fn filter(r: *mut ngx_http_request_t, input: *mut ngx_chain_t) -> ngx_int_t {
    ffi_guard("request body filter", NGX_ERROR as ngx_int_t, || {
        // SAFETY: `install` wrote NEXT at configuration time, before any
        // request; request time only reads it, on the event loop.
        let next = unsafe { NEXT }.expect("the request body filter chain has a tail");
        // SAFETY: nginx calls body filters with a live request, on the event
        // loop, and holds no reference into it meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        let max = Module::location_conf(req)
            .filter(|c| c.enabled)
            .map_or(0, |c| c.max_body);
        // Only API locations have a limit to enforce.
        if max == 0 {
            // SAFETY: the next filter of the chain, with the live request and
            // the chain nginx handed us, untouched.
            return unsafe { next(ptr::from_mut(req.as_mut()), input) };
        }
        // SAFETY: the budget lives in the request's pool; only this filter
        // touches it while the body is read, and only during this call.
        let Some(budget) = (unsafe { budget(req) }) else {
            // SAFETY: the next filter, with the live request and the chain
            // nginx handed us, untouched.
            return unsafe { next(ptr::from_mut(req.as_mut()), input) };
        };
        let mut cl = input;
        let mut last = false;
        while !cl.is_null() {
            // SAFETY: `cl` is a non-null link of the chain nginx passed in;
            // each link has a live buffer, used by no one else during the call.
            let b = unsafe { &mut *(*cl).buf };
            budget.received += buf_size(b);
            last |= b.last_buf() != 0;
            // SAFETY: `cl` is a live link (see above).
            cl = unsafe { (*cl).next };
        }
        budget.too_large |= budget.received > max;
        if !budget.too_large {
            // SAFETY: the next filter, with the live request and the chain
            // nginx handed us, untouched.
            return unsafe { next(ptr::from_mut(req.as_mut()), input) };
        }
        // Consume the buffers so their memory is reused, and end the body with
        // an empty last buffer so reading completes normally.
        let mut cl = input;
        while !cl.is_null() {
            // SAFETY: `cl` is a non-null link of the chain nginx passed in,
            // with a live buffer used by no one else during the call.
            let b = unsafe { &mut *(*cl).buf };
            b.pos = b.last;
            b.file_pos = b.file_last;
            // SAFETY: `cl` is a live link.
            cl = unsafe { (*cl).next };
        }
        if !last {
            // Still call down with no data: the save filter flushes its full
            // buffer to the temp file on these calls, and nginx fails the
            // request if buffers stay busy.
            // SAFETY: the next filter, with the live request; a null chain
            // is what nginx itself passes to flush.
            return unsafe { next(ptr::from_mut(req.as_mut()), ptr::null_mut()) };
        }
        // SAFETY: the request's pool is live as long as the request.
        let b = unsafe { ngx_pcalloc(req.as_ref().pool, std::mem::size_of::<ngx_buf_t>()) }.cast::<ngx_buf_t>();
        if b.is_null() {
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: `b` is a non-null, aligned, zeroed ngx_buf_t (an empty
        // buffer), owned by this filter until it is passed down.
        unsafe { (*b).set_last_buf(1) };
        let mut end = ngx_chain_t {
            buf: b,
            next: ptr::null_mut(),
        };
        // SAFETY: the next filter, with the live request and a chain that
        // outlives the call (filters keep the buffer, which is in the pool,
        // not the link).
        unsafe { next(ptr::from_mut(req.as_mut()), &mut end) }
    })
}
