//! Request metrics as ingress-nginx names them, counted by the module in
//! its log phase instead of `monitor.lua`'s JSON-per-request socket.
//!
//! - [`labels`]: the labels a location declares (`namespace`, `ingress`,
//!   `service`, `host`, `path`), parsed from `dynamic_balancer_metrics` and
//!   rendered once as Prometheus label text;
//! - [`dimension`]: the per-request dimensions with a bounded set of values
//!   (method, status), so a client cannot grow the series count;
//! - [`counters`]: one cell of counters (seven histograms and a counter),
//!   atomics laid out for shared memory, and its plain snapshot;
//! - [`exposition`]: the Prometheus text of summed cells.
//!
//! Cardinality: one series per (location labels, canary, method, status).
//! Methods are nginx's 16 known ones plus `OTHER`; statuses are the codes
//! 100 to 599, as ingress-nginx's `status` label has them, with any other
//! code (a backend can answer up to 999) folded into `000`. The scrape can
//! ask for classes instead (`2xx`; ingress-nginx's
//! `--report-status-classes`).

pub mod counters;
pub mod dimension;
pub mod exposition;
pub mod labels;

pub use counters::{Counters, CountersSnapshot, Sample};
pub use dimension::{method_index, status_class, status_index, StatusLabel, METHODS, STATUS_CLASSES};
pub use labels::{LabelError, LocationLabels};
