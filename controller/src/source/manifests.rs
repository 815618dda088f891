//! `--manifests DIR`: the same kinds as the cluster source, read from a
//! directory of multi-document YAML (or JSON) files and re-read on change.
//!
//! A file that fails to parse keeps its last good contents, so saving a
//! half-edited file never takes routes down; the error is logged.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use notify::{EventKind, RecursiveMode, Watcher};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::model::values::{is_namespace, is_object_name};
use crate::snapshot::{ConfigMapRefs, Snapshot, CA_BUNDLE_KEY};

/// Reads a directory into snapshots, remembering each file's objects.
///
/// A file is parsed again only when it changed: the objects of every other
/// file are the same `Arc`s as in the previous snapshot, so the model task
/// sees (by identity, [`crate::snapshot::change`]) that an edit of one
/// application's EndpointSlices changed only those, and a directory of
/// 10,000 Ingresses is not parsed again for it.
pub struct ManifestDir {
    dir: PathBuf,
    /// `namespace/name` of the controller's ConfigMap, and of the
    /// layer-4 ones.
    config_map: ConfigMapRefs,
    /// Each file's objects as last read successfully.
    files: BTreeMap<PathBuf, FileEntry>,
}

/// One file's objects, and what tells whether the file changed since.
struct FileEntry {
    stamp: Stamp,
    /// SHA-256 of the text, for a change the stamp cannot show.
    digest: [u8; 32],
    /// When the text was read.
    read_at: SystemTime,
    /// The order of the document before this file's first (documents are
    /// numbered across files, in file order).
    base: i64,
    /// Top-level documents in the file.
    documents: i64,
    /// The file's objects alone.
    objects: Snapshot,
    /// Ingresses without a creationTimestamp: their index in
    /// `objects.ingresses` and document number in the file. They get
    /// `base + number` as one, so that file order decides which is "oldest".
    stamped: Vec<(usize, i64)>,
}

