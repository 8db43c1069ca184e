//! The progress checks of a renewal (issue 18, "Claims checked against
//! what peers deliver"): which jobs a reporter is a member of, and the
//! peers that, by the reports of most of their jobs' other volunteers,
//! hold processes but make no progress ([`crate::verify`]).

use std::collections::BTreeSet;

use super::*;

impl Core {
    /// Records `reporter`'s long barrier waits and returns the peers that,
    /// by the reports of most of their jobs' other peers, hold processes but
    /// make no progress ([`crate::verify`]).
    pub(super) fn check_waits(
        tx: &Connection,
        inner: &Inner,
        reporter: PeerId,
        waits: &[bsp_api::control::BarrierWait],
        now: i64,
    ) -> Result<Vec<PeerId>, Error> {
        if !waits.is_empty() {
            tracing::debug!(reporter, ?waits, "barrier waits reported");
        }
        // The peers each waited-for pid's wait is laid on: its host, or
        // with redundancy the hosts of its copies that are furthest behind
        // (a wait for a quorum is a wait for the slower copy).
        let mut hosts: HashMap<JobId, HashMap<Pid, Vec<PeerId>>> = HashMap::new();
        // Every peer hosting a process (a copy) of each job: the suspects
        // and their judges.
        let mut members: HashMap<JobId, BTreeSet<PeerId>> = HashMap::new();
        let mut limits: HashMap<JobId, u64> = HashMap::new();
        for w in waits {
            if hosts.contains_key(&w.job) {
                continue;
            }
            let limit: Option<i64> = tx
                .query_row(
                    "SELECT superstep_ms FROM jobs WHERE id = ?1 AND state = 'active'",
                    [w.job],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(limit) = limit else { continue };
            let mut stmt = tx.prepare_cached(
                "SELECT p.pid % j.nprocs, p.peer_id, p.superstep FROM placements p \
                 JOIN jobs j ON j.id = p.job WHERE p.job = ?1",
            )?;
            let rows = stmt
                .query_map([w.job], |r| {
                    Ok((
                        r.get::<_, Pid>(0)?,
                        r.get::<_, PeerId>(1)?,
                        r.get::<_, u32>(2)?,
                    ))
                })?
                .collect::<crate::sql::Result<Vec<_>>>()?;
            members.insert(w.job, rows.iter().map(|&(_, p, _)| p).collect());
            let mut behind: HashMap<Pid, (u32, Vec<PeerId>)> = HashMap::new();
            for (pid, peer, step) in rows {
                let e = behind.entry(pid).or_insert((step, Vec::new()));
                if step < e.0 {
                    *e = (step, Vec::new());
                }
                if step == e.0 {
                    e.1.push(peer);
                }
            }
            let placed = behind.into_iter().map(|(pid, (_, p))| (pid, p)).collect();
            hosts.insert(w.job, placed);
            limits.insert(w.job, u64::try_from(limit).unwrap_or(0));
        }
        let mut parties: HashMap<PeerId, crate::verify::Party> = HashMap::new();
        for &p in members.values().flatten() {
            if parties.contains_key(&p) {
                continue;
            }
            let owner: Option<i64> = tx
                .prepare_cached(
                    "SELECT e.owner FROM peers p JOIN enrollments e ON e.id = p.enrollment \
                     WHERE p.id = ?1",
                )?
                .query_row([p], |r| r.get(0))
                .optional()?;
            parties.insert(
                p,
                owner.map_or(
                    crate::verify::Party::Peer(p),
                    crate::verify::Party::Volunteer,
                ),
            );
        }
        let party = |p: PeerId| {
            parties
                .get(&p)
                .copied()
                .unwrap_or(crate::verify::Party::Peer(p))
        };
        let mut live = inner.live();
        live.verify.waits(
            reporter,
            waits,
            |job, pids| {
                hosts.get(&job).map_or_else(BTreeSet::new, |h| {
                    pids.iter()
                        .filter_map(|p| h.get(p))
                        .flatten()
                        .copied()
                        .collect()
                })
            },
            now,
        );
        let mut stalled = BTreeSet::new();
        for (job, peers) in &members {
            for x in live.verify.stalled(*job, peers, party, limits[job], now) {
                tracing::warn!(
                    peer = x,
                    job,
                    "peer #{x} holds processes of job {job} but made no progress for longer than \
                     twice its superstep limit and {} s, say most of the job's other volunteers",
                    crate::verify::STALL_GRACE_MS / 1000
                );
                stalled.insert(x);
            }
        }
        Ok(stalled.into_iter().collect())
    }
}

/// For each of `jobs` that is active with `reporter` among its peers: its
/// peers and their cores (the processes each can run at once).
pub(super) fn job_members(
    tx: &Connection,
    reporter: PeerId,
    jobs: impl Iterator<Item = JobId>,
) -> Result<HashMap<JobId, HashMap<PeerId, u32>>, Error> {
    let mut out = HashMap::new();
    let mut stmt = tx.prepare_cached(
        "SELECT jp.peer_id, p.cores FROM job_peers jp JOIN jobs j ON j.id = jp.job \
         JOIN peers p ON p.id = jp.peer_id WHERE jp.job = ?1 AND j.state = 'active'",
    )?;
    let mut asked = HashSet::new();
    for job in jobs {
        if !asked.insert(job) || asked.len() > 256 {
            continue;
        }
        let peers: HashMap<PeerId, u32> = stmt
            .query_map([job], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<crate::sql::Result<_>>()?;
        if peers.contains_key(&reporter) {
            out.insert(job, peers);
        }
    }
    Ok(out)
}
