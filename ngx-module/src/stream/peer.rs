//! The peer hook of `dynamic_balancer` in a `stream{}` upstream, in place
//! of ingress-nginx's `tcp_udp_balancer.lua`: the same backends, selectors
//! and shared endpoint state as HTTP, per TCP connection or UDP session.
//!
//! `init_peer` finds the session's backend (its server's
//! `dynamic_balancer_backend`, or the upstream's variable) in the worker's
//! cache; a backend that is unknown or has no endpoints fails the init, so
//! nginx closes the client's connection at once (the stream module's
//! 500) with a log line, rather than leaving it hanging. `get_peer` picks
//! an untried endpoint per attempt (`proxy_next_upstream`), `free_peer`
//! records the outcome: passive health, connections, and for ewma the
//! connect time (a stream session has no response time to learn from).
//!
//! Canary rules and sticky cookies are HTTP notions and do not apply; a
//! `chash` key is rendered from stream variables (`$remote_addr`, say).

use std::ffi::c_void;
use std::rc::Rc;

use lua_compat::selection::{select, Attempt};
use lua_compat::tried::TriedSet;
use ngx::ffi::{
    ngx_int_t, ngx_peer_connection_t, ngx_pool_cleanup_add, ngx_stream_session_t, ngx_stream_upstream_srv_conf_t,
    ngx_uint_t, NGX_BUSY, NGX_ERROR, NGX_LOG_ERR, NGX_LOG_WARN, NGX_OK,
};
use ngx::ngx_log_error;

use crate::backends::worker_cache::{lookup, WorkerBackend};
use crate::http::peer::{begin_attempt, end_attempt, now_ms, Live};
use crate::nginx::guard::ffi_guard;
use crate::stream::backend_tls::TlsRoute;
use crate::stream::conf::{backend_name, current_zone, srv_conf_in, stream_upstream_conf, variable};

/// A session's balancing state, owned by its pool (freed by a cleanup).
struct StreamPeer {
    backend: Rc<WorkerBackend>,
    tried: TriedSet,
    session: *mut ngx_stream_session_t,
    /// Set when the routes chose a backend reached over TLS.
    tls: Option<TlsRoute>,
    /// The rendered hash key, computed at the first attempt.
    key: Option<Vec<u8>>,
    /// The endpoint of the attempt in progress.
    current: Option<usize>,
    /// The upstream's `proxy_protocol=off`.
    no_proxy_protocol: bool,
}

