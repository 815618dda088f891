//! The reconcile loop: three tasks joined by `watch` channels, each holding
//! only the newest value, so bursts coalesce by construction.
//!
//! ```text
//! snapshots ──► model ──┬──► dynamic: PUT/DELETE per backend (fast path)
//!                       └──► structural: render, nginx -t, write, reload,
//!                            wait for new workers ──► "running" ──► full POST
//! ```
//!
//! The dynamic path never waits for a reload: endpoint changes reach nginx
//! while a slow reload is still in flight. It only holds back DELETEs of
//! backends the running nginx.conf still routes to, until the reload that
//! drops them has finished. Its steps are in [`crate::push`]; the
//! structural path's, with the quarantine of Ingresses nginx refuses, in
//! [`crate::reload`].

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::events::Events;
use crate::metrics::{unix_now, Metrics, QueueLabels};
use crate::model::{self, BuildOptions, Model, Quarantine, Structure};
use crate::nginx::{ApiClient, Nginx};
use crate::push::Pusher;
use crate::reload;
use crate::render::{RenderContext, Renderer};
use crate::snapshot::Snapshot;

pub struct Settings {
    pub build: BuildOptions,
    pub render: RenderContext,
    pub conf_dir: PathBuf,
    pub ssl_dir: PathBuf,
    /// How long a structural change waits for more changes before rendering.
    pub settle: Duration,
    /// How long new workers may take to report after a reload.
    pub reload_timeout: Duration,
}

/// State shared with the HTTP endpoints.
pub struct Shared {
    pub metrics: Metrics,
    pub ready: AtomicBool,
    pub nginx: Arc<Nginx>,
    pub api: ApiClient,
    /// Set at shutdown so the supervisor stops restarting nginx.
    pub stopping: AtomicBool,
    /// Kubernetes Events, in cluster mode.
    pub events: Option<Events>,
}

/// What the running nginx was last loaded with.
#[derive(Clone, Default)]
struct Running {
    /// Bumped on every (re)load and master restart; 0 = nginx not up yet.
    epoch: u64,
    /// Backends referenced by the running nginx.conf.
    referenced: BTreeSet<String>,
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

    let modeller = tokio::spawn(model_task(
        settings.clone(),
        shared.clone(),
        snapshots,
        quarantine_rx,
        model_tx,
    ));
    let dynamic = tokio::spawn(dynamic_task(shared.clone(), model_rx.clone(), running_rx));
    let structural = tokio::spawn(structural_task(
        settings.clone(),
        renderer,
        shared.clone(),
        model_rx,
        running_tx.clone(),
        quarantine_tx,
    ));
    let supervisor = tokio::spawn(supervise(shared.clone(), running_tx));
    let _ = modeller.await;
    dynamic.abort();
    structural.abort();
    supervisor.abort();
}

async fn model_task(
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
        models.send_replace(Arc::new(model));
        tokio::select! {
            r = snapshots.changed() => if r.is_err() { return },
            r = quarantine.changed() => if r.is_err() { return },
        }
    }
}

/// Pushes backend changes as they come (see [`crate::push`]). A push that
/// failed is retried in full with backoff; a refused backend is not.
async fn dynamic_task(
    shared: Arc<Shared>,
    mut models: watch::Receiver<Arc<Model>>,
    mut running: watch::Receiver<Running>,
) {
    let mut pusher = Pusher::default();
    let mut epoch = 0;
    let mut backoff = Duration::from_millis(200);
    let mut retry = false;
    loop {
        if retry {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = running.changed() => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        } else {
            tokio::select! {
                r = models.changed() => if r.is_err() { return },
                r = running.changed() => if r.is_err() { return },
            }
        }
        let model = models.borrow_and_update().clone();
        let run = running.borrow_and_update().clone();
        if run.epoch == 0 || model.structure.is_none() {
            retry = false;
            continue;
        }
        if run.epoch != epoch {
            // A reload or restart: resend everything once (the zone
            // survives reloads, not restarts).
            pusher.forget();
            epoch = run.epoch;
        }
        match pusher.round(&shared, &model, &run.referenced).await {
            Ok(()) => {
                retry = false;
                backoff = Duration::from_millis(200);
                if !shared.ready.swap(true, Ordering::AcqRel) {
                    tracing::info!(backends = model.backends.len(), "first configuration applied; ready");
                }
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "pushing backends failed; will retry with a full push");
                retry = true;
            }
        }
    }
}

