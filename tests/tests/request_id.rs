//! `X-Request-ID` through the controller's template: the module's
//! `$dynamic_request_id` passes the client's id on and otherwise generates
//! 32 hex characters per request, unique across requests and workers.

use std::collections::BTreeSet;

use tests::agent;
use tests::controller::{ingress, service, Controller, INGRESS_CLASS};
use tests::Upstream;

const TWO_WORKERS: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: ingress-nginx, name: ingress-nginx-controller}\ndata: {worker-processes: \"2\"}\n";

/// GET `/` on `web.test` with extra `headers`: the status and the
/// `X-Echo-*` headers the upstream saw.
fn get(port: u16, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>) {
    let mut req = agent()
        .get(&format!("http://127.0.0.1:{port}/"))
        .header("Host", "web.test");
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
    assert!(c.conf().contains("proxy_set_header X-Request-ID $dynamic_request_id;"));
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