/// `peer.init` of a stream `dynamic_balancer` upstream. nginx calls it
/// with a live session whose `upstream` is set, and that upstream's conf.
pub unsafe extern "C" fn init_peer(s: *mut ngx_stream_session_t, us: *mut ngx_stream_upstream_srv_conf_t) -> ngx_int_t {
    ffi_guard("stream init peer", NGX_ERROR as ngx_int_t, || {
        // SAFETY: nginx calls peer.init with a live session on the event
        // loop; its connection and log outlive it.
        let log = unsafe { (*(*s).connection).log };
        // SAFETY: `us` is the live upstream conf nginx passed.
        let Some(conf) = (unsafe { stream_upstream_conf(us) }) else {
            return NGX_ERROR as ngx_int_t;
        };
        let Some(zone) = current_zone() else {
            ngx_log_error!(NGX_LOG_ERR, log, "dynamic_balancer: the http{{}} zone is not available");
            return NGX_ERROR as ngx_int_t;
        };
        // SAFETY: a live session's `srv_conf` is its server's array.
        let listener = unsafe { srv_conf_in((*s).srv_conf) }.and_then(|c| c.routes);
        let routed;
        let mut tls = None;
        let name = if let Some(listener) = listener {
            // SAFETY: the directive's argument lives in the configuration
            // pool, which outlives every session.
            let listener = unsafe { std::slice::from_raw_parts(listener.data, listener.len) };
            // SAFETY: `s` is live, on its worker's event loop.
            routed = unsafe { super::routes::backend(s, &zone, listener, log) };
            let Some(r) = routed.as_ref() else {
                return NGX_ERROR as ngx_int_t;
            };
            if r.tls {
                // SAFETY: `s` is live, in peer.init, not yet connecting.
                if !unsafe { super::backend_tls::enter(s, r.route.as_deref().unwrap_or_default(), log) } {
                    return NGX_ERROR as ngx_int_t;
                }
                tls = Some(TlsRoute {
                    table: r.table.clone(),
                    listener: listener.to_vec(),
                });
            }
            r.name.as_bytes()
        } else {
            // SAFETY: `s` is live, on its worker's event loop.
            let Some(name) = (unsafe { backend_name(s, conf) }).filter(|n| !n.is_empty()) else {
                ngx_log_error!(
                    NGX_LOG_ERR,
                    log,
                    "dynamic_balancer: no backend named for this server (dynamic_balancer_backend or the upstream's variable); closing the connection"
                );
                return NGX_ERROR as ngx_int_t;
            };
            name
        };
        let Some(backend) = lookup(&zone, name).filter(|b| !b.endpoints.is_empty()) else {
            ngx_log_error!(
                NGX_LOG_WARN,
                log,
                "dynamic_balancer: no endpoints for backend \"{}\"; closing the connection",
                String::from_utf8_lossy(name).escape_debug()
            );
            return NGX_ERROR as ngx_int_t;
        };
        let tries = backend.endpoints.len();
        let set_session = if tls.is_some() { set_tls_session } else { set_no_session };
        let state = Box::into_raw(Box::new(StreamPeer {
            backend,
            tried: TriedSet::new(),
            session: s,
            tls,
            key: None,
            current: None,
            no_proxy_protocol: conf.no_proxy_protocol,
        }));
        // SAFETY: the session's connection pool is live until the session
        // ends; the cleanup frees the state with it.
        let cleanup = unsafe { ngx_pool_cleanup_add((*(*s).connection).pool, 0) };
        if cleanup.is_null() {
            // SAFETY: `state` came from Box::into_raw above and nothing
            // else holds it.
            drop(unsafe { Box::from_raw(state) });
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: `cleanup` is the pool's new, non-null cleanup entry.
        unsafe {
            (*cleanup).handler = Some(drop_peer);
            (*cleanup).data = state.cast();
        }
        // SAFETY: nginx set `s->upstream` before calling peer.init; it is a
        // separate allocation that nothing else uses during the call.
        let u = unsafe { &mut *(*s).upstream };
        u.peer.data = state.cast();
        u.peer.get = Some(get_peer);
        u.peer.free = Some(free_peer);
        u.peer.tries = tries as ngx_uint_t;
        u.peer.set_session = Some(set_session);
        u.peer.save_session = Some(save_no_session);
        NGX_OK as ngx_int_t
    })
}

/// Pool cleanup: frees the session's state. nginx calls it once, when the
/// session's pool is destroyed, with the pointer `init_peer` registered.
unsafe extern "C" fn drop_peer(data: *mut c_void) {
    ffi_guard("stream peer cleanup", (), || {
        // SAFETY: `data` is the Box::into_raw of init_peer, freed only here.
        drop(unsafe { Box::from_raw(data.cast::<StreamPeer>()) });
    })
}

/// `peer.get`: one endpoint for this attempt. nginx calls it with the live
/// peer connection and the `data` `init_peer` set.
unsafe extern "C" fn get_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    ffi_guard("stream get peer", NGX_ERROR as ngx_int_t, || {
        let state = data.cast::<StreamPeer>();
        // SAFETY: `data` is the session's live StreamPeer (init_peer); read
        // without a borrow, so variable get handlers may run meanwhile.
        let (session, backend, has_key) =
            unsafe { ((*state).session, Rc::clone(&(*state).backend), (*state).key.is_some()) };
        let rendered = match backend.selector.hash_key() {
            // SAFETY: the session is live while nginx connects for it.
            Some(template) if !has_key => Some(template.render(|name| unsafe { variable(session, name) })),
            _ => None,
        };
        // SAFETY: no other reference to the state is live now.
        let pd = unsafe { &mut *state };
        if rendered.is_some() {
            pd.key = rendered;
        }
        let now = now_ms();
        let attempt = Attempt {
            hash_key: pd.key.as_deref().unwrap_or_default(),
            cookie: None,
            retry: !pd.tried.is_empty(),
            now_ms: now,
        };
        let live = Live {
            backend: &backend,
            now_ms: now,
        };
        let Some(pick) = select(&backend.selector, &attempt, &live, &pd.tried) else {
            return NGX_BUSY as ngx_int_t;
        };
        let i = pick.endpoint;
        pd.tried.insert(i);
        pd.current = Some(i);
        if pd.no_proxy_protocol {
            // nginx set `u->proxy_protocol` from the server just before it
            // asked for a peer, and reads it once connected.
            // SAFETY: the session and its upstream are live while nginx
            // connects for it; nothing else borrows the upstream now.
            unsafe { (*(*session).upstream).set_proxy_protocol(0) };
        }
        // SAFETY: nginx passes its live `u->peer`, untouched during the hook.
        // The endpoint lives as long as `backend`, which the state holds
        // until the session's pool is destroyed, after the connection.
        begin_attempt(unsafe { &mut *pc }, &backend, i, now);
        NGX_OK as ngx_int_t
    })
}

