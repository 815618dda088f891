//! ingress-nginx's proxy and http settings through the controller, on real
//! nginx with a real upstream: buffer sizes (the "upstream sent too big
//! header" 502 that large OIDC cookies cause), cookie and redirect
//! rewriting, hidden headers, gzip, and the client's address behind a
//! trusted proxy (realip), which allowlists and the headers sent upstream
//! then see.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use tests::controller::{ingress, service, wait_until, Controller, INGRESS_CLASS};
use tests::Upstream;

/// A GET over plain HTTP from `source` (any 127.0.0.0/8 address: Linux
/// answers them all on loopback): the status and the response headers
/// (lower-case names).
fn get_from(source: &str, port: u16, host: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::new(source.parse::<IpAddr>().unwrap(), 0))
            .unwrap();
        socket
            .connect(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .expect("nginx listens")
    });
    let mut s: TcpStream = stream.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers)
}

fn get(port: u16, host: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>) {
    get_from("127.0.0.1", port, host, path, headers)
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn config_map(data: &[(&str, &str)]) -> String {
    let mut out =
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: ingress-nginx, name: ingress-nginx-controller}\ndata:\n"
            .to_string();
    for (k, v) in data {
        out.push_str(&format!("  {k}: {v:?}\n"));
    }
    out
}

#[test]
fn buffers_rewrites_hidden_headers_and_gzip() {
    let up = Upstream::start();
    let files = vec![
        ("class.yaml", INGRESS_CLASS.to_string()),
        (
            "config.yaml",
            config_map(&[
                ("hide-headers", "X-Powered-By"),
                ("use-gzip", "true"),
                ("gzip-min-length", "1"),
                ("gzip-types", "text/plain"),
            ]),
        ),
        ("svc.yaml", service("web", &[up.port])),
        ("small.yaml", ingress("small", "small.test", "/", "web", &[])),
        (
            "big.yaml",
            ingress(
                "big",
                "big.test",
                "/",
                "web",
                &[("proxy-buffer-size", "16k"), ("x-forwarded-prefix", "/big")],
            ),
        ),
        (
            "rewrite.yaml",
            ingress(
                "rewrite",
                "rewrite.test",
                "/",
                "web",
                &[
                    ("proxy-cookie-domain", "backend.internal rewrite.test"),
                    ("proxy-cookie-path", "/internal/ /"),
                    ("proxy-redirect-from", "http://backend.internal/"),
                    ("proxy-redirect-to", "/app/"),
                ],
            ),
        ),
        (
            "few.yaml",
            ingress("few", "few.test", "/", "web", &[("proxy-buffers-number", "2")]),
        ),
    ];
    let mut c = Controller::start(&files, &[]);
    let port = c.http_port;
    let conf = c.conf();
    assert!(conf.contains("proxy_buffer_size 16k;"), "{conf}");

    // A 6 KB response header (a large OIDC cookie): nginx's default 4k
    // buffer gives ingress-nginx's infamous 502, proxy-buffer-size fixes it.
    let big = "a".repeat(6000);
    let asked = [("X-Respond-X-Large", big.as_str())];
    let (status, _) = get(port, "small.test", "/", &asked);
    assert_eq!(status, 502, "a 6 KB header does not fit the default 4k buffer");
    let error_log = std::fs::read_to_string(c.dir.path().join("nginx/logs/error.log")).unwrap_or_default();
    assert!(error_log.contains("upstream sent too big header"), "{error_log}");
    let (status, h) = get(port, "big.test", "/", &asked);
    assert_eq!(status, 200);
    assert_eq!(header(&h, "x-large").map(str::len), Some(6000));
    assert_eq!(header(&h, "x-echo-x-forwarded-prefix"), Some("/big"));

    // Set-Cookie domain and path, and Location, rewritten for this Ingress.
    let (status, h) = get(
        port,
        "rewrite.test",
        "/",
        &[
            (
                "X-Respond-Set-Cookie",
                "sid=1; Domain=backend.internal; Path=/internal/login",
            ),
            ("X-Respond-Location", "http://backend.internal/login"),
        ],
    );
    assert_eq!(status, 200);
    assert_eq!(
        header(&h, "set-cookie"),
        Some("sid=1; Domain=rewrite.test; Path=/login")
    );
    // nginx makes the relative result absolute (absolute_redirect), as in
    // ingress-nginx.
    let want = format!("http://rewrite.test:{port}/app/login");
    assert_eq!(header(&h, "location"), Some(want.as_str()));
    // Elsewhere they pass unchanged (ingress-nginx's proxy_redirect off).
    let (_, h) = get(
        port,
        "small.test",
        "/",
        &[
            ("X-Respond-Set-Cookie", "sid=1; Domain=backend.internal"),
            ("X-Respond-Location", "http://upstream_balancer/login"),
        ],
    );
    assert_eq!(header(&h, "set-cookie"), Some("sid=1; Domain=backend.internal"));
    assert_eq!(header(&h, "location"), Some("http://upstream_balancer/login"));

    // hide-headers: the backend's header never reaches the client.
    let (_, h) = get(port, "small.test", "/", &[("X-Respond-X-Powered-By", "PHP/5.1")]);
    assert_eq!(header(&h, "x-powered-by"), None);

    // use-gzip: a client that accepts gzip gets it, with Vary.
    let (status, h) = get(port, "small.test", "/", &[("Accept-Encoding", "gzip")]);
    assert_eq!(status, 200);
    assert_eq!(header(&h, "content-encoding"), Some("gzip"));
    assert_eq!(header(&h, "vary"), Some("Accept-Encoding"));
    let (_, h) = get(port, "small.test", "/", &[]);
    assert_eq!(header(&h, "content-encoding"), None);

    // Two buffers with nginx's default busy size would fail `nginx -t`:
    // the annotation is reported and dropped, the Ingress is served.
    assert!(c.log().contains("proxy-buffers-number"), "{}", c.log());
    assert!(!conf.contains("proxy_buffers 2 "), "{conf}");
    assert_eq!(get(port, "few.test", "/", &[]).0, 200);
    c.stop();
}

