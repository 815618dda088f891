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
//! drops them has finished.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use lua_compat::wire::Backend;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::events::Events;
use crate::metrics::{unix_now, Metrics, QueueLabels};
use crate::model::{self, BuildOptions, Model, Structure};
use crate::nginx::{ApiClient, Nginx};
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
    let running_tx = Arc::new(running_tx);
    let settings = Arc::new(settings);

    let modeller = tokio::spawn(model_task(settings.clone(), shared.clone(), snapshots, model_tx));
    let dynamic = tokio::spawn(dynamic_task(shared.clone(), model_rx.clone(), running_rx));
    let structural = tokio::spawn(structural_task(
        settings.clone(),
        renderer,
        shared.clone(),
        model_rx,
        running_tx.clone(),
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
    models: watch::Sender<Arc<Model>>,
) {
    let mut reported: HashSet<String> = HashSet::new();
    loop {
        let snap = snapshots.borrow_and_update().clone();
        let opts = settings.build.clone();
        let Ok(model) = tokio::task::spawn_blocking(move || model::build(&snap, &opts)).await else {
            tracing::error!("the model builder panicked; keeping the previous model");
            if snapshots.changed().await.is_err() {
                return;
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
        if snapshots.changed().await.is_err() {
            return;
        }
    }
}

/// Pushes backend changes as they come. A failed push forgets what nginx
/// holds, so the next attempt is a full POST, retried with backoff.
async fn dynamic_task(
    shared: Arc<Shared>,
    mut models: watch::Receiver<Arc<Model>>,
    mut running: watch::Receiver<Running>,
) {
    let mut pushed: Option<BTreeMap<String, Backend>> = None;
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
            // A reload or restart: resend everything once, as the issue of
            // record asks (the zone survives reloads, not restarts).
            pushed = None;
            epoch = run.epoch;
        }
        let result = match &pushed {
            None => full_push(&shared, &model.backends)
                .await
                .map(|()| model.backends.clone()),
            Some(have) => delta_push(&shared, have, &model.backends, &run).await,
        };
        match result {
            Ok(now) => {
                pushed = Some(now);
                retry = false;
                backoff = Duration::from_millis(200);
                if !shared.ready.swap(true, Ordering::AcqRel) {
                    tracing::info!(backends = model.backends.len(), "first configuration applied; ready");
                }
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "pushing backends failed; will retry with a full push");
                pushed = None;
                retry = true;
            }
        }
    }
}

async fn full_push(shared: &Shared, desired: &BTreeMap<String, Backend>) -> anyhow::Result<()> {
    let started = Instant::now();
    let all: Vec<&Backend> = desired.values().collect();
    let r = shared.api.replace_all(&all).await;
    shared.metrics.push("post", r.is_ok());
    shared.metrics.push_duration.observe(started.elapsed().as_secs_f64());
    if r.is_ok() {
        tracing::info!(
            backends = all.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "pushed all backends"
        );
    }
    r
}

/// PUTs changed backends, DELETEs gone ones the running nginx.conf no
/// longer routes to, and returns what nginx now holds.
async fn delta_push(
    shared: &Shared,
    have: &BTreeMap<String, Backend>,
    desired: &BTreeMap<String, Backend>,
    run: &Running,
) -> anyhow::Result<BTreeMap<String, Backend>> {
    let puts: Vec<&Backend> = desired
        .iter()
        .filter(|(k, b)| have.get(*k) != Some(b))
        .map(|(_, b)| b)
        .collect();
    let deletes: Vec<&String> = have
        .keys()
        .filter(|k| !desired.contains_key(*k) && !run.referenced.contains(*k))
        .collect();
    if puts.is_empty() && deletes.is_empty() {
        return Ok(have.clone());
    }
    let depth = shared
        .metrics
        .queue_depth
        .get_or_create(&QueueLabels { path: "dynamic" })
        .clone();
    depth.set((puts.len() + deletes.len()) as i64);
    let started = Instant::now();
    let mut now = have.clone();
    let mut result = Ok(());
    for b in &puts {
        let r = shared
            .api
            .put(b)
            .await
            .with_context(|| format!("PUT backend {}", b.name));
        shared.metrics.push("put", r.is_ok());
        if r.is_err() {
            result = r;
            break;
        }
        now.insert(b.name.clone(), (*b).clone());
        depth.dec();
    }
    if result.is_ok() {
        for name in &deletes {
            let r = shared
                .api
                .delete(name)
                .await
                .with_context(|| format!("DELETE backend {name}"));
            shared.metrics.push("delete", r.is_ok());
            if r.is_err() {
                result = r;
                break;
            }
            now.remove(*name);
            depth.dec();
        }
    }
    depth.set(0);
    shared.metrics.push_duration.observe(started.elapsed().as_secs_f64());
    tracing::debug!(
        puts = puts.len(),
        deletes = deletes.len(),
        elapsed_us = started.elapsed().as_micros() as u64,
        "pushed backend changes"
    );
    result.map(|()| now)
}

