//! DiDiC on the network peers measure: the supernode's continuous
//! clustering (dissertation §5.1, §6.1). Vertices are peers, identified by
//! their ids; edges are measured links, weighted by bandwidth. The graph
//! follows the measurements as peers come and go (a peer that leaves hands
//! its loads to its neighbours, §5.3), and every [`MeasuredNetwork::step`]
//! is one DiDiC time step.

use std::collections::{BTreeMap, BTreeSet};

use crate::{Didic, DidicParams, Graph, Rng, VertexId};

/// Which measured links become DiDiC's edges (§5.4's disc-graph rule,
/// read for bandwidths): each peer keeps its `max_neigh` fastest links,
/// less those more than `within` times slower than its fastest; an edge
/// is kept if either end keeps it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EdgeRule {
    pub max_neigh: usize,
    pub within: f64,
}

impl EdgeRule {
    /// Every measured link is an edge (no selection).
    pub const ALL: EdgeRule = EdgeRule {
        max_neigh: usize::MAX,
        within: f64::INFINITY,
    };
}

impl Default for EdgeRule {
    fn default() -> Self {
        EdgeRule {
            max_neigh: 8,
            within: 3.0,
        }
    }
}

/// The undirected links of `links`, `(a, b)` with `a < b`, weighted by the
/// larger of the two directions' bandwidths (a link measured one way only
/// counts once). Self-links and bandwidths that are not positive numbers
/// are ignored.
fn undirected(links: impl IntoIterator<Item = (i64, i64, f64)>) -> BTreeMap<(i64, i64), f64> {
    let mut edges: BTreeMap<(i64, i64), f64> = BTreeMap::new();
    for (a, b, w) in links {
        if a == b || !(w.is_finite() && w > 0.0) {
            continue;
        }
        let e = edges.entry((a.min(b), a.max(b))).or_insert(0.0);
        *e = e.max(w);
    }
    edges
}

/// DiDiC's edges from the measured links (see [`EdgeRule`]): `(a, b)`
/// with `a < b`, weighted by the larger of the two directions' bandwidths.
pub fn select_edges(
    links: impl IntoIterator<Item = (i64, i64, f64)>,
    rule: EdgeRule,
) -> BTreeMap<(i64, i64), f64> {
    let all = undirected(links);
    let mut of: BTreeMap<i64, Vec<(f64, i64)>> = BTreeMap::new();
    for (&(a, b), &w) in &all {
        of.entry(a).or_default().push((w, b));
        of.entry(b).or_default().push((w, a));
    }
    let mut kept: BTreeSet<(i64, i64)> = BTreeSet::new();
    for (&p, links) in &mut of {
        // Fastest first; ties go to the smaller id.
        links.sort_unstable_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
        let fastest = links[0].0;
        for &(w, q) in links.iter().take(rule.max_neigh) {
            if w * rule.within >= fastest {
                kept.insert((p.min(q), p.max(q)));
            }
        }
    }
    all.into_iter().filter(|(e, _)| kept.contains(e)).collect()
}

/// The time step from which [`MeasuredNetwork::clusters`] merges clusters
/// whose union has a higher modularity.
pub const MERGE_FROM: u32 = 30;

/// The measured network and DiDiC's state on it.
#[derive(Debug)]
pub struct MeasuredNetwork {
    graph: Graph,
    didic: Didic,
    rule: EdgeRule,
    vertex: BTreeMap<i64, VertexId>,
    peer: BTreeMap<VertexId, i64>,
    rng: Rng,
}

impl MeasuredNetwork {
    pub fn new(params: DidicParams, seed: u64) -> MeasuredNetwork {
        MeasuredNetwork::with_edge_rule(params, EdgeRule::default(), seed)
    }

    pub fn with_edge_rule(params: DidicParams, rule: EdgeRule, seed: u64) -> MeasuredNetwork {
        MeasuredNetwork {
            graph: Graph::new(),
            didic: Didic::new(params),
            rule,
            vertex: BTreeMap::new(),
            peer: BTreeMap::new(),
            rng: Rng::new(seed),
        }
    }

