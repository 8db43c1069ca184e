//! Two-level placement (dissertation ch. 6, Fig. 6.1): a DHHT over clusters
//! picks where a job goes, one DHHT per cluster picks each process's peer.
//! The rules and their reasons are on [`TwoLevel`].

use std::collections::BTreeMap;
use std::ops::Range;

use crate::dhht::{Dhht, Peer, envelope_value, is_eligible_weight};
use crate::{PlacementError, Position, golden_position};

/// A peer of a [`TwoLevel`] table: a [`Peer`] with its cluster and cores.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterPeer {
    /// The peer id (the supernode's `PeerId`).
    pub id: i64,
    /// The cluster the peer is in (for the supernode: its effective
    /// cluster, the volunteer's `--cluster` or the one found from measured
    /// links), or `None` when none is known: all such peers form one
    /// cluster of their own.
    pub cluster: Option<String>,
    /// The peer's point on the lower-level ring (its golden index's point,
    /// as for the flat DHHT).
    pub position: Position,
    /// Current power: benchmark speed × availability; finite and > 0.
    pub weight: f64,
    /// How many processes the peer can run at once at full speed: its
    /// cores. At least 1. A cluster's slots are the sum over its peers.
    pub slots: u32,
}

impl ClusterPeer {
    fn peer(&self) -> Peer {
        Peer {
            id: self.id,
            position: self.position,
            weight: self.weight,
        }
    }
}

/// One cluster of a [`TwoLevel`] table, as [`TwoLevel::clusters`] shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClusterInfo<'a> {
    /// The cluster's key.
    pub key: Option<&'a str>,
    /// Its golden index: its rank among the keys, from 1.
    pub index: u64,
    /// Its point on the top-level ring, `golden_position(index)`.
    pub position: Position,
    /// Its power: the sum of its peers' weights (in id order).
    pub power: f64,
    /// Its slots: the sum of its peers' cores.
    pub slots: u64,
    /// How many peers it has (at least 1: an empty cluster is dropped).
    pub peers: usize,
}

/// A contiguous block of a job's processes placed in one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The cluster.
    pub cluster: Option<String>,
    /// The pids (indices into the job's positions) placed there.
    pub pids: Range<usize>,
}

/// Where [`TwoLevel::place_job`] put a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPlacement {
    /// Each process's peer, by pid.
    pub owners: Vec<i64>,
    /// The clusters used, as contiguous pid blocks in pid order: one block
    /// when the job fits a cluster, none for a job without processes.
    pub blocks: Vec<Block>,
}

#[derive(Debug, Clone, Default)]
struct Cluster {
    dhht: Dhht,
    slots: u64,
    /// Σ weights in id order, recomputed on every change so that it does
    /// not depend on the order of the changes.
    power: f64,
}

impl Cluster {
    fn refresh_power(&mut self) {
        self.power = self.dhht.total_weight();
    }
}

/// A cluster during a placement: its rank-derived index and position.
#[derive(Clone, Copy)]
struct Candidate<'a> {
    key: &'a Option<String>,
    index: u64,
    position: Position,
    cluster: &'a Cluster,
}

impl Candidate<'_> {
    fn value(&self, job: Position) -> f64 {
        envelope_value(job, self.position, self.cluster.power)
    }
}

