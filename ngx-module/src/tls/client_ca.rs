//! Client certificate validation on a Gateway's HTTPS server (the
//! Gateway's `spec.tls.frontend`, per port), applied per handshake from the
//! route table, so a CA bundle or mode changes with no reload.
//!
//! nginx's `ssl_verify_client` sets verification on the server's `SSL_CTX`
//! once per configuration. Here the certificate callback
//! ([`crate::tls::handshake`]) calls [`apply`] on the connection's own `SSL`:
//! the verify mode, depth, trust store and the CA names sent in the
//! CertificateRequest. OpenSSL decides whether to ask for a certificate
//! after that callback, so the change takes effect in the same handshake
//! (OpenResty's `ssl.verify_client` does the same).
//!
//! - `AllowValidOnly`: the peer must send a certificate that verifies, or
//!   the handshake fails with an alert;
//! - `AllowInsecureFallback`: a certificate is asked for and verified, but a
//!   missing or failing one does not stop the handshake.
//!
//! A resumed session skips the certificate callback and keeps the
//! verification of the handshake that made it. nginx scopes sessions by a
//! context made of the server's static certificates, the same on every
//! Gateway server, so [`session_context`] gives each connection its own
//! before the session lookup (the client hello callback): a hash of the
//! listener, the bundle and the mode. A session resumes only on the
//! listener, and under the validation, it was verified for; one from
//! another Gateway, another port or a rotated CA makes a full handshake.
//! The request phase checks the result again
//! (`nginx::request::client_certificate_verified`) as a second line.
//!
//! Each worker parses a bundle once: stores are kept per listener for the
//! table they were built from, and an unchanged bundle is carried over to
//! the next table without parsing.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::rc::{Rc, Weak};

use foreign_types::ForeignTypeRef;
use openssl::sha::Sha256;
use openssl::ssl::{SslRef, SslVerifyMode};
use openssl::stack::Stack;
use openssl::x509::store::{X509Store, X509StoreBuilder};
use openssl::x509::{X509Name, X509NameRef, X509};

use lua_compat::routes::matcher::Compiled;
use lua_compat::routes::{ClientValidation, ValidationMode};

use crate::nginx::guard::ffi_guard;

/// The longest client chain accepted: the client certificate, up to four
/// intermediates, and the trusted CA (OpenSSL's depth counts the
/// intermediates).
pub const VERIFY_DEPTH: u32 = 4;

/// One listener's parsed bundle.
pub struct ClientCa {
    store: X509Store,
    /// The CAs' subjects, sent to the client so it can pick a certificate.
    names: Vec<X509Name>,
    mode: ValidationMode,
    /// SHA-256 of the mode and the bundle, for [`session_context`].
    digest: [u8; 32],
}

/// Parses a CA bundle (already shaped by `check_ca_bundle`): every block
/// must be a certificate OpenSSL takes. Also what the API runs before it
/// stores a table, so a worker never meets a bundle it cannot parse.
pub fn parse(pem: &str) -> Result<(X509Store, Vec<X509Name>), String> {
    let certs = X509::stack_from_pem(pem.as_bytes()).map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate".into());
    }
    let mut store = X509StoreBuilder::new().map_err(|e| e.to_string())?;
    let mut names = Vec::with_capacity(certs.len());
    for cert in certs {
        names.push(cert.subject_name().to_owned().map_err(|e| e.to_string())?);
        store
            .add_cert(cert)
            .map_err(|e| format!("OpenSSL refuses a CA certificate: {e}"))?;
    }
    Ok((store.build(), names))
}

