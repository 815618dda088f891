//! HTTPRoute `timeouts` and `retry` at request time.
//!
//! nginx's proxy timeouts and retries are per location
//! (`proxy_connect_timeout`, `proxy_send_timeout`, `proxy_read_timeout`,
//! `proxy_next_upstream`, `proxy_next_upstream_tries`,
//! `proxy_next_upstream_timeout`) and the upstream reads them through
//! `r->upstream->conf` when it arms each timer and judges each answer. A
//! rule with timeouts or retries gives its request, when the balancer is
//! asked for a peer (before the first connection), a copy of that
//! configuration in the request's pool with its own values (the main
//! request only: a subrequest keeps its location's):
//!
//! - `backendRequest` bounds one attempt: connecting, each send and each
//!   wait for the backend (a backend that says nothing for that long is
//!   given up, 504, or retried where `proxy_next_upstream` says so);
//! - `request` bounds the whole exchange from the request's arrival: each
//!   of those timers is the time left, cut again before every attempt
//!   ([`rearm`]), and so is the time retries may take
//!   (`next_upstream_timeout`): a retry that would outlive the deadline
//!   ends it with 504. The route's values replace the location's, longer
//!   ones included. The response body, once headers
//!   arrived, is bounded per read, not as a whole: nginx has no timer on a
//!   whole response, and a body that keeps streaming is not cut;
//! - `retry` tries the request again, up to `attempts` more times, on a
//!   connection error or timeout, or on a response with one of its codes
//!   (`proxy_next_upstream error timeout http_5xx ...`); nginx retries at
//!   once (no backoff), on another endpoint while an untried one remains,
//!   and, as always, a request whose body was already sent only if it is
//!   idempotent. `attempts: 0` never retries.
//!
//! Nothing is reloaded: these come with the route table.

use std::mem::size_of;
use std::ptr;

use lua_compat::routes::cut_timer;
use ngx::ffi::{
    ngx_cached_time, ngx_http_upstream_conf_t, ngx_http_upstream_t, ngx_msec_t, ngx_palloc, ngx_uint_t,
    NGX_HTTP_UPSTREAM_FT_ERROR, NGX_HTTP_UPSTREAM_FT_HTTP_403, NGX_HTTP_UPSTREAM_FT_HTTP_404,
    NGX_HTTP_UPSTREAM_FT_HTTP_429, NGX_HTTP_UPSTREAM_FT_HTTP_500, NGX_HTTP_UPSTREAM_FT_HTTP_502,
    NGX_HTTP_UPSTREAM_FT_HTTP_503, NGX_HTTP_UPSTREAM_FT_HTTP_504, NGX_HTTP_UPSTREAM_FT_TIMEOUT,
};
use ngx::http::Request;

/// Gives `u` the request's route timeouts and retries, if its rule has
/// any; call it after the peer's `tries` are set. Returns the request's
/// own copy of the conf (null when none was needed), or `Err` when the
/// pool could not hold it. Subrequests (`auth-url`, mirrors) keep their
/// location's settings: the route's are the main request's.
pub fn apply(req: &Request, u: &mut ngx_http_upstream_t) -> Result<*mut ngx_http_upstream_conf_t, ()> {
    let r = req.as_ref();
    if !ptr::eq(r.main, r) {
        return Ok(ptr::null_mut());
    }
    let Some(m) = super::gateway_matched::matched(req) else {
        return Ok(ptr::null_mut());
    };
    let rule = &m.rule().rule;
    let t = rule.timeouts;
    if (t.is_empty() && rule.retry.is_none()) || u.conf.is_null() {
        return Ok(ptr::null_mut());
    }
    // SAFETY: the request's pool is live; the copy lives as long as the
    // request, which is as long as `u` reads it.
    let copy = unsafe { ngx_palloc(r.pool, size_of::<ngx_http_upstream_conf_t>()) }.cast::<ngx_http_upstream_conf_t>();
    if copy.is_null() {
        return Err(());
    }
    // SAFETY: `u.conf` is the location's upstream conf (configuration
    // memory, valid and not written at request time); `copy` is a fresh,
    // aligned allocation of its size. The struct is plain C data: its
    // pointers keep pointing at the same configuration.
    unsafe { ptr::copy_nonoverlapping(u.conf, copy, 1) };
    // SAFETY: `copy` was just initialised and nothing else refers to it.
    let conf = unsafe { &mut *copy };
    // The route's timeouts replace the location's (longer ones too).
    let (attempt, total) = t.timers(elapsed_ms(r.start_sec, r.start_msec as u64));
    if let Some(a) = attempt {
        let a = a as ngx_msec_t;
        conf.connect_timeout = a;
        conf.send_timeout = a;
        conf.read_timeout = a;
    }
    if let Some(total) = total {
        // nginx counts it from the first attempt, which is about to start.
        conf.next_upstream_timeout = total as ngx_msec_t;
    }
    if let Some(retry) = &rule.retry {
        let tries = retry.attempts as ngx_uint_t + 1;
        conf.next_upstream = next_upstream(&retry.codes);
        conf.next_upstream_tries = tries;
        // nginx stops when the peer's own count runs out; the balancer set
        // it to the number of endpoints.
        u.peer.tries = tries;
    }
    u.conf = copy;
    Ok(copy)
}

