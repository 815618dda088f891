//! Small, safe-to-call wrappers over the nginx HTTP request API that ngx 0.5
//! does not cover: JSON responses, whole request bodies (memory and temp
//! file), indexed variables, request headers by name and pool memory that
//! runs `Drop`.

use std::ffi::{c_void, CStr};
use std::mem;
use std::os::fd::{FromRawFd, RawFd};
use std::ptr::{self, NonNull};
use std::slice;

use ngx::ffi::{
    ngx_buf_t, ngx_chain_t, ngx_create_temp_buf, ngx_http_get_flushed_variable, ngx_http_output_filter,
    ngx_http_send_header, ngx_int_t, ngx_list_part_t, ngx_list_push, ngx_palloc, ngx_pool_cleanup_t, ngx_pool_t,
    ngx_str_t, ngx_table_elt_t, ngx_uint_t, NGX_ERROR, NGX_HTTP_OK, NGX_OK,
};
use ngx::http::Request;

use crate::nginx::guard::ffi_guard;
use crate::nginx::variables;

/// Sends `body` as `application/json` with `status`, plus an `Allow` header
/// for 405 answers. Returns what the content phase should return. The
/// header must not have been sent yet (nginx refuses to send it twice).
pub fn send_json(req: &mut Request, status: ngx_uint_t, body: &[u8], allow: Option<&str>) -> ngx_int_t {
    match allow {
        Some(allow) => send_json_with(req, status, body, &[("Allow", allow)]),
        None => send_json_with(req, status, body, &[]),
    }
}

/// [`send_json`] with extra response headers.
pub fn send_json_with(req: &mut Request, status: ngx_uint_t, body: &[u8], headers: &[(&str, &str)]) -> ngx_int_t {
    send_body(req, status, c"application/json", body, headers)
}

/// Sends `body` as Prometheus' text format, 200.
pub fn send_prometheus_text(req: &mut Request, body: &[u8]) -> ngx_int_t {
    send_body(
        req,
        NGX_HTTP_OK as ngx_uint_t,
        c"text/plain; version=0.0.4; charset=utf-8",
        body,
        &[],
    )
}

/// Sends `body` with `status`, `content_type` and extra `headers`.
fn send_body(
    req: &mut Request,
    status: ngx_uint_t,
    content_type: &'static CStr,
    body: &[u8],
    headers: &[(&str, &str)],
) -> ngx_int_t {
    let fields = req.as_mut();
    fields.headers_out.status = status;
    fields.headers_out.content_length_n = body.len() as _;
    let len = content_type.to_bytes().len();
    fields.headers_out.content_type = ngx_str_t {
        len,
        data: content_type.as_ptr().cast_mut().cast(),
    };
    fields.headers_out.content_type_len = len;
    fields.headers_out.content_type_lowcase = ptr::null_mut();
    for (name, value) in headers {
        if req.add_header_out(name, value).is_none() {
            return NGX_ERROR as ngx_int_t;
        }
    }
    // SAFETY: the pointer comes from `req`, the live request, which nothing
    // else borrows during the call.
    let rc = unsafe { ngx_http_send_header(ptr::from_mut(req.as_mut())) };
    if rc == NGX_ERROR as ngx_int_t || rc > NGX_OK as ngx_int_t || req.header_only() || body.is_empty() {
        return rc;
    }
    // SAFETY: the request's pool is live as long as the request.
    let buf: *mut ngx_buf_t = unsafe { ngx_create_temp_buf(req.as_ref().pool, body.len()) };
    if buf.is_null() {
        return NGX_ERROR as ngx_int_t;
    }
    let last_buf = if req.is_main() { 1 } else { 0 };
    // SAFETY: `buf` is the non-null buffer just allocated, with room for
    // `body.len()` bytes at `pos`, in the pool, so it cannot overlap `body`.
    unsafe {
        ptr::copy_nonoverlapping(body.as_ptr(), (*buf).pos, body.len());
        (*buf).last = (*buf).pos.add(body.len());
        (*buf).set_last_buf(last_buf);
        (*buf).set_last_in_chain(1);
    }
    let mut chain = ngx_chain_t {
        buf,
        next: ptr::null_mut(),
    };
    // SAFETY: the pointer comes from `req`, the live request, whose header
    // was sent above; `chain` outlives the call (the filters copy or keep the
    // buffer, not the link).
    unsafe { ngx_http_output_filter(ptr::from_mut(req.as_mut()), &mut chain) }
}

/// One piece of a request body: bytes nginx held in memory, or a range of
/// the temp file it spooled to.
pub enum BodyPart {
    Memory(Vec<u8>),
    File { fd: RawFd, offset: i64, len: usize },
}

