//! OpenTelemetry tracing's worker side: each worker's span queue and the
//! exporter thread that drains it to an OTLP/gRPC collector. The request
//! path only moves a finished span into a bounded queue (or counts it
//! dropped); encoding, batching and the network are the thread's, so a
//! slow or absent collector never blocks a worker.
//!
//! May use [`crate::nginx`] and [`crate::shm`] (the span counters in the
//! metrics zone). The phase handlers and variables are in
//! `crate::http::otel`; the directives in `crate::directives`.

pub mod exporter;
pub mod queue;
