//! Least connections over endpoints with weights, like nginx's `least_conn`:
//! the fewest active connections relative to weight wins. Up to
//! [`EXACT_LIMIT`] endpoints every candidate is compared; above that, two
//! random candidates are (power of two choices), so a pick never scans
//! thousands of endpoints while still steering away from loaded ones.

/// Largest backend compared exhaustively.
pub const EXACT_LIMIT: usize = 64;

/// Picks among `candidates` (endpoint indexes without the tried or ejected
/// ones). `conns(i)` and `weight(i)` describe endpoint `i`; `random(n)` is
/// uniform in `0..n` and rotates the start so ties spread out.
pub fn pick(
    candidates: &[usize],
    conns: impl Fn(usize) -> u64,
    weight: impl Fn(usize) -> u64,
    mut random: impl FnMut(usize) -> usize,
) -> Option<usize> {
    let better = |a: usize, b: usize| conns(a) * weight(b).max(1) < conns(b) * weight(a).max(1);
    match candidates.len() {
        0 => None,
        1 => Some(candidates[0]),
        n if n <= EXACT_LIMIT => {
            let start = random(n);
            let mut best = candidates[start];
            for k in 1..n {
                let c = candidates[(start + k) % n];
                if better(c, best) {
                    best = c;
                }
            }
            Some(best)
        }
        n => {
            let a = random(n);
            let mut b = random(n - 1);
            if b >= a {
                b += 1;
            }
            let (a, b) = (candidates[a], candidates[b]);
            Some(if better(b, a) { b } else { a })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewest_connections_per_weight_win() {
        let conns = [5u64, 1, 3];
        assert_eq!(pick(&[0, 1, 2], |i| conns[i], |_| 1, |_| 0), Some(1));
        // Weight 10 makes 5 connections cheap.
        let weights = [10u64, 1, 1];
        assert_eq!(pick(&[0, 1, 2], |i| conns[i], |i| weights[i], |_| 0), Some(0));
        assert_eq!(pick(&[], |_| 0, |_| 1, |_| 0), None);
    }

    #[test]
    fn large_backends_compare_two() {
        let all: Vec<usize> = (0..1000).collect();
        let mut calls = 0;
        let picked = pick(
            &all,
            |i| if i == 7 { 0 } else { 10 },
            |_| 1,
            |n| {
                calls += 1;
                if n == 1000 {
                    7
                } else {
                    3
                }
            },
        );
        assert_eq!(picked, Some(7));
        assert_eq!(calls, 2);
    }
}
