//! The job driver: runs this peer's share of a job superstep by superstep
//! (DESIGN.md, Execution 2–4).
//!
//! Per superstep: resume every local unfinished process (on blocking threads,
//! at most `slots` at once); route what they send (local destinations
//! directly, remote ones in batched `Data` frames); once every local process
//! reached `sync` or returned, send every other peer its `Marker` (or
//! `Finished` once all local processes returned); wait for the barrier;
//! deliver the inboxes sorted by (source, send order); repeat.
//!
//! The driver knows nothing about HTTP: it takes the assignment and the
//! compiled module, talks to other peers through [`crate::net`], and emits
//! [`PeerEvent`]s into a [`Reporter`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bsp_api::control::{JobAssignment, PeerEvent};
use bsp_api::wire::{Frame, WireMessage};
use bsp_api::{JobId, PeerId, Pid};
use bytes::Bytes;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasmtime::Module;

use crate::barrier::Barrier;
use crate::net::{self, Dial, Inbound, Registry};
use crate::report::Reporter;
use crate::runtime::{JobInfo, Message, Outcome, Process, Runtime};

/// Target size of one `Data` frame's payloads.
const BATCH_BYTES: usize = 1 << 20;

/// Host-side cost counted per received message on top of its payload (the
/// same as the sender's outbox accounting).
const MESSAGE_OVERHEAD: usize = crate::runtime::MESSAGE_OVERHEAD;

/// Job ids remembered after they ended, so a repeated `StartJob` is ignored.
const REMEMBER_ENDED: usize = 4096;

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
    pub slots: Arc<Semaphore>,
    /// Cap of the per-process memory limit, MiB.
    pub max_memory_mib: u32,
    /// Cap of the per-superstep time limit, ms.
    pub max_superstep_ms: u64,
    /// How long to keep dialing a peer of a job that does not answer (yet).
    pub connect_timeout: Duration,
}

struct Running {
    cancel: CancellationToken,
}

#[derive(Default)]
struct Table {
    running: HashMap<JobId, Running>,
    ended: HashSet<JobId>,
    ended_order: std::collections::VecDeque<JobId>,
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

