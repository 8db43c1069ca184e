//! Schedules: who sends which bytes to whom, step by step.

use std::collections::BTreeMap;
use std::ops::Range;

/// One point-to-point transfer: `from` sends bytes `range` of the broadcast
/// data to `to`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Transfer {
    /// The sender (a rank, or a host's [`NodeId`](crate::NodeId) index).
    pub from: usize,
    /// The receiver.
    pub to: usize,
    /// The bytes of the data sent, never empty.
    pub range: Range<usize>,
}

/// A broadcast schedule of `len` bytes from `root` to `destinations`.
///
/// `steps[s]` holds the transfers of step `s`. The transfers of one step are
/// independent: each forwards only bytes its sender held when the step began,
/// so they may run in any order or all at once (the simulator,
/// [`execute`](crate::execute), checks this and runs them shuffled). A step
/// puts no limit on how many transfers a node takes part in; the cost model
/// ([`Schedule::linear_cost`]) charges for it instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The node that holds the data at the start.
    pub root: usize,
    /// The nodes that must hold the data at the end.
    pub destinations: Vec<usize>,
    /// The size of the data in bytes.
    pub len: usize,
    /// The transfers, step by step.
    pub steps: Vec<Vec<Transfer>>,
}

impl Schedule {
    /// A schedule with no steps yet.
    pub(crate) fn empty(root: usize, destinations: Vec<usize>, len: usize) -> Self {
        Self {
            root,
            destinations,
            len,
            steps: Vec::new(),
        }
    }

    /// The number of steps.
    pub fn step_count(&self) -> usize {
        self.steps.len()
    }

    /// Every transfer with its step index.
    pub fn transfers(&self) -> impl Iterator<Item = (usize, &Transfer)> {
        self.steps
            .iter()
            .enumerate()
            .flat_map(|(s, step)| step.iter().map(move |t| (s, t)))
    }

    /// The number of transfers (messages).
    pub fn message_count(&self) -> usize {
        self.steps.iter().map(Vec::len).sum()
    }

    /// Bytes sent by each node over the whole schedule.
    pub fn bytes_sent_by(&self) -> BTreeMap<usize, u64> {
        let mut sent = BTreeMap::new();
        for (_, t) in self.transfers() {
            *sent.entry(t.from).or_insert(0) += t.range.len() as u64;
        }
        sent
    }

    /// Bytes on the network in total: the sum of all transfer sizes.
    pub fn bytes_on_network(&self) -> u64 {
        self.transfers().map(|(_, t)| t.range.len() as u64).sum()
    }

    /// The time of the schedule under Juhász's linear model (§2, eq. 1:
    /// `t_c(n) = t_0 + n·t_d`) extended to full-duplex nodes sending and
    /// receiving asynchronously (§3): a step costs `t_0` plus `t_d` times the
    /// largest number of bytes any one node sends or receives in it, because
    /// a node's parallel transfers share its link and their latencies overlap
    /// (eq. 4: `t_0 + p·(n/p)·t_d`). Steps run one after the other.
    ///
    /// This gives eq. 2 for the flat tree (one transfer per step), eq. 5
    /// for the symmetric broadcast, `⌈log₂ p⌉·(t_0 + n·t_d)` for the
    /// binomial tree and `(k + p − 2)·(t_0 + c·t_d)` for a chain of `p`
    /// nodes and `k` chunks of `c` bytes.
    pub fn linear_cost(&self, t0: f64, td: f64) -> f64 {
        let mut total = 0.0;
        for step in &self.steps {
            if step.is_empty() {
                continue;
            }
            let mut out: BTreeMap<usize, u64> = BTreeMap::new();
            let mut inn: BTreeMap<usize, u64> = BTreeMap::new();
            for t in step {
                *out.entry(t.from).or_insert(0) += t.range.len() as u64;
                *inn.entry(t.to).or_insert(0) += t.range.len() as u64;
            }
            let busiest = out.values().chain(inn.values()).copied().max().unwrap_or(0);
            total += t0 + busiest as f64 * td;
        }
        total
    }
}

/// Splits `0..len` into `parts` consecutive ranges whose sizes differ by at
/// most one byte, by Juhász's eq. 3: part `i` (1-based) starts at
/// `⌊(i−1)·n/p⌋` and ends at `⌊i·n/p⌋`. Some parts are empty when
/// `len < parts`. `parts` must be at least 1.
pub fn even_pieces(len: usize, parts: usize) -> Vec<Range<usize>> {
    weighted_pieces(len, &vec![1; parts])
}

/// Splits `0..len` into consecutive ranges proportional to `weights`
/// (eq. 3 generalised: boundary `i` is `⌊len · (w_1+…+w_i) / Σw⌋`), as
/// Algorithm 2 of Takahashi et al. allocates data to trees "proportional
/// to `u_i`". Weights must not all be zero.
pub fn weighted_pieces(len: usize, weights: &[u64]) -> Vec<Range<usize>> {
    let total: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    assert!(total > 0, "weighted_pieces needs a positive total weight");
    let mut pieces = Vec::with_capacity(weights.len());
    let mut acc: u128 = 0;
    let mut start = 0usize;
    for &w in weights {
        acc += u128::from(w);
        let end = (len as u128 * acc / total) as usize;
        pieces.push(start..end);
        start = end;
    }
    pieces
}

/// Cuts `range` into consecutive chunks of at most `chunk` bytes.
pub(crate) fn chunks(range: Range<usize>, chunk: usize) -> impl Iterator<Item = Range<usize>> {
    debug_assert!(chunk > 0);
    range
        .clone()
        .step_by(chunk)
        .map(move |s| s..(s + chunk).min(range.end))
}
