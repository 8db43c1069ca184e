//! The lower envelope of a distributed heterogeneous hash table (§4.2.2).

use std::collections::BTreeMap;

use crate::{PlacementError, Position};

/// A peer in the table: its id, ring position and current power.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peer {
    /// The peer id (the supernode's `PeerId`).
    pub id: i64,
    /// The peer's point on the ring.
    pub position: Position,
    /// Current power: benchmark speed × availability. Must be finite and
    /// greater than zero (see [`is_eligible_weight`]).
    pub weight: f64,
}

/// Whether `weight` may be a peer's weight: finite and greater than zero.
///
/// A peer whose availability drops to zero has no power to offer; the caller
/// removes it from the table (and inserts it again when it comes back).
pub fn is_eligible_weight(weight: f64) -> bool {
    weight.is_finite() && weight > 0.0
}

/// The value at process position `x` of the linear function of a peer at
/// `peer` with weight `weight`: `((x − peer) mod 1) / weight`.
///
/// The DHHT assigns `x` to the peer with the smallest value (ties: smaller
/// peer id). The value is computed the same way everywhere, so every
/// supernode derives the same assignment. It is monotone: non-decreasing in
/// the distance and non-increasing in the weight, which is what makes the
/// pruned walk of [`Dhht::lookup`] exact.
pub fn envelope_value(x: Position, peer: Position, weight: f64) -> f64 {
    x.ccw_distance_to(peer).to_f64() / weight
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    position: Position,
    id: i64,
    weight: f64,
}

impl Entry {
    fn peer(self) -> Peer {
        Peer {
            id: self.id,
            position: self.position,
            weight: self.weight,
        }
    }
}

/// A DHHT: peers on the unit ring, each owning the part of the ring where
/// its linear function is the lowest (the lower envelope, §4.2.2, Fig. 4.1).
///
/// Lookups walk counter-clockwise from the process position and stop as soon
/// as no further peer can win, so they cost O(log n) plus a walk whose length
/// depends on the weight spread, not on the number of peers. Changes cost
/// O(n) (a sorted vector), which suits tables of thousands of peers that
/// change far less often than they are looked up.
///
/// Peers whose weight is not finite and positive are not eligible:
/// [`insert`](Dhht::insert) and [`update`](Dhht::update) reject them with
/// [`PlacementError::InvalidWeight`] and leave the table unchanged.
#[derive(Debug, Clone, Default)]
pub struct Dhht {
    /// All peers, sorted by `(position, id)`.
    ring: Vec<Entry>,
    /// Peer id → (position, weight).
    by_id: BTreeMap<i64, (Position, f64)>,
    /// Every peer's weight, ascending (a multiset): the maximum, and the
    /// median [`Dhht::median_weight_of_others`] asks for at every renewal.
    weights: Vec<f64>,
}

