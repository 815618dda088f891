//! Certificates and the servers map in the zone: writes.
//!
//! Same discipline as [`crate::shm::store`] for backends: a write builds its new
//! blobs and index first, swaps them in under the certificates' write lock,
//! bumps `cert_generation`, then frees what only the old state referenced;
//! a write that cannot allocate frees what it built and changes nothing.
//! The servers map may only name certificates the zone holds, and a
//! certificate the map names cannot be deleted, so a handshake never finds
//! a host pointing at nothing.

use std::collections::BTreeMap;
use std::mem;
use std::ptr::{self, NonNull};
use std::sync::atomic::Ordering;

use lua_compat::certificates::{ServerChanges, Servers};

use crate::shm::index::{Blob, Index};
use crate::shm::store::{BlobParts, Built};
use crate::shm::zone::{CertIndex, Zone};
use crate::tls::certificate::Prepared;

/// One write to the certificates.
pub enum CertChange {
    /// `PUT /configuration/certificates/{id}`.
    Put(Prepared),
    /// `DELETE /configuration/certificates/{id}`.
    Delete(String),
    /// `PUT /configuration/servers`: the whole map.
    ReplaceServers(Servers),
    /// ingress-nginx's `POST /configuration/servers`: certificates, then
    /// additive host changes.
    Compat {
        certs: Vec<Prepared>,
        servers: ServerChanges,
    },
}

/// A write that took effect.
#[derive(Debug, Clone, Copy)]
pub struct CertApplied {
    pub generation: u64,
    /// A `Put` of an id the zone did not hold.
    pub created: bool,
}

/// A refused write; nothing changed.
#[derive(Debug, Clone)]
pub enum CertStoreError {
    ZoneFull {
        needed: usize,
        zone: usize,
    },
    NotFound(String),
    /// The servers map still names this certificate.
    InUse {
        id: String,
        hosts: Vec<String>,
    },
    /// The servers map would name a certificate the zone does not hold.
    Unknown {
        host: String,
        id: String,
    },
}

/// The servers map stored in `blob` (`None`: empty).
pub fn servers_of(blob: *const Blob) -> Servers {
    // SAFETY: a servers blob referenced by the live certificate index is
    // valid and immutable while that index is current (callers hold the
    // read lock or the slab mutex).
    let Some(blob) = (unsafe { blob.as_ref() }) else {
        return Servers::new();
    };
    serde_json::from_slice(blob.json()).unwrap_or_default()
}

