//! OpenTelemetry tracing's keys and annotations, as ingress-nginx reads
//! them (`enable-opentelemetry`, `opentelemetry-*`, `otel-*`,
//! `otlp-collector-*`), turned into the module's `dynamic_balancer_otel*`
//! directives.
//!
//! The operation name is the one value that reaches nginx.conf with
//! variables in it: it may name the variables a log format may
//! ([`super::log_format::variable_allowed`]) and ingress-nginx's per-location
//! ones (`$service_name`, `$namespace`, `$ingress_name`, `$service_port`,
//! `$location_path`), which are replaced with the location's values at
//! render time, so a name cannot refer to a variable nginx lacks and fail
//! the reload for every tenant.

use serde::Serialize;

use super::values::{number_in, Invalid};

/// ingress-nginx's per-location variables an operation name may use.
const LOCATION_VARIABLES: [&str; 5] = [
    "service_name",
    "namespace",
    "ingress_name",
    "service_port",
    "location_path",
];

/// A checked `opentelemetry-operation-name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct OperationName(String);

impl OperationName {
    pub fn parse(v: &str) -> Result<OperationName, Invalid> {
        let v = v.trim();
        if v.is_empty() || v.len() > 256 {
            return Err(Invalid(format!(
                "opentelemetry-operation-name: 1 to 256 characters: {v:?}"
            )));
        }
        if let Some(bad) = v
            .chars()
            .find(|c| !(c.is_ascii_graphic() || *c == ' ') || matches!(c, '"' | '\'' | ';' | '{' | '}' | '\\' | '#'))
        {
            return Err(Invalid(format!(
                "opentelemetry-operation-name: {bad:?} is not allowed: {v:?}"
            )));
        }
        let names =
            super::log_format::variables(v).map_err(|e| Invalid(format!("opentelemetry-operation-name: {e}")))?;
        if let Some(bad) = names
            .iter()
            .find(|n| !LOCATION_VARIABLES.contains(n) && !super::log_format::variable_allowed(n))
        {
            return Err(Invalid(format!(
                "opentelemetry-operation-name: ${bad} is not a variable a span name may use: {v:?}"
            )));
        }
        Ok(OperationName(v.to_string()))
    }

    /// The name with ingress-nginx's per-location variables replaced by
    /// the location's values (`$service_name` …), the others left to nginx.
    pub fn for_location(&self, values: &[(&str, &str)]) -> String {
        let mut out = self.0.clone();
        for (name, value) in values {
            // A regex path may hold `$` (`/api(/|$)(.*)`): written as the
            // template's `$literal_dollar`, it is text, never a variable
            // nginx would read (or refuse). `${name}` and `$name` both
            // match.
            let value = value.replace('$', "${literal_dollar}");
            out = out.replace(&format!("${{{name}}}"), &value);
            out = replace_variable(&out, name, &value);
        }
        out
    }
}

