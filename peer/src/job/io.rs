//! The job machine's world in the peer ([`TokioIo`]): connections to the
//! job's other peers (`net`'s writers), processes resumed, captured and
//! restored on blocking threads (at most `slots` at once) in wasmtime, the
//! program downloaded or compiled, and the reporter, the peer's counters and
//! its memory budget.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bsp_api::control::{JobAssignment, PeerEvent};
use bsp_api::wire::WireMessage;
use bsp_api::{JobId, PeerId, Pid};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use wasmtime::Module;

use super::machine::{
    CaptureInput, CaptureRequest, Early, Guest, JobIo, Proc, ProgramEvent, Resources, Task,
    capture, timeline, wire_messages,
};
use super::{Download, FetchError, Fetched, HostError, JobEnv, Source, unpack_resources};
use crate::checkpoint::{PageTracker, Snapshot};
use crate::net::{self, Dial, Inbound, Outgoing};
use crate::observe::Acc;
use crate::runtime::{JobInfo, Message, Outcome, Process, Runtime};

impl Guest for Process {
    fn begin_superstep(&mut self, superstep: u32, inbox: Vec<Message>) {
        Process::begin_superstep(self, superstep, inbox);
    }

    fn output_mark(&self) -> u64 {
        Process::output_mark(self)
    }

    fn checkpoint(
        &mut self,
        tracker: &mut PageTracker,
        outbox: Vec<WireMessage>,
        exited: bool,
        reuse: Option<Snapshot>,
    ) -> Snapshot {
        match reuse {
            Some(previous) => self.checkpoint_reusing(tracker, outbox, exited, previous),
            None => Process::checkpoint(self, tracker, outbox, exited),
        }
    }
}

/// Where what the driver's tasks produce goes.
pub(super) struct Channels {
    /// Frames and connection events (the writers report failures here).
    pub(super) events: mpsc::Sender<Inbound>,
    pub(super) program: mpsc::UnboundedSender<ProgramEvent<Module>>,
    pub(super) early: mpsc::UnboundedSender<Early>,
}

/// [`JobIo`] over tokio, blocking threads and wasmtime.
pub(super) struct TokioIo {
    env: JobEnv,
    job: JobId,
    me: PeerId,
    token: String,
    program_hash: String,
    resources_hash: String,
    info: Arc<JobInfo>,
    module: Option<Module>,
    writers: HashMap<PeerId, (mpsc::UnboundedSender<Outgoing>, JoinHandle<()>)>,
    tasks: JoinSet<Task<Process>>,
    /// Supersteps that ran on the driver's thread, done: handed back
    /// before the task set's (no task, no wake-up).
    ran: VecDeque<Task<Process>>,
    /// The time those took: once it reaches `INLINE_MAX`, further
    /// processes go to blocking threads (in parallel) until the driver has
    /// taken them all.
    ran_for: Duration,
    channels: Channels,
    download: Option<Download>,
    /// What this job adds to `env.stats.held`.
    held: u64,
    /// Machine time 0.
    origin: Instant,
    /// Whether short supersteps may run on the driver's own thread: on a
    /// multi-threaded runtime, whose `block_in_place` can hand the worker's
    /// other tasks to another thread when one runs long. (With one worker,
    /// the peer's default, they wait for a short superstep: `inline_max`
    /// as predicted; when mispredicted, until the first epoch tick after
    /// `INLINE_HAND_OFF_AFTER`, at most `EPOCH_TICK` later.)
    inline: bool,
}

impl TokioIo {
    pub(super) fn new(
        env: JobEnv,
        a: &JobAssignment,
        me: PeerId,
        info: Arc<JobInfo>,
        download: Download,
        channels: Channels,
        origin: Instant,
    ) -> TokioIo {
        TokioIo {
            env,
            job: a.job,
            me,
            token: a.job_token.clone(),
            program_hash: a.program_hash.clone(),
            resources_hash: a.resources_hash.clone(),
            info,
            module: None,
            writers: HashMap::new(),
            tasks: JoinSet::new(),
            ran: VecDeque::new(),
            ran_for: Duration::ZERO,
            channels,
            download: Some(download),
            held: 0,
            origin,
            inline: crate::runtime::on_multi_thread_runtime(),
        }
    }

