//! The ConfigMap keys of the `stream {}` servers that `tcp-services` and
//! `udp-services` render, with ingress-nginx's names and defaults.

use serde::Serialize;

use super::values::{number_in, parse_bool, Invalid, Seconds};

/// Most retries a connection may make (as `proxy-next-upstream-tries`).
const MAX_TRIES: u32 = 100;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct StreamSettings {
    /// `proxy-stream-timeout`: idle time between two reads or writes on
    /// either side before the session is closed (`proxy_timeout`).
    pub timeout: Seconds,
    /// `proxy-stream-next-upstream`: a failed connect moves on to another
    /// endpoint.
    pub next_upstream: bool,
    /// `proxy-stream-next-upstream-timeout`: how long moving on may take in
    /// all (0: unbounded).
    pub next_upstream_timeout: Seconds,
    /// `proxy-stream-next-upstream-tries` (0: every endpoint once).
    pub next_upstream_tries: u32,
    /// `proxy-stream-responses`: UDP datagrams expected back per client
    /// datagram before the session ends (DNS: 1).
    pub responses: u32,
}

impl Default for StreamSettings {
    /// ingress-nginx's defaults.
    fn default() -> Self {
        StreamSettings {
            timeout: Seconds(600),
            next_upstream: true,
            next_upstream_timeout: Seconds(600),
            next_upstream_tries: 3,
            responses: 1,
        }
    }
}

impl StreamSettings {
    /// Applies one ConfigMap key; `None` if the key is not one of these.
    pub fn apply(&mut self, key: &str, v: &str) -> Option<Result<(), Invalid>> {
        let r = match key {
            "proxy-stream-timeout" => Seconds::parse(v).map(|t| self.timeout = t),
            "proxy-stream-next-upstream" => parse_bool(v).map(|b| self.next_upstream = b),
            "proxy-stream-next-upstream-timeout" => Seconds::parse(v).map(|t| self.next_upstream_timeout = t),
            "proxy-stream-next-upstream-tries" => {
                number_in(v, 0..=MAX_TRIES, "proxy-stream-next-upstream-tries").map(|n| self.next_upstream_tries = n)
            }
            "proxy-stream-responses" => {
                number_in(v, 0..=u32::MAX, "proxy-stream-responses").map(|n| self.responses = n)
            }
            _ => return None,
        };
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_apply_and_bad_values_are_refused() {
        let mut s = StreamSettings::default();
        assert!(s.apply("proxy-stream-timeout", "30s").unwrap().is_ok());
        assert_eq!(s.timeout, Seconds(30));
        assert!(s.apply("proxy-stream-next-upstream", "false").unwrap().is_ok());
        assert!(!s.next_upstream);
        assert!(s.apply("proxy-stream-next-upstream-tries", "101").unwrap().is_err());
        assert!(s.apply("proxy-stream-responses", "-1").unwrap().is_err());
        assert!(s.apply("proxy-stream-timeout", "10m; evil").unwrap().is_err());
        assert_eq!(s.timeout, Seconds(30), "a refused value changes nothing");
        assert!(s.apply("proxy-connect-timeout", "5").is_none());
    }
}
