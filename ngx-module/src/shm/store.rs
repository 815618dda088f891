//! The backends in shared memory: one immutable blob per backend and a sorted
//! index of blobs.
//!
//! A write builds every new blob and the new index first, then swaps the index
//! in under the write lock and bumps the generation, then frees what the old
//! index alone referenced. A write that cannot allocate frees what it built and
//! changes nothing, so a full zone never leaves a half-applied configuration.
//! A backend whose bytes did not change keeps its blob and version, so workers
//! re-decode only what changed.

use std::mem;
use std::ptr::{self, NonNull};
use std::sync::atomic::Ordering;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use lua_compat::algorithm::Algorithm;
use lua_compat::runtime::{Prepared, RuntimeBackend};

use lua_compat::endpoint_state::share::{self, Held};
use lua_compat::endpoint_state::TableWriter;

use crate::shm::index::{Blob, Index};
use crate::shm::zone::{SlabGuard, Zone};

/// One write to the store.
pub enum Change {
    /// `POST /configuration/backends`: the full set.
    ReplaceAll(Vec<Prepared>),
    /// `PUT /configuration/backends/{name}`.
    Put(Prepared),
    /// `DELETE /configuration/backends/{name}`.
    Delete(String),
    /// A periodic re-resolution of a backend's DNS names: applied only if
    /// the backend still has the blob of version `expected`, so it never
    /// undoes a write that came in meanwhile.
    Refresh { item: Prepared, expected: u64 },
}

/// A write that took effect.
#[derive(Debug, Clone, Copy)]
pub struct Applied {
    pub generation: u64,
    /// For `Put`: the backend did not exist before.
    pub created: bool,
    /// Endpoints that route without shared state because the endpoint
    /// table is full.
    pub untracked: u64,
}

/// A write that was refused; the store is unchanged.
#[derive(Debug, Clone)]
pub enum StoreError {
    /// Not enough free memory in the zone for the new state (old and new
    /// blobs must fit side by side until the swap).
    ZoneFull {
        needed: usize,
        zone: usize,
    },
    NotFound,
    /// A `Refresh` found a newer write, or nothing changed; nothing to do.
    Superseded,
}

