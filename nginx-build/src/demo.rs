//! The main job: `ingress-controller` on the bundled manifest directory
//! (`controller/manifests/demo`), running nginx with the module, three demo
//! upstreams, and a live endpoint change that reloads nothing.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use std::{fs, thread};

use crate::build::{workspace_root, Artifacts};

/// The demo upstreams; the bundled EndpointSlices point at these ports.
const UPSTREAMS: [(&str, u16); 3] = [("web-1", 18081), ("web-2", 18082), ("api-1", 18083)];

pub fn run(artifacts: &Artifacts, args: &[String]) -> Result<(), String> {
    let port: u16 = match args {
        [] => 8080,
        [flag, value] if flag == "--port" => value.parse().map_err(|_| format!("bad port {value:?}"))?,
        _ => return Err("usage: demo [--port N]".into()),
    };
    let (api, metrics) = (port + 2166, port + 2174);
    let root = workspace_root();
    let controller = build_controller(&root)?;
    for (name, up_port) in UPSTREAMS {
        serve_upstream(name, up_port)?;
    }

    // Work on a copy, so the demo's own edits never touch the repository.
    let run_dir = root.join("build/demo");
    let manifests = run_dir.join("manifests");
    let _ = fs::remove_dir_all(&manifests);
    fs::create_dir_all(&manifests).map_err(|e| e.to_string())?;
    for entry in fs::read_dir(root.join("controller/manifests/demo")).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        fs::copy(&path, manifests.join(path.file_name().unwrap())).map_err(|e| e.to_string())?;
    }

    let (stop_tx, stop_rx) = mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(());
    })
    .map_err(|e| format!("cannot handle Ctrl-C: {e}"))?;

    let mut child = Command::new(&controller)
        .arg("--manifests")
        .arg(&manifests)
        .arg("--nginx-binary")
        .arg(&artifacts.nginx)
        .arg("--nginx-module")
        .arg(&artifacts.module)
        .arg("--conf-dir")
        .arg(run_dir.join("nginx"))
        .args(["--listen-address", "127.0.0.1"])
        // The demo upstreams run on this host's loopback, which a cluster
        // controller refuses by default.
        .arg("--allow-local-endpoints")
        .args([
            "--http-port",
            &port.to_string(),
            "--https-port",
            &(port + 363).to_string(),
        ])
        .args(["--api-port", &api.to_string()])
        .args(["--metrics-address", &format!("127.0.0.1:{metrics}")])
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", controller.display()))?;
    let token_file = run_dir.join("nginx/api-token");
    let result = demo(port, api, metrics, &manifests, &token_file, &stop_rx);
    stop(&mut child);
    result
}

