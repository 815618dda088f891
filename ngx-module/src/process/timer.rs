//! Worker start, stop, and the idle sync timer.
//!
//! Requests validate their backend against the zone, so routing is always
//! current. The timer reports the worker's generation for
//! `/configuration/status` (the controller waits for it after a reload) and
//! sweeps stale cache entries in small batches. Worker 0 also runs the
//! DNS refresher of `ExternalName` backends, whose log lines the timer
//! writes.

use ngx::ffi::{ngx_cycle_t, ngx_event_t, ngx_int_t, ngx_msec_t, NGX_LOG_ALERT, NGX_OK};
use ngx::http::HttpModuleConfExt;

use ngx::ngx_log_error;

use crate::backends::external_names;
use crate::backends::worker_cache;
use crate::conf::MainConf;
use crate::http::request_id;
use crate::nginx::guard::ffi_guard;
use crate::nginx::worker::{self, WorkerTimer};
use crate::otel;
use crate::shm::metrics_zone;
use crate::shm::state_file;

/// How often a worker reports and sweeps, in ms.
const SYNC_INTERVAL_MS: ngx_msec_t = 100;
/// How long a leaving worker waits for its state file write.
const STATE_FILE_FLUSH: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a leaving worker waits for its last spans' export.
const OTEL_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

thread_local! {
    static SYNC_TIMER: std::cell::Cell<Option<WorkerTimer>> = const { std::cell::Cell::new(None) };
}

/// This module's `http{}` conf in `cycle`, if it has an `http{}` block.
///
/// # Safety
/// `cycle` is a live, configured cycle.
unsafe fn main_conf(cycle: *const ngx_cycle_t) -> Option<&'static MainConf> {
    // SAFETY: `cycle` is live and configured (this function's contract); our
    // slot in its http main confs holds the `MainConf` create_main_conf made,
    // in the cycle's pool, which outlives the worker's use of it.
    unsafe {
        (*cycle)
            .http_main_conf_unchecked::<MainConf>(crate::nginx::module::Module::module_ref())
            .map(|p| p.as_ref())
    }
}

/// `init_process`: sync once, report, and arm the timer. nginx calls it
/// once in each new worker with the live, configured cycle.
pub unsafe extern "C" fn init_process(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    ffi_guard("init process", NGX_OK as ngx_int_t, || {
        if let Err(e) = request_id::seed() {
            // SAFETY: `cycle` is the live cycle nginx passed in; its log
            // lives as long as it.
            let log = unsafe { (*cycle).log };
            ngx_log_error!(
                NGX_LOG_ALERT,
                log,
                "dynamic_balancer: {e}; $dynamic_request_id retries per request"
            );
        }
        // SAFETY: `cycle` is the live cycle nginx passed in.
        let mcf = unsafe { main_conf(cycle) };
        // Cache manager and loader processes run init_process too, and exit
        // without exit_process: only processes that serve requests register.
        // SAFETY: a plain read of a global nginx set before init_process.
        let serves = matches!(
            unsafe { ngx::ffi::ngx_process } as u32,
            ngx::ffi::NGX_PROCESS_WORKER | ngx::ffi::NGX_PROCESS_SINGLE
        );
        if let Some((metrics, mcf)) = mcf.filter(|_| serves).and_then(|m| Some((m.metrics_zone()?, m))) {
            // SAFETY: a plain read of a global nginx set before init_process.
            let pid = unsafe { ngx::ffi::ngx_pid } as i64;
            if !metrics_zone::start_worker(&metrics, pid, mcf.metrics_ctx.epoch) {
                // SAFETY: as above, for the cycle's log.
                let log = unsafe { (*cycle).log };
                ngx_log_error!(
                    NGX_LOG_ALERT,
                    log,
                    "dynamic_balancer_metrics_zone: more than {} live workers; this one does not count requests",
                    metrics_zone::LIVE_SLOTS
                );
            }
        }
        if let Some(settings) = mcf
            .filter(|_| serves)
            .and_then(|m| m.otel_exporter.clone().filter(|_| m.otel_used))
        {
            let counters = mcf.and_then(MainConf::metrics_zone).map(|m| m.otel_counters());
            let endpoint = settings.endpoint.clone();
            if let Err(e) = otel::queue::start(settings, counters) {
                // SAFETY: as above, for the cycle's log.
                let log = unsafe { (*cycle).log };
                ngx_log_error!(
                    NGX_LOG_ALERT,
                    log,
                    "dynamic_balancer_otel_exporter {endpoint}: {e}; this worker exports no spans"
                );
            }
        }
        let Some(zone) = mcf.and_then(MainConf::zone) else {
            if otel::queue::is_running() {
                // The timer writes the exporter's log lines.
                let timer = WorkerTimer::new(Some(on_timer), true);
                SYNC_TIMER.set(Some(timer));
                timer.arm(SYNC_INTERVAL_MS);
            }
            return NGX_OK as ngx_int_t;
        };
        worker_cache::observe(&zone);
        if let Some(path) = mcf.and_then(|m| m.state_file.as_deref()).filter(|_| serves) {
            state_file::start_worker(zone.clone(), path);
        }
        // SAFETY: a plain read of a global nginx set before init_process,
        // on the event-loop thread.
        if unsafe { ngx::ffi::ngx_worker } == 0 {
            external_names::start_refresher(zone.clone());
        }
        let timer = WorkerTimer::new(Some(on_timer), true);
        SYNC_TIMER.set(Some(timer));
        timer.arm(SYNC_INTERVAL_MS);
        NGX_OK as ngx_int_t
    })
}

