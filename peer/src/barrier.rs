//! The barrier with delivery guarantee (DESIGN.md, Execution 4), for one job
//! on one peer, as a pure state machine.
//!
//! **Architecture Invariant:** no IO, no clock. The job driver feeds it the
//! frames other peers sent ([`Barrier::on_frame`]) and asks whether barrier
//! `s` has passed; the property tests drive the same code with random
//! interleavings.
//!
//! A remote peer is *present* at barrier `s` when its marker for `s` arrived
//! together with every data frame the marker counts, or when it sent
//! `Finished` at an earlier superstep. Barrier `s` passes when every remote
//! peer is present. Frames of later supersteps (a peer may run one superstep
//! ahead of this one) are buffered until their barrier.

use std::collections::BTreeMap;

use bsp_api::wire::{Frame, WireMessage};

/// A frame that breaks the protocol. The peer that sent it is faulty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BarrierError {
    #[error("unknown remote peer index {0}")]
    UnknownPeer(usize),
    #[error(
        "a {kind} frame for superstep {superstep} arrived after barrier {superstep} had passed"
    )]
    Late { kind: &'static str, superstep: u32 },
    #[error(
        "a {kind} frame for superstep {superstep} arrived while this peer waits for barrier {waiting}; a peer can be at most one superstep ahead"
    )]
    TooEarly {
        kind: &'static str,
        superstep: u32,
        waiting: u32,
    },
    #[error(
        "a {kind} frame for superstep {superstep} arrived after the peer said it finished at superstep {finished}"
    )]
    AfterFinished {
        kind: &'static str,
        superstep: u32,
        finished: u32,
    },
    #[error("a second marker for superstep {0}")]
    DuplicateMarker(u32),
    #[error("more data frames for superstep {superstep} than the {counted} its marker counts")]
    TooManyFrames { superstep: u32, counted: u32 },
    #[error("a {0} frame is not allowed after the handshake")]
    Unexpected(&'static str),
}

#[derive(Debug, Clone, Default)]
struct Remote {
    /// Data frames received, per superstep.
    frames: BTreeMap<u32, u32>,
    /// Marker counts received, per superstep.
    markers: BTreeMap<u32, u32>,
    /// The superstep of its `Finished`, if it sent one.
    finished: Option<u32>,
}

impl Remote {
    fn present_at(&self, s: u32) -> bool {
        if self.finished.is_some_and(|f| f < s) {
            return true;
        }
        match self.markers.get(&s) {
            Some(&k) => self.frames.get(&s).copied().unwrap_or(0) == k,
            None => false,
        }
    }
}

/// The barrier state of one job on one peer.
#[derive(Debug, Clone)]
pub struct Barrier {
    remotes: Vec<Remote>,
    /// The barrier this peer waits for next; every earlier one has been taken.
    next: u32,
    /// Messages received, per superstep in which they were sent.
    messages: BTreeMap<u32, Vec<WireMessage>>,
}

impl Barrier {
    /// A barrier over `remotes` other peers, indexed `0..remotes`, waiting for
    /// barrier 0.
    pub fn new(remotes: usize) -> Self {
        Barrier {
            remotes: vec![Remote::default(); remotes],
            next: 0,
            messages: BTreeMap::new(),
        }
    }

    /// The barrier this peer waits for next.
    pub fn next(&self) -> u32 {
        self.next
    }

    /// Number of remote peers.
    pub fn remotes(&self) -> usize {
        self.remotes.len()
    }

