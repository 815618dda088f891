//! Gateways and HTTPRoutes into the module's route table.
//!
//! Only what this controller owns is read: GatewayClasses whose
//! `controllerName` is ours, their Gateways, and the HTTPRoutes that name
//! those Gateways as parents and that the listeners' `allowedRoutes`
//! admit. Every value a route carries is checked with the module's own
//! validator one route at a time, so one tenant's bad route is left out
//! (and reported) without holding back anyone else's. A backend in
//! another namespace needs a ReferenceGrant there.

use std::collections::{BTreeMap, BTreeSet};

use gateway_api_types::gateways::{Gateway, GatewayListeners, GatewayListenersAllowedRoutesNamespacesFrom as From};
use gateway_api_types::httproutes::{
    HttpRouteRules, HttpRouteRulesFilters, HttpRouteRulesFiltersType as FilterType, HttpRouteRulesMatches,
};
use lua_compat::routes::cors::Cors;
use lua_compat::routes::validate::{validate_routes, MAX_RETRY_ATTEMPTS, MAX_TIMEOUT_MS, MAX_WEIGHT, RETRYABLE_CODES};
use lua_compat::routes::{
    BackendProtocol, ClientValidation, Filters, Header, HeaderModifier, ListenerCertificate, ListenerRoutes, Mirror,
    PathMatch, PathModifier, Redirect, Retry, Rewrite, RouteMatch, RouteTable, Rule, Timeouts, ValueMatch,
    WeightedBackend,
};

use super::frontend_tls::PortValidation;
use super::grants::{gateway_secret, granted_to, SecretRef};
use super::hostnames::intersect_from;
use super::listener_sets::Owner;
use super::precedence::{host_groups, Candidate};
use super::route::{Route, RouteKind};
use super::session::RuleSession;
use crate::snapshot::{key, Snapshot};

/// The `controllerName` of GatewayClasses this controller serves.
pub const CONTROLLER_NAME: &str = "dynamic-balancer.dev/gateway-controller";
pub(crate) use super::grants::GROUP;

/// A Service port a route sends to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub port: u16,
    /// The rule's session persistence: the port then gets a backend of
    /// its own that carries it (see [`super::session`]).
    pub session: Option<RuleSession>,
}

/// One nginx `server` for Gateway traffic: a Gateway's port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct GatewayServer {
    /// `namespace/gateway/port`: the route table's listener name.
    pub name: String,
    /// The port nginx listens on for it.
    pub nginx_port: u16,
    /// `namespace/name` of the Gateway.
    pub gateway: String,
    /// The Gateway's port (what its Service exposes).
    pub port: u16,
    /// HTTPS: TLS terminated with the listeners' certificates.
    pub ssl: bool,
    pub protocol: ServerProtocol,
}

/// What a Gateway server speaks: the protocol of its listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerProtocol {
    Http,
    Https,
    /// `TLS` listeners in `Passthrough` mode: routed by the TLS server
    /// name, the TLS left to the backend.
    Tls,
    /// `TLS` listeners in `Terminate` mode (the spec's default): TLS ends
    /// in nginx with the listeners' certificates, chosen by SNI, and the
    /// bytes go on to the backend chosen by that SNI.
    #[serde(rename = "tls-terminate")]
    TlsTerminate,
    Tcp,
    Udp,
}

impl ServerProtocol {
    /// A listener's, or the condition reason and message why it has none.
    pub fn of(l: &GatewayListeners) -> Result<ServerProtocol, (String, String)> {
        use gateway_api_types::gateways::GatewayListenersTlsMode as Mode;
        match l.protocol.as_str() {
            "HTTP" => Ok(ServerProtocol::Http),
            "HTTPS" => Ok(ServerProtocol::Https),
            "TCP" => Ok(ServerProtocol::Tcp),
            "UDP" => Ok(ServerProtocol::Udp),
            "TLS" => match l.tls.as_ref().and_then(|t| t.mode.as_ref()) {
                Some(Mode::Passthrough) => Ok(ServerProtocol::Tls),
                Some(Mode::Terminate) | None => Ok(ServerProtocol::TlsTerminate),
            },
            other => Err((
                "UnsupportedProtocol".into(),
                format!("protocol {other} is not supported; HTTP, HTTPS, TLS, TCP and UDP are"),
            )),
        }
    }

    /// The listener protocol's name.
    pub fn name(self) -> &'static str {
        match self {
            ServerProtocol::Http => "HTTP",
            ServerProtocol::Https => "HTTPS",
            ServerProtocol::Tls | ServerProtocol::TlsTerminate => "TLS",
            ServerProtocol::Tcp => "TCP",
            ServerProtocol::Udp => "UDP",
        }
    }

    /// The route kinds its listeners serve.
    pub fn kinds(self) -> &'static [RouteKind] {
        match self {
            ServerProtocol::Http | ServerProtocol::Https => &[RouteKind::Http, RouteKind::Grpc],
            ServerProtocol::Tls | ServerProtocol::TlsTerminate => &[RouteKind::Tls],
            ServerProtocol::Tcp => &[RouteKind::Tcp],
            ServerProtocol::Udp => &[RouteKind::Udp],
        }
    }

    /// Whether nginx serves it in `stream{}`.
    pub fn is_stream(self) -> bool {
        matches!(
            self,
            ServerProtocol::Tls | ServerProtocol::TlsTerminate | ServerProtocol::Tcp | ServerProtocol::Udp
        )
    }

    /// Whether nginx terminates TLS with the listeners' certificates.
    pub fn terminates_tls(self) -> bool {
        matches!(self, ServerProtocol::Https | ServerProtocol::TlsTerminate)
    }

    /// TLS listeners of both modes on one port: nginx would have to read
    /// the SNI before deciding whether to end the TLS, which these servers
    /// do not do (the spec's `TLSRouteModeMixed`).
    fn mixes_tls_modes(self, other: ServerProtocol) -> bool {
        matches!(
            (self, other),
            (ServerProtocol::Tls, ServerProtocol::TlsTerminate) | (ServerProtocol::TlsTerminate, ServerProtocol::Tls)
        )
    }
}

/// A listener of a Gateway: its own, or one of a ListenerSet it takes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Listener<'a> {
    pub spec: &'a GatewayListeners,
    pub owner: Owner<'a>,
}

