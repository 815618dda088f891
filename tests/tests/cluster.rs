//! The cluster tier: a real single-node Kubernetes cluster (kubelet,
//! containerd, kube-proxy; `tests/src/cluster`), the chart installed with
//! Helm, Pods as backends, and what users see during rollouts measured
//! under a bounded load. One test, the scenarios in order on one node (a
//! bring-up costs ~10 s; the scenarios build on each other's state); each
//! prints its row of the report and asserts its goal.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::cluster::watch::{self, PodWatch};
use tests::cluster::{self, images, wait_for, Cluster, Images, NODE_IP};
use tests::load::{self, Load, Method, Options, Report};

const NS: &str = tests::kube_apiserver::RELEASE_NAMESPACE;
const RELEASE: &str = tests::kube_apiserver::RELEASE;
const FULLNAME: &str = tests::kube_apiserver::CHART_FULLNAME;
const LB_IP: &str = "198.19.32.10";
/// Requests per second of every load (GET and POST, keep-alive and new
/// connections, a quarter each).
const RATE: u32 = 120;

fn chart() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/helm/dynamic-balancer")
        .display()
        .to_string()
}

/// The project's image, assembled from what the workspace build made.
fn assemble_image() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("target/release/nginx-build"))
        .args(["image", "--assemble-only"])
        .output()
        .expect("target/release/nginx-build (cargo run --release -p nginx-build)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn json(c: &Cluster, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    serde_json::from_str(&c.kubectl(&a).unwrap()).unwrap()
}

fn controller_pods(c: &Cluster) -> Vec<Value> {
    json(
        c,
        &["get", "pods", "-n", NS, "-l", "app.kubernetes.io/component=controller"],
    )["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .cloned()
        .collect()
}

/// Reloads so far, summed over the running controller Pods (each Pod's
/// `nginx_ingress_controller_success`), by Pod name.
fn reloads(c: &Cluster) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for p in controller_pods(c) {
        let (Some(name), Some(ip)) = (p["metadata"]["name"].as_str(), p["status"]["podIP"].as_str()) else {
            continue;
        };
        let text = ureq::get(&format!("http://{ip}:10254/metrics"))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default();
        let n = tests::controller::sample_value(&text, "nginx_ingress_controller_success").unwrap_or(0.0);
        out.insert(name.to_string(), n as u64);
    }
    out
}

/// Reloads between two readings of [`reloads`], over the Pods in both.
fn reloads_between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    after
        .iter()
        .filter_map(|(pod, n)| before.get(pod).map(|b| n.saturating_sub(*b)))
        .max()
        .unwrap_or(0)
}

fn backend_manifest(name: &str, namespace: &str, replicas: u32, pre_stop: Option<u32>) -> String {
    let lifecycle = match pre_stop {
        Some(s) => format!("        lifecycle:\n          preStop:\n            sleep: {{seconds: {s}}}\n"),
        None => String::new(),
    };
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: 30
      containers:
      - name: backend
        image: {image}
        imagePullPolicy: IfNotPresent
        env:
        - name: POD_NAME
          valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
        ports: [{{containerPort: 8080}}]
        readinessProbe:
          httpGet: {{path: /healthz, port: 8080}}
          periodSeconds: 1
          failureThreshold: 1
{lifecycle}        securityContext:
          runAsNonRoot: true
          readOnlyRootFilesystem: true
          allowPrivilegeEscalation: false
          capabilities: {{drop: [ALL]}}
---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  selector: {{app: {name}}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  ingressClassName: nginx
  rules:
  - host: {name}.test
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: {name}, port: {{number: 80}}}}}}}}
"#,
        image = images::BACKEND_IMAGE,
    )
}

fn controller_service(c: &Cluster) -> Value {
    json(c, &["get", "service", "-n", NS, &format!("{FULLNAME}-controller")])
}

fn cluster_ip(c: &Cluster) -> String {
    controller_service(c)["spec"]["clusterIP"].as_str().unwrap().to_string()
}

