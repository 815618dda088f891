//! Which upstream connections a location's requests may share.
//!
//! nginx's `keepalive` caches connections per upstream block and hands a
//! cached one to the next request for the same address, whatever that
//! request needs. Every ingress location goes through the module's
//! balancer, so if one balancer upstream served them all, a gRPC request
//! could get a connection opened for HTTP/1.1 (argocd-server serves both
//! on one port), an HTTPS request a plain one, or a TLS request one made
//! with another server name. So each kind of connection has a balancer
//! upstream of its own, and keepalive only ever reuses a connection within
//! its kind:
//! - the protocol: HTTP/1.x, HTTPS, gRPC (h2c), gRPC over TLS;
//! - for TLS, the server name sent (`proxy-ssl-server-name` and
//!   `proxy-ssl-name`), which is what the upstream chose its certificate,
//!   and perhaps its routing, by.
//!
//! Backend TLS settings that come later (verification, client
//! certificates) become fields of [`UpstreamKind`] in the same way. The
//! kinds are few per cluster (each distinct server name is one), each block
//! is a few lines, and they cost nothing per request.

use serde::Serialize;

use super::annotations::BackendProtocol;
use super::values::Host;

/// The balancer upstream of plain HTTP, which the default backend and the
/// error pages also use; its name is ingress-nginx's.
pub const PLAIN: &str = "upstream_balancer";

/// How a location's connections to its endpoints are made.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UpstreamKind {
    pub protocol: BackendProtocol,
    /// The TLS server name sent (SNI, `proxy_ssl_name`); `None` sends
    /// none, nginx's default. Only for HTTPS and GRPCS.
    pub server_name: Option<Host>,
}

impl UpstreamKind {
    /// The name of this kind's upstream block: `upstream_balancer`,
    /// `upstream_balancer_https`, `upstream_balancer_grpc`,
    /// `upstream_balancer_grpcs`, with `_sni_<name>` for a server name
    /// (a host name has no `_`, so names cannot collide).
    pub fn upstream(&self) -> String {
        let mut name = match self.protocol {
            BackendProtocol::Http => PLAIN.to_string(),
            BackendProtocol::Https => format!("{PLAIN}_https"),
            BackendProtocol::Grpc => format!("{PLAIN}_grpc"),
            BackendProtocol::Grpcs => format!("{PLAIN}_grpcs"),
        };
        if let Some(sni) = &self.server_name {
            name.push_str("_sni_");
            name.push_str(sni.as_str());
        }
        name
    }

    /// The scheme of `proxy_pass`/`grpc_pass`.
    pub fn scheme(&self) -> &'static str {
        match self.protocol {
            BackendProtocol::Http => "http",
            BackendProtocol::Https => "https",
            BackendProtocol::Grpc => "grpc",
            BackendProtocol::Grpcs => "grpcs",
        }
    }

    /// Whether the connection is TLS.
    pub fn tls(&self) -> bool {
        matches!(self.protocol, BackendProtocol::Https | BackendProtocol::Grpcs)
    }
}

impl Serialize for UpstreamKind {
    /// What the template needs: the block's name, the scheme, whether it
    /// goes through the gRPC module, and the server name.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = s.serialize_struct("UpstreamKind", 4)?;
        st.serialize_field("upstream", &self.upstream())?;
        st.serialize_field("scheme", self.scheme())?;
        st.serialize_field(
            "grpc",
            &matches!(self.protocol, BackendProtocol::Grpc | BackendProtocol::Grpcs),
        )?;
        st.serialize_field("server_name", &self.server_name)?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_own_upstream() {
        let kind = |protocol, sni: Option<&str>| UpstreamKind {
            protocol,
            server_name: sni.map(|s| Host::parse(s).unwrap()),
        };
        let names: Vec<String> = [
            kind(BackendProtocol::Http, None),
            kind(BackendProtocol::Https, None),
            kind(BackendProtocol::Grpc, None),
            kind(BackendProtocol::Grpcs, None),
            kind(BackendProtocol::Https, Some("a.test")),
            kind(BackendProtocol::Https, Some("b.test")),
            kind(BackendProtocol::Grpcs, Some("a.test")),
        ]
        .iter()
        .map(UpstreamKind::upstream)
        .collect();
        assert_eq!(names[0], "upstream_balancer");
        assert_eq!(names[4], "upstream_balancer_https_sni_a.test");
        let distinct: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
    }
}
