//! An HTTPRoute rule's `sessionPersistence` (experimental channel; in
//! v1.7 deprecated for the XBackend resource, GEP-4894, but what v1.6
//! users wrote) onto the module's sticky sessions.
//!
//! The module keeps sessions per backend, as ingress-nginx's
//! `affinity: cookie` does: the value names the backend and one of its
//! endpoints, and the backend's selector follows it while that endpoint
//! is up. A rule with session persistence therefore gets backends of its
//! own: a copy of each Service port it sends to, whose
//! `sessionAffinityConfig` carries the rule's settings (persistent mode,
//! so a session stays on its endpoint when others come and go). The rule
//! is marked `sessionPersistence` in the route table, and the module then
//! sends a request that carries one of its backends' sessions to that
//! backend before any weighted choice.
//!
//! - `Cookie` (the default type): the cookie's name (generated from the
//!   route and rule when absent), its path (`/` when absent), and for a
//!   `Permanent` lifetime `Max-Age`/`Expires` from `absoluteTimeout`;
//!   `HttpOnly` always, `Secure` on HTTPS.
//! - `Header`: the value goes out in a response header of that name when
//!   a session starts and comes back in a request header of the same name.
//!   Headers that frame the response or the connection are refused.
//! - `absoluteTimeout` on a `Session` cookie or a header would need the
//!   gateway to remember when each session began; the module keeps no
//!   such state, so it is reported and not enforced.

use gateway_api_types::httproutes::{
    HttpRouteRulesSessionPersistence, HttpRouteRulesSessionPersistenceCookieLifetimeType as Lifetime,
    HttpRouteRulesSessionPersistenceType as Type,
};
use lua_compat::routes::validate::is_token;
use lua_compat::sticky::is_session_header_allowed;
use lua_compat::validate::MAX_COOKIE_SECONDS;
use lua_compat::wire::{CookieSessionAffinity, SessionAffinityConfig};
use sha2::{Digest, Sha256};

/// Longest cookie path the module takes (the CRD's own limit).
const MAX_PATH_LEN: usize = 1024;

/// A rule's session settings, as its backends carry them.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSession {
    pub affinity: SessionAffinityConfig,
}

// Strings, flags and a map of strings: equality is total.
impl Eq for RuleSession {}

impl RuleSession {
    /// What makes two rules' sessions the same: the same carrier, name,
    /// path and lifetime. Part of the backend copies' names, so a rule
    /// whose settings change starts new sessions (the old values name a
    /// backend that is gone) rather than following values issued under
    /// other rules.
    pub fn identity(&self) -> String {
        let c = &self.affinity.cookie;
        format!("{}|{}|{}|{}", self.affinity.name, c.name, c.path, c.maxage)
    }

