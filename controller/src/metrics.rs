//! Prometheus metrics. Names shared with ingress-nginx keep its names so
//! existing dashboards and alerts carry over:
//! `nginx_ingress_controller_config_last_reload_successful`,
//! `..._config_last_reload_successful_timestamp_seconds`, `..._config_hash`,
//! `..._success` and `..._errors`.
//!
//! ingress-nginx exposes `success` and `errors` as counters without the
//! `_total` suffix that OpenMetrics (and prometheus-client) add to counters.
//! To keep the exact names they are exported as gauges that only ever go
//! up; `increase()`/`rate()` work on them unchanged.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `allowed`, `denied`, `invalid` (not an AdmissionReview), `busy`
    /// (refused with 429: too many waiting) or `timeout`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PushLabels {
    /// `post` (full), `put` or `delete`.
    pub kind: &'static str,
    /// `ok`, `error` (retried) or `refused` (the module refused the
    /// backend; it is left out until it changes).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// `dynamic` (backend pushes) or `structural` (a pending reload).
    pub path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// `full` (everything built from the snapshot) or `endpoints` (only
    /// the backends of the Services whose endpoints changed).
    pub kind: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    pub last_reload_successful: Gauge,
    pub last_reload_successful_timestamp: Gauge<f64, AtomicU64>,
    pub config_hash: Gauge<f64, AtomicU64>,
    pub reload_success: Gauge,
    pub reload_errors: Gauge,
    pub reload_duration: Histogram,
    pub pushes: Family<PushLabels, Counter>,
    pub push_duration: Histogram,
    pub queue_depth: Family<QueueLabels, Gauge>,
    pub invalid_values: Gauge,
    pub nginx_restarts: Counter,
    pub refused_backends: Gauge,
    pub quarantined_ingresses: Gauge,
    pub module_scrape_errors: Counter,
    pub admission_reviews: Family<AdmissionLabels, Counter>,
    pub admission_duration: Histogram,
    pub renders: Counter,
    pub model_builds: Family<BuildLabels, Counter>,
    pub model_build_duration: HistogramFamily<BuildLabels>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            last_reload_successful: Gauge::default(),
            last_reload_successful_timestamp: Gauge::default(),
            config_hash: Gauge::default(),
            reload_success: Gauge::default(),
            reload_errors: Gauge::default(),
            reload_duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            pushes: Family::default(),
            push_duration: Histogram::new(exponential_buckets(0.0002, 2.0, 16)),
            queue_depth: Family::default(),
            invalid_values: Gauge::default(),
            nginx_restarts: Counter::default(),
            refused_backends: Gauge::default(),
            quarantined_ingresses: Gauge::default(),
            module_scrape_errors: Counter::default(),
            admission_reviews: Family::default(),
            admission_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            renders: Counter::default(),
            model_builds: Family::default(),
            model_build_duration: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0001, 2.0, 18))),
            registry: Registry::default(),
        };
        let p = "nginx_ingress_controller_";
        registry.register(
            format!("{p}config_last_reload_successful"),
            "Whether the last configuration reload attempt was successful",
            m.last_reload_successful.clone(),
        );
        registry.register(
            format!("{p}config_last_reload_successful_timestamp_seconds"),
            "Timestamp of the last successful configuration reload",
            m.last_reload_successful_timestamp.clone(),
        );
        registry.register(
            format!("{p}config_hash"),
            "Running configuration hash actually set",
            m.config_hash.clone(),
        );
        registry.register(
            format!("{p}success"),
            "Cumulative number of Ingress controller reload operations",
            m.reload_success.clone(),
        );
        registry.register(
            format!("{p}errors"),
            "Cumulative number of Ingress controller errors during reload operations",
            m.reload_errors.clone(),
        );
        registry.register(
            format!("{p}reload_duration_seconds"),
            "Time from a structural change being picked up to new workers serving it (render, nginx -t, reload, wait)",
            m.reload_duration.clone(),
        );
        registry.register(
            format!("{p}dynamic_pushes"),
            "Backend pushes to the module, by kind and result",
            m.pushes.clone(),
        );
        registry.register(
            format!("{p}dynamic_push_duration_seconds"),
            "Time to push one batch of backend changes to the module",
            m.push_duration.clone(),
        );
        registry.register(format!("{p}sync_queue_depth"), "Changes waiting to be applied: backend pushes on the dynamic path, a pending reload on the structural path", m.queue_depth.clone());
        registry.register(
            format!("{p}invalid_values"),
            "Annotation, ConfigMap and object values refused in the current model",
            m.invalid_values.clone(),
        );
        registry.register(
            format!("{p}nginx_restarts"),
            "Times the supervised nginx master died and was restarted",
            m.nginx_restarts.clone(),
        );
        registry.register(
            format!("{p}refused_backends"),
            "Backends the module refused (e.g. an ExternalName that resolves to loopback); they are left out until they change",
            m.refused_backends.clone(),
        );
        registry.register(
            format!("{p}quarantined_ingresses"),
            "Ingresses left out of nginx.conf because nginx refused the configuration they produce",
            m.quarantined_ingresses.clone(),
        );
        registry.register(
            format!("{p}module_metrics_scrape_errors"),
            "Scrapes of /metrics that could not include the module's request metrics (nginx down or slow)",
            m.module_scrape_errors.clone(),
        );
        registry.register(
            format!("{p}admission_reviews"),
            "Admission reviews answered by the validating webhook, by result",
            m.admission_reviews.clone(),
        );
        registry.register(
            format!("{p}admission_review_duration_seconds"),
            "Time the validating webhook spent on one review, waiting for its turn included",
            m.admission_duration.clone(),
        );
        registry.register(
            format!("{p}renders"),
            "Times nginx.conf was rendered (a structural change, or a quarantine search); endpoint changes never render",
            m.renders.clone(),
        );
        registry.register(
            format!("{p}model_builds"),
            "Models built: in full from every object, or only the backends of the Services whose endpoints changed",
            m.model_builds.clone(),
        );
        registry.register(
            format!("{p}model_build_duration_seconds"),
            "Time to build one model, by kind",
            m.model_build_duration.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("encoding to a String cannot fail");
        out
    }

    /// Counts a model build of `kind` that took `seconds`.
    pub fn model_built(&self, kind: &'static str, seconds: f64) {
        let labels = BuildLabels { kind };
        self.model_builds.get_or_create(&labels).inc();
        self.model_build_duration.get_or_create(&labels).observe(seconds);
    }

    pub fn push(&self, kind: &'static str, ok: bool) {
        self.push_result(kind, if ok { "ok" } else { "error" });
    }

    /// `result` is `ok`, `error` (retried) or `refused` (left out).
    pub fn push_result(&self, kind: &'static str, result: &'static str) {
        self.pushes.get_or_create(&PushLabels { kind, result }).inc();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Seconds since the epoch, for the `_timestamp_seconds` gauge.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