/// A Gateway server while listeners are gathered.
struct Draft<'a> {
    nginx_port: u16,
    listeners: Vec<Listener<'a>>,
    gateway: &'a Gateway,
    protocol: ServerProtocol,
    /// An HTTPS server's certificates.
    certificates: Vec<ListenerCertificate>,
    /// An HTTPS server's client certificate validation (its port's).
    client_validation: Option<ClientValidation>,
}

/// What the Gateway objects come to.
#[derive(Debug, Default)]
pub struct GatewayModel {
    pub servers: Vec<GatewayServer>,
    pub table: RouteTable,
    /// `(object, reason)`: what was refused or left out.
    pub problems: Vec<(String, String)>,
    /// Each listener of our Gateways, by `(namespace/gateway, listener)`:
    /// served, or why not (a condition reason and message).
    pub listeners: BTreeMap<(String, String), Result<(), (String, String)>>,
    /// HTTPRoutes with a backend ref that does not resolve, or a filter
    /// that is not supported: the first such reason, by `namespace/name`.
    pub unresolved: BTreeMap<String, (String, String)>,
    /// HTTPRoutes left out because a value failed validation.
    pub invalid: BTreeMap<String, String>,
    /// Listeners accepted but not served because a certificate reference
    /// does not resolve (`ResolvedRefs` False with this reason).
    pub unresolved_listeners: BTreeMap<(String, String), (String, String)>,
    /// The HTTPS listeners' certificates, by the module's id.
    pub certificates: BTreeMap<String, crate::model::tls::Pair>,
    /// HTTPS listeners whose client CA references (`spec.tls.frontend`)
    /// do not all resolve: `ResolvedRefs` False with this reason. With
    /// none resolved the listener is also refused (`NoValidCACertificate`
    /// in `listeners`).
    pub ca_refs: BTreeMap<(String, String), (String, String)>,
    /// Gateways with a reference of their own that does not resolve (the
    /// backend client certificate): `ResolvedRefs` False with this reason.
    pub gateway_refs: BTreeMap<String, (String, String)>,
    /// Each BackendTLSPolicy (`namespace/name`): its conditions and the
    /// Gateways whose routes send to the ports it targets (its ancestors).
    pub backend_tls_status: BTreeMap<String, (Vec<super::condition::Cond>, std::collections::BTreeSet<String>)>,
}

/// The certificate of an HTTPS listener (its first `certificateRef`,
/// relative to the listener's owner: a Secret in another namespace needs
/// a ReferenceGrant to that kind), or the listener condition reason and
/// message why not.
fn listener_certificate(
    snap: &Snapshot,
    owner: Owner,
    l: &GatewayListeners,
) -> Result<crate::model::tls::Certificate, (String, String)> {
    let invalid = |m: String| ("InvalidCertificateRef".to_string(), m);
    let refs = l
        .tls
        .as_ref()
        .and_then(|t| t.certificate_refs.as_deref())
        .unwrap_or_default();
    let Some(r) = refs.first() else {
        return Err(invalid(format!(
            "{} needs tls.certificateRefs",
            if l.protocol == "TLS" {
                "a TLS listener in Terminate mode (the default)"
            } else {
                "an HTTPS listener"
            }
        )));
    };
    let reference = SecretRef {
        group: r.group.as_deref(),
        kind: r.kind.as_deref(),
        name: &r.name,
        namespace: r.namespace.as_deref(),
    };
    gateway_secret(
        snap,
        owner.kind,
        owner.namespace,
        &reference,
        "certificate ref",
        "InvalidCertificateRef",
    )
}

/// The most nginx servers (distinct ports, UDP apart) one Gateway may have,
/// its ListenerSets' included: the Gateway API's own bound on a Gateway's
/// listeners. Each new port is a listening socket and a reload, and the
/// namespaces a Gateway takes ListenerSets from could otherwise open ports
/// without end; a ListenerSet listener that would open one more is refused
/// (`PortUnavailable`), in the sets' precedence order.
pub const MAX_PORTS_PER_GATEWAY: usize = 64;