/// The sync timer's handler: nginx calls it on the event loop with the
/// worker-owned event `init_process` armed.
unsafe extern "C" fn on_timer(ev: *mut ngx_event_t) {
    ffi_guard("sync timer", (), || {
        // SAFETY: `ev` is the WorkerTimer's event, leaked so it lives as long
        // as the process; its log is the cycle's.
        let log = unsafe { (*ev).log };
        external_names::drain_log(|level, line| {
            ngx_log_error!(level, log, "{line}");
        });
        state_file::drain_log(|level, line| {
            ngx_log_error!(level, log, "{line}");
        });
        otel::exporter::drain_log(|level, line| {
            ngx_log_error!(level, log, "{line}");
        });
        if worker::is_leaving() {
            external_names::stop();
            return;
        }
        // SAFETY: `ngx_cycle` is the worker's live, configured cycle, set
        // before init_process; only this thread changes it.
        if let Some(zone) = (unsafe { main_conf(ngx::ffi::ngx_cycle) }).and_then(MainConf::zone) {
            worker_cache::sweep(&zone);
            let generation = worker_cache::observe(&zone);
            worker_cache::report(&zone, generation);
        }
        if let Some(timer) = SYNC_TIMER.get() {
            timer.arm(SYNC_INTERVAL_MS);
        }
    })
}

/// `exit_process`: give up the status slot and drop the cache. nginx calls
/// it once as the worker exits, with its live cycle.
pub unsafe extern "C" fn exit_process(cycle: *mut ngx_cycle_t) {
    ffi_guard("exit process", (), || {
        external_names::stop();
        // The spans of the last requests go out, unless the collector does
        // not answer within the grace.
        otel::queue::stop(OTEL_FLUSH);
        // SAFETY: `cycle` is the live cycle nginx passed in; its log lives
        // as long as it.
        let cycle_log = unsafe { (*cycle).log };
        otel::exporter::drain_log(|level, line| {
            ngx_log_error!(level, cycle_log, "{line}");
        });
        // The last write's answer went out; its file must not be lost.
        let flushed = state_file::flush(STATE_FILE_FLUSH);
        // SAFETY: `cycle` is the live cycle nginx passed in; its log lives
        // as long as it.
        let log = unsafe { (*cycle).log };
        state_file::drain_log(|level, line| {
            ngx_log_error!(level, log, "{line}");
        });
        if !flushed {
            ngx_log_error!(
                NGX_LOG_ALERT,
                log,
                "dynamic_balancer: the state file's write did not finish within {} s; the worker leaves without it",
                STATE_FILE_FLUSH.as_secs()
            );
        }
        // SAFETY: `cycle` is the live cycle nginx passed in.
        let mcf = unsafe { main_conf(cycle) };
        if let Some(metrics) = mcf.and_then(MainConf::metrics_zone) {
            // SAFETY: a plain read of a global nginx set before init_process.
            metrics_zone::stop_worker(&metrics, unsafe { ngx::ffi::ngx_pid } as i64);
        }
        if let Some(zone) = mcf.and_then(MainConf::zone) {
            // SAFETY: plain reads of globals nginx set before init_process,
            // on the event-loop thread.
            let (worker, pid) = unsafe { (ngx::ffi::ngx_worker, ngx::ffi::ngx_pid) };
            zone.header().retire(worker, pid as i64);
            zone.header().index.release_slot();
            zone.header().table().release_reader_slot();
        }
        worker_cache::clear();
    })
}
