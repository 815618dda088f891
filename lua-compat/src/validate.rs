//! Parsing and validation of `/configuration/backends` bodies.
//!
//! ingress-nginx stores the body verbatim and each worker finds errors later,
//! one second at a time. We validate before anything is stored, so a bad write
//! is refused whole with the JSON path of the first bad value and the running
//! configuration stays as it was.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use serde::de::DeserializeOwned;

use crate::wire::Backend;

/// Longest backend name accepted. Names become URL segments and log fields;
/// ingress-nginx names are `<ns>-<svc>-<port>`, far shorter than this.
pub const MAX_NAME_LEN: usize = 1024;
/// Largest endpoint weight, as large as nginx allows in practice.
pub const MAX_WEIGHT: u32 = 10_000;
/// Longest `failTimeout`: a day.
pub const MAX_FAIL_TIMEOUT: u32 = 86_400;
/// Most endpoints one backend may have (after `ExternalName` resolution
/// too). Every worker keeps a decoded copy of each backend it routes to.
pub const MAX_ENDPOINTS: usize = 20_000;
/// Most total weight of a backend balanced on a hash ring (chash and
/// balanced sticky sessions): each unit of weight is 160 ring points of 8
/// bytes in every worker, so this bounds a ring at about 25 MB.
pub const MAX_RING_WEIGHT: u64 = 20_000;
/// Largest `upstream-hash-by-subset-size`, as ingress-nginx's annotation.
pub const MAX_SUBSET_SIZE: i64 = 1_000;
/// Most canaries (`alternativeBackends`) of one backend.
pub const MAX_ALTERNATIVES: usize = 64;
/// Longest free-text value: header values and patterns, cookie paths, hash
/// key templates.
pub const MAX_TEXT_LEN: usize = 1024;
/// Longest cookie or header name.
pub const MAX_TOKEN_LEN: usize = 256;
/// Most host → paths entries in a sticky cookie's `locations`.
pub const MAX_COOKIE_LOCATIONS: usize = 10_000;
/// Largest canary `weightTotal`.
pub const MAX_WEIGHT_TOTAL: i64 = 1_000_000_000;
/// Largest number in a cookie's `expires`/`maxage`: about 31,000 years.
pub const MAX_COOKIE_SECONDS: u64 = 1_000_000_000_000;

/// The first bad value found in a request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    /// JSON path such as `[3].endpoints[0].port`; empty for the whole body.
    pub path: String,
    pub message: String,
}

impl ValidationError {
    pub(crate) fn at(path: impl Into<String>, message: impl Into<String>) -> Self {
        ValidationError {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for ValidationError {}

/// Parses and validates the full array of `POST /configuration/backends`.
pub fn parse_backends(body: &[u8]) -> Result<Vec<Backend>, ValidationError> {
    let backends: Vec<Backend> = deserialize(body)?;
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(backends.len());
    for (i, backend) in backends.iter().enumerate() {
        let prefix = format!("[{i}]");
        check_backend(backend, &prefix)?;
        if let Some(first) = seen.insert(&backend.name, i) {
            return Err(ValidationError::at(
                format!("{prefix}.name"),
                format!("duplicate backend name {:?} (first at [{first}])", backend.name),
            ));
        }
    }
    Ok(backends)
}

/// Parses and validates one backend object, as sent to
/// `PUT /configuration/backends/{name}`. A missing `name` is taken from the URL;
/// a different one is refused.
pub fn parse_backend(body: &[u8], url_name: &str) -> Result<Backend, ValidationError> {
    let mut value: serde_json::Value = deserialize(body)?;
    match value.as_object_mut() {
        Some(obj) => {
            obj.entry("name").or_insert_with(|| url_name.into());
        }
        None => return Err(ValidationError::at("", "expected a backend object")),
    }
    let backend: Backend = serde_path_to_error::deserialize(value)
        .map_err(|e| ValidationError::at(format_path(e.path()), e.inner().to_string()))?;
    check_backend(&backend, "")?;
    if backend.name != url_name {
        return Err(ValidationError::at(
            "name",
            format!("{:?} does not match the name in the URL, {url_name:?}", backend.name),
        ));
    }
    Ok(backend)
}

pub(crate) fn deserialize<T: DeserializeOwned>(body: &[u8]) -> Result<T, ValidationError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        // Malformed JSON has no meaningful path: it concerns the whole body.
        let path = if e.inner().is_syntax() || e.inner().is_eof() {
            String::new()
        } else {
            format_path(e.path())
        };
        ValidationError::at(path, e.inner().to_string())
    })?;
    de.end().map_err(|e| ValidationError::at("", e.to_string()))?;
    Ok(value)
}

