//! `ngx_http_dynamic_balancer_module`: backends in shared memory, pushed
//! through a JSON `/configuration` API compatible with ingress-nginx, and an
//! upstream peer hook that routes by them without any reload.
//!
//! The crate is a stack of folders; a file imports only from its own folder
//! or from a folder below it, and nothing imports this file (the order is
//! enforced by `tests/tests/architecture.rs`; see the book's `docs/src/architecture.md`):
//!
//! 0. [`nginx`]: nginx wrapped once (the module's handles, panics kept
//!    out, the worker process, requests, variables);
//! 1. [`shm`]: the shared zones, their blobs and writes, the state file;
//! 2. [`otel`]: tracing's span queue and exporter thread;
//! 3. [`conf`]: the configuration structs and their request-time readers;
//! 4. [`backends`]: each worker's decoded backends, canaries,
//!    `ExternalName` re-resolution;
//! 5. [`http`]: the request-time hooks (peer, preaccess, redirects,
//!    variables, metrics counting);
//! 6. [`tls`]: certificates from the zone, chosen per handshake;
//! 7. [`api`]: the `/configuration` API;
//! 8. [`stream`]: the stream half (TCP and UDP upstreams);
//! 9. [`process`]: `init_module`, worker start and stop, the sync timer;
//! 10. [`directives`]: setters, checks and merges, run at configuration
//!     time only;
//!
//! and this file, the composition root: the module objects nginx loads,
//! the command table and the configuration hooks. Parsing, validation and
//! selection are in the pure `lua-compat` crate. `unsafe` operations each
//! carry a `// SAFETY:` line, also inside `unsafe fn`s.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod api;
mod backends;
mod conf;
mod directives;
mod http;
mod nginx;
mod otel;
mod process;
mod shm;
#[cfg(feature = "stream")]
mod stream;
mod tls;

use std::ffi::c_void;
use std::ptr::addr_of_mut;

use ngx::ffi::{
    ngx_array_push, ngx_command_t, ngx_conf_t, ngx_http_handler_pt, ngx_http_module_t,
    ngx_http_phases_NGX_HTTP_LOG_PHASE, ngx_http_phases_NGX_HTTP_PREACCESS_PHASE,
    ngx_http_phases_NGX_HTTP_PRECONTENT_PHASE, ngx_http_phases_NGX_HTTP_REWRITE_PHASE, ngx_int_t, ngx_module_t,
    ngx_uint_t, NGX_CONF_1MORE, NGX_CONF_NOARGS, NGX_CONF_TAKE1, NGX_CONF_TAKE12, NGX_CONF_TAKE1234, NGX_ERROR,
    NGX_HTTP_LOC_CONF, NGX_HTTP_LOC_CONF_OFFSET, NGX_HTTP_MAIN_CONF, NGX_HTTP_MAIN_CONF_OFFSET, NGX_HTTP_MODULE,
    NGX_HTTP_SRV_CONF, NGX_HTTP_SRV_CONF_OFFSET, NGX_HTTP_UPS_CONF, NGX_OK,
};
use ngx::http::{HttpModule, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::ngx_string;

use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;

/// nginx calls it once per configuration, before the `http{}` block is
/// parsed, with that block's live `ngx_conf_t`.
unsafe extern "C" fn preconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    ffi_guard("preconfiguration", NGX_ERROR as ngx_int_t, || {
        // SAFETY: `cf` is the configuration nginx is parsing, live for
        // this call.
        unsafe { directives::declare_variables(cf) }
    })
}

