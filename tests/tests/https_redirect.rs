//! HTTPS redirects through the controller's template and the module's
//! `dynamic_balancer_https_redirect`, as ingress-nginx's Lua decides them:
//! `force-ssl-redirect` and `ssl-redirect` (a host with TLS), the trailing
//! slash dropped unless `preserve-trailing-slash`, `use-port-in-redirects`,
//! `no-tls-redirect-locations` (ACME challenges), and with
//! `use-forwarded-headers` the scheme and host a load balancer reports (no
//! redirect loop behind a TLS-terminating balancer; a forwarded host that
//! is not a host name is not used).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use tests::controller::{ingress, service, wait_until, Controller, INGRESS_CLASS};
use tests::h2_h3::h2_get;
use tests::tls::{handshake, tls_secret, TestCert};
use tests::Upstream;

/// A plain-HTTP GET with `headers`: the status, the `Location` header and
/// the echoed `X-Echo-*` headers (lower-case names).
fn get(port: u16, host: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Option<String>, Vec<(String, String)>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("nginx listens");
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
    let mut location = None;
    let mut echoed = Vec::new();
    for l in lines {
        let Some((k, v)) = l.split_once(':') else { continue };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
        if k == "location" {
            location = Some(v);
        } else if k.starts_with("x-echo-") {
            echoed.push((k, v));
        }
    }
    (status, location, echoed)
}

fn echoed<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn config(forwarded: bool) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{namespace: ingress-nginx, name: ingress-nginx-controller}}\ndata: {{use-forwarded-headers: \"{forwarded}\"}}\n")
}

/// The manifests both tests use: `force.test` (force-ssl-redirect, and an
/// ACME challenge path on it), `keep.test` (force, preserving the slash and
/// naming the port), `secure.test` (TLS, so ssl-redirect by default) and
/// `plain.test` (no redirect at all).
fn manifests(forwarded: bool, up: &Upstream, cert: &TestCert) -> Vec<(&'static str, String)> {
    let force = [("force-ssl-redirect", "true")];
    let keep = [
        ("force-ssl-redirect", "true"),
        ("preserve-trailing-slash", "true"),
        ("use-port-in-redirects", "true"),
    ];
    let secure = ingress("secure", "secure.test", "/", "web", &[]).replacen(
        "spec:\n",
        "spec:\n  tls: [{hosts: [secure.test], secretName: secure-tls}]\n",
        1,
    );
    vec![
        ("class.yaml", INGRESS_CLASS.into()),
        ("config.yaml", config(forwarded)),
        ("svc.yaml", service("web", &[up.port])),
        ("force.yaml", ingress("force", "force.test", "/", "web", &force)),
        (
            "acme.yaml",
            ingress("acme", "force.test", "/.well-known/acme-challenge/tok", "web", &force),
        ),
        ("keep.yaml", ingress("keep", "keep.test", "/", "web", &keep)),
        ("secret.yaml", tls_secret("secure-tls", cert)),
        ("secure.yaml", secure),
        ("plain.yaml", ingress("plain", "plain.test", "/", "web", &[])),
    ]
}

