//! `upstream-hash-by` templates: any template parses and renders, and
//! rendering only ever concatenates its literals and variable values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lua_compat::hash_key::{HashKey, KeyPart};

fuzz_target!(|data: (&str, Vec<u8>)| {
    let (template, value) = data;
    let key = HashKey::parse(template);
    let rendered = key.render(|_| Some(value.as_slice()));
    let expected: usize = key
        .0
        .iter()
        .map(|p| match p {
            KeyPart::Literal(t) => t.len(),
            KeyPart::Variable(_) => value.len(),
        })
        .sum();
    assert_eq!(rendered.len(), expected);
    assert!(rendered.len() <= template.len() + value.len() * template.len());
    // The ring lookup of any key is safe.
    thread_local! {
        static RING: lua_compat::chash::ChashRing =
            lua_compat::chash::ChashRing::new([("10.0.0.1:80", 1), ("10.0.0.2:80", 2)]);
    }
    assert!(RING.with(|r| r.find(&rendered).is_some()));
});
