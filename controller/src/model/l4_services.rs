//! The `tcp-services` and `udp-services` ConfigMaps: layer-4 ports that
//! nginx's `stream {}` forwards to a Service, as ingress-nginx's
//! `--tcp-services-configmap` and `--udp-services-configmap` define them.
//!
//! Each key is the external port, each value
//! `<namespace>/<service>:<port>[:PROXY[:PROXY]]`: `<port>` is the Service
//! port's number or name, the first `PROXY` decodes the PROXY protocol from
//! the client (`listen ... proxy_protocol`), the second sends it to the
//! upstream (`proxy_protocol on`). An empty first flag (`ns/svc:80::PROXY`)
//! is how the format says "send it, but do not expect it".
//!
//! Values are written by whoever may edit these ConfigMaps and will end up
//! in nginx.conf, so anything that is not exactly this grammar is refused,
//! where ingress-nginx (`getStreamServices`) was lenient:
//! - it read the key with Go's `Atoi`, so `+80`, `080` and `-1` were ports
//!   and nothing bounded them to 1-65535. Here a key is plain decimal
//!   without sign or leading zeros: `080` would otherwise be a second entry
//!   for port 80, and two `listen`s of one port fail `nginx -t` for every
//!   service at once.
//! - it ignored a flag other than `PROXY` and any segment after the fourth;
//!   a typo such as `PROXI` silently turned the PROXY protocol off. Both
//!   are refused, as are empty segments (except that empty first flag).
//! - it silently dropped `PROXY` in `udp-services`. nginx cannot decode it
//!   on a UDP listener ("proxy_protocol" parameter is incompatible with
//!   "udp") and only sends the TCP forms of it, so such an entry never did
//!   what it says: it is refused with the reason, and dropping the flag
//!   fixes it. This is the one ingress-nginx entry that routed there and is
//!   refused here.
//! - it did not check names; a namespace and a Service name must be
//!   DNS-1123 labels (at most 63), a port name an `IANA_SVC_NAME`, as
//!   Kubernetes requires of the objects they name.
//!
//! `PROXY` is accepted in any ASCII case, as ingress-nginx upper-cased it.
//! Ports the controller itself uses ([`ReservedPorts`]) are refused for
//! both protocols, as ingress-nginx does (the HTTPS port carries HTTP/3 on
//! UDP). The same port in `tcp-services` and `udp-services` is two sockets,
//! which ingress-nginx allows and so does this model.
//!
//! One bad entry is reported and left out; the others still parse.
//!
//! The builder (`model/build/stream.rs`) checks each accepted entry
//! against its Service and renders it as a `stream {}` server.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::endpoints::PortRef;
use super::values::is_namespace;

/// The only flag the format has.
const PROXY: &str = "PROXY";

/// Most characters of a key or value quoted in a problem.
const SHOWN_CHARS: usize = 64;

/// Which ConfigMap an entry comes from, and so which socket it listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum L4Protocol {
    Tcp,
    Udp,
}

impl L4Protocol {
    /// The ConfigMap's usual name, for messages.
    pub fn config_map(self) -> &'static str {
        match self {
            L4Protocol::Tcp => "tcp-services",
            L4Protocol::Udp => "udp-services",
        }
    }
}

/// How a value names the Service port. A name is only resolved against the
/// Service later (the port must also have this protocol).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(untagged)]
pub enum ServicePortRef {
    Number(u16),
    Name(String),
}

impl ServicePortRef {
    /// The same reference as an Ingress backend's, for
    /// [`super::endpoints`].
    pub fn to_port_ref(&self) -> PortRef {
        match self {
            ServicePortRef::Number(n) => PortRef::Number(i32::from(*n)),
            ServicePortRef::Name(s) => PortRef::Name(s.clone()),
        }
    }
}

impl fmt::Display for ServicePortRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServicePortRef::Number(n) => write!(f, "{n}"),
            ServicePortRef::Name(s) => f.write_str(s),
        }
    }
}

/// One accepted entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct L4Service {
    pub listen_port: u16,
    pub protocol: L4Protocol,
    pub namespace: String,
    pub service: String,
    pub service_port: ServicePortRef,
    /// Expect the PROXY protocol from the client (TCP only).
    pub decode_proxy: bool,
    /// Send the PROXY protocol to the upstream (TCP only).
    pub encode_proxy: bool,
}

