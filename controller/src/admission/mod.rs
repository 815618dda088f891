//! The validating admission webhook (ingress-nginx's `--validating-webhook`).
//!
//! The apiserver sends every Ingress create/update here before storing it.
//! The review runs the controller's own model on the current cluster state
//! with the candidate Ingress in place, and denies the Ingress, with the
//! reason, when the model refuses one of its values ([`refuses`]): an
//! annotation out of range, a snippet while snippets are off or one the
//! snippet policy refuses (it leaves its block, loads code, names a file),
//! a host, path or service reference nginx cannot take, a host and path
//! another Ingress already owns. The running controller would drop such a
//! value and report it, so refusing it up front is the kinder answer.
//!
//! **nginx never sees a review.** The webhook port takes requests from
//! anyone who can reach it, not only the apiserver, so what it is sent is
//! hostile: CVE-2025-1974 rendered such a request into a configuration and
//! ran `nginx -t` on it, which loaded a library of the caller's choice.
//! Here no review is rendered, written or tested: the verdict is the
//! model's alone. What only nginx could tell (a directive a snippet
//! misspells, a value nginx's own parser refuses that no validator here
//! knows) is no longer caught at admission; such an Ingress is
//! quarantined when the controller tests the configuration it produces,
//! and the rest of the configuration is applied.
//!
//! What ingress-nginx admits stays admitted, even where this controller
//! only logs it: annotations it does not implement (a migration must not be
//! blocked by them), TLS Secrets that do not exist yet (cert-manager creates
//! them after the Ingress), canaries waiting for their primary. The one
//! exception is access control this controller does not implement
//! (`auth-url`, `auth-type`, ...): such an Ingress fails closed, every path
//! answering 503, so it is refused with that reason rather than admitted
//! into an outage.
//!
//! **Budget.** The model is built from the part of the cluster that can
//! change the verdict ([`scope`]), not all of it, one at a time (a review
//! costs one core for as long as the model takes), at most [`MAX_WAITING`] more reviews wait
//! for their turn and later ones are answered 429 at once, and each review
//! ends within `--validating-webhook-timeout`. With the body limit of the
//! server ([`server`]), that bounds the CPU and the memory callers can make
//! the webhook spend. Ingresses of other classes are admitted untouched.

pub mod scope;
pub mod server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::networking::v1::Ingress;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;
use tokio::sync::{watch, Semaphore};

use crate::metrics::Metrics;
use crate::model::{self, BuildOptions};
use crate::snapshot::{key, Snapshot};

/// Reviews that may wait for the model builder while one runs; more are
/// refused at once with 429.
pub const MAX_WAITING: usize = 8;

/// Why a review got no verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unanswered {
    /// [`MAX_WAITING`] reviews were already waiting.
    Busy,
}

pub struct Validator {
    pub build: BuildOptions,
    pub snapshots: watch::Receiver<Arc<Snapshot>>,
    /// The whole review must end within this.
    pub budget: Duration,
    /// `admission_*`, `check_success` and `check_errors`.
    metrics: Arc<Metrics>,
    /// One model build at a time.
    builder: Arc<Semaphore>,
    /// Reviews waiting or building, at most `MAX_WAITING + 1`.
    queue: Semaphore,
}

impl Validator {
    pub fn new(
        build: BuildOptions,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        budget: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Validator {
            build,
            snapshots,
            budget,
            metrics,
            builder: Arc::new(Semaphore::new(1)),
            queue: Semaphore::new(MAX_WAITING + 1),
        }
    }

    fn count(&self, result: &'static str, started: Instant) {
        self.metrics.admission_reviews.with_label_values(&[result]).inc();
        let seconds = started.elapsed().as_secs_f64();
        self.metrics.admission_duration.observe(seconds);
        // ingress-nginx's gauge is the last admitted review's.
        if result == "allowed" {
            self.metrics.admission_roundtrip_duration.set(seconds);
        }
    }

