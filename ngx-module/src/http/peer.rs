//! The upstream peer hook that replaces `balancer_by_lua`: `init_peer` takes
//! the backend chosen for the request (canaries included), `get_peer` hands
//! nginx one endpoint per attempt with the backend's algorithm, and
//! `free_peer` records the outcome in the shared endpoint state (passive
//! health, connections, EWMA).
//!
//! `keepalive` placed after `dynamic_balancer` wraps these functions, so
//! upstream connections are cached and reused per endpoint.

use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::rc::Rc;
use std::sync::atomic::Ordering;

use lua_compat::selection::{select, Attempt, Endpoints, StickySelector};
use lua_compat::sticky::{session_header_value, set_cookie_value, should_set_cookie, Carrier, CookieContext};
use lua_compat::tried::TriedSet;
use ngx::ffi::{
    ngx_http_request_t, ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_peer_connection_t, ngx_uint_t, NGX_BUSY,
    NGX_ERROR, NGX_LOG_WARN, NGX_OK, NGX_PEER_FAILED,
};
use ngx::http::Request;
use ngx::ngx_log_error;

use crate::backends::canary;
use crate::backends::worker_cache::{lookup, WorkerBackend};
use crate::conf::{backend_name, own_variable, upstream_conf, zone_of, UpstreamConf};
use crate::http::request_ctx::{self, PeerData};
use crate::nginx::guard::ffi_guard;
use crate::nginx::variables::{self, Own};
use crate::shm::zone::Zone;
use ngx::http::{HttpModuleLocationConf, NgxHttpCoreModule};

/// Finds the backend for the request (following canary rules) and allocates
/// its per-request state; `None` when nothing can serve it (503). The state
/// keeps a pointer to the request for the peer hooks, hence `&mut`.
pub fn prepare(req: &mut Request, conf: &UpstreamConf, zone: &Zone) -> Option<NonNull<PeerData>> {
    // The name points into the request's variables or the location's
    // configuration, which both outlive the request's state.
    let name = backend_name(req, conf)?;
    let primary = lookup(zone, name)?;
    // Ingress canary rules (by header, cookie, weight) are not a Gateway
    // route's: a routed request goes to the backend its rule chose, and
    // that backend's TLS policy is the one applied.
    // SAFETY: a request's `main` is its live main request.
    let main = unsafe { Request::from_ngx_http_request(req.as_ref().main) };
    let (backend, is_canary) = if super::gateway_matched::matched(main).is_some() {
        (primary, false)
    } else {
        canary::route(req, zone, primary)
    };
    if backend.endpoints.is_empty() {
        return None;
    }
    if is_canary {
        if let Some(index) = own_variable(req, Own::AlternativeUpstream) {
            variables::set(req, index, &backend.name);
        }
    }
    let data = PeerData {
        backend,
        requested: (name.as_ptr(), name.len()),
        tried: TriedSet::new(),
        request: ptr::from_mut(req.as_mut()),
        key: None,
        current: None,
        ewma_score: None,
        taken: false,
        own_conf: ptr::null_mut(),
    };
    // The request ctx keeps it for the whole request: init_peer takes it
    // over, and $balancer_ewma_score reads it.
    request_ctx::attach_peer(req, data)
}

/// `$balancer_ewma_score`: the score of the request's last EWMA pick,
/// formatted only when something reads it. nginx calls this get handler with
/// a live request and the variable's value slot.
pub unsafe extern "C" fn ewma_score_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx::ffi::ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    ffi_guard("$balancer_ewma_score", NGX_ERROR as ngx_int_t, || {
        // SAFETY: nginx calls a get handler with a live request, on the
        // event loop, and holds no reference into it meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        // SAFETY: no `&mut` to the request's state is live while nginx
        // evaluates a variable: `pick` holds none while it reads variables.
        let text = unsafe { request_ctx::peer_ewma_score(req) }
            .map(|s| s.to_string())
            .unwrap_or_default();
        // SAFETY: `v` is the value slot nginx handed this get handler, not
        // otherwise borrowed during the call.
        variables::fill(req, unsafe { &mut *v }, text.as_bytes())
    })
}

