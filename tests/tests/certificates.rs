//! Certificates from the zone (`dynamic_balancer_ssl`): chosen by SNI at
//! each handshake, changed through the API with no reload, validated before
//! anything is stored, and keys never answered or written.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::tls::{handshake, TestCert};
use tests::{free_port, Nginx};

/// nginx with a TLS server on `tls_port` whose static certificate is
/// `fallback` (nginx's own, served when the zone names none).
fn tls_nginx(workers: usize, fallback: &TestCert) -> (Nginx, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fallback.crt"), &fallback.cert_pem).unwrap();
    std::fs::write(dir.path().join("fallback.key"), &fallback.key_pem).unwrap();
    let tls_port = free_port();
    let ng = Nginx::builder()
        .workers(workers)
        .http_extra(&format!(
            r#"
    ssl_certificate {d}/fallback.crt;
    ssl_certificate_key {d}/fallback.key;
    dynamic_balancer_ssl on;
    server {{
        listen 127.0.0.1:{tls_port} ssl reuseport;
        location / {{ return 200 "sni=$ssl_server_name\n"; }}
    }}"#,
            d = dir.path().display()
        ))
        .start();
    (ng, tls_port, dir)
}

fn put_cert(ng: &Nginx, id: &str, cert: &TestCert) -> tests::nginx::Response {
    ng.api("PUT", &format!("/configuration/certificates/{id}"), Some(&cert.body()))
}

fn put_servers(ng: &Nginx, servers: Value) -> tests::nginx::Response {
    ng.api(
        "PUT",
        "/configuration/servers",
        Some(&json!({ "servers": servers }).to_string()),
    )
}

