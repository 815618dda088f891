//! Request variables: read any variable by name (as Lua's `ngx.var` does),
//! and the two variables this module sets, `$proxy_alternative_upstream_name`
//! and `$balancer_ewma_score`, as ingress-nginx does.

use std::sync::atomic::{AtomicUsize, Ordering};

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_get_variable, ngx_http_get_variable_index, ngx_http_request_t,
    ngx_http_variable_value_t, ngx_int_t, ngx_pnalloc, ngx_str_t, ngx_uint_t, NGX_ERROR, NGX_HTTP_VAR_CHANGEABLE,
    NGX_HTTP_VAR_NOCACHEABLE, NGX_OK,
};

use crate::guard::ffi_guard;

/// Variables this module sets per request.
#[derive(Clone, Copy)]
pub enum Own {
    AlternativeUpstream = 0,
}

const OWN_NAMES: [&str; 1] = ["proxy_alternative_upstream_name"];
static OWN_INDEX: [AtomicUsize; 1] = [AtomicUsize::new(usize::MAX)];

/// `preconfiguration`: declares our variables (changeable, so that an
/// ingress-nginx template's `set $proxy_alternative_upstream_name "";` works).
///
/// # Safety
/// `cf` is the configuration being parsed.
pub unsafe fn declare(cf: *mut ngx_conf_t) -> ngx_int_t {
    for name in OWN_NAMES {
        let mut name = ngx_str_t::from_str((*cf).pool, name);
        let v = ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_CHANGEABLE as ngx_uint_t);
        if v.is_null() {
            return NGX_ERROR as ngx_int_t;
        }
        (*v).get_handler = Some(empty_value);
    }
    // Computed when read, from the request's balancer state.
    let mut name = ngx_str_t::from_str((*cf).pool, "balancer_ewma_score");
    let flags = NGX_HTTP_VAR_CHANGEABLE | NGX_HTTP_VAR_NOCACHEABLE;
    let v = ngx_http_add_variable(cf, &mut name, flags as ngx_uint_t);
    if v.is_null() {
        return NGX_ERROR as ngx_int_t;
    }
    (*v).get_handler = Some(crate::peer::ewma_score_variable);
    NGX_OK as ngx_int_t
}

/// Fills `v` with a copy of `value` in the request pool.
///
/// # Safety
/// `r` is a live request; `v` its variable slot.
pub unsafe fn fill(r: *mut ngx_http_request_t, v: *mut ngx_http_variable_value_t, value: &[u8]) -> ngx_int_t {
    let data = ngx_pnalloc((*r).pool, value.len().max(1)).cast::<u8>();
    if data.is_null() {
        return NGX_ERROR as ngx_int_t;
    }
    std::ptr::copy_nonoverlapping(value.as_ptr(), data, value.len());
    (*v).set_len(value.len() as u32);
    (*v).set_valid(1);
    (*v).set_no_cacheable(0);
    (*v).set_not_found(0);
    (*v).data = data;
    NGX_OK as ngx_int_t
}

/// `postconfiguration`: indexes our variables so requests can set them.
///
/// # Safety
/// As [`declare`].
pub unsafe fn index(cf: *mut ngx_conf_t) -> ngx_int_t {
    for (name, slot) in OWN_NAMES.iter().zip(&OWN_INDEX) {
        let mut name = ngx_str_t::from_str((*cf).pool, name);
        let i = ngx_http_get_variable_index(cf, &mut name);
        if i == NGX_ERROR as ngx_int_t {
            return NGX_ERROR as ngx_int_t;
        }
        slot.store(i as usize, Ordering::Relaxed);
    }
    NGX_OK as ngx_int_t
}

unsafe extern "C" fn empty_value(
    _r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    ffi_guard("variable", NGX_ERROR as ngx_int_t, || unsafe {
        (*v).set_len(0);
        (*v).set_valid(1);
        (*v).set_no_cacheable(0);
        (*v).set_not_found(0);
        (*v).data = c"".as_ptr().cast_mut().cast();
        NGX_OK as ngx_int_t
    })
}

/// Sets one of our variables for this request.
///
/// # Safety
/// `r` is a live request.
pub unsafe fn set(r: *mut ngx_http_request_t, which: Own, value: &[u8]) {
    let index = OWN_INDEX[which as usize].load(Ordering::Relaxed);
    if index == usize::MAX || (*r).variables.is_null() {
        return;
    }
    let data = ngx_pnalloc((*r).pool, value.len().max(1)).cast::<u8>();
    if data.is_null() {
        return;
    }
    std::ptr::copy_nonoverlapping(value.as_ptr(), data, value.len());
    let v = &mut *(*r).variables.add(index);
    v.set_len(value.len() as u32);
    v.set_valid(1);
    v.set_no_cacheable(0);
    v.set_not_found(0);
    v.data = data;
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
    let v = ngx_http_get_variable(r, &mut key_name, hash_key(lower.as_bytes()));
    if v.is_null() || (*v).not_found() != 0 || (*v).valid() == 0 {
        return None;
    }
    if (*v).len() == 0 {
        return Some(&[]);
    }
    Some(std::slice::from_raw_parts((*v).data, (*v).len() as usize))
}
