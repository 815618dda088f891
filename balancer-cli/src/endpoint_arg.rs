//! `--endpoint ADDR:PORT[@WEIGHT]`, parsed into the wire contract's
//! [`Endpoint`].
//!
//! The address must be an IP address: a DNS name is valid on the wire only
//! for an `ExternalName` service, which `put -f` can send but flags do not
//! build. IPv6 addresses go in brackets (`[fd00::7]:8080`), as in a URL,
//! because without them the last `:` could belong to the address. The weight
//! maps to the endpoint's `weight` field (1 to `MAX_WEIGHT`, default 1),
//! which round_robin, least_conn and chash honour; it is checked here so a
//! typo is reported against the flag rather than as a JSON path.

use std::net::IpAddr;

use lua_compat::validate::MAX_WEIGHT;
use lua_compat::wire::{Endpoint, Port};

/// Parses one `--endpoint` value; the error says what is wrong with it.
pub fn parse(arg: &str) -> Result<Endpoint, String> {
    let (addr_port, weight) = match arg.rsplit_once('@') {
        Some((a, w)) => (a, Some(parse_weight(w)?)),
        None => (arg, None),
    };
    let (address, port) = if let Some(rest) = addr_port.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{arg:?}: a '[' without its ']'"))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| format!("{arg:?}: expected [ADDR]:PORT"))?;
        match inside.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => (inside, port),
            _ => return Err(format!("{arg:?}: {inside:?} in brackets is not an IPv6 address")),
        }
    } else {
        let (address, port) = addr_port
            .rsplit_once(':')
            .ok_or_else(|| format!("{arg:?}: expected ADDR:PORT[@WEIGHT]"))?;
        if address.contains(':') {
            return Err(format!("{arg:?}: an IPv6 address goes in brackets: [{address}]:{port}"));
        }
        if address.parse::<IpAddr>().is_err() {
            return Err(format!("{arg:?}: {address:?} is not an IP address"));
        }
        (address, port)
    };
    Ok(Endpoint {
        address: address.to_string(),
        port: Port(parse_port(port).ok_or_else(|| format!("{arg:?}: {port:?} is not a port (1-65535)"))?),
        weight,
    })
}

fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u16>().ok().filter(|p| *p > 0)
}

fn parse_weight(s: &str) -> Result<u32, String> {
    let ok = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match s.parse::<u32>() {
        Ok(w) if ok && (1..=MAX_WEIGHT).contains(&w) => Ok(w),
        _ => Err(format!("weight {s:?} is not a number from 1 to {MAX_WEIGHT}")),
    }
}

/// An endpoint as the CLI prints it: `ADDR:PORT`, IPv6 in brackets, and
/// `@WEIGHT` when the backend sets one, so it reads back as an `--endpoint`.
pub fn display(e: &Endpoint) -> String {
    let host = match e.address.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{}]", e.address),
        _ => e.address.clone(),
    };
    match e.weight {
        Some(w) => format!("{host}:{}@{w}", e.port.0),
        None => format!("{host}:{}", e.port.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(address: &str, port: u16, weight: Option<u32>) -> Endpoint {
        Endpoint {
            address: address.into(),
            port: Port(port),
            weight,
        }
    }

    #[test]
    fn ipv4_ipv6_and_weights() {
        assert_eq!(parse("10.0.0.1:8080"), Ok(ep("10.0.0.1", 8080, None)));
        assert_eq!(parse("10.0.0.1:8080@5"), Ok(ep("10.0.0.1", 8080, Some(5))));
        assert_eq!(parse("[::1]:80"), Ok(ep("::1", 80, None)));
        assert_eq!(
            parse("[fd00:10:244::7]:443@10000"),
            Ok(ep("fd00:10:244::7", 443, Some(10000)))
        );
        assert_eq!(parse("[::ffff:10.0.0.1]:1"), Ok(ep("::ffff:10.0.0.1", 1, None)));
        assert_eq!(parse("127.0.0.1:65535@1"), Ok(ep("127.0.0.1", 65535, Some(1))));
    }

    #[test]
    fn refusals_name_the_problem() {
        let err = |s: &str| parse(s).unwrap_err();
        assert!(err("::1:80").contains("brackets: [::1]:80"), "{}", err("::1:80"));
        assert!(err("fd00::7").contains("brackets"));
        assert!(err("10.0.0.1").contains("ADDR:PORT"));
        assert!(err("[::1]80").contains("[ADDR]:PORT"));
        assert!(err("[::1:80").contains("without its ']'"));
        assert!(err("[10.0.0.1]:80").contains("not an IPv6 address"));
        assert!(err("example.com:80").contains("not an IP address"));
        assert!(err("10.0.0.300:80").contains("not an IP address"));
        for port in ["0", "65536", "", "+80", "80x", " 80"] {
            assert!(err(&format!("10.0.0.1:{port}")).contains("is not a port"), "{port}");
        }
        for weight in ["0", "10001", "", "-1", "+3", "1.5", "x"] {
            assert!(
                err(&format!("10.0.0.1:80@{weight}")).contains("is not a number from 1 to 10000"),
                "{weight}"
            );
        }
        assert!(err("[::1]:80@").contains("weight"));
    }

    #[test]
    fn display_reads_back() {
        for s in ["10.0.0.1:8080", "[::1]:80@3", "[fd00::7]:8080", "192.0.2.1:1@10000"] {
            assert_eq!(display(&parse(s).unwrap()), s);
        }
        assert_eq!(display(&ep("db.example.com", 5432, None)), "db.example.com:5432");
    }
}