/// Translates the snapshot's Gateway objects. `base_port` 0: nginx listens
/// on each Gateway port itself (two Gateways on one port: the older keeps
/// it); otherwise the Gateway ports, oldest Gateway first, get `base_port`,
/// `base_port + 1`, ... `backend` names the backend of a Service port that
/// exists (and records it for the backends push).
pub fn translate(
    snap: &Snapshot,
    controller_name: &str,
    base_port: u16,
    reserved: &[(u16, bool)],
    mut name_backend: impl FnMut(&ServiceRef) -> String,
) -> GatewayModel {
    let mut out = GatewayModel::default();
    // Each backend name's Service port, for BackendTLSPolicies.
    let mut refs: BTreeMap<String, ServiceRef> = BTreeMap::new();
    let mut backend = |r: &ServiceRef| {
        let name = name_backend(r);
        refs.insert(name.clone(), r.clone());
        name
    };
    // The certificate each Gateway shows backends over TLS, by its key.
    let mut client_certificates: BTreeMap<String, String> = BTreeMap::new();
    let classes: Vec<&str> = snap
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == controller_name)
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    let mut gateways: Vec<&Gateway> = snap
        .gateways
        .iter()
        .map(|g| &**g)
        .filter(|g| classes.contains(&g.spec.gateway_class_name.as_str()))
        // A Gateway that is not Accepted as a whole (parameters or
        // addresses it cannot have) is not served.
        .filter(|g| super::addresses::invalid_parameters(g).is_none() && super::addresses::requested(g).is_ok())
        .collect();
    gateways.sort_by_key(|g| (g.metadata.creation_timestamp.clone(), key(&g.metadata)));
    // Each Gateway's listeners: its own, then those of the ListenerSets
    // it takes, in their precedence order (a conflict refuses the later).
    let attachments: Vec<_> = gateways
        .iter()
        .map(|g| super::listener_sets::attached_to(snap, g))
        .collect();
    let listeners_of: Vec<Vec<Listener>> = gateways
        .iter()
        .zip(&attachments)
        .map(|(g, sets)| {
            let own = g.spec.listeners.iter().map(|spec| Listener {
                spec,
                owner: Owner::gateway(g),
            });
            let theirs = sets.iter().filter(|a| a.allowed).flat_map(|a| {
                a.listeners
                    .iter()
                    .flatten()
                    .map(|spec| Listener { spec, owner: a.owner() })
            });
            own.chain(theirs).collect()
        })
        .collect();

    // Each Gateway port (and transport) is one server; its listeners of
    // one protocol share it.
    let mut servers: BTreeMap<String, Draft> = BTreeMap::new();
    // Ports by transport (`true`: UDP): a UDP listener may share its
    // number with a TCP one.
    let mut taken: BTreeMap<(u16, bool), String> = reserved
        .iter()
        .map(|k| (*k, "the controller's own listeners or tcp-/udp-services".to_string()))
        .collect();
    for g in &gateways {
        let gw_key = key(&g.metadata);
        match super::backend_tls::client_certificate(snap, g) {
            Ok(Some(cert)) => {
                client_certificates.insert(gw_key.clone(), cert.id.clone());
                out.certificates.insert(cert.id, cert.pair);
            }
            Ok(None) => {}
            Err((reason, message)) => {
                out.problems.push((
                    format!("Gateway {gw_key}"),
                    format!("spec.tls.backend.clientCertificateRef: {message}; backends asking for a client certificate get none"),
                ));
                out.gateway_refs.insert(gw_key.clone(), (reason, message));
            }
        }
    }
    // What each server's listeners claim (their protocol and hostnames),
    // listeners whose references do not resolve included: a hostname or
    // port stays its first claimant's while its certificate is missing,
    // never falling to a later listener (another tenant's ListenerSet).
    let mut claims: BTreeMap<String, (ServerProtocol, Vec<String>)> = BTreeMap::new();
    // How many nginx servers each Gateway has opened (MAX_PORTS_PER_GATEWAY).
    let mut servers_of: BTreeMap<String, usize> = BTreeMap::new();
    // Every Gateway's own listeners first, then ListenerSets': a port a
    // ListenerSet adds takes the next nginx port after all the Gateways'
    // own (with `base_port`), so a tenant never shifts another Gateway's.
    for from_sets in [false, true] {
        for (g, gateway_listeners) in gateways.iter().zip(&listeners_of) {
            let gw_key = key(&g.metadata);
            let mut validation_by_port: BTreeMap<i32, PortValidation> = BTreeMap::new();
            // Ports where the Gateway's own listeners mix TLS modes: all of
            // them are refused (none is "first": they are one object's).
            let mut modes_by_port: BTreeMap<i32, Vec<ServerProtocol>> = BTreeMap::new();
            for l in gateway_listeners
                .iter()
                .filter(|l| l.owner.kind != super::listener_sets::KIND)
            {
                if let Ok(p) = ServerProtocol::of(l.spec) {
                    modes_by_port.entry(l.spec.port).or_default().push(p);
                }
            }
            let mixed_ports: BTreeSet<i32> = modes_by_port
                .into_iter()
                .filter(|(_, ps)| ps.iter().any(|a| ps.iter().any(|b| a.mixes_tls_modes(*b))))
                .map(|(port, _)| port)
                .collect();
            let phase = gateway_listeners
                .iter()
                .filter(|l| (l.owner.kind == super::listener_sets::KIND) == from_sets);
            for listener in phase {
                let l = listener.spec;
                let lkey = (listener.owner.key(), l.name.clone());
                let object = format!(
                    "{} {}/{}",
                    listener.owner.kind, listener.owner.namespace, listener.owner.name
                );
                let protocol = match ServerProtocol::of(l) {
                    Ok(p) => p,
                    Err((reason, message)) => {
                        out.problems
                            .push((object.clone(), format!("listener {:?}: {message}", l.name)));
                        out.listeners.insert(lkey, Err((reason, message)));
                        continue;
                    }
                };
                let Some(port) = u16::try_from(l.port).ok().filter(|p| *p > 0) else {
                    out.listeners
                        .insert(lkey, Err(("PortUnavailable".into(), "not a port".into())));
                    continue;
                };
                // UDP ports are not TCP ports: a Gateway may have both.
                let name = match protocol {
                    ServerProtocol::Udp => format!("{gw_key}/{port}/udp"),
                    _ => format!("{gw_key}/{port}"),
                };
                // Another protocol on the port, or the same hostname again
                // (a Gateway's own listeners are unique by port, protocol
                // and hostname; ListenerSets' may repeat them): the later
                // listener is refused. The message names no other
                // listener: it may be another tenant's.
                let host = l.hostname.as_deref().unwrap_or("*").to_ascii_lowercase();
                let mixed = !from_sets
                    && matches!(protocol, ServerProtocol::Tls | ServerProtocol::TlsTerminate)
                    && mixed_ports.contains(&l.port);
                let conflict = match claims.get_mut(&name) {
                    _ if mixed => Some((
                        "ProtocolConflict",
                        format!("port {port} has TLS listeners in both Passthrough and Terminate mode, which are not supported together"),
                    )),
                    Some((claimed, _)) if claimed.mixes_tls_modes(protocol) => Some((
                        "ProtocolConflict",
                        format!("port {port} already has TLS listeners in the other mode; Passthrough and Terminate are not supported together"),
                    )),
                    Some((claimed, _)) if *claimed != protocol => Some((
                        "ProtocolConflict",
                        format!(
                            "port {port} already has {} listeners; this one is {}",
                            claimed.name(),
                            protocol.name()
                        ),
                    )),
                    Some((_, hosts)) if hosts.contains(&host) => Some((
                        "HostnameConflict",
                        format!("port {port} already has a listener for hostname {host:?}"),
                    )),
                    Some((_, hosts)) => {
                        hosts.push(host);
                        None
                    }
                    None => {
                        claims.insert(name.clone(), (protocol, vec![host]));
                        None
                    }
                };
                if let Some((reason, message)) = conflict {
                    out.problems
                        .push((object.clone(), format!("listener {:?}: {message}", l.name)));
                    out.listeners.insert(lkey, Err((reason.into(), message)));
                    continue;
                }
                let certificate = if protocol.terminates_tls() {
                    match listener_certificate(snap, listener.owner, l) {
                        Ok(cert) => {
                            let entry = ListenerCertificate {
                                hostname: l.hostname.clone().unwrap_or_else(|| "*".into()),
                                certificate: cert.id.clone(),
                            };
                            out.certificates.insert(cert.id, cert.pair);
                            Some(entry)
                        }
                        Err((reason, message)) => {
                            out.problems
                                .push((object.clone(), format!("listener {:?}: {message}", l.name)));
                            out.unresolved_listeners.insert(lkey, (reason, message));
                            continue;
                        }
                    }
                } else {
                    None
                };
                let client_validation = if protocol == ServerProtocol::Https {
                    // One resolution per port: its listeners share it.
                    let resolved = validation_by_port
                        .entry(l.port)
                        .or_insert_with(|| super::frontend_tls::for_port(snap, g, l.port))
                        .clone();
                    match resolved {
                        PortValidation::None => None,
                        PortValidation::Valid { validation, problem } => {
                            if let Some(p) = problem {
                                out.problems
                                    .push((object.clone(), format!("listener {:?}: {}", l.name, p.1)));
                                out.ca_refs.insert(lkey.clone(), p);
                            }
                            Some(validation)
                        }
                        PortValidation::Invalid(p) => {
                            let message = format!("no valid client CA certificate: {}", p.1);
                            out.problems
                                .push((object.clone(), format!("listener {:?}: {message}", l.name)));
                            out.ca_refs.insert(lkey.clone(), p);
                            out.listeners
                                .insert(lkey, Err(("NoValidCACertificate".into(), message)));
                            continue;
                        }
                    }
                } else {
                    None
                };
                if let Some(entry) = servers.get_mut(&name) {
                    if let Some(c) = certificate {
                        if !entry.certificates.iter().any(|e| e.hostname == c.hostname) {
                            entry.certificates.push(c);
                        }
                    }
                    entry.listeners.push(*listener);
                    out.listeners.insert(lkey, Ok(()));
                    continue;
                }
                let opened = servers_of.entry(gw_key.clone()).or_insert(0);
                if *opened >= MAX_PORTS_PER_GATEWAY {
                    let message = format!(
                        "Gateway {gw_key} already listens on {MAX_PORTS_PER_GATEWAY} ports, the most one Gateway and its ListenerSets may open; use a port it has"
                    );
                    out.problems
                        .push((object.clone(), format!("listener {:?}: {message}", l.name)));
                    out.listeners.insert(lkey, Err(("PortUnavailable".into(), message)));
                    continue;
                }
                let nginx_port = if base_port == 0 {
                    port
                } else {
                    base_port.saturating_add(servers.len() as u16)
                };
                let udp = protocol == ServerProtocol::Udp;
                if let Some(owner) = taken.get(&(nginx_port, udp)) {
                    out.listeners.insert(
                        lkey,
                        Err((
                            "PortUnavailable".into(),
                            format!("nginx port {nginx_port} is taken by {owner}"),
                        )),
                    );
                    out.problems.push((
                        object.clone(),
                        format!("nginx port {nginx_port} (for Gateway port {port}) is already taken by {owner}; set --gateway-base-port to give each Gateway its own ports"),
                    ));
                    continue;
                }
                taken.insert((nginx_port, udp), format!("Gateway {gw_key}"));
                *opened += 1;
                out.listeners.insert(lkey, Ok(()));
                servers.insert(
                    name,
                    Draft {
                        nginx_port,
                        listeners: vec![*listener],
                        gateway: g,
                        protocol,
                        certificates: certificate.into_iter().collect(),
                        client_validation,
                    },
                );
            }
        }
    }

    let mut routes = all_routes(snap, &mut out.problems);
    routes.sort_by_key(|r| (r.http.metadata.creation_timestamp.clone(), r.key()));
    let mut translated = std::collections::BTreeSet::new();
    for (name, draft) in &servers {
        let Draft {
            nginx_port,
            listeners,
            gateway,
            protocol,
            certificates,
            client_validation,
        } = draft;
        let port = listeners[0].spec.port as u16;
        // Every listener's hostname is a host group, with or without
        // routes: a host a listener takes never falls to another's routes.
        let listener_hosts: Vec<String> = listeners
            .iter()
            .map(|l| l.spec.hostname.as_deref().unwrap_or("*").to_ascii_lowercase())
            .collect();
        let mut candidates = Vec::new();
        let mut rules: Vec<Rule> = Vec::new();
        for route in routes.iter().filter(|r| protocol.kinds().contains(&r.kind)) {
            let hostnames = attached_hostnames(snap, route, listeners, port);
            if hostnames.is_empty() {
                continue;
            }
            let mut route_problems = Vec::new();
            let route_key = route.key();
            let object = format!("{} {}", route.kind.name(), key(&route.http.metadata));
            translated.insert(route_key.clone());
            let (route_rules, route_candidates) =
                route_entries(snap, route, &hostnames, &mut backend, &mut route_problems);
            if let Some((reason, message)) = route_problems.first() {
                out.unresolved
                    .entry(route_key.clone())
                    .or_insert_with(|| (reason.clone(), message.clone()));
            }
            for (_, message) in route_problems {
                out.problems.push((object.clone(), message));
            }
            // The module's validator, on this route alone: a bad value
            // leaves out this route, never the table.
            let alone = RouteTable {
                listeners: vec![ListenerRoutes {
                    name: name.clone(),
                    port,
                    hosts: host_groups(&route_candidates, &[]),
                    rules: route_rules.clone(),
                    certificates: Vec::new(),
                    client_validation: None,
                    backend_client_certificate: None,
                    tls_passthrough: false,
                }],
                backend_tls: Vec::new(),
            };
            if let Err(e) = validate_routes(&alone) {
                out.invalid.insert(route_key, format!("{}: {}", e.path, e.message));
                out.problems
                    .push((object, format!("left out: {}: {}", e.path, e.message)));
                continue;
            }
            let offset = rules.len() as u32;
            rules.extend(route_rules);
            candidates.extend(route_candidates.into_iter().map(|mut c| {
                c.route_match.rule += offset;
                c
            }));
        }
        out.table.listeners.push(ListenerRoutes {
            name: name.clone(),
            port,
            hosts: host_groups(&candidates, &listener_hosts),
            rules,
            certificates: certificates.clone(),
            client_validation: client_validation.clone(),
            backend_client_certificate: client_certificates.get(&key(&gateway.metadata)).cloned(),
            tls_passthrough: *protocol == ServerProtocol::Tls,
        });
        out.servers.push(GatewayServer {
            name: name.clone(),
            nginx_port: *nginx_port,
            gateway: key(&gateway.metadata),
            port,
            ssl: protocol.terminates_tls(),
            protocol: *protocol,
        });
    }
    // Routes attached to no served listener (only to one whose certificate
    // does not resolve, say) still get their references checked for their
    // status; nothing of them is served, so no backend is claimed.
    for route in routes.iter().filter(|r| !translated.contains(&r.key())) {
        let mut route_problems = Vec::new();
        let _ = route_entries(snap, route, &[], &mut |_| String::new(), &mut route_problems);
        if let Some((reason, message)) = route_problems.into_iter().next() {
            out.unresolved.insert(route.key(), (reason, message));
        }
    }
    let policies = super::backend_tls::resolve(snap);
    let port_of = |name: &str| refs.get(name).map(|r| (r.namespace.clone(), r.name.clone(), r.port));
    let listeners = out
        .table
        .listeners
        .iter_mut()
        .zip(out.servers.iter().map(|s| s.gateway.as_str()));
    let applied = super::backend_tls::apply(listeners, &policies, port_of);
    out.table.backend_tls = applied.entries;
    out.backend_tls_status = applied.status;
    out.problems.extend(applied.problems);
    out
}

