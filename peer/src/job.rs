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
type Download = std::pin::Pin<Box<dyn Future<Output = Result<Fetched, String>> + Send>>;

/// What the tasks that get the program report.
enum ProgramEvent {
    /// The direct download (or the cache) answered.
    Downloaded(Result<Fetched, String>),
    /// The bundle Robber assembled: the program compiled and the resources
    /// decoded (or why not).
    Assembled(Result<(Module, Resources), String>),
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
        F: Future<Output = Result<Fetched, String>> + Send + 'static,
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
    /// Checkpoint frames per replica, waiting for the output to be delivered.
    unsent: Vec<(PeerId, Outgoing)>,
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

/// The messages a process sent in superstep `s`, as they travel.
fn wire_messages(pid: Pid, s: u32, out: Vec<crate::runtime::Outgoing>) -> Vec<WireMessage> {
    out.into_iter()
        .map(|o| WireMessage {
            src: pid,
            dst: o.dst,
            superstep: s,
            seq: o.seq,
            tag: o.tag,
            payload: o.payload,
        })
        .collect()
}

/// Capture `p` with `outbox` and encode the checkpoint for `targets` (the
/// body of every capture task).
fn capture(
    p: &mut Proc,
    outbox: Vec<WireMessage>,
    exited: bool,
    acks: Vec<(PeerId, u32, bool)>,
    targets: &[PeerId],
) -> Result<(Arc<Snapshot>, Encoded), String> {
    // The newest buffer only this process still holds.
    let free = (0..p.recent.len())
        .rev()
        .find(|&i| Arc::strong_count(&p.recent[i]) == 1)
        .and_then(|i| p.recent.remove(i))
        .and_then(|a| Arc::try_unwrap(a).ok());
    let snapshot = match free {
        Some(previous) => p
            .process
            .checkpoint_reusing(&mut p.tracker, outbox, exited, previous),
        None => p.process.checkpoint(&mut p.tracker, outbox, exited),
    };
    for (r, superstep, ok) in acks {
        p.tracker.acked(r, superstep, ok);
    }
    // Shared: the frames' pages are slices of its memory.
    let snapshot = Arc::new(snapshot);
    let encoded = encode_for(&mut p.tracker, &snapshot, targets)?;
    Ok((snapshot, encoded))
}

/// Run `p`'s superstep `s`; with `capture` (a checkpointed superstep), a
/// sync or exit is captured right here, on the same thread, after the
/// messages were handed to the driver ([`Early`]): no trip through the
/// driver between the superstep and its checkpoint.
fn resume_and_capture(
    pid: Pid,
    s: u32,
    mut p: Proc,
    slot: crate::slots::Slot,
    capture_input: Option<CaptureInput>,
) -> Task {
    timeline(pid, s, "resumed");
    let outcome = p.process.resume_in(slot);
    timeline(pid, s, "synced");
    let exited = match outcome {
        Outcome::Sync => false,
        Outcome::Done => true,
        _ => return Task::Resumed(pid, Ok((p, outcome))),
    };
    let Some(c) = capture_input else {
        return Task::Resumed(pid, Ok((p, outcome)));
    };
    let out = wire_messages(pid, s, p.process.take_outbox());
    let mut outbox = c.outbox;
    outbox.extend(out.iter().cloned());
    if c.early.send(Early { pid, exited, out }).is_err() {
        // The job's driver is gone: nobody reads the capture.
        return Task::Resumed(pid, Err("the job ended".to_string()));
    }
    let captured = capture(&mut p, outbox, exited, Vec::new(), &c.targets);
    timeline(pid, s, "captured");
    Task::Captured(pid, captured.map(|(s, e)| (p, s, e)))
}

/// A point of a superstep's life on this peer, for
/// `BSPWEB_LOG=bspweb::timeline=trace` (docs/benchmarks.md, "The superstep
/// timeline"): the log's microsecond timestamps show where a superstep's
/// time goes between threads and peers. Free when the target is off.
fn timeline(pid: Pid, superstep: u32, what: &str) {
    tracing::trace!(target: "bspweb::timeline", pid, superstep, "{what}");
}

/// What a blocking task hands back.
enum Task {
    Resumed(Pid, Result<(Proc, Outcome), String>),
    Captured(Pid, Result<(Proc, Arc<Snapshot>, Encoded), String>),
    /// `None`: the snapshot is of a process that had exited.
    Restored(Pid, Arc<Snapshot>, Result<Option<Proc>, String>),
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
    /// `placement[pid]` is the peer that hosts `pid`.
    placement: Vec<PeerId>,
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

/// Plan `snapshot`'s frames for each of `targets` and encode them, once per
/// distinct plan. The next checkpoint is planned as a delta against this
/// one, sent before this one is acknowledged: frames to a replica arrive in
/// order, so it will hold this one as its base (if not, it refuses the
/// delta and gets the next checkpoint whole).
fn encode_for(
    tracker: &mut PageTracker,
    snapshot: &Arc<Snapshot>,
    targets: &[PeerId],
) -> Result<Encoded, String> {
    let mut done: Vec<(checkpoint::Plan, Vec<net::Segments>)> = Vec::new();
    let mut out = Vec::with_capacity(targets.len());
    for &r in targets {
        let plan = tracker.plan(r, snapshot);
        let frames = match done.iter().find(|(p, _)| *p == plan) {
            Some((_, frames)) => frames.clone(),
            None => {
                let frames = checkpoint::to_frames_shared(snapshot, &plan.pages, plan.base)
                    .iter()
                    .map(net::encode_segments)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("cannot encode a checkpoint: {e}"))?;
                done.push((plan, frames.clone()));
                frames
            }
        };
        tracker.sent(r, snapshot.superstep);
        out.push((r, frames));
    }
    Ok(out)
}

/// Most heads one multicast may arrive with (each restore of its sender
/// can add one).
const MAX_HEADS: usize = 8;

/// Check an assignment and return the pid → peer table.
/// The shortest job secret a peer accepts: the data plane's key is derived
/// from it, so it must hold at least 128 bits of hex.
const MIN_JOB_TOKEN: usize = 32;

fn check_assignment(me: PeerId, a: &JobAssignment) -> Result<Vec<PeerId>, String> {
    if a.nprocs == 0 {
        return Err("the job has no processes".into());
    }
    if a.placement.len() != a.nprocs as usize {
        return Err(format!(
            "the job's placement lists {} pids for {} processes",
            a.placement.len(),
            a.nprocs
        ));
    }
    if let Some(bad) = a.placement.iter().find(|&&i| i as usize >= a.peers.len()) {
        return Err(format!(
            "the job's placement names peer index {bad}, but the job has {} peers",
            a.peers.len()
        ));
    }
    if let Some(bad) = a.restore.iter().find(|&&p| p >= a.nprocs) {
        return Err(format!(
            "the job's assignment restores pid {bad}, but the job has {} processes",
            a.nprocs
        ));
    }
    let mut seen = HashSet::new();
    if let Some(dup) = a.peers.iter().find(|p| !seen.insert(p.id)) {
        return Err(format!("the job lists peer #{} twice", dup.id));
    }
    if !a.peers.iter().any(|p| p.id == me) {
        return Err(format!("this peer (#{me}) is not one of the job's peers"));
    }
    if a.job_token.len() < MIN_JOB_TOKEN {
        return Err(format!(
            "the job's secret is {} characters long, fewer than the {MIN_JOB_TOKEN} its data-plane \
             key needs (the supernode issues 64); this peer will not run it in the clear",
            a.job_token.len()
        ));
    }
    Ok(a.placement
        .iter()
        .map(|&i| a.peers[i as usize].id)
        .collect())
}

fn job_info(env: &JobEnv, a: &JobAssignment, kill: Arc<AtomicBool>) -> Result<JobInfo, String> {
    let mut resources = HashMap::new();
    for (name, b64) in &a.resources {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("resource `{name}` is not valid base64: {e}"))?;
        resources.insert(name.clone(), bytes);
    }
    let memory_mib = a.limits.memory_mib.min(env.max_memory_mib) as usize;
    let memory_limit = memory_mib << 20;
    let budget_ms = a.limits.superstep_ms.min(env.max_superstep_ms);
    Ok(JobInfo {
        job: a.job,
        nprocs: a.nprocs,
        seed: a.seed,
        args: a.args.clone().into_bytes(),
        resources,
        memory_limit,
        superstep_budget: Duration::from_millis(budget_ms),
        output_limit: (a.limits.output_mib as u64) << 20,
        outbox_limit: memory_limit.saturating_mul(2).max(1 << 20),
        kill,
        reporter: env.reporter.clone(),
    })
}