/// Takes over the state `prepare` made in the preaccess phase, if it is for
/// backend `name`: the backend is chosen once per request.
fn take_prepared(req: &Request, name: &[u8]) -> Option<NonNull<PeerData>> {
    // SAFETY: the state is used only within this function, before nginx can
    // call a peer hook with it; it lives in the request's pool.
    let pd = unsafe { request_ctx::peer_data(req) }?;
    // A later phase (auth_request_set, say) may have renamed the backend.
    // SAFETY: `requested` is the `(ptr, len)` of the name `prepare` got from
    // the request's variables or the location's configuration; both outlive
    // the request's state (see `PeerData::requested`).
    if pd.taken || unsafe { std::slice::from_raw_parts(pd.requested.0, pd.requested.1) } != name {
        return None;
    }
    pd.taken = true;
    Some(NonNull::from(pd))
}

/// `peer.init` of a `dynamic_balancer` upstream. nginx calls it with a live
/// request whose `upstream` is set, and that upstream's srv conf.
pub unsafe extern "C" fn init_peer(r: *mut ngx_http_request_t, us: *mut ngx_http_upstream_srv_conf_t) -> ngx_int_t {
    ffi_guard("init peer", NGX_ERROR as ngx_int_t, || {
        // SAFETY: nginx calls peer.init with a live request, on the event
        // loop, and holds no reference into it meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        // SAFETY: nginx sets `r->upstream` (ngx_http_upstream_create) before
        // ngx_http_upstream_init_request calls peer.init; it is a separate
        // allocation, which nothing else uses during the call.
        let u = unsafe { &mut *req.as_ref().upstream };
        // SAFETY: `us` is the live srv conf nginx passed with the request.
        let data = match (unsafe { upstream_conf(us) }, zone_of(req)) {
            (Some(conf), Some(zone)) => {
                let name = backend_name(req, conf).unwrap_or_default();
                take_prepared(req, name).or_else(|| prepare(req, conf, &zone))
            }
            _ => None,
        };
        set_session_hooks(u);
        u.peer.free = Some(free_peer);
        let Some(data) = data else {
            // The preaccess check answers 503 first in proxy_pass/grpc_pass
            // locations; reaching here means the backend vanished since, or
            // the upstream is used some other way. nginx then answers 502.
            // SAFETY: a live request's connection outlives it.
            let log = unsafe { (*req.connection()).log };
            ngx_log_error!(
                NGX_LOG_WARN,
                log,
                "dynamic_balancer: no endpoints for this request's backend"
            );
            u.peer.data = std::ptr::null_mut();
            u.peer.get = Some(get_no_peer);
            u.peer.tries = 1;
            return NGX_OK as ngx_int_t;
        };
        // SAFETY: `data` points at the PeerData in the request's ctx, which
        // the request's pool cleanup keeps alive until the request ends.
        u.peer.tries = unsafe { data.as_ref() }.backend.endpoints.len() as ngx_uint_t;
        u.peer.data = data.as_ptr().cast();
        u.peer.get = Some(get_peer);
        // A Gateway API rule's timeouts and retries, before the first
        // connection arms its timers.
        match super::gateway_upstream::apply(req, u) {
            // SAFETY: as above; no other reference to the state is live.
            Ok(own) => unsafe { (*data.as_ptr()).own_conf = own },
            Err(()) => return NGX_ERROR as ngx_int_t,
        }
        NGX_OK as ngx_int_t
    })
}

/// nginx calls `set_session`/`save_session` on every TLS connection to an
/// upstream (`proxy_ssl_session_reuse` is on by default), so they must not be
/// NULL. Endpoints change at run time, so no session is cached per endpoint:
/// every upstream TLS connection does a full handshake, as under
/// `balancer_by_lua`. Upstream keepalive still reuses the connections.
fn set_session_hooks(u: &mut ngx::ffi::ngx_http_upstream_t) {
    u.peer.set_session = Some(set_no_session);
    u.peer.save_session = Some(save_no_session);
}

/// `peer.set_session`: nginx calls it with the live peer connection; it
/// touches neither argument.
unsafe extern "C" fn set_no_session(_pc: *mut ngx_peer_connection_t, _data: *mut c_void) -> ngx_int_t {
    NGX_OK as ngx_int_t
}

