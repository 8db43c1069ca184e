//! Epochs of a job's assignment (`docs/fault-tolerance.md`): restoring the
//! processes of lost peers, migrating processes whose DHHT host changed,
//! draining peers, and keeping checkpoint replicas.
//!
//! Every change of a job's peers or placement is a new *epoch*: the job's
//! `epoch` goes up by one, the placements record where each moved process
//! came from and why, and every live peer of the job gets the new
//! [`JobAssignment`] with `restore` (and `migrate`) naming the moved pids.
//! All of it happens in the caller's transaction.

use std::collections::{BTreeMap, BTreeSet};

use bsp_api::control::{Command, JobAssignment, JobPeer};
use bsp_api::rest::{JobEventKind, JobLimits};
use bsp_api::{JobId, PeerId, Pid};

use crate::jobs::two_level_target;
use crate::sql::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

use crate::db::{self, u64_from_sql, u64_to_sql};
pub(crate) use crate::jobs::job_peers;
use crate::jobs::{Ending, Place, finish_job, queue};
use crate::twins::{self, Copies, Volunteers};
use crate::{Effects, Error, Inner};

pub(crate) use placement::epochs::{Change, MoveKind, Placed};
use placement::epochs::{peer_of_slot, row_index, runners};

/// The processes of `job` in slot order (copy 0 of every pid first).
pub(crate) fn placements(tx: &Connection, job: JobId) -> Result<Vec<Placed>, Error> {
    let mut stmt = tx.prepare_cached(
        "SELECT pid, peer_id, position, moved_epoch, moved_from, moved_kind, handed_over \
         FROM placements WHERE job = ?1 ORDER BY pid",
    )?;
    let rows = stmt.query_map([job], |r| {
        Ok(Placed {
            pid: r.get(0)?,
            peer: r.get(1)?,
            position: u64_from_sql(r.get(2)?),
            moved_epoch: r.get::<_, Option<i64>>(3)?.map(u64_from_sql),
            moved_from: r.get(4)?,
            moved_kind: r
                .get::<_, Option<String>>(5)?
                .as_deref()
                .and_then(MoveKind::parse),
            handed_over: r.get(6)?,
        })
    })?;
    Ok(rows.collect::<crate::sql::Result<_>>()?)
}

/// The peers that run the other copies of `slot`'s pid, by `running`
/// ([`runners`], perhaps updated with moves planned since).
fn twin_hosts(copies: Copies, rows: &[Placed], running: &[Vec<PeerId>], slot: Pid) -> Vec<PeerId> {
    copies
        .siblings(slot)
        .filter_map(|s| row_index(rows, s))
        .flat_map(|i| running[i].iter().copied())
        .collect()
}

/// The peers of `set` that take work, with their DHHT power, for
/// [`twins::pick`].
fn candidates(place: &Place, set: &BTreeSet<PeerId>) -> Vec<(PeerId, f64)> {
    place
        .dhht
        .peers()
        .filter(|p| set.contains(&p.id) && p.weight > 0.0)
        .map(|p| (p.id, p.weight))
        .collect()
}

/// Records `peers` as the peer list of `job` (and, for good, among the
/// peers it ever had: a disagreement may name one that left since).
pub(crate) fn set_job_peers(tx: &Connection, job: JobId, peers: &[PeerId]) -> Result<(), Error> {
    tx.execute("DELETE FROM job_peers WHERE job = ?1", [job])?;
    let mut stmt =
        tx.prepare_cached("INSERT INTO job_peers (job, peer_id, ord) VALUES (?1, ?2, ?3)")?;
    let mut ever = tx.prepare_cached(
        "INSERT INTO job_peer_history (job, peer_id) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
    )?;
    for (ord, peer) in peers.iter().enumerate() {
        stmt.execute(params![job, peer, ord as i64])?;
        ever.execute(params![job, peer])?;
    }
    Ok(())
}

/// Peers that may take work at `now`: online, lease valid, not draining.
pub(crate) fn usable_peers(tx: &Connection, now: i64) -> Result<BTreeSet<PeerId>, Error> {
    let mut stmt = tx.prepare_cached(
        "SELECT id FROM peers WHERE state = 'online' AND lease_expires_at >= ?1 AND draining = 0",
    )?;
    let rows = stmt.query_map([now], |r| r.get::<_, PeerId>(0))?;
    Ok(rows.collect::<crate::sql::Result<_>>()?)
}

/// Peers with a valid lease at `now`, draining or not.
fn live_peers(tx: &Connection, now: i64) -> Result<BTreeSet<PeerId>, Error> {
    let mut stmt = tx
        .prepare_cached("SELECT id FROM peers WHERE state = 'online' AND lease_expires_at >= ?1")?;
    let rows = stmt.query_map([now], |r| r.get::<_, PeerId>(0))?;
    Ok(rows.collect::<crate::sql::Result<_>>()?)
}

