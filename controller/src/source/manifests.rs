//! `--manifests DIR`: the same kinds as the cluster source, read from a
//! directory of multi-document YAML (or JSON) files and re-read on change.
//!
//! A file that fails to parse keeps its last good contents, so saving a
//! half-edited file never takes routes down; the error is logged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use notify::{EventKind, RecursiveMode, Watcher};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::model::values::{is_namespace, is_object_name};
use crate::snapshot::{ConfigMapRefs, Snapshot};

/// Reads a directory into snapshots, remembering each file's last good parse.
pub struct ManifestDir {
    dir: PathBuf,
    /// `namespace/name` of the controller's ConfigMap, and of the
    /// layer-4 ones.
    config_map: ConfigMapRefs,
    /// The text of each file's last successful parse. Text, not parsed
    /// documents: a generic JSON tree of 10,000 Ingresses costs several
    /// times their typed form, and it is needed only when a file breaks.
    last_good: BTreeMap<PathBuf, String>,
}

fn is_manifest(p: &Path) -> bool {
    matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"))
}

/// serde-saphyr's default budget (1,024 documents, 250,000 nodes) guards
/// against hostile input; a manifest directory is the operator's own and
/// may hold tens of thousands of objects in one file.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_documents: 10_000_000,
            max_nodes: 500_000_000,
            max_events: 2_000_000_000,
        },
    }
}

impl ManifestDir {
    pub fn new(dir: PathBuf, config_map: impl Into<ConfigMapRefs>) -> Self {
        ManifestDir {
            dir,
            config_map: config_map.into(),
            last_good: BTreeMap::new(),
        }
    }

    /// Re-reads every file and returns the snapshot, with one message per
    /// problem (unparsable file, unknown kind, invalid object).
    pub fn read(&mut self) -> (Snapshot, Vec<String>) {
        let mut problems = Vec::new();
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| is_manifest(p))
                .collect(),
            Err(e) => {
                problems.push(format!("{}: {e}", self.dir.display()));
                Vec::new()
            }
        };
        files.sort();
        self.last_good.retain(|p, _| files.contains(p));
        let mut snap = Snapshot::default();
        let mut order = 0i64;
        for path in &files {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    problems.push(format!("{}: {e}; keeping its last good contents", path.display()));
                    match self.last_good.get(path) {
                        Some(t) => t.clone(),
                        None => continue,
                    }
                }
            };
            let docs = match parse_text(&text) {
                Ok(docs) => {
                    self.last_good.insert(path.clone(), text);
                    docs
                }
                Err(e) => {
                    problems.push(format!("{}: {e}; keeping its last good contents", path.display()));
                    match self.last_good.get(path).map(|t| parse_text(t)) {
                        Some(Ok(docs)) => docs,
                        _ => continue,
                    }
                }
            };
            // Each document moves into its typed object; no generic tree
            // outlives this loop.
            for doc in docs {
                order += 1;
                if let Err(e) = add_document(&mut snap, doc, order, &self.config_map) {
                    problems.push(format!("{}: {e}", path.display()));
                }
            }
        }
        (snap, problems)
    }
}

