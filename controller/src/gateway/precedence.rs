//! The order of HTTPRoute matches, as the Gateway API specifies it, and
//! the host groups the module looks requests up in.
//!
//! Among the matches that could take a request, the spec prefers, in turn:
//! the route whose matching hostname has the most characters without a
//! wildcard, then the most characters; an `Exact` path over a prefix, the
//! longest path; a method match; the most header matches; the most query
//! matches; then the oldest route, the route first by `namespace/name`,
//! and the first rule and match within it. A `RegularExpression` path (its
//! order is left to implementations) ranks after `Exact` and before
//! `PathPrefix`, longer patterns first. A GRPCRoute's matches rank by the
//! characters of their service, then of their method, as its spec says;
//! one that names a service or method ranks with exact paths (so an
//! HTTPRoute's catch-all on the same hostname does not hide it), one that
//! names neither with a `/` prefix.
//!
//! The module takes the first match of a request's host group that
//! matches, so the controller gives every group its candidates in that
//! order: the routes of the group's own hostname, then those of the
//! wildcards that cover it, then those of `*`.

use std::cmp::{Ordering, Reverse};

use lua_compat::routes::{HostRoutes, PathMatch, RouteMatch};

use super::hostnames::covers;

/// One match of one rule of one route, with what orders it.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The hostname (of the route on its listener) it serves.
    pub hostname: String,
    /// The hostname the route itself names for it (`*` when it names
    /// none): an exact route hostname goes before a wildcard one even
    /// where both meet the listener in the same name.
    pub route_hostname: String,
    /// The hostname of the listener it attached through (`*` when none):
    /// a request is served only by the routes of the most specific
    /// listener its host matches (listener isolation).
    pub listener: String,
    pub route_match: RouteMatch,
    /// The route's `creationTimestamp`, in seconds.
    pub created: i64,
    /// `(namespace, name)` of the route.
    pub route: (String, String),
    /// Rule and match index within the route.
    pub rule_index: usize,
    pub match_index: usize,
    /// A GRPCRoute's match: characters of its service and method, which
    /// the spec orders by in place of the path (see `super::grpc`).
    pub grpc: Option<(usize, usize)>,
}

/// How specific a hostname is: non-wildcard characters, then characters.
fn host_rank(hostname: &str) -> (usize, usize) {
    if hostname == "*" {
        (0, 0)
    } else if let Some(rest) = hostname.strip_prefix('*') {
        (0, rest.len())
    } else {
        (hostname.len(), hostname.len())
    }
}

fn path_rank(p: &PathMatch) -> (u8, usize) {
    match p {
        PathMatch::Exact(v) => (3, v.len()),
        PathMatch::RegularExpression(v) => (2, v.len()),
        // `/a/` and `/a` match the same requests.
        PathMatch::PathPrefix(v) => (1, v.trim_end_matches('/').len()),
    }
}

/// The spec's order within one host group: the better match first.
pub fn compare(a: &Candidate, b: &Candidate) -> Ordering {
    let key = |c: &Candidate| {
        let m = &c.route_match;
        (
            Reverse(host_rank(&c.route_hostname)),
            Reverse(host_rank(&c.hostname)),
            Reverse(match c.grpc {
                // A GRPCRoute match names a service or method: as specific
                // as an exact path, so an HTTPRoute's catch-all on the same
                // hostname never hides it; among GRPCRoutes, the spec's
                // order. One without a method match takes every call, as a
                // `/` prefix would.
                Some((0, 0)) => (1, 0, 0),
                Some((service, method)) => (3, service, method),
                None => {
                    let (kind, len) = path_rank(&m.path);
                    (kind, len, 0)
                }
            }),
            Reverse(m.method.is_some()),
            Reverse(m.headers.len()),
            Reverse(m.query.len()),
        )
    };
    key(a)
        .cmp(&key(b))
        .then(a.created.cmp(&b.created))
        .then_with(|| a.route.cmp(&b.route))
        .then(a.rule_index.cmp(&b.rule_index))
        .then(a.match_index.cmp(&b.match_index))
}

