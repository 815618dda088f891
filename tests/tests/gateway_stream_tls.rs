//! TLS terminated in `stream{}` with a Gateway listener's certificates
//! (`dynamic_balancer_ssl_routes`, a TLS listener in `Terminate` mode):
//! each handshake gets the certificate the route table names for its SNI
//! (nginx's static one when it names none), the backend is chosen by that
//! SNI, and the decrypted bytes reach it in the clear, or over TLS when a
//! BackendTLSPolicy covers it (`dynamic_balancer_backend_tls`: the
//! policy's SNI, CA and names, the Gateway's client certificate).
//! Certificates, routes and policies change through the API with no
//! reload.

use serde_json::{json, Value};
use tests::echo::{answered_by, TcpEcho};
use tests::tls::{ask_over_tls, tls_echo_reporting, TestCa, TestCert};
use tests::{backend, free_port, Nginx};

const LISTENER: &str = "test/gw/8443";

fn start(port: u16, fallback: &TestCert) -> (Nginx, tempfile::TempDir) {
    start_with(port, fallback, "")
}

/// [`start`] with `twin` (a server block) beside the listener's server;
/// `{d}` in it is the directory of the fallback certificate.
fn start_with(port: u16, fallback: &TestCert, twin: &str) -> (Nginx, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let twin = twin.replace("{d}", &dir.path().display().to_string());
    std::fs::write(dir.path().join("fallback.crt"), &fallback.cert_pem).unwrap();
    std::fs::write(dir.path().join("fallback.key"), &fallback.key_pem).unwrap();
    let stream = format!(
        r#"stream {{
    upstream gateway_stream_balancer {{ dynamic_balancer; }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {d}/fallback.crt;
        ssl_certificate_key {d}/fallback.key;
        dynamic_balancer_ssl_routes {LISTENER};
        dynamic_balancer_routes {LISTENER};
        proxy_pass gateway_stream_balancer;
    }}
    {twin}
}}"#,
        d = dir.path().display()
    );
    let ng = Nginx::builder().workers(2).main_extra(&stream).start();
    (ng, dir)
}

/// A listener whose hostnames route to a backend each, with a certificate
/// each (`(hostname, backend, certificate id)`).
fn table(hosts: &[(&str, &str, &str)]) -> Value {
    json!({"listeners": [{
        "name": LISTENER, "port": 8443,
        "hosts": hosts.iter().enumerate().map(|(i, (h, _, _))| json!({"hostname": h, "matches": [
            {"path": {"type": "PathPrefix", "value": "/"}, "rule": i}]})).collect::<Vec<_>>(),
        "rules": hosts.iter().map(|(h, b, _)| json!({"route": format!("test/{h}"), "backends": [{"backend": b, "weight": 1}]})).collect::<Vec<_>>(),
        "certificates": hosts.iter().map(|(h, _, c)| json!({"hostname": h, "certificate": c})).collect::<Vec<_>>(),
    }]})
}

/// Over TLS with SNI `sni`: the SHA-256 of the certificate shown, and the
/// echo's answer to one line (`None` when the connection closes first).
fn ask(port: u16, sni: &str) -> (String, Option<String>) {
    ask_over_tls(port, sni, "hello").expect("handshake")
}

