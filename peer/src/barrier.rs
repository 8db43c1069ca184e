//! The process-level barrier with delivery guarantee (docs/fault-tolerance.md),
//! for one job on one peer, as a pure state machine.
//!
//! **Architecture Invariant:** no IO, no clock. The job driver feeds it every
//! message and every `Done` that reaches this peer — from other peers and
//! from its own processes — and asks whether a local process may pass its
//! barrier; the property tests drive the same code with random interleavings,
//! repeats and re-sends.
//!
//! Process `p` may pass barrier `s` once, for every process `q` of the job,
//! either `q` exited before `s`, or `Done(q, s)` is here and so are all the
//! messages it counts from `q` to `p`. Who sent a message or a `Done` does not
//! matter, so a process restored on another peer, or a peer re-sending what
//! it retained, fits in without special cases: repeats are dropped by
//! `(src, superstep, seq)`.
//!
//! With redundancy (a quorum of `r > 1`), every process runs on `r` peers
//! and each of them sends everything the process sends. A message, a `Done`
//! or a `Done`'s state digest is *taken* only once `r` different peers sent
//! identical copies of it; until then it does not count. Copies that differ
//! are a [`Dispute`] for the driver to report: before a quorum (a third run
//! must decide), or against the version taken (the sender was outvoted).
//! Who sent a copy now matters, but only as a peer: a copy's sender is
//! whoever sent it (a restored copy's new host counts as a new voice).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bsp_api::wire::{ProcDone, WireMessage};
use bsp_api::{PeerId, Pid};
use bytes::Bytes;

/// A message or `Done` that breaks the protocol. The peer that sent it is faulty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BarrierError {
    #[error("pid {pid} does not exist in a job of {nprocs} processes")]
    NoSuchPid { pid: Pid, nprocs: u32 },
    #[error(
        "pid {src} sent more than {limit} bytes of messages in superstep {superstep}, more than a process may send"
    )]
    TooMuchData {
        src: Pid,
        superstep: u32,
        limit: usize,
    },
    #[error("two different reports that pid {pid} finished superstep {superstep}")]
    ConflictingDone { pid: Pid, superstep: u32 },
    #[error(
        "a message from pid {src} (superstep {superstep}, number {seq}) differs from an earlier copy"
    )]
    ConflictingMessage { src: Pid, superstep: u32, seq: u32 },
    #[error(
        "pid {pid} is reported done with superstep {superstep} after it exited in superstep {exited}"
    )]
    AfterExit {
        pid: Pid,
        superstep: u32,
        exited: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct DoneRec {
    exited: bool,
    counts: BTreeMap<Pid, u32>,
}

/// Copies of one result from different peers that differ (redundancy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispute {
    /// The process whose result it is.
    pub pid: Pid,
    /// The superstep it belongs to.
    pub superstep: u32,
    /// The peers that sent each version, largest group first. A group of
    /// at least the quorum is the version taken: the others were outvoted.
    pub groups: Vec<Vec<PeerId>>,
    /// Which result, for people ("its message 3 to pid 1").
    pub what: String,
}

/// The versions of one result and who sent each.
type Versions<T> = Vec<(T, BTreeSet<PeerId>)>;

/// The versions of one result, and whether a dispute about it was reported.
type Ballot<T> = (Versions<T>, bool);

/// A message's key among the votes: `(dst, superstep, src, seq)`.
type MessageKey = (Pid, u32, Pid, u32);

/// What a copy's arrival did to its result's votes.
enum Vote {
    /// Not taken yet.
    Open,
    /// This copy completed the quorum: take it.
    Taken,
    /// A repeat, or a copy of a result taken before.
    Old,
}

/// Add `from`'s copy `v` to `versions`; `label` describes the result for a
/// dispute. Disputes go to `out`.
fn vote<T: PartialEq>(
    versions: &mut Versions<T>,
    v: T,
    from: PeerId,
    quorum: usize,
    reported: &mut bool,
    dispute: impl FnOnce(Vec<Vec<PeerId>>) -> Dispute,
    out: &mut Vec<Dispute>,
) -> Vote {
    let i = match versions.iter().position(|(x, _)| *x == v) {
        Some(i) => i,
        None => {
            versions.push((v, BTreeSet::new()));
            versions.len() - 1
        }
    };
    let was_taken = versions.iter().any(|(_, by)| by.len() >= quorum);
    let new = versions[i].1.insert(from);
    let taken = versions[i].1.len() >= quorum;
    let outcome = match (was_taken, taken && new) {
        (false, true) => Vote::Taken,
        (false, false) => Vote::Open,
        (true, _) => Vote::Old,
    };
    // A dispute once there are two versions, again when a quorum outvotes
    // someone (the supernode acts on that one).
    let decided = matches!(outcome, Vote::Taken);
    if versions.len() > 1 && (!*reported || decided || (was_taken && new && !taken)) {
        *reported = true;
        let mut groups: Vec<Vec<PeerId>> = versions
            .iter()
            .map(|(_, by)| by.iter().copied().collect())
            .collect();
        groups.sort_by_key(|g: &Vec<PeerId>| std::cmp::Reverse(g.len()));
        out.push(dispute(groups));
    }
    outcome
}

