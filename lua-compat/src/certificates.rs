//! The certificate half of the contract: which names certificates and hosts
//! may have, the bodies of `/configuration/certificates` and
//! `/configuration/servers`, and which certificate a TLS handshake gets.
//!
//! The module keeps certificates in its zone and picks one per handshake
//! by the client's SNI; parsing and checking the PEM (OpenSSL, the library
//! that will serve it) is the module's job. What is decided here is pure:
//! names, bodies, and the lookup order `exact host → *.parent → default`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The host that names the default certificate, as in ingress-nginx's
/// `/configuration/servers` (its catch-all server is `_`).
pub const DEFAULT_HOST: &str = "_";

/// ingress-nginx's "no certificate for this host" marker in
/// `POST /configuration/servers`.
pub const NO_CERTIFICATE: &str = "-1";

/// Longest certificate id.
pub const MAX_ID: usize = 253;

/// Longest host name (DNS).
pub const MAX_HOST: usize = 253;

/// Largest PEM (chain or key) accepted, as a Kubernetes Secret's cap.
pub const MAX_PEM: usize = 1 << 20;

/// Most certificates in one chain.
pub const MAX_CHAIN: usize = 16;

/// Most host → certificate entries in the zone.
pub const MAX_SERVERS: usize = 100_000;

/// Checks a certificate id: 1 to 253 of `[A-Za-z0-9._-]`, not `.` or `..`.
/// An id is a path segment of the API and a key in the zone; a Secret's UID
/// (ingress-nginx) or `<namespace>_<name>` (this controller) both fit.
pub fn check_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "certificate id {:?} must be 1 to {MAX_ID} characters of A-Z, a-z, 0-9, '.', '_' and '-'",
            truncate(id)
        ))
    }
}

/// Normalises and checks a host of the servers map: `_` (the default), a
/// DNS name, or a wildcard `*.<DNS name>`; lower-cased, without a trailing
/// dot. Labels are 1 to 63 of `[a-z0-9-]` (and `_`, which real names carry,
/// e.g. `_acme-challenge`), not starting or ending with `-`.
pub fn normalize_host(host: &str) -> Result<String, String> {
    if host == DEFAULT_HOST {
        return Ok(host.to_string());
    }
    let lower = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if !is_normal_host(&lower) {
        return Err(format!(
            "{:?} is not a host name, a wildcard \"*.<host name>\" or \"_\"",
            truncate(host)
        ));
    }
    Ok(lower)
}

/// Whether `lower` (lower-cased, no trailing dot) is a host name or a
/// wildcard `*.<host name>` as [`normalize_host`] accepts them.
fn is_normal_host(lower: &str) -> bool {
    let name = lower.strip_prefix("*.").unwrap_or(lower);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    };
    lower.len() <= MAX_HOST && name.split('.').all(label_ok)
}

/// The name a handshake is looked up by: the SNI lower-cased, without a
/// trailing dot. `None` when the client sent none or sent something that is
/// no host name (an IP literal is not valid SNI).
///
/// Borrowed when the client sent it in that form already (as clients do):
/// a handshake and an HTTPS request allocate nothing for it.
pub fn sni_key(sni: &[u8]) -> Option<Cow<'_, str>> {
    let s = std::str::from_utf8(sni).ok()?;
    let host = if s.ends_with('.') || s.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(normalize_host(s).ok()?)
    } else if is_normal_host(s) {
        Cow::Borrowed(s)
    } else {
        return None;
    };
    (host != DEFAULT_HOST && !host.starts_with("*.")).then_some(host)
}

/// Which certificate serves `sni`: the host's own, else the wildcard of its
/// parent (`a.b.example` → `*.b.example`, one label only, as TLS wildcards
/// match), else the default (`_`). `find` looks one normalised host up.
pub fn lookup<T>(sni: Option<&str>, mut find: impl FnMut(&str) -> Option<T>) -> Option<T> {
    if let Some(host) = sni {
        if let Some(found) = find(host) {
            return Some(found);
        }
        if let Some((_, parent)) = host.split_once('.') {
            if !parent.is_empty() {
                if let Some(found) = find(&format!("*.{parent}")) {
                    return Some(found);
                }
            }
        }
    }
    find(DEFAULT_HOST)
}

/// `PUT /configuration/certificates/{id}`: the chain (leaf first) and its
/// unencrypted private key, both PEM. The key may also follow the chain in
/// `certificate` and `key` be left out, as ingress-nginx's combined PEM.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateBody {
    pub certificate: String,
    #[serde(default)]
    pub key: Option<String>,
}

