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

impl Supernode {
    /// Opens the supernode's state in `config.data_dir`: the SQLite database
    /// (write-ahead log, foreign keys on, migrations applied) and the JWT
    /// secret (generated with mode 0600 on first start). Peers and running
    /// jobs recorded there carry on.
    pub fn open(config: Config) -> anyhow::Result<Supernode> {
        use anyhow::Context;
        if !(config.overload_factor.is_finite() && config.overload_factor > 0.0) {
            anyhow::bail!(
                "the overload factor must be a positive number, not {}",
                config.overload_factor
            );
        }
        if !(config.power_hysteresis.is_finite() && config.power_hysteresis >= 0.0) {
            anyhow::bail!(
                "the power hysteresis must be a fraction of at least 0, not {}",
                config.power_hysteresis
            );
        }
        if config.lease_ttl < Duration::from_millis(30) {
            anyhow::bail!(
                "the lease TTL must be at least 30 ms, not {:?}",
                config.lease_ttl
            );
        }
        std::fs::create_dir_all(&config.data_dir).with_context(|| {
            format!(
                "cannot create the data directory {}",
                config.data_dir.display()
            )
        })?;
        let database = match &config.database {
            None => db::Database::Sqlite(config.data_dir.join("bspweb.sqlite3")),
            Some(url) => db::Database::Postgres(Box::new(
                sql::PgConfig::parse(url).map_err(anyhow::Error::msg)?,
            )),
        };
        tracing::info!(%database, "state stored in {database}");
        let lease_ttl = config.lease_ttl;
        let secret_file = config.data_dir.join("jwt-secret");
        let load = move || -> anyhow::Result<_> {
            let mut conn = db::open(&database)?;
            // Several supernodes on one database share their JWT secret.
            let secret = match database {
                db::Database::Sqlite(_) => auth::load_or_create_secret(&secret_file)?,
                db::Database::Postgres(_) => shared::secret(&mut conn)?,
            };
            let (core, live) = state::Core::load(conn, lease_ttl)?;
            let accounts = core.accounts()?;
            Ok((core, live, accounts, secret))
        };
        // The PostgreSQL client blocks on a runtime of its own, which
        // cannot start on a thread that drives a runtime already, so the
        // state loads on a thread of its own; later queries run on
        // blocking threads (`with_core`).
        let (core, live, accounts, secret) = std::thread::scope(|s| {
            s.spawn(load)
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })?;
        let instance = core.shared.as_ref().map_or(0, |s| s.instance);
        Ok(Supernode {
            inner: Arc::new(Inner {
                config,
                core: Mutex::new(core),
                live: Mutex::new(live),
                keys: auth::Keys::from_secret(&secret),
                sched_wake: Notify::new(),
                job_watch: Mutex::new(HashMap::new()),
                job_list: broadcast::channel(JOB_LIST_CAPACITY).0,
                shutdown: watch::channel(false).0,
                storage_trouble: Mutex::new(None),
                instance,
                metrics: metrics::Metrics::default(),
                accounts: Mutex::new(accounts),
                found_clusters: Mutex::new(Arc::new(BTreeMap::new())),
                renewals: Default::default(),
            }),
        })
    }