async fn structural_task(
    settings: Arc<Settings>,
    renderer: Renderer,
    shared: Arc<Shared>,
    mut models: watch::Receiver<Arc<Model>>,
    running: Arc<watch::Sender<Running>>,
    quarantine: watch::Sender<Quarantine>,
) {
    let mut applied: Option<Structure> = None;
    let mut applied_prints: BTreeMap<String, String> = BTreeMap::new();
    let mut failed: Option<Structure> = None;
    let depth = shared
        .metrics
        .queue_depth
        .get_or_create(&QueueLabels { path: "structural" })
        .clone();
    let mut retry = false;
    loop {
        if retry {
            retry = false;
            tokio::time::sleep(Duration::from_secs(1)).await;
        } else if models.changed().await.is_err() {
            return;
        }
        let pending = |m: &Model| m.structure.is_some() && m.structure != applied && m.structure != failed;
        if !pending(&models.borrow()) {
            continue;
        }
        depth.set(1);
        // Coalesce: whatever else arrives while we settle joins this reload.
        if applied.is_some() {
            tokio::time::sleep(settings.settle).await;
        }
        let model = models.borrow_and_update().clone();
        if !pending(&model) {
            depth.set(0);
            continue;
        }
        lift_quarantine(&quarantine, &model, &shared);
        let structure = model.structure.clone().expect("pending implies a structure");
        let started = Instant::now();
        let tested = reload::test_candidate(&settings, &renderer, &shared, &structure, &model.certificates).await;
        let result = match tested {
            Ok(text) => reload::apply_tested(&settings, &shared, &structure, &model, &text).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(hash) => {
                let elapsed = started.elapsed();
                let m = &shared.metrics;
                m.reload_success.inc();
                m.last_reload_successful.set(1);
                m.last_reload_successful_timestamp.set(unix_now());
                m.config_hash.set(hash);
                m.reload_duration.observe(elapsed.as_secs_f64());
                tracing::info!(
                    elapsed_ms = elapsed.as_millis() as u64,
                    servers = structure.servers.len(),
                    "nginx configuration applied"
                );
                let referenced = structure
                    .servers
                    .iter()
                    .flat_map(|s| {
                        s.locations
                            .iter()
                            .map(|l| l.backend.clone())
                            .chain(s.error_pages.iter().map(|e| e.backend.clone()))
                    })
                    .collect();
                running.send_modify(|r| {
                    r.epoch += 1;
                    r.referenced = referenced;
                });
                applied = Some(structure);
                applied_prints = model.fingerprints.clone();
                failed = None;
                if let Some(events) = shared.events.clone() {
                    tokio::spawn(async move { events.reload(None).await });
                }
            }
            Err(e) if !shared.nginx.is_supervised() && shared.nginx.master_pid().is_none() => {
                // An external nginx that is not up yet: the file is in
                // place; signal it once it runs.
                tracing::warn!(error = %format!("{e:#}"), "waiting for the external nginx (--nginx-pid-file) to start");
                retry = true;
            }
            Err(e) => {
                let rejected = reload::keep_rejected(&settings);
                let message = format!("{e:#}");
                shared.metrics.reload_errors.inc();
                shared.metrics.last_reload_successful.set(0);
                // Not retried until the structure changes: no hot loop.
                failed = Some(structure);
                let found = match model.snapshot.clone() {
                    Some(snap) => {
                        let q = quarantine.borrow().clone();
                        reload::search(
                            &settings,
                            &renderer,
                            &shared,
                            snap,
                            &model,
                            &q,
                            &applied_prints,
                            &message,
                        )
                        .await
                    }
                    None => None,
                };
                match found {
                    Some(found) => {
                        for (ingress, reason) in &found.culprits {
                            tracing::error!(%ingress, error = %reason, "nginx refused the configuration of this Ingress; it is quarantined (left out) until it changes, and the rest is applied");
                            if let Some(events) = shared.events.clone() {
                                let (ingress, reason) = (ingress.clone(), reason.clone());
                                tokio::spawn(async move { events.quarantined(&ingress, &reason).await });
                            }
                        }
                        shared
                            .metrics
                            .quarantined_ingresses
                            .set(found.quarantine.0.len() as i64);
                        // The model task rebuilds without them; that model
                        // is applied as any other.
                        quarantine.send_replace(found.quarantine);
                    }
                    None => {
                        tracing::error!(error = %message, kept = %rejected.display(), "nginx configuration rejected and no Ingress explains it; the running configuration is unchanged");
                        if let Some(events) = shared.events.clone() {
                            tokio::spawn(async move { events.reload(Some(&message)).await });
                        }
                    }
                }
            }
        }
        depth.set(0);
    }
}

/// Lifts the quarantine of Ingresses that changed (they are in this model
/// again) or no longer exist.
fn lift_quarantine(quarantine: &watch::Sender<Quarantine>, model: &Model, shared: &Shared) {
    let stale: Vec<String> = quarantine
        .borrow()
        .0
        .iter()
        .filter(|(k, q)| model.fingerprints.get(*k) != Some(&q.fingerprint))
        .map(|(k, _)| k.clone())
        .collect();
    if !stale.is_empty() {
        quarantine.send_modify(|q| {
            for k in &stale {
                q.0.remove(k);
            }
        });
        shared
            .metrics
            .quarantined_ingresses
            .set(quarantine.borrow().0.len() as i64);
    }
}

/// Restarts a supervised master that died, then asks for a full push. A
/// master that had been running is restarted at once (50 ms); one that dies
/// right after it starts (a port taken, a broken binary) is restarted with
/// a growing delay, up to 10 s, so a broken installation does not loop hot.
async fn supervise(shared: Arc<Shared>, running: Arc<watch::Sender<Running>>) {
    let mut delay = Duration::from_millis(50);
    loop {
        let status = shared.nginx.wait_exit().await;
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        if shared.nginx.uptime() > Duration::from_secs(2) {
            delay = Duration::from_millis(50);
        }
        tracing::error!(%status, delay_ms = delay.as_millis() as u64, "nginx master exited unexpectedly; restarting");
        shared.metrics.nginx_restarts.inc();
        tokio::time::sleep(delay).await;
        delay = (delay * 4).min(Duration::from_secs(10));
        match shared.nginx.start() {
            Ok(_) => {
                if reload::wait_for_workers(&shared.api, &HashSet::new(), 1, Duration::from_secs(30))
                    .await
                    .is_ok()
                {
                    running.send_modify(|r| r.epoch += 1);
                }
            }
            Err(e) => tracing::error!(error = %format!("{e:#}"), "restarting nginx failed"),
        }
    }
}
