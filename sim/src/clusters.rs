//! Flat against two-level placement on a clustered network (issue 15;
//! dissertation ch. 6, Fig. 6.1): BSP jobs that compute *and* exchange
//! h-relations, on peers grouped in clusters with fast links inside and
//! slow gateways between.
//!
//! # Model
//!
//! - **Network.** Each peer has cores and a CPU factor (Table 4.2: GHz ×
//!   cores, so one core runs at `factor / cores`), and a full-duplex access
//!   link to its cluster's switch; each cluster switch has a full-duplex
//!   gateway to a non-blocking core. A message from peer `P` to peer `Q`
//!   uses `P`'s uplink and `Q`'s downlink, plus both clusters' gateways
//!   when they differ; processes on the same peer exchange for free.
//! - **Jobs.** `p` processes, `S` supersteps; in each, every process
//!   computes `work` seconds (at one 1 GHz core), then sends `h` bytes: to
//!   all others (`h/(p−1)` each, all-to-all) or to its two ring neighbours
//!   (`h/2` each, a halo exchange), then the barrier costs one latency (the
//!   LAN's, or the WAN's if the job spans clusters).
//! - **Sharing.** A peer's cores are shared equally by the processes on it
//!   whose job is in its compute phase (a process runs at
//!   `core speed × min(1, cores / processes computing there)`); a job's
//!   compute phase ends with its slowest process. A link's bandwidth is
//!   shared equally by the jobs communicating over it, and a job's
//!   exchange progresses at the pace of its most loaded link — so a
//!   superstep takes max compute + communication over its slowest link +
//!   latency. The simulation is event-driven and exact for this fluid
//!   model: rates change only when a phase ends or a job starts or ends.
//! - **Ready queue** as in §4.4: the head job is admitted whole while the
//!   running processes are fewer than `cores × overload`.
//! - **Placement.** *Flat*: one [`Dhht`] over all peers, process positions
//!   `golden_position(k)` from one process [`IndexAllocator`] (what the
//!   supernode does). *Two-level*: [`TwoLevel`] over the same peers with
//!   their clusters, the same process positions, and a job position from a
//!   job `IndexAllocator`. Placements never change while a job runs (no
//!   churn here: the comparison is about where jobs go).
//! - **Stretch** of a job: (finish − admission) ÷ its time alone on the
//!   fastest setting — every process on its own core of the fastest core
//!   speed in the network, sending over the fastest access link, with LAN
//!   latency: `S × (work / s_max + h / B_access_max + l_LAN)`. Time in the
//!   ready queue is reported apart (pending).
//!
//! **Architecture Invariant:** pure, like the rest of the crate: the seed
//! and the parameters determine every report byte.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::str::FromStr;

use placement::{ClusterPeer, Dhht, IndexAllocator, Peer, TwoLevel, golden_position};

use crate::error::SimError;
use crate::hardware::TABLE_4_2;
use crate::report::ReportFile;
use crate::rng::SimRng;
use crate::svg::bar_chart;

/// Stream tags of this experiment (independent of the ch. 4 streams).
const TAG_PEERS: u64 = 0x636C_7573_0000_0001;
const TAG_JOBS: u64 = 0x636C_7573_0000_0002;

const MBIT: f64 = 1e6 / 8.0;

/// The networks compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TopologyKind {
    /// The testbed's `clusters.topo`: 3 clusters of 4 hosts (2 cores,
    /// factor 4) on 100 Mbit/s access links, joined by 20 Mbit/s gateways.
    Testbed,
    /// 8 clusters of 32, 24, 16, 16, 8, 8, 4 and 4 peers drawn from Table
    /// 4.2, access links of 1 Gbit/s or 100 Mbit/s, gateways of 10 to
    /// 100 Mbit/s, 20 ms across clusters.
    Hetero,
}

impl TopologyKind {
    /// Every topology.
    pub const ALL: [TopologyKind; 2] = [TopologyKind::Testbed, TopologyKind::Hetero];

    /// The command-line name.
    pub fn slug(self) -> &'static str {
        match self {
            TopologyKind::Testbed => "testbed",
            TopologyKind::Hetero => "hetero",
        }
    }
}

impl fmt::Display for TopologyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.slug())
    }
}

impl FromStr for TopologyKind {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        TopologyKind::ALL
            .into_iter()
            .find(|t| t.slug().eq_ignore_ascii_case(s))
            .ok_or_else(|| SimError::UnknownName {
                what: "topology",
                given: s.to_string(),
                valid: "testbed, hetero".to_string(),
            })
    }
}

/// One simulated peer.
#[derive(Clone, Debug, PartialEq)]
pub struct NetPeer {
    /// Its cluster (index into [`Topology::clusters`]).
    pub cluster: usize,
    /// CPU factor (GHz × cores): its DHHT weight.
    pub factor: f64,
    /// Cores.
    pub cores: u32,
}

/// One cluster: its links.
#[derive(Clone, Debug, PartialEq)]
pub struct NetCluster {
    /// Name (the peers' `--cluster`).
    pub name: String,
    /// Each peer's access link, bytes/s each way.
    pub access: f64,
    /// The gateway to the core, bytes/s each way.
    pub gateway: f64,
}

