//! DiDiC (§5.3, Listing 5.1): k primary diffusion systems (FOS/T) whose
//! load is drained back towards each cluster by a secondary system with
//! vertex benefits (FOS/B); every vertex joins the system that leaves it
//! the most load. Simulated synchronously: in each iteration every vertex
//! reads its neighbours' loads of the previous iteration, as a distributed
//! run in lockstep would.

use std::collections::{BTreeMap, BTreeSet};

use crate::graph::{Graph, VertexId};
use crate::rng::Rng;

/// The parameters of DiDiC (the dissertation's names; §5.4 used k = 20,
/// ψ = 11, ρ = 11, B = 10).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DidicParams {
    /// Cluster systems: more than the clusters wanted (colours vanish).
    pub k: u32,
    /// FOS/T iterations per time step.
    pub psi: u32,
    /// FOS/B iterations per FOS/T iteration.
    pub rho: u32,
    /// The benefit `B ≫ 1` of a vertex in its own cluster's system.
    pub benefit: f64,
    /// The initial load of a vertex in its own cluster's systems (100).
    pub initial_load: f64,
    /// A vertex that starts with a random cluster starts with an initial
    /// load drawn uniformly from `initial_load · [1, 1 + initial_spread)`
    /// (0, the default: the dissertation's constant). A departure from
    /// Listing 5.1's `SetInitialLoad` for small networks
    /// ([`DidicParams::measured`]): on a well-connected group the cluster
    /// with the largest secondary total wins (each FOS/T iteration adds it
    /// to the primary system), so equal totals — two clusters that started
    /// with two vertices each — split the group for good; random totals
    /// are never equal. Each vertex draws its own: distributed.
    pub initial_spread: f64,
    /// After this many time steps a vertex may only join a cluster one of
    /// its neighbours is in (§5.3, "after 10 time steps").
    pub restrict_after: u32,
    /// A vertex leaves its cluster `c` for `c'` only if
    /// `w(c') ≥ w(c) + |w(c)| · switch_margin · t` (§5.3: "at least
    /// 1 + 0.0001·t times higher"; the absolute value keeps the rule
    /// meaningful for negative loads).
    pub switch_margin: f64,
    /// How the secondary load drains into the primary system in each FOS/T
    /// iteration ([`Drain`]).
    pub drain: Drain,
}

/// How FOS/T takes the secondary load `l` (Listing 5.1, line 15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// As §5.3's prose and the FOS/C scheme DiDiC builds on [MMS09] have
    /// it: load is sent back to the cluster "by subtracting it from the
    /// remaining vertices (this may lead to a negative load for some
    /// vertices)" — `w ← w − flow + l − l̄`, with `l̄` the mean secondary
    /// load of the vertex's connected part (what a plain averaging
    /// diffusion of `l` converges to, so a distributed run can have it).
    /// Each system's primary total then stays constant.
    ZeroSum,
    /// Listing 5.1 as printed: `w ← w − flow + l`. Each FOS/T iteration
    /// adds the whole secondary total `L_c` to system `c`'s primary one,
    /// so `w(c) ≈ t·ψ·L_c/n` plus a bounded term: given time, the system
    /// with the largest secondary total wins every vertex it reaches,
    /// whatever the edges (measured: modularity on §5.4's 800-vertex
    /// graphs falls from 0.79 at step 50 to 0.55 at step 300 without
    /// dynamics, 13 clusters to 5).
    Listing,
}

impl DidicParams {
    /// The parameters for the small networks peers measure
    /// ([`crate::MeasuredNetwork`]): the dissertation's, with initial loads
    /// random in [100, 400) (`initial_spread` 3) and Listing 5.1's drain
    /// ([`Drain::Listing`]). On a dozen peers its growth term — the
    /// system with the largest secondary total wins a connected part — is
    /// what joins a site into one cluster (the edge rule keeps slow
    /// gateways out of the parts; random totals are never equal); the
    /// zero-sum drain has no such force and leaves a flat network of 12
    /// peers in several clusters from 30 of 40 starts. On §5.4's large
    /// graphs the same force eats real clusters, so the default there is
    /// [`Drain::ZeroSum`] with the constant initial load.
    pub fn measured() -> DidicParams {
        DidicParams {
            initial_spread: 3.0,
            drain: Drain::Listing,
            ..DidicParams::default()
        }
    }
}

impl Default for DidicParams {
    fn default() -> Self {
        DidicParams {
            k: 20,
            psi: 11,
            rho: 11,
            benefit: 10.0,
            initial_load: 100.0,
            initial_spread: 0.0,
            restrict_after: 10,
            switch_margin: 0.0001,
            drain: Drain::ZeroSum,
        }
    }
}

