//! Connections to the job's other peers, routing messages to the pids' hosts,
//! and relayed multicasts (`relay`): a large broadcast travels once per peer
//! by a `collectives` schedule, with direct re-sends around broken links.

use super::*;

/// Where messages go: the connections to the job's other peers, where the
/// peers are, and the multicasts in flight.
pub(super) struct Routing {
    /// How `send_range` and `send_list` with large payloads travel.
    pub(super) broadcast: BroadcastPolicy,
    pub(super) links: BTreeMap<PeerId, Link>,
    /// Where each peer of the job runs, for the broadcast rule.
    pub(super) sites: BTreeMap<PeerId, Site>,
    /// Multicasts this peer sends or relays, in supersteps ≥ `safe` (a key
    /// may have several heads: a restored sender re-sends with another).
    pub(super) relays: BTreeMap<RelayKey, Vec<Inflight>>,
    /// Relayed frames that name peers outside this epoch, until the next
    /// assignment says whether they are stale or from a newer epoch, with
    /// their bytes.
    pub(super) waiting: VecDeque<(PeerId, RelayHead, u32, bytes::Bytes)>,
    pub(super) waiting_bytes: usize,
}

/// Most relayed frames kept for the next assignment, and their bytes.
const MAX_WAITING_RELAYS: usize = 1024;
const MAX_WAITING_RELAY_BYTES: usize = 64 << 20;

/// A connection to another peer of the job, as the machine keeps it: the
/// messages batched for its next `Data` frame.
pub(super) struct Link {
    pub(super) addr: String,
    pub(super) batch: Vec<WireMessage>,
    pub(super) batch_bytes: usize,
}

impl<I: JobIo> Machine<I> {
    pub(super) fn open_link(&mut self, peer: PeerId, addr: String) {
        self.io.open_link(peer, &addr, self.epoch);
        self.routing.links.insert(
            peer,
            Link {
                addr,
                batch: Vec::new(),
                batch_bytes: 0,
            },
        );
    }

    /// Close the connection to `peer` (what is batched for it is dropped).
    pub(super) fn close_link(&mut self, peer: PeerId) -> Option<String> {
        let l = self.routing.links.remove(&peer)?;
        self.io.close_link(peer);
        Some(l.addr)
    }

    pub(super) fn send_to(&mut self, peer: PeerId, frame: Frame) {
        self.send_out(peer, frame.into());
    }

    /// Queue `frame` for `peer` after what is batched for it.
    pub(super) fn send_out(&mut self, peer: PeerId, frame: Outgoing) {
        if let Some(l) = self.routing.links.get_mut(&peer) {
            Self::flush_link(&mut self.io, peer, l);
            self.io.send(peer, frame);
        }
    }

    pub(super) fn flush_link(io: &mut I, peer: PeerId, l: &mut Link) {
        if l.batch.is_empty() {
            return;
        }
        let messages = std::mem::take(&mut l.batch);
        l.batch_bytes = 0;
        io.send(peer, Frame::Data { messages }.into());
    }

    /// Send a message to its destination's hosts (the local one, if any,
    /// straight into the barrier).
    pub(super) fn deliver(&mut self, m: WireMessage) {
        let hosts = self.hosts.of(m.dst);
        if let [host] = *hosts {
            return self.deliver_to(host, m);
        }
        for i in 0..hosts.len() {
            let host = self.hosts.of(m.dst)[i];
            self.deliver_to(host, m.clone());
        }
    }

    /// Send a message to `host` (into the local barrier if it is this peer).
    pub(super) fn deliver_to(&mut self, host: PeerId, m: WireMessage) {
        if host == self.me {
            if let Err(e) = self.barrier.on_message_from(m, self.me) {
                self.fail(None, format!("a local message broke the protocol: {e}"));
            }
            return;
        }
        if let Some(l) = self.routing.links.get_mut(&host) {
            // A payload the previous message shares travels once (one group).
            let shared = l.batch.last().is_some_and(|p| {
                p.src == m.src
                    && p.superstep == m.superstep
                    && message_groups::same_buffer(&p.payload, &m.payload)
            });
            let size = if shared { 16 } else { m.payload.len() + 16 };
            let full = l.batch.len() >= BATCH_MESSAGES
                || (!shared && !l.batch.is_empty() && l.batch_bytes + size > BATCH_BYTES);
            if full {
                Self::flush_link(&mut self.io, host, l);
            }
            l.batch_bytes += size;
            l.batch.push(m);
        }
    }

