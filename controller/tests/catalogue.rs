//! The catalogue (`controller::model::catalogue`), the parsers and the
//! book agree: every honoured name's sample value is accepted and every
//! unsupported one is reported (the book's pages are checked by
//! `reference_pages.rs`).

use std::collections::BTreeMap;

use controller::model::annotations::{Annotations, PREFIX};
use controller::model::catalogue::{ANNOTATIONS, CONFIG_MAP, CONFIG_MAP_EXTRA};
use controller::model::config_map::GlobalConfig;

/// Annotations that only mean something next to another one.
fn prerequisites(name: &str) -> &'static [(&'static str, &'static str)] {
    match name {
        n if n.starts_with("canary-") => &[("canary", "true")],
        n if n.starts_with("session-cookie-") || n == "affinity-mode" => &[("affinity", "cookie")],
        n if n.starts_with("cors-") => &[("enable-cors", "true")],
        "permanent-redirect-code" => &[("permanent-redirect", "https://example.com/")],
        "temporal-redirect-code" => &[("temporal-redirect", "https://example.com/")],
        "proxy-redirect-to" => &[("proxy-redirect-from", "http://backend:8080/")],
        "proxy-ssl-name" => &[("backend-protocol", "HTTPS"), ("proxy-ssl-server-name", "on")],
        "proxy-ssl-server-name" => &[
            ("backend-protocol", "HTTPS"),
            ("proxy-ssl-name", "app.internal.example"),
        ],
        "auth-type" => &[("auth-secret", "basic-auth")],
        "auth-secret" | "auth-secret-type" | "auth-realm" => &[("auth-type", "basic")],
        "mirror-host" | "mirror-request-body" => &[("mirror-target", "https://test.example.com$request_uri")],
        n if n.starts_with("auth-tls-") && n != "auth-tls-secret" => &[("auth-tls-secret", "ca-secret")],
        n if n.starts_with("auth-") && !n.starts_with("auth-tls-") && n != "auth-snippet" => {
            &[("auth-url", "http://auth.example.com/check")]
        }
        _ => &[],
    }
}

/// The table and the parsers agree: every honoured annotation's sample
/// is accepted, every unsupported one is reported.
#[test]
fn annotations_match_the_parser() {
    for e in ANNOTATIONS {
        let raw: BTreeMap<String, String> = prerequisites(e.name)
            .iter()
            .chain([&(e.name, e.sample)])
            .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
            .collect();
        let (_, problems) = Annotations::parse(&raw, Some(&Default::default()));
        let mine: Vec<_> = problems
            .iter()
            .filter(|p| p.annotation == format!("{PREFIX}{}", e.name))
            .collect();
        if e.status.honoured() {
            assert!(mine.is_empty(), "{}: listed as honoured, refused: {mine:?}", e.name);
        } else {
            assert!(!mine.is_empty(), "{}: listed as unsupported, accepted", e.name);
        }
    }
}

#[test]
fn config_map_keys_match_the_parser() {
    for e in CONFIG_MAP.iter().chain(CONFIG_MAP_EXTRA) {
        let mut data = BTreeMap::from([(e.name.to_string(), e.sample.to_string())]);
        if e.name.starts_with("global-auth-") && e.name != "global-auth-url" {
            data.entry("global-auth-url".into())
                .or_insert_with(|| "http://auth.example.com/check".into());
        }
        let (_, problems) = GlobalConfig::parse(&data);
        let mine: Vec<_> = problems
            .iter()
            .filter(|p| p.annotation == format!("ConfigMap key {}", e.name))
            .collect();
        if e.status.honoured() {
            assert!(mine.is_empty(), "{}: listed as honoured, refused: {mine:?}", e.name);
        } else {
            assert!(!mine.is_empty(), "{}: listed as unsupported, accepted", e.name);
        }
    }
}
