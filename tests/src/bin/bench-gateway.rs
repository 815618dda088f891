//! Gateway API benchmarks (docs/src/benchmarks.md, "Gateway API routes").
//!
//! - `instructions [N]`: instructions per request (callgrind, one nginx
//!   process; (Ir(11·N) − Ir(N)) / 10·N) for a plain `proxy_pass` to a
//!   stock upstream (with a bare request, and with the route's request,
//!   which carries the header its match reads), the same with the two
//!   request headers the route sends set by `proxy_set_header` (nginx's
//!   own share of the route's work), an Ingress-style location (the backend named per
//!   request, as the controller's locations do), and an HTTPRoute through
//!   `dynamic_balancer_routes` with a header match, a weighted split of two
//!   backends and a request header modifier.
//! - `latency [EDITS]`: on a real kube-apiserver with the v1.7.0 CRDs and
//!   the controller, the time from the apiserver's answer to an HTTPRoute
//!   edit (its backend flipped between two Services) to the first request
//!   the Gateway routes by it, p50/p99 over EDITS edits (default 200), and
//!   the reloads meanwhile.
//! - `status [ROUTES]`: on a real kube-apiserver, the time from the
//!   controller's start to every one of ROUTES HTTPRoutes (default 1000)
//!   carrying its `Accepted` parent status, with one status write in flight
//!   and with the default 8 (`--gateway-status-concurrency`), each on a
//!   fresh apiserver; then 100 EndpointSlice changes of the routes'
//!   Service, and the LISTs of Services the status writer made meanwhile
//!   (apiserver_request_total).
//!
//! `cargo run --release -p tests --bin bench-gateway -- instructions 200`

use std::time::{Duration, Instant};

use serde_json::json;
use tests::bench::{alternating_backend, callgrind_total_with_routes, single_process_conf, upstream_pair, Front};
use tests::free_port;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "instructions".into());
    let n: Option<usize> = std::env::args().nth(2).and_then(|a| a.parse().ok());
    match mode.as_str() {
        "instructions" => instructions(n.unwrap_or(200)),
        "latency" => latency(n.unwrap_or(200)),
        "status" => {
            let routes = n.unwrap_or(1000);
            let one = status(routes, "1");
            let eight = status(routes, "8");
            println!(
                "status of {routes} routes written in {one:.2} s (1 in flight) and {eight:.2} s (8): {:.2}x",
                one / eight
            );
        }
        other => panic!("unknown mode {other:?}: instructions [N] | latency [EDITS] | status [ROUTES]"),
    }
}

