//! The shared endpoint table at the size: one tenant with 300
//! Services of 400 endpoints (120,000 endpoints) in the default 32m zone,
//! then another tenant's backend; and 100,000 endpoints in 20,000 backends
//! of the controller's shape. Reports what the table tracks, its memory per
//! endpoint, and how long writes take at that size; checks that the late
//! tenant's endpoints have working passive health and least_conn.
//!
//! `cargo run --release -p tests --bin bench-endpoints [-- BACKENDS ENDPOINTS_EACH]`

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::{backend, dead_endpoint, Nginx, Upstream};

/// A distinct address for each `k` below 15,000,000.
fn unique(k: usize) -> Value {
    let q = k / 250;
    json!({"address": format!("10.{}.{}.{}", q / 250, q % 250, k % 250 + 1), "port": "8080"})
}

fn table(ng: &Nginx) -> Value {
    ng.status()["endpoint_table"].clone()
}

fn line(what: &str, ng: &Nginx) {
    let s = ng.status();
    let t = &s["endpoint_table"];
    println!(
        "  {what}: {} endpoints, tracked {}, untracked {}, slots {}, evicted {}, table {:.1} MB, zone {:.1} of {:.1} MB",
        s["endpoints"],
        t["tracked"],
        t["untracked"],
        t["capacity"],
        t["evicted"],
        t["bytes"].as_f64().unwrap() / 1e6,
        s["zone"]["used"].as_f64().unwrap() / 1e6,
        s["zone"]["size"].as_f64().unwrap() / 1e6,
    );
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let started = Instant::now();
    let out = f();
    (out, started.elapsed())
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (services, each) = (
        args.first().copied().unwrap_or(300),
        args.get(1).copied().unwrap_or(400),
    );
    let ng = Nginx::builder().workers(2).start();
    let (stalled, fast) = (Upstream::start_slow(Duration::from_secs(3)), Upstream::start());

    println!("one tenant: {services} Services x {each} endpoints, default zone");
    let big: Vec<Value> = (0..services)
        .map(|b| {
            backend(
                &format!("big-{b}"),
                &(0..each).map(|i| unique(b * each + i)).collect::<Vec<_>>(),
            )
        })
        .collect();
    let (r, took) = timed(|| ng.post_backends(&Value::Array(big)));
    assert_eq!(r.status, 201, "{}", r.body);
    println!("  POST of every backend: {:.0} ms", took.as_secs_f64() * 1e3);
    line("after the big tenant", &ng);

    let mut other = backend("other", &[stalled.endpoint(), fast.endpoint(), dead_endpoint()]);
    other["load-balance"] = json!("least_conn");
    other["maxFails"] = json!(1);
    other["failTimeout"] = json!(30);
    let (r, took) = timed(|| ng.api("PUT", "/configuration/backends/other", Some(&other.to_string())));
    assert_eq!(r.status, 201, "{}", r.body);
    println!(
        "  PUT of the other tenant's backend: {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    line("after the other tenant", &ng);
    let t = table(&ng);
    let per = t["bytes"].as_f64().unwrap() / t["tracked"].as_f64().unwrap();
    println!("  memory per tracked endpoint: {per:.1} bytes (72-byte slot + index + chunk directory)");

    // The other tenant's state works: least_conn sees a parked request,
    // passive health takes the dead endpoint out.
    let parked = tests::park_requests(ng.port, "other", 4);
    std::thread::sleep(Duration::from_millis(500));
    let to_fast = (0..20).filter(|_| ng.get("other").body == fast.identity).count();
    // 120,000 endpoints make a health body beyond the harness's 10 MB limit.
    let health: Value = {
        let mut r = ureq::get(&format!("http://127.0.0.1:{}/configuration/health", ng.api_port))
            .call()
            .unwrap();
        let text = r.body_mut().with_config().limit(256 << 20).read_to_string().unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let mine: Vec<&Value> = health["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["backend"] == "other")
        .collect();
    let down = mine.iter().filter(|e| e["down"] == true).count();
    let conns: u64 = mine.iter().map(|e| e["connections"].as_u64().unwrap()).sum();
    let tracked = mine.iter().filter(|e| e["tracked"] == true).count();
    println!(
        "  other tenant: {tracked}/3 tracked, {to_fast}/20 requests to the fast endpoint (least_conn), {conns} parked connections seen, {down} endpoint down (passive health)"
    );
    assert_eq!((tracked, down), (3, 1));
    assert_eq!(to_fast, 20);
    for p in parked {
        p.join().unwrap();
    }

    // A write at this size: one backend's endpoints change.
    let mut samples = Vec::new();
    for round in 0..10 {
        let b = backend(
            "big-0",
            &(0..each)
                .map(|i| unique(services * each + round * each + i))
                .collect::<Vec<_>>(),
        );
        let (r, took) = timed(|| ng.api("PUT", "/configuration/backends/big-0", Some(&b.to_string())));
        assert_eq!(r.status, 200, "{}", r.body);
        samples.push(took.as_secs_f64() * 1e3);
    }
    samples.sort_by(f64::total_cmp);
    println!(
        "  PUT changing one backend's endpoints: median {:.1} ms, max {:.1} ms",
        samples[samples.len() / 2],
        samples[samples.len() - 1]
    );
    drop(ng);

    println!("100,000 endpoints in 20,000 backends (the controller's shape), default zone");
    let ng = Nginx::builder().workers(2).start();
    let many: Vec<Value> = (0..20_000)
        .map(|b| {
            let mut v = backend(
                &format!("ns-{}-svc-{b}-80", b % 50),
                &(0..5).map(|i| unique(b * 5 + i)).collect::<Vec<_>>(),
            );
            v["load-balance"] = json!("round_robin");
            v
        })
        .collect();
    let (r, took) = timed(|| ng.post_backends(&Value::Array(many)));
    println!("  POST: {} in {:.0} ms", r.status, took.as_secs_f64() * 1e3);
    line("after the POST", &ng);
    let t = table(&ng);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        (t["tracked"].as_u64(), t["untracked"].as_u64()),
        (Some(100_000), Some(0)),
        "{t}"
    );
}
