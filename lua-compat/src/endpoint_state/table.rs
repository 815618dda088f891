//! The endpoint table: slots that never move, and an index from address to
//! slot that the writer rebuilds as the table grows.
//!
//! Slots come from the zone in chunks of [`CHUNK_SLOTS`] as endpoints
//! arrive, so the table tracks as many endpoints as the zone has room for,
//! rather than a count fixed when the zone was made. A chunk is never given
//! back: workers hold `&'static` references into it. A freed slot goes on a
//! free list and is the next one used, so the table's memory is the
//! high-water mark of endpoints held at once.
//!
//! The index is an open-addressed array of slot ids (4 bytes per cell, at
//! most 3/4 full), and the chunk directory an array of chunk pointers. Only
//! the writer changes either, and it is one at a time (the module's writers
//! hold the zone's slab mutex, see [`EndpointTable::writer`]). It fills
//! empty cells and directory entries in place, with release stores that
//! readers can race with. Replacing an array (to grow, shrink or drop
//! tombstones) happens under the table's own lock, which every reader holds
//! while it probes, so no reader ever probes a freed array. Readers look
//! up once per backend they decode, not per request: a request goes
//! straight to the slot through the reference its worker keeps.

use std::net::SocketAddr;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::{decode, encode, hash, Slot, SlotRef};
use crate::shm_rwlock::ShmRwLock;

/// Slots per chunk: 512 slots of 72 bytes are exactly nine 4 KiB pages,
/// so a chunk wastes nothing in nginx's slab.
pub const CHUNK_SLOTS: usize = 512;
/// The smallest index: 64 cells.
const MIN_CELLS: usize = 64;
const EMPTY: u32 = 0;
const TOMBSTONE: u32 = u32::MAX;

/// Memory for the table, from the zone it lives in.
pub trait ZoneMemory {
    /// `size` bytes aligned to 8, or `None` when the zone is full.
    fn alloc(&self, size: usize) -> Option<NonNull<u8>>;
    /// Gives back what [`ZoneMemory::alloc`] returned.
    ///
    /// # Safety
    /// `p` came from `alloc(size)` of this memory and is not used after.
    unsafe fn free(&self, p: NonNull<u8>, size: usize);
}

/// The table's header, in the zone.
#[repr(C)]
pub struct EndpointTable {
    /// Held by readers while they probe; the writer takes it to replace
    /// the index or the directory.
    lock: ShmRwLock<()>,
    cells: AtomicPtr<AtomicU32>,
    cells_len: AtomicU32,
    /// Cells not empty (holding a slot or a tombstone).
    cells_used: AtomicU32,
    chunks: AtomicPtr<AtomicPtr<Slot>>,
    chunks_len: AtomicU32,
    chunks_cap: AtomicU32,
    /// The first free slot's id + 1 (0: none).
    free_head: AtomicU32,
    live: AtomicU64,
    /// Bumped whenever an endpoint gets a slot, so a worker that routes a
    /// backend with stateless endpoints knows to look them up again.
    epoch: AtomicU64,
    /// Endpoints whose slot was given to another backend's (see `share`).
    evicted: AtomicU64,
    /// Times the zone had no room for a chunk or an index the table needed.
    refused: AtomicU64,
}

impl EndpointTable {
    /// Initialises a table in place.
    ///
    /// # Safety
    /// `table` points to `size_of::<EndpointTable>()` zeroed bytes, aligned
    /// for `u64`, in memory every process maps for as long as it runs (a
    /// shared zone): the slots it will hand out are `'static`.
    pub unsafe fn init(table: *mut EndpointTable) {
        // SAFETY: zeroed, writable memory for the whole table (the caller's
        // promise); all-zero is every other field's initial value.
        unsafe { ShmRwLock::init_in_place(ptr::addr_of_mut!((*table).lock), ()) };
    }

    /// Endpoints with a slot.
    pub fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    /// Slots the zone has given the table so far.
    pub fn capacity(&self) -> u64 {
        // Acquire: pairs with the release store of the length after the new
        // chunk's directory entry, so every slot below it can be resolved.
        u64::from(self.chunks_len.load(Ordering::Acquire)) * CHUNK_SLOTS as u64
    }

