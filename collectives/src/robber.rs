//! Receiver-initiated multicast between clusters, as pure protocol state
//! machines: *Robber* and its predecessor *MOB* from den Burger and
//! Kielmann, "Collective receiver-initiated multicast for grid
//! applications" (§3), and a simple BitTorrent-like baseline (§2.5).
//!
//! Every node is a [`PeerNode`]: it answers each incoming [`MulticastMsg`]
//! with the messages it sends ([`PeerNode::handle`]), and rejects messages
//! no correct peer sends without changing its state; nothing here does IO
//! or reads a clock. [`Multicast::plan`] does the paper's phases 1 and 2
//! (peer selection) for all nodes from the data's length alone, so every
//! node of a distributed run can compute its own part
//! ([`Multicast::into_node`]) and the root adds the data
//! ([`PeerNode::seed_data`]); [`Multicast::new`] does both at once.
//! [`simulate`] runs phases 3 and 4 in memory, delivering messages in a
//! seeded random order (FIFO per connection, as over the paper's TCP
//! connections) or, with a [`LinkModel`], in the order a simple per-link
//! capacity model with time gives.
//!
//! The three algorithms share one state machine and differ only in what a
//! node desires from whom:
//!
//! - [`Algorithm::Robber`]: each collective's *work* (the pieces it must
//!   fetch from other clusters) starts split equally over its members (§3.1
//!   phase 3) and idle members steal half of a local peer's work.
//! - [`Algorithm::Mob`]: the same static split, never rebalanced (§1, §2.6:
//!   "each node in a mob steals an equal part of all data from peers in
//!   remote clusters, and distributes the stolen pieces locally").
//! - [`Algorithm::BitTorrent`]: clusters are ignored; every node picks up to
//!   [`PEERS`] random peers, desires every piece from all of them and
//!   requests the rarest piece a peer has (no choking: the nodes of one
//!   application cooperate).

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use crate::error::CollectiveError;
use crate::rng::SplitMix64;

/// `N` of §3.1: the number of local peers a node picks, and the most global
/// peers it picks (the paper's `max(|C| − 1, N)` reads as "up to `N`").
pub const PEERS: usize = 5;

/// Requests a node keeps outstanding per peer: BitTorrent's `R = 5` (§2.5),
/// used for all three algorithms so a peer's pieces pipeline.
pub const OUTSTANDING: usize = 5;

/// Which receiver-initiated multicast a [`Multicast`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Collective stealing with work stealing inside a collective (§3).
    Robber,
    /// Collective stealing with a static, equal work split (§2.6).
    Mob,
    /// Cluster-oblivious random mesh, rarest-first requests (§2.5).
    BitTorrent,
}

/// The nodes of a multicast, grouped into clusters, and how the data is cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MulticastConfig {
    /// Each cluster's node ids, in collective-rank order: `clusters[c][r]`
    /// has rank `r(n, C)` = `r` (§3). Ids are distinct across clusters.
    pub clusters: Vec<Vec<usize>>,
    /// The node that holds all data at the start.
    pub root: usize,
    /// Bytes per piece; the data is split into `P = ⌈len / piece_size⌉`
    /// pieces, the last possibly shorter.
    pub piece_size: usize,
}

/// The messages of the paper's Table 1.
///
/// Piece indices as "list of booleans" are `Vec<bool>` of length `P`.
/// `Piece` carries its index with its bytes (Table 1 lists only the data;
/// the index is needed to place it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MulticastMsg {
    /// "I want these pieces from you"; always answered by a `Bitfield`.
    Desire(Vec<bool>),
    /// Which pieces of the peer's desire the sender has.
    Bitfield(Vec<bool>),
    /// The sender received a new piece.
    Have(usize),
    /// "Send me piece `i`"; always honoured.
    Request(usize),
    /// A piece's bytes.
    Piece {
        /// Piece index.
        index: usize,
        /// Its bytes.
        data: Vec<u8>,
    },
    /// "Give me some of your work."
    Steal,
    /// Work handed over in reply to `Steal` (empty: the sender has none).
    Work(Vec<bool>),
    /// The sender has (new) work; add it to your local labor force.
    FoundWork,
    /// The sender has all pieces (phase 4).
    Done,
    /// The last message on a connection (phase 4).
    Stop,
}

