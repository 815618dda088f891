//! State every worker shares about each endpoint: passive health (failures
//! and when they happened), active connections (least_conn) and the EWMA
//! score. It lives in the zone, so all workers see the same numbers and
//! they survive `nginx -s reload`.
//!
//! The table is open-addressed and keyed by `address:port`, as Lua keys its
//! shared dicts. Only the writer (serialised by the zone's slab mutex) adds and
//! removes entries: it adds an endpoint's entry before the index that names it
//! is published, and turns entries of vanished endpoints into tombstones
//! afterwards. Workers only look entries up, once per decoded backend, and
//! keep the slot with its incarnation; a slot reused for another endpoint has
//! a new incarnation, so a stale reference is ignored.
//!
//! The per-request methods are `#[inline]`: the module calls them from
//! another crate on every pick, and without LTO they would not inline.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const EMPTY: u32 = 0;
const LIVE: u32 = 1;
const TOMBSTONE: u32 = 2;
/// Slots stop taking new endpoints beyond this share of the table, so probes
/// stay short.
const MAX_LOAD_PERCENT: usize = 75;

/// One endpoint's shared state.
#[repr(C)]
pub struct Slot {
    tag: AtomicU32,
    incarnation: AtomicU32,
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
    /// Unix ms of the last failure (or of the last probe after ejection).
    pub checked_ms: AtomicU64,
}

/// The table header; `cap` slots follow it.
#[repr(C)]
pub struct EndpointTable {
    cap: usize,
    live: AtomicU64,
}

/// A worker's reference to an endpoint's slot.
#[derive(Clone, Copy)]
pub struct SlotRef {
    slot: &'static Slot,
    incarnation: u32,
}

impl SlotRef {
    /// The slot, unless it now belongs to another endpoint.
    #[inline]
    pub fn get(&self) -> Option<&'static Slot> {
        (self.slot.incarnation.load(Ordering::Acquire) == self.incarnation
            && self.slot.tag.load(Ordering::Acquire) == LIVE)
            .then_some(self.slot)
    }
}

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

impl EndpointTable {
    /// Bytes needed for a table of `cap` slots.
    pub fn size_for(cap: usize) -> usize {
        std::mem::size_of::<EndpointTable>() + cap * std::mem::size_of::<Slot>()
    }

    /// Slots for a zone of `zone_size` bytes: a power of two using about
    /// 1/16 of it (a 32m zone tracks 12,288 endpoints).
    pub fn capacity_for(zone_size: usize) -> usize {
        let wanted = zone_size / 16 / std::mem::size_of::<Slot>();
        let mut cap = 64;
        while cap * 2 <= wanted {
            cap *= 2;
        }
        cap
    }

    /// How many endpoints a table of `cap` slots tracks.
    pub fn tracks(cap: usize) -> usize {
        cap * MAX_LOAD_PERCENT / 100
    }

    /// Initialises a zeroed table of `cap` slots in place.
    ///
    /// # Safety
    /// `table` points to `size_for(cap)` zeroed bytes, aligned for `u64`,
    /// that stay mapped for the rest of the process (a shared zone), since
    /// [`SlotRef`]s into it are `'static`; `cap` is a power of two.
    pub unsafe fn init(table: *mut EndpointTable, cap: usize) {
        // SAFETY: the caller hands over writable memory for the header.
        unsafe { (*table).cap = cap };
    }

