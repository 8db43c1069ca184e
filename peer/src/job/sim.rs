//! The whole-job simulator (issue 17): several peers' real [`Machine`]s,
//! a model of the supernode's decisions, a deterministic process model in
//! place of wasm, a seeded network that delays frames, breaks connections
//! and loses what was in flight, peers that are killed, and virtual time.
//! One seed gives one fault schedule and, run again, the same run exactly.
//!
//! After every input the machines' retention invariants are checked; at
//! the end the job's output must equal the failure-free output (computed by
//! a direct BSP model of the same processes), every process must have seen
//! each message exactly once, and the job must have finished (liveness:
//! faults stop early enough for it to).
//!
//! `cargo test -p bspweb-peer --release --lib job::sim` runs
//! [`CI_SCHEDULES`] schedules; `BSPWEB_SIM_SCHEDULES=1000000` makes it a
//! soak (`scripts/sim-soak`), and `BSPWEB_SIM_SEED=…` replays one schedule.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bsp_api::control::{JobAssignment, JobPeer, PeerEvent, Stream};
use bsp_api::rest::JobLimits;
use bsp_api::wire::{Frame, WireMessage};
use bsp_api::{JobId, PeerId, Pid};
use bytes::Bytes;

use super::assignment::check_assignment;
use super::errors::{FetchError, Source};
use super::machine::{
    CaptureInput, CaptureRequest, Downloaded, Early, Flow, Guest, Input, JobIo, Limits, Machine,
    Proc, ProgramEvent, Resources, Setup, Task, capture, wire_messages,
};
use crate::checkpoint::{PAGE_SIZE, PageTracker, Snapshot};
use crate::net::{self, Inbound, Outgoing};
use crate::observe::Acc;
use crate::relay::BroadcastPolicy;
use crate::runtime::{Message, Outcome};

/// Schedules one `cargo test` runs.
pub(crate) const CI_SCHEDULES: u64 = 10_000;

const JOB: JobId = 1;

/// SplitMix64: the simulator's only source of choices.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// True with probability `num / den`.
    pub(crate) fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next() % den < num
    }
}

fn mix(a: u64, b: u64) -> u64 {
    let mut r = Rng::new(a ^ b.rotate_left(17) ^ 0x5151_5151);
    r.next()
}

/// The process model: a deterministic state function of its inbox. Each
/// superstep it folds the messages it got into its state, writes one output
/// line, and sends every other process one message (none in the last).
#[derive(Debug, Clone)]
pub(crate) struct FakeGuest {
    pid: Pid,
    nprocs: u32,
    /// The superstep it returns in.
    last: u32,
    superstep: u32,
    acc: u64,
    output_seq: u64,
    output_mark: u64,
    inbox: Vec<Message>,
}

/// What a superstep of the model gives: whether it returned, the output
/// line, the messages.
struct Step {
    exited: bool,
    line: String,
    out: Vec<crate::runtime::Outgoing>,
    /// What was wrong with its inbox, if anything.
    wrong: Option<String>,
}

impl FakeGuest {
    fn new(pid: Pid, nprocs: u32, last: u32) -> FakeGuest {
        FakeGuest {
            pid,
            nprocs,
            last,
            superstep: 0,
            acc: mix(u64::from(pid), 7),
            output_seq: 0,
            output_mark: 0,
            inbox: Vec::new(),
        }
    }

    /// Back from a snapshot it took.
    fn restored(s: &Snapshot, nprocs: u32, last: u32) -> FakeGuest {
        let word = |i: usize| u64::from_le_bytes(s.memory[i * 8..i * 8 + 8].try_into().unwrap());
        FakeGuest {
            pid: s.pid,
            nprocs,
            last,
            superstep: s.superstep,
            acc: word(0),
            output_seq: s.output_seq,
            output_mark: 0,
            inbox: Vec::new(),
        }
    }

    /// Its linear memory: the state in page 0, and a page that changes
    /// every other superstep (so checkpoints are deltas of one or two pages).
    fn memory(&self) -> Vec<u8> {
        let mut m = vec![0u8; 2 * PAGE_SIZE];
        m[0..8].copy_from_slice(&self.acc.to_le_bytes());
        m[8..16].copy_from_slice(&self.output_seq.to_le_bytes());
        let fill = (mix(self.acc, u64::from(self.superstep / 2)) & 0xff) as u8;
        m[PAGE_SIZE..PAGE_SIZE + 64].fill(fill.max(1));
        m
    }

    /// Its current superstep, as the model computes it.
    fn step(&mut self) -> Step {
        let s = self.superstep;
        let mut wrong = None;
        if s > 0 {
            let mut from: Vec<Pid> = self.inbox.iter().map(|m| m.src).collect();
            from.sort_unstable();
            let expected: Vec<Pid> = (0..self.nprocs).filter(|&p| p != self.pid).collect();
            if from != expected || self.inbox.iter().any(|m| m.superstep != s - 1) {
                wrong = Some(format!(
                    "pid {} in superstep {s} got messages from {from:?} (supersteps {:?}), not one from each of {expected:?} sent in {}",
                    self.pid,
                    self.inbox.iter().map(|m| m.superstep).collect::<Vec<_>>(),
                    s - 1
                ));
            }
        }
        self.acc = fold(
            self.acc,
            s,
            self.inbox.iter().map(|m| (m.src, &m.payload[..])),
        );
        let line = format!("{} {s} {:016x}\n", self.pid, self.acc);
        let exited = s >= self.last;
        let out = if exited {
            Vec::new()
        } else {
            (0..self.nprocs)
                .filter(|&d| d != self.pid)
                .enumerate()
                .map(|(i, dst)| crate::runtime::Outgoing {
                    dst,
                    seq: i as u32,
                    tag: 0,
                    payload: Bytes::from(payload(self.acc, dst)),
                })
                .collect()
        };
        Step {
            exited,
            line,
            out,
            wrong,
        }
    }
}

