//! A real Prometheus (Debian's `prometheus` package, which nginx-build
//! installs) scraping the controller, for the tests that evaluate
//! ingress-nginx's dashboards and alert rules through its HTTP API.
//!
//! It listens on loopback, keeps its data in a temporary directory, scrapes
//! every second and evaluates rules every second; it is stopped by PID
//! when the handle drops.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::controller::wait_until;
use crate::free_port;

/// The Debian package's binaries.
pub const PROMETHEUS: &str = "/usr/bin/prometheus";
pub const PROMTOOL: &str = "/usr/bin/promtool";

/// One scrape target: `host:port` and the target labels service discovery
/// would give it (`namespace`, `pod`), which decide `exported_*` labels.
pub struct Target<'a> {
    pub address: String,
    pub labels: &'a [(&'a str, &'a str)],
}

pub struct Prometheus {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts scraping `targets` (job `ingress-nginx`, `honor_labels:
    /// false` as a ServiceMonitor has it) with `rules` (a rule file's text,
    /// or empty), and waits until it answers.
    pub fn start(targets: &[Target<'_>], rules: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let mut config =
            String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n");
        if !rules.is_empty() {
            std::fs::write(dir.path().join("rules.yml"), rules).unwrap();
            config.push_str("rule_files: [rules.yml]\n");
        }
        config.push_str("scrape_configs:\n  - job_name: ingress-nginx\n    honor_labels: false\n    static_configs:\n");
        for t in targets {
            let labels: Vec<String> = t.labels.iter().map(|(k, v)| format!("{k}: {v:?}")).collect();
            config.push_str(&format!(
                "      - targets: [{:?}]\n        labels: {{{}}}\n",
                t.address,
                labels.join(", ")
            ));
        }
        let path = dir.path().join("prometheus.yml");
        std::fs::write(&path, &config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(PROMETHEUS)
            .current_dir(dir.path())
            .arg(format!("--config.file={}", path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {PROMETHEUS} (Debian's prometheus package): {e}"));
        let p = Prometheus { child, port, dir };
        assert!(
            wait_until(Duration::from_secs(30), || p.get("/-/ready").is_some()),
            "Prometheus did not start:\n{}",
            p.log()
        );
        p
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The directory it runs in (its config and rule file).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn get(&self, path_and_query: &str) -> Option<Value> {
        let mut resp = crate::agent()
            .get(&format!("http://127.0.0.1:{}{path_and_query}", self.port))
            .call()
            .ok()?;
        if resp.status().as_u16() != 200 {
            return None;
        }
        let body = resp.body_mut().read_to_string().ok()?;
        serde_json::from_str(&body).ok().or(Some(Value::Null))
    }

    fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
        let mut req = crate::agent().get(&format!("http://127.0.0.1:{}/api/v1/{path}", self.port));
        for (k, v) in params {
            req = req.query(*k, *v);
        }
        let mut resp = req.call().map_err(|e| e.to_string())?;
        let body = resp.body_mut().read_to_string().map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!("{path} {params:?}: {body}"));
        }
        Ok(v["data"].clone())
    }

    /// An instant query's result vector (or scalar, as one element).
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.api("query", &[("query", expr)])?;
        match data["resultType"].as_str() {
            Some("vector" | "matrix") => Ok(data["result"].as_array().cloned().unwrap_or_default()),
            _ => Ok(vec![data["result"].clone()]),
        }
    }

    /// Grafana's `label_values(selector, label)`: the label's values on
    /// the series the selector matches.
    pub fn label_values(&self, selector: &str, label: &str) -> Result<Vec<String>, String> {
        let data = self.api(&format!("label/{label}/values"), &[("match[]", selector)])?;
        Ok(data
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default())
    }

    /// The alerts now pending or firing: (name, state).
    pub fn alerts(&self) -> Vec<(String, String)> {
        let Ok(data) = self.api("alerts", &[]) else {
            return Vec::new();
        };
        data["alerts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| {
                        (
                            x["labels"]["alertname"].as_str().unwrap_or("").to_string(),
                            x["state"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the target has been scraped successfully at least `n` times.
    pub fn scraped(&self, n: usize) -> bool {
        self.query("count_over_time(up{job=\"ingress-nginx\"}[5m])")
            .ok()
            .and_then(|r| r.first().and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok()))
            .is_some_and(|c| c >= n as f64)
            && self
                .query("up{job=\"ingress-nginx\"} == 1")
                .is_ok_and(|r| !r.is_empty())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process we started and have not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let stopped = wait_until(Duration::from_secs(5), || matches!(self.child.try_wait(), Ok(Some(_))));
        if !stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `promtool` with `args`, in `dir`: (success, output).
pub fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(PROMTOOL)
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {PROMTOOL}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
