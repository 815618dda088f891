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
use tests::grpc_upstream::{channel, check, Answer, GrpcUpstream};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::ServingStatus;

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