    /// Bytes the table holds in the zone (header, chunks, index, directory).
    pub fn bytes(&self) -> u64 {
        let cells = u64::from(self.cells_len.load(Ordering::Relaxed)) * 4;
        let directory = u64::from(self.chunks_cap.load(Ordering::Relaxed)) * 8;
        std::mem::size_of::<EndpointTable>() as u64
            + self.capacity() * std::mem::size_of::<Slot>() as u64
            + cells
            + directory
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Gives this process's reader slot of the table's lock back (worker
    /// exit).
    pub fn release_reader_slot(&self) {
        self.lock.release_slot();
    }

    /// The slot of `addr`, if the table tracks it.
    pub fn find(&self, addr: &SocketAddr) -> Option<SlotRef> {
        let _read = self.lock.read();
        self.probe(&encode(addr)).map(|(_, r)| r)
    }

    /// [`EndpointTable::find`] for many addresses under one lock.
    pub fn find_all<'a>(&self, addrs: impl IntoIterator<Item = &'a SocketAddr>) -> Vec<Option<SlotRef>> {
        let _read = self.lock.read();
        addrs
            .into_iter()
            .map(|a| self.probe(&encode(a)).map(|(_, r)| r))
            .collect()
    }

    /// Every tracked endpoint with its slot (tests: the module asks by
    /// address).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> Vec<(SocketAddr, &'static Slot)> {
        let _read = self.lock.read();
        let mut out = Vec::with_capacity(self.live() as usize);
        for id in 0..self.capacity() as u32 {
            let slot = self.slot(id);
            if let Some(addr) = slot.read_key().and_then(|(key, _)| decode(key)) {
                out.push((addr, slot));
            }
        }
        out
    }

    /// The slot with id `id`; its chunk must exist.
    fn slot(&self, id: u32) -> &'static Slot {
        let (chunk, at) = (id as usize / CHUNK_SLOTS, id as usize % CHUNK_SLOTS);
        // Ids come from the index or are below `capacity()`, so their chunk
        // was published: its directory entry is stored (release) before the
        // chunk count and before any index cell naming one of its slots.
        // The directory is replaced only under the write lock, which
        // excludes our callers (readers hold the read lock; the writer is
        // the one replacing it).
        // SAFETY: `chunk` is below the directory's length (see above).
        let first = unsafe { (*self.chunks.load(Ordering::Acquire).add(chunk)).load(Ordering::Acquire) };
        // SAFETY: a published chunk of CHUNK_SLOTS slots, never freed, in
        // the zone, mapped for the life of the process; `at` < CHUNK_SLOTS.
        unsafe { &*first.add(at) }
    }

    fn cells(&self) -> &[AtomicU32] {
        let (p, len) = (
            self.cells.load(Ordering::Acquire),
            self.cells_len.load(Ordering::Acquire),
        );
        if p.is_null() {
            return &[];
        }
        // SAFETY: `cells` points to `cells_len` cells; both change only
        // under the write lock, which excludes our callers (see `slot`).
        unsafe { std::slice::from_raw_parts(p, len as usize) }
    }

    /// The cell index and slot of `key`. Callers hold the read lock or are
    /// the writer.
    fn probe(&self, key: &[u64; 3]) -> Option<(usize, SlotRef)> {
        let cells = self.cells();
        if cells.is_empty() {
            return None;
        }
        let mask = cells.len() - 1;
        let mut i = hash(key) & mask;
        for _ in 0..cells.len() {
            match cells[i].load(Ordering::Acquire) {
                EMPTY => return None,
                TOMBSTONE => {}
                id => {
                    let slot = self.slot(id - 1);
                    if let Some((k, incarnation)) = slot.read_key() {
                        if k == *key {
                            return Some((i, SlotRef { slot, incarnation }));
                        }
                    }
                }
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// The writer's handle.
    ///
    /// # Safety
    /// No other [`TableWriter`] of this table exists, in any process, while
    /// the one returned lives (the module holds the zone's slab mutex), and
    /// `memory` allocates from the zone the table lives in.
    pub unsafe fn writer<'a, M: ZoneMemory>(&'a self, memory: &'a M) -> TableWriter<'a, M> {
        TableWriter {
            table: self,
            memory,
            inserted: false,
        }
    }
}

/// Changes the table; see [`EndpointTable::writer`].
pub struct TableWriter<'a, M: ZoneMemory> {
    table: &'a EndpointTable,
    memory: &'a M,
    inserted: bool,
}

impl<M: ZoneMemory> Drop for TableWriter<'_, M> {
    fn drop(&mut self) {
        if self.inserted {
            self.table.epoch.fetch_add(1, Ordering::Release);
        }
    }
}