fn worker_pids(ng: &Nginx) -> Vec<i64> {
    let mut pids: Vec<i64> = ng.status()["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["pid"].as_i64())
        .collect();
    pids.sort_unstable();
    pids
}

fn put(ng: &Nginx, path: &str, body: &str) {
    let r = ng.api("PUT", path, Some(body));
    assert!(
        r.status == 200 || r.status == 201,
        "PUT {path}: {} {}",
        r.status,
        r.body
    );
}

#[test]
fn tls_is_terminated_with_the_listeners_certificates_and_routed_by_sni() {
    let (echo_a, echo_b) = (TcpEcho::start(), TcpEcho::start());
    let fallback = TestCert::new("fallback");
    let (cert_a, cert_b) = (TestCert::new("a.tls.test"), TestCert::new("b.tls.test"));
    let port = free_port();
    let (ng, _dir) = start(port, &fallback);
    let r = ng.post_backends(&json!([
        backend("echo-a", &[echo_a.endpoint()]),
        backend("echo-b", &[echo_b.endpoint()]),
    ]));
    assert_eq!(r.status, 201, "{}", r.body);
    put(&ng, "/configuration/certificates/t_a", &cert_a.body());
    put(&ng, "/configuration/certificates/t_b", &cert_b.body());

    // No table yet: nginx's own certificate, and no backend takes it.
    assert_eq!(ask(port, "a.tls.test"), (fallback.sha256.clone(), None));

    let t = table(&[("a.tls.test", "echo-a", "t_a"), ("b.tls.test", "echo-b", "t_b")]);
    put(&ng, "/configuration/routes", &t.to_string());
    let pids = worker_pids(&ng);
    for _ in 0..4 {
        let (shown, answer) = ask(port, "a.tls.test");
        assert_eq!(shown, cert_a.sha256);
        // The echo read the line in the clear and names its port.
        assert_eq!(answer.as_deref().and_then(answered_by), Some(echo_a.port), "{answer:?}");
        let (shown, answer) = ask(port, "b.tls.test");
        assert_eq!(shown, cert_b.sha256);
        assert_eq!(answer.as_deref().and_then(answered_by), Some(echo_b.port), "{answer:?}");
    }
    // A fully qualified name (trailing dot) in any case is the same host,
    // for its certificate and for its route.
    let (shown, answer) = ask(port, "A.TLS.test.");
    assert_eq!(shown, cert_a.sha256);
    assert_eq!(answer.as_deref().and_then(answered_by), Some(echo_a.port), "{answer:?}");
    // A name no listener hostname covers: the static certificate, closed.
    assert_eq!(ask(port, "c.tls.test"), (fallback.sha256.clone(), None));

    // The routes and certificates change live: a.tls.test now goes to b's
    // echo with b's certificate.
    let t = table(&[("a.tls.test", "echo-b", "t_b"), ("b.tls.test", "echo-b", "t_b")]);
    put(&ng, "/configuration/routes", &t.to_string());
    for _ in 0..4 {
        let (shown, answer) = ask(port, "a.tls.test");
        assert_eq!(shown, cert_b.sha256);
        assert_eq!(answer.as_deref().and_then(answered_by), Some(echo_b.port), "{answer:?}");
    }
    assert_eq!(worker_pids(&ng), pids, "no worker was replaced");
}

#[test]
fn a_server_without_tls_cannot_take_a_listeners_certificates() {
    let port = free_port();
    let stream = format!(
        r#"stream {{
    upstream gateway_stream_balancer {{ dynamic_balancer; }}
    server {{
        listen 127.0.0.1:{port};
        dynamic_balancer_ssl_routes {LISTENER};
        dynamic_balancer_routes {LISTENER};
        proxy_pass gateway_stream_balancer;
    }}
}}"#
    );
    let out = Nginx::builder().main_extra(&stream).test_config();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("\"dynamic_balancer_ssl_routes\" needs TLS on the server"),
        "{err}"
    );
}

/// The twin the controller renders beside a TLS listener's server.
const TWIN: &str = "server {
        listen unix:{d}/backend-tls.sock;
        dynamic_balancer_backend_tls test/gw/8443;
        proxy_ssl on;
        proxy_pass gateway_stream_balancer;
    }";

