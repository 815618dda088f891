//! Sticky sessions as ingress-nginx's `balancer/sticky*.lua` keep them, so a
//! cookie issued by ingress-nginx keeps routing to the same endpoint.
//!
//! The cookie value is `<key>|<backend_key>` with
//! `backend_key = md5(md5(backend_name) .. backend_name)` (hex). In balanced
//! mode `key` is hashed on the resty.chash ring; in persistent mode `key` is
//! `md5(backend_name .. "address:port")`, the endpoint's fixed identity.
//!
//! Beyond ingress-nginx: the same value can travel in a header instead of
//! a cookie (`sessionAffinityConfig.name: "header"`), as Gateway API's
//! header-based session persistence asks: the gateway sends it in a
//! response header of that name when a session starts, and the client
//! sends it back in a request header of the same name.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};

use crate::wire::CookieSessionAffinity;

/// Lua's `DEFAULT_COOKIE_NAME`, used when the backend names none.
pub const DEFAULT_COOKIE_NAME: &str = "route";

/// Balanced remaps sessions when endpoints change; persistent never does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StickyMode {
    Balanced,
    Persistent,
}

/// What carries a session's value between the client and the gateway.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Carrier {
    /// A cookie (`Set-Cookie` with the attributes below): ingress-nginx's.
    #[default]
    Cookie,
    /// A header of the spec's name, both ways; the cookie attributes do
    /// not apply.
    Header,
}

/// Response headers a session header may not be besides those that frame
/// the response ([`crate::routes::header::FRAMING_HEADERS`]): those nginx
/// or the backend own, whose meaning a second value would change.
const OWNED_HEADERS: [&str; 5] = ["content-type", "date", "location", "server", "set-cookie"];

/// Whether `name` may carry sessions in a header.
pub fn is_session_header_allowed(name: &str) -> bool {
    !crate::routes::header::is_framing_header(name) && !OWNED_HEADERS.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// The nginx variable that holds a session's value in a request: the
/// cookie's (`cookie_<name>`) or the header's (`http_<name>`, lower case
/// with `-` as `_`, as nginx names header variables).
pub fn session_variable(carrier: Carrier, name: &str) -> String {
    match carrier {
        Carrier::Cookie => format!("cookie_{name}"),
        Carrier::Header => crate::routes::header::request_header_variable(name),
    }
}

/// The cookie (or session header) and its rules, from `cookieSessionAffinity`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CookieSpec {
    pub carrier: Carrier,
    pub name: String,
    /// `None`: the location's path (`$location_path`).
    pub path: Option<String>,
    pub expires: Option<i64>,
    pub max_age: Option<i64>,
    pub domain: Option<String>,
    pub samesite: Option<String>,
    pub conditional_samesite_none: bool,
    /// `None`: set when the request came over HTTPS.
    pub secure: Option<bool>,
    pub change_on_failure: bool,
    pub locations: BTreeMap<String, Vec<String>>,
}

impl CookieSpec {
    pub fn from_wire(c: &CookieSessionAffinity, carrier: Carrier) -> CookieSpec {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        CookieSpec {
            carrier,
            name: non_empty(&c.name).unwrap_or_else(|| DEFAULT_COOKIE_NAME.into()),
            path: non_empty(&c.path),
            expires: c.expires.trim().parse().ok(),
            max_age: c.maxage.trim().parse().ok(),
            domain: non_empty(&c.domain),
            samesite: non_empty(&c.samesite),
            conditional_samesite_none: c.conditional_samesite_none,
            // Go omits `false`, so only `true` can arrive.
            secure: c.secure.then_some(true),
            change_on_failure: c.change_on_failure,
            locations: c.locations.clone(),
        }
    }
}

