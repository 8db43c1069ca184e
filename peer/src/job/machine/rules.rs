//! A capture and the checkpoint's frames for each replica (run wherever the
//! process runs: on its blocking thread in the peer), and the small rules of
//! when a superstep is checkpointed and when its `Done` may go.

use super::*;

/// The messages a process sent in superstep `s`, as they travel.
pub(crate) fn wire_messages(
    pid: Pid,
    s: u32,
    out: Vec<crate::runtime::Outgoing>,
) -> Vec<WireMessage> {
    out.into_iter()
        .map(|o| WireMessage {
            src: pid,
            dst: o.dst,
            superstep: s,
            seq: o.seq,
            tag: o.tag,
            payload: o.payload,
        })
        .collect()
}

/// Capture `p` with `outbox` and plan the checkpoint's frames for
/// `targets` (the body of every capture task).
pub(crate) fn capture<G: Guest>(
    p: &mut Proc<G>,
    outbox: Vec<WireMessage>,
    exited: bool,
    acks: Vec<(PeerId, u32, bool)>,
    targets: &[PeerId],
) -> Result<(Arc<Snapshot>, Planned), HostError> {
    // The newest buffer only this process still holds, but not the last
    // capture's while another is free: the replicas' base is usually the
    // last capture, and its pages are what the patches are made against.
    let newest = p.recent.len().checked_sub(1);
    let free = (0..p.recent.len())
        .rev()
        .filter(|&i| Some(i) != newest)
        .chain(newest)
        .find(|&i| Arc::strong_count(&p.recent[i]) == 1)
        .and_then(|i| p.recent.remove(i))
        .and_then(|a| Arc::try_unwrap(a).ok());
    if free.is_none() {
        tracing::trace!(
            target: "bspweb::timeline",
            held = p.recent.len(),
            "no free buffer to recycle: the capture copies the whole memory"
        );
    }
    let snapshot = p.process.checkpoint(&mut p.tracker, outbox, exited, free);
    for (r, superstep, ok) in acks {
        p.tracker.acked(r, superstep, ok);
    }
    // Shared: the frames' pages are slices of its memory.
    let snapshot = Arc::new(snapshot);
    let planned = plan_frames(&mut p.tracker, &snapshot, targets, &p.recent);
    Ok((snapshot, planned))
}

/// A point of a superstep's life on this peer, for
/// `BSPWEB_LOG=bspweb::timeline=trace` (docs/benchmarks.md, "The superstep
/// timeline"): the log's microsecond timestamps show where a superstep's
/// time goes between threads and peers. Free when the target is off.
pub(crate) fn timeline(pid: Pid, superstep: u32, what: &str) {
    tracing::trace!(target: "bspweb::timeline", pid, superstep, "{what}");
}

/// Plan `snapshot`'s frames for each of `targets`, once per distinct plan;
/// the first connection writer that sends them makes them
/// ([`CheckpointFrames`]). The next checkpoint is planned as a delta
/// against this one, sent before this one is acknowledged: frames to a
/// replica arrive in order, so it will hold this one as its base (if not,
/// it refuses the delta and gets the next checkpoint whole). A delta's
/// pages that changed in few words or bytes go as patches when `recent`
/// (the process's last captures) still holds its base.
pub(crate) fn plan_frames(
    tracker: &mut PageTracker,
    snapshot: &Arc<Snapshot>,
    targets: &[PeerId],
    recent: &VecDeque<Arc<Snapshot>>,
) -> Planned {
    let mut done: Vec<(checkpoint::Plan, Arc<CheckpointFrames>)> = Vec::new();
    let mut out = Vec::with_capacity(targets.len());
    for &r in targets {
        let plan = tracker.plan(r, snapshot);
        let frames = match done.iter().find(|(p, _)| *p == plan) {
            Some((_, frames)) => frames.clone(),
            None => {
                let frames = Arc::new(CheckpointFrames {
                    snapshot: snapshot.clone(),
                    pages: plan.pages.clone(),
                    leaves: plan.leaves.clone(),
                    base: plan.base,
                    base_capture: base_capture(tracker, recent, plan.base).cloned(),
                    made: OnceLock::new(),
                });
                done.push((plan, frames.clone()));
                frames
            }
        };
        tracker.sent(r, snapshot.superstep);
        out.push((r, Outgoing::Deferred(frames)));
    }
    out
}

