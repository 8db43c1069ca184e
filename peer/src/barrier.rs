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

/// The versions of one result, each with the peers that sent it (a peer
/// votes once per result: a second, different copy from it is ignored).
#[derive(Debug, Clone)]
struct Ballot<T> {
    versions: Vec<(T, BTreeSet<PeerId>)>,
    /// The version taken into the barrier, once one was.
    taken: Option<usize>,
    /// What the last dispute reported (versions, eligible voters, decided),
    /// so each change is reported once.
    reported: (usize, usize, bool),
}

impl<T> Default for Ballot<T> {
    fn default() -> Self {
        Ballot {
            versions: Vec::new(),
            taken: None,
            reported: (1, 0, false),
        }
    }
}

impl<T: PartialEq + Clone> Ballot<T> {
    /// `from`'s copy. Returns false for a repeat, and for a second,
    /// different copy from the same peer (ignored: a peer does not get to
    /// change its vote).
    fn cast(&mut self, v: T, from: PeerId) -> bool {
        if self.versions.iter().any(|(_, by)| by.contains(&from)) {
            return false;
        }
        match self.versions.iter_mut().find(|(x, _)| *x == v) {
            Some((_, by)) => {
                by.insert(from);
            }
            None => self.versions.push((v, BTreeSet::from([from]))),
        }
        true
    }

    /// Count the votes of `eligible` peers: the version with `quorum` of
    /// them, if any, is decided; it is taken (returned, once) when `needs`
    /// is among its voters too. A dispute goes to `out` whenever versions
    /// differ and what they look like changed.
    fn tally(
        &mut self,
        eligible: Option<&BTreeSet<PeerId>>,
        quorum: usize,
        needs: Option<PeerId>,
        dispute: impl FnOnce(Vec<Vec<PeerId>>) -> Dispute,
        out: &mut Vec<Dispute>,
    ) -> Option<T> {
        let counted = |by: &BTreeSet<PeerId>| -> Vec<PeerId> {
            by.iter()
                .copied()
                .filter(|p| eligible.is_some_and(|e| e.contains(p)))
                .collect()
        };
        let groups: Vec<Vec<PeerId>> = self.versions.iter().map(|(_, by)| counted(by)).collect();
        let decided = groups.iter().position(|g| g.len() >= quorum);
        let voters: usize = groups.iter().map(Vec::len).sum();
        let live = groups.iter().filter(|g| !g.is_empty()).count();
        let now = (live, voters, decided.is_some());
        if live > 1 && now != self.reported {
            self.reported = now;
            let mut shown: Vec<Vec<PeerId>> =
                groups.into_iter().filter(|g| !g.is_empty()).collect();
            shown.sort_by_key(|g| std::cmp::Reverse(g.len()));
            out.push(dispute(shown));
        }
        let w = decided?;
        if self.taken.is_some() || needs.is_some_and(|n| !self.versions[w].1.contains(&n)) {
            return None;
        }
        self.taken = Some(w);
        Some(self.versions[w].0.clone())
    }

    /// The decided version, by the same count as [`Ballot::tally`].
    fn decided(&self, eligible: Option<&BTreeSet<PeerId>>, quorum: usize) -> Option<&T> {
        self.versions
            .iter()
            .find(|(_, by)| {
                by.iter()
                    .filter(|p| eligible.is_some_and(|e| e.contains(p)))
                    .count()
                    >= quorum
            })
            .map(|(v, _)| v)
    }
}

/// A message's key among the votes: `(dst, superstep, src, seq)`.
type MessageKey = (Pid, u32, Pid, u32);

/// The votes of a barrier with redundancy.
#[derive(Debug, Default, Clone)]
struct Votes {
    /// `(dst, superstep, src, seq)` → versions of `(tag, payload)`.
    messages: BTreeMap<MessageKey, Ballot<(u32, Bytes)>>,
    /// `(superstep, pid)` → versions of the `Done` (its digest apart).
    dones: BTreeMap<(u32, Pid), Ballot<DoneRec>>,
    /// `(pid, superstep)` → versions of the state digest.
    digests: BTreeMap<(Pid, u32), Ballot<[u8; 32]>>,
    /// Payload bytes of copies, per `(src, superstep, sender)`.
    bytes: HashMap<(Pid, u32, PeerId), usize>,
    /// Who may vote on each pid's results: the peers that run or ran a
    /// copy of it, as far as this peer learned. Others' copies are kept
    /// (so one that arrives before this peer learns of a new host still
    /// counts once it does) but not counted.
    voters: HashMap<Pid, BTreeSet<PeerId>>,
    /// The peer that runs copy 0 of each pid: a `Done` is taken only with
    /// its vote among the agreeing ones, because only copy 0 replicates and
    /// its `Done` is what says its earlier checkpoints are safe.
    primary: HashMap<Pid, PeerId>,
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

    /// The hosts of `pid` in this peer's newest assignment, copy 0 first:
    /// they may vote on its results from now on (so may its earlier hosts
    /// still: what they sent before they left counts), and a `Done` of
    /// `pid` needs copy 0's. Results that now have their quorum are taken.
    pub fn set_hosts(&mut self, pid: Pid, hosts: &[PeerId]) -> Result<(), BarrierError> {
        if self.quorum <= 1 {
            return Ok(());
        }
        self.votes
            .voters
            .entry(pid)
            .or_default()
            .extend(hosts.iter().copied());
        if let Some(&p) = hosts.first() {
            self.votes.primary.insert(pid, p);
        }
        self.recount(pid)
    }