/// Lowercase hex MD5, as `ngx.md5`.
pub fn md5_hex(data: &[u8]) -> String {
    let digest = Md5::digest(data);
    let mut out = String::with_capacity(32);
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// `md5(md5(name) .. name)`: identifies the backend a cookie belongs to.
pub fn backend_key(backend_name: &str) -> String {
    md5_hex(format!("{}{backend_name}", md5_hex(backend_name.as_bytes())).as_bytes())
}

/// Persistent mode's key of an endpoint: `md5(backend_name .. "addr:port")`.
pub fn persistent_key(backend_name: &str, endpoint: &str) -> String {
    md5_hex(format!("{backend_name}{endpoint}").as_bytes())
}

/// A cookie value split as `split_string(value, "|")` does: empty pieces
/// are skipped, the first piece is the upstream key, the second the backend key.
pub fn parse_cookie_value(value: &str) -> (Option<&str>, Option<&str>) {
    let mut pieces = value.split('|').filter(|p| !p.is_empty());
    (pieces.next(), pieces.next())
}

/// `util/same_site.lua`: user agents that reject `SameSite=None`.
pub fn same_site_none_compatible(user_agent: Option<&str>) -> bool {
    let Some(ua) = user_agent else { return true };
    let incompatible = ua.contains("Chrome/4")
        || ua.contains("Chrome/5")
        || ua.contains("Chrome/6")
        || ua.contains("CPU iPhone OS 12")
        || ua.contains("iPad; CPU OS 12")
        || (ua.contains("Macintosh")
            && ua.contains("Intel Mac OS X 10_14")
            && ua.contains("Safari")
            && !ua.contains("Chrome"));
    !incompatible
}

/// Whether this request's location (re)sets the cookie: its host, or the
/// one-label wildcard of it, or `_` on the catch-all server, lists the
/// location's path.
pub fn should_set_cookie(spec: &CookieSpec, host: &str, server_name: &str, location_path: &str) -> bool {
    let host = if server_name == "_" { "_" } else { host };
    let locs = spec.locations.get(host).or_else(|| {
        let rest = host.split_once('.').map(|(_, rest)| rest)?;
        spec.locations.get(&format!("*.{rest}"))
    });
    locs.is_some_and(|paths| paths.iter().any(|p| p == location_path))
}

/// What the request contributes to the `Set-Cookie` header.
pub struct CookieContext<'a> {
    pub location_path: &'a str,
    pub https: bool,
    pub user_agent: Option<&'a str>,
    /// `now + expires` formatted by nginx's `ngx_http_cookie_time`.
    pub expires_at: Option<String>,
}

/// A session header's value: what the cookie's value would be.
pub fn session_header_value(upstream_key: &str, backend_key: &str) -> String {
    format!("{upstream_key}|{backend_key}")
}

