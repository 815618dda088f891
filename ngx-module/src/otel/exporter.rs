//! The exporter thread: drains the worker's span queue in batches (when a
//! batch is full or the schedule delay passed, as the SDK's batch span
//! processor does) and sends each batch as one OTLP/gRPC `Export` call,
//! over a cleartext HTTP/2 connection kept between batches (h2 on a
//! current-thread tokio runtime of its own).
//!
//! A batch that fails (no connection, a timeout, a gRPC error) is counted
//! `failed` and not retried: the queue behind it keeps filling, and a
//! retry would only make the next batch later. Only a kept connection
//! that fails is tried once more on a new one (a collector closes idle
//! connections), and an unreachable collector is dialled again after a
//! backoff, not per batch. Failures are logged on
//! the event loop (see [`drain_log`]) when the state changes, not per
//! batch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_queue::ArrayQueue;
use lua_compat::otel::draft::SpanDraft;
use lua_compat::otel::otlp::{self, ExportOutcome, ResourceInfo};
use lua_compat::otel::settings::ExporterSettings;
use lua_compat::otel::span::SpanRecord;
use ngx::ffi::{ngx_uint_t, NGX_LOG_NOTICE, NGX_LOG_WARN};

use crate::shm::metrics_zone::OtelCounters;

/// Log lines of exporter threads, written by the sync timer.
static LOG: Mutex<Vec<(ngx_uint_t, String)>> = Mutex::new(Vec::new());
/// Lines kept at most between two drains.
const MAX_QUEUED_LOG: usize = 64;

fn log(level: u32, line: String) {
    let mut queue = LOG.lock().unwrap_or_else(|e| e.into_inner());
    if queue.len() < MAX_QUEUED_LOG {
        queue.push((level as ngx_uint_t, line));
    }
}

/// Writes the exporter's queued log lines (on the event loop).
pub fn drain_log(mut write: impl FnMut(ngx_uint_t, &str)) {
    let lines = std::mem::take(&mut *LOG.lock().unwrap_or_else(|e| e.into_inner()));
    for (level, line) in lines {
        write(level, &line);
    }
}

/// What the worker and its exporter thread share: the bounded queue and
/// the close flag.
struct Shared {
    queue: ArrayQueue<SpanDraft>,
    closed: AtomicBool,
}

/// A running exporter: the queue, the thread to wake, its end signal.
pub struct Exporter {
    shared: Arc<Shared>,
    thread: std::thread::Thread,
    batch: usize,
    done: Receiver<()>,
}

impl Exporter {
    /// Queues a finished span without waiting; false when the queue is
    /// full and the span was dropped. The thread is woken once a batch is
    /// waiting (no system call per span: the SDK's batch processor does
    /// the same).
    pub fn push(&self, span: SpanDraft) -> bool {
        if self.shared.queue.push(span).is_err() {
            return false;
        }
        if self.shared.queue.len() >= self.batch {
            self.thread.unpark();
        }
        true
    }

    /// Closes the queue (the thread exports what is left, then ends) and
    /// waits up to `grace` for it.
    pub fn stop(self, grace: Duration) {
        self.shared.closed.store(true, Ordering::Release);
        self.thread.unpark();
        let _ = self.done.recv_timeout(grace);
    }
}

/// Starts the thread for `settings`.
pub fn spawn(settings: ExporterSettings, counters: Option<&'static OtelCounters>) -> Result<Exporter, String> {
    let shared = Arc::new(Shared {
        queue: ArrayQueue::new(settings.queue.max(1)),
        closed: AtomicBool::new(false),
    });
    let (done_tx, done) = std::sync::mpsc::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("cannot start the exporter's runtime: {e}"))?;
    let batch = settings.batch.max(1);
    let theirs = Arc::clone(&shared);
    let handle = std::thread::Builder::new()
        .name("dynbal-otel".into())
        .spawn(move || {
            crate::nginx::worker::block_signals();
            let mut thread = Thread {
                resource: ResourceInfo {
                    service_name: settings.service_name.clone(),
                    host_name: host_name(),
                },
                settings,
                counters,
                runtime,
                connection: None,
                failing: false,
                backoff: Duration::ZERO,
                retry_at: None,
            };
            thread.run(&theirs);
            let _ = done_tx.send(());
        })
        .map_err(|e| format!("cannot start the exporter thread: {e}"))?;
    Ok(Exporter {
        shared,
        thread: handle.thread().clone(),
        batch,
        done,
    })
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length; gethostname writes at most
    // that many bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

struct Thread {
    settings: ExporterSettings,
    resource: ResourceInfo,
    counters: Option<&'static OtelCounters>,
    runtime: tokio::runtime::Runtime,
    connection: Option<h2::client::SendRequest<Bytes>>,
    /// The last export failed: the next success is logged.
    failing: bool,
    /// The wait after the last unreachable attempt (zero once one
    /// succeeds), and when the next attempt may dial.
    backoff: Duration,
    retry_at: Option<Instant>,
}

