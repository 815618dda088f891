//! `ingress-controller check`, the migration report, run as a user runs it:
//! the binary on a directory of manifests, table and JSON output, and the
//! exit code.

use std::process::Command;

const MANIFESTS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: nginx}
spec: {controller: k8s.io/ingress-nginx}
---
apiVersion: v1
kind: ConfigMap
metadata: {namespace: ingress-nginx, name: ingress-nginx-controller}
data:
  proxy-read-timeout: "90"
  hsts: "maybe"
  enable-brotli: "true"
---
apiVersion: v1
kind: Service
metadata: {namespace: shop, name: app}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  namespace: shop
  name: clean
  annotations:
    nginx.ingress.kubernetes.io/proxy-body-size: 8m
    nginx.ingress.kubernetes.io/ssl-redirect: "false"
spec:
  ingressClassName: nginx
  rules:
    - host: clean.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: app, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  namespace: shop
  name: dirty
  annotations:
    nginx.ingress.kubernetes.io/proxy-read-timeout: soon
    nginx.ingress.kubernetes.io/enable-modsecurity: "true"
    nginx.ingress.kubernetes.io/limit-rps: "5"
    example.com/unrelated: "kept out of the report"
spec:
  ingressClassName: nginx
  rules:
    - host: dirty.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: app, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {namespace: shop, name: other-class}
spec:
  ingressClassName: traefik
  rules:
    - host: other.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: app, port: {number: 80}}}}
"#;

fn run(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ingress-controller"))
        .arg("check")
        .arg("--manifests")
        .arg(dir)
        .args(extra)
        .output()
        .expect("run ingress-controller check")
}

#[test]
fn check_sorts_every_annotation_and_key_and_fails_when_something_drops() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("all.yaml"), MANIFESTS).unwrap();

    let out = run(dir.path(), &["--output", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let object = |name: &str| {
        report["objects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["object"] == name)
            .unwrap_or_else(|| panic!("{name} in {report:#}"))
            .clone()
    };
    let verdict = |o: &serde_json::Value, item: &str| {
        o["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == item)
            .map(|i| {
                (
                    i["verdict"].as_str().unwrap().to_string(),
                    i["reason"].as_str().unwrap_or("").to_string(),
                )
            })
            .unwrap_or_else(|| panic!("{item} in {o:#}"))
    };

    let clean = object("Ingress shop/clean");
    assert_eq!(verdict(&clean, "proxy-body-size").0, "honoured");
    assert_eq!(verdict(&clean, "ssl-redirect").0, "honoured");

    let dirty = object("Ingress shop/dirty");
    let (v, why) = verdict(&dirty, "proxy-read-timeout");
    assert!(v == "invalid" && why.contains("soon"), "{v} {why}");
    let (v, why) = verdict(&dirty, "enable-modsecurity");
    assert!(v == "ignored" && why.contains("ModSecurity"), "{v} {why}");
    assert_eq!(verdict(&dirty, "limit-rps").0, "honoured");
    assert_eq!(
        dirty["items"].as_array().unwrap().len(),
        3,
        "other prefixes are not reported"
    );

    let cm = object("ConfigMap ingress-nginx/ingress-nginx-controller");
    assert_eq!(verdict(&cm, "proxy-read-timeout").0, "honoured");
    assert_eq!(verdict(&cm, "hsts").0, "invalid");
    assert_eq!(verdict(&cm, "enable-brotli").0, "ignored");

    assert!(
        !report["objects"].to_string().contains("other-class"),
        "Ingresses of another class are not ours"
    );
    assert_eq!(report["summary"]["ingresses"], 2);
    assert_eq!(report["summary"]["ignored"], 2);
    assert_eq!(report["summary"]["invalid"], 2);

    // The table says the same for people.
    let out = run(dir.path(), &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("INVALID proxy-read-timeout"), "{text}");
    assert!(text.contains("IGNORED enable-modsecurity"), "{text}");
    assert!(text.contains("2 Ingresses: "), "{text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("would drop"));
}

#[test]
fn check_passes_when_everything_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let clean: String = MANIFESTS
        .split("\n---\n")
        .filter(|d| !d.contains("name: dirty") && !d.contains("kind: ConfigMap"))
        .collect::<Vec<_>>()
        .join("\n---\n");
    std::fs::write(dir.path().join("all.yaml"), clean).unwrap();
    let out = run(dir.path(), &[]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