/// The state after superstep `s` with these messages (by sender).
fn fold<'a>(acc: u64, s: u32, inbox: impl Iterator<Item = (Pid, &'a [u8])>) -> u64 {
    let mut sorted: Vec<(Pid, &[u8])> = inbox.collect();
    sorted.sort();
    let mut acc = mix(acc, u64::from(s));
    for (src, p) in sorted {
        let word = u64::from_le_bytes(p[..8].try_into().unwrap_or([0; 8]));
        acc = mix(acc, word ^ u64::from(src));
    }
    acc
}

fn payload(acc: u64, dst: Pid) -> Vec<u8> {
    let mut v = mix(acc, u64::from(dst) + 1).to_le_bytes().to_vec();
    v.extend_from_slice(&[dst as u8; 8]);
    v
}

/// The failure-free output of `nprocs` model processes: each one's lines.
fn reference(nprocs: u32, last: u32) -> Vec<Vec<String>> {
    let mut acc: Vec<u64> = (0..nprocs).map(|p| mix(u64::from(p), 7)).collect();
    let mut lines = vec![Vec::new(); nprocs as usize];
    let mut inbox: Vec<Vec<(Pid, Vec<u8>)>> = vec![Vec::new(); nprocs as usize];
    for s in 0..=last {
        let mut next: Vec<Vec<(Pid, Vec<u8>)>> = vec![Vec::new(); nprocs as usize];
        for p in 0..nprocs {
            let i = p as usize;
            acc[i] = fold(acc[i], s, inbox[i].iter().map(|(src, b)| (*src, &b[..])));
            lines[i].push(format!("{p} {s} {:016x}\n", acc[i]));
            if s < last {
                for d in (0..nprocs).filter(|&d| d != p) {
                    next[d as usize].push((p, payload(acc[i], d)));
                }
            }
        }
        inbox = next;
    }
    lines
}

impl Guest for FakeGuest {
    fn begin_superstep(&mut self, superstep: u32, inbox: Vec<Message>) {
        self.superstep = superstep;
        self.inbox = inbox;
    }

    fn output_mark(&self) -> u64 {
        self.output_mark
    }

    fn checkpoint(
        &mut self,
        tracker: &mut PageTracker,
        outbox: Vec<WireMessage>,
        exited: bool,
        reuse: Option<Snapshot>,
    ) -> Snapshot {
        let head = Snapshot {
            pid: self.pid,
            superstep: self.superstep,
            memory: Vec::new(),
            globals: Vec::new(),
            output_seq: self.output_seq,
            output_bytes: 0,
            exited,
            outbox,
            hash: [0; 32],
        };
        let memory = self.memory();
        match reuse {
            Some(previous) => tracker.capture_reusing(head, &memory, previous),
            None => tracker.capture(head, &memory),
        }
    }
}

/// What a machine asked of the world, in order.
enum Effect {
    Open(PeerId),
    Close(PeerId),
    Send(PeerId, Outgoing),
    Start(Pid, bool, u32),
    Resume(Pid, Proc<FakeGuest>, Option<CaptureInput>),
    Capture(Pid, Proc<FakeGuest>, CaptureRequest),
    Restore(Pid, Arc<Snapshot>, Option<u32>),
    Download,
    Assemble(Vec<u8>, usize),
}

/// [`JobIo`] of one simulated peer: it records what the machine asks for;
/// the [`World`] carries it out.
pub(crate) struct SimIo {
    effects: Vec<Effect>,
    /// Events not yet uploaded, with their marks.
    queue: Vec<(u64, PeerEvent)>,
    emitted: u64,
    delivered: u64,
    held: u64,
    killed: bool,
}

impl SimIo {
    fn new() -> SimIo {
        SimIo {
            effects: Vec::new(),
            queue: Vec::new(),
            emitted: 0,
            delivered: 0,
            held: 0,
            killed: false,
        }
    }
}

impl JobIo for SimIo {
    type Guest = FakeGuest;
    type Program = ();

    fn emit(&mut self, event: PeerEvent) -> u64 {
        self.emitted += 1;
        self.queue.push((self.emitted, event));
        self.emitted
    }

    fn delivered(&self) -> u64 {
        self.delivered
    }

    fn open_link(&mut self, peer: PeerId, _addr: &str, _epoch: u64) {
        self.effects.push(Effect::Open(peer));
    }

    fn close_link(&mut self, peer: PeerId) {
        self.effects.push(Effect::Close(peer));
    }

    fn send(&mut self, peer: PeerId, frame: Outgoing) {
        self.effects.push(Effect::Send(peer, frame));
    }

    fn start(&mut self, pid: Pid, redundant: bool, checkpoint_every: u32) {
        self.effects
            .push(Effect::Start(pid, redundant, checkpoint_every));
    }

    fn resume(
        &mut self,
        pid: Pid,
        _superstep: u32,
        p: Proc<FakeGuest>,
        capture: Option<CaptureInput>,
    ) {
        self.effects.push(Effect::Resume(pid, p, capture));
    }

    fn capture(&mut self, pid: Pid, p: Proc<FakeGuest>, c: CaptureRequest) {
        self.effects.push(Effect::Capture(pid, p, c));
    }

    fn restore(&mut self, pid: Pid, snapshot: Arc<Snapshot>, digests: Option<u32>) {
        self.effects.push(Effect::Restore(pid, snapshot, digests));
    }

