//! The simulated world: each peer's `SimIo`, the network, the reporter's
//! uploads, the faults and the supernode's decisions, in virtual time.

use super::*;

mod faults;

/// What a machine asked of the world, in order.
enum Effect {
    Open(PeerId),
    Close(PeerId),
    Send(PeerId, Outgoing),
    Start(Pid, bool, u32),
    Resume(Pid, Proc<FakeGuest>, Option<CaptureInput>, bool),
    Capture(Pid, Proc<FakeGuest>, CaptureRequest),
    Restore(Pid, Arc<Snapshot>, Option<u32>),
    Download,
    Compile(Bytes),
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
        alone: bool,
    ) {
        self.effects.push(Effect::Resume(pid, p, capture, alone));
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

    fn compile(&mut self, bytes: Bytes) {
        self.effects.push(Effect::Compile(bytes));
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

    fn count_checkpoint(&mut self) {}

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
// Events are moved out of the queue once; a test's queue is small.
#[allow(clippy::large_enum_variant)]
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
    /// A peer's volunteer drains it.
    Drain(PeerId),
    /// The supernode notices that `peer` is gone.
    Detect(PeerId),
    /// The supernode's rebalance loop runs again.
    Rebalance,
    /// The supernode tells a peer to leave the job.
    KillJob(PeerId),
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
            Event::Drain(p) => format!("DRAIN peer {p}"),
            Event::Rebalance => "supernode: rebalance".into(),
            Event::KillJob(p) => format!("peer {p}: KillJob"),
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
    /// Its placements of the job, by slot, and the job's peers: what its
    /// decisions ([`placement::epochs`]) start from.
    rows: Vec<placement::epochs::Placed>,
    job_peers: Vec<PeerId>,
    /// Processes whose DHHT host changed, and to which peer.
    dhht: BTreeMap<Pid, PeerId>,
    /// Peers being drained.
    draining: BTreeSet<PeerId>,
    /// Whether a rebalance is scheduled.
    rebalance_due: bool,
    /// When each peer gets its last command.
    assign_at: BTreeMap<PeerId, u64>,
    /// Output lines it got, per pid and sequence number.
    output: BTreeMap<Pid, BTreeMap<u64, String>>,
    exited: BTreeSet<Pid>,
    /// Captures with replicas whose checkpoint frames have not left their
    /// peer yet: (peer, pid, superstep).
    unsent_captures: BTreeSet<(PeerId, Pid, u32)>,
    /// Peers that have sent a frame of the program's distribution.
    passed_on: BTreeSet<PeerId>,
    /// Supersteps that ran alone on their driver's thread.
    alone: u64,
    /// What went wrong (the first violation ends the run).
    violation: Option<String>,
    /// Everything that happened, hashed: equal for equal seeds.
    pub(crate) trace: u64,
    pub(crate) restores: u32,
    pub(crate) tally: Tally,
    /// Print every event (`BSPWEB_SIM_TRACE=1`).
    verbose: bool,
}

/// How a schedule ended.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) trace: u64,
    pub(crate) restores: u32,
    pub(crate) tally: Tally,
    pub(crate) finished_at: u64,
    /// Supersteps that ran alone on their driver's thread.
    pub(crate) alone: u64,
}

/// What the supernode's decisions did in a schedule.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    /// Epochs that migrate processes.
    pub(crate) migrations: u32,
    /// Processes restored where they were migrating to (the old host was
    /// lost before the handover).
    pub(crate) in_place: u32,
    /// Peers that joined the job in a later epoch.
    pub(crate) joined: u32,
    /// Drained peers that left the job.
    pub(crate) drained: u32,
    /// Acknowledgements of checkpoints sent in frames of their own.
    pub(crate) acks_alone: u32,
    /// Acknowledgements of checkpoints that rode with a `Done`.
    pub(crate) acks_riding: u32,
    /// Downloaded programs compiled.
    pub(crate) compiles: u32,
    /// Of those, compiled by a peer that had sent no frame of the
    /// program's distribution yet.
    pub(crate) compiles_before_passing_on: u32,
}