#[test]
fn the_client_address_comes_from_trusted_proxies_only() {
    let up = Upstream::start();
    let files = vec![
        ("class.yaml", INGRESS_CLASS.to_string()),
        (
            "config.yaml",
            config_map(&[
                ("enable-real-ip", "true"),
                ("proxy-real-ip-cidr", "127.0.0.2/32"),
                ("compute-full-forwarded-for", "true"),
            ]),
        ),
        ("svc.yaml", service("web", &[up.port])),
        ("open.yaml", ingress("open", "open.test", "/", "web", &[])),
        (
            "allow.yaml",
            ingress(
                "allow",
                "allow.test",
                "/",
                "web",
                &[("whitelist-source-range", "203.0.113.0/24")],
            ),
        ),
    ];
    let mut c = Controller::start(&files, &[]);
    let port = c.http_port;
    let client = [("X-Forwarded-For", "198.51.100.9, 203.0.113.7")];

    // From the trusted proxy (127.0.0.2): the right-most untrusted address
    // of X-Forwarded-For is the client.
    let (status, h) = get_from("127.0.0.2", port, "open.test", "/", &client);
    assert_eq!(status, 200);
    assert_eq!(header(&h, "x-echo-x-real-ip"), Some("203.0.113.7"));
    // compute-full-forwarded-for: the chain and the proxy that connected.
    assert_eq!(
        header(&h, "x-echo-x-forwarded-for"),
        Some("198.51.100.9, 203.0.113.7, 127.0.0.2")
    );
    // The allowlist sees the client, not the proxy.
    assert_eq!(get_from("127.0.0.2", port, "allow.test", "/", &client).0, 200);

    // From anywhere else the header is a client's claim and is ignored.
    let (status, h) = get_from("127.0.0.3", port, "open.test", "/", &client);
    assert_eq!(status, 200);
    assert_eq!(header(&h, "x-echo-x-real-ip"), Some("127.0.0.3"));
    assert_eq!(get_from("127.0.0.3", port, "allow.test", "/", &client).0, 403);
    c.stop();
}

