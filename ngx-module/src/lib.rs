//! `ngx_http_dynamic_balancer_module`: backends in shared memory, pushed
//! through a JSON `/configuration` API compatible with ingress-nginx, and an
//! upstream peer hook that routes by them without any reload.
//!
//! Layout: the FFI entry points live in [`config`] (directives), [`peer`] (the
//! balancer), [`preaccess`] (503 for missing backends), [`api`] (the HTTP API)
//! and [`timer`] (worker lifecycle); [`zone`], [`store`] and
//! [`worker_cache`] hold the shared and per-worker state; [`http`] and
//! [`offload`] wrap the nginx request and thread-pool APIs once. Parsing,
//! validation and picking are in the pure `lua-compat` crate.

mod api_handler;
mod body_limit;
mod canary;
mod conf;
mod directives;
mod external_names;
mod guard;
mod index;
mod offload;
mod peer;
mod preaccess;
mod request;
mod request_ctx;
mod store;
mod timer;
mod variables;
mod worker;
mod worker_cache;
mod zone;

use std::ffi::c_void;
use std::ptr::addr_of_mut;

use ngx::ffi::{
    ngx_array_push, ngx_command_t, ngx_conf_t, ngx_http_handler_pt, ngx_http_module_t,
    ngx_http_phases_NGX_HTTP_PREACCESS_PHASE, ngx_int_t, ngx_module_t, ngx_uint_t, NGX_CONF_NOARGS, NGX_CONF_TAKE1,
    NGX_ERROR, NGX_HTTP_LOC_CONF, NGX_HTTP_LOC_CONF_OFFSET, NGX_HTTP_MAIN_CONF, NGX_HTTP_MAIN_CONF_OFFSET,
    NGX_HTTP_MODULE, NGX_HTTP_SRV_CONF, NGX_HTTP_SRV_CONF_OFFSET, NGX_HTTP_UPS_CONF, NGX_OK,
};
use ngx::http::{HttpModule, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::ngx_string;

use crate::guard::ffi_guard;

/// The module's handle for ngx's configuration traits.
pub struct Module;

impl Module {
    fn module_ref() -> &'static ngx_module_t {
        <Module as HttpModule>::module()
    }
}

impl HttpModule for Module {
    unsafe extern "C" fn preconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        ffi_guard("preconfiguration", NGX_ERROR as ngx_int_t, || unsafe {
            directives::declare_variables(cf)
        })
    }

    fn module() -> &'static ngx_module_t {
        // SAFETY: nginx writes the module's indexes before any request or
        // configuration callback reads them, and never concurrently.
        unsafe { &*std::ptr::addr_of!(ngx_http_dynamic_balancer_module) }
    }

    unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        ffi_guard("postconfiguration", NGX_ERROR as ngx_int_t, || unsafe {
            if directives::check_upstreams(cf) != NGX_OK as ngx_int_t
                || directives::check_api_listeners(cf) != NGX_OK as ngx_int_t
            {
                return NGX_ERROR as ngx_int_t;
            }
            preaccess::discover_upstream_users((*cf).cycle);
            body_limit::install();
            if directives::index_variables(cf) != NGX_OK as ngx_int_t {
                return NGX_ERROR as ngx_int_t;
            }
            let Some(cmcf) = NgxHttpCoreModule::main_conf_mut(&*cf) else {
                return NGX_ERROR as ngx_int_t;
            };
            let handlers = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_PREACCESS_PHASE as usize].handlers;
            let h = ngx_array_push(handlers).cast::<ngx_http_handler_pt>();
            if h.is_null() {
                return NGX_ERROR as ngx_int_t;
            }
            *h = Some(preaccess::preaccess_handler);
            NGX_OK as ngx_int_t
        })
    }
}

/// This module's `ctx_index` (its slot in configuration and context arrays).
pub(crate) fn module_ctx_index() -> usize {
    Module::module_ref().ctx_index
}

static MODULE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(Module::preconfiguration),
    postconfiguration: Some(Module::postconfiguration),
    create_main_conf: Some(Module::create_main_conf),
    init_main_conf: Some(directives::init_main_conf),
    create_srv_conf: Some(Module::create_srv_conf),
    merge_srv_conf: None,
    create_loc_conf: Some(Module::create_loc_conf),
    merge_loc_conf: Some(directives::merge_loc_conf),
};

static mut COMMANDS: [ngx_command_t; 7] = [
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
    ngx_command_t::empty(),
];

ngx::ngx_modules!(ngx_http_dynamic_balancer_module);

#[used]
#[allow(non_upper_case_globals)]
pub static mut ngx_http_dynamic_balancer_module: ngx_module_t = ngx_module_t {
    ctx: std::ptr::addr_of!(MODULE_CTX) as *mut c_void,
    // SAFETY: nginx reads the command table; nothing in Rust mutates it.
    commands: unsafe { addr_of_mut!(COMMANDS[0]) },
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_process: Some(timer::init_process),
    exit_process: Some(timer::exit_process),
    ..ngx_module_t::default()
};