/// The two-level balancer: a DHHT over clusters weighted by their power
/// picks where a job goes, one [`Dhht`] per cluster each process's peer.
///
/// "On the top level, one load balancer assigns BSP programs (i.e., groups
/// of processes) to fast connected clusters of the PUB-Web network. On the
/// lower level, one load balancer per cluster schedules the BSP processes
/// on the particular peers within the clusters." Both levels here are the
/// lower envelope of §4.2.2:
///
/// - **Top level.** Each cluster is a point of a second unit ring with the
///   cluster's power (the sum of its peers' weights) as its weight. The
///   clusters sit at the golden points `{1·Φ}, …, {m·Φ}` in the order of
///   their keys (see *Cluster positions* below). A job has its own position
///   on that ring, and goes to the cluster whose function
///   `((y − p_c) mod 1) / W_c` is lowest at the job's position `y` among the
///   clusters it *fits* into; ties go to the smaller cluster index.
/// - **Lower level.** Inside the chosen cluster, a process at `x` goes to
///   the peer of that cluster's [`Dhht`] that wins `x` — exactly what the
///   flat DHHT would do if the cluster were the whole network.
///
/// # When a job fits
///
/// A job of `n` processes *fits* a cluster when `n` is at most the
/// cluster's **slots**, the sum of its peers' cores. A BSP superstep ends
/// with its slowest process; a job with more processes than the cluster
/// has cores runs two of them on one core somewhere even on an idle
/// cluster, so its compute phase takes at least twice as long as it needs
/// to — at that point spreading it over more cores is worth crossing a
/// gateway. The rule uses the peers' static capacity, not their current
/// load, so like the flat DHHT a placement depends only on the peer table,
/// never on the other jobs: any supernode with the same table computes the
/// same placement, and a restarted one can recompute it.
///
/// # Jobs that fit nowhere
///
/// A job larger than every cluster *spans* clusters. It uses the fewest
/// clusters whose slots together cover `n` (so it crosses as few gateways
/// as possible), chosen by the envelope order at the job's position among
/// the sets of that size (so that large jobs, too, spread over the
/// clusters by power): walking the clusters from the lowest function value
/// at `y` up, a cluster is taken when the still-uncovered processes can be
/// covered by it plus the largest clusters not yet taken within the
/// minimum count. The processes are split into **contiguous pid blocks**,
/// filling the chosen clusters largest first, each up to its slots (the
/// last one takes the rest). Contiguous blocks mean that block-distributed
/// data, and nearest-neighbour or ring exchanges, cross a cluster boundary
/// only between the `k` blocks; filling largest first makes the blocks as
/// unequal as capacity allows, which minimises the cut of an all-to-all
/// exchange (`Σ_{i<j} n_i·n_j` pairs cross a gateway, smallest when the
/// sizes are most unequal). Every chosen cluster gets at least one process
/// (otherwise fewer clusters would have sufficed).
///
/// A job larger than all clusters together goes to every cluster, in blocks
/// proportional to their slots (largest remainder, ties to the larger
/// cluster, then the smaller index).
///
/// # Cluster positions
///
/// Clusters are ranked by key ([`ClusterPeer::cluster`], `None` first), and
/// the cluster of rank `i` (from 1) sits at `golden_position(i)`. So the
/// indices are always exactly `1..=m` — the golden points' best smoothness
/// (φ², §4.2.4), which an [`IndexAllocator`](crate::IndexAllocator) keeps
/// only until an index is freed — and the positions follow from the peer
/// table alone: nothing to persist, the same on every supernode and after a
/// restart. When a cluster appears or disappears the later ones shift, but
/// that only changes where *new* jobs go: a placed job stays with its
/// clusters ([`TwoLevel::lookup_within`]), so no process ever moves because
/// the top ring changed.
///
/// # One cluster is the flat DHHT
///
/// With a single cluster — in particular when no peer names one — every
/// process lands on `dhht.lookup(x)` of a [`Dhht`] over the same peers, so a
/// caller can always use [`TwoLevel`].
///
/// # Example
///
/// Pure and deterministic: the result of every query is a function of the
/// set of peers in the table, not of the order they were added in.
///
/// ```
/// use placement::{ClusterPeer, TwoLevel, golden_position};
///
/// let mut t = TwoLevel::new();
/// for (id, cluster) in [(1, "a"), (2, "a"), (3, "b"), (4, "b")] {
///     t.insert(ClusterPeer {
///         id,
///         cluster: Some(cluster.into()),
///         position: golden_position(id as u64),
///         weight: 1.0,
///         slots: 2,
///     })?;
/// }
/// // A job of 4 processes fits one cluster (4 cores): one block.
/// let xs: Vec<_> = (1..=4).map(golden_position).collect();
/// let job = golden_position(1);
/// let placed = t.place_job(job, &xs).unwrap();
/// assert_eq!(placed.blocks.len(), 1);
/// // A job of 6 spans both clusters in two contiguous blocks.
/// let xs: Vec<_> = (5..=10).map(golden_position).collect();
/// let placed = t.place_job(golden_position(2), &xs).unwrap();
/// assert_eq!(placed.blocks.len(), 2);
/// assert_eq!(placed.blocks[0].pids, 0..4);
///
/// // Peer 1 leaves: its processes go to the peer that wins them inside
/// // their cluster now; every other process stays.
/// let cluster = t.get(1).unwrap().cluster;
/// t.remove(1);
/// let now = t.lookup_within(cluster.as_deref(), golden_position(2), xs[0]);
/// assert_eq!(now, Some(2));
/// # Ok::<(), placement::PlacementError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct TwoLevel {
    clusters: BTreeMap<Option<String>, Cluster>,
    /// Peer id → (cluster, slots).
    peers: BTreeMap<i64, (Option<String>, u32)>,
}

