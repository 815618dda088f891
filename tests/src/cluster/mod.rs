//! A real single-node Kubernetes cluster on this machine: etcd,
//! kube-apiserver (`Node,RBAC`), kube-controller-manager, kube-scheduler,
//! containerd + runc, kubelet, kube-proxy (iptables mode) and the bridge
//! CNI, the binaries from `tests/kube/build.sh node` (cached outside the
//! clone). Used by the cluster tier's tests and by the `cluster` binary
//! (`up`, `down`, `install`) for anyone who wants to try the real thing.
//!
//! Addresses come from 198.19.0.0/16 (RFC 2544's benchmarking block, never
//! a private or public range): the node is [`NODE_IP`] on the bridge
//! [`BRIDGE`], Pods are [`POD_CIDR`], Services [`SERVICE_CIDR`]. A guard
//! chain drops anything forwarded off the bridge (see [`host`]), so no Pod
//! or Service packet leaves the machine.
//!
//! Everything lives in [`RUN_DIR`]; [`down`] stops every process by pid,
//! unmounts, removes the cgroups, the bridge and the chains, restores the
//! sysctls kubelet and kube-proxy changed, and deletes the directory.

pub mod config;
pub mod conformance;
pub mod daemons;
pub mod host;
pub mod images;
pub mod pki;
pub mod watch;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const NODE_NAME: &str = "dynbal-node";
/// The node's address, on the bridge: the apiserver's advertise address
/// (Pods reach it through the `kubernetes` Service), kubelet's and the
/// NodePorts'.
pub const NODE_IP: &str = "198.19.0.1";
pub const POD_GATEWAY: &str = NODE_IP;
pub const POD_CIDR: &str = "198.19.0.0/24";
pub const SERVICE_CIDR: &str = "198.19.16.0/20";
/// The whole range the node uses (guarded).
pub const NODE_RANGE: &str = "198.19.0.0/16";
/// Addresses a test hands out as a LoadBalancer controller would (routed
/// onto the bridge; kube-proxy answers for them).
pub const LB_POOL: &str = "198.19.32.0/24";
pub const KUBERNETES_SERVICE_IP: &str = "198.19.16.1";
/// kubelet's clusterDNS: no DNS server runs; queries go nowhere.
pub const CLUSTER_DNS_IP: &str = "198.19.16.10";
pub const BRIDGE: &str = "dbcni0";
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
pub const RUN_DIR: &str = "/var/lib/dynamic-balancer-cluster";
/// Where the last run's logs are kept after teardown.
pub const LAST_LOGS: &str = "/tmp/dynamic-balancer-cluster-logs";

/// Paths of one node.
#[derive(Clone)]
pub struct Layout {
    pub run: PathBuf,
    /// The tier's binaries (tests/kube/build.sh node).
    pub bin: PathBuf,
    pub cni_bin: PathBuf,
}

impl Layout {
    pub fn new(bin: PathBuf) -> Layout {
        let tier = bin.parent().unwrap_or(Path::new("/")).to_path_buf();
        Layout {
            run: PathBuf::from(RUN_DIR),
            cni_bin: tier.join("cni"),
            bin,
        }
    }
    pub fn pki(&self) -> PathBuf {
        self.run.join("pki")
    }
    pub fn logs(&self) -> PathBuf {
        self.run.join("logs")
    }
    pub fn pids(&self) -> PathBuf {
        self.run.join("pids")
    }
    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        self.run.join(format!("{name}.kubeconfig"))
    }
    pub fn containerd_socket(&self) -> PathBuf {
        self.run.join("containerd.sock")
    }
}

/// Runs `tests/kube/build.sh node` (a no-op once cached) and returns the
/// tier's bin directory.
pub fn node_tier() -> Result<PathBuf, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kube/build.sh");
    let out = Command::new(&script)
        .arg("node")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err("tests/kube/build.sh node failed (see above)".into());
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("").trim());
    for b in [
        "kubelet",
        "kube-proxy",
        "kube-scheduler",
        "containerd",
        "runc",
        "catatonit",
    ] {
        if !dir.join(b).exists() {
            return Err(format!("no {b} in {}", dir.display()));
        }
    }
    Ok(dir)
}