/// Every HTTPRoute and GRPCRoute, in HTTPRoute form (see [`super::grpc`]).
/// A GRPCRoute that has none is reported and left out.
pub(crate) fn all_routes<'a>(snap: &'a Snapshot, problems: &mut Vec<(String, String)>) -> Vec<Route<'a>> {
    let mut routes: Vec<Route<'a>> = snap.http_routes.iter().map(|r| Route::http(r)).collect();
    let mut add = |kind: RouteKind, meta: &kube::api::ObjectMeta, r: Result<Route<'static>, String>| match r {
        Ok(r) => routes.push(r),
        Err(e) => problems.push((format!("{} {}", kind.name(), key(meta)), format!("left out: {e}"))),
    };
    for g in &snap.grpc_routes {
        add(RouteKind::Grpc, &g.metadata, Route::grpc(g));
    }
    for r in &snap.tcp_routes {
        add(RouteKind::Tcp, &r.metadata, Route::stream(RouteKind::Tcp, &**r));
    }
    for r in &snap.tls_routes {
        add(RouteKind::Tls, &r.metadata, Route::stream(RouteKind::Tls, &**r));
    }
    for r in &snap.udp_routes {
        add(RouteKind::Udp, &r.metadata, Route::stream(RouteKind::Udp, &**r));
    }
    routes
}

