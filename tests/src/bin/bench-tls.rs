//! TLS handshake benchmarks (figures, not pass/fail):
//!
//! - `handshakes [ROUNDS SECONDS]`: full TLS handshakes per second (no
//!   session cache, no tickets) against one nginx worker, for a certificate
//!   served from the zone by SNI (`dynamic_balancer_ssl on`) and for the
//!   same certificate and key as a static `ssl_certificate`, side by side
//!   with the runs alternating; ECDSA P-256 and RSA-2048. It reports the
//!   handshake rate and the worker's CPU time per handshake. Goal: dynamic ÷
//!   static ≥ 0.95.
//! - `renewal [N]`: N certificate replacements: the time a `PUT` takes and
//!   the time of the next handshake, which must present the new certificate.
//!
//! `cargo run --release -p tests --bin bench-tls -- MODE [ARGS]`

use std::net::TcpStream;
use std::time::{Duration, Instant};

use openssl::hash::MessageDigest;
use openssl::ssl::{Ssl, SslContext, SslMethod, SslVerifyMode, SslVersion};
use tests::bench::{cpu_seconds, median, percentile, Proc};
use tests::free_port;
use tests::tls::{handshake, TestCert};

const HOST: &str = "bench.test";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u32| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    match args.first().map(String::as_str) {
        Some("handshakes") => {
            for (label, cert) in [("ECDSA P-256", TestCert::new(HOST)), ("RSA-2048", TestCert::rsa(HOST))] {
                handshakes(label, &cert, num(1, 5), num(2, 3));
            }
        }
        Some("renewal") => renewal(num(1, 200) as usize),
        _ => eprintln!("usage: bench-tls handshakes [ROUNDS SECONDS] | renewal [N]"),
    }
}

/// One nginx worker: `static_port` serves `cert` from a file, `dynamic_port`
/// from the zone (its static certificate is a different one, so a miss
/// would show), and the API.
struct Bench {
    nginx: Proc,
    static_port: u16,
    dynamic_port: u16,
    api_port: u16,
    _files: tempfile::TempDir,
}

impl Bench {
    fn start(cert: &TestCert) -> Bench {
        let files = tempfile::tempdir().unwrap();
        let fallback = TestCert::new("fallback.test");
        let write = |name: &str, c: &TestCert| {
            let path = files.path().join(name);
            std::fs::write(&path, format!("{}{}", c.cert_pem, c.key_pem)).unwrap();
            path.display().to_string()
        };
        let (bench_pem, fallback_pem) = (write("bench.pem", cert), write("fallback.pem", &fallback));
        let (static_port, dynamic_port, api_port) = (free_port(), free_port(), free_port());
        let nginx = Proc::start(&format!(
            r#"worker_processes 1;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    dynamic_balancer_zone 32m;
    ssl_session_cache off;
    ssl_session_tickets off;
    server {{ listen 127.0.0.1:{static_port} ssl; ssl_certificate {bench_pem}; ssl_certificate_key {bench_pem}; return 200; }}
    server {{ listen 127.0.0.1:{dynamic_port} ssl; ssl_certificate {fallback_pem}; ssl_certificate_key {fallback_pem}; dynamic_balancer_ssl on; return 200; }}
    server {{ listen 127.0.0.1:{api_port}; location /configuration {{ dynamic_balancer_api; }} }}
}}
"#
        ));
        let b = Bench {
            nginx,
            static_port,
            dynamic_port,
            api_port,
            _files: files,
        };
        b.put(cert);
        let map = serde_json::json!({"servers": {HOST: "bench"}}).to_string();
        let r = ureq::put(&format!("http://127.0.0.1:{api_port}/configuration/servers")).send(&map);
        let code = r.map(|r| r.status().as_u16());
        assert!(matches!(code, Ok(200 | 201)), "PUT servers: {code:?}");
        b
    }

    /// Replaces certificate `bench`; the time the PUT took.
    fn put(&self, cert: &TestCert) -> Duration {
        let started = Instant::now();
        let r = ureq::put(&format!(
            "http://127.0.0.1:{}/configuration/certificates/bench",
            self.api_port
        ))
        .send(&cert.body());
        let took = started.elapsed();
        let code = r.map(|r| r.status().as_u16()).ok();
        assert!(matches!(code, Some(200 | 201)), "PUT certificate: {code:?}");
        took
    }
}

