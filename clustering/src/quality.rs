//! The quality measures of §5.2: modularity and the nearly connected value.

use std::collections::{BTreeMap, BTreeSet};

use crate::graph::{Graph, VertexId};

/// Modularity of the clustering `cluster` (a cluster number for every
/// vertex of `graph`; a vertex it does not name is a cluster of its own):
/// `Σ_c (ω(E_c) / ω(E) − (Σ_{v∈π_c} deg(v) / 2ω(E))²)` (§5.2, after
/// Brandes et al.). 0 for a graph without edges. Empty clusters add nothing.
pub fn modularity(graph: &Graph, cluster: &BTreeMap<VertexId, u32>) -> f64 {
    let total = graph.total_weight();
    if total <= 0.0 {
        return 0.0;
    }
    let mut inside: BTreeMap<u32, f64> = BTreeMap::new();
    let mut degree: BTreeMap<u32, f64> = BTreeMap::new();
    for (u, v, w) in graph.edges() {
        if let (Some(a), Some(b)) = (cluster.get(&u), cluster.get(&v))
            && a == b
        {
            *inside.entry(*a).or_default() += w;
        }
    }
    // A vertex the clustering does not name is a cluster of its own.
    let mut alone = 0.0;
    for v in graph.vertices() {
        match cluster.get(&v) {
            Some(c) => *degree.entry(*c).or_default() += graph.degree(v),
            None => alone += (graph.degree(v) / (2.0 * total)).powi(2),
        }
    }
    degree
        .iter()
        .map(|(c, d)| {
            let share = d / (2.0 * total);
            inside.get(c).copied().unwrap_or(0.0) / total - share * share
        })
        .sum::<f64>()
        - alone
}

/// The nearly connected value averaged over the non-empty clusters: for
/// each cluster, the size of its largest cluster-connected component (a
/// component of the subgraph it induces) over its size (§5.2, §5.4). 1.0
/// when every cluster is connected; 0 for an empty clustering.
pub fn ncv(graph: &Graph, cluster: &BTreeMap<VertexId, u32>) -> f64 {
    let mut members: BTreeMap<u32, Vec<VertexId>> = BTreeMap::new();
    for v in graph.vertices() {
        if let Some(c) = cluster.get(&v) {
            members.entry(*c).or_default().push(v);
        }
    }
    if members.is_empty() {
        return 0.0;
    }
    let mut sum = 0.0;
    for (c, vs) in &members {
        let mut seen: BTreeSet<VertexId> = BTreeSet::new();
        let mut largest = 0usize;
        for &start in vs {
            if !seen.insert(start) {
                continue;
            }
            let (mut size, mut stack) = (0usize, vec![start]);
            while let Some(v) = stack.pop() {
                size += 1;
                for (u, _) in graph.neighbours(v) {
                    if cluster.get(&u) == Some(c) && seen.insert(u) {
                        stack.push(u);
                    }
                }
            }
            largest = largest.max(size);
        }
        sum += largest as f64 / vs.len() as f64;
    }
    sum / members.len() as f64
}
