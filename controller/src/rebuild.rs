//! The model task: builds the model again on every new snapshot or
//! quarantine, and reports each problem once, when it first appears.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::watch;

use crate::model::{self, Model, Quarantine};
use crate::snapshot::Snapshot;
use crate::state::{Settings, Shared};

pub async fn task(
    settings: Arc<Settings>,
    shared: Arc<Shared>,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    mut quarantine: watch::Receiver<Quarantine>,
    models: watch::Sender<Arc<Model>>,
) {
    let mut reported: HashSet<String> = HashSet::new();
    loop {
        let snap = snapshots.borrow_and_update().clone();
        let q = quarantine.borrow_and_update().clone();
        let opts = settings.build.clone();
        let built = tokio::task::spawn_blocking(move || {
            let mut model = model::build_with(&snap, &opts, &q);
            model.snapshot = Some(snap);
            model
        })
        .await;
        let Ok(model) = built else {
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
        // The previous model is dropped here (unless a task still holds
        // it): give its pages back.
        drop(models.send_replace(Arc::new(model)));
        crate::memory::release_free_memory();
        tokio::select! {
            r = snapshots.changed() => if r.is_err() { return },
            r = quarantine.changed() => if r.is_err() { return },
        }
    }
}
