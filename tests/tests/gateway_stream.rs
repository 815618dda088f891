//! Gateway API layer 4 through the controller (manifest mode): a Gateway
//! with TCP, UDP and TLS (Passthrough) listeners, and TCPRoutes, UDPRoutes
//! and TLSRoutes to real TCP and UDP echo servers and TLS servers. Each
//! connection's backend comes from the route table the module keeps, by
//! the TLS server name for TLS listeners; route edits reach new
//! connections with no reload.

use std::time::Duration;

use tests::controller::{service, wait_until, Controller};
use tests::echo::{answered_by, ask_tcp, ask_udp, free_udp_port, TcpEcho, UdpEcho};
use tests::free_port;
use tests::tls::{ask_over_tls, handshake, tls_echo_reporting, tls_secret, tls_upstream, TestCa, TestCert};

const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: dynamic}\nspec: {controllerName: dynamic-balancer.dev/gateway-controller}\n";

/// TCP, UDP and TLS Passthrough listeners, and a TLS Terminate listener
/// for `*.t.test` with Secret `t-cert` on its own port.
fn gateway(tcp: u16, udp: u16, tls: u16, terminate: u16) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{namespace: demo, name: l4}}\nspec:\n  gatewayClassName: dynamic\n  listeners:\n  - {{name: tcp, protocol: TCP, port: {tcp}}}\n  - {{name: udp, protocol: UDP, port: {udp}}}\n  - {{name: tls, protocol: TLS, port: {tls}, tls: {{mode: Passthrough}}}}\n  - {{name: terminate, protocol: TLS, port: {terminate}, hostname: \"*.t.test\", tls: {{mode: Terminate, certificateRefs: [{{name: t-cert}}]}}}}\n"
    )
}

/// A Gateway whose port mixes TLS modes: both listeners are refused.
const MIXED: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {namespace: demo, name: mixed}\nspec:\n  gatewayClassName: dynamic\n  listeners:\n  - {name: pass, protocol: TLS, port: 9443, hostname: p.test, tls: {mode: Passthrough}}\n  - {name: end, protocol: TLS, port: 9443, hostname: e.test, tls: {mode: Terminate, certificateRefs: [{name: t-cert}]}}\n";

/// A TCPRoute or UDPRoute (`kind`) named `name` to Service `to`, on the
/// listener `section`.
fn l4_route(kind: &str, name: &str, section: &str, to: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\nmetadata: {{namespace: demo, name: {name}}}\nspec:\n  parentRefs: [{{name: l4, sectionName: {section}}}]\n  rules:\n  - backendRefs: [{{name: {to}, port: 80}}]\n"
    )
}

fn tls_route(name: &str, host: &str, to: &str) -> String {
    tls_route_on("tls", name, host, to)
}

fn tls_route_on(section: &str, name: &str, host: &str, to: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: TLSRoute\nmetadata: {{namespace: demo, name: {name}}}\nspec:\n  parentRefs: [{{name: l4, sectionName: {section}}}]\n  hostnames: [{host}]\n  rules:\n  - backendRefs: [{{name: {to}, port: 80}}]\n"
    )
}

