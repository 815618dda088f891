//! TLS to backends (Gateway API BackendTLSPolicy), set per connection from
//! the route table, so a policy, its CA bundle or a Gateway's client
//! certificate changes with no reload.
//!
//! nginx's `proxy_ssl_name`, `proxy_ssl_verify` and
//! `proxy_ssl_trusted_certificate` are per location and read files at
//! configuration time. Here the route handler sends a request whose
//! backend has a policy on to the `@tls` (or `@grpcs`) location, whose
//! `proxy_pass https://` gives it an upstream TLS connection, and nginx
//! calls the peer's `set_session` hook on that connection before its
//! handshake ([`init_peer`] installs [`set_session`] in place of the
//! balancer's no-op). The hook, from the table the request was routed by:
//!
//! - sends the policy's hostname as SNI;
//! - verifies the backend's chain against the policy's CA bundle (or the
//!   system's CAs), with a verify callback that fails the handshake on a
//!   bad chain, and then checks the leaf's names: the hostname, or with
//!   `subjectAltNames` any one of them (host names as certificate host
//!   names match, URIs exactly). A failure is a connection error (the
//!   request gets 502, or the next endpoint under the rule's retries);
//! - shows the Gateway's client certificate (`spec.tls.backend`), when
//!   the listener has one, to a backend that asks.
//!
//! Sessions are not resumed (the balancer's `save_session` keeps none),
//! and the TLS upstreams have no `keepalive`: a connection verified under
//! one policy is never handed to a request under another, even when two
//! Services with different policies share their Pods.
//!
//! Each worker parses a bundle once: stores are kept by bundle for the
//! table they were built from, and carried over to the next table.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::rc::{Rc, Weak};
use std::sync::OnceLock;

use foreign_types::ForeignTypeRef;
use ngx::ffi::{
    ngx_http_request_t, ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_log_t, ngx_peer_connection_t,
    SSL_use_cert_and_key, NGX_ERROR, NGX_LOG_ERR, NGX_OK,
};
use ngx::http::Request;
use ngx::ngx_log_error;
use openssl::ssl::{Ssl, SslRef, SslVerifyMode};
use openssl::x509::store::{X509Store, X509StoreBuilder};
use openssl::x509::{X509StoreContext, X509StoreContextRef, X509VerifyResult};

use lua_compat::routes::matcher::Compiled;
use lua_compat::routes::{BackendTls, SubjectAltName};

use crate::conf::zone_of;
use crate::http::gateway_matched::matched;
use crate::http::request_ctx::PeerData;
use crate::nginx::guard::ffi_guard;
use crate::shm::zone::Zone;

/// The longest backend chain accepted: the leaf, up to eight
/// intermediates, and the trusted CA.
pub const VERIFY_DEPTH: c_int = 8;

/// `peer.init` of every `dynamic_balancer` upstream: the balancer's, and
/// for a Gateway request connecting over TLS, [`set_session`]. nginx calls
/// it with a live request whose `upstream` is set, and that upstream's srv
/// conf.
pub unsafe extern "C" fn init_peer(r: *mut ngx_http_request_t, us: *mut ngx_http_upstream_srv_conf_t) -> ngx_int_t {
    // SAFETY: this function's contract is the balancer's.
    let rc = unsafe { crate::http::peer::init_peer(r, us) };
    ffi_guard("backend TLS init peer", NGX_ERROR as ngx_int_t, || {
        if rc != NGX_OK as ngx_int_t {
            return rc;
        }
        // SAFETY: nginx calls peer.init with a live request whose
        // `upstream` is set; nothing else uses them during the call.
        let (req, u) = unsafe { (Request::from_ngx_http_request(r), &mut *(*r).upstream) };
        // A Gateway request (its main request was routed by a rule) to an
        // `https://` upstream: the connection's TLS is the policy's. An
        // Ingress `backend-protocol: HTTPS` request keeps nginx's own
        // `proxy_ssl_*` settings.
        // SAFETY: a request's `main` is its live main request.
        let main = unsafe { Request::from_ngx_http_request(req.as_ref().main) };
        let Some(m) = matched(main) else { return rc };
        if u.peer.data.is_null() {
            return rc;
        }
        if u.ssl() != 0 {
            u.peer.set_session = Some(set_session);
        } else {
            // A second line: a routed request going out in the clear to a
            // backend the table says is reached over TLS is refused.
            // SAFETY: init_peer leaves `data` as the request's PeerData.
            let state = unsafe { &*u.peer.data.cast::<PeerData>() };
            if m.table().is_tls_backend(&state.backend.name) {
                ngx_log_error!(
                    NGX_LOG_ERR,
                    req.log(),
                    "dynamic_balancer: backend TLS: a request to a TLS backend reached a plain-text upstream"
                );
                return NGX_ERROR as ngx_int_t;
            }
        }
        rc
    })
}

