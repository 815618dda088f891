//! End to end: `--enable-ssl-passthrough` with the real controller, nginx's
//! `stream {}` on the HTTPS port, a TLS upstream with its own certificate
//! and a host that terminates TLS at nginx, on the same port.

use std::time::Duration;

use tests::controller::{ingress, service, wait_until, Controller, INGRESS_CLASS};
use tests::tls::{handshake, https_get, tls_secret, tls_upstream, TestCert};

#[test]
fn passthrough_hosts_keep_their_tls_and_other_hosts_terminate_at_nginx() {
    let upstream_cert = TestCert::new("pass.test");
    let tls_port = tls_upstream(&upstream_cert);
    let term_cert = TestCert::new("term.test");
    let (web_port, heads) = tests::upstream::recording("terminated");
    let term_ingress = ingress("term", "term.test", "/", "web", &[]).replace(
        "spec:\n",
        "spec:\n  tls:\n    - hosts: [term.test]\n      secretName: term-tls\n",
    );
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("tlsup.yaml", service("tlsup", &[tls_port])),
            ("web.yaml", service("web", &[web_port])),
            ("secret.yaml", tls_secret("term-tls", &term_cert)),
            (
                "pass.yaml",
                ingress(
                    "pass",
                    "pass.test",
                    "/",
                    "tlsup",
                    &[("ssl-passthrough", "true"), ("backend-protocol", "HTTPS")],
                ),
            ),
            ("term.yaml", term_ingress),
            // A one-label host that is a map keyword, and HTTP/3 on (not
            // for passthrough hosts): nginx must accept the rendering.
            ("keyword.yaml", ingress("keyword", "default", "/", "web", &[])),
            (
                "cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: ingress-nginx, name: ingress-nginx-controller}\ndata:\n  use-http3: \"true\"\n".into(),
            ),
            // A newer tenant's passthrough wildcard: it gets the names no
            // one else serves, never term.test (an exact name wins).
            (
                "wild.yaml",
                ingress("wild", "\"*.test\"", "/", "tlsup", &[("ssl-passthrough", "true")]),
            ),
        ],
        &["--enable-ssl-passthrough"],
    );
    assert!(c.conf().contains("ssl_preread on;"), "{}", c.conf());
    let pass_server = c
        .conf()
        .split("## start server pass.test")
        .nth(1)
        .unwrap_or_default()
        .split("## end server")
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        !pass_server.contains("quic"),
        "no HTTP/3 for a passthrough host: {pass_server}"
    );

    // The passthrough host: the client sees the upstream's own certificate.
    let shown = handshake(c.https_port, Some("pass.test"), &[]).unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    assert_eq!(
        shown.sha256, upstream_cert.sha256,
        "the upstream's certificate, not nginx's"
    );
    let (status, text) = https_get(c.https_port, "pass.test", "/", None).unwrap();
    assert_eq!(status, 200);
    assert!(text.ends_with("tls-upstream"), "{text}");

    // A terminated host on the same port: its Secret's certificate, the
    // request proxied by nginx, the client's address kept.
    let shown = handshake(c.https_port, Some("term.test"), &[]).unwrap();
    assert_eq!(shown.sha256, term_cert.sha256, "nginx serves the Secret's certificate");
    let (status, text) = https_get(c.https_port, "term.test", "/", None).unwrap();
    assert_eq!(status, 200, "{text}\n{}", c.log());
    assert!(text.ends_with("terminated"), "{text}");
    let head = heads
        .lock()
        .unwrap()
        .last()
        .cloned()
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(
        head.contains("x-real-ip: 127.0.0.1"),
        "the client's address survives the socket hop: {head}"
    );
    assert!(head.contains("x-forwarded-proto: https"), "{head}");
    assert!(
        head.contains(&format!("x-forwarded-port: {}", c.https_port)),
        "the port the client connected to, from the PROXY header: {head}"
    );

    // The wildcard passes through what it covers and no one else serves.
    let shown = handshake(c.https_port, Some("other.test"), &[]).unwrap();
    assert_eq!(
        shown.sha256,
        upstream_cert.sha256,
        "*.test passes other.test through\n{}\n{}",
        c.conf(),
        c.log()
    );

    // An unknown SNI goes to the default server, terminated by nginx.
    let shown = handshake(c.https_port, Some("nobody.example"), &[]).unwrap();
    assert_ne!(shown.sha256, upstream_cert.sha256);
    assert_ne!(shown.sha256, term_cert.sha256);
    let (status, _) = https_get(c.https_port, "nobody.example", "/", None).unwrap();
    assert_eq!(status, 404, "the default server answers");

    // The passthrough backend's endpoints change without a reload.
    let reloads = c.reloads();
    let other_cert = TestCert::new("pass.test");
    let other_port = tls_upstream(&other_cert);
    c.write("tlsup.yaml", &service("tlsup", &[other_port]));
    assert!(
        wait_until(Duration::from_secs(10), || {
            handshake(c.https_port, Some("pass.test"), &[]).is_ok_and(|p| p.sha256 == other_cert.sha256)
        }),
        "{}",
        c.log()
    );
    assert_eq!(
        c.reloads(),
        reloads,
        "an endpoint change of a passthrough host does not reload"
    );

    // kill -9 of the master leaves its Unix socket file behind; the
    // restarted master must still bind it and serve both kinds of host.
    let master = c.nginx_master_pid().expect("nginx pid file");
    // SAFETY: kill(2) on the master of this test's own nginx.
    unsafe { libc::kill(master, libc::SIGKILL) };
    let restarted = wait_until(Duration::from_secs(15), || {
        c.nginx_master_pid().is_some_and(|p| p != master)
            && https_get(c.https_port, "term.test", "/", None).is_ok_and(|(status, _)| status == 200)
    });
    assert!(restarted, "{}", c.log());
    let shown = handshake(c.https_port, Some("pass.test"), &[]).unwrap();
    assert_eq!(shown.sha256, other_cert.sha256);
}

#[test]
fn without_the_flag_the_annotation_is_ignored_and_reported() {
    let (web_port, _) = tests::upstream::recording("terminated");
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("web.yaml", service("web", &[web_port])),
            (
                "pass.yaml",
                ingress("pass", "pass.test", "/", "web", &[("ssl-passthrough", "true")]),
            ),
        ],
        &[],
    );
    assert!(!c.conf().contains("ssl_preread"), "{}", c.conf());
    assert!(c.log().contains("without --enable-ssl-passthrough"), "{}", c.log());
    assert_eq!(c.get("pass.test", "/").0, 200, "the HTTP routes still work");
}