/// What of a Service the route table depends on: whether it exists, and
/// its ports with their `appProtocol` (a backend ref resolves to a port,
/// and the port's protocol chooses `proxy_pass` or `grpc_pass`).
pub type ServiceShape = Option<Vec<(i32, Option<String>)>>;

/// Every Service any route of the snapshot names (backend refs and mirror
/// refs, ours or not), with its shape now. A change to one of these
/// Services that changes its shape changes the route table, so it cannot
/// be applied as an endpoint change; a change of its EndpointSlices can.
pub fn referenced_services(snap: &Snapshot) -> BTreeMap<(String, String), ServiceShape> {
    let mut out = BTreeMap::new();
    let is_service = |group: Option<&str>, kind: Option<&str>| {
        group.is_none_or(|g| g.is_empty() || g == "core") && kind.is_none_or(|k| k == "Service")
    };
    for route in all_routes(snap, &mut Vec::new()) {
        let route = &*route.http;
        let ns = route.metadata.namespace.as_deref().unwrap_or("default");
        for rule in route.spec.rules.iter().flatten() {
            let backends =
                rule.backend_refs.iter().flatten().filter_map(|b| {
                    is_service(b.group.as_deref(), b.kind.as_deref()).then_some((&b.namespace, &b.name))
                });
            let mirrors = rule
                .filters
                .iter()
                .flatten()
                .filter_map(|f| f.request_mirror.as_ref())
                .map(|m| &m.backend_ref)
                .filter_map(|b| is_service(b.group.as_deref(), b.kind.as_deref()).then_some((&b.namespace, &b.name)));
            for (namespace, name) in backends.chain(mirrors) {
                let key = (namespace.clone().unwrap_or_else(|| ns.to_string()), name.clone());
                if let std::collections::btree_map::Entry::Vacant(e) = out.entry(key) {
                    let shape = service_shape(snap, e.key());
                    e.insert(shape);
                }
            }
        }
    }
    out
}

/// The [`ServiceShape`] of Service `(namespace, name)` in `snap`.
pub fn service_shape(snap: &Snapshot, key: &(String, String)) -> ServiceShape {
    let service = snap.services.iter().find(|s| {
        s.metadata.namespace.as_deref().unwrap_or("default") == key.0 && s.metadata.name.as_deref() == Some(&key.1)
    })?;
    Some(
        service
            .spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .map(|p| (p.port, p.app_protocol.clone()))
            .collect(),
    )
}

/// One hostname a route serves through one listener.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Attached {
    hostname: String,
    route_hostname: String,
    listener: String,
}

/// The hostnames `route` serves on the server of `listeners` (one Gateway
/// port), or none when it does not attach there. A parent reference
/// reaches the listeners of the object it names: a Gateway's own, or one
/// ListenerSet's.
fn attached_hostnames(snap: &Snapshot, route: &Route, listeners: &[Listener], port: u16) -> Vec<Attached> {
    let kind = route.kind;
    let route = &*route.http;
    let route_ns = route.metadata.namespace.as_deref().unwrap_or("default");
    let route_hosts = route.spec.hostnames.clone().unwrap_or_default();
    let mut hosts: Vec<Attached> = Vec::new();
    for parent in route.spec.parent_refs.iter().flatten() {
        if parent.port.is_some_and(|p| p != i32::from(port)) {
            continue;
        }
        for Listener { spec: l, owner } in listeners {
            if !owner.named_by(parent, route_ns)
                || parent.section_name.as_ref().is_some_and(|s| *s != l.name)
                || !admits(snap, l, kind, route_ns, owner.namespace)
            {
                continue;
            }
            // A TCP or UDP listener's hostname means nothing (no name to
            // match a connection by): every route takes all connections.
            let listener_host = match kind {
                RouteKind::Tcp | RouteKind::Udp => None,
                _ => l.hostname.as_deref(),
            };
            let listener = listener_host.unwrap_or("*").to_ascii_lowercase();
            hosts.extend(
                intersect_from(listener_host, &route_hosts)
                    .into_iter()
                    .map(|(hostname, route_hostname)| Attached {
                        hostname,
                        route_hostname,
                        listener: listener.clone(),
                    }),
            );
        }
    }
    hosts.sort();
    hosts.dedup();
    hosts
}

