//! The event-driven simulation of one run (§4.1, §4.4).
//!
//! # Model
//!
//! - **Peers** have a CPU factor (Table 4.2) and a piecewise-constant
//!   availability; their *power* is factor × availability. A peer with
//!   availability 0 is switched off and leaves the balancer; it rejoins when
//!   its availability becomes positive again.
//! - **Hash-based balancers** ([`placement::HashTable`]): every process a peer
//!   hosts runs, and they share the peer's power equally.
//! - **Work stealing** ([`placement::WorkStealing`]): a peer runs only the
//!   head of its queue, at the peer's full power; the others wait.
//! - **Jobs** enter a FIFO ready queue at their release time. Whenever the
//!   number of running processes (admitted, not finished, wherever they are)
//!   is below `online peers × overload`, the head job is admitted whole
//!   (§4.4: the limit is checked before admitting, so one large job may push
//!   the count above the limit, but nothing is admitted while it is there).
//! - **Migrations** are free and instantaneous; every change of a process's
//!   peer counts as a default migration, and migrations of one process that
//!   start less than `bulk_window` seconds after the first migration of its
//!   current bulk are merged into one bulk migration (a bulk that ends where
//!   it started counts zero, §4.4.1).
//! - **Hysteresis**: the balancer is told a peer's new power only when it
//!   differs from the power last told by more than `hysteresis` × that power
//!   (0 = always, as in the dissertation); joins and leaves are always told.
//!   The real share always follows the real power.
//!
//! # Time
//!
//! Exact and event-driven: all processes on a peer progress at the same
//! rate, so each peer keeps its cumulative per-process service `S(t)`; a
//! process that became active at service `S₀` with remaining work `R`
//! finishes when `S` reaches `S₀ + R`, and the peer's next completion time
//! follows from its current rate. Events are job releases, availability
//! steps and completions; nothing is sampled on a clock.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};
use std::fmt;
use std::str::FromStr;

use placement::{HashTable, HashVariant, Move, PeerId, ProcessKey, StealFrom, WorkStealing};

use crate::availability::Availability;
use crate::error::SimError;
use crate::jobs::Job;

/// Which load balancer a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BalancerSpec {
    /// A hash-based balancer (§4.2.2–4.2.4, or weighted rendezvous hashing).
    Hash(HashVariant),
    /// Work stealing (§4.2.1), from the head or the tail of the victim's queue.
    Stealing(StealFrom),
}

impl BalancerSpec {
    /// The eight balancers: the six hash variants, then WS (Head), WS (Tail).
    pub fn all() -> Vec<BalancerSpec> {
        let mut v: Vec<BalancerSpec> = HashVariant::ALL
            .into_iter()
            .map(BalancerSpec::Hash)
            .collect();
        v.push(BalancerSpec::Stealing(StealFrom::Head));
        v.push(BalancerSpec::Stealing(StealFrom::Tail));
        v
    }

    /// The hash-based balancers only (experiments of type A).
    pub fn hash_only() -> Vec<BalancerSpec> {
        HashVariant::ALL
            .into_iter()
            .map(BalancerSpec::Hash)
            .collect()
    }

    /// The name in the dissertation's tables, e.g. "DHHT (D/D)", "WS (Head)".
    pub fn label(self) -> &'static str {
        match self {
            BalancerSpec::Hash(v) => v.label(),
            BalancerSpec::Stealing(StealFrom::Head) => "WS (Head)",
            BalancerSpec::Stealing(StealFrom::Tail) => "WS (Tail)",
        }
    }

    /// The command-line name: a [`HashVariant`] slug, `ws-head` or `ws-tail`.
    pub fn slug(self) -> &'static str {
        match self {
            BalancerSpec::Hash(v) => v.slug(),
            BalancerSpec::Stealing(StealFrom::Head) => "ws-head",
            BalancerSpec::Stealing(StealFrom::Tail) => "ws-tail",
        }
    }

    /// Whether the balancer is work stealing.
    pub fn is_stealing(self) -> bool {
        matches!(self, BalancerSpec::Stealing(_))
    }
}

