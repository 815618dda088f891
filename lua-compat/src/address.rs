//! Which upstream addresses a tenant may never point a backend at.
//!
//! An ingress controller proxies the public port to whatever address a
//! backend names. If a Service of `type: ExternalName` could name
//! `localhost`, or an EndpointSlice could list `127.0.0.1`, the public port
//! would reach the module's own `/configuration` API, the controller's
//! metrics, or any other service bound to the node's loopback. ingress-nginx
//! refuses loopback `ExternalName`s; we refuse a wider set, everywhere an
//! address enters (controller, API, DNS results):
//!
//! - loopback (`127.0.0.0/8`, `::1`);
//! - "this host" (`0.0.0.0/8`, `::`): on Linux a connection to `0.0.0.0`
//!   reaches the local host;
//! - link-local (`169.254.0.0/16`, `fe80::/10`): cloud metadata services
//!   answer there;
//! - the same addresses written as IPv4-mapped (`::ffff:127.0.0.1`),
//!   IPv4-compatible (`::127.0.0.1`) or NAT64 (`64:ff9b::127.0.0.1`) IPv6.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is refused, or `None` when it may be used.
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if a == 127 {
        Some("a loopback address")
    } else if a == 0 {
        Some("an unspecified (this-host) address")
    } else if a == 169 && b == 254 {
        Some("a link-local address")
    } else {
        None
    }
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_loopback() {
        return Some("a loopback address");
    }
    if ip.is_unspecified() {
        return Some("an unspecified (this-host) address");
    }
    let s = ip.segments();
    if s[0] & 0xffc0 == 0xfe80 {
        return Some("a link-local address");
    }
    // ::ffff:a.b.c.d, ::a.b.c.d and 64:ff9b::a.b.c.d all carry an IPv4
    // address that the kernel or a NAT64 gateway may connect to.
    let embedded = |hi: [u16; 6]| {
        (s[..6] == hi).then(|| Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8))
    };
    embedded([0, 0, 0, 0, 0, 0xffff])
        .or_else(|| embedded([0, 0, 0, 0, 0, 0]))
        .or_else(|| embedded([0x64, 0xff9b, 0, 0, 0, 0]))
        .and_then(forbidden_v4)
}

/// Whether a DNS name is reserved for the local host (RFC 6761:
/// `localhost` and every name under it), so it never needs resolving to
/// know it is refused.
pub fn is_local_name(name: &str) -> bool {
    let n = name.trim_end_matches('.').to_ascii_lowercase();
    n == "localhost" || n.ends_with(".localhost") || n == "localhost.localdomain"
}

/// Whether `getaddrinfo` would read `name` as an IPv4 address in one of
/// `inet_aton`'s legacy forms (`0x7f000001`, `127.1`, `017700000001`)
/// rather than look it up: such a "name" is an address in disguise.
pub fn is_numeric_address(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    let parts: Vec<&str> = name.split('.').collect();
    let numeric = |p: &str| {
        let lower = p.to_ascii_lowercase();
        match lower.strip_prefix("0x") {
            Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
            None => !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()),
        }
    };
    (1..=4).contains(&parts.len()) && parts.iter().all(|p| numeric(p))
}

/// Why an `ExternalName` host (a DNS name or an IP literal) is refused.
pub fn forbidden_external_name(host: &str) -> Option<&'static str> {
    if is_local_name(host) {
        return Some("a name of the local host");
    }
    host.parse::<IpAddr>().ok().and_then(forbidden)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: &str) -> bool {
        forbidden(s.parse().unwrap()).is_some()
    }

    #[test]
    fn local_addresses_in_every_spelling_are_refused() {
        for bad in [
            "127.0.0.1",
            "127.255.1.2",
            "0.0.0.0",
            "0.1.2.3",
            "169.254.169.254",
            "::1",
            "::",
            "fe80::1",
            "febf::1",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::7f00:1",
            "::ffff:0.0.0.0",
        ] {
            assert!(refused(bad), "{bad}");
        }
        for ok in [
            "10.0.0.1",
            "192.168.1.1",
            "8.8.8.8",
            "126.255.255.255",
            "128.0.0.1",
            "169.253.0.1",
            "fd00::1",
            "2001:db8::1",
            "fec0::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!refused(ok), "{ok}");
        }
    }

    #[test]
    fn numeric_forms_are_addresses() {
        for n in [
            "0x7f000001",
            "127.1",
            "017700000001",
            "2130706433",
            "0x7f.1",
            "10.0.0.1",
            "1.2.3.4.",
        ] {
            assert!(is_numeric_address(n), "{n}");
        }
        for n in ["example.com", "0x7g000001", "a.1", "1.2.3.4.5", "db-0x1.example", ""] {
            assert!(!is_numeric_address(n), "{n}");
        }
    }

    #[test]
    fn local_names() {
        for bad in [
            "localhost",
            "LOCALHOST.",
            "a.localhost",
            "localhost.localdomain",
            "127.0.0.1",
            "::1",
        ] {
            assert!(forbidden_external_name(bad).is_some(), "{bad}");
        }
        for ok in ["example.com", "localhost.example.com", "mylocalhost", "10.1.2.3"] {
            assert!(forbidden_external_name(ok).is_none(), "{ok}");
        }
    }
}
