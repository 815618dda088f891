//! The per-backend record kept in shared memory.
//!
//! Each backend is stored twice: as canonical JSON, which `GET` returns, and as
//! a compact postcard-encoded [`RuntimeBackend`], which every worker decodes when
//! the backend changes. Decoding the compact form costs a fraction of parsing
//! JSON, which keeps a worker's event loop from stalling on big updates.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::algorithm::Algorithm;
use crate::canary::TrafficPolicy;
use crate::validate::{parse_backend, parse_backends, ValidationError, MAX_ENDPOINTS, MAX_RING_WEIGHT};
use crate::wire::Backend;

/// What a worker needs in order to route to a backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RuntimeBackend {
    pub name: String,
    pub endpoints: Vec<RuntimeEndpoint>,
    pub algorithm: Algorithm,
    /// `alternativeBackends`: canary backends, tried in order.
    pub alternatives: Vec<String>,
    /// This backend's rules when it is someone's canary.
    pub traffic: TrafficPolicy,
    /// 0 turns passive health checks off.
    pub max_fails: u32,
    pub fail_timeout_ms: u64,
}

/// nginx's `max_fails` default.
pub const DEFAULT_MAX_FAILS: u32 = 1;
/// nginx's `fail_timeout` default, seconds.
pub const DEFAULT_FAIL_TIMEOUT: u32 = 10;

/// One resolved endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeEndpoint {
    pub addr: SocketAddr,
    pub weight: u32,
}

/// Resolves the DNS name of an `ExternalName` endpoint. The module passes
/// its cached, time-bounded resolver ([`crate::dns`]); tests pass a table.
pub type Resolver<'a> = &'a mut dyn FnMut(&str, u16) -> Vec<IpAddr>;

/// What to do when a DNS name resolves to an address that
/// [`crate::address::forbidden`] refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnForbidden {
    /// Refuse the whole write (a client is waiting for the answer).
    Refuse,
    /// Leave the address out and warn (a periodic re-resolution).
    Drop,
}

impl RuntimeBackend {
    /// Builds the routing record of a validated backend, with warnings for
    /// the log. DNS names (only valid for `ExternalName` services) are
    /// resolved now; a name that does not resolve contributes no endpoint,
    /// so the backend answers 503 as in Lua.
    pub fn build(
        backend: &Backend,
        resolve: Resolver<'_>,
        on_forbidden: OnForbidden,
    ) -> Result<(Self, Vec<String>), ValidationError> {
        let mut warnings = Vec::new();
        let mut endpoints = Vec::with_capacity(backend.endpoints.len());
        for (j, ep) in backend.endpoints.iter().enumerate() {
            let (port, weight) = (ep.port.0, ep.weight.unwrap_or(1));
            let endpoint = |ip| RuntimeEndpoint {
                addr: SocketAddr::new(ip, port),
                weight,
            };
            if let Ok(ip) = ep.address.parse::<IpAddr>() {
                endpoints.push(endpoint(ip));
                continue;
            }
            for ip in resolve(&ep.address, port) {
                match crate::address::forbidden(ip) {
                    None => endpoints.push(endpoint(ip)),
                    Some(why) if on_forbidden == OnForbidden::Refuse => {
                        return Err(ValidationError {
                            path: format!("endpoints[{j}].address"),
                            message: format!("{:?} resolves to {ip}, {why}", ep.address),
                        })
                    }
                    Some(why) => warnings.push(format!(
                        "backend {:?}: {:?} resolves to {ip}, {why}; address left out",
                        backend.name, ep.address
                    )),
                }
            }
        }
        if endpoints.len() > MAX_ENDPOINTS {
            warnings.push(format!(
                "backend {:?}: {} endpoints after DNS resolution; only the first {MAX_ENDPOINTS} are used",
                backend.name,
                endpoints.len()
            ));
            endpoints.truncate(MAX_ENDPOINTS);
        }
        let (algorithm, warning) = Algorithm::select(backend);
        warnings.extend(warning);
        if algorithm.uses_ring() {
            // Resolution may have multiplied weighted endpoints past the
            // ring's bound; keep the first ones that fit.
            let mut total = 0u64;
            let before = endpoints.len();
            endpoints.retain(|e| {
                total += u64::from(e.weight);
                total <= MAX_RING_WEIGHT
            });
            if endpoints.len() < before {
                warnings.push(format!(
                    "backend {:?}: resolved endpoints exceed the hash ring's total weight {MAX_RING_WEIGHT}; {} left out",
                    backend.name,
                    before - endpoints.len()
                ));
            }
        }
        let runtime = RuntimeBackend {
            name: backend.name.clone(),
            endpoints,
            algorithm,
            alternatives: backend.alternative_backends.clone(),
            traffic: TrafficPolicy::from(&backend.traffic_shaping),
            max_fails: backend.max_fails.unwrap_or(DEFAULT_MAX_FAILS),
            fail_timeout_ms: u64::from(backend.fail_timeout.unwrap_or(DEFAULT_FAIL_TIMEOUT)) * 1000,
        };
        Ok((runtime, warnings))
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain owned data into a Vec cannot fail.
        postcard::to_allocvec(self).expect("postcard encoding of RuntimeBackend")
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, postcard::Error> {
        postcard::from_bytes(bytes)
    }
}

/// A validated backend, encoded and ready to be copied into shared memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    pub name: String,
    /// Canonical JSON of the wire object, for `GET`.
    pub json: Vec<u8>,
    /// [`RuntimeBackend::encode`] output, for the balancer.
    pub runtime: Vec<u8>,
    pub endpoints: usize,
    /// Whether some endpoint is a DNS name that must be re-resolved
    /// periodically (an `ExternalName` Service).
    pub resolves: bool,
    /// For the log, e.g. an unsupported `load-balance`.
    pub warnings: Vec<String>,
}

