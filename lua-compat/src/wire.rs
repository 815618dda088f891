//! Serde types for ingress-nginx's `Backend` (`pkg/apis/ingress/types.go`).
//!
//! Field names and shapes follow what the Go controller marshals, so its
//! payloads deserialize unchanged. Unknown fields are ignored (Lua ignores them
//! too), and `null` is read as the empty value because Go emits `null` for nil
//! slices and maps that lack `omitempty`.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// One upstream: a named set of endpoints plus how to balance over them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Backend {
    /// `<namespace>-<service>-<port>`; the key `$proxy_upstream_name` selects.
    pub name: String,
    /// The Kubernetes Service (only `spec.type` matters: `ExternalName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<serde_json::Value>,
    /// Service port: a number, or a string for a named port.
    #[serde(default)]
    pub port: ServicePort,
    #[serde(rename = "sslPassthrough", default)]
    pub ssl_passthrough: bool,
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<Endpoint>,
    #[serde(rename = "sessionAffinityConfig", default, deserialize_with = "null_as_default")]
    pub session_affinity: SessionAffinityConfig,
    #[serde(rename = "upstreamHashByConfig", default, deserialize_with = "null_as_default")]
    pub upstream_hash_by: UpstreamHashByConfig,
    /// `round_robin` (default), `ewma`, ... as the `load-balance` annotation says.
    #[serde(rename = "load-balance", default, skip_serializing_if = "String::is_empty")]
    pub load_balance: String,
    /// True for canary backends, which no location names directly.
    #[serde(rename = "noServer", default)]
    pub no_server: bool,
    #[serde(rename = "trafficShapingPolicy", default, deserialize_with = "null_as_default")]
    pub traffic_shaping: TrafficShapingPolicy,
    /// Beyond ingress-nginx: failed attempts (within `failTimeout`) that take
    /// an endpoint out of rotation for every worker; nginx's `max_fails`
    /// (default 1, 0 turns it off).
    #[serde(rename = "maxFails", default, skip_serializing_if = "Option::is_none")]
    pub max_fails: Option<u32>,
    /// Beyond ingress-nginx: nginx's `fail_timeout`, in seconds (default 10).
    #[serde(rename = "failTimeout", default, skip_serializing_if = "Option::is_none")]
    pub fail_timeout: Option<u32>,
    /// Names of the canary backends of this (primary) backend.
    #[serde(
        rename = "alternativeBackends",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub alternative_backends: Vec<String>,
}

impl Backend {
    /// True when the Service is of type `ExternalName`, whose single endpoint
    /// address is a DNS name rather than an IP address.
    pub fn is_external_name(&self) -> bool {
        self.service
            .as_ref()
            .and_then(|s| s.pointer("/spec/type"))
            .and_then(|t| t.as_str())
            == Some("ExternalName")
    }
}

/// An `{address, port}` pair; ingress-nginx sends the port as a string.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    pub address: String,
    pub port: Port,
    /// Beyond ingress-nginx: a relative weight (default 1), honoured by
    /// round_robin, least_conn and chash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// Kubernetes IntOrString for the Service port.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ServicePort {
    Number(i64),
    Name(String),
}

impl Default for ServicePort {
    fn default() -> Self {
        ServicePort::Number(0)
    }
}

/// A TCP port in 1..=65535. It is read from a JSON string (the wire form) or a
/// number, and written back as a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Port(pub u16);

impl Serialize for Port {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PortVisitor;

        impl Visitor<'_> for PortVisitor {
            type Value = Port;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a port from 1 to 65535, as a string or a number")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Port, E> {
                match v.parse::<u16>() {
                    Ok(p) if p > 0 && v.bytes().all(|b| b.is_ascii_digit()) => Ok(Port(p)),
                    _ => Err(E::custom(format!("{v:?} is not a port (1-65535)"))),
                }
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Port, E> {
                match u16::try_from(v) {
                    Ok(p) if p > 0 => Ok(Port(p)),
                    _ => Err(E::custom(format!("{v} is not a port (1-65535)"))),
                }
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Port, E> {
                Err(E::custom(format!("{v} is not a port (1-65535)")))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Port, E> {
                Err(E::custom(format!("{v} is not a port (1-65535)")))
            }
        }

        d.deserialize_any(PortVisitor)
    }
}

/// `sessionAffinityConfig`: cookie affinity (sticky sessions).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionAffinityConfig {
    /// `""`, `"cookie"`, or (beyond ingress-nginx) `"header"`: the
    /// session travels in a header named `cookieSessionAffinity.name`.
    #[serde(default)]
    pub name: String,
    /// `""`, `"balanced"` or `"persistent"`.
    #[serde(default)]
    pub mode: String,
    #[serde(rename = "cookieSessionAffinity", default, deserialize_with = "null_as_default")]
    pub cookie: CookieSessionAffinity,
}

/// `cookieSessionAffinity`: the sticky cookie's name and attributes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CookieSessionAffinity {
    #[serde(default)]
    pub name: String,
    /// Seconds, as a string.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub expires: String,
    /// Seconds, as a string.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub maxage: String,
    /// host -> paths where the cookie is (re)set.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub locations: BTreeMap<String, Vec<String>>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub secure: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub samesite: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub conditional_samesite_none: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub change_on_failure: bool,
}

/// `upstreamHashByConfig`: consistent hashing on an nginx variable expression.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UpstreamHashByConfig {
    #[serde(rename = "upstream-hash-by", default, skip_serializing_if = "String::is_empty")]
    pub hash_by: String,
    #[serde(rename = "upstream-hash-by-subset", default, skip_serializing_if = "is_false")]
    pub subset: bool,
    #[serde(rename = "upstream-hash-by-subset-size", default, skip_serializing_if = "is_zero")]
    pub subset_size: i64,
}

/// `trafficShapingPolicy`: how a canary backend takes traffic.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrafficShapingPolicy {
    #[serde(default)]
    pub weight: i64,
    #[serde(rename = "weightTotal", default)]
    pub weight_total: i64,
    #[serde(default)]
    pub header: String,
    #[serde(rename = "headerValue", default)]
    pub header_value: String,
    #[serde(rename = "headerPattern", default)]
    pub header_pattern: String,
    #[serde(default)]
    pub cookie: String,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Reads JSON `null` as `T::default()`; Go marshals nil slices and maps so.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
