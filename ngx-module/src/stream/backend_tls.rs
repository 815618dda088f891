//! `dynamic_balancer_backend_tls listener;` in a stream `server{}`: TLS
//! from a stream server to the backends a BackendTLSPolicy covers, chosen
//! per connection, with the policy applied per connection.
//!
//! nginx's stream `proxy_ssl` is one flag per server, read when nginx
//! connects; but the connections of one Gateway listener go in the clear
//! to one backend and over TLS to the next (another route, or a Service
//! with a policy), and policies change with no reload. So the controller
//! renders, beside each routing server, a twin: the same proxy settings
//! and access log, plus `proxy_ssl on`, listening on a private unix
//! socket that nothing connects to.
//!
//! ```nginx
//! server {                                   # the listener
//!     listen 8443 ssl;  ...
//!     dynamic_balancer_routes default/gw/8443;
//!     proxy_pass gateway_stream_balancer;
//! }
//! server {                                   # its twin
//!     listen unix:/run/nginx/backend-tls-0.sock;
//!     proxy_ssl on;
//!     dynamic_balancer_backend_tls default/gw/8443;
//!     proxy_pass gateway_stream_balancer;
//! }
//! ```
//!
//! When the routes send a connection to a backend the table says is
//! reached over TLS, the peer hook ([`crate::stream::peer`]) moves the
//! session onto the twin's configuration ([`enter`]) before nginx
//! connects: what nginx's proxy reads from then on (`proxy_ssl`, its
//! `SSL_CTX`, the timeouts, the log) is the twin's. nginx then calls
//! `peer.set_session` on the new connection before its handshake, and
//! [`set_session`] applies the policy as HTTP's backend TLS does
//! ([`crate::tls::upstream::secure`]): the policy's SNI, its CA bundle
//! and names checked by a verify callback that fails the handshake, the
//! Gateway's client certificate.
//!
//! [`link`] checks the twins at configuration time: `proxy_ssl on`,
//! `proxy_ssl_session_reuse on` (nginx's default; without it nginx never
//! calls `set_session` and the connection would go unverified) and
//! `proxy_ssl_verify off` (the policy verifies; nginx's own check would
//! use `proxy_ssl_trusted_certificate`), and one twin per listener.

use std::ffi::{c_void, CStr};
use std::mem::offset_of;
use std::rc::Rc;

use ngx::ffi::{
    ngx_conf_set_flag_slot, ngx_conf_t, ngx_cycle_t, ngx_flag_t, ngx_int_t, ngx_log_t, ngx_module_t, ngx_str_t,
    ngx_stream_conf_ctx_t, ngx_stream_session_t, NGX_ERROR, NGX_LOG_EMERG, NGX_LOG_ERR, NGX_OK, SSL,
};
use ngx::{ngx_conf_log_error, ngx_log_error};

use lua_compat::routes::matcher::Compiled;

use crate::stream::conf::{current_zone, server_location, srv_conf_in, stream_servers};

/// What a session sent to a TLS backend keeps for [`set_session`]: the
/// table it was routed by (a newer table may have changed the policy;
/// the connection follows the one that chose its backend) and its
/// listener, whose client certificate backends may ask for.
pub struct TlsRoute {
    pub table: Rc<Compiled>,
    pub listener: Vec<u8>,
}

/// Links every server with `dynamic_balancer_routes L` to the server with
/// `dynamic_balancer_backend_tls L`, after checking the latter's proxy
/// settings (see the module's documentation). NGX_ERROR fails the
/// configuration with the reason logged.
///
/// # Safety
/// `cf` is the parsed configuration at the stream postconfiguration, after
/// every stream module merged its server confs.
pub unsafe fn link(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: `cf` is live, its stream block parsed.
    let servers = unsafe { stream_servers((*cf).cycle) };
    let mut twins: Vec<(&[u8], *mut *mut c_void)> = Vec::new();
    for &cscf in servers {
        // SAFETY: each entry is a live server conf whose ctx holds an entry
        // per stream module, ours a `StreamSrvConf`.
        let srv_conf = unsafe { (*(*cscf).ctx).srv_conf };
        // SAFETY: as above.
        let Some(listener) = unsafe { srv_conf_in(srv_conf) }.and_then(|c| c.backend_tls) else {
            continue;
        };
        // SAFETY: the directive's argument, in the configuration pool.
        let listener = unsafe { bytes(listener) };
        // SAFETY: `cscf` is live (above).
        let at = unsafe { server_location(cscf) };
        let name = String::from_utf8_lossy(listener);
        if twins.iter().any(|(l, _)| *l == listener) {
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "\"dynamic_balancer_backend_tls {name}\" is duplicate: one server per listener{at}"
            );
            return NGX_ERROR as ngx_int_t;
        }
        for (directive, wanted) in [
            ("proxy_ssl", true),
            ("proxy_ssl_session_reuse", true),
            ("proxy_ssl_verify", false),
        ] {
            // SAFETY: `cf`'s cycle is live with its modules; `srv_conf` is
            // a merged server's array.
            let value = unsafe { proxy_flag((*cf).cycle, srv_conf, directive) };
            if value != Some(wanted) {
                ngx_conf_log_error!(
                    NGX_LOG_EMERG,
                    cf,
                    "\"dynamic_balancer_backend_tls\" needs \"{directive} {}\" in its server{at}",
                    if wanted { "on" } else { "off" }
                );
                return NGX_ERROR as ngx_int_t;
            }
        }
        twins.push((listener, srv_conf));
    }
    for &cscf in servers {
        // SAFETY: as above.
        let Some(conf) = (unsafe { srv_conf_in((*(*cscf).ctx).srv_conf) }) else {
            continue;
        };
        let Some(listener) = conf.routes else { continue };
        // SAFETY: the directive's argument, in the configuration pool.
        let listener = unsafe { bytes(listener) };
        if let Some((_, twin)) = twins.iter().find(|(l, _)| *l == listener) {
            conf.backend_tls_server = *twin;
        }
    }
    NGX_OK as ngx_int_t
}

