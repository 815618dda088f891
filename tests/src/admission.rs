//! A caller of the validating webhook: AdmissionReviews POSTed over TLS
//! straight to its port, as the apiserver sends them, or as any Pod that
//! can reach the port could.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use openssl::ssl::{Ssl, SslContext, SslMethod, SslVerifyMode};
use serde_json::{json, Value};

/// A webhook certificate and key, written to `dir` as `cert` and `key`;
/// returns their paths for `--validating-webhook-certificate` and `-key`.
pub fn webhook_certificate(dir: &std::path::Path) -> (String, String) {
    let c = crate::tls::TestCert::new("localhost");
    let (cert, key) = (dir.join("webhook.crt"), dir.join("webhook.key"));
    std::fs::write(&cert, &c.cert_pem).unwrap();
    std::fs::write(&key, &c.key_pem).unwrap();
    (cert.display().to_string(), key.display().to_string())
}

/// An AdmissionReview (v1) asking to create `ingress`.
pub fn review_of(ingress: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000001",
            "operation": "CREATE",
            "name": ingress["metadata"]["name"],
            "namespace": ingress["metadata"]["namespace"],
            "kind": {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"},
            "resource": {"group": "networking.k8s.io", "version": "v1", "resource": "ingresses"},
            "userInfo": {"username": "system:serviceaccount:tenant:attacker"},
            "object": ingress
        }
    })
}

/// An Ingress of namespace `demo` for `host` `/` → Service `web`, with
/// `annotations` (names without the `nginx.ingress.kubernetes.io/` prefix).
pub fn ingress_json(name: &str, host: &str, annotations: &[(&str, &str)]) -> Value {
    let ann: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), json!(v)))
        .collect();
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"namespace": "demo", "name": name, "annotations": ann},
        "spec": {"ingressClassName": "nginx", "rules": [{"host": host, "http": {"paths": [
            {"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}
    })
}

/// POSTs `body` to `https://127.0.0.1:port/networking/v1/ingresses`;
/// returns the status and the body (JSON, or `Value::String` if not).
pub fn post(port: u16, body: &[u8]) -> std::io::Result<(u16, Value)> {
    // A bare context: SslConnector would load the system CA store on every
    // call, which costs far more than the review (the certificate is not
    // verified anyway).
    let mut b = SslContext::builder(SslMethod::tls_client()).map_err(std::io::Error::other)?;
    b.set_verify(SslVerifyMode::NONE);
    let ctx = b.build();
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    // As the apiserver's client does: no Nagle delay behind the handshake.
    tcp.set_nodelay(true)?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    tcp.set_write_timeout(Some(Duration::from_secs(30)))?;
    let mut ssl = Ssl::new(&ctx).map_err(std::io::Error::other)?;
    ssl.set_hostname("localhost").map_err(std::io::Error::other)?;
    let mut tls = ssl.connect(tcp).map_err(std::io::Error::other)?;
    let head = format!(
        "POST /networking/v1/ingresses HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // One write: a head and a body in two small TLS records would wait
    // for the delayed ACK between them (Nagle).
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    // A body the server refuses early may close the connection under us.
    let _ = tls.write_all(&request);
    // Read the head, then as much body as Content-Length says (waiting
    // for the server to close would time its TLS shutdown, not its answer).
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match tls.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        raw.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&raw);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            });
            if length.is_some_and(|len| body.len() >= len) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no HTTP answer: {text:?}")))?;
    let payload = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let value = serde_json::from_str(payload).unwrap_or_else(|_| Value::String(payload.to_string()));
    Ok((status, value))
}

/// The webhook's verdict on creating `ingress`: `Ok(())` if allowed, else
/// the denial's message.
pub fn verdict(port: u16, ingress: &Value) -> Result<(), String> {
    let (status, answer) = post(port, review_of(ingress).to_string().as_bytes()).expect("the webhook answers");
    assert_eq!(status, 200, "{answer}");
    let response = &answer["response"];
    assert_eq!(response["uid"], "00000000-0000-0000-0000-000000000001", "{answer}");
    if response["allowed"] == true {
        Ok(())
    } else {
        Err(response["status"]["message"].as_str().unwrap_or_default().to_string())
    }
}