impl MulticastMsg {
    /// Bytes on the wire, for [`LinkModel`]: a one-byte opcode, four bytes
    /// per integer, one bit per boolean in a list, the data.
    pub fn wire_size(&self, pieces: usize) -> u64 {
        let bits = 1 + pieces.div_ceil(8);
        let size = match self {
            Self::Steal | Self::FoundWork | Self::Done | Self::Stop => 1,
            Self::Have(_) | Self::Request(_) => 5,
            Self::Desire(_) | Self::Bitfield(_) | Self::Work(_) => bits,
            Self::Piece { data, .. } => 5 + data.len(),
        };
        size as u64
    }
}

/// What a node knows about one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Peer {
    local: bool,
    /// The peer's last desire from this node.
    desire: Vec<bool>,
    /// Pieces the peer is known to have (from `Bitfield`/`Have`).
    has: Vec<bool>,
    outstanding: usize,
    done: bool,
    stop_sent: bool,
    stopped: bool,
}

/// One node's protocol state: a deterministic state machine driven by
/// [`PeerNode::start`] and [`PeerNode::handle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerNode {
    algorithm: Algorithm,
    id: usize,
    /// The data's length in bytes.
    len: usize,
    /// Bytes per piece (≥ 1).
    piece_size: usize,
    pieces: Vec<Option<Vec<u8>>>,
    held: usize,
    pending: BTreeSet<usize>,
    work: BTreeSet<usize>,
    peers: BTreeMap<usize, Peer>,
    labor: BTreeSet<usize>,
    stealing: bool,
    done: bool,
    rng: SplitMix64,
}

/// Messages a node sends: `(to, message)`, in sending order.
pub type Outgoing = Vec<(usize, MulticastMsg)>;

impl PeerNode {
    /// This node's id.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Its current work: the pieces it alone in its collective is to fetch
    /// from global peers (§3.1 phase 3).
    pub fn work(&self) -> &BTreeSet<usize> {
        &self.work
    }

    /// Local peers, then global peers, each sorted.
    pub fn peers(&self) -> (Vec<usize>, Vec<usize>) {
        let pick = |local: bool| {
            self.peers
                .iter()
                .filter(|(_, p)| p.local == local)
                .map(|(&id, _)| id)
                .collect()
        };
        (pick(true), pick(false))
    }

    /// `P`: the number of pieces the data is cut into.
    pub fn piece_count(&self) -> usize {
        self.pieces.len()
    }

    /// Gives this node all the data, as the multicast's root holds it at
    /// the start. Call it before [`PeerNode::start`], on the root only (a
    /// node built by [`Multicast::plan`] holds nothing).
    ///
    /// Errors if `data` does not have the planned length.
    pub fn seed_data(&mut self, data: &[u8]) -> Result<(), CollectiveError> {
        if data.len() != self.len {
            return Err(CollectiveError::DataLength {
                expected: self.len,
                got: data.len(),
            });
        }
        self.pieces = data
            .chunks(self.piece_size)
            .map(|c| Some(c.to_vec()))
            .collect();
        self.held = self.pieces.len();
        self.pending.clear();
        self.work.clear();
        Ok(())
    }

    /// Whether the node has all `P` pieces (it then is in phase 4).
    pub fn has_all(&self) -> bool {
        self.held == self.pieces.len()
    }

    /// §3.1 "Retired": `|pending(n)| + |possession(n)| = P`.
    pub fn is_retired(&self) -> bool {
        self.pending.len() + self.held == self.pieces.len()
    }

    /// Finished: it received 'stop' from, and sent 'stop' to, every peer.
    pub fn is_finished(&self) -> bool {
        self.peers.values().all(|p| p.stopped && p.stop_sent)
    }

