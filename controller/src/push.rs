//! The dynamic path: backend changes pushed to the module, never a reload.
//!
//! What the module holds is tracked, so a change costs one `PUT` or
//! `DELETE` per backend that changed. After a reload or restart, or after a
//! push failed, everything is sent again in one `POST`.
//!
//! One tenant's bad backend must not hold back anyone else's. The model
//! already validates every backend with the module's validator, but the
//! module can still refuse one (an `ExternalName` that resolves to a
//! loopback address). A refusal (400) is therefore never retried as is: a
//! refused `POST` falls back to one `PUT` per backend to find the refused
//! ones, then `POST`s the rest; a refused backend is left out, reported on
//! its Service and in `..._refused_backends`, and sent again only once it
//! changes. Only failures that may pass later (no connection, a full zone,
//! a 5xx) are retried, with backoff.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use lua_compat::wire::Backend;

use crate::diff::plan;
use crate::model::{Model, Report};
use crate::nginx::PushError;
use crate::state::{Running, Shared};

/// The pusher's memory between rounds.
#[derive(Default)]
pub struct Pusher {
    /// What the module holds; `None` when unknown (then the next round is a
    /// full `POST`).
    pushed: Option<BTreeMap<String, Arc<Backend>>>,
    /// Backends the module refused, as they were refused.
    refused: BTreeMap<String, Arc<Backend>>,
}

impl Pusher {
    /// Forgets what the module holds (a reload, a restart): the next round
    /// sends everything.
    pub fn forget(&mut self) {
        self.pushed = None;
    }

    /// Brings the module to `model`'s backends. `Err` means "retry later".
    pub async fn round(
        &mut self,
        shared: &Shared,
        model: &Model,
        still_routed: &BTreeSet<String>,
    ) -> anyhow::Result<()> {
        // A refused backend is sent again only once it changes.
        self.refused
            .retain(|name, b| model.backends.get(name).is_some_and(|m| Arc::ptr_eq(m, b) || m == b));
        let result = match self.pushed.take() {
            None => self.full(shared, model).await,
            Some(have) => self.delta(shared, model, have, still_routed).await,
        };
        shared.metrics.refused_backends.set(self.refused.len() as i64);
        if result.is_err() {
            self.pushed = None;
        }
        result
    }

    /// The model's backends but those the module refused.
    fn desired(&self, model: &Model) -> BTreeMap<String, Arc<Backend>> {
        model
            .backends
            .iter()
            .filter(|(name, _)| !self.refused.contains_key(*name))
            .map(|(k, b)| (k.clone(), b.clone()))
            .collect()
    }

