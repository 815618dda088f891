//! The contract of ingress-nginx's Lua layer, in pure Rust.
//!
//! ingress-nginx pushes its backends to `configuration.lua` as a JSON array and
//! picks peers with `balancer.lua`. This crate holds both halves without any
//! nginx in them, so they can be unit-tested and fuzzed:
//!
//! - [`wire`]: serde types for `POST /configuration/backends`, accepting what a
//!   real ingress-nginx controller sends (unknown fields are ignored, as Lua does);
//! - [`validate`]: parsing plus validation that names the JSON path of the first
//!   bad value, e.g. `[3].endpoints[0].port`;
//! - [`runtime`]: the compact, validated record the nginx module keeps in shared
//!   memory and decodes in each worker;
//! - [`round_robin`] and [`tried`]: the smooth weighted round-robin picker and the
//!   per-request set of endpoints already tried;
//! - [`api`]: routing and response bodies of the `/configuration` API.

pub mod api;
pub mod round_robin;
pub mod runtime;
pub mod tried;
pub mod validate;
pub mod wire;

pub use validate::{parse_backend, parse_backends, ValidationError};
pub use wire::Backend;
