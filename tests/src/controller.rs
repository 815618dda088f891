//! The real `ingress-controller` on a manifest directory, running the real
//! nginx + module, on free loopback ports.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use crate::agent;
use crate::{artifacts, free_port};

/// The controller binary. `cargo test --workspace` builds it (the
/// controller package has integration tests, so its binary is built with
/// them); with `cargo test -p tests` alone, build it first with
/// `cargo build --release -p controller`. A nested `cargo build` here would
/// resolve features differently and rebuild half the tree on every run.
pub fn controller_binary() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/ingress-controller");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p controller` (or test with --workspace)",
        bin.display()
    );
    bin
}

pub struct Controller {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub manifests: PathBuf,
    pub http_port: u16,
    pub https_port: u16,
    pub api_port: u16,
    pub metrics_port: u16,
}

/// An HTTP answer: status and body.
pub type Answer = (u16, String);

/// A harness-only argument: start without `--allow-local-endpoints`.
pub const STRICT: &str = "--harness-strict-endpoints";

impl Controller {
    /// Writes `files` into a fresh manifest directory, starts the controller
    /// on it and waits until it is ready (first configuration applied).
    /// The test upstreams listen on loopback, so local endpoints are
    /// allowed (`--allow-local-endpoints`); see [`Controller::start_strict`].
    pub fn start(files: &[(&str, String)], extra_args: &[&str]) -> Controller {
        let c = Self::spawn(files, extra_args);
        c.wait_ready();
        c
    }

    /// As [`Controller::start`], with the default policy: endpoints on
    /// loopback and link-local addresses are refused.
    pub fn start_strict(files: &[(&str, String)], extra_args: &[&str]) -> Controller {
        let mut args = vec![STRICT];
        args.extend_from_slice(extra_args);
        Self::start(files, &args)
    }

    /// Starts without waiting for readiness.
    pub fn spawn(files: &[(&str, String)], extra_args: &[&str]) -> Controller {
        Self::spawn_with_env(files, extra_args, &[])
    }

    /// [`Controller::spawn`] with `env` set for the controller.
    fn spawn_with_env(files: &[(&str, String)], extra_args: &[&str], env: &[(&str, &str)]) -> Controller {
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        for (name, text) in files {
            std::fs::write(manifests.join(name), text).unwrap();
        }
        let source = ["--manifests".to_string(), manifests.display().to_string()];
        Self::spawn_in(dir, manifests, &source, extra_args, env)
    }

    /// As [`Controller::start`], with the downward-API variables a Pod
    /// would have (`POD_NAME`, `POD_NAMESPACE`): what the metrics' constant
    /// labels `controller_pod` and `controller_namespace` come from.
    pub fn start_as_pod(files: &[(&str, String)], extra_args: &[&str], pod: &str, namespace: &str) -> Controller {
        let c = Self::spawn_with_env(files, extra_args, &[("POD_NAME", pod), ("POD_NAMESPACE", namespace)]);
        c.wait_ready();
        c
    }

    /// Starts on a cluster (a kubeconfig) and waits until ready.
    pub fn start_on_cluster(kubeconfig: &str, extra_args: &[&str]) -> Controller {
        Self::start_on_cluster_as(kubeconfig, extra_args, "ingress-controller-e2e")
    }

    /// As [`Controller::start_on_cluster`], as the Pod `pod_name` (its
    /// identity in leader election).
    pub fn start_on_cluster_as(kubeconfig: &str, extra_args: &[&str], pod_name: &str) -> Controller {
        let c = Self::spawn_on_cluster(kubeconfig, extra_args, pod_name);
        c.wait_ready();
        c
    }

