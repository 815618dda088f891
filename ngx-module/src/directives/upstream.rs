//! `dynamic_balancer` in an `upstream{}` (the peer hook installed in place
//! of the upstream's balancing method), `dynamic_balancer_ssl` in a
//! `server{}`, the check that no later directive replaced the hook, and the
//! `server{}` merge.

use std::ffi::{c_char, c_void};
use std::ptr;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_array_push, ngx_command_t, ngx_conf_t, ngx_http_get_variable_index, ngx_http_upstream_server_t,
    ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_str_t, ngx_uint_t, NGX_ERROR, NGX_LOG_EMERG, NGX_OK,
};
use ngx::http::{HttpModuleMainConf, HttpModuleServerConf, NgxHttpUpstreamModule};
use ngx::ngx_conf_log_error;

use super::zones::mark_used;
use crate::conf::{srv_conf_mut, UpstreamConf};
use crate::nginx::directive::args;
use crate::nginx::guard::ffi_guard;

const DEFAULT_VARIABLE: &str = "proxy_upstream_name";

/// `dynamic_balancer [$variable];` in `upstream{}`. nginx calls it while
/// parsing, with the live configuration, this command and our
/// `UpstreamConf` as `conf`.
pub unsafe extern "C" fn set_balancer(cf: *mut ngx_conf_t, cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("dynamic_balancer", NGX_CONF_ERROR, || {
        // SAFETY: for an NGX_HTTP_SRV_CONF_OFFSET directive, `conf` is our
        // `UpstreamConf` from create_srv_conf; configuration runs on one
        // thread.
        let ucf = unsafe { &mut *conf.cast::<UpstreamConf>() };
        if ucf.enabled {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        let mut name = match args(unsafe { &*cf }).get(1) {
            // SAFETY: `cf` and its pool are live.
            None => unsafe { ngx_str_t::from_str((*cf).pool, DEFAULT_VARIABLE) },
            // SAFETY: the argument has `len > 1` bytes at `data`.
            Some(v) if v.len > 1 && unsafe { *v.data } == b'$' => ngx_str_t {
                len: v.len - 1,
                // SAFETY: `len > 1`, so one past `data` is in bounds.
                data: unsafe { v.data.add(1) },
            },
            Some(v) => {
                // SAFETY: `cmd` is this directive's entry of our static
                // command table.
                let directive = unsafe { (*cmd).name };
                ngx_conf_log_error!(NGX_LOG_EMERG, cf, "invalid variable name \"{v}\" in \"{directive}\"");
                return NGX_CONF_ERROR;
            }
        };
        // SAFETY: `cf` is live; `name` points at pool or argument memory,
        // which outlives the configuration.
        let index = unsafe { ngx_http_get_variable_index(cf, &mut name) };
        if index == NGX_ERROR as ngx_int_t {
            return NGX_CONF_ERROR;
        }
        // SAFETY: `cf` is live; the borrow ends with the lookup.
        let Some(uscf) = NgxHttpUpstreamModule::server_conf_mut(unsafe { &*cf }) else {
            return NGX_CONF_ERROR;
        };
        if uscf.peer.init_upstream.is_some() {
            // keepalive (or another balancer) already captured the previous
            // method; replacing it now would silently drop keepalive.
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "\"dynamic_balancer\" must come before \"keepalive\" and cannot be combined with another balancing method"
            );
            return NGX_CONF_ERROR;
        }
        // Peers come from the zone, so no `server` line is needed; nginx
        // refuses an upstream block without one ("no servers are inside
        // upstream"), so add an inert placeholder when there is none yet.
        // SAFETY: an `upstream{}` block's `servers` is null or its live
        // array of `ngx_http_upstream_server_t`.
        if let Some(servers) = unsafe { uscf.servers.as_mut() } {
            if servers.nelts == 0 {
                // SAFETY: `servers` is a live array (see above).
                let placeholder = unsafe { ngx_array_push(servers) }.cast::<ngx_http_upstream_server_t>();
                if placeholder.is_null() {
                    return NGX_CONF_ERROR;
                }
                // SAFETY: `placeholder` is the non-null, aligned element slot
                // ngx_array_push reserved; all-zero is a valid server entry,
                // and `cf`'s pool is live.
                unsafe {
                    ptr::write_bytes(placeholder, 0, 1);
                    (*placeholder).name = ngx_str_t::from_str((*cf).pool, "dynamic_balancer");
                    (*placeholder).weight = 1;
                }
            }
        }
        uscf.peer.init_upstream = Some(init_upstream);
        ucf.enabled = true;
        ucf.variable = index as ngx_uint_t;
        // SAFETY: `cf` is the live configuration being parsed.
        mark_used(unsafe { &*cf });
        NGX_CONF_OK
    })
}

/// `peer.init_upstream`: the upstream's `server` lines (the `0.0.0.1`
/// placeholder) are ignored; peers come from the zone per request. nginx
/// calls it at init_main_conf of the upstream module, with a live upstream.
unsafe extern "C" fn init_upstream(_cf: *mut ngx_conf_t, us: *mut ngx_http_upstream_srv_conf_t) -> ngx_int_t {
    ffi_guard("init upstream", NGX_ERROR as ngx_int_t, || {
        // SAFETY: `us` is the live upstream nginx initialises, on the
        // configuration thread; no other borrow of our conf is held.
        if let Some(conf) = unsafe { srv_conf_mut(us) } {
            conf.initialized = true;
        }
        // The balancer's, which also gives a Gateway request's upstream
        // TLS connection its BackendTLSPolicy (see `crate::tls::upstream`).
        // SAFETY: `us` is live and nginx does not use it during the call.
        unsafe { (*us).peer.init = Some(crate::tls::upstream::init_peer) };
        NGX_OK as ngx_int_t
    })
}

