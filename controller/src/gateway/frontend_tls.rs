//! A Gateway's client certificate validation (`spec.tls.frontend`): the
//! configuration of each HTTPS port (its `perPort` entry, else `default`),
//! its CA references resolved to one PEM bundle, and the listener
//! conditions the spec gives a reference that does not resolve.
//!
//! The bundle goes into the route table (`clientValidation` of the port's
//! server), so a CA or mode change applies live: the module asks for and
//! verifies client certificates per handshake.

use openssl::x509::X509;

use gateway_api_types::gateways::{
    Gateway, GatewayTlsFrontendDefaultValidationMode, GatewayTlsFrontendPerPortTlsValidationMode,
};
use lua_compat::routes::validate::{check_ca_bundle, MAX_CA_BUNDLE};
use lua_compat::routes::{ClientValidation, ValidationMode};

use super::grants::granted_to;
use crate::snapshot::{Snapshot, CA_BUNDLE_KEY};

/// A `ResolvedRefs` reason and message.
pub type Problem = (String, String);

/// What a port's validation comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortValidation {
    /// No validation configured for this port.
    None,
    /// Served with this validation; `problem` when some references (not
    /// all) did not resolve: the listener stays Accepted with
    /// `ResolvedRefs` False.
    Valid {
        validation: ClientValidation,
        problem: Option<Problem>,
    },
    /// No reference resolved: the listener is not Accepted
    /// (`NoValidCACertificate`), with this `ResolvedRefs` reason.
    Invalid(Problem),
}

/// One CA reference, as the default and the per-port lists (and a
/// BackendTLSPolicy, in its own namespace) spell it.
pub(crate) struct CaRef<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
}

/// One validation (the default's or a port's): the generated types spell
/// the two as separate structs of the same shape.
struct Validation<'a> {
    refs: Vec<CaRef<'a>>,
    insecure: bool,
}

/// A [`Validation`] of either generated validation type.
macro_rules! validation {
    ($v:expr, $mode:ident) => {
        Validation {
            refs: $v
                .ca_certificate_refs
                .iter()
                .map(|r| CaRef {
                    group: &r.group,
                    kind: &r.kind,
                    name: &r.name,
                    namespace: r.namespace.as_deref(),
                })
                .collect(),
            insecure: matches!($v.mode, Some($mode::AllowInsecureFallback)),
        }
    };
}

/// The validation each port takes: `(Some(port), its entry)` for the
/// per-port entries, `(None, default)` for the rest. `None` inside: no
/// validation there.
fn validations(gateway: &Gateway) -> Vec<(Option<i32>, Option<Validation<'_>>)> {
    let Some(frontend) = gateway.spec.tls.as_ref().and_then(|t| t.frontend.as_ref()) else {
        return Vec::new();
    };
    let default = frontend
        .default
        .validation
        .as_ref()
        .map(|v| validation!(v, GatewayTlsFrontendDefaultValidationMode));
    frontend
        .per_port
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let v = p.tls.validation.as_ref();
            (
                Some(p.port),
                v.map(|v| validation!(v, GatewayTlsFrontendPerPortTlsValidationMode)),
            )
        })
        .chain(std::iter::once((None, default)))
        .collect()
}

/// The validation of an HTTPS listener on `port`.
pub fn for_port(snap: &Snapshot, gateway: &Gateway, port: i32) -> PortValidation {
    let all = validations(gateway);
    let chosen = all
        .iter()
        .find(|(p, _)| *p == Some(port))
        .or_else(|| all.iter().find(|(p, _)| p.is_none()));
    let Some((_, Some(Validation { refs, insecure }))) = chosen else {
        return PortValidation::None;
    };
    let insecure = *insecure;
    let gw_ns = gateway.metadata.namespace.as_deref().unwrap_or("default");
    let mut bundle = String::new();
    // Every reference that fails is named (the spec asks which and why);
    // the first one's reason is the condition's.
    let mut problems: Vec<Problem> = Vec::new();
    for r in refs {
        match resolve(snap, gw_ns, r) {
            Ok(pem) if bundle.len() + pem.len() <= MAX_CA_BUNDLE => bundle.push_str(&pem),
            Ok(_) => problems.push((
                "InvalidCACertificateRef".to_string(),
                format!(
                    "{} {:?}: the CA certificates together are larger than {MAX_CA_BUNDLE} bytes",
                    r.kind, r.name
                ),
            )),
            Err(p) => problems.push(p),
        }
    }
    let problem = problems.first().map(|(reason, _)| {
        (
            reason.clone(),
            problems.iter().map(|(_, m)| m.as_str()).collect::<Vec<_>>().join("; "),
        )
    });
    if bundle.is_empty() {
        return PortValidation::Invalid(
            problem.unwrap_or_else(|| ("InvalidCACertificateRef".into(), "no CA certificate reference".into())),
        );
    }
    if let Err(e) = check_ca_bundle(&bundle) {
        return PortValidation::Invalid(("InvalidCACertificateRef".into(), format!("the CA bundle: {e}")));
    }
    PortValidation::Valid {
        validation: ClientValidation {
            ca_certificates: bundle,
            mode: if insecure {
                ValidationMode::AllowInsecureFallback
            } else {
                ValidationMode::AllowValidOnly
            },
        },
        problem,
    }
}