impl Dhht {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table of `peers` built at once: O(n log n), where inserting them
    /// one by one is O(n²) (a supernode rebuilds its table of every online
    /// peer after another supernode changed it). Returns the peers it
    /// rejected, as [`Dhht::insert`] would have: an invalid weight, or an
    /// id listed before.
    pub fn from_peers(
        peers: impl IntoIterator<Item = Peer>,
    ) -> (Self, Vec<(Peer, PlacementError)>) {
        let mut d = Dhht::new();
        let mut rejected = Vec::new();
        for peer in peers {
            if let Err(e) = check_weight(peer) {
                rejected.push((peer, e));
                continue;
            }
            match d.by_id.entry(peer.id) {
                std::collections::btree_map::Entry::Occupied(_) => {
                    rejected.push((peer, PlacementError::DuplicatePeer { peer: peer.id }));
                }
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert((peer.position, peer.weight));
                    d.ring.push(Entry {
                        position: peer.position,
                        id: peer.id,
                        weight: peer.weight,
                    });
                    d.weights.push(peer.weight);
                }
            }
        }
        d.ring.sort_unstable_by_key(|e| (e.position, e.id));
        d.weights.sort_unstable_by(f64::total_cmp);
        (d, rejected)
    }

    /// The number of peers.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether the table has no peers.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Whether peer `id` is in the table.
    pub fn contains(&self, id: i64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// Peer `id`, if it is in the table.
    pub fn get(&self, id: i64) -> Option<Peer> {
        self.by_id.get(&id).map(|&(position, weight)| Peer {
            id,
            position,
            weight,
        })
    }

    /// All peers, in ring order (by position, then id).
    pub fn peers(&self) -> impl ExactSizeIterator<Item = Peer> + '_ {
        self.ring.iter().map(|e| e.peer())
    }

    /// The largest weight, if the table is not empty.
    pub fn max_weight(&self) -> Option<f64> {
        self.weights.last().copied()
    }

    /// The median weight of the peers other than `id`: with their weights
    /// sorted ascending, the one at index `len / 2`; `None` when there are
    /// none. O(log n), as the supernode asks at every renewal.
    pub fn median_weight_of_others(&self, id: i64) -> Option<f64> {
        let own = self.by_id.get(&id).map(|&(_, w)| w);
        let others = self.weights.len() - usize::from(own.is_some());
        if others == 0 {
            return None;
        }
        let m = others / 2;
        let Some(own) = own else {
            return Some(self.weights[m]);
        };
        // The others' list is `weights` without one copy of `own`; equal
        // weights are interchangeable, so take out the first.
        let removed = self.weights.partition_point(|&w| w < own);
        Some(if m < removed {
            self.weights[m]
        } else {
            self.weights[m + 1]
        })
    }

    /// The sum of all weights (summed in id order, so it is reproducible).
    pub fn total_weight(&self) -> f64 {
        self.by_id.values().map(|&(_, w)| w).sum()
    }

    /// Adds a peer.
    ///
    /// # Errors
    ///
    /// [`PlacementError::InvalidWeight`] if the weight is not finite and
    /// positive, [`PlacementError::DuplicatePeer`] if the id is present.
    pub fn insert(&mut self, peer: Peer) -> Result<(), PlacementError> {
        check_weight(peer)?;
        if self.contains(peer.id) {
            return Err(PlacementError::DuplicatePeer { peer: peer.id });
        }
        self.add(peer);
        Ok(())
    }

    /// Changes the position and weight of a peer already in the table, and
    /// returns its previous state.
    ///
    /// # Errors
    ///
    /// [`PlacementError::InvalidWeight`] if the weight is not finite and
    /// positive (remove the peer instead), [`PlacementError::UnknownPeer`] if
    /// the id is absent.
    ///
    /// O(n) (a change of weight alone moves part of the sorted weights).
    pub fn update(&mut self, peer: Peer) -> Result<Peer, PlacementError> {
        check_weight(peer)?;
        let Some(&(position, weight)) = self.by_id.get(&peer.id) else {
            return Err(PlacementError::UnknownPeer { peer: peer.id });
        };
        let old = Peer {
            id: peer.id,
            position,
            weight,
        };
        if position != peer.position {
            self.remove(peer.id);
            self.add(peer);
            return Ok(old);
        }
        if let Ok(at) = self
            .ring
            .binary_search_by(|e| (e.position, e.id).cmp(&(position, peer.id)))
        {
            self.ring[at].weight = peer.weight;
        }
        self.by_id.insert(peer.id, (position, peer.weight));
        self.forget_weight(weight);
        self.add_weight(peer.weight);
        Ok(old)
    }

    fn add_weight(&mut self, weight: f64) {
        let at = self.weights.partition_point(|&w| w < weight);
        self.weights.insert(at, weight);
    }

    fn forget_weight(&mut self, weight: f64) {
        let at = self.weights.partition_point(|&w| w < weight);
        if self.weights.get(at) == Some(&weight) {
            self.weights.remove(at);
        }
    }

    /// Removes peer `id` and returns it, or `None` if it was absent.
    pub fn remove(&mut self, id: i64) -> Option<Peer> {
        let (position, weight) = self.by_id.remove(&id)?;
        if let Ok(at) = self
            .ring
            .binary_search_by(|e| (e.position, e.id).cmp(&(position, id)))
        {
            self.ring.remove(at);
        }
        self.forget_weight(weight);
        Some(Peer {
            id,
            position,
            weight,
        })
    }

    /// The peer that process position `x` is assigned to: the one minimizing
    /// `((x − p_i) mod 1) / w_i`, ties broken by the smaller peer id; `None`
    /// if the table is empty.
    ///
    /// Exact (always equal to [`lookup_naive`](Dhht::lookup_naive)) without
    /// scanning all peers: binary-search the gap containing `x`, walk
    /// counter-clockwise, and stop once `distance / w_max` exceeds the best
    /// value found. The walk continues while the bound *equals* the best
    /// value, because a peer further away could still tie and win by id.
    pub fn lookup(&self, x: Position) -> Option<i64> {
        self.walk(x).0
    }

    /// The reference model of [`lookup`](Dhht::lookup): a linear scan over
    /// all peers. For tests and simulations.
    pub fn lookup_naive(&self, x: Position) -> Option<i64> {
        let mut best: Option<(f64, i64)> = None;
        for e in &self.ring {
            let value = envelope_value(x, e.position, e.weight);
            if better(value, e.id, best) {
                best = Some((value, e.id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// The lookup, also returning how many peers it examined.
    pub(crate) fn walk(&self, x: Position) -> (Option<i64>, usize) {
        let (best, examined) = self.walk_best(x);
        (best.map(|(_, id)| id), examined)
    }

    /// The lookup with the winner's envelope value, and how many peers it
    /// examined.
    pub(crate) fn walk_best(&self, x: Position) -> (Option<(f64, i64)>, usize) {
        let n = self.ring.len();
        let Some(w_max) = self.max_weight() else {
            return (None, 0);
        };
        // Entries at or before `x` in ring order; the walk starts at the last.
        let after = self.ring.partition_point(|e| e.position <= x);
        let mut best: Option<(f64, i64)> = None;
        let mut examined = 0;
        for step in 0..n {
            let e = self.ring[(after + n - 1 - step) % n];
            // Distances never decrease along the walk, and no peer's value is
            // below distance / w_max, so once that bound exceeds the best value
            // no later peer can win.
            let distance = x.ccw_distance_to(e.position).to_f64();
            if let Some((best_value, _)) = best
                && distance / w_max > best_value
            {
                break;
            }
            examined += 1;
            let value = distance / e.weight;
            if better(value, e.id, best) {
                best = Some((value, e.id));
            }
        }
        (best, examined)
    }

    /// The arcs of the ring where peer `id` at `position` with weight
    /// `weight` can win a process against the *other* peers of the table, as
    /// inclusive ranges of clockwise distances from `position`, ascending
    /// and disjoint. A superset: every point it can win lies in an arc.
    ///
    /// Used for incremental updates: when a peer joins or its weight goes
    /// up, processes can only move to it, and only within these arcs.
    ///
    /// Why it is exact: walk the other peers clockwise from `position`. Past
    /// a peer `q` at distance `a`, `q`'s value at distance `t ≥ a` is
    /// `(t − a)/w_q`, and ours is `t/w`. We lose for sure when
    /// `t/w > (t − a)/w_q · (1 + η)` (η = 10⁻⁹ absorbs the rounding of the
    /// float envelope values), i.e. for every `t` if `w_q ≥ w(1 + η)`, and
    /// otherwise for `t < a·W/(W − w_q)` with `W = w(1 + η)`. So the
    /// candidates after each passed peer are the distances at or beyond the
    /// largest such threshold so far, and the walk stops once that
    /// threshold reaches the full circle or a peer at least as strong is
    /// passed. Distance 0 (a process exactly at `position`) is always a
    /// candidate, since peers at the same position tie there.
    pub(crate) fn pull_arcs(&self, id: i64, position: Position, weight: f64) -> Vec<(u64, u64)> {
        const ETA: f64 = 1e-9;
        let n = self.ring.len();
        let w = weight * (1.0 + ETA);
        let mut arcs = vec![(0, 0)];
        // The first distance not yet covered by an arc, and the smallest
        // distance > 0 where we can still win.
        let mut from: u64 = 1;
        let mut threshold: u64 = 0;
        let first = self.ring.partition_point(|e| e.position < position);
        for step in 0..n {
            let e = self.ring[(first + step) % n];
            if e.id == id {
                continue;
            }
            let a = e.position.ccw_distance_to(position).0;
            let lo = from.max(threshold);
            if a > 0 && lo < a {
                arcs.push((lo, a - 1));
            }
            from = from.max(a);
            match pass_threshold(a, e.weight, w) {
                Some(t) => threshold = threshold.max(t),
                None => return arcs,
            }
        }
        let lo = from.max(threshold);
        arcs.push((lo, u64::MAX));
        arcs
    }

    fn add(&mut self, peer: Peer) {
        let at = self
            .ring
            .partition_point(|e| (e.position, e.id) < (peer.position, peer.id));
        self.ring.insert(
            at,
            Entry {
                position: peer.position,
                id: peer.id,
                weight: peer.weight,
            },
        );
        self.by_id.insert(peer.id, (peer.position, peer.weight));
        self.add_weight(peer.weight);
    }
}

/// Assigns each process position to its peer ([`Dhht::lookup`]); `None`
/// entries only when the table is empty.
pub fn place(dhht: &Dhht, positions: &[Position]) -> Vec<Option<i64>> {
    positions.iter().map(|&x| dhht.lookup(x)).collect()
}

fn check_weight(peer: Peer) -> Result<(), PlacementError> {
    if is_eligible_weight(peer.weight) {
        Ok(())
    } else {
        Err(PlacementError::InvalidWeight {
            peer: peer.id,
            weight: peer.weight,
        })
    }
}

pub(crate) fn better(value: f64, id: i64, best: Option<(f64, i64)>) -> bool {
    match best {
        None => true,
        Some((best_value, best_id)) => value < best_value || (value == best_value && id < best_id),
    }
}

/// After passing a peer of weight `w_q` at clockwise distance `a`, the
/// smallest distance `t > 0` (fixed point, rounded down) at which a peer of
/// effective weight `w` (already inflated by `1 + η`) may still beat it;
/// `None` if it never can (see [`Dhht::pull_arcs`]).
fn pass_threshold(a: u64, w_q: f64, w: f64) -> Option<u64> {
    if a == 0 {
        return if w_q > w { None } else { Some(0) };
    }
    if w_q >= w {
        return None;
    }
    // a·w/(w − w_q), shrunk by 10⁻¹² against its own rounding.
    let t = Position(a).to_f64() * w / (w - w_q) * (1.0 - 1e-12);
    if t >= 1.0 {
        None
    } else {
        // `as` saturates; t < 1 so the product is below 2⁶⁴.
        Some((t * 18_446_744_073_709_551_616.0) as u64)
    }
}
