//! End to end: `--tcp-services-configmap` and `--udp-services-configmap`
//! through the real controller on a manifest directory, nginx's `stream {}`
//! balanced by the module, real TCP and UDP upstreams on loopback.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};

use tests::controller::{ingress, service, wait_until, Controller, INGRESS_CLASS};
use tests::free_port;
use tests::upstream::Upstream;

const L4_ARGS: [&str; 4] = [
    "--tcp-services-configmap",
    "ingress-nginx/tcp-services",
    "--udp-services-configmap",
    "ingress-nginx/udp-services",
];

/// A TCP upstream: answers each connection with `tcp-<port>` and, when the
/// connection starts with a PROXY protocol v1 line, `|` and that line.
struct TcpEcho {
    port: u16,
    identity: String,
}

impl TcpEcho {
    fn start() -> TcpEcho {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let identity = format!("tcp-{port}");
        let id = identity.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let id = id.clone();
                thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut first = String::new();
                    let _ = reader.read_line(&mut first);
                    let answer = match first.strip_prefix("PROXY ") {
                        Some(rest) => {
                            // The client's line too: closing with unread
                            // data would reset the connection, and a reset
                            // can drop the answer from nginx's buffers.
                            let mut line = String::new();
                            let _ = reader.read_line(&mut line);
                            format!("{id}|PROXY {}", rest.trim_end())
                        }
                        None => id,
                    };
                    let mut conn = conn;
                    let _ = conn.write_all(answer.as_bytes());
                    let _ = conn.shutdown(Shutdown::Both);
                });
            }
        });
        TcpEcho { port, identity }
    }
}

/// A UDP upstream: answers each datagram with `udp-<port>`.
struct UdpEcho {
    port: u16,
    identity: String,
}

impl UdpEcho {
    fn start() -> UdpEcho {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let identity = format!("udp-{port}");
        let id = identity.clone();
        thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((_, from)) = socket.recv_from(&mut buf) {
                let _ = socket.send_to(id.as_bytes(), from);
            }
        });
        UdpEcho { port, identity }
    }
}

/// One TCP exchange through `port`: sends `hello` (after `preface`), returns
/// the answer and the client's own address; `None` if the connection
/// failed or closed without an answer.
fn tcp_ask(port: u16, preface: &str) -> Option<(String, SocketAddr)> {
    let mut s =
        TcpStream::connect_timeout(&format!("127.0.0.1:{port}").parse().unwrap(), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let local = s.local_addr().unwrap();
    s.write_all(format!("{preface}hello\n").as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    (!answer.is_empty()).then_some((answer, local))
}

fn udp_ask(port: u16) -> Option<String> {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    s.send_to(b"q", ("127.0.0.1", port)).ok()?;
    let mut buf = [0u8; 512];
    let (n, _) = s.recv_from(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// What `n` TCP connections through `port` reached.
fn tcp_seen(port: u16, n: usize) -> BTreeSet<String> {
    (0..n).filter_map(|_| tcp_ask(port, "")).map(|(a, _)| a).collect()
}

/// A Service `name` in `demo` whose port 80 (`protocol`) has an
/// EndpointSlice per upstream port, on 127.0.0.1.
fn service_l4(name: &str, protocol: &str, ports: &[u16]) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: demo, name: {name}}}\nspec:\n  ports: [{{name: p, port: 80, protocol: {protocol}}}]\n"
    );
    for (i, port) in ports.iter().enumerate() {
        out.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: demo\n  name: {name}-{i}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: p, port: {port}, protocol: {protocol}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n"
        ));
    }
    out
}

fn config_map(name: &str, entries: &[(u16, &str)]) -> String {
    let mut out =
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{namespace: ingress-nginx, name: {name}}}\ndata:\n");
    for (port, value) in entries {
        out.push_str(&format!("  \"{port}\": \"{value}\"\n"));
    }
    out
}

