//! External authentication (`auth-url` and `global-auth-url`) on real
//! nginx with a real auth service: 2xx lets a request through with the
//! auth service's headers, 401 answers 401 or redirects to the sign-in
//! page with the request escaped in `rd`, 403 stays 403, a dead auth
//! service is a 500 (never the backend), cached answers are not asked
//! again, and global authentication honours `enable-global-auth` and
//! `no-auth-locations`.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tests::controller::{ingress, service, Controller, INGRESS_CLASS};
use tests::Upstream;
use tiny_http::{Header, Response, Server};

/// What the auth service saw of one auth request: lower-case header names.
type Seen = Vec<(String, String)>;

/// An auth service: `Authorization: Bearer alice` passes (with
/// `X-Auth-Request-User: alice` and a cookie), `Bearer bob` too without a
/// cookie, `Bearer forbidden` is 403,
/// anything else 401.
struct AuthService {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    server: Arc<Server>,
    thread: Option<JoinHandle<()>>,
}

impl AuthService {
    fn start() -> AuthService {
        let server = Arc::new(Server::http("127.0.0.1:0").unwrap());
        let port = server.server_addr().to_ip().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (server, seen) = (server.clone(), seen.clone());
            std::thread::spawn(move || {
                for request in server.incoming_requests() {
                    let mut headers: Seen = request
                        .headers()
                        .iter()
                        .map(|h| {
                            (
                                h.field.as_str().as_str().to_ascii_lowercase(),
                                h.value.as_str().to_string(),
                            )
                        })
                        .collect();
                    headers.push((":method".into(), request.method().as_str().to_string()));
                    headers.push((":path".into(), request.url().to_string()));
                    let auth = headers
                        .iter()
                        .find(|(k, _)| k == "authorization")
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default();
                    seen.lock().unwrap().push(headers);
                    let response = match auth.as_str() {
                        "Bearer alice" => Response::from_string("ok")
                            .with_header(Header::from_bytes("X-Auth-Request-User", "alice").unwrap())
                            .with_header(Header::from_bytes("Set-Cookie", "_auth=alice").unwrap()),
                        // No cookie: nginx caches only answers without one.
                        "Bearer bob" => Response::from_string("ok")
                            .with_header(Header::from_bytes("X-Auth-Request-User", "bob").unwrap()),
                        "Bearer forbidden" => Response::from_string("no").with_status_code(403),
                        _ => Response::from_string("who?").with_status_code(401),
                    };
                    let _ = request.respond(response);
                }
            })
        };
        AuthService {
            port,
            seen,
            server,
            thread: Some(thread),
        }
    }

    fn hits(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn last(&self) -> Seen {
        self.seen.lock().unwrap().last().cloned().unwrap_or_default()
    }
}

impl Drop for AuthService {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn value<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A GET without following redirects: status and lower-case headers.
fn get(port: u16, host: &str, path: &str, token: Option<&str>) -> (u16, Vec<(String, String)>) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_idle_connections(0)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut req = agent
        .get(&format!("http://127.0.0.1:{port}{path}"))
        .header("Host", host);
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let resp = req.call().expect("nginx answers");
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or_default().to_string()))
        .collect();
    (resp.status().as_u16(), headers)
}

