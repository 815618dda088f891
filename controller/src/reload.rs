//! The structural path: render, write certificates, `nginx -t` a candidate,
//! `rename(2)` it into place, reload (or start) nginx and wait for its new
//! workers; and, when `nginx -t` refuses a configuration, find the
//! Ingresses responsible so that the rest can still be applied.
//!
//! **Quarantine.** One tenant's value that nginx refuses (however it got
//! past validation) must not hold back every other tenant's changes. When
//! a candidate fails, the Ingresses that changed since the last applied
//! configuration are the suspects. The configuration is built again
//! without suspects until it passes: first without the Ingress whose
//! rendered lines nginx's message points at, otherwise by halving the
//! suspects. Each Ingress found is quarantined (left out, with a Warning
//! Event carrying nginx's message) until it changes; everything else is
//! applied. A failure no Ingress explains (the ConfigMap, a replaced
//! template) leaves the running configuration untouched, as before.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use anyhow::Context as _;
use sha2::{Digest, Sha256};

use crate::metrics::unix_now;
use crate::model::{self, Model, Quarantine, Quarantined, Structure};
use crate::nginx::ApiClient;
use crate::render::Renderer;
use crate::snapshot::Snapshot;
use crate::state::{Running, Settings, Shared};

/// Most `nginx -t` runs one quarantine search may take.
const MAX_TESTS: usize = 48;

/// Renders `structure` into a candidate file, checks the files it names
/// ([`crate::file_check`]) and runs `nginx -t` on it. Returns the rendered
/// text, or the refusal (nginx's message, or the file check's in the same
/// form). Certificates are not in it: they are pushed to the module.
pub async fn test_candidate(
    settings: &Settings,
    renderer: &Renderer,
    shared: &Shared,
    structure: &Arc<Structure>,
) -> anyhow::Result<String> {
    let text = write_candidate(settings, renderer, shared, structure)?;
    let testing = Instant::now();
    shared.nginx.test(&candidate_path(settings)).await?;
    tracing::debug!(
        test_us = testing.elapsed().as_micros() as u64,
        bytes = text.len(),
        "candidate passed nginx -t"
    );
    Ok(text)
}

/// Renders `structure` into the candidate file after the file check, with
/// the basic-auth files it names; `nginx -t` is the caller's.
fn write_candidate(
    settings: &Settings,
    renderer: &Renderer,
    shared: &Shared,
    structure: &Arc<Structure>,
) -> anyhow::Result<String> {
    shared.metrics.renders.inc();
    let rendering = Instant::now();
    let text = renderer.render(structure, &settings.render)?;
    let render_us = rendering.elapsed().as_micros() as u64;
    let candidate = candidate_path(settings);
    let checking = Instant::now();
    crate::file_check::check(&text, &candidate, &settings.file_roots).map_err(|r| {
        tracing::error!(refusal = %r.message, "a rendered configuration names a file it may not; nginx is not given it");
        anyhow::anyhow!("the configuration names a file it may not: {}", r.message)
    })?;
    tracing::debug!(
        elapsed_us = checking.elapsed().as_micros() as u64,
        bytes = text.len(),
        "file check of the candidate"
    );
    // The basic-auth user files the candidate names (new names only: a
    // running configuration's files are never rewritten).
    crate::auth_files::write_all(&settings.conf_dir, &structure.auth_files)?;
    crate::staging::verify(&settings.staging_dir)?;
    std::fs::write(&candidate, &text).with_context(|| format!("writing {}", candidate.display()))?;
    tracing::debug!(render_us, bytes = text.len(), "candidate rendered");
    Ok(text)
}

/// The candidate's name ends with `.candidate`: [`blamed_ingress`] finds
/// nginx's line numbers by it.
fn candidate_path(settings: &Settings) -> std::path::PathBuf {
    settings.staging_dir.join("nginx.conf.candidate")
}

/// Applies a model whose candidate passed `nginx -t` (its text is `text`):
/// moves it into place, reloads or starts nginx, and waits for the new
/// workers. Returns the config hash.
pub async fn apply_tested(
    settings: &Settings,
    shared: &Shared,
    structure: &Structure,
    text: &str,
) -> anyhow::Result<f64> {
    // rename(2) is atomic: nginx never reads a half-written file.
    std::fs::rename(candidate_path(settings), shared.nginx.conf_path()).context("moving nginx.conf into place")?;
    let expected = expected_workers(structure);
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
    Ok(applied(settings, structure, text))
}

