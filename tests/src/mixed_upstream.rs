//! One upstream port that speaks every kind of connection an ingress sends
//! to a backend: plain HTTP/1.1, h2c (gRPC, the `grpc.health.v1` service),
//! TLS with HTTP/1.1 or HTTP/2 (told apart from plain text by the first
//! byte, a TLS record's 0x16), and WebSocket upgrades (echoed). Many
//! servers do this on one port (argocd-server multiplexes HTTP/1.1 and
//! h2c), which is what makes a keepalive cache that mixes kinds fail.
//!
//! Every answer but gRPC's says which connection it came over, as JSON:
//! `{"conn": N, "nth": K, "proto": "HTTP/1.1", "tls": true, "sni": "a.test"}`,
//! and the server counts the connections it accepted by kind
//! (`plain/h1`, `plain/h2`, `tls:<sni>/h1`, ...), so a test can tell both
//! that no request got a connection of another kind and that connections
//! are reused.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio_rustls::rustls;
use tower::ServiceExt as _;

use crate::free_port;
use crate::tls::TestCert;

/// What one accepted connection is.
struct Connection {
    id: usize,
    tls: bool,
    sni: Option<String>,
    requests: AtomicUsize,
}

/// The server; it stops when dropped.
pub struct MixedUpstream {
    pub port: u16,
    kinds: Arc<Mutex<BTreeMap<String, usize>>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl MixedUpstream {
    /// Listens on 127.0.0.1, on a free port; its TLS certificate is
    /// self-signed (upstream TLS is not verified unless asked).
    pub fn start() -> MixedUpstream {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let port = free_port();
        let kinds: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .expect("binding the mixed upstream");
        let tls = Arc::new(tls_config());
        let counts = kinds.clone();
        rt.spawn(async move {
            let next_id = Arc::new(AtomicUsize::new(1));
            let (reporter, health) = tonic_health::server::health_reporter();
            reporter
                .set_service_status("whoami", tonic_health::ServingStatus::Serving)
                .await;
            // The reporter must live as long as the server.
            let _reporter = reporter;
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let (tls, counts, health) = (tls.clone(), counts.clone(), health.clone());
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let mut first = [0u8; 1];
                    let Ok(1) = tcp.peek(&mut first).await else { return };
                    if first[0] == 0x16 {
                        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                        let Ok(stream) = acceptor.accept(tcp).await else { return };
                        let sni = stream.get_ref().1.server_name().map(str::to_string);
                        let conn = Arc::new(Connection {
                            id,
                            tls: true,
                            sni,
                            requests: AtomicUsize::new(0),
                        });
                        serve(TokioIo::new(stream), conn, counts, health).await;
                    } else {
                        let conn = Arc::new(Connection {
                            id,
                            tls: false,
                            sni: None,
                            requests: AtomicUsize::new(0),
                        });
                        serve(TokioIo::new(tcp), conn, counts, health).await;
                    }
                });
            }
        });
        MixedUpstream {
            port,
            kinds,
            rt: Some(rt),
        }
    }

    /// The endpoint for a backend of the module's API.
    pub fn endpoint(&self) -> serde_json::Value {
        serde_json::json!({"address": "127.0.0.1", "port": self.port.to_string()})
    }

    /// Connections accepted so far, by kind (`plain/h1`, `tls:a.test/h2`...),
    /// each counted at its first request.
    pub fn connections(&self) -> BTreeMap<String, usize> {
        self.kinds.lock().unwrap().clone()
    }
}

impl Drop for MixedUpstream {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

fn tls_config() -> rustls::ServerConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cert = TestCert::new("localhost");
    let certs = vec![CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    cfg
}

/// The gRPC service a connection dispatches `application/grpc` to.
trait Grpc:
    tower::Service<Request<Incoming>, Response = Response<tonic::body::Body>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> Grpc for T where
    T: tower::Service<Request<Incoming>, Response = Response<tonic::body::Body>, Error = Infallible, Future: Send>
        + Clone
        + Send
        + Sync
        + 'static
{
}

async fn serve<I>(io: I, conn: Arc<Connection>, counts: Arc<Mutex<BTreeMap<String, usize>>>, health: impl Grpc)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (conn, counts, health) = (conn.clone(), counts.clone(), health.clone());
        async move { Ok::<_, Infallible>(answer(req, &conn, &counts, health).await) }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection_with_upgrades(io, service)
        .await;
}

async fn answer(
    mut req: Request<Incoming>,
    conn: &Connection,
    counts: &Mutex<BTreeMap<String, usize>>,
    health: impl Grpc,
) -> Response<tonic::body::Body> {
    let nth = conn.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let h2 = req.version() == http::Version::HTTP_2;
    if nth == 1 {
        let kind = format!(
            "{}/{}",
            match (&conn.sni, conn.tls) {
                (Some(sni), true) => format!("tls:{sni}"),
                (None, true) => "tls".to_string(),
                _ => "plain".to_string(),
            },
            if h2 { "h2" } else { "h1" }
        );
        *counts.lock().unwrap().entry(kind).or_default() += 1;
    }
    let grpc = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/grpc"));
    if grpc {
        return health.oneshot(req).await.unwrap_or_else(|e: Infallible| match e {});
    }
    let upgrade = req
        .headers()
        .get("upgrade")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    if upgrade {
        let key = req
            .headers()
            .get("sec-websocket-key")
            .map(|k| k.as_bytes().to_vec())
            .unwrap_or_default();
        let upgraded = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let Ok(io) = upgraded.await else { return };
            let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                TokioIo::new(io),
                tungstenite::protocol::Role::Server,
                None,
            )
            .await;
            let (mut tx, mut rx) = ws.split();
            while let Some(Ok(msg)) = rx.next().await {
                if (msg.is_text() || msg.is_binary()) && tx.send(msg).await.is_err() {
                    return;
                }
            }
        });
        return Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("upgrade", "websocket")
            .header("connection", "upgrade")
            .header("sec-websocket-accept", tungstenite::handshake::derive_accept_key(&key))
            .body(tonic::body::Body::empty())
            .unwrap();
    }
    let body = serde_json::json!({
        "conn": conn.id,
        "nth": nth,
        "proto": format!("{:?}", req.version()),
        "tls": conn.tls,
        "sni": conn.sni,
        "path": req.uri().path(),
    })
    .to_string();
    Response::builder()
        .header("content-type", "application/json")
        .body(tonic::body::Body::new(http_body_util::Full::new(Bytes::from(body))))
        .unwrap()
}
