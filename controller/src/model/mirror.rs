//! Request mirroring (`mirror-target`, `mirror-request-body`,
//! `mirror-host`), with nginx's `mirror`: each request is also sent to the
//! target, whose answer is ignored.
//!
//! ingress-nginx rendered the target as written, which made it an
//! injection vector; here it is an [`AuthUrl`]: `http(s)://host[:port]`,
//! a plain path and query, and request variables only
//! (`https://test.example.com$request_uri` is the usual form). Its host
//! obeys the endpoint policy and a name is resolved per request, as for
//! `auth-url`.

use serde::Serialize;

use super::endpoints::AddressPolicy;
use super::external_auth::AuthUrl;
use super::values::{Host, Invalid};

/// What an Ingress asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MirrorSpec {
    pub target: AuthUrl,
    pub request_body: bool,
    pub host: Option<Host>,
}

/// `mirror-request-body`: `on` (the default) or `off`.
pub fn request_body(v: &str) -> Result<bool, Invalid> {
    match v.trim() {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(Invalid(format!("mirror-request-body must be on or off: {v:?}"))),
    }
}

/// Checks one companion (`request-body`, `host`); `None` for another name.
pub fn check_companion(suffix: &str, v: &str) -> Option<Result<(), Invalid>> {
    Some(match suffix {
        "request-body" => request_body(v).map(drop),
        "host" => Host::parse(v.trim()).map(drop),
        _ => return None,
    })
}

impl MirrorSpec {
    pub fn parse<'a>(target: &str, get: &dyn Fn(&str) -> Option<&'a str>) -> Result<MirrorSpec, Invalid> {
        Ok(MirrorSpec {
            target: AuthUrl::parse(target, "mirror-target")?,
            request_body: get("request-body").and_then(|v| request_body(v).ok()).unwrap_or(true),
            host: get("host")
                .and_then(|v| Host::parse(v.trim()).ok())
                .filter(|h| !h.as_str().starts_with("*.")),
        })
    }

    /// The mirror of a location on `server`.
    pub fn resolve(&self, server: &str, id: usize, policy: &AddressPolicy) -> Result<Mirror, String> {
        let host = self.target.connect_host(server, policy, "mirror-target")?;
        Ok(Mirror {
            id,
            url: self.target.settled(&host),
            host_header: self.host.as_ref().map_or(host, |h| h.as_str().to_string()),
            request_body: self.request_body,
            needs_resolver: self.target.is_named(),
        })
    }
}

/// A location's mirror, ready to render.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Mirror {
    /// Names the internal location (`/_mirror-<id>`).
    pub id: usize,
    pub url: String,
    pub host_header: String,
    pub request_body: bool,
    pub needs_resolver: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_urls_with_request_variables_only() {
        let none = |_: &str| None;
        let m = MirrorSpec::parse("https://test.example.com$request_uri", &none).unwrap();
        let r = m.resolve("app.example.com", 3, &AddressPolicy::default()).unwrap();
        assert_eq!(r.url, "https://test.example.com$request_uri");
        assert_eq!(r.host_header, "test.example.com");
        assert!(r.request_body && r.needs_resolver);
        for bad in [
            "https://x.example.com/;\nproxy_pass http://evil",
            "https://x.example.com$ssl_client_raw_cert",
            "x.example.com/",
            "https://x.example.com/\" ; #",
        ] {
            assert!(MirrorSpec::parse(bad, &none).is_err(), "{bad}");
        }
        let local = MirrorSpec::parse("http://127.0.0.1:10246/configuration/backends", &none).unwrap();
        assert!(local.resolve("a", 1, &AddressPolicy::default()).is_err());
        let get = |k: &str| match k {
            "host" => Some("shadow.example.com"),
            "request-body" => Some("off"),
            _ => None,
        };
        let m = MirrorSpec::parse("http://10.0.0.9:8080$request_uri", &get).unwrap();
        let r = m.resolve("a", 1, &AddressPolicy::default()).unwrap();
        assert_eq!(
            (r.host_header.as_str(), r.request_body, r.needs_resolver),
            ("shadow.example.com", false, false)
        );
        assert!(check_companion("request-body", "maybe").unwrap().is_err());
    }
}
