//! Property tests against reference models, and DiDiC on graphs whose
//! clusters are known.

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::{
    Didic, DidicParams, Drain, Dynamics, Graph, GraphModel, Rng, Topology, VertexId,
    merge_while_modularity_rises, modularity, ncv,
};

fn any_drain() -> impl Strategy<Value = Drain> {
    prop_oneof![Just(Drain::ZeroSum), Just(Drain::Listing)]
}

/// A graph from `(u, v, w)` triples over `n` vertices (self-loops and
/// repeated pairs dropped by `set_edge`'s rules: the last weight wins).
fn graph_of(n: usize, edges: &[(usize, usize, f64)]) -> Graph {
    let mut g = Graph::new();
    let ids: Vec<VertexId> = (0..n).map(|_| g.add_vertex()).collect();
    for &(u, v, w) in edges {
        g.set_edge(ids[u % n], ids[v % n], w);
    }
    g
}

/// Modularity by its other definition, over all ordered vertex pairs:
/// `1/2W Σ_ij (A_ij − d_i d_j / 2W) δ(c_i, c_j)`.
fn modularity_pairs(g: &Graph, c: &BTreeMap<VertexId, u32>) -> f64 {
    let total = g.total_weight();
    if total == 0.0 {
        return 0.0;
    }
    let vs: Vec<VertexId> = g.vertices().collect();
    let mut q = 0.0;
    for &i in &vs {
        for &j in &vs {
            if c[&i] == c[&j] {
                let a = g.weight(i, j).unwrap_or(0.0);
                q += a - g.degree(i) * g.degree(j) / (2.0 * total);
            }
        }
    }
    q / (2.0 * total)
}

fn small_graph() -> impl Strategy<Value = (usize, Vec<(usize, usize, f64)>, Vec<u32>)> {
    (2usize..12).prop_flat_map(|n| {
        (
            Just(n),
            proptest::collection::vec((0..n, 0..n, 0.1f64..10.0), 0..30),
            proptest::collection::vec(0u32..4, n),
        )
    })
}

proptest! {
    #[test]
    fn modularity_matches_the_pairwise_definition((n, edges, labels) in small_graph()) {
        let g = graph_of(n, &edges);
        let c: BTreeMap<VertexId, u32> = g.vertices().zip(labels).collect();
        let (a, b) = (modularity(&g, &c), modularity_pairs(&g, &c));
        prop_assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        prop_assert!((-0.5 - 1e-9..=1.0).contains(&a));
    }

    /// Merging never lowers modularity (checked by the pairwise
    /// definition), only ever relabels whole clusters into linked ones, and
    /// stops where no merge of two clusters raises it.
    #[test]
    fn merges_raise_modularity_until_none_would(
        (n, edges, labels) in small_graph(),
    ) {
        let g = graph_of(n, &edges);
        let c: BTreeMap<VertexId, u32> = g.vertices().zip(labels).collect();
        let merged = merge_while_modularity_rises(&g, &c);
        let (before, after) = (modularity_pairs(&g, &c), modularity_pairs(&g, &merged));
        prop_assert!(after >= before - 1e-9, "{before} -> {after}");
        // Whole clusters move: vertices together before stay together.
        for (v, cv) in &c {
            for (u, cu) in &c {
                if cv == cu {
                    prop_assert_eq!(merged[v], merged[u]);
                }
            }
        }
        // No further merge of two clusters raises it.
        let labels: std::collections::BTreeSet<u32> = merged.values().copied().collect();
        for &a in &labels {
            for &b in labels.iter().filter(|&&b| b > a) {
                let joined: BTreeMap<VertexId, u32> = merged
                    .iter()
                    .map(|(v, &x)| (*v, if x == b { a } else { x }))
                    .collect();
                prop_assert!(modularity_pairs(&g, &joined) <= after + 1e-9);
            }
        }
    }

    /// FOS/B moves load around without creating any, per system; with the
    /// zero-sum drain FOS/T keeps the primary total too, with Listing 5.1's
    /// each of the ψ FOS/T iterations adds exactly the secondary total.
    #[test]
    fn didic_conserves_the_load_of_every_diffusion_system(
        (n, edges, _labels) in small_graph(),
        seed in any::<u64>(),
        drain in any_drain(),
    ) {
        let g = graph_of(n, &edges);
        let params = DidicParams { k: 3, psi: 4, rho: 3, drain, ..DidicParams::default() };
        let mut d = Didic::new(params);
        let mut rng = Rng::new(seed);
        d.step(&g, &mut rng);
        for _ in 0..3 {
            let before: Vec<(f64, f64)> = (0..3).map(|c| d.totals(c)).collect();
            d.step(&g, &mut rng);
            for c in 0..3 {
                let (w0, l0) = before[c as usize];
                let (w1, l1) = d.totals(c);
                let scale = 1.0 + w0.abs() + l0.abs();
                prop_assert!((l1 - l0).abs() < 1e-9 * scale, "system {c}: l {l0} -> {l1}");
                let want = match drain {
                    Drain::ZeroSum => w0,
                    Drain::Listing => w0 + f64::from(params.psi) * l0,
                };
                prop_assert!((w1 - want).abs() < 1e-9 * scale.max(want.abs()), "system {c}: w {w0} -> {w1}, want {want}");
            }
        }
    }

    /// The same seed gives the same clustering, step for step.
    #[test]
    fn didic_is_a_function_of_its_seed((n, edges, _labels) in small_graph(), seed in any::<u64>()) {
        let g = graph_of(n, &edges);
        let run = || {
            let mut d = Didic::new(DidicParams { k: 4, psi: 3, rho: 3, ..DidicParams::default() });
            let mut rng = Rng::new(seed);
            (0..5).map(|_| { d.step(&g, &mut rng); d.clustering() }).collect::<Vec<_>>()
        };
        prop_assert_eq!(run(), run());
    }
}

