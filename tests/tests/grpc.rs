//! gRPC end to end: `backend-protocol: GRPC` Ingresses, real gRPC servers
//! and a real gRPC client (tonic; the standard `grpc.health.v1` service,
//! whose `Check` is unary and `Watch` server-streaming), through nginx and
//! the module: balancing over upstream keepalive, streaming, a canary by
//! header, and `grpc_next_upstream` past a dead endpoint.
//!
//! Each upstream reports its own status for the service name `whoami`, so
//! an answer says which endpoint served it.

use std::collections::BTreeSet;
use std::time::Duration;

use tests::controller::{ingress, service, Controller, INGRESS_CLASS};
use tests::free_port;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus as Answer;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// A gRPC health server on 127.0.0.1:`port` (h2c), in its own runtime.
struct GrpcUpstream {
    port: u16,
    reporter: HealthReporter,
    rt: tokio::runtime::Runtime,
}

impl GrpcUpstream {
    fn start(whoami: ServingStatus) -> GrpcUpstream {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let port = free_port();
        let (reporter, service) = tonic_health::server::health_reporter();
        rt.block_on(reporter.set_service_status("whoami", whoami));
        rt.spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve(([127, 0, 0, 1], port).into())
                .await
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "gRPC server on {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        GrpcUpstream { port, reporter, rt }
    }

    fn set(&self, whoami: ServingStatus) {
        self.rt.block_on(self.reporter.set_service_status("whoami", whoami));
    }
}

/// A client runtime and a channel to nginx's HTTP port (HTTP/2 with prior
/// knowledge) with `:authority` `host`.
fn channel(rt: &tokio::runtime::Runtime, port: u16, host: &str) -> Channel {
    rt.block_on(async {
        Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .origin(format!("http://{host}").parse().unwrap())
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("HTTP/2 connection to nginx")
    })
}

fn check(rt: &tokio::runtime::Runtime, ch: &Channel, canary: bool) -> Result<Answer, tonic::Status> {
    rt.block_on(async {
        let mut req = tonic::Request::new(HealthCheckRequest {
            service: "whoami".into(),
        });
        if canary {
            req.metadata_mut().insert("x-canary", "always".parse().unwrap());
        }
        let answer = HealthClient::new(ch.clone()).check(req).await?;
        Ok(answer.into_inner().status())
    })
}

#[test]
fn grpc_calls_are_balanced_streamed_canaried_and_retried() {
    let (a, b, c) = (
        GrpcUpstream::start(ServingStatus::Serving),
        GrpcUpstream::start(ServingStatus::NotServing),
        GrpcUpstream::start(ServingStatus::Unknown),
    );
    let dead = free_port();
    let grpc = [("backend-protocol", "GRPC")];
    let canary = [
        ("backend-protocol", "GRPC"),
        ("canary", "true"),
        ("canary-by-header", "x-canary"),
    ];
    let mut ctl = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            (
                "svc.yaml",
                format!(
                    "{}---\n{}---\n{}",
                    service("grpc-main", &[a.port, b.port]),
                    service("grpc-canary", &[c.port]),
                    service("grpc-retry", &[dead, a.port])
                ),
            ),
            ("main.yaml", ingress("main", "grpc.test", "/", "grpc-main", &grpc)),
            (
                "canary.yaml",
                ingress("main-canary", "grpc.test", "/", "grpc-canary", &canary),
            ),
            ("retry.yaml", ingress("retry", "retry.test", "/", "grpc-retry", &grpc)),
        ],
        &[],
    );
    let conf = ctl.conf();
    assert!(conf.contains("grpc_pass grpc://upstream_balancer_grpc;"), "{conf}");
    assert!(conf.contains("grpc_next_upstream error timeout;"), "{conf}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // Unary calls on one client connection: each is its own nginx request,
    // balanced by the module over both endpoints (keepalive to upstreams).
    let main = channel(&rt, ctl.http_port, "grpc.test");
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        let answer = check(&rt, &main, false).unwrap_or_else(|e| panic!("Check: {e}\n{}", ctl.log()));
        seen.insert(answer as i32);
    }
    assert_eq!(
        seen,
        BTreeSet::from([Answer::Serving as i32, Answer::NotServing as i32]),
        "both endpoints serve"
    );

    // The canary by header takes the call when the header says so.
    for _ in 0..5 {
        assert_eq!(check(&rt, &main, true).unwrap(), Answer::Unknown);
    }

    // Server streaming: Watch sends the current status, then each change.
    let canary_ch = channel(&rt, ctl.http_port, "grpc.test");
    let mut stream = rt.block_on(async {
        let mut req = tonic::Request::new(HealthCheckRequest {
            service: "whoami".into(),
        });
        req.metadata_mut().insert("x-canary", "always".parse().unwrap());
        HealthClient::new(canary_ch).watch(req).await.unwrap().into_inner()
    });
    let next = |s: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>| {
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), s.message()).await })
            .expect("a streamed message in time")
            .expect("the stream stays open")
            .expect("a message, not the end")
            .status()
    };
    assert_eq!(next(&mut stream), Answer::Unknown);
    c.set(ServingStatus::Serving);
    assert_eq!(next(&mut stream), Answer::Serving);
    c.set(ServingStatus::NotServing);
    assert_eq!(next(&mut stream), Answer::NotServing);
    drop(stream);

    // A dead endpoint: grpc_next_upstream moves every call on to the live
    // one, so no call fails.
    let retry = channel(&rt, ctl.http_port, "retry.test");
    for i in 0..10 {
        let answer = check(&rt, &retry, false).unwrap_or_else(|e| panic!("call {i} failed: {e}\n{}", ctl.log()));
        assert_eq!(answer, Answer::Serving);
    }
    // Close every client connection: an open stream would hold nginx's
    // graceful stop until worker-shutdown-timeout.
    drop((main, retry));
    drop(rt);
    ctl.stop();
}
