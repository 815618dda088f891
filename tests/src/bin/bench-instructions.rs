//! Instructions per request, counted by `valgrind --tool=callgrind` on the
//! front nginx (single process). Unlike req/s on a shared 2-core machine,
//! the count is repeatable, so small differences between algorithms show.
//!
//! For each backend it runs nginx twice, with N and 11·N keep-alive requests,
//! and reports (Ir(11·N) − Ir(N)) / 10·N: start-up and shutdown cancel out.
//! Backends: stock `upstream { server A; server B; keepalive 32; }`, then
//! every algorithm with 2 and with 10,000 endpoints.
//!
//! `cargo run --release -p tests --bin bench-instructions [-- N [ALGORITHM]]` (needs valgrind)

use serde_json::Value;
use tests::bench::{
    algorithm_variants, alternating_backend, callgrind_total, single_process_conf, upstream_pair, Front,
};
use tests::free_port;

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let (_upstreams, a, b) = upstream_pair();
    let (port, stock_port, api) = (free_port(), free_port(), free_port());
    let stock = format!(
        r#" keepalive_requests 1000000;
    upstream stock {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; keepalive 32; }}
    server {{ listen 127.0.0.1:{stock_port}; location / {{ proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://stock; }} }}"#
    );
    let conf = single_process_conf(
        &Front {
            port,
            api_port: api,
            extra: &stock,
            ..Front::default()
        }
        .http_block(),
    );
    let algorithms = algorithm_variants();
    let mut list = Vec::new();
    for (name, extra) in &algorithms {
        list.push(alternating_backend(&format!("{name}-2"), 2, a, b, extra));
        list.push(alternating_backend(&format!("{name}-10k"), 10_000, a, b, extra));
    }
    let body = Value::Array(list).to_string();
    let per_request = |name: &str, target: u16| {
        let headers = format!("Host: x\r\nX-Backend: {name}\r\n");
        let warm = name != "stock";
        let small = callgrind_total(&conf, &body, target, api, &headers, warm, n);
        let large = callgrind_total(&conf, &body, target, api, &headers, warm, 11 * n);
        (large - small) as f64 / (10 * n) as f64
    };
    let stock = per_request("stock", stock_port);
    println!(
        "instructions per request (callgrind, front worker), {n} and {} requests",
        11 * n
    );
    println!("stock round-robin            {stock:>8.0}");
    let only = std::env::args().nth(2);
    for (name, _) in algorithms
        .iter()
        .filter(|(n, _)| only.as_deref().is_none_or(|o| o == *n))
    {
        let (two, big) = (
            per_request(&format!("{name}-2"), port),
            per_request(&format!("{name}-10k"), port),
        );
        println!(
            "{name:<12} 2 endpoints {two:>8.0} ({:.3} of stock)   10,000 endpoints {big:>8.0} (2/10k {:.3})",
            stock / two,
            two / big
        );
    }
}
