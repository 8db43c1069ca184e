//! Running the supersteps: fresh processes, resumes on the slots, the
//! superstep's messages and `Done`s, captures at checkpointed syncs, and the
//! barrier (`pump`) that lets processes into their next superstep.

use super::*;

impl<I: JobIo> Machine<I> {
    /// Tell every peer (and the local barrier) that `pid` is through `s`.
    pub(super) fn announce(&mut self, s: u32, d: ProcDone) {
        timeline(d.pid, s, "Done sent");
        self.dones.insert((d.pid, s), d.clone());
        let peers: Vec<PeerId> = self.routing.links.keys().copied().collect();
        for p in peers {
            // The acknowledgements held for `p` ride with it.
            let acks = self
                .held_acks
                .remove(&p)
                .map(|h| h.into_iter().collect())
                .unwrap_or_default();
            self.send_to(
                p,
                Frame::Done {
                    superstep: s,
                    procs: vec![d.clone()],
                    acks,
                },
            );
        }
        if let Err(e) = self.barrier.on_done_from(s, d, self.me) {
            self.fail(
                None,
                format!("a local process's report broke the protocol: {e}"),
            );
        }
    }

    pub(super) fn start_fresh(&mut self, pids: Vec<Pid>) {
        if !self.program.has_program {
            let (fresh, _) = self.program.deferred.get_or_insert_default();
            for pid in pids {
                if !fresh.contains(&pid) {
                    fresh.push(pid);
                }
            }
            return;
        }
        let redundant = self.hosts.copies() > 1;
        for pid in pids {
            self.local.insert(pid, Local::new(State::Busy));
            self.io.start(pid, redundant, self.checkpoint_every);
        }
    }

    pub(super) fn spawn_resume(&mut self, pid: Pid, mut p: Proc<I::Guest>) {
        if let Some(l) = self.local.get_mut(&pid) {
            l.state = State::Busy;
            // Replicas' answers so far, for the page tracker (later ones
            // wait for the next superstep).
            for (r, superstep, ok) in std::mem::take(&mut l.acks) {
                p.tracker.acked(r, superstep, ok);
            }
        }
        // A checkpointed superstep is captured right after it, where it ran.
        let s = self.local.get(&pid).map_or(0, |l| l.superstep);
        let capture_input = checkpointed(s, self.checkpoint_every).then(|| CaptureInput {
            outbox: self.retained.get(&pid).cloned().unwrap_or_default(),
            targets: self.replica_targets(pid),
        });
        let alone = self.runs_alone(pid);
        self.io.resume(pid, s, p, capture_input, alone);
    }

    /// Whether nothing of the job needs this machine while `pid`'s next
    /// superstep runs: it is the job's only process, without copies, not
    /// leaving, and each of its checkpoints is sent or may be sent now (its
    /// output reached the supernode). Other peers then send only
    /// acknowledgements of its checkpoints, which wait until it syncs
    /// (`Done(s + 1)` needs those of `K_s` only then), and no other process
    /// waits for anything from here. Such a superstep may run on the
    /// driver's thread, which saves two thread wake-ups per superstep (on
    /// this VM 60–190 µs each, some 7 % of a PageRank superstep).
    pub(super) fn runs_alone(&self, pid: Pid) -> bool {
        let delivered = self.io.delivered();
        self.info.nprocs == 1
            && self.hosts.copies() == 1
            && self.local.get(&pid).is_some_and(|l| {
                !l.leaving
                    && l.handover.is_none()
                    && l.pending
                        .iter()
                        .all(|p| p.unsent.is_empty() || p.may_leave(delivered))
            })
    }

    pub(super) fn on_task(&mut self, task: Task<I::Guest>) {
        if self.failed {
            return;
        }
        match task {
            Task::Resumed(pid, r) => self.on_resumed(pid, r),
            Task::Captured(pid, r) => self.on_captured(pid, r),
            Task::Restored(pid, snap, r) => self.on_restored(pid, snap, r),
        }
    }

