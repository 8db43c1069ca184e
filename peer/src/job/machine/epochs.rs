//! A new assignment of the job (an epoch): new peers and placement,
//! restores and migrations, fencing of removed peers.

use super::*;

impl<I: JobIo> Machine<I> {
    /// Switch to a newer assignment. Returns false if this peer is no longer
    /// part of the job.
    pub(super) fn reassign(&mut self, a: JobAssignment) -> bool {
        if a.epoch <= self.epoch
            || a.job != self.job
            || a.nprocs != self.info.nprocs
            || a.limits.redundancy as usize != self.hosts.copies()
        {
            return true;
        }
        // Hosts change: supersteps around the change (restores, handovers)
        // say nothing about anyone's speed.
        self.observer.interrupt(self.now);
        let hosts = match check_assignment(self.me, &a) {
            Ok(h) => h,
            Err(e) => {
                tracing::info!(job = self.job, "leaving the job: {e}");
                return false;
            }
        };
        self.epoch = a.epoch;
        self.routing.sites = sites_of(&a);
        let old_peers: BTreeSet<PeerId> = self.peers.iter().copied().collect();
        self.peers = a.peers.iter().map(|p| p.id).collect();
        self.hosts = hosts;
        self.elect();
        self.io.update_peers(&self.peers);
        // Links: close removed peers, open new ones.
        let now: BTreeSet<PeerId> = self.peers.iter().copied().collect();
        // (From the old peer list, not the links: a peer whose job ended
        // has no link but may still be waited for.)
        let gone: Vec<PeerId> = old_peers
            .iter()
            .filter(|p| !now.contains(p) && **p != self.me)
            .copied()
            .collect();
        for p in &gone {
            self.close_link(*p);
            self.assemblers.remove(p);
        }
        // A peer of the job whose job had ended here and is listed again
        // gets everything again, like a newcomer.
        let mut relinked = Vec::new();
        for p in &a.peers {
            if p.id != self.me && !self.routing.links.contains_key(&p.id) {
                self.open_link(p.id, p.addr.clone());
                if old_peers.contains(&p.id) {
                    relinked.push(p.id);
                }
            }
        }
        // Replicas that are gone will not answer.
        let delivered = self.io.delivered();
        for pid in self.local.keys().copied().collect::<Vec<_>>() {
            let targets = self.replica_targets(pid);
            let Some(l) = self.local.get_mut(&pid) else {
                continue;
            };
            let mut now_due = Vec::new();
            for p in l.pending.iter_mut() {
                for g in &gone {
                    p.waiting.remove(g);
                }
                // Replicas chosen among the new peer list get the checkpoint too.
                let fresh: Vec<PeerId> = targets
                    .iter()
                    .copied()
                    .filter(|t| !old_peers.contains(t) || gone.contains(t))
                    .collect();
                let snap = p.snapshot.clone();
                // Frames for replicas that are gone are void.
                p.unsent.retain(|(r, _)| !gone.contains(r));
                // Still waiting for its output, or for its copies to agree:
                // new replicas wait with the others.
                let held = !p.unsent.is_empty() || !p.agreed || delivered < p.output_mark;
                for t in fresh {
                    p.waiting.insert(t);
                    for f in whole(&snap) {
                        if held {
                            p.unsent.push((t, f.into()));
                        } else {
                            now_due.push((t, f));
                        }
                    }
                }
            }
            for (t, f) in now_due {
                self.send_to(t, f);
            }
            self.release_if_acked(pid);
        }
        // A fetch that waited for a peer that left: that peer may have gone
        // on checkpointing the process to the others after they answered
        // (it was its host, handing it over), so every peer is asked again
        // and the newest answer wins (found by the simulator, seed 67245:
        // the process was restored from a checkpoint older than the safe
        // point, whose messages nobody retained any more).
        let linked: BTreeSet<PeerId> = self.routing.links.keys().copied().collect();
        let mut ask_again = Vec::new();
        for (&pid, f) in self.restores.fetches.iter_mut() {
            if f.waiting.iter().any(|p| !now.contains(p)) {
                f.waiting = linked.clone();
                ask_again.push(pid);
            }
        }
        for pid in ask_again {
            for &p in &linked {
                self.ask_for(p, pid);
            }
        }
        let fetching: Vec<Pid> = self.restores.fetches.keys().copied().collect();
        for pid in fetching {
            self.finish_fetch(pid);
        }
        let restore: BTreeSet<Pid> = a.restore.iter().copied().collect();
        for &pid in &a.restore {
            if self.hosts.runs(pid, self.me) {
                match self.local.get_mut(&pid) {
                    None => self.begin_fetch(pid),
                    // It was to move away and stays after all (its new host
                    // was lost before it asked): it goes on here (found by
                    // the simulator, seed 670: it waited for a handover
                    // forever). Requests for it are kept: one may come from
                    // a peer a newer epoch moves it to, which we have not
                    // seen yet (seed 11002: cleared here, the request went
                    // unanswered when that epoch came, and the job hung);
                    // a process is handed over only when it leaves.
                    Some(l) => {
                        l.leaving = false;
                        l.handover = None;
                    }
                }
            } else if self
                .local
                .get(&pid)
                .is_some_and(|l| matches!(l.state, State::Fetching))
            {
                self.abandon_fetch(pid);
            } else if let Some(l) = self.local.get_mut(&pid) {
                l.leaving = true;
            }
        }
        // Processes waiting for the program that no longer live here never
        // start; one restored here is fetched, not started fresh.
        let mut never_started = Vec::new();
        if let Some((fresh, restored)) = &mut self.program.deferred {
            let me = self.me;
            let hosts = &self.hosts;
            for p in fresh.iter().chain(restored.iter()) {
                if !hosts.runs(*p, me) && !never_started.contains(p) {
                    never_started.push(*p);
                }
            }
            restored.retain(|p| hosts.runs(*p, me));
            fresh.retain(|p| hosts.runs(*p, me) && !restored.contains(p));
        }
        // Moved away before the program arrived: nothing to hand over, but
        // the supernode learns that this peer let go of them (a draining
        // peer then leaves the job).
        never_started.sort_unstable();
        for pid in never_started {
            self.handed_over(pid, 0);
        }
        // Processes here whose host moved without being listed (should not
        // happen) are handed over too.
        for (pid, l) in self.local.iter_mut() {
            if !self.hosts.runs(*pid, self.me) {
                l.leaving = true;
            }
        }
        // With redundancy a leaving copy is not handed over (its new host
        // starts from the last agreed checkpoint): it just stops here.
        if self.hosts.copies() > 1 {
            let leaving: Vec<(Pid, u32)> = self
                .local
                .iter()
                .filter(|(_, l)| l.leaving)
                .map(|(pid, l)| (*pid, l.superstep))
                .collect();
            for (pid, superstep) in leaving {
                self.local.remove(&pid);
                self.handed_over(pid, superstep);
            }
        }
        // Re-send what the new hosts need.
        let mut by_host: BTreeMap<PeerId, BTreeSet<Pid>> = BTreeMap::new();
        for &pid in &restore {
            for &host in self.hosts.of(pid) {
                if host != self.me {
                    by_host.entry(host).or_default().insert(pid);
                }
            }
        }
        for (host, pids) in by_host {
            self.resync(host, Some(&pids));
        }
        // Messages to pids restored here that their old host never got.
        let to_me: Vec<WireMessage> = self
            .retained
            .values()
            .flatten()
            .filter(|m| restore.contains(&m.dst) && self.hosts.runs(m.dst, self.me))
            .cloned()
            .collect();
        for m in to_me {
            self.deliver_to(self.me, m);
        }
        // Multicasts this peer relayed before the assignment reached it:
        // their messages to pids now restored here went to no local process
        // then (found by the simulator, seed 328: the messages of a chain
        // broadcast to a migrating process were lost at its new host).
        let relayed: Vec<WireMessage> = self
            .routing
            .relays
            .values()
            .flatten()
            .filter_map(|f| f.payload().map(|p| (&f.head, p)))
            .flat_map(|(head, payload)| {
                head.dsts
                    .iter()
                    .filter(|(dst, _)| restore.contains(dst) && self.hosts.runs(*dst, self.me))
                    .map(|&(dst, seq)| routing::relayed_message(head, dst, seq, payload))
            })
            .collect();
        for m in relayed {
            self.deliver_to(self.me, m);
        }
        let newcomers: Vec<PeerId> = now
            .iter()
            .filter(|p| !old_peers.contains(p) && **p != self.me)
            .copied()
            .collect();
        for p in newcomers {
            self.resync(p, Some(&BTreeSet::new()));
        }
        for p in relinked {
            self.resync(p, None);
            self.resend_relayed(p);
        }
        self.relays_after_reassign();
        if !gone.is_empty() {
            self.relay_around(&gone);
            if !self.program.has_program
                && self
                    .program
                    .dist
                    .as_ref()
                    .is_some_and(|d| gone.iter().any(|g| d.involves(*g)))
            {
                self.fall_back("a peer passing the program on left the job".into());
            }
        }
        true
    }
}
