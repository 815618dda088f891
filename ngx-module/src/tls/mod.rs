//! Certificates without reloads: PEM chains checked and turned into the
//! zone's payload, the certificate map's writes, each worker's parsed
//! cache, the handshake callback that picks a certificate by SNI, and the
//! client certificate validation of Gateway HTTPS servers, and TLS to
//! backends under a BackendTLSPolicy ([`upstream`]).
//!
//! May use [`crate::nginx`], [`crate::shm`], [`crate::conf`] and, for the
//! upstream connection of a routed request, [`crate::http`].

pub mod cache;
pub mod certificate;
pub mod client_ca;
pub mod handshake;
pub mod store;
pub mod upstream;
