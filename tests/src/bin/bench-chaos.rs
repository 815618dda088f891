//! Chaos under load, and restart time.
//!
//! `bench-chaos load [SECONDS]` (default 60): wrk against the
//! controller-rendered nginx, with the controller on the fake apiserver,
//! while for the whole run:
//! - the `web` Service's endpoints change 100 times a second (always at
//!   least one live endpoint);
//! - an Ingress is added or changed every 2 s (each one reloads nginx);
//! - every apiserver watch is cut every 10 s;
//! - one upstream is killed at a third of the run and restarted at half.
//!
//! It reports wrk's requests, non-2xx answers and socket errors, the
//! reloads, and whether every endpoint change was applied: at checkpoints
//! the module must hold one of the last few endpoint sets written, and at
//! the end exactly the last one.
//!
//! `bench-chaos restart [ROUNDS]` (default 10): `kill -9` of the nginx
//! master (supervised mode), then the time until the first request that is
//! routed correctly again.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::apiserver::FakeApiServer;
use tests::bench::wrk;
use tests::controller::{ingress, service, wait_until, Cluster, Controller, INGRESS_CLASS};
use tests::upstream::Upstream;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("load") | None => load(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60)),
        Some("restart") => restart(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10)),
        Some(other) => {
            eprintln!("usage: bench-chaos [load [SECONDS] | restart [ROUNDS]] (not {other:?})");
            std::process::exit(2);
        }
    }
}

/// The endpoint set a round of churn writes: always the stable upstreams,
/// plus a varying subset of the others.
fn endpoint_set(round: u64, stable: &[u16], others: &[u16]) -> Vec<u16> {
    let mut ports = stable.to_vec();
    for (i, p) in others.iter().enumerate() {
        if (round >> i) & 1 == 1 {
            ports.push(*p);
        }
    }
    ports
}

