//! Each worker's private, decoded view of the zone.
//!
//! A request needs its backend's endpoints as `sockaddr`s, plus that worker's
//! round-robin state. Building those from shared memory on every request would
//! cost a lock and a decode per request, so each worker keeps them here.
//!
//! Validation is lazy and per backend. A write bumps the zone's generation;
//! the next request for a backend notices (one atomic load), looks the backend
//! up in the shared index (a binary search under the read lock), and decodes
//! it only if its blob changed. A write therefore routes from the very next
//! request on any worker (read-your-writes), yet no request pays for
//! re-decoding thousands of backends it does not use. The sync timer sweeps
//! the remaining stale entries in small batches, so idle backends are
//! refreshed or dropped without a long pause.
//!
//! One exception to read-your-writes: a new version of a backend whose hash
//! ring is large (see `ring_builder`) is built on a background thread while
//! the version this worker already has keeps routing, for the few
//! milliseconds the build takes.

use std::cell::{Cell, Ref, RefCell};
use std::net::SocketAddr;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use lua_compat::canary::TrafficPolicy;
use lua_compat::endpoint_state::{EndpointTable, SlotRef};
use lua_compat::runtime::RuntimeBackend;
use lua_compat::selection::{Selection, Selector, Worker};
use ngx::ffi::{ngx_str_t, NGX_LOG_ERR, NGX_LOG_INFO};
use ngx::ngx_log_error;
use regex::bytes::Regex;
use rustc_hash::FxHashMap;
use socket2::SockAddr;

use crate::backends::ring_builder;
use crate::shm::index::Index;
use crate::shm::zone::Zone;

/// One endpoint in the form `ngx_peer_connection_t` wants.
pub struct PeerAddr {
    pub sockaddr: SockAddr,
    /// Its shared state (health, connections, EWMA), if the table tracks it.
    /// A `Cell`: an endpoint the table had no room for is looked up again
    /// in place once the table gives out slots (see `refresh_states`).
    pub state: Cell<Option<SlotRef>>,
    /// `ip:port` or `[ipv6]:port`, as Lua formats peers; `name` points into it.
    _name_buf: Box<[u8]>,
    pub name: ngx_str_t,
}

impl PeerAddr {
    fn new(addr: SocketAddr, state: Option<SlotRef>) -> PeerAddr {
        let name_buf: Box<[u8]> = addr.to_string().into_bytes().into();
        let name = ngx_str_t {
            len: name_buf.len(),
            data: name_buf.as_ptr().cast_mut(),
        };
        PeerAddr {
            sockaddr: SockAddr::from(addr),
            state: Cell::new(state),
            _name_buf: name_buf,
            name,
        }
    }
}

/// A backend as this worker routes it. Requests hold an `Rc` to it, so
/// replacing it never frees memory an in-flight request still points at.
pub struct WorkerBackend {
    pub name: Box<[u8]>,
    /// The generation that wrote its blob.
    pub version: u64,
    pub endpoints: Box<[PeerAddr]>,
    /// The algorithm, built for this backend (see `lua_compat::selection`).
    pub selector: Selector,
    /// Canary backends, in order.
    pub alternatives: Box<[String]>,
    /// This backend's rules as a canary.
    pub traffic: TrafficPolicy,
    /// `traffic.header_pattern`, compiled; `Err` if it does not compile.
    pub header_pattern: Option<Result<Regex, ()>>,
    /// The variables holding `traffic`'s header and cookie (`http_x_canary`,
    /// `cookie_canary`), named once here rather than on every request.
    pub header_variable: Option<String>,
    pub cookie_variable: Option<String>,
    pub max_fails: u32,
    pub fail_timeout_ms: u64,
    /// What the endpoint table looked like when `endpoints`' states were
    /// last looked up (see [`refresh_states`]).
    states_seen: Cell<StatesSeen>,
    /// `alternatives` resolved to this worker's backends, reused while
    /// neither the zone nor this cache changed (see [`canaries`]).
    canaries: RefCell<CanaryMemo>,
}

/// The table's epoch and eviction count at the last lookup of a backend's
/// states, and whether every endpoint had state then.
#[derive(Clone, Copy)]
struct StatesSeen {
    epoch: u64,
    evicted: u64,
    complete: bool,
}

impl StatesSeen {
    /// The table's counters, read before the lookups they stamp, so that a
    /// slot given out meanwhile moves the epoch past the stamp.
    fn before(table: &EndpointTable) -> (u64, u64) {
        (table.epoch(), table.evicted())
    }

    fn after((epoch, evicted): (u64, u64), endpoints: &[PeerAddr]) -> StatesSeen {
        StatesSeen {
            epoch,
            evicted,
            complete: endpoints.iter().all(|p| p.state.get().and_then(|s| s.get()).is_some()),
        }
    }
}

