//! A location's listener, as resolved in the route table of one
//! generation ([`crate::backends::routes_cache::current_listener`]): the
//! listener's name is hashed and looked up once per table a worker
//! compiles, not once per request.

use std::cell::Cell;
use std::ptr::NonNull;

use lua_compat::routes::matcher::CompiledListener;

/// Lives in the location's configuration, which is the worker's own after
/// fork (only its event loop reads and writes it). The pointer is only a
/// remembered answer: [`crate::backends::routes_cache`] uses it while the
/// generation it was found in is the cache's, whose table holds it.
#[derive(Default)]
pub struct ListenerMemo(Cell<Option<(u64, NonNull<CompiledListener>)>>);

impl ListenerMemo {
    pub fn get(&self) -> Option<(u64, NonNull<CompiledListener>)> {
        self.0.get()
    }

    pub fn set(&self, generation: u64, listener: NonNull<CompiledListener>) {
        self.0.set(Some((generation, listener)));
    }
}
