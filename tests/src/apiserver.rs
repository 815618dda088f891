//! A protocol-level fake Kubernetes API server, for kube's real client and
//! watchers over loopback HTTP.
//!
//! It keeps one resourceVersion counter and an event history, like etcd
//! behind the real apiserver, and serves:
//! - LIST with `resourceVersion` in the list metadata, labelSelector and
//!   the field selectors the controller uses (`metadata.name`,
//!   `metadata.namespace`, `type`);
//! - chunked WATCH that replays history after the requested rv, sends
//!   bookmarks when idle (with `allowWatchBookmarks`), and answers an rv
//!   older than the last compaction with the real 410 `Expired` event;
//! - create (POST), update (PUT) and merge-patch (PATCH), with 409 on a
//!   stale `metadata.resourceVersion` or an existing name, and DELETE
//!   (events.k8s.io Events too, so the controller's events can be read);
//! - injected faults: cut every open watch, fail the next N requests with
//!   500, delay every response.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The kinds served: (group/version path, plural, kind, namespaced).
const RESOURCES: &[(&str, &str, &str, bool)] = &[
    ("/apis/networking.k8s.io/v1", "ingresses", "Ingress", true),
    ("/apis/networking.k8s.io/v1", "ingressclasses", "IngressClass", false),
    ("/api/v1", "services", "Service", true),
    ("/api/v1", "secrets", "Secret", true),
    ("/api/v1", "configmaps", "ConfigMap", true),
    ("/apis/discovery.k8s.io/v1", "endpointslices", "EndpointSlice", true),
    ("/apis/events.k8s.io/v1", "events", "Event", true),
];

type Key = (String, String, String); // plural, namespace ("" if cluster-scoped), name

struct Event {
    rv: u64,
    plural: String,
    /// `{"type": ..., "object": ...}`, as sent on the wire.
    object: Value,
}

#[derive(Default)]
struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Event>,
    /// Watches from an rv below this get 410 Expired.
    compacted: u64,
    /// Bumped to cut every open watch.
    epoch: u64,
}

#[derive(Default)]
struct Faults {
    fail_next: u32,
    delay: Duration,
}

#[derive(Default)]
struct State {
    inner: Mutex<Inner>,
    changed: Condvar,
    faults: Mutex<Faults>,
    /// Counters a test can assert on.
    lists: AtomicU64,
    watches: AtomicU64,
    expired_sent: AtomicU64,
}

pub struct FakeApiServer {
    pub port: u16,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What a request gets back.
enum Reply {
    Json(u16, Value),
    Watch(WatchStream),
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn resource(gv: &str, plural: &str) -> Option<(&'static str, bool)> {
    RESOURCES
        .iter()
        .find(|r| r.0 == gv && r.1 == plural)
        .map(|r| (r.2, r.3))
}

/// A parsed request path.
struct Target {
    gv: String,
    plural: String,
    kind: &'static str,
    namespace: Option<String>,
    name: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (gv, rest) = match *segs.first()? {
        "api" => (format!("/api/{}", segs.get(1)?), &segs[2..]),
        "apis" => (format!("/apis/{}/{}", segs.get(1)?, segs.get(2)?), &segs[3..]),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail),
        _ => (None, rest),
    };
    let (plural, name) = match rest {
        [plural] => (plural.to_string(), None),
        [plural, name] => (plural.to_string(), Some(name.to_string())),
        _ => return None,
    };
    let (kind, _) = resource(&gv, &plural)?;
    Some(Target {
        gv,
        plural,
        kind,
        namespace,
        name,
    })
}

fn query(url: &str) -> BTreeMap<String, String> {
    let q = url.split_once('?').map(|(_, q)| q).unwrap_or("");
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_string(), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `labelSelector`: `k`, `!k`, `k=v`, `k==v`, `k!=v`, comma-separated.
fn labels_match(obj: &Value, selector: &str) -> bool {
    let labels = &obj["metadata"]["labels"];
    selector
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| {
            if let Some((k, v)) = term.split_once("!=") {
                labels[k].as_str() != Some(v)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                labels[k].as_str() == Some(v)
            } else if let Some(k) = term.strip_prefix('!') {
                labels.get(k).is_none()
            } else {
                labels.get(term).is_some()
            }
        })
}

/// `fieldSelector`: `metadata.name`, `metadata.namespace` and `type`.
fn fields_match(obj: &Value, selector: &str) -> bool {
    selector
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| {
            let (field, want, negate) = match term.split_once("!=") {
                Some((f, v)) => (f, v, true),
                None => match term.split_once("==").or_else(|| term.split_once('=')) {
                    Some((f, v)) => (f, v, false),
                    None => return false,
                },
            };
            let have = match field {
                "metadata.name" => obj["metadata"]["name"].as_str(),
                "metadata.namespace" => obj["metadata"]["namespace"].as_str(),
                "type" => obj["type"].as_str(),
                _ => return false,
            };
            (have == Some(want)) != negate
        })
}