    fn kill(&mut self) {
        self.killed = true;
    }

    fn cached_program(&self) -> Option<((), Bytes)> {
        None
    }

    fn start_download(&mut self) {
        self.effects.push(Effect::Download);
    }

    fn assemble(&mut self, bundle: Vec<u8>, split: usize) {
        self.effects.push(Effect::Assemble(bundle, split));
    }

    fn program_ready(&mut self, _program: (), _resources: Resources) {}

    fn update_peers(&mut self, _peers: &[PeerId]) {}

    fn set_held(&mut self, bytes: u64) {
        self.held = bytes;
    }

    fn over_budget(&self) -> Option<String> {
        None
    }

    fn count_checkpoint(&mut self, _bytes: u64) {}

    fn publish_observations(
        &mut self,
        _taken: BTreeMap<PeerId, Acc>,
        _hosted: &dyn Fn(PeerId) -> u32,
        _since_ms: u64,
        _waiting_for: Vec<Pid>,
    ) {
    }
}

/// Something due at a time.
enum Event {
    /// A frame arrives over the connection `from → to` opened as `conn`
    /// (`None`: the connection is established).
    Frame {
        from: PeerId,
        to: PeerId,
        conn: u64,
        frame: Option<Frame>,
    },
    /// A data-plane event for `peer` (a connection broke).
    Inbound(PeerId, Inbound),
    /// A process's superstep ends (`Resume` or `Start`).
    Resumed(PeerId, Pid, Box<Proc<FakeGuest>>, Option<CaptureInput>),
    /// A capture, restore or early report is back.
    Task(PeerId, Task<FakeGuest>),
    Program(PeerId, ProgramEvent<()>),
    /// The peer's reporter uploads what it emitted so far.
    Upload(PeerId),
    Timer(PeerId),
    Assign(PeerId, Box<JobAssignment>),
    /// Faults.
    Kill(PeerId),
    Cut(PeerId, PeerId),
    Migrate(Pid),
    /// The supernode notices that `peer` is gone.
    Detect(PeerId),
}

impl Event {
    fn summary(&self) -> String {
        match self {
            Event::Frame {
                from, to, frame, ..
            } => {
                let f = match frame {
                    Some(f) => format!("{f:?}"),
                    None => "connected".into(),
                };
                let f: String = f.chars().take(120).collect();
                format!("frame {from} -> {to}: {f}")
            }
            Event::Inbound(p, i) => format!("peer {p}: {i:?}"),
            Event::Resumed(p, pid, proc_, c) => format!(
                "peer {p}: pid {pid} superstep {} ends{}",
                proc_.process.superstep,
                if c.is_some() { " (captured)" } else { "" }
            ),
            Event::Task(p, t) => match t {
                Task::Resumed(pid, _) => format!("peer {p}: pid {pid} resumed"),
                Task::Captured(pid, r) => format!(
                    "peer {p}: pid {pid} captured {:?}",
                    r.as_ref().map(|(_, s, _)| s.superstep).ok()
                ),
                Task::Restored(pid, s, _) => {
                    format!("peer {p}: pid {pid} restored from {}", s.superstep)
                }
            },
            Event::Program(p, _) => format!("peer {p}: program"),
            Event::Upload(p) => format!("peer {p}: upload"),
            Event::Timer(p) => format!("peer {p}: timer"),
            Event::Assign(p, a) => format!(
                "peer {p}: assignment epoch {} peers {:?} placement {:?} restore {:?}",
                a.epoch,
                a.peers.iter().map(|p| p.id).collect::<Vec<_>>(),
                a.placement,
                a.restore
            ),
            Event::Kill(p) => format!("KILL peer {p}"),
            Event::Cut(a, b) => format!("CUT {a} -> {b}"),
            Event::Migrate(pid) => format!("MIGRATE pid {pid}"),
            Event::Detect(p) => format!("supernode: peer {p} is gone"),
        }
    }
}

/// One direction of a connection between two peers.
#[derive(Debug, Default, Clone, Copy)]
struct Conn {
    /// Increases with every (re)opening.
    id: u64,
    /// Frames of connections up to this one are lost (it broke).
    broken: u64,
    /// The connection is to a live peer (else frames go nowhere).
    up: bool,
    /// When its last frame arrives: frames keep their order.
    last_at: u64,
}

struct SimPeer {
    /// Its machine, once it was given the job (and until it is killed).
    m: Option<Machine<SimIo>>,
    alive: bool,
    /// Incarnation: events of a killed peer are dropped.
    life: u32,
    /// Frames that arrived before its machine started (or knew their
    /// sender).
    early_frames: Vec<(PeerId, Inbound)>,
    upload_due: bool,
    timer_at: Option<u64>,
}

/// The parameters of one schedule, drawn from its seed.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) peers: u32,
    pub(crate) spares: u32,
    pub(crate) nprocs: u32,
    pub(crate) last: u32,
    pub(crate) checkpoint_every: u32,
    pub(crate) robber: bool,
    pub(crate) kill: Option<(u64, PeerId)>,
    pub(crate) cuts: Vec<(u64, PeerId, PeerId)>,
    pub(crate) migrate: Option<(u64, Pid)>,
    /// Largest network delay, ms.
    pub(crate) jitter: u64,
}