    /// The next resume, capture or restore that finished (`None` when none
    /// runs).
    pub(super) async fn join_next(
        &mut self,
    ) -> Option<Result<Task<Process>, tokio::task::JoinError>> {
        if let Some(task) = self.ran.pop_front() {
            if self.ran.is_empty() {
                self.ran_for = Duration::ZERO;
            }
            // Ready at once, so count it against the task's budget: a job
            // whose processes only run here would otherwise never let the
            // driver yield its worker thread.
            tokio::task::coop::consume_budget().await;
            return Some(Ok(task));
        }
        self.tasks.join_next().await
    }

    /// The job is over here: stop its processes and close its connections.
    /// A superstep that ran on the driver's thread: its result is the next
    /// finished task.
    fn ran_here(&mut self, task: Task<Process>) {
        self.ran.push_back(task);
        self.env
            .stats
            .inline_supersteps
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn shut_down(&mut self) {
        self.env.stats.observed.forget(self.job);
        self.info.kill.store(true, Ordering::Relaxed);
        self.tasks.abort_all();
        self.ran.clear();
        self.ran_for = Duration::ZERO;
        for (_, (_, task)) in self.writers.drain() {
            task.abort();
        }
    }

    fn module(&self) -> Module {
        self.module
            .clone()
            .expect("the machine starts processes only once the program is here")
    }
}

impl Drop for TokioIo {
    fn drop(&mut self) {
        // The job's memory goes with it.
        self.env.stats.held.fetch_sub(self.held, Ordering::Relaxed);
        self.env.runtime.budget().set_held(self.job, 0);
    }
}

impl JobIo for TokioIo {
    type Guest = Process;
    type Program = Module;

    fn emit(&mut self, event: PeerEvent) -> u64 {
        self.env.reporter.emit_marked(event)
    }

    fn delivered(&self) -> u64 {
        self.env.reporter.delivered_count()
    }

    fn open_link(&mut self, peer: PeerId, addr: &str, epoch: u64) {
        let (wtx, wrx) = mpsc::unbounded_channel();
        let dial = Dial {
            addr: addr.to_string(),
            job: self.job,
            from: self.me,
            to: peer,
            token: self.token.clone(),
            epoch,
            deadline: Instant::now() + self.env.connect_timeout,
        };
        let written = self.env.stats.checkpoint_bytes.clone();
        let task = net::spawn_writer(dial, wrx, self.channels.events.clone(), written);
        if let Some((_, old)) = self.writers.insert(peer, (wtx, task)) {
            old.abort();
        }
    }

    fn close_link(&mut self, peer: PeerId) {
        if let Some((_, task)) = self.writers.remove(&peer) {
            task.abort();
        }
    }

    fn send(&mut self, peer: PeerId, frame: Outgoing) {
        if let Some((writer, _)) = self.writers.get(&peer) {
            if let Outgoing::Frame(f) = &frame {
                self.env.stats.count(f);
            }
            // A closed writer reports its failure as `SendFailed`.
            let _ = writer.send(frame);
        }
    }

    fn start(&mut self, pid: Pid, redundant: bool, checkpoint_every: u32) {
        let runtime = self.env.runtime.clone();
        let module = self.module();
        let info = self.info.clone();
        let slots = self.env.slots.clone();
        let job = self.job;
        self.tasks.spawn(async move {
            let slot = slots.acquire(job).await.map_err(HostError::from);
            let joined = tokio::task::spawn_blocking(move || {
                let slot = slot?;
                timeline(pid, 0, "instantiating");
                let process = runtime.instantiate(&module, info, pid)?;
                let p = Proc::new(process, redundant, checkpoint_every);
                Ok(run(pid, 0, p, slot))
            })
            .await;
            match joined {
                Ok(Ok(task)) => task,
                Ok(Err(e)) => Task::Resumed(pid, Err(e)),
                Err(e) => Task::Resumed(pid, Err(e.into())),
            }
        });
    }