    pub(super) fn on_resumed(&mut self, pid: Pid, resumed: Resumed<I::Guest>) {
        let Some(l) = self.local.get(&pid) else {
            return;
        };
        let s = l.superstep;
        let (p, outcome, out) = match resumed {
            Ok(x) => x,
            Err(e) => {
                return self.fail(Some(pid), format!("the process could not run: {e}"));
            }
        };
        let exited = match outcome {
            // A `may_migrate` point: a leaving process still moves at its next sync.
            Outcome::Yield => return self.spawn_resume(pid, p),
            Outcome::Sync => false,
            Outcome::Done => true,
            Outcome::Aborted(reason) => {
                self.emit(PeerEvent::ProcessAborted {
                    job: self.job,
                    pid,
                    superstep: s,
                    reason,
                });
                self.failed = true;
                self.io.kill();
                self.local.clear();
                return;
            }
            Outcome::Failed(reason) => return self.fail(Some(pid), reason),
        };
        self.on_synced(pid, exited, out);
        if exited || checkpointed(s, self.checkpoint_every) {
            self.spawn_capture(pid, p, exited);
        } else if let Some(l) = self.local.get_mut(&pid) {
            l.state = State::AtSync(Box::new(p));
        }
    }

    /// A process's thread reached a sync it captures itself.
    pub(super) fn on_early(&mut self, e: Early) {
        if self.failed || !self.local.contains_key(&e.pid) {
            return;
        }
        self.on_synced(e.pid, e.exited, e.out);
    }

    /// `pid` reached the sync of its current superstep (or returned, when
    /// `exited`) having sent `out`: route the messages, retain them, and
    /// queue its `Done`.
    pub(super) fn on_synced(&mut self, pid: Pid, exited: bool, out: Vec<WireMessage>) {
        let Some(l) = self.local.get(&pid) else {
            return;
        };
        let s = l.superstep;
        let done = done_of(pid, exited, &out, s);
        self.route(&out);
        self.flush_all();
        self.retained_bytes += checkpoint::outbox_bytes(&out);
        self.retained.entry(pid).or_default().extend(out);
        if exited {
            let mark = self.io.emit(PeerEvent::ProcessExited {
                job: self.job,
                pid,
                superstep: s,
            });
            if let Some(l) = self.local.get_mut(&pid) {
                l.exit_mark = mark;
                l.capturing_exit = Some(s);
            }
        }
        if let Some(l) = self.local.get_mut(&pid) {
            if self.hosts.copies() > 1 && (exited || checkpointed(s, self.checkpoint_every)) {
                // It carries the digest of the state being captured.
                l.unsigned = Some((s, done));
            } else {
                l.held.push((s, done));
            }
        }
        // `Done(s)` does not wait for `K_s` (only for the checkpoints
        // before it): the other processes go on while this one is captured
        // and `K_s` is replicated during the next superstep.
        self.release_if_acked(pid);
    }

    pub(super) fn spawn_capture(&mut self, pid: Pid, p: Proc<I::Guest>, exited: bool) {
        if let Some(l) = self.local.get_mut(&pid) {
            l.state = State::Busy;
        }
        let outbox = self.retained.get(&pid).cloned().unwrap_or_default();
        // Replicas' answers so far, for the page tracker (later ones wait
        // for the next capture), and who gets the checkpoint.
        let acks = self
            .local
            .get_mut(&pid)
            .map(|l| std::mem::take(&mut l.acks))
            .unwrap_or_default();
        let targets = self.replica_targets(pid);
        self.io.capture(
            pid,
            p,
            CaptureRequest {
                outbox,
                exited,
                acks,
                targets,
            },
        );
    }

