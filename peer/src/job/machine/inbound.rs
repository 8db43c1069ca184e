//! What arrives from the data plane: connections, frames (a protocol
//! violation fails the job with a [`ProtocolError`]), and the re-sends a
//! reconnected peer needs.

use super::*;

impl<I: JobIo> Machine<I> {
    pub(super) fn on_inbound(&mut self, event: Inbound) {
        match event {
            Inbound::Connected { from } => {
                // A peer (re)connected: what it answered on a connection
                // that broke may be lost (its writer noticed, we may not
                // have), so ask again what we wait for from it (found by the
                // simulator, seed 6362: a snapshot sent on a broken
                // connection left a restore waiting forever).
                self.ask_again(from);
            }
            Inbound::Closed { from, error } => {
                // Its writer reconnects; partial checkpoint parts are void,
                // and so is a snapshot it was sending us: ask again.
                self.assemblers.remove(&from);
                if let Some(e) = error {
                    tracing::debug!(job = self.job, from, "connection from peer closed: {e}");
                }
                self.ask_again(from);
            }
            Inbound::SendFailed { to, error } => {
                tracing::info!(
                    job = self.job,
                    to,
                    "connection to peer #{to} failed: {error}; reconnecting"
                );
                if self.peers.contains(&to) {
                    // It did not say the job ended there: it may have died.
                    // The supernode checks and, if so, restores its
                    // processes now rather than when its lease runs out.
                    self.emit(PeerEvent::PeerUnreachable {
                        job: self.job,
                        peer: to,
                    });
                }
                if let Some(addr) = self.close_link(to) {
                    self.open_link(to, addr);
                    self.resync(to, None);
                    self.resend_relayed(to);
                }
            }
            Inbound::PeerEnded { to } => {
                // Its job ended (finished or killed): the job is over, or a
                // newer assignment says who runs what. Re-sending would be
                // for nobody; a reassignment that still lists it reconnects.
                tracing::debug!(job = self.job, to, "the job ended on peer #{to}");
                self.close_link(to);
            }
            Inbound::Frame { from, frame } => {
                if !self.peers.contains(&from) {
                    return;
                }
                if let Err(e) = self.on_frame(from, frame) {
                    tracing::warn!(
                        job = self.job,
                        from,
                        "peer #{from} broke the data-plane protocol: {e}"
                    );
                    self.fail(
                        None,
                        format!("peer #{from} broke the data-plane protocol: {e}"),
                    );
                }
            }
        }
    }

