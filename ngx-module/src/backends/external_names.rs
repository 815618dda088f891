//! `ExternalName` backends, whose endpoints are DNS names.
//!
//! Each worker resolves through one [`DnsCache`]: a write waits for DNS at
//! most [`WRITE_WAIT`] in total, so a slow or hostile name never holds back
//! the writes behind it, and an answer that comes later is picked up by the
//! refresher. Worker 0 runs the refresher thread, which re-resolves every
//! such backend once a second (as `balancer.lua` does) and updates it in
//! the zone only when its addresses changed, and only if no write replaced
//! it meanwhile. Addresses that [`lua_compat::address::forbidden`] refuses
//! (a name that resolves to loopback, say) are refused at write time (400)
//! and left out, with an error in the log, when they appear later.
//!
//! These threads never call into nginx: their log lines are queued and
//! written by the worker's timer ([`drain_log`]).

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use lua_compat::dns::{system_lookup, DnsCache, Resolved};
use lua_compat::runtime::{OnForbidden, Prepared};
use lua_compat::wire::Backend;
use ngx::ffi::{ngx_uint_t, NGX_LOG_ERR, NGX_LOG_INFO, NGX_LOG_WARN};

use crate::shm::store::{apply, Change, StoreError};
use crate::shm::zone::Zone;

/// The longest a write waits for DNS, over all of its names.
pub const WRITE_WAIT: Duration = Duration::from_millis(500);
/// A cached answer this young is used by writes without asking again.
const WRITE_MAX_AGE: Duration = Duration::from_secs(30);
/// How often the refresher re-resolves.
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// The refresher's wait for one name.
const REFRESH_WAIT: Duration = Duration::from_secs(2);
/// Lookup threads per worker.
const LOOKUP_THREADS: usize = 2;
/// Queued log lines are dropped beyond this, should the timer stall.
const MAX_QUEUED_LOG: usize = 1000;

static DNS: OnceLock<Option<DnsCache>> = OnceLock::new();
static STOP: AtomicBool = AtomicBool::new(false);
static LOG: Mutex<Vec<(ngx_uint_t, String)>> = Mutex::new(Vec::new());

/// This worker's DNS cache, started on first use; `None` if its threads
/// could not be started.
fn dns() -> Option<&'static DnsCache> {
    DNS.get_or_init(|| DnsCache::start(LOOKUP_THREADS, system_lookup(), crate::nginx::worker::block_signals).ok())
        .as_ref()
}

fn log(level: u32, line: String) {
    let mut queue = LOG.lock().unwrap_or_else(|e| e.into_inner());
    if queue.len() < MAX_QUEUED_LOG {
        queue.push((level as ngx_uint_t, line));
    }
}

/// Writes the queued log lines (on the event loop, from the worker timer).
pub fn drain_log(mut write: impl FnMut(ngx_uint_t, &str)) {
    let lines = std::mem::take(&mut *LOG.lock().unwrap_or_else(|e| e.into_inner()));
    for (level, line) in lines {
        write(level, &line);
    }
}

/// The resolver a write uses: cached answers, else a lookup awaited until
/// the write's shared deadline. Names that miss it are noted in `warnings`.
pub fn write_resolver(warnings: &mut Vec<String>) -> impl FnMut(&str, u16) -> Vec<IpAddr> + '_ {
    let deadline = Instant::now() + WRITE_WAIT;
    move |host: &str, _port: u16| {
        let Some(dns) = dns() else {
            warnings.push(format!("{host:?} not resolved: the DNS threads could not be started"));
            return Vec::new();
        };
        match dns.resolve(host, WRITE_MAX_AGE, deadline) {
            Resolved::Fresh(a) => a,
            Resolved::Stale(a) => a,
            Resolved::Unknown => {
                warnings.push(format!(
                    "{host:?} did not resolve within {} ms; the backend gets its addresses when it does (retried every second)",
                    WRITE_WAIT.as_millis()
                ));
                Vec::new()
            }
            Resolved::Failed => {
                warnings.push(format!("{host:?} does not resolve; retried every second"));
                Vec::new()
            }
        }
    }
}

/// Starts the refresher in worker 0 (one per nginx, whatever the number
/// of workers; a worker of the previous cycle may overlap for a moment,
/// which the conditional update makes harmless).
pub fn start_refresher(zone: Zone) {
    STOP.store(false, Ordering::Relaxed);
    let spawned = std::thread::Builder::new()
        .name("dynbal-resolve".into())
        .spawn(move || {
            crate::nginx::worker::block_signals();
            refresher(zone);
        });
    if let Err(e) = spawned {
        log(
            NGX_LOG_ERR,
            format!("dynamic_balancer: cannot start the DNS refresher: {e}"),
        );
    }
}

/// Stops the refresher (worker exit or shutdown).
pub fn stop() {
    STOP.store(true, Ordering::Relaxed);
}

fn refresher(zone: Zone) {
    // Warnings already logged, so a name that keeps resolving to loopback
    // is reported once, not every second.
    let mut reported: HashSet<String> = HashSet::new();
    while !STOP.load(Ordering::Relaxed) {
        std::thread::sleep(REFRESH_EVERY);
        if STOP.load(Ordering::Relaxed) || zone.header().resolving.load(Ordering::Relaxed) == 0 {
            continue;
        }
        let Some(dns) = dns() else { continue };
        let pending: Vec<(u64, Vec<u8>)> = {
            let index = zone.header().index.read();
            index
                .blobs()
                .filter(|b| b.resolves)
                .map(|b| (b.version, b.json().to_vec()))
                .collect()
        };
        let mut now_reported = HashSet::new();
        for (version, json) in pending {
            if STOP.load(Ordering::Relaxed) {
                return;
            }
            refresh_one(&zone, dns, version, &json, &mut reported, &mut now_reported);
        }
        reported = now_reported;
        dns.expire();
    }
}

fn refresh_one(
    zone: &Zone,
    dns: &DnsCache,
    version: u64,
    json: &[u8],
    reported: &mut HashSet<String>,
    now_reported: &mut HashSet<String>,
) {
    let Ok(backend) = serde_json::from_slice::<Backend>(json) else {
        return;
    };
    let deadline = Instant::now() + REFRESH_WAIT;
    let mut resolve = |host: &str, _port: u16| dns.resolve(host, REFRESH_EVERY / 2, deadline).addrs();
    let Ok(item) = Prepared::build(&backend, &mut resolve, OnForbidden::Drop) else {
        return;
    };
    for w in &item.warnings {
        if !reported.contains(w) {
            log(NGX_LOG_ERR, format!("dynamic_balancer: {w}"));
        }
        now_reported.insert(w.clone());
    }
    let endpoints = item.endpoints;
    match apply(
        zone,
        Change::Refresh {
            item,
            expected: version,
        },
    ) {
        Ok(a) => log(
            NGX_LOG_INFO,
            format!(
                "dynamic_balancer: backend \"{}\" re-resolved to {endpoints} endpoints, generation {}",
                backend.name, a.generation
            ),
        ),
        Err(StoreError::Superseded | StoreError::NotFound) => {}
        Err(StoreError::ZoneFull { needed, .. }) => log(
            NGX_LOG_WARN,
            format!(
                "dynamic_balancer: backend \"{}\" re-resolved but the zone has no room ({needed} bytes needed)",
                backend.name
            ),
        ),
    }
}
