//! Command-line flags. Names follow ingress-nginx's where the meaning is
//! the same.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Parser)]
#[command(
    name = "ingress-controller",
    version,
    about = "Ingress controller for nginx with ngx_http_dynamic_balancer_module: reloads only on structural change, pushes backends live"
)]
pub struct Args {
    /// Read Ingresses, Services, EndpointSlices, Secrets, IngressClasses and
    /// the ConfigMap from this directory of YAML files instead of a cluster.
    #[arg(long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,

    /// kubeconfig to use; without it (and without --manifests) the usual
    /// inference applies: $KUBECONFIG, ~/.kube/config, then in-cluster.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The IngressClass name this controller serves.
    #[arg(long, default_value = "nginx")]
    pub ingress_class: String,

    /// `spec.controller` of the IngressClasses this controller owns.
    #[arg(long, default_value = "k8s.io/ingress-nginx")]
    pub controller_class: String,

    /// Also serve Ingresses that name no class at all.
    #[arg(long)]
    pub watch_ingress_without_class: bool,

    /// Only watch this namespace (default: all).
    #[arg(long, value_name = "NAMESPACE")]
    pub watch_namespace: Option<String>,

    /// The ConfigMap with global settings, as namespace/name.
    #[arg(long, default_value = "ingress-nginx/ingress-nginx-controller")]
    pub configmap: String,

    /// The Service (namespace/name) that serves requests no Ingress matches;
    /// without it nginx answers 404 itself.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub default_backend_service: Option<String>,

    /// Accept *-snippet annotations. They are rendered verbatim into
    /// nginx.conf, which is what CVE-2025-1974 exploited: leave this off
    /// unless every Ingress author is trusted.
    #[arg(long)]
    pub allow_snippet_annotations: bool,

    /// Accept EndpointSlice addresses on loopback and link-local networks
    /// (for a manifest directory whose upstreams run on the same host). By
    /// default they are refused: they would let whoever writes an
    /// EndpointSlice reach services of the node itself. Even with this, no
    /// endpoint may name the API, metrics, HTTP or HTTPS port on the local
    /// host, and an ExternalName of the local host is always refused.
    #[arg(long)]
    pub allow_local_endpoints: bool,

    /// A file holding the module API's bearer token (its first line), for
    /// an nginx whose configuration is managed elsewhere or a token kept in
    /// a Secret. Without it a random token is generated at every start and
    /// written to <conf-dir>/api-token (mode 0600).
    #[arg(long, value_name = "FILE")]
    pub api_token_file: Option<PathBuf>,

    /// The nginx binary.
    #[arg(long, default_value = "nginx")]
    pub nginx_binary: PathBuf,

    /// Path of ngx_http_dynamic_balancer_module.so, for `load_module`.
    #[arg(long, value_name = "FILE")]
    pub nginx_module: PathBuf,

    /// Where nginx.conf, TLS files and logs go; also nginx's prefix.
    #[arg(long, default_value = "/etc/nginx")]
    pub conf_dir: PathBuf,

    /// Drive an nginx someone else runs: its master pid is read from this
    /// file for reloads, and it is never started or stopped here.
    #[arg(long, value_name = "FILE")]
    pub nginx_pid_file: Option<PathBuf>,

    /// Base URL of the module's API (default http://127.0.0.1:<api-port>).
    #[arg(long, value_name = "URL")]
    pub status_url: Option<String>,

    /// A replacement for the built-in nginx.conf template (minijinja).
    #[arg(long, value_name = "FILE")]
    pub template: Option<PathBuf>,

    /// Address nginx listens on for traffic.
    #[arg(long, default_value = "0.0.0.0")]
    pub listen_address: String,

    #[arg(long, default_value_t = 80)]
    pub http_port: u16,

    #[arg(long, default_value_t = 443)]
    pub https_port: u16,

    /// Loopback port of the module's /configuration API.
    #[arg(long, default_value_t = 10246)]
    pub api_port: u16,

    /// Size of the module's shared zone.
    #[arg(long, default_value = "32m")]
    pub zone_size: String,

    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, default_value = "127.0.0.1:10254")]
    pub metrics_address: SocketAddr,

    /// How long a structural change waits for further changes before it is
    /// rendered, so a burst of edits costs one reload.
    #[arg(long, default_value_t = 250)]
    pub reload_settle_ms: u64,

    /// How long new workers may take to report after a reload.
    #[arg(long, default_value_t = 30)]
    pub reload_timeout_s: u64,

    /// nginx's error_log level.
    #[arg(long, default_value = "notice")]
    pub error_log_level: String,

    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

impl Args {
    pub fn configmap_ref(&self) -> anyhow::Result<(String, String)> {
        split_ref(&self.configmap, "--configmap")
    }
}

/// Parses `namespace/name`.
pub fn split_ref(s: &str, flag: &str) -> anyhow::Result<(String, String)> {
    match s.split_once('/') {
        Some((ns, name))
            if controller::model::values::is_object_name(ns) && controller::model::values::is_object_name(name) =>
        {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => anyhow::bail!("{flag} must be namespace/name, got {s:?}"),
    }
}
