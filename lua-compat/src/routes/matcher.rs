//! The compiled route table and the per-request lookup.
//!
//! A worker compiles the table once per change (host groups in hash maps,
//! regular expressions built, prefixes normalised), so a request costs a
//! hash lookup for its host and a scan of that group's matches in the
//! precedence order the controller gave them, stopping at the first that
//! matches. Nothing here allocates per request.

use rustc_hash::FxHashMap as HashMap;
use std::borrow::Cow;

use regex::bytes::Regex;

pub use super::header::{ngx_hash_key, CompiledHeader};
use super::validate::compile_regex;
use super::{ListenerRoutes, PathMatch, RouteTable, Rule};
use crate::validate::ValidationError;

/// What a request offers to match against. The host is lower case and
/// without its port (nginx's `$host`), the path is the normalised, decoded
/// one nginx matches locations with (`$uri`).
pub trait RequestView {
    fn host(&self) -> &[u8];
    fn path(&self) -> &[u8];
    fn method(&self) -> &[u8];
    /// The first value of the header named `lower` (lower case).
    fn header(&self, lower: &str) -> Option<&[u8]>;
    /// The raw query string, without `?`.
    fn args(&self) -> &[u8];
}

/// A whole table, compiled.
#[derive(Debug, Default)]
pub struct Compiled {
    /// By name. Fx hashing: a request hashes its listener and host with
    /// it, and SipHash's cost per lookup showed in the instruction count.
    listeners: HashMap<Box<[u8]>, CompiledListener>,
    /// TLS to backends, by backend name: read when nginx connects to one
    /// (a request reaches that point only for a backend its rule marks
    /// [`CompiledRule::backend_tls`]).
    backend_tls: HashMap<Box<str>, super::BackendTls>,
}

#[derive(Debug)]
pub struct CompiledListener {
    pub port: u16,
    /// The index in `groups` of each hostname's matches.
    hosts: HostMap<usize>,
    groups: Vec<Vec<CompiledMatch>>,
    pub rules: Vec<CompiledRule>,
    /// Certificate ids by SNI, looked up as the host groups are, each
    /// with the index of its listener hostname (an HTTPS listener has one
    /// certificate per hostname).
    certificates: HostMap<(usize, Box<str>)>,
    /// Client certificate validation of this HTTPS server (its port's).
    pub client_validation: Option<super::ClientValidation>,
    /// The certificate id shown to backends reached over TLS.
    pub backend_client_certificate: Option<Box<str>>,
}

/// Values by host name: exact, else the longest wildcard that covers the
/// host with at least one label, else `*`.
#[derive(Debug)]
struct HostMap<T> {
    exact: ExactNames<T>,
    /// `(".example.com", value)`, longest suffix first.
    wildcards: Vec<(Box<[u8]>, T)>,
    any: Option<T>,
}

impl<T> HostMap<T> {
    fn new<'a>(entries: impl Iterator<Item = (&'a str, T)>) -> HostMap<T> {
        let mut exact = Vec::new();
        let mut map = HostMap {
            exact: ExactNames::Few(Vec::new()),
            wildcards: Vec::new(),
            any: None,
        };
        for (host, value) in entries {
            if host == "*" {
                map.any = Some(value);
            } else if let Some(suffix) = host.strip_prefix('*') {
                map.wildcards.push((suffix.as_bytes().into(), value));
            } else {
                exact.push((host.as_bytes().into(), value));
            }
        }
        map.exact = ExactNames::new(exact);
        map.wildcards.sort_by_key(|w| std::cmp::Reverse(w.0.len()));
        map
    }

    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcards.is_empty() && self.any.is_none()
    }

    fn get(&self, host: &[u8]) -> Option<&T> {
        if let Some(v) = self.exact.get(host) {
            return Some(v);
        }
        for (suffix, v) in &self.wildcards {
            if host.len() > suffix.len() && host.ends_with(suffix) {
                return Some(v);
            }
        }
        self.any.as_ref()
    }
}

/// Exact host names. A few are compared one by one: hashing a name and
/// probing costs more than comparing the lengths (and bytes) of a few, and
/// most listeners have a handful of hostnames. More are hashed.
#[derive(Debug)]
enum ExactNames<T> {
    Few(Vec<(Box<[u8]>, T)>),
    Many(HashMap<Box<[u8]>, T>),
}

