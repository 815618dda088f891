//! The route table in the zone: one blob, replaced whole.
//!
//! Same discipline as the backends and certificates: the new blob is built
//! first, swapped in under the certificates' write lock (the table shares
//! it, see [`CertIndex::routes`]) with `route_generation` bumped, and the
//! old one freed after the swap; a write the zone has no room for changes
//! nothing.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use crate::shm::store::{BlobParts, Built};
#[cfg(doc)]
use crate::shm::zone::CertIndex;
use crate::shm::zone::Zone;

/// A route write that took effect.
#[derive(Debug, Clone, Copy)]
pub struct RoutesApplied {
    pub generation: u64,
    /// The table differed from the stored one.
    pub changed: bool,
}

/// The zone has no room for the table; nothing changed.
#[derive(Debug, Clone, Copy)]
pub struct RoutesZoneFull {
    pub needed: usize,
    pub zone: usize,
}

/// Stores `json` (a validated table, see `lua_compat::routes::validate`) as
/// the route table. Runs on the writer thread.
pub fn replace(zone: &Zone, json: &[u8]) -> Result<RoutesApplied, RoutesZoneFull> {
    let slab = zone.lock_slab();
    let header = zone.header();
    // SAFETY: only writers change the certificates' index (routes
    // included), and they hold the slab mutex (`slab`), as this one does.
    let old = unsafe { (*header.certs.data_ptr()).routes };
    // SAFETY: a published blob stays valid while the slab mutex is held.
    if let Some(blob) = unsafe { old.as_ref() } {
        if blob.json() == json {
            return Ok(RoutesApplied {
                generation: header.route_generation.load(Ordering::Relaxed),
                changed: false,
            });
        }
    }
    let generation = header.route_generation.load(Ordering::Relaxed) + 1;
    let mut built = Built::new(&slab);
    let parts = BlobParts {
        name: b"routes",
        json,
        runtime: &[],
        endpoints: 0,
        resolves: false,
    };
    let Some(blob) = built.build(&parts, generation) else {
        return Err(RoutesZoneFull {
            needed: built.discard(),
            zone: zone.size(),
        });
    };
    {
        let mut index = header.certs.write();
        index.routes = blob.as_ptr();
        header.route_generation.store(generation, Ordering::Release);
    }
    if let Some(old) = NonNull::new(old) {
        // SAFETY: the replaced blob is unreferenced after the swap: readers
        // touch it only under the read lock, which the swap excluded.
        unsafe { slab.free(old.cast(), old.as_ref().alloc_size) };
    }
    Ok(RoutesApplied {
        generation,
        changed: true,
    })
}

/// A copy of the stored table's JSON and its generation; `None` when no
/// table was pushed.
pub fn read(zone: &Zone) -> (u64, Option<Vec<u8>>) {
    let index = zone.header().certs.read();
    let generation = zone.header().route_generation.load(Ordering::Acquire);
    // SAFETY: the blob the index names is valid while the read lock is held.
    let json = unsafe { index.routes.as_ref() }.map(|b| b.json().to_vec());
    (generation, json)
}