    /// The reassembled data, if every piece arrived.
    pub fn data(&self) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        for p in &self.pieces {
            out.extend_from_slice(p.as_ref()?);
        }
        Some(out)
    }

    /// The data, if every piece arrived, moving the pieces out (each byte
    /// is copied once, the first piece's buffer is reused).
    pub fn into_data(self) -> Option<Vec<u8>> {
        if !self.has_all() {
            return None;
        }
        let mut pieces = self.pieces.into_iter().flatten();
        let Some(mut out) = pieces.next() else {
            return Some(Vec::new());
        };
        out.reserve(self.len - out.len());
        for p in pieces {
            out.extend_from_slice(&p);
        }
        Some(out)
    }

    /// The length of piece `index < P`: `piece_size`, the last one
    /// possibly shorter.
    fn piece_len(&self, index: usize) -> usize {
        self.piece_size.min(self.len - index * self.piece_size)
    }

    fn bits(&self, set: impl Fn(usize) -> bool) -> Vec<bool> {
        (0..self.pieces.len()).map(set).collect()
    }

    /// What this node desires from `peer`: from local peers (and from every
    /// peer in BitTorrent) all it lacks, from global peers its work.
    fn desire_for(&self, local: bool) -> Vec<bool> {
        if local || self.algorithm == Algorithm::BitTorrent {
            self.bits(|i| self.pieces[i].is_none())
        } else {
            self.bits(|i| self.work.contains(&i))
        }
    }

    fn globals(&self) -> Vec<usize> {
        self.peers().1
    }

    fn locals(&self) -> Vec<usize> {
        self.peers().0
    }

    /// Phase 3's opening: a 'desire' to every peer, then 'found-work' to
    /// every local peer (Robber), then phase 4 at once if nothing is
    /// missing.
    pub fn start(&mut self) -> Outgoing {
        let mut out = Vec::new();
        for (&id, p) in &self.peers {
            out.push((id, MulticastMsg::Desire(self.desire_for(p.local))));
        }
        if self.algorithm == Algorithm::Robber {
            for id in self.locals() {
                out.push((id, MulticastMsg::FoundWork));
            }
        }
        self.maybe_done(&mut out);
        out
    }

    /// Handles one message from peer `from`, returning what it sends.
    ///
    /// Errors, leaving the node unchanged, on a message no correct peer
    /// sends: `from` is not a peer, a piece index is not below `P`, a bit
    /// list's length is not `P`, a 'request' names a piece this node does
    /// not hold, or a 'piece' has another length than that piece.
    pub fn handle(&mut self, from: usize, msg: MulticastMsg) -> Result<Outgoing, CollectiveError> {
        self.check(from, &msg)?;
        Ok(self.apply(from, msg))
    }

    /// Whether `handle` may apply `msg` from `from` (it reads, never
    /// writes).
    fn check(&self, from: usize, msg: &MulticastMsg) -> Result<(), CollectiveError> {
        if !self.peers.contains_key(&from) {
            return Err(CollectiveError::UnknownPeer {
                node: self.id,
                from,
            });
        }
        let pieces = self.pieces.len();
        let bits = |kind: &'static str, list: &[bool]| {
            if list.len() == pieces {
                Ok(())
            } else {
                Err(CollectiveError::BitListLength {
                    kind,
                    got: list.len(),
                    pieces,
                })
            }
        };
        let index = |index: usize| {
            if index < pieces {
                Ok(())
            } else {
                Err(CollectiveError::PieceOutOfRange { index, pieces })
            }
        };
        match msg {
            MulticastMsg::Desire(d) => bits("desire", d),
            MulticastMsg::Bitfield(b) => bits("bitfield", b),
            MulticastMsg::Work(w) => bits("work", w),
            MulticastMsg::Have(i) => index(*i),
            MulticastMsg::Request(i) => {
                index(*i)?;
                if self.pieces[*i].is_none() {
                    return Err(CollectiveError::PieceNotHeld {
                        node: self.id,
                        index: *i,
                    });
                }
                Ok(())
            }
            MulticastMsg::Piece { index: i, data } => {
                index(*i)?;
                let expected = self.piece_len(*i);
                if data.len() != expected {
                    return Err(CollectiveError::PieceLength {
                        index: *i,
                        expected,
                        got: data.len(),
                    });
                }
                Ok(())
            }
            MulticastMsg::Steal
            | MulticastMsg::FoundWork
            | MulticastMsg::Done
            | MulticastMsg::Stop => Ok(()),
        }
    }

    /// Applies a message [`PeerNode::check`] accepted.
    fn apply(&mut self, from: usize, msg: MulticastMsg) -> Outgoing {
        let mut out = Vec::new();
        match msg {
            MulticastMsg::Desire(d) => {
                let reply = self.bits(|i| d[i] && self.pieces[i].is_some());
                self.peer(from).desire = d;
                out.push((from, MulticastMsg::Bitfield(reply)));
            }
            MulticastMsg::Bitfield(b) => {
                let peer = self.peer(from);
                for (k, h) in peer.has.iter_mut().zip(b) {
                    *k |= h;
                }
                self.fill_requests(from, &mut out);
            }
            MulticastMsg::Have(i) => {
                self.peer(from).has[i] = true;
                self.fill_requests(from, &mut out);
            }
            MulticastMsg::Request(i) => {
                if let Some(data) = self.pieces[i].clone() {
                    out.push((from, MulticastMsg::Piece { index: i, data }));
                }
            }
            MulticastMsg::Piece { index, data } => self.receive(from, index, data, &mut out),
            MulticastMsg::Steal => {
                let half = self.work.len().div_ceil(2);
                let given: Vec<usize> = self.work.iter().copied().take(half).collect();
                for i in &given {
                    self.work.remove(i);
                }
                out.push((from, MulticastMsg::Work(self.bits(|i| given.contains(&i)))));
                if !given.is_empty() {
                    // New work sequence, step 1 (the victim desires less).
                    self.send_desires(&mut out);
                    self.try_steal(&mut out);
                }
            }
            MulticastMsg::Work(w) => {
                self.stealing = false;
                let new: Vec<usize> = (0..w.len())
                    .filter(|&i| w[i] && self.pieces[i].is_none() && !self.pending.contains(&i))
                    .collect();
                if new.is_empty() {
                    self.labor.remove(&from);
                } else {
                    self.work.extend(new);
                    // The new work sequence of §3.1.
                    self.send_desires(&mut out);
                    for g in self.globals() {
                        self.fill_requests(g, &mut out);
                    }
                    for l in self.locals() {
                        out.push((l, MulticastMsg::FoundWork));
                    }
                }
                self.try_steal(&mut out);
            }
            MulticastMsg::FoundWork => {
                self.labor.insert(from);
                self.try_steal(&mut out);
            }
            MulticastMsg::Done => {
                self.peer(from).done = true;
                if self.done {
                    self.send_stop(from, &mut out);
                }
            }
            MulticastMsg::Stop => self.peer(from).stopped = true,
        }
        out
    }

    fn peer(&mut self, id: usize) -> &mut Peer {
        self.peers.get_mut(&id).expect("known peer")
    }

    fn send_desires(&self, out: &mut Outgoing) {
        for g in self.globals() {
            out.push((g, MulticastMsg::Desire(self.desire_for(false))));
        }
    }

    fn receive(&mut self, from: usize, index: usize, data: Vec<u8>, out: &mut Outgoing) {
        self.pending.remove(&index);
        let peer = self.peer(from);
        peer.outstanding = peer.outstanding.saturating_sub(1);
        if self.pieces[index].is_none() {
            self.pieces[index] = Some(data);
            self.held += 1;
            self.work.remove(&index);
            let bt = self.algorithm == Algorithm::BitTorrent;
            for (&id, p) in &self.peers {
                if p.local || bt || p.desire.get(index).copied().unwrap_or(false) {
                    out.push((id, MulticastMsg::Have(index)));
                }
            }
        }
        self.fill_requests(from, out);
        self.maybe_done(out);
    }

    /// Requests pieces from `peer` up to [`OUTSTANDING`]: from `desire(n, p)
    /// ∩ possession(p)`, chosen at random (Robber, MOB) or rarest first
    /// (BitTorrent). A requested piece leaves the node's work.
    fn fill_requests(&mut self, peer: usize, out: &mut Outgoing) {
        let p = &self.peers[&peer];
        let any = p.local || self.algorithm == Algorithm::BitTorrent;
        let mut candidates: Vec<usize> = (0..self.pieces.len())
            .filter(|&i| {
                p.has[i]
                    && self.pieces[i].is_none()
                    && !self.pending.contains(&i)
                    && (any || self.work.contains(&i))
            })
            .collect();
        let mut outstanding = p.outstanding;
        while outstanding < OUTSTANDING && !candidates.is_empty() {
            let k = if self.algorithm == Algorithm::BitTorrent {
                let rarity = |i: usize| self.peers.values().filter(|q| q.has[i]).count();
                let min = candidates.iter().map(|&i| rarity(i)).min().unwrap_or(0);
                let rarest: Vec<usize> = (0..candidates.len())
                    .filter(|&k| rarity(candidates[k]) == min)
                    .collect();
                rarest[self.rng.below(rarest.len())]
            } else {
                self.rng.below(candidates.len())
            };
            let i = candidates.swap_remove(k);
            self.pending.insert(i);
            self.work.remove(&i);
            outstanding += 1;
            out.push((peer, MulticastMsg::Request(i)));
        }
        self.peer(peer).outstanding = outstanding;
        self.try_steal(out);
    }

    /// An unemployed, unretired Robber node with no steal under way asks a
    /// random member of its local labor force for work.
    fn try_steal(&mut self, out: &mut Outgoing) {
        if self.algorithm != Algorithm::Robber
            || self.stealing
            || !self.work.is_empty()
            || self.is_retired()
            || self.labor.is_empty()
        {
            return;
        }
        let labor: Vec<usize> = self.labor.iter().copied().collect();
        let victim = labor[self.rng.below(labor.len())];
        self.stealing = true;
        out.push((victim, MulticastMsg::Steal));
    }

    fn maybe_done(&mut self, out: &mut Outgoing) {
        if self.done || !self.has_all() {
            return;
        }
        self.done = true;
        let ids: Vec<usize> = self.peers.keys().copied().collect();
        for &id in &ids {
            out.push((id, MulticastMsg::Done));
        }
        for id in ids {
            if self.peers[&id].done {
                self.send_stop(id, out);
            }
        }
    }

    fn send_stop(&mut self, to: usize, out: &mut Outgoing) {
        let p = self.peer(to);
        if !p.stop_sent {
            p.stop_sent = true;
            out.push((to, MulticastMsg::Stop));
        }
    }
}