    /// Send what a process sent in a superstep: each group of messages
    /// sharing a payload (a `send_range` or `send_list`) relayed if the
    /// broadcast rule says so, the rest straight to the destinations' hosts.
    pub(super) fn route(&mut self, out: &[WireMessage]) {
        for run in message_groups::runs(out) {
            if run.len() >= 2 && self.relay_out(run) {
                continue;
            }
            for m in run {
                self.deliver(m.clone());
            }
        }
    }

    /// Start relaying `run` if the rule picks a schedule. Returns whether it did.
    pub(super) fn relay_out(&mut self, run: &[WireMessage]) -> bool {
        // A `send_list` may name a pid many times; such lists go direct.
        // With redundancy every copy is counted by who sent it, so nothing
        // is relayed.
        if run.len() > self.info.nprocs as usize || self.hosts.copies() > 1 {
            return false;
        }
        let payload = &run[0].payload;
        let dest_peers: BTreeSet<PeerId> = run
            .iter()
            .map(|m| self.hosts.of(m.dst)[0])
            .filter(|&p| p != self.me)
            .collect();
        let Some(me) = self.routing.sites.get(&self.me) else {
            return false;
        };
        let dests: Vec<Site> = dest_peers
            .iter()
            .filter_map(|p| self.routing.sites.get(p).cloned())
            .collect();
        if dests.len() != dest_peers.len()
            || dest_peers
                .iter()
                .any(|p| !self.routing.links.contains_key(p))
        {
            return false;
        }
        let Some((algorithm, peers)) =
            relay::choose(&self.routing.broadcast, payload.len(), me, &dests)
        else {
            return false;
        };
        let head = RelayHead {
            src: run[0].src,
            superstep: run[0].superstep,
            tag: run[0].tag,
            len: payload.len() as u32,
            algorithm,
            peers,
            dsts: run.iter().map(|m| (m.dst, m.seq)).collect(),
        };
        let (inflight, start) = match Inflight::sending(head, self.me, payload.clone()) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(job = self.job, "sending directly: {e}");
                return false;
            }
        };
        tracing::debug!(
            job = self.job,
            src = run[0].src,
            bytes = payload.len(),
            ?algorithm,
            peers = inflight.head.peers.len(),
            "relaying a multicast"
        );
        for m in run {
            if self.hosts.runs(m.dst, self.me) {
                self.deliver_to(self.me, m.clone());
            }
        }
        let frames: Vec<(PeerId, Vec<Frame>)> =
            start.iter().filter_map(|t| inflight.frames(t)).collect();
        self.routing
            .relays
            .entry(relay::key_of(&inflight.head))
            .or_default()
            .push(inflight);
        for (to, fs) in frames {
            for f in fs {
                self.send_to(to, f);
            }
        }
        true
    }

    /// Bytes of a relayed multicast arrived: keep them, forward what the
    /// schedule says, deliver the messages once the payload is whole.
    pub(super) fn on_relay(
        &mut self,
        from: PeerId,
        head: RelayHead,
        offset: u32,
        bytes: bytes::Bytes,
    ) -> Result<(), RelayError> {
        relay::check_head(&head, self.info.nprocs, self.me, from)?;
        if self.hosts.copies() > 1 {
            // Nothing is relayed with redundancy (a copy counts for who
            // sent it); a peer that does is ignored.
            tracing::debug!(job = self.job, from, "dropping a relayed frame");
            return Ok(());
        }
        if !relay::current(&head, &self.peers) {
            // It names a peer that left the job (an older epoch: stale), or
            // one we do not know yet (a newer epoch whose assignment has not
            // reached us: found by the simulator, seed 6842, where the
            // broadcast stopped here and never reached the peers after us).
            // It waits for our next assignment, within a bound.
            let r = &mut self.routing;
            r.waiting_bytes += bytes.len();
            r.waiting.push_back((from, head, offset, bytes));
            while r.waiting.len() > MAX_WAITING_RELAYS || r.waiting_bytes > MAX_WAITING_RELAY_BYTES
            {
                if let Some((.., b)) = r.waiting.pop_front() {
                    r.waiting_bytes -= b.len();
                }
            }
            return Ok(());
        }
        if self.safe.is_some_and(|g| head.superstep < g) {
            return Ok(()); // long delivered everywhere
        }
        let key = relay::key_of(&head);
        // Payloads still being received (complete ones are shared with the
        // inboxes). Every process may send its outbox limit per superstep,
        // and a peer can be a superstep ahead.
        let held: u64 = self
            .routing
            .relays
            .values()
            .flatten()
            .filter(|f| f.payload().is_none())
            .map(|f| u64::from(f.head.len))
            .sum();
        let heads = self.routing.relays.entry(key).or_default();
        let i = match heads.iter().position(|f| *f.head == head) {
            Some(i) => i,
            None => {
                if heads.len() >= MAX_HEADS {
                    return Err(RelayError::TooManyHeads(MAX_HEADS));
                }
                let cap = (self.info.outbox_limit as u64)
                    .saturating_mul(2 * u64::from(self.info.nprocs))
                    .max(256 << 20);
                if held.saturating_add(u64::from(head.len)) > cap {
                    return Err(RelayError::TooMuchHeld(cap >> 20));
                }
                heads.push(Inflight::new(head, self.me)?);
                heads.len() - 1
            }
        };
        let f = &mut heads[i];
        let (due, done) = f.receive(offset, &bytes)?;
        let frames: Vec<(PeerId, Vec<Frame>)> = due.iter().filter_map(|t| f.frames(t)).collect();
        for (to, fs) in frames {
            for f in fs {
                self.send_to(to, f);
            }
        }
        if done {
            self.relay_complete(key, i);
        }
        Ok(())
    }

    /// The payload of `relays[key][i]` is whole: deliver its messages to
    /// the local pids, and to the peers that must get it directly.
    pub(super) fn relay_complete(&mut self, key: RelayKey, i: usize) {
        let Some(f) = self.routing.relays.get_mut(&key).and_then(|v| v.get_mut(i)) else {
            return;
        };
        let Some(payload) = f.payload().cloned() else {
            return;
        };
        let direct = std::mem::take(&mut f.direct);
        let head = f.head.clone();
        for &(dst, seq) in &head.dsts {
            let host = self.hosts.of(dst)[0];
            if host == self.me || direct.contains(&host) {
                self.deliver_to(host, relayed_message(&head, dst, seq, &payload));
            }
        }
        self.flush_all();
    }

    /// Relayed frames that waited for this assignment: those it makes
    /// current go on, the others are stale.
    pub(super) fn relays_after_reassign(&mut self) {
        let waiting = std::mem::take(&mut self.routing.waiting);
        self.routing.waiting_bytes = 0;
        for (from, head, offset, bytes) in waiting {
            if !relay::current(&head, &self.peers) {
                tracing::debug!(
                    job = self.job,
                    from,
                    "dropping a relayed frame of an older epoch"
                );
                continue;
            }
            if let Err(e) = self.on_relay(from, head, offset, bytes) {
                return self.fail(
                    None,
                    format!("peer #{from} broke the data-plane protocol: {e}"),
                );
            }
        }
    }

    /// Our connection to `peer` broke, so relayed bytes on it may be lost:
    /// send again everything we already sent it of every multicast we send
    /// or relay, so it completes and forwards its own part of the schedule
    /// (its own pids also get the sender's messages by `resync`).
    pub(super) fn resend_relayed(&mut self, peer: PeerId) {
        let frames: Vec<Frame> = self
            .routing
            .relays
            .values()
            .flatten()
            .flat_map(|f| f.resend_to(peer))
            .collect();
        for f in frames {
            self.send_to(peer, f);
        }
    }

    /// Peers left the job: a multicast we sent through any of them goes to
    /// every other peer of its schedule directly (receivers drop repeats).
    pub(super) fn relay_around(&mut self, gone: &[PeerId]) {
        let mut due = Vec::new();
        for (key, heads) in self.routing.relays.iter_mut() {
            for (i, f) in heads.iter_mut().enumerate() {
                if f.node != 0 || !f.head.peers.iter().any(|p| gone.contains(p)) {
                    continue;
                }
                let others: Vec<PeerId> = f
                    .head
                    .peers
                    .iter()
                    .copied()
                    .filter(|p| *p != self.me && !gone.contains(p))
                    .collect();
                f.direct.extend(others);
                due.push((*key, i));
            }
        }
        for (key, i) in due {
            self.relay_complete(key, i);
        }
    }

    pub(super) fn flush_all(&mut self) {
        for (&peer, l) in self.routing.links.iter_mut() {
            Self::flush_link(&mut self.io, peer, l);
        }
    }
}

/// The message to `dst` (its `seq`-th of the superstep) of the multicast
/// `head` whose payload is whole.
pub(super) fn relayed_message(
    head: &RelayHead,
    dst: Pid,
    seq: u32,
    payload: &bytes::Bytes,
) -> WireMessage {
    WireMessage {
        src: head.src,
        dst,
        superstep: head.superstep,
        seq,
        tag: head.tag,
        payload: payload.clone(),
    }
}
