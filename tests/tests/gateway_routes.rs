//! The module's Gateway API route table (`PUT /configuration/routes`,
//! `dynamic_balancer_routes`): host groups, path, header, method and query
//! matches in the pushed order, weighted backends, request and response
//! header modifiers, redirects and URL rewrites, all changed with no
//! reload; a hostile table is refused with its JSON path and the running
//! one stays.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};
use tests::nginx::{Nginx, Response};
use tests::{backend, free_port, Upstream};

const LISTENER: &str = "test/gw/80";

fn start(gw_port: u16) -> Nginx {
    Nginx::builder()
        .workers(2)
        .http_extra(&format!(
            r#"server {{
        listen 127.0.0.1:{gw_port};
        location / {{
            dynamic_balancer_routes {LISTENER};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_pass http://upstream_balancer;
        }}
    }}"#
        ))
        .start()
}

fn endpoint(up: &Upstream) -> Value {
    json!({"address": up.address, "port": up.port.to_string()})
}

/// A request to the Gateway server, over a raw connection (the Host
/// header is the test's, and redirects are not followed).
fn request(port: u16, method: &str, host: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("nginx listens");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: 0\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    let mut headers = BTreeMap::new();
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    Response {
        status,
        headers,
        body: body.to_string(),
    }
}

fn rule(route: &str, backends: &[(&str, u32)], filters: Value) -> Value {
    json!({
        "route": route,
        "filters": filters,
        "backends": backends.iter().map(|(b, w)| json!({"backend": b, "weight": w})).collect::<Vec<_>>(),
    })
}

fn table(a_weight: u32, b_weight: u32) -> Value {
    json!({"listeners": [{
        "name": LISTENER, "port": 8080,
        "hosts": [
            {"hostname": "app.test", "matches": [
                {"path": {"type": "Exact", "value": "/old"}, "rule": 2},
                {"path": {"type": "PathPrefix", "value": "/api"}, "rule": 3},
                {"path": {"type": "PathPrefix", "value": "/"}, "headers": [{"name": "X-Version", "value": "2"}], "rule": 1},
                {"path": {"type": "PathPrefix", "value": "/"}, "method": "POST", "rule": 1},
                {"path": {"type": "PathPrefix", "value": "/"}, "query": [{"name": "v", "value": "2"}], "rule": 1},
                {"path": {"type": "PathPrefix", "value": "/"}, "rule": 0}
            ]},
            {"hostname": "*.wild.test", "matches": [{"path": {"type": "PathPrefix", "value": "/"}, "rule": 4}]}
        ],
        "rules": [
            rule("default/split", &[("gw-a", a_weight), ("gw-b", b_weight)], json!({
                "requestHeaders": {"set": [{"name": "X-Gw-Set", "value": "set"}], "add": [{"name": "X-Gw-Add", "value": "added"}], "remove": ["X-Gw-Remove"]},
                "responseHeaders": {"set": [{"name": "X-Route", "value": "split"}], "remove": ["X-Remove-Me"]}
            })),
            rule("default/v2", &[("gw-b", 1)], json!({})),
            rule("default/moved", &[], json!({"redirect": {"path": {"type": "ReplaceFullPath", "value": "/new"}, "statusCode": 301}})),
            rule("default/api", &[("gw-a", 1)], json!({"rewrite": {"hostname": "internal.test", "path": {"type": "ReplacePrefixMatch", "value": "/"}}})),
            rule("default/wild", &[("gw-missing", 1)], json!({})),
        ]
    }]})
}

