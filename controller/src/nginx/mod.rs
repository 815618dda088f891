//! nginx itself: the master process and the module's HTTP API.

mod api;
mod process;

pub use api::{ApiClient, PushError, Status, WorkerStatus};
pub use process::{Mode, Nginx};
