//! `dynamic_balancer` in `stream{}`, end to end: a real nginx with two
//! workers, real TCP and UDP echo servers on loopback whose answers name
//! their port, and the same `/configuration` API as HTTP.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use lua_compat::chash::ChashRing;
use serde_json::{json, Value};
use tests::echo::{answered_by, ask_tcp, ask_udp, connect_from, free_udp_port, TcpEcho, UdpEcho};
use tests::process::prefix_with;
use tests::{backend, dead_endpoint, free_port, nginx_command, Nginx};

/// How long one client step (connect, write, read) may take.
const STEP: Duration = Duration::from_secs(2);

/// An nginx whose `stream{}` has a server per case, all behind one
/// `dynamic_balancer` upstream (and one server behind an upstream that
/// takes the backend from a variable).
struct L4 {
    ng: Nginx,
    /// `tcp-echo`.
    tcp: u16,
    /// `udp-echo`, UDP.
    udp: u16,
    /// `nobody`, a backend that is never defined.
    unknown: u16,
    /// `empty`, a backend posted with no endpoints.
    empty: u16,
    /// `pp`, with `proxy_protocol on` towards the upstream.
    proxy_protocol: u16,
    /// No `dynamic_balancer_backend`: `$stream_backend` maps this port
    /// to `tcp-echo`.
    by_variable: u16,
    /// No `dynamic_balancer_backend`, and `$stream_backend` is empty here.
    unnamed: u16,
}

impl L4 {
    fn start() -> L4 {
        let (tcp, udp, unknown, empty) = (free_port(), free_udp_port(), free_port(), free_port());
        let (proxy_protocol, by_variable, unnamed) = (free_port(), free_port(), free_port());
        let stream = format!(
            r#"stream {{
    upstream tcp_balancer {{ dynamic_balancer; }}
    upstream var_balancer {{ dynamic_balancer $stream_backend; }}
    map $server_port $stream_backend {{ default ""; {by_variable} tcp-echo; }}
    proxy_connect_timeout 2s;
    server {{ listen 127.0.0.1:{tcp}; dynamic_balancer_backend tcp-echo; proxy_pass tcp_balancer; }}
    server {{ listen 127.0.0.1:{udp} udp; dynamic_balancer_backend udp-echo; proxy_pass tcp_balancer; proxy_responses 1; proxy_timeout 2s; }}
    server {{ listen 127.0.0.1:{unknown}; dynamic_balancer_backend nobody; proxy_pass tcp_balancer; }}
    server {{ listen 127.0.0.1:{empty}; dynamic_balancer_backend empty; proxy_pass tcp_balancer; }}
    server {{ listen 127.0.0.1:{proxy_protocol}; dynamic_balancer_backend pp; proxy_protocol on; proxy_pass tcp_balancer; }}
    server {{ listen 127.0.0.1:{by_variable}; proxy_pass var_balancer; }}
    server {{ listen 127.0.0.1:{unnamed}; proxy_pass var_balancer; }}
}}"#
        );
        let ng = Nginx::builder().workers(2).zone("8m").main_extra(&stream).start();
        L4 {
            ng,
            tcp,
            udp,
            unknown,
            empty,
            proxy_protocol,
            by_variable,
            unnamed,
        }
    }

    /// POSTs `backends` (the whole set); 201 expected.
    fn post(&self, backends: Value) {
        let r = self.ng.post_backends(&backends);
        assert_eq!(r.status, 201, "{}", r.body);
    }

    /// One line through nginx's `port`; panics unless the answer echoes it.
    fn ask(&self, port: u16, source: Option<Ipv4Addr>, message: &str) -> u16 {
        let answer = ask_tcp(port, source, message, STEP)
            .unwrap_or_else(|e| panic!("{message} via {port}: {e}\n{}", self.ng.error_log()));
        let by = answered_by(&answer).unwrap_or_else(|| panic!("not an echo: {answer:?}"));
        assert_eq!(answer, format!("{by} {message}"), "the payload went through unchanged");
        by
    }

    /// The master's children, read from /proc.
    fn worker_processes(&self) -> BTreeSet<u32> {
        let pid = self.ng.pid();
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect()
    }

    /// The worker PIDs `/configuration/status` reports.
    fn reported_workers(&self) -> BTreeSet<i64> {
        self.ng.status()["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["pid"].as_i64().unwrap())
            .collect()
    }
}

