//! The directive nginx is parsing, as its setter sees it: its words, a
//! path argument made full, and the checks every setter of a literal name
//! makes.

use std::ffi::{c_char, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{ngx_conf_full_name, ngx_conf_t, ngx_int_t, ngx_str_t, ngx_uint_t, NGX_LOG_EMERG, NGX_OK};
use ngx::ngx_conf_log_error;

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

/// Stores the directive's one argument in `slot` as a literal name: it may
/// be given once per block, and neither empty nor a variable (`$`), since
/// it is looked up as written. `what` names it in the error.
///
/// # Safety
/// `cf` is the live configuration, while nginx calls the directive's `set`.
pub unsafe fn set_literal_once(cf: *mut ngx_conf_t, slot: &mut Option<ngx_str_t>, what: &str) -> *mut c_char {
    if slot.is_some() {
        return c"is duplicate".as_ptr().cast_mut();
    }
    // SAFETY: `cf` is live (this function's contract).
    let name = args(unsafe { &*cf })[1];
    if name.is_empty() || name.as_bytes().contains(&b'$') {
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "invalid {what} \"{name}\": a literal name is expected"
        );
        return NGX_CONF_ERROR;
    }
    *slot = Some(name);
    NGX_CONF_OK
}

/// The directive's one argument as a file path: relative to the
/// configuration's directory (`conf_prefix`) or to nginx's prefix, as
/// nginx resolves `include` and log paths. The bytes are taken as they are
/// (a path need not be UTF-8); `None` when nginx could not make the full
/// name (it has logged why).
///
/// # Safety
/// `cf` is the live configuration, while nginx calls the directive's `set`.
pub unsafe fn path_arg(cf: *mut ngx_conf_t, conf_prefix: bool) -> Option<PathBuf> {
    // SAFETY: `cf` is live (this function's contract).
    let mut name = args(unsafe { &*cf })[1];
    // SAFETY: `cf->cycle` is the cycle being configured; `name` is a
    // directive argument, replaced by a pool copy on success.
    if unsafe { ngx_conf_full_name((*cf).cycle, &mut name, ngx_uint_t::from(conf_prefix)) } != NGX_OK as ngx_int_t {
        return None;
    }
    Some(PathBuf::from(OsStr::from_bytes(name.as_bytes())))
}
