//! Placement of BSP processes on peers with distributed heterogeneous hash
//! tables (DHHT), after §4.2 of Gehweiler's PUB-Web dissertation.
//!
//! # The idea
//!
//! Peers and processes are points of the unit ring `[0, 1)`. Each peer `i`
//! has a position `p_i` and a weight `w_i` = benchmark speed × current
//! availability, and a linear function `f_i(x) = ((x − p_i) mod 1) / w_i`: the
//! counter-clockwise distance from `x` back to the peer, scaled by the
//! inverse of its power. A process at `x` runs on the peer whose function is
//! lowest at `x` — the *lower envelope* (§4.2.2, Fig. 4.1); ties go to the
//! smaller peer id. Stronger peers have flatter functions and win longer
//! stretches of the ring, so they receive proportionally more processes.
//!
//! The assignment of a process depends only on the peers, never on the other
//! processes, so any supernode holding the same peer table computes the same
//! schedule, and a crashed supernode's schedule can be rebuilt.
//!
//! # Positions
//!
//! Positions are [`Position`]s: 64-bit fixed-point fractions, exact and
//! totally ordered. They come from one of two [`PositionScheme`]s:
//!
//! - **Random** ("Rnd.", §4.2.2): SHA-1 of a canonical key
//!   ([`hashed_position`] of [`peer_key`] / [`process_key`]).
//! - **Golden** ("Det.", §4.2.4): the `k`-th point `{k·Φ}` with
//!   `Φ = (√5 − 1)/2` ([`golden_position`]). For every `n` the points
//!   `1..=n` leave gaps whose longest-to-shortest ratio is at most φ² ≈ 2.618
//!   (against Θ(n log n) for random points). The indices `k` come from an
//!   [`IndexAllocator`], which reuses freed indices smallest first.
//!
//! The default, and the dissertation's best variant, is Golden for both
//! peers and processes ("DHHT (Det., Det.)").
//!
//! # The balancers of §4.2
//!
//! - [`HashTable`] implements every hash-based balancer behind one API
//!   ([`HashVariant`]): the four DHHT variants (Rnd./Det. positions for
//!   peers × processes), multiple hashing ("DHHT (Multi)", §4.2.3: argmin
//!   `r_{i,x}/w_i` with a per-peer hash [`peer_hash`]) and weighted
//!   rendezvous hashing (argmin `−ln(r_{i,x})/w_i`, exactly proportional).
//!   It keeps every process's peer and reports, for each join, leave or
//!   power change, exactly the processes that move ([`Move`]) — computed
//!   incrementally: an increase or join can only pull processes to the
//!   peer, a decrease or leave only push its own processes away.
//! - [`WorkStealing`] is the baseline of §4.2.1, "WS (Head)" and
//!   "WS (Tail)", seeded with its own generator.
//!
//! [`Dhht`] is the lower envelope alone, for callers (the supernode) that
//! keep positions and assignments themselves. [`TwoLevel`] is the two-level
//! balancer of the dissertation's outlook (Fig. 6.1): a DHHT over network
//! clusters weighted by their power picks each job's cluster (or, for a
//! job larger than any cluster, the fewest clusters that hold it, in
//! contiguous pid blocks), and one [`Dhht`] per cluster each process's
//! peer; with one cluster it is exactly the flat [`Dhht`].
//!
//! # Example
//!
//! ```
//! use placement::{golden_position, place, Dhht, IndexAllocator, Peer};
//!
//! // Peers 10, 11, 12 join; 11 is twice as fast as the others.
//! let mut peer_indices = IndexAllocator::new();
//! let mut dhht = Dhht::new();
//! for (id, weight) in [(10, 1.0), (11, 2.0), (12, 1.0)] {
//!     let k = peer_indices.alloc();
//!     dhht.insert(Peer { id, position: golden_position(k), weight })?;
//! }
//!
//! // A job with 8 processes starts; each takes the next process index.
//! let mut process_indices = IndexAllocator::new();
//! let xs: Vec<_> = (0..8).map(|_| golden_position(process_indices.alloc())).collect();
//! let owners = place(&dhht, &xs);
//! assert!(owners.iter().all(|o| o.is_some()));
//!
//! // Peer 12 leaves: only the processes it held move.
//! dhht.remove(12);
//! peer_indices.free(3);
//! let after = place(&dhht, &xs);
//! for (before, now) in owners.iter().zip(&after) {
//!     if *before != Some(12) {
//!         assert_eq!(before, now);
//!     }
//! }
//! # Ok::<(), placement::PlacementError>(())
//! ```
//!
//! **Architecture Invariant:** this crate does no IO, reads no clock and
//! uses no global random number generator; every result is a pure function
//! of its inputs (and seeds), identical on every machine.

#![warn(missing_docs)]

mod dhht;
pub mod epochs;
mod error;
mod index;
mod position;
mod rng;
mod steal;
mod table;
mod two_level;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod two_level_tests;

pub use dhht::{Dhht, Peer, envelope_value, is_eligible_weight, place};
pub use error::PlacementError;
pub use index::IndexAllocator;
pub use position::{
    GOLDEN_STEP, PHI_INV, PHI_SQUARED, Position, PositionScheme, golden_position, hashed_position,
    job_key, peer_key, process_key,
};
pub use steal::{StealFrom, WorkStealing};
pub use table::{
    HashTable, HashVariant, Hashing, MAX_POWER, MIN_POWER, Move, PeerId, ProcessKey, peer_hash,
};
pub use two_level::{Block, ClusterInfo, ClusterPeer, JobPlacement, TwoLevel};