/// A clustered network.
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    /// Which one.
    pub kind: TopologyKind,
    /// The clusters.
    pub clusters: Vec<NetCluster>,
    /// The peers, cluster by cluster.
    pub peers: Vec<NetPeer>,
    /// Barrier latency inside a cluster, s.
    pub lan_latency: f64,
    /// Barrier latency across clusters, s.
    pub wan_latency: f64,
}

impl Topology {
    /// Builds topology `kind`; the heterogeneous one draws its CPUs from
    /// `seed`.
    pub fn new(kind: TopologyKind, seed: u64) -> Topology {
        match kind {
            TopologyKind::Testbed => {
                let clusters = ["a", "b", "c"]
                    .map(|n| NetCluster {
                        name: n.into(),
                        access: 100.0 * MBIT,
                        gateway: 20.0 * MBIT,
                    })
                    .to_vec();
                let peers = (0..12)
                    .map(|i| NetPeer {
                        cluster: i / 4,
                        factor: 4.0,
                        cores: 2,
                    })
                    .collect();
                Topology {
                    kind,
                    clusters,
                    peers,
                    lan_latency: 0.000_5,
                    wan_latency: 0.005,
                }
            }
            TopologyKind::Hetero => {
                let sizes = [32, 24, 16, 16, 8, 8, 4, 4];
                let access = [1000.0, 100.0, 1000.0, 100.0, 1000.0, 100.0, 1000.0, 100.0];
                let gateway = [100.0, 50.0, 20.0, 50.0, 10.0, 20.0, 100.0, 10.0];
                let mut rng = SimRng::stream(seed, TAG_PEERS);
                let weights: Vec<f64> = TABLE_4_2.iter().map(|r| f64::from(r.count)).collect();
                let mut peers = Vec::new();
                let mut clusters = Vec::new();
                for (c, &n) in sizes.iter().enumerate() {
                    clusters.push(NetCluster {
                        name: format!("site{c}"),
                        access: access[c] * MBIT,
                        gateway: gateway[c] * MBIT,
                    });
                    for _ in 0..n {
                        let row = TABLE_4_2[rng.weighted_index(&weights)];
                        peers.push(NetPeer {
                            cluster: c,
                            factor: row.factor,
                            cores: row.cores,
                        });
                    }
                }
                Topology {
                    kind,
                    clusters,
                    peers,
                    lan_latency: 0.000_2,
                    wan_latency: 0.02,
                }
            }
        }
    }

    /// Σ cores.
    pub fn cores(&self) -> u64 {
        self.peers.iter().map(|p| u64::from(p.cores)).sum()
    }

    /// The fastest core speed.
    pub fn max_core_speed(&self) -> f64 {
        self.peers
            .iter()
            .map(|p| p.factor / f64::from(p.cores))
            .fold(0.0, f64::max)
    }

    /// The mean core speed, weighted by cores.
    pub fn mean_core_speed(&self) -> f64 {
        self.peers.iter().map(|p| p.factor).sum::<f64>() / self.cores().max(1) as f64
    }

    /// The fastest access link.
    pub fn max_access(&self) -> f64 {
        self.clusters.iter().map(|c| c.access).fold(0.0, f64::max)
    }

    /// The largest cluster's cores.
    pub fn max_cluster_cores(&self) -> u64 {
        (0..self.clusters.len())
            .map(|c| {
                self.peers
                    .iter()
                    .filter(|p| p.cluster == c)
                    .map(|p| u64::from(p.cores))
                    .sum()
            })
            .max()
            .unwrap_or(0)
    }
}

/// How a job's processes exchange data each superstep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// Every process sends `h/(p−1)` bytes to every other.
    AllToAll,
    /// Every process sends `h/2` bytes to each ring neighbour.
    Ring,
}

/// One BSP job of the mix.
#[derive(Clone, Debug, PartialEq)]
pub struct CommJob {
    /// Id, in release order from 0.
    pub id: usize,
    /// Release time, s.
    pub release: f64,
    /// Processes.
    pub procs: u32,
    /// Supersteps.
    pub supersteps: u32,
    /// Compute per process and superstep, s at one 1 GHz core.
    pub work: f64,
    /// Bytes each process sends per superstep.
    pub bytes: f64,
    /// Exchange pattern.
    pub pattern: Pattern,
}

impl CommJob {
    /// Its time alone on the fastest setting (the stretch denominator).
    pub fn ideal(&self, topo: &Topology) -> f64 {
        let comm = if self.procs > 1 {
            self.bytes / topo.max_access() + topo.lan_latency
        } else {
            0.0
        };
        f64::from(self.supersteps) * (self.work / topo.max_core_speed() + comm)
    }
}

fn log_uniform(rng: &mut SimRng, lo: f64, hi: f64) -> f64 {
    (lo.ln() + rng.next_f64() * (hi.ln() - lo.ln())).exp()
}