impl fmt::Display for BalancerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for BalancerSpec {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        BalancerSpec::all()
            .into_iter()
            .find(|b| b.slug().eq_ignore_ascii_case(s))
            .ok_or_else(|| SimError::UnknownName {
                what: "balancer",
                given: s.to_string(),
                valid: BalancerSpec::all()
                    .iter()
                    .map(|b| b.slug())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

/// Everything one run depends on. Same config ⇒ same outcome, bit for bit.
#[derive(Clone, Copy, Debug)]
pub struct RunConfig<'a> {
    /// The load balancer.
    pub balancer: BalancerSpec,
    /// CPU factor of each peer (peer ids are the indices); finite, > 0.
    pub factors: &'a [f64],
    /// Availability of each peer, or empty for 100 % throughout.
    pub availability: &'a [Availability],
    /// The job stream, sorted by release time, ids `0..n` in that order.
    pub jobs: &'a [Job],
    /// Overload factor: jobs wait while running processes ≥ online peers ×
    /// this (`f64::INFINITY`: no ready queue).
    pub overload: f64,
    /// End of the run in seconds; `f64::INFINITY` runs until every job is
    /// done (only for finite job lengths).
    pub horizon: f64,
    /// Relative power change below which the balancer is not told (0 = tell
    /// every change).
    pub hysteresis: f64,
    /// Window of the bulk migration mode, in seconds.
    pub bulk_window: f64,
    /// Seed of the work-stealing balancer's PRNG.
    pub seed: u64,
    /// Peer `i` is `peer_id_base + i` to the balancer. The "Rnd." peer
    /// positions and the per-peer hashes of Multi / rendezvous are hashes of
    /// the id, so the base selects the random ring instance.
    pub peer_id_base: PeerId,
}

/// One process's history.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessOutcome {
    /// Index of its job in [`RunOutcome::jobs`].
    pub job: u32,
    /// Process id within the job.
    pub pid: u32,
    /// Length (work) in seconds at factor 1.
    pub length: f64,
    /// When its job was admitted from the ready queue.
    pub admitted: f64,
    /// When it finished, if it did before the end.
    pub finished: Option<f64>,
    /// CPU time received: work done, in seconds at factor 1 (= `length` if
    /// finished).
    pub work: f64,
    /// Default-mode migrations.
    pub migrations: u32,
    /// Bulk-mode migrations.
    pub bulk_migrations: u32,
}

/// One job's history.
#[derive(Clone, Debug, PartialEq)]
pub struct JobOutcome {
    /// The job as released.
    pub job: Job,
    /// When it left the ready queue, if it did.
    pub admitted: Option<f64>,
    /// When its last process finished, if it did.
    pub finished: Option<f64>,
}

/// One peer's totals.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerOutcome {
    /// CPU factor.
    pub factor: f64,
    /// Available CPU time: ∫ factor × availability dt, seconds at factor 1.
    pub available: f64,
    /// Utilized CPU time: the available CPU time while it ran a process.
    pub utilized: f64,
    /// The most processes it ran at the same time.
    pub max_running: u32,
}

/// One admission from the ready queue (for checking the overload rule).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Admission {
    /// Time of admission.
    pub time: f64,
    /// Running processes just before.
    pub running_before: usize,
    /// The limit at that time: online peers × overload.
    pub limit: f64,
    /// Processes admitted (the job's parallelism).
    pub size: u32,
}

/// The result of [`simulate`].
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutcome {
    /// The balancer.
    pub balancer: BalancerSpec,
    /// Time the run ended (the horizon, or the last event when draining).
    pub end: f64,
    /// Per peer.
    pub peers: Vec<PeerOutcome>,
    /// Per job, in id order.
    pub jobs: Vec<JobOutcome>,
    /// Per admitted process, in admission order.
    pub processes: Vec<ProcessOutcome>,
    /// Every admission.
    pub admissions: Vec<Admission>,
    /// Number of events handled.
    pub events: u64,
}

/// The balancer seen by the engine: both kinds behind one face (tests add
/// a scripted one).
pub(crate) trait Balancer {
    /// True if every hosted process runs (sharing the power); false if only
    /// [`Balancer::running_on`] runs.
    fn shares_power(&self) -> bool;
    /// A peer joins (`joined`) or its power changes.
    fn set_peer(&mut self, peer: PeerId, power: f64, joined: bool) -> Result<Vec<Move>, SimError>;
    fn remove_peer(&mut self, peer: PeerId) -> Vec<Move>;
    fn release(&mut self, processes: &[ProcessKey]) -> Vec<Move>;
    fn finish(&mut self, process: ProcessKey);
    fn rebalance(&mut self) -> Vec<Move>;
    fn running_on(&self, peer: PeerId) -> Option<ProcessKey>;
}

