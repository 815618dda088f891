//! One selection mechanism for every balancing algorithm.
//!
//! Each algorithm is a [`Selection`]: a build step, run once per backend
//! version in each worker, that precomputes what the algorithm needs (a hash
//! ring, subsets, cookie keys, round-robin weights), and a `pick` that
//! returns the endpoint the algorithm prefers *among those an `accept`
//! predicate takes*. [`select`] is the only consumer: it applies the
//! fallback tiers that every algorithm shares, in one place:
//!
//! 1. untried and healthy (passive health has not taken it out);
//! 2. untried, healthy or not (everything left is down);
//! 3. any endpoint, as nginx does when all of them are down or tried (a
//!    retry granted after a cached keepalive connection turned out closed).
//!
//! So no algorithm ever hands out an endpoint the request already tried while
//! an untried healthy one exists, and no algorithm carries its own copy of
//! the retry rules.
//!
//! # Why a predicate, not an iterator of candidates
//!
//! Pingora's selectors yield candidates in preference order and let the
//! consumer skip the unacceptable ones. Here the filter is pushed into the
//! algorithm instead, because for most of ours the filter is part of the
//! choice, not a post-processing step: smooth weighted round-robin (as
//! nginx's) credits weight only to the eligible peers, least_conn takes the
//! minimum over the eligible ones and the power-of-two-choices pickers draw
//! their two samples from the eligible ones. An iterator would have to order
//! every endpoint (O(n log n) for a pick that is O(1) today) or change the
//! distribution. Hash rings walk on from the key's node, which a predicate
//! expresses just as well. The tiers stay in one place all the same.
//!
//! Where a new algorithm goes: a file here with a type that implements
//! [`Selection`], a variant of [`Selector`], and a variant of
//! [`crate::algorithm::Algorithm`] that chooses it.

mod chash;
mod chashsubset;
mod ewma;
mod least_conn;
mod round_robin;
mod sticky;

pub use chash::ChashSelector;
pub use chashsubset::ChashSubsetSelector;
pub use ewma::EwmaSelector;
pub use least_conn::LeastConnSelector;
pub use round_robin::RoundRobinSelector;
pub use sticky::StickySelector;

use crate::algorithm::Algorithm;
use crate::hash_key::HashKey;
use crate::runtime::RuntimeBackend;
use crate::tried::TriedSet;

/// What a selector may read about the backend's endpoints at request time:
/// the state every worker shares (passive health, connections, EWMA). The
/// nginx module implements it over the zone's endpoint table.
pub trait Endpoints {
    /// How many endpoints the backend has; they are `0..count()`.
    fn count(&self) -> usize;
    /// Passive health has not taken endpoint `i` out of rotation.
    fn healthy(&self, i: usize) -> bool;
    /// Connections open to endpoint `i` (least_conn).
    fn connections(&self, i: usize) -> u64;
    /// Endpoint `i`'s decayed EWMA score (ewma).
    fn ewma_score(&self, i: usize) -> f64;
}

/// The request's side of one attempt.
#[derive(Clone, Copy, Debug, Default)]
pub struct Attempt<'a> {
    /// The rendered `upstream-hash-by` key (see [`Selector::hash_key`]).
    pub hash_key: &'a [u8],
    /// The value of the sticky cookie, if the request carries it (see
    /// [`Selector::cookie_variable`]).
    pub cookie: Option<&'a str>,
    /// An earlier attempt of this request failed.
    pub retry: bool,
    /// nginx's cached millisecond clock; salts new sticky keys.
    pub now_ms: u64,
}

/// The endpoint chosen for an attempt, with what the algorithm learned on
/// the way.
#[derive(Clone, Debug, PartialEq)]
pub struct Pick {
    pub endpoint: usize,
    /// ewma: the winner's score, for `$balancer_ewma_score`.
    pub ewma_score: Option<f64>,
    /// sticky: a new session key; the caller issues it as the cookie.
    pub new_cookie: Option<String>,
}

impl Pick {
    #[inline]
    pub fn of(endpoint: usize) -> Pick {
        Pick {
            endpoint,
            ewma_score: None,
            new_cookie: None,
        }
    }
}

/// Who builds the selector: a worker. Its pid spreads round-robin starting
/// points and salts sticky keys, as Lua's per-worker randomness does.
#[derive(Clone, Copy, Debug)]
pub struct Worker {
    pub pid: i64,
}

