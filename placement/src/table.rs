//! [`HashTable`]: every hash-based balancer of §4.2.2–4.2.4 (the four DHHT
//! variants and multiple hashing) plus weighted rendezvous hashing, with
//! incremental updates that report exactly the processes that move.
//!
//! This is the API the simulator (`sim`) was written against (issue 4).
//! Additions beyond the agreed interface are marked "(extra)". One
//! refinement: `set_peer` also rejects powers outside
//! [`MIN_POWER`]`..=`[`MAX_POWER`] ([`PlacementError::PowerOutOfRange`]), so
//! envelope values can neither underflow nor overflow.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use crate::dhht::better;
use crate::rng::mix64;
use crate::{
    Dhht, IndexAllocator, Peer, PlacementError, Position, envelope_value, golden_position,
    hashed_position, peer_key, process_key,
};

/// A peer's id (the supernode's `PeerId`).
pub type PeerId = i64;

/// A process: process `pid` of job `job`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessKey {
    /// The job id.
    pub job: i64,
    /// The process id within the job, `0..p`.
    pub pid: u32,
}

/// How positions are chosen, for peers or for processes: "Rnd." (SHA-1 of
/// the id, §4.2.2) or "Det." (golden-ratio point `{kΦ}` of an allocated
/// index, freed indices reused, §4.2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hashing {
    /// SHA-1 of the canonical key ([`peer_key`] / [`process_key`]).
    Rnd,
    /// `{kΦ}` for an index `k` from an [`IndexAllocator`].
    Det,
}

/// Every hash-based balancer of §4.2.2–4.2.4 plus weighted rendezvous
/// hashing.
///
/// | variant | a process `x` goes to the peer minimizing | lookup cost |
/// |---|---|---|
/// | `Dhht { peers, processes }` | `((x − p_i) mod 1) / w_i` (lower envelope) | O(log n + walk) |
/// | `Multi` (§4.2.3) | `r_{i,x} / w_i` | O(n) |
/// | `Rendezvous` | `−ln(r_{i,x}) / w_i` | O(n) |
///
/// `r_{i,x} ∈ (0, 1)` is peer `i`'s individual hash of process `x`
/// ([`peer_hash`]). Ties go to the smaller peer id everywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashVariant {
    /// A DHHT lower envelope (§4.2.2) with the given position schemes:
    /// "DHHT (Rnd., Rnd.)", "(Rnd., Det.)", "(Det., Rnd.)", "(Det., Det.)".
    Dhht {
        /// How peers get their positions.
        peers: Hashing,
        /// How processes get their positions.
        processes: Hashing,
    },
    /// Multiple hashing (§4.2.3): an individual hash function per peer, no
    /// lower envelope; share of peer `i` between `(1 − √ε)·w_i/W` and
    /// `(1 + ε)·w_i/W`. Lookups cost O(n).
    Multi,
    /// Weighted rendezvous (highest-random-weight) hashing: `−ln(r)/w` is
    /// exponentially distributed with rate `w`, so peer `i` wins with
    /// probability exactly `w_i / W`. Lookups cost O(n).
    Rendezvous,
}

impl HashVariant {
    /// All six variants, in the order of the dissertation's tables
    /// (R/R, R/D, D/R, D/D, Multi) followed by Rendezvous.
    pub const ALL: [HashVariant; 6] = [
        HashVariant::Dhht {
            peers: Hashing::Rnd,
            processes: Hashing::Rnd,
        },
        HashVariant::Dhht {
            peers: Hashing::Rnd,
            processes: Hashing::Det,
        },
        HashVariant::Dhht {
            peers: Hashing::Det,
            processes: Hashing::Rnd,
        },
        HashVariant::Dhht {
            peers: Hashing::Det,
            processes: Hashing::Det,
        },
        HashVariant::Multi,
        HashVariant::Rendezvous,
    ];

