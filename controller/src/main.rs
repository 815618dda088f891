//! `ingress-controller`: see the crate docs and the book (`docs/`).

mod inspect_cmd;
mod status_server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use controller::events::Events;
use controller::metrics::Metrics;
use controller::metrics_relay::ConstLabels;
use controller::nginx::{reaper, ApiClient, Mode, Nginx};
use controller::render::{RenderContext, Renderer};
use controller::snapshot::Snapshot;
use controller::source::{cluster, manifests};
use controller::state::{Settings, Shared};
use controller::sync;
use controller::{admission, ingress_status, leader};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use controller::cli::{self, Args, LogFormat};

/// See `controller::memory`: with it, RSS at 10,000 Ingresses fell from
/// 273 MB to 175 MB before any other change.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    controller::memory::configure();
    let mut args = Args::parse();
    if let Some(cli::Command::Reference { page }) = &args.command {
        print!("{}", reference_page(page));
        return std::process::ExitCode::SUCCESS;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => fmt.json().init(),
        LogFormat::Text => fmt.init(),
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = match args.command.take() {
        Some(command) => rt.block_on(inspect_cmd::run(command, &args)),
        None => rt.block_on(run(args)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A page of the book's reference, generated from this binary's code.
fn reference_page(page: &str) -> String {
    use controller::reference;
    match page {
        "annotations" => reference::annotations(),
        "configmap" => reference::config_map(),
        "flags" => reference::flags(&<Args as clap::CommandFactory>::command()),
        _ => reference::metrics(),
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let conf_dir = std::path::absolute(&args.conf_dir)?;
    controller::nginx::check_socket_dir(&conf_dir).map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(conf_dir.join("logs")).with_context(|| format!("creating {}", conf_dir.display()))?;
    let ssl_dir = conf_dir.join("ssl");
    let default_certificate = controller::default_certificate::ensure(&ssl_dir)?;
    let Some(module) = args.nginx_module.as_deref() else {
        anyhow::bail!("--nginx-module FILE is required to run the controller");
    };
    let module = std::path::absolute(module)?;
    if !module.exists() {
        anyhow::bail!("--nginx-module {} does not exist", module.display());
    }
    let renderer = Renderer::new(args.template.as_deref())?;
    let config_map = args.configmap_refs()?;

    let mode = match &args.nginx_pid_file {
        Some(pid_file) => Mode::External {
            pid_file: pid_file.clone(),
        },
        None => Mode::Supervised,
    };
    let supervised = matches!(mode, Mode::Supervised);
    let pid_file = args
        .nginx_pid_file
        .clone()
        .unwrap_or_else(|| conf_dir.join("logs/nginx.pid"));
    let nginx = Arc::new(Nginx::new(
        args.nginx_binary.clone(),
        conf_dir.clone(),
        conf_dir.join("nginx.conf"),
        mode,
    ));
    let status_url = args
        .status_url
        .clone()
        .unwrap_or_else(|| format!("http://127.0.0.1:{}", args.api_port));
    let (api_token, api_token_file) = match &args.api_token_file {
        Some(file) => (controller::token::read(file)?, std::path::absolute(file)?),
        None => {
            let file = conf_dir.join("api-token");
            (controller::token::generate(&file)?, file)
        }
    };
    let kube_client = match &args.manifests {
        Some(_) => None,
        None => Some(args.kube_client().await?),
    };
    let client = kube_client.clone();
    let config_map_ns = config_map.config_map.0.clone();
    if !controller::model::values::is_object_name(&args.election_id) {
        anyhow::bail!("--election-id {:?} is not a Kubernetes object name", args.election_id);
    }
    // client-go's floor: a shorter lease makes every replica poll the
    // apiserver in a tight loop (ttl/4) and leaders flap on any hiccup.
    if args.election_ttl < Duration::from_secs(2) {
        anyhow::bail!("--election-ttl must be at least 2s, got {:?}", args.election_ttl);
    }
    let gateway_services = match &args.gateway_service_selector {
        Some(text) => {
            let selector = controller::gateway::services::parse_selector(text)
                .map_err(|e| anyhow::anyhow!("--gateway-service-selector: {e}"))?;
            if args.gateway_base_port == 0 {
                anyhow::bail!(
                    "--gateway-service-selector needs --gateway-base-port: two Gateways on one port must reach nginx on two ports"
                );
            }
            Some(controller::gateway::services::ServiceOptions {
                namespace: std::env::var("POD_NAMESPACE").unwrap_or_else(|_| config_map_ns.clone()),
                watch_namespace: args.watch_namespace.clone(),
                selector,
                type_: args.gateway_service_type,
                controller_name: args.gateway_controller_name.clone(),
            })
        }
        None => None,
    };
    let publish = if !args.publish_status_address.is_empty() {
        for a in &args.publish_status_address {
            if !controller::model::values::is_status_address(a) {
                anyhow::bail!("--publish-status-address: {a:?} is neither an IP address nor a DNS name");
            }
        }
        Some(ingress_status::Publish::Addresses(args.publish_status_address.clone()))
    } else {
        args.publish_service
            .as_deref()
            .map(|s| cli::split_ref(s, "--publish-service"))
            .transpose()?
            .map(|(namespace, name)| ingress_status::Publish::Service { namespace, name })
    };
    let identity = controller::metrics::Identity::from_env(&args.controller_class);
    let shared = Arc::new(Shared {
        events: client.clone().map(Events::new),
        metrics: Arc::new(Metrics::new(identity.clone())),
        ready: AtomicBool::new(false),
        nginx: nginx.clone(),
        api: ApiClient::new(&status_url, Some(api_token)),
        stopping: AtomicBool::new(false),
        worker_shutdown_timeout: AtomicU64::new(240),
        module_metrics: args.enable_metrics.then(|| ConstLabels::of(&identity)),
        report_status_classes: args.report_status_classes,
    });
    tokio::spawn(reaper::run_if_init());

    let display = |p: &std::path::Path| p.display().to_string();
    let build = args.build_options()?;
    let error_log = args
        .nginx_error_log
        .clone()
        .unwrap_or_else(|| display(&conf_dir.join("logs/error.log")));
    let access_log = args
        .nginx_access_log
        .clone()
        .unwrap_or_else(|| display(&conf_dir.join("logs/access.log")));
    // Paths the operator gave on the command line are nginx's to write,
    // certificates and snippet directories its to read.
    let operator_writes: Vec<std::path::PathBuf> = [&error_log, &access_log]
        .into_iter()
        .map(std::path::PathBuf::from)
        .chain([pid_file.clone()])
        .chain(build.snippet_policy.allowed_paths.iter().cloned())
        .collect();
    let operator_reads: Vec<std::path::PathBuf> = [default_certificate.clone(), api_token_file.clone()]
        .into_iter()
        .chain(build.snippet_policy.allowed_paths.iter().cloned())
        .collect();
    let settings = Settings {
        file_roots: controller::file_check::FileRoots::new(&conf_dir, &module, &operator_reads, &operator_writes),
        staging_dir: controller::staging::prepare(&conf_dir)?,
        build,
        render: RenderContext {
            module_path: display(&module),
            pid_file: display(&pid_file),
            error_log,
            error_log_level: args.error_log_level.clone(),
            access_log,
            zone_size: args.zone_size.clone(),
            metrics: args.enable_metrics,
            metrics_per_host: args.metrics_per_host,
            cpus: online_cpus(),
            https_socket: display(&conf_dir.join(controller::nginx::HTTPS_SOCKET)),
            socket_dir: display(&conf_dir),
            auth_dir: display(&conf_dir.join("auth")),
            default_certificate: display(&default_certificate),
            supervised,
            api_token_file: Some(display(&api_token_file)),
        },
        conf_dir: conf_dir.clone(),
        ssl_dir,
        settle: Duration::from_millis(args.reload_settle_ms),
        reload_timeout: Duration::from_secs(args.reload_timeout_s),
    };
    if args.allow_local_endpoints {
        tracing::warn!(
            "--allow-local-endpoints: EndpointSlice addresses on loopback and link-local networks are accepted"
        );
    }
    if args.allow_snippet_annotations {
        tracing::warn!(
            allowed_paths = ?args.snippet_allowed_paths,
            "--allow-snippet-annotations: Ingress authors may add nginx directives to their servers and locations (judged by the snippet policy)"
        );
    }

    let listener = tokio::net::TcpListener::bind(args.metrics_address)
        .await
        .with_context(|| format!("binding {}", args.metrics_address))?;
    tracing::info!("metrics, /healthz and /readyz on http://{}", args.metrics_address);
    let router = status_server::router(shared.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!("metrics server: {e}");
        }
    });

    let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
    let source = match (&args.manifests, client) {
        (Some(dir), _) => {
            let dir = manifests::ManifestDir::new(dir.clone(), config_map);
            // A short settle: a changed file is parsed alone, and structural
            // changes are coalesced again by --reload-settle-ms.
            manifests::spawn(dir, tx, Duration::from_millis(2))
        }
        (None, client) => {
            let opts = cluster::ClusterOptions {
                namespace: args.watch_namespace.clone(),
                config_map: config_map.config_map,
                tcp_services: config_map.tcp_services,
                udp_services: config_map.udp_services,
                gateway_api: args.enable_gateway_api,
            };
            cluster::spawn(client.expect("a client in cluster mode"), opts, tx)
        }
    };
    // The first snapshot is the default one; the model task waits for a
    // real one only when the source has not published yet.
    let mut rx_first = rx.clone();
    let _ = rx_first.changed().await;

    if let Some(addr) = &args.validating_webhook {
        let validator = admission::Validator::new(
            settings.build.clone(),
            rx.clone(),
            args.validating_webhook_timeout,
            shared.metrics.clone(),
        );
        let tls = admission::server::tls_config(&args.validating_webhook_certificate, &args.validating_webhook_key)?;
        let addr = if addr.starts_with(':') {
            format!("0.0.0.0{addr}")
        } else {
            addr.clone()
        };
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding the webhook on {addr}"))?;
        tracing::info!("validating admission webhook on https://{addr}");
        let router = admission::server::router(Arc::new(validator));
        tokio::spawn(admission::server::serve(listener, tls, router));
    }

    // Leader election and Ingress status, in cluster mode.
    let (leading_tx, leading_rx) = watch::channel(false);
    let election = match &kube_client {
        Some(client) => {
            let namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| config_map_ns.clone());
            let identity = std::env::var("POD_NAME").unwrap_or_else(|_| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                format!("{}-{}", host.trim(), std::process::id())
            });
            let cfg = leader::LeaseConfig::from_ttl(namespace, args.election_id.clone(), identity, args.election_ttl);
            let elector = leader::spawn(client.clone(), cfg.clone(), leading_tx);
            // `leader_election_status`, and the certificate expiry series
            // only the leader exports.
            shared.metrics.set_leading(&args.election_id, false);
            let (metrics, name, mut leading) = (shared.metrics.clone(), args.election_id.clone(), leading_rx.clone());
            tokio::spawn(async move {
                while leading.changed().await.is_ok() {
                    let now = *leading.borrow_and_update();
                    metrics.set_leading(&name, now);
                }
            });
            let status_opts = ingress_status::StatusOptions {
                publish: publish.clone(),
                class: settings.build.class.clone(),
                period: Duration::from_secs(60),
            };
            let status_task =
                ingress_status::spawn(client.clone(), status_opts.clone(), rx.clone(), leading_rx.clone());
            let mut tasks = vec![elector, status_task];
            if args.enable_gateway_api {
                let opts = controller::gateway_status::GatewayStatusOptions {
                    controller_name: args.gateway_controller_name.clone(),
                    base_port: args.gateway_base_port,
                    reserved: settings.build.stream_reserved.clone(),
                    addresses: args.publish_status_address.clone(),
                    services: gateway_services.clone(),
                    period: Duration::from_secs(60),
                    writes_in_flight: usize::from(args.gateway_status_concurrency),
                };
                tasks.push(controller::gateway_status::spawn(
                    client.clone(),
                    opts,
                    rx.clone(),
                    leading_rx.clone(),
                ));
            }
            Some(Election {
                client: client.clone(),
                lease: cfg,
                status: status_opts,
                tasks,
            })
        }
        None => None,
    };

    let snapshots = rx.clone();
    let sync_task = sync::spawn(settings, renderer, shared.clone(), rx);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut source = source;
    let stop = tokio::select! {
        biased;
        _ = term.recv() => Stop::Signal("SIGTERM"),
        _ = int.recv() => Stop::Signal("SIGINT"),
        r = &mut source => Stop::source(r),
        r = sync_task => {
            // A source that fails (RBAC refusing a ConfigMap, say) drops
            // its sender, which ends the sync loop too; the two tasks end
            // on different threads, so the sync loop's end can be seen
            // first. The source's error is the reason the operator needs.
            match tokio::time::timeout(Duration::from_secs(2), &mut source).await {
                Ok(s) => Stop::source(s),
                Err(_) => Stop::Failed(format!("the sync loop stopped: {r:?}")),
            }
        }
    };
    let reason = stop.to_string();
    shutdown(&args, &reason, &shared, election, leading_rx, snapshots).await;
    match stop {
        // The exit status tells the kubelet (and CrashLoopBackOff's
        // message) that this was a failure, not a rolling update.
        Stop::Failed(reason) => Err(anyhow::anyhow!(reason)),
        Stop::Signal(_) => Ok(()),
    }
}

