//! The process model: a deterministic state function in place of wasm, the
//! direct BSP model of the same processes (the failure-free output), and
//! the simulator's random numbers.

use super::*;

/// SplitMix64: the simulator's only source of choices.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// True with probability `num / den`.
    pub(crate) fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next() % den < num
    }
}

pub(super) fn mix(a: u64, b: u64) -> u64 {
    let mut r = Rng::new(a ^ b.rotate_left(17) ^ 0x5151_5151);
    r.next()
}

/// The process model: a deterministic state function of its inbox. Each
/// superstep it folds the messages it got into its state, writes one output
/// line, and sends every other process one message (none in the last).
#[derive(Debug, Clone)]
pub(crate) struct FakeGuest {
    pub(super) pid: Pid,
    pub(super) nprocs: u32,
    /// The superstep it returns in.
    pub(super) last: u32,
    pub(super) superstep: u32,
    pub(super) acc: u64,
    pub(super) output_seq: u64,
    pub(super) output_mark: u64,
    pub(super) inbox: Vec<Message>,
    /// Every superstep's messages share one payload (a `send_range`, which
    /// may be relayed).
    pub(super) shared: bool,
}

/// What a superstep of the model gives: whether it returned, the output
/// line, the messages.
pub(super) struct Step {
    pub(super) exited: bool,
    pub(super) line: String,
    pub(super) out: Vec<crate::runtime::Outgoing>,
    /// What was wrong with its inbox, if anything.
    pub(super) wrong: Option<String>,
}

impl FakeGuest {
    pub(super) fn new(pid: Pid, nprocs: u32, last: u32, shared: bool) -> FakeGuest {
        FakeGuest {
            pid,
            nprocs,
            last,
            superstep: 0,
            acc: mix(u64::from(pid), 7),
            output_seq: 0,
            output_mark: 0,
            inbox: Vec::new(),
            shared,
        }
    }

    /// Back from a snapshot it took.
    pub(super) fn restored(s: &Snapshot, nprocs: u32, last: u32, shared: bool) -> FakeGuest {
        let word = |i: usize| u64::from_le_bytes(s.memory[i * 8..i * 8 + 8].try_into().unwrap());
        FakeGuest {
            pid: s.pid,
            nprocs,
            last,
            superstep: s.superstep,
            acc: word(0),
            output_seq: s.output_seq,
            output_mark: 0,
            inbox: Vec::new(),
            shared,
        }
    }

    /// Its linear memory: the state in page 0, and a page that changes
    /// every other superstep (so checkpoints are deltas of one or two
    /// pages): 64 bytes of it, and the low byte of each of 1 024 words
    /// whose high bytes stay (so its patches are XOR-packed).
    pub(super) fn memory(&self) -> Vec<u8> {
        let mut m = vec![0u8; 2 * PAGE_SIZE];
        m[0..8].copy_from_slice(&self.acc.to_le_bytes());
        m[8..16].copy_from_slice(&self.output_seq.to_le_bytes());
        let r = mix(self.acc, u64::from(self.superstep / 2));
        let fill = (r & 0xff) as u8;
        m[PAGE_SIZE..PAGE_SIZE + 64].fill(fill.max(1));
        let words = m[PAGE_SIZE + 8192..PAGE_SIZE + 16384].chunks_exact_mut(8);
        for (i, w) in words.enumerate() {
            let low = r.rotate_left(i as u32) & 0xff;
            w.copy_from_slice(&(0x5a5a_5a5a_5a5a_5a00 | low).to_le_bytes());
        }
        m
    }

