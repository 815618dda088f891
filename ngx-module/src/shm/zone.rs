//! The shared-memory zone: its header, the slab it allocates from, and the
//! per-worker status slots.
//!
//! One zone (`dynamic_balancer_zone`) holds every backend. nginx maps it at the
//! same address in the master and all workers, and hands it over unchanged to
//! the next cycle on `nginx -s reload` when its name and size are unchanged,
//! so the configuration survives a reload with no re-POST.

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

use ngx::allocator::{AllocError, Allocator};
use ngx::core::SlabPool;
use ngx::ffi::{ngx_int_t, ngx_shm_zone_t, NGX_ERROR, NGX_LOG_EMERG, NGX_LOG_NOTICE, NGX_OK};
use ngx::ngx_log_error;

use lua_compat::shm_rwlock::ShmRwLock;

use crate::nginx::guard::ffi_guard;
use crate::shm::index::{Blob, Index};
use lua_compat::endpoint_state::EndpointTable;

/// Changes whenever the layout of anything in the zone changes, so that a new
/// module never reads a zone written by an incompatible one across a reload.
const ZONE_MAGIC: u64 = 0x6479_6e62_616c_0008; // "dynbal" v8

/// Status slots, indexed by `ngx_worker`. More workers than this are still
/// served; only the first `MAX_WORKERS` appear in `/configuration/status`.
pub const MAX_WORKERS: usize = 256;

/// The root object of the zone, stored at `shpool->data`.
#[repr(C)]
pub struct ZoneHeader {
    magic: u64,
    /// Bumped by every successful write, under the index write lock.
    pub generation: AtomicU64,
    pub backends: AtomicU64,
    pub endpoints: AtomicU64,
    /// Sorted backend blobs; readers copy out under the read lock. The lock
    /// recovers from a worker that dies holding it.
    pub index: ShmRwLock<Index>,
    /// Endpoints of the current backends that the endpoint table could not
    /// take (it was full): they route without shared state.
    pub untracked: AtomicU64,
    /// Backends with DNS-name endpoints (`ExternalName`), re-resolved
    /// periodically.
    pub resolving: AtomicU64,
    /// Shared per-endpoint state; its slots grow with what the zone holds.
    pub table: *mut EndpointTable,
    pub workers: [WorkerSlot; MAX_WORKERS],
    /// Certificates by id and the host → id map; written by
    /// [`crate::tls::store`], read at handshakes through each worker's cache.
    pub certs: ShmRwLock<CertIndex>,
    /// Bumped by every certificate or servers write, under the certs write
    /// lock; separate from `generation` so backend writes never make a
    /// worker re-check its certificates.
    pub cert_generation: AtomicU64,
    /// Bumped by every route table write ([`CertIndex::routes`]), under
    /// the certs write lock, so a worker compiles the table again only
    /// when it changed.
    pub route_generation: AtomicU64,
    /// The state file's last write, in the zone so that every worker's
    /// `/configuration/status` tells the same (see [`StateFileRecord`]).
    pub state_file: StateFileRecord,
}

/// What the state file (`dynamic_balancer_state`) holds and how its last
/// write went. Workers update it under the file's lock.
#[repr(C)]
pub struct StateFileRecord {
    /// The zone generation whose backends the file holds; 0 until this
    /// zone wrote or restored it.
    pub generation: AtomicU64,
    /// The failed step (`lua_compat::atomic_file::Step as u32`) and errno
    /// of the last attempt; 0 after a success.
    pub failed_step: AtomicU32,
    pub errno: AtomicI32,
    /// How long the last successful write took, in microseconds.
    pub write_us: AtomicU64,
}

/// Whether this cycle's `init_zone` created the zone (a start, or a reload
/// that changed its size) rather than adopting the previous cycle's: only
/// a new zone is filled from the state file. nginx configures cycles in the
/// master, on one thread, one at a time.
static CREATED: AtomicBool = AtomicBool::new(false);

/// Whether the zone of the cycle being configured is new; read once, in
/// `init_module`, after `init_zone` ran.
pub fn take_created() -> bool {
    CREATED.swap(false, Ordering::Relaxed)
}

/// The certificate side of the zone.
#[repr(C)]
pub struct CertIndex {
    /// One blob per certificate: name = id, json = its `CertificateInfo`,
    /// runtime = the DER payload (with the key: never served by the API).
    pub certs: Index,
    /// The servers map: one blob, json = `{host: id}`; null when empty.
    pub servers: *mut Blob,
    /// The Gateway API route table (`PUT /configuration/routes`): one blob,
    /// json = the validated table; null when none was pushed. Written by
    /// [`crate::shm::routes`]. It shares this lock rather than having its
    /// own: a lock's reader slots cost kilobytes of a zone that may be
    /// 128k, and both are read only when their generation moved.
    pub routes: *mut Blob,
}

/// What one worker reports: its pid and the generation it routes by.
#[repr(C)]
pub struct WorkerSlot {
    pub pid: AtomicI64,
    pub generation: AtomicU64,
}