/// Holds the machine-wide lock while a node is brought up or taken down.
struct Lock(#[allow(dead_code)] std::fs::File);

impl Lock {
    fn take() -> Result<Lock, String> {
        let f = std::fs::File::create("/tmp/dynamic-balancer-cluster.lock").map_err(|e| e.to_string())?;
        // SAFETY: flock(2) on a file we own; released when the file drops.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err("flock".into());
        }
        Ok(Lock(f))
    }
}

/// Runs `cmd`; its stdout, or an error naming the command and its stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{:?} {:?}: {}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Polls `check` every 200 ms until it returns true or `timeout` passes.
pub fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) -> Result<Duration, String> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check() {
            return Ok(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("timed out after {timeout:?} waiting for {what}"))
}

/// How a bring-up went, phase by phase.
#[derive(Debug, Default, Clone)]
pub struct Timings(pub Vec<(String, Duration)>);

impl Timings {
    fn lap(&mut self, what: &str, since: &mut Instant) {
        self.0.push((what.to_string(), since.elapsed()));
        *since = Instant::now();
    }
    pub fn total(&self) -> Duration {
        self.0.iter().map(|(_, d)| *d).sum()
    }
}

impl std::fmt::Display for Timings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (what, d) in &self.0 {
            write!(f, "{what} {:.1}s, ", d.as_secs_f64())?;
        }
        write!(f, "total {:.1}s", self.total().as_secs_f64())
    }
}

/// A node brought up by this process; taken down when dropped unless
/// [`Cluster::keep`] was called.
pub struct Cluster {
    pub layout: Layout,
    pub timings: Timings,
    keep: bool,
}

/// What the bring-up needs besides the tier's binaries.
pub struct Images<'a> {
    /// The `pod-backend` binary.
    pub backend: &'a Path,
    /// Export the project image from buildah's storage (built by
    /// `nginx-build image`); false when a caller has no use for it.
    pub controller: bool,
}

impl Cluster {
    /// Takes down any node left behind, then brings one up and waits until
    /// the Node is Ready.
    pub fn up(images: &Images) -> Result<Cluster, String> {
        let bin = node_tier()?;
        let layout = Layout::new(bin);
        let _lock = Lock::take()?;
        if layout.run.exists() {
            let left = recorded_layout().unwrap_or_else(|| layout.clone());
            let report = down_locked(&left);
            if !report.errors.is_empty() {
                return Err(format!("a node left behind did not come down: {:?}", report.errors));
            }
        }
        let mut cluster = Cluster {
            layout,
            timings: Timings::default(),
            keep: false,
        };
        if let Err(e) = cluster.start(images) {
            let report = down_locked(&cluster.layout);
            cluster.keep = true;
            return Err(format!("{e}\n(the node was taken down: {report}; logs in {LAST_LOGS})"));
        }
        Ok(cluster)
    }

    /// The node a previous `up` left running (the `cluster install` and
    /// `cluster status` commands); dropping it leaves the node up.
    pub fn attach() -> Result<Cluster, String> {
        let layout = recorded_layout().ok_or("no node here; bring one up with `cluster up`")?;
        let down: Vec<&str> = daemons::ORDER
            .iter()
            .copied()
            .filter(|d| daemons::running(&layout, d).is_none())
            .collect();
        if !down.is_empty() {
            return Err(format!(
                "no node running here ({} not running); bring one up with `cluster up`",
                down.join(", ")
            ));
        }
        Ok(Cluster {
            layout,
            timings: Timings::default(),
            keep: true,
        })
    }

    /// Leaves the node running when this value drops (the `cluster up`
    /// command).
    pub fn keep(mut self) -> Layout {
        self.keep = true;
        self.layout.clone()
    }

