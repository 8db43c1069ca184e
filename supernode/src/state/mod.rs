//! The supernode's state transitions: users, programs, jobs, scheduling,
//! peer leases and peer reports. Each runs in one SQLite transaction on a
//! blocking thread and records its [`Effects`]. One file per concern:
//! [`validate`], [`users`], [`job_ops`], [`schedule`], [`peers`],
//! [`report`], [`redundancy`] (result validation: output gating and
//! judging disagreements); here the [`Core`] itself, its loading and the
//! background tasks.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::sql::{Connection, OptionalExtension, Transaction, params};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bsp_api::control::{Command, Lease, PeerEvent, PeerLogin, PeerRenew, SeqCommand, Stream};
use bsp_api::rest::{
    JobEventKind, JobInfo, JobLimits, JobOutcome, JobState, PeerInfo, ProgramInfo, QuotaChange,
    Quotas, RingInfo, RingPeer, RingProcess, Role, UpdateUserRequest, Usage, UserInfo,
};
use bsp_api::{JobId, PeerId, Pid};
use placement::{Dhht, golden_position};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::db::{self, u64_from_sql, u64_to_sql};
use crate::epoch::LossCause;
use crate::jobs::{Ending, Place, finish_job, list_changed, queue};
use crate::metrics::Counter;
use crate::{Effects, Error, Inner, Live, LivePeer, Supernode, epoch, lease, now_ms};

mod enroll;
mod job_ops;
mod links;
mod peer_views;
mod peers;
mod plain_renewal;
mod progress;
mod redundancy;
mod report;
mod schedule;
mod users;
mod validate;

pub(crate) use enroll::Caller;
pub(crate) use plain_renewal::{Plain, PlainOutcome};
use schedule::admit_memory;
pub(crate) use users::Account;
pub(crate) use validate::*;

/// Largest number of processes of one job.
pub(crate) const MAX_NPROCS: u32 = 4096;
/// Largest JSON text of a job's arguments.
pub(crate) const MAX_ARGS_BYTES: usize = 1 << 20;
/// Largest total decoded size of a job's resources.
pub(crate) const MAX_RESOURCE_BYTES: usize = 64 << 20;
/// Largest description, in characters.
const MAX_DESCRIPTION_CHARS: usize = 4096;
/// Longest reason or status text kept from a peer, in characters.
const MAX_REASON_CHARS: usize = 4096;
/// Most checkpoint replicas a job may ask for.
const MAX_REPLICAS: u32 = 8;
/// Below this idle fraction a peer's owner is using the machine: it takes
/// no processes (weight 0, out of the DHHT) and the ones it hosts migrate
/// away, as a switched-off host leaves the balancer in §4.3. Its index on
/// the ring is kept, so it returns to the same position when idle again.
pub(crate) const MIN_AVAILABILITY: f64 = 0.05;

/// The state behind the supernode's lock: the database and the placement
/// tables derived from it.
pub(crate) struct Core {
    pub(crate) conn: Connection,
    place: Place,
    /// Set when the database is shared with other supernodes
    /// (PostgreSQL): what [`crate::shared`] needs.
    pub(crate) shared: Option<crate::shared::Shared>,
}

/// Points sampled to measure each peer's share of the ring (`GET /api/v1/ring`).
const RING_SAMPLES: u32 = 1 << 14;

/// A peer's placement power as an SQL expression over `peers`: the power
/// stored at its last renewal, else [`weight`] of its claim, with `?1`
/// bound to [`MIN_AVAILABILITY`]. A literal, for `concat!`.
macro_rules! power_sql {
    () => {
        "coalesce(power, CASE WHEN idle < ?1 THEN 0.0 ELSE speed * idle END)"
    };
}
pub(crate) use power_sql;

/// A peer's weight in the DHHT: speed × availability; 0 (no share) below
/// [`MIN_AVAILABILITY`].
fn weight(speed: f64, idle: f64) -> f64 {
    if idle < MIN_AVAILABILITY {
        0.0
    } else {
        speed * idle
    }
}

/// The power placement gives `peer`, which claims `speed` and `idle`: its
/// claim as far as it has been shown ([`crate::verify`]).
fn allowed_weight(
    place: &Place,
    inner: &Inner,
    peer: PeerId,
    speed: f64,
    idle: f64,
    now: i64,
) -> f64 {
    let claimed = weight(speed, idle);
    if claimed <= 0.0 {
        return claimed;
    }
    // O(log n): this runs at every renewal.
    let median = place.dhht.median_weight_of_others(peer);
    inner.live().verify.allowed(peer, claimed, median, now)
}

