//! The HTTPS redirect of ingress-nginx's `lua_ingress.rewrite()`
//! (`ssl-redirect`, `force-ssl-redirect`), decided and written without a
//! script: when to redirect, to which host, and the `Location` value.
//!
//! ingress-nginx redirects when the scheme the client used
//! (`$pass_access_scheme`: `X-Forwarded-Proto` when `use-forwarded-headers`
//! trusts a load balancer in front, else `$scheme`) is `http`. The target is
//! `https://` + the host + `$request_uri`, where the host is the first
//! `X-Forwarded-Host` element (with forwarded headers) or the request's host,
//! without its port; a trailing `/` is dropped unless
//! `preserve-trailing-slash`, and `use-port-in-redirects` adds the HTTPS
//! port. Unlike the Lua, a forwarded host that is not a host name (the
//! header is the client's or a proxy's text) is not used: the request's own
//! host is, so the `Location` header never carries arbitrary bytes.

/// How a location redirects plain-HTTP requests to HTTPS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The status: 301, 302, 303, 307 or 308 (`http-redirect-code`).
    pub code: u16,
    /// Keep a trailing `/` of the request URI (`preserve-trailing-slash`).
    pub preserve_trailing_slash: bool,
    /// Name this port in the target (`use-port-in-redirects`).
    pub port: Option<u16>,
}

/// The redirect statuses nginx's `return` sends with a `Location` header.
pub const CODES: [u16; 5] = [301, 302, 303, 307, 308];

impl Rule {
    /// The arguments of `dynamic_balancer_https_redirect`: `off`, or a
    /// status from [`CODES`] followed by any of `preserve_trailing_slash`
    /// and `port=N`, each at most once.
    pub fn parse(words: &[&str]) -> Result<Option<Rule>, String> {
        let (first, options) = words.split_first().ok_or("a status or \"off\" is expected")?;
        if *first == "off" {
            return match options {
                [] => Ok(None),
                _ => Err("\"off\" takes no options".into()),
            };
        }
        let code = first
            .parse::<u16>()
            .ok()
            .filter(|c| CODES.contains(c))
            .ok_or_else(|| format!("invalid status \"{first}\": one of 301, 302, 303, 307, 308 is expected"))?;
        let mut rule = Rule {
            code,
            preserve_trailing_slash: false,
            port: None,
        };
        let mut seen = Vec::with_capacity(options.len());
        for option in options {
            let name = option.split_once('=').map_or(*option, |(n, _)| n);
            if seen.contains(&name) {
                return Err(format!("duplicate option \"{name}\""));
            }
            seen.push(name);
            match *option {
                "preserve_trailing_slash" => rule.preserve_trailing_slash = true,
                o => match o.strip_prefix("port=") {
                    Some(p) => {
                        let port = p
                            .parse::<u16>()
                            .ok()
                            .filter(|p| *p > 0)
                            .ok_or_else(|| format!("invalid port \"{p}\": 1..65535 is expected"))?;
                        rule.port = Some(port);
                    }
                    None => return Err(format!("unknown option \"{o}\"")),
                },
            }
        }
        Ok(Some(rule))
    }
}

/// Whether a request whose client-side scheme is `scheme` goes to HTTPS:
/// exactly `http`, as the Lua compares (an unexpected value such as
/// `https, http` from two headers is not plain HTTP).
pub fn is_plain_http(scheme: &[u8]) -> bool {
    scheme == b"http"
}

/// Longest host name a `Location` is built with (DNS names are at most 253
/// characters; a bracketed IPv6 literal with a zone fits as well).
pub const MAX_HOST: usize = 255;