/// The canaries of a backend as last resolved, and when.
#[derive(Default)]
struct CanaryMemo {
    /// `(zone generation, cache epoch)` at resolution; `None` before the
    /// first.
    stamp: Option<(u64, u64)>,
    /// One per alternative, in order; empty for a canary that is missing or
    /// has no endpoints. `Weak`: two backends naming each other as canaries
    /// must not keep each other alive once the cache drops them.
    resolved: Vec<Weak<WorkerBackend>>,
}

/// Bumped whenever this worker's cache inserts, replaces or drops a
/// backend, so a [`CanaryMemo`] stamped before is stale. A static, not in
/// the thread-local cache: reading it costs no `__tls_get_addr` call, and
/// only the event-loop thread writes it.
static CACHE_EPOCH: AtomicU64 = AtomicU64::new(0);

fn bump_epoch() {
    CACHE_EPOCH.fetch_add(1, Ordering::Relaxed);
}

impl WorkerCache {
    /// Inserts or replaces `name`'s entry. Every change of an entry goes
    /// through here or [`WorkerCache::remove`], so none can miss the epoch.
    fn put(&mut self, name: Box<[u8]>, backend: Rc<WorkerBackend>, checked: u64) {
        bump_epoch();
        self.backends.insert(name, Entry { backend, checked });
    }

    fn remove(&mut self, name: &[u8]) {
        if self.backends.remove(name).is_some() {
            bump_epoch();
        }
    }
}

struct Entry {
    backend: Rc<WorkerBackend>,
    /// The zone generation at which `backend` was last found current.
    checked: u64,
}

#[derive(Default)]
struct WorkerCache {
    /// The zone generation this worker last observed.
    generation: Option<u64>,
    /// Keyed by backend name. FxHash: the keys come from our own validated
    /// zone, and SipHash would cost more than the rest of the lookup.
    backends: FxHashMap<Box<[u8]>, Entry>,
}

thread_local! {
    // nginx runs each worker's event loop on one thread; thread-pool threads
    // never touch this.
    static CACHE: RefCell<WorkerCache> = RefCell::new(WorkerCache::default());
}

/// Backends the timer revalidates per tick: bounded so a tick stays well
/// under a millisecond even right after a write that changed everything.
const SWEEP_BUDGET: usize = 200;

/// The backend named `name`, current as of the zone's latest generation.
/// It runs a few times per request: one borrow of the cache (a thread-local
/// read from a shared object is a `__tls_get_addr` call) does it all.
pub fn lookup(zone: &Zone, name: &[u8]) -> Option<Rc<WorkerBackend>> {
    let current = zone.header().generation.load(Ordering::Acquire);
    CACHE.with_borrow_mut(|cache| {
        note_generation(cache, zone, current);
        if ring_builder::any_pending() {
            absorb(cache, zone);
        }
        if let Some(entry) = cache.backends.get(name) {
            if entry.checked == current {
                return Some(Rc::clone(&entry.backend));
            }
        }
        let index = zone.header().index.read();
        let found = check(cache, &index, name, current);
        drop(index);
        finish(cache, zone, name, found, current)
    })
}

/// What the index says about a cached backend, copied out under the read
/// lock; decoding (which allocates, and for hash rings a lot) happens after
/// the lock is released.
enum Found {
    /// The cached entry is current (its `checked` was updated).
    Current(Rc<WorkerBackend>),
    /// A new blob: its version and a copy of its bytes.
    Changed {
        version: u64,
        runtime: Vec<u8>,
    },
    Gone,
}

/// Under the read lock: compares the cache entry for `name` with the index.
fn check(cache: &mut WorkerCache, index: &Index, name: &[u8], generation: u64) -> Found {
    let Some(blob) = index.find(name) else {
        return Found::Gone;
    };
    if let Some(entry) = cache.backends.get_mut(name) {
        if entry.backend.version == blob.version {
            entry.checked = generation;
            return Found::Current(Rc::clone(&entry.backend));
        }
        // Its new ring is being built: the previous version serves until
        // then (`checked` stays behind, so the next lookup looks again).
        if ring_builder::is_pending(name, blob.version) {
            return Found::Current(Rc::clone(&entry.backend));
        }
    }
    Found::Changed {
        version: blob.version,
        runtime: blob.runtime().to_vec(),
    }
}

