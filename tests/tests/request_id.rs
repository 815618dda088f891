//! `X-Request-ID` through the controller's template: the module's
//! `$dynamic_request_id` passes the client's id on and otherwise generates
//! 32 hex characters per request, unique across requests and workers, and
//! `dynamic_balancer_request_id on` puts it in the request's headers, so the
//! upstream and an `auth-url` service see the id the access log records.

use std::collections::BTreeSet;

use tests::agent;
use tests::controller::{ingress, service, Controller, INGRESS_CLASS};
use tests::Upstream;

const TWO_WORKERS: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: ingress-nginx, name: ingress-nginx-controller}\ndata: {worker-processes: \"2\"}\n";

/// GET `/` on `web.test` with extra `headers`: the status and the
/// `X-Echo-*` headers the upstream saw.
fn get(port: u16, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>) {
    get_at(port, "web.test", "/", headers)
}

/// GET `path` on `host` with extra `headers` (repeated names are sent
/// repeated): the status and the `X-Echo-*` headers the upstream saw.
fn get_at(port: u16, host: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>) {
    let mut req = agent()
        .get(&format!("http://127.0.0.1:{port}{path}"))
        .header("Host", host);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.call().expect("nginx answers");
    let echoed = resp
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-echo-"))
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    (resp.status().as_u16(), echoed)
}

fn echoed<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[test]
fn request_ids_are_generated_once_per_request_or_passed_on() {
    let up = Upstream::start();
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("config.yaml", TWO_WORKERS.into()),
            ("svc.yaml", service("web", &[up.port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
        ],
        &[],
    );
    let conf = c.conf();
    assert!(conf.contains("dynamic_balancer_request_id on;"), "{conf}");
    assert!(!conf.contains("proxy_set_header X-Request-ID $dynamic_request_id;"));
    assert_eq!(c.worker_pids().len(), 2);

    // Generated: 32 lowercase hex characters, never repeated, from both
    // workers (new connections spread over them).
    let mut ids = BTreeSet::new();
    for _ in 0..300 {
        let (status, h) = get(c.http_port, &[]);
        assert_eq!(status, 200);
        let id = echoed(&h, "x-echo-x-request-id").expect("an id was sent upstream");
        assert_eq!(id.len(), 32, "{id}");
        assert!(
            id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{id}"
        );
        ids.insert(id.to_string());
    }
    assert_eq!(ids.len(), 300, "a generated id repeated");

    // The client's id goes through unchanged; an empty one is replaced.
    let (_, h) = get(c.http_port, &[("X-Request-ID", "client-chosen-0001")]);
    assert_eq!(echoed(&h, "x-echo-x-request-id"), Some("client-chosen-0001"));
    let (_, h) = get(c.http_port, &[("X-Request-ID", "")]);
    assert_eq!(echoed(&h, "x-echo-x-request-id").map(str::len), Some(32));

    // Without use-forwarded-headers, the client's X-Forwarded-Proto/Port
    // are replaced by the connection's own.
    let (_, h) = get(
        c.http_port,
        &[("X-Forwarded-Proto", "https"), ("X-Forwarded-Port", "1")],
    );
    assert_eq!(echoed(&h, "x-echo-x-forwarded-proto"), Some("http"));
    assert_eq!(
        echoed(&h, "x-echo-x-forwarded-port"),
        Some(c.http_port.to_string().as_str())
    );
    c.stop();
}

/// The access log line of the request for `path` (ingress-nginx's format
/// ends with `$req_id`).
fn logged_id(c: &Controller, path: &str) -> String {
    let log_path = c.dir.path().join("nginx/logs/access.log");
    let needle = format!("GET {path} ");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains(&needle)) {
            return line.rsplit(' ').next().unwrap_or_default().to_string();
        }
        assert!(std::time::Instant::now() < deadline, "{path} not logged:\n{log}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn get_path(port: u16, host: &str, path: &str, headers: &[(&str, &str)]) -> Vec<(String, String)> {
    let (status, echoed) = get_at(port, host, path, headers);
    assert_eq!(status, 200);
    echoed
}

fn all<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// `dynamic_balancer_request_id` adds the id to the request itself: the
/// upstream gets exactly one header, the id the access log records. An
/// operator's `proxy-set-headers` entry for X-Request-ID still replaces it
/// (the added header carries nginx's hash of its name, so the proxy knows
/// it as the one it replaces), and several client ids pass as sent.
#[test]
fn the_added_header_is_the_logged_id_and_proxy_set_header_still_wins() {
    let up = Upstream::start();
    let set = "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: ingress-nginx, name: proxy-headers}\ndata:\n  X-Request-ID: \"operator-$host\"\n";
    let config = |extra: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{namespace: ingress-nginx, name: ingress-nginx-controller}}\ndata: {{worker-processes: \"1\"{extra}}}\n")
    };
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("config.yaml", config("")),
            ("svc.yaml", service("web", &[up.port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
        ],
        &[],
    );
    // Generated: one header upstream, the same id in the log.
    let h = get_path(c.http_port, "web.test", "/generated", &[]);
    let ids = all(&h, "x-echo-x-request-id");
    assert_eq!(ids.len(), 1, "{h:?}");
    assert_eq!(ids[0].len(), 32);
    assert_eq!(logged_id(&c, "/generated"), ids[0]);
    // An empty client header is filled, not doubled.
    let h = get_path(c.http_port, "web.test", "/empty", &[("X-Request-ID", "")]);
    let ids = all(&h, "x-echo-x-request-id");
    assert_eq!(ids.len(), 1, "{h:?}");
    assert_eq!(logged_id(&c, "/empty"), ids[0]);
    // Two client ids: both passed on as sent; the log keeps the first.
    let h = get_path(
        c.http_port,
        "web.test",
        "/twice",
        &[("X-Request-ID", "first-1"), ("X-Request-ID", "second-2")],
    );
    assert_eq!(all(&h, "x-echo-x-request-id"), ["first-1", "second-2"]);
    assert_eq!(logged_id(&c, "/twice"), "first-1");
    c.stop();

    // An operator's proxy_set_header for the name replaces the client's
    // and the added header alike.
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            (
                "config.yaml",
                config(", proxy-set-headers: ingress-nginx/proxy-headers"),
            ),
            ("set.yaml", set.into()),
            ("svc.yaml", service("web", &[up.port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
        ],
        &[],
    );
    for headers in [&[][..], &[("X-Request-ID", "client-9")][..]] {
        let h = get_path(c.http_port, "web.test", "/", headers);
        assert_eq!(all(&h, "x-echo-x-request-id"), ["operator-web.test"], "{headers:?}");
    }
    c.stop();
}