/// The vertices of `v`'s connected part in `g` (`v` included).
fn part_of(g: &Graph, v: VertexId) -> Vec<VertexId> {
    let mut seen = vec![v];
    let mut i = 0;
    while i < seen.len() {
        for (u, _) in g.neighbours(seen[i]) {
            if !seen.contains(&u) {
                seen.push(u);
            }
        }
        i += 1;
    }
    seen
}

/// Definitions 5.1 and 5.2 written edge by edge: each edge's flow is
/// computed once and applied to both ends; the zero-sum drain subtracts
/// the mean secondary load of each vertex's connected part.
fn reference_diffusion(
    g: &Graph,
    p: &DidicParams,
    cluster: &BTreeMap<VertexId, u32>,
    w: &mut BTreeMap<(VertexId, u32), f64>,
    l: &mut BTreeMap<(VertexId, u32), f64>,
) {
    let edges: Vec<(VertexId, VertexId, f64)> = g
        .edges()
        .map(|(u, v, weight)| (u, v, weight / g.degree(u).max(g.degree(v))))
        .collect();
    let benefit = |v: VertexId, c: u32| if cluster[&v] == c { p.benefit } else { 1.0 };
    for c in 0..p.k {
        for _ in 0..p.psi {
            for _ in 0..p.rho {
                let mut delta: BTreeMap<VertexId, f64> = BTreeMap::new();
                for &(u, v, a) in &edges {
                    let y = a * (l[&(u, c)] / benefit(u, c) - l[&(v, c)] / benefit(v, c));
                    *delta.entry(u).or_default() -= y;
                    *delta.entry(v).or_default() += y;
                }
                for (v, d) in delta {
                    *l.get_mut(&(v, c)).unwrap() += d;
                }
            }
            let mut delta: BTreeMap<VertexId, f64> = BTreeMap::new();
            for &(u, v, a) in &edges {
                let x = a * (w[&(u, c)] - w[&(v, c)]);
                *delta.entry(u).or_default() -= x;
                *delta.entry(v).or_default() += x;
            }
            let mean = |v: VertexId| match p.drain {
                Drain::Listing => 0.0,
                Drain::ZeroSum => {
                    let part = part_of(g, v);
                    part.iter().map(|u| l[&(*u, c)]).sum::<f64>() / part.len() as f64
                }
            };
            let means: BTreeMap<VertexId, f64> = g.vertices().map(|v| (v, mean(v))).collect();
            for v in g.vertices() {
                let d = delta.get(&v).copied().unwrap_or(0.0);
                *w.get_mut(&(v, c)).unwrap() += d + l[&(v, c)] - means[&v];
            }
        }
    }
}