impl Plan {
    pub(crate) fn from_seed(seed: u64) -> Plan {
        let mut r = Rng::new(seed ^ 0xfeed);
        let peers = r.range(2, 4) as u32;
        let nprocs = r.range(2, 5) as u32;
        let last = r.range(3, 8) as u32;
        let checkpoint_every = if r.chance(3, 4) {
            1
        } else {
            r.range(2, 3) as u32
        };
        let horizon = 40 * u64::from(last);
        let kill = (peers >= 2 && r.chance(1, 2))
            .then(|| (r.range(1, horizon), r.range(1, u64::from(peers)) as PeerId));
        let cuts = (0..r.range(0, 4))
            .map(|_| {
                let a = r.range(1, u64::from(peers)) as PeerId;
                let b = r.range(1, u64::from(peers)) as PeerId;
                (r.range(1, horizon), a, b)
            })
            .filter(|(_, a, b)| a != b)
            .collect();
        let migrate = r.chance(1, 4).then(|| {
            (
                r.range(1, horizon),
                r.range(0, u64::from(nprocs) - 1) as Pid,
            )
        });
        Plan {
            peers,
            spares: 1,
            nprocs,
            last,
            checkpoint_every,
            robber: r.chance(1, 2),
            kill,
            cuts,
            migrate,
            jitter: r.range(1, 20),
        }
    }
}

/// The simulated job: peers, network, supernode.
pub(crate) struct World {
    seed: u64,
    rng: Rng,
    now: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), Event>,
    peers: BTreeMap<PeerId, SimPeer>,
    conns: BTreeMap<(PeerId, PeerId), Conn>,
    plan: Plan,
    program: Vec<u8>,
    /// The supernode's view: the current assignment.
    assignment: JobAssignment,
    /// Peers it knows are gone.
    gone: BTreeSet<PeerId>,
    /// When each peer gets its last command.
    assign_at: BTreeMap<PeerId, u64>,
    /// Output lines it got, per pid and sequence number.
    output: BTreeMap<Pid, BTreeMap<u64, String>>,
    exited: BTreeSet<Pid>,
    /// What went wrong (the first violation ends the run).
    violation: Option<String>,
    /// Everything that happened, hashed: equal for equal seeds.
    pub(crate) trace: u64,
    pub(crate) restores: u32,
    /// Print every event (`BSPWEB_SIM_TRACE=1`).
    verbose: bool,
}

/// How a schedule ended.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) trace: u64,
    pub(crate) restores: u32,
    pub(crate) finished_at: u64,
}

impl World {
    pub(crate) fn new(seed: u64) -> World {
        let plan = Plan::from_seed(seed);
        let mut rng = Rng::new(seed);
        let program: Vec<u8> = (0..20_000u32)
            .map(|i| (mix(seed, u64::from(i)) & 0xff) as u8)
            .collect();
        let ids: Vec<PeerId> = (1..=PeerId::from(plan.peers)).collect();
        let placement: Vec<u32> = (0..plan.nprocs).map(|p| p % plan.peers).collect();
        let assignment = JobAssignment {
            job: JOB,
            program_hash: "0".repeat(64),
            nprocs: plan.nprocs,
            args: "null".into(),
            seed: 7,
            limits: JobLimits {
                superstep_ms: 30_000,
                memory_mib: 16,
                output_mib: 16,
                checkpoint_every: plan.checkpoint_every,
                replicas: 2,
                redundancy: 1,
            },
            job_token: "0".repeat(64),
            placement,
            peers: ids.iter().map(|&id| peer_entry(id)).collect(),
            resources: vec![],
            epoch: 0,
            restore: vec![],
            migrate: vec![],
            program_bytes: if plan.robber { program.len() as u64 } else { 0 },
            resources_hash: String::new(),
            resources_bytes: 0,
        };
        let mut peers = BTreeMap::new();
        for id in 1..=PeerId::from(plan.peers + plan.spares) {
            peers.insert(
                id,
                SimPeer {
                    m: None,
                    alive: true,
                    life: 0,
                    early_frames: Vec::new(),
                    upload_due: false,
                    timer_at: None,
                },
            );
        }
        let mut w = World {
            seed,
            rng: Rng::new(rng.next()),
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            peers,
            conns: BTreeMap::new(),
            plan: plan.clone(),
            program,
            assignment,
            gone: BTreeSet::new(),
            assign_at: BTreeMap::new(),
            output: BTreeMap::new(),
            exited: BTreeSet::new(),
            violation: None,
            trace: seed,
            restores: 0,
            verbose: std::env::var_os("BSPWEB_SIM_TRACE").is_some(),
        };
        for &id in &ids {
            let d = w.rng.range(0, 5);
            let a = w.assignment.clone();
            w.at(d, Event::Assign(id, Box::new(a)));
        }
        if let Some((t, p)) = plan.kill {
            w.at(t, Event::Kill(p));
        }
        for &(t, a, b) in &plan.cuts {
            w.at(t, Event::Cut(a, b));
        }
        if let Some((t, pid)) = plan.migrate {
            w.at(t, Event::Migrate(pid));
        }
        w
    }

    fn at(&mut self, delay: u64, e: Event) {
        self.seq += 1;
        self.events.insert((self.now + delay, self.seq), e);
    }

    fn note(&mut self, what: u64) {
        self.trace = mix(self.trace, what ^ self.now.rotate_left(32));
    }

