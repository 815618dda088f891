//! The Prometheus text format (0.0.4) of the module's metrics, with
//! ingress-nginx's names, so its dashboards and alerts read them unchanged.

use std::fmt::Write;

use super::counters::{CountersSnapshot, HistogramSnapshot, LENGTH_BUCKETS, SIZE_BUCKETS, TIME_BUCKETS_MS};
use super::dimension::{StatusLabel, METHODS};

const P: &str = "nginx_ingress_controller_";

/// One series: its label text (`canary=…,host=…,…`; see
/// [`super::labels::series_text`]), method index and status (see
/// [`super::dimension::status_index`]), and its counters summed over
/// workers.
#[derive(Clone, Copy)]
pub struct Entry<'a> {
    pub labels: &'a str,
    pub method: usize,
    pub status: u16,
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
    /// Spans of sampled requests: queued, dropped (queue full), exported,
    /// failed (export failed or refused).
    pub spans: [u64; 4],
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

/// Entries of the same series, method and status class summed into one,
/// whose status stands for its class (`200` for `2xx`, `0` for `xxx`).
fn by_class<'a>(entries: &[Entry<'a>]) -> Vec<Entry<'a>> {
    let mut merged: std::collections::BTreeMap<(&'a str, usize, u16), Entry<'a>> = std::collections::BTreeMap::new();
    for e in entries {
        let class = StatusLabel::Class.key(e.status);
        merged
            .entry((e.labels, e.method, class))
            .and_modify(|m| m.counters.add(&e.counters))
            .or_insert(Entry {
                status: class * 100,
                ..*e
            });
    }
    merged.into_values().collect()
}

