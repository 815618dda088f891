//! The nginx that `nginx-build` makes has what layer 4 needs: `stream {}`
//! with `ssl_preread`, which reads a TLS connection's SNI without
//! terminating it. Here stock `stream` directives route by SNI to two TLS
//! servers, and the client sees each server's own certificate; the
//! module's part of layer 4 builds on this.

use tests::free_port;
use tests::process::NginxProcess;
use tests::tls::{handshake, TestCert};

#[test]
fn stream_reads_the_sni_without_terminating_tls() {
    let (a, b) = (TestCert::new("a.test"), TestCert::new("b.test"));
    let certs = tempfile::tempdir().unwrap();
    for (name, c) in [("a", &a), ("b", &b)] {
        std::fs::write(
            certs.path().join(format!("{name}.pem")),
            format!("{}{}", c.cert_pem, c.key_pem),
        )
        .unwrap();
    }
    let (front, port_a, port_b) = (free_port(), free_port(), free_port());
    let d = certs.path().display();
    let conf = format!(
        r#"events {{ worker_connections 64; }}
http {{
    access_log off;
    server {{ listen 127.0.0.1:{port_a} ssl; ssl_certificate {d}/a.pem; ssl_certificate_key {d}/a.pem; return 200 "a\n"; }}
    server {{ listen 127.0.0.1:{port_b} ssl; ssl_certificate {d}/b.pem; ssl_certificate_key {d}/b.pem; return 200 "b\n"; }}
}}
stream {{
    map $ssl_preread_server_name $tls_backend {{
        a.test  127.0.0.1:{port_a};
        default 127.0.0.1:{port_b};
    }}
    server {{
        listen 127.0.0.1:{front};
        ssl_preread on;
        proxy_pass $tls_backend;
    }}
}}
"#
    );
    let nginx = NginxProcess::start(&conf);
    let seen = handshake(front, Some("a.test"), &[]).unwrap_or_else(|e| panic!("{e}\n{}", nginx.error_log()));
    assert_eq!(seen.sha256, a.sha256, "SNI a.test reaches a.test's own TLS server");
    let seen = handshake(front, Some("other.test"), &[]).unwrap();
    assert_eq!(seen.sha256, b.sha256, "any other SNI goes to the default");
    let seen = handshake(front, None, &[]).unwrap();
    assert_eq!(seen.sha256, b.sha256, "no SNI goes to the default");
}
