//! Where the API is (`--api http://HOST:PORT` or `--unix PATH`) and one
//! request/response exchange over a fresh connection, within a deadline.
//!
//! A fresh connection per request keeps the client stateless: `watch` polls
//! once a second at most, and with `Connection: close` nginx frees the
//! connection at once. The deadline covers the whole exchange (connect,
//! write, every read), so `--timeout` bounds how long a command can hang on
//! a stuck server, not only how long one read may wait. Two waits are
//! outside it: resolving a host name (the system resolver has no deadline;
//! the API's address is normally an IP literal) and connecting to a unix
//! socket, which succeeds or fails at once unless its backlog is full.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::http::{parse_response, Response};

/// The API's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `host` as written in the URL (an IPv6 address keeps its brackets).
    Tcp {
        host: String,
        port: u16,
    },
    Unix(PathBuf),
}

impl Target {
    /// Reads `http://HOST[:PORT][/]`. The API's routes start at
    /// `/configuration` on their server, so the URL carries no path.
    pub fn from_url(url: &str) -> Result<Target, String> {
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(if url.starts_with("https://") {
                format!("{url:?}: the API is plain HTTP on a local listener; https is not supported")
            } else {
                format!("{url:?}: expected http://HOST:PORT")
            });
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#', '@']) {
            return Err(format!(
                "{url:?}: expected http://HOST:PORT without a path (the routes are /configuration/...)"
            ));
        }
        let (host, port) = if let Some(inside) = authority.strip_prefix('[') {
            let (v6, after) = inside
                .split_once(']')
                .ok_or_else(|| format!("{url:?}: a '[' without its ']'"))?;
            if v6.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("{url:?}: {v6:?} is not an IPv6 address"));
            }
            (format!("[{v6}]"), after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() || host.contains(':') && !host.starts_with('[') {
            return Err(format!("{url:?}: expected http://HOST:PORT (an IPv6 host in brackets)"));
        }
        let port = match port {
            None => 80,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("{url:?}: {p:?} is not a port"))?,
        };
        Ok(Target::Tcp { host, port })
    }

    /// The `Host` header: the URL's authority, or `localhost` on a socket.
    pub fn host_header(&self) -> String {
        match self {
            Target::Tcp { host, port } => format!("{host}:{port}"),
            Target::Unix(_) => "localhost".into(),
        }
    }

    /// How error messages name it.
    pub fn describe(&self) -> String {
        match self {
            Target::Tcp { host, port } => format!("http://{host}:{port}"),
            Target::Unix(path) => format!("unix:{}", path.display()),
        }
    }
}

/// Why an exchange produced no response.
#[derive(Debug, PartialEq, Eq)]
pub enum TransportError {
    /// Nothing accepted the connection.
    Connect(String),
    /// The deadline passed.
    Timeout(String),
    /// The connection broke, or what came back is not an HTTP response.
    Broken(String),
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportError::Connect(m) | TransportError::Timeout(m) | TransportError::Broken(m) => f.write_str(m),
        }
    }
}

/// Largest response read (a listing of 20,000 backends is about 40 MB).
const MAX_RESPONSE: usize = 1 << 30;

enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn set_timeouts(&self, t: Duration) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_read_timeout(Some(t)).and(s.set_write_timeout(Some(t))),
            Conn::Unix(s) => s.set_read_timeout(Some(t)).and(s.set_write_timeout(Some(t))),
        }
    }

    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.write_all(b),
            Conn::Unix(s) => s.write_all(b),
        }
    }

    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(b),
            Conn::Unix(s) => s.read(b),
        }
    }
}