/// Applies `change` atomically. Runs on the writer thread.
pub fn apply(zone: &Zone, change: CertChange) -> Result<CertApplied, CertStoreError> {
    let slab = zone.lock_slab();
    let header = zone.header();
    // SAFETY: only writers modify the certificate index, and they hold the
    // slab mutex (`slab`), as this one does: no write races this borrow.
    let old: &CertIndex = unsafe { &*header.certs.data_ptr() };
    let generation = header.cert_generation.load(Ordering::Relaxed) + 1;
    let mut built = Built::new(&slab);
    let mut certs: Vec<NonNull<Blob>> = old.certs.slice().to_vec();
    let have_servers = servers_of(old.servers);
    let mut servers = have_servers.clone();
    let mut created = false;

    let mut put = |certs: &mut Vec<NonNull<Blob>>, built: &mut Built, p: &Prepared| -> Result<(), ()> {
        let position = old.certs.position(p.id.as_bytes());
        if let Ok(i) = position {
            // The position is in the live index, not in `certs`, where an
            // earlier insert of this write may have shifted it.
            // SAFETY: a blob of the live index.
            let blob = unsafe { old.certs.slice()[i].as_ref() };
            if blob.json() == p.info.as_slice() && blob.runtime() == p.payload.as_slice() {
                return Ok(());
            }
        }
        let parts = BlobParts {
            name: p.id.as_bytes(),
            json: &p.info,
            runtime: &p.payload,
            endpoints: 0,
            resolves: false,
        };
        let blob = built.build(&parts, generation).ok_or(())?;
        match certs.binary_search_by(|b| {
            // SAFETY: blobs of the live index or built by this write.
            unsafe { b.as_ref() }.name().cmp(p.id.as_bytes())
        }) {
            Ok(i) => certs[i] = blob,
            Err(i) => {
                certs.insert(i, blob);
                created = true;
            }
        }
        Ok(())
    };
    let full = |built: Built| CertStoreError::ZoneFull {
        needed: built.discard(),
        zone: zone.size(),
    };
    match change {
        CertChange::Put(p) => {
            if put(&mut certs, &mut built, &p).is_err() {
                return Err(full(built));
            }
        }
        CertChange::Delete(id) => {
            let i = old
                .certs
                .position(id.as_bytes())
                .map_err(|_| CertStoreError::NotFound(id.clone()))?;
            let hosts: Vec<String> = servers
                .iter()
                .filter(|(_, v)| **v == id)
                .map(|(h, _)| h.clone())
                .collect();
            if !hosts.is_empty() {
                return Err(CertStoreError::InUse { id, hosts });
            }
            certs.remove(i);
        }
        CertChange::ReplaceServers(map) => servers = map,
        CertChange::Compat {
            certs: list,
            servers: changes,
        } => {
            for p in &list {
                if put(&mut certs, &mut built, p).is_err() {
                    return Err(full(built));
                }
            }
            for (host, id) in changes {
                match id {
                    Some(id) => servers.insert(host, id),
                    None => servers.remove(&host),
                };
            }
        }
    }
    let holds = |id: &str| {
        certs
            .binary_search_by(|b| {
                // SAFETY: blobs of the live index or built by this write.
                unsafe { b.as_ref() }.name().cmp(id.as_bytes())
            })
            .is_ok()
    };
    if let Some((host, id)) = servers.iter().find(|(_, id)| !holds(id)) {
        let e = CertStoreError::Unknown {
            host: host.clone(),
            id: id.clone(),
        };
        built.discard();
        return Err(e);
    }

    let servers_blob: *mut Blob = if servers == have_servers {
        old.servers
    } else if servers.is_empty() {
        ptr::null_mut()
    } else {
        let json = serde_json::to_vec(&servers).expect("JSON encoding of the servers map");
        let parts = BlobParts {
            name: b"servers",
            json: &json,
            runtime: &[],
            endpoints: 0,
            resolves: false,
        };
        match built.build(&parts, generation) {
            Some(b) => b.as_ptr(),
            None => return Err(full(built)),
        }
    };
    let entries_size = certs.len() * mem::size_of::<NonNull<Blob>>();
    let entries: *mut NonNull<Blob> = if certs.is_empty() {
        ptr::null_mut()
    } else {
        match slab.alloc(entries_size) {
            Some(p) => p.as_ptr().cast(),
            None => {
                built.also_needed(entries_size);
                return Err(full(built));
            }
        }
    };
    if !entries.is_null() {
        // SAFETY: `entries` has room for `certs.len()` pointers.
        unsafe { ptr::copy_nonoverlapping(certs.as_ptr(), entries, certs.len()) };
    }
    let previous: Vec<NonNull<Blob>> = old.certs.slice().to_vec();
    let (old_entries, old_len, old_servers) = (old.certs.entries, old.certs.len, old.servers);
    // The route table shares this index; its writers also hold the slab
    // mutex, so it cannot change under this write.
    let routes = old.routes;
    {
        let mut index = header.certs.write();
        *index = CertIndex {
            certs: Index {
                entries,
                len: certs.len(),
            },
            servers: servers_blob,
            routes,
        };
        header.cert_generation.store(generation, Ordering::Release);
    }
    // Free what only the old state referenced; readers touch blobs only
    // under the read lock, which the swap above excluded.
    certs.sort_unstable();
    for blob in previous {
        if certs.binary_search(&blob).is_err() {
            // SAFETY: no index references it any more (see above).
            unsafe { slab.free(blob.cast(), blob.as_ref().alloc_size) };
        }
    }
    if let Some(old) = NonNull::new(old_servers).filter(|p| p.as_ptr() != servers_blob) {
        // SAFETY: the replaced servers blob is unreferenced after the swap.
        unsafe { slab.free(old.cast(), old.as_ref().alloc_size) };
    }
    if let Some(p) = NonNull::new(old_entries) {
        // SAFETY: the old entries array is unreferenced after the swap.
        unsafe { slab.free(p.cast(), old_len * mem::size_of::<NonNull<Blob>>()) };
    }
    Ok(CertApplied { generation, created })
}

/// The certificates' listing: each one's info, with its generation and the
/// hosts that name it. Copies out under the read lock.
pub fn list(zone: &Zone, only: Option<&str>) -> Vec<lua_compat::certificates::CertificateInfo> {
    let state = zone.header().certs.read();
    let servers = servers_of(state.servers);
    let mut by_id: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (host, id) in &servers {
        by_id.entry(id.as_str()).or_default().push(host.clone());
    }
    state
        .certs
        .blobs()
        .filter(|b| only.is_none_or(|id| b.name() == id.as_bytes()))
        .filter_map(|b| {
            let mut info: lua_compat::certificates::CertificateInfo = serde_json::from_slice(b.json()).ok()?;
            info.generation = b.version;
            info.hosts = by_id.get(info.id.as_str()).cloned().unwrap_or_default();
            Some(info)
        })
        .collect()
}
