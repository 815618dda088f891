//! The directives' setters, in the order of `lib.rs`'s command table:
//! `dynamic_balancer_zone`, `dynamic_balancer`, `dynamic_balancer_api`,
//! `dynamic_balancer_api_token`, `dynamic_balancer_api_token_file` and
//! `dynamic_balancer_backend`; then the checks and merges nginx runs after
//! parsing, and the declaration of the module's variables. They fill the
//! structs of [`crate::conf`].

use std::ffi::{c_char, c_void, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::ptr;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_array_push, ngx_command_t, ngx_conf_full_name, ngx_conf_t, ngx_http_add_variable, ngx_http_conf_addr_t,
    ngx_http_conf_ctx_t, ngx_http_conf_port_t, ngx_http_core_loc_conf_t, ngx_http_core_srv_conf_t,
    ngx_http_get_variable_index, ngx_http_request_t, ngx_http_upstream_server_t, ngx_http_upstream_srv_conf_t,
    ngx_http_variable_value_t, ngx_int_t, ngx_parse_size, ngx_shared_memory_add, ngx_str_t, ngx_uint_t, sockaddr,
    NGX_ERROR, NGX_HTTP_VAR_CHANGEABLE, NGX_HTTP_VAR_NOCACHEABLE, NGX_HTTP_VAR_NOHASH, NGX_LOG_EMERG, NGX_OK,
};
use ngx::http::{
    HttpModule, HttpModuleConfExt, HttpModuleLocationConf, HttpModuleMainConf, HttpModuleServerConf, NgxHttpCoreModule,
    NgxHttpUpstreamModule,
};
use ngx::ngx_conf_log_error;

use std::cell::RefCell;
use std::rc::Rc;

use lua_compat::https_redirect::Rule;
use lua_compat::metrics::labels::{label_hash, series_text};
use lua_compat::metrics::LocationLabels;

use crate::conf::{srv_conf_mut, LocConf, LocMetrics, MainConf, UpstreamConf};
use crate::guard::ffi_guard;
use crate::metrics_zone::init_zone as init_metrics_zone;
use crate::variables::{self, Own};
use crate::zone::init_zone;
use crate::Module;

/// Default zone size, as ingress-nginx's `configuration_data` dict is 20m and
/// our blobs carry a second, compact copy.
const DEFAULT_ZONE_SIZE: usize = 32 * 1024 * 1024;
/// Below this the slab allocator has too few pages to be useful.
const MIN_ZONE_SIZE: usize = 64 * 1024;
const ZONE_NAME: &str = "dynamic_balancer";
const METRICS_ZONE_NAME: &str = "dynamic_balancer_metrics";
/// Room for about 4,000 series of 2 workers × 3 method/status pairs.
const DEFAULT_METRICS_ZONE_SIZE: usize = 16 * 1024 * 1024;
/// The metrics zone's header (registrations and hash buckets) is about 96k.
const MIN_METRICS_ZONE_SIZE: usize = 256 * 1024;
const DEFAULT_VARIABLE: &str = "proxy_upstream_name";

fn args(cf: &ngx_conf_t) -> &[ngx_str_t] {
    // SAFETY: nginx sets cf->args to the directive's words while calling `set`.
    unsafe { (*cf.args).as_slice() }
}

/// The directive's arguments (after its name) as text, or the first one
/// that is not UTF-8.
fn text_args(cf: &ngx_conf_t) -> Result<Vec<&str>, ngx_str_t> {
    args(cf)[1..]
        .iter()
        .map(|w| std::str::from_utf8(w.as_bytes()).map_err(|_| *w))
        .collect()
}

/// `dynamic_balancer_zone size;` in `http{}`. nginx calls it while parsing,
/// with the live configuration and our `MainConf` as `conf`.
pub unsafe extern "C" fn set_zone(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("dynamic_balancer_zone", NGX_CONF_ERROR, || {
        // SAFETY: for an NGX_HTTP_MAIN_CONF_OFFSET directive, `conf` is our
        // `MainConf` from create_main_conf; configuration runs on one thread.
        let mcf = unsafe { &mut *conf.cast::<MainConf>() };
        if !mcf.shm_zone.is_null() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        let mut value = args(unsafe { &*cf })[1];
        // SAFETY: `value` is a directive argument: `len` valid bytes.
        let size = unsafe { ngx_parse_size(&mut value) };
        if size == NGX_ERROR as isize || (size as usize) < MIN_ZONE_SIZE {
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "invalid zone size \"{value}\": at least 64k is required"
            );
            return NGX_CONF_ERROR;
        }
        // SAFETY: `cf` is the live configuration being parsed.
        unsafe { add_zone(cf, mcf, size as usize) }
    })
}

