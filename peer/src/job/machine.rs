//! The job machine: this peer's share of a job as a deterministic state
//! machine (issue 17). It runs supersteps, checkpoints every process, and
//! restores or hands over processes when the job's placement changes
//! (DESIGN.md, Execution 2–7; docs/fault-tolerance.md).
//!
//! Per process and superstep: resume it until it syncs or returns; route
//! what it sent (local destinations straight into the [`Barrier`], remote
//! ones in `Data` frames) and retain it; at a checkpointed superstep capture
//! its state and send it to its replicas; once they all acknowledged its
//! checkpoints before `s − 1`, tell every peer `Done(pid, s)` (with the
//! acknowledgements this peer held back for each of them); when the
//! barrier says the process has everything for `s`, give it its inbox and
//! resume it.
//!
//! A new assignment (a higher epoch) changes the routing table; processes
//! that moved here are restored from the newest snapshot any peer holds, and
//! processes that moved away are handed over at their next sync. Everything
//! another peer may need again — messages and `Done`s since the newest
//! globally safe checkpoint — is retained and re-sent to a process's new
//! host, and to any peer whose connection broke and came back.
//!
//! The machine is driven from outside: [`Machine::handle`] takes one
//! [`Input`] (a frame, a process's result, an assignment, delivered output,
//! a timer) with the time it happened, and [`Machine::poll_timeout`] says
//! when it next wants a [`Input::Timer`]. What it does to the world goes
//! through its [`JobIo`]: send a frame, open or close a link, resume,
//! capture or restore a process, emit an event. The peer's tokio driver
//! (`job/io.rs`) implements `JobIo` over sockets, blocking threads and
//! wasmtime; the whole-job simulator (`job/sim.rs`) over a seeded network
//! and a deterministic process model.
//!
//! **Architecture Invariant:** the machine does no IO, reads no clock, spawns
//! nothing and uses no global random number generator: the same inputs at the
//! same times give the same calls into `JobIo`. `scripts/test` checks that
//! no file of `job/machine*` names tokio, wasmtime, a clock or a socket.
//!
//! Its handlers live by sub-protocol in `machine/`: `program_fetch` (Robber
//! or download, compile), `routing` (links, message routing, relayed
//! multicasts), `supersteps` (resumes, captures, the barrier's `pump`),
//! `replication` (checkpoints to replicas, handovers, retention), `restore`
//! (from the newest snapshot the job's peers hold), `inbound` (frames, and
//! the [`ProtocolError`]s that fail a job), `epochs` (a new assignment) and
//! `rules` (captures and the small rules of checkpoints and `Done`s).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bsp_api::control::{JobAssignment, PeerEvent};
use bsp_api::wire::{Frame, ProcDone, RelayHead, WireMessage, message_groups};
use bsp_api::{JobId, PeerId, Pid};

use super::assignment::*;
use super::errors::{FetchError, HostError, Source};
use super::hosts::Hosts;
use crate::barrier::Barrier;
use crate::checkpoint::{self, Assembled, Assembler, PageTracker, ReplicaStore, Snapshot};
use crate::net::{self, Inbound, Outgoing};
use crate::observe::Acc;
use crate::program;
use crate::relay::{self, BroadcastPolicy, Inflight, RelayError, RelayKey, Site};
use crate::runtime::{Message, Outcome};

pub(crate) use rules::*;

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

/// How often the machine hands what it observed of the job's other peers
/// to the next renewal, ms.
const OBSERVE_EVERY_MS: u64 = 1000;

/// Most heads one multicast may arrive with (each restore of its sender
/// can add one).
const MAX_HEADS: usize = 8;

/// Decoded resources, to replace the job's (none when they came inline).
pub(crate) type Resources = Option<Vec<(String, Vec<u8>)>>;

/// A job's program as downloaded, with its bytes to pass on to other
/// peers, and its resources (`bsp_api::control::encode_resources` form;
/// empty when the assignment carries them or there are none).
pub struct Downloaded<M> {
    /// Compiled (`M`) when it came from the cache; `None` when it came from
    /// the supernode and is still to be compiled ([`JobIo::compile`]), so
    /// its bytes reach the job's other peers by Robber while this peer
    /// compiles them.
    pub module: Option<M>,
    pub bytes: bytes::Bytes,
    pub resources: bytes::Bytes,
}

