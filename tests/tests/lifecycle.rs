//! Reloads, read-your-writes across workers, and configuration errors.

use std::collections::BTreeSet;

use serde_json::json;
use tests::{backend, primary_with_canary, Nginx, NginxBuilder, Upstream};

#[test]
fn configuration_survives_reload_without_repost() {
    let ng = Nginx::builder().workers(2).start();
    let (a, b) = (Upstream::start(), Upstream::start());
    assert_eq!(
        ng.post_backends(&json!([backend("web", &[a.endpoint(), b.endpoint()])]))
            .status,
        201
    );
    let before = ng.api("GET", "/configuration/backends", None).body;

    let new_workers = ng.reload();
    assert_eq!(new_workers.len(), 2);
    let seen: BTreeSet<String> = (0..6).map(|_| ng.get("web").body).collect();
    assert_eq!(seen, BTreeSet::from([a.identity.clone(), b.identity.clone()]));
    assert_eq!(ng.api("GET", "/configuration/backends", None).body, before);
    let status = ng.status();
    assert_eq!(status["generation"], 1);
    let reporting: BTreeSet<i64> = status["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["pid"].as_i64().unwrap())
        .collect();
    assert!(new_workers.is_subset(&reporting), "{status}");
}

/// Once a write returns, the next request on any worker routes by it.
#[test]
fn writes_are_read_by_the_next_request_on_every_worker() {
    let ng = Nginx::builder().workers(2).start();
    let (a, b) = (Upstream::start(), Upstream::start());
    let mut pids = BTreeSet::new();
    for round in 0..20 {
        let target = if round % 2 == 0 { &a } else { &b };
        let r = ng.api(
            "PUT",
            "/configuration/backends/web",
            Some(&backend("web", &[target.endpoint()]).to_string()),
        );
        assert!(r.status == 200 || r.status == 201, "{}", r.body);
        for _ in 0..4 {
            let r = ng.get("web");
            assert_eq!(r.body, target.identity, "round {round}");
            pids.insert(r.header("x-pid").unwrap().to_string());
        }
    }
    assert_eq!(pids.len(), 2, "both workers were exercised");
    ng.wait_generation(20);
}

fn config_error(builder: NginxBuilder) -> String {
    let out = builder.test_config();
    assert!(!out.status.success(), "nginx -t should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn keepalive_before_the_directive_is_refused() {
    let err = config_error(
        Nginx::builder()
            .balancer_directive("keepalive 8; dynamic_balancer;")
            .upstream_extra(""),
    );
    assert!(
        err.contains("\"dynamic_balancer\" must come before \"keepalive\""),
        "{err}"
    );
}

#[test]
fn bad_directive_arguments_are_refused() {
    let err = config_error(Nginx::builder().zone("16k"));
    assert!(err.contains("at least 128k"), "{err}");
    let err = config_error(Nginx::builder().balancer_directive("dynamic_balancer upstream_name;"));
    assert!(err.contains("invalid variable name"), "{err}");
    let err = config_error(Nginx::builder().api_extra("client_max_body_size 1m; dynamic_balancer_api;"));
    assert!(err.contains("is duplicate"), "{err}");
    let err = config_error(Nginx::builder().upstream_extra("least_conn;"));
    assert!(
        err.contains("another balancing method replaced \"dynamic_balancer\""),
        "{err}"
    );
    let err = config_error(Nginx::builder().location_extra("dynamic_balancer_backend $x;"));
    assert!(err.contains("a literal name is expected"), "{err}");
    let ok = Nginx::builder().test_config();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
}

/// A reload that fails after the module's postconfiguration ran (here a
/// listener another process holds) leaves the old configuration running. A
/// worker the master respawns afterwards runs that old configuration, so it
/// must use its variable indexes, not those of the configuration that failed
/// (which declared 200 variables more and would index past the old array).
#[test]
fn a_worker_respawned_after_a_failed_reload_keeps_its_configuration() {
    let ng = Nginx::builder()
        .workers(1)
        .location_extra("add_header X-Alt $proxy_alternative_upstream_name always;")
        .start();
    let (primary, canary) = (Upstream::start(), Upstream::start());
    let body = primary_with_canary(&primary, &canary, json!({"weight": 100}));
    assert_eq!(ng.post_backends(&body).status, 201);
    let routed = |ng: &Nginx| {
        let r = ng.get("web");
        (r.status, r.header("X-Alt").unwrap_or("").to_string(), r.body)
    };
    assert_eq!(routed(&ng), (200, "web-canary".into(), canary.identity.clone()));

    // The new configuration: 200 more variables, and a port that is taken.
    let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = blocker.local_addr().unwrap().port();
    let conf = ng.prefix().join("nginx.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    let pad: String = (0..200).map(|i| format!("set $pad{i} {i}; ")).collect();
    // The padding comes first, so that every variable after it (ours
    // included) gets an index 200 higher than in the running configuration.
    let failing = text.replacen(
        "http {",
        &format!("http {{\n    server {{ listen 127.0.0.1:{taken}; location / {{ {pad} return 204; }} }}"),
        1,
    );
    std::fs::write(&conf, failing).unwrap();
    let old_workers: BTreeSet<i64> = worker_pids(&ng);
    // SAFETY: signalling the nginx master this test started.
    unsafe { libc::kill(ng.pid() as libc::pid_t, libc::SIGHUP) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !ng.error_log().contains("still could not bind()") {
        assert!(
            std::time::Instant::now() < deadline,
            "the reload did not fail: {}",
            ng.error_log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(worker_pids(&ng), old_workers, "the failed reload replaced the workers");

    // The master respawns a killed worker with the running configuration.
    for pid in &old_workers {
        // SAFETY: a worker of the nginx this test started.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let now = worker_pids(&ng);
        if !now.is_empty() && now.is_disjoint(&old_workers) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no worker was respawned");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for _ in 0..5 {
        assert_eq!(routed(&ng), (200, "web-canary".into(), canary.identity.clone()));
    }
    drop(blocker);
    let log = ng.error_log();
    assert!(
        !log.contains("exited on signal 11") && !log.contains("exited on signal 6"),
        "a worker crashed: {log}"
    );
}

fn worker_pids(ng: &Nginx) -> BTreeSet<i64> {
    ng.status()["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["pid"].as_i64())
        .filter(|p| {
            // SAFETY: signal 0 only checks that the process exists.
            unsafe { libc::kill(*p as libc::pid_t, 0) == 0 }
        })
        .collect()
}
