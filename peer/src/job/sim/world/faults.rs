//! The faults of a schedule and the supernode's answers: what it makes of
//! the events peers upload, peers killed, connections cut, processes
//! migrated, lost peers noticed and their processes placed again.

use super::*;
use placement::epochs;

impl World {
    /// What the supernode makes of an event `peer` uploaded.
    pub(super) fn supernode(&mut self, peer: PeerId, e: PeerEvent) {
        match e {
            PeerEvent::Output { pid, seq, data, .. } => {
                let o = self.output.entry(pid).or_default();
                match o.get(&seq) {
                    Some(old) if *old != data => {
                        let old = old.clone();
                        self.violate(format!(
                            "pid {pid}'s output record {seq} came as {old:?} and again as {data:?}"
                        ));
                    }
                    Some(_) => {}
                    None => {
                        o.insert(seq, data);
                    }
                }
            }
            PeerEvent::ProcessHandedOver { pid, epoch, .. } => {
                if let Some(slot) =
                    epochs::handover_slot(&self.rows, self.plan.nprocs, peer, pid, epoch)
                {
                    self.rows[slot as usize].handed_over = true;
                    if !self.draining.is_empty() && !self.rebalance_due {
                        self.rebalance_due = true;
                        self.at(10, Event::Rebalance);
                    }
                }
            }
            PeerEvent::ProcessExited { pid, .. } => {
                self.exited.insert(pid);
            }
            PeerEvent::ProcessFailed { reason, pid, .. } => {
                self.violate(format!(
                    "peer {peer} failed the job (pid {pid:?}): {reason}"
                ));
            }
            PeerEvent::ProcessAborted { reason, pid, .. } => {
                self.violate(format!("pid {pid} aborted on peer {peer}: {reason}"));
            }
            _ => {}
        }
    }

