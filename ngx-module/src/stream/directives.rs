//! `ngx_stream_dynamic_balancer_module`, the stream half of the module (the
//! same shared object): `dynamic_balancer` in a `stream{}` `upstream{}`,
//! and `dynamic_balancer_backend` in a `stream{}` `server{}`.
//!
//! ```nginx
//! http   { dynamic_balancer_zone 32m; ... }   # the zone stream routes by
//! stream {
//!     upstream tcp_balancer { dynamic_balancer; }
//!     server {
//!         listen 5432;
//!         dynamic_balancer_backend tcp-db-postgres-5432;
//!         proxy_pass tcp_balancer;
//!     }
//! }
//! ```
//!
//! Syntax: `dynamic_balancer [$variable] [proxy_protocol=off];` — context:
//! `upstream` (stream). Peers come from the `http{}` block's zone, by the
//! name the session's server sets with `dynamic_balancer_backend`, else by
//! `$variable`'s value. `proxy_protocol=off` keeps this upstream's
//! connections from sending the PROXY protocol even where the server has
//! `proxy_protocol on`: nginx has no per-upstream switch, and a server that
//! routes TLS by SNI (`ssl_preread`) sends PROXY to its local HTTPS
//! listener, never to the backends whose TLS passes through.
//!
//! Syntax: `dynamic_balancer_backend name;` — context: `stream`, `server`.
//!
//! Syntax: `dynamic_balancer_routes listener;` — context: `server`
//! (stream). The session's backend is chosen, per connection, by the
//! Gateway API routes (TCPRoute, UDPRoute, TLSRoute) pushed for
//! `listener` in the route table, by the TLS server name
//! (`$ssl_preread_server_name`, with `ssl_preread on`) where the table
//! names hosts; see [`crate::stream::routes`].
//!
//! Syntax: `dynamic_balancer_ssl_routes listener;` — context: `server`
//! (stream), with `listen ... ssl` and a fallback `ssl_certificate`. TLS
//! is terminated with `listener`'s certificates from the route table,
//! chosen per handshake by SNI; see [`crate::stream::tls`].
//!
//! Syntax: `dynamic_balancer_backend_tls listener;` — context: `server`
//! (stream), with `proxy_ssl on`. `listener`'s connections whose backend
//! a BackendTLSPolicy covers take this server's proxy settings and are
//! encrypted per the policy; see [`crate::stream::backend_tls`].

use std::ffi::{c_char, c_void};
use std::mem::offset_of;
use std::ptr;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_addr_t, ngx_array_push, ngx_command_t, ngx_conf_t, ngx_core_module_t, ngx_cycle_t, ngx_int_t, ngx_str_t,
    ngx_stream_conf_ctx_t, ngx_stream_get_variable_index, ngx_stream_module, ngx_stream_module_t,
    ngx_stream_upstream_main_conf_t, ngx_stream_upstream_module, ngx_stream_upstream_server_t,
    ngx_stream_upstream_srv_conf_t, ngx_uint_t, NGX_CONF_NOARGS, NGX_CONF_TAKE1, NGX_CONF_TAKE12, NGX_ERROR,
    NGX_LOG_EMERG, NGX_OK, NGX_STREAM_MAIN_CONF, NGX_STREAM_SRV_CONF, NGX_STREAM_UPS_CONF,
};
use ngx::{ngx_conf_log_error, ngx_log_error, ngx_string};

use crate::conf::UNKNOWN;
use crate::nginx::directive::args;
use crate::nginx::directive::set_literal_once;
use crate::nginx::guard::ffi_guard;
use crate::stream::conf::{http_main_conf, srv_conf_in, StreamSrvConf};

const SRV_CONF_OFFSET: ngx_uint_t = offset_of!(ngx_stream_conf_ctx_t, srv_conf) as ngx_uint_t;

pub static MODULE_CTX: ngx_stream_module_t = ngx_stream_module_t {
    preconfiguration: None,
    postconfiguration: Some(postconfiguration),
    create_main_conf: None,
    init_main_conf: None,
    create_srv_conf: Some(create_srv_conf),
    merge_srv_conf: Some(merge_srv_conf),
};

