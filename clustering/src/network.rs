//! DiDiC on the network peers measure: the supernode's continuous
//! clustering (dissertation §5.1, §6.1). Vertices are peers, identified by
//! their ids; edges are measured links, weighted by bandwidth. The graph
//! follows the measurements as peers come and go (a peer that leaves hands
//! its loads to its neighbours, §5.3), and every [`MeasuredNetwork::step`]
//! is one DiDiC time step.

use std::collections::BTreeMap;

use crate::{Didic, DidicParams, Graph, Rng, VertexId};

/// The measured network and DiDiC's state on it.
#[derive(Debug)]
pub struct MeasuredNetwork {
    graph: Graph,
    didic: Didic,
    vertex: BTreeMap<i64, VertexId>,
    peer: BTreeMap<VertexId, i64>,
    rng: Rng,
}

impl MeasuredNetwork {
    pub fn new(params: DidicParams, seed: u64) -> MeasuredNetwork {
        MeasuredNetwork {
            graph: Graph::new(),
            didic: Didic::new(params),
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
        let mut edges: BTreeMap<(i64, i64), f64> = BTreeMap::new();
        for (a, b, w) in links {
            if a == b || !(w.is_finite() && w > 0.0) {
                continue;
            }
            let key = (a.min(b), a.max(b));
            let e = edges.entry(key).or_insert(0.0);
            *e = e.max(w);
        }
        let wanted: std::collections::BTreeSet<i64> =
            edges.keys().flat_map(|&(a, b)| [a, b]).collect();
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

    /// Each peer's cluster (a number below `k`), for the peers of the graph.
    pub fn clusters(&self) -> BTreeMap<i64, u32> {
        self.didic
            .clustering()
            .into_iter()
            .filter_map(|(v, c)| Some((*self.peer.get(&v)?, c)))
            .collect()
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
        let mut net = MeasuredNetwork::new(DidicParams::default(), 7);
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
        assert!(c.values().all(|&k| k < DidicParams::default().k));
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
}