/// What `stat(2)` says about a file: a new inode (an editor's rename), a
/// new size or a new modification time is a change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Written so shortly before `read_at` that a second write in the same
    /// clock tick (same size, same time) could hide behind it: the text
    /// must be compared (what git calls a racy entry).
    fn racy(&self, read_at: SystemTime) -> bool {
        let modified = std::time::UNIX_EPOCH
            + Duration::new(self.mtime.0.max(0) as u64, self.mtime.1.clamp(0, 999_999_999) as u32);
        match read_at.duration_since(modified) {
            Ok(age) => age < Duration::from_secs(2),
            Err(_) => true,
        }
    }
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
            files: BTreeMap::new(),
        }
    }

    /// Reads what changed in the directory and returns the snapshot, with
    /// one message per problem (unparsable file, unknown kind, invalid
    /// object) of the files read this time.
    pub fn read(&mut self) -> (Snapshot, Vec<String>) {
        self.read_changed(None)
    }

    /// As [`ManifestDir::read`]; when the watcher says which files changed
    /// (`Some`), only those are looked at again: the others are known
    /// unchanged, without a `stat(2)` each.
    pub fn read_changed(&mut self, changed: Option<&BTreeSet<PathBuf>>) -> (Snapshot, Vec<String>) {
        if let Some(changed) = changed {
            return self.assemble(changed);
        }
        let mut problems = Vec::new();
        let mut paths: Vec<PathBuf> = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| is_manifest(p))
                .collect(),
            Err(e) => {
                problems.push(format!("{}: {e}", self.dir.display()));
                Vec::new()
            }
        };
        paths.sort();
        self.files.retain(|p, _| paths.binary_search(p).is_ok());
        let mut base = 0i64;
        for path in &paths {
            self.refresh(path, base, &mut problems);
            base += self.files.get(path).map_or(0, |e| e.documents);
        }
        (self.snapshot(), problems)
    }

    /// The snapshot after the files `changed` (created, written, renamed
    /// or removed) are read again.
    fn assemble(&mut self, changed: &BTreeSet<PathBuf>) -> (Snapshot, Vec<String>) {
        let mut problems = Vec::new();
        // The watcher names files under the directory as it was given;
        // entries are keyed the same way.
        let paths: BTreeSet<PathBuf> = changed
            .iter()
            .filter(|p| is_manifest(p))
            .filter_map(|p| Some(self.dir.join(p.file_name()?)))
            .collect();
        for path in &paths {
            if path.is_file() {
                // A watched write is a change whatever the stamp says.
                if let Some(entry) = self.files.get_mut(path) {
                    entry.read_at = std::time::UNIX_EPOCH;
                }
                self.refresh(path, 0, &mut problems);
            } else {
                self.files.remove(path);
            }
        }
        (self.snapshot(), problems)
    }

    /// Every file's objects, in file order; Ingresses stamped with their
    /// file position get their current one.
    fn snapshot(&mut self) -> Snapshot {
        let mut snap = Snapshot::default();
        let mut base = 0i64;
        for entry in self.files.values_mut() {
            entry.rebase(base);
            base += entry.documents;
            entry.objects.extend_into(&mut snap);
        }
        snap
    }

    /// Parses `path` again if it changed since its entry was made (or has
    /// none). A file that cannot be read or parsed keeps its last good
    /// objects, and is reported once per change.
    fn refresh(&mut self, path: &Path, base: i64, problems: &mut Vec<String>) {
        let stamp = match std::fs::metadata(path) {
            Ok(m) => Stamp::of(&m),
            Err(e) => {
                problems.push(format!("{}: {e}; keeping its last good contents", path.display()));
                return;
            }
        };
        let known = self.files.get(path);
        if known.is_some_and(|k| k.stamp == stamp && !stamp.racy(k.read_at)) {
            return;
        }
        let read_at = SystemTime::now();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("{}: {e}; keeping its last good contents", path.display()));
                return;
            }
        };
        let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        if let Some(entry) = self.files.get_mut(path).filter(|k| k.digest == digest) {
            entry.stamp = stamp;
            entry.read_at = read_at;
            return;
        }
        let docs = match parse_text(&text) {
            Ok(docs) => docs,
            Err(e) => {
                problems.push(format!("{}: {e}; keeping its last good contents", path.display()));
                // Not parsed again (nor reported again) until it changes.
                if let Some(entry) = self.files.get_mut(path) {
                    entry.stamp = stamp;
                    entry.digest = digest;
                    entry.read_at = read_at;
                }
                return;
            }
        };
        drop(text);
        let mut objects = Snapshot::default();
        let mut stamped = Vec::new();
        let documents = docs.len() as i64;
        // Each document moves into its typed object; no generic tree
        // outlives this loop.
        for (i, doc) in docs.into_iter().enumerate() {
            let number = i as i64 + 1;
            let before = objects.ingresses.len();
            match add_document(&mut objects, doc, base + number, &self.config_map) {
                Ok(added) => stamped.extend(
                    (before..objects.ingresses.len())
                        .filter(|_| added)
                        .map(|at| (at, number)),
                ),
                Err(e) => problems.push(format!("{}: {e}", path.display())),
            }
        }
        self.files.insert(
            path.to_path_buf(),
            FileEntry {
                stamp,
                digest,
                read_at,
                base,
                documents,
                objects,
                stamped,
            },
        );
    }
}

impl FileEntry {
    /// Documents of an earlier file came or went: the Ingresses stamped
    /// with their file position get their new one.
    fn rebase(&mut self, base: i64) {
        if self.base == base {
            return;
        }
        for &(at, number) in &self.stamped {
            let mut ing = (*self.objects.ingresses[at]).clone();
            ing.metadata.creation_timestamp = Some(order_time(base + number));
            self.objects.ingresses[at] = Arc::new(ing);
        }
        self.base = base;
    }
}