/// Whether a peer's power moved from `old` to `new` by more than the
/// relative `hysteresis`, so the DHHT should follow. Becoming busy (0) or
/// available again always counts.
fn power_moved(old: f64, new: f64, hysteresis: f64) -> bool {
    if old <= 0.0 || new <= 0.0 {
        return (old <= 0.0) != (new <= 0.0);
    }
    (new - old).abs() > hysteresis * old
}

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

// ---------------------------------------------------------------- helpers

/// The state of `owner`'s job `job`, `None` when there is no such job.
fn job_state(conn: &Connection, owner: i64, job: JobId) -> Result<Option<JobState>, Error> {
    let state: Option<String> = conn
        .query_row(
            "SELECT state FROM jobs WHERE id = ?1 AND owner = ?2",
            params![job, owner],
            |r| r.get(0),
        )
        .optional()?;
    Ok(state.as_deref().and_then(JobState::parse))
}

/// A peer that may have died, to be checked by dialing `addr`.
#[derive(Debug, Clone)]
pub(crate) struct Suspect {
    pub(crate) peer: PeerId,
    /// Its data-plane address, as it logged in with.
    pub(crate) addr: String,
    pub(crate) why: SuspectWhy,
}

/// Why a peer is suspected.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SuspectWhy {
    /// Peer `by` of `job` lost its data-plane link to it (a
    /// [`PeerEvent::PeerUnreachable`] report).
    LinkLost { job: JobId, by: PeerId },
    /// It was online when the supernode stopped: it may have stopped too
    /// (e.g. with the `bspweb up` that started it).
    Restart,
}

impl std::fmt::Display for SuspectWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SuspectWhy::LinkLost { job, by } => {
                write!(f, "peer #{by} lost its data-plane link to it in job {job}")
            }
            SuspectWhy::Restart => write!(f, "it was online when the supernode last stopped"),
        }
    }
}

