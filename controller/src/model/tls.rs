//! TLS Secrets, checked with OpenSSL: the library the module serves them
//! with, so a Secret that passes here is one the module accepts. They are
//! pushed to the module's zone (`/configuration/certificates`), never
//! written to disk; a renewed Secret is served from the next handshake,
//! with no reload.

use openssl::asn1::Asn1Time;
use openssl::pkey::PKey;
use openssl::ssl::{SslContextBuilder, SslMethod};
use openssl::x509::X509;

use k8s_openapi::api::core::v1::Secret;

use super::values::{is_namespace, is_object_name};

/// A TLS Secret ready to be pushed: its id in the module and its PEMs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    /// `<ns>_<secret>`: `_` appears in neither a namespace nor a Secret's
    /// name, so the id is unambiguous, and it does not change when the
    /// Secret is renewed (the module replaces the certificate in place).
    pub id: String,
    pub pair: Pair,
    pub warnings: Vec<String>,
}

/// A chain (leaf first) and its key, PEM, normalised by OpenSSL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pair {
    pub chain: String,
    pub key: String,
    /// SHA-256 of the leaf's DER, hex: what the module's listing reports,
    /// so a pusher that lost track can tell what the module already holds.
    pub sha256: String,
    /// Certificates in the chain.
    pub chain_len: usize,
    /// What the certificate metrics report of the leaf.
    pub leaf: LeafInfo,
}

/// The leaf's fields that ingress-nginx's certificate metrics
/// (`ssl_expire_time_seconds`, `ssl_certificate_info`) carry, spelled as
/// Go's `crypto/x509` spells them there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LeafInfo {
    /// `notAfter`, in seconds since 1970.
    pub not_after: i64,
    /// The serial number in decimal.
    pub serial_number: String,
    /// ingress-nginx's `identifier`: the issuer's `serialNumber` attribute
    /// (usually empty), `-`, the serial number.
    pub identifier: String,
    /// The issuer's first `O`, or empty.
    pub issuer_organization: String,
    /// The issuer's `CN`, or empty.
    pub issuer_common_name: String,
    /// `RSA`, `ECDSA`, `Ed25519`, `DSA` (or `Unknown`).
    pub public_key_algorithm: String,
}

/// Longest issuer name kept in a certificate label.
const MAX_LABEL: usize = 256;

impl LeafInfo {
    fn of(leaf: &openssl::x509::X509Ref) -> Result<Self, String> {
        use openssl::nid::Nid;
        let epoch = Asn1Time::from_unix(0).map_err(|e| e.to_string())?;
        let d = epoch.diff(leaf.not_after()).map_err(|e| e.to_string())?;
        let not_after = i64::from(d.days) * 86_400 + i64::from(d.secs);
        let serial_number = leaf
            .serial_number()
            .to_bn()
            .and_then(|b| b.to_dec_str().map(|s| s.to_string()))
            .map_err(|e| e.to_string())?;
        // The issuer's names are the Secret owner's text, copied into a
        // label on every scrape: at most MAX_LABEL bytes of each.
        let first = |nid: Nid| {
            let mut s = leaf
                .issuer_name()
                .entries_by_nid(nid)
                .next()
                .and_then(|e| e.data().to_string().ok())
                .unwrap_or_default();
            if s.len() > MAX_LABEL {
                let mut cut = MAX_LABEL;
                while !s.is_char_boundary(cut) {
                    cut -= 1;
                }
                s.truncate(cut);
            }
            s
        };
        let public_key_algorithm = match leaf.public_key().map(|k| k.id()) {
            Ok(openssl::pkey::Id::RSA | openssl::pkey::Id::RSA_PSS) => "RSA",
            Ok(openssl::pkey::Id::EC) => "ECDSA",
            Ok(openssl::pkey::Id::ED25519) => "Ed25519",
            Ok(openssl::pkey::Id::DSA) => "DSA",
            _ => "Unknown",
        };
        Ok(LeafInfo {
            not_after,
            identifier: format!("{}-{serial_number}", first(Nid::SERIALNUMBER)),
            serial_number,
            issuer_organization: first(Nid::ORGANIZATIONNAME),
            issuer_common_name: first(Nid::COMMONNAME),
            public_key_algorithm: public_key_algorithm.to_string(),
        })
    }
}

/// Finds Secret `ns/name` among `secrets` and checks it (see [`check`]).
/// Writes nothing; the error says what is wrong, for an Event.
pub fn from_secret(secrets: &[std::sync::Arc<Secret>], ns: &str, name: &str) -> Result<Certificate, String> {
    let found = secrets.iter().find(|s| {
        s.metadata.namespace.as_deref().unwrap_or("default") == ns && s.metadata.name.as_deref() == Some(name)
    });
    let data = found.and_then(|s| s.data.as_ref());
    let (Some(crt), Some(key)) = (data.and_then(|d| d.get("tls.crt")), data.and_then(|d| d.get("tls.key"))) else {
        return Err(format!("Secret {ns}/{name} is missing or has no tls.crt/tls.key"));
    };
    // Both go into the certificate's id, a path segment of the module's API.
    if !is_object_name(name) || !is_namespace(ns) {
        return Err(format!("{ns:?}/{name:?} is not a Secret's namespace and name"));
    }
    let checked = check(&crt.0, &key.0).map_err(|e| format!("Secret {ns}/{name}: {e}; TLS not served"))?;
    Ok(Certificate {
        id: certificate_id(ns, name),
        pair: checked.pair,
        warnings: checked.warnings,
    })
}

