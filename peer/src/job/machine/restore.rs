//! Restoring a process from the newest checkpoint the job's other peers hold
//! (`FetchCheckpoint`), and taking it over from there.

use super::*;

/// Processes coming to this peer from the snapshots others hold, and
/// processes leaving it.
#[derive(Default)]
pub(super) struct Restores {
    /// Restores waiting for the job's peers' answers.
    pub(super) fetches: BTreeMap<Pid, Fetch>,
    /// Peers that asked for a snapshot of a local process (a handover).
    pub(super) handovers: BTreeMap<Pid, BTreeSet<PeerId>>,
}

/// A restore asking the job's peers for their newest snapshot.
pub(super) struct Fetch {
    pub(super) waiting: BTreeSet<PeerId>,
    pub(super) best: Option<Arc<Snapshot>>,
}

impl<I: JobIo> Machine<I> {
    pub(super) fn begin_fetch(&mut self, pid: Pid) {
        if !self.program.has_program {
            let (_, restored) = self.program.deferred.get_or_insert_default();
            if !restored.contains(&pid) {
                restored.push(pid);
            }
            return;
        }
        let waiting: BTreeSet<PeerId> = self.routing.links.keys().copied().collect();
        let best = self.store.newest(pid).cloned().map(Arc::new);
        self.local.insert(pid, Local::new(State::Fetching));
        for &p in &waiting {
            self.ask_for(p, pid);
        }
        self.restores.fetches.insert(pid, Fetch { waiting, best });
        self.finish_fetch(pid);
    }

    pub(super) fn on_snapshot(&mut self, from: PeerId, pid: Pid, snap: Option<Snapshot>) {
        if snap.as_ref().is_some_and(|s| s.pid != pid) {
            return;
        }
        let Some(f) = self.restores.fetches.get_mut(&pid) else {
            return;
        };
        f.waiting.remove(&from);
        if let Some(s) = snap
            && f.best.as_ref().is_none_or(|b| s.superstep > b.superstep)
        {
            f.best = Some(Arc::new(s));
        }
        self.finish_fetch(pid);
    }

    pub(super) fn finish_fetch(&mut self, pid: Pid) {
        let Some(f) = self.restores.fetches.get(&pid) else {
            return;
        };
        if !f.waiting.is_empty() {
            return;
        }
        let f = self.restores.fetches.remove(&pid).expect("checked above");
        // This peer may have become a replica of the process while it
        // waited (found by the simulator, seed 171475: checkpoints that
        // arrived after the fetch began were not looked at, and the
        // process restarted from superstep 0).
        let own = self
            .store
            .newest(pid)
            .filter(|s| f.best.as_ref().is_none_or(|b| s.superstep > b.superstep))
            .cloned()
            .map(Arc::new);
        match own.or(f.best) {
            None => {
                tracing::warn!(
                    job = self.job,
                    pid,
                    "no snapshot of the process survived; starting it from the beginning"
                );
                self.emit(PeerEvent::ProcessRestored {
                    job: self.job,
                    pid,
                    superstep: 0,
                    epoch: self.epoch,
                    from_start: true,
                });
                self.local.remove(&pid);
                self.start_fresh(vec![pid]);
            }
            Some(snapshot) => {
                let digests = (self.hosts.copies() > 1).then_some(self.checkpoint_every);
                if let Some(l) = self.local.get_mut(&pid) {
                    l.state = State::Busy;
                }
                self.io.restore(pid, snapshot, digests);
            }
        }
    }

    /// `pid` moves on before it was restored here: nothing of it runs
    /// here to hand over at a sync, so its new host (whoever asked, or
    /// asks later) gets the newest snapshot this peer knows, as from any
    /// replica, and the supernode learns that this peer let go of it.
    /// Found by the simulator, seed 86 (with drains): a process migrated
    /// on while its restore here still waited for a lost peer's answer;
    /// its new host and this peer each waited for the other's handover, and
    /// the job hung.
    pub(super) fn abandon_fetch(&mut self, pid: Pid) {
        let fetched = self.restores.fetches.remove(&pid).and_then(|f| f.best);
        self.local.remove(&pid);
        let own = self.store.newest(pid).map(|s| s.superstep);
        if let Some(best) = fetched.filter(|b| own.is_none_or(|o| b.superstep > o)) {
            self.store.insert((*best).clone());
        }
        let askers = self.restores.handovers.remove(&pid).unwrap_or_default();
        for a in askers {
            self.answer_fetch(a, pid);
        }
        let superstep = self.store.newest(pid).map_or(0, |s| s.superstep);
        self.handed_over(pid, superstep);
    }