/// `peer.set_session` of a Gateway request's upstream TLS connection:
/// nginx calls it with the live peer connection, after it created the
/// connection's `SSL` and before the handshake, with the `data`
/// [`init_peer`] left (the balancer's `PeerData`). NGX_ERROR fails the
/// request (500): a connection is never made unverified.
unsafe extern "C" fn set_session(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    ffi_guard("backend TLS", NGX_ERROR as ngx_int_t, || {
        // SAFETY: `data` is the request's PeerData (init_peer installs this
        // hook only with it), live as long as the request; `pc` is nginx's
        // live `u->peer`, whose connection has its `SSL` (nginx calls this
        // hook right after ngx_ssl_create_connection).
        let (state, ssl) = unsafe {
            let state = &*data.cast::<PeerData>();
            let c = (*pc).connection;
            (state, (*(*c).ssl).connection)
        };
        // SAFETY: the state's request is live while its upstream connects.
        let req = unsafe { Request::from_ngx_http_request(state.request) };
        let log = req.log();
        let fail = |why: &str| {
            ngx_log_error!(NGX_LOG_ERR, log, "dynamic_balancer: backend TLS: {}", why);
            NGX_ERROR as ngx_int_t
        };
        // SAFETY: a request's `main` is its live main request; mirrors
        // (subrequests) are routed by its rule.
        let main = unsafe { Request::from_ngx_http_request(req.as_ref().main) };
        let Some(m) = matched(main) else {
            return fail("the request was routed by no rule");
        };
        let name = String::from_utf8_lossy(&state.backend.name);
        let client_certificate = m.listener().backend_client_certificate.as_deref();
        let Some(zone) = zone_of(req) else {
            return fail("no zone");
        };
        // SAFETY: `ssl` is the connection's live `SSL`, used by nothing
        // else during the call.
        if let Err(e) = unsafe { secure(ssl.cast(), m.table(), &name, client_certificate, &zone, log) } {
            return fail(&e);
        }
        NGX_OK as ngx_int_t
    })
}

/// Applies the route table's TLS settings for `backend` to a new upstream
/// connection before its handshake: the policy's SNI, trust store and
/// name checks, and `client_certificate` (a certificate id of the zone)
/// for a backend that asks for one. HTTP's [`set_session`] and the stream
/// servers' ([`crate::stream::backend_tls`]) both end here.
///
/// # Safety
/// `ssl` is the live `SSL` of a connection not yet handshaken, used by
/// nothing else during the call; `log` is a live log.
pub(crate) unsafe fn secure(
    ssl: *mut openssl_sys::SSL,
    table: &Rc<Compiled>,
    backend: &str,
    client_certificate: Option<&str>,
    zone: &Zone,
    log: *mut ngx_log_t,
) -> Result<(), String> {
    let Some(policy) = table.backend_tls(backend) else {
        return Err(format!("backend {backend:?} has no TLS settings in the route table"));
    };
    let store = store_for(table, policy).map_err(|e| format!("backend {backend:?}: CA certificates: {e}"))?;
    // SAFETY: this function's contract.
    let ssl = unsafe { SslRef::from_ptr_mut(ssl) };
    apply(ssl, policy, &store).map_err(|e| format!("backend {backend:?}: {e}"))?;
    let Some(id) = client_certificate else {
        return Ok(());
    };
    let cert = crate::tls::cache::find_id(zone, id, |id, e| {
        ngx_log_error!(NGX_LOG_ERR, log, "dynamic_balancer: certificate {}: {}", id, e);
    });
    let Some(cert) = cert else {
        return Err(format!("the client certificate {id:?} is not in the zone"));
    };
    // SAFETY: `ssl` is live; the leaf, key and chain are live OpenSSL
    // objects the cache holds, and OpenSSL takes its own references.
    let ok = unsafe {
        SSL_use_cert_and_key(
            ssl.as_ptr().cast(),
            cert.leaf.as_ptr().cast(),
            cert.key.as_ptr().cast(),
            cert.chain.as_ptr().cast(),
            1,
        )
    };
    if ok != 1 {
        return Err(format!("SSL_use_cert_and_key failed for the client certificate {id:?}"));
    }
    Ok(())
}

/// The names a backend's leaf certificate must carry, kept on the `SSL`
/// for the verify callback (freed with it).
struct Names {
    hostname: String,
    subject_alt_names: Vec<SubjectAltName>,
}

fn names_index() -> Option<openssl::ex_data::Index<Ssl, Names>> {
    static INDEX: OnceLock<Option<openssl::ex_data::Index<Ssl, Names>>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().ok())
}

