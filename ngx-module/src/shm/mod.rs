//! The shared memory every worker reads: the backends' zone (its header,
//! slab and locks), the blobs and index readers see, the writes that swap
//! them, the request counters' own zone, and the state file that carries
//! the backends across a restart.
//!
//! May use [`crate::nginx`] only.

pub mod index;
pub mod metrics_zone;
pub mod routes;
pub mod state_file;
pub mod store;
pub mod zone;