/// Validates one parsed backend: every value the module stores, renders
/// into a response header or allocates by is checked against its limit
/// here, so a write that passes cannot make a worker misbehave. The
/// controller runs the same check before it sends anything.
pub fn validate_backend(backend: &Backend) -> Result<(), ValidationError> {
    check_backend(backend, "")
}

fn check_backend(backend: &Backend, prefix: &str) -> Result<(), ValidationError> {
    let join = |field: &str| {
        if prefix.is_empty() {
            field.to_string()
        } else {
            format!("{prefix}.{field}")
        }
    };
    let at = |field: &str, message: String| ValidationError::at(join(field), message);
    check_name(&backend.name).map_err(|m| at("name", m))?;
    if backend.endpoints.len() > MAX_ENDPOINTS {
        return Err(at(
            "endpoints",
            format!("{} endpoints is more than {MAX_ENDPOINTS}", backend.endpoints.len()),
        ));
    }
    let external = backend.is_external_name();
    for (j, ep) in backend.endpoints.iter().enumerate() {
        let field = format!("endpoints[{j}].address");
        if external {
            if let Some(why) = crate::address::forbidden_external_name(&ep.address) {
                return Err(at(&field, format!("{:?} is {why}", ep.address)));
            }
        }
        if ep.address.parse::<IpAddr>().is_ok() || (external && is_dns_name(&ep.address)) {
            continue;
        }
        let what = if external {
            "an IP address or DNS name"
        } else {
            "an IP address"
        };
        return Err(at(&field, format!("{:?} is not {what}", ep.address)));
    }
    for (j, ep) in backend.endpoints.iter().enumerate() {
        if let Some(w) = ep.weight.filter(|w| !(1..=MAX_WEIGHT).contains(w)) {
            return Err(at(
                &format!("endpoints[{j}].weight"),
                format!("{w} is not a weight (1-{MAX_WEIGHT})"),
            ));
        }
    }
    if let Some(t) = backend.fail_timeout.filter(|t| *t > MAX_FAIL_TIMEOUT) {
        return Err(at(
            "failTimeout",
            format!("{t} is more than {MAX_FAIL_TIMEOUT} seconds"),
        ));
    }
    if backend.alternative_backends.len() > MAX_ALTERNATIVES {
        return Err(at(
            "alternativeBackends",
            format!("more than {MAX_ALTERNATIVES} canaries"),
        ));
    }
    for (j, alt) in backend.alternative_backends.iter().enumerate() {
        check_name(alt).map_err(|m| at(&format!("alternativeBackends[{j}]"), m))?;
    }
    check_hash_by(&backend.upstream_hash_by).map_err(|(f, m)| at(&format!("upstreamHashByConfig.{f}"), m))?;
    check_cookie(&backend.session_affinity.cookie)
        .map_err(|(f, m)| at(&format!("sessionAffinityConfig.cookieSessionAffinity.{f}"), m))?;
    if backend.session_affinity.name == "header" {
        let name = &backend.session_affinity.cookie.name;
        if name.is_empty() || !crate::sticky::is_session_header_allowed(name) {
            return Err(at(
                "sessionAffinityConfig.cookieSessionAffinity.name",
                format!("{name:?} cannot carry sessions: a session header needs a name, and not one that frames the response"),
            ));
        }
    }
    check_traffic(&backend.traffic_shaping).map_err(|(f, m)| at(&format!("trafficShapingPolicy.{f}"), m))?;
    if crate::algorithm::Algorithm::select(backend).0.uses_ring() {
        let total: u64 = backend.endpoints.iter().map(|e| u64::from(e.weight.unwrap_or(1))).sum();
        if total > MAX_RING_WEIGHT {
            return Err(at(
                "endpoints",
                format!("total weight {total} is more than {MAX_RING_WEIGHT} for a hash-ring algorithm"),
            ));
        }
    }
    Ok(())
}

