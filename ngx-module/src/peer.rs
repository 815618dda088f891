//! The upstream peer hook that replaces `balancer_by_lua`: `init_peer` takes
//! the backend chosen for the request (canaries included), `get_peer` hands
//! nginx one endpoint per attempt with the backend's algorithm, and
//! `free_peer` records the outcome in the shared endpoint state (passive
//! health, connections, EWMA).
//!
//! `keepalive` placed after `dynamic_balancer` wraps these functions, so
//! upstream connections are cached and reused per endpoint.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use lua_compat::least_conn;
use lua_compat::sticky::{
    parse_cookie_value, persistent_key, set_cookie_value, should_set_cookie, CookieContext, StickyMode,
};
use lua_compat::tried::TriedSet;
use ngx::ffi::{
    ngx_http_request_t, ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_peer_connection_t, ngx_uint_t, NGX_BUSY,
    NGX_ERROR, NGX_LOG_WARN, NGX_OK, NGX_PEER_FAILED,
};
use ngx::http::Request;
use ngx::ngx_log_error;

use crate::canary;
use crate::config::{backend_name, upstream_conf, zone_of, UpstreamConf};
use crate::guard::ffi_guard;
use crate::http::pool_box;
use crate::store::unix_seconds;
use crate::variables::{self, Own};
use crate::worker_cache::{lookup, Balancing, Sticky, WorkerBackend};
use crate::zone::Zone;

/// Sticky balanced mode's attempts at a new key avoiding failed endpoints,
/// as Lua's `MAX_UPSTREAM_CHECKS_COUNT`.
const STICKY_NEW_KEY_TRIES: u32 = 20;
/// Random draws before a sampled pick falls back to a scan.
const SAMPLE_DRAWS: usize = 16;

/// Per-request balancer state, in the request pool.
pub struct PeerData {
    /// Keeps the endpoints (and so `pc->name`, which `$upstream_addr` reads
    /// in the log phase) alive even if a sync replaces the backend.
    backend: Rc<WorkerBackend>,
    /// The name the request asked for (the primary, also for a canary).
    requested: Box<[u8]>,
    tried: TriedSet,
    request: *mut ngx_http_request_t,
    /// The chash key, rendered once per request.
    key: Option<Vec<u8>>,
    /// The endpoint of the attempt in progress.
    current: Option<usize>,
}

/// Finds the backend for the request (following canary rules) and allocates
/// its per-request state; `None` when nothing can serve it (503).
///
/// # Safety
/// `r` is a live request.
pub unsafe fn prepare(r: *mut ngx_http_request_t, conf: &UpstreamConf, zone: &Zone) -> Option<NonNull<PeerData>> {
    let name = backend_name(r, conf)?;
    let primary = lookup(zone, name)?;
    let (backend, is_canary) = canary::route(r, zone, primary);
    if backend.endpoints.is_empty() {
        return None;
    }
    if is_canary {
        variables::set(r, Own::AlternativeUpstream, &backend.name);
    }
    let data = PeerData {
        backend,
        requested: name.into(),
        tried: TriedSet::new(),
        request: r,
        key: None,
        current: None,
    };
    pool_box((*r).pool, data)
}

/// Hands state prepared in the preaccess phase over to `init_peer`, so the
/// backend is chosen once per request.
///
/// # Safety
/// `r` is a live request; `data` lives in its pool.
pub unsafe fn stash(r: *mut ngx_http_request_t, data: NonNull<PeerData>) {
    *(*r).ctx.add(crate::module_ctx_index()) = data.as_ptr().cast();
}

/// Takes the stashed state if it is for backend `name`.
unsafe fn take_stash(r: *mut ngx_http_request_t, name: &[u8]) -> Option<NonNull<PeerData>> {
    let slot = (*r).ctx.add(crate::module_ctx_index());
    let data = NonNull::new((*slot).cast::<PeerData>())?;
    *slot = std::ptr::null_mut();
    // A later phase (auth_request_set, say) may have renamed the backend.
    (data.as_ref().requested.as_ref() == name).then_some(data)
}

