//! The stream module's configuration as sessions read it: one struct that
//! nginx allocates per `stream{}` `server{}` and `upstream{}` block, and the
//! session-time readers (`stream_upstream_conf`, `backend_name`, the zone).
//! The directives that fill it are in [`crate::stream::directives`].
//!
//! Stream upstreams have no zone of their own: they route by the backends
//! of the `http{}` block's `dynamic_balancer_zone`, so one API write
//! serves HTTP and TCP/UDP alike.

use ngx::ffi::{
    ngx_cycle_t, ngx_str_t, ngx_stream_conf_ctx_t, ngx_stream_core_main_conf_t, ngx_stream_core_module,
    ngx_stream_core_srv_conf_t, ngx_stream_get_indexed_variable, ngx_stream_get_variable, ngx_stream_module,
    ngx_stream_session_t, ngx_stream_upstream_srv_conf_t,
};
use ngx::http::HttpModuleConfExt;

use crate::conf::{MainConf, UNKNOWN};
use crate::nginx::module::stream_ctx_index;
use crate::nginx::variables::{found_bytes, hash_key_lowercase};
use crate::shm::zone::Zone;

/// `stream{}` `server{}` and `upstream{}` level.
pub struct StreamSrvConf {
    /// In an `upstream{}`: `dynamic_balancer` is on there.
    pub enabled: bool,
    /// Set by our `init_upstream`; still false after configuration means a
    /// later `hash`, `least_conn` or `random` replaced the hook.
    pub initialized: bool,
    /// In an `upstream{}`: the index of `dynamic_balancer $variable`'s
    /// variable, [`UNKNOWN`] without one.
    pub variable: usize,
    /// In an `upstream{}`: `proxy_protocol=off`, connections this upstream
    /// makes never send the PROXY protocol, whatever the server's
    /// `proxy_protocol` says (see [`crate::stream::directives`]).
    pub no_proxy_protocol: bool,
    /// In a `server{}` (or inherited from `stream{}`):
    /// `dynamic_balancer_backend name;`.
    pub backend: Option<ngx_str_t>,
    /// In a `server{}`: `dynamic_balancer_routes listener;` (not
    /// inherited).
    pub routes: Option<ngx_str_t>,
    /// In a `server{}` with `listen ... ssl`:
    /// `dynamic_balancer_ssl_routes listener;`, whose certificates the
    /// handshakes get (see [`crate::stream::tls`]; not inherited).
    pub ssl_routes: Option<ngx_str_t>,
    /// In a `server{}` with `proxy_ssl on`:
    /// `dynamic_balancer_backend_tls listener;`, the server whose proxy
    /// settings `listener`'s connections to TLS backends take (see
    /// [`crate::stream::backend_tls`]; not inherited).
    pub backend_tls: Option<ngx_str_t>,
    /// In a `server{}` with `dynamic_balancer_routes`: the `srv_conf`
    /// array of the server naming the same listener in
    /// `dynamic_balancer_backend_tls` (null without one), linked at
    /// postconfiguration.
    pub backend_tls_server: *mut *mut std::ffi::c_void,
}

impl Default for StreamSrvConf {
    fn default() -> Self {
        StreamSrvConf {
            enabled: false,
            initialized: false,
            variable: UNKNOWN,
            no_proxy_protocol: false,
            backend: None,
            routes: None,
            ssl_routes: None,
            backend_tls: None,
            backend_tls_server: std::ptr::null_mut(),
        }
    }
}

/// Our conf in a `srv_conf` array of the stream block (a session's, a
/// server's or an upstream's).
///
/// # Safety
/// `srv_conf` is a live stream `srv_conf` array, which has an entry per
/// stream module; ours is the `StreamSrvConf` that `create_srv_conf`
/// allocated in the configuration pool.
pub unsafe fn srv_conf_in(srv_conf: *mut *mut std::ffi::c_void) -> Option<&'static mut StreamSrvConf> {
    if srv_conf.is_null() {
        return None;
    }
    // SAFETY: this function's contract.
    unsafe { (*srv_conf.add(stream_ctx_index())).cast::<StreamSrvConf>().as_mut() }
}

