//! The cluster tier's backend Pod: an HTTP/1.1 server that answers every
//! request with the name of its Pod, so a client can tell which Pod served
//! it and see a rollout change them over.
//!
//! - `POD_NAME` (the Downward API's `metadata.name`) names the Pod in every
//!   answer: `<pod> <method> <path> <body bytes>`.
//! - `GET /healthz` is the readiness probe: 200 while ready, 503 after
//!   `POST /admin/unready` (until `POST /admin/ready`), and 503 for
//!   `READY_AFTER_MS` after start (a slow starter).
//! - `DELAY_MS` (or `POST /admin/slow?ms=N`) delays every answer.
//! - `POST /admin/connect?to=ADDR:PORT` opens a TCP connection from inside
//!   the Pod and says what happened (`connected`, or the error after at
//!   most 2 s): how the tier proves which addresses a Pod can reach.
//! - `PORT` (default 8080) is the port it listens on, on every address of
//!   the Pod's network namespace.
//! - SIGTERM shuts down as a well-written server does: stop accepting,
//!   finish what is in flight, close idle keep-alive connections, exit 0
//!   (`SHUTDOWN_DELAY_MS` first keeps serving that long, as an application
//!   that drains by itself would). Exiting at once on SIGTERM is what makes
//!   a rollout fail requests when the ingress learns of it late.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

struct State {
    pod: String,
    started: Instant,
    ready_after: Duration,
    unready: AtomicBool,
    delay_ms: AtomicU64,
    served: AtomicU64,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert("content-type", "text/plain".parse().unwrap());
    resp
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let ready = !state.unready.load(Ordering::Relaxed) && state.started.elapsed() >= state.ready_after;
    let resp = match (method.as_str(), path.as_str()) {
        ("GET", "/healthz") if ready => text(StatusCode::OK, "ok\n".into()),
        ("GET", "/healthz") => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into()),
        ("POST", "/admin/unready") => {
            state.unready.store(true, Ordering::Relaxed);
            text(StatusCode::OK, format!("{} unready\n", state.pod))
        }
        ("POST", "/admin/ready") => {
            state.unready.store(false, Ordering::Relaxed);
            text(StatusCode::OK, format!("{} ready\n", state.pod))
        }
        ("POST", "/admin/connect") => {
            let to = query.split('&').find_map(|kv| kv.strip_prefix("to=")).unwrap_or("");
            let result = match to.parse::<std::net::SocketAddr>() {
                Err(e) => format!("bad address {to:?}: {e}"),
                Ok(addr) => {
                    match tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr)).await {
                        Ok(Ok(_)) => "connected".to_string(),
                        Ok(Err(e)) => format!("error: {e}"),
                        Err(_) => "timeout".to_string(),
                    }
                }
            };
            text(StatusCode::OK, format!("{result}\n"))
        }
        ("POST", "/admin/slow") => {
            let ms = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("ms="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            state.delay_ms.store(ms, Ordering::Relaxed);
            text(StatusCode::OK, format!("{} delay {ms} ms\n", state.pod))
        }
        _ => {
            let delay = state.delay_ms.load(Ordering::Relaxed);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            state.served.fetch_add(1, Ordering::Relaxed);
            text(
                StatusCode::OK,
                format!("{} {method} {path} {}\n", state.pod, body.len()),
            )
        }
    };
    Ok(resp)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let state = Arc::new(State {
        pod: std::env::var("POD_NAME").unwrap_or_else(|_| "unknown".into()),
        started: Instant::now(),
        ready_after: Duration::from_millis(env_u64("READY_AFTER_MS", 0)),
        unready: AtomicBool::new(false),
        delay_ms: AtomicU64::new(env_u64("DELAY_MS", 0)),
        served: AtomicU64::new(0),
    });
    let port = env_u64("PORT", 8080);
    let shutdown_delay = Duration::from_millis(env_u64("SHUTDOWN_DELAY_MS", 0));
    let listener = TcpListener::bind(("0.0.0.0", port as u16))
        .await
        .expect("binding the backend port");
    eprintln!("pod-backend {} listening on :{port}", state.pod);
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let conn = builder.serve_connection(
                    TokioIo::new(stream),
                    service_fn(move |req| handle(state.clone(), req)),
                );
                let conn = graceful.watch(conn.into_owned());
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    eprintln!(
        "pod-backend {}: SIGTERM after {} requests; draining",
        state.pod,
        state.served.load(Ordering::Relaxed)
    );
    if !shutdown_delay.is_zero() {
        // Keep accepting while the ingress takes the Pod out of rotation.
        let deadline = tokio::time::sleep(shutdown_delay);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let state = state.clone();
                    let conn = builder.serve_connection(
                        TokioIo::new(stream),
                        service_fn(move |req| handle(state.clone(), req)),
                    );
                    let conn = graceful.watch(conn.into_owned());
                    tokio::spawn(async move { let _ = conn.await; });
                }
                _ = &mut deadline => break,
            }
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(20), graceful.shutdown()).await;
    eprintln!("pod-backend {}: exiting", state.pod);
}
