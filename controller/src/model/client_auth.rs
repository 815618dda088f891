//! Client certificate authentication (`auth-tls-*`), as ingress-nginx does
//! it: the host's TLS server asks for a client certificate and verifies it
//! against the CA bundle in a Secret's `ca.crt` (`ssl_client_certificate`,
//! `ssl_verify_client`, `ssl_verify_depth`), with an optional error page,
//! a subject check and the certificate passed upstream.
//!
//! It is a server setting: the host's first Ingress (the one whose
//! `server-alias` counts) sets it. Another Ingress on that host asking for
//! a different Secret, or for client certificates the host does not ask
//! for, has its paths fail closed rather than served without the check it
//! asked for. With `auth-tls-verify-client: "on"` every location of the
//! host also refuses a request without a verified certificate (403), so
//! plain HTTP cannot go around the handshake check.
//!
//! The bundle is parsed with OpenSSL (the library nginx loads it with) and
//! only its certificates are written, under `<conf-dir>/auth/`, named by a
//! hash of the contents.

use k8s_openapi::api::core::v1::Secret;
use openssl::x509::X509;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::values::{number_in, Invalid, RedirectUrl};

/// Most certificates in one bundle.
const MAX_CERTIFICATES: usize = 1000;

/// `auth-tls-verify-client`.
pub const VERIFY_MODES: &[&str] = &["on", "off", "optional", "optional_no_ca"];

/// What an Ingress asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AuthTlsRef {
    /// `namespace/name` as written, or `name`.
    pub secret: String,
    pub verify_client: String,
    pub depth: u32,
    pub error_page: Option<RedirectUrl>,
    pub pass_certificate: bool,
    pub match_cn: Option<String>,
}

/// `auth-tls-verify-client`.
pub fn verify_client(v: &str) -> Result<String, Invalid> {
    let t = v.trim();
    if VERIFY_MODES.contains(&t) {
        Ok(t.to_string())
    } else {
        Err(Invalid(format!(
            "auth-tls-verify-client must be one of {}: {v:?}",
            VERIFY_MODES.join(", ")
        )))
    }
}

/// `auth-tls-verify-depth`: nginx takes any number; chains are short.
pub fn depth(v: &str) -> Result<u32, Invalid> {
    number_in(v, 1..=100, "auth-tls-verify-depth")
}

/// `auth-tls-match-cn`: `CN=` and a regex over the subject DN, as
/// ingress-nginx requires; it must compile with PCRE2 as nginx compiles
/// it, or `nginx -t` would fail for everyone.
pub fn match_cn(v: &str) -> Result<String, Invalid> {
    let t = v.trim();
    let ok = t.starts_with("CN=")
        && t.len() <= 1024
        && t.bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\'' && b != b';');
    if !ok {
        return Err(Invalid(format!(
            "auth-tls-match-cn must be CN= and a printable regex without quotes or ';': {v:?}"
        )));
    }
    super::values::compile_like_nginx(t).map_err(|e| Invalid(format!("auth-tls-match-cn: {e}: {v:?}")))?;
    Ok(t.to_string())
}

/// Checks one companion (the name without `auth-tls-`); `None` for a name
/// that is not one.
pub fn check_companion(suffix: &str, v: &str) -> Option<Result<(), Invalid>> {
    Some(match suffix {
        "verify-client" => verify_client(v).map(drop),
        "verify-depth" => depth(v).map(drop),
        "error-page" => RedirectUrl::parse(v.trim()).map(drop),
        "pass-certificate-to-upstream" => super::values::parse_bool(v).map(drop),
        "match-cn" => match_cn(v).map(drop),
        _ => return None,
    })
}

impl AuthTlsRef {
    /// From `auth-tls-secret` and `get(suffix)` for the companions; an
    /// invalid companion falls back to ingress-nginx's default, except the
    /// two that narrow access (`verify-client`, `match-cn`): those make the
    /// whole reference invalid, so the Ingress fails closed.
    pub fn parse<'a>(secret: &str, get: &dyn Fn(&str) -> Option<&'a str>) -> Result<AuthTlsRef, Invalid> {
        let secret = secret.trim();
        let name = secret.rsplit('/').next().unwrap_or(secret);
        if !super::values::is_object_name(name) || secret.matches('/').count() > 1 {
            return Err(Invalid(format!("auth-tls-secret is not a Secret name: {secret:?}")));
        }
        Ok(AuthTlsRef {
            secret: secret.to_string(),
            verify_client: get("verify-client").map_or(Ok("on".to_string()), verify_client)?,
            depth: get("verify-depth").and_then(|v| depth(v).ok()).unwrap_or(1),
            error_page: get("error-page").and_then(|v| RedirectUrl::parse(v.trim()).ok()),
            pass_certificate: get("pass-certificate-to-upstream")
                .is_some_and(|v| super::values::parse_bool(v) == Ok(true)),
            match_cn: get("match-cn").map(match_cn).transpose()?,
        })
    }
}