/// The `count` replicas of `pid`'s checkpoints among `peers` (not `host`):
/// rendezvous hashing of `(job, pid, peer)`, so anyone who knows the peer
/// list finds them.
pub fn replicas_of(
    job: JobId,
    pid: Pid,
    host: PeerId,
    peers: &[PeerId],
    count: usize,
) -> Vec<PeerId> {
    let mut scored: Vec<(u64, PeerId)> = peers
        .iter()
        .filter(|&&p| p != host)
        .map(|&p| (mix(job as u64, pid as u64, p as u64), p))
        .collect();
    scored.sort_unstable();
    scored.into_iter().take(count).map(|(_, p)| p).collect()
}

/// A fixed 64-bit mix (SplitMix64 finalizer over the three keys).
fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(b.rotate_left(21))
        .wrapping_add(c.rotate_left(42) ^ 0xD6E8_FEB8_6659_FD93);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The frames that carry `s` whole to a replica.
fn whole(s: &Snapshot) -> Vec<Frame> {
    checkpoint::to_frames(s, &s.nonzero_pages(), None)
}

/// The newest superstep before `c` that [`checkpointed`] says is
/// checkpointed with interval `every` (in O(1): with checkpoints off,
/// `every` is huge and there may be none).
fn newest_checkpointed_before(c: u32, every: u32) -> Option<u32> {
    let every = every.max(1);
    (c / every).checked_mul(every)?.checked_sub(1)
}

/// Whether superstep `s` is checkpointed with interval `every`.
fn checkpointed(s: u32, every: u32) -> bool {
    every <= 1 || (s + 1).is_multiple_of(every)
}

/// The job's resources in `encode_resources` form (from the supernode or
/// from other peers, `whence`), checked against `hash` and decoded; none
/// when `hash` is empty (the job has none apart from its assignment).
fn unpack_resources(hash: &str, bytes: &[u8], whence: &str) -> Result<Resources, String> {
    use sha2::Digest as _;
    if hash.is_empty() {
        return Ok(None);
    }
    if !hex::encode(sha2::Sha256::digest(bytes)).eq_ignore_ascii_case(hash) {
        return Err(format!(
            "the job's resources from {whence} do not match their hash"
        ));
    }
    bsp_api::control::decode_resources(bytes)
        .map(Some)
        .map_err(|e| format!("the job's resources from {whence} are malformed: {e}"))
}

/// "; the job's 5 peers are in clusters a (2), b (3)": the clusters of
/// the job's peers (the sites broadcasts and Robber use), for status lines;
/// empty when no peer has one.
fn clusters_phrase<'a>(sites: impl Iterator<Item = &'a Site>) -> String {
    let mut count: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    let (mut unnamed, mut all) = (0, 0);
    for s in sites {
        all += 1;
        match &s.cluster {
            Some(c) => *count.entry(c.as_str()).or_default() += 1,
            None => unnamed += 1,
        }
    }
    if count.is_empty() {
        return String::new();
    }
    let mut parts: Vec<String> = count.iter().map(|(c, n)| format!("{c} ({n})")).collect();
    if unnamed > 0 {
        parts.push(format!("no cluster ({unnamed})"));
    }
    let s = if parts.len() == 1 { "" } else { "s" };
    let are = if all == 1 { "peer is" } else { "peers are" };
    format!("; the job's {all} {are} in cluster{s} {}", parts.join(", "))
}

fn sites_of(a: &JobAssignment) -> HashMap<PeerId, Site> {
    a.peers
        .iter()
        .map(|p| (p.id, Site::new(p.id, &p.addr, p.cluster.clone())))
        .collect()
}

/// Whether a process's `Done(s)` may go out with these checkpoints still
/// pending (docs/fault-tolerance.md, "`Done` after replication"): every
/// checkpoint before `s` must be safe, and one of `s` itself when it gates
/// its own `Done` (an exit or a restored snapshot).
fn may_announce(pending: &VecDeque<Pending>, capturing_exit: Option<u32>, s: u32) -> bool {
    capturing_exit.is_none_or(|c| c > s)
        && pending
            .iter()
            .all(|p| p.superstep > s || (p.superstep == s && !p.gates_own))
}

