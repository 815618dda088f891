//! The built `dynamic-balancer` against small scripted servers in this
//! process (loopback TCP on kernel-chosen ports, or a unix socket in a
//! temporary directory): what goes on the wire, how answers are framed,
//! and the exit codes. The real module is exercised by `tests/tests/cli.rs`.
//!
//! Having integration tests also makes `cargo test --workspace` build the
//! binary, which the end-to-end tests in the `tests` crate run.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const TOKEN: &str = "0123456789abcdef0123";

fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dynamic-balancer"))
        .args(args)
        .env_remove("DYNAMIC_BALANCER_API")
        .env_remove("DYNAMIC_BALANCER_TOKEN")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Reads one request (head, then `Content-Length` bytes of body).
fn read_request(s: &mut impl Read) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).unwrap() == 0 {
            break;
        }
        buf.push(byte[0]);
    }
    let head = text(&buf);
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(0, |n| n.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    head + &text(&body)
}

/// A response with its `Content-Length`.
fn sized(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A chunked response, one chunk per piece, each written on its own, the
/// chunk's size line in one write and its data in the next.
fn chunked(status: &str, pieces: &[&str]) -> Vec<Vec<u8>> {
    let mut out = vec![format!("HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes()];
    for p in pieces {
        out.push(format!("{:x}\r\n", p.len()).into_bytes());
        out.push(format!("{p}\r\n").into_bytes());
    }
    out.push(b"0\r\n\r\n".to_vec());
    out
}

/// Answers `answers.len()` connections in order, each with its canned
/// bytes (written in the given pieces), and hands back the requests.
fn tcp_server(answers: Vec<Vec<Vec<u8>>>) -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for pieces in answers {
            let (mut s, _) = listener.accept().unwrap();
            let _ = tx.send(read_request(&mut s));
            for piece in pieces {
                s.write_all(&piece).unwrap();
                s.flush().unwrap();
                thread::sleep(Duration::from_millis(5));
            }
        }
    });
    (url, rx)
}

