//! The controller's Prometheus metrics, served at `/metrics` in Prometheus
//! text format 0.0.4, as ingress-nginx serves them.
//!
//! Names, types and labels shared with ingress-nginx are its own, so its
//! dashboards and alerts read them unchanged. That is why the format is
//! 0.0.4 and the library the `prometheus` crate rather than
//! `prometheus-client`: ingress-nginx's counters `success`, `errors`,
//! `check_success`, `check_errors` and `requests` have no `_total` suffix,
//! which OpenMetrics (all `prometheus-client` writes) demands of counters.
//!
//! Every family carries ingress-nginx's constant labels
//! `controller_namespace`, `controller_class` and `controller_pod`
//! ([`Identity`]), except those ingress-nginx exports without them: the
//! certificate families (`ssl_*`) and the process metrics of the
//! controller itself (`process_*`).

mod model_series;
mod nginx_process;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

pub use model_series::{certificate_series, orphans, CertificateSeries, Orphan};
pub use nginx_process::NginxProcesses;

/// The prefix of every family ingress-nginx exports.
pub const PREFIX: &str = "nginx_ingress_controller_";

/// Most distinct `namespace`/`ingress` pairs `check_success` and
/// `check_errors` keep. The webhook answers whoever may create Ingresses,
/// and a refused Ingress never exists, so its names are not bounded by the
/// cluster; past this many, reviews are counted under `ingress="_other"`.
const MAX_CHECK_SERIES: usize = 4096;

/// ingress-nginx's constant labels: who exports a series.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// `controller_class`: `--controller-class` (ingress-nginx's
    /// `k8s.io/ingress-nginx` by default), not the IngressClass's name.
    pub class: String,
    /// `controller_namespace`: `$POD_NAMESPACE`, `default` when unset, as
    /// ingress-nginx has it.
    pub namespace: String,
    /// `controller_pod`: `$POD_NAME`.
    pub pod: String,
}

impl Identity {
    /// From `--controller-class` and the Pod's downward-API variables.
    pub fn from_env(class: &str) -> Self {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Identity {
            class: class.to_string(),
            namespace: env("POD_NAMESPACE").unwrap_or_else(|| "default".into()),
            pod: env("POD_NAME").unwrap_or_default(),
        }
    }

    fn labels(&self) -> HashMap<String, String> {
        [
            ("controller_class", &self.class),
            ("controller_namespace", &self.namespace),
            ("controller_pod", &self.pod),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
    }
}

impl Default for Identity {
    fn default() -> Self {
        Identity {
            class: "k8s.io/ingress-nginx".into(),
            namespace: "default".into(),
            pod: String::new(),
        }
    }
}

pub struct Metrics {
    /// Families with the constant labels (set on each: see [`opts`]).
    labelled: Registry,
    /// Families ingress-nginx exports without them.
    plain: Registry,
    identity: Identity,
    /// `ssl_expire_time_seconds` is the leader's alone, as in ingress-nginx
    /// (one series per certificate across the replicas, for alerts that
    /// would otherwise fire once per Pod). True when there is no election.
    leading: AtomicBool,
    check_series: Mutex<HashSet<(String, String)>>,
    last_model: Mutex<LastModel>,

    // ingress-nginx's families.
    pub build_info: IntGauge,
    pub last_reload_successful: IntGauge,
    pub last_reload_successful_timestamp: Gauge,
    pub config_hash: Gauge,
    pub reload_success: IntCounter,
    pub reload_errors: IntCounter,
    pub check_success: IntCounterVec,
    pub check_errors: IntCounterVec,
    pub leader_election_status: IntGaugeVec,
    pub orphan_ingress: IntGaugeVec,
    pub ssl_expire_time: GaugeVec,
    pub ssl_certificate_info: IntGaugeVec,
    pub admission_tested_ingresses: IntGauge,
    pub admission_tested_duration: Gauge,
    pub admission_roundtrip_duration: Gauge,
    pub nginx_processes: NginxProcesses,

