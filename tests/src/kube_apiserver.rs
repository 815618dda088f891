//! A real kube-apiserver with etcd, for the e2e suite's real tier.
//!
//! Kubernetes 1.36 (kube-apiserver, built from the Go module proxy) and
//! etcd 3.5 (Debian sid's package), both put in a cache outside the clone
//! by `tests/kube/build.sh`, with helm and kubectl. The apiserver serves the
//! native `discovery.k8s.io/v1`; authorization is RBAC, so the controller
//! runs with the chart's ServiceAccount and a token from the TokenRequest
//! API, and only what the chart grants works.
//!
//! The apiserver binds 127.0.0.1 with TLS (a CA made here with openssl) and
//! token authentication (a static admin token for the test's own calls,
//! ServiceAccount tokens for the controller); etcd listens on loopback
//! ports of its own. Status writes are recorded in an audit log.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{free_port, openssl};

const TOKEN: &str = "e2e-admin-token";

/// `helm install ingress ... -n ingress-nginx`: the release the tests use.
pub const RELEASE: &str = "ingress";
pub const RELEASE_NAMESPACE: &str = "ingress-nginx";
/// The chart's fullname for that release.
pub const CHART_FULLNAME: &str = "ingress-dynamic-balancer";

/// What the chart gives the controller.
pub struct ChartIdentity {
    pub kubeconfig: String,
    pub token: String,
    /// Flags as the chart's Deployment passes them.
    pub args: Vec<String>,
}

impl ChartIdentity {
    pub fn args(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }
}

pub struct RealApiServer {
    etcd: Child,
    apiserver: Child,
    /// kube-controller-manager, when a test asked for it.
    controller_manager: Option<Child>,
    /// How the apiserver was started, for [`RealApiServer::restart`].
    command: Vec<String>,
    dir: tempfile::TempDir,
    pub port: u16,
    agent: ureq::Agent,
}

/// The directory of the tier's binaries (kube-apiserver, etcd, helm,
/// kubectl), built or found by `tests/kube/build.sh` once per process.
pub fn tier_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kube/build.sh");
        let out = Command::new(&script)
            .stderr(Stdio::inherit())
            .output()
            .expect("running tests/kube/build.sh");
        assert!(out.status.success(), "tests/kube/build.sh failed (see above)");
        let dir = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_string();
        let dir = PathBuf::from(dir);
        assert!(
            dir.join("kube-apiserver").exists(),
            "no kube-apiserver in {}",
            dir.display()
        );
        dir
    })
}

/// `helm` from the tier.
pub fn helm() -> Command {
    Command::new(tier_bin().join("helm"))
}