fn worker_pids(nginx: &Nginx) -> Vec<i64> {
    let mut pids: Vec<i64> = nginx.status()["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["pid"].as_i64().unwrap())
        .collect();
    pids.sort_unstable();
    pids
}

fn put_routes(nginx: &Nginx, t: &Value) -> Response {
    nginx.api("PUT", "/configuration/routes", Some(&t.to_string()))
}

#[test]
fn routes_match_filter_and_change_without_reload() {
    let (a, b) = (Upstream::start(), Upstream::start());
    let gw = free_port();
    let nginx = start(gw);
    let r = nginx.post_backends(&json!([
        backend("gw-a", &[endpoint(&a)]),
        backend("gw-b", &[endpoint(&b)]),
    ]));
    assert_eq!(r.status, 201, "{}", r.body);
    // No table yet: nothing routes.
    assert_eq!(request(gw, "GET", "app.test", "/", &[]).status, 404);
    let r = put_routes(&nginx, &table(1, 0));
    assert_eq!(r.status, 200, "{}", r.body);
    let pids = worker_pids(&nginx);

    // The catch-all rule: every request to a, with its header filters.
    for _ in 0..10 {
        let r = request(
            gw,
            "GET",
            "app.test",
            "/page?x=1",
            &[
                ("X-Gw-Remove", "gone"),
                ("X-Gw-Set", "client"),
                ("X-Respond-X-Remove-Me", "1"),
            ],
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("x-upstream"), Some(a.identity.as_str()));
        assert_eq!(r.header("x-echo-x-gw-set"), Some("set"));
        assert_eq!(r.header("x-echo-x-gw-add"), Some("added"));
        assert_eq!(r.header("x-echo-x-gw-remove"), None);
        assert_eq!(r.header("x-echo-host"), Some("app.test"));
        assert_eq!(r.header("x-echo-uri"), Some("/page?x=1"));
        assert_eq!(r.header("x-route"), Some("split"));
        assert_eq!(r.header("x-remove-me"), None);
    }
    // Header, method and query matches, each to b.
    for (method, path, headers) in [
        ("GET", "/", vec![("X-Version", "2")]),
        ("POST", "/", vec![]),
        ("GET", "/?a=1&v=2", vec![]),
    ] {
        let r = request(gw, method, "app.test", path, &headers);
        assert_eq!(
            r.header("x-upstream"),
            Some(b.identity.as_str()),
            "{method} {path} {headers:?}"
        );
        assert_eq!(r.header("x-route"), None, "no response filter on this rule");
    }
    // A redirect, and a rewrite of host and prefix.
    let r = request(gw, "GET", "app.test", "/old?q=1", &[]);
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("http://app.test:8080/new?q=1"));
    let r = request(gw, "GET", "app.test", "/api/users?id=7", &[]);
    assert_eq!(r.header("x-upstream"), Some(a.identity.as_str()));
    assert_eq!(r.header("x-echo-uri"), Some("/users?id=7"));
    assert_eq!(r.header("x-echo-host"), Some("internal.test"));
    // Unknown host: 404; a rule whose backend is not in the zone: 503
    // (the balancer's answer for an unknown backend).
    assert_eq!(request(gw, "GET", "other.test", "/", &[]).status, 404);
    assert_eq!(request(gw, "GET", "x.wild.test", "/", &[]).status, 503);
    assert_eq!(
        request(gw, "GET", "wild.test", "/", &[]).status,
        404,
        "a wildcard needs a label"
    );

    // The weights move to b: the next requests follow, with no reload.
    assert_eq!(put_routes(&nginx, &table(0, 1)).status, 200);
    for _ in 0..10 {
        let r = request(gw, "GET", "app.test", "/", &[]);
        assert_eq!(r.header("x-upstream"), Some(b.identity.as_str()));
    }
    assert_eq!(worker_pids(&nginx), pids, "no worker was replaced");

    // A hostile table is refused with its path; the running one stays.
    let mut hostile = table(1, 0);
    hostile["listeners"][0]["rules"][0]["filters"]["requestHeaders"]["set"][0]["value"] = json!("x\r\nInjected: 1");
    let r = put_routes(&nginx, &hostile);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        r.json()["path"],
        "listeners[0].rules[0].filters.requestHeaders.set[0].value"
    );
    let r = request(gw, "GET", "app.test", "/", &[]);
    assert_eq!(r.header("x-upstream"), Some(b.identity.as_str()));
    let stored = nginx.api("GET", "/configuration/routes", None);
    assert_eq!(stored.json()["listeners"][0]["name"], LISTENER);

    // The location remembers its listener per table: a table without it
    // routes nothing (404), and the listener's return routes again.
    let mut other = table(1, 0);
    other["listeners"][0]["name"] = json!("default/other/80");
    assert_eq!(put_routes(&nginx, &other).status, 200);
    assert_eq!(request(gw, "GET", "app.test", "/", &[]).status, 404);
    assert_eq!(put_routes(&nginx, &table(1, 0)).status, 200);
    for _ in 0..4 {
        let r = request(gw, "GET", "app.test", "/", &[]);
        assert_eq!(r.header("x-upstream"), Some(a.identity.as_str()));
    }
}

#[test]
fn the_weights_split_traffic() {
    let (a, b) = (Upstream::start(), Upstream::start());
    let gw = free_port();
    let nginx = start(gw);
    nginx.post_backends(&json!([
        backend("gw-a", &[endpoint(&a)]),
        backend("gw-b", &[endpoint(&b)]),
    ]));
    assert_eq!(put_routes(&nginx, &table(1, 3)).status, 200);
    let to_b = (0..400)
        .filter(|_| request(gw, "GET", "app.test", "/", &[]).header("x-upstream") == Some(b.identity.as_str()))
        .count();
    // 3/4 of 400 is 300; the binomial spread is about 9.
    assert!((250..=350).contains(&to_b), "{to_b} of 400 to b");
}
