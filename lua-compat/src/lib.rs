//! The contract of ingress-nginx's Lua layer, in pure Rust.
//!
//! ingress-nginx pushes its backends to `configuration.lua` as a JSON array and
//! picks peers with `balancer.lua`. This crate holds both halves without any
//! nginx in them, so they can be unit-tested and fuzzed:
//!
//! - [`address`]: the upstream addresses no backend may name (loopback,
//!   link-local, this-host);
//! - [`wire`]: serde types for `POST /configuration/backends`, accepting what a
//!   real ingress-nginx controller sends (unknown fields are ignored, as Lua does);
//! - [`validate`]: parsing plus validation that names the JSON path of the first
//!   bad value, e.g. `[3].endpoints[0].port`;
//! - [`runtime`]: the compact, validated record the nginx module keeps in shared
//!   memory and decodes in each worker;
//! - [`algorithm`]: which algorithm balances a backend, as `balancer.lua` decides;
//! - [`round_robin`], [`least_conn`], [`ewma`], [`chash`] and [`sticky`]: the
//!   pickers, compatible with the Lua ones where Lua has them;
//! - [`selection`]: one selection mechanism over those pickers: a selector
//!   per backend and algorithm, and the retry and health tiers applied once;
//! - [`canary`]: canary routing rules, in Lua's order;
//! - [`hash_key`]: `upstream-hash-by` templates;
//! - [`escape`]: `$escaped_request_uri`, the request URI as one URI
//!   component (external authentication's sign-in redirect);
//! - [`https_redirect`]: `ssl-redirect`/`force-ssl-redirect` decided and
//!   written as `lua_ingress.rewrite()` does;
//! - [`endpoint_state`]: the table of per-endpoint state every worker shares
//!   (passive health, connections, EWMA), laid out for shared memory; it
//!   grows with the zone, and shares a full zone fairly among backends;
//! - [`dns`]: `ExternalName` resolution with a cache and a deadline;
//! - [`tried`]: the per-request set of endpoints already tried;
//! - [`shm_rwlock`]: the zone's reader-writer lock, which survives a
//!   holder's death;
//! - [`certificates`]: certificate ids, servers maps, the SNI lookup order;
//! - [`api`]: routing and response bodies of the `/configuration` API.
//! - [`metrics`]: request counters and histograms laid out for shared
//!   memory, and their Prometheus text with ingress-nginx's names;
//! - [`otel`]: OpenTelemetry tracing's pure half: W3C trace context, the
//!   sampler, span records and OTLP/gRPC's export messages;
//! - [`request_id`]: `$req_id` as ingress-nginx gives it, from a per-worker
//!   ChaCha20 stream instead of a `RAND_bytes` call per request;
//! - [`state_file`]: the state file's format (the backends a restarted
//!   nginx starts with), read back through a POST's validation;
//! - [`atomic_file`]: replacing a file so that readers and crashes see the
//!   old or the new bytes only, with writers in several processes.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod addr_text;
pub mod address;
pub mod algorithm;
pub mod api;
pub mod atomic_file;
pub mod canary;
pub mod certificates;
pub mod chash;
pub mod dns;
pub mod endpoint_state;
pub mod escape;
pub mod ewma;
pub mod hash_key;
pub mod https_redirect;
pub mod least_conn;
pub mod metrics;
pub mod otel;
pub mod request_id;
pub mod round_robin;
pub mod routes;
pub mod runtime;
pub mod sample;
pub mod selection;
pub mod shm_rwlock;
pub mod state_file;
pub mod sticky;
pub mod tried;
pub mod validate;
pub mod wire;

pub use validate::{parse_backend, parse_backends, validate_backend, ValidationError};
pub use wire::Backend;
