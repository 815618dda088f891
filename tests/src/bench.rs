//! Shared pieces of the benchmarks (`src/bin/bench-*.rs`): nginx processes
//! started from a config string, wrk runs, a worker's CPU time, and
//! instruction counts from callgrind.
//!
//! Benchmarks report ratios measured side by side in one run; absolute
//! numbers on a shared 2-core machine swing too much to mean anything alone.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::artifacts;

/// An nginx started from a literal nginx.conf (after the common prelude).
pub use crate::process::NginxProcess as Proc;

/// The front nginx of the module's benchmarks: upstream `dynamic` balanced
/// by the module (`balancer` is the directive), a proxied server on `port`
/// whose location starts with `location`, and the API on `api_port` taking
/// bodies up to `api_body`; `extra` goes at the top of `http{}`.
pub struct Front<'a> {
    pub port: u16,
    pub api_port: u16,
    pub balancer: &'a str,
    pub location: &'a str,
    pub api_body: &'a str,
    pub extra: &'a str,
}

impl Default for Front<'_> {
    /// Fresh ports, the backend named by `X-Backend`, 64 MB API bodies.
    fn default() -> Self {
        Front {
            port: crate::free_port(),
            api_port: crate::free_port(),
            balancer: "dynamic_balancer $http_x_backend",
            location: "",
            api_body: "64m",
            extra: "",
        }
    }
}

impl Front<'_> {
    pub fn http_block(&self) -> String {
        let Front {
            port,
            api_port,
            balancer,
            location,
            api_body,
            extra,
        } = self;
        format!(
            r#"http {{
    access_log off;{extra}
    upstream dynamic {{ server 0.0.0.1; {balancer}; keepalive 32; }}
    server {{ listen 127.0.0.1:{port}; location / {{ {location}proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://dynamic; }} }}
    server {{ listen 127.0.0.1:{api_port}; location /configuration {{ client_max_body_size {api_body}; client_body_buffer_size {api_body}; dynamic_balancer_api; }} }}
}}
"#
        )
    }

    /// The whole configuration for [`Proc::start`]: one worker.
    pub fn conf(&self) -> String {
        format!(
            "worker_processes 1;\nevents {{ worker_connections 4096; }}\n{}",
            self.http_block()
        )
    }
}

/// A benchmark nginx.conf for callgrind: the module, one process without a
/// master (so callgrind sees the worker), then `http_block`.
pub fn single_process_conf(http_block: &str) -> String {
    let (_, module) = artifacts();
    format!(
        "load_module {};\nmaster_process off; daemon off; worker_processes 1; error_log logs/error.log warn; pid logs/nginx.pid;\nevents {{ worker_connections 1024; }}\n{http_block}",
        module.display()
    )
}

/// A benchmark setting from the environment: `name`'s number, else
/// `default`; a value that is not a number stops the run.
pub fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v} is not a number")))
        .unwrap_or(default)
}