/// The most specific of `listeners` (hostnames, `*` for none) that
/// serves `host` (a name or a wildcard): equal, else the longest wildcard
/// that covers it, else `*`.
fn listener_for<'a>(listeners: &'a [String], host: &str) -> Option<&'a str> {
    listeners
        .iter()
        .filter(|l| *l == host || *l == "*" || covers(l, host))
        .max_by_key(|l| host_rank(l))
        .map(String::as_str)
}

/// The host groups of one server (a Gateway port): one per hostname some
/// candidate serves and per listener hostname, each with the candidates
/// of the listener that serves that name which cover it, in the spec's
/// order. A request's host picks its group (exact, longest wildcard, `*`)
/// and so its listener: routes of a less specific listener never serve a
/// host a more specific one takes, even when that one has no route for
/// it (an empty group: 404).
pub fn host_groups(candidates: &[Candidate], listeners: &[String]) -> Vec<HostRoutes> {
    let mut listeners: Vec<String> = listeners.iter().map(|l| l.to_ascii_lowercase()).collect();
    listeners.extend(candidates.iter().map(|c| c.listener.clone()));
    listeners.sort_unstable();
    listeners.dedup();
    let mut names: Vec<&str> = candidates
        .iter()
        .map(|c| c.hostname.as_str())
        .chain(listeners.iter().map(String::as_str))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let serving = listener_for(&listeners, name);
            let mut members: Vec<&Candidate> = candidates
                .iter()
                .filter(|c| Some(c.listener.as_str()) == serving)
                .filter(|c| c.hostname == name || c.hostname == "*" || covers(&c.hostname, name))
                .collect();
            members.sort_by(|a, b| compare(a, b));
            HostRoutes {
                hostname: name.to_string(),
                matches: members.into_iter().map(|c| c.route_match.clone()).collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lua_compat::routes::ValueMatch;
    use proptest::prelude::*;

    fn candidate(host: &str, path: PathMatch, rule: u32) -> Candidate {
        Candidate {
            hostname: host.into(),
            route_hostname: host.into(),
            listener: "*".into(),
            route_match: RouteMatch {
                path,
                rule,
                ..Default::default()
            },
            created: 100,
            route: ("default".into(), format!("r{rule}")),
            rule_index: 0,
            match_index: 0,
            grpc: None,
        }
    }

    fn prefix(p: &str) -> PathMatch {
        PathMatch::PathPrefix(p.into())
    }

    fn header(name: &str) -> ValueMatch {
        ValueMatch {
            name: name.into(),
            value: "1".into(),
            regex: false,
        }
    }

    fn rules_of(g: &HostRoutes) -> Vec<u32> {
        g.matches.iter().map(|m| m.rule).collect()
    }

    #[test]
    fn paths_then_method_headers_query_then_age_and_name() {
        let mut with_method = candidate("*", prefix("/a"), 3);
        with_method.route_match.method = Some("GET".into());
        let mut two_headers = candidate("*", prefix("/a"), 4);
        two_headers.route_match.headers = vec![header("x"), header("y")];
        let mut one_header = candidate("*", prefix("/a"), 5);
        one_header.route_match.headers = vec![header("x")];
        let mut older = candidate("*", prefix("/"), 6);
        older.created = 50;
        let mut by_name = candidate("*", prefix("/"), 7);
        by_name.route = ("a".into(), "z".into());
        let list = vec![
            candidate("*", prefix("/"), 0),
            candidate("*", prefix("/a/b"), 1),
            candidate("*", PathMatch::Exact("/a".into()), 2),
            one_header,
            two_headers,
            with_method,
            by_name,
            older,
        ];
        let groups = host_groups(&list, &[]);
        assert_eq!(groups.len(), 1);
        assert_eq!(rules_of(&groups[0]), vec![2, 1, 3, 4, 5, 6, 7, 0]);
    }

    #[test]
    fn specific_hostnames_first_then_their_wildcards_then_any() {
        let list = vec![
            candidate("*", PathMatch::Exact("/x".into()), 0),
            candidate("*.example.com", prefix("/"), 1),
            candidate("a.example.com", prefix("/only"), 2),
            candidate("*.a.example.com", prefix("/"), 3),
        ];
        let groups = host_groups(&list, &[]);
        let by_name = |n: &str| rules_of(groups.iter().find(|g| g.hostname == n).unwrap());
        // The exact host's own routes win even over a longer path elsewhere.
        assert_eq!(by_name("a.example.com"), vec![2, 1, 0]);
        assert_eq!(by_name("*.a.example.com"), vec![3, 1, 0]);
        assert_eq!(by_name("*.example.com"), vec![1, 0]);
        assert_eq!(by_name("*"), vec![0]);
    }

    #[test]
    fn listeners_stay_isolated_and_exact_route_hostnames_go_first() {
        let on = |listener: &str, route_host: &str, host: &str, path: &str, rule: u32| {
            let mut c = candidate(host, prefix(path), rule);
            c.listener = listener.into();
            c.route_hostname = route_host.into();
            c
        };
        let listeners: Vec<String> = ["*", "*.example.com", "*.foo.example.com", "abc.foo.example.com"]
            .map(String::from)
            .to_vec();
        let list = vec![
            on("*", "*", "*", "/empty", 0),
            on("*.example.com", "*", "*.example.com", "/wc", 1),
            on("*.foo.example.com", "*", "*.foo.example.com", "/wc-foo", 2),
            // A route naming no host of its listener: the listener's group
            // is still there, empty.
        ];
        let groups = host_groups(&list, &listeners);
        let by_name = |n: &str| rules_of(groups.iter().find(|g| g.hostname == n).unwrap());
        assert_eq!(by_name("*"), vec![0]);
        assert_eq!(by_name("*.example.com"), vec![1]);
        assert_eq!(by_name("*.foo.example.com"), vec![2]);
        assert!(by_name("abc.foo.example.com").is_empty());

        // One listener: an exact route hostname goes before a wildcard
        // one that meets the listener in the same name, whatever their age.
        let mut older_wildcard = on("abc.example.com", "*.example.com", "abc.example.com", "/", 0);
        older_wildcard.created = 1;
        let newer_exact = on("abc.example.com", "abc.example.com", "abc.example.com", "/", 1);
        let groups = host_groups(&[older_wildcard, newer_exact], &[]);
        assert_eq!(rules_of(&groups[0]), vec![1, 0]);
    }

    proptest! {
        /// The order is total and consistent: sorting any shuffle gives
        /// the same sequence, and an Exact path is never behind a prefix
        /// of the same host.
        #[test]
        fn the_order_is_total(
            specs in proptest::collection::vec((0u8..3, 0usize..4, any::<bool>(), 0usize..3, 0i64..3), 1..12),
            seed: u64,
        ) {
            let list: Vec<Candidate> = specs.iter().enumerate().map(|(i, (kind, len, method, headers, created))| {
                let path = "/".to_string() + &"a".repeat(*len);
                let mut c = candidate("*", match kind {
                    0 => PathMatch::Exact(path),
                    1 => PathMatch::RegularExpression(path),
                    _ => PathMatch::PathPrefix(path),
                }, i as u32);
                c.route_match.method = method.then(|| "GET".to_string());
                c.route_match.headers = (0..*headers).map(|h| header(&format!("h{h}"))).collect();
                c.created = *created;
                c
            }).collect();
            let sorted = rules_of(&host_groups(&list, &[])[0]);
            let mut shuffled = list.clone();
            let mut rng = seed;
            for i in (1..shuffled.len()).rev() {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (rng >> 33) as usize % (i + 1));
            }
            prop_assert_eq!(&sorted, &rules_of(&host_groups(&shuffled, &[])[0]));
            let first_prefix = sorted.iter().position(|r| matches!(list[*r as usize].route_match.path, PathMatch::PathPrefix(_)));
            let last_exact = sorted.iter().rposition(|r| matches!(list[*r as usize].route_match.path, PathMatch::Exact(_)));
            if let (Some(p), Some(e)) = (first_prefix, last_exact) {
                prop_assert!(e < p);
            }
        }
    }
}