/// §5.3's choice of cluster, from the loads after a time step's diffusion.
fn reference_choice(
    g: &Graph,
    p: &DidicParams,
    t: u32,
    before: &BTreeMap<VertexId, u32>,
    w: &[f64],
    v: VertexId,
) -> u32 {
    let own = before[&v];
    let candidates: Vec<u32> = if t > p.restrict_after {
        let mut c: Vec<u32> = g.neighbours(v).map(|(u, _)| before[&u]).collect();
        c.sort();
        c.dedup();
        c
    } else {
        (0..p.k).collect()
    };
    let Some(&best) = candidates
        .iter()
        .max_by(|a, b| w[**a as usize].total_cmp(&w[**b as usize]).then(b.cmp(a)))
    else {
        return own;
    };
    if !candidates.contains(&own) {
        return best;
    }
    let needed = w[own as usize] + w[own as usize].abs() * p.switch_margin * f64::from(t);
    if best != own && w[best as usize] >= needed {
        best
    } else {
        own
    }
}

proptest! {
    /// DiDiC's loads follow the definitions (checked against the edge-wise
    /// reference above), and every vertex's new cluster follows §5.3's rule
    /// (neighbour clusters only after 10 time steps, the growing margin).
    #[test]
    fn didic_follows_the_definitions_and_the_rule_for_choosing_clusters(
        (n, edges, _labels) in small_graph(),
        seed in any::<u64>(),
        benefit in 1.0f64..50.0,
        margin in 0.0f64..0.05,
        drain in any_drain(),
    ) {
        let g = graph_of(n, &edges);
        let p = DidicParams { k: 3, psi: 2, rho: 2, benefit, restrict_after: 2, switch_margin: margin, drain, ..DidicParams::default() };
        let mut d = Didic::new(p);
        let mut rng = Rng::new(seed);
        d.step(&g, &mut rng);
        let (mut w, mut l) = (BTreeMap::new(), BTreeMap::new());
        for v in g.vertices() {
            let (wv, lv) = d.loads(v).unwrap();
            for c in 0..p.k {
                w.insert((v, c), wv[c as usize]);
                l.insert((v, c), lv[c as usize]);
            }
        }
        for t in 2..=6 {
            let before = d.clustering();
            reference_diffusion(&g, &p, &before, &mut w, &mut l);
            d.step(&g, &mut rng);
            for v in g.vertices() {
                let (wv, lv) = d.loads(v).unwrap();
                for c in 0..p.k {
                    let (rw, rl) = (w[&(v, c)], l[&(v, c)]);
                    let tol = 1e-9 * (1.0 + rw.abs() + rl.abs());
                    prop_assert!((wv[c as usize] - rw).abs() <= tol, "t {t} v {v} c {c}: w {} vs {rw}", wv[c as usize]);
                    prop_assert!((lv[c as usize] - rl).abs() <= tol, "t {t} v {v} c {c}: l {} vs {rl}", lv[c as usize]);
                }
                let want = reference_choice(&g, &p, t, &before, wv, v);
                prop_assert_eq!(d.cluster_of(v), Some(want), "t {} v {}", t, v);
            }
        }
    }
}

