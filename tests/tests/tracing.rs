//! OpenTelemetry tracing end to end: the controller renders ingress-nginx's
//! tracing keys and annotations, nginx's workers export a server span per
//! traced request to a real OpenTelemetry Collector over OTLP/gRPC, and
//! the W3C context reaches the upstream.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tests::agent;
use tests::controller::{ingress, service, wait_until, Controller, INGRESS_CLASS};
use tests::otel_collector::{Collector, ReceivedSpan};
use tests::Upstream;

fn config(collector_port: u16, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{namespace: ingress-nginx, name: ingress-nginx-controller}}\n\
         data:\n  enable-opentelemetry: \"true\"\n  otlp-collector-host: 127.0.0.1\n  otlp-collector-port: \"{collector_port}\"\n  \
         otel-service-name: edge\n  otel-schedule-delay-millis: \"100\"\n{extra}"
    )
}

/// GET `path` on `host` with `headers`: the status and the headers the
/// upstream echoed (`x-echo-<name>`).
fn get(port: u16, host: &str, path: &str, headers: &[(&str, &str)]) -> (u16, BTreeMap<String, String>) {
    let mut req = agent()
        .get(&format!("http://127.0.0.1:{port}{path}"))
        .header("Host", host);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.call().expect("nginx answers");
    let echoed = resp
        .headers()
        .iter()
        .filter_map(|(k, v)| {
            Some((
                k.as_str().strip_prefix("x-echo-")?.to_string(),
                v.to_str().ok()?.to_string(),
            ))
        })
        .collect();
    (resp.status().as_u16(), echoed)
}

const CLIENT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN: &str = "b7ad6b7169203331";

