//! The HTTPRoute `RequestMirror` filter: a copy of the request goes to
//! each mirror backend (for its share of requests), and its answer is
//! thrown away.
//!
//! As nginx's own `mirror` module does it, but chosen per request from
//! the route table: a PRECONTENT handler reads the request body (the copies
//! need it too, and the main request keeps it: `preserve_body`), then
//! starts one background subrequest per mirror, to the request's own
//! (possibly rewritten) URI and arguments, with `header_only` so that no
//! byte of its answer reaches the client. A copy lands in the same
//! location as the request; the route handler recognises it
//! ([`mirror_index`]) and, instead of routing it, points it at its mirror
//! backend. The client's request never waits for a copy.

use std::ffi::c_void;
use std::ptr;

use lua_compat::routes::validate::MAX_MIRRORS;
use lua_compat::routes::Mirror;
use ngx::ffi::{
    ngx_http_core_run_phases, ngx_http_finalize_request, ngx_http_post_subrequest_t, ngx_http_read_client_request_body,
    ngx_http_request_t, ngx_http_subrequest, ngx_http_variable_value_t, ngx_int_t, ngx_palloc, NGX_DECLINED, NGX_DONE,
    NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_HTTP_SPECIAL_RESPONSE, NGX_HTTP_SUBREQUEST_BACKGROUND, NGX_OK,
};
use ngx::http::{HttpModuleMainConf, NgxHttpCoreModule, Request};

use crate::http::gateway_matched::{matched, Matched, MirrorState};
use crate::nginx::guard::ffi_guard;

/// One byte per possible mirror of a rule: a copy's `post_subrequest`
/// data points at the byte of its mirror. An address inside this array
/// can only come from [`start_copies`], so it both marks a subrequest as
/// a mirror copy and says which mirror.
static MIRROR_SLOTS: [u8; MAX_MIRRORS] = [0; MAX_MIRRORS];

/// For a mirror copy this module started: the index of its mirror in the
/// rule the main request matched.
pub fn mirror_index(req: &Request) -> Option<usize> {
    let r = req.as_ref();
    if ptr::eq(r, r.main) {
        return None;
    }
    // SAFETY: a subrequest's `post_subrequest` is null or points at the
    // handler its creator allocated, live for the main request.
    let ps = unsafe { r.post_subrequest.as_ref() }?;
    let base = MIRROR_SLOTS.as_ptr() as usize;
    let at = ps.data as usize;
    (base..base + MAX_MIRRORS).contains(&at).then(|| at - base)
}

/// The mirror a copy goes to, from the rule its main request matched.
/// With it, whether its backend is reached over TLS.
pub fn mirror_of(req: &Request, index: usize) -> Option<(&Mirror, bool)> {
    // SAFETY: a subrequest's `main` is its live main request, which
    // outlives it (it counts its subrequests).
    let main = unsafe { Request::from_ngx_http_request(req.as_ref().main) };
    // The mirror lives in the route table the main request's `Matched`
    // keeps alive, longer than this subrequest.
    let m: &Matched = matched(main)?;
    let rule = m.rule();
    let tls = rule.mirror_tls.get(index).copied().unwrap_or(false);
    rule.rule.filters.mirrors.get(index).map(|mirror| (mirror, tls))
}

/// The PRECONTENT handler: nginx calls it with a live request, on the
/// event loop. It declines unless the main request matched a rule with
/// mirrors.
pub unsafe extern "C" fn precontent_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    ffi_guard("gateway mirror", NGX_DECLINED as ngx_int_t, || {
        // SAFETY: nginx runs phase handlers with a live request, on the
        // event loop, and holds no reference into it meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        if !ptr::eq(req.as_ref(), req.as_ref().main) {
            return NGX_DECLINED as ngx_int_t;
        }
        let Some(m) = matched(req).filter(|m| !m.rule().rule.filters.mirrors.is_empty()) else {
            return NGX_DECLINED as ngx_int_t;
        };
        match m.mirrors.get() {
            MirrorState::Done(rc) => return rc,
            MirrorState::Reading(_) => return NGX_DONE as ngx_int_t,
            MirrorState::NotYet => {}
        }
        let taken = draw(&m.rule().rule.filters.mirrors);
        if taken == 0 {
            m.mirrors.set(MirrorState::Done(NGX_DECLINED as ngx_int_t));
            return NGX_DECLINED as ngx_int_t;
        }
        m.mirrors.set(MirrorState::Reading(taken));
        // SAFETY: a live main request; nginx calls `body_read` once the
        // body is in (maybe before this returns), and counts the read as a
        // reference to the request that the NGX_DONE finalization gives
        // back, as its mirror module does.
        unsafe {
            let rc = ngx_http_read_client_request_body(r, Some(body_read));
            if rc >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
                // No copies; if the error page is served through a phase
                // handler again, it passes on.
                m.mirrors.set(MirrorState::Done(NGX_DECLINED as ngx_int_t));
                return rc;
            }
            ngx_http_finalize_request(r, NGX_DONE as ngx_int_t);
        }
        NGX_DONE as ngx_int_t
    })
}

