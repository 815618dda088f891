//! The webhook's HTTPS server: one task per connection (a slow TLS
//! handshake cannot hold up the others), each bounded in time, in number
//! and in the size of what it may send.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use kube::core::admission::AdmissionReview;
use kube::core::DynamicObject;
use tokio::sync::Semaphore;
use tokio_rustls::rustls;

use super::{Unanswered, Validator};

/// Largest request body: an AdmissionReview carries the object and, on
/// update, the old one; etcd stores objects of up to 1.5 MiB.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// Open connections, at most; more are closed as soon as accepted.
pub const MAX_CONNECTIONS: usize = 128;

/// How long a client may take to send a request's headers, and a TLS
/// handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one connection may live (the apiserver's own timeout is at
/// most 30 s per call).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

async fn validate(State(v): State<Arc<Validator>>, Json(review): Json<AdmissionReview<DynamicObject>>) -> Response {
    match v.review(review).await {
        Ok(answer) => Json(answer).into_response(),
        Err(Unanswered::Busy) => (
            StatusCode::TOO_MANY_REQUESTS,
            Json(serde_json::json!({
                "error": "too many admission reviews are waiting; try again"
            })),
        )
            .into_response(),
    }
}

pub fn router(v: Arc<Validator>) -> Router {
    // The chart registers `/networking/v1/ingresses`, as ingress-nginx's
    // chart does; `/` for a configuration by URL.
    Router::new()
        .route("/networking/v1/ingresses", post(validate))
        .route("/", post(validate))
        .layer(DefaultBodyLimit::max(MAX_BODY))
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
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "webhook accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = connections.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "webhook connection closed: {MAX_CONNECTIONS} already open");
            drop(tcp);
            continue;
        };
        // Small request/answer exchanges: Nagle would hold the answer
        // behind the handshake's last record until the delayed ACK.
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "webhook TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HANDSHAKE_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(tls), service).into_owned();
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
        });
    }
}
