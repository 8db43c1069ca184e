//! Simulator for the load balancers of dissertation chapter 4 (§4.3–4.4):
//! peers with CPU factors from Table 4.2 and availability traces, job
//! streams from Table 4.3, the hash-based balancers of `placement` and work
//! stealing, and the dissertation's metrics and report tables.
//!
//! - [`engine`]: the event-driven simulation of one run ([`simulate`]).
//! - [`clusters`]: flat against two-level placement on a clustered
//!   network, with communication (issue 15, Fig. 6.1).
//! - [`experiment`]: experiment types A, B, C — groups, inputs, runs.
//! - [`metrics`]: stretch factors, CPU time, migrations, pending time.
//! - [`report`]: markdown tables and SVG figures.
//! - [`hardware`], [`jobs`]: Tables 4.2 and 4.3; [`availability`], [`svg`]:
//!   availability profiles and plots.
//!
//! **Architecture Invariant:** pure — no IO, no clock, no global random
//! number generator. Every result follows from the seed and the parameters;
//! the `bspweb sim` command does the IO.

#![warn(missing_docs)]

pub mod availability;
pub mod clusters;
pub mod dissertation;
pub mod engine;
pub mod error;
pub mod experiment;
pub mod hardware;
pub mod jobs;
pub mod metrics;
pub mod report;
pub mod rng;
pub mod svg;

#[cfg(test)]
mod tests;

pub use engine::{BalancerSpec, RunConfig, RunOutcome, simulate};
pub use error::SimError;
pub use experiment::{ExperimentKind, ExperimentSpec, Group};
pub use jobs::{Job, JobProfile, job_stream};
