//! The model task: builds the model again on every new snapshot or
//! quarantine, and reports each problem once, when it first appears.
//!
//! When only Services and EndpointSlices changed ([`snapshot::change`]),
//! the new model is the previous one with the backends of those Services
//! resolved again ([`model::update_endpoints`]): an endpoint change costs
//! the backends it touches, not a rebuild of every server. Anything else
//! (an Ingress, a Secret, the ConfigMap, the quarantine) builds in full.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::watch;

use crate::model::{self, BuildOptions, Model, Quarantine};
use crate::snapshot::{self, Change, Snapshot};
use crate::state::{Settings, Shared};

pub async fn task(
    settings: Arc<Settings>,
    shared: Arc<Shared>,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    mut quarantine: watch::Receiver<Quarantine>,
    models: watch::Sender<Arc<Model>>,
) {
    let mut reported: HashSet<String> = HashSet::new();
    // The last model built, and the snapshot and quarantine it was built from.
    let mut last: Option<(Arc<Model>, Quarantine)> = None;
    loop {
        let snap = snapshots.borrow_and_update().clone();
        let q = quarantine.borrow_and_update().clone();
        let opts = settings.build.clone();
        let prev = last.as_ref().filter(|(_, pq)| *pq == q).map(|(m, _)| m.clone());
        let started = std::time::Instant::now();
        let for_build = q.clone();
        let built = tokio::task::spawn_blocking(move || {
            let (mut model, kind) = build(prev.as_deref(), &snap, &opts, &for_build);
            model.snapshot = Some(snap);
            (model, kind)
        })
        .await;
        let Ok((model, kind)) = built else {
            tracing::error!("the model builder panicked; keeping the previous model");
            tokio::select! {
                r = snapshots.changed() => if r.is_err() { return },
                r = quarantine.changed() => if r.is_err() { return },
            }
            continue;
        };
        // Each problem is logged (and recorded as an Event) once, when it
        // first appears, not on every rebuild.
        let mut now = HashSet::with_capacity(model.problems.len());
        for report in &model.problems {
            let text = report.to_string();
            if !reported.contains(&text) {
                tracing::warn!(problem = %text, "invalid value ignored");
                if let Some(events) = shared.events.clone() {
                    let report = report.clone();
                    tokio::spawn(async move { events.refused(&report).await });
                }
            }
            now.insert(text);
        }
        reported = now;
        shared.metrics.invalid_values.set(model.problems.len() as i64);
        shared.metrics.model_built(kind, started.elapsed().as_secs_f64());
        shared.metrics.observe_model(&model);
        tracing::debug!(
            kind,
            elapsed_us = started.elapsed().as_micros() as u64,
            backends = model.backends.len(),
            "model built"
        );
        let model = Arc::new(model);
        last = Some((model.clone(), q));
        // The previous model is dropped here (unless a task still holds
        // it): after a full build, give its pages back.
        drop(models.send_replace(model));
        if kind == "full" {
            crate::memory::release_free_memory();
        }
        tokio::select! {
            r = snapshots.changed() => if r.is_err() { return },
            r = quarantine.changed() => if r.is_err() { return },
        }
    }
}

/// Builds the model for `snap`: from `prev` when only endpoints changed
/// since it was built, in full otherwise. Returns the kind of build, for
/// metrics and logs.
fn build(prev: Option<&Model>, snap: &Snapshot, opts: &BuildOptions, q: &Quarantine) -> (Model, &'static str) {
    let from = prev.and_then(|p| Some((p, p.snapshot.as_deref()?)));
    if let Some((prev, old)) = from {
        if let Change::Endpoints(services) = snapshot::change(old, snap) {
            if let Some(model) = model::update_endpoints(prev, snap, &services, opts) {
                return (model, "endpoints");
            }
        }
    }
    (model::build_with(snap, opts, q), "full")
}
