//! What OpenTelemetry tracing costs per request, in instructions counted
//! by `valgrind --tool=callgrind` on the front nginx (single process),
//! per thread: the event loop (the request's path) apart from the
//! exporter thread (encoding and sending the spans), which runs beside it.
//!
//! Four front configurations proxy the same keep-alive requests to one
//! backend of two endpoints: tracing absent (no `dynamic_balancer_otel*`
//! directive, as the controller renders it with `enable-opentelemetry`
//! off), and `dynamic_balancer_otel on` sampled never, at 0.01 and always,
//! exporting to a real OpenTelemetry Collector on loopback. Each runs with
//! N and 11·N requests; (Ir(11·N) − Ir(N)) / 10·N cancels start-up and
//! shutdown.
//!
//! `cargo run --release -p tests --bin bench-tracing [-- N]` (needs valgrind)

use tests::bench::{alternating_backend, callgrind_per_thread, single_process_conf, upstream_pair, Front};
use tests::free_port;
use tests::otel_collector::Collector;

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let (_upstreams, a, b) = upstream_pair();
    let collector = Collector::start();
    let body = serde_json::Value::Array(vec![alternating_backend("web", 2, a, b, &serde_json::json!({}))]).to_string();
    // The queue holds every span of a run, so a slow exporter under
    // valgrind drops none and each sampled span is exported (and counted).
    let exporter = format!(
        "\n    dynamic_balancer_otel_exporter 127.0.0.1:{} service_name=bench queue=65536 batch=512 delay=200;",
        collector.port
    );
    let variants: [(&str, Option<&str>); 4] = [
        ("off", None),
        ("sampled never", Some("always_off")),
        ("sampled 0.01", Some("ratio=0.01")),
        ("sampled 1.0", Some("always_on")),
    ];
    println!(
        "instructions per request (callgrind, front nginx), {n} and {} requests",
        11 * n
    );
    println!(
        "{:<16} {:>12} {:>16} {:>10}",
        "tracing", "event loop", "exporter thread", "vs off"
    );
    let mut off = None;
    for (name, sampler) in variants {
        let (port, api) = (free_port(), free_port());
        let mut extra = String::from(" keepalive_requests 1000000;");
        if let Some(s) = sampler {
            extra += &format!("{exporter}\n    dynamic_balancer_otel_sampler {s};");
        }
        let location = if sampler.is_some() {
            "dynamic_balancer_otel on; "
        } else {
            ""
        };
        let conf = single_process_conf(
            &Front {
                port,
                api_port: api,
                location,
                extra: &extra,
                ..Front::default()
            }
            .http_block(),
        );
        let run = |count| callgrind_per_thread(&conf, &body, port, api, "Host: x\r\nX-Backend: web\r\n", true, count);
        let (small, large) = (run(n), run(11 * n));
        let per = |i: usize| {
            let t = |v: &Vec<u64>| v.get(i).copied().unwrap_or(0) as f64;
            (t(&large) - t(&small)) / (10 * n) as f64
        };
        let event_loop = per(0);
        // Every other thread: the exporter, and the API's offload thread
        // (the one POST, the same in both runs).
        let background: f64 = (1..small.len().max(large.len())).map(per).sum();
        let base = *off.get_or_insert(event_loop);
        println!(
            "{name:<16} {event_loop:>12.0} {background:>16.0} {:>9.2}%",
            (event_loop - base) / base * 100.0
        );
    }
    let spans = collector.spans().len();
    println!("spans the collector received: {spans}");
}
