//! An upstream HTTP server that answers with its own identity.
//!
//! Responses carry `X-Upstream: <identity>` and `X-Peer: <client addr>`. The
//! client address is nginx's side of the upstream connection, so equal values
//! across requests prove that nginx reused the connection (keepalive).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tiny_http::{Header, Response, Server};

pub struct Upstream {
    /// The address it listens on (127.0.0.1, ::1, or the pod address).
    pub address: String,
    pub port: u16,
    pub identity: String,
    server: Arc<Server>,
    thread: Option<JoinHandle<()>>,
    hits: Arc<AtomicUsize>,
    peers: Arc<Mutex<Vec<String>>>,
}

impl Upstream {
    /// Listens on 127.0.0.1, on a free port.
    pub fn start() -> Upstream {
        Self::start_on(false, Duration::ZERO, None)
    }

    /// Listens on `[::1]`.
    pub fn start_v6() -> Upstream {
        Self::start_on(true, Duration::ZERO, None)
    }

    /// Listens on the pod network's address (see [`crate::pod_network`]),
    /// which a real apiserver accepts in an EndpointSlice.
    pub fn start_in_pod_network() -> Upstream {
        let (server, port) = loop {
            let port = crate::free_port();
            let addr = format!("{}:{port}", crate::pod_network::POD_IP);
            if let Ok(server) = crate::pod_network::inside(move || Server::http(addr).map_err(|e| e.to_string())) {
                break (Arc::new(server), port);
            }
        };
        Self::serve(
            server,
            crate::pod_network::POD_IP.to_string(),
            port,
            format!("pod-{port}"),
            Duration::ZERO,
        )
    }

    /// Listens on `ip:port` in the pod network (one of
    /// [`crate::pod_network::POD_IPS`]); `None` if the port is taken there.
    pub fn start_on_pod_ip(ip: &str, port: u16) -> Option<Upstream> {
        let addr = format!("{ip}:{port}");
        let server = crate::pod_network::inside(move || Server::http(addr).map_err(|e| e.to_string())).ok()?;
        Some(Self::serve(
            Arc::new(server),
            ip.to_string(),
            port,
            format!("pod-{ip}"),
            Duration::ZERO,
        ))
    }

    /// Answers every request after `delay` (each request on its own thread,
    /// so slow answers overlap, as a stalled pod's would).
    pub fn start_slow(delay: Duration) -> Upstream {
        Self::start_on(false, delay, None)
    }

    /// Listens again on `port` (after a previous upstream there was dropped).
    pub fn restart_on(port: u16) -> Upstream {
        Self::start_on(false, Duration::ZERO, Some(port))
    }

    fn start_on(ipv6: bool, delay: Duration, fixed_port: Option<u16>) -> Upstream {
        let (server, port) = loop {
            let port = fixed_port.unwrap_or_else(crate::free_port);
            let addr = if ipv6 {
                format!("[::1]:{port}")
            } else {
                format!("127.0.0.1:{port}")
            };
            if let Ok(server) = Server::http(addr) {
                break (Arc::new(server), port);
            }
        };
        let identity = if ipv6 {
            format!("up6-{port}")
        } else {
            format!("up-{port}")
        };
        let address = if ipv6 { "::1" } else { "127.0.0.1" };
        Self::serve(server, address.to_string(), port, identity, delay)
    }

    fn serve(server: Arc<Server>, address: String, port: u16, identity: String, delay: Duration) -> Upstream {
        let hits = Arc::new(AtomicUsize::new(0));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (server, identity, hits, peers) = (server.clone(), identity.clone(), hits.clone(), peers.clone());
            std::thread::spawn(move || {
                for request in server.incoming_requests() {
                    hits.fetch_add(1, Ordering::Relaxed);
                    let peer = request.remote_addr().map(|a| a.to_string()).unwrap_or_default();
                    peers.lock().unwrap().push(peer.clone());
                    let mut response = Response::from_string(identity.clone())
                        .with_header(Header::from_bytes("X-Upstream", identity.as_bytes()).unwrap())
                        .with_header(Header::from_bytes("X-Peer", peer.as_bytes()).unwrap());
                    // The request target as the proxy sent it.
                    response.add_header(Header::from_bytes("X-Echo-Uri", request.url().as_bytes()).unwrap());
                    // What the proxy added, echoed as X-Echo-<name>.
                    for h in request.headers() {
                        let name = h.field.as_str().as_str();
                        let lower = name.to_ascii_lowercase();
                        if lower == "x-request-id"
                            || lower == "host"
                            || lower.starts_with("x-gw-")
                            || lower == "x-scheme"
                            || lower == "x-real-ip"
                            || lower.starts_with("x-forwarded-")
                            || lower.starts_with("x-auth-")
                            || lower.starts_with("ssl-client-")
                            || lower == "traceparent"
                            || lower == "tracestate"
                        {
                            let echoed = format!("X-Echo-{name}");
                            response.add_header(Header::from_bytes(echoed.as_bytes(), h.value.as_bytes()).unwrap());
                        }
                        // `X-Respond-<Name>: v` asks for `<Name>: v` in the
                        // answer (Set-Cookie, Location, a large header).
                        if let Some(asked) = name.get(10..).filter(|_| lower.starts_with("x-respond-")) {
                            response.add_header(Header::from_bytes(asked.as_bytes(), h.value.as_bytes()).unwrap());
                        }
                    }
                    // `X-Fail-On: <identity>`: that upstream answers 503
                    // (one endpoint of several failing).
                    let fail = request
                        .headers()
                        .iter()
                        .any(|h| h.field.equiv("X-Fail-On") && h.value.as_str() == identity);
                    if fail {
                        response = response.with_status_code(503);
                    }
                    if delay.is_zero() {
                        let _ = request.respond(response);
                    } else {
                        std::thread::spawn(move || {
                            std::thread::sleep(delay);
                            let _ = request.respond(response);
                        });
                    }
                }
            })
        };
        Upstream {
            address,
            port,
            identity,
            server,
            thread: Some(thread),
            hits,
            peers,
        }
    }

    /// `{"address": .., "port": ".."}` as ingress-nginx sends it.
    pub fn endpoint(&self) -> serde_json::Value {
        serde_json::json!({"address": self.address, "port": self.port.to_string()})
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }

    /// nginx-side addresses of the connections requests arrived on, in order.
    pub fn peers(&self) -> Vec<String> {
        self.peers.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A plain HTTP/1.1 upstream on 127.0.0.1 that records each request's head
/// (request line and headers, as sent) and answers `200` with `body`,
/// closing the connection. For tests that check what nginx sent upstream.
pub fn recording(body: &'static str) -> (u16, Arc<Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let seen = Arc::new(Mutex::new(Vec::new()));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let record = seen.clone();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            record.lock().unwrap().push(head);
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(answer.as_bytes());
        }
    });
    (port, seen)
}
