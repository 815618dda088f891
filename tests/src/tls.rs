//! TLS for the tests: throwaway certificates, and a client handshake that
//! says which certificate the server presented.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{Ssl, SslAcceptor, SslContext, SslMethod, SslVerifyMode, SslVersion};
use openssl::x509::extension::SubjectAlternativeName;
use openssl::x509::{X509NameBuilder, X509};

/// A self-signed certificate and its key, PEM.
pub struct TestCert {
    pub cert_pem: String,
    pub key_pem: String,
    /// SHA-256 of the certificate's DER, lower-case hex (what the module's
    /// `GET /configuration/certificates` reports).
    pub sha256: String,
}

/// A `kubernetes.io/tls` Secret `name` in namespace `demo` holding `c`.
pub fn tls_secret(name: &str, c: &TestCert) -> String {
    let indent = |pem: &str| pem.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{namespace: demo, name: {name}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(&c.cert_pem),
        indent(&c.key_pem)
    )
}

impl TestCert {
    /// An ECDSA P-256 certificate for `cn` (also its only DNS SAN), valid
    /// from `from_days` to `to_days` relative to now.
    pub fn new(cn: &str) -> TestCert {
        Self::with_validity(cn, -1, 30)
    }

    pub fn with_validity(cn: &str, from_days: i64, to_days: i64) -> TestCert {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
        Self::signed_by_itself(cn, &key, from_days, to_days)
    }

    /// An RSA-2048 certificate (the common case in the wild).
    pub fn rsa(cn: &str) -> TestCert {
        let key = PKey::from_rsa(openssl::rsa::Rsa::generate(2048).unwrap()).unwrap();
        Self::signed_by_itself(cn, &key, -1, 30)
    }

    fn signed_by_itself(cn: &str, key: &PKey<Private>, from_days: i64, to_days: i64) -> TestCert {
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", cn).unwrap();
        let name = name.build();
        let mut b = X509::builder().unwrap();
        b.set_version(2).unwrap();
        let mut serial = BigNum::new().unwrap();
        serial.rand(64, MsbOption::MAYBE_ZERO, false).unwrap();
        b.set_serial_number(&serial.to_asn1_integer().unwrap()).unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(&name).unwrap();
        b.set_pubkey(key).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        b.set_not_before(&Asn1Time::from_unix(now + from_days * 86_400).unwrap())
            .unwrap();
        b.set_not_after(&Asn1Time::from_unix(now + to_days * 86_400).unwrap())
            .unwrap();
        let san = SubjectAlternativeName::new()
            .dns(cn)
            .build(&b.x509v3_context(None, None))
            .unwrap();
        b.append_extension(san).unwrap();
        b.sign(key, MessageDigest::sha256()).unwrap();
        let cert = b.build();
        TestCert {
            cert_pem: String::from_utf8(cert.to_pem().unwrap()).unwrap(),
            key_pem: String::from_utf8(key.private_key_to_pem_pkcs8().unwrap()).unwrap(),
            sha256: hex(&cert.digest(MessageDigest::sha256()).unwrap()),
        }
    }

    /// The body of `PUT /configuration/certificates/{id}`.
    pub fn body(&self) -> String {
        serde_json::json!({"certificate": self.cert_pem, "key": self.key_pem}).to_string()
    }