impl L4Service {
    /// The entry's value in its canonical spelling (`PROXY` upper case, no
    /// empty flag unless it is the only way to say "encode only").
    pub fn value(&self) -> String {
        let flags = match (self.decode_proxy, self.encode_proxy) {
            (false, false) => "",
            (true, false) => ":PROXY",
            (false, true) => "::PROXY",
            (true, true) => ":PROXY:PROXY",
        };
        format!("{}/{}:{}{flags}", self.namespace, self.service, self.service_port)
    }
}

/// The ports the controller itself listens on, which no entry may take.
/// The caller fills it from its flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservedPorts {
    pub http: u16,
    pub https: u16,
    /// The module's `/configuration` API (and its status).
    pub api: u16,
    /// The controller's `/metrics`, `/healthz` and `/readyz`.
    pub metrics: u16,
    /// The validating admission webhook, when it is served.
    pub webhook: Option<u16>,
}

/// The ports a Gateway listener may not take, by transport (`true`:
/// UDP): the controller's own listeners (on both transports) and the
/// listen ports of `tcp-services` (TCP) and `udp-services` (UDP), as the
/// model renders them. The model and the status task both take it from
/// here, so a listener is never served by one and reported otherwise by
/// the other.
pub fn gateway_reserved(reserved: &ReservedPorts, snap: &crate::snapshot::Snapshot) -> Vec<(u16, bool)> {
    let mut out: Vec<(u16, bool)> = reserved
        .ports()
        .into_iter()
        .flat_map(|p| [(p, false), (p, true)])
        .collect();
    for (cm, protocol, udp) in [
        (&snap.tcp_services, L4Protocol::Tcp, false),
        (&snap.udp_services, L4Protocol::Udp, true),
    ] {
        if let Some(data) = cm.as_ref().and_then(|c| c.data.as_ref()) {
            out.extend(parse(protocol, data, reserved).0.iter().map(|s| (s.listen_port, udp)));
        }
    }
    out
}

impl ReservedPorts {
    /// Every reserved port.
    pub fn ports(&self) -> Vec<u16> {
        [
            Some(self.http),
            Some(self.https),
            Some(self.api),
            Some(self.metrics),
            self.webhook,
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// What `port` is reserved for, if anything.
    fn holder(&self, port: u16) -> Option<&'static str> {
        [
            (Some(self.http), "the HTTP port"),
            (Some(self.https), "the HTTPS port"),
            (Some(self.api), "the module's API port"),
            (Some(self.metrics), "the metrics and health port"),
            (self.webhook, "the admission webhook's port"),
        ]
        .into_iter()
        .find(|(p, _)| *p == Some(port))
        .map(|(_, what)| what)
    }
}

/// A refused entry. Key and value are quoted, escaped and cut short, so
/// a hostile value cannot flood or forge log lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L4Problem {
    pub protocol: L4Protocol,
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl fmt::Display for L4Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} entry {}: {} refused: {}",
            self.protocol.config_map(),
            self.key,
            self.value,
            self.reason
        )
    }
}

/// Parses one ConfigMap's data. Services come sorted by port (as
/// ingress-nginx sorts them, so the rendered order is stable); problems in
/// key order.
pub fn parse(
    protocol: L4Protocol,
    data: &BTreeMap<String, String>,
    reserved: &ReservedPorts,
) -> (Vec<L4Service>, Vec<L4Problem>) {
    let mut services = Vec::new();
    let mut problems = Vec::new();
    for (key, value) in data {
        match entry(protocol, key, value, reserved) {
            Ok(s) => services.push(s),
            Err(reason) => problems.push(L4Problem {
                protocol,
                key: shown(key),
                value: shown(value),
                reason,
            }),
        }
    }
    services.sort_by_key(|s| s.listen_port);
    (services, problems)
}

const UDP_PROXY: &str = "PROXY is for tcp-services only: nginx cannot decode the PROXY protocol on a UDP \
                         listener nor send it over UDP (ingress-nginx ignored the flag); remove it";

