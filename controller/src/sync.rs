//! The reconcile loop, wired: four tasks joined by `watch` channels, each
//! holding only the newest value, so bursts coalesce by construction.
//!
//! ```text
//! snapshots ──► rebuild (model) ──┬──► push: PUT/DELETE per backend (fast path)
//!      quarantine ▲               └──► reload: render, nginx -t, write, reload,
//!                 └────────────────────  wait for new workers ──► "running" ──► push
//!                                        supervise: restart a dead master ──► "running"
//! ```
//!
//! The dynamic path never waits for a reload: endpoint changes reach nginx
//! while a slow reload is still in flight. It only holds back DELETEs of
//! backends the running nginx.conf still routes to, until the reload that
//! drops them has finished. Each step lives in its own module:
//! [`crate::rebuild`], [`crate::push`] (with the pure [`crate::diff`]),
//! [`crate::reload`] (with the quarantine of Ingresses nginx refuses) and
//! [`crate::supervise`]; what they share is in [`crate::state`].

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::model::{Model, Quarantine};
use crate::render::Renderer;
use crate::snapshot::Snapshot;
use crate::state::{Running, Settings, Shared};
use crate::{push, rebuild, reload, supervise};

/// [`run`] as a task of the current runtime (see
/// [`crate::source::cluster::spawn`] for why the library spawns it).
pub fn spawn(
    settings: Settings,
    renderer: Renderer,
    shared: Arc<Shared>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
) -> JoinHandle<()> {
    tokio::spawn(run(settings, renderer, shared, snapshots))
}

/// Runs until `snapshots` closes.
pub async fn run(
    settings: Settings,
    renderer: Renderer,
    shared: Arc<Shared>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
) {
    let (model_tx, model_rx) = watch::channel(Arc::new(Model::default()));
    let (running_tx, running_rx) = watch::channel(Running::default());
    let (quarantine_tx, quarantine_rx) = watch::channel(Quarantine::default());
    let running_tx = Arc::new(running_tx);
    let settings = Arc::new(settings);

    let modeller = tokio::spawn(rebuild::task(
        settings.clone(),
        shared.clone(),
        snapshots,
        quarantine_rx,
        model_tx,
    ));
    let dynamic = tokio::spawn(push::task(shared.clone(), model_rx.clone(), running_rx));
    let structural = tokio::spawn(reload::task(
        settings.clone(),
        renderer,
        shared.clone(),
        model_rx,
        running_tx.clone(),
        quarantine_tx,
    ));
    let supervisor = tokio::spawn(supervise::task(shared.clone(), running_tx));
    let _ = modeller.await;
    dynamic.abort();
    structural.abort();
    supervisor.abort();
}