    fn slots(&self) -> &[Slot] {
        // SAFETY: init() sized the allocation for `cap` slots right after us.
        unsafe { std::slice::from_raw_parts((self as *const EndpointTable).add(1).cast::<Slot>(), self.cap) }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    /// The slot of `addr`, if the table tracks it.
    pub fn find(&self, addr: &SocketAddr) -> Option<SlotRef> {
        let key = encode(addr);
        let slots = self.slots();
        let mask = self.cap - 1;
        let mut i = hash(&key) & mask;
        for _ in 0..self.cap {
            let slot = &slots[i];
            match slot.tag.load(Ordering::Acquire) {
                EMPTY => return None,
                LIVE if slot.key.iter().zip(key).all(|(k, w)| k.load(Ordering::Relaxed) == w) => {
                    // SAFETY: the table lives in the zone for the life of the process.
                    let slot: &'static Slot = unsafe { &*(slot as *const Slot) };
                    return Some(SlotRef {
                        slot,
                        incarnation: slot.incarnation.load(Ordering::Acquire),
                    });
                }
                _ => {}
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// Adds `addr` (writer only). New entries start with `ewma` (slow start).
    /// Returns false when the table is too full to take it.
    pub fn insert(&self, addr: &SocketAddr, ewma: Option<f64>, now: f64) -> bool {
        if self.find(addr).is_some() {
            return true;
        }
        if (self.live() as usize + 1) * 100 > self.cap * MAX_LOAD_PERCENT {
            return false;
        }
        let key = encode(addr);
        let slots = self.slots();
        let mask = self.cap - 1;
        let mut i = hash(&key) & mask;
        loop {
            let slot = &slots[i];
            if slot.tag.load(Ordering::Acquire) != LIVE {
                for (k, w) in slot.key.iter().zip(key) {
                    k.store(w, Ordering::Relaxed);
                }
                slot.ewma.store(ewma.unwrap_or(0.0).to_bits(), Ordering::Relaxed);
                slot.touched
                    .store(if ewma.is_some() { now } else { 0.0 }.to_bits(), Ordering::Relaxed);
                slot.conns.store(0, Ordering::Relaxed);
                slot.fails.store(0, Ordering::Relaxed);
                slot.checked_ms.store(0, Ordering::Relaxed);
                slot.incarnation.fetch_add(1, Ordering::AcqRel);
                slot.tag.store(LIVE, Ordering::Release);
                self.live.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            i = (i + 1) & mask;
        }
    }

    /// Drops every entry `keep` rejects (writer only).
    pub fn retain(&self, keep: impl Fn(&SocketAddr) -> bool) {
        for slot in self.slots() {
            if slot.tag.load(Ordering::Acquire) != LIVE {
                continue;
            }
            let key = [0, 1, 2].map(|i| slot.key[i].load(Ordering::Relaxed));
            if decode(key).is_some_and(|a| !keep(&a)) {
                slot.incarnation.fetch_add(1, Ordering::AcqRel);
                slot.tag.store(TOMBSTONE, Ordering::Release);
                self.live.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Every tracked endpoint with its slot, for `/configuration/health`.
    pub fn entries(&self) -> impl Iterator<Item = (SocketAddr, &Slot)> + '_ {
        self.slots()
            .iter()
            .filter(|s| s.tag.load(Ordering::Acquire) == LIVE)
            .filter_map(|s| {
                let key = [0, 1, 2].map(|i| s.key[i].load(Ordering::Relaxed));
                decode(key).map(|a| (a, s))
            })
    }
}

impl Slot {
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

    /// A table on leaked heap memory, which lives as long as the process,
    /// as the zone does.
    fn table(cap: usize) -> &'static EndpointTable {
        let words = EndpointTable::size_for(cap).div_ceil(8);
        let memory: &'static mut [u64] = Box::leak(vec![0u64; words].into_boxed_slice());
        let table = memory.as_mut_ptr().cast::<EndpointTable>();
        // SAFETY: zeroed, u64-aligned, `size_for(cap)` bytes, never freed.
        unsafe {
            EndpointTable::init(table, cap);
            &*table
        }
    }

    fn addr(i: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 80))
    }

    #[test]
    fn finds_what_it_holds_and_forgets_what_it_drops() {
        let t = table(16);
        let v6: SocketAddr = "[2001:db8::1]:8080".parse().unwrap();
        for a in [addr(1), addr(2), v6] {
            assert!(t.insert(&a, Some(0.5), 100.0));
        }
        assert_eq!(t.live(), 3);
        let one = t.find(&addr(1)).unwrap();
        assert_eq!(one.get().unwrap().ewma_value(), (0.5, 100.0));
        assert!(t.find(&addr(3)).is_none());
        t.retain(|a| *a != addr(1));
        assert!(one.get().is_none(), "a dropped endpoint's reference goes stale");
        assert!(t.find(&addr(1)).is_none());
        // The tombstone is reused, under a new incarnation.
        assert!(t.insert(&addr(4), None, 0.0));
        assert!(one.get().is_none());
        let mut held: Vec<SocketAddr> = t.entries().map(|(a, _)| a).collect();
        held.sort();
        assert_eq!(held, [addr(2), addr(4), v6]);
    }

    #[test]
    fn stops_taking_endpoints_at_its_load_limit() {
        let t = table(8);
        let taken = (0..8).filter(|i| t.insert(&addr(*i), None, 0.0)).count();
        assert_eq!(taken, 8 * MAX_LOAD_PERCENT / 100);
        assert!(t.insert(&addr(0), None, 0.0), "a held endpoint is still found");
    }

    #[test]
    fn passive_health_ejects_after_max_fails_for_fail_timeout() {
        let t = table(8);
        t.insert(&addr(1), None, 0.0);
        let slot = t.find(&addr(1)).unwrap().get().unwrap();
        assert!(slot.usable(2, 10_000, 0));
        slot.record_failure(10_000, 1_000);
        assert!(slot.usable(2, 10_000, 1_000));
        slot.record_failure(10_000, 1_001);
        assert!(!slot.usable(2, 10_000, 2_000));
        assert!(slot.usable(2, 10_000, 11_002), "fail_timeout later it is tried again");
    }
}
