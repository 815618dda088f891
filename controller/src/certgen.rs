//! `ingress-controller certgen create|patch`: the webhook's certificate, as
//! ingress-nginx's kube-webhook-certgen jobs make it, so that the chart
//! needs no second image.
//!
//! `create` makes a CA and a serving certificate for the webhook Service's
//! DNS names and stores them in a Secret (`ca`, `cert`, `key`), unless the
//! Secret exists (a re-install or upgrade keeps the certificate the
//! apiserver already trusts). `patch` copies the CA into the `caBundle` of
//! every webhook of a ValidatingWebhookConfiguration.

use std::collections::BTreeMap;

use anyhow::Context as _;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

/// PEM texts of a new CA and a serving certificate signed by it.
pub struct Generated {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

/// A CA and a certificate for `hosts` (DNS names or IPs), valid ten years:
/// the Secret outlives many upgrades, and rotating means deleting it.
pub fn generate(hosts: &[String]) -> anyhow::Result<Generated> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    anyhow::ensure!(!hosts.is_empty(), "--host names at least one DNS name");
    let not_before = time_now();
    let not_after = not_before + std::time::Duration::from_secs(10 * 365 * 24 * 3600);

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ingress-controller-webhook-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params.not_before = not_before.into();
    ca_params.not_after = not_after.into();
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(hosts.to_vec()).context("invalid --host")?;
    params.distinguished_name.push(DnType::CommonName, hosts[0].as_str());
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Generated {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

fn time_now() -> std::time::SystemTime {
    // A minute back, for nodes whose clocks trail.
    std::time::SystemTime::now() - std::time::Duration::from_secs(60)
}

/// Creates the Secret unless it exists. Returns whether it was created.
pub async fn create(client: kube::Client, namespace: &str, name: &str, hosts: &[String]) -> anyhow::Result<bool> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    if api.get_opt(name).await?.is_some() {
        tracing::info!(secret = %format!("{namespace}/{name}"), "the webhook certificate Secret exists; kept");
        return Ok(false);
    }
    let g = generate(hosts)?;
    let data: BTreeMap<String, ByteString> = [("ca", g.ca), ("cert", g.cert), ("key", g.key)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
        .collect();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(secret = %format!("{namespace}/{name}"), "created the webhook certificate Secret");
            Ok(true)
        }
        // Another job won the race: its certificate stands.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Sets `caBundle` on every webhook of `webhook_name` from the Secret's `ca`.
pub async fn patch(client: kube::Client, namespace: &str, secret: &str, webhook_name: &str) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let s = secrets
        .get(secret)
        .await
        .with_context(|| format!("reading Secret {namespace}/{secret}"))?;
    let ca = s
        .data
        .as_ref()
        .and_then(|d| d.get("ca"))
        .context("the Secret has no `ca` key")?
        .clone();
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    // Read-modify-write with the resourceVersion; retried on a conflict.
    for _ in 0..5 {
        let mut vwc = api
            .get(webhook_name)
            .await
            .with_context(|| format!("reading ValidatingWebhookConfiguration {webhook_name}"))?;
        for hook in vwc.webhooks.iter_mut().flatten() {
            hook.client_config.ca_bundle = Some(ca.clone());
        }
        match api.replace(webhook_name, &PostParams::default(), &vwc).await {
            Ok(_) => {
                tracing::info!(webhook = %webhook_name, "patched caBundle");
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("ValidatingWebhookConfiguration {webhook_name} kept changing; caBundle not set")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serving_certificate_chains_to_the_ca_and_names_the_hosts() {
        let hosts = vec!["ctl-admission.ingress.svc".to_string(), "127.0.0.1".to_string()];
        let g = generate(&hosts).unwrap();
        let ca = openssl::x509::X509::from_pem(g.ca.as_bytes()).unwrap();
        let cert = openssl::x509::X509::from_pem(g.cert.as_bytes()).unwrap();
        let key = openssl::pkey::PKey::private_key_from_pem(g.key.as_bytes()).unwrap();
        assert!(cert.verify(&ca.public_key().unwrap()).unwrap());
        assert!(cert.public_key().unwrap().public_eq(&key));
        let sans: Vec<String> = cert
            .subject_alt_names()
            .unwrap()
            .iter()
            .filter_map(|n| {
                n.dnsname()
                    .map(str::to_string)
                    .or_else(|| n.ipaddress().map(|b| format!("{b:?}")))
            })
            .collect();
        assert_eq!(sans[0], "ctl-admission.ingress.svc");
        assert_eq!(sans.len(), 2);
        assert!(generate(&[]).is_err());
    }
}
