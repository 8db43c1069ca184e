//! End-to-end tests: real supernodes and peer processes on loopback.
//!
//! One binary for all of them (CRAFT §8). Tests that only run well-behaved
//! jobs share one cluster; tests that break things start their own.

mod harness;
#[path = "../../supernode/tests/support/throwaway_pg.rs"]
mod throwaway_pg;

mod api_spec;
mod c_guest;
mod claims;
mod cli;
mod consumer;
mod data_plane;
mod enrollment;
mod errors;
mod examples;
mod faults;
mod links;
mod metrics;
mod redteam;
mod redundancy;
mod security;
mod shared_db;
mod testbed;
mod testbed_jobs;
mod tls;
mod up;
mod volunteer;
