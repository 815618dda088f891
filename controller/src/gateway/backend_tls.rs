//! BackendTLSPolicy: which Service ports Gateway routes reach over TLS,
//! how they are verified, and each policy's conditions.
//!
//! A policy targets Services of its namespace, a port by name
//! (`sectionName`) or every port. On one port a policy naming the port
//! wins over one naming the whole Service; two of the same kind conflict
//! and the older (then the first by namespace and name) wins, the other is
//! `Accepted: False, Conflicted` and does not apply there (its other
//! targets, if any, it still takes: never plain text where a policy
//! exists and no other claims the port). A policy whose CA
//! references all fail (or whose hostname or names are invalid) is
//! `Accepted: False`, and requests to the ports it takes fail (5xx): the
//! spec forbids falling back to plain text or to no verification.
//!
//! What applies goes into the route table (`backendTls`, by backend name),
//! so the module sets up each connection from it: a policy, a CA bundle
//! or a Gateway's client certificate changes live, with no reload.

use std::collections::{BTreeMap, BTreeSet};

use gateway_api_types::backendtlspolicies::{
    BackendTlsPolicy, BackendTlsPolicyValidationSubjectAltNamesType as SanType,
};
use gateway_api_types::gateways::Gateway;
use lua_compat::routes::validate::{check_backend_tls, check_ca_bundle, MAX_CA_BUNDLE};
use lua_compat::routes::{BackendTls, ListenerRoutes, SubjectAltName};

use super::condition::{cond, Cond};
use super::frontend_tls::{is_ca_kind, resolve as resolve_ca, CaRef};
use super::grants::{gateway_secret, SecretRef};
use crate::snapshot::{key, Snapshot};

/// A Service port: `(namespace, service, port)`.
pub type Port = (String, String, u16);

/// What a Service port's connections get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortTls {
    /// TLS as this says (its `backend` is filled in per backend name).
    Valid(BackendTls),
    /// The policy that takes the port is not usable: requests fail.
    Invalid,
}

/// Every policy resolved.
#[derive(Debug, Default)]
pub struct Policies {
    pub ports: BTreeMap<Port, PortTls>,
    /// By `namespace/name`: conditions, and the ports it targets (whether
    /// it won them or not): a Gateway whose routes send to one of them is
    /// an ancestor in its status.
    pub policies: BTreeMap<String, (Vec<Cond>, Vec<Port>)>,
}

/// Resolves every BackendTLSPolicy of the snapshot.
pub fn resolve(snap: &Snapshot) -> Policies {
    let mut sorted: Vec<&BackendTlsPolicy> = snap.backend_tls_policies.iter().map(|p| &**p).collect();
    sorted.sort_by_key(|p| (p.metadata.creation_timestamp.clone(), key(&p.metadata)));
    let mut out = Policies::default();
    // `(namespace, service, sectionName)` → the policy that claimed it.
    let mut claims: BTreeMap<(String, String, Option<String>), String> = BTreeMap::new();
    // Port → (names its port, policy key, what it gives).
    let mut taken: BTreeMap<Port, (bool, PortTls)> = BTreeMap::new();
    for p in sorted {
        let ns = p.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let pkey = key(&p.metadata);
        let mut targets: Vec<(Port, bool)> = Vec::new();
        // The ports of the claims this policy holds (a claim an older
        // policy holds is lost; the others still apply).
        let mut held: Vec<(Port, bool)> = Vec::new();
        let mut conflict: Option<String> = None;
        for t in &p.spec.target_refs {
            if !t.group.is_empty() || t.kind != "Service" {
                continue;
            }
            let Some(svc) = snap
                .services
                .iter()
                .find(|s| s.metadata.namespace.as_deref() == Some(&ns) && s.metadata.name.as_deref() == Some(&t.name))
            else {
                continue;
            };
            let claim = (ns.clone(), t.name.clone(), t.section_name.clone());
            let lost = match claims.get(&claim) {
                Some(owner) if *owner != pkey => {
                    conflict.get_or_insert_with(|| owner.clone());
                    true
                }
                _ => {
                    claims.insert(claim, pkey.clone());
                    false
                }
            };
            for sp in svc.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
                let named = t.section_name.as_deref();
                if named.is_some_and(|n| sp.name.as_deref() != Some(n)) {
                    continue;
                }
                if let Ok(port) = u16::try_from(sp.port) {
                    let target = ((ns.clone(), t.name.clone(), port), named.is_some());
                    if !lost {
                        held.push(target.clone());
                    }
                    targets.push(target);
                }
            }
        }
        let (tls, mut conditions) = validate(snap, p, &ns);
        if let Some(owner) = &conflict {
            conditions.retain(|c| c.type_ != "Accepted");
            conditions.insert(
                0,
                cond(
                    "Accepted",
                    false,
                    "Conflicted",
                    format!("BackendTLSPolicy {owner} is older and targets the same Service (and section); it does not apply there (its other targets it still takes)"),
                ),
            );
        }
        let gives = tls.map_or(PortTls::Invalid, PortTls::Valid);
        for (port, specific) in &held {
            let wins = taken
                .get(port)
                .is_none_or(|(was_specific, _)| *specific && !was_specific);
            if wins {
                taken.insert(port.clone(), (*specific, gives.clone()));
            }
        }
        out.policies
            .insert(pkey, (conditions, targets.into_iter().map(|(p, _)| p).collect()));
    }
    out.ports = taken.into_iter().map(|(port, (_, tls))| (port, tls)).collect();
    out
}