/// Applies `change` atomically. Runs in a thread-pool thread or the event
/// loop; it touches only shared memory.
pub fn apply(zone: &Zone, change: Change) -> Result<Applied, StoreError> {
    let slab = zone.lock_slab();
    let header = zone.header();
    // Only writers modify the index and they are serialised by the slab mutex,
    // so reading it here without the read lock is safe.
    // SAFETY: `data_ptr` of the zone's live lock; the index is modified only
    // by writers, which hold the slab mutex (`slab`) as this one does, so no
    // write races this shared borrow.
    let old: &Index = unsafe { &*header.index.data_ptr() };
    let mut generation = header.generation.load(Ordering::Relaxed) + 1;

    let mut built = Built::new(&slab);
    let mut created = false;
    let next: Vec<NonNull<Blob>> = match change {
        Change::ReplaceAll(mut items) => {
            items.sort_unstable_by(|a, b| a.name.cmp(&b.name));
            let mut out = Vec::with_capacity(items.len());
            for item in &items {
                out.push(built.reuse_or_build(old, item, generation));
            }
            out
        }
        Change::Put(item) => {
            let mut out = old.slice().to_vec();
            let blob = built.reuse_or_build(old, &item, generation);
            match old.position(item.name.as_bytes()) {
                Ok(i) => out[i] = blob,
                Err(i) => {
                    out.insert(i, blob);
                    created = true;
                }
            }
            out
        }
        Change::Refresh { item, expected } => {
            let i = old.position(item.name.as_bytes()).map_err(|_| StoreError::Superseded)?;
            // SAFETY: blobs of the live index are valid.
            let current = unsafe { old.slice()[i].as_ref() };
            if current.version != expected {
                return Err(StoreError::Superseded);
            }
            if current.same_content(&item) {
                return Err(StoreError::Superseded);
            }
            let mut out = old.slice().to_vec();
            out[i] = built.reuse_or_build(old, &item, generation);
            out
        }
        Change::Delete(name) => {
            let i = old.position(name.as_bytes()).map_err(|_| StoreError::NotFound)?;
            let mut out = old.slice().to_vec();
            out.remove(i);
            out
        }
    };
    if next.iter().any(|b| b.as_ptr() == dangling()) {
        return Err(built.abandon(zone.size()));
    }

    // Allocate the new index before anything shared changes, so that a full
    // zone (507) leaves no trace: no blob, no endpoint state.
    let entries_size = next.len() * mem::size_of::<NonNull<Blob>>();
    let entries: *mut NonNull<Blob> = if next.is_empty() {
        ptr::null_mut()
    } else {
        match slab.alloc(entries_size) {
            Some(p) => p.as_ptr().cast(),
            None => {
                built.also_needed(entries_size);
                return Err(built.abandon(zone.size()));
            }
        }
    };

    // Count the endpoints of the backends that arrive, release those of the
    // backends that leave (freeing the slots no backend lists any more, for
    // reuse right away), then give new endpoints their state before any
    // worker can see them. A worker still routing by the old index finds a
    // freed slot gone and simply routes without it. Only the backends that
    // changed are decoded.
    let leaving = leaving(old.slice(), &next);
    let fresh: Vec<NonNull<Blob>> = built.fresh.iter().map(|(b, _)| *b).collect();
    // SAFETY: writers are serialised by the slab mutex (`slab`), and the
    // table lives in this zone, whose slab `slab` allocates from.
    let mut table = unsafe { header.table().writer(&slab) };
    let refused = update_endpoint_state(&mut table, &fresh, &leaving);
    // Endpoints the table had no room for, now or at an earlier write: track
    // them if room came back, else share the table fairly.
    let mut untracked = if refused > 0 || header.untracked.load(Ordering::Relaxed) > 0 {
        settle_endpoint_state(&mut table, &next)
    } else {
        0
    };
    header.untracked.store(untracked, Ordering::Relaxed);
    // Moves the table's epoch if an endpoint got a slot, before the index
    // swap publishes the generation that makes workers look.
    drop(table);
    if !entries.is_null() {
        // SAFETY: entries has room for next.len() pointers.
        unsafe { ptr::copy_nonoverlapping(next.as_ptr(), entries, next.len()) };
    }

    // SAFETY: every pointer in `next` is a live blob (dangling ones were refused).
    let endpoints: u64 = next.iter().map(|b| u64::from(unsafe { b.as_ref() }.endpoints)).sum();
    // SAFETY: every pointer in `next` is a live blob (dangling ones were refused).
    let resolving = next.iter().filter(|b| unsafe { b.as_ref() }.resolves).count() as u64;
    let (old_entries, old_len) = (old.entries, old.len);
    {
        let mut index = header.index.write();
        *index = Index {
            entries,
            len: next.len(),
        };
        header.backends.store(next.len() as u64, Ordering::Relaxed);
        header.endpoints.store(endpoints, Ordering::Relaxed);
        header.resolving.store(resolving, Ordering::Relaxed);
        header.generation.store(generation, Ordering::Release);
    }

    // Free what only the old index referenced.
    let freed = !leaving.is_empty();
    for blob in leaving {
        // SAFETY: no index references it any more, and readers only touch
        // blobs under the read lock, which the swap above excluded.
        unsafe { slab.free(blob.cast(), blob.as_ref().alloc_size) };
    }
    if let Some(p) = NonNull::new(old_entries) {
        // SAFETY: the old entries array is unreferenced after the swap.
        unsafe { slab.free(p.cast(), old_len * mem::size_of::<NonNull<Blob>>()) };
    }
    // The old blobs held room the table lacked while both versions were in
    // the zone: settle again now, so that a large write's moment of
    // shortage does not leave endpoints without state until the next one.
    if untracked > 0 && freed {
        // SAFETY: as above; the slab mutex is still held.
        let mut table = unsafe { header.table().writer(&slab) };
        let epoch = table.table().epoch();
        untracked = settle_endpoint_state(&mut table, &next);
        header.untracked.store(untracked, Ordering::Relaxed);
        drop(table);
        if header.table().epoch() != epoch {
            // Workers look stateless endpoints up again when the generation
            // moves: move it, with nothing else changed.
            let _index = header.index.write();
            generation += 1;
            header.generation.store(generation, Ordering::Release);
        }
    }
    Ok(Applied {
        generation,
        created,
        untracked,
    })
}