/// `peer.save_session`: nginx calls it with the live peer connection; it
/// touches neither argument.
unsafe extern "C" fn save_no_session(_pc: *mut ngx_peer_connection_t, _data: *mut c_void) {}

pub(crate) fn now_ms() -> u64 {
    // nginx's cached CLOCK_MONOTONIC milliseconds: no system call, and the
    // same clock in every worker and in the writer thread (store::now_ms).
    // SAFETY: a word-sized read of nginx's global, which only this worker's
    // event-loop thread (the caller's) updates, in ngx_time_update.
    unsafe { ngx::ffi::ngx_current_msec as u64 }
}

/// `peer.get`: one endpoint for this attempt. nginx calls it with the
/// upstream's live peer connection and the `data` `init_peer` set.
unsafe extern "C" fn get_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    ffi_guard("get peer", NGX_ERROR as ngx_int_t, || {
        let state = data.cast::<PeerData>();
        // SAFETY: nginx passes its live `u->peer`, which it does not touch
        // while the hook runs.
        let pc = unsafe { &mut *pc };
        // When every endpoint was tried yet nginx grants one more try (a
        // cached keepalive connection turned out closed), the selection's
        // last tier takes any endpoint, as stock round-robin reconnects.
        // SAFETY: init_peer installs get_peer only with `data` pointing at
        // the request's PeerData, live as long as the request, whose
        // `request` is the live request nginx is connecting for.
        let Some(i) = (unsafe { pick(state) }) else {
            return NGX_BUSY as ngx_int_t;
        };
        // SAFETY: as above; `pick` returned, so no other reference to the
        // state is live.
        let pd = unsafe { &mut *state };
        pd.tried.insert(i);
        pd.current = Some(i);
        begin_attempt(pc, &pd.backend, i, now_ms());
        // SAFETY: the state's request is live and nginx holds no reference
        // into it while peer.get runs.
        super::gateway_upstream::rearm(unsafe { Request::from_ngx_http_request(pd.request) }, pd.own_conf);
        NGX_OK as ngx_int_t
    })
}

/// The shared endpoint state of a backend, as the selectors read it.
pub(crate) struct Live<'a> {
    pub(crate) backend: &'a WorkerBackend,
    pub(crate) now_ms: u64,
}

impl Live<'_> {
    fn slot(&self, i: usize) -> Option<&'static lua_compat::endpoint_state::Slot> {
        self.backend.endpoints[i].state.get().and_then(|s| s.get())
    }
}

impl Endpoints for Live<'_> {
    fn count(&self) -> usize {
        self.backend.endpoints.len()
    }

    #[inline]
    fn healthy(&self, i: usize) -> bool {
        let b = self.backend;
        self.slot(i)
            .is_none_or(|s| s.usable(b.max_fails, b.fail_timeout_ms, self.now_ms))
    }

    fn connections(&self, i: usize) -> u64 {
        self.slot(i).map_or(0, |s| u64::from(s.conns.load(Ordering::Relaxed)))
    }

    fn ewma_score(&self, i: usize) -> f64 {
        self.slot(i).map_or(0.0, |s| s.score(self.now_ms as f64 / 1000.0))
    }
}