/// Replaces `$name` where it is the whole variable name (not a prefix of
/// a longer one).
fn replace_variable(text: &str, name: &str, value: &str) -> String {
    let pattern = format!("${name}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&pattern) {
        let after = &rest[at + pattern.len()..];
        out.push_str(&rest[..at]);
        if after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            out.push_str(&pattern);
        } else {
            out.push_str(value);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The ConfigMap's tracing keys, with ingress-nginx's defaults.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct OtelGlobal {
    /// `enable-opentelemetry`: trace every location (an Ingress may turn
    /// it off, or on when this is off).
    pub enabled: bool,
    /// `opentelemetry-trust-incoming-span` (default true).
    pub trust_incoming_span: bool,
    pub operation_name: Option<OperationName>,
    /// `otlp-collector-host`: without it spans are not exported (the
    /// context is still propagated).
    pub collector_host: Option<String>,
    pub collector_port: u16,
    pub service_name: String,
    /// `otel-sampler`: `AlwaysOn`, `AlwaysOff` (the default) or
    /// `TraceIdRatioBased`.
    pub sampler: String,
    /// `otel-sampler-ratio`, as checked and written back by Rust (an
    /// `f64` has no `Eq`, which the structure's change detection needs).
    pub sampler_ratio: String,
    pub sampler_parent_based: bool,
    pub max_queue_size: u32,
    pub schedule_delay_millis: u32,
    pub max_export_batch_size: u32,
}

impl Default for OtelGlobal {
    fn default() -> Self {
        OtelGlobal {
            enabled: false,
            trust_incoming_span: true,
            operation_name: None,
            collector_host: None,
            collector_port: 4317,
            service_name: "nginx".into(),
            sampler: "AlwaysOff".into(),
            sampler_ratio: "0.01".into(),
            sampler_parent_based: false,
            max_queue_size: 2048,
            schedule_delay_millis: 5000,
            max_export_batch_size: 512,
        }
    }
}

/// The keys [`OtelGlobal::apply`] reads.
pub const KEYS: [&str; 13] = [
    "enable-opentelemetry",
    "opentelemetry-trust-incoming-span",
    "opentelemetry-operation-name",
    "opentelemetry-config",
    "otlp-collector-host",
    "otlp-collector-port",
    "otel-service-name",
    "otel-sampler",
    "otel-sampler-ratio",
    "otel-sampler-parent-based",
    "otel-max-queuesize",
    "otel-schedule-delay-millis",
    "otel-max-export-batch-size",
];

impl OtelGlobal {
    /// Applies one ConfigMap key (one of [`KEYS`]).
    pub fn apply(&mut self, key: &str, v: &str, flag: impl Fn(&str) -> Result<bool, Invalid>) -> Result<(), Invalid> {
        match key {
            "enable-opentelemetry" => self.enabled = flag(v)?,
            "opentelemetry-trust-incoming-span" => self.trust_incoming_span = flag(v)?,
            "opentelemetry-operation-name" => {
                self.operation_name = if v.trim().is_empty() {
                    None
                } else {
                    Some(OperationName::parse(v)?)
                }
            }
            "opentelemetry-config" => {
                return Err(Invalid(
                    "ignored: the module is configured by the otel-* and otlp-* keys; no TOML file is read".into(),
                ))
            }
            "otlp-collector-host" => {
                let h = v.trim();
                if h.is_empty() {
                    self.collector_host = None;
                } else {
                    let ok = h.parse::<std::net::IpAddr>().is_ok()
                        || (!h.starts_with("*.") && super::values::Host::parse(h).is_ok());
                    if !ok {
                        return Err(Invalid(format!(
                            "otlp-collector-host: not a host name or address: {h:?}"
                        )));
                    }
                    self.collector_host = Some(h.to_string());
                }
            }
            "otlp-collector-port" => self.collector_port = number_in(v.trim(), 1..=65535, "otlp-collector-port")?,
            "otel-service-name" => {
                let s = v.trim();
                if s.is_empty()
                    || s.len() > 255
                    || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._:/".contains(&b))
                {
                    return Err(Invalid(format!(
                        "otel-service-name: 1 to 255 letters, digits and -._:/ : {s:?}"
                    )));
                }
                self.service_name = s.to_string();
            }
            "otel-sampler" => {
                let s = v.trim();
                if !matches!(s, "AlwaysOn" | "AlwaysOff" | "TraceIdRatioBased") {
                    return Err(Invalid(format!(
                        "otel-sampler: AlwaysOn, AlwaysOff or TraceIdRatioBased: {s:?}"
                    )));
                }
                self.sampler = s.to_string();
            }
            "otel-sampler-ratio" => {
                let r: f64 = v
                    .trim()
                    .parse()
                    .map_err(|_| Invalid(format!("otel-sampler-ratio: not a number: {v:?}")))?;
                if !(0.0..=1.0).contains(&r) {
                    return Err(Invalid(format!("otel-sampler-ratio: between 0 and 1: {v:?}")));
                }
                self.sampler_ratio = r.to_string();
            }
            "otel-sampler-parent-based" => self.sampler_parent_based = flag(v)?,
            "otel-max-queuesize" => self.max_queue_size = number_in(v.trim(), 1..=65536, "otel-max-queuesize")?,
            "otel-schedule-delay-millis" => {
                self.schedule_delay_millis = number_in(v.trim(), 1..=3_600_000, "otel-schedule-delay-millis")?
            }
            "otel-max-export-batch-size" => {
                self.max_export_batch_size = number_in(v.trim(), 1..=65536, "otel-max-export-batch-size")?
            }
            other => return Err(Invalid(format!("not a tracing key: {other}"))),
        }
        Ok(())
    }

    /// `dynamic_balancer_otel_sampler`'s arguments.
    pub fn sampler_directive(&self) -> Vec<String> {
        let root = match self.sampler.as_str() {
            "AlwaysOn" => "always_on".to_string(),
            "TraceIdRatioBased" => format!("ratio={}", self.sampler_ratio),
            _ => "always_off".to_string(),
        };
        let mut args = vec![root];
        if self.sampler_parent_based {
            args.push("parent_based".into());
        }
        args
    }

    /// `dynamic_balancer_otel_exporter`'s arguments, when a collector is
    /// named. A batch larger than the queue is cut to it, as the SDK does.
    pub fn exporter_directive(&self) -> Option<Vec<String>> {
        let host = self.collector_host.as_ref()?;
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        Some(vec![
            format!("{host}:{}", self.collector_port),
            format!("service_name={}", self.service_name),
            format!("queue={}", self.max_queue_size),
            format!("batch={}", self.max_export_batch_size.min(self.max_queue_size)),
            format!("delay={}", self.schedule_delay_millis),
        ])
    }
}

/// A location's tracing, when it is traced.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct LocationOtel {
    /// `opentelemetry-trust-incoming-span`.
    pub trust_incoming_span: bool,
    /// The span name with the location's values in.
    pub operation_name: Option<String>,
}

/// The tracing of a location: the annotations over the ConfigMap, as
/// ingress-nginx's `buildOpentelemetryForLocation` decides.
pub fn for_location(
    g: &OtelGlobal,
    enabled: Option<bool>,
    trust: Option<bool>,
    operation_name: Option<&OperationName>,
    values: &[(&str, &str)],
) -> Option<LocationOtel> {
    if !enabled.unwrap_or(g.enabled) {
        return None;
    }
    Some(LocationOtel {
        trust_incoming_span: trust.unwrap_or(g.trust_incoming_span),
        operation_name: operation_name
            .or(g.operation_name.as_ref())
            .map(|n| n.for_location(values)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag(v: &str) -> Result<bool, Invalid> {
        match v {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(Invalid("flag".into())),
        }
    }

    #[test]
    fn operation_names_are_checked_and_filled_in() {
        let n = OperationName::parse("HTTP $request_method $service_name $uri").unwrap();
        assert_eq!(
            n.for_location(&[("service_name", "web"), ("namespace", "ns")]),
            "HTTP $request_method web $uri"
        );
        // A regex path's `$` stays text, whatever follows it.
        let n = OperationName::parse("HTTP $location_path").unwrap();
        let named = n.for_location(&[("location_path", "/x$http_authorization(/|$)(.*)")]);
        assert_eq!(
            named,
            "HTTP /x${literal_dollar}http_authorization(/|${literal_dollar})(.*)"
        );
        let vars = crate::model::log_format::variables(&named).unwrap();
        assert_eq!(vars, ["literal_dollar", "literal_dollar"]);
        assert!(vars.iter().all(|v| crate::model::log_format::variable_allowed(v)));
        let n = OperationName::parse("${namespace}/$service_name_x").unwrap_err();
        assert!(n.0.contains("service_name_x"), "{n}");
        for bad in ["a;b", "x\"y", "$nope", "a{b}", "$", "new\nline", "back\\slash"] {
            assert!(OperationName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_are_read_with_ingress_nginx_defaults() {
        let mut g = OtelGlobal::default();
        assert_eq!(g.sampler_directive(), ["always_off"]);
        assert_eq!(g.exporter_directive(), None);
        g.apply("otlp-collector-host", "otel.monitoring.svc", flag).unwrap();
        g.apply("otel-sampler", "TraceIdRatioBased", flag).unwrap();
        g.apply("otel-sampler-ratio", "0.25", flag).unwrap();
        g.apply("otel-sampler-parent-based", "true", flag).unwrap();
        g.apply("otel-max-export-batch-size", "4096", flag).unwrap();
        assert_eq!(g.sampler_directive(), ["ratio=0.25", "parent_based"]);
        assert_eq!(
            g.exporter_directive().unwrap().join(" "),
            "otel.monitoring.svc:4317 service_name=nginx queue=2048 batch=2048 delay=5000"
        );
        g.apply("otlp-collector-host", "fd00::1", flag).unwrap();
        assert_eq!(g.exporter_directive().unwrap()[0], "[fd00::1]:4317");
        for (k, v) in [
            ("otel-sampler", "always"),
            ("otel-sampler-ratio", "2"),
            ("otlp-collector-port", "0"),
            ("otlp-collector-host", "a b;c"),
            ("otel-service-name", "x y"),
            ("otel-max-queuesize", "0"),
            ("opentelemetry-config", "/etc/nginx/opentelemetry.toml"),
        ] {
            assert!(g.apply(k, v, flag).is_err(), "{k}={v}");
        }
    }

    #[test]
    fn annotations_override_the_config_map() {
        let mut g = OtelGlobal::default();
        assert_eq!(for_location(&g, None, None, None, &[]), None);
        let on = for_location(&g, Some(true), Some(false), None, &[]).unwrap();
        assert!(!on.trust_incoming_span);
        g.enabled = true;
        assert_eq!(for_location(&g, Some(false), None, None, &[]), None);
        assert!(for_location(&g, None, None, None, &[]).unwrap().trust_incoming_span);
    }
}