/// The host of an `X-Forwarded-Host` value: its first comma-separated
/// element, trimmed, when it is a plausible `host[:port]` (letters, digits,
/// `-`, `.`, `_`, or a bracketed IPv6 literal, then an optional numeric
/// port). `None` means: use the request's own host.
pub fn forwarded_host(value: &[u8]) -> Option<&[u8]> {
    let first = value.split(|&b| b == b',').next()?.trim_ascii();
    let host = without_port(first)?;
    let valid = if let Some(inner) = host.strip_prefix(b"[") {
        inner
            .strip_suffix(b"]")
            .is_some_and(|a| !a.is_empty() && a.iter().all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.'))
    } else {
        host.iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    };
    (valid && !host.is_empty() && host.len() <= MAX_HOST).then_some(host)
}

/// `host` without a `:port` suffix; `None` when the suffix is not a port.
fn without_port(host: &[u8]) -> Option<&[u8]> {
    let port_start = if host.starts_with(b"[") {
        let close = host.iter().position(|&b| b == b']')?;
        match host.get(close + 1) {
            None => return Some(host),
            Some(b':') => close + 1,
            Some(_) => return None,
        }
    } else {
        match host.iter().position(|&b| b == b':') {
            None => return Some(host),
            Some(i) => i,
        }
    };
    let port = &host[port_start + 1..];
    (!port.is_empty() && port.len() <= 5 && port.iter().all(u8::is_ascii_digit)).then_some(&host[..port_start])
}

/// The `Location` of the redirect: `https://host[:port]` + the request URI
/// (path and query as the client sent them), its trailing `/` dropped
/// unless the rule preserves it.
pub fn location(rule: &Rule, host: &[u8], request_uri: &[u8]) -> Vec<u8> {
    let uri = match request_uri.strip_suffix(b"/") {
        Some(stripped) if !rule.preserve_trailing_slash => stripped,
        _ => request_uri,
    };
    let mut out = Vec::with_capacity(8 + host.len() + 6 + uri.len());
    out.extend_from_slice(b"https://");
    out.extend_from_slice(host);
    if let Some(port) = rule.port {
        out.push(b':');
        out.extend_from_slice(port.to_string().as_bytes());
    }
    out.extend_from_slice(uri);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RULE: Rule = Rule {
        code: 308,
        preserve_trailing_slash: false,
        port: None,
    };

    #[test]
    fn directive_arguments() {
        assert_eq!(Rule::parse(&["off"]), Ok(None));
        assert_eq!(Rule::parse(&["308"]), Ok(Some(RULE)));
        assert_eq!(
            Rule::parse(&["301", "preserve_trailing_slash", "port=8443"]),
            Ok(Some(Rule {
                code: 301,
                preserve_trailing_slash: true,
                port: Some(8443)
            }))
        );
        for bad in [
            &[][..],
            &["off", "port=1"],
            &["200"],
            &["308x"],
            &["304"],
            &["308", "forwarded"],
            &["308", "preserve_trailing_slash", "preserve_trailing_slash"],
            &["308", "port=0"],
            &["308", "port=65536"],
            &["308", "port=1", "port=2"],
            &["308", "port="],
            &["308", "https"],
        ] {
            assert!(Rule::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_plain_http_is_redirected() {
        assert!(is_plain_http(b"http"));
        for s in [&b"https"[..], b"", b"HTTP", b"http, https", b"ws"] {
            assert!(!is_plain_http(s), "{s:?}");
        }
    }

    #[test]
    fn the_trailing_slash_is_dropped_as_ingress_nginx_does() {
        assert_eq!(location(&RULE, b"a.test", b"/app/"), b"https://a.test/app");
        assert_eq!(location(&RULE, b"a.test", b"/"), b"https://a.test");
        assert_eq!(location(&RULE, b"a.test", b"/app/?x=1"), b"https://a.test/app/?x=1");
        assert_eq!(location(&RULE, b"a.test", b"/app"), b"https://a.test/app");
    }

    #[test]
    fn preserve_trailing_slash_and_port() {
        let rule = Rule {
            preserve_trailing_slash: true,
            port: Some(8443),
            ..RULE
        };
        assert_eq!(location(&rule, b"a.test", b"/app/"), b"https://a.test:8443/app/");
    }

    #[test]
    fn the_first_forwarded_host_without_its_port() {
        assert_eq!(forwarded_host(b"a.test"), Some(&b"a.test"[..]));
        assert_eq!(forwarded_host(b"a.test:8080"), Some(&b"a.test"[..]));
        assert_eq!(forwarded_host(b" a.test , b.test"), Some(&b"a.test"[..]));
        assert_eq!(forwarded_host(b"[::1]:443"), Some(&b"[::1]"[..]));
        assert_eq!(forwarded_host(b"[2001:db8::1]"), Some(&b"[2001:db8::1]"[..]));
        assert_eq!(forwarded_host(b"10.0.0.1:80"), Some(&b"10.0.0.1"[..]));
    }

    #[test]
    fn a_forwarded_host_that_is_not_a_host_is_not_used() {
        for bad in [
            &b""[..],
            b",a.test",
            b"a.test/evil",
            b"evil.test@a.test",
            b"a.test:port",
            b"a.test:123456",
            b"a b",
            b"[::1",
            b"[]",
            b"[::1]x",
            b"a.test:",
            b"\"a.test\"",
        ] {
            assert_eq!(forwarded_host(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(forwarded_host(&[b'a'; MAX_HOST + 1]), None);
        assert!(forwarded_host(&[b'a'; MAX_HOST]).is_some());
    }

    proptest! {
        /// Whatever a client sends, a forwarded host it gets into a
        /// `Location` is made of host characters only.
        #[test]
        fn forwarded_hosts_are_host_characters(value in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Some(host) = forwarded_host(&value) {
                prop_assert!(!host.is_empty() && host.len() <= MAX_HOST);
                prop_assert!(host.iter().all(|&b| b.is_ascii_alphanumeric() || b"-._[]:".contains(&b)));
            }
        }

        #[test]
        fn the_location_is_https_host_then_the_uri(
            host in "[a-z0-9.-]{1,40}",
            uri in "/[ -~]{0,60}",
            preserve in any::<bool>(),
            port in proptest::option::of(1u16..),
        ) {
            let rule = Rule { preserve_trailing_slash: preserve, port, ..RULE };
            let got = location(&rule, host.as_bytes(), uri.as_bytes());
            let prefix = match port {
                Some(p) => format!("https://{host}:{p}"),
                None => format!("https://{host}"),
            };
            prop_assert!(got.starts_with(prefix.as_bytes()));
            let rest = &got[prefix.len()..];
            if preserve || !uri.ends_with('/') {
                prop_assert_eq!(rest, uri.as_bytes());
            } else {
                prop_assert_eq!(rest, &uri.as_bytes()[..uri.len() - 1]);
            }
        }
    }
}
