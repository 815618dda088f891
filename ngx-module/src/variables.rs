//! Request variables at request time: read any variable by name (as Lua's
//! `ngx.var` does), and set the ones this module owns
//! (`$proxy_alternative_upstream_name`; `$balancer_ewma_score` is computed
//! by the peer hook). They are declared in [`crate::directives`].

use std::sync::atomic::{AtomicUsize, Ordering};

use ngx::ffi::{
    ngx_http_get_variable, ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t, ngx_pnalloc, ngx_str_t,
    ngx_uint_t, NGX_ERROR, NGX_OK,
};

/// Variables this module sets per request.
#[derive(Clone, Copy)]
pub enum Own {
    AlternativeUpstream = 0,
}

pub const OWN_NAMES: [&str; 1] = ["proxy_alternative_upstream_name"];
/// Filled by `directives::index_variables` at postconfiguration.
pub static OWN_INDEX: [AtomicUsize; 1] = [AtomicUsize::new(usize::MAX)];

/// Points `v` at `len` bytes at `data`, found and cacheable: the one place
/// this module writes a variable value.
fn assign(v: &mut ngx_http_variable_value_t, data: *mut u8, len: usize) {
    v.set_len(len as u32);
    v.set_valid(1);
    v.set_no_cacheable(0);
    v.set_not_found(0);
    v.data = data;
}

/// A copy of `value` in the request pool.
///
/// # Safety
/// `r` is a live request.
unsafe fn pool_copy(r: *mut ngx_http_request_t, value: &[u8]) -> Option<*mut u8> {
    // SAFETY: `r` and so its pool are live (this function's contract).
    let data = unsafe { ngx_pnalloc((*r).pool, value.len().max(1)) }.cast::<u8>();
    if data.is_null() {
        return None;
    }
    // SAFETY: `data` is a fresh pool allocation of at least `value.len()`
    // bytes (byte-aligned is enough), so it cannot overlap `value`.
    unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), data, value.len()) };
    Some(data)
}

/// Fills `v` with a copy of `value` in the request pool (a get handler's
/// answer).
///
/// # Safety
/// `r` is a live request; `v` its variable slot.
pub unsafe fn fill(r: *mut ngx_http_request_t, v: *mut ngx_http_variable_value_t, value: &[u8]) -> ngx_int_t {
    // SAFETY: `r` is live (this function's contract).
    let Some(data) = (unsafe { pool_copy(r, value) }) else {
        return NGX_ERROR as ngx_int_t;
    };
    // SAFETY: `v` is the request's value slot nginx handed the get handler
    // (this function's contract), not otherwise borrowed during the call.
    assign(unsafe { &mut *v }, data, value.len());
    NGX_OK as ngx_int_t
}

/// Fills `v` with the empty string (our variables' value until set).
pub fn fill_empty(v: &mut ngx_http_variable_value_t) {
    assign(v, c"".as_ptr().cast_mut().cast(), 0);
}

/// Sets one of our variables for this request.
///
/// # Safety
/// `r` is a live request.
pub unsafe fn set(r: *mut ngx_http_request_t, which: Own, value: &[u8]) {
    let index = OWN_INDEX[which as usize].load(Ordering::Relaxed);
    // SAFETY: `r` is live (this function's contract).
    if index == usize::MAX || unsafe { (*r).variables.is_null() } {
        return;
    }
    // SAFETY: `r` is live (this function's contract).
    let Some(data) = (unsafe { pool_copy(r, value) }) else {
        return;
    };
    // SAFETY: `r` is live; its non-null `variables` has an entry per indexed
    // variable, and `index` was given by ngx_http_get_variable_index. Nothing
    // else borrows that entry during this call.
    assign(unsafe { &mut *(*r).variables.add(index) }, data, value.len());
}

/// nginx's `ngx_hash_key` (`key * 31 + c`), for variable lookups by name.
fn hash_key(name: &[u8]) -> ngx_uint_t {
    name.iter().fold(0 as ngx_uint_t, |k, c| {
        k.wrapping_mul(31).wrapping_add(ngx_uint_t::from(*c))
    })
}

/// The value of variable `name` (without `$`), as `ngx.var[name]`: `None`
/// when it is not found. Prefix variables (`http_*`, `cookie_*`, `arg_*`)
/// work too.
///
/// # Safety
/// `r` is a live request; the value lives in its pool.
pub unsafe fn get<'r>(r: *mut ngx_http_request_t, name: &str) -> Option<&'r [u8]> {
    let lower = name.to_ascii_lowercase();
    // Cookie names are looked up by what follows the prefix, as written.
    let lookup_name = if name.starts_with("cookie_") {
        name
    } else {
        lower.as_str()
    };
    let mut key_name = ngx_str_t {
        len: lookup_name.len(),
        data: lookup_name.as_ptr().cast_mut(),
    };
    // SAFETY: `r` is live (this function's contract); `key_name` points at
    // `lookup_name`, which nginx reads only during the call.
    let v = unsafe { ngx_http_get_variable(r, &mut key_name, hash_key(lower.as_bytes())) };
    // SAFETY: a non-null result is a value in the request's pool or its
    // indexed slots, live as long as the request.
    let v = unsafe { v.as_ref() }?;
    if v.not_found() != 0 || v.valid() == 0 {
        return None;
    }
    if v.len() == 0 {
        return Some(&[]);
    }
    // SAFETY: a valid, found value of non-zero length has `len` bytes at
    // `data`, in the request's pool or the configuration, which outlive the
    // request.
    Some(unsafe { std::slice::from_raw_parts(v.data, v.len() as usize) })
}