fn decoded(blob: NonNull<Blob>) -> Option<RuntimeBackend> {
    // SAFETY: a blob this write built or kept; it is alive.
    RuntimeBackend::decode(unsafe { blob.as_ref() }.runtime()).ok()
}

/// The blobs of `previous` that `next` no longer holds.
fn leaving(previous: &[NonNull<Blob>], next: &[NonNull<Blob>]) -> Vec<NonNull<Blob>> {
    let kept: HashSet<NonNull<Blob>> = next.iter().copied().collect();
    previous.iter().copied().filter(|b| !kept.contains(b)).collect()
}

/// A backend's distinct endpoint addresses, in order.
fn distinct(backend: &RuntimeBackend) -> Vec<SocketAddr> {
    let mut seen = HashSet::new();
    backend
        .endpoints
        .iter()
        .map(|e| e.addr)
        .filter(|a| seen.insert(*a))
        .collect()
}

/// Counts the endpoints of the backends that arrive (`fresh`) and releases
/// those of the backends that leave, and returns how many new endpoints the
/// zone had no room for. An EWMA backend's new endpoints start at the mean
/// score of its existing ones, so they are not flooded (Lua's slow start).
fn update_endpoint_state(
    table: &mut TableWriter<'_, SlabGuard>,
    fresh: &[NonNull<Blob>],
    leaving: &[NonNull<Blob>],
) -> u64 {
    let now = now_ms() as f64 / 1000.0;
    // Endpoints with state already are counted for their new backend first,
    // so that a backend replaced by its next version keeps them.
    let mut new: Vec<(SocketAddr, Option<f64>)> = Vec::new();
    for backend in fresh.iter().filter_map(|b| decoded(*b)) {
        let addrs = distinct(&backend);
        let slow_start = matches!(backend.algorithm, Algorithm::Ewma)
            .then(|| {
                let known: Vec<f64> = addrs
                    .iter()
                    .filter_map(|a| table.slot_of(a))
                    .map(|s| s.ewma_value())
                    .filter(|(_, touched)| *touched > 0.0)
                    .map(|(ewma, _)| ewma)
                    .collect();
                (!known.is_empty()).then(|| known.iter().sum::<f64>() / known.len() as f64)
            })
            .flatten();
        for a in addrs {
            if !table.add_ref(&a) {
                new.push((a, slow_start));
            }
        }
    }
    for backend in leaving.iter().filter_map(|b| decoded(*b)) {
        for a in distinct(&backend) {
            table.release(&a);
        }
    }
    let mut refused = 0;
    for (a, slow_start) in new {
        if !table.acquire(&a, slow_start, now) {
            // No room: the endpoint still routes, without shared state.
            refused += 1;
        }
    }
    refused
}

/// Gives a slot to every endpoint that lacks one while the zone has room,
/// then, if some still lack one, brings each backend to its fair share
/// (`lua_compat::endpoint_state::share`). Returns how many endpoints are
/// left without state. It decodes every backend, so it runs only while
/// some endpoint is untracked.
fn settle_endpoint_state(table: &mut TableWriter<'_, SlabGuard>, next: &[NonNull<Blob>]) -> u64 {
    let now = now_ms() as f64 / 1000.0;
    let backends: Vec<Vec<SocketAddr>> = next.iter().filter_map(|b| decoded(*b)).map(|b| distinct(&b)).collect();
    let mut room = true;
    for a in backends.iter().flatten() {
        if table.slot_of(a).is_none() && !(room && table.insert(a, None, now)) {
            room = false;
        }
    }
    if !room {
        // What the table holds without taking more from the zone: its
        // slots, or fewer when its index could not grow.
        let capacity = table.limit();
        let plan = share::plan(&backends, capacity, |a| match table.slot_of(a) {
            None => Held::Untracked,
            Some(s) if s.idle() => Held::Idle,
            Some(_) => Held::Busy,
        });
        for a in &plan.evict {
            table.evict(a);
        }
        for a in &plan.track {
            table.insert(a, None, now);
        }
    }
    // Recount who lists each endpoint: the counts of endpoints that were
    // untracked, or evicted, when their backends arrived are not known.
    let mut lists: HashMap<SocketAddr, u32> = HashMap::new();
    for a in backends.iter().flatten() {
        *lists.entry(*a).or_default() += 1;
    }
    for (a, n) in &lists {
        table.set_refs(a, *n);
    }
    table.retain(|a| lists.contains_key(a));
    let untracked = lists.keys().filter(|a| table.slot_of(a).is_none()).count();
    untracked as u64
}

