//! The module's shared zones and the file that outlives them:
//! `dynamic_balancer_zone`, `dynamic_balancer_metrics_zone` (each added at
//! its default size by `init_main_conf` when it is needed but not written)
//! and `dynamic_balancer_state`.

use std::ffi::{c_char, c_void};
use std::ptr;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_parse_size, ngx_shared_memory_add, ngx_shm_zone_t, ngx_str_t, NGX_ERROR,
    NGX_LOG_EMERG,
};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_conf_log_error;

use crate::conf::MainConf;
use crate::nginx::directive::{args, path_arg};
use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;
use crate::shm::metrics_zone::init_zone as init_metrics_zone;
use crate::shm::zone::init_zone;

/// Default zone size, as ingress-nginx's `configuration_data` dict is 20m and
/// our blobs carry a second, compact copy.
const DEFAULT_ZONE_SIZE: usize = 32 * 1024 * 1024;
/// Below this the zone's header, locks and first slots of the endpoint
/// table (about 90 KB) leave no room for backends.
const MIN_ZONE_SIZE: usize = 128 * 1024;
const ZONE_NAME: &str = "dynamic_balancer";
const METRICS_ZONE_NAME: &str = "dynamic_balancer_metrics";
/// Room for about 4,000 series of 2 workers × 3 method/status pairs.
const DEFAULT_METRICS_ZONE_SIZE: usize = 16 * 1024 * 1024;
/// The metrics zone's header (registrations and hash buckets) is about 96k.
const MIN_METRICS_ZONE_SIZE: usize = 256 * 1024;

/// The module's two shared zones, which differ in their name, size limits
/// and what their `init` is handed; sized, added and checked the same way.
#[derive(Clone, Copy)]
enum SharedZone {
    /// `dynamic_balancer_zone`: the backends and certificates.
    Backends,
    /// `dynamic_balancer_metrics_zone`: the request counters.
    Metrics,
}

impl SharedZone {
    fn directive(self) -> &'static str {
        match self {
            Self::Backends => "dynamic_balancer_zone",
            Self::Metrics => "dynamic_balancer_metrics_zone",
        }
    }

    /// What an error calls it.
    fn what(self) -> &'static str {
        match self {
            Self::Backends => "zone",
            Self::Metrics => "metrics zone",
        }
    }

    fn min_size(self) -> usize {
        match self {
            Self::Backends => MIN_ZONE_SIZE,
            Self::Metrics => MIN_METRICS_ZONE_SIZE,
        }
    }

    fn is_added(self, mcf: &MainConf) -> bool {
        match self {
            Self::Backends => !mcf.shm_zone.is_null(),
            Self::Metrics => !mcf.metrics_zone.is_null(),
        }
    }

    /// Adds the zone of `size` bytes and records it in `mcf`.
    ///
    /// # Safety
    /// `cf` is the live configuration being parsed (or just parsed), on
    /// nginx's configuration thread; `mcf` is its main conf, in its pool.
    unsafe fn add(self, cf: *mut ngx_conf_t, mcf: &mut MainConf, size: usize) -> *mut c_char {
        let name = match self {
            Self::Backends => ZONE_NAME,
            Self::Metrics => METRICS_ZONE_NAME,
        };
        // SAFETY: `cf` is live (this function's contract).
        let Some(zone) = (unsafe { shared_zone(cf, name, size) }) else {
            return NGX_CONF_ERROR;
        };
        match self {
            Self::Backends => {
                if zone.data.is_null() {
                    zone.init = Some(init_zone);
                    // A marker until init_zone stores the header pointer.
                    zone.data = ptr::from_mut(mcf).cast();
                }
                mcf.shm_zone = zone;
            }
            Self::Metrics => {
                zone.init = Some(init_metrics_zone);
                // The configuration's declared labels, read by the zone's
                // init; the main conf lives in the configuration pool for
                // the cycle's life.
                zone.data = ptr::from_mut(&mut mcf.metrics_ctx).cast();
                mcf.metrics_zone = zone;
            }
        }
        NGX_CONF_OK
    }

    /// The setter of the zone's size directive.
    ///
    /// # Safety
    /// nginx calls the directive's `set` with the live configuration and,
    /// for an NGX_HTTP_MAIN_CONF_OFFSET directive, our `MainConf` as `conf`.
    unsafe fn set_size(self, cf: *mut ngx_conf_t, conf: *mut c_void) -> *mut c_char {
        ffi_guard(self.directive(), NGX_CONF_ERROR, || {
            // SAFETY: `conf` is our `MainConf` from create_main_conf (this
            // function's contract); configuration runs on one thread.
            let mcf = unsafe { &mut *conf.cast::<MainConf>() };
            if self.is_added(mcf) {
                return c"is duplicate".as_ptr().cast_mut();
            }
            // SAFETY: `cf` is the live configuration being parsed.
            let Some(size) = (unsafe { zone_size(cf, self.what(), self.min_size()) }) else {
                return NGX_CONF_ERROR;
            };
            // SAFETY: `cf` is the live configuration being parsed.
            unsafe { self.add(cf, mcf, size) }
        })
    }
}

