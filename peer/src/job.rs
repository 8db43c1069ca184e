//! The job driver: runs this peer's share of a job superstep by superstep,
//! checkpoints every process, and restores or hands over processes when the
//! job's placement changes (DESIGN.md, Execution 2–7; docs/fault-tolerance.md).
//!
//! Per process and superstep: resume it (on blocking threads, at most
//! `slots` at once) until it syncs or returns; route what it sent (local
//! destinations straight into the [`Barrier`], remote ones in `Data` frames)
//! and retain it; at a checkpointed superstep capture its state and send it
//! to its replicas; once they all acknowledged (at once when the superstep is
//! not checkpointed), tell every peer `Done(pid, s)`; when the barrier says
//! the process has everything for `s`, give it its inbox and resume it.
//!
//! A new assignment (a higher epoch) changes the routing table; processes
//! that moved here are restored from the newest snapshot any peer holds, and
//! processes that moved away are handed over at their next sync. Everything
//! another peer may need again — messages and `Done`s since the newest
//! globally safe checkpoint — is retained and re-sent to a process's new
//! host, and to any peer whose connection broke and came back.
//!
//! The driver knows nothing about HTTP: it takes the assignment and the
//! compiled module, talks to other peers through [`crate::net`], and emits
//! [`PeerEvent`]s into a [`Reporter`].
//!
//! This file holds the job table ([`Jobs`]), the driver's state and its
//! event loop; `job/assignment` checks an assignment, `job/threads` is what
//! runs on a process's thread; the handlers live by sub-protocol in `job/`: `program_fetch`
//! (Robber or download, compile), `routing` (links, message routing, relayed
//! multicasts), `supersteps` (resumes, captures, the barrier's `pump`),
//! `replication` (checkpoints to replicas, handovers, retention), `restore`
//! (from the newest snapshot the job's peers hold), `inbound` (frames, and
//! the [`ProtocolError`]s that fail a job) and `epochs` (a new assignment).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bsp_api::control::{JobAssignment, PeerEvent};
use bsp_api::wire::{Frame, ProcDone, RelayHead, WireMessage, message_groups};
use bsp_api::{JobId, PeerId, Pid};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasmtime::Module;

use crate::barrier::Barrier;
use crate::checkpoint::{self, Assembled, Assembler, PageTracker, ReplicaStore, Snapshot};
use crate::net::{self, Dial, Inbound, Outgoing, Registry};
use crate::program;
use crate::relay::{self, BroadcastPolicy, DataStats, Inflight, RelayError, RelayKey, Site};
use crate::report::Reporter;
use crate::runtime::{JobInfo, Message, Outcome, Process, Runtime};

