//! Takahashi, Saito, Shibata and Taura, "A Stable Broadcast Algorithm":
//! multiple depth-first transfer trees over a bandwidth-annotated tree
//! topology (Algorithm 1), staged sending through them (Algorithm 2), and
//! the baselines of the paper's §4 expressed on the same topology.
//!
//! A *transfer tree* ([`TransferTree`]) is an overlay: its edges are
//! host-to-host transfers, each of which crosses the physical links on the
//! unique path between the two hosts. The depth-first trees of Algorithm 1
//! are *pipelines*: each node relays to the next destination in depth-first
//! order ("each node relays data to only one node", §2.2), which on a tree
//! topology crosses every arc at most once.
//!
//! Not here (yet): links with different capacities in the two directions
//! (the paper's "asymmetric" simulations; its proofs need symmetric links),
//! several replicas as sources (§3.2, last paragraph), the linear program
//! of Balanced Multicasting (§3.5), and the paper's dynamic allocation of
//! chunks to whichever connection is writable (§3.3) — here the shares are
//! fixed in proportion to the planned throughputs, which is what that
//! allocation converges to.

use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Range;

use crate::error::CollectiveError;
use crate::model::model_bandwidth;
use crate::rng::SplitMix64;
use crate::schedule::{Schedule, Transfer, chunks, weighted_pieces};
use crate::topology::{ArcId, NodeId, Topology};

/// The number of random candidates the paper's *Random Pipeline* draws (§4).
pub const RANDOM_PIPELINE_CANDIDATES: usize = 100;

/// One transfer tree: host-to-host edges, each sender listed as a receiver
/// (or being the source) before it sends, with the throughput the plan
/// gives it, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferTree {
    /// `(from, to)` overlay edges, parents before children.
    pub edges: Vec<(NodeId, NodeId)>,
    /// The planned rate of the tree (`u_i` of Algorithm 1); `None` lets the
    /// bandwidth model decide (the baselines).
    pub throughput: Option<u64>,
}

impl TransferTree {
    /// The pipeline `source → order[0] → order[1] → …`.
    pub fn pipeline(source: NodeId, order: &[NodeId], throughput: Option<u64>) -> Self {
        let mut edges = Vec::with_capacity(order.len());
        let mut prev = source;
        for &d in order {
            edges.push((prev, d));
            prev = d;
        }
        Self { edges, throughput }
    }

    /// `N(t)`: the nodes the tree delivers to, in edge order.
    pub fn destinations(&self) -> Vec<NodeId> {
        self.edges.iter().map(|&(_, to)| to).collect()
    }

    /// The arcs the tree's transfers cross, with multiplicity.
    pub fn arc_multiplicity(&self, topology: &Topology) -> BTreeMap<ArcId, u64> {
        let mut uses = BTreeMap::new();
        for &(a, b) in &self.edges {
            for arc in topology.path(a, b).unwrap_or_default() {
                *uses.entry(arc).or_insert(0) += 1;
            }
        }
        uses
    }
}

/// A broadcast plan: transfer trees from `source` over a topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreePlan {
    /// The host holding the data.
    pub source: NodeId,
    /// The hosts that must receive it.
    pub destinations: Vec<NodeId>,
    /// The trees `t_1, …, t_n`, in construction order.
    pub trees: Vec<TransferTree>,
}

impl TreePlan {
    /// `w(d)` of eq. 8: the sum of the planned throughputs `u_i` of the
    /// trees that reach `d` (trees without a planned throughput add 0).
    pub fn planned_bandwidth(&self) -> BTreeMap<NodeId, u64> {
        let mut w: BTreeMap<NodeId, u64> = self.destinations.iter().map(|&d| (d, 0)).collect();
        for tree in &self.trees {
            for d in tree.destinations() {
                *w.entry(d).or_insert(0) += tree.throughput.unwrap_or(0);
            }
        }
        w
    }

    /// The planned load of every arc: `Σ_i u_i × (times t_i crosses it)`.
    /// The plan is *feasible* (§3.1) when no arc's load exceeds its
    /// capacity.
    pub fn planned_arc_load(&self, topology: &Topology) -> Vec<u64> {
        let mut load = vec![0u64; topology.arc_count()];
        for tree in &self.trees {
            let u = tree.throughput.unwrap_or(0);
            for (arc, times) in tree.arc_multiplicity(topology) {
                load[arc] += u * times;
            }
        }
        load
    }
}

