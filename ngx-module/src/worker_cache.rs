//! Each worker's private, decoded view of the zone.
//!
//! A request needs its backend's endpoints as `sockaddr`s, plus that worker's
//! round-robin state. Building those from shared memory on every request would
//! cost a lock and a decode per request, so each worker keeps them here and
//! re-syncs only when the zone's generation moves: one atomic load per request
//! in the common case. Because the check runs on every request, a write is
//! routed by the very next request on any worker (read-your-writes).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use lua_compat::round_robin::RoundRobin;
use lua_compat::runtime::RuntimeBackend;
use ngx::ffi::{ngx_str_t, NGX_LOG_ERR};
use ngx::ngx_log_error;
use rustc_hash::FxHashMap;
use socket2::SockAddr;

use crate::zone::Zone;

/// One endpoint in the form `ngx_peer_connection_t` wants.
pub struct PeerAddr {
    pub sockaddr: SockAddr,
    /// `ip:port` or `[ipv6]:port`, as Lua formats peers; `name` points into it.
    _name_buf: Box<[u8]>,
    pub name: ngx_str_t,
}

impl PeerAddr {
    fn new(addr: SocketAddr) -> PeerAddr {
        let name_buf: Box<[u8]> = addr.to_string().into_bytes().into();
        let name = ngx_str_t {
            len: name_buf.len(),
            data: name_buf.as_ptr().cast_mut(),
        };
        PeerAddr {
            sockaddr: SockAddr::from(addr),
            _name_buf: name_buf,
            name,
        }
    }
}

/// A backend as this worker routes it. Requests hold an `Rc` to it, so a sync
/// that replaces it never frees memory an in-flight request still points at.
pub struct WorkerBackend {
    pub name: Box<[u8]>,
    pub version: u64,
    pub endpoints: Box<[PeerAddr]>,
    pub rr: RefCell<RoundRobin>,
}

struct WorkerCache {
    /// `None` until the first sync.
    generation: Option<u64>,
    /// Keyed by backend name. FxHash: the keys come from our own validated
    /// zone, not from clients, and SipHash would cost more than the lookup.
    backends: FxHashMap<Box<[u8]>, Rc<WorkerBackend>>,
}

thread_local! {
    // nginx runs each worker's event loop on one thread; thread-pool threads
    // never touch this.
    static CACHE: RefCell<WorkerCache> =
        RefCell::new(WorkerCache { generation: None, backends: FxHashMap::default() });
}

/// Brings this worker's view up to the zone's generation; returns it.
pub fn sync(zone: &Zone) -> u64 {
    let header = zone.header();
    let current = header.generation.load(Ordering::Acquire);
    CACHE.with_borrow_mut(|cache| {
        if cache.generation == Some(current) {
            return current;
        }
        let index = header.index.read();
        // Stable while we hold the read lock: writers bump it under the write lock.
        let generation = header.generation.load(Ordering::Acquire);
        let start = worker_seed();
        let mut next = FxHashMap::with_capacity_and_hasher(index.blobs().len(), Default::default());
        for blob in index.blobs() {
            if let Some(kept) = cache
                .backends
                .get(blob.name())
                .filter(|b| b.version == blob.version)
            {
                next.insert(blob.name().into(), Rc::clone(kept));
                continue;
            }
            match RuntimeBackend::decode(blob.runtime()) {
                Ok(rt) => {
                    let rr = RoundRobin::new(rt.endpoints.iter().map(|e| e.weight), start);
                    let endpoints = rt.endpoints.iter().map(|e| PeerAddr::new(e.addr)).collect();
                    let backend = WorkerBackend {
                        name: blob.name().into(),
                        version: blob.version,
                        endpoints,
                        rr: RefCell::new(rr),
                    };
                    next.insert(blob.name().into(), Rc::new(backend));
                }
                Err(e) => {
                    // Cannot happen unless the zone is corrupt: the writer encoded it.
                    let log = unsafe { (*ngx::ffi::ngx_cycle).log };
                    let name = String::from_utf8_lossy(blob.name());
                    ngx_log_error!(
                        NGX_LOG_ERR,
                        log,
                        "dynamic_balancer: cannot decode backend \"{name}\": {e}"
                    );
                }
            }
        }
        drop(index);
        cache.backends = next;
        cache.generation = Some(generation);
        report(zone, generation);
        generation
    })
}

/// The backend named `name` after a sync, if it exists.
pub fn lookup(zone: &Zone, name: &[u8]) -> Option<Rc<WorkerBackend>> {
    sync(zone);
    CACHE.with_borrow(|cache| cache.backends.get(name).cloned())
}

/// Publishes this worker's generation in its status slot. Called on every
/// change and on every timer tick, so a slot an exiting worker of the previous
/// cycle cleared is taken back within one tick.
pub fn report(zone: &Zone, generation: u64) {
    // SAFETY: plain reads of globals nginx sets before a worker runs modules.
    let (process, worker, pid) = unsafe {
        (
            ngx::ffi::ngx_process,
            ngx::ffi::ngx_worker,
            ngx::ffi::ngx_pid,
        )
    };
    // A worker of the previous cycle shares its slot index with its
    // successor; once shutting down it must not take the slot back.
    let leaving = unsafe {
        ngx::ffi::ngx_exiting != 0 || ngx::ffi::ngx_quit != 0 || ngx::ffi::ngx_terminate != 0
    };
    if process == ngx::ffi::NGX_PROCESS_WORKER as usize && !leaving {
        zone.header().report(worker, pid as i64, generation);
    }
}

/// Spreads the round-robin start across workers, as Lua's random start does.
fn worker_seed() -> usize {
    // SAFETY: plain read of a global set before modules run.
    (unsafe { ngx::ffi::ngx_pid } as usize).wrapping_mul(0x9e37_79b9)
}

/// Clears this worker's view (worker exit).
pub fn clear() {
    CACHE.with_borrow_mut(|cache| {
        cache.backends.clear();
        cache.generation = None;
    });
}
