//! This peer's jobs: the job table ([`Jobs`]) and each job's driver, a thin
//! tokio loop around the job's [`Machine`] (`job/machine.rs`, issue 17):
//! it owns the sockets, the blocking threads and wasmtime (`job/io.rs`,
//! [`io::TokioIo`]) and feeds the machine what happens — frames, processes'
//! results, assignments, delivered output, timers — with the time.
//!
//! The driver knows nothing about HTTP: it takes the assignment and the
//! compiled module, talks to other peers through [`crate::net`], and emits
//! [`PeerEvent`]s into a [`Reporter`].
//!
//! `job/assignment` checks an assignment, `job/hosts` says who runs each
//! copy of a pid; the machine's handlers live by sub-protocol in
//! `job/machine/`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bsp_api::control::{JobAssignment, PeerEvent};
use bsp_api::{JobId, PeerId};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasmtime::Module;

use crate::net::{Inbound, Registry};
use crate::relay::{BroadcastPolicy, DataStats};
use crate::report::Reporter;
use crate::runtime::Runtime;

/// Job ids remembered after they ended, so a repeated `StartJob` is ignored.
const REMEMBER_ENDED: usize = 4096;

/// How long after a job ends the peer gives free memory back once more
/// (`sysinfo::release_free_memory`), if no job runs by then.
const LATE_RELEASE: std::time::Duration = std::time::Duration::from_secs(2);

/// A job's program (compiled, and its bytes to pass on to other peers) and
/// its resources (`bsp_api::control::encode_resources` form; empty when the
/// assignment carries them or there are none).
pub type Fetched = machine::Downloaded<Module>;

/// How the program is downloaded from the supernode when it must be.
type Download = std::pin::Pin<Box<dyn Future<Output = Result<Fetched, FetchError>> + Send>>;

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
    /// Supersteps (with their capture) of at most this much host time count
    /// as short, and may then run on the driver's thread
    /// ([`crate::runtime::ShortRuns`]); normally [`crate::runtime::INLINE_MAX`],
    /// zero for never.
    pub inline_max: Duration,
}

struct Running {
    /// The identity (peer id) this peer runs the job under.
    me: PeerId,
    cancel: CancellationToken,
    /// Stops the job's processes at their next check. Set with `cancel`:
    /// a superstep that runs on the driver's own thread (a job's only
    /// process, or a short superstep that turned out long) holds the
    /// driver, which would only see `cancel` once it ends.
    kill: Arc<AtomicBool>,
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
        let kill = Arc::new(AtomicBool::new(false));
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
            // Snapshots are backed by huge pages while jobs run
            // (`sysinfo::allow_huge_pages`).
            crate::sysinfo::allow_huge_pages(true);
            t.running.insert(
                job,
                Running {
                    me,
                    cancel: cancel.clone(),
                    kill: kill.clone(),
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
                kill,
            )
            .await;
            jobs.env.registry.unregister(job, &inbound);
            {
                // The last job ended: no huge pages while the peer idles
                // (under the lock, so a job starting now turns them on after).
                let t = jobs.lock();
                if t.running
                    .iter()
                    .all(|(&j, r)| j == job && r.updates.same_channel(&mine))
                {
                    crate::sysinfo::allow_huge_pages(false);
                }
            }
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
            drop(t);
            // What the job's other tasks (its connections' writers with the
            // checkpoint frames they still held) let go of after it ended
            // goes back too, if the peer is still idle by then.
            tokio::spawn(async move {
                tokio::time::sleep(LATE_RELEASE).await;
                if jobs.lock().running.is_empty() {
                    let _ = tokio::task::spawn_blocking(crate::sysinfo::release_free_memory).await;
                }
            });
        }))
    }

    /// Stop a job at once. Returns whether it was running.
    pub fn kill(&self, job: JobId) -> bool {
        match self.lock().running.get(&job) {
            Some(r) => {
                r.kill.store(true, Ordering::Relaxed);
                r.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Stop every job.
    pub fn kill_all(&self) {
        for r in self.lock().running.values() {
            r.kill.store(true, Ordering::Relaxed);
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

#[allow(clippy::too_many_arguments)]
async fn run_job(
    env: JobEnv,
    me: PeerId,
    a: JobAssignment,
    download: Download,
    events_tx: mpsc::Sender<Inbound>,
    mut events: mpsc::Receiver<Inbound>,
    mut updates: mpsc::UnboundedReceiver<JobAssignment>,
    cancel: CancellationToken,
    kill: Arc<AtomicBool>,
) {
    let job = a.job;
    tracing::trace!(target: "bspweb::timeline", job, me, "job assigned");
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
    let setup = Setup {
        me,
        limits: Limits {
            nprocs: info.nprocs,
            memory_limit: info.memory_limit,
            outbox_limit: info.outbox_limit,
        },
        broadcast: env.broadcast,
    };
    let (program_tx, mut program) = mpsc::unbounded_channel();
    let (early_tx, mut early) = mpsc::unbounded_channel();
    let mut delivered = env.reporter.watch_delivered();
    let origin = Instant::now();
    let io = TokioIo::new(
        env,
        &a,
        me,
        Arc::new(info),
        download,
        io::Channels {
            events: events_tx,
            program: program_tx,
            early: early_tx,
        },
        origin,
    );
    let mut m = Machine::new(io, setup, &a, hosts);
    let ms = |t: Instant| u64::try_from(t.duration_since(origin).as_millis()).unwrap_or(u64::MAX);
    loop {
        let timeout = origin + Duration::from_millis(m.poll_timeout());
        let input = tokio::select! {
            _ = cancel.cancelled() => break,
            Some(p) = program.recv() => Input::Program(p),
            _ = tokio::time::sleep_until(timeout) => Input::Timer,
            Ok(()) = delivered.changed() => Input::OutputDelivered,
            Some(joined) = m.io_mut().join_next() => match joined {
                Ok(task) => {
                    // A capture's `Early` report was sent before it
                    // finished: the machine takes it first, whichever of the
                    // two this loop saw first.
                    while let Ok(e) = early.try_recv() {
                        m.handle(Input::Early(e), ms(Instant::now()));
                    }
                    Input::Task(task)
                }
                Err(e) if e.is_cancelled() => continue,
                Err(e) => Input::ThreadFailed(e.into()),
            },
            Some(e) = early.recv() => Input::Early(e),
            Some(event) = events.recv() => Input::Inbound(event),
            Some(a) = updates.recv() => Input::Assignment(Box::new(a)),
        };
        if m.handle(input, ms(Instant::now())) == Flow::Leave {
            break;
        }
    }
    // Stop whatever still runs, close our connections.
    m.io_mut().shut_down();
}

mod assignment;
mod errors;
mod hosts;
mod io;
mod machine;

use assignment::*;
pub use errors::{FetchError, HostError, Source};
use io::TokioIo;
pub(crate) use io::fetch_inputs;
pub use machine::ProtocolError;
use machine::{Flow, Input, Limits, Machine, Setup};
#[cfg(test)]
use machine::{checkpointed, newest_checkpointed_before, plan_frames};

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
