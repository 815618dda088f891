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
