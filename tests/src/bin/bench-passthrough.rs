//! TLS passthrough (`--enable-ssl-passthrough`): what nginx's `stream {}`
//! with `ssl_preread` and the module's balancer costs a TLS connection,
//! against the same TLS upstream reached directly and (for reference)
//! through a userspace proxy in this process, as ingress-nginx's Go
//! passthrough proxy is one. Side by side in one run, the order of the
//! sides rotating round by round:
//!
//! - handshakes per second: full TLS handshakes (no session cache, no
//!   tickets) with SNI `pass.test`, from two client threads, a bounded
//!   count per round. Each connection is: connect, handshake, one byte
//!   from the client, then the upstream's close_notify and close, so the
//!   server side closes first (TIME_WAIT stays there, as in `bench-stream`)
//!   and the byte proves that the upstream finished its side of the
//!   handshake. Also the proxy's CPU time per handshake (nginx: the
//!   worker; userspace: the proxy's runtime threads);
//! - throughput: one TLS connection per round that sends its share of the
//!   total (1 GiB per side by default) to the upstream, which decrypts and
//!   discards it and acknowledges the count; timed from after the
//!   handshake to the acknowledgement, in MB/s, and the proxy's CPU time
//!   per GiB.
//!
//! nginx (one worker) runs the `stream {}` block the controller renders
//! for ssl-passthrough (controller/tests/golden/ssl-passthrough): a
//! `hostnames` map from `$ssl_preread_server_name` to the backend name, a
//! map choosing `passthrough_balancer` (`dynamic_balancer
//! $passthrough_backend proxy_protocol=off`) or the HTTP servers' TLS
//! listener on a Unix socket (`local_https`), and `ssl_preread on;
//! proxy_protocol on;` on the listener. The backend `pass-backend` is
//! pushed through the API like any other. `stream {}` logs errors at
//! `notice`, as the controller renders it: the harness's `info` would
//! write three lines per connection.
//!
//! The upstream is an OpenSSL server in this process (ECDSA P-256
//! certificate made at start; `BENCH_PASSTHROUGH_KEY=rsa` for RSA-2048),
//! several accepting threads each serving its connection. The userspace
//! proxy is a tokio runtime of 2 worker threads that reads the first TLS
//! record, takes the SNI from the ClientHello, looks the host up, connects
//! and writes that record, then `copy_bidirectional` with 16 KiB buffers
//! (nginx's `proxy_buffer_size`). Everything shares the machine's cores:
//! a figure is the whole system's, clients and upstream included.
//!
//! `cargo run --release -p tests --bin bench-passthrough [-- --quick]`
//!
//! Environment: `BENCH_PASSTHROUGH_ROUNDS` (7), `BENCH_PASSTHROUGH_HANDSHAKES`
//! (handshakes per round and side, 2000), `BENCH_PASSTHROUGH_CLIENTS`
//! (client threads, 2), `BENCH_PASSTHROUGH_BYTES` (bytes per side over all
//! rounds, 1 GiB), `BENCH_PASSTHROUGH_USERSPACE=0` (no userspace proxy),
//! `BENCH_PASSTHROUGH_KEY=rsa`, `BENCH_PASSTHROUGH_ACCESS_LOG=1` (the
//! controller's stream access log, to a file); `--quick` or
//! `BENCH_PASSTHROUGH_QUICK=1` makes them 2, 200 and 16 MiB, a smoke run.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openssl::pkey::PKey;
use openssl::ssl::{
    Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslSessionCacheMode, SslVerifyMode, SslVersion,
};
use openssl::x509::X509;
use tests::bench::{median, thread_cpu_ns, Proc};
use tests::free_port;
use tests::tls::{handshake, TestCert};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The passthrough host, as the client's SNI.
const HOST: &str = "pass.test";
/// Its backend in the module's zone.
const BACKEND: &str = "pass-backend";
/// No round of handshakes runs longer than this.
const ROUND_LIMIT: Duration = Duration::from_secs(30);
/// Accepting threads of the upstream, each serving its connection itself.
const UPSTREAM_THREADS: usize = 8;
/// The first application byte of a counted transfer; any other first byte
/// ends the connection (the handshake benchmark's).
const SINK: u8 = b'S';
/// Write size of the transfers.
const CHUNK: usize = 256 * 1024;
/// The userspace proxy's copy buffers, each way (nginx's stream
/// `proxy_buffer_size` default).
const PROXY_BUFFER: usize = 16 * 1024;