type FieldError = (&'static str, String);

fn check_hash_by(h: &crate::wire::UpstreamHashByConfig) -> Result<(), FieldError> {
    if h.hash_by.len() > MAX_TEXT_LEN || h.hash_by.chars().any(char::is_control) {
        return Err((
            "upstream-hash-by",
            format!("must be printable and at most {MAX_TEXT_LEN} bytes"),
        ));
    }
    if !(0..=MAX_SUBSET_SIZE).contains(&h.subset_size) {
        return Err((
            "upstream-hash-by-subset-size",
            format!("{} is not a subset size (0-{MAX_SUBSET_SIZE})", h.subset_size),
        ));
    }
    Ok(())
}

/// RFC 6265 `token`: the characters a cookie (or header) name may have.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_TOKEN_LEN
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
}

/// A cookie attribute value (RFC 6265 `av-octet`): printable, no `;`.
fn is_attribute(s: &str, max: usize) -> bool {
    s.len() <= max && s.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b';')
}

fn is_seconds(s: &str) -> bool {
    s.is_empty() || (s.bytes().all(|b| b.is_ascii_digit()) && s.parse::<u64>().is_ok_and(|n| n <= MAX_COOKIE_SECONDS))
}

/// Every cookie attribute ends up in a `Set-Cookie` header: a CR, LF or
/// `;` in one would split the response or add attributes.
fn check_cookie(c: &crate::wire::CookieSessionAffinity) -> Result<(), FieldError> {
    if !c.name.is_empty() && !is_token(&c.name) {
        return Err(("name", format!("{:?} is not a cookie name", c.name)));
    }
    if !is_attribute(&c.path, MAX_TEXT_LEN) || (!c.path.is_empty() && !c.path.starts_with('/')) {
        return Err(("path", format!("{:?} is not a cookie path", c.path)));
    }
    let domain_ok = c.domain.len() <= 253
        && c.domain
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    if !domain_ok {
        return Err(("domain", format!("{:?} is not a cookie domain", c.domain)));
    }
    if !["", "none", "lax", "strict"].contains(&c.samesite.to_ascii_lowercase().as_str()) {
        return Err(("samesite", format!("{:?} is not None, Lax or Strict", c.samesite)));
    }
    if !is_seconds(&c.expires) {
        return Err(("expires", format!("{:?} is not a number of seconds", c.expires)));
    }
    if !is_seconds(&c.maxage) {
        return Err(("maxage", format!("{:?} is not a number of seconds", c.maxage)));
    }
    let paths: usize = c.locations.values().map(Vec::len).sum();
    if c.locations.len() > MAX_COOKIE_LOCATIONS || paths > MAX_COOKIE_LOCATIONS {
        return Err(("locations", format!("more than {MAX_COOKIE_LOCATIONS} entries")));
    }
    for (host, paths) in &c.locations {
        if !is_attribute(host, 253) {
            return Err(("locations", format!("{host:?} is not a host name")));
        }
        if let Some(p) = paths.iter().find(|p| !is_attribute(p, MAX_TEXT_LEN)) {
            return Err(("locations", format!("{p:?} is not a path")));
        }
    }
    Ok(())
}

