//! ingress-controller: the control plane for ngx_http_dynamic_balancer_module.
//!
//! - [`source`]: where objects come from (Kubernetes watchers, or a manifest
//!   directory), both producing a [`snapshot::Snapshot`].
//! - [`model`]: the pure ingress-nginx model builder.
//! - [`render`]: nginx.conf from a minijinja template, injection-proof.
//! - [`nginx`]: running, testing and reloading nginx, and pushing backends.
//! - [`sync`]: the two paths, structural (render, test, reload) and dynamic
//!   (per-backend pushes), which never wait on each other.

pub mod admission;
pub mod auth_files;
pub mod certgen;
pub mod check;
pub mod cli;
pub mod conf_syntax;
pub mod default_certificate;
pub mod diff;
pub mod events;
pub mod file_check;
pub mod gateway;
pub mod gateway_services;
pub mod gateway_status;
pub mod ingress_status;
pub mod inspect;
pub mod leader;
pub mod memory;
pub mod metrics;
pub mod metrics_relay;
pub mod model;
pub mod nginx;
pub mod push;
pub mod push_certs;
pub mod rebuild;
pub mod reference;
pub mod reload;
pub mod render;
pub mod resolv_conf;
pub mod snapshot;
pub mod source;
pub mod staging;
pub mod state;
pub mod supervise;
pub mod sync;
pub mod token;