/// The job mix for `topo`: `jobs` jobs with parallelism 1 … 64 (up to 16
/// on the testbed), 10–50 supersteps, 0.5–10 s of work and 10 kB – 10 MB
/// per process and superstep (log-uniform), half all-to-all, half ring;
/// releases uniform over the window that makes the offered compute `load`
/// × the network's cores. Reproducible from `seed`.
pub fn job_mix(topo: &Topology, jobs: usize, load: f64, seed: u64) -> Vec<CommJob> {
    let mut rng = SimRng::stream(seed, TAG_JOBS ^ topo.kind as u64);
    let sizes: &[u32] = match topo.kind {
        TopologyKind::Testbed => &[1, 2, 4, 8, 16],
        TopologyKind::Hetero => &[1, 2, 4, 8, 16, 32, 64],
    };
    let mut mix: Vec<CommJob> = (0..jobs)
        .map(|_| {
            let procs = sizes[rng.below(sizes.len() as u64) as usize];
            let supersteps = 10 + rng.below(41) as u32;
            let work = log_uniform(&mut rng, 0.5, 10.0);
            let bytes = log_uniform(&mut rng, 1e4, 1e7);
            let pattern = if rng.below(2) == 0 {
                Pattern::AllToAll
            } else {
                Pattern::Ring
            };
            CommJob {
                id: 0,
                release: 0.0,
                procs,
                supersteps,
                work,
                bytes,
                pattern,
            }
        })
        .collect();
    let demand: f64 = mix
        .iter()
        .map(|j| f64::from(j.procs) * f64::from(j.supersteps) * j.work / topo.mean_core_speed())
        .sum();
    let window = demand / (load * topo.cores() as f64);
    for j in &mut mix {
        j.release = rng.next_f64() * window;
    }
    mix.sort_by(|a, b| a.release.total_cmp(&b.release));
    for (i, j) in mix.iter_mut().enumerate() {
        j.id = i;
    }
    mix
}

/// The placements compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placer {
    /// One DHHT over all peers (today's supernode).
    Flat,
    /// [`TwoLevel`]: a DHHT over clusters, then one per cluster.
    TwoLevel,
}

impl Placer {
    /// Both.
    pub const ALL: [Placer; 2] = [Placer::Flat, Placer::TwoLevel];

    /// Its label in reports.
    pub fn label(self) -> &'static str {
        match self {
            Placer::Flat => "flat DHHT",
            Placer::TwoLevel => "two-level",
        }
    }
}

/// What became of one job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRun {
    /// The job's id.
    pub id: usize,
    /// Processes.
    pub procs: u32,
    /// Whether it fits the largest cluster's cores.
    pub fits: bool,
    /// Clusters its processes ran in.
    pub clusters: usize,
    /// Admission − release, s.
    pub pending: f64,
    /// (finish − admission) ÷ ideal.
    pub stretch: f64,
    /// Bytes per superstep that cross a gateway.
    pub gateway_bytes: f64,
    /// Bytes per superstep between different peers.
    pub peer_bytes: f64,
}

/// A link: uplink/downlink of a peer, or of a cluster's gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Link {
    Up(usize),
    Down(usize),
    GwUp(usize),
    GwDown(usize),
}

struct Running {
    job: usize,
    /// (peer, processes there).
    peers: Vec<(usize, u32)>,
    /// (link, bytes per superstep).
    links: Vec<(Link, f64)>,
    latency: f64,
    phase: Phase,
    /// What is left of the phase: a fraction (compute, comm) or seconds
    /// (sync).
    left: f64,
    step: u32,
    admitted: f64,
    indices: Vec<u64>,
    job_index: Option<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Compute,
    Comm,
    Sync,
}

