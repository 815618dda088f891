//! WebSocket through the controller's rendered location: the Upgrade and
//! Connection headers reach the backend, frames flow both ways over the
//! upgraded connection, and the request is counted (status 101) once it
//! ends.

use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tests::controller::{ingress, service, wait_until, Controller, INGRESS_CLASS};
use tungstenite::handshake::server::{Request, Response};
use tungstenite::Message;

/// The (Upgrade, Connection) headers of each handshake the backend saw.
type Handshakes = Arc<Mutex<Vec<(String, String)>>>;

/// An echo server, a thread per connection; records each handshake's
/// Upgrade and Connection headers.
// tungstenite's handshake callback returns its (large) error response type.
#[allow(clippy::result_large_err)]
fn echo_server() -> (u16, Handshakes) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let record = record.clone();
            std::thread::spawn(move || {
                let callback = |req: &Request, resp: Response| {
                    let header = |n: &str| {
                        req.headers()
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string()
                    };
                    record.lock().unwrap().push((header("upgrade"), header("connection")));
                    Ok(resp)
                };
                let Ok(mut ws) = tungstenite::accept_hdr(stream, callback) else {
                    return;
                };
                while let Ok(msg) = ws.read() {
                    if (msg.is_text() || msg.is_binary()) && ws.send(msg).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

#[test]
fn websocket_frames_flow_through_the_rendered_location() {
    let (port, seen) = echo_server();
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc.yaml", service("ws", &[port])),
            ("ing.yaml", ingress("ws", "ws.test", "/", "ws", &[])),
        ],
        &[],
    );
    let stream = TcpStream::connect(("127.0.0.1", c.http_port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut ws, resp) = tungstenite::client::client("ws://ws.test/chat", stream).expect("upgraded through nginx");
    assert_eq!(resp.status().as_u16(), 101);
    for text in ["hello", "second frame"] {
        ws.send(Message::text(text)).unwrap();
        assert_eq!(ws.read().unwrap(), Message::text(text));
    }
    ws.send(Message::binary(vec![0u8, 1, 2, 255])).unwrap();
    assert_eq!(ws.read().unwrap(), Message::binary(vec![0u8, 1, 2, 255]));
    let handshake = seen.lock().unwrap().clone();
    assert_eq!(handshake.len(), 1);
    assert_eq!(handshake[0].0.to_ascii_lowercase(), "websocket");
    assert_eq!(handshake[0].1.to_ascii_lowercase(), "upgrade");
    ws.close(None).unwrap();
    while ws.read().is_ok() {}
    drop(ws);

    // Counted when the upgraded connection ends, as a 101.
    let counted = wait_until(Duration::from_secs(10), || {
        let (_, m) = c.api_get("/configuration/metrics").unwrap_or_default();
        m.lines().any(|l| {
            l.starts_with("nginx_ingress_controller_requests{")
                && l.contains(r#"ingress="ws""#)
                && l.contains(r#"status="101""#)
                && l.ends_with(" 1")
        })
    });
    assert!(counted, "{:?}", c.api_get("/configuration/metrics"));
    c.stop();
}