/// The votes of a barrier with redundancy.
#[derive(Debug, Default, Clone)]
struct Votes {
    /// `(dst, superstep, src, seq)` → versions of `(tag, payload)`, and
    /// whether a dispute was reported.
    messages: BTreeMap<MessageKey, Ballot<(u32, Bytes)>>,
    /// `(superstep, pid)` → versions of the `Done` (its digest apart).
    dones: BTreeMap<(u32, Pid), Ballot<DoneRec>>,
    /// `(pid, superstep)` → versions of the state digest.
    digests: BTreeMap<(Pid, u32), Ballot<[u8; 32]>>,
    /// Payload bytes of copies not taken, per `(src, superstep, sender)`.
    bytes: HashMap<(Pid, u32, PeerId), usize>,
    /// Disputes not yet handed to the driver.
    disputes: Vec<Dispute>,
}

/// The messages to one process of one superstep: `(src, seq)` → `(tag,
/// payload)`.
type Received = BTreeMap<(Pid, u32), (u32, Bytes)>;

/// The barrier state of one job on one peer.
#[derive(Debug, Clone)]
pub struct Barrier {
    nprocs: u32,
    /// Bytes one process may send in one superstep.
    limit: usize,
    /// `Done` records: superstep → pid → record.
    done: BTreeMap<u32, BTreeMap<Pid, DoneRec>>,
    /// pid → the superstep in which it exited.
    exited: BTreeMap<Pid, u32>,
    /// Messages to read: (dst, superstep sent) → (src, seq) → payload.
    /// `(dst, superstep)` → `(src, seq)` → `(tag, payload)`.
    messages: BTreeMap<(Pid, u32), Received>,
    /// Message bytes accepted per (src, superstep).
    bytes: HashMap<(Pid, u32), usize>,
    /// Messages to `dst` sent before `floor[dst]` are no longer wanted.
    floor: HashMap<Pid, u32>,
    /// `Done` records before this superstep have been forgotten.
    forgotten: u32,
    /// Identical copies from this many peers make a result count (the
    /// job's redundancy; 1: every copy counts).
    quorum: usize,
    votes: Votes,
}

impl Barrier {
    /// A barrier for a job of `nprocs` processes, each of which may send at
    /// most `limit` bytes of messages per superstep.
    pub fn new(nprocs: u32, limit: usize) -> Self {
        Barrier {
            nprocs,
            limit,
            done: BTreeMap::new(),
            exited: BTreeMap::new(),
            messages: BTreeMap::new(),
            bytes: HashMap::new(),
            floor: HashMap::new(),
            forgotten: 0,
            quorum: 1,
            votes: Votes::default(),
        }
    }

    /// A barrier for a job whose processes run in `quorum` copies: a
    /// result counts once that many peers sent identical copies of it.
    pub fn with_quorum(nprocs: u32, limit: usize, quorum: usize) -> Self {
        Barrier {
            quorum: quorum.max(1),
            ..Barrier::new(nprocs, limit)
        }
    }

    /// The disputes found since the last call (redundancy).
    pub fn take_disputes(&mut self) -> Vec<Dispute> {
        std::mem::take(&mut self.votes.disputes)
    }

    /// The state digest of `pid` at the end of `superstep` that a quorum
    /// of its copies agreed on, if they did.
    pub fn agreed_digest(&self, pid: Pid, superstep: u32) -> Option<[u8; 32]> {
        let (versions, _) = self.votes.digests.get(&(pid, superstep))?;
        versions
            .iter()
            .find(|(_, by)| by.len() >= self.quorum)
            .map(|(d, _)| *d)
    }

