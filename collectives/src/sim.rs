//! Executes a [`Schedule`] on real bytes, in memory, to check delivery.

use std::collections::BTreeMap;

use crate::error::CollectiveError;
use crate::rng::SplitMix64;
use crate::schedule::Schedule;

/// What one node ended up with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Each byte of the data, if the node received it.
    pub bytes: Vec<Option<u8>>,
    /// How many times each byte arrived.
    pub times: Vec<u32>,
    /// For each byte, how many network hops its first copy travelled from
    /// the root (0 if never received).
    pub hops: Vec<u32>,
}

impl Received {
    fn new(len: usize) -> Self {
        Self {
            bytes: vec![None; len],
            times: vec![0; len],
            hops: vec![0; len],
        }
    }

    /// The reassembled data, if every byte arrived.
    pub fn data(&self) -> Option<Vec<u8>> {
        self.bytes.iter().copied().collect()
    }
}

/// The outcome of [`execute`]: every node other than the root that took
/// part (destinations first appear even if they received nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Per node.
    pub nodes: BTreeMap<usize, Received>,
}

impl Delivery {
    /// Whether every destination reassembled exactly `data`.
    pub fn delivers(&self, schedule: &Schedule, data: &[u8]) -> bool {
        schedule.destinations.iter().all(|d| {
            self.nodes
                .get(d)
                .and_then(Received::data)
                .is_some_and(|got| got == data)
        })
    }
}

/// Runs `schedule` on `data`: the root starts with it, every transfer copies
/// bytes from its sender's buffer into its receiver's.
///
/// The transfers of each step run one by one in an order shuffled by
/// `order_seed`, and a transfer may only forward bytes its sender held when
/// the step began — the contract of a step — so a schedule that passes for
/// every seed does not depend on the order of independent sends.
pub fn execute(
    schedule: &Schedule,
    data: &[u8],
    order_seed: u64,
) -> Result<Delivery, CollectiveError> {
    if data.len() != schedule.len {
        return Err(CollectiveError::LengthMismatch {
            expected: schedule.len,
            got: data.len(),
        });
    }
    let len = data.len();
    let root = schedule.root;
    let mut root_state = Received::new(len);
    for (i, &b) in data.iter().enumerate() {
        root_state.bytes[i] = Some(b);
    }
    let mut nodes: BTreeMap<usize, Received> = BTreeMap::new();
    nodes.insert(root, root_state);
    for &d in &schedule.destinations {
        nodes.entry(d).or_insert_with(|| Received::new(len));
    }
    // arrived[n][i]: 0 for the root's bytes, s + 1 if byte i first reached
    // n in step s, u32::MAX if never.
    let mut arrived: BTreeMap<usize, Vec<u32>> = nodes
        .keys()
        .map(|&n| (n, vec![if n == root { 0 } else { u32::MAX }; len]))
        .collect();
    let mut rng = SplitMix64::new(order_seed);
    for (step, transfers) in schedule.steps.iter().enumerate() {
        let now = u32::try_from(step).unwrap_or(u32::MAX - 1);
        let mut order: Vec<usize> = (0..transfers.len()).collect();
        rng.shuffle(&mut order);
        for t in order.into_iter().map(|i| &transfers[i]) {
            if t.range.end > len || t.range.is_empty() {
                return Err(CollectiveError::RangeOutOfBounds {
                    step,
                    from: t.from,
                    to: t.to,
                    start: t.range.start,
                    end: t.range.end,
                });
            }
            // Held when the step began?
            let lacking = arrived.get(&t.from).map_or(Some(t.range.start), |a| {
                t.range.clone().find(|&i| a[i] > now)
            });
            if let Some(byte) = lacking {
                return Err(CollectiveError::SendsUnheldData {
                    step,
                    from: t.from,
                    to: t.to,
                    byte,
                });
            }
            let sender = &nodes[&t.from];
            let payload: Vec<(Option<u8>, u32)> = t
                .range
                .clone()
                .map(|i| (sender.bytes[i], sender.hops[i]))
                .collect();
            let receiver = nodes.entry(t.to).or_insert_with(|| Received::new(len));
            let first = arrived.entry(t.to).or_insert_with(|| vec![u32::MAX; len]);
            for (i, (byte, hops)) in t.range.clone().zip(payload) {
                if receiver.times[i] == 0 {
                    receiver.hops[i] = hops + 1;
                }
                receiver.times[i] += 1;
                receiver.bytes[i] = byte;
                first[i] = first[i].min(now + 1);
            }
        }
    }
    nodes.remove(&root);
    Ok(Delivery { nodes })
}