    /// Runs `f` on the core state on a blocking thread, then applies the
    /// effects it produced (still under the lock, so command order follows
    /// state order).
    pub(crate) async fn with_core<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut state::Core, &Inner, &mut Effects) -> Result<T, Error> + Send + 'static,
    {
        self.on_core(true, f).await
    }

    /// [`Supernode::with_core`] without the shared database's exclusive
    /// lock and resync: for what holds its own (shared) lock, the plain
    /// renewal (`state/plain_renewal.rs`).
    pub(crate) async fn with_core_plain<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut state::Core, &Inner, &mut Effects) -> Result<T, Error> + Send + 'static,
    {
        self.on_core(false, f).await
    }

    /// [`Supernode::with_core`] (`exclusive`) or
    /// [`Supernode::with_core_plain`].
    async fn on_core<T, F>(&self, exclusive: bool, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut state::Core, &Inner, &mut Effects) -> Result<T, Error> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut core = inner.lock_core();
            // With several supernodes on one database: their lock, and what
            // the others changed (`shared`).
            if exclusive && let Err(e) = shared::enter(&mut core, &inner) {
                if let Error::Database(d) = &e
                    && error::is_storage_error(d)
                {
                    inner.storage_failed(d);
                }
                return Err(e);
            }
            let mut fx = Effects::default();
            // A panic must not leave the shared lock held: every other
            // supernode would wait for it.
            let out = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                f(&mut core, &inner, &mut fx)
            })) {
                Ok(out) => out,
                Err(panic) => {
                    if exclusive {
                        shared::leave(&mut core, &inner, None);
                    }
                    std::panic::resume_unwind(panic);
                }
            };
            match &out {
                Ok(_) => {}
                // The transaction rolled back; the in-memory placement tables
                // may have moved ahead of it, so rebuild them (still under
                // the shared lock). What runs without it changes none.
                Err(Error::Database(e)) => {
                    if error::is_storage_error(e) {
                        inner.storage_failed(e);
                    } else if exclusive {
                        tracing::error!(error = %e, "database operation failed; rebuilding the placement tables");
                    }
                    if exclusive && let Err(e) = core.rebuild_placement() {
                        tracing::error!(error = %e, "cannot rebuild the placement tables");
                    }
                }
                Err(_) => {}
            }
            if exclusive {
                shared::leave(&mut core, &inner, out.is_ok().then_some(&fx));
            }
            if out.is_ok() {
                inner.apply(fx);
            }
            out
        })
        .await?
    }

    /// Creates an account with the supernode's default quotas. Fails with
    /// [`Error::Conflict`] if the name is taken and [`Error::BadRequest`]
    /// for a bad name or password.
    pub async fn create_user(
        &self,
        name: &str,
        password: &str,
        role: Role,
    ) -> Result<UserInfo, Error> {
        self.create_user_with(name, password, role, QuotaChange::default())
            .await
    }

    /// A new enrollment token of the account `owner` (`bspweb up` enrolls
    /// its local peers with one). Fails with [`Error::NotFound`] if there is
    /// no such account.
    pub async fn create_enrollment(
        &self,
        owner: &str,
        name: &str,
    ) -> Result<bsp_api::rest::NewEnrollment, Error> {
        let (owner, name) = (owner.to_string(), name.to_string());
        self.with_core(move |core, _, _| {
            let id = core.user_id(&owner)?;
            core.create_enrollment(id, &name, now_ms())
        })
        .await
    }

    /// Whether a peer logging in with `token` would be admitted (under a
    /// name that is not disabled).
    pub async fn admits(&self, token: &bsp_api::control::EnrollmentToken) -> Result<bool, Error> {
        let token = token.clone();
        self.with_core(move |core, _, _| core.admits(&token)).await
    }

    /// [`Supernode::create_user`] with quotas of its own.
    pub async fn create_user_with(
        &self,
        name: &str,
        password: &str,
        role: Role,
        quotas: QuotaChange,
    ) -> Result<UserInfo, Error> {
        state::check_user_name(name)?;
        state::check_password(password)?;
        state::check_quotas(&quotas)?;
        let hash = hash_password(password).await?;
        let name = name.to_string();
        self.with_core(move |core, inner, _| core.create_user(inner, &name, &hash, role, &quotas))
            .await
    }

    /// Sets the password of the account `name`; its earlier tokens stop
    /// working.
    pub async fn set_password(&self, name: &str, password: &str) -> Result<UserInfo, Error> {
        Ok(self.set_password_generation(name, password).await?.0)
    }

    /// [`Supernode::set_password`], with the account's new token generation.
    pub(crate) async fn set_password_generation(
        &self,
        name: &str,
        password: &str,
    ) -> Result<(UserInfo, i64), Error> {
        state::check_password(password)?;
        let hash = hash_password(password).await?;
        let name = name.to_string();
        self.with_core(move |core, inner, _| core.set_password(inner, &name, &hash))
            .await
    }

    /// The user with this name and password, or `None` if there is no such
    /// user or the password is wrong.
    pub async fn check_password(
        &self,
        name: &str,
        password: &str,
    ) -> Result<Option<UserInfo>, Error> {
        Ok(self.check_login(name, password).await?.map(|(u, _)| u))
    }

    /// [`Supernode::check_password`], with the token generation read in the
    /// same row as the password hash: a login that races a password change
    /// gets a token of the generation its password belonged to.
    pub(crate) async fn check_login(
        &self,
        name: &str,
        password: &str,
    ) -> Result<Option<(UserInfo, i64)>, Error> {
        let lookup = name.to_string();
        let found = self
            .with_core(move |core, inner, _| core.user_with_hash(inner, &lookup))
            .await?;
        let Some((user, hash, generation)) = found else {
            // Spend the same effort as for a real user, so timing does not
            // reveal which names exist.
            let password = password.to_string();
            tokio::task::spawn_blocking(move || {
                auth::verify_password(&password, DUMMY_HASH.as_str())
            })
            .await?;
            return Ok(None);
        };
        let password = password.to_string();
        let ok =
            tokio::task::spawn_blocking(move || auth::verify_password(&password, &hash)).await?;
        Ok(ok.then_some((user, generation)))
    }

    /// Registers a bundled example program under `name`, visible to every
    /// user. Validates the module; registering the same name again replaces
    /// the module and description (so upgrades ship new builtins).
    pub async fn register_builtin(
        &self,
        name: &str,
        description: &str,
        wasm: &[u8],
    ) -> Result<ProgramInfo, Error> {
        state::check_program_name(name)?;
        let wasm = wasm.to_vec();
        let (hash, wasm) =
            tokio::task::spawn_blocking(move || state::validate_module(&wasm).map(|h| (h, wasm)))
                .await??;
        let name = name.to_string();
        let description = description.to_string();
        self.with_core(move |core, inner, _| {
            core.store_program(
                &inner.config,
                None,
                Some(&name),
                Some(&description),
                &hash,
                &wasm,
            )
        })
        .await
    }

    /// The notification listener's settings, when the database is shared
    /// (PostgreSQL).
    fn lock_shared_config(&self) -> Option<tokio_postgres::Config> {
        let core = self.inner.lock_core();
        core.conn.postgres_conn().map(|c| c.config().tokio())
    }

    /// With a shared database, reads what other supernodes changed since
    /// this one last looked; `false` (nothing done) with SQLite.
    pub(crate) async fn refresh_shared(&self) -> bool {
        self.read_shared_changes().await.is_some()
    }

    /// With a shared database, reads what other supernodes changed since
    /// this one last looked: `Some(true)` if anything had changed, `None`
    /// with SQLite (or when the database cannot be reached).
    pub(crate) async fn read_shared_changes(&self) -> Option<bool> {
        if self.inner.instance == 0 {
            return None;
        }
        let read = self
            .with_core(|core, _, _| Ok(core.shared.as_ref().is_some_and(|s| s.resynced)))
            .await;
        match read {
            Ok(changed) => Some(changed),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read what other supernodes changed");
                None
            }
        }
    }

    /// With a shared database, reads `peer`'s lease from it (it may have
    /// logged in or renewed at another supernode); `false` with SQLite.
    pub(crate) async fn refresh_peer(&self, peer: bsp_api::PeerId) -> bool {
        if self.inner.instance == 0 {
            return false;
        }
        self.with_core(move |core, inner, _| core.refresh_lease(inner, peer))
            .await
            .is_ok()
    }

    /// This process's instance id among the supernodes of its database.
    pub(crate) fn instance(&self) -> u64 {
        self.inner.instance
    }

    /// Another supernode changed the shared database: read it again (waking
    /// the long polls of peers with new commands), then wake the event
    /// streams, job lists and scheduler it names.
    pub(crate) async fn wake_from_elsewhere(&self, wake: shared::Wake) {
        self.refresh_shared().await;
        let inner = &self.inner;
        {
            let mut watch = inner.job_watch.lock().unwrap_or_else(|e| e.into_inner());
            watch.retain(|_, tx| tx.receiver_count() > 0);
            for (job, tx) in watch.iter() {
                if wake.all || wake.jobs.contains(job) {
                    tx.send_replace(());
                }
            }
        }
        for change in wake.job_list {
            let _ = inner.job_list.send(change);
        }
        if wake.all {
            // Every follower of a job list re-reads it.
            let _ = inner.job_list.send((sse::EVERY_OWNER, 0));
        }
        if wake.scheduler || wake.all {
            inner.sched_wake.notify_one();
        }
    }

    /// The HTTP routes: the REST API, the peer control plane and the web UI.
    /// The scheduler and the lease sweeper only run under [`Supernode::serve`].
    pub fn router(&self) -> axum::Router {
        http::router(self.clone())
    }

    /// Serves HTTP on `listener` and runs the scheduler and the lease sweeper
    /// until `shutdown` completes; then ends open event streams and long
    /// polls, and returns once the connections are closed.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let addr = listener.local_addr()?;
        if self.inner.config.tls.is_none() && !addr.ip().is_loopback() {
            anyhow::bail!(
                "plain HTTP is served on loopback addresses only, not on {addr}: passwords and tokens would cross the network in clear text; serve HTTPS (`bspweb supernode` does so by itself on such an address)"
            );
        }
        match &self.inner.config.public_url {
            Some(url) => tracing::info!(%addr, public_url = %url, "supernode listening"),
            None => tracing::info!(%addr, "supernode listening"),
        }
        suspect::check_at_start(&self).await;
        let scheduler = tokio::spawn(state::scheduler_task(self.clone()));
        let sweeper = tokio::spawn(state::lease_task(self.clone()));
        let clustering = tokio::spawn(clusters::cluster_task(self.clone()));
        let listener_task = self
            .lock_shared_config()
            .map(|config| tokio::spawn(shared::listen_task(self.clone(), config)));
        let inner = self.inner.clone();
        tokio::spawn(async move {
            shutdown.await;
            inner.shutdown.send_replace(true);
        });
        let app = self.router();
        let limits = self.inner.config.http;
        let stop = self.inner.shutdown_signal();
        let tls = self.inner.config.tls.as_ref().map(ServerTls::acceptor);
        let result = listen::serve(listener, app, limits, stop, tls).await;
        scheduler.abort();
        sweeper.abort();
        clustering.abort();
        if let Some(task) = listener_task {
            task.abort();
        }
        result?;
        tracing::info!("supernode stopped");
        Ok(())
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