#[test]
fn connections_to_tls_backends_are_encrypted_and_verified_per_policy() {
    let backend_ca = TestCa::new("Backend CA");
    let other_ca = TestCa::new("Other CA");
    let client_ca = TestCa::new("Client CA");
    let server = backend_ca.issue_server("backend", &["backend.test"], &[]);
    let secure = tls_echo_reporting(&server, &client_ca);
    let plain = TcpEcho::start();
    let (fallback, cert) = (TestCert::new("fallback"), TestCert::new("*.tls.test"));
    let port = free_port();
    let (ng, _dir) = start_with(port, &fallback, TWIN);
    let r = ng.post_backends(&json!([
        backend("plain", &[plain.endpoint()]),
        backend("secure", &[json!({"address": "127.0.0.1", "port": secure.to_string()})]),
    ]));
    assert_eq!(r.status, 201, "{}", r.body);
    put(&ng, "/configuration/certificates/t", &cert.body());
    put(
        &ng,
        "/configuration/certificates/gw_client",
        &client_ca.issue("gateway-client").body(),
    );
    let with_policy = |ca: &TestCa, hostname: &str, client: bool| {
        let mut t = table(&[("a.tls.test", "plain", "t"), ("b.tls.test", "secure", "t")]);
        t["backendTls"] = json!([{"backend": "secure", "hostname": hostname, "caCertificates": ca.cert_pem}]);
        if client {
            t["listeners"][0]["backendClientCertificate"] = json!("gw_client");
        }
        t.to_string()
    };
    put(
        &ng,
        "/configuration/routes",
        &with_policy(&backend_ca, "backend.test", true),
    );
    let pids = worker_pids(&ng);
    for _ in 0..4 {
        // One listener, one connection in the clear, the next over TLS.
        let (_, answer) = ask(port, "a.tls.test");
        assert_eq!(answer.as_deref().and_then(answered_by), Some(plain.port), "{answer:?}");
        let (shown, answer) = ask(port, "b.tls.test");
        assert_eq!(shown, cert.sha256);
        assert_eq!(
            answer.as_deref(),
            Some("sni=backend.test client=gateway-client line=hello"),
            "{}",
            ng.error_log()
        );
    }
    // A CA the backend's chain does not end at, or a name its
    // certificate does not carry: the handshake fails, the client's
    // connection closes, nothing goes out in the clear.
    put(
        &ng,
        "/configuration/routes",
        &with_policy(&other_ca, "backend.test", true),
    );
    assert_eq!(ask(port, "b.tls.test").1, None);
    put(
        &ng,
        "/configuration/routes",
        &with_policy(&backend_ca, "other.test", true),
    );
    assert_eq!(ask(port, "b.tls.test").1, None);
    assert!(
        ng.error_log().contains("certificate verify failed"),
        "{}",
        ng.error_log()
    );
    // Back to a good policy, without the client certificate.
    put(
        &ng,
        "/configuration/routes",
        &with_policy(&backend_ca, "backend.test", false),
    );
    assert_eq!(
        ask(port, "b.tls.test").1.as_deref(),
        Some("sni=backend.test client=none line=hello")
    );
    assert_eq!(worker_pids(&ng), pids, "no worker was replaced");
}

#[test]
fn a_tls_backend_without_a_twin_is_refused_and_twins_are_checked() {
    let backend_ca = TestCa::new("Backend CA");
    let server = backend_ca.issue_server("backend", &["backend.test"], &[]);
    let secure = tls_echo_reporting(&server, &TestCa::new("Client CA"));
    let (fallback, cert) = (TestCert::new("fallback"), TestCert::new("*.tls.test"));
    let port = free_port();
    let (ng, _dir) = start(port, &fallback);
    let r = ng.post_backends(&json!([backend(
        "secure",
        &[json!({"address": "127.0.0.1", "port": secure.to_string()})]
    )]));
    assert_eq!(r.status, 201, "{}", r.body);
    put(&ng, "/configuration/certificates/t", &cert.body());
    let mut t = table(&[("b.tls.test", "secure", "t")]);
    t["backendTls"] = json!([{"backend": "secure", "hostname": "backend.test", "caCertificates": backend_ca.cert_pem}]);
    put(&ng, "/configuration/routes", &t.to_string());
    // Never in the clear to a backend a policy covers.
    assert_eq!(ask(port, "b.tls.test").1, None);
    assert!(
        ng.error_log().contains("no \"dynamic_balancer_backend_tls\" twin"),
        "{}",
        ng.error_log()
    );

    // A twin nginx would not let the module verify is refused by nginx -t.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), &backend_ca.cert_pem).unwrap();
    for (settings, needs) in [
        ("", "\"proxy_ssl on\""),
        (
            "proxy_ssl on; proxy_ssl_session_reuse off;",
            "\"proxy_ssl_session_reuse on\"",
        ),
        (
            "proxy_ssl on; proxy_ssl_verify on; proxy_ssl_trusted_certificate {d}/ca.pem;",
            "\"proxy_ssl_verify off\"",
        ),
    ] {
        let stream = format!(
            r#"stream {{
    upstream gateway_stream_balancer {{ dynamic_balancer; }}
    server {{
        listen unix:{d}/t.sock;
        dynamic_balancer_backend_tls {LISTENER};
        {settings}
        proxy_pass gateway_stream_balancer;
    }}
}}"#,
            d = dir.path().display(),
            settings = settings.replace("{d}", &dir.path().display().to_string()),
        );
        let out = Nginx::builder().main_extra(&stream).test_config();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{settings}");
        assert!(
            err.contains(&format!("\"dynamic_balancer_backend_tls\" needs {needs}")),
            "{err}"
        );
    }
}