/// Sends `request` (encoded) and reads the response, all within `timeout`.
pub fn exchange(target: &Target, request: &[u8], timeout: Duration) -> Result<Response, TransportError> {
    let deadline = Instant::now() + timeout;
    let remaining = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| TransportError::Timeout(format!("no answer from {} within {timeout:?}", target.describe())))
    };
    let mut conn = connect(target, remaining()?)?;
    conn.set_timeouts(remaining()?)
        .map_err(|e| TransportError::Broken(e.to_string()))?;
    // A server may answer before it read the whole request (a 413, say)
    // and close; the answer is still read and reported.
    let write_error = conn.write_all(request).err();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let eof = match conn.set_timeouts(remaining()?).and_then(|()| conn.read(&mut chunk)) {
            Ok(0) => true,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                false
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(TransportError::Timeout(format!(
                    "no complete answer from {} within {timeout:?}",
                    target.describe()
                )))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(TransportError::Broken(format!(
                    "reading from {}: {e}",
                    target.describe()
                )))
            }
        };
        if buf.len() > MAX_RESPONSE {
            return Err(TransportError::Broken(format!(
                "the answer is larger than {MAX_RESPONSE} bytes"
            )));
        }
        match parse_response(&buf, eof) {
            Ok(Some(response)) => return Ok(response),
            Ok(None) => {}
            Err(e) => {
                let e = match write_error {
                    Some(w) if buf.is_empty() => format!("sending to {}: {w}", target.describe()),
                    _ => format!("{}: {e}", target.describe()),
                };
                return Err(TransportError::Broken(e));
            }
        }
    }
}

fn connect(target: &Target, timeout: Duration) -> Result<Conn, TransportError> {
    match target {
        Target::Unix(path) => UnixStream::connect(path)
            .map(Conn::Unix)
            .map_err(|e| TransportError::Connect(format!("cannot connect to {}: {e}", target.describe()))),
        Target::Tcp { host, port } => {
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            let addrs: Vec<_> = (bare, *port)
                .to_socket_addrs()
                .map_err(|e| TransportError::Connect(format!("cannot resolve {host}: {e}")))?
                .collect();
            let mut last = format!("cannot resolve {host}: no addresses");
            for addr in addrs {
                match TcpStream::connect_timeout(&addr, timeout) {
                    Ok(s) => return Ok(Conn::Tcp(s)),
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        return Err(TransportError::Timeout(format!(
                            "cannot connect to {}: no answer within {timeout:?}",
                            target.describe()
                        )))
                    }
                    Err(e) => last = format!("cannot connect to {} ({addr}): {e}", target.describe()),
                }
            }
            Err(TransportError::Connect(last))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let tcp = |h: &str, p| {
            Ok(Target::Tcp {
                host: h.into(),
                port: p,
            })
        };
        assert_eq!(Target::from_url("http://127.0.0.1:10246"), tcp("127.0.0.1", 10246));
        assert_eq!(Target::from_url("http://127.0.0.1:10246/"), tcp("127.0.0.1", 10246));
        assert_eq!(Target::from_url("http://localhost"), tcp("localhost", 80));
        assert_eq!(Target::from_url("http://[::1]:8080"), tcp("[::1]", 8080));
        assert_eq!(Target::from_url("http://[::1]"), tcp("[::1]", 80));
        for bad in [
            "127.0.0.1:10246",
            "https://127.0.0.1:10246",
            "http://127.0.0.1:10246/configuration",
            "http://127.0.0.1:0",
            "http://127.0.0.1:x",
            "http://::1:80",
            "http://[::1:80",
            "http://[nothost]:80",
            "http://",
            "http://u@host:1",
        ] {
            assert!(Target::from_url(bad).is_err(), "{bad}");
        }
        assert!(Target::from_url("https://x")
            .unwrap_err()
            .contains("https is not supported"));
        let t = Target::from_url("http://[::1]:8080").unwrap();
        assert_eq!(
            (t.host_header(), t.describe()),
            ("[::1]:8080".into(), "http://[::1]:8080".into())
        );
        let u = Target::Unix("/run/api.sock".into());
        assert_eq!(
            (u.host_header(), u.describe()),
            ("localhost".into(), "unix:/run/api.sock".into())
        );
    }
}