impl Worker {
    /// The round-robin start of this worker.
    pub fn seed(&self) -> usize {
        (self.pid as usize).wrapping_mul(0x9e37_79b9)
    }
}

/// Which endpoints a pick may return: the tier's predicate.
pub trait Accept: Fn(usize) -> bool {}
impl<F: Fn(usize) -> bool> Accept for F {}

/// A balancing algorithm: what it precomputes per backend, and how it picks.
pub trait Selection {
    /// Precomputes the algorithm's state for `backend`.
    fn build(backend: &RuntimeBackend, worker: Worker) -> Self
    where
        Self: Sized;

    /// The endpoint this algorithm prefers among those `accept` takes;
    /// `None` when it takes none. Only [`select`] calls it.
    fn pick(&self, attempt: &Attempt<'_>, endpoints: &impl Endpoints, accept: impl Accept) -> Option<Pick>;
}

/// The endpoint for the next attempt: the algorithm's choice among the
/// untried healthy endpoints, else among the untried ones, else among all.
#[inline]
pub fn select(
    selector: &(impl Selection + ?Sized),
    attempt: &Attempt<'_>,
    endpoints: &impl Endpoints,
    tried: &TriedSet,
) -> Option<Pick> {
    // `is_empty` first: the first attempt skips the population count.
    if tried.is_empty() || tried.len() < endpoints.count() {
        let untried = |i: usize| !tried.contains(i);
        if let Some(p) = selector.pick(attempt, endpoints, |i| untried(i) && endpoints.healthy(i)) {
            return Some(p);
        }
        if let Some(p) = selector.pick(attempt, endpoints, untried) {
            return Some(p);
        }
    }
    selector.pick(attempt, endpoints, |_| true)
}

/// A backend's selector, whichever algorithm it uses. An enum rather than a
/// trait object: a worker holds backends of every algorithm side by side,
/// and a `match` costs less per request than a virtual call.
pub enum Selector {
    RoundRobin(RoundRobinSelector),
    LeastConn(LeastConnSelector),
    Ewma(EwmaSelector),
    Chash(ChashSelector),
    ChashSubset(ChashSubsetSelector),
    /// Boxed: cookie rules make it several times larger than the others.
    Sticky(Box<StickySelector>),
}

impl Selector {
    /// Points on this selector's hash ring (0 for algorithms without one):
    /// what building it cost.
    pub fn ring_len(&self) -> usize {
        match self {
            Selector::Chash(c) => c.ring_len(),
            Selector::ChashSubset(c) => c.ring_len(),
            Selector::Sticky(s) => s.ring_len(),
            Selector::RoundRobin(_) | Selector::LeastConn(_) | Selector::Ewma(_) => 0,
        }
    }

    /// The `upstream-hash-by` template to render into
    /// [`Attempt::hash_key`], for the algorithms that hash a request key.
    #[inline]
    pub fn hash_key(&self) -> Option<&HashKey> {
        match self {
            Selector::Chash(c) => Some(&c.key),
            Selector::ChashSubset(c) => Some(&c.key),
            _ => None,
        }
    }

    /// The nginx variable (`cookie_<name>`) holding the sticky cookie, to
    /// read into [`Attempt::cookie`].
    #[inline]
    pub fn cookie_variable(&self) -> Option<&str> {
        self.sticky().map(|s| s.cookie_variable.as_str())
    }

    #[inline]
    pub fn sticky(&self) -> Option<&StickySelector> {
        match self {
            Selector::Sticky(s) => Some(s),
            _ => None,
        }
    }

    /// Whether finished attempts feed the EWMA of their endpoint.
    #[inline]
    pub fn learns_round_trips(&self) -> bool {
        matches!(self, Selector::Ewma(_))
    }
}

impl Selection for Selector {
    fn build(backend: &RuntimeBackend, worker: Worker) -> Selector {
        match &backend.algorithm {
            Algorithm::RoundRobin => Selector::RoundRobin(RoundRobinSelector::build(backend, worker)),
            Algorithm::LeastConn => Selector::LeastConn(LeastConnSelector::build(backend, worker)),
            Algorithm::Ewma => Selector::Ewma(EwmaSelector::build(backend, worker)),
            Algorithm::Chash { .. } => Selector::Chash(ChashSelector::build(backend, worker)),
            Algorithm::ChashSubset { .. } => Selector::ChashSubset(ChashSubsetSelector::build(backend, worker)),
            Algorithm::Sticky { .. } => Selector::Sticky(Box::new(StickySelector::build(backend, worker))),
        }
    }