    /// The name used in the dissertation's tables and in reports:
    /// `"DHHT (R/R)"`, `"DHHT (R/D)"`, `"DHHT (D/R)"`, `"DHHT (D/D)"`,
    /// `"DHHT (Multi)"`, `"Rendezvous"` (peers first, then processes).
    pub fn label(self) -> &'static str {
        use Hashing::{Det, Rnd};
        match self {
            HashVariant::Dhht {
                peers: Rnd,
                processes: Rnd,
            } => "DHHT (R/R)",
            HashVariant::Dhht {
                peers: Rnd,
                processes: Det,
            } => "DHHT (R/D)",
            HashVariant::Dhht {
                peers: Det,
                processes: Rnd,
            } => "DHHT (D/R)",
            HashVariant::Dhht {
                peers: Det,
                processes: Det,
            } => "DHHT (D/D)",
            HashVariant::Multi => "DHHT (Multi)",
            HashVariant::Rendezvous => "Rendezvous",
        }
    }

    /// The command-line name: `"rr"`, `"rd"`, `"dr"`, `"dd"`, `"multi"`,
    /// `"rendezvous"` (peers first, then processes).
    pub fn slug(self) -> &'static str {
        use Hashing::{Det, Rnd};
        match self {
            HashVariant::Dhht {
                peers: Rnd,
                processes: Rnd,
            } => "rr",
            HashVariant::Dhht {
                peers: Rnd,
                processes: Det,
            } => "rd",
            HashVariant::Dhht {
                peers: Det,
                processes: Rnd,
            } => "dr",
            HashVariant::Dhht {
                peers: Det,
                processes: Det,
            } => "dd",
            HashVariant::Multi => "multi",
            HashVariant::Rendezvous => "rendezvous",
        }
    }
}

impl fmt::Display for HashVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for HashVariant {
    type Err = PlacementError;

    /// Parses a [`slug`](HashVariant::slug), case-insensitive.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        HashVariant::ALL
            .into_iter()
            .find(|v| v.slug() == lower)
            .ok_or_else(|| PlacementError::UnknownVariant {
                given: s.chars().take(64).collect(),
            })
    }
}

/// A process that changed peer. `from == None`: newly placed; `to == None`:
/// no peer left to hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// The process.
    pub process: ProcessKey,
    /// Its previous peer, if it had one.
    pub from: Option<PeerId>,
    /// Its new peer, if any peer is left.
    pub to: Option<PeerId>,
}

/// The smallest power a [`HashTable`] accepts (1e-100).
///
/// Powers are bounded so that no envelope value `distance / w` (distance
/// ≥ 2⁻⁶⁴) can underflow to 0 or overflow to ∞, which would turn
/// comparisons into ties. Scale benchmark speeds into `[MIN_POWER, MAX_POWER]`.
pub const MIN_POWER: f64 = 1e-100;

/// The largest power a [`HashTable`] accepts (1e100); see [`MIN_POWER`].
pub const MAX_POWER: f64 = 1e100;

/// Peer `peer`'s individual hash of `process`: `r_{i,x} ∈ (0, 1)` of
/// multiple hashing (§4.2.3) and rendezvous hashing.
///
/// The peer's seed is the SHA-1 position of [`peer_key`], the process's is
/// the SHA-1 position of [`process_key`]; the pair is combined by two rounds
/// of the SplitMix64 finalizer (a bijection with full avalanche), so for a
/// fixed process the values over peers behave as independent uniforms, and
/// one evaluation costs nanoseconds instead of a SHA-1 per pair. The top
/// 53 bits `b` give `(b + ½) / 2⁵³`, never 0 or 1.
pub fn peer_hash(peer: PeerId, process: ProcessKey) -> f64 {
    let seed = hashed_position(&peer_key(peer)).0;
    let h = hashed_position(&process_key(process.job, process.pid)).0;
    uniform(pair_bits(seed, h))
}