/// A checkpoint's frames for the replicas of one plan, made when the first
/// of their connections' writers gets to them: the page patches take a
/// while (about 10 µs a page), and the process computes its next
/// superstep meanwhile instead of waiting for them.
#[derive(Debug)]
pub(crate) struct CheckpointFrames {
    snapshot: Arc<Snapshot>,
    pages: Vec<u32>,
    /// [`checkpoint::Plan::leaves`].
    leaves: Vec<u16>,
    base: Option<u32>,
    /// The capture of `base` the patches are made against (the replica
    /// holds exactly it), if the process still has it.
    base_capture: Option<Arc<Snapshot>>,
    made: OnceLock<Result<Vec<net::Segments>, postcard::Error>>,
}

impl net::Deferred for CheckpointFrames {
    fn segments(&self) -> Result<&[net::Segments], postcard::Error> {
        self.made
            .get_or_init(|| {
                let base = self.base_capture.as_ref().map(|s| s.memory.as_slice());
                checkpoint::to_frames_shared(
                    &self.snapshot,
                    &self.pages,
                    &self.leaves,
                    self.base,
                    base,
                )
                .iter()
                .map(net::encode_segments)
                .collect()
            })
            .as_deref()
            .map_err(Clone::clone)
    }

    fn slow(&self) -> bool {
        self.made.get().is_none() && self.base_capture.is_some() && self.pages.len() > QUICK_PATCHES
    }
}

/// Pages a connection's writer may diff against their base on its async
/// worker (about 10 µs each); a checkpoint with more is made on a blocking
/// thread.
const QUICK_PATCHES: usize = 16;

/// The capture of superstep `base` among `recent`, if it is one the
/// tracker took since it last started over (so the replica holding `base`
/// holds exactly it).
pub(crate) fn base_capture<'a>(
    tracker: &PageTracker,
    recent: &'a VecDeque<Arc<Snapshot>>,
    base: Option<u32>,
) -> Option<&'a Arc<Snapshot>> {
    let b = base?;
    recent
        .iter()
        .find(|s| s.superstep == b && tracker.is_recent_capture(s.superstep, s.hash))
}

/// The frames that carry `s` whole to a replica.
pub(crate) fn whole(s: &Snapshot) -> Vec<Frame> {
    checkpoint::to_frames(s, &s.nonzero_pages(), None)
}

/// The newest superstep before `c` that [`checkpointed`] says is
/// checkpointed with interval `every` (in O(1): with checkpoints off,
/// `every` is huge and there may be none).
pub(crate) fn newest_checkpointed_before(c: u32, every: u32) -> Option<u32> {
    let every = every.max(1);
    (c / every).checked_mul(every)?.checked_sub(1)
}

/// Whether superstep `s` is checkpointed with interval `every`.
pub(crate) fn checkpointed(s: u32, every: u32) -> bool {
    every <= 1 || (s + 1).is_multiple_of(every)
}

/// Whether a process's `Done(s)` may go out with these checkpoints still
/// pending (docs/fault-tolerance.md, "`Done` after replication, two
/// supersteps late"): every checkpoint before `s − 1` must be safe, and
/// the one of `s` itself when it gates its own `Done` (an exit or a
/// restored snapshot). `K_{s−1}` may still be on its way: its replicas
/// acknowledge it with their own `Done(s)` at the latest
/// ([`ack_may_wait`]), which needs nothing from this process's `Done(s)`.
pub(crate) fn may_announce(
    pending: &VecDeque<Pending>,
    capturing_exit: Option<u32>,
    s: u32,
) -> bool {
    capturing_exit.is_none_or(|c| c > s)
        && pending
            .iter()
            .all(|p| p.superstep + 1 >= s && !(p.superstep == s && p.gates_own))
}