    // This controller's own.
    pub reload_duration: Histogram,
    pub pushes: IntCounterVec,
    pub push_duration: Histogram,
    pub queue_depth: IntGaugeVec,
    pub invalid_values: IntGauge,
    pub nginx_restarts: IntCounter,
    pub refused_backends: IntGauge,
    pub quarantined_ingresses: IntGauge,
    pub module_scrape_errors: IntCounter,
    pub admission_reviews: IntCounterVec,
    pub admission_duration: Histogram,
    pub renders: IntCounter,
    pub model_builds: IntCounterVec,
    pub model_build_duration: HistogramVec,
}

/// What the model-derived series were last set from.
#[derive(Default)]
struct LastModel {
    orphans: Vec<Orphan>,
    /// The model's maps the certificate series were computed from.
    certificate_source: Option<(CertificatesById, TlsHosts)>,
    certificates: Vec<CertificateSeries>,
}

type CertificatesById = std::sync::Arc<std::collections::BTreeMap<String, crate::model::tls::Pair>>;
type TlsHosts = std::sync::Arc<std::collections::BTreeMap<String, String>>;

/// A family of ingress-nginx's namespace with `constant` labels. They are
/// set per family rather than on the registry, which would write them in
/// a random order.
fn opts(name: &str, help: &str, constant: &HashMap<String, String>) -> Opts {
    Opts::new(format!("{PREFIX}{name}"), help).const_labels(constant.clone())
}

fn histogram(name: &str, help: &str, start: f64, count: usize, constant: &HashMap<String, String>) -> HistogramOpts {
    HistogramOpts::new(format!("{PREFIX}{name}"), help)
        .const_labels(constant.clone())
        .buckets(exponential_buckets(start, 2.0, count).expect("valid exponential buckets"))
}

impl Metrics {
    pub fn new(identity: Identity) -> Self {
        let labelled = Registry::new();
        let plain = Registry::new();
        let cl = identity.labels();
        let none = HashMap::new();
        let opts = |name: &str, help: &str| opts(name, help, &cl);
        let histogram = |name: &str, help: &str, start: f64, count: usize| histogram(name, help, start, count, &cl);
        let counter = |name: &str, help: &str| IntCounter::with_opts(opts(name, help)).expect("a valid counter");
        let counters =
            |name: &str, help: &str, l: &[&str]| IntCounterVec::new(opts(name, help), l).expect("valid counters");
        let int_gauge = |name: &str, help: &str| IntGauge::with_opts(opts(name, help)).expect("a valid gauge");
        let gauge = |name: &str, help: &str| Gauge::with_opts(opts(name, help)).expect("a valid gauge");
        let int_gauges =
            |name: &str, help: &str, l: &[&str]| IntGaugeVec::new(opts(name, help), l).expect("valid gauges");
        let check_labels = ["namespace", "ingress"];
        let cert_labels = ["namespace", "class", "host", "secret_name", "identifier"];
        let info_labels = [
            "namespace",
            "class",
            "host",
            "secret_name",
            "identifier",
            "issuer_organization",
            "issuer_common_name",
            "serial_number",
            "public_key_algorithm",
        ];
        let build_info = IntGauge::with_opts(
            opts(
                "build_info",
                "A metric with a constant '1' labeled with information about the build.",
            )
            .const_label("release", env!("CARGO_PKG_VERSION"))
            .const_label("build", option_env!("DYNAMIC_BALANCER_COMMIT").unwrap_or("unknown"))
            .const_label("repository", "dynamic-balancer"),
        )
        .expect("a valid gauge");
        build_info.set(1);
        let m = Metrics {
            build_info,
            last_reload_successful: int_gauge(
                "config_last_reload_successful",
                "Whether the last configuration reload attempt was successful",
            ),
            last_reload_successful_timestamp: gauge(
                "config_last_reload_successful_timestamp_seconds",
                "Timestamp of the last successful configuration reload.",
            ),
            config_hash: gauge(
                "config_hash",
                "Running configuration hash actually set (0 after a failed reload)",
            ),
            reload_success: counter("success", "Cumulative number of Ingress controller reload operations"),
            reload_errors: counter(
                "errors",
                "Cumulative number of Ingress controller errors during reload operations",
            ),
            check_success: counters(
                "check_success",
                "Cumulative number of Ingress controller syntax check operations",
                &check_labels,
            ),
            check_errors: counters(
                "check_errors",
                "Cumulative number of Ingress controller errors during syntax check operations",
                &check_labels,
            ),
            leader_election_status: int_gauges(
                "leader_election_status",
                "Gauge reporting status of the leader election, 0 indicates follower, 1 indicates leader. 'name' is the string used to identify the lease",
                &["name"],
            ),
            orphan_ingress: int_gauges(
                "orphan_ingress",
                "Gauge reporting status of orphaned ingress, 1 indicates orphaned ingress. 'namespace' is the string used to identify namespace of ingress, 'ingress' for ingress name and 'type' for 'no-service' or 'no-endpoint' of orphaning",
                &["namespace", "ingress", "type"],
            ),
            ssl_expire_time: GaugeVec::new(
                self::opts(
                    "ssl_expire_time_seconds",
                    "Number of seconds since 1970 to the SSL Certificate expire. An example to check if this certificate will expire in 10 days is: \"nginx_ingress_controller_ssl_expire_time_seconds < (time() + (10 * 24 * 3600))\"",
                    &none,
                ),
                &cert_labels,
            )
            .expect("valid gauges"),
            ssl_certificate_info: IntGaugeVec::new(
                self::opts("ssl_certificate_info", "Hold all labels associated to a certificate", &none),
                &info_labels,
            )
            .expect("valid gauges"),
            admission_tested_ingresses: int_gauge(
                "admission_tested_ingresses",
                "The length of ingresses processed by the admission controller",
            ),
            admission_tested_duration: gauge(
                "admission_tested_duration",
                "The processing duration of the admission controller tests (float seconds)",
            ),
            admission_roundtrip_duration: gauge(
                "admission_roundtrip_duration",
                "The complete duration of the admission controller at the time to process a new event (float seconds)",
            ),
            nginx_processes: NginxProcesses::new(PREFIX, &cl),
            reload_duration: Histogram::with_opts(histogram(
                "reload_duration_seconds",
                "Time from a structural change being picked up to new workers serving it (render, nginx -t, reload, wait)",
                0.005,
                14,
            ))
            .expect("a valid histogram"),
            pushes: counters(
                "dynamic_pushes_total",
                "Backend pushes to the module, by kind and result",
                &["kind", "result"],
            ),
            push_duration: Histogram::with_opts(histogram(
                "dynamic_push_duration_seconds",
                "Time to push one batch of backend changes to the module",
                0.0002,
                16,
            ))
            .expect("a valid histogram"),
            queue_depth: int_gauges(
                "sync_queue_depth",
                "Changes waiting to be applied: backend pushes on the dynamic path, a pending reload on the structural path",
                &["path"],
            ),
            invalid_values: int_gauge(
                "invalid_values",
                "Annotation, ConfigMap and object values refused in the current model",
            ),
            nginx_restarts: counter(
                "nginx_restarts_total",
                "Times the supervised nginx master died and was restarted",
            ),
            refused_backends: int_gauge(
                "refused_backends",
                "Backends the module refused (e.g. an ExternalName that resolves to loopback); they are left out until they change",
            ),
            quarantined_ingresses: int_gauge(
                "quarantined_ingresses",
                "Ingresses left out of nginx.conf because nginx refused the configuration they produce",
            ),
            module_scrape_errors: counter(
                "module_metrics_scrape_errors_total",
                "Scrapes of /metrics that could not include the module's request metrics (nginx down or slow)",
            ),
            admission_reviews: counters(
                "admission_reviews_total",
                "Admission reviews answered by the validating webhook, by result",
                &["result"],
            ),
            admission_duration: Histogram::with_opts(histogram(
                "admission_review_duration_seconds",
                "Time the validating webhook spent on one review, waiting for its turn included",
                0.0005,
                16,
            ))
            .expect("a valid histogram"),
            renders: counter(
                "renders_total",
                "Times nginx.conf was rendered (a structural change, or a quarantine search); endpoint changes never render",
            ),
            model_builds: counters(
                "model_builds_total",
                "Models built: in full from every object, or only the backends of the Services whose endpoints changed",
                &["kind"],
            ),
            model_build_duration: HistogramVec::new(
                histogram("model_build_duration_seconds", "Time to build one model, by kind", 0.0001, 18),
                &["kind"],
            )
            .expect("valid histograms"),
            labelled,
            plain,
            identity,
            leading: AtomicBool::new(true),
            check_series: Mutex::new(HashSet::new()),
            last_model: Mutex::new(LastModel::default()),
        };
        let labelled: [Box<dyn Collector>; 28] = [
            Box::new(m.build_info.clone()),
            Box::new(m.last_reload_successful.clone()),
            Box::new(m.last_reload_successful_timestamp.clone()),
            Box::new(m.config_hash.clone()),
            Box::new(m.reload_success.clone()),
            Box::new(m.reload_errors.clone()),
            Box::new(m.check_success.clone()),
            Box::new(m.check_errors.clone()),
            Box::new(m.leader_election_status.clone()),
            Box::new(m.orphan_ingress.clone()),
            Box::new(m.admission_tested_ingresses.clone()),
            Box::new(m.admission_tested_duration.clone()),
            Box::new(m.admission_roundtrip_duration.clone()),
            Box::new(m.nginx_processes.clone()),
            Box::new(m.reload_duration.clone()),
            Box::new(m.pushes.clone()),
            Box::new(m.push_duration.clone()),
            Box::new(m.queue_depth.clone()),
            Box::new(m.invalid_values.clone()),
            Box::new(m.nginx_restarts.clone()),
            Box::new(m.refused_backends.clone()),
            Box::new(m.quarantined_ingresses.clone()),
            Box::new(m.module_scrape_errors.clone()),
            Box::new(m.admission_reviews.clone()),
            Box::new(m.admission_duration.clone()),
            Box::new(m.renders.clone()),
            Box::new(m.model_builds.clone()),
            Box::new(m.model_build_duration.clone()),
        ];
        for c in labelled {
            m.labelled.register(c).expect("distinct metric names");
        }
        m.plain
            .register(Box::new(m.ssl_expire_time.clone()))
            .expect("distinct metric names");
        m.plain
            .register(Box::new(m.ssl_certificate_info.clone()))
            .expect("distinct metric names");
        #[cfg(target_os = "linux")]
        m.plain
            .register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
            .expect("distinct metric names");
        m
    }

