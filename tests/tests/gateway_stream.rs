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
use tests::tls::{handshake, tls_upstream, TestCert};

const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: dynamic}\nspec: {controllerName: dynamic-balancer.dev/gateway-controller}\n";

fn gateway(tcp: u16, udp: u16, tls: u16) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{namespace: demo, name: l4}}\nspec:\n  gatewayClassName: dynamic\n  listeners:\n  - {{name: tcp, protocol: TCP, port: {tcp}}}\n  - {{name: udp, protocol: UDP, port: {udp}}}\n  - {{name: tls, protocol: TLS, port: {tls}, tls: {{mode: Passthrough}}}}\n  - {{name: terminate, protocol: TLS, port: {tls}, hostname: t.test, tls: {{mode: Terminate}}}}\n"
    )
}

/// A TCPRoute or UDPRoute (`kind`) named `name` to Service `to`, on the
/// listener `section`.
fn l4_route(kind: &str, name: &str, section: &str, to: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\nmetadata: {{namespace: demo, name: {name}}}\nspec:\n  parentRefs: [{{name: l4, sectionName: {section}}}]\n  rules:\n  - backendRefs: [{{name: {to}, port: 80}}]\n"
    )
}

fn tls_route(name: &str, host: &str, to: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: TLSRoute\nmetadata: {{namespace: demo, name: {name}}}\nspec:\n  parentRefs: [{{name: l4, sectionName: tls}}]\n  hostnames: [{host}]\n  rules:\n  - backendRefs: [{{name: {to}, port: 80}}]\n"
    )
}

#[test]
fn tcp_udp_and_tls_routes_route_connections_without_reload() {
    let (tcp_a, tcp_b) = (TcpEcho::start(), TcpEcho::start());
    let udp = UdpEcho::start();
    let (cert_a, cert_b) = (TestCert::new("a.tls.test"), TestCert::new("b.tls.test"));
    let (tls_a, tls_b) = (tls_upstream(&cert_a), tls_upstream(&cert_b));
    let (tcp_port, udp_port, tls_port) = (free_port(), free_udp_port(), free_port());
    let files = vec![
        ("class.yaml", CLASS.to_string()),
        ("gateway.yaml", gateway(tcp_port, udp_port, tls_port)),
        (
            "services.yaml",
            [
                service("tcp-a", &[tcp_a.port]),
                service("tcp-b", &[tcp_b.port]),
                service("udp-echo", &[udp.port]),
                service("tls-a", &[tls_a]),
                service("tls-b", &[tls_b]),
            ]
            .join("---\n"),
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
        c.log().contains("TLS listeners are served in mode Passthrough only"),
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
    assert_eq!(c.reloads(), reloads, "layer 4 route edits never reload");
}
