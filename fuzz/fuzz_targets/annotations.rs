//! Annotation, ConfigMap and value parsers: any input is typed or refused
//! with a reason, and nothing that reaches nginx.conf can carry syntax.
//! Snippets, the one place where an input is nginx syntax, are parsed with
//! nginx's tokenizer rules: an accepted snippet, written back, reads as the
//! same directives, stays inside the block it is put in, and holds none of
//! the directives the policy refuses.
#![no_main]

use std::collections::BTreeMap;

use controller::conf_syntax::{emit, parse, Directive};
use controller::model::annotations::{Annotations, PREFIX};
use controller::model::snippet::{self, Snippet};
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

/// `s` with each `${name}` written `$name` (the braces are part of the
/// variable, not syntax); `None` if a `${` is not closed right after a name.
fn unbraced(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..=at]);
        let after = &rest[at + 2..];
        let end = after.find('}')?;
        let name = &after[..end];
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return None;
        }
        out.push_str(name);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// What nginx.conf syntax needs; no typed value may contain it.
fn inert(s: &str) -> bool {
    !s.contains([';', '{', '}', '"', '\'', '\n', '\r', '#']) && !s.contains("$host")
}

/// What an accepted snippet must be: the same directives when read back,
/// one block when wrapped in one, and nothing the policy refuses.
fn snippet_holds(text: &str) {
    let _ = parse::parse(text, parse::Limits::default());
    let Ok(Some(s)) = Snippet::parse(text, &snippet::Policy::default()) else {
        return;
    };
    let tree = parse::parse(s.as_str(), parse::Limits::default()).expect("the canonical form parses");
    assert_eq!(emit::directives(&tree, 0), s.as_str(), "the canonical form is stable");
    let original = parse::parse(text, parse::Limits::default()).expect("an accepted snippet parses");
    assert_eq!(emit::directives(&original, 0), s.as_str());
    let wrapped = format!("location / {{\n{}\n}}\n", s.as_str());
    let outer = parse::parse(&wrapped, parse::Limits::default()).expect("wrapped, it parses");
    assert_eq!(outer.len(), 1, "the snippet stays inside its block: {wrapped:?}");
    Directive::walk(&tree, &mut |d, _| {
        let name = d.name().to_ascii_lowercase();
        assert!(snippet::refusal(&name).is_none(), "{name} was accepted");
        assert!(!d.args.iter().any(|a| a.contains('\0')));
    });
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
            // URL text: no nginx syntax, no space, request variables only
            // (nginx matches variable names whatever their case, and so
            // does the validator).
            let syntax_free = unbraced(t).is_some_and(|u| !u.contains([';', '{', '}', '"', '\'', '#', ' ']));
            let known = |n: &str| external_auth::known_variable(&n.to_ascii_lowercase(), true);
            assert!(syntax_free && with_variables(t, known), "{t:?}");
        }
    }
    for s in &rendered {
        assert!(inert(s) && !s.contains('$'), "{s:?}");
    }
    let (with_snippets, _) = Annotations::parse(&raw, Some(&snippet::Policy::default()));
    for s in with_snippets.configuration_snippet.iter().chain(&with_snippets.server_snippet) {
        snippet_holds(s.as_str());
    }
    for (_, v) in &pairs {
        snippet_holds(v);
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
