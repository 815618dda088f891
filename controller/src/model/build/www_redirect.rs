//! `from-to-www-redirect`: a server for `www.<host>` (or `<host>` without
//! `www.`) that redirects to the Ingress's host, unless that name is a host
//! or an alias of its own (then ingress-nginx omits it too).

use std::collections::{BTreeMap, BTreeSet};

use super::super::{RedirectServer, Report};
use super::Builder;

/// The other name of `host`: with `www.` added, or removed.
pub fn counterpart(host: &str) -> Option<String> {
    if host == "_" || host.starts_with("*.") {
        return None;
    }
    match host.strip_prefix("www.") {
        Some(bare) if bare.contains('.') => Some(bare.to_string()),
        Some(_) => None,
        None => Some(format!("www.{host}")),
    }
}

impl Builder<'_> {
    /// The redirect servers, once hosts and aliases are settled. A name
    /// that is served already is reported and left alone; a TLS host's
    /// certificate also serves its redirect name (the Secret must cover
    /// both names, as in ingress-nginx).
    pub(super) fn www_redirects(&mut self, tls_hosts: &mut BTreeMap<String, String>) -> Vec<RedirectServer> {
        let taken: BTreeSet<String> = self
            .servers
            .iter()
            .flat_map(|(h, s)| std::iter::once(h.clone()).chain(s.aliases.iter().map(|a| a.as_str().to_string())))
            .collect();
        let mut out: BTreeMap<String, RedirectServer> = BTreeMap::new();
        for (host, ing) in std::mem::take(&mut self.www_requests) {
            let Some(from) = counterpart(&host) else { continue };
            if taken.contains(&from) || out.contains_key(&from) {
                self.problems.push(Report {
                    object: format!("Ingress {ing}"),
                    what: format!("{}from-to-www-redirect", super::super::annotations::PREFIX),
                    reason: format!("{from} is served already; no redirect to {host}"),
                });
                continue;
            }
            if let Some(id) = tls_hosts.get(&host).cloned() {
                tls_hosts.entry(from.clone()).or_insert(id);
            }
            out.insert(from.clone(), RedirectServer { from, to: host });
        }
        out.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::counterpart;

    #[test]
    fn www_is_added_or_removed() {
        assert_eq!(counterpart("example.com").as_deref(), Some("www.example.com"));
        assert_eq!(counterpart("www.example.com").as_deref(), Some("example.com"));
        assert_eq!(counterpart("www.com"), None);
        assert_eq!(counterpart("*.example.com"), None);
        assert_eq!(counterpart("_"), None);
    }
}