    /// Its current superstep, as the model computes it.
    pub(super) fn step(&mut self) -> Step {
        let s = self.superstep;
        let mut wrong = None;
        if s > 0 {
            let mut from: Vec<Pid> = self.inbox.iter().map(|m| m.src).collect();
            from.sort_unstable();
            let expected: Vec<Pid> = (0..self.nprocs).filter(|&p| p != self.pid).collect();
            if from != expected || self.inbox.iter().any(|m| m.superstep != s - 1) {
                wrong = Some(format!(
                    "pid {} in superstep {s} got messages from {from:?} (supersteps {:?}), not one from each of {expected:?} sent in {}",
                    self.pid,
                    self.inbox.iter().map(|m| m.superstep).collect::<Vec<_>>(),
                    s - 1
                ));
            }
        }
        self.acc = fold(
            self.acc,
            s,
            self.inbox.iter().map(|m| (m.src, &m.payload[..])),
        );
        let line = format!("{} {s} {:016x}\n", self.pid, self.acc);
        let exited = s >= self.last;
        let one = Bytes::from(payload(self.acc, Pid::MAX));
        let out = if exited {
            Vec::new()
        } else {
            (0..self.nprocs)
                .filter(|&d| d != self.pid)
                .enumerate()
                .map(|(i, dst)| crate::runtime::Outgoing {
                    dst,
                    seq: i as u32,
                    tag: 0,
                    payload: if self.shared {
                        one.clone()
                    } else {
                        Bytes::from(payload(self.acc, dst))
                    },
                })
                .collect()
        };
        Step {
            exited,
            line,
            out,
            wrong,
        }
    }
}

/// The state after superstep `s` with these messages (by sender).
pub(super) fn fold<'a>(acc: u64, s: u32, inbox: impl Iterator<Item = (Pid, &'a [u8])>) -> u64 {
    let mut sorted: Vec<(Pid, &[u8])> = inbox.collect();
    sorted.sort();
    let mut acc = mix(acc, u64::from(s));
    for (src, p) in sorted {
        let word = u64::from_le_bytes(p[..8].try_into().unwrap_or([0; 8]));
        acc = mix(acc, word ^ u64::from(src));
    }
    acc
}

/// A message's payload: a word that depends on the state and the
/// destination, then filler to 4 KiB, so that a checkpoint's retained
/// messages are patches of the same sends a superstep before (what
/// `checkpoint::patch` does for PageRank's contributions).
pub(super) fn payload(acc: u64, dst: Pid) -> Vec<u8> {
    let mut v = mix(acc, u64::from(dst) + 1).to_le_bytes().to_vec();
    v.resize(4 << 10, dst as u8);
    v
}

/// The failure-free output of `nprocs` model processes: each one's lines.
pub(super) fn reference(nprocs: u32, last: u32, shared: bool) -> Vec<Vec<String>> {
    let mut acc: Vec<u64> = (0..nprocs).map(|p| mix(u64::from(p), 7)).collect();
    let mut lines = vec![Vec::new(); nprocs as usize];
    let mut inbox: Vec<Vec<(Pid, Vec<u8>)>> = vec![Vec::new(); nprocs as usize];
    for s in 0..=last {
        let mut next: Vec<Vec<(Pid, Vec<u8>)>> = vec![Vec::new(); nprocs as usize];
        for p in 0..nprocs {
            let i = p as usize;
            acc[i] = fold(acc[i], s, inbox[i].iter().map(|(src, b)| (*src, &b[..])));
            lines[i].push(format!("{p} {s} {:016x}\n", acc[i]));
            if s < last {
                for d in (0..nprocs).filter(|&d| d != p) {
                    let to = if shared { Pid::MAX } else { d };
                    next[d as usize].push((p, payload(acc[i], to)));
                }
            }
        }
        inbox = next;
    }
    lines
}

impl Guest for FakeGuest {
    fn begin_superstep(&mut self, superstep: u32, inbox: Vec<Message>) {
        self.superstep = superstep;
        self.inbox = inbox;
    }

    fn output_mark(&self) -> u64 {
        self.output_mark
    }

    fn checkpoint(
        &mut self,
        tracker: &mut PageTracker,
        outbox: Vec<WireMessage>,
        exited: bool,
        reuse: Option<Snapshot>,
    ) -> Snapshot {
        let head = Snapshot {
            output_seq: self.output_seq,
            exited,
            outbox,
            ..Snapshot::head(self.pid, self.superstep)
        };
        let memory = self.memory();
        match reuse {
            Some(previous) => tracker.capture_reusing(head, &memory, previous),
            None => tracker.capture(head, &memory),
        }
    }
}
