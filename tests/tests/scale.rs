//! The controller's work per change, at a size that fits the test run
//! (`bench-controller scale N` measures 1,000 to 50,000 Ingresses): an
//! EndpointSlice change renders nothing, reloads nothing, builds only the
//! backends of its Service and pushes only that backend.

use std::time::Duration;

use tests::bench::upstream_pair;
use tests::controller::{ingress, request, service, wait_until, Controller, INGRESS_CLASS};

const INGRESSES: usize = 300;

struct Counts {
    renders: f64,
    reloads: f64,
    full_builds: f64,
    endpoint_builds: f64,
    puts: f64,
    posts: f64,
}

fn counts(c: &Controller) -> Counts {
    let m = |name: &str| {
        let v = c.metric(name);
        if v.is_nan() {
            0.0
        } else {
            v
        }
    };
    Counts {
        renders: m("nginx_ingress_controller_renders_total"),
        reloads: c.reloads(),
        full_builds: m("nginx_ingress_controller_model_builds_total{kind=\"full\"}"),
        endpoint_builds: m("nginx_ingress_controller_model_builds_total{kind=\"endpoints\"}"),
        puts: m("nginx_ingress_controller_dynamic_pushes_total{kind=\"put\",result=\"ok\"}"),
        posts: m("nginx_ingress_controller_dynamic_pushes_total{kind=\"post\",result=\"ok\"}"),
    }
}

#[test]
fn an_endpoint_change_renders_nothing_and_pushes_only_its_backend() {
    let (_upstreams, a, b) = upstream_pair();
    let mut all = String::from(INGRESS_CLASS);
    for i in 0..INGRESSES {
        if i >= 2 {
            all.push_str(&format!("---\n{}", service(&format!("svc{i}"), &[a])));
        }
        let (name, host, svc) = (format!("ing{i}"), format!("h{i}.example.com"), format!("svc{i}"));
        all.push_str(&format!("---\n{}", ingress(&name, &host, "/", &svc, &[])));
    }
    // Two applications keep their Service and EndpointSlice in files of
    // their own.
    let files = [
        ("all.yaml", all),
        ("app-0.yaml", service("svc0", &[a])),
        ("app-1.yaml", service("svc1", &[a])),
    ];
    let c = Controller::start(&files, &[]);
    for host in ["h0.example.com", "h1.example.com", "h299.example.com"] {
        assert_eq!(
            request(c.http_port, host, "/").map(|r| r.1).as_deref(),
            Some("a\n"),
            "{host}"
        );
    }
    assert!(
        c.metric("nginx_ingress_controller_renders_total") >= 1.0,
        "renders are counted"
    );
    // The first push and reload are behind us once the counts stay put.
    std::thread::sleep(Duration::from_millis(500));
    let before = counts(&c);

    c.write("app-0.yaml", &service("svc0", &[b]));
    let routed = wait_until(Duration::from_secs(10), || {
        request(c.http_port, "h0.example.com", "/").is_some_and(|r| r.1 == "b\n")
    });
    assert!(routed, "the endpoint change was not routed:\n{}", c.log());
    assert!(
        wait_until(Duration::from_secs(5), || counts(&c).puts > before.puts),
        "no PUT counted"
    );
    std::thread::sleep(Duration::from_millis(300));
    let after = counts(&c);
    assert_eq!(after.renders, before.renders, "an endpoint change rendered nginx.conf");
    assert_eq!(after.reloads, before.reloads, "an endpoint change reloaded nginx");
    assert_eq!(
        after.full_builds, before.full_builds,
        "an endpoint change built the model in full"
    );
    assert!(
        after.endpoint_builds > before.endpoint_builds,
        "no endpoint build counted"
    );
    assert_eq!(after.puts, before.puts + 1.0, "only the changed backend is put");
    assert_eq!(after.posts, before.posts, "no full push");
    // The other application is untouched.
    assert_eq!(
        request(c.http_port, "h1.example.com", "/").map(|r| r.1).as_deref(),
        Some("a\n")
    );

    // A new host is structural: one render, one reload, one full build.
    c.write("new.yaml", &ingress("new", "new.example.com", "/", "svc1", &[]));
    let served = wait_until(Duration::from_secs(30), || {
        request(c.http_port, "new.example.com", "/").is_some_and(|r| r.0 == 200)
    });
    assert!(served, "the new host was not served:\n{}", c.log());
    // The counts follow the reload's end, which the first 200 may precede.
    let counted = wait_until(Duration::from_secs(10), || {
        let last = counts(&c);
        last.renders > after.renders && last.reloads > after.reloads && last.full_builds > after.full_builds
    });
    assert!(
        counted,
        "a new host was not counted as a render, a reload and a full build"
    );
}
