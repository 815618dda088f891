//! The tracing directives: `dynamic_balancer_otel_exporter` and
//! `dynamic_balancer_otel_sampler` in `http{}`, `dynamic_balancer_otel`
//! and `dynamic_balancer_otel_operation_name` anywhere (the trust flag is
//! a plain on/off, see `set_loc_flag`).

use std::ffi::{c_char, c_void};
use std::ptr;

use lua_compat::otel::sampler::{Root, Sampler};
use lua_compat::otel::settings::ExporterSettings;
use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_compile_complex_value, ngx_http_compile_complex_value_t,
    ngx_http_complex_value_t, ngx_palloc, NGX_LOG_EMERG, NGX_OK,
};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_conf_log_error;

use crate::conf::{LocConf, MainConf};
use crate::nginx::directive::{args, text_args};
use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;

fn fail(cf: &ngx_conf_t, what: &str, why: &str) -> *mut c_char {
    let cf = ptr::from_ref(cf).cast_mut();
    ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{what}: {why}");
    NGX_CONF_ERROR
}

/// `dynamic_balancer_otel_exporter host:port [service_name=] [queue=]
/// [batch=] [delay=] [timeout=];` in `http{}`: each worker exports the
/// spans of traced locations there. nginx calls it while parsing, with the
/// live configuration and our `MainConf` as `conf`.
pub unsafe extern "C" fn set_otel_exporter(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    ffi_guard("dynamic_balancer_otel_exporter", NGX_CONF_ERROR, || {
        // SAFETY: `cf` is the live configuration nginx passed in.
        let cf = unsafe { &*cf };
        // SAFETY: `conf` is our `MainConf`; configuration runs on one thread.
        let mcf = unsafe { &mut *conf.cast::<MainConf>() };
        if mcf.otel_exporter.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        let Ok(words) = text_args(cf) else {
            return fail(cf, "dynamic_balancer_otel_exporter", "arguments must be UTF-8");
        };
        match ExporterSettings::parse(&words) {
            Ok(s) => {
                mcf.otel_exporter = Some(s);
                NGX_CONF_OK
            }
            Err(e) => fail(cf, "dynamic_balancer_otel_exporter", &e),
        }
    })
}

/// `dynamic_balancer_otel_sampler always_on | always_off | ratio=R
/// [parent_based];` in `http{}`. Without it: parent-based, always on (the
/// OpenTelemetry SDK's default). nginx calls it while parsing, with the
/// live configuration and our `MainConf` as `conf`.
pub unsafe extern "C" fn set_otel_sampler(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    ffi_guard("dynamic_balancer_otel_sampler", NGX_CONF_ERROR, || {
        // SAFETY: `cf` is the live configuration nginx passed in.
        let cf = unsafe { &*cf };
        // SAFETY: `conf` is our `MainConf`; configuration runs on one thread.
        let mcf = unsafe { &mut *conf.cast::<MainConf>() };
        if mcf.otel_sampler.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        let Ok(words) = text_args(cf) else {
            return fail(cf, "dynamic_balancer_otel_sampler", "arguments must be UTF-8");
        };
        let root = match words[0] {
            "always_on" => Root::AlwaysOn,
            "always_off" => Root::AlwaysOff,
            w => match w.strip_prefix("ratio=").map(str::parse::<f64>) {
                Some(Ok(r)) if (0.0..=1.0).contains(&r) => Root::Ratio(r),
                _ => {
                    return fail(
                        cf,
                        "dynamic_balancer_otel_sampler",
                        &format!("\"{w}\": always_on, always_off or ratio=R (0 to 1) is expected"),
                    )
                }
            },
        };
        let parent_based = match words.get(1).copied() {
            None => false,
            Some("parent_based") => true,
            Some(w) => {
                return fail(
                    cf,
                    "dynamic_balancer_otel_sampler",
                    &format!("\"{w}\": only \"parent_based\" may follow"),
                )
            }
        };
        mcf.otel_sampler = Some(Sampler::new(root, parent_based));
        NGX_CONF_OK
    })
}

/// `dynamic_balancer_otel on | off;`: trace the requests of this block.
/// nginx calls it while parsing, with the live configuration and our
/// `LocConf` as `conf`.
pub unsafe extern "C" fn set_otel(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("dynamic_balancer_otel", NGX_CONF_ERROR, || {
        // SAFETY: `cf` is the live configuration nginx passed in.
        let cf = unsafe { &*cf };
        // SAFETY: `conf` is our `LocConf`; configuration runs on one thread.
        let lcf = unsafe { &mut *conf.cast::<LocConf>() };
        if lcf.otel.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        let on = match args(cf)[1].as_bytes() {
            b"on" => true,
            b"off" => false,
            _ => return fail(cf, "dynamic_balancer_otel", "\"on\" or \"off\" is expected"),
        };
        lcf.otel = Some(on);
        if on {
            if let Some(mcf) = Module::main_conf_mut(cf) {
                mcf.otel_used = true;
            }
        }
        NGX_CONF_OK
    })
}

/// `dynamic_balancer_otel_operation_name text;`: the span's name, with
/// variables (ingress-nginx's `opentelemetry-operation-name`, such as
/// `HTTP $request_method $service_name $uri`). Without it a span is named
/// after its location, as otel_ngx_module names it. nginx calls it while
/// parsing, with the live configuration and our `LocConf` as `conf`.
pub unsafe extern "C" fn set_otel_operation_name(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    ffi_guard("dynamic_balancer_otel_operation_name", NGX_CONF_ERROR, || {
        // SAFETY: `conf` is our `LocConf`; configuration runs on one thread.
        let lcf = unsafe { &mut *conf.cast::<LocConf>() };
        if lcf.otel_operation_name.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration; its pool outlives every
        // request of this configuration.
        let cv =
            unsafe { ngx_palloc((*cf).pool, size_of::<ngx_http_complex_value_t>()) }.cast::<ngx_http_complex_value_t>();
        if cv.is_null() {
            return NGX_CONF_ERROR;
        }
        // SAFETY: `cf` is live; its args hold the directive's words in its
        // pool. A zeroed compile struct is nginx's own starting point
        // (ngx_memzero), and the call fills `cv`.
        let rc = unsafe {
            let value = (*(*cf).args).elts.cast::<ngx::ffi::ngx_str_t>().add(1);
            let mut ccv: ngx_http_compile_complex_value_t = std::mem::zeroed();
            ccv.cf = cf;
            ccv.value = value;
            ccv.complex_value = cv;
            ngx_http_compile_complex_value(&mut ccv)
        };
        if rc != NGX_OK as isize {
            return NGX_CONF_ERROR;
        }
        lcf.otel_operation_name = std::ptr::NonNull::new(cv);
        NGX_CONF_OK
    })
}