/// All nodes of one multicast after peer selection (phases 1 and 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Multicast {
    /// The configuration.
    pub config: MulticastConfig,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Each node's state, by id.
    pub nodes: BTreeMap<usize, PeerNode>,
    /// Each node's cluster index.
    pub cluster_of: BTreeMap<usize, usize>,
    /// `P`.
    pub piece_count: usize,
}

/// The pieces of node rank `r` in a collective of `size` (§3.1 phase 3):
/// `⌈r·P/|C|⌉ ≤ i < ⌈(r+1)·P/|C|⌉`.
pub fn initial_work(rank: usize, size: usize, pieces: usize) -> std::ops::Range<usize> {
    (rank * pieces).div_ceil(size)..((rank + 1) * pieces).div_ceil(size)
}

/// The ranks of collective `C_y` from which a node of rank `r` in `C_x`
/// picks its one potential global peer (§3.1 phase 2):
/// `⌊r·|C_y|/|C_x|⌋ ≤ r(y) < ⌊(r+1)·|C_y|/|C_x|⌋`, widened to one rank when
/// `|C_y| < |C_x|` leaves it empty.
pub fn global_peer_ranks(rank: usize, size_x: usize, size_y: usize) -> std::ops::Range<usize> {
    let lo = rank * size_y / size_x;
    let hi = ((rank + 1) * size_y / size_x).max(lo + 1);
    lo..hi
}