    /// A copy of a message from peer `from` (redundancy: it counts once a
    /// quorum of peers sent the same). Returns whether it was taken now.
    pub fn on_message_from(&mut self, m: WireMessage, from: PeerId) -> Result<bool, BarrierError> {
        if self.quorum <= 1 {
            return self.on_message(m);
        }
        self.check_pid(m.src)?;
        self.check_pid(m.dst)?;
        if self.floor.get(&m.dst).is_some_and(|&f| m.superstep < f) || m.superstep < self.forgotten
        {
            return Ok(false);
        }
        let key = (m.dst, m.superstep, m.src, m.seq);
        if !self.votes.messages.contains_key(&key) {
            // Taken before (and its votes dropped): only a repeat is fine.
            if let Some(old) = self
                .messages
                .get(&(m.dst, m.superstep))
                .and_then(|b| b.get(&(m.src, m.seq)))
            {
                if old.0 != m.tag || old.1[..] != m.payload[..] {
                    self.votes.disputes.push(Dispute {
                        pid: m.src,
                        superstep: m.superstep,
                        groups: vec![Vec::new(), vec![from]],
                        what: format!("its message {} to pid {}", m.seq, m.dst),
                    });
                }
                return Ok(false);
            }
        }
        let used = self
            .votes
            .bytes
            .entry((m.src, m.superstep, from))
            .or_default();
        let total = used.saturating_add(m.payload.len());
        if total > self.limit {
            return Err(BarrierError::TooMuchData {
                src: m.src,
                superstep: m.superstep,
                limit: self.limit,
            });
        }
        *used = total;
        let (versions, reported) = self.votes.messages.entry(key).or_default();
        let what = format!("its message {} to pid {}", m.seq, m.dst);
        let (src, superstep) = (m.src, m.superstep);
        let outcome = vote(
            versions,
            (m.tag, m.payload),
            from,
            self.quorum,
            reported,
            |groups| Dispute {
                pid: src,
                superstep,
                groups,
                what,
            },
            &mut self.votes.disputes,
        );
        match outcome {
            Vote::Taken => {
                let (tag, payload) = versions
                    .iter()
                    .find(|(_, by)| by.len() >= self.quorum)
                    .map(|(v, _)| v.clone())
                    .expect("a version was just taken");
                let m = WireMessage {
                    src,
                    dst: key.0,
                    superstep,
                    seq: key.3,
                    tag,
                    payload,
                };
                // Byte counts per sender stay until the superstep is
                // forgotten: a peer's share is bounded either way.
                self.on_message(m)
            }
            Vote::Open | Vote::Old => Ok(false),
        }
    }

    /// A copy of a `Done` from peer `from` (redundancy: it counts once a
    /// quorum of peers sent the same; its digest is voted on apart).
    pub fn on_done_from(
        &mut self,
        superstep: u32,
        d: ProcDone,
        from: PeerId,
    ) -> Result<(), BarrierError> {
        if self.quorum <= 1 {
            return self.on_done(superstep, d);
        }
        self.check_pid(d.pid)?;
        for &(dst, _) in &d.counts {
            self.check_pid(dst)?;
        }
        if superstep < self.forgotten {
            return Ok(());
        }
        let pid = d.pid;
        if let Some(digest) = d.digest {
            let (versions, reported) = self.votes.digests.entry((pid, superstep)).or_default();
            vote(
                versions,
                digest,
                from,
                self.quorum,
                reported,
                |groups| Dispute {
                    pid,
                    superstep,
                    groups,
                    what: "its state at the end of the superstep".to_string(),
                },
                &mut self.votes.disputes,
            );
        }
        let rec = DoneRec {
            exited: d.exited,
            counts: d.counts.iter().copied().filter(|&(_, n)| n > 0).collect(),
        };
        let (versions, reported) = self.votes.dones.entry((superstep, pid)).or_default();
        let outcome = vote(
            versions,
            rec,
            from,
            self.quorum,
            reported,
            |groups| Dispute {
                pid,
                superstep,
                groups,
                what: "what it sent in the superstep (its Done)".to_string(),
            },
            &mut self.votes.disputes,
        );
        match outcome {
            Vote::Taken => self.on_done(superstep, d),
            Vote::Open | Vote::Old => Ok(()),
        }
    }

    fn check_pid(&self, pid: Pid) -> Result<(), BarrierError> {
        if pid < self.nprocs {
            Ok(())
        } else {
            Err(BarrierError::NoSuchPid {
                pid,
                nprocs: self.nprocs,
            })
        }
    }

    /// Take one message. Returns whether it was new (not a repeat and still
    /// wanted). On error nothing changed.
    pub fn on_message(&mut self, m: WireMessage) -> Result<bool, BarrierError> {
        self.check_pid(m.src)?;
        self.check_pid(m.dst)?;
        if self.floor.get(&m.dst).is_some_and(|&f| m.superstep < f) {
            return Ok(false);
        }
        let key = (m.src, m.seq);
        if let Some(old) = self
            .messages
            .get(&(m.dst, m.superstep))
            .and_then(|b| b.get(&key))
        {
            return if old.0 == m.tag && old.1[..] == m.payload[..] {
                Ok(false)
            } else {
                Err(BarrierError::ConflictingMessage {
                    src: m.src,
                    superstep: m.superstep,
                    seq: m.seq,
                })
            };
        }
        let used = self.bytes.entry((m.src, m.superstep)).or_default();
        let total = used.saturating_add(m.payload.len());
        if total > self.limit {
            return Err(BarrierError::TooMuchData {
                src: m.src,
                superstep: m.superstep,
                limit: self.limit,
            });
        }
        *used = total;
        self.messages
            .entry((m.dst, m.superstep))
            .or_default()
            .insert(key, (m.tag, m.payload));
        Ok(true)
    }

