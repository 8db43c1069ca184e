//! The graph generators of §5.4: vertices on the unit torus, edges to up to
//! `maxNeigh` nearest vertices within radius `rad`, weighted by inverse
//! distance (bandwidth); and the dynamics that delete and insert vertices.

use std::collections::{BTreeMap, BTreeSet};

use crate::didic::Didic;
use crate::graph::{Graph, VertexId};
use crate::rng::Rng;

/// A position on the unit torus `[0, 1)²` (wrap-around boundaries).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub x: f64,
    pub y: f64,
}

impl Point {
    fn wrapped(x: f64, y: f64) -> Point {
        Point {
            x: x.rem_euclid(1.0),
            y: y.rem_euclid(1.0),
        }
    }

    /// Distance on the torus.
    pub fn distance(self, o: Point) -> f64 {
        let dx = (self.x - o.x).abs();
        let dy = (self.y - o.y).abs();
        let (dx, dy) = (dx.min(1.0 - dx), dy.min(1.0 - dy));
        (dx * dx + dy * dy).sqrt()
    }
}

/// Which §5.4 graph class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GraphModel {
    /// The proof of concept: the torus cut into `τ × τ` tiles (`τ²` the
    /// smallest square ≥ `x`), `x` of them chosen at random and filled
    /// with `n` vertices in all (each tile's share random within ±50 % of
    /// `n / x`), uniformly in a disc of 95 % of the tile's side.
    Tiles { n: usize, x: usize },
    /// The PUB-Web-like class: `x` circular dense areas (centres uniform,
    /// radii in [0.01, 0.36] with density ∝ r⁻², small ones likelier),
    /// `2n / (x + 2)` home computers anywhere, and the other vertices
    /// spread over the areas in proportion to `r^1.5`.
    Areas { n: usize, x: usize },
}

/// Where a vertex comes from: a dense region or a home computer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Origin {
    Region(usize),
    Home,
}

/// A generated network: the graph, each vertex's position, and what the
/// model needs to insert more vertices like the first ones.
#[derive(Debug, Clone)]
pub struct Topology {
    graph: Graph,
    position: BTreeMap<VertexId, Point>,
    origin: BTreeMap<VertexId, Origin>,
    /// Dense regions: centre, radius, and the weight of a new vertex
    /// landing there.
    regions: Vec<(Point, f64, f64)>,
    /// Probability that a new vertex is a home computer.
    home: f64,
    rad: f64,
    max_neigh: usize,
}

/// Split `total` into parts proportional to `weights` (largest remainder).
fn apportion(total: usize, weights: &[f64]) -> Vec<usize> {
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| w / sum * total as f64).collect();
    let mut parts: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let (fa, fb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    let short = total - parts.iter().sum::<usize>();
    for &i in order.iter().take(short) {
        parts[i] += 1;
    }
    parts
}

fn in_disc(rng: &mut Rng, centre: Point, radius: f64) -> Point {
    let r = radius * rng.unit().sqrt();
    let a = 2.0 * std::f64::consts::PI * rng.unit();
    Point::wrapped(centre.x + r * a.cos(), centre.y + r * a.sin())
}

impl Topology {
    /// Generate a graph of `model` with communication radius `rad` and at
    /// most `max_neigh` nearest neighbours chosen by each vertex.
    pub fn generate(model: GraphModel, rad: f64, max_neigh: usize, rng: &mut Rng) -> Topology {
        let mut t = Topology {
            graph: Graph::new(),
            position: BTreeMap::new(),
            origin: BTreeMap::new(),
            regions: vec![],
            home: 0.0,
            rad,
            max_neigh,
        };
        match model {
            GraphModel::Tiles { n, x } => {
                let x = x.max(1);
                let tau = (1..).find(|t| t * t >= x).expect("a square exists");
                let side = 1.0 / tau as f64;
                let mut tiles: Vec<usize> = (0..tau * tau).collect();
                for i in 0..x {
                    let j = i + rng.below((tiles.len() - i) as u64) as usize;
                    tiles.swap(i, j);
                }
                let weights: Vec<f64> = (0..x).map(|_| 0.5 + rng.unit()).collect();
                let counts = apportion(n, &weights);
                for (i, &tile) in tiles[..x].iter().enumerate() {
                    let centre = Point {
                        x: ((tile % tau) as f64 + 0.5) * side,
                        y: ((tile / tau) as f64 + 0.5) * side,
                    };
                    t.regions.push((centre, 0.95 * side / 2.0, weights[i]));
                    for _ in 0..counts[i] {
                        let p = in_disc(rng, centre, 0.95 * side / 2.0);
                        t.place(p, Origin::Region(i));
                    }
                }
            }
            GraphModel::Areas { n, x } => {
                let (a, b) = (0.01f64, 0.36f64);
                for _ in 0..x {
                    let centre = Point {
                        x: rng.unit(),
                        y: rng.unit(),
                    };
                    let u = rng.unit();
                    let r = 1.0 / (1.0 / a - u * (1.0 / a - 1.0 / b));
                    t.regions.push((centre, r, r.powf(1.5)));
                }
                t.home = 2.0 / (x as f64 + 2.0);
                let homes = (t.home * n as f64).round() as usize;
                for _ in 0..homes.min(n) {
                    let p = Point {
                        x: rng.unit(),
                        y: rng.unit(),
                    };
                    t.place(p, Origin::Home);
                }
                let weights: Vec<f64> = t.regions.iter().map(|r| r.2).collect();
                let counts = if weights.is_empty() {
                    vec![]
                } else {
                    apportion(n - homes.min(n), &weights)
                };
                for (i, count) in counts.into_iter().enumerate() {
                    let (centre, r, _) = t.regions[i];
                    for _ in 0..count {
                        let p = in_disc(rng, centre, r);
                        t.place(p, Origin::Region(i));
                    }
                }
            }
        }
        t.rebuild_edges();
        t
    }

