//! The metrics zone (`dynamic_balancer_metrics_zone`): request counters in
//! shared memory, apart from the backends' zone so that counting can never
//! take the room a backend push needs.
//!
//! Layout: a header with a hash table of series (a location's label text,
//! plus the canary), each series with a list of cells, one per (worker,
//! method, status) that has seen a request. A worker finds its cell
//! under the slab mutex once, then keeps the pointer: counting is a dozen
//! relaxed atomic adds with no lock, and each worker adds only to its own
//! cells (its slice), so workers never contend on a cache line.
//!
//! A reload keeps the zone (same name and size), so counts carry on: the
//! new worker number N finds and shares the cells of the old worker N.
//!
//! Series of locations that a new configuration no longer declares (a
//! deleted Ingress) are *retired* at that configuration's load, and freed at
//! a later load, once no worker of an older configuration (which could
//! still hold pointers to their cells) is alive. Workers register their pid
//! and configuration epoch here for that. The API shows the series that the
//! newest configuration with a live worker declared: a deleted Ingress's
//! disappear as soon as the new workers start, and a reload that fails
//! after the zone's init (it has no workers) hides nothing.

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU64, Ordering};

use lua_compat::metrics::{Counters, CountersSnapshot};
use ngx::allocator::{AllocError, Allocator};
use ngx::core::SlabPool;
use ngx::ffi::{ngx_int_t, ngx_shm_zone_t, NGX_ERROR, NGX_LOG_EMERG, NGX_LOG_NOTICE, NGX_OK};
use ngx::ngx_log_error;

use crate::nginx::guard::ffi_guard;

/// Changes with any change of the layout below.
const MAGIC: u64 = 0x6462_6d65_7472_0005; // "dbmetr" v5: exact statuses, 7 histograms, span counters
/// Hash buckets for series; chains stay short up to tens of thousands.
const BUCKETS: usize = 4096;
/// Worker processes (current and still-draining ones) that can register:
/// 128 workers over 32 configurations still draining. A worker that finds
/// no slot does not count (and says so in the error log).
pub const LIVE_SLOTS: usize = 4096;
/// Cells one worker may have in one series: the method and status pairs
/// its clients and backends produce (a busy location sees 10 to 20).
/// Beyond, requests of a new pair are not counted
/// (`metrics_uncounted_requests`), so that a backend answering every code
/// cannot fill the zone that counts everyone else.
pub const MAX_CELLS_PER_WORKER: usize = 64;

#[repr(C)]
struct Header {
    magic: u64,
    /// Bumped by every configuration load (in the master, at zone init).
    epoch: AtomicU64,
    /// Requests not counted because no cell could be allocated.
    uncounted: AtomicU64,
    series: AtomicU64,
    /// Tracing's span counters, summed over workers.
    otel: OtelCounters,
    live: [Live; LIVE_SLOTS],
    buckets: [AtomicPtr<Series>; BUCKETS],
}

/// What happened to the spans of sampled requests (see `crate::otel`):
/// every worker's request path adds `queued` or `dropped`, its exporter
/// thread `exported` or `failed`. Plain atomics in shared memory, so the
/// exporter threads, which call nothing of nginx's, may add to them.
#[repr(C)]
#[derive(Default)]
pub struct OtelCounters {
    pub queued: AtomicU64,
    /// The worker's queue was full (the collector is slow or away).
    pub dropped: AtomicU64,
    pub exported: AtomicU64,
    /// The export failed, or the collector refused them.
    pub failed: AtomicU64,
}

impl OtelCounters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// (queued, dropped, exported, failed).
    pub fn snapshot(&self) -> [u64; 4] {
        [&self.queued, &self.dropped, &self.exported, &self.failed].map(|c| c.load(Ordering::Relaxed))
    }
}

/// A registered worker: its pid and the epoch of its configuration.
#[repr(C)]
struct Live {
    pid: AtomicI64,
    epoch: AtomicU64,
}

/// One series. Its label text follows the struct in the same allocation.
#[repr(C)]
pub struct Series {
    next: *mut Series,
    hash: u64,
    /// The hash of the location's part of the text (what configurations
    /// declare).
    loc_hash: u64,
    /// The epoch that retired it; 0 while declared.
    retired: u64,
    /// The newest epoch whose configuration declared it (or whose worker
    /// created it).
    declared: u64,
    cells: *mut Cell,
    len: usize,
}

#[repr(C)]
struct Cell {
    next: *mut Cell,
    worker: u32,
    method: u16,
    status: u16,
    counters: Counters,
}