#[derive(Debug, Clone)]
struct State {
    cluster: u32,
    /// Primary loads, one per system.
    w: Vec<f64>,
    /// Secondary loads, one per system.
    l: Vec<f64>,
}

/// DiDiC's state over a dynamic graph: each vertex's cluster and loads.
#[derive(Debug, Clone)]
pub struct Didic {
    params: DidicParams,
    state: BTreeMap<VertexId, State>,
    /// Time steps done.
    t: u32,
}

impl Didic {
    pub fn new(params: DidicParams) -> Didic {
        assert!(params.k >= 1, "DiDiC needs at least one cluster system");
        Didic {
            params,
            state: BTreeMap::new(),
            t: 0,
        }
    }

    pub fn params(&self) -> &DidicParams {
        &self.params
    }

    /// Time steps done.
    pub fn time_step(&self) -> u32 {
        self.t
    }

    /// Each vertex's cluster number (`0..k`).
    pub fn clustering(&self) -> BTreeMap<VertexId, u32> {
        self.state.iter().map(|(v, s)| (*v, s.cluster)).collect()
    }

    /// The primary and secondary loads of `v`, one per cluster system.
    pub fn loads(&self, v: VertexId) -> Option<(&[f64], &[f64])> {
        self.state.get(&v).map(|s| (s.w.as_slice(), s.l.as_slice()))
    }

    pub fn cluster_of(&self, v: VertexId) -> Option<u32> {
        self.state.get(&v).map(|s| s.cluster)
    }

    /// Assign `v` to `cluster` (a known affiliation, e.g. a volunteer's
    /// `--cluster`) with the initial loads of that cluster.
    pub fn assign(&mut self, v: VertexId, cluster: u32) {
        let cluster = cluster % self.params.k;
        self.state.insert(v, self.initial(cluster, 0.0));
    }

    fn initial(&self, cluster: u32, u: f64) -> State {
        let mut w = vec![0.0; self.params.k as usize];
        w[cluster as usize] = self.params.initial_load * (1.0 + self.params.initial_spread * u);
        State {
            cluster,
            l: w.clone(),
            w,
        }
    }

    /// Vertex `v` is about to leave `graph`: its loads go to its
    /// neighbours in equal parts (§5.3) and it is forgotten. Call it
    /// before removing `v` from the graph.
    pub fn remove_vertex(&mut self, graph: &Graph, v: VertexId) {
        let Some(gone) = self.state.remove(&v) else {
            return;
        };
        let nbrs: Vec<VertexId> = graph
            .neighbours(v)
            .map(|(u, _)| u)
            .filter(|u| self.state.contains_key(u))
            .collect();
        if nbrs.is_empty() {
            return;
        }
        let share = 1.0 / nbrs.len() as f64;
        for u in nbrs {
            let s = self.state.get_mut(&u).expect("filtered above");
            for c in 0..self.params.k as usize {
                s.w[c] += gone.w[c] * share;
                s.l[c] += gone.l[c] * share;
            }
        }
    }

    /// The total primary and secondary load of system `c` (what the
    /// diffusion conserves: FOS/B keeps `l`'s total, each FOS/T iteration
    /// adds `l`'s total to `w`'s).
    pub fn totals(&self, c: u32) -> (f64, f64) {
        let c = c as usize;
        self.state
            .values()
            .fold((0.0, 0.0), |(w, l), s| (w + s.w[c], l + s.l[c]))
    }

    /// Forget vertices no longer in `graph` (without handing on their
    /// load) and give every new vertex a random cluster and its loads.
    fn sync_vertices(&mut self, graph: &Graph, rng: &mut Rng) {
        self.state.retain(|v, _| graph.contains(*v));
        for v in graph.vertices() {
            if !self.state.contains_key(&v) {
                // One draw for both the cluster (as `Rng::below`) and the
                // load (its bits mixed again), so a caller's other random
                // choices (the dynamics of `bspweb cluster-sim`) do not
                // change with `initial_spread`.
                let x = rng.next_u64();
                let c = ((u128::from(x) * u128::from(self.params.k)) >> 64) as u32;
                let u = Rng::new(x).unit();
                self.state.insert(v, self.initial(c, u));
            }
        }
    }

