//! Changing request and response headers by name at request time: the
//! Gateway API's header modifier filters.
//!
//! The names, lower-case names, hashes and values come precomputed from
//! the worker's compiled route table (`lua_compat::routes::matcher`), and
//! the request holds that table until it ends, so elements point at its
//! bytes: applying a modifier copies nothing and hashes nothing.
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

use lua_compat::routes::matcher::CompiledHeader;
use ngx::ffi::{ngx_list_part_t, ngx_list_push, ngx_list_t, ngx_str_t, ngx_table_elt_t, ngx_uint_t};
use ngx::http::Request;

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

fn borrowed(bytes: &[u8]) -> ngx_str_t {
    ngx_str_t {
        len: bytes.len(),
        data: bytes.as_ptr().cast_mut(),
    }
}

/// Calls `each` with every live element of `list` named `name` (any case).
fn each_named(list: *mut ngx_list_t, name: &[u8], mut each: impl FnMut(*mut ngx_table_elt_t)) {
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
            // nginx or this module set to `key.len` bytes.
            let matches = unsafe {
                let e = &*h;
                e.hash != 0
                    && e.key.len == name.len()
                    && !e.key.data.is_null()
                    && slice::from_raw_parts(e.key.data, e.key.len).eq_ignore_ascii_case(name)
            };
            if matches {
                each(h);
            }
        }
        part = p.next;
    }
}

/// Appends header `h`. `false` when the pool is exhausted.
///
/// # Safety
/// `h` lives as long as the request (the request holds its route table).
pub unsafe fn add(req: &mut Request, side: Side, h: &CompiledHeader) -> bool {
    // SAFETY: this function's contract.
    unsafe { add_with(req, side, h, h.value.as_bytes()) }
}

/// Appends a header named as `h` with `value` (not `h`'s).
///
/// # Safety
/// `h` and `value` live as long as the request (in its route table, pool
/// or header buffers).
pub unsafe fn add_with(req: &mut Request, side: Side, h: &CompiledHeader, value: &[u8]) -> bool {
    let list = list(req, side);
    // SAFETY: the request's own headers list, initialised by nginx for
    // every request; pushing allocates from its pool.
    let e = unsafe { ngx_list_push(list) }.cast::<ngx_table_elt_t>();
    if e.is_null() {
        return false;
    }
    // SAFETY: `e` is a fresh, element-sized, aligned slot of the list that
    // nothing references yet; zeroed first so that `next` (1.23+) is null.
    let e = unsafe {
        ptr::write_bytes(e, 0, 1);
        &mut *e
    };
    // A zero hash would mark the header deleted.
    e.hash = (h.hash as ngx_uint_t).max(1);
    e.key = borrowed(h.name.as_bytes());
    e.lowcase_key = h.lower.as_ptr().cast_mut();
    e.value = borrowed(value);
    if side == Side::Request && &*h.lower == "host" {
        req.as_mut().headers_in.host = e;
    }
    true
}

/// Replaces every header named as `h` with one holding its value.
///
/// # Safety
/// As [`add`].
pub unsafe fn set(req: &mut Request, side: Side, h: &CompiledHeader) -> bool {
    // SAFETY: this function's contract.
    unsafe { set_with(req, side, h, h.value.as_bytes()) }
}

/// Replaces every header named as `h` with one holding `value`.
///
/// # Safety
/// As [`add_with`].
pub unsafe fn set_with(req: &mut Request, side: Side, h: &CompiledHeader, value: &[u8]) -> bool {
    let list = list(req, side);
    let mut first = true;
    each_named(list, h.name.as_bytes(), |e| {
        if first {
            // SAFETY: `e` is a live element of the request's list; the
            // value lives as long as the request (this function's contract).
            unsafe { (*e).value = borrowed(value) };
            first = false;
        } else {
            // SAFETY: a live element of the request's list.
            unsafe { remove_elt(e, side) };
        }
    });
    if first {
        // SAFETY: this function's contract.
        return unsafe { add_with(req, side, h, value) };
    }
    true
}

/// Removes every header named `name`.
pub fn remove(req: &mut Request, side: Side, name: &str) {
    let list = list(req, side);
    each_named(list, name.as_bytes(), |e| {
        // SAFETY: a live element of the request's list.
        unsafe { remove_elt(e, side) }
    });
    if side == Side::Request && name.eq_ignore_ascii_case("host") {
        req.as_mut().headers_in.host = ptr::null_mut();
    }
}

/// # Safety
/// `e` is a live element of the request's `side` list.
unsafe fn remove_elt(e: *mut ngx_table_elt_t, side: Side) {
    // SAFETY: the caller's contract.
    let e = unsafe { &mut *e };
    match side {
        Side::Response => e.hash = 0,
        Side::Request => {
            e.key = borrowed(REMOVED_KEY);
            e.lowcase_key = REMOVED_LOWER.as_ptr().cast_mut();
            e.hash = lua_compat::routes::matcher::ngx_hash_key(REMOVED_LOWER) as ngx_uint_t;
        }
    }
}
