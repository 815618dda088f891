//! Parsing and validating `PUT /configuration/routes`.
//!
//! Every value a worker matches with, writes into a request or response
//! header, or puts into a `Location` is checked here against the Gateway
//! API's own limits (16 matches of a kind, 16 backends, weights up to
//! 1,000,000) and against what HTTP allows in that place (no CR, LF or NUL
//! in a header value, a token as a header name), so a stored table cannot
//! make a worker misbehave. The controller runs the same check before it
//! pushes.

use std::collections::HashSet;

use super::{
    BackendTls, HeaderModifier, ListenerRoutes, PathMatch, PathModifier, RouteTable, Rule, SubjectAltName, ValueMatch,
};
use crate::validate::{check_name, deserialize, is_dns_label, ValidationError};

/// Listeners in one table.
pub const MAX_LISTENERS: usize = 4096;
/// Most certificates one server names (a Gateway has at most 64 listeners).
pub const MAX_LISTENER_CERTIFICATES: usize = 64;
/// Largest CA bundle one server trusts for client certificates, in bytes
/// of PEM (16 references of a Gateway, each a few CAs).
pub const MAX_CA_BUNDLE: usize = 256 * 1024;
/// Most CA certificates in one bundle.
pub const MAX_CA_CERTIFICATES: usize = 128;
/// Backends reached over TLS in one table (a BackendTLSPolicy per
/// Service port at most).
pub const MAX_BACKEND_TLS: usize = 4096;
/// All the CA bundles of `backendTls` together, in bytes of PEM: the
/// table lives in shared memory, and one tenant's policies must not fill it.
pub const MAX_BACKEND_CA_TOTAL: usize = 16 * 1024 * 1024;
/// Subject alternative names one backend may be accepted by (the Gateway
/// API's maximum).
pub const MAX_SUBJECT_ALT_NAMES: usize = 5;
/// Longest URI subject alternative name (the Gateway API's maximum).
pub const MAX_SAN_URI_LEN: usize = 253;
/// Header or query matches in one match, and entries in one header
/// modifier list (the Gateway API's maximum).
pub const MAX_VALUE_MATCHES: usize = 16;
/// Backends of one rule (the Gateway API's maximum).
pub const MAX_BACKENDS: usize = 16;
/// The most retries a rule may ask for.
pub const MAX_RETRY_ATTEMPTS: u32 = 16;
/// The response codes nginx's upstream can retry on (`proxy_next_upstream
/// http_500` and its siblings).
pub const RETRYABLE_CODES: [u16; 7] = [403, 404, 429, 500, 502, 503, 504];
/// `RequestMirror` filters of one rule.
pub const MAX_MIRRORS: usize = 16;
/// Entries in one CORS list (the Gateway API's maximum is 64).
pub const MAX_CORS_ENTRIES: usize = 64;
/// The longest rule timeout: a day (nginx's timers take milliseconds).
pub const MAX_TIMEOUT_MS: u32 = 86_400_000;
/// Largest backend weight (the Gateway API's maximum).
pub const MAX_WEIGHT: u32 = 1_000_000;
/// Longest path, path modifier or regular expression.
pub const MAX_PATH_LEN: usize = 1024;
/// Longest header value, in a match or a modifier.
pub const MAX_HEADER_VALUE_LEN: usize = 4096;
/// Longest header or query parameter name.
pub const MAX_NAME_LEN: usize = 256;
/// Largest compiled regular expression, in bytes of the regex crate's
/// program: a hostile pattern cannot make a worker build a huge automaton.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// The methods an HTTPRoute may match (the spec's enum).
pub const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// A CA bundle is PEM `CERTIFICATE` blocks and nothing else PEM: a
/// private key pasted into a ConfigMap by mistake is refused, not stored.
/// The module parses the blocks with OpenSSL when the table is pushed.
pub fn check_ca_bundle(pem: &str) -> Result<(), String> {
    if pem.len() > MAX_CA_BUNDLE {
        return Err(format!("larger than {MAX_CA_BUNDLE} bytes"));
    }
    let mut blocks = 0usize;
    let mut open = false;
    for line in pem.lines().map(str::trim_end) {
        if let Some(label) = line.strip_prefix("-----BEGIN ") {
            if open || label != "CERTIFICATE-----" {
                return Err(format!("{line:?}: only CERTIFICATE blocks are allowed"));
            }
            open = true;
        } else if let Some(label) = line.strip_prefix("-----END ") {
            if !open || label != "CERTIFICATE-----" {
                return Err(format!("{line:?} does not close a CERTIFICATE block"));
            }
            open = false;
            blocks += 1;
        } else if open && !line.bytes().all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b)) {
            return Err("a CERTIFICATE block holds something other than base64".into());
        }
    }
    if open {
        return Err("a CERTIFICATE block is not closed".into());
    }
    match blocks {
        0 => Err("no PEM CERTIFICATE block".into()),
        n if n > MAX_CA_CERTIFICATES => Err(format!("more than {MAX_CA_CERTIFICATES} certificates")),
        _ => Ok(()),
    }
}

/// Parses and validates a whole route table.
pub fn parse_routes(body: &[u8]) -> Result<RouteTable, ValidationError> {
    let table: RouteTable = deserialize(body)?;
    validate_routes(&table)?;
    Ok(table)
}

