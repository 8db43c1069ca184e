//! The error type of the placement crate.

use std::fmt;

/// What went wrong when changing a [`Dhht`](crate::Dhht) or a
/// [`TwoLevel`](crate::TwoLevel) table, or parsing a scheme.
///
/// A failed call leaves the table unchanged.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum PlacementError {
    /// The peer's weight is zero, negative, NaN or infinite.
    InvalidWeight {
        /// The peer.
        peer: i64,
        /// The rejected weight.
        weight: f64,
    },
    /// `insert` of a peer id that is already in the table.
    DuplicatePeer {
        /// The peer.
        peer: i64,
    },
    /// `update` of a peer id that is not in the table.
    UnknownPeer {
        /// The peer.
        peer: i64,
    },
    /// A power outside the range a [`HashTable`](crate::HashTable) accepts.
    PowerOutOfRange {
        /// The peer.
        peer: i64,
        /// The rejected power.
        power: f64,
        /// The smallest accepted power.
        min: f64,
        /// The largest accepted power.
        max: f64,
    },
    /// A hash variant name that is not one of the slugs.
    UnknownVariant {
        /// The rejected name (at most 64 characters of it).
        given: String,
    },
    /// A position scheme name other than `random` or `golden`.
    UnknownScheme {
        /// The rejected name (at most 64 characters of it).
        given: String,
    },
    /// A [`ClusterPeer`](crate::ClusterPeer) with no slots (cores).
    InvalidSlots {
        /// The peer.
        peer: i64,
    },
}

impl fmt::Display for PlacementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementError::InvalidWeight { peer, weight } => write!(
                f,
                "peer {peer} has weight {weight}; a peer's weight (speed × availability) \
                 must be finite and greater than zero, so remove a peer that has no power left"
            ),
            PlacementError::DuplicatePeer { peer } => write!(
                f,
                "peer {peer} is already in the placement table; use update to change it"
            ),
            PlacementError::UnknownPeer { peer } => write!(
                f,
                "peer {peer} is not in the placement table; use insert to add it"
            ),
            PlacementError::PowerOutOfRange {
                peer,
                power,
                min,
                max,
            } => write!(
                f,
                "peer {peer} has power {power:e}; powers must lie in [{min:e}, {max:e}], \
                 so scale the benchmark speeds into that range"
            ),
            PlacementError::UnknownVariant { given } => write!(
                f,
                "unknown placement variant `{given}`; use one of rr, rd, dr, dd, multi, rendezvous"
            ),
            PlacementError::UnknownScheme { given } => write!(
                f,
                "unknown position scheme `{given}`; use `random` or `golden`"
            ),
            PlacementError::InvalidSlots { peer } => write!(
                f,
                "peer {peer} has 0 slots; a peer offers at least one core, so give its core count"
            ),
        }
    }
}

impl std::error::Error for PlacementError {}
