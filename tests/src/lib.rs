//! Test harness: a real nginx with the module under a temporary prefix, real
//! upstream HTTP servers in the test process, and a real HTTP client.
//!
//! Every test builds its own [`Nginx`] and [`Upstream`]s on ports the kernel
//! hands out, so tests run in parallel without colliding, and every process is
//! stopped (by PID) when its handle drops.

pub mod admission;
pub mod apiserver;
pub mod bench;
pub mod cluster;
pub mod controller;
pub mod echo;
pub mod grpc_upstream;
pub mod h2_h3;
pub mod kube_apiserver;
pub mod load;
pub mod mixed_upstream;
pub mod nginx;
pub mod otel_collector;
pub mod pod_network;
pub mod process;
pub mod prometheus;
pub mod state_dir;
pub mod tls;
pub mod upstream;

pub use nginx::{Nginx, NginxBuilder, Response};
pub use upstream::Upstream;

/// The harness's HTTP client: every status is an answer (no error for
/// 4xx/5xx), and each request opens a fresh connection so that reuseport
/// spreads requests over every worker.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_idle_connections(0)
        .timeout_global(Some(std::time::Duration::from_secs(10)))
        .build()
        .into()
}

use std::collections::HashSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;

/// The nginx binary and module that `cargo run -p nginx-build` produced
/// (`build/nginx`), or those under `$DYNBAL_NGINX_PREFIX` (the
/// AddressSanitizer build, `cargo run -p nginx-build -- asan-test`).
pub fn artifacts() -> (PathBuf, PathBuf) {
    let root = match std::env::var_os("DYNBAL_NGINX_PREFIX") {
        Some(prefix) => PathBuf::from(prefix),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .join("build/nginx"),
    };
    let nginx = root.join("sbin/nginx");
    let module = root.join("modules/ngx_http_dynamic_balancer_module.so");
    assert!(
        nginx.exists() && module.exists(),
        "{} or {} is missing: run `cargo run -p nginx-build` first",
        nginx.display(),
        module.display()
    );
    (nginx, module)
}

/// The built nginx, pointed at the `nginx.conf` and `logs/` of `prefix`.
pub fn nginx_command(prefix: &std::path::Path) -> std::process::Command {
    let (nginx, _) = artifacts();
    let mut cmd = std::process::Command::new(nginx);
    cmd.arg("-p")
        .arg(format!("{}/", prefix.display()))
        .args(["-c", "nginx.conf", "-e", "logs/error.log"]);
    cmd.stdin(std::process::Stdio::null());
    cmd
}

/// A loopback port nobody in this process has been given yet.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    loop {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut given = GIVEN.lock().unwrap();
        if given.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}

/// Stops a process we started: SIGQUIT (graceful), then SIGKILL after 5 s.
pub fn stop_child(child: &mut std::process::Child) {
    // SAFETY: kill(2) on a process we started and have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGQUIT) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A port with nothing listening on it: connections are refused.
pub fn dead_port() -> u16 {
    free_port()
}

/// A backend object as ingress-nginx sends it.
/// A primary `web` on `primary` with `web-canary` on `canary` as its only
/// alternative, the canary shaped by `traffic`: the body of a POST.
pub fn primary_with_canary(primary: &Upstream, canary: &Upstream, traffic: serde_json::Value) -> serde_json::Value {
    let mut p = backend("web", &[primary.endpoint()]);
    p["alternativeBackends"] = serde_json::json!(["web-canary"]);
    let mut c = backend("web-canary", &[canary.endpoint()]);
    c["noServer"] = serde_json::json!(true);
    c["trafficShapingPolicy"] = traffic;
    serde_json::json!([p, c])
}

pub fn backend(name: &str, endpoints: &[serde_json::Value]) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "port": 80,
        "sslPassthrough": false,
        "endpoints": endpoints,
        "sessionAffinityConfig": {"name": "", "mode": "", "cookieSessionAffinity": {"name": ""}},
        "upstreamHashByConfig": {},
        "noServer": false,
        "trafficShapingPolicy": {"weight": 0, "weightTotal": 0, "header": "", "headerValue": "", "headerPattern": "", "cookie": ""}
    })
}

/// Starts `n` requests to `backend` through nginx on `port`, one thread
/// each, answers ignored: a stalled upstream holds them open. Join the
/// handles to wait for them.
pub fn park_requests(port: u16, backend: &'static str, n: usize) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
                let _ = agent
                    .get(&format!("http://127.0.0.1:{port}/"))
                    .header("X-Backend", backend)
                    .call();
            })
        })
        .collect()
}

/// An endpoint that refuses connections.
pub fn dead_endpoint() -> serde_json::Value {
    serde_json::json!({"address": "127.0.0.1", "port": dead_port().to_string()})
}

/// Runs `openssl` in `dir` (certificates for the tests); panics with its
/// message on failure.
pub fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