    fn start(&mut self, images: &Images) -> Result<(), String> {
        let l = self.layout.clone();
        let mut t = Instant::now();
        std::fs::create_dir_all(&l.run).map_err(|e| e.to_string())?;
        std::fs::write(l.run.join("tier-bin"), l.bin.display().to_string()).map_err(|e| e.to_string())?;
        host::prepare(&l.run)?;
        pki::generate(&l.pki())?;
        config::write_all(&l)?;
        self.timings.lap("host and certificates", &mut t);

        let pki = |f: &str| l.pki().join(f).display().to_string();
        daemons::spawn(
            &l,
            "etcd",
            &l.bin.join("etcd"),
            &[
                "--name=dynbal".into(),
                format!("--data-dir={}", l.run.join("etcd").display()),
                format!("--listen-client-urls=http://{NODE_IP}:2379"),
                format!("--advertise-client-urls=http://{NODE_IP}:2379"),
                format!("--listen-peer-urls=http://{NODE_IP}:2380"),
                format!("--initial-advertise-peer-urls=http://{NODE_IP}:2380"),
                format!("--initial-cluster=dynbal=http://{NODE_IP}:2380"),
                "--listen-metrics-urls=".into(),
            ],
            &[],
        )?;
        daemons::spawn(
            &l,
            "kube-apiserver",
            &l.bin.join("kube-apiserver"),
            &[
                format!("--etcd-servers=http://{NODE_IP}:2379"),
                format!("--bind-address={NODE_IP}"),
                format!("--advertise-address={NODE_IP}"),
                "--secure-port=6443".into(),
                format!("--tls-cert-file={}", pki("apiserver.crt")),
                format!("--tls-private-key-file={}", pki("apiserver.key")),
                format!("--client-ca-file={}", pki("ca.crt")),
                format!("--kubelet-client-certificate={}", pki("apiserver-kubelet-client.crt")),
                format!("--kubelet-client-key={}", pki("apiserver-kubelet-client.key")),
                "--authorization-mode=Node,RBAC".into(),
                // ClusterTrustBundles (beta, off by default): CA bundles Gateways and
                // BackendTLSPolicies may name.
                "--feature-gates=ClusterTrustBundle=true".into(),
                "--runtime-config=certificates.k8s.io/v1beta1/clustertrustbundles=true".into(),
                "--enable-admission-plugins=NodeRestriction".into(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", pki("sa.pub")),
                format!("--service-account-signing-key-file={}", pki("sa.key")),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                format!("--cert-dir={}", l.run.join("apiserver-certs").display()),
                // The node by its address, never by its name: a name
                // would go to the machine's resolver, off the node.
                "--kubelet-preferred-address-types=InternalIP".into(),
                "--profiling=false".into(),
            ],
            &[],
        )?;
        let admin = l.kubeconfig("admin");
        wait_for("the apiserver's /readyz", Duration::from_secs(90), || {
            kubectl_at(&admin, &["get", "--raw=/readyz"]).is_ok()
        })?;
        self.timings.lap("etcd and apiserver ready", &mut t);

        daemons::spawn(
            &l,
            "kube-controller-manager",
            &l.bin.join("kube-controller-manager"),
            &[
                format!("--kubeconfig={}", l.kubeconfig("controller-manager").display()),
                format!("--service-account-private-key-file={}", pki("sa.key")),
                format!("--root-ca-file={}", pki("ca.crt")),
                format!("--cluster-signing-cert-file={}", pki("ca.crt")),
                format!("--cluster-signing-key-file={}", pki("ca.key")),
                "--use-service-account-credentials=true".into(),
                "--leader-elect=false".into(),
                format!("--bind-address={NODE_IP}"),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--profiling=false".into(),
            ],
            &[],
        )?;
        daemons::spawn(
            &l,
            "kube-scheduler",
            &l.bin.join("kube-scheduler"),
            &[
                format!("--kubeconfig={}", l.kubeconfig("scheduler").display()),
                "--leader-elect=false".into(),
                format!("--bind-address={NODE_IP}"),
                "--profiling=false".into(),
            ],
            &[],
        )?;
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            l.bin.display()
        );
        daemons::spawn(
            &l,
            "containerd",
            &l.bin.join("containerd"),
            &[format!("--config={}", l.run.join("containerd.toml").display())],
            &[("PATH", path.clone())],
        )?;
        wait_for("containerd's socket", Duration::from_secs(30), || {
            images::list(&l).is_ok()
        })?;
        self.timings.lap("controller-manager, scheduler, containerd", &mut t);

        let pause = l.run.join("pause.tar");
        images::pause(&l, &pause)?;
        let backend = l.run.join("pod-backend.tar");
        images::backend(images.backend, &backend)?;
        let mut archives = vec![pause, backend];
        if images.controller {
            let controller = l.run.join("controller.tar");
            images::controller(&controller)?;
            archives.push(controller);
        }
        for a in &archives {
            images::import(&l, a)?;
        }
        self.timings.lap("images built and imported", &mut t);

        daemons::spawn(
            &l,
            "kubelet",
            &l.bin.join("kubelet"),
            &[
                format!("--config={}", l.run.join("kubelet.yaml").display()),
                format!("--kubeconfig={}", l.kubeconfig("kubelet").display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={NODE_IP}"),
                format!("--root-dir={}", l.run.join("kubelet").display()),
                format!("--cert-dir={}", l.run.join("kubelet-pki").display()),
                "--v=1".into(),
            ],
            &[("PATH", path.clone())],
        )?;
        daemons::spawn(
            &l,
            "kube-proxy",
            &l.bin.join("kube-proxy"),
            &[format!("--config={}", l.run.join("kube-proxy.yaml").display())],
            &[("PATH", path)],
        )?;
        wait_for("the Node to be Ready", Duration::from_secs(120), || {
            kubectl_at(
                &admin,
                &[
                    "get",
                    "node",
                    NODE_NAME,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ],
            )
            .map(|s| s.trim() == "True")
            .unwrap_or(false)
        })?;
        wait_for("the default ServiceAccount", Duration::from_secs(60), || {
            kubectl_at(&admin, &["get", "serviceaccount", "default", "-n", "default"]).is_ok()
        })?;
        self.timings.lap("kubelet and kube-proxy, Node Ready", &mut t);
        for d in daemons::ORDER {
            if daemons::running(&l, d).is_none() {
                return Err(format!(
                    "{d} exited: see {}",
                    l.logs().join(format!("{d}.log")).display()
                ));
            }
        }
        Ok(())
    }

    /// `kubectl` as the cluster admin.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        kubectl_at(&self.layout.kubeconfig("admin"), args)
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> Result<String, String> {
        kubectl_stdin(&self.layout.kubeconfig("admin"), &["apply", "-f", "-"], yaml)
    }

    /// `helm` as the cluster admin.
    pub fn helm(&self, args: &[&str]) -> Result<String, String> {
        run_with_kubeconfig(
            &self.layout.bin.join("helm"),
            &self.layout.kubeconfig("admin"),
            args,
            None,
        )
    }

    pub fn log(&self, daemon: &str) -> String {
        std::fs::read_to_string(self.layout.logs().join(format!("{daemon}.log"))).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.keep {
            let _lock = Lock::take();
            let report = down_locked(&self.layout);
            eprintln!("cluster: {report}");
        }
    }
}

fn run_with_kubeconfig(
    program: &Path,
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, String> {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", "/tmp/dynamic-balancer-cluster-helm/cache")
        .env("HELM_CONFIG_HOME", "/tmp/dynamic-balancer-cluster-helm/config")
        .env("HELM_DATA_HOME", "/tmp/dynamic-balancer-cluster-helm/data")
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{} {}: {}{}",
            program.file_name().unwrap_or_default().to_string_lossy(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }
}

fn tier_binary(name: &str) -> PathBuf {
    node_tier_cached().join(name)
}

/// The tier's kubectl.
pub fn kubectl_binary() -> PathBuf {
    tier_binary("kubectl")
}

/// The tier's bin directory without running the build script again.
fn node_tier_cached() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| node_tier().unwrap_or_else(|e| panic!("{e}")))
        .clone()
}

