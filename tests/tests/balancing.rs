//! The round-robin peer hook against real upstreams.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;
use tests::{backend, dead_endpoint, Nginx, Upstream};

/// Over N requests a worker serves, each of K endpoints gets N/K ± 1, and both
/// workers route by the same configuration.
#[test]
fn round_robin_gives_exact_shares_per_worker() {
    let ng = Nginx::builder().workers(2).start();
    let ups: Vec<Upstream> = (0..3).map(|_| Upstream::start()).collect();
    let eps: Vec<_> = ups.iter().map(Upstream::endpoint).collect();
    assert_eq!(ng.post_backends(&json!([backend("web", &eps)])).status, 201);

    let mut per_worker: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for _ in 0..120 {
        let r = ng.get("web");
        assert_eq!(r.status, 200);
        let pid = r.header("x-pid").unwrap().to_string();
        *per_worker.entry(pid).or_default().entry(r.body).or_default() += 1;
    }
    assert_eq!(per_worker.len(), 2, "both workers served: {per_worker:?}");
    for (pid, counts) in &per_worker {
        let n: usize = counts.values().sum();
        assert_eq!(counts.len(), 3, "worker {pid} used every endpoint: {counts:?}");
        for c in counts.values() {
            assert!(c.abs_diff(n / 3) <= 1, "worker {pid}: {counts:?} of {n}");
        }
    }
}

#[test]
fn keepalive_after_the_directive_reuses_connections() {
    let ng = Nginx::builder().upstream_extra("keepalive 8;").start();
    let a = Upstream::start();
    assert_eq!(ng.post_backends(&json!([backend("web", &[a.endpoint()])])).status, 201);
    for _ in 0..20 {
        assert_eq!(ng.get("web").status, 200);
    }
    let peers: BTreeSet<String> = a.peers().into_iter().collect();
    assert_eq!(peers.len(), 1, "20 requests over one upstream connection: {peers:?}");

    // Control: without keepalive every request opens a new connection.
    let plain = Nginx::builder().upstream_extra("").start();
    let b = Upstream::start();
    assert_eq!(
        plain.post_backends(&json!([backend("web", &[b.endpoint()])])).status,
        201
    );
    for _ in 0..5 {
        assert_eq!(plain.get("web").status, 200);
    }
    assert_eq!(b.peers().into_iter().collect::<BTreeSet<_>>().len(), 5);
}

#[test]
fn dead_endpoint_is_skipped_by_retries() {
    let ng = Nginx::builder().start();
    let a = Upstream::start();
    assert_eq!(
        ng.post_backends(&json!([backend("web", &[dead_endpoint(), a.endpoint()])]))
            .status,
        201
    );
    for _ in 0..10 {
        let r = ng.get("web");
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, a.identity.as_str()),
            "{:?}",
            r.headers
        );
    }
    assert_eq!(a.hits(), 10);
}

#[test]
fn a_request_never_tries_an_endpoint_twice() {
    let ng = Nginx::builder().start();
    let a = Upstream::start();
    let eps = [
        dead_endpoint(),
        dead_endpoint(),
        dead_endpoint(),
        a.endpoint(),
        dead_endpoint(),
    ];
    assert_eq!(ng.post_backends(&json!([backend("web", &eps)])).status, 201);
    for _ in 0..10 {
        let r = ng.get("web");
        assert_eq!(r.status, 200);
        let tried: Vec<&str> = r.header("x-upstream-addr").unwrap().split(", ").collect();
        let distinct: BTreeSet<&&str> = tried.iter().collect();
        assert_eq!(distinct.len(), tried.len(), "repeated endpoint: {tried:?}");
        assert_eq!(*tried.last().unwrap(), format!("127.0.0.1:{}", a.port));
    }
}

#[test]
fn all_endpoints_dead_tries_each_once_then_502() {
    let ng = Nginx::builder().start();
    let eps = [dead_endpoint(), dead_endpoint(), dead_endpoint()];
    assert_eq!(ng.post_backends(&json!([backend("web", &eps)])).status, 201);
    let r = ng.get("web");
    assert_eq!(r.status, 502);
    let tried: BTreeSet<&str> = r.header("x-upstream-addr").unwrap().split(", ").collect();
    assert_eq!(tried.len(), 3, "{tried:?}");
}

/// ingress-nginx answers 503 here (e2e dynamic_configuration.go), not 502 or 500.
#[test]
fn missing_backend_or_endpoints_is_503() {
    let ng = Nginx::builder().start();
    let a = Upstream::start();
    let body = json!([backend("web", &[a.endpoint()]), backend("empty", &[])]);
    assert_eq!(ng.post_backends(&body).status, 201);
    assert_eq!(ng.get("unknown").status, 503);
    assert_eq!(ng.get("empty").status, 503);
    assert_eq!(ng.get_with(&[]).status, 503, "empty variable");
    assert_eq!(ng.get("web").status, 200);
    assert_eq!(ng.get_path("/not-proxied").status, 200, "other locations are untouched");
    assert!(ng.error_log().contains("no endpoints for backend \"unknown\""));
}

#[test]
fn ipv6_endpoints() {
    let ng = Nginx::builder().start();
    let (v6, v4) = (Upstream::start_v6(), Upstream::start());
    assert_eq!(
        ng.post_backends(&json!([backend("web", &[v6.endpoint(), v4.endpoint()])]))
            .status,
        201
    );
    let seen: BTreeSet<String> = (0..4).map(|_| ng.get("web").body).collect();
    assert_eq!(seen, BTreeSet::from([v6.identity.clone(), v4.identity.clone()]));
    let r = (0..2).map(|_| ng.get("web")).find(|r| r.body == v6.identity).unwrap();
    assert_eq!(r.header("x-upstream-addr"), Some(format!("[::1]:{}", v6.port).as_str()));
}

#[test]
fn the_backend_variable_is_configurable() {
    let ng = Nginx::builder()
        .balancer_directive("dynamic_balancer $chosen_backend;")
        .location_extra("set $chosen_backend $http_x_other;")
        .start();
    let a = Upstream::start();
    assert_eq!(ng.post_backends(&json!([backend("web", &[a.endpoint()])])).status, 201);
    assert_eq!(ng.get_with(&[("X-Other", "web")]).body, a.identity);
    assert_eq!(
        ng.get_with(&[("X-Backend", "web")]).status,
        503,
        "$proxy_upstream_name is not used"
    );
}

/// A literal name per location, with no rewrite script; it wins over the variable.
#[test]
fn a_location_can_name_its_backend_literally() {
    let ng = Nginx::builder().location_extra("dynamic_balancer_backend web;").start();
    let (a, b) = (Upstream::start(), Upstream::start());
    let body = json!([backend("web", &[a.endpoint()]), backend("other", &[b.endpoint()])]);
    assert_eq!(ng.post_backends(&body).status, 201);
    assert_eq!(
        ng.get("other").body,
        a.identity,
        "the literal name wins over $proxy_upstream_name"
    );
    assert_eq!(ng.get_with(&[]).body, a.identity);
    assert_eq!(ng.api("DELETE", "/configuration/backends/web", None).status, 204);
    assert_eq!(ng.get("other").status, 503);
}