struct HashBalancer(HashTable);

impl Balancer for HashBalancer {
    fn shares_power(&self) -> bool {
        true
    }
    fn set_peer(&mut self, peer: PeerId, power: f64, _joined: bool) -> Result<Vec<Move>, SimError> {
        self.0
            .set_peer(peer, power)
            .map_err(|e| SimError::Inconsistent(e.to_string()))
    }
    fn remove_peer(&mut self, peer: PeerId) -> Vec<Move> {
        self.0.remove_peer(peer)
    }
    fn release(&mut self, processes: &[ProcessKey]) -> Vec<Move> {
        processes
            .iter()
            .map(|&process| Move {
                process,
                from: None,
                to: self.0.add_process(process),
            })
            .collect()
    }
    fn finish(&mut self, process: ProcessKey) {
        self.0.remove_process(process);
    }
    fn rebalance(&mut self) -> Vec<Move> {
        Vec::new()
    }
    fn running_on(&self, _peer: PeerId) -> Option<ProcessKey> {
        None
    }
}

/// Work stealing. Processes that found no peer (every peer switched off)
/// wait inside [`WorkStealing`] and are released by its next
/// [`steal_for_idle`](WorkStealing::steal_for_idle), which the engine calls
/// after every event.
struct StealBalancer(WorkStealing);

impl Balancer for StealBalancer {
    fn shares_power(&self) -> bool {
        false
    }
    fn set_peer(&mut self, peer: PeerId, _power: f64, joined: bool) -> Result<Vec<Move>, SimError> {
        if joined {
            self.0.add_peer(peer);
        }
        Ok(Vec::new())
    }
    fn remove_peer(&mut self, peer: PeerId) -> Vec<Move> {
        self.0.remove_peer(peer)
    }
    fn release(&mut self, processes: &[ProcessKey]) -> Vec<Move> {
        self.0.release(processes)
    }
    fn finish(&mut self, process: ProcessKey) {
        self.0.finish(process);
    }
    fn rebalance(&mut self) -> Vec<Move> {
        self.0.steal_for_idle()
    }
    fn running_on(&self, peer: PeerId) -> Option<ProcessKey> {
        self.0.running_on(peer)
    }
}

/// A total order key for non-negative floats (their bit patterns).
fn key(x: f64) -> u64 {
    debug_assert!(x >= 0.0 || x.is_nan());
    x.max(0.0).to_bits()
}

#[derive(Clone, Copy)]
struct Bulk {
    origin: u32,
    start: f64,
    dest: u32,
}

struct Proc {
    job: u32,
    pid: u32,
    length: f64,
    peer: Option<u32>,
    last_peer: Option<u32>,
    active: bool,
    /// Remaining work while inactive (or at activation).
    remaining: f64,
    /// Peer service when activated; target = act_service + remaining.
    act_service: f64,
    /// Work done before the current activation.
    work: f64,
    admitted: f64,
    finished: Option<f64>,
    migrations: u32,
    bulk_migrations: u32,
    bulk: Option<Bulk>,
}

impl Proc {
    fn target(&self) -> f64 {
        self.act_service + self.remaining
    }
    fn close_bulk(&mut self) {
        if let Some(b) = self.bulk.take()
            && b.origin != b.dest
        {
            self.bulk_migrations += 1;
        }
    }
}

struct PeerSt {
    factor: f64,
    power: f64,
    /// Power last told to the balancer; None = not in the balancer.
    told: Option<f64>,
    service: f64,
    last: f64,
    /// Running processes by (target, index).
    active: BTreeSet<(u64, u32)>,
    utilized: f64,
    available: f64,
    /// Scheduled completion time key in `Engine::completions`.
    scheduled: Option<u64>,
    max_running: u32,
}

impl PeerSt {
    fn touch(&mut self, t: f64) {
        let dt = t - self.last;
        if dt > 0.0 {
            if !self.active.is_empty() && self.power > 0.0 {
                self.service += self.power / self.active.len() as f64 * dt;
                self.utilized += self.power * dt;
            }
            self.available += self.power * dt;
            self.last = t;
        }
    }
}

struct JobSt {
    admitted: Option<f64>,
    finished: Option<f64>,
    first_proc: u32,
    left: u32,
}