/// Whether a replica may hold back its acknowledgement of the checkpoint
/// `K_c` of another peer's process, to send it with its next `Done` to
/// that peer instead of in a frame of its own. The owner's `Done(c + 2)`
/// waits for it ([`may_announce`]), so it must leave no later than this
/// peer's `Done(c + 1)`, which waits for nothing the owner sends after
/// its `Done(c)`: some local process must still owe that `Done`
/// (`owes_done_after_c` says whether one does). Never for a checkpoint
/// that gates its owner's own `Done` (an exit, or a restored process's
/// snapshot, which travels whole), since the `Done`s of this peer that
/// would carry it wait for that one; and never with redundancy.
pub(crate) fn ack_may_wait(
    exited: bool,
    whole: bool,
    redundant: bool,
    owes_done_after_c: bool,
) -> bool {
    !exited && !whole && !redundant && owes_done_after_c
}

/// The `Done` of `pid` for superstep `s`, counted from its messages.
pub(crate) fn done_of(pid: Pid, exited: bool, messages: &[WireMessage], s: u32) -> ProcDone {
    let mut counts: BTreeMap<Pid, u32> = BTreeMap::new();
    for m in messages.iter().filter(|m| m.superstep == s) {
        *counts.entry(m.dst).or_default() += 1;
    }
    ProcDone {
        pid,
        exited,
        counts: counts.into_iter().collect(),
        digest: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(superstep: u32, gates_own: bool) -> Pending {
        Pending {
            superstep,
            waiting: BTreeSet::from([7]),
            snapshot: Arc::new(crate::job::tests::head(superstep)),
            gates_own,
            output_mark: 0,
            unsent: Vec::new(),
            digest: [0; 32],
            agreed: true,
        }
    }

    fn may(pending_: &[(u32, bool)], capturing_exit: Option<u32>, s: u32) -> bool {
        let p: VecDeque<Pending> = pending_.iter().map(|&(c, g)| pending(c, g)).collect();
        may_announce(&p, capturing_exit, s)
    }

    /// `Done(s)` waits for the checkpoints before `s − 1`, not for
    /// `K_{s−1}` (its replicas acknowledge it with their own `Done(s)`),
    /// and for `K_s` only when that gates it.
    #[test]
    fn a_done_waits_for_the_checkpoints_two_supersteps_back() {
        assert!(may(&[], None, 5));
        assert!(may(&[(4, false)], None, 5));
        assert!(may(&[(4, false), (5, false)], None, 5));
        assert!(!may(&[(3, false), (4, false), (5, false)], None, 5));
        assert!(!may(&[(3, false)], None, 5));
        // An exit's or a restored snapshot's checkpoint gates its own `Done`.
        assert!(!may(&[(5, true)], None, 5));
        assert!(may(&[(5, true)], None, 4));
        assert!(!may(&[], Some(5), 5));
        assert!(may(&[], Some(5), 4));
        // Superstep 0 and 1 have nothing two supersteps back.
        assert!(may(&[(0, false)], None, 0));
        assert!(may(&[(0, false)], None, 1));
        assert!(!may(&[(0, false)], None, 2));
    }

    /// An acknowledgement waits for a `Done` only when one is owed and
    /// nothing that `Done` waits for waits for the acknowledgement.
    #[test]
    fn an_acknowledgement_waits_only_for_a_done_that_needs_nothing_back() {
        assert!(ack_may_wait(false, false, false, true));
        assert!(
            !ack_may_wait(true, false, false, true),
            "an exit gates its own Done"
        );
        assert!(
            !ack_may_wait(false, true, false, true),
            "a whole one may be a restore"
        );
        assert!(!ack_may_wait(false, false, true, true), "redundancy");
        assert!(!ack_may_wait(false, false, false, false), "no Done owed");
    }
}