/// At most this many names are compared one by one.
const FEW_NAMES: usize = 8;

impl<T> ExactNames<T> {
    /// A later entry for the same name replaces an earlier one.
    fn new(entries: Vec<(Box<[u8]>, T)>) -> Self {
        let mut many: HashMap<Box<[u8]>, T> = HashMap::default();
        let mut order = Vec::with_capacity(entries.len());
        for (name, value) in entries {
            if many.insert(name.clone(), value).is_none() {
                order.push(name);
            }
        }
        if order.len() > FEW_NAMES {
            return ExactNames::Many(many);
        }
        ExactNames::Few(
            order
                .into_iter()
                .filter_map(|name| many.remove(&name).map(|v| (name, v)))
                .collect(),
        )
    }

    fn get(&self, name: &[u8]) -> Option<&T> {
        match self {
            ExactNames::Few(few) => few.iter().find(|(n, _)| **n == *name).map(|(_, v)| v),
            ExactNames::Many(many) => many.get(name),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            ExactNames::Few(few) => few.is_empty(),
            ExactNames::Many(many) => many.is_empty(),
        }
    }
}

#[derive(Debug)]
struct CompiledMatch {
    path: PathTest,
    method: Option<Box<[u8]>>,
    headers: Vec<(Box<str>, ValueTest)>,
    query: Vec<(Box<[u8]>, ValueTest)>,
    rule: u32,
}

#[derive(Debug)]
enum PathTest {
    Exact(Box<[u8]>),
    /// Without its trailing `/` (`/` itself is empty).
    Prefix(Box<[u8]>),
    Regex(Regex),
}

#[derive(Debug)]
enum ValueTest {
    Exact(Box<[u8]>),
    Regex(Regex),
}

/// A rule with the sum of its backends' weights, and its header
/// modifiers ready for nginx's header lists.
#[derive(Debug)]
pub struct CompiledRule {
    pub rule: Rule,
    pub total_weight: u64,
    pub request_headers: Option<CompiledModifier>,
    pub response_headers: Option<CompiledModifier>,
    /// `URLRewrite`'s hostname, as the `Host` header it sets.
    pub rewrite_host: Option<CompiledHeader>,
    /// Each backend's own request header modifier, by backend index.
    pub backend_request_headers: Vec<Option<CompiledModifier>>,
    /// Each backend's own `URLRewrite` hostname, by backend index.
    pub backend_rewrite_host: Vec<Option<CompiledHeader>>,
    pub cors: Option<super::cors::CompiledCors>,
    /// Whether each backend (by index) is reached over TLS, so a request
    /// pays no lookup to know.
    pub backend_tls: Vec<bool>,
    /// The same for each `RequestMirror`.
    pub mirror_tls: Vec<bool>,
}

/// A header modifier whose names are lower-cased and hashed once per
/// table, as nginx's parser does per request (`ngx_hash` over the lower
/// case name), so applying it copies and computes nothing.
#[derive(Debug, Default)]
pub struct CompiledModifier {
    pub set: Vec<CompiledHeader>,
    pub add: Vec<CompiledHeader>,
    /// Values empty.
    pub remove: Vec<CompiledHeader>,
}

impl CompiledModifier {
    fn new(m: &super::HeaderModifier) -> Self {
        CompiledModifier {
            set: m.set.iter().map(|h| CompiledHeader::new(&h.name, &h.value)).collect(),
            add: m.add.iter().map(|h| CompiledHeader::new(&h.name, &h.value)).collect(),
            remove: m.remove.iter().map(|n| CompiledHeader::new(n, "")).collect(),
        }
    }
}

/// The match a request found.
#[derive(Debug, Clone, Copy)]
pub struct Found<'a> {
    pub rule: &'a CompiledRule,
    /// How many bytes of the path a `PathPrefix` match covered (for
    /// `ReplacePrefixMatch`); 0 for other matches.
    pub prefix_len: usize,
}

/// What the lookup concluded.
#[derive(Debug)]
pub enum Lookup<'a> {
    Found(Found<'a>),
    /// The listener has no route for the request's host and path: 404.
    NoRoute,
    /// The table has no such listener (not pushed yet, or removed).
    NoListener,
}

