//! Wire and REST types shared by every bspweb component.
//!
//! **Architecture Invariant:** this is the only crate that defines types which
//! cross a process boundary. The supernode, the peer, the CLI and the consumer
//! client all speak through these types; inner types are converted at the edge.
//!
//! - [`rest`]: the user-facing REST API under `/api/v1` (JSON).
//! - [`control`]: the peer ↔ supernode control plane (JSON over HTTP, lease token).
//! - [`wire`]: the peer ↔ peer data plane (postcard frames over TCP).
//! - `client` (feature `client`): an async HTTP client for the REST API.

pub mod control;
pub mod rest;
pub mod wire;

#[cfg(feature = "client")]
pub mod client;

/// Version of the REST and control-plane protocol; bumped on incompatible changes.
pub const API_VERSION: u32 = 1;

/// Identifier of a job, assigned by the supernode.
pub type JobId = i64;

/// Identifier of a peer, assigned by the supernode at first login.
pub type PeerId = i64;

/// Index of a BSP process within its job: `0..nprocs`.
pub type Pid = u32;