/// Milliseconds since the request arrived (nginx's cached clock).
fn elapsed_ms(start_sec: i64, start_msec: u64) -> u64 {
    // SAFETY: nginx keeps `ngx_cached_time` pointing at a valid slot for
    // the life of the process; workers update it on their own thread.
    let now = unsafe { &*ngx_cached_time };
    let now_ms = now.sec.saturating_mul(1000).saturating_add(now.msec as i64);
    let start_ms = start_sec.saturating_mul(1000).saturating_add(start_msec as i64);
    now_ms.saturating_sub(start_ms).max(0) as u64
}

/// Before each attempt (the balancer's `peer.get`): a rule's `request`
/// timeout cuts the attempt's timers to the time left now, so that a
/// retry never outlives the request's deadline and running out answers
/// 504, not the last attempt's error. (`next_upstream_timeout` is left as
/// `apply` set it: nginx counts it from the first attempt itself.) Writes
/// only `own_conf`, the request's own copy, and only while the upstream
/// still uses it.
pub fn rearm(req: &Request, own_conf: *mut ngx_http_upstream_conf_t) {
    let r = req.as_ref();
    // SAFETY: `r->upstream` is the live upstream of this request when not
    // null.
    if own_conf.is_null() || r.upstream.is_null() || !ptr::eq(unsafe { (*r.upstream).conf }, own_conf) {
        return;
    }
    let Some(m) = super::gateway_matched::matched(req) else {
        return;
    };
    let t = m.rule().rule.timeouts;
    if t.request.is_none() {
        return;
    }
    let (_, left) = t.timers(elapsed_ms(r.start_sec, r.start_msec as u64));
    let Some(left) = left else { return };
    // SAFETY: `own_conf` is the request's own copy in its pool (checked
    // above to be the one its upstream uses); nothing else refers to it
    // while peer.get runs.
    let conf = unsafe { &mut *own_conf };
    for v in [
        &mut conf.connect_timeout,
        &mut conf.send_timeout,
        &mut conf.read_timeout,
    ] {
        *v = cut_timer(*v as u64, left) as ngx_msec_t;
    }
}

/// `proxy_next_upstream`'s mask for a rule's retry codes (the validator
/// lets through only codes nginx has a flag for).
fn next_upstream(codes: &[u16]) -> ngx_uint_t {
    let mut mask = NGX_HTTP_UPSTREAM_FT_ERROR | NGX_HTTP_UPSTREAM_FT_TIMEOUT;
    for c in codes {
        mask |= match c {
            500 => NGX_HTTP_UPSTREAM_FT_HTTP_500,
            502 => NGX_HTTP_UPSTREAM_FT_HTTP_502,
            503 => NGX_HTTP_UPSTREAM_FT_HTTP_503,
            504 => NGX_HTTP_UPSTREAM_FT_HTTP_504,
            403 => NGX_HTTP_UPSTREAM_FT_HTTP_403,
            404 => NGX_HTTP_UPSTREAM_FT_HTTP_404,
            429 => NGX_HTTP_UPSTREAM_FT_HTTP_429,
            _ => 0,
        };
    }
    mask as ngx_uint_t
}
