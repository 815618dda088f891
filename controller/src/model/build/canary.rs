//! Canary Ingresses: attached to the primary location they name, within
//! their own namespace only.

use k8s_openapi::api::networking::v1::Ingress;

use super::super::annotations::Annotations;
use super::Builder;

impl Builder<'_> {
    /// Attaches a canary Ingress to the primary location it names. Only a
    /// primary of the canary's own namespace can be attached: otherwise any
    /// tenant could divert another tenant's traffic (ingress-nginx merges
    /// across namespaces).
    pub(super) fn add_canary(&mut self, ing: &Ingress, a: &std::sync::Arc<Annotations>) {
        let Some(spec) = &ing.spec else { return };
        let ns = ing.metadata.namespace.as_deref().unwrap_or("default");
        if !a.fails_closed.is_empty() {
            self.report(
                ing,
                "canary",
                "a canary with access-control annotations this controller does not implement is not attached",
            );
            return;
        }
        for rule in spec.rules.iter().flatten() {
            let host = rule
                .host
                .as_deref()
                .filter(|h| !h.is_empty())
                .unwrap_or("_")
                .to_ascii_lowercase();
            for path in rule.http.iter().flat_map(|h| h.paths.iter()) {
                let conflict = (path.path.clone().unwrap_or_else(|| "/".into()), path.path_type.clone());
                let primary = self
                    .servers
                    .get(&host)
                    .and_then(|s| s.locations.get(&conflict))
                    .and_then(|l| l.first())
                    .map(|l| (l.backend.clone(), l.ingress.clone()));
                let Some((primary, owner)) = primary else {
                    self.report(
                        ing,
                        "canary",
                        format!(
                            "no primary Ingress serves host {host} path {}; canary ignored",
                            conflict.0
                        ),
                    );
                    continue;
                };
                if owner.split('/').next() != Some(ns) {
                    self.report(
                        ing,
                        "canary",
                        format!(
                            "host {host} path {} is served by Ingress {owner} of another namespace; a canary only attaches within its namespace; ignored",
                            conflict.0
                        ),
                    );
                    continue;
                }
                let Some(canary) = self.backend_ref(ing, &path.backend, a, true) else {
                    continue;
                };
                if !self.backends.get(&canary).is_some_and(|b| b.canary) {
                    self.report(
                        ing,
                        "canary",
                        format!("backend {canary} already serves as a primary; canary ignored"),
                    );
                    continue;
                }
                if canary == primary {
                    continue;
                }
                self.alternatives.entry(primary).or_default().insert(canary);
            }
        }
    }
}
