//! The module's configuration as requests read it: the structs nginx
//! allocates per `http{}`, `server{}`/`upstream{}` and `location{}`, and the
//! plain accessors request-time code uses (`zone_of`, `backend_name`,
//! `upstream_conf`). The directives that fill them are in
//! [`crate::directives`]; nothing here runs at configuration time.
//!
//! May use [`crate::nginx`] and [`crate::shm`] (the zones the main conf
//! points at).

mod listener_memo;

use std::cell::RefCell;
use std::path::PathBuf;
use std::ptr::{self, NonNull};
use std::rc::Rc;

use ngx::ffi::{ngx_http_upstream_srv_conf_t, ngx_shm_zone_t, ngx_str_t, ngx_uint_t, off_t};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, HttpModuleServerConf, Request};

use lua_compat::https_redirect::Rule;
use lua_compat::metrics::Counters;
use lua_compat::otel::sampler::Sampler;
use lua_compat::otel::settings::ExporterSettings;

use crate::nginx::module::Module;
use crate::nginx::variables::{self, Own, Read};
use crate::shm::metrics_zone::{MetricsZone, Series, ZoneCtx};
use crate::shm::zone::Zone;

pub use listener_memo::ListenerMemo;

/// `http{}` level: the zone.
pub struct MainConf {
    pub shm_zone: *mut ngx_shm_zone_t,
    /// Set by `dynamic_balancer` or `dynamic_balancer_api`; a default zone is
    /// added only when the module is used.
    pub(crate) used: bool,
    /// Indexes of the variables this module sets ([`variables::OWN_NAMES`]),
    /// found at postconfiguration. Kept per configuration, not in a static:
    /// a worker the master respawns after a failed reload runs the old
    /// configuration, whose variables array the new indexes do not fit.
    pub own_variables: [usize; variables::OWN_NAMES.len()],
    /// Indexes of the variables the module reads ([`variables::READ_NAMES`]),
    /// per configuration for the same reason.
    pub read_variables: [usize; variables::READ_NAMES.len()],
    /// `ctx_index` of the proxy and grpc modules in this configuration's
    /// cycle ([`UNKNOWN`] when compiled out); per configuration for the
    /// same reason, as a reload may load other modules.
    pub upstream_users: [usize; 2],
    /// `dynamic_balancer_metrics_zone` (or the default one a
    /// `dynamic_balancer_metrics` location adds); null when metrics are off.
    pub metrics_zone: *mut ngx_shm_zone_t,
    /// The label hashes this configuration declares, handed to the metrics
    /// zone's init (the zone's `data` points here), which writes back the
    /// configuration's epoch.
    pub metrics_ctx: ZoneCtx,
    /// Some location has `dynamic_balancer_https_redirect`: the REWRITE
    /// handler is installed only then.
    pub https_redirect_used: bool,
    /// Some location has `dynamic_balancer_routes`: the route handler and
    /// the response header filter are installed.
    pub routes_used: bool,
    /// `dynamic_balancer_state`: the file the backends are kept in (see
    /// [`crate::shm::state_file`]), prefix-resolved.
    pub state_file: Option<PathBuf>,
    /// `dynamic_balancer_otel_exporter`: where each worker's exporter
    /// thread sends spans; without it traced requests still propagate
    /// their context, and no span leaves the worker.
    pub otel_exporter: Option<ExporterSettings>,
    /// `dynamic_balancer_otel_sampler` (parent-based, always on, when not
    /// set).
    pub otel_sampler: Option<Sampler>,
    /// Some block has `dynamic_balancer_otel on`: the tracing handlers are
    /// installed only then.
    pub otel_used: bool,
}

/// An index not found in this configuration.
pub const UNKNOWN: usize = usize::MAX;

impl Default for MainConf {
    fn default() -> Self {
        MainConf {
            shm_zone: ptr::null_mut(),
            used: false,
            own_variables: [UNKNOWN; variables::OWN_NAMES.len()],
            read_variables: [UNKNOWN; variables::READ_NAMES.len()],
            upstream_users: [UNKNOWN; 2],
            metrics_zone: ptr::null_mut(),
            metrics_ctx: ZoneCtx::default(),
            https_redirect_used: false,
            routes_used: false,
            state_file: None,
            otel_exporter: None,
            otel_sampler: None,
            otel_used: false,
        }
    }
}

/// The index of our variable `which` in the request's configuration.
pub fn own_variable(req: &Request, which: Own) -> Option<usize> {
    let index = Module::main_conf(req)?.own_variables[which as usize];
    (index != UNKNOWN).then_some(index)
}

/// The value of variable `which` for this request (computed once, then
/// cached by nginx); `None` when not found.
pub fn read_variable(req: &Request, which: Read) -> Option<&[u8]> {
    let index = Module::main_conf(req)?.read_variables[which as usize];
    if index == UNKNOWN {
        return None;
    }
    crate::nginx::request::variable(req, index)
}