#[test]
fn traced_requests_reach_a_real_collector_with_their_context() {
    let collector = Collector::start();
    let up = Upstream::start();
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            (
                "config.yaml",
                config(
                    collector.port,
                    "  otel-sampler: AlwaysOn\n  opentelemetry-operation-name: \"HTTP $request_method $service_name\"\n",
                ),
            ),
            ("svc.yaml", service("web", &[up.port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
            (
                "quiet.yaml",
                ingress("quiet", "quiet.test", "/", "web", &[("enable-opentelemetry", "false")]),
            ),
            (
                "untrusted.yaml",
                ingress(
                    "untrusted",
                    "untrusted.test",
                    "/",
                    "web",
                    &[("opentelemetry-trust-incoming-span", "false")],
                ),
            ),
        ],
        &[],
    );
    let conf = c.conf();
    assert!(conf.contains("dynamic_balancer_otel_exporter 127.0.0.1:"), "{conf}");
    assert!(conf.contains("dynamic_balancer_otel_sampler always_on;"), "{conf}");
    assert!(
        conf.contains("dynamic_balancer_otel_operation_name \"HTTP $request_method web\";"),
        "{conf}"
    );

    // New traces: the upstream gets this span's context.
    let mut sent = BTreeSet::new();
    for _ in 0..20 {
        let (status, h) = get(c.http_port, "web.test", "/a", &[]);
        assert_eq!(status, 200);
        let tp = h.get("traceparent").expect("traceparent went upstream");
        assert_eq!(tp.len(), 55, "{tp}");
        assert!(tp.starts_with("00-") && tp.ends_with("-01"), "{tp}");
        sent.insert(tp.clone());
    }
    assert_eq!(sent.len(), 20, "every request has its own span");
    // A trusted caller's trace is continued, its tracestate passed on.
    let parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    for _ in 0..5 {
        let (_, h) = get(
            c.http_port,
            "web.test",
            "/child",
            &[("traceparent", &parent), ("tracestate", "vendor=abc")],
        );
        let tp = &h["traceparent"];
        assert!(tp.starts_with(&format!("00-{CLIENT_TRACE}-")), "{tp}");
        assert!(!tp.contains(CLIENT_SPAN), "the upstream's parent is nginx's span: {tp}");
        assert_eq!(h.get("tracestate").map(String::as_str), Some("vendor=abc"));
    }
    // Repeated tracestate headers are one list: passed on as one header
    // when valid, dropped whole when not (a key twice).
    let other = "00-11111111111111111111111111111111-2222222222222222-01";
    let (_, h) = get(
        c.http_port,
        "web.test",
        "/state",
        &[
            ("traceparent", other),
            ("tracestate", "vendor=abc"),
            ("tracestate", "other=x"),
        ],
    );
    assert_eq!(h.get("tracestate").map(String::as_str), Some("vendor=abc, other=x"));
    let (_, h) = get(
        c.http_port,
        "web.test",
        "/state",
        &[("traceparent", other), ("tracestate", "k=1"), ("tracestate", "k=2")],
    );
    assert_eq!(h.get("tracestate"), None, "{h:?}");
    // Not trusted: a new trace, and the caller's tracestate is not sent.
    let (_, h) = get(
        c.http_port,
        "untrusted.test",
        "/",
        &[("traceparent", &parent), ("tracestate", "vendor=abc")],
    );
    assert!(!h["traceparent"].contains(CLIENT_TRACE), "{h:?}\n{conf}");
    assert_eq!(h.get("tracestate"), None);
    // Not traced: the client's headers go through untouched, no span.
    let (_, h) = get(c.http_port, "quiet.test", "/", &[("traceparent", &parent)]);
    assert_eq!(h.get("traceparent"), Some(&parent));
    // A client's text is cut to 1 KiB in the span.
    let long = format!("/{}", "x".repeat(3000));
    assert_eq!(get(c.http_port, "untrusted.test", &long, &[]).0, 200);
    // A failing request is an error span.
    c.write("svc-down.yaml", &service("down", &[tests::free_port()]));
    c.write("down.yaml", &ingress("down", "down.test", "/", "down", &[]));
    assert!(wait_until(Duration::from_secs(20), || c.get("down.test", "/").0 == 502));

    let spans = collector.wait_spans(30, Duration::from_secs(20));
    let web: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.attr("http.host").as_deref() == Some("web.test"))
        .collect();
    assert_eq!(web.len(), 27, "{spans:#?}\n{}", collector.log());
    for s in &web {
        assert_eq!(s.service_name, "edge");
        assert_eq!(s.kind, 2, "a server span");
        assert_eq!(s.name, "HTTP GET web");
        assert_eq!(s.attr("http.method").as_deref(), Some("GET"));
        assert_eq!(s.attr("http.status_code").as_deref(), Some("200"));
        assert_eq!(s.attr("http.scheme").as_deref(), Some("http"));
        assert_eq!(s.attr("net.peer.ip").as_deref(), Some("127.0.0.1"));
        assert_eq!(s.attr("upstream.address"), Some(format!("127.0.0.1:{}", up.port)));
        assert_eq!(s.attr("upstream.status_code").as_deref(), Some("200"));
        assert!(s.attr("upstream.response_time").is_some());
        assert!(s.end >= s.start && s.start > 0);
        assert_eq!(s.trace_id.len(), 32);
    }
    // The spans are the ones whose context went upstream.
    let exported: BTreeSet<String> = web
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .map(|s| format!("00-{}-{}-01", s.trace_id, s.span_id))
        .collect();
    assert_eq!(exported, sent);
    let children: Vec<_> = web.iter().filter(|s| s.trace_id == CLIENT_TRACE).collect();
    assert_eq!(children.len(), 5);
    assert!(children
        .iter()
        .all(|s| s.parent_span_id == CLIENT_SPAN && s.attr("http.target").as_deref() == Some("/child")));
    assert!(spans
        .iter()
        .all(|s| s.attr("http.host").as_deref() != Some("quiet.test")));
    let down = spans
        .iter()
        .find(|s| s.attr("http.host").as_deref() == Some("down.test"))
        .expect("the 502's span");
    assert_eq!(down.status_code, 2, "5xx is an error: {down:?}");
    let cut = spans
        .iter()
        .filter_map(|s| s.attr("http.target"))
        .find(|t| t.starts_with("/xxx"))
        .expect("the long request's span");
    assert_eq!(cut, format!("{}…", &long[..1024]));

    // Parent and child through a traced upstream: a second edge, traced
    // too, proxies front.test to this one's web.test (a controller never
    // routes to its own ports, so it takes two).
    let front = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("config.yaml", config(collector.port, "  otel-sampler: AlwaysOn\n")),
            ("svc.yaml", service("edge", &[c.http_port])),
            (
                "front.yaml",
                ingress("front", "front.test", "/", "edge", &[("upstream-vhost", "web.test")]),
            ),
        ],
        &[],
    );
    assert!(wait_until(Duration::from_secs(20), || front
        .get("front.test", "/hop")
        .0
        == 200));
    let (status, _) = get(front.http_port, "front.test", "/hop2", &[]);
    assert_eq!(status, 200);
    let hop2 = |s: &ReceivedSpan| s.attr("http.target").as_deref() == Some("/hop2");
    let spans = collector.wait_matching(|s| s.iter().filter(|s| hop2(s)).count() >= 2, Duration::from_secs(20));
    let hop: Vec<&ReceivedSpan> = spans.iter().filter(|s| hop2(s)).collect();
    assert_eq!(hop.len(), 2, "{hop:#?}");
    let front = hop
        .iter()
        .find(|s| s.attr("http.host").as_deref() == Some("front.test"))
        .unwrap();
    let inner = hop
        .iter()
        .find(|s| s.attr("http.host").as_deref() == Some("web.test"))
        .unwrap();
    assert_eq!(inner.trace_id, front.trace_id);
    assert_eq!(inner.parent_span_id, front.span_id);
    assert!(front.parent_span_id.is_empty());

    // The module's counters: everything queued was exported.
    let queued = c.metric("nginx_ingress_controller_otel_spans_total{outcome=\"queued\"}");
    assert!(queued >= 29.0, "{queued}");
    assert!(wait_until(Duration::from_secs(10), || c
        .metric("nginx_ingress_controller_otel_spans_total{outcome=\"exported\"}")
        >= queued));
    assert_eq!(
        c.metric("nginx_ingress_controller_otel_spans_total{outcome=\"dropped\"}"),
        0.0
    );
}