#[test]
fn sni_picks_exact_then_wildcard_then_default_then_nginx_own() {
    let fallback = TestCert::new("fallback");
    let (ng, port, _dir) = tls_nginx(1, &fallback);
    // Nothing in the zone: nginx's static certificate, whatever the SNI.
    assert_eq!(handshake(port, Some("a.example"), &[]).unwrap().sha256, fallback.sha256);
    assert_eq!(handshake(port, None, &[]).unwrap().sha256, fallback.sha256);

    let (a, wild, default) = (
        TestCert::new("a.example"),
        TestCert::new("*.wild.example"),
        TestCert::rsa("default"),
    );
    for (id, c) in [("ns_a", &a), ("ns_wild", &wild), ("default", &default)] {
        let r = put_cert(&ng, id, c);
        assert_eq!(r.status, 201, "{}", r.body);
    }
    // Stored but not yet named by any host: still nginx's own.
    assert_eq!(handshake(port, Some("a.example"), &[]).unwrap().sha256, fallback.sha256);
    let r = put_servers(
        &ng,
        json!({"A.Example": "ns_a", "*.wild.example": "ns_wild", "_": "default"}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let cases = [
        (Some("a.example"), &a),
        (Some("A.EXAMPLE"), &a),
        (Some("x.wild.example"), &wild),
        // A wildcard covers one label.
        (Some("y.x.wild.example"), &default),
        (Some("wild.example"), &default),
        (Some("other.test"), &default),
        (None, &default),
    ];
    for (sni, want) in cases {
        let got = handshake(port, sni, &[]).unwrap();
        assert_eq!(
            got.sha256,
            want.sha256,
            "SNI {sni:?} got {}: {}",
            got.cn,
            ng.error_log()
        );
    }
    // Without a default in the map, unmatched names fall back to nginx's.
    let r = put_servers(&ng, json!({"a.example": "ns_a"}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        handshake(port, Some("other.test"), &[]).unwrap().sha256,
        fallback.sha256
    );
    assert_eq!(handshake(port, None, &[]).unwrap().sha256, fallback.sha256);
    assert_eq!(handshake(port, Some("a.example"), &[]).unwrap().sha256, a.sha256);

    // The listing: subjects, SANs, dates, fingerprints and hosts; no key.
    let list = ng.api("GET", "/configuration/certificates", None);
    assert_eq!(list.status, 200);
    let v = list.json();
    let entry = v.as_array().unwrap().iter().find(|c| c["id"] == "ns_a").unwrap();
    assert_eq!(entry["subject"], "CN=a.example");
    assert_eq!(entry["sans"], json!(["a.example"]));
    assert_eq!(entry["sha256"], a.sha256);
    assert_eq!(entry["hosts"], json!(["a.example"]));
    assert_eq!(entry["key"], "EC-prime256v1");
    assert!(entry["not_after"].as_str().unwrap().ends_with('Z'));
    let rsa = v.as_array().unwrap().iter().find(|c| c["id"] == "default").unwrap();
    assert_eq!(rsa["key"], "RSA-2048");
    let one = ng.api("GET", "/configuration/certificates/ns_wild", None).json();
    assert_eq!(one["sha256"], wild.sha256);
    assert_eq!(ng.api("GET", "/configuration/certificates/nope", None).status, 404);
    assert_eq!(
        ng.api("GET", "/configuration/servers", None).json(),
        json!({"servers": {"a.example": "ns_a"}})
    );
    for body in [list.body.as_str(), &one.to_string()] {
        for c in [&a, &wild, &default] {
            assert!(!body.contains(&c.key_material()[..40]), "a key in a GET answer");
        }
        assert!(!body.contains("PRIVATE"), "a key in a GET answer");
    }
    // Nor anywhere under nginx's prefix (conf, logs, temp files).
    for entry in walk(&ng.prefix()) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        for c in [&a, &wild, &default] {
            assert!(
                !text.contains(&c.key_material()[..40]),
                "key material in {}",
                entry.display()
            );
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn bad_certificates_and_maps_are_refused_and_change_nothing() {
    let fallback = TestCert::new("fallback");
    let (ng, port, _dir) = tls_nginx(1, &fallback);
    let good = TestCert::new("good.example");
    assert_eq!(put_cert(&ng, "good", &good).status, 201);
    assert_eq!(put_servers(&ng, json!({"good.example": "good"})).status, 201);
    let before = (
        ng.api("GET", "/configuration/certificates", None).body,
        ng.api("GET", "/configuration/servers", None).body,
    );
    let other = TestCert::new("other.example");
    let mismatched = json!({"certificate": good.cert_pem, "key": other.key_pem}).to_string();
    let truncated = json!({"certificate": &good.cert_pem[..good.cert_pem.len() / 2], "key": good.key_pem}).to_string();
    let encrypted_like = json!({"certificate": good.cert_pem, "key": "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"}).to_string();
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("good", mismatched, 400, "does not match"),
        ("good", truncated, 400, "PEM certificate chain"),
        ("good", encrypted_like, 400, "private key"),
        ("good", "{}".into(), 400, "certificate"),
        ("good", "not json".into(), 400, "certificate"),
        (
            "good",
            json!({"certificate": good.cert_pem, "key": good.key_pem, "extra": 1}).to_string(),
            400,
            "unknown field",
        ),
        ("a%3Fb", good.body(), 400, "certificate id"),
        ("a%20b", good.body(), 400, "certificate id"),
    ];
    for (id, body, status, needle) in cases {
        let r = ng.api("PUT", &format!("/configuration/certificates/{id}"), Some(&body));
        assert_eq!(r.status, status, "{id}: {}", r.body);
        let err = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(err.contains(needle), "{id}: {err}");
    }
    // Maps naming what is not stored, or hosts that are not host names.
    for (servers, status) in [
        (json!({"good.example": "missing"}), 409),
        (json!({"bad host": "good"}), 400),
        (json!({"a.example": "good", "A.example": "good"}), 400),
        (json!({"a.example": "../x"}), 400),
    ] {
        let r = put_servers(&ng, servers.clone());
        assert_eq!(r.status, status, "{servers}: {}", r.body);
        assert!(r.json()["error"].is_string());
    }
    // A certificate still named cannot go.
    let r = ng.api("DELETE", "/configuration/certificates/good", None);
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("good.example"), "{}", r.body);
    assert_eq!(ng.api("DELETE", "/configuration/certificates/none", None).status, 404);
    assert_eq!(ng.api("POST", "/configuration/certificates", Some("{}")).status, 405);
    let after = (
        ng.api("GET", "/configuration/certificates", None).body,
        ng.api("GET", "/configuration/servers", None).body,
    );
    assert_eq!(before, after, "a refused write changed something");
    assert_eq!(handshake(port, Some("good.example"), &[]).unwrap().sha256, good.sha256);
    // Unname it, then it can go.
    assert_eq!(put_servers(&ng, json!({})).status, 201);
    assert_eq!(ng.api("DELETE", "/configuration/certificates/good", None).status, 204);
    assert_eq!(ng.api("GET", "/configuration/certificates", None).json(), json!([]));
    assert_eq!(
        handshake(port, Some("good.example"), &[]).unwrap().sha256,
        fallback.sha256
    );
}

/// ingress-nginx's own body: `{"certificates": {uid: chain+key PEM},
/// "servers": {host: uid | "-1"}}`, additive.
#[test]
fn ingress_nginx_servers_body_is_understood() {
    let fallback = TestCert::new("fallback");
    let (ng, port, _dir) = tls_nginx(1, &fallback);
    let (a, b) = (TestCert::new("a.example"), TestCert::new("b.example"));
    let uid_a = "0f4c3b2a-1111-2222-3333-444455556666";
    let body = json!({
        "certificates": {uid_a: format!("{}{}", a.cert_pem, a.key_pem), "uid-b": format!("{}\n{}", b.cert_pem, b.key_pem)},
        "servers": {"a.example": uid_a, "b.example": "uid-b", "c.example": "-1"},
    });
    let r = ng.api("POST", "/configuration/servers", Some(&body.to_string()));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(handshake(port, Some("a.example"), &[]).unwrap().sha256, a.sha256);
    assert_eq!(handshake(port, Some("b.example"), &[]).unwrap().sha256, b.sha256);
    // "-1" removes a host; hosts absent from the body stay.
    let body = json!({"servers": {"b.example": "-1"}});
    assert_eq!(
        ng.api("POST", "/configuration/servers", Some(&body.to_string())).status,
        201
    );
    assert_eq!(handshake(port, Some("a.example"), &[]).unwrap().sha256, a.sha256);
    assert_eq!(handshake(port, Some("b.example"), &[]).unwrap().sha256, fallback.sha256);
}

/// A renewal while handshakes run, across two workers: every handshake
/// succeeds, each presents the old certificate until the PUT returns and
/// the new one from then on, and nginx is not reloaded.
#[test]
fn renewal_under_traffic_switches_at_the_put_with_no_reload_and_no_failure() {
    let fallback = TestCert::new("fallback");
    let (ng, port, _dir) = tls_nginx(2, &fallback);
    let (v1, v2) = (TestCert::new("renew.example"), TestCert::new("renew.example"));
    assert_eq!(put_cert(&ng, "renew", &v1).status, 201);
    assert_eq!(put_servers(&ng, json!({"renew.example": "renew"})).status, 201);
    let workers_before = ng.status()["workers"].clone();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline && seen.len() < 5_000 {
                let started = Instant::now();
                let r = handshake(port, Some("renew.example"), &[]);
                seen.push((started, Instant::now(), r));
            }
            seen
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let put_started = Instant::now();
    let r = put_cert(&ng, "renew", &v2);
    let put_returned = Instant::now();
    assert_eq!(r.status, 200, "{}", r.body);
    // The next handshake after the PUT returned presents the new one.
    let first_after = Instant::now();
    assert_eq!(handshake(port, Some("renew.example"), &[]).unwrap().sha256, v2.sha256);
    let latency = first_after.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = seen.join().unwrap();
    assert!(seen.len() > 20, "too few handshakes: {}", seen.len());
    for (started, ended, r) in &seen {
        let got = r
            .as_ref()
            .unwrap_or_else(|e| panic!("a handshake failed during the renewal: {e}"));
        if *ended < put_started {
            assert_eq!(got.sha256, v1.sha256, "new certificate before the PUT");
        } else if *started > put_returned {
            assert_eq!(got.sha256, v2.sha256, "old certificate after the PUT returned");
        }
    }
    assert!(seen.iter().any(|(_, ended, _)| *ended < put_started));
    assert!(seen.iter().any(|(started, _, _)| *started > put_returned));
    assert_eq!(ng.status()["workers"], workers_before, "workers changed: a reload?");
    eprintln!(
        "renewal: {} handshakes, 0 failed; PUT took {:?}; the next handshake presented the new certificate ({:?})",
        seen.len(),
        put_returned - put_started,
        latency
    );
}

/// The zone survives a reload, and so do the certificates in it.
#[test]
fn certificates_survive_a_reload() {
    let fallback = TestCert::new("fallback");
    let (ng, port, _dir) = tls_nginx(1, &fallback);
    let a = TestCert::new("a.example");
    assert_eq!(put_cert(&ng, "a", &a).status, 201);
    assert_eq!(put_servers(&ng, json!({"a.example": "a"})).status, 201);
    ng.reload();
    assert_eq!(handshake(port, Some("a.example"), &[]).unwrap().sha256, a.sha256);
}
