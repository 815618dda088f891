//! Reloads, read-your-writes across workers, and configuration errors.

use std::collections::BTreeSet;

use serde_json::json;
use tests::{backend, Nginx, NginxBuilder, Upstream};

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
    assert!(err.contains("at least 64k"), "{err}");
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
