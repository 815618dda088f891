//! Redirect locations and rewritten paths (RequestRedirect, URLRewrite).

use super::{PathModifier, Redirect};

/// The path after `modifier`, for a request path whose first `prefix_len`
/// bytes a `PathPrefix` match covered. `ReplacePrefixMatch` keeps the
/// rest of the path after the replacement, with one `/` between them:
/// `/prefix/one` + `/two` under `/one` gives `/one/two`, and `/strip` under
/// `/` gives `/`.
pub fn rewritten_path(modifier: &PathModifier, path: &[u8], prefix_len: usize) -> Vec<u8> {
    match modifier {
        PathModifier::ReplaceFullPath(p) => p.as_bytes().to_vec(),
        PathModifier::ReplacePrefixMatch(p) => {
            let rest = path.get(prefix_len..).unwrap_or_default();
            let mut out = p.trim_end_matches('/').as_bytes().to_vec();
            if rest.is_empty() && p.ends_with('/') {
                out.push(b'/');
            } else {
                out.extend_from_slice(rest);
            }
            if out.is_empty() {
                out.push(b'/');
            }
            out
        }
    }
}

/// What a redirect is computed from.
pub struct RedirectFrom<'a> {
    /// `http` or `https`: how the request came.
    pub scheme: &'a str,
    /// The request's host, without its port.
    pub host: &'a [u8],
    /// The listener's port.
    pub listener_port: u16,
    /// The request path as the client sent it (still escaped).
    pub path: &'a [u8],
    pub prefix_len: usize,
    /// The query string, without `?`.
    pub args: &'a [u8],
}

/// The `Location` of a redirect. The port follows the spec: the filter's,
/// else the well-known port of a scheme the filter changes, else the
/// listener's; it is left out when it is the scheme's default.
pub fn location(r: &Redirect, from: &RedirectFrom<'_>) -> Vec<u8> {
    let scheme = r.scheme.as_deref().unwrap_or(from.scheme);
    let host = r.hostname.as_deref().map_or(from.host, str::as_bytes);
    let port = match (r.port, &r.scheme) {
        (Some(p), _) => p,
        (None, Some(s)) => default_port(s),
        (None, None) => from.listener_port,
    };
    let mut out = Vec::with_capacity(scheme.len() + host.len() + from.path.len() + from.args.len() + 16);
    out.extend_from_slice(scheme.as_bytes());
    out.extend_from_slice(b"://");
    out.extend_from_slice(host);
    if port != default_port(scheme) {
        out.extend_from_slice(format!(":{port}").as_bytes());
    }
    match &r.path {
        Some(m) => out.extend_from_slice(&rewritten_path(m, from.path, from.prefix_len)),
        None => out.extend_from_slice(from.path),
    }
    if !from.args.is_empty() {
        out.push(b'?');
        out.extend_from_slice(from.args);
    }
    out
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" {
        443
    } else {
        80
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(p: &str) -> PathModifier {
        PathModifier::ReplacePrefixMatch(p.into())
    }

    #[test]
    fn prefix_replacement_keeps_one_slash() {
        let r =
            |m: &PathModifier, path: &str, n: usize| String::from_utf8(rewritten_path(m, path.as_bytes(), n)).unwrap();
        assert_eq!(r(&prefix("/one"), "/prefix/one/two", 11), "/one/two");
        assert_eq!(r(&prefix("/one"), "/prefix/one", 11), "/one");
        assert_eq!(r(&prefix("/"), "/strip-prefix/three", 13), "/three");
        assert_eq!(r(&prefix("/"), "/strip-prefix", 13), "/");
        assert_eq!(r(&prefix("/one/"), "/prefix/one", 11), "/one/");
        assert_eq!(r(&prefix("/new"), "/x", 0), "/new/x");
        assert_eq!(r(&PathModifier::ReplaceFullPath("/full".into()), "/a/b", 2), "/full");
    }

    #[test]
    fn redirect_ports_follow_the_spec() {
        let from = RedirectFrom {
            scheme: "http",
            host: b"example.com",
            listener_port: 8080,
            path: b"/a",
            prefix_len: 0,
            args: b"x=1",
        };
        let redirect = |scheme: Option<&str>, port: Option<u16>| Redirect {
            scheme: scheme.map(str::to_string),
            hostname: None,
            port,
            path: None,
            status_code: 302,
        };
        let loc = |r: &Redirect| String::from_utf8(location(r, &from)).unwrap();
        assert_eq!(loc(&redirect(None, None)), "http://example.com:8080/a?x=1");
        assert_eq!(loc(&redirect(Some("https"), None)), "https://example.com/a?x=1");
        assert_eq!(
            loc(&redirect(Some("https"), Some(8443))),
            "https://example.com:8443/a?x=1"
        );
        assert_eq!(loc(&redirect(None, Some(80))), "http://example.com/a?x=1");
        let mut to_host = redirect(None, None);
        to_host.hostname = Some("other.example".into());
        to_host.path = Some(PathModifier::ReplaceFullPath("/b".into()));
        assert_eq!(loc(&to_host), "http://other.example:8080/b?x=1");
    }
}
