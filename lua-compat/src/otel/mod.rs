//! OpenTelemetry tracing for the module, without an SDK in the worker:
//! W3C trace context ([`trace_context`]), the head sampler ([`sampler`]),
//! ids ([`ids`]), the span the request path queues ([`draft`]), the record
//! the exporter thread makes of it ([`span`]), and OTLP/gRPC's export
//! messages ([`otlp`]). The nginx side (phase
//! handlers, variables, the exporter thread) is in `ngx-module`.

pub mod draft;
pub mod ids;
pub mod otlp;
pub mod sampler;
pub mod settings;
pub mod span;
pub mod trace_context;
