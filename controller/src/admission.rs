//! The validating admission webhook (ingress-nginx's `--validating-webhook`).
//!
//! The apiserver sends every Ingress create/update here before storing it.
//! The review runs what the controller itself would run: the model on the
//! current cluster state with the candidate Ingress in place, then
//! `nginx -t` on the rendered configuration, all within a time budget. An
//! Ingress is denied, with the reason, when:
//! - the model refuses one of its values ([`refuses`]: an annotation out of
//!   range, a snippet while snippets are off, a host, path or service
//!   reference nginx cannot take, a host and path another Ingress already
//!   owns): the running controller would drop it and report it, so refusing
//!   it up front is the kinder answer;
//! - nginx refuses the configuration with it, which the running controller
//!   would answer with a quarantine.
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
//! This complements the quarantine of the structural path: nothing that
//! passed admission can block reloads, and an Ingress created while the
//! webhook was unreachable (`failurePolicy: Ignore`) is still quarantined.
//!
//! Reviews are serialized (one `nginx -t` at a time on a small node) and
//! Ingresses of other classes are admitted untouched.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::networking::v1::Ingress;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;
use tokio::sync::{watch, Mutex};

use crate::model::{self, BuildOptions};
use crate::render::{RenderContext, Renderer};
use crate::snapshot::{key, Snapshot};

pub struct Validator {
    pub build: BuildOptions,
    pub render: RenderContext,
    pub renderer: Renderer,
    pub nginx_binary: std::path::PathBuf,
    pub snapshots: watch::Receiver<Arc<Snapshot>>,
    /// The whole review must end within this.
    pub budget: Duration,
    lock: Mutex<()>,
}

impl Validator {
    pub fn new(
        build: BuildOptions,
        render: RenderContext,
        renderer: Renderer,
        nginx_binary: std::path::PathBuf,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        budget: Duration,
    ) -> Self {
        Validator {
            build,
            render,
            renderer,
            nginx_binary,
            snapshots,
            budget,
            lock: Mutex::new(()),
        }
    }

    /// Answers one AdmissionReview.
    pub async fn review(&self, review: AdmissionReview<DynamicObject>) -> AdmissionReview<DynamicObject> {
        let req: AdmissionRequest<DynamicObject> = match review.try_into() {
            Ok(r) => r,
            Err(e) => {
                return AdmissionResponse::invalid(format!("not an AdmissionReview request: {e}")).into_review();
            }
        };
        let resp = AdmissionResponse::from(&req);
        let Some(obj) = req.object.as_ref() else {
            // DELETE and CONNECT carry no object: nothing to check.
            return resp.into_review();
        };
        let ingress: Ingress = match serde_json::to_value(obj).and_then(serde_json::from_value) {
            Ok(i) => i,
            Err(e) => return resp.deny(format!("not an Ingress: {e}")).into_review(),
        };
        let started = Instant::now();
        let verdict = match tokio::time::timeout(self.budget, self.check(ingress)).await {
            Ok(v) => v,
            Err(_) => Err(format!("validation did not finish within {:?}; try again", self.budget)),
        };
        tracing::info!(
            ingress = %format!("{}/{}", req.namespace.as_deref().unwrap_or(""), req.name),
            allowed = verdict.is_ok(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "admission review"
        );
        match verdict {
            Ok(()) => resp.into_review(),
            Err(reason) => resp.deny(reason).into_review(),
        }
    }

    /// `Ok` to admit, `Err(reason)` to deny.
    pub async fn check(&self, mut ingress: Ingress) -> Result<(), String> {
        let _one_at_a_time = self.lock.lock().await;
        let current = self.snapshots.borrow().clone();
        if ingress.metadata.namespace.is_none() {
            ingress.metadata.namespace = Some("default".into());
        }
        // The webhook port takes requests from anyone in the cluster, not
        // only the apiserver: names are checked as the apiserver would
        // before they reach the model, the renderer or a file name.
        let ns = ingress.metadata.namespace.as_deref().unwrap_or_default();
        let name = ingress.metadata.name.as_deref().unwrap_or_default();
        if !model::values::is_namespace(ns) || !model::values::is_object_name(name) {
            return Err(format!("{ns:?}/{name:?} is not a Kubernetes namespace and object name"));
        }
        if !self.build.class.accepts(&ingress, &current.classes) {
            return Ok(());
        }
        let me = key(&ingress.metadata);
        let mut snap = (*current).clone();
        snap.ingresses.retain(|i| key(&i.metadata) != me);
        snap.ingresses.push(Arc::new(ingress));

        let opts = self.build.clone();
        let model = tokio::task::spawn_blocking(move || model::build(&snap, &opts))
            .await
            .map_err(|_| "the model builder failed on this Ingress".to_string())?;
        let object = format!("Ingress {me}");
        let refused: Vec<String> = model
            .problems
            .iter()
            .filter(|p| p.object == object && refuses(p))
            .map(|p| format!("{}: {}", p.what, p.reason))
            .collect();
        if !refused.is_empty() {
            return Err(refused.join("; "));
        }
        let Some(structure) = model.structure.as_ref() else {
            return Ok(());
        };
        self.nginx_test(structure).await
    }

    /// Renders into a private scratch directory (its own logs and pid
    /// path) and runs `nginx -t` there; the running configuration's files
    /// are never touched (the default certificate is only read).
    async fn nginx_test(&self, structure: &model::Structure) -> Result<(), String> {
        let scratch = tempfile::Builder::new()
            .prefix("admission-")
            .tempdir()
            .map_err(|e| format!("no scratch directory: {e}"))?;
        let dir = scratch.path();
        let mut ctx = self.render.clone();
        ctx.error_log = dir.join("error.log").display().to_string();
        ctx.pid_file = dir.join("nginx.pid").display().to_string();
        ctx.access_log = dir.join("access.log").display().to_string();
        let text = self
            .renderer
            .render(structure, &ctx)
            .map_err(|e| format!("rendering failed: {e:#}"))?;
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, &text).map_err(|e| format!("writing the candidate: {e}"))?;
        std::fs::create_dir_all(dir.join("logs")).map_err(|e| e.to_string())?;
        let nginx = crate::nginx::Nginx::new(
            self.nginx_binary.clone(),
            dir.to_path_buf(),
            conf.clone(),
            crate::nginx::Mode::Supervised,
        );
        match nginx.test(&conf).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let msg = format!("{e:#}");
                // nginx names the scratch file; the path means nothing to
                // the user, the line's content does.
                let line = offending_line(&msg, &text).unwrap_or_default();
                Err(format!("nginx refuses the configuration: {msg}{line}"))
            }
        }
    }
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