/// Adds the module's shared zone of `size` bytes and records it in `mcf`.
///
/// # Safety
/// `cf` is the live configuration being parsed (or just parsed), on nginx's
/// configuration thread.
unsafe fn add_zone(cf: *mut ngx_conf_t, mcf: &mut MainConf, size: usize) -> *mut c_char {
    // SAFETY: `cf` is live (this function's contract); its pool outlives the
    // configuration, which keeps the name.
    let mut name = unsafe { ngx_str_t::from_str((*cf).pool, ZONE_NAME) };
    // SAFETY: `cf` is live; the tag is our module, a static that nginx only
    // compares.
    let zone = unsafe {
        ngx_shared_memory_add(
            cf,
            &mut name,
            size,
            ptr::addr_of_mut!(crate::ngx_http_dynamic_balancer_module).cast(),
        )
    };
    if zone.is_null() {
        return NGX_CONF_ERROR;
    }
    // SAFETY: a non-null result is the cycle's live zone entry, in the
    // cycle's pool; configuration runs on one thread.
    let zone_ref = unsafe { &mut *zone };
    if zone_ref.data.is_null() {
        zone_ref.init = Some(init_zone);
        // A marker until init_zone stores the header pointer.
        zone_ref.data = ptr::from_mut(mcf).cast();
    }
    mcf.shm_zone = zone;
    NGX_CONF_OK
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
            if unsafe { add_metrics_zone(cf, mcf, DEFAULT_METRICS_ZONE_SIZE) } != NGX_CONF_OK {
                return NGX_CONF_ERROR;
            }
        }
        if mcf.used && mcf.shm_zone.is_null() {
            // SAFETY: `cf` is the live configuration nginx passed in.
            return unsafe { add_zone(cf, mcf, DEFAULT_ZONE_SIZE) };
        }
        NGX_CONF_OK
    })
}

fn mark_used(cf: &ngx_conf_t) {
    if let Some(mcf) = Module::main_conf_mut(cf) {
        mcf.used = true;
    }
}

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
        // SAFETY: `us` is live and nginx does not use it during the call.
        unsafe { (*us).peer.init = Some(crate::peer::init_peer) };
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

/// `dynamic_balancer_api;` in `location{}`. nginx calls it while parsing,
/// with the live configuration and our `LocConf` as `conf`.
pub unsafe extern "C" fn set_api(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("dynamic_balancer_api", NGX_CONF_ERROR, || {
        // SAFETY: for an NGX_HTTP_LOC_CONF_OFFSET directive, `conf` is our
        // `LocConf` from create_loc_conf; configuration runs on one thread.
        let acf = unsafe { &mut *conf.cast::<LocConf>() };
        if acf.enabled {
            return c"is duplicate".as_ptr().cast_mut();
        }
        acf.enabled = true;
        // SAFETY: `cf` is the live configuration being parsed.
        let cf_ref = unsafe { &*cf };
        let clcf = NgxHttpCoreModule::location_conf_mut(cf_ref).expect("core location conf");
        clcf.handler = Some(crate::api_handler::api_handler);
        mark_used(cf_ref);
        NGX_CONF_OK
    })
}

/// `dynamic_balancer_backend name;` in `http`, `server` or `location`.
/// nginx calls it while parsing, with the live configuration and our
/// `LocConf` as `conf`.
pub unsafe extern "C" fn set_backend(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("dynamic_balancer_backend", NGX_CONF_ERROR, || {
        // SAFETY: `conf` is our `LocConf` from create_loc_conf;
        // configuration runs on one thread.
        let lcf = unsafe { &mut *conf.cast::<LocConf>() };
        if lcf.backend.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        let name = args(unsafe { &*cf })[1];
        if name.is_empty() || name.as_bytes().contains(&b'$') {
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "invalid backend name \"{name}\": a literal name is expected"
            );
            return NGX_CONF_ERROR;
        }
        lcf.backend = Some(name);
        NGX_CONF_OK
    })
}

