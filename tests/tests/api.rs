//! The /configuration API against a real nginx.

use std::io::{Read, Write};
use std::net::TcpStream;

use serde_json::{json, Value};
use tests::{backend, Nginx, Upstream};

/// The body of ingress-nginx's own example, posted unchanged.
#[test]
fn accepts_ingress_nginx_payload_unchanged() {
    let ng = Nginx::builder().start();
    let body = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/ingress-nginx-backends.json"
    ))
    .unwrap();
    let r = ng.api("POST", "/configuration/backends", Some(&body));
    assert_eq!(r.status, 201, "{}", r.body);
    let stored = ng.api("GET", "/configuration/backends", None).json();
    let names: Vec<&str> = stored
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["shop-web-80", "shop-web-canary-80", "upstream-default-backend"]);
    assert_eq!(
        stored[0]["endpoints"][1],
        json!({"address": "fd00:10:244::7", "port": "8080"})
    );
    assert_eq!(
        stored[0]["sessionAffinityConfig"]["cookieSessionAffinity"]["name"],
        "INGRESSCOOKIE"
    );
    assert_eq!(stored[0]["alternativeBackends"], json!(["shop-web-canary-80"]));
    let status = ng.status();
    assert_eq!(
        (status["backends"].as_u64(), status["endpoints"].as_u64()),
        (Some(3), Some(4))
    );
}

#[test]
fn post_replaces_all_and_bumps_generation() {
    let ng = Nginx::builder().start();
    let (a, b) = (Upstream::start(), Upstream::start());
    let r = ng.post_backends(&json!([
        backend("one", &[a.endpoint()]),
        backend("two", &[b.endpoint()])
    ]));
    assert_eq!((r.status, r.json()), (201, json!({"generation": 1})));
    assert_eq!(ng.get("one").body, a.identity);
    assert_eq!(ng.get("two").body, b.identity);

    let r = ng.post_backends(&json!([backend("two", &[a.endpoint()])]));
    assert_eq!((r.status, r.json()), (201, json!({"generation": 2})));
    assert_eq!(ng.get("one").status, 503, "backends absent from a POST are removed");
    assert_eq!(ng.get("two").body, a.identity);
    let status = ng.status();
    assert_eq!(status["generation"], 2);
    assert_eq!(status["backends"], 1);
    assert!(status["zone"]["used"].as_u64().unwrap() > 0);
    assert_eq!(status["zone"]["size"], 32 * 1024 * 1024);
}

#[test]
fn single_backend_get_put_delete() {
    let ng = Nginx::builder().start();
    let (a, b) = (Upstream::start(), Upstream::start());
    let path = "/configuration/backends/web-80";

    assert_eq!(ng.api("GET", path, None).status, 404);
    let r = ng.api("PUT", path, Some(&json!({"endpoints": [a.endpoint()]}).to_string()));
    assert_eq!(r.status, 201, "created: {}", r.body);
    assert_eq!(ng.get("web-80").body, a.identity);

    let r = ng.api("PUT", path, Some(&backend("web-80", &[b.endpoint()]).to_string()));
    assert_eq!(r.status, 200, "replaced: {}", r.body);
    assert_eq!(ng.get("web-80").body, b.identity);
    let got = ng.api("GET", path, None);
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["endpoints"], json!([b.endpoint()]));

    let r = ng.api("PUT", path, Some(&backend("other", &[a.endpoint()]).to_string()));
    assert_eq!((r.status, r.json()["path"].as_str()), (400, Some("name")));

    let r = ng.api("DELETE", path, None);
    assert_eq!((r.status, r.body.as_str()), (204, ""));
    assert_eq!(ng.api("DELETE", path, None).status, 404);
    assert_eq!(ng.get("web-80").status, 503);
    assert_eq!(ng.status()["generation"], 3, "three successful writes");
}