struct Filter {
    plural: String,
    namespace: Option<String>,
    labels: String,
    fields: String,
}

impl Filter {
    fn matches(&self, plural: &str, obj: &Value) -> bool {
        plural == self.plural
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| obj["metadata"]["namespace"].as_str() == Some(ns))
            && labels_match(obj, &self.labels)
            && fields_match(obj, &self.fields)
    }
}

/// The body of one WATCH response: events as they happen, one JSON object
/// per line, until the watch is cut, times out or the rv is too old.
struct WatchStream {
    state: Arc<State>,
    filter: Filter,
    gv: String,
    kind: &'static str,
    last_rv: u64,
    epoch: u64,
    deadline: Instant,
    bookmarks: bool,
    pending: Vec<u8>,
    done: bool,
    initial: Option<Vec<Value>>,
}

impl WatchStream {
    fn line(&mut self, ty: &str, object: &Value) {
        let mut line = serde_json::to_vec(&json!({"type": ty, "object": object})).unwrap();
        line.push(b'\n');
        self.pending.extend_from_slice(&line);
    }

    fn fill(&mut self) {
        if let Some(initial) = self.initial.take() {
            for obj in initial {
                self.line("ADDED", &obj);
            }
            return;
        }
        let mut inner = self.state.inner.lock().unwrap();
        loop {
            if inner.epoch != self.epoch || Instant::now() >= self.deadline {
                self.done = true;
                return;
            }
            let fresh: Vec<(u64, String, Value)> = inner
                .history
                .iter()
                .filter(|e| e.rv > self.last_rv && self.filter.matches(&e.plural, &e.object["object"]))
                .map(|e| {
                    (
                        e.rv,
                        e.object["type"].as_str().unwrap_or("MODIFIED").to_string(),
                        e.object["object"].clone(),
                    )
                })
                .collect();
            let newest = inner.rv;
            if !fresh.is_empty() {
                drop(inner);
                for (rv, ty, obj) in fresh {
                    self.last_rv = rv;
                    self.line(&ty, &obj);
                }
                self.last_rv = self.last_rv.max(newest);
                return;
            }
            let (guard, timeout) = self
                .state
                .changed
                .wait_timeout(inner, Duration::from_millis(500))
                .unwrap();
            inner = guard;
            if timeout.timed_out() && self.bookmarks {
                let rv = inner.rv;
                drop(inner);
                self.last_rv = rv;
                let bookmark = json!({"kind": self.kind, "apiVersion": api_version(&self.gv),
                                       "metadata": {"resourceVersion": rv.to_string()}});
                self.line("BOOKMARK", &bookmark);
                return;
            }
        }
    }
}

impl Read for WatchStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pending.is_empty() && !self.done {
            self.fill();
        }
        let n = self.pending.len().min(buf.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        Ok(n)
    }
}

fn api_version(gv: &str) -> String {
    gv.trim_start_matches("/apis/").trim_start_matches("/api/").to_string()
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        _ => "Internal Server Error",
    }
}