/// `dynamic_balancer_state path;` in `http{}`: keep the backends in this
/// file (see [`crate::state_file`]). A relative path is taken from the
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
        let mut name = args(unsafe { &*cf })[1];
        // SAFETY: `cf->cycle` is the cycle being configured; `name` is a
        // directive argument, replaced by a pool copy on success.
        if unsafe { ngx_conf_full_name((*cf).cycle, &mut name, 0) } != NGX_OK as ngx_int_t {
            return NGX_CONF_ERROR;
        }
        let path = PathBuf::from(OsStr::from_bytes(name.as_bytes()));
        if let Err(e) = lua_compat::state_file::check_location(&path) {
            ngx_conf_log_error!(NGX_LOG_EMERG, cf, "dynamic_balancer_state: {e}");
            return NGX_CONF_ERROR;
        }
        mcf.state_file = Some(path);
        NGX_CONF_OK
    })
}

/// An `on | off` directive of a `LocConf` `Option<bool>` field, as nginx's
/// `ngx_conf_set_flag_slot` does it for `ngx_flag_t`: the command's `offset`
/// (`offset_of!(LocConf, field)`) says which field. Used by
/// `dynamic_balancer_forwarded_headers` (`X-Forwarded-*` believed by
/// `$dynamic_pass_*` and the HTTPS redirect) and
/// `dynamic_balancer_request_id` (see [`crate::request_id::ensure_header`]).
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
/// are redirected to HTTPS (see [`crate::https_redirect`]). nginx calls it
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

/// `dynamic_balancer_metrics_zone size;` in `http{}`: the shared zone that
/// holds request counters. nginx calls it while parsing, with the live
/// configuration and our `MainConf` as `conf`.
pub unsafe extern "C" fn set_metrics_zone(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    ffi_guard("dynamic_balancer_metrics_zone", NGX_CONF_ERROR, || {
        // SAFETY: for an NGX_HTTP_MAIN_CONF_OFFSET directive, `conf` is our
        // `MainConf` from create_main_conf; configuration runs on one thread.
        let mcf = unsafe { &mut *conf.cast::<MainConf>() };
        if !mcf.metrics_zone.is_null() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        let mut value = args(unsafe { &*cf })[1];
        // SAFETY: `value` is a directive argument: `len` valid bytes.
        let size = unsafe { ngx_parse_size(&mut value) };
        if size == NGX_ERROR as isize || (size as usize) < MIN_METRICS_ZONE_SIZE {
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "invalid metrics zone size \"{value}\": at least 256k is required"
            );
            return NGX_CONF_ERROR;
        }
        // SAFETY: `cf` is the live configuration being parsed.
        unsafe { add_metrics_zone(cf, mcf, size as usize) }
    })
}