    /// Answers one AdmissionReview, or says why it cannot now.
    pub async fn review(
        &self,
        review: AdmissionReview<DynamicObject>,
    ) -> Result<AdmissionReview<DynamicObject>, Unanswered> {
        let started = Instant::now();
        let req: AdmissionRequest<DynamicObject> = match review.try_into() {
            Ok(r) => r,
            Err(e) => {
                self.count("invalid", started);
                return Ok(AdmissionResponse::invalid(format!("not an AdmissionReview request: {e}")).into_review());
            }
        };
        let resp = AdmissionResponse::from(&req);
        let Some(obj) = req.object.as_ref() else {
            // DELETE and CONNECT carry no object: nothing to check.
            self.count("allowed", started);
            return Ok(resp.into_review());
        };
        let ingress: Ingress = match serde_json::to_value(obj).and_then(serde_json::from_value) {
            Ok(i) => i,
            Err(e) => {
                self.count("denied", started);
                return Ok(resp.deny(format!("not an Ingress: {e}")).into_review());
            }
        };
        let Ok(_in_queue) = self.queue.try_acquire() else {
            self.count("busy", started);
            tracing::warn!("admission review refused: {MAX_WAITING} reviews already waiting");
            return Err(Unanswered::Busy);
        };
        let verdict = match tokio::time::timeout(self.budget, self.check(ingress)).await {
            Ok(v) => v,
            Err(_) => {
                self.count("timeout", started);
                return Ok(resp
                    .deny(format!("validation did not finish within {:?}; try again", self.budget))
                    .into_review());
            }
        };
        self.count(if verdict.is_ok() { "allowed" } else { "denied" }, started);
        tracing::info!(
            ingress = %format!("{}/{}", req.namespace.as_deref().unwrap_or(""), req.name),
            allowed = verdict.is_ok(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "admission review"
        );
        Ok(match verdict {
            Ok(()) => resp.into_review(),
            Err(reason) => resp.deny(reason).into_review(),
        })
    }

    /// `Ok` to admit, `Err(reason)` to deny.
    pub async fn check(&self, mut ingress: Ingress) -> Result<(), String> {
        let current = self.snapshots.borrow().clone();
        if ingress.metadata.namespace.is_none() {
            ingress.metadata.namespace = Some("default".into());
        }
        // The webhook port takes requests from anyone in the cluster, not
        // only the apiserver: names are checked as the apiserver would
        // before they reach the model or a message.
        let ns = ingress.metadata.namespace.as_deref().unwrap_or_default();
        let name = ingress.metadata.name.as_deref().unwrap_or_default();
        if !model::values::is_namespace(ns) || !model::values::is_object_name(name) {
            return Err(format!(
                "{:?}/{:?} is not a Kubernetes namespace and object name",
                shorten(ns),
                shorten(name)
            ));
        }
        if !self.build.class.accepts(&ingress, &current.classes) {
            return Ok(());
        }
        let me = key(&ingress.metadata);
        let (ns, name) = (ns.to_string(), name.to_string());

        // The permit moves into the build: a review that times out stops
        // waiting, but the next build starts only when this one is done.
        let permit = self
            .builder
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| "the webhook is stopping".to_string())?;
        let opts = self.build.clone();
        let candidate = me.clone();
        let building = Instant::now();
        let (model, tested) = tokio::task::spawn_blocking(move || {
            let _one_at_a_time = permit;
            // Only what can change this Ingress's verdict ([`scope`]).
            let mut snap = scope::related(&current, &ingress, &opts);
            snap.ingresses.retain(|i| key(&i.metadata) != candidate);
            snap.ingresses.push(Arc::new(ingress));
            (model::build(&snap, &opts), snap.ingresses.len())
        })
        .await
        .map_err(|_| "the model builder failed on this Ingress".to_string())?;
        let object = format!("Ingress {me}");
        let refused: Vec<String> = model
            .problems
            .iter()
            .filter(|p| p.object == object && refuses(p))
            .map(|p| format!("{}: {}", p.what, p.reason))
            .collect();
        // ingress-nginx's figures of its test: the Ingresses it took in
        // and how long it took; here the model build is the test.
        if refused.is_empty() {
            self.metrics.admission_tested_ingresses.set(tested as i64);
            self.metrics
                .admission_tested_duration
                .set(building.elapsed().as_secs_f64());
        }
        self.metrics.checked(&ns, &name, refused.is_empty());
        if refused.is_empty() {
            Ok(())
        } else {
            Err(refused.join("; "))
        }
    }
}