    /// Who this controller is, for the module's metrics it relays.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Prometheus text 0.0.4 of every family, sorted by name.
    pub fn encode(&self) -> String {
        let leading = self.leading.load(Ordering::Acquire);
        let expire = format!("{PREFIX}ssl_expire_time_seconds");
        let mut families = self.labelled.gather();
        families.extend(
            self.plain
                .gather()
                .into_iter()
                .filter(|f| leading || f.name() != expire),
        );
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&families, &mut out)
            .expect("encoding to a String cannot fail");
        out
    }

    /// Records leadership of the Lease `name` (`leader_election_status`).
    pub fn set_leading(&self, name: &str, leading: bool) {
        self.leading.store(leading, Ordering::Release);
        self.leader_election_status
            .with_label_values(&[name])
            .set(i64::from(leading));
    }

    /// A failed reload: ingress-nginx zeroes the hash, so that a dashboard
    /// shows no configuration rather than the last good one's.
    pub fn reload_failed(&self) {
        self.reload_errors.inc();
        self.last_reload_successful.set(0);
        self.config_hash.set(0.0);
    }

    /// The webhook checked Ingress `namespace/name`.
    pub fn checked(&self, namespace: &str, name: &str, ok: bool) {
        let key = {
            let mut seen = self.check_series.lock();
            let key = (namespace.to_string(), name.to_string());
            if seen.contains(&key) || seen.len() < MAX_CHECK_SERIES {
                seen.insert(key.clone());
                key
            } else {
                ("_other".to_string(), "_other".to_string())
            }
        };
        let family = if ok { &self.check_success } else { &self.check_errors };
        family.with_label_values(&[key.0.as_str(), key.1.as_str()]).inc();
    }