/// What the work that gets the program reports.
pub(crate) enum ProgramEvent<M> {
    /// The direct download (or the cache) answered.
    Downloaded(Result<Downloaded<M>, FetchError>),
    /// The downloaded program compiled (or why not).
    Compiled(Result<M, FetchError>),
    /// The bundle Robber assembled: the program compiled and the resources
    /// decoded (or why not).
    Assembled(Result<(M, Resources), FetchError>),
}

/// A process as the machine sees it: the wasm instance in the peer, a
/// deterministic state function in the simulator.
pub(crate) trait Guest: Send + 'static {
    /// Enter superstep `superstep` with these messages.
    fn begin_superstep(&mut self, superstep: u32, inbox: Vec<Message>);
    /// The reporter mark of its last output record.
    fn output_mark(&self) -> u64;
    /// Its state now, with `outbox`; `reuse` is an older snapshot whose
    /// buffers nobody else holds.
    fn checkpoint(
        &mut self,
        tracker: &mut PageTracker,
        outbox: Vec<WireMessage>,
        exited: bool,
        reuse: Option<Snapshot>,
    ) -> Snapshot;
}

/// Everything the machine asks of the world. Each call returns at once;
/// what it starts comes back later as an [`Input`].
pub(crate) trait JobIo {
    type Guest: Guest;
    /// A compiled program.
    type Program;

    /// Emit an event for the supernode; returns its reporter mark.
    fn emit(&mut self, event: PeerEvent) -> u64;
    /// How many of the reporter's events reached the supernode (marks up to
    /// it are delivered); it grows, with an [`Input::OutputDelivered`].
    fn delivered(&self) -> u64;

    /// Open the connection to `peer` (kept open, re-dialled while the job
    /// runs; a failure comes back as [`Inbound::SendFailed`]).
    fn open_link(&mut self, peer: PeerId, addr: &str, epoch: u64);
    /// Close it.
    fn close_link(&mut self, peer: PeerId);
    /// Queue a frame on the connection to `peer`.
    fn send(&mut self, peer: PeerId, frame: Outgoing);

    /// Instantiate `pid` and run its first superstep
    /// ([`Task::Resumed`]).
    fn start(&mut self, pid: Pid, redundant: bool, checkpoint_every: u32);
    /// Run `pid`'s superstep `superstep` ([`Task::Resumed`]); with
    /// `capture`, a sync or exit is captured right after it: an
    /// [`Input::Early`] with the messages, then a [`Task::Captured`].
    /// `alone`: nothing of the job needs the machine until this superstep
    /// ends ([`Machine::runs_alone`]), so it may run on the driver's own
    /// thread, however long it takes.
    fn resume(
        &mut self,
        pid: Pid,
        superstep: u32,
        p: Proc<Self::Guest>,
        capture: Option<CaptureInput>,
        alone: bool,
    );
    /// Capture `p` ([`capture`]) and encode it for `targets`
    /// ([`Task::Captured`]).
    fn capture(&mut self, pid: Pid, p: Proc<Self::Guest>, c: CaptureRequest);
    /// Rebuild `pid` from `snapshot` ([`Task::Restored`]).
    fn restore(&mut self, pid: Pid, snapshot: Arc<Snapshot>, digests: Option<u32>);
    /// Stop every process of the job at its next check.
    fn kill(&mut self);

    /// The program from the cache: compiled, and its bytes.
    fn cached_program(&self) -> Option<(Self::Program, bytes::Bytes)>;
    /// Start the direct download ([`ProgramEvent::Downloaded`]).
    fn start_download(&mut self);
    /// Compile the downloaded program `bytes` ([`ProgramEvent::Compiled`]).
    fn compile(&mut self, bytes: bytes::Bytes);
    /// Split Robber's `bundle` at `split` into program and resources,
    /// check and compile ([`ProgramEvent::Assembled`]).
    fn assemble(&mut self, bundle: Vec<u8>, split: usize);
    /// The program is here (with resources that came apart).
    fn program_ready(&mut self, program: Self::Program, resources: Resources);