impl TwoLevel {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of peers.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether the table has no peers.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Whether peer `id` is in the table.
    pub fn contains(&self, id: i64) -> bool {
        self.peers.contains_key(&id)
    }

    /// Peer `id`, if it is in the table.
    pub fn get(&self, id: i64) -> Option<ClusterPeer> {
        let (cluster, slots) = self.peers.get(&id)?;
        let peer = self.clusters.get(cluster)?.dhht.get(id)?;
        Some(ClusterPeer {
            id,
            cluster: cluster.clone(),
            position: peer.position,
            weight: peer.weight,
            slots: *slots,
        })
    }

    /// The clusters, in key order (which is their index order).
    pub fn clusters(&self) -> impl ExactSizeIterator<Item = ClusterInfo<'_>> + '_ {
        self.candidates().map(|c| ClusterInfo {
            key: c.key.as_deref(),
            index: c.index,
            position: c.position,
            power: c.cluster.power,
            slots: c.cluster.slots,
            peers: c.cluster.dhht.len(),
        })
    }

    /// The lower-level table of `cluster`, if it has peers.
    pub fn cluster_dhht(&self, cluster: Option<&str>) -> Option<&Dhht> {
        self.clusters
            .get(&cluster.map(str::to_owned))
            .map(|c| &c.dhht)
    }

    /// Adds a peer (creating its cluster if it is the first there).
    ///
    /// # Errors
    ///
    /// [`PlacementError::InvalidWeight`] if the weight is not finite and
    /// positive, [`PlacementError::InvalidSlots`] if `slots` is 0,
    /// [`PlacementError::DuplicatePeer`] if the id is present. The table is
    /// unchanged on error.
    pub fn insert(&mut self, peer: ClusterPeer) -> Result<(), PlacementError> {
        check(&peer)?;
        if self.contains(peer.id) {
            return Err(PlacementError::DuplicatePeer { peer: peer.id });
        }
        let cluster = self.clusters.entry(peer.cluster.clone()).or_default();
        cluster.dhht.insert(peer.peer())?;
        cluster.slots += u64::from(peer.slots);
        cluster.refresh_power();
        self.peers.insert(peer.id, (peer.cluster, peer.slots));
        Ok(())
    }

