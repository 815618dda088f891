//! `dynamic-balancer`, the command-line client, against a real nginx with
//! the module: writes through it route real requests to real upstreams,
//! its tables and JSON show what the API holds, its errors carry the API's
//! JSON and the documented exit codes, over TCP and over a unix socket.
//!
//! The binary is `target/release/dynamic-balancer`. `cargo test
//! --workspace` builds it (the balancer-cli package has integration
//! tests); with `cargo test -p tests` alone, build it first with `cargo
//! build --release -p balancer-cli`, as for the controller's binary.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::{backend, Nginx, Upstream};

const TOKEN: &str = "cli-test-token-0123456789";

fn binary() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/dynamic-balancer");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p balancer-cli` (or test with --workspace)",
        bin.display()
    );
    bin
}

/// The CLI, its environment cleared of the variables it reads.
fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .env_remove("DYNAMIC_BALANCER_API")
        .env_remove("DYNAMIC_BALANCER_TOKEN")
        .stdin(Stdio::null());
    cmd
}

/// Runs the CLI against `ng`'s API with the token; every run is bounded
/// by the CLI's own `--timeout`.
fn run(ng: &Nginx, args: &[&str]) -> Output {
    let api = format!("http://127.0.0.1:{}", ng.api_port);
    let mut all = vec!["--api", &api, "--token", TOKEN, "--timeout", "5s"];
    all.extend_from_slice(args);
    command(&all).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn ok(o: Output) -> String {
    assert!(o.status.success(), "exit {:?}: {}", o.status.code(), stderr(&o));
    stdout(&o)
}

fn start() -> Nginx {
    Nginx::builder().workers(2).api_token(TOKEN).start()
}

#[test]
fn put_routes_and_shows_through_tables_and_json() {
    let ng = start();
    let (a, b) = (Upstream::start(), Upstream::start());
    let ea = format!("127.0.0.1:{}", a.port);
    let eb = format!("127.0.0.1:{}@2", b.port);

    let out = ok(run(&ng, &["put", "web", "--endpoint", &ea, "--endpoint", &eb]));
    assert_eq!(out, "backend \"web\" created, generation 1\n");

    // Requests through nginx reach both, b twice as often (weight 2).
    let mut seen = (0, 0);
    for _ in 0..30 {
        let r = ng.get("web");
        assert_eq!(r.status, 200, "{}", r.body);
        if r.body == a.identity {
            seen.0 += 1;
        } else if r.body == b.identity {
            seen.1 += 1;
        }
    }
    assert_eq!(seen.0 + seen.1, 30);
    assert!(seen.0 >= 5 && seen.1 > seen.0, "weights 1:2, seen {seen:?}");

    // The list and one backend, as tables.
    let list = ok(run(&ng, &["get"]));
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines[0], "NAME  ENDPOINTS  ALGORITHM    ADDRESSES");
    assert_eq!(lines[1], format!("web   2          round_robin  {ea}, {eb}"));
    let one = ok(run(&ng, &["get", "web"]));
    assert!(
        one.starts_with("Name:          web\nAlgorithm:     round_robin\n"),
        "{one}"
    );
    assert!(
        one.ends_with(&format!("ENDPOINT         WEIGHT\n{ea}  1\n127.0.0.1:{}  2\n", b.port)),
        "{one}"
    );

    // --output json is the API's answer, only indented.
    let json_out = ok(run(&ng, &["get", "web", "-o", "json"]));
    let api = ng.api("GET", "/configuration/backends/web", None);
    assert_eq!(serde_json::from_str::<Value>(&json_out).unwrap(), api.json());
    assert!(json_out.starts_with("{\n  \"name\": \"web\",\n"), "{json_out}");
    let listed: Value = serde_json::from_str(&ok(run(&ng, &["--output", "json", "get"]))).unwrap();
    assert_eq!(
        listed[0]["endpoints"][1],
        json!({"address": "127.0.0.1", "port": b.port.to_string(), "weight": 2})
    );

    // A replacement from a file: the algorithm and endpoints change.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.json");
    let mut web = backend("web", &[a.endpoint()]);
    web["load-balance"] = json!("ewma");
    std::fs::write(&file, web.to_string()).unwrap();
    let out = ok(run(&ng, &["put", "web", "-f", file.to_str().unwrap()]));
    assert_eq!(out, "backend \"web\" replaced, generation 2\n");
    assert!(ok(run(&ng, &["get"])).contains(&format!("web   1          ewma       {ea}\n")));
    assert_eq!(ng.get("web").body, a.identity);

    // Status: the generation, and both workers at it once they caught up.
    ng.wait_generation(2);
    let status = ok(run(&ng, &["status"]));
    assert!(
        status.starts_with("Generation:      2\nBackends:        1\nEndpoints:       1\n"),
        "{status}"
    );
    assert!(status.contains("\nWORKER  GENERATION  STATE\n"), "{status}");
    assert_eq!(status.matches("  2           current\n").count(), 2, "{status}");
    let status_json: Value = serde_json::from_str(&ok(run(&ng, &["status", "-o", "json"]))).unwrap();
    assert_eq!(status_json["generation"], 2);
    assert_eq!(status_json["workers"].as_array().unwrap().len(), 2);

    // Health: one row per endpoint.
    let health = ok(run(&ng, &["health"]));
    assert!(
        health.starts_with("BACKEND  ENDPOINT         STATE  FAILS  CONNECTIONS  EWMA\n"),
        "{health}"
    );
    assert!(health.contains(&format!("web      {ea}  up     0      0")), "{health}");
    let health_json: Value = serde_json::from_str(&ok(run(&ng, &["health", "-o", "json"]))).unwrap();
    assert_eq!(health_json["endpoints"][0]["endpoint"], ea.as_str());

    // apply -f: the whole set replaced, web gone.
    let all = dir.path().join("backends.json");
    std::fs::write(
        &all,
        json!([backend("one", &[a.endpoint()]), backend("two", &[b.endpoint()])]).to_string(),
    )
    .unwrap();
    let out = ok(run(&ng, &["apply", "-f", all.to_str().unwrap()]));
    assert_eq!(out, "applied 2 backends (all others removed), generation 3\n");
    let names: Vec<String> = ok(run(&ng, &["get"]))
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert_eq!(names, ["one", "two"]);
    assert_eq!(ng.get("one").body, a.identity);
    assert_eq!(ng.get("two").body, b.identity);
    assert_eq!(ng.get("web").status, 503);

    // delete, then the same again: 404, exit 1, the API's JSON on stderr.
    assert_eq!(ok(run(&ng, &["delete", "two"])), "backend \"two\" deleted\n");
    assert_eq!(ng.get("two").status, 503);
    let again = run(&ng, &["delete", "two"]);
    assert_eq!(again.status.code(), Some(1));
    assert_eq!(
        stderr(&again),
        "error: DELETE /configuration/backends/two: 404 Not Found {\"error\":\"no backend named \\\"two\\\"\"}\n"
    );
    assert!(stdout(&again).is_empty());
    let missing = run(&ng, &["get", "web", "-o", "json"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).starts_with("error: GET /configuration/backends/web: 404 Not Found {\"error\":"),
        "{}",
        stderr(&missing)
    );
    assert_eq!(ng.status()["generation"], 4);
}