/// `dynamic_balancer_zone size;` in `http{}`. nginx calls it while parsing,
/// with the live configuration and our `MainConf` as `conf`.
pub unsafe extern "C" fn set_zone(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: as nginx calls a main-conf directive's setter (see above).
    unsafe { SharedZone::Backends.set_size(cf, conf) }
}

/// `dynamic_balancer_metrics_zone size;` in `http{}`: the shared zone that
/// holds request counters. nginx calls it while parsing, with the live
/// configuration and our `MainConf` as `conf`.
pub unsafe extern "C" fn set_metrics_zone(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: as nginx calls a main-conf directive's setter (see above).
    unsafe { SharedZone::Metrics.set_size(cf, conf) }
}

/// `init_main_conf`: adds the default zone when the module is used without
/// `dynamic_balancer_zone`. nginx calls it after the `http{}` block was
/// parsed, with the live configuration and our `MainConf` as `conf`.
pub unsafe extern "C" fn init_main_conf(cf: *mut ngx_conf_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("init main conf", NGX_CONF_ERROR, || {
        // SAFETY: `conf` is our `MainConf` from create_main_conf;
        // configuration runs on one thread.
        let mcf = unsafe { &mut *conf.cast::<MainConf>() };
        if !mcf.metrics_ctx.declared.is_empty() && mcf.metrics_zone.is_null() {
            // SAFETY: `cf` is the live configuration nginx passed in.
            if unsafe { SharedZone::Metrics.add(cf, mcf, DEFAULT_METRICS_ZONE_SIZE) } != NGX_CONF_OK {
                return NGX_CONF_ERROR;
            }
        }
        if mcf.used && mcf.shm_zone.is_null() {
            // SAFETY: `cf` is the live configuration nginx passed in.
            return unsafe { SharedZone::Backends.add(cf, mcf, DEFAULT_ZONE_SIZE) };
        }
        NGX_CONF_OK
    })
}

/// Records that the configuration uses the module, so that
/// `init_main_conf` adds the backends' zone at its default size when no
/// `dynamic_balancer_zone` sized it.
pub(super) fn mark_used(cf: &ngx_conf_t) {
    if let Some(mcf) = Module::main_conf_mut(cf) {
        mcf.used = true;
    }
}

/// `dynamic_balancer_state path;` in `http{}`: keep the backends in this
/// file (see [`crate::shm::state_file`]). A relative path is taken from the
/// prefix, as for logs; the directory must exist now, so that `nginx -t`
/// reports a wrong path. nginx calls it while parsing, with the live
/// configuration and our `MainConf` as `conf`.
pub unsafe extern "C" fn set_state_file(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    ffi_guard("dynamic_balancer_state", NGX_CONF_ERROR, || {
        // SAFETY: for an NGX_HTTP_MAIN_CONF_OFFSET directive, `conf` is our
        // `MainConf` from create_main_conf; configuration runs on one thread.
        let mcf = unsafe { &mut *conf.cast::<MainConf>() };
        if mcf.state_file.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        let Some(path) = (unsafe { path_arg(cf, false) }) else {
            return NGX_CONF_ERROR;
        };
        if let Err(e) = lua_compat::state_file::check_location(&path) {
            ngx_conf_log_error!(NGX_LOG_EMERG, cf, "dynamic_balancer_state: {e}");
            return NGX_CONF_ERROR;
        }
        mcf.state_file = Some(path);
        NGX_CONF_OK
    })
}

/// The size argument of a zone directive (`what` names the zone in the
/// error), in bytes; `None` after logging why it is refused: not a size in
/// nginx's syntax (`64k`, `32m`), or below `min`.
///
/// # Safety
/// `cf` is the live configuration, while nginx calls the directive's `set`.
unsafe fn zone_size(cf: *mut ngx_conf_t, what: &str, min: usize) -> Option<usize> {
    // SAFETY: `cf` is live (this function's contract).
    let mut value = args(unsafe { &*cf })[1];
    // SAFETY: `value` is a directive argument: `len` valid bytes.
    let size = unsafe { ngx_parse_size(&mut value) };
    if size == NGX_ERROR as isize || (size as usize) < min {
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "invalid {what} size \"{value}\": at least {}k is required",
            min / 1024
        );
        return None;
    }
    Some(size as usize)
}

/// Adds (or finds, on a second call in the same cycle) the shared zone
/// `name` of `size` bytes, tagged with our module.
///
/// # Safety
/// `cf` is the live configuration being parsed (or just parsed), on nginx's
/// configuration thread.
unsafe fn shared_zone(cf: *mut ngx_conf_t, name: &str, size: usize) -> Option<&'static mut ngx_shm_zone_t> {
    // SAFETY: `cf` is live (this function's contract); its pool outlives the
    // configuration, which keeps the name.
    let mut name = unsafe { ngx_str_t::from_str((*cf).pool, name) };
    // SAFETY: `cf` is live; the tag is our module, a static that nginx only
    // compares.
    let zone = unsafe {
        ngx_shared_memory_add(
            cf,
            &mut name,
            size,
            ptr::addr_of_mut!(crate::nginx::module::ngx_http_dynamic_balancer_module).cast(),
        )
    };
    // SAFETY: a non-null result is the cycle's live zone entry, in the
    // cycle's pool, which outlives every use; configuration runs on one
    // thread, so no other reference to it is live.
    unsafe { zone.as_mut() }
}
