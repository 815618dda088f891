//! `dynamic_balancer_ssl`: TLS certificates from the zone, chosen per
//! handshake by SNI, in place of ingress-nginx's `ssl_certificate_by_lua`.
//!
//! At postconfiguration [`install`] sets OpenSSL's certificate callback on
//! the `SSL_CTX` of every server where the directive is on. OpenSSL calls
//! it once per handshake, after nginx's SNI callback picked the virtual
//! server; it looks the SNI up in the worker's cache ([`crate::tls::cache`]:
//! exact host, `*.parent`, the default `_`) and installs that certificate,
//! chain and key on the connection. With no match, the server's own static
//! `ssl_certificate` stays: the fallback that also makes the configuration
//! valid for `nginx -t`.

use std::ffi::{c_int, c_void};

use foreign_types::{ForeignType, ForeignTypeRef};
use ngx::ffi::{
    ngx_conf_t, ngx_connection_t, ngx_http_core_srv_conf_t, ngx_http_ssl_module, ngx_http_ssl_srv_conf_t, ngx_int_t,
    ngx_ssl_connection_index, SSL_CTX_set_cert_cb, SSL_CTX_set_client_hello_cb, SSL_certs_clear, SSL_get_ex_data,
    SSL_set_session_id_context, SSL_use_cert_and_key, NGX_ERROR, NGX_LOG_EMERG, NGX_LOG_ERR, NGX_OK, SSL,
};
use ngx::http::{HttpModuleMainConf, NgxHttpCoreModule};
use ngx::ngx_log_error;
use openssl::ssl::SslRef;

use lua_compat::certificates::sni_key;

use crate::conf::{MainConf, UpstreamConf};
use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;
use crate::nginx::request::servername;
use crate::shm::zone::Zone;

