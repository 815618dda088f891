//! Controller benchmarks (figures, not pass/fail):
//!
//! - `ingress-path [ROUNDS SECONDS]`: a controller-rendered location with
//!   typical settings (force-ssl-redirect evaluated per request, X-Forwarded-*
//!   headers, timeouts, a canary-capable backend, access log off) against a
//!   plain `proxy_pass` location to the same upstreams through the module.
//!   Both front nginx run one worker; wrk runs alternate. Goal: ≥ 0.9.
//! - `instructions [N]`: the same two locations, in callgrind instructions
//!   per request (single-process nginx, N and 11·N requests), which unlike
//!   req/s do not depend on what else the machine is doing; and the
//!   rendered location with request metrics on against off (goal ≤ 3%).
//!   Both with `use-forwarded-headers` (behind a load balancer) and
//!   without (ingress-nginx's default).
//! - `latency [CHANGES]`: on the fake apiserver, the time from an
//!   EndpointSlice change to nginx routing by it (p50/p99), and from a new
//!   Ingress host to it being served.
//! - `scale N [CHURN_SECONDS]`: what N Ingresses cost in manifest mode:
//!   first configuration, nginx.conf's size and parse time, endpoint change
//!   latency, sustained endpoint churn, a new host, RSS ([`scale`]).
//! - `scale-cluster N`: the same on the Kubernetes 1.36 apiserver, with the
//!   chart's RBAC (reflector stores, as the chart runs it).
//! - `webhook N [SECONDS] [CLIENTS]`: the admission webhook with N
//!   Ingresses: reviews per second that CLIENTS callers get (each review on
//!   a new TLS connection, as a flood would), their latency, and the
//!   controller's CPU per review.
//!
//! `cargo run --release -p tests --bin bench-controller -- MODE [ARGS]`

use std::time::{Duration, Instant};

use tests::apiserver::FakeApiServer;
use tests::bench::{callgrind_total, cpu_seconds, median, percentile, single_process_conf, upstream_pair, wrk, Proc};
use tests::controller::{ingress, request, service, set_endpoints, wait_until, Cluster, Controller, INGRESS_CLASS};
use tests::free_port;

mod scale;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u32| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    match args.first().map(String::as_str) {
        Some("ingress-path") => ingress_path(num(1, 5), num(2, 5)),
        Some("latency") => latency(num(1, 200) as usize),
        Some("scale") => scale::scale(num(1, 1000) as usize, num(2, 60)),
        Some("scale-cluster") => scale_cluster(num(1, 1000) as usize),
        Some("instructions") => instructions(num(1, 200) as usize),
        Some("webhook") => webhook(num(1, 1000) as usize, num(2, 20), num(3, 4) as usize),
        _ => eprintln!(
            "usage: bench-controller ingress-path [ROUNDS SECONDS] | instructions [N] | latency [CHANGES] | scale N [CHURN_SECONDS] | webhook N [SECONDS] [CLIENTS]"
        ),
    }
}

/// The controller with a typical Ingress (and a canary) over upstreams
/// `a` and `b`, on one worker with the access log off, behind a load
/// balancer (`use-forwarded-headers`, with force-ssl-redirect evaluated
/// per request on `X-Forwarded-Proto`) or not (ingress-nginx's default;
/// without a proxy in front, force-ssl-redirect would redirect every plain
/// request).
fn typical_ingress(a: u16, b: u16, forwarded: bool) -> Controller {
    let config = format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{namespace: ingress-nginx, name: ingress-nginx-controller}}\ndata: {{worker-processes: \"1\", enable-access-log: \"false\", use-forwarded-headers: \"{forwarded}\"}}\n");
    let typical = [
        ("force-ssl-redirect", if forwarded { "true" } else { "false" }),
        ("proxy-read-timeout", "30"),
        ("proxy-connect-timeout", "5"),
    ];
    let canary = [("canary", "true"), ("canary-weight", "0")];
    Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("config.yaml", config),
            (
                "svc.yaml",
                format!("{}---\n{}", service("web", &[a, b]), service("web-canary", &[a])),
            ),
            ("ing.yaml", ingress("bench", "bench.test", "/", "web", &typical)),
            (
                "canary.yaml",
                ingress("bench-canary", "bench.test", "/", "web-canary", &canary),
            ),
        ],
        &[],
    )
}

