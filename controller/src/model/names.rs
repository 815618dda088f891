//! Backend names that never collide.
//!
//! ingress-nginx names a backend `<namespace>-<service>-<port>`. Dashes are
//! legal inside all three parts, so `a-b/c:80` and `a/b-c:80` both become
//! `a-b-c-80`, and a namespace `upstream` with a Service `default` and a
//! port named `backend` becomes the global `upstream-default-backend`: one
//! tenant could take over another's traffic, or everyone's default backend,
//! by choosing names. Here the first claimant of a name keeps it (Ingresses
//! are visited oldest first, and the catch-all backend is reserved before
//! any), so the usual names and sticky cookies carry over from
//! ingress-nginx; a later, different claimant gets the name with a suffix
//! derived from what it stands for.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use super::DEFAULT_BACKEND;

/// What a backend name stands for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendId {
    /// A Service port, by number or name.
    Service {
        namespace: String,
        service: String,
        port: String,
    },
    /// The Service of a `default-backend` annotation (its first port).
    CustomDefault { namespace: String, service: String },
    /// `--default-backend-service`.
    Default,
    /// A `tcp-services` or `udp-services` entry's Service port. Claimed
    /// before any Ingress's, so no tenant takes the name of a layer-4
    /// backend (a namespace `tcp` with a Service `db-postgres` would
    /// otherwise be `tcp-db-postgres-5432`).
    Stream {
        protocol: &'static str,
        namespace: String,
        service: String,
        port: String,
    },
    /// A Service port as a Gateway API rule with session persistence
    /// sends to: a copy of the port's backend that carries the session's
    /// settings (`session` is their digest, see
    /// [`crate::gateway::session`]).
    GatewaySession {
        namespace: String,
        service: String,
        port: String,
        session: String,
    },
}

impl BackendId {
    /// The name ingress-nginx gives it.
    fn usual_name(&self) -> String {
        match self {
            BackendId::Service {
                namespace,
                service,
                port,
            } => format!("{namespace}-{service}-{port}"),
            BackendId::CustomDefault { namespace, service } => {
                format!("custom-default-backend-{namespace}-{service}")
            }
            BackendId::Default => DEFAULT_BACKEND.to_string(),
            BackendId::Stream {
                protocol,
                namespace,
                service,
                port,
            } => format!("{protocol}-{namespace}-{service}-{port}"),
            BackendId::GatewaySession {
                namespace,
                service,
                port,
                session,
            } => format!("{namespace}-{service}-{port}-session-{session}"),
        }
    }

    fn digest(&self) -> String {
        let text = format!("{self:?}");
        Sha256::digest(text.as_bytes())
            .iter()
            .take(4)
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Hands out names, first come first served.
#[derive(Debug)]
pub struct Names {
    owner: HashMap<String, BackendId>,
    name: HashMap<BackendId, String>,
}

impl Default for Names {
    fn default() -> Self {
        let mut names = Names {
            owner: HashMap::new(),
            name: HashMap::new(),
        };
        names.claim(BackendId::Default);
        names
    }
}

impl Names {
    /// The name of `id`: the one it already has, else its usual name if no
    /// one has it, else the usual name with a suffix.
    pub fn claim(&mut self, id: BackendId) -> String {
        if let Some(name) = self.name.get(&id) {
            return name.clone();
        }
        let usual = id.usual_name();
        let mut candidate = usual.clone();
        let mut n = 0;
        while self.owner.contains_key(&candidate) {
            n += 1;
            candidate = if n == 1 {
                format!("{usual}-{}", id.digest())
            } else {
                format!("{usual}-{}-{n}", id.digest())
            };
        }
        self.owner.insert(candidate.clone(), id.clone());
        self.name.insert(id, candidate.clone());
        candidate
    }

    /// Whether `name` went to someone else than its usual owner.
    pub fn collided(&self, id: &BackendId) -> bool {
        self.name.get(id).is_some_and(|n| *n != id.usual_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, port: &str) -> BackendId {
        BackendId::Service {
            namespace: ns.into(),
            service: name.into(),
            port: port.into(),
        }
    }

    #[test]
    fn dashes_cannot_merge_two_services() {
        let mut names = Names::default();
        let first = names.claim(svc("a-b", "c", "80"));
        let second = names.claim(svc("a", "b-c", "80"));
        assert_eq!(first, "a-b-c-80");
        assert_ne!(second, first);
        assert!(second.starts_with("a-b-c-80-"));
        assert!(names.collided(&svc("a", "b-c", "80")));
        assert_eq!(names.claim(svc("a", "b-c", "80")), second, "stable");
    }

    #[test]
    fn no_tenant_gets_the_default_backend_name() {
        let mut names = Names::default();
        let n = names.claim(svc("upstream", "default", "backend"));
        assert_ne!(n, DEFAULT_BACKEND);
        assert_eq!(names.claim(BackendId::Default), DEFAULT_BACKEND);
    }

    #[test]
    fn custom_default_backends_are_names_too() {
        let mut names = Names::default();
        let squatter = names.claim(svc("custom-default-backend-x", "web", "80"));
        let real = names.claim(BackendId::CustomDefault {
            namespace: "x".into(),
            service: "web-80".into(),
        });
        assert_eq!(squatter, "custom-default-backend-x-web-80");
        assert_ne!(real, squatter);
    }
}