/// Whether the listener's `allowedRoutes` admits a route of `kind` in
/// `route_ns` (a namespace selector is matched against the watched
/// Namespaces' labels).
pub(crate) fn admits(snap: &Snapshot, l: &GatewayListeners, kind: RouteKind, route_ns: &str, gw_ns: &str) -> bool {
    let allowed = l.allowed_routes.as_ref();
    let served = ServerProtocol::of(l).is_ok_and(|p| p.kinds().contains(&kind));
    let kinds_ok = served
        && allowed.and_then(|a| a.kinds.as_ref()).is_none_or(|kinds| {
            kinds
                .iter()
                .any(|k| k.kind == kind.name() && k.group.as_deref().unwrap_or(GROUP) == GROUP)
        });
    let from = allowed
        .and_then(|a| a.namespaces.as_ref())
        .and_then(|n| n.from.clone())
        .unwrap_or(From::Same);
    kinds_ok
        && match from {
            From::All => true,
            From::Same => route_ns == gw_ns,
            From::Selector => allowed
                .and_then(|a| a.namespaces.as_ref())
                .and_then(|n| n.selector.as_ref())
                .is_some_and(|sel| super::namespaces::selected(snap, sel, route_ns)),
        }
}

/// The rules and candidate matches of one route (rule indexes local).
fn route_entries(
    snap: &Snapshot,
    any: &Route,
    hostnames: &[Attached],
    backend: &mut impl FnMut(&ServiceRef) -> String,
    problems: &mut Vec<(String, String)>,
) -> (Vec<Rule>, Vec<Candidate>) {
    let route = &*any.http;
    let route_key = key(&route.metadata);
    let ns = route.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = route.metadata.name.clone().unwrap_or_default();
    let created = route
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    // `(condition reason, message)`.
    let mut report = |reason: &str, message: String| problems.push((reason.to_string(), message));
    let mut rules = Vec::new();
    let mut candidates = Vec::new();
    for (rule_index, r) in route.spec.rules.iter().flatten().enumerate() {
        let at = RuleAt {
            route: &route_key,
            index: rule_index,
        };
        let rule = translate_rule(snap, any.kind, &ns, &at, r, backend, &mut report);
        let rule_id = rules.len() as u32;
        rules.push(rule);
        let default_match = [HttpRouteRulesMatches {
            headers: None,
            method: None,
            path: None,
            query_params: None,
        }];
        let matches = r.matches.as_deref().filter(|m| !m.is_empty()).unwrap_or(&default_match);
        for (match_index, m) in matches.iter().enumerate() {
            let route_match = translate_match(m, rule_id);
            for h in hostnames {
                candidates.push(Candidate {
                    hostname: h.hostname.clone(),
                    route_hostname: h.route_hostname.clone(),
                    listener: h.listener.clone(),
                    route_match: route_match.clone(),
                    created,
                    route: (ns.clone(), name.clone()),
                    rule_index,
                    match_index,
                    grpc: any.grpc_rank(rule_index, match_index),
                });
            }
        }
    }
    (rules, candidates)
}

