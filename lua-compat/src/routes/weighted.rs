//! The backend of a rule, chosen by weight per request.

use super::WeightedBackend;

/// The index of the backend `random` (uniform in `0..total`) falls on,
/// where `total` is the sum of the weights. `None` when every weight is 0:
/// the spec answers such a rule with 500. A zero-weight backend is never
/// chosen.
pub fn pick(backends: &[WeightedBackend], total: u64, random: u64) -> Option<usize> {
    if total == 0 {
        return None;
    }
    let mut point = random % total;
    for (i, b) in backends.iter().enumerate() {
        let w = u64::from(b.weight);
        if point < w {
            return Some(i);
        }
        point -= w;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn backends(weights: &[u32]) -> Vec<WeightedBackend> {
        weights
            .iter()
            .enumerate()
            .map(|(i, w)| WeightedBackend {
                backend: Some(format!("b{i}")),
                weight: *w,
                request_headers: None,
                rewrite: None,
                protocol: Default::default(),
            })
            .collect()
    }

    #[test]
    fn shares_follow_weights() {
        let b = backends(&[1, 0, 3]);
        let mut counts = [0; 3];
        for r in 0..4000u64 {
            counts[pick(&b, 4, r).unwrap()] += 1;
        }
        assert_eq!(counts, [1000, 0, 3000]);
        assert!(pick(&backends(&[0, 0]), 0, 7).is_none());
    }

    proptest! {
        #[test]
        fn every_point_lands_on_a_weighted_backend(weights in proptest::collection::vec(0u32..1_000_000, 1..16), r: u64) {
            let b = backends(&weights);
            let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
            match pick(&b, total, r) {
                None => prop_assert_eq!(total, 0),
                Some(chosen) => prop_assert!(b[chosen].weight > 0),
            }
        }
    }
}
