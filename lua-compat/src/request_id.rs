//! Request ids as ingress-nginx's `$req_id` gives them: the client's
//! `X-Request-ID` when it sends a non-empty one, else 32 lowercase hex
//! characters (128 random bits), the format of nginx's `$request_id`.
//!
//! nginx's `$request_id` asks OpenSSL's `RAND_bytes` for every request,
//! about 6,700 instructions: a third of a whole proxied request. A
//! [`Generator`] is a ChaCha20 stream seeded once from the operating system,
//! one per worker process, so an id costs a fraction of a 64-byte block.
//! ChaCha20 is a cryptographic generator: ids stay unpredictable to clients,
//! which matters when they end up in logs used to correlate incidents.

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

/// Length of a generated id: 128 bits as lowercase hex.
pub const ID_LEN: usize = 32;

/// A per-process source of request ids. It must be created after `fork()`
/// (in nginx's `init_process`), or two workers would share one stream.
pub struct Generator(ChaCha20Rng);

impl Generator {
    /// A generator seeded from the operating system's random source.
    pub fn from_os() -> Result<Generator, String> {
        ChaCha20Rng::try_from_os_rng()
            .map(Generator)
            .map_err(|e| format!("no seed from the operating system: {e}"))
    }

    /// A generator with a fixed seed, for tests.
    pub fn from_seed(seed: [u8; 32]) -> Generator {
        Generator(ChaCha20Rng::from_seed(seed))
    }

    /// A fresh id: 128 random bits as 32 lowercase hex characters.
    pub fn next_id(&mut self) -> [u8; ID_LEN] {
        let mut bits = [0u8; ID_LEN / 2];
        self.0.fill_bytes(&mut bits);
        hex(&bits)
    }
}

/// `bytes` as lowercase hex, two characters per byte.
fn hex(bytes: &[u8; ID_LEN / 2]) -> [u8; ID_LEN] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; ID_LEN];
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 0x0f)];
    }
    out
}

/// The header a client's id comes in, lower case (as nginx keeps
/// `lowcase_key`).
pub const HEADER: &[u8] = b"x-request-id";

/// The header's name as the module adds it to a request.
pub const HEADER_NAME: &[u8] = b"X-Request-ID";

/// `ngx_hash_key(HEADER)`: the hash nginx's parser gives a request header
/// with this name, which the proxy's `proxy_set_header` table is keyed by.
pub const HEADER_HASH: u64 = ngx_hash_key(HEADER);

/// nginx's `ngx_hash_key`: `hash * 31 + byte` from 0, wrapping, over the
/// lower-cased name (what `ngx_http_parse_header_line` computes).
pub const fn ngx_hash_key(key: &[u8]) -> u64 {
    let (mut hash, mut i) = (0u64, 0);
    while i < key.len() {
        hash = hash.wrapping_mul(31).wrapping_add(key[i] as u64);
        i += 1;
    }
    hash
}

/// The client's id to pass on, as ingress-nginx's `map $http_x_request_id`
/// decides: the first `X-Request-ID` header's value, when it is not empty.
pub fn client_id(first_header: Option<&[u8]>) -> Option<&[u8]> {
    first_header.filter(|value| !value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_header_hash_is_nginx_s() {
        assert_eq!(ngx_hash_key(b""), 0);
        assert_eq!(ngx_hash_key(b"ab"), 97 * 31 + 98);
        // Computed independently: h = (h * 31 + c) mod 2^64 over the name.
        assert_eq!(HEADER_HASH, 3_089_003_975_168_390_542);
        assert_eq!(HEADER_NAME.to_ascii_lowercase(), HEADER);
    }

    #[test]
    fn ids_are_32_lowercase_hex_characters() {
        let mut g = Generator::from_os().unwrap();
        for _ in 0..1000 {
            let id = g.next_id();
            assert!(
                id.iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c)),
                "{id:?}"
            );
        }
    }

    #[test]
    fn ids_do_not_repeat() {
        let mut g = Generator::from_os().unwrap();
        let ids: std::collections::HashSet<[u8; ID_LEN]> = (0..10_000).map(|_| g.next_id()).collect();
        assert_eq!(ids.len(), 10_000);
    }

    #[test]
    fn two_generators_from_the_os_differ() {
        // Two workers seeded separately must not produce the same ids.
        let (mut a, mut b) = (Generator::from_os().unwrap(), Generator::from_os().unwrap());
        assert_ne!(a.next_id(), b.next_id());
    }

    #[test]
    fn a_seed_gives_the_chacha20_stream() {
        // The RFC 8439 keystream for the all-zero key and nonce, block 0,
        // starts 76 b8 e0 ad a0 f1 3d 90.
        let mut g = Generator::from_seed([0; 32]);
        assert_eq!(&g.next_id()[..16], b"76b8e0ada0f13d90");
    }

    #[test]
    fn the_client_id_is_passed_on_when_not_empty() {
        assert_eq!(client_id(Some(b"abc")), Some(&b"abc"[..]));
        assert_eq!(client_id(Some(b"")), None);
        assert_eq!(client_id(None), None);
        assert_eq!(HEADER, b"X-Request-ID".to_ascii_lowercase());
    }

    proptest! {
        #[test]
        fn hex_round_trips(bytes: [u8; 16]) {
            let text = hex(&bytes);
            let back: Vec<u8> = (0..16)
                .map(|i| u8::from_str_radix(std::str::from_utf8(&text[2 * i..2 * i + 2]).unwrap(), 16).unwrap())
                .collect();
            prop_assert_eq!(back, bytes.to_vec());
        }
    }
}