#[test]
fn samplers_decide_which_traces_are_exported() {
    let collector = Collector::start();
    let up = Upstream::start();
    let _c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            (
                "config.yaml",
                config(
                    collector.port,
                    "  otel-sampler: TraceIdRatioBased\n  otel-sampler-ratio: \"0.5\"\n",
                ),
            ),
            ("svc.yaml", service("web", &[up.port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
        ],
        &[],
    );
    let port = _c.http_port;
    let mut sampled = 0;
    for _ in 0..400 {
        let (_, h) = get(port, "web.test", "/", &[]);
        if h["traceparent"].ends_with("-01") {
            sampled += 1;
        }
    }
    assert!((140..=260).contains(&sampled), "about half of 400: {sampled}");
    let spans = collector.wait_spans(sampled, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        collector.spans().len(),
        sampled,
        "exactly the sampled ones: {}",
        spans.len()
    );
}

#[test]
fn parent_based_sampling_follows_the_caller() {
    let collector = Collector::start();
    let up = Upstream::start();
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            (
                "config.yaml",
                config(
                    collector.port,
                    "  otel-sampler: AlwaysOff\n  otel-sampler-parent-based: \"true\"\n",
                ),
            ),
            ("svc.yaml", service("web", &[up.port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
        ],
        &[],
    );
    for flags in ["01", "00", "01"] {
        let (_, h) = get(
            c.http_port,
            "web.test",
            &format!("/{flags}"),
            &[("traceparent", &format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-{flags}"))],
        );
        assert!(h["traceparent"].ends_with(&format!("-{flags}")), "{h:?}");
    }
    let (_, h) = get(c.http_port, "web.test", "/root", &[]);
    assert!(h["traceparent"].ends_with("-00"), "no parent: AlwaysOff decides");
    collector.wait_spans(2, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    let spans = collector
        .spans()
        .into_iter()
        .map(|s| s.attr("http.target").unwrap())
        .collect::<Vec<_>>();
    assert_eq!(spans, vec!["/01", "/01"], "{spans:?}");
}

#[test]
fn an_absent_collector_costs_spans_not_requests() {
    let up = Upstream::start();
    let dead = tests::free_port();
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            (
                "config.yaml",
                config(
                    dead,
                    "  otel-sampler: AlwaysOn\n  otel-max-queuesize: \"4\"\n  otel-max-export-batch-size: \"2\"\n",
                ),
            ),
            ("svc.yaml", service("web", &[up.port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
        ],
        &[],
    );
    for _ in 0..200 {
        assert_eq!(get(c.http_port, "web.test", "/", &[]).0, 200);
    }
    let total = |outcome: &str| {
        c.metric(&format!(
            "nginx_ingress_controller_otel_spans_total{{outcome=\"{outcome}\"}}"
        ))
    };
    assert!(
        wait_until(Duration::from_secs(10), || total("failed") > 0.0),
        "{}",
        c.nginx_log()
    );
    assert!(total("queued") + total("dropped") >= 200.0);
    assert_eq!(total("exported"), 0.0);
    assert!(
        wait_until(Duration::from_secs(5), || c
            .nginx_log()
            .contains(&format!("exporting to 127.0.0.1:{dead} failed"))),
        "{}",
        c.nginx_log()
    );
}
