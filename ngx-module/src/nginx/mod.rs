//! nginx itself, wrapped once: the module's handles, panics kept out of
//! nginx, the worker process, requests and their variables.
//!
//! The bottom floor: nothing here knows about backends, zones or the
//! module's configuration, and it imports nothing else of this crate.

pub mod directive;
pub mod guard;
pub mod headers;
pub mod module;
pub mod request;
pub mod variables;
pub mod worker;