/// Simulates `jobs` on `topo` under `placer` with the ready queue at
/// `overload` × cores. Returns one [`JobRun`] per job, by id.
///
/// # Errors
///
/// [`SimError::InvalidParameter`] for a non-positive overload,
/// [`SimError::Inconsistent`] if the placement fails (a bug).
pub fn simulate_clusters(
    topo: &Topology,
    jobs: &[CommJob],
    placer: Placer,
    overload: f64,
) -> Result<Vec<JobRun>, SimError> {
    if !(overload.is_finite() && overload > 0.0) {
        return Err(SimError::InvalidParameter {
            name: "overload",
            value: overload.to_string(),
            expected: "a finite number greater than 0",
        });
    }
    let inconsistent = |what: String| SimError::Inconsistent(what);
    // Peers at golden indices 1..=n in topology order, in both tables.
    let mut flat = Dhht::new();
    let mut two = TwoLevel::new();
    for (i, p) in topo.peers.iter().enumerate() {
        let position = golden_position(i as u64 + 1);
        flat.insert(Peer {
            id: i as i64,
            position,
            weight: p.factor,
        })
        .map_err(|e| inconsistent(e.to_string()))?;
        two.insert(ClusterPeer {
            id: i as i64,
            cluster: Some(topo.clusters[p.cluster].name.clone()),
            position,
            weight: p.factor,
            slots: p.cores,
        })
        .map_err(|e| inconsistent(e.to_string()))?;
    }
    let limit = overload * topo.cores() as f64;
    let largest = topo.max_cluster_cores();
    let mut process_ix = IndexAllocator::new();
    let mut job_ix = IndexAllocator::new();
    let mut results: Vec<Option<JobRun>> = vec![None; jobs.len()];
    let mut queue: std::collections::VecDeque<usize> = Default::default();
    let mut running: Vec<Running> = Vec::new();
    let mut next_release = 0;
    let mut now = 0.0f64;
    let mut procs_running: u64 = 0;
    let mut computing = vec![0u32; topo.peers.len()];
    let mut link_users: BTreeMap<Link, u32> = BTreeMap::new();
    loop {
        // Admit whole jobs from the head while below the limit.
        while let Some(&j) = queue.front() {
            if (procs_running as f64) >= limit {
                break;
            }
            queue.pop_front();
            let job = &jobs[j];
            let indices: Vec<u64> = (0..job.procs).map(|_| process_ix.alloc()).collect();
            let xs: Vec<_> = indices.iter().map(|&k| golden_position(k)).collect();
            let (owners, job_index) = match placer {
                Placer::Flat => {
                    let owners = placement::place(&flat, &xs)
                        .into_iter()
                        .map(|o| o.map(|p| p as usize))
                        .collect::<Option<Vec<usize>>>();
                    (owners, None)
                }
                Placer::TwoLevel => {
                    let k = job_ix.alloc();
                    let placed = two.place_job(golden_position(k), &xs);
                    (
                        placed.map(|p| p.owners.into_iter().map(|o| o as usize).collect()),
                        Some(k),
                    )
                }
            };
            let owners = owners.ok_or_else(|| inconsistent("a job found no peer".into()))?;
            let r = start(topo, job, &owners, now, indices, job_index);
            let spans = {
                let mut cs: Vec<usize> = owners.iter().map(|&o| topo.peers[o].cluster).collect();
                cs.sort_unstable();
                cs.dedup();
                cs.len()
            };
            let gateway_bytes: f64 = r
                .links
                .iter()
                .filter(|(l, _)| matches!(l, Link::GwUp(_)))
                .map(|(_, b)| b)
                .sum();
            let peer_bytes: f64 = r
                .links
                .iter()
                .filter(|(l, _)| matches!(l, Link::Up(_)))
                .map(|(_, b)| b)
                .sum();
            results[j] = Some(JobRun {
                id: j,
                procs: job.procs,
                fits: u64::from(job.procs) <= largest,
                clusters: spans,
                pending: now - job.release,
                stretch: f64::NAN,
                gateway_bytes,
                peer_bytes,
            });
            procs_running += u64::from(job.procs);
            enter(&r, &mut computing, &mut link_users);
            running.push(r);
        }
        // The rate of every running job in its phase.
        let rates: Vec<f64> = running
            .iter()
            .map(|r| rate(topo, &jobs[r.job], r, &computing, &link_users))
            .collect();
        let mut dt = f64::INFINITY;
        if let Some(job) = jobs.get(next_release) {
            dt = dt.min(job.release - now);
        }
        for (r, &v) in running.iter().zip(&rates) {
            dt = dt.min(r.left / v);
        }
        if !dt.is_finite() {
            break;
        }
        let dt = dt.max(0.0);
        now += dt;
        // Advance; collect the jobs whose phase ends now.
        let mut ended = Vec::new();
        for (i, (r, &v)) in running.iter_mut().zip(&rates).enumerate() {
            r.left -= v * dt;
            // The job that set `dt` lands on 0 up to rounding.
            if r.left <= 1e-9 {
                ended.push(i);
            }
        }
        for &i in ended.iter().rev() {
            let r = &mut running[i];
            leave(r, &mut computing, &mut link_users);
            let job = &jobs[r.job];
            let finished = advance(r, job);
            if finished {
                let r = running.swap_remove(i);
                for k in &r.indices {
                    process_ix.free(*k);
                }
                if let Some(k) = r.job_index {
                    job_ix.free(k);
                }
                procs_running -= u64::from(job.procs);
                if let Some(res) = results[r.job].as_mut() {
                    res.stretch = (now - r.admitted) / job.ideal(topo);
                }
            } else {
                enter(&running[i], &mut computing, &mut link_users);
            }
        }
        while let Some(job) = jobs.get(next_release) {
            if job.release > now {
                break;
            }
            queue.push_back(next_release);
            next_release += 1;
        }
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| inconsistent("a job never ran".into())))
        .collect()
}

