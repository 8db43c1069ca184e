//! The bspweb volunteer peer: runs BSP processes in a wasmtime sandbox,
//! exchanges their messages directly with other peers, and reports to a
//! supernode.
//!
//! - [`runtime`]: the engine, module cache, host functions and limits.
//! - [`barrier`]: the barrier-with-counts state machine (pure).
//! - [`checkpoint`]: snapshots, change detection, checkpoint frames (pure).
//! - [`net`]: the peer ↔ peer data plane (listener, handshake, writers).
//! - [`job`]: the job driver (supersteps, routing, barrier, events).
//! - [`control`]: the supernode client (lease, commands, reports, modules).
//! - [`report`]: the ordered event queue to the supernode.
//! - [`sysinfo`]: idle CPU and the speed benchmark.
//!
//! [`run`] puts them together: `bspweb peer` and `bspweb up` call it.

pub mod availability;
pub mod barrier;
pub mod budget;
pub mod checkpoint;
pub mod control;
pub mod daemon;
pub mod dirty;
#[cfg(feature = "fault-injection")]
mod fault;
pub mod job;
pub mod links;
#[cfg(test)]
mod nan_tests;
pub mod net;
pub mod noise;
pub mod observe;
pub mod program;
pub mod relay;
pub mod report;
pub mod runtime;
pub mod slots;
mod stream;
pub mod sysinfo;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use bsp_api::control::{Command, PeerLogin, PeerRenew};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::control::Client;
use crate::job::{JobEnv, Jobs};
use crate::net::Registry;
use crate::report::Reporter;
use crate::runtime::Runtime;

/// How long a peer keeps dialing another peer of a job that does not know
/// the job yet.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// [`run`]'s error when the supernode refuses this peer for good (no
/// enrollment token, a bad or revoked one, or the peer was disabled).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Configuration of a peer.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// Base URL of the supernode, e.g. `http://127.0.0.1:7878`.
    pub supernode: String,
    /// The data-plane listener; port 0 picks any free port.
    pub listen: SocketAddr,
    /// `host:port` other peers dial; default: the listen IP (127.0.0.1 if
    /// unspecified) and the bound port.
    pub advertise: Option<String>,
    /// A name for people; default: the host name.
    pub name: String,
    /// Cap of a process's memory, MiB (jobs ask for less).
    pub max_memory_mib: u32,
    /// The most memory the peer may hold, MiB, all jobs together
    /// ([`budget`]); `None`: half the machine's memory; `Some(0)`: no budget.
    pub memory_budget_mib: Option<u64>,
    /// Cap of the per-superstep wall-clock limit, ms.
    pub max_superstep_ms: u64,
    /// Processes run at once.
    pub slots: usize,
    /// OS niceness of the threads that run programs.
    pub nice: i32,
    /// Speed weight; `None` runs the benchmark.
    pub speed: Option<f64>,
    /// On shutdown, how long to wait for the supernode to move this peer's
    /// processes away before stopping them anyway.
    pub drain_timeout: Duration,
    /// Read the idle fraction reported at each renewal from this file (a
    /// number in `[0, 1]`) instead of measuring `/proc/stat`: a test hook
    /// to script availability. See [`sysinfo::IdleSource`].
    pub idle_file: Option<PathBuf>,
    /// The network cluster this peer is in (`--cluster`), for broadcast
    /// schedules and Robber; `None`: unknown (treated as one cluster).
    pub cluster: Option<String>,
    /// How large `send_range`/`send_list` payloads travel (`--broadcast`).
    pub broadcast: relay::BroadcastPolicy,
    /// The local control socket (`bspweb peer status|pause|resume`);
    /// `None`: none.
    pub control_socket: Option<PathBuf>,
    /// Take work only inside these daily windows (local time); empty:
    /// always.
    pub windows: Vec<availability::Window>,
    /// Use at most this percentage of the machine's cores (fewer slots,
    /// and fewer cores reported, so the supernode places fewer processes).
    pub cpu_percent: Option<u8>,
    /// The cap on link-probe traffic, sent and answered, MiB per hour
    /// (`--probe-mib-per-hour`, [`links`]); 0: no probes.
    pub probe_mib_per_hour: u64,
    /// Where compiled programs are kept across restarts
    /// ([`runtime::compile_cache`]); `None`: in memory only.
    pub compile_cache: Option<PathBuf>,
    /// The most the compile cache may hold, MiB.
    pub compile_cache_mib: u64,
    /// How an `https://` supernode's certificate is verified
    /// (`--supernode-fingerprint`; default: Mozilla's roots).
    pub supernode_tls: bsp_api::client::TlsOptions,
    /// The enrollment token the peer logs in with (`--token-file`): the
    /// supernode admits no peer without one.
    pub token: Option<bsp_api::control::EnrollmentToken>,
}