/// Refuses an upstream whose `dynamic_balancer` was replaced by a balancing
/// directive placed after it. nginx only warns ("load balancing method
/// redefined"); the upstream would then send traffic to its `0.0.0.1`
/// placeholder. Runs at postconfiguration, after the upstreams initialised.
///
/// # Safety
/// `cf` is the live, parsed configuration, at postconfiguration.
pub unsafe fn check_upstreams(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: `cf` is live (this function's contract); the borrow ends with
    // the lookup.
    let Some(umcf) = NgxHttpUpstreamModule::main_conf(unsafe { &*cf }) else {
        return NGX_OK as ngx_int_t;
    };
    // SAFETY: the upstream module's `upstreams` is its initialised array of
    // srv conf pointers.
    let upstreams: &[*mut ngx_http_upstream_srv_conf_t] = unsafe { umcf.upstreams.as_slice() };
    for &us in upstreams {
        // SAFETY: every entry is a live upstream of this configuration; no
        // other borrow of our conf is held.
        if let Some(conf) = unsafe { srv_conf_mut(us) } {
            if conf.enabled && !conf.initialized {
                // SAFETY: `us` is live (see above).
                let name = unsafe { (*us).host };
                ngx_conf_log_error!(
                    NGX_LOG_EMERG,
                    cf,
                    "another balancing method replaced \"dynamic_balancer\" in upstream \"{name}\"; only \"keepalive\" may follow it"
                );
                return NGX_ERROR as ngx_int_t;
            }
        }
    }
    NGX_OK as ngx_int_t
}

/// `merge_loc_conf`: inherits `dynamic_balancer_backend`, and takes the API
/// location's `client_max_body_size` over from nginx (whose own check would
/// answer an HTML 413 before our handler). nginx calls it after parsing
/// with the live configuration and two distinct `LocConf`s of ours: the
/// enclosing block's (`prev`) and this block's (`conf`).
/// `dynamic_balancer_ssl on|off;` in `http{}` or `server{}`: nginx calls it
/// while parsing, with our `UpstreamConf` of that block.
pub unsafe extern "C" fn set_ssl(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("dynamic_balancer_ssl", NGX_CONF_ERROR, || {
        // SAFETY: for an NGX_HTTP_SRV_CONF_OFFSET directive, `conf` is our
        // `UpstreamConf` from create_srv_conf; configuration runs on one thread.
        let scf = unsafe { &mut *conf.cast::<UpstreamConf>() };
        if scf.ssl.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        let value = args(unsafe { &*cf })[1];
        scf.ssl = match value.as_bytes() {
            b"on" => Some(true),
            b"off" => Some(false),
            _ => return c"takes \"on\" or \"off\"".as_ptr().cast_mut(),
        };
        if scf.ssl == Some(true) {
            // SAFETY: `cf` is the live configuration being parsed.
            mark_used(unsafe { &*cf });
        }
        NGX_CONF_OK
    })
}

/// `dynamic_balancer_ssl_routes listener;` in a `server{}`: handshakes
/// take the certificates the route table gives that listener, by SNI (see
/// [`crate::tls::handshake`]); implies `dynamic_balancer_ssl on` there.
/// nginx calls it while parsing, with our `UpstreamConf` as `conf`.
pub unsafe extern "C" fn set_ssl_routes(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    ffi_guard("dynamic_balancer_ssl_routes", NGX_CONF_ERROR, || {
        // SAFETY: for an NGX_HTTP_SRV_CONF_OFFSET directive, `conf` is our
        // `UpstreamConf` from create_srv_conf; configuration runs on one thread.
        let scf = unsafe { &mut *conf.cast::<UpstreamConf>() };
        if scf.ssl == Some(false) {
            return c"conflicts with \"dynamic_balancer_ssl off\"".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        let rc = unsafe { crate::nginx::directive::set_literal_once(cf, &mut scf.ssl_routes, "listener name") };
        if rc == NGX_CONF_OK {
            scf.ssl = Some(true);
            // SAFETY: `cf` is the live configuration being parsed.
            let cf = unsafe { &*cf };
            mark_used(cf);
            let Some(mcf) = crate::nginx::module::Module::main_conf_mut(cf) else {
                return NGX_CONF_ERROR;
            };
            mcf.routes_used = true;
        }
        rc
    })
}

/// Merges a `server{}`'s `UpstreamConf` with its `http{}` one: nginx calls it
/// once per server after parsing, with both live and distinct.
pub unsafe extern "C" fn merge_srv_conf(_cf: *mut ngx_conf_t, prev: *mut c_void, conf: *mut c_void) -> *mut c_char {
    ffi_guard("merge server conf", NGX_CONF_ERROR, || {
        // SAFETY: `prev` is the http block's `UpstreamConf`, only read.
        let parent = unsafe { &*prev.cast::<UpstreamConf>() };
        // SAFETY: `conf` is this server's, a different allocation.
        let scf = unsafe { &mut *conf.cast::<UpstreamConf>() };
        if scf.ssl.is_none() {
            scf.ssl = parent.ssl;
        }
        NGX_CONF_OK
    })
}