/// Sets the certificate callback on every TLS server with
/// `dynamic_balancer_ssl on`.
///
/// # Safety
/// `cf` is the parsed configuration at postconfiguration, after the ssl
/// module merged its server confs (it is a static module, merged before us).
pub unsafe fn install(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: `cf` is live for this call (this function's contract).
    let cf_ref = unsafe { &*cf };
    let Some(mcf) = Module::main_conf_mut(cf_ref) else {
        return NGX_ERROR as ngx_int_t;
    };
    let mcf: *mut MainConf = mcf;
    let Some(cmcf) = NgxHttpCoreModule::main_conf_mut(cf_ref) else {
        return NGX_ERROR as ngx_int_t;
    };
    // SAFETY: `servers` is the core module's array of server conf pointers.
    let servers = unsafe {
        std::slice::from_raw_parts(
            cmcf.servers.elts.cast::<*mut ngx_http_core_srv_conf_t>(),
            cmcf.servers.nelts,
        )
    };
    // SAFETY: the ssl module's index is set before configuration.
    let ssl_index = unsafe { ngx_http_ssl_module.ctx_index };
    for &cscf in servers {
        // SAFETY: each entry is a live server conf whose ctx holds an
        // entry per HTTP module: ours is an `UpstreamConf`, the ssl
        // module's an `ngx_http_ssl_srv_conf_t`, both in the conf pool.
        let (ours, sscf) = unsafe {
            let srv_conf = (*(*cscf).ctx).srv_conf;
            (
                (*srv_conf.add(crate::nginx::module::http_ctx_index()))
                    .cast::<UpstreamConf>()
                    .as_mut(),
                (*srv_conf.add(ssl_index)).cast::<ngx_http_ssl_srv_conf_t>().as_ref(),
            )
        };
        let Some(ours) = ours.filter(|c| c.ssl == Some(true)) else {
            continue;
        };
        let Some(sscf) = sscf else { continue };
        // SAFETY: `cscf` is live (above).
        let name = unsafe { (*cscf).server_name };
        let name = String::from_utf8_lossy(name.as_bytes()).into_owned();
        if !sscf.certificate_values.is_null() {
            ngx_log_error!(
                NGX_LOG_EMERG,
                cf_ref.log,
                "\"dynamic_balancer_ssl\" conflicts with variables in \"ssl_certificate\" in server \"{name}\""
            );
            return NGX_ERROR as ngx_int_t;
        }
        if sscf.ssl.ctx.is_null() {
            // Not a TLS server (no ssl_certificate): nothing to serve.
            continue;
        }
        ours.main = std::ptr::NonNull::new(mcf);
        let gateway = ours.ssl_routes.is_some();
        let ours: *mut UpstreamConf = ours;
        // SAFETY: a live SSL_CTX of this configuration; the server conf
        // (and the main conf it points at) live in the conf pool as long
        // as the SSL_CTX (all are this cycle's).
        unsafe { SSL_CTX_set_cert_cb(sscf.ssl.ctx, Some(certificate_callback), ours.cast::<c_void>()) };
        if gateway {
            // SAFETY: as above. A Gateway server scopes its sessions to the
            // listener and its client validation (nginx sets no client
            // hello callback of its own).
            unsafe { SSL_CTX_set_client_hello_cb(sscf.ssl.ctx, Some(client_hello_callback), ours.cast::<c_void>()) };
        }
    }
    NGX_OK as ngx_int_t
}

/// OpenSSL's client hello callback on a Gateway HTTPS server: called
/// before the session lookup, it sets the connection's session id context
/// to its listener's and client validation's
/// ([`crate::tls::client_ca::session_context`]), so that no session
/// resumes across listeners or validations. Returns 1 to go on, 0 to fail
/// the handshake (a validation that cannot be set up: closed). The verify
/// mode and store are not set here but in [`certificate_callback`]:
/// nginx's SNI callback, which runs in between, resets the verify mode to
/// the server's `SSL_CTX`'s (`ngx_http_ssl_servername`).
unsafe extern "C" fn client_hello_callback(ssl: *mut SSL, _alert: *mut c_int, arg: *mut c_void) -> c_int {
    ffi_guard("TLS client hello callback", 0, || {
        // SAFETY: `arg` is a server conf of this cycle (see `install`).
        let Some(scf) = (unsafe { arg.cast::<UpstreamConf>().as_ref() }) else {
            return 1;
        };
        let Some(listener) = &scf.ssl_routes else { return 1 };
        // SAFETY: as in `certificate_callback`.
        let zone = scf.main.and_then(|m| unsafe { m.as_ref() }.zone());
        // SAFETY: `ssl` is live for the handshake (OpenSSL's contract).
        unsafe { scope_sessions(ssl, zone.as_ref(), listener.as_bytes()) }
    })
}

/// Scopes the sessions of a handshake on Gateway listener `name` to the
/// listener and its client validation. 1 to go on, 0 to fail.
///
/// # Safety
/// `ssl` is a live handshake's `SSL`, on the event loop.
pub unsafe fn scope_sessions(ssl: *mut SSL, zone: Option<&Zone>, name: &[u8]) -> c_int {
    let table = zone.and_then(|zone| crate::backends::routes_cache::current(zone, |_| {}));
    let validation = table.as_ref().and_then(|t| {
        t.listener(name)
            .and_then(|l| l.client_validation.as_ref())
            .map(|v| (t, v))
    });
    let ca = match validation {
        None => None,
        Some((table, v)) => match crate::tls::client_ca::for_listener(table, name, v) {
            Ok(ca) => Some(ca),
            Err(_) => return 0,
        },
    };
    let context = crate::tls::client_ca::session_context(name, ca.as_deref());
    // SAFETY: `ssl` is live for the handshake (this function's contract);
    // OpenSSL copies the 32 bytes (its maximum context length).
    let ok = unsafe { SSL_set_session_id_context(ssl, context.as_ptr(), context.len() as u32) };
    if ok == 1 {
        1
    } else {
        0
    }
}

/// OpenSSL's certificate callback: called during a handshake, on the event
/// loop, with the connection's live `SSL` and the server's `UpstreamConf`
/// that [`install`] passed. Returns 1 to go on, 0 to fail the handshake.
unsafe extern "C" fn certificate_callback(ssl: *mut SSL, arg: *mut c_void) -> c_int {
    ffi_guard("TLS certificate callback", 0, || {
        // SAFETY: `arg` is a server conf of this cycle (see `install`),
        // live as long as its SSL_CTX, and only read during handshakes.
        let Some(scf) = (unsafe { arg.cast::<UpstreamConf>().as_ref() }) else {
            return 1;
        };
        // SAFETY: `main` is the cycle's main conf (see `install`), in the
        // same conf pool as the server conf.
        let Some(zone) = scf.main.and_then(|m| unsafe { m.as_ref() }.zone()) else {
            return 1;
        };
        // SAFETY: `ssl` is live for the handshake (OpenSSL's contract).
        unsafe { serve_certificate(ssl, &zone, scf.ssl_routes.as_ref().map(|l| l.as_bytes())) }
    })
}

/// Installs the certificate for a handshake's SNI on `ssl`: one of Gateway
/// listener `listener`'s (after setting up its client validation), or
/// without a listener one of the zone's by host. 1 to go on (with the
/// server's static certificate when none is found), 0 to fail.
///
/// # Safety
/// `ssl` is a live handshake's `SSL`, on the event loop.
pub unsafe fn serve_certificate(ssl: *mut SSL, zone: &Zone, listener: Option<&[u8]>) -> c_int {
    // SAFETY: `ssl` is live for the handshake.
    let sni = unsafe { servername(ssl) }.and_then(sni_key);
    // SAFETY: nginx stores its connection at this index of every SSL
    // it creates; it outlives the handshake.
    let c = unsafe { SSL_get_ex_data(ssl, ngx_ssl_connection_index) }.cast::<ngx_connection_t>();
    // SAFETY: as above; a null connection has no log.
    let log = unsafe { c.as_ref() }.map_or(std::ptr::null_mut(), |c| c.log);
    let on_error = |id: &str, e: &str| {
        if !log.is_null() {
            ngx_log_error!(
                NGX_LOG_ERR,
                log,
                "dynamic_balancer: certificate {id:?} cannot be loaded: {e}"
            );
        }
    };
    let found = match listener {
        // A Gateway's HTTPS server: its listeners' certificates only.
        // The id is borrowed from the table: nothing is copied per
        // handshake.
        Some(listener) => {
            let Some(table) = crate::backends::routes_cache::current(zone, |_| {}) else {
                return 1;
            };
            let Some(l) = table.listener(listener) else {
                return 1;
            };
            // Client certificates are asked for whichever certificate
            // the SNI finds (even the static fallback's).
            if let Some(v) = &l.client_validation {
                let applied = crate::tls::client_ca::for_listener(&table, listener, v).and_then(|ca| {
                    // SAFETY: `ssl` is live for the handshake and not
                    // otherwise borrowed here.
                    crate::tls::client_ca::apply(unsafe { SslRef::from_ptr_mut(ssl.cast()) }, &ca)
                });
                if let Err(e) = applied {
                    // Fail closed: no handshake without the validation
                    // the Gateway asks for.
                    if !log.is_null() {
                        ngx_log_error!(
                            NGX_LOG_ERR,
                            log,
                            "dynamic_balancer: client certificate validation of {:?} cannot be set up: {e}",
                            String::from_utf8_lossy(listener)
                        );
                    }
                    return 0;
                }
            }
            let id = l.certificate(sni.as_deref());
            id.and_then(|id| crate::tls::cache::find_id(zone, id, on_error))
        }
        None => crate::tls::cache::find(zone, sni.as_deref(), on_error),
    };
    let Some(cert) = found else { return 1 };
    // OpenSSL keeps one certificate per key type: without clearing, an
    // RSA certificate from the zone would sit beside the server's static
    // ECDSA one, and the client could be shown either.
    // SAFETY: `ssl` is live; this drops the connection's references to
    // the static certificates, which the SSL_CTX still holds.
    unsafe { SSL_certs_clear(ssl) };
    // SAFETY: `ssl` is live; the leaf, key and chain are live OpenSSL
    // objects the cache holds, and OpenSSL takes its own references.
    let ok = unsafe {
        SSL_use_cert_and_key(
            ssl,
            cert.leaf.as_ptr().cast(),
            cert.key.as_ptr().cast(),
            cert.chain.as_ptr().cast(),
            1,
        )
    };
    if ok != 1 {
        if !log.is_null() {
            ngx_log_error!(
                NGX_LOG_ERR,
                log,
                "dynamic_balancer: SSL_use_cert_and_key failed for SNI {:?}",
                sni.as_deref().unwrap_or("")
            );
        }
        return 0;
    }
    1
}
