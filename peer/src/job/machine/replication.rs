//! Checkpoint replication (docs/fault-tolerance.md): a checkpoint goes to
//! its replicas once the output before it is stored, `Done` waits for their
//! acknowledgements, handovers of migrating processes, and the retention
//! point that frees what no restore can need.

use super::*;

impl<I: JobIo> Machine<I> {
    /// Who gets `pid`'s checkpoints from this peer: its replicas when this
    /// peer runs copy 0 of it, nobody for another copy (the copies' states
    /// are the same; copy 0's travel once they agreed).
    pub(super) fn replica_targets(&self, pid: Pid) -> Vec<PeerId> {
        if self.hosts.copies() > 1 && !self.hosts.is_primary(pid, self.me) {
            return Vec::new();
        }
        replicas_of(self.job, pid, self.me, &self.peers, self.replicas)
    }

    /// Tell the barrier who runs each pid now (with redundancy, only they
    /// and earlier hosts may vote on its results).
    pub(super) fn elect(&mut self) {
        if self.hosts.copies() == 1 {
            return;
        }
        for pid in 0..self.info.nprocs {
            let hosts = self.hosts.of(pid).to_vec();
            if let Err(e) = self.barrier.set_hosts(pid, &hosts) {
                return self.fail(None, format!("a peer broke the data-plane protocol: {e}"));
            }
        }
    }

    /// With redundancy: checkpoints whose digest a quorum of the copies
    /// now agreed on may go to their replicas. A checkpoint outvoted
    /// never goes (the supernode quarantines this peer).
    pub(super) fn release_agreed(&mut self) {
        if self.hosts.copies() == 1 {
            return;
        }
        let mut agreed = Vec::new();
        for (&pid, l) in self.local.iter_mut() {
            for p in l.pending.iter_mut().filter(|p| !p.agreed) {
                if self.barrier.agreed_digest(pid, p.superstep) == Some(p.digest) {
                    p.agreed = true;
                    agreed.push(pid);
                }
            }
        }
        agreed.dedup();
        for pid in agreed {
            self.send_checkpoint(pid);
            self.release_if_acked(pid);
        }
    }

    /// Tell the supernode about copies that disagree (redundancy).
    pub(super) fn report_disputes(&mut self) {
        for d in self.barrier.take_disputes() {
            tracing::warn!(
                job = self.job,
                pid = d.pid,
                superstep = d.superstep,
                groups = ?d.groups,
                "copies of a process disagree about {}",
                d.what
            );
            self.emit(PeerEvent::Disagreement {
                job: self.job,
                pid: d.pid,
                superstep: d.superstep,
                groups: d.groups,
                what: d.what,
            });
        }
    }

    /// Send `pid`'s checkpoint to its replicas once its output up to the
    /// checkpoint reached the supernode.
    pub(super) fn send_checkpoint(&mut self, pid: Pid) {
        let delivered = self.io.delivered();
        let Some(l) = self.local.get_mut(&pid) else {
            return;
        };
        let mut frames = Vec::new();
        // Oldest first: a delta travels after its base.
        for p in l.pending.iter_mut() {
            if !p.may_leave(delivered) {
                break;
            }
            frames.append(&mut p.unsent);
        }
        for (r, f) in frames {
            self.send_out(r, f);
        }
    }

    /// Forget `pid`'s checkpoints that are safe and send the held `Done`s
    /// they no longer hold back.
    pub(super) fn release_if_acked(&mut self, pid: Pid) {
        let Some(l) = self.local.get_mut(&pid) else {
            return;
        };
        let delivered = self.io.delivered();
        l.pending
            .retain(|p| !p.waiting.is_empty() || delivered < p.output_mark);
        // With redundancy a copy's `Done(s)` also waits until its output up
        // to `K_s` reached the supernode: once the copies agreed on `K_s`,
        // a copy restored from it does not emit that output again, and the
        // supernode publishes a record only when both copies delivered it.
        let redundant = self.hosts.copies() > 1;
        let ready = l
            .held
            .iter()
            .take_while(|(s, _)| {
                may_announce(&l.pending, l.capturing_exit, *s)
                    && (!redundant
                        || l.pending
                            .iter()
                            .all(|p| p.superstep > *s || delivered >= p.output_mark))
            })
            .count();
        let go: Vec<(u32, ProcDone)> = l.held.drain(..ready).collect();
        for (s, d) in go {
            self.announce(s, d);
        }
    }

