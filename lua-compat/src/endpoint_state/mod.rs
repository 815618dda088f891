//! State every worker shares about each endpoint: passive health (failures
//! and when they happened), active connections (least_conn) and the EWMA
//! score. It lives in the zone, so all workers see the same numbers and
//! they survive `nginx -s reload`.
//!
//! - [`table`]: where the slots live and how an address finds its slot;
//!   it grows with what the zone holds, so every endpoint is tracked
//!   while the zone has room;
//! - [`share`]: who keeps a slot when the zone has no more room (each
//!   backend's fair share).
//!
//! Slots are keyed by `address:port`, as Lua keys its shared dicts, so an
//! endpoint listed by two backends shares one slot. A slot never moves:
//! workers keep a `&'static` reference to it with its incarnation, and a
//! slot freed or reused for another endpoint has a new incarnation, so a
//! stale reference reads as "no state".
//!
//! The per-request methods are `#[inline]`: the module calls them from
//! another crate on every pick, and without LTO they would not inline.

pub mod share;
pub mod table;

pub use table::{EndpointTable, TableWriter, ZoneMemory};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// One endpoint's shared state: 72 bytes.
///
/// `incarnation` is odd while the slot holds an endpoint and even while it
/// is free or being filled, and only the writer changes it (see
/// [`table`]): a reader that saw the same odd value before and after
/// reading `key` read a consistent key.
#[repr(C)]
pub struct Slot {
    incarnation: AtomicU32,
    /// The next free slot's id + 1 (0: none), while this one is free.
    next_free: AtomicU32,
    key: [AtomicU64; 3],
    /// EWMA of connect + response time, seconds (f64 bits).
    pub ewma: AtomicU64,
    /// When `ewma` was last updated, Unix seconds (f64 bits).
    pub touched: AtomicU64,
    /// Try-lock for EWMA updates; a busy lock skips the update, as Lua's
    /// `resty.lock` with timeout 0 does.
    pub ewma_lock: AtomicU32,
    pub conns: AtomicU32,
    pub fails: AtomicU32,
    /// Live backends that list this endpoint; the writer's count, so that
    /// a write frees the slots of the endpoints it removes without looking
    /// at the backends it kept.
    refs: AtomicU32,
    /// Unix ms of the last failure (or of the last probe after ejection).
    pub checked_ms: AtomicU64,
}

/// A worker's reference to an endpoint's slot.
#[derive(Clone, Copy)]
pub struct SlotRef {
    slot: &'static Slot,
    incarnation: u32,
}

impl SlotRef {
    /// The slot, unless it was freed or now belongs to another endpoint.
    #[inline]
    pub fn get(&self) -> Option<&'static Slot> {
        (self.slot.incarnation.load(Ordering::Acquire) == self.incarnation).then_some(self.slot)
    }
}

/// The address as three words: family, address bytes, port.
fn encode(addr: &SocketAddr) -> [u64; 3] {
    let mut bytes = [0u8; 24];
    match addr {
        SocketAddr::V4(a) => {
            bytes[0] = 4;
            bytes[1..5].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            bytes[0] = 6;
            bytes[1..17].copy_from_slice(&a.ip().octets());
        }
    }
    bytes[17..19].copy_from_slice(&addr.port().to_be_bytes());
    let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    [word(0), word(1), word(2)]
}

fn decode(key: [u64; 3]) -> Option<SocketAddr> {
    let mut bytes = [0u8; 24];
    for (i, w) in key.iter().enumerate() {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    let port = u16::from_be_bytes([bytes[17], bytes[18]]);
    match bytes[0] {
        4 => Some(SocketAddr::from((<[u8; 4]>::try_from(&bytes[1..5]).ok()?, port))),
        6 => Some(SocketAddr::from((<[u8; 16]>::try_from(&bytes[1..17]).ok()?, port))),
        _ => None,
    }
}

fn hash(key: &[u64; 3]) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in key {
        h = (h ^ w).wrapping_mul(0x0100_0000_01b3);
        h ^= h >> 29;
    }
    h as usize
}

