//! Worker start, stop, and the idle sync timer.
//!
//! Requests validate their backend against the zone, so routing is always
//! current. The timer reports the worker's generation for
//! `/configuration/status` (the controller waits for it after a reload) and
//! sweeps stale cache entries in small batches. Worker 0 also runs the
//! DNS refresher of `ExternalName` backends, whose log lines the timer
//! writes.

use ngx::ffi::{ngx_cycle_t, ngx_event_t, ngx_int_t, ngx_msec_t, NGX_OK};
use ngx::http::HttpModuleConfExt;

use ngx::ngx_log_error;

use crate::conf::MainConf;
use crate::external_names;
use crate::guard::ffi_guard;
use crate::worker::{self, WorkerTimer};
use crate::worker_cache;

/// How often a worker reports and sweeps, in ms.
const SYNC_INTERVAL_MS: ngx_msec_t = 100;

thread_local! {
    static SYNC_TIMER: std::cell::Cell<Option<WorkerTimer>> = const { std::cell::Cell::new(None) };
}

unsafe fn main_conf(cycle: *const ngx_cycle_t) -> Option<&'static MainConf> {
    (*cycle)
        .http_main_conf_unchecked::<MainConf>(crate::Module::module_ref())
        .map(|p| p.as_ref())
}

/// `init_process`: sync once, report, and arm the timer.
pub unsafe extern "C" fn init_process(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    ffi_guard("init process", NGX_OK as ngx_int_t, || unsafe {
        let Some(zone) = main_conf(cycle).and_then(MainConf::zone) else {
            return NGX_OK as ngx_int_t;
        };
        worker_cache::observe(&zone);
        if ngx::ffi::ngx_worker == 0 {
            external_names::start_refresher(zone.clone());
        }
        let timer = WorkerTimer::new(Some(on_timer), true);
        SYNC_TIMER.set(Some(timer));
        timer.arm(SYNC_INTERVAL_MS);
        NGX_OK as ngx_int_t
    })
}

unsafe extern "C" fn on_timer(ev: *mut ngx_event_t) {
    ffi_guard("sync timer", (), || unsafe {
        external_names::drain_log(|level, line| {
            ngx_log_error!(level, (*ev).log, "{line}");
        });
        if worker::is_leaving() {
            external_names::stop();
            return;
        }
        if let Some(zone) = main_conf(ngx::ffi::ngx_cycle).and_then(MainConf::zone) {
            worker_cache::sweep(&zone);
            let generation = worker_cache::observe(&zone);
            worker_cache::report(&zone, generation);
        }
        if let Some(timer) = SYNC_TIMER.get() {
            timer.arm(SYNC_INTERVAL_MS);
        }
    })
}

/// `exit_process`: give up the status slot and drop the cache.
pub unsafe extern "C" fn exit_process(cycle: *mut ngx_cycle_t) {
    ffi_guard("exit process", (), || unsafe {
        external_names::stop();
        if let Some(zone) = main_conf(cycle).and_then(MainConf::zone) {
            zone.header().retire(ngx::ffi::ngx_worker, ngx::ffi::ngx_pid as i64);
            zone.header().index.release_slot();
        }
        worker_cache::clear();
    })
}