#[test]
fn plain_http_is_redirected_as_ingress_nginx_does() {
    let up = Upstream::start();
    let cert = TestCert::new("secure.test");
    let mut c = Controller::start(&manifests(false, &up, &cert), &[]);
    let conf = c.conf();
    assert!(
        !conf.contains("if ($scheme = http)"),
        "no rewrite-module if per request"
    );
    let port = c.http_port;

    // force-ssl-redirect: 308 (http-redirect-code), the trailing slash
    // dropped, the query kept.
    let (status, location, _) = get(port, "force.test", "/app/", &[]);
    assert_eq!((status, location.as_deref()), (308, Some("https://force.test/app")));
    let (_, location, _) = get(port, "force.test", "/app/?q=1", &[]);
    assert_eq!(location.as_deref(), Some("https://force.test/app/?q=1"));
    let (_, location, _) = get(port, "force.test", "/", &[]);
    assert_eq!(location.as_deref(), Some("https://force.test"));
    // Without use-forwarded-headers the client's X-Forwarded-Proto is not
    // believed, and X-Forwarded-Host is not used.
    let (status, location, _) = get(
        port,
        "force.test",
        "/x",
        &[("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "elsewhere.test")],
    );
    assert_eq!((status, location.as_deref()), (308, Some("https://force.test/x")));
    // no-tls-redirect-locations: the ACME challenge is served over HTTP.
    let (status, location, _) = get(port, "force.test", "/.well-known/acme-challenge/tok", &[]);
    assert_eq!((status, location), (200, None));

    // preserve-trailing-slash and use-port-in-redirects.
    let (status, location, _) = get(port, "keep.test", "/app/", &[]);
    let want = format!("https://keep.test:{}/app/", c.https_port);
    assert_eq!((status, location.as_deref()), (308, Some(want.as_str())));

    // ssl-redirect (default true) on a host with TLS; none without TLS.
    let (status, location, _) = get(port, "secure.test", "/a", &[]);
    assert_eq!((status, location.as_deref()), (308, Some("https://secure.test/a")));
    let (status, location, _) = get(port, "plain.test", "/a", &[]);
    assert_eq!((status, location), (200, None));

    // Over TLS nothing redirects, and the upstream is told https.
    let https = c.https_port;
    assert!(
        wait_until(Duration::from_secs(10), || handshake(https, Some("secure.test"), &[])
            .is_ok_and(|p| p.sha256 == cert.sha256)),
        "{}",
        c.log()
    );
    for host in ["secure.test", "force.test"] {
        let r = h2_get(https, host, "/a/", &[]).unwrap();
        assert_eq!(r.status, 200, "{host}: {r:?}");
        assert_eq!(r.header("x-echo-x-forwarded-proto"), Some("https"));
        assert_eq!(r.header("x-echo-x-scheme"), Some("https"));
    }
    c.stop();
}

#[test]
fn behind_a_load_balancer_the_forwarded_scheme_and_host_decide() {
    let up = Upstream::start();
    let cert = TestCert::new("secure.test");
    let mut c = Controller::start(&manifests(true, &up, &cert), &[]);
    let conf = c.conf();
    assert!(conf.contains("dynamic_balancer_forwarded_headers on;"), "{conf}");
    assert!(conf.contains("dynamic_balancer_https_redirect 308;"), "{conf}");
    let port = c.http_port;

    // TLS ended at the balancer: proxied, not redirected (for force and for
    // ssl-redirect alike), with the balancer's scheme and port passed on.
    for host in ["force.test", "secure.test"] {
        let (status, location, h) = get(
            port,
            host,
            "/a/",
            &[("X-Forwarded-Proto", "https"), ("X-Forwarded-Port", "443")],
        );
        assert_eq!((status, location), (200, None), "{host}");
        assert_eq!(echoed(&h, "x-echo-x-forwarded-proto"), Some("https"));
        assert_eq!(echoed(&h, "x-echo-x-scheme"), Some("https"));
        assert_eq!(echoed(&h, "x-echo-x-forwarded-port"), Some("443"));
    }
    // Plain HTTP at the balancer: redirected to the host it reports.
    let (status, location, _) = get(
        port,
        "force.test",
        "/a/",
        &[
            ("X-Forwarded-Proto", "http"),
            ("X-Forwarded-Host", "www.example.test:8080, inner.test"),
        ],
    );
    assert_eq!((status, location.as_deref()), (308, Some("https://www.example.test/a")));
    // A forwarded host that is not a host name: the request's own host.
    for bad in ["evil.test/path", "a@b.test", "x y"] {
        let (status, location, _) = get(
            port,
            "force.test",
            "/a",
            &[("X-Forwarded-Proto", "http"), ("X-Forwarded-Host", bad)],
        );
        assert_eq!(
            (status, location.as_deref()),
            (308, Some("https://force.test/a")),
            "{bad}"
        );
    }
    // No X-Forwarded-Proto: the connection's own scheme (http here), and
    // the upstream gets this listener's port.
    let (status, location, _) = get(port, "force.test", "/a", &[]);
    assert_eq!((status, location.as_deref()), (308, Some("https://force.test/a")));
    let (status, _, h) = get(port, "plain.test", "/a", &[]);
    assert_eq!(status, 200);
    assert_eq!(echoed(&h, "x-echo-x-forwarded-proto"), Some("http"));
    let own_port = port.to_string();
    assert_eq!(echoed(&h, "x-echo-x-forwarded-port"), Some(own_port.as_str()));
    // Repeated headers are joined as $http_x_forwarded_proto joins them:
    // not exactly "http", so not redirected.
    let (status, _, h) = get(
        port,
        "force.test",
        "/a",
        &[("X-Forwarded-Proto", "https"), ("X-Forwarded-Proto", "http")],
    );
    assert_eq!(status, 200);
    assert_eq!(echoed(&h, "x-echo-x-forwarded-proto"), Some("https, http"));
    // The ACME challenge is never redirected.
    let (status, location, _) = get(
        port,
        "force.test",
        "/.well-known/acme-challenge/tok",
        &[("X-Forwarded-Proto", "http")],
    );
    assert_eq!((status, location), (200, None));
    c.stop();
}

#[test]
fn from_to_www_redirect_sends_the_other_name_to_the_host() {
    let up = Upstream::start();
    let www = [("from-to-www-redirect", "true")];
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc.yaml", service("web", &[up.port])),
            ("shop.yaml", ingress("shop", "shop.test", "/", "web", &www)),
            ("blog.yaml", ingress("blog", "www.blog.test", "/", "web", &www)),
        ],
        &[],
    );
    let port = c.http_port;
    let (status, location, _) = get(port, "www.shop.test", "/cart?item=1", &[]);
    let want = format!("http://shop.test:{port}/cart?item=1");
    assert_eq!((status, location.as_deref()), (308, Some(want.as_str())));
    let (status, location, _) = get(port, "blog.test", "/post", &[]);
    let want = format!("http://www.blog.test:{port}/post");
    assert_eq!((status, location.as_deref()), (308, Some(want.as_str())));
    // The hosts themselves are served.
    assert_eq!(get(port, "shop.test", "/cart", &[]).0, 200);
    assert_eq!(get(port, "www.blog.test", "/post", &[]).0, 200);
    c.stop();
}

#[test]
fn app_root_redirects_the_root_even_when_the_ingress_serves_another_path() {
    let up = Upstream::start();
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc.yaml", service("web", &[up.port])),
            (
                "app.yaml",
                ingress("app", "app.test", "/api", "web", &[("app-root", "/app")]),
            ),
        ],
        &[],
    );
    let port = c.http_port;
    let (status, location, _) = get(port, "app.test", "/", &[]);
    assert_eq!(
        (status, location.as_deref()),
        (302, Some("http://app.test/app")),
        "{}",
        c.log()
    );
    // Only the root: other paths are routed as usual.
    assert_eq!(get(port, "app.test", "/api/x", &[]).0, 200);
    assert_eq!(get(port, "app.test", "/?q=1", &[]).0, 302, "$uri has no query");
    c.stop();
}