impl PeerConfig {
    /// The defaults for a peer of the supernode at `supernode`.
    pub fn new(supernode: impl Into<String>) -> Self {
        PeerConfig {
            supernode: supernode.into(),
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
            advertise: None,
            name: host_name(),
            max_memory_mib: 1024,
            memory_budget_mib: None,
            max_superstep_ms: 60 * 60 * 1000,
            slots: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            nice: 10,
            speed: None,
            drain_timeout: Duration::from_secs(60),
            idle_file: None,
            cluster: None,
            broadcast: relay::BroadcastPolicy::default(),
            control_socket: None,
            windows: Vec::new(),
            cpu_percent: None,
            probe_mib_per_hour: links::DEFAULT_MIB_PER_HOUR,
            compile_cache: None,
            compile_cache_mib: 1024,
            supernode_tls: bsp_api::client::TlsOptions::default(),
            token: None,
        }
    }
}

/// This machine's host name, or `"peer"`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "peer".to_string())
}

/// The address other peers dial: `advertise`, or the listen IP (loopback if
/// unspecified) with the bound port.
pub fn advertised_addr(advertise: Option<&str>, listen: SocketAddr, bound: SocketAddr) -> String {
    if let Some(a) = advertise {
        return a.to_string();
    }
    let ip = if listen.ip().is_unspecified() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        listen.ip()
    };
    SocketAddr::new(ip, bound.port()).to_string()
}