    /// The job's peers changed (the listener admits these).
    fn update_peers(&mut self, peers: &[PeerId]);
    /// The bytes this job holds for fault tolerance now.
    fn set_held(&mut self, bytes: u64);
    /// `Some(why)` when the peer is over its memory budget and this job
    /// holds the most of it.
    fn over_budget(&self) -> Option<String>;
    /// A checkpoint was taken (its frames go out as they are written).
    fn count_checkpoint(&mut self);
    /// What this peer saw of the job's other peers, for the next renewal:
    /// the barrier has waited since `since_ms` (machine time) for
    /// `waiting_for`.
    fn publish_observations(
        &mut self,
        taken: BTreeMap<PeerId, Acc>,
        hosted: &dyn Fn(PeerId) -> u32,
        since_ms: u64,
        waiting_for: Vec<Pid>,
    );
}

/// One thing that happened to the job, for [`Machine::handle`].
// An input is moved into `handle` at once, never stored in bulk: boxing
// the large variant would cost an allocation per superstep for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Input<I: JobIo> {
    /// From the data plane.
    Inbound(Inbound),
    /// A resume, capture or restore finished.
    Task(Task<I::Guest>),
    /// A process's thread reached a checkpointed sync and captures it.
    Early(Early),
    /// The program arrived (or could not).
    Program(ProgramEvent<I::Program>),
    /// More of the reporter's events reached the supernode.
    OutputDelivered,
    /// A newer assignment.
    Assignment(Box<JobAssignment>),
    /// The time [`Machine::poll_timeout`] asked for came.
    Timer,
    /// Whatever ran a process failed, so which process is unknown.
    ThreadFailed(HostError),
}

/// Whether the job goes on here after an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    /// This peer is no longer part of the job.
    Leave,
}

/// A process and what its checkpoints need, moved together between the
/// machine and whoever runs it.
pub(crate) struct Proc<G> {
    pub(crate) process: G,
    pub(crate) tracker: PageTracker,
    /// The last snapshots `tracker` took (newest last, at most
    /// [`checkpoint::RECYCLE_DEPTH`]): the next capture recycles the memory
    /// buffer of one that nobody else holds any more (its replicas
    /// acknowledged it).
    pub(crate) recent: VecDeque<Arc<Snapshot>>,
}

impl<G> Proc<G> {
    /// A process with a fresh page tracker (with state digests every
    /// `checkpoint_every` supersteps when the job runs copies).
    pub(crate) fn new(process: G, redundant: bool, checkpoint_every: u32) -> Proc<G> {
        Proc {
            process,
            tracker: if redundant {
                PageTracker::new().with_state_digests(checkpoint_every)
            } else {
                PageTracker::new()
            },
            recent: VecDeque::new(),
        }
    }
}

enum State<G> {
    /// A resume, capture or restore is running.
    Busy,
    /// At sync of its current superstep, waiting for its barrier.
    AtSync(Box<Proc<G>>),
    /// Returned from `main`.
    Exited,
    /// Waiting for the snapshots other peers hold.
    Fetching,
}

