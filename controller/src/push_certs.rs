//! Certificates pushed to the module: one `PUT` per new or renewed
//! certificate, one `PUT /configuration/servers` when the host map
//! changes, one `DELETE` per certificate no longer used. None of it
//! reloads nginx; a renewal is served from the next handshake.
//!
//! Order matters to the module, which refuses a map naming a certificate
//! it does not hold and the deletion of one the map still names:
//! certificates first, then the map, then deletions.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::tls::Pair;
use crate::model::{Model, Report};
use crate::nginx::PushError;
use crate::state::Shared;

/// A model's certificates and TLS host map.
type Synced = (Arc<BTreeMap<String, Pair>>, Arc<BTreeMap<String, String>>);

/// What the module holds, as far as this controller knows.
#[derive(Default)]
pub struct CertPusher {
    /// `None`: unknown (a restart, a failed push); the next round asks the
    /// module what it holds.
    certs: Option<BTreeMap<String, Pair>>,
    hosts: Option<BTreeMap<String, String>>,
    /// Certificates the module refused, as they were refused: sent again
    /// only once they change.
    refused: BTreeMap<String, Pair>,
    /// The model's certificates and host map as last brought to the
    /// module: a model that shares both (an endpoint change) needs no
    /// round at all.
    synced: Option<Synced>,
}

impl CertPusher {
    pub fn forget(&mut self) {
        self.certs = None;
        self.hosts = None;
        self.synced = None;
    }

    /// Brings the module to `model`'s certificates and host map. `Err`
    /// means "retry later" (and forget).
    pub async fn round(&mut self, shared: &Shared, model: &Model) -> anyhow::Result<()> {
        if let Some((certs, hosts)) = &self.synced {
            if Arc::ptr_eq(certs, &model.certificates) && Arc::ptr_eq(hosts, &model.tls_hosts) {
                return Ok(());
            }
        }
        let result = self.try_round(shared, model).await;
        match &result {
            Ok(()) => self.synced = Some((model.certificates.clone(), model.tls_hosts.clone())),
            Err(_) => self.forget(),
        }
        result
    }

    async fn try_round(&mut self, shared: &Shared, model: &Model) -> anyhow::Result<()> {
        self.refused.retain(|id, p| model.certificates.get(id) == Some(&*p));
        let desired: BTreeMap<&String, &Pair> = model
            .certificates
            .iter()
            .filter(|(id, _)| !self.refused.contains_key(*id))
            .collect();
        let mut now = match self.certs.take() {
            Some(known) => known,
            None => held(shared, &desired).await?,
        };
        for (id, pair) in &desired {
            if now.get(*id) == Some(*pair) {
                continue;
            }
            match shared.api.put_certificate(id, &pair.chain, &pair.key).await {
                Ok(()) => {
                    shared.metrics.push("certificate", true);
                    now.insert((*id).clone(), (*pair).clone());
                }
                Err(PushError::Refused { body, .. }) => {
                    shared.metrics.push_result("certificate", "refused");
                    self.refuse(shared, id, pair, &body);
                }
                Err(PushError::Failed(e)) => {
                    shared.metrics.push("certificate", false);
                    return Err(e.context(format!("PUT certificate {id}")));
                }
            }
        }
        // A host whose certificate was refused falls back to the default.
        let hosts: BTreeMap<String, String> = model
            .tls_hosts
            .iter()
            .filter(|(_, id)| now.contains_key(*id) && desired.contains_key(*id))
            .map(|(h, id)| (h.clone(), id.clone()))
            .collect();
        if self.hosts.as_ref() != Some(&hosts) {
            match shared.api.put_servers(&hosts).await {
                Ok(()) => {
                    shared.metrics.push("servers", true);
                    tracing::info!(hosts = hosts.len(), "pushed the TLS host map");
                    self.hosts = Some(hosts);
                }
                Err(e) => {
                    shared.metrics.push("servers", false);
                    self.certs = Some(now);
                    return Err(anyhow::anyhow!("PUT /configuration/servers: {e}"));
                }
            }
        }
        let gone: Vec<String> = now.keys().filter(|id| !desired.contains_key(*id)).cloned().collect();
        for id in gone {
            let r = shared.api.delete_certificate(&id).await;
            shared.metrics.push("certificate_delete", r.is_ok());
            r.map_err(|e| e.context(format!("DELETE certificate {id}")))?;
            now.remove(&id);
        }
        self.certs = Some(now);
        Ok(())
    }

    fn refuse(&mut self, shared: &Shared, id: &str, pair: &Pair, why: &str) {
        let report = Report {
            object: format!("certificate {id}"),
            what: "certificate".into(),
            reason: format!("the module refused it: {why}; its hosts get the default certificate until it changes"),
        };
        tracing::warn!(problem = %report, "certificate refused by the module");
        if let Some(events) = shared.events.clone() {
            tokio::spawn(async move { events.refused(&report).await });
        }
        self.refused.insert(id.to_string(), pair.clone());
    }
}

/// What the module holds, from its listing: a certificate whose leaf and
/// chain length match the desired one counts as pushed (the key must match
/// the leaf, so it is the same pair); anything else is an id to replace or
/// delete.
async fn held(shared: &Shared, desired: &BTreeMap<&String, &Pair>) -> anyhow::Result<BTreeMap<String, Pair>> {
    let listed = shared
        .api
        .certificates()
        .await
        .map_err(|e| e.context("GET /configuration/certificates"))?;
    let mut out = BTreeMap::new();
    for held in listed {
        let same = desired
            .get(&held.id)
            .filter(|p| p.sha256 == held.sha256 && p.chain_len == held.chain);
        let pair = match same {
            Some(p) => (*p).clone(),
            // Unknown content: a placeholder that never equals a desired
            // pair, so it is replaced or deleted.
            None => Pair {
                chain: String::new(),
                key: String::new(),
                sha256: held.sha256,
                chain_len: 0,
                leaf: Default::default(),
            },
        };
        out.insert(held.id, pair);
    }
    Ok(out)
}
