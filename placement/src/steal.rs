//! [`WorkStealing`]: the baseline balancers "WS (Head)" and "WS (Tail)" of
//! §4.2.1, which the dissertation compares the DHHT against.
//!
//! Refinements of the interface agreed with the simulator (issue 4): a thief
//! steals only *waiting* processes (never a victim's running one), choosing
//! uniformly among the peers that have one; processes with no peer to go to
//! wait in a pending list, released by the next `steal_for_idle`.

use std::collections::{BTreeMap, VecDeque};

use crate::rng::SplitMix64;
use crate::{Move, PeerId, ProcessKey};

/// Where a thief takes a waiting process from in its victim's queue
/// (§4.2.1: "stealing processes from the head instead of the tail …
/// prevents BSP processes from starving").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StealFrom {
    /// The oldest waiting process ("WS (Head)").
    Head,
    /// The newest waiting process ("WS (Tail)").
    Tail,
}

impl StealFrom {
    /// `"WS (Head)"` or `"WS (Tail)"`, as in the dissertation's tables.
    pub fn label(self) -> &'static str {
        match self {
            StealFrom::Head => "WS (Head)",
            StealFrom::Tail => "WS (Tail)",
        }
    }
}

/// Work stealing of §4.2.1, adapted to BSP: each peer has a FIFO queue and
/// runs one process at a time, the head of its queue; the others wait.
///
/// - **Release**: a job's `k` processes go to up to `k` distinct peers,
///   chosen at random with probability inverse-proportional to
///   (queue length + 1) — the `+ 1` lets empty queues be chosen and keeps
///   the weights finite; queue lengths are updated after each choice. With
///   more processes than peers, the choice starts over once every peer has
///   received one (rounds of distinct peers).
/// - **Steal**: a peer whose queue is empty takes one *waiting* process from
///   a uniformly random other peer that has one — from the head of the
///   waiting processes (`Head`) or the tail (`Tail`). A running process is
///   never stolen (in §4.2.1 the running process has left the queue).
///   Choosing among the peers that have a waiting process models a thief
///   that retries random victims until one has work, so results do not
///   depend on how often the caller lets idle peers steal.
/// - **Leave**: the leaving peer's processes (running one first) are
///   released again, as above. With no peer at all, processes wait in a
///   pending list (moves with `to == None`) and are released on the next
///   [`steal_for_idle`](WorkStealing::steal_for_idle) when peers exist.
///
/// Seeded: all randomness comes from an internal SplitMix64 generator, so
/// two instances with the same seed fed the same calls make the same
/// choices. Peers are visited in id order.
#[derive(Debug, Clone)]
pub struct WorkStealing {
    steal: StealFrom,
    rng: SplitMix64,
    queues: BTreeMap<PeerId, VecDeque<ProcessKey>>,
    /// Every unfinished process: its peer, or `None` while pending.
    location: BTreeMap<ProcessKey, Option<PeerId>>,
    pending: VecDeque<ProcessKey>,
}

impl WorkStealing {
    /// A balancer with no peers, stealing from `steal`, whose random choices
    /// are determined by `seed`.
    pub fn new(steal: StealFrom, seed: u64) -> Self {
        Self {
            steal,
            rng: SplitMix64::new(seed),
            queues: BTreeMap::new(),
            location: BTreeMap::new(),
            pending: VecDeque::new(),
        }
    }