/// The chart, rendered by `helm template` with `--set` values.
pub fn helm_template(release: &str, namespace: &str, sets: &[&str]) -> String {
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/dynamic-balancer");
    let mut cmd = helm();
    cmd.args(["template", release])
        .arg(&chart)
        .args(["--namespace", namespace]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("helm");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// (plural path, namespaced) of the kinds the tests create.
fn collection(kind: &str, namespace: &str) -> String {
    let ns = |base: &str, plural: &str| format!("{base}/namespaces/{namespace}/{plural}");
    match kind {
        "Ingress" => ns("/apis/networking.k8s.io/v1", "ingresses"),
        "IngressClass" => "/apis/networking.k8s.io/v1/ingressclasses".into(),
        "Service" => ns("/api/v1", "services"),
        "Secret" => ns("/api/v1", "secrets"),
        "ConfigMap" => ns("/api/v1", "configmaps"),
        "EndpointSlice" => ns("/apis/discovery.k8s.io/v1", "endpointslices"),
        "Namespace" => "/api/v1/namespaces".into(),
        "Pod" => ns("/api/v1", "pods"),
        "GatewayClass" => "/apis/gateway.networking.k8s.io/v1/gatewayclasses".into(),
        "Gateway" => ns("/apis/gateway.networking.k8s.io/v1", "gateways"),
        "ListenerSet" => ns("/apis/gateway.networking.k8s.io/v1", "listenersets"),
        "HTTPRoute" => ns("/apis/gateway.networking.k8s.io/v1", "httproutes"),
        "GRPCRoute" => ns("/apis/gateway.networking.k8s.io/v1", "grpcroutes"),
        "ReferenceGrant" => ns("/apis/gateway.networking.k8s.io/v1", "referencegrants"),
        "BackendTLSPolicy" => ns("/apis/gateway.networking.k8s.io/v1", "backendtlspolicies"),
        "ClusterTrustBundle" => "/apis/certificates.k8s.io/v1beta1/clustertrustbundles".into(),
        other => panic!("no collection for {other}"),
    }
}

impl RealApiServer {
    /// Builds the tier on first use (the script caches it), then starts
    /// etcd and the apiserver.
    pub fn start() -> RealApiServer {
        let bin = tier_bin().join("kube-apiserver");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=e2e-ca",
            ],
        );
        std::fs::write(d.join("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=kube-apiserver",
            ],
        );
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        );
        openssl(d, &["genrsa", "-out", "sa.key", "2048"]);
        openssl(d, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        std::fs::write(d.join("tokens.csv"), format!("{TOKEN},e2e-admin,1,system:masters\n")).unwrap();
        // Who writes Ingress status, and with which token (each
        // TokenRequest token has its own credential id).
        std::fs::write(
            d.join("audit.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  resources:\n  - group: networking.k8s.io\n    resources: [ingresses/status]\n  verbs: [patch, update]\n- level: None\n",
        )
        .unwrap();

        let (client, peer, port) = (free_port(), free_port(), free_port());
        let log = |name: &str| std::fs::File::create(d.join(name)).unwrap();
        let etcd = Command::new(tier_bin().join("etcd"))
            .args(["--name", "e2e", "--data-dir"])
            .arg(d.join("etcd"))
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("e2e=http://127.0.0.1:{peer}")])
            .stdin(Stdio::null())
            .stdout(log("etcd.log"))
            .stderr(log("etcd.log"))
            .spawn()
            .expect("etcd from tests/kube/build.sh");
        let path = |f: &str| d.join(f).display().to_string();
        let command: Vec<String> = [
            bin.display().to_string(),
            format!("--etcd-servers=http://127.0.0.1:{client}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", path("server.crt")),
            format!("--tls-private-key-file={}", path("server.key")),
            format!("--cert-dir={}", path("certs")),
            format!("--token-auth-file={}", path("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", path("sa.pub")),
            format!("--service-account-signing-key-file={}", path("sa.key")),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            format!("--audit-policy-file={}", path("audit.yaml")),
            format!("--audit-log-path={}", path("audit.log")),
            "--enable-priority-and-fairness=false".into(),
            // ClusterTrustBundles (beta, off by default): CA bundles Gateways and
            // BackendTLSPolicies may name.
            "--feature-gates=ClusterTrustBundle=true".into(),
            "--runtime-config=certificates.k8s.io/v1beta1/clustertrustbundles=true".into(),
        ]
        .into();
        let apiserver = spawn_apiserver(&command, d);
        let ca = std::fs::read(d.join("ca.crt")).unwrap();
        let cert = ureq::tls::Certificate::from_pem(&ca).unwrap().to_owned();
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::new_with_certs(&[cert]))
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let server = RealApiServer {
            etcd,
            apiserver,
            controller_manager: None,
            command,
            dir,
            port,
            agent,
        };
        server.wait_ready();
        server
    }

    /// Starts kube-controller-manager 1.36 with the controllers that make
    /// EndpointSlices from Services and Pods (`endpointslice`) and give
    /// every namespace its `default` ServiceAccount (`serviceaccount`), so
    /// that Pods can be created. There is no kubelet: a test sets a Pod's
    /// IP and readiness through its `status` subresource, as a kubelet
    /// would.
    pub fn start_controller_manager(&mut self) {
        let d = self.dir.path();
        let log = std::fs::File::create(d.join("kcm.log")).unwrap();
        let child = Command::new(tier_bin().join("kube-controller-manager"))
            .arg(format!("--kubeconfig={}", self.kubeconfig_file().display()))
            .args([
                "--controllers=endpointslice,serviceaccount",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--concurrent-service-endpoint-syncs=2",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("kube-controller-manager");
        self.controller_manager = Some(child);
    }

    pub fn controller_manager_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kcm.log")).unwrap_or_default()
    }

    /// Stops the apiserver and starts it again on the same etcd and port:
    /// every watch is cut, and the watch cache starts afresh.
    pub fn restart(&mut self) {
        let _ = self.apiserver.kill();
        let _ = self.apiserver.wait();
        self.apiserver = spawn_apiserver(&self.command, self.dir.path());
        self.wait_ready();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("apiserver.log")).unwrap_or_default()
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.call_with(TOKEN, method, path, body, "application/json")
    }

    pub fn call_with(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
        content_type: &str,
    ) -> (u16, Value) {
        let (status, text) = self.send(token, method, path, body, content_type);
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// One request; its status (0: no answer) and its body as text.
    fn send(&self, token: &str, method: &str, path: &str, body: Option<&Value>, content_type: &str) -> (u16, String) {
        let req = ureq::http::Request::builder()
            .method(method)
            .uri(self.url(path))
            .header("Authorization", format!("Bearer {token}"))
            .header("Content-Type", content_type)
            .body(body.map(Value::to_string).unwrap_or_default())
            .unwrap();
        match self.agent.run(req) {
            Ok(mut resp) => (
                resp.status().as_u16(),
                resp.body_mut().read_to_string().unwrap_or_default(),
            ),
            Err(_) => (0, String::new()),
        }
    }

    /// The text at `path` (admin): `/metrics`, say.
    pub fn text(&self, path: &str) -> (u16, String) {
        self.send(TOKEN, "GET", path, None, "application/json")
    }

    /// The sum of `apiserver_request_total` for `verb` on `resource` (all
    /// codes, scopes and clients), from the apiserver's own metrics.
    pub fn requests_total(&self, verb: &str, resource: &str) -> u64 {
        let (code, text) = self.text("/metrics");
        assert_eq!(code, 200, "GET /metrics");
        let (verb, resource) = (format!("verb=\"{verb}\""), format!("resource=\"{resource}\""));
        text.lines()
            .filter(|l| l.starts_with("apiserver_request_total{") && l.contains(&verb) && l.contains(&resource))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        while self.call("GET", "/readyz", None).0 != 200 {
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready in 90 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A kubeconfig with the CA file and the admin's bearer token.
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig_with_token(TOKEN)
    }

    /// A kubeconfig for any bearer token.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster: {{server: \"https://127.0.0.1:{}\", certificate-authority: \"{}\"}}\nusers:\n- name: user\n  user: {{token: {token}}}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: user}}\ncurrent-context: e2e\n",
            self.port,
            self.dir.path().join("ca.crt").display()
        )
    }

    /// Installs the chart's objects as `helm install ingress -n ingress-nginx`
    /// would (the webhook off unless `sets` turns it on), and returns the
    /// controller's identity: a kubeconfig with a token of the chart's
    /// ServiceAccount, and the flags the chart's Deployment passes.
    pub fn install_chart(&self, sets: &[&str]) -> ChartIdentity {
        let mut all = vec!["controller.admissionWebhooks.enabled=false"];
        all.extend_from_slice(sets);
        let yaml = helm_template(RELEASE, RELEASE_NAMESPACE, &all);
        self.kubectl(&["create", "namespace", RELEASE_NAMESPACE], None);
        self.apply_manifests(&yaml);
        let token = self.service_account_token(RELEASE_NAMESPACE, CHART_FULLNAME);
        ChartIdentity {
            kubeconfig: self.kubeconfig_with_token(&token),
            token,
            args: vec![
                format!("--configmap={RELEASE_NAMESPACE}/{CHART_FULLNAME}-controller"),
                format!("--election-id={CHART_FULLNAME}-leader"),
                "--ingress-class=nginx".into(),
                "--controller-class=k8s.io/ingress-nginx".into(),
            ],
        }
    }

    /// The kinds (CRD plurals) the Gateway tests use.
    pub const GATEWAY_KINDS: [&'static str; 7] = [
        "gatewayclasses",
        "gateways",
        "listenersets",
        "httproutes",
        "grpcroutes",
        "referencegrants",
        "backendtlspolicies",
    ];

    /// Installs Gateway API v1.7.0's standard CRDs (from the
    /// `sigs.k8s.io/gateway-api@v1.7.0` Go module, which the Go module
    /// proxy serves; v1.7 needs Go 1.27) and waits until they are served.
    pub fn install_gateway_crds(&self) {
        self.install_gateway_crd_kinds(&Self::GATEWAY_KINDS);
    }

    /// [`Self::install_gateway_crds`], of these kinds (CRD plurals) only.
    pub fn install_gateway_crd_kinds(&self, kinds: &[&str]) {
        let out = Command::new("go")
            .args(["mod", "download", "-json", "sigs.k8s.io/gateway-api@v1.7.0"])
            .current_dir(std::env::temp_dir())
            .env("GOTOOLCHAIN", "go1.27.3")
            .output()
            .expect("go (the Gateway API CRDs come from its module cache)");
        assert!(
            out.status.success(),
            "go mod download: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let info: Value = serde_json::from_slice(&out.stdout).unwrap();
        let dir = PathBuf::from(info["Dir"].as_str().unwrap()).join("config/crd/standard");
        for kind in kinds {
            let yaml = std::fs::read_to_string(dir.join(format!("gateway.networking.k8s.io_{kind}.yaml"))).unwrap();
            self.apply_manifests(&yaml);
        }
        self.wait_gateway_crd_kinds(kinds);
    }

    /// Waits until the Gateway API kinds the tests use are served (a CRD
    /// takes a moment to be established).
    pub fn wait_gateway_crds(&self) {
        self.wait_gateway_crd_kinds(&Self::GATEWAY_KINDS);
    }

    fn wait_gateway_crd_kinds(&self, kinds: &[&str]) {
        let served = (0..100).any(|_| {
            let ok = kinds
                .iter()
                .all(|k| self.get(&format!("/apis/gateway.networking.k8s.io/v1/{k}")).0 == 200);
            if !ok {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            ok
        });
        assert!(served, "the Gateway API CRDs {kinds:?} were not served within 10 s");
    }

    /// The admin kubeconfig as a file, for kubectl.
    pub fn kubeconfig_file(&self) -> PathBuf {
        let path = self.dir.path().join("admin.kubeconfig");
        if !path.exists() {
            std::fs::write(&path, self.kubeconfig()).unwrap();
        }
        path
    }

    /// Runs the tier's kubectl as admin; returns (success, stdout + stderr).
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        use std::io::Write as _;
        let mut child = Command::new(tier_bin().join("kubectl"))
            .arg("--kubeconfig")
            .arg(self.kubeconfig_file())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// `kubectl apply --server-side` of a YAML stream: a server-side dry run
    /// first (every object validated, nothing stored), then for real.
    pub fn apply_manifests(&self, yaml: &str) {
        for dry in [true, false] {
            let mut args = vec!["apply", "--server-side", "--field-manager=e2e", "-f", "-"];
            if dry {
                args.push("--dry-run=server");
            }
            let (ok, out) = self.kubectl(&args, Some(yaml));
            assert!(ok, "kubectl {args:?}:\n{out}");
        }
    }

    /// A token for a ServiceAccount from the TokenRequest API, as the
    /// kubelet mounts one into a Pod.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let (code, body) = self.call(
            "POST",
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"),
            Some(
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 3600}}),
            ),
        );
        assert_eq!(code, 201, "TokenRequest for {namespace}/{name}: {body}");
        body["status"]["token"].as_str().unwrap().to_string()
    }

    /// A call with another identity's token: (status, body).
    pub fn call_as(&self, token: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.call_with(token, method, path, body, "application/json")
    }

    /// The object at `path` (admin).
    pub fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None)
    }

    /// The audit log's events (JSON lines).
    pub fn audit_events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Creates or replaces an object, creating its namespace first.
    pub fn apply(&self, obj: Value) {
        let kind = obj["kind"].as_str().unwrap().to_string();
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
        if kind != "Namespace" && kind != "IngressClass" && kind != "GatewayClass" {
            self.call(
                "POST",
                "/api/v1/namespaces",
                Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})),
            );
        }
        let coll = collection(&kind, &ns);
        let (code, body) = self.call("POST", &coll, Some(&obj));
        if code == 409 {
            let name = obj["metadata"]["name"].as_str().unwrap();
            let (_, current) = self.call("GET", &format!("{coll}/{name}"), None);
            let mut next = obj.clone();
            next["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
            // The apiserver allocated these; an update must carry them.
            for field in ["clusterIP", "clusterIPs"] {
                if !current["spec"][field].is_null() {
                    next["spec"][field] = current["spec"][field].clone();
                }
            }
            let (code, body) = self.call("PUT", &format!("{coll}/{name}"), Some(&next));
            assert_eq!(code, 200, "PUT {kind} {name}: {body}");
        } else {
            assert_eq!(code, 201, "POST {kind}: {body}");
        }
    }
}

fn spawn_apiserver(command: &[String], dir: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("apiserver.log"))
        .unwrap();
    Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("kube-apiserver")
}

impl Drop for RealApiServer {
    fn drop(&mut self) {
        if let Some(kcm) = self.controller_manager.as_mut() {
            let _ = kcm.kill();
            let _ = kcm.wait();
        }
        for child in [&mut self.apiserver, &mut self.etcd] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl crate::controller::Cluster for RealApiServer {
    fn apply_object(&self, obj: Value) {
        RealApiServer::apply(self, obj);
    }

    fn delete(&self, kind: &str, namespace: &str, name: &str) {
        let (code, body) = self.call("DELETE", &format!("{}/{name}", collection(kind, namespace)), None);
        assert!(
            code == 200 || code == 202 || code == 404,
            "DELETE {kind} {name}: {code} {body}"
        );
    }
}
