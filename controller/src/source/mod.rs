//! Where the objects come from. Both sources publish [`Snapshot`]s into a
//! `tokio::sync::watch` channel, which keeps only the newest one: a burst
//! of changes is coalesced before the model is even built.
//!
//! [`Snapshot`]: crate::snapshot::Snapshot

pub mod cluster;
pub mod manifests;
