//! Answers 503 before proxying when the request's backend is unknown, empty
//! or has no endpoints, as ingress-nginx's `balancer.rewrite()` does.
//!
//! The peer hook itself cannot choose the status: when it finds no peer,
//! nginx's upstream core always answers 502. So this PREACCESS handler looks at
//! the location's `proxy_pass`/`grpc_pass` upstream and, when it is a
//! `dynamic_balancer` one, checks the backend first.

use std::ffi::CStr;

use ngx::ffi::{
    ngx_cycle_t, ngx_http_request_t, ngx_http_upstream_conf_t, ngx_int_t, NGX_DECLINED, NGX_HTTP_SERVICE_UNAVAILABLE,
    NGX_LOG_WARN,
};
use ngx::http::{HttpModuleMainConf, Request};
use ngx::ngx_log_error;

use crate::conf::{backend_name, upstream_conf, zone_of, MainConf, UNKNOWN};
use crate::http::metrics;
use crate::http::peer;
use crate::http::request_id;
use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;

/// The modules whose locations proxy through an upstream. Their
/// `ctx_index` is found by name at configuration time (they may be compiled
/// out, so we do not link to their symbols) and kept in the configuration's
/// [`MainConf::upstream_users`].
const UPSTREAM_USER_NAMES: [&CStr; 2] = [c"ngx_http_proxy_module", c"ngx_http_grpc_module"];

/// Finds the proxy and grpc modules in `cycle`, for `mcf` (that cycle's
/// main conf).
///
/// # Safety
/// `cycle` is the cycle being configured, with its modules array set.
pub unsafe fn discover_upstream_users(cycle: *const ngx_cycle_t, mcf: &mut MainConf) {
    // SAFETY: `cycle` is live and its `modules` array holds `modules_n`
    // entries (this function's contract).
    let modules = unsafe { std::slice::from_raw_parts((*cycle).modules, (*cycle).modules_n) };
    for (slot, wanted) in mcf.upstream_users.iter_mut().zip(UPSTREAM_USER_NAMES) {
        // SAFETY: the non-null entries of the cycle's modules array are the
        // loaded modules, live for the cycle; a module's `name` is null or a
        // NUL-terminated string set by ngx_preinit_modules.
        let found = unsafe {
            modules
                .iter()
                .filter(|m| !m.is_null() && !(***m).name.is_null())
                .find(|m| CStr::from_ptr((***m).name) == wanted)
                .map_or(UNKNOWN, |m| (**m).ctx_index)
        };
        *slot = found;
    }
}

/// The upstream the location proxies to. Both modules' location confs start
/// with an `ngx_http_upstream_conf_t` whose first field is that upstream; this
/// has held since grpc was added (1.13.10).
fn location_upstream(req: &Request) -> impl Iterator<Item = *mut ngx::ffi::ngx_http_upstream_srv_conf_t> + '_ {
    let r = req.as_ref();
    let users = Module::main_conf(req).map_or([UNKNOWN; 2], |m| m.upstream_users);
    users.into_iter().filter_map(move |index| {
        if index == UNKNOWN {
            return None;
        }
        // SAFETY: the live request `req` borrows (for as long as the
        // iterator) has a `loc_conf` entry for every HTTP module's ctx_index,
        // and `index` is the proxy or grpc module's, whose location conf
        // starts with an `ngx_http_upstream_conf_t`.
        let conf = unsafe { (*r.loc_conf.add(index)).cast::<ngx_http_upstream_conf_t>().as_ref() }?;
        (!conf.upstream.is_null()).then_some(conf.upstream)
    })
}

/// The PREACCESS phase handler: nginx calls it with a live request, on the
/// event loop.
pub unsafe extern "C" fn preaccess_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    ffi_guard("preaccess handler", NGX_DECLINED as ngx_int_t, || {
        // SAFETY: nginx runs phase handlers with a live request, on the
        // event loop, and holds no reference into it meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        metrics::remember(req);
        request_id::ensure_header(req);
        // SAFETY: the upstreams the request's location confs name are live
        // srv confs of the running configuration.
        let Some(conf) = location_upstream(req).find_map(|us| unsafe { upstream_conf(us) }) else {
            return NGX_DECLINED as ngx_int_t;
        };
        let Some(zone) = zone_of(req) else {
            return NGX_DECLINED as ngx_int_t;
        };
        if peer::prepare(req, conf, &zone).is_some() {
            return NGX_DECLINED as ngx_int_t;
        }
        let name = String::from_utf8_lossy(backend_name(req, conf).unwrap_or_default());
        // (No canary could take it either: `prepare` follows canary rules.)
        // SAFETY: a live request's connection outlives it.
        let log = unsafe { (*req.connection()).log };
        ngx_log_error!(
            NGX_LOG_WARN,
            log,
            "dynamic_balancer: no endpoints for backend \"{name}\""
        );
        NGX_HTTP_SERVICE_UNAVAILABLE as ngx_int_t
    })
}