/// This worker registered, so it may count (see [`start_worker`]).
static REGISTERED: AtomicBool = AtomicBool::new(false);

/// Whether this worker counts requests.
pub fn registered() -> bool {
    REGISTERED.load(Ordering::Relaxed)
}

/// Registers this worker (pid `pid`, configuration `epoch`) before it
/// counts anything; false if the zone's registration slots are full.
pub fn start_worker(zone: &MetricsZone, pid: i64, epoch: u64) -> bool {
    let ok = zone.register(pid, epoch);
    REGISTERED.store(ok, Ordering::Relaxed);
    ok
}

/// Gives the registration up as the worker exits.
pub fn stop_worker(zone: &MetricsZone, pid: i64) {
    REGISTERED.store(false, Ordering::Relaxed);
    zone.deregister(pid);
}

/// What the configuration passes to the zone's init: the location label
/// hashes it declares; init writes back the configuration's epoch.
#[derive(Default)]
pub struct ZoneCtx {
    pub declared: Vec<u64>,
    pub epoch: u64,
}

/// A handle to the metrics zone.
#[derive(Clone)]
pub struct MetricsZone {
    header: NonNull<Header>,
    slab: SlabPool,
    size: usize,
}

/// A series' summed counters, for the API.
pub struct Collected {
    pub labels: String,
    pub method: usize,
    pub status: u16,
    pub counters: CountersSnapshot,
}

impl MetricsZone {
    /// # Safety
    /// `shm_zone` is the metrics zone, after [`init_zone`] succeeded.
    pub unsafe fn from_shm_zone(shm_zone: &ngx_shm_zone_t) -> Option<MetricsZone> {
        // SAFETY: `shm_zone` is our initialised zone (this function's
        // contract), mapped for the rest of the process's life.
        let slab = unsafe { SlabPool::from_shm_zone(shm_zone) }?;
        // SAFETY: init_zone stored the header in the slab pool's `data`.
        let header = NonNull::new(unsafe { (*shm_zone.shm.addr.cast::<ngx::ffi::ngx_slab_pool_t>()).data }.cast())?;
        Some(MetricsZone {
            header,
            slab,
            size: shm_zone.shm.size,
        })
    }

    fn header(&self) -> &Header {
        // SAFETY: initialised by init_zone and never freed.
        unsafe { self.header.as_ref() }
    }

