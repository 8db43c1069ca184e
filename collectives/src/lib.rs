//! Broadcast schedules for bspweb, pure: what each node sends to whom, in
//! which step, and which bytes of the data.
//!
//! # What is here
//!
//! - **Classic broadcasts** among `p` ranks ([`flat_tree`],
//!   [`binomial_tree`], [`pipelined_chain`]).
//! - **The symmetric broadcast** of Juhász, "Broadcasting Algorithm of
//!   Constant Complexity for Fully-Switched Clusters" (§3): scatter `p`
//!   pieces, every destination forwards its piece to all others; about
//!   `2·n·t_d` whatever `p` ([`symmetric`], with the small-message fallback
//!   of §3/§4).
//! - **The stable broadcast** of Takahashi, Saito, Shibata and Taura, "A
//!   Stable Broadcast Algorithm", on a bandwidth-annotated tree
//!   [`Topology`]: Algorithm 1 ([`stable_trees`]: repeated depth-first
//!   pipelines, partial ones included), Algorithm 2 ([`staged_schedule`]:
//!   staged sending so everyone gets everything), and the §4 baselines
//!   ([`fpfr_depth_first`], [`depth_first_pipeline`], [`flat_tree_plan`],
//!   [`random_pipeline`], [`dijkstra_tree`]).
//! - **Models**: [`Schedule::linear_cost`] (Juhász's `t_0 + n·t_d`) for
//!   step schedules and [`model_bandwidth`] (max-min fair rates of transfer
//!   trees over the topology's links) for tree plans.
//! - **Receiver-initiated multicast between clusters** of den Burger and
//!   Kielmann, "Collective receiver-initiated multicast for grid
//!   applications": *Robber* (§3: collectives that steal pieces from other
//!   clusters and work from each other), *MOB* (its static-split
//!   predecessor) and a BitTorrent-like baseline, as deterministic
//!   per-node state machines ([`PeerNode`], [`Multicast`]) over the
//!   messages of Table 1 ([`MulticastMsg`]), run in memory by [`simulate`]
//!   in a seeded random order or under a per-link [`LinkModel`]. For a
//!   distributed run, [`Multicast::plan`] computes every node's peers and
//!   work from the data's length alone (the same on every node),
//!   [`Multicast::into_node`] keeps one node and [`PeerNode::seed_data`]
//!   gives the root the data; [`PeerNode::handle`] rejects, without
//!   changing state, any message a correct peer would not send.
//! - **Data-driven execution** of a schedule by one node ([`Relay`]): a
//!   node sends each of its transfers as soon as it holds the transfer's
//!   bytes, however they arrive (out of order, in frames, overlapping),
//!   so a peer can run any [`Schedule`] over the network without steps.
//! - **A simulator** ([`execute`]) that runs a schedule on real bytes with
//!   the transfers of each step shuffled, so tests check delivery.
//!
//! # Example
//!
//! ```
//! use collectives::{execute, symmetric, SymmetricConfig};
//!
//! let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
//! let schedule = symmetric(5, 0, data.len(), SymmetricConfig::default())?;
//! assert_eq!(schedule.step_count(), 2); // scatter, then all-to-all forward
//! let delivery = execute(&schedule, &data, 42)?;
//! assert!(delivery.delivers(&schedule, &data));
//! # Ok::<(), collectives::CollectiveError>(())
//! ```
//!
//! **Architecture Invariant:** this crate does no IO, reads no clock and
//! uses no global random number generator; every schedule and every model
//! result is a pure function of its inputs and seeds.

#![warn(missing_docs)]

mod basic;
mod error;
mod model;
mod relay;
mod rng;
mod robber;
pub mod saito;
mod schedule;
mod sim;
mod stable;
mod symmetric;
mod topology;

#[cfg(test)]
mod tests;

pub use basic::{binomial_tree, flat_tree, pipelined_chain};
pub use error::CollectiveError;
pub use model::{Bandwidths, model_bandwidth};
pub use relay::Relay;
pub use robber::{
    Algorithm, LinkModel, Multicast, MulticastConfig, MulticastMsg, OUTSTANDING, Outcome, Outgoing,
    PEERS, PeerNode, global_peer_ranks, initial_work, simulate,
};
pub use schedule::{Schedule, Transfer, even_pieces, weighted_pieces};
pub use sim::{Delivery, Received, execute};
pub use stable::{
    RANDOM_PIPELINE_CANDIDATES, TransferTree, TreePlan, complement, depth_first_pipeline,
    dijkstra_tree, flat_tree_plan, fpfr_depth_first, random_pipeline, stable_trees,
    staged_schedule,
};
pub use symmetric::{JUHASZ_SMALL_MESSAGE_MAX, SmallMessage, SymmetricConfig, symmetric};
pub use topology::{ArcId, Link, NodeId, NodeKind, Topology};