/// One EndpointSlice of the `web` Service per upstream port.
fn slice_for(port: u16) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: demo\n  name: web-p{port}\n  labels: {{kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{{name: http, port: {port}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n"
    )
}

/// The endpoint ports the module holds for backend `demo-web-80`.
fn module_ports(c: &Controller) -> Option<BTreeSet<u16>> {
    let (_, body) = c.api_get("/configuration/backends/demo-web-80")?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some(
        v["endpoints"]
            .as_array()?
            .iter()
            .filter_map(|e| e["port"].as_str()?.parse().ok())
            .collect(),
    )
}

fn load(seconds: u64) {
    let api = FakeApiServer::start();
    // Two stable upstreams, one that dies and comes back, and two that
    // come and go with the churn.
    let stable = [Upstream::start(), Upstream::start()];
    let victim_port = tests::free_port();
    let victim = Arc::new(Mutex::new(Some(Upstream::restart_on(victim_port))));
    let churn = [Upstream::start(), Upstream::start()];
    let stable_ports: Vec<u16> = stable.iter().map(|u| u.port).chain([victim_port]).collect();
    let churn_ports: Vec<u16> = churn.iter().map(|u| u.port).collect();

    api.apply_yaml(INGRESS_CLASS);
    api.apply_yaml(&service("web", &[]));
    for p in &stable_ports {
        api.apply_yaml(&slice_for(*p));
    }
    api.apply_yaml(&ingress("web", "web.test", "/", "web", &[]));
    let c = Controller::start_on_cluster(&api.kubeconfig(), &[]);
    assert_eq!(c.get("web.test", "/").0, 200, "{}", c.log());
    let reloads_before = c.reloads();
    println!("chaos: {seconds} s of load; churn 100/s, an Ingress every 2 s, watches cut every 10 s, one upstream killed and restarted");

    let stop = Arc::new(AtomicBool::new(false));
    let written: Arc<Mutex<VecDeque<BTreeSet<u16>>>> = Arc::new(Mutex::new(VecDeque::new()));
    let changes = Arc::new(AtomicU64::new(0));
    let api = Arc::new(api);
    let started = Instant::now();

    // Endpoint churn, 100 changes a second.
    let churner = {
        let (api, stop, written, changes) = (api.clone(), stop.clone(), written.clone(), changes.clone());
        let (stable_ports, churn_ports) = (stable_ports.clone(), churn_ports.clone());
        std::thread::spawn(move || {
            let mut round = 0u64;
            let mut next = Instant::now();
            let mut have: BTreeSet<u16> = stable_ports.iter().copied().collect();
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let ports = endpoint_set(round, &stable_ports, &churn_ports);
                // As Kubernetes' EndpointSlice controller does: slices are
                // updated in place, never all removed at once.
                let want: BTreeSet<u16> = ports.iter().copied().collect();
                for p in want.difference(&have) {
                    api.apply_yaml(&slice_for(*p));
                }
                for p in have.difference(&want) {
                    api.delete("EndpointSlice", "demo", &format!("web-p{p}"));
                }
                have = want;
                {
                    let mut w = written.lock().unwrap();
                    w.push_back(ports.iter().copied().collect());
                    if w.len() > 50 {
                        w.pop_front();
                    }
                }
                changes.fetch_add(1, Ordering::Relaxed);
                next += Duration::from_millis(10);
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
        })
    };

    // Structural changes, watch cuts and the upstream's death, on a timeline.
    let timeline = {
        let (api, stop, victim) = (api.clone(), stop.clone(), victim.clone());
        std::thread::spawn(move || {
            let mut tick = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                tick += 1;
                if tick.is_multiple_of(2) {
                    let n = tick / 2;
                    api.apply_yaml(&ingress(
                        &format!("extra-{n}"),
                        &format!("extra-{n}.test"),
                        "/",
                        "web",
                        &[],
                    ));
                }
                if tick.is_multiple_of(10) {
                    api.cut_watches();
                }
                if tick == seconds / 3 {
                    victim.lock().unwrap().take();
                    println!("chaos: t={tick}s upstream {victim_port} killed");
                }
                if tick == seconds / 2 {
                    *victim.lock().unwrap() = Some(Upstream::restart_on(victim_port));
                    println!("chaos: t={tick}s upstream {victim_port} restarted");
                }
            }
        })
    };

    // Checkpoints: the module must hold one of the sets written lately.
    let checker = {
        let (stop, written) = (stop.clone(), written.clone());
        let c_ports = c.api_port;
        let token = c.api_token();
        std::thread::spawn(move || {
            let (mut ok, mut stale) = (0u32, 0u32);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2500));
                let body = tests::agent()
                    .get(&format!(
                        "http://127.0.0.1:{c_ports}/configuration/backends/demo-web-80"
                    ))
                    .header("Authorization", &format!("Bearer {token}"))
                    .call()
                    .ok()
                    .and_then(|mut r| r.body_mut().read_to_string().ok())
                    .unwrap_or_default();
                let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let held: BTreeSet<u16> = v["endpoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e["port"].as_str()?.parse().ok())
                    .collect();
                if written.lock().unwrap().iter().any(|w| *w == held) {
                    ok += 1;
                } else {
                    stale += 1;
                }
            }
            (ok, stale)
        })
    };

    let run = wrk(
        &format!("http://127.0.0.1:{}/", c.http_port),
        seconds as u32,
        32,
        &["Host: web.test"],
    );
    stop.store(true, Ordering::Relaxed);
    churner.join().unwrap();
    timeline.join().unwrap();
    let (ok, stale) = checker.join().unwrap();
    let last = written.lock().unwrap().back().cloned().unwrap_or_default();
    let converged = wait_until(Duration::from_secs(10), || module_ports(&c).as_ref() == Some(&last));
    let failed = run.non_2xx + run.socket_errors;
    println!(
        "chaos: {} requests in {:.0} s ({:.0}/s); non-2xx {}, socket errors {}: {:.4}% failed (goal < 0.1%)",
        run.requests,
        started.elapsed().as_secs_f64(),
        run.rps,
        run.non_2xx,
        run.socket_errors,
        100.0 * failed as f64 / run.requests.max(1) as f64
    );
    println!(
        "chaos: {} endpoint changes; checkpoints holding a recent set {ok}/{}; final set applied: {converged}",
        changes.load(Ordering::Relaxed),
        ok + stale
    );
    println!(
        "chaos: reloads during the run {}; apiserver watches opened {}; nginx restarts {}",
        c.reloads() - reloads_before,
        api.watches(),
        c.metric("nginx_ingress_controller_nginx_restarts_total")
    );
    println!(
        "chaos: backend pushes ok {}, error {}",
        push_count(&c, "ok"),
        push_count(&c, "error") + 0.0
    );
    for line in c
        .log()
        .lines()
        .filter(|l| l.contains("pushing backends failed") || l.contains("ERROR"))
    {
        println!("chaos: controller: {line}");
    }
    drop(stable);
    drop(churn);
    if !converged || stale > 0 {
        eprintln!("chaos: endpoint changes were not all applied\n{}", c.log());
        std::process::exit(1);
    }
}

fn push_count(c: &Controller, result: &str) -> f64 {
    let (_, text) =
        tests::controller::get_url(&format!("http://127.0.0.1:{}/metrics", c.metrics_port)).unwrap_or_default();
    text.lines()
        .filter(|l| {
            l.starts_with("nginx_ingress_controller_dynamic_pushes_total")
                && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

fn restart(rounds: usize) {
    let up = Upstream::start();
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("web.yaml", service("web", &[up.port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
        ],
        &[],
    );
    let mut times = Vec::new();
    for round in 0..rounds {
        assert_eq!(c.get("web.test", "/").1, up.identity);
        let master = c.nginx_master_pid().expect("a master pid");
        let killed = Instant::now();
        // SAFETY: kill(2) on the nginx master the controller runs.
        unsafe { libc::kill(master, libc::SIGKILL) };
        let back = wait_until(Duration::from_secs(30), || {
            c.nginx_master_pid().is_some_and(|p| p != master) && c.get("web.test", "/").1 == up.identity
        });
        let t = killed.elapsed();
        assert!(back, "round {round}: not back within 30 s\n{}", c.log());
        println!(
            "restart: round {round}: {} ms from kill -9 to the first routed request",
            t.as_millis()
        );
        times.push(t.as_secs_f64() * 1000.0);
        // A master that dies again right after a restart is restarted with
        // a growing delay (no hot loop); each round is a fresh crash.
        std::thread::sleep(Duration::from_millis(2500));
    }
    times.sort_by(f64::total_cmp);
    println!(
        "restart: median {:.0} ms, max {:.0} ms over {rounds} rounds (goal ≤ 2000 ms)",
        times[times.len() / 2],
        times[times.len() - 1]
    );
}