/// `$host` (the request line's host, else the `Host` header's, lower
/// case, without port; else the server's name), read where nginx's own
/// getter reads it when the request has one: the variable machinery costs
/// about as much as the rest of a route lookup.
pub fn request_host(req: &Request) -> &[u8] {
    let server = crate::nginx::request::str_bytes(&req.as_ref().headers_in.server);
    if !server.is_empty() {
        return server;
    }
    read_variable(req, Read::Host).unwrap_or_default()
}

impl MainConf {
    pub fn zone(&self) -> Option<Zone> {
        // SAFETY: shm_zone, when set, is our zone; init_zone ran before workers.
        unsafe { self.shm_zone.as_ref().and_then(|z| Zone::from_shm_zone(z)) }
    }

    pub fn metrics_zone(&self) -> Option<MetricsZone> {
        // SAFETY: metrics_zone, when set, is the metrics zone; its init ran
        // before any worker.
        unsafe { self.metrics_zone.as_ref().and_then(|z| MetricsZone::from_shm_zone(z)) }
    }
}

/// `upstream{}` level: whether the peer hook is on, and the variable naming
/// the backend. nginx also creates one for every `server{}`, where only
/// `open_api` is used.
#[derive(Default)]
pub struct UpstreamConf {
    /// In a `server{}`: it has an API location without a token, so it must
    /// listen on loopback or unix: sockets only (see `directives::check_api_listeners`).
    pub open_api: bool,
    pub enabled: bool,
    /// Set by our `init_upstream`; still false after configuration means a
    /// later `hash`, `least_conn`... replaced the hook (see
    /// `directives::check_upstreams`).
    pub(crate) initialized: bool,
    pub variable: ngx_uint_t,
    /// In a `server{}` (or inherited from `http{}`): `dynamic_balancer_ssl`,
    /// certificates from the zone by SNI. `None` when not set.
    pub ssl: Option<bool>,
    /// In a `server{}`: `dynamic_balancer_ssl_routes listener;`, the
    /// certificates of that route-table listener (a Gateway's HTTPS
    /// listeners) by SNI, in place of the Ingress servers map. Not
    /// inherited.
    pub ssl_routes: Option<ngx_str_t>,
    /// Set at postconfiguration for a server whose handshakes the module
    /// serves: the main conf, so that the certificate callback, given this
    /// server conf, finds the zone.
    pub(crate) main: Option<std::ptr::NonNull<MainConf>>,
}

/// `location{}` level: the API handler's settings, and the static backend
/// name of `dynamic_balancer_backend`.
#[derive(Default)]
pub struct LocConf {
    /// `dynamic_balancer_backend name;`, inherited by nested locations.
    pub backend: Option<ngx_str_t>,
    pub enabled: bool,
    /// The location's `client_max_body_size`, enforced by the handler itself
    /// so that an oversize body gets a JSON 413 (0 means unlimited).
    pub max_body: off_t,
    /// `dynamic_balancer_api_token(_file)`: requests must carry
    /// `Authorization: Bearer <token>`. Inherited by nested blocks.
    pub token: Option<Box<[u8]>>,
    /// `dynamic_balancer_metrics …;`, inherited by nested locations.
    pub metrics: Option<Rc<LocMetrics>>,
    /// `dynamic_balancer_https_redirect`: `None` when not set here (a
    /// nested location inherits), `Some(None)` for `off`.
    pub https_redirect: Option<Option<Rule>>,
    /// `dynamic_balancer_forwarded_headers`: trust `X-Forwarded-*`
    /// (inherited; off when never set).
    pub forwarded_headers: Option<bool>,
    /// `dynamic_balancer_request_id`: the request carries `X-Request-ID`
    /// (inherited; off when never set).
    pub request_id_header: Option<bool>,
    /// `dynamic_balancer_routes listener;`: requests are routed by that
    /// listener's Gateway API routes (not inherited).
    pub routes: Option<ngx_str_t>,
    /// `dynamic_balancer_routes listener @name;`: the named location that
    /// requests for HTTP/2 cleartext backends (gRPC, `kubernetes.io/h2c`)
    /// go on to, with the backend chosen (one with `grpc_pass`).
    pub routes_h2c: Option<ngx_str_t>,
    /// `dynamic_balancer_routes listener @h2c @tls;`: where requests for
    /// backends reached over TLS (a BackendTLSPolicy's) go on to (one with
    /// `proxy_pass https://`).
    pub routes_tls: Option<ngx_str_t>,
    /// `dynamic_balancer_routes listener @h2c @tls @grpcs;`: the same for
    /// HTTP/2 backends over TLS (`grpc_pass grpcs://`).
    pub routes_grpcs: Option<ngx_str_t>,
    /// The `routes` listener in this worker's current route table.
    pub routes_memo: ListenerMemo,
    /// `dynamic_balancer_otel`: trace this block's requests (inherited;
    /// off when never set).
    pub otel: Option<bool>,
    /// `dynamic_balancer_otel_trust_incoming_spans`: continue a client's
    /// `traceparent` (inherited; on when never set, as ingress-nginx).
    pub otel_trust: Option<bool>,
    /// `dynamic_balancer_otel_operation_name`: the span name, compiled
    /// (inherited; the location's name when never set).
    pub otel_operation_name: Option<NonNull<ngx::ffi::ngx_http_complex_value_t>>,
}

