//! The supernode's state transitions: users, programs, jobs, scheduling,
//! peer leases and peer reports. Each runs in one SQLite transaction on a
//! blocking thread and records its [`Effects`].

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bsp_api::control::{Command, Lease, PeerEvent, PeerLogin, PeerRenew, SeqCommand, Stream};
use bsp_api::rest::{
    JobEventKind, JobInfo, JobLimits, JobOutcome, JobState, PeerInfo, ProgramInfo, RingInfo,
    RingPeer, RingProcess, UserInfo,
};
use bsp_api::{JobId, PeerId, Pid};
use placement::{Dhht, golden_position};
use rusqlite::{Connection, OptionalExtension, Transaction, params};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::db::{self, u64_from_sql, u64_to_sql};
use crate::epoch::LossCause;
use crate::jobs::{Ending, Place, finish_job, list_changed, queue};
use crate::{Effects, Error, Inner, Live, LivePeer, Supernode, epoch, lease, now_ms};

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
const MIN_AVAILABILITY: f64 = 0.05;

/// The state behind the supernode's lock: the database and the placement
/// tables derived from it.
pub(crate) struct Core {
    pub(crate) conn: Connection,
    place: Place,
}

/// Points sampled to measure each peer's share of the ring (`GET /api/v1/ring`).
const RING_SAMPLES: u32 = 1 << 14;

/// A peer's weight in the DHHT: speed × availability; 0 (no share) below
/// [`MIN_AVAILABILITY`].
fn weight(speed: f64, idle: f64) -> f64 {
    if idle < MIN_AVAILABILITY {
        0.0
    } else {
        speed * idle
    }
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

// ---------------------------------------------------------------- validation

fn is_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// User names: 1 to 64 of `A-Z a-z 0-9 _ . -`.
pub(crate) fn check_user_name(name: &str) -> Result<(), Error> {
    if is_name(name) {
        Ok(())
    } else {
        Err(Error::bad_request(
            "a user name is 1 to 64 characters of letters, digits, `_`, `.` and `-`",
        ))
    }
}

/// Passwords: 8 to 1024 bytes.
pub(crate) fn check_password(password: &str) -> Result<(), Error> {
    if (8..=1024).contains(&password.len()) {
        Ok(())
    } else {
        Err(Error::bad_request(
            "a password is 8 to 1024 characters long",
        ))
    }
}

/// Program names: 1 to 64 of `A-Z a-z 0-9 _ . -`.
pub(crate) fn check_program_name(name: &str) -> Result<(), Error> {
    if is_name(name) {
        Ok(())
    } else {
        Err(Error::bad_request(format!(
            "`{}` is not a valid program name: use 1 to 64 letters, digits, `_`, `.` and `-`",
            truncate(name, 80)
        )))
    }
}

/// Validates a module against the `bspweb_v1` contract and returns its hex
/// SHA-256. Slow for big modules: call from a blocking thread.
pub(crate) fn validate_module(wasm: &[u8]) -> Result<String, Error> {
    bspweb_abi::validate(wasm).map_err(|e| Error::Unprocessable {
        code: "invalid_module",
        message: e.to_string(),
    })?;
    Ok(hex::encode(Sha256::digest(wasm)))
}

fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A submitted job after validation.
pub(crate) struct NewJob {
    program: String,
    nprocs: u32,
    args: String,
    description: Option<String>,
    seed: u64,
    limits: JobLimits,
    resources: Vec<(String, Vec<u8>)>,
}

/// Limits clamped to what the supernode accepts.
pub(crate) fn clamp_limits(limits: JobLimits) -> JobLimits {
    JobLimits {
        superstep_ms: limits.superstep_ms.clamp(100, 86_400_000),
        memory_mib: limits.memory_mib.clamp(1, 4096),
        output_mib: limits.output_mib.clamp(1, 1024),
        checkpoint_every: limits.checkpoint_every.clamp(1, 1_000_000),
        replicas: limits.replicas.min(MAX_REPLICAS),
    }
}

/// Checks a submission; decodes its resources. CPU-bound for big resources:
/// call from a blocking thread.
pub(crate) fn validate_submit(job: bsp_api::rest::SubmitJob) -> Result<NewJob, Error> {
    let program = job.program.trim().to_string();
    if program.is_empty() || program.len() > 128 {
        return Err(Error::bad_request(
            "`program` must name one of your programs, a bundled example, or a module hash",
        ));
    }
    if job.nprocs == 0 || job.nprocs > MAX_NPROCS {
        return Err(Error::bad_request(format!(
            "`nprocs` must be between 1 and {MAX_NPROCS}, not {}",
            job.nprocs
        )));
    }
    let args = serde_json::to_string(&job.args)
        .map_err(|e| Error::bad_request(format!("`args` cannot be stored: {e}")))?;
    if args.len() > MAX_ARGS_BYTES {
        return Err(Error::TooLarge(format!(
            "`args` is {} bytes of JSON; the limit is {MAX_ARGS_BYTES} (pass big inputs as resources)",
            args.len()
        )));
    }
    if let Some(d) = &job.description
        && d.chars().count() > MAX_DESCRIPTION_CHARS
    {
        return Err(Error::bad_request(format!(
            "`description` is longer than {MAX_DESCRIPTION_CHARS} characters"
        )));
    }
    let mut resources = Vec::with_capacity(job.resources.len());
    let mut total = 0usize;
    for (name, data) in job.resources {
        if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
            return Err(Error::bad_request(format!(
                "resource name `{}` is not valid: use 1 to 256 printable characters",
                truncate(&name, 80)
            )));
        }
        let bytes = BASE64.decode(data.as_bytes()).map_err(|e| {
            Error::bad_request(format!(
                "resource `{name}` is not valid base64 ({e}); encode its bytes with standard base64"
            ))
        })?;
        total += bytes.len();
        if total > MAX_RESOURCE_BYTES {
            return Err(Error::TooLarge(format!(
                "the job's resources add up to more than {} MiB",
                MAX_RESOURCE_BYTES >> 20
            )));
        }
        resources.push((name, bytes));
    }
    Ok(NewJob {
        program,
        nprocs: job.nprocs,
        args,
        description: job.description,
        // Below 2^53, so the seed survives JavaScript's numbers in the web UI.
        seed: job.seed.unwrap_or_else(|| rand::random::<u64>() >> 11),
        limits: clamp_limits(job.limits.unwrap_or_default()),
        resources,
    })
}

fn check_peer_numbers(speed: f64, idle: f64) -> Result<(), Error> {
    if !(speed.is_finite() && speed > 0.0 && speed <= 1e9) {
        return Err(Error::bad_request(format!(
            "`speed` must be a positive number (1.0 = the reference machine), not {speed}"
        )));
    }
    if !(idle.is_finite() && (0.0..=1.0).contains(&idle)) {
        return Err(Error::bad_request(format!(
            "`idle` must be a fraction between 0 and 1, not {idle}"
        )));
    }
    Ok(())
}

/// Whether `addr` is `host:port` with a non-zero port (IPv6 hosts in brackets).
fn is_host_port(addr: &str) -> bool {
    if addr.parse::<std::net::SocketAddr>().is_ok() {
        return !addr.ends_with(":0");
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return false;
    };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    port_ok && host_ok
}

/// Checks a peer's login.
pub(crate) fn validate_login(login: &PeerLogin) -> Result<(), Error> {
    if login.version != bsp_api::API_VERSION {
        return Err(Error::bad_request(format!(
            "this supernode speaks protocol version {}, the peer {}; run matching bspweb versions",
            bsp_api::API_VERSION,
            login.version
        )));
    }
    if login.name.trim().is_empty()
        || login.name.chars().count() > 128
        || login.name.chars().any(char::is_control)
    {
        return Err(Error::bad_request(
            "`name` must be 1 to 128 printable characters",
        ));
    }
    if !is_host_port(&login.addr) {
        return Err(Error::bad_request(format!(
            "`addr` must be `host:port` where other peers reach this peer, not `{}`",
            truncate(&login.addr, 80)
        )));
    }
    if let Some(c) = &login.cluster
        && !bsp_api::control::valid_cluster_name(c)
    {
        return Err(Error::bad_request(format!(
            "`cluster` must be 1 to 64 letters, digits, `.`, `_` or `-`, not `{}`",
            truncate(c, 80)
        )));
    }
    check_peer_numbers(login.speed, login.idle)?;
    if login.cores == 0 || login.cores > 65_536 {
        return Err(Error::bad_request(format!(
            "`cores` must be between 1 and 65536, not {}",
            login.cores
        )));
    }
    Ok(())
}