/// Moves session `s` onto its server's twin ([`link`]) for a connection
/// to a TLS backend. False (logged) when the server has none: the
/// connection is then closed rather than sent in the clear.
///
/// # Safety
/// `s` is a live session inside its upstream's `peer.init`, before nginx
/// connects; `log` is its log.
pub unsafe fn enter(s: *mut ngx_stream_session_t, route: &str, log: *mut ngx_log_t) -> bool {
    // SAFETY: a live session's `srv_conf` is its server's array.
    let twin = unsafe { srv_conf_in((*s).srv_conf) }.map_or(std::ptr::null_mut(), |c| c.backend_tls_server);
    if twin.is_null() {
        ngx_log_error!(
            NGX_LOG_ERR,
            log,
            "dynamic_balancer: route {} sends this connection to a backend reached over TLS, and this server has no \"dynamic_balancer_backend_tls\" twin; closing it",
            route.escape_debug()
        );
        return false;
    }
    // SAFETY: the twin's array lives in the configuration pool as long as
    // the session's own; nginx reads module confs through `s->srv_conf`
    // on every use, and the twin's has an entry for every stream module.
    unsafe { (*s).srv_conf = twin };
    true
}

/// Applies `route`'s policy for `backend` to a connection [`enter`] moved,
/// before its handshake (the stream peer's `set_session` hook calls it):
/// HTTP's backend TLS ([`crate::tls::upstream::secure`]) with the
/// listener's client certificate. An error closes the client's
/// connection: a connection to a TLS backend is never made unverified.
///
/// # Safety
/// `ssl` is the new connection's live `SSL`, not yet handshaken, used by
/// nothing else during the call; `log` is live.
pub unsafe fn secure(ssl: *mut SSL, route: &TlsRoute, backend: &[u8], log: *mut ngx_log_t) -> Result<(), String> {
    let zone = current_zone().ok_or("the http{} zone is not available")?;
    let client_certificate = route
        .table
        .listener(&route.listener)
        .and_then(|l| l.backend_client_certificate.as_deref());
    let name = String::from_utf8_lossy(backend);
    // SAFETY: this function's contract.
    unsafe { crate::tls::upstream::secure(ssl.cast(), &route.table, &name, client_certificate, &zone, log) }
}

/// The value of flag directive `directive` of nginx's stream proxy module
/// in server conf array `srv_conf`, read where the directive's own setter
/// (`ngx_conf_set_flag_slot`) stores it. `None` when the module or a flag
/// of that name is missing.
///
/// # Safety
/// `cycle` is live, its modules set; `srv_conf` is a merged stream server's
/// conf array of that cycle.
unsafe fn proxy_flag(cycle: *const ngx_cycle_t, srv_conf: *mut *mut c_void, directive: &str) -> Option<bool> {
    // SAFETY: this function's contract: `modules` has `modules_n` entries.
    let modules = unsafe { std::slice::from_raw_parts((*cycle).modules, (*cycle).modules_n) };
    let proxy: &ngx_module_t = modules.iter().find_map(|&m| {
        // SAFETY: each entry is a live module of the cycle.
        let m = unsafe { &*m };
        // SAFETY: a module's name is null or NUL-terminated static data.
        let named = !m.name.is_null() && unsafe { CStr::from_ptr(m.name) } == c"ngx_stream_proxy_module";
        named.then_some(m)
    })?;
    let mut cmd = proxy.commands;
    // SAFETY: a module's commands end with an entry whose name is empty.
    while !cmd.is_null() && unsafe { (*cmd).name.len } != 0 {
        // SAFETY: `cmd` is within the array (above).
        let c = unsafe { &*cmd };
        // SAFETY: the name's bytes live in the module's static data.
        if unsafe { bytes(c.name) } == directive.as_bytes() {
            let srv_offset = offset_of!(ngx_stream_conf_ctx_t, srv_conf) as ngx::ffi::ngx_uint_t;
            // nginx's own setter, resolved from the binary: one address.
            let flag_setter = ngx_conf_set_flag_slot as *const () as usize;
            if c.set.map(|f| f as usize) != Some(flag_setter) || c.conf != srv_offset {
                return None;
            }
            // SAFETY: the proxy module's entry of a merged server's array
            // is its conf, where `ngx_conf_set_flag_slot` keeps this flag
            // at the command's offset.
            let flag = unsafe {
                let conf = (*srv_conf.add(proxy.ctx_index)).cast::<u8>();
                conf.add(c.offset).cast::<ngx_flag_t>().read()
            };
            return Some(flag == 1);
        }
        // SAFETY: not at the terminating entry yet, so the next is in bounds.
        cmd = unsafe { cmd.add(1) };
    }
    None
}

/// The bytes of a configuration string.
///
/// # Safety
/// `s` points at `len` live bytes for the returned lifetime.
unsafe fn bytes<'a>(s: ngx_str_t) -> &'a [u8] {
    if s.len == 0 {
        return &[];
    }
    // SAFETY: this function's contract.
    unsafe { std::slice::from_raw_parts(s.data, s.len) }
}
