//! `dynamic_balancer_state`: the backends kept in a file, restored by an
//! nginx started after a crash (`kill -9` of the master and its workers).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::state_dir::{backends_of, canonical, mode_0600, running_as_root, wait_written, workers_user, StateDir};
use tests::{backend, Nginx, Upstream};

fn start(state: &StateDir, workers: usize) -> Nginx {
    Nginx::builder().workers(workers).http_extra(&state.directive()).start()
}

/// The first answer nginx gives for `backend` once it listens again, and
/// how long after the call it came.
fn first_answer(ng: &Nginx, backend: &str) -> (u16, String, Duration) {
    let started = Instant::now();
    let url = format!("http://127.0.0.1:{}/", ng.port);
    // Never connect to a port nobody listens on (see `listening`).
    tests::process::wait_listening(ng.port, Duration::from_secs(15));
    loop {
        if let Ok(mut r) = tests::agent().get(&url).header("X-Backend", backend).call() {
            let body = r.body_mut().read_to_string().unwrap_or_default();
            return (r.status().as_u16(), body, started.elapsed());
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "nginx did not come back: {}",
            ng.error_log()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

#[test]
fn a_crashed_nginx_routes_by_the_file_from_its_first_request() {
    let state = StateDir::new();
    let mut ng = start(&state, 2);
    let (a, b) = (Upstream::start(), Upstream::start());
    let r = ng.post_backends(&json!([
        backend("web", &[a.endpoint()]),
        backend("other", &[b.endpoint()])
    ]));
    assert_eq!(r.status, 201, "{}", r.body);
    let r = ng.api(
        "PUT",
        "/configuration/backends/late",
        Some(&backend("late", &[b.endpoint()]).to_string()),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let status = wait_written(&ng);
    assert_eq!(status["state_file"]["path"], state.path.display().to_string());
    assert_eq!(status["generation"], 2);

    let file = state.json();
    assert_eq!(
        (file["version"].as_u64(), file["generation"].as_u64()),
        (Some(1), Some(2))
    );
    let listed = ng.api("GET", "/configuration/backends", None).json();
    assert_eq!(file["backends"], listed, "the file holds what GET returns");
    assert!(mode_0600(&state.path), "the state file is 0600");
    assert!(mode_0600(&state.dir.join("dynamic_balancer.state.lock")));
    assert_eq!(
        state.listing(),
        ["dynamic_balancer.state", "dynamic_balancer.state.lock"],
        "no temporary file is left"
    );

    ng.kill_all();
    ng.respawn();
    let (status, body, took) = first_answer(&ng, "web");
    assert_eq!(
        (status, body),
        (200, a.identity.clone()),
        "the very first request routes"
    );
    eprintln!(
        "first routed request {:.1} ms after the start",
        took.as_secs_f64() * 1e3
    );
    assert_eq!(ng.get("other").body, b.identity);
    assert_eq!(ng.get("late").body, b.identity);
    assert_eq!(ng.api("GET", "/configuration/backends", None).json(), listed);
    let status = ng.status();
    assert_eq!(
        (status["generation"].as_u64(), status["backends"].as_u64()),
        (Some(1), Some(3))
    );
    assert_eq!(status["state_file"]["generation"], 1, "{status}");
    let log = ng.error_log();
    assert_eq!(
        count(&log, "restored 3 backends (3 endpoints) from the state file"),
        1,
        "{log}"
    );
    assert!(log.contains("(written at generation 2)"), "{log}");

    // The restarted nginx writes on: a write after the restore replaces it.
    let r = ng.api("DELETE", "/configuration/backends/late", None);
    assert_eq!(r.status, 204);
    wait_written(&ng);
    let names: Vec<String> = state.json()["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["other", "web"]);
}

#[test]
fn without_a_file_nginx_starts_empty_and_creates_it() {
    let state = StateDir::new();
    let ng = start(&state, 1);
    assert!(ng.error_log().contains(&format!(
        "no state file \"{}\" yet; starting with no backends",
        state.path.display()
    )));
    let status = ng.status();
    assert_eq!(
        status["state_file"],
        json!({"path": state.path.display().to_string(), "generation": 0, "error": null, "write_us": 0})
    );
    assert_eq!(ng.get("web").status, 503);
    let a = Upstream::start();
    assert_eq!(ng.post_backends(&json!([backend("web", &[a.endpoint()])])).status, 201);
    let status = wait_written(&ng);
    assert!(status["state_file"]["write_us"].as_u64().unwrap() > 0, "{status}");
    // The writer's line reaches the log with the worker's next timer.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ng.error_log().contains("written: generation 1, 1 backends") {
        assert!(Instant::now() < deadline, "{}", ng.error_log());
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some((uid, _)) = workers_user() {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&state.path).unwrap();
        assert_eq!(meta.uid(), uid, "the workers, not the root master, write the file");
    }
}

#[test]
fn a_corrupt_or_refused_file_is_logged_and_nginx_starts_empty() {
    let a = Upstream::start();
    let valid = String::from_utf8(lua_compat::state_file::render(
        5,
        canonical(&json!([backend("web", &[a.endpoint()])]).to_string())
            .iter()
            .map(Vec::as_slice),
    ))
    .unwrap();
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("garbage", b"\0\x01garbage{".to_vec(), "not a complete state file"),
        (
            "truncated",
            valid.as_bytes()[..valid.len() / 2].to_vec(),
            "not a complete state file: EOF while parsing",
        ),
        (
            "another version",
            valid.replace("\"version\":1", "\"version\":2").into_bytes(),
            "format version 2, only version 1 is read",
        ),
        (
            "refused by the API's rules",
            valid
                .replace(&format!("\"port\":\"{}\"", a.port), "\"port\":\"0\"")
                .into_bytes(),
            "refused at backends[0].endpoints[0].port",
        ),
        ("a symbolic link", Vec::new(), "Too many levels of symbolic links"),
    ];
    for (what, bytes, reason) in cases {
        let state = StateDir::new();
        if what == "a symbolic link" {
            // Even to a valid file: the root master follows no link in the
            // workers' directory.
            let target = state.dir.join("elsewhere");
            std::fs::write(&target, &valid).unwrap();
            std::os::unix::fs::symlink(&target, &state.path).unwrap();
        } else {
            std::fs::write(&state.path, &bytes).unwrap();
        }
        let ng = start(&state, 1);
        let log = ng.error_log();
        assert!(log.contains(reason), "{what}: {log}");
        assert!(
            log.contains(&format!("\"{}\"", state.path.display())) && log.contains("starting with no backends"),
            "{what}: {log}"
        );
        assert_eq!(ng.get("web").status, 503, "{what}: unknown backends get 503");
        let status = ng.status();
        assert_eq!(
            (status["backends"].as_u64(), status["generation"].as_u64()),
            (Some(0), Some(0))
        );
        assert_eq!(status["state_file"]["generation"], 0);
        // The next write replaces the bad file with a good one.
        assert_eq!(ng.post_backends(&json!([backend("web", &[a.endpoint()])])).status, 201);
        wait_written(&ng);
        assert_eq!(state.backends().len(), 1, "{what}");
        assert_eq!(ng.get("web").body, a.identity, "{what}");
    }
}

#[test]
fn a_reload_keeps_the_zone_and_a_resized_zone_is_filled_from_the_file() {
    let state = StateDir::new();
    let ng = Nginx::builder()
        .workers(2)
        .zone("32m")
        .http_extra(&state.directive())
        .start();
    let (a, b) = (Upstream::start(), Upstream::start());
    let path = "/configuration/backends/web";
    assert_eq!(
        ng.api("PUT", path, Some(&backend("web", &[a.endpoint()]).to_string()))
            .status,
        201
    );
    wait_written(&ng);

    // A hand edit between writes: a reload does not read it.
    let edited = |to: &Upstream| {
        let body = json!([backend("web", &[to.endpoint()])]).to_string();
        lua_compat::state_file::render(99, canonical(&body).iter().map(Vec::as_slice))
    };
    std::fs::write(&state.path, edited(&b)).unwrap();
    ng.reload();
    assert_eq!(ng.get("web").body, a.identity, "the zone, not the file, after a reload");
    assert_eq!(count(&ng.error_log(), "restored 1 backends"), 0);

    // The next write puts the zone's state back in the file.
    let r = ng.api(
        "PUT",
        "/configuration/backends/other",
        Some(&backend("other", &[b.endpoint()]).to_string()),
    );
    assert_eq!(r.status, 201);
    wait_written(&ng);
    assert_eq!(
        state.json()["backends"],
        ng.api("GET", "/configuration/backends", None).json()
    );

    // A reload that resizes the zone starts it anew: from the file.
    std::fs::write(&state.path, edited(&b)).unwrap();
    let conf = ng.prefix().join("nginx.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(
        &conf,
        text.replace("dynamic_balancer_zone 32m;", "dynamic_balancer_zone 48m;"),
    )
    .unwrap();
    ng.reload();
    assert_eq!(ng.get("web").body, b.identity);
    assert_eq!(ng.get("other").status, 503, "only what the file holds");
    assert_eq!(ng.status()["zone"]["size"], 48 * 1024 * 1024);
    assert_eq!(count(&ng.error_log(), "restored 1 backends"), 1);
}

/// The directive added to a running nginx (its zone kept by the reload),
/// or a file deleted under it: the new workers write the zone's backends
/// at once, without waiting for the next write.
#[test]
fn new_workers_write_a_zone_the_file_lacks() {
    let state = StateDir::new();
    let ng = Nginx::builder().workers(2).start();
    let a = Upstream::start();
    assert_eq!(ng.post_backends(&json!([backend("web", &[a.endpoint()])])).status, 201);
    let conf = ng.prefix().join("nginx.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(
        &conf,
        text.replacen("http {", &format!("http {{\n    {}", state.directive()), 1),
    )
    .unwrap();
    ng.reload();
    let status = wait_written(&ng);
    assert_eq!(status["generation"], 1);
    assert_eq!(
        state.json()["backends"],
        ng.api("GET", "/configuration/backends", None).json()
    );

    std::fs::remove_file(&state.path).unwrap();
    ng.reload();
    let deadline = Instant::now() + Duration::from_secs(15);
    while state.bytes().is_none() {
        assert!(Instant::now() < deadline, "the deleted file was not written again");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(state.backends().len(), 1);
}

#[test]
fn nginx_t_checks_the_directory_and_reads_no_file() {
    let out = Nginx::builder()
        .http_extra("dynamic_balancer_state /nonexistent-dynbal-dir/state;")
        .test_config();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("dynamic_balancer_state: the directory \"/nonexistent-dynbal-dir\" cannot be used"),
        "{err}"
    );
    let out = Nginx::builder()
        .http_extra("dynamic_balancer_state a; dynamic_balancer_state b;")
        .test_config();
    assert!(String::from_utf8_lossy(&out.stderr).contains("is duplicate"));
    // A relative path is taken from the prefix.
    let out = Nginx::builder()
        .http_extra("dynamic_balancer_state logs/dynamic_balancer.state;")
        .test_config();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let state = StateDir::new();
    let ng = start(&state, 1);
    let a = Upstream::start();
    assert_eq!(ng.post_backends(&json!([backend("web", &[a.endpoint()])])).status, 201);
    wait_written(&ng);
    let before = ng.error_log();
    let out = tests::nginx_command(&ng.prefix()).arg("-t").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = ng.error_log();
    assert_eq!(
        count(&after, "restored 1 backends"),
        count(&before, "restored 1 backends")
    );
    assert_eq!(count(&after, "no state file"), count(&before, "no state file"));
    assert_eq!(ng.get("web").body, a.identity);
}

#[test]
fn a_directory_the_workers_cannot_write_is_an_error_not_an_outage() {
    if !running_as_root() {
        eprintln!("skipped: needs a root master with unprivileged workers");
        return;
    }
    let state = StateDir::unwritable();
    let ng = start(&state, 1);
    let a = Upstream::start();
    assert_eq!(ng.post_backends(&json!([backend("web", &[a.endpoint()])])).status, 201);
    assert_eq!(ng.get("web").body, a.identity);
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        let s = ng.status();
        if !s["state_file"]["error"].is_null() {
            break s;
        }
        assert!(Instant::now() < deadline, "no error reported: {s}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status["state_file"]["error"], "lock: Permission denied (os error 13)");
    assert_eq!(status["state_file"]["generation"], 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ng.error_log().contains("cannot write the state file") {
        assert!(Instant::now() < deadline, "{}", ng.error_log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(ng.error_log().contains("[error]"));
    assert!(state.bytes().is_none());
}

/// Writes land on both workers (each has its own writer thread); the
/// file ends at the zone's last state.
#[test]
fn writes_on_every_worker_end_with_the_latest_state() {
    let state = StateDir::new();
    let ng = start(&state, 2);
    let a = Upstream::start();
    let endpoint = a.endpoint();
    std::thread::scope(|s| {
        for t in 0..3 {
            let (ng, endpoint) = (&ng, endpoint.clone());
            s.spawn(move || {
                for i in 0..20 {
                    let name = format!("t{t}-{}", i % 7);
                    let r = ng.api(
                        "PUT",
                        &format!("/configuration/backends/{name}"),
                        Some(&backend(&name, std::slice::from_ref(&endpoint)).to_string()),
                    );
                    assert!(r.status == 200 || r.status == 201, "{}", r.body);
                }
            });
        }
    });
    let status = wait_written(&ng);
    assert_eq!(status["generation"], 60);
    assert_eq!(
        state.json()["backends"],
        ng.api("GET", "/configuration/backends", None).json()
    );
    assert_eq!(state.json()["generation"], 60);
    let log = ng.error_log();
    assert!(!log.contains("cannot write the state file"), "{log}");
    assert_eq!(
        state.listing(),
        ["dynamic_balancer.state", "dynamic_balancer.state.lock"]
    );
}

/// 1,000 backends × 10 endpoints whose ports say which set they are.
fn large_set(variant: usize) -> String {
    let list: Vec<Value> = (0..1000)
        .map(|i| {
            let eps: Vec<Value> = (0..10)
                .map(|j| json!({"address": format!("10.{}.{}.{}", i / 250, i % 250, j + 1), "port": (10_000 + variant).to_string()}))
                .collect();
            backend(&format!("svc-{i:04}"), &eps)
        })
        .collect();
    Value::Array(list).to_string()
}

/// A crash while POSTs keep coming leaves the file whole: the set before
/// the POST or the POST's own, and nginx restarts with exactly it. The
/// kills are spread over the time a POST and its file write take.
#[test]
fn a_crash_during_large_posts_leaves_the_old_or_the_new_set() {
    let state = StateDir::new();
    let mut ng = start(&state, 1);
    let sets: Vec<String> = (0..13).map(large_set).collect();
    let canonical_sets: Vec<Vec<Vec<u8>>> = sets.iter().map(|s| canonical(s)).collect();
    let started = Instant::now();
    assert_eq!(ng.api("POST", "/configuration/backends", Some(&sets[0])).status, 201);
    wait_written(&ng);
    let span = started.elapsed().as_millis() as u64 * 13 / 10 + 1;
    let mut held = 0;
    let mut seed = u64::from(std::process::id()) | 1;
    let (mut old, mut new, mut mid_write) = (0, 0, 0);
    for (i, body) in sets.iter().enumerate().skip(1) {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let delay = Duration::from_millis((seed >> 33) % span);
        let url = format!("http://127.0.0.1:{}/configuration/backends", ng.api_port);
        let poster = std::thread::spawn({
            let body = body.clone();
            move || {
                tests::agent()
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .send(body)
                    .is_ok()
            }
        });
        std::thread::sleep(delay);
        ng.kill_all();
        poster.join().unwrap();
        if state.listing().iter().any(|n| n.contains(".tmp.")) {
            mid_write += 1;
        }
        let bytes = state.bytes().expect("the file survives");
        let found = backends_of(&bytes);
        if found == canonical_sets[i] {
            held = i;
            new += 1;
        } else {
            assert!(
                found == canonical_sets[held],
                "round {i} ({delay:?}): the file is neither set {held} nor set {i}"
            );
            old += 1;
        }
        ng.restart();
        let listed = ng.api("GET", "/configuration/backends", None).json();
        let file: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(listed, file["backends"], "round {i}: restarted with the file's set");
    }
    eprintln!(
        "{} crashes over {span} ms after a POST: {new} files held the new set, {old} the old one; {mid_write} crashes left a temporary file",
        new + old
    );
}