struct Settings {
    rounds: usize,
    clients: usize,
    handshakes: usize,
    bytes: u64,
    userspace: bool,
    rsa: bool,
    access_log: bool,
}

fn settings() -> Settings {
    let quick = std::env::args().any(|a| a == "--quick") || std::env::var_os("BENCH_PASSTHROUGH_QUICK").is_some();
    let env = tests::bench::env_number;
    let (rounds, handshakes, bytes) = if quick { (2, 200, 16 << 20) } else { (7, 2_000, 1 << 30) };
    Settings {
        rounds: env("BENCH_PASSTHROUGH_ROUNDS", rounds).max(1) as usize,
        clients: env("BENCH_PASSTHROUGH_CLIENTS", 2).max(1) as usize,
        handshakes: env("BENCH_PASSTHROUGH_HANDSHAKES", handshakes).max(1) as usize,
        bytes: env("BENCH_PASSTHROUGH_BYTES", bytes).max(1),
        userspace: env("BENCH_PASSTHROUGH_USERSPACE", 1) != 0,
        rsa: std::env::var("BENCH_PASSTHROUGH_KEY").is_ok_and(|k| k.eq_ignore_ascii_case("rsa")),
        access_log: env("BENCH_PASSTHROUGH_ACCESS_LOG", 0) != 0,
    }
}

/// One side's figures in one round. The proxy figures are NaN for the
/// direct side.
#[derive(Clone, Copy)]
struct Figures {
    hs_per_s: f64,
    /// The proxy's CPU time per handshake, microseconds.
    us_per_hs: f64,
    mb_per_s: f64,
    /// The proxy's CPU time per GiB transferred, milliseconds.
    ms_per_gib: f64,
    /// The transfer's wall time, seconds.
    transfer_s: f64,
}

const NAMES: [&str; 3] = ["direct", "nginx passthrough", "userspace proxy"];
const SHORT: [&str; 3] = ["direct", "nginx", "userspace"];

/// The CPU time, in nanoseconds, of what sits between client and upstream.
type CpuClock<'a> = Box<dyn Fn() -> u64 + 'a>;