fn connected(nodes: &[usize], edges: &BTreeSet<(usize, usize)>) -> bool {
    let Some(&first) = nodes.first() else {
        return true;
    };
    let mut seen = BTreeSet::from([first]);
    let mut stack = vec![first];
    while let Some(a) = stack.pop() {
        for &(x, y) in edges {
            for (u, v) in [(x, y), (y, x)] {
                if u == a && seen.insert(v) {
                    stack.push(v);
                }
            }
        }
    }
    nodes.iter().all(|n| seen.contains(n))
}

/// Each member picks up to `PEERS` others at random; connections are
/// undirected. Redrawn until connected (Lemma 1), at most 64 times.
fn random_mesh(members: &[usize], rng: &mut SplitMix64) -> BTreeSet<(usize, usize)> {
    let mut edges = BTreeSet::new();
    for _ in 0..64 {
        edges.clear();
        for (k, &a) in members.iter().enumerate() {
            let mut others: Vec<usize> = (0..members.len()).filter(|&j| j != k).collect();
            rng.shuffle(&mut others);
            for &j in others.iter().take(PEERS) {
                let b = members[j];
                edges.insert((a.min(b), a.max(b)));
            }
        }
        if connected(members, &edges) {
            break;
        }
    }
    edges
}

impl Multicast {
    /// Validates `config`, picks every node's peers (phases 1 and 2, or a
    /// random mesh for BitTorrent) and gives the root `data`:
    /// [`Multicast::plan`] for `data.len()`, then [`PeerNode::seed_data`]
    /// on the root.
    pub fn new(
        algorithm: Algorithm,
        config: MulticastConfig,
        data: &[u8],
        seed: u64,
    ) -> Result<Self, CollectiveError> {
        let mut multicast = Self::plan(algorithm, config, data.len(), seed)?;
        let root = multicast.config.root;
        multicast
            .nodes
            .get_mut(&root)
            .ok_or(CollectiveError::RootNotMember(root))?
            .seed_data(data)?;
        Ok(multicast)
    }

