//! Command-line flags. Names follow ingress-nginx's where the meaning is
//! the same.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::model::class::ClassFilter;
use crate::model::l4_services::ReservedPorts;
use crate::model::{AddressPolicy, BuildOptions, Listen};
use clap::{ArgAction, Parser, Subcommand, ValueEnum};

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
    /// Without a subcommand the controller runs; the subcommands inspect a
    /// running one (for `kubectl exec`).
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Read Ingresses, Services, EndpointSlices, Secrets, IngressClasses and
    /// the ConfigMap from this directory of YAML files instead of a cluster.
    #[arg(long, value_name = "DIR", global = true)]
    pub manifests: Option<PathBuf>,

    /// kubeconfig to use; without it (and without --manifests) the usual
    /// inference applies: $KUBECONFIG, ~/.kube/config, then in-cluster.
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,

    /// The IngressClass name this controller serves.
    #[arg(long, default_value = "nginx", global = true)]
    pub ingress_class: String,

    /// `spec.controller` of the IngressClasses this controller owns.
    #[arg(long, default_value = "k8s.io/ingress-nginx", global = true)]
    pub controller_class: String,

    /// Also serve Ingresses that name no class at all. Takes `=true`/`=false`
    /// too, as ingress-nginx's chart passes it.
    #[arg(long, global = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub watch_ingress_without_class: bool,

    /// Only watch this namespace (default: all).
    #[arg(long, value_name = "NAMESPACE", global = true)]
    pub watch_namespace: Option<String>,

    /// The ConfigMap with global settings, as namespace/name.
    #[arg(long, default_value = "ingress-nginx/ingress-nginx-controller", global = true)]
    pub configmap: String,

    /// The ConfigMap (namespace/name) of TCP services: each key an external
    /// port, each value `<namespace>/<service>:<port>[:PROXY][:PROXY]`,
    /// served by `stream {}` (see the book, "TCP and UDP services").
    #[arg(long, global = true)]
    pub tcp_services_configmap: Option<String>,

    /// The ConfigMap (namespace/name) of UDP services, same format without
    /// PROXY.
    #[arg(long, global = true)]
    pub udp_services_configmap: Option<String>,

    /// The Service (namespace/name) that serves requests no Ingress matches;
    /// without it nginx answers 404 itself.
    #[arg(long, value_name = "NAMESPACE/NAME", global = true)]
    pub default_backend_service: Option<String>,

    /// The TLS Secret (namespace/name) served to handshakes whose SNI no
    /// Ingress's certificate matches (and to clients without SNI). Without
    /// it a self-signed "Kubernetes Ingress Controller Fake Certificate",
    /// made at start, is served. It must be in a watched namespace.
    #[arg(long, value_name = "NAMESPACE/NAME", global = true)]
    pub default_ssl_certificate: Option<String>,

    /// Accept `configuration-snippet` and `server-snippet`: raw nginx
    /// directives from Ingress authors. Each is parsed as nginx parses it
    /// and must keep to its own block; directives that load code, read
    /// configuration, change the process or name files outside
    /// `--snippet-allowed-path` are refused. Still, a snippet can do
    /// anything nginx can do inside a server or location: leave this off
    /// unless every Ingress author is trusted.
    #[arg(long, global = true)]
    pub allow_snippet_annotations: bool,

    /// A directory whose files snippets may name (`root`, `alias`,
    /// certificates, password files, logs); repeat for more. Absolute, not
    /// `/`, never under /proc, /sys, /dev or the Pod's credentials. Without
    /// it, a snippet that names a file is refused.
    #[arg(long = "snippet-allowed-path", value_name = "DIR", global = true)]
    pub snippet_allowed_paths: Vec<PathBuf>,

    /// Accept EndpointSlice addresses on loopback and link-local networks
    /// (for a manifest directory whose upstreams run on the same host). By
    /// default they are refused: they would let whoever writes an
    /// EndpointSlice reach services of the node itself. Even with this, no
    /// endpoint may name the API, metrics, HTTP or HTTPS port on the local
    /// host, and an ExternalName of the local host is always refused.
    #[arg(long, global = true)]
    pub allow_local_endpoints: bool,

    /// Honour the `ssl-passthrough` annotation: `stream {}` takes the HTTPS
    /// port, sends passthrough hosts' TLS, by SNI and unterminated, to
    /// their backends, and every other connection to the HTTP servers
    /// (over a Unix socket, with the PROXY protocol so the client's address
    /// survives). Takes `=true`/`=false` too, as ingress-nginx's chart
    /// passes `extraArgs` (`--enable-ssl-passthrough=true`).
    #[arg(long, global = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub enable_ssl_passthrough: bool,

    /// Watch Gateway API objects (GatewayClass, Gateway, HTTPRoute,
    /// ReferenceGrant) in cluster mode; their v1.7.0 CRDs must be
    /// installed. A manifest directory's Gateway objects are always read.
    #[arg(long, global = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub enable_gateway_api: bool,

    /// The `controllerName` of the GatewayClasses this controller serves
    /// (Gateway API): their Gateways get nginx servers, their HTTPRoutes
    /// the module's route table.
    #[arg(long, global = true, default_value = crate::gateway::translate::CONTROLLER_NAME)]
    pub gateway_controller_name: String,

    /// 0: nginx listens on each Gateway listener's own port (one Gateway
    /// per port). N: each Gateway port gets its own nginx port, N, N+1, ...
    /// (oldest Gateway first), for a Service per Gateway to map its ports onto.
    #[arg(long, global = true, default_value_t = 0)]
    pub gateway_base_port: u16,

    /// Labels (`key=value,...`) of the Pods that run this controller (in
    /// `POD_NAMESPACE`): the leader then keeps one Service per Gateway, in
    /// the Gateway's namespace and owned by it, mapping the Gateway's ports
    /// onto its nginx ports, with an EndpointSlice naming those Pods, and
    /// publishes its address as the Gateway's. Needs --gateway-base-port,
    /// so that two Gateways on one port differ.
    #[arg(long, global = true, value_name = "LABELS")]
    pub gateway_service_selector: Option<String>,

    /// Route status writes (Gateway API) in flight at once. A new leader,
    /// or a controller started on thousands of routes, writes them all;
    /// one at a time is one apiserver round trip each.
    #[arg(long, global = true, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub gateway_status_concurrency: u16,

    /// The type of the Gateways' Services: `ClusterIP` (the address is the
    /// cluster IP) or `LoadBalancer` (the address is what the load
    /// balancer assigns).
    #[arg(long, global = true, value_enum, default_value = "LoadBalancer")]
    pub gateway_service_type: crate::gateway::services::ServiceType,

    /// A DNS server nginx asks for names it resolves per request (an
    /// `auth-url` host); repeat for more. Default: the nameservers of
    /// /etc/resolv.conf, as ingress-nginx.
    #[arg(long = "resolver", value_name = "IP", global = true)]
    pub resolvers: Vec<std::net::IpAddr>,

    /// A file holding the module API's bearer token (its first line), for
    /// an nginx whose configuration is managed elsewhere or a token kept in
    /// a Secret. Without it a random token is generated at every start and
    /// written to <conf-dir>/api-token (mode 0600).
    #[arg(long, value_name = "FILE")]
    pub api_token_file: Option<PathBuf>,

    /// The nginx binary.
    #[arg(long, default_value = "nginx")]
    pub nginx_binary: PathBuf,

    /// Path of ngx_http_dynamic_balancer_module.so, for `load_module`
    /// (required to run the controller).
    #[arg(long, value_name = "FILE", env = "DYNBAL_NGINX_MODULE")]
    pub nginx_module: Option<PathBuf>,

    /// Where nginx.conf, TLS files and logs go; also nginx's prefix.
    #[arg(long, default_value = "/etc/nginx", env = "DYNBAL_CONF_DIR", global = true)]
    pub conf_dir: PathBuf,

    /// Drive an nginx someone else runs: its master pid is read from this
    /// file for reloads, and it is never started or stopped here.
    #[arg(long, value_name = "FILE")]
    pub nginx_pid_file: Option<PathBuf>,

    /// Base URL of the module's API (default http://127.0.0.1:<api-port>).
    #[arg(long, value_name = "URL", global = true)]
    pub status_url: Option<String>,

    /// A replacement for the built-in nginx.conf template (minijinja).
    #[arg(long, value_name = "FILE")]
    pub template: Option<PathBuf>,

    /// Address nginx listens on for traffic.
    #[arg(long, default_value = "0.0.0.0")]
    pub listen_address: String,

    /// Port nginx serves plain HTTP on.
    #[arg(long, default_value_t = 80)]
    pub http_port: u16,

    /// Port nginx serves HTTPS on.
    #[arg(long, default_value_t = 443)]
    pub https_port: u16,

    /// Loopback port of the module's /configuration API.
    #[arg(long, default_value_t = 10246, env = "DYNBAL_API_PORT", global = true)]
    pub api_port: u16,

    /// Size of the module's shared zone.
    #[arg(long, default_value = "32m")]
    pub zone_size: String,

    /// Count requests per Ingress path in the module and re-export them in
    /// /metrics under ingress-nginx's names (`nginx_ingress_controller_requests`
    /// and the latency and size histograms).
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub enable_metrics: bool,

    /// Give request metrics a `host` label (the server name of the
    /// location); `false` folds every host of an Ingress path together.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub metrics_per_host: bool,

    /// Write the request metrics' `status` label as its class (`2xx`,
    /// `5xx`) rather than the code (`200`, `503`), as ingress-nginx's flag
    /// of that name does: fewer series, but alerts on one code stop
    /// matching.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub report_status_classes: bool,

    /// Where /metrics, /healthz and /readyz are served.
    #[arg(
        long,
        default_value = "127.0.0.1:10254",
        env = "DYNBAL_METRICS_ADDRESS",
        global = true
    )]
    pub metrics_address: SocketAddr,

    /// Name of the Lease used to elect the replica that writes Ingress
    /// status (in `POD_NAMESPACE`, else the ConfigMap's namespace).
    #[arg(long, default_value = "ingress-controller-leader")]
    pub election_id: String,

    /// How long the leader's Lease holds without renewal; the leader renews
    /// within half of it and every replica looks every quarter of it.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub election_ttl: Duration,

    /// Publish this Service's addresses (LoadBalancer IPs and hostnames,
    /// external IPs) in the status of our Ingresses, as namespace/name.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub publish_service: Option<String>,

    /// Publish these addresses (comma-separated IPs or hostnames) in the
    /// status of our Ingresses; overrides --publish-service.
    #[arg(long, value_name = "ADDRESSES", value_delimiter = ',')]
    pub publish_status_address: Vec<String>,

    /// Empty the status of our Ingresses when the last replica stops.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub update_status_on_shutdown: bool,

    /// After SIGTERM, how long /readyz fails while nginx keeps serving, so
    /// that endpoints and load balancers stop sending new connections
    /// before nginx begins its graceful stop (bounded by
    /// `worker-shutdown-timeout` from the ConfigMap).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub shutdown_grace_period: Duration,

    /// Serve the validating admission webhook on this address (TLS), e.g.
    /// `:8443`, as ingress-nginx's flag of the same name.
    #[arg(long, value_name = "ADDRESS")]
    pub validating_webhook: Option<String>,

    /// PEM certificate of the webhook's TLS server.
    #[arg(long, value_name = "FILE", default_value = "/usr/local/certificates/cert")]
    pub validating_webhook_certificate: PathBuf,

    /// PEM key of the webhook's TLS server.
    #[arg(long, value_name = "FILE", default_value = "/usr/local/certificates/key")]
    pub validating_webhook_key: PathBuf,

    /// How long the webhook may spend on one review (waiting for its turn
    /// and building the model)
    /// before it answers with a denial that says so.
    #[arg(long, default_value = "8s", value_parser = parse_duration)]
    pub validating_webhook_timeout: Duration,

    /// Output of the inspection subcommands.
    #[arg(long, value_enum, default_value = "table", global = true)]
    pub output: Output,

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

    /// nginx's error log: a file, or `stderr` (nginx writes to the standard
    /// error it inherits from the controller: the container's log).
    /// Default `<conf-dir>/logs/error.log`.
    #[arg(long, value_name = "FILE|stderr")]
    pub nginx_error_log: Option<String>,

    /// nginx's access log (when the ConfigMap enables it): a file, or
    /// `/dev/stdout` in a container. Default `<conf-dir>/logs/access.log`.
    #[arg(long, value_name = "FILE")]
    pub nginx_access_log: Option<String>,

    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// Inspection commands: they read a running controller's state through