    /// 40 characters of the key's PEM body that are the secret itself (the
    /// first ones are ASN.1 headers every key of a kind shares), to look
    /// for where the key must not be.
    pub fn key_material(&self) -> String {
        let body: String = self.key_pem.lines().filter(|l| !l.starts_with("-----")).collect();
        body.chars().skip(60).take(40).collect()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a handshake showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presented {
    /// SHA-256 of the server's leaf certificate.
    pub sha256: String,
    /// Its subject CN.
    pub cn: String,
    /// The ALPN protocol agreed, if any.
    pub alpn: Option<String>,
}

/// A TLS connection to `127.0.0.1:port` with SNI `sni` (none if `None`),
/// offering ALPN `alpn`, the server's certificate not verified; 5 s per
/// read and write.
fn connect(port: u16, sni: Option<&str>, alpn: &[&str]) -> Result<openssl::ssl::SslStream<TcpStream>, String> {
    // A bare context: SslConnector would load the system CA store on every
    // call, which costs more than the handshake.
    let mut b = SslContext::builder(SslMethod::tls_client()).map_err(|e| e.to_string())?;
    b.set_verify(SslVerifyMode::NONE);
    b.set_min_proto_version(Some(SslVersion::TLS1_2)).unwrap();
    if !alpn.is_empty() {
        let mut wire = Vec::new();
        for p in alpn {
            wire.push(p.len() as u8);
            wire.extend(p.as_bytes());
        }
        b.set_alpn_protos(&wire).unwrap();
    }
    let ctx = b.build();
    let mut ssl = Ssl::new(&ctx).map_err(|e| e.to_string())?;
    if let Some(name) = sni {
        ssl.set_hostname(name).map_err(|e| e.to_string())?;
    }
    let stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream.set_nodelay(true).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    ssl.connect(stream).map_err(|e| e.to_string())
}

/// One full TLS handshake (no session reuse) to `127.0.0.1:port` with SNI
/// `sni` (none if `None`), offering ALPN `alpn`; the server's certificate is
/// not verified (they are self-signed), only reported.
pub fn handshake(port: u16, sni: Option<&str>, alpn: &[&str]) -> Result<Presented, String> {
    let tls = connect(port, sni, alpn)?;
    let cert = tls.ssl().peer_certificate().ok_or("no certificate presented")?;
    let cn = cert
        .subject_name()
        .entries_by_nid(Nid::COMMONNAME)
        .next()
        .and_then(|e| e.data().to_string().ok())
        .unwrap_or_default();
    Ok(Presented {
        sha256: hex(&cert.digest(MessageDigest::sha256()).unwrap()),
        cn,
        alpn: tls
            .ssl()
            .selected_alpn_protocol()
            .map(|p| String::from_utf8_lossy(p).into_owned()),
    })
}

/// One line through a line-echo server behind a TLS listener on
/// `127.0.0.1:port` that ends the TLS (SNI `sni`, no verification): the
/// SHA-256 of the certificate shown, and the echo's answer (`None` when
/// the connection closes first). `Err` when the handshake fails.
pub fn ask_over_tls(port: u16, sni: &str, message: &str) -> Result<(String, Option<String>), String> {
    let mut tls = connect(port, Some(sni), &[])?;
    let cert = tls.ssl().peer_certificate().ok_or("no certificate presented")?;
    let shown = hex(&cert.digest(MessageDigest::sha256()).unwrap());
    if tls.write_all(format!("{message}\n").as_bytes()).is_err() {
        return Ok((shown, None));
    }
    let mut line = String::new();
    let answer = match std::io::BufRead::read_line(&mut std::io::BufReader::new(&mut tls), &mut line) {
        Ok(n) if n > 0 && line.ends_with('\n') => Some(line.trim_end().to_string()),
        _ => None,
    };
    Ok((shown, answer))
}

/// A certificate authority for client certificates.
pub struct TestCa {
    pub cert: X509,
    key: PKey<Private>,
    pub cert_pem: String,
}

impl TestCa {
    /// A self-signed CA (`basicConstraints CA:TRUE`) named `cn`.
    pub fn new(cn: &str) -> TestCa {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
        let name = x509_name(cn);
        let mut b = certificate_builder(&name, &key);
        b.set_issuer_name(&name).unwrap();
        b.append_extension(
            openssl::x509::extension::BasicConstraints::new()
                .critical()
                .ca()
                .build()
                .unwrap(),
        )
        .unwrap();
        b.sign(&key, MessageDigest::sha256()).unwrap();
        let cert = b.build();
        TestCa {
            cert_pem: String::from_utf8(cert.to_pem().unwrap()).unwrap(),
            cert,
            key,
        }
    }

    /// A client certificate for `cn`, signed by this CA.
    pub fn issue(&self, cn: &str) -> TestCert {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
        let mut b = certificate_builder(&x509_name(cn), &key);
        b.set_issuer_name(self.cert.subject_name()).unwrap();
        b.sign(&self.key, MessageDigest::sha256()).unwrap();
        let cert = b.build();
        TestCert {
            cert_pem: String::from_utf8(cert.to_pem().unwrap()).unwrap(),
            key_pem: String::from_utf8(key.private_key_to_pem_pkcs8().unwrap()).unwrap(),
            sha256: hex(&cert.digest(MessageDigest::sha256()).unwrap()),
        }
    }
}

impl TestCa {
    /// A server certificate for `cn` with these DNS and URI subject
    /// alternative names, signed by this CA.
    pub fn issue_server(&self, cn: &str, dns: &[&str], uris: &[&str]) -> TestCert {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
        let mut b = certificate_builder(&x509_name(cn), &key);
        b.set_issuer_name(self.cert.subject_name()).unwrap();
        let mut san = openssl::x509::extension::SubjectAlternativeName::new();
        for d in dns {
            san.dns(d);
        }
        for u in uris {
            san.uri(u);
        }
        let ext = san.build(&b.x509v3_context(Some(&self.cert), None)).unwrap();
        b.append_extension(ext).unwrap();
        b.sign(&self.key, MessageDigest::sha256()).unwrap();
        let cert = b.build();
        TestCert {
            cert_pem: String::from_utf8(cert.to_pem().unwrap()).unwrap(),
            key_pem: String::from_utf8(key.private_key_to_pem_pkcs8().unwrap()).unwrap(),
            sha256: hex(&cert.digest(MessageDigest::sha256()).unwrap()),
        }
    }
}

/// A TLS server with `cert` that asks for a client certificate of
/// `clients` (optional) and answers every request with `200` and
/// `sni=<the SNI it got> client=<the client certificate's CN, or none>`.
pub fn tls_upstream_reporting(cert: &TestCert, clients: &TestCa) -> u16 {
    serve_reporting(cert, clients, |tls, report| {
        if !read_head(tls) {
            return;
        }
        let _ = tls.write_all(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{report}",
                report.len()
            )
            .as_bytes(),
        );
    })
}

/// A TLS server as [`tls_upstream_reporting`]'s that speaks lines: it
/// answers the first line it reads with `sni=<SNI> client=<CN or none>
/// line=<the line>`, for layer 4 (stream) backends.
pub fn tls_echo_reporting(cert: &TestCert, clients: &TestCa) -> u16 {
    serve_reporting(cert, clients, |tls, report| {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut std::io::BufReader::new(&mut *tls), &mut line).is_ok_and(|n| n > 0) {
            let _ = tls.write_all(format!("{report} line={}\n", line.trim_end()).as_bytes());
        }
    })
}

