//! Result validation by redundancy (issue 18), the supernode's part: the
//! copies of an output record or an exit must agree before users see them
//! ([`offer_copy`]), and what the copies disagree on is judged
//! ([`judge`]): a version with a quorum wins and the peers of the others
//! are quarantined; without one, a third run decides.
//!
//! A quorum is `redundancy` (2) copies from peers of as many different
//! volunteers ([`crate::twins`]). The peers compare messages and state
//! digests among themselves and report what differs
//! ([`PeerEvent::Disagreement`]); the supernode compares output and exits,
//! which reach only it.

use std::collections::{BTreeMap, BTreeSet};

use super::enroll::{FenceCause, fence};
use super::*;
use crate::epoch::ThirdRun;
use crate::twins::{Copies, Volunteers};

/// Most versions and most peers per version a disagreement may name: two
/// copies and a few third runs' worth; more is not a report of ours.
const MAX_GROUPS: usize = 8;
const MAX_GROUP_PEERS: usize = 8;
/// Longest `what` kept from a peer, in characters.
const MAX_WHAT_CHARS: usize = 200;
/// Disagreements without a quorum recorded per job; more reports are
/// ignored (each starts a third run; a real job needs a few).
const MAX_DISAGREEMENTS_PER_JOB: i64 = 256;

/// What became of one copy of an output record or exit.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Offer {
    /// A quorum agrees with this copy: publish it. `groups[0]` is the
    /// winning version's peers; any further group was outvoted.
    Agreed { groups: Vec<Vec<PeerId>> },
    /// Held until a copy from a peer of another volunteer agrees.
    Held,
    /// The held copies differ and none has a quorum yet.
    Disagree { groups: Vec<Vec<PeerId>> },
    /// The peer's held copies would pass the job's output limit: not held
    /// (one copy never legitimately outruns the other by that much).
    Dropped,
}