    /// One time step of Listing 5.1 on `graph`: ψ FOS/T iterations, each
    /// after ρ FOS/B iterations, for every cluster system, then every
    /// vertex picks its cluster (with the §5.3 improvements).
    pub fn step(&mut self, graph: &Graph, rng: &mut Rng) {
        self.sync_vertices(graph, rng);
        self.t += 1;
        let p = self.params;
        let ids: Vec<VertexId> = self.state.keys().copied().collect();
        let index: BTreeMap<VertexId, usize> =
            ids.iter().enumerate().map(|(i, v)| (*v, i)).collect();
        let degree: Vec<f64> = ids.iter().map(|v| graph.degree(*v)).collect();
        // α(e)·ω(e) with α(e) = 1 / max(deg u, deg v).
        let adj: Vec<Vec<(usize, f64)>> = ids
            .iter()
            .enumerate()
            .map(|(i, v)| {
                graph
                    .neighbours(*v)
                    .filter_map(|(u, w)| {
                        let j = *index.get(&u)?;
                        Some((j, w / degree[i].max(degree[j])))
                    })
                    .collect()
            })
            .collect();
        let cluster: Vec<u32> = ids.iter().map(|v| self.state[v].cluster).collect();
        let n = ids.len();
        // Connected parts, for the zero-sum drain's means.
        let parts = crate::connected_parts(
            graph,
            &ids.iter().map(|v| (*v, 0)).collect(),
            1,
            ids.iter().copied(),
        );
        let part: Vec<usize> = ids.iter().map(|v| parts[v] as usize).collect();
        let mut part_size = vec![0usize; part.iter().max().map_or(0, |m| m + 1)];
        for &p in &part {
            part_size[p] += 1;
        }
        let (mut w, mut l) = (vec![0.0; n], vec![0.0; n]);
        let (mut next_w, mut next_l) = (vec![0.0; n], vec![0.0; n]);
        let mut scaled = vec![0.0; n];
        for c in 0..p.k as usize {
            for (i, v) in ids.iter().enumerate() {
                w[i] = self.state[v].w[c];
                l[i] = self.state[v].l[c];
            }
            for _ in 0..p.psi {
                for _ in 0..p.rho {
                    // FOS/B: l / b, with b = B in the system's own cluster.
                    for i in 0..n {
                        let b = if cluster[i] as usize == c {
                            p.benefit
                        } else {
                            1.0
                        };
                        scaled[i] = l[i] / b;
                    }
                    for i in 0..n {
                        let flow: f64 = adj[i]
                            .iter()
                            .map(|&(j, a)| a * (scaled[i] - scaled[j]))
                            .sum();
                        next_l[i] = l[i] - flow;
                    }
                    std::mem::swap(&mut l, &mut next_l);
                }
                // FOS/T, plus the drained load.
                let mut mean = vec![0.0; part_size.len()];
                if p.drain == Drain::ZeroSum {
                    for i in 0..n {
                        mean[part[i]] += l[i];
                    }
                    for (m, size) in mean.iter_mut().zip(&part_size) {
                        *m /= *size as f64;
                    }
                }
                for i in 0..n {
                    let flow: f64 = adj[i].iter().map(|&(j, a)| a * (w[i] - w[j])).sum();
                    next_w[i] = w[i] - flow + l[i] - mean[part[i]];
                }
                std::mem::swap(&mut w, &mut next_w);
            }
            for (i, v) in ids.iter().enumerate() {
                let s = self.state.get_mut(v).expect("known vertex");
                s.w[c] = w[i];
                s.l[c] = l[i];
            }
        }
        // The new clusters, all from the clustering before this update.
        let restrict = self.t > p.restrict_after;
        let margin = p.switch_margin * f64::from(self.t);
        let mut next = Vec::with_capacity(n);
        for (i, v) in ids.iter().enumerate() {
            let s = &self.state[v];
            let own = s.cluster;
            let candidates: BTreeSet<u32> = if restrict {
                adj[i].iter().map(|&(j, _)| cluster[j]).collect()
            } else {
                (0..p.k).collect()
            };
            let Some(best) = candidates
                .iter()
                .copied()
                .fold(None::<u32>, |best, c| match best {
                    Some(b) if s.w[b as usize] >= s.w[c as usize] => Some(b),
                    _ => Some(c),
                })
            else {
                next.push(own); // no neighbours: nothing to join
                continue;
            };
            let keep = candidates.contains(&own)
                && (best == own
                    || s.w[best as usize] < s.w[own as usize] + s.w[own as usize].abs() * margin);
            next.push(if keep { own } else { best });
        }
        for (v, c) in ids.iter().zip(next) {
            self.state.get_mut(v).expect("known vertex").cluster = c;
        }
    }
}
