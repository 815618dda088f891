//! Passive health shared by all workers, and balancer state across reloads.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::{backend, dead_endpoint, Nginx, Upstream};

fn endpoint_health(ng: &Nginx, port: u16) -> Value {
    let health = ng.api("GET", "/configuration/health", None).json();
    health["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["endpoint"] == format!("127.0.0.1:{port}"))
        .cloned()
        .unwrap()
}

#[test]
fn a_killed_endpoint_is_ejected_for_every_worker_and_comes_back() {
    let ng = Nginx::builder().workers(2).start();
    let (a, b) = (Upstream::start(), Upstream::start());
    let victim = Upstream::start();
    let port = victim.port;
    let mut bk = backend("web", &[a.endpoint(), b.endpoint(), victim.endpoint()]);
    bk["maxFails"] = json!(1);
    bk["failTimeout"] = json!(2);
    assert_eq!(ng.post_backends(&json!([bk])).status, 201);
    drop(victim);

    // Under load: no client request fails, and the dead endpoint is tried at
    // most about once per worker before every worker skips it.
    let started = Instant::now();
    let mut attempts_on_dead = 0;
    for _ in 0..60 {
        let r = ng.get("web");
        assert_eq!(r.status, 200, "{:?}", r.headers);
        attempts_on_dead += usize::from(r.header("x-upstream-addr").unwrap().contains(&format!(":{port}")));
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the check must run inside fail_timeout"
    );
    assert!(
        attempts_on_dead <= 2,
        "the dead endpoint was tried {attempts_on_dead} times"
    );
    assert_eq!(endpoint_health(&ng, port)["down"], true);

    // It comes back after fail_timeout, once it answers again.
    let revived = Upstream::restart_on(port);
    std::thread::sleep(Duration::from_millis(2200));
    let deadline = Instant::now() + Duration::from_secs(5);
    while revived.hits() == 0 {
        assert!(Instant::now() < deadline, "the endpoint never came back");
        assert_eq!(ng.get("web").status, 200);
    }
    for _ in 0..9 {
        assert_eq!(ng.get("web").status, 200);
    }
    assert!(revived.hits() >= 3, "back in rotation: {} hits", revived.hits());
    assert_eq!(endpoint_health(&ng, port)["down"], false);
}

#[test]
fn when_every_endpoint_is_down_all_are_still_tried() {
    let ng = Nginx::builder().start();
    let eps = [dead_endpoint(), dead_endpoint()];
    assert_eq!(ng.post_backends(&json!([backend("web", &eps)])).status, 201);
    for _ in 0..3 {
        let r = ng.get("web");
        assert_eq!(r.status, 502);
        assert_eq!(
            r.header("x-upstream-addr").unwrap().split(", ").count(),
            2,
            "both were tried, not skipped"
        );
    }
}

#[test]
fn health_and_ewma_state_survive_reload() {
    let ng = Nginx::builder().workers(2).start();
    // 20 ms, so the round trip registers (nginx times upstreams in ms).
    let (fast, dead) = (Upstream::start_slow(Duration::from_millis(20)), dead_endpoint());
    let dead_port: u16 = dead["port"].as_str().unwrap().parse().unwrap();
    let mut bk = backend("web", &[fast.endpoint(), dead]);
    bk["load-balance"] = json!("ewma");
    bk["failTimeout"] = json!(60);
    assert_eq!(ng.post_backends(&json!([bk])).status, 201);
    for _ in 0..10 {
        assert_eq!(ng.get("web").status, 200);
    }
    let (ewma, down) = (
        endpoint_health(&ng, fast.port)["ewma"].as_f64().unwrap(),
        endpoint_health(&ng, dead_port)["down"].clone(),
    );
    assert!(ewma > 0.0);
    assert_eq!(down, true);
    ng.reload();
    assert_eq!(
        endpoint_health(&ng, dead_port)["down"],
        true,
        "ejection survives the reload"
    );
    assert!(
        endpoint_health(&ng, fast.port)["ewma"].as_f64().unwrap() > 0.0,
        "the score survives the reload"
    );
    for _ in 0..5 {
        let r = ng.get("web");
        assert_eq!(r.status, 200);
        assert!(
            !r.header("x-upstream-addr").unwrap().contains(&format!(":{dead_port}")),
            "new workers skip it at once"
        );
    }
}
