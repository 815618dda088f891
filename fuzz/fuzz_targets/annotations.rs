//! Annotation, ConfigMap and value parsers: any input is typed or refused
//! with a reason, and nothing that reaches nginx.conf can carry syntax.
#![no_main]

use std::collections::BTreeMap;

use controller::model::annotations::{Annotations, PREFIX};
use controller::model::config_map::GlobalConfig;
use controller::model::values::{Host, PathRegex, RedirectUrl, RewriteTarget, Size, UrlPath};
use libfuzzer_sys::fuzz_target;

const KEYS: &[&str] = &[
    "load-balance", "upstream-hash-by", "upstream-hash-by-subset", "upstream-hash-by-subset-size", "affinity",
    "affinity-mode", "session-cookie-name", "session-cookie-path", "session-cookie-samesite", "canary",
    "canary-weight", "canary-by-header", "canary-by-header-pattern", "rewrite-target", "use-regex",
    "permanent-redirect", "proxy-body-size", "proxy-read-timeout", "proxy-next-upstream", "limit-rps",
    "limit-connections", "server-alias", "custom-http-errors", "enable-cors", "cors-allow-origin",
    "whitelist-source-range", "auth-url", "app-root", "upstream-vhost", "default-backend",
];

/// What nginx.conf syntax needs; no typed value may contain it.
fn inert(s: &str) -> bool {
    !s.contains([';', '{', '}', '"', '\'', '\n', '\r', '#']) && !s.contains("$host")
}

fuzz_target!(|pairs: Vec<(u8, String)>| {
    let raw: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (format!("{PREFIX}{}", KEYS[*k as usize % KEYS.len()]), v.clone()))
        .collect();
    let (a, _) = Annotations::parse(&raw, false);
    assert!(a.configuration_snippet.is_none() && a.server_snippet.is_none());
    if let Some(b) = &a.proxy_body_size {
        assert!(inert(b.as_str()) && !b.as_str().contains(' '));
    }
    for h in &a.server_alias {
        assert!(inert(h.as_str()) && !h.as_str().contains(' '));
    }
    let plain: BTreeMap<String, String> = raw
        .iter()
        .map(|(k, v)| (k.trim_start_matches(PREFIX).to_string(), v.clone()))
        .collect();
    let _ = GlobalConfig::parse(&plain);
    for (_, v) in &pairs {
        if let Ok(h) = Host::parse(v) {
            assert!(inert(h.as_str()));
        }
        if let Ok(p) = UrlPath::parse(v) {
            assert!(inert(p.as_str()) && !p.as_str().contains(' '));
        }
        let _ = PathRegex::parse(v);
        let _ = RewriteTarget::parse(v);
        let _ = RedirectUrl::parse(v);
        let _ = Size::parse(v);
    }
});
