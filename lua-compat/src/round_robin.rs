//! Weighted round-robin over one backend's endpoints.
//!
//! - Equal weights (every ingress-nginx backend): plain rotation, O(1).
//! - Up to [`SMOOTH_LIMIT`] weighted endpoints: nginx's own smooth weighted
//!   round-robin (`ngx_http_upstream_get_peer`). Each pick adds every eligible
//!   endpoint's weight to its running score, takes the highest, and subtracts
//!   the total from the winner. That is O(n) per pick.
//! - More weighted endpoints: earliest deadline first. Endpoint `i`'s `k`-th
//!   turn is due at `k / weight_i`; a heap hands out the earliest, O(log n) per
//!   pick. The first `sum(weights)` picks are exactly the turns due by 1, so
//!   the shares are exact per cycle, as with the smooth algorithm.
//!
//! In every mode each endpoint gets exactly its weight over a cycle, and
//! endpoints already tried by the request are skipped.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Largest weighted backend picked with nginx's O(n) smooth algorithm.
pub const SMOOTH_LIMIT: usize = 64;

/// Per-worker balancing state of one backend.
#[derive(Clone, Debug)]
pub struct RoundRobin {
    weights: Box<[i64]>,
    mode: Mode,
}

#[derive(Clone, Debug)]
enum Mode {
    Uniform { cursor: usize },
    Smooth { current: Box<[i64]> },
    Deadline { heap: BinaryHeap<Turn> },
}

/// Endpoint `index`'s `k`-th turn, due at `k / weight`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Turn {
    k: u64,
    weight: u64,
    index: usize,
}

impl Ord for Turn {
    /// Reversed, so the max-heap yields the earliest turn; ties go to the
    /// lower index.
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (
            u128::from(self.k) * u128::from(other.weight),
            u128::from(other.k) * u128::from(self.weight),
        );
        b.cmp(&a).then_with(|| other.index.cmp(&self.index))
    }
}

impl PartialOrd for Turn {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl RoundRobin {
    /// `start` offsets the rotation so that workers do not all begin on the
    /// same endpoint (Lua starts each worker at a random node).
    pub fn new(weights: impl IntoIterator<Item = u32>, start: usize) -> Self {
        let weights: Box<[i64]> = weights.into_iter().map(|w| i64::from(w.max(1))).collect();
        let mode = if weights.windows(2).all(|w| w[0] == w[1]) {
            Mode::Uniform {
                cursor: if weights.is_empty() { 0 } else { start % weights.len() },
            }
        } else if weights.len() <= SMOOTH_LIMIT {
            Mode::Smooth {
                current: vec![0; weights.len()].into(),
            }
        } else {
            let heap = weights
                .iter()
                .enumerate()
                .map(|(index, w)| Turn {
                    k: 1,
                    weight: *w as u64,
                    index,
                })
                .collect();
            Mode::Deadline { heap }
        };
        RoundRobin { weights, mode }
    }

    /// Picks the next endpoint `eligible` takes; `None` if it takes none.
    /// Only eligible endpoints are credited their weight, as nginx's
    /// `ngx_http_upstream_get_peer` skips tried and down peers.
    #[inline]
    pub fn pick_accepted(&mut self, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let n = self.weights.len();
        if n == 0 {
            return None;
        }
        match &mut self.mode {
            Mode::Uniform { cursor } => {
                let i = (0..n).map(|step| (*cursor + step) % n).find(|i| eligible(*i))?;
                *cursor = (i + 1) % n;
                Some(i)
            }
            Mode::Smooth { current } => {
                let mut total = 0;
                let mut best: Option<usize> = None;
                for i in (0..n).filter(|i| eligible(*i)) {
                    current[i] += self.weights[i];
                    total += self.weights[i];
                    if best.is_none_or(|b| current[i] > current[b]) {
                        best = Some(i);
                    }
                }
                let b = best?;
                current[b] -= total;
                Some(b)
            }
            Mode::Deadline { heap } => {
                let mut skipped = Vec::new();
                let mut picked = None;
                while let Some(turn) = heap.pop() {
                    if eligible(turn.index) {
                        heap.push(Turn { k: turn.k + 1, ..turn });
                        picked = Some(turn.index);
                        break;
                    }
                    skipped.push(turn);
                }
                heap.extend(skipped);
                picked
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tried::TriedSet;
    use proptest::prelude::*;

    /// The tried-set forms the tests drive the wheel with (the module goes
    /// through `pick_accepted`, from `selection::select`).
    impl RoundRobin {
        /// Picks the next endpoint for which `usable` holds and that is not in
        /// `tried`; `None` once none is left.
        fn pick_where(&mut self, tried: &TriedSet, usable: impl Fn(usize) -> bool) -> Option<usize> {
            if tried.len() >= self.weights.len() {
                return None;
            }
            self.pick_accepted(|i| !tried.contains(i) && usable(i))
        }

        /// Picks the next endpoint not in `tried`.
        fn pick(&mut self, tried: &TriedSet) -> Option<usize> {
            self.pick_where(tried, |_| true)
        }
    }

    fn picks(rr: &mut RoundRobin, count: usize) -> Vec<usize> {
        (0..count).map(|_| rr.pick(&TriedSet::new()).unwrap()).collect()
    }

    #[test]
    fn equal_weights_rotate() {
        let mut rr = RoundRobin::new([1, 1, 1], 1);
        assert_eq!(picks(&mut rr, 6), [1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn weighted_is_smooth_like_nginx() {
        // nginx's documented example: weights 5,1,1 give a a b a c a a.
        let mut rr = RoundRobin::new([5, 1, 1], 0);
        assert_eq!(picks(&mut rr, 7), [0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn skips_tried_and_unusable_and_ends_when_all_tried() {
        for weights in [vec![1, 1, 1], vec![3, 1, 2], (1..=100).collect()] {
            let n = weights.len();
            let mut rr = RoundRobin::new(weights, 0);
            let mut tried = TriedSet::new();
            let mut order = Vec::new();
            while let Some(i) = rr.pick(&tried) {
                assert!(!tried.contains(i));
                tried.insert(i);
                order.push(i);
            }
            order.sort();
            assert_eq!(order, (0..n).collect::<Vec<_>>());
            let mut rr = RoundRobin::new((1..=n as u32).collect::<Vec<_>>(), 0);
            for _ in 0..3 * n {
                assert_ne!(rr.pick_where(&TriedSet::new(), |i| i != 1), Some(1));
            }
        }
        assert_eq!(RoundRobin::new([], 0).pick(&TriedSet::new()), None);
    }

    proptest! {
        /// Over any whole cycle each endpoint gets exactly its weight, in all
        /// three modes.
        #[test]
        fn exact_shares(weights in proptest::collection::vec(1u32..6, 1..150), start in 0usize..50, cycles in 1usize..3) {
            let mut rr = RoundRobin::new(weights.clone(), start);
            let total: u32 = weights.iter().sum();
            let mut counts = vec![0u32; weights.len()];
            for i in picks(&mut rr, total as usize * cycles) {
                counts[i] += 1;
            }
            let want: Vec<u32> = weights.iter().map(|w| w * cycles as u32).collect();
            prop_assert_eq!(counts, want);
        }
    }
}