fn pair_bits(peer_seed: u64, process_hash: u64) -> u64 {
    mix64(mix64(process_hash ^ peer_seed) ^ peer_seed.rotate_left(32))
}

fn uniform(bits: u64) -> f64 {
    ((bits >> 11) as f64 + 0.5) * (1.0 / 9_007_199_254_740_992.0)
}

/// The value peer (seed, weight) has for a process hash under `Multi` or
/// `Rendezvous`; the process goes to the smallest (ties: smaller id).
fn hash_value(rendezvous: bool, peer_seed: u64, weight: f64, process_hash: u64) -> f64 {
    let r = uniform(pair_bits(peer_seed, process_hash));
    if rendezvous {
        -r.ln() / weight
    } else {
        r / weight
    }
}

#[derive(Debug, Clone, Copy)]
struct HashPeer {
    id: PeerId,
    seed: u64,
    weight: f64,
}

#[derive(Debug, Clone, Copy)]
struct ProcEntry {
    /// Ring position (DHHT variants) — SHA-1 or golden.
    position: Position,
    /// SHA-1 hash of the process key (Multi / Rendezvous).
    hash: u64,
    /// Golden index (Det processes), 0 otherwise.
    index: u64,
    owner: Option<PeerId>,
    /// The owner's value for this process (envelope or hash value); the
    /// process moves to another peer only if that peer's value is better.
    /// Meaningless while `owner` is `None`.
    value: f64,
}

/// Hash-based balancer: a process's peer depends only on the peers, their
/// powers and the process's own position — never on other processes
/// (§4.2.2). Deterministic: two instances fed the same calls in the same
/// order give the same assignments (§4.2.2: "schedules can be easily
/// reconstructed by any supernode").
///
/// Positions: "Rnd." peers and processes are at the SHA-1 positions of
/// [`peer_key`] / [`process_key`]; "Det." ones take the smallest free golden
/// index when they join / are added and free it when they leave / are
/// removed (§4.2.4, reuse without migration). Peers keep their position
/// when their power changes.
///
/// Note on "DHHT (D/D)": peers and processes use the same sequence `{kΦ}`,
/// so process index `k` sits exactly on peer index `k` (value 0) and goes to
/// that peer whatever the powers, as long as both exist. While there are no
/// more processes than peers this pins one process per peer; the powers
/// only matter for the processes beyond.
///
/// # Costs (n peers, m processes)
///
/// - Lookup (placing a process): DHHT O(log n + walk) via [`Dhht::lookup`];
///   Multi and Rendezvous O(n) — inherent to their definition.
/// - Power increase / join of peer `i`: only processes can move *to* `i`.
///   DHHT: walking the other peers clockwise from `i`, each passed peer `q`
///   at distance `a` rules out every distance `t` where `t/w_i` exceeds
///   `(t − a)/w_q` (all `t` once `w_q ≥ w_i`); only the processes (kept in
///   ring order) in the remaining arcs are compared with their peer's
///   stored value — usually a few gaps' worth. Multi / Rendezvous: each
///   process not on `i` compares its peer's stored value with `i`'s: O(m)
///   hash evaluations, no O(n) scan.
/// - Power decrease / leave of `i`: only processes on `i` can move, each
///   is looked up again: O(|on i| · lookup).
/// - Peer bookkeeping: a power change is O(log n); a DHHT join or leave
///   shifts the sorted ring, O(n) (a memmove, ~50 µs at 10⁵ peers).
/// - Every returned move list is sorted by process.
#[derive(Debug, Clone)]
pub struct HashTable {
    variant: HashVariant,
    /// DHHT variants: the lower envelope.
    dhht: Dhht,
    /// Multi / Rendezvous: the peers sorted by id.
    hash_peers: Vec<HashPeer>,
    /// Every peer's power, by id.
    powers: BTreeMap<PeerId, f64>,
    /// Det peers: golden indices.
    peer_indices: IndexAllocator,
    peer_index: BTreeMap<PeerId, u64>,
    /// Det processes: golden indices.
    process_indices: IndexAllocator,
    processes: BTreeMap<ProcessKey, ProcEntry>,
    /// DHHT variants: processes in ring order.
    by_position: BTreeSet<(Position, ProcessKey)>,
    /// Processes held by each peer (every peer has an entry, maybe empty).
    on_peer: BTreeMap<PeerId, BTreeSet<ProcessKey>>,
}