/// A client context for full handshakes: no verification (self-signed),
/// no session reuse.
fn client() -> SslContext {
    let mut b = SslContext::builder(SslMethod::tls_client()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    b.set_min_proto_version(Some(SslVersion::TLS1_2)).unwrap();
    b.set_session_cache_mode(openssl::ssl::SslSessionCacheMode::OFF);
    b.build()
}

/// Full handshakes to `port` for `seconds` from two client threads.
fn run(port: u16, seconds: u32) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(u64::from(seconds));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let ctx = client();
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let mut ssl = Ssl::new(&ctx).unwrap();
                    ssl.set_hostname(HOST).unwrap();
                    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
                    stream.set_nodelay(true).unwrap();
                    let tls = ssl.connect(stream).expect("handshake");
                    drop(tls);
                    n += 1;
                }
                n
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

fn handshakes(label: &str, cert: &TestCert, rounds: u32, seconds: u32) {
    let b = Bench::start(cert);
    for port in [b.static_port, b.dynamic_port] {
        let shown = handshake(port, Some(HOST), &[]).unwrap();
        assert_eq!(
            shown.sha256, cert.sha256,
            "port {port} does not serve the bench certificate"
        );
    }
    let worker = b.nginx.worker_pids()[0];
    let measure = |port: u16| {
        let before = cpu_seconds(worker);
        let n = run(port, seconds);
        (
            n as f64 / f64::from(seconds),
            (cpu_seconds(worker) - before) * 1e6 / n.max(1) as f64,
        )
    };
    measure(b.static_port);
    measure(b.dynamic_port);
    println!("{label}: round  static hs/s  dynamic hs/s  ratio  static us/hs  dynamic us/hs");
    let (mut ratios, mut cpu_ratios) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let (s, d) = if round % 2 == 0 {
            let s = measure(b.static_port);
            (s, measure(b.dynamic_port))
        } else {
            let d = measure(b.dynamic_port);
            (measure(b.static_port), d)
        };
        ratios.push(d.0 / s.0);
        cpu_ratios.push(s.1 / d.1);
        println!(
            "{round:>12}  {:>11.0}  {:>12.0}  {:>5.3}  {:>12.1}  {:>13.1}",
            s.0,
            d.0,
            d.0 / s.0,
            s.1,
            d.1
        );
    }
    println!(
        "{label}: dynamic / static: median handshakes/s ratio {:.3} (goal >= 0.95), median CPU-per-handshake ratio (static/dynamic) {:.3}",
        median(ratios),
        median(cpu_ratios)
    );
}

fn renewal(n: usize) {
    let certs = [TestCert::new(HOST), TestCert::new(HOST)];
    let b = Bench::start(&certs[0]);
    let ctx = client();
    let (mut puts, mut next) = (Vec::new(), Vec::new());
    let mut stale = 0;
    for i in 0..n {
        let cert = &certs[(i + 1) % 2];
        puts.push(b.put(cert).as_secs_f64() * 1000.0);
        let started = Instant::now();
        let mut ssl = Ssl::new(&ctx).unwrap();
        ssl.set_hostname(HOST).unwrap();
        let tls = ssl
            .connect(TcpStream::connect(("127.0.0.1", b.dynamic_port)).unwrap())
            .expect("handshake");
        next.push(started.elapsed().as_secs_f64() * 1000.0);
        let shown = tls
            .ssl()
            .peer_certificate()
            .unwrap()
            .digest(MessageDigest::sha256())
            .unwrap();
        let shown: String = shown.iter().map(|b| format!("{b:02x}")).collect();
        if shown != cert.sha256 {
            stale += 1;
        }
    }
    println!(
        "{n} renewals: PUT p50 {:.2} ms, p99 {:.2} ms; the next handshake p50 {:.2} ms, p99 {:.2} ms; handshakes that showed the old certificate: {stale}",
        percentile(puts.clone(), 0.5),
        percentile(puts, 0.99),
        percentile(next.clone(), 0.5),
        percentile(next, 0.99),
    );
}
