//! OTLP/gRPC's trace export (`opentelemetry.proto.collector.trace.v1`):
//! the messages the module sends, with prost, and gRPC's message framing.
//!
//! Only the fields the module writes are declared; their numbers are the
//! published `.proto`'s (a decoder skips what it does not know, so a
//! subset is a valid message). Declared by hand rather than generated:
//! `opentelemetry-proto` would bring its build of tonic into the nginx
//! module for a dozen messages.

use prost::Message;

use super::span::{SpanRecord, Value};

/// The gRPC method the collector serves.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

#[derive(Clone, PartialEq, Message)]
pub struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ExportTraceServiceResponse {
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportTracePartialSuccess>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ExportTracePartialSuccess {
    #[prost(int64, tag = "1")]
    pub rejected_spans: i64,
    #[prost(string, tag = "2")]
    pub error_message: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
}

#[derive(Clone, PartialEq, Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(string, tag = "3")]
    pub trace_state: String,
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub name: String,
    /// `SpanKind`: 2 is `SPAN_KIND_SERVER`.
    #[prost(int32, tag = "6")]
    pub kind: i32,
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
    #[prost(fixed32, tag = "16")]
    pub flags: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Status {
    #[prost(string, tag = "2")]
    pub message: String,
    /// 0 unset, 1 ok, 2 error.
    #[prost(int32, tag = "3")]
    pub code: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 3, 4")]
    pub value: Option<any_value::Value>,
}

pub mod any_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        StringValue(String),
        #[prost(int64, tag = "3")]
        IntValue(i64),
        #[prost(double, tag = "4")]
        DoubleValue(f64),
    }
}

/// `SPAN_KIND_SERVER`.
pub const SPAN_KIND_SERVER: i32 = 2;
/// `STATUS_CODE_ERROR`.
pub const STATUS_CODE_ERROR: i32 = 2;

/// The resource every span of a worker shares: `service.name` and the
/// instrumentation's identity.
#[derive(Clone, Debug)]
pub struct ResourceInfo {
    pub service_name: String,
    /// `host.name`, so spans of several nginx instances tell apart.
    pub host_name: String,
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

fn span_message(s: SpanRecord) -> Span {
    let status = s.is_error().then(|| Status {
        message: String::new(),
        code: STATUS_CODE_ERROR,
    });
    let flags = s.otlp_flags();
    Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        trace_state: s.trace_state,
        parent_span_id: s.parent_span_id.map(|p| p.to_vec()).unwrap_or_default(),
        name: s.name,
        kind: SPAN_KIND_SERVER,
        start_time_unix_nano: s.start_unix_nano,
        end_time_unix_nano: s.end_unix_nano,
        attributes: s
            .attributes
            .into_iter()
            .map(|(k, v)| {
                kv(
                    k,
                    match v {
                        Value::Str(s) => any_value::Value::StringValue(s),
                        Value::Int(i) => any_value::Value::IntValue(i),
                        Value::Double(d) => any_value::Value::DoubleValue(d),
                    },
                )
            })
            .collect(),
        status,
        flags,
    }
}

/// One export request for `spans`, all from the resource `resource`.
pub fn export_request(resource: &ResourceInfo, spans: Vec<SpanRecord>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv(
                        "service.name",
                        any_value::Value::StringValue(resource.service_name.clone()),
                    ),
                    kv("host.name", any_value::Value::StringValue(resource.host_name.clone())),
                    kv(
                        "telemetry.sdk.name",
                        any_value::Value::StringValue("dynamic-balancer".into()),
                    ),
                    kv("telemetry.sdk.language", any_value::Value::StringValue("rust".into())),
                ],
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "nginx".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans: spans.into_iter().map(span_message).collect(),
            }],
        }],
    }
}

/// A gRPC message frame: the compressed flag (0), the length (4 bytes,
/// big-endian) and the encoded message.
pub fn grpc_frame(request: &ExportTraceServiceRequest) -> Vec<u8> {
    let len = request.encoded_len();
    let mut out = Vec::with_capacity(5 + len);
    out.push(0);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    request.encode(&mut out).expect("a Vec grows");
    out
}

