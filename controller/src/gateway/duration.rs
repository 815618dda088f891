//! Gateway API durations (`timeouts.request`, `timeouts.backendRequest`).
//!
//! The spec's format (GEP-2257) is a subset of Go's: one to four
//! `<1-5 digits><unit>` parts, units `h`, `m`, `s` and `ms`, no sign, no
//! fraction, no spaces: `500ms`, `10s`, `1h30m`. `0s` means "no timeout".
//! Anything else is refused, so a value that the CRD would refuse (a
//! manifest, which no CRD checks) never becomes a timeout by accident.

/// The duration in milliseconds, or why `text` is not one.
pub fn parse_ms(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a Gateway API duration (e.g. 500ms, 10s, 1h30m)");
    let mut total: u64 = 0;
    let mut parts = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else {
            return Err(bad());
        };
        rest = &rest[len..];
        total += n * unit_ms;
        parts += 1;
    }
    if parts == 0 || parts > 4 {
        return Err(bad());
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_spec_examples() {
        assert_eq!(parse_ms("500ms"), Ok(500));
        assert_eq!(parse_ms("10s"), Ok(10_000));
        assert_eq!(parse_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_ms("1h2m3s4ms"), Ok(3_723_004));
        assert_eq!(parse_ms("0s"), Ok(0));
        for bad in [
            "",
            "1",
            "1.5s",
            "-1s",
            "1d",
            "1h2m3s4ms5ms",
            "123456s",
            " 1s",
            "1S",
            "ms",
        ] {
            assert!(parse_ms(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,24}") {
            let _ = parse_ms(&s);
        }

        #[test]
        fn parts_add_up(h in 0u64..100, m in 0u64..100, s in 0u64..100, ms in 0u64..1000) {
            prop_assert_eq!(
                parse_ms(&format!("{h}h{m}m{s}s{ms}ms")),
                Ok(h * 3_600_000 + m * 60_000 + s * 1000 + ms)
            );
        }
    }
}
