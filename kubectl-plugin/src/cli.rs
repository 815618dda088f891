//! The plugin's command line: ingress-nginx's plugin's subcommands and
//! flags (`kubectl ingress-nginx backends -n ingress-nginx`), with the
//! migration `check` added.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// The chart's labels on the controller's Pods.
pub const OUR_SELECTOR: &str = "app.kubernetes.io/name=dynamic-balancer,app.kubernetes.io/component=controller";
/// ingress-nginx's chart's labels on its controller's Pods: `check` reads
/// that controller's flags when ours is not installed yet.
pub const INGRESS_NGINX_SELECTOR: &str = "app.kubernetes.io/name=ingress-nginx,app.kubernetes.io/component=controller";

#[derive(Debug, Parser)]
#[command(
    name = "kubectl dynamic-balancer",
    bin_name = "kubectl dynamic-balancer",
    version,
    about = "Inspect dynamic-balancer's controller Pods and check a cluster for migration from ingress-nginx",
    long_about = "Inspect dynamic-balancer's controller Pods and check a cluster for migration from \
ingress-nginx. The controller Pods are found through the kubeconfig (by the chart's labels, \
in every namespace unless -n is given); inspection runs the controller's own binary in its \
container through the apiserver (exec), so the image needs no shell."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    #[command(flatten)]
    pub target: Target,

    /// Output format.
    #[arg(short, long, value_enum, default_value = "table", global = true)]
    pub output: Output,
}

/// Which cluster, and which controller Pod in it.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config,
    /// then the in-cluster service account).
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context (default: its current context).
    #[arg(long, value_name = "NAME", global = true)]
    pub context: Option<String>,

    /// The controller's namespace (default: wherever Pods with the
    /// selector's labels are, if in one namespace only).
    #[arg(short, long, value_name = "NAMESPACE", global = true)]
    pub namespace: Option<String>,

    /// This controller Pod (default: the first Ready one, by name).
    #[arg(long, value_name = "NAME", global = true)]
    pub pod: Option<String>,

    /// The Pods of this Deployment (its selector), in --namespace.
    #[arg(long, value_name = "NAME", global = true)]
    pub deployment: Option<String>,

    /// The label selector of the controller's Pods.
    #[arg(short = 'l', long, value_name = "LABELS", global = true, default_value = OUR_SELECTOR)]
    pub selector: String,

    /// The controller's container in the Pod.
    #[arg(long, value_name = "NAME", global = true, default_value = "controller")]
    pub container: String,

    /// How long any one call to the apiserver (an exec included) may take.
    #[arg(long, value_name = "DURATION", global = true, default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The backends in the module's shared zone (from one controller Pod).
    Backends {
        /// Only this backend (namespace-service-port).
        #[arg(long)]
        backend: Option<String>,
        /// Only the backends' names.
        #[arg(long, conflicts_with = "backend")]
        list: bool,
    },
    /// The TLS certificates the controller serves: hosts, subject, SANs,
    /// expiry and fingerprint (never a key).
    Certs {
        /// Only the certificates that serve this host.
        #[arg(long)]
        host: Option<String>,
    },
    /// The running nginx.conf, or one host's server block.
    Conf {
        #[arg(long)]
        host: Option<String>,
    },
    /// Every controller Pod's state: readiness, configuration generation,
    /// workers, reloads and their errors.
    General,
    /// The controller's Services: type, cluster IP, load-balancer
    /// addresses and ports.
    Info,
    /// The Ingresses, one row per host and path: addresses, TLS, Service,
    /// port and its ready endpoints.
    Ingresses {
        /// In every namespace (else --namespace, else the context's).
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// The migration report for the cluster (exit code 1 if switching
    /// would drop anything).
    ///
    /// Which annotations and ConfigMap keys are honoured, ignored or
    /// invalid, and what else would be refused. The cluster is read with
    /// the flags of the running controller (ours, else ingress-nginx's),
    /// overridden by any controller flags after `--`.
    #[command(visible_alias = "lint")]
    Check {
        /// Controller flags (`-- --ingress-class=internal`).
        #[arg(last = true, value_name = "FLAG")]
        flags: Vec<String>,
    },
    /// The controller's log (one Pod's).
    Logs {
        /// Stream new lines until interrupted.
        #[arg(short, long)]
        follow: bool,
        /// Only the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<i64>,
        /// Only lines newer than this (5m, 1h).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        since: Option<Duration>,
        /// Each line with its timestamp.
        #[arg(long)]
        timestamps: bool,
        /// The previous (crashed) container's log.
        #[arg(short, long)]
        previous: bool,
    },
    /// Runs a command in the controller's container; its exit code is
    /// this command's.
    ///
    /// There is no shell in the image: `-- nginx -T`, `-- ingress-controller
    /// status`.
    Exec {
        /// Pass this terminal's standard input to the command.
        #[arg(short = 'i', long)]
        stdin: bool,
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration (30s, 5m, 1h): {e}"))
}
