//! Layer 4 throughput: stock nginx `upstream stock { server A; server B; }`
//! (A) against `dynamic_balancer` with a backend of the same two endpoints
//! (B), two `stream{}` servers side by side in one nginx (one worker), the
//! measurements alternating between them round by round:
//!
//! - connections per second: short connections (connect, send 1 byte, read
//!   its echo, then the close that the upstream starts and nginx passes on)
//!   from two client threads, and the worker's CPU time per connection. The
//!   servers close first so that TIME_WAIT stays on their side, and tens of
//!   thousands of connections do not exhaust the clients' ephemeral ports
//!   (connect() slows down long before);
//! - throughput: one connection per round that sends its share of the total
//!   (1 GiB per side by default) to an upstream that discards it and
//!   acknowledges the count at the end, in MB/s.
//!
//! The upstreams are two [`TcpEcho::bench`] servers in this process. It
//! prints each round, the medians and the ratios B/A (goal: ≥ 0.97).
//!
//! `cargo run --release -p tests --bin bench-stream [-- --quick]`
//!
//! Environment: `BENCH_STREAM_ROUNDS` (7), `BENCH_STREAM_CONNECTIONS`
//! (connections per round and side, 10000), `BENCH_STREAM_CLIENTS` (client
//! threads, 2), `BENCH_STREAM_BYTES` (bytes per side over all rounds,
//! 1 GiB); `--quick` or `BENCH_STREAM_QUICK=1` makes
//! them 2, 200 and 16 MiB, a smoke run for CI.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tests::bench::{median, Proc};
use tests::echo::{sink_transfer, TcpEcho};
use tests::free_port;

/// No round of short connections runs longer than this.
const ROUND_LIMIT: Duration = Duration::from_secs(30);

struct Settings {
    rounds: usize,
    clients: usize,
    connections: usize,
    bytes: u64,
}

fn settings() -> Settings {
    let quick = std::env::args().any(|a| a == "--quick") || std::env::var_os("BENCH_STREAM_QUICK").is_some();
    let env = tests::bench::env_number;
    let (rounds, connections, bytes) = if quick {
        (2, 200, 16 << 20)
    } else {
        (7, 10_000, 1 << 30)
    };
    Settings {
        rounds: env("BENCH_STREAM_ROUNDS", rounds).max(1) as usize,
        clients: env("BENCH_STREAM_CLIENTS", 2).max(1) as usize,
        connections: env("BENCH_STREAM_CONNECTIONS", connections).max(1) as usize,
        bytes: env("BENCH_STREAM_BYTES", bytes).max(1),
    }
}

/// One side's figures in one round.
#[derive(Clone, Copy, Default)]
struct Figures {
    conns_per_s: f64,
    /// The worker's CPU time per short connection, microseconds.
    us_per_conn: f64,
    mb_per_s: f64,
    /// The worker's CPU time per GiB transferred, milliseconds.
    ms_per_gib: f64,
    /// The transfer's wall time, seconds.
    transfer_s: f64,
}

