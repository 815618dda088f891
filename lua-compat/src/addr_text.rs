//! nginx's text form of a listening address (`ngx_listening_t.addr_text`):
//! `ip:port`, `[ip6]:port`, or `unix:path`.

/// The port digits at the end of an inet address text, if that is its
/// shape: `$server_port` without formatting a number per request.
pub fn port_digits(text: &[u8]) -> Option<&[u8]> {
    let colon = text.iter().rposition(|&b| b == b':')?;
    let digits = &text[colon + 1..];
    (!digits.is_empty() && digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit)).then_some(digits)
}

/// `port` in decimal, into `buf`; the digits used. For a port no listener
/// text holds (a PROXY protocol header's destination port).
pub fn port_decimal(port: u16, buf: &mut [u8; 5]) -> &[u8] {
    let mut n = port;
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{port_decimal, port_digits};
    use proptest::prelude::*;

    #[test]
    fn the_port_of_an_address_text() {
        assert_eq!(port_digits(b"0.0.0.0:80"), Some(&b"80"[..]));
        assert_eq!(port_digits(b"[::1]:65535"), Some(&b"65535"[..]));
        assert_eq!(port_digits(b"unix:/run/x.sock"), None);
        assert_eq!(port_digits(b"unix:/run/x:1.sock"), None);
        assert_eq!(port_digits(b"127.0.0.1:"), None);
        assert_eq!(port_digits(b"127.0.0.1:123456"), None);
    }

    #[test]
    fn ports_in_decimal() {
        let mut buf = [0u8; 5];
        for port in [0u16, 7, 80, 443, 8080, 10246, 65535] {
            assert_eq!(port_decimal(port, &mut buf), port.to_string().as_bytes());
        }
    }

    proptest! {
        /// Whatever nginx formats for an inet listener gives its port back.
        #[test]
        fn inet_texts_give_their_port(ip in any::<std::net::IpAddr>(), port in any::<u16>()) {
            let text = std::net::SocketAddr::new(ip, port).to_string();
            let digits = port.to_string();
            prop_assert_eq!(port_digits(text.as_bytes()), Some(digits.as_bytes()));
        }
    }
}