/// ConfigMap `backend-ca` with `ca`, and a BackendTLSPolicy on Service
/// `secure`'s port: its certificate must chain to `ca` and name
/// `backend.test`.
fn backend_tls(ca: &TestCa) -> String {
    let indent: String = ca.cert_pem.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{namespace: demo, name: backend-ca}}\ndata:\n  ca.crt: |\n{indent}---\napiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {{namespace: demo, name: secure}}\nspec:\n  targetRefs: [{{group: \"\", kind: Service, name: secure, sectionName: http}}]\n  validation:\n    caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: backend-ca}}]\n    hostname: backend.test\n"
    )
}

#[test]
fn tcp_udp_and_tls_routes_route_connections_without_reload() {
    let (tcp_a, tcp_b) = (TcpEcho::start(), TcpEcho::start());
    let udp = UdpEcho::start();
    let (cert_a, cert_b) = (TestCert::new("a.tls.test"), TestCert::new("b.tls.test"));
    let (tls_a, tls_b) = (tls_upstream(&cert_a), tls_upstream(&cert_b));
    let t_cert = TestCert::new("*.t.test");
    let backend_ca = TestCa::new("Backend CA");
    let secure = tls_echo_reporting(
        &backend_ca.issue_server("backend", &["backend.test"], &[]),
        &TestCa::new("Client CA"),
    );
    let (tcp_port, udp_port, tls_port) = (free_port(), free_udp_port(), free_port());
    let terminate_port = free_port();
    let files = vec![
        ("class.yaml", CLASS.to_string()),
        ("gateway.yaml", gateway(tcp_port, udp_port, tls_port, terminate_port)),
        ("mixed.yaml", MIXED.to_string()),
        ("t-cert.yaml", tls_secret("t-cert", &t_cert)),
        (
            "terminate.yaml",
            tls_route_on("terminate", "ended", "one.t.test", "tcp-a"),
        ),
        (
            "services.yaml",
            [
                service("tcp-a", &[tcp_a.port]),
                service("tcp-b", &[tcp_b.port]),
                service("udp-echo", &[udp.port]),
                service("tls-a", &[tls_a]),
                service("tls-b", &[tls_b]),
                service("secure", &[secure]),
            ]
            .join("---\n"),
        ),
        ("backend-tls.yaml", backend_tls(&backend_ca)),
        (
            "sealed.yaml",
            tls_route_on("terminate", "sealed", "sec.t.test", "secure"),
        ),
        ("tcp.yaml", l4_route("TCPRoute", "tcp", "tcp", "tcp-a")),
        ("udp.yaml", l4_route("UDPRoute", "udp", "udp", "udp-echo")),
        ("tls-a.yaml", tls_route("tls-a", "a.tls.test", "tls-a")),
        ("tls-b.yaml", tls_route("tls-b", "\"*.b.tls.test\"", "tls-b")),
    ];
    let c = Controller::start(&files, &[]);
    let conf = c.conf();
    assert!(conf.contains("dynamic_balancer_routes demo/l4/"), "{conf}");
    assert!(conf.contains("ssl_preread on;"), "{conf}");
    let ask = |port| ask_tcp(port, None, "hello", Duration::from_secs(2)).ok();
    assert!(
        wait_until(Duration::from_secs(10), || ask(tcp_port)
            .as_deref()
            .and_then(answered_by)
            == Some(tcp_a.port)),
        "{}",
        c.log()
    );
    let udp_answer = ask_udp(udp_port, "hello", Duration::from_secs(2)).expect("UDP through the Gateway");
    assert!(udp_answer.contains("hello"), "{udp_answer}");

    // TLS passthrough: the backend's own certificate, by server name; a
    // wildcard route hostname covers one more label; no route, no TLS.
    let cn = |sni: &str| handshake(tls_port, Some(sni), &[]).map(|p| p.cn);
    assert_eq!(cn("a.tls.test").as_deref(), Ok("a.tls.test"));
    assert_eq!(cn("x.b.tls.test").as_deref(), Ok("b.tls.test"));
    assert!(cn("other.test").is_err(), "no route for that server name");
    assert!(
        c.log()
            .contains("port 9443 has TLS listeners in both Passthrough and Terminate mode"),
        "{}",
        c.log()
    );

    // TLS Terminate: the Secret's certificate, the bytes in the clear to
    // the backend the SNI's route names; a name no route takes is closed.
    let ended = ask_over_tls(terminate_port, "one.t.test", "hello")
        .unwrap_or_else(|e| panic!("handshake: {e}\n{}\n{}", c.conf(), c.log()));
    assert_eq!(ended.0, t_cert.sha256);
    assert_eq!(ended.1.as_deref().and_then(answered_by), Some(tcp_a.port), "{ended:?}");
    assert_eq!(ask_over_tls(terminate_port, "two.t.test", "hello").unwrap().1, None);
    // A backend a BackendTLSPolicy covers: over TLS from the listener's
    // twin server, with the policy's SNI and its CA checked.
    assert!(conf.contains("dynamic_balancer_backend_tls demo/l4/"), "{conf}");
    let sealed = ask_over_tls(terminate_port, "sec.t.test", "hello").unwrap();
    assert_eq!(sealed.0, t_cert.sha256);
    assert_eq!(
        sealed.1.as_deref(),
        Some("sni=backend.test client=none line=hello"),
        "{}",
        c.log()
    );

    // Route edits: the TCPRoute moves to b, a TLSRoute takes another
    // host; no reload.
    let reloads = c.reloads();
    c.write("tcp.yaml", &l4_route("TCPRoute", "tcp", "tcp", "tcp-b"));
    assert!(wait_until(Duration::from_secs(10), || ask(tcp_port)
        .as_deref()
        .and_then(answered_by)
        == Some(tcp_b.port)));
    c.write("tls-a.yaml", &tls_route("tls-a", "c.tls.test", "tls-a"));
    assert!(wait_until(Duration::from_secs(10), || cn("c.tls.test").as_deref()
        == Ok("a.tls.test")));
    assert!(cn("a.tls.test").is_err());
    c.write(
        "terminate.yaml",
        &tls_route_on("terminate", "ended", "two.t.test", "tcp-b"),
    );
    assert!(wait_until(Duration::from_secs(10), || ask_over_tls(
        terminate_port,
        "two.t.test",
        "hello"
    )
    .is_ok_and(|(_, a)| a.as_deref().and_then(answered_by) == Some(tcp_b.port))));
    assert_eq!(c.reloads(), reloads, "layer 4 route edits never reload");
}