/// Why the controller stops.
enum Stop {
    /// A signal: a graceful stop, exit status 0.
    Signal(&'static str),
    /// A task ended on its own: graceful too, but exit status 1.
    Failed(String),
}

impl Stop {
    fn source(r: Result<anyhow::Result<()>, tokio::task::JoinError>) -> Self {
        Self::Failed(match r {
            Ok(Ok(())) => "the source stopped".to_string(),
            Ok(Err(e)) => format!("the source stopped: {e:#}"),
            Err(e) => format!("the source task failed: {e}"),
        })
    }
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Signal(s) => f.write_str(s),
            Self::Failed(reason) => f.write_str(reason),
        }
    }
}

/// Leader election and the status task, in cluster mode.
struct Election {
    client: kube::Client,
    lease: leader::LeaseConfig,
    status: ingress_status::StatusOptions,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The graceful stop, in the order a rolling update needs: /readyz fails
/// at once (endpoints and load balancers stop sending new connections)
/// while nginx keeps serving for `--shutdown-grace-period`; then the leader
/// clears status if it is the last replica and hands its Lease over; then
/// nginx quits gracefully (SIGQUIT: it stops accepting, finishes requests in
/// flight within `worker-shutdown-timeout`, and exits).
async fn shutdown(
    args: &Args,
    reason: &str,
    shared: &Shared,
    election: Option<Election>,
    leading: watch::Receiver<bool>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
) {
    tracing::info!(
        grace_s = args.shutdown_grace_period.as_secs_f64(),
        "{reason}; /readyz now fails, nginx keeps serving through the grace period"
    );
    shared.stopping.store(true, Ordering::Release);
    tokio::time::sleep(args.shutdown_grace_period).await;
    if let Some(e) = election {
        // Neither may act after this point: the status task would publish
        // again what is cleared, the elector take back the Lease.
        for task in &e.tasks {
            task.abort();
        }
        if *leading.borrow() {
            if args.update_status_on_shutdown && e.status.publish.is_some() {
                let snap = snapshots.borrow().clone();
                ingress_status::clear_on_shutdown(&e.client, &e.status, &snap).await;
            }
            let api = kube::Api::namespaced(e.client, &e.lease.namespace);
            leader::release(&api, &e.lease).await;
        }
    }
    let timeout = Duration::from_secs(shared.worker_shutdown_timeout.load(Ordering::Acquire)) + Duration::from_secs(5);
    tracing::info!(timeout_s = timeout.as_secs(), "stopping nginx gracefully");
    shared.nginx.stop(timeout).await;
}

/// The CPUs `worker_processes auto` counts: nginx asks for the online ones
/// (`_SC_NPROCESSORS_ONLN`), whatever a cgroup quota allows.
fn online_cpus() -> usize {
    // SAFETY: sysconf only reads a system value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
}
