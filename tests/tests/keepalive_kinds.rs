//! Upstream keepalive never hands a request a connection of another kind.
//!
//! One upstream port serves every kind (the mixed upstream: HTTP/1.1, h2c
//! gRPC, TLS by server name, WebSocket), as argocd-server serves HTTP/1.1
//! and gRPC on one port. With one balancer upstream for all of them, a
//! gRPC request got the cached HTTP/1.1 connection, and the module then
//! looped on new connections (it left `pc->cached` set, so each looked
//! cached and each failure granted another try) until the client gave up.
//!
//! - module alone, one upstream used by `proxy_pass` and `grpc_pass`: a
//!   cached connection of the wrong kind costs one try, as in stock nginx,
//!   and the gRPC request is answered at once;
//! - through the controller, one balancer upstream per kind: HTTP and gRPC
//!   on one endpoint port (the argocd case), HTTP and HTTPS, two HTTPS
//!   backends with different server names on one address, GRPCS, and
//!   WebSocket upgrades beside plain requests, under a bounded mixed load:
//!   no request hangs or fails, each is served over a connection of its
//!   own kind, and connections are kept alive within each kind.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::controller::{ingress, service, Controller, INGRESS_CLASS};
use tests::mixed_upstream::MixedUpstream;
use tests::{backend, free_port, Nginx};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// An HTTP/2 (prior knowledge) channel to nginx at `port` with
/// `:authority` `host`.
fn channel(rt: &tokio::runtime::Runtime, port: u16, host: &str) -> Channel {
    rt.block_on(async {
        Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .origin(format!("http://{host}").parse().unwrap())
            .timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("HTTP/2 connection to nginx")
    })
}

/// One unary gRPC `Check` of the service `whoami`; `Err` carries why.
fn grpc_check(rt: &tokio::runtime::Runtime, ch: &Channel) -> Result<(), String> {
    rt.block_on(async {
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            HealthClient::new(ch.clone()).check(HealthCheckRequest {
                service: "whoami".into(),
            }),
        )
        .await
        .map_err(|_| "hung for 5 s".to_string())?
        .map_err(|s| format!("{s:?}"))?;
        (answer.into_inner().status == 1)
            .then_some(())
            .ok_or_else(|| "not SERVING".to_string())
    })
}

/// GET `path` on nginx at `port` with `host`, within 5 s: the mixed
/// upstream's description of the connection it came over.
fn get_json(port: u16, host: &str, path: &str) -> Result<Value, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut r = agent
        .get(&format!("http://127.0.0.1:{port}{path}"))
        .header("Host", host)
        .call()
        .map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let body = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("{status} {body}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
}

/// A WebSocket session through nginx: connect, two echoes, close.
fn websocket(port: u16, host: &str) -> Result<(), String> {
    let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let request = tungstenite::client::IntoClientRequest::into_client_request(format!("ws://{host}/ws"))
        .map_err(|e| e.to_string())?;
    let (mut ws, resp) = tungstenite::client::client(request, tcp).map_err(|e| e.to_string())?;
    if resp.status().as_u16() != 101 {
        return Err(format!("handshake answered {}", resp.status()));
    }
    for text in ["one", "two"] {
        ws.send(tungstenite::Message::text(text)).map_err(|e| e.to_string())?;
        match ws.read().map_err(|e| e.to_string())? {
            tungstenite::Message::Text(t) if t.as_str() == text => {}
            other => return Err(format!("echo of {text}: {other:?}")),
        }
    }
    let _ = ws.close(None);
    Ok(())
}

