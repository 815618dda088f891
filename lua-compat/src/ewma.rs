//! Peak-EWMA scoring with power-of-two choices, as ingress-nginx's
//! `balancer/ewma.lua`: an endpoint's score is an exponentially weighted
//! moving average of connect plus response time that decays toward zero with
//! a 10 s time constant, and each pick compares two random untried endpoints.

/// `DECAY_TIME`, seconds.
pub const DECAY_SECONDS: f64 = 10.0;

/// The score decayed to `now` and blended with a new round trip `rtt` (both
/// in seconds). Scoring for a pick uses `rtt = 0`.
pub fn decay(ewma: f64, last_touched: f64, rtt: f64, now: f64) -> f64 {
    let td = (now - last_touched).max(0.0);
    let weight = (-td / DECAY_SECONDS).exp();
    ewma * weight + rtt * (1.0 - weight)
}

/// Picks among endpoints `0..n` for which `eligible` holds (the untried
/// ones): two random ones compared by score, the lower wins; a single
/// eligible endpoint is taken as is. `random(k)` is uniform in `0..k`.
pub fn pick_two(
    n: usize,
    eligible: impl Fn(usize) -> bool,
    score: impl Fn(usize) -> f64,
    random: impl FnMut(usize) -> usize,
) -> Option<(usize, f64)> {
    match crate::sample::sample_two(n, eligible, random)? {
        (a, None) => Some((a, score(a))),
        (a, Some(b)) => {
            let (sa, sb) = (score(a), score(b));
            Some(if sb < sa { (b, sb) } else { (a, sa) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decays_like_lua() {
        assert_eq!(decay(1.0, 5.0, 0.0, 5.0), 1.0);
        let after_one_tau = decay(1.0, 0.0, 0.0, 10.0);
        assert!((after_one_tau - (-1.0f64).exp()).abs() < 1e-12);
        // A fresh endpoint (last touched long ago) takes the new rtt.
        assert!((decay(0.0, 0.0, 0.25, 1e9) - 0.25).abs() < 1e-12);
        // Clock skew never amplifies.
        assert_eq!(decay(2.0, 10.0, 0.0, 5.0), 2.0);
    }

    #[test]
    fn lower_score_of_two_wins() {
        let scores = [0.5, 0.1, 0.9];
        // Two eligible endpoints: both compared, whatever the draw.
        assert_eq!(pick_two(3, |i| i != 2, |i| scores[i], |_| 2), Some((1, 0.1)));
        assert_eq!(pick_two(3, |i| i == 2, |i| scores[i], |_| 0), Some((2, 0.9)));
        assert_eq!(pick_two(3, |_| false, |i| scores[i], |_| 0), None);
    }
}
