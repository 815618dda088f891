//! Listener and route hostnames, intersected.
//!
//! A route attaches to a listener only where their hostnames meet: a
//! listener without a hostname takes the route's (or every host, `*`, if
//! the route names none); a route without hostnames takes the listener's.
//! Otherwise each route hostname is kept when it equals the listener's or
//! falls under the listener's wildcard, and the listener's hostname is
//! kept when it falls under a route wildcard. An empty result means the
//! route does not attach (`NoMatchingListenerHostname`).

/// Whether `wildcard` (`*.example.com`) covers `host` (`a.example.com`,
/// `a.b.example.com`, or a narrower wildcard `*.a.example.com`): at least
/// one label more, never the bare parent.
pub fn covers(wildcard: &str, host: &str) -> bool {
    let Some(suffix) = wildcard.strip_prefix('*') else {
        return false;
    };
    let host = host.strip_prefix('*').unwrap_or(host);
    host.len() > suffix.len() && host.ends_with(suffix)
}

/// The hostnames a route serves on a listener, each with the route
/// hostname it came from (`*` for a route that names none), lower-cased
/// and without duplicates; `*` stands for every host.
pub fn intersect_from(listener: Option<&str>, route: &[String]) -> Vec<(String, String)> {
    let route: Vec<String> = route.iter().map(|h| h.to_ascii_lowercase()).collect();
    let mut out: Vec<(String, String)> = match listener.map(str::to_ascii_lowercase) {
        None if route.is_empty() => vec![("*".into(), "*".into())],
        None => route.iter().map(|h| (h.clone(), h.clone())).collect(),
        Some(l) if route.is_empty() => vec![(l, "*".into())],
        Some(l) => route
            .iter()
            .filter_map(|h| {
                if *h == l || covers(&l, h) {
                    Some((h.clone(), h.clone()))
                } else if covers(h, &l) {
                    Some((l.clone(), h.clone()))
                } else {
                    None
                }
            })
            .collect(),
    };
    out.sort();
    out.dedup();
    out
}

/// The hostnames a route serves on a listener, lower-cased and without
/// duplicates; `*` stands for every host.
pub fn intersect(listener: Option<&str>, route: &[String]) -> Vec<String> {
    let mut out: Vec<String> = intersect_from(listener, route).into_iter().map(|(h, _)| h).collect();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_spec_examples() {
        // A listener `test.example.com` takes routes with no hostnames, or
        // with that hostname, or with `*.example.com`.
        assert_eq!(intersect(Some("test.example.com"), &[]), v(&["test.example.com"]));
        assert_eq!(
            intersect(Some("test.example.com"), &v(&["test.example.com", "other.test"])),
            v(&["test.example.com"])
        );
        assert_eq!(
            intersect(Some("test.example.com"), &v(&["*.example.com"])),
            v(&["test.example.com"])
        );
        // A wildcard listener takes the routes' hostnames under it.
        assert_eq!(
            intersect(
                Some("*.example.com"),
                &v(&["a.example.com", "*.b.example.com", "example.com", "x.test"])
            ),
            v(&["*.b.example.com", "a.example.com"])
        );
        // No listener hostname: the route's, or everything.
        assert_eq!(intersect(None, &v(&["Web.Test"])), v(&["web.test"]));
        assert_eq!(intersect(None, &[]), v(&["*"]));
        // Nothing in common: the route does not attach.
        assert!(intersect(Some("a.test"), &v(&["b.test"])).is_empty());
    }

    #[test]
    fn wildcards_need_a_label() {
        assert!(covers("*.example.com", "a.example.com"));
        assert!(covers("*.example.com", "a.b.example.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(!covers("*.example.com", "xexample.com"));
        assert!(covers("*.example.com", "*.a.example.com"));
        assert!(!covers("a.example.com", "a.example.com"));
    }
}