#[test]
fn errors_carry_the_apis_json_and_exit_codes() {
    let ng = start();
    let a = Upstream::start();
    let api = format!("http://127.0.0.1:{}", ng.api_port);

    // No token: 401, exit 1, the API's error printed.
    let out = command(&["--api", &api, "status"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: GET /configuration/status: 401 Unauthorized {\"error\":\"a bearer token is required (Authorization: Bearer <token>)\"}\n"
    );
    // A wrong one, from the environment.
    let out = command(&["--api", &api, "get"])
        .env("DYNAMIC_BALANCER_TOKEN", "wrong-token-0123456789")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains(": 401 Unauthorized {"), "{}", stderr(&out));
    // The right one, from a token file and the API from the environment.
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("api-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let out = command(&["--token-file", token_file.to_str().unwrap(), "status", "-o", "json"])
        .env("DYNAMIC_BALANCER_API", &api)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    // A bad body from a file: 400 with the JSON path of the bad value,
    // and the running configuration untouched.
    ok(run(&ng, &["put", "live", "-e", &format!("127.0.0.1:{}", a.port)]));
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"endpoints":[{"address":"127.0.0.1","port":"80x"}]}"#).unwrap();
    let out = run(&ng, &["put", "live", "-f", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with("error: PUT /configuration/backends/live: 400 Bad Request {\"error\":"),
        "{err}"
    );
    assert!(err.contains(r#""path":"endpoints[0].port""#), "{err}");
    let out = run(&ng, &["apply", "-f", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "an object is not the array POST takes");
    assert_eq!(ng.get("live").body, a.identity);

    // Flags the module would refuse never leave the machine: exit 2.
    let out = run(&ng, &["put", "live", "-e", "127.0.0.1:80@10001"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("weight"), "{}", stderr(&out));
    assert_eq!(ng.status()["generation"], 1);

    // Nothing listening: exit 3.
    let dead = format!("http://127.0.0.1:{}", tests::dead_port());
    let out = command(&["--api", &dead, "--token", TOKEN, "get"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(
        stderr(&out).starts_with("error: GET /configuration/backends: cannot connect to "),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_api_on_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    let ng = Nginx::builder()
        .workers(2)
        .api_token(TOKEN)
        .http_extra(&format!(
            "server {{ listen unix:{}; location /configuration {{ dynamic_balancer_api; dynamic_balancer_api_token {TOKEN}; }} }}",
            socket.display()
        ))
        .start();
    let a = Upstream::start();
    let unix = |args: &[&str]| {
        let mut all = vec!["--unix", socket.to_str().unwrap(), "--token", TOKEN];
        all.extend_from_slice(args);
        command(&all).output().unwrap()
    };
    let out = ok(unix(&["put", "sock", "-e", &format!("127.0.0.1:{}", a.port)]));
    assert_eq!(out, "backend \"sock\" created, generation 1\n");
    assert_eq!(ng.get("sock").body, a.identity);
    assert!(ok(unix(&["get"])).contains(&format!("sock  1          round_robin  127.0.0.1:{}\n", a.port)));
    assert!(ok(unix(&["status"])).starts_with("Generation:      1\n"));
    // The same zone behind both listeners.
    assert_eq!(
        ok(run(&ng, &["get", "sock", "-o", "json"])),
        ok(unix(&["get", "sock", "-o", "json"]))
    );
    // Any name the API takes reaches it as written (percent-encoded in the path).
    let odd = "odd name?#%2F&ü";
    ok(unix(&["put", odd, "-e", &format!("127.0.0.1:{}", a.port)]));
    let got: Value = serde_json::from_str(&ok(unix(&["get", odd, "-o", "json"]))).unwrap();
    assert_eq!(got["name"], odd);
    assert_eq!(ok(unix(&["delete", odd])), format!("backend {odd:?} deleted\n"));
    let out = unix(&["get", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains(": 404 Not Found {"), "{}", stderr(&out));
    // Without the token, refused there too.
    let out = command(&["--unix", socket.to_str().unwrap(), "get"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains(": 401 Unauthorized {"), "{}", stderr(&out));
    // A socket nobody serves: exit 3.
    let out = command(&["--unix", dir.path().join("none.sock").to_str().unwrap(), "get"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
}

/// Runs `watch` with `args` until it exits by itself (bounded), feeding it
/// `writes` once its first line is out; returns its exit code and lines.
fn watch_while(ng: &Nginx, args: &[&str], writes: impl FnOnce()) -> (Option<i32>, Vec<String>) {
    let api = format!("http://127.0.0.1:{}", ng.api_port);
    let mut all = vec!["--api", &api, "--token", TOKEN, "watch"];
    all.extend_from_slice(args);
    let mut child = command(&all)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in reader.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = vec![rx
        .recv_timeout(Duration::from_secs(15))
        .expect("watch printed its first line")];
    writes();
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("watch did not stop; it printed {lines:?}");
        }
        lines.extend(rx.try_iter());
        std::thread::sleep(Duration::from_millis(20));
    };
    // The reader ends with the pipe; take what is left.
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(2)) {
        lines.push(line);
    }
    if code != Some(0) {
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
        let _ = std::io::stderr().write_all(err.as_bytes());
    }
    (code, lines)
}

#[test]
fn watch_prints_generations_and_catch_up() {
    let ng = start();
    let a = Upstream::start();
    let ep = format!("127.0.0.1:{}", a.port);

    let (code, lines) = watch_while(&ng, &["--count", "2", "--interval", "100ms"], || {
        ok(run(&ng, &["put", "w1", "-e", &ep]));
        ok(run(&ng, &["put", "w2", "-e", &ep]));
    });
    assert_eq!(code, Some(0), "{lines:?}");
    assert!(lines[0].contains("] generation 0; 2 workers: "), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("generation 1 (was 0)") || l.contains("generation 2 (was 0, 2 writes)")),
        "{lines:?}"
    );
    let last = lines.last().unwrap();
    assert!(
        last.contains("all 2 workers at generation 2 (+")
            || last.contains("generation 2 (was 1): all 2 workers at it")
            || last.contains("generation 2 (was 0, 2 writes): all 2 workers at it"),
        "{lines:?}"
    );
    for line in &lines {
        assert!(line.starts_with('[') && line.contains("s] "), "{line:?}");
    }

    // JSON lines: one event object each.
    let (code, lines) = watch_while(&ng, &["-o", "json", "--count", "1", "--interval", "100ms"], || {
        ok(run(&ng, &["delete", "w1"]));
    });
    assert_eq!(code, Some(0), "{lines:?}");
    let events: Vec<Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events[0]["event"], "start");
    assert_eq!(events[0]["generation"], 2);
    assert_eq!(events[0]["workers"].as_array().unwrap().len(), 2);
    assert!(events[0]["workers"][0]["pid"].is_i64(), "{events:?}");
    let moved = events
        .iter()
        .find(|e| e["event"] == "generation")
        .expect("a generation event");
    assert_eq!((&moved["generation"], &moved["previous"]), (&json!(3), &json!(2)));
    assert!(events.iter().all(|e| e["at_ms"].is_u64()));
}