/// The arcs crossed by the pipeline `source → order…`, with multiplicity.
fn pipeline_arcs(topology: &Topology, source: NodeId, order: &[NodeId]) -> BTreeMap<ArcId, u64> {
    TransferTree::pipeline(source, order, None).arc_multiplicity(topology)
}

/// Repeats depth-first pipelines, subtracting each one's throughput from
/// the arcs it crosses, while `keep(reached)` holds.
fn repeated_depth_first(
    topology: &Topology,
    source: NodeId,
    destinations: &[NodeId],
    keep: impl Fn(usize) -> bool,
) -> Result<TreePlan, CollectiveError> {
    topology.check_broadcast(source, destinations)?;
    let mut is_destination = vec![false; topology.node_count()];
    for d in destinations {
        is_destination[d.0] = true;
    }
    let mut bandwidth: Vec<u64> = (0..topology.arc_count())
        .map(|a| topology.arc_capacity(a))
        .collect();
    let mut trees = Vec::new();
    loop {
        let order =
            topology.depth_first_destinations(source, &is_destination, |a| bandwidth[a] > 0);
        if order.is_empty() || !keep(order.len()) {
            break;
        }
        let arcs = pipeline_arcs(topology, source, &order);
        // The narrowest link of the tree (shared fairly if crossed twice,
        // which a depth-first pipeline on a tree never does).
        let u = arcs
            .iter()
            .map(|(&a, &times)| bandwidth[a] / times)
            .min()
            .unwrap_or(0);
        if u == 0 {
            // Unreachable on a tree with symmetric links (§3.4.1: the
            // backward arc always has at least the forward arc's bandwidth).
            break;
        }
        for (&a, &times) in &arcs {
            bandwidth[a] -= u * times;
        }
        trees.push(TransferTree::pipeline(source, &order, Some(u)));
    }
    Ok(TreePlan {
        source,
        destinations: destinations.to_vec(),
        trees,
    })
}

/// **Algorithm 1** (§3.2): build transfer trees by tracing the destinations
/// depth-first from `source` over the arcs with bandwidth left; give each
/// tree the bandwidth `u` of its narrowest arc; subtract `u` from every arc
/// it crosses (an arc at 0 is removed); repeat — keeping the *partial*
/// trees that reach only some destinations — until no destination is
/// reachable.
///
/// On a tree topology with symmetric links the result is *stable* and
/// *optimal* (§3.4): every destination `d` gets `w(d) = v₁(s, d)`
/// ([`TreePlan::planned_bandwidth`], eq. 10), the capacity of the narrowest
/// link between the source and `d`, whatever the other destinations; the
/// destination sets are nested, `N(t_n) ⊂ … ⊂ N(t_1)`.
pub fn stable_trees(
    topology: &Topology,
    source: NodeId,
    destinations: &[NodeId],
) -> Result<TreePlan, CollectiveError> {
    repeated_depth_first(topology, source, destinations, |_| true)
}

/// *Depth-First* / FPFR (§2.3, §4): repeated depth-first trees like
/// Algorithm 1, but only *spanning* ones — it stops as soon as a tree
/// misses a destination. On a tree topology this is one pipeline, limited
/// by the narrowest link it crosses.
pub fn fpfr_depth_first(
    topology: &Topology,
    source: NodeId,
    destinations: &[NodeId],
) -> Result<TreePlan, CollectiveError> {
    let all = destinations.len();
    repeated_depth_first(topology, source, destinations, |reached| reached == all)
}

/// The single *depth-first pipeline* (§2.2, the paper's ref. 7): one pipeline through all
/// destinations in depth-first order, its rate left to the model.
pub fn depth_first_pipeline(
    topology: &Topology,
    source: NodeId,
    destinations: &[NodeId],
) -> Result<TreePlan, CollectiveError> {
    topology.check_broadcast(source, destinations)?;
    let mut is_destination = vec![false; topology.node_count()];
    for d in destinations {
        is_destination[d.0] = true;
    }
    let order = topology.depth_first_destinations(source, &is_destination, |_| true);
    Ok(TreePlan {
        source,
        destinations: destinations.to_vec(),
        trees: vec![TransferTree::pipeline(source, &order, None)],
    })
}

/// *Flat Tree* (§2.1, §4): the source sends to every destination directly.
pub fn flat_tree_plan(
    topology: &Topology,
    source: NodeId,
    destinations: &[NodeId],
) -> Result<TreePlan, CollectiveError> {
    topology.check_broadcast(source, destinations)?;
    Ok(TreePlan {
        source,
        destinations: destinations.to_vec(),
        trees: vec![TransferTree {
            edges: destinations.iter().map(|&d| (source, d)).collect(),
            throughput: None,
        }],
    })
}