#[test]
fn a_leaving_vertex_hands_its_loads_to_its_neighbours_in_equal_parts() {
    let g = graph_of(3, &[(0, 1, 1.0), (1, 2, 2.0)]);
    let ids: Vec<VertexId> = g.vertices().collect();
    let mut d = Didic::new(DidicParams {
        k: 2,
        psi: 2,
        rho: 2,
        ..DidicParams::default()
    });
    d.step(&g, &mut Rng::new(9));
    let loads = |d: &Didic, v| {
        let (w, l) = d.loads(v).unwrap();
        (w.to_vec(), l.to_vec())
    };
    let (a, b, c) = (loads(&d, ids[0]), loads(&d, ids[1]), loads(&d, ids[2]));
    let totals: Vec<(f64, f64)> = (0..2).map(|k| d.totals(k)).collect();
    d.remove_vertex(&g, ids[1]);
    let (a2, c2) = (loads(&d, ids[0]), loads(&d, ids[2]));
    for (k, &(w0, l0)) in totals.iter().enumerate() {
        assert!((a2.0[k] - (a.0[k] + b.0[k] / 2.0)).abs() < 1e-9);
        assert!((c2.1[k] - (c.1[k] + b.1[k] / 2.0)).abs() < 1e-9);
        let (w, l) = d.totals(k as u32);
        assert!((w - w0).abs() < 1e-9 * (1.0 + w.abs()));
        assert!((l - l0).abs() < 1e-9 * (1.0 + l.abs()));
    }
    assert!(d.loads(ids[1]).is_none());
}

#[test]
fn ncv_is_the_mean_share_of_each_cluster_s_largest_connected_part() {
    // A path 0-1-2-3 and a lone vertex 4.
    let g = graph_of(5, &[(0, 1, 1.0), (1, 2, 1.0), (2, 3, 1.0)]);
    let ids: Vec<VertexId> = g.vertices().collect();
    let all_one: BTreeMap<VertexId, u32> = ids.iter().map(|v| (*v, 0)).collect();
    assert!((ncv(&g, &all_one) - 0.8).abs() < 1e-12);
    // {0, 1} connected, {2, 3, 4}: 2-3 connected, 4 apart: (1 + 2/3) / 2.
    let split: BTreeMap<VertexId, u32> =
        ids.iter().map(|v| (*v, u32::from(*v >= ids[2]))).collect();
    assert!((ncv(&g, &split) - (1.0 + 2.0 / 3.0) / 2.0).abs() < 1e-12);
    assert_eq!(ncv(&g, &BTreeMap::new()), 0.0);
}

/// Two cliques of ten joined by one weak edge: DiDiC puts each clique in
/// a cluster of its own, whatever the random start.
#[test]
fn didic_separates_two_cliques_joined_by_a_weak_edge() {
    let mut edges = vec![];
    for a in 0..10 {
        for b in a + 1..10 {
            edges.push((a, b, 1.0));
            edges.push((a + 10, b + 10, 1.0));
        }
    }
    edges.push((0, 10, 0.01));
    let g = graph_of(20, &edges);
    for seed in 0..5 {
        let mut d = Didic::new(DidicParams {
            k: 6,
            ..DidicParams::default()
        });
        let mut rng = Rng::new(seed);
        for _ in 0..40 {
            d.step(&g, &mut rng);
        }
        let c = d.clustering();
        let ids: Vec<VertexId> = g.vertices().collect();
        assert!(
            ids[..10].iter().all(|v| c[v] == c[&ids[0]]),
            "seed {seed}: {c:?}"
        );
        assert!(
            ids[10..].iter().all(|v| c[v] == c[&ids[10]]),
            "seed {seed}: {c:?}"
        );
        assert_ne!(c[&ids[0]], c[&ids[10]], "seed {seed}");
        assert!(modularity(&g, &c) > 0.49);
        assert_eq!(ncv(&g, &c), 1.0);
    }
}

