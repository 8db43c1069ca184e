//! A dynamic undirected graph with positive edge weights (bandwidths) and
//! stable vertex ids.

use std::collections::BTreeMap;

/// A vertex's id: stable while it exists, never reused.
pub type VertexId = u32;

/// An undirected graph with positive edge weights. Vertices and their
/// neighbours iterate in id order, so everything computed from a graph is
/// deterministic.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    adj: BTreeMap<VertexId, BTreeMap<VertexId, f64>>,
    next_id: VertexId,
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Adds a vertex without edges; returns its id.
    pub fn add_vertex(&mut self) -> VertexId {
        let id = self.next_id;
        self.next_id += 1;
        self.adj.insert(id, BTreeMap::new());
        id
    }

    /// Removes `v` and its edges; false if there is no such vertex.
    pub fn remove_vertex(&mut self, v: VertexId) -> bool {
        let Some(nbrs) = self.adj.remove(&v) else {
            return false;
        };
        for u in nbrs.keys() {
            if let Some(m) = self.adj.get_mut(u) {
                m.remove(&v);
            }
        }
        true
    }

    /// Sets the weight of edge `{u, v}` (`u ≠ v`, both present, `w > 0`
    /// and finite); false if that is not so.
    pub fn set_edge(&mut self, u: VertexId, v: VertexId, w: f64) -> bool {
        if !(u != v && w > 0.0 && w.is_finite() && self.contains(u) && self.contains(v)) {
            return false;
        }
        self.adj.get_mut(&u).map(|m| m.insert(v, w));
        self.adj.get_mut(&v).map(|m| m.insert(u, w));
        true
    }

    /// Removes edge `{u, v}`; false if there is none.
    pub fn remove_edge(&mut self, u: VertexId, v: VertexId) -> bool {
        let had = self.adj.get_mut(&u).and_then(|m| m.remove(&v)).is_some();
        if let Some(m) = self.adj.get_mut(&v) {
            m.remove(&u);
        }
        had
    }

    pub fn contains(&self, v: VertexId) -> bool {
        self.adj.contains_key(&v)
    }

    pub fn len(&self) -> usize {
        self.adj.len()
    }

    pub fn is_empty(&self) -> bool {
        self.adj.is_empty()
    }

    /// The vertices, in id order.
    pub fn vertices(&self) -> impl Iterator<Item = VertexId> + '_ {
        self.adj.keys().copied()
    }

    /// The neighbours of `v` with the edge weights, in id order (none if
    /// `v` is absent).
    pub fn neighbours(&self, v: VertexId) -> impl Iterator<Item = (VertexId, f64)> + '_ {
        self.adj
            .get(&v)
            .into_iter()
            .flat_map(|m| m.iter().map(|(u, w)| (*u, *w)))
    }

    pub fn weight(&self, u: VertexId, v: VertexId) -> Option<f64> {
        self.adj.get(&u)?.get(&v).copied()
    }

    /// The weighted degree: the sum of the weights of `v`'s edges.
    pub fn degree(&self, v: VertexId) -> f64 {
        self.neighbours(v).map(|(_, w)| w).sum()
    }

    /// Each edge once, `u < v`, in order.
    pub fn edges(&self) -> impl Iterator<Item = (VertexId, VertexId, f64)> + '_ {
        self.adj.iter().flat_map(|(u, m)| {
            m.iter()
                .filter(move |(v, _)| *v > u)
                .map(move |(v, w)| (*u, *v, *w))
        })
    }

    /// The sum of all edge weights.
    pub fn total_weight(&self) -> f64 {
        self.edges().map(|(_, _, w)| w).sum()
    }
}
