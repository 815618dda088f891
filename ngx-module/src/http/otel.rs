//! OpenTelemetry tracing at request time, as ingress-nginx's
//! otel_ngx_module traces: a server span per request of a
//! `dynamic_balancer_otel on` block, started in the REWRITE phase (the
//! client's W3C `traceparent` continued when trusted, the sampler's
//! decision taken) and finished in the LOG phase, with the HTTP attributes
//! otel_ngx_module sets and the upstream's address, status and timings.
//!
//! The context is propagated in the request's own headers, as
//! otel_ngx_module's `opentelemetry_propagate` does with
//! `proxy_set_header`: the module replaces the client's `traceparent`
//! with this span's (or adds it) and drops a `tracestate` it does not
//! continue, so the proxy and grpc modules send both upstream with no
//! per-location header script. otel_ngx_module's variables are there for
//! logs and snippets: `$opentelemetry_trace_id`, `$opentelemetry_span_id`,
//! `$opentelemetry_context_traceparent` and `…_tracestate`. A request that is not sampled is
//! still given a span id and passes the trace on with its `sampled` flag
//! clear, so the services behind make the same choice.
//!
//! Internal requests (subrequests, and requests an internal redirect made
//! before tracing started) get no span: they belong to a traced request.
//! The state is kept in an internal variable slot, which, unlike the
//! module's ctx, survives internal redirects.

use std::ptr::{self, NonNull};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use lua_compat::otel::draft::{SpanDraft, Text, UpstreamTimes, MAX_TEXT};
use lua_compat::otel::sampler::Sampler;
use lua_compat::otel::trace_context::{self, SpanId, TraceParent, FLAG_SAMPLED, TRACEPARENT_LEN};
use lua_compat::routes::header::CompiledHeader;
use ngx::ffi::{
    ngx_http_complex_value, ngx_http_core_loc_conf_t, ngx_http_core_srv_conf_t, ngx_http_request_t,
    ngx_http_upstream_state_t, ngx_http_variable_value_t, ngx_int_t, ngx_str_t, NGX_DECLINED, NGX_OK,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, HttpModuleServerConf, NgxHttpCoreModule, Request};

use crate::conf::{own_variable, read_variable};
use crate::nginx::guard::ffi_guard;
use crate::nginx::headers::{self, Side};
use crate::nginx::module::Module;
use crate::nginx::request::{self, pool_box, str_bytes};
use crate::nginx::variables::{self, Own, Read};
use crate::otel::queue;

/// The OpenTelemetry SDK's default sampler, when
/// `dynamic_balancer_otel_sampler` is not set.
const DEFAULT_SAMPLER: Sampler = Sampler::DEFAULT;

/// A request's trace, in its pool.
struct Trace {
    /// This request's span context: its trace, its span, its flags.
    context: TraceParent,
    /// The trusted caller's span.
    parent: Option<SpanId>,
    /// The caller's `tracestate`, when its `traceparent` was trusted and
    /// both were valid: the header's bytes, in the request's pool.
    tracestate: Option<(*const u8, usize)>,
    start_unix_nano: u64,
    /// `$opentelemetry_context_traceparent`.
    traceparent: [u8; TRACEPARENT_LEN],
}

fn now_unix_nano() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn is_main(req: &Request) -> bool {
    let r = req.as_ref();
    ptr::eq(r.main, r)
}

/// The request's trace, if tracing started for it.
fn trace(req: &Request) -> Option<&Trace> {
    let p = variables::get_opaque(req, own_variable(req, Own::Trace)?);
    // SAFETY: only `start` stores a non-null value in that slot: a Trace in
    // this request's pool, which outlives the request's borrow.
    unsafe { p.cast::<Trace>().as_ref() }
}

/// The REWRITE phase handler: starts the request's trace. nginx calls it
/// on the event loop with a live request.
pub unsafe extern "C" fn rewrite_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    ffi_guard("otel rewrite handler", NGX_DECLINED as ngx_int_t, || {
        // SAFETY: nginx runs phase handlers with a live request, on the
        // event loop, and holds no reference into it meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        if let Some(trace) = start(req) {
            propagate(req, trace);
        }
        NGX_DECLINED as ngx_int_t
    })
}