/// A handle to the zone: its header and its slab pool.
#[derive(Clone)]
pub struct Zone {
    header: NonNull<ZoneHeader>,
    slab: SlabPool,
    size: usize,
}

// SAFETY: the zone lives in shared memory for the whole life of the process;
// all mutable state in it is atomic or behind the slab mutex or the index
// rwlock, both of which are process- and thread-safe.
unsafe impl Send for Zone {}
// SAFETY: as for `Send`: `&Zone` only reads the header's atomics and locks,
// and allocates under the slab mutex.
unsafe impl Sync for Zone {}

impl Zone {
    /// The zone of an initialised `ngx_shm_zone_t`.
    ///
    /// # Safety
    /// `shm_zone` must be this module's zone, after [`init_zone`] succeeded.
    pub unsafe fn from_shm_zone(shm_zone: &ngx_shm_zone_t) -> Option<Zone> {
        Some(Zone {
            header: NonNull::new(shm_zone.data.cast())?,
            // SAFETY: `shm_zone` is our zone after init_zone (this function's
            // contract), mapped for the rest of the worker's life.
            slab: unsafe { SlabPool::from_shm_zone(shm_zone) }?,
            size: shm_zone.shm.size,
        })
    }

    pub fn header(&self) -> &ZoneHeader {
        // SAFETY: the header was initialised by init_zone and is never freed.
        unsafe { self.header.as_ref() }
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes in use: the zone size minus its free pages.
    pub fn used(&self) -> usize {
        // SAFETY: ngx_pagesize is set at startup; pfree is a plain counter and a
        // racy read only skews a statistic.
        let free = self.slab.as_ref().pfree * unsafe { ngx::ffi::ngx_pagesize };
        self.size.saturating_sub(free)
    }

    /// Takes the slab mutex. Writers hold it for their whole change, which
    /// also serialises writers against each other.
    pub fn lock_slab(&self) -> SlabGuard {
        SlabGuard {
            locked: self.slab.lock(),
        }
    }
}

/// Allocation from the zone while its mutex is held.
pub struct SlabGuard {
    locked: ngx::core::slab::LockedSlabPool,
}

impl SlabGuard {
    /// Allocates `size` bytes aligned to 8, or `None` when the zone is full.
    pub fn alloc(&self, size: usize) -> Option<NonNull<u8>> {
        let layout = std::alloc::Layout::from_size_align(size.max(1), 8).ok()?;
        match self.locked.allocate(layout) {
            Ok(p) => Some(p.cast()),
            Err(AllocError) => None,
        }
    }

