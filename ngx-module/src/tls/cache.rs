//! Each worker's parsed certificates, refreshed by generation.
//!
//! A handshake asks for the certificate of its SNI. When the zone's
//! `cert_generation` is the one this worker last saw, that costs one atomic
//! load and two hash lookups; otherwise the worker copies the servers map
//! and the payloads of certificates whose blob version changed (under the
//! read lock), decodes those outside it, and keeps the rest. No handshake
//! parses PEM, and an unchanged certificate is never decoded twice.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use lua_compat::certificates::lookup;

use crate::shm::zone::Zone;
use crate::tls::certificate::{load, Loaded};
use crate::tls::store::servers_of;

#[derive(Default)]
struct CertCache {
    /// `cert_generation` this cache reflects; 0 = never refreshed.
    generation: u64,
    /// Certificates by id, with the blob version they were decoded from.
    certs: HashMap<String, (u64, Rc<Loaded>)>,
    /// The servers map: host → id.
    hosts: HashMap<String, String>,
}

thread_local! {
    static CACHE: RefCell<CertCache> = RefCell::new(CertCache::default());
}

/// The certificate for `sni` (already normalised, see
/// `lua_compat::certificates::sni_key`): exact host, `*.parent`, default.
/// `None` when the zone names none: nginx's own `ssl_certificate` serves.
/// `on_error` hears of payloads that could not be decoded.
pub fn find(zone: &Zone, sni: Option<&str>, on_error: impl FnMut(&str, &str)) -> Option<Rc<Loaded>> {
    with_fresh(zone, on_error, |cache| {
        lookup(sni, |host| {
            let id = cache.hosts.get(host)?;
            cache.certs.get(id).map(|(_, c)| c.clone())
        })
    })
}

/// The certificate of id `id` (a Gateway HTTPS listener's, named by the
/// route table), refreshed as [`find`] does.
pub fn find_id(zone: &Zone, id: &str, on_error: impl FnMut(&str, &str)) -> Option<Rc<Loaded>> {
    with_fresh(zone, on_error, |cache| cache.certs.get(id).map(|(_, c)| c.clone()))
}

/// Runs `f` on this worker's cache, refreshed first if the zone's
/// `cert_generation` moved.
fn with_fresh<T>(zone: &Zone, on_error: impl FnMut(&str, &str), f: impl FnOnce(&CertCache) -> T) -> T {
    CACHE.with_borrow_mut(|cache| {
        let generation = zone.header().cert_generation.load(Ordering::Acquire);
        if generation != cache.generation {
            refresh(cache, zone, on_error);
            cache.generation = generation;
        }
        f(cache)
    })
}

fn refresh(cache: &mut CertCache, zone: &Zone, mut on_error: impl FnMut(&str, &str)) {
    let (servers, live, changed) = {
        let state = zone.header().certs.read();
        let servers = servers_of(state.servers);
        let mut live = Vec::with_capacity(state.certs.len);
        let mut changed = Vec::new();
        for blob in state.certs.blobs() {
            let id = String::from_utf8_lossy(blob.name()).into_owned();
            if cache.certs.get(&id).is_none_or(|(v, _)| *v != blob.version) {
                changed.push((id.clone(), blob.version, blob.runtime().to_vec()));
            }
            live.push(id);
        }
        (servers, live, changed)
    };
    let live: std::collections::HashSet<String> = live.into_iter().collect();
    cache.certs.retain(|id, _| live.contains(id));
    for (id, version, payload) in changed {
        match load(&payload) {
            Ok(loaded) => {
                cache.certs.insert(id, (version, Rc::new(loaded)));
            }
            Err(e) => {
                cache.certs.remove(&id);
                on_error(&id, &e);
            }
        }
    }
    cache.hosts = servers.into_iter().collect();
}
