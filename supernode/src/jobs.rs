//! Job operations shared by the supernode's request handlers (`state`) and
//! its epoch logic (`epoch`): the placement tables, queuing a command for a
//! peer, ending a job, and how pids and a job's peers are read. It imports
//! neither, so `state` → `epoch` → `jobs` has no loop.

use crate::sql::{Connection, OptionalExtension, params};
use bsp_api::control::{Command, SeqCommand};
use bsp_api::rest::{JobEventKind, JobOutcome};
use bsp_api::{JobId, PeerId, Pid};
use placement::{Dhht, IndexAllocator};

use crate::db::{self, u64_from_sql, u64_to_sql};
use crate::metrics::Counter;
use crate::{Effects, Error, Inner, lease};

/// The in-memory DHHT of the online peers that take work (not draining) and
/// the golden-index allocators (dissertation §4.2.2, §4.2.4), mirrors of
/// what SQLite records.
#[derive(Default)]
pub(crate) struct Place {
    pub(crate) dhht: Dhht,
    pub(crate) peer_indices: IndexAllocator,
    pub(crate) process_indices: IndexAllocator,
    /// Some job's processes differ from their DHHT hosts and wait for the
    /// migration interval (or a handover); the lease sweeper retries.
    pub(crate) rebalance_pending: bool,
    /// The last load-change move of each process, so none moves back and
    /// forth (not persisted: after a restart, processes may move once
    /// more).
    pub(crate) moves: crate::hysteresis::Moves,
    /// Jobs that wait because a peer lacks the memory for its share (told
    /// so once).
    pub(crate) memory_waits: std::collections::HashSet<JobId>,
    /// Jobs with redundancy that wait for peers of enough volunteers (told
    /// so once).
    pub(crate) volunteer_waits: std::collections::HashSet<JobId>,
    /// Jobs that wait because of their owner's standing (disabled, process
    /// quota), with the reason they were told (once per reason).
    pub(crate) quota_waits: std::collections::HashMap<JobId, &'static str>,
}

/// A job's point on the top ring of two-level placement (the ring of
/// clusters): the golden point of its id, so consecutive jobs spread over
/// the clusters, and any supernode finds it again.
pub(crate) fn job_position(job: JobId) -> placement::Position {
    placement::golden_position(job.max(1) as u64)
}

/// The two-level placement table (dissertation Fig. 6.1, issue 15) of the
/// peers in the DHHT: each at its DHHT position and power, in its
/// effective cluster (its volunteer's `--cluster`, else the one found on
/// the measured links), with its cores as slots. With no clusters known
/// it places exactly as the flat DHHT.
pub(crate) fn two_level(
    tx: &Connection,
    place: &Place,
    inner: &Inner,
) -> Result<placement::TwoLevel, Error> {
    let mut named: std::collections::HashMap<PeerId, (u32, Option<String>)> = {
        let mut stmt =
            tx.prepare_cached("SELECT id, cores, cluster FROM peers WHERE state = 'online'")?;
        stmt.query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))?
            .collect::<crate::sql::Result<_>>()?
    };
    let found = inner.found_clusters();
    let peers: Vec<placement::ClusterPeer> = place
        .dhht
        .peers()
        .map(|p| {
            let (cores, cluster) = named.remove(&p.id).unwrap_or((1, None));
            placement::ClusterPeer {
                id: p.id,
                cluster: crate::clusters::effective(p.id, cluster, &found),
                position: p.position,
                weight: p.weight,
                // Cores are what the peer says: capped, so one claim cannot
                // make a cluster fit every job.
                slots: cores.clamp(1, 256),
            }
        })
        .collect();
    let mut table = placement::TwoLevel::new();
    for (peer, e) in table.insert_all(peers) {
        tracing::error!(peer, error = %e, "cannot add a peer to the two-level table");
    }
    Ok(table)
}