/// its local endpoints (`kubectl exec POD -- ingress-controller backends`).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The backends in the module's shared zone.
    Backends {
        /// Only this backend.
        #[arg(long)]
        name: Option<String>,
    },
    /// The TLS certificates nginx serves: hosts, subject, SANs, expiry and
    /// SHA-256 fingerprint (never the keys).
    Certs,
    /// The running nginx.conf, or one host's server block.
    Conf {
        #[arg(long)]
        host: Option<String>,
    },
    /// Readiness, workers, configuration generation and reload counts.
    Status,
    /// The migration report: for the manifests (`--manifests DIR`) or the
    /// cluster, which annotations and ConfigMap keys are honoured, ignored
    /// or invalid, and what else would be refused. Exit code 1 if anything
    /// would be dropped.
    Check,
    /// One-shot jobs that create the webhook's certificate Secret and patch
    /// the caBundle of its ValidatingWebhookConfiguration (what
    /// ingress-nginx's kube-webhook-certgen image does).
    #[command(subcommand)]
    Certgen(Certgen),
    /// Prints a reference page of the documentation book, generated from
    /// this binary: `annotations`, `configmap`, `flags` or `metrics`.
    Reference {
        #[arg(value_parser = crate::reference::PAGES)]
        page: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum Certgen {
    /// Creates the Secret (ca, cert, key) unless it exists.
    Create {
        #[arg(long)]
        namespace: String,
        #[arg(long)]
        secret_name: String,
        /// DNS names of the webhook Service, comma-separated.
        #[arg(long, value_delimiter = ',')]
        host: Vec<String>,
    },
    /// Sets the caBundle of a ValidatingWebhookConfiguration from the Secret.
    Patch {
        #[arg(long)]
        namespace: String,
        #[arg(long)]
        secret_name: String,
        #[arg(long)]
        webhook_name: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Go-style durations as ingress-nginx's flags take them (`30s`, `1m`,
/// `500ms`), or plain seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration (30s, 1m, 500ms): {e}"))
}

impl Args {
    pub fn configmap_ref(&self) -> anyhow::Result<(String, String)> {
        split_ref(&self.configmap, "--configmap")
    }

    /// `--configmap` with the layer-4 ConfigMaps.
    pub fn configmap_refs(&self) -> anyhow::Result<crate::snapshot::ConfigMapRefs> {
        let optional = |v: &Option<String>, flag| v.as_deref().map(|s| split_ref(s, flag)).transpose();
        Ok(crate::snapshot::ConfigMapRefs {
            config_map: self.configmap_ref()?,
            tcp_services: optional(&self.tcp_services_configmap, "--tcp-services-configmap")?,
            udp_services: optional(&self.udp_services_configmap, "--udp-services-configmap")?,
        })
    }

    /// A client for `--kubeconfig`, else the usual inference ($KUBECONFIG,
    /// ~/.kube/config, in-cluster).
    pub async fn kube_client(&self) -> anyhow::Result<kube::Client> {
        use anyhow::Context as _;
        let config = match &self.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)?;
                kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
            }
            None => kube::Config::infer()
                .await
                .context("finding a cluster (use --manifests DIR without one)")?,
        };
        Ok(kube::Client::try_from(config)?)
    }

    /// The migration report `check` prints: for `--manifests DIR`, or the
    /// cluster through `--kubeconfig` (else the usual inference).
    pub async fn check_report(&self) -> anyhow::Result<crate::check::CheckReport> {
        match &self.manifests {
            Some(dir) => {
                let (snap, problems) =
                    crate::source::manifests::ManifestDir::new(dir.clone(), self.configmap_refs()?).read();
                let mut report = crate::check::check(&snap, &self.build_options()?);
                report.add_source_problems(problems);
                Ok(report)
            }
            None => self.check_cluster(self.kube_client().await?).await,
        }
    }

    /// The migration report for the cluster `client` reaches, read as a
    /// controller with these flags would read it (one list of each kind).
    pub async fn check_cluster(&self, client: kube::Client) -> anyhow::Result<crate::check::CheckReport> {
        use crate::source::cluster;
        let refs = self.configmap_refs()?;
        let opts = cluster::ClusterOptions {
            namespace: self.watch_namespace.clone(),
            config_map: refs.config_map,
            tcp_services: refs.tcp_services,
            udp_services: refs.udp_services,
            gateway_api: self.enable_gateway_api,
        };
        let snap = cluster::list_once(client, &opts).await?;
        Ok(crate::check::check(&snap, &self.build_options()?))
    }

    /// What the model builder is told, from the flags (the controller and
    /// `check` build the same model).
    pub fn build_options(&self) -> anyhow::Result<BuildOptions> {
        Ok(BuildOptions {
            class: ClassFilter {
                class: self.ingress_class.clone(),
                controller: self.controller_class.clone(),
                without_class: self.watch_ingress_without_class,
            },
            allow_snippets: self.allow_snippet_annotations,
            snippet_policy: crate::model::snippet::Policy::new(self.snippet_allowed_paths.clone())
                .map_err(anyhow::Error::msg)?,
            default_backend_service: self
                .default_backend_service
                .as_deref()
                .map(|s| split_ref(s, "--default-backend-service"))
                .transpose()?,
            default_ssl_certificate: self
                .default_ssl_certificate
                .as_deref()
                .map(|s| split_ref(s, "--default-ssl-certificate"))
                .transpose()?,
            namespace: self.watch_namespace.clone(),
            listen: Listen {
                address: self.listen_address.clone(),
                http_port: self.http_port,
                https_port: self.https_port,
                api_port: self.api_port,
            },
            resolvers: if self.resolvers.is_empty() {
                crate::resolv_conf::system()
            } else {
                self.resolvers.clone()
            },
            endpoints: AddressPolicy {
                allow_local: self.allow_local_endpoints,
                reserved_ports: vec![
                    self.api_port,
                    self.metrics_address.port(),
                    self.http_port,
                    self.https_port,
                ],
            },
            stream_reserved: ReservedPorts {
                http: self.http_port,
                https: self.https_port,
                api: self.api_port,
                metrics: self.metrics_address.port(),
                webhook: self
                    .validating_webhook
                    .as_deref()
                    .and_then(|a| a.rsplit_once(':'))
                    .and_then(|(_, port)| port.parse().ok()),
            },
            ssl_passthrough: self.enable_ssl_passthrough,
            gateway_controller_name: self.gateway_controller_name.clone(),
            gateway_base_port: self.gateway_base_port,
        })
    }
}

