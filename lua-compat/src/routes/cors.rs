//! The HTTPRoute `CORS` filter: which origins may call a route from a
//! browser, and the `Access-Control-*` headers that tell the browser so.
//!
//! Two kinds of request meet the filter (the Fetch standard's CORS
//! protocol):
//!
//! - a **preflight**, `OPTIONS` with `Origin` and
//!   `Access-Control-Request-Method`: the gateway answers it itself (204),
//!   with the allowed methods, headers, credentials and cache time when
//!   the origin is allowed, with no CORS header at all when it is not (the
//!   browser then refuses the real request); the backend never sees it;
//! - an **actual** request with `Origin`: it goes to the backend, and an
//!   allowed origin gets `Access-Control-Allow-Origin` (and credentials and
//!   exposed headers) on the response. Every response of the rule says
//!   `Vary: Origin`.
//!
//! The allowed origin is always answered back as the request gave it,
//! never as `*`: that is valid with and without credentials, and a
//! response then varies by `Origin` (`Vary: Origin` is added). A `*` in
//! `allowMethods` or `allowHeaders` answers back what the preflight asked
//! for, which, unlike a literal `*`, browsers honour with credentials.
//!
//! Everything here is pure: the module gives the request's header values
//! and writes the `(header, value)` pairs it gets back.

use serde::{Deserialize, Serialize};

use super::header::CompiledHeader;

/// The filter as the controller pushes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cors {
    /// `*`, or `scheme://host[:port]` where the host may start with `*.`
    /// (one or more labels).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_origins: Vec<String>,
    /// Methods, or `*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_methods: Vec<String>,
    /// Request header names, or `*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_headers: Vec<String>,
    /// Response header names a page may read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_credentials: bool,
    /// Seconds a browser may cache a preflight's answer (the spec's
    /// default: 5).
    #[serde(default = "default_max_age")]
    pub max_age: u32,
}

fn default_max_age() -> u32 {
    5
}

/// What kind of request the filter sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind<'a> {
    /// No `Origin`: not a cross-origin request; nothing to do.
    NotCors,
    Preflight {
        origin: &'a [u8],
        method: &'a [u8],
        headers: Option<&'a [u8]>,
    },
    Actual {
        origin: &'a [u8],
    },
}

/// Classifies a request by its method and its `Origin`,
/// `Access-Control-Request-Method` and `Access-Control-Request-Headers`.
pub fn classify<'a>(
    method: &[u8],
    origin: Option<&'a [u8]>,
    request_method: Option<&'a [u8]>,
    request_headers: Option<&'a [u8]>,
) -> Kind<'a> {
    let Some(origin) = origin.filter(|o| !o.is_empty()) else {
        return Kind::NotCors;
    };
    match request_method.filter(|m| !m.is_empty()) {
        Some(m) if method == b"OPTIONS" => Kind::Preflight {
            origin,
            method: m,
            headers: request_headers.filter(|h| !h.is_empty()),
        },
        _ => Kind::Actual { origin },
    }
}

/// One allowed origin, parsed once per table.
#[derive(Debug, Clone, PartialEq, Eq)]
enum OriginPattern {
    Any,
    Exact {
        scheme: String,
        host: String,
        port: u16,
    },
    /// `*.suffix`: `suffix` with a leading dot.
    Wildcard {
        scheme: String,
        dotted_suffix: String,
        port: u16,
    },
}

/// The parts of an origin (`scheme://host[:port]`), lower-cased, the port
/// the scheme's default when absent. `None` when it is not one.
fn parse_origin(origin: &[u8]) -> Option<(String, String, u16)> {
    let text = std::str::from_utf8(origin).ok()?;
    let (scheme, rest) = text.split_once("://")?;
    if scheme.is_empty() || !scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) {
        return None;
    }
    let scheme = scheme.to_ascii_lowercase();
    let (host, port) = match rest.rsplit_once(':') {
        // An IPv6 literal's colons are inside brackets.
        Some((h, p)) if !p.contains(']') => (h, p.parse::<u16>().ok().filter(|p| *p > 0)?),
        _ => (rest, default_port(&scheme)?),
    };
    if host.is_empty() || host.bytes().any(|b| b"/?#@ ,".contains(&b) || !b.is_ascii_graphic()) {
        return None;
    }
    Some((scheme, host.to_ascii_lowercase(), port))
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