    /// Starts on a cluster without waiting for readiness.
    pub fn spawn_on_cluster(kubeconfig: &str, extra_args: &[&str], pod_name: &str) -> Controller {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, kubeconfig).unwrap();
        let source = ["--kubeconfig".to_string(), path.display().to_string()];
        let manifests = dir.path().join("unused");
        // As a Deployment's downward API would: RELOAD events go to this Pod.
        let env = [("POD_NAME", pod_name), ("POD_NAMESPACE", "ingress-nginx")];
        Self::spawn_in(dir, manifests, &source, extra_args, &env)
    }

    fn spawn_in(
        dir: tempfile::TempDir,
        manifests: PathBuf,
        source: &[String],
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Controller {
        let (nginx, module) = artifacts();
        let (http_port, https_port, api_port, metrics_port) = (free_port(), free_port(), free_port(), free_port());
        let strict = extra_args.contains(&STRICT);
        let extra_args: Vec<&str> = extra_args.iter().copied().filter(|a| *a != STRICT).collect();
        let local: &[&str] = if strict { &[] } else { &["--allow-local-endpoints"] };
        let log = std::fs::File::create(dir.path().join("controller.log")).unwrap();
        let child = Command::new(controller_binary())
            .args(source)
            .arg("--nginx-binary")
            .arg(nginx)
            .arg("--nginx-module")
            .arg(module)
            .arg("--conf-dir")
            .arg(dir.path().join("nginx"))
            .args(["--listen-address", "127.0.0.1"])
            .args(["--http-port", &http_port.to_string()])
            .args(["--https-port", &https_port.to_string()])
            .args(["--api-port", &api_port.to_string()])
            .args(["--metrics-address", &format!("127.0.0.1:{metrics_port}")])
            .args(["--reload-settle-ms", "100", "--error-log-level", "info"])
            .args(local)
            .args(&extra_args)
            .envs(env.iter().copied())
            .env(
                "RUST_LOG",
                std::env::var("CONTROLLER_LOG").unwrap_or_else(|_| "info,controller::sync=debug".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting ingress-controller");
        Controller {
            child: Some(child),
            dir,
            manifests,
            http_port,
            https_port,
            api_port,
            metrics_port,
        }
    }

    /// The controller's own pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("controller.log")).unwrap_or_default()
    }

    /// nginx's error log (the controller's default, beside nginx.conf).
    pub fn nginx_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nginx/logs/error.log")).unwrap_or_default()
    }

    pub fn conf(&self) -> String {
        std::fs::read_to_string(self.conf_path()).unwrap_or_default()
    }

    /// The running nginx.conf.
    pub fn conf_path(&self) -> PathBuf {
        self.dir.path().join("nginx/nginx.conf")
    }

    pub fn wait_ready(&self) {
        let ok = wait_until(Duration::from_secs(30), || {
            get_url(&format!("http://127.0.0.1:{}/readyz", self.metrics_port)).is_some_and(|(s, _)| s == 200)
        });
        assert!(ok, "controller not ready within 30 s; log:\n{}", self.log());
    }

    /// Replaces a manifest file atomically (write + rename), as editors and
    /// config-management tools do.
    pub fn write(&self, name: &str, text: &str) {
        let tmp = self.dir.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.manifests.join(name)).unwrap();
    }

    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.manifests.join(name)).unwrap();
    }

    /// GET through nginx with a Host header.
    pub fn get(&self, host: &str, path: &str) -> Answer {
        request(self.http_port, host, path).unwrap_or((0, String::new()))
    }

    /// The upstream identities that answer `n` requests.
    pub fn seen(&self, host: &str, path: &str, n: usize) -> BTreeSet<String> {
        (0..n).map(|_| self.get(host, path).1).collect()
    }

    /// The value of a metric with no labels but the constant ones.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = get_url(&format!("http://127.0.0.1:{}/metrics", self.metrics_port)).unwrap_or_default();
        sample_value(&text, name).unwrap_or(f64::NAN)
    }

    /// Successful reloads so far, by the controller's own count (the first
    /// start counts as one).
    pub fn reloads(&self) -> f64 {
        self.metric("nginx_ingress_controller_success")
    }

    /// The reload count once it has reached `at_least` (or 10 s passed):
    /// new workers can serve a new host a moment before the controller,
    /// still pushing, counts the reload as a success.
    pub fn reloads_reaching(&self, at_least: f64) -> f64 {
        wait_until(Duration::from_secs(10), || self.reloads() >= at_least);
        std::thread::sleep(Duration::from_millis(300));
        self.reloads()
    }

    /// The module API's token, as the controller wrote it.
    pub fn api_token(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nginx/api-token"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// GET on the module's API, with the controller's token.
    pub fn api_get(&self, path: &str) -> Option<Answer> {
        let mut resp = agent()
            .get(&format!("http://127.0.0.1:{}{path}", self.api_port))
            .header("Authorization", &format!("Bearer {}", self.api_token()))
            .call()
            .ok()?;
        let status = resp.status().as_u16();
        Some((status, resp.body_mut().read_to_string().unwrap_or_default()))
    }

    /// The worker pids the module reports: they change on every reload.
    pub fn worker_pids(&self) -> BTreeSet<u64> {
        let (_, body) = self.api_get("/configuration/status").unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w["pid"].as_u64())
            .collect()
    }

    /// Waits (up to 15 s) until none of `pids` is alive: once the workers
    /// of an older generation are gone, every new connection meets the
    /// current configuration. (Right after a reload, old workers may still
    /// accept a connection until they have closed their listeners.)
    pub fn wait_workers_gone(&self, pids: &BTreeSet<u64>) -> bool {
        wait_until(Duration::from_secs(15), || {
            // SAFETY: signal 0 only checks that the pid exists.
            pids.iter().all(|p| unsafe { libc::kill(*p as libc::pid_t, 0) } != 0)
        })
    }

    pub fn nginx_master_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.path().join("nginx/logs/nginx.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Sends `sig` to the controller process.
    pub fn signal(&self, sig: libc::c_int) {
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on the process we started and have not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        }
    }

    /// Whether the controller process has exited (reaping it if so).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// `/readyz`'s status code (0: no answer).
    pub fn readyz(&self) -> u16 {
        get_url(&format!("http://127.0.0.1:{}/readyz", self.metrics_port)).map_or(0, |(s, _)| s)
    }

    /// Runs an inspection subcommand against this controller (as
    /// `kubectl exec ... ingress-controller <args>` would); returns (exit
    /// success, stdout, stderr).
    pub fn inspect(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(controller_binary())
            .args(args)
            .arg("--conf-dir")
            .arg(self.dir.path().join("nginx"))
            .args(["--api-port", &self.api_port.to_string()])
            .args(["--metrics-address", &format!("127.0.0.1:{}", self.metrics_port)])
            .output()
            .expect("running ingress-controller");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// SIGTERM, as Kubernetes stops a pod; waits for a graceful exit.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let master = self.nginx_master_pid();
        // SAFETY: kill(2) on the process we started and have not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut status = None;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = child.try_wait() {
                status = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if status.is_none() {
            let _ = child.kill();
            status = child.wait().ok();
        }
        // Never leave an nginx behind, whatever happened to the controller
        // (one killed with SIGKILL leaves its nginx running): the master and
        // its workers, which share the process group the controller gave
        // the master. Killing the master alone would orphan the workers.
        if let Some(pid) = master.filter(|p| *p > 1) {
            // SAFETY: kill(2) on the process group of the master we saw in
            // our own temp prefix (the controller makes it a group leader),
            // then on the master itself in case it is not.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
        }
        status
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The IngressClass every controller test uses (ours, by spec.controller).
pub const INGRESS_CLASS: &str =
    "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: nginx}\nspec: {controller: k8s.io/ingress-nginx}\n";

/// Both apiserver tiers, as far as the scaling tests use them.
pub trait Cluster {
    /// Creates or replaces one object.
    fn apply_object(&self, obj: serde_json::Value);

    fn delete(&self, kind: &str, namespace: &str, name: &str);

    /// Applies every document of a multi-document YAML string.
    fn apply_yaml(&self, yaml: &str) {
        for doc in yaml.split("\n---\n") {
            let v: serde_json::Value = serde_saphyr::from_str(doc).expect("test manifests are valid YAML");
            if !v.is_null() {
                self.apply_object(v);
            }
        }
    }
}

/// Replaces Service `name`'s EndpointSlices (as [`service`] writes them)
/// with one per port in `ports`.
pub fn set_endpoints(api: &impl Cluster, name: &str, ports: &[u16]) {
    set_endpoints_at(api, "127.0.0.1", name, ports);
}

/// As [`set_endpoints`], for upstreams on `address`.
pub fn set_endpoints_at(api: &impl Cluster, address: &str, name: &str, ports: &[u16]) {
    for i in 0..8 {
        api.delete("EndpointSlice", "demo", &format!("{name}-{i}"));
    }
    api.apply_yaml(&service_at(address, name, ports));
}

/// Alternates Service `web` between `ups[0]` and `ups[1..]` for `rounds`
/// rounds; after each change traffic to `web.test` must reach exactly the
/// new set within `timeout`.
pub fn alternate_endpoints(
    api: &impl Cluster,
    c: &Controller,
    ups: &[crate::upstream::Upstream],
    rounds: usize,
    timeout: Duration,
) {
    for round in 0..rounds {
        let set: Vec<&crate::upstream::Upstream> = if round % 2 == 0 {
            ups[1..].iter().collect()
        } else {
            vec![&ups[0]]
        };
        set_endpoints_at(
            api,
            &ups[0].address,
            "web",
            &set.iter().map(|u| u.port).collect::<Vec<_>>(),
        );
        let want: BTreeSet<String> = set.iter().map(|u| u.identity.clone()).collect();
        assert!(
            wait_until(timeout, || c.seen("web.test", "/", 6) == want),
            "round {round}\n{}",
            c.log()
        );
    }
}

/// Polls `f` every 20 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

pub fn get_url(url: &str) -> Option<Answer> {
    let mut resp = agent().get(url).call().ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.body_mut().read_to_string().unwrap_or_default()))
}