    /// Account for one frame from remote peer `from`. On error the state is
    /// unchanged and the sender is to be treated as faulty.
    pub fn on_frame(&mut self, from: usize, frame: Frame) -> Result<(), BarrierError> {
        let next = self.next;
        let r = self
            .remotes
            .get_mut(from)
            .ok_or(BarrierError::UnknownPeer(from))?;
        let (kind, superstep) = match &frame {
            Frame::Data { superstep, .. } => ("data", *superstep),
            Frame::Marker { superstep, .. } => ("marker", *superstep),
            Frame::Finished { superstep, .. } => ("finished", *superstep),
            Frame::Hello { .. } => return Err(BarrierError::Unexpected("hello")),
            Frame::Welcome => return Err(BarrierError::Unexpected("welcome")),
            Frame::Reject { .. } => return Err(BarrierError::Unexpected("reject")),
        };
        if superstep < next {
            return Err(BarrierError::Late { kind, superstep });
        }
        if superstep > next.saturating_add(1) {
            return Err(BarrierError::TooEarly {
                kind,
                superstep,
                waiting: next,
            });
        }
        if let Some(f) = r.finished {
            // Only late data frames of the finishing superstep may follow `Finished`.
            if superstep > f || !matches!(frame, Frame::Data { .. }) {
                return Err(BarrierError::AfterFinished {
                    kind,
                    superstep,
                    finished: f,
                });
            }
        }
        match frame {
            Frame::Data {
                superstep,
                messages,
            } => {
                let got = r.frames.get(&superstep).copied().unwrap_or(0);
                if let Some(&counted) = r.markers.get(&superstep)
                    && got >= counted
                {
                    return Err(BarrierError::TooManyFrames { superstep, counted });
                }
                r.frames.insert(superstep, got + 1);
                self.messages.entry(superstep).or_default().extend(messages);
            }
            Frame::Marker { superstep, frames } | Frame::Finished { superstep, frames } => {
                if r.markers.contains_key(&superstep) {
                    return Err(BarrierError::DuplicateMarker(superstep));
                }
                let got = r.frames.get(&superstep).copied().unwrap_or(0);
                if got > frames {
                    return Err(BarrierError::TooManyFrames {
                        superstep,
                        counted: frames,
                    });
                }
                r.markers.insert(superstep, frames);
                if kind == "finished" {
                    r.finished = Some(superstep);
                }
            }
            _ => unreachable!("handshake frames were refused above"),
        }
        Ok(())
    }

    /// Whether barrier `s` has passed: every remote peer is present at `s`
    /// (or `s` was already taken).
    pub fn passed(&self, s: u32) -> bool {
        s < self.next || self.remotes.iter().all(|r| r.present_at(s))
    }

    /// If barrier `next()` has passed, take the messages sent in that
    /// superstep (in arrival order) and move on to the next barrier.
    pub fn take(&mut self) -> Option<Vec<WireMessage>> {
        let s = self.next;
        if !self.passed(s) {
            return None;
        }
        for r in &mut self.remotes {
            r.frames.remove(&s);
            r.markers.remove(&s);
        }
        self.next += 1;
        Some(self.messages.remove(&s).unwrap_or_default())
    }

    /// The superstep at which remote peer `from` finished, if it did.
    pub fn finished_at(&self, from: usize) -> Option<u32> {
        self.remotes.get(from).and_then(|r| r.finished)
    }

