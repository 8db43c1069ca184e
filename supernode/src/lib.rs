//! The bspweb supernode: users, programs, jobs, peer leases, placement, the
//! REST API with its Server-Sent Events, and the peer control plane.
//!
//! # Structure
//!
//! - State lives in SQLite (`migrations/`), behind one mutex together with
//!   the in-memory placement tables ([`placement::Dhht`] and two
//!   [`placement::IndexAllocator`]s, rebuilt from SQLite at start). Every SQL
//!   statement runs on a blocking thread ([`tokio::task::spawn_blocking`]),
//!   never on the async runtime.
//! - Each operation that changes state runs in one SQLite transaction and
//!   returns *effects* (commands for peers, jobs whose event streams grew,
//!   whether the scheduler should run), applied after the commit while the
//!   lock is still held, so peers see commands in the order the state changed.
//! - Peer command queues and lease records are kept in memory (`Live`), so
//!   the long poll and lease checks need no SQL; the queues are mirrored in
//!   SQLite (written in the transaction that queues a command, pruned of
//!   acknowledged commands by the lease sweeper) and survive a restart.
//! - Fault tolerance ([`epoch`](crate::epoch)): a lost peer's processes are
//!   re-placed and restored in a new epoch of the job's assignment; power
//!   changes beyond the hysteresis and drains migrate processes.
//! - Background tasks started by [`Supernode::serve`]: the scheduler (woken
//!   on submit, peer login, availability change and job end) and the lease
//!   sweeper (every TTL/4, see [`lease`]).
//!
//! **Architecture Invariant:** the lease rules ([`lease`]) and the placement
//! rules (`placement` crate) are pure; this crate feeds them the clock and
//! the tables.

mod auth;
mod clusters;
mod control;
mod db;
mod enrollments;
mod epoch;
mod error;
mod http;
mod hysteresis;
mod jobs;
pub mod lease;
mod listen;
mod metrics;
mod node;
mod openapi;
mod renew_batch;
mod rest;
mod shared;
mod sql;
mod sse;
mod state;
mod suspect;
mod tls;
mod twins;
mod verify;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bsp_api::control::SeqCommand;
use bsp_api::rest::{ProgramInfo, QuotaChange, Role, UserInfo};
use bsp_api::{JobId, PeerId};
use tokio::sync::{Notify, broadcast, watch};

/// Job state changes buffered per `GET /api/v1/events` reader before it
/// lags (and then gets every job of its owner again).
const JOB_LIST_CAPACITY: usize = 1024;

pub use error::Error;
pub use http::openapi;
pub use listen::HttpLimits;
pub use tls::{CertificateSource, ServerTls, TlsError, write_private};

/// How a supernode is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Directory holding `bspweb.sqlite3` and `jwt-secret` (created if missing).
    pub data_dir: PathBuf,
    /// A `postgres://USER:PASSWORD@HOST:PORT/DATABASE` URL: keep the state
    /// in that PostgreSQL database, which several supernodes may share,
    /// instead of `bspweb.sqlite3` in `data_dir`.
    pub database: Option<String>,
    /// How long a peer's lease lasts without renewal; peers renew every TTL/3.
    pub lease_ttl: Duration,
    /// Processes per online core before new jobs wait in the ready queue
    /// (dissertation §4.4).
    pub overload_factor: f64,
    /// The URL people and peers reach this supernode at, for logs.
    pub public_url: Option<String>,
    /// Relative change of a peer's power (speed × idle) below which a
    /// renewal leaves the DHHT as it is (0.25: a change of more than 25 %
    /// re-weights the peer and migrates processes whose host changed).
    pub power_hysteresis: f64,
    /// The shortest time between two migration epochs of one job, so noisy
    /// availability cannot thrash it. Losses and drains are not limited.
    pub migration_interval: Duration,
    /// Timeouts and connection limits of the HTTP listener.
    pub http: HttpLimits,
    /// Output the jobs of one user may store, in MiB, unless the account
    /// has its own quota (0: no limit); a job whose output would exceed it
    /// fails, saying so.
    pub user_storage_mib: u64,
    /// Processes of one user's active jobs at once, unless the account has
    /// its own quota (0: no limit); a job that would exceed it waits.
    pub user_max_processes: u32,
    /// Programs one user may store, unless the account has its own quota
    /// (0: no limit).
    pub user_max_programs: u32,
    /// Serve `GET /metrics` (Prometheus text format).
    pub metrics: bool,
    /// Time between two DiDiC time steps on the measured links (issue 15).
    pub cluster_step: Duration,
    /// Serve HTTPS with this certificate; `None`: plain HTTP, which
    /// [`Supernode::serve`] allows on a loopback address only.
    pub tls: Option<ServerTls>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("bspweb-data"),
            database: None,
            lease_ttl: Duration::from_secs(15),
            overload_factor: 4.0,
            public_url: None,
            power_hysteresis: 0.25,
            migration_interval: Duration::from_secs(5),
            http: HttpLimits::default(),
            user_storage_mib: 4096,
            user_max_processes: 0,
            user_max_programs: 1000,
            metrics: true,
            cluster_step: Duration::from_secs(2),
            tls: None,
        }
    }
}