fn counts(ports: impl IntoIterator<Item = u16>) -> BTreeMap<u16, usize> {
    let mut m = BTreeMap::new();
    for p in ports {
        *m.entry(p).or_default() += 1;
    }
    m
}

/// Connects to `port`, sends nothing, and waits up to 1 s for the server
/// to close: the time it took, or what happened instead.
fn closed_at_once(port: u16) -> Result<Duration, String> {
    let started = Instant::now();
    let mut s = connect_from(port, None).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => Ok(started.elapsed()),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok(started.elapsed()),
        Ok(n) => Err(format!("read {n} bytes: {:?}", String::from_utf8_lossy(&buf[..n]))),
        Err(e) => Err(format!("still open after {:?}: {e}", started.elapsed())),
    }
}

#[test]
fn tcp_round_robin_spreads_connections_over_both_endpoints() {
    let l4 = L4::start();
    let (a, b) = (TcpEcho::start(), TcpEcho::start());
    l4.post(json!([backend("tcp-echo", &[a.endpoint(), b.endpoint()])]));
    let seen = counts((0..40).map(|i| l4.ask(l4.tcp, None, &format!("hello-{i}"))));
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        vec![a.port.min(b.port), a.port.max(b.port)]
    );
    // Each worker alternates: with two workers the totals differ by two at most.
    let (na, nb) = (seen[&a.port], seen[&b.port]);
    assert!(na.abs_diff(nb) <= 2, "uneven round robin: {seen:?}");
    assert_eq!(
        (a.connections(), b.connections()),
        (na, nb),
        "one upstream connection per client connection"
    );
}

#[test]
fn udp_round_robin_spreads_sessions_over_both_endpoints() {
    let l4 = L4::start();
    let (a, b) = (UdpEcho::start(), UdpEcho::start());
    l4.post(json!([backend("udp-echo", &[a.endpoint(), b.endpoint()])]));
    let mut seen = BTreeMap::new();
    for i in 0..40 {
        let message = format!("datagram-{i}");
        let answer =
            ask_udp(l4.udp, &message, STEP).unwrap_or_else(|e| panic!("{message}: {e}\n{}", l4.ng.error_log()));
        let by = answered_by(&answer).unwrap_or_else(|| panic!("not an echo: {answer:?}"));
        assert_eq!(answer, format!("{by} {message}"));
        *seen.entry(by).or_insert(0usize) += 1;
    }
    assert_eq!(seen.len(), 2, "both endpoints answered: {seen:?}");
    let (na, nb) = (seen[&a.port], seen[&b.port]);
    assert!(na.abs_diff(nb) <= 2, "uneven round robin: {seen:?}");
    assert_eq!((a.datagrams(), b.datagrams()), (na, nb));
}

/// 50 PUTs of `tcp-echo`, each with endpoints the previous set did not
/// have: the very next connection goes to the new set, in whichever
/// worker accepts it, and nginx neither reloads nor replaces a worker.
#[test]
fn fifty_endpoint_changes_route_the_next_connection_without_a_reload() {
    let l4 = L4::start();
    let ups: Vec<TcpEcho> = (0..4).map(|_| TcpEcho::start()).collect();
    l4.post(json!([backend("tcp-echo", &[ups[0].endpoint()])]));
    assert_eq!(l4.ask(l4.tcp, None, "first"), ups[0].port);
    let (processes, reported) = (l4.worker_processes(), l4.reported_workers());
    assert_eq!(processes.len(), 2);
    assert_eq!(
        processes.iter().map(|p| i64::from(*p)).collect::<BTreeSet<_>>(),
        reported
    );
    let started = Instant::now();
    let mut previous: BTreeSet<usize> = BTreeSet::from([0]);
    for round in 0..50 {
        // One endpoint, then two, ...; never one the previous set had.
        let size = 1 + round % 2;
        let mut fresh: Vec<usize> = (0..ups.len()).filter(|i| !previous.contains(i)).collect();
        let turn = round % fresh.len();
        fresh.rotate_left(turn);
        let set: BTreeSet<usize> = fresh.into_iter().take(size).collect();
        let endpoints: Vec<Value> = set.iter().map(|&i| ups[i].endpoint()).collect();
        let r = l4.ng.api(
            "PUT",
            "/configuration/backends/tcp-echo",
            Some(&backend("tcp-echo", &endpoints).to_string()),
        );
        assert_eq!(r.status, 200, "round {round}: {}", r.body);
        let ports: BTreeSet<u16> = set.iter().map(|&i| ups[i].port).collect();
        let next = l4.ask(l4.tcp, None, &format!("round-{round}"));
        assert!(
            ports.contains(&next),
            "round {round}: the next connection went to {next}, not {ports:?}"
        );
        // Three more: all in the set, and (each worker alternating) every
        // endpoint of it among the four.
        let mut seen = BTreeSet::from([next]);
        for k in 0..3 {
            let p = l4.ask(l4.tcp, None, &format!("round-{round}-{k}"));
            assert!(ports.contains(&p), "round {round}: {p} is not in {ports:?}");
            seen.insert(p);
        }
        assert_eq!(seen, ports, "round {round}");
        previous = set;
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "50 changes took {:?}",
        started.elapsed()
    );
    assert_eq!(
        l4.worker_processes(),
        processes,
        "the same worker processes served every change"
    );
    assert_eq!(l4.reported_workers(), reported);
    let log = l4.ng.error_log();
    assert!(!log.contains("reconfiguring"), "nginx reloaded:\n{log}");
    assert_eq!(log.matches("start worker process ").count(), 2, "{log}");
    assert_eq!(l4.ng.status()["generation"], 51, "one POST and 50 PUTs, each a write");
}

