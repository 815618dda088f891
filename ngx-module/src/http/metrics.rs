//! Request metrics: the log-phase handler that counts every request of a
//! `dynamic_balancer_metrics` location in its series, and the Prometheus
//! text of `GET /configuration/metrics`.
//!
//! A request's cost is a location-conf lookup, the cached cell for its
//! method and status, and the adds of `Counters::record`; the slab mutex is
//! taken only the first time a worker meets a series/method/status (see
//! [`crate::shm::metrics_zone`]).

use std::ptr;
use std::rc::Rc;

use lua_compat::metrics::exposition::{self, Connections, EndpointTableStats, Entry, ZoneStats};
use lua_compat::metrics::labels::series_text;
use lua_compat::metrics::{method_index, status_index, Counters, Sample, StatusLabel};
use ngx::ffi::{ngx_http_request_t, ngx_http_upstream_state_t, ngx_int_t, NGX_OK};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, Request};

use crate::conf::{own_variable, LocMetrics, MainConf, MAX_CACHED_CELLS};
use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;
use crate::nginx::variables::{self, Own};
use crate::shm::metrics_zone;

/// A location's canary cells kept per worker, at most; beyond, a canary
/// request finds its cell under the mutex each time (still counted).
const MAX_CANARY_CELLS: usize = 256;
/// After the zone was full, the next try, in ms.
const FULL_RETRY_MS: u64 = 1000;

/// The LOG phase handler: nginx calls it once per request, on the event
/// loop, with the live main request, after the response was sent.
pub unsafe extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    ffi_guard("metrics log handler", NGX_OK as ngx_int_t, || {
        // SAFETY: nginx runs phase handlers with a live request, on the
        // event loop, and holds no reference into it meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        count(req);
        NGX_OK as ngx_int_t
    })
}

/// Remembers the location's metrics for the rest of the request. The
/// PREACCESS handler calls it, so that a request that `error_page` sends to
/// another location (custom-http-errors, a 503 without endpoints) is still
/// counted under the location it came for, as ingress-nginx's `set`
/// variables make it.
pub fn remember(req: &Request) {
    // Subrequests (auth_request, mirror) share the main request's
    // variables: they must not overwrite its location.
    if !is_main(req) {
        return;
    }
    let Some(lm) = Module::location_conf(req).and_then(|l| l.metrics.as_ref()) else {
        return;
    };
    if let Some(index) = own_variable(req, Own::MetricsLocation) {
        variables::set_opaque(req, index, Rc::as_ptr(lm).cast());
    }
}

/// The metrics of the request's location, or of the location it came from.
fn location_metrics(req: &Request) -> Option<&LocMetrics> {
    if let Some(lm) = Module::location_conf(req).and_then(|l| l.metrics.as_deref()) {
        return Some(lm);
    }
    let p = variables::get_opaque(req, own_variable(req, Own::MetricsLocation)?);
    // SAFETY: only `remember` stores a non-null value there: a LocMetrics
    // of this request's configuration, which outlives the request.
    unsafe { p.cast::<LocMetrics>().as_ref() }
}

/// Whether `req` is a main request, not a subrequest.
fn is_main(req: &Request) -> bool {
    let r = req.as_ref();
    ptr::eq(r.main, r)
}

fn count(req: &Request) {
    // A subrequest (with `log_subrequest on`) is part of its main request,
    // which is counted once.
    if !is_main(req) {
        return;
    }
    let Some(lm) = location_metrics(req) else {
        return;
    };
    if !metrics_zone::registered() {
        if let Some(zone) = Module::main_conf(req).and_then(MainConf::metrics_zone) {
            zone.uncounted();
        }
        return;
    }
    let r = req.as_ref();
    let method = method_index(r.method);
    // What `$status` shows.
    let status = if r.err_status != 0 {
        r.err_status
    } else {
        r.headers_out.status
    };
    let status = status_index(status);
    // The peer hook sets it when a canary takes the request; like
    // ingress-nginx's label, it survives an `error_page` redirect.
    let canary = own_variable(req, Own::AlternativeUpstream)
        .and_then(|i| variables::own_value(req, i))
        .filter(|v| !v.is_empty());
    match cell(req, lm, canary, method, status) {
        Some(counters) => counters.record(&sample(r)),
        None => {
            if let Some(zone) = Module::main_conf(req).and_then(MainConf::metrics_zone) {
                zone.uncounted();
            }
        }
    }
}

