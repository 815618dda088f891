//! HTTP/2 (over TLS, ALPN `h2`) and HTTP/3 (QUIC) clients for the tests,
//! each one request on a fresh connection. Server certificates are not
//! verified: the tests' certificates are self-signed, and what a test
//! checks is the routing, not the trust chain.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// What a request got back.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
    /// The protocol version the answer came in.
    pub version: http::Version,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Accepts any server certificate (test-only).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn tls_config(alpn: &[u8], tls13_only: bool) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = if tls13_only {
        &[&rustls::version::TLS13]
    } else {
        rustls::DEFAULT_VERSIONS
    };
    let mut c = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .expect("ring supports these versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    c.alpn_protocols = vec![alpn.to_vec()];
    c
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn request(host: &str, path: &str, headers: &[(&str, &str)]) -> Result<http::Request<()>, String> {
    let mut b = http::Request::get(format!("https://{host}{path}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).map_err(|e| e.to_string())
}

/// One GET over HTTP/2 on TLS to `127.0.0.1:port`, SNI and `:authority`
/// `host`; fails if the server does not agree to `h2` by ALPN.
pub fn h2_get(port: u16, host: &str, path: &str, headers: &[(&str, &str)]) -> Result<Reply, String> {
    let req = request(host, path, headers)?;
    let host = host.to_string();
    runtime().block_on(async move {
        tokio::time::timeout(Duration::from_secs(10), async {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map_err(|e| e.to_string())?;
            let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_config(b"h2", false)));
            let name = ServerName::try_from(host).map_err(|e| e.to_string())?;
            let tls = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
            if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                return Err("the server did not agree to h2".to_string());
            }
            let (mut client, conn) = h2::client::handshake(tls).await.map_err(|e| e.to_string())?;
            let driver = tokio::spawn(conn);
            let (answer, _) = client.send_request(req, true).map_err(|e| e.to_string())?;
            let answer = answer.await.map_err(|e| e.to_string())?;
            let (parts, mut body) = answer.into_parts();
            let mut bytes = Vec::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.map_err(|e| e.to_string())?;
                let _ = body.flow_control().release_capacity(chunk.len());
                bytes.extend_from_slice(&chunk);
            }
            drop(client);
            driver.abort();
            Ok(Reply {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body: bytes,
                version: parts.version,
            })
        })
        .await
        .map_err(|_| "HTTP/2 request timed out".to_string())?
    })
}

/// One GET over HTTP/3 (QUIC, UDP) to `127.0.0.1:port`, SNI and
/// `:authority` `host`.
pub fn h3_get(port: u16, host: &str, path: &str, headers: &[(&str, &str)]) -> Result<Reply, String> {
    let req = request(host, path, headers)?;
    let host = host.to_string();
    runtime().block_on(async move {
        tokio::time::timeout(Duration::from_secs(10), async {
            let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).map_err(|e| e.to_string())?;
            let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls_config(b"h3", true))
                .map_err(|e| e.to_string())?;
            endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let conn = endpoint
                .connect(addr, &host)
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| format!("QUIC handshake: {e}"))?;
            // No GREASE frames: nginx 1.28 answers 400 ("client prematurely
            // closed stream") when a reserved frame type ends a request stream.
            let (mut driver, mut sender) = h3::client::builder()
                .send_grease(false)
                .build::<_, _, bytes::Bytes>(h3_quinn::Connection::new(conn))
                .await
                .map_err(|e| e.to_string())?;
            let drive = tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
            let mut stream = sender.send_request(req).await.map_err(|e| e.to_string())?;
            stream.finish().await.map_err(|e| e.to_string())?;
            let answer = stream.recv_response().await.map_err(|e| e.to_string())?;
            let mut body = Vec::new();
            while let Some(mut chunk) = stream.recv_data().await.map_err(|e| e.to_string())? {
                body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
            }
            drop(sender);
            drive.abort();
            // Close the connection properly: nginx keeps an unclosed QUIC
            // connection (and a worker that is shutting down) until it
            // times out.
            endpoint.close(0u32.into(), b"done");
            endpoint.wait_idle().await;
            Ok(Reply {
                status: answer.status().as_u16(),
                headers: answer.headers().clone(),
                body,
                version: answer.version(),
            })
        })
        .await
        .map_err(|_| "HTTP/3 request timed out".to_string())?
    })
}