/// Where a placed process `pid` of a job should be now, by two-level
/// placement: inside the cluster its job is in there, by the DHHT of that
/// cluster. `peer_of(q)` is the peer pid `q` is on while that peer can
/// take work (in `table`); `None` if it is lost, draining or busy.
///
/// The cluster is the one the process's own peer is in now, else the one
/// of its nearest pid (`pid ± 1`, `± 2`, …) whose peer is in the table: a
/// job's blocks are contiguous pid ranges, so that is its block's cluster.
/// Clusters are read from the peers *now*, never recorded, so a cluster
/// that is renamed, found for the first time or lost moves nobody; a
/// process moves to another cluster only when its peer does, or when its
/// peer is lost and its block's cluster is now elsewhere. With no pid of
/// the job in the table, the job goes where a new one would
/// (`TwoLevel::place_job`). `None` if the table is empty.
pub(crate) fn two_level_target(
    table: &placement::TwoLevel,
    job: JobId,
    pid: Pid,
    nprocs: u32,
    position: u64,
    peer_of: impl Fn(Pid) -> Option<PeerId>,
) -> Option<PeerId> {
    let x = placement::golden_position(position);
    let home = (0..nprocs).find_map(|d| {
        let near = [
            pid.checked_sub(d),
            pid.checked_add(d).filter(|&q| q < nprocs),
        ];
        near.into_iter()
            .flatten()
            .find_map(|q| table.get(peer_of(q)?).map(|p| p.cluster))
    });
    match home {
        Some(cluster) => table.lookup_within(cluster.as_deref(), job_position(job), x),
        None => table
            .place_job(job_position(job), &[x])
            .and_then(|p| p.owners.first().copied()),
    }
}

/// Queues `command` for `peer` if it holds a valid lease; the command is
/// stored in the `commands` table in the caller's transaction, so it
/// survives a restart with its sequence number.
pub(crate) fn queue(
    tx: &Connection,
    inner: &Inner,
    fx: &mut Effects,
    peer: PeerId,
    command: Command,
    now: i64,
) -> Result<(), Error> {
    // The sequence number comes from the database: with several
    // supernodes sharing it, another may have queued the last command.
    let Some((seq, stored_expiry)) = tx
        .query_row(
            "UPDATE peers SET cmd_seq = cmd_seq + 1 WHERE id = ?1 AND state = 'online' \
             RETURNING cmd_seq, lease_expires_at",
            [peer],
            |r| Ok((u64_from_sql(r.get(0)?), r.get::<_, i64>(1)?)),
        )
        .optional()?
    else {
        return Ok(());
    };
    {
        let mut live = inner.live();
        let held = live.peers.get_mut(&peer);
        // The lease as stored (renewed at any supernode), or as this one
        // holds it in memory while its disk takes no writes.
        let expiry = held
            .as_ref()
            .map_or(stored_expiry, |p| p.expires_at.max(stored_expiry));
        if !lease::is_valid(now, expiry) {
            return Ok(());
        }
        if let Some(p) = held {
            p.last_seq = p.last_seq.max(seq);
        }
    }
    let body = serde_json::to_string(&command)
        .map_err(|e| Error::Internal(format!("cannot encode a command: {e}")))?;
    tx.execute(
        "INSERT INTO commands (peer_id, seq, body) VALUES (?1, ?2, ?3) \
         ON CONFLICT (peer_id, seq) DO UPDATE SET body = excluded.body",
        params![peer, u64_to_sql(seq), body],
    )?;
    fx.commands.push((peer, SeqCommand { seq, command }));
    Ok(())
}

/// Tells the owner's `GET /api/v1/events` streams that `job` changed state.
pub(crate) fn list_changed(tx: &Connection, fx: &mut Effects, job: JobId) -> Result<(), Error> {
    let owner: Option<i64> = tx
        .query_row("SELECT owner FROM jobs WHERE id = ?1", [job], |r| r.get(0))
        .optional()?;
    if let Some(owner) = owner {
        fx.job_list.push((owner, job));
    }
    Ok(())
}