    /// Inserts many peers as [`insert`](Self::insert) does, but computes
    /// each cluster's power once at the end: n peers cost O(n log n), where
    /// n single inserts into one cluster cost O(n²). Returns the peers
    /// refused, each with its error; all others are in.
    pub fn insert_all(
        &mut self,
        peers: impl IntoIterator<Item = ClusterPeer>,
    ) -> Vec<(i64, PlacementError)> {
        let mut refused = Vec::new();
        let mut touched = std::collections::BTreeSet::new();
        for peer in peers {
            if let Err(e) = check(&peer) {
                refused.push((peer.id, e));
                continue;
            }
            if self.contains(peer.id) {
                refused.push((peer.id, PlacementError::DuplicatePeer { peer: peer.id }));
                continue;
            }
            let cluster = self.clusters.entry(peer.cluster.clone()).or_default();
            if let Err(e) = cluster.dhht.insert(peer.peer()) {
                refused.push((peer.id, e));
                continue;
            }
            cluster.slots += u64::from(peer.slots);
            touched.insert(peer.cluster.clone());
            self.peers.insert(peer.id, (peer.cluster, peer.slots));
        }
        for key in touched {
            if let Some(c) = self.clusters.get_mut(&key) {
                c.refresh_power();
            }
        }
        // A refused first peer may have left its new cluster empty.
        self.clusters.retain(|_, c| !c.dhht.is_empty());
        refused
    }

