//! Validated value types: the only strings that may reach nginx.conf.
//!
//! Every type here is built by a parser that accepts a deliberately small
//! grammar, so a value that type-checks cannot carry `;`, `{`, `}`, quotes,
//! `#`, `$` or a newline into the rendered configuration. This is the first
//! line of defence against CVE-2025-1097/CVE-2025-1974-style injection; the
//! template's formatter (see `render.rs`) is the second.

use std::fmt;

use serde::Serialize;

/// Why a value was refused; the text is shown in logs and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn invalid<T>(what: &str, value: &str) -> Result<T, Invalid> {
    Err(Invalid(format!("{what}: {value:?}")))
}

/// A DNS host name as Ingress allows it: RFC 1123 labels, optionally with a
/// leading `*.` wildcard label, lower-cased.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Host(String);

impl Host {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let lower = s.to_ascii_lowercase();
        let body = lower.strip_prefix("*.").unwrap_or(&lower);
        if lower.len() > 253 || !body.split('.').all(lua_compat::validate::is_dns_label) {
            return invalid("not a DNS host name", s);
        }
        Ok(Host(lower))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An absolute URL path without a query: `/`, then unreserved characters,
/// `%`-escapes and the few sub-delimiters that are inert in nginx syntax.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct UrlPath(String);

impl UrlPath {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let ok = s.starts_with('/')
            && s.len() <= 1024
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/-._~%!*+,=:@".contains(&b));
        if !ok {
            return invalid("not a plain URL path", s);
        }
        Ok(UrlPath(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A regular expression for a `location ~*` path (use-regex). Printable
/// ASCII only, and it must compile with PCRE2 as nginx compiles it
/// (case-insensitive): a regex that only nginx refuses would fail
/// `nginx -t` and hold back every reload. The formatter quotes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct PathRegex(String);

impl PathRegex {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let printable = s.bytes().all(|b| (0x21..0x7f).contains(&b) && !b"\"';".contains(&b));
        if !s.starts_with('/') || s.len() > 1024 || !printable {
            return invalid("not a path regular expression", s);
        }
        if let Err(e) = compile_like_nginx(s) {
            return Err(Invalid(format!(
                "regular expression does not compile with PCRE2 ({e}): {s:?}"
            )));
        }
        Ok(PathRegex(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Compiles `pattern` with PCRE2 the way `location ~*` and `rewrite` do
/// (nginx adds `PCRE2_CASELESS` for `~*`), with a bound on the compiled
/// size so one regex cannot bloat every worker.
pub fn compile_like_nginx(pattern: &str) -> Result<(), String> {
    // Anchored and caseless as rendered; the anchor cannot make a valid
    // pattern invalid, but it checks what nginx will actually compile.
    let rendered = format!("^{pattern}");
    pcre2::bytes::RegexBuilder::new()
        .caseless(true)
        .build(&rendered)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A rewrite target: a URL path in which `$1`..`$9` capture references are
/// allowed, as `rewrite-target: /$2` needs. No other variable can appear.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct RewriteTarget(String);

impl RewriteTarget {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let b = s.as_bytes();
        let mut ok = s.starts_with('/') && s.len() <= 1024;
        let mut i = 0;
        while ok && i < b.len() {
            ok = match b[i] {
                b'$' => {
                    i += 1;
                    i < b.len() && (b'1'..=b'9').contains(&b[i])
                }
                c => c.is_ascii_alphanumeric() || b"/-._~%!*+,=:@".contains(&c),
            };
            i += 1;
        }
        if !ok {
            return invalid("not a rewrite target (a path with optional $1..$9)", s);
        }
        Ok(RewriteTarget(s.to_string()))
    }
}

/// An absolute http(s) URL for redirects: scheme, a host name or IP, an
/// optional port, a plain path and a plain query.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct RedirectUrl(String);

impl RedirectUrl {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let rest = s.strip_prefix("https://").or_else(|| s.strip_prefix("http://"));
        let Some(rest) = rest else {
            return invalid("not an http(s) URL", s);
        };
        let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
        let host = authority.rsplit_once(':').map_or(
            authority,
            |(h, port)| {
                if port.parse::<u16>().is_ok() {
                    h
                } else {
                    "\0"
                }
            },
        );
        let tail_ok = tail
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-._~%!*+,=:@?&".contains(&b));
        if Host::parse(host).is_err() && host.parse::<std::net::IpAddr>().is_err() || !tail_ok || s.len() > 2048 {
            return invalid("not a plain http(s) URL", s);
        }
        Ok(RedirectUrl(s.to_string()))
    }
}

/// An nginx size (`1m`, `512k`, `0`): digits with an optional k/m/g unit,
/// no larger than nginx can hold (`ngx_parse_offset` refuses more than
/// 2^63-1 bytes, and the whole configuration with it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Size(String);

impl Size {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let lower = s.trim().to_ascii_lowercase();
        let digits = lower.trim_end_matches(['k', 'm', 'g']);
        let units = lower.len() - digits.len();
        if digits.is_empty() || units > 1 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return invalid("not an nginx size such as 1m or 512k", s);
        }
        let scale: u64 = match lower.as_bytes().last() {
            Some(b'k') => 1 << 10,
            Some(b'm') => 1 << 20,
            Some(b'g') => 1 << 30,
            _ => 1,
        };
        let bytes = digits.parse::<u64>().ok().and_then(|n| n.checked_mul(scale));
        if bytes.is_none_or(|b| b > i64::MAX as u64) {
            return invalid("larger than nginx can hold (2^63-1 bytes)", s);
        }
        Ok(Size(lower))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The size in bytes (the parser has checked that it fits).
    pub fn bytes(&self) -> u64 {
        let digits = self.0.trim_end_matches(['k', 'm', 'g']);
        let scale = match self.0.as_bytes().last() {
            Some(b'k') => 1 << 10,
            Some(b'm') => 1 << 20,
            Some(b'g') => 1 << 30,
            _ => 1,
        };
        digits.parse::<u64>().unwrap_or(0).saturating_mul(scale)
    }
}

/// An HTTP status that `error_page` accepts as an error: 400-599, except
/// 499, which nginx refuses (it is its own "client closed" code).
pub fn error_status(s: &str) -> Result<u16, Invalid> {
    match s.trim().parse::<u16>() {
        Ok(code) if (400..=599).contains(&code) && code != 499 => Ok(code),
        _ => invalid("not an error status nginx accepts (400-599, not 499)", s),
    }
}

/// A whole number in `range`, for settings nginx bounds.
pub fn number_in<T>(s: &str, range: std::ops::RangeInclusive<T>, what: &str) -> Result<T, Invalid>
where
    T: std::str::FromStr + PartialOrd + fmt::Display,
{
    match s.trim().parse::<T>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(Invalid(format!(
            "{what} must be a whole number from {} to {}: {s:?}",
            range.start(),
            range.end()
        ))),
    }
}

/// A timeout in whole seconds, as ingress-nginx's timeout annotations take it
/// (a bare integer), rendered with an explicit `s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Seconds(pub u32);

impl Seconds {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let t = s.trim();
        let t = t.strip_suffix('s').unwrap_or(t);
        match t.parse::<u32>() {
            Ok(n) if n <= 86_400 * 7 => Ok(Seconds(n)),
            _ => invalid("not a timeout in seconds", s),
        }
    }
}

/// An HTTP header name (RFC 7230 token characters without the rarely used
/// punctuation).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct HeaderName(String);

impl HeaderName {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let t = s.trim();
        if t.is_empty() || t.len() > 128 || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return invalid("not an HTTP header name", s);
        }
        Ok(HeaderName(t.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A CORS origin: `*` or `scheme://host[:port]`, where the host may begin
/// with a `*.` wildcard as ingress-nginx allows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Origin(String);

impl Origin {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let t = s.trim();
        if t == "*" {
            return Ok(Origin(t.into()));
        }
        let rest = t.strip_prefix("https://").or_else(|| t.strip_prefix("http://"));
        let ok = rest.is_some_and(|r| {
            let host = match r.rsplit_once(':') {
                Some((h, p)) if p.parse::<u16>().is_ok() => h,
                Some(_) => return false,
                None => r,
            };
            Host::parse(host).is_ok() || host.parse::<std::net::IpAddr>().is_ok()
        });
        if !ok {
            return invalid("not a CORS origin such as https://example.com", s);
        }
        Ok(Origin(t.to_string()))
    }
}

/// A Kubernetes namespace name (DNS-1123 label: lowercase letters, digits
/// and inner hyphens, at most 63).
pub fn is_namespace(s: &str) -> bool {
    lua_compat::validate::is_dns_label(s) && !s.bytes().any(|b| b.is_ascii_uppercase())
}

/// A Kubernetes object name (DNS-1123 subdomain), used for derived names.
pub fn is_object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// An address for `status.loadBalancer.ingress`: an IP, or a DNS name
/// without a wildcard.
pub fn is_status_address(s: &str) -> bool {
    s.parse::<std::net::IpAddr>().is_ok() || (!s.starts_with('*') && Host::parse(s).is_ok())
}

/// A list of CIDRs (or bare addresses), comma separated, as the
/// allow/deny source-range annotations take them.
pub fn parse_cidrs(s: &str) -> Result<Vec<String>, Invalid> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            if let Ok(net) = p.parse::<ipnet::IpNet>() {
                Ok(net.trunc().to_string())
            } else if let Ok(ip) = p.parse::<std::net::IpAddr>() {
                Ok(ip.to_string())
            } else {
                invalid("not a CIDR or IP address", p)
            }
        })
        .collect()
}

/// Go's `strconv.ParseBool`, which ingress-nginx uses for every flag.
pub fn parse_bool(s: &str) -> Result<bool, Invalid> {
    match s.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(Invalid(format!("not a boolean: {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &[&str] = &[
        "a;b", "a}b", "a{b", "a\nb", "a$b", "a\"b", "a'b", "a#b", "a b", "a\\b", "a\rb", "a\0b",
    ];

    #[test]
    fn hosts() {
        assert_eq!(Host::parse("Foo.Example.com").unwrap().as_str(), "foo.example.com");
        assert!(Host::parse("*.example.com").is_ok());
        for bad in ["", "-a.com", "a..b", "a_b.com", "*", "a.*.com"] {
            assert!(Host::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nothing_hostile_passes_any_parser() {
        for h in HOSTILE {
            let v = format!("/x{h}");
            assert!(Host::parse(h).is_err(), "{h:?}");
            assert!(UrlPath::parse(&v).is_err(), "{v:?}");
            assert!(RewriteTarget::parse(&v).is_err(), "{v:?}");
            assert!(RedirectUrl::parse(&format!("https://a.com{v}")).is_err(), "{v:?}");
            assert!(Size::parse(&format!("1{h}")).is_err(), "{h:?}");
            assert!(HeaderName::parse(h).is_err(), "{h:?}");
            assert!(Origin::parse(&format!("https://a{h}.com")).is_err(), "{h:?}");
            assert!(parse_cidrs(&format!("10.0.0.0/8{h}")).is_err(), "{h:?}");
        }
        for h in ["a;b", "a\nb", "a\"b", "a'b", "a b"] {
            assert!(PathRegex::parse(&format!("/x{h}")).is_err(), "{h:?}");
        }
    }

    #[test]
    fn rewrite_targets_allow_captures_only() {
        assert!(RewriteTarget::parse("/$2").is_ok());
        assert!(RewriteTarget::parse("/api/$1/x").is_ok());
        for bad in ["/$host", "/$", "/$0", "/${1}"] {
            assert!(RewriteTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_seconds_cidrs() {
        assert!(Size::parse("8m").is_ok() && Size::parse("0").is_ok() && Size::parse("1mm").is_err());
        assert_eq!(Seconds::parse("30").unwrap(), Seconds(30));
        assert!(Seconds::parse("-1").is_err());
        assert_eq!(
            parse_cidrs("10.0.0.1/8, 192.168.0.1").unwrap(),
            ["10.0.0.0/8", "192.168.0.1"]
        );
    }

    #[test]
    fn regexes_must_compile_with_pcre2() {
        assert!(PathRegex::parse("/foo(/|$)(.*)").is_ok());
        assert!(PathRegex::parse("/foo(").is_err());
        // Accepted by Rust's regex crate, refused by PCRE2.
        let e = PathRegex::parse("/a(?u)b").unwrap_err();
        assert!(e.0.contains("PCRE2"), "{e}");
        assert!(
            PathRegex::parse("/a{,5}(?<n>x)\\Qliteral\\E").is_ok(),
            "PCRE2-only syntax is fine"
        );
    }

    #[test]
    fn values_fit_nginx_limits() {
        for ok in ["0", "1m", "8G", "9223372036854775807", "8589934591g"] {
            assert!(Size::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["999999999999g", "9223372036854775808", "99999999999999999999k"] {
            assert!(Size::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(error_status("404").unwrap(), 404);
        for bad in ["499", "399", "600", "x"] {
            assert!(error_status(bad).is_err(), "{bad}");
        }
        assert_eq!(number_in::<u32>("65535", 1..=65535, "n").unwrap(), 65535);
        assert!(number_in::<u32>("65536", 1..=65535, "n").is_err());
    }
}