fn entry(protocol: L4Protocol, key: &str, value: &str, reserved: &ReservedPorts) -> Result<L4Service, String> {
    let listen_port = port_number(key).map_err(|why| format!("the key must be the external port: {why}"))?;
    if let Some(what) = reserved.holder(listen_port) {
        return Err(format!("port {listen_port} is {what}, reserved for the controller"));
    }
    let target = Target::parse(value)?;
    if protocol == L4Protocol::Udp && (target.decode_proxy || target.encode_proxy) {
        return Err(UDP_PROXY.into());
    }
    Ok(L4Service {
        listen_port,
        protocol,
        namespace: target.namespace,
        service: target.service,
        service_port: target.port,
        decode_proxy: target.decode_proxy,
        encode_proxy: target.encode_proxy,
    })
}

/// A value, before the protocol is considered.
struct Target {
    namespace: String,
    service: String,
    port: ServicePortRef,
    decode_proxy: bool,
    encode_proxy: bool,
}

impl Target {
    fn parse(value: &str) -> Result<Target, String> {
        const FORMAT: &str = "the value must be <namespace>/<service>:<port>[:PROXY[:PROXY]]";
        if let Some((at, c)) = value.char_indices().find(|(_, c)| !grammar_char(*c)) {
            return Err(format!(
                "character '{}' at byte {at} is not allowed ({FORMAT}, made of a-z, 0-9, '-', '/' and ':')",
                c.escape_default()
            ));
        }
        // Only grammar characters from here on: parts may be quoted as they are.
        let segments: Vec<&str> = value.split(':').collect();
        if segments.len() < 2 {
            return Err(format!("no ':' before the Service port ({FORMAT})"));
        }
        if segments.len() > 4 {
            return Err(format!("{} ':'-separated parts, at most 4 ({FORMAT})", segments.len()));
        }
        let (namespace, service) = segments[0]
            .split_once('/')
            .ok_or_else(|| format!("no '/' between namespace and Service ({FORMAT})"))?;
        if !is_namespace(namespace) {
            return Err(format!(
                "namespace {} is not a DNS-1123 label ({LABEL})",
                shown(namespace)
            ));
        }
        if service.contains('/') {
            return Err(format!("more than one '/' ({FORMAT})"));
        }
        if !is_namespace(service) {
            return Err(format!(
                "Service name {} is not a DNS-1123 label ({LABEL})",
                shown(service)
            ));
        }
        let port = service_port(segments[1])?;
        let (decode_proxy, encode_proxy) = match segments[2..] {
            [] => (false, false),
            [decode] => (flag(decode, "first")?, false),
            // An empty first flag is the format's only way to say "encode only".
            ["", encode] => (false, flag(encode, "second")?),
            [decode, encode] => (flag(decode, "first")?, flag(encode, "second")?),
            _ => unreachable!("at most 4 segments"),
        };
        Ok(Target {
            namespace: namespace.to_string(),
            service: service.to_string(),
            port,
            decode_proxy,
            encode_proxy,
        })
    }
}

const LABEL: &str = "lowercase letters, digits and inner '-', 1 to 63";

/// The characters a value may have at all: names, separators, `PROXY` in
/// any case.
fn grammar_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '/' | ':')
}

/// A port number as the format writes it: 1 to 5 decimal digits, no sign,
/// no leading zero, 1-65535.
fn port_number(s: &str) -> Result<u16, String> {
    if s.is_empty() {
        return Err("empty".into());
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{} is not a plain decimal number", shown(s)));
    }
    if s.starts_with('0') {
        return Err(format!("{} has a leading zero (or is 0); ports are 1-65535", shown(s)));
    }
    s.parse::<u16>().map_err(|_| format!("{} is above 65535", shown(s)))
}

/// The Service port: a number if it is all digits (as ingress-nginx tells
/// them apart), else a name.
fn service_port(s: &str) -> Result<ServicePortRef, String> {
    if s.is_empty() {
        return Err("the Service port is empty".into());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return port_number(s)
            .map(ServicePortRef::Number)
            .map_err(|why| format!("the Service port number {why}"));
    }
    if is_port_name(s) {
        Ok(ServicePortRef::Name(s.to_string()))
    } else {
        Err(format!(
            "the Service port {} is neither a number 1-65535 nor a port name (IANA_SVC_NAME: at most 15 \
             lowercase letters, digits and '-', at least one letter, no '-' at either end nor twice in a row)",
            shown(s)
        ))
    }
}