    /// Validates `config` and picks every node's peers (phases 1 and 2, or
    /// a random mesh for BitTorrent) for data of `len` bytes, which no node
    /// holds yet.
    ///
    /// A pure function of its arguments: every node of a distributed run
    /// can call it with the same arguments, keep its own part
    /// ([`Multicast::into_node`]), and the root adds the data
    /// ([`PeerNode::seed_data`]); the nodes are then exactly those of
    /// [`Multicast::new`]. A collective's work is every piece none of its
    /// members holds at the start (so the root's collective has none),
    /// split by [`initial_work`]. The nodes' own random choices are seeded
    /// from `seed` too.
    pub fn plan(
        algorithm: Algorithm,
        config: MulticastConfig,
        len: usize,
        seed: u64,
    ) -> Result<Self, CollectiveError> {
        if config.piece_size == 0 {
            return Err(CollectiveError::ZeroChunk);
        }
        if config.clusters.is_empty() {
            return Err(CollectiveError::NoNodes);
        }
        let mut cluster_of = BTreeMap::new();
        for (c, members) in config.clusters.iter().enumerate() {
            if members.is_empty() {
                return Err(CollectiveError::EmptyCluster(c));
            }
            for &m in members {
                if cluster_of.insert(m, c).is_some() {
                    return Err(CollectiveError::DuplicateMember(m));
                }
            }
        }
        let root_cluster = *cluster_of
            .get(&config.root)
            .ok_or(CollectiveError::RootNotMember(config.root))?;
        let piece_count = len.div_ceil(config.piece_size);
        let mut rng = SplitMix64::new(seed);

        // Connections: (a, b, local?).
        let mut links: BTreeSet<(usize, usize)> = BTreeSet::new();
        if algorithm == Algorithm::BitTorrent {
            let all: Vec<usize> = cluster_of.keys().copied().collect();
            links = random_mesh(&all, &mut rng);
        } else {
            for members in &config.clusters {
                links.extend(random_mesh(members, &mut rng));
            }
            let clusters: Vec<usize> = (0..config.clusters.len()).collect();
            let mut global = BTreeSet::new();
            for _ in 0..64 {
                global.clear();
                for (cx, xs) in config.clusters.iter().enumerate() {
                    for (r, &x) in xs.iter().enumerate() {
                        let mut g: Vec<usize> = Vec::new();
                        for (cy, ys) in config.clusters.iter().enumerate() {
                            if cy != cx {
                                let ranks = global_peer_ranks(r, xs.len(), ys.len());
                                g.push(ys[ranks.start + rng.below(ranks.len())]);
                            }
                        }
                        rng.shuffle(&mut g);
                        for &y in g.iter().take(PEERS) {
                            global.insert((x.min(y), x.max(y)));
                        }
                    }
                }
                let between: BTreeSet<(usize, usize)> = global
                    .iter()
                    .map(|&(a, b)| (cluster_of[&a], cluster_of[&b]))
                    .collect();
                if connected(&clusters, &between) {
                    break;
                }
            }
            links.extend(global);
        }

        let mut nodes = BTreeMap::new();
        for (c, members) in config.clusters.iter().enumerate() {
            for (r, &id) in members.iter().enumerate() {
                let work = if algorithm == Algorithm::BitTorrent || c == root_cluster {
                    BTreeSet::new()
                } else {
                    initial_work(r, members.len(), piece_count).collect()
                };
                let mut peers = BTreeMap::new();
                for &(a, b) in &links {
                    let other = if a == id {
                        b
                    } else if b == id {
                        a
                    } else {
                        continue;
                    };
                    peers.insert(
                        other,
                        Peer {
                            local: cluster_of[&other] == c,
                            desire: vec![false; piece_count],
                            has: vec![false; piece_count],
                            outstanding: 0,
                            done: false,
                            stop_sent: false,
                            stopped: false,
                        },
                    );
                }
                let node = PeerNode {
                    algorithm,
                    id,
                    len,
                    piece_size: config.piece_size,
                    pieces: vec![None; piece_count],
                    held: 0,
                    pending: BTreeSet::new(),
                    work,
                    peers,
                    labor: BTreeSet::new(),
                    stealing: false,
                    done: false,
                    rng: SplitMix64::new(rng.next_u64()),
                };
                nodes.insert(id, node);
            }
        }
        Ok(Self {
            config,
            algorithm,
            nodes,
            cluster_of,
            piece_count,
        })
    }

