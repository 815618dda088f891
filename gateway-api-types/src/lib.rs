//! Kubernetes Gateway API v1.7.0 types (standard channel), as kopium
//! generates them from the release's CRDs: `cargo run -p nginx-build --
//! gateway-types` writes every module but this one, and nginx-build's tests
//! fail when a committed file differs from its regeneration. Do not edit
//! the generated files; wrap them in the controller instead.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod backendtlspolicies;
pub mod gatewayclasses;
pub mod gateways;
pub mod grpcroutes;
pub mod httproutes;
pub mod listenersets;
pub mod referencegrants;
pub mod tcproutes;
pub mod tlsroutes;
pub mod udproutes;
