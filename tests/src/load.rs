//! A bounded HTTP/1.1 load for the cluster tier: a few client threads,
//! each paced to a fixed rate, some on one keep-alive connection, some on a
//! new connection per request, GET and POST. Every request is recorded
//! (when, which client, the status or the socket error, the Pod that
//! answered) so a scenario can count failures and see which Pods served.
//!
//! The load stops when told, or at its time or request limit, whichever
//! comes first: a test can never leave it running.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

/// One client thread's way of sending.
#[derive(Clone, Copy, Debug)]
pub struct Client {
    pub method: Method,
    pub keep_alive: bool,
    /// Requests per second.
    pub rate: u32,
}

#[derive(Clone, Debug)]
pub struct Sample {
    /// Since the load started.
    pub at: Duration,
    pub client: usize,
    pub method: Method,
    pub keep_alive: bool,
    /// The status, or the error when no response came.
    pub outcome: Result<u16, String>,
    /// The Pod named in the body.
    pub pod: Option<String>,
    /// Refused connections retried before this one (with `retry_refused`).
    pub retried: u32,
}

impl Sample {
    pub fn failed(&self) -> bool {
        !matches!(self.outcome, Ok(s) if (200..300).contains(&s))
    }
}

pub struct Options {
    pub target: SocketAddr,
    pub host: String,
    pub path: String,
    pub clients: Vec<Client>,
    /// A connection refused before anything was sent is tried again (up to
    /// 50 times, 20 ms apart), as a client library with connect retries does.
    pub retry_refused: bool,
    pub max_duration: Duration,
    pub max_requests: usize,
}

pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    samples: Arc<Mutex<Vec<Sample>>>,
    pub started: Instant,
}

fn connect(target: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Sends one request on `stream` and reads the response: (status, body,
/// whether the server keeps the connection).
fn exchange(
    stream: &mut TcpStream,
    opts: &Options,
    method: Method,
    keep_alive: bool,
) -> Result<(u16, String, bool), String> {
    let body = if method == Method::Post {
        "x".repeat(512)
    } else {
        String::new()
    };
    let req = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n{}",
        if method == Method::Get { "GET" } else { "POST" },
        opts.path,
        opts.host,
        body.len(),
        if keep_alive { "keep-alive" } else { "close" },
        body
    );
    stream.write_all(req.as_bytes()).map_err(|e| format!("write: {e}"))?;
    let mut reader = BufReader::new(&mut *stream);
    let mut line = String::new();
    if reader.read_line(&mut line).map_err(|e| format!("read: {e}"))? == 0 {
        return Err("closed before a response".into());
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {line:?}"))?;
    let mut length = 0usize;
    let mut close = false;
    loop {
        line.clear();
        reader.read_line(&mut line).map_err(|e| format!("read: {e}"))?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let lower = l.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("connection:") && lower.contains("close") {
            close = true;
        }
    }
    let mut buf = vec![0; length];
    reader.read_exact(&mut buf).map_err(|e| format!("read body: {e}"))?;
    Ok((status, String::from_utf8_lossy(&buf).into_owned(), !close))
}

fn run_client(
    i: usize,
    c: Client,
    opts: Arc<Options>,
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    started: Instant,
) {
    let period = Duration::from_secs_f64(1.0 / c.rate.max(1) as f64);
    let mut next = Instant::now();
    let mut conn: Option<TcpStream> = None;
    let mut sent = 0usize;
    let per_client_max = opts.max_requests / opts.clients.len().max(1);
    while !stop.load(Ordering::Relaxed) && started.elapsed() < opts.max_duration && sent < per_client_max {
        let now = Instant::now();
        if now < next {
            std::thread::sleep(next - now);
        }
        next += period;
        sent += 1;
        let at = started.elapsed();
        let mut retried = 0;
        let outcome = loop {
            let stream = match conn.take() {
                Some(s) => Ok(s),
                None => connect(opts.target),
            };
            match stream {
                Err(e) if opts.retry_refused && e.kind() == std::io::ErrorKind::ConnectionRefused && retried < 50 => {
                    retried += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => break Err(format!("connect: {e}")),
                Ok(mut s) => {
                    let r = exchange(&mut s, &opts, c.method, c.keep_alive);
                    if let Ok((_, _, true)) = r {
                        if c.keep_alive {
                            conn = Some(s);
                        }
                    }
                    break r.map(|(status, body, _)| (status, body));
                }
            }
        };
        let (outcome, pod) = match outcome {
            Ok((status, body)) => (Ok(status), body.split_whitespace().next().map(str::to_string)),
            Err(e) => (Err(e), None),
        };
        samples.lock().unwrap().push(Sample {
            at,
            client: i,
            method: c.method,
            keep_alive: c.keep_alive,
            outcome,
            pod,
            retried,
        });
    }
}

impl Load {
    pub fn start(opts: Options) -> Load {
        let opts = Arc::new(opts);
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let threads = opts
            .clients
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (c, opts, stop, samples) = (*c, opts.clone(), stop.clone(), samples.clone());
                std::thread::spawn(move || run_client(i, c, opts, stop, samples, started))
            })
            .collect();
        Load {
            stop,
            threads,
            samples,
            started,
        }
    }

    /// What has been recorded so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    /// Stops every client and returns the whole record.
    pub fn finish(mut self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        Report {
            samples: self.samples.lock().unwrap().clone(),
            took: self.started.elapsed(),
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The record of a finished load.
pub struct Report {
    pub samples: Vec<Sample>,
    pub took: Duration,
}

impl Report {
    pub fn count(&self, method: Method) -> usize {
        self.samples.iter().filter(|s| s.method == method).count()
    }
    pub fn failures(&self, method: Method) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| s.method == method && s.failed())
            .collect()
    }
    pub fn rate(&self) -> f64 {
        self.samples.len() as f64 / self.took.as_secs_f64().max(0.001)
    }
    /// Pods that answered, with the times of their first and last answer.
    pub fn pods(&self) -> std::collections::BTreeMap<String, (Duration, Duration)> {
        let mut out = std::collections::BTreeMap::new();
        for s in &self.samples {
            if let (Some(p), false) = (&s.pod, s.failed()) {
                let e = out.entry(p.clone()).or_insert((s.at, s.at));
                e.0 = e.0.min(s.at);
                e.1 = e.1.max(s.at);
            }
        }
        out
    }
    /// A line per failure kind: "GET keep-alive: 502 x3".
    pub fn failure_summary(&self) -> String {
        let mut counts = std::collections::BTreeMap::new();
        for s in self.samples.iter().filter(|s| s.failed()) {
            let what = match &s.outcome {
                Ok(status) => status.to_string(),
                Err(e) => e.clone(),
            };
            *counts
                .entry(format!(
                    "{:?} {}: {what}",
                    s.method,
                    if s.keep_alive { "keep-alive" } else { "new connection" }
                ))
                .or_insert(0) += 1;
        }
        counts
            .iter()
            .map(|(k, v)| format!("{k} x{v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The usual mix: GET and POST, each on keep-alive and new connections,
/// `rate` requests per second in all.
pub fn mixed(rate: u32) -> Vec<Client> {
    let each = (rate / 4).max(1);
    [
        (Method::Get, true),
        (Method::Get, false),
        (Method::Post, true),
        (Method::Post, false),
    ]
    .into_iter()
    .map(|(method, keep_alive)| Client {
        method,
        keep_alive,
        rate: each,
    })
    .collect()
}