#[test]
fn sends_the_token_and_reads_chunked_answers() {
    let (url, requests) = tcp_server(vec![chunked(
        "200 OK",
        &[
            r#"{"generation":4,"backends":1,"en"#,
            r#"dpoints":2,"workers":[{"pid":10,"generation":4},{"pid":11,"gen"#,
            r#"eration":3}],"x":[]}"#,
        ],
    )]);
    let out = cli(&["--api", &url, "--token", TOKEN, "status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("Generation:      4\n"), "{stdout}");
    assert!(stdout.contains("10      4           current\n"), "{stdout}");
    assert!(stdout.contains("11      3           behind by 1\n"), "{stdout}");
    let request = requests.recv().unwrap();
    assert!(
        request.starts_with("GET /configuration/status HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(
        request.contains(&format!("\r\nAuthorization: Bearer {TOKEN}\r\n")),
        "{request}"
    );
    assert!(request.contains("\r\nConnection: close\r\n"), "{request}");
}

#[test]
fn put_sends_the_backend_the_flags_describe() {
    let (url, requests) = tcp_server(vec![
        vec![sized("201 Created", r#"{"generation":1}"#)],
        vec![sized("200 OK", r#"{"generation":2}"#)],
    ]);
    let out = cli(&[
        "--api",
        &url,
        "put",
        "a b",
        "-e",
        "10.0.0.1:8080@5",
        "-e",
        "[fd00::7]:80",
        "--algorithm",
        "least_conn",
        "--max-fails",
        "3",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "backend \"a b\" created, generation 1\n");
    let request = requests.recv().unwrap();
    assert!(
        request.starts_with("PUT /configuration/backends/a%20b HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(!request.contains("Authorization"), "{request}");
    let body: serde_json::Value = serde_json::from_str(request.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["name"], "a b");
    assert_eq!(
        body["endpoints"],
        serde_json::json!([
            {"address": "10.0.0.1", "port": "8080", "weight": 5},
            {"address": "fd00::7", "port": "80"}
        ])
    );
    assert_eq!(
        (&body["load-balance"], &body["maxFails"]),
        (&"least_conn".into(), &3.into())
    );

    // -o json prints the API's answer; a 200 is a replacement.
    let out = cli(&["--api", &url, "-o", "json", "put", "a", "-e", "10.0.0.1:1"]);
    assert_eq!(text(&out.stdout), "{\n  \"generation\": 2\n}\n");
}

#[test]
fn api_errors_exit_1_or_4_with_the_json_error() {
    let (url, _requests) = tcp_server(vec![
        vec![sized("404 Not Found", r#"{"error":"no backend named \"x\""}"#)],
        chunked("507 Insufficient Storage", &["{\"error\":", "\"zone full\"}\n"]),
    ]);
    let out = cli(&["--api", &url, "get", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "error: GET /configuration/backends/x: 404 Not Found {\"error\":\"no backend named \\\"x\\\"\"}\n"
    );
    assert!(out.stdout.is_empty());
    let out = cli(&["--api", &url, "delete", "x"]);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(
        text(&out.stderr),
        "error: DELETE /configuration/backends/x: 507 Insufficient Storage {\"error\":\"zone full\"}\n"
    );
}

#[test]
fn no_usable_answer_exits_3() {
    // Refused: a port that was just free.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = cli(&["--api", &format!("http://127.0.0.1:{port}"), "status"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("Connection refused"),
        "{}",
        text(&out.stderr)
    );

    // Accepted, never answered: the deadline ends it.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let started = Instant::now();
    let out = cli(&["--api", &url, "--timeout", "300ms", "health"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(text(&out.stderr).contains("within 300ms"), "{}", text(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(silent);

    // Not HTTP; then a body cut short.
    let (url, _r) = tcp_server(vec![
        vec![b"SSH-2.0-OpenSSH_9.2\r\n".to_vec()],
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[{".to_vec()],
        vec![sized("200 OK", r#"{"a":[]}"#)],
    ]);
    let out = cli(&["--api", &url, "get"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("server closed the connection"),
        "{}",
        text(&out.stderr)
    );
    let out = cli(&["--api", &url, "get"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("after 2 of 100 body bytes"),
        "{}",
        text(&out.stderr)
    );
    // JSON, but not a list of backends.
    let out = cli(&["--api", &url, "get"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("not what this client expects"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn unix_sockets_and_token_files() {
    let dir = std::env::temp_dir().join(format!("dynamic-balancer-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("api.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let request = read_request(&mut s);
        s.write_all(&sized("200 OK", r#"[{"name":"b"}]"#)).unwrap();
        request
    });
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\nsecond line\n")).unwrap();
    let out = cli(&[
        "--unix",
        socket.to_str().unwrap(),
        "--token-file",
        token_file.to_str().unwrap(),
        "get",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "NAME  ENDPOINTS  ALGORITHM    ADDRESSES\nb     0          round_robin  -\n"
    );
    let request = server.join().unwrap();
    assert!(request.contains("\r\nHost: localhost\r\n"), "{request}");
    assert!(
        request.contains(&format!("\r\nAuthorization: Bearer {TOKEN}\r\n")),
        "{request}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn usage_errors_exit_2_before_sending_anything() {
    // Nothing listens on port 1: reaching the network would exit 3.
    let api = "http://127.0.0.1:1";
    for args in [
        vec!["--api", api, "put", "web"],
        vec!["--api", api, "put", "web", "-e", "fd00::7:80"],
        vec!["--api", api, "put", "web", "-e", "10.0.0.1:80@0"],
        vec![
            "--api",
            api,
            "put",
            "web",
            "-e",
            "10.0.0.1:80",
            "--fail-timeout",
            "86401",
        ],
        vec!["--api", api, "put", "", "-e", "10.0.0.1:80"],
        vec!["--api", api, "apply", "-f", "/nonexistent/backends.json"],
        vec!["--api", api, "--token", "short", "status"],
        vec!["--api", api, "--token-file", "/nonexistent/token", "status"],
        vec!["--api", "https://127.0.0.1:1", "status"],
        vec!["--api", api, "--timeout", "0", "status"],
        vec!["--api", api, "frobnicate"],
    ] {
        let out = cli(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).starts_with("error: "),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let help = cli(&["--help"]);
    assert!(help.status.success());
    assert!(text(&help.stdout).contains("Exit codes:\n  0  success\n"));
}