/// Run a peer until `shutdown` resolves: benchmark, listen, log in, then
/// execute the supernode's commands.
///
/// On `shutdown` the peer *drains*: it asks the supernode to move its
/// processes away (`POST /api/v1/peer/drain`, and `draining` in its
/// renewals) and waits until it runs no job, at most
/// [`PeerConfig::drain_timeout`], or until `force` resolves (a second
/// Ctrl-C); then it stops whatever is left and returns. If the supernode
/// cannot be asked, the peer stops at once.
pub async fn run(
    config: PeerConfig,
    shutdown: impl Future<Output = ()>,
    force: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    if config.slots == 0 {
        anyhow::bail!("slots must be at least 1");
    }
    if config.cpu_percent.is_some_and(|p| !(1..=100).contains(&p)) {
        anyhow::bail!("the CPU cap must be a percentage from 1 to 100");
    }
    runtime::set_guest_niceness(config.nice);
    let speed = match config.speed {
        Some(s) if s.is_finite() && s > 0.0 => s,
        Some(s) => anyhow::bail!("speed must be a positive number, not {s}"),
        None => tokio::task::spawn_blocking(|| {
            let nice = runtime::guest_niceness();
            if nice != 0
                && let Err(e) = runtime::nice_thread_at_least(nice)
            {
                tracing::warn!("cannot lower the benchmark's priority: {e}");
            }
            sysinfo::benchmark()
        })
        .await
        .context("the speed benchmark failed")?,
    };
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen for peer connections on {}", config.listen))?;
    let bound = listener.local_addr()?;
    let addr = advertised_addr(config.advertise.as_deref(), config.listen, bound);
    let runtime = Runtime::new().map_err(|e| anyhow::anyhow!("cannot start wasmtime: {e}"))?;
    let budget = match config.memory_budget_mib {
        Some(mib) => mib.saturating_mul(1 << 20),
        None => budget::default_limit(),
    };
    runtime.budget().set_limit(budget);
    let compile_cache = config
        .compile_cache
        .as_deref()
        .filter(|_| config.compile_cache_mib > 0)
        .and_then(|root| {
            let limit = config.compile_cache_mib.saturating_mul(1 << 20);
            match runtime.use_compile_cache(root, limit) {
                Ok(dir) => {
                    tracing::info!("compiled programs are kept in {}", dir.display());
                    Some(dir)
                }
                Err(e) => {
                    tracing::warn!(
                        "compiled programs are kept in memory only, so a restart compiles them again: {e}"
                    );
                    None
                }
            }
        });
    let links = Arc::new(links::Links::new(
        config.probe_mib_per_hour.saturating_mul(1 << 20),
    ));
    let registry = Arc::new(Registry::with_links(links.clone()));
    let reporter = Reporter::new();
    let cancel = CancellationToken::new();
    tokio::spawn(net::serve(listener, registry.clone(), cancel.clone()));

    let mut idle = sysinfo::IdleSource::new(config.idle_file.clone());
    let machine_cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    // A CPU cap runs fewer processes at once and reports fewer cores, so
    // the supernode places fewer here.
    let slots = availability::capped_slots(config.slots, machine_cores, config.cpu_percent);
    let cores = match config.cpu_percent {
        Some(_) => u32::try_from(slots).unwrap_or(u32::MAX),
        None => u32::try_from(machine_cores).unwrap_or(u32::MAX),
    };
    let client = Client::new(
        &config.supernode,
        PeerLogin {
            name: config.name.clone(),
            addr: addr.clone(),
            speed,
            idle: idle.sample(),
            cores,
            version: bsp_api::API_VERSION,
            previous_id: None,
            cluster: config.cluster.clone(),
            token: config.token.clone(),
        },
        &config.supernode_tls,
    )
    .map_err(anyhow::Error::msg)?;
    tracing::info!(
        "peer `{}` listening on {bound} (advertised as {addr}), speed {speed:.2}, {} slots, memory budget {}",
        config.name,
        slots,
        if budget == 0 {
            "none".to_string()
        } else {
            format!("{} MiB", budget >> 20)
        }
    );

    let env = JobEnv {
        inline_max: runtime::INLINE_MAX,
        runtime: runtime.clone(),
        registry,
        reporter: reporter.clone(),
        slots: slots::Slots::new(slots),
        max_memory_mib: config.max_memory_mib,
        max_superstep_ms: config.max_superstep_ms,
        connect_timeout: CONNECT_TIMEOUT,
        broadcast: config.broadcast,
        stats: Default::default(),
    };
    let stats = env.stats.clone();
    let jobs = Jobs::new(env);
    // Fenced (the supernode declared this peer gone): its processes run
    // elsewhere now, so stop them before logging in as a new peer.
    client.set_on_fenced({
        let jobs = jobs.clone();
        Box::new(move || jobs.fence())
    });
    let draining = Arc::new(AtomicBool::new(false));
    let standing = Arc::new(daemon::Standing::default());
    standing.idle_bits.store(1f64.to_bits(), Ordering::Relaxed);
    if let Some(path) = &config.control_socket {
        match daemon::bind(path).await {
            Ok(listener) => {
                tracing::info!(
                    "control socket {} (`bspweb peer status|pause|resume`)",
                    path.display()
                );
                let view = daemon::StatusView {
                    name: config.name.clone(),
                    supernode: config.supernode.clone(),
                    client: client.clone(),
                    jobs: jobs.clone(),
                    standing: standing.clone(),
                    windows: config.windows.iter().map(ToString::to_string).collect(),
                    slots,
                    cpu_percent: config.cpu_percent,
                    speed,
                    runtime: runtime.clone(),
                    compile_cache,
                };
                let handle = Arc::new(move |r| view.handle(r));
                tokio::spawn(daemon::serve(
                    listener,
                    path.clone(),
                    handle,
                    cancel.clone(),
                ));
            }
            Err(e) => tracing::warn!("no control socket: {e}"),
        }
    }

    let stop_availability = standing.clone();
    let main = {
        let cancel = cancel.clone();
        let client = client.clone();
        let jobs = jobs.clone();
        let reporter = reporter.clone();
        let draining = draining.clone();
        async move {
            let Some(lease) = client.login_until_ok(&cancel).await else {
                return;
            };
            tracing::info!(
                peer = lease.peer_id,
                "logged in to the supernode at {}",
                config.supernode
            );
            let machine = Machine {
                speed,
                idle,
                budget_bytes: runtime.budget().limit(),
            };
            tokio::spawn(renew_loop(
                client.clone(),
                jobs.clone(),
                machine,
                Renewed {
                    draining: draining.clone(),
                    standing: standing.clone(),
                },
                stats,
                links,
                cancel.clone(),
            ));
            tokio::spawn(availability_loop(
                client.clone(),
                draining,
                standing,
                config.windows.clone(),
                cancel.clone(),
            ));
            tokio::spawn(upload_loop(client.clone(), reporter, cancel.clone()));
            command_loop(client, jobs, runtime, cancel).await;
        }
    };
    let main = tokio::spawn(main);
    let refused = client.refused();
    let supernode = client.base_url().to_string();
    tokio::select! {
        () = shutdown => {}
        () = refused.cancelled() => {
            // Refused for good (no enrollment token, a revoked one, or the
            // peer was disabled): nothing to drain, the lease is gone.
            jobs.kill_all();
            cancel.cancel();
            let _ = main.await;
            let why = client.refusal().unwrap_or_default();
            return Err(Refused(format!("the supernode at {supernode} refuses this peer: {why}")).into());
        }
    }
    stop_availability.stopping.store(true, Ordering::SeqCst);
    stop_availability.changed.notify_one();
    tokio::pin!(force);
    // Let a drain or resume call in flight finish first (the availability
    // loop sends none after this: it checks `stopping` under the lock), but
    // not longer than a few seconds, nor past a second Ctrl-C.
    tokio::select! {
        g = stop_availability.order.lock() => drop(g),
        () = tokio::time::sleep(Duration::from_secs(5)) => {}
        () = &mut force => {}
    }
    drain(&client, &jobs, &draining, config.drain_timeout, &mut force).await;
    tracing::info!("peer shutting down");
    jobs.kill_all();
    // Give the uploader a moment to deliver what is queued (final output, exits).
    let r = reporter.clone();
    let _ = tokio::task::spawn_blocking(move || {
        r.flush_blocking(
            Duration::from_secs(2),
            &std::sync::atomic::AtomicBool::new(false),
        )
    })
    .await;
    cancel.cancel();
    let _ = main.await;
    Ok(())
}

