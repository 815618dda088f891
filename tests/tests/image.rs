//! The OCI image (`cargo run --release -p nginx-build -- image`), run under
//! podman as a Pod would run it: uid 101, every capability dropped except
//! NET_BIND_SERVICE, no new privileges, a read-only root filesystem with
//! tmpfs on the two writable paths, host networking on loopback. In
//! manifest-directory mode it routes a request; nginx inside loads the
//! module; the controller is PID 1, reaps orphans and stops cleanly on
//! SIGTERM.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use tests::controller::{get_url, ingress, request, service, wait_until, INGRESS_CLASS};
use tests::free_port;
use tests::upstream::Upstream;

const IMAGE: &str = "localhost/dynamic-balancer/ingress-controller:0.1.0";

/// podman with the flags this sandbox needs (see
/// shared/reference/k8s-toolchain.md): cgroupfs, file events, runc.
fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args([
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
            "--runtime",
            "runc",
        ])
        .args(args)
        .output()
        .expect("podman (nginx-build image installs it)")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Assembles the image from what the workspace build made (nginx-build's
/// binary from README's first step, the controller from `cargo test`).
fn build_image() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("target/release/nginx-build"))
        .args(["image", "--assemble-only"])
        .output()
        .expect("target/release/nginx-build (cargo run --release -p nginx-build)");
    ok(&out);
    root.join("build/image/ingress-controller-0.1.0.oci.tar")
}

/// Removes the container when the test ends, however it ends.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.0]);
    }
}

fn children(pid: u32) -> Vec<(u32, char)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.get(1).and_then(|pp| pp.parse::<u32>().ok()) == Some(pid) {
            out.push((p, f[0].chars().next().unwrap_or('?')));
        }
    }
    out
}

