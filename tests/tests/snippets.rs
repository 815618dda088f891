//! Snippets and the admission webhook against the IngressNightmare
//! pattern (CVE-2025-1974): a caller's text that closes its blocks and
//! makes nginx load a library of the caller's choice.
//!
//! The bait is a real shared library whose constructor creates a file: if
//! any nginx process ever dlopen()s it (`load_module`, `ssl_engine`, an
//! `include`d configuration that does), the file appears. A positive
//! control first shows that nginx does run it when a configuration names
//! it. Then every payload (each breakout shape, each refused directive,
//! braces hidden in comments, quotes and escapes, CRLF, a 1 MiB snippet)
//! goes through the manifest directory to a controller with snippets
//! allowed, and straight to the webhook's port as any Pod could send it.
//! None may load the bait, and neither nginx's error log nor the
//! controller's directories (the staging directory included) may ever
//! name the caller's path.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tests::admission::{ingress_json, verdict, webhook_certificate};
use tests::controller::{service, wait_until, Controller, INGRESS_CLASS};
use tests::{free_port, Upstream};

/// A library that proves it was loaded, in a directory of its own.
struct Bait {
    dir: tempfile::TempDir,
    library: PathBuf,
    loaded: PathBuf,
}

impl Bait {
    fn build() -> Bait {
        let dir = tempfile::Builder::new().prefix("nightmare-bait-").tempdir().unwrap();
        let loaded = dir.path().join("LOADED");
        let source = dir.path().join("bait.c");
        std::fs::write(
            &source,
            format!(
                "#include <fcntl.h>\n#include <unistd.h>\n\
                 __attribute__((constructor)) static void bait(void) {{\n\
                 int fd = open({:?}, O_CREAT | O_WRONLY, 0600);\n if (fd >= 0) close(fd);\n}}\n",
                loaded.display().to_string()
            ),
        )
        .unwrap();
        let library = dir.path().join("bait.so");
        let out = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .expect("a C compiler (cc) builds the bait");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        Bait { dir, library, loaded }
    }

    fn path(&self) -> String {
        self.library.display().to_string()
    }

    /// The directory every payload names: it must never show up where
    /// nginx or the controller wrote.
    fn marker(&self) -> String {
        self.dir.path().display().to_string()
    }

    fn was_loaded(&self) -> bool {
        self.loaded.exists()
    }
}