/// A policy's TLS (when usable) and its `Accepted` and `ResolvedRefs`
/// conditions, conflicts aside.
fn validate(snap: &Snapshot, p: &BackendTlsPolicy, ns: &str) -> (Option<BackendTls>, Vec<Cond>) {
    let v = &p.spec.validation;
    let refs = v.ca_certificate_refs.as_deref().unwrap_or_default();
    let mut bundle = String::new();
    let mut problems: Vec<(String, String)> = Vec::new();
    for r in refs {
        let found = if !is_ca_kind(&r.group, &r.kind) {
            Err((
                "InvalidKind".to_string(),
                format!(
                    "CA certificate reference {:?} is a {}{}{}: only core ConfigMaps (with a ca.crt key) and certificates.k8s.io ClusterTrustBundles are supported",
                    r.name,
                    r.group,
                    if r.group.is_empty() { "" } else { "/" },
                    r.kind
                ),
            ))
        } else {
            let reference = CaRef {
                group: &r.group,
                kind: &r.kind,
                name: &r.name,
                namespace: None,
            };
            resolve_ca(snap, ns, &reference)
        };
        match found {
            Ok(pem) if bundle.len() + pem.len() <= MAX_CA_BUNDLE => bundle.push_str(&pem),
            Ok(_) => problems.push((
                "InvalidCACertificateRef".into(),
                format!(
                    "{} {:?}: the CA certificates together are larger than {MAX_CA_BUNDLE} bytes",
                    r.kind, r.name
                ),
            )),
            Err(problem) => problems.push(problem),
        }
    }
    let resolved = match problems.first() {
        None => cond("ResolvedRefs", true, "ResolvedRefs", "every reference resolves"),
        Some((reason, _)) => cond(
            "ResolvedRefs",
            false,
            reason,
            problems.iter().map(|(_, m)| m.as_str()).collect::<Vec<_>>().join("; "),
        ),
    };
    let refused =
        |reason: &str, message: String| (None, vec![cond("Accepted", false, reason, message), resolved.clone()]);
    let ca_certificates = match (refs.is_empty(), v.well_known_ca_certificates.as_deref()) {
        (true, Some("System")) => None,
        (true, Some(other)) => {
            return refused(
                "Invalid",
                format!("wellKnownCACertificates {other:?} is not supported (only System)"),
            )
        }
        (true, None) => {
            return refused(
                "Invalid",
                "validation needs caCertificateRefs or wellKnownCACertificates".into(),
            )
        }
        (false, _) if bundle.is_empty() => {
            return refused(
                "NoValidCACertificate",
                "no CA certificate reference resolves; connections to the targeted ports fail".into(),
            )
        }
        (false, _) => Some(bundle),
    };
    if let Some(e) = ca_certificates.as_deref().and_then(|b| check_ca_bundle(b).err()) {
        return refused("NoValidCACertificate", format!("the CA bundle: {e}"));
    }
    let tls = BackendTls {
        backend: "policy".into(),
        hostname: v.hostname.to_ascii_lowercase(),
        ca_certificates,
        subject_alt_names: v
            .subject_alt_names
            .iter()
            .flatten()
            .filter_map(|s| match s.r#type {
                SanType::Hostname => s
                    .hostname
                    .clone()
                    .map(|h| SubjectAltName::Hostname(h.to_ascii_lowercase())),
                SanType::Uri => s.uri.clone().map(SubjectAltName::Uri),
            })
            .collect(),
    };
    if let Err((field, e)) = check_backend_tls(&tls) {
        return refused("Invalid", format!("validation.{field}: {e}"));
    }
    (
        Some(tls),
        vec![
            cond("Accepted", true, "Accepted", "applied to the targeted ports"),
            resolved,
        ],
    )
}

