//! The request dimensions of a series, each with a small fixed set of
//! values: a hostile client or backend can choose among them but never add
//! one.

/// Method names by nginx's method bit (`NGX_HTTP_GET` is bit 1, ...,
/// `NGX_HTTP_CONNECT` bit 16); index 0 is `OTHER`, for `NGX_HTTP_UNKNOWN`
/// (any token nginx does not know) and anything unexpected.
pub const METHODS: [&str; 17] = [
    "OTHER",
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "DELETE",
    "MKCOL",
    "COPY",
    "MOVE",
    "OPTIONS",
    "PROPFIND",
    "PROPPATCH",
    "LOCK",
    "UNLOCK",
    "PATCH",
    "TRACE",
    "CONNECT",
];

/// Status classes; index 0 (`xxx`) for a status outside 100..=599 (nginx
/// logs 0 for a request closed before any response, e.g. HTTP/0.9 errors).
pub const STATUS_CLASSES: [&str; 6] = ["xxx", "1xx", "2xx", "3xx", "4xx", "5xx"];

/// The status a series is counted under: the code itself in 100..=599, as
/// ingress-nginx's `status` label has it, and 0 for anything else (a
/// backend's status 999, nginx's 0 for a request closed before a
/// response), so that a series has at most 501 statuses.
pub fn status_index(status: usize) -> u16 {
    match status {
        100..=599 => status as u16,
        _ => 0,
    }
}

/// How the `status` label is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StatusLabel {
    /// The code (`200`, `503`; `000` for [`status_index`]'s 0), as
    /// ingress-nginx writes it by default.
    #[default]
    Code,
    /// The class (`2xx`, `5xx`; `xxx`), ingress-nginx's
    /// `--report-status-classes`.
    Class,
}

impl StatusLabel {
    /// From the query of `GET /configuration/metrics`: `status=class`
    /// (or `status=code`, the default). Anything else is refused.
    pub fn from_query(args: &[u8]) -> Result<Self, String> {
        let mut label = StatusLabel::Code;
        for pair in args.split(|b| *b == b'&').filter(|p| !p.is_empty()) {
            match pair {
                b"status=class" => label = StatusLabel::Class,
                b"status=code" => label = StatusLabel::Code,
                _ => {
                    return Err(format!(
                        "unknown query {:?}: only status=code or status=class",
                        String::from_utf8_lossy(pair)
                    ))
                }
            }
        }
        Ok(label)
    }

    /// The label value of a [`status_index`].
    pub fn value(self, status: u16) -> StatusValue {
        match self {
            StatusLabel::Code => StatusValue::Code(status),
            StatusLabel::Class => StatusValue::Class(STATUS_CLASSES[status_class(usize::from(status))]),
        }
    }

    /// The key entries are merged under before writing: the class of the
    /// status in [`StatusLabel::Class`], else the status.
    pub fn key(self, status: u16) -> u16 {
        match self {
            StatusLabel::Code => status,
            StatusLabel::Class => status_class(usize::from(status)) as u16,
        }
    }
}

/// A `status` label value, written without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusValue {
    Code(u16),
    Class(&'static str),
}

impl std::fmt::Display for StatusValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatusValue::Code(c) => write!(f, "{c:03}"),
            StatusValue::Class(c) => f.write_str(c),
        }
    }
}

/// The [`METHODS`] index of nginx's `r->method` bit set (one bit set).
pub fn method_index(method_bits: usize) -> usize {
    if method_bits.count_ones() != 1 {
        return 0;
    }
    let bit = method_bits.trailing_zeros() as usize;
    if (1..METHODS.len()).contains(&bit) {
        bit
    } else {
        0
    }
}

/// The [`STATUS_CLASSES`] index of a status code.
pub fn status_class(status: usize) -> usize {
    match status {
        100..=599 => status / 100,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_method_bits_map_to_their_names() {
        // ngx_http_request.h: GET 0x0002, HEAD 0x0004, POST 0x0008, ...
        assert_eq!(METHODS[method_index(0x0002)], "GET");
        assert_eq!(METHODS[method_index(0x0004)], "HEAD");
        assert_eq!(METHODS[method_index(0x0008)], "POST");
        assert_eq!(METHODS[method_index(0x4000)], "PATCH");
        assert_eq!(METHODS[method_index(0x10000)], "CONNECT");
        assert_eq!(METHODS[method_index(0x0001)], "OTHER"); // NGX_HTTP_UNKNOWN
        assert_eq!(METHODS[method_index(0)], "OTHER");
        assert_eq!(METHODS[method_index(0x0006)], "OTHER");
        assert_eq!(METHODS[method_index(1 << 40)], "OTHER");
    }

    #[test]
    fn statuses_are_counted_exactly_and_written_as_asked() {
        assert_eq!(status_index(503), 503);
        assert_eq!(status_index(100), 100);
        assert_eq!(status_index(599), 599);
        for out in [0, 99, 600, 999, usize::MAX] {
            assert_eq!(status_index(out), 0);
        }
        assert_eq!(StatusLabel::Code.value(503).to_string(), "503");
        assert_eq!(StatusLabel::Code.value(0).to_string(), "000");
        assert_eq!(StatusLabel::Class.value(503).to_string(), "5xx");
        assert_eq!(StatusLabel::Class.value(0).to_string(), "xxx");
        assert_eq!(StatusLabel::Class.key(404), StatusLabel::Class.key(499));
        assert_ne!(StatusLabel::Code.key(404), StatusLabel::Code.key(499));
        assert_eq!(StatusLabel::from_query(b""), Ok(StatusLabel::Code));
        assert_eq!(StatusLabel::from_query(b"status=class"), Ok(StatusLabel::Class));
        assert_eq!(StatusLabel::from_query(b"status=code"), Ok(StatusLabel::Code));
        assert!(StatusLabel::from_query(b"status=other").is_err());
        assert!(StatusLabel::from_query(b"x=1").is_err());
    }

    #[test]
    fn statuses_fall_in_their_class() {
        assert_eq!(STATUS_CLASSES[status_class(200)], "2xx");
        assert_eq!(STATUS_CLASSES[status_class(101)], "1xx");
        assert_eq!(STATUS_CLASSES[status_class(499)], "4xx");
        assert_eq!(STATUS_CLASSES[status_class(599)], "5xx");
        assert_eq!(STATUS_CLASSES[status_class(0)], "xxx");
        assert_eq!(STATUS_CLASSES[status_class(600)], "xxx");
        assert_eq!(STATUS_CLASSES[status_class(999)], "xxx");
    }
}
