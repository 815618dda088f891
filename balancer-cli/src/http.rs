//! HTTP/1.1 messages, as much of them as the `/configuration` API needs:
//! one request written whole, one response parsed from a growing buffer.
//!
//! Why not a client crate: the API is served on loopback TCP or on a unix
//! socket (`listen unix:/path`), and ureq, the blocking client the workspace
//! already has, has no unix-socket transport. One small client for both
//! transports means one code path for framing, timeouts and errors, so
//! `--unix` behaves exactly like `--api`, and the CLI stays free of TLS
//! stacks it would never use (the API is plain HTTP on a local listener).
//!
//! Every request says `Connection: close`, so a response is complete at
//! the latest when the server closes; the parser still frames it by
//! `Content-Length` or `Transfer-Encoding: chunked` (nginx answers chunked
//! when it does not know the length up front), so a complete answer is
//! recognised without waiting for the close and a truncated one is an
//! error rather than a short body.

/// One request to the API.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    pub method: &'a str,
    /// Origin form: `/configuration/...`, already percent-encoded.
    pub path: &'a str,
    /// The `Host` header.
    pub host: &'a str,
    /// Sent as `Authorization: Bearer <token>`; checked to be header-safe
    /// by whoever accepted it from the user.
    pub token: Option<&'a str>,
    /// A JSON body.
    pub body: Option<&'a [u8]>,
}

impl Request<'_> {
    /// The bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: dynamic-balancer/{}\r\nAccept: application/json\r\nConnection: close\r\n",
            self.method,
            self.path,
            self.host,
            env!("CARGO_PKG_VERSION")
        );
        if let Some(token) = self.token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        if let Some(body) = self.body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(self.body.unwrap_or_default());
        out
    }
}

/// A complete response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    /// Names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

#[cfg(test)]
impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The longest response header accepted; the API's are a few hundred bytes.
const MAX_HEAD: usize = 64 * 1024;

/// Parses the response at the start of `buf`. `Ok(None)`: not complete yet,
/// read more. `eof` says the server closed the connection, after which a
/// response that is still incomplete is an error; a body framed by neither
/// length nor chunks ends there. Interim `1xx` responses are skipped.
pub fn parse_response(buf: &[u8], eof: bool) -> Result<Option<Response>, String> {
    let mut start = 0;
    loop {
        let rest = &buf[start..];
        let Some(head_len) = head_end(rest) else {
            if rest.len() > MAX_HEAD {
                return Err(format!("the response header is longer than {MAX_HEAD} bytes"));
            }
            if eof {
                return Err(if buf.is_empty() {
                    "the server closed the connection without answering".into()
                } else {
                    "the server closed the connection in the middle of the response header".into()
                });
            }
            return Ok(None);
        };
        let (status, reason, headers) = parse_head(&rest[..head_len])?;
        let body = &rest[head_len..];
        if (100..200).contains(&status) {
            if status == 101 {
                return Err("the server switched protocols (101)".into());
            }
            start += head_len;
            continue;
        }
        let body = match framing(status, &headers)? {
            Framing::Empty => Some(Vec::new()),
            Framing::Length(n) => match usize::try_from(n) {
                Ok(n) if body.len() >= n => Some(body[..n].to_vec()),
                _ if eof => {
                    return Err(format!(
                        "the server closed the connection after {} of {n} body bytes",
                        body.len()
                    ))
                }
                _ => None,
            },
            Framing::Chunked => match dechunk(body)? {
                Some(b) => Some(b),
                None if eof => return Err("the server closed the connection in the middle of a chunked body".into()),
                None => None,
            },
            Framing::UntilClose => eof.then(|| body.to_vec()),
        };
        return Ok(body.map(|body| Response {
            status,
            reason,
            headers,
            body,
        }));
    }
}

/// Length of the header block including the empty line that ends it.
/// Lines end in CRLF; a bare LF is accepted too (RFC 9112, 2.2).
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    for (i, b) in buf.iter().enumerate() {
        if *b == b'\n' {
            let line = &buf[line_start..i];
            if line.is_empty() || line == b"\r" {
                return (line_start > 0).then_some(i + 1);
            }
            line_start = i + 1;
        }
    }
    None
}

type Head = (u16, String, Vec<(String, String)>);

fn parse_head(head: &[u8]) -> Result<Head, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the response header is not UTF-8".to_string())?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let status_line = lines.next().unwrap_or_default();
    let bad_status = || format!("not an HTTP/1.1 status line: {:?}", truncate(status_line, 80));
    let rest = status_line.strip_prefix("HTTP/1.").ok_or_else(bad_status)?;
    let mut parts = rest.splitn(3, ' ');
    let (Some(minor), Some(code)) = (parts.next(), parts.next()) else {
        return Err(bad_status());
    };
    if minor.len() != 1 || !minor.as_bytes()[0].is_ascii_digit() {
        return Err(bad_status());
    }
    let status = match code.parse::<u16>() {
        Ok(s) if code.len() == 3 && (100..=599).contains(&s) => s,
        _ => return Err(bad_status()),
    };
    let reason = parts.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("not a header line: {:?}", truncate(line, 80)));
        };
        if name.is_empty() || !name.bytes().all(is_token_char) {
            return Err(format!("not a header name: {:?}", truncate(name, 80)));
        }
        headers.push((name.to_ascii_lowercase(), value.trim_matches([' ', '\t']).to_string()));
    }
    Ok((status, reason, headers))
}

fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

/// How the body is delimited (RFC 9112, 6.3; no HEAD requests are sent).
fn framing(status: u16, headers: &[(String, String)]) -> Result<Framing, String> {
    if status == 204 || status == 304 {
        return Ok(Framing::Empty);
    }
    let codings: Vec<&str> = headers
        .iter()
        .filter(|(n, _)| n == "transfer-encoding")
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    if let Some(last) = codings.last() {
        return Ok(if last.eq_ignore_ascii_case("chunked") {
            Framing::Chunked
        } else {
            Framing::UntilClose
        });
    }
    let mut length: Option<u64> = None;
    for (_, v) in headers.iter().filter(|(n, _)| n == "content-length") {
        for item in v.split(',').map(str::trim) {
            let n = item
                .parse::<u64>()
                .ok()
                .filter(|_| !item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| format!("not a Content-Length: {v:?}"))?;
            if length.is_some_and(|l| l != n) {
                return Err("the response has conflicting Content-Length values".into());
            }
            length = Some(n);
        }
    }
    Ok(length.map_or(Framing::UntilClose, Framing::Length))
}

/// Decodes a chunked body; `Ok(None)` while its last chunk (and the
/// trailers after it) have not all arrived. Extensions and trailers are
/// read and dropped. The body is called for after every read, so the
/// chunks are first only located (a step per chunk, no copy) and copied
/// out once, when the last one is there.
pub fn dechunk(buf: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let Some(spans) = chunk_spans(buf)? else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(spans.iter().map(|(_, len)| len).sum());
    for (start, len) in spans {
        out.extend_from_slice(&buf[start..start + len]);
    }
    Ok(Some(out))
}