fn check_traffic(t: &crate::wire::TrafficShapingPolicy) -> Result<(), FieldError> {
    if !(0..=MAX_WEIGHT_TOTAL).contains(&t.weight_total) {
        return Err((
            "weightTotal",
            format!("{} is not within 0-{MAX_WEIGHT_TOTAL}", t.weight_total),
        ));
    }
    if !(0..=MAX_WEIGHT_TOTAL).contains(&t.weight) {
        return Err(("weight", format!("{} is not within 0-{MAX_WEIGHT_TOTAL}", t.weight)));
    }
    // The header becomes the nginx variable `$http_<name>`.
    let header_ok = t.header.is_empty()
        || (t.header.len() <= MAX_TOKEN_LEN
            && t.header
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    if !header_ok {
        return Err(("header", format!("{:?} is not a header name", t.header)));
    }
    if !t.cookie.is_empty() && !is_token(&t.cookie) {
        return Err(("cookie", format!("{:?} is not a cookie name", t.cookie)));
    }
    if t.header_value.len() > MAX_TEXT_LEN || t.header_value.chars().any(char::is_control) {
        return Err((
            "headerValue",
            format!("must be printable and at most {MAX_TEXT_LEN} bytes"),
        ));
    }
    if t.header_pattern.len() > MAX_TEXT_LEN || t.header_pattern.chars().any(char::is_control) {
        return Err((
            "headerPattern",
            format!("must be printable and at most {MAX_TEXT_LEN} bytes"),
        ));
    }
    if !t.header_pattern.is_empty() {
        crate::canary::compile_pattern(&t.header_pattern)
            .map_err(|e| ("headerPattern", format!("does not compile: {e}")))?;
    }
    Ok(())
}

pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("backend name must not be empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("backend name is longer than {MAX_NAME_LEN} bytes"));
    }
    if name.chars().any(|c| c.is_control() || c == '/') {
        return Err(format!("{name:?} contains a control character or '/'"));
    }
    Ok(())
}

/// One RFC 1123 label: 1-63 letters, digits and inner hyphens. The rule
/// every host name here is built from (the controller's Ingress hosts too).
pub fn is_dns_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

/// RFC 1123 host name, as Kubernetes requires of `spec.externalName`.
pub fn is_dns_name(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(is_dns_label)
        // A numeric last label would make "10.0.0.300" a host name.
        && !s.rsplit('.').next().is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
}

