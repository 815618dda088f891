//! A finished span as the request path leaves it: the numbers, and every
//! text copied as bytes into one buffer. Turning it into a [`SpanRecord`]
//! (a `String` per attribute, UTF-8 checks, the semantic-convention
//! names) is the exporter thread's work, so a sampled request costs the
//! worker a copy of a few hundred bytes (and an allocation only when its
//! texts exceed 256 bytes).

use smallvec::SmallVec;

use super::span::{SpanRecord, Value};
use super::trace_context::{SpanId, TraceId};

/// The most bytes of one text a span keeps: a queue of full spans then
/// stays within a few MiB per worker whatever the clients send (a request
/// line may be 64 KiB). A cut text ends with `…`.
pub const MAX_TEXT: usize = 1024;

/// The texts of a span, in the order their attributes are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Text {
    /// The span's name.
    Name,
    /// The caller's `tracestate`.
    TraceState,
    Method,
    Target,
    ServerName,
    Host,
    UserAgent,
    PeerIp,
    /// ingress-nginx's upstream name (`$proxy_upstream_name`).
    UpstreamName,
    /// The last attempt's peer.
    UpstreamAddress,
}

const TEXTS: usize = Text::UpstreamAddress as usize + 1;

/// Bytes of text a draft holds without allocating: a typical request's
/// name, method, target, host, user agent, addresses and upstream name.
const INLINE: usize = 256;

/// The upstream's last attempt, in milliseconds as nginx keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpstreamTimes {
    /// 0 when the upstream sent no status.
    pub status: u16,
    pub connect_ms: Option<u64>,
    pub header_ms: Option<u64>,
    pub response_ms: Option<u64>,
    /// Peers tried.
    pub attempts: u32,
}

/// One request's span, before its attributes are built.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanDraft {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    pub http_status: u16,
    /// nginx's `http_version`: 1000 for HTTP/1.0, 1001, 2000, 3000.
    pub http_version: u32,
    pub https: bool,
    /// The port the request came in on (`net.host.port`).
    pub host_port: Option<u16>,
    pub peer_port: Option<u16>,
    /// None when the request was not proxied.
    pub upstream: Option<UpstreamTimes>,
    bytes: SmallVec<[u8; INLINE]>,
    /// Where each [`Text`] is in `bytes` (start, length); length 0 is
    /// absent.
    texts: [(u32, u32); TEXTS],
    /// Bit `t` set: text `t` was cut at [`MAX_TEXT`].
    cut: u16,
}

impl SpanDraft {
    /// A draft with no texts yet; `capacity` bytes reserved for them (no
    /// allocation up to 256 bytes, one above when the caller sums the
    /// lengths first).
    pub fn new(trace_id: TraceId, span_id: SpanId, capacity: usize) -> SpanDraft {
        SpanDraft {
            trace_id,
            span_id,
            parent_span_id: None,
            start_unix_nano: 0,
            end_unix_nano: 0,
            http_status: 0,
            http_version: 0,
            https: false,
            host_port: None,
            peer_port: None,
            upstream: None,
            bytes: SmallVec::with_capacity(capacity.min(TEXTS * MAX_TEXT)),
            texts: [(0, 0); TEXTS],
            cut: 0,
        }
    }

    /// Copies `value` in as `which` (at most [`MAX_TEXT`] bytes of it); a
    /// second copy of the same text replaces the first.
    pub fn set(&mut self, which: Text, value: &[u8]) {
        let kept = &value[..value.len().min(MAX_TEXT)];
        let start = self.bytes.len();
        self.bytes.extend_from_slice(kept);
        self.texts[which as usize] = (start as u32, kept.len() as u32);
        let bit = 1u16 << which as u16;
        if kept.len() < value.len() {
            self.cut |= bit;
        } else {
            self.cut &= !bit;
        }
    }

    /// The bytes of `which`, empty when absent.
    pub fn bytes(&self, which: Text) -> &[u8] {
        let (start, len) = self.texts[which as usize];
        &self.bytes[start as usize..(start + len) as usize]
    }

    fn text(&self, which: Text) -> Option<String> {
        let b = self.bytes(which);
        if b.is_empty() {
            return None;
        }
        let mut s = String::from_utf8_lossy(b).into_owned();
        if self.cut & (1 << which as u16) != 0 {
            s.push('…');
        }
        Some(s)
    }

