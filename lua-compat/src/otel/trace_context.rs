//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` and `tracestate` headers a client may send and the module
//! sends upstream, parsed and written without allocation on the request
//! path.
//!
//! A header that does not parse is ignored as a whole, as the
//! recommendation asks: the request starts a new trace, and its
//! `tracestate` is dropped with it (a vendor's state belongs to the trace
//! it came with).

/// 16 bytes; all zero is invalid.
pub type TraceId = [u8; 16];
/// 8 bytes; all zero is invalid.
pub type SpanId = [u8; 8];

/// The `sampled` bit of the trace flags.
pub const FLAG_SAMPLED: u8 = 0x01;

/// Length of a version-00 `traceparent` value.
pub const TRACEPARENT_LEN: usize = 55;

/// The most `tracestate` this module forwards: the recommendation's 512
/// characters, beyond which a vendor may truncate; here a longer one is
/// dropped rather than cut, so no member is half-forwarded.
pub const MAX_TRACESTATE: usize = 512;
/// List members in a `tracestate`, at most (the recommendation's limit).
pub const MAX_TRACESTATE_MEMBERS: usize = 32;

/// A parsed `traceparent`: the caller's trace, its span (this request's
/// parent) and its flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub flags: u8,
}

impl TraceParent {
    /// Whether the caller sampled its span.
    pub fn sampled(&self) -> bool {
        self.flags & FLAG_SAMPLED != 0
    }

    /// Parses a `traceparent` value. Version 00 must be exactly 55
    /// characters; a later version may append fields after a `-`, which
    /// are ignored (the recommendation's forward compatibility). Hex must
    /// be lower case; version `ff` and all-zero ids are invalid.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        if value.len() < TRACEPARENT_LEN {
            return None;
        }
        let version = hex_byte(&value[0..2])?;
        if version == 0xff {
            return None;
        }
        if version == 0 && value.len() != TRACEPARENT_LEN {
            return None;
        }
        if value.len() > TRACEPARENT_LEN && value[TRACEPARENT_LEN] != b'-' {
            return None;
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        hex_into(&value[3..35], &mut trace_id)?;
        let mut span_id = [0u8; 8];
        hex_into(&value[36..52], &mut span_id)?;
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The version-00 header value. Only the `sampled` flag is written:
    /// flags this version does not define must not be passed on.
    pub fn format(&self) -> [u8; TRACEPARENT_LEN] {
        let mut out = [0u8; TRACEPARENT_LEN];
        out[0..3].copy_from_slice(b"00-");
        hex_write(&self.trace_id, &mut out[3..35]);
        out[35] = b'-';
        hex_write(&self.span_id, &mut out[36..52]);
        out[52] = b'-';
        hex_write(&[self.flags & FLAG_SAMPLED], &mut out[53..55]);
        out
    }
}

/// `bytes` as lower-case hex into `out` (twice as long).
pub fn hex_write(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 0x0f)];
    }
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    Some(hex_digit(two[0])? << 4 | hex_digit(two[1])?)
}

fn hex_into(text: &[u8], out: &mut [u8]) -> Option<()> {
    for (i, o) in out.iter_mut().enumerate() {
        *o = hex_byte(&text[2 * i..2 * i + 2])?;
    }
    Some(())
}

/// Whether `value` is a `tracestate` worth forwarding: at most
/// [`MAX_TRACESTATE`] bytes and [`MAX_TRACESTATE_MEMBERS`] members, each
/// `key=value` with the recommendation's key and value characters, no key
/// twice (empty members between commas are allowed). Anything else is
/// dropped whole.
pub fn tracestate_is_valid(value: &[u8]) -> bool {
    if value.len() > MAX_TRACESTATE {
        return false;
    }
    let mut keys: [&[u8]; MAX_TRACESTATE_MEMBERS] = [&[]; MAX_TRACESTATE_MEMBERS];
    let mut members = 0;
    for member in value.split(|&c| c == b',') {
        let member = trim_ows(member);
        if member.is_empty() {
            continue;
        }
        if members == MAX_TRACESTATE_MEMBERS {
            return false;
        }
        let Some(eq) = member.iter().position(|&c| c == b'=') else {
            return false;
        };
        let key = &member[..eq];
        if !key_is_valid(key) || !value_is_valid(&member[eq + 1..]) || keys[..members].contains(&key) {
            return false;
        }
        keys[members] = key;
        members += 1;
    }
    true
}