/// Validates a parsed route table: the first bad value, with its path.
pub fn validate_routes(table: &RouteTable) -> Result<(), ValidationError> {
    if table.listeners.len() > MAX_LISTENERS {
        return Err(ValidationError::at(
            "listeners",
            format!("more than {MAX_LISTENERS} listeners"),
        ));
    }
    let mut names = HashSet::new();
    for (i, l) in table.listeners.iter().enumerate() {
        let at = format!("listeners[{i}]");
        check_listener(l, &at)?;
        if !names.insert(l.name.as_str()) {
            return Err(ValidationError::at(
                format!("{at}.name"),
                format!("duplicate listener {:?}", l.name),
            ));
        }
    }
    if table.backend_tls.len() > MAX_BACKEND_TLS {
        return Err(ValidationError::at(
            "backendTls",
            format!("more than {MAX_BACKEND_TLS} backends"),
        ));
    }
    let mut backends = HashSet::new();
    let mut ca_total = 0usize;
    for (i, b) in table.backend_tls.iter().enumerate() {
        let at = format!("backendTls[{i}]");
        check_backend_tls(b).map_err(|(field, e)| ValidationError::at(format!("{at}.{field}"), e))?;
        if !backends.insert(b.backend.as_str()) {
            return Err(ValidationError::at(
                format!("{at}.backend"),
                format!("duplicate backend {:?}", b.backend),
            ));
        }
        ca_total += b.ca_certificates.as_ref().map_or(0, String::len);
        if ca_total > MAX_BACKEND_CA_TOTAL {
            return Err(ValidationError::at(
                format!("{at}.caCertificates"),
                format!("the CA bundles of backendTls come to more than {MAX_BACKEND_CA_TOTAL} bytes"),
            ));
        }
    }
    Ok(())
}

/// One backend's TLS: a host name to send as SNI (no wildcard, no IP
/// address), a CA bundle as [`check_ca_bundle`] takes, and at most
/// [`MAX_SUBJECT_ALT_NAMES`] names, each a host name (`*.` may lead) or an
/// absolute URI of printable ASCII.
pub fn check_backend_tls(b: &BackendTls) -> Result<(), (String, String)> {
    check_name(&b.backend).map_err(|e| ("backend".to_string(), e))?;
    if !is_route_hostname(&b.hostname, false) {
        return Err((
            "hostname".into(),
            format!("{:?} is not a lower-case host name", b.hostname),
        ));
    }
    if let Some(pem) = &b.ca_certificates {
        check_ca_bundle(pem).map_err(|e| ("caCertificates".to_string(), e))?;
    }
    if b.subject_alt_names.len() > MAX_SUBJECT_ALT_NAMES {
        return Err((
            "subjectAltNames".into(),
            format!("more than {MAX_SUBJECT_ALT_NAMES} names"),
        ));
    }
    for (i, san) in b.subject_alt_names.iter().enumerate() {
        let ok = match san {
            SubjectAltName::Hostname(h) => is_route_hostname(h, true),
            SubjectAltName::Uri(u) => is_san_uri(u),
        };
        if !ok {
            return Err((
                format!("subjectAltNames[{i}]"),
                format!("{san:?} is not a lower-case host name or an absolute URI of at most {MAX_SAN_URI_LEN} printable characters"),
            ));
        }
    }
    Ok(())
}

/// An absolute URI (`scheme:` then at least one character), printable
/// ASCII without space, as a certificate's URI name is compared.
fn is_san_uri(u: &str) -> bool {
    let Some((scheme, rest)) = u.split_once(':') else {
        return false;
    };
    u.len() <= MAX_SAN_URI_LEN
        && !rest.is_empty()
        && scheme.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        && u.bytes().all(|b| b.is_ascii_graphic())
}