    fn push_text(&self, out: &mut Vec<(&'static str, Value)>, key: &'static str, which: Text) {
        if let Some(s) = self.text(which) {
            out.push((key, Value::Str(s)));
        }
    }

    /// The span with its attributes: the HTTP semantic conventions'
    /// names otel_ngx_module uses, and the upstream's address, status and
    /// timings (seconds).
    pub fn into_record(self) -> SpanRecord {
        let mut attributes: Vec<(&'static str, Value)> = Vec::with_capacity(20);
        self.push_text(&mut attributes, "http.method", Text::Method);
        let flavor = match self.http_version {
            1000 => "1.0",
            1001 => "1.1",
            2000 => "2.0",
            3000 => "3.0",
            _ => "0.9",
        };
        attributes.push(("http.flavor", Value::Str(flavor.into())));
        self.push_text(&mut attributes, "http.target", Text::Target);
        let scheme = if self.https { "https" } else { "http" };
        attributes.push(("http.scheme", Value::Str(scheme.into())));
        self.push_text(&mut attributes, "http.server_name", Text::ServerName);
        self.push_text(&mut attributes, "http.host", Text::Host);
        self.push_text(&mut attributes, "http.user_agent", Text::UserAgent);
        attributes.push(("http.status_code", Value::Int(i64::from(self.http_status))));
        if let Some(port) = self.host_port {
            attributes.push(("net.host.port", Value::Int(i64::from(port))));
        }
        self.push_text(&mut attributes, "net.peer.ip", Text::PeerIp);
        if let Some(port) = self.peer_port {
            attributes.push(("net.peer.port", Value::Int(i64::from(port))));
        }
        self.push_text(&mut attributes, "nginx.upstream.name", Text::UpstreamName);
        if let Some(u) = self.upstream {
            self.push_text(&mut attributes, "upstream.address", Text::UpstreamAddress);
            if u.status != 0 {
                attributes.push(("upstream.status_code", Value::Int(i64::from(u.status))));
            }
            for (key, ms) in [
                ("upstream.connect_time", u.connect_ms),
                ("upstream.header_time", u.header_ms),
                ("upstream.response_time", u.response_ms),
            ] {
                if let Some(ms) = ms {
                    attributes.push((key, Value::Double(ms as f64 / 1000.0)));
                }
            }
            attributes.push(("upstream.attempts", Value::Int(i64::from(u.attempts))));
        }
        SpanRecord {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent_span_id: self.parent_span_id,
            trace_state: self.text(Text::TraceState).unwrap_or_default(),
            name: self.text(Text::Name).unwrap_or_default(),
            start_unix_nano: self.start_unix_nano,
            end_unix_nano: self.end_unix_nano,
            http_status: self.http_status,
            attributes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft() -> SpanDraft {
        SpanDraft::new([1; 16], [2; 8], 64)
    }

    fn attr<'a>(r: &'a SpanRecord, key: &str) -> Option<&'a Value> {
        r.attributes.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    #[test]
    fn texts_and_numbers_become_the_conventions_attributes() {
        let mut d = draft();
        d.http_status = 502;
        d.http_version = 1001;
        d.https = true;
        d.peer_port = Some(40000);
        d.upstream = Some(UpstreamTimes {
            status: 502,
            connect_ms: Some(3),
            header_ms: None,
            response_ms: Some(1250),
            attempts: 2,
        });
        d.set(Text::Method, b"POST");
        d.set(Text::Target, b"/a?b=c");
        d.set(Text::UpstreamAddress, b"10.0.0.1:80");
        d.set(Text::Name, b"HTTP POST web");
        let r = d.into_record();
        assert_eq!(r.name, "HTTP POST web");
        assert_eq!(r.trace_state, "");
        assert!(r.is_error());
        assert_eq!(attr(&r, "http.method"), Some(&Value::Str("POST".into())));
        assert_eq!(attr(&r, "http.flavor"), Some(&Value::Str("1.1".into())));
        assert_eq!(attr(&r, "http.scheme"), Some(&Value::Str("https".into())));
        assert_eq!(attr(&r, "http.status_code"), Some(&Value::Int(502)));
        assert_eq!(attr(&r, "net.peer.port"), Some(&Value::Int(40000)));
        assert_eq!(attr(&r, "upstream.response_time"), Some(&Value::Double(1.25)));
        assert_eq!(attr(&r, "upstream.header_time"), None);
        assert_eq!(attr(&r, "upstream.attempts"), Some(&Value::Int(2)));
        // Absent texts are absent attributes, not empty ones.
        assert_eq!(attr(&r, "http.user_agent"), None);
        assert_eq!(attr(&r, "http.host"), None);
    }

    #[test]
    fn a_long_or_broken_text_is_cut_and_marked() {
        let mut d = draft();
        let long = vec![b'x'; 3000];
        d.set(Text::Target, &long);
        d.set(Text::UserAgent, b"bad \xff byte");
        let r = d.into_record();
        let Some(Value::Str(t)) = attr(&r, "http.target") else {
            panic!()
        };
        assert_eq!(t.len(), MAX_TEXT + '…'.len_utf8());
        assert!(t.ends_with('…'));
        assert_eq!(
            attr(&r, "http.user_agent"),
            Some(&Value::Str("bad \u{fffd} byte".into()))
        );
    }

    #[test]
    fn a_draft_stays_small_enough_to_preallocate() {
        // The exporter's queue allocates a slot per span up front.
        assert!(
            std::mem::size_of::<SpanDraft>() <= 512,
            "{}",
            std::mem::size_of::<SpanDraft>()
        );
    }

    #[test]
    fn setting_a_text_again_replaces_it() {
        let mut d = draft();
        d.set(Text::Host, &[b'h'; 2000]);
        d.set(Text::Host, b"short");
        assert_eq!(d.bytes(Text::Host), b"short");
        let r = d.into_record();
        assert_eq!(attr(&r, "http.host"), Some(&Value::Str("short".into())));
    }
}