    /// A short digest of [`Self::identity`] for backend names.
    pub fn digest(&self) -> String {
        Sha256::digest(self.identity().as_bytes())
            .iter()
            .take(4)
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// The session settings of rule `rule` (its name, or its index) of route
/// `route_key`, or `None` (reported) when they cannot be served: the rule
/// is then served without persistence.
pub fn translate(
    route_key: &str,
    rule: &str,
    sp: &HttpRouteRulesSessionPersistence,
    report: &mut impl FnMut(&str, String),
) -> Option<RuleSession> {
    let absolute_s = match sp.absolute_timeout.as_deref().map(super::duration::parse_ms) {
        None => None,
        Some(Ok(ms)) => Some(ms.div_ceil(1000).clamp(1, MAX_COOKIE_SECONDS)),
        Some(Err(e)) => {
            report(
                "UnsupportedValue",
                format!("sessionPersistence.absoluteTimeout: {e}; the rule is served without session persistence"),
            );
            return None;
        }
    };
    let kind = sp.r#type.clone().unwrap_or(Type::Cookie);
    let not_enforced = |report: &mut dyn FnMut(&str, String), what: &str| {
        report(
            "UnsupportedValue",
            format!(
                "sessionPersistence.absoluteTimeout on a {what} is not enforced (the gateway keeps no per-session state); sessions last while their endpoint does"
            ),
        )
    };
    let mut cookie = CookieSessionAffinity::default();
    let name = match kind {
        Type::Cookie => {
            let spec = sp.cookie.as_ref();
            let permanent = matches!(spec.and_then(|c| c.lifetime_type.as_ref()), Some(Lifetime::Permanent));
            match (permanent, absolute_s) {
                (true, Some(s)) => {
                    cookie.maxage = s.to_string();
                    cookie.expires = s.to_string();
                }
                (true, None) => {
                    report(
                        "UnsupportedValue",
                        "sessionPersistence: a Permanent cookie needs absoluteTimeout; the rule is served without session persistence".into(),
                    );
                    return None;
                }
                (false, Some(_)) => not_enforced(report, "Session cookie"),
                (false, None) => {}
            }
            let path = spec.and_then(|c| c.path.clone()).unwrap_or_else(|| "/".into());
            if !path.starts_with('/')
                || path.len() > MAX_PATH_LEN
                || path.bytes().any(|b| !(0x21..0x7f).contains(&b) || b == b';')
            {
                report(
                    "UnsupportedValue",
                    format!("sessionPersistence.cookie.path {path:?} is not a cookie path; the rule is served without session persistence"),
                );
                return None;
            }
            cookie.path = path;
            spec.and_then(|c| c.name.clone())
                .unwrap_or_else(|| generated_name(route_key, rule))
        }
        Type::Header => {
            if absolute_s.is_some() {
                not_enforced(report, "header session");
            }
            let Some(h) = &sp.header else {
                report(
                    "UnsupportedValue",
                    "sessionPersistence of type Header needs header.name; the rule is served without session persistence".into(),
                );
                return None;
            };
            if !is_session_header_allowed(&h.name) {
                report(
                    "UnsupportedValue",
                    format!(
                        "sessionPersistence.header.name {:?} frames the response or the connection and cannot carry sessions; the rule is served without session persistence",
                        h.name
                    ),
                );
                return None;
            }
            h.name.clone()
        }
    };
    if !is_token(&name) {
        report(
            "UnsupportedValue",
            format!("sessionPersistence: {name:?} is not a cookie or header name; the rule is served without session persistence"),
        );
        return None;
    }
    cookie.name = name;
    Some(RuleSession {
        affinity: SessionAffinityConfig {
            name: match kind {
                Type::Cookie => "cookie".into(),
                Type::Header => "header".into(),
            },
            mode: "persistent".into(),
            cookie,
        },
    })
}

/// The cookie name for a rule that names none: stable across restarts and
/// controllers (the spec asks for a unique name), and a valid token.
fn generated_name(route_key: &str, rule: &str) -> String {
    let digest: String = Sha256::digest(format!("{route_key}|{rule}").as_bytes())
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("gw-session-{digest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> HttpRouteRulesSessionPersistence {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn run(yaml: &str) -> (Option<RuleSession>, Vec<String>) {
        let mut reports = Vec::new();
        let out = translate("shop/web", "0", &parse(yaml), &mut |_, m| reports.push(m));
        (out, reports)
    }

    #[test]
    fn a_cookie_by_default_with_a_generated_name_and_path_slash() {
        let (s, reports) = run("{}");
        let s = s.unwrap();
        assert!(reports.is_empty());
        assert_eq!(s.affinity.name, "cookie");
        assert_eq!(s.affinity.mode, "persistent");
        assert!(
            s.affinity.cookie.name.starts_with("gw-session-"),
            "{}",
            s.affinity.cookie.name
        );
        assert_eq!(s.affinity.cookie.path, "/");
        assert_eq!(s.affinity.cookie.maxage, "");
        // Stable per route and rule, different between rules.
        assert_eq!(run("{}").0.unwrap(), s);
        let mut other = Vec::new();
        let second = translate("shop/web", "1", &parse("{}"), &mut |_, m| other.push(m)).unwrap();
        assert_ne!(second.affinity.cookie.name, s.affinity.cookie.name);
    }

    #[test]
    fn a_permanent_cookie_lasts_its_absolute_timeout() {
        let (s, reports) =
            run("{type: Cookie, absoluteTimeout: 1h30m, cookie: {name: sess, path: /app, lifetimeType: Permanent}}");
        let c = s.unwrap().affinity.cookie;
        assert!(reports.is_empty());
        assert_eq!((c.name.as_str(), c.path.as_str()), ("sess", "/app"));
        assert_eq!((c.maxage.as_str(), c.expires.as_str()), ("5400", "5400"));
        let (none, reports) = run("{cookie: {lifetimeType: Permanent}}");
        assert!(none.is_none());
        assert!(reports[0].contains("needs absoluteTimeout"));
    }

    #[test]
    fn timeouts_the_gateway_cannot_track_are_reported_not_dropped_silently() {
        let (s, reports) = run("{absoluteTimeout: 10s, cookie: {name: s}}");
        assert_eq!(s.unwrap().affinity.cookie.maxage, "", "a Session cookie has no Max-Age");
        assert!(reports[0].contains("not enforced"));
        let (s, reports) = run("{type: Header, absoluteTimeout: 10s, header: {name: X-Session}}");
        assert_eq!(s.unwrap().affinity.name, "header");
        assert!(reports[0].contains("not enforced"));
    }

    #[test]
    fn hostile_names_and_paths_are_refused() {
        for yaml in [
            "{type: Header, header: {name: Content-Length}}",
            "{type: Header, header: {name: transfer-encoding}}",
            "{type: Header, header: {name: 'X\r\nY'}}",
            "{type: Header}",
            "{cookie: {name: 'a;b'}}",
            "{cookie: {name: s, path: '/a; Domain=evil'}}",
            "{cookie: {name: s, path: relative}}",
            "{absoluteTimeout: forever}",
        ] {
            let (s, reports) = run(yaml);
            assert!(s.is_none(), "{yaml}");
            assert_eq!(reports.len(), 1, "{yaml}: {reports:?}");
        }
    }

    #[test]
    fn identity_follows_the_settings() {
        let a = run("{cookie: {name: s}}").0.unwrap();
        let b = run("{cookie: {name: s, path: /x}}").0.unwrap();
        assert_ne!(a.digest(), b.digest());
        assert_eq!(a.digest(), run("{cookie: {name: s}}").0.unwrap().digest());
    }
}