/// The module's id of Secret `ns/name`: `{ns}_{name}`, or when that is
/// longer than the module takes (a namespace of 63 and a name of up to 253
/// characters), as much of it as fits before `-` and 16 hex digits of the
/// SHA-256 of `ns/name`, so that long names still get distinct ids.
pub fn certificate_id(ns: &str, name: &str) -> String {
    let id = format!("{ns}_{name}");
    if id.len() <= lua_compat::certificates::MAX_ID {
        return id;
    }
    let digest = openssl::sha::sha256(format!("{ns}/{name}").as_bytes());
    let suffix: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    // Namespaces and names are ASCII, so any byte offset is a boundary.
    let keep = lua_compat::certificates::MAX_ID - 1 - suffix.len();
    format!("{}-{suffix}", &id[..keep])
}

/// A usable certificate, normalised, and what is worth a warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub pair: Pair,
    pub warnings: Vec<String>,
}

/// Most certificates in one chain.
const MAX_CHAIN: usize = 16;
/// Largest `tls.crt` or `tls.key` accepted (Kubernetes caps a Secret at 1 MiB).
const MAX_PEM: usize = 1 << 20;

/// Checks `tls.crt` (a leaf certificate, then its chain) and `tls.key`: both
/// parse, the key is the leaf's, and the leaf is in its validity period
/// (outside it is a warning, not an error, as in ingress-nginx).
pub fn check(crt: &[u8], key: &[u8]) -> Result<Checked, String> {
    if crt.len() > MAX_PEM || key.len() > MAX_PEM {
        return Err("tls.crt or tls.key is larger than 1 MiB".into());
    }
    let chain = X509::stack_from_pem(crt).map_err(|e| format!("tls.crt is not a PEM certificate chain: {e}"))?;
    let Some(leaf) = chain.first() else {
        return Err("tls.crt holds no certificate".into());
    };
    if chain.len() > MAX_CHAIN {
        return Err(format!("tls.crt holds more than {MAX_CHAIN} certificates"));
    }
    let pkey =
        PKey::private_key_from_pem(key).map_err(|e| format!("tls.key is not an unencrypted PEM private key: {e}"))?;
    let public = leaf
        .public_key()
        .map_err(|e| format!("the certificate's public key cannot be read: {e}"))?;
    if !public.public_eq(&pkey) {
        return Err("tls.key does not match the certificate in tls.crt".into());
    }
    // Load the pair as nginx does (`SSL_CTX_use_certificate`), under the
    // system's OpenSSL policy: a key too small for its security level, or
    // a signature algorithm it bans, fails here as it would fail `nginx -t`.
    let mut ctx = SslContextBuilder::new(SslMethod::tls_server()).map_err(|e| e.to_string())?;
    ctx.set_certificate(leaf)
        .map_err(|e| format!("OpenSSL refuses the certificate as nginx would load it: {e}"))?;
    ctx.set_private_key(&pkey)
        .map_err(|e| format!("OpenSSL refuses the key as nginx would load it: {e}"))?;
    let mut warnings = Vec::new();
    let now = Asn1Time::days_from_now(0).map_err(|e| e.to_string())?;
    if leaf.not_after() < now {
        warnings.push(format!("the certificate expired on {}", leaf.not_after()));
    }
    if leaf.not_before() > now {
        warnings.push(format!("the certificate is not valid before {}", leaf.not_before()));
    }
    let mut pem = Vec::new();
    for cert in &chain {
        pem.extend(cert.to_pem().map_err(|e| e.to_string())?);
    }
    let key = pkey.private_key_to_pem_pkcs8().map_err(|e| e.to_string())?;
    let text = |b: Vec<u8>| String::from_utf8(b).map_err(|e| e.to_string());
    let sha256 = leaf
        .digest(openssl::hash::MessageDigest::sha256())
        .map_err(|e| e.to_string())?;
    Ok(Checked {
        pair: Pair {
            chain: text(pem)?,
            key: text(key)?,
            sha256: sha256.iter().map(|b| format!("{b:02x}")).collect(),
            chain_len: chain.len(),
            // Metric labels only: a field that cannot be read leaves them
            // empty rather than refusing a certificate nginx would serve.
            leaf: LeafInfo::of(leaf).unwrap_or_default(),
        },
        warnings,
    })
}

