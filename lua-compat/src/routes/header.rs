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

/// nginx's `ngx_hash_key`: `key * 31 + byte`, wrapping.
pub fn ngx_hash_key(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0u64, |k, b| k.wrapping_mul(31).wrapping_add(u64::from(*b)))
}
