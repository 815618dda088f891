//! What a worker does with the zone's backends: decodes them into its own
//! cache (large hash rings built off the event loop), picks between a
//! backend and its canaries, and re-resolves `ExternalName` endpoints.
//!
//! May use [`crate::nginx`], [`crate::shm`] and [`crate::conf`].

pub mod canary;
pub mod external_names;
pub mod ring_builder;
pub mod routes_cache;
pub mod worker_cache;