/// After the lock: decodes a changed backend, or drops a gone one.
fn finish(
    cache: &mut WorkerCache,
    zone: &Zone,
    name: &[u8],
    found: Found,
    generation: u64,
) -> Option<Rc<WorkerBackend>> {
    match found {
        Found::Current(backend) => {
            refresh_states(&backend, zone.header().table());
            Some(backend)
        }
        Found::Gone => {
            cache.remove(name);
            None
        }
        Found::Changed { version, runtime } => {
            let worker = this_worker();
            let runtime = match cache.backends.get(name) {
                // A large ring, and a version to serve meanwhile: decode and
                // build the new one on the ring thread.
                Some(old) if old.backend.selector.ring_len() >= ring_builder::OFF_LOOP_POINTS => {
                    match ring_builder::submit(name, version, runtime, worker) {
                        Ok(()) => return Some(Rc::clone(&old.backend)),
                        Err(runtime) => runtime,
                    }
                }
                _ => runtime,
            };
            let rt = decode_runtime(name, &runtime)?;
            let selector = Selector::build(&rt, worker);
            let backend = Rc::new(assemble(name, version, rt, selector, zone.header().table()));
            cache.put(name.into(), Rc::clone(&backend), generation);
            Some(backend)
        }
    }
}

/// Looks up again the endpoints of `backend` that have no state, once the
/// table has given out slots since they were looked up: an endpoint the
/// table had no room for gets its state without a new blob. Runs when a
/// write moved the generation, never per request.
///
/// A backend whose endpoints all had state, and none of whose slots can
/// have been taken since (no eviction), is not scanned: only the fair
/// share of a full zone takes a slot from an endpoint a backend lists.
fn refresh_states(backend: &WorkerBackend, table: &EndpointTable) {
    let seen = backend.states_seen.get();
    let (epoch, evicted) = StatesSeen::before(table);
    if seen.epoch == epoch {
        return;
    }
    if seen.complete && seen.evicted == evicted {
        backend.states_seen.set(StatesSeen { epoch, ..seen });
        return;
    }
    refresh_missing(backend, table);
    backend
        .states_seen
        .set(StatesSeen::after((epoch, evicted), &backend.endpoints));
}

/// Looks up the endpoints of `backend` that have no state now.
fn refresh_missing(backend: &WorkerBackend, table: &EndpointTable) {
    let missing: Vec<&PeerAddr> = backend
        .endpoints
        .iter()
        .filter(|p| p.state.get().and_then(|s| s.get()).is_none())
        .collect();
    if missing.is_empty() {
        return;
    }
    let addrs: Vec<SocketAddr> = missing.iter().filter_map(|p| p.sockaddr.as_socket()).collect();
    if addrs.len() != missing.len() {
        return;
    }
    for (peer, state) in missing.iter().zip(table.find_all(addrs.iter())) {
        peer.state.set(state);
    }
}

/// Takes in the selectors the ring builder finished. Each goes in as
/// unchecked, so the next lookup compares it with the index: a later write
/// may already have replaced it.
fn absorb(cache: &mut WorkerCache, zone: &Zone) {
    for built in ring_builder::take_finished() {
        if cache
            .backends
            .get(&built.name)
            .is_some_and(|e| e.backend.version >= built.version)
        {
            continue;
        }
        let backend = assemble(
            &built.name,
            built.version,
            built.backend,
            built.selector,
            zone.header().table(),
        );
        cache.put(built.name, Rc::new(backend), 0);
    }
}

fn this_worker() -> Worker {
    // SAFETY: plain read of a global nginx sets before a worker runs modules.
    let pid = unsafe { ngx::ffi::ngx_pid };
    Worker { pid: i64::from(pid) }
}

fn decode_runtime(name: &[u8], runtime: &[u8]) -> Option<RuntimeBackend> {
    match RuntimeBackend::decode(runtime) {
        Ok(rt) => Some(rt),
        Err(e) => {
            // Cannot happen unless the zone is corrupt: the writer encoded it.
            let name = String::from_utf8_lossy(name);
            ngx_log_error!(
                NGX_LOG_ERR,
                cycle_log(),
                "dynamic_balancer: cannot decode backend \"{name}\": {e}"
            );
            None
        }
    }
}

/// A backend as this worker routes it, from its record and its selector.
fn assemble(name: &[u8], version: u64, rt: RuntimeBackend, selector: Selector, table: &EndpointTable) -> WorkerBackend {
    let stamp = StatesSeen::before(table);
    let states = table.find_all(rt.endpoints.iter().map(|e| &e.addr));
    let endpoints: Box<[PeerAddr]> = rt
        .endpoints
        .iter()
        .zip(states)
        .map(|(e, s)| PeerAddr::new(e.addr, s))
        .collect();
    let header_pattern = (!rt.traffic.header_pattern.is_empty())
        .then(|| lua_compat::canary::compile_pattern(&rt.traffic.header_pattern).map_err(|_| ()));
    let states_seen = Cell::new(StatesSeen::after(stamp, &endpoints));
    WorkerBackend {
        name: name.into(),
        version,
        endpoints,
        selector,
        alternatives: rt.alternatives.into(),
        header_variable: rt.traffic.header_variable(),
        cookie_variable: rt.traffic.cookie_variable(),
        traffic: rt.traffic,
        header_pattern,
        max_fails: rt.max_fails,
        fail_timeout_ms: rt.fail_timeout_ms,
        states_seen,
        canaries: RefCell::default(),
    }
}