pub fn request(port: u16, host: &str, path: &str) -> Option<Answer> {
    let mut resp = agent()
        .get(&format!("http://127.0.0.1:{port}{path}"))
        .header("Host", host)
        .call()
        .ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.body_mut().read_to_string().unwrap_or_default()))
}

/// Manifests for one Service `name` in namespace `demo` with an
/// EndpointSlice listing `ports` on 127.0.0.1.
pub fn service(name: &str, ports: &[u16]) -> String {
    service_at("127.0.0.1", name, ports)
}

/// As [`service`], for upstreams on `address` (the pod network's, on a
/// real apiserver, which refuses loopback endpoints).
pub fn service_at(address: &str, name: &str, ports: &[u16]) -> String {
    // One slice per endpoint: test upstreams differ by port, and an
    // EndpointSlice's ports apply to all of its endpoints.
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: demo, name: {name}}}\nspec:\n  ports: [{{name: http, port: 80}}]\n"
    );
    for (i, port) in ports.iter().enumerate() {
        out.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: demo\n  name: {name}-{i}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, port: {port}}}]\nendpoints: [{{addresses: [\"{address}\"]}}]\n"
        ));
    }
    out
}

/// An Ingress routing `host` + `path` (Prefix) to `service` port 80, with
/// optional annotations (`key: value` lines without the prefix), in
/// namespace `demo`.
pub fn ingress(name: &str, host: &str, path: &str, service: &str, annotations: &[(&str, &str)]) -> String {
    ingress_in("demo", name, host, path, "Prefix", service, annotations)
}

