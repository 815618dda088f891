//! Which algorithm balances a backend: `get_implementation` of ingress-nginx's
//! `balancer.lua`, plus the algorithms we add (least_conn).
//!
//! Cookie affinity wins over everything; then a non-empty `upstream-hash-by`
//! (chash, or chashsubset with the subset flag); then `load-balance`.

use serde::{Deserialize, Serialize};

use crate::hash_key::HashKey;
use crate::sticky::{Carrier, CookieSpec, StickyMode};
use crate::wire::Backend;

/// `upstream-hash-by-subset-size` when unset, as the annotation defaults.
pub const DEFAULT_SUBSET_SIZE: usize = 3;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Algorithm {
    RoundRobin,
    Ewma,
    LeastConn,
    Chash { key: HashKey },
    ChashSubset { key: HashKey, subset_size: usize },
    Sticky { mode: StickyMode, cookie: CookieSpec },
}

impl Algorithm {
    /// The algorithm of `backend`, and a warning when its `load-balance` is
    /// unknown (it then falls back to round_robin, as Lua does).
    pub fn select(backend: &Backend) -> (Algorithm, Option<String>) {
        let affinity = &backend.session_affinity;
        let carrier = match affinity.name.as_str() {
            "cookie" => Some(Carrier::Cookie),
            "header" => Some(Carrier::Header),
            _ => None,
        };
        if let Some(carrier) = carrier {
            let mode = if affinity.mode == "persistent" {
                StickyMode::Persistent
            } else {
                StickyMode::Balanced
            };
            return (
                Algorithm::Sticky {
                    mode,
                    cookie: CookieSpec::from_wire(&affinity.cookie, carrier),
                },
                None,
            );
        }
        let hash = &backend.upstream_hash_by;
        if !hash.hash_by.is_empty() {
            let key = HashKey::parse(&hash.hash_by);
            if hash.subset {
                let subset_size = usize::try_from(hash.subset_size)
                    .ok()
                    .filter(|s| *s > 0)
                    .unwrap_or(DEFAULT_SUBSET_SIZE);
                return (Algorithm::ChashSubset { key, subset_size }, None);
            }
            return (Algorithm::Chash { key }, None);
        }
        match backend.load_balance.as_str() {
            "" | "round_robin" => (Algorithm::RoundRobin, None),
            "ewma" => (Algorithm::Ewma, None),
            "least_conn" => (Algorithm::LeastConn, None),
            other => (
                Algorithm::RoundRobin,
                Some(format!(
                    "backend {:?}: load-balance {other:?} is not supported, falling back to round_robin",
                    backend.name
                )),
            ),
        }
    }

    /// Whether the algorithm builds a hash ring over the endpoints, whose
    /// size grows with their total weight.
    pub fn uses_ring(&self) -> bool {
        matches!(
            self,
            Algorithm::Chash { .. }
                | Algorithm::Sticky {
                    mode: StickyMode::Balanced,
                    ..
                }
        )
    }

    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::RoundRobin => "round_robin",
            Algorithm::Ewma => "ewma",
            Algorithm::LeastConn => "least_conn",
            Algorithm::Chash { .. } => "chash",
            Algorithm::ChashSubset { .. } => "chashsubset",
            Algorithm::Sticky {
                mode: StickyMode::Balanced,
                ..
            } => "sticky_balanced",
            Algorithm::Sticky {
                mode: StickyMode::Persistent,
                ..
            } => "sticky_persistent",
        }
    }
}

/// chashsubset's subsets, built as `build_subset_map` builds them: endpoints
/// in order, cut into `ceil(n / size)` sets of `size`, the last one padded
/// by repeating the endpoints from the start (as often as needed when there
/// are fewer endpoints than `size`). Set `i` is named `set{i+1}` on the ring.
pub fn subsets(endpoints: usize, size: usize) -> Vec<Vec<usize>> {
    if endpoints == 0 || size == 0 {
        return Vec::new();
    }
    let sets = endpoints.div_ceil(size);
    let padded: Vec<usize> = (0..sets * size).map(|i| i % endpoints).collect();
    padded.chunks(size).map(<[usize]>::to_vec).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(json: &str) -> Backend {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn selection_order_matches_balancer_lua() {
        let name = |j: &str| Algorithm::select(&backend(j)).0.name();
        assert_eq!(name(r#"{"name":"a"}"#), "round_robin");
        assert_eq!(name(r#"{"name":"a","load-balance":"ewma"}"#), "ewma");
        assert_eq!(name(r#"{"name":"a","load-balance":"least_conn"}"#), "least_conn");
        assert_eq!(
            name(r#"{"name":"a","load-balance":"ewma","upstreamHashByConfig":{"upstream-hash-by":"$uri"}}"#),
            "chash"
        );
        assert_eq!(
            name(r#"{"name":"a","upstreamHashByConfig":{"upstream-hash-by":"$uri","upstream-hash-by-subset":true}}"#),
            "chashsubset"
        );
        let sticky = r#"{"name":"a","upstreamHashByConfig":{"upstream-hash-by":"$uri"},
                         "sessionAffinityConfig":{"name":"cookie","mode":"MODE","cookieSessionAffinity":{"name":"c"}}}"#;
        assert_eq!(name(&sticky.replace("MODE", "persistent")), "sticky_persistent");
        assert_eq!(name(&sticky.replace("MODE", "balanced")), "sticky_balanced");
        assert_eq!(name(&sticky.replace("MODE", "")), "sticky_balanced");
        let (algo, warning) = Algorithm::select(&backend(r#"{"name":"a","load-balance":"random"}"#));
        assert_eq!(algo, Algorithm::RoundRobin);
        assert!(warning.unwrap().contains("\"random\" is not supported"));
    }

    #[test]
    fn subsets_pad_the_last_set_from_the_start() {
        assert_eq!(subsets(7, 3), [vec![0, 1, 2], vec![3, 4, 5], vec![6, 0, 1]]);
        assert_eq!(subsets(3, 3), [vec![0, 1, 2]]);
        assert_eq!(subsets(2, 3), [vec![0, 1, 0]]);
        // Fewer endpoints than the subset size: Lua's padding appends copies
        // of the (growing) list, so the one endpoint fills the whole set.
        assert_eq!(subsets(1, 3), [vec![0, 0, 0]]);
        assert_eq!(subsets(2, 5), [vec![0, 1, 0, 1, 0]]);
        assert!(subsets(0, 3).is_empty());
    }
}