    /// Take one `Done` for `superstep`. Repeats are fine; a `Done` that
    /// contradicts an earlier one is an error (guests are deterministic).
    pub fn on_done(&mut self, superstep: u32, d: ProcDone) -> Result<(), BarrierError> {
        self.check_pid(d.pid)?;
        for &(dst, _) in &d.counts {
            self.check_pid(dst)?;
        }
        if let Some(&e) = self.exited.get(&d.pid)
            && (superstep > e || (superstep == e && !d.exited))
        {
            return Err(BarrierError::AfterExit {
                pid: d.pid,
                superstep,
                exited: e,
            });
        }
        let rec = DoneRec {
            exited: d.exited,
            counts: d.counts.into_iter().filter(|&(_, n)| n > 0).collect(),
        };
        if superstep < self.forgotten {
            if d.exited {
                self.exited.entry(d.pid).or_insert(superstep);
            }
            return Ok(());
        }
        let at = self.done.entry(superstep).or_default();
        match at.get(&d.pid) {
            Some(old) if *old != rec => {
                return Err(BarrierError::ConflictingDone {
                    pid: d.pid,
                    superstep,
                });
            }
            Some(_) => return Ok(()),
            None => {}
        }
        if rec.exited {
            self.exited.insert(d.pid, superstep);
        }
        at.insert(d.pid, rec);
        Ok(())
    }

    /// Whether `q` is accounted for at barrier `s` as far as `Done` goes.
    fn done_rec(&self, q: Pid, s: u32) -> Option<Option<&DoneRec>> {
        if self.exited.get(&q).is_some_and(|&e| e < s) {
            return Some(None);
        }
        self.done.get(&s).and_then(|m| m.get(&q)).map(Some)
    }

    /// Whether process `pid` may pass barrier `s`.
    pub fn ready(&self, pid: Pid, s: u32) -> bool {
        let got = self.messages.get(&(pid, s));
        (0..self.nprocs).all(|q| match self.done_rec(q, s) {
            None => false,
            Some(None) => true,
            Some(Some(rec)) => {
                let want = rec.counts.get(&pid).copied().unwrap_or(0) as usize;
                let have = got.map_or(0, |b| b.range((q, 0)..=(q, u32::MAX)).count());
                have == want
            }
        })
    }

    /// What `pid` still waits for at barrier `s`, in words (for logs).
    pub fn missing(&self, pid: Pid, s: u32) -> String {
        let got = self.messages.get(&(pid, s));
        let mut out = Vec::new();
        for q in 0..self.nprocs {
            match self.done_rec(q, s) {
                None => out.push(format!("Done({q})")),
                Some(None) => {}
                Some(Some(rec)) => {
                    let want = rec.counts.get(&pid).copied().unwrap_or(0) as usize;
                    let have = got.map_or(0, |b| b.range((q, 0)..=(q, u32::MAX)).count());
                    if have != want {
                        out.push(format!("{have}/{want} messages from {q}"));
                    }
                }
            }
        }
        if s < self.forgotten {
            out.push(format!("(Dones before {} forgotten)", self.forgotten));
        }
        out.join(", ")
    }

    /// The processes whose `Done` for `s` is not here (and that did not
    /// exit before).
    pub fn missing_done(&self, s: u32) -> Vec<Pid> {
        (0..self.nprocs)
            .filter(|&q| self.done_rec(q, s).is_none())
            .collect()
    }

    /// Whether every process's `Done` for `s` is here (or it exited before).
    pub fn complete(&self, s: u32) -> bool {
        (0..self.nprocs).all(|q| self.done_rec(q, s).is_some())
    }

    /// The messages `pid` reads after barrier `s` (sent in `s`), by
    /// (source, send order); later messages to `pid` from `s` or before are
    /// dropped from now on.
    /// Each as `(source, tag, payload)`.
    pub fn take(&mut self, pid: Pid, s: u32) -> Vec<(Pid, u32, Bytes)> {
        let taken = self.messages.remove(&(pid, s)).unwrap_or_default();
        self.set_floor(pid, s + 1);
        taken
            .into_iter()
            .map(|((src, _), (tag, payload))| (src, tag, payload))
            .collect()
    }

