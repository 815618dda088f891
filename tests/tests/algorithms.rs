//! Each balancing algorithm, end to end: the choices nginx makes for real.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use lua_compat::chash::ChashRing;
use serde_json::{json, Value};
use tests::{backend, Nginx, Upstream};

fn with(mut b: Value, fields: Value) -> Value {
    for (k, v) in fields.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn upstreams(n: usize) -> Vec<Upstream> {
    (0..n).map(|_| Upstream::start()).collect()
}

/// The endpoint resty.chash picks for `key` over `ups`, by address.
fn expected(ups: &[&Upstream], key: &str) -> String {
    let ids: Vec<String> = ups.iter().map(|u| format!("127.0.0.1:{}", u.port)).collect();
    let ring = ChashRing::new(ids.iter().map(|id| (id.as_str(), 1)));
    ups[ring.find(key.as_bytes()).unwrap().0].identity.clone()
}

#[test]
fn chash_picks_what_resty_chash_picks_and_remaps_little() {
    let ng = Nginx::builder().workers(2).start();
    let ups = upstreams(10);
    let hash_by = json!({"upstreamHashByConfig": {"upstream-hash-by": "$http_x_user"}});
    let eps: Vec<Value> = ups.iter().map(Upstream::endpoint).collect();
    assert_eq!(
        ng.post_backends(&json!([with(backend("web", &eps), hash_by.clone())]))
            .status,
        201
    );
    let refs: Vec<&Upstream> = ups.iter().collect();
    let keys: Vec<String> = (0..120).map(|i| format!("user-{i}")).collect();
    let mut before = BTreeMap::new();
    for key in &keys {
        let r = ng.get_with(&[("X-Backend", "web"), ("X-User", key)]);
        assert_eq!(r.body, expected(&refs, key), "key {key}");
        assert_eq!(
            ng.get_with(&[("X-Backend", "web"), ("X-User", key)]).body,
            r.body,
            "same key, same endpoint"
        );
        before.insert(key.clone(), r.body);
    }
    // Move one endpoint of ten.
    let moved = Upstream::start();
    let mut refs2 = refs.clone();
    refs2[3] = &moved;
    let eps2: Vec<Value> = refs2.iter().map(|u| u.endpoint()).collect();
    assert_eq!(
        ng.post_backends(&json!([with(backend("web", &eps2), hash_by)])).status,
        201
    );
    let mut remapped = 0;
    let mut ring_remapped = 0;
    for key in &keys {
        let r = ng.get_with(&[("X-Backend", "web"), ("X-User", key)]);
        assert_eq!(r.body, expected(&refs2, key));
        remapped += usize::from(r.body != before[key]);
        ring_remapped += usize::from(expected(&refs2, key) != expected(&refs, key));
    }
    // Exactly the keys the ring moves, which depends on where the ports'
    // points fall: about 1/10 on average, but one node's arc can be wide.
    assert_eq!(remapped, ring_remapped);
    let share = remapped as f64 / keys.len() as f64;
    assert!(
        share > 0.0 && share <= 0.5,
        "moving 1 of 10 endpoints remapped {share:.2} of keys"
    );
}

#[test]
fn chashsubset_keeps_a_key_inside_its_subset() {
    let ng = Nginx::builder().start();
    let ups = upstreams(7);
    let eps: Vec<Value> = ups.iter().map(Upstream::endpoint).collect();
    let cfg = json!({"upstreamHashByConfig": {"upstream-hash-by": "$http_x_user", "upstream-hash-by-subset": true, "upstream-hash-by-subset-size": 3}});
    assert_eq!(ng.post_backends(&json!([with(backend("web", &eps), cfg)])).status, 201);
    // Subsets as chashsubset.lua builds them: [0,1,2] [3,4,5] [6,0,1].
    let sets = lua_compat::algorithm::subsets(7, 3);
    let ring = ChashRing::new([("set1", 1), ("set2", 1), ("set3", 1)]);
    for key in ["alice", "bob", "carol", "dave"] {
        let set = &sets[ring.find(key.as_bytes()).unwrap().0];
        let allowed: BTreeSet<String> = set.iter().map(|i| ups[*i].identity.clone()).collect();
        let seen: BTreeSet<String> = (0..30)
            .map(|_| ng.get_with(&[("X-Backend", "web"), ("X-User", key)]).body)
            .collect();
        assert!(seen.is_subset(&allowed), "key {key}: {seen:?} outside {allowed:?}");
        assert!(seen.len() > 1, "spread inside the subset: {seen:?}");
    }
}

#[test]
fn ewma_moves_traffic_away_from_a_slow_endpoint() {
    let ng = Nginx::builder()
        .workers(2)
        .location_extra("add_header X-Ewma $balancer_ewma_score always;")
        .start();
    let (fast, slow) = (Upstream::start(), Upstream::start_slow(Duration::from_millis(80)));
    let b = with(
        backend("web", &[fast.endpoint(), slow.endpoint()]),
        json!({"load-balance": "ewma"}),
    );
    assert_eq!(ng.post_backends(&json!([b])).status, 201);
    let started = Instant::now();
    let mut late = Vec::new();
    while started.elapsed() < Duration::from_secs(3) {
        let r = ng.get("web");
        assert_eq!(r.status, 200);
        assert!(
            r.header("x-ewma").is_some_and(|s| s.parse::<f64>().is_ok()),
            "{:?}",
            r.headers
        );
        if started.elapsed() > Duration::from_millis(1500) {
            late.push(r.body == slow.identity);
        }
    }
    let slow_share = late.iter().filter(|s| **s).count() as f64 / late.len() as f64;
    assert!(
        slow_share < 0.1,
        "after 1.5 s the slow endpoint still got {slow_share:.2} of requests"
    );
    // Scores are shared: /configuration/health shows the slow one's.
    let health = ng.api("GET", "/configuration/health", None).json();
    let score = |u: &Upstream| {
        health["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["endpoint"] == format!("127.0.0.1:{}", u.port))
            .unwrap()["ewma"]
            .as_f64()
            .unwrap()
    };
    assert!(score(&slow) > score(&fast), "{health}");
}

#[test]
fn least_conn_favours_the_endpoint_that_is_not_stalled() {
    let ng = Nginx::builder().workers(2).start();
    let (fast, stalled) = (Upstream::start(), Upstream::start_slow(Duration::from_secs(3)));
    let b = with(
        backend("web", &[stalled.endpoint(), fast.endpoint()]),
        json!({"load-balance": "least_conn"}),
    );
    assert_eq!(ng.post_backends(&json!([b])).status, 201);
    // Park a few requests on the stalled endpoint.
    let parked = tests::park_requests(ng.port, "web", 4);
    std::thread::sleep(Duration::from_millis(500));
    let to_fast = (0..20).filter(|_| ng.get("web").body == fast.identity).count();
    assert!(
        to_fast >= 19,
        "only {to_fast}/20 went to the endpoint without stalled connections"
    );
    for p in parked {
        p.join().unwrap();
    }
}

#[test]
fn endpoint_weights_are_honoured() {
    let ng = Nginx::builder().start();
    let (a, b) = (Upstream::start(), Upstream::start());
    let heavy = with(a.endpoint(), json!({"weight": 3}));
    assert_eq!(
        ng.post_backends(&json!([backend("web", &[heavy, b.endpoint()])]))
            .status,
        201
    );
    let to_a = (0..40).filter(|_| ng.get("web").body == a.identity).count();
    assert_eq!(to_a, 30, "weight 3:1 over 40 requests");
}

#[test]
fn unknown_load_balance_falls_back_to_round_robin_with_a_warning() {
    let ng = Nginx::builder().start();
    let (a, b) = (Upstream::start(), Upstream::start());
    let bk = with(
        backend("web", &[a.endpoint(), b.endpoint()]),
        json!({"load-balance": "random-magic"}),
    );
    assert_eq!(ng.post_backends(&json!([bk])).status, 201);
    let seen: BTreeSet<String> = (0..4).map(|_| ng.get("web").body).collect();
    assert_eq!(seen.len(), 2);
    assert!(ng
        .error_log()
        .contains("\"random-magic\" is not supported, falling back to round_robin"));
}

#[test]
fn a_large_ring_is_built_off_the_event_loop_and_taken_in() {
    // 10,000 endpoints: a ring of 1.6 M points, above the size the module
    // builds inline. The old ring routes while the new one is built.
    let ng = Nginx::builder().workers(2).start();
    let (a, b, c) = (Upstream::start(), Upstream::start(), Upstream::start());
    let hash_by = json!({"upstreamHashByConfig": {"upstream-hash-by": "$http_x_user"}});
    let big = |x: &Upstream, y: &Upstream| tests::bench::alternating_backend("big", 10_000, x.port, y.port, &hash_by);
    assert_eq!(ng.post_backends(&json!([big(&a, &b)])).status, 201);
    let keys: Vec<String> = (0..40).map(|i| format!("user-{i}")).collect();
    let get = |key: &str| {
        let r = ng.get_with(&[("X-Backend", "big"), ("X-User", key)]);
        assert_eq!(r.status, 200, "{key}: {}", r.body);
        r.body
    };
    // Where resty.chash sends each key over 10,000 endpoints alternating x, y.
    let expect = |x: &Upstream, y: &Upstream| -> Vec<String> {
        let ids: Vec<String> = (0..10_000)
            .map(|i| format!("127.0.0.1:{}", if i % 2 == 0 { x.port } else { y.port }))
            .collect();
        let ring = ChashRing::new(ids.iter().map(|id| (id.as_str(), 1)));
        keys.iter()
            .map(|k| {
                let i = ring.find(k.as_bytes()).unwrap().0;
                if i.is_multiple_of(2) {
                    x.identity.clone()
                } else {
                    y.identity.clone()
                }
            })
            .collect()
    };
    let (v1, v2) = (expect(&a, &b), expect(&a, &c));
    assert_ne!(v1, v2, "the change must move some keys");
    let before: Vec<String> = keys.iter().map(|k| get(k)).collect();
    assert_eq!(before, v1);

    // b goes, c comes: until the new ring is taken in, the old one answers;
    // every answer is one of the two rings', and soon all are the new one's.
    let body = big(&a, &c).to_string();
    assert_eq!(ng.api("PUT", "/configuration/backends/big", Some(&body)).status, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: Vec<String> = keys.iter().map(|k| get(k)).collect();
        for (i, answer) in now.iter().enumerate() {
            assert!(*answer == v1[i] || *answer == v2[i], "{}: {answer}", keys[i]);
        }
        if now == v2 {
            break;
        }
        assert!(Instant::now() < deadline, "the new ring was never taken in");
        std::thread::sleep(Duration::from_millis(5));
    }
    let log = ng.error_log();
    assert!(
        !log.contains("[alert]") && !log.contains("[emerg]") && !log.contains("panic"),
        "{log}"
    );
}
