//! Client certificates (`auth-tls-*`) on real nginx: a CA and client
//! certificates made here; a certificate of the CA with an allowed subject
//! passes (its details reach the upstream), another subject is 403, none or
//! a stranger's goes to the error page, plain HTTP is 403, and another
//! Ingress asking for another CA on the host fails closed.

use tests::controller::{ingress, service, Controller, INGRESS_CLASS};
use tests::tls::{https_get, TestCa, TestCert};
use tests::Upstream;

fn ca_secret(name: &str, ca: &TestCa) -> String {
    let indent: String = ca.cert_pem.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{namespace: demo, name: {name}}}\ntype: Opaque\nstringData:\n  ca.crt: |\n{indent}"
    )
}

#[test]
fn client_certificates_are_verified_against_the_ingress_ca() {
    let up = Upstream::start();
    let ca = TestCa::new("Partners CA");
    let other = TestCa::new("Other CA");
    let tls = [
        ("auth-tls-secret", "demo/partners-ca"),
        ("auth-tls-verify-client", "on"),
        ("auth-tls-match-cn", "CN=(partner1|partner2)$"),
        ("auth-tls-pass-certificate-to-upstream", "true"),
        ("auth-tls-error-page", "https://help.test/certificates"),
    ];
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc.yaml", service("web", &[up.port])),
            ("ca.yaml", ca_secret("partners-ca", &ca)),
            ("other-ca.yaml", ca_secret("other-ca", &other)),
            ("api.yaml", ingress("api", "partners.test", "/api", "web", &tls)),
            (
                "other.yaml",
                ingress(
                    "other",
                    "partners.test",
                    "/other",
                    "web",
                    &[("auth-tls-secret", "other-ca")],
                ),
            ),
        ],
        &[],
    );
    let port = c.https_port;
    let partner = ca.issue("partner1");
    let (status, text) = https_get(port, "partners.test", "/api/orders", Some(&partner)).unwrap();
    assert_eq!(status, 200, "{text}\n{}", c.log());
    assert!(text.contains("X-Echo-ssl-client-verify: SUCCESS"), "{text}");
    assert!(text.contains("X-Echo-ssl-client-subject-dn: CN=partner1"), "{text}");
    assert!(text.contains("X-Echo-ssl-client-issuer-dn: CN=Partners CA"), "{text}");
    assert!(
        text.contains("X-Echo-ssl-client-cert: -----BEGIN%20CERTIFICATE"),
        "{text}"
    );

    // A certificate of the CA, but not an allowed subject.
    let (status, _) = https_get(port, "partners.test", "/api/orders", Some(&ca.issue("partner10"))).unwrap();
    assert_eq!(status, 403);
    // No certificate, another CA's, a self-signed one: the error page.
    let stranger = other.issue("partner1");
    let forged = TestCert::new("partner1");
    for client in [None, Some(&stranger), Some(&forged)] {
        let (status, text) = https_get(port, "partners.test", "/api/orders", client).unwrap();
        assert_eq!(status, 302, "{text}");
        assert!(text.contains("Location: https://help.test/certificates"), "{text}");
    }
    // Plain HTTP has no certificate: 403, never the backend.
    let hits = up.hits();
    assert_eq!(c.get("partners.test", "/api/orders").0, 403);
    // Another Ingress cannot bring its own CA to this host: closed.
    let (status, _) = https_get(port, "partners.test", "/other", Some(&other.issue("x"))).unwrap();
    assert_eq!(status, 302, "the host's CA applies to the handshake");
    let (status, _) = https_get(port, "partners.test", "/other", Some(&partner)).unwrap();
    assert_eq!(status, 503);
    assert_eq!(up.hits(), hits);
    c.stop();
}