/// The rendered line nginx's message points at (`... nginx.conf:123`), to
/// quote it in the denial.
fn offending_line(message: &str, text: &str) -> Option<String> {
    let n = crate::reload::message_line(message, "nginx.conf")?;
    let line = text.lines().nth(n.checked_sub(1)?)?.trim();
    Some(format!(" (the line: {line})"))
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
                "nginx.ingress.kubernetes.io/enable-opentelemetry",
                "not supported (no OpenTelemetry module in this nginx); ignored",
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

    #[tokio::test]
    async fn hostile_names_are_refused_before_the_model() {
        let (_tx, rx) = watch::channel(Arc::new(Snapshot::default()));
        let v = Validator::new(
            BuildOptions::default(),
            RenderContext {
                module_path: "m.so".into(),
                pid_file: "p".into(),
                error_log: "e".into(),
                error_log_level: "notice".into(),
                access_log: "a".into(),
                zone_size: "1m".into(),
                default_certificate: "s".into(),
                supervised: true,
                api_token_file: None,
                metrics: true,
                metrics_per_host: true,
                cpus: 2,
                https_socket: "h.sock".into(),
            },
            Renderer::new(None).unwrap(),
            "nginx".into(),
            rx,
            Duration::from_secs(1),
        );
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

    #[test]
    fn the_offending_line_is_quoted() {
        let text = "events {}\nhttp {\n    bogus on;\n}\n";
        let msg = "nginx: [emerg] unknown directive \"bogus\" in /tmp/x/nginx.conf:3";
        assert_eq!(offending_line(msg, text).as_deref(), Some(" (the line: bogus on;)"));
        assert_eq!(offending_line("no line here", text), None);
    }
}

/// The webhook's HTTPS server: one task per connection (a slow TLS
/// handshake cannot hold up the others), each bounded in time.
pub mod server {
    use std::sync::Arc;
    use std::time::Duration;

    use anyhow::Context as _;
    use axum::extract::State;
    use axum::routing::post;
    use axum::{Json, Router};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::service::TowerToHyperService;
    use kube::core::admission::AdmissionReview;
    use kube::core::DynamicObject;
    use tokio_rustls::rustls;

    use super::Validator;

    async fn validate(
        State(v): State<Arc<Validator>>,
        Json(review): Json<AdmissionReview<DynamicObject>>,
    ) -> Json<AdmissionReview<DynamicObject>> {
        Json(v.review(review).await)
    }

    pub fn router(v: Arc<Validator>) -> Router {
        // Any path: the chart registers `/networking/v1/ingresses`, as
        // ingress-nginx's chart does.
        Router::new()
            .route("/networking/v1/ingresses", post(validate))
            .route("/", post(validate))
            .with_state(v)
    }

    pub fn tls_config(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<rustls::ServerConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .with_context(|| format!("reading {}", cert.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("parsing {}", cert.display()))?;
        let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading {}", key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .context("the webhook's certificate and key do not match")?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(cfg)
    }

    /// Serves until the process ends.
    pub async fn serve(listener: tokio::net::TcpListener, tls: rustls::ServerConfig, router: Router) {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "webhook accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let service = TowerToHyperService::new(router.clone());
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "webhook TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
                let conn = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .into_owned();
                // The apiserver's own timeout is at most 30 s.
                let _ = tokio::time::timeout(Duration::from_secs(60), conn).await;
            });
        }
    }
}