/// Starts nginx for the first time on a candidate `nginx -t` has not
/// checked: the start parses it anyway, and a configuration nginx refuses
/// makes the master exit at once. Then `nginx -t` on the same text tells
/// why, and its refusal goes to the quarantine search as a failed test's
/// would. A start that fails although the configuration passes (a port
/// taken) is retried under the supervisor, as any start.
pub async fn apply_untested(
    settings: &Settings,
    shared: &Shared,
    structure: &Structure,
    text: &str,
) -> anyhow::Result<f64> {
    let conf = shared.nginx.conf_path();
    std::fs::rename(candidate_path(settings), conf).context("moving nginx.conf into place")?;
    let expected = expected_workers(structure);
    shared.nginx.start_untested()?;
    let exited = async {
        loop {
            if let Some(status) = shared.nginx.untested_exit() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let none = HashSet::new();
    let served = tokio::select! {
        waited = wait_for_workers(&shared.api, &none, expected, settings.reload_timeout) => {
            shared.nginx.prove().map(|()| waited)
        }
        status = exited => Err(status),
    };
    match served {
        Ok(waited) => waited?,
        Err(status) => {
            // Named as a candidate, so that the search reads nginx's lines.
            std::fs::copy(conf, candidate_path(settings)).context("copying nginx.conf to test it")?;
            shared
                .nginx
                .test(&candidate_path(settings))
                .await
                .with_context(|| format!("nginx exited on its first configuration ({status})"))?;
            tracing::warn!(%status, "nginx exited on its first start although its configuration passes nginx -t; starting it again under supervision");
            let _ = std::fs::remove_file(candidate_path(settings));
            shared.nginx.start()?;
            wait_for_workers(&shared.api, &none, expected, settings.reload_timeout).await?;
        }
    }
    Ok(applied(settings, structure, text))
}

fn expected_workers(structure: &Structure) -> usize {
    match structure.global.worker_processes {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    }
}

/// After a configuration is in place and served: removes the files neither
/// it nor the one before names (its old workers may still be finishing
/// requests), and returns its hash.
fn applied(settings: &Settings, structure: &Structure, text: &str) -> f64 {
    crate::auth_files::remove_stale(&settings.conf_dir, &structure.auth_files);
    let digest = Sha256::digest(text.as_bytes());
    let mut first = [0u8; 8];
    first[2..].copy_from_slice(&digest[..6]);
    u64::from_be_bytes(first) as f64
}

/// Keeps a rejected candidate for inspection.
pub fn keep_rejected(settings: &Settings) -> std::path::PathBuf {
    let rejected = settings.conf_dir.join("nginx.conf.rejected");
    let _ = std::fs::rename(candidate_path(settings), &rejected);
    rejected
}

/// Polls `/configuration/status` until `expected` workers that are not in
/// `old` have registered: the new configuration is then serving.
pub async fn wait_for_workers(
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

/// The line number nginx's message gives in the file whose name ends with
/// `file` (`... in /path/<file>:123`).
pub fn message_line(message: &str, file: &str) -> Option<usize> {
    let marker = format!("{file}:");
    let at = message.rfind(&marker)? + marker.len();
    message[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// The Ingress whose rendered lines nginx's message points at
/// (`... in /path/.nginx.conf.candidate:123`): the nearest `# ns/name`
/// comment above that line, which the template writes before every
/// location.
pub fn blamed_ingress(message: &str, text: &str, known: &BTreeSet<String>) -> Option<String> {
    let line = message_line(message, ".candidate")?;
    let lines: Vec<&str> = text.lines().collect();
    lines[..line.min(lines.len())]
        .iter()
        .rev()
        .take_while(|l| !l.trim_start().starts_with("## start server"))
        .filter_map(|l| l.trim().strip_prefix("# "))
        .find(|k| known.contains(*k))
        .map(str::to_string)
}

/// What a quarantine search concluded.
pub struct Found {
    /// The new quarantine (the old one plus the Ingresses found).
    pub quarantine: Quarantine,
    /// The Ingresses found, with nginx's message for each.
    pub culprits: Vec<(String, String)>,
}

/// Finds the Ingresses to leave out so that `model` passes `nginx -t`.
/// `applied` are the fingerprints of the last applied configuration; only
/// Ingresses that differ from it are suspected. `None` when the failure
/// cannot be pinned on them.
#[allow(clippy::too_many_arguments)]
pub async fn search(
    settings: &Arc<Settings>,
    renderer: &Renderer,
    shared: &Shared,
    snapshot: Arc<Snapshot>,
    model: &Model,
    quarantine: &Quarantine,
    applied: &BTreeMap<String, String>,
    error: &str,
) -> Option<Found> {
    let suspects: Vec<String> = model
        .fingerprints
        .iter()
        .filter(|(k, v)| applied.get(*k) != Some(*v) && !quarantine.0.contains_key(*k))
        .map(|(k, _)| k.clone())
        .collect();
    if suspects.is_empty() {
        return None;
    }
    let mut tester = Tester {
        settings,
        renderer,
        shared,
        snapshot,
        model,
        base: quarantine.clone(),
        tests: 0,
    };
    let known: BTreeSet<String> = suspects.iter().cloned().collect();
    shared.metrics.renders.inc();
    let last_text = renderer
        .render(model.structure.as_ref()?, &settings.render)
        .unwrap_or_default();
    let mut culprits: Vec<(String, String)> = Vec::new();
    let mut error = error.to_string();
    let mut text = last_text;
    // Can the failure be pinned on the suspects at all?
    let all: Vec<String> = suspects.clone();
    if tester.passes(&[], &all).await.is_err() {
        return None;
    }
    loop {
        let found: Vec<String> = culprits.iter().map(|(k, _)| k.clone()).collect();
        let left: Vec<String> = suspects.iter().filter(|s| !found.contains(s)).cloned().collect();
        let hint = blamed_ingress(&error, &text, &known).filter(|h| left.contains(h));
        let culprit = tester.find_one(&found, left, hint).await?;
        culprits.push((culprit, error.clone()));
        let found: Vec<String> = culprits.iter().map(|(k, _)| k.clone()).collect();
        match tester.passes(&found, &[]).await {
            Ok(()) => break,
            Err((e, t)) => {
                error = e;
                text = t;
            }
        }
        if tester.tests >= MAX_TESTS {
            return None;
        }
    }
    let mut q = quarantine.clone();
    for (key, reason) in &culprits {
        let fingerprint = model.fingerprints.get(key).cloned().unwrap_or_default();
        q.0.insert(
            key.clone(),
            Quarantined {
                fingerprint,
                reason: reason.clone(),
            },
        );
    }
    Some(Found {
        quarantine: q,
        culprits,
    })
}

struct Tester<'a> {
    settings: &'a Arc<Settings>,
    renderer: &'a Renderer,
    shared: &'a Shared,
    snapshot: Arc<Snapshot>,
    model: &'a Model,
    base: Quarantine,
    tests: usize,
}

impl Tester<'_> {
    /// Whether the configuration passes without `excluded` and `more`
    /// (besides the base quarantine); the error and text when it does not.
    async fn passes(&mut self, excluded: &[String], more: &[String]) -> Result<(), (String, String)> {
        self.tests += 1;
        let mut q = self.base.clone();
        for key in excluded.iter().chain(more) {
            let fingerprint = self.model.fingerprints.get(key).cloned().unwrap_or_default();
            q.0.insert(
                key.clone(),
                Quarantined {
                    fingerprint,
                    reason: String::new(),
                },
            );
        }
        let (snap, opts) = (self.snapshot.clone(), self.settings.build.clone());
        let built = tokio::task::spawn_blocking(move || model::build_with(&snap, &opts, &q))
            .await
            .map_err(|e| (e.to_string(), String::new()))?;
        let Some(structure) = built.structure.as_ref() else {
            return Err(("no structure".into(), String::new()));
        };
        self.shared.metrics.renders.inc();
        let text = self
            .renderer
            .render(structure, &self.settings.render)
            .unwrap_or_default();
        match test_candidate(self.settings, self.renderer, self.shared, structure).await {
            Ok(_) => Ok(()),
            Err(e) => Err((format!("{e:#}"), text)),
        }
    }

    /// One Ingress of `set` whose removal (with `found`) makes the
    /// configuration pass; `set` as a whole is known to. Tries `hint`
    /// first, then halves the set, keeping a half out while searching the
    /// other when both are needed.
    async fn find_one(&mut self, found: &[String], mut set: Vec<String>, hint: Option<String>) -> Option<String> {
        let mut base: Vec<String> = found.to_vec();
        if let Some(h) = hint {
            if self.passes(&base, std::slice::from_ref(&h)).await.is_ok() {
                return Some(h);
            }
        }
        while set.len() > 1 {
            if self.tests >= MAX_TESTS {
                return None;
            }
            let second = set.split_off(set.len() / 2);
            if self.passes(&base, &set).await.is_ok() {
                continue;
            }
            base.extend(set);
            set = second;
        }
        set.pop()
    }
}

pub async fn task(
    settings: Arc<Settings>,
    renderer: Renderer,
    shared: Arc<Shared>,
    mut models: watch::Receiver<Arc<Model>>,
    running: Arc<watch::Sender<Running>>,
    quarantine: watch::Sender<Quarantine>,
) {
    let mut applied: Option<Arc<Structure>> = None;
    let mut applied_prints: Arc<BTreeMap<String, String>> = Arc::default();
    let mut failed: Option<Arc<Structure>> = None;
    let depth = shared.metrics.queue("structural");
    let mut retry = false;
    loop {
        if retry {
            retry = false;
            tokio::time::sleep(Duration::from_secs(1)).await;
        } else if models.changed().await.is_err() {
            return;
        }
        // An endpoint change shares the previous model's structure: the
        // pointer tells, without comparing thousands of servers.
        let pending =
            |m: &Model| m.structure.is_some() && !same(&m.structure, &applied) && !same(&m.structure, &failed);
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
        // The first start parses the configuration itself; a separate
        // `nginx -t` only runs if it fails.
        let first_start = applied.is_none() && shared.nginx.is_supervised() && shared.nginx.master_pid().is_none();
        let tested = if first_start {
            write_candidate(&settings, &renderer, &shared, &structure)
        } else {
            test_candidate(&settings, &renderer, &shared, &structure).await
        };
        let applying = Instant::now();
        let result = match tested {
            Ok(text) if first_start => apply_untested(&settings, &shared, &structure, &text).await,
            Ok(text) => apply_tested(&settings, &shared, &structure, &text).await,
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
                shared.worker_shutdown_timeout.store(
                    u64::from(structure.global.worker_shutdown_timeout.0),
                    std::sync::atomic::Ordering::Release,
                );
                tracing::info!(
                    elapsed_ms = elapsed.as_millis() as u64,
                    reload_ms = applying.elapsed().as_millis() as u64,
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
                crate::memory::release_free_memory();
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
                let rejected = keep_rejected(&settings);
                let message = format!("{e:#}");
                shared.metrics.reload_failed();
                // Not retried until the structure changes: no hot loop.
                failed = Some(structure);
                let found = match model.snapshot.clone() {
                    Some(snap) => {
                        let q = quarantine.borrow().clone();
                        search(
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

/// Whether two structures are equal: the same one, or equal ones.
fn same(a: &Option<Arc<Structure>>, b: &Option<Arc<Structure>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        (None, None) => true,
        _ => false,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_messages_point_at_the_ingress_above_the_line() {
        let text = "http {\n## start server a.example\n        # team-a/web\n        location / {\n            limit_conn x 70000;\n        }\n        # team-b/api\n        location /api {\n        }\n";
        let known: BTreeSet<String> = ["team-a/web".to_string(), "team-b/api".to_string()].into();
        let msg =
            "nginx -t failed: nginx: [emerg] connection limit must be less 65536 in /etc/nginx/.nginx.conf.candidate:5";
        assert_eq!(blamed_ingress(msg, text, &known).as_deref(), Some("team-a/web"));
        let msg = "nginx: [emerg] x in /etc/nginx/.nginx.conf.candidate:8";
        assert_eq!(blamed_ingress(msg, text, &known).as_deref(), Some("team-b/api"));
        // A line above every location (a server-level directive) blames nobody.
        let msg = "nginx: [emerg] x in /etc/nginx/.nginx.conf.candidate:2";
        assert_eq!(blamed_ingress(msg, text, &known), None);
        assert_eq!(blamed_ingress("no line here", text, &known), None);
    }
}