fn demo(
    port: u16,
    api: u16,
    metrics: u16,
    manifests: &Path,
    token_file: &Path,
    stop_rx: &mpsc::Receiver<()>,
) -> Result<(), String> {
    let ready = format!("http://127.0.0.1:{metrics}/readyz");
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&ready).map(|(s, _)| s) != Some(200) {
        if Instant::now() > deadline {
            return Err("the controller did not become ready within 30 s (see its log above)".into());
        }
        thread::sleep(Duration::from_millis(100));
    }
    let base = format!("http://127.0.0.1:{port}");
    println!(
        "\ningress-controller is serving the manifests in {}",
        manifests.display()
    );
    println!("\nHost and path routing (from 20-ingresses.yaml):");
    for path in ["/", "/api/users"] {
        let (status, body) = get_host(&format!("{base}{path}"), "demo.local").unwrap_or_default();
        println!(
            "  curl -H 'Host: demo.local' {base}{path}    -> {status} {}",
            body.trim()
        );
    }
    let (status, _) = get_host(&format!("{base}/"), "unknown.local").unwrap_or_default();
    println!("  curl -H 'Host: unknown.local' {base}/    -> {status} (the default server)");

    let reloads = |m: &str| {
        get(&format!("http://127.0.0.1:{metrics}/metrics")).and_then(|(_, t)| {
            // `name{constant labels} value`
            t.lines()
                .filter(|l| l.strip_prefix(m).is_some_and(|r| r.starts_with(['{', ' '])))
                .find_map(|l| l.rsplit(' ').next().map(str::to_string))
        })
    };
    // The module's API wants the controller's bearer token.
    let token = fs::read_to_string(token_file).unwrap_or_default().trim().to_string();
    let workers = || {
        let mut r = agent()
            .get(&format!("http://127.0.0.1:{api}/configuration/status"))
            .header("Authorization", &format!("Bearer {token}"))
            .call()
            .ok()?;
        r.body_mut().read_to_string().ok()
    };
    let before = (reloads("nginx_ingress_controller_success"), workers());

    println!("\nA live endpoint change: adding web-2 (127.0.0.1:18082) to the web Service's EndpointSlice ...");
    let slices = manifests.join("10-services.yaml");
    let text = fs::read_to_string(&slices).map_err(|e| e.to_string())?;
    let scaled = text.replacen(
        "    port: 18081\nendpoints:\n  - addresses: [\"127.0.0.1\"]\n",
        "    port: 18081\nendpoints:\n  - addresses: [\"127.0.0.1\"]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: demo\n  name: web-2\n  labels:\n    kubernetes.io/service-name: web\naddressType: IPv4\nports:\n  - name: http\n    port: 18082\nendpoints:\n  - addresses: [\"127.0.0.1\"]\n",
        1,
    );
    fs::write(&slices, scaled).map_err(|e| e.to_string())?;
    thread::sleep(Duration::from_millis(500));
    for _ in 0..4 {
        let (status, body) = get_host(&format!("{base}/"), "demo.local").unwrap_or_default();
        println!("  curl -H 'Host: demo.local' {base}/    -> {status} {}", body.trim());
    }
    let after = (reloads("nginx_ingress_controller_success"), workers());
    println!(
        "  nginx reloads: {} before, {} after; workers unchanged: {}",
        before.0.unwrap_or_default(),
        after.0.unwrap_or_default(),
        before.1.as_deref().map(workers_of) == after.1.as_deref().map(workers_of)
    );
    println!(
        "\nTry it yourself: edit {} (endpoints apply live; a new host or path reloads once).",
        manifests.display()
    );
    println!(
        "  curl -H \"Authorization: Bearer $(cat {})\" http://127.0.0.1:{api}/configuration/backends    # what the module holds",
        token_file.display()
    );
    println!("  curl http://127.0.0.1:{metrics}/metrics               # controller metrics");
    println!("\nCtrl-C stops the controller, which stops nginx.");
    let _ = stop_rx.recv();
    Ok(())
}

/// The worker pids in /configuration/status (generations change with
/// every write; pids change only when nginx reloads).
fn workers_of(status: &str) -> Vec<String> {
    status
        .split("\"pid\":")
        .skip(1)
        .map(|s| s.chars().take_while(char::is_ascii_digit).collect())
        .collect()
}

fn build_controller(root: &Path) -> Result<PathBuf, String> {
    let status = crate::cargo::command()
        .current_dir(root)
        .args(["build", "--release", "-p", "controller", "--bin", "ingress-controller"])
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !status.success() {
        return Err("building ingress-controller failed".into());
    }
    Ok(root.join("target/release/ingress-controller"))
}

/// A tiny HTTP/1.1 upstream that says who it is (demo only).
fn serve_upstream(name: &'static str, port: u16) -> Result<(), String> {
    let listener = TcpListener::bind(("127.0.0.1", port)).map_err(|e| format!("demo upstream port {port}: {e}"))?;
    thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        let body = format!("hello from {name} (127.0.0.1:{port})\n");
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
                            body.len()
                        );
                        if stream.write_all(format!("{head}{body}").as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    Ok(())
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into()
}

fn get(url: &str) -> Option<(u16, String)> {
    let mut r = agent().get(url).call().ok()?;
    Some((r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()))
}

fn get_host(url: &str, host: &str) -> Option<(u16, String)> {
    let mut r = agent().get(url).header("Host", host).call().ok()?;
    Some((r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()))
}

/// SIGTERM, then wait (the controller stops nginx gracefully).
fn stop(child: &mut Child) {
    // SAFETY: kill(2) on the controller we started and have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