/// Online peers that take no processes now (no power: their volunteers
/// use the machines), draining or not.
fn busy_peers(tx: &Connection) -> Result<BTreeSet<PeerId>, Error> {
    let mut stmt = tx.prepare_cached(concat!(
        "SELECT id FROM peers WHERE state = 'online' AND ",
        crate::state::power_sql!(),
        " <= 0.0"
    ))?;
    let rows = stmt.query_map([crate::state::MIN_AVAILABILITY], |r| r.get::<_, PeerId>(0))?;
    Ok(rows.collect::<crate::sql::Result<_>>()?)
}

/// Online peers that are draining.
fn draining_peers(tx: &Connection) -> Result<BTreeSet<PeerId>, Error> {
    let mut stmt =
        tx.prepare_cached("SELECT id FROM peers WHERE state = 'online' AND draining = 1")?;
    let rows = stmt.query_map([], |r| r.get::<_, PeerId>(0))?;
    Ok(rows.collect::<crate::sql::Result<_>>()?)
}

/// The order in which peers are asked to be replica-only peers of `job`:
/// rendezvous hashing of `(job, peer)`, so jobs spread over the network.
fn replica_rank(job: JobId, peer: PeerId) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"bspweb replica-only peer\0");
    h.update(job.to_le_bytes());
    h.update(peer.to_le_bytes());
    h.finalize().into()
}

/// Adds replica-only peers from `candidates` to `peers` until the job has
/// `replicas + 1` peers, if there are enough candidates.
pub(crate) fn top_up_replicas(
    job: JobId,
    peers: &mut Vec<PeerId>,
    replicas: u32,
    candidates: &BTreeSet<PeerId>,
) {
    let mut ranked: Vec<PeerId> = candidates.iter().copied().collect();
    ranked.sort_by_key(|&p| replica_rank(job, p));
    placement::epochs::top_up(peers, replicas, ranked);
}

/// The assignment of `job` as recorded, with `restore` and `migrate`.
pub(crate) fn assignment(
    tx: &Connection,
    job: JobId,
    restore: Vec<Pid>,
    migrate: Vec<Pid>,
) -> Result<JobAssignment, Error> {
    #[allow(clippy::type_complexity)]
    let (
        program_hash,
        nprocs,
        args,
        seed,
        superstep_ms,
        memory_mib,
        output_mib,
        every,
        replicas,
        token,
        epoch,
        redundancy,
    ): (
        String,
        u32,
        String,
        i64,
        i64,
        u32,
        u32,
        u32,
        u32,
        Option<String>,
        i64,
        u32,
    ) = tx.query_row(
        "SELECT program_hash, nprocs, args, seed, superstep_ms, memory_mib, output_mib, \
             checkpoint_every, replicas, job_token, epoch, redundancy FROM jobs WHERE id = ?1",
        [job],
        |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
                r.get(9)?,
                r.get(10)?,
                r.get(11)?,
            ))
        },
    )?;
    let peers: Vec<JobPeer> = {
        let mut stmt = tx.prepare_cached(
            "SELECT p.id, p.addr, p.cluster FROM job_peers jp JOIN peers p ON p.id = jp.peer_id \
             WHERE jp.job = ?1 ORDER BY jp.ord",
        )?;
        stmt.query_map([job], |r| {
            Ok(JobPeer {
                id: r.get(0)?,
                addr: r.get(1)?,
                cluster: r.get(2)?,
            })
        })?
        .collect::<crate::sql::Result<_>>()?
    };
    // One entry per slot, `placement[c * nprocs + pid]` for copy `c`.
    let copies = Copies {
        nprocs,
        redundancy: redundancy.max(1),
    };
    let ids: Vec<PeerId> = peers.iter().map(|p| p.id).collect();
    let placement =
        placement::epochs::placement_indices(&placements(tx, job)?, &ids, copies.slots())
            .map_err(|e| Error::Internal(format!("job {job}: {e}")))?;
    // Resources travel apart from the assignment (they can be large): the
    // peers fetch them, or get them with the program by Robber.
    let resources: Vec<(String, Vec<u8>)> = {
        let mut stmt =
            tx.prepare_cached("SELECT name, data FROM job_resources WHERE job = ?1 ORDER BY name")?;
        stmt.query_map([job], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
        })?
        .collect::<crate::sql::Result<_>>()?
    };
    let (resources_hash, resources_bytes) = if resources.is_empty() {
        (String::new(), 0)
    } else {
        let encoded = bsp_api::control::encode_resources(&resources);
        (hex::encode(Sha256::digest(&encoded)), encoded.len() as u64)
    };
    let program_hash_for_size = program_hash.clone();
    Ok(JobAssignment {
        job,
        program_hash,
        nprocs,
        args,
        seed: u64_from_sql(seed),
        limits: JobLimits {
            superstep_ms: u64_from_sql(superstep_ms),
            memory_mib,
            output_mib,
            checkpoint_every: every,
            replicas,
            redundancy: copies.redundancy,
        },
        job_token: token.unwrap_or_default(),
        placement,
        peers,
        resources: Vec::new(),
        epoch: u64_from_sql(epoch),
        restore,
        migrate,
        program_bytes: tx
            .query_row(
                "SELECT size FROM programs WHERE hash = ?1",
                [&program_hash_for_size],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            .map_or(0, u64_from_sql),
        resources_hash,
        resources_bytes,
    })
}

