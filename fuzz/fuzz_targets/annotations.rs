//! Annotation, ConfigMap and value parsers: any input is typed or refused
//! with a reason, and nothing that reaches nginx.conf can carry syntax.
#![no_main]

use std::collections::BTreeMap;

use controller::model::annotations::{Annotations, PREFIX};
use controller::model::catalogue;
use controller::model::config_map::GlobalConfig;
use controller::model::{external_auth, log_format};
use controller::model::values::{Host, PathRegex, RedirectUrl, RewriteTarget, Size, UrlPath};
use libfuzzer_sys::fuzz_target;

/// Every string a typed value serializes to (what the template renders),
/// but the validated user-agent regex, which is rendered quoted, and the
/// values that may name variables (the log format, the global auth URLs),
/// which [`with_variables`] checks.
fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        serde_json::Value::Object(o) => o
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "disable" | "format" | "global_auth"))
            .for_each(|(_, x)| strings(x, out)),
        _ => {}
    }
}

/// A value that may name variables: one line, and every `$name` one the
/// renderer accepts for it.
fn with_variables(s: &str, allowed: impl Fn(&str) -> bool) -> bool {
    !s.contains(['\n', '\r']) && log_format::variables(s).is_ok_and(|names| names.iter().all(|n| allowed(n)))
}

/// What nginx.conf syntax needs; no typed value may contain it.
fn inert(s: &str) -> bool {
    !s.contains([';', '{', '}', '"', '\'', '\n', '\r', '#']) && !s.contains("$host")
}

fuzz_target!(|pairs: Vec<(u8, String)>| {
    let names = catalogue::ANNOTATIONS;
    let raw: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (format!("{PREFIX}{}", names[*k as usize % names.len()].name), v.clone()))
        .collect();
    let (a, _) = Annotations::parse(&raw, None);
    assert!(a.configuration_snippet.is_none() && a.server_snippet.is_none());
    if let Some(b) = &a.proxy_body_size {
        assert!(inert(b.as_str()) && !b.as_str().contains(' '));
    }
    for h in &a.server_alias {
        assert!(inert(h.as_str()) && !h.as_str().contains(' '));
    }
    let mut rendered = Vec::new();
    strings(&serde_json::to_value(&a.proxy).unwrap(), &mut rendered);
    let keys: Vec<_> = catalogue::CONFIG_MAP.iter().chain(catalogue::CONFIG_MAP_EXTRA).collect();
    let plain: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (keys[*k as usize % keys.len()].name.to_string(), v.clone()))
        .collect();
    let (g, _) = GlobalConfig::parse(&plain);
    strings(&serde_json::to_value(&g).unwrap(), &mut rendered);
    assert!(with_variables(&g.log.format, log_format::variable_allowed), "{:?}", g.log.format);
    if let Some(auth) = &g.global_auth {
        let mut value = serde_json::to_value(auth).unwrap();
        // `proxy_cache_valid` arguments ("200 202 401 5m"): status codes,
        // `any` and a time, separated by spaces; never URL text.
        if let Some(entries) = value.as_object_mut().and_then(|o| o.remove("cache_duration")) {
            let mut durations = Vec::new();
            strings(&entries, &mut durations);
            for d in &durations {
                assert!(d.bytes().all(|b| b.is_ascii_alphanumeric() || b == b' '), "{d:?}");
            }
        }
        let mut texts = Vec::new();
        strings(&value, &mut texts);
        for t in &texts {
            // URL text: no nginx syntax, no space, request variables only.
            let syntax_free = !t.contains([';', '{', '}', '"', '\'', '#', ' ']);
            assert!(syntax_free && with_variables(t, |n| external_auth::known_variable(n, true)), "{t:?}");
        }
    }
    for s in &rendered {
        assert!(inert(s) && !s.contains('$'), "{s:?}");
    }
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
