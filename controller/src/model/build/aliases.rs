//! Server aliases: first come, first served, and never a host of its own.

use std::collections::{BTreeMap, BTreeSet};

use super::super::Report;
use super::Builder;

impl Builder<'_> {
    /// A server alias must not be a host any Ingress serves, nor an alias
    /// an older Ingress already has: nginx keeps the first `server_name` it
    /// sees, so a duplicate would hand one tenant another's traffic.
    pub(super) fn settle_aliases(&mut self) {
        let hosts: BTreeSet<String> = self.servers.keys().cloned().collect();
        let mut owners: Vec<(usize, String, String)> = self
            .servers
            .iter()
            .filter_map(|(h, s)| s.owner.clone().map(|(id, ing)| (id, ing, h.clone())))
            .collect();
        owners.sort();
        let mut taken: BTreeMap<String, String> = BTreeMap::new();
        for (_, ing, host) in owners {
            let aliases = std::mem::take(&mut self.servers.get_mut(&host).expect("listed above").aliases);
            let mut kept = Vec::new();
            for alias in aliases {
                if alias.as_str() == host {
                    continue;
                }
                let why = if hosts.contains(alias.as_str()) {
                    Some(format!(
                        "server-alias {} is a host of its own (served by an Ingress); alias dropped",
                        alias.as_str()
                    ))
                } else {
                    taken.get(alias.as_str()).map(|other| {
                        format!(
                            "server-alias {} is already an alias of host {other}; alias dropped",
                            alias.as_str()
                        )
                    })
                };
                match why {
                    Some(reason) => self.problems.push(Report {
                        object: format!("Ingress {ing}"),
                        what: "server-alias".into(),
                        reason,
                    }),
                    None => {
                        taken.insert(alias.as_str().to_string(), host.clone());
                        kept.push(alias);
                    }
                }
            }
            self.servers.get_mut(&host).expect("listed above").aliases = kept;
        }
    }
}
