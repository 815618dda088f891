//! `add-headers` and `proxy-set-headers`: ConfigMap keys that name another
//! ConfigMap (of the controller's own namespace) whose entries are headers:
//! added to every response, or sent upstream from every location, as in
//! ingress-nginx.
//!
//! Names must be header names; values are printable text in which only the
//! variables a log format may name appear
//! ([`super::log_format::variable_allowed`]), so a value can never fail
//! `nginx -t`. A bad entry is reported and left out, the others kept.

use k8s_openapi::api::core::v1::ConfigMap;
use serde::Serialize;

use super::values::{HeaderName, Invalid};

/// Most headers in one set.
const MAX_HEADERS: usize = 64;

/// A reference to a header set: `name` or `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct SetRef {
    pub namespace: Option<String>,
    pub name: String,
}

impl SetRef {
    pub fn parse(v: &str) -> Result<SetRef, Invalid> {
        let t = v.trim();
        let (namespace, name) = match t.split_once('/') {
            Some((ns, name)) => (Some(ns), name),
            None => (None, t),
        };
        if !super::values::is_object_name(name) || namespace.is_some_and(|ns| !super::values::is_namespace(ns)) {
            return Err(Invalid(format!("not a ConfigMap name (namespace/name): {v:?}")));
        }
        Ok(SetRef {
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        })
    }
}

/// One header of a set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Header {
    pub name: HeaderName,
    pub value: String,
}

/// A header value: printable ASCII, at most 4096 bytes, known variables.
pub fn value(v: &str) -> Result<String, Invalid> {
    let t = v.trim();
    if t.is_empty() || t.len() > 4096 || !t.bytes().all(|b| (b' '..=b'~').contains(&b)) {
        return Err(Invalid("a header value must be 1 to 4096 printable ASCII bytes".into()));
    }
    let names = super::log_format::variables(t).map_err(Invalid)?;
    if let Some(bad) = names.iter().find(|n| !super::log_format::variable_allowed(n)) {
        return Err(Invalid(format!("${bad} is not a variable nginx knows here")));
    }
    Ok(t.to_string())
}

/// The headers of `cm`, in key order, and one message per refused entry.
pub fn headers(cm: &ConfigMap) -> (Vec<Header>, Vec<String>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (k, v) in cm.data.iter().flatten() {
        if out.len() == MAX_HEADERS {
            problems.push(format!("more than {MAX_HEADERS} headers; the rest are left out"));
            break;
        }
        match HeaderName::parse(k).and_then(|name| Ok(Header { name, value: value(v)? })) {
            Ok(h) => out.push(h),
            Err(e) => problems.push(format!("{k}: {e}; left out")),
        }
    }
    (out, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_checked_one_by_one() {
        let cm = ConfigMap {
            data: Some(
                [
                    ("X-Frame-Options", "DENY"),
                    ("X-Client", "$remote_addr"),
                    ("Bad Name", "x"),
                    ("X-Secret", "$ssl_client_raw_cert_typo"),
                    ("X-Inject", "a\"; }\nlocation /x { return 200; #"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            ..Default::default()
        };
        let (h, p) = headers(&cm);
        let names: Vec<&str> = h.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["X-Client", "X-Frame-Options"]);
        assert_eq!(p.len(), 3, "{p:?}");
    }

    #[test]
    fn references_are_names() {
        assert_eq!(
            SetRef::parse("ingress-nginx/custom-headers").unwrap().name,
            "custom-headers"
        );
        assert!(SetRef::parse("headers").unwrap().namespace.is_none());
        assert!(SetRef::parse("a/b/c").is_err());
        assert!(SetRef::parse("Bad_Name").is_err());
    }
}
