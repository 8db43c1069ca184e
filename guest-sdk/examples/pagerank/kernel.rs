//! The PageRank kernel shared by the `pagerank` guest and its native
//! reference: graph generator, fixed-point rank arithmetic, the wire form of
//! the contribution blocks and the summary. It uses only `std`, not the
//! guest SDK, so the same source compiles for `wasm32-unknown-unknown`
//! (included by `examples/pagerank.rs`) and for the host (included with
//! `#[path]` by the end-to-end test and `benches/pagerank.rs`).
//!
//! # The graph
//!
//! A directed multigraph on the vertices `0..n` with exactly `m` edges.
//! Edge `e` (for `e` in `0..m`) comes from one output of SplitMix64, the
//! `e + 1`-th of the stream seeded with `seed`, so any process computes any
//! edge alone, in `O(1)`, whatever the number of processes:
//!
//! - its source is uniform: the high 32 bits of the output, `a`, mapped to
//!   `a · n / 2³²`;
//! - its target is skewed toward low vertex ids: the low 32 bits, `b`, give
//!   `b² / 2³²` (so the fraction of targets below `k` is about `√(k / n)`),
//!   mapped the same way.
//!
//! Duplicate edges and self-loops are kept (a vertex with two edges to the
//! same target gives it two shares). About `e^(−m/n)` of the vertices have
//! no out-edge (0.7 % at the default m = 5n): they are *dangling*.
//! A process keeps the out-lists of its own vertices only, as a compressed
//! sparse row (CSR) built in two passes over the `m` edges (count, fill);
//! generation costs `O(m)` hash evaluations per process, done once.
//!
//! # The iteration
//!
//! With damping `d = 0.85`, `n` vertices, out-degree `deg(u)` and `D` the
//! total rank of the dangling vertices (spread evenly over all vertices),
//!
//! ```text
//! r'(v) = (1 − d) / n + d · (D / n + Σ_{u → v} r(u) / deg(u))
//! ```
//!
//! from `r(v) = 1 / n`. Each iteration is *scatter* (every vertex pushes
//! `r(u) / deg(u)` along each out-edge into an accumulator of length `n`,
//! and the dangling vertices' ranks are summed), exchange (the accumulator
//! entries of other processes' vertices travel to their owners, see
//! [`encode_words`] and [`PageRank::absorb`]), and *update*.
//!
//! # Exactness: the same result for every number of processes
//!
//! Ranks are fixed-point integers, `r(v) · ONE` with [`ONE`] `= 10¹⁵`, held
//! in `u64`, and every step is integer arithmetic:
//!
//! ```text
//! share(u)  = r(u) / deg(u)                              (integer division)
//! in(v)     = Σ_{u → v} share(u)                         (integer sum)
//! D         = Σ_{u dangling} r(u)                        (integer sum)
//! base      = (15 · ONE + 85 · D) / (100 · n)            (in u128, integer division)
//! r'(v)     = base + 85 · in(v) / 100                    (integer division)
//! ```
//!
//! Each division's operands are values of one vertex (or the global `D`), so
//! they do not depend on how vertices are distributed. The only values
//! combined across vertices, `in(v)` and `D`, are sums of integers, and
//! integer addition is associative and commutative: however the terms are
//! grouped into partial sums (per process, per message) and in whatever order
//! they are added, the total is the same. (With `f64` the grouping would
//! change the rounding.) So every process count gives the same ranks, bit for
//! bit, as the native single-thread run — which is the same code with one
//! block.
//!
//! No sum can overflow: truncation only loses mass, so the ranks always add
//! up to at most `ONE` (by induction: `Σ r' ≤ 0.15 · ONE + 0.85 · (D +
//! Σ share) ≤ ONE`), hence every `in(v)` and `D` is at most `10¹⁵` and
//! `85 · in(v) < 2⁶³`. The truncations lose less than `2n` units
//! (`2n / 10¹⁵` of the mass) per iteration; the summary prints the sum, so
//! the loss is visible. The sums of values that arrive in messages are still
//! computed wrapping, so a corrupt message cannot make a process panic.

use std::ops::Range;