#[test]
fn unknown_routes_and_wrong_methods() {
    let ng = Nginx::builder().start();
    for path in [
        "/configuration",
        "/configuration/backendsx",
        "/configuration/backends/a/b",
        "/configuration/certs",
    ] {
        let r = ng.api("GET", path, None);
        assert_eq!(r.status, 404, "{path}");
        assert!(r.json()["error"].is_string());
    }
    for (method, path, allow) in [
        ("PUT", "/configuration/backends", "GET, POST"),
        ("DELETE", "/configuration/backends", "GET, POST"),
        ("PATCH", "/configuration/backends/x", "GET, PUT, DELETE"),
        ("POST", "/configuration/backends/x", "GET, PUT, DELETE"),
        ("POST", "/configuration/status", "GET"),
    ] {
        let r = ng.api(method, path, Some("{}"));
        assert_eq!(r.status, 405, "{method} {path}");
        assert_eq!(r.header("allow"), Some(allow), "{method} {path}");
        assert_eq!(r.header("content-type"), Some("application/json"));
    }
}

/// Every refused write leaves the running configuration fully in force.
#[test]
fn bad_writes_are_refused_whole() {
    let ng = Nginx::builder().start();
    let a = Upstream::start();
    assert_eq!(ng.post_backends(&json!([backend("live", &[a.endpoint()])])).status, 201);

    let ep = |address: &str, port: Value| json!({"address": address, "port": port});
    let cases: Vec<(String, &str)> = vec![
        ("[{".into(), ""),
        ("not json".into(), ""),
        (r#"{"name":"x"}"#.into(), ""),
        (json!([{"endpoints": []}]).to_string(), "[0]"),
        (json!([backend("", &[])]).to_string(), "[0].name"),
        (json!([backend("a", &[]), backend("a", &[])]).to_string(), "[1].name"),
        (
            json!([backend("a", &[ep("10.0.0.300", json!("80"))])]).to_string(),
            "[0].endpoints[0].address",
        ),
        (
            json!([backend("a", &[ep("example.com", json!("80"))])]).to_string(),
            "[0].endpoints[0].address",
        ),
        (
            json!([
                backend("a", &[]),
                backend("b", &[ep("::1", json!("80")), ep("::1", json!("80x"))])
            ])
            .to_string(),
            "[1].endpoints[1].port",
        ),
        (
            json!([backend("a", &[ep("::1", json!("0"))])]).to_string(),
            "[0].endpoints[0].port",
        ),
        (
            json!([backend("a", &[ep("::1", json!(65536))])]).to_string(),
            "[0].endpoints[0].port",
        ),
        (json!([{"name": "a", "endpoints": {}}]).to_string(), "[0].endpoints"),
        (json!([{"name": 7}]).to_string(), "[0].name"),
        (
            json!([{"name": "a", "trafficShapingPolicy": {"weight": "x"}}]).to_string(),
            "[0].trafficShapingPolicy.weight",
        ),
    ];
    for (body, path) in &cases {
        let r = ng.api("POST", "/configuration/backends", Some(body));
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let err = r.json();
        assert_eq!(err["path"].as_str().unwrap_or(""), *path, "{body}: {err}");
        assert!(!err["error"].as_str().unwrap().is_empty());
        assert_eq!(ng.get("live").body, a.identity, "routing intact after {body}");
    }
    let r = ng.api(
        "PUT",
        "/configuration/backends/live",
        Some(r#"{"endpoints":[{"address":"::1","port":"x"}]}"#),
    );
    assert_eq!((r.status, r.json()["path"].as_str()), (400, Some("endpoints[0].port")));
    assert_eq!(ng.get("live").body, a.identity);
    assert_eq!(ng.status()["generation"], 1, "no refused write bumped the generation");
}

/// POSTs `body` chunked, in pieces of `size` (2 ms apart when `slow`, so
/// that nginx reads it asynchronously); returns the raw answer.
fn post_chunked(port: u16, body: &str, size: usize, slow: bool) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head =
        "POST /configuration/backends HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    s.write_all(head.as_bytes()).unwrap();
    for part in body.as_bytes().chunks(size) {
        write!(s, "{:x}\r\n", part.len()).unwrap();
        s.write_all(part).unwrap();
        s.write_all(b"\r\n").unwrap();
        if slow {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    s.write_all(b"0\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
}

fn endpoints(i: usize, n: usize) -> Vec<Value> {
    (0..n)
        .map(|j| json!({"address": format!("10.{}.{}.{}", i / 250, i % 250, j % 250 + 1), "port": (8080 + j / 250).to_string()}))
        .collect()
}

fn many_backends(n: usize, per_backend: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| backend(&format!("ns-svc-{i}-80"), &endpoints(i, per_backend)))
            .collect(),
    )
}

#[test]
fn oversize_body_gets_json_413() {
    let ng = Nginx::builder()
        .api_extra("client_max_body_size 4k; client_body_buffer_size 4k;")
        .start();
    let a = Upstream::start();
    assert_eq!(ng.post_backends(&json!([backend("live", &[a.endpoint()])])).status, 201);
    let big = many_backends(40, 2).to_string();
    assert!(big.len() > 4096);
    let r = ng.api("POST", "/configuration/backends", Some(&big));
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.json()["error"].as_str().unwrap().contains("client_max_body_size"));

    // Chunked: no Content-Length to check up front.
    let answer = post_chunked(ng.api_port, &big, 1000, false);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}\n{}", ng.error_log());

    // Chunked and slow, so nginx reads it asynchronously: the limit still
    // holds, nothing past it is stored, and the answer is still JSON.
    let big = many_backends(400, 2).to_string();
    let answer = post_chunked(ng.api_port, &big, 4000, true);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}\n{}", ng.error_log());
    assert!(answer.contains("client_max_body_size"), "{answer}");

    assert_eq!(ng.get("live").body, a.identity);
    assert_eq!(ng.status()["generation"], 1);
}