impl Core {
    /// The peers recorded online, to be checked at start.
    pub(crate) fn online_peers(&self) -> Result<Vec<Suspect>, Error> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, addr FROM peers WHERE state = 'online'")?;
        let rows = stmt.query_map([], |r| {
            Ok(Suspect {
                peer: r.get(0)?,
                addr: r.get(1)?,
                why: SuspectWhy::Restart,
            })
        })?;
        Ok(rows.collect::<crate::sql::Result<_>>()?)
    }

    /// Builds the in-memory state from the database at start. The leases of
    /// peers recorded online are extended to at least one TTL from now, so
    /// peers that kept running while the supernode was down can renew and
    /// their jobs carry on; peers that did not are declared gone a TTL later
    /// (counted from when it serves: [`Core::extend_leases_at_start`]).
    pub(crate) fn load(conn: Connection, ttl: std::time::Duration) -> anyhow::Result<(Core, Live)> {
        let shared = match conn.engine() {
            crate::sql::Engine::Sqlite => None,
            crate::sql::Engine::Postgres => Some(crate::shared::Shared::new(
                crate::shared::generation(&conn)?,
            )),
        };
        let mut core = Core {
            conn,
            place: Place::default(),
            shared,
        };
        extend_stored_leases(&core.conn, lease::expiry(now_ms(), ttl))?;
        core.rebuild_placement()?;
        let mut live = Live::default();
        live.peers.extend(core.read_live_peers()?);
        Ok((core, live))
    }

    /// Extends every online peer's lease to at least one TTL from `now`,
    /// stored and in memory, when the supernode starts serving: peers
    /// cannot renew before, and what came between [`Core::load`] and
    /// serving (registering examples, hashing a password, a loaded
    /// machine) must not count against them.
    pub(crate) fn extend_leases_at_start(&mut self, inner: &Inner, now: i64) -> Result<(), Error> {
        let until = lease::expiry(now, inner.config.lease_ttl);
        extend_stored_leases(&self.conn, until)?;
        for p in inner.live().peers.values_mut() {
            p.expires_at = p.expires_at.max(until);
        }
        Ok(())
    }

    /// The online peers' leases and command queues, as stored.
    fn read_live_peers(&self) -> Result<Vec<(PeerId, LivePeer)>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT id, lease_id, lease_expires_at, cmd_seq, addr FROM peers WHERE state = 'online'",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, PeerId>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, String>(4)?,
            ))
        })?;
        let mut commands = self.conn.prepare(
            "SELECT c.peer_id, c.seq, c.body FROM commands c JOIN peers p ON p.id = c.peer_id \
             WHERE p.state = 'online' ORDER BY c.peer_id, c.seq",
        )?;
        let mut queues: HashMap<PeerId, VecDeque<SeqCommand>> = HashMap::new();
        for c in commands.query_map([], |r| {
            Ok((
                r.get::<_, PeerId>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
            ))
        })? {
            let (id, seq, body) = c?;
            match serde_json::from_str::<Command>(&body) {
                Ok(command) => queues.entry(id).or_default().push_back(SeqCommand {
                    seq: u64_from_sql(seq),
                    command,
                }),
                Err(e) => {
                    tracing::error!(peer = id, seq, error = %e, "skipping an unreadable stored command")
                }
            }
        }
        let mut peers = Vec::new();
        for row in rows {
            let (id, lease_id, expires_at, seq, addr) = row?;
            let queue = queues.remove(&id).unwrap_or_default();
            let acked = queue.front().map_or(u64_from_sql(seq), |c| c.seq - 1);
            peers.push((
                id,
                LivePeer {
                    lease_id,
                    expires_at,
                    last_seq: u64_from_sql(seq),
                    queue,
                    acked,
                    pruned: acked,
                    notify: Arc::new(Notify::new()),
                    probed_at: None,
                    counters: None,
                    addr,
                },
            ));
        }
        Ok(peers)
    }

    /// A fingerprint of what other supernodes derive from the database and
    /// could not learn by themselves: the DHHT's peers and weights and the
    /// accounts' standing. A transition of a shared database that changed
    /// neither and had no effect to tell (a plain lease renewal) does not
    /// make the others resync ([`crate::shared::leave`]); leases they read
    /// from the database when theirs look stale ([`Core::refresh_lease`]).
    pub(crate) fn shared_fingerprint(&self, inner: &Inner) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for p in self.place.dhht.peers() {
            (p.id, p.position, p.weight.to_bits()).hash(&mut h);
        }
        let mut accounts: Vec<(i64, String, bool, i64)> = inner
            .accounts()
            .iter()
            .map(|(&id, a)| (id, a.role.to_string(), a.disabled, a.generation))
            .collect();
        accounts.sort_unstable();
        accounts.hash(&mut h);
        h.finish()
    }

    /// Reads `peer`'s lease from the database into the live table: with a
    /// shared database it may have logged in or renewed at another
    /// supernode since this one last looked.
    pub(crate) fn refresh_lease(&self, inner: &Inner, peer: PeerId) -> Result<(), Error> {
        let row: Option<(String, i64)> = self
            .conn
            .query_row(
                "SELECT lease_id, lease_expires_at FROM peers WHERE id = ?1 AND state = 'online'",
                [peer],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((lease_id, expires_at)) = row else {
            inner.live().forget(&[peer]);
            return Ok(());
        };
        let same = inner
            .live()
            .peers
            .get(&peer)
            .is_some_and(|p| p.lease_id == lease_id);
        if same {
            if let Some(p) = inner.live().peers.get_mut(&peer) {
                p.expires_at = p.expires_at.max(expires_at);
            }
            return Ok(());
        }
        // A lease this supernode has not seen: the whole entry, with its
        // command queue.
        if let Some((_, fresh)) = self
            .read_live_peers()?
            .into_iter()
            .find(|(id, _)| *id == peer)
        {
            let mut live = inner.live();
            match live.peers.get_mut(&peer) {
                Some(p) => {
                    let notify = p.notify.clone();
                    *p = fresh;
                    p.notify = notify;
                    p.notify.notify_waiters();
                }
                None => {
                    live.peers.insert(peer, fresh);
                }
            }
        }
        Ok(())
    }

    /// Reads again what another supernode sharing the database changed
    /// ([`crate::shared`]): the placement tables, the online peers' leases
    /// and command queues (waking the long polls of peers that have new
    /// commands, and of peers no longer online), and the accounts.
    pub(crate) fn resync(&mut self, inner: &Inner) -> Result<(), Error> {
        // What this supernode keeps about placement that is not stored —
        // which waiting jobs were told why, the last move of each process —
        // survives the rebuild, so no job is told again and no process
        // moves back.
        let kept = (
            std::mem::take(&mut self.place.moves),
            std::mem::take(&mut self.place.memory_waits),
            std::mem::take(&mut self.place.volunteer_waits),
            std::mem::take(&mut self.place.quota_waits),
        );
        self.rebuild_placement()?;
        (
            self.place.moves,
            self.place.memory_waits,
            self.place.volunteer_waits,
            self.place.quota_waits,
        ) = kept;
        let fresh = self.read_live_peers()?;
        let accounts = self.accounts()?;
        *inner.accounts() = accounts;
        let mut live = inner.live();
        let online: HashSet<PeerId> = fresh.iter().map(|(id, _)| *id).collect();
        let gone: Vec<PeerId> = live
            .peers
            .keys()
            .filter(|id| !online.contains(id))
            .copied()
            .collect();
        live.forget(&gone);
        for (id, new) in fresh {
            match live.peers.get_mut(&id) {
                Some(p) if p.lease_id == new.lease_id => {
                    let newest = p.queue.back().map(|c| c.seq);
                    let acked = p.acked;
                    p.expires_at = p.expires_at.max(new.expires_at);
                    p.last_seq = p.last_seq.max(new.last_seq);
                    p.queue = new.queue.into_iter().filter(|c| c.seq > acked).collect();
                    if p.queue.back().map(|c| c.seq) > newest {
                        p.notify.notify_waiters();
                    }
                }
                // It logged in again (at another supernode): a new lease.
                Some(p) => {
                    let notify = p.notify.clone();
                    *p = new;
                    p.notify = notify;
                    p.notify.notify_waiters();
                }
                None => {
                    live.peers.insert(id, new);
                }
            }
        }
        Ok(())
    }

    /// Rebuilds the DHHT and the allocators from the database (at start, and
    /// after a failed transaction may have left them out of step).
    pub(crate) fn rebuild_placement(&mut self) -> Result<(), Error> {
        let mut place = Place::default();
        let mut unplaced = Vec::new();
        // Built at once (O(n log n); one by one is O(n²)).
        let mut in_dhht: Vec<placement::Peer> = Vec::new();
        let entry = |id: PeerId, k: u64, weight: f64| placement::Peer {
            id,
            position: golden_position(k),
            weight,
        };
        {
            let mut stmt = self.conn.prepare(concat!(
                "SELECT id, golden, ",
                power_sql!(),
                ", draining FROM peers WHERE state = 'online' ORDER BY id"
            ))?;
            let rows = stmt.query_map([MIN_AVAILABILITY], |r| {
                Ok((
                    r.get::<_, PeerId>(0)?,
                    r.get::<_, Option<i64>>(1)?,
                    r.get::<_, f64>(2)?,
                    r.get::<_, bool>(3)?,
                ))
            })?;
            for row in rows {
                let (id, golden, power, draining) = row?;
                let k = golden
                    .map(u64_from_sql)
                    .filter(|&k| place.peer_indices.restore(k));
                match k {
                    Some(k) if !draining && power > 0.0 => in_dhht.push(entry(id, k, power)),
                    Some(_) => {}
                    None => unplaced.push((id, power, draining)),
                }
            }
        }
        for (id, power, draining) in unplaced {
            let k = place.peer_indices.alloc();
            self.conn.execute(
                "UPDATE peers SET golden = ?2 WHERE id = ?1",
                params![id, u64_to_sql(k)],
            )?;
            if !draining && power > 0.0 {
                in_dhht.push(entry(id, k, power));
            }
        }
        let (dhht, rejected) = Dhht::from_peers(in_dhht);
        for (peer, e) in rejected {
            tracing::error!(peer = peer.id, error = %e, "cannot add a peer to the placement table");
        }
        place.dhht = dhht;
        {
            let mut stmt = self.conn.prepare(
                "SELECT p.position FROM placements p JOIN jobs j ON j.id = p.job WHERE j.state = 'active'",
            )?;
            for k in stmt.query_map([], |r| r.get::<_, i64>(0))? {
                place.process_indices.restore(u64_from_sql(k?));
            }
        }
        // Cheap to check once: whether running jobs match the table.
        place.rebalance_pending = true;
        self.place = place;
        Ok(())
    }
}