/// The CA certificates of a Secret's `ca.crt`, as PEM (certificates only,
/// whatever else the key held).
pub fn ca_bundle(secret: &Secret) -> Result<String, String> {
    let data = secret.data.as_ref().and_then(|d| d.get("ca.crt")).map(|b| b.0.clone());
    let data = data
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get("ca.crt"))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or("no ca.crt key")?;
    let certs = X509::stack_from_pem(&data).map_err(|e| format!("ca.crt is not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("ca.crt holds no certificate".into());
    }
    if certs.len() > MAX_CERTIFICATES {
        return Err(format!("ca.crt holds more than {MAX_CERTIFICATES} certificates"));
    }
    let mut out = String::new();
    for c in certs {
        let pem = c.to_pem().map_err(|e| format!("ca.crt: {e}"))?;
        out.push_str(&String::from_utf8_lossy(&pem));
    }
    Ok(out)
}

/// The bundle's file name under `<conf-dir>/auth/`.
pub fn file_name(namespace: &str, secret: &str, content: &str) -> String {
    let digest = Sha256::digest(content.as_bytes());
    let hash: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("{namespace}-{secret}-{hash}.ca.pem")
}

/// What a server renders.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ClientAuth {
    /// The CA bundle under `<conf-dir>/auth/`.
    pub file: String,
    pub verify_client: String,
    pub depth: u32,
    pub error_page: Option<RedirectUrl>,
    pub pass_certificate: bool,
    pub match_cn: Option<String>,
    /// `namespace/name` of the Secret (to compare other Ingresses' asks).
    #[serde(skip)]
    pub secret: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked() {
        assert!(verify_client("optional_no_ca").is_ok());
        assert!(verify_client("maybe").is_err());
        assert!(depth("0").is_err() && depth("2").is_ok());
        assert!(match_cn("CN=(client1|client2)").is_ok());
        assert!(match_cn("CN=a\"; return 200").is_err());
        assert!(match_cn("O=acme").is_err());
        assert!(match_cn("CN=(unclosed").is_err());
        let get = |k: &str| (k == "verify-client").then_some("sometimes");
        assert!(
            AuthTlsRef::parse("ns/ca", &get).is_err(),
            "a bad verify mode fails closed"
        );
        let get = |k: &str| (k == "verify-depth").then_some("x");
        assert_eq!(AuthTlsRef::parse("ca", &get).unwrap().depth, 1);
        assert!(AuthTlsRef::parse("a/b/c", &|_| None).is_err());
    }

    #[test]
    fn only_certificates_are_kept() {
        let key = openssl::ec::EcKey::generate(
            &openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap(),
        )
        .unwrap();
        let pkey = openssl::pkey::PKey::from_ec_key(key).unwrap();
        let mut name = openssl::x509::X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", "test CA").unwrap();
        let name = name.build();
        let mut b = X509::builder().unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(&name).unwrap();
        b.set_pubkey(&pkey).unwrap();
        b.set_not_before(&openssl::asn1::Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        b.set_not_after(&openssl::asn1::Asn1Time::days_from_now(1).unwrap())
            .unwrap();
        b.sign(&pkey, openssl::hash::MessageDigest::sha256()).unwrap();
        let cert = String::from_utf8(b.build().to_pem().unwrap()).unwrap();
        let key_pem = String::from_utf8(pkey.private_key_to_pem_pkcs8().unwrap()).unwrap();
        let secret = |text: String| Secret {
            string_data: Some([("ca.crt".to_string(), text)].into()),
            ..Default::default()
        };
        let bundle = ca_bundle(&secret(format!("{key_pem}{cert}"))).unwrap();
        assert_eq!(bundle, cert, "the key is not written");
        assert!(ca_bundle(&secret("junk".into())).is_err());
        assert!(ca_bundle(&Secret::default()).is_err());
    }
}
