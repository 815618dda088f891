//! Gateway API through the controller (manifest mode): a GatewayClass of
//! ours, a Gateway with an HTTP listener, HTTPRoutes with matches, weights
//! and filters. Route edits reach traffic with no reload; routes that the
//! listener's `allowedRoutes` does not admit, or backends in another
//! namespace without a ReferenceGrant, do not route. GRPCRoutes route gRPC
//! calls by method and header to HTTP/2 cleartext backends.

use std::time::Duration;

use tests::controller::{service, wait_until, Controller};
use tests::{free_port, Upstream};

fn gateway_class() -> String {
    "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: dynamic}\nspec: {controllerName: dynamic-balancer.dev/gateway-controller}\n".into()
}

fn gateway(name: &str, port: u16, allowed_from: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{namespace: demo, name: {name}}}\nspec:\n  gatewayClassName: dynamic\n  listeners:\n  - {{name: http, protocol: HTTP, port: {port}, allowedRoutes: {{namespaces: {{from: {allowed_from}}}}}}}\n"
    )
}

/// An HTTPRoute of namespace `ns` on Gateway `demo/gw` for `host`: a
/// header match `X-Version: 2` to `v2`, and a weighted split of the rest.
fn route(ns: &str, name: &str, host: &str, split: &[(&str, u32)], v2: &str) -> String {
    let backends: Vec<String> = split
        .iter()
        .map(|(svc, w)| format!("{{name: {svc}, port: 80, weight: {w}}}"))
        .collect();
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{namespace: {ns}, name: {name}}}\nspec:\n  parentRefs: [{{name: gw, namespace: demo}}]\n  hostnames: [{host}]\n  rules:\n  - matches: [{{headers: [{{name: X-Version, value: \"2\"}}]}}]\n    backendRefs: [{{name: {v2}, namespace: demo, port: 80}}]\n  - backendRefs: [{}]\n    filters:\n    - type: ResponseHeaderModifier\n      responseHeaderModifier: {{set: [{{name: X-Route, value: {name}}}]}}\n",
        backends.join(", ")
    )
}

/// The identity of the upstream that answers a request to the Gateway.
fn via(port: u16, host: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = tests::agent().get(&format!("http://127.0.0.1:{port}/"));
    req = req.header("Host", host);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    match req.call() {
        Ok(r) => (
            r.status().as_u16(),
            r.headers()
                .get("x-upstream")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
                + r.headers()
                    .get("x-route")
                    .map(|v| format!("+{}", v.to_str().unwrap_or_default()))
                    .unwrap_or_default()
                    .as_str(),
        ),
        Err(_) => (0, String::new()),
    }
}

#[test]
fn http_routes_route_and_change_without_reload() {
    let (a, b) = (Upstream::start(), Upstream::start());
    let gw = free_port();
    let files = vec![
        ("class.yaml", gateway_class()),
        ("gateway.yaml", gateway("gw", gw, "Same")),
        ("a.yaml", service("web-a", &[a.port])),
        ("b.yaml", service("web-b", &[b.port])),
        ("route.yaml", route("demo", "web", "web.test", &[("web-a", 1)], "web-b")),
    ];
    let c = Controller::start(&files, &[]);
    assert!(c.conf().contains("dynamic_balancer_routes demo/gw/"), "{}", c.conf());
    let (a_id, b_id) = (a.identity.clone(), b.identity.clone());
    assert!(wait_until(Duration::from_secs(10), || via(gw, "web.test", &[]).1
        == format!("{a_id}+web")));
    assert_eq!(via(gw, "web.test", &[("X-Version", "2")]), (200, b_id.clone()));
    assert_eq!(via(gw, "other.test", &[]).0, 404, "no route for the host");
    let reloads = c.reloads();
    let pids = c.worker_pids();

    // The split moves to b, then the route takes a second host: each edit
    // reaches traffic without a reload.
    c.write(
        "route.yaml",
        &route("demo", "web", "web.test", &[("web-a", 0), ("web-b", 1)], "web-b"),
    );
    assert!(wait_until(Duration::from_secs(10), || via(gw, "web.test", &[]).1
        == format!("{b_id}+web")));
    c.write(
        "route.yaml",
        &route("demo", "web", "web.test, www.web.test", &[("web-a", 1)], "web-b"),
    );
    assert!(wait_until(Duration::from_secs(10), || via(gw, "www.web.test", &[]).0 == 200));
    assert_eq!(c.reloads(), reloads, "route edits never reload");
    assert_eq!(c.worker_pids(), pids);

    // Another namespace's route is not admitted (allowedRoutes: Same), and
    // a backend in another namespace needs a ReferenceGrant.
    c.write(
        "tenant.yaml",
        &route("tenant", "intruder", "web.test", &[("web-a", 1)], "web-a").replace("web.test", "tenant.test"),
    );
    c.write(
        "cross.yaml",
        &route("demo", "cross", "cross.test", &[("web-a", 1)], "web-a")
            .replace("namespace: demo, port: 80", "namespace: elsewhere, port: 80"),
    );
    assert!(wait_until(Duration::from_secs(10), || via(
        gw,
        "cross.test",
        &[("X-Version", "2")]
    )
    .0 == 500));
    assert_eq!(via(gw, "tenant.test", &[]).0, 404);
    assert!(c.log().contains("no ReferenceGrant in elsewhere"), "{}", c.log());
}

#[test]
fn each_gateway_gets_its_own_port_from_the_base() {
    let up = Upstream::start();
    let base = free_port();
    let (g1, g2) = (free_port(), free_port());
    let files = vec![
        ("class.yaml", gateway_class()),
        ("gw1.yaml", gateway("gw", g1, "Same")),
        ("gw2.yaml", gateway("gw2", g2, "Same")),
        ("svc.yaml", service("web-a", &[up.port])),
        ("route.yaml", route("demo", "web", "web.test", &[("web-a", 1)], "web-a")),
    ];
    let c = Controller::start(&files, &[&format!("--gateway-base-port={base}")]);
    let conf = c.conf();
    assert!(
        conf.contains(&format!(":{base};")) && conf.contains(&format!(":{};", base + 1)),
        "{conf}"
    );
    // The route names gw only: gw's port serves it, gw2's answers 404.
    assert!(wait_until(Duration::from_secs(10), || via(base, "web.test", &[]).0 == 200));
    assert_eq!(via(base + 1, "web.test", &[]).0, 404);
}

/// An HTTPRoute to Service `slow` whose rules carry timeouts: `/request`
/// `request: {request}`, `/attempt` `backendRequest: {attempt}`, `/none`
/// `request: 0s` (none).
fn timeout_route(request: &str, attempt: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{namespace: demo, name: timeouts}}\nspec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [slow.test]\n  rules:\n  - matches: [{{path: {{type: PathPrefix, value: /request}}}}]\n    backendRefs: [{{name: slow, port: 80}}]\n    timeouts: {{request: {request}}}\n  - matches: [{{path: {{type: PathPrefix, value: /attempt}}}}]\n    backendRefs: [{{name: slow, port: 80}}]\n    timeouts: {{backendRequest: {attempt}}}\n  - matches: [{{path: {{type: PathPrefix, value: /none}}}}]\n    backendRefs: [{{name: slow, port: 80}}]\n    timeouts: {{request: 0s}}\n"
    )
}

#[test]
fn route_timeouts_answer_504_and_change_without_reload() {
    // The upstream answers after 600 ms.
    let slow = Upstream::start_slow(Duration::from_millis(600));
    let gw = free_port();
    let files = vec![
        ("class.yaml", gateway_class()),
        ("gateway.yaml", gateway("gw", gw, "Same")),
        ("slow.yaml", service("slow", &[slow.port])),
        ("route.yaml", timeout_route("200ms", "300ms")),
    ];
    let c = Controller::start(&files, &[]);
    let get = |path: &str| {
        let t = std::time::Instant::now();
        let status = match tests::agent()
            .get(&format!("http://127.0.0.1:{gw}{path}"))
            .header("Host", "slow.test")
            .call()
        {
            Ok(r) => r.status().as_u16(),
            Err(ureq::Error::StatusCode(code)) => code,
            Err(_) => 0,
        };
        (status, t.elapsed())
    };
    assert!(
        wait_until(Duration::from_secs(10), || get("/none").0 == 200),
        "{}",
        c.log()
    );
    let (status, took) = get("/request");
    assert_eq!(status, 504, "the whole request is bounded");
    assert!(took < Duration::from_millis(550), "answered after {took:?}");
    assert_eq!(get("/attempt").0, 504, "one attempt is bounded");
    assert_eq!(get("/none").0, 200, "0s: no timeout");

    // Longer timeouts are a route edit: the slow answer now fits.
    let reloads = c.reloads();
    c.write("route.yaml", &timeout_route("2s", "1s"));
    assert!(wait_until(Duration::from_secs(10), || get("/request").0 == 200));
    assert_eq!(get("/attempt").0, 200);
    assert_eq!(c.reloads(), reloads, "timeout edits never reload");
}

/// An HTTPRoute: `/retry` to Service `pair` retries once on 503, `/once`
/// to Service `other` never retries (`attempts: 0`). Each Service has two
/// endpoints; a failed one is marked down for a while (passive health),
/// so each path has its own.
fn retry_route() -> String {
    "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {namespace: demo, name: retries}\nspec:\n  parentRefs: [{name: gw}]\n  hostnames: [retry.test]\n  rules:\n  - matches: [{path: {type: PathPrefix, value: /retry}}]\n    backendRefs: [{name: pair, port: 80}]\n    retry: {codes: [503], attempts: 1}\n  - matches: [{path: {type: PathPrefix, value: /once}}]\n    backendRefs: [{name: other, port: 80}]\n    retry: {codes: [503], attempts: 0}\n".into()
}

#[test]
fn route_retries_take_another_endpoint_on_the_codes_given() {
    let (a, b, c2, d) = (
        Upstream::start(),
        Upstream::start(),
        Upstream::start(),
        Upstream::start(),
    );
    let gw = free_port();
    let files = vec![
        ("class.yaml", gateway_class()),
        ("gateway.yaml", gateway("gw", gw, "Same")),
        ("pair.yaml", service("pair", &[a.port, b.port])),
        ("other.yaml", service("other", &[c2.port, d.port])),
        ("route.yaml", retry_route()),
    ];
    let c = Controller::start(&files, &[]);
    // Endpoint a answers 503 to requests that name it in X-Fail-On.
    let get = |path: &str, fail_on: &str| -> u16 {
        let req = tests::agent()
            .get(&format!("http://127.0.0.1:{gw}{path}"))
            .header("Host", "retry.test")
            .header("X-Fail-On", fail_on);
        match req.call() {
            Ok(r) => r.status().as_u16(),
            Err(ureq::Error::StatusCode(code)) => code,
            Err(_) => 0,
        }
    };
    assert!(
        wait_until(Duration::from_secs(10), || get("/retry", "nobody") == 200),
        "{}",
        c.log()
    );
    // Round robin reaches the failing endpoint within two requests.
    let retried: Vec<u16> = (0..4).map(|_| get("/retry", &a.identity)).collect();
    assert_eq!(retried, [200; 4], "a 503 from a is retried on b");
    let once: Vec<u16> = (0..4).map(|_| get("/once", &c2.identity)).collect();
    assert!(once.contains(&503), "attempts 0 never retries: {once:?}");
    assert!(a.hits() >= 1 && b.hits() >= 4, "a {} b {}", a.hits(), b.hits());
}

/// A GRPCRoute on Gateway `demo/gw`: `Check` with `version: two` to
/// `two`, any other method of the health service to `rest`.
fn grpc_route(two: &str, rest: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{namespace: demo, name: health}}\nspec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [grpc.test]\n  rules:\n  - matches:\n    - method: {{service: grpc.health.v1.Health, method: Check}}\n      headers: [{{name: version, value: two}}]\n    backendRefs: [{{name: {two}, port: 80}}]\n  - matches: [{{method: {{service: grpc.health.v1.Health}}}}]\n    backendRefs: [{{name: {rest}, port: 80}}]\n"
    )
}

