//! The third run of result validation by redundancy (issue 18): the copies
//! of a pid disagree and no version has a quorum, so a peer of a third
//! volunteer computes it again and its result sides with one of them.

use super::*;

/// What became of a third run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ThirdRun {
    /// Copy 1 of the pid moved to `peer`, restored in `epoch`.
    Started { peer: PeerId, epoch: u64 },
    /// No peer of a volunteer other than those involved takes work.
    NoVolunteer,
}

/// Moves copy 1 of `pid` to the best peer (by [`twins::pick`]) of a
/// volunteer none of `involved` (the peers whose versions disagree) nor
/// the pid's current hosts belongs to, as a restore: a new epoch with
/// `restore = [pid]`. Its new host restores the last checkpoint both
/// copies agreed on and re-executes; its result then makes a quorum with
/// one side, and the peers report the other as outvoted.
#[allow(clippy::too_many_arguments)]
pub(crate) fn third_run(
    tx: &Connection,
    place: &Place,
    inner: &Inner,
    fx: &mut Effects,
    job: JobId,
    pid: Pid,
    involved: &[PeerId],
    now: i64,
) -> Result<ThirdRun, Error> {
    let copies = Copies::of_job(tx, job)?;
    let slot = copies.slot(1.min(copies.redundancy - 1), pid);
    let rows = placements(tx, job)?;
    let running = runners(&rows, &[]);
    let hosts: Vec<PeerId> = copies
        .slots_of(pid)
        .filter_map(|s| row_index(&rows, s))
        .flat_map(|i| running[i].iter().copied())
        .chain(involved.iter().copied())
        .collect();
    let usable = usable_peers(tx, now)?;
    let cands = candidates(place, &usable);
    let vol = Volunteers::load(
        tx,
        hosts.iter().copied().chain(cands.iter().map(|&(p, _)| p)),
    )?;
    let Some(peer) = twins::pick(job, slot, &cands, &vol, &hosts) else {
        return Ok(ThirdRun::NoVolunteer);
    };
    let from = row_index(&rows, slot).map(|i| rows[i].peer);
    let epoch = new_epoch(
        tx,
        inner,
        fx,
        job,
        Change {
            moves: vec![(slot, peer)],
            migrate: false,
            ..Change::default()
        },
        now,
    )?;
    let text = format!(
        "a third run decides: copy 1 of pid {pid} moves from {} to peer #{peer} of another \
         volunteer, which restores it from its last agreed checkpoint (epoch {epoch})",
        from.map_or_else(|| "nowhere".to_string(), |p| format!("peer #{p}")),
    );
    tracing::warn!(job, pid, epoch, "{text}");
    db::insert_event(
        tx,
        job,
        Some(pid),
        None,
        &JobEventKind::Status { text },
        now,
    )?;
    Ok(ThirdRun::Started { peer, epoch })
}