/// Asks the supernode to drain this peer and waits until it runs no job,
/// `timeout` passes, or `force` resolves.
async fn drain(
    client: &Client,
    jobs: &Jobs,
    draining: &AtomicBool,
    timeout: Duration,
    force: &mut (impl Future<Output = ()> + Unpin),
) {
    if client.peer_id().is_none() {
        return;
    }
    draining.store(true, Ordering::SeqCst);
    tracing::info!(
        "draining: the supernode moves this peer's processes away (up to {timeout:?}; \
         press Ctrl-C again to stop at once)"
    );
    let asked = tokio::select! {
        r = tokio::time::timeout(Duration::from_secs(10), client.drain()) => r,
        () = &mut *force => return,
    };
    match asked {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!("cannot ask the supernode to drain this peer ({e}); stopping now");
            return;
        }
        Err(_) => {
            tracing::warn!("the supernode did not answer the drain request; stopping now");
            return;
        }
    }
    let wait = async {
        while !jobs.running().is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        () = wait => tracing::info!("drained: no job runs here any more"),
        () = tokio::time::sleep(timeout) => tracing::warn!(
            "the drain did not finish within {timeout:?}; stopping the jobs left: {:?}",
            jobs.running()
        ),
        () = &mut *force => tracing::warn!("stopping at once"),
    }
}