    /// Drop messages to `pid` sent before `superstep`, now and later (a
    /// process restored from its checkpoint of `superstep - 1` reads from
    /// `superstep - 1` on, so `floor = superstep - 1`).
    pub fn set_floor(&mut self, pid: Pid, superstep: u32) {
        let f = self.floor.entry(pid).or_default();
        if superstep > *f {
            *f = superstep;
        }
        let f = *f;
        self.messages.retain(|&(dst, s), _| dst != pid || s >= f);
        self.votes
            .messages
            .retain(|&(dst, s, _, _), _| dst != pid || s >= f);
    }

    /// The superstep in which `pid` exited, if it did.
    pub fn exited(&self, pid: Pid) -> Option<u32> {
        self.exited.get(&pid).copied()
    }

    /// Whether every process of the job exited.
    pub fn all_exited(&self) -> bool {
        self.exited.len() as u32 == self.nprocs
    }

    /// Forget `Done` records, messages and byte counts of supersteps before `s` (no
    /// process here waits at those barriers any more, and nobody restores
    /// from before them). Exits are remembered for good.
    pub fn forget_before(&mut self, s: u32) {
        if s <= self.forgotten {
            return;
        }
        self.forgotten = s;
        self.done = self.done.split_off(&s);
        self.bytes.retain(|&(_, ss), _| ss >= s);
        self.messages.retain(|&(_, ss), _| ss >= s);
        let v = &mut self.votes;
        v.messages.retain(|&(_, ss, _, _), _| ss >= s);
        v.dones = v.dones.split_off(&(s, 0));
        v.digests.retain(|&(_, ss), _| ss >= s);
        v.bytes.retain(|&(_, ss, _), _| ss >= s);
    }

