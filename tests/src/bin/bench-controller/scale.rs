//! `scale N [CHURN_SECONDS]`: what a cluster of N Ingresses costs, in
//! manifest mode. Each Ingress has its own Service and EndpointSlice; the
//! first 100 Services ("hot") live in files of their own, as one file per
//! application would, so that changing one rewrites a small file.
//!
//! Reported, in this order: the first configuration applied (and the
//! controller's RSS then), nginx.conf's size per Ingress and what
//! `nginx -t` takes to parse it, an EndpointSlice change to the first
//! request routed by it (p50/p99), a new host to its first 200, sustained
//! endpoint churn (100 changes a second: every change checked by requests,
//! its lag, the controller's CPU), renders and reloads along the way, and
//! the RSS of every process at the end.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use tests::bench::{cpu_seconds, percentile, upstream_pair};
use tests::controller::{ingress, request, service, Controller, INGRESS_CLASS};

use crate::{first_configuration, rss_kb};

/// Services whose endpoints the benchmark changes.
const HOT: usize = 100;
/// Endpoint changes a second in the churn phase.
const CHURN_RATE: u32 = 100;

/// N Ingresses, each with its Service (endpoint port `port`), in one
/// manifest text; Services listed in `skip` are left out (they have files
/// of their own).
pub fn many_ingresses(n: usize, port: u16, skip: usize) -> String {
    let mut text = String::from(INGRESS_CLASS);
    for i in 0..n {
        if i >= skip {
            text.push_str(&format!("---\n{}", service(&format!("svc{i}"), &[port])));
        }
        let (name, host, svc) = (format!("ing{i}"), format!("h{i}.example.com"), format!("svc{i}"));
        text.push_str(&format!("---\n{}", ingress(&name, &host, "/", &svc, &[])));
    }
    text
}

fn hot_file(i: usize) -> String {
    format!("hot-{i:03}.yaml")
}