/// `PUT /configuration/servers`: the whole host → certificate id map,
/// replacing the previous one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServersBody {
    pub servers: BTreeMap<String, String>,
}

/// ingress-nginx's `POST /configuration/servers`: certificates by id
/// (chain and key in one PEM), and hosts to add (`"-1"` removes a host).
/// Additive, as in `configuration.lua`: hosts absent from the body stay.
#[derive(Debug, Deserialize)]
pub struct CompatServersBody {
    #[serde(default)]
    pub certificates: BTreeMap<String, String>,
    #[serde(default)]
    pub servers: BTreeMap<String, String>,
}

/// A checked servers map: normalised hosts to ids.
pub type Servers = BTreeMap<String, String>;

/// Parses and checks a `PUT /configuration/servers` body.
pub fn parse_servers(body: &[u8]) -> Result<Servers, String> {
    let parsed: ServersBody =
        serde_json::from_slice(body).map_err(|e| format!("body is not {{\"servers\": {{host: id}}}}: {e}"))?;
    check_servers(parsed.servers.into_iter().map(|(h, id)| (h, Some(id))))
        .map(|m| m.into_iter().filter_map(|(h, id)| Some((h, id?))).collect())
}

/// One change of `POST /configuration/servers`: host → `Some(id)` to set,
/// `None` to remove.
pub type ServerChanges = BTreeMap<String, Option<String>>;

/// Parses and checks an ingress-nginx `POST /configuration/servers` body
/// into its certificates (id → combined PEM) and host changes.
pub fn parse_compat_servers(body: &[u8]) -> Result<(BTreeMap<String, String>, ServerChanges), String> {
    let parsed: CompatServersBody = serde_json::from_slice(body)
        .map_err(|e| format!("body is not {{\"certificates\": {{id: pem}}, \"servers\": {{host: id}}}}: {e}"))?;
    for (id, pem) in &parsed.certificates {
        check_id(id)?;
        if pem.len() > MAX_PEM {
            return Err(format!("certificate {id:?} is larger than {MAX_PEM} bytes"));
        }
    }
    let changes = check_servers(
        parsed
            .servers
            .into_iter()
            .map(|(h, id)| (h, (id != NO_CERTIFICATE).then_some(id))),
    )?;
    Ok((parsed.certificates, changes))
}

fn check_servers(entries: impl Iterator<Item = (String, Option<String>)>) -> Result<ServerChanges, String> {
    let mut out = ServerChanges::new();
    for (host, id) in entries {
        let host = normalize_host(&host)?;
        if let Some(id) = &id {
            check_id(id).map_err(|e| format!("servers[{host:?}]: {e}"))?;
        }
        if out.insert(host.clone(), id).is_some() {
            return Err(format!("host {host:?} appears twice (names are case-insensitive)"));
        }
        if out.len() > MAX_SERVERS {
            return Err(format!("more than {MAX_SERVERS} hosts"));
        }
    }
    Ok(out)
}

/// What `GET /configuration/certificates` says of one certificate. Never
/// the key.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CertificateInfo {
    pub id: String,
    /// The leaf's subject, one-line (`CN=a.example,O=...`).
    pub subject: String,
    pub issuer: String,
    /// The leaf's DNS subject alternative names.
    pub sans: Vec<String>,
    /// RFC 3339, UTC.
    pub not_before: String,
    pub not_after: String,
    /// SHA-256 of the leaf's DER, lower-case hex.
    pub sha256: String,
    /// Certificates in the chain, the leaf included.
    pub chain: usize,
    /// `RSA-2048`, `EC-256`, `ED25519`...
    pub key: String,
    /// The generation that stored it.
    #[serde(default)]
    pub generation: u64,
    /// Hosts the servers map points at it (filled in when listed).
    #[serde(default)]
    pub hosts: Vec<String>,
}