    /// Acknowledge `pid`'s checkpoint of `superstep` to its owner now (and
    /// with it any older one held back for the same pid).
    pub(super) fn send_ack(&mut self, owner: PeerId, pid: Pid, superstep: u32) {
        if let Some(held) = self.held_acks.get_mut(&owner) {
            held.remove(&pid);
            if held.is_empty() {
                self.held_acks.remove(&owner);
            }
        }
        self.send_to(
            owner,
            Frame::CheckpointAck {
                pid,
                superstep,
                ok: true,
            },
        );
    }

    /// Whether some local process still owes its `Done(s)` and will send
    /// it from here (it has not exited, is not leaving, and `s` is not
    /// behind the safe point, before which every `Done` went long ago).
    pub(super) fn owes_done(&self, s: u32) -> bool {
        self.safe.is_none_or(|g| s >= g)
            && self.local.iter().any(|(&pid, l)| {
                !matches!(l.state, State::Exited)
                    && l.handover.is_none()
                    && !l.leaving
                    && !self.dones.contains_key(&(pid, s))
            })
    }

    /// Send the acknowledgements held back whose `Done` is no longer to
    /// come: each must leave no later than this peer's `Done` of the
    /// superstep after it ([`ack_may_wait`]).
    pub(super) fn flush_acks(&mut self) {
        if self.held_acks.is_empty() {
            return;
        }
        let due: Vec<(PeerId, Pid, u32)> = self
            .held_acks
            .iter()
            .flat_map(|(&owner, h)| h.iter().map(move |(&pid, &s)| (owner, pid, s)))
            .filter(|&(owner, _, s)| {
                !self.routing.links.contains_key(&owner) || !self.owes_done(s + 1)
            })
            .collect();
        for (owner, pid, s) in due {
            self.send_ack(owner, pid, s);
        }
    }

    pub(super) fn on_ack(&mut self, from: PeerId, pid: Pid, superstep: u32, ok: bool) {
        tracing::trace!(target: "bspweb::timeline", pid, superstep, from, ok, "checkpoint acknowledged");
        let Some(l) = self.local.get_mut(&pid) else {
            return;
        };
        // Only replicas we wait for are heard (a peer cannot fill `acks`).
        if !l.pending.iter().any(|p| p.waiting.contains(&from)) {
            return;
        }
        // The page tracker travels with the process (often on a blocking
        // thread); only its next capture plans deltas, so the answer waits
        // for it there.
        l.acks.push((from, superstep, ok));
        if ok {
            // A replica that holds `K_superstep` serves a restore at least as
            // well as one holding an older checkpoint, so this answers the
            // older pending ones too (their own acks may have been lost with
            // a connection: a replica re-acknowledges only its newest).
            for p in l.pending.iter_mut().filter(|p| p.superstep <= superstep) {
                p.waiting.remove(&from);
            }
            self.release_if_acked(pid);
        } else if let Some(p) = l
            .pending
            .iter()
            .find(|p| p.superstep == superstep && p.waiting.contains(&from))
        {
            // The replica lacks the base or could not rebuild it: send it whole.
            let frames = whole(&p.snapshot);
            for f in frames {
                self.send_to(from, f);
            }
        }
    }

