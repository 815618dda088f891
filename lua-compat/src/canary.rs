//! Canary routing: `route_to_alternative_balancer` of ingress-nginx's
//! `balancer.lua`, check for check.
//!
//! The order is: affinity to the primary wins, then affinity to the canary,
//! then the header (exact value, else pattern, else `always`/`never`), then
//! the cookie (`always`/`never`), then the weight. `never` stops the canary
//! at once; any other non-matching value falls through to the next rule.

use serde::{Deserialize, Serialize};

use crate::wire::TrafficShapingPolicy;

/// The rules of one canary backend.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficPolicy {
    pub weight: i64,
    pub weight_total: i64,
    /// Request header name (`-` and `_` are the same, as nginx variables).
    pub header: String,
    pub header_value: String,
    pub header_pattern: String,
    pub cookie: String,
}

impl From<&TrafficShapingPolicy> for TrafficPolicy {
    fn from(p: &TrafficShapingPolicy) -> Self {
        TrafficPolicy {
            weight: p.weight,
            weight_total: p.weight_total,
            header: p.header.clone(),
            header_value: p.header_value.clone(),
            header_pattern: p.header_pattern.clone(),
            cookie: p.cookie.clone(),
        }
    }
}

/// Compiled size limit of a `headerPattern`: the module compiles it in every
/// worker, so a pathological pattern must fail at write time instead.
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// Compiles a canary `headerPattern` as the module matches it.
pub fn compile_pattern(pattern: &str) -> Result<regex::bytes::Regex, regex::Error> {
    regex::bytes::RegexBuilder::new(pattern)
        .size_limit(PATTERN_SIZE_LIMIT)
        .dfa_size_limit(PATTERN_SIZE_LIMIT)
        .build()
}

/// What the header and cookie rules (steps 3 and 4) concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Canary,
    Primary,
    /// No rule applied; the weight decides.
    Undecided,
}

impl TrafficPolicy {
    /// The nginx variable holding the policy's header: `http_x_canary`.
    pub fn header_variable(&self) -> Option<String> {
        (!self.header.is_empty()).then(|| crate::routes::header::request_header_variable(&self.header))
    }

    /// The nginx variable holding the policy's cookie: `cookie_canary`.
    pub fn cookie_variable(&self) -> Option<String> {
        (!self.cookie.is_empty()).then(|| format!("cookie_{}", self.cookie))
    }

    /// Steps 3 and 4. `matches(pattern, value)` runs the regex; `Err` (a bad
    /// pattern) keeps the request on the primary, as Lua does.
    pub fn header_and_cookie(
        &self,
        header: Option<&[u8]>,
        cookie: Option<&[u8]>,
        matches: impl Fn(&str, &[u8]) -> Result<bool, ()>,
    ) -> Verdict {
        if let Some(value) = header {
            if !self.header_value.is_empty() {
                if value == self.header_value.as_bytes() {
                    return Verdict::Canary;
                }
            } else if !self.header_pattern.is_empty() {
                match matches(&self.header_pattern, value) {
                    Ok(true) => return Verdict::Canary,
                    Ok(false) => {}
                    Err(()) => return Verdict::Primary,
                }
            } else if value == b"always" {
                return Verdict::Canary;
            } else if value == b"never" {
                return Verdict::Primary;
            }
        }
        match cookie {
            Some(b"always") => Verdict::Canary,
            Some(b"never") => Verdict::Primary,
            _ => Verdict::Undecided,
        }
    }

    /// Step 5: canary iff `random(total) <= weight`, where `random(n)` is
    /// uniform in `1..=n` and `total` is `weightTotal` when above 100, else 100.
    pub fn by_weight(&self, random: impl FnOnce(u32) -> u32) -> bool {
        // A draw is at least 1: weight 0 never wins, so skip the draw.
        if self.weight <= 0 {
            return false;
        }
        let total = if self.weight_total > 100 {
            self.weight_total
        } else {
            100
        };
        i64::from(random(total.min(u32::MAX as i64) as u32)) <= self.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_regex(_: &str, _: &[u8]) -> Result<bool, ()> {
        panic!("no pattern expected")
    }

    #[test]
    fn header_value_then_pattern_then_always_never() {
        let p = TrafficPolicy {
            header: "X-Canary".into(),
            header_value: "yes".into(),
            ..Default::default()
        };
        assert_eq!(p.header_variable().as_deref(), Some("http_x_canary"));
        assert_eq!(p.header_and_cookie(Some(b"yes"), None, no_regex), Verdict::Canary);
        // With a value set, "always" is just a non-matching value.
        assert_eq!(p.header_and_cookie(Some(b"always"), None, no_regex), Verdict::Undecided);
        let p = TrafficPolicy {
            header: "X-Canary".into(),
            header_pattern: "^b".into(),
            ..Default::default()
        };
        assert_eq!(
            p.header_and_cookie(Some(b"beta"), None, |_, v| Ok(v.starts_with(b"b"))),
            Verdict::Canary
        );
        assert_eq!(
            p.header_and_cookie(Some(b"alpha"), None, |_, _| Ok(false)),
            Verdict::Undecided
        );
        assert_eq!(
            p.header_and_cookie(Some(b"x"), Some(b"always"), |_, _| Err(())),
            Verdict::Primary
        );
        let p = TrafficPolicy {
            header: "X-Canary".into(),
            cookie: "c".into(),
            ..Default::default()
        };
        assert_eq!(
            p.header_and_cookie(Some(b"always"), Some(b"never"), no_regex),
            Verdict::Canary
        );
        assert_eq!(
            p.header_and_cookie(Some(b"never"), Some(b"always"), no_regex),
            Verdict::Primary
        );
        assert_eq!(
            p.header_and_cookie(Some(b"other"), Some(b"always"), no_regex),
            Verdict::Canary
        );
        assert_eq!(p.header_and_cookie(None, Some(b"never"), no_regex), Verdict::Primary);
        assert_eq!(p.header_and_cookie(None, None, no_regex), Verdict::Undecided);
    }

    #[test]
    fn weight_over_default_or_custom_total() {
        let p = TrafficPolicy {
            weight: 10,
            ..Default::default()
        };
        assert!(p.by_weight(|n| {
            assert_eq!(n, 100);
            10
        }));
        assert!(!p.by_weight(|_| 11));
        let p = TrafficPolicy {
            weight: 1,
            weight_total: 1000,
            ..Default::default()
        };
        assert!(!p.by_weight(|n| {
            assert_eq!(n, 1000);
            2
        }));
    }
}
