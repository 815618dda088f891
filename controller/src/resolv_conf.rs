//! The DNS servers of `/etc/resolv.conf`, for nginx's `resolver`: an
//! `auth-url` naming a host is resolved per request, as ingress-nginx does,
//! by the same servers the pod uses (the cluster DNS in Kubernetes).

use std::net::IpAddr;

/// The `nameserver` addresses of a resolv.conf text, in order. Link-local
/// IPv6 servers with a zone (`fe80::1%eth0`) are skipped: nginx's
/// `resolver` cannot name an interface.
pub fn nameservers(text: &str) -> Vec<IpAddr> {
    text.lines()
        .map(|l| l.split(['#', ';']).next().unwrap_or_default())
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next()).flatten()
        })
        .filter_map(|a| a.parse().ok())
        .collect()
}

/// `/etc/resolv.conf`'s servers; none when it cannot be read.
pub fn system() -> Vec<IpAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .map(|t| nameservers(&t))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nameserver_lines_are_read() {
        let text = "# generated\nsearch svc.cluster.local\nnameserver 10.96.0.10\nnameserver fd00::a # v6\n\
                    nameserver fe80::1%eth0\noptions ndots:5\n;nameserver 1.1.1.1\n";
        let want: Vec<IpAddr> = vec!["10.96.0.10".parse().unwrap(), "fd00::a".parse().unwrap()];
        assert_eq!(nameservers(text), want);
        assert!(nameservers("").is_empty());
    }
}