/// The endpoint for the next attempt, by the backend's selector (which
/// applies the retry and health tiers); a new sticky session gets its cookie.
///
/// Variables are read (the hash key, the sticky cookie) while no reference
/// to the state is held: nginx may evaluate `$balancer_ewma_score`, which
/// reads the same state, in the middle of them.
///
/// # Safety
/// `state` points at a live request's `PeerData`, not otherwise borrowed,
/// and its `request` is that live request, not otherwise referenced during
/// the call.
unsafe fn pick(state: *mut PeerData) -> Option<usize> {
    let (request, backend, has_key) = {
        // SAFETY: a short shared borrow of the live state (this function's
        // contract), ended before any variable is read.
        let pd = unsafe { &*state };
        (pd.request, Rc::clone(&pd.backend), pd.key.is_some())
    };
    let selector = &backend.selector;
    // SAFETY: `request` is live and otherwise unreferenced (this function's
    // contract); the state keeps the pointer because nginx hands the state,
    // not the request, to peer.get.
    let req = unsafe { Request::from_ngx_http_request(request) };
    let rendered = match selector.hash_key() {
        Some(template) if !has_key => Some(template.render(|name| variables::get(req, name))),
        _ => None,
    };
    let cookie = selector
        .cookie_variable()
        .and_then(|name| variables::get(req, name))
        .map(String::from_utf8_lossy);
    let pick = {
        // SAFETY: the state is live and, with the variables read, no other
        // reference to it is live until this borrow ends.
        let pd = unsafe { &mut *state };
        if rendered.is_some() {
            pd.key = rendered;
        }
        let attempt = Attempt {
            hash_key: pd.key.as_deref().unwrap_or_default(),
            cookie: cookie.as_deref(),
            retry: !pd.tried.is_empty(),
            now_ms: now_ms(),
        };
        let live = Live {
            backend: &backend,
            now_ms: attempt.now_ms,
        };
        let pick = select(selector, &attempt, &live, &pd.tried)?;
        if pick.ewma_score.is_some() {
            pd.ewma_score = pick.ewma_score;
        }
        pick
    };
    if let (Some(key), Some(sticky)) = (&pick.new_cookie, selector.sticky()) {
        // nginx picks peers before it reads the upstream's response, so the
        // response header is not sent yet.
        issue_cookie(req, sticky, key);
    }
    Some(pick.endpoint)
}