    /// Make the graph the measured one: a vertex per peer that has a link,
    /// an edge per linked pair, weighted by the larger of the two
    /// directions' `weight` (a link measured one way only counts once).
    /// Links with a weight that is not a positive number are ignored.
    pub fn update(&mut self, links: impl IntoIterator<Item = (i64, i64, f64)>) {
        let edges = select_edges(links, self.rule);
        let wanted: BTreeSet<i64> = edges.keys().flat_map(|&(a, b)| [a, b]).collect();
        let gone: Vec<i64> = self
            .vertex
            .keys()
            .copied()
            .filter(|p| !wanted.contains(p))
            .collect();
        for p in gone {
            if let Some(v) = self.vertex.remove(&p) {
                self.didic.remove_vertex(&self.graph, v);
                self.graph.remove_vertex(v);
                self.peer.remove(&v);
            }
        }
        for &p in &wanted {
            if !self.vertex.contains_key(&p) {
                let v = self.graph.add_vertex();
                self.vertex.insert(p, v);
                self.peer.insert(v, p);
            }
        }
        let stale: Vec<(VertexId, VertexId)> = self
            .graph
            .edges()
            .filter(|&(u, v, _)| {
                let (a, b) = (self.peer[&u], self.peer[&v]);
                !edges.contains_key(&(a.min(b), a.max(b)))
            })
            .map(|(u, v, _)| (u, v))
            .collect();
        for (u, v) in stale {
            self.graph.remove_edge(u, v);
        }
        for ((a, b), w) in edges {
            self.graph.set_edge(self.vertex[&a], self.vertex[&b], w);
        }
    }

    /// One DiDiC time step on the current graph.
    pub fn step(&mut self) {
        self.didic.step(&self.graph, &mut self.rng);
    }

    /// Each peer's cluster, for the peers of the graph: DiDiC's cluster
    /// number `c < k`, split into its connected parts (a cluster never
    /// spans a link DiDiC does not have): the part with the smallest peer
    /// id is `c`, the `j`-th `c + j·k`; from time step [`MERGE_FROM`] on,
    /// parts merged while a merge raises the modularity
    /// ([`merge_while_modularity_rises`]).
    ///
    /// The merge is for small networks, where §5.3's switching margin
    /// `|w(c)|·0.0001·t` can freeze a split DiDiC would otherwise undo: on
    /// four equally linked peers, two systems whose secondary totals are
    /// within a few per cent of each other keep two peers each for good
    /// (1 start in 200 at 300 steps; modularity −0.17 against 0 for one
    /// cluster). DiDiC's aim is high modularity (§5.2), and the supernode
    /// that runs it holds the whole measured graph, so it finishes the job;
    /// a merge never joins parts without a link between them, and never
    /// lowers the modularity. Not before [`MERGE_FROM`] time steps: DiDiC
    /// refines its random start itself first, and a merge of its early
    /// clusters would only be undone (renamed) as it does.
    ///
    /// [`merge_while_modularity_rises`]: crate::merge_while_modularity_rises
    pub fn clusters(&self) -> BTreeMap<i64, u32> {
        let parts = self.parts();
        if self.didic.time_step() < MERGE_FROM {
            return parts;
        }
        let by_vertex: BTreeMap<VertexId, u32> =
            parts.iter().map(|(p, &c)| (self.vertex[p], c)).collect();
        crate::merge_while_modularity_rises(&self.graph, &by_vertex)
            .into_iter()
            .filter_map(|(v, c)| Some((*self.peer.get(&v)?, c)))
            .collect()
    }

    /// DiDiC's clusters split into their connected parts (see
    /// [`clusters`](Self::clusters)), numbered from the peers in id order.
    fn parts(&self) -> BTreeMap<i64, u32> {
        let parts = crate::connected_parts(
            &self.graph,
            &self.didic.clustering(),
            self.didic.params().k,
            self.vertex.values().copied(),
        );
        parts
            .into_iter()
            .filter_map(|(v, c)| Some((*self.peer.get(&v)?, c)))
            .collect()
    }

    /// DiDiC's state (for tests and measurements).
    pub fn didic(&self) -> &Didic {
        &self.didic
    }

