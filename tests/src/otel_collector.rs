//! A real OpenTelemetry Collector (its OTLP receiver and the contrib file
//! exporter, built by `tests/otelcol/build.sh` from the Go module proxy,
//! once per machine) receiving the module's spans over OTLP/gRPC on
//! loopback. The spans it wrote are read back from its OTLP JSON file.
//! Stopped by PID when the handle drops.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use crate::controller::wait_until;
use crate::free_port;

/// The collector binary, built once per process (and per machine: the
/// script keeps it outside the clone).
fn binary() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("otelcol/build.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .expect("running tests/otelcol/build.sh");
        assert!(out.status.success(), "tests/otelcol/build.sh failed (see above)");
        let text = String::from_utf8(out.stdout).unwrap();
        PathBuf::from(text.lines().last().expect("the script prints the binary's path").trim())
    })
}

/// One span as the collector received it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub kind: i64,
    pub flags: u64,
    pub status_code: i64,
    pub start: u64,
    pub end: u64,
    pub attributes: Vec<(String, Value)>,
    /// The resource's `service.name`.
    pub service_name: String,
}

impl ReceivedSpan {
    /// An attribute's value as text (OTLP JSON writes ints as strings).
    pub fn attr(&self, key: &str) -> Option<String> {
        let v = &self.attributes.iter().find(|(k, _)| k == key)?.1;
        let inner = v.as_object()?.values().next()?;
        Some(match inner {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

pub struct Collector {
    child: Child,
    /// The OTLP/gRPC port.
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Collector {
    /// Starts a collector whose OTLP/gRPC receiver listens on a free
    /// loopback port, and waits until it accepts connections.
    pub fn start() -> Collector {
        let bin = binary();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let spans = dir.path().join("spans.json");
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:{port}\n\
             exporters:\n  file:\n    path: {}\n    flush_interval: 100ms\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n",
            spans.display()
        );
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("collector.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config={}", path.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let c = Collector { child, port, dir };
        assert!(
            wait_until(Duration::from_secs(30), || std::net::TcpStream::connect((
                "127.0.0.1",
                port
            ))
            .is_ok()),
            "the collector did not start:\n{}",
            c.log()
        );
        c
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("collector.log")).unwrap_or_default()
    }

    /// Every span the collector has written so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        let text = std::fs::read_to_string(self.dir.path().join("spans.json")).unwrap_or_default();
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(doc) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            for rs in doc["resourceSpans"].as_array().into_iter().flatten() {
                let service_name = rs["resource"]["attributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|a| a["key"] == "service.name")
                    .and_then(|a| a["value"]["stringValue"].as_str())
                    .unwrap_or_default()
                    .to_string();
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    for s in ss["spans"].as_array().into_iter().flatten() {
                        let text = |k: &str| s[k].as_str().unwrap_or_default().to_string();
                        let number = |k: &str| match &s[k] {
                            Value::String(t) => t.parse().unwrap_or(0),
                            v => v.as_u64().unwrap_or(0),
                        };
                        out.push(ReceivedSpan {
                            trace_id: text("traceId"),
                            span_id: text("spanId"),
                            parent_span_id: text("parentSpanId"),
                            name: text("name"),
                            kind: s["kind"].as_i64().unwrap_or(0),
                            flags: s["flags"].as_u64().unwrap_or(0),
                            status_code: s["status"]["code"].as_i64().unwrap_or(0),
                            start: number("startTimeUnixNano"),
                            end: number("endTimeUnixNano"),
                            attributes: s["attributes"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .map(|a| (a["key"].as_str().unwrap_or_default().to_string(), a["value"].clone()))
                                .collect(),
                            service_name: service_name.clone(),
                        });
                    }
                }
            }
        }
        out
    }

    /// Waits up to `timeout` until at least `n` spans arrived; returns what
    /// arrived.
    pub fn wait_spans(&self, n: usize, timeout: Duration) -> Vec<ReceivedSpan> {
        self.wait_matching(|s| s.len() >= n, timeout)
    }

    /// The spans received once `done` holds of them (or `timeout` passed):
    /// exporters of several workers or edges deliver in no fixed order.
    pub fn wait_matching(&self, done: impl Fn(&[ReceivedSpan]) -> bool, timeout: Duration) -> Vec<ReceivedSpan> {
        let mut spans = Vec::new();
        wait_until(timeout, || {
            spans = self.spans();
            done(&spans)
        });
        spans
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
