//! The Prometheus text format (0.0.4) of the module's metrics, with
//! ingress-nginx's names, so its dashboards and alerts read them unchanged.

use std::fmt::Write;

use super::counters::{CountersSnapshot, HistogramSnapshot, LENGTH_BUCKETS, SIZE_BUCKETS, TIME_BUCKETS_MS};
use super::dimension::{METHODS, STATUS_CLASSES};

const P: &str = "nginx_ingress_controller_";

/// One series: its label text (`canary=…,host=…,…`; see
/// [`super::labels::series_text`]), method and status class indexes, and
/// its counters summed over workers.
pub struct Entry<'a> {
    pub labels: &'a str,
    pub method: usize,
    pub class: usize,
    pub counters: CountersSnapshot,
}

/// nginx's connection counters (what `stub_status` shows).
#[derive(Clone, Copy, Debug, Default)]
pub struct Connections {
    pub active: u64,
    pub reading: u64,
    pub writing: u64,
    pub waiting: u64,
    pub accepted: u64,
    pub handled: u64,
    pub requests: u64,
}

/// The state of the metrics zone itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct ZoneStats {
    /// Series in the zone (live and retired, not yet freed).
    pub series: u64,
    /// Requests not counted because the zone had no room for a new cell.
    pub uncounted: u64,
    pub size: u64,
    pub used: u64,
}

/// The endpoint table of `dynamic_balancer_zone` (see
/// `crate::endpoint_state`).
#[derive(Clone, Copy, Debug, Default)]
pub struct EndpointTableStats {
    pub tracked: u64,
    /// Endpoints the zone had no room to give state to.
    pub untracked: u64,
    pub slots: u64,
    pub bytes: u64,
    pub evicted: u64,
}

