//! The request-time hooks of proxied traffic: the per-request state, the
//! peer hook that replaces `balancer_by_lua`, the preaccess 503, the HTTPS
//! redirect, the module's variables (forwarded scheme and port, request
//! id, WebSocket headers, escaped URI, ingress-nginx's log variables) and
//! the log-phase metrics counter, and tracing's spans.
//!
//! May use [`crate::nginx`], [`crate::shm`], [`crate::otel`],
//! [`crate::conf`] and [`crate::backends`].

pub mod connection_upgrade;
pub mod escaped_uri;
pub mod forwarded;
pub mod gateway;
pub mod gateway_cors;
pub mod gateway_headers;
pub mod gateway_matched;
pub mod gateway_mirror;
pub mod gateway_upstream;
pub mod grpc_status;
pub mod https_redirect;
pub mod log_variables;
pub mod metrics;
pub mod otel;
pub mod peer;
pub mod preaccess;
pub mod request_ctx;
pub mod request_id;