/// Whether any of the Gateway's validations lets clients without a valid
/// certificate in (the Gateway's `InsecureFrontendValidationMode`
/// condition).
pub fn insecure_fallback(gateway: &Gateway) -> bool {
    validations(gateway)
        .iter()
        .any(|(_, v)| v.as_ref().is_some_and(|v| v.insecure))
}

/// The group and kind of a ClusterTrustBundle (`certificates.k8s.io`).
pub const TRUST_BUNDLE: (&str, &str) = ("certificates.k8s.io", "ClusterTrustBundle");

/// Whether a reference names a kind this controller reads CA
/// certificates from: a core ConfigMap (its `ca.crt`) or a
/// ClusterTrustBundle (its `spec.trustBundle`).
pub fn is_ca_kind(group: &str, kind: &str) -> bool {
    (group.is_empty() && kind == "ConfigMap") || (group, kind) == TRUST_BUNDLE
}

/// One reference's certificates, re-encoded as PEM (only the
/// certificates: comments and other blocks are dropped).
pub(crate) fn resolve(snap: &Snapshot, gw_ns: &str, r: &CaRef) -> Result<String, Problem> {
    if !is_ca_kind(r.group, r.kind) {
        return Err((
            "InvalidCACertificateKind".into(),
            format!(
                "CA certificate reference {:?} is a {}{}{}: only core ConfigMaps (with a {CA_BUNDLE_KEY} key) and certificates.k8s.io ClusterTrustBundles are supported",
                r.name,
                r.group,
                if r.group.is_empty() { "" } else { "/" },
                r.kind
            ),
        ));
    }
    let invalid = |m: String| ("InvalidCACertificateRef".to_string(), m);
    if (r.group, r.kind) == TRUST_BUNDLE {
        // Cluster-scoped and meant to be read by anyone (CA certificates
        // are public): no ReferenceGrant, and no namespace.
        if let Some(ns) = r.namespace {
            return Err(invalid(format!(
                "ClusterTrustBundle {:?} is cluster-scoped: its reference must not name a namespace ({ns:?})",
                r.name
            )));
        }
        let bundle = snap
            .cluster_trust_bundles
            .iter()
            .find(|b| b.metadata.name.as_deref() == Some(r.name))
            .ok_or_else(|| {
                invalid(format!(
                    "ClusterTrustBundle {:?} does not exist (or the cluster does not serve certificates.k8s.io/v1beta1 ClusterTrustBundles)",
                    r.name
                ))
            })?;
        return certificates(
            &format!("ClusterTrustBundle {}: spec.trustBundle", r.name),
            &bundle.spec.trust_bundle,
        )
        .map_err(invalid);
    }
    let ns = r.namespace.unwrap_or(gw_ns);
    if ns != gw_ns && !granted_to(snap, "Gateway", gw_ns, ns, "ConfigMap", r.name) {
        return Err((
            "RefNotPermitted".into(),
            format!(
                "ConfigMap {ns}/{} is in another namespace and no ReferenceGrant there allows it",
                r.name
            ),
        ));
    }
    let cm = snap
        .ca_bundles
        .iter()
        .find(|c| c.metadata.namespace.as_deref() == Some(ns) && c.metadata.name.as_deref() == Some(r.name))
        .ok_or_else(|| {
            invalid(format!(
                "ConfigMap {ns}/{} does not exist or has no {CA_BUNDLE_KEY} key",
                r.name
            ))
        })?;
    let pem = cm
        .data
        .as_ref()
        .and_then(|d| d.get(CA_BUNDLE_KEY))
        .ok_or_else(|| invalid(format!("ConfigMap {ns}/{} has no {CA_BUNDLE_KEY} key", r.name)))?;
    certificates(&format!("ConfigMap {ns}/{}: {CA_BUNDLE_KEY}", r.name), pem).map_err(invalid)
}