/// Starts the request's trace, unless it has one or is not traced.
fn start(req: &Request) -> Option<NonNull<Trace>> {
    let lcf = Module::location_conf(req)?;
    if lcf.otel != Some(true) || !is_main(req) || req.as_ref().internal() != 0 {
        return None;
    }
    let index = own_variable(req, Own::Trace)?;
    if !variables::get_opaque(req, index).is_null() {
        return None;
    }
    let sampler = Module::main_conf(req)
        .and_then(|m| m.otel_sampler)
        .unwrap_or(DEFAULT_SAMPLER);
    let trusted = lcf.otel_trust != Some(false);
    let parent = if trusted {
        request::header_in(req, b"traceparent").and_then(TraceParent::parse)
    } else {
        None
    };
    let (trace_id, span_id) = queue::with_ids(|g| (parent.map_or_else(|| g.trace_id(), |p| p.trace_id), g.span_id()))?;
    let sampled = sampler.should_sample(&trace_id, parent.as_ref());
    let tracestate = parent
        // Repeated headers are one list (W3C: combined as HTTP combines
        // them), checked and passed on whole.
        .and_then(|_| request::header_in_joined(req, b"tracestate"))
        .filter(|v| !v.is_empty() && trace_context::tracestate_is_valid(v))
        .map(|v| (v.as_ptr(), v.len()));
    let context = TraceParent {
        trace_id,
        span_id,
        flags: if sampled { FLAG_SAMPLED } else { 0 },
    };
    let trace = Trace {
        context,
        parent: parent.map(|p| p.span_id),
        tracestate,
        start_unix_nano: now_unix_nano(),
        traceparent: context.format(),
    };
    // SAFETY: a live request's pool is live.
    let t = unsafe { pool_box(req.as_ref().pool, trace) }?;
    variables::set_opaque(req, index, t.as_ptr().cast());
    Some(t)
}

/// The request's `traceparent` and `tracestate` header names.
struct PropagationHeaders {
    traceparent: CompiledHeader,
    tracestate: CompiledHeader,
}

static HEADERS: OnceLock<PropagationHeaders> = OnceLock::new();

/// Makes the request carry this span's context upstream.
fn propagate(req: &mut Request, trace: NonNull<Trace>) {
    let h = HEADERS.get_or_init(|| PropagationHeaders {
        traceparent: CompiledHeader::new("traceparent", ""),
        tracestate: CompiledHeader::new("tracestate", ""),
    });
    // SAFETY: the trace lives in the request's pool, as long as the
    // request's headers; nothing else borrows it mutably.
    let t = unsafe { trace.as_ref() };
    // SAFETY: the header name is static; the value is in the request's
    // pool (the trace), both outliving the request's headers.
    let _ = unsafe { headers::set_with(req, Side::Request, &h.traceparent, &t.traceparent) };
    match t.tracestate {
        // The checked list, as one header: a second header the client sent
        // is never passed on unchecked.
        Some((p, n)) => {
            // SAFETY: as above; the list is the client's header or its
            // joined copy, both in the request's pool.
            let _ = unsafe { headers::set_with(req, Side::Request, &h.tracestate, std::slice::from_raw_parts(p, n)) };
        }
        None => headers::remove(req, Side::Request, "tracestate"),
    }
}

/// The LOG phase handler: finishes a sampled request's span and hands it
/// to the worker's exporter. nginx calls it on the event loop with the
/// live main request after the response was sent.
pub unsafe extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    ffi_guard("otel log handler", NGX_OK as ngx_int_t, || {
        // SAFETY: as in `rewrite_handler`.
        let req = unsafe { Request::from_ngx_http_request(r) };
        if is_main(req) && queue::is_running() {
            if let Some(t) = trace(req).filter(|t| t.context.flags & FLAG_SAMPLED != 0) {
                queue::enqueue(finish(req, t));
            }
        }
        NGX_OK as ngx_int_t
    })
}

