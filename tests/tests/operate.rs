//! Operating the controller: a graceful stop under load (as a rolling
//! update does it), and the inspection subcommands run beside a live
//! controller (as `kubectl exec` would).

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::controller::{ingress, request, service, wait_until, Controller, INGRESS_CLASS};
use tests::openssl;
use tests::upstream::Upstream;

/// SIGTERM with requests in flight: /readyz fails at once, nginx keeps
/// serving new connections through the grace period, every request that
/// was already in flight completes with 200, and the controller exits
/// cleanly once nginx is done.
#[test]
fn sigterm_drains_then_stops_without_failing_requests_in_flight() {
    let slow = Upstream::start_slow(Duration::from_millis(2500));
    let fast = Upstream::start();
    let files = [
        ("class.yaml", INGRESS_CLASS.to_string()),
        ("slow.yaml", service("slow", &[slow.port])),
        ("fast.yaml", service("fast", &[fast.port])),
        ("slow-ing.yaml", ingress("slow", "slow.test", "/", "slow", &[])),
        ("fast-ing.yaml", ingress("fast", "fast.test", "/", "fast", &[])),
    ];
    let grace = Duration::from_secs(2);
    let mut c = Controller::start(&files, &["--shutdown-grace-period", "2s"]);
    assert_eq!(c.get("fast.test", "/").0, 200);
    let port = c.http_port;

    // 20 long requests on their own connections, in flight at SIGTERM.
    let ok = Arc::new(AtomicUsize::new(0));
    let in_flight: Vec<_> = (0..20)
        .map(|_| {
            let ok = ok.clone();
            std::thread::spawn(move || {
                let answer = request(port, "slow.test", "/");
                if answer.as_ref().is_some_and(|(s, _)| *s == 200) {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
                answer
            })
        })
        .collect();
    // Every request is in flight once nginx holds it, whether or not the
    // upstream has read it yet (the test upstream reads slowly under load).
    assert!(
        wait_until(Duration::from_secs(5), || slow.hits() >= 1),
        "no request reached the upstream\n{}",
        std::fs::read_to_string(c.dir.path().join("nginx/logs/error.log")).unwrap_or_default()
    );
    // Every request is in flight once nginx has read it: a connection nginx
    // accepted but has not read a request from yet is idle, and a graceful
    // stop closes idle connections (as it must). On a loaded machine the
    // 20 client threads take a while to send, so wait until nginx's
    // stub_status counts them all as `writing` (plus the query itself).
    let writing = || {
        let (_, m) = c.api_get("/configuration/metrics").unwrap_or_default();
        m.lines()
            .find_map(|l| l.strip_prefix("nginx_ingress_controller_nginx_process_connections{state=\"writing\"} "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(
        wait_until(Duration::from_secs(10), || writing() > 20),
        "nginx holds {} requests, not 20",
        writing().saturating_sub(1)
    );
    let term = Instant::now();
    c.signal(libc::SIGTERM);

    // Not ready at once, while nginx keeps serving new connections.
    assert!(
        wait_until(Duration::from_millis(500), || c.readyz() == 503),
        "readyz still {}",
        c.readyz()
    );
    let mut served_in_grace = 0;
    while term.elapsed() < grace - Duration::from_millis(300) {
        assert_eq!(
            c.get("fast.test", "/").0,
            200,
            "a new connection during the grace period"
        );
        served_in_grace += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(served_in_grace >= 3, "{served_in_grace} requests in the grace period");

    let answers: Vec<_> = in_flight.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(
        ok.load(Ordering::Relaxed),
        20,
        "requests in flight at SIGTERM failed: {:?}\n{}\nnginx error log:\n{}",
        answers
            .iter()
            .filter(|a| a.as_ref().is_none_or(|(s, _)| *s != 200))
            .collect::<Vec<_>>(),
        c.log(),
        std::fs::read_to_string(c.dir.path().join("nginx/logs/error.log")).unwrap_or_default()
    );
    assert!(
        wait_until(Duration::from_secs(10), || c.exited().is_some()),
        "the controller did not exit\n{}",
        c.log()
    );
    let took = term.elapsed();
    eprintln!("SIGTERM to exit: {took:?} (grace {grace:?}, longest request 2.5 s)");
    assert!(took >= grace, "nginx stopped before the grace period ended");
    assert!(request(port, "fast.test", "/").is_none(), "nginx is gone");
    let log = c.log();
    assert!(
        log.contains("stopping nginx gracefully") && log.contains("nginx stopped"),
        "{log}"
    );
}

fn tls_secret(name: &str, host: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    openssl(
        dir.path(),
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "k.pem",
            "-out",
            "c.pem",
            "-days",
            "30",
            "-subj",
            &format!("/CN={host}"),
            "-addext",
            &format!("subjectAltName=DNS:{host}"),
        ],
    );
    let indent = |f: &str| {
        std::fs::read_to_string(dir.path().join(f))
            .unwrap()
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{namespace: demo, name: {name}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent("c.pem"),
        indent("k.pem")
    )
}

/// `backends`, `certs`, `conf` and `status`, as tables and as JSON, against
/// a running controller; keys never appear.
#[test]
fn the_inspection_commands_show_the_running_state() {
    let a = Upstream::start();
    let b = Upstream::start();
    let tls_ingress = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {namespace: demo, name: secure}\nspec:\n  ingressClassName: nginx\n  tls: [{hosts: [secure.test], secretName: secure-tls}]\n  rules:\n    - host: secure.test\n      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: b, port: {number: 80}}}}]}\n";
    let files = [
        ("class.yaml", INGRESS_CLASS.to_string()),
        ("a.yaml", service("a", &[a.port])),
        ("b.yaml", service("b", &[b.port])),
        (
            "a-ing.yaml",
            ingress("a", "a.test", "/", "a", &[("load-balance", "ewma")]),
        ),
        ("secret.yaml", tls_secret("secure-tls", "secure.test")),
        ("secure.yaml", tls_ingress.to_string()),
    ];
    let c = Controller::start(&files, &[]);

    let (ok, out, err) = c.inspect(&["backends"]);
    assert!(ok, "{err}");
    let header = out.lines().next().unwrap_or_default();
    assert!(header.starts_with("NAME") && header.contains("ENDPOINTS"), "{out}");
    assert!(out.contains("demo-a-80") && out.contains("ewma"), "{out}");
    assert!(out.contains(&format!("127.0.0.1:{}", b.port)), "{out}");

    let (ok, out, err) = c.inspect(&["backends", "--name", "demo-a-80", "--output", "json"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["name"], "demo-a-80");
    assert_eq!(v[0]["endpoints"][0]["port"], a.port.to_string());

    let (ok, out, err) = c.inspect(&["certs"]);
    assert!(ok, "{err}");
    assert!(out.contains("secure.test") && out.contains("NOT AFTER"), "{out}");
    let (ok, out, _) = c.inspect(&["certs", "--output", "json"]);
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["sans"][0], "secure.test");
    assert_eq!(v[0]["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(v[0]["hosts"][0], "secure.test");
    assert!(!out.contains("PRIVATE KEY"), "{out}");

    let (ok, out, err) = c.inspect(&["conf", "--host", "a.test"]);
    assert!(ok, "{err}");
    assert!(out.contains("a.test") && !out.contains("secure.test"), "{out}");
    let (ok, _, err) = c.inspect(&["conf", "--host", "nowhere.test"]);
    assert!(!ok && err.contains("no server block"), "{err}");

    let (ok, out, err) = c.inspect(&["status"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("ready") && out.contains("true") && out.contains("workers"),
        "{out}"
    );
    let (ok, out, _) = c.inspect(&["status", "--output", "json"]);
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ready"], true);
    assert_eq!(v["reloads"], 1.0);
    assert!(v["module"]["workers"].as_array().is_some_and(|w| !w.is_empty()), "{v}");

    // Without the token (a wrong conf dir), the API refuses: a clear error.
    let out = Command::new(tests::controller::controller_binary())
        .args([
            "backends",
            "--conf-dir",
            "/nonexistent",
            "--api-port",
            &c.api_port.to_string(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("token"), "{out:?}");
}