/// nginx calls it once per configuration, after the `http{}` block was
/// parsed and every upstream initialised, with that block's live
/// `ngx_conf_t`, on its only thread.
unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    ffi_guard("postconfiguration", NGX_ERROR as ngx_int_t, || {
        // SAFETY: `cf` is the parsed configuration, live for this call;
        // postconfiguration runs after the upstreams initialised and the
        // listen addresses were collected, as both checks require.
        if unsafe {
            directives::check_upstreams(cf) != NGX_OK as ngx_int_t
                || directives::check_api_listeners(cf) != NGX_OK as ngx_int_t
        } {
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: `cf` is live for this call; the main conf is in its pool
        // and nothing else borrows it during postconfiguration.
        let Some(mcf) = Module::main_conf_mut(unsafe { &*cf }) else {
            return NGX_ERROR as ngx_int_t;
        };
        // SAFETY: `cf->cycle` is the cycle being configured; its modules
        // array was set before any configuration was parsed.
        unsafe { http::preaccess::discover_upstream_users((*cf).cycle, mcf) };
        let mcf_metrics_zone = mcf.metrics_zone;
        let https_redirect_used = mcf.https_redirect_used;
        let routes_used = mcf.routes_used;
        let otel_used = mcf.otel_used;
        // SAFETY: postconfiguration runs once per configuration, before
        // any request, on nginx's only thread at that point.
        unsafe { api::body_limit::install() };
        // SAFETY: `cf` is the parsed configuration, live for this call;
        // the ssl module (static) merged its server confs already.
        if unsafe { tls::handshake::install(cf) } != NGX_OK as ngx_int_t {
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: `cf` is the parsed configuration, live for this call.
        if unsafe { directives::index_variables(cf) } != NGX_OK as ngx_int_t {
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: `cf` is live for this call; the borrow ends with the
        // lookup, which returns the core module's main conf (pool memory).
        let Some(cmcf) = NgxHttpCoreModule::main_conf_mut(unsafe { &*cf }) else {
            return NGX_ERROR as ngx_int_t;
        };
        let handlers = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_PREACCESS_PHASE as usize].handlers;
        // SAFETY: `handlers` is the core module's initialised array of
        // `ngx_http_handler_pt`, allocated from the configuration pool.
        let h = unsafe { ngx_array_push(handlers) }.cast::<ngx_http_handler_pt>();
        if h.is_null() {
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: `h` is the non-null, aligned, element-sized slot that
        // ngx_array_push just reserved for us.
        unsafe { *h = Some(http::preaccess::preaccess_handler) };
        if https_redirect_used {
            let handlers = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_REWRITE_PHASE as usize].handlers;
            // SAFETY: as above, for the rewrite phase's handler array.
            let h = unsafe { ngx_array_push(handlers) }.cast::<ngx_http_handler_pt>();
            if h.is_null() {
                return NGX_ERROR as ngx_int_t;
            }
            // SAFETY: as above.
            unsafe { *h = Some(http::https_redirect::rewrite_handler) };
        }
        if routes_used {
            let handlers = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_REWRITE_PHASE as usize].handlers;
            // SAFETY: as above, for the rewrite phase's handler array.
            let h = unsafe { ngx_array_push(handlers) }.cast::<ngx_http_handler_pt>();
            if h.is_null() {
                return NGX_ERROR as ngx_int_t;
            }
            // SAFETY: as above.
            unsafe { *h = Some(http::gateway::rewrite_handler) };
            let handlers = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_PRECONTENT_PHASE as usize].handlers;
            // SAFETY: as above, for the precontent phase's handler array.
            let h = unsafe { ngx_array_push(handlers) }.cast::<ngx_http_handler_pt>();
            if h.is_null() {
                return NGX_ERROR as ngx_int_t;
            }
            // SAFETY: as above.
            unsafe { *h = Some(http::gateway_mirror::precontent_handler) };
            // SAFETY: postconfiguration runs once per configuration, before
            // any request, on nginx's only thread at that point.
            unsafe { http::gateway_headers::install() };
        }
        if otel_used {
            for (phase, handler) in [
                (
                    ngx_http_phases_NGX_HTTP_REWRITE_PHASE,
                    http::otel::rewrite_handler as HttpHandler,
                ),
                (ngx_http_phases_NGX_HTTP_LOG_PHASE, http::otel::log_handler),
            ] {
                let handlers = &mut cmcf.phases[phase as usize].handlers;
                // SAFETY: as above, for that phase's handler array.
                let h = unsafe { ngx_array_push(handlers) }.cast::<ngx_http_handler_pt>();
                if h.is_null() {
                    return NGX_ERROR as ngx_int_t;
                }
                // SAFETY: as above.
                unsafe { *h = Some(handler) };
            }
        }
        if !mcf_metrics_zone.is_null() {
            let handlers = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_LOG_PHASE as usize].handlers;
            // SAFETY: as above, for the log phase's handler array.
            let h = unsafe { ngx_array_push(handlers) }.cast::<ngx_http_handler_pt>();
            if h.is_null() {
                return NGX_ERROR as ngx_int_t;
            }
            // SAFETY: as above.
            unsafe { *h = Some(http::metrics::log_handler) };
        }
        NGX_OK as ngx_int_t
    })
}

/// A phase handler.
type HttpHandler = unsafe extern "C" fn(*mut ngx::ffi::ngx_http_request_t) -> ngx_int_t;

static MODULE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(preconfiguration),
    postconfiguration: Some(postconfiguration),
    create_main_conf: Some(Module::create_main_conf),
    init_main_conf: Some(directives::init_main_conf),
    create_srv_conf: Some(Module::create_srv_conf),
    merge_srv_conf: Some(directives::merge_srv_conf),
    create_loc_conf: Some(Module::create_loc_conf),
    merge_loc_conf: Some(directives::merge_loc_conf),
};