/// The fixed-point unit: a rank of 1.0.
pub const ONE: u64 = 1_000_000_000_000_000;
/// Decimal digits after the point when a rank is printed (`ONE = 10^15`).
const DIGITS: usize = 15;
/// The damping factor, in percent.
const DAMPING_PERCENT: u64 = 85;
/// At most this many vertices: each process keeps an 8-byte accumulator per
/// vertex of the whole graph (512 MiB at the limit).
pub const MAX_VERTICES: u64 = 1 << 26;
/// At most this many edges: 4 bytes each where they are kept, and the CSR
/// offsets are `u32`.
pub const MAX_EDGES: u64 = 1 << 28;
/// How many of the highest-ranked vertices the summary lists.
pub const TOP: usize = 5;

/// The job's parameters, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Vertices, in `1..=MAX_VERTICES`.
    pub n: u32,
    /// Edges, in `0..=MAX_EDGES`.
    pub m: u32,
    /// Iterations (supersteps that exchange contributions).
    pub iters: u32,
    /// Seed of the graph generator.
    pub seed: u64,
}

impl Params {
    /// Checks the arguments; the error says which one is wrong and why.
    pub fn new(n: u64, m: u64, iters: u32, seed: u64) -> Result<Params, String> {
        if n == 0 {
            return Err("n must be at least 1 (the graph needs a vertex)".to_string());
        }
        if n > MAX_VERTICES {
            return Err(format!(
                "n = {n} is too large: at most {MAX_VERTICES} vertices (every process keeps 8 bytes per vertex)"
            ));
        }
        if m > MAX_EDGES {
            return Err(format!("m = {m} is too large: at most {MAX_EDGES} edges"));
        }
        // Both fit: checked against limits below 2^32.
        Ok(Params {
            n: n as u32,
            m: m as u32,
            iters,
            seed,
        })
    }
}

/// The SplitMix64 output function (Steele, Lea and Flood 2014).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Maps a 32-bit value uniformly onto `0..n` (multiply and shift).
fn scale(x: u64, n: u32) -> u32 {
    // x < 2^32, so the result is below n.
    ((x * u64::from(n)) >> 32) as u32
}