/// SNI, trust store and verification on one upstream connection.
fn apply(ssl: &mut SslRef, policy: &BackendTls, store: &X509Store) -> Result<(), String> {
    ssl.set_hostname(&policy.hostname)
        .map_err(|e| format!("SNI {:?}: {e}", policy.hostname))?;
    let index = names_index().ok_or("no OpenSSL ex_data index")?;
    ssl.set_ex_data(
        index,
        Names {
            hostname: policy.hostname.clone(),
            subject_alt_names: policy.subject_alt_names.clone(),
        },
    );
    // SAFETY: `ssl` is live; the callback is a plain function.
    unsafe { openssl_sys::SSL_set_verify(ssl.as_ptr(), SslVerifyMode::PEER.bits(), Some(verify)) };
    // SAFETY: `ssl` is live; the depth is a plain value.
    unsafe { ngx::ffi::SSL_set_verify_depth(ssl.as_ptr().cast(), VERIFY_DEPTH) };
    // SAFETY: `ssl` and the store are live; "set1" takes its own reference
    // to the store, which the cache keeps too.
    let ok = unsafe {
        openssl_sys::SSL_ctrl(
            ssl.as_ptr(),
            openssl_sys::SSL_CTRL_SET_VERIFY_CERT_STORE,
            1,
            store.as_ptr().cast(),
        )
    };
    if ok != 1 {
        return Err("SSL_set1_verify_cert_store failed".into());
    }
    Ok(())
}

/// The verify callback of a backend connection: OpenSSL's verdict on the
/// chain, and at the leaf, the policy's names. Returning 0 fails the
/// handshake.
extern "C" fn verify(preverify_ok: c_int, ctx: *mut openssl_sys::X509_STORE_CTX) -> c_int {
    ffi_guard("backend certificate verify callback", 0, || {
        if preverify_ok != 1 {
            return 0;
        }
        // SAFETY: OpenSSL calls the callback with its live store context,
        // used by nothing else during the call.
        let ctx = unsafe { X509StoreContextRef::from_ptr_mut(ctx) };
        if ctx.error_depth() != 0 {
            return 1;
        }
        let carries = (|| {
            let ssl = ctx.ex_data(X509StoreContext::ssl_idx().ok()?)?;
            let names = ssl.ex_data(names_index()?)?;
            let leaf = ctx.current_cert()?;
            Some(leaf_carries(leaf, names))
        })();
        if carries == Some(true) {
            1
        } else {
            // SAFETY: a code OpenSSL defines.
            let mismatch = unsafe { X509VerifyResult::from_raw(openssl_sys::X509_V_ERR_HOSTNAME_MISMATCH) };
            ctx.set_error(mismatch);
            0
        }
    })
}

/// Whether `leaf` carries the hostname, or with subject alternative names
/// one of them.
fn leaf_carries(leaf: &openssl::x509::X509Ref, names: &Names) -> bool {
    let host = |h: &str| {
        // SAFETY: `leaf` is live; `h` is valid for its length; no peer
        // name is asked back.
        unsafe {
            openssl_sys::X509_check_host(
                leaf.as_ptr(),
                h.as_ptr().cast(),
                h.len(),
                // No fallback to the subject's CN (RFC 6125): a name the
                // certificate does not carry as a SAN does not match.
                openssl_sys::X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS | openssl_sys::X509_CHECK_FLAG_NEVER_CHECK_SUBJECT,
                std::ptr::null_mut(),
            ) == 1
        }
    };
    if names.subject_alt_names.is_empty() {
        return host(&names.hostname);
    }
    let uris: Vec<String> = leaf
        .subject_alt_names()
        .map(|sans| sans.iter().filter_map(|n| n.uri().map(str::to_string)).collect())
        .unwrap_or_default();
    names.subject_alt_names.iter().any(|san| match san {
        SubjectAltName::Hostname(h) => host(h),
        SubjectAltName::Uri(u) => uris.iter().any(|c| c == u),
    })
}

#[derive(Default)]
struct Cache {
    /// The table the entries below were built for (weak: the cache never
    /// keeps a replaced table alive).
    table: Weak<Compiled>,
    /// This table's bundles by their PEM, and the previous table's.
    by_pem: HashMap<String, Rc<X509Store>>,
    previous: HashMap<String, Rc<X509Store>>,
    /// The system's trusted CAs, loaded once per worker.
    system: Option<Rc<X509Store>>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// The trust store of `policy` (its bundle, or the system's CAs), parsed
/// at most once per worker and bundle.
fn store_for(table: &Rc<Compiled>, policy: &BackendTls) -> Result<Rc<X509Store>, String> {
    CACHE.with_borrow_mut(|cache| {
        let Some(pem) = &policy.ca_certificates else {
            if let Some(s) = &cache.system {
                return Ok(s.clone());
            }
            let mut b = X509StoreBuilder::new().map_err(|e| e.to_string())?;
            b.set_default_paths().map_err(|e| format!("the system's CAs: {e}"))?;
            let s = Rc::new(b.build());
            cache.system = Some(s.clone());
            return Ok(s);
        };
        if !std::ptr::eq(cache.table.as_ptr(), Rc::as_ptr(table)) {
            cache.previous = std::mem::take(&mut cache.by_pem);
            cache.table = Rc::downgrade(table);
        }
        if let Some(s) = cache.by_pem.get(pem) {
            return Ok(s.clone());
        }
        let s = match cache.previous.remove(pem) {
            Some(s) => s,
            None => Rc::new(crate::tls::client_ca::parse(pem)?.0),
        };
        cache.by_pem.insert(pem.clone(), s.clone());
        Ok(s)
    })
}