impl Slot {
    /// The slot's key and incarnation if it holds an endpoint, read as a
    /// seqlock reader: `None` for a free slot or one being refilled.
    fn read_key(&self) -> Option<([u64; 3], u32)> {
        let before = self.incarnation.load(Ordering::Acquire);
        if before.is_multiple_of(2) {
            return None;
        }
        let key = [0, 1, 2].map(|i| self.key[i].load(Ordering::Relaxed));
        std::sync::atomic::fence(Ordering::Acquire);
        (self.incarnation.load(Ordering::Relaxed) == before).then_some((key, before))
    }

    /// Whether no request holds a connection to it and nothing failed:
    /// the first to give up when the zone is full.
    pub fn idle(&self) -> bool {
        self.conns.load(Ordering::Relaxed) == 0 && self.fails.load(Ordering::Relaxed) == 0
    }

    #[inline]
    pub fn ewma_value(&self) -> (f64, f64) {
        (
            f64::from_bits(self.ewma.load(Ordering::Relaxed)),
            f64::from_bits(self.touched.load(Ordering::Relaxed)),
        )
    }

    /// Blends a round trip into the score; skipped if another worker is
    /// updating it right now.
    #[inline]
    pub fn record_rtt(&self, rtt: f64, now: f64) {
        if self
            .ewma_lock
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let (ewma, touched) = self.ewma_value();
        let next = crate::ewma::decay(ewma, touched, rtt, now);
        self.ewma.store(next.to_bits(), Ordering::Relaxed);
        self.touched.store(now.to_bits(), Ordering::Relaxed);
        self.ewma_lock.store(0, Ordering::Release);
    }

    /// The score used to pick: the stored EWMA decayed to now.
    #[inline]
    pub fn score(&self, now: f64) -> f64 {
        let (ewma, touched) = self.ewma_value();
        crate::ewma::decay(ewma, touched, 0.0, now)
    }

    /// nginx's passive health rule: out of rotation once `max_fails` attempts
    /// failed, until `fail_timeout` after the last failure; then requests may
    /// probe it again, and a success clears it.
    #[inline]
    pub fn usable(&self, max_fails: u32, fail_timeout_ms: u64, now_ms: u64) -> bool {
        !self.is_down(max_fails, fail_timeout_ms, now_ms)
    }

    /// Called for the endpoint a request picked: if it was ejected, this
    /// request is its probe, and the ejection window restarts so that other
    /// requests keep away until the probe has answered (nginx does the same).
    #[inline]
    pub fn note_picked(&self, max_fails: u32, now_ms: u64) {
        if max_fails != 0 && self.fails.load(Ordering::Relaxed) >= max_fails {
            self.checked_ms.store(now_ms, Ordering::Relaxed);
        }
    }

    /// Failures older than `fail_timeout` no longer count, so `max_fails`
    /// applies within that window.
    #[inline]
    pub fn record_failure(&self, fail_timeout_ms: u64, now_ms: u64) {
        let last = self.checked_ms.swap(now_ms, Ordering::AcqRel);
        if now_ms.saturating_sub(last) > fail_timeout_ms {
            self.fails.store(1, Ordering::Relaxed);
        } else {
            self.fails.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[inline]
    pub fn record_success(&self) {
        if self.fails.load(Ordering::Relaxed) != 0 {
            self.fails.store(0, Ordering::Relaxed);
        }
    }

    #[inline]
    pub fn is_down(&self, max_fails: u32, fail_timeout_ms: u64, now_ms: u64) -> bool {
        max_fails != 0
            && self.fails.load(Ordering::Relaxed) >= max_fails
            && now_ms.saturating_sub(self.checked_ms.load(Ordering::Relaxed)) <= fail_timeout_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_72_bytes_and_keys_round_trip() {
        assert_eq!(std::mem::size_of::<Slot>(), 72);
        for a in ["10.0.0.1:80", "[2001:db8::1]:8080", "0.0.0.0:0"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(decode(encode(&a)), Some(a));
        }
        assert_eq!(decode([0, 0, 0]), None);
    }
}
