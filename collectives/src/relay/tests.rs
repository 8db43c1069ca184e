//! The data-driven [`Relay`] against the step semantics of the schedules:
//! every node's relay is run on real bytes, each released transfer is cut
//! into frames delivered in a seeded random order (interleaved with all
//! other frames, some overlapping), and the outcome must be what
//! [`execute`] promises — every destination holds the data — with every
//! transfer of the schedule sent exactly once, by its sender, only once
//! the sender held its bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use proptest::prelude::*;
use proptest::sample::Index;

use crate::rng::SplitMix64;
use crate::tests::bytes;
use crate::*;

/// All nodes of a schedule, run by their relays over an in-memory network
/// that reorders frames.
struct Net<'a> {
    schedule: &'a Schedule,
    relays: BTreeMap<usize, Relay>,
    /// Each node's buffer.
    bufs: BTreeMap<usize, Vec<u8>>,
    /// Which bytes actually reached each node (independent of the relay's
    /// own bookkeeping).
    got: BTreeMap<usize, Vec<bool>>,
    /// Every transfer released, in release order.
    released: Vec<Transfer>,
    /// Frames in flight: receiver, bytes range, the bytes.
    frames: Vec<(usize, Range<usize>, Vec<u8>)>,
    rng: SplitMix64,
}

impl<'a> Net<'a> {
    fn new(schedule: &'a Schedule, data: &[u8], seed: u64) -> Self {
        let mut ids: BTreeSet<usize> = schedule.destinations.iter().copied().collect();
        ids.insert(schedule.root);
        for (_, t) in schedule.transfers() {
            ids.extend([t.from, t.to]);
        }
        let mut net = Self {
            schedule,
            relays: BTreeMap::new(),
            bufs: BTreeMap::new(),
            got: BTreeMap::new(),
            released: Vec::new(),
            frames: Vec::new(),
            rng: SplitMix64::new(seed),
        };
        for id in ids {
            let root = id == schedule.root;
            let relay = Relay::new(schedule, id).expect("every node of the schedule has a relay");
            net.relays.insert(id, relay);
            net.bufs.insert(
                id,
                if root {
                    data.to_vec()
                } else {
                    vec![0; data.len()]
                },
            );
            net.got.insert(id, vec![root; data.len()]);
        }
        net
    }

    /// Sends what `from` released: checks it may, then cuts each transfer
    /// into 1–4 frames and sometimes adds an overlapping duplicate.
    fn send(&mut self, from: usize, transfers: Vec<Transfer>) -> Result<(), TestCaseError> {
        for t in transfers {
            prop_assert_eq!(t.from, from, "{:?} released by another node", t);
            let r = t.range.clone();
            prop_assert!(
                self.got[&from][r.clone()].iter().all(|&g| g),
                "{:?} released before {} held its bytes",
                t,
                from
            );
            let mut cuts: Vec<usize> = (0..self.rng.below(4))
                .filter(|_| r.len() > 1)
                .map(|_| r.start + 1 + self.rng.below(r.len() - 1))
                .collect();
            cuts.extend([r.start, r.end]);
            cuts.sort_unstable();
            cuts.dedup();
            let mut parts: Vec<Range<usize>> = cuts.windows(2).map(|w| w[0]..w[1]).collect();
            if !r.is_empty() && self.rng.below(4) == 0 {
                let x = r.start + self.rng.below(r.len());
                let y = x + 1 + self.rng.below(r.end - x);
                parts.push(x..y);
            }
            for part in parts {
                let frame = self.bufs[&from][part.clone()].to_vec();
                self.frames.push((t.to, part, frame));
            }
            self.released.push(t);
        }
        Ok(())
    }

    /// Starts every relay, then delivers frames in random order until none
    /// is left.
    fn run(&mut self) -> Result<(), TestCaseError> {
        let ids: Vec<usize> = self.relays.keys().copied().collect();
        for id in ids {
            let ready = self.relays.get_mut(&id).expect("relay").start();
            self.send(id, ready)?;
        }
        while !self.frames.is_empty() {
            let k = self.rng.below(self.frames.len());
            let (to, range, frame) = self.frames.swap_remove(k);
            self.bufs.get_mut(&to).expect("buffer")[range.clone()].copy_from_slice(&frame);
            self.got.get_mut(&to).expect("got")[range.clone()].fill(true);
            let ready = self
                .relays
                .get_mut(&to)
                .expect("relay")
                .on_bytes(range)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            self.send(to, ready)?;
        }
        Ok(())
    }

