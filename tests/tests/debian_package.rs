//! The Debian package (`cargo run -p nginx-build -- deb`) on Debian's own
//! nginx, installed with apt as a user installs it: the package depends on
//! the nginx ABI, enables itself through `modules-enabled`, and the
//! distribution's binary, configured the way Debian's nginx.conf does it
//! (`include /etc/nginx/modules-enabled/*.conf`, its own prefix), serves an
//! API-driven upstream. A module built for another nginx is refused by
//! nginx itself, both ways.
//!
//! The suites of the module run on the same installation with
//! `cargo run -p nginx-build -- deb-test`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::json;
use tests::upstream::Upstream;
use tests::{agent, artifacts, free_port, stop_child};

const PACKAGE: &str = "libnginx-mod-http-dynamic-balancer";
const DISTRO_NGINX: &str = "/usr/sbin/nginx";
const INSTALLED_MODULE: &str = "/usr/lib/nginx/modules/ngx_http_dynamic_balancer_module.so";
const ENABLED: &str = "/etc/nginx/modules-enabled/50-mod-http-dynamic-balancer.conf";
const TOKEN: &str = "debian-package-test-token-0123456789";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Builds and installs the package once for every test of this file
/// (`nginx-build deb-install`: apt installs Debian's nginx with it); the
/// path of the `.deb`.
fn installed() -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(|| {
        let out = Command::new(root().join("target/release/nginx-build"))
            .arg("deb-install")
            .stderr(Stdio::inherit())
            .output()
            .expect("target/release/nginx-build (cargo run --release -p nginx-build)");
        assert!(out.status.success(), "nginx-build deb-install failed");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let deb = stdout
            .lines()
            .find_map(|l| l.strip_prefix("package: "))
            .unwrap_or_else(|| panic!("no package line in {stdout}"));
        PathBuf::from(deb.trim())
    })
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn field(deb: &Path, name: &str) -> String {
    let out = Command::new("dpkg-deb").arg("-f").arg(deb).arg(name).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `nginx version: nginx/1.22.1` → 1022001, nginx's `nginx_version`.
fn version_number(nginx: &Path) -> u64 {
    let out = Command::new(nginx).arg("-v").output().unwrap();
    let printed = text(&out);
    let v = printed
        .trim()
        .rsplit('/')
        .next()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    let parts: Vec<u64> = v.split('.').map(|p| p.parse().unwrap()).collect();
    parts[0] * 1_000_000 + parts[1] * 1_000 + parts[2]
}

#[test]
fn the_package_depends_on_the_nginx_abi_and_enables_itself() {
    let deb = installed();
    let name = deb.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("{PACKAGE}_")) && name.ends_with(".deb"),
        "{name}"
    );
    let provides = Command::new("dpkg-query")
        .args(["-W", "-f=${Provides}", "nginx"])
        .output()
        .unwrap();
    let abi = String::from_utf8_lossy(&provides.stdout)
        .split(", ")
        .find(|p| p.starts_with("nginx-abi-"))
        .expect("Debian's nginx provides an nginx-abi-* name")
        .to_string();
    let depends = field(deb, "Depends");
    assert!(depends.split(", ").any(|d| d == abi), "Depends {depends:?} lacks {abi}");
    assert!(depends.contains("libc6"), "{depends}");
    assert_eq!(field(deb, "Section"), "httpd");

    let status = Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Status}", PACKAGE])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&status.stdout), "installed");
    let link = std::fs::read_link(ENABLED).expect("the postinst links the snippet into modules-enabled");
    assert_eq!(
        link,
        Path::new("/usr/share/nginx/modules-available/mod-http-dynamic-balancer.conf")
    );
    assert_eq!(
        std::fs::read_to_string(&link).unwrap(),
        "load_module modules/ngx_http_dynamic_balancer_module.so;\n"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(INSTALLED_MODULE).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
    // Stripped, as Debian ships modules.
    let sections = Command::new("objdump")
        .arg("-h")
        .arg(INSTALLED_MODULE)
        .output()
        .unwrap();
    assert!(!text(&sections).contains(".debug_info"), "the module is not stripped");
}

