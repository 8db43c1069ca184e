//! Simulator for the load balancers of dissertation chapter 4 (pure: no IO, no clock, no global RNG).

pub mod availability;
pub mod engine;
pub mod error;
pub mod hardware;
pub mod jobs;
pub mod rng;
pub mod svg;

pub use engine::{BalancerSpec, RunConfig, RunOutcome, simulate};
pub use error::SimError;
pub use jobs::{Job, JobProfile, job_stream};