/// The plain location: `proxy_pass` through the module, nothing else.
fn plain_http_block(plain_port: u16, api_port: u16) -> String {
    format!(
        r#"http {{
    access_log off;
    keepalive_requests 1000000;
    dynamic_balancer_zone 32m;
    upstream dynamic {{ server 0.0.0.1; dynamic_balancer; keepalive 320; }}
    server {{ listen 127.0.0.1:{plain_port}; location / {{ dynamic_balancer_backend web; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://dynamic; }} }}
    server {{ listen 127.0.0.1:{api_port}; location /configuration {{ dynamic_balancer_api; }} }}
}}
"#
    )
}

fn web_backend(a: u16, b: u16) -> String {
    format!(
        r#"[{{"name":"web","endpoints":[{{"address":"127.0.0.1","port":"{a}"}},{{"address":"127.0.0.1","port":"{b}"}}]}}]"#
    )
}

fn ingress_path(rounds: u32, seconds: u32) {
    let (_upstreams, a, b) = upstream_pair();
    let c = typical_ingress(a, b, true);
    let (plain_port, api_port) = (free_port(), free_port());
    let plain = Proc::start(&format!(
        "worker_processes 1;\nevents {{ worker_connections 4096; }}\n{}",
        plain_http_block(plain_port, api_port)
    ));
    let body = web_backend(a, b);
    let posted = ureq::post(&format!("http://127.0.0.1:{api_port}/configuration/backends")).send(&body);
    assert_eq!(posted.map(|r| r.status().as_u16()).ok(), Some(201), "POST failed");

    let ingress_worker = *c.worker_pids().iter().next().expect("one worker") as u32;
    let plain_worker = plain.worker_pids()[0];
    let headers = ["Host: bench.test", "X-Forwarded-Proto: https"];
    let measure = |port: u16, worker: u32| {
        let before = cpu_seconds(worker);
        let run = wrk(&format!("http://127.0.0.1:{port}/"), seconds, 32, &headers);
        assert_eq!(run.non_2xx, 0, "errors or redirects during the run");
        (
            run.rps,
            (cpu_seconds(worker) - before) * 1e6 / run.requests.max(1) as f64,
        )
    };
    measure(c.http_port, ingress_worker);
    measure(plain_port, plain_worker);
    println!("round  plain req/s  ingress req/s  ratio  plain us/req  ingress us/req");
    let (mut ratios, mut cpu_ratios) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let (p, i) = if round % 2 == 0 {
            let p = measure(plain_port, plain_worker);
            (p, measure(c.http_port, ingress_worker))
        } else {
            let i = measure(c.http_port, ingress_worker);
            (measure(plain_port, plain_worker), i)
        };
        ratios.push(i.0 / p.0);
        cpu_ratios.push(p.1 / i.1);
        println!(
            "{round:>5}  {:>11.0}  {:>13.0}  {:>5.3}  {:>12.1}  {:>14.1}",
            p.0,
            i.0,
            i.0 / p.0,
            p.1,
            i.1
        );
    }
    println!(
        "ingress location / plain location: median req/s ratio {:.3} (goal >= 0.95), median CPU-per-request ratio (plain/ingress) {:.3}",
        median(ratios),
        median(cpu_ratios)
    );
}

fn instructions(n: usize) {
    // BENCH_FORWARDED=true|false measures one mode only (for profiling).
    let only = std::env::var("BENCH_FORWARDED")
        .ok()
        .and_then(|v| v.parse::<bool>().ok());
    for forwarded in [true, false].into_iter().filter(|f| only.is_none_or(|o| o == *f)) {
        instructions_with(n, forwarded);
    }
}

fn instructions_with(n: usize, forwarded: bool) {
    let (_upstreams, a, b) = upstream_pair();
    let mut c = typical_ingress(a, b, forwarded);
    let (_, backends) = c.api_get("/configuration/backends").unwrap();
    let rendered = c.conf();
    c.stop();
    // The controller's file, run as one process with unlimited keep-alive.
    // The API's bearer token is left out: the POST below is the harness's,
    // and the token check is not on the request path being measured.
    let token_line = rendered
        .lines()
        .find(|l| l.contains("dynamic_balancer_api_token_file"))
        .map(|l| format!("{l}\n"))
        .unwrap_or_default();
    // Unlimited keep-alive: the rendered http-level keepalive_requests
    // (keep-alive-requests) is replaced, not duplicated.
    let keepalive = rendered
        .lines()
        .find(|l| l.starts_with("    keepalive_requests "))
        .map(|l| format!("{l}\n"))
        .expect("the template renders keepalive_requests in http {}");
    let ingress_conf = rendered
        .replacen(&token_line, "", 1)
        .replacen("worker_processes 1;", "master_process off;\nworker_processes 1;", 1)
        .replacen(&keepalive, "    keepalive_requests 1000000;\n", 1);
    let (plain_port, plain_api) = (free_port(), free_port());
    let plain_conf = single_process_conf(&plain_http_block(plain_port, plain_api));
    let per_request = |conf: &str, body: &str, port: u16, api: u16, headers: &str| {
        let small = callgrind_total(conf, body, port, api, headers, true, n);
        let large = callgrind_total(conf, body, port, api, headers, true, 11 * n);
        (large - small) as f64 / (10 * n) as f64
    };
    println!(
        "instructions per request (callgrind, {n} and {} requests), use-forwarded-headers {forwarded}:",
        11 * n
    );
    // Without an incoming X-Request-ID the template generates one (a
    // random-number call); with one, it is passed on.
    for (label, goal, headers) in [
        (
            "no X-Request-ID from the client",
            0.85,
            "Host: bench.test\r\nX-Forwarded-Proto: https\r\n",
        ),
        (
            "client sends X-Request-ID",
            0.90,
            "Host: bench.test\r\nX-Forwarded-Proto: https\r\nX-Request-ID: 0123456789abcdef\r\n",
        ),
    ] {
        let plain = per_request(&plain_conf, &web_backend(a, b), plain_port, plain_api, headers);
        let ingress = per_request(&ingress_conf, &backends, c.http_port, c.api_port, headers);
        println!(
            "  {label}: plain {plain:.0}, controller-rendered {ingress:.0}, plain/ingress {:.3} (goal >= {goal:.2})",
            plain / ingress
        );
    }
    // Request metrics (on by default, as in ingress-nginx): the same file
    // without the metrics zone and directive, so without the log handler.
    let headers = "Host: bench.test\r\nX-Forwarded-Proto: https\r\n";
    let without: String = ingress_conf
        .lines()
        .filter(|l| !l.contains("dynamic_balancer_metrics"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        ingress_conf.contains("dynamic_balancer_metrics "),
        "the rendered file counts requests"
    );
    let on = per_request(&ingress_conf, &backends, c.http_port, c.api_port, headers);
    let off = per_request(&without, &backends, c.http_port, c.api_port, headers);
    println!(
        "  request metrics: on {on:.0}, off {off:.0}, cost {:+.2}% (goal <= 3%)",
        (on / off - 1.0) * 100.0
    );
}

fn latency(changes: usize) {
    let (_upstreams, a, b) = upstream_pair();
    let api = FakeApiServer::start();
    api.apply_yaml(INGRESS_CLASS);
    api.apply_yaml(&service("web", &[a]));
    api.apply_yaml(&ingress("web", "web.test", "/", "web", &[]));
    let c = Controller::start_on_cluster(&api.kubeconfig(), &[]);
    let mut samples = Vec::new();
    for i in 0..changes {
        let (port, body) = if i % 2 == 0 { (b, "b\n") } else { (a, "a\n") };
        let started = Instant::now();
        set_endpoints(&api, "web", &[port]);
        // Poll every millisecond (wait_until's 20 ms would dominate).
        let deadline = started + Duration::from_secs(10);
        while request(c.http_port, "web.test", "/").is_none_or(|r| r.1 != body) {
            assert!(Instant::now() < deadline, "change {i} was not routed:\n{}", c.log());
            std::thread::sleep(Duration::from_millis(1));
        }
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "EndpointSlice change -> routed: {changes} changes, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (reloads: {})",
        percentile(samples.clone(), 0.5),
        percentile(samples.clone(), 0.99),
        percentile(samples, 1.0),
        c.reloads() - 1.0
    );
    let mut hosts = Vec::new();
    for i in 0..10 {
        let host = format!("h{i}.test");
        let started = Instant::now();
        api.apply_yaml(&ingress(&format!("h{i}"), &host, "/", "web", &[]));
        let ok = wait_until(Duration::from_secs(30), || {
            request(c.http_port, &host, "/").is_some_and(|r| r.0 == 200)
        });
        assert!(ok, "host {host} not served:\n{}", c.log());
        hosts.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "new Ingress host -> served: 10 hosts, p50 {:.0} ms, max {:.0} ms (includes --reload-settle-ms 100 in the test harness, render, nginx -t, reload, new workers)",
        percentile(hosts.clone(), 0.5),
        percentile(hosts, 1.0)
    );
}

fn webhook(n: usize, seconds: u32, clients: usize) {
    use tests::admission::{ingress_json, post, review_of, webhook_certificate};
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = webhook_certificate(certs.path());
    let port = free_port();
    let args = [
        format!("--validating-webhook=127.0.0.1:{port}"),
        format!("--validating-webhook-certificate={cert}"),
        format!("--validating-webhook-key={key}"),
        "--reload-timeout-s=300".to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let c = Controller::spawn(&[("all.yaml", scale::many_ingresses(n, 18081, 0))], &args);
    first_configuration(&c, started);
    let deadline = Instant::now() + Duration::from_secs(seconds as u64);
    let cpu_before = cpu_seconds(c.pid());
    let t0 = Instant::now();
    let results: Vec<(Vec<Duration>, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|t| {
                s.spawn(move || {
                    let (mut latencies, mut busy) = (Vec::new(), 0usize);
                    let mut i = 0;
                    while Instant::now() < deadline && latencies.len() + busy < 1_000_000 {
                        let ing = ingress_json(&format!("new-{t}-{i}"), &format!("new-{t}-{i}.example.com"), &[]);
                        let body = review_of(&ing).to_string();
                        let sent = Instant::now();
                        match post(port, body.as_bytes()) {
                            Ok((200, v)) => {
                                assert_eq!(v["response"]["allowed"], true, "{v}");
                                latencies.push(sent.elapsed());
                            }
                            Ok((429, _)) => busy += 1,
                            other => panic!("webhook answered {other:?}"),
                        }
                        i += 1;
                    }
                    (latencies, busy)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(c.pid()) - cpu_before;
    let busy: usize = results.iter().map(|r| r.1).sum();
    let all: Vec<f64> = results
        .iter()
        .flat_map(|r| r.0.iter().map(|d| d.as_secs_f64() * 1e3))
        .collect();
    let answered = all.len();
    assert!(answered > 0, "no review answered");
    println!(
        "{n} Ingresses, {clients} clients for {elapsed:.1} s: {:.1} reviews/s answered ({busy} refused with 429), latency p50 {:.1} ms p99 {:.1} ms, controller CPU {:.2} ms per review ({:.0}% of one core)",
        answered as f64 / elapsed,
        percentile(all.clone(), 0.5),
        percentile(all, 0.99),
        cpu * 1e3 / (answered + busy).max(1) as f64,
        cpu / elapsed * 100.0
    );
}

pub(crate) fn rss_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn scale_cluster(n: usize) {
    use serde_json::json;
    use tests::kube_apiserver::RealApiServer;
    use tests::pod_network::POD_IP;
    let api = RealApiServer::start();
    let id = api.install_chart(&[]);
    api.apply_yaml(INGRESS_CLASS);
    api.kubectl(&["create", "namespace", "demo"], None);
    let created = Instant::now();
    for i in 0..n {
        let svc = format!("svc{i}");
        let objects = [
            (
                "/api/v1/namespaces/demo/services",
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": svc},
                       "spec": {"ports": [{"name": "http", "port": 80}]}}),
            ),
            (
                "/apis/discovery.k8s.io/v1/namespaces/demo/endpointslices",
                json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                       "metadata": {"name": format!("{svc}-0"), "labels": {"kubernetes.io/service-name": svc}},
                       "addressType": "IPv4", "ports": [{"name": "http", "port": 18081}],
                       "endpoints": [{"addresses": [POD_IP]}]}),
            ),
            (
                "/apis/networking.k8s.io/v1/namespaces/demo/ingresses",
                serde_saphyr::from_str::<serde_json::Value>(&ingress(
                    &format!("ing{i}"),
                    &format!("h{i}.example.com"),
                    "/",
                    &svc,
                    &[],
                ))
                .unwrap(),
            ),
        ];
        for (path, obj) in objects {
            let (code, body) = api.call("POST", path, Some(&obj));
            assert_eq!(code, 201, "{path}: {body}");
        }
    }
    eprintln!("created {} objects in {:.1} s", 3 * n, created.elapsed().as_secs_f64());
    let started = Instant::now();
    let mut args = id.args();
    args.extend([tests::controller::STRICT, "--reload-timeout-s", "300"]);
    let c = Controller::spawn_on_cluster(&id.kubeconfig, &args, "bench");
    let (elapsed, rss) = first_configuration(&c, started);
    println!(
        "{n} Ingresses on Kubernetes 1.36: first configuration applied in {:.2} s (list + watch + build + render + reload + push); {rss}",
        elapsed.as_secs_f64(),
    );
    // EndpointSlice changes through the apiserver: from the PUT to the
    // module holding the new endpoint (watch, model, push; routing itself
    // is measured in manifest mode by `scale`).
    let mut samples = Vec::new();
    for j in 0..50usize {
        let svc = format!("svc{}", j % n.min(50));
        let port = 18082 + (j / n.min(50)) as u16 % 2;
        let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{svc}-0"), "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": port}],
            "endpoints": [{"addresses": [POD_IP]}]});
        let path = format!("/apis/discovery.k8s.io/v1/namespaces/demo/endpointslices/{svc}-0");
        let t = Instant::now();
        let (code, body) = api.call("PUT", &path, Some(&slice));
        assert_eq!(code, 200, "{path}: {body}");
        let want = format!("\"port\":\"{port}\"");
        let backend = format!("/configuration/backends/demo-{svc}-80");
        while !c.api_get(&backend).is_some_and(|r| r.1.contains(&want)) {
            assert!(t.elapsed() < Duration::from_secs(30), "{svc} not applied:\n{}", c.log());
            std::thread::sleep(Duration::from_millis(1));
        }
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "  EndpointSlice PUT -> pushed to the module: 50 changes, p50 {:.1} ms, p99 {:.1} ms (polled every 1 ms)",
        percentile(samples.clone(), 0.5),
        percentile(samples, 0.99)
    );
}

/// Waits for the first applied configuration; returns how long it took from
/// `started` and the controller's RSS at that moment, 3 s later (once the
/// first push and reload are behind it) and at its peak.
pub(crate) fn first_configuration(c: &Controller, started: Instant) -> (Duration, String) {
    let ready = wait_until(Duration::from_secs(600), || {
        tests::controller::get_url(&format!("http://127.0.0.1:{}/readyz", c.metrics_port)).is_some_and(|r| r.0 == 200)
    });
    assert!(ready, "not ready:\n{}", c.log());
    let elapsed = started.elapsed();
    let at_ready = rss_kb(c.pid(), "VmRSS:");
    std::thread::sleep(Duration::from_secs(3));
    let rss = format!(
        "controller RSS {at_ready} kB at ready, {} kB 3 s later (peak {} kB)",
        rss_kb(c.pid(), "VmRSS:"),
        rss_kb(c.pid(), "VmHWM:")
    );
    (elapsed, rss)
}
