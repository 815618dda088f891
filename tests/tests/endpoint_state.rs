//! The shared endpoint table under one tenant's many endpoints: it grows
//! with the zone, so every endpoint keeps passive health, connection counts
//! and EWMA; when the zone is full anyway, each backend keeps its fair share
//! and nobody's late endpoints are left without state.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{backend, dead_endpoint, Nginx, Upstream};

/// `n` endpoints of backend `b`, on addresses nothing listens on (they are
/// never routed to: the test's requests go to another backend).
fn endpoints(b: usize, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"address": format!("10.{}.{}.{}", b % 250, i / 250, i % 250 + 1), "port": "8080"}))
        .collect()
}

/// `PUT /configuration/backends/{name}` of backend `b`.
fn put(ng: &Nginx, b: &Value) -> tests::nginx::Response {
    let path = format!("/configuration/backends/{}", b["name"].as_str().unwrap());
    ng.api("PUT", &path, Some(&b.to_string()))
}

fn table(ng: &Nginx) -> Value {
    ng.status()["endpoint_table"].clone()
}

fn health_of(ng: &Nginx, backend: &str) -> Vec<Value> {
    let h = ng.api("GET", "/configuration/health", None).json();
    h["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["backend"] == backend)
        .cloned()
        .collect()
}

/// The other tenant's backend: a stalled endpoint, a fast one and a dead
/// one, balanced by least_conn, one failure ejects.
fn other_tenant(stalled: &Upstream, fast: &Upstream) -> Value {
    let mut b = backend("other", &[stalled.endpoint(), fast.endpoint(), dead_endpoint()]);
    b["load-balance"] = json!("least_conn");
    b["maxFails"] = json!(1);
    b["failTimeout"] = json!(30);
    b
}

/// Shows that `other`'s endpoints have working shared state: least_conn
/// sees the stalled endpoint's connections (from both workers), and passive
/// health takes the dead one out.
fn other_tenant_balances_with_shared_state(ng: &Nginx, stalled: &Upstream, fast: &Upstream) {
    let parked = tests::park_requests(ng.port, "other", 4);
    std::thread::sleep(Duration::from_millis(500));
    let health = health_of(ng, "other");
    assert!(health.iter().all(|e| e["tracked"] == true), "{health:?}");
    let on_stalled = health
        .iter()
        .find(|e| e["endpoint"] == format!("127.0.0.1:{}", stalled.port))
        .unwrap();
    assert!(
        on_stalled["connections"].as_u64().unwrap() >= 1,
        "the parked requests are counted: {health:?}"
    );
    for _ in 0..20 {
        let r = ng.get("other");
        assert_eq!(r.status, 200, "{:?}", r.headers);
        assert_eq!(r.body, fast.identity, "least_conn avoids the stalled endpoint");
    }
    let health = health_of(ng, "other");
    let down: Vec<&Value> = health.iter().filter(|e| e["down"] == true).collect();
    assert_eq!(down.len(), 1, "the dead endpoint is out of rotation: {health:?}");
    assert_ne!(down[0]["endpoint"], format!("127.0.0.1:{}", fast.port));
    for p in parked {
        p.join().unwrap();
    }
}

/// The scenario at a size the test suite affords: one tenant with
/// more endpoints than the old fixed table tracked (12,288 in a 32m zone),
/// then another tenant's backend.
#[test]
fn a_tenant_past_the_old_table_size_leaves_everyone_tracked() {
    let ng = Nginx::builder().workers(2).start();
    let (stalled, fast) = (Upstream::start_slow(Duration::from_secs(3)), Upstream::start());
    let big: Vec<Value> = (0..40)
        .map(|b| backend(&format!("big-{b}"), &endpoints(b, 400)))
        .collect();
    let r = ng.post_backends(&Value::Array(big));
    assert_eq!(r.status, 201, "{}", r.body);
    let t = table(&ng);
    assert_eq!(
        (t["tracked"].as_u64(), t["untracked"].as_u64()),
        (Some(16_000), Some(0)),
        "{t}"
    );

    let r = put(&ng, &other_tenant(&stalled, &fast));
    assert_eq!(r.status, 201, "{}", r.body);
    let t = table(&ng);
    assert_eq!(
        (t["tracked"].as_u64(), t["untracked"].as_u64()),
        (Some(16_003), Some(0)),
        "{t}"
    );
    assert!(t["capacity"].as_u64().unwrap() >= 16_003, "{t}");
    // About 80 bytes per endpoint: the 72-byte slot and the index.
    let per = t["bytes"].as_f64().unwrap() / 16_003.0;
    assert!(per < 90.0, "{per} bytes per endpoint: {t}");
    other_tenant_balances_with_shared_state(&ng, &stalled, &fast);

    // The big tenant leaves: its slots are freed at once, and reused.
    let r = ng.post_backends(&json!([other_tenant(&stalled, &fast)]));
    assert_eq!(r.status, 201, "{}", r.body);
    let t = table(&ng);
    assert_eq!(t["tracked"].as_u64(), Some(3), "{t}");
    let slots = t["capacity"].as_u64().unwrap();
    let big: Vec<Value> = (0..20)
        .map(|b| backend(&format!("again-{b}"), &endpoints(b, 400)))
        .collect();
    let mut all = big;
    all.push(other_tenant(&stalled, &fast));
    assert_eq!(ng.post_backends(&Value::Array(all)).status, 201);
    assert_eq!(table(&ng)["capacity"].as_u64(), Some(slots), "freed slots are reused");
}

/// A zone too small for every endpoint's state: the tenant that filled it
/// gives up slots to a backend that arrives later, which keeps its share;
/// the status, health, metrics and log say what is untracked.
#[test]
fn in_a_full_zone_each_backend_keeps_its_fair_share() {
    let ng = Nginx::builder().workers(2).zone("2m").start();
    let (stalled, fast) = (Upstream::start_slow(Duration::from_secs(3)), Upstream::start());
    // Grow the big tenant until the zone has no room for more state.
    let mut n = 0;
    let mut big = Vec::new();
    loop {
        big.push(backend(&format!("big-{n}"), &endpoints(n, 1000)));
        n += 1;
        let r = ng.post_backends(&Value::Array(big.clone()));
        if r.status == 507 {
            big.pop();
            break;
        }
        assert_eq!(r.status, 201, "{}", r.body);
        if table(&ng)["untracked"].as_u64().unwrap() > 0 {
            break;
        }
        assert!(n < 40, "a 2m zone never ran out of room for endpoint state");
    }
    let before = table(&ng);
    assert!(before["untracked"].as_u64().unwrap() > 0, "{before}");
    assert!(ng
        .error_log()
        .contains("dynamic_balancer_zone has no room for more endpoint state"));

    // The other tenant arrives last, in a zone with no free slot.
    let r = put(&ng, &other_tenant(&stalled, &fast));
    assert_eq!(r.status, 201, "{}", r.body);
    let after = table(&ng);
    assert!(after["evicted"].as_u64().unwrap() >= 1, "{after}");
    other_tenant_balances_with_shared_state(&ng, &stalled, &fast);

    // Untracked endpoints are listed as such, and counted in the metrics.
    let untracked = after["untracked"].as_u64().unwrap();
    let listed = (0..n)
        .flat_map(|b| health_of(&ng, &format!("big-{b}")))
        .filter(|e| e["tracked"] == false)
        .count() as u64;
    assert_eq!(listed, untracked);
    let metrics = ng.api("GET", "/configuration/metrics", None).body;
    assert!(
        metrics.contains(&format!(
            "nginx_ingress_controller_endpoint_state_endpoints{{state=\"untracked\"}} {untracked}\n"
        )),
        "{metrics}"
    );

    // The big tenant shrinks: what is left is tracked again.
    let r = ng.post_backends(&json!([
        backend("big-0", &endpoints(0, 1000)),
        other_tenant(&stalled, &fast)
    ]));
    assert_eq!(r.status, 201, "{}", r.body);
    let t = table(&ng);
    assert_eq!(
        (t["tracked"].as_u64(), t["untracked"].as_u64()),
        (Some(1003), Some(0)),
        "{t}"
    );
    assert!(health_of(&ng, "big-0").iter().all(|e| e["tracked"] == true));
}

/// Endpoints nothing listens on, on loopback (a connection is refused at
/// once), distinct per backend.
fn refused(b: usize, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"address": format!("127.{}.{}.{}", 100 + b, i / 250, i % 250 + 1), "port": "1"}))
        .collect()
}