#[test]
fn a_refused_endpoint_is_skipped_and_every_connection_succeeds() {
    let l4 = L4::start();
    let (a, b) = (TcpEcho::start(), TcpEcho::start());
    let dead = dead_endpoint();
    let dead_port = dead["port"].as_str().unwrap().to_string();
    l4.post(json!([backend("tcp-echo", &[a.endpoint(), dead, b.endpoint()])]));
    let seen = counts((0..30).map(|i| l4.ask(l4.tcp, None, &format!("c{i}"))));
    assert_eq!(seen.len(), 2, "both live endpoints served: {seen:?}");
    assert_eq!(seen.values().sum::<usize>(), 30);
    assert_eq!(a.connections() + b.connections(), 30);
    // The dead one was tried (and refused), so the retry is what succeeded.
    let log = l4.ng.error_log();
    assert!(
        log.lines()
            .any(|l| l.contains("Connection refused") && l.contains(&format!("127.0.0.1:{dead_port}"))),
        "the refused endpoint was never tried:\n{log}"
    );
}

/// `maxFails`/`failTimeout` as for HTTP: one refused attempt ejects the
/// endpoint for both workers (the state is shared), so it is tried at most
/// once per worker, and `/configuration/health` shows it down.
#[test]
fn passive_health_ejects_a_refused_endpoint_for_every_worker() {
    let l4 = L4::start();
    let a = TcpEcho::start();
    let dead = dead_endpoint();
    let dead_port = dead["port"].as_str().unwrap().to_string();
    let mut b = backend("tcp-echo", &[dead, a.endpoint()]);
    b["maxFails"] = json!(1);
    b["failTimeout"] = json!(30);
    l4.post(json!([b]));
    for i in 0..30 {
        assert_eq!(l4.ask(l4.tcp, None, &format!("h{i}")), a.port);
    }
    let refused = l4
        .ng
        .error_log()
        .lines()
        .filter(|l| l.contains("Connection refused") && l.contains(&format!("127.0.0.1:{dead_port}")))
        .count();
    assert!(
        (1..=2).contains(&refused),
        "the dead endpoint was tried {refused} times"
    );
    let health = health_of(&l4.ng, &format!("127.0.0.1:{dead_port}"));
    assert_eq!(health["down"], true, "{health}");
}