/// A slow chunked body under the limit is read and applied.
#[test]
fn slow_chunked_body_within_the_limit_is_applied() {
    let ng = Nginx::builder()
        .api_extra("client_max_body_size 1m; client_body_buffer_size 4k;")
        .start();
    let body = many_backends(100, 2).to_string();
    let answer = post_chunked(ng.api_port, &body, 3000, true);
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}\n{}", ng.error_log());
    assert_eq!(ng.status()["backends"], 100);
}

#[test]
fn body_spooled_to_a_temp_file_is_read() {
    let ng = Nginx::builder()
        .api_extra("client_max_body_size 10m; client_body_buffer_size 1k;")
        .start();
    let body = many_backends(300, 3);
    let text = body.to_string();
    assert!(text.len() > 50_000);
    let r = ng.api("POST", "/configuration/backends", Some(&text));
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(
        ng.error_log().contains("buffered to a temporary file"),
        "the body did go to a file"
    );
    let stored = ng.api("GET", "/configuration/backends", None).json();
    assert_eq!(stored.as_array().unwrap().len(), 300);
    assert_eq!(ng.status()["endpoints"], 900);
}

#[test]
fn full_zone_gets_507_and_keeps_config() {
    let ng = Nginx::builder().zone("128k").start();
    let a = Upstream::start();
    assert_eq!(ng.post_backends(&json!([backend("live", &[a.endpoint()])])).status, 201);
    let r = ng.post_backends(&many_backends(400, 10));
    assert_eq!(r.status, 507, "{}", r.body);
    assert!(r.json()["error"].as_str().unwrap().contains("zone is full"));
    assert_eq!(ng.get("live").body, a.identity);
    let status = ng.status();
    assert_eq!(
        (status["generation"].as_u64(), status["backends"].as_u64()),
        (Some(1), Some(1))
    );
    // The failed write freed what it allocated: a write that fits still works.
    let r = ng.post_backends(&json!([
        backend("live", &[a.endpoint()]),
        backend("more", &[a.endpoint()])
    ]));
    assert_eq!(r.status, 201, "{}", r.body);
    let r = ng.api(
        "PUT",
        "/configuration/backends/huge",
        Some(&backend("huge", &endpoints(0, 4000)).to_string()),
    );
    assert_eq!(r.status, 507, "{}", r.body);
    assert_eq!(ng.get("more").body, a.identity);
}
