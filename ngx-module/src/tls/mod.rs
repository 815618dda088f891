//! Certificates without reloads: PEM chains checked and turned into the
//! zone's payload, the certificate map's writes, each worker's parsed
//! cache, and the handshake callback that picks a certificate by SNI.
//!
//! May use [`crate::nginx`], [`crate::shm`] and [`crate::conf`].

pub mod cache;
pub mod certificate;
pub mod handshake;
pub mod store;