async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// What a renewal reports about the peer's machine besides its jobs.
struct Machine {
    speed: f64,
    idle: sysinfo::IdleSource,
    /// The memory budget, bytes (0: none).
    budget_bytes: u64,
}

/// What renewals say about draining, and the order they keep with drain
/// and resume calls.
struct Renewed {
    draining: Arc<AtomicBool>,
    standing: Arc<daemon::Standing>,
}

async fn renew_loop(
    client: Arc<Client>,
    jobs: Arc<Jobs>,
    machine: Machine,
    renewed: Renewed,
    stats: Arc<relay::DataStats>,
    links: Arc<links::Links>,
    cancel: CancellationToken,
) {
    let Renewed { draining, standing } = renewed;
    let Machine {
        speed,
        mut idle,
        budget_bytes,
    } = machine;
    // Answer probes from the login on, not only after the first renewal.
    if let Some(lease) = client.lease() {
        links.set_identity(lease.peer_id, &lease.probe_key);
    }
    loop {
        let every = client
            .lease()
            .map(|l| Duration::from_millis(l.renew_every_ms.max(100)))
            .unwrap_or(Duration::from_secs(1));
        if !sleep_or_cancel(every, &cancel).await {
            return;
        }
        let idle_now = idle.sample();
        standing
            .idle_bits
            .store(idle_now.to_bits(), Ordering::Relaxed);
        client.update_login(speed, idle_now);
        // The draining flag read here and the renewal's arrival keep their
        // order with drain and resume calls.
        let _order = standing.order.lock().await;
        let body = PeerRenew {
            speed,
            idle: idle_now,
            jobs: jobs.running(),
            draining: draining.load(Ordering::SeqCst),
            memory: bsp_api::control::PeerMemory {
                rss_bytes: sysinfo::rss_bytes().unwrap_or(0),
                held_bytes: stats.held.load(Ordering::Relaxed),
                budget_bytes,
            },
            counters: stats.counters(),
            links: links.take_results(),
            observed: stats.observed.drain(),
            waits: stats.observed.waits(std::time::Instant::now()),
        };
        // A refused lease fences the peer (see `control`); an unreachable
        // supernode is retried at the next tick, the jobs carry on.
        match client.renew(&body).await {
            Ok(lease) => {
                links.set_identity(lease.peer_id, &lease.probe_key);
                if !lease.probe.is_empty() {
                    let links = links.clone();
                    tokio::spawn(async move { links.measure_all(lease.probe).await });
                }
            }
            Err(e) => tracing::warn!("cannot renew the lease: {e}"),
        }
    }
}