fn instructions(n: usize) {
    let (_upstreams, a, b) = upstream_pair();
    let (port, stock_port, gw_port, api) = (free_port(), free_port(), free_port(), free_port());
    let headers_port = free_port();
    let extra = format!(
        r#" keepalive_requests 1000000;
    upstream stock {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; keepalive 32; }}
    server {{ listen 127.0.0.1:{stock_port}; location / {{ proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://stock; }} }}
    server {{ listen 127.0.0.1:{headers_port}; location / {{ proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header Host $http_host; proxy_set_header X-Env bench; proxy_pass http://stock; }} }}
    upstream gateway {{ server 0.0.0.1; dynamic_balancer; keepalive 32; }}
    server {{ listen 127.0.0.1:{gw_port}; location / {{ dynamic_balancer_routes bench/gw/80; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header Host $http_host; proxy_pass http://gateway; }} }}"#
    );
    let conf = single_process_conf(
        &Front {
            port,
            api_port: api,
            extra: &extra,
            ..Front::default()
        }
        .http_block(),
    );
    let none = json!({});
    let body = json!([
        alternating_backend("web-a", 2, a, b, &none),
        alternating_backend("web-b", 2, b, a, &none),
    ])
    .to_string();
    let routes = json!({"listeners": [{
        "name": "bench/gw/80", "port": 80,
        "hosts": [{"hostname": "x", "matches": [
            {"path": {"type": "PathPrefix", "value": "/"}, "headers": [{"name": "X-Version", "value": "2"}], "rule": 0},
            {"path": {"type": "PathPrefix", "value": "/"}, "rule": 1}]}],
        "rules": [
            {"route": "bench/web", "filters": {"requestHeaders": {"set": [{"name": "X-Env", "value": "bench"}]}},
             "backends": [{"backend": "web-a", "weight": 50}, {"backend": "web-b", "weight": 50}]},
            {"route": "bench/web", "backends": [{"backend": "web-a", "weight": 1}]}]
    }]})
    .to_string();
    let measure = |target: u16, headers: &str, routes: Option<&str>, warm: bool| {
        let small = callgrind_total_with_routes(&conf, &body, routes, target, api, headers, warm, n);
        let large = callgrind_total_with_routes(&conf, &body, routes, target, api, headers, warm, 11 * n);
        (large - small) as f64 / (10 * n) as f64
    };
    let stock = measure(stock_port, "Host: x\r\n", None, false);
    // The route's own request (it carries the header the match reads) to
    // the plain location: what parsing and forwarding the client's request
    // costs nginx wherever it goes.
    let same_request = measure(stock_port, "Host: x\r\nX-Version: 2\r\n", None, false);
    // nginx's own share of the route's work: the same two request headers
    // (the client's Host, the filter's X-Env) sent by proxy_set_header.
    let headers = measure(headers_port, "Host: x\r\nX-Version: 2\r\n", None, false);
    let ingress = measure(port, "Host: x\r\nX-Backend: web-a\r\n", None, true);
    let route = measure(gw_port, "Host: x\r\nX-Version: 2\r\n", Some(&routes), true);
    println!(
        "instructions per request (callgrind, one process), {n} and {} requests",
        11 * n
    );
    println!("plain proxy_pass, stock upstream   {stock:>8.0}");
    println!(
        "Ingress-style location             {ingress:>8.0}   stock/this {:.3}",
        stock / ingress
    );
    println!(
        "plain proxy_pass, Host and X-Env set by proxy_set_header {headers:>8.0}   stock/this {:.3}",
        stock / headers
    );
    println!(
        "plain proxy_pass, stock upstream, the route's request (Host, X-Version) {same_request:>8.0}   stock/this {:.3}",
        stock / same_request
    );
    println!(
        "HTTPRoute (header match, 50/50 split, header modifier) {route:>8.0}   stock/this {:.3}   same request {:.3}   headers/this {:.3}",
        stock / route,
        same_request / route,
        headers / route
    );
}

/// The controller name of the GatewayClass the benchmarks use.
const CONTROLLER: &str = "dynamic-balancer.dev/gateway-controller";

/// A real kube-apiserver with the v1.7.0 CRDs and the chart (Gateway API
/// on), Services in namespace `app` (name, port of its one pod-network
/// endpoint), a GatewayClass of ours, and Gateway `app/gw` with an HTTP
/// listener on the port returned.
fn gateway_cluster(
    services: &[(&str, u16)],
) -> (
    tests::kube_apiserver::RealApiServer,
    tests::kube_apiserver::ChartIdentity,
    u16,
) {
    use tests::controller::{service_at, Cluster};
    use tests::pod_network::POD_IP;
    let api = tests::kube_apiserver::RealApiServer::start();
    api.install_gateway_crds();
    let id = api.install_chart(&["gatewayAPI.enabled=true"]);
    for (name, port) in services {
        api.apply_yaml(&service_at(POD_IP, name, &[*port]).replace("namespace: demo", "namespace: app"));
    }
    api.apply_yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: dynamic}}\nspec: {{controllerName: {CONTROLLER}}}\n"
    ));
    let gw = free_port();
    api.apply_yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{namespace: app, name: gw}}\nspec:\n  gatewayClassName: dynamic\n  listeners:\n  - {{name: http, protocol: HTTP, port: {gw}}}\n"
    ));
    (api, id, gw)
}

fn latency(edits: usize) {
    use tests::controller::{request, Cluster, Controller, STRICT};
    use tests::upstream::Upstream;
    let ups: Vec<Upstream> = (0..2).map(|_| Upstream::start_in_pod_network()).collect();
    let services: Vec<(&str, u16)> = ["one", "two"].into_iter().zip(ups.iter().map(|u| u.port)).collect();
    let (api, id, gw) = gateway_cluster(&services);
    let route = |backend: &str| {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
               "metadata": {"namespace": "app", "name": "web"},
               "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["web.test"],
                        "rules": [{"backendRefs": [{"name": backend, "port": 80}]}]}})
    };
    api.apply_object(route("one"));
    let mut flags = id.args();
    flags.extend([STRICT, "--enable-gateway-api"]);
    let c = Controller::start_on_cluster(&id.kubeconfig, &flags);
    let deadline = Instant::now() + Duration::from_secs(30);
    while request(gw, "web.test", "/").map(|a| a.1) != Some(ups[0].identity.clone()) {
        assert!(Instant::now() < deadline, "the route never served: {}", c.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let reloads = c.reloads();
    let mut samples = Vec::with_capacity(edits);
    for i in 0..edits {
        let (backend, want) = if i % 2 == 0 { ("two", &ups[1]) } else { ("one", &ups[0]) };
        api.apply_object(route(backend));
        let acked = Instant::now();
        let limit = acked + Duration::from_secs(10);
        loop {
            if request(gw, "web.test", "/").map(|a| a.1).as_deref() == Some(want.identity.as_str()) {
                break;
            }
            assert!(Instant::now() < limit, "edit {i} never reached traffic: {}", c.log());
        }
        samples.push(acked.elapsed());
    }
    samples.sort();
    let q = |p: f64| samples[((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1];
    println!(
        "HTTPRoute edit -> first request routed by it, {edits} edits: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; reloads during the edits: {}",
        q(0.50).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3,
        c.reloads() - reloads
    );
}

/// Returns the seconds from the controller's start to every route
/// accepted, with `in_flight` status writes at once.
fn status(routes: usize, in_flight: &str) -> f64 {
    use tests::controller::{Cluster, Controller, STRICT};
    use tests::pod_network::POD_IP;
    let (api, id, _gw) = gateway_cluster(&[("one", free_port())]);
    for i in 0..routes {
        api.apply_object(
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"namespace": "app", "name": format!("web-{i}")},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [format!("web-{i}.test")],
                     "rules": [{"backendRefs": [{"name": "one", "port": 80}]}]}}),
        );
    }
    let accepted = || {
        let (code, list) = api.get("/apis/gateway.networking.k8s.io/v1/namespaces/app/httproutes");
        assert_eq!(code, 200, "{list}");
        list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|r| {
                        r["status"]["parents"].as_array().is_some_and(|ps| {
                            ps.iter().any(|p| {
                                p["controllerName"] == CONTROLLER
                                    && p["conditions"].as_array().is_some_and(|cs| {
                                        cs.iter().any(|c| c["type"] == "Accepted" && c["status"] == "True")
                                    })
                            })
                        })
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    let mut flags = id.args();
    flags.extend([
        STRICT,
        "--enable-gateway-api",
        "--gateway-status-concurrency",
        in_flight,
    ]);
    let started = Instant::now();
    let c = Controller::start_on_cluster(&id.kubeconfig, &flags);
    let deadline = started + Duration::from_secs(600);
    while accepted() < routes {
        assert!(
            Instant::now() < deadline,
            "the routes' status was never written: {}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let written = started.elapsed();
    // Endpoint churn: the routes' Service's slice, changed 100 times.
    std::thread::sleep(Duration::from_secs(2));
    let lists = api.requests_total("LIST", "services");
    let churn = Instant::now();
    for i in 0..100u16 {
        api.apply_object(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "app", "name": "one-churn", "labels": {"kubernetes.io/service-name": "one"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 10000 + i, "protocol": "TCP"}],
            "endpoints": [{"addresses": [POD_IP], "conditions": {"ready": true}}]}));
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(2));
    let lists = api.requests_total("LIST", "services") - lists;
    println!(
        "{routes} HTTPRoutes, {in_flight} status writes in flight: controller start -> every route Accepted in {:.2} s; 100 EndpointSlice changes in {:.1} s: {lists} LISTs of Services",
        written.as_secs_f64(),
        churn.elapsed().as_secs_f64()
    );
    written.as_secs_f64()
}