/// A running supernode's shared state. Cheap to clone.
#[derive(Clone)]
pub struct Supernode {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Supernode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supernode")
            .field("data_dir", &self.inner.config.data_dir)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) config: Config,
    core: Mutex<state::Core>,
    live: Mutex<Live>,
    pub(crate) keys: auth::Keys,
    /// Wakes the scheduler task.
    sched_wake: Notify,
    /// Per-job watchers of the event stream, created on demand by SSE readers.
    job_watch: Mutex<HashMap<JobId, watch::Sender<()>>>,
    /// Job state changes, `(owner, job)`, for `GET /api/v1/events`.
    job_list: broadcast::Sender<(i64, JobId)>,
    /// Becomes `true` when the server shuts down.
    shutdown: watch::Sender<bool>,
    /// This supernode among those sharing its database (0 with SQLite).
    instance: u64,
    /// Since when (ms) and why SQLite takes no writes, while it does not.
    storage_trouble: Mutex<Option<(i64, String)>>,
    /// The `/metrics` counters.
    pub(crate) metrics: metrics::Metrics,
    /// Every account's role and standing, for the token checks.
    accounts: Mutex<HashMap<i64, state::Account>>,
    /// Each peer's cluster as DiDiC found it on the measured links
    /// ([`clusters`]), for the peers whose cluster is ready.
    found_clusters: Mutex<Arc<BTreeMap<PeerId, String>>>,
    /// Plain renewals waiting to go to a shared database together.
    renewals: renew_batch::Batches,
}

/// In-memory state of the online peers: leases and command queues.
#[derive(Default)]
pub(crate) struct Live {
    pub(crate) peers: HashMap<PeerId, LivePeer>,
    /// The newest measurement of each link `(from, to)` peers reported
    /// (issue 15; kept in memory: peers measure again after a restart).
    pub(crate) links: HashMap<(PeerId, PeerId), bsp_api::rest::PeerLink>,
    /// When each link `(from, to)` was last handed out to measure.
    pub(crate) probes_asked: HashMap<(PeerId, PeerId), i64>,
    /// What peers delivered, against what they claim (issue 18).
    pub(crate) verify: verify::Verifier,
    /// Each peer's probe candidates (`state/links.rs`).
    pub(crate) candidates: HashMap<PeerId, Candidates>,
    /// `(second, online peers looked at in it)` choosing candidates.
    pub(crate) candidate_work: (i64, u64),
}

/// A peer's probe candidates, as chosen at `chosen_at` (Unix ms) among the
/// online peers when this supernode knew `known` peers.
pub(crate) struct Candidates {
    pub(crate) peers: Vec<PeerId>,
    pub(crate) chosen_at: i64,
    pub(crate) known: usize,
}

impl Live {
    /// Forget peers that are gone: their leases and command queues (their
    /// waiting polls are woken), and the links measured to or from them,
    /// which mean nothing any more (a peer may come back elsewhere in the
    /// network).
    pub(crate) fn forget(&mut self, gone: &[PeerId]) {
        if gone.is_empty() {
            return;
        }
        for id in gone {
            if let Some(p) = self.peers.remove(id) {
                p.notify.notify_waiters();
            }
        }
        self.links
            .retain(|(from, to), _| !gone.contains(from) && !gone.contains(to));
        self.probes_asked
            .retain(|(from, to), _| !gone.contains(from) && !gone.contains(to));
        for id in gone {
            self.candidates.remove(id);
        }
        self.verify.forget(gone);
    }
}

pub(crate) struct LivePeer {
    pub(crate) lease_id: String,
    pub(crate) expires_at: i64,
    /// Sequence number of the last command queued (persisted in `peers.cmd_seq`).
    pub(crate) last_seq: u64,
    /// Commands not yet acknowledged by a poll with a larger `after`
    /// (mirrored in the `commands` table).
    pub(crate) queue: VecDeque<SeqCommand>,
    /// The largest `after` a poll of this peer acknowledged.
    pub(crate) acked: u64,
    /// The largest `after` whose commands were deleted from SQLite.
    pub(crate) pruned: u64,
    pub(crate) notify: Arc<Notify>,
    /// When the supernode last checked it by dialing its data port
    /// (`suspect`: a peer reported it unreachable, or at start).
    pub(crate) probed_at: Option<i64>,
    /// The peer's running totals at its last renewal; `None` until the
    /// first renewal after a login or a supernode start, which only sets
    /// this baseline (the totals count since the peer started).
    pub(crate) counters: Option<bsp_api::control::PeerCounters>,
    /// Its data-plane address, for the peers that measure links to it.
    pub(crate) addr: String,
}