struct Engine<'a> {
    cfg: &'a RunConfig<'a>,
    balancer: Box<dyn Balancer>,
    shares: bool,
    peers: Vec<PeerSt>,
    procs: Vec<Proc>,
    jobs: Vec<JobSt>,
    ready: VecDeque<u32>,
    running: usize,
    online: usize,
    completions: BTreeSet<(u64, u32)>,
    admissions: Vec<Admission>,
    dirty: BTreeSet<u32>,
}

/// Runs one simulation.
///
/// # Errors
///
/// [`SimError::InvalidParameter`] / [`SimError::TraceCount`] for a config
/// that cannot be simulated (says which value is wrong), and
/// [`SimError::Inconsistent`] if the balancer contradicts itself.
pub fn simulate(cfg: &RunConfig<'_>) -> Result<RunOutcome, SimError> {
    let balancer: Box<dyn Balancer> = match cfg.balancer {
        BalancerSpec::Hash(v) => Box::new(HashBalancer(HashTable::new(v))),
        BalancerSpec::Stealing(s) => Box::new(StealBalancer(WorkStealing::new(s, cfg.seed))),
    };
    simulate_with(cfg, balancer)
}

/// [`simulate`] with a given balancer (`cfg.balancer` only labels the run).
pub(crate) fn simulate_with(
    cfg: &RunConfig<'_>,
    balancer: Box<dyn Balancer>,
) -> Result<RunOutcome, SimError> {
    validate(cfg)?;
    let e = Engine {
        cfg,
        shares: balancer.shares_power(),
        balancer,
        peers: cfg
            .factors
            .iter()
            .map(|&factor| PeerSt {
                factor,
                power: 0.0,
                told: None,
                service: 0.0,
                last: 0.0,
                active: BTreeSet::new(),
                utilized: 0.0,
                available: 0.0,
                scheduled: None,
                max_running: 0,
            })
            .collect(),
        procs: Vec::new(),
        jobs: cfg
            .jobs
            .iter()
            .map(|_| JobSt {
                admitted: None,
                finished: None,
                first_proc: 0,
                left: 0,
            })
            .collect(),
        ready: VecDeque::new(),
        running: 0,
        online: 0,
        completions: BTreeSet::new(),
        admissions: Vec::new(),
        dirty: BTreeSet::new(),
    };
    e.run()
}

fn invalid(name: &'static str, value: impl fmt::Display, expected: &'static str) -> SimError {
    SimError::InvalidParameter {
        name,
        value: value.to_string(),
        expected,
    }
}

fn validate(cfg: &RunConfig<'_>) -> Result<(), SimError> {
    if cfg.factors.is_empty() {
        return Err(invalid("peers", 0, "at least one peer"));
    }
    if let Some(f) = cfg.factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
        return Err(invalid("factor", f, "CPU factors must be finite and > 0"));
    }
    if cfg
        .peer_id_base
        .checked_add(cfg.factors.len() as i64)
        .is_none()
    {
        return Err(invalid(
            "peer id base",
            cfg.peer_id_base,
            "small enough that base + peers fits in i64",
        ));
    }
    if !cfg.availability.is_empty() && cfg.availability.len() != cfg.factors.len() {
        return Err(SimError::TraceCount {
            peers: cfg.factors.len(),
            traces: cfg.availability.len(),
        });
    }
    if cfg.overload.is_nan() || cfg.overload <= 0.0 {
        return Err(invalid(
            "overload",
            cfg.overload,
            "must be > 0 (or infinite: no ready queue)",
        ));
    }
    if cfg.horizon.is_nan() || cfg.horizon <= 0.0 {
        return Err(invalid(
            "horizon",
            cfg.horizon,
            "must be > 0 seconds (or infinite: until all jobs are done)",
        ));
    }
    if !(cfg.hysteresis >= 0.0 && cfg.hysteresis.is_finite()) {
        return Err(invalid(
            "hysteresis",
            cfg.hysteresis,
            "must be a finite fraction ≥ 0, e.g. 0.1",
        ));
    }
    if !(cfg.bulk_window >= 0.0 && cfg.bulk_window.is_finite()) {
        return Err(invalid(
            "bulk window",
            cfg.bulk_window,
            "must be finite seconds ≥ 0",
        ));
    }
    for (i, j) in cfg.jobs.iter().enumerate() {
        if j.id != i as i64 {
            return Err(invalid(
                "job id",
                j.id,
                "job ids must be 0..n in release order",
            ));
        }
        if !(j.release >= 0.0 && j.release.is_finite()) {
            return Err(invalid(
                "release",
                j.release,
                "release times must be finite and ≥ 0",
            ));
        }
        if i > 0 && j.release < cfg.jobs[i - 1].release {
            return Err(invalid(
                "release",
                j.release,
                "jobs must be sorted by release time",
            ));
        }
        if j.parallelism == 0 {
            return Err(invalid(
                "parallelism",
                0,
                "every job needs at least one process",
            ));
        }
        if j.length.is_nan() || j.length <= 0.0 {
            return Err(invalid("length", j.length, "process lengths must be > 0"));
        }
        if j.length.is_infinite() && cfg.horizon.is_infinite() {
            return Err(invalid(
                "horizon",
                "infinite",
                "finite when some processes never end",
            ));
        }
    }
    Ok(())
}