/// Drains the peer while it should take no work (paused by the volunteer,
/// or outside its time windows) and resumes it when it may again; checks
/// the windows every 20 s and acts at once on `pause` and `resume`.
async fn availability_loop(
    client: Arc<Client>,
    draining: Arc<AtomicBool>,
    standing: Arc<daemon::Standing>,
    windows: Vec<availability::Window>,
    cancel: CancellationToken,
) {
    // What the supernode was last told; `None`: not yet (it starts out
    // taking work).
    let mut told: Option<bool> = Some(false);
    loop {
        let outside = !availability::allowed(&windows, availability::local_minute_of_day());
        if standing.outside_windows.swap(outside, Ordering::SeqCst) != outside {
            tracing::info!(
                "{} its time windows ({})",
                if outside { "outside" } else { "inside" },
                windows
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let want = standing.wants_drain();
        let mut retry = false;
        if told != Some(want) && !standing.stopping.load(Ordering::SeqCst) {
            let _order = standing.order.lock().await;
            // The shutdown's drain comes after this call, never before it.
            if standing.stopping.load(Ordering::SeqCst) {
                return;
            }
            draining.store(want, Ordering::SeqCst);
            let result = if want {
                client.drain().await
            } else {
                client.resume().await
            };
            match result {
                Ok(()) => {
                    told = Some(want);
                    tracing::info!(
                        "{}",
                        if want {
                            "paused: the supernode moves this peer's processes away and gives it no new ones"
                        } else {
                            "taking work again"
                        }
                    );
                }
                Err(e) => {
                    // Renewals carry the draining flag meanwhile (a drain
                    // takes effect with the next one); retried shortly.
                    tracing::warn!("cannot tell the supernode (retrying): {e}");
                    told = None;
                    retry = true;
                }
            }
        }
        let wait = if retry {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(20)
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = standing.changed.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
        if standing.stopping.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// At most one upload of nothing but progress per this interval: a job of
/// sub-millisecond supersteps would otherwise cost the supernode a request
/// (and a database transaction) per superstep per peer, on the cores the
/// job runs on. Output, status and exits are never held back.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(50);

async fn upload_loop(client: Arc<Client>, reporter: Reporter, cancel: CancellationToken) {
    let mut last_upload: Option<std::time::Instant> = None;
    loop {
        let not_before = last_upload.map(|t| t + PROGRESS_INTERVAL);
        let batch = tokio::select! {
            _ = cancel.cancelled() => return,
            b = reporter.next_batch_paced(512, 1 << 20, not_before) => b,
        };
        last_upload = Some(std::time::Instant::now());
        let mut backoff = Duration::from_millis(200);
        loop {
            match client.report(&batch).await {
                Ok(()) => {
                    reporter.delivered(batch.len());
                    break;
                }
                Err(e) if !e.is_transient() => {
                    tracing::error!(
                        "the supernode refused a report of {} events, dropping it: {e}",
                        batch.len()
                    );
                    reporter.delivered(batch.len());
                    break;
                }
                Err(e) => {
                    tracing::warn!("cannot deliver a report, retrying in {backoff:?}: {e}");
                    if !sleep_or_cancel(backoff, &cancel).await {
                        return;
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

async fn command_loop(
    client: Arc<Client>,
    jobs: Arc<Jobs>,
    runtime: Arc<Runtime>,
    cancel: CancellationToken,
) {
    let mut after = 0u64;
    let mut polled_as = client.peer_id();
    let mut backoff = Duration::from_millis(200);
    loop {
        // A new peer id (after a fence) numbers its commands from 0 again.
        let me = client.peer_id();
        if me != polled_as {
            polled_as = me;
            after = 0;
        }
        let polled = tokio::select! {
            _ = cancel.cancelled() => return,
            r = client.commands(after, control::COMMAND_WAIT) => r,
        };
        let commands = match polled {
            Ok(c) => {
                backoff = Duration::from_millis(200);
                c.commands
            }
            Err(e) => {
                tracing::warn!("cannot fetch commands, retrying in {backoff:?}: {e}");
                if !sleep_or_cancel(backoff, &cancel).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        for c in commands {
            if c.seq <= after {
                continue;
            }
            after = c.seq;
            match c.command {
                Command::StartJob(assignment) => {
                    let Some(me) = client.peer_id() else { continue };
                    let job = assignment.job;
                    let fetch = job::fetch_inputs(client.clone(), runtime.clone(), &assignment);
                    if jobs.start(me, assignment, fetch).is_some() {
                        tracing::info!(job, "starting job");
                    }
                }
                Command::KillJob { job, reason } => {
                    if jobs.kill(job) {
                        tracing::info!(job, "killing job: {reason}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advertised_address_defaults_to_loopback_and_the_bound_port() {
        let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let bound: SocketAddr = "0.0.0.0:4567".parse().unwrap();
        assert_eq!(advertised_addr(None, any, bound), "127.0.0.1:4567");
        let lan: SocketAddr = "10.0.0.5:0".parse().unwrap();
        assert_eq!(advertised_addr(None, lan, bound), "10.0.0.5:4567");
        assert_eq!(
            advertised_addr(Some("peer.example:9"), any, bound),
            "peer.example:9"
        );
    }

    #[test]
    fn defaults_are_volunteer_friendly() {
        let c = PeerConfig::new("http://127.0.0.1:7878");
        assert_eq!(c.nice, 10);
        assert_eq!(c.max_memory_mib, 1024);
        assert_eq!(c.drain_timeout, Duration::from_secs(60));
        assert!(c.idle_file.is_none());
        assert!(c.slots >= 1);
        assert!(!c.name.is_empty());
    }
}