/// A figure of [`Figures`], its label, and whether lower is better.
type Column = (&'static str, fn(&Figures) -> f64, bool);

const COLUMNS: [Column; 4] = [
    ("handshakes/s", |f| f.hs_per_s, false),
    ("MB/s", |f| f.mb_per_s, false),
    ("proxy CPU us/handshake", |f| f.us_per_hs, true),
    ("proxy CPU ms/GiB", |f| f.ms_per_gib, true),
];

fn main() {
    let s = settings();
    let per_round = s.bytes.div_ceil(s.rounds as u64);
    let (cert, local_cert) = if s.rsa {
        (TestCert::rsa(HOST), TestCert::rsa("local.test"))
    } else {
        (TestCert::new(HOST), TestCert::new("local.test"))
    };
    let upstream = TlsUpstream::start(&cert);
    let upstream_addr = SocketAddr::from(([127, 0, 0, 1], upstream.port));

    let files = tempfile::tempdir().unwrap();
    let local_pem = files.path().join("local.pem");
    std::fs::write(&local_pem, format!("{}{}", local_cert.cert_pem, local_cert.key_pem)).unwrap();
    let socket = files.path().join("https.sock");
    let (passthrough, api) = (free_port(), free_port());
    let access_log = if s.access_log {
        format!(
            "log_format log_stream '[$remote_addr] [$time_local] $protocol $status $bytes_sent $bytes_received $session_time';\n    \
             access_log {} log_stream;\n    ",
            files.path().join("stream-access.log").display()
        )
    } else {
        String::new()
    };
    let nginx = Proc::start(&format!(
        r#"worker_processes 1;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    dynamic_balancer_zone 8m;
    real_ip_header proxy_protocol;
    set_real_ip_from unix:;
    server {{ listen 127.0.0.1:{api}; location /configuration {{ dynamic_balancer_api; }} }}
    server {{ listen unix:{socket} ssl proxy_protocol; ssl_certificate {pem}; ssl_certificate_key {pem}; return 200 "terminated\n"; }}
}}
stream {{
    error_log logs/error.log notice;
    {access_log}map $ssl_preread_server_name $passthrough_backend {{ hostnames; {HOST} {BACKEND}; default ""; }}
    map $passthrough_backend $https_upstream {{ "" local_https; default passthrough_balancer; }}
    upstream passthrough_balancer {{ dynamic_balancer $passthrough_backend proxy_protocol=off; }}
    upstream local_https {{ server unix:{socket}; }}
    server {{ listen 127.0.0.1:{passthrough} backlog=4096; ssl_preread on; proxy_protocol on; proxy_pass $https_upstream; }}
}}
"#,
        socket = socket.display(),
        pem = local_pem.display(),
    ));
    let body = serde_json::json!([{
        "name": BACKEND,
        "endpoints": [{"address": "127.0.0.1", "port": upstream.port.to_string()}]
    }])
    .to_string();
    let posted = ureq::post(&format!("http://127.0.0.1:{api}/configuration/backends")).send(&body);
    assert_eq!(posted.map(|r| r.status().as_u16()).ok(), Some(201), "POST failed");
    let worker = nginx.worker_pids()[0];
    let proxy = s
        .userspace
        .then(|| UserspaceProxy::start(HashMap::from([(HOST.to_string(), upstream_addr)])));

    // The sides: their port and the CPU clock of what sits in the middle.
    let mut sides: Vec<(usize, u16, Option<CpuClock>)> = vec![
        (0, upstream.port, None),
        (1, passthrough, Some(Box::new(move || thread_cpu_ns(worker, worker)))),
    ];
    if let Some(p) = &proxy {
        sides.push((2, p.port, Some(Box::new(|| p.cpu_ns()))));
    }

    // Each side must show the upstream's certificate for pass.test; nginx
    // must send any other name to its own TLS servers.
    for (side, port, _) in &sides {
        let shown = handshake(*port, Some(HOST), &[]).unwrap_or_else(|e| panic!("{}: {e}", NAMES[*side]));
        assert_eq!(
            shown.sha256, cert.sha256,
            "{} does not pass pass.test through",
            NAMES[*side]
        );
    }
    let other = handshake(passthrough, Some("other.test"), &[]).expect("an unknown name through nginx");
    assert_eq!(
        other.sha256, local_cert.sha256,
        "an unknown name did not reach local_https"
    );
    let (version, cipher) = negotiated(upstream.port);

    println!(
        "bench-passthrough: {} rounds; {} handshakes per round and side ({} client threads, {} {}, {}, \
         no session reuse); {} MiB per round and side ({} MiB in all); one nginx worker{}",
        s.rounds,
        s.handshakes,
        s.clients,
        version,
        cipher,
        if s.rsa { "RSA-2048" } else { "ECDSA P-256" },
        per_round >> 20,
        (per_round * s.rounds as u64) >> 20,
        if s.access_log { ", stream access log on" } else { "" },
    );
    // Warm up every path: connections, the worker's backend, the proxy's threads.
    for (_, port, _) in &sides {
        handshakes(*port, 200.min(s.handshakes), s.clients);
        transfer(*port, per_round.min(16 << 20)).unwrap();
    }

    println!("round  side            hs/s  us/hs     MB/s  ms/GiB   (us and ms: the proxy's CPU time)");
    let nan = f64::NAN;
    let mut results: Vec<[Option<Figures>; 3]> = Vec::new();
    let mut failures = [0usize; 3];
    for round in 1..=s.rounds {
        // Rotate the order, so drift in machine load spreads evenly.
        let mut order: Vec<usize> = (0..sides.len()).collect();
        order.rotate_left((round - 1) % sides.len());
        if round % 2 == 0 {
            order.reverse();
        }
        let mut row = [None; 3];
        for i in order {
            let (side, port, cpu) = &sides[i];
            let cpu_now = || cpu.as_ref().map_or(0, |f| f());
            let before = cpu_now();
            let (done, failed, elapsed) = handshakes(*port, s.handshakes, s.clients);
            let hs_cpu = cpu_now().saturating_sub(before) as f64;
            failures[*side] += failed;
            let before = cpu_now();
            let transfer_s = transfer(*port, per_round).unwrap_or_else(|e| panic!("{}: transfer: {e}", NAMES[*side]));
            let transfer_cpu = cpu_now().saturating_sub(before) as f64;
            let f = Figures {
                hs_per_s: done as f64 / elapsed,
                us_per_hs: if cpu.is_some() {
                    hs_cpu / 1e3 / done.max(1) as f64
                } else {
                    nan
                },
                mb_per_s: per_round as f64 / transfer_s / 1e6,
                ms_per_gib: if cpu.is_some() {
                    transfer_cpu / 1e6 * (1u64 << 30) as f64 / per_round as f64
                } else {
                    nan
                },
                transfer_s,
            };
            println!(
                "{round:>5}  {:<9} {:>10.0}  {:>5}  {:>7.0}  {:>6}{}",
                SHORT[*side],
                f.hs_per_s,
                optional(f.us_per_hs, 1),
                f.mb_per_s,
                optional(f.ms_per_gib, 0),
                if failed > 0 {
                    format!("  ({failed} handshakes failed)")
                } else {
                    String::new()
                },
            );
            row[*side] = Some(f);
        }
        results.push(row);
    }

    let present: Vec<usize> = sides.iter().map(|(side, _, _)| *side).collect();
    let med =
        |f: fn(&Figures) -> f64, side: usize| median(results.iter().filter_map(|r| r[side]).map(|x| f(&x)).collect());
    let per_round_ratio = |f: fn(&Figures) -> f64, a: usize, b: usize| {
        median(results.iter().filter_map(|r| Some(f(&r[a]?) / f(&r[b]?))).collect())
    };
    println!();
    print!("medians                 ");
    for &side in &present {
        print!("  {:>17}", NAMES[side]);
    }
    println!("   ratios of medians (median of per-round ratios)");
    for (label, f, lower_better) in COLUMNS {
        print!("{label:<24}");
        for &side in &present {
            print!("  {:>17}", optional(med(f, side), 1));
        }
        // Throughput ratios against direct; CPU ratios nginx ÷ userspace.
        let pairs: &[(usize, usize)] = if lower_better { &[(1, 2)] } else { &[(1, 0), (2, 0)] };
        for &(a, b) in pairs {
            if present.contains(&a) && present.contains(&b) {
                print!(
                    "   {}/{} {:.3} ({:.3})",
                    SHORT[a],
                    SHORT[b],
                    med(f, a) / med(f, b),
                    per_round_ratio(f, a, b)
                );
            }
        }
        println!("{}", if lower_better { "  (lower is better)" } else { "" });
    }
    // Throughput over each side's whole transfer (all rounds together).
    let total = per_round * s.rounds as u64;
    let overall = |side: usize| {
        total as f64
            / 1e6
            / results
                .iter()
                .filter_map(|r| r[side])
                .map(|f| f.transfer_s)
                .sum::<f64>()
    };
    print!("MB/s over all {} MiB of each side:", total >> 20);
    for &side in &present {
        print!(" {} {:.0};", SHORT[side], overall(side));
    }
    println!(" nginx/direct {:.3}", overall(1) / overall(0));
    if per_round < 512 << 20 {
        println!(
            "(transfers of {} MiB take a fraction of a second and swing by 10% or more on a shared machine; \
             BENCH_PASSTHROUGH_BYTES={} gives a steadier MB/s)",
            per_round >> 20,
            10u64 << 30
        );
    }
    for &side in &present {
        if failures[side] > 0 {
            println!("{}: {} handshakes failed in all", NAMES[side], failures[side]);
        }
    }
    let upstream_errors = upstream.errors.load(Ordering::Relaxed);
    if upstream_errors > 0 {
        println!("the upstream saw {upstream_errors} connections fail");
    }
    let log = nginx.error_log();
    let problems: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("[error]") || l.contains("[crit]") || l.contains("[alert]"))
        .collect();
    if let Some(first) = problems.first() {
        println!("nginx logged {} error lines; the first: {first}", problems.len());
    }
}