#[test]
fn limits_allowlists_and_blocks() {
    let up = Upstream::start();
    let files = vec![
        ("class.yaml", INGRESS_CLASS.to_string()),
        (
            "config.yaml",
            config_map(&[
                ("limit-req-status-code", "429"),
                ("block-cidrs", "127.0.0.4/32"),
                ("block-user-agents", "~*badbot"),
            ]),
        ),
        ("svc.yaml", service("web", &[up.port])),
        (
            "limited.yaml",
            ingress(
                "limited",
                "limited.test",
                "/",
                "web",
                &[
                    ("limit-rpm", "1"),
                    ("limit-burst-multiplier", "1"),
                    ("limit-allowlist", "127.0.0.5"),
                ],
            ),
        ),
        ("open.yaml", ingress("open", "open.test", "/", "web", &[])),
    ];
    let mut c = Controller::start(&files, &[]);
    let port = c.http_port;

    // One request a minute with a burst of one: the third is refused with
    // limit-req-status-code.
    let statuses: Vec<u16> = (0..3).map(|_| get(port, "limited.test", "/", &[]).0).collect();
    assert_eq!(statuses, [200, 200, 429], "{}", c.log());
    // limit-allowlist: never counted.
    for _ in 0..5 {
        assert_eq!(get_from("127.0.0.5", port, "limited.test", "/", &[]).0, 200);
    }
    // Another Ingress has no limit.
    for _ in 0..5 {
        assert_eq!(get(port, "open.test", "/", &[]).0, 200);
    }

    // block-user-agents and block-cidrs: 403 on every server.
    assert_eq!(
        get(port, "open.test", "/", &[("User-Agent", "Mozilla/5.0 BadBot/2")]).0,
        403
    );
    assert_eq!(get(port, "open.test", "/", &[("User-Agent", "Mozilla/5.0")]).0, 200);
    assert_eq!(get_from("127.0.0.4", port, "open.test", "/", &[]).0, 403);
    c.stop();
}