/// A frame another peer of the job sent that breaks the data-plane
/// protocol: the job fails with it (a local failure is never one of these).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error(transparent)]
    Barrier(#[from] crate::barrier::BarrierError),
    #[error(transparent)]
    Relay(#[from] RelayError),
    #[error("it asked for pid {0}, which does not exist")]
    NoSuchPid(Pid),
    #[error("a handshake frame is not allowed after the handshake")]
    HandshakeFrame,
    #[error("a link probe is not allowed on a job's connection")]
    ProbeFrame,
}

/// Target size of one `Data` frame's payloads.
const BATCH_BYTES: usize = 1 << 20;

/// Most messages in one `Data` frame (however small, or shared, their
/// payloads), well under what a receiver decodes
/// (`message_groups::MAX_MESSAGES`).
const BATCH_MESSAGES: usize = 1 << 16;

/// Job ids remembered after they ended, so a repeated `StartJob` is ignored.
const REMEMBER_ENDED: usize = 4096;

/// A job's program (compiled, and its bytes to pass on to other peers) and
/// its resources (`bsp_api::control::encode_resources` form; empty when the
/// assignment carries them or there are none).
pub struct Fetched {
    pub module: Module,
    pub bytes: bytes::Bytes,
    pub resources: bytes::Bytes,
}

/// Decoded resources, to replace the job's (none when they came inline).
type Resources = Option<Vec<(String, Vec<u8>)>>;

/// How the program is downloaded from the supernode when it must be.
type Download = std::pin::Pin<Box<dyn Future<Output = Result<Fetched, FetchError>> + Send>>;

/// What the tasks that get the program report.
enum ProgramEvent {
    /// The direct download (or the cache) answered.
    Downloaded(Result<Fetched, FetchError>),
    /// The bundle Robber assembled: the program compiled and the resources
    /// decoded (or why not).
    Assembled(Result<(Module, Resources), FetchError>),
}

/// What every job on this peer shares.
#[derive(Debug, Clone)]
pub struct JobEnv {
    /// The wasm engine and module cache.
    pub runtime: Arc<Runtime>,
    /// The data-plane listener's job table.
    pub registry: Arc<Registry>,
    /// Where events for the supernode go.
    pub reporter: Reporter,
    /// Processes resumed at once, across all jobs.
    pub slots: Arc<crate::slots::Slots>,
    /// Cap of the per-process memory limit, MiB.
    pub max_memory_mib: u32,
    /// Cap of the per-superstep time limit, ms.
    pub max_superstep_ms: u64,
    /// How long to keep dialing a peer of a job that does not answer (yet).
    pub connect_timeout: Duration,
    /// How `send_range` and `send_list` with large payloads travel.
    pub broadcast: BroadcastPolicy,
    /// Payload bytes sent, direct and relayed.
    pub stats: Arc<DataStats>,
}

struct Running {
    /// The identity (peer id) this peer runs the job under.
    me: PeerId,
    cancel: CancellationToken,
    epoch: u64,
    updates: mpsc::UnboundedSender<JobAssignment>,
}

#[derive(Default)]
struct Table {
    running: HashMap<JobId, Running>,
    /// Jobs that ended, per identity of this peer, with the last epoch
    /// seen: after a fence the peer logs in under a new id and may be given
    /// the same job again; a peer that left a job (drained) is given it
    /// again in a later epoch when it takes work again (resumed).
    ended: HashMap<(PeerId, JobId), u64>,
    ended_order: std::collections::VecDeque<(PeerId, JobId)>,
}

/// The jobs running on this peer.
pub struct Jobs {
    env: JobEnv,
    table: Mutex<Table>,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs")
            .field("running", &self.running())
            .finish_non_exhaustive()
    }
}