/// A location's metrics labels, and each worker's cells for them.
///
/// The cache is per worker: configuration memory is copied on write into
/// each worker at fork, and only the worker's event loop touches it.
pub struct LocMetrics {
    /// The series text of the primary (`canary=""` and the location's
    /// labels, see `lua_compat::metrics::labels`).
    pub primary: Box<[u8]>,
    /// The location's part of the text, to build a canary's series text.
    pub location: Box<str>,
    /// Hash of `location`: what the configuration declares to the zone.
    pub loc_hash: u64,
    pub cache: RefCell<MetricsCache>,
}

/// The cells a worker found for a location, so that counting a request
/// takes no lock.
#[derive(Default)]
pub struct MetricsCache {
    pub primary: Option<NonNull<Series>>,
    /// (method × status key, cell): the few a location sees, most often
    /// a handful; at most [`MAX_CACHED_CELLS`].
    pub cells: Vec<(u32, &'static Counters)>,
    /// (canary backend, method × status key, cell), few per location.
    pub canaries: Vec<(Box<[u8]>, u32, &'static Counters)>,
    /// After the zone was found full, the next attempt (`ngx_current_msec`),
    /// so that a full zone costs a lock once a second, not per request.
    pub retry_at: u64,
}

/// Cells a worker keeps per location; a request of another method and
/// status finds its cell under the zone's mutex each time (still counted).
pub const MAX_CACHED_CELLS: usize = 64;

/// The zone of the request's `http{}` block.
pub fn zone_of(req: &Request) -> Option<Zone> {
    Module::main_conf(req)?.zone()
}

/// The name of the request's backend: the location's
/// `dynamic_balancer_backend` if set, else the upstream's variable.
pub fn backend_name<'r>(req: &'r Request, conf: &UpstreamConf) -> Option<&'r [u8]> {
    match Module::location_conf(req).and_then(|l| l.backend) {
        // SAFETY: `dynamic_balancer_backend` stored a directive argument:
        // `len` bytes in the configuration pool, which outlives the request.
        Some(name) => Some(unsafe { std::slice::from_raw_parts(name.data, name.len) }),
        None => crate::nginx::request::variable(req, conf.variable),
    }
}

/// Our settings for upstream `us`, when `dynamic_balancer` is on there.
///
/// # Safety
/// `us` is a live upstream srv conf.
pub unsafe fn upstream_conf(us: *const ngx_http_upstream_srv_conf_t) -> Option<&'static UpstreamConf> {
    // SAFETY: `us` is live (this function's contract).
    let srv_conf = unsafe { (*us).srv_conf };
    if srv_conf.is_null() {
        return None; // an implicit upstream (proxy_pass http://host:port)
    }
    // SAFETY: an `upstream{}` block's `srv_conf` has an entry per HTTP
    // module; ours is null or the `UpstreamConf` that `create_srv_conf`
    // allocated in the configuration pool, which outlives every request.
    let conf = unsafe {
        (*srv_conf.add(crate::nginx::module::http_ctx_index()))
            .cast::<UpstreamConf>()
            .as_ref()
    }?;
    conf.enabled.then_some(conf)
}

/// Our settings for upstream `us`, whether or not the hook is on there.
///
/// # Safety
/// `us` is a live upstream srv conf.
/// Configuration time only: the `&mut` must not overlap another borrow of
/// the same conf.
pub unsafe fn srv_conf_mut(us: *mut ngx_http_upstream_srv_conf_t) -> Option<&'static mut UpstreamConf> {
    // SAFETY: `us` is live (this function's contract).
    let srv_conf = unsafe { (*us).srv_conf };
    if srv_conf.is_null() {
        return None;
    }
    // SAFETY: as in `upstream_conf`; configuration runs on one thread and the
    // callers hold no other borrow of this conf.
    unsafe {
        (*srv_conf.add(crate::nginx::module::http_ctx_index()))
            .cast::<UpstreamConf>()
            .as_mut()
    }
}

// SAFETY: `MODULE_CTX.create_main_conf` is `Module::create_main_conf`, which
// allocates a `MainConf`, so our main conf slot always holds one.
unsafe impl HttpModuleMainConf for Module {
    type MainConf = MainConf;
}

// SAFETY: `MODULE_CTX.create_srv_conf` is `Module::create_srv_conf`, which
// allocates an `UpstreamConf`, so our srv conf slots always hold one.
unsafe impl HttpModuleServerConf for Module {
    type ServerConf = UpstreamConf;
}

// SAFETY: `MODULE_CTX.create_loc_conf` is `Module::create_loc_conf`, which
// allocates a `LocConf`, so our loc conf slots always hold one.
unsafe impl HttpModuleLocationConf for Module {
    type LocationConf = LocConf;
}