/// `v` with `decimals`, or `-` for NaN.
fn optional(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.decimals$}")
    }
}

/// The client context: no verification (self-signed), no session reuse.
fn client_context() -> SslContext {
    let mut b = SslContext::builder(SslMethod::tls_client()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    b.set_min_proto_version(Some(SslVersion::TLS1_2)).unwrap();
    b.set_session_cache_mode(SslSessionCacheMode::OFF);
    b.set_options(SslOptions::NO_TICKET);
    b.build()
}

/// A TLS client connection to `port` with SNI [`HOST`], after the handshake.
fn connect(ctx: &SslContext, port: u16) -> io::Result<openssl::ssl::SslStream<TcpStream>> {
    let mut ssl = Ssl::new(ctx).map_err(io::Error::other)?;
    ssl.set_hostname(HOST).map_err(io::Error::other)?;
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    stream.set_write_timeout(Some(Duration::from_secs(60)))?;
    ssl.connect(stream).map_err(|e| io::Error::other(e.to_string()))
}

/// The protocol version and cipher a connection to `port` agrees on.
fn negotiated(port: u16) -> (String, String) {
    let tls = connect(&client_context(), port).unwrap();
    let ssl = tls.ssl();
    (
        ssl.version_str().to_string(),
        ssl.current_cipher().map(|c| c.name().to_string()).unwrap_or_default(),
    )
}

/// `count` full handshakes to `port` from `clients` threads (at most
/// [`ROUND_LIMIT`]): those that succeeded, those that failed, and the
/// wall time in seconds.
fn handshakes(port: u16, count: usize, clients: usize) -> (usize, usize, f64) {
    let next = AtomicUsize::new(0);
    let first_error = Mutex::new(None);
    let started = Instant::now();
    let (done, failed) = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..clients)
            .map(|_| {
                scope.spawn(|| {
                    let ctx = client_context();
                    let (mut done, mut failed) = (0, 0);
                    while next.fetch_add(1, Ordering::Relaxed) < count && started.elapsed() < ROUND_LIMIT {
                        match one_handshake(&ctx, port) {
                            Ok(()) => done += 1,
                            Err(e) => {
                                failed += 1;
                                first_error.lock().unwrap().get_or_insert(e.to_string());
                            }
                        }
                    }
                    (done, failed)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .fold((0, 0), |(d, f), (d1, f1)| (d + d1, f + f1))
    });
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(e) = first_error.into_inner().unwrap() {
        eprintln!("port {port}: {failed} of {count} handshakes failed; the first: {e}");
        assert!(done > 0, "every handshake to {port} failed");
    }
    // The proxy finishes a session after the upstream's close; let the last ones end.
    std::thread::sleep(Duration::from_millis(50));
    (done, failed, elapsed)
}

/// Connect, handshake, one byte; then the upstream's close_notify and close.
fn one_handshake(ctx: &SslContext, port: u16) -> io::Result<()> {
    let mut tls = connect(ctx, port)?;
    tls.write_all(b"h")?;
    let mut end = [0u8; 1];
    match tls.read(&mut end)? {
        0 => Ok(()),
        n => Err(io::Error::other(format!("{n} bytes instead of the close"))),
    }
}

/// `bytes` through `port` to the upstream's sink on one TLS connection:
/// seconds from after the handshake to the acknowledgement.
fn transfer(port: u16, bytes: u64) -> io::Result<f64> {
    let mut tls = connect(&client_context(), port)?;
    let started = Instant::now();
    let mut head = [SINK; 9];
    head[1..].copy_from_slice(&bytes.to_be_bytes());
    tls.write_all(&head)?;
    let chunk = vec![0x5au8; CHUNK];
    let mut left = bytes;
    while left > 0 {
        let n = chunk.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        tls.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    let mut ack = [0u8; 8];
    tls.read_exact(&mut ack)?;
    if u64::from_be_bytes(ack) != bytes {
        return Err(io::Error::other("the sink acknowledged another count"));
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The TLS upstream: [`UPSTREAM_THREADS`] threads accepting on one
/// listener. A connection whose first byte is [`SINK`] is a counted
/// transfer (8-byte big-endian count, the bytes, the count written back,
/// until EOF); any other first byte gets close_notify and the close.
struct TlsUpstream {
    port: u16,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    errors: Arc<AtomicUsize>,
}

impl TlsUpstream {
    fn start(cert: &TestCert) -> TlsUpstream {
        let mut b = SslContextBuilder::new(SslMethod::tls_server()).unwrap();
        b.set_certificate(&X509::from_pem(cert.cert_pem.as_bytes()).unwrap())
            .unwrap();
        b.set_private_key(&PKey::private_key_from_pem(cert.key_pem.as_bytes()).unwrap())
            .unwrap();
        b.set_session_cache_mode(SslSessionCacheMode::OFF);
        b.set_options(SslOptions::NO_TICKET);
        b.set_num_tickets(0).unwrap();
        b.set_read_ahead(true);
        let ctx = Arc::new(b.build());
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(AtomicUsize::new(0));
        let threads = (0..UPSTREAM_THREADS)
            .map(|_| {
                let (listener, ctx) = (listener.try_clone().unwrap(), ctx.clone());
                let (stop, errors) = (stop.clone(), errors.clone());
                std::thread::spawn(move || {
                    for stream in listener.incoming() {
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        let Ok(stream) = stream else { continue };
                        if serve(&ctx, stream).is_err() {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        TlsUpstream {
            port,
            stop,
            threads,
            errors,
        }
    }
}

fn serve(ctx: &SslContext, stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let ssl = Ssl::new(ctx).map_err(io::Error::other)?;
    let mut tls = ssl.accept(stream).map_err(|e| io::Error::other(e.to_string()))?;
    let mut first = [0u8; 1];
    if tls.read(&mut first)? == 0 {
        return Ok(());
    }
    if first[0] != SINK {
        // close_notify, then the close (the TIME_WAIT stays on this side).
        return tls.shutdown().map(drop).map_err(|e| io::Error::other(e.to_string()));
    }
    let mut buf = vec![0u8; CHUNK];
    loop {
        let mut count = [0u8; 8];
        match tls.read_exact(&mut count) {
            Ok(()) => {}
            // The client closes without close_notify after the acknowledgement.
            Err(_) => return Ok(()),
        }
        let mut left = u64::from_be_bytes(count);
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = tls.read(&mut buf[..want])?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            left -= n as u64;
        }
        tls.write_all(&count)?;
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake each accepting thread; it sees the flag and returns.
        for _ in &self.threads {
            let _ = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], self.port)), Duration::from_secs(1));
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A userspace TLS passthrough proxy, as ingress-nginx's: read the
/// ClientHello, route by its SNI, then copy both ways.
struct UserspaceProxy {
    port: u16,
    /// Thread ids of the runtime's threads (their CPU time is the proxy's).
    tids: Arc<Mutex<Vec<i32>>>,
    _runtime: tokio::runtime::Runtime,
}

impl UserspaceProxy {
    fn start(routes: HashMap<String, SocketAddr>) -> UserspaceProxy {
        let tids = Arc::new(Mutex::new(Vec::new()));
        let record = tids.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_io()
            .on_thread_start(move || {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
                record.lock().unwrap().push(tid);
            })
            .build()
            .unwrap();
        let listener = runtime.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
            socket.listen(4096).unwrap()
        });
        let port = listener.local_addr().unwrap().port();
        let routes = Arc::new(routes);
        runtime.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let routes = routes.clone();
                tokio::spawn(async move {
                    let _ = relay(client, &routes).await;
                });
            }
        });
        UserspaceProxy {
            port,
            tids,
            _runtime: runtime,
        }
    }

    /// CPU time of the runtime's threads, nanoseconds.
    fn cpu_ns(&self) -> u64 {
        let me = std::process::id();
        self.tids
            .lock()
            .unwrap()
            .iter()
            .map(|&t| thread_cpu_ns(me, t as u32))
            .sum()
    }
}

async fn relay(mut client: tokio::net::TcpStream, routes: &HashMap<String, SocketAddr>) -> io::Result<()> {
    client.set_nodelay(true)?;
    // The first TLS record whole (the ClientHello).
    let mut hello = Vec::with_capacity(4096);
    loop {
        if hello.len() >= 5 && hello.len() >= 5 + usize::from(u16::from_be_bytes([hello[3], hello[4]])) {
            break;
        }
        if hello.len() > 5 + 16384 || client.read_buf(&mut hello).await? == 0 {
            return Ok(());
        }
    }
    let Some(&address) = client_hello_sni(&hello).and_then(|name| routes.get(name)) else {
        return Ok(());
    };
    let mut upstream = tokio::net::TcpStream::connect(address).await?;
    upstream.set_nodelay(true)?;
    upstream.write_all(&hello).await?;
    tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, PROXY_BUFFER, PROXY_BUFFER).await?;
    Ok(())
}

/// The server name of a TLS record holding a whole ClientHello.
fn client_hello_sni(record: &[u8]) -> Option<&str> {
    struct Reader<'a>(&'a [u8]);
    impl<'a> Reader<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            let (head, rest) = (self.0.get(..n)?, &self.0[n..]);
            self.0 = rest;
            Some(head)
        }
        fn int(&mut self, bytes: usize) -> Option<usize> {
            Some(self.take(bytes)?.iter().fold(0, |v, &b| v << 8 | usize::from(b)))
        }
        /// A length of `bytes` bytes, then that many bytes.
        fn vector(&mut self, bytes: usize) -> Option<Reader<'a>> {
            let n = self.int(bytes)?;
            Some(Reader(self.take(n)?))
        }
    }
    let mut r = Reader(record);
    if r.int(1)? != 0x16 {
        return None; // not a handshake record
    }
    r.take(2)?; // the record's version
    let mut r = r.vector(2)?;
    if r.int(1)? != 1 {
        return None; // not a ClientHello
    }
    let mut hello = r.vector(3)?;
    hello.take(2 + 32)?; // version, random
    hello.vector(1)?; // session id
    hello.vector(2)?; // cipher suites
    hello.vector(1)?; // compression methods
    let mut extensions = hello.vector(2)?;
    while !extensions.0.is_empty() {
        let kind = extensions.int(2)?;
        let mut body = extensions.vector(2)?;
        if kind == 0 {
            let mut names = body.vector(2)?;
            while !names.0.is_empty() {
                let name_type = names.int(1)?;
                let name = names.vector(2)?.0;
                if name_type == 0 {
                    return std::str::from_utf8(name).ok();
                }
            }
            return None;
        }
    }
    None
}