#[test]
fn skipped_urls_and_the_default_backend_stay_out_of_the_access_log() {
    let up = Upstream::start();
    let files = vec![
        ("class.yaml", INGRESS_CLASS.to_string()),
        ("svc.yaml", service("web", &[up.port])),
        ("app.yaml", ingress("app", "app.test", "/", "web", &[])),
        (
            "quiet.yaml",
            ingress("quiet", "quiet.test", "/api", "web", &[("enable-access-log", "false")]),
        ),
        ("cm.yaml", config_map(&[("skip-access-log-urls", "/healthz,/ready")])),
    ];
    let mut c = Controller::start(&files, &[]);
    let port = c.http_port;
    assert_eq!(get(port, "app.test", "/healthz", &[]).0, 200);
    assert_eq!(get(port, "app.test", "/ready", &[]).0, 200);
    assert_eq!(get(port, "app.test", "/healthz?full=1", &[]).0, 200);
    assert_eq!(get(port, "quiet.test", "/api/hidden", &[]).0, 200);
    // No Ingress serves these: the default backend answers, unlogged.
    assert_eq!(get(port, "nobody.test", "/unrouted", &[]).0, 404);
    assert_eq!(get(port, "quiet.test", "/elsewhere", &[]).0, 404);
    assert_eq!(
        get(port, "app.test", "/logged", &[("X-Request-ID", "trace-me-7")]).0,
        200
    );
    let log_path = c.dir.path().join("nginx/logs/access.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let log = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains("/logged") || std::time::Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(log.contains("GET /logged "), "{log}");
    // ingress-nginx's upstreaminfo format: the backend, the upstream's
    // address and the request id (here the client's) end the line.
    let line = log.lines().find(|l| l.contains("GET /logged ")).unwrap();
    let upstream = format!(" [demo-web-80] [] 127.0.0.1:{} ", up.port);
    assert!(line.contains(&upstream), "{line}");
    assert!(line.ends_with(" 200 trace-me-7"), "{line}");
    // Without one, the id generated for the request (32 hex digits).
    let line = log.lines().find(|l| l.contains("GET /healthz?full=1 ")).unwrap();
    let id = line.rsplit(' ').next().unwrap();
    assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{line}");
    // skip-access-log-urls matches the whole request URI, as in ingress-nginx.
    assert!(log.contains("GET /healthz?full=1 "), "{log}");
    for absent in ["GET /healthz ", "GET /ready ", "/api/hidden", "/unrouted", "/elsewhere"] {
        assert!(!log.contains(absent), "{absent} logged:\n{log}");
    }

    // enable-access-log-for-default-backend logs them again.
    let reloads = c.reloads();
    c.write(
        "cm.yaml",
        &config_map(&[
            ("skip-access-log-urls", "/healthz"),
            ("enable-access-log-for-default-backend", "true"),
        ]),
    );
    assert!(
        wait_until(Duration::from_secs(10), || c.reloads() > reloads),
        "{}",
        c.log()
    );
    // Old workers may still answer a moment: ask until a new one logs it.
    assert!(
        wait_until(Duration::from_secs(10), || {
            get(port, "nobody.test", "/now-logged", &[]);
            std::fs::read_to_string(&log_path)
                .unwrap_or_default()
                .contains("/now-logged")
        }),
        "the default backend's request is not logged"
    );
    c.stop();
}

#[test]
fn header_sets_reach_responses_and_upstreams() {
    let up = Upstream::start();
    let set = |name: &str, data: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{namespace: ingress-nginx, name: {name}}}\ndata:\n{data}")
    };
    let files = vec![
        ("class.yaml", INGRESS_CLASS.to_string()),
        ("svc.yaml", service("web", &[up.port])),
        ("app.yaml", ingress("app", "app.test", "/", "web", &[])),
        (
            "cors.yaml",
            ingress("cors", "app.test", "/api", "web", &[("enable-cors", "true")]),
        ),
        (
            "cm.yaml",
            config_map(&[
                ("add-headers", "security-headers"),
                ("proxy-set-headers", "ingress-nginx/proxy-headers"),
                ("global-allowed-response-headers", "X-Team"),
            ]),
        ),
        (
            "team-set.yaml",
            set("team-headers", "  X-Team: blue\n  X-Nope: \"1\"\n"),
        ),
        (
            "team.yaml",
            ingress("team", "team.test", "/", "web", &[("custom-headers", "team-headers")]),
        ),
        (
            "sec.yaml",
            set(
                "security-headers",
                "  X-Frame-Options: DENY\n  X-Served-By: \"edge-$server_port\"\n",
            ),
        ),
        ("proxy.yaml", set("proxy-headers", "  X-Forwarded-Tenant: blue\n")),
    ];
    let mut c = Controller::start(&files, &[]);
    let port = c.http_port;
    let (status, h) = get(port, "app.test", "/", &[]);
    assert_eq!(status, 200, "{}", c.log());
    assert_eq!(header(&h, "x-frame-options"), Some("DENY"));
    assert_eq!(header(&h, "x-served-by"), Some(format!("edge-{port}").as_str()));
    assert_eq!(header(&h, "x-echo-x-forwarded-tenant"), Some("blue"));
    // A location with headers of its own (CORS) still sends them, and so
    // does an error answer (always).
    let (_, h) = get(port, "app.test", "/api", &[("Origin", "https://x.test")]);
    assert_eq!(header(&h, "x-frame-options"), Some("DENY"), "{h:?}");
    assert!(header(&h, "access-control-allow-origin").is_some(), "{h:?}");
    let (status, h) = get(port, "nobody.test", "/", &[]);
    assert_eq!((status, header(&h, "x-frame-options")), (404, Some("DENY")));
    // custom-headers: what global-allowed-response-headers allows, beside
    // the add-headers set.
    let (_, h) = get(port, "team.test", "/", &[]);
    assert_eq!(header(&h, "x-team"), Some("blue"), "{h:?}");
    assert_eq!(header(&h, "x-nope"), None);
    assert_eq!(header(&h, "x-frame-options"), Some("DENY"));
    c.stop();
}
