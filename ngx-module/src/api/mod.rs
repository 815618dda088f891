//! The `/configuration` API (`dynamic_balancer_api`): the content handler,
//! the certificate routes, the body limit enforced while a body streams
//! in, and the per-worker thread that parses and applies writes off the
//! event loop.
//!
//! May use every floor below it: [`crate::nginx`], [`crate::shm`],
//! [`crate::conf`], [`crate::backends`], [`crate::http`] (the per-request
//! state, the metrics text) and [`crate::tls`].

pub mod body_limit;
pub mod certificates;
pub mod handler;
pub mod offload;