/// What [`apply`] gives the model.
#[derive(Debug, Default)]
pub struct Applied {
    /// The table's `backendTls`, one per backend name.
    pub entries: Vec<BackendTls>,
    /// Each policy: its conditions and its ancestors (Gateway keys).
    pub status: BTreeMap<String, (Vec<Cond>, BTreeSet<String>)>,
    /// `(object, message)` for the log and Events.
    pub problems: Vec<(String, String)>,
}

/// Puts the policies into the route table's listeners (each with its
/// Gateway's key): each backend (by name) whose Service port a usable
/// policy takes gets its TLS entry; one whose policy is not usable gets
/// none of the requests (500), and a mirror to it is dropped. Records
/// which Gateways send to each policy's ports (its ancestors). `port_of`
/// names a backend's Service port.
pub fn apply<'a>(
    listeners: impl Iterator<Item = (&'a mut ListenerRoutes, &'a str)>,
    policies: &Policies,
    port_of: impl Fn(&str) -> Option<Port>,
) -> Applied {
    let mut entries: BTreeMap<String, BackendTls> = BTreeMap::new();
    let mut gateways_of: BTreeMap<Port, BTreeSet<String>> = BTreeMap::new();
    for (listener, gateway) in listeners {
        let mut usable = |name: &str| -> bool {
            let Some(port) = port_of(name) else { return true };
            let found = policies.ports.get(&port);
            if found.is_some() || policies.policies.values().any(|(_, t)| t.contains(&port)) {
                gateways_of.entry(port).or_default().insert(gateway.to_string());
            }
            match found {
                None => true,
                Some(PortTls::Invalid) => false,
                Some(PortTls::Valid(tls)) => {
                    entries.entry(name.to_string()).or_insert_with(|| BackendTls {
                        backend: name.to_string(),
                        ..tls.clone()
                    });
                    true
                }
            }
        };
        for rule in &mut listener.rules {
            for b in &mut rule.backends {
                if b.backend.as_deref().is_some_and(|n| !usable(n)) {
                    b.backend = None;
                }
            }
            rule.filters.mirrors.retain(|m| usable(&m.backend));
        }
    }
    let mut out = Applied {
        entries: entries.into_values().collect(),
        ..Applied::default()
    };
    for (pkey, (conditions, targets)) in &policies.policies {
        for c in conditions.iter().filter(|c| !c.status) {
            out.problems.push((
                format!("BackendTLSPolicy {pkey}"),
                format!("{}: {}", c.reason, c.message),
            ));
        }
        let ancestors: BTreeSet<String> = targets
            .iter()
            .filter_map(|t| gateways_of.get(t))
            .flatten()
            .cloned()
            .collect();
        out.status.insert(pkey.clone(), (conditions.clone(), ancestors));
    }
    out
}