impl Snapshot {
    /// Adds these objects (one file's) to `snap`; for the single objects
    /// (the ConfigMaps picked by name), a later file's wins.
    fn extend_into(&self, snap: &mut Snapshot) {
        snap.ingresses.extend(self.ingresses.iter().cloned());
        snap.classes.extend(self.classes.iter().cloned());
        snap.services.extend(self.services.iter().cloned());
        snap.slices.extend(self.slices.iter().cloned());
        snap.secrets.extend(self.secrets.iter().cloned());
        snap.header_config_maps.extend(self.header_config_maps.iter().cloned());
        snap.gateway_classes.extend(self.gateway_classes.iter().cloned());
        snap.gateways.extend(self.gateways.iter().cloned());
        snap.http_routes.extend(self.http_routes.iter().cloned());
        snap.grpc_routes.extend(self.grpc_routes.iter().cloned());
        snap.tcp_routes.extend(self.tcp_routes.iter().cloned());
        snap.tls_routes.extend(self.tls_routes.iter().cloned());
        snap.udp_routes.extend(self.udp_routes.iter().cloned());
        snap.listener_sets.extend(self.listener_sets.iter().cloned());
        snap.reference_grants.extend(self.reference_grants.iter().cloned());
        snap.namespaces.extend(self.namespaces.iter().cloned());
        snap.ca_bundles.extend(self.ca_bundles.iter().cloned());
        snap.cluster_trust_bundles
            .extend(self.cluster_trust_bundles.iter().cloned());
        snap.backend_tls_policies
            .extend(self.backend_tls_policies.iter().cloned());
        for (from, to) in [
            (&self.config_map, &mut snap.config_map),
            (&self.tcp_services, &mut snap.tcp_services),
            (&self.udp_services, &mut snap.udp_services),
        ] {
            if from.is_some() {
                to.clone_from(from);
            }
        }
    }
}

/// The creationTimestamp standing in for file order.
fn order_time(order: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(order).unwrap_or_default())
}

/// The documents of one manifest file (`---`-separated YAML, or JSON),
/// without the empty ones.
///
/// A large file (a `kubectl get -A -o yaml` of a big cluster, the 6.5 MB of
/// 10,000 Ingresses) is split at its document markers and the parts parsed
/// on every core: YAML parsing was most of a first configuration's time.
/// A part's error is reported from a parse of the whole file, so its line
/// numbers are the file's.
pub fn parse_text(text: &str) -> Result<Vec<Value>, String> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let parts = split_documents(text, threads);
    if parts.len() < 2 {
        return parse_documents(text);
    }
    let parsed: Vec<Result<Vec<Value>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .iter()
            .map(|part| scope.spawn(move || parse_documents(part)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("the YAML parser panicked".into())))
            .collect()
    });
    let mut docs = Vec::new();
    for part in parsed {
        match part {
            Ok(part) => docs.extend(part),
            Err(_) => return parse_documents(text),
        }
    }
    Ok(docs)
}

fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    let docs = serde_saphyr::from_multiple_with_options::<Value>(text, yaml_options()).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// Below this size a file is parsed on one thread.
const PARALLEL_PARSE_BYTES: usize = 256 * 1024;

/// Splits YAML text into at most `parts` runs of whole documents, each
/// starting at a `---` line. A `---` at the start of a line followed by a
/// blank or the line's end ends any block or quoted scalar (YAML 1.2,
/// c-forbidden), so such a line always starts a document. Text with a
/// directive (`%YAML`, `%TAG`: it belongs to the document after it) is not
/// split, nor is a small one.
fn split_documents(text: &str, parts: usize) -> Vec<&str> {
    if parts < 2 || text.len() < PARALLEL_PARSE_BYTES || text.starts_with('%') || text.contains("\n%") {
        return vec![text];
    }
    let target = text.len() / parts;
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    let mut at = target;
    while out.len() + 1 < parts && at < text.len() {
        let Some(found) = next_marker(text, at) else { break };
        if found > start {
            out.push(&text[start..found]);
            start = found;
        }
        at = (found + target).max(found + 1);
    }
    out.push(&text[start..]);
    out
}

/// The byte offset of the first `---` document marker line at or after `from`.
fn next_marker(text: &str, from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(p) = text.get(i..)?.find("\n---") {
        let line = i + p + 1;
        match text.as_bytes().get(line + 3) {
            None | Some(b' ' | b'\t' | b'\n' | b'\r') => return Some(line),
            _ => i = line,
        }
    }
    None
}