/// Debian's nginx, under its own prefix (`/usr/share/nginx`, so that the
/// snippet's relative `modules/` path resolves as on a server), with the
/// configuration, logs and pid in a temporary directory.
struct DistroNginx {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    api_port: u16,
}

impl DistroNginx {
    fn conf(dir: &Path, port: u16, api_port: u16) -> String {
        let d = dir.display();
        format!(
            r#"include /etc/nginx/modules-enabled/*.conf;
user www-data;
worker_processes 2;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    dynamic_balancer_zone 8m;
    upstream dynamic_backends {{
        server 0.0.0.1;
        dynamic_balancer;
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            set $proxy_upstream_name "shop";
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            add_header X-Upstream-Addr $upstream_addr always;
            proxy_pass http://dynamic_backends;
        }}
    }}
    server {{
        listen 127.0.0.1:{api_port};
        location /configuration {{
            dynamic_balancer_api_token {TOKEN};
            dynamic_balancer_api;
        }}
    }}
}}
"#
        )
    }

    fn command(dir: &Path) -> Command {
        let mut cmd = Command::new(DISTRO_NGINX);
        cmd.arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg(dir.join("error.log"))
            .stdin(Stdio::null());
        cmd
    }

    fn start() -> DistroNginx {
        installed();
        let dir = tempfile::tempdir().unwrap();
        let (port, api_port) = (free_port(), free_port());
        std::fs::write(dir.path().join("nginx.conf"), Self::conf(dir.path(), port, api_port)).unwrap();
        let test = Self::command(dir.path()).arg("-t").output().unwrap();
        assert!(test.status.success(), "nginx -t: {}", text(&test));
        let child = Self::command(dir.path()).spawn().unwrap();
        let nginx = DistroNginx {
            child,
            dir,
            port,
            api_port,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while nginx.api("GET", "/configuration/status", None).0 != 200 {
            assert!(Instant::now() < deadline, "nginx did not start: {}", nginx.error_log());
            std::thread::sleep(Duration::from_millis(50));
        }
        nginx
    }

    fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    fn api(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let url = format!("http://127.0.0.1:{}{path}", self.api_port);
        let auth = format!("Bearer {TOKEN}");
        let result = match body {
            Some(b) => agent().run(
                ureq::http::Request::builder()
                    .method(method)
                    .uri(&url)
                    .header("Authorization", &auth)
                    .body(b.to_string())
                    .unwrap(),
            ),
            None => agent().run(
                ureq::http::Request::builder()
                    .method(method)
                    .uri(&url)
                    .header("Authorization", &auth)
                    .body(())
                    .unwrap(),
            ),
        };
        match result {
            Ok(mut r) => (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    fn get(&self) -> (u16, String) {
        let mut r = agent()
            .get(&format!("http://127.0.0.1:{}/", self.port))
            .call()
            .expect("nginx answers");
        let upstream = r
            .headers()
            .get("x-upstream")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let _ = r.body_mut().read_to_string();
        (r.status().as_u16(), upstream)
    }
}

impl Drop for DistroNginx {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

#[test]
fn debian_nginx_serves_an_api_driven_upstream() {
    let nginx = DistroNginx::start();
    let (a, b) = (Upstream::start(), Upstream::start());
    assert_eq!(nginx.get().0, 503, "no backend yet");

    let backend = json!({"name": "shop", "endpoints": [a.endpoint(), b.endpoint()]});
    let (code, body) = nginx.api("PUT", "/configuration/backends/shop", Some(&backend.to_string()));
    assert_eq!(code, 201, "{body}");
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let (status, upstream) = nginx.get();
        assert_eq!(status, 200);
        seen.insert(upstream);
    }
    assert_eq!(
        seen,
        [a.identity.clone(), b.identity.clone()].into_iter().collect(),
        "round-robin over both endpoints"
    );

    // An endpoint change applies on the next request, with no reload.
    let only_b = json!({"name": "shop", "endpoints": [b.endpoint()]});
    let (code, body) = nginx.api("PUT", "/configuration/backends/shop", Some(&only_b.to_string()));
    assert!(code == 200 || code == 201, "{code} {body}");
    for _ in 0..10 {
        assert_eq!(nginx.get(), (200, b.identity.clone()));
    }
    // Validation is the module's own: a bad body is a 400 with a JSON error.
    let (code, body) = nginx.api("PUT", "/configuration/backends/shop", Some("{\"name\":"));
    assert_eq!(code, 400, "{body}");
    assert!(serde_json::from_str::<serde_json::Value>(&body).is_ok(), "{body}");
    assert!(!nginx.error_log().contains("[alert]"), "{}", nginx.error_log());
    assert!(!nginx.error_log().contains("[emerg]"), "{}", nginx.error_log());
}

/// A module loads only into the nginx version it was built for; nginx says
/// so itself, and `nginx -t` fails. (The vendored module, with its stream
/// half, is refused by Debian's nginx even earlier, at dlopen().)
#[test]
fn a_module_for_another_nginx_is_refused() {
    installed();
    let (vendored_nginx, vendored_module) = artifacts();
    let distro = version_number(Path::new(DISTRO_NGINX));
    let ours = version_number(&vendored_nginx);
    assert_ne!(distro, ours, "the two builds are of different nginx versions");
    for (nginx, module, built_for, running) in [
        (Path::new(DISTRO_NGINX), vendored_module.as_path(), ours, distro),
        (vendored_nginx.as_path(), Path::new(INSTALLED_MODULE), distro, ours),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        std::fs::write(
            dir.path().join("nginx.conf"),
            format!(
                "load_module {};\npid {d}/nginx.pid;\nerror_log {d}/error.log;\nevents {{}}\n",
                module.display()
            ),
        )
        .unwrap();
        let out = Command::new(nginx)
            .arg("-p")
            .arg(format!("{d}/"))
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-t")
            .output()
            .unwrap();
        let printed = text(&out);
        assert!(!out.status.success(), "{} loaded {}", nginx.display(), module.display());
        let version = printed.contains(&format!("version {built_for} instead of {running}"));
        // The vendored module carries the stream half, whose symbols
        // Debian's nginx has only with libnginx-mod-stream loaded: without
        // it dlopen() refuses the module before the version check can.
        let stream = module == vendored_module.as_path() && printed.contains("undefined symbol: ngx_stream_");
        assert!(version || stream, "{printed}");
    }
}

/// The book's bare-metal setup (docs/src/install/bare-metal.md), as a server's administrator does it: the
/// package's example configuration (ports and paths moved into a temporary
/// directory), the token file, the state directory owned by the workers'
/// user, backends put with `dynamic-balancer`; then nginx is killed with
/// SIGKILL, master and workers, and started again: the first request routes
/// by the backends the state file kept.
#[test]
fn the_example_configuration_with_the_client_survives_kill_9() {
    installed();
    let cli = root().join("target/release/dynamic-balancer");
    assert!(
        cli.exists(),
        "{} is missing (cargo build -p balancer-cli)",
        cli.display()
    );
    let example =
        std::fs::read_to_string("/usr/share/doc/libnginx-mod-http-dynamic-balancer/examples/dynamic-balancer.conf")
            .expect("the package ships its example");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    use std::os::unix::fs::PermissionsExt;
    // The workers (www-data) go through it to their state directory.
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let state_dir = d.join("state");
    std::fs::create_dir(&state_dir).unwrap();
    let chown = Command::new("chown")
        .arg("www-data:www-data")
        .arg(&state_dir)
        .output()
        .unwrap();
    assert!(chown.status.success(), "{}", text(&chown));
    std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(d.join("token"), format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(d.join("token"), std::fs::Permissions::from_mode(0o600)).unwrap();

    let (port, api_port) = (free_port(), free_port());
    let site = example
        .replace("listen 80;", &format!("listen 127.0.0.1:{port};"))
        .replace("listen 127.0.0.1:10246;", &format!("listen 127.0.0.1:{api_port};"))
        .replace(
            "/var/lib/nginx/dynamic-balancer/backends.state",
            &state_dir.join("backends.state").display().to_string(),
        )
        .replace(
            "/etc/nginx/dynamic-balancer.token",
            &d.join("token").display().to_string(),
        );
    assert!(site.contains(&format!("127.0.0.1:{api_port}")) && site.contains("dynamic_balancer_state"));
    std::fs::write(d.join("dynamic-balancer.conf"), site).unwrap();
    std::fs::write(
        d.join("nginx.conf"),
        format!(
            "include /etc/nginx/modules-enabled/*.conf;\nuser www-data;\nworker_processes 2;\ndaemon off;\n\
             pid {p}/nginx.pid;\nerror_log {p}/error.log info;\nevents {{ worker_connections 256; }}\n\
             http {{\n    access_log off;\n    include {p}/dynamic-balancer.conf;\n}}\n",
            p = d.display()
        ),
    )
    .unwrap();
    let start = || {
        let child = DistroNginx::command(&d).spawn().unwrap();
        (child, Instant::now())
    };
    let client = |args: &[&str]| {
        let api = format!("http://127.0.0.1:{api_port}");
        let token = d.join("token");
        let mut all = vec![
            "--api",
            &api,
            "--token-file",
            token.to_str().unwrap(),
            "--timeout",
            "5s",
        ];
        all.extend_from_slice(args);
        Command::new(&cli).args(&all).stdin(Stdio::null()).output().unwrap()
    };
    let get = || -> Option<(u16, String)> {
        let r = agent()
            .get(&format!("http://127.0.0.1:{port}/"))
            .header("Host", "shop.example.com")
            .call()
            .ok()?;
        let upstream = r.headers().get("x-upstream")?.to_str().ok()?.to_string();
        Some((r.status().as_u16(), upstream))
    };
    let error_log = || std::fs::read_to_string(d.join("error.log")).unwrap_or_default();

    let test = DistroNginx::command(&d).arg("-t").output().unwrap();
    assert!(test.status.success(), "nginx -t on the example: {}", text(&test));
    let (mut child, _) = start();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !client(&["status"]).status.success() {
        assert!(Instant::now() < deadline, "nginx did not start: {}", error_log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (a, b) = (Upstream::start(), Upstream::start());
    let put = client(&[
        "put",
        "shop",
        "--endpoint",
        &format!("127.0.0.1:{}", a.port),
        "--endpoint",
        &format!("127.0.0.1:{}@2", b.port),
    ]);
    assert!(put.status.success(), "dynamic-balancer put: {}", text(&put));
    let served: Vec<String> = (0..6).map(|_| get().expect("routed").1).collect();
    assert_eq!(served.iter().filter(|u| **u == a.identity).count(), 2, "{served:?}");
    assert_eq!(served.iter().filter(|u| **u == b.identity).count(), 4, "{served:?}");

    // The file is written after the answer: wait until it holds the write.
    let state = state_dir.join("backends.state");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status: serde_json::Value =
            serde_json::from_slice(&client(&["--output", "json", "status"]).stdout).unwrap_or_default();
        let file = &status["state_file"];
        if file["generation"].as_u64().is_some() && file["generation"] == status["generation"] {
            assert!(file["error"].is_null(), "{status}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the state file was not written: {status}\n{}",
            error_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let meta = std::fs::metadata(&state).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    // A crash: the master and its workers, SIGKILL.
    let workers: Vec<i32> = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id()))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    let _ = child.kill();
    for pid in &workers {
        // SAFETY: kill(2) on a worker of the master this test started.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while workers.iter().any(|p| Path::new(&format!("/proc/{p}")).exists()) {
        assert!(Instant::now() < deadline, "workers outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(10));
    }

    let (mut child, started) = start();
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(answer) = get() {
            break answer;
        }
        assert!(Instant::now() < deadline, "nginx did not come back: {}", error_log());
        std::thread::sleep(Duration::from_millis(5));
    };
    eprintln!("first answer {:?} after the restart", started.elapsed());
    assert_eq!(first.0, 200, "the first request after the restart routes");
    assert!(first.1 == a.identity || first.1 == b.identity, "{first:?}");
    let listed = client(&["--output", "json", "get", "shop"]);
    assert!(listed.status.success(), "{}", text(&listed));
    assert!(
        error_log().contains("backends.state"),
        "the restore is logged: {}",
        error_log()
    );
    stop_child(&mut child);
}