    fn place(&mut self, p: Point, origin: Origin) -> VertexId {
        let v = self.graph.add_vertex();
        self.position.insert(v, p);
        self.origin.insert(v, origin);
        v
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn position(&self, v: VertexId) -> Option<Point> {
        self.position.get(&v).copied()
    }

    /// The dense region a vertex was placed in (`None`: a home computer).
    pub fn region(&self, v: VertexId) -> Option<usize> {
        match self.origin.get(&v)? {
            Origin::Region(i) => Some(*i),
            Origin::Home => None,
        }
    }

    /// The edges the model wants: each vertex to its `max_neigh` nearest
    /// within `rad` (ties by id), both directions united.
    fn wanted_edges(&self) -> BTreeMap<(VertexId, VertexId), f64> {
        let pts: Vec<(VertexId, Point)> = self.position.iter().map(|(v, p)| (*v, *p)).collect();
        let mut want = BTreeMap::new();
        for &(v, p) in &pts {
            let mut near: Vec<(f64, VertexId)> = pts
                .iter()
                .filter(|(u, _)| *u != v)
                .map(|&(u, q)| (p.distance(q), u))
                .filter(|(d, _)| *d <= self.rad)
                .collect();
            near.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for &(d, u) in near.iter().take(self.max_neigh) {
                want.insert((v.min(u), v.max(u)), 1.0 / d.max(1e-9));
            }
        }
        want
    }

    /// Make the graph's edges the wanted ones (after vertices came or went).
    fn rebuild_edges(&mut self) {
        let want = self.wanted_edges();
        let have: Vec<(VertexId, VertexId)> = self.graph.edges().map(|(u, v, _)| (u, v)).collect();
        for (u, v) in have {
            if !want.contains_key(&(u, v)) {
                self.graph.remove_edge(u, v);
            }
        }
        for ((u, v), w) in want {
            self.graph.set_edge(u, v, w);
        }
    }

    /// A new vertex drawn from the model (a home computer with the model's
    /// probability, else in a region chosen by the regions' weights).
    fn draw(&self, rng: &mut Rng) -> (Point, Origin) {
        if self.regions.is_empty() || rng.unit() < self.home {
            return (
                Point {
                    x: rng.unit(),
                    y: rng.unit(),
                },
                Origin::Home,
            );
        }
        let total: f64 = self.regions.iter().map(|r| r.2).sum();
        let mut pick = rng.unit() * total;
        let mut i = 0;
        while i + 1 < self.regions.len() && pick >= self.regions[i].2 {
            pick -= self.regions[i].2;
            i += 1;
        }
        let (centre, r, _) = self.regions[i];
        (in_disc(rng, centre, r), Origin::Region(i))
    }
}

/// The §5.4 dynamics: every `every` time steps, `fraction` of the vertices
/// leave (their DiDiC load goes to their neighbours) and as many new ones,
/// drawn from the model, join.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dynamics {
    pub fraction: f64,
    pub every: u32,
}

impl Dynamics {
    /// Apply the dynamics after time step `t`; returns the vertices that
    /// left and those that joined.
    pub fn apply(
        &self,
        t: u32,
        topology: &mut Topology,
        didic: &mut Didic,
        rng: &mut Rng,
    ) -> (Vec<VertexId>, Vec<VertexId>) {
        if self.every == 0 || !t.is_multiple_of(self.every) || self.fraction <= 0.0 {
            return (vec![], vec![]);
        }
        let n = topology.graph.len();
        if n == 0 {
            return (vec![], vec![]);
        }
        let m = ((self.fraction * n as f64).round() as usize).clamp(1, n);
        let mut ids: Vec<VertexId> = topology.graph.vertices().collect();
        let mut gone = BTreeSet::new();
        for i in 0..m {
            let j = i + rng.below((ids.len() - i) as u64) as usize;
            ids.swap(i, j);
            gone.insert(ids[i]);
        }
        for &v in &gone {
            didic.remove_vertex(&topology.graph, v);
            topology.graph.remove_vertex(v);
            topology.position.remove(&v);
            topology.origin.remove(&v);
        }
        let mut joined = Vec::with_capacity(m);
        for _ in 0..m {
            let (p, origin) = topology.draw(rng);
            joined.push(topology.place(p, origin));
        }
        topology.rebuild_edges();
        (gone.into_iter().collect(), joined)
    }
}
