//! This worker's span queue: the sender half of the exporter thread's
//! bounded channel, the id generator, and the counters spans are counted
//! in. Started in `init_process` (after the fork: a thread or a random
//! stream must not be shared between workers), stopped in `exit_process`.

use std::cell::RefCell;
use std::time::Duration;

use lua_compat::otel::draft::SpanDraft;
use lua_compat::otel::ids::IdGenerator;
use lua_compat::otel::settings::ExporterSettings;

use super::exporter::{self, Exporter};
use crate::shm::metrics_zone::OtelCounters;

struct Worker {
    exporter: Exporter,
    counters: Option<&'static OtelCounters>,
}

thread_local! {
    /// Requests run on the event-loop thread only.
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
    static IDS: RefCell<Option<IdGenerator>> = const { RefCell::new(None) };
}

/// Starts this worker's exporter thread; `counters` is where its spans are
/// counted (none without a metrics zone).
pub fn start(settings: ExporterSettings, counters: Option<&'static OtelCounters>) -> Result<(), String> {
    let exporter = exporter::spawn(settings, counters)?;
    WORKER.with_borrow_mut(|w| *w = Some(Worker { exporter, counters }));
    Ok(())
}

/// Closes the queue and gives the thread up to `grace` to export what it
/// holds: a worker that is leaving should not lose the last seconds of
/// spans, nor wait on a collector that does not answer.
pub fn stop(grace: Duration) {
    if let Some(w) = WORKER.with_borrow_mut(Option::take) {
        w.exporter.stop(grace);
    }
}

/// Whether this worker exports spans (an exporter is configured and its
/// thread started).
pub fn is_running() -> bool {
    WORKER.with_borrow(Option::is_some)
}

/// Hands a finished span to the exporter without waiting: a full queue
/// drops it (counted), as the SDK's batch processor does.
pub fn enqueue(span: SpanDraft) {
    WORKER.with_borrow(|w| {
        let Some(w) = w else { return };
        let counter = if w.exporter.push(span) {
            w.counters.map(|c| &c.queued)
        } else {
            w.counters.map(|c| &c.dropped)
        };
        if let Some(c) = counter {
            OtelCounters::add(c, 1);
        }
    });
}

/// Calls `f` with this worker's id generator, seeded on first use (after
/// the fork, so per process).
pub fn with_ids<T>(f: impl FnOnce(&mut IdGenerator) -> T) -> Option<T> {
    IDS.with_borrow_mut(|g| {
        if g.is_none() {
            *g = IdGenerator::from_os().ok();
        }
        g.as_mut().map(f)
    })
}