#[test]
fn auth_url_lets_through_what_the_auth_service_allows() {
    let up = Upstream::start();
    let auth = AuthService::start();
    let url = format!("http://127.0.0.1:{}/check?svc=app", auth.port);
    let app = [
        ("auth-url", url.as_str()),
        ("auth-response-headers", "X-Auth-Request-User"),
        ("auth-signin", "https://login.test/start"),
        ("auth-proxy-set-headers", "auth-headers"),
    ];
    let auth_headers = "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: ingress-nginx, name: auth-headers}\ndata: {X-Auth-Tenant: app}\n";
    let cached = [
        ("auth-url", url.as_str()),
        ("auth-cache-key", "$http_authorization"),
        ("auth-cache-duration", "200 1m"),
    ];
    let keep = [
        ("auth-url", url.as_str()),
        ("auth-keepalive", "4"),
        ("auth-method", "HEAD"),
    ];
    let dead_url = format!("http://127.0.0.1:{}/", tests::dead_port());
    let dead = [("auth-url", dead_url.as_str())];
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc.yaml", service("web", &[up.port])),
            ("app.yaml", ingress("app", "app.test", "/", "web", &app)),
            ("auth-headers.yaml", auth_headers.into()),
            ("cached.yaml", ingress("cached", "cached.test", "/", "web", &cached)),
            ("dead.yaml", ingress("dead", "dead.test", "/", "web", &dead)),
            ("keep.yaml", ingress("keep", "keep.test", "/", "web", &keep)),
            ("open.yaml", ingress("open", "open.test", "/", "web", &[])),
        ],
        &[],
    );
    let port = c.http_port;

    // No credentials: the sign-in page, with the request escaped in rd.
    let (status, h) = get(port, "app.test", "/private?a=1&b=2", None);
    assert_eq!(status, 302, "{h:?}\n{}", c.log());
    assert_eq!(
        value(&h, "location"),
        Some("https://login.test/start?rd=http://app.test%2Fprivate%3Fa%3D1%26b%3D2")
    );
    assert_eq!(up.hits(), 0, "the backend never saw it");
    let asked = auth.last();
    assert_eq!(value(&asked, ":path"), Some("/check?svc=app"));
    assert_eq!(value(&asked, "x-original-url"), Some("http://app.test/private?a=1&b=2"));
    assert_eq!(value(&asked, "x-original-method"), Some("GET"));
    assert_eq!(value(&asked, "x-auth-request-redirect"), Some("/private?a=1&b=2"));
    assert_eq!(value(&asked, "host"), Some("127.0.0.1"));
    assert_eq!(value(&asked, "x-auth-tenant"), Some("app"), "auth-proxy-set-headers");

    // Allowed: through, with the auth service's user and cookie.
    let (status, h) = get(port, "app.test", "/private", Some("alice"));
    assert_eq!(status, 200, "{h:?}");
    assert_eq!(value(&h, "x-echo-x-auth-request-user"), Some("alice"));
    assert_eq!(value(&h, "set-cookie"), Some("_auth=alice"));
    assert_eq!(up.hits(), 1);
    // A client cannot forge the header the auth service sets.
    let forged = get(port, "app.test", "/private", Some("mallory"));
    assert_eq!(forged.0, 302);

    // Cached: one auth request for three answers; a 401 is not cached, nor
    // an answer that sets a cookie (nginx's rule for proxy_cache).
    let before = auth.hits();
    for _ in 0..3 {
        assert_eq!(get(port, "cached.test", "/", Some("bob")).0, 200);
    }
    assert_eq!(auth.hits(), before + 1, "200 answers are cached per Authorization");
    assert_eq!(get(port, "cached.test", "/", Some("alice")).0, 200);
    assert_eq!(get(port, "cached.test", "/", Some("alice")).0, 200);
    assert_eq!(auth.hits(), before + 3, "an answer with Set-Cookie is not cached");
    let before = auth.hits();
    for _ in 0..2 {
        assert_eq!(get(port, "cached.test", "/", Some("eve")).0, 401);
    }
    assert_eq!(
        auth.hits(),
        before + 2,
        "401 answers are not cached (auth-cache-duration 200 1m)"
    );

    // Through a keepalive upstream block (auth-keepalive).
    assert_eq!(get(port, "keep.test", "/", Some("alice")).0, 200);
    assert_eq!(value(&auth.last(), ":method"), Some("HEAD"));
    assert_eq!(get(port, "keep.test", "/", None).0, 401);

    // A dead auth service fails closed; an Ingress without auth-url is open.
    let hits = up.hits();
    assert_eq!(get(port, "dead.test", "/", Some("alice")).0, 500);
    assert_eq!(up.hits(), hits);
    assert_eq!(get(port, "open.test", "/", None).0, 200);
    c.stop();
}

#[test]
fn global_auth_with_opt_out_and_exempt_paths() {
    let up = Upstream::start();
    let auth = AuthService::start();
    let cm = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{namespace: ingress-nginx, name: ingress-nginx-controller}}\n\
         data:\n  global-auth-url: \"http://127.0.0.1:{}/global\"\n  global-auth-method: POST\n  \
         no-auth-locations: /public\n",
        auth.port
    );
    let shop = ingress("shop", "shop.test", "/", "web", &[]);
    let public = ingress("public", "shop.test", "/public", "web", &[]);
    let status = ingress("status", "status.test", "/", "web", &[("enable-global-auth", "false")]);
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc.yaml", service("web", &[up.port])),
            ("cm.yaml", cm),
            ("shop.yaml", shop),
            ("public.yaml", public),
            ("status.yaml", status),
        ],
        &[],
    );
    let port = c.http_port;
    assert_eq!(get(port, "shop.test", "/cart", None).0, 401, "{}", c.log());
    assert_eq!(value(&auth.last(), ":method"), Some("POST"));
    assert_eq!(value(&auth.last(), ":path"), Some("/global"));
    assert_eq!(get(port, "shop.test", "/cart", Some("forbidden")).0, 403);
    assert_eq!(get(port, "shop.test", "/cart", Some("alice")).0, 200);
    let asked = auth.hits();
    assert_eq!(get(port, "shop.test", "/public/logo.png", None).0, 200);
    assert_eq!(get(port, "status.test", "/", None).0, 200);
    assert_eq!(
        auth.hits(),
        asked,
        "no-auth-locations and enable-global-auth: false skip it"
    );
    c.stop();
}
