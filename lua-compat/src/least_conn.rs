//! Least connections over endpoints with weights, like nginx's `least_conn`:
//! the fewest active connections relative to weight wins. Up to
//! [`EXACT_LIMIT`] endpoints every candidate is compared; above that, two
//! random candidates are (power of two choices), so a pick never scans
//! thousands of endpoints while still steering away from loaded ones.

/// Largest backend compared exhaustively.
pub const EXACT_LIMIT: usize = crate::sample::SCAN_LIMIT;

/// Picks among endpoints `0..n` for which `eligible` holds (not tried, not
/// ejected). `conns(i)` and `weight(i)` describe endpoint `i`; `random(k)` is
/// uniform in `0..k` and rotates the start so that ties spread out.
pub fn pick(
    n: usize,
    eligible: impl Fn(usize) -> bool,
    conns: impl Fn(usize) -> u64,
    weight: impl Fn(usize) -> u64,
    mut random: impl FnMut(usize) -> usize,
) -> Option<usize> {
    let better = |a: usize, b: usize| conns(a) * weight(b).max(1) < conns(b) * weight(a).max(1);
    if n <= EXACT_LIMIT {
        let start = if n == 0 { 0 } else { random(n) };
        let mut best: Option<usize> = None;
        for i in (0..n).map(|k| (start + k) % n).filter(|i| eligible(*i)) {
            if best.is_none_or(|b| better(i, b)) {
                best = Some(i);
            }
        }
        return best;
    }
    match crate::sample::sample_two(n, eligible, random)? {
        (a, None) => Some(a),
        (a, Some(b)) => Some(if better(b, a) { b } else { a }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewest_connections_per_weight_win() {
        let conns = [5u64, 1, 3];
        assert_eq!(pick(3, |_| true, |i| conns[i], |_| 1, |_| 0), Some(1));
        assert_eq!(pick(3, |i| i != 1, |i| conns[i], |_| 1, |_| 0), Some(2));
        // Weight 10 makes 5 connections cheap.
        let weights = [10u64, 1, 1];
        assert_eq!(pick(3, |_| true, |i| conns[i], |i| weights[i], |_| 0), Some(0));
        assert_eq!(pick(0, |_| true, |_| 0, |_| 1, |_| 0), None);
    }

    #[test]
    fn large_backends_compare_two() {
        let mut calls = 0;
        let picked = pick(
            1000,
            |_| true,
            |i| if i == 7 { 0 } else { 10 },
            |_| 1,
            |_| {
                calls += 1;
                if calls == 1 {
                    3
                } else {
                    7
                }
            },
        );
        assert_eq!(picked, Some(7));
        assert_eq!(calls, 2);
    }
}
