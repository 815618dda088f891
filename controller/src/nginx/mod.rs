//! nginx itself: the master process and the module's HTTP API.

mod api_client;
mod process;
pub mod reaper;

pub use api_client::{ApiClient, PushError, Status, WorkerStatus};
pub use process::{check_socket_dir, Mode, Nginx, BACKEND_TLS_SOCKET_PREFIX, HTTPS_SOCKET};