/// *Random Pipeline* (§4): `candidates` pipelines through the destinations
/// in random order (from `seed`), keeping the one with the largest aggregate
/// bandwidth under [`model_bandwidth`] (the first one on ties). The paper
/// draws [`RANDOM_PIPELINE_CANDIDATES`]; `0` is taken as 1.
pub fn random_pipeline(
    topology: &Topology,
    source: NodeId,
    destinations: &[NodeId],
    candidates: usize,
    seed: u64,
) -> Result<TreePlan, CollectiveError> {
    topology.check_broadcast(source, destinations)?;
    let mut rng = SplitMix64::new(seed);
    let mut best: Option<(f64, TreePlan)> = None;
    for _ in 0..candidates.max(1) {
        let mut order = destinations.to_vec();
        rng.shuffle(&mut order);
        let plan = TreePlan {
            source,
            destinations: destinations.to_vec(),
            trees: vec![TransferTree::pipeline(source, &order, None)],
        };
        let aggregate: f64 = model_bandwidth(topology, &plan)?.destination.values().sum();
        if best.as_ref().is_none_or(|(b, _)| aggregate > *b) {
            best = Some((aggregate, plan));
        }
    }
    Ok(best.map(|(_, p)| p).expect("at least one candidate"))
}

/// *Dijkstra* (§2.2, §4; the paper's refs. 4 and 8): grow one tree from the source; each round
/// attach the unreached destination with the widest path (largest
/// narrowest-link capacity, from the link capacities as given) from any
/// reached host, as a child of that host. Ties go to the smaller node id,
/// then to the reached host found first.
pub fn dijkstra_tree(
    topology: &Topology,
    source: NodeId,
    destinations: &[NodeId],
) -> Result<TreePlan, CollectiveError> {
    topology.check_broadcast(source, destinations)?;
    let mut reached = vec![source];
    let mut is_reached = vec![false; topology.node_count()];
    is_reached[source.0] = true;
    let mut edges = Vec::new();
    for _ in 0..destinations.len() {
        // Widest paths from the reached set: best[x] = (bandwidth, origin).
        let mut best: Vec<Option<(u64, NodeId)>> = vec![None; topology.node_count()];
        let mut heap = BinaryHeap::new();
        for &r in &reached {
            best[r.0] = Some((u64::MAX, r));
            heap.push((u64::MAX, std::cmp::Reverse(r.0), r));
        }
        let mut done = vec![false; topology.node_count()];
        while let Some((bw, std::cmp::Reverse(x), origin)) = heap.pop() {
            if done[x] || best[x] != Some((bw, origin)) {
                continue; // a stale entry
            }
            done[x] = true;
            for &(m, arc) in topology.neighbours(NodeId(x)) {
                let through = bw.min(topology.arc_capacity(arc));
                if !done[m.0] && best[m.0].is_none_or(|(b, _)| through > b) {
                    best[m.0] = Some((through, origin));
                    heap.push((through, std::cmp::Reverse(m.0), origin));
                }
            }
        }
        let pick = destinations
            .iter()
            .filter(|d| !is_reached[d.0])
            .filter_map(|&d| best[d.0].map(|(bw, origin)| (bw, std::cmp::Reverse(d), origin)))
            .max_by_key(|&(bw, d, _)| (bw, d));
        let Some((_, std::cmp::Reverse(d), origin)) = pick else {
            break;
        };
        edges.push((origin, d));
        reached.push(d);
        is_reached[d.0] = true;
    }
    Ok(TreePlan {
        source,
        destinations: destinations.to_vec(),
        trees: vec![TransferTree {
            edges,
            throughput: None,
        }],
    })
}

/// Each tree's receivers with their depth in the tree (the source at 0),
/// checking that every sender was reached before it sends.
pub(crate) fn tree_depths(
    plan: &TreePlan,
    index: usize,
) -> Result<BTreeMap<NodeId, usize>, CollectiveError> {
    let mut depth = BTreeMap::from([(plan.source, 0usize)]);
    for &(from, to) in &plan.trees[index].edges {
        let Some(&d) = depth.get(&from) else {
            return Err(CollectiveError::MalformedTree { tree: index, from });
        };
        if depth.insert(to, d + 1).is_some() {
            return Err(CollectiveError::MalformedTree {
                tree: index,
                from: to,
            });
        }
    }
    Ok(depth)
}

