//! `$escaped_request_uri`: the request URI as one URI component, as
//! ingress-nginx makes it with set-misc's `set_escape_uri` for the sign-in
//! redirect of external authentication (`auth-signin`'s `rd=` parameter).
//!
//! Every byte but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`)
//! becomes `%XX` in upper-case hex, so the value can sit inside a query
//! parameter: `&`, `=`, `?`, `#`, `/` and `%` are all escaped.

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The escaped length of `src`, to size one allocation.
pub fn component_len(src: &[u8]) -> usize {
    src.iter().map(|&b| if unreserved(b) { 1 } else { 3 }).sum()
}

/// Writes `src` escaped into `dst`, which holds [`component_len`] bytes;
/// returns the bytes written.
pub fn component_into(src: &[u8], dst: &mut [u8]) -> usize {
    let mut at = 0;
    for &b in src {
        if unreserved(b) {
            dst[at] = b;
            at += 1;
        } else {
            dst[at] = b'%';
            dst[at + 1] = HEX[usize::from(b >> 4)];
            dst[at + 2] = HEX[usize::from(b & 15)];
            at += 3;
        }
    }
    at
}

/// `src` escaped as one URI component.
pub fn component(src: &[u8]) -> Vec<u8> {
    let mut out = vec![0; component_len(src)];
    let n = component_into(src, &mut out);
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reserved_characters_are_escaped() {
        assert_eq!(
            component(b"/a b?x=1&y=%2F#f"),
            b"%2Fa%20b%3Fx%3D1%26y%3D%252F%23f".to_vec()
        );
        assert_eq!(component(b"AZaz09-._~"), b"AZaz09-._~".to_vec());
        assert_eq!(component("é".as_bytes()), b"%C3%A9".to_vec());
        assert_eq!(component(b""), b"".to_vec());
    }

    proptest! {
        #[test]
        fn escaping_round_trips_and_leaves_only_safe_bytes(src in proptest::collection::vec(any::<u8>(), 0..200)) {
            let out = component(&src);
            prop_assert_eq!(out.len(), component_len(&src));
            prop_assert!(out.iter().all(|&b| unreserved(b) || b == b'%'));
            // Decoding gives the input back.
            let mut back = Vec::new();
            let mut i = 0;
            while i < out.len() {
                if out[i] == b'%' {
                    let hex = std::str::from_utf8(&out[i + 1..i + 3]).unwrap();
                    back.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 3;
                } else {
                    back.push(out[i]);
                    i += 1;
                }
            }
            prop_assert_eq!(back, src);
        }
    }
}