    /// Frees what [`SlabGuard::alloc`] returned.
    ///
    /// # Safety
    /// `p` came from `alloc(size)` on this zone and is not used afterwards.
    pub unsafe fn free(&self, p: NonNull<u8>, size: usize) {
        // SAFETY: `alloc(size)` built this very layout without error, so the
        // size and alignment are valid (this function's contract).
        let layout = unsafe { std::alloc::Layout::from_size_align_unchecked(size.max(1), 8) };
        // SAFETY: `p` came from this zone's slab with `layout` and is not used
        // again (this function's contract); the mutex is held.
        unsafe { self.locked.deallocate(p, layout) };
    }
}

/// `shm_zone->init`: creates the header in a new zone, or adopts the one the
/// previous cycle left (reload), refusing an incompatible layout. nginx calls
/// it in the master, once per cycle, with the live, freshly mapped zone and
/// the previous cycle's `data` for it (or null).
pub unsafe extern "C" fn init_zone(shm_zone: *mut ngx_shm_zone_t, old_data: *mut std::ffi::c_void) -> ngx_int_t {
    ffi_guard("zone init", NGX_ERROR as ngx_int_t, || {
        // SAFETY: nginx passes its live zone, which nothing else uses during
        // the call (the master configures on one thread, before workers).
        let shm_zone = unsafe { &mut *shm_zone };
        // SAFETY: ngx_cycle is set before any configuration runs, and its
        // log lives as long as it.
        let log = unsafe { (*ngx::ffi::ngx_cycle).log };
        CREATED.store(false, Ordering::Relaxed);
        if !old_data.is_null() {
            // SAFETY: a non-null `old_data` is what init_zone stored last
            // cycle: the header, at the start of the same mapping, which
            // nginx keeps when the zone's name and size are unchanged.
            if unsafe { (*old_data.cast::<ZoneHeader>()).magic } != ZONE_MAGIC {
                ngx_log_error!(
                    NGX_LOG_EMERG,
                    log,
                    "dynamic_balancer_zone was created by an incompatible module version; restart nginx or change the zone size"
                );
                return NGX_ERROR as ngx_int_t;
            }
            shm_zone.data = old_data;
            return NGX_OK as ngx_int_t;
        }
        let slab: *mut ngx::ffi::ngx_slab_pool_t = shm_zone.shm.addr.cast();
        // SAFETY: nginx initialised the mapping's start as the zone's slab
        // pool before calling init; a non-null `data` there is a header an
        // earlier init_zone allocated in the same zone.
        if unsafe { !(*slab).data.is_null() && (*(*slab).data.cast::<ZoneHeader>()).magic == ZONE_MAGIC } {
            // shm.exists (Windows): the zone outlived the process.
            // SAFETY: `slab` is the zone's initialised slab pool (see above).
            shm_zone.data = unsafe { (*slab).data };
            return NGX_OK as ngx_int_t;
        }
        // We answer 507 ourselves; nginx's own "no memory" alert would be noise.
        // SAFETY: `slab` is the zone's initialised slab pool, which no worker
        // uses yet (init runs in the master before forking).
        unsafe { (*slab).set_log_nomem(0) };
        // SAFETY: called from the zone's init callback, in the master: the
        // zone is initialised and mapped (SlabPool::from_shm_zone's terms).
        let pool = unsafe { SlabPool::from_shm_zone(shm_zone) }.expect("zone has a slab pool");
        let header = match pool.lock().allocate(std::alloc::Layout::new::<ZoneHeader>()) {
            Ok(p) => p.cast::<ZoneHeader>().as_ptr(),
            Err(_) => {
                ngx_log_error!(NGX_LOG_EMERG, log, "dynamic_balancer_zone is too small for its header");
                return NGX_ERROR as ngx_int_t;
            }
        };
        // SAFETY: `header` is a fresh slab allocation with the size and
        // alignment of a ZoneHeader; all-zero is valid for each of its fields.
        unsafe { ptr::write_bytes(header, 0, 1) };
        // SAFETY: the header was zeroed above, which is the lock's unlocked
        // state, and `index` is in bounds of that live allocation.
        unsafe { ShmRwLock::init_in_place(ptr::addr_of_mut!((*header).index), Index::empty()) };
        // SAFETY: as above, for the certificates' lock.
        unsafe {
            ShmRwLock::init_in_place(
                ptr::addr_of_mut!((*header).certs),
                CertIndex {
                    certs: Index::empty(),
                    servers: ptr::null_mut(),
                    routes: ptr::null_mut(),
                },
            )
        };
        let table_layout = std::alloc::Layout::new::<EndpointTable>();
        let table = match pool.lock().allocate(table_layout) {
            Ok(p) => {
                let table = p.cast::<EndpointTable>().as_ptr();
                // SAFETY: `p` is a fresh slab allocation of the table's size.
                unsafe { ptr::write_bytes(table.cast::<u8>(), 0, table_layout.size()) };
                // SAFETY: `table` points at zeroed bytes for a table, 8-aligned,
                // in the shared zone, which stays mapped for the process.
                unsafe { EndpointTable::init(table) };
                table
            }
            Err(_) => {
                ngx_log_error!(
                    NGX_LOG_EMERG,
                    log,
                    "dynamic_balancer_zone is too small for its endpoint table"
                );
                return NGX_ERROR as ngx_int_t;
            }
        };
        // SAFETY: `header` is the live, zeroed allocation above.
        unsafe { (*header).table = table };
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log,
            "dynamic_balancer_zone: {} bytes; shared endpoint state grows with it, {} bytes per endpoint",
            shm_zone.shm.size,
            std::mem::size_of::<lua_compat::endpoint_state::Slot>()
        );
        // SAFETY: `header` is the live, initialised allocation above; `slab`
        // is the zone's slab pool, which no worker uses yet.
        unsafe {
            (*header).magic = ZONE_MAGIC;
            (*slab).data = header.cast();
        }
        shm_zone.data = header.cast();
        CREATED.store(true, Ordering::Relaxed);
        NGX_OK as ngx_int_t
    })
}

impl ZoneHeader {
    /// The shared per-endpoint state.
    pub fn table(&self) -> &EndpointTable {
        // SAFETY: init_zone always sets it (or fails), and it is never freed.
        unsafe { &*self.table }
    }

    /// Records that worker `index` (pid `pid`) routes by `generation`.
    pub fn report(&self, index: usize, pid: i64, generation: u64) {
        if let Some(slot) = self.workers.get(index) {
            slot.pid.store(pid, Ordering::Relaxed);
            slot.generation.store(generation, Ordering::Release);
        }
    }

    /// Clears worker `index`'s slot if `pid` still owns it (a newer worker
    /// with the same index may already have taken it over).
    pub fn retire(&self, index: usize, pid: i64) {
        if let Some(slot) = self.workers.get(index) {
            let _ = slot.pid.compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

/// The endpoint table takes its chunks and index from the zone, under the
/// mutex the writer holds.
impl lua_compat::endpoint_state::ZoneMemory for SlabGuard {
    fn alloc(&self, size: usize) -> Option<NonNull<u8>> {
        SlabGuard::alloc(self, size)
    }

    unsafe fn free(&self, p: NonNull<u8>, size: usize) {
        // SAFETY: `p` came from `alloc(size)` on this zone (the trait's contract).
        unsafe { SlabGuard::free(self, p, size) }
    }
}