/// Renders every family: request series, then nginx's connections, then the
/// metrics zone's own state and the endpoint table's.
pub fn render(
    entries: &[Entry<'_>],
    connections: Option<&Connections>,
    zone: Option<&ZoneStats>,
    table: Option<&EndpointTableStats>,
) -> String {
    let mut out = String::with_capacity(256 + entries.len() * 3000);
    let requests: Vec<(&Entry<'_>, u64)> = entries.iter().map(|e| (e, e.counters.requests())).collect();
    family(&mut out, "requests", "counter", "The total number of client requests");
    for (e, n) in &requests {
        sample(&mut out, "requests", e, None, *n);
    }
    histogram(&mut out, entries, "request_duration_seconds",
        "The request processing time in seconds (from the first byte read from the client to the log write after the last byte sent)",
        &TIME_BUCKETS_MS, Unit::Millis, |c| &c.request_time);
    histogram(
        &mut out,
        entries,
        "response_duration_seconds",
        "The time spent receiving the response from the upstream, in seconds (all attempts of the request)",
        &TIME_BUCKETS_MS,
        Unit::Millis,
        |c| &c.upstream_time,
    );
    histogram(
        &mut out,
        entries,
        "request_size",
        "The request length (including request line, headers and body)",
        &LENGTH_BUCKETS,
        Unit::Bytes,
        |c| &c.request_size,
    );
    histogram(
        &mut out,
        entries,
        "response_size",
        "The response length (including request line, headers and body)",
        &LENGTH_BUCKETS,
        Unit::Bytes,
        |c| &c.response_size,
    );
    histogram(
        &mut out,
        entries,
        "bytes_sent",
        "The number of bytes sent to a client",
        &SIZE_BUCKETS,
        Unit::Bytes,
        |c| &c.bytes_sent,
    );
    family(
        &mut out,
        "upstream_connect_errors",
        "counter",
        "Attempts whose connection to an endpoint failed",
    );
    for e in entries {
        sample(&mut out, "upstream_connect_errors", e, None, e.counters.connect_errors);
    }
    if let Some(c) = connections {
        family(
            &mut out,
            "nginx_process_connections",
            "gauge",
            "Current number of client connections with state {active, reading, writing, waiting}",
        );
        for (state, v) in [
            ("active", c.active),
            ("reading", c.reading),
            ("writing", c.writing),
            ("waiting", c.waiting),
        ] {
            let _ = writeln!(out, "{P}nginx_process_connections{{state=\"{state}\"}} {v}");
        }
        family(
            &mut out,
            "nginx_process_connections_total",
            "counter",
            "Total number of connections with state {accepted, handled}",
        );
        for (state, v) in [("accepted", c.accepted), ("handled", c.handled)] {
            let _ = writeln!(out, "{P}nginx_process_connections_total{{state=\"{state}\"}} {v}");
        }
        family(
            &mut out,
            "nginx_process_requests_total",
            "counter",
            "Total number of client requests",
        );
        let _ = writeln!(out, "{P}nginx_process_requests_total {}", c.requests);
    }
    if let Some(t) = table {
        endpoint_table(&mut out, t);
    }
    let Some(zone) = zone else {
        return out;
    };
    family(
        &mut out,
        "metrics_zone_series",
        "gauge",
        "Series held in dynamic_balancer_metrics_zone",
    );
    let _ = writeln!(out, "{P}metrics_zone_series {}", zone.series);
    family(
        &mut out,
        "metrics_zone_bytes",
        "gauge",
        "Size and use of dynamic_balancer_metrics_zone",
    );
    let _ = writeln!(out, "{P}metrics_zone_bytes{{state=\"size\"}} {}", zone.size);
    let _ = writeln!(out, "{P}metrics_zone_bytes{{state=\"used\"}} {}", zone.used);
    family(
        &mut out,
        "metrics_uncounted_requests",
        "counter",
        "Requests not counted because dynamic_balancer_metrics_zone was full",
    );
    let _ = writeln!(out, "{P}metrics_uncounted_requests {}", zone.uncounted);
    out
}

fn endpoint_table(out: &mut String, t: &EndpointTableStats) {
    family(
        out,
        "endpoint_state_endpoints",
        "gauge",
        "Endpoints with (tracked) and without (untracked: dynamic_balancer_zone had no room) shared passive-health, connection and EWMA state",
    );
    let _ = writeln!(out, "{P}endpoint_state_endpoints{{state=\"tracked\"}} {}", t.tracked);
    let _ = writeln!(
        out,
        "{P}endpoint_state_endpoints{{state=\"untracked\"}} {}",
        t.untracked
    );
    family(
        out,
        "endpoint_state_slots",
        "gauge",
        "Slots of the shared endpoint table; it grows with dynamic_balancer_zone and reuses freed slots",
    );
    let _ = writeln!(out, "{P}endpoint_state_slots {}", t.slots);
    family(
        out,
        "endpoint_state_bytes",
        "gauge",
        "Bytes of dynamic_balancer_zone the endpoint table holds",
    );
    let _ = writeln!(out, "{P}endpoint_state_bytes {}", t.bytes);
    family(
        out,
        "endpoint_state_evictions_total",
        "counter",
        "Endpoints whose state went to another backend's endpoint below its fair share of a full zone",
    );
    let _ = writeln!(out, "{P}endpoint_state_evictions_total {}", t.evicted);
}

#[derive(Clone, Copy)]
enum Unit {
    Millis,
    Bytes,
}

impl Unit {
    fn write(self, out: &mut String, v: u64) {
        match self {
            Unit::Millis => {
                let _ = write!(out, "{}.{:03}", v / 1000, v % 1000);
            }
            Unit::Bytes => {
                let _ = write!(out, "{v}");
            }
        }
    }
}

/// `# HELP` and `# TYPE`.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {P}{name} {help}\n# TYPE {P}{name} {kind}");
}

/// `name{labels,method=…,status=…[,le=…]} value`.
fn sample(out: &mut String, name: &str, e: &Entry<'_>, le: Option<&str>, value: u64) {
    let _ = write!(
        out,
        "{P}{name}{{{},method=\"{}\",status=\"{}\"",
        e.labels, METHODS[e.method], STATUS_CLASSES[e.class]
    );
    if let Some(le) = le {
        let _ = write!(out, ",le=\"{le}\"");
    }
    let _ = writeln!(out, "}} {value}");
}

#[allow(clippy::too_many_arguments)]
fn histogram<const N: usize>(
    out: &mut String,
    entries: &[Entry<'_>],
    name: &str,
    help: &str,
    bounds: &[u64; N],
    unit: Unit,
    pick: impl Fn(&CountersSnapshot) -> &HistogramSnapshot<N>,
) {
    family(out, name, "histogram", help);
    let les: Vec<String> = bounds
        .iter()
        .map(|b| {
            let mut s = String::new();
            unit.write(&mut s, *b);
            // Prometheus' own spelling of the bounds: 0.005, 1, 10.
            if s.contains('.') {
                s = s.trim_end_matches('0').trim_end_matches('.').to_string();
            }
            s
        })
        .collect();
    let bucket = format!("{name}_bucket");
    for e in entries {
        let h = pick(&e.counters);
        for (le, c) in les.iter().zip(h.cumulative()) {
            sample(out, &bucket, e, Some(le), c);
        }
        sample(out, &bucket, e, Some("+Inf"), h.count());
        let _ = write!(
            out,
            "{P}{name}_sum{{{},method=\"{}\",status=\"{}\"}} ",
            e.labels, METHODS[e.method], STATUS_CLASSES[e.class]
        );
        unit.write(out, h.sum);
        out.push('\n');
        sample(out, &format!("{name}_count"), e, None, h.count());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::counters::{Counters, Sample};
    use crate::metrics::labels::{series_text, LocationLabels};

    fn snapshot(samples: &[Sample]) -> CountersSnapshot {
        // SAFETY: `Counters` is atomics only; all-zero is a valid empty cell.
        let c: Counters = unsafe { std::mem::zeroed() };
        samples.iter().for_each(|s| c.record(s));
        c.snapshot()
    }

    #[test]
    fn a_series_renders_every_family_with_ingress_nginx_names() {
        let loc = LocationLabels::parse(["namespace=shop", "ingress=web", "service=api", "host=a.test", "path=/"])
            .unwrap()
            .render();
        let labels = series_text("", &loc);
        let counters = snapshot(&[
            Sample {
                request_ms: 3,
                upstream_ms: Some(2),
                request_length: 80,
                bytes_sent: 300,
                connect_errors: 0,
            },
            Sample {
                request_ms: 1_500,
                upstream_ms: Some(1_499),
                request_length: 120,
                bytes_sent: 5,
                connect_errors: 1,
            },
        ]);
        let text = render(
            &[Entry {
                labels: &labels,
                method: 1,
                class: 2,
                counters,
            }],
            Some(&Connections {
                active: 3,
                accepted: 9,
                ..Connections::default()
            }),
            Some(&ZoneStats::default()),
            None,
        );
        let l = r#"canary="",host="a.test",ingress="web",namespace="shop",path="/",service="api",method="GET",status="2xx""#;
        for line in [
            format!("nginx_ingress_controller_requests{{{l}}} 2"),
            format!("nginx_ingress_controller_request_duration_seconds_bucket{{{l},le=\"0.005\"}} 1"),
            format!("nginx_ingress_controller_request_duration_seconds_bucket{{{l},le=\"1\"}} 1"),
            format!("nginx_ingress_controller_request_duration_seconds_bucket{{{l},le=\"2.5\"}} 2"),
            format!("nginx_ingress_controller_request_duration_seconds_bucket{{{l},le=\"+Inf\"}} 2"),
            format!("nginx_ingress_controller_request_duration_seconds_sum{{{l}}} 1.503"),
            format!("nginx_ingress_controller_request_duration_seconds_count{{{l}}} 2"),
            format!("nginx_ingress_controller_response_duration_seconds_sum{{{l}}} 1.501"),
            format!("nginx_ingress_controller_request_size_bucket{{{l},le=\"100\"}} 1"),
            format!("nginx_ingress_controller_request_size_sum{{{l}}} 200"),
            format!("nginx_ingress_controller_response_size_bucket{{{l},le=\"10\"}} 1"),
            format!("nginx_ingress_controller_bytes_sent_bucket{{{l},le=\"1000\"}} 2"),
            format!("nginx_ingress_controller_bytes_sent_bucket{{{l},le=\"10000000\"}} 2"),
            format!("nginx_ingress_controller_upstream_connect_errors{{{l}}} 1"),
            "nginx_ingress_controller_nginx_process_connections{state=\"active\"} 3".to_string(),
            "nginx_ingress_controller_nginx_process_connections_total{state=\"accepted\"} 9".to_string(),
            "# TYPE nginx_ingress_controller_requests counter".to_string(),
            "# TYPE nginx_ingress_controller_bytes_sent histogram".to_string(),
        ] {
            assert!(text.lines().any(|x| x == line), "missing {line} in\n{text}");
        }
        // One HELP/TYPE pair per family.
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        let mut names: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("# TYPE"))
            .map(|l| l.split(' ').nth(2).unwrap())
            .collect();
        names.dedup();
        assert_eq!(names.len(), types);
    }

    #[test]
    fn no_series_still_renders_the_zone_state() {
        let text = render(
            &[],
            None,
            Some(&ZoneStats {
                series: 0,
                uncounted: 4,
                size: 1 << 20,
                used: 8192,
            }),
            Some(&EndpointTableStats {
                tracked: 3,
                untracked: 2,
                slots: 512,
                bytes: 40_000,
                evicted: 1,
            }),
        );
        assert!(text.contains("nginx_ingress_controller_endpoint_state_endpoints{state=\"untracked\"} 2\n"));
        assert!(text.contains("nginx_ingress_controller_endpoint_state_evictions_total 1\n"));
        assert!(text.contains("nginx_ingress_controller_metrics_uncounted_requests 4\n"));
        assert!(text.contains("nginx_ingress_controller_metrics_zone_bytes{state=\"used\"} 8192\n"));
        assert!(!text.contains("nginx_process_connections"));
    }
}
