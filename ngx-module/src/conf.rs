//! The module's configuration as requests read it: the structs nginx
//! allocates per `http{}`, `server{}`/`upstream{}` and `location{}`, and the
//! plain accessors request-time code uses (`zone_of`, `backend_name`,
//! `upstream_conf`). The directives that fill them are in
//! [`crate::directives`]; nothing here runs at configuration time.

use std::ptr;

use ngx::ffi::{ngx_http_request_t, ngx_http_upstream_srv_conf_t, ngx_shm_zone_t, ngx_str_t, ngx_uint_t, off_t};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, HttpModuleServerConf};

use crate::zone::Zone;
use crate::Module;

/// `http{}` level: the zone.
pub struct MainConf {
    pub shm_zone: *mut ngx_shm_zone_t,
    /// Set by `dynamic_balancer` or `dynamic_balancer_api`; a default zone is
    /// added only when the module is used.
    pub(crate) used: bool,
}

impl Default for MainConf {
    fn default() -> Self {
        MainConf {
            shm_zone: ptr::null_mut(),
            used: false,
        }
    }
}

impl MainConf {
    pub fn zone(&self) -> Option<Zone> {
        // SAFETY: shm_zone, when set, is our zone; init_zone ran before workers.
        unsafe { self.shm_zone.as_ref().and_then(|z| Zone::from_shm_zone(z)) }
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
}

/// The zone of the request's `http{}` block.
pub fn zone_of(r: &ngx_http_request_t) -> Option<Zone> {
    Module::main_conf(r)?.zone()
}

/// The name of the request's backend: the location's
/// `dynamic_balancer_backend` if set, else the upstream's variable.
///
/// # Safety
/// `r` is a live request.
pub unsafe fn backend_name<'r>(r: *mut ngx_http_request_t, conf: &UpstreamConf) -> Option<&'r [u8]> {
    match Module::location_conf(&*r).and_then(|l| l.backend) {
        Some(name) => Some(std::slice::from_raw_parts(name.data, name.len)),
        None => crate::request::variable(r, conf.variable),
    }
}

/// Our settings for upstream `us`, when `dynamic_balancer` is on there.
///
/// # Safety
/// `us` is a live upstream srv conf.
pub unsafe fn upstream_conf(us: *const ngx_http_upstream_srv_conf_t) -> Option<&'static UpstreamConf> {
    let srv_conf = (*us).srv_conf;
    if srv_conf.is_null() {
        return None; // an implicit upstream (proxy_pass http://host:port)
    }
    let conf = (*srv_conf.add(crate::module_ctx_index()))
        .cast::<UpstreamConf>()
        .as_ref()?;
    conf.enabled.then_some(conf)
}

/// Our settings for upstream `us`, whether or not the hook is on there.
///
/// # Safety
/// `us` is a live upstream srv conf.
pub unsafe fn srv_conf_mut(us: *mut ngx_http_upstream_srv_conf_t) -> Option<&'static mut UpstreamConf> {
    let srv_conf = (*us).srv_conf;
    if srv_conf.is_null() {
        return None;
    }
    (*srv_conf.add(crate::module_ctx_index()))
        .cast::<UpstreamConf>()
        .as_mut()
}

unsafe impl HttpModuleMainConf for Module {
    type MainConf = MainConf;
}

unsafe impl HttpModuleServerConf for Module {
    type ServerConf = UpstreamConf;
}

unsafe impl HttpModuleLocationConf for Module {
    type LocationConf = LocConf;
}