/// Adds one document to `snap`; `order` stands in for the creation time of
/// an Ingress that has none. `refs` names the controller's ConfigMap and
/// the layer-4 ones; other ConfigMaps of the controller's namespace are
/// header sets, and the rest are skipped.
///
/// Returns whether the Ingresses it added got `order` as their
/// creationTimestamp (they had none).
pub fn add_document(snap: &mut Snapshot, mut doc: Value, order: i64, refs: &ConfigMapRefs) -> Result<bool, String> {
    let config_map = &refs.config_map;
    // `kind: List` (kubectl's output) holds items, which are not Lists.
    if doc.get("kind").and_then(Value::as_str) == Some("List") {
        let mut stamped = false;
        for item in doc.get("items").and_then(Value::as_array).cloned().unwrap_or_default() {
            if item.get("kind").and_then(Value::as_str) == Some("List") {
                return Err("a List inside a List is not supported".into());
            }
            stamped |= add_document(snap, item, order, refs)?;
        }
        return Ok(stamped);
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
            let stamped = ing.metadata.creation_timestamp.is_none();
            ing.metadata.creation_timestamp.get_or_insert_with(|| order_time(order));
            snap.ingresses.push(Arc::new(ing));
            return Ok(stamped);
        }
        "IngressClass" => snap.classes.push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
        "Service" => snap.services.push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
        "Namespace" => snap
            .namespaces
            .push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
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
            // Any ConfigMap with a `ca.crt` may be a Gateway's client CA
            // bundle (`spec.tls.frontend`), whatever else it is.
            if cm.data.as_ref().is_some_and(|d| d.contains_key(CA_BUNDLE_KEY)) {
                snap.ca_bundles.push(Arc::new(cm.clone()));
            }
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
        "GatewayClass" | "Gateway" | "ListenerSet" | "HTTPRoute" | "GRPCRoute" | "TCPRoute" | "TLSRoute"
        | "UDPRoute" | "ReferenceGrant" | "BackendTLSPolicy"
            if doc
                .get("apiVersion")
                .and_then(Value::as_str)
                .is_some_and(|v| v.starts_with("gateway.networking.k8s.io/")) =>
        {
            // Without a creationTimestamp, file order decides which route
            // is older (route precedence), as for Ingresses.
            let stamp = |doc: &mut Value| {
                if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
                    if !meta.contains_key("creationTimestamp") {
                        let t = serde_json::to_value(order_time(order)).unwrap_or_default();
                        meta.insert("creationTimestamp".into(), t);
                    }
                }
            };
            // Stamped with the document's position once; unlike an
            // Ingress's, the stamp is not moved when earlier files change
            // (it only orders routes that tie on everything else).
            stamp(&mut doc);
            match kind.as_str() {
                "GatewayClass" => snap
                    .gateway_classes
                    .push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
                "Gateway" => snap.gateways.push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
                "HTTPRoute" => snap
                    .http_routes
                    .push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
                "GRPCRoute" => snap
                    .grpc_routes
                    .push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
                "TCPRoute" => snap
                    .tcp_routes
                    .push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
                "TLSRoute" => snap
                    .tls_routes
                    .push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
                "UDPRoute" => snap
                    .udp_routes
                    .push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
                "ListenerSet" => snap
                    .listener_sets
                    .push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
                "BackendTLSPolicy" => snap
                    .backend_tls_policies
                    .push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
                _ => snap
                    .reference_grants
                    .push(Arc::new(serde_json::from_value(doc).map_err(what)?)),
            }
        }
        "ClusterTrustBundle"
            if doc
                .get("apiVersion")
                .and_then(Value::as_str)
                .is_some_and(|v| v.starts_with("certificates.k8s.io/")) =>
        {
            snap.cluster_trust_bundles
                .push(Arc::new(serde_json::from_value(doc).map_err(what)?));
        }
        other => {
            return Err(format!(
                "kind {other:?} ({name}) is not one the controller reads; ignored"
            ))
        }
    }
    Ok(false)
}