/// The CPU time thread `tid` of process `pid` has run, in nanoseconds
/// (`/proc/…/schedstat`: finer than `stat`'s clock ticks); 0 if it is gone.
pub fn thread_cpu_ns(pid: u32, tid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// What one wrk run measured.
#[derive(Debug, Clone, Copy)]
pub struct WrkRun {
    pub requests: u64,
    pub rps: f64,
    pub max_latency_ms: f64,
    pub non_2xx: u64,
    /// connect, read, write and timeout errors together.
    pub socket_errors: u64,
}

/// Runs `wrk` for `seconds` against `url` with `headers`.
pub fn wrk(url: &str, seconds: u32, connections: u32, headers: &[&str]) -> WrkRun {
    let mut cmd = Command::new("wrk");
    cmd.args(["-t1", &format!("-c{connections}"), &format!("-d{seconds}s")]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd
        .arg(url)
        .output()
        .expect("wrk is not installed: apt-get install wrk");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let number = |prefix: &str, idx: usize| -> Option<String> {
        text.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(idx).map(str::to_string))
    };
    let requests = text
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let rps = number("Requests/sec:", 1).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let max_latency_ms = number("Latency", 3).map(|v| parse_duration_ms(&v)).unwrap_or(f64::NAN);
    let non_2xx = number("Non-2xx", 4).and_then(|v| v.parse().ok()).unwrap_or(0);
    // "Socket errors: connect 0, read 3, write 0, timeout 0"
    let socket_errors = text
        .lines()
        .find(|l| l.trim_start().starts_with("Socket errors:"))
        .map(|l| {
            l.split(',')
                .filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    if socket_errors > 0 {
        if let Some(l) = text.lines().find(|l| l.trim_start().starts_with("Socket errors:")) {
            eprintln!("wrk: {}", l.trim());
        }
    }
    WrkRun {
        requests,
        rps,
        max_latency_ms,
        non_2xx,
        socket_errors,
    }
}

fn parse_duration_ms(v: &str) -> f64 {
    let split = v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len());
    let (n, unit) = v.split_at(split);
    let n: f64 = n.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => f64::NAN,
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The upstream side of every benchmark: one nginx worker answering on two ports.
pub fn upstream_pair() -> (Proc, u16, u16) {
    let (a, b) = (crate::free_port(), crate::free_port());
    let conf = format!(
        "worker_processes 1;\nevents {{ worker_connections 4096; }}\nhttp {{ access_log off; keepalive_requests 100000;\n\
         server {{ listen 127.0.0.1:{a}; location / {{ return 200 \"a\\n\"; }} }}\n\
         server {{ listen 127.0.0.1:{b}; location / {{ return 200 \"b\\n\"; }} }} }}\n"
    );
    (Proc::start(&conf), a, b)
}

/// A backend of `n` endpoints alternating between upstream ports `a` and `b`,
/// with `extra` fields merged in (the algorithm benchmarks' synthetic set).
pub fn alternating_backend(name: &str, n: usize, a: u16, b: u16, extra: &serde_json::Value) -> serde_json::Value {
    let eps: Vec<serde_json::Value> = (0..n)
        .map(|i| serde_json::json!({"address": "127.0.0.1", "port": (if i % 2 == 0 { a } else { b }).to_string()}))
        .collect();
    let mut v = serde_json::json!({"name": name, "endpoints": eps});
    for (k, x) in extra.as_object().expect("an object of fields") {
        v[k] = x.clone();
    }
    v
}

/// The algorithms the benchmarks compare, with the fields that select them.
pub fn algorithm_variants() -> [(&'static str, serde_json::Value); 4] {
    [
        ("round_robin", serde_json::json!({})),
        ("ewma", serde_json::json!({"load-balance": "ewma"})),
        ("least_conn", serde_json::json!({"load-balance": "least_conn"})),
        (
            "chash",
            serde_json::json!({"upstreamHashByConfig": {"upstream-hash-by": "$request_uri"}}),
        ),
    ]
}

/// Sends `count` `GET /k` requests with `headers` (raw `Name: value\r\n`
/// lines) on one keep-alive connection; each must answer 200.
pub fn keepalive_requests(port: u16, headers: &str, count: usize) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    for _ in 0..count {
        write!(s, "GET /k HTTP/1.1\r\n{headers}\r\n").unwrap();
        let (mut line, mut length) = (String::new(), 0usize);
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "{headers:?}: {line}");
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
    }
}

/// Total instructions (callgrind) of one single-process nginx run on `conf`:
/// `body` is POSTed to the API on `api`, then `count` requests with
/// `headers` are served on `port` (after one warm-up request if `warm`).
pub fn callgrind_total(conf: &str, body: &str, port: u16, api: u16, headers: &str, warm: bool, count: usize) -> u64 {
    callgrind_total_with_routes(conf, body, None, port, api, headers, warm, count)
}

/// As [`callgrind_total`], with a Gateway API route table PUT after the
/// backends (`routes`).
#[allow(clippy::too_many_arguments)]
pub fn callgrind_total_with_routes(
    conf: &str,
    body: &str,
    routes: Option<&str>,
    port: u16,
    api: u16,
    headers: &str,
    warm: bool,
    count: usize,
) -> u64 {
    callgrind_run(conf, body, routes, port, api, headers, warm, count, false)
        .iter()
        .sum()
}

/// As [`callgrind_total`], counted per thread (`--separate-threads=yes`):
/// the event loop's first, then the threads the process started, in the
/// order they started. A module's background work (the API's offload
/// thread, tracing's exporter) is then told apart from the request path.
pub fn callgrind_per_thread(
    conf: &str,
    body: &str,
    port: u16,
    api: u16,
    headers: &str,
    warm: bool,
    count: usize,
) -> Vec<u64> {
    callgrind_run(conf, body, None, port, api, headers, warm, count, true)
}

#[allow(clippy::too_many_arguments)]
fn callgrind_run(
    conf: &str,
    body: &str,
    routes: Option<&str>,
    port: u16,
    api: u16,
    headers: &str,
    warm: bool,
    count: usize,
    per_thread: bool,
) -> Vec<u64> {
    let (nginx, _) = artifacts();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let out = dir.path().join("callgrind.out");
    let mut vg = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .args(per_thread.then_some("--separate-threads=yes"))
        // BENCH_CALLGRIND_ARGS adds options, e.g. `--dump-instr=yes` for a
        // per-instruction profile of the kept files.
        .args(
            std::env::var("BENCH_CALLGRIND_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .arg(&nginx)
        .arg("-p")
        .arg(format!("{}/", dir.path().display()))
        .args(["-c", "nginx.conf", "-e", "logs/error.log"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("valgrind is installed");
    // Parsing megabytes of JSON under valgrind takes a while.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match ureq::post(&format!("http://127.0.0.1:{api}/configuration/backends")).send(body) {
            Ok(r) if r.status() == 201 => break,
            Ok(r) => panic!("POST answered {}", r.status()),
            Err(ureq::Error::StatusCode(code)) => panic!("POST answered {code}"),
            Err(e) => {
                assert!(Instant::now() < deadline, "nginx under valgrind did not come up: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    if let Some(routes) = routes {
        let r = ureq::put(&format!("http://127.0.0.1:{api}/configuration/routes")).send(routes);
        assert!(r.is_ok_and(|r| r.status() == 200), "PUT /configuration/routes failed");
    }
    if warm {
        keepalive_requests(port, headers, 1); // builds the backend in the worker
    }
    keepalive_requests(port, headers, count);
    // SAFETY: signalling the valgrind process we started.
    unsafe { libc::kill(vg.id() as libc::pid_t, libc::SIGQUIT) };
    vg.wait().unwrap();
    // One profile, or one per thread (`callgrind.out-01`, `-02` …).
    let mut profiles: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("callgrind.out"))
        })
        .collect();
    profiles.sort();
    // BENCH_KEEP_CALLGRIND=DIR keeps each profile for callgrind_annotate.
    if let Some(keep) = std::env::var_os("BENCH_KEEP_CALLGRIND") {
        // Numbered in the order measured: two runs of one location (metrics
        // on and off) have the same port and headers.
        static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::fs::create_dir_all(&keep).unwrap();
        for p in &profiles {
            let thread = p
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .trim_start_matches("callgrind.out");
            let name = format!("callgrind.{run:02}.{port}.{}.{count}{thread}.out", headers.len());
            std::fs::copy(p, std::path::Path::new(&keep).join(name)).unwrap();
        }
    }
    // A per-thread run leaves `callgrind.out` itself empty; each thread's
    // profile states its count as `summary:`, a whole-process one as
    // `totals:`.
    profiles
        .iter()
        .filter(|p| fs::metadata(p).is_ok_and(|m| m.len() > 0))
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("totals: ").or_else(|| l.strip_prefix("summary: ")))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("no totals in {}", p.display()))
        })
        .collect()
}

/// The `p` quantile (0..=1) of `v`, nearest rank.
/// The `p` quantile of `v` (NaN when `v` is empty).
pub fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// A backend as ingress-nginx's controller sends it, with every field its
/// Go structs fill (the service, zero-valued affinity and canary policy),
/// so that benchmarks parse the full payload, not a minimal one.
pub fn ingress_backend(name: &str, endpoints: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "service": {"metadata": {"creationTimestamp": null}, "spec": {
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
            "selector": {"app": name}, "clusterIP": "10.96.12.34", "type": "ClusterIP", "sessionAffinity": "None"},
            "status": {"loadBalancer": {}}},
        "port": 80,
        "sslPassthrough": false,
        "endpoints": endpoints,
        "sessionAffinityConfig": {"name": "", "mode": "", "cookieSessionAffinity": {"name": ""}},
        "upstreamHashByConfig": {"upstream-hash-by-subset-size": 3},
        "load-balance": "round_robin",
        "noServer": false,
        "trafficShapingPolicy": {"weight": 0, "weightTotal": 0, "header": "", "headerValue": "", "headerPattern": "", "cookie": ""}
    })
}
