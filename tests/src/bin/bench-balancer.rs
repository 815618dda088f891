//! Round-robin throughput: stock nginx `upstream { server A; server B; keepalive 32; }`
//! against `dynamic_balancer` over the same two upstreams, in the same front
//! nginx (one worker), alternating wrk runs. The dynamic side is measured two
//! ways: the backend named by `dynamic_balancer_backend` (the balancer alone),
//! and by `set $proxy_upstream_name` as ingress-nginx's template does (which
//! adds nginx's rewrite-script cost to every request).
//!
//! `cargo run --release -p tests --bin bench-balancer [-- ROUNDS SECONDS]`

use tests::bench::{cpu_seconds, median, upstream_pair, wrk, Proc};
use tests::free_port;

fn main() {
    let args: Vec<u32> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (rounds, seconds) = (args.first().copied().unwrap_or(5), args.get(1).copied().unwrap_or(5));
    let (_upstreams, a, b) = upstream_pair();
    let (stock_port, dyn_port, set_port, api_port) = (free_port(), free_port(), free_port(), free_port());
    let location = "proxy_http_version 1.1; proxy_set_header Connection \"\";";
    let front = Proc::start(&format!(
        r#"worker_processes 1;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    upstream stock {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; keepalive 32; }}
    upstream dynamic {{ server 0.0.0.1; dynamic_balancer; keepalive 32; }}
    server {{ listen 127.0.0.1:{stock_port}; location / {{ {location} proxy_pass http://stock; }} }}
    server {{ listen 127.0.0.1:{dyn_port}; location / {{ dynamic_balancer_backend web; {location} proxy_pass http://dynamic; }} }}
    server {{ listen 127.0.0.1:{set_port}; location / {{ set $proxy_upstream_name "web"; {location} proxy_pass http://dynamic; }} }}
    server {{ listen 127.0.0.1:{api_port}; location /configuration {{ dynamic_balancer_api; }} }}
}}
"#
    ));
    let body = format!(
        r#"[{{"name":"web","endpoints":[{{"address":"127.0.0.1","port":"{a}"}},{{"address":"127.0.0.1","port":"{b}"}}]}}]"#
    );
    let posted = ureq::post(&format!("http://127.0.0.1:{api_port}/configuration/backends")).send(&body);
    assert_eq!(posted.map(|r| r.status().as_u16()).ok(), Some(201), "POST failed");
    let worker = front.worker_pids()[0];

    let measure = |port: u16| {
        let before = cpu_seconds(worker);
        let run = wrk(&format!("http://127.0.0.1:{port}/"), seconds, 32, &[]);
        let us_per_req = (cpu_seconds(worker) - before) * 1e6 / run.requests.max(1) as f64;
        assert_eq!(run.non_2xx, 0, "errors during the run");
        (run.rps, us_per_req)
    };
    // Warm up every path (connections, caches).
    for port in [stock_port, dyn_port, set_port] {
        measure(port);
    }

    println!("round  stock req/s  dynamic req/s  ratio  stock us/req  dynamic us/req  cpu ratio  | with set: req/s  ratio  us/req  cpu ratio");
    let (mut ratios, mut cpu_ratios, mut set_ratios, mut set_cpu_ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        // Rotate the order, so drift in machine load spreads evenly.
        let mut order = [stock_port, dyn_port, set_port];
        order.rotate_left(round as usize % 3);
        let mut results = std::collections::HashMap::new();
        for port in order {
            results.insert(port, measure(port));
        }
        let (s, d, t) = (results[&stock_port], results[&dyn_port], results[&set_port]);
        let (ratio, cpu_ratio) = (d.0 / s.0, s.1 / d.1);
        let (set_ratio, set_cpu_ratio) = (t.0 / s.0, s.1 / t.1);
        ratios.push(ratio);
        cpu_ratios.push(cpu_ratio);
        set_ratios.push(set_ratio);
        set_cpu_ratios.push(set_cpu_ratio);
        println!(
            "{round:>5}  {:>11.0}  {:>13.0}  {ratio:>5.3}  {:>12.1}  {:>14.1}  {cpu_ratio:>9.3}  | {:>15.0}  {set_ratio:>5.3}  {:>6.1}  {set_cpu_ratio:>9.3}",
            s.0, d.0, s.1, d.1, t.0, t.1
        );
    }
    println!(
        "dynamic_balancer_backend: median req/s ratio {:.3}, median CPU-per-request ratio (stock/dynamic) {:.3}",
        median(ratios),
        median(cpu_ratios)
    );
    println!(
        "set $proxy_upstream_name: median req/s ratio {:.3}, median CPU-per-request ratio (stock/dynamic) {:.3}",
        median(set_ratios),
        median(set_cpu_ratios)
    );
}
