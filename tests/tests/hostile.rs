//! The module against hostile inputs and faults: who may reach the API,
//! names that resolve to the local host, sizes that would allocate without
//! bound, and requests that vanish while their write is queued.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};
use tests::{backend, Nginx, Upstream};

const TOKEN: &str = "s3cret-token-0123456789";

#[test]
fn with_a_token_every_api_request_must_present_it() {
    let ng = Nginx::builder().api_token(TOKEN).start();
    let up = Upstream::start();
    for (method, path, body) in [
        ("GET", "/configuration/backends", None),
        ("GET", "/configuration/status", None),
        ("POST", "/configuration/backends", Some("[]")),
        ("DELETE", "/configuration/backends/x", None),
    ] {
        for auth in [None, Some("Bearer wrong-token-0123456789"), Some("Basic czNjcmV0")] {
            let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", *a)).collect();
            let r = ng.api_as(method, path, body, &headers);
            assert_eq!(r.status, 401, "{method} {path} with {auth:?}: {}", r.body);
            assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"dynamic_balancer\""));
            assert!(r.json()["error"].as_str().unwrap().contains("bearer token"));
        }
    }
    let r = ng.post_backends(&json!([backend("web", &[up.endpoint()])]));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(ng.get("web").body, up.identity);
    let everything = [
        ng.api("GET", "/configuration/backends", None).body,
        ng.api("GET", "/configuration/status", None).body,
        ng.api("GET", "/configuration/health", None).body,
        ng.error_log(),
    ];
    for text in everything {
        assert!(!text.contains(TOKEN), "the token leaked: {text}");
    }
}

#[test]
fn the_api_reads_its_token_from_a_file_and_refuses_weak_ones() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let ng = Nginx::builder()
        .api_extra(&format!("dynamic_balancer_api_token_file {};", file.display()))
        .start_with_token(TOKEN);
    assert_eq!(ng.api_as("GET", "/configuration/status", None, &[]).status, 401);
    assert_eq!(ng.api("GET", "/configuration/status", None).status, 200);

    let weak = Nginx::builder()
        .api_extra("dynamic_balancer_api_token short;")
        .test_config();
    let stderr = String::from_utf8_lossy(&weak.stderr);
    assert!(!weak.status.success());
    assert!(stderr.contains("at least 16 characters"), "{stderr}");
    let missing = Nginx::builder()
        .api_extra("dynamic_balancer_api_token_file /nonexistent/token;")
        .test_config();
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read the API token file"));
}

#[test]
fn an_open_api_on_a_public_address_is_refused_at_load_time() {
    let out = Nginx::builder()
        .http_extra("server { listen 0.0.0.0:1; location /c { dynamic_balancer_api; } }")
        .test_config();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("without a token is reachable on 0.0.0.0:1"), "{stderr}");
    let with_token = Nginx::builder()
        .http_extra(&format!(
            "server {{ listen 0.0.0.0:1; location /c {{ dynamic_balancer_api; dynamic_balancer_api_token {TOKEN}; }} }}"
        ))
        .test_config();
    assert!(
        with_token.status.success(),
        "{}",
        String::from_utf8_lossy(&with_token.stderr)
    );
}

#[test]
fn the_api_serves_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let ng = Nginx::builder()
        .http_extra(&format!(
            "server {{ listen unix:{}; location /configuration {{ dynamic_balancer_api; }} }}",
            sock.display()
        ))
        .start();
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.write_all(b"GET /configuration/status HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"generation\""), "{answer}");
    drop(ng);
}

/// A tenant's backend that points at the API port: the attack the issue
/// describes, reproduced with the module alone.
#[test]
fn requests_through_the_proxy_never_reach_an_api_handler() {
    let ng = Nginx::builder()
        .location_extra("proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;")
        .http_extra("server { listen 127.0.0.1:1; location /configuration { dynamic_balancer_api; } location /sneak { rewrite ^ /configuration/backends last; } }")
        .start();
    let up = Upstream::start();
    let evil = json!({"address": "127.0.0.1", "port": ng.api_port.to_string()});
    let r = ng.post_backends(&json!([backend("evil", &[evil]), backend("web", &[up.endpoint()])]));
    assert_eq!(r.status, 201, "{}", r.body);
    let hijack = ng.get_path_with("/configuration/backends", &[("X-Backend", "evil")]);
    assert_eq!(hijack.status, 403, "{}", hijack.body);
    assert!(hijack.body.contains("proxied"), "{}", hijack.body);
    // Any proxy header, from any client, is refused.
    for h in ["X-Forwarded-For", "Forwarded", "X-Real-IP", "Via"] {
        let r = ng.api_as("GET", "/configuration/backends", None, &[(h, "203.0.113.7")]);
        assert_eq!(r.status, 403, "{h}");
    }
    // Nothing was changed, and the victim still routes.
    assert_eq!(ng.get("web").body, up.identity);
    assert!(ng.error_log().contains("it came through a proxy"));
}