fn check_listener(l: &ListenerRoutes, at: &str) -> Result<(), ValidationError> {
    let bad = |field: &str, message: String| ValidationError::at(format!("{at}.{field}"), message);
    if l.name.is_empty()
        || l.name.len() > 253
        || !l
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/' | b':'))
    {
        return Err(bad(
            "name",
            "must be 1-253 letters, digits, '.', '_', '-', '/' or ':'".into(),
        ));
    }
    if l.port == 0 {
        return Err(bad("port", "must be 1-65535".into()));
    }
    if l.certificates.len() > MAX_LISTENER_CERTIFICATES {
        return Err(bad(
            "certificates",
            format!("more than {MAX_LISTENER_CERTIFICATES} certificates"),
        ));
    }
    let mut sni = HashSet::new();
    for (c, cert) in l.certificates.iter().enumerate() {
        let at = format!("{at}.certificates[{c}]");
        if cert.hostname != "*" && !is_route_hostname(&cert.hostname, true) {
            return Err(ValidationError::at(
                format!("{at}.hostname"),
                format!("{:?} is not a lower-case host name, a *.wildcard or *", cert.hostname),
            ));
        }
        if !sni.insert(cert.hostname.as_str()) {
            return Err(ValidationError::at(
                format!("{at}.hostname"),
                format!("duplicate certificate host {:?}", cert.hostname),
            ));
        }
        crate::certificates::check_id(&cert.certificate)
            .map_err(|e| ValidationError::at(format!("{at}.certificate"), e))?;
    }
    if let Some(v) = &l.client_validation {
        if l.certificates.is_empty() {
            return Err(bad(
                "clientValidation",
                "only an HTTPS server (one with certificates) can validate client certificates".into(),
            ));
        }
        check_ca_bundle(&v.ca_certificates)
            .map_err(|e| ValidationError::at(format!("{at}.clientValidation.caCertificates"), e))?;
    }
    if let Some(id) = &l.backend_client_certificate {
        crate::certificates::check_id(id).map_err(|e| bad("backendClientCertificate", e))?;
    }
    let mut hosts = HashSet::new();
    for (h, group) in l.hosts.iter().enumerate() {
        let at = format!("{at}.hosts[{h}]");
        if group.hostname != "*" && !is_route_hostname(&group.hostname, true) {
            return Err(ValidationError::at(
                format!("{at}.hostname"),
                format!("{:?} is not a lower-case host name, a *.wildcard or *", group.hostname),
            ));
        }
        if !hosts.insert(group.hostname.as_str()) {
            return Err(ValidationError::at(
                format!("{at}.hostname"),
                format!("duplicate host group {:?}", group.hostname),
            ));
        }
        for (m, route_match) in group.matches.iter().enumerate() {
            let at = format!("{at}.matches[{m}]");
            if route_match.rule as usize >= l.rules.len() {
                return Err(ValidationError::at(
                    format!("{at}.rule"),
                    format!("no rule {} (the listener has {})", route_match.rule, l.rules.len()),
                ));
            }
            check_path_match(&route_match.path).map_err(|e| ValidationError::at(format!("{at}.path"), e))?;
            if let Some(method) = &route_match.method {
                if !METHODS.contains(&method.as_str()) {
                    return Err(ValidationError::at(
                        format!("{at}.method"),
                        format!("{method:?} is not one of {}", METHODS.join(", ")),
                    ));
                }
            }
            check_value_matches(&route_match.headers, true)
                .map_err(|(i, e)| ValidationError::at(format!("{at}.headers[{i}]"), e))?;
            check_value_matches(&route_match.query, false)
                .map_err(|(i, e)| ValidationError::at(format!("{at}.query[{i}]"), e))?;
            if replaces_prefix(&l.rules[route_match.rule as usize])
                && !matches!(route_match.path, PathMatch::PathPrefix(_))
            {
                return Err(ValidationError::at(
                    format!("{at}.path"),
                    "a rule with ReplacePrefixMatch needs PathPrefix matches",
                ));
            }
        }
    }
    for (r, rule) in l.rules.iter().enumerate() {
        check_rule(rule, &format!("{at}.rules[{r}]"))?;
    }
    Ok(())
}

/// Whether a redirect or rewrite of the rule (or of one of its backends)
/// replaces what a prefix match matched.
fn replaces_prefix(rule: &Rule) -> bool {
    let f = &rule.filters;
    f.redirect
        .as_ref()
        .and_then(|r| r.path.as_ref())
        .into_iter()
        .chain(
            f.rewrite
                .iter()
                .chain(rule.backends.iter().filter_map(|b| b.rewrite.as_ref()))
                .filter_map(|r| r.path.as_ref()),
        )
        .any(|p| matches!(p, PathModifier::ReplacePrefixMatch(_)))
}

fn check_rewrite(r: &super::Rewrite) -> Result<(), (&'static str, String)> {
    if let Some(h) = &r.hostname {
        if !is_route_hostname(h, false) {
            return Err(("hostname", format!("{h:?} is not a host name")));
        }
    }
    if let Some(p) = &r.path {
        check_path_modifier(p).map_err(|e| ("path", e))?;
    }
    Ok(())
}

fn check_cors(c: &super::cors::Cors) -> Result<(), (&'static str, String)> {
    for (field, list) in [
        ("allowOrigins", &c.allow_origins),
        ("allowMethods", &c.allow_methods),
        ("allowHeaders", &c.allow_headers),
        ("exposeHeaders", &c.expose_headers),
    ] {
        if list.len() > MAX_CORS_ENTRIES {
            return Err((field, format!("more than {MAX_CORS_ENTRIES} entries")));
        }
    }
    if let Some(o) = c.allow_origins.iter().find(|o| !super::cors::is_origin_pattern(o)) {
        return Err((
            "allowOrigins",
            format!("{o:?} is not *, nor scheme://host[:port] (the host may start with *.)"),
        ));
    }
    if let Some(m) = c
        .allow_methods
        .iter()
        .find(|m| *m != "*" && !METHODS.contains(&m.as_str()))
    {
        return Err((
            "allowMethods",
            format!("{m:?} is not * nor one of {}", METHODS.join(", ")),
        ));
    }
    for (field, list, wildcard) in [
        ("allowHeaders", &c.allow_headers, true),
        ("exposeHeaders", &c.expose_headers, true),
    ] {
        for h in list {
            if !(wildcard && h == "*") && (h.is_empty() || h.len() > MAX_NAME_LEN || !h.bytes().all(is_tchar)) {
                return Err((field, format!("{h:?} is not a header name")));
            }
        }
    }
    if c.max_age == 0 || c.max_age > MAX_TIMEOUT_MS / 1000 {
        return Err(("maxAge", format!("must be 1-{} seconds", MAX_TIMEOUT_MS / 1000)));
    }
    Ok(())
}