#[cfg(test)]
pub mod tests {
    #[test]
    fn long_secret_names_get_distinct_ids_the_module_takes() {
        assert_eq!(super::certificate_id("shop", "web-tls"), "shop_web-tls");
        let ns = "n".repeat(63);
        let a = super::certificate_id(&ns, &format!("{}a", "x".repeat(252)));
        let b = super::certificate_id(&ns, &format!("{}b", "x".repeat(252)));
        assert_ne!(a, b);
        for id in [&a, &b] {
            assert_eq!(lua_compat::certificates::check_id(id), Ok(()), "{id}");
        }
    }

    use super::*;
    use openssl::bn::BigNum;
    use openssl::ec::{EcGroup, EcKey};
    use openssl::hash::MessageDigest;
    use openssl::nid::Nid;
    use openssl::pkey::Private;
    use openssl::x509::X509NameBuilder;

    #[test]
    fn a_secret_whose_namespace_or_name_would_escape_the_directory_is_refused() {
        let (crt, key) = self_signed("a.example", -1, 30);
        let secret = |ns: &str, name: &str| {
            let mut s = Secret::default();
            s.metadata.namespace = Some(ns.into());
            s.metadata.name = Some(name.into());
            s.data = Some(
                [
                    ("tls.crt".to_string(), k8s_openapi::ByteString(crt.clone())),
                    ("tls.key".to_string(), k8s_openapi::ByteString(key.clone())),
                ]
                .into(),
            );
            s
        };
        let ok = from_secret(&[secret("team-a", "web").into()], "team-a", "web").unwrap();
        assert_eq!(ok.id, "team-a_web");
        for (ns, name) in [("../..", "web"), ("team-a/..", "web"), ("team-a", "../web")] {
            let err = from_secret(&[secret(ns, name).into()], ns, name).unwrap_err();
            assert!(err.contains("namespace and name"), "{ns}/{name}: {err}");
        }
    }

    fn key() -> PKey<Private> {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
    }

    /// A self-signed certificate for `cn`, valid from `from` to `to` days
    /// from now; (cert PEM, key PEM).
    pub fn self_signed(cn: &str, from: i64, to: i64) -> (Vec<u8>, Vec<u8>) {
        let key = key();
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_nid(Nid::COMMONNAME, cn).unwrap();
        let name = name.build();
        let mut b = X509::builder().unwrap();
        b.set_version(2).unwrap();
        b.set_serial_number(&BigNum::from_u32(1).unwrap().to_asn1_integer().unwrap())
            .unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(&name).unwrap();
        b.set_pubkey(&key).unwrap();
        let at = |days: i64| Asn1Time::from_unix(time_now() + days * 86_400).unwrap();
        b.set_not_before(&at(from)).unwrap();
        b.set_not_after(&at(to)).unwrap();
        b.sign(&key, MessageDigest::sha256()).unwrap();
        (b.build().to_pem().unwrap(), key.private_key_to_pem_pkcs8().unwrap())
    }

    fn time_now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn a_good_pair_passes_and_is_normalised() {
        let (crt, key) = self_signed("a.example", -1, 30);
        let mut noisy = b"Bag Attributes: junk\n".to_vec();
        noisy.extend(&crt);
        let c = check(&noisy, &key).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert!(c.pair.chain.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(c.pair.key.starts_with("-----BEGIN PRIVATE KEY-----"));
    }

    #[test]
    fn what_nginx_could_not_load_is_refused() {
        let (crt, key) = self_signed("a.example", -1, 30);
        let (_, other_key) = self_signed("b.example", -1, 30);
        // Only the PEM header is right.
        let fake = b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n";
        assert!(check(fake, &key).unwrap_err().contains("not a PEM certificate"));
        assert!(check(b"", &key).is_err());
        assert!(
            check(&crt, b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
                .unwrap_err()
                .contains("tls.key")
        );
        assert!(check(&crt, &other_key).unwrap_err().contains("does not match"));
    }

    #[test]
    fn a_key_too_small_for_the_openssl_policy_is_refused() {
        use openssl::rsa::Rsa;
        let key = PKey::from_rsa(Rsa::generate(512).unwrap()).unwrap();
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_nid(Nid::COMMONNAME, "weak.example").unwrap();
        let name = name.build();
        let mut b = X509::builder().unwrap();
        b.set_version(2).unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(&name).unwrap();
        b.set_pubkey(&key).unwrap();
        b.set_not_before(&Asn1Time::days_from_now(0).unwrap()).unwrap();
        b.set_not_after(&Asn1Time::days_from_now(30).unwrap()).unwrap();
        b.sign(&key, MessageDigest::sha256()).unwrap();
        let crt = b.build().to_pem().unwrap();
        let e = check(&crt, &key.private_key_to_pem_pkcs8().unwrap()).unwrap_err();
        assert!(e.contains("OpenSSL refuses"), "{e}");
    }

    #[test]
    fn expired_or_future_certificates_warn() {
        let (crt, key) = self_signed("a.example", -30, -1);
        assert!(check(&crt, &key).unwrap().warnings[0].contains("expired"));
        let (crt, key) = self_signed("a.example", 2, 30);
        assert!(check(&crt, &key).unwrap().warnings[0].contains("not valid before"));
    }
}