    pub(super) fn on_captured(&mut self, pid: Pid, r: Captured<I::Guest>) {
        timeline(
            pid,
            self.local.get(&pid).map_or(0, |l| l.superstep),
            "capture handed over",
        );
        let (mut p, snapshot, mut planned) = match r {
            Ok(x) => x,
            Err(e) => {
                return self.fail(Some(pid), format!("could not checkpoint the process: {e}"));
            }
        };
        let Some(l) = self.local.get(&pid) else {
            return;
        };
        let s = l.superstep;
        let leaving = l.leaving;
        let exited = snapshot.exited;
        if p.recent.len() == checkpoint::RECYCLE_DEPTH {
            p.recent.pop_front();
        }
        p.recent.push_back(snapshot.clone());
        // The replicas may have changed while it was captured: new ones get
        // frames planned here, gone ones none.
        let targets = self.replica_targets(pid);
        for (r, _) in planned.iter().filter(|(r, _)| !targets.contains(r)) {
            // Planned for, never sent: it holds no base from this capture.
            p.tracker.forget(*r);
        }
        planned.retain(|(r, _)| targets.contains(r));
        let late: Vec<PeerId> = targets
            .iter()
            .copied()
            .filter(|t| !planned.iter().any(|(r, _)| r == t))
            .collect();
        let mut unsent = planned;
        unsent.extend(plan_frames(&mut p.tracker, &snapshot, &late, &p.recent));
        self.io.count_checkpoint();
        let redundant = self.hosts.copies() > 1;
        let digest = p.tracker.last_state_digest();
        if redundant {
            // This copy's vote, now: copy 0's `Done` of an exit waits for
            // its checkpoint's replicas, and so for this agreement.
            self.barrier.on_digest_from(pid, s, digest, self.me);
        }
        let l = self.local.get_mut(&pid).expect("checked above");
        let output_mark = p.process.output_mark().max(l.exit_mark);
        if l.capturing_exit == Some(s) {
            l.capturing_exit = None;
        }
        if let Some((us, mut done)) = l.unsigned.take() {
            if us == s {
                done.digest = Some(digest);
            }
            l.held.push((us, done));
        }
        l.pending.push_back(Pending {
            superstep: s,
            waiting: targets.into_iter().collect(),
            snapshot: snapshot.clone(),
            gates_own: exited,
            output_mark,
            unsent,
            digest,
            agreed: !redundant,
        });
        l.state = if exited {
            State::Exited
        } else {
            State::AtSync(Box::new(p))
        };
        // The process goes on first, if it may: its thread then wakes
        // before the connections' writers take the cores (on two cores
        // this alone took PageRank at p = 1 from 1.44–1.52× native to
        // 1.23–1.42×). One that runs alone, on this thread, would hold
        // its checkpoint back for a whole superstep: that goes first.
        if !leaving {
            if self.runs_alone(pid) {
                self.send_checkpoint(pid);
            }
            self.pump();
        }
        self.send_checkpoint(pid);
        if leaving {
            if let Some(l) = self.local.get_mut(&pid) {
                l.handover = Some(snapshot);
            }
            self.hand_over(pid);
        }
        self.release_if_acked(pid);
    }

    /// Pass every local process whose barrier is complete; hand over leaving
    /// processes that are at a sync.
    pub(super) fn pump(&mut self) {
        if self.failed {
            return;
        }
        self.report_disputes();
        self.release_agreed();
        // Over the peer's memory budget: the job holding the most here
        // fails, rather than the peer (issue 20, finding 1).
        if let Some(state) = self.io.over_budget() {
            // Senders keep every message sent since the last checkpoint
            // (a restore replays them): rare checkpoints pile them up.
            let advice = if self.checkpoint_every > 1 {
                format!(
                    "checkpoint more often (senders keep every message since the last checkpoint, and it is every {} supersteps), use fewer processes per peer or send less per superstep",
                    self.checkpoint_every
                )
            } else {
                "use fewer processes per peer or send less per superstep".to_string()
            };
            let why = format!(
                "{state}; this job holds {} MiB of messages and checkpoints on it, the most of its jobs; {advice}",
                self.held >> 20
            );
            return self.fail(None, why);
        }
        let waiting: Vec<(Pid, u32, bool)> = self
            .local
            .iter()
            .filter(|(_, l)| matches!(l.state, State::AtSync(_)))
            .map(|(pid, l)| (*pid, l.superstep, l.leaving))
            .collect();
        for (pid, s, leaving) in waiting {
            if leaving {
                self.prepare_handover(pid);
                continue;
            }
            if !self.barrier.ready(pid, s) {
                tracing::trace!(
                    job = self.job,
                    me = self.me,
                    pid,
                    s,
                    "waits for {}",
                    self.barrier.missing(pid, s)
                );
                continue;
            }
            let inbox = self.barrier.take(pid, s);
            let Some(l) = self.local.get_mut(&pid) else {
                continue;
            };
            let State::AtSync(mut p) = std::mem::replace(&mut l.state, State::Busy) else {
                continue;
            };
            l.superstep = s + 1;
            self.emit(PeerEvent::Progress {
                job: self.job,
                pid,
                superstep: s + 1,
            });
            let inbox = inbox
                .into_iter()
                .map(|(src, tag, payload)| Message {
                    src,
                    superstep: s,
                    tag,
                    payload,
                })
                .collect();
            p.process.begin_superstep(s + 1, inbox);
            self.spawn_resume(pid, *p);
        }
        self.collect_garbage();
        self.report_held();
    }

    /// Bring this job's share of the peer's held bytes up to date.
    pub(super) fn report_held(&mut self) {
        let now = self.retained_bytes + self.store.total_bytes();
        if now != self.held {
            self.held = now;
            self.io.set_held(now);
        }
    }
}