    pub(super) fn on_frame(&mut self, from: PeerId, frame: Frame) -> Result<(), ProtocolError> {
        match frame {
            Frame::Data { messages } => {
                for m in messages {
                    self.barrier.on_message_from(m, from)?;
                }
            }
            Frame::Done {
                superstep,
                procs,
                acks,
            } => {
                if from != self.me {
                    self.observer.on_done(from, superstep, self.now);
                }
                for d in procs {
                    self.barrier.on_done_from(superstep, d, from)?;
                }
                for (pid, s) in acks {
                    self.on_ack(from, pid, s, true);
                }
            }
            f @ (Frame::CheckpointPart { .. } | Frame::Checkpoint(_)) => {
                let cap = (self.info.memory_limit as u64)
                    .saturating_add(self.info.outbox_limit as u64 * 4);
                let last = match &f {
                    Frame::Checkpoint(c) => Some((c.pid, c.superstep, c.base.is_none())),
                    _ => None,
                };
                let built = self
                    .assemblers
                    .entry(from)
                    .or_insert_with(|| Assembler::new(cap))
                    .push(f, &mut self.store);
                match built {
                    Ok(Some(Assembled::Checkpoint(snap))) => {
                        let (pid, superstep, exited) = (snap.pid, snap.superstep, snap.exited);
                        tracing::trace!(target: "bspweb::timeline", pid, superstep, from, "replica stored");
                        self.store.insert(snap);
                        let whole = last.is_some_and(|(_, _, whole)| whole);
                        if self.routing.links.contains_key(&from)
                            && ack_may_wait(
                                exited,
                                whole,
                                self.hosts.copies() > 1,
                                self.owes_done(superstep + 1),
                            )
                        {
                            let held = self.held_acks.entry(from).or_default();
                            let newest = held.entry(pid).or_insert(superstep);
                            *newest = (*newest).max(superstep);
                        } else {
                            self.send_ack(from, pid, superstep);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::info!(job = self.job, from, "discarding a checkpoint: {e}");
                        if let Some((pid, superstep, _)) = last {
                            self.send_to(
                                from,
                                Frame::CheckpointAck {
                                    pid,
                                    superstep,
                                    ok: false,
                                },
                            );
                        }
                    }
                }
            }
            Frame::CheckpointAck { pid, superstep, ok } => self.on_ack(from, pid, superstep, ok),
            Frame::FetchCheckpoint { pid, epoch } => {
                if pid >= self.info.nprocs {
                    return Err(ProtocolError::NoSuchPid(pid));
                }
                // Only a newer epoch takes a process that waits here for
                // the program: an older one's request, still on its way,
                // says nothing about where it runs now (found by the
                // simulator, seed 25894: such a request made the process's
                // new host give it up, and the job hung).
                if self.hosts.copies() == 1 && epoch > self.epoch {
                    self.never_start(pid);
                }
                if self.local.contains_key(&pid) && self.hosts.copies() == 1 {
                    // We host it: hand it over at its next sync (once our own
                    // assignment says it moves, if the asker is ahead of us).
                    self.restores.handovers.entry(pid).or_default().insert(from);
                    self.hand_over(pid);
                } else {
                    // With redundancy a copy is never handed over: a new
                    // copy starts from the last checkpoint its copies
                    // agreed on (what replicas hold), and so computes on
                    // its own (a third run must not inherit a state that
                    // may be the wrong one).
                    self.answer_fetch(from, pid);
                }
            }
            f @ Frame::Snapshot { .. } => {
                let Frame::Snapshot { pid, .. } = &f else {
                    unreachable!("matched above")
                };
                let pid = *pid;
                let cap = (self.info.memory_limit as u64)
                    .saturating_add(self.info.outbox_limit as u64 * 4);
                let built = self
                    .assemblers
                    .entry(from)
                    .or_insert_with(|| Assembler::new(cap))
                    .push(f, &mut self.store);
                let snap = match built {
                    Ok(Some(Assembled::Fetched { snapshot, .. })) => snapshot,
                    Ok(_) => None,
                    Err(e) => {
                        tracing::info!(job = self.job, from, pid, "discarding a snapshot: {e}");
                        None
                    }
                };
                self.on_snapshot(from, pid, snap);
            }
            Frame::Relay {
                head,
                offset,
                bytes,
            } => self.on_relay(from, *head, offset, bytes)?,
            Frame::Program { epoch, msg } => self.on_program_msg(from, epoch, msg),
            Frame::Hello { .. } | Frame::Answer { .. } | Frame::Welcome | Frame::Reject { .. } => {
                return Err(ProtocolError::HandshakeFrame);
            }
            Frame::Probe(_) => {
                return Err(ProtocolError::ProbeFrame);
            }
        }
        Ok(())
    }

    /// Ask `peer` again for the snapshots we wait for from it.
    fn ask_again(&mut self, peer: PeerId) {
        let asked: Vec<Pid> = self
            .restores
            .fetches
            .iter()
            .filter(|(_, f)| f.waiting.contains(&peer))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in asked {
            self.ask_for(peer, pid);
        }
    }

    /// A peer asks for `pid`'s state, so a newer assignment than ours moved
    /// it there. If it waits here for the program, it never ran here and
    /// must not start now: the asker learns that no snapshot exists and
    /// starts it itself (found by the simulator, seed 22188: the program
    /// arrived between the answer and our own new assignment, and the
    /// process ran on both peers).
    fn never_start(&mut self, pid: Pid) {
        let Some((fresh, restored)) = &mut self.program.deferred else {
            return;
        };
        let had = fresh.contains(&pid) || restored.contains(&pid);
        fresh.retain(|&p| p != pid);
        restored.retain(|&p| p != pid);
        if had {
            self.handed_over(pid, 0);
        }
    }

    /// Re-send to `peer` what it may have missed: messages to its pids (only
    /// to `only` if given) and every `Done` of ours; a pending checkpoint if
    /// it is a replica; pending snapshot requests.
    pub(super) fn resync(&mut self, peer: PeerId, only: Option<&BTreeSet<Pid>>) {
        let wanted = |dst: Pid| match only {
            Some(set) => set.contains(&dst),
            None => true,
        };
        let msgs: Vec<WireMessage> = self
            .retained
            .values()
            .flatten()
            .filter(|m| self.hosts.runs(m.dst, peer) && wanted(m.dst))
            .cloned()
            .collect();
        for m in msgs {
            self.deliver_to(peer, m);
        }
        self.flush_all();
        let dones: Vec<(u32, ProcDone)> = self
            .dones
            .iter()
            .map(|(&(_, s), d)| (s, d.clone()))
            .collect();
        for (s, d) in dones {
            self.send_to(
                peer,
                Frame::Done {
                    superstep: s,
                    procs: vec![d],
                    acks: Vec::new(),
                },
            );
        }
        if only.is_none() {
            let pending: Vec<Arc<Snapshot>> = self
                .local
                .values()
                .flat_map(|l| l.pending.iter())
                // Not yet sent at all: it goes out once the output is
                // delivered (and, with redundancy, the copies agreed).
                .filter(|p| p.waiting.contains(&peer) && p.unsent.is_empty() && p.agreed)
                .map(|p| p.snapshot.clone())
                .collect();
            for s in pending {
                for f in whole(&s) {
                    self.send_to(peer, f);
                }
            }
            self.ask_again(peer);
            // Acknowledgements of its checkpoints we hold may have been lost
            // with the connection; acknowledge the newest again (it answers
            // the owner's older pending checkpoints too; an owner ignores an
            // ack of a superstep it has no pending checkpoint of).
            // Every pid held, not only those `peer` hosts in our epoch: it
            // may host one already in a newer epoch we have not seen yet
            // (found by the simulator, seed 221173: the acknowledgement of
            // a migrated process's first checkpoint was lost, and its Dones
            // waited forever). An owner ignores acks it does not wait for.
            self.held_acks.remove(&peer);
            let acks: Vec<Frame> = self
                .store
                .pids()
                .into_iter()
                .filter_map(|pid| {
                    self.store.newest(pid).map(|s| Frame::CheckpointAck {
                        pid,
                        superstep: s.superstep,
                        ok: true,
                    })
                })
                .collect();
            for f in acks {
                self.send_to(peer, f);
            }
        }
    }
}