/// How a job ends.
pub(crate) struct Ending {
    pub(crate) outcome: JobOutcome,
    pub(crate) error: Option<String>,
    pub(crate) error_pid: Option<Pid>,
    pub(crate) event: JobEventKind,
    /// Send `KillJob` with this reason to the job's peers.
    pub(crate) kill: Option<String>,
    /// A peer not to send `KillJob` to (one that is gone).
    pub(crate) skip_peer: Option<PeerId>,
}

impl Ending {
    /// The job failed for `reason` (of process `pid`, if one); its peers
    /// are told `kill`.
    pub(crate) fn failed(reason: String, pid: Option<Pid>, kill: &str) -> Ending {
        let event = JobEventKind::JobFailed {
            reason: reason.clone(),
        };
        Ending::erred(JobOutcome::Failed, event, reason, pid, kill)
    }

    /// A process of the job aborted (`reason`); its peers are told `kill`.
    pub(crate) fn aborted(reason: String, pid: Option<Pid>, kill: &str) -> Ending {
        let event = JobEventKind::JobAborted {
            reason: reason.clone(),
        };
        Ending::erred(JobOutcome::Aborted, event, reason, pid, kill)
    }

    fn erred(
        outcome: JobOutcome,
        event: JobEventKind,
        reason: String,
        pid: Option<Pid>,
        kill: &str,
    ) -> Ending {
        Ending {
            outcome,
            error: Some(reason),
            error_pid: pid,
            event,
            kill: Some(kill.into()),
            skip_peer: None,
        }
    }
}

/// Ends an unfinished job: state, terminal event, golden indices, commands.
/// Returns false (changing nothing) if the job was finished already.
pub(crate) fn finish_job(
    tx: &Connection,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    job: JobId,
    ending: Ending,
    now: i64,
) -> Result<bool, Error> {
    let n = tx.execute(
        "UPDATE jobs SET state = 'finished', outcome = ?2, error = ?3, error_pid = ?4, finished_at = ?5 \
         WHERE id = ?1 AND state != 'finished'",
        params![job, ending.outcome.as_str(), ending.error, ending.error_pid, now],
    )?;
    if n == 0 {
        return Ok(false);
    }
    fx.counts.add(
        match ending.outcome {
            JobOutcome::Exited => Counter::JobsExited,
            JobOutcome::Aborted => Counter::JobsAborted,
            JobOutcome::Failed => Counter::JobsFailed,
            JobOutcome::Killed => Counter::JobsKilled,
        },
        1,
    );
    db::insert_event(tx, job, None, None, &ending.event, now)?;
    list_changed(tx, fx, job)?;
    place.quota_waits.remove(&job);
    place.memory_waits.remove(&job);
    place.volunteer_waits.remove(&job);
    // Copies held for a quorum that never came are of no use now.
    tx.execute("DELETE FROM held_copies WHERE job = ?1", [job])?;
    {
        let mut stmt = tx.prepare_cached("SELECT position FROM placements WHERE job = ?1")?;
        for k in stmt.query_map([job], |r| r.get::<_, i64>(0))? {
            place.process_indices.free(u64_from_sql(k?));
        }
    }
    if let Some(reason) = ending.kill {
        for peer in job_peers(tx, job)? {
            if Some(peer) != ending.skip_peer {
                queue(
                    tx,
                    inner,
                    fx,
                    peer,
                    Command::KillJob {
                        job,
                        reason: reason.clone(),
                    },
                    now,
                )?;
            }
        }
    }
    tracing::info!(
        job,
        outcome = ending.outcome.as_str(),
        error = ending.error.as_deref().unwrap_or(""),
        "job finished"
    );
    fx.jobs.insert(job);
    fx.wake_scheduler = true;
    Ok(true)
}

/// "pid 3" or "pids 1, 4" (the first 20, then how many more).
pub(crate) fn pid_list(pids: &[Pid]) -> String {
    const SHOWN: usize = 20;
    let mut text = pids
        .iter()
        .take(SHOWN)
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if pids.len() > SHOWN {
        text.push_str(&format!(" and {} more", pids.len() - SHOWN));
    }
    if pids.len() == 1 {
        format!("pid {text}")
    } else {
        format!("pids {text}")
    }
}