/// Adds the sticky `Set-Cookie` if the request's location is listed, or,
/// for a Gateway API rule's session persistence, always (its cookie has
/// its own path); a session header goes out as a response header of its
/// name. Called before the response header is sent.
fn issue_cookie(req: &mut Request, sticky: &StickySelector, key: &str) {
    if sticky.cookie.carrier == Carrier::Header {
        let value = session_header_value(key, &sticky.backend_key);
        let _ = req.add_header_out(&sticky.cookie.name, &value);
        return;
    }
    let gateway_rule = super::gateway_matched::matched(req).is_some();
    let text = |name: &str| {
        variables::get(req, name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    // ingress-nginx's template sets $location_path to the Ingress path; a
    // configuration that does not gets the location's own name.
    let mut location_path = text("location_path");
    if location_path.is_empty() {
        if let Some(clcf) = NgxHttpCoreModule::location_conf(req) {
            location_path = String::from_utf8_lossy(clcf.name.as_bytes()).into_owned();
        }
    }
    if !gateway_rule {
        let (host, server_name) = (text("host"), text("server_name"));
        if !should_set_cookie(&sticky.cookie, &host, &server_name, &location_path) {
            return;
        }
    }
    let user_agent = variables::get(req, "http_user_agent").map(|v| String::from_utf8_lossy(v).into_owned());
    let expires_at = sticky.cookie.expires.map(|secs| {
        let mut buf = [0u8; 48];
        // SAFETY: ngx_http_cookie_time writes one date ("Thu, 01-Jan-70
        // 00:00:00 GMT", 27 bytes; even a 12-digit year stays under 48) into
        // `buf` and returns its end; ngx_time reads nginx's cached time.
        let end = unsafe { ngx::ffi::ngx_http_cookie_time(buf.as_mut_ptr(), ngx::ffi::ngx_time() + secs) };
        // SAFETY: `end` points into `buf`, at or after its start.
        let len = unsafe { end.offset_from(buf.as_ptr()) } as usize;
        String::from_utf8_lossy(&buf[..len]).into_owned()
    });
    let ctx = CookieContext {
        location_path: &location_path,
        https: text("https") == "on",
        user_agent: user_agent.as_deref(),
        expires_at,
    };
    let value = set_cookie_value(&sticky.cookie, key, &sticky.backend_key, &ctx);
    let _ = req.add_header_out("Set-Cookie", &value);
}

/// `peer.get` when the request has no backend: nginx calls it with the live
/// peer connection and null `data`; it touches neither.
unsafe extern "C" fn get_no_peer(_pc: *mut ngx_peer_connection_t, _data: *mut c_void) -> ngx_int_t {
    NGX_BUSY as ngx_int_t
}

/// `peer.free`: records the attempt in the shared endpoint state; one try
/// fewer remains, as in nginx's round-robin. nginx calls it with the
/// upstream's live peer connection and the `data` `init_peer` set.
unsafe extern "C" fn free_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void, state: ngx_uint_t) {
    ffi_guard("free peer", (), || {
        // SAFETY: nginx passes its live `u->peer`, which it does not touch
        // while the hook runs.
        let pc = unsafe { &mut *pc };
        pc.tries = pc.tries.saturating_sub(1);
        // SAFETY: `data` is null (no backend) or the request's PeerData that
        // init_peer set, alive as long as the request and not otherwise
        // borrowed during this call.
        let Some(pd) = (unsafe { data.cast::<PeerData>().as_mut() }) else {
            return;
        };
        let Some(i) = pd.current.take() else { return };
        if let Some(slot) = end_attempt(&pd.backend, i, state) {
            // SAFETY: `pd.request` is the live request whose attempt ends;
            // the state keeps the pointer because nginx hands the state, not
            // the request, to peer.free. Nothing else references the request
            // while this hook runs.
            let req = unsafe { Request::from_ngx_http_request(pd.request) };
            if let Some(rtt) = last_round_trip(req) {
                slot.record_rtt(rtt, now_ms() as f64 / 1000.0);
            }
        }
    })
}

/// Points nginx's peer connection at endpoint `i` of `backend` and counts
/// the attempt in its shared slot. Shared by the HTTP and stream hooks.
/// The endpoint's address and name live as long as `backend`, which the
/// caller's state holds past the connection.
///
/// The attempt is a new connection until `keepalive` (which wraps this
/// hook) hands it a cached one: `cached` is cleared here, as every nginx
/// balancer clears it. Left set from an earlier attempt's cached
/// connection, nginx would take each new connection for a cached one:
/// every failure would grant another try (a request looping on new
/// connections), and the gRPC module would look for HTTP/2 state a new
/// connection does not have.
pub(crate) fn begin_attempt(pc: &mut ngx_peer_connection_t, backend: &WorkerBackend, i: usize, now_ms: u64) {
    pc.set_cached(0);
    let peer = &backend.endpoints[i];
    if let Some(slot) = peer.state.get().and_then(|s| s.get()) {
        slot.conns.fetch_add(1, Ordering::Relaxed);
        slot.note_picked(backend.max_fails, now_ms);
    }
    pc.sockaddr = peer.sockaddr.as_ptr().cast_mut().cast();
    pc.socklen = peer.sockaddr.len();
    pc.name = ptr::from_ref(&peer.name).cast_mut();
}

/// Records the end of the attempt on endpoint `i` (nginx's `peer.free`
/// `state`) in its shared slot: one connection fewer, a failure or a
/// success. Returns the slot when the attempt succeeded and the selector
/// learns round trips (ewma), for the caller to add its timing.
pub(crate) fn end_attempt(
    backend: &WorkerBackend,
    i: usize,
    state: ngx_uint_t,
) -> Option<&'static lua_compat::endpoint_state::Slot> {
    let slot = backend.endpoints[i].state.get().and_then(|s| s.get())?;
    let _ = slot
        .conns
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_sub(1));
    if state & NGX_PEER_FAILED as ngx_uint_t != 0 {
        if backend.max_fails != 0 {
            slot.record_failure(backend.fail_timeout_ms, now_ms());
        }
        return None;
    }
    slot.record_success();
    backend.selector.learns_round_trips().then_some(slot)
}

/// Connect plus response time of the attempt just finished, in seconds, as
/// ewma.lua adds `$upstream_connect_time` and `$upstream_response_time`.
fn last_round_trip(req: &Request) -> Option<f64> {
    // SAFETY: a live request's `upstream` is null or its live upstream.
    let u = unsafe { req.as_ref().upstream.as_ref() }?;
    // SAFETY: `u->state` is null or the live entry of `u->state`'s array
    // for the attempt just finished.
    let state = unsafe { u.state.as_ref() }?;
    let ms = |v: ngx::ffi::ngx_msec_t| (v != ngx::ffi::ngx_msec_t::MAX).then_some(v as f64 / 1000.0);
    let response = ms(state.response_time)?;
    Some(response + ms(state.connect_time).unwrap_or(0.0))
}
