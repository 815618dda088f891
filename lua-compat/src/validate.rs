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

/// The first bad value found in a request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    /// JSON path such as `[3].endpoints[0].port`; empty for the whole body.
    pub path: String,
    pub message: String,
}

impl ValidationError {
    fn at(path: impl Into<String>, message: impl Into<String>) -> Self {
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

fn deserialize<T: DeserializeOwned>(body: &[u8]) -> Result<T, ValidationError> {
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

fn check_backend(backend: &Backend, prefix: &str) -> Result<(), ValidationError> {
    let join = |field: &str| {
        if prefix.is_empty() {
            field.to_string()
        } else {
            format!("{prefix}.{field}")
        }
    };
    check_name(&backend.name).map_err(|m| ValidationError::at(join("name"), m))?;
    let external = backend.is_external_name();
    for (j, ep) in backend.endpoints.iter().enumerate() {
        if ep.address.parse::<IpAddr>().is_ok() || (external && is_dns_name(&ep.address)) {
            continue;
        }
        let what = if external {
            "an IP address or DNS name"
        } else {
            "an IP address"
        };
        return Err(ValidationError::at(
            join(&format!("endpoints[{j}].address")),
            format!("{:?} is not {what}", ep.address),
        ));
    }
    for (j, ep) in backend.endpoints.iter().enumerate() {
        if let Some(w) = ep.weight.filter(|w| !(1..=MAX_WEIGHT).contains(w)) {
            return Err(ValidationError::at(
                join(&format!("endpoints[{j}].weight")),
                format!("{w} is not a weight (1-{MAX_WEIGHT})"),
            ));
        }
    }
    if let Some(t) = backend.fail_timeout.filter(|t| *t > MAX_FAIL_TIMEOUT) {
        return Err(ValidationError::at(
            join("failTimeout"),
            format!("{t} is more than {MAX_FAIL_TIMEOUT} seconds"),
        ));
    }
    for (j, alt) in backend.alternative_backends.iter().enumerate() {
        check_name(alt).map_err(|m| ValidationError::at(join(&format!("alternativeBackends[{j}]")), m))?;
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), String> {
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

/// RFC 1123 host name, as Kubernetes requires of `spec.externalName`.
fn is_dns_name(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    let valid_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(valid_label)
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
}