/// The certificates of a PEM text (`what` names it in errors), each
/// parsed and re-encoded; at most [`MAX_CA_BUNDLE`] bytes read.
fn certificates(what: &str, pem: &str) -> Result<String, String> {
    if pem.len() > MAX_CA_BUNDLE {
        return Err(format!("{what} is larger than {MAX_CA_BUNDLE} bytes"));
    }
    let certs = X509::stack_from_pem(pem.as_bytes()).map_err(|e| format!("{what} is not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what} holds no certificate"));
    }
    let mut out = String::new();
    for c in certs {
        let pem = c.to_pem().map_err(|e| e.to_string())?;
        out.push_str(&String::from_utf8_lossy(&pem));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use k8s_openapi::api::certificates::v1beta1::ClusterTrustBundle;

    fn ca_pem(cn: &str) -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    fn config_map(ns: &str, name: &str, data: &[(&str, &str)]) -> Arc<k8s_openapi::api::core::v1::ConfigMap> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": ns, "name": name},
                "data": data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>(),
            }))
            .unwrap(),
        )
    }

    fn gateway(frontend: serde_json::Value) -> Gateway {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"namespace": "infra", "name": "gw"},
            "spec": {"gatewayClassName": "c", "listeners": [], "tls": {"frontend": frontend}},
        }))
        .unwrap()
    }

    fn cm_ref(name: &str) -> serde_json::Value {
        serde_json::json!({"group": "", "kind": "ConfigMap", "name": name})
    }

    #[test]
    fn each_port_takes_its_own_validation_else_the_default() {
        let (a, b) = (ca_pem("ca-a"), ca_pem("ca-b"));
        let snap = Snapshot {
            ca_bundles: vec![
                config_map("infra", "a", &[("ca.crt", &a)]),
                config_map("infra", "b", &[("ca.crt", &format!("# rotated 2026\n{b}"))]),
            ],
            ..Default::default()
        };
        let gw = gateway(serde_json::json!({
            "default": {"validation": {"caCertificateRefs": [cm_ref("a")]}},
            "perPort": [
                {"port": 8443, "tls": {"validation": {"caCertificateRefs": [cm_ref("b")], "mode": "AllowInsecureFallback"}}},
                {"port": 9443, "tls": {}},
            ],
        }));
        let PortValidation::Valid {
            validation,
            problem: None,
        } = for_port(&snap, &gw, 443)
        else {
            panic!("default");
        };
        assert_eq!(validation.mode, ValidationMode::AllowValidOnly);
        assert_eq!(validation.ca_certificates, a.replace("\r\n", "\n"));
        let PortValidation::Valid {
            validation,
            problem: None,
        } = for_port(&snap, &gw, 8443)
        else {
            panic!("per port");
        };
        assert_eq!(validation.mode, ValidationMode::AllowInsecureFallback);
        assert!(
            !validation.ca_certificates.contains("rotated"),
            "only certificates go on"
        );
        // A per-port entry without validation turns it off for that port.
        assert_eq!(for_port(&snap, &gw, 9443), PortValidation::None);
        assert!(insecure_fallback(&gw));
        assert_eq!(
            for_port(&snap, &gateway(serde_json::json!({"default": {}})), 443),
            PortValidation::None
        );
    }

    fn trust_bundle(name: &str, pem: &str) -> Arc<ClusterTrustBundle> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "certificates.k8s.io/v1beta1", "kind": "ClusterTrustBundle",
                "metadata": {"name": name}, "spec": {"trustBundle": pem}}))
            .unwrap(),
        )
    }

    #[test]
    fn cluster_trust_bundles_are_read_by_name_with_no_grant() {
        let (a, b) = (ca_pem("a"), ca_pem("b"));
        let snap = Snapshot {
            cluster_trust_bundles: vec![
                trust_bundle("roots", &format!("{a}\n{b}")),
                trust_bundle("junk", "not a certificate"),
            ],
            ca_bundles: vec![config_map("infra", "extra", &[("ca.crt", &a)])],
            ..Default::default()
        };
        let refs = serde_json::json!([{"group": "certificates.k8s.io", "kind": "ClusterTrustBundle", "name": "roots"}]);
        let PortValidation::Valid {
            validation,
            problem: None,
        } = for_port(
            &snap,
            &gateway(serde_json::json!({"default": {"validation": {"caCertificateRefs": refs}}})),
            443,
        )
        else {
            panic!("a ClusterTrustBundle resolves");
        };
        assert_eq!(validation.ca_certificates.matches("BEGIN CERTIFICATE").count(), 2);
        let junk = serde_json::json!([{"group": "certificates.k8s.io", "kind": "ClusterTrustBundle", "name": "junk"}]);
        assert!(matches!(
            for_port(&snap, &gateway(serde_json::json!({"default": {"validation": {"caCertificateRefs": junk}}})), 443),
            PortValidation::Invalid((r, m)) if r == "InvalidCACertificateRef" && m.contains("ClusterTrustBundle junk: spec.trustBundle")
        ));
    }

    #[test]
    fn hostile_bundles_are_refused_or_normalised() {
        let good = ca_pem("good");
        let crlf = good.replace('\n', "\r\n");
        let huge = format!("{good}{}", "A".repeat(MAX_CA_BUNDLE));
        let snap = Snapshot {
            ca_bundles: vec![
                config_map("infra", "crlf", &[("ca.crt", &crlf)]),
                config_map("infra", "huge", &[("ca.crt", &huge)]),
            ],
            ..Default::default()
        };
        let port = |name: &str| {
            for_port(
                &snap,
                &gateway(serde_json::json!({"default": {"validation": {"caCertificateRefs": [cm_ref(name)]}}})),
                443,
            )
        };
        // Windows line ends: re-encoded, nothing but LF and base64 goes on.
        let PortValidation::Valid {
            validation,
            problem: None,
        } = port("crlf")
        else {
            panic!("crlf");
        };
        assert!(!validation.ca_certificates.contains('\r'));
        assert!(
            matches!(port("huge"), PortValidation::Invalid((r, m)) if r == "InvalidCACertificateRef" && m.contains("larger"))
        );
    }

    #[test]
    fn references_that_do_not_resolve_say_why() {
        let good = ca_pem("good");
        let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
        let snap = Snapshot {
            ca_bundles: vec![
                config_map("infra", "good", &[("ca.crt", &good)]),
                config_map("infra", "junk", &[("ca.crt", "not a certificate")]),
                config_map("infra", "key", &[("ca.crt", &key)]),
                config_map("other", "elsewhere", &[("ca.crt", &good)]),
            ],
            ..Default::default()
        };
        let reason = |refs: serde_json::Value| match for_port(
            &snap,
            &gateway(serde_json::json!({"default": {"validation": {"caCertificateRefs": refs}}})),
            443,
        ) {
            PortValidation::Invalid((reason, message)) => format!("{reason}: {message}"),
            other => panic!("{other:?}"),
        };
        assert!(reason(serde_json::json!([cm_ref("missing")])).starts_with("InvalidCACertificateRef"));
        assert!(reason(serde_json::json!([cm_ref("junk")])).starts_with("InvalidCACertificateRef"));
        assert!(reason(serde_json::json!([cm_ref("key")])).starts_with("InvalidCACertificateRef"));
        assert!(
            reason(serde_json::json!([{"group": "", "kind": "Secret", "name": "good"}]))
                .starts_with("InvalidCACertificateKind")
        );
        let bundle_ref = |name: &str| serde_json::json!([{"group": "certificates.k8s.io", "kind": "ClusterTrustBundle", "name": name}]);
        assert!(reason(bundle_ref("absent")).contains("ClusterTrustBundle \"absent\" does not exist"));
        assert!(reason(serde_json::json!([
            {"group": "certificates.k8s.io", "kind": "ClusterTrustBundle", "name": "roots", "namespace": "infra"}
        ]))
        .contains("cluster-scoped"));
        assert!(
            reason(serde_json::json!([{"group": "example.com", "kind": "ClusterTrustBundle", "name": "roots"}]))
                .starts_with("InvalidCACertificateKind"),
            "the group counts"
        );
        let across = serde_json::json!([{"group": "", "kind": "ConfigMap", "name": "elsewhere", "namespace": "other"}]);
        assert!(reason(across.clone()).starts_with("RefNotPermitted"));

        // One good reference among bad ones: served, ResolvedRefs False.
        let gw = gateway(serde_json::json!({"default": {"validation": {
            "caCertificateRefs": [cm_ref("missing"), cm_ref("good")]}}}));
        let PortValidation::Valid {
            problem: Some((reason, _)),
            ..
        } = for_port(&snap, &gw, 443)
        else {
            panic!("partial");
        };
        assert_eq!(reason, "InvalidCACertificateRef");

        // A ReferenceGrant from Gateways of `infra` lets the other one in.
        let grant: gateway_api_types::referencegrants::ReferenceGrant = serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"namespace": "other", "name": "g"},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "infra"}],
                     "to": [{"group": "", "kind": "ConfigMap"}]},
        }))
        .unwrap();
        let granted = Snapshot {
            reference_grants: vec![Arc::new(grant)],
            ..snap.clone()
        };
        let gw = gateway(serde_json::json!({"default": {"validation": {"caCertificateRefs": across}}}));
        assert!(matches!(
            for_port(&granted, &gw, 443),
            PortValidation::Valid { problem: None, .. }
        ));
    }
}
