//! Job operations shared by the supernode's request handlers (`state`) and
//! its epoch logic (`epoch`): the placement tables, queuing a command for a
//! peer, ending a job, and how pids and a job's peers are read. It imports
//! neither, so `state` → `epoch` → `jobs` has no loop.

use bsp_api::control::{Command, SeqCommand};
use bsp_api::rest::{JobEventKind, JobOutcome};
use bsp_api::{JobId, PeerId, Pid};
use placement::{Dhht, IndexAllocator};
use rusqlite::{Connection, OptionalExtension, params};

use crate::db::{self, u64_from_sql, u64_to_sql};
use crate::metrics::Counter;
use crate::{Effects, Error, Inner, lease, now_ms};

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
            .collect::<rusqlite::Result<_>>()?
    };
    let mut table = placement::TwoLevel::new();
    for p in place.dhht.peers() {
        let (cores, cluster) = named.remove(&p.id).unwrap_or((1, None));
        let peer = placement::ClusterPeer {
            id: p.id,
            cluster: inner.effective_cluster(p.id, cluster),
            position: p.position,
            weight: p.weight,
            slots: cores.max(1),
        };
        if let Err(e) = table.insert(peer) {
            tracing::error!(peer = p.id, error = %e, "cannot add a peer to the two-level table");
        }
    }
    Ok(table)
}

/// The cluster a placed process should stay in: the one its block was
/// placed in while that cluster has peers, else the one its peer is in
/// now (clusters were found, or renamed, since it was placed), else the
/// recorded one (its peer is gone: the table's fallback decides).
pub(crate) fn home_cluster<'a>(
    table: &'a placement::TwoLevel,
    placed_in: Option<&'a str>,
    peer: PeerId,
) -> Option<std::borrow::Cow<'a, str>> {
    if table.cluster_dhht(placed_in).is_some() {
        return placed_in.map(std::borrow::Cow::Borrowed);
    }
    match table.get(peer) {
        Some(p) => p.cluster.map(std::borrow::Cow::Owned),
        None => placed_in.map(std::borrow::Cow::Borrowed),
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
) -> Result<(), Error> {
    let seq = {
        let mut live = inner.live();
        let Some(p) = live.peers.get_mut(&peer) else {
            return Ok(());
        };
        if !lease::is_valid(now_ms(), p.expires_at) {
            return Ok(());
        }
        p.last_seq += 1;
        p.last_seq
    };
    tx.execute(
        "UPDATE peers SET cmd_seq = max(cmd_seq, ?2) WHERE id = ?1",
        params![peer, u64_to_sql(seq)],
    )?;
    let body = serde_json::to_string(&command)
        .map_err(|e| Error::Internal(format!("cannot encode a command: {e}")))?;
    tx.execute(
        "INSERT OR REPLACE INTO commands (peer_id, seq, body) VALUES (?1, ?2, ?3)",
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
    Ok(rows.collect::<rusqlite::Result<_>>()?)
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
}