/// The span of a sampled request as the worker leaves it: numbers and
/// copied bytes (one allocation); the exporter thread builds the
/// attributes.
fn finish(req: &Request, t: &Trace) -> SpanDraft {
    let r = req.as_ref();
    // SAFETY: the request's connection is live for the request.
    let c = unsafe { &*r.connection };
    let server_name = NgxHttpCoreModule::server_conf(req)
        .map(|cscf: &ngx_http_core_srv_conf_t| str_bytes(&cscf.server_name))
        .unwrap_or_default();
    // SAFETY: `host` and `user_agent` are null or headers of the live
    // request.
    let (host, user_agent) = unsafe {
        (
            r.headers_in
                .host
                .as_ref()
                .map(|h| str_bytes(&h.value))
                .unwrap_or_default(),
            r.headers_in
                .user_agent
                .as_ref()
                .map(|h| str_bytes(&h.value))
                .unwrap_or_default(),
        )
    };
    let upstream_name = read_variable(req, Read::UpstreamName).unwrap_or_default();
    let (upstream, upstream_address) = last_upstream(req).unzip();
    let upstream_address = upstream_address.unwrap_or_default();
    // SAFETY: the header's bytes, in the request's pool.
    let tracestate = t
        .tracestate
        .map(|(p, n)| unsafe { std::slice::from_raw_parts(p, n) })
        .unwrap_or_default();
    let name = operation_name(req);
    let texts: [(Text, &[u8]); 10] = [
        (Text::Name, name),
        (Text::TraceState, tracestate),
        (Text::Method, str_bytes(&r.method_name)),
        (Text::Target, str_bytes(&r.unparsed_uri)),
        (Text::ServerName, server_name),
        (Text::Host, host),
        (Text::UserAgent, user_agent),
        (Text::PeerIp, str_bytes(&c.addr_text)),
        (Text::UpstreamName, upstream_name),
        (Text::UpstreamAddress, upstream_address),
    ];
    let mut span = SpanDraft::new(
        t.context.trace_id,
        t.context.span_id,
        texts.iter().map(|(_, b)| b.len().min(MAX_TEXT)).sum(),
    );
    for (which, bytes) in texts {
        if !bytes.is_empty() {
            span.set(which, bytes);
        }
    }
    span.parent_span_id = t.parent;
    span.start_unix_nano = t.start_unix_nano;
    span.end_unix_nano = now_unix_nano();
    span.http_status = r.headers_out.status as u16;
    span.http_version = r.http_version as u32;
    span.https = !c.ssl.is_null();
    // SAFETY: a live connection's addresses: its listener's (whose port
    // is the local one even on a wildcard address, so no getsockname as
    // `$server_port` may need) and its peer's.
    (span.host_port, span.peer_port) = unsafe { (port_of(c.local_sockaddr), port_of(c.sockaddr)) };
    span.upstream = upstream;
    span
}

/// The port of an IPv4 or IPv6 socket address (none for a unix socket).
///
/// # Safety
/// `sa` is null or a live socket address.
unsafe fn port_of(sa: *const ngx::ffi::sockaddr) -> Option<u16> {
    // SAFETY: per this function's contract; the family says which struct
    // it is.
    unsafe {
        match i32::from(sa.as_ref()?.sa_family) {
            libc::AF_INET => Some(u16::from_be((*sa.cast::<libc::sockaddr_in>()).sin_port)),
            libc::AF_INET6 => Some(u16::from_be((*sa.cast::<libc::sockaddr_in6>()).sin6_port)),
            _ => None,
        }
    }
}

