//! A gRPC upstream and client for tests: the standard `grpc.health.v1`
//! service (tonic-health), whose status for the service name `whoami`
//! says which upstream answered.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
pub use tonic_health::pb::health_check_response::ServingStatus as Answer;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::free_port;

/// A gRPC health server on 127.0.0.1:`port` (h2c), in its own runtime.
pub struct GrpcUpstream {
    pub port: u16,
    reporter: HealthReporter,
    rt: tokio::runtime::Runtime,
}

impl GrpcUpstream {
    pub fn start(whoami: ServingStatus) -> GrpcUpstream {
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

    pub fn set(&self, whoami: ServingStatus) {
        self.rt.block_on(self.reporter.set_service_status("whoami", whoami));
    }
}

/// A client runtime and a channel to nginx's HTTP port (HTTP/2 with prior
/// knowledge) with `:authority` `host`.
pub fn channel(rt: &tokio::runtime::Runtime, port: u16, host: &str) -> Channel {
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

/// A `Check` for `whoami`, with `x-canary: always` when `canary`.
pub fn check(rt: &tokio::runtime::Runtime, ch: &Channel, canary: bool) -> Result<Answer, tonic::Status> {
    check_with(rt, ch, if canary { &[("x-canary", "always")] } else { &[] })
}

/// A `Check` for `whoami` with extra request metadata.
pub fn check_with(
    rt: &tokio::runtime::Runtime,
    ch: &Channel,
    metadata: &[(&'static str, &str)],
) -> Result<Answer, tonic::Status> {
    rt.block_on(async {
        let mut req = tonic::Request::new(HealthCheckRequest {
            service: "whoami".into(),
        });
        for (k, v) in metadata {
            req.metadata_mut().insert(*k, v.parse().unwrap());
        }
        let answer = HealthClient::new(ch.clone()).check(req).await?;
        Ok(answer.into_inner().status())
    })
}