/// The worker's cell for the request's series, from the location's cache,
/// else found (or made) in the zone and cached.
fn cell(
    req: &Request,
    lm: &LocMetrics,
    canary: Option<&[u8]>,
    method: usize,
    status: u16,
) -> Option<&'static Counters> {
    let index = (method as u32) << 16 | u32::from(status);
    let mut cache = lm.cache.borrow_mut();
    let cached = match canary {
        None => cache.cells.iter().find(|(i, _)| *i == index).map(|(_, c)| *c),
        Some(name) => cache
            .canaries
            .iter()
            .find(|(n, i, _)| **n == *name && *i == index)
            .map(|(_, _, c)| *c),
    };
    if cached.is_some() {
        return cached;
    }
    // SAFETY: a plain read of nginx's cached clock, on the event loop.
    let now = unsafe { ngx::ffi::ngx_current_msec } as u64;
    if cache.retry_at > now {
        return None;
    }
    let mcf = Module::main_conf(req)?;
    let zone = mcf.metrics_zone()?;
    let epoch = mcf.metrics_ctx.epoch;
    let series = match canary {
        None => match cache.primary {
            Some(s) => Some(s),
            None => {
                let s = zone.series(&lm.primary, lm.loc_hash, epoch);
                cache.primary = s;
                s
            }
        },
        Some(name) => zone.series(
            series_text(&String::from_utf8_lossy(name), &lm.location).as_bytes(),
            lm.loc_hash,
            epoch,
        ),
    };
    // SAFETY: a plain read of the worker's number, set before init_process.
    let worker = unsafe { ngx::ffi::ngx_worker } as u32;
    // SAFETY: `series` came from `zone.series` in this worker, which is
    // registered (checked by `count`), so it stays allocated.
    let found = series.and_then(|s| unsafe { zone.cell(s, worker, method as u16, status) });
    match (found, canary) {
        (None, _) => cache.retry_at = now + FULL_RETRY_MS,
        (Some(c), None) if cache.cells.len() < MAX_CACHED_CELLS => cache.cells.push((index, c)),
        (Some(c), Some(name)) if cache.canaries.len() < MAX_CANARY_CELLS => {
            cache.canaries.push((name.into(), index, c));
        }
        (Some(_), _) => {}
    }
    found
}

/// What the request measured, as nginx's log variables show it.
fn sample(r: &ngx_http_request_t) -> Sample {
    // SAFETY: nginx's cached time is a live pointer updated on this thread.
    let now = unsafe { ptr::read_volatile(ptr::addr_of!(ngx::ffi::ngx_cached_time)).read() };
    let ms = (now.sec - r.start_sec) * 1000 + (now.msec as i64 - r.start_msec as i64);
    // SAFETY: a live request's connection outlives it.
    let sent = unsafe { (*r.connection).sent };
    let up = upstream_times(r);
    Sample {
        request_ms: ms.max(0) as u64,
        upstream_ms: up.response_ms,
        connect_ms: up.connect_ms,
        header_ms: up.header_ms,
        request_length: r.request_length.max(0) as u64,
        bytes_sent: sent.max(0) as u64,
        connect_errors: up.connect_errors,
    }
}

/// The upstream times of a request, summed over its attempts.
#[derive(Default)]
struct UpstreamTimes {
    /// `$upstream_response_time` of the attempts that got a status.
    response_ms: Option<u64>,
    /// `$upstream_connect_time` of the attempts that connected.
    connect_ms: Option<u64>,
    /// `$upstream_header_time` of the attempts that got a header.
    header_ms: Option<u64>,
    /// Attempts whose connection to an endpoint failed or timed out.
    connect_errors: u64,
}