/// Every payload: (label, annotation, text). Each names the bait.
fn payloads(bait: &Bait) -> Vec<(String, &'static str, String)> {
    let so = bait.path();
    let dir = bait.marker();
    let mut p: Vec<(String, &'static str, String)> = vec![
        // The report's own: close every block, load an engine, reopen.
        (
            "issue".into(),
            "configuration-snippet",
            format!("}} }} }} ssl_engine {so}; http {{ server {{ location /zz {{"),
        ),
        (
            "load_module-breakout".into(),
            "configuration-snippet",
            format!("}}\n}}\n}}\nload_module {so};\nhttp {{ server {{ location /zz {{"),
        ),
        (
            "server-breakout".into(),
            "server-snippet",
            format!("}} }} load_module {so}; http {{ server {{"),
        ),
        (
            "include-breakout".into(),
            "server-snippet",
            format!("}} include {dir}/x.conf; server {{"),
        ),
        // Braces hidden where a naive reader would not count them.
        (
            "comment-hides-open".into(),
            "configuration-snippet",
            format!("add_header X a; # {{\n}} }} }} ssl_engine {so}; http {{ server {{ location /a {{"),
        ),
        (
            "quote-hides-close".into(),
            "configuration-snippet",
            format!("add_header X \"a; }}\"; }} }} }} ssl_engine {so}; http {{ server {{ location /b {{"),
        ),
        (
            "single-quote".into(),
            "configuration-snippet",
            format!("add_header X '}}'; }} }} }} load_module {so}; http {{ server {{ location /c {{"),
        ),
        (
            "escaped-semicolon".into(),
            "configuration-snippet",
            format!("add_header X a\\; }} }} }} load_module {so}; http {{ server {{ location /d {{"),
        ),
        (
            "escaped-backslash".into(),
            "configuration-snippet",
            format!("add_header X \"a\\\\\"; }} }} }} load_module {so}; http {{ server {{ location /e {{"),
        ),
        (
            "variable-brace".into(),
            "configuration-snippet",
            format!("set $a ${{; }} }} }} ssl_engine {so}; http {{ server {{ location /f {{"),
        ),
        (
            "word-brace".into(),
            "configuration-snippet",
            format!("return 200}}\n}} }} load_module {so}; http {{ server {{ location /g {{"),
        ),
        (
            "crlf".into(),
            "configuration-snippet",
            format!(
                "add_header X a;\r\n}}\r\n}}\r\n}}\r\nssl_engine {so};\r\nhttp {{\r\nserver {{\r\nlocation /h {{\r\n"
            ),
        ),
        (
            "unterminated".into(),
            "configuration-snippet",
            format!("add_header X a;\nload_module {so}"),
        ),
        (
            "open-quote".into(),
            "configuration-snippet",
            format!("add_header X \"a;\n}} ssl_engine {so};"),
        ),
        // Inside the block, but refused by name wherever it appears.
        (
            "ssl_engine-inside".into(),
            "configuration-snippet",
            format!("ssl_engine {so};"),
        ),
        (
            "load_module-in-if".into(),
            "configuration-snippet",
            format!("if ($http_x) {{ load_module {so}; }}"),
        ),
        (
            "quoted-name".into(),
            "configuration-snippet",
            format!("\"load_module\" {so};"),
        ),
        (
            "nested-include".into(),
            "server-snippet",
            format!("location /a {{ location /a/b {{ include {dir}/y.conf; }} }}"),
        ),
        ("env".into(), "server-snippet", format!("env LD_PRELOAD={so};")),
        (
            "lua".into(),
            "configuration-snippet",
            format!("content_by_lua_block {{ package.loadlib({so:?}, 'x'); }}"),
        ),
        ("perl".into(), "configuration-snippet", format!("perl_require {so};")),
        ("js".into(), "configuration-snippet", format!("js_import {so};")),
        (
            "ssl_certificate".into(),
            "server-snippet",
            format!("ssl_certificate {so}; ssl_certificate_key {so};"),
        ),
        (
            "proc-fd".into(),
            "server-snippet",
            "ssl_certificate_key /proc/self/fd/3;".into(),
        ),
        (
            "proxy-cert".into(),
            "configuration-snippet",
            format!("proxy_ssl_certificate {so};"),
        ),
        (
            "conf-command".into(),
            "configuration-snippet",
            format!("proxy_ssl_conf_command Certificate {so};"),
        ),
        (
            "access_log".into(),
            "configuration-snippet",
            format!("access_log {dir}/written.log;"),
        ),
        ("root".into(), "configuration-snippet", format!("root {dir};")),
        (
            "alias-secrets".into(),
            "configuration-snippet",
            "alias /var/run/secrets/kubernetes.io/serviceaccount/;".into(),
        ),
        (
            "user-file".into(),
            "configuration-snippet",
            format!("auth_basic on; auth_basic_user_file {dir}/htpasswd;"),
        ),
        (
            "temp-path".into(),
            "configuration-snippet",
            format!("client_body_temp_path {dir}/bodies;"),
        ),
        (
            "unix-pass".into(),
            "server-snippet",
            format!("location /u {{ proxy_pass http://unix:{dir}/s.sock; }}"),
        ),
        (
            "control-character".into(),
            "configuration-snippet",
            format!("add_header X \"a\u{0}\"; load_module {so};"),
        ),
    ];
    // A 1 MiB snippet whose breakout comes after a megabyte of filler.
    let mut big = "add_header X-Filler aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa;\n".repeat(16 * 1024);
    big.push_str(&format!("}} }} }} ssl_engine {so}; http {{ server {{ location /big {{"));
    p.push(("1MiB".into(), "configuration-snippet", big));
    p
}

/// Every file under `dir` whose content names `marker`.
fn files_naming(dir: &Path, marker: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            found.extend(files_naming(&path, marker));
        } else if meta.is_file() && std::fs::read(&path).is_ok_and(|b| String::from_utf8_lossy(&b).contains(marker)) {
            found.push(path);
        }
    }
    found
}

