//! The `location{}` directives: `dynamic_balancer_backend`, the on/off
//! flags (`dynamic_balancer_forwarded_headers`, `dynamic_balancer_request_id`),
//! `dynamic_balancer_https_redirect`, `dynamic_balancer_metrics`, and the
//! location merge.

use std::ffi::{c_char, c_void};
use std::ptr;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{ngx_command_t, ngx_conf_t, ngx_http_conf_ctx_t, ngx_http_core_loc_conf_t, NGX_LOG_EMERG};
use ngx::http::{HttpModule, HttpModuleConfExt, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::ngx_conf_log_error;

use std::cell::RefCell;
use std::rc::Rc;

use lua_compat::https_redirect::Rule;
use lua_compat::metrics::labels::{label_hash, series_text};
use lua_compat::metrics::LocationLabels;

use crate::conf::{LocConf, LocMetrics, UpstreamConf};
use crate::nginx::directive::set_literal_once;
use crate::nginx::directive::{args, text_args};
use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;

/// `dynamic_balancer_backend name;` in `http`, `server` or `location`.
/// nginx calls it while parsing, with the live configuration and our
/// `LocConf` as `conf`.
pub unsafe extern "C" fn set_backend(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("dynamic_balancer_backend", NGX_CONF_ERROR, || {
        // SAFETY: `conf` is our `LocConf` from create_loc_conf;
        // configuration runs on one thread.
        let lcf = unsafe { &mut *conf.cast::<LocConf>() };
        // SAFETY: `cf` is the live configuration being parsed.
        unsafe { set_literal_once(cf, &mut lcf.backend, "backend name") }
    })
}

/// `dynamic_balancer_routes listener [@h2c [@tls [@grpcs]]];` in a
/// `location{}`: route its requests by the Gateway API routes pushed for
/// `listener` (see [`crate::http::gateway`]). Requests whose backend
/// speaks HTTP/2 cleartext continue in the named location `@h2c`; those
/// whose backend is reached over TLS (a BackendTLSPolicy) in `@tls`, or
/// in `@grpcs` for an HTTP/2 one. nginx calls it while parsing, with the
/// live configuration and our `LocConf` as `conf`.
pub unsafe extern "C" fn set_routes(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("dynamic_balancer_routes", NGX_CONF_ERROR, || {
        // SAFETY: `conf` is our `LocConf` from create_loc_conf;
        // configuration runs on one thread.
        let lcf = unsafe { &mut *conf.cast::<LocConf>() };
        // SAFETY: `cf` is the live configuration being parsed.
        let rc = unsafe { set_literal_once(cf, &mut lcf.routes, "listener name") };
        if rc != NGX_CONF_OK {
            return rc;
        }
        // SAFETY: as above.
        let a = args(unsafe { &*cf });
        for (i, which) in ["h2c", "tls", "grpcs"].into_iter().enumerate() {
            let Some(name) = a.get(2 + i) else { break };
            if name.len < 2 || !name.as_bytes().starts_with(b"@") || name.as_bytes().contains(&b'$') {
                ngx_conf_log_error!(
                    NGX_LOG_EMERG,
                    cf,
                    "invalid {which} location \"{name}\": a named location (\"@name\") is expected"
                );
                return NGX_CONF_ERROR;
            }
            let slot = match which {
                "h2c" => &mut lcf.routes_h2c,
                "tls" => &mut lcf.routes_tls,
                _ => &mut lcf.routes_grpcs,
            };
            *slot = Some(*name);
        }
        // SAFETY: `cf` is live; the main conf is in its pool and this
        // setter holds no other borrow of it.
        let Some(mcf) = Module::main_conf_mut(unsafe { &*cf }) else {
            return NGX_CONF_ERROR;
        };
        mcf.routes_used = true;
        rc
    })
}

/// An `on | off` directive of a `LocConf` `Option<bool>` field, as nginx's
/// `ngx_conf_set_flag_slot` does it for `ngx_flag_t`: the command's `offset`
/// (`offset_of!(LocConf, field)`) says which field. Used by
/// `dynamic_balancer_forwarded_headers` (`X-Forwarded-*` believed by
/// `$dynamic_pass_*` and the HTTPS redirect) and
/// `dynamic_balancer_request_id` (see [`crate::http::request_id::ensure_header`]).
/// nginx calls it while parsing, with the live configuration, the command
/// and our `LocConf` as `conf`.
pub unsafe extern "C" fn set_loc_flag(cf: *mut ngx_conf_t, cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("an on/off directive", NGX_CONF_ERROR, || {
        // SAFETY: `cmd` is one of our commands, `cf` the live configuration
        // being parsed; nginx calls `set` with both.
        let (cmd, cf) = unsafe { (&*cmd, &*cf) };
        // SAFETY: `conf` is our `LocConf` from create_loc_conf, and the
        // commands that name this setter put the offset of one of its
        // `Option<bool>` fields in `offset`; configuration runs on one thread.
        let slot = unsafe { &mut *conf.cast::<u8>().add(cmd.offset).cast::<Option<bool>>() };
        if slot.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        let value = args(cf)[1];
        *slot = Some(match value.as_bytes() {
            b"on" => true,
            b"off" => false,
            _ => {
                let name = cmd.name;
                let cf = ptr::from_ref(cf).cast_mut();
                ngx_conf_log_error!(
                    NGX_LOG_EMERG,
                    cf,
                    "invalid value \"{value}\" in {name}: \"on\" or \"off\" is expected"
                );
                return NGX_CONF_ERROR;
            }
        });
        NGX_CONF_OK
    })
}

/// `dynamic_balancer_https_redirect off | code [preserve_trailing_slash]
/// [port=N];` in a location: plain-HTTP requests
/// are redirected to HTTPS (see [`crate::http::https_redirect`]). nginx calls it
/// while parsing, with the live configuration and our `LocConf` as `conf`.
pub unsafe extern "C" fn set_https_redirect(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    ffi_guard("dynamic_balancer_https_redirect", NGX_CONF_ERROR, || {
        // SAFETY: `conf` is our `LocConf` from create_loc_conf;
        // configuration runs on one thread.
        let lcf = unsafe { &mut *conf.cast::<LocConf>() };
        if lcf.https_redirect.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        let texts = match text_args(unsafe { &*cf }) {
            Ok(texts) => texts,
            Err(w) => {
                ngx_conf_log_error!(
                    NGX_LOG_EMERG,
                    cf,
                    "dynamic_balancer_https_redirect: \"{w}\" is not UTF-8"
                );
                return NGX_CONF_ERROR;
            }
        };
        let rule = match Rule::parse(&texts) {
            Ok(rule) => rule,
            Err(e) => {
                ngx_conf_log_error!(NGX_LOG_EMERG, cf, "dynamic_balancer_https_redirect: {e}");
                return NGX_CONF_ERROR;
            }
        };
        if rule.is_some() {
            // SAFETY: `cf` is live; the main conf is in its pool and this
            // setter holds no other borrow of it.
            let Some(mcf) = Module::main_conf_mut(unsafe { &*cf }) else {
                return NGX_CONF_ERROR;
            };
            mcf.https_redirect_used = true;
        }
        lcf.https_redirect = Some(rule);
        NGX_CONF_OK
    })
}

/// `dynamic_balancer_metrics key=value ...;` in a `location{}` (inherited by
/// nested ones): count this location's requests under these labels
/// (`namespace`, `ingress`, `service`, `host`, `path`). nginx calls it
/// while parsing, with the live configuration and our `LocConf` as `conf`.
pub unsafe extern "C" fn set_metrics(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("dynamic_balancer_metrics", NGX_CONF_ERROR, || {
        // SAFETY: `conf` is our `LocConf` from create_loc_conf;
        // configuration runs on one thread.
        let lcf = unsafe { &mut *conf.cast::<LocConf>() };
        if lcf.metrics.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        let texts = match text_args(unsafe { &*cf }) {
            Ok(texts) => texts,
            Err(w) => {
                ngx_conf_log_error!(NGX_LOG_EMERG, cf, "invalid metrics label \"{w}\": not UTF-8");
                return NGX_CONF_ERROR;
            }
        };
        let labels = match LocationLabels::parse(texts) {
            Ok(l) => l,
            Err(e) => {
                ngx_conf_log_error!(NGX_LOG_EMERG, cf, "dynamic_balancer_metrics: {e}");
                return NGX_CONF_ERROR;
            }
        };
        let location = labels.render();
        let loc_hash = label_hash(location.as_bytes());
        // SAFETY: `cf` is the live configuration being parsed.
        let Some(mcf) = Module::main_conf_mut(unsafe { &*cf }) else {
            return NGX_CONF_ERROR;
        };
        mcf.metrics_ctx.declared.push(loc_hash);
        lcf.metrics = Some(Rc::new(LocMetrics {
            primary: series_text("", &location).into_bytes().into(),
            location: location.into(),
            loc_hash,
            cache: RefCell::default(),
        }));
        NGX_CONF_OK
    })
}

pub unsafe extern "C" fn merge_loc_conf(cf: *mut ngx_conf_t, prev: *mut c_void, conf: *mut c_void) -> *mut c_char {
    ffi_guard("merge location conf", NGX_CONF_ERROR, || {
        // SAFETY: `prev` is the enclosing block's `LocConf` from
        // create_loc_conf, only read here.
        let parent = unsafe { &*prev.cast::<LocConf>() };
        // SAFETY: `conf` is this block's `LocConf`, a different allocation
        // from `prev`; configuration runs on one thread.
        let acf = unsafe { &mut *conf.cast::<LocConf>() };
        if acf.backend.is_none() {
            acf.backend = parent.backend;
        }
        if acf.token.is_none() {
            acf.token.clone_from(&parent.token);
        }
        if acf.metrics.is_none() {
            acf.metrics.clone_from(&parent.metrics);
        }
        if acf.https_redirect.is_none() {
            acf.https_redirect = parent.https_redirect;
        }
        if acf.forwarded_headers.is_none() {
            acf.forwarded_headers = parent.forwarded_headers;
        }
        if acf.request_id_header.is_none() {
            acf.request_id_header = parent.request_id_header;
        }
        if acf.otel.is_none() {
            acf.otel = parent.otel;
        }
        if acf.otel_trust.is_none() {
            acf.otel_trust = parent.otel_trust;
        }
        if acf.otel_operation_name.is_none() {
            acf.otel_operation_name = parent.otel_operation_name;
        }
        if acf.enabled && acf.token.is_none() {
            // During a merge cf->ctx->srv_conf is the merged server's.
            // SAFETY: `cf` is the live configuration, and in the http module
            // its `ctx` is an `ngx_http_conf_ctx_t`.
            let ctx = unsafe { (*cf).ctx.cast::<ngx_http_conf_ctx_t>() };
            // SAFETY: the server's `srv_conf` has an entry per HTTP module;
            // ours is null or the `UpstreamConf` from create_srv_conf, which
            // nothing else borrows during the merge.
            let server = unsafe {
                (*(*ctx).srv_conf.add(crate::nginx::module::http_ctx_index()))
                    .cast::<UpstreamConf>()
                    .as_mut()
            };
            if let Some(server) = server {
                server.open_api = true;
            }
        }
        if acf.enabled {
            // During a merge cf->ctx is the merged location's, and the core
            // module (merged first) already holds its final values.
            // SAFETY: `cf` is live and its `ctx` is an http conf context, whose
            // loc conf slot for the core module is an ngx_http_core_loc_conf_t.
            let Some(mut clcf) = (unsafe {
                (*cf).http_location_conf_unchecked::<ngx_http_core_loc_conf_t>(NgxHttpCoreModule::module())
            }) else {
                return NGX_CONF_ERROR;
            };
            // SAFETY: a live core loc conf that nothing else borrows during
            // the merge.
            let clcf = unsafe { clcf.as_mut() };
            if clcf.client_max_body_size != 0 {
                acf.max_body = clcf.client_max_body_size;
                clcf.client_max_body_size = 0;
            }
        }
        NGX_CONF_OK
    })
}