    /// Tally every open result of `src` again (its voters changed).
    fn recount(&mut self, src: Pid) -> Result<(), BarrierError> {
        let keys: Vec<MessageKey> = self
            .votes
            .messages
            .iter()
            .filter(|(k, b)| k.2 == src && b.taken.is_none())
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            self.tally_message(key)?;
        }
        let keys: Vec<(u32, Pid)> = self
            .votes
            .dones
            .iter()
            .filter(|(k, b)| k.1 == src && b.taken.is_none())
            .map(|(k, _)| *k)
            .collect();
        for (superstep, pid) in keys {
            self.tally_done(superstep, pid)?;
        }
        let keys: Vec<(Pid, u32)> = self
            .votes
            .digests
            .keys()
            .filter(|k| k.0 == src)
            .copied()
            .collect();
        for (pid, superstep) in keys {
            self.tally_digest(pid, superstep);
        }
        Ok(())
    }

    /// The disputes found since the last call (redundancy).
    pub fn take_disputes(&mut self) -> Vec<Dispute> {
        std::mem::take(&mut self.votes.disputes)
    }

    /// The state digest of `pid` at the end of `superstep` that a quorum
    /// of its copies agreed on, if they did.
    pub fn agreed_digest(&self, pid: Pid, superstep: u32) -> Option<[u8; 32]> {
        self.votes
            .digests
            .get(&(pid, superstep))?
            .decided(self.votes.voters.get(&pid), self.quorum)
            .copied()
    }

    /// A copy of a message from peer `from` (redundancy: it counts once a
    /// quorum of its sender's hosts sent the same). Returns whether it was
    /// taken now.
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
        let key = (m.dst, m.superstep, m.src, m.seq);
        let ballot = self.votes.messages.entry(key).or_default();
        if !ballot.cast((m.tag, m.payload), from) {
            return Ok(false);
        }
        *used = total;
        self.tally_message(key)
    }

    /// Take the message of `key` if its copies now agree.
    fn tally_message(&mut self, key: MessageKey) -> Result<bool, BarrierError> {
        let (dst, superstep, src, seq) = key;
        let Some(ballot) = self.votes.messages.get_mut(&key) else {
            return Ok(false);
        };
        let taken = ballot.tally(
            self.votes.voters.get(&src),
            self.quorum,
            None,
            |groups| Dispute {
                pid: src,
                superstep,
                groups,
                what: format!("its message {seq} to pid {dst}"),
            },
            &mut self.votes.disputes,
        );
        match taken {
            Some((tag, payload)) => self.on_message(WireMessage {
                src,
                dst,
                superstep,
                seq,
                tag,
                payload,
            }),
            None => Ok(false),
        }
    }

    /// A copy of a `Done` from peer `from` (redundancy: it counts once a
    /// quorum of the process's hosts, copy 0's among them, sent the same;
    /// its digest is voted on apart).
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
            self.on_digest_from(pid, superstep, digest, from);
        }
        let rec = DoneRec {
            exited: d.exited,
            counts: d.counts.iter().copied().filter(|&(_, n)| n > 0).collect(),
        };
        if self
            .votes
            .dones
            .entry((superstep, pid))
            .or_default()
            .cast(rec, from)
        {
            self.tally_done(superstep, pid)?;
        }
        Ok(())
    }

    /// Take the `Done` of `pid` for `superstep` if its copies now agree.
    fn tally_done(&mut self, superstep: u32, pid: Pid) -> Result<(), BarrierError> {
        let Some(ballot) = self.votes.dones.get_mut(&(superstep, pid)) else {
            return Ok(());
        };
        let taken = ballot.tally(
            self.votes.voters.get(&pid),
            self.quorum,
            self.votes.primary.get(&pid).copied(),
            |groups| Dispute {
                pid,
                superstep,
                groups,
                what: "what it sent in the superstep (its Done)".to_string(),
            },
            &mut self.votes.disputes,
        );
        match taken {
            Some(rec) => self.on_done(
                superstep,
                ProcDone {
                    pid,
                    exited: rec.exited,
                    counts: rec.counts.into_iter().collect(),
                    digest: None,
                },
            ),
            None => Ok(()),
        }
    }

    /// A copy of the digest of `pid`'s state at the end of `superstep`
    /// from peer `from` (in its `Done`, or this peer's own copy as soon as
    /// it captured it: copy 0's `Done` of an exit waits for its checkpoint
    /// to be replicated, which waits for the digests to agree).
    pub fn on_digest_from(&mut self, pid: Pid, superstep: u32, digest: [u8; 32], from: PeerId) {
        if self.quorum <= 1 || pid >= self.nprocs || superstep < self.forgotten {
            return;
        }
        if self
            .votes
            .digests
            .entry((pid, superstep))
            .or_default()
            .cast(digest, from)
        {
            self.tally_digest(pid, superstep);
        }
    }

    fn tally_digest(&mut self, pid: Pid, superstep: u32) {
        if let Some(ballot) = self.votes.digests.get_mut(&(pid, superstep)) {
            ballot.tally(
                self.votes.voters.get(&pid),
                self.quorum,
                None,
                |groups| Dispute {
                    pid,
                    superstep,
                    groups,
                    what: "its state at the end of the superstep".to_string(),
                },
                &mut self.votes.disputes,
            );
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
            // A version taken is counted in `messages` (the same buffer).
            .flat_map(|b| {
                b.versions
                    .iter()
                    .enumerate()
                    .filter(move |(i, _)| b.taken != Some(*i))
            })
            .map(|(_, ((_, p), _))| p.len())
            .sum();
        taken + open
    }
}

#[cfg(test)]
mod tests;