fn translate_match(m: &HttpRouteRulesMatches, rule: u32) -> RouteMatch {
    use gateway_api_types::httproutes::HttpRouteRulesMatchesHeadersType as HeaderType;
    use gateway_api_types::httproutes::HttpRouteRulesMatchesPathType as PathType;
    use gateway_api_types::httproutes::HttpRouteRulesMatchesQueryParamsType as QueryType;
    let value = m
        .path
        .as_ref()
        .and_then(|p| p.value.clone())
        .unwrap_or_else(|| "/".into());
    let path = match m.path.as_ref().and_then(|p| p.r#type.clone()) {
        Some(PathType::Exact) => PathMatch::Exact(value),
        Some(PathType::RegularExpression) => PathMatch::RegularExpression(value),
        Some(PathType::PathPrefix) | None => PathMatch::PathPrefix(value),
    };
    let method = m
        .method
        .as_ref()
        .and_then(|x| serde_json::to_value(x).ok())
        .and_then(|v| v.as_str().map(str::to_string));
    RouteMatch {
        path,
        method,
        headers: m
            .headers
            .iter()
            .flatten()
            .map(|h| ValueMatch {
                name: h.name.clone(),
                value: h.value.clone(),
                regex: matches!(h.r#type, Some(HeaderType::RegularExpression)),
            })
            .collect(),
        query: m
            .query_params
            .iter()
            .flatten()
            .map(|q| ValueMatch {
                name: q.name.clone(),
                value: q.value.clone(),
                regex: matches!(q.r#type, Some(QueryType::RegularExpression)),
            })
            .collect(),
        rule,
    }
}

/// Which rule of which route: `namespace/name` and the rule's index.
struct RuleAt<'a> {
    route: &'a str,
    index: usize,
}

fn translate_rule(
    snap: &Snapshot,
    kind: RouteKind,
    ns: &str,
    at: &RuleAt,
    r: &HttpRouteRules,
    backend: &mut impl FnMut(&ServiceRef) -> String,
    report: &mut impl FnMut(&str, String),
) -> Rule {
    let mut filters = Filters::default();
    let session = r.session_persistence.as_ref().and_then(|sp| {
        let rule = r.name.clone().unwrap_or_else(|| at.index.to_string());
        super::session::translate(at.route, &rule, sp, report)
    });
    let mut unsupported = false;
    for f in r.filters.iter().flatten() {
        if let (FilterType::RequestMirror, Some(m)) = (&f.r#type, &f.request_mirror) {
            if kind == RouteKind::Grpc {
                // A copy needs the whole body first, which a streaming
                // call never ends: the call is served, not mirrored.
                report(
                    "UnsupportedValue",
                    "RequestMirror on a GRPCRoute is not supported (a mirror waits for the whole body, which streaming calls never end); calls are served without copies".into(),
                );
            } else if let Some(mirror) = translate_mirror(snap, kind, ns, m, backend, report) {
                filters.mirrors.push(mirror);
            }
            continue;
        }
        if let Err(why) = apply_filter(&mut filters, f) {
            report("UnsupportedValue", why);
            unsupported = true;
        }
    }
    let retry = r.retry.as_ref().map(|x| {
        let mut codes = Vec::new();
        for c in x.codes.iter().flatten() {
            match u16::try_from(*c).ok().filter(|c| RETRYABLE_CODES.contains(c)) {
                Some(c) if !codes.contains(&c) => codes.push(c),
                Some(_) => {}
                None => report(
                    "UnsupportedValue",
                    format!("retry.codes: nginx cannot retry on {c} (only {RETRYABLE_CODES:?}); ignored"),
                ),
            }
        }
        // More than the module's cap are cut to it (documented), not
        // reported: the route's references are fine.
        let attempts = x.attempts.unwrap_or(1).clamp(0, MAX_RETRY_ATTEMPTS as i64) as u32;
        if x.backoff.is_some() {
            report(
                "UnsupportedValue",
                "retry.backoff: nginx retries at once; ignored".into(),
            );
        }
        Retry { codes, attempts }
    });
    let mut timeouts = Timeouts::default();
    if let Some(t) = &r.timeouts {
        for (field, text, slot) in [
            ("request", &t.request, &mut timeouts.request),
            ("backendRequest", &t.backend_request, &mut timeouts.backend_request),
        ] {
            let Some(text) = text else { continue };
            match super::duration::parse_ms(text) {
                // 0s: no timeout.
                Ok(0) => {}
                Ok(ms) if ms <= u64::from(MAX_TIMEOUT_MS) => *slot = Some(ms as u32),
                Ok(_) => report(
                    "UnsupportedValue",
                    format!("timeouts.{field} {text:?} is longer than a day; ignored"),
                ),
                Err(e) => report("UnsupportedValue", format!("timeouts.{field}: {e}; ignored")),
            }
        }
    }
    let mut backends = Vec::new();
    for b in r.backend_refs.iter().flatten() {
        let weight = b.weight.unwrap_or(1).clamp(0, 1_000_000) as u32;
        let target_ns = b.namespace.clone().unwrap_or_else(|| ns.to_string());
        let resolved = resolve_service(
            snap,
            kind,
            ns,
            &BackendTarget {
                group: b.group.as_deref(),
                kind: b.kind.as_deref(),
                name: &b.name,
                namespace: &target_ns,
                port: b.port,
            },
            session.as_ref(),
            backend,
        );
        let mut protocol = BackendProtocol::Http1;
        let mut name = match resolved {
            Ok((name, p)) => {
                protocol = p;
                Some(name)
            }
            Err((reason, why)) => {
                report(reason, format!("{why}; its share of the requests gets 500"));
                None
            }
        };
        // The backend ref's own filters: a request header modifier; any
        // other is not supported, and the backend's share gets 500 rather
        // than being served without it.
        let mut request_headers = None;
        let mut rewrite = None;
        for f in b.filters.iter().flatten() {
            use gateway_api_types::httproutes::HttpRouteRulesBackendRefsFiltersType as T;
            use gateway_api_types::httproutes::HttpRouteRulesBackendRefsFiltersUrlRewritePathType as P;
            match (&f.r#type, &f.request_header_modifier, &f.url_rewrite) {
                (T::RequestHeaderModifier, Some(m), _) => {
                    request_headers = Some(modifier(
                        m.set.iter().flatten().map(|h| (h.name.clone(), h.value.clone())),
                        m.add.iter().flatten().map(|h| (h.name.clone(), h.value.clone())),
                        m.remove.as_ref(),
                    ));
                }
                (T::UrlRewrite, _, Some(w)) => {
                    rewrite = Some(Rewrite {
                        hostname: w.hostname.clone(),
                        path: w.path.as_ref().map(|p| {
                            path_modifier(
                                matches!(p.r#type, P::ReplaceFullPath),
                                &p.replace_full_path,
                                &p.replace_prefix_match,
                            )
                        }),
                    });
                }
                (other, _, _) => {
                    report(
                        "UnsupportedValue",
                        format!(
                            "backend {}: filter {other:?} on a backend ref is not supported; its share of the requests gets 500",
                            b.name
                        ),
                    );
                    name = None;
                }
            }
        }
        backends.push(WeightedBackend {
            backend: name,
            weight,
            request_headers,
            rewrite,
            protocol,
        });
    }
    if unsupported {
        // The spec: a rule whose filters cannot be applied is not served
        // as if they were absent; its requests get 500. Fail closed: none
        // of its other filters apply either (a CORS filter would still
        // answer preflights, a mirror still copy requests).
        backends.clear();
        filters = Filters::default();
    }
    Rule {
        route: at.route.to_string(),
        name: r.name.clone(),
        filters,
        backends,
        timeouts,
        retry,
        session_persistence: session.is_some(),
    }
}

/// A backend ref's target, as the route names it (the generated types of
/// backend refs and mirror refs differ).
struct BackendTarget<'a> {
    group: Option<&'a str>,
    kind: Option<&'a str>,
    name: &'a str,
    /// Defaulted to the route's.
    namespace: &'a str,
    port: Option<i32>,
}

/// The backend name (and protocol) of a Service a route of `kind` in `ns`
/// refers to, or why it cannot be used: `(condition reason, message)`.
fn resolve_service(
    snap: &Snapshot,
    kind: RouteKind,
    ns: &str,
    b: &BackendTarget,
    session: Option<&RuleSession>,
    backend: &mut impl FnMut(&ServiceRef) -> String,
) -> Result<(String, BackendProtocol), (&'static str, String)> {
    let target_ns = b.namespace;
    if b.group.is_some_and(|g| !g.is_empty() && g != "core") || b.kind.is_some_and(|k| k != "Service") {
        return Err((
            "InvalidKind",
            format!("backend {}: only Services are supported", b.name),
        ));
    }
    let port = b.port.and_then(|p| u16::try_from(p).ok()).ok_or_else(|| {
        (
            "UnsupportedValue",
            format!("backend {}: a Service needs a port", b.name),
        )
    })?;
    if target_ns != ns && !granted_to(snap, kind.name(), ns, target_ns, "Service", b.name) {
        return Err((
            "RefNotPermitted",
            format!(
                "backend {target_ns}/{}: no ReferenceGrant in {target_ns} lets {}s of {ns} refer to it",
                b.name,
                kind.name()
            ),
        ));
    }
    let service = snap
        .services
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref().unwrap_or("default") == target_ns
                && s.metadata.name.as_deref() == Some(b.name)
        })
        .ok_or_else(|| {
            (
                "BackendNotFound",
                format!("backend {target_ns}/{}: Service not found", b.name),
            )
        })?;
    let service_port = service
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .find(|p| p.port == i32::from(port))
        .ok_or_else(|| {
            (
                "BackendNotFound",
                format!("backend {target_ns}/{}: the Service has no port {port}", b.name),
            )
        })?;
    let protocol = backend_protocol(kind, service_port.app_protocol.as_deref());
    let name = backend(&ServiceRef {
        namespace: target_ns.to_string(),
        name: b.name.to_string(),
        port,
        session: session.cloned(),
    });
    Ok((name, protocol))
}