    fn violate(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(format!("at {} ms: {what}", self.now));
        }
    }

    /// Run the schedule to its end: the job finished, a violation, or the
    /// time limit (a liveness failure).
    pub(crate) fn run(mut self) -> Result<Finished, String> {
        let limit = 120_000;
        while let Some(((t, _), e)) = self.events.pop_first() {
            if self.violation.is_some() || self.exited.len() == self.plan.nprocs as usize {
                break;
            }
            if t > limit {
                let mut waiting = String::new();
                for (id, p) in &self.peers {
                    if let Some(m) = &p.m {
                        waiting.push_str(&format!("\n  peer {id}: {}", m.describe()));
                    }
                }
                self.violate(format!(
                    "the job did not finish within {limit} ms of virtual time (exited: {:?}){waiting}",
                    self.exited
                ));
                break;
            }
            self.now = t;
            self.step(e);
        }
        if let Some(v) = self.violation {
            return Err(v);
        }
        if self.exited.len() != self.plan.nprocs as usize {
            return Err(format!(
                "the job stopped with only {:?} exited",
                self.exited
            ));
        }
        let expected = reference(self.plan.nprocs, self.plan.last);
        for pid in 0..self.plan.nprocs {
            let got: Vec<String> = self
                .output
                .get(&pid)
                .map(|o| o.values().cloned().collect())
                .unwrap_or_default();
            let seqs: Vec<u64> = self
                .output
                .get(&pid)
                .map(|o| o.keys().copied().collect())
                .unwrap_or_default();
            let want_seqs: Vec<u64> = (0..expected[pid as usize].len() as u64).collect();
            if seqs != want_seqs || got != expected[pid as usize] {
                return Err(format!(
                    "pid {pid}'s output differs from the failure-free run: got records {seqs:?} {got:?}, expected {:?}",
                    expected[pid as usize]
                ));
            }
        }
        Ok(Finished {
            trace: self.trace,
            restores: self.restores,
            finished_at: self.now,
        })
    }

    fn alive(&self, id: PeerId) -> bool {
        self.peers.get(&id).is_some_and(|p| p.alive)
    }

    fn step(&mut self, e: Event) {
        if self.verbose {
            eprintln!("{:>6} ms  {}", self.now, e.summary());
        }
        match e {
            Event::Frame {
                from,
                to,
                conn,
                frame,
            } => {
                let c = self.conns.get(&(from, to)).copied().unwrap_or_default();
                if conn <= c.broken || !self.alive(to) {
                    return;
                }
                self.note(1 ^ (from as u64) << 8 ^ (to as u64) << 16);
                let p = self.peers.get_mut(&to).expect("a peer of the world");
                // Its listener admits a connection only from the job's
                // peers it knows of: the dialler retries until it does.
                let event = match frame {
                    Some(frame) => Inbound::Frame { from, frame },
                    None => Inbound::Connected { from },
                };
                if p.m.as_ref().is_none_or(|m| !m.has_peer(from)) {
                    p.early_frames.push((from, event));
                    return;
                }
                self.handle(to, Input::Inbound(event));
            }
            Event::Inbound(to, i) => {
                if self.alive(to) && self.peers[&to].m.is_some() {
                    self.note(2);
                    self.handle(to, Input::Inbound(i));
                }
            }
            Event::Resumed(peer, pid, p, capture) => self.resumed(peer, pid, *p, capture),
            Event::Task(peer, t) => {
                if self.alive(peer) {
                    self.note(3);
                    self.handle(peer, Input::Task(t));
                }
            }
            Event::Program(peer, e) => {
                if self.alive(peer) {
                    self.handle(peer, Input::Program(e));
                }
            }
            Event::Upload(peer) => self.upload(peer),
            Event::Timer(peer) => {
                let due = self.peers.get(&peer).and_then(|p| p.timer_at);
                if self.alive(peer) && due == Some(self.now) {
                    self.peers.get_mut(&peer).expect("checked").timer_at = None;
                    self.handle(peer, Input::Timer);
                }
            }
            Event::Assign(peer, a) => self.assign(peer, *a),
            Event::Kill(peer) => self.kill(peer),
            Event::Cut(a, b) => self.cut(a, b),
            Event::Migrate(pid) => self.migrate(pid),
            Event::Detect(peer) => self.detect(peer),
        }
    }

    /// Give `peer` its (first or newer) assignment.
    fn assign(&mut self, peer: PeerId, a: JobAssignment) {
        if !self.alive(peer) {
            return;
        }
        self.note(5 ^ a.epoch << 8);
        if self.peers[&peer].m.is_some() {
            self.handle(peer, Input::Assignment(Box::new(a)));
            self.admit(peer);
            return;
        }
        let hosts = match check_assignment(peer, &a) {
            Ok(h) => h,
            Err(e) => return self.violate(format!("peer {peer} refused its assignment: {e}")),
        };
        let setup = Setup {
            me: peer,
            limits: Limits {
                nprocs: a.nprocs,
                memory_limit: 16 << 20,
                outbox_limit: 32 << 20,
            },
            broadcast: BroadcastPolicy::default(),
        };
        let m = Machine::new(SimIo::new(), setup, &a, hosts);
        let p = self.peers.get_mut(&peer).expect("a peer of the world");
        p.m = Some(m);
        self.after(peer);
        self.admit(peer);
    }

    /// Frames that waited for `peer` to know their senders as the job's.
    fn admit(&mut self, peer: PeerId) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let Some(m) = &p.m else {
            return;
        };
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut p.early_frames)
            .into_iter()
            .partition(|(from, _)| m.has_peer(*from));
        p.early_frames = later;
        for (_, event) in now {
            self.handle(peer, Input::Inbound(event));
        }
    }

    /// Feed one input to `peer`'s machine, then carry out what it asked.
    fn handle(&mut self, peer: PeerId, input: Input<SimIo>) {
        let now = self.now;
        let Some(m) = self.peers.get_mut(&peer).and_then(|p| p.m.as_mut()) else {
            return;
        };
        if m.handle(input, now) == Flow::Leave {
            self.peers.get_mut(&peer).expect("checked").m = None;
            return;
        }
        self.after(peer);
    }

    /// Carry out the effects `peer`'s machine asked for, schedule its
    /// upload and timer, and check its invariants.
    fn after(&mut self, peer: PeerId) {
        let Some(m) = self.peers.get_mut(&peer).and_then(|p| p.m.as_mut()) else {
            return;
        };
        let effects = std::mem::take(&mut m.io_mut().effects);
        let uploads = !m.io().queue.is_empty();
        let timeout = m.poll_timeout();
        if let Err(e) = m.audit() {
            let state = m.describe();
            return self.violate(format!("peer {peer}: {e}\n  {state}"));
        }
        if m.io().killed {
            let why = m
                .io()
                .queue
                .iter()
                .find_map(|(_, e)| match e {
                    PeerEvent::ProcessFailed { reason, .. } => Some(reason.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            return self.violate(format!("the job failed on peer {peer}: {why}"));
        }
        for e in effects {
            self.effect(peer, e);
        }
        let p = self.peers.get_mut(&peer).expect("a peer of the world");
        if uploads && !p.upload_due {
            p.upload_due = true;
            let d = self.rng.range(1, 30);
            self.at(d, Event::Upload(peer));
        }
        let p = self.peers.get_mut(&peer).expect("a peer of the world");
        if p.timer_at.is_none_or(|t| t != timeout) && timeout >= self.now {
            p.timer_at = Some(timeout);
            let d = timeout - self.now;
            self.at(d, Event::Timer(peer));
        }
    }

    fn effect(&mut self, me: PeerId, e: Effect) {
        match e {
            Effect::Open(to) => {
                let up = self.alive(to);
                let c = self.conns.entry((me, to)).or_default();
                c.id += 1;
                c.up = up;
                if up {
                    self.transmit(me, to, None);
                }
            }
            Effect::Close(to) => {
                let c = self.conns.entry((me, to)).or_default();
                c.id += 1;
                c.up = false;
            }
            Effect::Send(to, frame) => {
                let frame = match frame {
                    Outgoing::Frame(f) => f,
                    Outgoing::Encoded(s) => match net::decode(s.to_bytes()) {
                        Ok(f) => f,
                        Err(e) => return self.violate(format!("a frame does not decode: {e}")),
                    },
                };
                self.transmit(me, to, Some(frame));
            }
            Effect::Start(pid, redundant, every) => {
                let p = Proc::new(
                    FakeGuest::new(pid, self.plan.nprocs, self.plan.last),
                    redundant,
                    every,
                );
                let d = self.rng.range(1, 10);
                self.at(d, Event::Resumed(me, pid, Box::new(p), None));
            }
            Effect::Resume(pid, p, capture) => {
                let d = self.rng.range(1, 10);
                self.at(d, Event::Resumed(me, pid, Box::new(p), capture));
            }
            Effect::Capture(pid, mut p, c) => {
                let r = capture(&mut p, c.outbox, c.exited, c.acks, &c.targets);
                let d = self.rng.range(0, 5);
                self.at(
                    d,
                    Event::Task(me, Task::Captured(pid, r.map(|(s, e)| (p, s, e)))),
                );
            }
            Effect::Restore(pid, snapshot, digests) => {
                let r = (!snapshot.exited).then(|| Proc {
                    process: FakeGuest::restored(&snapshot, self.plan.nprocs, self.plan.last),
                    tracker: PageTracker::seeded(&snapshot, digests),
                    recent: Default::default(),
                });
                self.restores += 1;
                let d = self.rng.range(0, 5);
                self.at(d, Event::Task(me, Task::Restored(pid, snapshot, Ok(r))));
            }
            Effect::Download => {
                let d = self.rng.range(1, 50);
                let bytes = Bytes::from(self.program.clone());
                self.at(
                    d,
                    Event::Program(
                        me,
                        ProgramEvent::Downloaded(Ok(Downloaded {
                            module: (),
                            bytes,
                            resources: Bytes::new(),
                        })),
                    ),
                );
            }
            Effect::Assemble(bundle, split) => {
                let ok = bundle[..split] == self.program[..];
                if !ok {
                    self.violate(format!("peer {me} assembled a wrong program by Robber"));
                }
                let r = if ok {
                    Ok(((), None))
                } else {
                    Err(FetchError::ResourcesHash(Source::OtherPeers))
                };
                let d = self.rng.range(1, 10);
                self.at(d, Event::Program(me, ProgramEvent::Assembled(r)));
            }
        }
    }

    /// Put `frame` on the connection `me → to` (`None`: its opening),
    /// after what is on it already.
    fn transmit(&mut self, me: PeerId, to: PeerId, frame: Option<Frame>) {
        let delay = self.rng.range(0, self.plan.jitter);
        let now = self.now;
        let c = self.conns.entry((me, to)).or_default();
        if !c.up {
            return;
        }
        let at = (now + delay).max(c.last_at);
        c.last_at = at;
        let conn = c.id;
        self.at(
            at - now,
            Event::Frame {
                from: me,
                to,
                conn,
                frame,
            },
        );
    }

    /// A process's superstep ran: it wrote its output line; with a capture
    /// its messages go to the machine at once, then the capture follows.
    fn resumed(
        &mut self,
        peer: PeerId,
        pid: Pid,
        mut p: Proc<FakeGuest>,
        capture_input: Option<CaptureInput>,
    ) {
        if !self.alive(peer) || self.peers[&peer].m.is_none() {
            return;
        }
        self.note(6 ^ u64::from(pid) << 8);
        let step = p.process.step();
        if let Some(w) = step.wrong {
            return self.violate(w);
        }
        let s = p.process.superstep;
        let Some(m) = self.peers.get_mut(&peer).and_then(|x| x.m.as_mut()) else {
            return;
        };
        let mark = m.io_mut().emit(PeerEvent::Output {
            job: JOB,
            pid,
            seq: p.process.output_seq,
            stream: Stream::Stdout,
            data: step.line,
        });
        p.process.output_seq += 1;
        p.process.output_mark = mark;
        let outcome = if step.exited {
            Outcome::Done
        } else {
            Outcome::Sync
        };
        let out = wire_messages(pid, s, step.out);
        match capture_input {
            None => self.handle(peer, Input::Task(Task::Resumed(pid, Ok((p, outcome, out))))),
            Some(c) => {
                let mut outbox = c.outbox;
                outbox.extend(out.iter().cloned());
                self.handle(
                    peer,
                    Input::Early(Early {
                        pid,
                        exited: step.exited,
                        out,
                    }),
                );
                let r = capture(&mut p, outbox, step.exited, Vec::new(), &c.targets);
                let d = self.rng.range(0, 5);
                self.at(
                    d,
                    Event::Task(peer, Task::Captured(pid, r.map(|(s, e)| (p, s, e)))),
                );
            }
        }
    }

    /// The reporter uploads everything `peer` emitted so far, in order.
    fn upload(&mut self, peer: PeerId) {
        if !self.alive(peer) {
            return;
        }
        let Some(m) = self.peers.get_mut(&peer).and_then(|p| p.m.as_mut()) else {
            return;
        };
        let events = std::mem::take(&mut m.io_mut().queue);
        if let Some((mark, _)) = events.last() {
            m.io_mut().delivered = *mark;
        }
        self.peers.get_mut(&peer).expect("checked").upload_due = false;
        for (_, e) in events {
            self.supernode(peer, e);
        }
        self.note(7);
        self.handle(peer, Input::OutputDelivered);
    }

    /// What the supernode makes of an event `peer` uploaded.
    fn supernode(&mut self, peer: PeerId, e: PeerEvent) {
        match e {
            PeerEvent::Output { pid, seq, data, .. } => {
                let o = self.output.entry(pid).or_default();
                match o.get(&seq) {
                    Some(old) if *old != data => {
                        let old = old.clone();
                        self.violate(format!(
                            "pid {pid}'s output record {seq} came as {old:?} and again as {data:?}"
                        ));
                    }
                    Some(_) => {}
                    None => {
                        o.insert(seq, data);
                    }
                }
            }
            PeerEvent::ProcessExited { pid, .. } => {
                self.exited.insert(pid);
            }
            PeerEvent::ProcessFailed { reason, pid, .. } => {
                self.violate(format!(
                    "peer {peer} failed the job (pid {pid:?}): {reason}"
                ));
            }
            PeerEvent::ProcessAborted { reason, pid, .. } => {
                self.violate(format!("pid {pid} aborted on peer {peer}: {reason}"));
            }
            _ => {}
        }
    }

    /// `peer` dies: its machine and everything it had not uploaded are
    /// gone, and its connections break.
    fn kill(&mut self, peer: PeerId) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if !p.alive || p.m.is_none() {
            return;
        }
        p.alive = false;
        p.m = None;
        p.life += 1;
        self.note(8);
        let others: Vec<PeerId> = self.peers.keys().copied().filter(|&o| o != peer).collect();
        for o in others {
            // What it had in flight is lost with it.
            if let Some(c) = self.conns.get_mut(&(peer, o)) {
                c.broken = c.id;
                if c.up {
                    c.up = false;
                    let d = self.rng.range(0, 5);
                    self.at(
                        d,
                        Event::Inbound(
                            o,
                            Inbound::Closed {
                                from: peer,
                                error: Some("reset".into()),
                            },
                        ),
                    );
                }
            }
            if let Some(c) = self.conns.get_mut(&(o, peer))
                && c.up
            {
                c.up = false;
                c.broken = c.id;
                let d = self.rng.range(0, 5);
                self.at(
                    d,
                    Event::Inbound(
                        o,
                        Inbound::SendFailed {
                            to: peer,
                            error: "connection reset".into(),
                        },
                    ),
                );
            }
        }
        // The supernode notices when its lease runs out (or sooner).
        let d = self.rng.range(200, 3000);
        self.at(d, Event::Detect(peer));
    }

    /// The connection `a → b` breaks: what was in flight is lost; `a`'s
    /// writer fails, `b` sees it close.
    fn cut(&mut self, a: PeerId, b: PeerId) {
        if !self.alive(a) || !self.alive(b) {
            return;
        }
        let Some(c) = self.conns.get_mut(&(a, b)) else {
            return;
        };
        if !c.up {
            return;
        }
        c.broken = c.id;
        c.up = false;
        self.note(9);
        let d = self.rng.range(0, 5);
        self.at(
            d,
            Event::Inbound(
                a,
                Inbound::SendFailed {
                    to: b,
                    error: "cut".into(),
                },
            ),
        );
        let d = self.rng.range(0, 5);
        self.at(
            d,
            Event::Inbound(
                b,
                Inbound::Closed {
                    from: a,
                    error: Some("cut".into()),
                },
            ),
        );
    }

    /// The supernode moves `pid` to another live peer of the job.
    fn migrate(&mut self, pid: Pid) {
        let a = &self.assignment;
        let from = a.placement[pid as usize] as usize;
        let to = (0..a.peers.len())
            .filter(|&i| i != from && self.alive(a.peers[i].id))
            .min_by_key(|&i| (mix(self.seed, i as u64), i));
        let Some(to) = to else {
            return;
        };
        let mut next = self.assignment.clone();
        next.placement[pid as usize] = to as u32;
        next.restore = vec![pid];
        next.migrate = vec![pid];
        self.publish(next);
    }

    /// The supernode declares `peer` gone and restores its processes on a
    /// spare peer or another peer of the job.
    fn detect(&mut self, peer: PeerId) {
        if !self.gone.insert(peer) {
            return;
        }
        let a = &self.assignment;
        let Some(gone) = a.peers.iter().position(|p| p.id == peer) else {
            return;
        };
        let mut peers: Vec<JobPeer> = a.peers.clone();
        peers.remove(gone);
        let mut placement: Vec<u32> = a.placement.clone();
        let lost: Vec<Pid> = (0..a.nprocs)
            .filter(|&p| placement[p as usize] as usize == gone)
            .collect();
        for i in placement.iter_mut() {
            if *i as usize > gone {
                *i -= 1;
            }
        }
        let spare = (1..=PeerId::from(self.plan.peers + self.plan.spares)).find(|id| {
            self.alive(*id) && !peers.iter().any(|p| p.id == *id) && !self.gone.contains(id)
        });
        let target = match spare {
            Some(s) if self.rng.chance(1, 2) => {
                peers.push(peer_entry(s));
                peers.len() - 1
            }
            _ => self.rng.range(0, peers.len() as u64 - 1) as usize,
        };
        for &pid in &lost {
            placement[pid as usize] = target as u32;
        }
        let mut next = self.assignment.clone();
        next.peers = peers;
        next.placement = placement;
        next.restore = lost;
        next.migrate = vec![];
        self.publish(next);
    }

    fn publish(&mut self, mut next: JobAssignment) {
        next.epoch = self.assignment.epoch + 1;
        self.note(10 ^ next.epoch << 8);
        self.assignment = next.clone();
        // Each peer's commands come in order (the supernode's queue).
        for p in &next.peers {
            let d = self.rng.range(1, 30);
            let at = self
                .assign_at
                .get(&p.id)
                .copied()
                .unwrap_or(0)
                .max(self.now + d);
            self.assign_at.insert(p.id, at);
            self.at(at - self.now, Event::Assign(p.id, Box::new(next.clone())));
        }
    }
}

fn peer_entry(id: PeerId) -> JobPeer {
    JobPeer {
        id,
        addr: format!("sim:{id}"),
        cluster: None,
    }
}

/// Run schedule `seed`.
pub(crate) fn run_schedule(seed: u64) -> Result<Finished, String> {
    World::new(seed).run()
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}"))
    })
}

