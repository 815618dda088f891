//! The upstream peer hook that replaces `balancer_by_lua`: `init_peer` picks
//! the backend named by the request's variable, `get_peer` hands nginx one
//! endpoint per attempt, `free_peer` accounts for the attempt.
//!
//! `keepalive` placed after `dynamic_balancer` wraps these functions, so
//! upstream connections are cached and reused per endpoint.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::rc::Rc;

use lua_compat::tried::TriedSet;
use ngx::ffi::{
    ngx_http_request_t, ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_peer_connection_t, ngx_uint_t,
    NGX_BUSY, NGX_ERROR, NGX_LOG_WARN, NGX_OK,
};
use ngx::ngx_log_error;

use crate::config::{backend_name, upstream_conf, zone_of, UpstreamConf};
use crate::guard::ffi_guard;
use crate::http::pool_box;
use crate::worker_cache::{lookup, WorkerBackend};
use crate::zone::Zone;

/// Per-request balancer state, in the request pool.
pub struct PeerData {
    /// Keeps the endpoints (and so `pc->name`, which `$upstream_addr` reads
    /// in the log phase) alive even if a sync replaces the backend.
    backend: Rc<WorkerBackend>,
    tried: TriedSet,
}

/// Finds the request's backend and allocates its per-request state; `None`
/// when the backend is unknown or has no endpoints.
///
/// # Safety
/// `r` is a live request.
pub unsafe fn prepare(
    r: *mut ngx_http_request_t,
    conf: &UpstreamConf,
    zone: &Zone,
) -> Option<NonNull<PeerData>> {
    let backend = lookup(zone, backend_name(r, conf)?).filter(|b| !b.endpoints.is_empty())?;
    pool_box(
        (*r).pool,
        PeerData {
            tried: TriedSet::new(),
            backend,
        },
    )
}

/// Hands state prepared in the preaccess phase over to `init_peer`, so the
/// backend is looked up once per request.
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
    (data.as_ref().backend.name.as_ref() == name).then_some(data)
}

/// `peer.init` of a `dynamic_balancer` upstream.
pub unsafe extern "C" fn init_peer(
    r: *mut ngx_http_request_t,
    us: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    ffi_guard("init peer", NGX_ERROR as ngx_int_t, || unsafe {
        let u = &mut *(*r).upstream;
        let data = match (upstream_conf(us), zone_of(&*r)) {
            (Some(conf), Some(zone)) => {
                let name = backend_name(r, conf).unwrap_or_default();
                take_stash(r, name).or_else(|| prepare(r, conf, &zone))
            }
            _ => None,
        };
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
            u.peer.free = Some(free_peer);
            u.peer.tries = 1;
            set_session_hooks(u);
            return NGX_OK as ngx_int_t;
        };
        u.peer.tries = data.as_ref().backend.endpoints.len() as ngx_uint_t;
        u.peer.data = data.as_ptr().cast();
        u.peer.get = Some(get_peer);
        u.peer.free = Some(free_peer);
        set_session_hooks(u);
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

unsafe extern "C" fn set_no_session(
    _pc: *mut ngx_peer_connection_t,
    _data: *mut c_void,
) -> ngx_int_t {
    NGX_OK as ngx_int_t
}

unsafe extern "C" fn save_no_session(_pc: *mut ngx_peer_connection_t, _data: *mut c_void) {}

/// `peer.get`: the next untried endpoint in round-robin order.
unsafe extern "C" fn get_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    ffi_guard("get peer", NGX_ERROR as ngx_int_t, || unsafe {
        let pd = &mut *data.cast::<PeerData>();
        let pc = &mut *pc;
        let mut rr = pd.backend.rr.borrow_mut();
        let picked = match rr.pick(&pd.tried) {
            Some(i) => Some(i),
            // Every endpoint was tried, yet nginx grants one more try: it does
            // so when a cached keepalive connection turned out to be closed.
            // Stock round-robin then reconnects too (a single peer ignores its
            // tried bit), so pick again over all endpoints.
            None if pc.tries > 0 => rr.pick(&TriedSet::new()),
            None => None,
        };
        drop(rr);
        let Some(i) = picked else {
            return NGX_BUSY as ngx_int_t;
        };
        pd.tried.insert(i);
        let peer = &pd.backend.endpoints[i];
        pc.sockaddr = peer.sockaddr.as_ptr().cast_mut().cast();
        pc.socklen = peer.sockaddr.len();
        pc.name = (&peer.name as *const ngx::ffi::ngx_str_t).cast_mut();
        NGX_OK as ngx_int_t
    })
}

unsafe extern "C" fn get_no_peer(_pc: *mut ngx_peer_connection_t, _data: *mut c_void) -> ngx_int_t {
    NGX_BUSY as ngx_int_t
}

/// `peer.free`: one attempt fewer remains, as in nginx's round-robin.
unsafe extern "C" fn free_peer(
    pc: *mut ngx_peer_connection_t,
    _data: *mut c_void,
    _state: ngx_uint_t,
) {
    ffi_guard("free peer", (), || unsafe {
        let pc = &mut *pc;
        pc.tries = pc.tries.saturating_sub(1);
    })
}
