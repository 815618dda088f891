//! ingress-nginx's Grafana dashboards and its chart's alert rules, unchanged,
//! against a real Prometheus (Debian's package) scraping this controller
//! while it serves traffic: plain, TLS, failing (502) and refused (403)
//! requests on several Ingresses, then a reload that fails.
//!
//! - Every template-variable query of both dashboards returns values, and
//!   every panel query (and the annotation query) returns data, with the
//!   variables set as Grafana sets them when the dashboard opens (`All`,
//!   whose `allValue` is `.*`) and with the first value of each picked.
//! - The alert rules (`deploy/prometheus/alert-rules.values.yaml`, ingress-
//!   nginx's examples) pass `promtool check rules`; `promtool test rules`
//!   fires each of them on the series this scrape produced; and loaded in
//!   the running Prometheus, the failed reload fires `NGINXConfigFailed`,
//!   the certificate three days from expiry fires `NGINXCertificateExpiry`,
//!   and the 5xx and 4xx shares make `NGINXTooMany500s` and
//!   `NGINXTooMany400s` active (their `for: 1m` is promtool's to show).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::controller::{custom_template, ingress, service, wait_until, Controller, INGRESS_CLASS};
use tests::prometheus::{promtool, Prometheus, Target};
use tests::tls::{https_get, tls_secret, TestCert};
use tests::{dead_port, Upstream};

const POD: &str = "ingress-nginx-controller-7c9d8b5f4-x2x9q";
const NAMESPACE: &str = "ingress-nginx";

fn chart_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(path)
}