    /// Node `id`'s state, taken out of the multicast (`None` if `id` is
    /// not a node).
    pub fn into_node(mut self, id: usize) -> Option<PeerNode> {
        self.nodes.remove(&id)
    }

    /// Number of (undirected) connections.
    pub fn connection_count(&self) -> usize {
        self.nodes.values().map(|n| n.peers.len()).sum::<usize>() / 2
    }
}

/// A simple network with time for [`simulate`]: every connection
/// direction is a FIFO link that carries one message at a time at
/// `local_rate` bytes per tick inside a cluster and `wide_rate` between
/// clusters, plus `wide_latency` ticks between clusters. Links do not
/// share capacity (no NIC or access-link contention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkModel {
    /// Bytes per tick within a cluster (≥ 1).
    pub local_rate: u64,
    /// Bytes per tick between clusters (≥ 1).
    pub wide_rate: u64,
    /// Extra ticks a message takes between clusters.
    pub wide_latency: u64,
}

/// What a simulated multicast did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The final state of every node.
    pub multicast: Multicast,
    /// Messages delivered.
    pub messages: usize,
    /// `wide_pieces[c][i]`: how often piece `i` arrived in cluster `c` from
    /// another cluster.
    pub wide_pieces: Vec<Vec<u32>>,
    /// Bytes that crossed between clusters (all message kinds).
    pub wide_bytes: u64,
    /// 'stop' messages delivered.
    pub stops: usize,
    /// Completion time in ticks with a [`LinkModel`], else 0.
    pub ticks: u64,
}

/// Untimed queues: one FIFO per connection direction.
type Queues = BTreeMap<(usize, usize), VecDeque<MulticastMsg>>;
/// Timed events: (arrival, send sequence) first, then sender and receiver.
type Events = BinaryHeap<(std::cmp::Reverse<(u64, u64)>, usize, usize)>;

/// Message budget of [`simulate`] before it reports a stall.
const BUDGET: usize = 20_000_000;

