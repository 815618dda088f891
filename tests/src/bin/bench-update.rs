//! The update path: POST 1,000 backends x 10 endpoints (about 1.1 MB, in
//! ingress-nginx's full shape) while wrk runs against the same single worker.
//!
//! Reports, per round: the POST's own latency; the time from the POST's
//! return until a backend that exists only in the new set is routable (and
//! whether the very next request already routed); and the longest stall of
//! the worker's event loop, as wrk's max latency against a baseline run.
//!
//! `cargo run --release -p tests --bin bench-update [-- ROUNDS]`

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::bench::{ingress_backend, median, upstream_pair, wrk, Front, Proc};

const BACKENDS: usize = 1000;
const ENDPOINTS: usize = 10;

/// A full set; `variant` changes every fake endpoint so every blob changes.
fn backend_set(variant: usize, real: &[Value], last: &str) -> String {
    let mut list: Vec<Value> = (0..BACKENDS - 2)
        .map(|i| {
            let eps = (0..ENDPOINTS)
                .map(|j| json!({"address": format!("10.{}.{}.{}", i / 250, i % 250, j + 1), "port": (8000 + variant).to_string()}))
                .collect();
            ingress_backend(&format!("default-svc-{i:04}-80"), eps)
        })
        .collect();
    list.push(ingress_backend("web", real.to_vec()));
    list.push(ingress_backend(last, real.to_vec()));
    Value::Array(list).to_string()
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let (_upstreams, a, b) = upstream_pair();
    let conf = Front {
        balancer: "dynamic_balancer",
        location: "set $proxy_upstream_name $http_x_backend; ",
        api_body: "21m",
        ..Front::default()
    };
    let (port, api_port) = (conf.port, conf.api_port);
    let front = Proc::start(&conf.conf());
    let real = [
        json!({"address": "127.0.0.1", "port": a.to_string()}),
        json!({"address": "127.0.0.1", "port": b.to_string()}),
    ];
    let api = format!("http://127.0.0.1:{api_port}/configuration/backends");
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let post = |body: &str| {
        let started = Instant::now();
        let status = agent
            .post(&api)
            .header("Content-Type", "application/json")
            .send(body)
            .map(|r| r.status().as_u16());
        assert_eq!(status.ok(), Some(201), "POST failed");
        started.elapsed()
    };
    let initial = backend_set(0, &real, "last-0");
    println!(
        "payload: {BACKENDS} backends x {ENDPOINTS} endpoints, {:.2} MB",
        initial.len() as f64 / 1e6
    );
    post(&initial);

    let traffic = format!("http://127.0.0.1:{port}/");
    let baseline: Vec<f64> = (0..2)
        .map(|_| wrk(&traffic, 4, 16, &["X-Backend: web"]).max_latency_ms)
        .collect();
    println!("baseline wrk max latency: {baseline:.2?} ms");

    // Control: the same wrk run while a nice-19 thread burns 40 ms of CPU and
    // nginx does nothing new. Whatever this adds to the max latency is the
    // machine's (2 cores shared by wrk, both nginx and the parser), not an
    // event-loop stall.
    let control: Vec<f64> = (0..3)
        .map(|_| {
            let load = std::thread::spawn({
                let traffic = traffic.clone();
                move || wrk(&traffic, 4, 16, &["X-Backend: web"])
            });
            std::thread::sleep(Duration::from_millis(1500));
            let burner = std::thread::spawn(|| {
                // SAFETY: lowers this thread's own priority.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
                let end = Instant::now() + Duration::from_millis(40);
                let mut x = 0u64;
                while Instant::now() < end {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            });
            burner.join().unwrap();
            load.join().unwrap().max_latency_ms
        })
        .collect();
    println!("control (40 ms nice-19 CPU burn, no update) wrk max latency: {control:.2?} ms");

    println!("round  POST ms  routable after POST ms  next request routed  wrk max latency ms  non-2xx");
    let (mut routable_ms, mut stalls) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let last = format!("last-{round}");
        let body = backend_set(round, &real, &last);
        let load = std::thread::spawn({
            let traffic = traffic.clone();
            move || wrk(&traffic, 4, 16, &["X-Backend: web"])
        });
        std::thread::sleep(Duration::from_millis(1500));
        let post_took = post(&body);
        let returned = Instant::now();
        let probe: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut first_ok = None;
        for attempt in 0..1000 {
            let r = probe
                .get(&traffic)
                .header("X-Backend", &last)
                .call()
                .map(|r| r.status().as_u16());
            if r.ok() == Some(200) {
                first_ok = Some(attempt);
                break;
            }
        }
        let routable = returned.elapsed();
        let run = load.join().unwrap();
        routable_ms.push(routable.as_secs_f64() * 1e3);
        stalls.push(run.max_latency_ms);
        println!(
            "{round:>5}  {:>7.1}  {:>22.2}  {:>19}  {:>18.2}  {:>7}",
            post_took.as_secs_f64() * 1e3,
            routable.as_secs_f64() * 1e3,
            match first_ok {
                Some(0) => "yes".to_string(),
                Some(n) => format!("after {n} misses"),
                None => "never".to_string(),
            },
            run.max_latency_ms,
            run.non_2xx
        );
    }
    let log = front.error_log();
    let syncs: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("revalidated"))
        .map(|l| l.rsplit(": ").next().unwrap_or(""))
        .collect::<Vec<_>>();
    println!("timer sweeps (from the error log): {syncs:?}");
    println!(
        "median time to routable after POST: {:.2} ms; median wrk max latency: updates {:.2} ms, control {:.2} ms, baseline {:.2} ms",
        median(routable_ms),
        median(stalls),
        median(control),
        median(baseline),
    );
}