/// The pieces of a fully read request body. Memory is copied now; file
/// ranges are only described, to be read off the event loop with
/// [`read_body_parts`] while the request (and so its temp file) is alive.
///
/// # Safety
/// The request's body was fully read.
pub unsafe fn body_parts(req: &Request) -> Vec<BodyPart> {
    let rb = req.as_ref().request_body;
    let mut parts = Vec::new();
    if rb.is_null() {
        return parts;
    }
    // SAFETY: a non-null `request_body` of a live request is its live body
    // state; `bufs` is null or the head of its chain.
    let mut cl = unsafe { (*rb).bufs };
    while !cl.is_null() {
        // SAFETY: `cl` is a non-null link of the body's chain, and every link
        // of a read body has a buffer; nginx does not change them now that
        // the body is read.
        let b = unsafe { &*(*cl).buf };
        if b.temporary() != 0 || b.memory() != 0 || b.mmap() != 0 {
            // SAFETY: an in-memory buffer's `pos..last` is one initialised
            // range of its memory, `pos <= last`.
            let data = unsafe { slice::from_raw_parts(b.pos, b.last.offset_from(b.pos) as usize) };
            parts.push(BodyPart::Memory(data.to_vec()));
        } else if b.in_file() != 0 && !b.file.is_null() {
            let len = (b.file_last - b.file_pos) as usize;
            parts.push(BodyPart::File {
                // SAFETY: a non-null `file` of a live buffer is the request's
                // temp file, open until the request ends.
                fd: unsafe { (*b.file).fd },
                offset: b.file_pos,
                len,
            });
        }
        // SAFETY: `cl` is a live link (see above).
        cl = unsafe { (*cl).next };
    }
    parts
}

/// Joins body pieces, reading the file ranges.
pub fn read_body_parts(parts: &[BodyPart]) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let total = parts.iter().map(|p| match p {
        BodyPart::Memory(m) => m.len(),
        BodyPart::File { len, .. } => *len,
    });
    let mut out = Vec::with_capacity(total.sum());
    for part in parts {
        match part {
            BodyPart::Memory(m) => out.extend_from_slice(m),
            BodyPart::File { fd, offset, len } => {
                // SAFETY: nginx owns the descriptor and keeps it open until the
                // request ends; ManuallyDrop keeps us from closing it.
                let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(*fd) });
                let start = out.len();
                out.resize(start + len, 0);
                file.read_exact_at(&mut out[start..], *offset as u64)?;
            }
        }
    }
    Ok(out)
}

/// The value of indexed variable `index`, or `None` when it is not found
/// (nginx checks the index). It is borrowed as long as `req`.
pub fn variable(req: &Request, index: ngx_uint_t) -> Option<&[u8]> {
    // SAFETY: the pointer comes from `req`, the live request; nginx checks
    // `index` against the configuration's variables. Get handlers answer in
    // the request's variable slots and pool, outside the struct `req` borrows
    // (as for ngx's own `Request::get_complex_value(&self)`).
    let v = unsafe { ngx_http_get_flushed_variable(ptr::from_ref(req.as_ref()).cast_mut(), index) };
    // SAFETY: a non-null result is the request's value slot for `index`,
    // in `r->variables`, live as long as the request; nginx filled it, and
    // a found value's bytes are in the request's pool or the configuration.
    unsafe { variables::found_bytes(v.as_ref()?) }
}

/// Calls `each` with every request header named `lowercase_name` (which
/// must be lower case), in the order the client sent them, until it returns
/// `false`. It compares nginx's precomputed `lowcase_key` of each header, so
/// a header is a length check and, for names of the same length, a
/// `memcmp`. A plain loop: the forwarded-header and request-id code walks
/// the list on every proxied request.
#[inline]
fn each_header_elt(req: &Request, lowercase_name: &[u8], mut each: impl FnMut(*mut ngx_table_elt_t) -> bool) {
    let mut part: *const ngx_list_part_t = &req.as_ref().headers_in.headers.part;
    // SAFETY: `part` is the request's headers list's first part or a `next`
    // link of a previous one; nginx keeps the list, in the request's pool,
    // for the request's life.
    while let Some(p) = unsafe { part.as_ref() } {
        let elts = p.elts.cast::<ngx_table_elt_t>();
        for i in 0..if elts.is_null() { 0 } else { p.nelts } {
            // SAFETY: a list part holds `nelts` initialised elements of the
            // list's element type, `ngx_table_elt_t` for `headers_in`.
            let h = unsafe { elts.add(i) };
            // SAFETY: as above; a shared read of the element.
            let (len, hash, lowcase) = unsafe { ((*h).key.len, (*h).hash, (*h).lowcase_key) };
            // A zero hash marks a header a module deleted.
            if len != lowercase_name.len() || hash == 0 || lowcase.is_null() {
                continue;
            }
            // SAFETY: nginx sets `lowcase_key` to `key.len` bytes when it
            // parses a header; both live in the request's pool.
            if unsafe { slice::from_raw_parts(lowcase, len) } != lowercase_name {
                continue;
            }
            if !each(h) {
                return;
            }
        }
        part = p.next;
    }
}