/// [`run`] as a task of the current runtime (see
/// [`crate::source::cluster::spawn`] for why the library spawns it).
pub fn spawn(dir: ManifestDir, tx: watch::Sender<Arc<Snapshot>>, settle: Duration) -> JoinHandle<anyhow::Result<()>> {
    tokio::spawn(run(dir, tx, settle))
}

/// Publishes a snapshot now and after every change in the directory. File
/// events are coalesced over `settle`, so an editor's write-rename dance or
/// a `cp *.yaml` gives one snapshot.
pub async fn run(mut dir: ManifestDir, tx: watch::Sender<Arc<Snapshot>>, settle: Duration) -> anyhow::Result<()> {
    // The paths each change names; `None` when the watcher lost events
    // (its queue overflowed) and the whole directory must be looked at.
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<Option<Vec<PathBuf>>>();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
        // Reads (ours included) raise access events; only changes count.
        Ok(ev) if ev.need_rescan() => {
            let _ = ev_tx.send(None);
        }
        Ok(ev) => {
            if matches!(
                ev.kind,
                EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
            ) {
                let _ = ev_tx.send(Some(ev.paths));
            }
        }
        Err(_) => {
            let _ = ev_tx.send(None);
        }
    })?;
    watcher.watch(&dir.dir, RecursiveMode::NonRecursive)?;
    // The first read looks at every file.
    let mut changed: Option<BTreeSet<PathBuf>> = None;
    loop {
        // Parsing a large file must not hold a runtime thread.
        let (back, (snap, problems)) = tokio::task::spawn_blocking(move || {
            let read = dir.read_changed(changed.as_ref());
            (dir, read)
        })
        .await?;
        dir = back;
        for p in &problems {
            tracing::warn!(problem = %p, "manifest");
        }
        tracing::debug!(
            ingresses = snap.ingresses.len(),
            services = snap.services.len(),
            endpoint_slices = snap.slices.len(),
            "manifests read from {}",
            dir.dir.display()
        );
        if tx.send(Arc::new(snap)).is_err() {
            return Ok(());
        }
        let Some(first) = ev_rx.recv().await else {
            return Ok(());
        };
        tokio::time::sleep(settle).await;
        let mut paths = first.map(BTreeSet::from_iter);
        while let Ok(more) = ev_rx.try_recv() {
            paths = match (paths, more) {
                (Some(mut p), Some(m)) => {
                    p.extend(m);
                    Some(p)
                }
                _ => None,
            };
        }
        // A change the file names cannot show (a ConfigMap volume swaps
        // its `..data` symlink; a directory came or went) looks at every
        // file: a stat each, and a parse only of those that changed.
        changed = paths.filter(|p| !p.iter().any(|p| needs_full_scan(p)));
    }
}

