//! Layer 4: the `tcp-services` and `udp-services` ConfigMaps turned into
//! `stream {}` servers and their backends.
//!
//! Entries are parsed by [`crate::model::l4_services`]; here each accepted
//! one is checked against the Service it names (it must exist and have the
//! port, with the entry's protocol, as ingress-nginx's `getStreamServices`
//! requires), given a backend name (`tcp-<ns>-<svc>-<port>`, claimed before
//! any Ingress's so no tenant can take it), and its endpoints are resolved
//! with the HTTP backends'. A refused entry becomes a Report (an Event on
//! the ConfigMap) and is not rendered; the others still are.

use k8s_openapi::api::core::v1::ConfigMap;

use super::Builder;
use crate::model::backends::BackendRef;
use crate::model::endpoints::PortRef;
use crate::model::l4_services::{self, L4Protocol, L4Service, ServicePortRef};
use crate::model::names::BackendId;
use crate::model::{Report, StreamServer};
use crate::snapshot::key;

impl Builder<'_> {
    /// Adds every accepted entry of both ConfigMaps; returns the servers.
    pub(super) fn add_stream_services(&mut self) -> Vec<StreamServer> {
        let mut servers = Vec::new();
        let maps = [
            (L4Protocol::Tcp, self.snap.tcp_services.clone()),
            (L4Protocol::Udp, self.snap.udp_services.clone()),
        ];
        for (protocol, cm) in maps {
            let Some(cm) = cm else { continue };
            servers.extend(self.add_map(protocol, &cm));
        }
        servers
    }

    fn add_map(&mut self, protocol: L4Protocol, cm: &ConfigMap) -> Vec<StreamServer> {
        let object = format!("ConfigMap {}", key(&cm.metadata));
        let data = cm.data.clone().unwrap_or_default();
        let (entries, problems) = l4_services::parse(protocol, &data, &self.opts.stream_reserved);
        for p in problems {
            self.problems.push(Report {
                object: object.clone(),
                what: protocol.config_map().into(),
                reason: format!("entry {}: {} refused: {}", p.key, p.value, p.reason),
            });
        }
        let mut out = Vec::new();
        for entry in entries {
            match self.check(&entry) {
                Ok(port) => out.push(self.add_entry(entry, port)),
                Err(reason) => self.problems.push(Report {
                    object: object.clone(),
                    what: protocol.config_map().into(),
                    reason: format!(
                        "entry \"{}\": \"{}\" refused: {reason}",
                        entry.listen_port,
                        entry.value()
                    ),
                }),
            }
        }
        out
    }

    /// The entry's Service port, if the Service exists, is watched and has
    /// that port with the entry's protocol.
    fn check(&mut self, entry: &L4Service) -> Result<PortRef, String> {
        self.structural_services
            .insert((entry.namespace.clone(), entry.service.clone()));
        if let Some(ns) = &self.opts.namespace {
            if *ns != entry.namespace {
                return Err(format!(
                    "namespace {} is not watched (--watch-namespace {ns})",
                    entry.namespace
                ));
            }
        }
        let svc = self
            .snap
            .services
            .iter()
            .find(|s| {
                s.metadata.namespace.as_deref().unwrap_or("default") == entry.namespace
                    && s.metadata.name.as_deref() == Some(&entry.service)
            })
            .ok_or_else(|| format!("Service {}/{} does not exist", entry.namespace, entry.service))?;
        let port = match &entry.service_port {
            ServicePortRef::Number(n) => PortRef::Number(i32::from(*n)),
            ServicePortRef::Name(s) => PortRef::Name(s.clone()),
        };
        let found = port.find(svc).ok_or_else(|| {
            format!(
                "Service {}/{} has no port {}",
                entry.namespace, entry.service, entry.service_port
            )
        })?;
        let wanted = match entry.protocol {
            L4Protocol::Tcp => "TCP",
            L4Protocol::Udp => "UDP",
        };
        let has = found.protocol.as_deref().unwrap_or("TCP");
        if has != wanted {
            return Err(format!(
                "port {} of Service {}/{} is {has}, not {wanted}",
                entry.service_port, entry.namespace, entry.service
            ));
        }
        Ok(port)
    }

    fn add_entry(&mut self, entry: L4Service, port: PortRef) -> StreamServer {
        let protocol = match entry.protocol {
            L4Protocol::Tcp => "tcp",
            L4Protocol::Udp => "udp",
        };
        let backend = self.names.claim(BackendId::Stream {
            protocol,
            namespace: entry.namespace.clone(),
            service: entry.service.clone(),
            port: entry.service_port.to_string(),
        });
        self.backends.insert(
            backend.clone(),
            BackendRef {
                namespace: entry.namespace.clone(),
                service: entry.service.clone(),
                port,
                annotations: Default::default(),
                canary: false,
                session: None,
            },
        );
        StreamServer {
            port: entry.listen_port,
            protocol: entry.protocol,
            backend,
            decode_proxy: entry.decode_proxy,
            encode_proxy: entry.encode_proxy,
            source: entry.value(),
        }
    }
}