#[test]
fn an_internal_redirect_never_reaches_an_api_handler() {
    let port = tests::free_port();
    let ng = Nginx::builder()
        .http_extra(&format!(
            "server {{ listen 127.0.0.1:{port}; location /configuration {{ dynamic_balancer_api; }} location /sneak {{ rewrite ^ /configuration/status last; }} }}"
        ))
        .start();
    assert_eq!(ng.get_port(port, "/configuration/status").status, 200);
    let r = ng.get_port(port, "/sneak");
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("internal redirect"), "{}", r.body);
}

/// Names of the local host, as literals, as reserved names, and as DNS
/// names that only resolve to it.
#[test]
fn external_names_that_reach_the_local_host_are_refused() {
    let ng = Nginx::builder().start();
    let ext = |host: &str| {
        json!({"name": "ext", "service": {"spec": {"type": "ExternalName"}},
               "endpoints": [{"address": host, "port": ng.api_port.to_string()}]})
    };
    // 0x7f000001 passes as a DNS name but getaddrinfo reads it as 127.0.0.1.
    let mut hosts = vec![
        "localhost",
        "LOCALHOST.",
        "a.localhost",
        "127.0.0.1",
        "127.9.9.9",
        "::1",
        "169.254.169.254",
        "0.0.0.0",
        "0x7f000001",
    ];
    let hosts_file = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    let alias = hosts_file
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.first().is_some_and(|a| a.starts_with("127.")))
        .flat_map(|f| f.into_iter().skip(1).map(str::to_string).collect::<Vec<_>>())
        .find(|n| !n.contains("localhost") && n.contains(char::is_alphabetic));
    let alias = alias.unwrap_or_else(|| "localhost".into());
    hosts.push(&alias);
    for host in &hosts {
        let r = ng.api("PUT", "/configuration/backends/ext", Some(&ext(host).to_string()));
        assert_eq!(r.status, 400, "{host}: {}", r.body);
        assert_eq!(r.json()["path"], "endpoints[0].address", "{host}");
        let r = ng.post_backends(&json!([ext(host)]));
        assert_eq!(r.status, 400, "{host}: {}", r.body);
    }
    let r = ng.api(
        "PUT",
        "/configuration/backends/ext",
        Some(&ext("0x7f000001").to_string()),
    );
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("resolves to 127.0.0.1, a loopback address"));
    assert_eq!(ng.status()["backends"], 0, "nothing was stored");
    // A name that resolves elsewhere is stored with its address.
    let r = ng.api(
        "PUT",
        "/configuration/backends/ext",
        Some(&ext("0x0a000001").to_string()),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let health = ng.api("GET", "/configuration/health", None).json();
    assert_eq!(health["endpoints"][0]["endpoint"], format!("10.0.0.1:{}", ng.api_port));
}

#[test]
fn sizes_that_would_allocate_without_bound_get_400() {
    let ng = Nginx::builder().start();
    let up = Upstream::start();
    let mut subset = backend("s", &[up.endpoint()]);
    subset["upstreamHashByConfig"] = json!({"upstream-hash-by": "$uri", "upstream-hash-by-subset": true,
        "upstream-hash-by-subset-size": 1u64 << 40});
    let mut heavy = backend(
        "h",
        &[json!({"address": "10.0.0.1", "port": "80", "weight": 100_000_000})],
    );
    heavy["upstreamHashByConfig"] = json!({"upstream-hash-by": "$uri"});
    let mut cookie = backend("c", &[up.endpoint()]);
    cookie["sessionAffinityConfig"] = json!({"name": "cookie",
        "cookieSessionAffinity": {"name": "c", "path": "/\r\nSet-Cookie: admin=1"}});
    for (b, path) in [
        (subset, "[0].upstreamHashByConfig.upstream-hash-by-subset-size"),
        (heavy, "[0].endpoints[0].weight"),
        (cookie, "[0].sessionAffinityConfig.cookieSessionAffinity.path"),
    ] {
        let r = ng.post_backends(&json!([b]));
        assert_eq!((r.status, r.json()["path"].as_str()), (400, Some(path)), "{}", r.body);
    }
    assert_eq!(ng.status()["generation"], 0);
}

#[test]
fn subset_hashing_with_fewer_endpoints_than_the_subset_size_serves() {
    let ng = Nginx::builder().start();
    let up = Upstream::start();
    let mut b = backend("s", &[up.endpoint()]);
    // ingress-nginx's default subset size is 3; one endpoint used to panic.
    b["upstreamHashByConfig"] = json!({"upstream-hash-by": "$request_uri", "upstream-hash-by-subset": true,
        "upstream-hash-by-subset-size": 3});
    assert_eq!(ng.post_backends(&json!([b])).status, 201);
    for _ in 0..5 {
        let r = ng.get("s");
        assert_eq!((r.status, r.body.as_str()), (200, up.identity.as_str()));
    }
    assert!(!ng.error_log().contains("panic"), "{}", ng.error_log());
}

