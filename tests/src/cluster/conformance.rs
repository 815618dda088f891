//! The official Gateway API conformance suite (v1.7.0) against this
//! controller on the real node: the suite's own binary
//! (tests/gateway-conformance/build.sh), its echo backends built from
//! source, the v1.7.0 standard-channel CRDs, the chart with Gateway API on
//! and a Service per Gateway, and a GatewayClass of ours. The suite runs
//! from the host and reaches each Gateway at its Service's cluster IP
//! (kube-proxy answers on the node), as it would reach a load balancer.
//!
//! `cargo run --release -p tests --bin cluster -- conformance` (see
//! docs/src/controller/gateway-api.md, "Conformance").

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{images, wait_for, Cluster};

pub const VERSION: &str = "1.7.0";
/// The GatewayClass the suite is pointed at.
pub const GATEWAY_CLASS: &str = "dynamic-balancer";
/// What the chart sets `--gateway-controller-name` to by default.
pub const CONTROLLER_NAME: &str = "dynamic-balancer.dev/gateway-controller";
/// The names the v1.7.0 manifests give the echo server (v0.2.0's source is
/// not served by the Go proxy; v0.1.0 has the same servers).
pub const ECHO_IMAGES: &[&str] = &[
    "registry.k8s.io/gateway-api/conformance/echo-basic:v0.1.0",
    "registry.k8s.io/gateway-api/conformance/echo-basic:v0.2.0",
];

/// How to run the suite.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the ConformanceReport goes.
    pub report: PathBuf,
    /// The suite's whole output.
    pub log: PathBuf,
    /// `--conformance-profiles`.
    pub profiles: String,
    /// `--run-test`: one test (and its subtests) only.
    pub run_test: Option<String>,
    /// `--skip-tests`.
    pub skip_tests: Vec<String>,
    /// The implementation's version in the report.
    pub version: String,
}

impl Options {
    pub fn new(out: &Path) -> Options {
        Options {
            report: out.join(format!("standard-{}-default-report.yaml", env!("CARGO_PKG_VERSION"))),
            log: out.join("conformance.log"),
            profiles: "GATEWAY-HTTP,GATEWAY-GRPC,GATEWAY-TLS,GATEWAY-TCP,GATEWAY-UDP".into(),
            run_test: None,
            skip_tests: Vec::new(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

/// Builds (once per machine) the suite and the echo server; returns their
/// directory.
pub fn binaries() -> Result<PathBuf, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("gateway-conformance/build.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err("tests/gateway-conformance/build.sh failed (see above)".into());
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("").trim());
    for b in ["conformance.test", "echo-basic"] {
        if !dir.join(b).exists() {
            return Err(format!("no {b} in {}", dir.display()));
        }
    }
    Ok(dir)
}

/// The echo server's images, into the node's containerd.
pub fn import_echo(c: &Cluster, bin: &Path) -> Result<(), String> {
    for archive in images::echo_basic(&bin.join("echo-basic"), ECHO_IMAGES, &c.layout.run)? {
        images::import(&c.layout, &archive)?;
    }
    Ok(())
}

/// The directory of the v1.7.0 standard-channel CRDs (the Go module cache).
pub fn crd_dir() -> Result<PathBuf, String> {
    let out = Command::new("go")
        .args([
            "mod",
            "download",
            "-json",
            &format!("sigs.k8s.io/gateway-api@v{VERSION}"),
        ])
        .current_dir(std::env::temp_dir())
        .env("GOTOOLCHAIN", "go1.27.3")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .map_err(|e| format!("go: {e}"))?;
    if !out.status.success() {
        return Err(format!("go mod download: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let info: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let dir = info["Dir"].as_str().ok_or("go mod download gave no Dir")?;
    Ok(PathBuf::from(dir).join("config/crd/standard"))
}

/// Every standard-channel CRD of the release (and its
/// ValidatingAdmissionPolicy), as `kubectl apply --server-side` installs
/// them (some are too large for a client-side apply's annotation).
pub fn install_crds(c: &Cluster) -> Result<(), String> {
    let dir = crd_dir()?;
    c.kubectl(&["apply", "--server-side", "-f", &dir.display().to_string()])?;
    c.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd",
        "gatewayclasses.gateway.networking.k8s.io",
        "gateways.gateway.networking.k8s.io",
        "listenersets.gateway.networking.k8s.io",
        "httproutes.gateway.networking.k8s.io",
        "grpcroutes.gateway.networking.k8s.io",
        "tcproutes.gateway.networking.k8s.io",
        "tlsroutes.gateway.networking.k8s.io",
        "udproutes.gateway.networking.k8s.io",
        "referencegrants.gateway.networking.k8s.io",
        "backendtlspolicies.gateway.networking.k8s.io",
    ])?;
    Ok(())
}

/// The chart with Gateway API on and a ClusterIP Service per Gateway.
pub fn install_controller(c: &Cluster) -> Result<(), String> {
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/dynamic-balancer");
    c.helm(&[
        "upgrade",
        "--install",
        crate::kube_apiserver::RELEASE,
        &chart.display().to_string(),
        "--namespace",
        crate::kube_apiserver::RELEASE_NAMESPACE,
        "--create-namespace",
        "--set",
        "gatewayAPI.enabled=true",
        "--set",
        "gatewayAPI.service.type=ClusterIP",
        "--wait",
        "--timeout",
        "5m",
    ])?;
    Ok(())
}

/// Our GatewayClass, waited for until the leader has accepted it and
/// published its supported features (the suite infers what to run from
/// them).
pub fn gateway_class(c: &Cluster) -> Result<Vec<String>, String> {
    c.apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: {GATEWAY_CLASS}}}\nspec: {{controllerName: {CONTROLLER_NAME}}}\n"
    ))?;
    let mut features = Vec::new();
    wait_for("the GatewayClass to be Accepted", Duration::from_secs(120), || {
        let Ok(text) = c.kubectl(&["get", "gatewayclass", GATEWAY_CLASS, "-o", "json"]) else {
            return false;
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            return false;
        };
        let accepted = v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|cond| cond["type"] == "Accepted" && cond["status"] == "True");
        features = v["status"]["supportedFeatures"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["name"].as_str().map(str::to_string))
            .collect();
        accepted && !features.is_empty()
    })?;
    Ok(features)
}