/// What `$upstream_response_time`, `$upstream_connect_time` and
/// `$upstream_header_time` list, each summed, and the failed connections.
fn upstream_times(r: &ngx_http_request_t) -> UpstreamTimes {
    let mut t = UpstreamTimes::default();
    // SAFETY: `upstream_states` is null or an array of upstream states in
    // the request's pool, live for the request.
    let Some(states) = (unsafe { r.upstream_states.as_ref() }) else {
        return t;
    };
    if states.elts.is_null() {
        return t;
    }
    // SAFETY: an ngx_array_t of `nelts` ngx_http_upstream_state_t at `elts`.
    let states = unsafe { std::slice::from_raw_parts(states.elts.cast::<ngx_http_upstream_state_t>(), states.nelts) };
    let unset = ngx::ffi::ngx_msec_t::MAX;
    let add = |sum: &mut Option<u64>, ms: ngx::ffi::ngx_msec_t| {
        if ms != unset {
            *sum = Some(sum.unwrap_or(0) + ms as u64);
        }
    };
    for s in states {
        if s.status == 0 {
            continue;
        }
        add(&mut t.response_ms, s.response_time);
        add(&mut t.connect_ms, s.connect_time);
        add(&mut t.header_ms, s.header_time);
        if s.connect_time == unset && !s.peer.is_null() {
            t.connect_errors += 1;
        }
    }
    t
}

/// What a scrape of `GET /configuration/metrics` copies out of the zone
/// (under its lock, on the event loop): formatting it, several KB of text
/// per series, happens on the worker's offload thread ([`render`]), so a
/// large scrape does not hold up the worker's traffic.
pub struct Scrape {
    status: StatusLabel,
    collected: Vec<metrics_zone::Collected>,
    connections: Option<Connections>,
    stats: Option<ZoneStats>,
    table: Option<EndpointTableStats>,
}

/// Copies the request's metrics out of the zone, to be written with the
/// `status` label as `status` asks.
pub fn scrape(req: &Request, status: StatusLabel) -> Scrape {
    let zone = Module::main_conf(req).and_then(MainConf::metrics_zone);
    let table = Module::main_conf(req).and_then(MainConf::zone).map(|z| {
        let (h, t) = (z.header(), z.header().table());
        EndpointTableStats {
            tracked: t.live(),
            untracked: h.untracked.load(std::sync::atomic::Ordering::Relaxed),
            slots: t.capacity(),
            bytes: t.bytes(),
            evicted: t.evicted(),
        }
    });
    Scrape {
        status,
        table,
        collected: zone.as_ref().map(|z| z.collect()).unwrap_or_default(),
        connections: connections(),
        stats: zone.as_ref().map(|z| {
            let (series, uncounted, size, used) = z.stats();
            ZoneStats {
                series,
                uncounted,
                size,
                used,
                spans: z.otel_counters().snapshot(),
            }
        }),
    }
}

/// The body of `GET /configuration/metrics`, in Prometheus' text format.
pub fn render(scrape: Box<Scrape>) -> Vec<u8> {
    let entries: Vec<Entry<'_>> = scrape
        .collected
        .iter()
        .map(|c| Entry {
            labels: &c.labels,
            method: c.method,
            status: c.status,
            counters: c.counters,
        })
        .collect();
    exposition::render(
        &entries,
        scrape.status,
        scrape.connections.as_ref(),
        scrape.stats.as_ref(),
        scrape.table.as_ref(),
    )
    .into_bytes()
}

/// nginx's connection counters (`stub_status`), when compiled in.
fn connections() -> Option<Connections> {
    // SAFETY: the stub_status counters are null or point into the shared
    // memory nginx's event module allocated at startup; reads are racy
    // snapshots of atomics, as stub_status itself reads them.
    unsafe {
        let read = |p: *mut ngx::ffi::ngx_atomic_t| p.as_ref().map(|_| ptr::read_volatile(p));
        Some(Connections {
            active: read(ngx::ffi::ngx_stat_active)?,
            reading: read(ngx::ffi::ngx_stat_reading)?,
            writing: read(ngx::ffi::ngx_stat_writing)?,
            waiting: read(ngx::ffi::ngx_stat_waiting)?,
            accepted: read(ngx::ffi::ngx_stat_accepted)?,
            handled: read(ngx::ffi::ngx_stat_handled)?,
            requests: read(ngx::ffi::ngx_stat_requests)?,
        })
    }
}