    /// Changes a peer's cluster, position, weight or slots, and returns its
    /// previous state. A weight change alone is O(log n + cluster size).
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert) (remove a peer whose power dropped to
    /// zero instead), and [`PlacementError::UnknownPeer`] if the id is
    /// absent. The table is unchanged on error.
    pub fn update(&mut self, peer: ClusterPeer) -> Result<ClusterPeer, PlacementError> {
        check(&peer)?;
        let Some(old) = self.get(peer.id) else {
            return Err(PlacementError::UnknownPeer { peer: peer.id });
        };
        if old.cluster != peer.cluster {
            self.remove(peer.id);
            self.insert(peer)?;
            return Ok(old);
        }
        if let Some(cluster) = self.clusters.get_mut(&peer.cluster) {
            cluster.dhht.update(peer.peer())?;
            cluster.slots = cluster.slots - u64::from(old.slots) + u64::from(peer.slots);
            cluster.refresh_power();
        }
        self.peers.insert(peer.id, (peer.cluster, peer.slots));
        Ok(old)
    }

    /// Removes peer `id` and returns it, or `None` if it was absent. A
    /// cluster whose last peer leaves disappears.
    pub fn remove(&mut self, id: i64) -> Option<ClusterPeer> {
        let old = self.get(id)?;
        self.peers.remove(&id);
        if let Some(cluster) = self.clusters.get_mut(&old.cluster) {
            cluster.dhht.remove(id);
            cluster.slots -= u64::from(old.slots);
            if cluster.dhht.is_empty() {
                self.clusters.remove(&old.cluster);
            } else {
                cluster.refresh_power();
            }
        }
        Some(old)
    }

    fn candidates(&self) -> impl ExactSizeIterator<Item = Candidate<'_>> + '_ {
        self.clusters
            .iter()
            .enumerate()
            .map(|(rank, (key, cluster))| {
                let index = rank as u64 + 1;
                Candidate {
                    key,
                    index,
                    position: golden_position(index),
                    cluster,
                }
            })
    }

    /// The top-level winner at `job` among `candidates`: the lowest value,
    /// ties to the smaller index.
    fn top<'a>(
        job: Position,
        candidates: impl Iterator<Item = Candidate<'a>>,
    ) -> Option<Candidate<'a>> {
        let mut best: Option<(f64, Candidate<'a>)> = None;
        for c in candidates {
            let v = c.value(job);
            if best.is_none_or(|(b, bc)| v < b || (v == b && c.index < bc.index)) {
                best = Some((v, c));
            }
        }
        best.map(|(_, c)| c)
    }

    /// The cluster a job of `n` processes at top-level position `job` goes
    /// to if it fits one (see [`place_job`](Self::place_job)).
    pub fn fitting_cluster(&self, job: Position, n: usize) -> Option<Option<&str>> {
        let n = n as u64;
        Self::top(job, self.candidates().filter(|c| c.cluster.slots >= n)).map(|c| c.key.as_deref())
    }

    /// Every cluster a job of `n` processes at top-level position `job`
    /// fits, best first: in the order of the top-level envelope's values
    /// at `job` (ties: the smaller index). The first is
    /// [`fitting_cluster`](Self::fitting_cluster)'s; the others are where
    /// the job may go when that one cannot take it now (memory).
    pub fn fitting_clusters(&self, job: Position, n: usize) -> Vec<Option<&str>> {
        let n = n as u64;
        let mut fit: Vec<(f64, u64, Option<&str>)> = self
            .candidates()
            .filter(|c| c.cluster.slots >= n)
            .map(|c| (c.value(job), c.index, c.key.as_deref()))
            .collect();
        fit.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        fit.into_iter().map(|(_, _, key)| key).collect()
    }

    /// Places a job: `job` is its position on the top-level ring (e.g.
    /// `golden_position` of an index from a per-job
    /// [`IndexAllocator`](crate::IndexAllocator), or `hashed_position` of
    /// [`job_key`](crate::job_key)), `xs[pid]` its processes' positions (as
    /// for the flat DHHT). Returns each process's peer and the clusters'
    /// pid blocks, or `None` if the table is empty.
    ///
    /// - A job that fits a cluster (`xs.len()` ≤ its slots) goes to the
    ///   top-level envelope's winner at `job` among the clusters it fits,
    ///   and each process to the winner at its `x` inside that cluster.
    /// - A larger job spans the fewest clusters that cover it, in
    ///   contiguous pid blocks, largest cluster first; beyond the total
    ///   slots, every cluster in proportion to its slots.
    ///
    /// The result depends only on the peer table and the arguments.
    pub fn place_job(&self, job: Position, xs: &[Position]) -> Option<JobPlacement> {
        if self.clusters.is_empty() {
            return None;
        }
        let n = xs.len();
        let sizes = self.split(job, n);
        let mut owners = Vec::with_capacity(n);
        let mut blocks = Vec::with_capacity(sizes.len());
        for (c, size) in sizes {
            let start = owners.len();
            for &x in &xs[start..start + size] {
                owners.push(c.cluster.dhht.lookup(x)?);
            }
            blocks.push(Block {
                cluster: c.key.clone(),
                pids: start..start + size,
            });
        }
        Some(JobPlacement { owners, blocks })
    }

    /// The clusters of a job of `n` processes and how many processes each
    /// gets, in pid order; the sizes sum to `n` and none is 0.
    fn split(&self, job: Position, n: usize) -> Vec<(Candidate<'_>, usize)> {
        if n == 0 {
            return Vec::new();
        }
        let all: Vec<Candidate<'_>> = self.candidates().collect();
        let need = n as u64;
        if let Some(c) = Self::top(job, all.iter().copied().filter(|c| c.cluster.slots >= need)) {
            return vec![(c, n)];
        }
        // Largest first; equal slots: smaller index first.
        let mut by_size = all.clone();
        by_size.sort_by(|a, b| {
            b.cluster
                .slots
                .cmp(&a.cluster.slots)
                .then(a.index.cmp(&b.index))
        });
        let total: u64 = by_size.iter().map(|c| c.cluster.slots).sum();
        if total < need {
            return proportional(by_size, n, total);
        }
        // The fewest clusters that can cover n: the largest ones.
        let mut covered = 0;
        let k_min = by_size
            .iter()
            .take_while(|c| {
                let short = covered < need;
                covered += c.cluster.slots;
                short
            })
            .count();
        // Among the sets of k_min clusters, take clusters in envelope order
        // at `job` while the rest can still be covered by the largest ones.
        let mut order = all;
        order.sort_by(|a, b| {
            a.value(job)
                .total_cmp(&b.value(job))
                .then(a.index.cmp(&b.index))
        });
        let mut chosen: Vec<Candidate<'_>> = Vec::with_capacity(k_min);
        let mut left = need;
        for picks_left in (1..=k_min).rev() {
            let free: Vec<u64> = by_size
                .iter()
                .filter(|c| !chosen.iter().any(|d| d.index == c.index))
                .map(|c| c.cluster.slots)
                .collect();
            let pick = order.iter().copied().find(|c| {
                if chosen.iter().any(|d| d.index == c.index) {
                    return false;
                }
                // The largest (picks_left − 1) free clusters other than c.
                let mut rest = 0;
                let mut skipped = false;
                let mut taken = 0;
                for &s in &free {
                    if taken == picks_left - 1 {
                        break;
                    }
                    if !skipped && s == c.cluster.slots {
                        skipped = true;
                        continue;
                    }
                    rest += s;
                    taken += 1;
                }
                c.cluster.slots + rest >= left
            });
            // The largest free cluster always qualifies, so `pick` is Some.
            let Some(pick) = pick else { break };
            left = left.saturating_sub(pick.cluster.slots);
            chosen.push(pick);
        }
        chosen.sort_by(|a, b| {
            b.cluster
                .slots
                .cmp(&a.cluster.slots)
                .then(a.index.cmp(&b.index))
        });
        let mut left = n;
        let mut sizes = Vec::with_capacity(chosen.len());
        for c in chosen {
            let size = usize::try_from(c.cluster.slots)
                .unwrap_or(usize::MAX)
                .min(left);
            if size > 0 {
                sizes.push((c, size));
            }
            left -= size;
        }
        sizes
    }

    /// Where a process of a placed job should be now: `cluster` is the
    /// cluster its block was placed in (the cluster of the peer it is on or
    /// just left), `job` and `x` the job's and the process's positions.
    ///
    /// The winner at `x` inside `cluster` while that cluster has peers — so
    /// when a peer leaves, only its own processes move, and they stay in
    /// their cluster. If the cluster has no peer left, the whole block
    /// moves together to the top-level winner at `job` among the remaining
    /// clusters (fit is not asked: the rest of the job is already placed).
    /// `None` if the table is empty.
    ///
    /// The supernode calls it for each process of a peer that left, and
    /// may call it for every process to find the ones that should migrate
    /// after a power change (what the flat DHHT's `lookup` does today).
    pub fn lookup_within(&self, cluster: Option<&str>, job: Position, x: Position) -> Option<i64> {
        let dhht = match self.cluster_dhht(cluster) {
            Some(d) => d,
            None => &Self::top(job, self.candidates())?.cluster.dhht,
        };
        dhht.lookup(x)
    }
}