    /// Bytes of messages held (taken, and copies not taken yet).
    pub fn held_bytes(&self) -> usize {
        let taken: usize = self
            .messages
            .values()
            .flat_map(|b| b.values())
            .map(|(_, p)| p.len())
            .sum();
        let open: usize = self
            .votes
            .messages
            .values()
            .flat_map(|(v, _)| v.iter())
            .map(|((_, p), _)| p.len())
            .sum();
        taken + open
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn msg(src: Pid, dst: Pid, superstep: u32, seq: u32, payload: &[u8]) -> WireMessage {
        WireMessage {
            src,
            dst,
            superstep,
            seq,
            tag: 0,
            payload: Bytes::copy_from_slice(payload),
        }
    }

    fn done(pid: Pid, exited: bool, counts: &[(Pid, u32)]) -> ProcDone {
        ProcDone {
            pid,
            exited,
            counts: counts.to_vec(),
            digest: None,
        }
    }

    #[test]
    fn a_process_passes_once_every_done_and_every_counted_message_is_here() {
        let mut b = Barrier::new(3, 1 << 20);
        b.on_done(0, done(1, false, &[(0, 2)])).unwrap();
        b.on_done(0, done(2, false, &[])).unwrap();
        assert!(!b.ready(0, 0), "no Done from pid 0 itself yet");
        b.on_done(0, done(0, false, &[])).unwrap();
        assert!(!b.ready(0, 0), "pid 1's two messages are missing");
        assert!(b.on_message(msg(1, 0, 0, 1, b"b")).unwrap());
        assert!(!b.ready(0, 0));
        assert!(b.on_message(msg(1, 0, 0, 0, b"a")).unwrap());
        assert!(b.ready(0, 0));
        assert!(b.complete(0));
        assert_eq!(
            b.take(0, 0),
            vec![
                (1, 0, Bytes::from_static(b"a")),
                (1, 0, Bytes::from_static(b"b"))
            ]
        );
        assert!(
            !b.on_message(msg(1, 0, 0, 0, b"a")).unwrap(),
            "a repeat after the barrier is dropped"
        );
    }

    #[test]
    fn exited_processes_count_as_present_at_later_barriers() {
        let mut b = Barrier::new(2, 1 << 20);
        b.on_done(3, done(1, true, &[(0, 1)])).unwrap();
        b.on_done(3, done(0, false, &[])).unwrap();
        assert!(!b.ready(0, 3), "its last message is counted");
        b.on_message(msg(1, 0, 3, 0, b"x")).unwrap();
        assert!(b.ready(0, 3));
        b.take(0, 3);
        b.on_done(4, done(0, false, &[])).unwrap();
        assert!(b.ready(0, 4));
        assert_eq!(b.exited(1), Some(3));
        assert_eq!(
            b.on_done(5, done(1, false, &[])),
            Err(BarrierError::AfterExit {
                pid: 1,
                superstep: 5,
                exited: 3
            })
        );
    }

    #[test]
    fn contradictions_and_foreign_pids_are_errors() {
        let mut b = Barrier::new(2, 4);
        b.on_done(0, done(1, false, &[(0, 1)])).unwrap();
        assert!(matches!(
            b.on_done(0, done(1, false, &[(0, 2)])),
            Err(BarrierError::ConflictingDone { .. })
        ));
        b.on_message(msg(1, 0, 0, 0, b"ab")).unwrap();
        assert!(matches!(
            b.on_message(msg(1, 0, 0, 0, b"xy")),
            Err(BarrierError::ConflictingMessage { .. })
        ));
        assert!(matches!(
            b.on_message(msg(1, 0, 0, 1, b"abc")),
            Err(BarrierError::TooMuchData { .. })
        ));
        assert!(matches!(
            b.on_message(msg(2, 0, 0, 0, b"")),
            Err(BarrierError::NoSuchPid { .. })
        ));
        assert!(matches!(
            b.on_done(0, done(0, false, &[(9, 1)])),
            Err(BarrierError::NoSuchPid { .. })
        ));
    }

    fn done_d(pid: Pid, counts: &[(Pid, u32)], digest: u8) -> ProcDone {
        ProcDone {
            digest: Some([digest; 32]),
            ..done(pid, false, counts)
        }
    }

    #[test]
    fn with_redundancy_a_result_counts_once_two_peers_sent_the_same() {
        let mut b = Barrier::with_quorum(2, 1 << 20, 2);
        // Pid 1 runs on peers 10 and 11; pid 0 on 20 and 21.
        b.on_done_from(0, done_d(1, &[(0, 1)], 7), 10).unwrap();
        b.on_done_from(0, done_d(0, &[], 9), 20).unwrap();
        b.on_done_from(0, done_d(0, &[], 9), 20).unwrap();
        assert!(!b.complete(0), "one copy of each Done is not enough");
        b.on_done_from(0, done_d(0, &[], 9), 21).unwrap();
        b.on_done_from(0, done_d(1, &[(0, 1)], 7), 11).unwrap();
        assert!(b.complete(0));
        assert_eq!(b.agreed_digest(1, 0), Some([7; 32]));
        assert!(!b.on_message_from(msg(1, 0, 0, 0, b"x"), 10).unwrap());
        assert!(!b.ready(0, 0), "one copy of the message is not enough");
        assert!(!b.on_message_from(msg(1, 0, 0, 0, b"x"), 10).unwrap());
        assert!(
            !b.ready(0, 0),
            "a repeat from the same peer is no second copy"
        );
        assert!(b.on_message_from(msg(1, 0, 0, 0, b"x"), 11).unwrap());
        assert!(b.ready(0, 0));
        assert_eq!(b.take(0, 0), vec![(1, 0, Bytes::from_static(b"x"))]);
        assert!(b.take_disputes().is_empty());
    }

    #[test]
    fn copies_that_differ_are_disputed_and_a_third_decides() {
        let mut b = Barrier::with_quorum(2, 1 << 20, 2);
        for (pid, peers) in [(0, [20, 21]), (1, [10, 11])] {
            for p in peers {
                b.on_done_from(0, done(pid, false, &[(0, 1)]), p).unwrap();
            }
        }
        // Peer 11 flipped a byte of pid 1's message.
        b.on_message_from(msg(1, 0, 0, 0, b"good"), 10).unwrap();
        b.on_message_from(msg(1, 0, 0, 0, b"bad!"), 11).unwrap();
        let d = b.take_disputes();
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].pid, d[0].superstep), (1, 0));
        assert_eq!(d[0].groups.len(), 2);
        assert!(d[0].groups.iter().all(|g| g.len() == 1));
        assert!(d[0].what.contains("message 0 to pid 0"), "{}", d[0].what);
        assert!(!b.ready(0, 0), "neither version is taken");
        // Pid 0's own message (from its two copies) is fine.
        b.on_message_from(msg(0, 0, 0, 0, b"self"), 20).unwrap();
        b.on_message_from(msg(0, 0, 0, 0, b"self"), 21).unwrap();
        assert!(!b.ready(0, 0));
        // A third run, on peer 12, agrees with peer 10.
        assert!(b.on_message_from(msg(1, 0, 0, 0, b"good"), 12).unwrap());
        let d = b.take_disputes();
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[0].groups,
            vec![vec![10, 12], vec![11]],
            "peer 11 was outvoted"
        );
        assert!(b.ready(0, 0));
        assert_eq!(
            b.take(0, 0),
            vec![
                (0, 0, Bytes::from_static(b"self")),
                (1, 0, Bytes::from_static(b"good"))
            ]
        );
        // A state digest that differs is disputed too, and not agreed.
        b.on_done_from(1, done_d(1, &[], 1), 10).unwrap();
        b.on_done_from(1, done_d(1, &[], 2), 12).unwrap();
        assert_eq!(b.agreed_digest(1, 1), None);
        let d = b.take_disputes();
        assert_eq!(d.len(), 1);
        assert!(d[0].what.contains("state"), "{}", d[0].what);
        assert!(
            b.done_rec(1, 1).is_some(),
            "the Done itself (what was sent) agreed"
        );
    }

    proptest! {
        /// With two copies of every process, each sending everything (in
        /// any order, with repeats): every process reads exactly what the
        /// plan sent, and never before both copies of everything it needs
        /// are here; no dispute arises.
        #[test]
        fn two_copies_deliver_exactly_once_whatever_the_order(
            nprocs in 1u32..4,
            steps in 1usize..3,
            seed in any::<u64>(),
        ) {
            let mut x = seed | 1;
            let mut next = move || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
            let plan: Plan = (0..steps).map(|_| {
                (0..nprocs).map(|_| {
                    (0..(next() % 4)).map(|_| {
                        let dst = (next() % nprocs as u64) as Pid;
                        (dst, vec![next() as u8; (next() % 3) as usize])
                    }).collect()
                }).collect()
            }).collect();
            // Each event from each copy's peer (pid q's copies: 100 + q, 200 + q).
            type Event = (WireMessage, Option<(u32, ProcDone)>);
            let mut events: Vec<(PeerId, Event)> =
                deliveries(nprocs, &plan)
                    .into_iter()
                    .flat_map(|e| {
                        let q = e.0.src as PeerId;
                        [(100 + q, e.clone()), (200 + q, e)]
                    })
                    .collect();
            for i in (1..events.len()).rev() {
                let j = (next() % (i as u64 + 1)) as usize;
                events.swap(i, j);
            }
            let repeats: Vec<_> = events.iter().filter(|_| next() % 4 == 0).cloned().collect();
            events.extend(repeats);
            // The event after which each (src, superstep) item has both copies.
            let mut b = Barrier::with_quorum(nprocs, 1 << 20, 2);
            let mut at = vec![0u32; nprocs as usize];
            type Read = Vec<Vec<Vec<(Pid, u32, Bytes)>>>;
            let mut read: Read = vec![Vec::new(); nprocs as usize];
            let mut seen: HashMap<String, BTreeSet<PeerId>> = HashMap::new();
            for (from, (m, d)) in events {
                let key = match &d {
                    Some((s, d)) => format!("done {s} {}", d.pid),
                    None => format!("msg {} {} {}", m.dst, m.superstep, m.seq),
                };
                let key = format!("{key} from {}", m.src);
                seen.entry(key).or_default().insert(from);
                match d {
                    Some((s, d)) => b.on_done_from(s, d, from).unwrap(),
                    None => { b.on_message_from(m, from).unwrap(); }
                }
                for p in 0..nprocs {
                    while (at[p as usize] as usize) < steps && b.ready(p, at[p as usize]) {
                        let s = at[p as usize];
                        // Everything p reads at s came from both copies.
                        for q in 0..nprocs {
                            let k = format!("done {s} {q} from {q}");
                            prop_assert_eq!(seen.get(&k).map_or(0, |v| v.len()), 2, "{}", k);
                        }
                        read[p as usize].push(b.take(p, s));
                        at[p as usize] += 1;
                    }
                }
            }
            prop_assert!(b.take_disputes().is_empty());
            for p in 0..nprocs {
                prop_assert_eq!(at[p as usize] as usize, steps, "pid {} is stuck", p);
                for s in 0..steps {
                    let want: Vec<(Pid, u32, Bytes)> = (0..nprocs).flat_map(|q| {
                        plan[s][q as usize].iter()
                            .filter(|(dst, _)| *dst == p)
                            .map(move |(_, pl)| (q, 0, Bytes::from(pl.clone())))
                    }).collect();
                    prop_assert_eq!(&read[p as usize][s], &want);
                }
            }
        }
    }

    /// What every process sends in every superstep: `plan[s][q]` lists the
    /// (dst, payload) that `q` sends in superstep `s`.
    type Plan = Vec<Vec<Vec<(Pid, Vec<u8>)>>>;

    /// A reference run of `plan`; every process runs every superstep.
    fn deliveries(nprocs: u32, plan: &Plan) -> Vec<(WireMessage, Option<(u32, ProcDone)>)> {
        let mut out = Vec::new();
        for (s, per) in plan.iter().enumerate() {
            for q in 0..nprocs {
                let sends = &per[q as usize];
                let mut counts: BTreeMap<Pid, u32> = BTreeMap::new();
                for (seq, (dst, payload)) in sends.iter().enumerate() {
                    *counts.entry(*dst).or_default() += 1;
                    out.push((msg(q, *dst, s as u32, seq as u32, payload), None));
                }
                let d = done(q, false, &counts.into_iter().collect::<Vec<_>>());
                out.push((msg(q, q, u32::MAX, 0, &[]), Some((s as u32, d))));
            }
        }
        out
    }

    proptest! {
        /// Delivery guarantee (DESIGN.md, Execution 4) at process level:
        /// whatever the order of arrival, and with any events repeated
        /// (re-sends after a restore), every process passes each barrier
        /// exactly when everything for it arrived, and reads exactly what
        /// was sent to it, in (source, send order).
        #[test]
        fn every_process_reads_exactly_what_was_sent_whatever_the_order(
            nprocs in 1u32..5,
            steps in 1usize..4,
            seed in any::<u64>(),
            repeat in proptest::collection::vec(any::<bool>(), 64),
        ) {
            // Build a plan from the seed.
            let mut x = seed | 1;
            let mut next = move || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
            let plan: Plan = (0..steps).map(|_| {
                (0..nprocs).map(|_| {
                    (0..(next() % 4)).map(|_| {
                        let dst = (next() % nprocs as u64) as Pid;
                        let len = (next() % 4) as usize;
                        (dst, (0..len).map(|_| next() as u8).collect())
                    }).collect()
                }).collect()
            }).collect();
            let mut events = deliveries(nprocs, &plan);
            // Shuffle, then repeat some events.
            for i in (1..events.len()).rev() {
                let j = (next() % (i as u64 + 1)) as usize;
                events.swap(i, j);
            }
            let extra: Vec<_> = events.iter().zip(repeat.iter().cycle())
                .filter(|(_, r)| **r).map(|(e, _)| e.clone()).collect();
            events.extend(extra);

            let mut b = Barrier::new(nprocs, 1 << 20);
            let mut at = vec![0u32; nprocs as usize];
            // Per pid, per superstep: what it read.
            type Read = Vec<Vec<Vec<(Pid, u32, Bytes)>>>;
            let mut read: Read = vec![Vec::new(); nprocs as usize];
            let pump = |b: &mut Barrier, at: &mut Vec<u32>, read: &mut Read| {
                for p in 0..nprocs {
                    while (at[p as usize] as usize) < steps && b.ready(p, at[p as usize]) {
                        let s = at[p as usize];
                        read[p as usize].push(b.take(p, s));
                        at[p as usize] += 1;
                    }
                }
            };
            for (m, d) in events {
                match d {
                    Some((s, d)) => b.on_done(s, d).unwrap(),
                    None => { b.on_message(m).unwrap(); }
                }
                pump(&mut b, &mut at, &mut read);
            }
            for p in 0..nprocs {
                prop_assert_eq!(at[p as usize] as usize, steps, "pid {} is stuck", p);
                for s in 0..steps {
                    let want: Vec<(Pid, u32, Bytes)> = (0..nprocs).flat_map(|q| {
                        plan[s][q as usize].iter()
                            .filter(|(dst, _)| *dst == p)
                            .map(move |(_, pl)| (q, 0, Bytes::from(pl.clone())))
                    }).collect();
                    prop_assert_eq!(&read[p as usize][s], &want);
                }
            }
        }

        /// A process never passes a barrier early: with any one message or
        /// Done withheld, the processes it concerns stay at that barrier.
        #[test]
        fn a_missing_message_or_done_holds_the_barrier(
            nprocs in 1u32..4,
            seed in any::<u64>(),
            pick in any::<prop::sample::Index>(),
        ) {
            let mut x = seed | 1;
            let mut next = move || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
            let plan: Plan = vec![(0..nprocs).map(|_| {
                (0..(next() % 3)).map(|_| ((next() % nprocs as u64) as Pid, vec![1])).collect()
            }).collect()];
            let events = deliveries(nprocs, &plan);
            let skip = pick.index(events.len());
            let mut b = Barrier::new(nprocs, 1 << 20);
            for (i, (m, d)) in events.iter().cloned().enumerate() {
                if i == skip { continue; }
                match d {
                    Some((s, d)) => b.on_done(s, d).unwrap(),
                    None => { b.on_message(m).unwrap(); }
                }
            }
            let (m, d) = &events[skip];
            match d {
                Some(_) => for p in 0..nprocs { prop_assert!(!b.ready(p, 0)); },
                None => prop_assert!(!b.ready(m.dst, 0)),
            }
        }
    }
}