/// RFC 9110's `tchar`: what a header name is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn check_rule(rule: &Rule, at: &str) -> Result<(), ValidationError> {
    let bad = |field: &str, message: String| ValidationError::at(format!("{at}.{field}"), message);
    if rule.route.is_empty() || rule.route.len() > 512 || rule.route.chars().any(char::is_control) {
        return Err(bad(
            "route",
            "must be 1-512 characters with no control character".into(),
        ));
    }
    if let Some(name) = &rule.name {
        if name.is_empty() || name.len() > 253 || !name.split('.').all(is_dns_label) {
            return Err(bad("name", format!("{name:?} is not a DNS subdomain")));
        }
    }
    let f = &rule.filters;
    if let Some(m) = &f.request_headers {
        check_modifier(m).map_err(|(field, e)| bad(&format!("filters.requestHeaders.{field}"), e))?;
    }
    if let Some(m) = &f.response_headers {
        check_modifier(m).map_err(|(field, e)| bad(&format!("filters.responseHeaders.{field}"), e))?;
        check_no_framing(m).map_err(|(field, e)| bad(&format!("filters.responseHeaders.{field}"), e))?;
    }
    if let Some(r) = &f.redirect {
        if f.rewrite.is_some() {
            return Err(bad("filters", "a rule cannot both redirect and rewrite".into()));
        }
        if let Some(s) = &r.scheme {
            if s != "http" && s != "https" {
                return Err(bad("filters.redirect.scheme", format!("{s:?} is not http or https")));
            }
        }
        if let Some(h) = &r.hostname {
            if !is_route_hostname(h, false) {
                return Err(bad("filters.redirect.hostname", format!("{h:?} is not a host name")));
            }
        }
        if r.port == Some(0) {
            return Err(bad("filters.redirect.port", "must be 1-65535".into()));
        }
        if let Some(p) = &r.path {
            check_path_modifier(p).map_err(|e| bad("filters.redirect.path", e))?;
        }
        if ![301, 302, 303, 307, 308].contains(&r.status_code) {
            return Err(bad(
                "filters.redirect.statusCode",
                format!("{} is not 301, 302, 303, 307 or 308", r.status_code),
            ));
        }
    }
    if let Some(r) = &f.rewrite {
        check_rewrite(r).map_err(|(field, e)| bad(&format!("filters.rewrite.{field}"), e))?;
    }
    if let Some(c) = &f.cors {
        check_cors(c).map_err(|(field, e)| bad(&format!("filters.cors.{field}"), e))?;
    }
    if f.mirrors.len() > MAX_MIRRORS {
        return Err(bad("filters.mirrors", format!("more than {MAX_MIRRORS} mirrors")));
    }
    for (i, m) in f.mirrors.iter().enumerate() {
        check_name(&m.backend).map_err(|e| bad(&format!("filters.mirrors[{i}].backend"), e))?;
        if m.denominator == 0 || m.numerator > m.denominator || m.denominator > MAX_WEIGHT {
            return Err(bad(
                &format!("filters.mirrors[{i}]"),
                format!("numerator must be 0-denominator and denominator 1-{MAX_WEIGHT}"),
            ));
        }
    }
    for (field, t) in [
        ("timeouts.request", rule.timeouts.request),
        ("timeouts.backendRequest", rule.timeouts.backend_request),
    ] {
        if t.is_some_and(|ms| ms == 0 || ms > MAX_TIMEOUT_MS) {
            return Err(bad(field, format!("must be 1-{MAX_TIMEOUT_MS} ms (left out: none)")));
        }
    }
    if let Some(r) = &rule.retry {
        if r.attempts > MAX_RETRY_ATTEMPTS {
            return Err(bad("retry.attempts", format!("more than {MAX_RETRY_ATTEMPTS}")));
        }
        if let Some(c) = r.codes.iter().find(|c| !RETRYABLE_CODES.contains(c)) {
            return Err(bad(
                "retry.codes",
                format!("{c} is not one nginx retries on ({RETRYABLE_CODES:?})"),
            ));
        }
    }
    if rule.backends.len() > MAX_BACKENDS {
        return Err(bad("backends", format!("more than {MAX_BACKENDS} backends")));
    }
    for (i, b) in rule.backends.iter().enumerate() {
        if let Some(m) = &b.request_headers {
            check_modifier(m).map_err(|(field, e)| bad(&format!("backends[{i}].requestHeaders.{field}"), e))?;
        }
        if let Some(r) = &b.rewrite {
            check_rewrite(r).map_err(|(field, e)| bad(&format!("backends[{i}].rewrite.{field}"), e))?;
        }
        if b.weight > MAX_WEIGHT {
            return Err(bad(
                &format!("backends[{i}].weight"),
                format!("larger than {MAX_WEIGHT}"),
            ));
        }
        if let Some(name) = &b.backend {
            check_name(name).map_err(|e| bad(&format!("backends[{i}].backend"), e))?;
        }
    }
    Ok(())
}

