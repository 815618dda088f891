//! The ConfigMap's TLS listener keys, with ingress-nginx's names and
//! defaults, each checked against what nginx and OpenSSL accept: a cipher
//! string or curve list OpenSSL refuses would fail `nginx -t` and hold back
//! every reload, so it is refused here with the reason.

use serde::Serialize;

use super::values::Invalid;

/// ingress-nginx's default `ssl-ciphers` (Mozilla intermediate).
pub const DEFAULT_CIPHERS: &str = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384";

/// TLS settings of the HTTPS listener.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct SslSettings {
    /// `ssl-protocols`: a subset of TLSv1 .. TLSv1.3.
    pub protocols: Vec<String>,
    /// `ssl-ciphers` (TLS 1.2 and below; TLS 1.3 suites are OpenSSL's).
    pub ciphers: String,
    /// `ssl-prefer-server-ciphers`.
    pub prefer_server_ciphers: bool,
    /// `ssl-session-cache`: a shared cache of `session_cache_size`.
    pub session_cache: bool,
    /// `ssl-session-cache-size`, an nginx size (`10m`).
    pub session_cache_size: String,
    /// `ssl-session-timeout`, an nginx time (`10m`).
    pub session_timeout: String,
    /// `ssl-session-tickets`.
    pub session_tickets: bool,
    /// `ssl-ecdh-curve`: `auto` or a colon-separated group list.
    pub ecdh_curve: String,
    /// `ssl-early-data` (TLS 1.3 0-RTT; replayable, off by default).
    pub early_data: bool,
}

impl Default for SslSettings {
    fn default() -> Self {
        SslSettings {
            protocols: vec!["TLSv1.2".into(), "TLSv1.3".into()],
            ciphers: DEFAULT_CIPHERS.into(),
            prefer_server_ciphers: true,
            session_cache: true,
            session_cache_size: "10m".into(),
            session_timeout: "10m".into(),
            session_tickets: false,
            ecdh_curve: "auto".into(),
            early_data: false,
        }
    }
}

/// `ssl-protocols`: space-separated, known, no duplicates.
pub fn protocols(v: &str) -> Result<Vec<String>, Invalid> {
    const KNOWN: [&str; 4] = ["TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"];
    let words: Vec<String> = v.split_whitespace().map(String::from).collect();
    if words.is_empty() || words.len() > KNOWN.len() || !words.iter().all(|w| KNOWN.contains(&w.as_str())) {
        return Err(Invalid(format!(
            "ssl-protocols must list some of {}: {v:?}",
            KNOWN.join(", ")
        )));
    }
    let mut sorted = words.clone();
    sorted.sort();
    sorted.dedup();
    if sorted.len() != words.len() {
        return Err(Invalid(format!("ssl-protocols lists a protocol twice: {v:?}")));
    }
    Ok(words)
}

/// `ssl-ciphers`: an OpenSSL cipher string that selects at least one
/// cipher (OpenSSL itself is asked).
pub fn ciphers(v: &str) -> Result<String, Invalid> {
    let v = v.trim();
    let charset = !v.is_empty()
        && v.len() <= 2048
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":+-!@=_.,".contains(&b));
    let mut ctx = openssl::ssl::SslContextBuilder::new(openssl::ssl::SslMethod::tls_server())
        .map_err(|e| Invalid(e.to_string()))?;
    if !charset || ctx.set_cipher_list(v).is_err() {
        return Err(Invalid(format!("OpenSSL selects no cipher with ssl-ciphers {v:?}")));
    }
    Ok(v.to_string())
}

/// `ssl-ecdh-curve`: `auto` or groups OpenSSL knows (`X25519:prime256v1`).
pub fn ecdh_curve(v: &str) -> Result<String, Invalid> {
    let v = v.trim();
    if v == "auto" {
        return Ok(v.into());
    }
    let charset =
        !v.is_empty() && v.len() <= 512 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b":-_".contains(&b));
    let mut ctx = openssl::ssl::SslContextBuilder::new(openssl::ssl::SslMethod::tls_server())
        .map_err(|e| Invalid(e.to_string()))?;
    if !charset || ctx.set_groups_list(v).is_err() {
        return Err(Invalid(format!(
            "OpenSSL does not know the groups in ssl-ecdh-curve {v:?}"
        )));
    }
    Ok(v.to_string())
}

/// An nginx size for the session cache: `<n>[k|m]`, 1k to 1g, and at least
/// nginx's minimum of 8 pages.
pub fn cache_size(v: &str) -> Result<String, Invalid> {
    let v = v.trim();
    let (digits, unit) = match v.char_indices().last() {
        Some((i, 'k' | 'K')) => (&v[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&v[..i], 1 << 20),
        _ => (v, 1),
    };
    let bytes = digits.parse::<u64>().ok().and_then(|n| n.checked_mul(unit));
    match bytes {
        Some(b) if (8 * 4096..=1 << 30).contains(&b) => Ok(v.to_ascii_lowercase()),
        _ => Err(Invalid(format!(
            "ssl-session-cache-size must be 32k to 1g (e.g. 10m): {v:?}"
        ))),
    }
}

/// An nginx time: `<n>[s|m|h|d]`, 1 second to 7 days.
pub fn time(v: &str, key: &str) -> Result<String, Invalid> {
    let v = v.trim();
    let (digits, unit) = match v.char_indices().last() {
        Some((i, 's')) => (&v[..i], 1u64),
        Some((i, 'm')) => (&v[..i], 60),
        Some((i, 'h')) => (&v[..i], 3600),
        Some((i, 'd')) => (&v[..i], 86_400),
        _ => (v, 1),
    };
    let secs = digits.parse::<u64>().ok().and_then(|n| n.checked_mul(unit));
    match secs {
        Some(s) if (1..=7 * 86_400).contains(&s) => Ok(v.to_string()),
        _ => Err(Invalid(format!("{key} must be 1s to 7d (e.g. 10m): {v:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_nginx_or_openssl_would_refuse_are_refused() {
        assert_eq!(protocols("TLSv1.3").unwrap(), ["TLSv1.3"]);
        for bad in ["", "SSLv3", "TLSv1.2 TLSv1.2", "TLSv1.2; include /etc/passwd"] {
            assert!(protocols(bad).is_err(), "{bad:?}");
        }
        ciphers(DEFAULT_CIPHERS).unwrap();
        ciphers("HIGH:!aNULL:!MD5").unwrap();
        for bad in ["NOPE", "HIGH; return 200", "", "eNULL:!eNULL"] {
            assert!(ciphers(bad).is_err(), "{bad:?}");
        }
        ecdh_curve("X25519:prime256v1").unwrap();
        assert!(ecdh_curve("nosuchcurve").is_err());
        assert!(ecdh_curve("X25519;").is_err());
        assert_eq!(cache_size("10M").unwrap(), "10m");
        assert!(cache_size("1k").is_err() && cache_size("x").is_err() && cache_size("99999999999m").is_err());
        time("10m", "k").unwrap();
        assert!(time("0", "k").is_err() && time("1y", "k").is_err() && time("-1s", "k").is_err());
    }
}