/// Serves one connection: HTTP/1.1 keep-alive, Content-Length bodies;
/// watch responses are chunked and close the connection when they end.
/// (A thread per connection: kube keeps idle pooled connections open, and
/// a bounded pool would starve new ones.)
fn serve_connection(state: Arc<State>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, url) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let body = String::from_utf8_lossy(&body).into_owned();
        match handle(&state, &method, &url, &body) {
            Reply::Json(code, value) => {
                let bytes = serde_json::to_vec(&value).unwrap();
                let head = format!(
                    "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    reason(code),
                    bytes.len()
                );
                if out
                    .write_all(head.as_bytes())
                    .and_then(|()| out.write_all(&bytes))
                    .is_err()
                {
                    return;
                }
            }
            Reply::Watch(mut watch) => {
                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
                if out.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let mut buf = [0u8; 16384];
                loop {
                    let n = watch.read(&mut buf).unwrap_or(0);
                    if n == 0 {
                        let _ = out.write_all(b"0\r\n\r\n");
                        return;
                    }
                    let chunk = format!("{n:x}\r\n");
                    let ok = out
                        .write_all(chunk.as_bytes())
                        .and_then(|()| out.write_all(&buf[..n]))
                        .and_then(|()| out.write_all(b"\r\n"));
                    if ok.and_then(|()| out.flush()).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

impl State {
    /// Stores `obj` under a new rv and records the event.
    fn commit(&self, inner: &mut Inner, plural: &str, kind: &'static str, gv: &str, mut obj: Value, ty: &str) -> Value {
        inner.rv += 1;
        let rv = inner.rv;
        obj["apiVersion"] = json!(api_version(gv));
        obj["kind"] = json!(kind);
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{rv}"));
        }
        if obj["metadata"]["creationTimestamp"].is_null() {
            obj["metadata"]["creationTimestamp"] =
                json!(format!("2026-01-01T00:{:02}:{:02}Z", (rv / 60) % 60, rv % 60));
        }
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("").to_string();
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        let key = (plural.to_string(), ns, name);
        if ty == "DELETED" {
            inner.objects.remove(&key);
        } else {
            inner.objects.insert(key, obj.clone());
        }
        inner.history.push(Event {
            rv,
            plural: plural.to_string(),
            object: json!({"type": ty, "object": obj.clone()}),
        });
        self.changed.notify_all();
        obj
    }
}

impl FakeApiServer {
    pub fn start() -> FakeApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    if let Ok(conn) = conn {
                        let state = state.clone();
                        std::thread::spawn(move || serve_connection(state, conn));
                    }
                }
            })
        };
        FakeApiServer {
            port,
            state,
            stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A kubeconfig for this server, with a bearer token (which it ignores).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{}\"}}\nusers:\n- name: test\n  user: {{token: test-token}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: test}}\ncurrent-context: fake\n",
            self.url()
        )
    }

    /// Creates or replaces an object (any served kind), as `kubectl apply`.
    pub fn apply(&self, obj: Value) -> Value {
        let kind = obj["kind"].as_str().expect("kind");
        let (gv, plural, kind, namespaced) = *RESOURCES.iter().find(|r| r.2 == kind).expect("a served kind");
        let mut obj = obj;
        if namespaced && obj["metadata"]["namespace"].is_null() {
            obj["metadata"]["namespace"] = json!("default");
        }
        let mut inner = self.state.inner.lock().unwrap();
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("").to_string();
        let key = (
            plural.to_string(),
            ns,
            obj["metadata"]["name"].as_str().unwrap_or("").to_string(),
        );
        let ty = if inner.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        if let Some(old) = inner.objects.get(&key) {
            obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
            obj["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
        }
        self.state.commit(&mut inner, plural, kind, gv, obj, ty)
    }

    /// Ends every open watch (the client sees a clean end of stream).
    pub fn cut_watches(&self) {
        self.state.inner.lock().unwrap().epoch += 1;
        self.state.changed.notify_all();
    }

    /// Forgets history up to now: a watch from an older rv gets 410.
    pub fn compact(&self) {
        let mut inner = self.state.inner.lock().unwrap();
        inner.compacted = inner.rv;
        inner.history.clear();
    }

    /// The next `n` requests fail with 500.
    pub fn fail_next(&self, n: u32) {
        self.state.faults.lock().unwrap().fail_next = n;
    }

    /// Every response waits this long first.
    pub fn set_delay(&self, d: Duration) {
        self.state.faults.lock().unwrap().delay = d;
    }

    /// Every stored object of `kind`.
    pub fn objects(&self, kind: &str) -> Vec<Value> {
        let plural = RESOURCES.iter().find(|r| r.2 == kind).expect("a served kind").1;
        let inner = self.state.inner.lock().unwrap();
        inner
            .objects
            .iter()
            .filter(|((p, _, _), _)| p == plural)
            .map(|(_, o)| o.clone())
            .collect()
    }

    pub fn lists(&self) -> u64 {
        self.state.lists.load(Ordering::Relaxed)
    }

    pub fn watches(&self) -> u64 {
        self.state.watches.load(Ordering::Relaxed)
    }

    pub fn expired_sent(&self) -> u64 {
        self.state.expired_sent.load(Ordering::Relaxed)
    }

    pub fn resource_version(&self) -> u64 {
        self.state.inner.lock().unwrap().rv
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.cut_watches();
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn handle(state: &Arc<State>, method: &str, url: &str, body: &str) -> Reply {
    let delay = {
        let mut f = state.faults.lock().unwrap();
        if f.fail_next > 0 {
            f.fail_next -= 1;
            return Reply::Json(500, status(500, "InternalError", "injected fault"));
        }
        f.delay
    };
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    let path = url.split('?').next().unwrap_or("").to_string();
    let q = query(url);
    let Some(t) = parse_path(&path) else {
        return Reply::Json(
            404,
            status(404, "NotFound", &format!("the server could not find {path}")),
        );
    };
    let filter = Filter {
        plural: t.plural.clone(),
        namespace: t.namespace.clone(),
        labels: q.get("labelSelector").cloned().unwrap_or_default(),
        fields: q.get("fieldSelector").cloned().unwrap_or_default(),
    };
    match (method, &t.name) {
        ("GET", None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => watch(state, t, filter, &q),
        ("GET", None) => {
            state.lists.fetch_add(1, Ordering::Relaxed);
            let inner = state.inner.lock().unwrap();
            let items: Vec<Value> = inner
                .objects
                .iter()
                .filter(|((p, _, _), o)| filter.matches(p, o))
                .map(|(_, o)| o.clone())
                .collect();
            let list = json!({"kind": format!("{}List", t.kind), "apiVersion": api_version(&t.gv),
                              "metadata": {"resourceVersion": inner.rv.to_string()}, "items": items});
            drop(inner);
            Reply::Json(200, list)
        }
        ("GET", Some(name)) => {
            let key = (t.plural.clone(), t.namespace.clone().unwrap_or_default(), name.clone());
            match state.inner.lock().unwrap().objects.get(&key).cloned() {
                Some(obj) => Reply::Json(200, obj),
                None => Reply::Json(
                    404,
                    status(404, "NotFound", &format!("{} \"{name}\" not found", t.plural)),
                ),
            }
        }
        ("POST", None) => {
            let mut obj: Value = match serde_json::from_str(body) {
                Ok(v) => v,
                Err(e) => return Reply::Json(400, status(400, "BadRequest", &e.to_string())),
            };
            if let Some(ns) = &t.namespace {
                obj["metadata"]["namespace"] = json!(ns);
            }
            let mut inner = state.inner.lock().unwrap();
            let key = (
                t.plural.clone(),
                t.namespace.clone().unwrap_or_default(),
                obj["metadata"]["name"].as_str().unwrap_or("").to_string(),
            );
            if inner.objects.contains_key(&key) {
                drop(inner);
                return Reply::Json(
                    409,
                    status(
                        409,
                        "AlreadyExists",
                        &format!("{} \"{}\" already exists", t.plural, key.2),
                    ),
                );
            }
            let stored = state.commit(&mut inner, &t.plural, t.kind, &t.gv, obj, "ADDED");
            drop(inner);
            Reply::Json(201, stored)
        }
        ("PUT" | "PATCH", Some(name)) => {
            let patch: Value = match serde_json::from_str(body) {
                Ok(v) => v,
                Err(e) => return Reply::Json(400, status(400, "BadRequest", &e.to_string())),
            };
            let mut inner = state.inner.lock().unwrap();
            let key = (t.plural.clone(), t.namespace.clone().unwrap_or_default(), name.clone());
            let Some(current) = inner.objects.get(&key).cloned() else {
                drop(inner);
                return Reply::Json(
                    404,
                    status(404, "NotFound", &format!("{} \"{name}\" not found", t.plural)),
                );
            };
            let sent_rv = patch["metadata"]["resourceVersion"].as_str();
            if sent_rv.is_some_and(|rv| Some(rv) != current["metadata"]["resourceVersion"].as_str()) {
                drop(inner);
                let msg = format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                    t.plural
                );
                return Reply::Json(409, status(409, "Conflict", &msg));
            }
            let mut next = if method == "PUT" {
                patch.clone()
            } else {
                current.clone()
            };
            if method == "PATCH" {
                merge_patch(&mut next, &patch);
            }
            next["metadata"]["uid"] = current["metadata"]["uid"].clone();
            next["metadata"]["creationTimestamp"] = current["metadata"]["creationTimestamp"].clone();
            next["metadata"]["namespace"] = current["metadata"]["namespace"].clone();
            let stored = state.commit(&mut inner, &t.plural, t.kind, &t.gv, next, "MODIFIED");
            drop(inner);
            Reply::Json(200, stored)
        }
        ("DELETE", Some(name)) => {
            let mut inner = state.inner.lock().unwrap();
            let key = (t.plural.clone(), t.namespace.clone().unwrap_or_default(), name.clone());
            match inner.objects.get(&key).cloned() {
                Some(obj) => {
                    let gone = state.commit(&mut inner, &t.plural, t.kind, &t.gv, obj, "DELETED");
                    drop(inner);
                    Reply::Json(200, gone)
                }
                None => {
                    drop(inner);
                    Reply::Json(
                        404,
                        status(404, "NotFound", &format!("{} \"{name}\" not found", t.plural)),
                    )
                }
            }
        }
        _ => Reply::Json(405, status(405, "MethodNotAllowed", "method not allowed")),
    }
}

fn watch(state: &Arc<State>, t: Target, filter: Filter, q: &BTreeMap<String, String>) -> Reply {
    state.watches.fetch_add(1, Ordering::Relaxed);
    let timeout = q.get("timeoutSeconds").and_then(|s| s.parse().ok()).unwrap_or(290u64);
    let inner = state.inner.lock().unwrap();
    let requested = q.get("resourceVersion").and_then(|s| s.parse::<u64>().ok());
    let mut stream = WatchStream {
        state: state.clone(),
        gv: t.gv.clone(),
        kind: t.kind,
        last_rv: requested.unwrap_or(inner.rv),
        epoch: inner.epoch,
        deadline: Instant::now() + Duration::from_secs(timeout),
        bookmarks: q.get("allowWatchBookmarks").is_some_and(|b| b == "true"),
        pending: Vec::new(),
        done: false,
        initial: None,
        filter,
    };
    match requested {
        // "0" or absent: start from the current state, as a synthetic
        // ADDED per object (the apiserver's "any" semantics).
        None | Some(0) => {
            stream.initial = Some(
                inner
                    .objects
                    .iter()
                    .filter(|((p, _, _), o)| stream.filter.matches(p, o))
                    .map(|(_, o)| o.clone())
                    .collect(),
            );
        }
        Some(rv) if rv < inner.compacted => {
            state.expired_sent.fetch_add(1, Ordering::Relaxed);
            let msg = format!("too old resource version: {rv} ({})", inner.compacted);
            let gone = json!({"type": "ERROR", "object": status(410, "Expired", &msg)});
            stream.pending = serde_json::to_vec(&gone).unwrap();
            stream.pending.push(b'\n');
            stream.done = true;
        }
        Some(_) => {}
    }
    drop(inner);
    Reply::Watch(stream)
}

impl crate::controller::Cluster for FakeApiServer {
    fn apply_object(&self, obj: Value) {
        FakeApiServer::apply(self, obj);
    }

    fn delete(&self, kind: &str, namespace: &str, name: &str) {
        let (gv, plural, kind, _) = *RESOURCES.iter().find(|r| r.2 == kind).expect("a served kind");
        let mut inner = self.state.inner.lock().unwrap();
        let key = (plural.to_string(), namespace.to_string(), name.to_string());
        if let Some(obj) = inner.objects.get(&key).cloned() {
            self.state.commit(&mut inner, plural, kind, gv, obj, "DELETED");
        }
    }
}