/// Edge `e` of the graph: `(source, target)`.
pub fn edge(seed: u64, n: u32, e: u32) -> (u32, u32) {
    let x = mix(seed.wrapping_add((u64::from(e) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    let (a, b) = (x >> 32, x & 0xffff_ffff);
    (scale(a, n), scale((b * b) >> 32, n))
}

/// The out-lists of one block of vertices, as CSR.
pub struct Graph {
    /// The vertices whose out-lists these are.
    owned: Range<u32>,
    /// `targets[offsets[i]..offsets[i + 1]]` is the out-list of vertex
    /// `owned.start + i`, in edge order.
    offsets: Vec<u32>,
    targets: Vec<u32>,
}

impl Graph {
    /// Generates the out-lists of the vertices in `owned` (a sub-range of
    /// `0..n`).
    pub fn generate(p: &Params, owned: Range<u32>) -> Graph {
        assert!(
            owned.start <= owned.end && owned.end <= p.n,
            "the block {owned:?} is not part of 0..{}",
            p.n
        );
        let len = (owned.end - owned.start) as usize;
        let mut offsets = vec![0u32; len + 1];
        for e in 0..p.m {
            let (src, _) = edge(p.seed, p.n, e);
            if owned.contains(&src) {
                offsets[(src - owned.start) as usize + 1] += 1;
            }
        }
        for i in 0..len {
            offsets[i + 1] += offsets[i];
        }
        let mut next = offsets[..len].to_vec();
        let mut targets = vec![0u32; offsets[len] as usize];
        for e in 0..p.m {
            let (src, dst) = edge(p.seed, p.n, e);
            if owned.contains(&src) {
                let slot = &mut next[(src - owned.start) as usize];
                targets[*slot as usize] = dst;
                *slot += 1;
            }
        }
        Graph {
            owned,
            offsets,
            targets,
        }
    }

    /// The vertices whose out-lists this holds.
    pub fn owned(&self) -> Range<u32> {
        self.owned.clone()
    }

    /// The out-list of vertex `owned().start + i`.
    fn out(&self, i: usize) -> &[u32] {
        &self.targets[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
}

/// The ranks of one block of vertices and the accumulator of the current
/// iteration. Allocated once; no iteration allocates.
pub struct PageRank {
    n: u32,
    owned: Range<u32>,
    /// `ranks[i]` is the rank of vertex `owned.start + i`, times [`ONE`].
    ranks: Vec<u64>,
    /// One entry per vertex of the graph: the shares pushed to it in this
    /// iteration (from this block, plus, for the owned vertices, what other
    /// blocks sent).
    acc: Vec<u64>,
    /// Σ |r' − r| over the owned vertices in the last update.
    delta: u64,
}

impl PageRank {
    /// Every vertex starts at `1 / n`.
    pub fn new(p: &Params, g: &Graph) -> PageRank {
        let owned = g.owned();
        PageRank {
            n: p.n,
            ranks: vec![ONE / u64::from(p.n); (owned.end - owned.start) as usize],
            acc: vec![0; p.n as usize],
            owned,
            delta: 0,
        }
    }

    /// Pushes every owned vertex's share along its out-edges into the
    /// accumulator and returns the owned dangling vertices' total rank. The
    /// owned entries are cleared first; the others must be zero already
    /// (they are at the start, and [`clear_outgoing`](Self::clear_outgoing)
    /// zeroes them once they are sent).
    pub fn scatter(&mut self, g: &Graph) -> u64 {
        self.acc[self.owned.start as usize..self.owned.end as usize].fill(0);
        let mut dangling = 0u64;
        for (i, &r) in self.ranks.iter().enumerate() {
            let out = g.out(i);
            if out.is_empty() {
                dangling += r;
                continue;
            }
            let share = r / out.len() as u64;
            for &t in out {
                self.acc[t as usize] += share;
            }
        }
        dangling
    }

    /// The accumulator entries of `block`'s vertices: what this process
    /// sends to their owner after [`scatter`](Self::scatter).
    pub fn outgoing(&self, block: Range<u32>) -> &[u64] {
        &self.acc[block.start as usize..block.end as usize]
    }

    /// Zeroes the accumulator entries of other processes' vertices, once
    /// they are sent. They are dead until the next
    /// [`scatter`](Self::scatter), which needs them zero; clearing them
    /// before the sync rather than after it leaves their pages as they were
    /// at the last checkpoint, so checkpoints do not carry them.
    pub fn clear_outgoing(&mut self) {
        let owned = self.owned.start as usize..self.owned.end as usize;
        self.acc[..owned.start].fill(0);
        self.acc[owned.end..].fill(0);
    }

    /// Adds the little-endian `u64` words of `bytes` to the accumulator
    /// entries of the owned vertices, from owned vertex `first` on.
    pub fn absorb(&mut self, first: usize, bytes: &[u8]) -> Result<(), String> {
        let owned = self.owned.start as usize..self.owned.end as usize;
        let words = bytes.len() / 8;
        if !bytes.len().is_multiple_of(8) || first + words > owned.len() {
            return Err(format!(
                "a block of {} bytes from owned vertex {first} does not fit the {} owned vertices",
                bytes.len(),
                owned.len()
            ));
        }
        let acc = &mut self.acc[owned.start + first..owned.start + first + words];
        for (a, w) in acc.iter_mut().zip(bytes.chunks_exact(8)) {
            *a = a.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        Ok(())
    }

    /// Replaces the owned ranks by the next iteration's, given the total rank
    /// of all dangling vertices (this process's and everyone else's).
    pub fn update(&mut self, dangling: u64) {
        let base = (15 * u128::from(ONE) + u128::from(DAMPING_PERCENT) * u128::from(dangling))
            / (100 * u128::from(self.n));
        // At most ONE (see the module comment), so it fits.
        let base = base as u64;
        let incoming = &self.acc[self.owned.start as usize..self.owned.end as usize];
        let mut delta = 0u64;
        for (r, &sum) in self.ranks.iter_mut().zip(incoming) {
            let next = base.wrapping_add(sum.wrapping_mul(DAMPING_PERCENT) / 100);
            delta = delta.wrapping_add(next.abs_diff(*r));
            *r = next;
        }
        self.delta = delta;
    }

    /// This block's part of the summary.
    pub fn summary(&self, g: &Graph) -> Summary {
        let mut s = Summary {
            dangling: (0..self.ranks.len())
                .filter(|&i| g.out(i).is_empty())
                .count() as u64,
            delta: self.delta,
            ..Summary::default()
        };
        for (v, &r) in self.owned.clone().zip(&self.ranks) {
            s.sum = s.sum.wrapping_add(r);
            s.checksum = s
                .checksum
                .wrapping_add(mix(mix(u64::from(v) ^ 0x5052_414e_4b21) ^ r));
            s.offer(v, r);
        }
        s
    }
}

/// Appends the little-endian bytes of `words` to `out`.
pub fn encode_words(out: &mut Vec<u8>, words: &[u64]) {
    let start = out.len();
    out.resize(start + 8 * words.len(), 0);
    for (b, w) in out[start..].chunks_exact_mut(8).zip(words) {
        b.copy_from_slice(&w.to_le_bytes());
    }
}

/// A summary of some vertices' ranks; the summaries of disjoint blocks
/// [`merge`](Summary::merge) into that of their union, in any order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Dangling vertices.
    pub dangling: u64,
    /// Sum of the ranks.
    pub sum: u64,
    /// Σ |r' − r| of the last iteration.
    pub delta: u64,
    /// Wrapping sum of a hash of each (vertex, rank).
    pub checksum: u64,
    /// The highest ranks, as (vertex, rank), highest first, ties by lower
    /// vertex; at most [`TOP`].
    pub top: Vec<(u32, u64)>,
}

impl Summary {
    /// Adds a vertex to the top list if it belongs there.
    fn offer(&mut self, v: u32, r: u64) {
        let key = |&(v, r): &(u32, u64)| (std::cmp::Reverse(r), v);
        if self.top.len() == TOP && key(&(v, r)) >= key(&self.top[TOP - 1]) {
            return;
        }
        let at = self.top.partition_point(|e| key(e) < key(&(v, r)));
        self.top.insert(at, (v, r));
        self.top.truncate(TOP);
    }

    /// Adds the summary of a disjoint block of vertices.
    pub fn merge(&mut self, other: &Summary) {
        self.dangling = self.dangling.wrapping_add(other.dangling);
        self.sum = self.sum.wrapping_add(other.sum);
        self.delta = self.delta.wrapping_add(other.delta);
        self.checksum = self.checksum.wrapping_add(other.checksum);
        for &(v, r) in &other.top {
            self.offer(v, r);
        }
    }

    /// Four little-endian `u64`s, then a (vertex `u64`, rank `u64`) pair per
    /// top entry.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut words = vec![self.dangling, self.sum, self.delta, self.checksum];
        for &(v, r) in &self.top {
            words.extend([u64::from(v), r]);
        }
        let mut out = Vec::new();
        encode_words(&mut out, &words);
        out
    }

    /// Reads what [`to_bytes`](Self::to_bytes) wrote.
    pub fn from_bytes(bytes: &[u8]) -> Result<Summary, String> {
        let bad = || format!("a summary of {} bytes is malformed", bytes.len());
        if !bytes.len().is_multiple_of(16) || bytes.len() < 32 || bytes.len() > 32 + 16 * TOP {
            return Err(bad());
        }
        let w: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        let mut top = Vec::new();
        for pair in w[4..].chunks_exact(2) {
            top.push((u32::try_from(pair[0]).map_err(|_| bad())?, pair[1]));
        }
        Ok(Summary {
            dangling: w[0],
            sum: w[1],
            delta: w[2],
            checksum: w[3],
            top,
        })
    }

    /// The output: the same lines for every process count.
    pub fn lines(&self, p: &Params) -> Vec<String> {
        let mut lines = vec![
            format!(
                "pagerank of {} vertices ({} dangling), {} edges, seed {}, damping 0.85, {} iterations",
                p.n, self.dangling, p.m, p.seed, p.iters
            ),
            format!("sum of ranks {}", fixed(self.sum)),
            format!("change in the last iteration (L1) {}", fixed(self.delta)),
        ];
        for (i, &(v, r)) in self.top.iter().enumerate() {
            lines.push(format!("top {}: vertex {v} rank {}", i + 1, fixed(r)));
        }
        lines.push(format!("checksum {:016x}", self.checksum));
        lines
    }
}

/// A fixed-point rank as a decimal with all its digits.
pub fn fixed(x: u64) -> String {
    format!("{}.{:0DIGITS$}", x / ONE, x % ONE)
}

/// The native reference: the same computation on one thread, with one block
/// holding every vertex (the semantics of one process, without messages).
pub fn reference(p: &Params) -> Vec<String> {
    let g = Graph::generate(p, 0..p.n);
    let mut pr = PageRank::new(p, &g);
    for _ in 0..p.iters {
        let dangling = pr.scatter(&g);
        pr.update(dangling);
    }
    pr.summary(&g).lines(p)
}
