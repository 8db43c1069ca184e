//! Clustering the peer network by bandwidth (dissertation ch. 5): the
//! distributed diffusive clustering DiDiC (Listing 5.1 with the §5.3
//! improvements), the quality measures modularity and NCV (§5.2), and the
//! §5.4 graph generators with their dynamics.
//!
//! **Architecture Invariant:** pure. No IO, no clock, no global RNG: every
//! random choice comes from a [`Rng`] the caller seeds, so a run is a
//! function of its seed (`scripts/test` checks the crate's dependencies).
//! The supernode and the simulator drive it.

mod didic;
mod generate;
mod graph;
mod network;
mod probes;
mod quality;
mod rng;
pub mod scenarios;

pub use didic::{Didic, DidicParams, Drain};
pub use generate::{Dynamics, GraphModel, Point, Topology};
pub use graph::{Graph, VertexId};
pub use network::{EdgeRule, MeasuredNetwork, select_edges};
pub use probes::{ProbePolicy, fastest, neighbours, probe_targets};
pub use quality::{connected_parts, merge_while_modularity_rises, modularity, ncv, refine};
pub use rng::Rng;

#[cfg(test)]
mod tests;