/// The certificate a Gateway shows backends that ask for one
/// (`spec.tls.backend.clientCertificateRef`), or the Gateway's
/// `ResolvedRefs` reason and message why not.
pub fn client_certificate(
    snap: &Snapshot,
    gateway: &Gateway,
) -> Result<Option<crate::model::tls::Certificate>, (String, String)> {
    let Some(r) = gateway
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.backend.as_ref())
        .and_then(|b| b.client_certificate_ref.as_ref())
    else {
        return Ok(None);
    };
    let gw_ns = gateway.metadata.namespace.as_deref().unwrap_or("default");
    let reference = SecretRef {
        group: r.group.as_deref(),
        kind: r.kind.as_deref(),
        name: &r.name,
        namespace: r.namespace.as_deref(),
    };
    gateway_secret(
        snap,
        "Gateway",
        gw_ns,
        &reference,
        "client certificate ref",
        "InvalidClientCertificateRef",
    )
    .map(Some)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn ca_pem() -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "backend-ca");
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    fn object<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Arc<T> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn service(name: &str, ports: &[(&str, i32)]) -> Arc<k8s_openapi::api::core::v1::Service> {
        object(serde_json::json!({
            "metadata": {"namespace": "infra", "name": name},
            "spec": {"ports": ports.iter().map(|(n, p)| serde_json::json!({"name": n, "port": p})).collect::<Vec<_>>()},
        }))
    }

    fn policy(
        name: &str,
        created: &str,
        service: &str,
        section: Option<&str>,
        validation: serde_json::Value,
    ) -> Arc<BackendTlsPolicy> {
        let mut target = serde_json::json!({"group": "", "kind": "Service", "name": service});
        if let Some(s) = section {
            target["sectionName"] = s.into();
        }
        object(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy",
            "metadata": {"namespace": "infra", "name": name, "creationTimestamp": created},
            "spec": {"targetRefs": [target], "validation": validation},
        }))
    }

    fn valid(hostname: &str) -> serde_json::Value {
        serde_json::json!({"hostname": hostname, "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "ca"}]})
    }

    fn snapshot(policies: Vec<Arc<BackendTlsPolicy>>) -> Snapshot {
        Snapshot {
            services: vec![
                service("web", &[("https-1", 443), ("https-2", 8443)]),
                service("other", &[("btls", 443)]),
            ],
            ca_bundles: vec![object(serde_json::json!({
                "metadata": {"namespace": "infra", "name": "ca"}, "data": {"ca.crt": ca_pem()},
            }))],
            backend_tls_policies: policies,
            ..Default::default()
        }
    }

    fn port(service: &str, p: u16) -> Port {
        ("infra".into(), service.into(), p)
    }

    fn accepted(p: &Policies, name: &str) -> (bool, String) {
        let c = p.policies[&format!("infra/{name}")]
            .0
            .iter()
            .find(|c| c.type_ == "Accepted")
            .unwrap();
        (c.status, c.reason.clone())
    }

    fn hostname(p: &Policies, port: &Port) -> Option<String> {
        match p.ports.get(port)? {
            PortTls::Valid(t) => Some(t.hostname.clone()),
            PortTls::Invalid => Some("<invalid>".into()),
        }
    }

    #[test]
    fn the_older_policy_wins_a_conflict_and_a_named_port_beats_the_whole_service() {
        let t1 = "2026-01-01T00:00:00Z";
        let p = resolve(&snapshot(vec![
            policy("b-whole", t1, "web", None, valid("whole.example.com")),
            policy("a-whole", t1, "web", None, valid("first.example.com")),
            policy(
                "named",
                "2026-02-01T00:00:00Z",
                "web",
                Some("https-2"),
                valid("named.example.com"),
            ),
            policy(
                "named-later",
                "2026-03-01T00:00:00Z",
                "web",
                Some("https-2"),
                valid("late.example.com"),
            ),
        ]));
        // Same age: the first by name takes the Service.
        assert_eq!(accepted(&p, "a-whole"), (true, "Accepted".into()));
        assert_eq!(accepted(&p, "b-whole"), (false, "Conflicted".into()));
        assert_eq!(accepted(&p, "named"), (true, "Accepted".into()));
        assert_eq!(accepted(&p, "named-later"), (false, "Conflicted".into()));
        assert_eq!(hostname(&p, &port("web", 443)).as_deref(), Some("first.example.com"));
        assert_eq!(hostname(&p, &port("web", 8443)).as_deref(), Some("named.example.com"));
        assert_eq!(hostname(&p, &port("other", 443)), None);
    }

    #[test]
    fn a_conflict_on_one_target_leaves_the_others_covered() {
        let mut both = policy("newer", "2026-02-01T00:00:00Z", "web", None, valid("newer.example.com"));
        Arc::get_mut(&mut both).unwrap().spec.target_refs.push(
            serde_json::from_value(serde_json::json!({"group": "", "kind": "Service", "name": "other"})).unwrap(),
        );
        let p = resolve(&snapshot(vec![
            policy("older", "2026-01-01T00:00:00Z", "web", None, valid("older.example.com")),
            both,
        ]));
        assert_eq!(accepted(&p, "newer"), (false, "Conflicted".into()));
        assert_eq!(hostname(&p, &port("web", 443)).as_deref(), Some("older.example.com"));
        // Never plain text where a policy exists and nobody else claims it.
        assert_eq!(hostname(&p, &port("other", 443)).as_deref(), Some("newer.example.com"));
    }

    #[test]
    fn bad_references_fail_closed_with_the_spec_reasons() {
        let p = resolve(&snapshot(vec![
            policy(
                "missing",
                "2026-01-01T00:00:00Z",
                "other",
                Some("btls"),
                serde_json::json!({
                "hostname": "abc.example.com", "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "nope"}]}),
            ),
            policy(
                "kind",
                "2026-01-01T00:00:00Z",
                "web",
                None,
                serde_json::json!({
                "hostname": "abc.example.com", "caCertificateRefs": [{"group": "", "kind": "Secret", "name": "ca"}]}),
            ),
        ]));
        assert_eq!(accepted(&p, "missing"), (false, "NoValidCACertificate".into()));
        let resolved = |name: &str| {
            let c = p.policies[&format!("infra/{name}")]
                .0
                .iter()
                .find(|c| c.type_ == "ResolvedRefs")
                .unwrap();
            (c.status, c.reason.clone())
        };
        assert_eq!(resolved("missing"), (false, "InvalidCACertificateRef".into()));
        assert_eq!(resolved("kind"), (false, "InvalidKind".into()));
        // The ports they take get no plain-text fallback.
        assert_eq!(p.ports.get(&port("other", 443)), Some(&PortTls::Invalid));
        assert_eq!(p.ports.get(&port("web", 8443)), Some(&PortTls::Invalid));
    }

    #[test]
    fn system_cas_and_subject_alt_names_are_carried() {
        let p = resolve(&snapshot(vec![policy(
            "sans",
            "2026-01-01T00:00:00Z",
            "other",
            None,
            serde_json::json!({"hostname": "ABC.example.com", "wellKnownCACertificates": "System", "subjectAltNames": [
                {"type": "Hostname", "hostname": "svc.example.com"}, {"type": "URI", "uri": "spiffe://td/ns/infra"}]}),
        )]));
        let Some(PortTls::Valid(t)) = p.ports.get(&port("other", 443)) else {
            panic!("{:?}", p.policies);
        };
        assert_eq!(t.hostname, "abc.example.com");
        assert_eq!(t.ca_certificates, None);
        assert_eq!(
            t.subject_alt_names,
            vec![
                SubjectAltName::Hostname("svc.example.com".into()),
                SubjectAltName::Uri("spiffe://td/ns/infra".into())
            ]
        );
        // A hostname the module would refuse (an IP address) is refused here.
        let p = resolve(&snapshot(vec![policy(
            "ip",
            "2026-01-01T00:00:00Z",
            "other",
            None,
            serde_json::json!({"hostname": "10.0.0.1", "wellKnownCACertificates": "System"}),
        )]));
        assert_eq!(accepted(&p, "ip"), (false, "Invalid".into()));
    }

    #[test]
    fn a_cluster_trust_bundle_is_a_ca_source() {
        let mut snap = snapshot(vec![policy(
            "ctb",
            "2026-01-01T00:00:00Z",
            "other",
            None,
            serde_json::json!({"hostname": "abc.example.com", "caCertificateRefs": [
                {"group": "certificates.k8s.io", "kind": "ClusterTrustBundle", "name": "roots"}]}),
        )]);
        // Not served (or absent): the reference does not resolve.
        assert_eq!(accepted(&resolve(&snap), "ctb"), (false, "NoValidCACertificate".into()));
        snap.cluster_trust_bundles = vec![object(serde_json::json!({
            "metadata": {"name": "roots"}, "spec": {"trustBundle": ca_pem()}}))];
        let p = resolve(&snap);
        assert_eq!(accepted(&p, "ctb"), (true, "Accepted".into()));
        let Some(PortTls::Valid(t)) = p.ports.get(&port("other", 443)) else {
            panic!("{:?}", p.policies);
        };
        assert!(t
            .ca_certificates
            .as_deref()
            .is_some_and(|c| c.contains("BEGIN CERTIFICATE")));
    }
}
