//! Request variables at request time: read any variable by name (as Lua's
//! `ngx.var` does), and set the ones this module owns
//! (`$proxy_alternative_upstream_name`; `$balancer_ewma_score` is computed
//! by the peer hook). They are declared in [`crate::directives`].

use std::ptr;

use ngx::ffi::{
    ngx_http_get_variable, ngx_http_variable_value_t, ngx_int_t, ngx_pnalloc, ngx_str_t, ngx_uint_t, NGX_ERROR, NGX_OK,
};
use ngx::http::Request;

/// Variables this module sets per request.
#[derive(Clone, Copy)]
pub enum Own {
    AlternativeUpstream = 0,
}

pub const OWN_NAMES: [&str; 1] = ["proxy_alternative_upstream_name"];

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
fn pool_copy(req: &Request, value: &[u8]) -> Option<*mut u8> {
    // SAFETY: `req` is a live request, so its pool is live; allocating
    // changes the pool, not the request.
    let data = unsafe { ngx_pnalloc(req.as_ref().pool, value.len().max(1)) }.cast::<u8>();
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
pub fn fill(req: &Request, v: &mut ngx_http_variable_value_t, value: &[u8]) -> ngx_int_t {
    let Some(data) = pool_copy(req, value) else {
        return NGX_ERROR as ngx_int_t;
    };
    assign(v, data, value.len());
    NGX_OK as ngx_int_t
}

/// Fills `v` with the empty string (our variables' value until set).
pub fn fill_empty(v: &mut ngx_http_variable_value_t) {
    assign(v, c"".as_ptr().cast_mut().cast(), 0);
}

/// Sets variable `index` (one of ours, see `conf::own_variable`) for this
/// request.
pub fn set(req: &Request, index: usize, value: &[u8]) {
    if req.as_ref().variables.is_null() {
        return;
    }
    let Some(data) = pool_copy(req, value) else {
        return;
    };
    // SAFETY: a live request's non-null `variables` is its own array (not
    // part of the request struct) with an entry per indexed variable of its
    // configuration, and `index` was given by ngx_http_get_variable_index at
    // postconfiguration of that same configuration (see
    // `conf::own_variable`). Nothing else borrows that entry during this call.
    assign(unsafe { &mut *req.as_ref().variables.add(index) }, data, value.len());
}

/// nginx's `ngx_hash_key` (`key * 31 + c`), for variable lookups by name.
fn hash_key(name: &[u8]) -> ngx_uint_t {
    name.iter().fold(0 as ngx_uint_t, |k, c| {
        k.wrapping_mul(31).wrapping_add(ngx_uint_t::from(*c))
    })
}

/// The value of variable `name` (without `$`), as `ngx.var[name]`: `None`
/// when it is not found. Prefix variables (`http_*`, `cookie_*`, `arg_*`)
/// work too. The value lives in the request's pool or its configuration;
/// it is borrowed as long as `req`.
pub fn get<'r>(req: &'r Request, name: &str) -> Option<&'r [u8]> {
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
    let r = ptr::from_ref(req.as_ref()).cast_mut();
    // SAFETY: `r` is the live request `req` borrows; get handlers answer in
    // its variable slots and pool, outside the struct (as ngx's own
    // `Request::get_complex_value(&self)` assumes). nginx reads `key_name`
    // (`lookup_name`) only during the call.
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