#[test]
fn generated_graphs_follow_the_disc_graph_rule() {
    for model in [
        GraphModel::Tiles { n: 300, x: 5 },
        GraphModel::Areas { n: 300, x: 6 },
    ] {
        let mut rng = Rng::new(7);
        let t = Topology::generate(model, 0.25, 8, &mut rng);
        let g = t.graph();
        assert_eq!(g.len(), 300, "{model:?}");
        for (u, v, w) in g.edges() {
            let d = t.position(u).unwrap().distance(t.position(v).unwrap());
            assert!(d <= 0.25 + 1e-12, "{model:?}: edge longer than rad");
            assert!(
                (w - 1.0 / d.max(1e-9)).abs() <= 1e-9 * w,
                "bandwidth = 1 / distance"
            );
        }
        // A vertex's 8 nearest within rad (ties by id): the ones it chose.
        let nearest = |v: VertexId| {
            let p = t.position(v).unwrap();
            let mut near: Vec<(f64, VertexId)> = g
                .vertices()
                .filter(|u| *u != v)
                .map(|u| (p.distance(t.position(u).unwrap()), u))
                .filter(|(d, _)| *d <= 0.25)
                .collect();
            near.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            near.into_iter().take(8).map(|(_, u)| u).collect::<Vec<_>>()
        };
        // Each vertex has an edge to each vertex it chose…
        for v in g.vertices() {
            assert!(
                nearest(v).iter().all(|u| g.weight(v, *u).is_some()),
                "{model:?}: {v} lacks an edge it chose"
            );
        }
        // …and every edge was chosen by one of its ends.
        for (u, v, _) in g.edges() {
            assert!(
                nearest(u).contains(&v) || nearest(v).contains(&u),
                "{model:?}: edge {u}-{v} chosen by neither end"
            );
        }
        if let GraphModel::Areas { n, x } = model {
            let homes = g.vertices().filter(|v| t.region(*v).is_none()).count();
            assert_eq!(homes, (2.0 * n as f64 / (x as f64 + 2.0)).round() as usize);
        }
    }
}

#[test]
fn dynamics_keep_the_size_and_hand_on_the_load_of_leavers() {
    let mut rng = Rng::new(3);
    let mut t = Topology::generate(GraphModel::Areas { n: 200, x: 4 }, 0.3, 8, &mut rng);
    let mut d = Didic::new(DidicParams {
        k: 5,
        psi: 3,
        rho: 3,
        ..DidicParams::default()
    });
    d.step(t.graph(), &mut rng);
    let dynamics = Dynamics {
        fraction: 0.05,
        every: 1,
    };
    for step in 1..=5 {
        let before: f64 = (0..5).map(|c| d.totals(c).1).sum();
        let (gone, joined) = dynamics.apply(step, &mut t, &mut d, &mut rng);
        assert_eq!((gone.len(), joined.len()), (10, 10));
        assert_eq!(t.graph().len(), 200);
        // Leavers with neighbours handed their secondary load on.
        let after: f64 = (0..5).map(|c| d.totals(c).1).sum();
        assert!(after <= before + 1e-6);
        d.step(t.graph(), &mut rng);
        assert_eq!(d.clustering().len(), 200);
        assert!(gone.iter().all(|v| d.cluster_of(*v).is_none()));
    }
}

/// The dissertation's 800-vertex example (§5.4, Figs. 5.4–5.8: n = 800,
/// k = 20, maxNeigh = 16, rad = 0.33, ψ = ρ = 11, B = 10, x = 10, 2 %
/// dynamics, here every second time step). There, DiDiC stabilised around
/// time step 60 at modularity 0.904 (MCL 0.908) with connected clusters.
/// On this generator's graph (seed 800) it reaches 0.79 with every
/// cluster connected, where `mcl -I 1.2` (the dissertation's inflation)
/// finds 0.76: a regression guard, not the MCL comparison itself.
#[test]
fn didic_on_the_dissertation_s_800_vertex_example() {
    let mut rng = Rng::new(800);
    let mut t = Topology::generate(GraphModel::Areas { n: 800, x: 10 }, 0.33, 16, &mut rng);
    let mut d = Didic::new(DidicParams::default());
    let dynamics = Dynamics {
        fraction: 0.02,
        every: 2,
    };
    let mut last = (0.0, 0.0, 0);
    for step in 1..=60 {
        d.step(t.graph(), &mut rng);
        let c = d.clustering();
        let clusters: std::collections::BTreeSet<u32> = c.values().copied().collect();
        last = (
            modularity(t.graph(), &c),
            ncv(t.graph(), &c),
            clusters.len(),
        );
        if step < 60 {
            dynamics.apply(step, &mut t, &mut d, &mut rng);
        }
    }
    let (m, n, k) = last;
    assert!(m > 0.75, "modularity {m} at step 60");
    assert!(n > 0.95, "NCV {n} at step 60");
    assert!((5..=20).contains(&k), "{k} clusters at step 60");
}

mod small_networks;
