//! TLS through the controller: Secrets pushed to the module, every host on
//! the HTTPS port, a renewed Secret served from the next handshake with no
//! reload, HTTP/2 by ALPN, and no tenant key on disk; requests over
//! HTTP/2 and HTTP/3 (QUIC) routed by the module.

use std::time::Duration;

use tests::controller::{ingress, service, wait_until, Controller};
use tests::h2_h3::{h2_get, h3_get};
use tests::tls::{handshake, tls_secret, TestCert};
use tests::Upstream;

fn tls_ingress(name: &str, host: &str, secret: &str) -> String {
    let plain = ingress(name, host, "/", "a", &[]);
    plain.replacen(
        "spec:\n",
        &format!("spec:\n  tls: [{{hosts: [{host}], secretName: {secret}}}]\n"),
        1,
    )
}

fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[test]
fn secrets_are_served_by_sni_and_a_renewal_never_reloads() {
    let up = Upstream::start();
    let (v1, v2, other) = (
        TestCert::new("secure.test"),
        TestCert::new("secure.test"),
        TestCert::rsa("other.test"),
    );
    let mut c = Controller::start(
        &[
            ("svc.yaml", service("a", &[up.port])),
            ("secret.yaml", tls_secret("secure-tls", &v1)),
            ("other-secret.yaml", tls_secret("other-tls", &other)),
            ("secure.yaml", tls_ingress("secure", "secure.test", "secure-tls")),
            ("other.yaml", tls_ingress("other", "other.test", "other-tls")),
            ("plain.yaml", ingress("plain", "plain.test", "/", "a", &[])),
        ],
        &[],
    );
    let port = c.https_port;
    assert!(
        wait_until(Duration::from_secs(10), || handshake(port, Some("secure.test"), &[])
            .is_ok_and(|p| p.sha256 == v1.sha256)),
        "{}",
        c.log()
    );
    assert_eq!(
        handshake(port, Some("other.test"), &["h2", "http/1.1"]).unwrap().sha256,
        other.sha256
    );
    // A host without a Secret, and no SNI at all: the generated default.
    let fake = handshake(port, Some("plain.test"), &[]).unwrap();
    assert_eq!(fake.cn, "Kubernetes Ingress Controller Fake Certificate");
    assert_eq!(handshake(port, None, &[]).unwrap().cn, fake.cn);
    // HTTP/2 is offered by ALPN (use-http2 defaults to true).
    assert_eq!(
        handshake(port, Some("secure.test"), &["h2", "http/1.1"])
            .unwrap()
            .alpn
            .as_deref(),
        Some("h2")
    );

    let reloads = c.reloads();
    let workers = c.worker_pids();
    c.write("secret.yaml", &tls_secret("secure-tls", &v2));
    assert!(
        wait_until(Duration::from_secs(10), || handshake(port, Some("secure.test"), &[])
            .is_ok_and(|p| p.sha256 == v2.sha256)),
        "renewal not served: {}",
        c.log()
    );
    assert_eq!(c.reloads(), reloads, "a renewed Secret reloaded nginx");
    assert_eq!(c.worker_pids(), workers);

    // The module lists it; no key in the listing, none on disk but the
    // controller's own default certificate.
    let (code, body) = c.api_get("/configuration/certificates").unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("demo_secure-tls") && body.contains(&v2.sha256), "{body}");
    assert!(!body.contains("PRIVATE"));
    let mut files = Vec::new();
    walk(c.dir.path(), &mut files);
    for f in files.iter().filter(|f| !f.starts_with(&c.manifests)) {
        let text = String::from_utf8_lossy(&std::fs::read(f).unwrap_or_default()).into_owned();
        for cert in [&v1, &v2, &other] {
            assert!(
                !text.contains(&cert.key_material()[..40]),
                "a Secret's key is on disk in {}",
                f.display()
            );
        }
    }

    // The Secret goes: its host falls back to the default, still no reload
    // for the certificate itself.
    c.remove("other-secret.yaml");
    assert!(
        wait_until(Duration::from_secs(10), || handshake(port, Some("other.test"), &[])
            .is_ok_and(|p| p.cn == fake.cn)),
        "{}",
        c.log()
    );
    c.stop();
}

#[test]
fn http2_and_http3_requests_are_routed_by_the_module() {
    let (a, b) = (Upstream::start(), Upstream::start());
    let cert = TestCert::new("secure.test");
    let config = "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: ingress-nginx, name: ingress-nginx-controller}\ndata: {worker-processes: \"2\", use-http3: \"true\"}\n";
    let mut c = Controller::start(
        &[
            ("class.yaml", tests::controller::INGRESS_CLASS.into()),
            ("config.yaml", config.into()),
            ("svc.yaml", service("a", &[a.port, b.port])),
            ("secret.yaml", tls_secret("secure-tls", &cert)),
            ("secure.yaml", tls_ingress("secure", "secure.test", "secure-tls")),
            ("plain.yaml", ingress("plain", "plain.test", "/", "a", &[])),
        ],
        &[],
    );
    let conf = c.conf();
    assert!(conf.contains("quic reuseport default_server;"), "{conf}");
    let port = c.https_port;
    assert!(
        wait_until(Duration::from_secs(10), || handshake(port, Some("secure.test"), &[])
            .is_ok_and(|p| p.sha256 == cert.sha256)),
        "{}",
        c.log()
    );

    // HTTP/2 on TLS: routed, told it came over https, offered HTTP/3.
    let r = h2_get(port, "secure.test", "/", &[]).unwrap();
    assert_eq!((r.status, r.version), (200, http::Version::HTTP_2), "{r:?}");
    let body = String::from_utf8_lossy(&r.body).into_owned();
    assert!(body == a.identity || body == b.identity, "{body}");
    assert_eq!(r.header("x-echo-x-forwarded-proto"), Some("https"));
    assert_eq!(r.header("alt-svc"), Some(format!("h3=\":{port}\"; ma=86400").as_str()));
    assert!(
        r.header("strict-transport-security").is_some(),
        "HSTS on a host with a certificate"
    );
    // A host without its own certificate gets no HSTS.
    let plain = h2_get(port, "plain.test", "/", &[]).unwrap();
    assert_eq!(plain.status, 200);
    assert!(plain.header("strict-transport-security").is_none());

    // HTTP/3 over QUIC: both endpoints serve, by the module's round-robin.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let r = h3_get(port, "secure.test", "/", &[("x-request-id", "h3-client-id")]).unwrap_or_else(|e| {
            let mut files = Vec::new();
            walk(c.dir.path(), &mut files);
            let logs: String = files
                .iter()
                .filter(|f| f.extension().is_some_and(|x| x == "log"))
                .map(|f| std::fs::read_to_string(f).unwrap_or_default())
                .collect();
            panic!("HTTP/3: {e}\n{logs}")
        });
        assert_eq!((r.status, r.version), (200, http::Version::HTTP_3), "{r:?}");
        assert_eq!(r.header("x-echo-x-request-id"), Some("h3-client-id"));
        seen.insert(String::from_utf8_lossy(&r.body).into_owned());
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    c.stop();
}
