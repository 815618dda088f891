//! BackendTLSPolicy (manifest mode, real nginx, a real TLS backend): a
//! request to a Service port a policy targets goes over TLS with the
//! policy's hostname as SNI, and succeeds only if the backend's chain ends
//! at the policy's CA and its certificate carries the hostname (or one of
//! the subject alternative names); the Gateway's backend client
//! certificate is shown; a policy whose CA does not resolve fails the
//! requests (no plain-text fallback); every change applies with no reload.

use std::time::Duration;

use tests::controller::{request, service, wait_until, Controller};
use tests::free_port;
use tests::tls::{tls_secret, tls_upstream_reporting, TestCa};

fn ca_config_map(name: &str, ca: &TestCa) -> String {
    let indent: String = ca.cert_pem.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{namespace: demo, name: {name}}}\ndata:\n  ca.crt: |\n{indent}"
    )
}

fn gateway(port: u16, client_certificate: bool) -> String {
    let tls = if client_certificate {
        "  tls:\n    backend:\n      clientCertificateRef: {name: gw-client}\n"
    } else {
        ""
    };
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{namespace: demo, name: gw}}\nspec:\n  gatewayClassName: dynamic\n{tls}  listeners:\n  - {{name: http, protocol: HTTP, port: {port}}}\n"
    )
}

/// A ClusterTrustBundle `name` holding `ca`'s certificate.
fn trust_bundle(name: &str, ca: &TestCa) -> String {
    let indent: String = ca.cert_pem.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "apiVersion: certificates.k8s.io/v1beta1\nkind: ClusterTrustBundle\nmetadata: {{name: {name}}}\nspec:\n  trustBundle: |\n{indent}"
    )
}

/// Policy `web-tls` on Service `web`'s port `http`: CA ConfigMap `ca`,
/// `hostname`, and these subject alternative names (YAML flow items).
fn policy(ca: &str, hostname: &str, sans: &str) -> String {
    policy_with(&format!("{{group: \"\", kind: ConfigMap, name: {ca}}}"), hostname, sans)
}

/// Policy `web-tls` with this CA reference (a YAML flow mapping).
fn policy_with(ca_ref: &str, hostname: &str, sans: &str) -> String {
    let sans = if sans.is_empty() {
        String::new()
    } else {
        format!("    subjectAltNames: [{sans}]\n")
    };
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {{namespace: demo, name: web-tls}}\nspec:\n  targetRefs: [{{group: \"\", kind: Service, name: web, sectionName: http}}]\n  validation:\n    caCertificateRefs: [{ca_ref}]\n    hostname: {hostname}\n{sans}"
    )
}

fn route() -> String {
    "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {namespace: demo, name: web}\nspec:\n  parentRefs: [{name: gw}]\n  hostnames: [app.test]\n  rules:\n  - backendRefs: [{name: web, port: 80}]\n".into()
}

#[test]
fn backends_are_reached_over_verified_tls_and_policies_change_without_reload() {
    let backend_ca = TestCa::new("Backend CA");
    let other_ca = TestCa::new("Other CA");
    let client_ca = TestCa::new("Client CA");
    let server = backend_ca.issue_server("backend", &["backend.test"], &["spiffe://demo/web"]);
    let up = tls_upstream_reporting(&server, &client_ca);
    let port = free_port();
    let class = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: dynamic}\nspec: {controllerName: dynamic-balancer.dev/gateway-controller}\n";
    let c = Controller::start(
        &[
            ("class.yaml", class.into()),
            ("ca.yaml", ca_config_map("backend-ca", &backend_ca)),
            ("other.yaml", ca_config_map("other-ca", &other_ca)),
            (
                "client.yaml",
                tls_secret("gw-client", &client_ca.issue("gateway-client")),
            ),
            ("svc.yaml", service("web", &[up])),
            ("gateway.yaml", gateway(port, false)),
            ("route.yaml", route()),
            ("policy.yaml", policy("backend-ca", "backend.test", "")),
        ],
        &[],
    );
    let get = || request(port, "app.test", "/").unwrap_or((0, String::new()));
    assert!(
        wait_until(Duration::from_secs(10), || get().0 == 200),
        "{:?}\n{}",
        get(),
        c.log()
    );
    assert_eq!(
        get().1,
        "sni=backend.test client=none",
        "the policy's hostname is the SNI"
    );
    let reloads = c.reloads();

    // A hostname the certificate does not carry: the handshake is refused.
    c.write("policy.yaml", &policy("backend-ca", "other.test", ""));
    assert!(wait_until(Duration::from_secs(10), || get().0 == 502), "{:?}", get());
    // Subject alternative names instead: a URI the certificate carries.
    c.write(
        "policy.yaml",
        &policy("backend-ca", "other.test", "{type: URI, uri: \"spiffe://demo/web\"}"),
    );
    assert!(wait_until(Duration::from_secs(10), || get().0 == 200), "{:?}", get());
    assert_eq!(get().1, "sni=other.test client=none");
    c.write(
        "policy.yaml",
        &policy(
            "backend-ca",
            "backend.test",
            "{type: URI, uri: \"spiffe://demo/other\"}, {type: Hostname, hostname: other.test}",
        ),
    );
    assert!(wait_until(Duration::from_secs(10), || get().0 == 502), "{:?}", get());

    // Another CA: the backend's chain no longer verifies.
    c.write("policy.yaml", &policy("other-ca", "backend.test", ""));
    assert!(wait_until(Duration::from_secs(10), || get().0 == 502), "{:?}", get());

    // The Gateway's client certificate is shown to the backend.
    c.write("policy.yaml", &policy("backend-ca", "backend.test", ""));
    c.write("gateway.yaml", &gateway(port, true));
    assert!(
        wait_until(Duration::from_secs(10), || get().1
            == "sni=backend.test client=gateway-client"),
        "{:?}",
        get()
    );

    // A ClusterTrustBundle as the CA: read by name, and its rotation
    // applies live.
    c.write("roots.yaml", &trust_bundle("backend-roots", &backend_ca));
    let by_bundle = "{group: certificates.k8s.io, kind: ClusterTrustBundle, name: backend-roots}";
    c.write("policy.yaml", &policy_with(by_bundle, "backend.test", ""));
    c.write("gateway.yaml", &gateway(port, false));
    assert!(
        wait_until(Duration::from_secs(10), || get()
            == (200, "sni=backend.test client=none".into())),
        "{:?}\n{}",
        get(),
        c.log()
    );
    c.write("roots.yaml", &trust_bundle("backend-roots", &other_ca));
    assert!(wait_until(Duration::from_secs(10), || get().0 == 502), "{:?}", get());
    assert_eq!(c.reloads(), reloads, "policy and certificate changes never reload");

    // A CA reference that does not resolve: requests fail, never in the
    // clear or unverified.
    c.write("policy.yaml", &policy("missing-ca", "backend.test", ""));
    assert!(wait_until(Duration::from_secs(10), || get().0 == 500), "{:?}", get());
    assert!(c.log().contains("BackendTLSPolicy"), "{}", c.log());

    // Without a policy the backend is spoken to in the clear (and this TLS
    // backend refuses that).
    c.write("policy.yaml", "");
    assert!(wait_until(Duration::from_secs(10), || get().0 == 502), "{:?}", get());
}