/// Adds the metrics zone of `size` bytes and records it in `mcf`.
///
/// # Safety
/// `cf` is the live configuration being parsed (or just parsed), on nginx's
/// configuration thread; `mcf` is its main conf, in its pool.
unsafe fn add_metrics_zone(cf: *mut ngx_conf_t, mcf: &mut MainConf, size: usize) -> *mut c_char {
    // SAFETY: `cf` is live (this function's contract); its pool outlives the
    // configuration, which keeps the name.
    let mut name = unsafe { ngx_str_t::from_str((*cf).pool, METRICS_ZONE_NAME) };
    // SAFETY: `cf` is live; the tag is our module, a static nginx only compares.
    let zone = unsafe {
        ngx_shared_memory_add(
            cf,
            &mut name,
            size,
            ptr::addr_of_mut!(crate::ngx_http_dynamic_balancer_module).cast(),
        )
    };
    if zone.is_null() {
        return NGX_CONF_ERROR;
    }
    // SAFETY: a non-null result is the cycle's live zone entry.
    let zone_ref = unsafe { &mut *zone };
    zone_ref.init = Some(init_metrics_zone);
    // The configuration's declared labels, read by the zone's init; the main
    // conf lives in the configuration pool for the cycle's life.
    zone_ref.data = ptr::from_mut(&mut mcf.metrics_ctx).cast();
    mcf.metrics_zone = zone;
    NGX_CONF_OK
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

/// `dynamic_balancer_api_token token;` in `http`, `server` or `location`.
/// nginx calls it while parsing, with the live configuration and our
/// `LocConf` as `conf`.
pub unsafe extern "C" fn set_token(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("dynamic_balancer_api_token", NGX_CONF_ERROR, || {
        // SAFETY: `conf` is our `LocConf` from create_loc_conf;
        // configuration runs on one thread.
        let lcf = unsafe { &mut *conf.cast::<LocConf>() };
        if lcf.token.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        let token = args(unsafe { &*cf })[1];
        // SAFETY: `cf` is the live configuration being parsed.
        unsafe { store_token(cf, lcf, token.as_bytes()) }
    })
}

/// `dynamic_balancer_api_token_file path;`: the token is the file's first
/// line, read when the configuration is loaded (so `nginx -s reload` picks
/// up a new token). A relative path is taken from the configuration prefix.
/// nginx calls it while parsing, with the live configuration and our
/// `LocConf` as `conf`.
pub unsafe extern "C" fn set_token_file(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    ffi_guard("dynamic_balancer_api_token_file", NGX_CONF_ERROR, || {
        // SAFETY: `conf` is our `LocConf` from create_loc_conf;
        // configuration runs on one thread.
        let lcf = unsafe { &mut *conf.cast::<LocConf>() };
        if lcf.token.is_some() {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        let mut name = args(unsafe { &*cf })[1];
        // SAFETY: `cf->cycle` is the cycle being configured; `name` is a
        // directive argument, replaced by a pool copy on success.
        if unsafe { ngx_conf_full_name((*cf).cycle, &mut name, 1) } != NGX_OK as ngx_int_t {
            return NGX_CONF_ERROR;
        }
        let path = String::from_utf8_lossy(name.as_bytes()).into_owned();
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) => {
                ngx_conf_log_error!(NGX_LOG_EMERG, cf, "cannot read the API token file \"{path}\": {e}");
                return NGX_CONF_ERROR;
            }
        };
        let first = text.split(|b| *b == b'\n').next().unwrap_or_default();
        // SAFETY: `cf` is the live configuration being parsed.
        unsafe { store_token(cf, lcf, first.strip_suffix(b"\r").unwrap_or(first)) }
    })
}

/// Checks `token` and keeps a copy in `lcf`.
///
/// # Safety
/// `cf` is the live configuration being parsed (errors are logged to it).
unsafe fn store_token(cf: *mut ngx_conf_t, lcf: &mut LocConf, token: &[u8]) -> *mut c_char {
    if let Err(e) = lua_compat::api::check_token(token) {
        // The token itself is never logged.
        ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{e}");
        return NGX_CONF_ERROR;
    }
    lcf.token = Some(token.into());
    NGX_CONF_OK
}