    /// Sets the series derived from a model: orphaned Ingresses and the
    /// certificates served. Series of what the model no longer has are
    /// removed one by one, never by a reset, so that a scrape never sees
    /// the families empty (an expiry alert would resolve and fire again).
    /// Nothing is written when nothing changed: an endpoint change makes a
    /// new model every time, with the same certificates.
    pub fn observe_model(&self, model: &crate::model::Model) {
        let mut last = self.last_model.lock();
        let orphans = orphans(model);
        if orphans != last.orphans {
            let kinds = ["no-service", "no-endpoint"];
            for gone in last.orphans.iter().filter(|o| {
                !orphans
                    .iter()
                    .any(|n| n.namespace == o.namespace && n.ingress == o.ingress)
            }) {
                for kind in kinds {
                    let _ = self.orphan_ingress.remove_label_values(&[
                        gone.namespace.as_str(),
                        gone.ingress.as_str(),
                        kind,
                    ]);
                }
            }
            for o in &orphans {
                for (kind, on) in kinds.into_iter().zip([o.no_service, o.no_endpoint]) {
                    self.orphan_ingress
                        .with_label_values(&[o.namespace.as_str(), o.ingress.as_str(), kind])
                        .set(i64::from(on));
                }
            }
            last.orphans = orphans;
        }
        let same = last.certificate_source.as_ref().is_some_and(|(c, h)| {
            std::sync::Arc::ptr_eq(c, &model.certificates) && std::sync::Arc::ptr_eq(h, &model.tls_hosts)
        });
        if same {
            return;
        }
        last.certificate_source = Some((model.certificates.clone(), model.tls_hosts.clone()));
        let certificates = certificate_series(model, &self.identity.class);
        if certificates == last.certificates {
            return;
        }
        let expiry = |c: &CertificateSeries| {
            [&c.namespace, &c.class, &c.host, &c.secret_name, &c.identifier].map(|s| s.as_str().to_owned())
        };
        let info = |c: &CertificateSeries| {
            [
                &c.namespace,
                &c.class,
                &c.host,
                &c.secret_name,
                &c.identifier,
                &c.issuer_organization,
                &c.issuer_common_name,
                &c.serial_number,
                &c.public_key_algorithm,
            ]
            .map(|s| s.as_str().to_owned())
        };
        for gone in last.certificates.iter().filter(|c| !certificates.contains(c)) {
            let (e, i) = (expiry(gone), info(gone));
            let _ = self
                .ssl_expire_time
                .remove_label_values(&e.each_ref().map(String::as_str));
            let _ = self
                .ssl_certificate_info
                .remove_label_values(&i.each_ref().map(String::as_str));
        }
        for c in &certificates {
            let (e, i) = (expiry(c), info(c));
            self.ssl_expire_time
                .with_label_values(&e.each_ref().map(String::as_str))
                .set(c.not_after as f64);
            self.ssl_certificate_info
                .with_label_values(&i.each_ref().map(String::as_str))
                .set(1);
        }
        last.certificates = certificates;
    }