/// Serves TLS with `cert` on a free loopback port, asking for (not
/// requiring) a client certificate of `clients`; `answer` gets each
/// handshaken connection and its `sni=... client=...` report.
fn serve_reporting(
    cert: &TestCert,
    clients: &TestCa,
    answer: impl Fn(&mut openssl::ssl::SslStream<std::net::TcpStream>, &str) + Send + Sync + 'static,
) -> u16 {
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).unwrap();
    b.set_certificate(&X509::from_pem(cert.cert_pem.as_bytes()).unwrap())
        .unwrap();
    b.set_private_key(&PKey::private_key_from_pem(cert.key_pem.as_bytes()).unwrap())
        .unwrap();
    let mut store = openssl::x509::store::X509StoreBuilder::new().unwrap();
    store.add_cert(clients.cert.clone()).unwrap();
    b.set_verify_cert_store(store.build()).unwrap();
    b.set_verify(SslVerifyMode::PEER);
    let acceptor = Arc::new(b.build());
    let answer = Arc::new(answer);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (acceptor, answer) = (acceptor.clone(), answer.clone());
            thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let Ok(mut tls) = acceptor.accept(conn) else { return };
                let sni = tls
                    .ssl()
                    .servername(openssl::ssl::NameType::HOST_NAME)
                    .unwrap_or("-")
                    .to_string();
                let client = tls
                    .ssl()
                    .peer_certificate()
                    .and_then(|c| {
                        c.subject_name()
                            .entries_by_nid(Nid::COMMONNAME)
                            .next()
                            .and_then(|e| e.data().to_string().ok())
                    })
                    .unwrap_or_else(|| "none".into());
                answer(&mut tls, &format!("sni={sni} client={client}"));
                let _ = tls.shutdown();
            });
        }
    });
    port
}