/// The documents of one manifest file (`---`-separated YAML, or JSON),
/// without the empty ones.
pub fn parse_text(text: &str) -> Result<Vec<Value>, String> {
    let docs = serde_saphyr::from_multiple_with_options::<Value>(text, yaml_options()).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// Adds one document to `snap`; `order` stands in for the creation time of
/// an Ingress that has none. `refs` names the controller's ConfigMap and
/// the layer-4 ones; other ConfigMaps of the controller's namespace are
/// header sets, and the rest are skipped.
pub fn add_document(snap: &mut Snapshot, mut doc: Value, order: i64, refs: &ConfigMapRefs) -> Result<(), String> {
    let config_map = &refs.config_map;
    // `kind: List` (kubectl's output) holds items, which are not Lists.
    if doc.get("kind").and_then(Value::as_str) == Some("List") {
        for item in doc.get("items").and_then(Value::as_array).cloned().unwrap_or_default() {
            if item.get("kind").and_then(Value::as_str) == Some("List") {
                return Err("a List inside a List is not supported".into());
            }
            add_document(snap, item, order, refs)?;
        }
        return Ok(());
    }
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
    let meta = doc
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| format!("a {kind:?} document has no metadata"))?;
    meta.entry("namespace").or_insert_with(|| Value::from("default"));
    let name = meta.get("name").and_then(Value::as_str).unwrap_or("").to_string();
    // What the apiserver enforces in a cluster: these names end up in
    // backend names, nginx.conf and file names (certificates).
    let namespace = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
    if !is_namespace(namespace) {
        return Err(format!(
            "{kind} {name:?}: namespace {namespace:?} is not a DNS-1123 label"
        ));
    }
    if !is_object_name(&name) {
        return Err(format!("{kind} {name:?}: the name is not a DNS-1123 subdomain"));
    }
    let what = |e: serde_json::Error| format!("{kind} {name}: {e}");
    match kind.as_str() {
        "Ingress" => {
            let mut ing: k8s_openapi::api::networking::v1::Ingress = serde_json::from_value(doc).map_err(what)?;
            // Without a creationTimestamp, file order decides which
            // Ingress is "oldest" in a conflict.
            ing.metadata
                .creation_timestamp
                .get_or_insert_with(|| Time(k8s_openapi::jiff::Timestamp::from_second(order).unwrap_or_default()));
            snap.ingresses.push(Arc::new(ing));
        }
        "IngressClass" => snap.classes.push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
        "Service" => snap.services.push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
        "EndpointSlice" => snap.slices.push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
        "Secret" => {
            let mut secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(doc).map_err(what)?;
            // stringData is write-only in the API; fold it in as the
            // apiserver would.
            if let Some(strings) = secret.string_data.take() {
                let data = secret.data.get_or_insert_with(Default::default);
                for (k, v) in strings {
                    data.insert(k, k8s_openapi::ByteString(v.into_bytes()));
                }
            }
            snap.secrets.push(Arc::new(secret));
        }
        "ConfigMap" => {
            let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(doc).map_err(what)?;
            let is = |r: &(String, String)| {
                cm.metadata.namespace.as_deref() == Some(&*r.0) && cm.metadata.name.as_deref() == Some(&*r.1)
            };
            let ours = is(config_map);
            if refs.tcp_services.as_ref().is_some_and(is) {
                snap.tcp_services = Some(Arc::new(cm));
            } else if refs.udp_services.as_ref().is_some_and(is) {
                snap.udp_services = Some(Arc::new(cm));
            } else if ours {
                snap.config_map = Some(Arc::new(cm));
            } else if cm.metadata.namespace.as_deref() == Some(&*config_map.0) {
                // A header set add-headers or proxy-set-headers may name.
                snap.header_config_maps.push(Arc::new(cm));
            }
        }
        other => {
            return Err(format!(
                "kind {other:?} ({name}) is not one the controller reads; ignored"
            ))
        }
    }
    Ok(())
}

/// Publishes a snapshot now and after every change in the directory. File
/// events are coalesced over `settle`, so an editor's write-rename dance or
/// a `cp *.yaml` gives one snapshot.
pub async fn run(mut dir: ManifestDir, tx: watch::Sender<Arc<Snapshot>>, settle: Duration) -> anyhow::Result<()> {
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        // Reads (ours included) raise access events; only changes count.
        if let Ok(ev) = res {
            if matches!(
                ev.kind,
                EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
            ) {
                let _ = ev_tx.send(());
            }
        }
    })?;
    watcher.watch(&dir.dir, RecursiveMode::NonRecursive)?;
    loop {
        let (snap, problems) = dir.read();
        for p in &problems {
            tracing::warn!(problem = %p, "manifest");
        }
        tracing::info!(
            ingresses = snap.ingresses.len(),
            services = snap.services.len(),
            endpoint_slices = snap.slices.len(),
            "manifests read from {}",
            dir.dir.display()
        );
        if tx.send(Arc::new(snap)).is_err() {
            return Ok(());
        }
        if ev_rx.recv().await.is_none() {
            return Ok(());
        }
        tokio::time::sleep(settle).await;
        while ev_rx.try_recv().is_ok() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(yaml: &str) -> Result<Snapshot, String> {
        let mut snap = Snapshot::default();
        for doc in parse_text(yaml)? {
            add_document(&mut snap, doc, 0, &("ns".to_string(), "cm".to_string()).into())?;
        }
        Ok(snap)
    }

    #[test]
    fn names_the_apiserver_would_refuse_are_refused() {
        let secret = |ns: &str, name: &str| {
            format!("kind: Secret\nmetadata: {{namespace: {ns:?}, name: {name:?}}}\ndata: {{}}\n")
        };
        assert_eq!(add(&secret("team-a", "tls.crt-2")).unwrap().secrets.len(), 1);
        for (ns, name) in [
            ("../../etc", "x"),
            ("Team", "x"),
            ("a\nb", "x"),
            ("team", "../x"),
            ("team", "x{y}"),
            ("team", "X"),
            ("team", ""),
            (&"n".repeat(64), "x"),
        ] {
            let err = add(&secret(ns, name)).unwrap_err();
            assert!(err.contains("DNS-1123"), "{ns:?}/{name:?}: {err}");
        }
        // No namespace means `default`, as kubectl applies it.
        let snap = add("kind: Service\nmetadata: {name: web}\n").unwrap();
        assert_eq!(snap.services[0].metadata.namespace.as_deref(), Some("default"));
    }
}
