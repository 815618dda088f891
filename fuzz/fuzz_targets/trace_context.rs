//! Tracing's hostile inputs: a client's `traceparent` and `tracestate`, a
//! request's texts turned into a span and its OTLP message, and a
//! collector's answer. Nothing panics; a parsed `traceparent` writes back
//! as itself (its undefined flags cleared); a `tracestate` passed on is
//! bounded; the gRPC frame decodes to the spans that went in, every text
//! at most 1 KiB (and its mark).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lua_compat::otel::draft::{SpanDraft, Text, MAX_TEXT};
use lua_compat::otel::otlp::{self, ExportTraceServiceRequest, ResourceInfo};
use lua_compat::otel::trace_context::{self, TraceParent, FLAG_SAMPLED, MAX_TRACESTATE};
use prost::Message;

const TEXTS: [Text; 10] = [
    Text::Name,
    Text::TraceState,
    Text::Method,
    Text::Target,
    Text::ServerName,
    Text::Host,
    Text::UserAgent,
    Text::PeerIp,
    Text::UpstreamName,
    Text::UpstreamAddress,
];

fuzz_target!(|data: (Vec<u8>, Vec<u8>, Vec<Vec<u8>>, (u16, u32, Option<u16>), Vec<u8>)| {
    let (traceparent, tracestate, texts, (status, version, upstream_status), answer) = data;

    if let Some(p) = TraceParent::parse(&traceparent) {
        let written = p.format();
        let again = TraceParent::parse(&written).expect("what we write parses");
        assert_eq!((again.trace_id, again.span_id), (p.trace_id, p.span_id));
        assert_eq!(again.flags, p.flags & FLAG_SAMPLED);
        assert!(written.iter().all(|c| c.is_ascii_hexdigit() || *c == b'-'));
    }
    if trace_context::tracestate_is_valid(&tracestate) {
        assert!(tracestate.len() <= MAX_TRACESTATE);
        // Tabs are the optional whitespace around members; nothing else.
        assert!(!tracestate.iter().any(|c| c.is_ascii_control() && *c != b'\t'));
    }

    let mut draft = SpanDraft::new([7; 16], [9; 8], texts.iter().map(Vec::len).sum());
    for (which, bytes) in TEXTS.iter().zip(&texts) {
        draft.set(*which, bytes);
    }
    draft.http_status = status;
    draft.http_version = version;
    draft.upstream = upstream_status.map(|s| lua_compat::otel::draft::UpstreamTimes {
        status: s,
        attempts: 1,
        ..Default::default()
    });
    let record = draft.into_record();
    let cap = MAX_TEXT + '…'.len_utf8() + 2 * MAX_TEXT; // U+FFFD may triple a byte
    assert!(record.name.len() <= cap && record.trace_state.len() <= cap);
    for (key, value) in &record.attributes {
        if let lua_compat::otel::span::Value::Str(s) = value {
            assert!(s.len() <= cap, "{key}: {} bytes", s.len());
        }
    }
    let resource = ResourceInfo {
        service_name: "fuzz".into(),
        host_name: "fuzz".into(),
    };
    let frame = otlp::grpc_frame(&otlp::export_request(&resource, vec![record]));
    assert_eq!(frame[0], 0);
    let len = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize;
    assert_eq!(len, frame.len() - 5);
    let decoded = ExportTraceServiceRequest::decode(&frame[5..]).expect("our frame decodes");
    let spans = &decoded.resource_spans[0].scope_spans[0].spans;
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0].trace_id, vec![7; 16]);

    // A collector's answer, whatever it is.
    let _ = otlp::export_outcome(Some("0"), None, &answer);
    let _ = otlp::export_outcome(None, Some("x"), &answer);
});
