//! Smooth weighted round-robin, nginx's own algorithm
//! (`ngx_http_upstream_get_peer`), over one backend's endpoints.
//!
//! Each pick adds every eligible endpoint's weight to its running score and
//! takes the highest, then subtracts the total from the winner. Over any window
//! of `sum(weights)` picks each endpoint is chosen exactly `weight` times, and
//! picks are spread out rather than bunched. With equal weights (every
//! ingress-nginx backend) this is plain rotation, which runs in O(1).

use crate::tried::TriedSet;

/// Per-worker balancing state of one backend.
#[derive(Clone, Debug)]
pub struct RoundRobin {
    weights: Box<[i64]>,
    current: Box<[i64]>,
    uniform: bool,
    cursor: usize,
}

impl RoundRobin {
    /// `start` offsets the rotation so that workers do not all begin on the
    /// same endpoint (Lua starts each worker at a random node).
    pub fn new(weights: impl IntoIterator<Item = u32>, start: usize) -> Self {
        let weights: Box<[i64]> = weights.into_iter().map(|w| i64::from(w.max(1))).collect();
        let uniform = weights.windows(2).all(|w| w[0] == w[1]);
        let cursor = if weights.is_empty() {
            0
        } else {
            start % weights.len()
        };
        RoundRobin {
            current: vec![0; weights.len()].into(),
            weights,
            uniform,
            cursor,
        }
    }

    pub fn len(&self) -> usize {
        self.weights.len()
    }

    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }

    /// Picks the next endpoint not in `tried`; `None` once all were tried.
    pub fn pick(&mut self, tried: &TriedSet) -> Option<usize> {
        let n = self.weights.len();
        if n == 0 || tried.len() >= n {
            return None;
        }
        if self.uniform {
            for step in 0..n {
                let i = (self.cursor + step) % n;
                if !tried.contains(i) {
                    self.cursor = (i + 1) % n;
                    return Some(i);
                }
            }
            return None;
        }
        let mut total = 0;
        let mut best: Option<usize> = None;
        for i in 0..n {
            if tried.contains(i) {
                continue;
            }
            self.current[i] += self.weights[i];
            total += self.weights[i];
            if best.is_none_or(|b| self.current[i] > self.current[b]) {
                best = Some(i);
            }
        }
        let b = best?;
        self.current[b] -= total;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn picks(rr: &mut RoundRobin, count: usize) -> Vec<usize> {
        (0..count)
            .map(|_| rr.pick(&TriedSet::new()).unwrap())
            .collect()
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
    fn skips_tried_and_ends_when_all_tried() {
        for weights in [vec![1, 1, 1], vec![3, 1, 2]] {
            let mut rr = RoundRobin::new(weights, 0);
            let mut tried = TriedSet::new();
            let mut order = Vec::new();
            while let Some(i) = rr.pick(&tried) {
                assert!(!tried.contains(i));
                tried.insert(i);
                order.push(i);
            }
            order.sort();
            assert_eq!(order, [0, 1, 2]);
        }
        assert_eq!(RoundRobin::new([], 0).pick(&TriedSet::new()), None);
    }

    proptest! {
        /// Over any whole cycle each endpoint gets exactly its weight.
        #[test]
        fn exact_shares(weights in proptest::collection::vec(1u32..6, 1..12), start in 0usize..50, cycles in 1usize..4) {
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