/// Sends the recorded assignment of `job` to each of its live peers.
pub(crate) fn send_assignment(
    tx: &Connection,
    inner: &Inner,
    fx: &mut Effects,
    job: JobId,
    restore: Vec<Pid>,
    migrate: Vec<Pid>,
    now: i64,
) -> Result<JobAssignment, Error> {
    let mut a = assignment(tx, job, restore, migrate)?;
    // Sites for broadcast schedules and Robber: the volunteers' clusters,
    // else the ones found on the measured links (issue 15). Every peer of
    // the epoch gets the same ones.
    let found = inner.found_clusters();
    for p in &mut a.peers {
        p.cluster = crate::clusters::effective(p.id, p.cluster.take(), &found);
    }
    let live = live_peers(tx, now)?;
    for peer in &a.peers {
        if live.contains(&peer.id) {
            queue(tx, inner, fx, peer.id, Command::StartJob(a.clone()), now)?;
        }
    }
    Ok(a)
}

/// Starts the next epoch of `job`: applies `change`, lets draining peers
/// that host nothing leave, adds replica-only peers up to `replicas + 1`,
/// and sends the new assignment to every live peer of the job. Returns the
/// new epoch.
pub(crate) fn new_epoch(
    tx: &Connection,
    inner: &Inner,
    fx: &mut Effects,
    job: JobId,
    change: Change,
    now: i64,
) -> Result<u64, Error> {
    let (epoch, replicas, nprocs): (i64, u32, u32) = tx.query_row(
        "UPDATE jobs SET epoch = epoch + 1 WHERE id = ?1 RETURNING epoch, replicas, nprocs",
        [job],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let epoch = u64_from_sql(epoch);
    let mut rows = placements(tx, job)?;
    placement::epochs::apply(&mut rows, &change, epoch);
    {
        let mut stmt = tx.prepare_cached(
            "UPDATE placements SET peer_id = ?3, moved_from = ?4, moved_epoch = ?5, \
                 moved_kind = ?6, handed_over = ?7 WHERE job = ?1 AND pid = ?2",
        )?;
        let changed = change
            .moves
            .iter()
            .map(|&(slot, _)| slot)
            .chain(change.restore_in_place.iter().copied());
        for slot in changed {
            let Some(r) = row_index(&rows, slot).map(|i| &rows[i]) else {
                continue;
            };
            stmt.execute(params![
                job,
                r.pid,
                r.peer,
                r.moved_from,
                r.moved_epoch.map(u64_to_sql),
                r.moved_kind.map(MoveKind::as_str),
                r.handed_over
            ])?;
        }
    }
    let draining = draining_peers(tx)?;
    let mut ranked: Vec<PeerId> = usable_peers(tx, now)?.into_iter().collect();
    ranked.sort_by_key(|&p| replica_rank(job, p));
    let placement::epochs::Peers { peers, drained } = placement::epochs::next_peers(
        &job_peers(tx, job)?,
        &rows,
        &change,
        &draining,
        &ranked,
        replicas,
    );
    set_job_peers(tx, job, &peers)?;
    let (restore, migrate) = placement::epochs::restore_and_migrate(&change, nprocs);
    send_assignment(tx, inner, fx, job, restore, migrate, now)?;
    let live = live_peers(tx, now)?;
    for &p in change.leave.iter().chain(&drained) {
        if live.contains(&p) {
            queue(
                tx,
                inner,
                fx,
                p,
                Command::KillJob {
                    job,
                    reason: format!(
                        "this peer left job {job} in epoch {epoch}; its processes run elsewhere"
                    ),
                },
                now,
            )?;
        }
    }
    if !drained.is_empty() {
        let text = format!(
            "{} left the job after draining (epoch {epoch})",
            peer_list(&drained)
        );
        db::insert_event(tx, job, None, None, &JobEventKind::Status { text }, now)?;
    }
    tracing::info!(job, epoch, moves = ?change.moves, migrate = change.migrate,
        restore_in_place = ?change.restore_in_place, leave = ?change.leave, ?drained, peers = ?peers,
        "new epoch of a job's assignment");
    fx.jobs.insert(job);
    Ok(epoch)
}

/// "peer #3" or "peers #2, #5".
pub(crate) fn peer_list(peers: &[PeerId]) -> String {
    let ids: Vec<String> = peers.iter().map(|p| format!("#{p}")).collect();
    match ids.len() {
        1 => format!("peer {}", ids[0]),
        _ => format!("peers {}", ids.join(", ")),
    }
}

/// The distinct values of `peers` in order of first appearance.
fn distinct(peers: impl IntoIterator<Item = PeerId>) -> Vec<PeerId> {
    let mut out = Vec::new();
    for p in peers {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

mod rebalance;
mod restore;
mod third_run;

pub(crate) use rebalance::{rebalance, settle_drains};
pub(crate) use restore::{LossCause, restore_lost};
pub(crate) use third_run::{ThirdRun, third_run};

#[cfg(test)]
mod tests;
