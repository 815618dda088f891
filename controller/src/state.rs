//! What the sync loop's tasks share: the settings from the command line,
//! the handles every task uses (nginx, the module's API, metrics, Events),
//! and what the running nginx was last loaded with. The HTTP endpoints
//! (`/metrics`, `/healthz`, `/readyz`) read [`Shared`] too.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use crate::events::Events;
use crate::metrics::Metrics;
use crate::model::BuildOptions;
use crate::nginx::{ApiClient, Nginx};
use crate::render::RenderContext;

pub struct Settings {
    pub build: BuildOptions,
    pub render: RenderContext,
    pub conf_dir: PathBuf,
    pub ssl_dir: PathBuf,
    /// Where candidates wait for `nginx -t` ([`crate::staging`]).
    pub staging_dir: PathBuf,
    /// Where the files a configuration names may be ([`crate::file_check`]).
    pub file_roots: crate::file_check::FileRoots,
    /// How long a structural change waits for more changes before rendering.
    pub settle: Duration,
    /// How long new workers may take to report after a reload.
    pub reload_timeout: Duration,
}

/// State shared with the HTTP endpoints.
pub struct Shared {
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    pub nginx: Arc<Nginx>,
    pub api: ApiClient,
    /// Set at shutdown: /readyz fails and the supervisor stops restarting
    /// nginx.
    pub stopping: AtomicBool,
    /// `worker-shutdown-timeout` of the running configuration, in seconds:
    /// how long a graceful stop may take.
    pub worker_shutdown_timeout: AtomicU64,
    /// Kubernetes Events, in cluster mode.
    pub events: Option<Events>,
    /// The module's request metrics are re-exported in `/metrics`
    /// (`--enable-metrics`), with these constant labels.
    pub module_metrics: Option<crate::metrics_relay::ConstLabels>,
    /// `--report-status-classes`: the module writes `status` as `2xx`.
    pub report_status_classes: bool,
}

/// What the running nginx was last loaded with.
#[derive(Clone, Default)]
pub struct Running {
    /// Bumped on every (re)load and master restart; 0 = nginx not up yet.
    pub epoch: u64,
    /// Backends referenced by the running nginx.conf.
    pub referenced: BTreeSet<String>,
}