/// The seeded schedules: `BSPWEB_SIM_SEED` replays one, else
/// `BSPWEB_SIM_SCHEDULES` (default [`CI_SCHEDULES`]) from
/// `BSPWEB_SIM_FIRST` (default 0) on. A failure names its seed.
#[test]
fn seeded_fault_schedules_keep_every_guarantee() {
    let seeds: Vec<u64> = match env_u64("BSPWEB_SIM_SEED") {
        Some(s) => vec![s],
        None => {
            let first = env_u64("BSPWEB_SIM_FIRST").unwrap_or(0);
            let n = env_u64("BSPWEB_SIM_SCHEDULES").unwrap_or(CI_SCHEDULES);
            (first..first + n).collect()
        }
    };
    let started = std::time::Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let restores = std::sync::atomic::AtomicU64::new(0);
    let done = std::sync::atomic::AtomicU64::new(0);
    let failures: std::sync::Mutex<Vec<(u64, String)>> = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (seeds, restores, done, failures) = (&seeds, &restores, &done, &failures);
            scope.spawn(move || {
                use std::sync::atomic::Ordering::Relaxed;
                for &seed in seeds.iter().skip(t).step_by(threads) {
                    if !failures.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
                        return;
                    }
                    match run_schedule(seed) {
                        Ok(o) => {
                            restores.fetch_add(u64::from(o.restores), Relaxed);
                        }
                        Err(e) => failures
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((seed, e)),
                    }
                    let n = done.fetch_add(1, Relaxed) + 1;
                    if n % 100_000 == 0 {
                        eprintln!(
                            "{n} schedules, {} restores, {:.0} s",
                            restores.load(Relaxed),
                            started.elapsed().as_secs_f64()
                        );
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    failures.sort();
    if let Some((seed, e)) = failures.first() {
        panic!(
            "schedule failed: {e}\n{:?}\nreplay it with BSPWEB_SIM_SEED={seed} (and BSPWEB_SIM_TRACE=1 for every event)",
            Plan::from_seed(*seed)
        );
    }
    eprintln!(
        "{} schedules passed ({} restores) in {:.1} s",
        seeds.len(),
        restores.into_inner(),
        started.elapsed().as_secs_f64()
    );
}

/// The same seed gives the same run, event for event.
#[test]
fn a_seed_replays_exactly() {
    for seed in [1, 17, 4242, 99_999] {
        let a = run_schedule(seed).expect("the schedule passes");
        let b = run_schedule(seed).expect("the schedule passes");
        assert_eq!(a.trace, b.trace, "seed {seed}");
        assert_eq!(a.finished_at, b.finished_at, "seed {seed}");
    }
}

/// The schedules do what they are for: some kill peers and restore
/// processes.
#[test]
fn schedules_restore_processes() {
    let restored: u32 = (0..200)
        .map(|s| run_schedule(s).map_or(0, |o| o.restores))
        .sum();
    assert!(restored > 20, "only {restored} restores in 200 schedules");
}
