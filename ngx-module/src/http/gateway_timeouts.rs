//! HTTPRoute `timeouts` at request time.
//!
//! nginx's proxy timeouts are per location (`proxy_connect_timeout`,
//! `proxy_send_timeout`, `proxy_read_timeout`, `proxy_next_upstream_timeout`)
//! and the upstream reads them through `r->upstream->conf` when it arms
//! each timer. A rule with timeouts gives its request, when the balancer
//! is asked for a peer (before the first connection), a copy of that
//! configuration in the request's pool with shorter timers:
//!
//! - `backendRequest` bounds one attempt: connecting, each send and each
//!   wait for the backend (a backend that says nothing for that long is
//!   given up, 504, or retried where `proxy_next_upstream` says so);
//! - `request` bounds the whole exchange from the request's arrival: each
//!   of those timers is cut to the time left, and so is the time retries
//!   may take (`next_upstream_timeout`). The response body, once headers
//!   arrived, is bounded per read, not as a whole: nginx has no timer on a
//!   whole response, and a body that keeps streaming is not cut.
//!
//! Nothing is reloaded: the timeouts come with the route table.

use std::mem::size_of;
use std::ptr;

use lua_compat::routes::{cut_timer, Timeouts};
use ngx::ffi::{ngx_cached_time, ngx_http_upstream_conf_t, ngx_http_upstream_t, ngx_msec_t, ngx_palloc};
use ngx::http::Request;

/// Gives `u` the request's route timeouts, if its rule has any. Returns
/// false when the pool could not hold the copy (the location's timeouts
/// then apply).
pub fn apply(req: &Request, u: &mut ngx_http_upstream_t) -> bool {
    let Some(m) = super::gateway::matched(req) else {
        return true;
    };
    let t = m.rule().rule.timeouts;
    if t.is_empty() || u.conf.is_null() {
        return true;
    }
    let r = req.as_ref();
    // SAFETY: the request's pool is live; the copy lives as long as the
    // request, which is as long as `u` reads it.
    let copy = unsafe { ngx_palloc(r.pool, size_of::<ngx_http_upstream_conf_t>()) }.cast::<ngx_http_upstream_conf_t>();
    if copy.is_null() {
        return false;
    }
    // SAFETY: `u.conf` is the location's upstream conf (configuration
    // memory, valid and not written at request time); `copy` is a fresh,
    // aligned allocation of its size. The struct is plain C data: its
    // pointers keep pointing at the same configuration.
    unsafe { ptr::copy_nonoverlapping(u.conf, copy, 1) };
    // SAFETY: `copy` was just initialised and nothing else refers to it.
    let conf = unsafe { &mut *copy };
    shorten(conf, t, elapsed_ms(r.start_sec, r.start_msec as u64));
    u.conf = copy;
    true
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

/// The timers of `conf` cut to `t`, `elapsed` ms after the request came
/// (the arithmetic is `lua_compat::routes::Timeouts::timers`).
fn shorten(conf: &mut ngx_http_upstream_conf_t, t: Timeouts, elapsed: u64) {
    let (attempt, total) = t.timers(elapsed);
    let cut = |v: &mut ngx_msec_t, limit: Option<u64>| {
        if let Some(limit) = limit {
            *v = cut_timer(*v as u64, limit) as ngx_msec_t;
        }
    };
    cut(&mut conf.connect_timeout, attempt);
    cut(&mut conf.send_timeout, attempt);
    cut(&mut conf.read_timeout, attempt);
    cut(&mut conf.next_upstream_timeout, total);
}
