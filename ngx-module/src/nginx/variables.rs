//! Request variables at request time: read any variable by name (as Lua's
//! `ngx.var` does), and set the ones this module owns
//! (`$proxy_alternative_upstream_name`; `$balancer_ewma_score` is computed
//! by the peer hook). They are declared in [`crate::directives`].

use std::ptr;

use ngx::ffi::{
    __BindgenBitfieldUnit, ngx_http_get_variable, ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t,
    ngx_pnalloc, ngx_str_t, ngx_uint_t, NGX_ERROR, NGX_OK,
};
use ngx::http::Request;

use crate::nginx::guard::ffi_guard;

/// Variables this module sets per request.
#[derive(Clone, Copy)]
pub enum Own {
    AlternativeUpstream = 0,
    /// Internal (not in the variables hash, so no configuration can name
    /// it): the request's metrics location, see [`set_opaque`].
    MetricsLocation = 1,
    /// Internal, as `MetricsLocation`: the Gateway API rule a request
    /// matched, for the response header filter.
    GatewayRoute = 2,
    /// Internal, as `MetricsLocation`: the request's trace (see
    /// `crate::http::otel`), which must outlive internal redirects.
    Trace = 3,
}

pub const OWN_NAMES: [&str; 4] = [
    "proxy_alternative_upstream_name",
    "dynamic_balancer_metrics_location",
    "dynamic_balancer_gateway_route",
    "dynamic_balancer_trace",
];

/// Variables the module reads per request by index (a cached read, no
/// lookup by name): nginx's own and `$dynamic_pass_access_scheme`.
#[derive(Clone, Copy)]
pub enum Read {
    ServerPort = 0,
    Host = 1,
    RequestUri = 2,
    PassAccessScheme = 3,
    RequestId = 4,
    /// Set by the Gateway API route handler to the backend it chose.
    UpstreamName = 5,
}

pub const READ_NAMES: [&str; 6] = [
    "server_port",
    "host",
    "request_uri",
    "dynamic_pass_access_scheme",
    "dynamic_request_id",
    "proxy_upstream_name",
];

// `ngx_variable_value_t` starts with one 32-bit word of bit-fields: `len:28,
// valid:1, no_cacheable:1, not_found:1, escape:1`, the first in the low bits
// (the System V ABI's layout on little-endian machines). bindgen's accessors
// move one bit at a time, a 28-step loop for `len`; they cost about 500
// instructions per proxied request, so the word is read and written whole.
// `layout_is_as_expected` compares the two ways when the module loads.
const LEN_MASK: u32 = (1 << 28) - 1;
const VALID: u32 = 1 << 28;
const NOT_FOUND: u32 = 1 << 30;

/// Writes `v`'s flag word at once.
fn set_flags(v: &mut ngx_http_variable_value_t, word: u32) {
    v._bitfield_1 = __BindgenBitfieldUnit::new(word.to_ne_bytes());
}

/// `v`'s flag word.
fn flags(v: &ngx_http_variable_value_t) -> u32 {
    // SAFETY: `_bitfield_1` is 4 bytes, aligned for a u32 by the struct's
    // `_bitfield_align_1: [u32; 0]`, and part of the live `v`.
    unsafe { ptr::addr_of!(v._bitfield_1).cast::<u32>().read() }
}

/// Whether the word layout above is the one nginx's bindings describe: the
/// module refuses to load otherwise (see `directives::declare_variables`).
pub fn layout_is_as_expected() -> bool {
    // SAFETY: all-zero is a valid `ngx_variable_value_t` (no flags, null data).
    let mut v: ngx_http_variable_value_t = unsafe { std::mem::zeroed() };
    v.set_len(0x0abc_def1);
    v.set_valid(1);
    v.set_not_found(1);
    let written = flags(&v) == (0x0abc_def1 | VALID | NOT_FOUND);
    set_flags(&mut v, 0x0123_4567 | VALID);
    written && v.len() == 0x0123_4567 && v.valid() == 1 && v.not_found() == 0 && v.no_cacheable() == 0
}

/// The bytes of a found value (`None` when not found or not valid). They
/// live in the request's pool or its configuration.
///
/// # Safety
/// `v` is a value nginx filled (its `data` points at `len` bytes when found).
pub unsafe fn found_bytes(v: &ngx_http_variable_value_t) -> Option<&[u8]> {
    let word = flags(v);
    if word & NOT_FOUND != 0 || word & VALID == 0 {
        return None;
    }
    let len = (word & LEN_MASK) as usize;
    if len == 0 || v.data.is_null() {
        return Some(&[]);
    }
    // SAFETY: a found, valid value has `len` bytes at `data` (this
    // function's contract).
    Some(unsafe { std::slice::from_raw_parts(v.data, len) })
}

/// Points `v` at `len` bytes at `data`, found and cacheable (every found
/// value this module writes goes through here).
fn assign(v: &mut ngx_http_variable_value_t, data: *mut u8, len: usize) {
    set_flags(v, (len as u32 & LEN_MASK) | VALID);
    v.data = data;
}