impl OriginPattern {
    fn parse(allowed: &str) -> Option<Self> {
        if allowed == "*" {
            return Some(OriginPattern::Any);
        }
        let (scheme, host, port) = parse_origin(allowed.as_bytes())?;
        Some(match host.strip_prefix('*') {
            Some(suffix) if suffix.starts_with('.') && suffix.len() > 1 => OriginPattern::Wildcard {
                scheme,
                dotted_suffix: suffix.to_string(),
                port,
            },
            Some(_) => return None,
            None if host.contains('*') => return None,
            None => OriginPattern::Exact { scheme, host, port },
        })
    }

    fn allows(&self, origin: &(String, String, u16)) -> bool {
        let (s, h, p) = origin;
        match self {
            OriginPattern::Any => true,
            OriginPattern::Exact { scheme, host, port } => scheme == s && host == h && port == p,
            OriginPattern::Wildcard {
                scheme,
                dotted_suffix,
                port,
            } => scheme == s && port == p && h.len() > dotted_suffix.len() && h.ends_with(dotted_suffix.as_str()),
        }
    }
}

/// Whether `allowed` is an origin pattern the filter can use (what the
/// route table's validation accepts).
pub fn is_origin_pattern(allowed: &str) -> bool {
    OriginPattern::parse(allowed).is_some()
}

/// The filter ready for requests: patterns parsed, the constant header
/// values joined once.
#[derive(Debug)]
pub struct CompiledCors {
    origins: Vec<OriginPattern>,
    /// `Access-Control-Allow-Methods`, the joined list; `None` for `*`.
    allow_methods: Option<CompiledHeader>,
    any_method: bool,
    allow_headers: Option<CompiledHeader>,
    any_header: bool,
    expose_headers: Option<CompiledHeader>,
    max_age: CompiledHeader,
    credentials: Option<CompiledHeader>,
    allow_origin: CompiledHeader,
    request_headers_echo: CompiledHeader,
    method_echo: CompiledHeader,
    vary: CompiledHeader,
}

/// The response headers of one answer: a header (its name; and its value
/// when the value is constant) and the value to write.
pub type Answer<'a> = Vec<(&'a CompiledHeader, &'a [u8])>;

impl CompiledCors {
    /// Compiles a validated filter (an origin that does not parse, which
    /// validation refuses, allows nothing).
    pub fn new(c: &Cors) -> Self {
        let joined = |name: &str, list: &[String]| {
            let items: Vec<&str> = list.iter().map(String::as_str).filter(|v| *v != "*").collect();
            (!items.is_empty()).then(|| CompiledHeader::new(name, &items.join(", ")))
        };
        CompiledCors {
            origins: c.allow_origins.iter().filter_map(|o| OriginPattern::parse(o)).collect(),
            any_method: c.allow_methods.iter().any(|m| m == "*"),
            allow_methods: joined("Access-Control-Allow-Methods", &c.allow_methods),
            any_header: c.allow_headers.iter().any(|h| h == "*"),
            allow_headers: joined("Access-Control-Allow-Headers", &c.allow_headers),
            // `*` exposes every header, but only without credentials (the
            // Fetch standard); with them it would name a header `*`.
            expose_headers: if c.expose_headers.iter().any(|h| h == "*") && !c.allow_credentials {
                Some(CompiledHeader::new("Access-Control-Expose-Headers", "*"))
            } else {
                joined("Access-Control-Expose-Headers", &c.expose_headers)
            },
            max_age: CompiledHeader::new("Access-Control-Max-Age", &c.max_age.to_string()),
            credentials: c
                .allow_credentials
                .then(|| CompiledHeader::new("Access-Control-Allow-Credentials", "true")),
            allow_origin: CompiledHeader::new("Access-Control-Allow-Origin", ""),
            request_headers_echo: CompiledHeader::new("Access-Control-Allow-Headers", ""),
            method_echo: CompiledHeader::new("Access-Control-Allow-Methods", ""),
            vary: CompiledHeader::new("Vary", "Origin"),
        }
    }