/// `kubectl` with `kubeconfig`.
pub fn kubectl_at(kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    run_with_kubeconfig(&tier_binary("kubectl"), kubeconfig, args, None)
}

fn kubectl_stdin(kubeconfig: &Path, args: &[&str], stdin: &str) -> Result<String, String> {
    run_with_kubeconfig(&tier_binary("kubectl"), kubeconfig, args, Some(stdin))
}

/// What teardown did.
#[derive(Debug, Default)]
pub struct DownReport {
    pub stopped: Vec<String>,
    pub killed_containers: usize,
    pub errors: Vec<String>,
    pub took: Duration,
}

impl std::fmt::Display for DownReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.stopped.is_empty() && self.killed_containers == 0 && self.errors.is_empty() {
            return write!(f, "no node was running");
        }
        write!(
            f,
            "down in {:.1}s: stopped {}, {} container processes killed",
            self.took.as_secs_f64(),
            self.stopped.join(", "),
            self.killed_containers
        )?;
        if !self.errors.is_empty() {
            write!(f, "; errors: {}", self.errors.join("; "))?;
        }
        Ok(())
    }
}

/// The layout of the node a previous `up` left here, from the tier
/// directory it recorded (so `down` and `attach` never build anything).
fn recorded_layout() -> Option<Layout> {
    let bin = std::fs::read_to_string(Path::new(RUN_DIR).join("tier-bin")).ok()?;
    Some(Layout::new(PathBuf::from(bin.trim())))
}