    /// More output reached the supernode: checkpoints waiting only for that
    /// may release their `Done`s, leaving processes may be handed over.
    pub(super) fn on_output_delivered(&mut self) {
        let waiting: Vec<(Pid, bool)> = self
            .local
            .iter()
            .filter(|(_, l)| !l.pending.is_empty())
            .map(|(pid, l)| (*pid, l.handover.is_some()))
            .collect();
        for (pid, handing_over) in waiting {
            self.send_checkpoint(pid);
            if handing_over {
                self.hand_over(pid);
            }
            self.release_if_acked(pid);
        }
    }

    /// `pid` leaves this peer: once its snapshot is taken and its new host
    /// asked for it, send it and forget the process.
    pub(super) fn hand_over(&mut self, pid: Pid) {
        let Some(l) = self.local.get(&pid) else {
            return;
        };
        // The new host will not re-emit the output up to the snapshot.
        let delivered = self.io.delivered();
        if l.pending.iter().any(|p| delivered < p.output_mark) {
            return;
        }
        let Some(snapshot) = l.handover.clone() else {
            return;
        };
        let Some(askers) = self.restores.handovers.remove(&pid) else {
            return;
        };
        for a in askers {
            for f in checkpoint::to_snapshot_frames(&snapshot) {
                self.send_to(a, f);
            }
        }
        // Until the new host's own checkpoints are on its replicas, this is
        // the only copy of the process's state: kept as a replica would, so
        // that a restore finds it if the new host dies first (found by the
        // simulator, seed 211: the process restarted from superstep 0,
        // whose messages nobody retained any more, and the job hung).
        let superstep = snapshot.superstep;
        self.store.insert((*snapshot).clone());
        self.local.remove(&pid);
        self.handed_over(pid, superstep);
    }

    /// A leaving process at a sync: take a whole snapshot for its new host.
    pub(super) fn prepare_handover(&mut self, pid: Pid) {
        let Some(l) = self.local.get_mut(&pid) else {
            return;
        };
        if l.handover.is_some() {
            return;
        }
        if let State::AtSync(p) = std::mem::replace(&mut l.state, State::Busy) {
            // Its `Done`s wait for its replicas as usual; the new host
            // repeats them after it replicated the snapshot itself.
            self.spawn_capture(pid, *p, false);
        }
    }

    /// Advance the safe point and drop what nobody can need any more.
    pub(super) fn collect_garbage(&mut self) {
        let lowest_waiting = self
            .local
            .values()
            .filter(|l| !matches!(l.state, State::Exited))
            .map(|l| l.superstep)
            .min();
        // The newest superstep whose barrier is complete.
        let mut s = self.complete.map_or(0, |s| s + 1);
        // No `Done` can exist beyond the furthest local process (plus the
        // one superstep others may be ahead): once everyone exited, every
        // later barrier is trivially complete, so stop there.
        let horizon = self.local.values().map(|l| l.superstep).max().unwrap_or(0) + 1;
        while s <= horizon && self.barrier.complete(s) {
            self.complete = Some(s);
            self.observer.on_complete(s, self.now);
            s += 1;
        }
        // The newest checkpointed superstep before `c − 1`: `Done(q, c)`
        // waits only for q's checkpoints before `c − 1` (`K_{c−1}` may still
        // be on its way), so those are what a complete barrier `c` proves
        // safe.
        let safe = self
            .complete
            .and_then(|c| c.checked_sub(1))
            .and_then(|c| newest_checkpointed_before(c, self.checkpoint_every))
            .or(self.safe);
        if safe <= self.safe {
            return;
        }
        self.safe = safe;
        let Some(g) = safe else { return };
        for msgs in self.retained.values_mut() {
            msgs.retain(|m| m.superstep >= g);
        }
        self.retained_bytes = self
            .retained
            .values()
            .map(|m| checkpoint::outbox_bytes(m))
            .sum();
        self.routing.relays.retain(|&(_, s, _), _| s >= g);
        self.dones.retain(|&(_, s), d| s >= g || d.exited);
        let forget = lowest_waiting.map_or(g, |w| w.min(g));
        self.barrier.forget_before(forget);
    }
}