pub static mut COMMANDS: [ngx_command_t; 6] = [
    ngx_command_t {
        name: ngx_string!("dynamic_balancer"),
        type_: (NGX_STREAM_UPS_CONF | NGX_CONF_NOARGS | NGX_CONF_TAKE12) as ngx_uint_t,
        set: Some(set_balancer),
        conf: SRV_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_backend"),
        type_: (NGX_STREAM_MAIN_CONF | NGX_STREAM_SRV_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(set_backend),
        conf: SRV_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_routes"),
        type_: (NGX_STREAM_SRV_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(set_listener),
        conf: SRV_CONF_OFFSET,
        offset: offset_of!(StreamSrvConf, routes),
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_ssl_routes"),
        type_: (NGX_STREAM_SRV_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(set_listener),
        conf: SRV_CONF_OFFSET,
        offset: offset_of!(StreamSrvConf, ssl_routes),
        post: std::ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("dynamic_balancer_backend_tls"),
        type_: (NGX_STREAM_SRV_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(set_listener),
        conf: SRV_CONF_OFFSET,
        offset: offset_of!(StreamSrvConf, backend_tls),
        post: std::ptr::null_mut(),
    },
    ngx_command_t::empty(),
];

/// nginx calls it for every `stream{}`, `server{}` and `upstream{}` block,
/// with the live configuration.
unsafe extern "C" fn create_srv_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    ffi_guard("stream create srv conf", ptr::null_mut(), || {
        // SAFETY: `cf` is live; its pool outlives the configuration. The
        // conf holds no heap data, so the pool needs no cleanup for it.
        let pool = unsafe { ngx::core::Pool::from_ngx_pool((*cf).pool) };
        pool.allocate(StreamSrvConf::default()).cast()
    })
}

/// A `server{}` inherits `dynamic_balancer_backend` from `stream{}`.
unsafe extern "C" fn merge_srv_conf(_cf: *mut ngx_conf_t, prev: *mut c_void, conf: *mut c_void) -> *mut c_char {
    ffi_guard("stream merge srv conf", NGX_CONF_ERROR, || {
        // SAFETY: both are our `StreamSrvConf`s from create_srv_conf, distinct
        // allocations; configuration runs on one thread.
        let (prev, conf) = unsafe { (&*prev.cast::<StreamSrvConf>(), &mut *conf.cast::<StreamSrvConf>()) };
        if conf.backend.is_none() {
            conf.backend = prev.backend;
        }
        NGX_CONF_OK
    })
}

/// `dynamic_balancer [$variable];` in a stream `upstream{}`.
unsafe extern "C" fn set_balancer(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("stream dynamic_balancer", NGX_CONF_ERROR, || {
        // SAFETY: for a SRV_CONF_OFFSET directive in an upstream block,
        // `conf` is our `StreamSrvConf` of that block.
        let ucf = unsafe { &mut *conf.cast::<StreamSrvConf>() };
        if ucf.enabled {
            return c"is duplicate".as_ptr().cast_mut();
        }
        // SAFETY: `cf` is the live configuration being parsed.
        for v in &args(unsafe { &*cf })[1..] {
            let bytes = v.as_bytes();
            if bytes == b"proxy_protocol=off" {
                ucf.no_proxy_protocol = true;
                continue;
            }
            if bytes.len() < 2 || bytes[0] != b'$' || ucf.variable != UNKNOWN {
                ngx_conf_log_error!(
                    NGX_LOG_EMERG,
                    cf,
                    "invalid parameter \"{v}\" in \"dynamic_balancer\": a $variable and \"proxy_protocol=off\" are expected"
                );
                return NGX_CONF_ERROR;
            }
            let mut name = ngx_str_t {
                len: v.len - 1,
                // SAFETY: `len >= 2`, so one past `data` is in bounds.
                data: unsafe { v.data.add(1) },
            };
            // SAFETY: `cf` is live; `name` points into the argument, which
            // outlives the configuration.
            let index = unsafe { ngx_stream_get_variable_index(cf, &mut name) };
            if index == NGX_ERROR as ngx_int_t {
                return NGX_CONF_ERROR;
            }
            ucf.variable = index as usize;
        }
        // SAFETY: in an upstream block `cf->ctx` is its stream conf ctx,
        // whose srv_conf has the upstream module's srv conf.
        let uscf = unsafe {
            let ctx = (*cf).ctx.cast::<ngx_stream_conf_ctx_t>();
            let index = (*ptr::addr_of!(ngx_stream_upstream_module)).ctx_index;
            &mut *(*(*ctx).srv_conf.add(index)).cast::<ngx_stream_upstream_srv_conf_t>()
        };
        if uscf.peer.init_upstream.is_some() {
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "\"dynamic_balancer\" cannot be combined with another balancing method"
            );
            return NGX_CONF_ERROR;
        }
        // nginx refuses an upstream without a `server` ("no servers are
        // inside upstream"); peers come from the zone, so add an inert one.
        // SAFETY: an upstream block's `servers` is null or its live array
        // of `ngx_stream_upstream_server_t`.
        if let Some(servers) = unsafe { uscf.servers.as_mut() } {
            if servers.nelts == 0 {
                // SAFETY: `servers` is a live array.
                let placeholder = unsafe { ngx_array_push(servers) }.cast::<ngx_stream_upstream_server_t>();
                if placeholder.is_null() {
                    return NGX_CONF_ERROR;
                }
                // The placeholder has an address (0.0.0.1:1, never used), so
                // that a balancing method wrongly placed after this one
                // initialises and the check at postconfiguration names the
                // real problem, rather than "no servers in upstream".
                // SAFETY: `cf`'s pool is live; the allocations are sized and
                // aligned for their types and live as long as the cycle.
                let addr = unsafe {
                    let pool = ngx::core::Pool::from_ngx_pool((*cf).pool);
                    let sin = pool.allocate(libc::sockaddr_in {
                        sin_family: libc::AF_INET as libc::sa_family_t,
                        sin_port: 1u16.to_be(),
                        sin_addr: libc::in_addr {
                            s_addr: u32::from_be_bytes([0, 0, 0, 1]).to_be(),
                        },
                        sin_zero: [0; 8],
                    });
                    pool.allocate(ngx_addr_t {
                        sockaddr: sin.cast(),
                        socklen: std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                        name: ngx_str_t::from_str((*cf).pool, "0.0.0.1:1"),
                    })
                };
                // SAFETY: the non-null, aligned slot ngx_array_push reserved;
                // all-zero is a valid server entry before the fields are set.
                unsafe {
                    ptr::write_bytes(placeholder, 0, 1);
                    (*placeholder).name = ngx_str_t::from_str((*cf).pool, "dynamic_balancer");
                    (*placeholder).addrs = addr;
                    (*placeholder).naddrs = 1;
                    (*placeholder).weight = 1;
                }
            }
        }
        uscf.peer.init_upstream = Some(init_upstream);
        ucf.enabled = true;
        NGX_CONF_OK
    })
}

/// `peer.init_upstream`: nginx calls it at the stream upstream module's
/// init_main_conf, with a live upstream.
unsafe extern "C" fn init_upstream(_cf: *mut ngx_conf_t, us: *mut ngx_stream_upstream_srv_conf_t) -> ngx_int_t {
    ffi_guard("stream init upstream", NGX_ERROR as ngx_int_t, || {
        // SAFETY: `us` is live; configuration runs on one thread.
        if let Some(conf) = unsafe { srv_conf_in((*us).srv_conf) } {
            conf.initialized = true;
        }
        // SAFETY: `us` is live and nginx does not use it during the call.
        unsafe { (*us).peer.init = Some(crate::stream::peer::init_peer) };
        NGX_OK as ngx_int_t
    })
}

/// `dynamic_balancer_backend name;` in `stream{}` or a stream `server{}`.
unsafe extern "C" fn set_backend(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("stream dynamic_balancer_backend", NGX_CONF_ERROR, || {
        // SAFETY: `conf` is our `StreamSrvConf` of the enclosing block.
        let scf = unsafe { &mut *conf.cast::<StreamSrvConf>() };
        // SAFETY: `cf` is the live configuration being parsed.
        unsafe { set_literal_once(cf, &mut scf.backend, "backend name") }
    })
}

/// `dynamic_balancer_routes listener;`, `dynamic_balancer_ssl_routes
/// listener;` and `dynamic_balancer_backend_tls listener;` in a stream
/// `server{}`: the listener name goes into the
/// `Option<ngx_str_t>` field at the command's `offset`, as nginx's own
/// `ngx_conf_set_*_slot` setters do.
unsafe extern "C" fn set_listener(cf: *mut ngx_conf_t, cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    ffi_guard("stream listener directive", NGX_CONF_ERROR, || {
        // SAFETY: `conf` is our `StreamSrvConf` of the enclosing server, and
        // `cmd` one of `COMMANDS`, whose entries with this setter give the
        // `offset_of!` an `Option<ngx_str_t>` field of it; configuration
        // runs on one thread, nothing else borrows the conf meanwhile.
        let slot = unsafe { &mut *conf.cast::<u8>().add((*cmd).offset).cast::<Option<ngx_str_t>>() };
        // SAFETY: `cf` is the live configuration being parsed.
        unsafe { set_literal_once(cf, slot, "listener name") }
    })
}

/// The stream upstreams of `cycle`'s configuration.
///
/// # Safety
/// `cycle` is live and its `stream{}` block (if any) configured.
unsafe fn stream_upstreams(cycle: *const ngx_cycle_t) -> &'static [*mut ngx_stream_upstream_srv_conf_t] {
    // SAFETY: `conf_ctx` has a slot per core module; the stream module's is
    // null or the `stream{}` block's conf ctx, whose main_conf has the
    // upstream module's main conf with its array of srv conf pointers.
    unsafe {
        let slot = *(*cycle).conf_ctx.add((*ptr::addr_of!(ngx_stream_module)).index);
        let Some(ctx) = slot.cast::<ngx_stream_conf_ctx_t>().as_ref() else {
            return &[];
        };
        let index = (*ptr::addr_of!(ngx_stream_upstream_module)).ctx_index;
        let Some(umcf) = (*ctx.main_conf.add(index))
            .cast::<ngx_stream_upstream_main_conf_t>()
            .as_ref()
        else {
            return &[];
        };
        umcf.upstreams.as_slice()
    }
}

/// Refuses an upstream whose `dynamic_balancer` a later `hash`,
/// `least_conn` or `random` replaced (nginx only warns; traffic would go
/// to the placeholder). Runs after the stream upstreams initialised. Then
/// sets the TLS callbacks of `dynamic_balancer_ssl_routes` servers and
/// links the `dynamic_balancer_backend_tls` twins.
unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    ffi_guard("stream postconfiguration", NGX_ERROR as ngx_int_t, || {
        // SAFETY: nginx calls postconfiguration with the parsed
        // configuration, every server conf merged.
        if unsafe { crate::stream::tls::install(cf) } != NGX_OK as ngx_int_t {
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: as above.
        if unsafe { crate::stream::backend_tls::link(cf) } != NGX_OK as ngx_int_t {
            return NGX_ERROR as ngx_int_t;
        }
        // SAFETY: `cf` is live; its cycle's stream block is parsed.
        for &us in unsafe { stream_upstreams((*cf).cycle) } {
            // SAFETY: each entry is a live upstream of this configuration.
            if let Some(conf) = unsafe { srv_conf_in((*us).srv_conf) } {
                if conf.enabled && !conf.initialized {
                    // SAFETY: as above.
                    let name = unsafe { (*us).host };
                    ngx_conf_log_error!(
                        NGX_LOG_EMERG,
                        cf,
                        "another balancing method replaced \"dynamic_balancer\" in upstream \"{name}\""
                    );
                    return NGX_ERROR as ngx_int_t;
                }
            }
        }
        NGX_OK as ngx_int_t
    })
}

/// The core module's `init_conf`: with every block parsed, a stream
/// `dynamic_balancer` needs the `http{}` block's zone (which may come after
/// `stream{}`, or be missing). A core module's `init_conf` may fail a
/// reload gracefully (the old configuration keeps running); an
/// `init_module` failure would make the master exit.
unsafe extern "C" fn check_zone(cycle: *mut ngx_cycle_t, _conf: *mut c_void) -> *mut c_char {
    ffi_guard("stream zone check", NGX_CONF_ERROR, || {
        // SAFETY: nginx calls init_conf with the cycle being configured,
        // all of its blocks parsed.
        let used = unsafe { stream_upstreams(cycle) }
            .iter()
            // SAFETY: each entry is a live upstream of this configuration.
            .any(|&us| unsafe { srv_conf_in((*us).srv_conf) }.is_some_and(|c| c.enabled));
        // SAFETY: as above.
        let zone = unsafe { http_main_conf(cycle) }.is_some_and(|m| !m.shm_zone.is_null());
        if used && !zone {
            // SAFETY: a cycle being configured has its log.
            let log = unsafe { (*cycle).log };
            ngx_log_error!(
                NGX_LOG_EMERG,
                log,
                "\"dynamic_balancer\" in stream{{}} routes by the http{{}} block's zone: add \"dynamic_balancer_zone\" (or the API) to http{{}}"
            );
            return NGX_CONF_ERROR;
        }
        NGX_CONF_OK
    })
}

/// `ngx_dynamic_balancer_check_module`'s context: no directives, only the
/// check above.
pub static mut CORE_CTX: ngx_core_module_t = ngx_core_module_t {
    name: ngx_string!("dynamic_balancer_check"),
    create_conf: None,
    init_conf: Some(check_zone),
};
