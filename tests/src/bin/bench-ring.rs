//! The request that first meets a new version of a 10,000-endpoint `chash`
//! backend (a ring of 1.6 M points), on one worker:
//!
//! - after a `PUT` that changes a backend the worker already routes, the
//!   ring is built on the worker's ring thread and the old one answers
//!   meanwhile: that request should take about as long as any other;
//! - a backend the worker has never routed is built inline (there is no old
//!   version to serve), which shows what the build costs.
//!
//! `cargo run --release -p tests --bin bench-ring [-- CHANGES]`

use std::time::Instant;

use tests::bench::{alternating_backend, percentile, upstream_pair, Front, Proc};

fn main() {
    let changes: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let (_upstreams, a, b) = upstream_pair();
    let conf = Front {
        extra: "\n    dynamic_balancer_zone 256m;",
        ..Front::default()
    };
    let (port, api_port) = (conf.port, conf.api_port);
    let _front = Proc::start(&conf.conf());
    let hash_by = serde_json::json!({"upstreamHashByConfig": {"upstream-hash-by": "$request_uri"}});
    let agent = tests::agent();
    let request = |name: &str| {
        let started = Instant::now();
        let r = agent
            .get(&format!("http://127.0.0.1:{port}/k"))
            .header("X-Backend", name)
            .call()
            .expect("nginx answers");
        assert_eq!(r.status().as_u16(), 200);
        started.elapsed().as_secs_f64() * 1000.0
    };
    let put = |name: &str, x: u16, y: u16| {
        let body = alternating_backend(name, 10_000, x, y, &hash_by).to_string();
        let r = ureq::put(&format!("http://127.0.0.1:{api_port}/configuration/backends/{name}")).send(&body);
        assert!(matches!(r.map(|r| r.status().as_u16()), Ok(200 | 201)), "PUT {name}");
    };
    let (mut changed, mut fresh, mut steady) = (Vec::new(), Vec::new(), Vec::new());
    put("big", a, b);
    request("big");
    for i in 0..changes {
        // A change of an existing backend: its ring is built off the loop.
        if i % 2 == 0 {
            put("big", b, a);
        } else {
            put("big", a, b);
        }
        changed.push(request("big"));
        std::thread::sleep(std::time::Duration::from_millis(100));
        steady.push(request("big"));
        // A backend this worker has never routed: built inline.
        let name = format!("new-{i}");
        put(&name, a, b);
        fresh.push(request(&name));
    }
    println!(
        "10,000-endpoint chash, {changes} changes: first request after a change p50 {:.2} ms, max {:.2} ms; a settled request p50 {:.2} ms; first request of a new backend (ring built inline) p50 {:.2} ms, max {:.2} ms",
        percentile(changed.clone(), 0.5),
        percentile(changed, 1.0),
        percentile(steady, 0.5),
        percentile(fresh.clone(), 0.5),
        percentile(fresh, 1.0),
    );
}