/// The upstream's last attempt (status and timings, and the number of
/// attempts) and its address; none when the request was not proxied.
fn last_upstream(req: &Request) -> Option<(UpstreamTimes, &[u8])> {
    let r = req.as_ref();
    // SAFETY: `upstream_states` is null or an array in the request's pool.
    let states = unsafe { r.upstream_states.as_ref() }?;
    if states.elts.is_null() || states.nelts == 0 {
        return None;
    }
    // SAFETY: an ngx_array_t of `nelts` upstream states at `elts`.
    let states = unsafe { std::slice::from_raw_parts(states.elts.cast::<ngx_http_upstream_state_t>(), states.nelts) };
    let attempts = states.iter().filter(|s| !s.peer.is_null()).count();
    let last = states.iter().rev().find(|s| !s.peer.is_null())?;
    let unset = ngx::ffi::ngx_msec_t::MAX;
    let ms = |v: ngx::ffi::ngx_msec_t| (v != unset).then_some(v as u64);
    let times = UpstreamTimes {
        status: u16::try_from(last.status).unwrap_or(0),
        connect_ms: ms(last.connect_time),
        header_ms: ms(last.header_time),
        response_ms: ms(last.response_time),
        attempts: attempts as u32,
    };
    // SAFETY: a non-null `peer` is the peer's name, in the configuration's
    // or the balancer's memory, alive for the request.
    Some((times, str_bytes(unsafe { &*last.peer })))
}

/// `dynamic_balancer_otel_operation_name`'s value, else the location's
/// name: bytes in the request's pool or the configuration's.
fn operation_name(req: &Request) -> &[u8] {
    if let Some(cv) = Module::location_conf(req).and_then(|l| l.otel_operation_name) {
        let mut value = ngx_str_t::default();
        // SAFETY: a compiled complex value of this request's configuration,
        // evaluated for the live request into its pool.
        let rc = unsafe { ngx_http_complex_value(ptr::from_ref(req.as_ref()).cast_mut(), cv.as_ptr(), &mut value) };
        if rc == NGX_OK as ngx_int_t && !value.data.is_null() {
            // SAFETY: the value nginx made, `len` bytes in the request's
            // pool, which outlives the request's borrow.
            return unsafe { std::slice::from_raw_parts(value.data, value.len) };
        }
    }
    let clcf: Option<&ngx_http_core_loc_conf_t> = NgxHttpCoreModule::location_conf(req);
    clcf.map(|l| str_bytes(&l.name)).unwrap_or_default()
}

/// The get handler of the tracing variables (`data` is the
/// variable's place in [`VARIABLES`]); not found without a trace. nginx calls it with a
/// live request and the variable's value slot.
pub unsafe extern "C" fn variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    data: usize,
) -> ngx_int_t {
    let body = |req: &mut Request, v: &mut ngx_http_variable_value_t| {
        let Some(t) = trace(req) else {
            variables::fill_not_found(v);
            return NGX_OK as ngx_int_t;
        };
        let mut hex = [0u8; 32];
        let value: &[u8] = match data {
            0 => {
                trace_context::hex_write(&t.context.trace_id, &mut hex);
                &hex
            }
            1 => {
                trace_context::hex_write(&t.context.span_id, &mut hex[..16]);
                &hex[..16]
            }
            2 => {
                // SAFETY: the trace lives in the request's pool, as long as
                // the variable's value may be read.
                unsafe { variables::fill_borrowed(v, &t.traceparent) };
                return NGX_OK as ngx_int_t;
            }
            _ => match t.tracestate {
                Some((p, n)) => {
                    // SAFETY: the header's bytes, in the request's pool.
                    unsafe { variables::fill_borrowed(v, std::slice::from_raw_parts(p, n)) };
                    return NGX_OK as ngx_int_t;
                }
                None => {
                    variables::fill_not_found(v);
                    return NGX_OK as ngx_int_t;
                }
            },
        };
        variables::fill(req, v, value)
    };
    // SAFETY: nginx calls a get handler with a live request and its value
    // slot, which nothing else borrows during the call.
    unsafe { variables::get_handler("$opentelemetry_*", r, v, body) }
}

/// The tracing variables: trace id, span id, traceparent, tracestate.
pub const VARIABLES: [&str; 4] = [
    "opentelemetry_trace_id",
    "opentelemetry_span_id",
    "opentelemetry_context_traceparent",
    "opentelemetry_context_tracestate",
];