/// A `RequestMirror` filter: its backend and share of requests. A mirror
/// whose backend cannot be used is reported and left out (the rule's own
/// requests are served as before: only the copies are lost).
fn translate_mirror(
    snap: &Snapshot,
    kind: RouteKind,
    ns: &str,
    m: &gateway_api_types::httproutes::HttpRouteRulesFiltersRequestMirror,
    backend: &mut impl FnMut(&ServiceRef) -> String,
    report: &mut impl FnMut(&str, String),
) -> Option<Mirror> {
    let r = &m.backend_ref;
    let target_ns = r.namespace.clone().unwrap_or_else(|| ns.to_string());
    let target = BackendTarget {
        group: r.group.as_deref(),
        kind: r.kind.as_deref(),
        name: &r.name,
        namespace: &target_ns,
        port: r.port,
    };
    let (name, protocol) = match resolve_service(snap, kind, ns, &target, None, backend) {
        Ok(found) => found,
        Err((reason, why)) => {
            report(reason, format!("mirror {why}; requests are not mirrored to it"));
            return None;
        }
    };
    // The spec: `percent` or `fraction` (denominator 100 by default);
    // neither: every request.
    let (numerator, denominator) = match (&m.percent, &m.fraction) {
        (Some(p), _) => (*p, 100),
        (None, Some(f)) => (f.numerator, f.denominator.unwrap_or(100)),
        (None, None) => (1, 1),
    };
    let denominator = denominator.clamp(1, MAX_WEIGHT as i32) as u32;
    let numerator = (numerator.max(0) as u32).min(denominator);
    (numerator > 0).then_some(Mirror {
        backend: name,
        protocol,
        numerator,
        denominator,
    })
}

fn modifier(
    set: impl Iterator<Item = (String, String)>,
    add: impl Iterator<Item = (String, String)>,
    remove: Option<&Vec<String>>,
) -> HeaderModifier {
    let header = |(name, value)| Header { name, value };
    HeaderModifier {
        set: set.map(header).collect(),
        add: add.map(header).collect(),
        remove: remove.cloned().unwrap_or_default(),
    }
}

fn apply_filter(filters: &mut Filters, f: &HttpRouteRulesFilters) -> Result<(), String> {
    match f.r#type {
        FilterType::RequestHeaderModifier => {
            let m = f
                .request_header_modifier
                .as_ref()
                .ok_or("RequestHeaderModifier without its settings")?;
            filters.request_headers = Some(modifier(
                m.set.iter().flatten().map(|h| (h.name.clone(), h.value.clone())),
                m.add.iter().flatten().map(|h| (h.name.clone(), h.value.clone())),
                m.remove.as_ref(),
            ));
        }
        FilterType::ResponseHeaderModifier => {
            let m = f
                .response_header_modifier
                .as_ref()
                .ok_or("ResponseHeaderModifier without its settings")?;
            filters.response_headers = Some(modifier(
                m.set.iter().flatten().map(|h| (h.name.clone(), h.value.clone())),
                m.add.iter().flatten().map(|h| (h.name.clone(), h.value.clone())),
                m.remove.as_ref(),
            ));
        }
        FilterType::RequestRedirect => {
            use gateway_api_types::httproutes::HttpRouteRulesFiltersRequestRedirectPathType as T;
            use gateway_api_types::httproutes::HttpRouteRulesFiltersRequestRedirectScheme as S;
            let r = f
                .request_redirect
                .as_ref()
                .ok_or("RequestRedirect without its settings")?;
            let path = r.path.as_ref().map(|p| {
                path_modifier(
                    matches!(p.r#type, T::ReplaceFullPath),
                    &p.replace_full_path,
                    &p.replace_prefix_match,
                )
            });
            filters.redirect = Some(Redirect {
                scheme: r.scheme.as_ref().map(|s| match s {
                    S::Http => "http".into(),
                    S::Https => "https".into(),
                }),
                hostname: r.hostname.clone(),
                port: r.port.and_then(|p| u16::try_from(p).ok()),
                path,
                status_code: r.status_code.and_then(|c| u16::try_from(c).ok()).unwrap_or(302),
            });
        }
        FilterType::UrlRewrite => {
            use gateway_api_types::httproutes::HttpRouteRulesFiltersUrlRewritePathType as T;
            let r = f.url_rewrite.as_ref().ok_or("URLRewrite without its settings")?;
            let path = r.path.as_ref().map(|p| {
                path_modifier(
                    matches!(p.r#type, T::ReplaceFullPath),
                    &p.replace_full_path,
                    &p.replace_prefix_match,
                )
            });
            filters.rewrite = Some(Rewrite {
                hostname: r.hostname.clone(),
                path,
            });
        }
        FilterType::Cors => {
            let c = f.cors.as_ref().ok_or("CORS without its settings")?;
            let list = |v: &Option<Vec<String>>| v.clone().unwrap_or_default();
            filters.cors = Some(Cors {
                allow_origins: list(&c.allow_origins),
                allow_methods: list(&c.allow_methods),
                allow_headers: list(&c.allow_headers),
                expose_headers: list(&c.expose_headers),
                allow_credentials: c.allow_credentials.unwrap_or(false),
                max_age: c.max_age.map_or(5, |a| a.clamp(1, 86_400) as u32),
            });
        }
        // ExternalAuth (experimental) would need a subrequest per request
        // to the named service; the rule fails closed rather than serving
        // without its authentication.
        FilterType::RequestMirror | FilterType::ExtensionRef | FilterType::ExternalAuth => {
            return Err(format!(
                "filter {:?} is not supported yet; the rule answers 500",
                serde_json::to_value(&f.r#type)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            ));
        }
    }
    Ok(())
}

/// A redirect's or rewrite's path change (their generated types differ).
fn path_modifier(full: bool, full_path: &Option<String>, prefix: &Option<String>) -> PathModifier {
    if full {
        PathModifier::ReplaceFullPath(full_path.clone().unwrap_or_default())
    } else {
        PathModifier::ReplacePrefixMatch(prefix.clone().unwrap_or_default())
    }
}

/// How nginx speaks to a route's backend: a GRPCRoute's always over
/// HTTP/2 cleartext (the spec's default for it; TLS to backends is not
/// built), an HTTPRoute's when the Service port's `appProtocol` says
/// `kubernetes.io/h2c`, else HTTP/1.1 (`kubernetes.io/ws` included:
/// WebSocket upgrades pass through HTTP/1.1).
fn backend_protocol(kind: RouteKind, app_protocol: Option<&str>) -> BackendProtocol {
    match (kind, app_protocol) {
        (RouteKind::Grpc, _) | (RouteKind::Http, Some("kubernetes.io/h2c")) => BackendProtocol::H2c,
        _ => BackendProtocol::Http1,
    }
}