/// A job larger than every cluster together: every cluster, in proportion
/// to its slots (largest remainder; ties to the earlier in `by_size`).
fn proportional(by_size: Vec<Candidate<'_>>, n: usize, total: u64) -> Vec<(Candidate<'_>, usize)> {
    let n128 = n as u128;
    let total = u128::from(total.max(1));
    let mut sizes: Vec<(Candidate<'_>, usize, u128)> = by_size
        .into_iter()
        .map(|c| {
            let exact = n128 * u128::from(c.cluster.slots);
            (c, (exact / total) as usize, exact % total)
        })
        .collect();
    let mut left = n - sizes.iter().map(|s| s.1).sum::<usize>();
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].2.cmp(&sizes[a].2).then(a.cmp(&b)));
    for i in order {
        if left == 0 {
            break;
        }
        sizes[i].1 += 1;
        left -= 1;
    }
    sizes
        .into_iter()
        .filter(|s| s.1 > 0)
        .map(|(c, size, _)| (c, size))
        .collect()
}

fn check(peer: &ClusterPeer) -> Result<(), PlacementError> {
    if !is_eligible_weight(peer.weight) {
        return Err(PlacementError::InvalidWeight {
            peer: peer.id,
            weight: peer.weight,
        });
    }
    if peer.slots == 0 {
        return Err(PlacementError::InvalidSlots { peer: peer.id });
    }
    Ok(())
}