    fn resume(
        &mut self,
        pid: Pid,
        superstep: u32,
        p: Proc<Process>,
        capture: Option<CaptureInput>,
        alone: bool,
    ) {
        let slots = self.env.slots.clone();
        let job = self.job;
        let early = self.channels.early.clone();
        // A short superstep with a free slot runs right here, on the
        // driver's thread: no hand-over to a blocking thread and back
        // (`runtime::ShortRuns`; its result is handed back as the next
        // finished task).
        // Several processes of one barrier run here one after the other
        // only while that stays short.
        let short = self.env.inline_max;
        if self.inline
            && self.ran_for < short
            && p.process.predicts_short()
            && crate::runtime::thread_may_run_guests()
            && let Some(slot) = slots.try_acquire(job)
        {
            let start = std::time::Instant::now();
            let task =
                resume_and_capture(pid, superstep, p, slot.never_park(), capture, early, short);
            self.ran_for += start.elapsed();
            self.ran_here(task);
            return;
        }
        // A job's only process, however long its supersteps, runs on this
        // thread too once `block_in_place` has handed the worker's other
        // tasks to another thread (`Machine::runs_alone`: nothing of the
        // job needs the driver meanwhile). The superstep starts without
        // waking a blocking thread, and its result is handled right here
        // when it ends, without waking the driver: two thread wake-ups
        // less per superstep. The thread stays off the worker pool until
        // the driver next waits, so the following supersteps run here
        // directly. Only where running a guest leaves the thread's OS
        // priority as it is (`thread_may_run_guests`): a worker that takes
        // its duties back must not be niced to the guests'.
        if alone
            && self.inline
            && crate::runtime::thread_may_run_guests()
            && let Some(slot) = slots.try_acquire(job)
        {
            let task = tokio::task::block_in_place(|| {
                resume_and_capture(pid, superstep, p, slot, capture, early, short)
            });
            self.ran_here(task);
            return;
        }
        // A free slot: straight to a blocking thread (one thread hop less
        // per superstep than queueing for it).
        if let Some(slot) = slots.try_acquire(job) {
            self.tasks.spawn_blocking(move || {
                resume_and_capture(pid, superstep, p, slot, capture, early, short)
            });
            return;
        }
        self.tasks.spawn(async move {
            let slot = match slots.acquire(job).await {
                Ok(slot) => slot,
                Err(e) => return Task::Resumed(pid, Err(e.into())),
            };
            tokio::task::spawn_blocking(move || {
                resume_and_capture(pid, superstep, p, slot, capture, early, short)
            })
            .await
            .unwrap_or_else(|e| Task::Resumed(pid, Err(e.into())))
        });
    }

    fn capture(&mut self, pid: Pid, mut p: Proc<Process>, c: CaptureRequest) {
        self.tasks.spawn_blocking(move || {
            let captured = capture(&mut p, c.outbox, c.exited, c.acks, &c.targets);
            Task::Captured(pid, captured.map(|(s, e)| (p, s, e)))
        });
    }

    fn restore(&mut self, pid: Pid, snapshot: Arc<Snapshot>, digests: Option<u32>) {
        let runtime = self.env.runtime.clone();
        let module = self.module();
        let info = self.info.clone();
        self.tasks.spawn(async move {
            let snap = snapshot.clone();
            let joined = tokio::task::spawn_blocking(move || {
                if snap.exited {
                    // It had returned: nothing runs any more.
                    return Ok(None);
                }
                let process = runtime.restore(&module, info, &snap)?;
                // Replicas that get this snapshot can take deltas against it.
                let tracker = PageTracker::seeded(&snap, digests);
                Ok::<_, HostError>(Some((process, tracker)))
            })
            .await;
            let r = match joined {
                Ok(Ok(p)) => Ok(p.map(|(process, tracker)| Proc {
                    process,
                    tracker,
                    recent: Default::default(),
                })),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(e.into()),
            };
            Task::Restored(pid, snapshot, r)
        });
    }

    fn kill(&mut self) {
        self.info.kill.store(true, Ordering::Relaxed);
    }

    fn cached_program(&self) -> Option<(Module, bytes::Bytes)> {
        self.env.runtime.cached_program(&self.program_hash)
    }

    fn start_download(&mut self) {
        if let Some(download) = self.download.take() {
            let tx = self.channels.program.clone();
            tokio::spawn(async move {
                let _ = tx.send(ProgramEvent::Downloaded(download.await));
            });
        }
    }