    async fn full(&mut self, shared: &Shared, model: &Model) -> anyhow::Result<()> {
        let desired = self.desired(model);
        let started = Instant::now();
        let all: Vec<&Backend> = desired.values().map(|b| &**b).collect();
        let r = shared.api.replace_all(&all).await;
        shared.metrics.push_duration.observe(started.elapsed().as_secs_f64());
        match r {
            Ok(()) => {
                shared.metrics.push("post", true);
                tracing::info!(
                    backends = all.len(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "pushed all backends"
                );
                self.pushed = Some(desired);
                Ok(())
            }
            Err(PushError::Failed(e)) => {
                shared.metrics.push("post", false);
                Err(e.context("POST /configuration/backends"))
            }
            Err(PushError::Refused { body, .. }) => {
                shared.metrics.push_result("post", "refused");
                tracing::warn!(error = %body, "the module refused the full push; finding the refused backends one by one");
                self.isolate(shared, model, desired).await
            }
        }
    }

    /// After a refused `POST`: `PUT`s every backend to learn which ones the
    /// module refuses, then `POST`s the others, so that the module holds
    /// exactly the accepted set.
    async fn isolate(
        &mut self,
        shared: &Shared,
        model: &Model,
        mut desired: BTreeMap<String, Arc<Backend>>,
    ) -> anyhow::Result<()> {
        let names: Vec<String> = desired.keys().cloned().collect();
        for name in names {
            let b = desired[&name].clone();
            match shared.api.put(&b).await {
                Ok(()) => shared.metrics.push("put", true),
                Err(PushError::Refused { body, .. }) => {
                    self.refuse(shared, model, b, &body);
                    desired.remove(&name);
                }
                Err(PushError::Failed(e)) => {
                    shared.metrics.push("put", false);
                    return Err(e.context(format!("PUT backend {name}")));
                }
            }
        }
        let all: Vec<&Backend> = desired.values().map(|b| &**b).collect();
        match shared.api.replace_all(&all).await {
            Ok(()) => {
                shared.metrics.push("post", true);
                self.pushed = Some(desired);
                Ok(())
            }
            Err(e) => {
                shared.metrics.push("post", false);
                Err(anyhow::anyhow!("POST of the accepted backends: {e}"))
            }
        }
    }

    /// Sends what changed since `have` (what the module holds); leaves the
    /// new state in `self.pushed`.
    async fn delta(
        &mut self,
        shared: &Shared,
        model: &Model,
        have: BTreeMap<String, Arc<Backend>>,
        still_routed: &BTreeSet<String>,
    ) -> anyhow::Result<()> {
        let plan = plan(&have, &model.backends, still_routed, |n| self.refused.contains_key(n));
        if plan.puts.is_empty() && plan.deletes.is_empty() {
            self.pushed = Some(have);
            return Ok(());
        }
        let depth = shared.metrics.queue("dynamic");
        depth.set((plan.puts.len() + plan.deletes.len()) as i64);
        let started = Instant::now();
        let mut now = have;
        let mut result = Ok(());
        for name in &plan.puts {
            let b = &model.backends[name];
            match shared.api.put(b).await {
                Ok(()) => {
                    shared.metrics.push("put", true);
                    now.insert(name.clone(), b.clone());
                }
                Err(PushError::Refused { body, .. }) => {
                    self.refuse(shared, model, b.clone(), &body);
                    // The module kept its previous version, if any: remove
                    // it, so the refused backend is not served stale.
                    if now.contains_key(name) {
                        match shared.api.delete(name).await {
                            Ok(()) => {
                                now.remove(name);
                            }
                            Err(e) => {
                                result = Err(e.context(format!("DELETE backend {name}")));
                                break;
                            }
                        }
                    }
                }
                Err(PushError::Failed(e)) => {
                    shared.metrics.push("put", false);
                    result = Err(e.context(format!("PUT backend {name}")));
                    break;
                }
            }
            depth.dec();
        }
        if result.is_ok() {
            for name in &plan.deletes {
                let r = shared.api.delete(name).await;
                shared.metrics.push("delete", r.is_ok());
                if let Err(e) = r {
                    result = Err(e.context(format!("DELETE backend {name}")));
                    break;
                }
                now.remove(name);
                depth.dec();
            }
        }
        depth.set(0);
        shared.metrics.push_duration.observe(started.elapsed().as_secs_f64());
        tracing::debug!(
            puts = plan.puts.len(),
            deletes = plan.deletes.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            "pushed backend changes"
        );
        self.pushed = Some(now);
        result
    }

    /// Leaves a refused backend out until it changes, and says so.
    fn refuse(&mut self, shared: &Shared, model: &Model, backend: Arc<Backend>, why: &str) {
        shared.metrics.push_result("put", "refused");
        let object = model
            .backend_object(&backend.name)
            .unwrap_or_else(|| format!("backend {}", backend.name));
        let report = Report {
            object,
            what: "backend".into(),
            reason: format!(
                "the module refused backend {}: {why}; its paths answer 503 until it changes",
                backend.name
            ),
        };
        tracing::warn!(problem = %report, "backend refused by the module");
        if let Some(events) = shared.events.clone() {
            tokio::spawn(async move { events.refused(&report).await });
        }
        self.refused.insert(backend.name.clone(), backend);
    }
}

/// Sends the model's route table when it differs from what the module
/// holds. The model validated every route with the module's validator, so
/// a refusal means a bug: it is logged and not retried until the table
/// changes.
async fn push_routes(
    shared: &Shared,
    model: &Model,
    pushed: &mut Option<Arc<lua_compat::routes::RouteTable>>,
) -> anyhow::Result<()> {
    if pushed
        .as_ref()
        .is_some_and(|p| Arc::ptr_eq(p, &model.routes) || **p == *model.routes)
    {
        return Ok(());
    }
    let started = Instant::now();
    match shared.api.put_routes(&model.routes).await {
        Ok(()) => {
            shared.metrics.push("routes", true);
            tracing::info!(
                listeners = model.routes.listeners.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "pushed the route table"
            );
            *pushed = Some(model.routes.clone());
            Ok(())
        }
        Err(PushError::Refused { body, .. }) => {
            shared.metrics.push_result("routes", "refused");
            tracing::error!(error = %body, "the module refused the route table; the previous one stays in force");
            *pushed = Some(model.routes.clone());
            Ok(())
        }
        Err(PushError::Failed(e)) => {
            shared.metrics.push("routes", false);
            Err(e.context("PUT /configuration/routes"))
        }
    }
}

/// Pushes backend changes as they come (see [`crate::push`]). A push that
/// failed is retried in full with backoff; a refused backend is not.
pub async fn task(shared: Arc<Shared>, mut models: watch::Receiver<Arc<Model>>, mut running: watch::Receiver<Running>) {
    let mut pusher = Pusher::default();
    let mut cert_pusher = crate::push_certs::CertPusher::default();
    // The route table the module holds (`None`: unknown, send it).
    let mut routes_pushed: Option<Arc<lua_compat::routes::RouteTable>> = None;
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
            cert_pusher.forget();
            routes_pushed = None;
            epoch = run.epoch;
        }
        let pushed = match pusher.round(&shared, &model, &run.referenced).await {
            Ok(()) => cert_pusher.round(&shared, &model).await,
            Err(e) => Err(e),
        };
        // Routes after the backends they name.
        let pushed = match pushed {
            Ok(()) => push_routes(&shared, &model, &mut routes_pushed).await,
            Err(e) => Err(e),
        };
        match pushed {
            Ok(()) => {
                retry = false;
                backoff = Duration::from_millis(200);
                if !shared.ready.swap(true, Ordering::AcqRel) {
                    tracing::info!(backends = model.backends.len(), "first configuration applied; ready");
                }
                // The request bodies of a full push are gone.
                crate::memory::release_free_memory();
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "pushing backends or certificates failed; will retry with a full push");
                retry = true;
            }
        }
    }
}
