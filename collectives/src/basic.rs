//! The classic broadcasts among `p` ranks: flat tree, binomial tree and
//! pipelined chain (Juhász §2; Takahashi et al. §2.1–2.2).
//!
//! Ranks are `0..nodes`; the root is any rank. The destinations are listed in
//! *relative rank* order `root + 1, root + 2, …` (mod `nodes`), as MPI
//! implementations order them.

use crate::error::CollectiveError;
use crate::schedule::{Schedule, Transfer, chunks};

/// Checks `nodes`/`root` and returns the ranks in relative order: the root
/// first, then `root + 1, …` (mod `nodes`).
pub(crate) fn relative_ranks(nodes: usize, root: usize) -> Result<Vec<usize>, CollectiveError> {
    if nodes == 0 {
        return Err(CollectiveError::NoNodes);
    }
    if root >= nodes {
        return Err(CollectiveError::RootOutOfRange { root, nodes });
    }
    Ok((0..nodes).map(|r| (root + r) % nodes).collect())
}

/// The flat tree ("linear" broadcast, Juhász §2 eq. 2; Takahashi §2.1): the
/// root sends the whole data to each destination in turn, one transfer per
/// step, so it takes `p − 1` steps and `(p − 1)·(t_0 + n·t_d)` in the linear
/// model.
pub fn flat_tree(nodes: usize, root: usize, len: usize) -> Result<Schedule, CollectiveError> {
    let ranks = relative_ranks(nodes, root)?;
    let mut schedule = Schedule::empty(root, ranks[1..].to_vec(), len);
    if len > 0 {
        for &to in &ranks[1..] {
            schedule.steps.push(vec![Transfer {
                from: root,
                to,
                range: 0..len,
            }]);
        }
    }
    Ok(schedule)
}

/// The binomial tree (Juhász §2, "used in most current MPI implementations"):
/// in step `k` every rank that holds the data, at relative rank `r < 2^k`,
/// sends all of it to relative rank `r + 2^k` (if that exists). The number of
/// holders doubles each step, so `p` nodes are done in `⌈log₂ p⌉` steps, and
/// every node sends at most one message per step.
pub fn binomial_tree(nodes: usize, root: usize, len: usize) -> Result<Schedule, CollectiveError> {
    let ranks = relative_ranks(nodes, root)?;
    let mut schedule = Schedule::empty(root, ranks[1..].to_vec(), len);
    if len == 0 {
        return Ok(schedule);
    }
    let mut holders = 1usize;
    while holders < nodes {
        let step = (0..holders)
            .filter(|r| r + holders < nodes)
            .map(|r| Transfer {
                from: ranks[r],
                to: ranks[r + holders],
                range: 0..len,
            })
            .collect();
        schedule.steps.push(step);
        holders *= 2;
    }
    Ok(schedule)
}

/// The pipelined chain (the "depth-first pipeline" of Takahashi §2.2 on a
/// flat network): the ranks form one chain in relative order, the data is
/// cut into `k = ⌈n / chunk⌉` chunks, and in step `s` the `j`-th link of the
/// chain (from relative rank `j` to `j + 1`) carries chunk `s − j`. It takes
/// `k + p − 2` steps; each node sends and receives at most one chunk per
/// step.
pub fn pipelined_chain(
    nodes: usize,
    root: usize,
    len: usize,
    chunk: usize,
) -> Result<Schedule, CollectiveError> {
    if chunk == 0 {
        return Err(CollectiveError::ZeroChunk);
    }
    let ranks = relative_ranks(nodes, root)?;
    let mut schedule = Schedule::empty(root, ranks[1..].to_vec(), len);
    let pieces: Vec<_> = chunks(0..len, chunk).collect();
    if pieces.is_empty() || nodes < 2 {
        return Ok(schedule);
    }
    let links = nodes - 1;
    for s in 0..pieces.len() + links - 1 {
        let step = (0..links)
            .filter(|&j| s >= j && s - j < pieces.len())
            .map(|j| Transfer {
                from: ranks[j],
                to: ranks[j + 1],
                range: pieces[s - j].clone(),
            })
            .collect();
        schedule.steps.push(step);
    }
    Ok(schedule)
}
