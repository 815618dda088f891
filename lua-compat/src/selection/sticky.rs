//! sticky_balanced and sticky_persistent (`affinity: cookie`), as
//! `balancer/sticky*.lua`: follow the session cookie, unless there is none
//! (or it names no endpoint), its endpoint is down, or this is a retry with
//! `change_on_failure`; then pick anew and hand the caller a new session key
//! to issue (see [`crate::sticky`] for the cookie's format).
//!
//! Beyond Lua: an endpoint passive health took out is not followed, and the
//! tiers of [`super::select`] keep a retry away from the endpoint that just
//! failed; without `change_on_failure` such a retry goes elsewhere while the
//! session keeps its cookie.

use rustc_hash::FxHashMap;

use super::{node_ids, random_where, Accept, Attempt, Endpoints, Pick, Selection, Worker};
use crate::algorithm::Algorithm;
use crate::chash::ChashRing;
use crate::runtime::RuntimeBackend;
use crate::sticky::{backend_key, parse_cookie_value, persistent_key, session_variable, CookieSpec, StickyMode};

/// Balanced mode's attempts at a new key that lands on an acceptable
/// endpoint, as Lua's `MAX_UPSTREAM_CHECKS_COUNT`.
const NEW_KEY_TRIES: u32 = 20;

pub struct StickySelector {
    mode: StickyMode,
    pub cookie: CookieSpec,
    /// The nginx variable holding the session: `cookie_<name>`, or
    /// `http_<name>` for a session header ([`session_variable`]).
    pub cookie_variable: String,
    /// `md5(md5(name) .. name)`: the cookie's backend half.
    pub backend_key: String,
    /// Balanced mode: a ring over the endpoints that session keys hash onto.
    ring: ChashRing,
    /// Persistent mode: each endpoint's key, `md5(name .. "addr:port")`.
    keys: Vec<String>,
    /// Persistent mode: key -> endpoint. FxHash: the keys are our own MD5s.
    by_key: FxHashMap<String, usize>,
    /// Salts new balanced keys, as Lua's keys carry the worker pid.
    pid: i64,
}

impl StickySelector {
    /// Whether a request whose cookie is `value` belongs to this backend's
    /// sessions (a canary keeps its sticky sessions).
    pub fn is_affinitized(&self, value: &str) -> bool {
        parse_cookie_value(value).1 == Some(self.backend_key.as_str())
    }

    /// The endpoint a session key names.
    fn endpoint_of(&self, key: &str) -> Option<usize> {
        match self.mode {
            StickyMode::Balanced => self.ring.find(key.as_bytes()).map(|(i, _)| i),
            StickyMode::Persistent => self.by_key.get(key).copied(),
        }
    }

    /// A new balanced key that hashes onto an endpoint `accept` takes.
    fn new_balanced_key(&self, now_ms: u64, accept: &impl Fn(usize) -> bool) -> Option<(usize, String)> {
        let now = now_ms as f64 / 1000.0;
        (1..=NEW_KEY_TRIES).find_map(|k| {
            let key = format!("{:.3}.{}.{}", now + f64::from(k), self.pid, fastrand::u32(1..=999_999));
            let (i, _) = self.ring.find(key.as_bytes())?;
            accept(i).then_some((i, key))
        })
    }
}

impl StickySelector {
    /// Points on its hash ring.
    pub(super) fn ring_len(&self) -> usize {
        self.ring.len()
    }
}

impl Selection for StickySelector {
    fn build(backend: &RuntimeBackend, worker: Worker) -> Self {
        let Algorithm::Sticky { mode, cookie } = &backend.algorithm else {
            unreachable!("Selector::build dispatches on the algorithm")
        };
        let ids = node_ids(backend);
        let (ring, keys) = match mode {
            StickyMode::Balanced => (
                ChashRing::new(
                    ids.iter()
                        .zip(&backend.endpoints)
                        .map(|(id, e)| (id.as_str(), e.weight)),
                ),
                Vec::new(),
            ),
            StickyMode::Persistent => (
                ChashRing::new(std::iter::empty()),
                ids.iter().map(|id| persistent_key(&backend.name, id)).collect(),
            ),
        };
        StickySelector {
            mode: *mode,
            cookie_variable: session_variable(cookie.carrier, &cookie.name),
            backend_key: backend_key(&backend.name),
            cookie: cookie.clone(),
            ring,
            by_key: keys.iter().enumerate().map(|(i, k)| (k.clone(), i)).collect(),
            keys,
            pid: worker.pid,
        }
    }