#[test]
fn grpc_routes_match_methods_and_headers_over_h2c_without_reload() {
    use tests::grpc_upstream::{channel, check_with, Answer, GrpcUpstream};
    use tonic_health::ServingStatus;

    let (a, b) = (
        GrpcUpstream::start(ServingStatus::Serving),
        GrpcUpstream::start(ServingStatus::NotServing),
    );
    let gw = free_port();
    let files = vec![
        ("class.yaml", gateway_class()),
        ("gateway.yaml", gateway("gw", gw, "Same")),
        ("a.yaml", service("grpc-a", &[a.port])),
        ("b.yaml", service("grpc-b", &[b.port])),
        ("route.yaml", grpc_route("grpc-b", "grpc-a")),
    ];
    let c = Controller::start(&files, &[]);
    let conf = c.conf();
    assert!(conf.contains("grpc_pass grpc://upstream_balancer_grpc;"), "{conf}");
    assert!(conf.contains("@h2c @tls @grpcs;"), "{conf}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ch = channel(&rt, gw, "grpc.test");
    let call = |md: &[(&'static str, &str)]| check_with(&rt, &ch, md);
    assert!(
        wait_until(Duration::from_secs(10), || call(&[]).ok() == Some(Answer::Serving)),
        "{}",
        c.log()
    );
    assert_eq!(call(&[("version", "two")]).unwrap(), Answer::NotServing);
    assert_eq!(call(&[("version", "three")]).unwrap(), Answer::Serving);
    // No route for the host: the module's 404 is gRPC's UNIMPLEMENTED.
    let other = channel(&rt, gw, "other.test");
    let e = check_with(&rt, &other, &[]).unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e}");
    // A rule whose backend does not resolve: UNAVAILABLE, not an HTML 500.
    c.write(
        "missing.yaml",
        &grpc_route("nowhere", "nowhere")
            .replace("name: health", "name: missing")
            .replace("grpc.test", "missing.test"),
    );
    let missing = channel(&rt, gw, "missing.test");
    assert!(wait_until(Duration::from_secs(10), || check_with(&rt, &missing, &[])
        .is_err_and(|e| e.code() == tonic::Code::Unavailable)));

    // Moving the rules' backends is a route edit: no reload, and the same
    // client connection sees it.
    let reloads = c.reloads();
    c.write("route.yaml", &grpc_route("grpc-a", "grpc-b"));
    assert!(wait_until(Duration::from_secs(10), || call(&[]).ok() == Some(Answer::NotServing)));
    assert_eq!(call(&[("version", "two")]).unwrap(), Answer::Serving);
    assert_eq!(c.reloads(), reloads, "GRPCRoute edits never reload");

    // An HTTP/1.1 client still reaches an HTTPRoute on the same listener.
    let up = Upstream::start();
    c.write("web.yaml", &service("web-a", &[up.port]));
    c.write(
        "web-route.yaml",
        &route("demo", "web", "web.test", &[("web-a", 1)], "web-a"),
    );
    assert!(wait_until(Duration::from_secs(10), || via(gw, "web.test", &[]).0 == 200));
}

/// A WebSocket echo backend: a thread per connection.
fn websocket_echo() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let Ok(mut ws) = tungstenite::accept(stream) else {
                    return;
                };
                while let Ok(msg) = ws.read() {
                    if msg.is_text() && ws.send(msg).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

#[test]
fn websockets_stay_open_across_100_route_edits() {
    let ws_port = websocket_echo();
    let other = Upstream::start();
    let gw = free_port();
    let files = vec![
        ("class.yaml", gateway_class()),
        ("gateway.yaml", gateway("gw", gw, "Same")),
        ("ws.yaml", service("ws", &[ws_port])),
        ("other.yaml", service("other", &[other.port])),
        ("route.yaml", route("demo", "web", "ws.test", &[("ws", 1)], "ws")),
    ];
    let c = Controller::start(&files, &[]);
    assert!(wait_until(Duration::from_secs(10), || via(gw, "ws.test", &[]).0 != 404));
    let mut sockets = Vec::new();
    for _ in 0..5 {
        let stream = std::net::TcpStream::connect(("127.0.0.1", gw)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = tungstenite::http::Request::builder()
            .uri(format!("ws://ws.test:{gw}/chat"))
            .header("Host", "ws.test")
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", tungstenite::handshake::client::generate_key())
            .body(())
            .unwrap();
        let (ws, resp) = tungstenite::client(req, stream).expect("the upgrade passes the Gateway");
        assert_eq!(resp.status(), 101);
        sockets.push(ws);
    }
    let reloads = c.reloads();
    // 100 edits of the route (its weights and a second host), each applied
    // live; the open connections are never touched.
    for i in 0..100 {
        let split = if i % 2 == 0 {
            [("ws", 1), ("other", 0)]
        } else {
            [("ws", 2), ("other", 0)]
        };
        c.write("route.yaml", &route("demo", "web", "ws.test", &split, "ws"));
        std::thread::sleep(Duration::from_millis(20));
    }
    // Let the last edits reach the module.
    std::thread::sleep(Duration::from_millis(500));
    for (i, ws) in sockets.iter_mut().enumerate() {
        ws.send(tungstenite::Message::text(format!("ping {i}")))
            .expect("still open");
        let answer = ws.read().expect("still open");
        assert_eq!(answer.into_text().unwrap().as_str(), format!("ping {i}"));
    }
    assert_eq!(c.reloads(), reloads, "route edits never reload");
}

/// An HTTPRoute whose `/m` rule mirrors to `shadow` (when `mirror`) and
/// lets `https://app.test` call it from a browser.
fn cors_mirror_route(mirror: bool) -> String {
    // Without the mirror, PUT is allowed too: the edit is visible.
    let (mirror, methods) = if mirror {
        (
            "\n    - type: RequestMirror\n      requestMirror: {backendRef: {name: shadow, port: 80}}",
            "GET, POST",
        )
    } else {
        ("", "GET, POST, PUT")
    };
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{namespace: demo, name: browser}}\nspec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [api.test]\n  rules:\n  - matches: [{{path: {{type: PathPrefix, value: /m}}}}]\n    backendRefs: [{{name: web, port: 80}}]\n    filters:\n    - type: CORS\n      cors: {{allowOrigins: [\"https://app.test\"], allowMethods: [{methods}], allowHeaders: [X-Token], allowCredentials: true, maxAge: 600}}{mirror}\n"
    )
}

#[test]
fn cors_preflights_are_answered_and_mirrors_get_copies_without_reload() {
    let web = Upstream::start();
    let (shadow_port, seen) = tests::upstream::recording("shadow");
    let gw = free_port();
    let files = vec![
        ("class.yaml", gateway_class()),
        ("gateway.yaml", gateway("gw", gw, "Same")),
        ("web.yaml", service("web", &[web.port])),
        ("shadow.yaml", service("shadow", &[shadow_port])),
        ("route.yaml", cors_mirror_route(true)),
    ];
    let c = Controller::start(&files, &[]);
    let call = |method: &str, origin: &str, extra: &[(&str, &str)]| {
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(format!("http://127.0.0.1:{gw}/m/items?x=1"))
            .header("Host", "api.test")
            .header("Origin", origin);
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let req = req.body("hello".to_string()).unwrap();
        match tests::agent().run(req) {
            Ok(r) => {
                let h = |n: &str| {
                    r.headers()
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string()
                };
                (
                    r.status().as_u16(),
                    h("x-upstream"),
                    h("access-control-allow-origin"),
                    h("access-control-allow-methods"),
                    h("access-control-allow-credentials"),
                )
            }
            Err(ureq::Error::StatusCode(code)) => (code, String::new(), String::new(), String::new(), String::new()),
            Err(_) => Default::default(),
        }
    };
    assert!(
        wait_until(Duration::from_secs(10), || call("POST", "https://app.test", &[]).0
            == 200),
        "{}",
        c.log()
    );
    // An actual request: the backend answers, the allow headers are added.
    let (status, upstream, origin, _, credentials) = call("POST", "https://app.test", &[]);
    assert_eq!((status, upstream.as_str()), (200, web.identity.as_str()));
    assert_eq!((origin.as_str(), credentials.as_str()), ("https://app.test", "true"));
    // The mirror got each POST, with its URI, method and body length.
    assert!(
        wait_until(Duration::from_secs(5), || seen.lock().unwrap().len() >= 2),
        "{:?}",
        seen.lock().unwrap()
    );
    let copy = seen.lock().unwrap()[0].to_ascii_lowercase();
    assert!(copy.starts_with("post /m/items?x=1 "), "{copy}");
    assert!(copy.contains("content-length: 5"), "{copy}");
    // A preflight is the gateway's: 204, the allow headers, no backend hit.
    let hits = web.hits();
    let preflight = [
        ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "x-token"),
    ];
    let (status, _, origin, methods, _) = call("OPTIONS", "https://app.test", &preflight);
    assert_eq!(
        (status, origin.as_str(), methods.as_str()),
        (204, "https://app.test", "GET, POST")
    );
    let (status, _, origin, _, _) = call("OPTIONS", "https://evil.test", &preflight);
    assert_eq!(
        (status, origin.as_str()),
        (204, ""),
        "another origin gets no allow header"
    );
    let (_, _, origin, _, _) = call("POST", "https://evil.test", &[]);
    assert_eq!(origin, "", "nor does its actual request");
    assert_eq!(web.hits(), hits + 1, "only the actual request reached the backend");
    // Dropping the mirror applies with no reload; copies stop.
    let reloads = c.reloads();
    c.write("route.yaml", &cors_mirror_route(false));
    assert!(wait_until(Duration::from_secs(10), || call(
        "OPTIONS",
        "https://app.test",
        &preflight
    )
    .3 == "GET, POST, PUT"));
    let copies = seen.lock().unwrap().len();
    for _ in 0..3 {
        assert_eq!(call("POST", "https://app.test", &[]).0, 200);
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(seen.lock().unwrap().len(), copies, "no copy once the mirror is gone");
    assert_eq!(c.reloads(), reloads, "filter edits never reload");
}

/// An HTTPRoute with session persistence (experimental channel): `/cookie`
/// splits between Services `pair` and `solo` with a permanent cookie,
/// `/header` keeps sessions in `X-Session`, `/plain` has none.
fn session_route() -> String {
    "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {namespace: demo, name: sessions}\nspec:\n  parentRefs: [{name: gw}]\n  hostnames: [shop.test]\n  rules:\n  - matches: [{path: {type: PathPrefix, value: /cookie}}]\n    backendRefs: [{name: pair, port: 80, weight: 1}, {name: solo, port: 80, weight: 1}]\n    sessionPersistence: {type: Cookie, absoluteTimeout: 1h, cookie: {name: shop-session, lifetimeType: Permanent}}\n  - matches: [{path: {type: PathPrefix, value: /header}}]\n    backendRefs: [{name: pair, port: 80}]\n    sessionPersistence: {type: Header, header: {name: X-Session}}\n  - matches: [{path: {type: PathPrefix, value: /plain}}]\n    backendRefs: [{name: pair, port: 80}]\n".into()
}

/// One request to `shop.test`: `(status, upstream, Set-Cookie, X-Session)`.
fn shop(gw: u16, path: &str, headers: &[(&str, &str)]) -> (u16, String, String, String) {
    let mut req = tests::agent()
        .get(&format!("http://127.0.0.1:{gw}{path}"))
        .header("Host", "shop.test");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    match req.call() {
        Ok(r) => {
            let h = |n: &str| {
                r.headers()
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string()
            };
            (r.status().as_u16(), h("x-upstream"), h("set-cookie"), h("x-session"))
        }
        Err(ureq::Error::StatusCode(code)) => (code, String::new(), String::new(), String::new()),
        Err(_) => Default::default(),
    }
}

#[test]
fn session_persistence_keeps_a_client_on_its_endpoint_across_a_weighted_split() {
    let (a, b, s) = (Upstream::start(), Upstream::start(), Upstream::start());
    let gw = free_port();
    let files = vec![
        ("class.yaml", gateway_class()),
        ("gateway.yaml", gateway("gw", gw, "Same")),
        ("pair.yaml", service("pair", &[a.port, b.port])),
        ("solo.yaml", service("solo", &[s.port])),
        ("route.yaml", session_route()),
    ];
    let c = Controller::start(&files, &[]);
    assert!(
        wait_until(Duration::from_secs(10), || shop(gw, "/plain", &[]).0 == 200),
        "{}",
        c.log()
    );
    let reloads = c.reloads();
    // No persistence: round robin over the pair, and no cookie.
    let plain: Vec<_> = (0..4).map(|_| shop(gw, "/plain", &[])).collect();
    assert!(plain.iter().all(|p| p.2.is_empty() && p.3.is_empty()), "{plain:?}");
    assert!(plain.iter().any(|p| p.1 == a.identity) && plain.iter().any(|p| p.1 == b.identity));

    // A cookie session: issued once with the rule's attributes, then every
    // request goes to the same endpoint, whichever side of the split.
    let mut pinned = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let (status, first, set_cookie, _) = shop(gw, "/cookie", &[]);
        assert_eq!(status, 200);
        assert!(
            set_cookie.starts_with("shop-session=") && set_cookie.contains("; Max-Age=3600; Path=/; HttpOnly"),
            "{set_cookie}"
        );
        let value = set_cookie.split(';').next().unwrap().to_string();
        for _ in 0..8 {
            let (status, again, set_again, _) = shop(gw, "/cookie", &[("Cookie", &value)]);
            assert_eq!((status, again.as_str(), set_again.as_str()), (200, first.as_str(), ""));
        }
        pinned.insert(first);
    }
    assert!(pinned.len() >= 2, "new sessions spread over the endpoints: {pinned:?}");
    // A forged value naming no endpoint starts a new session.
    let (status, _, reissued, _) = shop(gw, "/cookie", &[("Cookie", "shop-session=forged|nothing")]);
    assert!(status == 200 && reissued.starts_with("shop-session="), "{reissued}");

    // A header session: the value goes out in X-Session and comes back.
    let (_, first, set_cookie, session) = shop(gw, "/header", &[]);
    assert!(
        set_cookie.is_empty() && !session.is_empty(),
        "{set_cookie:?} {session:?}"
    );
    for _ in 0..8 {
        let (status, again, _, reissued) = shop(gw, "/header", &[("X-Session", &session)]);
        assert_eq!((status, again.as_str(), reissued.as_str()), (200, first.as_str(), ""));
    }
    // Its endpoint leaves the Service: the session moves, with a new value.
    let (left, stays) = if first == a.identity { (&a, &b) } else { (&b, &a) };
    assert_eq!(first, left.identity);
    c.write("pair.yaml", &service("pair", &[stays.port]));
    assert!(
        wait_until(Duration::from_secs(10), || shop(gw, "/plain", &[]).1 == stays.identity
            && shop(gw, "/plain", &[]).1 == stays.identity),
        "{}",
        c.log()
    );
    let (status, moved, _, new_session) = shop(gw, "/header", &[("X-Session", &session)]);
    assert_eq!((status, moved.as_str()), (200, stays.identity.as_str()));
    assert!(!new_session.is_empty() && new_session != session);
    assert_eq!(c.reloads(), reloads, "sessions and endpoint changes need no reload");
}