/// `Set-Cookie` value in lua-resty-cookie's attribute order.
pub fn set_cookie_value(spec: &CookieSpec, upstream_key: &str, backend_key: &str, ctx: &CookieContext) -> String {
    let mut samesite = spec.samesite.as_deref();
    if spec.conditional_samesite_none && samesite == Some("None") && !same_site_none_compatible(ctx.user_agent) {
        samesite = None;
    }
    let samesite = samesite.filter(|s| matches!(*s, "Strict" | "Lax" | "None"));
    let mut out = format!("{}={upstream_key}|{backend_key}", spec.name);
    if let (Some(_), Some(at)) = (spec.expires, &ctx.expires_at) {
        let _ = write!(out, "; Expires={at}");
    }
    if let Some(max_age) = spec.max_age {
        let _ = write!(out, "; Max-Age={max_age}");
    }
    if let Some(domain) = &spec.domain {
        let _ = write!(out, "; Domain={domain}");
    }
    let _ = write!(out, "; Path={}", spec.path.as_deref().unwrap_or(ctx.location_path));
    if spec.secure.unwrap_or(ctx.https) {
        out.push_str("; Secure");
    }
    out.push_str("; HttpOnly");
    if let Some(s) = samesite {
        let _ = write!(out, "; SameSite={s}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> CookieSpec {
        CookieSpec {
            carrier: Carrier::Cookie,
            name: "INGRESSCOOKIE".into(),
            path: None,
            expires: Some(172800),
            max_age: Some(172800),
            domain: None,
            samesite: Some("None".into()),
            conditional_samesite_none: true,
            secure: None,
            change_on_failure: false,
            locations: BTreeMap::from([
                ("shop.example.com".into(), vec!["/".into()]),
                ("*.example.org".into(), vec!["/app".into()]),
            ]),
        }
    }

    #[test]
    fn keys_match_ngx_md5() {
        assert_eq!(md5_hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
        // md5("shop-web-80") = ..., then md5(that .. "shop-web-80").
        let inner = md5_hex(b"shop-web-80");
        assert_eq!(
            backend_key("shop-web-80"),
            md5_hex(format!("{inner}shop-web-80").as_bytes())
        );
        assert_eq!(persistent_key("b", "10.0.0.1:80"), md5_hex(b"b10.0.0.1:80"));
    }

    #[test]
    fn cookie_values_split_like_lua() {
        assert_eq!(parse_cookie_value("k|b"), (Some("k"), Some("b")));
        assert_eq!(parse_cookie_value("k"), (Some("k"), None));
        assert_eq!(parse_cookie_value("|b"), (Some("b"), None));
        assert_eq!(parse_cookie_value(""), (None, None));
    }

    #[test]
    fn set_cookie_in_resty_cookie_order() {
        let ctx = CookieContext {
            location_path: "/",
            https: true,
            user_agent: Some("curl/8"),
            expires_at: Some("Mon, 23-Nov-26 10:00:00 GMT".into()),
        };
        assert_eq!(
            set_cookie_value(&spec(), "k1", "bk", &ctx),
            "INGRESSCOOKIE=k1|bk; Expires=Mon, 23-Nov-26 10:00:00 GMT; Max-Age=172800; Path=/; Secure; HttpOnly; SameSite=None"
        );
        let old_chrome = CookieContext {
            user_agent: Some("Mozilla/5.0 Chrome/51.0"),
            https: false,
            ..ctx
        };
        assert_eq!(
            set_cookie_value(&spec(), "k1", "bk", &old_chrome),
            "INGRESSCOOKIE=k1|bk; Expires=Mon, 23-Nov-26 10:00:00 GMT; Max-Age=172800; Path=/; HttpOnly"
        );
    }

    #[test]
    fn cookie_set_only_on_listed_locations() {
        let s = spec();
        assert!(should_set_cookie(&s, "shop.example.com", "shop.example.com", "/"));
        assert!(!should_set_cookie(&s, "shop.example.com", "shop.example.com", "/other"));
        assert!(should_set_cookie(&s, "a.example.org", "*.example.org", "/app"));
        assert!(!should_set_cookie(&s, "other.com", "_", "/"));
    }

    #[test]
    fn session_headers_are_read_from_nginx_header_variables_and_framing_headers_are_refused() {
        assert_eq!(session_variable(Carrier::Header, "X-Session-Id"), "http_x_session_id");
        assert_eq!(session_variable(Carrier::Cookie, "Sess-ID"), "cookie_Sess-ID");
        assert_eq!(session_header_value("k", "b"), "k|b");
        assert!(is_session_header_allowed("X-Gateway-Session"));
        for bad in [
            "Content-Length",
            "transfer-encoding",
            "Set-Cookie",
            "UPGRADE",
            "Location",
        ] {
            assert!(!is_session_header_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn same_site_rules() {
        assert!(same_site_none_compatible(None));
        assert!(!same_site_none_compatible(Some(
            "Mozilla/5.0 (iPhone; CPU iPhone OS 12_0 like Mac OS X)"
        )));
        assert!(!same_site_none_compatible(Some(
            "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_14_6) Safari/605"
        )));
        assert!(same_site_none_compatible(Some(
            "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_14_6) Chrome/90 Safari/537"
        )));
    }
}