    /// Counts a model build of `kind` that took `seconds`.
    pub fn model_built(&self, kind: &'static str, seconds: f64) {
        self.model_builds.with_label_values(&[kind]).inc();
        self.model_build_duration.with_label_values(&[kind]).observe(seconds);
    }

    pub fn push(&self, kind: &'static str, ok: bool) {
        self.push_result(kind, if ok { "ok" } else { "error" });
    }

    /// `result` is `ok`, `error` (retried) or `refused` (left out).
    pub fn push_result(&self, kind: &'static str, result: &'static str) {
        self.pushes.with_label_values(&[kind, result]).inc();
    }

    /// The queue depth gauge of `path`: `dynamic` or `structural`.
    pub fn queue(&self, path: &'static str) -> IntGauge {
        self.queue_depth.with_label_values(&[path])
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(Identity::default())
    }
}

/// Seconds since the epoch, for the `_timestamp_seconds` gauge.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity {
            class: "k8s.io/ingress-nginx".into(),
            namespace: "ingress-nginx".into(),
            pod: "ingress-nginx-controller-abc".into(),
        }
    }

    const CONST: &str = "controller_class=\"k8s.io/ingress-nginx\",controller_namespace=\"ingress-nginx\",controller_pod=\"ingress-nginx-controller-abc\"";

    #[test]
    fn ingress_nginx_counters_keep_their_names_and_type() {
        let m = Metrics::new(identity());
        m.reload_success.inc();
        m.reload_failed();
        let text = m.encode();
        assert!(
            text.contains("# TYPE nginx_ingress_controller_success counter\n"),
            "{text}"
        );
        assert!(
            text.contains(&format!("nginx_ingress_controller_success{{{CONST}}} 1\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("nginx_ingress_controller_errors{{{CONST}}} 1\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("nginx_ingress_controller_config_hash{{{CONST}}} 0\n")),
            "{text}"
        );
        assert!(
            text.contains("# TYPE nginx_ingress_controller_build_info gauge\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "text 0.0.4 has no end marker");
    }

    #[test]
    fn certificate_families_have_no_constant_labels_and_expiry_is_the_leaders() {
        let m = Metrics::new(identity());
        m.ssl_expire_time
            .with_label_values(&["shop", "k8s.io/ingress-nginx", "a.example", "web", "-1"])
            .set(1.0);
        assert!(m
            .encode()
            .contains("nginx_ingress_controller_ssl_expire_time_seconds{class=\"k8s.io/ingress-nginx\",host=\"a.example\",identifier=\"-1\",namespace=\"shop\",secret_name=\"web\"} 1\n"));
        m.set_leading("ingress-controller-leader", false);
        let text = m.encode();
        assert!(!text.contains("ssl_expire_time_seconds"), "{text}");
        assert!(text.contains(&format!(
            "nginx_ingress_controller_leader_election_status{{{CONST},name=\"ingress-controller-leader\"}} 0\n"
        )));
    }

    #[test]
    fn check_series_are_bounded() {
        let m = Metrics::new(identity());
        for i in 0..MAX_CHECK_SERIES + 10 {
            m.checked("ns", &format!("ing-{i}"), false);
        }
        m.checked("ns", "ing-0", true);
        let text = m.encode();
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("nginx_ingress_controller_check_errors{"))
                .count(),
            MAX_CHECK_SERIES + 1
        );
        assert!(text.contains("ingress=\"_other\",namespace=\"_other\"} 10\n"), "{text}");
    }
}