fn dashboard(name: &str) -> Value {
    let path = chart_file(&format!("helm/dynamic-balancer/dashboards/{name}"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Every `(panel title, expr)` of a dashboard, rows' panels and the
/// annotation queries included.
fn queries(d: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    let title = format!(
                        "{} ({})",
                        p["title"].as_str().unwrap_or(""),
                        t["refId"].as_str().unwrap_or("")
                    );
                    out.push((title, e.to_string()));
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    for a in d["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(e) = a["expr"].as_str() {
            out.push((
                format!("annotation {}", a["name"].as_str().unwrap_or("")),
                e.to_string(),
            ));
        }
    }
    out
}

/// The query variables in order: (name, query, allValue).
fn variables(d: &Value) -> Vec<(String, String, String)> {
    d["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let query = v["query"]["query"].as_str().or(v["query"].as_str()).unwrap_or("");
            (
                v["name"].as_str().unwrap().to_string(),
                query.trim().to_string(),
                v["allValue"].as_str().unwrap_or(".*").to_string(),
            )
        })
        .collect()
}

/// `$name` and `${name}` replaced, longest names first (`$controller` is a
/// prefix of `$controller_class`).
fn substitute(text: &str, values: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = values.iter().collect();
    sorted.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    let mut out = text.to_string();
    for (name, value) in sorted {
        out = out
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    out
}

/// Grafana's `label_values(selector, label)`.
fn label_values(p: &Prometheus, query: &str) -> Vec<String> {
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values query: {query}"));
    let (selector, label) = inner.rsplit_once(',').unwrap();
    p.label_values(selector.trim(), label.trim())
        .unwrap_or_else(|e| panic!("{query}: {e}"))
}

/// Each variable's value: the first value its query returns for those in
/// `picked` (a user's choice in the drop-down), its `allValue` for the
/// others (Grafana's `All`, the default); every query must return values.
fn resolve(p: &Prometheus, d: &Value, picked: &[&str]) -> Vec<(String, String)> {
    let mut values = Vec::new();
    for (name, query, all) in variables(d) {
        let options = label_values(p, &substitute(&query, &values));
        assert!(!options.is_empty(), "variable {name}: {query} returned no values");
        let value = if picked.contains(&name.as_str()) {
            options[0].clone()
        } else {
            all
        };
        values.push((name, value));
    }
    values
}

fn tls_ingress(name: &str, host: &str, secret: &str) -> String {
    format!(
        "{}  tls:\n    - hosts: [{host}]\n      secretName: {secret}\n",
        ingress(name, host, "/", "web", &[])
    )
}

fn rules() -> Vec<Value> {
    let text = std::fs::read_to_string(chart_file("prometheus/alert-rules.values.yaml")).unwrap();
    let values: Value = serde_saphyr::from_str(&text).unwrap();
    values["controller"]["metrics"]["prometheusRule"]["rules"]
        .as_array()
        .cloned()
        .unwrap()
}

/// A Prometheus rule file (JSON is YAML) with `rules` in one group.
fn rule_file(rules: &[Value]) -> String {
    json!({"groups": [{"name": "ingress-nginx", "rules": rules}]}).to_string()
}

#[test]
fn ingress_nginx_dashboards_and_alerts_work_on_a_real_prometheus() {
    let web = Upstream::start();
    let dead = dead_port();
    let cert = TestCert::with_validity("tls.test", -1, 3);
    // nginx -t fails once a fifth host appears: a reload that fails.
    let dir = tempfile::tempdir().unwrap();
    let template = custom_template(dir.path(), |base| {
        base.replacen(
            "http {",
            "http {\n{% if s.servers|length > 5 %}\n    no_such_directive on;\n{% endif %}",
            1,
        )
    });
    let c = Controller::start_as_pod(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc-web.yaml", service("web", &[web.port])),
            ("svc-dead.yaml", service("dead", &[dead])),
            ("secret.yaml", tls_secret("tls-cert", &cert)),
            ("ing-web.yaml", ingress("web", "web.test", "/", "web", &[])),
            ("ing-tls.yaml", tls_ingress("tls", "tls.test", "tls-cert")),
            ("ing-dead.yaml", ingress("dead", "dead.test", "/", "dead", &[])),
            (
                "ing-denied.yaml",
                ingress(
                    "denied",
                    "denied.test",
                    "/",
                    "web",
                    &[("whitelist-source-range", "10.0.0.0/8")],
                ),
            ),
        ],
        &["--template", template.to_str().unwrap()],
        POD,
        NAMESPACE,
    );
    let rules = rules();
    assert_eq!(rules.len(), 4);
    let p = Prometheus::start(
        &[Target {
            address: format!("127.0.0.1:{}", c.metrics_port),
            // What Kubernetes service discovery gives a target, as
            // ingress-nginx's own Prometheus manifests relabel it.
            labels: &[("namespace", NAMESPACE), ("pod", POD), ("kubernetes_pod_name", POD)],
        }],
        &rule_file(&rules),
    );
    let (ok, out) = promtool(p.dir(), &["check", "rules", "rules.yml"]);
    assert!(ok, "promtool check rules:\n{out}");

    // Traffic over several scrapes: per round 6 plain and 2 TLS 200s, one
    // 502 (nothing listens on dead's port), one 403 (not in the allowlist).
    let started = Instant::now();
    for _ in 0..8 {
        for _ in 0..6 {
            assert_eq!(c.get("web.test", "/").0, 200);
        }
        for _ in 0..2 {
            assert_eq!(https_get(c.https_port, "tls.test", "/", None).map(|r| r.0), Ok(200));
        }
        assert_eq!(c.get("dead.test", "/").0, 502);
        assert_eq!(c.get("denied.test", "/").0, 403);
        std::thread::sleep(Duration::from_millis(700));
        if started.elapsed() > Duration::from_secs(30) {
            break;
        }
    }
    // The reload that fails, and a scrape that sees it.
    c.write("ing-broken.yaml", &ingress("broken", "broken.test", "/", "web", &[]));
    assert!(
        wait_until(Duration::from_secs(20), || p
            .query("nginx_ingress_controller_config_last_reload_successful == 0")
            .is_ok_and(|r| !r.is_empty())),
        "{}",
        c.log()
    );
    assert!(wait_until(Duration::from_secs(20), || p.scraped(6)), "{}", p.log());

    // The dashboards, as Grafana opens them (All) and with a value picked.
    for name in ["nginx.json", "request-handling-performance.json"] {
        let d = dashboard(name);
        let exprs = queries(&d);
        assert!(exprs.len() >= 13, "{name}: {} queries", exprs.len());
        // nginx.json: the controller drop-downs that came up empty before
        // this controller had ingress-nginx's constant labels. (Picking an
        // Ingress there empties the certificate panel in ingress-nginx too:
        // the certificate series have no `ingress` label.)
        let picks: &[&str] = if name == "nginx.json" {
            &["namespace", "controller_class", "controller"]
        } else {
            &["ingress"]
        };
        for picked in [&[][..], picks] {
            let values = resolve(&p, &d, picked);
            let empty: Vec<String> = exprs
                .iter()
                .filter(|(_, e)| {
                    p.query(&substitute(e, &values))
                        .unwrap_or_else(|err| panic!("{name}: {err}"))
                        .is_empty()
                })
                .map(|(title, e)| format!("{title}: {}", substitute(e, &values)))
                .collect();
            assert!(
                empty.is_empty(),
                "{name} with {values:?}: queries without data:\n{}",
                empty.join("\n")
            );
            eprintln!("{name}: {} queries with data, variables {values:?}", exprs.len());
        }
    }

    // The alerts, live: the two `for: 1s` ones fire, the `for: 1m` ones
    // are active.
    let live = |name: &str, state: &str| {
        p.alerts()
            .iter()
            .any(|(n, s)| n == name && (s == state || s == "firing"))
    };
    for (name, state) in [
        ("NGINXConfigFailed", "firing"),
        ("NGINXCertificateExpiry", "firing"),
        ("NGINXTooMany500s", "pending"),
        ("NGINXTooMany400s", "pending"),
    ] {
        assert!(
            wait_until(Duration::from_secs(15), || live(name, state)),
            "{name} is not {state}: {:?}",
            p.alerts()
        );
    }

    eprintln!("alerts: {:?}", p.alerts());

    // promtool, on the series of this scrape (certificate expiry rebased
    // to promtool's clock, which starts at 0), with the rules as written:
    // each fires by two minutes.
    let now = p.query("time()").unwrap()[0][1]
        .as_str()
        .unwrap()
        .parse::<f64>()
        .unwrap();
    let mut input = Vec::new();
    for metric in [
        "nginx_ingress_controller_requests",
        "nginx_ingress_controller_config_last_reload_successful",
        "nginx_ingress_controller_ssl_expire_time_seconds",
    ] {
        for s in p.query(metric).unwrap() {
            let labels: Vec<String> = s["metric"]
                .as_object()
                .unwrap()
                .iter()
                .filter(|(k, _)| *k != "__name__")
                .map(|(k, v)| format!("{k}={}", Value::String(v.as_str().unwrap().to_string())))
                .collect();
            let mut v: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
            if metric.ends_with("ssl_expire_time_seconds") {
                v -= now;
            }
            input.push(json!({"series": format!("{metric}{{{}}}", labels.join(",")), "values": format!("{v}x5")}));
        }
    }
    let expected = |alert: &str, extra: &[(&str, &str)]| {
        let rule = rules.iter().find(|r| r["alert"] == alert).unwrap();
        let mut labels = rule["labels"].clone();
        for (k, v) in extra {
            labels[*k] = json!(v);
        }
        json!({"eval_time": "2m", "alertname": alert, "exp_alerts": [{
            "exp_labels": labels,
            "exp_annotations": rule["annotations"],
        }]})
    };
    let tests = json!({
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": input,
            "alert_rule_test": [
                expected("NGINXConfigFailed", &[]),
                expected("NGINXCertificateExpiry", &[("host", "tls.test")]),
                expected("NGINXTooMany500s", &[]),
                expected("NGINXTooMany400s", &[]),
            ],
        }],
    });
    let input_len = tests["tests"][0]["input_series"].as_array().map_or(0, Vec::len);
    std::fs::write(p.dir().join("tests.yml"), tests.to_string()).unwrap();
    let (ok, out) = promtool(p.dir(), &["test", "rules", "tests.yml"]);
    assert!(ok, "promtool test rules:\n{out}\n{tests:#}");
    eprintln!("promtool test rules, {} input series: {}", input_len, out.trim());
}