    /// Whether `origin` (the request's `Origin`) may call the route.
    pub fn allows(&self, origin: &[u8]) -> bool {
        parse_origin(origin).is_some_and(|o| self.origins.iter().any(|p| p.allows(&o)))
    }

    /// The headers of the gateway's answer to a preflight: empty when the
    /// origin is not allowed.
    pub fn preflight<'a>(&'a self, origin: &'a [u8], method: &'a [u8], headers: Option<&'a [u8]>) -> Answer<'a> {
        let mut out = Vec::with_capacity(7);
        if !self.allows(origin) {
            return out;
        }
        out.push((&self.allow_origin, origin));
        if self.any_method {
            out.push((&self.method_echo, method));
        } else if let Some(h) = &self.allow_methods {
            out.push((h, h.value.as_bytes()));
        }
        match (self.any_header, headers) {
            (true, Some(asked)) => out.push((&self.request_headers_echo, asked)),
            _ => {
                if let Some(h) = &self.allow_headers {
                    out.push((h, h.value.as_bytes()));
                }
            }
        }
        self.common(&mut out);
        out.push((&self.max_age, self.max_age.value.as_bytes()));
        out
    }

    /// The headers added to the backend's response to a request that is
    /// no preflight (`origin`: its `Origin`, if any): the allow headers
    /// for an allowed origin, and always `Vary: Origin`, since the answer
    /// depends on it (a shared cache must not give one origin's answer to
    /// another).
    pub fn response<'a>(&'a self, origin: Option<&'a [u8]>) -> Answer<'a> {
        let mut out = Vec::with_capacity(4);
        if let Some(origin) = origin.filter(|o| self.allows(o)) {
            out.push((&self.allow_origin, origin));
            self.common(&mut out);
        } else {
            out.push((&self.vary, self.vary.value.as_bytes()));
        }
        out
    }

