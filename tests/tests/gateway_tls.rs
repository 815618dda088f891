//! Client certificate validation on a Gateway's HTTPS listener
//! (`spec.tls.frontend`, manifest mode, real nginx): a certificate of the
//! CA a ConfigMap holds passes, none or another CA's fails the handshake;
//! `AllowInsecureFallback` lets both in; a per-port entry applies to its
//! port only; the CA, the mode and the per-port entry change with no
//! reload.

use std::time::Duration;

use tests::controller::{service, wait_until, Controller};
use tests::tls::{https_get, tls_secret, TestCa, TestCert};
use tests::{free_port, Upstream};

fn ca_config_map(name: &str, ca: &TestCa) -> String {
    let indent: String = ca.cert_pem.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{namespace: demo, name: {name}}}\ndata:\n  ca.crt: |\n{indent}"
    )
}

/// Gateway `demo/gw`: HTTPS on `port` and `second`, the default
/// validation from ConfigMap `default_ca` in `mode`, and `second` with
/// its own CA `second-ca` when `per_port` is set.
fn gateway(port: u16, second: u16, default_ca: &str, mode: &str, per_port: bool) -> String {
    let per_port = if per_port {
        format!(
            "      perPort:\n      - port: {second}\n        tls:\n          validation:\n            caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: second-ca}}]\n"
        )
    } else {
        String::new()
    };
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{namespace: demo, name: gw}}\nspec:\n  gatewayClassName: dynamic\n  tls:\n    frontend:\n      default:\n        validation:\n          mode: {mode}\n          caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: {default_ca}}}]\n{per_port}  listeners:\n  - {{name: https, protocol: HTTPS, port: {port}, tls: {{certificateRefs: [{{name: site}}]}}}}\n  - {{name: second, protocol: HTTPS, port: {second}, tls: {{certificateRefs: [{{name: site}}]}}}}\n"
    )
}

fn route() -> String {
    "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {namespace: demo, name: web}\nspec:\n  parentRefs: [{name: gw}]\n  hostnames: [secure.test]\n  rules:\n  - backendRefs: [{name: web, port: 80}]\n".into()
}

/// The status of a request presenting `client`, or 0 when the handshake
/// or the request failed.
fn status(port: u16, client: Option<&TestCert>) -> u16 {
    https_get(port, "secure.test", "/", client).map_or(0, |(s, _)| s)
}

#[test]
fn client_certificates_are_validated_per_port_and_change_without_reload() {
    let up = Upstream::start();
    let partners = TestCa::new("Partners CA");
    let others = TestCa::new("Others CA");
    let (port, second) = (free_port(), free_port());
    let class = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: dynamic}\nspec: {controllerName: dynamic-balancer.dev/gateway-controller}\n";
    let c = Controller::start(
        &[
            ("class.yaml", class.into()),
            ("site.yaml", tls_secret("site", &TestCert::new("secure.test"))),
            ("partners.yaml", ca_config_map("partners-ca", &partners)),
            ("second.yaml", ca_config_map("second-ca", &others)),
            ("svc.yaml", service("web", &[up.port])),
            (
                "gateway.yaml",
                gateway(port, second, "partners-ca", "AllowValidOnly", false),
            ),
            ("route.yaml", route()),
        ],
        &[],
    );
    let partner = partners.issue("partner1");
    let stranger = others.issue("stranger");
    let forged = TestCert::new("partner1");
    assert!(
        wait_until(Duration::from_secs(10), || status(port, Some(&partner)) == 200),
        "{}",
        c.log()
    );
    assert_eq!(status(second, Some(&partner)), 200, "the default applies to every port");
    for client in [None, Some(&stranger), Some(&forged)] {
        assert_eq!(
            status(port, client),
            0,
            "the handshake fails without a valid certificate"
        );
    }
    let hits = up.hits();
    let reloads = c.reloads();

    // The second port gets its own CA: partners' certificates stop there.
    c.write(
        "gateway.yaml",
        &gateway(port, second, "partners-ca", "AllowValidOnly", true),
    );
    assert!(wait_until(Duration::from_secs(10), || status(second, Some(&stranger)) == 200));
    assert_eq!(status(second, Some(&partner)), 0);
    assert_eq!(status(port, Some(&partner)), 200);

    // The CA's ConfigMap is rotated to the other CA.
    c.write("partners.yaml", &ca_config_map("partners-ca", &others));
    assert!(wait_until(Duration::from_secs(10), || status(port, Some(&stranger)) == 200));
    assert_eq!(status(port, Some(&partner)), 0);

    // AllowInsecureFallback: asked for, but nobody is turned away.
    c.write(
        "gateway.yaml",
        &gateway(port, second, "partners-ca", "AllowInsecureFallback", true),
    );
    assert!(wait_until(Duration::from_secs(10), || status(port, None) == 200));
    assert_eq!(status(port, Some(&forged)), 200);
    assert_eq!(status(port, Some(&partner)), 200);
    assert_eq!(status(second, None), 0, "the per-port entry stays AllowValidOnly");
    assert_eq!(c.reloads(), reloads, "validation changes never reload");
    assert!(up.hits() > hits);

    // A CA reference that does not resolve: the listener is not served
    // (no handshake completes), and the log says why.
    c.write(
        "gateway.yaml",
        &gateway(port, second, "missing-ca", "AllowValidOnly", true),
    );
    assert!(wait_until(Duration::from_secs(10), || status(port, Some(&stranger)) == 0));
    assert!(c.log().contains("no valid client CA certificate"), "{}", c.log());
    assert_eq!(status(second, Some(&stranger)), 200, "the other port is not affected");
}