/// The peers of `job` in assignment order: hosts and replica-only peers.
pub(crate) fn job_peers(tx: &Connection, job: JobId) -> Result<Vec<PeerId>, Error> {
    let mut stmt =
        tx.prepare_cached("SELECT peer_id FROM job_peers WHERE job = ?1 ORDER BY ord")?;
    let rows = stmt.query_map([job], |r| r.get::<_, PeerId>(0))?;
    Ok(rows.collect::<crate::sql::Result<_>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_pids_are_listed_briefly() {
        assert_eq!(pid_list(&[3]), "pid 3");
        assert_eq!(pid_list(&[0, 2]), "pids 0, 2");
        let many: Vec<Pid> = (0..25).collect();
        assert!(pid_list(&many).ends_with("19 and 5 more"));
    }

    /// Peers 1–4 in `a`, 5–8 in `b` (names from `name`), one core each.
    fn table(name: impl Fn(PeerId) -> Option<String>) -> placement::TwoLevel {
        let mut t = placement::TwoLevel::new();
        for id in 1..=8 {
            t.insert(placement::ClusterPeer {
                id,
                cluster: name(id),
                position: placement::golden_position(id as u64),
                weight: 1.0,
                slots: 1,
            })
            .unwrap();
        }
        t
    }

    fn ab(id: PeerId) -> Option<String> {
        Some(if id <= 4 { "a" } else { "b" }.to_string())
    }

    /// Where two-level placement keeps the processes of a placed job:
    /// inside their peers' clusters, whatever the clusters are called, and
    /// a lost process inside its block's cluster.
    #[test]
    fn placed_processes_stay_in_their_clusters() {
        let t = table(ab);
        // A job of 8 on peers 1..=8 (pid i on peer i + 1): pids 0–3 in a,
        // 4–7 in b; every target stays in its peer's cluster.
        let on = |q: Pid| Some(PeerId::from(q) + 1);
        for pid in 0..8 {
            let target = two_level_target(&t, 7, pid, 8, u64::from(pid) * 3 + 1, on).unwrap();
            assert_eq!(ab(target), ab(on(pid).unwrap()), "pid {pid}");
        }
        // Renamed clusters (the same groups): the same targets, so nothing
        // moves when DiDiC's numbers change.
        let renamed = table(|id| Some(if id <= 4 { "found-9" } else { "found-2" }.to_string()));
        for pid in 0..8 {
            let k = u64::from(pid) * 3 + 1;
            assert_eq!(
                two_level_target(&t, 7, pid, 8, k, on),
                two_level_target(&renamed, 7, pid, 8, k, on)
            );
        }
        // Pid 5's peer (6) is lost: it goes to its neighbours' cluster, b.
        let mut lost = table(ab);
        lost.remove(6);
        let gone = |q: Pid| on(q).filter(|&p| p != 6);
        let target = two_level_target(&lost, 7, 5, 8, 16, gone).unwrap();
        assert_eq!(ab(target), ab(6));
        assert_ne!(target, 6);
        // No pid of the job is placed any more: where a new job would go.
        let nowhere = |_: Pid| None;
        let fresh = t
            .place_job(job_position(7), &[placement::golden_position(5)])
            .unwrap()
            .owners[0];
        assert_eq!(two_level_target(&t, 7, 0, 8, 5, nowhere), Some(fresh));
        // Without clusters it is the flat DHHT.
        let flat = table(|_| None);
        let mut dhht = placement::Dhht::new();
        for p in flat.cluster_dhht(None).unwrap().peers() {
            dhht.insert(p).unwrap();
        }
        for k in 1..50 {
            assert_eq!(
                two_level_target(&flat, 7, 0, 1, k, |_| Some(1)),
                dhht.lookup(placement::golden_position(k))
            );
        }
    }
}