#[test]
fn tcp_and_udp_services_balance_and_50_endpoint_changes_never_reload() {
    let tcp: Vec<TcpEcho> = (0..3).map(|_| TcpEcho::start()).collect();
    let udp: Vec<UdpEcho> = (0..2).map(|_| UdpEcho::start()).collect();
    let (tport, uport) = (free_port(), free_port());
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("tcp.yaml", service_l4("echo", "TCP", &[tcp[0].port, tcp[1].port])),
            ("udp.yaml", service_l4("dns", "UDP", &[udp[0].port, udp[1].port])),
            (
                "tcp-services.yaml",
                config_map("tcp-services", &[(tport, "demo/echo:80")]),
            ),
            (
                "udp-services.yaml",
                config_map("udp-services", &[(uport, "demo/dns:p")]),
            ),
        ],
        &L4_ARGS,
    );
    assert!(
        c.conf().contains("dynamic_balancer_backend tcp-demo-echo-80;"),
        "{}",
        c.conf()
    );
    let both: BTreeSet<String> = [tcp[0].identity.clone(), tcp[1].identity.clone()].into();
    assert!(
        wait_until(Duration::from_secs(10), || tcp_seen(tport, 8) == both),
        "TCP not balanced over both endpoints: {:?}\n{}",
        tcp_seen(tport, 8),
        c.log()
    );
    let udp_both: BTreeSet<String> = udp.iter().map(|u| u.identity.clone()).collect();
    let udp_seen: BTreeSet<String> = (0..8).filter_map(|_| udp_ask(uport)).collect();
    assert_eq!(udp_seen, udp_both, "UDP balanced over both endpoints");

    let reloads = c.reloads();
    let workers = c.worker_pids();
    let sets: [Vec<usize>; 2] = [vec![2], vec![0, 1]];
    for round in 0..50 {
        let set = &sets[round % 2];
        let ports: Vec<u16> = set.iter().map(|i| tcp[*i].port).collect();
        c.write("tcp.yaml", &service_l4("echo", "TCP", &ports));
        let want: BTreeSet<String> = set.iter().map(|i| tcp[*i].identity.clone()).collect();
        let followed = wait_until(Duration::from_secs(10), || tcp_seen(tport, 4) == want);
        assert!(followed, "round {round}: TCP did not follow {want:?}\n{}", c.log());
    }
    assert_eq!(c.reloads(), reloads, "endpoint changes must not reload nginx");
    assert_eq!(c.worker_pids(), workers, "the same workers served all 50 changes");
}

#[test]
fn a_new_port_reloads_once_and_bad_entries_are_refused_without_harm() {
    let (a, b) = (TcpEcho::start(), TcpEcho::start());
    let web = Upstream::start();
    let (p1, p2, p3, p4) = (free_port(), free_port(), free_port(), free_port());
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service_l4("a", "TCP", &[a.port])),
            ("b.yaml", service_l4("b", "TCP", &[b.port])),
            ("web.yaml", service("web", &[web.port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
            ("tcp-services.yaml", config_map("tcp-services", &[(p1, "demo/a:80")])),
        ],
        &L4_ARGS,
    );
    assert_eq!(tcp_ask(p1, "").map(|x| x.0), Some(a.identity.clone()));
    let reloads = c.reloads();
    let http_port = c.http_port;
    // A good new port, and three bad ones: malformed, the HTTP port, a
    // Service that does not exist.
    let http_clash = format!("{http_port}");
    let text = format!(
        "{}  \"{http_clash}\": \"demo/b:80\"\n",
        config_map(
            "tcp-services",
            &[
                (p1, "demo/a:80"),
                (p2, "demo/b:80"),
                (p3, "demo/b:80;evil"),
                (p4, "demo/nope:80")
            ]
        )
    );
    c.write("tcp-services.yaml", &text);
    assert!(
        wait_until(Duration::from_secs(10), || tcp_ask(p2, "").map(|x| x.0)
            == Some(b.identity.clone())),
        "{}",
        c.log()
    );
    thread::sleep(Duration::from_millis(500));
    assert_eq!(c.reloads(), reloads + 1.0, "one new listen, one reload");
    let log = c.log();
    assert!(log.contains("character ';'"), "malformed entry reported\n{log}");
    assert!(log.contains("is the HTTP port, reserved"), "port clash reported\n{log}");
    assert!(
        log.contains("Service demo/nope does not exist"),
        "missing Service reported\n{log}"
    );
    let conf = c.conf();
    assert!(
        !conf.contains(&format!(":{p3}")) && !conf.contains(&format!(":{p4}")),
        "{conf}"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", p4)).is_err(),
        "a refused entry does not listen"
    );
    assert_eq!(
        tcp_ask(p1, "").map(|x| x.0),
        Some(a.identity.clone()),
        "the others still serve"
    );
    assert_eq!(c.get("web.test", "/"), (200, web.identity.clone()), "HTTP still serves");
}