    fn common<'a>(&'a self, out: &mut Answer<'a>) {
        if let Some(h) = &self.credentials {
            out.push((h, h.value.as_bytes()));
        }
        if let Some(h) = &self.expose_headers {
            out.push((h, h.value.as_bytes()));
        }
        out.push((&self.vary, self.vary.value.as_bytes()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(origins: &[&str], methods: &[&str], headers: &[&str], credentials: bool) -> CompiledCors {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        CompiledCors::new(&Cors {
            allow_origins: list(origins),
            allow_methods: list(methods),
            allow_headers: list(headers),
            expose_headers: list(&["x-header-3", "x-header-4"]),
            allow_credentials: credentials,
            max_age: 3600,
        })
    }

    fn text<'a>(answer: &'a Answer<'a>) -> Vec<(&'a str, &'a str)> {
        answer
            .iter()
            .map(|(h, v)| (&*h.name, std::str::from_utf8(v).unwrap()))
            .collect()
    }

    #[test]
    fn origins_match_exactly_or_by_wildcard_with_the_same_scheme_and_port() {
        let f = filter(
            &["https://www.foo.com", "https://*.bar.com", "http://local:8080"],
            &["GET"],
            &[],
            false,
        );
        assert!(f.allows(b"https://www.foo.com"));
        assert!(f.allows(b"HTTPS://WWW.FOO.COM"), "scheme and host compare without case");
        assert!(
            f.allows(b"https://www.foo.com:443"),
            "the default port is the same origin"
        );
        assert!(!f.allows(b"http://www.foo.com"), "another scheme");
        assert!(!f.allows(b"https://www.foo.com:8443"), "another port");
        assert!(f.allows(b"https://www.bar.com"));
        assert!(
            f.allows(b"https://xpto.www.bar.com"),
            "a wildcard takes one or more labels"
        );
        assert!(!f.allows(b"https://bar.com"), "but not none");
        assert!(!f.allows(b"https://foobar.com"));
        assert!(f.allows(b"http://local:8080"));
        assert!(!f.allows(b"http://local"));
        assert!(!f.allows(b"null"), "an opaque origin matches no pattern");
        let any = filter(&["*"], &["PUT"], &[], false);
        assert!(any.allows(b"https://foobar.com:12345"));
        assert!(!any.allows(b"not an origin"));
    }

    #[test]
    fn a_preflight_lists_what_is_allowed_and_echoes_wildcards() {
        let f = filter(
            &["https://www.foo.com"],
            &["GET", "OPTIONS"],
            &["x-header-1", "x-header-2"],
            true,
        );
        let a = f.preflight(b"https://www.foo.com", b"GET", Some(b"x-header-1"));
        assert_eq!(
            text(&a),
            [
                ("Access-Control-Allow-Origin", "https://www.foo.com"),
                ("Access-Control-Allow-Methods", "GET, OPTIONS"),
                ("Access-Control-Allow-Headers", "x-header-1, x-header-2"),
                ("Access-Control-Allow-Credentials", "true"),
                ("Access-Control-Expose-Headers", "x-header-3, x-header-4"),
                ("Vary", "Origin"),
                ("Access-Control-Max-Age", "3600"),
            ]
        );
        assert!(f.preflight(b"https://foobar.com", b"GET", None).is_empty());
        let wild = filter(&["*"], &["*"], &["*"], false);
        let a = wild.preflight(b"https://other.foo.com", b"PUT", Some(b"x-a, x-b"));
        let a = text(&a);
        assert!(a.contains(&("Access-Control-Allow-Methods", "PUT")));
        assert!(a.contains(&("Access-Control-Allow-Headers", "x-a, x-b")));
        assert!(!a.iter().any(|(n, _)| *n == "Access-Control-Allow-Credentials"));
    }

    #[test]
    fn an_actual_request_gets_the_origin_credentials_and_exposed_headers() {
        let f = filter(&["https://*.bar.com"], &["GET"], &[], true);
        let a = f.response(Some(b"https://www.bar.com"));
        assert_eq!(
            text(&a),
            [
                ("Access-Control-Allow-Origin", "https://www.bar.com"),
                ("Access-Control-Allow-Credentials", "true"),
                ("Access-Control-Expose-Headers", "x-header-3, x-header-4"),
                ("Vary", "Origin"),
            ]
        );
        assert_eq!(text(&f.response(Some(b"https://foobar.com"))), [("Vary", "Origin")]);
        assert_eq!(
            text(&f.response(None)),
            [("Vary", "Origin")],
            "the answer varies by Origin"
        );
        let open = CompiledCors::new(&Cors {
            allow_origins: vec!["*".into()],
            expose_headers: vec!["*".into()],
            ..Cors::default()
        });
        assert!(text(&open.response(Some(b"https://a.test"))).contains(&("Access-Control-Expose-Headers", "*")));
    }

    #[test]
    fn requests_are_classified_by_method_and_headers() {
        assert_eq!(classify(b"GET", None, None, None), Kind::NotCors);
        assert_eq!(
            classify(b"OPTIONS", Some(b"https://a"), Some(b"PUT"), Some(b"")),
            Kind::Preflight {
                origin: b"https://a",
                method: b"PUT",
                headers: None
            }
        );
        assert_eq!(
            classify(b"OPTIONS", Some(b"https://a"), None, None),
            Kind::Actual { origin: b"https://a" },
            "an OPTIONS without Access-Control-Request-Method is an ordinary request"
        );
        assert_eq!(
            classify(b"GET", Some(b"https://a"), Some(b"PUT"), None),
            Kind::Actual { origin: b"https://a" }
        );
    }

    #[test]
    fn only_well_formed_patterns_are_accepted() {
        for ok in [
            "*",
            "https://a.b",
            "https://*.b.c",
            "http://a:8080",
            "https://[::1]:8443",
        ] {
            assert!(is_origin_pattern(ok), "{ok}");
        }
        for bad in [
            "",
            "a.b",
            "https://",
            "https://a/b",
            "https://a:0",
            "https://a.*",
            "https://*",
            "ftp://a",
            "https://a b",
        ] {
            assert!(!is_origin_pattern(bad), "{bad}");
        }
    }
}