    fn compile(&mut self, bytes: bytes::Bytes) {
        let runtime = self.env.runtime.clone();
        let hash = self.program_hash.clone();
        let tx = self.channels.program.clone();
        tokio::spawn(async move {
            let compiled = tokio::task::spawn_blocking(move || runtime.compile(&hash, &bytes))
                .await
                .map_err(FetchError::from)
                .and_then(|r| r.map_err(FetchError::from));
            let _ = tx.send(ProgramEvent::Compiled(compiled));
        });
    }

    fn assemble(&mut self, bundle: Vec<u8>, split: usize) {
        let runtime = self.env.runtime.clone();
        let hash = self.program_hash.clone();
        let resources_hash = self.resources_hash.clone();
        let tx = self.channels.program.clone();
        tokio::spawn(async move {
            let unpacked = tokio::task::spawn_blocking(move || {
                let (program, resources) = bundle.split_at(split);
                let resources = unpack_resources(&resources_hash, resources, Source::OtherPeers)?;
                let module = runtime
                    .compile(&hash, program)
                    .map_err(FetchError::Assembled)?;
                Ok((module, resources))
            })
            .await
            .unwrap_or_else(|e| Err(e.into()));
            let _ = tx.send(ProgramEvent::Assembled(unpacked));
        });
    }

    fn program_ready(&mut self, program: Module, resources: Resources) {
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
        self.module = Some(program);
    }

    fn update_peers(&mut self, peers: &[PeerId]) {
        self.env
            .registry
            .update_peers(self.job, self.me, peers.iter().copied());
    }

    fn set_held(&mut self, bytes: u64) {
        let held = &self.env.stats.held;
        if bytes > self.held {
            held.fetch_add(bytes - self.held, Ordering::Relaxed);
        } else {
            held.fetch_sub(self.held - bytes, Ordering::Relaxed);
        }
        self.held = bytes;
        self.env.runtime.budget().set_held(self.job, bytes);
    }

    fn over_budget(&self) -> Option<String> {
        let budget = self.env.runtime.budget();
        (budget.exceeded() && budget.largest_holder() == Some(self.job)).then(|| budget.state())
    }

    fn count_checkpoint(&mut self) {
        // Its bytes are counted by the writers that make its frames.
        self.env.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
    }

