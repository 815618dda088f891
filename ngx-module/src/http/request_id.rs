//! `$dynamic_request_id`: ingress-nginx's `$req_id` without a `map` and
//! without OpenSSL's `RAND_bytes` per request. The client's `X-Request-ID`
//! when it sends a non-empty one, else 32 hex characters from this worker's
//! ChaCha20 stream ([`lua_compat::request_id`]). The value is cached for the
//! request like any variable's, so the header sent upstream and the access
//! log agree.
//!
//! `dynamic_balancer_request_id on` goes one step further: the request itself
//! carries the id as its `X-Request-ID` header ([`ensure_header`]), so the
//! proxy sends it upstream among the client's headers, and the location
//! needs no `proxy_set_header X-Request-ID` (a script run twice per request,
//! plus a handler call and a header lookup).

use std::cell::RefCell;

use lua_compat::request_id::{self, Generator, ID_LEN};
use ngx::ffi::{ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t, ngx_str_t, ngx_uint_t, NGX_OK};
use ngx::http::{HttpModuleLocationConf, Request};

use crate::conf::read_variable;
use crate::nginx::module::Module;
use crate::nginx::request;
use crate::nginx::variables::{self, Read};

/// Under `dynamic_balancer_request_id on`, makes sure the main request
/// carries `X-Request-ID`: a client's non-empty one stays as it is (and as
/// many as it sent); otherwise `$dynamic_request_id`'s value (computed now,
/// or the one already cached, so the log and the header agree) fills the
/// client's empty header or is added as a new one. Runs in the preaccess
/// phase, after the rewrites and before `auth_request` and the proxy; an
/// internal redirect runs it again and finds the header there.
pub fn ensure_header(req: &mut Request) {
    if Module::location_conf(req).is_none_or(|l| l.request_id_header != Some(true)) {
        return;
    }
    let r = req.as_ref();
    // Subrequests share the main request's headers.
    if !std::ptr::eq(r.main, r) {
        return;
    }
    let first = request::first_header_elt(req, request_id::HEADER);
    // SAFETY: the header is the live request's, in its pool.
    if first.is_some_and(|h| unsafe { h.as_ref() }.value.len > 0) {
        return;
    }
    let Some(id) = read_variable(req, Read::RequestId) else {
        return;
    };
    // The variable's cached value, in the request's pool.
    let value = ngx_str_t {
        len: id.len(),
        data: id.as_ptr().cast_mut(),
    };
    match first {
        // SAFETY: the client's empty header, in the live request's pool,
        // which nothing else references during this call.
        Some(mut h) => unsafe { h.as_mut().value = value },
        None => {
            // Without pool memory for the header, the request goes on
            // without it, as with a failed `proxy_set_header` script.
            // SAFETY: `value` is in the request's pool.
            let _ = unsafe {
                request::push_header_in(
                    req,
                    request_id::HEADER_NAME,
                    request_id::HEADER,
                    request_id::HEADER_HASH as ngx_uint_t,
                    value,
                )
            };
        }
    }
}

thread_local! {
    /// This process's generator. Requests run on the event-loop thread only.
    static GENERATOR: RefCell<Option<Generator>> = const { RefCell::new(None) };
}

/// Seeds this process's generator from the operating system. nginx calls
/// `init_process` after `fork()`, so every worker gets its own stream; a
/// generator inherited from the master would give two workers the same ids.
pub fn seed() -> Result<(), String> {
    let generator = Generator::from_os()?;
    GENERATOR.with(|g| *g.borrow_mut() = Some(generator));
    Ok(())
}

/// A fresh id, seeding first if [`seed`] failed or never ran (a request is
/// always served after the fork, so a late seed is still per process).
fn fresh() -> Option<[u8; ID_LEN]> {
    GENERATOR.with(|g| {
        let mut g = g.borrow_mut();
        if g.is_none() {
            *g = Generator::from_os().ok();
        }
        g.as_mut().map(Generator::next_id)
    })
}

/// The get handler of `$dynamic_request_id`. nginx calls it with a live
/// request and the variable's value slot, at most once per request (the
/// value is cacheable).
pub unsafe extern "C" fn variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    let body = |req: &mut Request, v: &mut ngx_http_variable_value_t| {
        if let Some(id) = request_id::client_id(request::header_in(req, request_id::HEADER)) {
            // SAFETY: header values live in the request's pool, which
            // outlives every read of this variable's cached value.
            unsafe { variables::fill_borrowed(v, id) };
            return NGX_OK as ngx_int_t;
        }
        match fresh() {
            Some(id) => variables::fill(req, v, &id),
            None => {
                // No random source at all: the variable is not found, and
                // `proxy_set_header` leaves the header out.
                variables::fill_not_found(v);
                NGX_OK as ngx_int_t
            }
        }
    };
    // SAFETY: nginx calls a get handler with a live request and its value
    // slot, which nothing else borrows during the call.
    unsafe { variables::get_handler("$dynamic_request_id", r, v, body) }
}
