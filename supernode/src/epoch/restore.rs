//! Restoring the processes of lost peers in a new epoch
//! (`docs/fault-tolerance.md`, "Failure and restore").

use super::*;

/// Why peers were declared gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LossCause {
    /// They stopped renewing their leases.
    LeaseExpired,
    /// Another peer of the job lost its link to it and its data-plane
    /// address refused the supernode's connection.
    Unreachable,
    /// Its volunteer or an administrator disabled it (or its account).
    Disabled,
    /// The enrollment token it logged in with was revoked.
    Revoked,
    /// It renewed its lease but made no progress beyond its jobs'
    /// superstep limit, say most of the jobs' other peers.
    Stalled,
    /// With redundancy, two peers of other volunteers outvoted its result.
    Quarantined,
}

impl LossCause {
    fn says(self, many: bool) -> &'static str {
        match (self, many) {
            (LossCause::LeaseExpired, false) => "stopped renewing its lease",
            (LossCause::LeaseExpired, true) => "stopped renewing their leases",
            (LossCause::Unreachable, _) => "died (its data port refuses connections)",
            (LossCause::Disabled, false) => "was disabled by its volunteer or an administrator",
            (LossCause::Disabled, true) => "were disabled by their volunteer or an administrator",
            (LossCause::Revoked, false) => "lost its enrollment (its token was revoked)",
            (LossCause::Revoked, true) => "lost their enrollment (their token was revoked)",
            (LossCause::Stalled, false) => {
                "made no progress past the superstep limit while it renewed its lease"
            }
            (LossCause::Stalled, true) => {
                "made no progress past the superstep limit while they renewed their leases"
            }
            (LossCause::Quarantined, false) => {
                "was quarantined (peers of other volunteers outvoted its result)"
            }
            (LossCause::Quarantined, true) => {
                "were quarantined (peers of other volunteers outvoted their results)"
            }
        }
    }
}

/// Restores the processes of the `lost` peers (already marked gone and out
/// of the DHHT): for every active job they belonged to, a new epoch with
/// their processes re-placed by the DHHT on the remaining peers and named in
/// `restore`. A job fails only when no live peer is left to take them —
/// with redundancy, no live peer of a volunteer other than those running
/// the other copies of a lost copy's pid (the twin rule, [`crate::twins`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn restore_lost(
    tx: &Connection,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    lost: &BTreeMap<PeerId, String>,
    cause: LossCause,
    now: i64,
) -> Result<(), Error> {
    let mut by_job: BTreeMap<JobId, Vec<PeerId>> = BTreeMap::new();
    {
        let mut stmt = tx.prepare_cached(
            "SELECT jp.job FROM job_peers jp JOIN jobs j ON j.id = jp.job \
             WHERE jp.peer_id = ?1 AND j.state = 'active'",
        )?;
        for &peer in lost.keys() {
            for job in stmt.query_map([peer], |r| r.get::<_, JobId>(0))? {
                by_job.entry(job?).or_default().push(peer);
            }
        }
    }
    if by_job.is_empty() {
        return Ok(());
    }
    let usable = usable_peers(tx, now)?;
    let live = live_peers(tx, now)?;
    let table = crate::jobs::two_level(tx, place, inner)?;
    let usable_cands = candidates(place, &usable);
    let live_cands: Vec<(PeerId, f64)> = live.iter().map(|&p| (p, 1.0)).collect();
    for (job, gone) in by_job {
        let rows = placements(tx, job)?;
        let copies = Copies::of_job(tx, job)?;
        let twin = copies.redundancy > 1;
        let vol = if twin {
            Volunteers::load(
                tx,
                rows.iter()
                    .map(|r| r.peer)
                    .chain(usable.iter().copied())
                    .chain(live.iter().copied()),
            )?
        } else {
            Volunteers::default()
        };
        let job_live: Vec<PeerId> = job_peers(tx, job)?
            .into_iter()
            .filter(|p| live.contains(p))
            .collect();
        let nprocs = rows.last().map_or(0, |r| r.pid + 1);
        let peer_of = |q: Pid| peer_of_slot(&rows, q).filter(|p| !gone.contains(p));
        let plan = placement::epochs::plan_restore(&rows, &gone, |row, running| {
            let dhht = two_level_target(&table, job, row.pid, nprocs, row.position, peer_of)
                .filter(|p| usable.contains(p));
            if twin {
                let others = twin_hosts(copies, &rows, running, row.pid);
                twins::settle(job, row.pid, dhht, None, &usable_cands, &vol, &others)
                    .or_else(|| twins::pick(job, row.pid, &live_cands, &vol, &others))
            } else {
                placement::epochs::fallback_host(dhht, &job_live, &usable, &live)
            }
        });
        let homeless = plan.homeless;
        let change = plan.change;
        let who = if gone.len() == 1 {
            format!("peer {} (#{})", lost[&gone[0]], gone[0])
        } else {
            let names: Vec<String> = gone.iter().map(|p| format!("{} (#{p})", lost[p])).collect();
            format!("peers {}", names.join(", "))
        };
        if !homeless.is_empty() {
            let whom = if twin {
                "no live peer of a volunteer other than those running the other copies"
            } else {
                "no live peer"
            };
            let reason = format!(
                "{who} {} and {whom} is left to restore {}",
                cause.says(gone.len() > 1),
                copies.slot_list(&homeless)
            );
            let ending = Ending::failed(reason, None, "every other peer of the job is gone");
            finish_job(tx, place, inner, fx, job, ending, now)?;
            continue;
        }
        let restored: Vec<Pid> = change.moves.iter().map(|&(pid, _)| pid).collect();
        let targets = distinct(change.moves.iter().map(|&(_, t)| t));
        let in_place = change.restore_in_place.clone();
        let epoch = new_epoch(tx, inner, fx, job, change, now)?;
        let lost_text = format!(
            "{} lost: {} {}",
            peer_list(&gone),
            if gone.len() == 1 { "it" } else { "they" },
            cause.says(gone.len() > 1)
        );
        let text = if restored.is_empty() && in_place.is_empty() {
            format!("{lost_text}; it held only checkpoint replicas (epoch {epoch})")
        } else {
            let mut text = lost_text;
            if !restored.is_empty() {
                text.push_str(&format!(
                    "; restoring {} on {}",
                    copies.slot_list(&restored),
                    peer_list(&targets)
                ));
            }
            if !in_place.is_empty() {
                text.push_str(&format!(
                    "; restoring {} where they were migrating to",
                    copies.slot_list(&in_place)
                ));
            }
            format!("{text} (epoch {epoch})")
        };
        tracing::warn!(job, epoch, "{text}");
        db::insert_event(tx, job, None, None, &JobEventKind::Status { text }, now)?;
    }
    Ok(())
}