/// nginx calls it with the live main request when its body is read.
///
/// # Safety
/// `r` is a live main request, on the event loop (nginx's contract for a
/// body handler); panics are caught.
unsafe extern "C" fn body_read(r: *mut ngx_http_request_t) {
    ffi_guard("gateway mirror body", (), || {
        // SAFETY: as in `precontent_handler`.
        let req = unsafe { Request::from_ngx_http_request(r) };
        let rc = start_copies(req);
        if let Some(m) = matched(req) {
            m.mirrors.set(MirrorState::Done(rc));
        }
        // SAFETY: a live request on the event loop; the phases go on from
        // the PRECONTENT handler, which now answers `rc`, and the body
        // stays for the proxy after the copies took it.
        unsafe {
            (*r).set_preserve_body(1);
            (*r).write_event_handler = Some(ngx_http_core_run_phases);
            ngx_http_core_run_phases(r);
        }
    })
}

/// nginx calls it when a copy ends: its answer is ignored.
///
/// # Safety
/// Sound for any arguments: it reads neither pointer and cannot panic
/// (so it needs no panic guard). `unsafe extern "C"` only because it is
/// nginx's `ngx_http_post_subrequest_pt`.
unsafe extern "C" fn copy_done(_r: *mut ngx_http_request_t, _data: *mut c_void, rc: ngx_int_t) -> ngx_int_t {
    rc
}

/// The mirrors a request goes to, one bit each: each takes its share of
/// requests independently.
fn draw(mirrors: &[Mirror]) -> u32 {
    mirrors
        .iter()
        .take(MAX_MIRRORS)
        .enumerate()
        .filter(|(_, m)| m.takes(fastrand::u64(..)))
        .fold(0, |bits, (i, _)| bits | 1 << i)
}

/// Starts the copies drawn for the request; what the PRECONTENT handler
/// answers (declines, or 500 when nginx could not make one).
fn start_copies(req: &mut Request) -> ngx_int_t {
    let Some(m) = matched(req) else {
        return NGX_DECLINED as ngx_int_t;
    };
    let MirrorState::Reading(taken) = m.mirrors.get() else {
        return NGX_DECLINED as ngx_int_t;
    };
    let Some(nvariables) = NgxHttpCoreModule::main_conf(req).map(|c| c.variables.nelts) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    let mirrors: *const [Mirror] = m.rule().rule.filters.mirrors.as_slice();
    // SAFETY: the mirrors live in the route table the request's `Matched`
    // keeps alive until it ends.
    let mirrors = unsafe { &*mirrors };
    let r: *mut ngx_http_request_t = req.as_mut();
    for (i, _) in mirrors.iter().enumerate().take(MAX_MIRRORS) {
        if taken & (1 << i) == 0 {
            continue;
        }
        // SAFETY: a live main request: its pool, URI and arguments are
        // live; nginx copies the URI and arguments into the subrequest and
        // keeps `ps`, allocated from the request's pool, for the
        // subrequest's life, which the main request's outlives.
        unsafe {
            let ps = ngx_palloc((*r).pool, std::mem::size_of::<ngx_http_post_subrequest_t>())
                .cast::<ngx_http_post_subrequest_t>();
            if ps.is_null() {
                return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
            }
            ps.write(ngx_http_post_subrequest_t {
                handler: Some(copy_done),
                data: MIRROR_SLOTS.as_ptr().add(i).cast_mut().cast(),
            });
            let mut uri = (*r).uri;
            let mut args = (*r).args;
            let mut sr: *mut ngx_http_request_t = ptr::null_mut();
            if ngx_http_subrequest(r, &mut uri, &mut args, &mut sr, ps, NGX_HTTP_SUBREQUEST_BACKGROUND as _)
                != NGX_OK as ngx_int_t
                || sr.is_null()
            {
                return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
            }
            (*sr).set_header_only(1);
            (*sr).method = (*r).method;
            (*sr).method_name = (*r).method_name;
            // The client's own URI, as the main request sends it, unless a
            // rewrite changed it.
            (*sr).set_valid_unparsed_uri((*r).valid_unparsed_uri());
            // nginx gives a subrequest its parent's variable values; the
            // copy gets its own, so that setting its backend does not
            // change the main request's `$proxy_upstream_name` (its log
            // line and metrics).
            let size = nvariables * std::mem::size_of::<ngx_http_variable_value_t>();
            let vars = ngx_palloc((*r).pool, size.max(1)).cast::<ngx_http_variable_value_t>();
            if vars.is_null() {
                return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
            }
            if !(*r).variables.is_null() {
                ptr::copy_nonoverlapping((*r).variables, vars, nvariables);
            }
            (*sr).variables = vars;
        }
    }
    NGX_DECLINED as ngx_int_t
}