/// `h`'s value.
///
/// # Safety
/// `h` is a header of a live request, whose value lives in its pool.
unsafe fn header_value<'r>(h: *const ngx_table_elt_t) -> &'r [u8] {
    // SAFETY: the caller's contract; `value` is `len` bytes.
    unsafe {
        let v = &(*h).value;
        if v.len == 0 || v.data.is_null() {
            &[]
        } else {
            slice::from_raw_parts(v.data, v.len)
        }
    }
}

/// Calls `each` with the value of every request header named
/// `lowercase_name`, in order, until it returns `false`.
#[inline]
fn each_header_named<'r>(req: &'r Request, lowercase_name: &[u8], mut each: impl FnMut(&'r [u8]) -> bool) {
    // SAFETY: the headers are the live request's, in its pool.
    each_header_elt(req, lowercase_name, |h| each(unsafe { header_value(h) }));
}

/// The first request header named `lowercase_name`, to change in place.
pub fn first_header_elt(req: &Request, lowercase_name: &[u8]) -> Option<NonNull<ngx_table_elt_t>> {
    let mut found = None;
    each_header_elt(req, lowercase_name, |h| {
        found = NonNull::new(h);
        false
    });
    found
}

/// Adds a request header, as if the client had sent it after its others:
/// `proxy_pass` and `grpc_pass` send it upstream with them, and
/// `$http_<name>` sees it. `key` and `lowercase_key` are static (nginx never
/// writes a request header's name); `hash` is `ngx_hash_key(lowercase_key)`,
/// what nginx's parser computes, so the proxy's `proxy_set_header` table
/// still recognises the name. `false` when the pool is exhausted.
///
/// # Safety
/// `value` points at bytes that live as long as the request (its pool).
pub unsafe fn push_header_in(
    req: &mut Request,
    key: &'static [u8],
    lowercase_key: &'static [u8],
    hash: ngx_uint_t,
    value: ngx_str_t,
) -> bool {
    // SAFETY: the request's own headers list, initialised by nginx for
    // every request; pushing allocates from its pool.
    let h = unsafe { ngx_list_push(&mut req.as_mut().headers_in.headers) }.cast::<ngx_table_elt_t>();
    if h.is_null() {
        return false;
    }
    // SAFETY: `h` is a fresh, element-sized, aligned slot of the list, which
    // nothing else references yet. Zeroed first: the fields not set below
    // (`next`, which nginx 1.23 added, for one) are null, whichever nginx
    // the module was built for.
    let h = unsafe {
        ptr::write_bytes(h, 0, 1);
        &mut *h
    };
    h.hash = hash;
    h.key = ngx_str_t {
        len: key.len(),
        data: key.as_ptr().cast_mut(),
    };
    h.lowcase_key = lowercase_key.as_ptr().cast_mut();
    h.value = value;
    true
}

/// The value of the first request header named `lowercase_name` (which
/// must be lower case), for a name nginx has no field for.
pub fn header_in<'r>(req: &'r Request, lowercase_name: &[u8]) -> Option<&'r [u8]> {
    let mut found = None;
    each_header_named(req, lowercase_name, |v| {
        found = Some(v);
        false
    });
    found
}

/// The request headers named `lowercase_name` as `$http_<name>` gives them:
/// the value of the only one, or all of them joined by `", "` (a copy in the
/// request's pool); `None` when there is none, or the copy failed.
pub fn header_in_joined<'r>(req: &'r Request, lowercase_name: &[u8]) -> Option<&'r [u8]> {
    let (mut first, mut repeated) = (None, false);
    each_header_named(req, lowercase_name, |v| {
        if first.is_none() {
            first = Some(v);
            true
        } else {
            repeated = true;
            false
        }
    });
    if repeated {
        return joined(req, lowercase_name);
    }
    first
}

/// The cold half of [`header_in_joined`]: a repeated header's values joined
/// into one copy in the request's pool.
#[cold]
fn joined<'r>(req: &'r Request, lowercase_name: &[u8]) -> Option<&'r [u8]> {
    let (mut joined, mut first) = (Vec::new(), true);
    each_header_named(req, lowercase_name, |v| {
        if !first {
            joined.extend_from_slice(b", ");
        }
        first = false;
        joined.extend_from_slice(v);
        true
    });
    let data = variables::pool_copy(req, &joined)?;
    // SAFETY: `pool_copy` wrote `joined.len()` bytes there, in the request's
    // pool, which outlives the request's borrow.
    Some(unsafe { slice::from_raw_parts(data, joined.len()) })
}