/// A copy of `value` in the request pool.
pub fn pool_copy(req: &Request, value: &[u8]) -> Option<*mut u8> {
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

/// Points `v` at `value` without copying it.
///
/// # Safety
/// `value` must live as long as the request (its pool, or the
/// configuration), since nginx may read a cached value until the end.
pub unsafe fn fill_borrowed(v: &mut ngx_http_variable_value_t, value: &[u8]) {
    assign(v, value.as_ptr().cast_mut(), value.len());
}

/// Marks `v` as not found (a header set from it is left out).
pub fn fill_not_found(v: &mut ngx_http_variable_value_t) {
    set_flags(v, NOT_FOUND);
    v.data = ptr::null_mut();
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

/// Sets variable `index` (one of ours, see `conf::own_variable`) to
/// `value` without copying it.
///
/// # Safety
/// `value` lives as long as the request.
pub unsafe fn set_borrowed(req: &Request, index: usize, value: &[u8]) {
    if req.as_ref().variables.is_null() {
        return;
    }
    // SAFETY: as in `set`; `value` outlives the request (this function's
    // contract), so nginx may read it until the end.
    let slot = unsafe { &mut *req.as_ref().variables.add(index) };
    assign(slot, value.as_ptr().cast_mut(), value.len());
}

/// The value a request holds in its slot of variable `index` (one of ours,
/// see `conf::own_variable`), if it was set or computed: no get handler
/// runs.
pub fn own_value(req: &Request, index: usize) -> Option<&[u8]> {
    if req.as_ref().variables.is_null() {
        return None;
    }
    // SAFETY: as in `set`; a shared read of an entry that nginx or `set`
    // filled, whose bytes live in the request's pool or configuration.
    unsafe { found_bytes(&*req.as_ref().variables.add(index)) }
}

/// Stores `p` in variable `index`'s slot (one of ours, see
/// `conf::own_variable`) as an opaque value. nginx reads the slot as "not
/// found"; unlike the module's ctx, which an internal redirect clears, the
/// slot lasts the whole request (`error_page` included).
pub fn set_opaque(req: &Request, index: usize, p: *const u8) {
    if req.as_ref().variables.is_null() {
        return;
    }
    // SAFETY: as in `set`: the request's own variables array, `index` from
    // its configuration, no other borrow of the entry during this call.
    let v = unsafe { &mut *req.as_ref().variables.add(index) };
    set_flags(v, VALID | NOT_FOUND);
    v.data = p.cast_mut();
}

/// What [`set_opaque`] stored in variable `index` for this request, or null.
/// Only `set_opaque` leaves a non-null `data` in a not-found slot: nginx's
/// get handlers and ours clear it (see [`fill_not_found`]).
pub fn get_opaque(req: &Request, index: usize) -> *const u8 {
    if req.as_ref().variables.is_null() {
        return ptr::null();
    }
    // SAFETY: as in `set_opaque`; a shared read of the entry.
    let v = unsafe { &*req.as_ref().variables.add(index) };
    if flags(v) & (VALID | NOT_FOUND) == VALID | NOT_FOUND {
        v.data
    } else {
        ptr::null()
    }
}

/// nginx's `ngx_hash_key` (`key * 31 + c`) of `name` lower-cased, for
/// variable lookups by name.
pub(crate) fn hash_key_lowercase(name: &[u8]) -> ngx_uint_t {
    name.iter().fold(0 as ngx_uint_t, |k, c| {
        k.wrapping_mul(31)
            .wrapping_add(ngx_uint_t::from(c.to_ascii_lowercase()))
    })
}

/// Names up to this long are lower-cased on the stack: lookups run per
/// request (canary headers, sticky cookies, hash keys).
const STACK_NAME: usize = 64;

/// The value of variable `name` (without `$`), as `ngx.var[name]`: `None`
/// when it is not found. Prefix variables (`http_*`, `cookie_*`, `arg_*`)
/// work too. The value lives in the request's pool or its configuration;
/// it is borrowed as long as `req`.
pub fn get<'r>(req: &'r Request, name: &str) -> Option<&'r [u8]> {
    let (mut stack, heap);
    // Cookie names are looked up by what follows the prefix, as written;
    // other names in lower case, without allocating when they already are.
    let lookup_name: &[u8] = if name.starts_with("cookie_") || !name.bytes().any(|b| b.is_ascii_uppercase()) {
        name.as_bytes()
    } else if name.len() <= STACK_NAME {
        stack = [0u8; STACK_NAME];
        let lowered = &mut stack[..name.len()];
        lowered.copy_from_slice(name.as_bytes());
        lowered.make_ascii_lowercase();
        lowered
    } else {
        heap = name.to_ascii_lowercase();
        heap.as_bytes()
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
    let v = unsafe { ngx_http_get_variable(r, &mut key_name, hash_key_lowercase(name.as_bytes())) };
    // SAFETY: a non-null result is a value in the request's pool or its
    // indexed slots, live as long as the request.
    let v = unsafe { v.as_ref() }?;
    // SAFETY: nginx filled `v`; a found value's bytes are in the request's
    // pool or the configuration, which outlive the request.
    unsafe { found_bytes(v) }
}

/// Runs the body of a variable's get handler with the request and the value
/// slot as references; a panic becomes `NGX_ERROR` and a log line that
/// names the variable.
///
/// # Safety
/// `r` and `v` are what nginx passed to a get handler: a live request, on
/// the event loop, and the variable's value slot, neither borrowed
/// elsewhere during the call.
pub unsafe fn get_handler(
    name: &str,
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    body: impl FnOnce(&mut Request, &mut ngx_http_variable_value_t) -> ngx_int_t,
) -> ngx_int_t {
    ffi_guard(name, NGX_ERROR as ngx_int_t, || {
        // SAFETY: `r` is a live request that nothing else borrows during
        // the call (this function's contract).
        let req = unsafe { Request::from_ngx_http_request(r) };
        // SAFETY: `v` is the handler's value slot, not otherwise borrowed.
        let v = unsafe { &mut *v };
        body(req, v)
    })
}