    /// `peer` dies: its machine and everything it had not uploaded are
    /// gone, and its connections break.
    pub(super) fn kill(&mut self, peer: PeerId) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if !p.alive || p.m.is_none() {
            return;
        }
        p.alive = false;
        self.note(8);
        self.drop_machine(peer);
        // The supernode notices when its lease runs out (or sooner).
        let d = self.rng.range(200, 3000);
        self.at(d, Event::Detect(peer));
    }

    /// The supernode told `peer` to leave the job (`KillJob`): the peer
    /// uploads what it emitted, stops the job and its links close.
    pub(super) fn kill_job(&mut self, peer: PeerId) {
        if !self.alive(peer) || self.peers[&peer].m.is_none() {
            return;
        }
        self.note(11);
        self.upload(peer);
        self.drop_machine(peer);
    }

    /// `peer`'s machine is gone: its connections break, and what it had in
    /// flight is lost.
    fn drop_machine(&mut self, peer: PeerId) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        p.m = None;
        p.life += 1;
        let others: Vec<PeerId> = self.peers.keys().copied().filter(|&o| o != peer).collect();
        for o in others {
            if let Some(c) = self.conns.get_mut(&(peer, o)) {
                c.broken = c.id;
                if c.up {
                    c.up = false;
                    let d = self.rng.range(0, 5);
                    self.at(
                        d,
                        Event::Inbound(
                            o,
                            Inbound::Closed {
                                from: peer,
                                error: Some("reset".into()),
                            },
                        ),
                    );
                }
            }
            if let Some(c) = self.conns.get_mut(&(o, peer))
                && c.up
            {
                c.up = false;
                c.broken = c.id;
                let d = self.rng.range(0, 5);
                self.at(
                    d,
                    Event::Inbound(
                        o,
                        Inbound::SendFailed {
                            to: peer,
                            error: "connection reset".into(),
                        },
                    ),
                );
            }
        }
    }

    /// The connection `a → b` breaks: what was in flight is lost; `a`'s
    /// writer fails, `b` sees it close.
    pub(super) fn cut(&mut self, a: PeerId, b: PeerId) {
        if !self.alive(a) || !self.alive(b) {
            return;
        }
        let Some(c) = self.conns.get_mut(&(a, b)) else {
            return;
        };
        if !c.up {
            return;
        }
        c.broken = c.id;
        c.up = false;
        self.note(9);
        let d = self.rng.range(0, 5);
        self.at(
            d,
            Event::Inbound(
                a,
                Inbound::SendFailed {
                    to: b,
                    error: "cut".into(),
                },
            ),
        );
        let d = self.rng.range(0, 5);
        self.at(
            d,
            Event::Inbound(
                b,
                Inbound::Closed {
                    from: a,
                    error: Some("cut".into()),
                },
            ),
        );
    }

    /// The DHHT host of `pid` changes to another peer of the job that the
    /// supernode thinks can take work (it may have died unnoticed).
    pub(super) fn migrate(&mut self, pid: Pid) {
        let from = self.rows[pid as usize].peer;
        let to = self
            .job_peers
            .iter()
            .copied()
            .filter(|&p| p != from && self.usable(p))
            .min_by_key(|&p| (mix(self.seed, p as u64), p));
        if let Some(to) = to {
            self.dhht.insert(pid, to);
            self.rebalance();
        }
    }

    /// `peer`'s volunteer drains it: its processes move away, and once it
    /// hosts and hands over nothing it leaves the job.
    pub(super) fn drain(&mut self, peer: PeerId) {
        if self.gone.contains(&peer) || !self.draining.insert(peer) {
            return;
        }
        self.note(12);
        self.rebalance();
    }

    /// Whether the supernode would give `peer` work: not known gone, not
    /// draining.
    fn usable(&self, peer: PeerId) -> bool {
        !self.gone.contains(&peer) && !self.draining.contains(&peer)
    }

    /// The supernode's rebalance and drain loop, with the real decisions
    /// ([`placement::epochs::plan_rebalance`], `has_idle_drainer`): a
    /// process goes to its DHHT host (`self.dhht`, else where it is; off a
    /// draining peer, the first usable peer of the job or a spare). A
    /// process still being handed over does not move yet: the loop runs
    /// again later, as the supernode's does.
    pub(super) fn rebalance(&mut self) {
        let usable: Vec<PeerId> = self
            .job_peers
            .iter()
            .copied()
            .chain(self.peers.keys().copied())
            .filter(|&p| self.usable(p))
            .collect();
        let dhht = |r: &epochs::Placed| {
            let moved = self.dhht.get(&r.pid).copied().filter(|&p| self.usable(p));
            if self.draining.contains(&r.peer) {
                moved.or_else(|| usable.first().copied())
            } else {
                moved.or(Some(r.peer))
            }
        };
        let plan = epochs::plan_rebalance(
            &self.rows,
            &self.draining,
            &BTreeSet::new(),
            |r, _| dhht(r),
            |_, _| true,
        );
        if !plan.moves.is_empty() {
            self.new_epoch(epochs::Change {
                moves: plan.moves,
                migrate: true,
                ..epochs::Change::default()
            });
        } else if epochs::has_idle_drainer(&self.job_peers, &self.rows, &self.draining) {
            self.new_epoch(epochs::Change::default());
        }
        if plan.pending && !self.rebalance_due {
            self.rebalance_due = true;
            self.at(100, Event::Rebalance);
        }
    }

    /// The supernode declares `peer` gone and restores its processes, as
    /// [`placement::epochs::plan_restore`] decides: on the DHHT host (here
    /// a spare peer or another peer of the job, by the seed) or the
    /// fallbacks.
    pub(super) fn detect(&mut self, peer: PeerId) {
        if !self.gone.insert(peer) || !self.job_peers.contains(&peer) {
            return;
        }
        let live: BTreeSet<PeerId> = self
            .peers
            .keys()
            .copied()
            .filter(|p| !self.gone.contains(p))
            .collect();
        let job_live: Vec<PeerId> = self
            .job_peers
            .iter()
            .copied()
            .filter(|p| live.contains(p))
            .collect();
        let usable: BTreeSet<PeerId> = live
            .iter()
            .copied()
            .filter(|p| !self.draining.contains(p))
            .collect();
        let spare = usable.iter().copied().find(|p| !self.job_peers.contains(p));
        let dhht = match spare {
            Some(s) if self.rng.chance(1, 2) => Some(s),
            _ if job_live.is_empty() => None,
            _ => Some(job_live[self.rng.range(0, job_live.len() as u64 - 1) as usize]),
        };
        let plan = epochs::plan_restore(&self.rows, &[peer], |_, _| {
            epochs::fallback_host(
                dhht.filter(|p| usable.contains(p)),
                &job_live,
                &usable,
                &live,
            )
        });
        if !plan.homeless.is_empty() {
            return self.violate(format!(
                "the supernode found no peer for pids {:?}",
                plan.homeless
            ));
        }
        self.new_epoch(plan.change);
    }

    /// The supernode's next epoch: `change` applied to its placements, the
    /// peers and the assignment as the real supernode makes them.
    fn new_epoch(&mut self, change: epochs::Change) {
        let epoch = self.assignment.epoch + 1;
        epochs::apply(&mut self.rows, &change, epoch);
        let mut ranked: Vec<PeerId> = self
            .peers
            .keys()
            .copied()
            .filter(|&p| self.usable(p))
            .collect();
        ranked.sort_by_key(|&p| (mix(self.seed ^ 0x5eed, p as u64), p));
        let next = epochs::next_peers(
            &self.job_peers,
            &self.rows,
            &change,
            &self.draining,
            &ranked,
            self.assignment.limits.replicas,
        );
        let placement =
            match epochs::placement_indices(&self.rows, &next.peers, self.assignment.nprocs) {
                Ok(p) => p,
                Err(e) => return self.violate(format!("the supernode's epoch {epoch}: {e}")),
            };
        let (restore, migrate) = epochs::restore_and_migrate(&change, self.assignment.nprocs);
        self.tally.migrations += u32::from(change.migrate);
        self.tally.in_place += change.restore_in_place.len() as u32;
        self.tally.joined += next
            .peers
            .iter()
            .filter(|p| !self.job_peers.contains(p))
            .count() as u32;
        self.tally.drained += next.drained.len() as u32;
        self.job_peers = next.peers;
        for &p in change.leave.iter().chain(&next.drained) {
            if !self.gone.contains(&p) {
                self.command(p, Event::KillJob(p));
            }
        }
        let mut a = self.assignment.clone();
        a.peers = self.job_peers.iter().map(|&id| peer_entry(id)).collect();
        a.placement = placement;
        a.restore = restore;
        a.migrate = migrate;
        self.publish(a);
    }

    pub(super) fn publish(&mut self, mut next: JobAssignment) {
        next.epoch = self.assignment.epoch + 1;
        self.note(10 ^ next.epoch << 8);
        self.assignment = next.clone();
        // Each peer's commands come in order (the supernode's queue).
        for p in &next.peers {
            self.command(p.id, Event::Assign(p.id, Box::new(next.clone())));
        }
    }

    /// Sends `peer` a command (`e`): each peer's commands come in order,
    /// as from the supernode's queue.
    fn command(&mut self, peer: PeerId, e: Event) {
        let d = self.rng.range(1, 30);
        let at = self
            .assign_at
            .get(&peer)
            .copied()
            .unwrap_or(0)
            .max(self.now + d);
        self.assign_at.insert(peer, at);
        self.at(at - self.now, e);
    }
}
