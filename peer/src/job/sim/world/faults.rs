//! The faults of a schedule and the supernode's answers: what it makes of
//! the events peers upload, peers killed, connections cut, processes
//! migrated, lost peers noticed and their processes placed again.

use super::*;

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
        p.m = None;
        p.life += 1;
        self.note(8);
        let others: Vec<PeerId> = self.peers.keys().copied().filter(|&o| o != peer).collect();
        for o in others {
            // What it had in flight is lost with it.
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
        // The supernode notices when its lease runs out (or sooner).
        let d = self.rng.range(200, 3000);
        self.at(d, Event::Detect(peer));
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

    /// The supernode moves `pid` to another live peer of the job.
    pub(super) fn migrate(&mut self, pid: Pid) {
        let a = &self.assignment;
        let from = a.placement[pid as usize] as usize;
        let to = (0..a.peers.len())
            .filter(|&i| i != from && self.alive(a.peers[i].id))
            .min_by_key(|&i| (mix(self.seed, i as u64), i));
        let Some(to) = to else {
            return;
        };
        let mut next = self.assignment.clone();
        next.placement[pid as usize] = to as u32;
        next.restore = vec![pid];
        next.migrate = vec![pid];
        self.publish(next);
    }

    /// The supernode declares `peer` gone and restores its processes on a
    /// spare peer or another peer of the job.
    pub(super) fn detect(&mut self, peer: PeerId) {
        if !self.gone.insert(peer) {
            return;
        }
        let a = &self.assignment;
        let Some(gone) = a.peers.iter().position(|p| p.id == peer) else {
            return;
        };
        let mut peers: Vec<JobPeer> = a.peers.clone();
        peers.remove(gone);
        let mut placement: Vec<u32> = a.placement.clone();
        let lost: Vec<Pid> = (0..a.nprocs)
            .filter(|&p| placement[p as usize] as usize == gone)
            .collect();
        for i in placement.iter_mut() {
            if *i as usize > gone {
                *i -= 1;
            }
        }
        let spare = (1..=PeerId::from(self.plan.peers + self.plan.spares)).find(|id| {
            self.alive(*id) && !peers.iter().any(|p| p.id == *id) && !self.gone.contains(id)
        });
        let target = match spare {
            Some(s) if self.rng.chance(1, 2) => {
                peers.push(peer_entry(s));
                peers.len() - 1
            }
            _ => self.rng.range(0, peers.len() as u64 - 1) as usize,
        };
        for &pid in &lost {
            placement[pid as usize] = target as u32;
        }
        let mut next = self.assignment.clone();
        next.peers = peers;
        next.placement = placement;
        next.restore = lost;
        next.migrate = vec![];
        self.publish(next);
    }

    pub(super) fn publish(&mut self, mut next: JobAssignment) {
        next.epoch = self.assignment.epoch + 1;
        self.note(10 ^ next.epoch << 8);
        self.assignment = next.clone();
        // Each peer's commands come in order (the supernode's queue).
        for p in &next.peers {
            let d = self.rng.range(1, 30);
            let at = self
                .assign_at
                .get(&p.id)
                .copied()
                .unwrap_or(0)
                .max(self.now + d);
            self.assign_at.insert(p.id, at);
            self.at(at - self.now, Event::Assign(p.id, Box::new(next.clone())));
        }
    }
}