impl Prepared {
    pub fn build(backend: &Backend, resolve: Resolver<'_>, on_forbidden: OnForbidden) -> Result<Self, ValidationError> {
        let (runtime, warnings) = RuntimeBackend::build(backend, resolve, on_forbidden)?;
        Ok(Prepared {
            name: backend.name.clone(),
            json: serde_json::to_vec(backend).expect("JSON encoding of Backend"),
            endpoints: runtime.endpoints.len(),
            runtime: runtime.encode(),
            resolves: backend.endpoints.iter().any(|e| e.address.parse::<IpAddr>().is_err()),
            warnings,
        })
    }
}

/// Parses, validates and encodes a full `POST /configuration/backends` body.
pub fn prepare_backends(body: &[u8], resolve: Resolver<'_>) -> Result<Vec<Prepared>, ValidationError> {
    let backends = parse_backends(body)?;
    backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            Prepared::build(b, &mut *resolve, OnForbidden::Refuse).map_err(|e| ValidationError {
                path: format!("[{i}].{}", e.path),
                message: e.message,
            })
        })
        .collect()
}

/// Parses, validates and encodes a `PUT /configuration/backends/{name}` body.
pub fn prepare_backend(body: &[u8], url_name: &str, resolve: Resolver<'_>) -> Result<Prepared, ValidationError> {
    Prepared::build(&parse_backend(body, url_name)?, resolve, OnForbidden::Refuse)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_dns(_: &str, _: u16) -> Vec<IpAddr> {
        Vec::new()
    }

    #[test]
    fn round_trips_and_formats_ipv6_like_lua() {
        let body =
            br#"[{"name":"web","endpoints":[{"address":"10.0.0.1","port":"80"},{"address":"fd00::7","port":"8080"}]}]"#;
        let prepared = prepare_backends(body, &mut no_dns).unwrap();
        let rt = RuntimeBackend::decode(&prepared[0].runtime).unwrap();
        let names: Vec<String> = rt.endpoints.iter().map(|e| e.addr.to_string()).collect();
        assert_eq!(names, ["10.0.0.1:80", "[fd00::7]:8080"]);
        assert_eq!(prepared[0].endpoints, 2);
        let again: Backend = serde_json::from_slice(&prepared[0].json).unwrap();
        assert_eq!(again.name, "web");
        assert_eq!(again.endpoints[1].port.0, 8080);
    }

    #[test]
    fn external_names_resolve_or_vanish() {
        let body = br#"[{"name":"ext","service":{"spec":{"type":"ExternalName"}},
                         "endpoints":[{"address":"db.example","port":"5432"}]},
                        {"name":"gone","service":{"spec":{"type":"ExternalName"}},
                         "endpoints":[{"address":"nx.example","port":"80"}]}]"#;
        let mut table = |host: &str, _: u16| match host {
            "db.example" => vec!["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()],
            _ => Vec::new(),
        };
        let prepared = prepare_backends(body, &mut table).unwrap();
        assert_eq!(prepared[0].endpoints, 2);
        assert_eq!(prepared[1].endpoints, 0);
    }

    #[test]
    fn names_resolving_to_local_addresses_are_refused_or_dropped() {
        let backend: Backend = serde_json::from_str(
            r#"{"name":"ext","service":{"spec":{"type":"ExternalName"}},
                "endpoints":[{"address":"sneaky.example","port":"80"}]}"#,
        )
        .unwrap();
        let mut table = |_: &str, _: u16| vec!["127.0.0.1".parse().unwrap(), "192.0.2.7".parse().unwrap()];
        let e = Prepared::build(&backend, &mut table, OnForbidden::Refuse).unwrap_err();
        assert_eq!(e.path, "endpoints[0].address");
        assert!(e.message.contains("127.0.0.1, a loopback address"), "{}", e.message);
        let p = Prepared::build(&backend, &mut table, OnForbidden::Drop).unwrap();
        assert_eq!(p.endpoints, 1);
        assert!(p.resolves);
        assert!(p.warnings[0].contains("left out"), "{:?}", p.warnings);
        let body = br#"[{"name":"ok","endpoints":[]},{"name":"ext","service":{"spec":{"type":"ExternalName"}},
                        "endpoints":[{"address":"sneaky.example","port":"80"}]}]"#;
        assert_eq!(
            prepare_backends(body, &mut table).unwrap_err().path,
            "[1].endpoints[0].address"
        );
    }
}