    fn publish_observations(
        &mut self,
        taken: BTreeMap<PeerId, Acc>,
        hosted: &dyn Fn(PeerId) -> u32,
        since_ms: u64,
        waiting_for: Vec<Pid>,
    ) {
        let since = self.origin + Duration::from_millis(since_ms);
        self.env
            .stats
            .observed
            .publish(self.job, taken, hosted, since.into_std(), waiting_for);
    }
}

/// Run `p`'s superstep `s` on this thread, and take the messages it sent if
/// it synced or returned.
fn run(pid: Pid, s: u32, mut p: Proc<Process>, slot: crate::slots::Slot) -> Task<Process> {
    timeline(pid, s, "resumed");
    let outcome = p.process.resume_in(slot);
    timeline(pid, s, "synced");
    let out = match outcome {
        Outcome::Sync | Outcome::Done => synced(pid, s, &mut p),
        _ => Vec::new(),
    };
    Task::Resumed(pid, Ok((p, outcome, out)))
}

/// What `p` sent in superstep `s`, as it travels.
fn synced(pid: Pid, s: u32, p: &mut Proc<Process>) -> Vec<WireMessage> {
    // A fault in the process's computation (test builds): what it sent is
    // wrong everywhere, on the wire, in its outbox and in its checkpoint.
    #[cfg(feature = "fault-injection")]
    crate::fault::on_sync(s, &mut p.process);
    #[allow(unused_mut)]
    let mut out = wire_messages(pid, s, p.process.take_outbox());
    #[cfg(feature = "fault-injection")]
    crate::fault::on_messages(s, &mut out);
    out
}

/// Run `p`'s superstep `s`; with `capture` (a checkpointed superstep), a
/// sync or exit is captured right here, on the same thread, after the
/// messages were handed to the driver ([`Early`]): no trip through the
/// driver between the superstep and its checkpoint. Whether it all took at
/// most `short` goes to the process's [`crate::runtime::ShortRuns`].
fn resume_and_capture(
    pid: Pid,
    s: u32,
    p: Proc<Process>,
    slot: crate::slots::Slot,
    capture_input: Option<CaptureInput>,
    early: mpsc::UnboundedSender<Early>,
    short: Duration,
) -> Task<Process> {
    // A slot that never parks is the driver's thread's.
    let inline = slot.pinned();
    let start = std::time::Instant::now();
    let mut task = run_and_capture(pid, s, p, slot, capture_input, early);
    let was_short = start.elapsed() <= short;
    match &mut task {
        Task::Resumed(_, Ok((p, ..))) | Task::Captured(_, Ok((p, ..))) => {
            p.process.note_run(was_short, inline);
        }
        _ => {}
    }
    task
}

fn run_and_capture(
    pid: Pid,
    s: u32,
    mut p: Proc<Process>,
    slot: crate::slots::Slot,
    capture_input: Option<CaptureInput>,
    early: mpsc::UnboundedSender<Early>,
) -> Task<Process> {
    let Some(c) = capture_input else {
        return run(pid, s, p, slot);
    };
    timeline(pid, s, "resumed");
    let outcome = p.process.resume_in(slot);
    timeline(pid, s, "synced");
    let exited = match outcome {
        Outcome::Sync => false,
        Outcome::Done => true,
        _ => return Task::Resumed(pid, Ok((p, outcome, Vec::new()))),
    };
    let out = synced(pid, s, &mut p);
    let mut outbox = c.outbox;
    outbox.extend(out.iter().cloned());
    if early.send(Early { pid, exited, out }).is_err() {
        // The job's driver is gone: nobody reads the capture.
        return Task::Resumed(pid, Err(HostError::JobEnded));
    }
    let captured = capture(&mut p, outbox, exited, Vec::new(), &c.targets);
    timeline(pid, s, "captured");
    Task::Captured(pid, captured.map(|(s, e)| (p, s, e)))
}

/// What a job needs from the supernode: its program (compiled from the
/// cache, or downloaded, for the job to compile), and its resources.
pub(crate) fn fetch_inputs(
    client: Arc<crate::control::Client>,
    runtime: Arc<Runtime>,
    a: &bsp_api::control::JobAssignment,
) -> impl std::future::Future<Output = Result<Fetched, FetchError>> + Send + 'static {
    let (job, hash) = (a.job, a.program_hash.clone());
    let (apart, resources_bytes) = (!a.resources_hash.is_empty(), a.resources_bytes);
    async move {
        // Checked against their hash where the job driver decodes them.
        let resources = if apart {
            let bytes = client
                .job_resources(job, resources_bytes)
                .await
                .map_err(FetchError::ResourcesDownload)?;
            bytes::Bytes::from(bytes)
        } else {
            bytes::Bytes::new()
        };
        let (module, bytes) = fetch_module(client, runtime, hash).await?;
        Ok(Fetched {
            module,
            bytes,
            resources,
        })
    }
}

/// The program `hash` and its bytes: compiled from the cache, or
/// downloaded and checked against `hash` (the job offers it to its other
/// peers, then compiles it, [`JobIo::compile`]).
async fn fetch_module(
    client: Arc<crate::control::Client>,
    runtime: Arc<Runtime>,
    hash: String,
) -> Result<(Option<wasmtime::Module>, bytes::Bytes), FetchError> {
    if let Some((module, bytes)) = runtime.cached_program(&hash) {
        return Ok((Some(module), bytes));
    }
    let mut backoff = Duration::from_millis(200);
    let bytes = loop {
        match client.module(&hash).await {
            Ok(b) => break b,
            Err(e) if e.is_transient() && backoff < Duration::from_secs(10) => {
                tracing::warn!("cannot download program {hash}, retrying: {e}");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            Err(error) => return Err(FetchError::Download { hash, error }),
        }
    };
    tracing::info!(program = %hash, bytes = bytes.len(), "downloaded the program from the supernode");
    // Checked before the job passes the bytes on (the compile checks again).
    crate::runtime::check_hash(&hash, &bytes)?;
    Ok((None, bytes::Bytes::from(bytes)))
}