/// A host name of a host group (`wildcard`: `*.` may lead) or of a
/// redirect or rewrite: lower case, RFC 1123 labels, no IP address.
pub fn is_route_hostname(h: &str, wildcard: bool) -> bool {
    let rest = match h.strip_prefix("*.") {
        Some(rest) if wildcard => rest,
        Some(_) => return false,
        None => h,
    };
    !rest.is_empty()
        && rest.len() <= 253
        && !rest.bytes().any(|b| b.is_ascii_uppercase())
        && rest.split('.').all(is_dns_label)
        && !rest
            .rsplit('.')
            .next()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
}

/// A path as it may appear in a match or a modifier: absolute, printable
/// ASCII without space, `?` or `#`.
fn check_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("{p:?} does not start with '/'"));
    }
    if p.len() > MAX_PATH_LEN {
        return Err(format!("longer than {MAX_PATH_LEN} bytes"));
    }
    if let Some(c) = p.chars().find(|c| !c.is_ascii_graphic() || *c == '?' || *c == '#') {
        return Err(format!("{p:?} contains {c:?}"));
    }
    Ok(())
}

fn check_path_match(m: &PathMatch) -> Result<(), String> {
    match m {
        PathMatch::Exact(p) | PathMatch::PathPrefix(p) => check_path(p),
        PathMatch::RegularExpression(r) => check_regex(r),
    }
}

fn check_path_modifier(m: &PathModifier) -> Result<(), String> {
    match m {
        PathModifier::ReplaceFullPath(p) | PathModifier::ReplacePrefixMatch(p) => check_path(p),
    }
}

/// Compiles `pattern` as the worker will (size-limited).
pub fn compile_regex(pattern: &str) -> Result<regex::bytes::Regex, String> {
    if pattern.len() > MAX_PATH_LEN {
        return Err(format!("longer than {MAX_PATH_LEN} bytes"));
    }
    regex::bytes::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| format!("does not compile: {e}"))
}

fn check_regex(pattern: &str) -> Result<(), String> {
    compile_regex(pattern).map(|_| ())
}

/// An HTTP token (RFC 9110), as header names must be.
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A header value: visible characters, spaces and tabs, no CR, LF or NUL.
pub fn is_header_value(s: &str) -> bool {
    s.len() <= MAX_HEADER_VALUE_LEN && !s.chars().any(|c| c.is_control() && c != '\t')
}

fn check_value_matches(list: &[ValueMatch], header: bool) -> Result<(), (usize, String)> {
    if list.len() > MAX_VALUE_MATCHES {
        return Err((MAX_VALUE_MATCHES, format!("more than {MAX_VALUE_MATCHES} matches")));
    }
    let mut seen = HashSet::new();
    for (i, m) in list.iter().enumerate() {
        let name_ok = if header {
            is_token(&m.name)
        } else {
            !m.name.is_empty() && m.name.len() <= MAX_NAME_LEN && m.name.chars().all(|c| c.is_ascii_graphic())
        };
        if !name_ok {
            return Err((i, format!("{:?} is not a valid name", m.name)));
        }
        let key = if header {
            m.name.to_ascii_lowercase()
        } else {
            m.name.clone()
        };
        if !seen.insert(key) {
            return Err((i, format!("{:?} is matched twice", m.name)));
        }
        if m.regex {
            check_regex(&m.value).map_err(|e| (i, e))?;
        } else if !is_header_value(&m.value) {
            return Err((i, "the value contains a control character or is too long".into()));
        }
    }
    Ok(())
}

/// A response modifier leaves the headers that frame the response alone
/// (see [`super::header::FRAMING_HEADERS`]). Request modifiers may name
/// them: the proxy writes its own and skips the client's.
fn check_no_framing(m: &HeaderModifier) -> Result<(), (String, String)> {
    let named = m
        .set
        .iter()
        .enumerate()
        .map(|(i, h)| (format!("set[{i}].name"), &h.name))
        .chain(
            m.add
                .iter()
                .enumerate()
                .map(|(i, h)| (format!("add[{i}].name"), &h.name)),
        )
        .chain(m.remove.iter().enumerate().map(|(i, n)| (format!("remove[{i}]"), n)));
    for (field, name) in named {
        if super::header::is_framing_header(name) {
            return Err((
                field,
                format!("{name:?} frames the response or the connection; nginx writes it, a route may not change it"),
            ));
        }
    }
    Ok(())
}