/// Seconds since the epoch as RFC 3339 UTC (`2027-01-31T23:59:59Z`).
pub fn rfc3339(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The zone's payload of one certificate: the chain's DER certificates and
/// the key's PKCS#8 DER, each with a 4-byte little-endian length. Written
/// and read by the module; the layout is pure, so it is tested here.
pub mod payload {
    /// Encodes `chain` (leaf first) and `key`.
    pub fn encode(chain: &[Vec<u8>], key: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + chain.iter().map(|c| c.len() + 4).sum::<usize>() + key.len() + 4);
        out.extend((chain.len() as u32).to_le_bytes());
        for part in chain.iter().map(Vec::as_slice).chain(std::iter::once(key)) {
            out.extend((part.len() as u32).to_le_bytes());
            out.extend(part);
        }
        out
    }

    /// The chain's DERs and the key's DER, or `None` if `bytes` is not what
    /// [`encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Option<(Vec<&[u8]>, &[u8])> {
        let mut rest = bytes;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
            rest = tail;
            Some(head)
        };
        let count = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        if count == 0 || count > super::MAX_CHAIN {
            return None;
        }
        let mut chain = Vec::with_capacity(count);
        for _ in 0..=count {
            let len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
            chain.push(take(len)?);
        }
        let key = chain.pop()?;
        rest.is_empty().then_some((chain, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_normalised_and_hostile_ones_refused() {
        assert_eq!(normalize_host("A.Example.COM.").unwrap(), "a.example.com");
        assert_eq!(normalize_host("*.Example.com").unwrap(), "*.example.com");
        assert_eq!(normalize_host("_").unwrap(), "_");
        for bad in [
            "",
            "*",
            "a..b",
            "-a.b",
            "a b",
            "a/b",
            "*.*.a",
            "a.*.b",
            "a\0b",
            "é.example",
            &"a".repeat(64),
            &format!("{}.x", ["a"; 130].join(".")),
        ] {
            assert!(normalize_host(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ids_are_path_segments() {
        for ok in ["default_tls", "0f4c3b2a-1111-2222-3333-444455556666", "a.b"] {
            check_id(ok).unwrap();
        }
        for bad in ["", ".", "..", "a/b", "a b", "a%2f", &"a".repeat(254)] {
            assert!(check_id(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn lookup_goes_exact_then_one_level_wildcard_then_default() {
        let map: Servers = [("a.example", "a"), ("*.example", "wild"), ("_", "default")]
            .into_iter()
            .map(|(h, i)| (h.to_string(), i.to_string()))
            .collect();
        let find = |h: &str| map.get(h).cloned();
        assert_eq!(lookup(Some("a.example"), find).as_deref(), Some("a"));
        assert_eq!(lookup(Some("b.example"), find).as_deref(), Some("wild"));
        // A wildcard covers one label only.
        assert_eq!(lookup(Some("x.b.example"), find).as_deref(), Some("default"));
        assert_eq!(lookup(Some("example"), find).as_deref(), Some("default"));
        assert_eq!(lookup(None, find).as_deref(), Some("default"));
        let empty = Servers::new();
        assert_eq!(lookup(Some("a.example"), |h| empty.get(h).cloned()), None);
    }

    #[test]
    fn sni_is_a_host_name_or_nothing() {
        assert_eq!(sni_key(b"A.Example.").as_deref(), Some("a.example"));
        assert_eq!(sni_key(b"_"), None);
        assert_eq!(sni_key(b"*.example"), None);
        assert_eq!(sni_key(b"\xff"), None);
        assert!(matches!(sni_key(b"a.example"), Some(Cow::Borrowed("a.example"))));
        assert_eq!(sni_key(b"a..example"), None);
    }

    #[test]
    fn servers_bodies() {
        let m = parse_servers(br#"{"servers":{"A.example":"x","_":"d"}}"#).unwrap();
        assert_eq!(m["a.example"], "x");
        assert!(parse_servers(br#"{"servers":{"a.example":"x","A.EXAMPLE":"y"}}"#).is_err());
        assert!(parse_servers(br#"{"servers":{"a.example":"../x"}}"#).is_err());
        assert!(parse_servers(br#"{"servers":{},"extra":1}"#).is_err());
        let (certs, changes) =
            parse_compat_servers(br#"{"certificates":{"u1":"PEM"},"servers":{"a.example":"u1","b.example":"-1"}}"#)
                .unwrap();
        assert_eq!(certs["u1"], "PEM");
        assert_eq!(changes["a.example"].as_deref(), Some("u1"));
        assert_eq!(changes["b.example"], None);
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_798_761_599), "2026-12-31T23:59:59Z");
    }

    proptest::proptest! {
        #[test]
        fn payloads_round_trip_and_garbage_is_refused(
            chain in proptest::collection::vec(proptest::collection::vec(0u8.., 0..40), 1..4),
            key in proptest::collection::vec(0u8.., 0..40),
            garbage in proptest::collection::vec(0u8.., 0..64),
        ) {
            let bytes = payload::encode(&chain, &key);
            let (c, k) = payload::decode(&bytes).unwrap();
            proptest::prop_assert_eq!(c, chain.iter().map(Vec::as_slice).collect::<Vec<_>>());
            proptest::prop_assert_eq!(k, key.as_slice());
            let _ = payload::decode(&garbage);
            proptest::prop_assert!(payload::decode(&bytes[..bytes.len() - 1]).is_none());
        }
    }
}
