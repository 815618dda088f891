//! The client's address behind a trusted proxy: nginx's realip module, set
//! up as ingress-nginx sets it. With `use-forwarded-headers` or
//! `enable-real-ip`, a connection from an address in `proxy-real-ip-cidr`
//! may name the client in `forwarded-for-header` (the right-most address
//! that is not itself trusted, `real_ip_recursive on`). `$remote_addr`
//! then is the client: allowlists, denylists, rate limits, logs and the
//! `X-Real-IP`/`X-Forwarded-For` sent upstream all see it.

use serde::Serialize;

use super::values::{parse_cidrs, HeaderName, Invalid};

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct RealIp {
    pub enable_real_ip: bool,
    pub forwarded_for_header: HeaderName,
    /// Addresses and networks whose forwarded header is believed.
    pub proxy_real_ip_cidr: Vec<String>,
    /// `compute-full-forwarded-for`: send the client's whole
    /// `X-Forwarded-For` chain plus the connecting address upstream,
    /// instead of the client address alone.
    pub compute_full_forwarded_for: bool,
    /// `use-proxy-protocol`: the HTTP and HTTPS listeners expect the PROXY
    /// protocol (a load balancer in front sends it), and the client's
    /// address is the one it declares, believed only from
    /// `proxy-real-ip-cidr`.
    pub use_proxy_protocol: bool,
}

impl Default for RealIp {
    /// ingress-nginx's defaults: off; when on, every address is trusted
    /// unless `proxy-real-ip-cidr` says otherwise.
    fn default() -> Self {
        RealIp {
            enable_real_ip: false,
            forwarded_for_header: HeaderName::parse("X-Forwarded-For").expect("valid default"),
            proxy_real_ip_cidr: vec!["0.0.0.0/0".into()],
            compute_full_forwarded_for: false,
            use_proxy_protocol: false,
        }
    }
}

impl RealIp {
    /// Applies one ConfigMap key; `None` if the key is not one of these.
    pub fn apply(&mut self, key: &str, v: &str) -> Option<Result<(), Invalid>> {
        let r = (|| {
            match key {
                "enable-real-ip" => self.enable_real_ip = super::values::parse_bool(v)?,
                "forwarded-for-header" => self.forwarded_for_header = HeaderName::parse(v)?,
                "proxy-real-ip-cidr" => {
                    let cidrs = parse_cidrs(v)?;
                    if cidrs.is_empty() {
                        return Err(Invalid(format!("proxy-real-ip-cidr is empty: {v:?}")));
                    }
                    self.proxy_real_ip_cidr = cidrs;
                }
                "compute-full-forwarded-for" => self.compute_full_forwarded_for = super::values::parse_bool(v)?,
                "use-proxy-protocol" => self.use_proxy_protocol = super::values::parse_bool(v)?,
                _ => return Ok(false),
            }
            Ok(true)
        })();
        match r {
            Ok(false) => None,
            Ok(true) => Some(Ok(())),
            Err(e) => Some(Err(e)),
        }
    }
}