/// Runs a multicast to the end: every node [`PeerNode::start`]s, then
/// messages are delivered one at a time until none is left.
///
/// Without `network`, each delivery picks a uniformly random connection
/// direction with messages queued (seeded by `order_seed`) and delivers its
/// oldest: FIFO per connection, any interleaving across connections. With
/// `network`, messages arrive when the [`LinkModel`] says (ties in send
/// order).
///
/// Errors if a node sends to a peer after 'stop', if a node rejects a
/// message ([`PeerNode::handle`]), or if the queues empty
/// (or the budget runs out) before every node is finished.
pub fn simulate(
    mut multicast: Multicast,
    order_seed: u64,
    network: Option<LinkModel>,
) -> Result<Outcome, CollectiveError> {
    let clusters = multicast.config.clusters.len();
    let pieces = multicast.piece_count;
    let cluster_of = multicast.cluster_of.clone();
    let mut rng = SplitMix64::new(order_seed);
    let mut queues: Queues = BTreeMap::new();
    // Timed: (Reverse(arrival), Reverse(seq)) → (from, to, msg).
    let mut events: Events = BinaryHeap::new();
    let mut timed_msgs: BTreeMap<u64, MulticastMsg> = BTreeMap::new();
    let mut link_free: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    let mut seq = 0u64;
    let mut now = 0u64;
    let mut stopped_links: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut outcome_wide = vec![vec![0u32; pieces]; clusters];
    let (mut wide_bytes, mut stops, mut messages) = (0u64, 0usize, 0usize);

    let mut post = |from: usize,
                    out: Outgoing,
                    now: u64,
                    queues: &mut Queues,
                    events: &mut Events,
                    timed_msgs: &mut BTreeMap<u64, MulticastMsg>|
     -> Result<(), CollectiveError> {
        for (to, msg) in out {
            if stopped_links.contains(&(from, to)) {
                return Err(CollectiveError::MessageAfterStop { from, to });
            }
            if msg == MulticastMsg::Stop {
                stopped_links.insert((from, to));
            }
            let wide = cluster_of[&from] != cluster_of[&to];
            if wide {
                wide_bytes += msg.wire_size(pieces);
            }
            match network {
                None => queues.entry((from, to)).or_default().push_back(msg),
                Some(net) => {
                    let (rate, lat) = if wide {
                        (net.wide_rate.max(1), net.wide_latency)
                    } else {
                        (net.local_rate.max(1), 0)
                    };
                    let free = link_free.entry((from, to)).or_insert(0);
                    let begin = (*free).max(now);
                    *free = begin + msg.wire_size(pieces).div_ceil(rate);
                    events.push((std::cmp::Reverse((*free + lat, seq)), from, to));
                    timed_msgs.insert(seq, msg);
                    seq += 1;
                }
            }
        }
        Ok(())
    };

    let ids: Vec<usize> = multicast.nodes.keys().copied().collect();
    for &id in &ids {
        let out = multicast.nodes.get_mut(&id).expect("node").start();
        post(id, out, 0, &mut queues, &mut events, &mut timed_msgs)?;
    }
    loop {
        if messages >= BUDGET {
            break;
        }
        let (from, to, msg) = if network.is_none() {
            let ready: Vec<(usize, usize)> = queues
                .iter()
                .filter(|(_, q)| !q.is_empty())
                .map(|(&k, _)| k)
                .collect();
            if ready.is_empty() {
                break;
            }
            let key = ready[rng.below(ready.len())];
            let msg = queues
                .get_mut(&key)
                .and_then(VecDeque::pop_front)
                .expect("ready queue");
            (key.0, key.1, msg)
        } else {
            let Some((std::cmp::Reverse((at, s)), from, to)) = events.pop() else {
                break;
            };
            now = at;
            (from, to, timed_msgs.remove(&s).expect("queued message"))
        };
        messages += 1;
        if let MulticastMsg::Piece { index, .. } = &msg
            && cluster_of[&from] != cluster_of[&to]
        {
            outcome_wide[cluster_of[&to]][*index] += 1;
        }
        if msg == MulticastMsg::Stop {
            stops += 1;
        }
        let out = multicast
            .nodes
            .get_mut(&to)
            .expect("node")
            .handle(from, msg)?;
        post(to, out, now, &mut queues, &mut events, &mut timed_msgs)?;
    }
    let unfinished = multicast
        .nodes
        .values()
        .filter(|n| !n.is_finished())
        .count();
    let queued = queues.values().map(VecDeque::len).sum::<usize>() + events.len();
    if unfinished > 0 || queued > 0 {
        return Err(CollectiveError::MulticastStalled {
            messages,
            unfinished,
        });
    }
    Ok(Outcome {
        multicast,
        messages,
        wide_pieces: outcome_wide,
        wide_bytes,
        stops,
        ticks: now,
    })
}

#[cfg(test)]
mod tests;