impl Compiled {
    /// Compiles a validated table. Fails only on a regular expression that
    /// no longer compiles (validation compiled it already).
    pub fn new(table: &RouteTable) -> Result<Compiled, ValidationError> {
        let backend_tls: HashMap<Box<str>, super::BackendTls> = table
            .backend_tls
            .iter()
            .map(|b| (b.backend.as_str().into(), b.clone()))
            .collect();
        let mut listeners = HashMap::default();
        for (i, l) in table.listeners.iter().enumerate() {
            let compiled = compile_listener(l, &backend_tls)
                .map_err(|(path, e)| ValidationError::at(format!("listeners[{i}].{path}"), e))?;
            listeners.insert(l.name.as_bytes().into(), compiled);
        }
        Ok(Compiled { listeners, backend_tls })
    }

    /// How nginx reaches backend `name` over TLS; `None`: in the clear.
    pub fn backend_tls(&self, name: &str) -> Option<&super::BackendTls> {
        self.backend_tls.get(name)
    }

    /// Whether the backend named `name` (bytes from nginx) is reached over
    /// TLS; cheap when no backend is.
    pub fn is_tls_backend(&self, name: &[u8]) -> bool {
        !self.backend_tls.is_empty() && std::str::from_utf8(name).is_ok_and(|name| self.backend_tls.contains_key(name))
    }

    pub fn listener(&self, name: &[u8]) -> Option<&CompiledListener> {
        self.listeners.get(name)
    }

    /// The rule for a request on listener `name`.
    pub fn find<R: RequestView>(&self, name: &[u8], req: &R) -> Lookup<'_> {
        match self.listeners.get(name) {
            None => Lookup::NoListener,
            Some(l) => l.find(req).map_or(Lookup::NoRoute, Lookup::Found),
        }
    }
}

fn compile_listener(
    l: &ListenerRoutes,
    backend_tls: &HashMap<Box<str>, super::BackendTls>,
) -> Result<CompiledListener, (String, String)> {
    let over_tls = |name: Option<&str>| !l.tls_passthrough && name.is_some_and(|n| backend_tls.contains_key(n));
    let mut groups = Vec::with_capacity(l.hosts.len());
    for (g, group) in l.hosts.iter().enumerate() {
        let mut matches = Vec::with_capacity(group.matches.len());
        for (m, rm) in group.matches.iter().enumerate() {
            let at = |what: &str| format!("hosts[{g}].matches[{m}].{what}");
            let path = match &rm.path {
                PathMatch::Exact(p) => PathTest::Exact(p.as_bytes().into()),
                PathMatch::PathPrefix(p) => PathTest::Prefix(p.trim_end_matches('/').as_bytes().into()),
                PathMatch::RegularExpression(r) => PathTest::Regex(compile_regex(r).map_err(|e| (at("path"), e))?),
            };
            let value = |v: &super::ValueMatch, what: String| -> Result<ValueTest, (String, String)> {
                Ok(if v.regex {
                    ValueTest::Regex(compile_regex(&v.value).map_err(|e| (what, e))?)
                } else {
                    ValueTest::Exact(v.value.as_bytes().into())
                })
            };
            let mut headers = Vec::with_capacity(rm.headers.len());
            for (i, h) in rm.headers.iter().enumerate() {
                headers.push((
                    h.name.to_ascii_lowercase().into(),
                    value(h, at(&format!("headers[{i}]")))?,
                ));
            }
            let mut query = Vec::with_capacity(rm.query.len());
            for (i, q) in rm.query.iter().enumerate() {
                query.push((q.name.as_bytes().into(), value(q, at(&format!("query[{i}]")))?));
            }
            matches.push(CompiledMatch {
                path,
                method: rm.method.as_ref().map(|m| m.as_bytes().into()),
                headers,
                query,
                rule: rm.rule,
            });
        }
        groups.push(matches);
    }
    let rules = l
        .rules
        .iter()
        .map(|r| CompiledRule {
            rule: r.clone(),
            total_weight: r.backends.iter().map(|b| u64::from(b.weight)).sum(),
            request_headers: r.filters.request_headers.as_ref().map(CompiledModifier::new),
            backend_request_headers: r
                .backends
                .iter()
                .map(|b| b.request_headers.as_ref().map(CompiledModifier::new))
                .collect(),
            backend_rewrite_host: r
                .backends
                .iter()
                .map(|b| {
                    b.rewrite
                        .as_ref()
                        .and_then(|w| w.hostname.as_deref())
                        .map(|h| CompiledHeader::new("Host", h))
                })
                .collect(),
            cors: r.filters.cors.as_ref().map(super::cors::CompiledCors::new),
            backend_tls: r.backends.iter().map(|b| over_tls(b.backend.as_deref())).collect(),
            mirror_tls: r.filters.mirrors.iter().map(|m| over_tls(Some(&m.backend))).collect(),
            response_headers: r.filters.response_headers.as_ref().map(CompiledModifier::new),
            rewrite_host: r
                .filters
                .rewrite
                .as_ref()
                .and_then(|w| w.hostname.as_deref())
                .map(|h| CompiledHeader::new("Host", h)),
        })
        .collect();
    Ok(CompiledListener {
        port: l.port,
        hosts: HostMap::new(
            l.hosts
                .iter()
                .enumerate()
                .map(|(g, group)| (group.hostname.as_str(), g)),
        ),
        groups,
        rules,
        certificates: HostMap::new(
            l.certificates
                .iter()
                .enumerate()
                .map(|(i, c)| (c.hostname.as_str(), (i, Box::from(c.certificate.as_str())))),
        ),
        client_validation: l.client_validation.clone(),
        backend_client_certificate: l.backend_client_certificate.as_deref().map(Box::from),
    })
}