/// A job admitted at `now` on `owners`, in its first compute phase.
fn start(
    topo: &Topology,
    job: &CommJob,
    owners: &[usize],
    now: f64,
    indices: Vec<u64>,
    job_index: Option<u64>,
) -> Running {
    let mut per_peer: BTreeMap<usize, u32> = BTreeMap::new();
    for &o in owners {
        *per_peer.entry(o).or_default() += 1;
    }
    let mut links: BTreeMap<Link, f64> = BTreeMap::new();
    let mut send = |from: usize, to: usize, bytes: f64| {
        let (p, q) = (owners[from], owners[to]);
        if p == q || bytes <= 0.0 {
            return;
        }
        *links.entry(Link::Up(p)).or_default() += bytes;
        *links.entry(Link::Down(q)).or_default() += bytes;
        let (a, b) = (topo.peers[p].cluster, topo.peers[q].cluster);
        if a != b {
            *links.entry(Link::GwUp(a)).or_default() += bytes;
            *links.entry(Link::GwDown(b)).or_default() += bytes;
        }
    };
    let n = owners.len();
    if n > 1 {
        match job.pattern {
            Pattern::AllToAll => {
                let each = job.bytes / (n - 1) as f64;
                for i in 0..n {
                    for j in 0..n {
                        if i != j {
                            send(i, j, each);
                        }
                    }
                }
            }
            Pattern::Ring => {
                for i in 0..n {
                    send(i, (i + 1) % n, job.bytes / 2.0);
                    send(i, (i + n - 1) % n, job.bytes / 2.0);
                }
            }
        }
    }
    let spans = links.keys().any(|l| matches!(l, Link::GwUp(_)));
    Running {
        job: job.id,
        peers: per_peer.into_iter().collect(),
        links: links.into_iter().collect(),
        latency: if n <= 1 {
            0.0
        } else if spans {
            topo.wan_latency
        } else {
            topo.lan_latency
        },
        phase: Phase::Compute,
        left: 1.0,
        step: 0,
        admitted: now,
        indices,
        job_index,
    }
}

/// Registers `r`'s current phase's use of cores or links.
fn enter(r: &Running, computing: &mut [u32], links: &mut BTreeMap<Link, u32>) {
    match r.phase {
        Phase::Compute => {
            for &(p, n) in &r.peers {
                computing[p] += n;
            }
        }
        Phase::Comm => {
            for (l, _) in &r.links {
                *links.entry(*l).or_default() += 1;
            }
        }
        Phase::Sync => {}
    }
}

fn leave(r: &Running, computing: &mut [u32], links: &mut BTreeMap<Link, u32>) {
    match r.phase {
        Phase::Compute => {
            for &(p, n) in &r.peers {
                computing[p] -= n;
            }
        }
        Phase::Comm => {
            for (l, _) in &r.links {
                if let Some(c) = links.get_mut(l) {
                    *c -= 1;
                }
            }
        }
        Phase::Sync => {}
    }
}

/// Moves `r` to its next phase; `true` when the job is done.
fn advance(r: &mut Running, job: &CommJob) -> bool {
    loop {
        let (phase, step) = match r.phase {
            Phase::Compute => (Phase::Comm, r.step),
            Phase::Comm => (Phase::Sync, r.step),
            Phase::Sync => (Phase::Compute, r.step + 1),
        };
        if step >= job.supersteps {
            return true;
        }
        r.phase = phase;
        r.step = step;
        match phase {
            Phase::Compute if job.work > 0.0 => {
                r.left = 1.0;
                return false;
            }
            Phase::Comm if !r.links.is_empty() => {
                r.left = 1.0;
                return false;
            }
            Phase::Sync if r.latency > 0.0 => {
                r.left = r.latency;
                return false;
            }
            _ => {}
        }
    }
}

/// The rate (fraction of the phase per second) of `r` now.
fn rate(
    topo: &Topology,
    job: &CommJob,
    r: &Running,
    computing: &[u32],
    links: &BTreeMap<Link, u32>,
) -> f64 {
    match r.phase {
        Phase::Compute => {
            let slowest = r
                .peers
                .iter()
                .map(|&(p, _)| {
                    let peer = &topo.peers[p];
                    let m = f64::from(computing[p].max(1));
                    let cores = f64::from(peer.cores);
                    peer.factor / cores * (cores / m).min(1.0)
                })
                .fold(f64::INFINITY, f64::min);
            slowest / job.work
        }
        Phase::Comm => r
            .links
            .iter()
            .map(|&(l, bytes)| {
                let bw = match l {
                    Link::Up(p) | Link::Down(p) => topo.clusters[topo.peers[p].cluster].access,
                    Link::GwUp(c) | Link::GwDown(c) => topo.clusters[c].gateway,
                };
                bw / f64::from(links.get(&l).copied().unwrap_or(1).max(1)) / bytes
            })
            .fold(f64::INFINITY, f64::min),
        Phase::Sync => 1.0,
    }
}

// ---------------------------------------------------------------- experiment

/// The parameters of the comparison; printed in its report.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSpec {
    /// Networks.
    pub topologies: Vec<TopologyKind>,
    /// Offered compute loads (fraction of all cores).
    pub loads: Vec<f64>,
    /// Overload factors of the ready queue.
    pub overloads: Vec<f64>,
    /// Jobs per run.
    pub jobs: usize,
    /// The seed.
    pub seed: u64,
}