#[test]
fn an_upstream_needs_no_placeholder_server() {
    let ng = Nginx::builder()
        .http_extra(
            "upstream bare { dynamic_balancer; } server { listen 127.0.0.1:1; location / { proxy_pass http://bare; } }",
        )
        .start();
    let up = Upstream::start();
    assert_eq!(ng.post_backends(&json!([backend("web", &[up.endpoint()])])).status, 201);
    assert_eq!(ng.get("web").body, up.identity);
}

/// A 507 must leave nothing behind: not even the shared state of the
/// endpoints it would have added.
#[test]
fn a_full_zone_leaves_no_endpoint_state() {
    let ng = Nginx::builder().zone("128k").start();
    let up = Upstream::start();
    assert_eq!(ng.post_backends(&json!([backend("web", &[up.endpoint()])])).status, 201);
    let tracked = ng.status()["endpoint_table"]["tracked"].as_u64().unwrap();
    let big: Vec<Value> = (0..40)
        .map(|i| {
            let eps: Vec<Value> = (0..50)
                .map(|j| json!({"address": format!("10.{i}.{}.{}", j / 250, j % 250 + 1), "port": "80"}))
                .collect();
            backend(&format!("b{i}"), &eps)
        })
        .collect();
    let r = ng.post_backends(&Value::Array(big));
    assert_eq!(r.status, 507, "{}", r.body);
    let status = ng.status();
    assert_eq!(status["endpoint_table"]["tracked"].as_u64(), Some(tracked), "{status}");
    assert_eq!(ng.get("web").body, up.identity);
}

fn raw(port: u16, request: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(request).unwrap();
    s
}

/// A body large enough to keep the worker's write thread busy for a while.
fn slow_post_body() -> String {
    let backends: Vec<Value> = (0..60_000)
        .map(|i| {
            backend(
                &format!("b{i}"),
                &[json!({"address": format!("10.{}.{}.1", i / 250 % 250, i % 250), "port": "80"})],
            )
        })
        .collect();
    Value::Array(backends).to_string()
}

/// A DELETE whose request is terminated (a broken chunk in its body) while
/// its job waits behind long POSTs on the write thread: nginx must not free
/// the request under the job (it used to: the worker then wrote into freed
/// memory when the job came back; AddressSanitizer reports it).
#[test]
fn a_request_terminated_while_its_write_is_queued_is_safe() {
    let ng = Nginx::builder()
        .zone("256m")
        .api_extra("client_max_body_size 64m;")
        .start();
    let pid_before = ng.status()["workers"][0]["pid"].clone();
    let body = std::sync::Arc::new(slow_post_body());
    let api = ng.api_port;
    // Three POSTs keep the single write thread busy for a while; the
    // DELETEs queue behind them.
    let posters: Vec<_> = (0..3)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || {
                let req = format!(
                    "POST /configuration/backends HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let mut s = raw(api, req.as_bytes());
                let mut answer = String::new();
                let _ = s.read_to_string(&mut answer);
                answer
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(400));
    let mut victims = Vec::new();
    for _ in 0..8 {
        let mut s = raw(
            api,
            b"DELETE /configuration/backends/b1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        );
        std::thread::sleep(Duration::from_millis(20));
        // Complete the chunk, then a chunk size that is not hex: nginx
        // terminates the request while its job is queued.
        s.write_all(b"cde\r\nnot-hex\r\n").unwrap();
        victims.push(s);
        std::thread::sleep(Duration::from_millis(60));
    }
    for p in posters {
        let answer = p.join().unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 201"),
            "{}",
            &answer[..answer.len().min(300)]
        );
    }
    drop(victims);
    std::thread::sleep(Duration::from_millis(200));
    let status = ng.status();
    assert_eq!(status["workers"][0]["pid"], pid_before, "the worker survived");
    // A DELETE whose job was queued before its request broke still ran
    // (once; the others found b1 gone), unless all ran before the POSTs.
    let backends = status["backends"].as_u64().unwrap();
    assert!(backends == 59_999 || backends == 60_000, "{backends}");
    let log = ng.error_log();
    assert!(!log.contains("exited on signal"), "{log}");
}

/// `worker_shutdown_timeout` closes every connection, including one whose
/// write is still on the thread; the worker must still exit cleanly.
#[test]
fn shutdown_while_a_write_is_queued_is_clean() {
    let mut ng = Nginx::builder()
        .zone("64m")
        .main_extra("worker_shutdown_timeout 100ms;")
        .api_extra("client_max_body_size 64m;")
        .start();
    let body = slow_post_body();
    let mut conns = Vec::new();
    for _ in 0..2 {
        let req = format!(
            "POST /configuration/backends HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conns.push(raw(ng.api_port, req.as_bytes()));
    }
    std::thread::sleep(Duration::from_millis(300));
    let status = ng.quit_and_wait(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{}", ng.error_log());
    let log = ng.error_log();
    assert!(!log.contains("exited on signal"), "{log}");
    drop(conns);
}