/// What a state change asks for once it is committed.
#[derive(Default)]
pub(crate) struct Effects {
    pub(crate) commands: Vec<(PeerId, SeqCommand)>,
    pub(crate) jobs: BTreeSet<JobId>,
    /// `(owner, job)`: the job was submitted, started, finished or disposed.
    pub(crate) job_list: Vec<(i64, JobId)>,
    pub(crate) wake_scheduler: bool,
    /// What to add to the `/metrics` counters.
    pub(crate) counts: metrics::Counts,
    /// Peers declared gone in the committed transaction: their leases end.
    pub(crate) forget_peers: Vec<PeerId>,
}

/// Unix time in milliseconds.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Effects {
    /// Add `other`'s effects to these.
    pub(crate) fn merge(&mut self, other: Effects) {
        self.commands.extend(other.commands);
        self.jobs.extend(other.jobs);
        self.job_list.extend(other.job_list);
        self.wake_scheduler |= other.wake_scheduler;
        self.counts.merge(&other.counts);
        self.forget_peers.extend(other.forget_peers);
    }
}

impl Inner {
    pub(crate) fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The clusters DiDiC found, for the peers whose cluster is ready: one
    /// consistent snapshot (a step replaces it whole).
    pub(crate) fn found_clusters(&self) -> Arc<BTreeMap<PeerId, String>> {
        self.found_clusters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_found_clusters(&self, found: BTreeMap<PeerId, String>) {
        let mut f = self
            .found_clusters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if **f != found {
            tracing::debug!(
                peers = found.len(),
                "the clusters found on the measured links changed"
            );
            *f = Arc::new(found);
        }
    }

    /// Note that a write failed because the disk takes none (logged once,
    /// shown by `/health`).
    pub(crate) fn storage_failed(&self, e: &sql::Error) {
        let mut t = self
            .storage_trouble
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if t.is_none() {
            tracing::error!(
                error = %e,
                "the database's disk takes no writes (full, or failing): storing nothing new until it does; leases are kept in memory, jobs go on, peers keep their output until it can be stored"
            );
            *t = Some((now_ms(), e.to_string()));
        }
    }

    /// Note that a write succeeded: the disk takes writes (again).
    pub(crate) fn storage_ok(&self) {
        let mut t = self
            .storage_trouble
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some((since, _)) = t.take() {
            tracing::info!(
                after_ms = now_ms().saturating_sub(since),
                "the database's disk takes writes again"
            );
        }
    }

    /// Since when and why the disk takes no writes, if it does not.
    pub(crate) fn storage_trouble(&self) -> Option<(i64, String)> {
        self.storage_trouble
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The accounts the token checks consult (kept in step with SQLite by
    /// every change of an account, after its commit).
    pub(crate) fn accounts(&self) -> MutexGuard<'_, HashMap<i64, state::Account>> {
        self.accounts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_core(&self) -> MutexGuard<'_, state::Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies committed effects: queues commands, wakes pollers, SSE readers
    /// and the scheduler.
    pub(crate) fn apply(&self, fx: Effects) {
        self.metrics.add(&fx.counts);
        if !fx.forget_peers.is_empty() {
            self.live().forget(&fx.forget_peers);
        }
        if !fx.commands.is_empty() {
            let mut live = self.live();
            for (peer, cmd) in fx.commands {
                if let Some(p) = live.peers.get_mut(&peer) {
                    p.queue.push_back(cmd);
                    p.notify.notify_waiters();
                }
            }
        }
        if !fx.jobs.is_empty() {
            let mut watch = self.job_watch.lock().unwrap_or_else(|e| e.into_inner());
            for job in fx.jobs {
                if let Some(tx) = watch.get(&job) {
                    if tx.receiver_count() == 0 {
                        watch.remove(&job);
                    } else {
                        tx.send_replace(());
                    }
                }
            }
        }
        for change in fx.job_list {
            // No receiver is not an error: nobody follows the lists now.
            let _ = self.job_list.send(change);
        }
        if fx.wake_scheduler {
            self.sched_wake.notify_one();
        }
    }

    /// Every `(owner, job)` whose state changes from now on.
    pub(crate) fn watch_job_list(&self) -> broadcast::Receiver<(i64, JobId)> {
        self.job_list.subscribe()
    }

    /// A receiver that sees every change of `job`'s event stream from now on.
    pub(crate) fn watch_job(&self, job: JobId) -> watch::Receiver<()> {
        let mut watch = self.job_watch.lock().unwrap_or_else(|e| e.into_inner());
        watch
            .entry(job)
            .or_insert_with(|| watch::channel(()).0)
            .subscribe()
    }

    pub(crate) fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }
}

/// An Argon2id hash of a random password, verified against when a user name
/// does not exist so that a login takes as long either way.
static DUMMY_HASH: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let password: [u8; 16] = rand::random();
    auth::hash_password(&hex::encode(password)).unwrap_or_default()
});

/// Hashes a password on a blocking thread (Argon2id is slow by design).
async fn hash_password(password: &str) -> Result<String, Error> {
    let password = password.to_string();
    tokio::task::spawn_blocking(move || auth::hash_password(&password)).await?
}