#[derive(Default)]
struct Cache {
    /// The table the entries below were built for. Weak: the cache never
    /// keeps a replaced table alive, and while it points at one no other
    /// table can be allocated at its address.
    table: Weak<Compiled>,
    by_listener: HashMap<Box<[u8]>, Rc<ClientCa>>,
    /// This table's bundles by their PEM, and the previous table's: a
    /// bundle two listeners or two tables share is parsed once.
    by_pem: HashMap<String, Rc<ClientCa>>,
    previous: HashMap<String, Rc<ClientCa>>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// The parsed bundle of `listener` in `table`, parsed at most once per
/// worker and bundle.
pub fn for_listener(table: &Rc<Compiled>, listener: &[u8], v: &ClientValidation) -> Result<Rc<ClientCa>, String> {
    CACHE.with_borrow_mut(|cache| {
        if !std::ptr::eq(cache.table.as_ptr(), Rc::as_ptr(table)) {
            cache.by_listener.clear();
            cache.previous = std::mem::take(&mut cache.by_pem);
            cache.table = Rc::downgrade(table);
        }
        if let Some(ca) = cache.by_listener.get(listener) {
            return Ok(ca.clone());
        }
        let known = (cache.by_pem.get(&v.ca_certificates)).or_else(|| cache.previous.get(&v.ca_certificates));
        let ca = match known {
            Some(ca) if ca.mode == v.mode => ca.clone(),
            _ => {
                let (store, names) = parse(&v.ca_certificates)?;
                let mut digest = Sha256::new();
                digest.update(&[v.mode as u8]);
                digest.update(v.ca_certificates.as_bytes());
                Rc::new(ClientCa {
                    store,
                    names,
                    mode: v.mode,
                    digest: digest.finish(),
                })
            }
        };
        cache.by_listener.insert(listener.into(), ca.clone());
        cache.by_pem.insert(v.ca_certificates.clone(), ca.clone());
        Ok(ca)
    })
}

/// The session id context of a connection to `listener` (at most 32
/// bytes, OpenSSL's limit): sessions resume only where it is the same.
pub fn session_context(listener: &[u8], ca: Option<&ClientCa>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(listener);
    h.update(&[0]);
    if let Some(ca) = ca {
        h.update(&ca.digest);
    }
    h.finish()
}

/// Asks for and verifies the client's certificate on this handshake.
pub fn apply(ssl: &mut SslRef, ca: &ClientCa) -> Result<(), String> {
    // The callback is always given: with none, the `SSL` keeps the one it
    // inherited from the server's `SSL_CTX`, and nginx's accepts anything
    // (it checks the result per request instead).
    let (mode, callback): (SslVerifyMode, Callback) = match ca.mode {
        ValidationMode::AllowValidOnly => (SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT, verify_strict),
        ValidationMode::AllowInsecureFallback => (SslVerifyMode::PEER, accept_any),
    };
    // SAFETY: `ssl` is live; the callback is a plain function.
    unsafe { openssl_sys::SSL_set_verify(ssl.as_ptr(), mode.bits(), Some(callback)) };
    // SAFETY: `ssl` is live (nginx's bindings name the same OpenSSL type);
    // the depth is a plain value.
    unsafe { ngx::ffi::SSL_set_verify_depth(ssl.as_ptr().cast(), VERIFY_DEPTH as c_int) };
    // SAFETY: `ssl` and the store are live; "set1" takes its own reference
    // to the store, which the cache keeps too.
    let ok = unsafe {
        openssl_sys::SSL_ctrl(
            ssl.as_ptr(),
            openssl_sys::SSL_CTRL_SET_VERIFY_CERT_STORE,
            1,
            ca.store.as_ptr().cast(),
        )
    };
    if ok != 1 {
        return Err("SSL_set1_verify_cert_store failed".into());
    }
    let mut names = Stack::new().map_err(|e| e.to_string())?;
    for name in &ca.names {
        names
            .push(X509NameRef::to_owned(name).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    ssl.set_client_ca_list(names);
    Ok(())
}

type Callback = extern "C" fn(c_int, *mut openssl_sys::X509_STORE_CTX) -> c_int;

/// `AllowValidOnly`'s verify callback: OpenSSL's own verdict, so a
/// certificate that does not verify fails the handshake.
extern "C" fn verify_strict(preverify_ok: c_int, _ctx: *mut openssl_sys::X509_STORE_CTX) -> c_int {
    ffi_guard("client certificate verify callback", 0, || preverify_ok)
}

/// `AllowInsecureFallback`'s verify callback: OpenSSL records the result
/// (for the request's variables) and the handshake goes on.
extern "C" fn accept_any(_preverify_ok: c_int, _ctx: *mut openssl_sys::X509_STORE_CTX) -> c_int {
    ffi_guard("client certificate verify callback", 1, || 1)
}