#[test]
fn an_empty_service_closes_at_once_and_a_dead_endpoint_is_skipped() {
    let a = TcpEcho::start();
    let dead = free_port();
    let (p1, p2) = (free_port(), free_port());
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service_l4("a", "TCP", &[a.port, dead])),
            ("empty.yaml", service_l4("empty", "TCP", &[])),
            (
                "tcp-services.yaml",
                config_map("tcp-services", &[(p1, "demo/a:80"), (p2, "demo/empty:80")]),
            ),
        ],
        &L4_ARGS,
    );
    for _ in 0..10 {
        assert_eq!(
            tcp_ask(p1, "").map(|x| x.0),
            Some(a.identity.clone()),
            "every connection reaches the live endpoint"
        );
    }
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", p2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    let n = s.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "closed at once, not left hanging"
    );
    let error_log = c.dir.path().join("nginx/logs/error.log");
    let logged = wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(&error_log).is_ok_and(|l| l.contains("no endpoints for backend \"tcp-demo-empty-80\""))
    });
    assert!(logged, "the close is logged in {}", error_log.display());
}

#[test]
fn proxy_protocol_to_the_upstream_carries_the_client_address() {
    let a = TcpEcho::start();
    let (send, both) = (free_port(), free_port());
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service_l4("a", "TCP", &[a.port])),
            (
                "tcp-services.yaml",
                config_map(
                    "tcp-services",
                    &[(send, "demo/a:80::PROXY"), (both, "demo/a:80:PROXY:PROXY")],
                ),
            ),
        ],
        &L4_ARGS,
    );
    // Send only: the header names the client's own socket.
    let (answer, client) = tcp_ask(send, "").unwrap_or_else(|| panic!("no answer\n{}", c.log()));
    let want = format!("{}|PROXY TCP4 127.0.0.1 127.0.0.1 {} {send}", a.identity, client.port());
    assert_eq!(answer, want);
    // Decode and send: the address a load balancer declared is passed on.
    let preface = format!("PROXY TCP4 203.0.113.9 127.0.0.1 40000 {both}\r\n");
    let (answer, _) = tcp_ask(both, &preface).unwrap_or_else(|| panic!("no answer\n{}", c.log()));
    assert!(
        answer.starts_with(&format!("{}|PROXY TCP4 203.0.113.9 ", a.identity)),
        "the client's declared address reaches the upstream: {answer}"
    );
    // Without the header, a PROXY listener refuses the connection.
    assert_eq!(tcp_ask(both, "").map(|x| x.0), None);
}

#[test]
fn use_proxy_protocol_on_the_http_listener_gives_the_declared_client_address() {
    let (up_port, seen) = tests::upstream::recording("ok");
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("web.yaml", service("web", &[up_port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
            (
                "cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: ingress-nginx, name: ingress-nginx-controller}\ndata:\n  use-proxy-protocol: \"true\"\n".into(),
            ),
        ],
        &[],
    );
    assert!(c.conf().contains("real_ip_header proxy_protocol;"), "{}", c.conf());
    let mut s = TcpStream::connect(("127.0.0.1", c.http_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let request = format!(
        "PROXY TCP4 198.51.100.7 127.0.0.1 5555 {}\r\nGET / HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n",
        c.http_port
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}\n{}", c.log());
    let heads = seen.lock().unwrap().clone();
    let head = heads.last().expect("the upstream got the request").to_ascii_lowercase();
    assert!(head.contains("x-real-ip: 198.51.100.7"), "{head}");
    assert!(head.contains("x-forwarded-for: 198.51.100.7"), "{head}");
    // A client that does not speak it is refused (the listener expects it).
    let mut s = TcpStream::connect(("127.0.0.1", c.http_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(!answer.contains("200 OK"), "{answer}");
}