/// Reads a request's whole head (up to 16 KiB): closing with unread data
/// would reset the connection under the answer. False when the client
/// went away first.
fn read_head(tls: &mut impl Read) -> bool {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
        match tls.read(&mut buf) {
            Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => return false,
        }
    }
    true
}

fn x509_name(cn: &str) -> openssl::x509::X509Name {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", cn).unwrap();
    name.build()
}

/// A version 3 certificate for `key` named `name`, valid a day back and a
/// month ahead, not yet signed.
fn certificate_builder(name: &openssl::x509::X509NameRef, key: &PKey<Private>) -> openssl::x509::X509Builder {
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    let mut serial = BigNum::new().unwrap();
    serial.rand(64, MsbOption::MAYBE_ZERO, false).unwrap();
    b.set_serial_number(&serial.to_asn1_integer().unwrap()).unwrap();
    b.set_subject_name(name).unwrap();
    b.set_pubkey(key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap()).unwrap();
    b.set_not_after(&Asn1Time::days_from_now(30).unwrap()).unwrap();
    b
}

/// A GET over HTTPS to `127.0.0.1:port` with SNI and `Host` `host`,
/// presenting `client` when given (the server is not verified): the status
/// and the whole response text.
pub fn https_get(port: u16, host: &str, path: &str, client: Option<&TestCert>) -> Result<(u16, String), String> {
    use std::io::{Read, Write};
    let mut b = SslContext::builder(SslMethod::tls_client()).map_err(|e| e.to_string())?;
    b.set_verify(SslVerifyMode::NONE);
    if let Some(c) = client {
        let cert = X509::from_pem(c.cert_pem.as_bytes()).unwrap();
        let key = PKey::private_key_from_pem(c.key_pem.as_bytes()).unwrap();
        b.set_certificate(&cert).unwrap();
        b.set_private_key(&key).unwrap();
    }
    let ctx = b.build();
    let mut ssl = Ssl::new(&ctx).map_err(|e| e.to_string())?;
    ssl.set_hostname(host).map_err(|e| e.to_string())?;
    let stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = ssl.connect(stream).map_err(|e| e.to_string())?;
    write!(tls, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line: {text:?}"))?;
    Ok((status, text))
}

/// A TLS server with `cert` that answers every request with `200` and
/// `tls-upstream`.
pub fn tls_upstream(cert: &TestCert) -> u16 {
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).unwrap();
    b.set_certificate(&X509::from_pem(cert.cert_pem.as_bytes()).unwrap())
        .unwrap();
    b.set_private_key(&PKey::private_key_from_pem(cert.key_pem.as_bytes()).unwrap())
        .unwrap();
    let acceptor = Arc::new(b.build());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let acceptor = acceptor.clone();
            thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let Ok(mut tls) = acceptor.accept(conn) else { return };
                if !read_head(&mut tls) {
                    return;
                }
                let _ =
                    tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\ntls-upstream");
                let _ = tls.shutdown();
            });
        }
    });
    port
}