/// least_conn counts the open connections of both workers: while
/// connections are held open, each new one goes to the endpoint with
/// fewer; once they close the counts come back to zero.
#[test]
fn least_conn_counts_open_stream_connections() {
    let l4 = L4::start();
    let (a, b) = (TcpEcho::start(), TcpEcho::start());
    let mut bk = backend("tcp-echo", &[a.endpoint(), b.endpoint()]);
    bk["load-balance"] = json!("least_conn");
    l4.post(json!([bk]));
    let mut held = Vec::new();
    let mut open: BTreeMap<u16, usize> = BTreeMap::from([(a.port, 0), (b.port, 0)]);
    for i in 0..8 {
        let s = connect_from(l4.tcp, None).unwrap();
        s.set_read_timeout(Some(STEP)).unwrap();
        (&s).write_all(format!("held-{i}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        BufReader::new(&s).read_line(&mut answer).unwrap();
        let by = answered_by(&answer).unwrap();
        let fewer = if open[&a.port] < open[&b.port] {
            Some(a.port)
        } else if open[&b.port] < open[&a.port] {
            Some(b.port)
        } else {
            None
        };
        if let Some(fewer) = fewer {
            assert_eq!(by, fewer, "connection {i} with {open:?} open");
        }
        *open.get_mut(&by).unwrap() += 1;
        held.push(s);
    }
    assert_eq!(open.values().collect::<Vec<_>>(), [&4, &4]);
    for up in [&a, &b] {
        let h = health_of(&l4.ng, &format!("127.0.0.1:{}", up.port));
        assert_eq!(h["connections"], 4, "{h}");
    }
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    for up in [&a, &b] {
        let endpoint = format!("127.0.0.1:{}", up.port);
        while health_of(&l4.ng, &endpoint)["connections"] != 0 {
            assert!(Instant::now() < deadline, "{}", health_of(&l4.ng, &endpoint));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The stream half keeps routing across `nginx -s reload` (the zone
/// survives), and a change after the reload applies at once.
#[test]
fn stream_routing_survives_a_reload() {
    let l4 = L4::start();
    let (a, b) = (TcpEcho::start(), TcpEcho::start());
    l4.post(json!([backend("tcp-echo", &[a.endpoint()])]));
    assert_eq!(l4.ask(l4.tcp, None, "before"), a.port);
    let before = l4.worker_processes();
    l4.ng.reload();
    assert!(l4.worker_processes().is_disjoint(&before), "new workers");
    for i in 0..4 {
        assert_eq!(l4.ask(l4.tcp, None, &format!("after-{i}")), a.port);
    }
    let r = l4.ng.api(
        "PUT",
        "/configuration/backends/tcp-echo",
        Some(&backend("tcp-echo", &[b.endpoint()]).to_string()),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(l4.ask(l4.tcp, None, "changed"), b.port);
}

/// `/configuration/health`'s entry for `endpoint` (`address:port`).
fn health_of(ng: &Nginx, endpoint: &str) -> Value {
    let all = ng.api("GET", "/configuration/health", None).json();
    all["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["endpoint"] == endpoint)
        .cloned()
        .unwrap_or_else(|| panic!("{endpoint} is not in {all}"))
}

#[test]
fn an_unknown_or_empty_backend_closes_the_connection_at_once() {
    let l4 = L4::start();
    let a = TcpEcho::start();
    l4.post(json!([backend("tcp-echo", &[a.endpoint()]), backend("empty", &[])]));
    for (port, name) in [(l4.unknown, "nobody"), (l4.empty, "empty")] {
        let took = closed_at_once(port).unwrap_or_else(|e| panic!("backend {name}: {e}"));
        assert!(took < Duration::from_secs(1), "backend {name}: closed after {took:?}");
        let line = format!("dynamic_balancer: no endpoints for backend \"{name}\"; closing the connection");
        let log = l4.ng.error_log();
        assert!(
            log.lines().any(|l| l.contains("[warn]") && l.contains(&line)),
            "no warn line for {name}:\n{log}"
        );
    }
    assert_eq!(a.connections(), 0, "nothing reached the other backend");
    assert_eq!(l4.ask(l4.tcp, None, "control"), a.port, "a defined backend still works");
}

#[test]
fn the_upstream_variable_names_the_backend() {
    let l4 = L4::start();
    let (a, b) = (TcpEcho::start(), TcpEcho::start());
    l4.post(json!([
        backend("tcp-echo", &[a.endpoint()]),
        backend("other", &[b.endpoint()])
    ]));
    for i in 0..4 {
        assert_eq!(l4.ask(l4.by_variable, None, &format!("v{i}")), a.port);
    }
    // Where the variable is empty, no backend is named: closed at once.
    let took = closed_at_once(l4.unnamed).unwrap_or_else(|e| panic!("{e}"));
    assert!(took < Duration::from_secs(1));
    assert!(
        l4.ng
            .error_log()
            .contains("dynamic_balancer: no backend named for this server"),
        "{}",
        l4.ng.error_log()
    );
    assert_eq!(b.connections(), 0);
}

/// `upstream-hash-by: $remote_addr`: each client address goes to the
/// endpoint resty.chash's ring gives it, every time; different addresses
/// (clients bound to 127.0.0.2 ... 127.0.0.9) land on different endpoints.
#[test]
fn chash_on_remote_addr_keeps_a_client_on_one_endpoint() {
    let l4 = L4::start();
    let ups: Vec<TcpEcho> = (0..4).map(|_| TcpEcho::start()).collect();
    let eps: Vec<Value> = ups.iter().map(TcpEcho::endpoint).collect();
    let mut b = backend("tcp-echo", &eps);
    b["upstreamHashByConfig"] = json!({"upstream-hash-by": "$remote_addr"});
    l4.post(json!([b]));
    let ids: Vec<String> = ups.iter().map(|u| format!("127.0.0.1:{}", u.port)).collect();
    let ring = ChashRing::new(ids.iter().map(|id| (id.as_str(), 1)));
    let expected = |client: Ipv4Addr| ups[ring.find(client.to_string().as_bytes()).unwrap().0].port;

    let mut chosen = BTreeSet::new();
    for last in 2..=9u8 {
        let client = Ipv4Addr::new(127, 0, 0, last);
        let n = if last == 2 { 20 } else { 4 };
        let got: BTreeSet<u16> = (0..n)
            .map(|i| l4.ask(l4.tcp, Some(client), &format!("{client}-{i}")))
            .collect();
        assert_eq!(got, BTreeSet::from([expected(client)]), "client {client}");
        chosen.insert(expected(client));
    }
    assert!(
        chosen.len() >= 2,
        "eight client addresses all hashed to one endpoint: {chosen:?}"
    );
}

#[test]
fn an_ipv6_endpoint_is_reached_through_the_tcp_balancer() {
    let v6 = match TcpEcho::start_v6() {
        Ok(v6) => v6,
        Err(e) => {
            println!("skipped: [::1] is unavailable here ({e})");
            return;
        }
    };
    let l4 = L4::start();
    let v4 = TcpEcho::start();
    l4.post(json!([backend("tcp-echo", &[v6.endpoint()])]));
    for i in 0..4 {
        assert_eq!(l4.ask(l4.tcp, None, &format!("six-{i}")), v6.port);
    }
    assert_eq!(v6.connections(), 4);
    // Mixed with an IPv4 endpoint, both are used.
    l4.post(json!([backend("tcp-echo", &[v6.endpoint(), v4.endpoint()])]));
    let seen: BTreeSet<u16> = (0..4).map(|i| l4.ask(l4.tcp, None, &format!("mixed-{i}"))).collect();
    assert_eq!(seen, BTreeSet::from([v6.port, v4.port]));
}

/// `proxy_protocol on`: the upstream reads a PROXY v1 line first, whose
/// source is the client's address and port (a client bound to 127.0.0.5,
/// so the address cannot be nginx's own by accident).
#[test]
fn proxy_protocol_tells_the_upstream_the_client_address() {
    let l4 = L4::start();
    let up = TcpEcho::start_proxy_protocol();
    l4.post(json!([backend("pp", &[up.endpoint()])]));
    let client = Ipv4Addr::new(127, 0, 0, 5);
    let mut clients = Vec::new();
    for i in 0..3 {
        let s = connect_from(l4.proxy_protocol, Some(client)).unwrap();
        s.set_read_timeout(Some(STEP)).unwrap();
        (&s).write_all(format!("pp-{i}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        BufReader::new(&s).read_line(&mut answer).unwrap();
        assert_eq!(
            answer,
            format!("{} pp-{i}\n", up.port),
            "the header is not echoed: the upstream consumed it"
        );
        clients.push(s.local_addr().unwrap());
    }
    let headers = up.proxy_headers();
    assert_eq!(headers.len(), 3, "{headers:?}");
    for (client, header) in clients.iter().zip(&headers) {
        let fields: Vec<&str> = header.split(' ').collect();
        let (client_port, server_port) = (client.port().to_string(), l4.proxy_protocol.to_string());
        assert_eq!(
            fields,
            ["PROXY", "TCP4", "127.0.0.5", "127.0.0.1", &client_port, &server_port],
            "{header:?}"
        );
    }
}

/// A reload into a configuration whose stream `dynamic_balancer` has no
/// zone must be refused like any bad reload: the master logs the error and
/// keeps serving the old configuration.
#[test]
fn a_reload_without_the_zone_keeps_the_running_configuration() {
    /// If the master (`.0`) died, SIGQUIT to the workers (`.1`) it left
    /// behind, whatever the outcome of the test.
    struct Orphans(u32, BTreeSet<u32>);
    impl Drop for Orphans {
        fn drop(&mut self) {
            if running(self.0) {
                return; // The harness stops a live master and its workers.
            }
            for pid in self.1.iter().filter(|p| running(**p)) {
                // SAFETY: kill(2) on a worker of the nginx this test started.
                unsafe { libc::kill(*pid as libc::pid_t, libc::SIGQUIT) };
            }
        }
    }
    let l4 = L4::start();
    let a = TcpEcho::start();
    l4.post(json!([backend("tcp-echo", &[a.endpoint()])]));
    assert_eq!(l4.ask(l4.tcp, None, "before"), a.port);
    let _orphans = Orphans(l4.ng.pid(), l4.worker_processes());
    let bad = format!(
        "{}events {{ worker_connections 64; }}\nstream {{ upstream u {{ dynamic_balancer; }} \
         server {{ listen 127.0.0.1:{}; dynamic_balancer_backend tcp-echo; proxy_pass u; }} }}\n",
        tests::process::prelude(),
        l4.tcp
    );
    std::fs::write(l4.ng.prefix().join("nginx.conf"), bad).unwrap();
    // SAFETY: SIGHUP to the master this test started.
    unsafe { libc::kill(l4.ng.pid() as libc::pid_t, libc::SIGHUP) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !l4.ng.error_log().contains("add \"dynamic_balancer_zone\"") {
        assert!(
            Instant::now() < deadline,
            "the reload was not refused:\n{}",
            l4.ng.error_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        running(l4.ng.pid()),
        "the master exited on a bad reload:\n{}",
        l4.ng.error_log()
    );
    assert_eq!(
        l4.ask(l4.tcp, None, "after"),
        a.port,
        "the old configuration still serves"
    );
}

/// Whether `pid` exists and is not a zombie.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// `nginx -t` on `stream{}` (after the prelude) and `http{}` blocks: its
/// success and what it printed.
fn nginx_t(body: &str) -> (bool, String) {
    let conf = format!("events {{ worker_connections 64; }}\n{body}\n");
    let dir = prefix_with(&conf);
    let out = nginx_command(dir.path()).arg("-t").output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn configuration_errors_are_refused() {
    let port = free_port();
    let stream = |upstream: &str| {
        format!(
            "stream {{ upstream u {{ {upstream} }} server {{ listen 127.0.0.1:{port}; dynamic_balancer_backend x; proxy_pass u; }} }}"
        )
    };
    let zone = "http { dynamic_balancer_zone 8m; }";

    // The control: with the http{} zone this configuration is valid.
    let (ok, text) = nginx_t(&format!("{zone}\n{}", stream("dynamic_balancer;")));
    assert!(ok, "{text}");

    // No zone to route by: no http{} at all, or an http{} without one.
    for http in ["", "http { access_log off; }"] {
        let (ok, text) = nginx_t(&format!("{http}\n{}", stream("dynamic_balancer;")));
        assert!(!ok, "accepted without a zone ({http:?}):\n{text}");
        assert!(text.contains("dynamic_balancer_zone"), "{text}");
        assert!(text.contains("[emerg]"), "{text}");
    }

    // A balancing method after dynamic_balancer replaces it: refused, and
    // the module's check names the problem (its placeholder server has an
    // address, so least_conn's own init does not fail first).
    let (ok, text) = nginx_t(&format!("{zone}\n{}", stream("dynamic_balancer; least_conn;")));
    assert!(!ok, "dynamic_balancer; least_conn; was accepted:\n{text}");
    assert!(
        text.contains("another balancing method replaced \"dynamic_balancer\" in upstream \"u\""),
        "{text}"
    );
    // With a server of its own the upstream gets past nginx's own check,
    // and the module's check names the problem.
    let (ok, text) = nginx_t(&format!(
        "{zone}\n{}",
        stream("server 127.0.0.1:1; dynamic_balancer; least_conn;")
    ));
    assert!(!ok, "{text}");
    assert!(
        text.contains("another balancing method replaced \"dynamic_balancer\" in upstream \"u\""),
        "{text}"
    );
    // A method before it is refused by the directive itself.
    let (ok, text) = nginx_t(&format!("{zone}\n{}", stream("least_conn; dynamic_balancer;")));
    assert!(!ok, "{text}");
    assert!(
        text.contains("\"dynamic_balancer\" cannot be combined with another balancing method"),
        "{text}"
    );
}
