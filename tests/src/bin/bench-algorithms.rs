//! Balancing algorithms side by side in one front nginx (one worker):
//! req/s of each algorithm against round_robin, and of each algorithm with
//! 10,000 endpoints in one backend against the same algorithm with 2.
//!
//! Only two upstream servers exist (tests listen on 127.0.0.1 only), so the
//! 10,000 endpoints alternate between their two addresses; every pick still
//! runs over the 10,000-entry backend.
//!
//! `cargo run --release -p tests --bin bench-algorithms [-- ROUNDS SECONDS]`

use std::collections::BTreeMap;

use serde_json::Value;
use tests::bench::{algorithm_variants, alternating_backend, cpu_seconds, median, upstream_pair, wrk, Front, Proc};

fn main() {
    let args: Vec<u32> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (rounds, seconds) = (args.first().copied().unwrap_or(3), args.get(1).copied().unwrap_or(4));
    let (_upstreams, a, b) = upstream_pair();
    let conf = Front {
        extra: "\n    dynamic_balancer_zone 256m;",
        ..Front::default()
    };
    let (port, api_port) = (conf.port, conf.api_port);
    let front = Proc::start(&conf.conf());
    let algorithms = algorithm_variants();
    let mut list = Vec::new();
    for (name, extra) in &algorithms {
        list.push(alternating_backend(&format!("{name}-2"), 2, a, b, extra));
        list.push(alternating_backend(&format!("{name}-10k"), 10_000, a, b, extra));
    }
    let posted = ureq::post(&format!("http://127.0.0.1:{api_port}/configuration/backends"))
        .send(&Value::Array(list).to_string());
    assert_eq!(posted.map(|r| r.status().as_u16()).ok(), Some(201), "POST failed");

    let url = format!("http://127.0.0.1:{port}/");
    let names: Vec<String> = algorithms
        .iter()
        .flat_map(|(n, _)| [format!("{n}-2"), format!("{n}-10k")])
        .collect();
    for name in &names {
        // Warm up: the first request per worker builds the backend (the 10k
        // chash ring has 1.6 M points).
        wrk(&url, 1, 8, &[&format!("X-Backend: {name}")]);
    }
    let worker = front.worker_pids()[0];
    let mut rps: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut cpu: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        let mut order = names.clone();
        order.rotate_left(round as usize % names.len());
        for name in &order {
            let before = cpu_seconds(worker);
            let run = wrk(&url, seconds, 32, &[&format!("X-Backend: {name}")]);
            assert_eq!(run.non_2xx, 0, "{name}: errors");
            rps.entry(name.clone()).or_default().push(run.rps);
            let us = (cpu_seconds(worker) - before) * 1e6 / run.requests.max(1) as f64;
            cpu.entry(name.clone()).or_default().push(us);
        }
    }
    let med = |n: &str| median(rps[n].clone());
    let cpu_med = |n: &str| median(cpu[n].clone());
    println!("backend          median req/s  median CPU us/req   runs (req/s)");
    for name in &names {
        let runs: Vec<u64> = rps[name].iter().map(|v| *v as u64).collect();
        println!("{name:<16} {:>12.0}  {:>17.2}   {runs:?}", med(name), cpu_med(name));
    }
    println!("\n              to round_robin (2 endpoints)     10,000 / 2 endpoints");
    println!("algorithm       req/s ratio   CPU ratio        req/s ratio   CPU ratio");
    for (name, _) in &algorithms {
        let (two, big) = (format!("{name}-2"), format!("{name}-10k"));
        println!(
            "{name:<13} {:>13.3} {:>11.3} {:>18.3} {:>11.3}",
            med(&two) / med("round_robin-2"),
            cpu_med("round_robin-2") / cpu_med(&two),
            med(&big) / med(&two),
            cpu_med(&two) / cpu_med(&big),
        );
    }
}