impl ClusterSpec {
    /// Both networks, loads 0.3 and 0.7, overloads 1 and 4, 400 jobs.
    pub fn defaults(seed: u64) -> ClusterSpec {
        ClusterSpec {
            topologies: TopologyKind::ALL.to_vec(),
            loads: vec![0.3, 0.7],
            overloads: vec![1.0, 4.0],
            jobs: 400,
            seed,
        }
    }

    /// Checks the parameters.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidParameter`] naming the first bad one.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |name, value: String, expected| {
            Err(SimError::InvalidParameter {
                name,
                value,
                expected,
            })
        };
        if self.topologies.is_empty() {
            return bad("topology", "none".into(), "at least one of testbed, hetero");
        }
        if let Some(l) = self
            .loads
            .iter()
            .find(|l| !(l.is_finite() && **l > 0.0 && **l <= 10.0))
        {
            return bad("load", l.to_string(), "a number in (0, 10]");
        }
        if self.loads.is_empty() {
            return bad("load", "none".into(), "at least one load in (0, 10]");
        }
        if let Some(o) = self
            .overloads
            .iter()
            .find(|o| !(o.is_finite() && **o > 0.0))
        {
            return bad("overload", o.to_string(), "a finite number greater than 0");
        }
        if self.overloads.is_empty() {
            return bad("overload", "none".into(), "at least one overload factor");
        }
        if self.jobs == 0 || self.jobs > 1_000_000 {
            return bad("jobs", self.jobs.to_string(), "1 to 1000000");
        }
        Ok(())
    }

    /// The `bspweb sim` command line that reproduces this report.
    pub fn command_line(&self, out: &str) -> String {
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "bspweb sim --experiment clusters --topology {} --load {} --overload {} --jobs {} --seed {} --out {out}",
            self.topologies
                .iter()
                .map(|t| t.slug())
                .collect::<Vec<_>>()
                .join(","),
            list(&self.loads),
            list(&self.overloads),
            self.jobs,
            self.seed,
        )
    }
}

/// One row of the comparison: a network, load, overload and placer.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterRun {
    /// The network.
    pub topology: TopologyKind,
    /// Offered load.
    pub load: f64,
    /// Overload factor.
    pub overload: f64,
    /// The placer.
    pub placer: Placer,
    /// Every job.
    pub jobs: Vec<JobRun>,
}

impl ClusterRun {
    fn mean(&self, f: impl Fn(&JobRun) -> Option<f64>) -> f64 {
        let v: Vec<f64> = self.jobs.iter().filter_map(f).collect();
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    }

    /// Mean job stretch (jobs with more than one process: a single process
    /// neither communicates nor can be placed better).
    pub fn stretch(&self) -> f64 {
        self.mean(|j| (j.procs > 1).then_some(j.stretch))
    }

    /// Mean stretch of the parallel jobs that fit / do not fit the largest
    /// cluster.
    pub fn stretch_by_fit(&self, fits: bool) -> f64 {
        self.mean(|j| (j.procs > 1 && j.fits == fits).then_some(j.stretch))
    }

    /// The 90th percentile of the parallel jobs' stretch.
    pub fn stretch_p90(&self) -> f64 {
        let mut v: Vec<f64> = self
            .jobs
            .iter()
            .filter(|j| j.procs > 1)
            .map(|j| j.stretch)
            .collect();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * 0.9).round() as usize]
    }

    /// Mean clusters per parallel job.
    pub fn clusters_per_job(&self) -> f64 {
        self.mean(|j| (j.procs > 1).then_some(j.clusters as f64))
    }

    /// Share of the bytes between peers that crossed a gateway.
    pub fn gateway_share(&self) -> f64 {
        let (gw, all) = self.jobs.iter().fold((0.0, 0.0), |(g, a), j| {
            (g + j.gateway_bytes, a + j.peer_bytes)
        });
        if all > 0.0 { gw / all } else { 0.0 }
    }

    /// Mean pending time, s.
    pub fn pending(&self) -> f64 {
        self.mean(|j| Some(j.pending))
    }
}

/// Runs every network × load × overload × placer of `spec`.
///
/// # Errors
///
/// The spec's validation error or a run's.
pub fn run_clusters(spec: &ClusterSpec) -> Result<Vec<ClusterRun>, SimError> {
    spec.validate()?;
    let mut runs = Vec::new();
    for &t in &spec.topologies {
        let topo = Topology::new(t, spec.seed);
        for &load in &spec.loads {
            let jobs = job_mix(&topo, spec.jobs, load, spec.seed);
            for &overload in &spec.overloads {
                for placer in Placer::ALL {
                    runs.push(ClusterRun {
                        topology: t,
                        load,
                        overload,
                        placer,
                        jobs: simulate_clusters(&topo, &jobs, placer, overload)?,
                    });
                }
            }
        }
    }
    Ok(runs)
}

fn f3(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "–".into()
    }
}

