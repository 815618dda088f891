//! The directive nginx is parsing, as its setter sees it: its words.

use ngx::ffi::{ngx_conf_t, ngx_str_t};

/// The directive's words, its name first. Only valid while nginx calls a
/// directive's `set` handler, when `cf->args` holds them.
pub fn args(cf: &ngx_conf_t) -> &[ngx_str_t] {
    // SAFETY: nginx sets cf->args to the directive's words while calling `set`.
    unsafe { (*cf.args).as_slice() }
}

/// The directive's arguments (its name left out) as text, or the first one
/// that is not UTF-8.
pub fn text_args(cf: &ngx_conf_t) -> Result<Vec<&str>, ngx_str_t> {
    args(cf)[1..]
        .iter()
        .map(|w| std::str::from_utf8(w.as_bytes()).map_err(|_| *w))
        .collect()
}