/// One request to `backend`, answer ignored (every attempt is refused; the
/// 502's `X-Upstream-Addr` lists every endpoint, too long for the client).
fn hit(ng: &Nginx, backend: &str) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", ng.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: x\r\nX-Backend: {backend}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(
        out.starts_with(b"HTTP/1.1 502"),
        "{}",
        String::from_utf8_lossy(&out[..out.len().min(200)])
    );
}

/// A worker that routes a backend whose endpoints had no state gets their
/// state once the zone has room, though the backend's blob is unchanged:
/// failures on those endpoints then count for passive health.
#[test]
fn a_worker_picks_up_state_that_arrives_for_an_unchanged_backend() {
    let ng = Nginx::builder().zone("2m").start();
    let with_health = |b: usize| {
        let mut v = backend(&format!("big-{b}"), &refused(b, 1000));
        v["maxFails"] = json!(1);
        v["failTimeout"] = json!(60);
        v
    };
    let mut n = 0;
    let mut all = Vec::new();
    while table(&ng)["untracked"].as_u64().unwrap() == 0 {
        all.push(with_health(n));
        n += 1;
        let r = ng.post_backends(&Value::Array(all.clone()));
        assert_eq!(r.status, 201, "{}", r.body);
        assert!(n < 40, "a 2m zone never ran out of room for endpoint state");
    }
    // The last backend got its fair share, below its 1,000 endpoints: the
    // rest of its endpoints have no state.
    let last = n - 1;
    let name = format!("big-{last}");
    let stateless: Vec<String> = health_of(&ng, &name)
        .iter()
        .filter(|e| e["tracked"] == false)
        .map(|e| e["endpoint"].as_str().unwrap().to_string())
        .collect();
    assert!(!stateless.is_empty(), "{}", table(&ng));
    // The worker routes it as it is now.
    hit(&ng, &name);

    // The others leave; its blob is kept as it is, and all of its
    // endpoints get state.
    let r = ng.post_backends(&json!([with_health(last)]));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(table(&ng)["untracked"].as_u64(), Some(0), "{}", table(&ng));
    hit(&ng, &name);
    let health = health_of(&ng, &name);
    let failed: Vec<&Value> = health
        .iter()
        .filter(|e| stateless.contains(&e["endpoint"].as_str().unwrap().to_string()))
        .filter(|e| e["fails"].as_u64().unwrap() >= 1)
        .collect();
    assert_eq!(
        failed.len(),
        stateless.len(),
        "the worker records failures on the endpoints that were stateless"
    );
}