/// The report: `README.md` (parameters, networks, the table), `results.csv`
/// (one line per job and run) and `stretch.svg`.
pub fn render_clusters(spec: &ClusterSpec, runs: &[ClusterRun], command: &str) -> Vec<ReportFile> {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Flat against two-level placement (issue 15, Fig. 6.1)\n\n\
         Reproduce with:\n\n```\n{command}\n```\n"
    );
    let _ = writeln!(
        md,
        "## Parameters\n\n| parameter | value |\n|---|---|\n| seed | {} |\n| jobs per run | {} |\n\
         | offered loads | {} |\n| overload factors | {} |\n",
        spec.seed,
        spec.jobs,
        spec.loads
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        spec.overloads
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    );
    let _ = writeln!(
        md,
        "## Networks\n\n| network | clusters (peers/cores, access, gateway) | cores | fastest core | latency LAN/WAN |\n|---|---|---|---|---|"
    );
    for &t in &spec.topologies {
        let topo = Topology::new(t, spec.seed);
        let clusters: Vec<String> = topo
            .clusters
            .iter()
            .enumerate()
            .map(|(c, cl)| {
                let peers = topo.peers.iter().filter(|p| p.cluster == c);
                let cores: u32 = peers.clone().map(|p| p.cores).sum();
                format!(
                    "{} {}/{}, {:.0}, {:.0}",
                    cl.name,
                    peers.count(),
                    cores,
                    cl.access / MBIT,
                    cl.gateway / MBIT
                )
            })
            .collect();
        let _ = writeln!(
            md,
            "| {t} | {} (Mbit/s) | {} | {:.2} GHz | {} ms / {} ms |",
            clusters.join("; "),
            topo.cores(),
            topo.max_core_speed(),
            topo.lan_latency * 1e3,
            topo.wan_latency * 1e3
        );
    }
    let _ = writeln!(
        md,
        "\n## Job stretch\n\nStretch = (finish − admission) ÷ the job's time alone on the \
         fastest setting; means over the parallel jobs (p > 1). *fit*: jobs that fit the \
         largest cluster's cores; *span*: the others. *gateway*: share of the bytes between \
         peers that crossed a gateway.\n\n\
         | network | load | overload | placement | stretch | p90 | fit | span | clusters/job | gateway | pending (s) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in runs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.1} % | {:.0} |",
            r.topology,
            r.load,
            r.overload,
            r.placer.label(),
            f3(r.stretch()),
            f3(r.stretch_p90()),
            f3(r.stretch_by_fit(true)),
            f3(r.stretch_by_fit(false)),
            r.clusters_per_job(),
            100.0 * r.gateway_share(),
            r.pending()
        );
    }
    let mut groups = Vec::new();
    let mut series: Vec<(String, Vec<f64>)> = Placer::ALL
        .iter()
        .map(|p| (p.label().to_string(), Vec::new()))
        .collect();
    for r in runs {
        let g = format!("{} load {} o{}", r.topology, r.load, r.overload);
        if groups.last() != Some(&g) {
            groups.push(g);
        }
        if let Some(s) = series.iter_mut().find(|s| s.0 == r.placer.label()) {
            s.1.push(r.stretch());
        }
    }
    let _ = writeln!(md, "\n![mean job stretch](stretch.svg)");
    let svg = bar_chart(
        "Mean job stretch, flat vs two-level placement",
        "mean job stretch",
        &groups,
        &series,
    );
    let mut csv = String::from(
        "topology,load,overload,placement,job,procs,fits,clusters,pending_s,stretch,gateway_bytes,peer_bytes\n",
    );
    for r in runs {
        for j in &r.jobs {
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{},{},{},{:.3},{:.6},{:.0},{:.0}",
                r.topology,
                r.load,
                r.overload,
                match r.placer {
                    Placer::Flat => "flat",
                    Placer::TwoLevel => "two-level",
                },
                j.id,
                j.procs,
                j.fits,
                j.clusters,
                j.pending,
                j.stretch,
                j.gateway_bytes,
                j.peer_bytes
            );
        }
    }
    vec![
        ReportFile {
            path: "README.md".into(),
            contents: md,
        },
        ReportFile {
            path: "results.csv".into(),
            contents: csv,
        },
        ReportFile {
            path: "stretch.svg".into(),
            contents: svg,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_job(procs: u32, pattern: Pattern, bytes: f64) -> CommJob {
        CommJob {
            id: 0,
            release: 0.0,
            procs,
            supersteps: 10,
            work: 2.0,
            bytes,
            pattern,
        }
    }

    /// By hand: on the testbed (cores of 2 GHz, 100 Mbit/s access, 0.5 ms
    /// LAN latency) one process alone takes its ideal time exactly, and a
    /// job alone whose processes share no peer takes S × (work/2 GHz +
    /// its busiest link's bytes / 100 Mbit/s + latency).
    #[test]
    fn a_job_alone_takes_compute_plus_its_slowest_link_plus_latency() {
        let topo = Topology::new(TopologyKind::Testbed, 1);
        let solo = one_job(1, Pattern::Ring, 1e6);
        for placer in Placer::ALL {
            let r = simulate_clusters(&topo, std::slice::from_ref(&solo), placer, 1.0).unwrap();
            assert!(
                (r[0].stretch - 1.0).abs() < 1e-9,
                "{placer:?}: {}",
                r[0].stretch
            );
            assert_eq!(r[0].clusters, 1);
        }
        // Two processes exchanging 1 MB (h/2 each way, twice: ring of 2).
        let pair = one_job(2, Pattern::Ring, 1e6);
        let r =
            simulate_clusters(&topo, std::slice::from_ref(&pair), Placer::TwoLevel, 1.0).unwrap();
        let took = r[0].stretch * pair.ideal(&topo);
        let (s, w, l) = (10.0, 1.0, 0.0005);
        if r[0].peer_bytes == 0.0 {
            // Both on one peer (2 cores): no communication, no latency
            // beyond the barrier's.
            assert!((took - s * (w + l)).abs() < 1e-6, "{took}");
        } else {
            // Each uplink carries 1 MB per superstep.
            let expected = s * (w + 1e6 / (100.0 * MBIT) + l);
            assert!((took - expected).abs() < 1e-6, "{took} vs {expected}");
        }
        assert_eq!(r[0].clusters, 1, "a pair fits one cluster");
        assert_eq!(r[0].gateway_bytes, 0.0);
    }

    /// Fig. 6.1 with one cluster is the flat DHHT: on a network of one
    /// cluster both placers give every job the same fate.
    #[test]
    fn one_cluster_runs_identically_flat_and_two_level() {
        let mut topo = Topology::new(TopologyKind::Hetero, 3);
        for p in &mut topo.peers {
            p.cluster = 0;
        }
        topo.clusters.truncate(1);
        let jobs = job_mix(&topo, 60, 0.7, 3);
        let flat = simulate_clusters(&topo, &jobs, Placer::Flat, 1.0).unwrap();
        let two = simulate_clusters(&topo, &jobs, Placer::TwoLevel, 1.0).unwrap();
        assert_eq!(flat, two);
    }

    /// Two-level keeps every job that fits a cluster inside one, and spans
    /// only the jobs that fit none; every job finishes, no faster than
    /// alone on the fastest setting.
    #[test]
    fn two_level_spans_only_jobs_that_fit_no_cluster() {
        for kind in TopologyKind::ALL {
            let topo = Topology::new(kind, 5);
            let jobs = job_mix(&topo, 120, 0.5, 5);
            let runs = simulate_clusters(&topo, &jobs, Placer::TwoLevel, 2.0).unwrap();
            for (j, r) in jobs.iter().zip(&runs) {
                assert_eq!(r.id, j.id);
                assert!(r.stretch >= 1.0 - 1e-9 && r.stretch.is_finite(), "{r:?}");
                assert!(r.pending >= 0.0);
                if r.fits {
                    assert_eq!(r.clusters, 1, "{kind}: {r:?}");
                    assert_eq!(r.gateway_bytes, 0.0);
                } else {
                    assert!(r.clusters > 1, "{kind}: {r:?}");
                }
            }
            let flat = simulate_clusters(&topo, &jobs, Placer::Flat, 2.0).unwrap();
            assert!(flat.iter().all(|r| r.stretch >= 1.0 - 1e-9));
        }
    }

    /// Same seed and parameters, same report, byte for byte; another seed
    /// changes it. Bad parameters are errors, not panics.
    #[test]
    fn reports_are_reproducible_and_bad_parameters_are_errors() {
        let mut spec = ClusterSpec::defaults(7);
        spec.jobs = 40;
        spec.loads = vec![0.5];
        spec.overloads = vec![1.0];
        let a = render_clusters(&spec, &run_clusters(&spec).unwrap(), "x");
        let b = render_clusters(&spec, &run_clusters(&spec).unwrap(), "x");
        assert_eq!(a, b);
        assert!(a[0].contents.contains("| two-level |"));
        assert!(a[2].contents.starts_with("<svg") || a[2].contents.contains("<svg"));
        spec.seed = 8;
        let c = render_clusters(&spec, &run_clusters(&spec).unwrap(), "x");
        assert_ne!(a[1], c[1]);
        for bad in [
            ClusterSpec {
                loads: vec![f64::NAN],
                ..spec.clone()
            },
            ClusterSpec {
                loads: vec![0.0],
                ..spec.clone()
            },
            ClusterSpec {
                overloads: vec![-1.0],
                ..spec.clone()
            },
            ClusterSpec {
                jobs: 0,
                ..spec.clone()
            },
            ClusterSpec {
                topologies: vec![],
                ..spec.clone()
            },
        ] {
            assert!(matches!(
                run_clusters(&bad),
                Err(SimError::InvalidParameter { .. })
            ));
        }
        let topo = Topology::new(TopologyKind::Testbed, 1);
        assert!(simulate_clusters(&topo, &[], Placer::Flat, f64::NAN).is_err());
        assert!(
            simulate_clusters(&topo, &[], Placer::Flat, 1.0)
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            "Hetero".parse::<TopologyKind>().unwrap(),
            TopologyKind::Hetero
        );
        assert!("mesh".parse::<TopologyKind>().is_err());
        assert!(
            spec.command_line("out")
                .starts_with("bspweb sim --experiment clusters --topology testbed,hetero")
        );
    }
}
