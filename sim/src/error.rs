//! Errors of the simulator.

use thiserror::Error;

/// Why a simulation could not be set up or run.
#[derive(Debug, Error, PartialEq)]
pub enum SimError {
    /// A name on the command line or in a parameter is not one we know.
    #[error("unknown {what} {given:?}; valid names are: {valid}")]
    UnknownName {
        /// What kind of name (e.g. "balancer").
        what: &'static str,
        /// What was given.
        given: String,
        /// The valid names, comma-separated.
        valid: String,
    },
    /// A numeric parameter is out of range.
    #[error("invalid parameter {name} = {value}: {expected}")]
    InvalidParameter {
        /// Parameter name.
        name: &'static str,
        /// The value given, formatted.
        value: String,
        /// What would be valid.
        expected: &'static str,
    },
    /// The availability list does not match the peers.
    #[error(
        "{peers} peers but {traces} availability traces; give one trace per peer (or none for 100 % availability)"
    )]
    TraceCount {
        /// Number of peers (CPU factors).
        peers: usize,
        /// Number of availability traces.
        traces: usize,
    },
    /// The balancer reported something the simulator cannot reconcile (a bug
    /// in the balancer or the simulator, not in the input).
    #[error("balancer inconsistency: {0}; please report this with the run's parameters")]
    Inconsistent(String),
}
