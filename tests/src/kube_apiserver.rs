//! A real kube-apiserver with etcd, for the e2e suite's real tier.
//!
//! Both come from Debian's packages: etcd-server 3.4, and kube-apiserver
//! 1.20.2 built from Debian bookworm's `kubernetes` source package by
//! `tests/kube-apiserver/build.sh`, because no newer apiserver can be had
//! offline here. 1.20 has no `discovery.k8s.io/v1`, so the built-in
//! v1beta1 is switched off and EndpointSlice v1 is registered as a CRD with
//! the same group, kind and fields; kube's typed client cannot tell.
//!
//! The apiserver binds 127.0.0.1 with TLS (a CA made here with openssl) and
//! token authentication; etcd listens on loopback ports of its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::free_port;

const TOKEN: &str = "e2e-admin-token";

pub struct RealApiServer {
    etcd: Child,
    apiserver: Child,
    /// How the apiserver was started, for [`RealApiServer::restart`].
    command: Vec<String>,
    dir: tempfile::TempDir,
    pub port: u16,
    agent: ureq::Agent,
}

/// `build/kube-apiserver/bin/kube-apiserver`, built by the script.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../build/kube-apiserver/bin/kube-apiserver")
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
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
        other => panic!("no collection for {other}"),
    }
}

impl RealApiServer {
    /// Builds kube-apiserver on first use (the script caches it), then
    /// starts etcd and the apiserver.
    pub fn start() -> RealApiServer {
        let bin = binary();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kube-apiserver/build.sh");
        let status = Command::new(&script)
            .status()
            .expect("running tests/kube-apiserver/build.sh");
        assert!(
            status.success() && bin.exists(),
            "building kube-apiserver failed (see above)"
        );
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

        let (client, peer, port) = (free_port(), free_port(), free_port());
        let log = |name: &str| std::fs::File::create(d.join(name)).unwrap();
        let etcd = Command::new("etcd")
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
            .expect("etcd (apt-get install etcd-server)");
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
            "--runtime-config=discovery.k8s.io/v1beta1=false".into(),
            "--enable-priority-and-fairness=false".into(),
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
            command,
            dir,
            port,
            agent,
        };
        server.wait_ready();
        server.register_endpointslice_crd();
        server
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

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let req = ureq::http::Request::builder()
            .method(method)
            .uri(self.url(path))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .header("Content-Type", "application/json")
            .body(body.map(Value::to_string).unwrap_or_default())
            .unwrap();
        match self.agent.run(req) {
            Ok(mut resp) => {
                let status = resp.status().as_u16();
                let text = resp.body_mut().read_to_string().unwrap_or_default();
                (status, serde_json::from_str(&text).unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null),
        }
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

    fn register_endpointslice_crd(&self) {
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "endpointslices.discovery.k8s.io",
                         "annotations": {"api-approved.kubernetes.io": "unapproved, e2e stand-in for the built-in v1"}},
            "spec": {
                "group": "discovery.k8s.io",
                "scope": "Namespaced",
                "names": {"plural": "endpointslices", "singular": "endpointslice", "kind": "EndpointSlice", "listKind": "EndpointSliceList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                              "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
            }
        });
        let (code, body) = self.call(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            Some(&crd),
        );
        assert!(code == 201 || code == 409, "CRD: {code} {body}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.call("GET", "/apis/discovery.k8s.io/v1/endpointslices", None).0 != 200 {
            assert!(
                Instant::now() < deadline,
                "the EndpointSlice CRD was not served:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A kubeconfig with the CA file and the bearer token.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster: {{server: \"https://127.0.0.1:{}\", certificate-authority: \"{}\"}}\nusers:\n- name: admin\n  user: {{token: {TOKEN}}}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: admin}}\ncurrent-context: e2e\n",
            self.port,
            self.dir.path().join("ca.crt").display()
        )
    }

    /// Creates or replaces an object, creating its namespace first.
    pub fn apply(&self, obj: Value) {
        let kind = obj["kind"].as_str().unwrap().to_string();
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
        if kind != "Namespace" && kind != "IngressClass" {
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
