//! Juhász's symmetric asynchronous broadcast ("Broadcasting Algorithm of
//! Constant Complexity for Fully-Switched Clusters", §3).
//!
//! The paper's `p` is the number of *destinations*; here a broadcast has
//! `nodes` ranks, so `p = nodes − 1`.
//!
//! - **Phase 1.** The source cuts the `n` bytes into `p` pieces by eq. 3
//!   ([`even_pieces`]) and sends piece `i` to destination `i`, all transfers
//!   at once.
//! - **Phase 2.** Each destination forwards the piece it got from the
//!   source to the other `p − 1` destinations, all at once.
//!
//! In the paper the two phases overlap (a node may get phase-2 pieces
//! before its own); as a schedule they are two steps, and the critical path
//! is the same: eq. 5, `2·t_0 + n·t_d·(2 − 1/p)`, independent of `p` — each
//! byte crosses the network at most twice on its way to any destination.
//!
//! **Small messages.** The scheme makes `~p²` messages of `n/p` bytes, so
//! the paper (§3) sends short messages whole during phase 1 instead, and its
//! measurements (§4) show the tree slightly better up to 2 kB. Below
//! [`SymmetricConfig::small_message_max`] the schedule falls back to
//! [`SmallMessage`].

use crate::basic::{binomial_tree, relative_ranks};
use crate::error::CollectiveError;
use crate::schedule::{Schedule, Transfer, even_pieces};

/// The crossover the paper measured (§4, 100 Mbit/s Ethernet, NT-MPICH):
/// "for small messages (≤ 2 kB) the tree algorithm is slightly better".
pub const JUHASZ_SMALL_MESSAGE_MAX: usize = 2048;

/// What to do with a message at or below the cut-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmallMessage {
    /// §3: "distribute the whole information in a single step during
    /// phase 1" — the root sends the whole message to every destination in
    /// one step.
    SingleStep,
    /// §4: the binomial tree, which the measurements found slightly faster
    /// for messages up to 2 kB.
    Binomial,
}

/// Tuning of [`symmetric`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymmetricConfig {
    /// Messages of at most this many bytes use `small`.
    pub small_message_max: usize,
    /// The fallback for small messages.
    pub small: SmallMessage,
}

impl Default for SymmetricConfig {
    /// The paper's measured crossover, 2 kB, with the binomial tree below it.
    fn default() -> Self {
        Self {
            small_message_max: JUHASZ_SMALL_MESSAGE_MAX,
            small: SmallMessage::Binomial,
        }
    }
}

/// The symmetric broadcast of `len` bytes from `root` to the other
/// `nodes − 1` ranks (see the module docs). With one destination it is a
/// single transfer, as the paper notes ("for a single destination node the
/// two algorithms are equivalent"). Empty pieces (when `len < p`) are not
/// sent.
pub fn symmetric(
    nodes: usize,
    root: usize,
    len: usize,
    config: SymmetricConfig,
) -> Result<Schedule, CollectiveError> {
    let ranks = relative_ranks(nodes, root)?;
    let dests = &ranks[1..];
    if len <= config.small_message_max {
        return match config.small {
            SmallMessage::Binomial => binomial_tree(nodes, root, len),
            SmallMessage::SingleStep => Ok(single_step(root, dests, len)),
        };
    }
    let mut schedule = Schedule::empty(root, dests.to_vec(), len);
    if dests.is_empty() || len == 0 {
        return Ok(schedule);
    }
    let pieces = even_pieces(len, dests.len());
    // Phase 1: piece i to destination i.
    let phase1: Vec<_> = dests
        .iter()
        .zip(&pieces)
        .filter(|(_, piece)| !piece.is_empty())
        .map(|(&to, piece)| Transfer {
            from: root,
            to,
            range: piece.clone(),
        })
        .collect();
    // Phase 2: destination i forwards piece i to every other destination.
    let mut phase2 = Vec::new();
    for (&owner, piece) in dests.iter().zip(&pieces) {
        if piece.is_empty() {
            continue;
        }
        for &to in dests.iter().filter(|&&d| d != owner) {
            phase2.push(Transfer {
                from: owner,
                to,
                range: piece.clone(),
            });
        }
    }
    schedule.steps.push(phase1);
    if !phase2.is_empty() {
        schedule.steps.push(phase2);
    }
    Ok(schedule)
}

/// The root sends everything to every destination in one step.
fn single_step(root: usize, dests: &[usize], len: usize) -> Schedule {
    let mut schedule = Schedule::empty(root, dests.to_vec(), len);
    if len > 0 && !dests.is_empty() {
        schedule.steps.push(
            dests
                .iter()
                .map(|&to| Transfer {
                    from: root,
                    to,
                    range: 0..len,
                })
                .collect(),
        );
    }
    schedule
}