fn check_modifier(m: &HeaderModifier) -> Result<(), (String, String)> {
    let mut seen = HashSet::new();
    for (field, list) in [("set", &m.set), ("add", &m.add)] {
        if list.len() > MAX_VALUE_MATCHES {
            return Err((field.into(), format!("more than {MAX_VALUE_MATCHES} headers")));
        }
        for (i, h) in list.iter().enumerate() {
            if !is_token(&h.name) {
                return Err((
                    format!("{field}[{i}].name"),
                    format!("{:?} is not a header name", h.name),
                ));
            }
            if !is_header_value(&h.value) {
                return Err((
                    format!("{field}[{i}].value"),
                    "contains a control character or is too long".into(),
                ));
            }
            if !seen.insert((field, h.name.to_ascii_lowercase())) {
                return Err((format!("{field}[{i}].name"), format!("{:?} appears twice", h.name)));
            }
        }
    }
    if m.remove.len() > MAX_VALUE_MATCHES {
        return Err(("remove".into(), format!("more than {MAX_VALUE_MATCHES} headers")));
    }
    for (i, name) in m.remove.iter().enumerate() {
        if !is_token(name) {
            return Err((format!("remove[{i}]"), format!("{name:?} is not a header name")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(listener: serde_json::Value) -> Result<RouteTable, ValidationError> {
        parse_routes(serde_json::json!({ "listeners": [listener] }).to_string().as_bytes())
    }

    fn listener(hosts: serde_json::Value, rules: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"name": "gw/default/http", "port": 80, "hosts": hosts, "rules": rules})
    }

    fn rule() -> serde_json::Value {
        serde_json::json!({"route": "default/web", "backends": [{"backend": "default-web-80", "weight": 1}]})
    }

    #[test]
    fn a_good_table_parses() {
        let t = table(listener(
            serde_json::json!([{"hostname": "*.example.com", "matches": [
                {"path": {"type": "PathPrefix", "value": "/api"}, "method": "GET",
                 "headers": [{"name": "X-Env", "value": "canary"}],
                 "query": [{"name": "v", "value": "^[0-9]+$", "regex": true}], "rule": 0}]}]),
            serde_json::json!([rule()]),
        ))
        .unwrap();
        assert_eq!(t.listeners[0].hosts[0].matches[0].headers[0].name, "X-Env");
    }

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\nAbc+/=\n-----END CERTIFICATE-----\n";

    fn https(validation: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"name": "gw/default/443", "port": 443, "hosts": [], "rules": [],
            "certificates": [{"hostname": "*", "certificate": "gw-cert"}],
            "clientValidation": validation})
    }

    proptest::proptest! {
        /// Any text is refused or accepted without panicking, and what is
        /// accepted opens no PEM block but CERTIFICATE ones.
        #[test]
        fn ca_bundles_accept_only_certificate_blocks(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just("-----BEGIN CERTIFICATE-----\n".to_string()),
                    proptest::strategy::Just("-----END CERTIFICATE-----\n".to_string()),
                    proptest::strategy::Just("-----BEGIN PRIVATE KEY-----\n".to_string()),
                    "[A-Za-z0-9+/=]{0,64}\n",
                    "\\PC{0,20}",
                ],
                0..12,
            )
        ) {
            let pem: String = parts.concat();
            if check_ca_bundle(&pem).is_ok() {
                proptest::prop_assert!(pem
                    .lines()
                    .filter(|l| l.starts_with("-----BEGIN "))
                    .all(|l| l.trim_end() == "-----BEGIN CERTIFICATE-----"));
                proptest::prop_assert!(pem.contains("-----END CERTIFICATE-----"));
            }
        }
    }

    #[test]
    fn client_validation_takes_certificate_blocks_only_on_https_servers() {
        let t = table(https(serde_json::json!({"caCertificates": CA}))).unwrap();
        let v = t.listeners[0].client_validation.as_ref().unwrap();
        assert_eq!(v.mode, super::super::ValidationMode::AllowValidOnly);
        let t = table(https(
            serde_json::json!({"caCertificates": format!("{CA}{CA}"), "mode": "AllowInsecureFallback"}),
        ))
        .unwrap();
        assert_eq!(
            t.listeners[0].client_validation.as_ref().unwrap().mode,
            super::super::ValidationMode::AllowInsecureFallback
        );
        let key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        for (bad, why) in [
            (String::new(), "no PEM"),
            ("just text".to_string(), "no PEM"),
            (format!("{CA}{key}"), "only CERTIFICATE"),
            ("-----BEGIN CERTIFICATE-----\nAAAA\n".to_string(), "not closed"),
            (
                "-----BEGIN CERTIFICATE-----\nA\"}\n-----END CERTIFICATE-----".to_string(),
                "base64",
            ),
            (CA.repeat(MAX_CA_CERTIFICATES + 1), "more than"),
            (format!("{CA}{}", " ".repeat(MAX_CA_BUNDLE)), "larger than"),
        ] {
            let e = table(https(serde_json::json!({"caCertificates": bad}))).expect_err(why);
            assert_eq!(e.path, "listeners[0].clientValidation.caCertificates");
            assert!(e.message.contains(why), "{why}: {e}");
        }
        let e = table(https(serde_json::json!({"caCertificates": CA, "mode": "Optional"}))).unwrap_err();
        assert!(e.to_string().contains("Optional"), "{e}");
        // An HTTP server has no handshake to ask in.
        let mut http = https(serde_json::json!({"caCertificates": CA}));
        http["certificates"] = serde_json::json!([]);
        assert_eq!(table(http).unwrap_err().path, "listeners[0].clientValidation");
    }

    #[test]
    fn backend_tls_entries_are_checked_with_their_path() {
        let with = |entry: serde_json::Value| {
            let body = serde_json::json!({"listeners": [], "backendTls": [entry]});
            parse_routes(body.to_string().as_bytes())
        };
        let good = with(serde_json::json!({
            "backend": "infra-web-443", "hostname": "abc.example.com", "caCertificates": CA,
            "subjectAltNames": [{"type": "Hostname", "value": "*.example.com"},
                                {"type": "URI", "value": "spiffe://abc.example.com/id"}]}))
        .unwrap();
        assert_eq!(
            good.backend_tls[0].subject_alt_names[1],
            SubjectAltName::Uri("spiffe://abc.example.com/id".into())
        );
        // The system's CAs: no bundle.
        assert!(with(serde_json::json!({"backend": "b", "hostname": "abc.example.com"})).is_ok());
        let refused = [
            (
                serde_json::json!({"backend": "b", "hostname": "*.example.com"}),
                "backendTls[0].hostname",
            ),
            (
                serde_json::json!({"backend": "b", "hostname": "10.0.0.1"}),
                "backendTls[0].hostname",
            ),
            (
                serde_json::json!({"backend": "b", "hostname": "a.example.com\r\nX: 1"}),
                "backendTls[0].hostname",
            ),
            (
                serde_json::json!({"backend": "b", "hostname": "a.example.com", "caCertificates": "-----BEGIN PRIVATE KEY-----\nAA\n-----END PRIVATE KEY-----\n"}),
                "backendTls[0].caCertificates",
            ),
            (
                serde_json::json!({"backend": "b", "hostname": "a.example.com", "subjectAltNames": [{"type": "URI", "value": "no scheme"}]}),
                "backendTls[0].subjectAltNames[0]",
            ),
            (
                serde_json::json!({"backend": "b", "hostname": "a.example.com", "subjectAltNames": [{"type": "URI", "value": "spiffe://a/\u{0}"}]}),
                "backendTls[0].subjectAltNames[0]",
            ),
            (
                serde_json::json!({"backend": "b", "hostname": "a.example.com", "subjectAltNames":
                    (0..6).map(|i| serde_json::json!({"type": "Hostname", "value": format!("h{i}.example.com")})).collect::<Vec<_>>()}),
                "backendTls[0].subjectAltNames",
            ),
            (
                serde_json::json!({"backend": "", "hostname": "a.example.com"}),
                "backendTls[0].backend",
            ),
        ];
        for (entry, path) in refused {
            let e = with(entry.clone()).expect_err(&entry.to_string());
            assert_eq!(e.path, path, "{entry}: {}", e.message);
        }
        let twice = serde_json::json!({"listeners": [], "backendTls": [
            {"backend": "b", "hostname": "a.example.com"}, {"backend": "b", "hostname": "c.example.com"}]});
        assert_eq!(
            parse_routes(twice.to_string().as_bytes()).unwrap_err().path,
            "backendTls[1].backend"
        );
    }

    #[test]
    fn a_backend_client_certificate_is_a_certificate_id() {
        let mut l = listener(serde_json::json!([]), serde_json::json!([]));
        l["backendClientCertificate"] = serde_json::json!("gw-client");
        assert!(table(l.clone()).is_ok());
        l["backendClientCertificate"] = serde_json::json!("../etc/passwd");
        assert_eq!(table(l).unwrap_err().path, "listeners[0].backendClientCertificate");
    }

    #[test]
    fn hostile_values_are_refused_with_their_path() {
        let cases = [
            (
                listener(
                    serde_json::json!([{"hostname": "Example.com", "matches": []}]),
                    serde_json::json!([]),
                ),
                "listeners[0].hosts[0].hostname",
            ),
            (
                listener(
                    serde_json::json!([{"hostname": "*", "matches": [{"path": {"type": "Exact", "value": "/a b"}, "rule": 0}]}]),
                    serde_json::json!([rule()]),
                ),
                "listeners[0].hosts[0].matches[0].path",
            ),
            (
                listener(
                    serde_json::json!([{"hostname": "*", "matches": [{"path": {"type": "Exact", "value": "/"}, "rule": 3}]}]),
                    serde_json::json!([rule()]),
                ),
                "listeners[0].hosts[0].matches[0].rule",
            ),
            (
                listener(
                    serde_json::json!([]),
                    serde_json::json!([{"route": "a/b", "filters": {"requestHeaders": {"set": [{"name": "X", "value": "a\r\nInjected: 1"}]}}}]),
                ),
                "listeners[0].rules[0].filters.requestHeaders.set[0].value",
            ),
            (
                listener(
                    serde_json::json!([]),
                    serde_json::json!([{"route": "a/b", "filters": {"responseHeaders": {"set": [{"name": "Content-Length", "value": "0"}]}}}]),
                ),
                "listeners[0].rules[0].filters.responseHeaders.set[0].name",
            ),
            (
                listener(
                    serde_json::json!([]),
                    serde_json::json!([{"route": "a/b", "filters": {"responseHeaders": {"add": [{"name": "X-Ok", "value": "1"}, {"name": "transfer-encoding", "value": "chunked"}]}}}]),
                ),
                "listeners[0].rules[0].filters.responseHeaders.add[1].name",
            ),
            (
                listener(
                    serde_json::json!([]),
                    serde_json::json!([{"route": "a/b", "filters": {"responseHeaders": {"remove": ["Connection"]}}}]),
                ),
                "listeners[0].rules[0].filters.responseHeaders.remove[0]",
            ),
            (
                listener(
                    serde_json::json!([]),
                    serde_json::json!([{"route": "a/b", "filters": {"redirect": {"statusCode": 305}}}]),
                ),
                "listeners[0].rules[0].filters.redirect.statusCode",
            ),
            (
                listener(
                    serde_json::json!([{"hostname": "*", "matches": [{"path": {"type": "RegularExpression", "value": "(a{1000}){1000}"}, "rule": 0}]}]),
                    serde_json::json!([rule()]),
                ),
                "listeners[0].hosts[0].matches[0].path",
            ),
            (
                listener(
                    serde_json::json!([]),
                    serde_json::json!([{"route": "a/b", "backends": [{"backend": "x", "weight": 1_000_001}]}]),
                ),
                "listeners[0].rules[0].backends[0].weight",
            ),
            (
                serde_json::json!({"name": "gw;evil", "port": 80, "hosts": [], "rules": []}),
                "listeners[0].name",
            ),
        ];
        for (l, path) in cases {
            let e = table(l.clone()).expect_err(&l.to_string());
            assert_eq!(e.path, path, "{l}: {e}");
        }
    }

    #[test]
    fn replace_prefix_match_needs_prefix_matches() {
        let e = table(listener(
            serde_json::json!([{"hostname": "*", "matches": [{"path": {"type": "Exact", "value": "/a"}, "rule": 0}]}]),
            serde_json::json!([{"route": "a/b", "filters": {"rewrite": {"path": {"type": "ReplacePrefixMatch", "value": "/b"}}}, "backends": []}]),
        ))
        .unwrap_err();
        assert_eq!(e.path, "listeners[0].hosts[0].matches[0].path");
    }

    #[test]
    fn a_backend_rewrite_to_a_prefix_needs_prefix_matches_too() {
        let e = table(listener(
            serde_json::json!([{"hostname": "*", "matches": [{"path": {"type": "Exact", "value": "/a"}, "rule": 0}]}]),
            serde_json::json!([{"route": "a/b", "backends": [{"backend": "x", "weight": 1,
                "rewrite": {"path": {"type": "ReplacePrefixMatch", "value": "/b"}}}]}]),
        ))
        .unwrap_err();
        assert_eq!(e.path, "listeners[0].hosts[0].matches[0].path");
    }

    #[test]
    fn hostile_cors_and_mirror_values_are_refused() {
        let with = |filters: serde_json::Value| {
            table(listener(
                serde_json::json!([]),
                serde_json::json!([{"route": "a/b", "filters": filters}]),
            ))
        };
        let cases = [
            (
                serde_json::json!({"cors": {"allowOrigins": ["https://a.b\r\nX: 1"]}}),
                "listeners[0].rules[0].filters.cors.allowOrigins",
            ),
            (
                serde_json::json!({"cors": {"allowOrigins": ["https://a.*"]}}),
                "listeners[0].rules[0].filters.cors.allowOrigins",
            ),
            (
                serde_json::json!({"cors": {"allowMethods": ["GET, X"]}}),
                "listeners[0].rules[0].filters.cors.allowMethods",
            ),
            (
                serde_json::json!({"cors": {"exposeHeaders": ["x;y"]}}),
                "listeners[0].rules[0].filters.cors.exposeHeaders",
            ),
            (
                serde_json::json!({"cors": {"maxAge": 0}}),
                "listeners[0].rules[0].filters.cors.maxAge",
            ),
            (
                serde_json::json!({"mirrors": [{"backend": "x", "numerator": 3, "denominator": 2}]}),
                "listeners[0].rules[0].filters.mirrors[0]",
            ),
            (
                serde_json::json!({"mirrors": [{"backend": "x", "numerator": 0, "denominator": 0}]}),
                "listeners[0].rules[0].filters.mirrors[0]",
            ),
            (
                serde_json::json!({"mirrors": [{"backend": "../x"}]}),
                "listeners[0].rules[0].filters.mirrors[0].backend",
            ),
            (
                serde_json::json!({"mirrors": vec![serde_json::json!({"backend": "x"}); MAX_MIRRORS + 1]}),
                "listeners[0].rules[0].filters.mirrors",
            ),
        ];
        for (filters, path) in cases {
            let e = with(filters.clone()).expect_err(&filters.to_string());
            assert_eq!(e.path, path, "{filters}: {e}");
        }
        let ok = with(serde_json::json!({
            "cors": {"allowOrigins": ["*", "https://*.a.b"], "allowMethods": ["*"], "allowHeaders": ["*"], "allowCredentials": true},
            "mirrors": [{"backend": "x"}, {"backend": "y", "numerator": 1, "denominator": 5}]}))
        .unwrap();
        let f = &ok.listeners[0].rules[0].filters;
        assert_eq!(f.cors.as_ref().unwrap().max_age, 5, "the spec's default");
        assert_eq!(
            (f.mirrors[0].numerator, f.mirrors[0].denominator),
            (1, 1),
            "every request"
        );
    }

    #[test]
    fn a_mirror_takes_its_share_of_draws() {
        let m = |numerator, denominator| super::super::Mirror {
            backend: "x".into(),
            protocol: Default::default(),
            numerator,
            denominator,
        };
        assert!((0..1000).all(|d| m(1, 1).takes(d)));
        assert!(!(0..1000).any(|d| m(0, 100).takes(d)));
        assert_eq!((0..1000).filter(|d| m(20, 100).takes(*d)).count(), 200);
        assert_eq!((0..1000).filter(|d| m(25, 50).takes(*d)).count(), 500);
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = parse_routes(br#"{"listeners": [], "extra": 1}"#).unwrap_err();
        assert!(e.message.contains("unknown field"), "{e}");
    }
}
