//! Certificates as OpenSSL sees them: a PEM chain and key checked and turned
//! into the zone's payload (on the writer thread), and a payload turned back
//! into `X509`/`EVP_PKEY` objects (once per worker and change, never during
//! a handshake's lookup).
//!
//! OpenSSL is the library nginx links and the handshake runs on, so a
//! certificate that passes here is one the handshake can use: the same
//! parser, the same key check, the same security level.

use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{Id, PKey, Private};
use openssl::ssl::{SslContextBuilder, SslMethod};
use openssl::stack::Stack;
use openssl::x509::{X509NameRef, X509};

use lua_compat::certificates::{payload, rfc3339, CertificateInfo, MAX_CHAIN, MAX_PEM};

/// A checked certificate, ready for the zone.
pub struct Prepared {
    pub id: String,
    /// [`CertificateInfo`] as JSON (no key in it), for `GET`.
    pub info: Vec<u8>,
    /// DER chain and key ([`payload::encode`]).
    pub payload: Vec<u8>,
    /// For the log: an expired or not-yet-valid certificate.
    pub warnings: Vec<String>,
}

/// Checks a chain (leaf first) and its key, both PEM: every certificate
/// parses, the key is the leaf's, and OpenSSL takes the pair under the
/// system's security policy. `key` may be empty when it follows the chain
/// in `chain` (ingress-nginx's combined PEM).
pub fn prepare(id: &str, chain: &[u8], key: &[u8]) -> Result<Prepared, String> {
    if chain.len() > MAX_PEM || key.len() > MAX_PEM {
        return Err(format!("the certificate or key is larger than {MAX_PEM} bytes"));
    }
    let certs = X509::stack_from_pem(chain).map_err(|e| format!("not a PEM certificate chain: {e}"))?;
    let Some(leaf) = certs.first() else {
        return Err("no certificate in the PEM".into());
    };
    if certs.len() > MAX_CHAIN {
        return Err(format!("more than {MAX_CHAIN} certificates in the chain"));
    }
    let key_pem = if key.is_empty() { chain } else { key };
    let pkey = PKey::private_key_from_pem(key_pem).map_err(|e| format!("not an unencrypted PEM private key: {e}"))?;
    let public = leaf
        .public_key()
        .map_err(|e| format!("the certificate's public key: {e}"))?;
    if !public.public_eq(&pkey) {
        return Err("the private key does not match the certificate".into());
    }
    let mut ctx = SslContextBuilder::new(SslMethod::tls_server()).map_err(|e| e.to_string())?;
    ctx.set_certificate(leaf)
        .map_err(|e| format!("OpenSSL refuses the certificate: {e}"))?;
    ctx.set_private_key(&pkey)
        .map_err(|e| format!("OpenSSL refuses the key: {e}"))?;

    let epoch = openssl::asn1::Asn1Time::from_unix(0).map_err(|e| e.to_string())?;
    let unix = |t: &openssl::asn1::Asn1TimeRef| -> Result<i64, String> {
        let d = epoch.diff(t).map_err(|e| e.to_string())?;
        Ok(i64::from(d.days) * 86_400 + i64::from(d.secs))
    };
    let (not_before, not_after) = (unix(leaf.not_before())?, unix(leaf.not_after())?);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut warnings = Vec::new();
    if not_after < now {
        warnings.push(format!("certificate {id:?} expired on {}", rfc3339(not_after)));
    }
    if not_before > now {
        warnings.push(format!(
            "certificate {id:?} is not valid before {}",
            rfc3339(not_before)
        ));
    }
    let der: Vec<Vec<u8>> = certs
        .iter()
        .map(|c| c.to_der())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let key_der = pkey.private_key_to_pkcs8().map_err(|e| e.to_string())?;
    let sha256 = leaf.digest(MessageDigest::sha256()).map_err(|e| e.to_string())?;
    let info = CertificateInfo {
        id: id.to_string(),
        subject: one_line(leaf.subject_name()),
        issuer: one_line(leaf.issuer_name()),
        sans: leaf
            .subject_alt_names()
            .map(|names| names.iter().filter_map(|n| n.dnsname().map(str::to_string)).collect())
            .unwrap_or_default(),
        not_before: rfc3339(not_before),
        not_after: rfc3339(not_after),
        sha256: sha256.iter().map(|b| format!("{b:02x}")).collect(),
        chain: certs.len(),
        key: key_kind(&pkey),
        generation: 0,
        hosts: Vec::new(),
    };
    Ok(Prepared {
        id: id.to_string(),
        info: serde_json::to_vec(&info).map_err(|e| e.to_string())?,
        payload: payload::encode(&der, &key_der),
        warnings,
    })
}

/// A certificate ready for `SSL_use_cert_and_key`.
pub struct Loaded {
    pub leaf: X509,
    /// The intermediates (the leaf excluded).
    pub chain: Stack<X509>,
    pub key: PKey<Private>,
}

/// Decodes what [`prepare`] stored.
pub fn load(bytes: &[u8]) -> Result<Loaded, String> {
    let (ders, key) = payload::decode(bytes).ok_or("a malformed certificate payload")?;
    let mut certs = ders.into_iter().map(|d| X509::from_der(d).map_err(|e| e.to_string()));
    let leaf = certs.next().ok_or("no leaf")??;
    let mut chain = Stack::new().map_err(|e| e.to_string())?;
    for c in certs {
        chain.push(c?).map_err(|e| e.to_string())?;
    }
    let key = PKey::private_key_from_der(key).map_err(|e| e.to_string())?;
    Ok(Loaded { leaf, chain, key })
}

fn one_line(name: &X509NameRef) -> String {
    name.entries()
        .map(|e| {
            let field = e.object().nid().short_name().unwrap_or("?");
            let value = e.data().to_string().unwrap_or_default();
            format!("{field}={value}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn key_kind(key: &PKey<Private>) -> String {
    match key.id() {
        Id::RSA => format!("RSA-{}", key.bits()),
        Id::EC => {
            let curve = key
                .ec_key()
                .ok()
                .and_then(|k| k.group().curve_name())
                .and_then(|n: Nid| n.short_name().ok().map(str::to_string));
            format!("EC-{}", curve.unwrap_or_else(|| key.bits().to_string()))
        }
        Id::ED25519 => "ED25519".into(),
        Id::ED448 => "ED448".into(),
        other => format!("{other:?}-{}", key.bits()),
    }
}