/// Polls `host` every `every` until its answer is `body`; the time it
/// took, or `None` after `limit`.
fn routed(port: u16, host: &str, body: &str, since: Instant, limit: Duration, every: Duration) -> Option<Duration> {
    loop {
        if request(port, host, "/").is_some_and(|r| r.1 == body) {
            return Some(since.elapsed());
        }
        if since.elapsed() > limit {
            return None;
        }
        std::thread::sleep(every);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn scale(n: usize, churn_seconds: u32) {
    let (_upstreams, a, b) = upstream_pair();
    let hot = n.min(HOT);
    let mut files = vec![("all.yaml", many_ingresses(n, a, hot))];
    let hot_names: Vec<String> = (0..hot).map(hot_file).collect();
    for (i, name) in hot_names.iter().enumerate() {
        files.push((name.as_str(), service(&format!("svc{i}"), &[a])));
    }
    let input_bytes: usize = files.iter().map(|f| f.1.len()).sum();
    let started = Instant::now();
    let c = Controller::spawn(&files, &["--reload-timeout-s", "600"]);
    let (first, rss) = first_configuration(&c, started);
    let conf = c.conf();
    println!(
        "{n} Ingresses ({} kB of manifests): first configuration applied in {:.2} s; {rss}",
        input_bytes / 1024,
        first.as_secs_f64()
    );
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        // How the first configuration's time divides (with RUST_LOG=debug,
        // every step the controller logs).
        for line in c
            .log()
            .lines()
            .take_while(|l| !l.contains("first configuration applied"))
        {
            println!("    {}", line.trim());
        }
    }
    let parse = nginx_parse_time(&c);
    println!(
        "  nginx.conf {} kB, {} bytes per Ingress; nginx -t {:.2} s ({:.0} ms per MB)",
        conf.len() / 1024,
        conf.len() / n.max(1),
        parse.as_secs_f64(),
        ms(parse) / (conf.len() as f64 / 1e6)
    );
    let renders_before = c.metric("nginx_ingress_controller_renders_total");
    let reloads_before = c.reloads();

    // Endpoint changes, one at a time.
    let mut on_b = vec![false; hot];
    let mut samples = Vec::new();
    // BENCH_CHANGES shortens the run where each change takes long.
    let changes = std::env::var("BENCH_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2 * hot);
    for j in 0..changes {
        let i = j % hot;
        on_b[i] = !on_b[i];
        let (port, body) = if on_b[i] { (b, "b\n") } else { (a, "a\n") };
        let t = Instant::now();
        c.write(&hot_names[i], &service(&format!("svc{i}"), &[port]));
        let took = routed(
            c.http_port,
            &format!("h{i}.example.com"),
            body,
            t,
            Duration::from_secs(30),
            Duration::from_millis(1),
        )
        .unwrap_or_else(|| panic!("change {j} of svc{i} not routed in 30 s:\n{}", c.log()));
        samples.push(ms(took));
    }
    println!(
        "  EndpointSlice change -> routed: {} changes, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        samples.len(),
        percentile(samples.clone(), 0.5),
        percentile(samples.clone(), 0.99),
        percentile(samples, 1.0),
    );

    // Sustained churn: CHURN_RATE changes a second, each checked by
    // requests on its own thread pool.
    if churn_seconds > 0 {
        churn(&c, &hot_names, &mut on_b, (a, b), churn_seconds);
    }
    let built = |kind: &str, what: &str| {
        c.metric(&format!(
            "nginx_ingress_controller_model_build_duration_seconds_{what}{{kind=\"{kind}\"}}"
        ))
    };
    println!(
        "  model builds: {} for endpoints, {:.2} ms each on average; {} full, {:.0} ms each",
        built("endpoints", "count"),
        built("endpoints", "sum") * 1e3 / built("endpoints", "count"),
        built("full", "count"),
        built("full", "sum") * 1e3 / built("full", "count"),
    );
    let renders = c.metric("nginx_ingress_controller_renders_total") - renders_before;
    let reloads = c.reloads() - reloads_before;
    println!("  during the endpoint changes: {renders} renders, {reloads} reloads (both should be 0)");

    // New hosts, one at a time.
    let mut hosts = Vec::new();
    for k in 0..3 {
        let host = format!("new{k}.example.com");
        let t = Instant::now();
        c.write(
            &format!("new-{k}.yaml"),
            &ingress(&format!("new{k}"), &host, "/", "svc0", &[]),
        );
        let ok = wait_for(
            || request(c.http_port, &host, "/").is_some_and(|r| r.0 == 200),
            Duration::from_secs(120),
        );
        assert!(ok, "host {host} not served in 120 s:\n{}", c.log());
        hosts.push(ms(t.elapsed()));
    }
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        for line in c
            .log()
            .lines()
            .filter(|l| l.contains("configuration applied") || l.contains("model built") || l.contains("rendered"))
        {
            println!("    {}", line.trim());
        }
    }
    println!(
        "  new host -> first 200: {} ms",
        hosts.iter().map(|h| format!("{h:.0}")).collect::<Vec<_>>().join(", ")
    );

    // The last reload's workers have registered and the old ones are gone.
    let settled = wait_for(|| c.reloads() >= reloads_before + 3.0, Duration::from_secs(60))
        && wait_for(|| c.worker_pids().len() == workers_expected(), Duration::from_secs(60));
    assert!(settled, "the new hosts' reloads did not settle:\n{}", c.log());
    let workers: Vec<u64> = c.worker_pids().iter().map(|p| rss_kb(*p as u32, "VmRSS:")).collect();
    let shm: Vec<u64> = c.worker_pids().iter().map(|p| rss_kb(*p as u32, "RssShmem:")).collect();
    let master = c.nginx_master_pid().map_or(0, |p| rss_kb(p as u32, "VmRSS:"));
    println!(
        "  at the end: controller RSS {} kB (peak {} kB); nginx master {master} kB, workers {workers:?} kB (of which shared memory {shm:?} kB)",
        rss_kb(c.pid(), "VmRSS:"),
        rss_kb(c.pid(), "VmHWM:"),
    );
}

/// The template's `worker_processes auto`: one worker a core.
fn workers_expected() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn wait_for(mut f: impl FnMut() -> bool, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    f()
}

/// `nginx -t` on the running configuration, as the controller runs it.
fn nginx_parse_time(c: &Controller) -> Duration {
    let (nginx, _) = tests::artifacts();
    let prefix = c.conf_path().parent().unwrap().to_path_buf();
    // BENCH_SAVE_CONF=DIR keeps a copy of the configuration directory, to
    // profile nginx on it by hand.
    if let Some(dir) = std::env::var_os("BENCH_SAVE_CONF") {
        let status = std::process::Command::new("cp")
            .arg("-r")
            .arg(&prefix)
            .arg(&dir)
            .status();
        assert!(status.is_ok_and(|s| s.success()), "copying {} failed", prefix.display());
    }
    // BENCH_PERF=FILE records a CPU profile of this `nginx -t` with perf.
    let mut cmd = match std::env::var("BENCH_PERF") {
        Ok(file) => {
            let mut c = std::process::Command::new("perf");
            c.args(["record", "-F", "2000", "-e", "cpu-clock:u", "-g", "-o", &file])
                .arg(nginx);
            c
        }
        Err(_) => std::process::Command::new(nginx),
    };
    let t = Instant::now();
    let out = cmd
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(c.conf_path())
        .args(["-t", "-q"])
        .output()
        .unwrap();
    let took = t.elapsed();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    took
}

fn churn(c: &Controller, names: &[String], on_b: &mut [bool], (a, b): (u16, u16), seconds: u32) {
    let total = (CHURN_RATE * seconds) as usize;
    let (tx, rx) = mpsc::channel::<(usize, &'static str, Instant)>();
    let rx = std::sync::Mutex::new(rx);
    let cpu_before = cpu_seconds(c.pid());
    let t0 = Instant::now();
    let (lags, missed) = std::thread::scope(|s| {
        let checkers: Vec<_> = (0..4)
            .map(|_| {
                let rx = &rx;
                s.spawn(move || {
                    let (mut lags, mut missed) = (Vec::new(), 0usize);
                    loop {
                        let Ok((i, body, at)) = rx.lock().unwrap().recv() else {
                            return (lags, missed);
                        };
                        // A Service changes again a second later; its change
                        // must be routed before that. Four pollers at 2 ms
                        // leave the two cores to nginx and the controller.
                        let host = format!("h{i}.example.com");
                        let every = Duration::from_millis(2);
                        match routed(c.http_port, &host, body, at, Duration::from_millis(900), every) {
                            Some(d) => lags.push(ms(d)),
                            None => missed += 1,
                        }
                    }
                })
            })
            .collect();
        let period = Duration::from_secs(1) / CHURN_RATE;
        for seq in 0..total {
            let due = t0 + period * seq as u32;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let i = seq % names.len();
            on_b[i] = !on_b[i];
            let (port, body) = if on_b[i] { (b, "b\n") } else { (a, "a\n") };
            c.write(&names[i], &service(&format!("svc{i}"), &[port]));
            tx.send((i, body, Instant::now())).unwrap();
        }
        drop(tx);
        checkers.into_iter().fold((Vec::new(), 0), |(mut l, m), h| {
            let (lags, missed) = h.join().unwrap();
            l.extend(lags);
            (l, m + missed)
        })
    });
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(c.pid()) - cpu_before;
    println!(
        "  churn: {total} changes in {elapsed:.1} s ({:.0}/s): {} routed, {missed} not within 0.9 s; lag p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; controller CPU {:.0}% of one core",
        total as f64 / elapsed,
        lags.len(),
        percentile(lags.clone(), 0.5),
        percentile(lags.clone(), 0.99),
        percentile(lags, 1.0),
        cpu / elapsed * 100.0
    );
}