    /// The checks of the module docs.
    fn check(&self, data: &[u8]) -> Result<(), TestCaseError> {
        let key = |t: &Transfer| (t.from, t.to, t.range.start, t.range.end);
        let mut want: Vec<_> = self.schedule.transfers().map(|(_, t)| key(t)).collect();
        let mut sent: Vec<_> = self.released.iter().map(key).collect();
        want.sort_unstable();
        sent.sort_unstable();
        prop_assert_eq!(sent, want, "each transfer released exactly once");
        for d in &self.schedule.destinations {
            prop_assert!(self.relays[d].complete(), "destination {} incomplete", d);
            prop_assert!(self.bufs[d] == data, "destination {} has other bytes", d);
        }
        for (id, relay) in &self.relays {
            prop_assert_eq!(relay.pending(), 0);
            // The relay's bookkeeping matches what arrived.
            let got = &self.got[id];
            let mut runs = Vec::new();
            let mut i = 0;
            while i < got.len() {
                let j = (i..got.len()).find(|&j| !got[j]).unwrap_or(got.len());
                if j > i {
                    runs.push(i..j);
                }
                i = j + 1;
            }
            prop_assert_eq!(relay.held(), runs, "node {} held", id);
        }
        Ok(())
    }
}

/// Every schedule kind the peer runs, for `nodes`, `root` and `len`.
fn schedules(
    nodes: usize,
    root: usize,
    len: usize,
    chunk: usize,
    small_message_max: usize,
    single: bool,
) -> Vec<(&'static str, Schedule)> {
    let small = if single {
        SmallMessage::SingleStep
    } else {
        SmallMessage::Binomial
    };
    // At most about 2000 chunks, so a case stays fast.
    let chunk = chunk.max(len / 2000).max(1);
    vec![
        ("flat", flat_tree(nodes, root, len).expect("flat")),
        (
            "binomial",
            binomial_tree(nodes, root, len).expect("binomial"),
        ),
        (
            "chain",
            pipelined_chain(nodes, root, len, chunk).expect("chain"),
        ),
        (
            "symmetric",
            symmetric(
                nodes,
                root,
                len,
                SymmetricConfig {
                    small_message_max,
                    small,
                },
            )
            .expect("symmetric"),
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Data-driven execution delivers what the step semantics deliver: every
    /// destination ends complete with the source's bytes, every transfer
    /// is released exactly once by its sender and never before the sender
    /// holds its range, whatever the order and framing of arrivals.
    #[test]
    fn relay_runs_every_schedule_data_driven_in_any_arrival_order(
        nodes in 2usize..20,
        root in any::<Index>(),
        len in prop_oneof![0usize..=3, 0usize..2_000, 0usize..=200_000],
        chunk in 1usize..5_000,
        small_message_max in prop_oneof![Just(0usize), Just(JUHASZ_SMALL_MESSAGE_MAX), 0usize..300_000],
        single in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let root = root.index(nodes);
        let data = bytes(len, seed);
        for (kind, schedule) in schedules(nodes, root, len, chunk, small_message_max, single) {
            let mut net = Net::new(&schedule, &data, seed ^ 0x5eed);
            net.run().map_err(|e| TestCaseError::fail(format!("{kind}: {e}")))?;
            net.check(&data).map_err(|e| TestCaseError::fail(format!("{kind}: {e}")))?;
        }
    }

    /// Arrivals that are empty or reach beyond the data are rejected and
    /// change nothing; any valid arrival keeps the held set disjoint,
    /// sorted and non-adjacent, with `complete` exactly when it is `0..len`.
    #[test]
    fn relay_keeps_a_merged_byte_set_and_rejects_bad_ranges(
        len in 1usize..300,
        arrivals in prop::collection::vec((0usize..320, 0usize..320), 0..60),
    ) {
        // Node 1 of a 4-node binomial tree forwards everything to node 3.
        let schedule = binomial_tree(4, 0, len).expect("binomial");
        let mut relay = Relay::new(&schedule, 1).expect("relay");
        let mut model = vec![false; len];
        for (a, b) in arrivals {
            let before = relay.clone();
            match relay.on_bytes(a..b) {
                Ok(ready) => {
                    prop_assert!(a < b && b <= len);
                    model[a..b].fill(true);
                    prop_assert_eq!(!ready.is_empty(), !before.complete() && relay.complete());
                }
                Err(e) => {
                    prop_assert!(a >= b || b > len, "{}", e);
                    prop_assert_eq!(&relay, &before);
                }
            }
            let held = relay.held();
            prop_assert!(held.iter().all(|r| !r.is_empty()));
            prop_assert!(held.windows(2).all(|w| w[0].end < w[1].start));
            let covered: usize = held.iter().map(ExactSizeIterator::len).sum();
            prop_assert_eq!(covered, model.iter().filter(|&&m| m).count());
            prop_assert!(held.iter().all(|r| model[r.clone()].iter().all(|&m| m)));
            prop_assert_eq!(relay.complete(), model.iter().all(|&m| m));
        }
    }
}

/// A length-0 broadcast needs no transfer: every node is complete at once,
/// and no byte range is valid.
#[test]
fn relay_of_an_empty_broadcast_is_complete_at_once() {
    for (kind, schedule) in schedules(5, 2, 0, 1, 0, false) {
        assert_eq!(schedule.message_count(), 0, "{kind}");
        for me in 0..5 {
            let mut relay = Relay::new(&schedule, me).expect("relay");
            assert!(relay.complete() && relay.pending() == 0, "{kind} {me}");
            assert!(relay.start().is_empty());
            let before = relay.clone();
            assert_eq!(
                relay.on_bytes(0..1),
                Err(CollectiveError::BytesOutOfRange {
                    start: 0,
                    end: 1,
                    len: 0
                })
            );
            assert_eq!(
                relay.on_bytes(0..0),
                Err(CollectiveError::EmptyByteRange { start: 0, end: 0 })
            );
            assert_eq!(relay, before);
        }
    }
}

#[test]
fn relay_rejects_empty_and_out_of_range_bytes_without_changing_state() {
    let schedule = pipelined_chain(4, 0, 100, 10).expect("chain");
    let mut relay = Relay::new(&schedule, 1).expect("relay");
    assert!(relay.start().is_empty());
    assert_eq!(relay.on_bytes(0..15).expect("valid").len(), 1);
    let before = relay.clone();
    let (seven, three) = (7, 3);
    assert_eq!(
        relay.on_bytes(seven..three),
        Err(CollectiveError::EmptyByteRange { start: 7, end: 3 })
    );
    assert_eq!(
        relay.on_bytes(50..50),
        Err(CollectiveError::EmptyByteRange { start: 50, end: 50 })
    );
    assert_eq!(
        relay.on_bytes(95..101),
        Err(CollectiveError::BytesOutOfRange {
            start: 95,
            end: 101,
            len: 100
        })
    );
    assert_eq!(relay, before);
    assert_eq!(relay.held(), vec![0..15]);
    assert_eq!(relay.pending(), 9);
}

#[test]
fn relay_rejects_nodes_outside_the_schedule_and_transfers_outside_the_data() {
    let schedule = flat_tree(3, 0, 10).expect("flat");
    assert_eq!(
        Relay::new(&schedule, 7),
        Err(CollectiveError::NotInSchedule(7))
    );
    let mut bad = schedule.clone();
    bad.steps[1][0].range = 5..11;
    assert_eq!(
        Relay::new(&bad, 0),
        Err(CollectiveError::RangeOutOfBounds {
            step: 1,
            from: 0,
            to: 2,
            start: 5,
            end: 11
        })
    );
    // Another node's bad transfer is not this node's concern.
    assert!(Relay::new(&bad, 1).is_ok());
}

/// The root holds everything, so it releases all its transfers at once, in
/// schedule order (the binomial tree's step 0 first).
#[test]
fn relay_root_releases_all_its_transfers_in_schedule_order() {
    let schedule = binomial_tree(8, 3, 1000).expect("binomial");
    let mut relay = Relay::new(&schedule, 3).expect("relay");
    let to: Vec<usize> = relay.start().iter().map(|t| t.to).collect();
    assert_eq!(to, vec![4, 5, 7]);
    assert!(relay.start().is_empty());
    assert_eq!(relay.on_bytes(0..1000), Ok(Vec::new()));
}

/// Juhász §3's overlap of the phases: a destination forwards its piece to
/// every other destination as soon as it has it, whatever else is missing.
#[test]
fn relay_symmetric_destination_forwards_its_piece_when_whole() {
    let schedule = symmetric(5, 0, 8000, SymmetricConfig::default()).expect("symmetric");
    let mut relay = Relay::new(&schedule, 2).expect("relay");
    // Destination 2 is the second of four: piece 2000..4000.
    assert!(relay.on_bytes(2000..3999).expect("valid").is_empty());
    assert!(relay.on_bytes(6000..8000).expect("valid").is_empty());
    let out = relay.on_bytes(3999..4000).expect("valid");
    let to: Vec<usize> = out.iter().map(|t| t.to).collect();
    assert_eq!(to, vec![1, 3, 4]);
    assert!(out.iter().all(|t| t.range == (2000..4000)));
    assert!(!relay.complete());
}

/// Releasing looks only at transfers that could have become sendable: a
/// chain node with 100 000 one-byte chunks, fed byte by byte, releases one
/// transfer per byte (quadratic work would take minutes here).
#[test]
fn relay_releases_thousands_of_chunks_without_rescanning() {
    let len = 100_000;
    let schedule = pipelined_chain(3, 0, len, 1).expect("chain");
    let mut relay = Relay::new(&schedule, 1).expect("relay");
    assert_eq!(relay.pending(), len);
    for i in 0..len {
        let out = relay.on_bytes(i..i + 1).expect("valid");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].range, i..i + 1);
    }
    // Chunks of 10 fed backwards, one byte at a time: each chunk leaves
    // when its first byte, the last to arrive, does.
    let schedule = pipelined_chain(3, 0, len, 10).expect("chain");
    let mut relay = Relay::new(&schedule, 1).expect("relay");
    for i in (0..len).rev() {
        let out = relay.on_bytes(i..i + 1).expect("valid");
        if i % 10 == 0 {
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].range, i..(i + 10).min(len));
        } else {
            assert!(out.is_empty());
        }
    }
    assert!(relay.complete() && relay.pending() == 0);
    assert_eq!(relay.held(), vec![0..len]);
}
