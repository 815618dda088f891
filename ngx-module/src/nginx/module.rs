//! The module's handles: the [`Module`] type ngx's configuration traits
//! hang on, and the `ngx_module_t` objects nginx fills in at load time
//! (their context indexes), declared here and defined in `lib.rs`.
//!
//! The objects carry the command tables and hooks, which name the top of
//! the crate, so they are defined at the top; everything below reaches them
//! through these declarations, as an nginx C module's files reach
//! `ngx_http_foo_module` through an `extern` line. Nothing imports the crate
//! root.

use ngx::ffi::ngx_module_t;
use ngx::http::HttpModule;

// SAFETY: both symbols are defined in `lib.rs` as `#[no_mangle]` statics of
// exactly this type; nginx writes their indexes while it loads the module,
// before any of our code reads them, and never concurrently with a read.
unsafe extern "C" {
    pub static mut ngx_http_dynamic_balancer_module: ngx_module_t;
    #[cfg(feature = "stream")]
    pub static mut ngx_stream_dynamic_balancer_module: ngx_module_t;
}

/// The module's handle for ngx's configuration traits (`HttpModuleMainConf`
/// and its kin are implemented in [`crate::conf`]).
pub struct Module;

impl Module {
    /// The http module object, for lookups that take it by reference.
    pub fn module_ref() -> &'static ngx_module_t {
        <Module as HttpModule>::module()
    }
}

impl HttpModule for Module {
    fn module() -> &'static ngx_module_t {
        // SAFETY: see the declaration: the object lives as long as the
        // process, and nginx wrote its indexes before any caller runs.
        unsafe { &*std::ptr::addr_of!(ngx_http_dynamic_balancer_module) }
    }
}

/// The http module's `ctx_index` (its slot in configuration and context
/// arrays).
pub fn http_ctx_index() -> usize {
    Module::module_ref().ctx_index
}

/// The stream module's `ctx_index`.
#[cfg(feature = "stream")]
pub fn stream_ctx_index() -> usize {
    // SAFETY: as for the http object above.
    unsafe { (*std::ptr::addr_of!(ngx_stream_dynamic_balancer_module)).ctx_index }
}