/// Parses `namespace/name`.
pub fn split_ref(s: &str, flag: &str) -> anyhow::Result<(String, String)> {
    match s.split_once('/') {
        Some((ns, name)) if crate::model::values::is_object_name(ns) && crate::model::values::is_object_name(name) => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => anyhow::bail!("{flag} must be namespace/name, got {s:?}"),
    }
}

/// Flags read from another controller's command line (a running Pod's
/// `args`, ingress-nginx's included): parsed as this controller would
/// parse them, with what it does not know left out and reported.
pub struct ForeignFlags {
    pub args: Args,
    /// Each argument left out, with why.
    pub ignored: Vec<String>,
}

/// Parses `argv` (no program name) keeping only the flags `Args` knows:
/// ingress-nginx's Deployments pass many this controller has no use for
/// (`--enable-metrics`, `--v`), and the program itself as the first
/// argument. A known flag whose value does not parse is left out too,
/// with clap's message, rather than failing the whole line.
pub fn parse_foreign(argv: &[String]) -> ForeignFlags {
    use clap::CommandFactory as _;
    let mut command = Args::command();
    command.build();
    let arg = |long: &str| command.get_arguments().find(|a| a.get_long() == Some(long)).cloned();
    let takes_value = |long: &str| {
        arg(long).map(|a| a.get_action().takes_values() && a.get_num_args().is_none_or(|n| n.min_values() > 0))
    };
    let repeatable =
        |long: &str| arg(long).is_some_and(|a| matches!(a.get_action(), ArgAction::Append | ArgAction::Count));
    let mut kept = Vec::new();
    let mut ignored = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        let arg = &argv[i];
        i += 1;
        let Some(flag) = arg.strip_prefix("--") else {
            ignored.push(format!("{arg}: not a flag"));
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (flag, None),
        };
        // A following word is this flag's value when it is not a flag.
        let next_is_value = inline.is_none() && argv.get(i).is_some_and(|n| !n.starts_with('-'));
        match takes_value(name) {
            Some(true) if next_is_value => {
                kept.push(vec![arg.clone(), argv[i].clone()]);
                i += 1;
            }
            Some(_) => kept.push(vec![arg.clone()]),
            None => {
                if next_is_value {
                    i += 1;
                }
                ignored.push(format!("--{name}: not a flag of this controller"));
            }
        }
    }
    // A later occurrence of a single-valued flag replaces an earlier one
    // (the user's flags come after the Pod's); clap would refuse both.
    let name_of = |group: &[String]| {
        group[0]
            .trim_start_matches("--")
            .split('=')
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let mut i = 0;
    while i < kept.len() {
        let name = name_of(&kept[i]);
        if !repeatable(&name) && kept[i + 1..].iter().any(|g| name_of(g) == name) {
            let replaced = kept.remove(i);
            ignored.push(format!("{}: given again later", replaced.join(" ")));
        } else {
            i += 1;
        }
    }
    loop {
        let line = std::iter::once("ingress-controller".to_string()).chain(kept.iter().flatten().cloned());
        match Args::try_parse_from(line) {
            Ok(args) => return ForeignFlags { args, ignored },
            Err(e) => {
                // Leave out the flag clap names (else the last one) and try again.
                let message = e.to_string();
                // Nothing left to blame would mean the defaults alone do
                // not parse, which the flags' own tests rule out.
                assert!(!kept.is_empty(), "the controller's defaults do not parse: {message}");
                let at = kept
                    .iter()
                    .rposition(|a| {
                        let name = a[0].split('=').next().unwrap_or_default();
                        message.contains(&format!("'{name}")) || message.contains(&format!("{name} "))
                    })
                    .unwrap_or(kept.len() - 1);
                let dropped = kept.remove(at);
                let first = message
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ")
                    .to_string();
                ignored.push(format!("{}: {first}", dropped.join(" ")));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ingress_nginx_controller_args_keep_what_applies() {
        // A Deployment of ingress-nginx's chart (v4.x), namespace substituted.
        let f = parse_foreign(&argv(&[
            "/nginx-ingress-controller",
            "--publish-service=ingress-nginx/ingress-nginx-controller",
            "--election-id=ingress-nginx-leader",
            "--controller-class=k8s.io/ingress-nginx",
            "--ingress-class=nginx",
            "--configmap=ingress-nginx/ingress-nginx-controller",
            "--validating-webhook=:8443",
            "--validating-webhook-certificate=/usr/local/certificates/cert",
            "--validating-webhook-key=/usr/local/certificates/key",
            "--enable-metrics=false",
            "--enable-topology-aware-routing=true",
            "--watch-ingress-without-class=true",
            "--v",
            "2",
        ]));
        assert_eq!(f.args.configmap, "ingress-nginx/ingress-nginx-controller");
        assert_eq!(f.args.ingress_class, "nginx");
        assert!(f.args.watch_ingress_without_class);
        assert!(
            f.ignored.iter().any(|i| i.starts_with("/nginx-ingress-controller")),
            "{:?}",
            f.ignored
        );
        assert!(!f.args.enable_metrics);
        assert!(
            f.ignored
                .iter()
                .any(|i| i.starts_with("--enable-topology-aware-routing")),
            "{:?}",
            f.ignored
        );
        assert!(f.ignored.iter().any(|i| i.starts_with("--v")), "{:?}", f.ignored);
        assert_eq!(f.ignored.len(), 3, "{:?}", f.ignored);
    }

    #[test]
    fn a_value_that_does_not_parse_leaves_out_that_flag_only() {
        let f = parse_foreign(&argv(&[
            "--ingress-class",
            "internal",
            "--http-port=eighty",
            "--configmap=infra/proxy",
        ]));
        assert_eq!(f.args.ingress_class, "internal");
        assert_eq!(f.args.configmap, "infra/proxy");
        assert_eq!(f.args.http_port, 80);
        assert_eq!(f.ignored.len(), 1, "{:?}", f.ignored);
        assert!(f.ignored[0].starts_with("--http-port=eighty"), "{:?}", f.ignored);
    }

    #[test]
    fn a_later_flag_replaces_an_earlier_one_and_repeatable_ones_add_up() {
        let f = parse_foreign(&argv(&[
            "--ingress-class=nginx",
            "--resolver=10.0.0.10",
            "--ingress-class=internal",
            "--resolver",
            "10.0.0.11",
        ]));
        assert_eq!(f.args.ingress_class, "internal");
        assert_eq!(f.args.resolvers.len(), 2, "{:?}", f.args.resolvers);
        assert_eq!(f.ignored, ["--ingress-class=nginx: given again later"]);
    }

    #[test]
    fn a_subcommand_word_is_not_taken_for_one() {
        let f = parse_foreign(&argv(&["check", "--ingress-class=a"]));
        assert!(f.args.command.is_none());
        assert_eq!(f.args.ingress_class, "a");
    }
}