    /// Whether every remote peer has finished.
    pub fn all_finished(&self) -> bool {
        self.remotes.iter().all(|r| r.finished.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn msg(src: u32, dst: u32, seq: u32) -> WireMessage {
        WireMessage {
            src,
            dst,
            seq,
            payload: vec![src as u8, seq as u8],
        }
    }

    fn data(s: u32, msgs: Vec<WireMessage>) -> Frame {
        Frame::Data {
            superstep: s,
            messages: msgs,
        }
    }

    #[test]
    fn a_peer_without_remotes_passes_every_barrier() {
        let mut b = Barrier::new(0);
        assert!(b.passed(0));
        assert_eq!(b.take(), Some(vec![]));
        assert_eq!(b.next(), 1);
    }

    #[test]
    fn barrier_waits_for_all_counted_frames_even_when_the_marker_comes_first() {
        let mut b = Barrier::new(2);
        b.on_frame(
            0,
            Frame::Marker {
                superstep: 0,
                frames: 1,
            },
        )
        .unwrap();
        b.on_frame(
            1,
            Frame::Marker {
                superstep: 0,
                frames: 0,
            },
        )
        .unwrap();
        assert!(!b.passed(0), "one counted frame is missing");
        assert_eq!(b.take(), None);
        b.on_frame(0, data(0, vec![msg(3, 0, 0)])).unwrap();
        assert!(b.passed(0));
        assert_eq!(b.take(), Some(vec![msg(3, 0, 0)]));
    }

    #[test]
    fn frames_of_the_next_superstep_are_buffered() {
        let mut b = Barrier::new(2);
        b.on_frame(0, data(0, vec![msg(1, 0, 0)])).unwrap();
        b.on_frame(
            0,
            Frame::Marker {
                superstep: 0,
                frames: 1,
            },
        )
        .unwrap();
        // Peer 0 is already in superstep 1.
        b.on_frame(0, data(1, vec![msg(1, 0, 7)])).unwrap();
        b.on_frame(
            0,
            Frame::Marker {
                superstep: 1,
                frames: 1,
            },
        )
        .unwrap();
        assert!(!b.passed(0));
        b.on_frame(
            1,
            Frame::Marker {
                superstep: 0,
                frames: 0,
            },
        )
        .unwrap();
        assert_eq!(b.take(), Some(vec![msg(1, 0, 0)]));
        assert!(!b.passed(1));
        b.on_frame(
            1,
            Frame::Marker {
                superstep: 1,
                frames: 0,
            },
        )
        .unwrap();
        assert_eq!(b.take(), Some(vec![msg(1, 0, 7)]));
    }

    #[test]
    fn a_finished_peer_is_present_at_every_later_barrier() {
        let mut b = Barrier::new(2);
        b.on_frame(
            0,
            Frame::Finished {
                superstep: 0,
                frames: 0,
            },
        )
        .unwrap();
        b.on_frame(
            1,
            Frame::Marker {
                superstep: 0,
                frames: 0,
            },
        )
        .unwrap();
        assert!(b.take().is_some());
        b.on_frame(
            1,
            Frame::Marker {
                superstep: 1,
                frames: 0,
            },
        )
        .unwrap();
        assert!(b.take().is_some());
        assert_eq!(b.finished_at(0), Some(0));
        assert!(!b.all_finished());
        assert!(matches!(
            b.on_frame(
                0,
                Frame::Marker {
                    superstep: 2,
                    frames: 0
                }
            ),
            Err(BarrierError::AfterFinished { .. })
        ));
    }

    #[test]
    fn protocol_violations_are_refused_without_changing_state() {
        let mut b = Barrier::new(1);
        assert_eq!(
            b.on_frame(3, Frame::Welcome),
            Err(BarrierError::UnknownPeer(3))
        );
        assert_eq!(
            b.on_frame(0, Frame::Welcome),
            Err(BarrierError::Unexpected("welcome"))
        );
        assert!(matches!(
            b.on_frame(0, data(2, vec![])),
            Err(BarrierError::TooEarly {
                superstep: 2,
                waiting: 0,
                ..
            })
        ));
        b.on_frame(
            0,
            Frame::Marker {
                superstep: 0,
                frames: 0,
            },
        )
        .unwrap();
        assert_eq!(
            b.on_frame(
                0,
                Frame::Marker {
                    superstep: 0,
                    frames: 0
                }
            ),
            Err(BarrierError::DuplicateMarker(0))
        );
        assert!(matches!(
            b.on_frame(0, data(0, vec![])),
            Err(BarrierError::TooManyFrames {
                superstep: 0,
                counted: 0
            })
        ));
        assert_eq!(b.take(), Some(vec![]));
        assert!(matches!(
            b.on_frame(0, data(0, vec![])),
            Err(BarrierError::Late { superstep: 0, .. })
        ));
    }

    /// The script of one remote peer: per superstep, its data frames (each a
    /// list of destination pids); it finishes after its last superstep.
    #[derive(Debug, Clone)]
    struct Script {
        supersteps: Vec<Vec<Vec<u32>>>,
        finishes: bool,
    }

    fn script() -> impl Strategy<Value = Script> {
        let frame = proptest::collection::vec(0u32..4, 0..4);
        let superstep = proptest::collection::vec(frame, 0..4);
        (proptest::collection::vec(superstep, 1..5), any::<bool>()).prop_map(
            |(supersteps, finishes)| Script {
                supersteps,
                finishes,
            },
        )
    }

    /// Frames of peer `peer`'s script, tagged with their superstep, in one of
    /// many per-superstep orders (a marker may overtake its data frames).
    fn frames_of(peer: u32, s: &Script, total: u32, rotate: &[usize]) -> Vec<(u32, Frame)> {
        let mut out = Vec::new();
        let mut seq = 0;
        let last = s.supersteps.len() as u32 - 1;
        for step in 0..total {
            if s.finishes && step > last {
                break;
            }
            let frames = s.supersteps.get(step as usize).cloned().unwrap_or_default();
            let k = frames.len() as u32;
            let mut these: Vec<Frame> = frames
                .into_iter()
                .map(|dsts| {
                    let msgs = dsts
                        .into_iter()
                        .map(|dst| {
                            seq += 1;
                            msg(peer, dst, seq)
                        })
                        .collect();
                    data(step, msgs)
                })
                .collect();
            let marker = if s.finishes && step == last {
                Frame::Finished {
                    superstep: step,
                    frames: k,
                }
            } else {
                Frame::Marker {
                    superstep: step,
                    frames: k,
                }
            };
            these.push(marker);
            let r = rotate.get(step as usize).copied().unwrap_or(0) % these.len();
            these.rotate_left(r);
            out.extend(these.into_iter().map(|f| (step, f)));
        }
        out
    }

    proptest! {
        /// DESIGN.md, Execution 4: whatever the interleaving, barrier `s`
        /// passes exactly when every message of superstep `s` has arrived, and
        /// yields exactly those messages; nothing early, nothing lost.
        #[test]
        fn barrier_yields_exactly_the_messages_of_each_superstep(
            scripts in proptest::collection::vec(script(), 1..4),
            rotations in proptest::collection::vec(0usize..8, 8),
            choices in proptest::collection::vec(0usize..1000, 0..400),
        ) {
            let total = 5u32;
            let mut streams: Vec<std::collections::VecDeque<(u32, Frame)>> = scripts
                .iter()
                .enumerate()
                .map(|(i, s)| frames_of(i as u32, s, total, &rotations).into())
                .collect();
            // Expected messages per superstep, by peer.
            let mut expected: BTreeMap<u32, Vec<WireMessage>> = BTreeMap::new();
            for stream in &streams {
                for (s, f) in stream {
                    if let Frame::Data { messages, .. } = f {
                        expected.entry(*s).or_default().extend(messages.iter().cloned());
                    }
                }
            }
            let mut b = Barrier::new(scripts.len());
            let mut choice = choices.into_iter();
            loop {
                // Drain every barrier that passed and check its messages.
                while b.passed(b.next()) {
                    let s = b.next();
                    if s >= total {
                        break;
                    }
                    // Nothing early: every frame of `s` has been delivered.
                    for stream in &streams {
                        prop_assert!(stream.iter().all(|(fs, _)| *fs != s),
                            "barrier {} passed with frames of it still in flight", s);
                    }
                    let mut got = b.take().unwrap();
                    let mut want = expected.remove(&s).unwrap_or_default();
                    got.sort_by_key(|m| (m.src, m.seq));
                    want.sort_by_key(|m| (m.src, m.seq));
                    prop_assert_eq!(got, want);
                }
                // Peers may run at most one superstep ahead of this one.
                let window = b.next() + 1;
                let ready: Vec<usize> = (0..streams.len())
                    .filter(|&i| streams[i].front().is_some_and(|(s, _)| *s <= window))
                    .collect();
                if ready.is_empty() {
                    break;
                }
                let pick = ready[choice.next().unwrap_or(0) % ready.len()];
                let (_, f) = streams[pick].pop_front().unwrap();
                prop_assert_eq!(b.on_frame(pick, f), Ok(()));
            }
            // Nothing lost: every superstep passed and all its messages came out.
            prop_assert!(b.next() >= total, "stuck at barrier {}", b.next());
            prop_assert!(expected.is_empty(), "messages never delivered: {:?}", expected);
            prop_assert_eq!(b.all_finished(), scripts.iter().all(|s| s.finishes));
        }
    }
}
