//! Upstream kinds beyond plain HTTP: TLS upstreams, and upstreams that close
//! kept-alive connections.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Command;

use serde_json::json;
use tests::{backend, free_port, Nginx};

/// `proxy_pass https://` makes nginx call the session hooks of the balancer
/// on every TLS connection.
#[test]
fn tls_upstreams_work_and_are_kept_alive() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl is installed by nginx-build");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let (tls_port, front) = (free_port(), free_port());
    let ng = Nginx::builder()
        .http_extra(&format!(
            r#"server {{ listen 127.0.0.1:{tls_port} ssl; ssl_certificate {}; ssl_certificate_key {};
                         location / {{ return 200 "tls upstream $connection"; }} }}
               server {{ listen 127.0.0.1:{front};
                         location / {{ dynamic_balancer_backend secure; proxy_http_version 1.1;
                                       proxy_set_header Connection ""; proxy_pass https://upstream_balancer; }} }}"#,
            cert.display(),
            key.display()
        ))
        .start();
    let body = json!([backend(
        "secure",
        &[json!({"address": "127.0.0.1", "port": tls_port.to_string()})]
    )]);
    assert_eq!(ng.post_backends(&body).status, 201);
    let answers: Vec<String> = (0..5).map(|_| ng.get_port(front, "/").body).collect();
    assert!(answers.iter().all(|a| a.starts_with("tls upstream")), "{answers:?}");
    assert_eq!(
        answers.iter().collect::<std::collections::BTreeSet<_>>().len(),
        1,
        "one kept-alive TLS connection: {answers:?}"
    );
}

/// An upstream that serves one request per connection and then closes it
/// when the next request arrives: the second request finds a stale cached
/// connection. nginx grants one extra try, and with a single endpoint the
/// balancer must reconnect to it rather than answer 502.
#[test]
fn stale_keepalive_connection_to_a_single_endpoint_is_retried() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(20) {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                    line.clear();
                }
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none");
                // Wait for the next request on this connection, then drop it.
                let mut next = String::new();
                let _ = reader.read_line(&mut next);
            });
        }
    });
    let ng = Nginx::builder().start();
    let body = json!([backend(
        "single",
        &[json!({"address": "127.0.0.1", "port": port.to_string()})]
    )]);
    assert_eq!(ng.post_backends(&body).status, 201);
    for i in 0..4 {
        let r = ng.get("single");
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "one"),
            "request {i}: {:?}\n{}",
            r.headers,
            ng.error_log()
        );
    }
}