    /// `"WS (Head)"` or `"WS (Tail)"`.
    pub fn label(&self) -> &'static str {
        self.steal.label()
    }

    /// (extra) Where this balancer steals from.
    pub fn steal_from(&self) -> StealFrom {
        self.steal
    }

    /// A peer joins with an empty queue (a known peer changes nothing). It
    /// receives work at the next release or steal.
    pub fn add_peer(&mut self, peer: PeerId) {
        self.queues.entry(peer).or_default();
    }

    /// Peer leaves: its queued processes (running one included) are
    /// re-released to the other peers; returns their moves (`to == None`:
    /// pending, no peer left). An unknown peer changes nothing.
    pub fn remove_peer(&mut self, peer: PeerId) -> Vec<Move> {
        let Some(queue) = self.queues.remove(&peer) else {
            return Vec::new();
        };
        let processes: Vec<ProcessKey> = queue.into_iter().collect();
        self.distribute(&processes, Some(peer))
    }

    /// Release a job's processes; returns where each went (`from == None`).
    /// Processes already in the balancer are ignored.
    pub fn release(&mut self, processes: &[ProcessKey]) -> Vec<Move> {
        let mut fresh = Vec::with_capacity(processes.len());
        for &p in processes {
            if let std::collections::btree_map::Entry::Vacant(e) = self.location.entry(p) {
                e.insert(None);
                fresh.push(p);
            }
        }
        self.distribute(&fresh, None)
    }

    /// A process finished: remove it wherever it is; returns the peer it was
    /// on (`None` if it was pending or unknown). If it was running, the next
    /// process in that queue starts.
    pub fn finish(&mut self, process: ProcessKey) -> Option<PeerId> {
        let peer = self.location.remove(&process)?;
        match peer {
            Some(peer) => {
                if let Some(q) = self.queues.get_mut(&peer)
                    && let Some(at) = q.iter().position(|&p| p == process)
                {
                    q.remove(at);
                }
            }
            None => self.pending.retain(|&p| p != process),
        }
        peer
    }

    /// Releases the pending processes if there are peers, then lets every
    /// peer whose queue is empty, in id order, steal one waiting process
    /// (see the type's docs); returns the moves (each a migration, or a
    /// placement from pending).
    pub fn steal_for_idle(&mut self) -> Vec<Move> {
        let mut moves = Vec::new();
        if !self.pending.is_empty() && !self.queues.is_empty() {
            let pending: Vec<ProcessKey> = self.pending.drain(..).collect();
            moves = self.distribute(&pending, None);
        }
        let idle: Vec<PeerId> = self
            .queues
            .iter()
            .filter(|(_, q)| q.is_empty())
            .map(|(&id, _)| id)
            .collect();
        if idle.is_empty() {
            return moves;
        }
        // Peers with a waiting process, ascending. A thief (empty queue) is
        // never among them, and after stealing it holds one process only.
        let mut victims: Vec<PeerId> = self
            .queues
            .iter()
            .filter(|(_, q)| q.len() >= 2)
            .map(|(&id, _)| id)
            .collect();
        for thief in idle {
            if victims.is_empty() {
                break; // no waiting process anywhere
            }
            let at = self.rng.below(victims.len());
            let victim = victims[at];
            let Some(q) = self.queues.get_mut(&victim) else {
                continue;
            };
            let taken = match self.steal {
                StealFrom::Head => q.remove(1),
                StealFrom::Tail => q.pop_back(),
            };
            if q.len() < 2 {
                victims.remove(at);
            }
            if let Some(p) = taken {
                self.queues.entry(thief).or_default().push_back(p);
                self.location.insert(p, Some(thief));
                moves.push(Move {
                    process: p,
                    from: Some(victim),
                    to: Some(thief),
                });
            }
        }
        moves
    }

    /// The process a peer is running now (head of its queue), if any.
    pub fn running_on(&self, peer: PeerId) -> Option<ProcessKey> {
        self.queues.get(&peer).and_then(|q| q.front().copied())
    }

    /// A peer's queue, the running process first.
    pub fn queue(&self, peer: PeerId) -> impl Iterator<Item = ProcessKey> + '_ {
        self.queues.get(&peer).into_iter().flatten().copied()
    }

    /// (extra) The peers, ascending.
    pub fn peers(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.queues.keys().copied()
    }

    /// (extra) The processes waiting for a peer to exist, oldest first.
    pub fn pending(&self) -> impl Iterator<Item = ProcessKey> + '_ {
        self.pending.iter().copied()
    }

    /// (extra) The peer a process is queued on (`None` if pending/unknown).
    pub fn peer_of(&self, process: ProcessKey) -> Option<PeerId> {
        self.location.get(&process).copied().flatten()
    }

    /// (extra) The number of unfinished processes (queued or pending).
    pub fn process_count(&self) -> usize {
        self.location.len()
    }

    /// Appends `processes` to queues of peers drawn with weight
    /// 1/(queue length + 1), distinct within each round of `n` draws; with
    /// no peer they become pending.
    fn distribute(&mut self, processes: &[ProcessKey], from: Option<PeerId>) -> Vec<Move> {
        let mut moves = Vec::with_capacity(processes.len());
        let mut candidates: Vec<PeerId> = Vec::new();
        for &p in processes {
            if self.queues.is_empty() {
                self.pending.push_back(p);
                self.location.insert(p, None);
                moves.push(Move {
                    process: p,
                    from,
                    to: None,
                });
                continue;
            }
            if candidates.is_empty() {
                candidates = self.queues.keys().copied().collect();
            }
            let weights: Vec<f64> = candidates
                .iter()
                .map(|id| 1.0 / (self.queues[id].len() as f64 + 1.0))
                .collect();
            let total: f64 = weights.iter().sum();
            let mut u = self.rng.next_f64() * total;
            let mut chosen = candidates.len() - 1;
            for (i, w) in weights.iter().enumerate() {
                if u < *w {
                    chosen = i;
                    break;
                }
                u -= w;
            }
            // `remove` keeps the candidates ascending for the next draw.
            let peer = candidates.remove(chosen);
            self.queues.entry(peer).or_default().push_back(p);
            self.location.insert(p, Some(peer));
            moves.push(Move {
                process: p,
                from,
                to: Some(peer),
            });
        }
        moves
    }
}
