//! Migrations for load changes and drains, and drained peers leaving
//! their jobs (`docs/fault-tolerance.md`, "Migration and drain").

use super::*;

/// Moves the processes of active jobs whose DHHT host differs from their
/// recorded host (after a power change or a drain). Jobs that migrated less
/// than the migration interval ago wait, unless a process sits on a draining
/// peer; a process still being handed over does not move again; a process
/// that moved for a load change recently backs off and does not go
/// straight back ([`crate::hysteresis`]), unless its host became busy (no
/// power): no back-off keeps it on a machine its volunteer now uses. With
/// redundancy a copy moves only where the twin rule allows
/// ([`crate::twins::settle`]): to its DHHT peer if allowed, else it stays
/// where it is if allowed there and its host is not busy, else to the best
/// allowed peer. Returns whether some job has moves left for later.
pub(crate) fn rebalance(
    tx: &Connection,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    now: i64,
) -> Result<bool, Error> {
    let interval = i64::try_from(inner.config.migration_interval.as_millis()).unwrap_or(i64::MAX);
    let usable = usable_peers(tx, now)?;
    let draining = draining_peers(tx)?;
    let busy = busy_peers(tx)?;
    let jobs: Vec<(JobId, Option<i64>)> = {
        let mut stmt = tx.prepare_cached(
            "SELECT id, migrated_at FROM jobs WHERE state = 'active' ORDER BY id",
        )?;
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<crate::sql::Result<_>>()?
    };
    place
        .moves
        .retain_jobs(|j| jobs.iter().any(|&(active, _)| active == j));
    if jobs.is_empty() {
        return Ok(false);
    }
    let mut pending = false;
    let table = crate::jobs::two_level(tx, place, inner)?;
    let usable_cands = candidates(place, &usable);
    for (job, migrated_at) in jobs {
        let rows = placements(tx, job)?;
        let copies = Copies::of_job(tx, job)?;
        let twin = copies.redundancy > 1;
        let vol = if twin {
            Volunteers::load(
                tx,
                rows.iter().map(|r| r.peer).chain(usable.iter().copied()),
            )?
        } else {
            Volunteers::default()
        };
        let nprocs = rows.last().map_or(0, |r| r.pid + 1);
        let peer_of = |q: Pid| peer_of_slot(&rows, q);
        let plan = placement::epochs::plan_rebalance(
            &rows,
            &draining,
            &busy,
            |row, running| {
                let dhht = two_level_target(&table, job, row.pid, nprocs, row.position, peer_of)
                    .filter(|p| usable.contains(p));
                if twin {
                    let others = twin_hosts(copies, &rows, running, row.pid);
                    // A busy host is usable (it still serves the job's
                    // messages and replicas) but keeps no copy.
                    let keep = Some(row.peer).filter(|p| usable.contains(p) && !busy.contains(p));
                    twins::settle(job, row.pid, dhht, keep, &usable_cands, &vol, &others)
                } else {
                    dhht
                }
            },
            |pid, to| place.moves.allows(job, pid, to, now, interval),
        );
        pending |= plan.pending;
        if plan.moves.is_empty() {
            continue;
        }
        if !plan.forced && migrated_at.is_some_and(|t| now.saturating_sub(t) < interval) {
            pending = true;
            continue;
        }
        let moves = plan.moves;
        let pids: Vec<Pid> = moves.iter().map(|&(pid, _)| pid).collect();
        let targets = distinct(moves.iter().map(|&(_, t)| t));
        let sources = distinct(
            moves
                .iter()
                .filter_map(|&(pid, _)| rows.iter().find(|r| r.pid == pid).map(|r| r.peer)),
        );
        let epoch = new_epoch(
            tx,
            inner,
            fx,
            job,
            Change {
                moves,
                migrate: true,
                ..Change::default()
            },
            now,
        )?;
        tx.execute(
            "UPDATE jobs SET migrated_at = ?2 WHERE id = ?1",
            params![job, now],
        )?;
        for (pid, from) in plan.load_moves {
            place.moves.record(job, pid, from, now, interval);
        }
        let why = if plan.forced {
            "draining"
        } else {
            "load change"
        };
        let text = format!(
            "migrating {} from {} to {} ({why}, epoch {epoch})",
            copies.slot_list(&pids),
            peer_list(&sources),
            peer_list(&targets)
        );
        tracing::info!(job, epoch, "{text}");
        db::insert_event(tx, job, None, None, &JobEventKind::Status { text }, now)?;
    }
    Ok(pending)
}

/// Lets draining peers that host nothing and hand nothing over leave their
/// active jobs (a new epoch without them).
pub(crate) fn settle_drains(
    tx: &Connection,
    inner: &Inner,
    fx: &mut Effects,
    now: i64,
) -> Result<(), Error> {
    let jobs: Vec<JobId> = {
        let mut stmt = tx.prepare_cached(
            "SELECT DISTINCT jp.job FROM job_peers jp JOIN peers p ON p.id = jp.peer_id \
             JOIN jobs j ON j.id = jp.job \
             WHERE p.draining = 1 AND p.state = 'online' AND j.state = 'active' ORDER BY jp.job",
        )?;
        stmt.query_map([], |r| r.get(0))?
            .collect::<crate::sql::Result<_>>()?
    };
    if jobs.is_empty() {
        return Ok(());
    }
    let draining = draining_peers(tx)?;
    for job in jobs {
        let rows = placements(tx, job)?;
        let idle_drainer =
            placement::epochs::has_idle_drainer(&job_peers(tx, job)?, &rows, &draining);
        if idle_drainer {
            new_epoch(tx, inner, fx, job, Change::default(), now)?;
        }
    }
    Ok(())
}