/// The module alone, with one upstream that both `proxy_pass` and
/// `grpc_pass` use (a configuration written by hand): the gRPC request
/// that gets the cached HTTP/1.1 connection fails on it once, as in stock
/// nginx, and is answered at once: over a new connection when nginx holds
/// its whole body, else with 502 (nginx cannot replay a body it has begun
/// to stream). It never hangs, and the next requests are served.
#[test]
fn a_cached_connection_of_another_kind_costs_one_try() {
    let up = MixedUpstream::start();
    let grpc_port = free_port();
    let ng = Nginx::builder()
        .upstream_extra("keepalive 8;")
        .http_extra(&format!(
            "server {{ listen 127.0.0.1:{grpc_port}; http2 on;
                 location / {{ dynamic_balancer_backend g; grpc_pass grpc://upstream_balancer; }} }}"
        ))
        .start();
    let body = json!([backend("h", &[up.endpoint()]), backend("g", &[up.endpoint()])]);
    assert_eq!(ng.post_backends(&body).status, 201);
    for _ in 0..3 {
        assert_eq!(ng.get("h").status, 200);
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ch = channel(&rt, grpc_port, "g.test");
    let started = Instant::now();
    let first = grpc_check(&rt, &ch);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "answered after {took:?}: {first:?}");
    if let Err(e) = &first {
        assert!(e.contains("502"), "{e}");
    }
    let errors = ng.error_log().matches("no connection data found").count();
    assert!(errors <= 1, "{errors} failed tries:\n{}", ng.error_log());
    // The connection of the wrong kind is gone: later gRPC requests are
    // served, over a kept-alive gRPC connection.
    for _ in 0..5 {
        grpc_check(&rt, &ch).unwrap();
    }
    assert_eq!(ng.error_log().matches("no connection data found").count(), errors);
    assert_eq!(up.connections().get("plain/h2"), Some(&1), "{:?}", up.connections());
}

const KINDS: [&str; 7] = ["http", "https", "sni-a", "sni-b", "grpc", "grpcs", "ws"];

#[test]
fn every_kind_of_connection_is_reused_only_by_its_kind() {
    let up = MixedUpstream::start();
    let tls = |sni: Option<&'static str>| {
        let mut a: Vec<(&str, &str)> = vec![("backend-protocol", "HTTPS")];
        if let Some(name) = sni {
            a.extend([("proxy-ssl-server-name", "on"), ("proxy-ssl-name", name)]);
        }
        a
    };
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc.yaml", service("mixed", &[up.port])),
            ("http.yaml", ingress("http", "http.test", "/", "mixed", &[])),
            ("ws.yaml", ingress("ws", "ws.test", "/", "mixed", &[])),
            ("https.yaml", ingress("https", "https.test", "/", "mixed", &tls(None))),
            (
                "a.yaml",
                ingress("sni-a", "a.test", "/", "mixed", &tls(Some("a.internal.example"))),
            ),
            (
                "b.yaml",
                ingress("sni-b", "b.test", "/", "mixed", &tls(Some("b.internal.example"))),
            ),
            (
                "grpc.yaml",
                ingress("grpc", "grpc.test", "/", "mixed", &[("backend-protocol", "GRPC")]),
            ),
            (
                "grpcs.yaml",
                ingress(
                    "grpcs",
                    "grpcs.test",
                    "/",
                    "mixed",
                    &[
                        ("backend-protocol", "GRPCS"),
                        ("proxy-ssl-server-name", "on"),
                        ("proxy-ssl-name", "a.internal.example"),
                    ],
                ),
            ),
        ],
        &[],
    );
    let port = c.http_port;
    // The argocd sequence first: HTTP requests, then gRPC on the same
    // endpoint port.
    for _ in 0..3 {
        get_json(port, "http.test", "/").unwrap();
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    grpc_check(&rt, &channel(&rt, port, "grpc.test")).expect("gRPC after HTTP answers");
    assert!(started.elapsed() < Duration::from_secs(2));

    // A bounded mixed load: 4 clients, each going round every kind
    // (KEEPALIVE_ROUNDS=1750 makes about 1,000 requests of each kind).
    let rounds: usize = std::env::var("KEEPALIVE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
        .min(100_000);
    let clients = 4usize;
    let failures = std::sync::Mutex::new(Vec::<String>::new());
    let requests: BTreeMap<&str, AtomicUsize> = KINDS.iter().map(|k| (*k, AtomicUsize::new(0))).collect();
    let deadline = Instant::now() + Duration::from_secs(120 + rounds as u64 / 10);
    std::thread::scope(|s| {
        for t in 0..clients {
            let (failures, requests) = (&failures, &requests);
            s.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let grpc = channel(&rt, port, "grpc.test");
                let grpcs = channel(&rt, port, "grpcs.test");
                for round in 0..rounds {
                    if Instant::now() > deadline {
                        failures.lock().unwrap().push("the load ran past its deadline".into());
                        return;
                    }
                    let kind = KINDS[(round + t) % KINDS.len()];
                    let expect = |host: &str, tls: bool, sni: Option<&str>| -> Result<(), String> {
                        let v = get_json(port, host, "/")?;
                        if v["tls"] != tls || v["sni"].as_str() != sni || v["proto"] != "HTTP/1.1" {
                            return Err(format!("{host} came over {v}"));
                        }
                        Ok(())
                    };
                    let outcome = match kind {
                        "http" => expect("http.test", false, None),
                        "https" => expect("https.test", true, None),
                        "sni-a" => expect("a.test", true, Some("a.internal.example")),
                        "sni-b" => expect("b.test", true, Some("b.internal.example")),
                        "grpc" => grpc_check(&rt, &grpc),
                        "grpcs" => grpc_check(&rt, &grpcs),
                        _ => websocket(port, "ws.test"),
                    };
                    requests[kind].fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = outcome {
                        failures.lock().unwrap().push(format!("{kind}: {e}"));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed: {failures:?}\n{}",
        failures.len(),
        c.log()
    );
    let error_log = std::fs::read_to_string(c.dir.path().join("nginx/logs/error.log")).unwrap_or_default();
    assert!(!error_log.contains("no connection data found"), "{error_log}");

    // Connections per kind: reused, not one per request. WebSocket
    // sessions each keep their connection (it is upgraded), so plain
    // HTTP/1.1 connections are at most one per session plus a few.
    let opened = up.connections();
    let count = |k: &str| opened.get(k).copied().unwrap_or(0);
    let sent = |k: &str| requests[k].load(Ordering::Relaxed);
    eprintln!(
        "requests per kind: {:?}",
        requests
            .iter()
            .map(|(k, v)| (*k, v.load(Ordering::Relaxed)))
            .collect::<Vec<_>>()
    );
    eprintln!("upstream connections opened per kind: {opened:?}");
    for (kind, label) in [
        ("http", "plain/h1"),
        ("https", "tls/h1"),
        ("sni-a", "tls:a.internal.example/h1"),
        ("sni-b", "tls:b.internal.example/h1"),
        ("grpc", "plain/h2"),
        ("grpcs", "tls:a.internal.example/h2"),
    ] {
        // Plain HTTP/1.1 connections also carry the WebSocket sessions,
        // one each.
        let upgraded = if kind == "http" { sent("ws") } else { 0 };
        eprintln!(
            "{kind}: {:.1} connections per 1,000 requests",
            count(label).saturating_sub(upgraded) as f64 * 1000.0 / sent(kind).max(1) as f64
        );
    }
    let few = |k: &str, n: usize| assert!(count(k) >= 1 && count(k) <= n, "{k}: {opened:?}");
    // Each of 2 workers keeps up to 4 connections (one per client) busy
    // at once: 8 at most per kind, and far fewer than the requests.
    few("tls/h1", 8);
    few("tls:a.internal.example/h1", 8);
    few("tls:b.internal.example/h1", 8);
    few("plain/h2", 8);
    few("tls:a.internal.example/h2", 8);
    assert!(count("plain/h1") <= sent("ws") + 8, "{opened:?}");
    for k in ["sni-a", "sni-b", "https", "grpc", "grpcs"] {
        assert!(sent(k) >= 30, "{k}: {}", sent(k));
    }
}