/// A caller's string cut short for a message.
fn shorten(s: &str) -> String {
    s.chars().take(80).collect()
}

const ANNOTATION_PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// Whether a problem the model reports about an Ingress refuses it at
/// admission (see the module docs); the others are admitted and reported
/// as the running controller reports them.
pub fn refuses(report: &model::Report) -> bool {
    // Access control that is not honoured fails closed: refused whatever
    // its message says, so no rewording can make it look "unsupported".
    let annotation = report.what.strip_prefix(ANNOTATION_PREFIX).unwrap_or("");
    // A basic-auth Secret that does not exist yet (`kubectl apply -f dir`
    // creates in file order): admitted like a TLS Secret; until it exists
    // the Ingress fails closed.
    if matches!(annotation, "auth-secret" | "auth-tls-secret") && report.reason.contains("not found") {
        return false;
    }
    if model::annotations::is_access_control(annotation) {
        return true;
    }
    let reason = report.reason.as_str();
    // An annotation this controller does not support (by the catalogue,
    // not by the wording) is admitted and reported, as ingress-nginx
    // admits annotations it does not know.
    let unsupported = report
        .what
        .strip_prefix(ANNOTATION_PREFIX)
        .is_some_and(|n| model::catalogue::annotation(n).is_none_or(|e| !e.status.honoured()));
    let pending_or_unsupported = unsupported
        || reason.starts_with("ignored: it needs")
        || reason.starts_with("resource backends are not supported")
        || report.what == "spec.tls.secretName"
        || report.what == "canary";
    !pending_or_unsupported
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(what: &str, reason: &str) -> model::Report {
        model::Report {
            object: "Ingress demo/web".into(),
            what: what.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn refused_values_deny_and_what_ingress_nginx_admits_passes() {
        for denied in [
            report(
                "nginx.ingress.kubernetes.io/proxy-read-timeout",
                "not a number of seconds: \"soon\"",
            ),
            report(
                "spec.rules",
                "host a.test path / (Prefix) is already served by Ingress demo/other; ignored",
            ),
            report("spec.rules.http.paths.path", "a path must start with /"),
            report("backend", "invalid service reference \"Bad_Name\""),
            report(
                "nginx.ingress.kubernetes.io/auth-url",
                "not supported (not implemented yet); the Ingress fails closed: its paths answer 503 until the annotation is removed",
            ),
            // Whatever the message says, unhonoured access control refuses.
            report("nginx.ingress.kubernetes.io/auth-type", "not supported by this controller; ignored"),
            report("nginx.ingress.kubernetes.io/satisfy", "ignored: it needs auth-type"),
        ] {
            assert!(refuses(&denied), "{denied}");
        }
        for admitted in [
            report(
                "nginx.ingress.kubernetes.io/http2-push-preload",
                "not supported (nginx 1.25.1 removed HTTP/2 server push); ignored",
            ),
            report(
                "nginx.ingress.kubernetes.io/no-such-name",
                "not an ingress-nginx name; ignored",
            ),
            report(
                "nginx.ingress.kubernetes.io/session-cookie-name",
                "ignored: it needs affinity: cookie",
            ),
            report("spec.tls.secretName", "Secret demo/web-tls: not found"),
            report("canary", "no primary Ingress serves host a.test path /; canary ignored"),
        ] {
            assert!(!refuses(&admitted), "{admitted}");
        }
    }

    fn validator(opts: BuildOptions) -> Validator {
        let (_tx, rx) = watch::channel(Arc::new(Snapshot::default()));
        Validator::new(opts, rx, Duration::from_secs(5), Arc::default())
    }

    fn ingress(ns: &str, name: &str, annotations: &[(&str, &str)]) -> Ingress {
        let mut ing: Ingress = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {"ingressClassName": "nginx", "rules": [{"host": "a.test", "http": {"paths": [
                {"path": "/", "pathType": "Prefix",
                 "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}
        }))
        .unwrap();
        ing.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (format!("{ANNOTATION_PREFIX}{k}"), v.to_string()))
                .collect(),
        );
        ing
    }

    fn review_of(ing: &Ingress) -> AdmissionReview<DynamicObject> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "1", "operation": "CREATE", "name": ing.metadata.name, "namespace": ing.metadata.namespace,
                "kind": {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"},
                "resource": {"group": "networking.k8s.io", "version": "v1", "resource": "ingresses"},
                "userInfo": {}, "object": ing
            }
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn hostile_names_are_refused_before_the_model() {
        let v = validator(BuildOptions::default());
        for (ns, name) in [
            ("demo", "x\n    load_module /tmp/evil.so;"),
            ("../..", "web"),
            ("demo", "a{b}"),
            ("demo", ""),
        ] {
            let mut ing = Ingress::default();
            ing.metadata.namespace = Some(ns.into());
            ing.metadata.name = Some(name.into());
            let err = v.check(ing).await.unwrap_err();
            assert!(err.contains("not a Kubernetes"), "{err}");
        }
    }

    #[tokio::test]
    async fn snippets_are_judged_by_the_policy_not_by_nginx() {
        let v = validator(BuildOptions {
            allow_snippets: true,
            ..BuildOptions::default()
        });
        let breakout = "} } } ssl_engine /tmp/evil.so; http { server { location /zz {";
        let err = v
            .check(ingress("demo", "web", &[("configuration-snippet", breakout)]))
            .await
            .unwrap_err();
        assert!(
            err.contains("configuration-snippet") && err.contains("not a complete list"),
            "{err}"
        );
        let err = v
            .check(ingress(
                "demo",
                "web",
                &[("server-snippet", "if ($a) { load_module /tmp/x.so; }")],
            ))
            .await
            .unwrap_err();
        assert!(err.contains("loads code"), "{err}");
        v.check(ingress(
            "demo",
            "web",
            &[("configuration-snippet", "add_header X-A b;")],
        ))
        .await
        .unwrap();
        // Without the flag every snippet is refused.
        let off = validator(BuildOptions::default());
        let err = off
            .check(ingress(
                "demo",
                "web",
                &[("configuration-snippet", "add_header X-A b;")],
            ))
            .await
            .unwrap_err();
        assert!(err.contains("disabled"), "{err}");
    }

    #[tokio::test]
    async fn reviews_beyond_the_queue_are_refused_at_once() {
        let v = Arc::new(validator(BuildOptions::default()));
        // Hold the model builder: every review waits for it.
        let held = v.builder.clone().acquire_owned().await.unwrap();
        let mut waiting = Vec::new();
        for i in 0..=MAX_WAITING {
            let v = v.clone();
            let r = review_of(&ingress("demo", &format!("w{i}"), &[]));
            waiting.push(tokio::spawn(async move { v.review(r).await }));
        }
        // Let them all take their place in the queue.
        for _ in 0..100 {
            if v.queue.available_permits() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let extra = v.review(review_of(&ingress("demo", "extra", &[]))).await;
        assert_eq!(extra.err(), Some(Unanswered::Busy));
        drop(held);
        for w in waiting {
            let review = w.await.unwrap().expect("answered once the builder is free");
            assert!(review.response.unwrap().allowed);
        }
        let busy = v.metrics.admission_reviews.with_label_values(&["busy"]).get();
        assert_eq!(busy, 1);
    }
}
