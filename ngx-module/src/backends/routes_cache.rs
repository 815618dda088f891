//! Each worker's compiled route table, refreshed by generation.
//!
//! When `route_generation` is the one this worker compiled, a request
//! costs one atomic load; otherwise the worker copies the table's JSON
//! under the read lock and compiles it outside the lock (hash maps of host
//! groups, regular expressions built). Requests in flight keep the table
//! they matched (`Rc`) until they end.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use lua_compat::routes::matcher::{Compiled, CompiledListener};
use lua_compat::routes::RouteTable;

use crate::conf::ListenerMemo;
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
    current_of_generation(zone, on_error).map(|(table, _)| table)
}

/// [`current`] with the generation it belongs to. A generation names one
/// table object for as long as it is this worker's: the table changes only
/// with the generation (a table that does not compile keeps the previous
/// object under the new number).
fn current_of_generation(zone: &Zone, on_error: impl FnOnce(&str)) -> Option<(Rc<Compiled>, u64)> {
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
        Some((cache.table.clone()?, cache.generation))
    })
}

/// In the current table (`None` when there is none), the listener named
/// `name` (`Some(None)` when the table has no such listener), which `memo`
/// (always the same location's, for the same `name`) remembers.
pub fn current_listener(
    zone: &Zone,
    memo: &ListenerMemo,
    name: &[u8],
    on_error: impl FnOnce(&str),
) -> Option<Option<Listener>> {
    let (table, generation) = current_of_generation(zone, on_error)?;
    let found = match memo.get() {
        Some((g, listener)) if g == generation => Some(listener),
        _ => {
            let found = table.listener(name).map(NonNull::from);
            if let Some(l) = found {
                memo.set(generation, l);
            }
            found
        }
    };
    Some(found.map(|listener| Listener { table, listener }))
}

/// A listener of a table, with a hold on the table.
pub struct Listener {
    table: Rc<Compiled>,
    listener: NonNull<CompiledListener>,
}

impl Listener {
    pub fn get(&self) -> &CompiledListener {
        // SAFETY: the pointer was taken from the table of the generation it
        // is remembered with, and used only while that generation is the
        // cache's, so `table` (that generation's table) holds it; a
        // compiled table is never changed.
        unsafe { self.listener.as_ref() }
    }

    pub fn table(&self) -> &Rc<Compiled> {
        &self.table
    }
}

fn compile(json: &[u8]) -> Result<Compiled, String> {
    let table: RouteTable = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    Compiled::new(&table).map_err(|e| e.to_string())
}
