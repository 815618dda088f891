//! A header as the module writes it into nginx's header lists: its name,
//! lower-cased name and nginx's hash of it computed once per table, and
//! a value.

#[derive(Debug)]
pub struct CompiledHeader {
    pub name: Box<str>,
    pub lower: Box<str>,
    /// nginx's `ngx_hash_key` of `lower` (`hash * 31 + byte`).
    pub hash: u64,
    pub value: Box<str>,
}

impl CompiledHeader {
    pub fn new(name: &str, value: &str) -> Self {
        let lower = name.to_ascii_lowercase();
        CompiledHeader {
            name: name.into(),
            hash: ngx_hash_key(lower.as_bytes()),
            lower: lower.into(),
            value: value.into(),
        }
    }
}

/// Response headers that frame the response or the connection. nginx
/// writes them from its own fields (`content_length_n`, `chunked`,
/// keepalive) and keeps pointers into the header list for some: a route
/// that adds, replaces or removes one would send a second, contradicting
/// `Content-Length`, or a response whose end the client cannot find, and
/// a shared proxy in front of the gateway would then read one tenant's
/// body as the next response on its connection. So a route may not touch
/// them (`lua_compat::routes::validate`), and a session header
/// ([`crate::sticky`]) may not be one.
pub const FRAMING_HEADERS: [&str; 8] = [
    "connection",
    "content-length",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether `name` (any case) is one of [`FRAMING_HEADERS`].
pub fn is_framing_header(name: &str) -> bool {
    FRAMING_HEADERS.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// The nginx variable holding request header `name`: `http_<name>` in
/// lower case with `-` as `_`, as nginx names header variables.
pub fn request_header_variable(name: &str) -> String {
    format!("http_{}", name.to_ascii_lowercase().replace('-', "_"))
}

/// nginx's `ngx_hash_key`: `key * 31 + byte`, wrapping.
pub fn ngx_hash_key(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0u64, |k, b| k.wrapping_mul(31).wrapping_add(u64::from(*b)))
}
