//! A finished server span with its attributes, as the exporter thread
//! makes it of a [`super::draft::SpanDraft`] and encodes it.

use super::trace_context::{SpanId, TraceId};

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Double(f64),
}

/// One request's server span.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanRecord {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The trusted caller's span, when the request had one.
    pub parent_span_id: Option<SpanId>,
    /// The caller's `tracestate`, forwarded with the trace.
    pub trace_state: String,
    pub name: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// The response status: 5xx marks the span as an error (the HTTP
    /// semantic conventions' rule for server spans; 4xx is the client's).
    pub http_status: u16,
    pub attributes: Vec<(&'static str, Value)>,
}

impl SpanRecord {
    /// The span's W3C flags with OTLP's "parent is remote" bits: sampled
    /// (every exported span is), and whether the parent came from a caller.
    pub fn otlp_flags(&self) -> u32 {
        const SAMPLED: u32 = 0x01;
        const HAS_IS_REMOTE: u32 = 0x100;
        const IS_REMOTE: u32 = 0x200;
        SAMPLED | HAS_IS_REMOTE | if self.parent_span_id.is_some() { IS_REMOTE } else { 0 }
    }

    /// Whether the span records a server error.
    pub fn is_error(&self) -> bool {
        self.http_status >= 500 || self.http_status == 0
    }
}