impl CompiledListener {
    /// The certificate id for a handshake's SNI (lower-cased, without a
    /// trailing dot; `None` without SNI, which only `*` serves).
    pub fn certificate(&self, sni: Option<&str>) -> Option<&str> {
        match sni {
            Some(host) => self.certificates.get(host.as_bytes()),
            None => self.certificates.any.as_ref(),
        }
        .map(|(_, id)| &**id)
    }

    /// Whether a request is misdirected (the spec's 421): its connection's
    /// SNI chose one listener of this port (the most specific hostname
    /// that covers it) and its `Host` belongs to another, or to none. Its
    /// routes, and the certificate the client checked, are that other
    /// listener's business. Always false on a port without TLS.
    pub fn misdirected(&self, sni: &[u8], host: &[u8]) -> bool {
        match self.certificates.get(sni) {
            Some((by_sni, _)) => self.certificates.get(host).map(|(i, _)| i) != Some(by_sni),
            None => false,
        }
    }

    /// Whether the listener serves TLS (it has certificates).
    pub fn has_certificates(&self) -> bool {
        !self.certificates.is_empty()
    }

    /// The group for `host`: exact, else the longest wildcard that covers
    /// it with at least one label, else `*`.
    fn group(&self, host: &[u8]) -> Option<usize> {
        self.hosts.get(host).copied()
    }

    pub fn find<R: RequestView>(&self, req: &R) -> Option<Found<'_>> {
        let group = &self.groups[self.group(req.host())?];
        let path = req.path();
        for m in group {
            let Some(prefix_len) = path_matches(&m.path, path) else {
                continue;
            };
            if m.method.as_deref().is_some_and(|want| want != req.method()) {
                continue;
            }
            if !m
                .headers
                .iter()
                .all(|(name, test)| req.header(name).is_some_and(|v| test.matches(trim_ows(v))))
            {
                continue;
            }
            if !m
                .query
                .iter()
                .all(|(name, test)| query_value(req.args(), name).is_some_and(|v| test.matches(&v)))
            {
                continue;
            }
            return Some(Found {
                rule: &self.rules[m.rule as usize],
                prefix_len,
            });
        }
        None
    }
}

impl ValueTest {
    fn matches(&self, v: &[u8]) -> bool {
        match self {
            ValueTest::Exact(want) => **want == *v,
            ValueTest::Regex(re) => re.is_match(v),
        }
    }
}

/// `Some(bytes covered by a prefix)` when `path` matches.
fn path_matches(test: &PathTest, path: &[u8]) -> Option<usize> {
    match test {
        PathTest::Exact(p) => (**p == *path).then_some(0),
        PathTest::Prefix(p) => {
            let covered = path.starts_with(p) && (path.len() == p.len() || path[p.len()] == b'/');
            covered.then_some(p.len())
        }
        PathTest::Regex(re) => re.is_match(path).then_some(0),
    }
}