impl HashTable {
    /// An empty table for `variant`.
    pub fn new(variant: HashVariant) -> Self {
        Self {
            variant,
            dhht: Dhht::new(),
            hash_peers: Vec::new(),
            powers: BTreeMap::new(),
            peer_indices: IndexAllocator::new(),
            peer_index: BTreeMap::new(),
            process_indices: IndexAllocator::new(),
            processes: BTreeMap::new(),
            by_position: BTreeSet::new(),
            on_peer: BTreeMap::new(),
        }
    }

    /// The balancer this table implements.
    pub fn variant(&self) -> HashVariant {
        self.variant
    }

    /// Join (new id) or change power (known id). `power` must be finite and
    /// within [`MIN_POWER`]`..=`[`MAX_POWER`]; remove a peer whose power
    /// drops to 0. Returns every process whose peer changed, sorted by
    /// process, computed incrementally (see the type's docs for the cost).
    ///
    /// # Errors
    ///
    /// [`PlacementError::InvalidWeight`] for a power that is not finite and
    /// positive, [`PlacementError::PowerOutOfRange`] for one outside the
    /// bounds; the table is unchanged.
    pub fn set_peer(&mut self, peer: PeerId, power: f64) -> Result<Vec<Move>, PlacementError> {
        if !crate::is_eligible_weight(power) {
            return Err(PlacementError::InvalidWeight {
                peer,
                weight: power,
            });
        }
        if !(MIN_POWER..=MAX_POWER).contains(&power) {
            return Err(PlacementError::PowerOutOfRange {
                peer,
                power,
                min: MIN_POWER,
                max: MAX_POWER,
            });
        }
        let old = self.powers.get(&peer).copied();
        if old == Some(power) {
            return Ok(Vec::new());
        }
        self.powers.insert(peer, power);
        self.on_peer.entry(peer).or_default();
        let mut moves = match self.variant {
            HashVariant::Dhht { peers, .. } => {
                let position = match (old, peers) {
                    (Some(_), _) => self.dhht.get(peer).map_or(Position::ZERO, |p| p.position),
                    (None, Hashing::Rnd) => hashed_position(&peer_key(peer)),
                    (None, Hashing::Det) => {
                        let k = self.peer_indices.alloc();
                        self.peer_index.insert(peer, k);
                        golden_position(k)
                    }
                };
                let entry = Peer {
                    id: peer,
                    position,
                    weight: power,
                };
                if old.is_some() {
                    self.dhht.update(entry)?;
                } else {
                    self.dhht.insert(entry)?;
                }
                if old.is_some_and(|w| power < w) {
                    self.push_away(peer)
                } else {
                    self.dhht_pull(peer, position, power)
                }
            }
            HashVariant::Multi | HashVariant::Rendezvous => {
                let at = self.hash_peers.partition_point(|p| p.id < peer);
                if old.is_some() {
                    self.hash_peers[at].weight = power;
                } else {
                    self.hash_peers.insert(
                        at,
                        HashPeer {
                            id: peer,
                            seed: hashed_position(&peer_key(peer)).0,
                            weight: power,
                        },
                    );
                }
                if old.is_some_and(|w| power < w) {
                    self.push_away(peer)
                } else {
                    self.hash_pull(self.hash_peers[at])
                }
            }
        };
        moves.sort_by_key(|(m, _)| m.process);
        self.apply(&moves);
        self.refresh_values(peer);
        Ok(moves.into_iter().map(|(m, _)| m).collect())
    }