/// Refuses an API that is open (no token) on an address other than
/// loopback or a unix: socket: whoever can connect there could rewrite
/// every backend. Runs at postconfiguration, when the listen addresses of
/// every server are known.
///
/// # Safety
/// `cf` is the live, parsed configuration, at postconfiguration.
pub unsafe fn check_api_listeners(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: `cf` is live (this function's contract); the borrow ends with
    // the lookup.
    let Some(cmcf) = NgxHttpCoreModule::main_conf(unsafe { &*cf }) else {
        return NGX_OK as ngx_int_t;
    };
    // SAFETY: the core module's `ports` is null or its live array of ports.
    let Some(ports) = (unsafe { cmcf.ports.as_ref() }) else {
        return NGX_OK as ngx_int_t;
    };
    // SAFETY: `ports` holds `ngx_http_conf_port_t`s (ngx_http_add_listen).
    let ports: &[ngx_http_conf_port_t] = unsafe { ports.as_slice() };
    for port in ports {
        // SAFETY: a port's `addrs` holds its `ngx_http_conf_addr_t`s.
        let addrs: &[ngx_http_conf_addr_t] = unsafe { port.addrs.as_slice() };
        for addr in addrs {
            // SAFETY: `opt.sockaddr` is null or the listen address, in the
            // configuration pool.
            if unsafe { is_local_listener(addr.opt.sockaddr) } {
                continue;
            }
            // SAFETY: an address's `servers` holds core srv conf pointers.
            let servers: &[*mut ngx_http_core_srv_conf_t] = unsafe { addr.servers.as_slice() };
            for &cscf in servers {
                // SAFETY: each entry is a live core srv conf, whose `ctx` is
                // its server's conf context.
                let ctx = unsafe { (*cscf).ctx };
                // SAFETY: a server's `srv_conf` has an entry per HTTP module;
                // ours is null or the `UpstreamConf` from create_srv_conf.
                let conf = unsafe { (*(*ctx).srv_conf.add(crate::module_ctx_index())).cast::<UpstreamConf>() };
                // SAFETY: as above; configuration runs on one thread.
                if unsafe { conf.as_ref() }.is_some_and(|c| c.open_api) {
                    let listen = addr.opt.addr_text;
                    ngx_conf_log_error!(
                        NGX_LOG_EMERG,
                        cf,
                        "\"dynamic_balancer_api\" without a token is reachable on {listen}, which is not a loopback or unix: address; set \"dynamic_balancer_api_token\" or \"dynamic_balancer_api_token_file\""
                    );
                    return NGX_ERROR as ngx_int_t;
                }
            }
        }
    }
    NGX_OK as ngx_int_t
}

/// Loopback (IPv4 `127/8`, IPv6 `::1` or v4-mapped loopback) or unix:.
///
/// # Safety
/// `sa` is null or a live socket address as long as its family requires
/// (`sockaddr_in` for AF_INET, `sockaddr_in6` for AF_INET6).
unsafe fn is_local_listener(sa: *const sockaddr) -> bool {
    // SAFETY: `sa` is null or live (this function's contract).
    let Some(sa) = (unsafe { sa.as_ref() }) else {
        return false;
    };
    match i32::from(sa.sa_family) {
        libc::AF_UNIX => true,
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a whole `sockaddr_in` (this
            // function's contract), and nginx allocates it suitably aligned.
            let sin = unsafe { &*(sa as *const sockaddr).cast::<libc::sockaddr_in>() };
            u32::from_be(sin.sin_addr.s_addr) >> 24 == 127
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a whole `sockaddr_in6` (this
            // function's contract), and nginx allocates it suitably aligned.
            let sin6 = unsafe { &*(sa as *const sockaddr).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        _ => false,
    }
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
        if acf.enabled && acf.token.is_none() {
            // During a merge cf->ctx->srv_conf is the merged server's.
            // SAFETY: `cf` is the live configuration, and in the http module
            // its `ctx` is an `ngx_http_conf_ctx_t`.
            let ctx = unsafe { (*cf).ctx.cast::<ngx_http_conf_ctx_t>() };
            // SAFETY: the server's `srv_conf` has an entry per HTTP module;
            // ours is null or the `UpstreamConf` from create_srv_conf, which
            // nothing else borrows during the merge.
            let server = unsafe {
                (*(*ctx).srv_conf.add(crate::module_ctx_index()))
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
        let (flags, handler): (u32, ngx::ffi::ngx_http_get_variable_pt) = if i == Own::MetricsLocation as usize {
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
            crate::log_variables::upstream_name_variable as GetHandler,
        ),
        ("req_id", crate::log_variables::req_id_variable),
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
    unsafe { (*v).get_handler = Some(crate::peer::ewma_score_variable) };
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
    unsafe { (*v).get_handler = Some(crate::request_id::variable) };
    // The WebSocket headers, from the parsed Upgrade header.
    for (name, handler) in [
        (
            "dynamic_upgrade",
            crate::connection_upgrade::upgrade_variable as GetHandler,
        ),
        (
            "dynamic_connection_upgrade",
            crate::connection_upgrade::connection_variable,
        ),
        // ingress-nginx's $pass_access_scheme and $pass_server_port.
        ("dynamic_pass_access_scheme", crate::forwarded::scheme_variable),
        ("dynamic_pass_server_port", crate::forwarded::port_variable),
        // ingress-nginx's set-misc `$escaped_request_uri` (auth-signin).
        ("escaped_request_uri", crate::escaped_uri::variable),
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