/// An endpoint listed by two backends has one slot, kept while either lists
/// it and freed at once when neither does.
#[test]
fn an_endpoint_two_backends_list_keeps_its_state_until_both_drop_it() {
    let ng = Nginx::builder().start();
    let (x, y, z) = (dead_endpoint(), dead_endpoint(), dead_endpoint());
    let tracked = |ng: &Nginx| table(ng)["tracked"].as_u64().unwrap();
    let mut a = backend("a", &[x.clone(), y.clone()]);
    a["maxFails"] = json!(1);
    a["failTimeout"] = json!(60);
    assert_eq!(
        ng.post_backends(&json!([a, backend("b", &[x.clone(), z.clone()])]))
            .status,
        201
    );
    assert_eq!(tracked(&ng), 3);
    // A failure on x (through a) is shared state.
    assert_eq!(ng.get("a").status, 502);
    let fails_of_x = |ng: &Nginx, backend: &str| {
        let port = x["port"].as_str().unwrap().to_string();
        health_of(ng, backend)
            .into_iter()
            .find(|e| e["endpoint"].as_str().unwrap().ends_with(&format!(":{port}")))
            .map(|e| e["fails"].as_u64().unwrap())
    };
    assert_eq!(fails_of_x(&ng, "b"), Some(1));

    // a drops x: b still lists it, so its state stays.
    let r = put(&ng, &backend("a", std::slice::from_ref(&y)));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(tracked(&ng), 3);
    assert_eq!(fails_of_x(&ng, "b"), Some(1), "x kept its state");
    // b drops it too: its slot is freed.
    let r = put(&ng, &backend("b", std::slice::from_ref(&z)));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(tracked(&ng), 2);
    assert_eq!(ng.api("DELETE", "/configuration/backends/b", None).status, 204);
    assert_eq!(tracked(&ng), 1);
    // x comes back in a fresh slot, with no failure.
    let r = put(&ng, &backend("b", std::slice::from_ref(&x)));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(fails_of_x(&ng, "b"), Some(0));
}
