//! The module's variables: declared before the `http{}` block is parsed
//! (their get handlers are in [`crate::http`]) and indexed after it.

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_get_variable_index, ngx_http_request_t, ngx_http_variable_value_t,
    ngx_int_t, ngx_str_t, ngx_uint_t, NGX_ERROR, NGX_HTTP_VAR_CHANGEABLE, NGX_HTTP_VAR_NOCACHEABLE,
    NGX_HTTP_VAR_NOHASH, NGX_LOG_EMERG, NGX_OK,
};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_conf_log_error;

use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;
use crate::nginx::variables::{self, Own};

/// `preconfiguration`: declares our variables (changeable, so that an
/// ingress-nginx template's `set $proxy_alternative_upstream_name "";` works).
///
/// # Safety
/// `cf` is the configuration being parsed.
pub unsafe fn declare_variables(cf: *mut ngx_conf_t) -> ngx_int_t {
    if !variables::layout_is_as_expected() {
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "dynamic_balancer: nginx's variable value layout is not the one this module was built for"
        );
        return NGX_ERROR as ngx_int_t;
    }
    for (i, name) in variables::OWN_NAMES.into_iter().enumerate() {
        // The metrics location is internal: no configuration may name, read
        // or `set` it; the others are settable, as ingress-nginx's.
        let (flags, handler): (u32, ngx::ffi::ngx_http_get_variable_pt) =
            if i == Own::MetricsLocation as usize || i == Own::GatewayRoute as usize || i == Own::Trace as usize {
                (NGX_HTTP_VAR_NOHASH, Some(not_found_value))
            } else {
                (NGX_HTTP_VAR_CHANGEABLE, Some(empty_value))
            };
        // SAFETY: `cf` and its pool are live (this function's contract).
        let mut name = unsafe { ngx_str_t::from_str((*cf).pool, name) };
        // SAFETY: `cf` is live; `name` is in its pool, which nginx keeps.
        let v = unsafe { ngx_http_add_variable(cf, &mut name, flags as ngx_uint_t) };
        if v.is_null() {
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: a non-null result is the variable's live entry in the core
        // module's table.
        unsafe { (*v).get_handler = handler };
    }
    // ingress-nginx's log variables, computed when a log line reads them;
    // changeable, as ingress-nginx `set`s them.
    for (name, handler) in [
        (
            "proxy_upstream_name",
            crate::http::log_variables::upstream_name_variable as GetHandler,
        ),
        ("req_id", crate::http::log_variables::req_id_variable),
    ] {
        // SAFETY: `cf` and its pool are live (this function's contract).
        let mut name = unsafe { ngx_str_t::from_str((*cf).pool, name) };
        // SAFETY: `cf` is live; `name` is in its pool, which nginx keeps.
        let v = unsafe { ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_CHANGEABLE as ngx_uint_t) };
        if v.is_null() {
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: a non-null result is the variable's live entry in the core
        // module's table.
        unsafe { (*v).get_handler = Some(handler) };
    }
    // Computed when read, from the request's balancer state.
    // SAFETY: `cf` and its pool are live (this function's contract).
    let mut name = unsafe { ngx_str_t::from_str((*cf).pool, "balancer_ewma_score") };
    let flags = NGX_HTTP_VAR_CHANGEABLE | NGX_HTTP_VAR_NOCACHEABLE;
    // SAFETY: `cf` is live; `name` is in its pool, which nginx keeps.
    let v = unsafe { ngx_http_add_variable(cf, &mut name, flags as ngx_uint_t) };
    if v.is_null() {
        return NGX_ERROR as ngx_int_t;
    }
    // SAFETY: a non-null result is the variable's live entry in the core
    // module's table.
    unsafe { (*v).get_handler = Some(crate::http::peer::ewma_score_variable) };
    // The client's X-Request-ID or a fresh id, once per request.
    // SAFETY: `cf` and its pool are live (this function's contract).
    let mut name = unsafe { ngx_str_t::from_str((*cf).pool, "dynamic_request_id") };
    // SAFETY: `cf` is live; `name` is in its pool, which nginx keeps.
    let v = unsafe { ngx_http_add_variable(cf, &mut name, 0) };
    if v.is_null() {
        return NGX_ERROR as ngx_int_t;
    }
    // SAFETY: a non-null result is the variable's live entry in the core
    // module's table.
    unsafe { (*v).get_handler = Some(crate::http::request_id::variable) };
    // The WebSocket headers, from the parsed Upgrade header.
    for (name, handler) in [
        (
            "dynamic_upgrade",
            crate::http::connection_upgrade::upgrade_variable as GetHandler,
        ),
        (
            "dynamic_connection_upgrade",
            crate::http::connection_upgrade::connection_variable,
        ),
        // ingress-nginx's $pass_access_scheme and $pass_server_port.
        ("dynamic_pass_access_scheme", crate::http::forwarded::scheme_variable),
        ("dynamic_pass_server_port", crate::http::forwarded::port_variable),
        // ingress-nginx's set-misc `$escaped_request_uri` (auth-signin).
        ("escaped_request_uri", crate::http::escaped_uri::variable),
    ] {
        // SAFETY: `cf` and its pool are live (this function's contract).
        let mut name = unsafe { ngx_str_t::from_str((*cf).pool, name) };
        // SAFETY: `cf` is live; `name` is in its pool, which nginx keeps.
        let v = unsafe { ngx_http_add_variable(cf, &mut name, 0) };
        if v.is_null() {
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: a non-null result is the variable's live entry in the core
        // module's table.
        unsafe { (*v).get_handler = Some(handler) };
    }
    // Tracing's, with otel_ngx_module's names; not cacheable, as a trace
    // starts in the REWRITE phase, after a `set` may have read them.
    for (i, name) in crate::http::otel::VARIABLES.into_iter().enumerate() {
        // SAFETY: `cf` and its pool are live (this function's contract).
        let mut name = unsafe { ngx_str_t::from_str((*cf).pool, name) };
        // SAFETY: `cf` is live; `name` is in its pool, which nginx keeps.
        let v = unsafe { ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t) };
        if v.is_null() {
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: a non-null result is the variable's live entry in the core
        // module's table.
        unsafe {
            (*v).get_handler = Some(crate::http::otel::variable);
            (*v).data = i;
        }
    }
    NGX_OK as ngx_int_t
}

/// A variable's get handler.
type GetHandler = unsafe extern "C" fn(*mut ngx_http_request_t, *mut ngx_http_variable_value_t, usize) -> ngx_int_t;

/// `postconfiguration`: indexes our variables so requests can set them.
///
/// # Safety
/// As [`declare_variables`].
pub unsafe fn index_variables(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: `cf` is live (this function's contract); the main conf is in
    // its pool and nothing else borrows it during postconfiguration.
    let Some(mcf) = Module::main_conf_mut(unsafe { &*cf }) else {
        return NGX_ERROR as ngx_int_t;
    };
    for (name, slot) in variables::OWN_NAMES.iter().zip(mcf.own_variables.iter_mut()) {
        // SAFETY: `cf` and its pool are live (this function's contract).
        let mut name = unsafe { ngx_str_t::from_str((*cf).pool, name) };
        // SAFETY: `cf` is live; `name` is in its pool, which nginx keeps.
        let i = unsafe { ngx_http_get_variable_index(cf, &mut name) };
        if i == NGX_ERROR as ngx_int_t {
            return NGX_ERROR as ngx_int_t;
        }
        *slot = i as usize;
    }
    for (name, slot) in variables::READ_NAMES.iter().zip(mcf.read_variables.iter_mut()) {
        // SAFETY: `cf` and its pool are live (this function's contract).
        let mut name = unsafe { ngx_str_t::from_str((*cf).pool, name) };
        // SAFETY: `cf` is live; `name` is in its pool, which nginx keeps.
        let i = unsafe { ngx_http_get_variable_index(cf, &mut name) };
        if i == NGX_ERROR as ngx_int_t {
            return NGX_ERROR as ngx_int_t;
        }
        *slot = i as usize;
    }
    NGX_OK as ngx_int_t
}

/// The get handler of our internal variable: not found until the module
/// stores its opaque value. nginx calls it with a live request and the
/// variable's value slot.
unsafe extern "C" fn not_found_value(
    _r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    ffi_guard("variable", NGX_ERROR as ngx_int_t, || {
        // SAFETY: nginx hands a get handler the variable's value slot.
        variables::fill_not_found(unsafe { &mut *v });
        NGX_OK as ngx_int_t
    })
}

/// The get handler of our settable variables until a request sets them:
/// nginx calls it with a live request and the variable's value slot.
unsafe extern "C" fn empty_value(
    _r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    ffi_guard("variable", NGX_ERROR as ngx_int_t, || {
        // SAFETY: nginx hands a get handler the variable's value slot.
        variables::fill_empty(unsafe { &mut *v });
        NGX_OK as ngx_int_t
    })
}
