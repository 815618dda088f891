//! `dynamic_balancer_ssl_routes listener;` in a stream `server{}`: TLS
//! terminated in `stream{}` (a Gateway's TLS listener in `Terminate`
//! mode) with the listener's certificates from the zone, chosen per
//! handshake by SNI, as the HTTPS servers of `http{}` choose theirs
//! ([`crate::tls::handshake`]).
//!
//! ```nginx
//! server {
//!     listen 8443 ssl;
//!     ssl_certificate     default.pem;   # the fallback; makes `nginx -t` pass
//!     ssl_certificate_key default.pem;
//!     dynamic_balancer_ssl_routes default/gw/8443;
//!     dynamic_balancer_routes     default/gw/8443;   # the backend, by SNI
//!     proxy_pass gateway_stream_balancer;
//! }
//! ```
//!
//! At postconfiguration [`install`] sets OpenSSL's client hello and
//! certificate callbacks on the `SSL_CTX` of every such server. The
//! backend is then chosen by [`crate::stream::routes`] from the SNI of the
//! terminated connection, and the decrypted bytes go to it in the clear.

use std::ffi::{c_int, c_void};
use std::ptr;

use ngx::ffi::{
    ngx_conf_t, ngx_int_t, ngx_stream_ssl_module, ngx_stream_ssl_srv_conf_t, SSL_CTX_set_cert_cb,
    SSL_CTX_set_client_hello_cb, NGX_ERROR, NGX_LOG_EMERG, NGX_OK, SSL,
};
use ngx::ngx_conf_log_error;

use crate::nginx::guard::ffi_guard;
use crate::stream::conf::{current_zone, server_location, srv_conf_in, stream_servers, StreamSrvConf};
use crate::tls::handshake::{scope_sessions, serve_certificate};

/// Sets the callbacks on every stream server with
/// `dynamic_balancer_ssl_routes`. A server with the directive but no TLS
/// (no `ssl_certificate`) or with variables in `ssl_certificate` is
/// refused: its connections would never see the listener's certificates.
///
/// # Safety
/// `cf` is the parsed configuration at the stream postconfiguration, after
/// every stream module merged its server confs.
pub unsafe fn install(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: `cf` is live, its stream block parsed.
    let servers = unsafe { stream_servers((*cf).cycle) };
    // SAFETY: module indexes are set before configuration.
    let ssl_index = unsafe { (*ptr::addr_of!(ngx_stream_ssl_module)).ctx_index };
    for &cscf in servers {
        // SAFETY: each entry is a live server conf whose ctx holds an entry
        // per stream module: ours a `StreamSrvConf`, the ssl module's an
        // `ngx_stream_ssl_srv_conf_t`, both in the configuration pool.
        let (ours, sscf) = unsafe {
            let srv_conf = (*(*cscf).ctx).srv_conf;
            (
                srv_conf_in(srv_conf),
                (*srv_conf.add(ssl_index)).cast::<ngx_stream_ssl_srv_conf_t>().as_ref(),
            )
        };
        let Some(ours) = ours.filter(|c| c.ssl_routes.is_some()) else {
            continue;
        };
        // SAFETY: `cscf` is live (above).
        let at = unsafe { server_location(cscf) };
        let Some(sscf) = sscf.filter(|s| !s.ssl.ctx.is_null()) else {
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "\"dynamic_balancer_ssl_routes\" needs TLS on the server: \"listen ... ssl\" and a fallback \"ssl_certificate\"{at}"
            );
            return NGX_ERROR as ngx_int_t;
        };
        if !sscf.certificate_values.is_null() {
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "\"dynamic_balancer_ssl_routes\" conflicts with variables in \"ssl_certificate\"{at}"
            );
            return NGX_ERROR as ngx_int_t;
        }
        let ours: *mut StreamSrvConf = ours;
        // SAFETY: a live SSL_CTX of this configuration; the server conf
        // lives in the configuration pool as long as the SSL_CTX.
        unsafe {
            SSL_CTX_set_client_hello_cb(sscf.ssl.ctx, Some(client_hello_callback), ours.cast::<c_void>());
            SSL_CTX_set_cert_cb(sscf.ssl.ctx, Some(certificate_callback), ours.cast::<c_void>());
        }
    }
    NGX_OK as ngx_int_t
}

/// The listener name of a server conf [`install`] passed as `arg`.
///
/// # Safety
/// `arg` is null or a `StreamSrvConf` of a configuration that is live.
unsafe fn listener<'a>(arg: *mut c_void) -> Option<&'a [u8]> {
    // SAFETY: this function's contract; the name lives in the same pool.
    let name = unsafe { arg.cast::<StreamSrvConf>().as_ref() }?.ssl_routes?;
    // SAFETY: the directive's argument, in the configuration pool.
    Some(unsafe { std::slice::from_raw_parts(name.data, name.len) })
}

/// OpenSSL's client hello callback: sessions are scoped to the listener
/// (and its client validation) before any is looked up.
unsafe extern "C" fn client_hello_callback(ssl: *mut SSL, _alert: *mut c_int, arg: *mut c_void) -> c_int {
    ffi_guard("stream TLS client hello callback", 0, || {
        // SAFETY: `arg` is what `install` passed, of this cycle's SSL_CTX.
        let Some(name) = (unsafe { listener(arg) }) else {
            return 1;
        };
        // SAFETY: OpenSSL calls it with the handshake's live `SSL`.
        unsafe { scope_sessions(ssl, current_zone().as_ref(), name) }
    })
}

/// OpenSSL's certificate callback: the listener's certificate for the SNI,
/// else the server's static fallback.
unsafe extern "C" fn certificate_callback(ssl: *mut SSL, arg: *mut c_void) -> c_int {
    ffi_guard("stream TLS certificate callback", 0, || {
        // SAFETY: as in `client_hello_callback`.
        let Some(name) = (unsafe { listener(arg) }) else {
            return 1;
        };
        let Some(zone) = current_zone() else { return 1 };
        // SAFETY: OpenSSL calls it with the handshake's live `SSL`.
        unsafe { serve_certificate(ssl, &zone, Some(name)) }
    })
}