    fn pick(&self, attempt: &Attempt<'_>, endpoints: &impl Endpoints, accept: impl Accept) -> Option<Pick> {
        let n = endpoints.count();
        let from_cookie = attempt
            .cookie
            .and_then(|c| parse_cookie_value(c).0)
            .and_then(|key| self.endpoint_of(key))
            .filter(|i| *i < n);
        let reissue =
            (attempt.retry && self.cookie.change_on_failure) || from_cookie.is_none_or(|i| !endpoints.healthy(i));
        if let Some(i) = from_cookie.filter(|i| !reissue && accept(*i)) {
            return Some(Pick::of(i));
        }
        let (endpoint, key) = match self.mode {
            StickyMode::Balanced => match self.new_balanced_key(attempt.now_ms, &accept) {
                Some(found) => found,
                // Every try landed on endpoints the request cannot use (most
                // are down or tried): serve from any acceptable one and keep
                // the cookie as it is; a later request tries again.
                None => return random_where(n, accept).map(Pick::of),
            },
            StickyMode::Persistent => {
                let i = random_where(n, accept)?;
                (i, self.keys[i].clone())
            }
        };
        Some(Pick {
            endpoint,
            ewma_score: None,
            new_cookie: reissue.then_some(key),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    fn sticky(mode: StickyMode, change_on_failure: bool) -> Selector {
        let algorithm = Algorithm::Sticky {
            mode,
            cookie: cookie("route", change_on_failure),
        };
        Selector::build(&backend(algorithm, &[1, 1, 1, 1]), WORKER)
    }

    #[test]
    fn a_session_is_issued_once_then_followed() {
        for mode in [StickyMode::Balanced, StickyMode::Persistent] {
            let selector = sticky(mode, false);
            let table = Table::healthy(4);
            let first = select(&selector, &Attempt::default(), &table, &TriedSet::new()).unwrap();
            let key = first.new_cookie.clone().expect("a new session gets a cookie");
            let value = format!("{key}|{}", selector.sticky().unwrap().backend_key);
            assert!(selector.sticky().unwrap().is_affinitized(&value));
            let attempt = Attempt {
                cookie: Some(&value),
                ..Attempt::default()
            };
            for _ in 0..10 {
                let again = select(&selector, &attempt, &table, &TriedSet::new()).unwrap();
                assert_eq!(again, Pick::of(first.endpoint), "{mode:?}");
            }
        }
    }

    #[test]
    fn a_down_endpoint_or_a_retry_with_change_on_failure_reissues() {
        for mode in [StickyMode::Balanced, StickyMode::Persistent] {
            let selector = sticky(mode, true);
            let mut table = Table::healthy(4);
            let first = select(&selector, &Attempt::default(), &table, &TriedSet::new()).unwrap();
            let value = first.new_cookie.unwrap();
            let follow = Attempt {
                cookie: Some(&value),
                ..Attempt::default()
            };
            let mut tried = TriedSet::new();
            tried.insert(first.endpoint);
            let retry = select(&selector, &Attempt { retry: true, ..follow }, &table, &tried).unwrap();
            assert_ne!(retry.endpoint, first.endpoint);
            assert!(retry.new_cookie.is_some(), "{mode:?}: change_on_failure reissues");
            table.down[first.endpoint] = true;
            let moved = select(&selector, &follow, &table, &TriedSet::new()).unwrap();
            assert_ne!(moved.endpoint, first.endpoint);
            assert!(moved.new_cookie.is_some(), "{mode:?}: a down endpoint reissues");
        }
    }

    #[test]
    fn a_retry_without_change_on_failure_keeps_the_cookie() {
        let selector = sticky(StickyMode::Persistent, false);
        let table = Table::healthy(4);
        let first = select(&selector, &Attempt::default(), &table, &TriedSet::new()).unwrap();
        let value = first.new_cookie.unwrap();
        let mut tried = TriedSet::new();
        tried.insert(first.endpoint);
        let attempt = Attempt {
            cookie: Some(&value),
            retry: true,
            ..Attempt::default()
        };
        let retry = select(&selector, &attempt, &table, &tried).unwrap();
        assert_ne!(retry.endpoint, first.endpoint);
        assert_eq!(retry.new_cookie, None);
    }
}
