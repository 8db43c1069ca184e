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

/// `cluster` (numbers below `k`) with each cluster split into its
/// connected parts (components of the subgraph it induces): visiting the
/// vertices in `order`, the first part met of cluster `c` keeps `c`, the
/// `j`-th gets `c + j·k`. Vertices `cluster` does not name, or that
/// `order` does not visit, are left out. Splitting a cluster whose parts
/// share no edge never lowers the modularity.
pub fn connected_parts(
    graph: &Graph,
    cluster: &BTreeMap<VertexId, u32>,
    k: u32,
    order: impl IntoIterator<Item = VertexId>,
) -> BTreeMap<VertexId, u32> {
    let mut out: BTreeMap<VertexId, u32> = BTreeMap::new();
    let mut parts: BTreeMap<u32, u32> = BTreeMap::new();
    for v in order {
        if out.contains_key(&v) {
            continue;
        }
        let Some(&c) = cluster.get(&v) else { continue };
        let j = parts.entry(c).or_insert(0);
        let label = c + *j * k;
        *j += 1;
        let mut stack = vec![v];
        out.insert(v, label);
        while let Some(u) = stack.pop() {
            for (x, _) in graph.neighbours(u) {
                if cluster.get(&x) == Some(&c) && !out.contains_key(&x) {
                    out.insert(x, label);
                    stack.push(x);
                }
            }
        }
    }
    out
}

/// DiDiC's clustering as the supernode uses it: split into connected
/// parts ([`connected_parts`], in vertex order), then merged while
/// modularity rises ([`merge_while_modularity_rises`]).
pub fn refine(graph: &Graph, cluster: &BTreeMap<VertexId, u32>, k: u32) -> BTreeMap<VertexId, u32> {
    let parts = connected_parts(graph, cluster, k, graph.vertices());
    merge_while_modularity_rises(graph, &parts)
}

/// Merges clusters of `cluster` (as for [`modularity`]) while some pair of
/// linked clusters would raise the modularity together: each time the
/// pair with the largest gain `ω(E_ab)/ω(E) − d_a·d_b / (2·ω(E)²)`, which
/// takes the label of the larger of the two (more vertices; ties: the
/// smaller label). Clusters that share no edge never merge (the gain is
/// negative). The result's modularity is at least the input's, and no
/// further merge would raise it.
pub fn merge_while_modularity_rises(
    graph: &Graph,
    cluster: &BTreeMap<VertexId, u32>,
) -> BTreeMap<VertexId, u32> {
    let mut out = cluster.clone();
    let total = graph.total_weight();
    if total <= 0.0 {
        return out;
    }
    loop {
        let mut size: BTreeMap<u32, usize> = BTreeMap::new();
        let mut degree: BTreeMap<u32, f64> = BTreeMap::new();
        for v in graph.vertices() {
            if let Some(&c) = out.get(&v) {
                *size.entry(c).or_default() += 1;
                *degree.entry(c).or_default() += graph.degree(v);
            }
        }
        let mut between: BTreeMap<(u32, u32), f64> = BTreeMap::new();
        for (u, v, w) in graph.edges() {
            if let (Some(&a), Some(&b)) = (out.get(&u), out.get(&v))
                && a != b
            {
                *between.entry((a.min(b), a.max(b))).or_default() += w;
            }
        }
        let best = between
            .iter()
            .map(|(&(a, b), &e)| {
                let gain = e / total - degree[&a] * degree[&b] / (2.0 * total * total);
                (gain, a, b)
            })
            .filter(|(gain, _, _)| *gain > 1e-12)
            .max_by(|x, y| x.0.total_cmp(&y.0).then((y.1, y.2).cmp(&(x.1, x.2))));
        let Some((_, a, b)) = best else {
            return out;
        };
        let (keep, gone) = if (size[&b], std::cmp::Reverse(b)) > (size[&a], std::cmp::Reverse(a)) {
            (b, a)
        } else {
            (a, b)
        };
        for c in out.values_mut() {
            if *c == gone {
                *c = keep;
            }
        }
    }
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