/// The bait works: nginx runs its constructor as soon as a configuration
/// loads it (before it finds it is no module). This is what the tests
/// below show never happens through the controller.
#[test]
fn the_bait_runs_when_nginx_loads_it() {
    let bait = Bait::build();
    let prefix = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(prefix.path().join("logs")).unwrap();
    std::fs::write(
        prefix.path().join("nginx.conf"),
        format!("load_module {};\nevents {{}}\n", bait.path()),
    )
    .unwrap();
    let out = tests::nginx_command(prefix.path()).arg("-t").output().unwrap();
    assert!(!out.status.success());
    assert!(bait.was_loaded(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Through the manifest directory, with snippets allowed: every payload is
/// refused by the model (reported, the Ingress fails closed), nginx is
/// never given one, and a well-formed snippet still works, written back
/// in canonical form.
#[test]
fn hostile_snippets_never_reach_nginx() {
    let bait = Bait::build();
    let up = Upstream::start();
    let good = tests::controller::ingress(
        "good",
        "good.test",
        "/",
        "web",
        &[
            (
                "configuration-snippet",
                "add_header X-Snippet \"a \\\"quoted\\\" {brace}; # not a comment\" always; # a comment\n",
            ),
            (
                "server-snippet",
                "location = /snippet-health {\n  return 200 'healthy';\n}\n",
            ),
        ],
    );
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("web.yaml", service("web", &[up.port])),
            ("good.yaml", good),
        ],
        &["--allow-snippet-annotations"],
    );
    let answer = tests::agent()
        .get(&format!("http://127.0.0.1:{}/", c.http_port))
        .header("Host", "good.test")
        .call()
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    assert_eq!(
        answer.headers().get("x-snippet").and_then(|v| v.to_str().ok()),
        Some("a \"quoted\" {brace}; # not a comment")
    );
    assert_eq!(c.get("good.test", "/snippet-health"), (200, "healthy".to_string()));
    let reloads = c.reloads();

    let list = payloads(&bait);
    let mut docs = Vec::new();
    for (i, (_, annotation, text)) in list.iter().enumerate() {
        let ing = ingress_json(&format!("p{i}"), &format!("p{i}.test"), &[(annotation, text)]);
        docs.push(serde_json::to_string(&ing).unwrap());
    }
    // JSON is YAML: one file, every payload exactly as written. The new
    // hosts come with a reload: once the last one answers, workers of the
    // old generation may still take a connection until they are gone.
    let before = c.worker_pids();
    c.write("payloads.yaml", &docs.join("\n---\n"));
    let last = format!("p{}.test", list.len() - 1);
    assert!(
        wait_until(Duration::from_secs(30), || c.get(&last, "/").0 == 503),
        "the payloads' Ingresses are served, failing closed\n{}",
        c.log()
    );
    assert!(c.wait_workers_gone(&before), "old workers linger\n{}", c.log());
    for (i, (label, annotation, _)) in list.iter().enumerate() {
        assert_eq!(c.get(&format!("p{i}.test"), "/").0, 503, "{label}: fails closed");
        let reported = format!("Ingress demo/p{i}: nginx.ingress.kubernetes.io/{annotation}");
        assert!(c.log().contains(&reported), "{label}: refusal reported\n{}", c.log());
    }
    // nginx never tested a configuration with a payload: no failed test,
    // no quarantine, and the only reload is the one for the new hosts.
    assert_eq!(c.metric("nginx_ingress_controller_errors"), 0.0, "{}", c.log());
    assert_eq!(c.metric("nginx_ingress_controller_quarantined_ingresses"), 0.0);
    assert_eq!(c.reloads_reaching(reloads + 1.0), reloads + 1.0);
    assert!(!bait.was_loaded(), "an nginx process loaded the bait");
    let nginx_dir = c.dir.path().join("nginx");
    assert_eq!(files_naming(&nginx_dir, &bait.marker()), Vec::<PathBuf>::new());
    assert!(nginx_dir.join(".staging").is_dir());
    assert_eq!(
        c.get("good.test", "/snippet-health").0,
        200,
        "the good snippet is untouched"
    );
}

/// Straight to the webhook's port, as any Pod could: every payload is
/// denied with the snippet policy's reason, and no nginx process runs for
/// a review (nothing is rendered, written or tested). The same webhook
/// admits a good snippet, and refuses oversized bodies and non-reviews.
#[test]
fn the_webhook_judges_payloads_without_nginx() {
    let bait = Bait::build();
    let up = Upstream::start();
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = webhook_certificate(certs.path());
    let port = free_port();
    let hook = format!("--validating-webhook=127.0.0.1:{port}");
    let (cert_arg, key_arg) = (
        format!("--validating-webhook-certificate={cert}"),
        format!("--validating-webhook-key={key}"),
    );
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("web.yaml", service("web", &[up.port])),
        ],
        &[&hook, &cert_arg, &key_arg, "--allow-snippet-annotations"],
    );
    let reloads = c.reloads();
    for (label, annotation, text) in payloads(&bait) {
        let ing = ingress_json("attack", "attack.test", &[(annotation, &text)]);
        let denial = verdict(port, &ing).expect_err(&label);
        eprintln!("{label}: {}", denial.chars().take(300).collect::<String>());
        assert!(
            denial.contains(annotation)
                && (denial.contains("refused in a snippet")
                    || denial.contains("not a complete list")
                    || denial.contains("bytes")),
            "{label}: {denial}"
        );
        // The denial quotes no more than a short piece of the payload.
        assert!(denial.len() < 2048, "{label}: {} bytes", denial.len());
    }
    verdict(
        port,
        &ingress_json(
            "fine",
            "fine.test",
            &[("configuration-snippet", "add_header X-Fine yes;")],
        ),
    )
    .expect("a good snippet is admitted");
    // Not a review, and a body over the limit.
    let (status, _) = tests::admission::post(port, b"{\"kind\": \"AdmissionReview\"}").unwrap();
    assert!((400..500).contains(&status), "{status}");
    let huge = vec![b' '; 5 * 1024 * 1024];
    let (status, _) = tests::admission::post(port, &huge).unwrap();
    assert_eq!(status, 413);

    assert!(!bait.was_loaded(), "an nginx process loaded the bait");
    let nginx_dir = c.dir.path().join("nginx");
    assert_eq!(files_naming(&nginx_dir, &bait.marker()), Vec::<PathBuf>::new());
    let error_log = std::fs::read_to_string(nginx_dir.join("logs/error.log")).unwrap_or_default();
    assert!(!error_log.contains(&bait.marker()));
    assert_eq!(c.reloads(), reloads, "a review never reloads");
    let metrics = tests::controller::get_url(&format!("http://127.0.0.1:{}/metrics", c.metrics_port))
        .unwrap()
        .1;
    let denied = metrics
        .lines()
        .find(|l| l.starts_with("nginx_ingress_controller_admission_reviews_total{") && l.contains("result=\"denied\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(denied, Some(payloads(&bait).len() as f64), "{metrics}");
}
