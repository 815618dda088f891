//! Drawing endpoints without scanning large backends and without allocating:
//! the power-of-two-choices pickers (EWMA, large least_conn) compare two
//! random eligible endpoints.

/// Backends up to this size are scanned; larger ones are sampled.
pub const SCAN_LIMIT: usize = 64;
/// Random draws on a large backend before falling back to a scan (only
/// reached when most endpoints are ineligible).
pub const DRAWS: usize = 16;

/// Up to two distinct endpoints among `0..n` for which `eligible` holds,
/// chosen uniformly: random draws on large backends, reservoir sampling over a
/// scan on small ones. `random(k)` is uniform in `0..k`.
pub fn sample_two(
    n: usize,
    eligible: impl Fn(usize) -> bool,
    mut random: impl FnMut(usize) -> usize,
) -> Option<(usize, Option<usize>)> {
    if n > SCAN_LIMIT {
        let mut first = None;
        for _ in 0..DRAWS {
            let i = random(n);
            if !eligible(i) || first == Some(i) {
                continue;
            }
            match first {
                None => first = Some(i),
                Some(f) => return Some((f, Some(i))),
            }
        }
    }
    let (mut a, mut b, mut seen) = (None, None, 0usize);
    for i in (0..n).filter(|i| eligible(*i)) {
        seen += 1;
        match seen {
            1 => a = Some(i),
            2 => b = Some(i),
            _ => match random(seen) {
                0 => a = Some(i),
                1 => b = Some(i),
                _ => {}
            },
        }
    }
    a.map(|a| (a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_backends_are_sampled_among_eligible_only() {
        for seed in 0..50u64 {
            let mut rng = fastrand_like(seed);
            let (a, b) = sample_two(10, |i| i % 3 == 0, &mut rng).unwrap();
            assert!(a % 3 == 0 && b.unwrap() % 3 == 0 && Some(a) != b);
        }
        assert_eq!(sample_two(5, |i| i == 4, |_| 0), Some((4, None)));
        assert_eq!(sample_two(5, |_| false, |_| 0), None);
    }

    #[test]
    fn large_backends_are_drawn_not_scanned() {
        let mut draws = 0;
        let picked = sample_two(
            10_000,
            |_| true,
            |k| {
                draws += 1;
                if draws == 1 {
                    17
                } else {
                    k - 1
                }
            },
        );
        assert_eq!(picked, Some((17, Some(9_999))));
        assert_eq!(draws, 2);
    }

    fn fastrand_like(seed: u64) -> impl FnMut(usize) -> usize {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        move |k| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as usize) % k
        }
    }
}