fn node_port(c: &Cluster, port: u16) -> u16 {
    controller_service(c)["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == port)
        .and_then(|p| p["nodePort"].as_u64())
        .unwrap() as u16
}

/// curl through a given address (`--resolve`), HTTP or HTTPS.
fn curl(host: &str, scheme: &str, addr: &str, port: u16, path: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sk", "-m", "5", "-o", "-", "-w", "\n%{http_code}"])
        .arg("--resolve")
        .arg(format!("{host}:{port}:{addr}"))
        .arg(format!("{scheme}://{host}:{port}{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// The certificate's subject served for `host` on `addr:443`.
fn served_subject(host: &str, addr: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect {addr}:443 -servername {host} </dev/null 2>/dev/null | openssl x509 -noout -subject"
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn wait_rollout(c: &Cluster, ns: &str, deploy: &str) {
    c.kubectl(&[
        "rollout",
        "status",
        "-n",
        ns,
        &format!("deployment/{deploy}"),
        "--timeout=180s",
    ])
    .unwrap();
}

/// Waits until every Ready backend Pod of `app` has answered through the
/// ingress (the controller has pushed them all).
fn wait_served(c: &Cluster, app: &str, addr: &str) {
    let want: Vec<String> = json(c, &["get", "pods", "-n", "default", "-l", &format!("app={app}")])["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| watch::ready(p) && p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    wait_for(
        &format!("{app}'s Pods {want:?} served"),
        Duration::from_secs(60),
        || {
            let (code, body) = curl(&format!("{app}.test"), "http", addr, 80, "/warm");
            if code == 200 {
                seen.insert(body.split_whitespace().next().unwrap_or("").to_string());
            }
            want.iter().all(|w| seen.contains(w))
        },
    )
    .unwrap();
}

/// One row of the closing report.
struct Row {
    scenario: String,
    report: Option<Report>,
    reloads: u64,
    note: String,
}

/// Prints a row as it is made (a failure later still shows the earlier
/// figures) and keeps it for the table.
fn push(rows: &mut Vec<Row>, row: Row) {
    eprintln!("scenario: {} -> reloads {}; {}", row.scenario, row.reloads, row.note);
    rows.push(row);
}

fn print_rows(rows: &[Row]) {
    eprintln!("\n| scenario | requests | GET failed | POST failed | req/s | reloads | notes |");
    eprintln!("|---|---|---|---|---|---|---|");
    for r in rows {
        match &r.report {
            Some(rep) => eprintln!(
                "| {} | {} | {} of {} | {} of {} | {:.0} | {} | {} |",
                r.scenario,
                rep.samples.len(),
                rep.failures(Method::Get).len(),
                rep.count(Method::Get),
                rep.failures(Method::Post).len(),
                rep.count(Method::Post),
                rep.rate(),
                r.reloads,
                r.note
            ),
            None => eprintln!("| {} | - | - | - | - | {} | {} |", r.scenario, r.reloads, r.note),
        }
    }
}

fn load_options(addr: &str, host: &str, retry_refused: bool) -> Options {
    Options {
        target: format!("{addr}:80").parse::<SocketAddr>().unwrap(),
        host: host.to_string(),
        path: "/load".into(),
        clients: load::mixed(RATE),
        retry_refused,
        max_duration: Duration::from_secs(300),
        max_requests: 100_000,
    }
}

/// What nginx logged about upstreams in the controller Pods over the last
/// `since`, by kind ("connect() failed (111: Connection refused)" x3):
/// why requests were retried or failed.
fn upstream_errors(c: &Cluster, since: Duration) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for p in controller_pods(c) {
        let name = p["metadata"]["name"].as_str().unwrap();
        let logs = c
            .kubectl(&["logs", "-n", NS, name, &format!("--since={}s", since.as_secs() + 1)])
            .unwrap_or_else(|e| panic!("{e}"));
        for l in logs
            .lines()
            .filter(|l| l.contains("upstream") && (l.contains("[error]") || l.contains("[warn]")))
        {
            let msg = l
                .split_once("*")
                .and_then(|(_, r)| r.split_once(' '))
                .map(|(_, m)| m)
                .unwrap_or(l);
            let msg = msg.split(" while ").next().unwrap_or(msg);
            let msg = msg.split(", client").next().unwrap_or(msg);
            *counts.entry(msg.to_string()).or_default() += 1;
        }
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k} x{v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// For each Pod of a rollout: ms from Ready to its first answer, and from
/// the start of its deletion to its last.
fn pod_timings(load_start: Instant, rep: &Report, watch: &PodWatch) -> (Vec<i64>, Vec<i64>) {
    let served = rep.pods();
    let mut to_first = Vec::new();
    let mut to_last = Vec::new();
    for (pod, t) in watch.pods() {
        let Some((first, last)) = served.get(&pod) else {
            continue;
        };
        if let Some(ready) = t.ready {
            if ready > load_start {
                to_first.push((load_start + *first).duration_since(ready).as_millis() as i64);
            }
        }
        if let Some(del) = t.deleting {
            let last_at = load_start + *last;
            to_last.push(if last_at >= del {
                last_at.duration_since(del).as_millis() as i64
            } else {
                -(del.duration_since(last_at).as_millis() as i64)
            });
        }
    }
    (to_first, to_last)
}

fn spread(v: &[i64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let mut s = v.to_vec();
    s.sort();
    format!(
        "median {} ms, max {} ms (n={})",
        s[s.len() / 2],
        s[s.len() - 1],
        s.len()
    )
}

/// The backend rollout: `kubectl rollout restart` three times, then scale
/// 3 → 10 → 1, under the load.
fn rollout_scenario(c: &Cluster, app: &str, pre_stop: Option<u32>, addr: &str, rows: &mut Vec<Row>) {
    c.apply(&backend_manifest(app, "default", 3, pre_stop)).unwrap();
    wait_rollout(c, "default", app);
    wait_served(c, app, addr);
    let watch = PodWatch::start(
        &cluster::kubectl_binary(),
        &c.layout.kubeconfig("admin"),
        "default",
        &format!("app={app}"),
    );
    let before = reloads(c);
    let load = Load::start(load_options(addr, &format!("{app}.test"), false));
    let start = load.started;
    std::thread::sleep(Duration::from_secs(2));
    for _ in 0..3 {
        c.kubectl(&["rollout", "restart", "-n", "default", &format!("deployment/{app}")])
            .unwrap();
        wait_rollout(c, "default", app);
        // The last old Pods finish terminating (preStop) under the load.
        std::thread::sleep(Duration::from_secs(pre_stop.unwrap_or(0) as u64 + 2));
    }
    for n in ["10", "1"] {
        c.kubectl(&[
            "scale",
            "-n",
            "default",
            &format!("deployment/{app}"),
            &format!("--replicas={n}"),
        ])
        .unwrap();
        wait_rollout(c, "default", app);
        std::thread::sleep(Duration::from_secs(pre_stop.unwrap_or(0) as u64 + 3));
    }
    let rep = load.finish();
    let reloaded = reloads_between(&before, &reloads(c));
    let (to_first, to_last) = pod_timings(start, &rep, &watch);
    let pods = rep.pods().len();
    let label = match pre_stop {
        Some(s) => format!("backend rollout, preStop sleep {s}s"),
        None => "backend rollout, no preStop".into(),
    };
    let note = format!(
        "{pods} Pods served; Ready → first request {}; deletion → last request {}; failures: [{}]; nginx: [{}]",
        spread(&to_first),
        spread(&to_last),
        rep.failure_summary(),
        upstream_errors(c, rep.took)
    );
    eprintln!("{label}: {note}");
    assert!(
        pods >= 10,
        "the Pods served did not change over: {:?}",
        rep.pods().keys()
    );
    assert!(rep.rate() >= 100.0, "the load ran at {:.0} req/s", rep.rate());
    assert_eq!(reloaded, 0, "endpoint churn reloaded nginx");
    if pre_stop.is_some() {
        assert!(
            rep.failures(Method::Get).is_empty(),
            "GET failed: {}",
            rep.failure_summary()
        );
        assert!(
            rep.failures(Method::Post).is_empty(),
            "POST failed: {}",
            rep.failure_summary()
        );
    } else {
        // Without preStop a Pod stops listening at SIGTERM, while the
        // ingress still has it for the ~10-100 ms the EndpointSlice update
        // and the push take. A refused GET is retried on another endpoint,
        // but a POST already sent on a connection the Pod closes is not
        // (nginx never resends a non-idempotent request), and when 9 of 10
        // Pods go at once (scale 10 -> 1) a GET's tries can all land on
        // closing Pods. Measured and bounded, not zero: users need the
        // preStop sleep (docs/src/install/rollouts.md).
        // Five runs here failed 0 to 4 of ~2,750 requests; the bound
        // (0.5%) catches an ingress that keeps dead Pods for seconds.
        let failed = rep.samples.iter().filter(|s| s.failed()).count();
        assert!(
            failed * 200 <= rep.samples.len(),
            "more than 0.5% failed without preStop: {}",
            rep.failure_summary()
        );
    }
    push(
        rows,
        Row {
            scenario: label,
            report: Some(rep),
            reloads: reloaded,
            note,
        },
    );
    c.kubectl(&["scale", "-n", "default", &format!("deployment/{app}"), "--replicas=3"])
        .unwrap();
    wait_rollout(c, "default", app);
}

fn container_pids(pod: &Value) -> Vec<i32> {
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string();
    let qos = pod["status"]["qosClass"].as_str().unwrap().to_lowercase();
    // kubelet's cgroupfs layout: kubepods[/<qos>]/pod<uid>/<container>, in
    // the pids hierarchy on cgroup v1, at the root on v2.
    let rel = if qos == "guaranteed" {
        PathBuf::from(format!("pod{uid}")).join(&id)
    } else {
        PathBuf::from(qos).join(format!("pod{uid}")).join(&id)
    };
    ["/sys/fs/cgroup/pids/kubepods", "/sys/fs/cgroup/kubepods"]
        .iter()
        .map(|base| Path::new(base).join(&rel).join("cgroup.procs"))
        .find_map(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn proc_status(pid: i32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")).map(|v| v.trim().to_string()))
        .unwrap_or_default()
}

/// The chart's `electionTTL` (30 s) plus `extra` seconds.
fn ttl_plus(extra: u64) -> Duration {
    Duration::from_secs(30 + extra)
}

fn lease_holder(c: &Cluster) -> String {
    json(c, &["get", "lease", "-n", NS, &format!("{FULLNAME}-leader")])["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn ingress_addresses(c: &Cluster, ns: &str, name: &str) -> Vec<String> {
    json(c, &["get", "ingress", "-n", ns, name])["status"]["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()).map(str::to_string))
        .collect()
}

/// The plugin binary (`cargo test --workspace` builds it with its
/// package's tests; else `cargo build --release -p kubectl-plugin`).
fn plugin_binary() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/kubectl-dynamic_balancer");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p kubectl-plugin` (or test with --workspace)",
        bin.display()
    );
    bin
}

/// Runs the plugin with the admin kubeconfig: exit code, stdout, stderr.
fn plugin(c: &Cluster, args: &[&str]) -> (i32, String, String) {
    // Before the subcommand: after a `--`, words are the command's own.
    let out = Command::new(plugin_binary())
        .arg("--kubeconfig")
        .arg(c.layout.kubeconfig("admin"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn plugin_ok(c: &Cluster, args: &[&str]) -> String {
    let (code, out, err) = plugin(c, args);
    assert_eq!(code, 0, "kubectl dynamic-balancer {}: {err}\n{out}", args.join(" "));
    out
}

/// Every subcommand against the running chart, the tenant's TLS Ingress
/// served; returns the row's note.
fn kubectl_plugin_scenario(c: &Cluster) -> String {
    let t = Instant::now();
    // general: both Pods found in the release's namespace without -n, each
    // asked through exec.
    let general: Value = serde_json::from_str(&plugin_ok(c, &["general", "-o", "json"])).unwrap();
    assert_eq!(general["namespace"], NS, "{general}");
    assert_eq!(general["controllerPodsCount"], 2, "{general}");
    for p in general["pods"].as_array().unwrap() {
        assert_eq!(p["status"]["ready"], true, "{p}");
        assert!(p["status"]["module"]["generation"].as_u64().unwrap() > 0, "{p}");
    }
    let table = plugin_ok(c, &["general"]);
    assert!(table.contains("controller Pods in ingress-nginx: 2"), "{table}");
    // backends: the module's zone, as the controller pushed it.
    let names = plugin_ok(c, &["backends", "--list"]);
    assert!(names.lines().any(|l| l == "tenant-tenant-80"), "{names}");
    assert!(names.lines().any(|l| l == "default-web-80"), "{names}");
    let one: Value = serde_json::from_str(&plugin_ok(
        c,
        &["backends", "--backend", "tenant-tenant-80", "-o", "json"],
    ))
    .unwrap();
    let pod_ip = json(c, &["get", "pods", "-n", "tenant", "-l", "app=tenant"])["items"][0]["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(one[0]["endpoints"][0]["address"], pod_ip.as_str(), "{one}");
    let (code, _, err) = plugin(c, &["backends", "--backend", "no-such-backend"]);
    assert_eq!(code, 1, "{err}");
    // certs: the tenant's certificate, no key.
    let certs: Value = serde_json::from_str(&plugin_ok(c, &["certs", "--host", "tenant.test", "-o", "json"])).unwrap();
    assert!(certs[0]["subject"].as_str().unwrap().contains("tenant.test"), "{certs}");
    assert!(!certs.to_string().contains("PRIVATE KEY"));
    let (code, _, err) = plugin(c, &["certs", "--host", "nobody.test"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no certificate serves host"), "{err}");
    // conf: one host's server block of the running nginx.conf.
    let conf = plugin_ok(c, &["conf", "--host", "tenant.test"]);
    assert!(conf.contains("server_name tenant.test"), "{conf}");
    assert!(!conf.contains("server_name web.test"), "{conf}");
    // info: the controller's Service and its load-balancer address.
    let info: Value = serde_json::from_str(&plugin_ok(c, &["info", "-o", "json"])).unwrap();
    let svc = info["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == format!("{FULLNAME}-controller").as_str())
        .unwrap_or_else(|| panic!("{info}"));
    assert_eq!(svc["loadBalancer"][0], LB_IP, "{svc}");
    // ingresses: TLS, the address in status, the ready endpoint.
    let ings: Value = serde_json::from_str(&plugin_ok(c, &["ingresses", "-n", "tenant", "-o", "json"])).unwrap();
    assert_eq!(ings[0]["hostPath"], "tenant.test/", "{ings}");
    assert_eq!(ings[0]["tls"], true, "{ings}");
    assert_eq!(ings[0]["endpoints"], 1, "{ings}");
    let all = plugin_ok(c, &["ingresses", "-A"]);
    assert!(all.contains("web.test/") && all.contains("tenant.test/"), "{all}");
    // check (and its alias lint): the running controller's flags, then the
    // user's (another class and controller: none of these Ingresses); the
    // exit code says whether switching would drop anything.
    let (code, out, err) = plugin(c, &["check", "-o", "json"]);
    assert!(err.contains(&format!("the flags of Pod {NS}/")), "{err}");
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let s = &report["summary"];
    assert!(s["ingresses"].as_u64().unwrap() >= 3, "{s}");
    let drops = s["ignored"].as_u64().unwrap() + s["invalid"].as_u64().unwrap() + s["problems"].as_u64().unwrap() > 0;
    assert_eq!(code, i32::from(drops), "{s}\n{err}");
    let (code, out, err) = plugin(
        c,
        &[
            "lint",
            "-o",
            "json",
            "--",
            "--ingress-class=elsewhere",
            "--controller-class=example.com/elsewhere",
        ],
    );
    let other: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: exit {code}: {out}\n{err}"));
    assert_eq!(other["summary"]["ingresses"], 0, "{other}");
    // logs: the controller's own JSON lines.
    let logs = plugin_ok(c, &["logs", "--tail", "3"]);
    assert!((1..=3).contains(&logs.lines().count()), "{logs}");
    // exec: no shell in the image; the command's exit code is the plugin's.
    let (code, _, err) = plugin(c, &["exec", "--", "nginx", "-v"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("nginx version"), "{err}");
    let (code, _, _) = plugin(c, &["exec", "--", "nginx", "-t", "-c", "/nonexistent.conf"]);
    assert_eq!(code, 1);
    let (code, _, err) = plugin(c, &["exec", "--", "sh", "-c", "true"]);
    assert_ne!(code, 0, "a shell in the image: {err}");
    // Through kubectl's plugin mechanism, by its name on PATH.
    let dir = plugin_binary().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(cluster::kubectl_binary())
        .args(["dynamic-balancer", "backends", "--list"])
        .env("PATH", path)
        .env("KUBECONFIG", c.layout.kubeconfig("admin"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("tenant-tenant-80"));
    format!(
        "general, backends, certs, conf, info, ingresses, check/lint, logs, exec all answered in {:.1}s; check exit {code_check}",
        t.elapsed().as_secs_f64(),
        code_check = i32::from(drops)
    )
}

#[test]
fn real_cluster() {
    assert!(
        tests::state_dir::running_as_root(),
        "the cluster tier needs root (kubelet, containerd, iptables)"
    );
    assemble_image();
    let cold = Instant::now();
    let c = Cluster::up(&Images {
        backend: Path::new(env!("CARGO_BIN_EXE_pod-backend")),
        controller: true,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "cluster up: {} (with the tier's build check: {:.1}s)",
        c.timings,
        cold.elapsed().as_secs_f64()
    );
    let mut rows = Vec::new();

    // --- helm install: only the image given (and two replicas).
    let t = Instant::now();
    c.helm(&[
        "install",
        RELEASE,
        &chart(),
        "--namespace",
        NS,
        "--create-namespace",
        "--set",
        "controller.image.registry=localhost",
        "--set",
        "controller.image.image=dynamic-balancer/ingress-controller",
        "--set",
        "controller.image.tag=0.1.0",
        "--set",
        "controller.replicaCount=2",
        "--wait",
        "--timeout",
        "4m",
    ])
    .unwrap_or_else(|e| panic!("{e}\n{}", c.log("kubelet")));
    let installed = t.elapsed();
    let pods = controller_pods(&c);
    assert_eq!(pods.len(), 2);
    for p in &pods {
        assert!(watch::ready(p), "{p}");
        let ctr = &p["spec"]["containers"][0]["securityContext"];
        assert_eq!(ctr["readOnlyRootFilesystem"], true);
        // What the kubelet really ran: the controller's process.
        let pids = container_pids(p);
        assert!(!pids.is_empty(), "no processes in the controller's cgroup");
        for pid in &pids {
            let uid = proc_status(*pid, "Uid");
            assert!(uid.split_whitespace().all(|u| u == "101"), "pid {pid} uid {uid}");
            // Only NET_BIND_SERVICE (bit 10) may remain effective.
            let eff = u64::from_str_radix(&proc_status(*pid, "CapEff"), 16).unwrap();
            assert_eq!(eff & !(1 << 10), 0, "pid {pid} CapEff {eff:x}");
            assert_eq!(proc_status(*pid, "NoNewPrivs"), "1");
        }
        let root_ro = std::fs::read_to_string(format!("/proc/{}/mountinfo", pids[0]))
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some("/") && l.split(' ').nth(5).is_some_and(|o| o.starts_with("ro")));
        assert!(root_ro, "the controller's root filesystem is writable");
    }
    // certgen ran as Jobs: the Secret exists and the webhook has its CA.
    let secret = json(&c, &["get", "secret", "-n", NS, &format!("{FULLNAME}-admission")]);
    assert!(
        secret["data"]["cert"].is_string() || secret["data"]["tls.crt"].is_string(),
        "{secret}"
    );
    let hook = json(
        &c,
        &[
            "get",
            "validatingwebhookconfiguration",
            &format!("{FULLNAME}-admission"),
        ],
    );
    let cc = &hook["webhooks"][0]["clientConfig"];
    assert!(cc["service"]["name"].is_string(), "{cc}");
    assert!(cc["caBundle"].as_str().is_some_and(|b| !b.is_empty()), "{cc}");
    // The webhook, through its Service, denies a bad Ingress and admits a
    // good one.
    c.apply(&backend_manifest("web", "default", 3, Some(5))).unwrap();
    let bad = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: bad\n  annotations:\n    nginx.ingress.kubernetes.io/proxy-body-size: \"1m; } load_module /x.so; #\"\nspec:\n  ingressClassName: nginx\n  rules:\n  - host: bad.test\n    http:\n      paths:\n      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}\n";
    let denied = c.apply(bad).unwrap_err();
    assert!(
        denied.contains("denied the request") && denied.contains("proxy-body-size"),
        "{denied}"
    );
    // The leader holds the Lease.
    let names: Vec<String> = pods
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let mut holder = String::new();
    wait_for("a leader", Duration::from_secs(60), || {
        holder = lease_holder(&c);
        names.contains(&holder)
    })
    .unwrap();
    // Ingress status: the Service's LoadBalancer address, once one is
    // given (this test stands for the load-balancer controller).
    c.kubectl(&[
        "patch",
        "service",
        "-n",
        NS,
        &format!("{FULLNAME}-controller"),
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!("{{\"status\":{{\"loadBalancer\":{{\"ingress\":[{{\"ip\":\"{LB_IP}\"}}]}}}}}}"),
    ])
    .unwrap();
    let status_after = wait_for("Ingress status", Duration::from_secs(30), || {
        ingress_addresses(&c, "default", "web") == vec![LB_IP.to_string()]
    })
    .unwrap();
    push(
        &mut rows,
        Row {
            scenario: "helm install (2 replicas, certgen Jobs, webhook via Service)".into(),
            report: None,
            reloads: 0,
            note: format!(
                "installed and Ready in {:.1}s; bad Ingress denied; leader {holder}; status {LB_IP} after {:.1}s",
                installed.as_secs_f64(),
                status_after.as_secs_f64()
            ),
        },
    );

    // --- traffic stays on the node: a Pod reaches the apiserver through
    // the `kubernetes` Service, and nothing outside the node.
    wait_rollout(&c, "default", "web");
    let pod_ip = json(&c, &["get", "pods", "-n", "default", "-l", "app=web"])["items"][0]["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_string();
    let connect = |to: &str| {
        ureq::post(&format!("http://{pod_ip}:8080/admin/connect?to={to}"))
            .send_empty()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap()
    };
    let inside = connect(&format!("{}:443", cluster::KUBERNETES_SERVICE_IP));
    assert_eq!(inside.trim(), "connected");
    let drops = cluster::host::guard_drops();
    // TEST-NET-3 (RFC 5737): documentation only, never routed anywhere.
    let outside = connect("203.0.113.1:80");
    assert_ne!(outside.trim(), "connected");
    assert!(
        cluster::host::guard_drops() > drops,
        "the guard did not see the packet: {outside}"
    );
    push(
        &mut rows,
        Row {
            scenario: "a Pod's reach".into(),
            report: None,
            reloads: 0,
            note: format!(
                "kubernetes Service: {}; 203.0.113.1:80: {} (dropped by the guard)",
                inside.trim(),
                outside.trim()
            ),
        },
    );

    // --- clients on the host: ClusterIP, NodePort, LoadBalancer address.
    let ip = cluster_ip(&c);
    wait_served(&c, "web", &ip);
    let (np80, np443) = (node_port(&c, 80), node_port(&c, 443));
    for (scheme, addr, port) in [
        ("http", ip.as_str(), 80),
        ("https", ip.as_str(), 443),
        ("http", NODE_IP, np80),
        ("https", NODE_IP, np443),
        ("http", LB_IP, 80),
        ("https", LB_IP, 443),
    ] {
        let (code, body) = curl("web.test", scheme, addr, port, "/hello");
        assert_eq!(code, 200, "{scheme}://{addr}:{port}: {body}");
        assert!(body.starts_with("web-"), "{body}");
    }
    push(
        &mut rows,
        Row {
            scenario: "host clients via ClusterIP, NodePort, LB address (HTTP, HTTPS)".into(),
            report: None,
            reloads: 0,
            note: format!("{ip}:80/443, {NODE_IP}:{np80}/{np443}, {LB_IP}:80/443 all 200"),
        },
    );

    // --- backend rollouts under load, with and without preStop.
    rollout_scenario(&c, "web", Some(5), &ip, &mut rows);
    rollout_scenario(&c, "bare", None, &ip, &mut rows);

    // --- a backend Pod killed hard under load.
    let before = reloads(&c);
    let load = Load::start(load_options(&ip, "web.test", false));
    std::thread::sleep(Duration::from_secs(3));
    let victim = json(&c, &["get", "pods", "-n", "default", "-l", "app=web"])["items"][0].clone();
    let pids = container_pids(&victim);
    assert!(!pids.is_empty());
    for p in &pids {
        // SAFETY: kill(2) on the backend container's own processes.
        unsafe { libc::kill(*p, libc::SIGKILL) };
    }
    std::thread::sleep(Duration::from_secs(8));
    let rep = load.finish();
    let note = format!(
        "{} SIGKILLed; failures: [{}]; nginx: [{}]",
        victim["metadata"]["name"].as_str().unwrap(),
        rep.failure_summary(),
        upstream_errors(&c, rep.took)
    );
    // A killed process's connections are reset by its kernel (the Pod's
    // network namespace lives on): refused and reset connections are
    // retried on another endpoint; only a POST caught mid-request may fail.
    assert!(rep.failures(Method::Get).is_empty(), "GET failed: {note}");
    assert!(rep.failures(Method::Post).len() <= 4, "POST failed: {note}");
    push(
        &mut rows,
        Row {
            scenario: "backend Pod killed (SIGKILL)".into(),
            report: Some(rep),
            reloads: reloads_between(&before, &reloads(&c)),
            note,
        },
    );
    wait_rollout(&c, "default", "web");

    // --- the controller upgrading itself under load (helm upgrade with a
    // changed Pod template; 2 replicas and the chart's PodDisruptionBudget).
    wait_served(&c, "web", &ip);
    let load_retry = Load::start(load_options(&ip, "web.test", true));
    let t = Instant::now();
    c.helm(&[
        "upgrade",
        RELEASE,
        &chart(),
        "--namespace",
        NS,
        "--reuse-values",
        "--set",
        "controller.podAnnotations.rollout=second",
        "--wait",
        "--timeout",
        "6m",
    ])
    .unwrap();
    wait_for("the old controller Pods gone", Duration::from_secs(330), || {
        controller_pods(&c).len() == 2 && {
            json(
                &c,
                &["get", "pods", "-n", NS, "-l", "app.kubernetes.io/component=controller"],
            )["items"]
                .as_array()
                .unwrap()
                .len()
                == 2
        }
    })
    .unwrap();
    let upgraded = t.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let rep = load_retry.finish();
    let retried: u32 = rep.samples.iter().map(|s| s.retried).sum();
    let note = format!(
        "upgrade done in {:.0}s; {retried} refused connections retried; {}",
        upgraded.as_secs_f64(),
        rep.failure_summary()
    );
    eprintln!("controller upgrade: {note}");
    let new_conn_failures = rep.samples.iter().filter(|s| s.failed() && !s.keep_alive).count();
    assert_eq!(
        new_conn_failures, 0,
        "clients that retry a refused connection failed: {note}"
    );
    push(
        &mut rows,
        Row {
            scenario: "controller helm upgrade (2 replicas, PDB)".into(),
            report: Some(rep),
            reloads: 0,
            note,
        },
    );

    // --- leader loss: the other replica takes the Lease and keeps status
    // current. After the upgrade the old leader released the Lease as it
    // stopped; one of the new Pods takes it on its next look.
    let running: Vec<String> = controller_pods(&c)
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let mut holder = String::new();
    let leaderless = wait_for("a leader among the new Pods", ttl_plus(10), || {
        holder = lease_holder(&c);
        running.contains(&holder)
    })
    .unwrap();
    eprintln!(
        "after the upgrade, {holder} led within {:.1}s",
        leaderless.as_secs_f64()
    );
    let ttl = Duration::from_secs(30);
    let t = Instant::now();
    c.kubectl(&["delete", "pod", "-n", NS, &holder, "--wait=false"])
        .unwrap();
    let mut new_holder = String::new();
    wait_for("a new leader", ttl + Duration::from_secs(10), || {
        new_holder = lease_holder(&c);
        !new_holder.is_empty() && new_holder != holder
    })
    .unwrap();
    let took_lease = t.elapsed();
    c.apply(&backend_manifest("late", "default", 1, None)).unwrap();
    let created = Instant::now();
    wait_for(
        "status on an Ingress made after the leader died",
        ttl + Duration::from_secs(2),
        || ingress_addresses(&c, "default", "late") == vec![LB_IP.to_string()],
    )
    .unwrap();
    let status_in = created.elapsed();
    push(
        &mut rows,
        Row {
            scenario: "leader Pod deleted".into(),
            report: None,
            reloads: 0,
            note: format!(
                "{new_holder} took the Lease {:.1}s after; a new Ingress had status {:.1}s after its creation",
                took_lease.as_secs_f64(),
                status_in.as_secs_f64()
            ),
        },
    );
    wait_for("two controller Pods Ready", Duration::from_secs(120), || {
        let p = controller_pods(&c);
        p.len() == 2 && p.iter().all(watch::ready)
    })
    .unwrap();

    // --- namespace deletion removes its routes and certificates.
    let before = reloads(&c);
    c.kubectl(&["create", "namespace", "tenant"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    tests::openssl(
        dir.path(),
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "t.key",
            "-out",
            "t.crt",
            "-days",
            "2",
            "-subj",
            "/CN=tenant.test",
            "-addext",
            "subjectAltName=DNS:tenant.test",
        ],
    );
    c.kubectl(&[
        "create",
        "secret",
        "tls",
        "tenant-tls",
        "-n",
        "tenant",
        &format!("--cert={}", dir.path().join("t.crt").display()),
        &format!("--key={}", dir.path().join("t.key").display()),
    ])
    .unwrap();
    let tenant = backend_manifest("tenant", "tenant", 1, None).replace(
        "  rules:\n  - host: tenant.test",
        "  tls:\n  - hosts: [tenant.test]\n    secretName: tenant-tls\n  rules:\n  - host: tenant.test",
    );
    c.apply(&tenant).unwrap();
    wait_rollout(&c, "tenant", "tenant");
    wait_for(
        "the tenant served with its certificate",
        Duration::from_secs(60),
        || {
            curl("tenant.test", "https", &ip, 443, "/").0 == 200
                && served_subject("tenant.test", &ip).contains("tenant.test")
        },
    )
    .unwrap();
    // --- the kubectl plugin, from this host with the admin kubeconfig,
    // while a TLS tenant is served.
    let note = kubectl_plugin_scenario(&c);
    push(
        &mut rows,
        Row {
            scenario: "kubectl plugin (kubectl dynamic-balancer …)".into(),
            report: None,
            reloads: 0,
            note,
        },
    );
    let t = Instant::now();
    c.kubectl(&["delete", "namespace", "tenant", "--wait=false"]).unwrap();
    let mut ingress_gone = None;
    wait_for(
        "the tenant's route and certificate gone",
        Duration::from_secs(90),
        || {
            if ingress_gone.is_none() && c.kubectl(&["get", "ingress", "-n", "tenant", "tenant"]).is_err() {
                ingress_gone = Some(t.elapsed());
            }
            curl("tenant.test", "http", &ip, 80, "/").0 == 404
                && !served_subject("tenant.test", &ip).contains("tenant.test")
        },
    )
    .unwrap();
    let gone = t.elapsed();
    let ns_reloads = reloads_between(&before, &reloads(&c));
    push(&mut rows, Row {
        scenario: "namespace created, then deleted".into(),
        report: None,
        reloads: ns_reloads,
        note: format!(
            "the namespace controller removed the Ingress {:.1}s after the deletion; route and certificate gone at {:.1}s",
            ingress_gone.unwrap_or(gone).as_secs_f64(),
            gone.as_secs_f64()
        ),
    });
    // At most four structural changes: the new server, and once more when
    // the Secret's watch event comes after the Ingress's (watches of two
    // kinds are not ordered; the host becomes a TLS host: ssl-redirect);
    // the Secret's deletion, when the namespace controller deletes it
    // before the Ingress (no more ssl-redirect); the server's removal. The
    // certificate and endpoints go by push.
    assert!(ns_reloads <= 4, "{ns_reloads} reloads for one namespace's life");

    print_rows(&rows);
    let report = c.layout.run.clone();
    drop(c);
    assert!(!report.exists(), "the run directory outlived teardown");
    let guard_left = Command::new("iptables-save").output().unwrap();
    let rules = String::from_utf8_lossy(&guard_left.stdout);
    assert!(!rules.contains("KUBE-") && !rules.contains("DYNBAL-"), "{rules}");
    assert!(!Path::new("/sys/class/net").join(cluster::BRIDGE).exists());
}