/// The `Done` of `pid` for superstep `s`, counted from its messages.
fn done_of(pid: Pid, exited: bool, messages: &[WireMessage], s: u32) -> ProcDone {
    let mut counts: BTreeMap<Pid, u32> = BTreeMap::new();
    for m in messages.iter().filter(|m| m.superstep == s) {
        *counts.entry(m.dst).or_default() += 1;
    }
    ProcDone {
        pid,
        exited,
        counts: counts.into_iter().collect(),
    }
}

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
        .and_then(|placement| job_info(&env, &a, kill.clone()).map(|info| (placement, info)));
    let (placement, info) = match setup {
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
        placement,
        peers: a.peers.iter().map(|p| p.id).collect(),
        links: HashMap::new(),
        barrier: Barrier::new(nprocs, limit),
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
    for p in &a.peers {
        if p.id != me {
            d.open_link(p.id, p.addr.clone());
        }
    }
    let restore: HashSet<Pid> = a.restore.iter().copied().collect();
    let mine: Vec<Pid> = (0..nprocs)
        .filter(|&p| d.placement[p as usize] == me)
        .collect();
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
        let placement = &self.placement;
        let hosted = |peer: PeerId| placement.iter().filter(|&&p| p == peer).count() as u32;
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

    /// Get the program: from the cache, by Robber from the job's other
    /// peers, or downloaded from the supernode (`crate::program`).
    fn get_program(&mut self, a: &JobAssignment) {
        // A cached program is the whole bundle only for a job without
        // resources apart.
        let cached = self
            .env
            .runtime
            .cached_program(&a.program_hash)
            .filter(|_| a.resources_hash.is_empty());
        if program::Distribution::applies(a) {
            match program::Distribution::new(a, self.me) {
                Ok(mut dist) => {
                    let out = match &cached {
                        _ if dist.is_root() => Ok(Vec::new()),
                        Some((_, bytes)) => dist.seed(bytes),
                        None => Ok(dist.start()),
                    };
                    match out {
                        Ok(out) => {
                            let root = dist.is_root();
                            self.dist = Some(dist);
                            self.dist_started = Instant::now();
                            self.dist_progress = self.dist_started;
                            self.send_program_frames(out);
                            if root {
                                // From the cache or the supernode.
                                self.start_download();
                            }
                        }
                        Err(e) => tracing::info!(job = self.job, "no program distribution: {e}"),
                    }
                }
                Err(e) => tracing::info!(job = self.job, "no program distribution: {e}"),
            }
        }
        match cached {
            Some((module, _)) => self.program_ready(module, None),
            None if self.dist.is_none() => self.start_download(),
            None => {}
        }
    }

    fn send_program_frames(&mut self, out: program::Out) {
        for (to, f) in out {
            self.send_to(to, f);
        }
    }

    /// How long a peer waits for the next piece of the program: the stall
    /// limit, plus (before the first piece) the time the first peer's own
    /// download takes at 1 MiB/s.
    fn stall_allowance(&self) -> Duration {
        let first = self.dist.as_ref().is_some_and(|d| d.received == 0);
        let download = if first {
            Duration::from_secs_f64(self.dist_bytes as f64 / f64::from(1u32 << 20))
        } else {
            Duration::ZERO
        };
        program::STALL + download
    }

    /// Start the direct download (once).
    fn start_download(&mut self) {
        if let Some(download) = self.download.take() {
            let tx = self.program_tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(ProgramEvent::Downloaded(download.await));
            });
        }
    }

    /// Robber failed here: download the program unless it is here already.
    fn fall_back(&mut self, why: String) {
        if self.module.is_some() {
            return;
        }
        if self.download.is_some() {
            tracing::info!(job = self.job, "downloading the program directly: {why}");
            self.status(format!(
                "peer #{} downloads the program directly: {why}",
                self.me
            ));
        }
        // A void distribution stops answering; the others fall back too.
        self.dist = None;
        self.start_download();
    }

    fn on_program(&mut self, event: ProgramEvent) {
        match event {
            ProgramEvent::Downloaded(Ok(f)) => {
                let resources =
                    match unpack_resources(&self.resources_hash, &f.resources, "the supernode") {
                        Ok(r) => r,
                        Err(e) => return self.fail(None, e),
                    };
                if let Some(dist) = &mut self.dist {
                    let bundle = [&f.bytes[..], &f.resources[..]].concat();
                    match dist.seed(&bundle) {
                        Ok(out) => {
                            if dist.is_root() {
                                let n = self.peers.len() - 1;
                                self.status(format!(
                                    "peer #{} downloaded the program ({} KiB) and passes it on to {n} peer{} by Robber{}",
                                    self.me,
                                    f.bytes.len() >> 10,
                                    if n == 1 { "" } else { "s" },
                                    clusters_phrase(self.sites.values())
                                ));
                            }
                            self.send_program_frames(out);
                        }
                        Err(e) => {
                            tracing::info!(job = self.job, "the program's distribution ends: {e}");
                            self.dist = None;
                        }
                    }
                }
                self.program_ready(f.module, resources);
            }
            ProgramEvent::Downloaded(Err(reason)) => {
                if self.module.is_none() {
                    self.fail(None, reason);
                }
            }
            ProgramEvent::Assembled(Ok((module, resources))) => {
                if let Some(dist) = &self.dist {
                    let ms = self.dist_started.elapsed().as_millis();
                    let sources = dist.sources.len();
                    self.status(format!(
                        "peer #{} got the program by Robber in {ms} ms: {} pieces from {sources} peer{}",
                        self.me,
                        dist.received,
                        if sources == 1 { "" } else { "s" }
                    ));
                }
                self.program_ready(module, resources);
            }
            ProgramEvent::Assembled(Err(e)) => self.fall_back(e),
        }
    }

    /// A program frame from `from`.
    fn on_program_msg(&mut self, from: PeerId, epoch: u64, msg: bsp_api::wire::ProgramMsg) {
        let Some(dist) = &mut self.dist else {
            return;
        };
        if epoch != dist.epoch {
            return; // another distribution (a peer that joined later)
        }
        let had = dist.has_all();
        let received = dist.received;
        match dist.on_msg(from, msg) {
            Ok(out) => {
                if dist.received > received {
                    self.dist_progress = Instant::now();
                }
                let complete = !had && dist.has_all() && self.module.is_none();
                let data = if complete { dist.data() } else { None };
                self.send_program_frames(out);
                if let Some(bundle) = data {
                    let runtime = self.env.runtime.clone();
                    let hash = self.program_hash.clone();
                    let split = (self.program_bytes as usize).min(bundle.len());
                    let resources_hash = self.resources_hash.clone();
                    let tx = self.program_tx.clone();
                    tokio::spawn(async move {
                        let unpacked = tokio::task::spawn_blocking(move || {
                            let (program, resources) = bundle.split_at(split);
                            let resources =
                                unpack_resources(&resources_hash, resources, "other peers")?;
                            let module = runtime.compile(&hash, program).map_err(|e| {
                                format!("the program from other peers is unusable: {e}")
                            })?;
                            Ok((module, resources))
                        })
                        .await
                        .unwrap_or_else(|e| Err(format!("compiling the program failed: {e}")));
                        let _ = tx.send(ProgramEvent::Assembled(unpacked));
                    });
                }
            }
            Err(e) => {
                tracing::info!(job = self.job, "{e}");
                self.fall_back(e.to_string());
            }
        }
    }

    /// The program (and the resources, when they came apart) is here:
    /// start the processes that waited for it.
    fn program_ready(&mut self, module: Module, resources: Resources) {
        if self.module.is_some() {
            return;
        }
        if let Some(resources) = resources {
            let old = &self.info;
            self.info = Arc::new(JobInfo {
                job: old.job,
                nprocs: old.nprocs,
                seed: old.seed,
                args: old.args.clone(),
                resources: resources.into_iter().collect(),
                memory_limit: old.memory_limit,
                superstep_budget: old.superstep_budget,
                output_limit: old.output_limit,
                outbox_limit: old.outbox_limit,
                kill: old.kill.clone(),
                reporter: old.reporter.clone(),
            });
        }
        self.module = Some(module);
        if let Some((fresh, restored)) = self.deferred.take() {
            // Only what this peer still hosts (the placement may have
            // changed while the program was on its way).
            let here = |p: &Pid| self.placement[*p as usize] == self.me;
            let restored: Vec<Pid> = restored.into_iter().filter(here).collect();
            let fresh: Vec<Pid> = fresh
                .into_iter()
                .filter(|p| here(p) && !restored.contains(p))
                .collect();
            for pid in restored {
                self.begin_fetch(pid);
            }
            self.start_fresh(fresh);
        }
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

    fn open_link(&mut self, peer: PeerId, addr: String) {
        let (wtx, wrx) = mpsc::unbounded_channel();
        let dial = Dial {
            addr: addr.clone(),
            job: self.job,
            from: self.me,
            to: peer,
            token: self.token.clone(),
            epoch: self.epoch,
            deadline: Instant::now() + self.env.connect_timeout,
        };
        let task = net::spawn_writer(dial, wrx, self.events_tx.clone());
        self.links.insert(
            peer,
            Link {
                addr,
                writer: wtx,
                task,
                batch: Vec::new(),
                batch_bytes: 0,
            },
        );
    }

    fn send_to(&mut self, peer: PeerId, frame: Frame) {
        if let Some(l) = self.links.get_mut(&peer) {
            Self::flush_link(l, &self.env.stats);
            self.env.stats.count(&frame);
            l.send(frame);
        }
    }

    fn flush_link(l: &mut Link, stats: &DataStats) {
        if l.batch.is_empty() {
            return;
        }
        let messages = std::mem::take(&mut l.batch);
        l.batch_bytes = 0;
        let frame = Frame::Data { messages };
        stats.count(&frame);
        l.send(frame);
    }

    /// Send a message to its destination's host (or into the local barrier).
    fn deliver(&mut self, m: WireMessage) {
        let host = self.placement[m.dst as usize];
        if host == self.me {
            if let Err(e) = self.barrier.on_message(m) {
                self.fail(None, format!("a local message broke the protocol: {e}"));
            }
            return;
        }
        if let Some(l) = self.links.get_mut(&host) {
            // A payload the previous message shares travels once (one group).
            let shared = l.batch.last().is_some_and(|p| {
                p.src == m.src
                    && p.superstep == m.superstep
                    && message_groups::same_buffer(&p.payload, &m.payload)
            });
            let size = if shared { 16 } else { m.payload.len() + 16 };
            let full = l.batch.len() >= BATCH_MESSAGES
                || (!shared && !l.batch.is_empty() && l.batch_bytes + size > BATCH_BYTES);
            if full {
                Self::flush_link(l, &self.env.stats);
            }
            l.batch_bytes += size;
            l.batch.push(m);
        }
    }

    /// Send what a process sent in a superstep: each group of messages
    /// sharing a payload (a `send_range` or `send_list`) relayed if the
    /// broadcast rule says so, the rest straight to the destinations' hosts.
    fn route(&mut self, out: &[WireMessage]) {
        for run in message_groups::runs(out) {
            if run.len() >= 2 && self.relay_out(run) {
                continue;
            }
            for m in run {
                self.deliver(m.clone());
            }
        }
    }

    /// Start relaying `run` if the rule picks a schedule. Returns whether it did.
    fn relay_out(&mut self, run: &[WireMessage]) -> bool {
        // A `send_list` may name a pid many times; such lists go direct.
        if run.len() > self.info.nprocs as usize {
            return false;
        }
        let payload = &run[0].payload;
        let dest_peers: BTreeSet<PeerId> = run
            .iter()
            .map(|m| self.placement[m.dst as usize])
            .filter(|&p| p != self.me)
            .collect();
        let Some(me) = self.sites.get(&self.me) else {
            return false;
        };
        let dests: Vec<Site> = dest_peers
            .iter()
            .filter_map(|p| self.sites.get(p).cloned())
            .collect();
        if dests.len() != dest_peers.len() || dest_peers.iter().any(|p| !self.links.contains_key(p))
        {
            return false;
        }
        let Some((algorithm, peers)) =
            relay::choose(&self.env.broadcast, payload.len(), me, &dests)
        else {
            return false;
        };
        let head = RelayHead {
            src: run[0].src,
            superstep: run[0].superstep,
            tag: run[0].tag,
            len: payload.len() as u32,
            algorithm,
            peers,
            dsts: run.iter().map(|m| (m.dst, m.seq)).collect(),
        };
        let (inflight, start) = match Inflight::sending(head, self.me, payload.clone()) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(job = self.job, "sending directly: {e}");
                return false;
            }
        };
        tracing::debug!(
            job = self.job,
            src = run[0].src,
            bytes = payload.len(),
            ?algorithm,
            peers = inflight.head.peers.len(),
            "relaying a multicast"
        );
        for m in run {
            if self.placement[m.dst as usize] == self.me {
                self.deliver(m.clone());
            }
        }
        let frames: Vec<(PeerId, Vec<Frame>)> =
            start.iter().filter_map(|t| inflight.frames(t)).collect();
        self.relays
            .entry(relay::key_of(&inflight.head))
            .or_default()
            .push(inflight);
        for (to, fs) in frames {
            for f in fs {
                self.send_to(to, f);
            }
        }
        true
    }

    /// Bytes of a relayed multicast arrived: keep them, forward what the
    /// schedule says, deliver the messages once the payload is whole.
    fn on_relay(
        &mut self,
        from: PeerId,
        head: RelayHead,
        offset: u32,
        bytes: bytes::Bytes,
    ) -> Result<(), RelayError> {
        relay::check_head(&head, self.info.nprocs, self.me, from)?;
        if !relay::current(&head, &self.peers) {
            tracing::debug!(
                job = self.job,
                from,
                "dropping a relayed frame of an older epoch"
            );
            return Ok(());
        }
        if self.safe.is_some_and(|g| head.superstep < g) {
            return Ok(()); // long delivered everywhere
        }
        let key = relay::key_of(&head);
        // Payloads still being received (complete ones are shared with the
        // inboxes). Every process may send its outbox limit per superstep,
        // and a peer can be a superstep ahead.
        let held: u64 = self
            .relays
            .values()
            .flatten()
            .filter(|f| f.payload().is_none())
            .map(|f| u64::from(f.head.len))
            .sum();
        let heads = self.relays.entry(key).or_default();
        let i = match heads.iter().position(|f| *f.head == head) {
            Some(i) => i,
            None => {
                if heads.len() >= MAX_HEADS {
                    return Err(RelayError::TooManyHeads(MAX_HEADS));
                }
                let cap = (self.info.outbox_limit as u64)
                    .saturating_mul(2 * u64::from(self.info.nprocs))
                    .max(256 << 20);
                if held.saturating_add(u64::from(head.len)) > cap {
                    return Err(RelayError::TooMuchHeld(cap >> 20));
                }
                heads.push(Inflight::new(head, self.me)?);
                heads.len() - 1
            }
        };
        let f = &mut heads[i];
        let (due, done) = f.receive(offset, &bytes)?;
        let frames: Vec<(PeerId, Vec<Frame>)> = due.iter().filter_map(|t| f.frames(t)).collect();
        for (to, fs) in frames {
            for f in fs {
                self.send_to(to, f);
            }
        }
        if done {
            self.relay_complete(key, i);
        }
        Ok(())
    }

    /// The payload of `relays[key][i]` is whole: deliver its messages to
    /// the local pids, and to the peers that must get it directly.
    fn relay_complete(&mut self, key: RelayKey, i: usize) {
        let Some(f) = self.relays.get_mut(&key).and_then(|v| v.get_mut(i)) else {
            return;
        };
        let Some(payload) = f.payload().cloned() else {
            return;
        };
        let direct = std::mem::take(&mut f.direct);
        let head = f.head.clone();
        for &(dst, seq) in &head.dsts {
            let host = self.placement[dst as usize];
            if host == self.me || direct.contains(&host) {
                self.deliver(WireMessage {
                    src: head.src,
                    dst,
                    superstep: head.superstep,
                    seq,
                    tag: head.tag,
                    payload: payload.clone(),
                });
            }
        }
        self.flush_all();
    }

    /// Our connection to `peer` broke, so relayed bytes on it may be lost:
    /// send again everything we already sent it of every multicast we send
    /// or relay, so it completes and forwards its own part of the schedule
    /// (its own pids also get the sender's messages by `resync`).
    fn resend_relayed(&mut self, peer: PeerId) {
        let frames: Vec<Frame> = self
            .relays
            .values()
            .flatten()
            .flat_map(|f| f.resend_to(peer))
            .collect();
        for f in frames {
            self.send_to(peer, f);
        }
    }

    /// Peers left the job: a multicast we sent through any of them goes to
    /// every other peer of its schedule directly (receivers drop repeats).
    fn relay_around(&mut self, gone: &[PeerId]) {
        let mut due = Vec::new();
        for (key, heads) in self.relays.iter_mut() {
            for (i, f) in heads.iter_mut().enumerate() {
                if f.node != 0 || !f.head.peers.iter().any(|p| gone.contains(p)) {
                    continue;
                }
                let others: Vec<PeerId> = f
                    .head
                    .peers
                    .iter()
                    .copied()
                    .filter(|p| *p != self.me && !gone.contains(p))
                    .collect();
                f.direct.extend(others);
                due.push((*key, i));
            }
        }
        for (key, i) in due {
            self.relay_complete(key, i);
        }
    }

    fn flush_all(&mut self) {
        for l in self.links.values_mut() {
            Self::flush_link(l, &self.env.stats);
        }
    }

    /// Tell every peer (and the local barrier) that `pid` is through `s`.
    fn announce(&mut self, s: u32, d: ProcDone) {
        timeline(d.pid, s, "Done sent");
        self.dones.insert((d.pid, s), d.clone());
        let peers: Vec<PeerId> = self.links.keys().copied().collect();
        for p in peers {
            self.send_to(
                p,
                Frame::Done {
                    superstep: s,
                    procs: vec![d.clone()],
                },
            );
        }
        if let Err(e) = self.barrier.on_done(s, d) {
            self.fail(
                None,
                format!("a local process's report broke the protocol: {e}"),
            );
        }
    }

    fn start_fresh(&mut self, pids: Vec<Pid>) {
        if self.module.is_none() {
            let (fresh, _) = self.deferred.get_or_insert_default();
            for pid in pids {
                if !fresh.contains(&pid) {
                    fresh.push(pid);
                }
            }
            return;
        }
        for pid in pids {
            self.local.insert(
                pid,
                Local {
                    state: State::Busy,
                    superstep: 0,
                    pending: VecDeque::new(),
                    held: Vec::new(),
                    capturing_exit: None,
                    exit_mark: 0,
                    acks: Vec::new(),
                    leaving: false,
                    handover: None,
                },
            );
            let runtime = self.env.runtime.clone();
            let Some(module) = self.module.clone() else {
                unreachable!("start_fresh defers until the program is here")
            };
            let info = self.info.clone();
            let slots = self.env.slots.clone();
            let job = self.job;
            self.tasks.spawn(async move {
                let slot = slots.acquire(job).await.map_err(|e| e.to_string());
                let joined = tokio::task::spawn_blocking(move || {
                    let slot = slot?;
                    timeline(pid, 0, "instantiating");
                    let mut p = Proc {
                        process: runtime.instantiate(&module, info, pid)?,
                        tracker: PageTracker::new(),
                        recent: VecDeque::new(),
                    };
                    timeline(pid, 0, "resumed");
                    let outcome = p.process.resume_in(slot);
                    timeline(pid, 0, "synced");
                    Ok((p, outcome))
                })
                .await;
                Task::Resumed(pid, joined.unwrap_or_else(|e| Err(e.to_string())))
            });
        }
    }

    fn spawn_resume(&mut self, pid: Pid, mut p: Proc) {
        if let Some(l) = self.local.get_mut(&pid) {
            l.state = State::Busy;
            // Replicas' answers so far, for the page tracker (later ones
            // wait for the next superstep).
            for (r, superstep, ok) in std::mem::take(&mut l.acks) {
                p.tracker.acked(r, superstep, ok);
            }
        }
        let slots = self.env.slots.clone();
        let job = self.job;
        // A checkpointed superstep is captured by the process's own thread.
        let s = self.local.get(&pid).map_or(0, |l| l.superstep);
        let capture_input = checkpointed(s, self.checkpoint_every).then(|| CaptureInput {
            outbox: self.retained.get(&pid).cloned().unwrap_or_default(),
            targets: replicas_of(self.job, pid, self.me, &self.peers, self.replicas),
            early: self.early_tx.clone(),
        });
        // A free slot: straight to a blocking thread (one thread hop less
        // per superstep than queueing for it).
        if let Some(slot) = slots.try_acquire(job) {
            self.tasks
                .spawn_blocking(move || resume_and_capture(pid, s, p, slot, capture_input));
            return;
        }
        self.tasks.spawn(async move {
            let slot = match slots.acquire(job).await {
                Ok(slot) => slot,
                Err(e) => return Task::Resumed(pid, Err(e.to_string())),
            };
            tokio::task::spawn_blocking(move || resume_and_capture(pid, s, p, slot, capture_input))
                .await
                .unwrap_or_else(|e| Task::Resumed(pid, Err(e.to_string())))
        });
    }

    fn on_task(&mut self, task: Task) {
        if self.failed {
            return;
        }
        // A capture's `Early` report was sent before it finished: take it
        // first, whichever of the two the driver's loop saw first.
        while let Ok(early) = self.early_rx.try_recv() {
            self.on_early(early);
        }
        match task {
            Task::Resumed(pid, r) => self.on_resumed(pid, r),
            Task::Captured(pid, r) => self.on_captured(pid, r),
            Task::Restored(pid, snap, r) => self.on_restored(pid, snap, r),
        }
    }

    fn on_resumed(&mut self, pid: Pid, resumed: Result<(Proc, Outcome), String>) {
        let Some(l) = self.local.get(&pid) else {
            return;
        };
        let s = l.superstep;
        let (mut p, outcome) = match resumed {
            Ok(x) => x,
            Err(e) => {
                return self.fail(Some(pid), format!("the process could not run: {e}"));
            }
        };
        let exited = match outcome {
            // A `may_migrate` point: a leaving process still moves at its next sync.
            Outcome::Yield => return self.spawn_resume(pid, p),
            Outcome::Sync => false,
            Outcome::Done => true,
            Outcome::Aborted(reason) => {
                self.emit(PeerEvent::ProcessAborted {
                    job: self.job,
                    pid,
                    superstep: s,
                    reason,
                });
                self.failed = true;
                self.info.kill.store(true, Ordering::Relaxed);
                self.local.clear();
                return;
            }
            Outcome::Failed(reason) => return self.fail(Some(pid), reason),
        };
        let out = wire_messages(pid, s, p.process.take_outbox());
        self.on_synced(pid, exited, out);
        if exited || checkpointed(s, self.checkpoint_every) {
            self.spawn_capture(pid, p, exited);
        } else if let Some(l) = self.local.get_mut(&pid) {
            l.state = State::AtSync(Box::new(p));
        }
    }

    /// A process's thread reached a sync it captures itself.
    fn on_early(&mut self, e: Early) {
        if self.failed || !self.local.contains_key(&e.pid) {
            return;
        }
        self.on_synced(e.pid, e.exited, e.out);
    }

    /// `pid` reached the sync of its current superstep (or returned, when
    /// `exited`) having sent `out`: route the messages, retain them, and
    /// queue its `Done`.
    fn on_synced(&mut self, pid: Pid, exited: bool, out: Vec<WireMessage>) {
        let Some(l) = self.local.get(&pid) else {
            return;
        };
        let s = l.superstep;
        let done = done_of(pid, exited, &out, s);
        self.route(&out);
        self.flush_all();
        self.retained_bytes += checkpoint::outbox_bytes(&out);
        self.retained.entry(pid).or_default().extend(out);
        if exited {
            let mark = self.env.reporter.emit_marked(PeerEvent::ProcessExited {
                job: self.job,
                pid,
                superstep: s,
            });
            if let Some(l) = self.local.get_mut(&pid) {
                l.exit_mark = mark;
                l.capturing_exit = Some(s);
            }
        }
        if let Some(l) = self.local.get_mut(&pid) {
            l.held.push((s, done));
        }
        // `Done(s)` does not wait for `K_s` (only for the checkpoints
        // before it): the other processes go on while this one is captured
        // and `K_s` is replicated during the next superstep.
        self.release_if_acked(pid);
    }

    fn spawn_capture(&mut self, pid: Pid, mut p: Proc, exited: bool) {
        if let Some(l) = self.local.get_mut(&pid) {
            l.state = State::Busy;
        }
        let outbox = self.retained.get(&pid).cloned().unwrap_or_default();
        // Replicas' answers so far, for the page tracker (later ones wait
        // for the next capture), and who gets the checkpoint.
        let acks = self
            .local
            .get_mut(&pid)
            .map(|l| std::mem::take(&mut l.acks))
            .unwrap_or_default();
        let targets = replicas_of(self.job, pid, self.me, &self.peers, self.replicas);
        self.tasks.spawn_blocking(move || {
            let captured = capture(&mut p, outbox, exited, acks, &targets);
            Task::Captured(pid, captured.map(|(s, e)| (p, s, e)))
        });
    }

    fn on_captured(&mut self, pid: Pid, r: Result<(Proc, Arc<Snapshot>, Encoded), String>) {
        timeline(
            pid,
            self.local.get(&pid).map_or(0, |l| l.superstep),
            "capture handed over",
        );
        let (mut p, snapshot, mut encoded) = match r {
            Ok(x) => x,
            Err(e) => {
                return self.fail(Some(pid), format!("could not checkpoint the process: {e}"));
            }
        };
        let Some(l) = self.local.get(&pid) else {
            return;
        };
        let s = l.superstep;
        let leaving = l.leaving;
        let exited = snapshot.exited;
        if p.recent.len() == checkpoint::RECYCLE_DEPTH {
            p.recent.pop_front();
        }
        p.recent.push_back(snapshot.clone());
        // The replicas may have changed while it was captured: new ones get
        // frames planned here, gone ones none.
        let targets = replicas_of(self.job, pid, self.me, &self.peers, self.replicas);
        for (r, _) in encoded.iter().filter(|(r, _)| !targets.contains(r)) {
            // Planned for, never sent: it holds no base from this capture.
            p.tracker.forget(*r);
        }
        encoded.retain(|(r, _)| targets.contains(r));
        let late: Vec<PeerId> = targets
            .iter()
            .copied()
            .filter(|t| !encoded.iter().any(|(r, _)| r == t))
            .collect();
        let mut bytes: usize = encoded
            .iter()
            .flat_map(|(_, frames)| frames.iter().map(|b| b.len()))
            .sum();
        let mut unsent: Vec<(PeerId, Outgoing)> = encoded
            .into_iter()
            .flat_map(|(r, frames)| frames.into_iter().map(move |b| (r, Outgoing::Encoded(b))))
            .collect();
        for r in late {
            let plan = p.tracker.plan(r, &snapshot);
            bytes += plan.pages.len() * checkpoint::PAGE_SIZE;
            for f in checkpoint::to_frames_shared(&snapshot, &plan.pages, plan.base) {
                unsent.push((r, f.into()));
            }
            p.tracker.sent(r, snapshot.superstep);
        }
        self.env.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.env
            .stats
            .checkpoint_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        let l = self.local.get_mut(&pid).expect("checked above");
        let output_mark = p.process.output_mark().max(l.exit_mark);
        if l.capturing_exit == Some(s) {
            l.capturing_exit = None;
        }
        l.pending.push_back(Pending {
            superstep: s,
            waiting: targets.into_iter().collect(),
            snapshot: snapshot.clone(),
            gates_own: exited,
            output_mark,
            unsent,
        });
        l.state = if exited {
            State::Exited
        } else {
            State::AtSync(Box::new(p))
        };
        // The process goes on first, if it may: its thread then wakes
        // before the connections' writers take the cores (on two cores
        // this alone took PageRank at p = 1 from 1.44–1.52× native to
        // 1.23–1.42×).
        if !leaving {
            self.pump();
        }
        self.send_checkpoint(pid);
        if leaving {
            if let Some(l) = self.local.get_mut(&pid) {
                l.handover = Some(snapshot);
            }
            self.hand_over(pid);
        }
        self.release_if_acked(pid);
    }

    /// Send `pid`'s checkpoint to its replicas once its output up to the
    /// checkpoint reached the supernode.
    fn send_checkpoint(&mut self, pid: Pid) {
        let delivered = self.env.reporter.delivered_count();
        let Some(l) = self.local.get_mut(&pid) else {
            return;
        };
        let mut frames = Vec::new();
        // Oldest first: a delta travels after its base.
        for p in l.pending.iter_mut() {
            if delivered < p.output_mark {
                break;
            }
            frames.append(&mut p.unsent);
        }
        for (r, f) in frames {
            match f {
                Outgoing::Frame(f) => self.send_to(r, f),
                Outgoing::Encoded(b) => {
                    if let Some(l) = self.links.get_mut(&r) {
                        Self::flush_link(l, &self.env.stats);
                        l.send(Outgoing::Encoded(b));
                    }
                }
            }
        }
    }

    /// Forget `pid`'s checkpoints that are safe and send the held `Done`s
    /// they no longer hold back.
    fn release_if_acked(&mut self, pid: Pid) {
        let Some(l) = self.local.get_mut(&pid) else {
            return;
        };
        let delivered = self.env.reporter.delivered_count();
        l.pending
            .retain(|p| !p.waiting.is_empty() || delivered < p.output_mark);
        let ready = l
            .held
            .iter()
            .take_while(|(s, _)| may_announce(&l.pending, l.capturing_exit, *s))
            .count();
        let go: Vec<(u32, ProcDone)> = l.held.drain(..ready).collect();
        for (s, d) in go {
            self.announce(s, d);
        }
    }

    fn on_ack(&mut self, from: PeerId, pid: Pid, superstep: u32, ok: bool) {
        tracing::trace!(target: "bspweb::timeline", pid, superstep, from, ok, "checkpoint acknowledged");
        let Some(l) = self.local.get_mut(&pid) else {
            return;
        };
        // Only replicas we wait for are heard (a peer cannot fill `acks`).
        if !l.pending.iter().any(|p| p.waiting.contains(&from)) {
            return;
        }
        // The page tracker travels with the process (often on a blocking
        // thread); only its next capture plans deltas, so the answer waits
        // for it there.
        l.acks.push((from, superstep, ok));
        if ok {
            // A replica that holds `K_superstep` serves a restore at least as
            // well as one holding an older checkpoint, so this answers the
            // older pending ones too (their own acks may have been lost with
            // a connection: a replica re-acknowledges only its newest).
            for p in l.pending.iter_mut().filter(|p| p.superstep <= superstep) {
                p.waiting.remove(&from);
            }
            self.release_if_acked(pid);
        } else if let Some(p) = l
            .pending
            .iter()
            .find(|p| p.superstep == superstep && p.waiting.contains(&from))
        {
            // The replica lacks the base or could not rebuild it: send it whole.
            let frames = whole(&p.snapshot);
            for f in frames {
                self.send_to(from, f);
            }
        }
    }

    /// More output reached the supernode: checkpoints waiting only for that
    /// may release their `Done`s, leaving processes may be handed over.
    fn on_output_delivered(&mut self) {
        let waiting: Vec<(Pid, bool)> = self
            .local
            .iter()
            .filter(|(_, l)| !l.pending.is_empty())
            .map(|(pid, l)| (*pid, l.handover.is_some()))
            .collect();
        for (pid, handing_over) in waiting {
            self.send_checkpoint(pid);
            if handing_over {
                self.hand_over(pid);
            }
            self.release_if_acked(pid);
        }
    }

    /// `pid` leaves this peer: once its snapshot is taken and its new host
    /// asked for it, send it and forget the process.
    fn hand_over(&mut self, pid: Pid) {
        let Some(l) = self.local.get(&pid) else {
            return;
        };
        // The new host will not re-emit the output up to the snapshot.
        let delivered = self.env.reporter.delivered_count();
        if l.pending.iter().any(|p| delivered < p.output_mark) {
            return;
        }
        let Some(snapshot) = l.handover.clone() else {
            return;
        };
        let Some(askers) = self.handovers.remove(&pid) else {
            return;
        };
        for a in askers {
            for f in checkpoint::to_snapshot_frames(&snapshot) {
                self.send_to(a, f);
            }
        }
        self.local.remove(&pid);
        self.emit(PeerEvent::ProcessHandedOver {
            job: self.job,
            pid,
            superstep: snapshot.superstep,
            epoch: self.epoch,
        });
    }

    /// Pass every local process whose barrier is complete; hand over leaving
    /// processes that are at a sync.
    fn pump(&mut self) {
        if self.failed {
            return;
        }
        // Over the peer's memory budget: the job holding the most here
        // fails, rather than the peer (issue 20, finding 1).
        let budget = self.env.runtime.budget();
        if budget.exceeded() && budget.largest_holder() == Some(self.job) {
            let why = format!(
                "{}; this job holds {} MiB of messages and checkpoints on it, the most of its jobs; use fewer processes per peer or send less per superstep",
                budget.state(),
                self.held >> 20
            );
            return self.fail(None, why);
        }
        let waiting: Vec<(Pid, u32, bool)> = self
            .local
            .iter()
            .filter(|(_, l)| matches!(l.state, State::AtSync(_)))
            .map(|(pid, l)| (*pid, l.superstep, l.leaving))
            .collect();
        for (pid, s, leaving) in waiting {
            if leaving {
                self.prepare_handover(pid);
                continue;
            }
            if !self.barrier.ready(pid, s) {
                tracing::trace!(
                    job = self.job,
                    me = self.me,
                    pid,
                    s,
                    "waits for {}",
                    self.barrier.missing(pid, s)
                );
                continue;
            }
            let inbox = self.barrier.take(pid, s);
            let Some(l) = self.local.get_mut(&pid) else {
                continue;
            };
            let State::AtSync(mut p) = std::mem::replace(&mut l.state, State::Busy) else {
                continue;
            };
            l.superstep = s + 1;
            self.emit(PeerEvent::Progress {
                job: self.job,
                pid,
                superstep: s + 1,
            });
            let inbox = inbox
                .into_iter()
                .map(|(src, tag, payload)| Message {
                    src,
                    superstep: s,
                    tag,
                    payload,
                })
                .collect();
            p.process.begin_superstep(s + 1, inbox);
            self.spawn_resume(pid, *p);
        }
        self.collect_garbage();
        self.report_held();
    }

    /// Bring this job's share of the peer's held bytes up to date.
    fn report_held(&mut self) {
        let now = self.retained_bytes + self.store.total_bytes();
        let held = &self.env.stats.held;
        if now > self.held {
            held.fetch_add(now - self.held, Ordering::Relaxed);
        } else {
            held.fetch_sub(self.held - now, Ordering::Relaxed);
        }
        self.held = now;
        self.env.runtime.budget().set_held(self.job, now);
    }

    /// A leaving process at a sync: take a whole snapshot for its new host.
    fn prepare_handover(&mut self, pid: Pid) {
        let Some(l) = self.local.get_mut(&pid) else {
            return;
        };
        if l.handover.is_some() {
            return;
        }
        if let State::AtSync(p) = std::mem::replace(&mut l.state, State::Busy) {
            // Its `Done`s wait for its replicas as usual; the new host
            // repeats them after it replicated the snapshot itself.
            self.spawn_capture(pid, *p, false);
        }
    }

    /// Advance the safe point and drop what nobody can need any more.
    fn collect_garbage(&mut self) {
        let lowest_waiting = self
            .local
            .values()
            .filter(|l| !matches!(l.state, State::Exited))
            .map(|l| l.superstep)
            .min();
        // The newest superstep whose barrier is complete. `Done(q, s)` is
        // sent only once q's checkpoints before `s` are safe, so a complete
        // barrier `s` makes every process's checkpoint before `s` safe.
        let mut s = self.complete.map_or(0, |s| s + 1);
        // No `Done` can exist beyond the furthest local process (plus the
        // one superstep others may be ahead): once everyone exited, every
        // later barrier is trivially complete, so stop there.
        let horizon = self.local.values().map(|l| l.superstep).max().unwrap_or(0) + 1;
        while s <= horizon && self.barrier.complete(s) {
            self.complete = Some(s);
            let now = self.observed_ms();
            self.observer.on_complete(s, now);
            s += 1;
        }
        // The newest checkpointed superstep before it.
        let safe = self
            .complete
            .and_then(|c| newest_checkpointed_before(c, self.checkpoint_every))
            .or(self.safe);
        if safe <= self.safe {
            return;
        }
        self.safe = safe;
        let Some(g) = safe else { return };
        for msgs in self.retained.values_mut() {
            msgs.retain(|m| m.superstep >= g);
        }
        self.retained_bytes = self
            .retained
            .values()
            .map(|m| checkpoint::outbox_bytes(m))
            .sum();
        self.relays.retain(|&(_, s, _), _| s >= g);
        self.dones.retain(|&(_, s), d| s >= g || d.exited);
        let forget = lowest_waiting.map_or(g, |w| w.min(g));
        self.barrier.forget_before(forget);
    }

    fn begin_fetch(&mut self, pid: Pid) {
        if self.module.is_none() {
            let (_, restored) = self.deferred.get_or_insert_default();
            if !restored.contains(&pid) {
                restored.push(pid);
            }
            return;
        }
        let waiting: HashSet<PeerId> = self.links.keys().copied().collect();
        let best = self.store.newest(pid).cloned().map(Arc::new);
        self.local.insert(
            pid,
            Local {
                state: State::Fetching,
                superstep: 0,
                pending: VecDeque::new(),
                held: Vec::new(),
                capturing_exit: None,
                exit_mark: 0,
                acks: Vec::new(),
                leaving: false,
                handover: None,
            },
        );
        for &p in &waiting {
            self.send_to(p, Frame::FetchCheckpoint { pid });
        }
        self.fetches.insert(pid, Fetch { waiting, best });
        self.finish_fetch(pid);
    }

    fn on_snapshot(&mut self, from: PeerId, pid: Pid, snap: Option<Snapshot>) {
        if snap.as_ref().is_some_and(|s| s.pid != pid) {
            return;
        }
        let Some(f) = self.fetches.get_mut(&pid) else {
            return;
        };
        f.waiting.remove(&from);
        if let Some(s) = snap
            && f.best.as_ref().is_none_or(|b| s.superstep > b.superstep)
        {
            f.best = Some(Arc::new(s));
        }
        self.finish_fetch(pid);
    }

    fn finish_fetch(&mut self, pid: Pid) {
        let Some(f) = self.fetches.get(&pid) else {
            return;
        };
        if !f.waiting.is_empty() {
            return;
        }
        let f = self.fetches.remove(&pid).expect("checked above");
        match f.best {
            None => {
                tracing::warn!(
                    job = self.job,
                    pid,
                    "no snapshot of the process survived; starting it from the beginning"
                );
                self.emit(PeerEvent::ProcessRestored {
                    job: self.job,
                    pid,
                    superstep: 0,
                    epoch: self.epoch,
                    from_start: true,
                });
                self.local.remove(&pid);
                self.start_fresh(vec![pid]);
            }
            Some(snapshot) => {
                let runtime = self.env.runtime.clone();
                let Some(module) = self.module.clone() else {
                    unreachable!("begin_fetch defers until the program is here")
                };
                let info = self.info.clone();
                if let Some(l) = self.local.get_mut(&pid) {
                    l.state = State::Busy;
                }
                self.tasks.spawn(async move {
                    let snap = snapshot.clone();
                    let joined = tokio::task::spawn_blocking(move || {
                        if snap.exited {
                            // It had returned: nothing runs any more.
                            return Ok(None);
                        }
                        let process = runtime.restore(&module, info, &snap)?;
                        // Replicas that get this snapshot can take deltas against it.
                        Ok::<_, String>(Some((process, PageTracker::seeded(&snap))))
                    })
                    .await;
                    let r = match joined {
                        Ok(Ok(p)) => Ok(p.map(|(process, tracker)| Proc {
                            process,
                            tracker,
                            recent: VecDeque::new(),
                        })),
                        Ok(Err(e)) => Err(e),
                        Err(e) => Err(e.to_string()),
                    };
                    Task::Restored(pid, snapshot, r)
                });
            }
        }
    }

    fn on_restored(&mut self, pid: Pid, snapshot: Arc<Snapshot>, r: Result<Option<Proc>, String>) {
        let c = snapshot.superstep;
        let p = match r {
            Ok(p) => p,
            Err(e) => {
                return self.fail(
                    Some(pid),
                    format!(
                        "could not restore the process from its checkpoint of superstep {c}: {e}"
                    ),
                );
            }
        };
        let Some(l) = self.local.get_mut(&pid) else {
            return;
        };
        l.superstep = c;
        self.barrier.set_floor(pid, c);
        self.emit(PeerEvent::ProcessRestored {
            job: self.job,
            pid,
            superstep: c,
            epoch: self.epoch,
            from_start: false,
        });
        // Re-send what it sent since the safe point; receivers drop repeats.
        for m in snapshot.outbox.clone() {
            self.deliver(m);
        }
        self.flush_all();
        self.retained.insert(pid, snapshot.outbox.clone());
        self.retained_bytes = self
            .retained
            .values()
            .map(|m| checkpoint::outbox_bytes(m))
            .sum();
        // Its `Done`s go out once the snapshot is on its (new) replicas.
        let supersteps: BTreeSet<u32> = snapshot
            .outbox
            .iter()
            .map(|m| m.superstep)
            .chain([c])
            .collect();
        let held: Vec<(u32, ProcDone)> = supersteps
            .into_iter()
            .map(|s| {
                (
                    s,
                    done_of(pid, snapshot.exited && s == c, &snapshot.outbox, s),
                )
            })
            .collect();
        let targets = replicas_of(self.job, pid, self.me, &self.peers, self.replicas);
        for &r in &targets {
            for f in whole(&snapshot) {
                self.send_to(r, f);
            }
        }
        let l = self.local.get_mut(&pid).expect("checked above");
        l.held = held;
        l.pending = VecDeque::from([Pending {
            superstep: c,
            waiting: targets.into_iter().collect(),
            snapshot: snapshot.clone(),
            gates_own: true,
            // Its output up to `c` was delivered by its old host.
            output_mark: 0,
            unsent: Vec::new(),
        }]);
        l.state = match p {
            Some(p) => State::AtSync(Box::new(p)),
            None => State::Exited,
        };
        self.release_if_acked(pid);
    }

    fn on_inbound(&mut self, event: Inbound) {
        match event {
            Inbound::Connected { .. } => {}
            Inbound::Closed { from, error } => {
                // Its writer reconnects; partial checkpoint parts are void,
                // and so is a snapshot it was sending us: ask again.
                self.assemblers.remove(&from);
                if let Some(e) = error {
                    tracing::debug!(job = self.job, from, "connection from peer closed: {e}");
                }
                let asked: Vec<Pid> = self
                    .fetches
                    .iter()
                    .filter(|(_, f)| f.waiting.contains(&from))
                    .map(|(pid, _)| *pid)
                    .collect();
                for pid in asked {
                    self.send_to(from, Frame::FetchCheckpoint { pid });
                }
            }
            Inbound::SendFailed { to, error } => {
                tracing::info!(
                    job = self.job,
                    to,
                    "connection to peer #{to} failed: {error}; reconnecting"
                );
                if self.peers.contains(&to) {
                    // It did not say the job ended there: it may have died.
                    // The supernode checks and, if so, restores its
                    // processes now rather than when its lease runs out.
                    self.emit(PeerEvent::PeerUnreachable {
                        job: self.job,
                        peer: to,
                    });
                }
                if let Some(l) = self.links.remove(&to) {
                    l.task.abort();
                    let addr = l.addr;
                    self.open_link(to, addr);
                    self.resync(to, None);
                    self.resend_relayed(to);
                }
            }
            Inbound::PeerEnded { to } => {
                // Its job ended (finished or killed): the job is over, or a
                // newer assignment says who runs what. Re-sending would be
                // for nobody; a reassignment that still lists it reconnects.
                tracing::debug!(job = self.job, to, "the job ended on peer #{to}");
                if let Some(l) = self.links.remove(&to) {
                    l.task.abort();
                }
            }
            Inbound::Frame { from, frame } => {
                if !self.peers.contains(&from) {
                    return;
                }
                if let Err(e) = self.on_frame(from, frame) {
                    tracing::warn!(
                        job = self.job,
                        from,
                        "peer #{from} broke the data-plane protocol: {e}"
                    );
                    self.fail(
                        None,
                        format!("peer #{from} broke the data-plane protocol: {e}"),
                    );
                }
            }
        }
    }

    fn on_frame(&mut self, from: PeerId, frame: Frame) -> Result<(), ProtocolError> {
        match frame {
            Frame::Data { messages } => {
                for m in messages {
                    self.barrier.on_message(m)?;
                }
            }
            Frame::Done { superstep, procs } => {
                if from != self.me {
                    let now = self.observed_ms();
                    self.observer.on_done(from, superstep, now);
                }
                for d in procs {
                    self.barrier.on_done(superstep, d)?;
                }
            }
            f @ (Frame::CheckpointPart { .. } | Frame::Checkpoint(_)) => {
                let cap = (self.info.memory_limit as u64)
                    .saturating_add(self.info.outbox_limit as u64 * 4);
                let last = match &f {
                    Frame::Checkpoint(c) => Some((c.pid, c.superstep)),
                    _ => None,
                };
                let built = self
                    .assemblers
                    .entry(from)
                    .or_insert_with(|| Assembler::new(cap))
                    .push(f, &mut self.store);
                match built {
                    Ok(Some(Assembled::Checkpoint(snap))) => {
                        let (pid, superstep) = (snap.pid, snap.superstep);
                        tracing::trace!(target: "bspweb::timeline", pid, superstep, from, "replica stored");
                        self.store.insert(snap);
                        self.send_to(
                            from,
                            Frame::CheckpointAck {
                                pid,
                                superstep,
                                ok: true,
                            },
                        );
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::info!(job = self.job, from, "discarding a checkpoint: {e}");
                        if let Some((pid, superstep)) = last {
                            self.send_to(
                                from,
                                Frame::CheckpointAck {
                                    pid,
                                    superstep,
                                    ok: false,
                                },
                            );
                        }
                    }
                }
            }
            Frame::CheckpointAck { pid, superstep, ok } => self.on_ack(from, pid, superstep, ok),
            Frame::FetchCheckpoint { pid } => {
                if pid >= self.info.nprocs {
                    return Err(ProtocolError::NoSuchPid(pid));
                }
                if self.local.contains_key(&pid) {
                    // We host it: hand it over at its next sync (once our own
                    // assignment says it moves, if the asker is ahead of us).
                    self.handovers.entry(pid).or_default().insert(from);
                    self.hand_over(pid);
                } else {
                    match self.store.newest(pid) {
                        Some(s) => {
                            let s = s.clone();
                            for f in checkpoint::to_snapshot_frames(&s) {
                                self.send_to(from, f);
                            }
                        }
                        None => self.send_to(
                            from,
                            Frame::Snapshot {
                                pid,
                                snapshot: None,
                            },
                        ),
                    }
                }
            }
            f @ Frame::Snapshot { .. } => {
                let Frame::Snapshot { pid, .. } = &f else {
                    unreachable!("matched above")
                };
                let pid = *pid;
                let cap = (self.info.memory_limit as u64)
                    .saturating_add(self.info.outbox_limit as u64 * 4);
                let built = self
                    .assemblers
                    .entry(from)
                    .or_insert_with(|| Assembler::new(cap))
                    .push(f, &mut self.store);
                let snap = match built {
                    Ok(Some(Assembled::Fetched { snapshot, .. })) => snapshot,
                    Ok(_) => None,
                    Err(e) => {
                        tracing::info!(job = self.job, from, pid, "discarding a snapshot: {e}");
                        None
                    }
                };
                self.on_snapshot(from, pid, snap);
            }
            Frame::Relay {
                head,
                offset,
                bytes,
            } => self.on_relay(from, *head, offset, bytes)?,
            Frame::Program { epoch, msg } => self.on_program_msg(from, epoch, msg),
            Frame::Hello { .. } | Frame::Answer { .. } | Frame::Welcome | Frame::Reject { .. } => {
                return Err(ProtocolError::HandshakeFrame);
            }
            Frame::Probe(_) => {
                return Err(ProtocolError::ProbeFrame);
            }
        }
        Ok(())
    }

    /// Re-send to `peer` what it may have missed: messages to its pids (only
    /// to `only` if given) and every `Done` of ours; a pending checkpoint if
    /// it is a replica; pending snapshot requests.
    fn resync(&mut self, peer: PeerId, only: Option<&HashSet<Pid>>) {
        let wanted = |dst: Pid| match only {
            Some(set) => set.contains(&dst),
            None => true,
        };
        let msgs: Vec<WireMessage> = self
            .retained
            .values()
            .flatten()
            .filter(|m| self.placement[m.dst as usize] == peer && wanted(m.dst))
            .cloned()
            .collect();
        for m in msgs {
            self.deliver(m);
        }
        self.flush_all();
        let dones: Vec<(u32, ProcDone)> = self
            .dones
            .iter()
            .map(|(&(_, s), d)| (s, d.clone()))
            .collect();
        for (s, d) in dones {
            self.send_to(
                peer,
                Frame::Done {
                    superstep: s,
                    procs: vec![d],
                },
            );
        }
        if only.is_none() {
            let pending: Vec<Arc<Snapshot>> = self
                .local
                .values()
                .flat_map(|l| l.pending.iter())
                // Not yet sent at all: it goes out once the output is delivered.
                .filter(|p| p.waiting.contains(&peer) && p.unsent.is_empty())
                .map(|p| p.snapshot.clone())
                .collect();
            for s in pending {
                for f in whole(&s) {
                    self.send_to(peer, f);
                }
            }
            let fetching: Vec<Pid> = self
                .fetches
                .iter()
                .filter(|(_, f)| f.waiting.contains(&peer))
                .map(|(pid, _)| *pid)
                .collect();
            for pid in fetching {
                self.send_to(peer, Frame::FetchCheckpoint { pid });
            }
            // Acknowledgements of its checkpoints we hold may have been lost
            // with the connection; acknowledge the newest again (it answers
            // the owner's older pending checkpoints too; an owner ignores an
            // ack of a superstep it has no pending checkpoint of).
            let acks: Vec<Frame> = (0..self.info.nprocs)
                .filter(|&pid| self.placement[pid as usize] == peer)
                .filter_map(|pid| {
                    self.store.newest(pid).map(|s| Frame::CheckpointAck {
                        pid,
                        superstep: s.superstep,
                        ok: true,
                    })
                })
                .collect();
            for f in acks {
                self.send_to(peer, f);
            }
        }
    }

    /// Switch to a newer assignment. Returns false if this peer is no longer
    /// part of the job.
    fn reassign(&mut self, a: JobAssignment) -> bool {
        if a.epoch <= self.epoch || a.job != self.job || a.nprocs != self.info.nprocs {
            return true;
        }
        // Hosts change: supersteps around the change (restores, handovers)
        // say nothing about anyone's speed.
        let now = self.observed_ms();
        self.observer.interrupt(now);
        let placement = match check_assignment(self.me, &a) {
            Ok(p) => p,
            Err(e) => {
                tracing::info!(job = self.job, "leaving the job: {e}");
                return false;
            }
        };
        self.epoch = a.epoch;
        self.sites = sites_of(&a);
        let old_peers: HashSet<PeerId> = self.peers.iter().copied().collect();
        self.peers = a.peers.iter().map(|p| p.id).collect();
        self.placement = placement;
        self.env
            .registry
            .update_peers(self.job, self.me, self.peers.iter().copied());
        // Links: close removed peers, open new ones.
        let now: HashSet<PeerId> = self.peers.iter().copied().collect();
        // (From the old peer list, not the links: a peer whose job ended
        // has no link but may still be waited for.)
        let gone: Vec<PeerId> = old_peers
            .iter()
            .filter(|p| !now.contains(p) && **p != self.me)
            .copied()
            .collect();
        for p in &gone {
            if let Some(l) = self.links.remove(p) {
                l.task.abort();
            }
            self.assemblers.remove(p);
        }
        // A peer of the job whose job had ended here and is listed again
        // gets everything again, like a newcomer.
        let mut relinked = Vec::new();
        for p in &a.peers {
            if p.id != self.me && !self.links.contains_key(&p.id) {
                self.open_link(p.id, p.addr.clone());
                if old_peers.contains(&p.id) {
                    relinked.push(p.id);
                }
            }
        }
        // Replicas that are gone will not answer.
        for pid in self.local.keys().copied().collect::<Vec<_>>() {
            let Some(l) = self.local.get_mut(&pid) else {
                continue;
            };
            for p in l.pending.iter_mut() {
                for g in &gone {
                    p.waiting.remove(g);
                }
                // Replicas chosen among the new peer list get the checkpoint too.
                let targets = replicas_of(self.job, pid, self.me, &self.peers, self.replicas);
                let fresh: Vec<PeerId> = targets
                    .into_iter()
                    .filter(|t| !old_peers.contains(t) || gone.contains(t))
                    .collect();
                let snap = p.snapshot.clone();
                // Frames for replicas that are gone are void.
                p.unsent.retain(|(r, _)| !gone.contains(r));
                let held = !p.unsent.is_empty();
                for t in fresh {
                    p.waiting.insert(t);
                    for f in whole(&snap) {
                        if held {
                            p.unsent.push((t, f.into()));
                        } else if let Some(l) = self.links.get(&t) {
                            l.send(f);
                        }
                    }
                }
            }
            self.release_if_acked(pid);
        }
        for f in self.fetches.values_mut() {
            f.waiting.retain(|p| now.contains(p));
        }
        let fetching: Vec<Pid> = self.fetches.keys().copied().collect();
        for pid in fetching {
            self.finish_fetch(pid);
        }
        let restore: HashSet<Pid> = a.restore.iter().copied().collect();
        for &pid in &a.restore {
            let host = self.placement[pid as usize];
            if host == self.me {
                if !self.local.contains_key(&pid) {
                    self.begin_fetch(pid);
                }
            } else if let Some(l) = self.local.get_mut(&pid) {
                l.leaving = true;
            }
        }
        // Processes waiting for the program that no longer live here never
        // start; one restored here is fetched, not started fresh.
        let mut never_started = Vec::new();
        if let Some((fresh, restored)) = &mut self.deferred {
            let me = self.me;
            let placement = &self.placement;
            for p in fresh.iter().chain(restored.iter()) {
                if placement[*p as usize] != me && !never_started.contains(p) {
                    never_started.push(*p);
                }
            }
            restored.retain(|p| placement[*p as usize] == me);
            fresh.retain(|p| placement[*p as usize] == me && !restored.contains(p));
        }
        // Moved away before the program arrived: nothing to hand over, but
        // the supernode learns that this peer let go of them (a draining
        // peer then leaves the job).
        never_started.sort_unstable();
        for pid in never_started {
            self.emit(PeerEvent::ProcessHandedOver {
                job: self.job,
                pid,
                superstep: 0,
                epoch: self.epoch,
            });
        }
        // Processes here whose host moved without being listed (should not
        // happen) are handed over too.
        for (pid, l) in self.local.iter_mut() {
            if self.placement[*pid as usize] != self.me {
                l.leaving = true;
            }
        }
        // Re-send what the new hosts need.
        let mut by_host: HashMap<PeerId, HashSet<Pid>> = HashMap::new();
        for &pid in &restore {
            let host = self.placement[pid as usize];
            if host != self.me {
                by_host.entry(host).or_default().insert(pid);
            }
        }
        for (host, pids) in by_host {
            self.resync(host, Some(&pids));
        }
        // Messages to pids restored here that their old host never got.
        let to_me: Vec<WireMessage> = self
            .retained
            .values()
            .flatten()
            .filter(|m| restore.contains(&m.dst) && self.placement[m.dst as usize] == self.me)
            .cloned()
            .collect();
        for m in to_me {
            self.deliver(m);
        }
        let newcomers: Vec<PeerId> = now
            .iter()
            .filter(|p| !old_peers.contains(p) && **p != self.me)
            .copied()
            .collect();
        for p in newcomers {
            self.resync(p, Some(&HashSet::new()));
        }
        for p in relinked {
            self.resync(p, None);
            self.resend_relayed(p);
        }
        if !gone.is_empty() {
            self.relay_around(&gone);
            if self.module.is_none()
                && self
                    .dist
                    .as_ref()
                    .is_some_and(|d| gone.iter().any(|g| d.involves(*g)))
            {
                self.fall_back("a peer passing the program on left the job".into());
            }
        }
        true
    }
}

#[cfg(test)]
mod tests;