impl Engine<'_> {
    fn peer_id(&self, p: u32) -> PeerId {
        self.cfg.peer_id_base + PeerId::from(p)
    }

    fn peer_index(&self, id: PeerId) -> Result<u32, SimError> {
        let i = id.wrapping_sub(self.cfg.peer_id_base);
        if i >= 0 && (i as usize) < self.peers.len() {
            Ok(i as u32)
        } else {
            Err(SimError::Inconsistent(format!("unknown peer id {id}")))
        }
    }

    fn proc_index(&self, key: ProcessKey) -> Result<u32, SimError> {
        let job = usize::try_from(key.job)
            .ok()
            .and_then(|j| self.jobs.get(j))
            .ok_or_else(|| SimError::Inconsistent(format!("unknown process {key:?}")))?;
        if job.admitted.is_none() || key.pid >= self.cfg.jobs[key.job as usize].parallelism {
            return Err(SimError::Inconsistent(format!("unknown process {key:?}")));
        }
        Ok(job.first_proc + key.pid)
    }

    fn run(mut self) -> Result<RunOutcome, SimError> {
        let cfg = self.cfg;
        let mut events = 0u64;
        // Availability steps: a cursor per peer, merged with a heap.
        let mut steps: BinaryHeap<Reverse<(u64, u32, usize)>> = BinaryHeap::new();
        for p in 0..self.peers.len() as u32 {
            let initial = match cfg.availability.get(p as usize) {
                Some(a) => {
                    if let Some(&(t, _)) = a.steps().get(1) {
                        steps.push(Reverse((t, p, 1)));
                    }
                    a.at(0)
                }
                None => 1.0,
            };
            self.set_availability(p, initial, 0.0)?;
        }
        let mut next_job = 0usize;
        let mut now = 0.0;
        self.after_event(now)?;
        loop {
            let tc = self.completions.first().map(|&(k, _)| f64::from_bits(k));
            let ta = steps.peek().map(|Reverse((t, _, _))| *t as f64);
            let tr = cfg.jobs.get(next_job).map(|j| j.release);
            let t = [tc, ta, tr]
                .into_iter()
                .flatten()
                .fold(f64::INFINITY, f64::min);
            if t.is_infinite() || t > cfg.horizon {
                break;
            }
            now = t;
            events += 1;
            if tc == Some(t) {
                let (_, p) = *self.completions.first().expect("peeked above");
                self.complete_on(p, t)?;
            } else if ta == Some(t) {
                let Reverse((_, p, i)) = steps.pop().expect("peeked above");
                let a = &cfg.availability[p as usize];
                let value = a.steps()[i].1;
                if let Some(&(tn, _)) = a.steps().get(i + 1) {
                    steps.push(Reverse((tn, p, i + 1)));
                }
                self.set_availability(p, value, t)?;
            } else {
                self.ready.push_back(next_job as u32);
                next_job += 1;
            }
            self.after_event(t)?;
        }
        let end = if cfg.horizon.is_finite() {
            cfg.horizon
        } else {
            now
        };
        Ok(self.finish_run(end, events))
    }

    /// Admission from the ready queue, then work stealing's rebalancing.
    fn after_event(&mut self, t: f64) -> Result<(), SimError> {
        while let Some(&j) = self.ready.front() {
            let limit = self.online as f64 * self.cfg.overload;
            if (self.running as f64) >= limit {
                break;
            }
            self.ready.pop_front();
            self.admit(j, t, limit)?;
        }
        let moves = self.balancer.rebalance();
        self.apply(&moves, t)
    }

    fn admit(&mut self, j: u32, t: f64, limit: f64) -> Result<(), SimError> {
        let job = self.cfg.jobs[j as usize];
        self.admissions.push(Admission {
            time: t,
            running_before: self.running,
            limit,
            size: job.parallelism,
        });
        let first = self.procs.len() as u32;
        let st = &mut self.jobs[j as usize];
        st.admitted = Some(t);
        st.first_proc = first;
        st.left = job.parallelism;
        let mut keys = Vec::with_capacity(job.parallelism as usize);
        for pid in 0..job.parallelism {
            self.procs.push(Proc {
                job: j,
                pid,
                length: job.length,
                peer: None,
                last_peer: None,
                active: false,
                remaining: job.length,
                act_service: 0.0,
                work: 0.0,
                admitted: t,
                finished: None,
                migrations: 0,
                bulk_migrations: 0,
                bulk: None,
            });
            keys.push(ProcessKey { job: job.id, pid });
        }
        self.running += job.parallelism as usize;
        let moves = self.balancer.release(&keys);
        self.apply(&moves, t)
    }

    fn set_availability(&mut self, p: u32, value: f64, t: f64) -> Result<(), SimError> {
        let value = if value.is_finite() {
            value.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let peer = &mut self.peers[p as usize];
        peer.touch(t);
        let power = peer.factor * value;
        if power == peer.power && (power > 0.0) == peer.told.is_some() {
            return Ok(());
        }
        peer.power = power;
        let id = self.cfg.peer_id_base + PeerId::from(p);
        let moves = match peer.told {
            Some(_) if power <= 0.0 => {
                peer.told = None;
                self.online -= 1;
                self.balancer.remove_peer(id)
            }
            None if power > 0.0 => {
                peer.told = Some(power);
                self.online += 1;
                self.balancer.set_peer(id, power, true)?
            }
            Some(told) if (power - told).abs() > self.cfg.hysteresis * told => {
                peer.told = Some(power);
                self.balancer.set_peer(id, power, false)?
            }
            _ => Vec::new(),
        };
        self.dirty.insert(p);
        self.apply(&moves, t)
    }

    fn activate(&mut self, i: u32, t: f64) {
        let pr = &mut self.procs[i as usize];
        let p = pr.peer.expect("activate a placed process") as usize;
        let peer = &mut self.peers[p];
        peer.touch(t);
        pr.act_service = peer.service;
        pr.active = true;
        peer.active.insert((key(pr.target()), i));
        peer.max_running = peer.max_running.max(peer.active.len() as u32);
    }

    fn deactivate(&mut self, i: u32, t: f64) {
        let pr = &mut self.procs[i as usize];
        let p = pr.peer.expect("deactivate a placed process") as usize;
        let peer = &mut self.peers[p];
        peer.touch(t);
        peer.active.remove(&(key(pr.target()), i));
        let done = (peer.service - pr.act_service).max(0.0).min(pr.remaining);
        pr.work += done;
        pr.remaining -= done;
        pr.active = false;
    }

    fn migrate(&mut self, i: u32, from: u32, to: u32, t: f64) {
        let window = self.cfg.bulk_window;
        let pr = &mut self.procs[i as usize];
        pr.migrations += 1;
        match pr.bulk {
            Some(ref mut b) if t - b.start < window => b.dest = to,
            _ => {
                pr.close_bulk();
                pr.bulk = Some(Bulk {
                    origin: from,
                    start: t,
                    dest: to,
                });
            }
        }
    }

    /// Applies the balancer's moves, then brings the running sets of the
    /// touched peers in line and reschedules their completions.
    fn apply(&mut self, moves: &[Move], t: f64) -> Result<(), SimError> {
        for m in moves {
            let i = self.proc_index(m.process)?;
            let to = m.to.map(|id| self.peer_index(id)).transpose()?;
            let pr = &self.procs[i as usize];
            if pr.finished.is_some() {
                return Err(SimError::Inconsistent(format!(
                    "moved finished process {:?}",
                    m.process
                )));
            }
            if pr.peer == to {
                continue;
            }
            if pr.active {
                self.deactivate(i, t);
            }
            let pr = &mut self.procs[i as usize];
            if let Some(old) = pr.peer {
                self.dirty.insert(old);
            }
            pr.peer = to;
            if let Some(b) = to {
                let last = pr.last_peer.replace(b);
                if let Some(a) = last
                    && a != b
                {
                    self.migrate(i, a, b, t);
                }
                self.dirty.insert(b);
                if self.shares {
                    self.activate(i, t);
                }
            }
        }
        let dirty = std::mem::take(&mut self.dirty);
        for &p in &dirty {
            if !self.shares {
                self.sync_running(p, t)?;
            }
            self.reschedule(p);
        }
        Ok(())
    }

    /// Work stealing: make the peer's only running process the balancer's.
    fn sync_running(&mut self, p: u32, t: f64) -> Result<(), SimError> {
        let want = match self.balancer.running_on(self.peer_id(p)) {
            Some(k) => Some(self.proc_index(k)?),
            None => None,
        };
        let have: Vec<u32> = self.peers[p as usize]
            .active
            .iter()
            .map(|&(_, i)| i)
            .collect();
        for &i in &have {
            if Some(i) != want {
                self.deactivate(i, t);
            }
        }
        if let Some(w) = want
            && !have.contains(&w)
        {
            if self.procs[w as usize].peer != Some(p) {
                return Err(SimError::Inconsistent(format!(
                    "peer {p} runs process {w} that is not on it"
                )));
            }
            self.activate(w, t);
        }
        Ok(())
    }

    fn reschedule(&mut self, p: u32) {
        let peer = &mut self.peers[p as usize];
        if let Some(k) = peer.scheduled.take() {
            self.completions.remove(&(k, p));
        }
        if peer.power <= 0.0 {
            return;
        }
        if let Some(&(target, _)) = peer.active.first() {
            let left = (f64::from_bits(target) - peer.service).max(0.0);
            let when = peer.last + left * peer.active.len() as f64 / peer.power;
            if when.is_finite() {
                let k = key(when);
                peer.scheduled = Some(k);
                self.completions.insert((k, p));
            }
        }
    }

    fn complete_on(&mut self, p: u32, t: f64) -> Result<(), SimError> {
        let peer = &mut self.peers[p as usize];
        peer.touch(t);
        let mut done = Vec::new();
        // The first one is due now; others finish with it if their targets
        // are equal up to rounding.
        while let Some(&(target, i)) = peer.active.first() {
            let target = f64::from_bits(target);
            if !done.is_empty() && target - peer.service > 1e-9 * target.max(1.0) {
                break;
            }
            peer.active.pop_first();
            done.push(i);
        }
        for &i in &done {
            let pr = &mut self.procs[i as usize];
            pr.work += pr.remaining;
            pr.remaining = 0.0;
            pr.active = false;
            pr.finished = Some(t);
            pr.peer = None;
            pr.close_bulk();
            let key = ProcessKey {
                job: self.cfg.jobs[pr.job as usize].id,
                pid: pr.pid,
            };
            let job = &mut self.jobs[pr.job as usize];
            job.left -= 1;
            if job.left == 0 {
                job.finished = Some(t);
            }
            self.running -= 1;
            self.balancer.finish(key);
        }
        self.dirty.insert(p);
        self.apply(&[], t)
    }

    fn finish_run(mut self, end: f64, events: u64) -> RunOutcome {
        for peer in &mut self.peers {
            peer.touch(end);
        }
        let peers = &self.peers;
        let processes = self
            .procs
            .iter_mut()
            .map(|pr| {
                let mut work = pr.work;
                if pr.active
                    && let Some(p) = pr.peer
                {
                    work += (peers[p as usize].service - pr.act_service).clamp(0.0, pr.remaining);
                }
                pr.close_bulk();
                ProcessOutcome {
                    job: pr.job,
                    pid: pr.pid,
                    length: pr.length,
                    admitted: pr.admitted,
                    finished: pr.finished,
                    work,
                    migrations: pr.migrations,
                    bulk_migrations: pr.bulk_migrations,
                }
            })
            .collect();
        RunOutcome {
            balancer: self.cfg.balancer,
            end,
            peers: self
                .peers
                .iter()
                .map(|p| PeerOutcome {
                    factor: p.factor,
                    available: p.available,
                    utilized: p.utilized,
                    max_running: p.max_running,
                })
                .collect(),
            jobs: self
                .cfg
                .jobs
                .iter()
                .zip(&self.jobs)
                .map(|(job, st)| JobOutcome {
                    job: *job,
                    admitted: st.admitted,
                    finished: st.finished,
                })
                .collect(),
            processes,
            admissions: self.admissions,
            events,
        }
    }
}