    /// Asks `to` for its newest snapshot of `pid`, naming our epoch.
    pub(super) fn ask_for(&mut self, to: PeerId, pid: Pid) {
        let epoch = self.epoch;
        self.send_to(to, Frame::FetchCheckpoint { pid, epoch });
    }

    /// Answers `to`'s `FetchCheckpoint` for `pid` with the newest snapshot
    /// this peer holds as a replica, if any.
    pub(super) fn answer_fetch(&mut self, to: PeerId, pid: Pid) {
        match self.store.newest(pid) {
            Some(s) => {
                let s = s.clone();
                for f in checkpoint::to_snapshot_frames(&s) {
                    self.send_to(to, f);
                }
            }
            None => self.send_to(
                to,
                Frame::Snapshot {
                    pid,
                    snapshot: None,
                },
            ),
        }
    }

    pub(super) fn on_restored(
        &mut self,
        pid: Pid,
        snapshot: Arc<Snapshot>,
        r: Result<Option<Proc<I::Guest>>, HostError>,
    ) {
        let c = snapshot.superstep;
        let p = match r {
            Ok(p) => p,
            Err(e) => {
                return self.fail(
                    Some(pid),
                    format!(
                        "could not restore the process from its checkpoint of superstep {c}: {e}"
                    ),
                );
            }
        };
        let Some(l) = self.local.get_mut(&pid) else {
            return;
        };
        l.superstep = c;
        self.barrier.set_floor(pid, c);
        // Checkpointed at the sync of `c`, the process had passed barrier
        // `c − 1`, so that barrier is complete. A peer that joins the job
        // to restore it gets the others' `Done`s only from their safe points
        // on (never later than `c`), so without this it might never see
        // some barrier before `c` complete, and would retain every message
        // for the rest of the job (found by the simulator, seed 1466324). The
        // observer measures nothing across it: the hosts just changed.
        if let Some(passed) = c.checked_sub(1)
            && self.complete < Some(passed)
        {
            self.complete = Some(passed);
            self.observer.on_complete(passed, self.now);
        }
        self.emit(PeerEvent::ProcessRestored {
            job: self.job,
            pid,
            superstep: c,
            epoch: self.epoch,
            from_start: false,
        });
        // Re-send what it sent since the safe point; receivers drop repeats.
        for m in snapshot.outbox.clone() {
            self.deliver(m);
        }
        self.flush_all();
        // What it sent before the safe point nobody can need (every
        // process has a safe checkpoint after it): it is not retained again.
        let safe = self.safe;
        let kept = snapshot
            .outbox
            .iter()
            .filter(|m| safe.is_none_or(|g| m.superstep >= g))
            .cloned()
            .collect();
        self.retained.insert(pid, kept);
        self.retained_bytes = self
            .retained
            .values()
            .map(|m| checkpoint::outbox_bytes(m))
            .sum();
        // Its `Done`s go out once the snapshot is on its (new) replicas.
        let supersteps: BTreeSet<u32> = snapshot
            .outbox
            .iter()
            .map(|m| m.superstep)
            .chain([c])
            .collect();
        // With redundancy the `Done` of `c` carries the state's digest, as
        // the other copies' did.
        let digest = match &p {
            Some(p) => p.tracker.last_state_digest(),
            None => snapshot.state_digest(self.checkpoint_every),
        };
        let redundant = self.hosts.copies() > 1;
        let held: Vec<(u32, ProcDone)> = supersteps
            .into_iter()
            .map(|s| {
                let mut d = done_of(pid, snapshot.exited && s == c, &snapshot.outbox, s);
                if redundant && s == c {
                    d.digest = Some(digest);
                }
                (s, d)
            })
            .collect();
        let targets = self.replica_targets(pid);
        for &r in &targets {
            for f in whole(&snapshot) {
                self.send_to(r, f);
            }
        }
        let l = self.local.get_mut(&pid).expect("checked above");
        l.held = held;
        l.pending = VecDeque::from([Pending {
            superstep: c,
            waiting: targets.into_iter().collect(),
            snapshot: snapshot.clone(),
            gates_own: true,
            // Its output up to `c` was delivered by its old host.
            output_mark: 0,
            unsent: Vec::new(),
            digest,
            // What replicas hold, the copies agreed on.
            agreed: true,
        }]);
        l.state = match p {
            Some(p) => State::AtSync(Box::new(p)),
            None => State::Exited,
        };
        self.release_if_acked(pid);
    }
}
