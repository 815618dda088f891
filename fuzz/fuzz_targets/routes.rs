//! The `/configuration/routes` parser, validator and matcher: any body is
//! refused with a path or accepted; an accepted table survives its own
//! JSON, compiles (as every worker compiles it), and looking requests up
//! in it, rewriting their paths (a rule's or a backend's), building
//! redirects, answering CORS requests, drawing mirrors and telling
//! misdirected requests never panics, and writes no CR or LF.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lua_compat::routes::cors::{classify, Kind};
use lua_compat::routes::matcher::{Compiled, Lookup, RequestView};
use lua_compat::routes::rewrite::{location, rewritten_path, RedirectFrom};
use lua_compat::routes::validate::parse_routes;
use lua_compat::routes::weighted::pick;

struct Req<'a> {
    host: &'a [u8],
    path: &'a [u8],
    args: &'a [u8],
}

impl RequestView for Req<'_> {
    fn host(&self) -> &[u8] {
        self.host
    }
    fn path(&self) -> &[u8] {
        self.path
    }
    fn method(&self) -> &[u8] {
        b"GET"
    }
    fn header(&self, _lower: &str) -> Option<&[u8]> {
        Some(self.args)
    }
    fn args(&self) -> &[u8] {
        self.args
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(table) = parse_routes(data) else { return };
    let json = serde_json::to_vec(&table).expect("a parsed table encodes");
    let again = parse_routes(&json).expect("the stored JSON parses again");
    assert_eq!(again, table);
    let compiled = Compiled::new(&table).expect("a validated table compiles");
    // Requests made of the table's own strings reach its matches.
    let names: Vec<&[u8]> = table.listeners.iter().map(|l| l.name.as_bytes()).collect();
    let hosts: Vec<&str> = table
        .listeners
        .iter()
        .flat_map(|l| l.hosts.iter().map(|h| h.hostname.trim_start_matches('*')))
        .chain(["", "a.b", "x"])
        .collect();
    for name in &names {
        let l = compiled.listener(name).expect("a listener of the table");
        for sni in &hosts {
            for host in &hosts {
                let _ = l.misdirected(sni.as_bytes(), host.as_bytes());
            }
        }
    }
    for name in names.iter().chain(&[b"none".as_slice()]) {
        for host in &hosts {
            for path in ["/", "/a", "/a/b", "//", ""] {
                let req = Req {
                    host: host.as_bytes(),
                    path: path.as_bytes(),
                    args: b"a=1&b=%41&c",
                };
                if let Lookup::Found(f) = compiled.find(name, &req) {
                    assert!(f.prefix_len <= path.len());
                    let rule = &f.rule.rule;
                    let _ = pick(&rule.backends, f.rule.total_weight, data.len() as u64);
                    if let Some(r) = &rule.filters.redirect {
                        let loc = location(
                            r,
                            &RedirectFrom {
                                scheme: "http",
                                host: host.as_bytes(),
                                listener_port: 80,
                                path: path.as_bytes(),
                                prefix_len: f.prefix_len,
                                args: b"q=1",
                            },
                        );
                        assert!(!loc.iter().any(|b| *b == b'\r' || *b == b'\n'));
                    }
                    let backend_paths = rule.backends.iter().filter_map(|b| b.rewrite.as_ref());
                    for p in rule.filters.rewrite.iter().chain(backend_paths).filter_map(|r| r.path.as_ref()) {
                        let out = rewritten_path(p, path.as_bytes(), f.prefix_len);
                        assert!(out.starts_with(b"/"));
                    }
                    for m in &rule.filters.mirrors {
                        let _ = m.takes(data.len() as u64);
                    }
                    if let Some(cors) = &f.rule.cors {
                        // The request's own origin (the fuzzed bytes) and
                        // the table's values: nothing else is written.
                        let origin = host.as_bytes();
                        // (An empty origin is no CORS request at all.)
                        let answer = match classify(b"OPTIONS", Some(origin), Some(b"GET"), Some(b"x-a")) {
                            Kind::Preflight { origin, method, headers } => cors.preflight(origin, method, headers),
                            _ => Vec::new(),
                        };
                        for (h, v) in answer.iter().chain(cors.response(Some(origin)).iter()) {
                            assert!(!h.name.is_empty());
                            assert!(!v.iter().any(|b| *b == b'\r' || *b == b'\n'));
                        }
                    }
                }
            }
        }
    }
});