/// Checks a renewal.
pub(crate) fn validate_renew(renew: &PeerRenew) -> Result<(), Error> {
    check_peer_numbers(renew.speed, renew.idle)?;
    if renew.jobs.len() > 100_000 {
        return Err(Error::bad_request("`jobs` lists more than 100000 jobs"));
    }
    let m = renew.memory;
    if i64::try_from(m.rss_bytes).is_err() || i64::try_from(m.held_bytes).is_err() {
        return Err(Error::bad_request(
            "`memory.rss_bytes` and `memory.held_bytes` must be below 2^63",
        ));
    }
    Ok(())
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

/// What a report handler knows about a job the reporting peer may touch.
struct ReportJob {
    active: bool,
    owner: i64,
    nprocs: u32,
    /// The job's current epoch.
    epoch: u64,
    /// The processes, indexed by pid.
    placement: Vec<epoch::Placed>,
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
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Builds the in-memory state from the database at start. The leases of
    /// peers recorded online are extended to at least one TTL from now, so
    /// peers that kept running while the supernode was down can renew and
    /// their jobs carry on; peers that did not are declared gone a TTL later.
    pub(crate) fn load(conn: Connection, ttl: std::time::Duration) -> anyhow::Result<(Core, Live)> {
        let mut core = Core {
            conn,
            place: Place::default(),
        };
        core.conn.execute(
            "UPDATE peers SET lease_expires_at = max(lease_expires_at, ?1) WHERE state = 'online'",
            [lease::expiry(now_ms(), ttl)],
        )?;
        core.rebuild_placement()?;
        let mut live = Live::default();
        {
            let mut stmt = core.conn.prepare(
                "SELECT id, lease_id, lease_expires_at, cmd_seq FROM peers WHERE state = 'online'",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, PeerId>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })?;
            let mut commands = core
                .conn
                .prepare("SELECT seq, body FROM commands WHERE peer_id = ?1 ORDER BY seq")?;
            for row in rows {
                let (id, lease_id, expires_at, seq) = row?;
                let mut queue = VecDeque::new();
                for c in commands
                    .query_map([id], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?
                {
                    let (seq, body) = c?;
                    match serde_json::from_str::<Command>(&body) {
                        Ok(command) => queue.push_back(SeqCommand {
                            seq: u64_from_sql(seq),
                            command,
                        }),
                        Err(e) => {
                            tracing::error!(peer = id, seq, error = %e, "skipping an unreadable stored command")
                        }
                    }
                }
                let acked = queue.front().map_or(u64_from_sql(seq), |c| c.seq - 1);
                live.peers.insert(
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
                    },
                );
            }
        }
        Ok((core, live))
    }

    /// Rebuilds the DHHT and the allocators from the database (at start, and
    /// after a failed transaction may have left them out of step).
    pub(crate) fn rebuild_placement(&mut self) -> Result<(), Error> {
        let mut place = Place::default();
        let mut unplaced = Vec::new();
        {
            let mut stmt = self.conn.prepare(
                "SELECT id, golden, \
                 coalesce(power, CASE WHEN idle < ?1 THEN 0.0 ELSE speed * idle END), draining \
                 FROM peers WHERE state = 'online' ORDER BY id",
            )?;
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
                    Some(k) if !draining => insert_peer(&mut place.dhht, id, k, power),
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
            if !draining {
                insert_peer(&mut place.dhht, id, k, power);
            }
        }
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

    // ------------------------------------------------------------ users

    pub(crate) fn create_user(
        &mut self,
        name: &str,
        hash: &str,
        admin: bool,
    ) -> Result<UserInfo, Error> {
        let exists: bool = self.conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM users WHERE name = ?1)",
            [name],
            |r| r.get(0),
        )?;
        if exists {
            return Err(Error::Conflict(format!(
                "a user named `{name}` exists already"
            )));
        }
        self.conn.execute(
            "INSERT INTO users (name, password_hash, admin, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![name, hash, admin, now_ms()],
        )?;
        tracing::info!(user = name, admin, "created user");
        Ok(UserInfo {
            id: self.conn.last_insert_rowid(),
            name: name.to_string(),
            admin,
        })
    }

    pub(crate) fn user_with_hash(&self, name: &str) -> Result<Option<(UserInfo, String)>, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT id, name, admin, password_hash FROM users WHERE name = ?1",
                [name],
                |r| {
                    Ok((
                        UserInfo {
                            id: r.get(0)?,
                            name: r.get(1)?,
                            admin: r.get(2)?,
                        },
                        r.get(3)?,
                    ))
                },
            )
            .optional()?)
    }

    pub(crate) fn user(&self, id: i64) -> Result<Option<UserInfo>, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT id, name, admin FROM users WHERE id = ?1",
                [id],
                |r| {
                    Ok(UserInfo {
                        id: r.get(0)?,
                        name: r.get(1)?,
                        admin: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    // ------------------------------------------------------------ programs

    /// Stores a validated module, records the upload for `owner`
    /// (`None`: a builtin) and registers `name` if given.
    pub(crate) fn store_program(
        &mut self,
        owner: Option<i64>,
        name: Option<&str>,
        description: Option<&str>,
        hash: &str,
        wasm: &[u8],
    ) -> Result<ProgramInfo, Error> {
        let now = now_ms();
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT OR IGNORE INTO programs (hash, bytes, size, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![hash, wasm, wasm.len() as i64, now],
        )?;
        if let Some(owner) = owner {
            tx.execute(
                "INSERT OR IGNORE INTO program_uploads (owner, hash, uploaded_at) VALUES (?1, ?2, ?3)",
                params![owner, hash, now],
            )?;
        }
        if let Some(name) = name {
            let updated = tx.execute(
                "UPDATE program_names SET hash = ?3, description = ?4, updated_at = ?5 \
                 WHERE coalesce(owner, 0) = coalesce(?1, 0) AND name = ?2",
                params![owner, name, hash, description, now],
            )?;
            if updated == 0 {
                tx.execute(
                    "INSERT INTO program_names (owner, name, hash, description, updated_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![owner, name, hash, description, now],
                )?;
            }
        }
        tx.commit()?;
        Ok(ProgramInfo {
            name: name.map(str::to_string),
            hash: hash.to_string(),
            size: wasm.len() as u64,
            builtin: owner.is_none(),
            description: description.map(str::to_string),
        })
    }

    /// What `owner` can run: builtins not shadowed by their own names, their
    /// named programs, and their unnamed uploads.
    pub(crate) fn programs_of(&self, owner: i64) -> Result<Vec<ProgramInfo>, Error> {
        let mut out = Vec::new();
        let mut stmt = self.conn.prepare(
            "SELECT n.name, n.hash, p.size, n.description, n.owner IS NULL FROM program_names n \
             JOIN programs p ON p.hash = n.hash \
             WHERE n.owner = ?1 OR (n.owner IS NULL AND n.name NOT IN \
                 (SELECT name FROM program_names WHERE owner = ?1)) \
             ORDER BY n.owner IS NOT NULL, n.name",
        )?;
        for row in stmt.query_map([owner], |r| {
            Ok(ProgramInfo {
                name: Some(r.get(0)?),
                hash: r.get(1)?,
                size: u64_from_sql(r.get(2)?),
                description: r.get(3)?,
                builtin: r.get(4)?,
            })
        })? {
            out.push(row?);
        }
        let mut stmt = self.conn.prepare(
            "SELECT u.hash, p.size FROM program_uploads u JOIN programs p ON p.hash = u.hash \
             WHERE u.owner = ?1 AND u.hash NOT IN (SELECT hash FROM program_names WHERE owner = ?1) \
             ORDER BY u.uploaded_at, u.hash",
        )?;
        for row in stmt.query_map([owner], |r| {
            Ok(ProgramInfo {
                name: None,
                hash: r.get(0)?,
                size: u64_from_sql(r.get(1)?),
                description: None,
                builtin: false,
            })
        })? {
            out.push(row?);
        }
        Ok(out)
    }

    /// Forgets `owner`'s program `program` (a name of theirs, or the hash of
    /// a module they uploaded, which also drops their names for it). Jobs
    /// keep running; the module's bytes go once nothing refers to them.
    pub(crate) fn delete_program(&mut self, owner: i64, program: &str) -> Result<(), Error> {
        let tx = self.conn.transaction()?;
        let by_name: Option<String> = tx
            .query_row(
                "SELECT hash FROM program_names WHERE owner = ?1 AND name = ?2",
                params![owner, program],
                |r| r.get(0),
            )
            .optional()?;
        let hash = if let Some(hash) = by_name {
            tx.execute(
                "DELETE FROM program_names WHERE owner = ?1 AND name = ?2",
                params![owner, program],
            )?;
            // The upload goes too unless another of the owner's names keeps it.
            tx.execute(
                "DELETE FROM program_uploads WHERE owner = ?1 AND hash = ?2 \
                 AND NOT EXISTS (SELECT 1 FROM program_names WHERE owner = ?1 AND hash = ?2)",
                params![owner, hash],
            )?;
            hash
        } else {
            let hash = program.to_ascii_lowercase();
            let n = if is_hash(program) {
                tx.execute(
                    "DELETE FROM program_uploads WHERE owner = ?1 AND hash = ?2",
                    params![owner, hash],
                )?
            } else {
                0
            };
            if n == 0 {
                let builtin: bool = tx.query_row(
                    "SELECT EXISTS (SELECT 1 FROM program_names WHERE owner IS NULL \
                         AND (name = ?1 OR hash = ?2))",
                    params![program, hash],
                    |r| r.get(0),
                )?;
                if builtin {
                    return Err(Error::Forbidden(format!(
                        "`{program}` is a bundled example; bundled examples cannot be deleted"
                    )));
                }
                return Err(Error::ProgramNotFound(format!(
                    "no program `{program}` among your programs; list them with GET /api/v1/programs \
                     (`bspweb programs`)"
                )));
            }
            tx.execute(
                "DELETE FROM program_names WHERE owner = ?1 AND hash = ?2",
                params![owner, hash],
            )?;
            hash
        };
        tx.execute(
            "DELETE FROM programs WHERE hash = ?1 \
             AND NOT EXISTS (SELECT 1 FROM program_names WHERE hash = ?1) \
             AND NOT EXISTS (SELECT 1 FROM program_uploads WHERE hash = ?1) \
             AND NOT EXISTS (SELECT 1 FROM jobs WHERE program_hash = ?1)",
            [&hash],
        )?;
        tx.commit()?;
        tracing::info!(owner, program, hash, "program deleted");
        Ok(())
    }

    /// The module hash `program` means for `owner`: their own name, a builtin
    /// name, or the hash of a module they uploaded or of a builtin.
    fn resolve_program(tx: &Connection, owner: i64, program: &str) -> Result<String, Error> {
        let by_name: Option<String> = tx
            .query_row(
                "SELECT hash FROM program_names WHERE name = ?2 AND (owner = ?1 OR owner IS NULL) \
                 ORDER BY owner IS NULL LIMIT 1",
                params![owner, program],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(hash) = by_name {
            return Ok(hash);
        }
        if is_hash(program) {
            let hash = program.to_ascii_lowercase();
            let allowed: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM program_uploads WHERE owner = ?1 AND hash = ?2) \
                     OR EXISTS (SELECT 1 FROM program_names WHERE owner IS NULL AND hash = ?2)",
                params![owner, hash],
                |r| r.get(0),
            )?;
            if allowed {
                return Ok(hash);
            }
        }
        Err(Error::ProgramNotFound(format!(
            "no program `{program}`: it is neither one of your programs, nor a bundled example, \
             nor the hash of a module you uploaded; list what you can run with GET /api/v1/programs \
             (`bspweb programs`) or upload it first"
        )))
    }

    // ------------------------------------------------------------ jobs

    /// The DHHT ring as placement sees it, with the processes of `owner`'s
    /// active jobs. Shares are measured by looking up [`RING_SAMPLES`]
    /// evenly spaced points (error below 1/RING_SAMPLES).
    pub(crate) fn ring(&self, owner: i64) -> Result<RingInfo, Error> {
        let dhht = &self.place.dhht;
        let mut wins: HashMap<PeerId, u32> = HashMap::new();
        for i in 0..RING_SAMPLES {
            let x = placement::Position(((i as u64) << 50) | (1 << 49));
            if let Some(peer) = dhht.lookup(x) {
                *wins.entry(peer).or_default() += 1;
            }
        }
        let mut names: HashMap<PeerId, String> = HashMap::new();
        {
            let mut stmt = self
                .conn
                .prepare("SELECT id, name FROM peers WHERE state = 'online'")?;
            for row in stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))? {
                let (id, name) = row?;
                names.insert(id, name);
            }
        }
        let mut peers: Vec<RingPeer> = dhht
            .peers()
            .map(|p| RingPeer {
                id: p.id,
                name: names.get(&p.id).cloned().unwrap_or_default(),
                position: p.position.to_f64(),
                weight: p.weight,
                share: f64::from(wins.get(&p.id).copied().unwrap_or(0)) / f64::from(RING_SAMPLES),
            })
            .collect();
        peers.sort_by(|a, b| a.position.total_cmp(&b.position));
        let mut stmt = self.conn.prepare(
            "SELECT p.job, p.pid, p.position, p.peer_id FROM placements p JOIN jobs j ON j.id = p.job \
             WHERE j.state = 'active' AND j.owner = ?1 ORDER BY p.job, p.pid",
        )?;
        let processes = stmt
            .query_map([owner], |r| {
                Ok(RingProcess {
                    job: r.get(0)?,
                    pid: r.get(1)?,
                    position: golden_position(u64_from_sql(r.get(2)?)).to_f64(),
                    peer: r.get(3)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(RingInfo { peers, processes })
    }

    pub(crate) fn submit(
        &mut self,
        owner: i64,
        job: NewJob,
        fx: &mut Effects,
    ) -> Result<JobInfo, Error> {
        let now = now_ms();
        let tx = self.conn.transaction()?;
        let hash = Self::resolve_program(&tx, owner, &job.program)?;
        let proc_bytes = admit_memory(&tx, &hash, job.nprocs, job.limits.replicas)?;
        tx.execute(
            "INSERT INTO jobs (owner, program, program_hash, nprocs, args, description, seed, \
                 superstep_ms, memory_mib, output_mib, state, submitted_at, checkpoint_every, replicas, \
                 proc_bytes) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'waiting', ?11, ?12, ?13, ?14)",
            params![
                owner,
                job.program,
                hash,
                job.nprocs,
                job.args,
                job.description,
                u64_to_sql(job.seed),
                u64_to_sql(job.limits.superstep_ms),
                job.limits.memory_mib,
                job.limits.output_mib,
                now,
                job.limits.checkpoint_every,
                job.limits.replicas,
                u64_to_sql(proc_bytes)
            ],
        )?;
        let id = tx.last_insert_rowid();
        {
            let mut stmt =
                tx.prepare("INSERT INTO job_resources (job, name, data) VALUES (?1, ?2, ?3)")?;
            for (name, data) in &job.resources {
                stmt.execute(params![id, name, data])?;
            }
        }
        let info = db::job_info(&tx, id, None)?
            .ok_or_else(|| Error::Internal("a job vanished while it was submitted".into()))?;
        tx.commit()?;
        tracing::info!(job = id, owner, program = %job.program, nprocs = job.nprocs, "job submitted");
        fx.wake_scheduler = true;
        fx.job_list.push((owner, id));
        Ok(info)
    }

    /// The state of `owner`'s job `id`; `None` when there is no such job.
    pub(crate) fn job_state(&self, owner: i64, id: JobId) -> Result<Option<JobState>, Error> {
        job_state(&self.conn, owner, id)
    }

    /// The ids of `owner`'s jobs.
    pub(crate) fn job_ids(&self, owner: i64) -> Result<Vec<JobId>, Error> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id FROM jobs WHERE owner = ?1 ORDER BY id")?;
        let ids = stmt
            .query_map([owner], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(ids)
    }

    pub(crate) fn job(&self, owner: i64, id: JobId) -> Result<JobInfo, Error> {
        db::job_info(&self.conn, id, Some(owner))?.ok_or_else(|| no_job(id))
    }

    pub(crate) fn jobs(
        &self,
        owner: i64,
        state: Option<bsp_api::rest::JobState>,
    ) -> Result<Vec<JobInfo>, Error> {
        db::jobs_of(&self.conn, owner, state)
    }

    pub(crate) fn kill(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        owner: i64,
        id: JobId,
    ) -> Result<JobInfo, Error> {
        let now = now_ms();
        let tx = self.conn.transaction()?;
        let state: Option<(String, Option<String>)> = tx
            .query_row(
                "SELECT state, outcome FROM jobs WHERE id = ?1 AND owner = ?2",
                params![id, owner],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        match state {
            None => return Err(no_job(id)),
            Some((state, outcome)) if state == "finished" => {
                return Err(Error::Conflict(format!(
                    "job {id} is already finished ({}); there is nothing to kill",
                    outcome.unwrap_or_default()
                )));
            }
            Some(_) => {}
        }
        let ending = Ending {
            outcome: JobOutcome::Killed,
            error: Some("killed by its owner".into()),
            error_pid: None,
            event: JobEventKind::JobKilled,
            kill: Some("the job was killed by its owner".into()),
            skip_peer: None,
        };
        finish_job(&tx, &mut self.place, inner, fx, id, ending, now)?;
        let info = db::job_info(&tx, id, None)?.ok_or_else(|| no_job(id))?;
        tx.commit()?;
        Ok(info)
    }

    pub(crate) fn dispose(&mut self, fx: &mut Effects, owner: i64, id: JobId) -> Result<(), Error> {
        let tx = self.conn.transaction()?;
        let state: Option<String> = tx
            .query_row(
                "SELECT state FROM jobs WHERE id = ?1 AND owner = ?2",
                params![id, owner],
                |r| r.get(0),
            )
            .optional()?;
        match state.as_deref() {
            None => return Err(no_job(id)),
            Some("finished") => {}
            Some(state) => {
                return Err(Error::Conflict(format!(
                    "job {id} is {state}; kill it first, then dispose of it"
                )));
            }
        }
        tx.execute("DELETE FROM events WHERE job = ?1", [id])?;
        tx.execute("DELETE FROM jobs WHERE id = ?1", [id])?;
        tx.commit()?;
        tracing::info!(job = id, "job disposed");
        fx.jobs.insert(id);
        fx.job_list.push((owner, id));
        Ok(())
    }

    /// Up to `limit` events of `owner`'s job `id` after event `after`, and
    /// whether the job is finished; `None` if the job is not (or no longer)
    /// theirs.
    pub(crate) fn events(
        &self,
        owner: i64,
        id: JobId,
        after: i64,
        limit: u32,
    ) -> Result<Option<(Vec<bsp_api::rest::JobEvent>, bool)>, Error> {
        let state: Option<String> = self
            .conn
            .query_row(
                "SELECT state FROM jobs WHERE id = ?1 AND owner = ?2",
                params![id, owner],
                |r| r.get(0),
            )
            .optional()?;
        let Some(state) = state else {
            return Ok(None);
        };
        let events = db::events_after(&self.conn, id, after, limit)?;
        Ok(Some((events, state == "finished")))
    }

    /// The id of the newest stored event of the owner's job `id` (0 when it
    /// has none), or `None` when the owner has no such job.
    pub(crate) fn last_event_id(&self, owner: i64, id: JobId) -> Result<Option<i64>, Error> {
        let mine: Option<i64> = self
            .conn
            .query_row(
                "SELECT id FROM jobs WHERE id = ?1 AND owner = ?2",
                params![id, owner],
                |r| r.get(0),
            )
            .optional()?;
        match mine {
            Some(_) => Ok(Some(db::last_event_id(&self.conn, id)?)),
            None => Ok(None),
        }
    }

    // ------------------------------------------------------------ scheduling

    /// Places waiting jobs, oldest first, while the overload limit allows
    /// (§4.4). Returns how many were placed.
    pub(crate) fn schedule(&mut self, inner: &Inner, fx: &mut Effects) -> Result<usize, Error> {
        let now = now_ms();
        let tx = self.conn.transaction()?;
        let online: HashMap<PeerId, (String, u32)> = {
            let mut stmt = tx.prepare(
                "SELECT id, addr, cores FROM peers \
                 WHERE state = 'online' AND lease_expires_at >= ?1 AND draining = 0",
            )?;
            stmt.query_map([now], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))?
                .collect::<rusqlite::Result<_>>()?
        };
        if online.is_empty() || self.place.dhht.is_empty() {
            return Ok(0);
        }
        // What each peer may still take under its memory budget (none: no
        // budget), from its last renewal.
        let mut room: HashMap<PeerId, Room> = {
            let mut stmt = tx.prepare(
                "SELECT id, budget_bytes - rss_bytes, budget_bytes FROM peers \
                 WHERE state = 'online' AND budget_bytes > 0",
            )?;
            stmt.query_map([], |r| {
                Ok((
                    r.get(0)?,
                    Room {
                        free: r.get::<_, i64>(1)?.max(0) as u64,
                        budget: r.get::<_, i64>(2)?.max(0) as u64,
                    },
                ))
            })?
            .collect::<rusqlite::Result<_>>()?
        };
        let cores: f64 = online.values().map(|(_, c)| f64::from(*c)).sum();
        let capacity = inner.config.overload_factor * cores;
        let (mut running, mut active): (i64, i64) = tx.query_row(
            "SELECT coalesce(sum(nprocs - exited), 0), count(*) FROM jobs WHERE state = 'active'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let waiting: Vec<(JobId, u32)> = {
            let mut stmt =
                tx.prepare("SELECT id, nprocs FROM jobs WHERE state = 'waiting' ORDER BY id")?;
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        let mut placed = 0;
        for (job, nprocs) in waiting {
            if active > 0 && (running + i64::from(nprocs)) as f64 > capacity {
                tracing::debug!(job, running, capacity, "job waits: the peers are loaded");
                break;
            }
            match place_job(
                &tx,
                &mut self.place,
                inner,
                fx,
                &online,
                &mut room,
                job,
                nprocs,
                now,
            )? {
                Placing::Placed => {}
                // Later jobs may fit where this one does not (yet).
                Placing::NoMemory => continue,
                Placing::NoPeer => break,
            }
            running += i64::from(nprocs);
            active += 1;
            placed += 1;
        }
        tx.commit()?;
        Ok(placed)
    }

    // ------------------------------------------------------------ peers

    /// A peer logs in and gets a lease.
    pub(crate) fn peer_login(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        login: &PeerLogin,
    ) -> Result<Lease, Error> {
        let now = now_ms();
        let ttl = inner.config.lease_ttl;
        let tx = self.conn.transaction()?;
        // Settle overdue leases first, so a returning peer whose lease ran
        // out is seen as gone (and its lost jobs are failed) before it is back.
        let expired = expire_overdue(&tx, &mut self.place, inner, fx, now)?;
        let reuse = match login.previous_id {
            Some(id) => tx
                .query_row("SELECT state FROM peers WHERE id = ?1", [id], |r| {
                    r.get::<_, String>(0)
                })
                .optional()?
                .filter(|state| state == "gone")
                .map(|_| id),
            None => None,
        };
        let lease_id = hex::encode(rand::random::<[u8; 16]>());
        let expires_at = lease::expiry(now, ttl);
        let k = self.place.peer_indices.alloc();
        let id = match reuse {
            Some(id) => {
                tx.execute(
                    "UPDATE peers SET name = ?2, addr = ?3, speed = ?4, idle = ?5, cores = ?6, golden = ?7, \
                         lease_id = ?8, lease_expires_at = ?9, state = 'online', last_seen = ?10, \
                         draining = 0, power = ?11, cluster = ?12 WHERE id = ?1",
                    params![id, login.name, login.addr, login.speed, login.idle, login.cores,
                        u64_to_sql(k), lease_id, expires_at, now, weight(login.speed, login.idle),
                        login.cluster],
                )?;
                id
            }
            None => {
                tx.execute(
                    "INSERT INTO peers (name, addr, speed, idle, cores, golden, lease_id, lease_expires_at, \
                         state, first_seen, last_seen, power, cluster) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'online', ?9, ?9, ?10, ?11)",
                    params![login.name, login.addr, login.speed, login.idle, login.cores,
                        u64_to_sql(k), lease_id, expires_at, now, weight(login.speed, login.idle),
                        login.cluster],
                )?;
                tx.last_insert_rowid()
            }
        };
        let seq: i64 = tx.query_row("SELECT cmd_seq FROM peers WHERE id = ?1", [id], |r| {
            r.get(0)
        })?;
        tx.commit()?;
        insert_peer(&mut self.place.dhht, id, k, weight(login.speed, login.idle));
        {
            let mut live = inner.live();
            for gone in expired {
                if let Some(p) = live.peers.remove(&gone) {
                    p.notify.notify_waiters();
                }
            }
            live.peers.insert(
                id,
                LivePeer {
                    lease_id: lease_id.clone(),
                    expires_at,
                    last_seq: u64_from_sql(seq),
                    queue: VecDeque::new(),
                    acked: u64_from_sql(seq),
                    pruned: u64_from_sql(seq),
                    notify: Arc::new(Notify::new()),
                    probed_at: None,
                },
            );
        }
        tracing::info!(peer = id, name = %login.name, addr = %login.addr, speed = login.speed,
            idle = login.idle, cores = login.cores, reused = reuse.is_some(), "peer logged in");
        fx.wake_scheduler = true;
        Ok(Lease {
            peer_id: id,
            token: inner.keys.peer_token(id, &lease_id, expires_at)?,
            ttl_ms: ttl.as_millis() as u64,
            renew_every_ms: lease::renew_every(ttl).as_millis() as u64,
        })
    }

    /// A peer renews its lease and reports its availability.
    pub(crate) fn peer_renew(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        peer: PeerId,
        renew: &PeerRenew,
    ) -> Result<Lease, Error> {
        let now = now_ms();
        let ttl = inner.config.lease_ttl;
        let lease_id = {
            let live = inner.live();
            match live.peers.get(&peer) {
                Some(p) if lease::is_valid(now, p.expires_at) => p.lease_id.clone(),
                _ => {
                    return Err(Error::Unauthorized {
                        code: "lease_expired",
                        message: format!("the lease of peer {peer} has expired; log in again"),
                    });
                }
            }
        };
        let expires_at = lease::expiry(now, ttl);
        // A job waiting for a peer's memory may fit now.
        if !self.place.memory_waits.is_empty() {
            fx.wake_scheduler = true;
        }
        // The renewal's own effects (commands, events) apply only if its
        // transaction committed.
        let mut own = Effects::default();
        match self.renew_in_db(inner, &mut own, peer, renew, now, expires_at) {
            Ok(()) => {
                fx.merge(own);
                if inner.storage_trouble().is_some() {
                    self.store_live_leases(inner, now)?;
                }
                inner.storage_ok();
            }
            // The disk takes no writes: the lease goes on in memory (the
            // sweeper honours it), so a full disk does not make every peer
            // look gone; what else the renewal would have recorded waits
            // for the next one.
            Err(Error::Database(e)) if crate::error::is_storage_error(&e) => {
                inner.storage_failed(&e);
                if let Err(e) = self.rebuild_placement() {
                    tracing::error!(error = %e, "cannot rebuild the placement tables");
                }
            }
            Err(e) => return Err(e),
        }
        if let Some(p) = inner.live().peers.get_mut(&peer) {
            p.expires_at = expires_at;
        }
        Ok(Lease {
            peer_id: peer,
            token: inner.keys.peer_token(peer, &lease_id, expires_at)?,
            ttl_ms: ttl.as_millis() as u64,
            renew_every_ms: lease::renew_every(ttl).as_millis() as u64,
        })
    }

    /// After the disk took no writes: record the leases that were renewed
    /// in memory only, so every query of who is online sees them again
    /// (only the sweeper reads the in-memory ones), and note that the disk
    /// takes writes (a probe row when no peer is online).
    pub(crate) fn store_live_leases(&mut self, inner: &Inner, now: i64) -> Result<(), Error> {
        let leases: Vec<(PeerId, i64)> = inner
            .live()
            .peers
            .iter()
            .map(|(&id, p)| (id, p.expires_at))
            .collect();
        let tx = self.conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "UPDATE peers SET lease_expires_at = max(lease_expires_at, ?2) \
                 WHERE id = ?1 AND state = 'online'",
            )?;
            for (id, at) in leases {
                stmt.execute(params![id, at])?;
            }
        }
        tx.execute(
            "INSERT OR REPLACE INTO storage_probe (id, at) VALUES (1, ?1)",
            [now],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// What a renewal records: the peer's speed, idle fraction, memory and
    /// lease expiry; jobs it should not run are killed; a power change
    /// beyond the hysteresis re-weights it in the DHHT.
    fn renew_in_db(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        peer: PeerId,
        renew: &PeerRenew,
        now: i64,
        expires_at: i64,
    ) -> Result<(), Error> {
        let tx = self.conn.transaction()?;
        let draining: bool = tx.query_row(
            "UPDATE peers SET speed = ?2, idle = ?3, lease_expires_at = ?4, last_seen = ?5, \
                 rss_bytes = ?6, held_bytes = ?7, budget_bytes = ?8 \
             WHERE id = ?1 AND state = 'online' RETURNING draining",
            params![
                peer,
                renew.speed,
                renew.idle,
                expires_at,
                now,
                renew.memory.rss_bytes as i64,
                renew.memory.held_bytes as i64,
                i64::try_from(renew.memory.budget_bytes).unwrap_or(i64::MAX)
            ],
            |r| r.get(0),
        )?;
        // Jobs the peer runs but should not: finished, unknown, or not among its peers.
        let mut stale = Vec::new();
        {
            let mut stmt = tx.prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM job_peers p JOIN jobs j ON j.id = p.job \
                 WHERE p.job = ?1 AND p.peer_id = ?2 AND j.state = 'active')",
            )?;
            let mut seen = HashSet::new();
            for &job in &renew.jobs {
                if seen.insert(job)
                    && !stmt.query_row(params![job, peer], |r| r.get::<_, bool>(0))?
                {
                    stale.push(job);
                }
            }
        }
        for job in stale {
            tracing::info!(
                peer,
                job,
                "peer runs a job that is not active there; telling it to stop"
            );
            queue(
                &tx,
                inner,
                fx,
                peer,
                Command::KillJob {
                    job,
                    reason: "the job is not running on this peer any more".into(),
                },
            )?;
        }
        if renew.draining && !draining {
            drain_in(&tx, &mut self.place, inner, fx, peer, now)?;
        } else if !draining {
            let w = weight(renew.speed, renew.idle);
            // Out of the DHHT (and not draining): busy, power 0.
            let old = self.place.dhht.get(peer).map_or(0.0, |p| p.weight);
            if power_moved(old, w, inner.config.power_hysteresis) {
                let golden: Option<i64> =
                    tx.query_row("SELECT golden FROM peers WHERE id = ?1", [peer], |r| {
                        r.get(0)
                    })?;
                if let Some(k) = golden {
                    insert_peer(&mut self.place.dhht, peer, u64_from_sql(k), w);
                    tx.execute(
                        "UPDATE peers SET power = ?2 WHERE id = ?1",
                        params![peer, w],
                    )?;
                    if w <= 0.0 {
                        tracing::info!(
                            peer,
                            "peer is busy (its owner uses it): moving its processes away"
                        );
                    } else {
                        tracing::info!(
                            peer,
                            from = old,
                            to = w,
                            "peer's power changed beyond the hysteresis"
                        );
                    }
                    self.place.rebalance_pending =
                        epoch::rebalance(&tx, &mut self.place, inner, fx, now)?;
                    epoch::settle_drains(&tx, inner, fx, now)?;
                    fx.wake_scheduler = true;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The lease sweep: declares the peers whose lease ended by `now` gone
    /// and restores their processes elsewhere, retries migrations that were
    /// waiting, and deletes acknowledged commands from SQLite.
    pub(crate) fn sweep(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        now: i64,
    ) -> Result<Vec<PeerId>, Error> {
        let tx = self.conn.transaction()?;
        let expired = expire_overdue(&tx, &mut self.place, inner, fx, now)?;
        if self.place.rebalance_pending {
            self.place.rebalance_pending = epoch::rebalance(&tx, &mut self.place, inner, fx, now)?;
            epoch::settle_drains(&tx, inner, fx, now)?;
        }
        let acked: Vec<(PeerId, u64)> = inner
            .live()
            .peers
            .iter()
            .filter(|(_, p)| p.acked > p.pruned)
            .map(|(&id, p)| (id, p.acked))
            .collect();
        for &(peer, upto) in &acked {
            tx.execute(
                "DELETE FROM commands WHERE peer_id = ?1 AND seq <= ?2",
                params![peer, u64_to_sql(upto)],
            )?;
        }
        tx.commit()?;
        let mut live = inner.live();
        for (peer, upto) in acked {
            if let Some(p) = live.peers.get_mut(&peer) {
                p.pruned = p.pruned.max(upto);
            }
        }
        for id in &expired {
            if let Some(p) = live.peers.remove(id) {
                p.notify.notify_waiters();
            }
        }
        Ok(expired)
    }

    /// `POST /api/v1/peer/drain`: the peer takes no new processes and its
    /// processes migrate away at once; it leaves each job once it hosts
    /// nothing there.
    pub(crate) fn drain(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        peer: PeerId,
    ) -> Result<(), Error> {
        let now = now_ms();
        let tx = self.conn.transaction()?;
        let draining: Option<bool> = tx
            .query_row(
                "SELECT draining FROM peers WHERE id = ?1 AND state = 'online'",
                [peer],
                |r| r.get(0),
            )
            .optional()?;
        if draining == Some(false) {
            drain_in(&tx, &mut self.place, inner, fx, peer, now)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Applies a peer's report, in order. A peer whose lease has ended is
    /// refused (401) even if its request passed the check at the door: the
    /// lease sweep may have declared it gone and restored its processes
    /// elsewhere meanwhile, and a zombie must not write output or events.
    pub(crate) fn report(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        peer: PeerId,
        events: Vec<PeerEvent>,
    ) -> Result<Vec<Suspect>, Error> {
        let now = now_ms();
        let holds_lease = inner
            .live()
            .peers
            .get(&peer)
            .is_some_and(|p| lease::is_valid(now, p.expires_at));
        if !holds_lease {
            return Err(Error::Unauthorized {
                code: "lease_expired",
                message: format!("the lease of peer {peer} has expired; log in again"),
            });
        }
        let tx = self.conn.transaction()?;
        let mut jobs: HashMap<JobId, Option<ReportJob>> = HashMap::new();
        let mut handed_over = false;
        let mut suspects = Vec::new();
        // Output bytes each owner's jobs store, once a record needed it.
        let mut owner_stored: HashMap<i64, i64> = HashMap::new();
        for event in events {
            let job = match &event {
                PeerEvent::Output { job, .. }
                | PeerEvent::ProcessExited { job, .. }
                | PeerEvent::ProcessAborted { job, .. }
                | PeerEvent::ProcessFailed { job, .. }
                | PeerEvent::ProcessRestored { job, .. }
                | PeerEvent::ProcessHandedOver { job, .. }
                | PeerEvent::Progress { job, .. }
                | PeerEvent::Status { job, .. }
                | PeerEvent::PeerUnreachable { job, .. } => *job,
            };
            let entry = match jobs.entry(job) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let info = load_report_job(&tx, job, peer)?;
                    if info.is_none() {
                        tracing::warn!(
                            peer,
                            job,
                            "ignoring a report about a job this peer is not part of"
                        );
                    }
                    e.insert(info)
                }
            };
            let Some(ctx) = entry else {
                continue;
            };
            if !ctx.active {
                tracing::debug!(peer, job, "ignoring a report about a finished job");
                continue;
            }
            // The host of `pid`, or its old host while it hands it over.
            let own = |pid: Pid| {
                ctx.placement
                    .get(pid as usize)
                    .is_some_and(|p| p.is_run_by(peer))
            };
            match event {
                PeerEvent::Output {
                    pid,
                    seq,
                    stream,
                    data,
                    ..
                } => {
                    if !own(pid) {
                        tracing::warn!(
                            peer,
                            job,
                            pid,
                            "ignoring output of a process not placed on this peer"
                        );
                        continue;
                    }
                    let Ok(seq) = i64::try_from(seq) else {
                        tracing::warn!(
                            peer,
                            job,
                            pid,
                            seq,
                            "ignoring output with an impossible sequence number"
                        );
                        continue;
                    };
                    let kind = match stream {
                        Stream::Stdout => JobEventKind::Stdout { text: data },
                        Stream::Stderr => JobEventKind::Stderr { text: data },
                        Stream::Raw => {
                            if BASE64.decode(data.as_bytes()).is_err() {
                                tracing::warn!(
                                    peer,
                                    job,
                                    pid,
                                    seq,
                                    "ignoring raw output that is not base64"
                                );
                                continue;
                            }
                            JobEventKind::Raw { data }
                        }
                    };
                    // A record stored before (a retried report) is not
                    // stored or counted again.
                    let known = tx
                        .prepare_cached(
                            "SELECT 1 FROM events WHERE job = ?1 AND pid = ?2 AND seq = ?3",
                        )?
                        .exists(params![job, pid, seq])?;
                    if known {
                        continue;
                    }
                    // The owner's storage quota (issue 20, finding 4; 0: none).
                    let bytes = db::output_bytes(&kind).map_or(0, |b| b.len() as i64);
                    let stored = match owner_stored.get(&ctx.owner) {
                        Some(&s) => s,
                        None => tx.query_row(
                            "SELECT coalesce(sum(output_bytes), 0) FROM jobs WHERE owner = ?1",
                            [ctx.owner],
                            |r| r.get(0),
                        )?,
                    };
                    let quota = match inner.config.user_storage_mib {
                        0 => i64::MAX,
                        mib => i64::try_from(mib)
                            .unwrap_or(i64::MAX)
                            .saturating_mul(1 << 20),
                    };
                    if stored.saturating_add(bytes) > quota {
                        let reason = format!(
                            "out of storage: the output of your jobs takes {:.1} MiB and the supernode stores at most {} MiB per user; dispose of finished jobs you no longer need (`bspweb dispose JOB`, or in the web UI) and run this one again",
                            stored as f64 / f64::from(1 << 20),
                            quota >> 20
                        );
                        let ending = Ending {
                            outcome: JobOutcome::Failed,
                            error: Some(reason.clone()),
                            error_pid: None,
                            event: JobEventKind::JobFailed { reason },
                            kill: Some("the job's owner is out of storage".into()),
                            skip_peer: None,
                        };
                        finish_job(&tx, &mut self.place, inner, fx, job, ending, now)?;
                        ctx.active = false;
                        continue;
                    }
                    if db::insert_event(&tx, job, Some(pid), Some(seq), &kind, now)?.is_some() {
                        fx.jobs.insert(job);
                        tx.prepare_cached(
                            "UPDATE jobs SET output_bytes = output_bytes + ?2 WHERE id = ?1",
                        )?
                        .execute(params![job, bytes])?;
                        owner_stored.insert(ctx.owner, stored + bytes);
                    } else {
                        owner_stored.insert(ctx.owner, stored);
                    }
                }
                PeerEvent::Progress { pid, superstep, .. } => {
                    // Only the process's current host speaks for it: a
                    // migrating process's old host may still report.
                    tx.prepare_cached(
                        "UPDATE placements SET superstep = ?3 \
                         WHERE job = ?1 AND pid = ?2 AND peer_id = ?4",
                    )?
                    .execute(params![job, pid, superstep, peer])?;
                }
                PeerEvent::PeerUnreachable { peer: suspect, .. } => {
                    if suspect == peer || suspects.iter().any(|s: &Suspect| s.peer == suspect) {
                        continue;
                    }
                    if !epoch::job_peers(&tx, job)?.contains(&suspect) {
                        tracing::debug!(
                            peer,
                            job,
                            suspect,
                            "ignoring a suspicion of a peer not in the job"
                        );
                        continue;
                    }
                    let addr: Option<String> = tx
                        .query_row(
                            "SELECT addr FROM peers WHERE id = ?1 AND state = 'online'",
                            [suspect],
                            |r| r.get(0),
                        )
                        .optional()?;
                    if let Some(addr) = addr {
                        suspects.push(Suspect {
                            peer: suspect,
                            addr,
                            why: SuspectWhy::LinkLost { job, by: peer },
                        });
                    }
                }
                PeerEvent::Status { pid, text, .. } => {
                    if pid.is_some_and(|p| p >= ctx.nprocs) {
                        continue;
                    }
                    let kind = JobEventKind::Status {
                        text: truncate(&text, MAX_REASON_CHARS),
                    };
                    db::insert_event(&tx, job, pid, None, &kind, now)?;
                    fx.jobs.insert(job);
                }
                PeerEvent::ProcessRestored {
                    pid,
                    superstep,
                    epoch: at,
                    ..
                } => {
                    let Some(p) = ctx.placement.get(pid as usize) else {
                        continue;
                    };
                    let (Some(moved), Some(kind)) = (p.moved_epoch, p.moved_kind) else {
                        tracing::warn!(
                            peer,
                            job,
                            pid,
                            "ignoring the restore of a process that never moved"
                        );
                        continue;
                    };
                    if p.peer != peer || at < moved || at > ctx.epoch {
                        tracing::info!(
                            peer,
                            job,
                            pid,
                            epoch = at,
                            moved,
                            "ignoring the restore report of a stale epoch or host"
                        );
                        continue;
                    }
                    let kind = match kind {
                        epoch::MoveKind::Lost => JobEventKind::ProcessRolledBack { superstep },
                        epoch::MoveKind::Migrate => JobEventKind::ProcessMigrated {
                            from: p.moved_from.unwrap_or_default(),
                            to: peer,
                            superstep,
                        },
                    };
                    // One event per move, however often it is reported.
                    let seq = -2 - u64_to_sql(moved);
                    if db::insert_event(&tx, job, Some(pid), Some(seq), &kind, now)?.is_some() {
                        fx.jobs.insert(job);
                    }
                }
                PeerEvent::ProcessHandedOver { pid, epoch: at, .. } => {
                    let Some(p) = ctx.placement.get_mut(pid as usize) else {
                        continue;
                    };
                    if p.handing_over_from() != Some(peer) || p.moved_epoch.is_none_or(|m| at < m) {
                        tracing::info!(
                            peer,
                            job,
                            pid,
                            epoch = at,
                            "ignoring a handover report of a stale epoch or host"
                        );
                        continue;
                    }
                    tx.execute(
                        "UPDATE placements SET handed_over = 1 WHERE job = ?1 AND pid = ?2",
                        params![job, pid],
                    )?;
                    p.handed_over = true;
                    handed_over = true;
                    fx.jobs.insert(job);
                }
                PeerEvent::ProcessExited { pid, superstep, .. } => {
                    if !own(pid) {
                        tracing::warn!(
                            peer,
                            job,
                            pid,
                            "ignoring the exit of a process not placed on this peer"
                        );
                        continue;
                    }
                    tx.prepare_cached(
                        "UPDATE placements SET superstep = ?3 WHERE job = ?1 AND pid = ?2",
                    )?
                    .execute(params![job, pid, superstep])?;
                    let kind = JobEventKind::ProcessExited { superstep };
                    // seq -1: a process exits once, however often it is
                    // reported (a restored process re-executes and exits again).
                    if db::insert_event(&tx, job, Some(pid), Some(-1), &kind, now)?.is_none() {
                        continue;
                    }
                    fx.jobs.insert(job);
                    let exited: u32 = tx.query_row(
                        "UPDATE jobs SET exited = exited + 1 WHERE id = ?1 RETURNING exited",
                        [job],
                        |r| r.get(0),
                    )?;
                    if exited >= ctx.nprocs {
                        let ending = Ending {
                            outcome: JobOutcome::Exited,
                            error: None,
                            error_pid: None,
                            event: JobEventKind::JobExited,
                            // Peers keep checkpoint replicas until the job ends.
                            kill: Some("the job finished".into()),
                            skip_peer: None,
                        };
                        finish_job(&tx, &mut self.place, inner, fx, job, ending, now)?;
                        ctx.active = false;
                    }
                }
                PeerEvent::ProcessAborted {
                    pid,
                    superstep,
                    reason,
                    ..
                } => {
                    if !own(pid) {
                        tracing::warn!(
                            peer,
                            job,
                            pid,
                            "ignoring the abort of a process not placed on this peer"
                        );
                        continue;
                    }
                    let reason = format!(
                        "process {pid} aborted in superstep {superstep}: {}",
                        truncate(&reason, MAX_REASON_CHARS)
                    );
                    let ending = Ending {
                        outcome: JobOutcome::Aborted,
                        error: Some(reason.clone()),
                        error_pid: Some(pid),
                        event: JobEventKind::JobAborted { reason },
                        kill: Some("another process of the job aborted".into()),
                        skip_peer: None,
                    };
                    finish_job(&tx, &mut self.place, inner, fx, job, ending, now)?;
                    ctx.active = false;
                }
                PeerEvent::ProcessFailed {
                    pid,
                    superstep,
                    reason,
                    ..
                } => {
                    if pid.is_some_and(|p| !own(p)) {
                        tracing::warn!(
                            peer,
                            job,
                            ?pid,
                            "ignoring the failure of a process not placed on this peer"
                        );
                        continue;
                    }
                    let reason = truncate(&reason, MAX_REASON_CHARS);
                    let reason = match pid {
                        Some(pid) => {
                            format!("process {pid} failed in superstep {superstep}: {reason}")
                        }
                        None => format!(
                            "peer #{peer} failed the job in superstep {superstep}: {reason}"
                        ),
                    };
                    let ending = Ending {
                        outcome: JobOutcome::Failed,
                        error: Some(reason.clone()),
                        error_pid: pid,
                        event: JobEventKind::JobFailed { reason },
                        kill: Some("another process of the job failed".into()),
                        skip_peer: None,
                    };
                    finish_job(&tx, &mut self.place, inner, fx, job, ending, now)?;
                    ctx.active = false;
                }
            }
        }
        if handed_over {
            // A draining peer that handed over its last process leaves the job;
            // processes that waited for their handover may move now.
            epoch::settle_drains(&tx, inner, fx, now)?;
            self.place.rebalance_pending = true;
        }
        tx.commit()?;
        Ok(suspects)
    }

    /// Declares `suspect.peer` gone now, because its data-plane address
    /// refused a connection (see [`SuspectWhy`] for why it was dialed), and
    /// restores its processes like an expired lease would. Does
    /// nothing if the peer is no longer online or holds a different lease
    /// than when it was suspected (it logged in again meanwhile).
    pub(crate) fn declare_unreachable(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        suspect: &Suspect,
        lease_id: &str,
        now: i64,
    ) -> Result<bool, Error> {
        let same_lease = inner
            .live()
            .peers
            .get(&suspect.peer)
            .is_some_and(|p| p.lease_id == lease_id);
        if !same_lease {
            return Ok(false);
        }
        let tx = self.conn.transaction()?;
        let online: bool = tx
            .query_row(
                "SELECT state = 'online' FROM peers WHERE id = ?1",
                [suspect.peer],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(false);
        if !online {
            return Ok(false);
        }
        let name = mark_gone(&tx, &mut self.place, suspect.peer)?;
        tracing::warn!(
            peer = suspect.peer,
            name = %name,
            addr = %suspect.addr,
            "peer #{} is gone: {} and its data port refuses connections",
            suspect.peer,
            suspect.why
        );
        let lost = BTreeMap::from([(suspect.peer, name)]);
        epoch::restore_lost(
            &tx,
            &mut self.place,
            inner,
            fx,
            &lost,
            LossCause::Unreachable,
            now,
        )?;
        fx.wake_scheduler = true;
        tx.commit()?;
        if let Some(p) = inner.live().peers.remove(&suspect.peer) {
            p.notify.notify_waiters();
        }
        Ok(true)
    }

    /// The bytes of module `hash`, if `peer` runs (or ran) a job of it.
    pub(crate) fn module_for_peer(&self, peer: PeerId, hash: &str) -> Result<Vec<u8>, Error> {
        let hash = hash.to_ascii_lowercase();
        let bytes: Option<Vec<u8>> = if is_hash(&hash) {
            self.conn
                .query_row(
                    "SELECT p.bytes FROM programs p WHERE p.hash = ?1 AND EXISTS ( \
                         SELECT 1 FROM jobs j JOIN job_peers jp ON jp.job = j.id \
                         WHERE j.program_hash = ?1 AND jp.peer_id = ?2)",
                    params![hash, peer],
                    |r| r.get(0),
                )
                .optional()?
        } else {
            None
        };
        bytes.ok_or_else(|| {
            Error::NotFound(format!(
                "no module `{}` for peer {peer}: peers fetch only the modules of jobs placed on them",
                truncate(&hash, 80)
            ))
        })
    }

    /// The resources of `job` in [`bsp_api::control::encode_resources`]
    /// form, for a peer the job runs on.
    pub(crate) fn resources_for_peer(&self, peer: PeerId, job: JobId) -> Result<Vec<u8>, Error> {
        let member: bool = self.conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM job_peers WHERE job = ?1 AND peer_id = ?2)",
            params![job, peer],
            |r| r.get(0),
        )?;
        if !member {
            return Err(Error::NotFound(format!(
                "no job {job} for peer {peer}: peers fetch only the resources of jobs placed on them"
            )));
        }
        let mut stmt = self
            .conn
            .prepare_cached("SELECT name, data FROM job_resources WHERE job = ?1 ORDER BY name")?;
        let resources: Vec<(String, Vec<u8>)> = stmt
            .query_map([job], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(bsp_api::control::encode_resources(&resources))
    }

    /// Every peer the supernode knows, online (and draining) first. A
    /// peer's `processes` counts those placed on it and those it still hands
    /// over to their new host.
    pub(crate) fn peers(&self) -> Result<Vec<PeerInfo>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT id, name, addr, speed, idle, cores, \
                 CASE WHEN state = 'online' AND draining = 1 THEN 'draining' ELSE state END, \
                 lease_expires_at, \
                 (SELECT count(*) FROM placements pl JOIN jobs j ON j.id = pl.job \
                  WHERE j.state = 'active' AND (pl.peer_id = peers.id OR (pl.moved_from = peers.id \
                      AND pl.moved_kind = 'migrate' AND pl.handed_over = 0))), \
                 cluster, rss_bytes, held_bytes, budget_bytes \
             FROM peers ORDER BY state != 'online', id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(PeerInfo {
                id: r.get(0)?,
                name: r.get(1)?,
                addr: r.get(2)?,
                speed: r.get(3)?,
                idle: r.get(4)?,
                cores: r.get(5)?,
                state: r.get(6)?,
                lease_expires_at: r.get(7)?,
                processes: r.get(8)?,
                cluster: r.get(9)?,
                memory: bsp_api::control::PeerMemory {
                    rss_bytes: r.get::<_, i64>(10)?.max(0) as u64,
                    held_bytes: r.get::<_, i64>(11)?.max(0) as u64,
                    budget_bytes: r.get::<_, i64>(12)?.max(0) as u64,
                },
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

fn no_job(id: JobId) -> Error {
    Error::NotFound(format!("no job {id} among your jobs"))
}

/// Puts peer `id` at golden index `k` with weight `power` into the DHHT
/// (replacing a stale entry).
/// Puts peer `id` at golden index `k` with `power` into the DHHT, or keeps
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

fn load_report_job(tx: &Connection, job: JobId, peer: PeerId) -> Result<Option<ReportJob>, Error> {
    let row: Option<(String, u32, i64, i64)> = tx
        .query_row(
            "SELECT state, nprocs, epoch, owner FROM jobs WHERE id = ?1",
            [job],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let Some((state, nprocs, epoch, owner)) = row else {
        return Ok(None);
    };
    let placement = epoch::placements(tx, job)?;
    let member =
        epoch::job_peers(tx, job)?.contains(&peer) || placement.iter().any(|p| p.is_run_by(peer));
    if !member {
        return Ok(None);
    }
    Ok(Some(ReportJob {
        active: state == "active",
        owner,
        nprocs,
        epoch: u64_from_sql(epoch),
        placement,
    }))
}

/// What a peer may still take under its memory budget, and the budget.
#[derive(Debug, Clone, Copy)]
struct Room {
    free: u64,
    budget: u64,
}

/// What became of a job the scheduler tried to place.
enum Placing {
    Placed,
    /// No usable peer: neither this job nor a later one can be placed now.
    NoPeer,
    /// A peer lacks the memory for its share: the job waits (or failed,
    /// when it would not fit even on an idle peer); later ones may fit.
    NoMemory,
}

/// What one process of a job takes on a peer, estimated from its program's
/// initial memory: once in the instance, once in its own checkpoint, once
/// in each of `replicas` copies other peers keep (and it keeps theirs),
/// plus the instance, stack and buffers.
pub(crate) fn process_footprint(initial_pages: u64, replicas: u32) -> u64 {
    const OVERHEAD: u64 = 1 << 20;
    initial_pages
        .saturating_mul(64 << 10)
        .saturating_mul(2 + u64::from(replicas))
        .saturating_add(OVERHEAD)
}

const MIB: u64 = 1 << 20;

/// Memory admission at submission (issue 20, finding 1): the estimated
/// footprint of one process of a job of program `hash`, refusing a job
/// that could not fit in the budgets of all online peers together (when
/// every one of them has a budget).
fn admit_memory(tx: &Connection, hash: &str, nprocs: u32, replicas: u32) -> Result<u64, Error> {
    let known: Option<i64> = tx.query_row(
        "SELECT initial_pages FROM programs WHERE hash = ?1",
        [hash],
        |r| r.get(0),
    )?;
    let pages = match known {
        Some(p) => u64::try_from(p).unwrap_or(0),
        None => {
            // Read once per program; the validator's summary knows it.
            let bytes: Vec<u8> =
                tx.query_row("SELECT bytes FROM programs WHERE hash = ?1", [hash], |r| {
                    r.get(0)
                })?;
            let pages = bspweb_abi::validate(&bytes).map_or(0, |s| s.initial_pages);
            tx.execute(
                "UPDATE programs SET initial_pages = ?2 WHERE hash = ?1",
                params![hash, u64_to_sql(pages)],
            )?;
            pages
        }
    };
    let per_process = process_footprint(pages, replicas);
    let (budgets, unlimited, peers): (i64, i64, i64) = tx.query_row(
        "SELECT coalesce(sum(budget_bytes), 0), coalesce(sum(budget_bytes = 0), 0), count(*) \
         FROM peers WHERE state = 'online' AND draining = 0",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let need = per_process.saturating_mul(u64::from(nprocs));
    let budgets = u64::try_from(budgets).unwrap_or(0);
    if peers > 0 && unlimited == 0 && need > budgets {
        return Err(Error::NotEnoughMemory(format!(
            "the job needs about {} MiB ({nprocs} processes of about {:.1} MiB each, with their checkpoints and {replicas} replicas), but the {peers} online peers may use {} MiB together; run fewer processes, or wait for more peers",
            need.div_ceil(MIB),
            per_process as f64 / MIB as f64,
            budgets / MIB
        )));
    }
    Ok(per_process)
}

/// Places one job: a golden index per process, its peer by DHHT lookup,
/// placements stored, the job active, `StartJob` queued for each of its
/// peers. Returns false if no peer could take it.
#[allow(clippy::too_many_arguments)]
fn place_job(
    tx: &Transaction<'_>,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    online: &HashMap<PeerId, (String, u32)>,
    room: &mut HashMap<PeerId, Room>,
    job: JobId,
    nprocs: u32,
    now: i64,
) -> Result<Placing, Error> {
    let mut indices = Vec::with_capacity(nprocs as usize);
    let mut owners = Vec::with_capacity(nprocs as usize);
    for _ in 0..nprocs {
        let k = place.process_indices.alloc();
        indices.push(k);
        match place
            .dhht
            .lookup(golden_position(k))
            .filter(|p| online.contains_key(p))
        {
            Some(peer) => owners.push(peer),
            None => {
                for k in indices {
                    place.process_indices.free(k);
                }
                tracing::warn!(job, "the placement table has no usable peer; the job waits");
                return Ok(Placing::NoPeer);
            }
        }
    }
    // Every peer must have the memory for its share (issue 20, finding 1).
    let proc_bytes: i64 =
        tx.query_row("SELECT proc_bytes FROM jobs WHERE id = ?1", [job], |r| {
            r.get(0)
        })?;
    let proc_bytes = u64::try_from(proc_bytes).unwrap_or(0);
    let mut shares: BTreeMap<PeerId, u64> = BTreeMap::new();
    for &peer in &owners {
        *shares.entry(peer).or_default() += 1;
    }
    let short = shares.iter().find_map(|(&peer, &n)| {
        let need = n.saturating_mul(proc_bytes);
        room.get(&peer)
            .filter(|r| need > r.free)
            .map(|r| (peer, n, need, *r))
    });
    if let Some((peer, n, need, r)) = short {
        for k in indices {
            place.process_indices.free(k);
        }
        let name = online.get(&peer).map_or("", |(addr, _)| addr.as_str());
        let share = format!(
            "peer #{peer} ({name}) would take {n} process{} of about {} MiB in all",
            if n == 1 { "" } else { "es" },
            need.div_ceil(MIB),
        );
        if need > r.budget {
            // It would not fit on that peer even with nothing else running.
            place.memory_waits.remove(&job);
            let reason = format!(
                "not enough memory: {share}, and may use only {} MiB for bspweb; run fewer processes, or wait for more peers and submit it again",
                r.budget / MIB
            );
            let ending = Ending {
                outcome: JobOutcome::Failed,
                error: Some(reason.clone()),
                error_pid: None,
                event: JobEventKind::JobFailed { reason },
                kill: None,
                skip_peer: None,
            };
            finish_job(tx, place, inner, fx, job, ending, now)?;
            return Ok(Placing::NoMemory);
        }
        if place.memory_waits.insert(job) {
            let text = format!(
                "waiting for memory: {share}, and has {} MiB left of the memory its volunteer allows",
                r.free / MIB
            );
            tracing::info!(job, "{text}");
            db::insert_event(tx, job, None, None, &JobEventKind::Status { text }, now)?;
            fx.jobs.insert(job);
        }
        return Ok(Placing::NoMemory);
    }
    for (peer, n) in &shares {
        if let Some(r) = room.get_mut(peer) {
            r.free = r.free.saturating_sub(n.saturating_mul(proc_bytes));
        }
    }
    place.memory_waits.remove(&job);
    // The job's peers in order of their first pid, then replica-only peers.
    let mut peers: Vec<PeerId> = Vec::new();
    for &peer in &owners {
        if !peers.contains(&peer) {
            peers.push(peer);
        }
    }
    let hosts = peers.len();
    let replicas: u32 = tx.query_row("SELECT replicas FROM jobs WHERE id = ?1", [job], |r| {
        r.get(0)
    })?;
    let candidates = online.keys().copied().collect();
    epoch::top_up_replicas(job, &mut peers, replicas, &candidates);
    epoch::set_job_peers(tx, job, &peers)?;
    {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO placements (job, pid, peer_id, position) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (pid, (&peer, &k)) in owners.iter().zip(&indices).enumerate() {
            stmt.execute(params![job, pid as i64, peer, u64_to_sql(k)])?;
        }
    }
    let job_token = hex::encode(rand::random::<[u8; 32]>());
    tx.execute(
        "UPDATE jobs SET state = 'active', started_at = ?2, job_token = ?3, epoch = 0 WHERE id = ?1",
        params![job, now, job_token],
    )?;
    list_changed(tx, fx, job)?;
    let mut text = format!(
        "placed {nprocs} process{} on {hosts} peer{}",
        if nprocs == 1 { "" } else { "es" },
        if hosts == 1 { "" } else { "s" }
    );
    if peers.len() > hosts {
        let extra = peers.len() - hosts;
        text.push_str(&format!(
            " and {extra} more peer{} for checkpoints",
            if extra == 1 { "" } else { "s" }
        ));
    }
    db::insert_event(tx, job, None, None, &JobEventKind::Status { text }, now)?;
    if replicas > 0 && peers.len() == 1 {
        let text =
            "there is no other peer to keep checkpoints on: if this peer is lost, the job is lost"
                .to_string();
        db::insert_event(tx, job, None, None, &JobEventKind::Status { text }, now)?;
    }
    epoch::send_assignment(tx, inner, fx, job, Vec::new(), Vec::new(), now)?;
    let per_peer: BTreeMap<PeerId, usize> = owners.iter().fold(BTreeMap::new(), |mut m, p| {
        *m.entry(*p).or_default() += 1;
        m
    });
    tracing::info!(job, nprocs, peers = ?per_peer, "job placed");
    fx.jobs.insert(job);
    Ok(Placing::Placed)
}

/// Marks the online peers whose lease ended by `now` as gone: frees their
/// golden index, removes them from the DHHT, drops their queued commands,
/// and restores their processes on the remaining peers of each job
/// ([`epoch::restore_lost`]). Returns their ids; the caller removes them
/// from [`Live`] after the commit.
fn expire_overdue(
    tx: &Transaction<'_>,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    now: i64,
) -> Result<Vec<PeerId>, Error> {
    let mut table: Vec<lease::PeerLease> = {
        let mut stmt =
            tx.prepare_cached("SELECT id, lease_expires_at FROM peers WHERE state = 'online'")?;
        stmt.query_map([], |r| {
            Ok(lease::PeerLease {
                id: r.get(0)?,
                online: true,
                expires_at: r.get(1)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?
    };
    // A renewal whose write failed (the disk took none) extended the lease
    // in memory only: the later expiry counts.
    {
        let live = inner.live();
        for l in &mut table {
            if let Some(p) = live.peers.get(&l.id) {
                l.expires_at = l.expires_at.max(p.expires_at);
            }
        }
    }
    let expired = lease::expired(now, table);
    let mut lost = BTreeMap::new();
    for &peer in &expired {
        let name = mark_gone(tx, place, peer)?;
        tracing::warn!(peer, name = %name, "peer stopped renewing its lease; it is gone");
        lost.insert(peer, name);
    }
    if !lost.is_empty() {
        epoch::restore_lost(tx, place, inner, fx, &lost, LossCause::LeaseExpired, now)?;
        fx.wake_scheduler = true;
    }
    Ok(expired)
}

/// Marks `peer` gone: frees its golden index, removes it from the DHHT and
/// drops its queued commands. Returns its name.
fn mark_gone(tx: &Connection, place: &mut Place, peer: PeerId) -> Result<String, Error> {
    let (name, golden): (String, Option<i64>) = tx.query_row(
        "SELECT name, golden FROM peers WHERE id = ?1",
        [peer],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    tx.execute(
        "UPDATE peers SET state = 'gone', golden = NULL, draining = 0, power = NULL WHERE id = ?1",
        [peer],
    )?;
    tx.execute("DELETE FROM commands WHERE peer_id = ?1", [peer])?;
    if let Some(k) = golden {
        place.peer_indices.free(u64_from_sql(k));
    }
    place.dhht.remove(peer);
    Ok(name)
}

/// Marks `peer` draining: out of the DHHT (power 0 for placement), its
/// processes migrate away at once, and it leaves the jobs where it hosts
/// nothing.
fn drain_in(
    tx: &Connection,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    peer: PeerId,
    now: i64,
) -> Result<(), Error> {
    tx.execute("UPDATE peers SET draining = 1 WHERE id = ?1", [peer])?;
    place.dhht.remove(peer);
    tracing::info!(peer, "peer is draining: moving its processes away");
    place.rebalance_pending = epoch::rebalance(tx, place, inner, fx, now)?;
    epoch::settle_drains(tx, inner, fx, now)?;
    fx.wake_scheduler = true;
    Ok(())
}

// ---------------------------------------------------------------- tasks

/// Runs the scheduler whenever it is woken (and every few seconds as a
/// safety net).
pub(crate) async fn scheduler_task(sn: Supernode) {
    loop {
        match sn
            .with_core(|core, inner, fx| core.schedule(inner, fx))
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
        });
        assert_eq!(
            l,
            JobLimits {
                superstep_ms: 100,
                memory_mib: 1,
                output_mib: 1,
                checkpoint_every: 1,
                replicas: 0,
            }
        );
        let l = clamp_limits(JobLimits {
            superstep_ms: u64::MAX,
            memory_mib: u32::MAX,
            output_mib: u32::MAX,
            checkpoint_every: u32::MAX,
            replicas: u32::MAX,
        });
        assert_eq!(
            l,
            JobLimits {
                superstep_ms: 86_400_000,
                memory_mib: 4096,
                output_mib: 1024,
                checkpoint_every: 1_000_000,
                replicas: MAX_REPLICAS,
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
    }
}