fn trim_ows(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&c| c != b' ' && c != b'\t').unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(start, |e| e + 1);
    &s[start..end]
}

/// `simple-key` or `tenant-id@system-id`.
fn key_is_valid(key: &[u8]) -> bool {
    fn part(p: &[u8], max: usize, first_digit_ok: bool) -> bool {
        let ok_char = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-' | b'*' | b'/');
        !p.is_empty()
            && p.len() <= max
            && (p[0].is_ascii_lowercase() || (first_digit_ok && p[0].is_ascii_digit()))
            && p.iter().all(|&c| ok_char(c))
    }
    match key.iter().position(|&c| c == b'@') {
        // A simple key starts with a letter; a tenant id may start with
        // a digit.
        None => part(key, 256, false),
        Some(at) => part(&key[..at], 241, true) && part(&key[at + 1..], 14, false),
    }
}

/// 1 to 256 printable characters but `,` and `=`, not ending in a space.
fn value_is_valid(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= 256
        && v.iter().all(|&c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
        && v.last() != Some(&b' ')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &[u8] = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn the_recommendations_example_parses_and_formats_back() {
        let p = TraceParent::parse(EXAMPLE).unwrap();
        assert_eq!(p.trace_id[0], 0x0a);
        assert_eq!(p.span_id[7], 0x31);
        assert!(p.sampled());
        assert_eq!(&p.format()[..], EXAMPLE);
    }

    #[test]
    fn invalid_headers_are_refused() {
        for bad in [
            &b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0"[..],
            b"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            b"00-00000000000000000000000000000000-b7ad6b7169203331-01",
            b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
            b"00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            b"0g-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            b"",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_later_version_may_carry_more_fields() {
        let v = b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03-whatever";
        let p = TraceParent::parse(v).unwrap();
        assert!(p.sampled());
        // Flags this module does not know are not passed on.
        assert!(p.format().ends_with(b"-01"));
        assert_eq!(
            TraceParent::parse(b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03x"),
            None
        );
    }

    #[test]
    fn tracestate_members_are_checked() {
        assert!(tracestate_is_valid(b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"));
        assert!(tracestate_is_valid(b"fw529a3039@dt=ZmZmZmZm, ,vendor-1=x"));
        assert!(tracestate_is_valid(b""));
        assert!(!tracestate_is_valid(b"Upper=1"));
        assert!(!tracestate_is_valid(b"novalue"));
        assert!(!tracestate_is_valid(b"k=a=b"));
        assert!(
            tracestate_is_valid(b"k=v , j=w "),
            "list whitespace is optional whitespace"
        );
        assert!(!tracestate_is_valid(b"k=a\x7f"));
        // A key only once; a simple key starts with a letter, a tenant id
        // may start with a digit.
        assert!(!tracestate_is_valid(b"k=1,j=2,k=3"));
        assert!(!tracestate_is_valid(b"1k=v"));
        assert!(tracestate_is_valid(b"1k@sys=v"));
        assert!(!tracestate_is_valid(b"k=\x01"));
        let many = (0..33).map(|i| format!("k{i}=v")).collect::<Vec<_>>().join(",");
        assert!(!tracestate_is_valid(many.as_bytes()));
        assert!(!tracestate_is_valid(format!("k={}", "v".repeat(600)).as_bytes()));
    }

    proptest! {
        #[test]
        fn formatting_then_parsing_is_the_identity(t in any::<[u8; 16]>(), s in any::<[u8; 8]>(), sampled: bool) {
            prop_assume!(t != [0; 16] && s != [0; 8]);
            let p = TraceParent { trace_id: t, span_id: s, flags: u8::from(sampled) };
            prop_assert_eq!(TraceParent::parse(&p.format()), Some(p));
        }

        #[test]
        fn any_bytes_parse_without_panicking(v in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Some(p) = TraceParent::parse(&v) {
                // What parses is what the version-00 text says.
                prop_assert_eq!(&p.format()[3..52], &v[3..52]);
            }
            let _ = tracestate_is_valid(&v);
        }
    }
}