/// What the run came to.
#[derive(Debug)]
pub struct Outcome {
    pub passed: Vec<String>,
    pub failed: Vec<String>,
    pub skipped: Vec<String>,
    pub elapsed: Duration,
    /// The suite's exit status.
    pub success: bool,
}

/// A static Gateway address the cluster can give: in [`super::SERVICE_CIDR`]'s
/// low band, which Kubernetes keeps for cluster IPs asked for by value.
pub const STATIC_ADDRESS: &str = "198.19.16.200";
/// One it cannot: outside that range (TEST-NET-2).
pub const UNUSABLE_ADDRESS: &str = "198.51.100.7";

/// nginx reloads so far, summed over the controller's Pods (their
/// `nginx_ingress_controller_success` counter, read through the
/// apiserver's Pod proxy): compared before and after the suite, what its
/// whole run cost in reloads.
pub fn reloads(c: &Cluster) -> Result<f64, String> {
    let ns = crate::kube_apiserver::RELEASE_NAMESPACE;
    let pods = c.kubectl(&[
        "get",
        "pods",
        "-n",
        ns,
        "-l",
        "app.kubernetes.io/component=controller",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    let mut total = 0.0;
    for pod in pods.split_whitespace() {
        let text = c.kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/{ns}/pods/{pod}:10254/proxy/metrics"),
        ])?;
        total += text
            .lines()
            .filter(|l| l.starts_with("nginx_ingress_controller_success"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    Ok(total)
}

/// Runs the suite (its whole output into `opts.log`, each test's verdict
/// echoed as it comes).
pub fn run(c: &Cluster, bin: &Path, features: &[String], opts: &Options) -> Result<Outcome, String> {
    if let Some(dir) = opts.report.parent() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    let mut args: Vec<String> = vec![
        "-test.v".into(),
        "-test.run=^TestConformance$".into(),
        "-test.timeout=90m".into(),
        format!("--gateway-class={GATEWAY_CLASS}"),
        format!("--conformance-profiles={}", opts.profiles),
        format!("--report-output={}", opts.report.display()),
        "--organization=dynamic-balancer".into(),
        "--project=dynamic-balancer".into(),
        "--url=https://github.com/dynamic-balancer/dynamic-balancer".into(),
        format!("--version={}", opts.version),
        "--contact=https://github.com/dynamic-balancer/dynamic-balancer/issues".into(),
        "--cleanup-base-resources=true".into(),
        // GatewayStaticAddresses: an address of the Service range (its
        // low band, kept for static cluster IPs) and one outside it.
        format!("--usable-address={STATIC_ADDRESS}"),
        format!("--unusable-address={UNUSABLE_ADDRESS}"),
    ];
    if let Some(t) = &opts.run_test {
        // With --run-test the suite no longer reads the GatewayClass.
        args.push(format!("--run-test={t}"));
        args.push(format!("--supported-features={}", features.join(",")));
    }
    if !opts.skip_tests.is_empty() {
        args.push(format!("--skip-tests={}", opts.skip_tests.join(",")));
    }
    let started = Instant::now();
    let mut child = Command::new(bin.join("conformance.test"))
        .args(&args)
        .env("KUBECONFIG", c.layout.kubeconfig("admin"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("conformance.test: {e}"))?;
    let mut log = std::fs::File::create(&opts.log).map_err(|e| format!("{}: {e}", opts.log.display()))?;
    let mut outcome = Outcome {
        passed: Vec::new(),
        failed: Vec::new(),
        skipped: Vec::new(),
        elapsed: Duration::ZERO,
        success: false,
    };
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = writeln!(log, "{line}");
            let verdict = line.trim_start();
            for (prefix, list) in [
                ("--- PASS: ", &mut outcome.passed),
                ("--- FAIL: ", &mut outcome.failed),
                ("--- SKIP: ", &mut outcome.skipped),
            ] {
                if let Some(rest) = verdict.strip_prefix(prefix) {
                    let name = rest.split_whitespace().next().unwrap_or("").to_string();
                    // Top-level tests only (TestConformance/Name).
                    if name.matches('/').count() == 1 {
                        println!("{}{name}", &prefix[4..]);
                        list.push(name);
                    }
                }
            }
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    outcome.elapsed = started.elapsed();
    outcome.success = status.success();
    Ok(outcome)
}