/// A figure of [`Figures`], its label, and whether lower is better.
type Column = (&'static str, fn(&Figures) -> f64, bool);

const COLUMNS: [Column; 4] = [
    ("connections/s", |f| f.conns_per_s, false),
    ("worker us/connection", |f| f.us_per_conn, true),
    ("MB/s", |f| f.mb_per_s, false),
    ("worker ms/GiB", |f| f.ms_per_gib, true),
];

fn main() {
    let s = settings();
    let per_round = s.bytes.div_ceil(s.rounds as u64);
    let (up_a, up_b) = (TcpEcho::bench(), TcpEcho::bench());
    let (stock, dynamic, api) = (free_port(), free_port(), free_port());
    let nginx = Proc::start(&format!(
        r#"worker_processes 1;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    dynamic_balancer_zone 8m;
    server {{ listen 127.0.0.1:{api}; location /configuration {{ dynamic_balancer_api; }} }}
}}
stream {{
    upstream stock {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; }}
    upstream tcp_balancer {{ dynamic_balancer; }}
    server {{ listen 127.0.0.1:{stock} backlog=4096; proxy_pass stock; }}
    server {{ listen 127.0.0.1:{dynamic} backlog=4096; dynamic_balancer_backend bench; proxy_pass tcp_balancer; }}
}}
"#,
        a = up_a.port,
        b = up_b.port,
    ));
    let body = serde_json::json!([{"name": "bench", "endpoints": [up_a.endpoint(), up_b.endpoint()]}]).to_string();
    let posted = ureq::post(&format!("http://127.0.0.1:{api}/configuration/backends")).send(&body);
    assert_eq!(posted.map(|r| r.status().as_u16()).ok(), Some(201), "POST failed");
    let worker = nginx.worker_pids()[0];

    println!(
        "bench-stream: {} rounds; {} connections per round and side ({} client threads); \
         {} MiB per round and side ({} MiB in all); one nginx worker",
        s.rounds,
        s.connections,
        s.clients,
        per_round >> 20,
        (per_round * s.rounds as u64) >> 20
    );
    // Warm up both paths: connections, the worker's backend cache.
    for port in [stock, dynamic] {
        short_connections(port, 200.min(s.connections), s.clients, worker);
        transfer(port, per_round.min(16 << 20), worker);
    }

    println!("round  side     conn/s  us/conn     MB/s  ms/GiB   (us and ms: the nginx worker's CPU time)");
    let mut results: Vec<[Figures; 2]> = Vec::new();
    for round in 1..=s.rounds {
        // Alternate which side goes first, so drift in machine load spreads evenly.
        let order = if round % 2 == 1 { [0, 1] } else { [1, 0] };
        let mut pair = [Figures::default(); 2];
        for side in order {
            let port = [stock, dynamic][side];
            let (conns_per_s, us_per_conn) = short_connections(port, s.connections, s.clients, worker);
            let (transfer_s, cpu_s) = transfer(port, per_round, worker);
            let f = Figures {
                conns_per_s,
                us_per_conn,
                mb_per_s: per_round as f64 / transfer_s / 1e6,
                ms_per_gib: cpu_s * 1e3 * (1u64 << 30) as f64 / per_round as f64,
                transfer_s,
            };
            println!(
                "{round:>5}  {:<4} {conns_per_s:>10.0}  {us_per_conn:>7.1}  {:>7.0}  {:>6.0}",
                ["A", "B"][side],
                f.mb_per_s,
                f.ms_per_gib
            );
            pair[side] = f;
        }
        results.push(pair);
    }

    let med = |f: fn(&Figures) -> f64, side: usize| median(results.iter().map(|r| f(&r[side])).collect());
    println!();
    println!("medians                    A (stock)   B (dynamic_balancer)   B/A of medians   median of per-round B/A");
    for (label, f, lower_better) in COLUMNS {
        let (ma, mb) = (med(f, 0), med(f, 1));
        let per_round_ratio = median(results.iter().map(|r| f(&r[1]) / f(&r[0])).collect());
        println!(
            "{label:<22} {ma:>13.1}   {mb:>20.1}   {:>14.3}   {per_round_ratio:>23.3}{}",
            mb / ma,
            if lower_better { "  (lower is better)" } else { "" }
        );
    }
    // Throughput over each side's whole transfer (all rounds together).
    let total_mb = (per_round * s.rounds as u64) as f64 / 1e6;
    let overall = |side: usize| total_mb / results.iter().map(|r| r[side].transfer_s).sum::<f64>();
    println!(
        "MB/s over all {} MiB of each side: A {:.0}, B {:.0}, B/A {:.3}",
        (per_round * s.rounds as u64) >> 20,
        overall(0),
        overall(1),
        overall(1) / overall(0)
    );
    let (conn_ratio, mb_ratio) = (
        med(COLUMNS[0].1, 1) / med(COLUMNS[0].1, 0),
        med(COLUMNS[2].1, 1) / med(COLUMNS[2].1, 0),
    );
    println!(
        "goal B/A >= 0.97 (medians): connections/s {conn_ratio:.3} ({}), MB/s {mb_ratio:.3} ({})",
        verdict(conn_ratio),
        verdict(mb_ratio)
    );
    if per_round < 512 << 20 {
        println!(
            "(transfers of {} MiB take a fraction of a second and swing by 10% or more on a shared machine; \
             BENCH_STREAM_BYTES={} gives a steadier MB/s)",
            per_round >> 20,
            10u64 << 30
        );
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

fn verdict(ratio: f64) -> &'static str {
    if ratio >= 0.97 {
        "met"
    } else {
        "not met"
    }
}

/// `count` short connections to `port` from `clients` threads
/// (at most [`ROUND_LIMIT`]): connections per second and the worker's CPU
/// microseconds per connection. Panics if one fails.
fn short_connections(port: u16, count: usize, clients: usize, worker: u32) -> (f64, f64) {
    let next = AtomicUsize::new(0);
    let cpu_before = cpu_ns(worker);
    let started = Instant::now();
    let done: usize = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..clients)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = 0;
                    while next.fetch_add(1, Ordering::Relaxed) < count && started.elapsed() < ROUND_LIMIT {
                        one_connection(port).unwrap_or_else(|e| panic!("a connection to {port} failed: {e}"));
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    let elapsed = started.elapsed().as_secs_f64();
    // The worker finishes a session after the client's close; let the last ones end.
    std::thread::sleep(Duration::from_millis(50));
    let cpu_us = (cpu_ns(worker) - cpu_before) as f64 / 1e3;
    (done as f64 / elapsed, cpu_us / done.max(1) as f64)
}

fn one_connection(port: u16) -> std::io::Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"x")?;
    let mut echo = [0u8; 2];
    s.read_exact(&mut echo[..1])?;
    if echo[0] != b'x' {
        return Err(std::io::Error::other("wrong echo"));
    }
    // The session ends from the upstream's side; nginx closes ours.
    match s.read(&mut echo)? {
        0 => Ok(()),
        n => Err(std::io::Error::other(format!("{n} bytes after the echo"))),
    }
}

/// `bytes` through `port` to a sink on one connection: the wall time and
/// the worker's CPU time, in seconds.
fn transfer(port: u16, bytes: u64, worker: u32) -> (f64, f64) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let cpu_before = cpu_ns(worker);
    let started = Instant::now();
    sink_transfer(&mut s, bytes).unwrap_or_else(|e| panic!("transfer through {port}: {e}"));
    let elapsed = started.elapsed().as_secs_f64();
    (elapsed, (cpu_ns(worker) - cpu_before) as f64 / 1e9)
}

/// CPU time of `pid`'s main thread (an nginx worker's event loop), in
/// nanoseconds: `/proc/PID/schedstat`, finer than the clock ticks of
/// `/proc/PID/stat`.
/// The worker's CPU time in nanoseconds (a worker is single-threaded: its
/// main thread's).
fn cpu_ns(pid: u32) -> u64 {
    tests::bench::thread_cpu_ns(pid, pid)
}
