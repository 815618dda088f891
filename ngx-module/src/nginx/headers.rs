//! Changing request and response headers by name at request time: the
//! Gateway API's header modifier filters.
//!
//! A request header is removed by renaming it to `Keep-Alive`: both the
//! proxy and the grpc module always set that header themselves (it is in
//! their default `proxy_set_header`/`grpc_set_header` table), so they skip
//! any element with that name when they copy the client's headers. The
//! element stays in the list, so every pointer nginx keeps into the list
//! (`headers_in.host`, `user_agent`, ...) stays valid. A response header is
//! removed the way nginx's own modules do it: `hash = 0`.

use std::ptr;
use std::slice;

use ngx::ffi::{ngx_list_part_t, ngx_list_push, ngx_list_t, ngx_str_t, ngx_table_elt_t, ngx_uint_t};
use ngx::http::Request;

use crate::nginx::variables::{hash_key_lowercase, pool_copy};

const REMOVED_KEY: &[u8] = b"Keep-Alive";
const REMOVED_LOWER: &[u8] = b"keep-alive";

/// Which list.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Request,
    Response,
}

fn list(req: &mut Request, side: Side) -> *mut ngx_list_t {
    let r = req.as_mut();
    match side {
        Side::Request => &mut r.headers_in.headers,
        Side::Response => &mut r.headers_out.headers,
    }
}

/// The live elements of `list` named `name` (any case).
fn named(list: *mut ngx_list_t, name: &str) -> Vec<*mut ngx_table_elt_t> {
    let mut found = Vec::new();
    // SAFETY: `list` is a live request's headers list (`list()`), whose
    // parts are in the request's pool for its life.
    let mut part: *const ngx_list_part_t = unsafe { &(*list).part };
    // SAFETY: as above: `part` is the first part or a `next` link.
    while let Some(p) = unsafe { part.as_ref() } {
        let elts = p.elts.cast::<ngx_table_elt_t>();
        for i in 0..if elts.is_null() { 0 } else { p.nelts } {
            // SAFETY: a part holds `nelts` initialised `ngx_table_elt_t`s.
            let h = unsafe { elts.add(i) };
            // SAFETY: as above; a shared read of the element's key, which
            // nginx or this module set to `key.len` bytes in the pool.
            let key = unsafe {
                let h = &*h;
                if h.hash == 0 || h.key.data.is_null() {
                    continue;
                }
                slice::from_raw_parts(h.key.data, h.key.len)
            };
            if key.eq_ignore_ascii_case(name.as_bytes()) {
                found.push(h);
            }
        }
        part = p.next;
    }
    found
}

fn pool_str(req: &Request, value: &[u8]) -> Option<ngx_str_t> {
    Some(ngx_str_t {
        len: value.len(),
        data: if value.is_empty() {
            ptr::null_mut()
        } else {
            pool_copy(req, value)?
        },
    })
}

/// Appends a header named `name` with `value`. `false` when the pool is
/// exhausted.
pub fn add(req: &mut Request, side: Side, name: &str, value: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let (Some(key), Some(lowcase), Some(value)) = (
        pool_str(req, name.as_bytes()),
        pool_str(req, lower.as_bytes()),
        pool_str(req, value.as_bytes()),
    ) else {
        return false;
    };
    let list = list(req, side);
    // SAFETY: the request's own headers list, initialised by nginx for
    // every request; pushing allocates from its pool.
    let h = unsafe { ngx_list_push(list) }.cast::<ngx_table_elt_t>();
    if h.is_null() {
        return false;
    }
    // SAFETY: `h` is a fresh, element-sized, aligned slot of the list that
    // nothing references yet; zeroed first so that `next` (1.23+) is null.
    let h = unsafe {
        ptr::write_bytes(h, 0, 1);
        &mut *h
    };
    h.hash = hash_key_lowercase(lower.as_bytes()).max(1);
    h.key = key;
    h.lowcase_key = lowcase.data;
    h.value = value;
    if side == Side::Request && lower == "host" {
        req.as_mut().headers_in.host = h;
    }
    true
}

/// Replaces every header named `name` with one holding `value`.
pub fn set(req: &mut Request, side: Side, name: &str, value: &str) -> bool {
    let list = list(req, side);
    let existing = named(list, name);
    let Some((&first, rest)) = existing.split_first() else {
        return add(req, side, name, value);
    };
    let Some(v) = pool_str(req, value.as_bytes()) else {
        return false;
    };
    // SAFETY: `first` is a live element of the request's list (`named`);
    // nothing else borrows it during this call.
    unsafe { (*first).value = v };
    for &h in rest {
        // SAFETY: as above, for the other elements of that name.
        unsafe { remove_elt(h, side) };
    }
    true
}

/// Removes every header named `name`.
pub fn remove(req: &mut Request, side: Side, name: &str) {
    let list = list(req, side);
    for h in named(list, name) {
        // SAFETY: live elements of the request's list (`named`), not
        // borrowed elsewhere during this call.
        unsafe { remove_elt(h, side) };
    }
    if side == Side::Request && name.eq_ignore_ascii_case("host") {
        req.as_mut().headers_in.host = ptr::null_mut();
    }
}

/// # Safety
/// `h` is a live element of the request's `side` list.
unsafe fn remove_elt(h: *mut ngx_table_elt_t, side: Side) {
    // SAFETY: the caller's contract.
    let h = unsafe { &mut *h };
    match side {
        Side::Response => h.hash = 0,
        Side::Request => {
            h.key = ngx_str_t {
                len: REMOVED_KEY.len(),
                data: REMOVED_KEY.as_ptr().cast_mut(),
            };
            h.lowcase_key = REMOVED_LOWER.as_ptr().cast_mut();
            h.hash = hash_key_lowercase(REMOVED_LOWER) as ngx_uint_t;
        }
    }
}