    /// The graph DiDiC runs on: the measured links the edge rule kept.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Peers in the graph.
    pub fn len(&self) -> usize {
        self.vertex.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vertex.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The graph follows the measurements: a vertex per linked peer, one
    /// edge per pair with the larger weight of its two directions; a peer
    /// that leaves leaves the clustering, one that joins gets a cluster.
    #[test]
    fn the_graph_follows_the_measurements() {
        let mut net = MeasuredNetwork::with_edge_rule(DidicParams::default(), EdgeRule::ALL, 7);
        net.update([(1, 2, 10.0), (2, 1, 30.0), (2, 3, 5.0), (3, 4, 1.0)]);
        assert_eq!(net.len(), 4);
        let (v1, v2) = (net.vertex[&1], net.vertex[&2]);
        assert_eq!(net.graph.weight(v1, v2), Some(30.0));
        assert_eq!(net.graph.edges().count(), 3);
        for _ in 0..5 {
            net.step();
        }
        let c = net.clusters();
        assert_eq!(c.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        // 4 leaves, 5 joins next to 3; the link 2–3 is not measured any more.
        let k = DidicParams::default().k;
        let secondary = |net: &MeasuredNetwork| (0..k).map(|c| net.didic.totals(c).1).sum::<f64>();
        let before = secondary(&net);
        net.update([(1, 2, 10.0), (3, 5, 8.0), (1, 3, 2.0)]);
        // 4 handed its loads to 3 (§5.3): nothing was lost.
        assert!((secondary(&net) - before).abs() < 1e-9 * before.max(1.0));
        net.step();
        let c = net.clusters();
        assert_eq!(c.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 5]);
        assert_eq!(net.graph.edges().count(), 3);
        assert_eq!(net.graph.weight(net.vertex[&2], net.vertex[&3]), None);
    }

    #[test]
    fn bad_weights_and_self_links_are_ignored() {
        let mut net = MeasuredNetwork::new(DidicParams::default(), 1);
        net.update([(1, 1, 5.0), (1, 2, f64::NAN), (2, 3, -1.0), (3, 4, 0.0)]);
        assert!(net.is_empty());
        net.update([(1, 2, 5.0)]);
        net.step();
        assert_eq!(net.clusters().len(), 2);
        net.update([]);
        net.step();
        assert!(net.clusters().is_empty());
    }

    /// §5.4's rule read for bandwidths: a peer keeps its fastest links and
    /// drops those more than `within` times slower than its fastest; an
    /// edge stays if either end keeps it.
    #[test]
    fn edges_are_each_peer_s_fastest_links() {
        let rule = EdgeRule {
            max_neigh: 2,
            within: 3.0,
        };
        // 1 keeps its two fastest, 2 and 5 (both directions of 1–5
        // measured: the larger counts), not 6 or 3; 3 keeps 1–3 (exactly a
        // third of its fastest), 4 its only link; 6 drops 1–6, more than
        // 3× slower than 6–7.
        let links = [
            (1, 2, 90.0),
            (2, 3, 90.0),
            (1, 3, 30.0),
            (1, 4, 10.0),
            (1, 5, 40.0),
            (5, 1, 35.0),
            (1, 6, 35.0),
            (6, 7, 200.0),
        ];
        let edges = select_edges(links, rule);
        assert_eq!(
            edges.into_iter().collect::<Vec<_>>(),
            vec![
                ((1, 2), 90.0),
                ((1, 3), 30.0),
                ((1, 4), 10.0),
                ((1, 5), 40.0),
                ((2, 3), 90.0),
                ((6, 7), 200.0)
            ]
        );
        // A link both ends find much slower than their fastest is dropped.
        let only_fast = select_edges([(1, 2, 100.0), (2, 3, 100.0), (1, 3, 20.0)], rule);
        assert_eq!(
            only_fast.keys().copied().collect::<Vec<_>>(),
            vec![(1, 2), (2, 3)]
        );
    }

    /// A cluster never spans two parts of the graph with no edge between
    /// them: with one cluster system, two separate pairs still get two
    /// numbers, and the numbers do not change while nothing does.
    #[test]
    fn separate_parts_of_a_cluster_get_their_own_numbers() {
        let params = DidicParams {
            k: 1,
            ..DidicParams::default()
        };
        let mut net = MeasuredNetwork::new(params, 3);
        net.update([(1, 2, 100.0), (3, 4, 100.0)]);
        net.step();
        let first = net.clusters();
        assert_eq!(first, BTreeMap::from([(1, 0), (2, 0), (3, 1), (4, 1)]));
        for _ in 0..5 {
            net.step();
            assert_eq!(net.clusters(), first);
        }
    }
}