    /// The span counters, which live as long as the process's mapping of
    /// the zone, that is, until it exits.
    pub fn otel_counters(&self) -> &'static OtelCounters {
        // SAFETY: the header is initialised by init_zone and never freed or
        // unmapped while the process runs.
        unsafe { &(*self.header.as_ptr()).otel }
    }

    /// Registers this process as a worker of configuration `epoch`; false
    /// when every slot is taken, even after releasing the slots of workers
    /// that died without deregistering (the worker must then not count,
    /// since nothing would keep its series alive).
    pub fn register(&self, pid: i64, epoch: u64) -> bool {
        let _lock = self.slab.lock();
        for sweep in [false, true] {
            if sweep {
                self.release_dead();
            }
            for slot in &self.header().live {
                if slot.pid.load(Ordering::Relaxed) == 0 {
                    slot.epoch.store(epoch, Ordering::Relaxed);
                    slot.pid.store(pid, Ordering::Release);
                    return true;
                }
            }
        }
        false
    }

    /// Frees the slots of registered processes that no longer exist (a
    /// crashed worker never deregisters). The caller holds the slab mutex.
    fn release_dead(&self) {
        for slot in &self.header().live {
            let pid = slot.pid.load(Ordering::Relaxed);
            if pid == 0 {
                continue;
            }
            // SAFETY: signal 0 only checks that the process exists. The
            // master reaps its children, so a dead worker is gone (ESRCH);
            // a reused pid only keeps a slot.
            let gone = unsafe { libc::kill(pid as libc::pid_t, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone {
                slot.pid.store(0, Ordering::Relaxed);
            }
        }
    }

    /// The newest configuration epoch among registered workers (0 when
    /// none). The caller holds the slab mutex.
    fn newest_live_epoch(&self) -> u64 {
        self.header()
            .live
            .iter()
            .filter(|slot| slot.pid.load(Ordering::Relaxed) != 0)
            .map(|slot| slot.epoch.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
    }

    /// Frees this worker's registration as it exits.
    pub fn deregister(&self, pid: i64) {
        let _lock = self.slab.lock();
        for slot in &self.header().live {
            if slot.pid.load(Ordering::Relaxed) == pid {
                slot.pid.store(0, Ordering::Release);
            }
        }
    }

    /// The series with label text `text` (whose location part hashes to
    /// `loc_hash`), created if new by a worker of configuration `epoch`;
    /// `None` when the zone is full. Finding a series changes nothing: only
    /// a configuration's load declares or retires.
    pub fn series(&self, text: &[u8], loc_hash: u64, epoch: u64) -> Option<NonNull<Series>> {
        let hash = lua_compat::metrics::labels::label_hash(text);
        let locked = self.slab.lock();
        let bucket = &self.header().buckets[hash as usize % BUCKETS];
        let mut p = bucket.load(Ordering::Relaxed);
        // SAFETY: chains are only changed under the slab mutex, held here;
        // every node is a live Series written by this function.
        while let Some(s) = unsafe { p.as_mut() } {
            // SAFETY: as above; the text follows the struct.
            if s.hash == hash && unsafe { series_text(s) } == text {
                return NonNull::new(p);
            }
            p = s.next;
        }
        let layout = std::alloc::Layout::from_size_align(size_of::<Series>() + text.len(), 8).ok()?;
        let new = locked.allocate(layout).ok()?.cast::<Series>().as_ptr();
        // SAFETY: `new` is a fresh allocation of `layout`: room for the
        // struct and the text right after it.
        unsafe {
            new.write(Series {
                next: bucket.load(Ordering::Relaxed),
                hash,
                loc_hash,
                retired: 0,
                declared: epoch,
                cells: ptr::null_mut(),
                len: text.len(),
            });
            ptr::copy_nonoverlapping(text.as_ptr(), new.add(1).cast::<u8>(), text.len());
        }
        bucket.store(new, Ordering::Release);
        self.header().series.fetch_add(1, Ordering::Relaxed);
        NonNull::new(new)
    }

    /// Worker `worker`'s counters for `series`, `method` and `status`
    /// (see `status_index`), created if new; `None` when the zone is full
    /// or the worker has [`MAX_CELLS_PER_WORKER`] cells in the series.
    ///
    /// # Safety
    /// `series` came from [`MetricsZone::series`] in this process, whose
    /// registration keeps it from being freed.
    pub unsafe fn cell(
        &self,
        series: NonNull<Series>,
        worker: u32,
        method: u16,
        status: u16,
    ) -> Option<&'static Counters> {
        let locked = self.slab.lock();
        // SAFETY: the series is live (this function's contract); its cell
        // list changes only under the slab mutex, held here.
        let s = unsafe { &mut *series.as_ptr() };
        let mut p = s.cells;
        let mut mine = 0;
        // SAFETY: every node is a live Cell written below, under the mutex.
        while let Some(c) = unsafe { p.as_ref() } {
            if c.worker == worker {
                if c.method == method && c.status == status {
                    return Some(&c.counters);
                }
                mine += 1;
            }
            p = c.next;
        }
        // A backend answering every code from 100 to 599 to every method
        // would make 8,500 cells per worker of one series: the cap keeps
        // one tenant's backend from filling the zone that counts everyone.
        if mine >= MAX_CELLS_PER_WORKER {
            return None;
        }
        let new = match locked.allocate(std::alloc::Layout::new::<Cell>()) {
            Ok(p) => p.cast::<Cell>().as_ptr(),
            Err(AllocError) => return None,
        };
        // SAFETY: a fresh allocation with Cell's layout; all-zero counters
        // are empty atomics.
        unsafe {
            ptr::write_bytes(new, 0, 1);
            (*new).next = s.cells;
            (*new).worker = worker;
            (*new).method = method;
            (*new).status = status;
        }
        s.cells = new;
        // SAFETY: cells are freed only with their series, which this
        // process's registration keeps alive for the rest of its life.
        Some(unsafe { &(*new).counters })
    }

    /// Counts a request that could not be counted.
    pub fn uncounted(&self) {
        self.header().uncounted.fetch_add(1, Ordering::Relaxed);
    }

    /// Every series the newest live configuration declared, summed over
    /// workers, in a stable order.
    pub fn collect(&self) -> Vec<Collected> {
        let mut out = Vec::new();
        let _lock = self.slab.lock();
        let newest = self.newest_live_epoch();
        for bucket in &self.header().buckets {
            let mut p = bucket.load(Ordering::Relaxed);
            // SAFETY: chains and cell lists change only under the slab
            // mutex, held here; every node is live.
            while let Some(s) = unsafe { p.as_ref() } {
                if s.declared >= newest {
                    // SAFETY: as above; the text follows the struct and was
                    // copied from a `&[u8]` of valid UTF-8 label text.
                    let labels = String::from_utf8_lossy(unsafe { series_text(s) }).into_owned();
                    let mut per: Vec<Collected> = Vec::new();
                    let mut c = s.cells;
                    // SAFETY: as above.
                    while let Some(cell) = unsafe { c.as_ref() } {
                        let (method, status) = (usize::from(cell.method), cell.status);
                        let snap = cell.counters.snapshot();
                        match per.iter_mut().find(|e| e.method == method && e.status == status) {
                            Some(e) => e.counters.add(&snap),
                            None => per.push(Collected {
                                labels: labels.clone(),
                                method,
                                status,
                                counters: snap,
                            }),
                        }
                        c = cell.next;
                    }
                    out.extend(per);
                }
                p = s.next;
            }
        }
        out.sort_by(|a, b| (&a.labels, a.method, a.status).cmp(&(&b.labels, b.method, b.status)));
        out
    }

    /// (series in the zone, uncounted requests, zone size, bytes used).
    pub fn stats(&self) -> (u64, u64, u64, u64) {
        let h = self.header();
        // `pfree` changes under the slab mutex.
        let pages = {
            let _lock = self.slab.lock();
            self.slab.as_ref().pfree
        };
        // SAFETY: ngx_pagesize is set at startup and never changes.
        let free = pages * unsafe { ngx::ffi::ngx_pagesize };
        (
            h.series.load(Ordering::Relaxed),
            h.uncounted.load(Ordering::Relaxed),
            self.size as u64,
            self.size.saturating_sub(free) as u64,
        )
    }
}

/// The label text stored after `s`.
///
/// # Safety
/// `s` is a live series written by [`MetricsZone::series`].
unsafe fn series_text<'a>(s: &Series) -> &'a [u8] {
    // SAFETY: `series` wrote `len` bytes right after the struct, in the same
    // allocation, which lives as long as the series.
    unsafe { std::slice::from_raw_parts(ptr::from_ref(s).add(1).cast::<u8>(), s.len) }
}

/// `shm_zone->init` of the metrics zone: creates the header, or adopts the
/// previous cycle's (reload) and then retires the series this
/// configuration no longer declares and frees those no live worker can
/// hold. nginx calls it in the master, once per configuration load, with
/// the live zone, whose `data` is the new configuration's [`ZoneCtx`].
pub unsafe extern "C" fn init_zone(shm_zone: *mut ngx_shm_zone_t, _old_data: *mut std::ffi::c_void) -> ngx_int_t {
    ffi_guard("metrics zone init", NGX_ERROR as ngx_int_t, || {
        // SAFETY: nginx passes its live zone; the master configures on one
        // thread, before any worker of this configuration exists.
        let shm_zone = unsafe { &mut *shm_zone };
        // SAFETY: ngx_cycle is set before any configuration runs.
        let log = unsafe { (*ngx::ffi::ngx_cycle).log };
        // SAFETY: the directive set `data` to the configuration's ZoneCtx,
        // in its pool, which lives through this call.
        let Some(ctx) = (unsafe { shm_zone.data.cast::<ZoneCtx>().as_mut() }) else {
            return NGX_ERROR as ngx_int_t;
        };
        let slab: *mut ngx::ffi::ngx_slab_pool_t = shm_zone.shm.addr.cast();
        // SAFETY: nginx initialised the mapping's start as the slab pool.
        let existing = unsafe { (*slab).data.cast::<Header>() };
        // SAFETY: a non-null `data` is a header an earlier init stored.
        if !existing.is_null() && unsafe { (*existing).magic } != MAGIC {
            ngx_log_error!(
                NGX_LOG_EMERG,
                log,
                "dynamic_balancer_metrics_zone was created by an incompatible module version; restart nginx or change its size"
            );
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: called from the zone's init callback, in the master.
        let Some(pool) = (unsafe { SlabPool::from_shm_zone(shm_zone) }) else {
            return NGX_ERROR as ngx_int_t;
        };
        let header = if existing.is_null() {
            // SAFETY: the fresh slab pool, which no worker uses yet.
            unsafe { (*slab).set_log_nomem(0) };
            let Ok(p) = pool.lock().allocate(std::alloc::Layout::new::<Header>()) else {
                ngx_log_error!(
                    NGX_LOG_EMERG,
                    log,
                    "dynamic_balancer_metrics_zone is too small for its header ({} bytes)",
                    size_of::<Header>()
                );
                return NGX_ERROR as ngx_int_t;
            };
            let header = p.cast::<Header>().as_ptr();
            // SAFETY: a fresh allocation of a Header; all-zero is valid for
            // every field (atomics and null pointers).
            unsafe {
                ptr::write_bytes(header, 0, 1);
                (*header).magic = MAGIC;
                (*slab).data = header.cast();
            }
            ngx_log_error!(
                NGX_LOG_NOTICE,
                log,
                "dynamic_balancer_metrics_zone: {} bytes",
                shm_zone.shm.size
            );
            header
        } else {
            existing
        };
        let zone = MetricsZone {
            // SAFETY: `header` is non-null: allocated above or found.
            header: unsafe { NonNull::new_unchecked(header) },
            slab: pool,
            size: shm_zone.shm.size,
        };
        ctx.epoch = zone.header().epoch.fetch_add(1, Ordering::Relaxed) + 1;
        ctx.declared.sort_unstable();
        ctx.declared.dedup();
        let freed = zone.retire_and_free(&ctx.declared, ctx.epoch);
        if freed > 0 {
            ngx_log_error!(
                NGX_LOG_NOTICE,
                log,
                "dynamic_balancer_metrics_zone: freed {} series of locations no longer configured",
                freed
            );
        }
        NGX_OK as ngx_int_t
    })
}

impl MetricsZone {
    /// Retires series not in `declared` (sorted) at `epoch`, and frees the
    /// retired series that no live worker can reach: those retired at an
    /// epoch no older worker remains from. Returns how many were freed.
    fn retire_and_free(&self, declared: &[u64], epoch: u64) -> usize {
        let locked = self.slab.lock();
        // A reused pid only delays a free.
        self.release_dead();
        let oldest_live = self
            .header()
            .live
            .iter()
            .filter(|slot| slot.pid.load(Ordering::Relaxed) != 0)
            .map(|slot| slot.epoch.load(Ordering::Relaxed))
            .min()
            .unwrap_or(u64::MAX);
        let mut freed = 0;
        for bucket in &self.header().buckets {
            let mut prev: *mut Series = ptr::null_mut();
            let mut p = bucket.load(Ordering::Relaxed);
            // SAFETY: chains change only under the slab mutex, held here;
            // every node is a live Series, and the ones unlinked here are
            // freed after unlinking and never reached again.
            while let Some(s) = unsafe { p.as_mut() } {
                let next = s.next;
                if declared.binary_search(&s.loc_hash).is_ok() {
                    s.retired = 0;
                    s.declared = epoch;
                } else if s.retired == 0 {
                    s.retired = epoch;
                }
                if s.retired != 0 && oldest_live >= s.retired {
                    // No live worker belongs to a configuration that
                    // declared it: nothing holds its cells.
                    if prev.is_null() {
                        bucket.store(next, Ordering::Relaxed);
                    } else {
                        // SAFETY: `prev` is the live node before `s`.
                        unsafe { (*prev).next = next };
                    }
                    // SAFETY: `s` and its cells are unlinked; they came from
                    // this slab with these layouts.
                    unsafe { free_series(&locked, s) };
                    self.header().series.fetch_sub(1, Ordering::Relaxed);
                    freed += 1;
                } else {
                    prev = p;
                }
                p = next;
            }
        }
        freed
    }
}

/// Frees a series and its cells.
///
/// # Safety
/// `s` is unlinked, allocated by [`MetricsZone::series`] from this slab,
/// and no process can reach it or its cells any more.
unsafe fn free_series(locked: &ngx::core::slab::LockedSlabPool, s: &mut Series) {
    let mut c = s.cells;
    while let Some(cell) = NonNull::new(c) {
        // SAFETY: a live cell of `s`, read before it is freed.
        c = unsafe { cell.as_ref().next };
        // SAFETY: allocated with Cell's layout from this slab; unreachable.
        unsafe { locked.deallocate(cell.cast(), std::alloc::Layout::new::<Cell>()) };
    }
    let layout = std::alloc::Layout::from_size_align(size_of::<Series>() + s.len, 8).expect("built before");
    // SAFETY: allocated with this layout from this slab; unreachable.
    unsafe { locked.deallocate(NonNull::from(s).cast(), layout) };
}