async fn structural_task(
    settings: Arc<Settings>,
    renderer: Renderer,
    shared: Arc<Shared>,
    mut models: watch::Receiver<Arc<Model>>,
    running: Arc<watch::Sender<Running>>,
) {
    let mut applied: Option<Structure> = None;
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
        let structure = model.structure.clone().expect("pending implies a structure");
        let started = Instant::now();
        match apply(&settings, &renderer, &shared, &structure, &model).await {
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
                shared.metrics.reload_errors.inc();
                shared.metrics.last_reload_successful.set(0);
                tracing::error!(error = %format!("{e:#}"), "nginx configuration rejected; the running configuration is unchanged");
                if let Some(events) = shared.events.clone() {
                    let text = format!("{e:#}");
                    tokio::spawn(async move { events.reload(Some(&text)).await });
                }
                // Not retried until the structure changes: no hot loop.
                failed = Some(structure);
            }
        }
        depth.set(0);
    }
}

/// Render, test a candidate file, move it into place, then reload (or start)
/// nginx and wait for its new workers. Returns the config hash.
async fn apply(
    settings: &Settings,
    renderer: &Renderer,
    shared: &Shared,
    structure: &Structure,
    model: &Model,
) -> anyhow::Result<f64> {
    let text = renderer.render(structure, &settings.render)?;
    write_certificates(&settings.ssl_dir, &model.certificates)?;
    let candidate = settings.conf_dir.join(".nginx.conf.candidate");
    std::fs::write(&candidate, &text).with_context(|| format!("writing {}", candidate.display()))?;
    if let Err(e) = shared.nginx.test(&candidate).await {
        let rejected = settings.conf_dir.join("nginx.conf.rejected");
        let _ = std::fs::rename(&candidate, &rejected);
        return Err(e.context(format!("kept for inspection as {}", rejected.display())));
    }
    // rename(2) is atomic: nginx never reads a half-written file.
    std::fs::rename(&candidate, shared.nginx.conf_path()).context("moving nginx.conf into place")?;
    let expected = match structure.global.worker_processes {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    };
    if shared.nginx.master_pid().is_none() && shared.nginx.is_supervised() {
        shared.nginx.start()?;
        wait_for_workers(&shared.api, &HashSet::new(), expected, settings.reload_timeout).await?;
    } else {
        let old: HashSet<u32> = match shared.api.status().await {
            Ok(s) => s.workers.iter().map(|w| w.pid).collect(),
            Err(_) => HashSet::new(),
        };
        shared.nginx.reload()?;
        wait_for_workers(&shared.api, &old, expected, settings.reload_timeout).await?;
    }
    let digest = Sha256::digest(text.as_bytes());
    let mut first = [0u8; 8];
    first[2..].copy_from_slice(&digest[..6]);
    Ok(u64::from_be_bytes(first) as f64)
}

/// Polls `/configuration/status` until `expected` workers that are not in
/// `old` have registered: the new configuration is then serving.
async fn wait_for_workers(
    api: &ApiClient,
    old: &HashSet<u32>,
    expected: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(s) = api.status().await {
            let fresh = s.workers.iter().filter(|w| !old.contains(&w.pid)).count();
            if fresh >= expected {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!("new nginx workers did not report through /configuration/status within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes each PEM once under its content-addressed name (mode 0600) and
/// removes files no longer referenced.
fn write_certificates(dir: &std::path::Path, certs: &BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, pem) in certs {
        let path = dir.join(name);
        if path.exists() {
            continue;
        }
        let tmp = dir.join(format!(".{name}.tmp"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        std::io::Write::write_all(&mut f, pem)?;
        std::fs::rename(&tmp, &path)?;
    }
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.ends_with(".pem") && !certs.contains_key(&name) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// Restarts a supervised master that died, then asks for a full push.
async fn supervise(shared: Arc<Shared>, running: Arc<watch::Sender<Running>>) {
    loop {
        let status = shared.nginx.wait_exit().await;
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        tracing::error!(%status, "nginx master exited unexpectedly; restarting in 1 s");
        shared.metrics.nginx_restarts.inc();
        tokio::time::sleep(Duration::from_secs(1)).await;
        match shared.nginx.start() {
            Ok(_) => {
                if wait_for_workers(&shared.api, &HashSet::new(), 1, Duration::from_secs(30))
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
