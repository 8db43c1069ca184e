//! Simulator for the load balancers of dissertation chapter 4 (pure: no IO, no clock, no global RNG).

pub mod availability;
pub mod svg;
