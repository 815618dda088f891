//! ingress-nginx's log variables: `$proxy_upstream_name` (the location's
//! backend) and `$req_id` (the request id sent upstream), so that its
//! `log-format-upstream` works unchanged. ingress-nginx `set`s them in every
//! location; here they cost nothing until a log line reads them.
//! (`$proxy_alternative_upstream_name`, the canary's backend, is set by the
//! balancer when it picks a canary.)

use ngx::ffi::{ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t, NGX_OK};
use ngx::http::{HttpModuleLocationConf, Request};

use crate::conf::read_variable;
use crate::nginx::module::Module;
use crate::nginx::variables::{self, Read};

/// The get handler of `$proxy_upstream_name`: the location's
/// `dynamic_balancer_backend`, not found elsewhere. nginx calls it with a
/// live request and the variable's value slot.
pub unsafe extern "C" fn upstream_name_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    let body = |req: &mut Request, v: &mut ngx_http_variable_value_t| {
        match Module::location_conf(req).and_then(|l| l.backend) {
            // SAFETY: `dynamic_balancer_backend` stored a directive argument
            // in the configuration pool, which outlives the request.
            Some(name) => unsafe {
                variables::fill_borrowed(v, std::slice::from_raw_parts(name.data, name.len));
            },
            None => variables::fill_not_found(v),
        }
        NGX_OK as ngx_int_t
    };
    // SAFETY: nginx calls a get handler with a live request and its value
    // slot, which nothing else borrows during the call.
    unsafe { variables::get_handler("$proxy_upstream_name", r, v, body) }
}

/// The get handler of `$req_id`: `$dynamic_request_id`'s value (the
/// client's `X-Request-ID` or the id generated for the request), read
/// through its index so both name one id.
pub unsafe extern "C" fn req_id_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    let body = |req: &mut Request, v: &mut ngx_http_variable_value_t| {
        match read_variable(req, Read::RequestId) {
            // SAFETY: the cached value lives in the request's pool or its
            // headers, as long as the request.
            Some(id) => unsafe { variables::fill_borrowed(v, id) },
            None => variables::fill_not_found(v),
        }
        NGX_OK as ngx_int_t
    };
    // SAFETY: nginx calls a get handler with a live request and its value
    // slot, which nothing else borrows during the call.
    unsafe { variables::get_handler("$req_id", r, v, body) }
}