/// CLOCK_MONOTONIC milliseconds, the clock of `ngx_current_msec`: the time
/// base of the shared endpoint state, read here off the event loop (the
/// writer thread, `/configuration/health`).
pub fn now_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// What a new blob holds.
pub(crate) struct BlobParts<'a> {
    pub name: &'a [u8],
    pub json: &'a [u8],
    pub runtime: &'a [u8],
    pub endpoints: u32,
    pub resolves: bool,
}

impl BlobParts<'_> {
    pub fn size(&self) -> usize {
        mem::size_of::<Blob>() + self.name.len() + self.json.len() + self.runtime.len()
    }
}

/// Allocates and fills a blob of version `version`; `None` when the zone
/// is full. Returns it with its allocation size.
fn new_blob(slab: &SlabGuard, parts: &BlobParts, version: u64) -> Option<(NonNull<Blob>, usize)> {
    let size = parts.size();
    let blob = slab.alloc(size)?.cast::<Blob>();
    // SAFETY: the allocation has room for the header plus the three byte
    // strings, and nothing else references it yet.
    unsafe {
        blob.as_ptr().write(Blob {
            version,
            alloc_size: size,
            name_len: parts.name.len() as u32,
            json_len: parts.json.len() as u32,
            runtime_len: parts.runtime.len() as u32,
            endpoints: parts.endpoints,
            resolves: parts.resolves,
        });
        let mut dst = blob.as_ptr().add(1).cast::<u8>();
        for part in [parts.name, parts.json, parts.runtime] {
            ptr::copy_nonoverlapping(part.as_ptr(), dst, part.len());
            dst = dst.add(part.len());
        }
    }
    Some((blob, size))
}

fn dangling() -> *mut Blob {
    NonNull::<Blob>::dangling().as_ptr()
}

/// Blobs allocated by one write (of backends or of certificates), so that
/// a failed write can free them.
pub(crate) struct Built<'a> {
    slab: &'a SlabGuard,
    fresh: Vec<(NonNull<Blob>, usize)>,
    needed: usize,
}

impl<'a> Built<'a> {
    pub(crate) fn new(slab: &'a SlabGuard) -> Self {
        Built {
            slab,
            fresh: Vec::new(),
            needed: 0,
        }
    }

    /// A new blob of `parts`, or `None` when the zone is full (the size
    /// still counts towards what the write needed).
    pub(crate) fn build(&mut self, parts: &BlobParts, generation: u64) -> Option<NonNull<Blob>> {
        self.needed += parts.size();
        let (blob, size) = new_blob(self.slab, parts, generation)?;
        self.fresh.push((blob, size));
        Some(blob)
    }

    /// Counts `bytes` more that the write would have needed.
    pub(crate) fn also_needed(&mut self, bytes: usize) {
        self.needed += bytes;
    }

    /// The existing blob when its content is unchanged, else a new one. On
    /// allocation failure returns a dangling marker and keeps counting how
    /// much memory the write would have needed.
    fn reuse_or_build(&mut self, old: &Index, item: &Prepared, generation: u64) -> NonNull<Blob> {
        if let Some(blob) = old.find(item.name.as_bytes()) {
            if blob.same_content(item) {
                return NonNull::from(blob);
            }
        }
        let parts = BlobParts {
            name: item.name.as_bytes(),
            json: &item.json,
            runtime: &item.runtime,
            endpoints: item.endpoints as u32,
            resolves: item.resolves,
        };
        self.build(&parts, generation).unwrap_or(NonNull::dangling())
    }

    /// Frees every blob this write built (none was published) and returns
    /// how many bytes the write needed.
    pub(crate) fn discard(self) -> usize {
        for (blob, size) in &self.fresh {
            // SAFETY: these blobs were never published.
            unsafe { self.slab.free(blob.cast(), *size) };
        }
        self.needed
    }

    fn abandon(self, zone: usize) -> StoreError {
        StoreError::ZoneFull {
            needed: self.discard(),
            zone,
        }
    }
}