impl Jobs {
    /// No jobs yet.
    pub fn new(env: JobEnv) -> Arc<Jobs> {
        Arc::new(Jobs {
            env,
            table: Mutex::new(Table::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start this peer's share of a job (`me` is this peer's id), or hand a
    /// newer assignment (higher epoch) to the job already running.
    /// `download` fetches and compiles the program from the supernode (or
    /// the cache), or gives a reason it is unavailable; it runs only if the
    /// program does not reach this peer from the job's other peers
    /// ([`crate::program`]). Returns `None` if the job
    /// was already running (the assignment, if newer, was passed on) or ran
    /// before.
    pub fn start<F>(
        self: &Arc<Self>,
        me: PeerId,
        assignment: JobAssignment,
        download: F,
    ) -> Option<JoinHandle<()>>
    where
        F: Future<Output = Result<Fetched, FetchError>> + Send + 'static,
    {
        let job = assignment.job;
        let cancel = CancellationToken::new();
        let (updates_tx, updates) = mpsc::unbounded_channel();
        let mine = updates_tx.clone();
        {
            let mut t = self.lock();
            if let Some(r) = t.running.get_mut(&job) {
                // A driver that has ended (its cleanup is still under way)
                // cannot take the assignment: a newer one starts the job
                // afresh (a paused peer given the job again), the old
                // cleanup then leaves this run alone.
                let ended = r.updates.is_closed();
                if !(ended && r.me == me && assignment.epoch > r.epoch) {
                    if r.me == me && assignment.epoch > r.epoch {
                        r.epoch = assignment.epoch;
                        let _ = r.updates.send(assignment);
                    }
                    return None;
                }
                t.running.remove(&job);
            }
            if t.ended
                .get(&(me, job))
                .is_some_and(|&last| assignment.epoch <= last)
            {
                return None;
            }
            if !assignment.peers.iter().any(|p| p.id == me) {
                return None;
            }
            t.running.insert(
                job,
                Running {
                    me,
                    cancel: cancel.clone(),
                    epoch: assignment.epoch,
                    updates: updates_tx,
                },
            );
        }
        // Admit the other peers' connections at once; frames queue up until
        // the driver runs.
        let (tx, rx) = self.env.registry.register(
            job,
            &assignment.job_token,
            me,
            assignment.peers.iter().map(|p| p.id),
        );
        let inbound = tx.clone();
        let jobs = self.clone();
        Some(tokio::spawn(async move {
            let env = jobs.env.clone();
            run_job(
                env,
                me,
                assignment,
                Box::pin(download),
                tx,
                rx,
                updates,
                cancel,
            )
            .await;
            jobs.env.registry.unregister(job, &inbound);
            // The job's buffers are freed: let the machine have them back.
            let _ = tokio::task::spawn_blocking(crate::sysinfo::release_free_memory).await;
            let mut t = jobs.lock();
            // Unless a newer run of the job took over meanwhile.
            let Some(r) = t
                .running
                .get(&job)
                .filter(|r| r.updates.same_channel(&mine))
            else {
                return;
            };
            let last = r.epoch;
            t.running.remove(&job);
            if t.ended.insert((me, job), last).is_none() {
                t.ended_order.push_back((me, job));
                if t.ended_order.len() > REMEMBER_ENDED
                    && let Some(old) = t.ended_order.pop_front()
                {
                    t.ended.remove(&old);
                }
            }
        }))
    }

    /// Stop a job at once. Returns whether it was running.
    pub fn kill(&self, job: JobId) -> bool {
        match self.lock().running.get(&job) {
            Some(r) => {
                r.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Stop every job.
    pub fn kill_all(&self) {
        for r in self.lock().running.values() {
            r.cancel.cancel();
        }
    }

    /// This peer was declared gone (fenced): stop every job and forget them
    /// at once, so the same job can start again under the new identity the
    /// peer logs in with, while the old drivers are still shutting down.
    pub fn fence(&self) {
        for (_, r) in self.lock().running.drain() {
            r.cancel.cancel();
        }
    }

    /// The jobs currently running.
    pub fn running(&self) -> Vec<JobId> {
        let mut v: Vec<JobId> = self.lock().running.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

/// A process and what its checkpoints need, moved together between the
/// driver and blocking threads.
struct Proc {
    process: Process,
    tracker: PageTracker,
    /// The last snapshots `tracker` took (newest last, at most
    /// [`checkpoint::RECYCLE_DEPTH`]): the next capture recycles the memory
    /// buffer of one that nobody else holds any more (its replicas
    /// acknowledged it).
    recent: VecDeque<Arc<Snapshot>>,
}

enum State {
    /// A resume, capture or restore is running on a blocking thread.
    Busy,
    /// At sync of its current superstep, waiting for its barrier.
    AtSync(Box<Proc>),
    /// Returned from `main`.
    Exited,
    /// Waiting for the snapshots other peers hold.
    Fetching,
}

struct Local {
    state: State,
    /// The superstep it is in (or at the sync of).
    superstep: u32,
    /// Checkpoints not yet acknowledged by all their replicas (or whose
    /// output is not yet delivered), oldest first. Replication overlaps
    /// the next superstep, so there are at most two: `K_{s-1}` still in
    /// flight and `K_s` just taken (`Done(s + 1)` waits for `K_{s-1}`, so
    /// the barrier of `s + 1` cannot pass before it is safe).
    pending: VecDeque<Pending>,
    /// `Done`s not yet sent, ascending: `Done(s)` goes out once every
    /// checkpoint before `s` is safe ([`may_announce`]).
    held: Vec<(u32, ProcDone)>,
    /// With redundancy: the `Done` of a superstep being captured, which
    /// waits for the digest of the capture.
    unsigned: Option<(u32, ProcDone)>,
    /// An exit checkpoint is being taken at this superstep: its `Done`
    /// waits for it (nothing later would).
    capturing_exit: Option<u32>,
    /// The reporter mark of the `ProcessExited` event, once emitted.
    exit_mark: u64,
    /// Replicas' answers since the last capture, for its page tracker:
    /// (replica, superstep, ok).
    acks: Vec<(PeerId, u32, bool)>,
    /// Moves to another peer at its next sync.
    leaving: bool,
    /// A snapshot taken for the new host, while it has not asked yet.
    handover: Option<Arc<Snapshot>>,
}

impl Local {
    /// A process that just came to this peer, in `state`, before its first
    /// superstep here.
    fn new(state: State) -> Local {
        Local {
            state,
            superstep: 0,
            pending: VecDeque::new(),
            held: Vec::new(),
            unsigned: None,
            capturing_exit: None,
            exit_mark: 0,
            acks: Vec::new(),
            leaving: false,
            handover: None,
        }
    }
}

struct Pending {
    superstep: u32,
    waiting: HashSet<PeerId>,
    snapshot: Arc<Snapshot>,
    /// The process's own `Done` of `superstep` waits for this checkpoint
    /// too (an exit, after which nothing would wait for it, or a restored
    /// snapshot, which must be on the new replicas before the restored
    /// process repeats its `Done`s).
    gates_own: bool,
    /// The reporter mark of the process's last output record (and exit
    /// event) up to the checkpoint: that output must have reached the
    /// supernode before a replica holds the checkpoint, because a restore
    /// from it does not re-execute (so does not re-emit) that output. Until
    /// then the checkpoint is not sent (`unsent`), so a restore from
    /// whatever snapshot a replica holds loses no output. Other events
    /// (progress, status lines) are not waited for.
    output_mark: u64,
    /// Checkpoint frames per replica, waiting for the output to be
    /// delivered (and, with redundancy, for the copies to agree).
    unsent: Vec<(PeerId, Outgoing)>,
    /// The digest of the process's state in it
    /// ([`Snapshot::state_digest`]).
    digest: [u8; 32],
    /// A quorum of the process's copies agreed on `digest` (always, without
    /// redundancy): only then may a replica hold it, so every restore
    /// starts from a state the copies agreed on.
    agreed: bool,
}

struct Fetch {
    waiting: HashSet<PeerId>,
    best: Option<Arc<Snapshot>>,
}

struct Link {
    addr: String,
    writer: mpsc::UnboundedSender<Outgoing>,
    task: JoinHandle<()>,
    batch: Vec<WireMessage>,
    batch_bytes: usize,
}

impl Link {
    fn send(&self, frame: impl Into<Outgoing>) {
        // A closed writer reports its failure as `SendFailed`.
        let _ = self.writer.send(frame.into());
    }
}

/// A checkpoint's frames for each replica it was planned for, encoded by
/// the capture task (once per distinct plan: replicas with the same base
/// share the bytes).
type Encoded = Vec<(PeerId, Vec<net::Segments>)>;

/// What a process's thread says as soon as the guest reached a sync that
/// is checkpointed (or returned), before it captures the process there: the
/// messages it sent go out while the capture runs.
struct Early {
    pid: Pid,
    exited: bool,
    out: Vec<WireMessage>,
}

/// What a capture taken on the process's own thread right after its
/// superstep needs from the driver, fixed when the superstep starts.
struct CaptureInput {
    /// The retained outbox so far (the superstep's messages are added).
    outbox: Vec<WireMessage>,
    /// Who gets the checkpoint.
    targets: Vec<PeerId>,
    early: mpsc::UnboundedSender<Early>,
}

/// What a blocking task hands back.
enum Task {
    Resumed(Pid, Result<(Proc, Outcome), HostError>),
    Captured(Pid, Result<(Proc, Arc<Snapshot>, Encoded), HostError>),
    /// `None`: the snapshot is of a process that had exited.
    Restored(Pid, Arc<Snapshot>, Result<Option<Proc>, HostError>),
}

struct Driver {
    env: JobEnv,
    info: Arc<JobInfo>,
    /// The compiled program, once it is here.
    module: Option<Module>,
    /// Processes to start (fresh, restored) once the program is here.
    deferred: Option<(Vec<Pid>, Vec<Pid>)>,
    /// The direct download, until it is started (`None` after).
    download: Option<Download>,
    /// Robber spreading the program among the job's first peers.
    dist: Option<program::Distribution>,
    /// When the last piece of the program arrived (or Robber started).
    dist_progress: Instant,
    dist_started: Instant,
    program_tx: mpsc::UnboundedSender<ProgramEvent>,
    program_hash: String,
    /// The program's size, and the resources' hash (empty: none apart).
    program_bytes: u64,
    resources_hash: String,
    /// The program's and resources' size together (what Robber moves).
    dist_bytes: u64,
    job: JobId,
    me: PeerId,
    token: String,
    epoch: u64,
    checkpoint_every: u32,
    replicas: usize,
    /// Who runs each pid (each copy, with redundancy).
    hosts: Hosts,
    /// The job's peers (this one included), in assignment order.
    peers: Vec<PeerId>,
    links: HashMap<PeerId, Link>,
    barrier: Barrier,
    local: BTreeMap<Pid, Local>,
    /// Messages local processes sent in supersteps ≥ `safe`, per source.
    retained: BTreeMap<Pid, Vec<WireMessage>>,
    /// Bytes of `retained` ([`checkpoint::outbox_bytes`]).
    retained_bytes: u64,
    /// What this job adds to `env.stats.held` now.
    held: u64,
    /// `Done`s of local processes already sent, per (pid, superstep).
    dones: BTreeMap<(Pid, u32), ProcDone>,
    /// The newest superstep whose barrier is complete here.
    complete: Option<u32>,
    /// How the job's other peers keep up ([`crate::observe`]), with times
    /// in milliseconds since `observed_from`.
    observer: crate::observe::Observer,
    observed_from: Instant,
    /// The newest checkpointed superstep before `complete`: every process
    /// has a safe checkpoint at or after it, so nobody is ever restored from
    /// before it.
    safe: Option<u32>,
    store: ReplicaStore,
    assemblers: HashMap<PeerId, Assembler>,
    fetches: BTreeMap<Pid, Fetch>,
    /// Peers that asked for a snapshot of a local process (a handover).
    handovers: BTreeMap<Pid, BTreeSet<PeerId>>,
    tasks: JoinSet<Task>,
    /// [`Early`] reports of processes' threads.
    early_tx: mpsc::UnboundedSender<Early>,
    early_rx: mpsc::UnboundedReceiver<Early>,
    failed: bool,
    events_tx: mpsc::Sender<Inbound>,
    /// Where each peer of the job runs, for the broadcast rule.
    sites: HashMap<PeerId, Site>,
    /// Multicasts this peer sends or relays, in supersteps ≥ `safe` (a key
    /// may have several heads: a restored sender re-sends with another).
    relays: BTreeMap<RelayKey, Vec<Inflight>>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The job's memory goes with it.
        self.env.stats.held.fetch_sub(self.held, Ordering::Relaxed);
        self.env.runtime.budget().set_held(self.job, 0);
    }
}

/// Most heads one multicast may arrive with (each restore of its sender
/// can add one).
const MAX_HEADS: usize = 8;

#[allow(clippy::too_many_arguments)]
async fn run_job(
    env: JobEnv,
    me: PeerId,
    a: JobAssignment,
    download: Download,
    events_tx: mpsc::Sender<Inbound>,
    events: mpsc::Receiver<Inbound>,
    updates: mpsc::UnboundedReceiver<JobAssignment>,
    cancel: CancellationToken,
) {
    let job = a.job;
    tracing::trace!(target: "bspweb::timeline", job, me, "job assigned");
    let kill = Arc::new(AtomicBool::new(false));
    let setup = check_assignment(me, &a)
        .and_then(|hosts| job_info(&env, &a, kill.clone()).map(|info| (hosts, info)));
    let (hosts, info) = match setup {
        Ok(x) => x,
        Err(reason) => {
            env.reporter.emit(PeerEvent::ProcessFailed {
                job,
                pid: None,
                superstep: 0,
                reason: format!("invalid job assignment: {reason}"),
            });
            cancel.cancelled().await;
            return;
        }
    };
    let limit = info.outbox_limit;
    let nprocs = a.nprocs;
    let (program_tx, program_rx) = mpsc::unbounded_channel();
    let now = Instant::now();
    let (early_tx, early_rx) = mpsc::unbounded_channel();
    let mut d = Driver {
        env,
        info: Arc::new(info),
        module: None,
        deferred: None,
        download: Some(download),
        dist: None,
        dist_progress: now,
        dist_started: now,
        program_tx,
        program_hash: a.program_hash.clone(),
        program_bytes: a.program_bytes,
        resources_hash: a.resources_hash.clone(),
        dist_bytes: a.program_bytes.saturating_add(a.resources_bytes),
        job,
        me,
        token: a.job_token.clone(),
        epoch: a.epoch,
        checkpoint_every: a.limits.checkpoint_every.max(1),
        replicas: a.limits.replicas as usize,
        barrier: Barrier::with_quorum(nprocs, limit, hosts.copies()),
        hosts,
        peers: a.peers.iter().map(|p| p.id).collect(),
        links: HashMap::new(),
        local: BTreeMap::new(),
        retained: BTreeMap::new(),
        retained_bytes: 0,
        held: 0,
        dones: BTreeMap::new(),
        complete: None,
        observer: crate::observe::Observer::new(0),
        observed_from: Instant::now(),
        safe: None,
        store: ReplicaStore::new(),
        assemblers: HashMap::new(),
        fetches: BTreeMap::new(),
        handovers: BTreeMap::new(),
        tasks: JoinSet::new(),
        early_tx,
        early_rx,
        failed: false,
        events_tx,
        sites: sites_of(&a),
        relays: BTreeMap::new(),
    };
    d.elect();
    for p in &a.peers {
        if p.id != me {
            d.open_link(p.id, p.addr.clone());
        }
    }
    let restore: HashSet<Pid> = a.restore.iter().copied().collect();
    let mine: Vec<Pid> = d.hosts.pids_on(me);
    let (fresh, restored): (Vec<Pid>, Vec<Pid>) =
        mine.into_iter().partition(|p| !restore.contains(p));
    d.deferred = Some((fresh, restored));
    d.get_program(&a);
    d.run(events, updates, program_rx, cancel).await;
    d.env.stats.observed.forget(d.job);
    // Stop whatever still runs, close our connections.
    kill.store(true, Ordering::Relaxed);
    d.tasks.abort_all();
    for (_, l) in d.links.drain() {
        l.task.abort();
    }
}

impl Driver {
    async fn run(
        &mut self,
        mut events: mpsc::Receiver<Inbound>,
        mut updates: mpsc::UnboundedReceiver<JobAssignment>,
        mut program: mpsc::UnboundedReceiver<ProgramEvent>,
        cancel: CancellationToken,
    ) {
        let mut delivered = self.env.reporter.watch_delivered();
        let mut observe = tokio::time::interval(Duration::from_secs(1));
        observe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.pump();
            let waiting_for_robber =
                self.module.is_none() && self.dist.as_ref().is_some_and(|d| !d.is_root());
            let stall_at = self.dist_progress + self.stall_allowance();
            tokio::select! {
                _ = cancel.cancelled() => return,
                Some(p) = program.recv() => self.on_program(p),
                _ = tokio::time::sleep_until(stall_at), if waiting_for_robber => {
                    let secs = self.stall_allowance().as_secs();
                    self.fall_back(format!("no piece of the program arrived for {secs} s"));
                }
                Ok(()) = delivered.changed() => self.on_output_delivered(),
                _ = observe.tick() => self.publish_observations(),
                Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    match joined {
                        Ok(task) => self.on_task(task),
                        Err(e) if e.is_cancelled() => {}
                        Err(e) => self.fail(None, format!("a process's host thread failed: {e}")),
                    }
                }
                Some(early) = self.early_rx.recv() => self.on_early(early),
                Some(event) = events.recv() => self.on_inbound(event),
                Some(a) = updates.recv() => {
                    if !self.reassign(a) {
                        return;
                    }
                }
            }
        }
    }

    fn emit(&self, e: PeerEvent) {
        self.env.reporter.emit(e);
    }

    fn observed_ms(&self) -> u64 {
        u64::try_from(self.observed_from.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Hand what this peer saw of the job's other peers to the next
    /// renewal, and the processes the barrier waits for once it waits long.
    fn publish_observations(&mut self) {
        let since = self.observed_from + Duration::from_millis(self.observer.waiting_since());
        let waiting_for = if since.elapsed() >= crate::observe::REPORT_WAIT_AFTER
            && self
                .local
                .values()
                .any(|l| !matches!(l.state, State::Exited))
        {
            self.barrier.missing_done(self.observer.next())
        } else {
            Vec::new()
        };
        let hosts = &self.hosts;
        let hosted = |peer: PeerId| hosts.count_on(peer);
        self.env.stats.observed.publish(
            self.job,
            self.observer.take(),
            hosted,
            since.into_std(),
            waiting_for,
        );
    }

    fn status(&self, text: String) {
        self.emit(PeerEvent::Status {
            job: self.job,
            pid: None,
            text,
        });
    }

    /// End the job on this peer with an error and wait for `KillJob`.
    fn fail(&mut self, pid: Option<Pid>, reason: String) {
        if self.failed {
            return;
        }
        let superstep = pid
            .and_then(|p| self.local.get(&p))
            .map_or(0, |l| l.superstep);
        tracing::warn!(job = self.job, ?pid, "job failed on this peer: {reason}");
        self.emit(PeerEvent::ProcessFailed {
            job: self.job,
            pid,
            superstep,
            reason,
        });
        self.failed = true;
        self.info.kill.store(true, Ordering::Relaxed);
        self.local.clear();
    }
}

mod assignment;
mod epochs;
mod errors;
mod hosts;
mod inbound;
mod program_fetch;
mod replication;
mod restore;
mod routing;
mod supersteps;
mod threads;

use assignment::*;
pub use errors::{FetchError, HostError, Source};
use hosts::Hosts;
pub(crate) use program_fetch::fetch_inputs;
use threads::*;

#[cfg(test)]
mod tests;