/// Takes the node down (see the module's documentation); safe to call when
/// nothing runs.
pub fn down() -> Result<DownReport, String> {
    let _lock = Lock::take()?;
    match recorded_layout() {
        Some(layout) => Ok(down_locked(&layout)),
        None if Path::new(RUN_DIR).exists() => {
            // Brought up by a version that did not record its tier.
            Ok(down_locked(&Layout::new(node_tier()?)))
        }
        None => Ok(DownReport::default()),
    }
}

fn down_locked(l: &Layout) -> DownReport {
    let started = Instant::now();
    let mut report = DownReport::default();
    if !l.run.exists() {
        return report;
    }
    // kubelet and kube-proxy first (no restarts of what is being killed),
    // then the containers, their shims, and the control plane last.
    for d in daemons::ORDER.iter().rev() {
        if daemons::running(l, d).is_some() {
            report.stopped.push(d.to_string());
        }
        let grace = if *d == "containerd" {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(10)
        };
        if *d == "containerd" {
            kill_containers(l, &mut report);
        }
        if let Err(e) = daemons::stop(l, d, grace) {
            report.errors.push(e);
        }
    }
    kill_containers(l, &mut report);
    host::unmount_all(&l.run);
    let left = host::remove_cgroups();
    if !left.is_empty() {
        report.errors.push(format!("cgroups left: {left:?}"));
    }
    report.errors.extend(host::restore(&l.run));
    let changed = host::sysctl_changes(&l.run);
    if !changed.is_empty() {
        report.errors.push(format!("sysctls not restored: {changed:?}"));
    }
    let _ = std::fs::remove_dir_all(LAST_LOGS);
    let _ = copy_dir(&l.logs(), Path::new(LAST_LOGS));
    let _ = copy_dir(&l.run.join("pod-logs"), &Path::new(LAST_LOGS).join("pods"));
    if !host::mounts_under(&l.run).is_empty() {
        report.errors.push(format!("mounts left under {}", l.run.display()));
    } else if let Err(e) = std::fs::remove_dir_all(&l.run) {
        report.errors.push(format!("{}: {e}", l.run.display()));
    }
    report.took = started.elapsed();
    report
}

/// Kills every container process and containerd's shims.
fn kill_containers(l: &Layout, report: &mut DownReport) {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let pods = host::pod_processes();
        let shims = daemons::processes_of(&l.bin.join("containerd-shim-runc-v2"));
        if pods.is_empty() && shims.is_empty() {
            report.killed_containers += seen.len();
            return;
        }
        seen.extend(pods.iter().copied());
        for p in pods {
            daemons::kill_hard(p);
        }
        for s in shims {
            daemons::kill_hard(s as i32);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    report.errors.push("container processes survive SIGKILL".into());
}

/// Copies the files of `from` into `to`, recursively (symbolic links are
/// followed, as kubelet's log links would be useless copied).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)?.flatten() {
        let path = e.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(e.file_name()))?;
        } else if path.is_file() {
            std::fs::copy(&path, to.join(e.file_name()))?;
        }
    }
    Ok(())
}