/// `peer.init` of a `dynamic_balancer` upstream.
pub unsafe extern "C" fn init_peer(r: *mut ngx_http_request_t, us: *mut ngx_http_upstream_srv_conf_t) -> ngx_int_t {
    ffi_guard("init peer", NGX_ERROR as ngx_int_t, || unsafe {
        let u = &mut *(*r).upstream;
        let data = match (upstream_conf(us), zone_of(&*r)) {
            (Some(conf), Some(zone)) => {
                let name = backend_name(r, conf).unwrap_or_default();
                take_stash(r, name).or_else(|| prepare(r, conf, &zone))
            }
            _ => None,
        };
        set_session_hooks(u);
        u.peer.free = Some(free_peer);
        let Some(data) = data else {
            // The preaccess check answers 503 first in proxy_pass/grpc_pass
            // locations; reaching here means the backend vanished since, or
            // the upstream is used some other way. nginx then answers 502.
            ngx_log_error!(
                NGX_LOG_WARN,
                (*(*r).connection).log,
                "dynamic_balancer: no endpoints for this request's backend"
            );
            u.peer.data = std::ptr::null_mut();
            u.peer.get = Some(get_no_peer);
            u.peer.tries = 1;
            return NGX_OK as ngx_int_t;
        };
        u.peer.tries = data.as_ref().backend.endpoints.len() as ngx_uint_t;
        u.peer.data = data.as_ptr().cast();
        u.peer.get = Some(get_peer);
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

unsafe extern "C" fn set_no_session(_pc: *mut ngx_peer_connection_t, _data: *mut c_void) -> ngx_int_t {
    NGX_OK as ngx_int_t
}

unsafe extern "C" fn save_no_session(_pc: *mut ngx_peer_connection_t, _data: *mut c_void) {}

fn now_ms() -> u64 {
    (unix_seconds() * 1000.0) as u64
}

/// `peer.get`: one endpoint for this attempt.
unsafe extern "C" fn get_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    ffi_guard("get peer", NGX_ERROR as ngx_int_t, || unsafe {
        let pd = &mut *data.cast::<PeerData>();
        let pc = &mut *pc;
        let picked = pick(pd).or_else(|| {
            // Every endpoint was tried, yet nginx grants one more try: it does
            // so when a cached keepalive connection turned out to be closed.
            // Stock round-robin then reconnects too, so pick again.
            (pc.tries > 0)
                .then(|| pd.backend.rr.borrow_mut().pick(&TriedSet::new()))
                .flatten()
        });
        let Some(i) = picked else {
            return NGX_BUSY as ngx_int_t;
        };
        pd.tried.insert(i);
        pd.current = Some(i);
        let backend = &pd.backend;
        let peer = &backend.endpoints[i];
        if let Some(slot) = peer.state.and_then(|s| s.get()) {
            slot.conns.fetch_add(1, Ordering::Relaxed);
            slot.note_picked(backend.max_fails, now_ms());
        }
        pc.sockaddr = peer.sockaddr.as_ptr().cast_mut().cast();
        pc.socklen = peer.sockaddr.len();
        pc.name = (&peer.name as *const ngx::ffi::ngx_str_t).cast_mut();
        NGX_OK as ngx_int_t
    })
}

/// The endpoint for the next attempt, by the backend's algorithm; endpoints
/// already tried by the request are avoided, and endpoints passive health
/// took out of rotation too, unless nothing else is left (then, as nginx
/// does, all of them are used).
unsafe fn pick(pd: &mut PeerData) -> Option<usize> {
    let backend = Rc::clone(&pd.backend);
    let n = backend.endpoints.len();
    let now = now_ms();
    let healthy = |i: usize| {
        backend.endpoints[i]
            .state
            .and_then(|s| s.get())
            .is_none_or(|s| s.usable(backend.max_fails, backend.fail_timeout_ms, now))
    };
    let tried = &pd.tried;
    let fresh = |i: usize| !tried.contains(i);
    match &backend.algorithm {
        Balancing::RoundRobin => {
            let mut rr = backend.rr.borrow_mut();
            rr.pick_where(tried, healthy).or_else(|| rr.pick(tried))
        }
        Balancing::LeastConn => {
            let conns = |i: usize| {
                backend.endpoints[i]
                    .state
                    .and_then(|s| s.get())
                    .map_or(0, |s| u64::from(s.conns.load(Ordering::Relaxed)))
            };
            let rr = backend.rr.borrow();
            let weight = |i: usize| u64::from(rr.weight(i));
            let candidates = candidates(n, |i| fresh(i) && healthy(i)).or_else(|| candidates(n, fresh))?;
            least_conn::pick(&candidates, conns, weight, |k| fastrand::usize(..k))
        }
        Balancing::Ewma => {
            let secs = unix_seconds();
            let score = |i: usize| {
                backend.endpoints[i]
                    .state
                    .and_then(|s| s.get())
                    .map_or(0.0, |s| s.score(secs))
            };
            let candidates = candidates(n, |i| fresh(i) && healthy(i))
                .or_else(|| candidates(n, fresh))
                .or_else(|| candidates(n, |_| true))?;
            let (i, score) = lua_compat::ewma::pick_two(&candidates, score, |k| fastrand::usize(..k))?;
            variables::set(pd.request, Own::EwmaScore, format!("{score}").as_bytes());
            Some(i)
        }
        Balancing::Chash { key, ring } => {
            let r = pd.request;
            let key = pd.key.get_or_insert_with(|| key.render(|name| variables::get(r, name)));
            ring.find_usable(key, n, |i| fresh(i) && healthy(i))
                .or_else(|| ring.find_usable(key, n, fresh))
        }
        Balancing::ChashSubset { key, ring, subsets } => {
            let r = pd.request;
            let key = pd.key.get_or_insert_with(|| key.render(|name| variables::get(r, name)));
            let (set, _) = ring.find(key)?;
            let members = &subsets[set];
            let in_set: Vec<usize> = members.iter().copied().filter(|i| fresh(*i) && healthy(*i)).collect();
            let in_set = if in_set.is_empty() {
                members.iter().copied().filter(|i| fresh(*i)).collect()
            } else {
                in_set
            };
            if in_set.is_empty() {
                let others = candidates(n, fresh)?;
                return Some(others[fastrand::usize(..others.len())]);
            }
            Some(in_set[fastrand::usize(..in_set.len())])
        }
        Balancing::Sticky(sticky) => pick_sticky(pd, &backend, sticky, &healthy),
    }
}

/// Eligible endpoints to choose from, without scanning large backends: up to
/// [`least_conn::EXACT_LIMIT`] endpoints all are listed; beyond, two are drawn
/// at random (power of two choices), with a scan only if draws keep missing.
fn candidates(n: usize, eligible: impl Fn(usize) -> bool) -> Option<Vec<usize>> {
    let list = if n <= least_conn::EXACT_LIMIT {
        (0..n).filter(|i| eligible(*i)).collect::<Vec<_>>()
    } else {
        let mut drawn = Vec::with_capacity(2);
        for _ in 0..SAMPLE_DRAWS {
            let i = fastrand::usize(..n);
            if eligible(i) && !drawn.contains(&i) {
                drawn.push(i);
                if drawn.len() == 2 {
                    break;
                }
            }
        }
        if drawn.len() == 2 {
            drawn
        } else {
            (0..n).filter(|i| eligible(*i)).collect()
        }
    };
    (!list.is_empty()).then_some(list)
}

/// Sticky sessions, as `balancer/sticky.lua`: follow the cookie, unless there
/// is none (or it is unknown), or this is a retry and `change_on_failure` is
/// set; then pick anew and (re)issue the cookie where `locations` allows.
/// Beyond Lua, an endpoint passive health took out of rotation is not followed.
unsafe fn pick_sticky(
    pd: &mut PeerData,
    backend: &WorkerBackend,
    sticky: &Sticky,
    healthy: &dyn Fn(usize) -> bool,
) -> Option<usize> {
    let r = pd.request;
    let retry = !pd.tried.is_empty();
    let cookie = variables::get(r, &sticky.cookie_variable).map(|v| String::from_utf8_lossy(v).into_owned());
    let from_cookie = cookie
        .as_deref()
        .and_then(|c| parse_cookie_value(c).0)
        .and_then(|key| match sticky.mode {
            StickyMode::Balanced => sticky.ring.find(key.as_bytes()).map(|(i, _)| i),
            StickyMode::Persistent => sticky.persistent.get(key).copied(),
        });
    let pick_new = (retry && sticky.cookie.change_on_failure) || from_cookie.is_none_or(|i| !healthy(i));
    if !pick_new {
        return from_cookie;
    }
    let usable = |i: usize| !pd.tried.contains(i) && healthy(i);
    let (i, key) = match sticky.mode {
        StickyMode::Balanced => {
            let now = unix_seconds();
            let pid = ngx::ffi::ngx_pid;
            (1..=STICKY_NEW_KEY_TRIES).find_map(|k| {
                let key = format!("{:.3}.{pid}.{}", now + f64::from(k), fastrand::u32(1..=999_999));
                let (i, _) = sticky.ring.find(key.as_bytes())?;
                usable(i).then_some((i, key))
            })?
        }
        StickyMode::Persistent => {
            let list = candidates(backend.endpoints.len(), usable)?;
            let i = list[fastrand::usize(..list.len())];
            (
                i,
                persistent_key(
                    std::str::from_utf8(&backend.name).unwrap_or(""),
                    backend.endpoints[i].name_str(),
                ),
            )
        }
    };
    issue_cookie(r, sticky, &key);
    Some(i)
}

/// Adds the sticky `Set-Cookie` if the request's location is listed.
unsafe fn issue_cookie(r: *mut ngx_http_request_t, sticky: &Sticky, key: &str) {
    let text = |name: &str| {
        variables::get(r, name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    let (host, server_name, location_path) = (text("host"), text("server_name"), text("location_path"));
    if !should_set_cookie(&sticky.cookie, &host, &server_name, &location_path) {
        return;
    }
    let user_agent = variables::get(r, "http_user_agent").map(|v| String::from_utf8_lossy(v).into_owned());
    let expires_at = sticky.cookie.expires.map(|secs| {
        let mut buf = [0u8; 48];
        let end = ngx::ffi::ngx_http_cookie_time(buf.as_mut_ptr(), ngx::ffi::ngx_time() + secs);
        String::from_utf8_lossy(&buf[..end.offset_from(buf.as_ptr()) as usize]).into_owned()
    });
    let ctx = CookieContext {
        location_path: &location_path,
        https: text("https") == "on",
        user_agent: user_agent.as_deref(),
        expires_at,
    };
    let value = set_cookie_value(&sticky.cookie, key, &sticky.backend_key, &ctx);
    let _ = Request::from_ngx_http_request(r).add_header_out("Set-Cookie", &value);
}

unsafe extern "C" fn get_no_peer(_pc: *mut ngx_peer_connection_t, _data: *mut c_void) -> ngx_int_t {
    NGX_BUSY as ngx_int_t
}

/// `peer.free`: records the attempt in the shared endpoint state; one try
/// fewer remains, as in nginx's round-robin.
unsafe extern "C" fn free_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void, state: ngx_uint_t) {
    ffi_guard("free peer", (), || unsafe {
        let pc = &mut *pc;
        pc.tries = pc.tries.saturating_sub(1);
        let Some(pd) = data.cast::<PeerData>().as_mut() else {
            return;
        };
        let Some(i) = pd.current.take() else { return };
        let backend = &pd.backend;
        let Some(slot) = backend.endpoints[i].state.and_then(|s| s.get()) else {
            return;
        };
        let _ = slot
            .conns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_sub(1));
        if state & NGX_PEER_FAILED as ngx_uint_t != 0 {
            if backend.max_fails != 0 {
                slot.record_failure(backend.fail_timeout_ms, now_ms());
            }
            return;
        }
        slot.record_success();
        if matches!(backend.algorithm, Balancing::Ewma) {
            if let Some(rtt) = last_round_trip(pd.request) {
                slot.record_rtt(rtt, unix_seconds());
            }
        }
    })
}

/// Connect plus response time of the attempt just finished, in seconds, as
/// ewma.lua adds `$upstream_connect_time` and `$upstream_response_time`.
unsafe fn last_round_trip(r: *mut ngx_http_request_t) -> Option<f64> {
    let u = (*r).upstream.as_ref()?;
    let state = u.state.as_ref()?;
    let ms = |v: ngx::ffi::ngx_msec_t| (v != ngx::ffi::ngx_msec_t::MAX).then_some(v as f64 / 1000.0);
    let response = ms(state.response_time)?;
    Some(response + ms(state.connect_time).unwrap_or(0.0))
}