    /// Peer leaves (or its power dropped to 0): its processes go to their
    /// next peers; returns their moves, sorted by process (`to == None` if no
    /// peer is left). An unknown peer changes nothing.
    pub fn remove_peer(&mut self, peer: PeerId) -> Vec<Move> {
        if self.powers.remove(&peer).is_none() {
            return Vec::new();
        }
        match self.variant {
            HashVariant::Dhht { .. } => {
                self.dhht.remove(peer);
                if let Some(k) = self.peer_index.remove(&peer) {
                    self.peer_indices.free(k);
                }
            }
            HashVariant::Multi | HashVariant::Rendezvous => {
                if let Ok(at) = self.hash_peers.binary_search_by_key(&peer, |p| p.id) {
                    self.hash_peers.remove(at);
                }
            }
        }
        let moves = self.push_away(peer);
        self.apply(&moves);
        self.on_peer.remove(&peer);
        moves.into_iter().map(|(m, _)| m).collect()
    }

    /// Places a new process (allocating a golden index if the variant's
    /// processes are "Det.") and returns its peer; `None` if there is no
    /// peer (it is placed when one joins). Adding a process that is already
    /// in the table changes nothing and returns its current peer.
    pub fn add_process(&mut self, process: ProcessKey) -> Option<PeerId> {
        if let Some(e) = self.processes.get(&process) {
            return e.owner;
        }
        let hash = hashed_position(&process_key(process.job, process.pid));
        let (position, index) = match self.variant {
            HashVariant::Dhht {
                processes: Hashing::Det,
                ..
            } => {
                let k = self.process_indices.alloc();
                (golden_position(k), k)
            }
            _ => (hash, 0),
        };
        let mut entry = ProcEntry {
            position,
            hash: hash.0,
            index,
            owner: None,
            value: f64::INFINITY,
        };
        if let Some((value, owner)) = self.lookup_entry(&entry) {
            entry.owner = Some(owner);
            entry.value = value;
        }
        if matches!(self.variant, HashVariant::Dhht { .. }) {
            self.by_position.insert((position, process));
        }
        if let Some(owner) = entry.owner {
            self.on_peer.entry(owner).or_default().insert(process);
        }
        self.processes.insert(process, entry);
        entry.owner
    }

    /// Removes a process (it finished), freeing its golden index; returns
    /// the peer it was on (`None` if it was unplaced or unknown).
    pub fn remove_process(&mut self, process: ProcessKey) -> Option<PeerId> {
        let entry = self.processes.remove(&process)?;
        if entry.index != 0 {
            self.process_indices.free(entry.index);
        }
        self.by_position.remove(&(entry.position, process));
        let owner = entry.owner?;
        if let Some(set) = self.on_peer.get_mut(&owner) {
            set.remove(&process);
        }
        Some(owner)
    }

    /// The peer a process is on (`None` if unknown or no peer exists).
    pub fn peer_of(&self, process: ProcessKey) -> Option<PeerId> {
        self.processes.get(&process).and_then(|e| e.owner)
    }

