//! `auth-type: basic` through the controller on real nginx: an htpasswd
//! Secret (hashes made by `openssl passwd -apr1`, as `htpasswd` makes
//! them), the realm, a changed password, a Secret that arrives after its
//! Ingress (closed until then), and the user file's place and mode.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use tests::controller::{ingress, service, wait_until, Controller, INGRESS_CLASS};
use tests::Upstream;

fn apr1(password: &str) -> String {
    let out = Command::new("openssl")
        .args(["passwd", "-apr1", "-salt", "s4lt", password])
        .output()
        .expect("openssl is installed");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn secret(name: &str, users: &[(&str, &str)]) -> String {
    let file: String = users.iter().map(|(u, p)| format!("{u}:{}\n", apr1(p))).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(file);
    format!("apiVersion: v1\nkind: Secret\nmetadata: {{namespace: demo, name: {name}}}\ntype: Opaque\ndata: {{auth: {b64}}}\n")
}

/// Status and `WWW-Authenticate` of a GET with optional credentials.
fn get(port: u16, host: &str, credentials: Option<(&str, &str)>) -> (u16, Option<String>) {
    get_from("127.0.0.1", port, host, credentials)
}

/// As [`get`], from `source` (any 127.0.0.0/8 address answers on loopback).
fn get_from(source: &str, port: u16, host: &str, credentials: Option<(&str, &str)>) -> (u16, Option<String>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::new(source.parse().unwrap(), 0))
            .unwrap();
        socket
            .connect(([127, 0, 0, 1], port).into())
            .await
            .expect("nginx listens")
    });
    let mut s: TcpStream = stream.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    if let Some((u, p)) = credentials {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
        req.push_str(&format!("Authorization: Basic {token}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    let www = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("www-authenticate"))
        .map(|(_, v)| v.trim().to_string());
    (status, www)
}

#[test]
fn basic_auth_guards_the_backend_and_follows_the_secret() {
    let up = Upstream::start();
    let guarded = [
        ("auth-type", "basic"),
        ("auth-secret", "admins"),
        ("auth-realm", "Admins only"),
    ];
    let later = [("auth-type", "basic"), ("auth-secret", "late")];
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc.yaml", service("web", &[up.port])),
            ("secret.yaml", secret("admins", &[("alice", "wonderland")])),
            ("admin.yaml", ingress("admin", "admin.test", "/", "web", &guarded)),
            ("late.yaml", ingress("late", "late.test", "/", "web", &later)),
            ("open.yaml", ingress("open", "open.test", "/", "web", &[])),
        ],
        &[],
    );
    let port = c.http_port;

    let (status, www) = get(port, "admin.test", None);
    assert_eq!(status, 401);
    assert_eq!(www.as_deref(), Some("Basic realm=\"Admins only\""));
    assert_eq!(get(port, "admin.test", Some(("alice", "wrong"))).0, 401);
    assert_eq!(get(port, "admin.test", Some(("mallory", "wonderland"))).0, 401);
    assert_eq!(get(port, "admin.test", Some(("alice", "wonderland"))).0, 200);
    assert_eq!(get(port, "open.test", None).0, 200, "other Ingresses are not guarded");

    // The hashes are in one private file, not in nginx.conf.
    let conf = c.conf();
    assert!(!conf.contains("$apr1$"), "no hash in nginx.conf");
    let auth_dir = c.dir.path().join("nginx/auth");
    let files: Vec<_> = std::fs::read_dir(&auth_dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0].metadata().unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(&auth_dir).unwrap().permissions().mode() & 0o777,
        0o700
    );

    // A Secret that does not exist yet: closed (503), then guarded.
    assert_eq!(get(port, "late.test", None).0, 503);
    let before = c.worker_pids();
    assert!(!before.is_empty());
    c.write("late-secret.yaml", &secret("late", &[("bob", "builder")]));
    assert!(
        wait_until(Duration::from_secs(15), || get(port, "late.test", None).0 == 401),
        "{}",
        c.log()
    );
    // The file comes with a reload: an old worker may still take a
    // connection (and answer 503) until the old generation is gone.
    assert!(c.wait_workers_gone(&before), "old workers linger\n{}", c.log());
    assert_eq!(get(port, "late.test", Some(("bob", "builder"))).0, 200);

    // A changed password: the old one stops working, the new one works.
    let before = c.worker_pids();
    assert!(!before.is_empty());
    c.write("secret.yaml", &secret("admins", &[("alice", "looking-glass")]));
    assert!(
        wait_until(Duration::from_secs(15), || get(
            port,
            "admin.test",
            Some(("alice", "looking-glass"))
        )
        .0 == 200),
        "{}",
        c.log()
    );
    // The new file comes with a reload: until the old generation's workers
    // are gone, one of them may still take a connection with the old file.
    assert!(c.wait_workers_gone(&before), "old workers linger\n{}", c.log());
    for _ in 0..10 {
        assert_eq!(get(port, "admin.test", Some(("alice", "wonderland"))).0, 401);
    }
    c.stop();
}

#[test]
fn satisfy_any_lets_the_allowlist_or_the_password_in() {
    let up = Upstream::start();
    let guard = |satisfy: &'static str| {
        [
            ("auth-type", "basic"),
            ("auth-secret", "admins"),
            ("allowlist-source-range", "127.0.0.1/32"),
            ("satisfy", satisfy),
        ]
    };
    let any = guard("any");
    let all = guard("all");
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc.yaml", service("web", &[up.port])),
            ("secret.yaml", secret("admins", &[("alice", "wonderland")])),
            ("any.yaml", ingress("office", "office.test", "/", "web", &any)),
            ("all.yaml", ingress("vault", "vault.test", "/", "web", &all)),
        ],
        &[],
    );
    let port = c.http_port;
    let alice = Some(("alice", "wonderland"));
    // satisfy any: the office network needs no password, others do.
    assert_eq!(get_from("127.0.0.1", port, "office.test", None).0, 200);
    assert_eq!(get_from("127.0.0.2", port, "office.test", None).0, 401);
    assert_eq!(get_from("127.0.0.2", port, "office.test", alice).0, 200);
    // satisfy all (the default): both, so outsiders are refused outright.
    assert_eq!(get_from("127.0.0.1", port, "vault.test", None).0, 401);
    assert_eq!(get_from("127.0.0.1", port, "vault.test", alice).0, 200);
    assert_eq!(get_from("127.0.0.2", port, "vault.test", alice).0, 403);
    c.stop();
}