/// Whether an event on `path` may have changed manifests other than
/// `path` itself: Kubernetes' atomic writer (ConfigMap and Secret volumes)
/// renames `..data`, whose target every manifest symlink goes through;
/// and a path that is now a directory or a symlink is not one manifest.
/// Other names that are not manifests (an editor's `.x.yaml.swp`, a
/// `.x.yaml.tmp` renamed over `x.yaml`) change nothing by themselves.
fn needs_full_scan(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.starts_with("..") {
        return true;
    }
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir() || m.file_type().is_symlink())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Enough documents to be split: each a ConfigMap whose block scalar
    /// holds lines that look like markers but are indented.
    fn many_documents(n: usize) -> String {
        let mut text = String::from("# leading comment\n");
        for i in 0..n {
            text.push_str(&format!(
                "--- # document {i}\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c{i}\ndata:\n  script: |\n    ---\n    --- not a marker\n    line {i}\n"
            ));
        }
        text
    }

    #[test]
    fn a_split_parse_gives_the_documents_of_a_whole_parse() {
        let text = many_documents(3_000);
        assert!(text.len() > PARALLEL_PARSE_BYTES);
        let parts = split_documents(&text, 4);
        assert_eq!(parts.len(), 4);
        assert_eq!(parts.concat(), text);
        for part in &parts[1..] {
            assert!(part.starts_with("--- # document"), "{}", &part[..40]);
        }
        let whole = parse_documents(&text).unwrap();
        assert_eq!(whole.len(), 3_000);
        assert_eq!(parse_text(&text).unwrap(), whole);
        assert_eq!(whole[7]["data"]["script"], "---\n--- not a marker\nline 7\n");
    }

    #[test]
    fn small_files_and_directives_are_not_split() {
        assert_eq!(split_documents(&many_documents(3), 2).len(), 1);
        let directive = format!("%YAML 1.2\n{}", many_documents(3_000));
        assert_eq!(split_documents(&directive, 2).len(), 1);
        // Markers followed by other text (`---x`) do not start a document.
        assert_eq!(next_marker("a: 1\n---x\n--- \nb: 2\n", 0), Some(10));
        assert_eq!(next_marker("a: 1\n---", 0), Some(5));
        assert_eq!(next_marker("a: 1\n  ---\n", 0), None);
    }

    #[test]
    fn an_error_in_a_split_file_is_reported_with_the_files_line_numbers() {
        let mut text = many_documents(3_000);
        text.push_str("---\nkind: [unclosed\n");
        let whole = parse_documents(&text).unwrap_err();
        assert_eq!(parse_text(&text).unwrap_err(), whole);
    }

    fn add(yaml: &str) -> Result<Snapshot, String> {
        let mut snap = Snapshot::default();
        for doc in parse_text(yaml)? {
            add_document(&mut snap, doc, 0, &("ns".to_string(), "cm".to_string()).into())?;
        }
        Ok(snap)
    }

    #[test]
    fn a_volume_swap_or_a_symlink_rescans_and_an_editor_temp_file_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, "").unwrap();
        std::os::unix::fs::symlink(&file, dir.path().join("b.yaml")).unwrap();
        assert!(!needs_full_scan(&file));
        assert!(needs_full_scan(&dir.path().join("b.yaml")));
        assert!(needs_full_scan(&dir.path().join("..data")));
        assert!(needs_full_scan(&dir.path().join("..2026_11_27_16_00_00.123")));
        assert!(needs_full_scan(dir.path()));
        assert!(!needs_full_scan(&dir.path().join(".a.yaml.tmp")));
        assert!(!needs_full_scan(&dir.path().join(".a.yaml.swp")));
    }

    #[test]
    fn only_changed_files_are_parsed_again() {
        let dir = tempfile::tempdir().unwrap();
        let svc = |name: &str, port: u16| {
            format!("kind: Service\nmetadata: {{name: {name}}}\nspec: {{ports: [{{port: {port}}}]}}\n")
        };
        std::fs::write(dir.path().join("a.yaml"), svc("a", 80)).unwrap();
        std::fs::write(dir.path().join("b.yaml"), svc("b", 80)).unwrap();
        let mut m = ManifestDir::new(dir.path().to_path_buf(), ("ns".to_string(), "cm".to_string()));
        let (first, problems) = m.read();
        assert!(problems.is_empty(), "{problems:?}");
        // b.yaml replaced: a's object is the same one, b's is new.
        let tmp = dir.path().join(".b.yaml.tmp");
        std::fs::write(&tmp, svc("b", 81)).unwrap();
        std::fs::rename(&tmp, dir.path().join("b.yaml")).unwrap();
        let changed: BTreeSet<PathBuf> = [dir.path().join("b.yaml"), tmp].into();
        let (second, _) = m.read_changed(Some(&changed));
        assert!(Arc::ptr_eq(&first.services[0], &second.services[0]));
        assert!(!Arc::ptr_eq(&first.services[1], &second.services[1]));
        // A full read of an unchanged directory parses nothing again.
        let (third, _) = m.read();
        assert!(Arc::ptr_eq(&second.services[1], &third.services[1]));
        // A file removed.
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        let changed: BTreeSet<PathBuf> = [dir.path().join("a.yaml")].into();
        let (fourth, _) = m.read_changed(Some(&changed));
        assert_eq!(fourth.services.len(), 1);
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