struct Local<G> {
    state: State<G>,
    /// The superstep it is in (or at the sync of).
    superstep: u32,
    /// Checkpoints not yet acknowledged by all their replicas (or whose
    /// output is not yet delivered), oldest first. Replication overlaps
    /// the next two supersteps, so there are at most three: `K_{s-2}` and
    /// `K_{s-1}` still in flight and `K_s` just taken (`Done(s + 1)` waits
    /// for `K_{s-1}`, so the barrier of `s + 1` cannot pass before it is
    /// safe).
    pending: VecDeque<Pending>,
    /// `Done`s not yet sent, ascending: `Done(s)` goes out once every
    /// checkpoint before `s − 1` is safe ([`may_announce`]).
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

impl<G> Local<G> {
    /// A process that just came to this peer, in `state`, before its first
    /// superstep here.
    fn new(state: State<G>) -> Local<G> {
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

pub(crate) struct Pending {
    superstep: u32,
    waiting: BTreeSet<PeerId>,
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

impl Pending {
    /// Whether its frames may leave for the replicas, `delivered` being
    /// the reporter's mark: its output reached the supernode and the
    /// copies agreed on it.
    fn may_leave(&self, delivered: u64) -> bool {
        delivered >= self.output_mark && self.agreed
    }
}

/// A checkpoint's frames for each replica it was planned for: planned by
/// the capture, made by the first connection writer that sends them
/// ([`rules::CheckpointFrames`], once per distinct plan: replicas with the
/// same base share the bytes).
pub(crate) type Planned = Vec<(PeerId, Outgoing)>;

/// What a process's thread says as soon as the guest reached a sync that
/// is checkpointed (or returned), before it captures the process there: the
/// messages it sent go out while the capture runs.
pub(crate) struct Early {
    pub(crate) pid: Pid,
    pub(crate) exited: bool,
    pub(crate) out: Vec<WireMessage>,
}

/// What a capture taken right after its superstep needs from the machine,
/// fixed when the superstep starts.
pub(crate) struct CaptureInput {
    /// The retained outbox so far (the superstep's messages are added).
    pub(crate) outbox: Vec<WireMessage>,
    /// Who gets the checkpoint.
    pub(crate) targets: Vec<PeerId>,
}

/// A capture the machine asks for at a sync it saw (an exit, a handover).
pub(crate) struct CaptureRequest {
    pub(crate) outbox: Vec<WireMessage>,
    pub(crate) exited: bool,
    /// Replicas' answers since the last capture, for its page tracker.
    pub(crate) acks: Vec<(PeerId, u32, bool)>,
    pub(crate) targets: Vec<PeerId>,
}

/// A process after a superstep: how it ended, and the messages it sent
/// when it synced or returned (none otherwise).
pub(crate) type Resumed<G> = Result<(Proc<G>, Outcome, Vec<WireMessage>), HostError>;

/// A process after a capture: the snapshot, and its frames for its replicas.
pub(crate) type Captured<G> = Result<(Proc<G>, Arc<Snapshot>, Planned), HostError>;

/// What a resume, capture or restore hands back.
pub(crate) enum Task<G> {
    Resumed(Pid, Resumed<G>),
    Captured(Pid, Captured<G>),
    /// `None`: the snapshot is of a process that had exited.
    Restored(Pid, Arc<Snapshot>, Result<Option<Proc<G>>, HostError>),
}

/// The few numbers of the job the machine checks frames against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) nprocs: u32,
    /// Linear-memory cap per process, bytes.
    pub(crate) memory_limit: usize,
    /// Bytes of messages one process may queue per superstep.
    pub(crate) outbox_limit: usize,
}

/// How the machine is set up, besides the assignment.
pub(crate) struct Setup {
    pub(crate) me: PeerId,
    pub(crate) limits: Limits,
    pub(crate) broadcast: BroadcastPolicy,
}

pub(crate) struct Machine<I: JobIo> {
    io: I,
    info: Limits,
    /// The time of the input being handled, ms since the machine started.
    now: u64,
    /// When the observations go to the next renewal again.
    next_observe: u64,
    job: JobId,
    me: PeerId,
    epoch: u64,
    checkpoint_every: u32,
    replicas: usize,
    /// Who runs each pid (each copy, with redundancy).
    hosts: Hosts,
    /// The job's peers (this one included), in assignment order.
    peers: Vec<PeerId>,
    barrier: Barrier,
    local: BTreeMap<Pid, Local<I::Guest>>,
    /// Messages local processes sent in supersteps ≥ `safe`, per source.
    retained: BTreeMap<Pid, Vec<WireMessage>>,
    /// Bytes of `retained` ([`checkpoint::outbox_bytes`]).
    retained_bytes: u64,
    /// What this job holds for fault tolerance, as last told to `io`.
    held: u64,
    /// `Done`s of local processes already sent, per (pid, superstep).
    dones: BTreeMap<(Pid, u32), ProcDone>,
    /// The newest superstep whose barrier is complete here.
    complete: Option<u32>,
    /// How the job's other peers keep up ([`crate::observe`]), in machine
    /// time.
    observer: crate::observe::Observer,
    /// Acknowledgements of other peers' checkpoints held back to travel
    /// with this peer's next `Done` to them: per owner's peer, the newest
    /// superstep held per pid ([`ack_may_wait`]).
    held_acks: BTreeMap<PeerId, BTreeMap<Pid, u32>>,
    /// The newest checkpointed superstep before `complete − 1`: every process
    /// has a safe checkpoint at or after it, so nobody is ever restored from
    /// before it.
    safe: Option<u32>,
    store: ReplicaStore,
    assemblers: BTreeMap<PeerId, Assembler>,
    failed: bool,
    /// Getting the program (`machine/program_fetch.rs`).
    program: ProgramFetch,
    /// Connections, routes and multicasts (`machine/routing.rs`).
    routing: Routing,
    /// Processes being restored or handed over (`machine/restore.rs`).
    restores: Restores,
}

impl<I: JobIo> Machine<I> {
    /// The machine of `a` on this peer (`hosts` from
    /// [`check_assignment`]), at time 0: it opens its links, asks for the
    /// program and starts (or restores) its processes once it is here.
    pub(crate) fn new(io: I, setup: Setup, a: &JobAssignment, hosts: Hosts) -> Machine<I> {
        let me = setup.me;
        let mut m = Machine {
            io,
            info: setup.limits,
            now: 0,
            next_observe: OBSERVE_EVERY_MS,
            job: a.job,
            me,
            epoch: a.epoch,
            checkpoint_every: a.limits.checkpoint_every.max(1),
            replicas: a.limits.replicas as usize,
            barrier: Barrier::with_quorum(a.nprocs, setup.limits.outbox_limit, hosts.copies()),
            hosts,
            peers: a.peers.iter().map(|p| p.id).collect(),
            local: BTreeMap::new(),
            retained: BTreeMap::new(),
            retained_bytes: 0,
            held: 0,
            dones: BTreeMap::new(),
            complete: None,
            observer: crate::observe::Observer::new(0),
            safe: None,
            store: ReplicaStore::new(),
            held_acks: BTreeMap::new(),
            assemblers: BTreeMap::new(),
            failed: false,
            program: ProgramFetch::new(a),
            routing: Routing {
                broadcast: setup.broadcast,
                links: BTreeMap::new(),
                sites: sites_of(a),
                relays: BTreeMap::new(),
                waiting: VecDeque::new(),
                waiting_bytes: 0,
            },
            restores: Restores::default(),
        };
        m.elect();
        for p in &a.peers {
            if p.id != me {
                m.open_link(p.id, p.addr.clone());
            }
        }
        let restore: BTreeSet<Pid> = a.restore.iter().copied().collect();
        let mine: Vec<Pid> = m.hosts.pids_on(me);
        let (fresh, restored): (Vec<Pid>, Vec<Pid>) =
            mine.into_iter().partition(|p| !restore.contains(p));
        m.program.deferred = Some((fresh, restored));
        m.get_program(a);
        m.pump();
        m
    }

    /// What the machine does with `input`, which happened at `now` (ms
    /// since it started; never earlier than the last input's).
    pub(crate) fn handle(&mut self, input: Input<I>, now: u64) -> Flow {
        self.now = self.now.max(now);
        match input {
            Input::Inbound(event) => self.on_inbound(event),
            Input::Task(task) => self.on_task(task),
            Input::Early(early) => self.on_early(early),
            Input::Program(p) => self.on_program(p),
            Input::OutputDelivered => self.on_output_delivered(),
            Input::Assignment(a) => {
                if !self.reassign(*a) {
                    return Flow::Leave;
                }
            }
            Input::Timer => self.on_timer(),
            Input::ThreadFailed(e) => {
                self.fail(None, format!("a process could not run: {e}"));
            }
        }
        self.pump();
        self.flush_acks();
        Flow::Continue
    }

    /// When the machine next wants an [`Input::Timer`] (machine time, ms).
    pub(crate) fn poll_timeout(&self) -> u64 {
        match self.stall_at() {
            Some(stall) => stall.min(self.next_observe),
            None => self.next_observe,
        }
    }

    /// The same, to change.
    pub(crate) fn io_mut(&mut self) -> &mut I {
        &mut self.io
    }

    /// When a peer waiting for the program by Robber gives up on it.
    fn stall_at(&self) -> Option<u64> {
        let waiting_for_robber =
            !self.program.has_program && self.program.dist.as_ref().is_some_and(|d| !d.is_root());
        let allowance = u64::try_from(self.stall_allowance().as_millis()).unwrap_or(u64::MAX);
        waiting_for_robber.then(|| self.program.dist_progress.saturating_add(allowance))
    }

    fn on_timer(&mut self) {
        if self.stall_at().is_some_and(|t| self.now >= t) {
            let secs = self.stall_allowance().as_secs();
            self.fall_back(format!("no piece of the program arrived for {secs} s"));
        }
        if self.now >= self.next_observe {
            self.publish_observations();
            self.next_observe = self.now + OBSERVE_EVERY_MS;
        }
    }

    fn emit(&mut self, e: PeerEvent) {
        self.io.emit(e);
    }

    /// Hand what this peer saw of the job's other peers to the next
    /// renewal, and the processes the barrier waits for once it waits long.
    fn publish_observations(&mut self) {
        let since = self.observer.waiting_since();
        let report_after =
            u64::try_from(crate::observe::REPORT_WAIT_AFTER.as_millis()).unwrap_or(u64::MAX);
        let waiting_for = if self.now.saturating_sub(since) >= report_after
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
        self.io
            .publish_observations(self.observer.take(), &hosted, since, waiting_for);
    }

    /// Tell the supernode this peer let go of `pid` at `superstep`.
    fn handed_over(&mut self, pid: Pid, superstep: u32) {
        self.emit(PeerEvent::ProcessHandedOver {
            job: self.job,
            pid,
            superstep,
            epoch: self.epoch,
        });
    }

    fn status(&mut self, text: String) {
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
        // The process's superstep; for the whole job here, the furthest of
        // its local processes.
        let superstep = match pid {
            Some(p) => self.local.get(&p).map_or(0, |l| l.superstep),
            None => self.local.values().map(|l| l.superstep).max().unwrap_or(0),
        };
        tracing::warn!(job = self.job, ?pid, "job failed on this peer: {reason}");
        self.emit(PeerEvent::ProcessFailed {
            job: self.job,
            pid,
            superstep,
            reason,
        });
        self.failed = true;
        self.io.kill();
        self.local.clear();
    }
}

#[cfg(test)]
impl<I: JobIo> Machine<I> {
    /// The invariants that keep the machine's memory bounded, checked by
    /// the simulator after every input: nothing retained from before the
    /// safe point, at most `checkpoint_every + 2` supersteps (plus the
    /// spread of the local processes) retained past it, at most three
    /// checkpoints pending per process (plus a restored process's catch-up),
    /// and the bytes held as counted.
    pub(crate) fn audit(&self) -> Result<(), String> {
        if self.failed {
            return Ok(());
        }
        if let (Some(g), Some(c)) = (self.safe, self.complete)
            && g > c
        {
            return Err(format!(
                "the safe point {g} is past the complete barrier {c}"
            ));
        }
        if let Some(g) = self.safe {
            if let Some(m) = self.retained.values().flatten().find(|m| m.superstep < g) {
                return Err(format!(
                    "pid {} still retains a message of superstep {} behind the safe point {g}",
                    m.src, m.superstep
                ));
            }
            // In steady state the local processes are within a superstep of
            // each other and of the newest barrier complete here, and the
            // safe point trails them by at most `checkpoint_every + 2`. A
            // process restored from an older checkpoint than another's
            // (found by the simulator, seed 557238) widens that by their
            // distance until it catches up; one restored from a checkpoint
            // newer than the barriers this peer has seen complete (it
            // joined the job late, seed 691398) is ahead of them until the
            // other processes' `Done`s arrive. So what is bounded is how
            // far the safe point trails the complete barrier.
            let running = self
                .local
                .values()
                .filter(|l| !matches!(l.state, State::Exited))
                .map(|l| l.superstep);
            let newest_local = running.clone().max().unwrap_or(0);
            let spread = newest_local - running.min().unwrap_or(0);
            let ahead = newest_local.saturating_sub(self.complete.map_or(0, |c| c + 1));
            let bound = self.checkpoint_every + 3 + spread + ahead;
            let newest = self.retained.values().flatten().map(|m| m.superstep).max();
            if let Some(n) = newest
                && n - g > bound
            {
                return Err(format!(
                    "messages of supersteps {g}..={n} are retained, more than checkpoint_every + 3 + the local processes' spread + how far they are ahead of the complete barrier = {bound}"
                ));
            }
            if let Some(&(_, s, _)) = self.routing.relays.keys().find(|&&(_, s, _)| s < g) {
                return Err(format!(
                    "a multicast of superstep {s} is kept behind the safe point {g}"
                ));
            }
        }
        let bytes: u64 = self
            .retained
            .values()
            .map(|m| checkpoint::outbox_bytes(m))
            .sum();
        if bytes != self.retained_bytes {
            return Err(format!(
                "retained messages take {bytes} bytes, counted as {}",
                self.retained_bytes
            ));
        }
        if self.held != self.retained_bytes + self.store.total_bytes() {
            return Err("the bytes held are not what was reported".into());
        }
        for (pid, l) in &self.local {
            // Three in flight, and one that gates the process's own `Done`
            // (an exit, or a restored snapshot). A process restored from
            // checkpoint `r` older than the complete barrier `c` replays
            // supersteps `r + 1..=c + 1` without waiting for
            // acknowledgements (their barriers are complete), capturing
            // each, and a drain may then hand it over, capturing again
            // (seed 1126136: restored from 1 with barrier 2 complete,
            // pending 1, 2, 3, 3): `c − r` more than in steady state, where
            // the oldest pending checkpoint is `c` itself.
            let oldest = l.pending.front().map(|p| p.superstep);
            let catch_up = match (oldest, self.complete) {
                (Some(o), Some(c)) => c.saturating_sub(o) as usize,
                _ => 0,
            };
            if l.pending.len() > 4 + catch_up {
                return Err(format!(
                    "pid {pid} has {} checkpoints pending, more than 4 + its catch-up of {catch_up} supersteps",
                    l.pending.len()
                ));
            }
        }
        Ok(())
    }

    /// What the machine drives.
    pub(crate) fn io(&self) -> &I {
        &self.io
    }

    /// `peer` is one of the job's peers in this machine's epoch.
    pub(crate) fn has_peer(&self, peer: PeerId) -> bool {
        self.peers.contains(&peer)
    }

    /// Where each local process stands, for a failed simulation.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!(
            "epoch {}, peers {:?}, complete {:?}, safe {:?}, links {:?}, fetching {:?}",
            self.epoch,
            self.peers,
            self.complete,
            self.safe,
            self.routing.links.keys().collect::<Vec<_>>(),
            self.restores.fetches.keys().collect::<Vec<_>>()
        );
        for (pid, l) in &self.local {
            let state = match l.state {
                State::Busy => "busy",
                State::AtSync(_) => "at sync",
                State::Exited => "exited",
                State::Fetching => "fetching",
            };
            s.push_str(&format!(
                "; pid {pid} {state} in {} (pending {:?} waiting for {:?}, held Dones {:?}{})",
                l.superstep,
                l.pending.iter().map(|p| p.superstep).collect::<Vec<_>>(),
                l.pending.iter().map(|p| &p.waiting).collect::<Vec<_>>(),
                l.held.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
                if matches!(l.state, State::AtSync(_)) {
                    format!(
                        ", barrier waits for {}",
                        self.barrier.missing(*pid, l.superstep)
                    )
                } else {
                    String::new()
                }
            ));
        }
        s
    }
}

mod epochs;
mod inbound;
mod program_fetch;
mod replication;
mod restore;
mod routing;
mod rules;
mod supersteps;

use program_fetch::ProgramFetch;
use restore::Restores;
use routing::Routing;
