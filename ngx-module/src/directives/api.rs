//! `dynamic_balancer_api` and its tokens (`dynamic_balancer_api_token`,
//! `dynamic_balancer_api_token_file`), and the check that the API listens
//! only where it should.

use std::ffi::{c_char, c_void};

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_conf_addr_t, ngx_http_conf_port_t, ngx_http_core_srv_conf_t, ngx_int_t,
    sockaddr, NGX_ERROR, NGX_LOG_EMERG, NGX_OK,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::ngx_conf_log_error;

use super::zones::mark_used;
use crate::conf::{LocConf, UpstreamConf};
use crate::nginx::directive::args;
use crate::nginx::directive::path_arg;
use crate::nginx::guard::ffi_guard;

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
        clcf.handler = Some(crate::api::handler::api_handler);
        mark_used(cf_ref);
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
        let Some(path) = (unsafe { path_arg(cf, true) }) else {
            return NGX_CONF_ERROR;
        };
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) => {
                ngx_conf_log_error!(
                    NGX_LOG_EMERG,
                    cf,
                    "cannot read the API token file \"{}\": {e}",
                    path.display()
                );
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
                let conf =
                    unsafe { (*(*ctx).srv_conf.add(crate::nginx::module::http_ctx_index())).cast::<UpstreamConf>() };
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