#[test]
fn the_image_runs_unprivileged_read_only_and_routes() {
    let archive = build_image();
    ok(&podman(&["load", "-i", archive.to_str().unwrap()]));
    let size: u64 = ok(&podman(&["image", "inspect", "--format", "{{.Size}}", IMAGE]))
        .trim()
        .parse()
        .unwrap();
    eprintln!(
        "image {IMAGE}: {:.1} MB uncompressed, archive {:.1} MB",
        size as f64 / 1e6,
        std::fs::metadata(&archive).unwrap().len() as f64 / 1e6
    );
    assert!(size <= 80_000_000, "the image is {size} bytes, over 80 MB");

    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    for (name, text) in [
        ("class.yaml", INGRESS_CLASS.to_string()),
        ("web.yaml", service("web", &[up.port])),
        ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
    ] {
        std::fs::write(manifests.join(name), text).unwrap();
    }
    // uid 101 reads them.
    use std::os::unix::fs::PermissionsExt;
    for p in [dir.path(), manifests.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (http, https, api, metrics) = (free_port(), free_port(), free_port(), free_port());
    let name = format!("dynbal-e2e-{}", std::process::id());
    let volume = format!("{}:/manifests:ro", manifests.display());
    let (h, s, a, m) = (
        http.to_string(),
        https.to_string(),
        api.to_string(),
        format!("127.0.0.1:{metrics}"),
    );
    let run = podman(&[
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        "host",
        "--ulimit",
        "nofile=20000:20000",
        "--ulimit",
        "nproc=1024:1024",
        "--read-only",
        "--tmpfs",
        "/tmp:rw,mode=1777",
        "--tmpfs",
        "/etc/ingress-controller:rw,mode=0700,U",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "NET_BIND_SERVICE",
        "--security-opt",
        "no-new-privileges",
        "-v",
        &volume,
        IMAGE,
        "--manifests",
        "/manifests",
        "--listen-address",
        "127.0.0.1",
        "--http-port",
        &h,
        "--https-port",
        &s,
        "--api-port",
        &a,
        "--metrics-address",
        &m,
        "--allow-local-endpoints",
        "--shutdown-grace-period",
        "1s",
        "--nginx-error-log",
        "stderr",
        "--nginx-access-log",
        "/dev/stdout",
    ]);
    let container = Container(name.clone());
    ok(&run);
    let logs = || {
        let out = podman(&["logs", &container.0]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    assert!(
        wait_until(Duration::from_secs(30), || {
            get_url(&format!("http://127.0.0.1:{metrics}/readyz")).is_some_and(|(s, _)| s == 200)
        }),
        "not ready:\n{}",
        logs()
    );
    assert_eq!(
        request(http, "web.test", "/").map(|a| a.1),
        Some(up.identity.clone()),
        "{}",
        logs()
    );
    // nginx's own logs reach the container's log, as the chart runs it.
    assert!(
        wait_until(Duration::from_secs(5), || {
            let l = logs();
            l.contains("start worker process") && l.contains("\"GET / HTTP/1.1\" 200")
        }),
        "nginx's logs are not in the container's log:\n{}",
        logs()
    );

    // Who runs: the controller as PID 1, uid 101, no effective capability
    // but NET_BIND_SERVICE.
    let exec = |args: &[&str]| {
        let mut all = vec!["exec", container.0.as_str()];
        all.extend_from_slice(args);
        podman(&all)
    };
    let inspect = ok(&exec(&[
        "/usr/local/bin/ingress-controller",
        "status",
        "--api-port",
        &a,
        "--metrics-address",
        &m,
    ]));
    assert!(inspect.contains("ready") && inspect.contains("true"), "{inspect}");
    let backends = ok(&exec(&[
        "/usr/local/bin/ingress-controller",
        "backends",
        "--api-port",
        &a,
    ]));
    assert!(backends.contains("demo-web-80"), "{backends}");

    let host_pid: u32 = ok(&podman(&["inspect", "--format", "{{.State.Pid}}", &container.0]))
        .trim()
        .parse()
        .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or("")
            .trim()
            .to_string()
    };
    assert!(field("Uid:").starts_with("101"), "{status}");
    assert_eq!(
        field("NSpid:").split_whitespace().last(),
        Some("1"),
        "the controller is PID 1"
    );
    assert_eq!(
        u64::from_str_radix(&field("CapEff:"), 16).unwrap() & !(1 << 10),
        0,
        "CapEff {}",
        field("CapEff:")
    );
    assert_eq!(field("NoNewPrivs:"), "1");

    // nginx inside: its -V, and the module mapped into its master.
    let v = exec(&["/usr/local/nginx/sbin/nginx", "-V"]);
    let v = String::from_utf8_lossy(&v.stderr);
    assert!(v.contains("nginx/1.28.3") && v.contains("--with-compat"), "{v}");
    let master = children(host_pid)
        .into_iter()
        .map(|(p, _)| p)
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .contains("nginx")
        })
        .expect("an nginx master under the controller");
    let maps = std::fs::read_to_string(format!("/proc/{master}/maps")).unwrap();
    assert!(
        maps.contains("ngx_http_dynamic_balancer_module.so"),
        "module not loaded"
    );

    // Kill the master: the controller restarts nginx, and the old workers
    // it kills are reaped by PID 1, not left as zombies.
    // SAFETY: kill(2) on the nginx master we just found under the container.
    unsafe { libc::kill(master as libc::pid_t, libc::SIGKILL) };
    assert!(
        wait_until(Duration::from_secs(20), || {
            request(http, "web.test", "/").is_some_and(|a| a.0 == 200)
                && children(host_pid)
                    .iter()
                    .all(|(p, state)| *p != master && *state != 'Z')
        }),
        "not recovered, or zombies left: {:?}\n{}",
        children(host_pid),
        logs()
    );

    // SIGTERM (podman stop): a clean exit within the grace period.
    ok(&podman(&["stop", "-t", "20", &container.0]));
    let code = ok(&podman(&["inspect", "--format", "{{.State.ExitCode}}", &container.0]));
    assert_eq!(code.trim(), "0", "{}", logs());
    assert!(logs().contains("nginx stopped"), "{}", logs());
}