    #[inline]
    fn pick(&self, attempt: &Attempt<'_>, endpoints: &impl Endpoints, accept: impl Accept) -> Option<Pick> {
        match self {
            Selector::RoundRobin(s) => s.pick(attempt, endpoints, accept),
            Selector::LeastConn(s) => s.pick(attempt, endpoints, accept),
            Selector::Ewma(s) => s.pick(attempt, endpoints, accept),
            Selector::Chash(s) => s.pick(attempt, endpoints, accept),
            Selector::ChashSubset(s) => s.pick(attempt, endpoints, accept),
            Selector::Sticky(s) => s.pick(attempt, endpoints, accept),
        }
    }
}

/// The endpoint names the hash rings and cookies use: `ip:port`, `[v6]:port`,
/// as Lua names peers.
fn node_ids(backend: &RuntimeBackend) -> Vec<String> {
    backend.endpoints.iter().map(|e| e.addr.to_string()).collect()
}

/// One random endpoint among `0..n` that `accept` takes, without scanning
/// large backends.
fn random_where(n: usize, accept: impl Fn(usize) -> bool) -> Option<usize> {
    crate::sample::sample_two(n, accept, |k| fastrand::usize(..k)).map(|(a, _)| a)
}

#[cfg(test)]
pub(crate) mod testing {
    //! Backends and endpoint views for the selectors' tests.

    pub use super::*;
    pub use crate::algorithm::Algorithm;
    use crate::runtime::RuntimeEndpoint;
    use crate::sticky::{CookieSpec, StickyMode};
    pub use crate::tried::TriedSet;

    /// The endpoint `selector` picks for a plain request.
    pub fn first(selector: &Selector, table: &Table, tried: &TriedSet) -> usize {
        select(selector, &Attempt::default(), table, tried).unwrap().endpoint
    }

    /// How often each endpoint is picked over `rounds` plain requests.
    pub fn tally(selector: &Selector, table: &Table, rounds: usize) -> Vec<usize> {
        let mut counts = vec![0; table.count()];
        for _ in 0..rounds {
            counts[first(selector, table, &TriedSet::new())] += 1;
        }
        counts
    }

    /// Endpoint facts held in plain vectors.
    #[derive(Clone, Debug, Default)]
    pub struct Table {
        pub down: Vec<bool>,
        pub conns: Vec<u64>,
        pub scores: Vec<f64>,
    }

    impl Table {
        pub fn healthy(n: usize) -> Table {
            Table {
                down: vec![false; n],
                conns: vec![0; n],
                scores: vec![0.0; n],
            }
        }
    }

    impl Endpoints for Table {
        fn count(&self) -> usize {
            self.down.len()
        }
        fn healthy(&self, i: usize) -> bool {
            !self.down[i]
        }
        fn connections(&self, i: usize) -> u64 {
            self.conns[i]
        }
        fn ewma_score(&self, i: usize) -> f64 {
            self.scores[i]
        }
    }

    pub fn cookie(name: &str, change_on_failure: bool) -> CookieSpec {
        CookieSpec {
            carrier: Default::default(),
            name: name.into(),
            path: None,
            expires: None,
            max_age: None,
            domain: None,
            samesite: None,
            conditional_samesite_none: false,
            secure: None,
            change_on_failure,
            locations: Default::default(),
        }
    }

    /// Every algorithm, for a backend of `weights.len()` endpoints.
    pub fn algorithms() -> Vec<Algorithm> {
        let key = || HashKey::parse("$request_uri");
        vec![
            Algorithm::RoundRobin,
            Algorithm::LeastConn,
            Algorithm::Ewma,
            Algorithm::Chash { key: key() },
            Algorithm::ChashSubset {
                key: key(),
                subset_size: 3,
            },
            Algorithm::Sticky {
                mode: StickyMode::Balanced,
                cookie: cookie("route", false),
            },
            Algorithm::Sticky {
                mode: StickyMode::Persistent,
                cookie: cookie("route", true),
            },
        ]
    }