/// The first wait after the collector could not be reached, and the
/// longest.
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl Thread {
    /// Sleeps until a batch is waiting, the schedule delay has passed or
    /// the queue is closed; then exports everything queued, a batch per
    /// call.
    fn run(&mut self, shared: &Shared) {
        let size = self.settings.batch.max(1);
        let mut batch = Vec::with_capacity(size);
        loop {
            let deadline = Instant::now() + self.settings.delay;
            loop {
                let closed = shared.closed.load(Ordering::Acquire);
                let now = Instant::now();
                if closed || shared.queue.len() >= size || now >= deadline {
                    break;
                }
                // A wake-up may come early or spuriously: the loop checks.
                std::thread::park_timeout(deadline - now);
            }
            while let Some(span) = shared.queue.pop() {
                batch.push(span);
                if batch.len() == size {
                    self.export(std::mem::replace(&mut batch, Vec::with_capacity(size)));
                }
            }
            if !batch.is_empty() {
                self.export(std::mem::replace(&mut batch, Vec::with_capacity(size)));
            }
            // Closed: the worker pushes no more (it closes the queue from
            // its own thread), and what was queued went above.
            if shared.closed.load(Ordering::Acquire) && shared.queue.is_empty() {
                return;
            }
        }
    }

    /// Sends one batch. While the collector is unreachable (backing off)
    /// the batch is counted failed without being built or encoded, and no
    /// connection or name lookup is tried.
    fn export(&mut self, drafts: Vec<SpanDraft>) {
        let n = drafts.len() as u64;
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            if let Some(c) = self.counters {
                OtelCounters::add(&c.failed, n);
            }
            return;
        }
        // The attributes are built here, off the event loop.
        let spans: Vec<SpanRecord> = drafts.into_iter().map(SpanDraft::into_record).collect();
        let frame = Bytes::from(otlp::grpc_frame(&otlp::export_request(&self.resource, spans)));
        let endpoint = self.settings.endpoint.clone();
        let timeout = self.settings.timeout;
        let mut connection = self.connection.take();
        let reused = connection.is_some();
        let send = |connection: &mut Option<_>, frame: Bytes| {
            self.runtime.block_on(async {
                match tokio::time::timeout(timeout, call(connection, &endpoint, frame)).await {
                    Ok(r) => r,
                    Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
                }
            })
        };
        let mut result = send(&mut connection, frame.clone());
        if result.is_err() && reused {
            // A kept connection the collector (or a load balancer) closed
            // while idle: one more try on a new one.
            connection = None;
            result = send(&mut connection, frame);
        }
        match &result {
            Err(_) => {
                // Unreachable: wait before dialling again, doubling up to
                // MAX_BACKOFF, so a collector that is down costs no
                // connection attempt per batch.
                self.backoff = (self.backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
                self.retry_at = Some(Instant::now() + self.backoff);
            }
            Ok(_) => {
                self.backoff = Duration::ZERO;
                self.retry_at = None;
            }
        }
        let (exported, failed) = match result {
            Ok(ExportOutcome::Accepted) => {
                self.connection = connection;
                (n, 0)
            }
            Ok(ExportOutcome::Partial { rejected, message }) => {
                self.connection = connection;
                log(
                    NGX_LOG_WARN,
                    format!(
                        "dynamic_balancer_otel_exporter: {} refused {rejected} of {n} spans: {message}",
                        self.settings.endpoint
                    ),
                );
                let rejected = (rejected as u64).min(n);
                (n - rejected, rejected)
            }
            Ok(ExportOutcome::Failed { status, message }) => {
                self.connection = connection;
                self.failed(format!("gRPC status {status} {message}"));
                (0, n)
            }
            Err(e) => {
                // The connection is dropped: the next batch dials again.
                self.failed(e);
                (0, n)
            }
        };
        if failed == 0 && self.failing {
            self.failing = false;
            log(
                NGX_LOG_NOTICE,
                format!(
                    "dynamic_balancer_otel_exporter: exporting to {} again",
                    self.settings.endpoint
                ),
            );
        }
        if let Some(c) = self.counters {
            OtelCounters::add(&c.exported, exported);
            OtelCounters::add(&c.failed, failed);
        }
    }

    fn failed(&mut self, why: String) {
        if !self.failing {
            self.failing = true;
            log(
                NGX_LOG_WARN,
                format!(
                    "dynamic_balancer_otel_exporter: exporting to {} failed: {why}; spans are dropped until it answers",
                    self.settings.endpoint
                ),
            );
        }
    }
}

/// One `Export` call, dialling first when there is no connection.
async fn call(
    connection: &mut Option<h2::client::SendRequest<Bytes>>,
    endpoint: &str,
    frame: Bytes,
) -> Result<ExportOutcome, String> {
    if connection.is_none() {
        let tcp = tokio::net::TcpStream::connect(endpoint)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let (client, conn) = h2::client::handshake(tcp)
            .await
            .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
        // Drives the connection while this runtime runs (during exports).
        tokio::spawn(async move {
            let _ = conn.await;
        });
        *connection = Some(client);
    }
    let client = connection.clone().expect("dialled above");
    let mut client = client.ready().await.map_err(|e| format!("connection: {e}"))?;
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("http://{endpoint}{}", otlp::EXPORT_PATH))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header(
            "user-agent",
            concat!("dynamic-balancer-otlp/", env!("CARGO_PKG_VERSION")),
        )
        .body(())
        .map_err(|e| format!("request: {e}"))?;
    let (response, mut stream) = client
        .send_request(request, false)
        .map_err(|e| format!("request: {e}"))?;
    stream.send_data(frame, true).map_err(|e| format!("send: {e}"))?;
    let response = response.await.map_err(|e| format!("response: {e}"))?;
    let (parts, mut body) = response.into_parts();
    if parts.status != http::StatusCode::OK {
        *connection = None;
        return Err(format!("HTTP status {} (is this an OTLP/gRPC port?)", parts.status));
    }
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| format!("response body: {e}"))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        if data.len() < 64 * 1024 {
            data.extend_from_slice(&chunk);
        }
    }
    let trailers = body.trailers().await.map_err(|e| format!("trailers: {e}"))?;
    // A trailers-only answer carries the status in its headers.
    let field = |name: &str| {
        trailers
            .as_ref()
            .and_then(|t| t.get(name))
            .or_else(|| parts.headers.get(name))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    Ok(otlp::export_outcome(
        field("grpc-status").as_deref(),
        field("grpc-message").as_deref(),
        &data,
    ))
}
