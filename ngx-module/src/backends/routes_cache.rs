//! Each worker's compiled route table, refreshed by generation.
//!
//! When `route_generation` is the one this worker compiled, a request
//! costs one atomic load; otherwise the worker copies the table's JSON
//! under the read lock and compiles it outside the lock (hash maps of host
//! groups, regular expressions built). Requests in flight keep the table
//! they matched (`Rc`) until they end.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use lua_compat::routes::matcher::Compiled;
use lua_compat::routes::RouteTable;

use crate::shm::routes;
use crate::shm::zone::Zone;

#[derive(Default)]
struct RouteCache {
    /// `route_generation` this cache reflects; 0 = never refreshed.
    generation: u64,
    table: Option<Rc<Compiled>>,
}

thread_local! {
    static CACHE: RefCell<RouteCache> = RefCell::new(RouteCache::default());
}

/// The current table; `None` when none was pushed. `on_error` hears of a
/// stored table that does not compile (validation compiled it before it
/// was stored, so only a module bug gets there); the previous table stays.
pub fn current(zone: &Zone, on_error: impl FnOnce(&str)) -> Option<Rc<Compiled>> {
    CACHE.with_borrow_mut(|cache| {
        let generation = zone.header().route_generation.load(Ordering::Acquire);
        if generation != cache.generation {
            let (stored, json) = routes::read(zone);
            match json.map(|j| compile(&j)) {
                None => cache.table = None,
                Some(Ok(table)) => cache.table = Some(Rc::new(table)),
                Some(Err(e)) => on_error(&e),
            }
            cache.generation = stored;
        }
        cache.table.clone()
    })
}

fn compile(json: &[u8]) -> Result<Compiled, String> {
    let table: RouteTable = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    Compiled::new(&table).map_err(|e| e.to_string())
}
