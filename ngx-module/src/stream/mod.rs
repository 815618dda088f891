//! `ngx_stream_dynamic_balancer_module`, the stream half: its directives
//! and module context, its configuration, the peer hook of TCP and UDP
//! upstreams (the same backends and selectors as HTTP), Gateway routes per
//! connection, TLS terminated with a listener's certificates and TLS to
//! backends a BackendTLSPolicy covers.
//!
//! May use every floor below it except [`crate::api`]; its peer hook shares
//! [`crate::http::peer`]'s selection.

pub mod backend_tls;
pub mod conf;
pub mod directives;
pub mod peer;
pub mod routes;
pub mod tls;