/// **Algorithm 2** (§3.3) as a step schedule: for `k = n` down to 1, the
/// data the nodes of `t_k` still lack is cut in proportion to `u_1 … u_k`
/// ([`weighted_pieces`]) and sent through `t_1 … t_k` at once, each tree
/// pipelining its share in chunks of at most `chunk` bytes. After stage `k`
/// every node of `N(t_k)` holds all the data.
///
/// As in the paper's implementation, no chunk is sent to a node that
/// already has it ("nodes will not send any duplicate chunks that have
/// already received by the peer"); such a node still relays from its own
/// copy. Every destination therefore receives every byte exactly once.
/// Trees without a planned throughput get weight 1, so a one-tree baseline
/// plan becomes a plain pipelined tree broadcast.
///
/// The stages run one after the other here; in the paper they follow each
/// other on the same connections too, and the rates of the trees, not the
/// steps, are what [`model_bandwidth`] evaluates.
pub fn staged_schedule(
    plan: &TreePlan,
    len: usize,
    chunk: usize,
) -> Result<Schedule, CollectiveError> {
    if chunk == 0 {
        return Err(CollectiveError::ZeroChunk);
    }
    let n = plan.trees.len();
    let depths = (0..n)
        .map(|i| tree_depths(plan, i))
        .collect::<Result<Vec<_>, _>>()?;
    // Nested destination sets, and each destination's level: the last tree
    // (1-based) that reaches it.
    let mut level: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (i, depth) in depths.iter().enumerate() {
        for &node in depth.keys().filter(|&&x| x != plan.source) {
            if i > 0 && !depths[i - 1].contains_key(&node) {
                return Err(CollectiveError::NotNested { tree: i });
            }
            level.insert(node, i + 1);
        }
    }
    if let Some(&d) = plan.destinations.iter().find(|d| !level.contains_key(d))
        && len > 0
    {
        return Err(CollectiveError::Unreachable(d));
    }
    let weights: Vec<u64> = plan
        .trees
        .iter()
        .map(|t| t.throughput.unwrap_or(1).max(1))
        .collect();
    let mut schedule = Schedule::empty(
        plan.source.0,
        plan.destinations.iter().map(|d| d.0).collect(),
        len,
    );
    // have[ℓ]: the ranges the nodes of level ℓ hold (all alike).
    let mut have: Vec<Vec<Range<usize>>> = vec![Vec::new(); n + 1];
    for k in (1..=n).rev() {
        let missing = complement(&have[k], len);
        let total: usize = missing.iter().map(|r| r.len()).sum();
        if total == 0 {
            continue;
        }
        let mut stage: Vec<Vec<Transfer>> = Vec::new();
        for (i, share) in weighted_pieces(total, &weights[..k])
            .into_iter()
            .enumerate()
        {
            let ranges = slice_flat(&missing, share);
            for level_have in &mut have[i + 1..=k] {
                level_have.extend(ranges.iter().cloned());
                normalize(level_have);
            }
            let pieces: Vec<Range<usize>> =
                ranges.into_iter().flat_map(|r| chunks(r, chunk)).collect();
            for &(from, to) in &plan.trees[i].edges {
                if level[&to] > k {
                    continue; // already holds everything
                }
                let d = depths[i][&to];
                for (c, piece) in pieces.iter().enumerate() {
                    let s = c + d - 1;
                    if stage.len() <= s {
                        stage.resize_with(s + 1, Vec::new);
                    }
                    stage[s].push(Transfer {
                        from: from.0,
                        to: to.0,
                        range: piece.clone(),
                    });
                }
            }
        }
        schedule.steps.extend(stage);
    }
    Ok(schedule)
}

/// Sorts and merges ranges in place.
fn normalize(ranges: &mut Vec<Range<usize>>) {
    ranges.retain(|r| !r.is_empty());
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for r in ranges.drain(..) {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    *ranges = merged;
}

/// `0..len` minus the (normalized: sorted, non-overlapping) `held` ranges.
pub fn complement(held: &[Range<usize>], len: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    for r in held {
        if r.start > at {
            out.push(at..r.start);
        }
        at = at.max(r.end);
    }
    if at < len {
        out.push(at..len);
    }
    out
}

/// The sub-ranges covering offsets `flat` of the concatenation of `ranges`.
fn slice_flat(ranges: &[Range<usize>], flat: Range<usize>) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut offset = 0;
    for r in ranges {
        let (lo, hi) = (offset, offset + r.len());
        let (s, e) = (flat.start.max(lo), flat.end.min(hi));
        if s < e {
            out.push(r.start + (s - lo)..r.start + (e - lo));
        }
        offset = hi;
    }
    out
}