static mut COMMANDS: [ngx_command_t; 21] = [
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_routes"),
        type_: (NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1234) as ngx_uint_t,
        set: Some(directives::set_routes),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_zone"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_zone),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer"),
        type_: (NGX_HTTP_UPS_CONF | NGX_CONF_NOARGS | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_balancer),
        conf: NGX_HTTP_SRV_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_api"),
        type_: (NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS) as ngx_uint_t,
        set: Some(directives::set_api),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_api_token"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_token),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_api_token_file"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_token_file),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_backend"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_backend),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_ssl"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_ssl),
        conf: NGX_HTTP_SRV_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_ssl_routes"),
        type_: (NGX_HTTP_SRV_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_ssl_routes),
        conf: NGX_HTTP_SRV_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_metrics_zone"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_metrics_zone),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_metrics"),
        type_: (NGX_HTTP_LOC_CONF | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(directives::set_metrics),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_https_redirect"),
        type_: (NGX_HTTP_LOC_CONF | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(directives::set_https_redirect),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_forwarded_headers"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_loc_flag),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: std::mem::offset_of!(conf::LocConf, forwarded_headers),
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_request_id"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_loc_flag),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: std::mem::offset_of!(conf::LocConf, request_id_header),
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_otel"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_otel),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_otel_trust_incoming_spans"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_loc_flag),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: std::mem::offset_of!(conf::LocConf, otel_trust),
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_otel_operation_name"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_otel_operation_name),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_otel_exporter"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(directives::set_otel_exporter),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_otel_sampler"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE12) as ngx_uint_t,
        set: Some(directives::set_otel_sampler),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_state"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::set_state_file),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: std::ptr::null_mut(),
    },
    ngx_command_t::empty(),
];

#[cfg(not(feature = "stream"))]
ngx::ngx_modules!(ngx_http_dynamic_balancer_module);
// ngx 0.5.1's `ngx_modules!` miscounts two modules, so with both the three
// tables `load_module` reads are written out as the macro would.
#[cfg(feature = "stream")]
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_modules: [*const ngx_module_t; 4] = [
    std::ptr::addr_of!(ngx_http_dynamic_balancer_module),
    std::ptr::addr_of!(ngx_stream_dynamic_balancer_module),
    std::ptr::addr_of!(ngx_dynamic_balancer_check_module),
    std::ptr::null(),
];
#[cfg(feature = "stream")]
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_module_names: [*const std::ffi::c_char; 4] = [
    c"ngx_http_dynamic_balancer_module".as_ptr(),
    c"ngx_stream_dynamic_balancer_module".as_ptr(),
    c"ngx_dynamic_balancer_check_module".as_ptr(),
    std::ptr::null(),
];
#[cfg(feature = "stream")]
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_module_order: [*const std::ffi::c_char; 1] = [std::ptr::null()];

#[used]
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_http_dynamic_balancer_module: ngx_module_t = ngx_module_t {
    ctx: std::ptr::addr_of!(MODULE_CTX) as *mut c_void,
    // SAFETY: nginx reads the command table; nothing in Rust mutates it.
    commands: unsafe { addr_of_mut!(COMMANDS[0]) },
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_module: Some(process::init_module::init_module),
    init_process: Some(process::timer::init_process),
    exit_process: Some(process::timer::exit_process),
    ..ngx_module_t::default()
};

/// The stream half: `dynamic_balancer` in `stream{}` upstreams (see
/// [`stream`]). A separate `ngx_module_t` in the same shared object, as
/// nginx wants one module per type; built only with the `stream` feature,
/// since a distribution's nginx may load its stream module dynamically, or
/// not at all.
#[cfg(feature = "stream")]
#[used]
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_stream_dynamic_balancer_module: ngx_module_t = ngx_module_t {
    ctx: std::ptr::addr_of!(stream::directives::MODULE_CTX) as *mut c_void,
    // SAFETY: nginx reads the command table; nothing in Rust mutates it.
    commands: unsafe { addr_of_mut!(stream::directives::COMMANDS[0]) },
    type_: ngx::ffi::NGX_STREAM_MODULE as ngx_uint_t,
    ..ngx_module_t::default()
};

/// A core module with no directives, whose `init_conf` checks what needs
/// both `http{}` and `stream{}` parsed (a stream `dynamic_balancer` needs
/// the http zone), where a failure refuses a reload instead of ending the
/// master.
#[cfg(feature = "stream")]
#[used]
#[allow(non_upper_case_globals)]
pub static mut ngx_dynamic_balancer_check_module: ngx_module_t = ngx_module_t {
    ctx: std::ptr::addr_of_mut!(stream::directives::CORE_CTX).cast(),
    commands: std::ptr::null_mut(),
    type_: ngx::ffi::NGX_CORE_MODULE as ngx_uint_t,
    ..ngx_module_t::default()
};