/// Renders a serde path as `[3].endpoints[0].port`.
fn format_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => out.push_str(if out.is_empty() { "?" } else { ".?" }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> ValidationError {
        parse_backends(body.as_bytes()).unwrap_err()
    }

    #[test]
    fn reports_path_of_bad_port_string() {
        let body = r#"[{"name":"a","endpoints":[{"address":"10.0.0.1","port":"80"}]},
                      {"name":"b","endpoints":[{"address":"10.0.0.2","port":"80"},
                                               {"address":"10.0.0.3","port":"80x"}]}]"#;
        let e = err(body);
        assert_eq!(e.path, "[1].endpoints[1].port");
        assert!(e.message.starts_with(r#""80x" is not a port"#), "{}", e.message);
    }

    #[test]
    fn port_range_is_enforced_for_strings_and_numbers() {
        for bad in [r#""0""#, r#""65536""#, "0", "70000", "-1", r#""+80""#, r#""""#, "8.5"] {
            let body = format!(r#"[{{"name":"a","endpoints":[{{"address":"::1","port":{bad}}}]}}]"#);
            assert_eq!(err(&body).path, "[0].endpoints[0].port", "{bad}");
        }
        let ok = r#"[{"name":"a","endpoints":[{"address":"::1","port":65535},{"address":"::1","port":"1"}]}]"#;
        assert_eq!(parse_backends(ok.as_bytes()).unwrap()[0].endpoints.len(), 2);
    }

    #[test]
    fn malformed_json_and_wrong_shapes() {
        let e = err("[{");
        assert!(e.message.contains("EOF"));
        assert_eq!(e.path, "");
        assert_eq!(err(r#"[{"name":"a",}]"#).path, "");
        assert_eq!(err(r#"{"name":"a"}"#).path, "");
        assert_eq!(err(r#"[{"name":"a"}] trailing"#).path, "");
        let e = err(r#"[{"name":"a","endpoints":{}}]"#);
        assert_eq!(e.path, "[0].endpoints");
        let e = err(r#"[{"name":"a","noServer":"yes"}]"#);
        assert_eq!(e.path, "[0].noServer");
        let e = err(r#"[{"name":"a","trafficShapingPolicy":{"weight":"ten"}}]"#);
        assert_eq!(e.path, "[0].trafficShapingPolicy.weight");
    }

    #[test]
    fn names_are_required_unique_and_sane() {
        let e = err(r#"[{"endpoints":[]}]"#);
        assert_eq!(e.path, "[0]");
        assert!(e.message.contains("missing field `name`"));
        assert_eq!(err(r#"[{"name":""}]"#).path, "[0].name");
        assert_eq!(err(r#"[{"name":"a/b"}]"#).path, "[0].name");
        let e = err(r#"[{"name":"a"},{"name":"b"},{"name":"a"}]"#);
        assert_eq!(e.path, "[2].name");
        assert!(e.message.contains("first at [0]"));
    }

    #[test]
    fn addresses_must_be_ip_unless_external_name() {
        let e = err(r#"[{"name":"a","endpoints":[{"address":"10.0.0.300","port":"80"}]}]"#);
        assert_eq!(e.path, "[0].endpoints[0].address");
        let e = err(r#"[{"name":"a","endpoints":[{"address":"example.com","port":"80"}]}]"#);
        assert_eq!(e.path, "[0].endpoints[0].address");
        let ext = r#"[{"name":"a","service":{"spec":{"type":"ExternalName","externalName":"example.com"}},
                       "endpoints":[{"address":"example.com","port":"80"}]}]"#;
        assert!(parse_backends(ext.as_bytes()).unwrap()[0].is_external_name());
        let bad_ext = ext.replace(r#""address":"example.com""#, r#""address":"exa mple;""#);
        assert_eq!(err(&bad_ext).path, "[0].endpoints[0].address");
    }

    #[test]
    fn go_nulls_and_unknown_fields_are_accepted() {
        let body = r#"[{"name":"a","endpoints":null,"alternativeBackends":null,"sessionAffinityConfig":
                        {"name":"","mode":"","cookieSessionAffinity":{"name":"","locations":null}},
                        "futureField":{"x":1}}]"#;
        let b = &parse_backends(body.as_bytes()).unwrap()[0];
        assert!(b.endpoints.is_empty());
    }

    #[test]
    fn put_body_takes_its_name_from_the_url() {
        let b = parse_backend(br#"{"endpoints":[{"address":"::1","port":"80"}]}"#, "web").unwrap();
        assert_eq!(b.name, "web");
        let e = parse_backend(br#"{"name":"other"}"#, "web").unwrap_err();
        assert_eq!(e.path, "name");
        let e = parse_backend(br#"{"endpoints":[{"address":"x","port":"80"}]}"#, "web").unwrap_err();
        assert_eq!(e.path, "endpoints[0].address");
        let e = parse_backend(br#"{"endpoints":[{"address":"::1","port":"0"}]}"#, "web").unwrap_err();
        assert_eq!(e.path, "endpoints[0].port");
        assert_eq!(parse_backend(b"[]", "web").unwrap_err().path, "");
    }

    #[test]
    fn weights_and_health_settings_are_checked() {
        let ok =
            r#"[{"name":"a","maxFails":3,"failTimeout":30,"endpoints":[{"address":"::1","port":"80","weight":5}]}]"#;
        let b = &parse_backends(ok.as_bytes()).unwrap()[0];
        assert_eq!(
            (b.max_fails, b.fail_timeout, b.endpoints[0].weight),
            (Some(3), Some(30), Some(5))
        );
        let e = err(r#"[{"name":"a","endpoints":[{"address":"::1","port":"80","weight":0}]}]"#);
        assert_eq!(e.path, "[0].endpoints[0].weight");
        assert_eq!(err(r#"[{"name":"a","failTimeout":999999}]"#).path, "[0].failTimeout");
        assert_eq!(err(r#"[{"name":"a","maxFails":-1}]"#).path, "[0].maxFails");
    }

    #[test]
    fn dns_names() {
        for ok in ["a", "example.com", "my-svc.ns.svc.cluster.local.", "x1.io"] {
            assert!(is_dns_name(ok), "{ok}");
        }
        for bad in ["", "-a.com", "a-.com", "a..b", "a b", "a;b", "1.2.3.4", "10.0.0.300"] {
            assert!(!is_dns_name(bad), "{bad}");
        }
    }

    fn path_of(backend: serde_json::Value) -> String {
        err(&serde_json::Value::Array(vec![backend]).to_string()).path
    }

    #[test]
    fn cookie_attributes_cannot_split_the_response() {
        let with = |field: &str, value: &str| {
            serde_json::json!({"name": "a", "sessionAffinityConfig": {"name": "cookie",
                "cookieSessionAffinity": {"name": "c", field: value}}})
        };
        let base = "[0].sessionAffinityConfig.cookieSessionAffinity.";
        for (field, bad) in [
            ("name", "c\r\nSet-Cookie: x=1"),
            ("name", "a;b"),
            ("name", "a b"),
            ("path", "/\r\nX: y"),
            ("path", "/a; Domain=evil"),
            ("path", "relative"),
            ("domain", "a.com; Secure"),
            ("samesite", "Lax\r\n"),
            ("expires", "soon"),
            ("maxage", "1\n"),
        ] {
            assert_eq!(path_of(with(field, bad)), format!("{base}{field}"), "{field} {bad:?}");
        }
        let ok = serde_json::json!([{"name": "a", "sessionAffinityConfig": {"name": "cookie", "cookieSessionAffinity":
            {"name": "INGRESSCOOKIE", "path": "/app", "domain": ".example.com", "samesite": "None",
             "expires": "172800", "maxage": "3600", "locations": {"a.com": ["/", "/x"]}}}}]);
        assert!(parse_backends(ok.to_string().as_bytes()).is_ok());
        let e = path_of(
            serde_json::json!({"name": "a", "sessionAffinityConfig": {"cookieSessionAffinity":
            {"locations": {"a.com": ["/\r\n"]}}}}),
        );
        assert_eq!(e, format!("{base}locations"));
    }

    #[test]
    fn a_session_header_needs_a_name_that_does_not_frame_the_response() {
        let header = |name: &str| {
            serde_json::json!({"name": "a", "sessionAffinityConfig": {"name": "header", "mode": "persistent",
                "cookieSessionAffinity": {"name": name}}})
        };
        let at = "[0].sessionAffinityConfig.cookieSessionAffinity.name";
        for bad in [
            "",
            "Content-Length",
            "Transfer-Encoding",
            "set-cookie",
            "Upgrade",
            "X\r\nY",
        ] {
            assert_eq!(path_of(header(bad)), at, "{bad:?}");
        }
        let ok = serde_json::Value::Array(vec![header("X-Gateway-Session")]).to_string();
        let parsed = parse_backends(ok.as_bytes()).unwrap();
        let (algorithm, _) = crate::algorithm::Algorithm::select(&parsed[0]);
        let crate::algorithm::Algorithm::Sticky { cookie, .. } = algorithm else {
            panic!("a session header is sticky: {algorithm:?}")
        };
        assert_eq!(cookie.carrier, crate::sticky::Carrier::Header);
    }

    #[test]
    fn sizes_that_would_allocate_without_bound_are_refused() {
        let hash = |size: i64| {
            serde_json::json!({"name": "a", "upstreamHashByConfig": {"upstream-hash-by": "$uri",
                "upstream-hash-by-subset": true, "upstream-hash-by-subset-size": size}})
        };
        assert_eq!(
            path_of(hash(1 << 40)),
            "[0].upstreamHashByConfig.upstream-hash-by-subset-size"
        );
        assert_eq!(
            path_of(hash(-1)),
            "[0].upstreamHashByConfig.upstream-hash-by-subset-size"
        );
        assert!(parse_backends(serde_json::json!([hash(1000)]).to_string().as_bytes()).is_ok());
        // A hash ring gets 160 points per unit of weight in every worker.
        let heavy = |weight: u32, n: usize| {
            let eps: Vec<_> = (0..n)
                .map(|i| serde_json::json!({"address": format!("10.0.{}.{}", i / 250, i % 250 + 1), "port": "80", "weight": weight}))
                .collect();
            serde_json::json!({"name": "a", "upstreamHashByConfig": {"upstream-hash-by": "$uri"}, "endpoints": eps})
        };
        assert_eq!(path_of(heavy(10_000, 3)), "[0].endpoints");
        assert!(parse_backends(serde_json::json!([heavy(10_000, 2)]).to_string().as_bytes()).is_ok());
        let mut rr = heavy(10_000, 3);
        rr["upstreamHashByConfig"] = serde_json::json!({});
        assert!(
            parse_backends(serde_json::json!([rr]).to_string().as_bytes()).is_ok(),
            "round-robin has no ring"
        );
        assert_eq!(path_of(heavy(1, MAX_ENDPOINTS + 1)), "[0].endpoints");
        let too_many: Vec<String> = (0..=MAX_ALTERNATIVES).map(|i| format!("c{i}")).collect();
        assert_eq!(
            path_of(serde_json::json!({"name": "a", "alternativeBackends": too_many})),
            "[0].alternativeBackends"
        );
        assert_eq!(
            path_of(serde_json::json!({"name": "a", "upstreamHashByConfig": {"upstream-hash-by": "x".repeat(2000)}})),
            "[0].upstreamHashByConfig.upstream-hash-by"
        );
    }

    #[test]
    fn canary_policies_are_checked() {
        let with = |field: &str, value: serde_json::Value| serde_json::json!({"name": "a", "trafficShapingPolicy": {field: value}});
        for (field, bad) in [
            ("weight", serde_json::json!(-1)),
            ("weightTotal", serde_json::json!(i64::MAX)),
            ("header", serde_json::json!("X Canary")),
            ("cookie", serde_json::json!("a;b")),
            ("headerValue", serde_json::json!("a\nb")),
            ("headerPattern", serde_json::json!("(unclosed")),
            ("headerPattern", serde_json::json!("a{1000}{1000}{1000}")),
        ] {
            assert_eq!(
                path_of(with(field, bad.clone())),
                format!("[0].trafficShapingPolicy.{field}"),
                "{bad}"
            );
        }
    }

    #[test]
    fn external_names_of_the_local_host_are_refused() {
        for host in [
            "localhost",
            "LocalHost.",
            "x.localhost",
            "127.0.0.1",
            "::1",
            "169.254.169.254",
            "0.0.0.0",
        ] {
            let b = serde_json::json!({"name": "a", "service": {"spec": {"type": "ExternalName"}},
                "endpoints": [{"address": host, "port": "80"}]});
            assert_eq!(path_of(b), "[0].endpoints[0].address", "{host}");
        }
        // The same literal is an ordinary endpoint outside ExternalName.
        let plain = serde_json::json!([{"name": "a", "endpoints": [{"address": "127.0.0.1", "port": "80"}]}]);
        assert!(parse_backends(plain.to_string().as_bytes()).is_ok());
    }
}