fn no_job(id: JobId) -> Error {
    Error::NotFound(format!("no job {id} among your jobs"))
}

/// Puts peer `id` at golden index `k` with `power` into the DHHT (replacing
/// a stale entry), or keeps
/// it out while its power is 0 (busy).
fn insert_peer(dhht: &mut Dhht, id: PeerId, k: u64, power: f64) {
    dhht.remove(id);
    if power <= 0.0 {
        return;
    }
    let peer = placement::Peer {
        id,
        position: golden_position(k),
        weight: power,
    };
    if let Err(e) = dhht.insert(peer) {
        tracing::error!(peer = id, error = %e, "cannot add a peer to the placement table");
    }
}

// ---------------------------------------------------------------- tasks

/// Runs the scheduler whenever it is woken (and every few seconds as a
/// safety net).
pub(crate) async fn scheduler_task(sn: Supernode) {
    loop {
        match sn
            .with_core(|core, inner, fx| core.schedule(inner, fx, now_ms()))
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::debug!(placed = n, "scheduler placed jobs"),
            Err(e) => {
                tracing::error!(error = %e, "scheduling failed");
                let _ = sn.with_core(|core, _, _| core.rebuild_placement()).await;
            }
        }
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            sn.inner.sched_wake.notified(),
        )
        .await;
    }
}