/// `peer.free`: records the attempt in the shared endpoint state; one try
/// fewer remains. nginx calls it with the live peer connection and the
/// `data` `init_peer` set.
unsafe extern "C" fn free_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void, state: ngx_uint_t) {
    ffi_guard("stream free peer", (), || {
        // SAFETY: nginx passes its live `u->peer`, untouched during the hook.
        let pc = unsafe { &mut *pc };
        pc.tries = pc.tries.saturating_sub(1);
        // SAFETY: `data` is the session's live StreamPeer, not otherwise
        // borrowed during this call.
        let Some(pd) = (unsafe { data.cast::<StreamPeer>().as_mut() }) else {
            return;
        };
        let Some(i) = pd.current.take() else { return };
        if let Some(slot) = end_attempt(&pd.backend, i, state) {
            // SAFETY: the session is live while its peer is freed; its
            // upstream's `state` is null or the live entry for this attempt.
            let connect = unsafe { (*(*pd.session).upstream).state.as_ref() }.map(|st| st.connect_time);
            if let Some(ms) = connect.filter(|&ms| ms != ngx::ffi::ngx_msec_t::MAX) {
                slot.record_rtt(ms as f64 / 1000.0, now_ms() as f64 / 1000.0);
            }
        }
    })
}

/// `peer.set_session`: stream `proxy_ssl` calls it on every TLS connection
/// to an upstream; endpoints change at run time, so no session is cached.
/// A connection to a Gateway's TLS backend gets [`set_tls_session`]
/// instead.
unsafe extern "C" fn set_no_session(_pc: *mut ngx_peer_connection_t, _data: *mut c_void) -> ngx_int_t {
    NGX_OK as ngx_int_t
}

/// `peer.set_session` of a connection to a TLS backend (the routes chose
/// one and [`super::backend_tls::enter`] moved the session onto its
/// server's twin): nginx calls it with the live peer connection, its `SSL`
/// created and not handshaken, and the session's [`StreamPeer`]. NGX_ERROR
/// closes the client's connection.
unsafe extern "C" fn set_tls_session(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    ffi_guard("stream backend TLS", NGX_ERROR as ngx_int_t, || {
        // SAFETY: `data` is the session's live StreamPeer (init_peer
        // installs this hook only with it); `pc` is nginx's live
        // `u->peer`, whose connection has its `SSL` (nginx calls the hook
        // right after ngx_ssl_create_connection).
        let (state, ssl) = unsafe { (&*data.cast::<StreamPeer>(), (*(*(*pc).connection).ssl).connection) };
        // SAFETY: the session is live while nginx connects for it.
        let log = unsafe { (*(*state.session).connection).log };
        let Some(route) = &state.tls else {
            ngx_log_error!(
                NGX_LOG_ERR,
                log,
                "dynamic_balancer: backend TLS: no route chose a TLS backend"
            );
            return NGX_ERROR as ngx_int_t;
        };
        // SAFETY: `ssl` is the new connection's live `SSL`, used by nothing
        // else during the call; `log` is live.
        match unsafe { super::backend_tls::secure(ssl, route, &state.backend.name, log) } {
            Ok(()) => NGX_OK as ngx_int_t,
            Err(e) => {
                ngx_log_error!(NGX_LOG_ERR, log, "dynamic_balancer: backend TLS: {}", e);
                NGX_ERROR as ngx_int_t
            }
        }
    })
}

/// `peer.save_session`: see [`set_no_session`].
unsafe extern "C" fn save_no_session(_pc: *mut ngx_peer_connection_t, _data: *mut c_void) {}
