//! Every route kind in one form: the route table's.
//!
//! HTTPRoute, GRPCRoute, TCPRoute, TLSRoute and UDPRoute share parent
//! refs, hostnames (where they have them), rules with names and weighted
//! backend refs, and status. The route table holds HTTPRoute rules, so each
//! kind is carried as an [`HttpRoute`] with its kind beside it: a GRPCRoute
//! with its methods as paths ([`super::grpc`]), a TCP, TLS or UDP route
//! as rules with no matches (every connection; a TLSRoute's hostnames are
//! matched against the TLS server name by the module).

use std::borrow::Cow;

use gateway_api_types::httproutes::HttpRoute;
use kube::api::ObjectMeta;
use serde_json::{json, Value};

/// The route kinds the route table serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteKind {
    Http,
    Grpc,
    Tcp,
    Tls,
    Udp,
}

impl RouteKind {
    /// The kind's name, as `allowedRoutes.kinds` and messages give it.
    pub fn name(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
            RouteKind::Tcp => "TCPRoute",
            RouteKind::Tls => "TLSRoute",
            RouteKind::Udp => "UDPRoute",
        }
    }

    /// The key of a route of this kind in the model's and status's maps:
    /// `namespace/name` for an HTTPRoute (as everywhere else), prefixed
    /// with the kind for the others, so two routes of one name never
    /// share a status.
    pub fn key(self, meta: &ObjectMeta) -> String {
        let k = crate::snapshot::key(meta);
        match self {
            RouteKind::Http => k,
            other => format!("{}/{k}", other.name()),
        }
    }

    /// Whether its rules are a stream server's (connections, not requests).
    pub fn is_stream(self) -> bool {
        matches!(self, RouteKind::Tcp | RouteKind::Tls | RouteKind::Udp)
    }
}

/// A route of either kind, in HTTPRoute form.
#[derive(Debug, Clone)]
pub struct Route<'a> {
    pub kind: RouteKind,
    pub http: Cow<'a, HttpRoute>,
    /// For a GRPCRoute: `(service, method)` characters of each rule's
    /// matches (the match left out when a rule has none: one entry).
    pub(super) grpc_ranks: Vec<Vec<(usize, usize)>>,
}

impl<'a> Route<'a> {
    pub fn http(route: &'a HttpRoute) -> Self {
        Route {
            kind: RouteKind::Http,
            http: Cow::Borrowed(route),
            grpc_ranks: Vec::new(),
        }
    }

    /// A TCPRoute, TLSRoute or UDPRoute (`kind`) in HTTPRoute form: its
    /// rules keep their names and backend refs and match every connection.
    pub fn stream(kind: RouteKind, route: &impl serde::Serialize) -> Result<Route<'static>, String> {
        let mut doc = serde_json::to_value(route).map_err(|e| e.to_string())?;
        if let Some(obj) = doc.as_object_mut() {
            obj.remove("status");
            obj.insert("kind".into(), json!("HTTPRoute"));
        }
        if let Some(rules) = doc.pointer_mut("/spec/rules").and_then(Value::as_array_mut) {
            for rule in rules.iter_mut().filter_map(Value::as_object_mut) {
                rule.retain(|k, _| k == "backendRefs" || k == "name");
            }
        }
        let http: HttpRoute = serde_json::from_value(doc).map_err(|e| e.to_string())?;
        Ok(Route {
            kind,
            http: Cow::Owned(http),
            grpc_ranks: Vec::new(),
        })
    }

    pub fn key(&self) -> String {
        self.kind.key(&self.http.metadata)
    }

    /// The spec's rank of a GRPCRoute match (service characters, method
    /// characters); `None` for an HTTPRoute.
    pub fn grpc_rank(&self, rule: usize, m: usize) -> Option<(usize, usize)> {
        match self.kind {
            RouteKind::Http | RouteKind::Tcp | RouteKind::Tls | RouteKind::Udp => None,
            RouteKind::Grpc => Some(
                self.grpc_ranks
                    .get(rule)
                    .and_then(|r| r.get(m))
                    .copied()
                    .unwrap_or_default(),
            ),
        }
    }
}