/// Moves `value` into `pool` and drops it when the pool is destroyed (the end
/// of the request for `r->pool`).
///
/// Unlike `ngx_pool_cleanup_add`, the cleanup record and the value share one
/// allocation: this runs on every proxied request, and request pools are small.
///
/// # Safety
/// `pool` is a live nginx pool.
pub unsafe fn pool_box<T>(pool: *mut ngx_pool_t, value: T) -> Option<NonNull<T>> {
    #[repr(C)]
    struct WithCleanup<T> {
        cleanup: ngx_pool_cleanup_t,
        value: T,
    }
    const {
        assert!(
            mem::align_of::<T>() <= mem::size_of::<usize>(),
            "nginx pools align to a word"
        )
    };
    // SAFETY: `pool` is live (this function's contract).
    let p = unsafe { ngx_palloc(pool, mem::size_of::<WithCleanup<T>>()) }.cast::<WithCleanup<T>>();
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is a fresh, non-null allocation of a whole `WithCleanup<T>`,
    // word-aligned, which the const assertion above shows is enough for `T`
    // (and the cleanup record is all words).
    let value_ptr = unsafe { ptr::addr_of_mut!((*p).value) };
    // SAFETY: as above; writing does not drop the uninitialised old value.
    unsafe { value_ptr.write(value) };
    // SAFETY: as above for `p`; `pool` is live and only this thread (the
    // event loop) touches its cleanup list.
    unsafe {
        ptr::addr_of_mut!((*p).cleanup).write(ngx_pool_cleanup_t {
            handler: Some(drop_in_pool::<T>),
            data: value_ptr.cast(),
            next: (*pool).cleanup,
        });
        (*pool).cleanup = ptr::addr_of_mut!((*p).cleanup);
    }
    NonNull::new(value_ptr)
}

/// The pool cleanup of [`pool_box`]: nginx calls it once, when the pool is
/// destroyed, with the `data` pool_box registered.
unsafe extern "C" fn drop_in_pool<T>(data: *mut c_void) {
    ffi_guard("pool cleanup", (), || {
        // SAFETY: data is the value pool_box wrote; the pool runs each cleanup once.
        unsafe { ptr::drop_in_place(data.cast::<T>()) }
    })
}

/// The bytes of an nginx string (empty for a null one).
pub fn str_bytes(s: &ngx_str_t) -> &[u8] {
    if s.len == 0 || s.data.is_null() {
        return &[];
    }
    // SAFETY: nginx's strings point at `len` bytes that live as long as
    // the structure holding them (a request's pool or buffers, a
    // configuration's pool).
    unsafe { slice::from_raw_parts(s.data, s.len) }
}

/// The SNI the client of the request's TLS connection sent, as it sent
/// it; `None` over plain TCP or without SNI.
pub fn ssl_server_name(req: &Request) -> Option<&[u8]> {
    let c = req.connection();
    // SAFETY: a live request's connection is live; `ssl` is null or
    // nginx's TLS state for it, whose `SSL` lives as long as it.
    let ssl = unsafe { c.as_ref()?.ssl.as_ref()? }.connection;
    // SAFETY: null, or the connection's live `SSL`, which outlives the
    // request.
    unsafe { servername(ssl) }
}

/// Whether the request's TLS connection carries a client certificate that
/// verified (OpenSSL's result, kept in a resumed session too). `false`
/// without TLS.
pub fn client_certificate_verified(req: &Request) -> bool {
    let c = req.connection();
    // SAFETY: as in `ssl_server_name`.
    let Some(ssl) = (unsafe { c.as_ref().and_then(|c| c.ssl.as_ref()) }).map(|s| s.connection) else {
        return false;
    };
    if ssl.is_null() {
        return false;
    }
    // SAFETY: the connection's live `SSL`; the peer certificate is
    // borrowed ("get0") and only compared with null.
    unsafe {
        !ngx::ffi::SSL_get0_peer_certificate(ssl).is_null()
            && ngx::ffi::SSL_get_verify_result(ssl) == ngx::ffi::X509_V_OK as std::ffi::c_long
    }
}

/// The SNI of a TLS connection, as the client sent it.
///
/// # Safety
/// `ssl` is null or a live `SSL`; the result lives no longer than it.
pub unsafe fn servername<'a>(ssl: *const ngx::ffi::SSL) -> Option<&'a [u8]> {
    if ssl.is_null() {
        return None;
    }
    // SAFETY: a live `SSL` (this function's contract); the name, if any,
    // is a NUL-terminated string it owns (TLSEXT_NAMETYPE_host_name is 0).
    let name = unsafe { ngx::ffi::SSL_get_servername(ssl, 0) };
    if name.is_null() {
        return None;
    }
    // SAFETY: non-null: the NUL-terminated SNI (above).
    Some(unsafe { CStr::from_ptr(name.cast()) }.to_bytes())
}
