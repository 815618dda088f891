//! The series a model determines: the certificates served
//! (`ssl_expire_time_seconds`, `ssl_certificate_info`) and the Ingresses
//! left without a Service or endpoints (`orphan_ingress`). Pure: the model
//! in, the series out; [`super::Metrics::observe_model`] sets them.

use std::collections::BTreeMap;

use crate::model::Model;

/// One host's certificate, with ingress-nginx's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateSeries {
    /// The Secret's namespace and name.
    pub namespace: String,
    pub secret_name: String,
    /// `--controller-class`.
    pub class: String,
    /// The server name (`_`: the default server's, from
    /// `--default-ssl-certificate`).
    pub host: String,
    pub identifier: String,
    pub issuer_organization: String,
    pub issuer_common_name: String,
    pub serial_number: String,
    pub public_key_algorithm: String,
    /// Seconds since 1970.
    pub not_after: i64,
}

/// Every host served with a certificate, as the module's servers map has
/// them (aliases and `www` redirects included).
pub fn certificate_series(model: &Model, class: &str) -> Vec<CertificateSeries> {
    model
        .tls_hosts
        .iter()
        .filter_map(|(host, id)| {
            let pair = model.certificates.get(id)?;
            // `<namespace>_<secret>`: `_` is in neither name. An id
            // shortened for length keeps its namespace whole.
            let (namespace, secret_name) = id.split_once('_').unwrap_or(("", id));
            let leaf = &pair.leaf;
            Some(CertificateSeries {
                namespace: namespace.to_string(),
                secret_name: secret_name.to_string(),
                class: class.to_string(),
                host: host.clone(),
                identifier: leaf.identifier.clone(),
                issuer_organization: leaf.issuer_organization.clone(),
                issuer_common_name: leaf.issuer_common_name.clone(),
                serial_number: leaf.serial_number.clone(),
                public_key_algorithm: leaf.public_key_algorithm.clone(),
                not_after: leaf.not_after,
            })
        })
        .collect()
}

/// Whether an Ingress routes to a Service that does not exist, or to one
/// with no ready endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub namespace: String,
    pub ingress: String,
    pub no_service: bool,
    pub no_endpoint: bool,
}

/// Every Ingress of the running structure, orphaned or not: ingress-nginx
/// keeps a series at 0 for an Ingress that is no longer orphaned.
pub fn orphans(model: &Model) -> Vec<Orphan> {
    let Some(structure) = &model.structure else {
        return Vec::new();
    };
    let mut by_ingress: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
    for location in structure.servers.iter().flat_map(|s| &s.locations) {
        if location.ingress.is_empty() {
            continue;
        }
        let backend = location.backend.as_str();
        let missing = model
            .backend_problems
            .get(backend)
            .is_some_and(|reports| reports.iter().any(|r| r.what == "service"));
        let empty = model.backends.get(backend).is_none_or(|b| b.endpoints.is_empty());
        let e = by_ingress.entry(location.ingress.as_str()).or_default();
        e.0 |= missing;
        e.1 |= empty && !missing;
    }
    by_ingress
        .into_iter()
        .filter_map(|(key, (no_service, no_endpoint))| {
            let (namespace, ingress) = key.split_once('/')?;
            Some(Orphan {
                namespace: namespace.to_string(),
                ingress: ingress.to_string(),
                no_service,
                no_endpoint,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::BuildOptions;
    use crate::snapshot::Snapshot;

    fn ingress(name: &str, svc: &str, tls: Option<&str>) -> serde_json::Value {
        let mut spec = serde_json::json!({
            "rules": [{"host": format!("{name}.example"), "http": {"paths": [{
                "path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": svc, "port": {"number": 80}}}
            }]}}]
        });
        if let Some(secret) = tls {
            spec["tls"] = serde_json::json!([{"hosts": [format!("{name}.example")], "secretName": secret}]);
        }
        serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"namespace": "shop", "name": name,
                "annotations": {"kubernetes.io/ingress.class": "nginx"}},
            "spec": spec
        })
    }

    #[test]
    fn orphans_and_certificates_follow_the_model() {
        let (crt, key) = crate::model::tls::tests::self_signed("tls.example", -1, 30);
        let mut snap = Snapshot::default();
        for i in [
            ingress("up", "web", None),
            ingress("gone", "nothing", None),
            ingress("idle", "idle", None),
            ingress("tls", "web", Some("tls-cert")),
        ] {
            snap.ingresses
                .push(std::sync::Arc::new(serde_json::from_value(i).unwrap()));
        }
        for svc in ["web", "idle"] {
            snap.services.push(std::sync::Arc::new(
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": {"namespace": "shop", "name": svc},
                    "spec": {"ports": [{"port": 80}]}
                }))
                .unwrap(),
            ));
        }
        snap.slices.push(std::sync::Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"namespace": "shop", "name": "web-1",
                    "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "ports": [{"port": 8080}],
                "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}}]
            }))
            .unwrap(),
        ));
        let mut secret = k8s_openapi::api::core::v1::Secret::default();
        secret.metadata.namespace = Some("shop".into());
        secret.metadata.name = Some("tls-cert".into());
        secret.data = Some(
            [
                ("tls.crt".to_string(), k8s_openapi::ByteString(crt)),
                ("tls.key".to_string(), k8s_openapi::ByteString(key)),
            ]
            .into(),
        );
        snap.secrets.push(std::sync::Arc::new(secret));
        let model = crate::model::build(&snap, &BuildOptions::default());

        let got: Vec<(String, bool, bool)> = orphans(&model)
            .into_iter()
            .map(|o| (o.ingress, o.no_service, o.no_endpoint))
            .collect();
        assert_eq!(
            got,
            [
                ("gone".to_string(), true, false),
                ("idle".to_string(), false, true),
                ("tls".to_string(), false, false),
                ("up".to_string(), false, false)
            ]
        );

        let certs = certificate_series(&model, "k8s.io/ingress-nginx");
        assert_eq!(certs.len(), 1, "{certs:?}");
        let c = &certs[0];
        assert_eq!(
            (c.namespace.as_str(), c.secret_name.as_str(), c.host.as_str()),
            ("shop", "tls-cert", "tls.example")
        );
        assert_eq!(c.public_key_algorithm, "ECDSA");
        assert_eq!(c.issuer_common_name, "tls.example");
        assert!(c.identifier.starts_with('-') && c.identifier.len() > 1, "{c:?}");
        let in_30_days = super::super::unix_now() as i64 + 30 * 86_400;
        assert!((c.not_after - in_30_days).abs() < 120, "{c:?}");

        // Set on the metrics, then taken away with what the model drops.
        let m = super::super::Metrics::default();
        m.observe_model(&model);
        let text = m.encode();
        assert!(
            text.contains("ssl_expire_time_seconds{class=\"k8s.io/ingress-nginx\",host=\"tls.example\""),
            "{text}"
        );
        assert!(
            text.contains("ingress=\"gone\",namespace=\"shop\",type=\"no-service\"} 1\n"),
            "{text}"
        );
        m.observe_model(&crate::model::Model::default());
        let text = m.encode();
        assert!(!text.contains("ssl_expire_time_seconds{"), "{text}");
        assert!(!text.contains("ssl_certificate_info{"), "{text}");
        assert!(!text.contains("orphan_ingress{"), "{text}");
    }
}
