//! `init_module`: the master's one hook after a configuration is applied,
//! where a newly created zone is filled from the state file before any
//! worker forks (the reading itself is [`crate::shm::state_file`]).

use ngx::ffi::{ngx_cycle_t, ngx_int_t, NGX_OK};
use ngx::http::HttpModuleConfExt;

use crate::conf::MainConf;
use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;
use crate::shm::{state_file, zone};

/// `init_module`: fills a new zone from the state file. nginx calls it in
/// the master with the live cycle it just configured (its zones set up),
/// before any worker forks; also for `nginx -t`, which is left alone.
/// It never fails: nginx exits if an `init_module` does.
pub unsafe extern "C" fn init_module(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    ffi_guard("init module", NGX_OK as ngx_int_t, || {
        // Taken whatever follows, so it never outlives this cycle.
        let created = zone::take_created();
        // SAFETY: a plain read of a global nginx sets from the command line.
        if !created || unsafe { ngx::ffi::ngx_test_config } != 0 {
            return NGX_OK as ngx_int_t;
        }
        // SAFETY: `cycle` is live and configured; our slot in its http main
        // confs holds the `MainConf` create_main_conf made, in the cycle's
        // pool, and nothing else borrows it now.
        let mcf = unsafe {
            (*cycle)
                .http_main_conf_unchecked::<MainConf>(Module::module_ref())
                .map(|p| p.as_ref())
        };
        let Some((path, zone)) = mcf.and_then(|m| Some((m.state_file.as_deref()?, m.zone()?))) else {
            return NGX_OK as ngx_int_t;
        };
        // SAFETY: `cycle` is live; its log lives as long as it.
        state_file::restore(&zone, path, unsafe { (*cycle).log });
        NGX_OK as ngx_int_t
    })
}