impl Tally {
    pub(crate) fn add(&mut self, o: Tally) {
        self.migrations += o.migrations;
        self.in_place += o.in_place;
        self.joined += o.joined;
        self.drained += o.drained;
        self.acks_alone += o.acks_alone;
        self.acks_riding += o.acks_riding;
        self.compiles += o.compiles;
        self.compiles_before_passing_on += o.compiles_before_passing_on;
    }
}

/// The job's `replicas`: each checkpoint is kept on three peers.
const REPLICAS: u32 = 2;

impl World {
    pub(crate) fn new(seed: u64) -> World {
        World::with_plan(seed, Plan::from_seed(seed))
    }

    /// The world of schedule `seed` with its parameters replaced by `plan`.
    pub(crate) fn with_plan(seed: u64, plan: Plan) -> World {
        let mut rng = Rng::new(seed);
        let program: Vec<u8> = (0..20_000u32)
            .map(|i| (mix(seed, u64::from(i)) & 0xff) as u8)
            .collect();
        // The hosts, then replica-only peers up to `replicas + 1`, as the
        // supernode places a job.
        let mut ids: Vec<PeerId> = (1..=PeerId::from(plan.peers)).collect();
        placement::epochs::top_up(
            &mut ids,
            REPLICAS,
            PeerId::from(plan.peers) + 1..=PeerId::from(plan.peers + plan.spares),
        );
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
                replicas: REPLICAS,
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
        let rows = (0..plan.nprocs)
            .map(|pid| placement::epochs::Placed {
                pid,
                peer: ids[(pid % plan.peers) as usize],
                position: u64::from(pid),
                moved_epoch: None,
                moved_from: None,
                moved_kind: None,
                handed_over: false,
            })
            .collect();
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
            rows,
            job_peers: ids.clone(),
            dhht: BTreeMap::new(),
            draining: BTreeSet::new(),
            rebalance_due: false,
            assign_at: BTreeMap::new(),
            output: BTreeMap::new(),
            exited: BTreeSet::new(),
            unsent_captures: BTreeSet::new(),
            passed_on: BTreeSet::new(),
            alone: 0,
            violation: None,
            trace: seed,
            restores: 0,
            tally: Tally::default(),
            verbose: std::env::var_os("BSPWEB_SIM_TRACE").is_some(),
        };
        for &id in &ids {
            let d = w.rng.range(0, 5);
            let a = w.assignment.clone();
            w.at(d, Event::Assign(id, Box::new(a)));
        }
        for &(t, p) in &plan.kills {
            w.at(t, Event::Kill(p));
        }
        for &(t, a, b) in &plan.cuts {
            w.at(t, Event::Cut(a, b));
        }
        if let Some((t, pid)) = plan.migrate {
            w.at(t, Event::Migrate(pid));
        }
        if let Some((t, peer)) = plan.drain {
            w.at(t, Event::Drain(peer));
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

    /// `pid` starts afresh on `peer`: its earlier captures there are no
    /// longer its own.
    fn forget_captures(&mut self, peer: PeerId, pid: Pid) {
        self.unsent_captures
            .retain(|&(p, q, _)| (p, q) != (peer, pid));
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
        let expected = reference(
            self.plan.nprocs,
            self.plan.last,
            self.plan.broadcast.is_some(),
        );
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
            tally: self.tally,
            finished_at: self.now,
            alone: self.alone,
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
            Event::Drain(peer) => self.drain(peer),
            Event::Rebalance => {
                self.rebalance_due = false;
                self.rebalance();
            }
            Event::KillJob(peer) => self.kill_job(peer),
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
            broadcast: match self.plan.broadcast {
                Some(algorithm) => BroadcastPolicy {
                    algorithm,
                    min_bytes: 0,
                    chunk: 0,
                },
                None => BroadcastPolicy::default(),
            },
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
                let frames = match frame {
                    Outgoing::Frame(f) => vec![f],
                    // Made here, as the connection's writer makes them.
                    Outgoing::Deferred(d) => {
                        let made = d.segments().map(|segments| {
                            segments
                                .iter()
                                .map(|s| net::decode(s.to_bytes()))
                                .collect::<Result<Vec<_>, _>>()
                        });
                        match made {
                            Ok(Ok(frames)) => frames,
                            Ok(Err(e)) | Err(e) => {
                                return self.violate(format!("a frame does not decode: {e}"));
                            }
                        }
                    }
                };
                for frame in frames {
                    match &frame {
                        Frame::Checkpoint(c) => {
                            self.unsent_captures.remove(&(me, c.pid, c.superstep));
                        }
                        Frame::CheckpointAck { ok: true, .. } => self.tally.acks_alone += 1,
                        Frame::Done { acks, .. } => {
                            self.tally.acks_riding += u32::try_from(acks.len()).unwrap_or(u32::MAX);
                        }
                        Frame::Program { .. } => {
                            self.passed_on.insert(me);
                        }
                        _ => {}
                    }
                    self.transmit(me, to, Some(frame));
                }
            }
            Effect::Start(pid, redundant, every) => {
                self.forget_captures(me, pid);
                let p = Proc::new(
                    FakeGuest::new(
                        pid,
                        self.plan.nprocs,
                        self.plan.last,
                        self.plan.broadcast.is_some(),
                    ),
                    redundant,
                    every,
                );
                let d = self.rng.range(1, 10);
                self.at(d, Event::Resumed(me, pid, Box::new(p), None));
            }
            Effect::Resume(pid, p, capture, alone) => {
                // A superstep that runs alone holds its driver until it
                // ends: the job must have no other process, and the
                // checkpoints it may send must have left already.
                if alone && self.plan.nprocs != 1 {
                    return self.violate(format!(
                        "pid {pid} of {} runs alone on peer {me}",
                        self.plan.nprocs
                    ));
                }
                if alone
                    && let Some((_, _, s)) = self
                        .unsent_captures
                        .range((me, pid, 0)..=(me, pid, u32::MAX))
                        .next()
                {
                    return self.violate(format!(
                        "pid {pid} runs alone on peer {me} before its checkpoint of superstep {s} left"
                    ));
                }
                self.alone += u64::from(alone);
                let d = self.rng.range(1, 10);
                self.at(d, Event::Resumed(me, pid, Box::new(p), capture));
            }
            Effect::Capture(pid, mut p, c) => {
                let r = capture(&mut p, c.outbox, c.exited, c.acks, &c.targets);
                if let Ok((snapshot, _)) = &r
                    && !c.targets.is_empty()
                {
                    self.unsent_captures.insert((me, pid, snapshot.superstep));
                }
                let d = self.rng.range(0, 5);
                self.at(
                    d,
                    Event::Task(me, Task::Captured(pid, r.map(|(s, e)| (p, s, e)))),
                );
            }
            Effect::Restore(pid, snapshot, digests) => {
                self.forget_captures(me, pid);
                let r = (!snapshot.exited).then(|| Proc {
                    process: FakeGuest::restored(
                        &snapshot,
                        self.plan.nprocs,
                        self.plan.last,
                        self.plan.broadcast.is_some(),
                    ),
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
                // Compiled from the cache, or from the supernode and still
                // to compile.
                let module = self.rng.chance(1, 2).then_some(());
                self.at(
                    d,
                    Event::Program(
                        me,
                        ProgramEvent::Downloaded(Ok(Downloaded {
                            module,
                            bytes,
                            resources: Bytes::new(),
                        })),
                    ),
                );
            }
            Effect::Compile(bytes) => {
                if bytes[..] != self.program[..] {
                    self.violate(format!("peer {me} compiles a wrong program"));
                }
                self.tally.compiles += 1;
                if !self.passed_on.contains(&me) {
                    self.tally.compiles_before_passing_on += 1;
                }
                let d = self.rng.range(1, 30);
                self.at(d, Event::Program(me, ProgramEvent::Compiled(Ok(()))));
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
                if let Ok((snapshot, _)) = &r
                    && !c.targets.is_empty()
                {
                    self.unsent_captures.insert((peer, pid, snapshot.superstep));
                }
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
}

fn peer_entry(id: PeerId) -> JobPeer {
    JobPeer {
        id,
        addr: format!("sim:{id}"),
        cluster: None,
    }
}