/// `primary`'s canaries that have endpoints, as this worker routes them
/// (an empty `Weak` for one that is missing or empty).
///
/// A request with canaries would otherwise look each one up by name (a
/// hash and a probe of the cache, through a thread-local). The answer
/// changes only when the zone's generation moves or this cache changes an
/// entry, so it is memoised on the primary under that stamp. Within one
/// stamp every `Weak` upgrades: the cache still holds each backend.
pub fn canaries<'a>(zone: &Zone, primary: &'a WorkerBackend) -> Ref<'a, [Weak<WorkerBackend>]> {
    let stamp = (
        zone.header().generation.load(Ordering::Acquire),
        CACHE_EPOCH.load(Ordering::Relaxed),
    );
    if primary.canaries.borrow().stamp != Some(stamp) {
        let resolved = primary
            .alternatives
            .iter()
            .map(|name| {
                lookup(zone, name.as_bytes())
                    .filter(|b| !b.endpoints.is_empty())
                    .map_or_else(Weak::new, |b| Rc::downgrade(&b))
            })
            .collect();
        // The lookups may have changed the cache (a decode, a drop): stamp
        // with the epoch as it is now, which those changes are part of.
        let stamp = (stamp.0, CACHE_EPOCH.load(Ordering::Relaxed));
        *primary.canaries.borrow_mut() = CanaryMemo {
            stamp: Some(stamp),
            resolved,
        };
    }
    Ref::map(primary.canaries.borrow(), |m| m.resolved.as_slice())
}

/// Notes the zone's current generation (and reports it when it moved).
/// Every lookup validates against it, so from here this worker routes by it.
pub fn observe(zone: &Zone) -> u64 {
    let current = zone.header().generation.load(Ordering::Acquire);
    CACHE.with_borrow_mut(|cache| note_generation(cache, zone, current));
    current
}

/// Records `current` as this worker's generation, reporting it if it moved.
fn note_generation(cache: &mut WorkerCache, zone: &Zone, current: u64) {
    if cache.generation != Some(current) {
        cache.generation = Some(current);
        report(zone, current);
    }
}

/// Revalidates up to [`SWEEP_BUDGET`] stale entries (timer work).
pub fn sweep(zone: &Zone) {
    let current = observe(zone);
    CACHE.with_borrow_mut(|cache| {
        absorb(cache, zone);
        let stale: Vec<Box<[u8]>> = cache
            .backends
            .iter()
            .filter(|(_, e)| e.checked != current)
            .take(SWEEP_BUDGET)
            .map(|(k, _)| k.clone())
            .collect();
        if stale.is_empty() {
            return;
        }
        let started = Instant::now();
        let before = cache.backends.len();
        let index = zone.header().index.read();
        let found: Vec<Found> = stale.iter().map(|name| check(cache, &index, name, current)).collect();
        drop(index);
        for (name, found) in stale.iter().zip(found) {
            finish(cache, zone, name, found, current);
        }
        let (left, us) = (cache.backends.len(), started.elapsed().as_micros());
        ngx_log_error!(
            NGX_LOG_INFO,
            cycle_log(),
            "dynamic_balancer: revalidated {} backends for generation {current} ({} dropped) in {us} us",
            stale.len(),
            before - left
        );
    })
}

/// Publishes this worker's generation in its status slot. Called when the
/// generation moves and on every timer tick, so a slot an exiting worker of
/// the previous cycle cleared is taken back within one tick.
pub fn report(zone: &Zone, generation: u64) {
    // SAFETY: plain reads of globals nginx sets before a worker runs modules.
    let (process, worker, pid) = unsafe { (ngx::ffi::ngx_process, ngx::ffi::ngx_worker, ngx::ffi::ngx_pid) };
    // A worker of the previous cycle shares its slot index with its
    // successor; once shutting down it must not take the slot back.
    if process == ngx::ffi::NGX_PROCESS_WORKER as usize && !crate::nginx::worker::is_leaving() {
        zone.header().report(worker, pid as i64, generation);
    }
}

fn cycle_log() -> *mut ngx::ffi::ngx_log_t {
    // SAFETY: ngx_cycle and its log live as long as the worker.
    unsafe { (*ngx::ffi::ngx_cycle).log }
}

/// Clears this worker's view (worker exit).
pub fn clear() {
    bump_epoch();
    CACHE.with_borrow_mut(|cache| *cache = WorkerCache::default());
}
