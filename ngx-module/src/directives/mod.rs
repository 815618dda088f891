//! The directives' setters and the checks and merges nginx runs after
//! parsing, in one file per part of the configuration. They run at
//! configuration time only and fill the structs of [`crate::conf`]; `lib.rs`'s
//! command table is the only thing that names them.
//!
//! The top floor: may use every folder below it.

mod api;
mod location;
mod otel;
mod upstream;
mod variables;
mod zones;

pub use api::{check_api_listeners, set_api, set_token, set_token_file};
pub use location::{merge_loc_conf, set_backend, set_https_redirect, set_loc_flag, set_metrics, set_routes};
pub use otel::{set_otel, set_otel_exporter, set_otel_operation_name, set_otel_sampler};
pub use upstream::{check_upstreams, merge_srv_conf, set_balancer, set_ssl, set_ssl_routes};
pub use variables::{declare_variables, index_variables};
pub use zones::{init_main_conf, set_metrics_zone, set_state_file, set_zone};
