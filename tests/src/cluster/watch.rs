//! Watches Pods (`kubectl get pods -w --output-watch-events -o json`) and
//! records, by this process's clock, when each became Ready and when its
//! deletion began: what a rollout's "time from Ready to first request" and
//! "from termination to last request" are measured against.

use std::collections::BTreeMap;
use std::io::BufReader;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;

#[derive(Clone, Debug, Default)]
pub struct PodTimes {
    pub ready: Option<Instant>,
    pub deleting: Option<Instant>,
}

pub struct PodWatch {
    child: Child,
    pods: Arc<Mutex<BTreeMap<String, PodTimes>>>,
}

/// Whether the Pod's Ready condition is True.
pub fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

impl PodWatch {
    pub fn start(kubectl: &std::path::Path, kubeconfig: &std::path::Path, namespace: &str, selector: &str) -> PodWatch {
        let mut child = Command::new(kubectl)
            .env("KUBECONFIG", kubeconfig)
            .args([
                "get",
                "pods",
                "-n",
                namespace,
                "-l",
                selector,
                "-w",
                "--output-watch-events",
                "-o",
                "json",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl get pods -w");
        let out = child.stdout.take().unwrap();
        let pods: Arc<Mutex<BTreeMap<String, PodTimes>>> = Arc::default();
        let record = pods.clone();
        std::thread::spawn(move || {
            let events = serde_json::Deserializer::from_reader(BufReader::new(out)).into_iter::<Value>();
            for ev in events.flatten() {
                let pod = &ev["object"];
                let Some(name) = pod["metadata"]["name"].as_str() else {
                    continue;
                };
                let now = Instant::now();
                let mut map = record.lock().unwrap();
                let t = map.entry(name.to_string()).or_default();
                if t.ready.is_none() && ready(pod) {
                    t.ready = Some(now);
                }
                if t.deleting.is_none() && (!pod["metadata"]["deletionTimestamp"].is_null() || ev["type"] == "DELETED")
                {
                    t.deleting = Some(now);
                }
            }
        });
        PodWatch { child, pods }
    }

    pub fn pods(&self) -> BTreeMap<String, PodTimes> {
        self.pods.lock().unwrap().clone()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