/// Offers `peer`'s copy of record `seq` of `pid` (-1: its exit), whose
/// event JSON is `payload`, to the quorum: holds it (in SQLite, so a
/// restart loses nothing the peer thinks delivered), and says whether
/// copies of `quorum` volunteers now agree. `limit` bounds what one peer
/// may have held for one pid (the job's output limit).
#[allow(clippy::too_many_arguments)]
pub(super) fn offer_copy(
    tx: &Connection,
    job: JobId,
    pid: Pid,
    seq: i64,
    peer: PeerId,
    payload: &str,
    bytes: i64,
    limit: i64,
    quorum: u32,
    now: i64,
) -> Result<Offer, Error> {
    let held: i64 = tx
        .prepare_cached(
            "SELECT coalesce(sum(bytes), 0) FROM held_copies \
             WHERE job = ?1 AND pid = ?2 AND peer_id = ?3",
        )?
        .query_row(params![job, pid, peer], |r| r.get(0))?;
    if held.saturating_add(bytes) > limit {
        tracing::warn!(
            peer,
            job,
            pid,
            seq,
            held,
            "not holding an output copy: this peer's unmatched output of the process passes \
             the job's output limit"
        );
        return Ok(Offer::Dropped);
    }
    tx.prepare_cached(
        "INSERT INTO held_copies (job, pid, seq, peer_id, payload, bytes, at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO NOTHING",
    )?
    .execute(params![job, pid, seq, peer, payload, bytes, now])?;
    // Copies of quarantined peers count for nothing: they were judged.
    let copies: Vec<(PeerId, String)> = tx
        .prepare_cached(
            "SELECT h.peer_id, h.payload FROM held_copies h LEFT JOIN peers p ON p.id = h.peer_id \
             WHERE h.job = ?1 AND h.pid = ?2 AND h.seq = ?3 AND p.quarantined_at IS NULL \
             ORDER BY h.peer_id",
        )?
        .query_map(params![job, pid, seq], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<crate::sql::Result<_>>()?;
    let mut versions: BTreeMap<&str, Vec<PeerId>> = BTreeMap::new();
    for (p, text) in &copies {
        versions.entry(text.as_str()).or_default().push(*p);
    }
    let Some(mine) = versions.get(payload).cloned() else {
        // Not stored: this peer is quarantined, or held another version
        // of the same record before (it contradicts itself).
        tracing::warn!(
            peer,
            job,
            pid,
            seq,
            "not holding an output copy: this peer is quarantined or sent another version before"
        );
        return Ok(Offer::Dropped);
    };
    let mut groups: Vec<Vec<PeerId>> = vec![mine];
    groups.extend(
        versions
            .into_iter()
            .filter(|(text, _)| *text != payload)
            .map(|(_, peers)| peers),
    );
    groups[1..].sort_by_key(|g| std::cmp::Reverse(g.len()));
    let vol = Volunteers::load(tx, copies.iter().map(|(p, _)| *p))?;
    if vol.count(groups[0].iter().copied()) >= quorum as usize {
        tx.prepare_cached("DELETE FROM held_copies WHERE job = ?1 AND pid = ?2 AND seq = ?3")?
            .execute(params![job, pid, seq])?;
        return Ok(Offer::Agreed { groups });
    }
    if groups.len() > 1 {
        groups.sort_by_key(|g| std::cmp::Reverse(g.len()));
        return Ok(Offer::Disagree { groups });
    }
    Ok(Offer::Held)
}

/// An output record of `job` that a copy delivered and no other copy
/// matched (held, not from a quarantined peer): `(pid, seq)`, the first.
pub(super) fn unmatched_output(tx: &Connection, job: JobId) -> Result<Option<(Pid, i64)>, Error> {
    Ok(tx
        .prepare_cached(
            "SELECT h.pid, h.seq FROM held_copies h LEFT JOIN peers p ON p.id = h.peer_id \
             WHERE h.job = ?1 AND h.seq >= 0 AND p.quarantined_at IS NULL \
             AND NOT EXISTS (SELECT 1 FROM events e WHERE e.job = h.job AND e.pid = h.pid \
                             AND e.seq = h.seq) \
             ORDER BY h.pid, h.seq LIMIT 1",
        )?
        .query_row([job], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}

/// A disagreement between copies of `pid`, reported by a peer or found by
/// the supernode in output or exits.
#[derive(Debug, Clone)]
pub(super) struct Verdict {
    pub(super) job: JobId,
    pub(super) pid: Pid,
    pub(super) superstep: u32,
    /// The peers of each version, largest group first.
    pub(super) groups: Vec<Vec<PeerId>>,
    pub(super) what: String,
    /// Who reported it (`None`: the supernode found it).
    pub(super) reporter: Option<PeerId>,
}

/// Judges a disagreement. Anything that does not check out (a job without
/// redundancy or no longer active, a pid out of range, a peer named twice
/// or never a peer of the job, too many groups) is ignored with a debug
/// log: a peer's report never fails a job by its form.
///
/// - A version whose peers are of at least `redundancy` volunteers wins;
///   every peer of the other versions is quarantined ([`quarantine`]).
/// - Otherwise `CopiesDisagree` is told once per (job, pid, superstep),
///   and unless a third run is under way (a host of the pid named in no
///   group), copy 1 moves to a peer of a third volunteer
///   ([`epoch::third_run`]); with none online, the job fails.
pub(super) fn judge(
    tx: &Transaction<'_>,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    v: &Verdict,
    now: i64,
) -> Result<(), Error> {
    let Verdict {
        job,
        pid,
        superstep,
        ref groups,
        ref what,
        reporter,
    } = *v;
    let ignore = |why: &str| {
        tracing::debug!(
            job,
            pid,
            superstep,
            ?reporter,
            ?groups,
            "ignoring a disagreement: {why}"
        );
        Ok(())
    };
    let row: Option<(String, u32, u32)> = tx
        .query_row(
            "SELECT state, nprocs, redundancy FROM jobs WHERE id = ?1",
            [job],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let Some((state, nprocs, redundancy)) = row else {
        return ignore("no such job");
    };
    if state != "active" {
        return ignore("the job is not active");
    }
    if redundancy < 2 {
        return ignore("the job runs one copy of each process");
    }
    if pid >= nprocs {
        return ignore("no such pid");
    }
    if groups.is_empty()
        || groups.len() > MAX_GROUPS
        || groups
            .iter()
            .any(|g| g.is_empty() || g.len() > MAX_GROUP_PEERS)
    {
        return ignore("malformed groups");
    }
    let mut named = BTreeSet::new();
    {
        let mut was_member =
            tx.prepare_cached("SELECT 1 FROM job_peer_history WHERE job = ?1 AND peer_id = ?2")?;
        for &p in groups.iter().flatten() {
            if !named.insert(p) {
                return ignore("a peer is named twice");
            }
            if !was_member.exists(params![job, p])? {
                return ignore("it names a peer that was never a peer of the job");
            }
        }
    }
    // Peers already quarantined were judged: their versions count for
    // nothing now.
    let quarantined: BTreeSet<PeerId> = {
        let mut stmt =
            tx.prepare_cached("SELECT 1 FROM peers WHERE id = ?1 AND quarantined_at IS NOT NULL")?;
        let mut out = BTreeSet::new();
        for &p in &named {
            if stmt.exists([p])? {
                out.insert(p);
            }
        }
        out
    };
    let mut groups: Vec<Vec<PeerId>> = groups
        .iter()
        .map(|g| {
            g.iter()
                .copied()
                .filter(|p| !quarantined.contains(p))
                .collect::<Vec<_>>()
        })
        .filter(|g| !g.is_empty())
        .collect();
    groups.sort_by_key(|g| std::cmp::Reverse(g.len()));
    if groups.len() < 2 {
        return ignore("no disagreement is left once quarantined peers are set aside");
    }
    let what = truncate(what, MAX_WHAT_CHARS);
    let vol = Volunteers::load(tx, named.iter().copied())?;
    let quorate: Vec<usize> = (0..groups.len())
        .filter(|&i| vol.count(groups[i].iter().copied()) >= redundancy as usize)
        .collect();
    match quorate.as_slice() {
        [winner] => {
            for (i, g) in groups.iter().enumerate() {
                if i == *winner {
                    continue;
                }
                for &p in g {
                    quarantine(tx, place, inner, fx, p, job, pid, superstep, &what, now)?;
                }
            }
            return Ok(());
        }
        [] => {}
        _ => return ignore("two versions both have a quorum"),
    }
    // A peer of the job may report any superstep: bound what it can make
    // the supernode store (a real run disagrees a few times at most).
    let recorded: i64 = tx
        .prepare_cached("SELECT count(*) FROM disagreements WHERE job = ?1")?
        .query_row([job], |r| r.get(0))?;
    if recorded >= MAX_DISAGREEMENTS_PER_JOB {
        return ignore("the job has had too many disagreements recorded already");
    }
    let first = tx
        .prepare_cached(
            "INSERT INTO disagreements (job, pid, superstep, at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
        )?
        .execute(params![job, pid, superstep, now])?
        == 1;
    if first {
        let kind = JobEventKind::CopiesDisagree {
            superstep,
            peers: groups.iter().flatten().copied().collect(),
            what: what.clone(),
        };
        db::insert_event(tx, job, Some(pid), None, &kind, now)?;
        fx.jobs.insert(job);
        tracing::warn!(job, pid, superstep, ?groups, %what, "copies of a process disagree");
    }
    // A host of the pid named in no group runs a third run already.
    let copies = Copies { nprocs, redundancy };
    let rows = epoch::placements(tx, job)?;
    let underway = copies
        .slots_of(pid)
        .filter_map(|s| rows.get(s as usize))
        .any(|r| !named.contains(&r.peer));
    if underway {
        tracing::debug!(
            job,
            pid,
            superstep,
            "a third run of the process is under way"
        );
        return Ok(());
    }
    let involved: Vec<PeerId> = named.iter().copied().collect();
    match epoch::third_run(tx, place, inner, fx, job, pid, &involved, now)? {
        ThirdRun::Started { .. } => {}
        ThirdRun::NoVolunteer => {
            let reason = format!(
                "copies of pid {pid} disagree at superstep {superstep} ({what}) and no peer of a \
                 third volunteer is online to decide"
            );
            let ending = Ending::failed(reason, Some(pid), "its results could not be validated");
            finish_job(tx, place, inner, fx, job, ending, now)?;
        }
    }
    Ok(())
}

/// Quarantines `peer`, outvoted on `pid`'s result at `superstep` in `job`:
/// once (a quarantined peer stays so until an administrator enables it).
/// It is disabled — refused at login under its name and token, shown so
/// in the peer list — its held copies are dropped, and if online it is
/// fenced: everything it hosts, for every job, is restored elsewhere as
/// for a lost peer. Returns whether it was quarantined now.
#[allow(clippy::too_many_arguments)]
pub(super) fn quarantine(
    tx: &Transaction<'_>,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    peer: PeerId,
    job: JobId,
    pid: Pid,
    superstep: u32,
    what: &str,
    now: i64,
) -> Result<bool, Error> {
    let row: Option<(Option<i64>, Option<i64>, String, String)> = tx
        .query_row(
            "SELECT quarantined_at, enrollment, name, state FROM peers WHERE id = ?1",
            [peer],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let Some((None, enrollment, name, state)) = row else {
        return Ok(false);
    };
    let reason = format!(
        "its result for pid {pid} of job {job} in superstep {superstep} ({what}) differs from \
         the one peers of other volunteers agree on"
    );
    tx.execute(
        "UPDATE peers SET quarantined_at = ?2, quarantine_reason = ?3, disabled = 1 WHERE id = ?1",
        params![peer, now, reason],
    )?;
    // Every row of the same machine, so its next login is refused.
    if let Some(e) = enrollment {
        tx.execute(
            "UPDATE peers SET disabled = 1, quarantined_at = ?3, quarantine_reason = ?4 \
             WHERE enrollment = ?1 AND name = ?2",
            params![e, name, now, reason],
        )?;
    }
    tx.execute("DELETE FROM held_copies WHERE peer_id = ?1", [peer])?;
    let kind = JobEventKind::PeerQuarantined {
        peer,
        superstep,
        reason: reason.clone(),
    };
    db::insert_event(tx, job, Some(pid), None, &kind, now)?;
    fx.jobs.insert(job);
    tracing::warn!(
        peer,
        job,
        pid,
        superstep,
        "peer #{peer} quarantined: {reason}"
    );
    if state == "online" {
        let fenced = fence(tx, place, inner, fx, &[peer], FenceCause::Quarantined, now)?;
        fx.forget_peers.extend(fenced);
    }
    Ok(true)
}

#[cfg(test)]
mod tests;