/// The `server{}` blocks of `cycle`'s `stream{}` (none without one).
///
/// # Safety
/// `cycle` is live and its `stream{}` block (if any) parsed.
pub unsafe fn stream_servers(cycle: *const ngx_cycle_t) -> &'static [*mut ngx_stream_core_srv_conf_t] {
    // SAFETY: the cycle's stream slot is null or the `stream{}` block's
    // conf ctx, whose core main conf lists the servers.
    unsafe {
        let slot = *(*cycle).conf_ctx.add((*std::ptr::addr_of!(ngx_stream_module)).index);
        let Some(ctx) = slot.cast::<ngx_stream_conf_ctx_t>().as_ref() else {
            return &[];
        };
        let index = (*std::ptr::addr_of!(ngx_stream_core_module)).ctx_index;
        let Some(cmcf) = (*ctx.main_conf.add(index))
            .cast::<ngx_stream_core_main_conf_t>()
            .as_ref()
        else {
            return &[];
        };
        cmcf.servers.as_slice::<*mut ngx_stream_core_srv_conf_t>()
    }
}

/// " (server at file:line)" for messages about server `cscf`, empty when
/// nginx kept no file name.
///
/// # Safety
/// `cscf` is a live server conf of a configuration being set up.
pub unsafe fn server_location(cscf: *const ngx_stream_core_srv_conf_t) -> String {
    // SAFETY: this function's contract.
    let (file, line) = unsafe { ((*cscf).file_name, (*cscf).line) };
    if file.is_null() {
        return String::new();
    }
    // SAFETY: nginx keeps the file name NUL-terminated in the pool.
    let name = unsafe { std::ffi::CStr::from_ptr(file.cast()) };
    format!(" (server at {}:{line})", name.to_string_lossy())
}

/// Our settings for stream upstream `us`, when `dynamic_balancer` is on.
///
/// # Safety
/// `us` is a live stream upstream srv conf.
pub unsafe fn stream_upstream_conf(us: *const ngx_stream_upstream_srv_conf_t) -> Option<&'static StreamSrvConf> {
    // SAFETY: `us` is live; an explicit upstream's `srv_conf` is its block's
    // array (null for an implicit `proxy_pass host:port`).
    let conf = unsafe { srv_conf_in((*us).srv_conf) }?;
    conf.enabled.then_some(&*conf)
}

/// The backend of session `s`: its server's `dynamic_balancer_backend`,
/// else the upstream's variable.
///
/// # Safety
/// `s` is a live session, on its worker's event loop.
pub unsafe fn backend_name<'s>(s: *mut ngx_stream_session_t, upstream: &StreamSrvConf) -> Option<&'s [u8]> {
    // SAFETY: a live session's `srv_conf` is its server's array.
    if let Some(name) = unsafe { srv_conf_in((*s).srv_conf) }.and_then(|c| c.backend) {
        // SAFETY: the directive's argument lives in the configuration pool,
        // which outlives every session.
        return Some(unsafe { std::slice::from_raw_parts(name.data, name.len) });
    }
    if upstream.variable == UNKNOWN {
        return None;
    }
    // SAFETY: `s` is live; the index was obtained from this configuration.
    let v = unsafe { ngx_stream_get_indexed_variable(s, upstream.variable) };
    // SAFETY: a non-null result is the session's variable slot, filled by
    // nginx, its bytes in the session's pool or the configuration.
    unsafe { v.as_ref().and_then(|v| found_bytes(v)) }
}

/// The `http{}` block's main conf of `cycle`, if it has one.
///
/// # Safety
/// `cycle` is a live, configured cycle.
pub unsafe fn http_main_conf(cycle: *const ngx_cycle_t) -> Option<&'static MainConf> {
    // SAFETY: `cycle` is live and configured; our slot in its http main
    // confs holds the `MainConf` create_main_conf made, in the cycle's pool.
    unsafe {
        (*cycle)
            .http_main_conf_unchecked::<MainConf>(crate::nginx::module::Module::module_ref())
            .map(|p| p.as_ref())
    }
}

/// The zone sessions route by: the running cycle's `http{}` zone.
pub fn current_zone() -> Option<Zone> {
    // SAFETY: `ngx_cycle` is the running, configured cycle on the event loop.
    unsafe { http_main_conf(ngx::ffi::ngx_cycle) }?.zone()
}

/// The value of stream variable `name` for session `s`.
///
/// # Safety
/// `s` is a live session on its event loop.
pub unsafe fn variable<'s>(s: *mut ngx_stream_session_t, name: &str) -> Option<&'s [u8]> {
    let lower = name.to_ascii_lowercase();
    let mut key_name = ngx_str_t {
        len: lower.len(),
        data: lower.as_ptr().cast_mut(),
    };
    // SAFETY: `s` is live; nginx reads `key_name` only during the call.
    let v = unsafe { ngx_stream_get_variable(s, &mut key_name, hash_key_lowercase(lower.as_bytes())) };
    // SAFETY: a non-null result is a value nginx filled, its bytes in the
    // session's pool or the configuration, which outlive the session.
    unsafe { v.as_ref().and_then(|v| found_bytes(v)) }
}