    /// Start this peer's share of a job (`me` is this peer's id). `module`
    /// resolves to the compiled program, or to a reason it is unavailable.
    /// Returns `None` if the job is already running or ran before.
    pub fn start<F>(
        self: &Arc<Self>,
        me: PeerId,
        assignment: JobAssignment,
        module: F,
    ) -> Option<JoinHandle<()>>
    where
        F: Future<Output = Result<Module, String>> + Send + 'static,
    {
        let job = assignment.job;
        let cancel = CancellationToken::new();
        {
            let mut t = self.lock();
            if t.running.contains_key(&job) || t.ended.contains(&job) {
                return None;
            }
            t.running.insert(
                job,
                Running {
                    cancel: cancel.clone(),
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
        let jobs = self.clone();
        Some(tokio::spawn(async move {
            let env = jobs.env.clone();
            tokio::select! {
                _ = cancel.cancelled() => {}
                module = module => match module {
                    Ok(module) => {
                        run_job(env.clone(), me, assignment, module, tx, rx, cancel).await;
                    }
                    Err(reason) => {
                        env.reporter.emit(PeerEvent::ProcessFailed {
                            job,
                            pid: None,
                            superstep: 0,
                            reason,
                        });
                        // Wait for the supernode to end the job.
                        cancel.cancelled().await;
                    }
                },
            }
            jobs.env.registry.unregister(job);
            let mut t = jobs.lock();
            t.running.remove(&job);
            if t.ended.insert(job) {
                t.ended_order.push_back(job);
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

    /// The jobs currently running.
    pub fn running(&self) -> Vec<JobId> {
        let mut v: Vec<JobId> = self.lock().running.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

enum Slot {
    /// Being resumed on a blocking thread (or waiting for a slot).
    Running,
    /// Reached `sync` in the current superstep.
    AtSync(Process),
    /// Returned from `main`.
    Done,
}

struct Remote {
    id: PeerId,
    addr: String,
    /// Index in the assignment's peer list.
    peer_index: u32,
    writer: Option<mpsc::UnboundedSender<Frame>>,
    task: Option<JoinHandle<()>>,
    batch: Vec<WireMessage>,
    batch_bytes: usize,
    /// Data frames sent in the current superstep.
    frames: u32,
    /// Its connection to us was welcomed.
    connected: bool,
    /// It finished, or its connection ended after we finished.
    gone: bool,
    /// Message bytes received from it, per superstep not yet passed.
    received: BTreeMap<u32, usize>,
    /// Most message bytes its processes may send us in one superstep.
    allowance: usize,
}

impl Remote {
    fn describe(&self) -> String {
        format!("peer #{} ({})", self.id, self.addr)
    }
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Phase {
    /// Running supersteps.
    Running,
    /// Every local process returned; waiting until every other peer finished.
    Finished,
    /// A process or the messaging failed; waiting for `KillJob`.
    Failed,
}

type Resumed = (Pid, Result<(Process, Outcome), String>);

struct Driver {
    env: JobEnv,
    info: Arc<JobInfo>,
    job: JobId,
    placement: Vec<u32>,
    me_index: u32,
    remotes: Vec<Remote>,
    remote_by_id: HashMap<PeerId, usize>,
    /// `remote_of_peer[i]` is the remote index of assignment peer `i`.
    remote_of_peer: Vec<Option<usize>>,
    procs: BTreeMap<Pid, Slot>,
    barrier: Barrier,
    /// Messages between local processes, for the next superstep: (src, seq, dst, payload).
    local_next: Vec<(Pid, u32, Pid, Bytes)>,
    superstep: u32,
    markers_sent: bool,
    phase: Phase,
    tasks: JoinSet<Resumed>,
    /// Keeps the event channel open, so `recv` never reports it closed.
    _events_tx: mpsc::Sender<Inbound>,
}

/// Check an assignment and return this peer's index in it.
fn check_assignment(me: PeerId, a: &JobAssignment) -> Result<u32, String> {
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
    let mut seen = HashSet::new();
    if let Some(dup) = a.peers.iter().find(|p| !seen.insert(p.id)) {
        return Err(format!("the job lists peer #{} twice", dup.id));
    }
    a.peers
        .iter()
        .position(|p| p.id == me)
        .map(|i| i as u32)
        .ok_or_else(|| format!("this peer (#{me}) is not one of the job's peers"))
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

async fn run_job(
    env: JobEnv,
    me: PeerId,
    a: JobAssignment,
    module: Module,
    events_tx: mpsc::Sender<Inbound>,
    events: mpsc::Receiver<Inbound>,
    cancel: CancellationToken,
) {
    let job = a.job;
    let kill = Arc::new(AtomicBool::new(false));
    let setup = check_assignment(me, &a)
        .and_then(|me_index| job_info(&env, &a, kill.clone()).map(|info| (me_index, info)));
    let (me_index, info) = match setup {
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
    let info = Arc::new(info);
    let deadline = Instant::now() + env.connect_timeout;
    let mut remotes = Vec::new();
    let mut remote_by_id = HashMap::new();
    let mut remote_of_peer = vec![None; a.peers.len()];
    for (i, p) in a.peers.iter().enumerate() {
        if i as u32 == me_index {
            continue;
        }
        let (wtx, wrx) = mpsc::unbounded_channel();
        let dial = Dial {
            addr: p.addr.clone(),
            job,
            from: me,
            to: p.id,
            token: a.job_token.clone(),
            deadline,
        };
        let task = net::spawn_writer(dial, wrx, events_tx.clone());
        remote_of_peer[i] = Some(remotes.len());
        remote_by_id.insert(p.id, remotes.len());
        remotes.push(Remote {
            id: p.id,
            addr: p.addr.clone(),
            peer_index: i as u32,
            writer: Some(wtx),
            task: Some(task),
            batch: Vec::new(),
            batch_bytes: 0,
            frames: 0,
            connected: false,
            gone: false,
            received: BTreeMap::new(),
            allowance: a
                .placement
                .iter()
                .filter(|&&pi| pi as usize == i)
                .count()
                .saturating_mul(info.outbox_limit),
        });
    }
    let barrier = Barrier::new(remotes.len());
    let mut d = Driver {
        env,
        info,
        job,
        placement: a.placement.clone(),
        me_index,
        remotes,
        remote_by_id,
        remote_of_peer,
        procs: BTreeMap::new(),
        barrier,
        local_next: Vec::new(),
        superstep: 0,
        markers_sent: false,
        phase: Phase::Running,
        tasks: JoinSet::new(),
        _events_tx: events_tx,
    };
    d.run(module, events, cancel).await;
    // Stop whatever still runs, close our connections.
    kill.store(true, Ordering::Relaxed);
    d.tasks.abort_all();
    for r in &mut d.remotes {
        r.writer = None;
        if d.phase != Phase::Finished
            && let Some(t) = r.task.take()
        {
            t.abort();
        }
    }
}

impl Driver {
    async fn run(
        &mut self,
        module: Module,
        mut events: mpsc::Receiver<Inbound>,
        cancel: CancellationToken,
    ) {
        self.start_processes(module).await;
        let connect_deadline = Instant::now() + self.env.connect_timeout + Duration::from_secs(10);
        loop {
            self.advance();
            if self.phase == Phase::Finished && self.remotes.iter().all(|r| r.gone) {
                return;
            }
            let waiting_for_connections = self.phase == Phase::Running
                && self.remotes.iter().any(|r| !r.connected && !r.gone);
            tokio::select! {
                _ = cancel.cancelled() => return,
                Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    match joined {
                        Ok((pid, resumed)) => self.on_resumed(pid, resumed),
                        Err(e) if e.is_cancelled() => {}
                        Err(e) => self.fail(None, format!("a process's host thread failed: {e}")),
                    }
                }
                Some(event) = events.recv() => self.on_inbound(event),
                _ = tokio::time::sleep_until(connect_deadline), if waiting_for_connections => {
                    let missing: Vec<String> = self
                        .remotes
                        .iter()
                        .filter(|r| !r.connected && !r.gone)
                        .map(Remote::describe)
                        .collect();
                    self.fail(None, format!(
                        "{} did not connect to this peer within {} s",
                        missing.join(", "),
                        (self.env.connect_timeout + Duration::from_secs(10)).as_secs()
                    ));
                }
            }
        }
    }

    async fn start_processes(&mut self, module: Module) {
        let local: Vec<Pid> = (0..self.placement.len() as u32)
            .filter(|&pid| self.placement[pid as usize] == self.me_index)
            .collect();
        let runtime = self.env.runtime.clone();
        let info = self.info.clone();
        let created = tokio::task::spawn_blocking(move || {
            local
                .into_iter()
                .map(|pid| (pid, runtime.instantiate(&module, info.clone(), pid)))
                .collect::<Vec<_>>()
        })
        .await;
        let created = match created {
            Ok(c) => c,
            Err(e) => {
                self.fail(None, format!("could not start the processes: {e}"));
                return;
            }
        };
        let mut ready = Vec::new();
        for (pid, p) in created {
            match p {
                Ok(p) => ready.push(p),
                Err(reason) => {
                    self.fail(Some(pid), reason);
                    return;
                }
            }
        }
        for p in ready {
            self.spawn_resume(p);
        }
    }

    fn spawn_resume(&mut self, mut p: Process) {
        let pid = p.pid();
        self.procs.insert(pid, Slot::Running);
        let slots = self.env.slots.clone();
        self.tasks.spawn(async move {
            let permit = match slots.acquire_owned().await {
                Ok(p) => p,
                Err(_) => return (pid, Err("the peer is shutting down".to_string())),
            };
            let joined = tokio::task::spawn_blocking(move || {
                let outcome = p.resume();
                drop(permit);
                (p, outcome)
            })
            .await;
            (pid, joined.map_err(|e| e.to_string()))
        });
    }

    fn emit(&self, e: PeerEvent) {
        self.env.reporter.emit(e);
    }

    /// End the job on this peer with an error and wait for `KillJob`.
    fn fail(&mut self, pid: Option<Pid>, reason: String) {
        if self.phase == Phase::Failed {
            return;
        }
        tracing::warn!(job = self.job, ?pid, "job failed on this peer: {reason}");
        self.emit(PeerEvent::ProcessFailed {
            job: self.job,
            pid,
            superstep: self.superstep,
            reason,
        });
        self.enter_failed();
    }

    fn enter_failed(&mut self) {
        self.phase = Phase::Failed;
        // Stop the other local processes; they are not reported.
        self.info.kill.store(true, Ordering::Relaxed);
        self.procs.clear();
        self.local_next.clear();
    }

    fn on_resumed(&mut self, pid: Pid, resumed: Result<(Process, Outcome), String>) {
        if self.phase == Phase::Failed {
            return;
        }
        let (mut p, outcome) = match resumed {
            Ok(x) => x,
            Err(e) => {
                return self.fail(Some(pid), format!("the process's host thread failed: {e}"));
            }
        };
        match outcome {
            Outcome::Yield => self.spawn_resume(p),
            Outcome::Sync => {
                let out = p.take_outbox();
                self.route(pid, out);
                self.procs.insert(pid, Slot::AtSync(p));
            }
            Outcome::Done => {
                let out = p.take_outbox();
                self.route(pid, out);
                self.procs.insert(pid, Slot::Done);
                self.emit(PeerEvent::ProcessExited {
                    job: self.job,
                    pid,
                    superstep: self.superstep,
                });
            }
            Outcome::Aborted(reason) => {
                self.emit(PeerEvent::ProcessAborted {
                    job: self.job,
                    pid,
                    superstep: self.superstep,
                    reason,
                });
                self.enter_failed();
            }
            Outcome::Failed(reason) => self.fail(Some(pid), reason),
        }
    }

    fn route(&mut self, src: Pid, out: Vec<crate::runtime::Outgoing>) {
        for m in out {
            let peer = self.placement[m.dst as usize];
            if peer == self.me_index {
                self.local_next.push((src, m.seq, m.dst, m.payload));
                continue;
            }
            let Some(r) = self.remote_of_peer[peer as usize] else {
                continue;
            };
            if self.remotes[r].gone || self.barrier.finished_at(r).is_some() {
                // Every process of that peer returned: messages to it are dropped.
                continue;
            }
            let remote = &mut self.remotes[r];
            if !remote.batch.is_empty() && remote.batch_bytes + m.payload.len() > BATCH_BYTES {
                Self::send_batch(self.superstep, remote);
            }
            remote.batch_bytes += m.payload.len() + 16;
            remote.batch.push(WireMessage {
                src,
                dst: m.dst,
                seq: m.seq,
                payload: m.payload.to_vec(),
            });
        }
    }

    fn send_batch(superstep: u32, remote: &mut Remote) {
        if remote.batch.is_empty() {
            return;
        }
        let messages = std::mem::take(&mut remote.batch);
        remote.batch_bytes = 0;
        remote.frames += 1;
        if let Some(w) = &remote.writer {
            // A closed writer reports its failure as `SendFailed`.
            let _ = w.send(Frame::Data {
                superstep,
                messages,
            });
        }
    }

    /// Send markers when the local processes are through the superstep, and
    /// pass the barrier when it is complete.
    fn advance(&mut self) {
        if self.phase != Phase::Running {
            return;
        }
        if !self.markers_sent {
            if self.procs.values().any(|s| matches!(s, Slot::Running)) || !self.tasks.is_empty() {
                return;
            }
            let all_done = self.procs.values().all(|s| matches!(s, Slot::Done));
            let s = self.superstep;
            for r in 0..self.remotes.len() {
                if self.barrier.finished_at(r).is_some() || self.remotes[r].gone {
                    continue;
                }
                let remote = &mut self.remotes[r];
                Self::send_batch(s, remote);
                let frames = std::mem::take(&mut remote.frames);
                let marker = if all_done {
                    Frame::Finished {
                        superstep: s,
                        frames,
                    }
                } else {
                    Frame::Marker {
                        superstep: s,
                        frames,
                    }
                };
                if let Some(w) = &remote.writer {
                    let _ = w.send(marker);
                }
            }
            self.markers_sent = true;
            if all_done {
                self.phase = Phase::Finished;
                for r in 0..self.remotes.len() {
                    if self.barrier.finished_at(r).is_some() {
                        self.remotes[r].gone = true;
                    }
                }
                return;
            }
        }
        let Some(received) = self.barrier.take() else {
            return;
        };
        let s = self.superstep;
        for r in &mut self.remotes {
            r.received.remove(&s);
        }
        let mut inboxes: BTreeMap<Pid, Vec<(Pid, u32, Bytes)>> = BTreeMap::new();
        for m in received {
            inboxes
                .entry(m.dst)
                .or_default()
                .push((m.src, m.seq, Bytes::from(m.payload)));
        }
        for (src, seq, dst, payload) in self.local_next.drain(..) {
            inboxes.entry(dst).or_default().push((src, seq, payload));
        }
        self.superstep = s + 1;
        self.markers_sent = false;
        let waiting: Vec<Pid> = self
            .procs
            .iter()
            .filter(|(_, slot)| matches!(slot, Slot::AtSync(_)))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in waiting {
            let Some(Slot::AtSync(mut p)) = self.procs.remove(&pid) else {
                continue;
            };
            let mut inbox = inboxes.remove(&pid).unwrap_or_default();
            inbox.sort_by_key(|(src, seq, _)| (*src, *seq));
            let inbox = inbox
                .into_iter()
                .map(|(src, _, payload)| Message {
                    src,
                    superstep: s,
                    payload,
                })
                .collect();
            p.begin_superstep(s + 1, inbox);
            self.spawn_resume(p);
        }
        // Whatever is left was sent to processes that returned: dropped.
    }

    fn on_inbound(&mut self, event: Inbound) {
        let (peer, frame, error) = match event {
            Inbound::Connected { from } => {
                if let Some(&r) = self.remote_by_id.get(&from) {
                    self.remotes[r].connected = true;
                }
                return;
            }
            Inbound::Frame { from, frame } => (from, Some(frame), None),
            Inbound::Closed { from, error } => (
                from,
                None,
                Some(error.unwrap_or_else(|| "the connection was closed".into())),
            ),
            Inbound::SendFailed { to, error } => (to, None, Some(error)),
        };
        let Some(&r) = self.remote_by_id.get(&peer) else {
            return;
        };
        if let Some(error) = error {
            let finished = self.barrier.finished_at(r).is_some();
            if self.phase == Phase::Running && !finished && !self.remotes[r].gone {
                let who = self.remotes[r].describe();
                self.fail(None, format!("lost connection to {who}: {error}"));
            } else {
                self.remotes[r].gone = true;
            }
            return;
        }
        let Some(frame) = frame else { return };
        match self.phase {
            Phase::Failed => {}
            Phase::Finished => {
                if matches!(frame, Frame::Finished { .. }) {
                    self.remotes[r].gone = true;
                }
            }
            Phase::Running => {
                if let Frame::Data { messages, .. } = &frame
                    && let Some(bad) = messages.iter().find(|m| !self.plausible(r, m))
                {
                    let who = self.remotes[r].describe();
                    let reason = format!(
                        "{who} sent a message from pid {} to pid {}, which does not match the job's placement",
                        bad.src, bad.dst
                    );
                    return self.fail(None, reason);
                }
                if let Frame::Data {
                    superstep,
                    messages,
                } = &frame
                {
                    let bytes: usize = messages
                        .iter()
                        .map(|m| m.payload.len() + MESSAGE_OVERHEAD)
                        .sum();
                    let remote = &mut self.remotes[r];
                    let total = remote.received.entry(*superstep).or_default();
                    *total = total.saturating_add(bytes);
                    if *total > remote.allowance {
                        let reason = format!(
                            "{} sent more message data in superstep {superstep} than its processes may send",
                            remote.describe()
                        );
                        return self.fail(None, reason);
                    }
                }
                if let Err(e) = self.barrier.on_frame(r, frame) {
                    let who = self.remotes[r].describe();
                    self.fail(None, format!("{who} broke the data-plane protocol: {e}"));
                }
            }
        }
    }

    /// A message from remote `r` must come from one of its pids, go to one of
    /// ours, and respect the size limit.
    fn plausible(&self, r: usize, m: &WireMessage) -> bool {
        let on = |pid: Pid| self.placement.get(pid as usize).copied();
        on(m.src) == Some(self.remotes[r].peer_index)
            && on(m.dst) == Some(self.me_index)
            && m.payload.len() <= bspweb_abi::MAX_MESSAGE_BYTES
    }
}

#[cfg(test)]
mod tests;
