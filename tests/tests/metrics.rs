//! Request metrics from the module, end to end: a known request mix over
//! two workers is counted exactly (counts, histogram buckets, sizes,
//! connect errors, the canary label), the counts survive reloads, a
//! deleted Ingress's series disappear at once and its memory is freed at a
//! later reload, a reload that fails hides nothing, and the controller
//! re-exports everything under ingress-nginx's names with its constant
//! labels.

use std::time::Duration;

use tests::controller::{ingress, service, wait_until, Controller, INGRESS_CLASS};
use tests::nginx::Nginx;
use tests::{agent, backend, dead_port, Upstream};

const TWO_WORKERS: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: ingress-nginx, name: ingress-nginx-controller}\ndata: {worker-processes: \"2\"}\n";

/// The value of the sample `name{…}` whose labels include every one of
/// `labels` (`key="value"`), summed if several match; 0 if none does.
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (set, value) = match rest.strip_prefix('{') {
                Some(r) => r.rsplit_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            let parts: Vec<&str> = tests::controller::split_label_set(set);
            labels
                .iter()
                .all(|want| parts.contains(want))
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

fn module_metrics(c: &Controller) -> String {
    let (status, body) = c.api_get("/configuration/metrics").expect("the API answers");
    assert_eq!(status, 200, "{body}");
    body
}

fn controller_metrics(c: &Controller) -> String {
    tests::controller::get_url(&format!("http://127.0.0.1:{}/metrics", c.metrics_port))
        .expect("/metrics answers")
        .1
}

fn send(port: u16, method: &str, host: &str, path: &str, body: &str, headers: &[(&str, &str)]) -> u16 {
    let url = format!("http://127.0.0.1:{port}{path}");
    let mut req = ureq::http::Request::builder()
        .method(method)
        .uri(&url)
        .header("Host", host);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    match agent().run(req.body(body.to_string()).unwrap()) {
        Ok(r) => r.status().as_u16(),
        Err(ureq::Error::StatusCode(s)) => s,
        Err(e) => panic!("{method} {host}{path}: {e}"),
    }
}

#[test]
fn a_request_mix_is_counted_across_workers_and_reloads() {
    let web = Upstream::start();
    let canary = Upstream::start();
    let slow = Upstream::start_slow(Duration::from_millis(300));
    let dead = dead_port();
    let errors = Upstream::start();
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("config.yaml", TWO_WORKERS.into()),
            ("svc-web.yaml", service("web", &[web.port])),
            ("svc-canary.yaml", service("webcanary", &[canary.port])),
            ("svc-slow.yaml", service("slow", &[slow.port])),
            ("svc-dead.yaml", service("dead", &[dead])),
            ("ing-web.yaml", ingress("web", "web.test", "/", "web", &[])),
            (
                "ing-canary.yaml",
                ingress(
                    "web-canary",
                    "web.test",
                    "/",
                    "webcanary",
                    &[("canary", "true"), ("canary-by-header", "X-Canary")],
                ),
            ),
            ("ing-slow.yaml", ingress("slow", "slow.test", "/slow", "slow", &[])),
            ("ing-dead.yaml", ingress("dead", "dead.test", "/", "dead", &[])),
            // A 502 that custom-http-errors sends to another location.
            ("svc-errors.yaml", service("errors", &[errors.port])),
            (
                "ing-oops.yaml",
                ingress(
                    "oops",
                    "oops.test",
                    "/",
                    "dead",
                    &[("custom-http-errors", "502"), ("default-backend", "errors")],
                ),
            ),
        ],
        &[],
    );
    let conf = c.conf();
    assert!(conf.contains("dynamic_balancer_metrics_zone 16m;"), "{conf}");
    assert!(
        conf.contains("dynamic_balancer_metrics namespace=demo ingress=slow service=slow host=slow.test path=/slow;"),
        "{conf}"
    );
    assert_eq!(c.worker_pids().len(), 2);

    // The mix. Every request opens a new connection, so both workers serve.
    let body = "x".repeat(50);
    for _ in 0..20 {
        assert_eq!(send(c.http_port, "GET", "web.test", "/", "", &[]), 200);
    }
    for _ in 0..5 {
        assert_eq!(send(c.http_port, "POST", "web.test", "/", &body, &[]), 200);
    }
    for _ in 0..6 {
        assert_eq!(
            send(c.http_port, "GET", "web.test", "/", "", &[("X-Canary", "always")]),
            200
        );
    }
    for _ in 0..4 {
        assert_eq!(send(c.http_port, "GET", "slow.test", "/slow/x", "", &[]), 200);
    }
    for _ in 0..3 {
        assert_eq!(send(c.http_port, "GET", "dead.test", "/", "", &[]), 502);
    }
    for _ in 0..2 {
        // The error backend's answer (200) replaces the 502.
        assert_eq!(send(c.http_port, "GET", "oops.test", "/", "", &[]), 200);
    }
    assert_eq!(canary.hits(), 6);
    assert_eq!(errors.hits(), 2);

    let m = module_metrics(&c);
    let web_get = [
        r#"ingress="web""#,
        r#"namespace="demo""#,
        r#"service="web""#,
        r#"host="web.test""#,
        r#"path="/""#,
        r#"canary="""#,
        r#"method="GET""#,
        r#"status="200""#,
    ];
    let req = "nginx_ingress_controller_requests";
    assert_eq!(sample(&m, req, &web_get), 20.0, "{m}");
    assert_eq!(sample(&m, req, &[r#"ingress="web""#, r#"method="POST""#]), 5.0);
    let canary_get = [
        r#"ingress="web""#,
        r#"canary="demo-webcanary-80""#,
        r#"method="GET""#,
        r#"status="200""#,
    ];
    assert_eq!(sample(&m, req, &canary_get), 6.0, "{m}");
    assert_eq!(
        sample(&m, req, &[r#"ingress="slow""#, r#"path="/slow""#, r#"status="200""#]),
        4.0
    );
    // The exact code, as ingress-nginx's label has it (alerts on
    // `status="502"` keep working).
    assert_eq!(sample(&m, req, &[r#"ingress="dead""#, r#"status="502""#]), 3.0);
    // --report-status-classes asks the module for classes.
    let (status, classes) = c.api_get("/configuration/metrics?status=class").unwrap();
    assert_eq!(status, 200);
    assert_eq!(sample(&classes, req, &[r#"ingress="dead""#, r#"status="5xx""#]), 3.0);
    assert_eq!(sample(&classes, req, &web_get[..7]), 20.0, "{classes}");
    assert_eq!(c.api_get("/configuration/metrics?status=bogus").unwrap().0, 400);
    assert_eq!(
        sample(
            &m,
            "nginx_ingress_controller_upstream_connect_errors",
            &[r#"ingress="dead""#]
        ),
        3.0
    );
    assert_eq!(
        sample(
            &m,
            "nginx_ingress_controller_upstream_connect_errors",
            &[r#"ingress="web""#]
        ),
        0.0
    );
    // Counted under the location the request came for, with its final status.
    let oops = [r#"ingress="oops""#, r#"service="dead""#];
    assert_eq!(sample(&m, req, &[oops[0], oops[1], r#"status="200""#]), 2.0, "{m}");
    assert_eq!(
        sample(&m, "nginx_ingress_controller_upstream_connect_errors", &oops),
        2.0
    );

    // Histograms: the slow backend's 300 ms lands between 0.25 and 0.5 (2.5
    // under a loaded machine at worst), and every histogram counts every request.
    let slow_l = [r#"ingress="slow""#];
    let bucket = |name: &str, le: &str| {
        let le = format!("le=\"{le}\"");
        sample(
            &m,
            &format!("nginx_ingress_controller_{name}_bucket"),
            &[slow_l[0], le.as_str()],
        )
    };
    assert_eq!(bucket("request_duration_seconds", "0.25"), 0.0, "{m}");
    assert_eq!(bucket("request_duration_seconds", "2.5"), 4.0);
    assert_eq!(bucket("request_duration_seconds", "+Inf"), 4.0);
    assert_eq!(bucket("response_duration_seconds", "0.25"), 0.0);
    assert_eq!(bucket("response_duration_seconds", "+Inf"), 4.0);
    // The slow backend waits before its header: the header time holds it,
    // connecting (on loopback) does not.
    assert_eq!(bucket("header_duration_seconds", "0.25"), 0.0, "{m}");
    assert_eq!(bucket("header_duration_seconds", "+Inf"), 4.0);
    assert_eq!(bucket("connect_duration_seconds", "0.25"), 4.0);
    assert_eq!(bucket("connect_duration_seconds", "+Inf"), 4.0);
    assert!(sample(&m, "nginx_ingress_controller_request_duration_seconds_sum", &slow_l) >= 1.2);
    assert!(sample(&m, "nginx_ingress_controller_response_duration_seconds_sum", &slow_l) >= 1.2);
    for h in [
        "request_duration_seconds",
        "connect_duration_seconds",
        "header_duration_seconds",
        "request_size",
        "response_size",
        "bytes_sent",
    ] {
        assert_eq!(
            sample(&m, &format!("nginx_ingress_controller_{h}_count"), &web_get),
            20.0,
            "{h}"
        );
    }
    // A POST of 50 bytes is longer than 50 bytes with its request line and
    // headers; responses carry the upstream's name and headers.
    let post = [r#"ingress="web""#, r#"method="POST""#];
    assert!(sample(&m, "nginx_ingress_controller_request_size_sum", &post) > 5.0 * 50.0);
    assert_eq!(
        sample(
            &m,
            "nginx_ingress_controller_request_size_bucket",
            &[post[0], post[1], r#"le="+Inf""#]
        ),
        5.0
    );
    assert!(sample(&m, "nginx_ingress_controller_bytes_sent_sum", &web_get) > 20.0 * 100.0);
    assert!(
        sample(
            &m,
            "nginx_ingress_controller_nginx_process_connections_total",
            &[r#"state="accepted""#]
        ) >= 38.0
    );
    assert!(
        sample(
            &m,
            "nginx_ingress_controller_nginx_process_connections",
            &[r#"state="active""#]
        ) >= 1.0
    );

    // The controller re-exports them with ingress-nginx's constant labels.
    let cm = controller_metrics(&c);
    assert!(
        cm.contains("# TYPE nginx_ingress_controller_requests counter\n"),
        "{cm}"
    );
    assert_eq!(
        sample(
            &cm,
            req,
            &[&web_get[..], &[r#"controller_class="k8s.io/ingress-nginx""#]].concat()
        ),
        20.0,
        "{cm}"
    );
    assert!(!cm.contains("# EOF"), "Prometheus text 0.0.4, not OpenMetrics");
    // The controller's own families carry the constant labels too (the
    // dashboards' drop-downs are queries of config_hash's labels), and
    // ingress-nginx's counters are counters.
    let own = [
        r#"controller_class="k8s.io/ingress-nginx""#,
        r#"controller_namespace="default""#,
    ];
    for name in [
        "nginx_ingress_controller_config_hash",
        "nginx_ingress_controller_config_last_reload_successful",
        "nginx_ingress_controller_success",
        "nginx_ingress_controller_build_info",
    ] {
        assert!(sample(&cm, name, &own) >= 1.0, "{name} in {cm}");
    }
    assert!(cm.contains("# TYPE nginx_ingress_controller_success counter\n"));
    assert!(cm.contains("# TYPE nginx_ingress_controller_errors counter\n"));
    // nginx's processes, read from /proc: the master and its two workers.
    assert_eq!(
        sample(&cm, "nginx_ingress_controller_nginx_process_num_procs", &own),
        3.0,
        "{cm}"
    );
    assert!(
        sample(
            &cm,
            "nginx_ingress_controller_nginx_process_resident_memory_bytes",
            &own
        ) > 1e6
    );
    // A few ms of CPU may still be less than one clock tick: present, not
    // necessarily above 0 yet.
    assert!(cm.contains("\nnginx_ingress_controller_nginx_process_cpu_seconds_total{"));
    assert!(
        sample(
            &cm,
            "nginx_ingress_controller_nginx_process_oldest_start_time_seconds",
            &own
        ) > 1.6e9
    );
    // Every Ingress has its orphan series; none here lacks its Service.
    assert_eq!(
        sample(
            &cm,
            "nginx_ingress_controller_orphan_ingress",
            &[r#"ingress="web""#, r#"type="no-service""#]
        ),
        0.0,
        "{cm}"
    );

    // A reload (a new Ingress) keeps every count; new requests add to them.
    let reloads = c.reloads();
    let before = c.worker_pids();
    c.write("ing-extra.yaml", &ingress("extra", "extra.test", "/", "web", &[]));
    assert!(wait_until(Duration::from_secs(30), || c.reloads() > reloads
        && c.worker_pids().is_disjoint(&before)));
    let m = module_metrics(&c);
    assert_eq!(sample(&m, req, &web_get), 20.0, "{m}");
    assert_eq!(sample(&m, req, &canary_get), 6.0);
    for _ in 0..10 {
        assert_eq!(send(c.http_port, "GET", "web.test", "/", "", &[]), 200);
    }
    let m = module_metrics(&c);
    assert_eq!(sample(&m, req, &web_get), 30.0, "{m}");
    assert_eq!(
        sample(&m, "nginx_ingress_controller_request_duration_seconds_count", &web_get),
        30.0
    );
    let series = sample(&m, "nginx_ingress_controller_metrics_zone_series", &[]);

    // A deleted Ingress: its series leave the API (and /metrics) with the
    // reload that removes its location...
    let reloads = c.reloads();
    c.remove("ing-dead.yaml");
    assert!(wait_until(Duration::from_secs(30), || c.reloads() > reloads));
    assert!(wait_until(Duration::from_secs(10), || !module_metrics(&c)
        .contains(r#"ingress="dead""#)));
    assert!(!controller_metrics(&c).contains(r#"ingress="dead""#));
    assert_eq!(sample(&module_metrics(&c), req, &web_get), 30.0);
    // ...and their memory is freed at a later load, once no worker of a
    // configuration that had them is alive.
    let old = c.worker_pids();
    let reloads = c.reloads();
    c.write("ing-extra2.yaml", &ingress("extra2", "extra2.test", "/", "web", &[]));
    assert!(wait_until(Duration::from_secs(30), || c.reloads() > reloads
        && c.worker_pids().is_disjoint(&old)));
    let freed = wait_until(Duration::from_secs(30), || {
        sample(&module_metrics(&c), "nginx_ingress_controller_metrics_zone_series", &[]) < series
    });
    if !freed {
        // Old workers may still drain: one more load frees them.
        let reloads = c.reloads();
        c.write("ing-extra3.yaml", &ingress("extra3", "extra3.test", "/", "web", &[]));
        assert!(wait_until(Duration::from_secs(30), || c.reloads() > reloads));
    }
    assert!(
        wait_until(Duration::from_secs(30), || {
            sample(&module_metrics(&c), "nginx_ingress_controller_metrics_zone_series", &[]) < series
        }),
        "the deleted Ingress's series were never freed:\n{}",
        module_metrics(&c)
    );
    let log = std::fs::read_to_string(c.dir.path().join("nginx/logs/error.log")).unwrap_or_default();
    assert!(log.contains("series of locations no longer configured"), "{log}");
    assert_eq!(sample(&module_metrics(&c), req, &web_get), 30.0);
    c.stop();
}

#[test]
fn metrics_can_be_turned_off() {
    let web = Upstream::start();
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc.yaml", service("web", &[web.port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
        ],
        &["--enable-metrics=false"],
    );
    assert!(!c.conf().contains("dynamic_balancer_metrics"));
    assert_eq!(c.get("web.test", "/").0, 200);
    assert!(!controller_metrics(&c).contains("nginx_ingress_controller_requests"));
    // The module's route still answers, with nginx's connection counters.
    let m = module_metrics(&c);
    assert!(!m.contains("nginx_ingress_controller_requests{"), "{m}");
    assert!(m.contains("nginx_ingress_controller_nginx_process_connections{state=\"active\"}"));
    c.stop();
}

#[test]
fn bad_metrics_labels_fail_the_configuration_with_the_reason() {
    for (labels, reason) in [
        ("uri=/x", "unknown label \"uri\""),
        ("host=a host=b", "label \"host\" is given twice"),
        ("ingress", "\"ingress\" is not key=value"),
        (
            &format!("path=/{}", "a".repeat(1100)) as &str,
            "label \"path\" is longer than 1024 bytes",
        ),
    ] {
        let out = Nginx::builder()
            .location_extra(&format!("dynamic_balancer_metrics {labels};"))
            .test_config();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{labels}: accepted");
        assert!(stderr.contains(reason), "{labels}: {stderr}");
    }
    let out = Nginx::builder()
        .http_extra("dynamic_balancer_metrics_zone 4k;")
        .test_config();
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 256k is required"));
    // Labels with quotes, braces and dollars are data.
    let out = Nginx::builder()
        .location_extra(r#"dynamic_balancer_metrics "path=/a\"b{c}$d" namespace=x;"#)
        .test_config();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A reload that fails after the zones were set up (its port is taken)
/// must hide none of the running configuration's series, even though its
/// zone init did not declare them; the running workers keep counting.
#[test]
fn a_failed_reload_hides_no_series() {
    let up = Upstream::start();
    let ng = Nginx::builder()
        .workers(1)
        .http_extra("dynamic_balancer_metrics_zone 1m;")
        .location_extra("dynamic_balancer_metrics namespace=demo ingress=kept service=web path=/;")
        .start();
    assert_eq!(
        ng.post_backends(&serde_json::json!([backend("web", &[up.endpoint()])]))
            .status,
        201
    );
    let kept = ["namespace=\"demo\"", "ingress=\"kept\""];
    let requests = |ng: &Nginx| {
        let r = ng.api("GET", "/configuration/metrics", None);
        assert_eq!(r.status, 200, "{}", r.body);
        sample(&r.body, "nginx_ingress_controller_requests", &kept)
    };
    for _ in 0..3 {
        assert_eq!(ng.get("web").status, 200);
    }
    assert_eq!(requests(&ng), 3.0);

    // A configuration that declares other labels and cannot bind its port.
    let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = blocker.local_addr().unwrap().port();
    let conf = ng.prefix().join("nginx.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    let failing = text.replacen("ingress=kept", "ingress=other", 1).replacen(
        "http {",
        &format!("http {{\n    server {{ listen 127.0.0.1:{taken}; return 204; }}"),
        1,
    );
    std::fs::write(&conf, failing).unwrap();
    // SAFETY: signalling the nginx master this test started.
    unsafe { libc::kill(ng.pid() as libc::pid_t, libc::SIGHUP) };
    assert!(
        wait_until(Duration::from_secs(20), || ng
            .error_log()
            .contains("still could not bind()")),
        "the reload did not fail: {}",
        ng.error_log()
    );
    assert_eq!(requests(&ng), 3.0, "the failed configuration hid the series");
    assert_eq!(ng.get("web").status, 200);
    assert_eq!(requests(&ng), 4.0);
    drop(blocker);
}
