//! The exporter's settings (`dynamic_balancer_otel_exporter`), with
//! ingress-nginx's defaults and limits that keep a worker's memory
//! bounded whatever the configuration says.

use std::time::Duration;

/// `otel-max-queuesize`'s default: spans waiting per worker.
pub const DEFAULT_QUEUE: usize = 2048;
/// `otel-max-export-batch-size`'s default.
pub const DEFAULT_BATCH: usize = 512;
/// `otel-schedule-delay-millis`'s default.
pub const DEFAULT_DELAY: Duration = Duration::from_millis(5000);
/// How long one export may take before it is abandoned (the SDK's
/// default export timeout).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// A queue longer than this is refused. Its slots are allocated when the
/// worker starts, about 500 bytes each (1 MiB for the default 2048), and a
/// span's texts above 256 bytes add their own: 64 Ki spans is 32 MiB per
/// worker already.
pub const MAX_QUEUE: usize = 65_536;

/// Where and how a worker exports its spans.
#[derive(Clone, Debug, PartialEq)]
pub struct ExporterSettings {
    /// `host:port` of an OTLP/gRPC receiver (cleartext HTTP/2).
    pub endpoint: String,
    /// `service.name` of the resource (`otel-service-name`).
    pub service_name: String,
    pub queue: usize,
    pub batch: usize,
    pub delay: Duration,
    pub timeout: Duration,
}

impl ExporterSettings {
    /// Parses the directive's arguments: the endpoint, then any of
    /// `service_name=`, `queue=`, `batch=`, `delay=` (ms) and `timeout=`
    /// (ms).
    pub fn parse(args: &[&str]) -> Result<ExporterSettings, String> {
        let (endpoint, rest) = args.split_first().ok_or("an endpoint (host:port) is needed")?;
        check_endpoint(endpoint)?;
        let mut s = ExporterSettings {
            endpoint: endpoint.to_string(),
            service_name: "nginx".into(),
            queue: DEFAULT_QUEUE,
            batch: DEFAULT_BATCH,
            delay: DEFAULT_DELAY,
            timeout: DEFAULT_TIMEOUT,
        };
        for arg in rest {
            let (key, value) = arg
                .split_once('=')
                .ok_or_else(|| format!("\"{arg}\": expected key=value"))?;
            let number = || -> Result<u64, String> {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{key}: \"{value}\" is not a positive integer"))
            };
            match key {
                "service_name" => {
                    if value.is_empty() || value.len() > 255 || value.chars().any(char::is_control) {
                        return Err("service_name: 1 to 255 printable characters".into());
                    }
                    s.service_name = value.to_string();
                }
                "queue" => s.queue = number()? as usize,
                "batch" => s.batch = number()? as usize,
                "delay" => s.delay = Duration::from_millis(number()?.min(3_600_000)),
                "timeout" => s.timeout = Duration::from_millis(number()?.min(600_000)),
                other => return Err(format!("unknown parameter \"{other}\"")),
            }
        }
        if s.queue > MAX_QUEUE {
            return Err(format!("queue: at most {MAX_QUEUE}"));
        }
        // As the SDK requires: a batch never exceeds the queue.
        s.batch = s.batch.min(s.queue);
        Ok(s)
    }
}

/// `host:port`, `[v6]:port`: a port in 1-65535 and a host of DNS name or
/// address characters.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let (host, port) = endpoint
        .rsplit_once(':')
        .ok_or_else(|| format!("\"{endpoint}\": expected host:port"))?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(format!("\"{endpoint}\": the port must be 1-65535")),
    }
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty()
        || host.len() > 253
        || !host
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b':' | b'_'))
    {
        return Err(format!("\"{endpoint}\": not a host name or address"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ingress_nginxs() {
        let s = ExporterSettings::parse(&["otel.monitoring.svc:4317"]).unwrap();
        assert_eq!((s.queue, s.batch, s.delay), (2048, 512, Duration::from_secs(5)));
        assert_eq!(s.service_name, "nginx");
    }

    #[test]
    fn parameters_are_read_and_checked() {
        let s = ExporterSettings::parse(&["[::1]:4317", "service_name=edge", "queue=100", "batch=500", "delay=50"])
            .unwrap();
        assert_eq!(s.batch, 100, "a batch never exceeds the queue");
        assert_eq!(s.delay, Duration::from_millis(50));
        assert_eq!(s.service_name, "edge");
        for bad in [
            &["nohost"][..],
            &["h:0"],
            &["h:70000"],
            &["h o:1"],
            &["h:1", "queue=0"],
            &["h:1", "queue=1000000"],
            &["h:1", "nope=1"],
            &["h:1", "batch"],
            &["h:1", "service_name="],
        ] {
            assert!(ExporterSettings::parse(bad).is_err(), "{bad:?}");
        }
    }
}
