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

use lua_compat::otel::sampler::Sampler;
use lua_compat::otel::span::{SpanRecord, Value};
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
        .and_then(|_| request::header_in(req, b"tracestate"))
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
}

static HEADERS: OnceLock<PropagationHeaders> = OnceLock::new();

/// Makes the request carry this span's context upstream.
fn propagate(req: &mut Request, trace: NonNull<Trace>) {
    let h = HEADERS.get_or_init(|| PropagationHeaders {
        traceparent: CompiledHeader::new("traceparent", ""),
    });
    // SAFETY: the trace lives in the request's pool, as long as the
    // request's headers; nothing else borrows it mutably.
    let t = unsafe { trace.as_ref() };
    // SAFETY: the header name is static; the value is in the request's
    // pool (the trace), both outliving the request's headers.
    let _ = unsafe { headers::set_with(req, Side::Request, &h.traceparent, &t.traceparent) };
    if t.tracestate.is_none() {
        headers::remove(req, Side::Request, "tracestate");
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

/// The most bytes of a client's text (target, host, user agent) a span
/// keeps: a queue of full spans then stays within a few MiB per worker
/// whatever the clients send (a request line may be 64 KiB).
const MAX_TEXT: usize = 1024;

fn text(bytes: &[u8]) -> Value {
    let mut s = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_TEXT)]).into_owned();
    if bytes.len() > MAX_TEXT {
        // A cut through a UTF-8 sequence shows as U+FFFD; mark the cut.
        s.push('…');
    }
    Value::Str(s)
}

fn finish(req: &Request, t: &Trace) -> SpanRecord {
    let r = req.as_ref();
    let status = r.headers_out.status as u16;
    let mut attributes = Vec::with_capacity(20);
    attributes.push(("http.method", text(str_bytes(&r.method_name))));
    attributes.push((
        "http.flavor",
        Value::Str(
            match r.http_version {
                1000 => "1.0",
                1001 => "1.1",
                2000 => "2.0",
                3000 => "3.0",
                _ => "0.9",
            }
            .into(),
        ),
    ));
    attributes.push(("http.target", text(str_bytes(&r.unparsed_uri))));
    // SAFETY: the request's connection is live for the request.
    let c = unsafe { &*r.connection };
    let https = !c.ssl.is_null();
    attributes.push(("http.scheme", Value::Str(if https { "https" } else { "http" }.into())));
    if let Some(cscf) = NgxHttpCoreModule::server_conf(req) {
        let cscf: &ngx_http_core_srv_conf_t = cscf;
        let name = str_bytes(&cscf.server_name);
        if !name.is_empty() {
            attributes.push(("http.server_name", text(name)));
        }
    }
    // SAFETY: `host` is null or a header of the live request.
    if let Some(h) = unsafe { r.headers_in.host.as_ref() } {
        attributes.push(("http.host", text(str_bytes(&h.value))));
    }
    // SAFETY: as above.
    if let Some(h) = unsafe { r.headers_in.user_agent.as_ref() } {
        attributes.push(("http.user_agent", text(str_bytes(&h.value))));
    }
    attributes.push(("http.status_code", Value::Int(i64::from(status))));
    if let Some(port) = read_variable(req, Read::ServerPort).and_then(|p| std::str::from_utf8(p).ok()?.parse().ok()) {
        attributes.push(("net.host.port", Value::Int(port)));
    }
    attributes.push(("net.peer.ip", text(str_bytes(&c.addr_text))));
    // SAFETY: a live connection's sockaddr is its peer's address.
    if let Some(port) = unsafe { peer_port(c.sockaddr) } {
        attributes.push(("net.peer.port", Value::Int(i64::from(port))));
    }
    upstream_attributes(req, &mut attributes);
    SpanRecord {
        trace_id: t.context.trace_id,
        span_id: t.context.span_id,
        parent_span_id: t.parent,
        trace_state: t
            .tracestate
            // SAFETY: the header's bytes, in the request's pool.
            .map(|(p, n)| String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(p, n) }).into_owned())
            .unwrap_or_default(),
        name: operation_name(req),
        start_unix_nano: t.start_unix_nano,
        end_unix_nano: now_unix_nano(),
        http_status: status,
        attributes,
    }
}

/// The peer's port, from an IPv4 or IPv6 socket address.
///
/// # Safety
/// `sa` is null or a live socket address.
unsafe fn peer_port(sa: *const ngx::ffi::sockaddr) -> Option<u16> {
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

/// The upstream's last attempt (address, status, timings in seconds), the
/// number of attempts, and ingress-nginx's upstream name.
fn upstream_attributes(req: &Request, out: &mut Vec<(&'static str, Value)>) {
    if let Some(name) = read_variable(req, Read::UpstreamName).filter(|n| !n.is_empty()) {
        out.push(("nginx.upstream.name", text(name)));
    }
    let r = req.as_ref();
    // SAFETY: `upstream_states` is null or an array in the request's pool.
    let Some(states) = (unsafe { r.upstream_states.as_ref() }) else {
        return;
    };
    if states.elts.is_null() || states.nelts == 0 {
        return;
    }
    // SAFETY: an ngx_array_t of `nelts` upstream states at `elts`.
    let states = unsafe { std::slice::from_raw_parts(states.elts.cast::<ngx_http_upstream_state_t>(), states.nelts) };
    let attempts = states.iter().filter(|s| !s.peer.is_null()).count();
    let Some(last) = states.iter().rev().find(|s| !s.peer.is_null()) else {
        return;
    };
    // SAFETY: a non-null `peer` is the peer's name, in the configuration's
    // or the balancer's memory, alive for the request.
    out.push(("upstream.address", text(str_bytes(unsafe { &*last.peer }))));
    if last.status != 0 {
        out.push(("upstream.status_code", Value::Int(last.status as i64)));
    }
    let unset = ngx::ffi::ngx_msec_t::MAX;
    for (key, ms) in [
        ("upstream.connect_time", last.connect_time),
        ("upstream.header_time", last.header_time),
        ("upstream.response_time", last.response_time),
    ] {
        if ms != unset {
            out.push((key, Value::Double(ms as f64 / 1000.0)));
        }
    }
    out.push(("upstream.attempts", Value::Int(attempts as i64)));
}

/// `dynamic_balancer_otel_operation_name`'s value, else the location's
/// name.
fn operation_name(req: &Request) -> String {
    if let Some(cv) = Module::location_conf(req).and_then(|l| l.otel_operation_name) {
        let mut value = ngx_str_t::default();
        // SAFETY: a compiled complex value of this request's configuration,
        // evaluated for the live request into its pool.
        let rc = unsafe { ngx_http_complex_value(ptr::from_ref(req.as_ref()).cast_mut(), cv.as_ptr(), &mut value) };
        if rc == NGX_OK as ngx_int_t {
            return String::from_utf8_lossy(str_bytes(&value)).into_owned();
        }
    }
    let clcf: Option<&ngx_http_core_loc_conf_t> = NgxHttpCoreModule::location_conf(req);
    clcf.map(|l| String::from_utf8_lossy(str_bytes(&l.name)).into_owned())
        .unwrap_or_default()
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