    /// The processes on `peer`, ascending.
    pub fn processes_on(&self, peer: PeerId) -> impl Iterator<Item = ProcessKey> + '_ {
        self.on_peer.get(&peer).into_iter().flatten().copied()
    }

    /// The peers with their powers, ascending by id.
    pub fn peers(&self) -> impl Iterator<Item = (PeerId, f64)> + '_ {
        self.powers.iter().map(|(&id, &w)| (id, w))
    }

    /// The number of processes in the table (placed or not).
    pub fn process_count(&self) -> usize {
        self.processes.len()
    }

    /// (extra) The number of peers.
    pub fn peer_count(&self) -> usize {
        self.powers.len()
    }

    /// (extra) A process's ring position (DHHT variants: the point the
    /// lower envelope is evaluated at; Multi / Rendezvous: the SHA-1 hash
    /// of its key). `None` if unknown.
    pub fn process_position(&self, process: ProcessKey) -> Option<Position> {
        self.processes.get(&process).map(|e| match self.variant {
            HashVariant::Dhht { .. } => e.position,
            _ => Position(e.hash),
        })
    }

    /// (extra) A peer's ring position in the DHHT variants (`None` for
    /// Multi / Rendezvous, which have no ring, and for unknown peers).
    pub fn peer_position(&self, peer: PeerId) -> Option<Position> {
        self.dhht.get(peer).map(|p| p.position)
    }

    /// (extra) The peer a process at `position` would get now, without
    /// adding it: `position` as returned by
    /// [`process_position`](HashTable::process_position) (for Multi /
    /// Rendezvous, the process's SHA-1 hash). DHHT: O(log n + walk);
    /// Multi / Rendezvous: O(n).
    pub fn lookup(&self, position: Position) -> Option<PeerId> {
        match self.variant {
            HashVariant::Dhht { .. } => self.dhht.lookup(position),
            _ => self.hash_argmin(position.0).map(|(_, id)| id),
        }
    }

    /// The peer a linear scan over all peers finds for `position`: the
    /// reference [`lookup`](HashTable::lookup) must agree with, and the
    /// baseline the lookup benchmark compares it to. O(n) for every variant.
    pub fn lookup_scan(&self, position: Position) -> Option<PeerId> {
        match self.variant {
            HashVariant::Dhht { .. } => self.dhht.lookup_naive(position),
            _ => self.hash_argmin(position.0).map(|(_, id)| id),
        }
    }

    /// (extra) Every process and its peer, recomputed from scratch by a
    /// linear scan over all peers — the reference model the incremental
    /// updates are tested against. O(m·n).
    pub fn naive_assignment(&self) -> BTreeMap<ProcessKey, Option<PeerId>> {
        self.processes
            .iter()
            .map(|(&k, e)| (k, self.lookup_naive(e)))
            .collect()
    }

    // ------------------------------------------------------------ internals

    /// The process's peer and that peer's value for it.
    fn lookup_entry(&self, e: &ProcEntry) -> Option<(f64, PeerId)> {
        match self.variant {
            HashVariant::Dhht { .. } => self.dhht.walk_best(e.position).0,
            _ => self.hash_argmin(e.hash),
        }
    }

    fn lookup_naive(&self, e: &ProcEntry) -> Option<PeerId> {
        match self.variant {
            HashVariant::Dhht { .. } => self.dhht.lookup_naive(e.position),
            _ => self.hash_argmin(e.hash).map(|(_, id)| id),
        }
    }

    /// Multi / Rendezvous: a linear scan over all peers.
    fn hash_argmin(&self, process_hash: u64) -> Option<(f64, PeerId)> {
        let rendezvous = self.variant == HashVariant::Rendezvous;
        let mut best: Option<(f64, i64)> = None;
        for p in &self.hash_peers {
            let v = hash_value(rendezvous, p.seed, p.weight, process_hash);
            if better(v, p.id, best) {
                best = Some((v, p.id));
            }
        }
        best
    }

    /// Peer `peer`'s current value for process `e` (`None` if it is gone).
    fn value_of(&self, peer: PeerId, e: &ProcEntry) -> Option<f64> {
        match self.variant {
            HashVariant::Dhht { .. } => {
                let p = self.dhht.get(peer)?;
                Some(envelope_value(e.position, p.position, p.weight))
            }
            _ => {
                let at = self.hash_peers.binary_search_by_key(&peer, |q| q.id).ok()?;
                let p = self.hash_peers[at];
                let rendezvous = self.variant == HashVariant::Rendezvous;
                Some(hash_value(rendezvous, p.seed, p.weight, e.hash))
            }
        }
    }

    /// After `peer`'s power changed, the processes it kept get its new value.
    fn refresh_values(&mut self, peer: PeerId) {
        let Some(set) = self.on_peer.get(&peer) else {
            return;
        };
        let values: Vec<(ProcessKey, f64)> = set
            .iter()
            .filter_map(|k| Some((*k, self.value_of(peer, &self.processes[k])?)))
            .collect();
        for (k, v) in values {
            if let Some(e) = self.processes.get_mut(&k) {
                e.value = v;
            }
        }
    }

    /// Power of `peer` went down or it left (its entry already updated or
    /// removed): only its own processes can move; look each up again.
    fn push_away(&self, peer: PeerId) -> Vec<(Move, f64)> {
        let Some(set) = self.on_peer.get(&peer) else {
            return Vec::new();
        };
        set.iter()
            .filter_map(|&k| {
                let best = self.lookup_entry(&self.processes[&k]);
                let to = best.map(|(_, id)| id);
                (to != Some(peer)).then_some((
                    Move {
                        process: k,
                        from: Some(peer),
                        to,
                    },
                    best.map_or(f64::INFINITY, |(v, _)| v),
                ))
            })
            .collect()
    }

    /// Multi / Rendezvous: `p` joined or its power went up (already stored):
    /// a process can only move to `p`, and does iff `p` now beats its peer's
    /// stored value. O(m) hash evaluations.
    fn hash_pull(&self, p: HashPeer) -> Vec<(Move, f64)> {
        let rendezvous = self.variant == HashVariant::Rendezvous;
        let mut moves = Vec::new();
        for (&k, e) in &self.processes {
            if e.owner == Some(p.id) {
                continue;
            }
            let mine = hash_value(rendezvous, p.seed, p.weight, e.hash);
            if better(mine, p.id, e.owner.map(|o| (e.value, o))) {
                moves.push((
                    Move {
                        process: k,
                        from: e.owner,
                        to: Some(p.id),
                    },
                    mine,
                ));
            }
        }
        moves
    }

    /// DHHT: `peer` at `position` joined or its power went up to `power`
    /// (already stored): a process can only move to it, so only the
    /// processes in the arcs where it can win ([`Dhht::pull_arcs`]) are
    /// compared with their peer's stored value.
    fn dhht_pull(&self, peer: PeerId, position: Position, power: f64) -> Vec<(Move, f64)> {
        let mut moves = Vec::new();
        for (start, end) in self.dhht.pull_arcs(peer, position, power) {
            // Distances start..=end clockwise from `position`.
            let lo = position.0.wrapping_add(start);
            let hi = position.0.wrapping_add(end);
            let ranges: [(u64, u64); 2] = if lo <= hi {
                [(lo, hi), (1, 0)]
            } else {
                [(lo, u64::MAX), (0, hi)]
            };
            for (a, b) in ranges {
                if a > b {
                    continue;
                }
                let first = (
                    Position(a),
                    ProcessKey {
                        job: i64::MIN,
                        pid: 0,
                    },
                );
                let last = (
                    Position(b),
                    ProcessKey {
                        job: i64::MAX,
                        pid: u32::MAX,
                    },
                );
                for &(x, k) in self.by_position.range(first..=last) {
                    let e = &self.processes[&k];
                    if e.owner == Some(peer) {
                        continue;
                    }
                    let mine = envelope_value(x, position, power);
                    if better(mine, peer, e.owner.map(|o| (e.value, o))) {
                        moves.push((
                            Move {
                                process: k,
                                from: e.owner,
                                to: Some(peer),
                            },
                            mine,
                        ));
                    }
                }
            }
        }
        moves
    }

    fn apply(&mut self, moves: &[(Move, f64)]) {
        for (m, value) in moves {
            if let Some(e) = self.processes.get_mut(&m.process) {
                e.owner = m.to;
                e.value = *value;
            }
            if let Some(from) = m.from
                && let Some(set) = self.on_peer.get_mut(&from)
            {
                set.remove(&m.process);
            }
            if let Some(to) = m.to {
                self.on_peer.entry(to).or_default().insert(m.process);
            }
        }
    }
}