/// Kubernetes' `IANA_SVC_NAME`, the rule for a Service port's name.
fn is_port_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().any(|b| b.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

fn flag(s: &str, which: &str) -> Result<bool, String> {
    if s.eq_ignore_ascii_case(PROXY) {
        Ok(true)
    } else if s.is_empty() {
        Err(format!(
            "the {which} flag is empty (a trailing ':'?); the only flag is PROXY"
        ))
    } else {
        Err(format!("the {which} flag is {}; the only flag is PROXY", shown(s)))
    }
}

/// `s` quoted for a log line: at most [`SHOWN_CHARS`] characters, anything
/// but printable ASCII escaped.
fn shown(s: &str) -> String {
    let mut out = String::from('"');
    let mut chars = s.chars();
    for c in chars.by_ref().take(SHOWN_CHARS) {
        out.extend(c.escape_default());
    }
    out.push('"');
    if chars.next().is_some() {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserved() -> ReservedPorts {
        ReservedPorts {
            http: 80,
            https: 443,
            api: 10246,
            metrics: 10254,
            webhook: Some(8443),
        }
    }

    fn one(protocol: L4Protocol, key: &str, value: &str) -> Result<L4Service, String> {
        let data = BTreeMap::from([(key.to_string(), value.to_string())]);
        let (mut services, mut problems) = parse(protocol, &data, &reserved());
        match (services.pop(), problems.pop()) {
            (Some(s), None) => Ok(s),
            (None, Some(p)) => {
                assert_eq!(p.protocol, protocol);
                Err(p.reason)
            }
            other => panic!("one entry gave {other:?}"),
        }
    }

    fn tcp(key: &str, value: &str) -> Result<L4Service, String> {
        one(L4Protocol::Tcp, key, value)
    }

    fn refused(key: &str, value: &str, reason: &str) {
        let err = tcp(key, value).expect_err(value);
        assert!(err.contains(reason), "{key:?}={value:?}: {err:?} lacks {reason:?}");
    }

    #[test]
    fn the_documented_examples() {
        let s = tcp("9000", "default/example-go:8080").unwrap();
        assert_eq!(
            s,
            L4Service {
                listen_port: 9000,
                protocol: L4Protocol::Tcp,
                namespace: "default".into(),
                service: "example-go".into(),
                service_port: ServicePortRef::Number(8080),
                decode_proxy: false,
                encode_proxy: false,
            }
        );
        let dns = one(L4Protocol::Udp, "53", "kube-system/kube-dns:53").unwrap();
        assert_eq!((dns.protocol, dns.listen_port), (L4Protocol::Udp, 53));
        assert_eq!(dns.service_port, ServicePortRef::Number(53));
    }

    #[test]
    fn a_port_name() {
        let s = tcp("5432", "db/postgres:pg-main").unwrap();
        assert_eq!(s.service_port, ServicePortRef::Name("pg-main".into()));
        assert_eq!(s.service_port.to_port_ref(), PortRef::Name("pg-main".into()));
        assert_eq!(ServicePortRef::Number(5432).to_port_ref(), PortRef::Number(5432));
    }

    #[test]
    fn proxy_flags() {
        let flags = |v: &str| tcp("9000", v).map(|s| (s.decode_proxy, s.encode_proxy));
        assert_eq!(flags("a/b:80:PROXY"), Ok((true, false)));
        assert_eq!(flags("a/b:80:PROXY:PROXY"), Ok((true, true)));
        assert_eq!(flags("a/b:80::PROXY"), Ok((false, true)), "encode only");
        assert_eq!(flags("a/b:80:proxy:Proxy"), Ok((true, true)), "any ASCII case");
    }

    #[test]
    fn bad_flags_are_refused() {
        refused("9000", "a/b:80:PROXI", "the first flag is \"PROXI\"");
        refused("9000", "a/b:80:PROXY:nope", "the second flag is \"nope\"");
        refused("9000", "a/b:80:", "the first flag is empty");
        refused("9000", "a/b:80:PROXY:", "the second flag is empty");
        refused("9000", "a/b:80::", "the second flag is empty");
        refused("9000", "a/b:80:PROXY:PROXY:PROXY", "5 ':'-separated parts");
        refused("9000", "a/b:80:::", "5 ':'-separated parts");
    }

    #[test]
    fn proxy_is_refused_for_udp() {
        for v in ["a/b:53:PROXY", "a/b:53::PROXY", "a/b:53:PROXY:PROXY"] {
            let err = one(L4Protocol::Udp, "53", v).expect_err(v);
            assert!(err.contains("tcp-services only"), "{err}");
        }
        assert!(one(L4Protocol::Udp, "53", "a/b:53:PROXI")
            .unwrap_err()
            .contains("first flag"));
    }

    #[test]
    fn keys_are_plain_port_numbers() {
        assert_eq!(tcp("1", "a/b:80").unwrap().listen_port, 1);
        assert_eq!(tcp("65535", "a/b:80").unwrap().listen_port, 65535);
        refused("0", "a/b:80", "leading zero (or is 0)");
        refused("080", "a/b:80", "leading zero");
        refused("65536", "a/b:80", "above 65535");
        refused("99999999999999999999", "a/b:80", "above 65535");
        refused("+80", "a/b:80", "not a plain decimal");
        refused("-1", "a/b:80", "not a plain decimal");
        refused(" 80", "a/b:80", "not a plain decimal");
        refused("80 ", "a/b:80", "not a plain decimal");
        refused("0x50", "a/b:80", "not a plain decimal");
        refused("８０", "a/b:80", "not a plain decimal");
        refused("", "a/b:80", "the key must be the external port: empty");
    }

    #[test]
    fn reserved_ports_are_refused_for_both_protocols() {
        for (port, what) in [
            ("80", "the HTTP port"),
            ("443", "the HTTPS port"),
            ("10246", "the module's API port"),
            ("10254", "the metrics and health port"),
            ("8443", "the admission webhook's port"),
        ] {
            for protocol in [L4Protocol::Tcp, L4Protocol::Udp] {
                let err = one(protocol, port, "a/b:80").expect_err(port);
                assert!(err.contains(what) && err.contains("reserved"), "{err}");
            }
        }
        let no_webhook = ReservedPorts {
            webhook: None,
            ..reserved()
        };
        let data = BTreeMap::from([("8443".to_string(), "a/b:80".to_string())]);
        assert_eq!(parse(L4Protocol::Tcp, &data, &no_webhook).0.len(), 1);
    }

    #[test]
    fn names_are_dns_labels() {
        let ns63 = "n".repeat(63);
        assert!(tcp("9000", &format!("{ns63}/{ns63}:80")).is_ok());
        refused("9000", &format!("{ns63}n/b:80"), "namespace");
        refused("9000", &format!("a/{ns63}s:80"), "Service name");
        refused("9000", "Default/b:80", "namespace \"Default\" is not a DNS-1123 label");
        refused("9000", "a/B:80", "Service name \"B\" is not a DNS-1123 label");
        refused("9000", "-a/b:80", "namespace \"-a\"");
        refused("9000", "a-/b:80", "namespace \"a-\"");
        refused("9000", "a/-b:80", "Service name \"-b\"");
        refused("9000", "/b:80", "namespace \"\"");
        refused("9000", "a/:80", "Service name \"\"");
        refused("9000", "a/b/c:80", "more than one '/'");
        refused("9000", "b:80", "no '/'");
        refused("9000", "a.b/c:80", "character '.'");
        refused("9000", "a/b.c:80", "character '.'");
    }

    #[test]
    fn service_ports() {
        assert_eq!(tcp("9000", "a/b:1").unwrap().service_port, ServicePortRef::Number(1));
        assert_eq!(
            tcp("9000", "a/b:65535").unwrap().service_port,
            ServicePortRef::Number(65535)
        );
        refused("9000", "a/b:0", "the Service port number \"0\" has a leading zero");
        refused("9000", "a/b:080", "leading zero");
        refused("9000", "a/b:65536", "above 65535");
        refused("9000", "a/b", "no ':' before the Service port");
        refused("9000", "a/b:", "the Service port is empty");
        refused("9000", "a/b::PROXY", "the Service port is empty");
        let max = "abcdefghijklmno";
        assert_eq!(
            tcp("9000", &format!("a/b:{max}")).unwrap().service_port,
            ServicePortRef::Name(max.into())
        );
        for bad in ["abcdefghijklmnop", "-http", "http-", "ht--tp", "HTTP", "8-0"] {
            let err = tcp("9000", &format!("a/b:{bad}")).expect_err(bad);
            assert!(
                err.contains("port") && (err.contains("IANA_SVC_NAME") || err.contains("character")),
                "{err}"
            );
        }
        assert!(tcp("9000", "a/b:h-2").is_ok());
        assert!(tcp("9000", "a/b:2h").is_ok());
    }

    #[test]
    fn whitespace_and_control_characters_are_refused() {
        for v in [
            " a/b:80",
            "a/b:80 ",
            "a/b :80",
            "a/b:80\n",
            "a/b:80;\n}",
            "a/b:80\0",
            "a/b:80\t",
            "a/b:80\u{202e}",
            "a/ｂ:80",
            "a/b:80:PROXY ",
            "a/b:80:PROXY;",
            "a/b:80#",
            "",
        ] {
            let err = tcp("9000", v).expect_err(v);
            assert!(err.contains("is not allowed") || err.contains("no ':'"), "{v:?}: {err}");
        }
    }

    #[test]
    fn one_bad_entry_hides_nothing() {
        let data = BTreeMap::from([
            ("9000".to_string(), "a/b:80".to_string()),
            ("9001".to_string(), "a/b:80;evil".to_string()),
            ("10000".to_string(), "c/d:http:PROXY".to_string()),
            ("80".to_string(), "a/b:80".to_string()),
        ]);
        let (services, problems) = parse(L4Protocol::Tcp, &data, &reserved());
        let ports: Vec<u16> = services.iter().map(|s| s.listen_port).collect();
        assert_eq!(ports, [9000, 10000], "sorted by port, not by key text");
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["\"80\"", "\"9001\""]);
        assert_eq!(problems[1].value, "\"a/b:80;evil\"");
        assert_eq!(
            problems[1].to_string(),
            "tcp-services entry \"9001\": \"a/b:80;evil\" refused: character ';' at byte 6 is not allowed \
             (the value must be <namespace>/<service>:<port>[:PROXY[:PROXY]], made of a-z, 0-9, '-', '/' and ':')"
        );
    }

    #[test]
    fn the_same_port_in_tcp_and_udp_is_fine() {
        let data = BTreeMap::from([("53".to_string(), "kube-system/kube-dns:53".to_string())]);
        let (tcp, p1) = parse(L4Protocol::Tcp, &data, &reserved());
        let (udp, p2) = parse(L4Protocol::Udp, &data, &reserved());
        assert!(p1.is_empty() && p2.is_empty());
        assert_eq!(tcp[0].listen_port, udp[0].listen_port);
    }

    #[test]
    fn problems_quote_safely() {
        let long = "x".repeat(1000);
        let data = BTreeMap::from([(long.clone(), format!("a/b:80\n\u{1b}[31m{long}"))]);
        let (_, problems) = parse(L4Protocol::Udp, &data, &reserved());
        let p = &problems[0];
        assert_eq!(p.key, format!("\"{}\"...", "x".repeat(SHOWN_CHARS)));
        assert!(p.value.starts_with("\"a/b:80\\n\\u{1b}[31mxx") && p.value.ends_with("\"..."));
        assert!(p.to_string().len() < 400, "{}", p);
        assert!(p.to_string().bytes().all(|b| (b' '..=b'~').contains(&b)));
        assert!(p.to_string().starts_with("udp-services entry"));
    }

    #[test]
    fn canonical_values() {
        assert_eq!(tcp("9000", "a/b:80:proxy").unwrap().value(), "a/b:80:PROXY");
        assert_eq!(tcp("9000", "a/b:http::Proxy").unwrap().value(), "a/b:http::PROXY");
        assert_eq!(tcp("9000", "a/b:80:PROXY:PROXY").unwrap().value(), "a/b:80:PROXY:PROXY");
        assert_eq!(tcp("9000", "a/b:80").unwrap().value(), "a/b:80");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn label() -> impl Strategy<Value = String> {
            "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
        }

        fn port_name() -> impl Strategy<Value = String> {
            "[a-z0-9]{0,5}[a-z][a-z0-9]{0,4}(-[a-z0-9]{1,3})?"
        }

        fn service_port() -> impl Strategy<Value = ServicePortRef> {
            prop_oneof![
                (1u16..).prop_map(ServicePortRef::Number),
                port_name().prop_map(ServicePortRef::Name),
            ]
        }

        fn flags() -> impl Strategy<Value = String> {
            prop_oneof![
                Just(String::new()),
                "(:[pP][rR][oO][xX][yY]){1,2}",
                "::[pP][rR][oO][xX][yY]",
            ]
        }

        /// A value from the grammar's alphabet, so that the parser's later
        /// checks are reached, not only the character filter.
        fn near_grammar() -> impl Strategy<Value = String> {
            "[a-z0-9/:PROXYproxy-]{0,40}"
        }

        /// A valid value with one character replaced by one of the
        /// alphabet's: accepted or refused, close to the edge either way.
        fn mutated() -> impl Strategy<Value = String> {
            (
                label(),
                label(),
                service_port(),
                flags(),
                any::<prop::sample::Index>(),
                "[a-z0-9/:PROXY-]",
            )
                .prop_map(|(ns, svc, sp, f, at, c)| {
                    let mut v: Vec<char> = format!("{ns}/{svc}:{sp}{f}").chars().collect();
                    let i = at.index(v.len());
                    v[i] = c.chars().next().expect("one character");
                    v.into_iter().collect()
                })
        }

        proptest::proptest! {
            #[test]
            fn valid_entries_are_accepted_and_round_trip(
                port in 1u16..,
                ns in label(),
                svc in label(),
                sp in service_port(),
                f in flags(),
            ) {
                prop_assume!(reserved().holder(port).is_none());
                let value = format!("{ns}/{svc}:{sp}{f}");
                let s = tcp(&port.to_string(), &value);
                prop_assert!(s.is_ok(), "{:?} refused: {:?}", value, s);
                let s = s.unwrap();
                prop_assert_eq!(s.listen_port, port);
                prop_assert_eq!(&s.namespace, &ns);
                prop_assert_eq!(&s.service, &svc);
                prop_assert_eq!(&s.service_port, &sp);
                prop_assert_eq!(s.value(), format!("{ns}/{svc}:{sp}{}", f.to_ascii_uppercase()));
                prop_assert_eq!(tcp(&port.to_string(), &s.value()), Ok(s.clone()));
            }

            #[test]
            fn any_value_never_panics_and_accepted_ones_round_trip(
                key in prop_oneof![".{0,8}", "[0-9+-]{0,7}", "[1-9][0-9]{0,4}"],
                value in prop_oneof![".{0,80}", near_grammar(), mutated()],
                udp in any::<bool>(),
            ) {
                let protocol = if udp { L4Protocol::Udp } else { L4Protocol::Tcp };
                if let Ok(s) = one(protocol, &key, &value) {
                    prop_assert!(value.chars().all(grammar_char), "accepted {:?}", value);
                    prop_assert!(key.bytes().all(|b| b.is_ascii_digit()) && !key.starts_with('0'));
                    prop_assert_eq!(s.listen_port.to_string(), key.clone());
                    prop_assert!(value.len() <= 63 + 1 + 63 + 1 + 15 + 12);
                    prop_assert_eq!(one(protocol, &key, &s.value()), Ok(s));
                }
            }

            #[test]
            fn a_foreign_character_anywhere_is_refused(
                ns in label(),
                sp in service_port(),
                f in flags(),
                at in any::<prop::sample::Index>(),
                c in any::<char>().prop_filter("not in the grammar", |c| !grammar_char(*c)),
            ) {
                let value = format!("{ns}/svc:{sp}{f}");
                let i = at.index(value.len() + 1);
                let mut bad = value.clone();
                bad.insert(i, c);
                let err = tcp("9000", &bad);
                prop_assert!(err.is_err(), "{:?} accepted", bad);
                prop_assert!(err.unwrap_err().contains("is not allowed"));
            }
        }
    }
}