/// Extends the stored lease of every online peer to at least `until`.
fn extend_stored_leases(conn: &Connection, until: i64) -> Result<(), Error> {
    conn.execute(
        "UPDATE peers SET lease_expires_at = CASE WHEN lease_expires_at > ?1 THEN lease_expires_at ELSE ?1 END WHERE state = 'online'",
        [until],
    )?;
    Ok(())
}

/// Declares peers gone when their lease expires, every TTL/4.
pub(crate) async fn lease_task(sn: Supernode) {
    let mut tick = tokio::time::interval(lease::sweep_every(sn.inner.config.lease_ttl));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // While the disk takes no writes, try one each sweep (so that the
        // trouble ends even when no peer renews).
        if sn.inner.storage_trouble().is_some() {
            let stored = sn
                .with_core(|core, inner, _| core.store_live_leases(inner, now_ms()))
                .await;
            if stored.is_ok() {
                sn.inner.storage_ok();
            }
        }
        let result = sn
            .with_core(|core, inner, fx| core.sweep(inner, fx, now_ms()))
            .await;
        match result {
            Ok(_) => {}
            // Said once by `storage_failed`; nothing was changed.
            Err(e) if e.is_storage() => {}
            Err(e) => {
                tracing::error!(error = %e, "lease sweep failed");
                let _ = sn.with_core(|core, _, _| core.rebuild_placement()).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_and_plain() {
        assert!(is_name("ring"));
        assert!(is_name("My_prog-1.2"));
        assert!(!is_name(""));
        assert!(!is_name("a b"));
        assert!(!is_name("../etc"));
        assert!(!is_name(&"x".repeat(65)));
        assert!(is_name(&"x".repeat(64)));
    }

    #[test]
    fn addresses_must_be_host_and_port() {
        for ok in [
            "127.0.0.1:7000",
            "[::1]:7000",
            "peer-3.example.org:80",
            "localhost:1",
        ] {
            assert!(is_host_port(ok), "{ok}");
        }
        for bad in [
            "127.0.0.1",
            ":80",
            "host:",
            "host:0",
            "host:99999",
            "a b:80",
            "127.0.0.1:0",
            "",
        ] {
            assert!(!is_host_port(bad), "{bad}");
        }
    }

    #[test]
    fn limits_are_clamped_to_sane_ranges() {
        let l = clamp_limits(JobLimits {
            superstep_ms: 0,
            memory_mib: 0,
            output_mib: 0,
            checkpoint_every: 0,
            replicas: 0,
            redundancy: 1,
        });
        assert_eq!(
            l,
            JobLimits {
                superstep_ms: 100,
                memory_mib: 1,
                output_mib: 1,
                checkpoint_every: 1,
                replicas: 0,
                redundancy: 1,
            }
        );
        let l = clamp_limits(JobLimits {
            superstep_ms: u64::MAX,
            memory_mib: u32::MAX,
            output_mib: u32::MAX,
            checkpoint_every: u32::MAX,
            replicas: u32::MAX,
            redundancy: 2,
        });
        assert_eq!(
            l,
            JobLimits {
                superstep_ms: 86_400_000,
                memory_mib: 4096,
                output_mib: 1024,
                checkpoint_every: 1_000_000,
                replicas: MAX_REPLICAS,
                redundancy: 2,
            }
        );
        assert_eq!(clamp_limits(JobLimits::default()), JobLimits::default());
    }

    #[test]
    fn power_follows_only_changes_beyond_the_hysteresis() {
        assert!(!power_moved(1.0, 1.0, 0.25));
        assert!(!power_moved(1.0, 0.8, 0.25));
        assert!(!power_moved(1.0, 1.25, 0.25));
        assert!(power_moved(1.0, 0.7, 0.25));
        assert!(power_moved(1.0, 1.3, 0.25));
        // Going busy and coming back always count.
        assert!(power_moved(weight(2.0, 1.0), weight(2.0, 0.0), 1e9));
        assert!(power_moved(0.0, weight(2.0, 0.06), 1e9));
        assert!(!power_moved(0.0, 0.0, 0.0));
        // Zero hysteresis follows every change.
        assert!(power_moved(1.0, 0.999, 0.0));
    }

    #[test]
    fn a_peer_below_five_percent_availability_has_no_weight() {
        assert_eq!(weight(2.0, 0.5), 1.0);
        assert_eq!(weight(2.0, MIN_AVAILABILITY), 2.0 * MIN_AVAILABILITY);
        assert_eq!(weight(2.0, 0.049), 0.0);
        assert_eq!(weight(2.0, 0.0), 0.0);
        let mut dhht = Dhht::new();
        insert_peer(&mut dhht, 1, 1, weight(2.0, 0.0));
        assert!(dhht.is_empty(), "a busy peer is not in the DHHT");
        insert_peer(&mut dhht, 1, 1, weight(2.0, 0.5));
        assert_eq!(dhht.get(1).map(|p| p.weight), Some(1.0));
    }

    #[test]
    fn long_texts_are_truncated_on_a_char_boundary() {
        assert_eq!(truncate("héllo", 2), "hé…");
        assert_eq!(truncate("abc", 3), "abc");
    }

    #[test]
    fn submissions_are_checked() {
        let base = || bsp_api::rest::SubmitJob {
            program: "ring".into(),
            nprocs: 4,
            args: serde_json::Value::Null,
            description: None,
            resources: Default::default(),
            seed: None,
            limits: None,
            min_peers: None,
        };
        assert!(validate_submit(base()).is_ok());
        let mut j = base();
        j.nprocs = 0;
        assert!(matches!(validate_submit(j), Err(Error::BadRequest { .. })));
        let mut j = base();
        j.nprocs = MAX_NPROCS + 1;
        assert!(matches!(validate_submit(j), Err(Error::BadRequest { .. })));
        let mut j = base();
        j.resources.insert("input".into(), "not base64!".into());
        let e = validate_submit(j).err().unwrap();
        assert!(e.to_string().contains("resource `input`"), "{e}");
        let mut j = base();
        j.args = serde_json::Value::String("x".repeat(MAX_ARGS_BYTES));
        assert!(matches!(validate_submit(j), Err(Error::TooLarge(_))));
        let mut j = base();
        j.resources.insert("input".into(), BASE64.encode(b"hello"));
        j.seed = Some(u64::MAX);
        let ok = validate_submit(j).unwrap();
        assert_eq!(ok.resources, vec![("input".to_string(), b"hello".to_vec())]);
        assert_eq!(ok.seed, u64::MAX);
        assert!(validate_submit(base()).unwrap().seed < 1 << 53);
        // Redundancy 1 or 2, else a 400 that says what is allowed.
        for (r, ok) in [
            (0, false),
            (1, true),
            (2, true),
            (3, false),
            (u32::MAX, false),
        ] {
            let mut j = base();
            j.limits = Some(JobLimits {
                redundancy: r,
                ..JobLimits::default()
            });
            match validate_submit(j) {
                Ok(job) => assert!(ok && job.limits.redundancy == r, "{r}"),
                Err(e) => {
                    assert!(!ok, "{r}: {e}");
                    assert!(matches!(e, Error::BadRequest { .. }), "{e}");
                    assert!(e.to_string().contains("must be 1"), "{e}");
                }
            }
        }
    }
}