fn trim_ows(v: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    // nginx's parser has already trimmed the values it read: the common
    // case costs two tests.
    if v.first().is_none_or(|b| !ows(b)) && v.last().is_none_or(|b| !ows(b)) {
        return v;
    }
    let start = v.iter().position(|b| *b != b' ' && *b != b'\t').unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| *b != b' ' && *b != b'\t')
        .map_or(start, |e| e + 1);
    &v[start..end]
}

/// The host a TLS connection's server name routes by, as `$host` is for
/// an HTTP request: lower case, without the one trailing dot a fully
/// qualified name may carry (`Example.COM.` and `example.com` are one DNS
/// name, and the certificate lookup already treats them as one).
pub fn sni_host(sni: &[u8]) -> Vec<u8> {
    sni.strip_suffix(b".").unwrap_or(sni).to_ascii_lowercase()
}

/// The first value of query parameter `name` in `args`, percent-decoded
/// (names compared decoded too). No allocation unless something is encoded.
pub fn query_value<'a>(args: &'a [u8], name: &[u8]) -> Option<Cow<'a, [u8]>> {
    args.split(|b| *b == b'&').find_map(|pair| {
        let (k, v) = match pair.iter().position(|b| *b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &pair[pair.len()..]),
        };
        (percent_decode(k) == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &[u8]) -> Cow<'_, [u8]> {
    if !s.contains(&b'%') {
        return Cow::Borrowed(s);
    }
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            if let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod sni_tests {
    use super::sni_host;

    #[test]
    fn a_server_name_routes_as_its_host() {
        assert_eq!(sni_host(b"Example.COM."), b"example.com");
        assert_eq!(sni_host(b"a.example.com"), b"a.example.com");
        assert_eq!(sni_host(b"a.example.com.."), b"a.example.com.", "one dot only");
        assert_eq!(sni_host(b""), b"");
        assert_eq!(sni_host(b"."), b"");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::validate::parse_routes;

    struct Req {
        host: &'static str,
        path: &'static str,
        method: &'static str,
        headers: Vec<(&'static str, &'static str)>,
        args: &'static str,
    }

    impl RequestView for Req {
        fn host(&self) -> &[u8] {
            self.host.as_bytes()
        }
        fn path(&self) -> &[u8] {
            self.path.as_bytes()
        }
        fn method(&self) -> &[u8] {
            self.method.as_bytes()
        }
        fn header(&self, lower: &str) -> Option<&[u8]> {
            self.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(lower))
                .map(|(_, v)| v.as_bytes())
        }
        fn args(&self) -> &[u8] {
            self.args.as_bytes()
        }
    }

    fn get(host: &'static str, path: &'static str) -> Req {
        Req {
            host,
            path,
            method: "GET",
            headers: vec![],
            args: "",
        }
    }

    fn compiled() -> Compiled {
        let body = serde_json::json!({"listeners": [{
            "name": "ns/gw/80", "port": 80,
            "hosts": [
                {"hostname": "foo.example.com", "matches": [
                    {"path": {"type": "Exact", "value": "/exact"}, "rule": 0},
                    {"path": {"type": "PathPrefix", "value": "/"}, "headers": [{"name": "X-Version", "value": "2"}], "rule": 1},
                    {"path": {"type": "PathPrefix", "value": "/"}, "rule": 2}]},
                {"hostname": "*.example.com", "matches": [
                    {"path": {"type": "PathPrefix", "value": "/api/"}, "method": "POST", "rule": 3},
                    {"path": {"type": "PathPrefix", "value": "/"}, "query": [{"name": "v", "value": "a b"}], "rule": 4}]},
                {"hostname": "*", "matches": [{"path": {"type": "RegularExpression", "value": "/re/[0-9]+"}, "rule": 5}]}
            ],
            "rules": (0..6).map(|i| serde_json::json!({"route": format!("ns/r{i}"), "backends": [{"backend": format!("b{i}"), "weight": 1}]})).collect::<Vec<_>>()
        }]});
        Compiled::new(&parse_routes(body.to_string().as_bytes()).unwrap()).unwrap()
    }

    fn route_of(c: &Compiled, req: &Req) -> Option<String> {
        match c.find(b"ns/gw/80", req) {
            Lookup::Found(f) => Some(f.rule.rule.route.clone()),
            _ => None,
        }
    }

    #[test]
    fn hosts_paths_headers_methods_and_queries() {
        let c = compiled();
        assert_eq!(
            route_of(&c, &get("foo.example.com", "/exact")).as_deref(),
            Some("ns/r0")
        );
        assert_eq!(
            route_of(&c, &get("foo.example.com", "/exact/x")).as_deref(),
            Some("ns/r2")
        );
        let mut v2 = get("foo.example.com", "/x");
        v2.headers.push(("x-version", " 2 "));
        assert_eq!(route_of(&c, &v2).as_deref(), Some("ns/r1"));
        // A wildcard covers one or more labels, never the bare parent.
        let mut post = get("a.b.example.com", "/api");
        post.method = "POST";
        assert_eq!(route_of(&c, &post).as_deref(), Some("ns/r3"));
        let mut q = get("bar.example.com", "/anything");
        q.args = "x=1&v=a%20b&v=other";
        assert_eq!(route_of(&c, &q).as_deref(), Some("ns/r4"));
        assert_eq!(route_of(&c, &get("bar.example.com", "/apix")), None);
        assert_eq!(route_of(&c, &get("example.com", "/re/12")).as_deref(), Some("ns/r5"));
        assert_eq!(route_of(&c, &get("example.com", "/re/12x")), None);
        assert!(matches!(c.find(b"other", &get("x", "/")), Lookup::NoListener));
    }

    #[test]
    fn prefixes_match_whole_segments() {
        let t = PathTest::Prefix(b"/api".as_slice().into());
        assert_eq!(path_matches(&t, b"/api"), Some(4));
        assert_eq!(path_matches(&t, b"/api/"), Some(4));
        assert_eq!(path_matches(&t, b"/api/v1"), Some(4));
        assert_eq!(path_matches(&t, b"/apiv1"), None);
        let root = PathTest::Prefix(b"".as_slice().into());
        assert_eq!(path_matches(&root, b"/anything"), Some(0));
    }

    #[test]
    fn certificates_by_sni_exact_then_longest_wildcard_then_any() {
        let body = serde_json::json!({"listeners": [{"name": "ns/gw/443", "port": 443, "hosts": [], "rules": [],
            "certificates": [
                {"hostname": "*", "certificate": "ns_any"},
                {"hostname": "*.example.com", "certificate": "ns_wild"},
                {"hostname": "*.a.example.com", "certificate": "ns_deeper"},
                {"hostname": "www.example.com", "certificate": "ns_www"}]}]});
        let c = Compiled::new(&parse_routes(body.to_string().as_bytes()).unwrap()).unwrap();
        let l = c.listener(b"ns/gw/443").unwrap();
        assert_eq!(l.certificate(Some("www.example.com")), Some("ns_www"));
        assert_eq!(l.certificate(Some("x.a.example.com")), Some("ns_deeper"));
        assert_eq!(l.certificate(Some("x.example.com")), Some("ns_wild"));
        // A wildcard never covers its own parent.
        assert_eq!(l.certificate(Some("example.com")), Some("ns_any"));
        assert_eq!(l.certificate(None), Some("ns_any"));
        let bad = serde_json::json!({"listeners": [{"name": "l", "port": 443, "hosts": [], "rules": [],
            "certificates": [{"hostname": "*", "certificate": "../x"}]}]});
        let e = parse_routes(bad.to_string().as_bytes()).unwrap_err();
        assert_eq!(e.path, "listeners[0].certificates[0].certificate");
        let dup = serde_json::json!({"listeners": [{"name": "l", "port": 443, "hosts": [], "rules": [],
            "certificates": [{"hostname": "a.test", "certificate": "x"}, {"hostname": "a.test", "certificate": "y"}]}]});
        assert!(parse_routes(dup.to_string().as_bytes()).is_err());
    }

    #[test]
    fn a_host_of_another_listener_than_the_sni_is_misdirected() {
        let body = serde_json::json!({"listeners": [{"name": "ns/gw/443", "port": 443, "hosts": [], "rules": [],
            "certificates": [
                {"hostname": "*", "certificate": "ns_any"},
                {"hostname": "second.org", "certificate": "ns_second"},
                {"hostname": "*.wild.org", "certificate": "ns_wild"},
                {"hostname": "four.wild.org", "certificate": "ns_four"}]}]});
        let c = Compiled::new(&parse_routes(body.to_string().as_bytes()).unwrap()).unwrap();
        let l = c.listener(b"ns/gw/443").unwrap();
        assert!(l.has_certificates());
        for (sni, host, misdirected) in [
            ("example.org", "example.org", false),
            ("example.org", "second.org", true),
            ("example.org", "unknown.org", false),
            ("second.org", "unknown.org", true),
            ("three.wild.org", "five.wild.org", false),
            ("three.wild.org", "four.wild.org", true),
            ("four.wild.org", "five.wild.org", true),
            ("unknown.org", "example.org", false),
        ] {
            assert_eq!(
                l.misdirected(sni.as_bytes(), host.as_bytes()),
                misdirected,
                "{sni} {host}"
            );
        }
        let plain = serde_json::json!({"listeners": [{"name": "p", "port": 80, "hosts": [], "rules": []}]});
        let c = Compiled::new(&parse_routes(plain.to_string().as_bytes()).unwrap()).unwrap();
        let l = c.listener(b"p").unwrap();
        assert!(!l.has_certificates() && !l.misdirected(b"a", b"b"));
    }

    #[test]
    fn a_passthrough_listener_never_originates_tls() {
        let rules = serde_json::json!([{"route": "a/r", "backends": [{"backend": "svc", "weight": 1}]}]);
        let table = serde_json::json!({
            "listeners": [
                {"name": "terminate", "port": 443, "hosts": [], "rules": rules},
                {"name": "passthrough", "port": 8443, "hosts": [], "rules": rules, "tlsPassthrough": true},
            ],
            "backendTls": [{"backend": "svc", "hostname": "svc.test"}],
        });
        let c = Compiled::new(&parse_routes(table.to_string().as_bytes()).unwrap()).unwrap();
        assert_eq!(c.listener(b"terminate").unwrap().rules[0].backend_tls, [true]);
        assert_eq!(c.listener(b"passthrough").unwrap().rules[0].backend_tls, [false]);
    }

    #[test]
    fn exact_names_are_found_whether_few_or_many() {
        for n in [0, 1, FEW_NAMES, FEW_NAMES + 1, 100] {
            let mut entries: Vec<(Box<[u8]>, usize)> =
                (0..n).map(|i| (format!("h{i}.test").into_bytes().into(), i)).collect();
            // A repeated name: the later entry wins, as a map's insert does.
            if n > 0 {
                entries.push((b"h0.test".as_slice().into(), 999));
            }
            let names = ExactNames::new(entries);
            assert_eq!(matches!(names, ExactNames::Few(_)), n <= FEW_NAMES, "{n}");
            assert_eq!(names.is_empty(), n == 0);
            for i in 1..n {
                assert_eq!(names.get(format!("h{i}.test").as_bytes()), Some(&i));
            }
            assert_eq!(names.get(b"h0.test"), (n > 0).then_some(&999));
            assert_eq!(names.get(b"h0.tes"), None);
            assert_eq!(names.get(b""), None);
        }
    }

    #[test]
    fn header_values_lose_surrounding_whitespace_only() {
        for (raw, trimmed) in [
            ("v", "v"),
            ("", ""),
            (" \t ", ""),
            (" v", "v"),
            ("v\t", "v"),
            ("\t a b \t", "a b"),
            ("a \t b", "a \t b"),
        ] {
            assert_eq!(trim_ows(raw.as_bytes()), trimmed.as_bytes(), "{raw:?}");
        }
    }

    #[test]
    fn query_values_are_decoded() {
        assert_eq!(
            query_value(b"a=1&b=%41%zz&b=2", b"b").as_deref(),
            Some(b"A%zz".as_slice())
        );
        assert_eq!(query_value(b"flag&a=1", b"flag").as_deref(), Some(b"".as_slice()));
        assert_eq!(query_value(b"a=1", b"b"), None);
        assert_eq!(query_value(b"a=%4", b"a").as_deref(), Some(b"%4".as_slice()));
    }
}