/// What a collector answered, from its `grpc-status` and `grpc-message`
/// (trailers, or headers of a trailers-only response) and the response
/// message, if any.
#[derive(Debug, PartialEq)]
pub enum ExportOutcome {
    /// All spans accepted.
    Accepted,
    /// Accepted with some spans refused (OTLP's partial success).
    Partial { rejected: i64, message: String },
    /// The call failed: a gRPC status other than OK.
    Failed { status: String, message: String },
}

/// Reads the outcome of an Export call: `status` is `grpc-status`
/// (absent counts as a failure: the server did not finish the call),
/// `body` the response frames.
pub fn export_outcome(status: Option<&str>, message: Option<&str>, body: &[u8]) -> ExportOutcome {
    match status {
        Some("0") => {}
        other => {
            return ExportOutcome::Failed {
                status: other.unwrap_or("missing").to_string(),
                message: message.unwrap_or_default().to_string(),
            }
        }
    }
    if body.len() >= 5 && body[0] == 0 {
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        if let Some(msg) = body.get(5..5 + len) {
            if let Ok(r) = ExportTraceServiceResponse::decode(msg) {
                if let Some(p) = r.partial_success.filter(|p| p.rejected_spans > 0) {
                    return ExportOutcome::Partial {
                        rejected: p.rejected_spans,
                        message: p.error_message,
                    };
                }
            }
        }
    }
    ExportOutcome::Accepted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: u16) -> SpanRecord {
        SpanRecord {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent_span_id: Some([3; 8]),
            trace_state: "k=v".into(),
            name: "GET /".into(),
            start_unix_nano: 10,
            end_unix_nano: 20,
            http_status: status,
            attributes: vec![
                ("http.method", Value::Str("GET".into())),
                ("http.status_code", Value::Int(i64::from(status))),
                ("upstream.response_time", Value::Double(0.25)),
            ],
        }
    }

    #[test]
    fn a_batch_round_trips_through_the_wire_format() {
        let resource = ResourceInfo {
            service_name: "nginx".into(),
            host_name: "h".into(),
        };
        let req = export_request(&resource, vec![record(200), record(502)]);
        let frame = grpc_frame(&req);
        assert_eq!(frame[0], 0);
        let len = u32::from_be_bytes(frame[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 5);
        let back = ExportTraceServiceRequest::decode(&frame[5..]).unwrap();
        assert_eq!(back, req);
        let spans = &back.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans[0].kind, SPAN_KIND_SERVER);
        assert_eq!(spans[0].status, None);
        assert_eq!(spans[1].status.as_ref().unwrap().code, STATUS_CODE_ERROR);
        assert_eq!(spans[0].flags, 0x301);
        assert_eq!(spans[0].parent_span_id, vec![3; 8]);
    }

    #[test]
    fn the_span_fields_have_the_published_numbers() {
        // trace_id is field 1, length-delimited: tag byte 0x0a, then 16.
        let s = span_message(record(200));
        let bytes = s.encode_to_vec();
        assert_eq!(&bytes[..2], &[0x0a, 16]);
        // start_time_unix_nano: field 7, fixed64 (wire type 1): tag 0x39.
        assert!(bytes.windows(9).any(|w| w[0] == 0x39 && w[1..] == 10u64.to_le_bytes()));
        // flags: field 16, fixed32 (wire type 5): tag 0x85 0x01.
        assert!(bytes
            .windows(6)
            .any(|w| w[..2] == [0x85, 0x01] && w[2..] == 0x301u32.to_le_bytes()));
    }

    #[test]
    fn outcomes_are_read_from_the_status_and_the_response() {
        assert_eq!(export_outcome(Some("0"), None, &[]), ExportOutcome::Accepted);
        let resp = ExportTraceServiceResponse {
            partial_success: Some(ExportTracePartialSuccess {
                rejected_spans: 2,
                error_message: "too old".into(),
            }),
        };
        let mut body = vec![0];
        body.extend_from_slice(&(resp.encoded_len() as u32).to_be_bytes());
        body.extend(resp.encode_to_vec());
        assert_eq!(
            export_outcome(Some("0"), None, &body),
            ExportOutcome::Partial {
                rejected: 2,
                message: "too old".into()
            }
        );
        assert_eq!(
            export_outcome(Some("14"), Some("unavailable"), &[]),
            ExportOutcome::Failed {
                status: "14".into(),
                message: "unavailable".into()
            }
        );
        assert!(matches!(export_outcome(None, None, &[]), ExportOutcome::Failed { .. }));
    }
}