    pub fn backend(algorithm: Algorithm, weights: &[u32]) -> RuntimeBackend {
        RuntimeBackend {
            name: "ns-svc-80".into(),
            endpoints: weights
                .iter()
                .enumerate()
                .map(|(i, w)| RuntimeEndpoint {
                    addr: std::net::SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 8080)),
                    weight: *w,
                })
                .collect(),
            algorithm,
            alternatives: Vec::new(),
            traffic: Default::default(),
            max_fails: 1,
            fail_timeout_ms: 10_000,
        }
    }

    pub const WORKER: Worker = Worker { pid: 4242 };
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ring_len_is_what_the_ring_got() {
        let chash = Algorithm::Chash {
            key: crate::hash_key::HashKey::parse("$request_uri"),
        };
        assert_eq!(Selector::build(&backend(chash, &[1, 2, 3]), WORKER).ring_len(), 6 * 160);
        assert_eq!(
            Selector::build(&backend(Algorithm::RoundRobin, &[1; 100]), WORKER).ring_len(),
            0
        );
        let subset = Algorithm::ChashSubset {
            key: crate::hash_key::HashKey::parse("$request_uri"),
            subset_size: 3,
        };
        assert_eq!(Selector::build(&backend(subset, &[1; 10]), WORKER).ring_len(), 4 * 160);
    }

    proptest! {
        /// The tiers, for every algorithm: never a tried endpoint while an
        /// untried one exists, never an unhealthy one while an untried
        /// healthy one exists, and always an endpoint when there is one.
        #[test]
        fn tiers_hold_for_every_algorithm(
            weights in proptest::collection::vec(1u32..5, 1..80),
            tried_mask in proptest::collection::vec(any::<bool>(), 80),
            down_mask in proptest::collection::vec(any::<bool>(), 80),
            key in "[a-z0-9/]{0,12}",
            cookie in proptest::option::of("[0-9a-f]{32}|[0-9.]{5,20}"),
            retry in any::<bool>(),
        ) {
            let n = weights.len();
            let mut table = Table::healthy(n);
            table.down.copy_from_slice(&down_mask[..n]);
            table.conns = (0..n as u64).map(|i| i * 7 % 5).collect();
            table.scores = (0..n).map(|i| (i * 13 % 7) as f64 / 10.0).collect();
            let mut tried = TriedSet::new();
            for i in (0..n).filter(|i| tried_mask[*i]) {
                tried.insert(i);
            }
            let attempt = Attempt { hash_key: key.as_bytes(), cookie: cookie.as_deref(), retry, now_ms: 1_000 };
            let untried_healthy = (0..n).any(|i| !tried.contains(i) && !table.down[i]);
            let untried = (0..n).any(|i| !tried.contains(i));
            for algorithm in algorithms() {
                let name = algorithm.name();
                let selector = Selector::build(&backend(algorithm, &weights), WORKER);
                let pick = select(&selector, &attempt, &table, &tried);
                let Some(pick) = pick else {
                    return Err(TestCaseError::fail(format!("{name}: no endpoint of {n}")));
                };
                let i = pick.endpoint;
                prop_assert!(i < n, "{}: {} out of range", name, i);
                if untried {
                    prop_assert!(!tried.contains(i), "{}: tried {} while an untried one exists", name, i);
                }
                if untried_healthy {
                    prop_assert!(!table.down[i], "{}: unhealthy {} while an untried healthy one exists", name, i);
                }
            }
        }
    }

    #[test]
    fn an_empty_backend_selects_nothing() {
        for algorithm in algorithms() {
            let selector = Selector::build(&backend(algorithm, &[]), WORKER);
            let picked = select(&selector, &Attempt::default(), &Table::healthy(0), &TriedSet::new());
            assert_eq!(picked, None);
        }
    }

    #[test]
    fn every_algorithm_answers_to_its_name() {
        for algorithm in algorithms() {
            let ewma = matches!(algorithm, Algorithm::Ewma);
            let hashes = matches!(algorithm, Algorithm::Chash { .. } | Algorithm::ChashSubset { .. });
            let sticky = matches!(algorithm, Algorithm::Sticky { .. });
            let selector = Selector::build(&backend(algorithm, &[1, 1]), WORKER);
            assert_eq!(selector.learns_round_trips(), ewma);
            assert_eq!(selector.hash_key().is_some(), hashes);
            assert_eq!(selector.cookie_variable(), sticky.then_some("cookie_route"));
        }
    }
}