/// Where each chunk's data lies in `buf`, once the body is complete.
fn chunk_spans(buf: &[u8]) -> Result<Option<Vec<(usize, usize)>>, String> {
    let mut spans = Vec::new();
    let mut at = 0;
    let line_end = |from: usize| buf[from..].iter().position(|b| *b == b'\n').map(|p| from + p);
    loop {
        let Some(nl) = line_end(at) else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&buf[at..nl]).map_err(|_| "a chunk size line is not UTF-8".to_string())?;
        let line = line.strip_suffix('\r').unwrap_or(line);
        let size_text = line.split(';').next().unwrap_or("").trim_matches([' ', '\t']);
        let size = if !size_text.is_empty() && size_text.len() <= 15 && size_text.bytes().all(|b| b.is_ascii_hexdigit())
        {
            usize::from_str_radix(size_text, 16).map_err(|e| e.to_string())?
        } else {
            return Err(format!("not a chunk size: {:?}", truncate(line, 40)));
        };
        at = nl + 1;
        if size == 0 {
            // Trailers, each ended by a line feed, then an empty line.
            loop {
                let Some(nl) = line_end(at) else {
                    return Ok(None);
                };
                let line = &buf[at..nl];
                at = nl + 1;
                if line.is_empty() || line == b"\r" {
                    return Ok(Some(spans));
                }
            }
        }
        if buf.len() - at < size {
            return Ok(None);
        }
        spans.push((at, size));
        at += size;
        match &buf[at..] {
            [b'\r', b'\n', ..] => at += 2,
            [b'\n', ..] => at += 1,
            [] | [b'\r'] => return Ok(None),
            _ => return Err("a chunk is longer than its size says".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(raw: &str) -> Response {
        parse_response(raw.as_bytes(), false)
            .unwrap()
            .unwrap_or_else(|| panic!("incomplete: {raw:?}"))
    }

    #[test]
    fn encodes_requests_with_close_token_and_length() {
        let get = Request {
            method: "GET",
            path: "/configuration/status",
            host: "127.0.0.1:10246",
            token: None,
            body: None,
        };
        let text = String::from_utf8(get.encode()).unwrap();
        assert!(text.starts_with("GET /configuration/status HTTP/1.1\r\nHost: 127.0.0.1:10246\r\n"));
        assert!(text.contains("\r\nConnection: close\r\n"));
        assert!(!text.contains("Authorization") && !text.contains("Content-Length"));
        assert!(text.ends_with("\r\n\r\n"));

        let put = Request {
            method: "PUT",
            path: "/configuration/backends/web",
            host: "localhost",
            token: Some("0123456789abcdef"),
            body: Some(b"{\"a\":1}"),
        };
        let text = String::from_utf8(put.encode()).unwrap();
        assert!(text.contains("\r\nAuthorization: Bearer 0123456789abcdef\r\n"));
        assert!(text.contains("\r\nContent-Length: 7\r\n"));
        assert!(text.ends_with("\r\n\r\n{\"a\":1}"));
    }

    #[test]
    fn content_length_bodies() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{\"generation\":3}";
        let r = complete(raw);
        assert_eq!((r.status, r.reason.as_str()), (200, "OK"));
        assert_eq!(r.header("Content-Type"), Some("application/json"));
        assert_eq!(r.body, b"{\"generation\":3}");
        // Every prefix is incomplete, and an error once the server closed.
        for cut in 0..raw.len() {
            assert_eq!(parse_response(&raw.as_bytes()[..cut], false), Ok(None), "{cut}");
            assert!(parse_response(&raw.as_bytes()[..cut], true).is_err(), "{cut}");
        }
        assert_eq!(parse_response(raw.as_bytes(), true).unwrap().unwrap(), r);
        let err = parse_response(&raw.as_bytes()[..raw.len() - 4], true).unwrap_err();
        assert!(err.contains("after 12 of 16 body bytes"), "{err}");
    }

    #[test]
    fn chunked_bodies_with_extensions_and_trailers() {
        let raw = "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n7;ext=1\r\n{\"error\r\n0B\r\n\":\"missing\"\r\n1\r\n}\r\n0\r\nX-Trailer: t\r\n\r\n";
        let r = complete(raw);
        assert_eq!((r.status, r.reason.as_str()), (404, "Not Found"));
        assert_eq!(String::from_utf8(r.body.clone()).unwrap(), r#"{"error":"missing"}"#);
        for cut in 0..raw.len() {
            assert_eq!(parse_response(&raw.as_bytes()[..cut], false), Ok(None), "{cut}");
            assert!(parse_response(&raw.as_bytes()[..cut], true).is_err(), "{cut}");
        }
        assert_eq!(dechunk(b"0\r\n\r\n"), Ok(Some(Vec::new())));
        assert_eq!(dechunk(b"3\nabc\n0\n\n"), Ok(Some(b"abc".to_vec())));
        assert!(dechunk(b"3\r\nabcd\r\n0\r\n\r\n").is_err());
        assert!(dechunk(b"zz\r\n").is_err());
        assert!(dechunk(b"fffffffffffffffff\r\n").is_err());
        // Chunked wins over a Content-Length sent with it.
        let both =
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
        assert_eq!(complete(both).body, b"ok");
    }

    /// A large chunked body read as it arrives: incomplete at every step
    /// short of the end, whole at the end.
    #[test]
    fn large_chunked_bodies_arrive_in_pieces() {
        let chunk: String = "0123456789abcdef".repeat(256);
        let mut raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..1000 {
            raw.extend_from_slice(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes());
        }
        raw.extend_from_slice(b"0\r\n\r\n");
        let mut read = 0;
        while read < raw.len() {
            assert_eq!(parse_response(&raw[..read], false), Ok(None), "{read}");
            read = (read + 65_536).min(raw.len());
        }
        let r = parse_response(&raw, false).unwrap().unwrap();
        assert_eq!(r.body.len(), 1000 * chunk.len());
        assert!(r.body.chunks(chunk.len()).all(|c| c == chunk.as_bytes()));
    }

    #[test]
    fn bodies_without_length_end_at_close_and_empty_statuses() {
        let raw = b"HTTP/1.0 200 OK\r\n\r\n[1,2]";
        assert_eq!(parse_response(raw, false), Ok(None));
        assert_eq!(parse_response(raw, true).unwrap().unwrap().body, b"[1,2]");
        let r = complete("HTTP/1.1 204 No Content\r\nServer: nginx\r\n\r\n");
        assert_eq!((r.status, r.body.len()), (204, 0));
        let r = complete("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}");
        assert_eq!((r.status, r.body.as_slice()), (201, &b"{}"[..]));
        let r = complete("HTTP/1.1 200 OK\nContent-Length: 2\n\nok");
        assert_eq!(r.body, b"ok");
        assert_eq!(complete("HTTP/1.1 500 \r\nContent-Length: 0\r\n\r\n").reason, "");
    }

    #[test]
    fn malformed_answers_are_errors() {
        for raw in [
            "SSH-2.0-OpenSSH_9.2\r\n\r\n",
            "HTTP/2 200\r\n\r\n",
            "HTTP/1.1 20 OK\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
            "HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
        ] {
            assert!(parse_response(raw.as_bytes(), false).is_err(), "{raw:?}");
        }
        assert_eq!(
            parse_response(b"", true).unwrap_err(),
            "the server closed the connection without answering"
        );
        let long = format!("HTTP/1.1 200 OK\r\nX: {}", "a".repeat(MAX_HEAD));
        assert!(parse_response(long.as_bytes(), false)
            .unwrap_err()
            .contains("longer than"));
        // Equal repeated lengths are one length.
        let r = complete("HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok");
        assert_eq!(r.body, b"ok");
    }
}