impl<M: ZoneMemory> TableWriter<'_, M> {
    pub fn table(&self) -> &EndpointTable {
        self.table
    }

    /// The slot of `addr` (the writer probes without the lock: only it
    /// replaces the arrays).
    pub fn slot_of(&self, addr: &SocketAddr) -> Option<&'static Slot> {
        self.table.probe(&encode(addr)).and_then(|(_, r)| r.get())
    }

    /// Gives `addr` a slot (a new one starts with `ewma`, Lua's slow
    /// start). False when the zone has no room for it: it routes without
    /// shared state.
    pub fn insert(&mut self, addr: &SocketAddr, ewma: Option<f64>, now: f64) -> bool {
        let key = encode(addr);
        if self.table.probe(&key).is_some() {
            return true;
        }
        let Some(id) = self.take_free() else {
            self.table.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        if !self.room_for(&key) {
            self.put_free(id);
            self.table.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let slot = self.table.slot(id);
        // The slot is free (even): a seqlock writer's fence, so that no
        // reader sees the new key's words before the increment that freed
        // it.
        std::sync::atomic::fence(Ordering::Release);
        for (k, w) in slot.key.iter().zip(key) {
            k.store(w, Ordering::Relaxed);
        }
        slot.ewma.store(ewma.unwrap_or(0.0).to_bits(), Ordering::Relaxed);
        slot.touched
            .store(if ewma.is_some() { now } else { 0.0 }.to_bits(), Ordering::Relaxed);
        slot.conns.store(0, Ordering::Relaxed);
        slot.fails.store(0, Ordering::Relaxed);
        slot.checked_ms.store(0, Ordering::Relaxed);
        slot.ewma_lock.store(0, Ordering::Relaxed);
        slot.refs.store(0, Ordering::Relaxed);
        // Odd: live. Release, so that a reader seeing it sees the key.
        slot.incarnation.fetch_add(1, Ordering::Release);
        self.place(&key, id + 1);
        self.table.live.fetch_add(1, Ordering::Relaxed);
        self.inserted = true;
        true
    }

    /// One more backend lists `addr`: counts it, giving `addr` a slot if
    /// it has none (see [`TableWriter::insert`]). False when the zone has
    /// no room for it.
    pub fn acquire(&mut self, addr: &SocketAddr, ewma: Option<f64>, now: f64) -> bool {
        if self.add_ref(addr) {
            return true;
        }
        if !self.insert(addr, ewma, now) {
            return false;
        }
        self.set_refs(addr, 1);
        true
    }

    /// One more backend lists `addr`, if it has a slot; false if it has
    /// none (nothing counted).
    pub fn add_ref(&mut self, addr: &SocketAddr) -> bool {
        let Some(slot) = self.slot_of(addr) else {
            return false;
        };
        slot.refs.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// One backend fewer lists `addr`: the slot is freed when none does.
    pub fn release(&mut self, addr: &SocketAddr) {
        let Some((cell, r)) = self.table.probe(&encode(addr)) else {
            return;
        };
        let left = r.slot.refs.load(Ordering::Relaxed).saturating_sub(1);
        r.slot.refs.store(left, Ordering::Relaxed);
        if left == 0 {
            let id = self.table.cells()[cell].load(Ordering::Relaxed) - 1;
            self.free_slot(cell, id);
        }
    }

    /// Sets how many backends list `addr` (a recount).
    pub fn set_refs(&mut self, addr: &SocketAddr, refs: u32) {
        if let Some(slot) = self.slot_of(addr) {
            slot.refs.store(refs, Ordering::Relaxed);
        }
    }

    /// Takes `addr`'s slot away (it stays routed, without shared state).
    pub fn evict(&mut self, addr: &SocketAddr) -> bool {
        let Some((cell, _)) = self.table.probe(&encode(addr)) else {
            return false;
        };
        let id = self.table.cells()[cell].load(Ordering::Relaxed) - 1;
        self.free_slot(cell, id);
        self.table.evicted.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Frees the slot of every endpoint `keep` rejects, then compacts the
    /// index if tombstones or emptiness call for it.
    pub fn retain(&mut self, keep: impl Fn(&SocketAddr) -> bool) {
        for id in 0..self.table.capacity() as u32 {
            let slot = self.table.slot(id);
            let Some((key, _)) = slot.read_key() else { continue };
            if decode(key).is_some_and(|a| !keep(&a)) {
                if let Some((cell, _)) = self.table.probe(&key) {
                    self.free_slot(cell, id);
                }
            }
        }
        let (len, used, live) = (
            self.table.cells_len.load(Ordering::Relaxed) as usize,
            self.table.cells_used.load(Ordering::Relaxed) as usize,
            self.table.live() as usize,
        );
        if len > MIN_CELLS && (live * 8 < len || used - live > len / 4) {
            self.rebuild(cells_for(live));
        }
    }

    /// Frees slot `id`, which index cell `cell` points at.
    fn free_slot(&mut self, cell: usize, id: u32) {
        self.table.cells()[cell].store(TOMBSTONE, Ordering::Release);
        // Even: free; every reference to it goes stale.
        self.table.slot(id).incarnation.fetch_add(1, Ordering::Release);
        self.put_free(id);
        self.table.live.fetch_sub(1, Ordering::Relaxed);
    }

    fn put_free(&mut self, id: u32) {
        let slot = self.table.slot(id);
        slot.next_free
            .store(self.table.free_head.load(Ordering::Relaxed), Ordering::Relaxed);
        self.table.free_head.store(id + 1, Ordering::Relaxed);
    }

    /// A free slot's id, growing the table by a chunk if none is free.
    fn take_free(&mut self) -> Option<u32> {
        if self.table.free_head.load(Ordering::Relaxed) == 0 {
            self.grow()?;
        }
        let id = self.table.free_head.load(Ordering::Relaxed) - 1;
        let next = self.table.slot(id).next_free.load(Ordering::Relaxed);
        self.table.free_head.store(next, Ordering::Relaxed);
        Some(id)
    }

    /// One more chunk of free slots, if the zone has room.
    fn grow(&mut self) -> Option<()> {
        let t = self.table;
        let len = t.chunks_len.load(Ordering::Relaxed);
        if u64::from(len + 1) * CHUNK_SLOTS as u64 >= u64::from(TOMBSTONE - 1) {
            return None;
        }
        if len == t.chunks_cap.load(Ordering::Relaxed) {
            self.grow_directory()?;
        }
        let bytes = CHUNK_SLOTS * std::mem::size_of::<Slot>();
        let chunk = self.memory.alloc(bytes)?.cast::<Slot>();
        // SAFETY: a fresh allocation of `bytes`; all-zero is a free slot.
        unsafe { ptr::write_bytes(chunk.as_ptr().cast::<u8>(), 0, bytes) };
        // SAFETY: the directory has room for entry `len` (checked above),
        // and only this writer stores entries.
        unsafe { (*t.chunks.load(Ordering::Relaxed).add(len as usize)).store(chunk.as_ptr(), Ordering::Release) };
        t.chunks_len.store(len + 1, Ordering::Release);
        let first = len * CHUNK_SLOTS as u32;
        for id in (first..first + CHUNK_SLOTS as u32).rev() {
            self.put_free(id);
        }
        Some(())
    }

    fn grow_directory(&mut self) -> Option<()> {
        let t = self.table;
        let (old, cap) = (t.chunks.load(Ordering::Relaxed), t.chunks_cap.load(Ordering::Relaxed));
        let new_cap = (cap * 2).max(16);
        let size = new_cap as usize * std::mem::size_of::<AtomicPtr<Slot>>();
        let fresh = self.memory.alloc(size)?.cast::<AtomicPtr<Slot>>();
        // SAFETY: a fresh allocation for `new_cap` pointers; all-zero is a
        // null `AtomicPtr`.
        unsafe { ptr::write_bytes(fresh.as_ptr().cast::<u8>(), 0, size) };
        for i in 0..cap as usize {
            // SAFETY: `i` is below both arrays' lengths.
            unsafe {
                let p = (*old.add(i)).load(Ordering::Relaxed);
                (*fresh.as_ptr().add(i)).store(p, Ordering::Relaxed);
            }
        }
        {
            let _write = t.lock.write();
            t.chunks.store(fresh.as_ptr(), Ordering::Release);
            t.chunks_cap.store(new_cap, Ordering::Release);
        }
        if let Some(old) = NonNull::new(old) {
            // SAFETY: allocated by a previous grow_directory with this size;
            // readers took the write lock's exclusion, so none still reads it.
            unsafe {
                self.memory
                    .free(old.cast(), cap as usize * std::mem::size_of::<AtomicPtr<Slot>>())
            };
        }
        Some(())
    }

    /// Makes sure `key` can take a cell with the index at most 3/4 full,
    /// rebuilding it larger if not. Without room for a larger index (the
    /// zone is full, or has no run of free pages that long), the index is
    /// cleared of tombstones in place, and a cell taken as long as one
    /// stays empty (probes for absent keys end at an empty cell) or a
    /// tombstone on `key`'s probe path reused.
    fn room_for(&mut self, key: &[u64; 3]) -> bool {
        let len = self.table.cells_len.load(Ordering::Relaxed) as usize;
        let used = self.table.cells_used.load(Ordering::Relaxed) as usize;
        if (used + 1) * 4 <= len * 3 {
            return true;
        }
        let live = self.table.live() as usize;
        if self.rebuild(cells_for(live + 1).max(len)) {
            return true;
        }
        if len == 0 {
            return false;
        }
        if used > live {
            self.rehash_in_place();
        }
        let used = self.table.cells_used.load(Ordering::Relaxed) as usize;
        used + 1 < len || !self.free_cell(key).1
    }

    /// Endpoints the table can hold without taking more from the zone: its
    /// slots, and one cell fewer than its index has.
    pub fn limit(&self) -> u64 {
        let cells = u64::from(self.table.cells_len.load(Ordering::Relaxed));
        self.table.capacity().min(cells.saturating_sub(1))
    }

    /// Drops the index's tombstones without a second array: under the
    /// write lock, so that no reader probes it half rebuilt.
    fn rehash_in_place(&mut self) {
        let t = self.table;
        let _write = t.lock.write();
        let cells = t.cells();
        let mask = cells.len() - 1;
        for c in cells {
            c.store(EMPTY, Ordering::Relaxed);
        }
        let mut used = 0;
        for id in 0..t.capacity() as u32 {
            if let Some((key, _)) = t.slot(id).read_key() {
                let mut i = hash(&key) & mask;
                while cells[i].load(Ordering::Relaxed) != EMPTY {
                    i = (i + 1) & mask;
                }
                cells[i].store(id + 1, Ordering::Release);
                used += 1;
            }
        }
        t.cells_used.store(used, Ordering::Relaxed);
    }

    /// Replaces the index with one of `len` cells holding every live slot.
    fn rebuild(&mut self, len: usize) -> bool {
        let t = self.table;
        let size = len * 4;
        let Some(fresh) = self.memory.alloc(size) else {
            return false;
        };
        let fresh = fresh.cast::<AtomicU32>();
        // SAFETY: a fresh allocation for `len` cells; all-zero is EMPTY.
        unsafe { ptr::write_bytes(fresh.as_ptr().cast::<u8>(), 0, size) };
        // SAFETY: as above; only this writer sees it until published.
        let cells = unsafe { std::slice::from_raw_parts(fresh.as_ptr(), len) };
        let mut used = 0;
        for id in 0..t.capacity() as u32 {
            if let Some((key, _)) = t.slot(id).read_key() {
                let mut i = hash(&key) & (len - 1);
                while cells[i].load(Ordering::Relaxed) != EMPTY {
                    i = (i + 1) & (len - 1);
                }
                cells[i].store(id + 1, Ordering::Relaxed);
                used += 1;
            }
        }
        let (old, old_len) = (t.cells.load(Ordering::Relaxed), t.cells_len.load(Ordering::Relaxed));
        {
            let _write = t.lock.write();
            t.cells.store(fresh.as_ptr(), Ordering::Release);
            t.cells_len.store(len as u32, Ordering::Release);
        }
        t.cells_used.store(used, Ordering::Relaxed);
        if let Some(old) = NonNull::new(old) {
            // SAFETY: allocated by an earlier rebuild with this size; no
            // reader holds the lock across the swap above, so none reads it.
            unsafe { self.memory.free(old.cast(), old_len as usize * 4) };
        }
        true
    }

    /// The first empty or tombstone cell on `key`'s probe path, and
    /// whether it is empty (there is one: the index is never full).
    fn free_cell(&self, key: &[u64; 3]) -> (usize, bool) {
        let cells = self.table.cells();
        let mask = cells.len() - 1;
        let mut i = hash(key) & mask;
        loop {
            match cells[i].load(Ordering::Relaxed) {
                EMPTY => return (i, true),
                TOMBSTONE => return (i, false),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Publishes `value` in `key`'s first empty or tombstone cell.
    fn place(&mut self, key: &[u64; 3], value: u32) {
        let (i, empty) = self.free_cell(key);
        if empty {
            self.table.cells_used.fetch_add(1, Ordering::Relaxed);
        }
        self.table.cells()[i].store(value, Ordering::Release);
    }
}

/// An index size for `live` endpoints: a power of two at most half full.
fn cells_for(live: usize) -> usize {
    (live * 2).next_power_of_two().max(MIN_CELLS)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::Cell;

    /// Heap memory with a budget, standing in for the zone. Never-freed
    /// chunks leak, as the zone keeps them for the life of the process.
    pub struct Heap {
        pub budget: Cell<usize>,
    }

    impl Heap {
        pub fn new(budget: usize) -> Heap {
            Heap {
                budget: Cell::new(budget),
            }
        }
    }

    impl ZoneMemory for Heap {
        fn alloc(&self, size: usize) -> Option<NonNull<u8>> {
            if size > self.budget.get() {
                return None;
            }
            self.budget.set(self.budget.get() - size);
            let layout = std::alloc::Layout::from_size_align(size, 8).ok()?;
            // SAFETY: a non-zero size (every caller asks for at least 64 bytes).
            NonNull::new(unsafe { std::alloc::alloc(layout) })
        }

        unsafe fn free(&self, p: NonNull<u8>, size: usize) {
            self.budget.set(self.budget.get() + size);
            // SAFETY: `p` came from `alloc(size)` (the caller's promise).
            unsafe { std::alloc::dealloc(p.as_ptr(), std::alloc::Layout::from_size_align_unchecked(size, 8)) };
        }
    }

    /// A table on leaked heap memory, which lives as long as the process,
    /// as the zone does.
    pub fn table() -> &'static EndpointTable {
        let words = std::mem::size_of::<EndpointTable>().div_ceil(8);
        let memory: &'static mut [u64] = Box::leak(vec![0u64; words].into_boxed_slice());
        let table = memory.as_mut_ptr().cast::<EndpointTable>();
        // SAFETY: zeroed, u64-aligned, large enough, never freed.
        unsafe {
            EndpointTable::init(table);
            &*table
        }
    }

    fn last_octet(a: &SocketAddr) -> u8 {
        match a {
            SocketAddr::V4(v) => v.ip().octets()[3],
            SocketAddr::V6(v) => v.ip().octets()[15],
        }
    }

    pub fn addr(i: u32) -> SocketAddr {
        SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 80))
    }

    #[test]
    fn finds_what_it_holds_and_forgets_what_it_drops() {
        let t = table();
        let heap = Heap::new(usize::MAX);
        // SAFETY: the only writer.
        let mut w = unsafe { t.writer(&heap) };
        let v6: SocketAddr = "[2001:db8::1]:8080".parse().unwrap();
        for a in [addr(1), addr(2), v6] {
            assert!(w.insert(&a, Some(0.5), 100.0));
        }
        assert_eq!(t.live(), 3);
        let one = t.find(&addr(1)).unwrap();
        assert_eq!(one.get().unwrap().ewma_value(), (0.5, 100.0));
        assert!(t.find(&addr(3)).is_none());
        w.retain(|a| *a != addr(1));
        assert!(one.get().is_none(), "a dropped endpoint's reference goes stale");
        assert!(t.find(&addr(1)).is_none());
        // The freed slot is the next one used, under a new incarnation.
        assert!(w.insert(&addr(4), None, 0.0));
        assert!(one.get().is_none());
        assert_eq!(t.capacity(), CHUNK_SLOTS as u64);
        let mut held: Vec<SocketAddr> = t.entries().into_iter().map(|(a, _)| a).collect();
        held.sort();
        assert_eq!(held, [addr(2), addr(4), v6]);
    }

    #[test]
    fn grows_with_the_zone_and_keeps_every_slot_in_place() {
        let t = table();
        let heap = Heap::new(usize::MAX);
        // SAFETY: the only writer.
        let mut w = unsafe { t.writer(&heap) };
        assert!(w.insert(&addr(0), None, 0.0));
        let first = t.find(&addr(0)).unwrap();
        first.get().unwrap().conns.store(7, Ordering::Relaxed);
        let n = 120_000;
        for i in 1..n {
            assert!(w.insert(&addr(i), None, 0.0), "{i}");
        }
        assert_eq!(t.live(), u64::from(n));
        assert!(t.capacity() >= u64::from(n));
        assert_eq!(
            first.get().unwrap().conns.load(Ordering::Relaxed),
            7,
            "slots never move"
        );
        let found = t.find_all((0..n).map(addr).collect::<Vec<_>>().iter());
        assert!(found.iter().all(Option::is_some));
        // Memory per endpoint: the slot and about 4-8 bytes of index.
        let per = t.bytes() as f64 / f64::from(n);
        assert!(per < 90.0, "{per} bytes per endpoint");
        // Shrinking gives the index back but keeps the slots for reuse.
        w.retain(|a| *a == addr(0));
        assert_eq!(t.live(), 1);
        assert_eq!(first.get().unwrap().conns.load(Ordering::Relaxed), 7);
        assert!(t.cells_len.load(Ordering::Relaxed) as usize <= MIN_CELLS);
        for i in 1..n {
            assert!(w.insert(&addr(i + n), None, 0.0));
        }
        assert!(
            t.capacity() < u64::from(n) + CHUNK_SLOTS as u64,
            "freed slots are reused"
        );
    }

    #[test]
    fn without_room_it_refuses_and_counts() {
        let t = table();
        // One chunk, a 64-cell index (too small past 48 endpoints), a
        // directory, and nothing more.
        let heap = Heap::new(CHUNK_SLOTS * 72 + 64 * 4 + 16 * 8);
        // SAFETY: the only writer.
        let mut w = unsafe { t.writer(&heap) };
        let taken = (0..100).filter(|i| w.insert(&addr(*i), None, 0.0)).count();
        assert_eq!(taken, 63, "the index keeps one empty cell");
        assert!(t.refused() > 0);
        assert!(w.insert(&addr(0), None, 0.0), "a held endpoint is still found");
        let held = t.find(&addr(0)).unwrap();
        assert!(w.evict(&addr(0)));
        assert!(held.get().is_none(), "an evicted endpoint's reference goes stale");
        assert_eq!((t.evicted(), t.live()), (1, 62));
    }

    #[test]
    fn a_slot_lives_while_a_backend_lists_its_endpoint() {
        let t = table();
        let heap = Heap::new(usize::MAX);
        // SAFETY: the only writer.
        let mut w = unsafe { t.writer(&heap) };
        assert!(w.acquire(&addr(1), None, 0.0));
        assert!(w.acquire(&addr(1), None, 0.0));
        let held = t.find(&addr(1)).unwrap();
        w.release(&addr(1));
        assert!(held.get().is_some(), "another backend still lists it");
        w.release(&addr(1));
        assert!(held.get().is_none());
        assert_eq!(t.live(), 0);
        w.release(&addr(1));
        // A recount, as after the table had no room.
        w.insert(&addr(2), None, 0.0);
        w.set_refs(&addr(2), 3);
        for _ in 0..2 {
            w.release(&addr(2));
        }
        assert!(t.find(&addr(2)).is_some());
        w.release(&addr(2));
        assert!(t.find(&addr(2)).is_none());
    }

    #[test]
    fn a_full_index_without_memory_drops_its_tombstones_in_place() {
        let t = table();
        let heap = Heap::new(CHUNK_SLOTS * 72 + 64 * 4 + 16 * 8);
        // SAFETY: the only writer.
        let mut w = unsafe { t.writer(&heap) };
        let taken = (0..100).filter(|i| w.insert(&addr(*i), None, 0.0)).count();
        assert_eq!((taken, w.limit()), (63, 63));
        // Evictions leave tombstones; the index can still take new keys.
        for i in 0..20 {
            assert!(w.evict(&addr(i)));
        }
        for i in 200..220 {
            assert!(w.insert(&addr(i), None, 0.0), "{i}");
        }
        assert_eq!(t.live(), 63);
        assert!((200..220).all(|i| t.find(&addr(i)).is_some()));
        assert!((20..63).all(|i| t.find(&addr(i)).is_some()));
    }

    #[test]
    fn no_room_for_a_first_index_is_a_refusal_not_a_panic() {
        let t = table();
        // A directory and a chunk, and not the 256 bytes of an index.
        let heap = Heap::new(CHUNK_SLOTS * 72 + 16 * 8);
        // SAFETY: the only writer.
        let mut w = unsafe { t.writer(&heap) };
        assert!(!w.insert(&addr(1), None, 0.0));
        assert_eq!(t.live(), 0);
        assert!(t.find(&addr(1)).is_none());
    }

    #[test]
    fn every_insertion_moves_the_epoch() {
        let t = table();
        let heap = Heap::new(usize::MAX);
        let before = t.epoch();
        {
            // SAFETY: the only writer.
            let mut w = unsafe { t.writer(&heap) };
            w.retain(|_| true);
        }
        assert_eq!(t.epoch(), before, "nothing new, no move");
        {
            // SAFETY: the only writer.
            let mut w = unsafe { t.writer(&heap) };
            w.insert(&addr(1), None, 0.0);
        }
        assert_eq!(t.epoch(), before + 1);
    }

    #[test]
    fn readers_race_the_writer_safely() {
        let t = table();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let seen = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    for i in (0..4096).step_by(97) {
                        if let Some(r) = t.find(&addr(i)) {
                            // A reference found is to that very endpoint
                            // for as long as the slot keeps the
                            // incarnation found: the writer may free or
                            // reuse it right after `get` (then `read_key`
                            // says nothing or gives another incarnation).
                            if let Some((key, incarnation)) = r.get().and_then(|slot| slot.read_key()) {
                                if incarnation == r.incarnation {
                                    assert_eq!(decode(key), Some(addr(i)));
                                    seen.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    }
                }
            });
            let heap = Heap::new(usize::MAX);
            // SAFETY: the only writer.
            let mut w = unsafe { t.writer(&heap) };
            // At least 40 rounds, and on until the reader has checked
            // something: on a loaded two-core machine the reader may not
            // be scheduled before 40 rounds are over. Bounded in time.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            let mut round = 0u32;
            while round < 40 || (seen.load(Ordering::Relaxed) == 0 && std::time::Instant::now() < deadline) {
                for i in 0..4096 {
                    w.insert(&addr(i), None, 0.0);
                }
                w.retain(|a| a.port() == 80 && u32::from(last_octet(a)) % 2 == round % 2);
                round += 1;
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert!(
            seen.load(Ordering::Relaxed) > 0,
            "the reader never ran beside the writer"
        );
    }
}