/// An Ingress in `ns` routing `host` + `path` (of `path_type`) to `service`
/// port 80, with optional annotations.
pub fn ingress_in(
    ns: &str,
    name: &str,
    host: &str,
    path: &str,
    path_type: &str,
    service: &str,
    annotations: &[(&str, &str)],
) -> String {
    let mut ann = String::new();
    for (k, v) in annotations {
        ann.push_str(&format!("    nginx.ingress.kubernetes.io/{k}: {v:?}\n"));
    }
    let ann = if ann.is_empty() {
        String::new()
    } else {
        format!("  annotations:\n{ann}")
    };
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  namespace: {ns}\n  name: {name}\n{ann}spec:\n  ingressClassName: nginx\n  rules:\n    - host: {host}\n      http:\n        paths:\n          - path: {path}\n            pathType: {path_type}\n            backend: {{service: {{name: {service}, port: {{number: 80}}}}}}\n"
    )
}

/// The built-in template with `edit` applied, written to a file in `dir`
/// for `--template`; panics if `edit` changed nothing.
pub fn custom_template(dir: &std::path::Path, edit: impl FnOnce(&str) -> String) -> PathBuf {
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../controller/templates/nginx.conf.j2"
    ))
    .unwrap();
    let edited = edit(&base);
    assert_ne!(edited, base, "the template edit changed nothing");
    let path = dir.join("nginx.conf.j2");
    std::fs::write(&path, edited).unwrap();
    path
}

/// The value of the first sample that `spec` names in Prometheus text:
/// `name` or `name{a="x",b="y"}`, a sample of `name` with at least those
/// labels (the controller's families also carry the constant labels
/// `controller_class`, `controller_namespace` and `controller_pod`).
pub fn sample_value(text: &str, spec: &str) -> Option<f64> {
    let (name, wanted) = match spec.split_once('{') {
        Some((n, rest)) => (n, rest.strip_suffix('}').unwrap_or(rest)),
        None => (spec, ""),
    };
    let wanted: Vec<&str> = split_label_set(wanted);
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let (set, value) = match rest.strip_prefix('{') {
            Some(r) => r.rsplit_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        let have = split_label_set(set);
        if !wanted.iter().all(|w| have.contains(w)) {
            return None;
        }
        value.trim().parse().ok()
    })
}

/// `a="x",b="y,z"` into `a="x"`, `b="y,z"` (commas inside quotes kept).
pub fn split_label_set(set: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in set.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&set[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < set.len() {
        out.push(&set[start..]);
    }
    out
}