/// Renders every family: request series (with `status` written as
/// `status` asks), then nginx's connections, then the metrics zone's own
/// state and the endpoint table's.
pub fn render(
    entries: &[Entry<'_>],
    status: StatusLabel,
    connections: Option<&Connections>,
    zone: Option<&ZoneStats>,
    table: Option<&EndpointTableStats>,
) -> String {
    let merged;
    let entries = match status {
        StatusLabel::Code => entries,
        StatusLabel::Class => {
            merged = by_class(entries);
            &merged[..]
        }
    };
    let mut out = String::with_capacity(256 + entries.len() * 4000);
    let w = &mut Writer { out: &mut out, status };
    w.family("requests", "counter", "The total number of client requests");
    for e in entries {
        w.sample("requests", e, None, e.counters.requests());
    }
    w.histogram(entries, "request_duration_seconds",
        "The request processing time in seconds (from the first byte read from the client to the log write after the last byte sent)",
        &TIME_BUCKETS_MS, Unit::Millis, |c| &c.request_time);
    w.histogram(
        entries,
        "response_duration_seconds",
        "The time spent receiving the response from the upstream, in seconds (all attempts of the request)",
        &TIME_BUCKETS_MS,
        Unit::Millis,
        |c| &c.upstream_time,
    );
    w.histogram(
        entries,
        "connect_duration_seconds",
        "The time spent establishing a connection with the upstream, in seconds (all attempts of the request)",
        &TIME_BUCKETS_MS,
        Unit::Millis,
        |c| &c.connect_time,
    );
    w.histogram(
        entries,
        "header_duration_seconds",
        "The time spent receiving the first header from the upstream, in seconds (all attempts of the request)",
        &TIME_BUCKETS_MS,
        Unit::Millis,
        |c| &c.header_time,
    );
    w.histogram(
        entries,
        "request_size",
        "The request length (including request line, headers and body)",
        &LENGTH_BUCKETS,
        Unit::Bytes,
        |c| &c.request_size,
    );
    w.histogram(
        entries,
        "response_size",
        "The response length (including request line, headers and body)",
        &LENGTH_BUCKETS,
        Unit::Bytes,
        |c| &c.response_size,
    );
    w.histogram(
        entries,
        "bytes_sent",
        "The number of bytes sent to a client",
        &SIZE_BUCKETS,
        Unit::Bytes,
        |c| &c.bytes_sent,
    );
    w.family(
        "upstream_connect_errors",
        "counter",
        "Attempts whose connection to an endpoint failed",
    );
    for e in entries {
        w.sample("upstream_connect_errors", e, None, e.counters.connect_errors);
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
        "Requests not counted: dynamic_balancer_metrics_zone was full, or the worker already had 64 method and status pairs in the request's series",
    );
    let _ = writeln!(out, "{P}metrics_uncounted_requests {}", zone.uncounted);
    family(
        &mut out,
        "otel_spans_total",
        "counter",
        "Spans of sampled requests (OpenTelemetry tracing) by outcome: queued for export; dropped, the worker's queue was full; exported; failed, the export failed or the collector refused them",
    );
    for (outcome, n) in ["queued", "dropped", "exported", "failed"].iter().zip(zone.spans) {
        let _ = writeln!(out, "{P}otel_spans_total{{outcome=\"{outcome}\"}} {n}");
    }
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
    /// A bucket bound as an `le` value.
    fn bound(self, v: u64) -> String {
        match self {
            Unit::Millis => go_float(v as f64 / 1000.0),
            Unit::Bytes => go_float(v as f64),
        }
    }

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

/// Writes request families with the `status` label as asked.
struct Writer<'o> {
    out: &'o mut String,
    status: StatusLabel,
}

impl Writer<'_> {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        family(self.out, name, kind, help);
    }

    /// `name{labels,method=…,status=…[,le=…]} value`.
    fn sample(&mut self, name: &str, e: &Entry<'_>, le: Option<&str>, value: u64) {
        self.labels(name, e);
        if let Some(le) = le {
            let _ = write!(self.out, ",le=\"{le}\"");
        }
        let _ = writeln!(self.out, "}} {value}");
    }

    /// `name{labels,method=…,status=…` (the caller closes the brace).
    fn labels(&mut self, name: &str, e: &Entry<'_>) {
        let _ = write!(
            self.out,
            "{P}{name}{{{},method=\"{}\",status=\"{}\"",
            e.labels,
            METHODS[e.method],
            self.status.value(e.status)
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn histogram<const N: usize>(
        &mut self,
        entries: &[Entry<'_>],
        name: &str,
        help: &str,
        bounds: &[u64; N],
        unit: Unit,
        pick: impl Fn(&CountersSnapshot) -> &HistogramSnapshot<N>,
    ) {
        self.family(name, "histogram", help);
        let les: Vec<String> = bounds.iter().map(|b| unit.bound(*b)).collect();
        let bucket = format!("{name}_bucket");
        let count = format!("{name}_count");
        let sum = format!("{name}_sum");
        for e in entries {
            let h = pick(&e.counters);
            for (le, c) in les.iter().zip(h.cumulative()) {
                self.sample(&bucket, e, Some(le), c);
            }
            self.sample(&bucket, e, Some("+Inf"), h.count());
            self.labels(&sum, e);
            self.out.push_str("} ");
            unit.write(self.out, h.sum);
            self.out.push('\n');
            self.sample(&count, e, None, h.count());
        }
    }
}

/// A float as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it, which
/// is how ingress-nginx (client_golang) spells `le`: `0.005`, `10`,
/// `100000`, `1e+06`. On Prometheus 2, `le="1000000"` would be another
/// series than ingress-nginx's `le="1e+06"`.
pub fn go_float(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let exp = v.abs().log10().floor() as i32;
    if !(-4..6).contains(&exp) {
        let e = format!("{v:e}");
        let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    format!("{v}")
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
                connect_ms: Some(0),
                header_ms: Some(2),
                request_length: 80,
                bytes_sent: 300,
                connect_errors: 0,
            },
            Sample {
                request_ms: 1_500,
                upstream_ms: Some(1_499),
                connect_ms: None,
                header_ms: Some(700),
                request_length: 120,
                bytes_sent: 5,
                connect_errors: 1,
            },
        ]);
        let text = render(
            &[Entry {
                labels: &labels,
                method: 1,
                status: 200,
                counters,
            }],
            StatusLabel::Code,
            Some(&Connections {
                active: 3,
                accepted: 9,
                ..Connections::default()
            }),
            Some(&ZoneStats::default()),
            None,
        );
        let l = r#"canary="",host="a.test",ingress="web",namespace="shop",path="/",service="api",method="GET",status="200""#;
        for line in [
            format!("nginx_ingress_controller_requests{{{l}}} 2"),
            format!("nginx_ingress_controller_request_duration_seconds_bucket{{{l},le=\"0.005\"}} 1"),
            format!("nginx_ingress_controller_request_duration_seconds_bucket{{{l},le=\"1\"}} 1"),
            format!("nginx_ingress_controller_request_duration_seconds_bucket{{{l},le=\"2.5\"}} 2"),
            format!("nginx_ingress_controller_request_duration_seconds_bucket{{{l},le=\"+Inf\"}} 2"),
            format!("nginx_ingress_controller_request_duration_seconds_sum{{{l}}} 1.503"),
            format!("nginx_ingress_controller_request_duration_seconds_count{{{l}}} 2"),
            format!("nginx_ingress_controller_response_duration_seconds_sum{{{l}}} 1.501"),
            format!("nginx_ingress_controller_connect_duration_seconds_count{{{l}}} 1"),
            format!("nginx_ingress_controller_header_duration_seconds_bucket{{{l},le=\"0.005\"}} 1"),
            format!("nginx_ingress_controller_header_duration_seconds_bucket{{{l},le=\"1\"}} 2"),
            format!("nginx_ingress_controller_header_duration_seconds_sum{{{l}}} 0.702"),
            format!("nginx_ingress_controller_request_size_bucket{{{l},le=\"100\"}} 1"),
            format!("nginx_ingress_controller_request_size_sum{{{l}}} 200"),
            format!("nginx_ingress_controller_response_size_bucket{{{l},le=\"10\"}} 1"),
            format!("nginx_ingress_controller_bytes_sent_bucket{{{l},le=\"1000\"}} 2"),
            format!("nginx_ingress_controller_bytes_sent_bucket{{{l},le=\"100000\"}} 2"),
            format!("nginx_ingress_controller_bytes_sent_bucket{{{l},le=\"1e+07\"}} 2"),
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
    fn bounds_are_spelled_as_client_golang_spells_them() {
        let spelled: Vec<String> = SIZE_BUCKETS.iter().map(|b| Unit::Bytes.bound(*b)).collect();
        assert_eq!(spelled, ["10", "100", "1000", "10000", "100000", "1e+06", "1e+07"]);
        let spelled: Vec<String> = TIME_BUCKETS_MS.iter().map(|b| Unit::Millis.bound(*b)).collect();
        assert_eq!(
            spelled,
            ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10"]
        );
        assert_eq!(go_float(2_500_000.0), "2.5e+06");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_float(0.0001), "0.0001");
    }

    #[test]
    fn classes_sum_the_codes_of_a_series() {
        let one = |ms| {
            snapshot(&[Sample {
                request_ms: ms,
                ..Sample::default()
            }])
        };
        let entry = |method, status, ms| Entry {
            labels: "canary=\"\",host=\"a\"",
            method,
            status,
            counters: one(ms),
        };
        let entries = [
            entry(1, 0, 1),
            entry(1, 200, 1),
            entry(1, 204, 1),
            entry(1, 503, 1),
            entry(1, 504, 1),
            entry(3, 201, 1),
        ];
        let codes = render(&entries, StatusLabel::Code, None, None, None);
        assert!(codes.contains("requests{canary=\"\",host=\"a\",method=\"GET\",status=\"204\"} 1\n"));
        assert!(codes.contains("requests{canary=\"\",host=\"a\",method=\"GET\",status=\"000\"} 1\n"));
        let classes = render(&entries, StatusLabel::Class, None, None, None);
        for line in [
            "requests{canary=\"\",host=\"a\",method=\"GET\",status=\"2xx\"} 2\n",
            "requests{canary=\"\",host=\"a\",method=\"GET\",status=\"5xx\"} 2\n",
            "requests{canary=\"\",host=\"a\",method=\"GET\",status=\"xxx\"} 1\n",
            "requests{canary=\"\",host=\"a\",method=\"POST\",status=\"2xx\"} 1\n",
        ] {
            assert!(classes.contains(line), "{line} in {classes}");
        }
        assert_eq!(
            classes
                .lines()
                .filter(|l| l.starts_with("nginx_ingress_controller_requests{"))
                .count(),
            4
        );
    }

    #[test]
    fn no_series_still_renders_the_zone_state() {
        let text = render(
            &[],
            StatusLabel::Code,
            None,
            Some(&ZoneStats {
                series: 0,
                uncounted: 4,
                size: 1 << 20,
                used: 8192,
                spans: [5, 1, 3, 1],
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
        assert!(text.contains("nginx_ingress_controller_otel_spans_total{outcome=\"dropped\"} 1\n"));
        assert!(!text.contains("nginx_process_connections"));
    }
}
