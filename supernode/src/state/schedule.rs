//! The scheduler: placing waiting jobs on peers by DHHT lookup, within
//! the peers' load and memory (dissertation §4.4; issue 20, finding 1).

use super::*;
use crate::jobs::job_position;
use crate::twins::{self, Copies, Volunteers};

impl Core {
    // ------------------------------------------------------------ scheduling

    /// Places waiting jobs, oldest first, while the overload limit allows
    /// (§4.4). Returns how many were placed.
    pub(crate) fn schedule(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        now: i64,
    ) -> Result<usize, Error> {
        let tx = self.conn.transaction()?;
        // The waiting jobs first: with none (most wake-ups: every login
        // wakes the scheduler) nothing reads every online peer.
        let waiting: Vec<(JobId, Copies, i64)> = {
            let mut stmt = tx.prepare(
                "SELECT id, nprocs, redundancy, owner FROM jobs WHERE state = 'waiting' ORDER BY id",
            )?;
            stmt.query_map([], |r| {
                let copies = Copies {
                    nprocs: r.get(1)?,
                    redundancy: r.get::<_, u32>(2)?.max(1),
                };
                Ok((r.get(0)?, copies, r.get(3)?))
            })?
            .collect::<crate::sql::Result<_>>()?
        };
        if waiting.is_empty() {
            return Ok(0);
        }
        let online: HashMap<PeerId, (String, u32)> = {
            let mut stmt = tx.prepare(
                "SELECT id, addr, cores FROM peers \
                 WHERE state = 'online' AND lease_expires_at >= ?1 AND draining = 0",
            )?;
            stmt.query_map([now], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))?
                .collect::<crate::sql::Result<_>>()?
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
            .collect::<crate::sql::Result<_>>()?
        };
        let cores: f64 = online.values().map(|(_, c)| f64::from(*c)).sum();
        let capacity = inner.config.overload_factor * cores;
        let (mut running, mut active): (i64, i64) = tx.query_row(
            "SELECT coalesce(sum((nprocs - exited) * redundancy), 0), count(*) FROM jobs \
             WHERE state = 'active'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        // Two-level placement (Fig. 6.1): a job that fits a cluster goes
        // to one, chosen by DHHT over the clusters; flat without clusters.
        let table = crate::jobs::two_level(&tx, &self.place, inner)?;
        // Each owner's standing: disabled, process quota (0: none), and
        // processes of its active jobs.
        let mut owners: HashMap<i64, (bool, u32, u64)> = HashMap::new();
        let mut placed = 0;
        for (job, copies, owner) in waiting {
            // Every copy is a process that runs (and counts against quotas).
            let nprocs = copies.slots();
            let (disabled, quota, used) = match owners.entry(owner) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let quota = users::quotas_of(&tx, &inner.config, owner)?.max_processes;
                    let disabled: bool = tx
                        .query_row("SELECT disabled FROM users WHERE id = ?1", [owner], |r| {
                            r.get(0)
                        })
                        .optional()?
                        .unwrap_or(true);
                    let used = u64::from(users::usage_of(&tx, owner)?.processes);
                    e.insert((disabled, quota, used))
                }
            };
            // Why the owner's standing holds the job back, told once per reason.
            let why = if *disabled {
                Some((
                    "disabled",
                    "waiting: your account is disabled; an administrator can enable it".to_string(),
                ))
            } else if *quota > 0 && nprocs > *quota {
                Some((
                    "too large",
                    format!(
                        "waiting: this job has {nprocs} processes and your quota now allows {quota} at once; it cannot start unless an administrator raises the quota (kill it to run it with fewer)"
                    ),
                ))
            } else if *quota > 0 && *used + u64::from(nprocs) > u64::from(*quota) {
                Some((
                    "in use",
                    format!(
                        "waiting: your jobs run {used} processes and your quota allows {quota} at once; this job starts when enough of them end"
                    ),
                ))
            } else {
                None
            };
            if let Some((reason, text)) = why {
                if self.place.quota_waits.insert(job, reason) != Some(reason) {
                    tracing::info!(job, "{text}");
                    db::insert_event(&tx, job, None, None, &JobEventKind::Status { text }, now)?;
                    fx.jobs.insert(job);
                }
                continue;
            }
            if active > 0 && (running + i64::from(nprocs)) as f64 > capacity {
                tracing::debug!(job, running, capacity, "job waits: the peers are loaded");
                break;
            }
            match place_job(
                &tx,
                &mut self.place,
                &table,
                inner,
                fx,
                &online,
                &mut room,
                job,
                copies,
                now,
            )? {
                Placing::Placed => {}
                // Later jobs may fit where this one does not (yet).
                Placing::NoMemory | Placing::NoVolunteers => continue,
                Placing::NoPeer => break,
            }
            self.place.quota_waits.remove(&job);
            *used += u64::from(nprocs);
            running += i64::from(nprocs);
            active += 1;
            placed += 1;
        }
        tx.commit()?;
        Ok(placed)
    }
}

/// What a peer may still take under its memory budget, and the budget.
#[derive(Debug, Clone, Copy)]
pub(super) struct Room {
    free: u64,
    budget: u64,
}

/// What became of a job the scheduler tried to place.
pub(super) enum Placing {
    Placed,
    /// No usable peer: neither this job nor a later one can be placed now.
    NoPeer,
    /// A peer lacks the memory for its share: the job waits (or failed,
    /// when it would not fit even on an idle peer); later ones may fit.
    NoMemory,
    /// With redundancy: the peers that can take work belong to too few
    /// volunteers for the twin rule ([`crate::twins`]); the job waits,
    /// later ones may fit.
    NoVolunteers,
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

pub(super) const MIB: u64 = 1 << 20;

/// Memory admission at submission (issue 20, finding 1): the estimated
/// footprint of one process of a job of program `hash`, refusing a job
/// that could not fit in the budgets of all online peers together (when
/// every one of them has a budget).
pub(super) fn admit_memory(
    tx: &Connection,
    hash: &str,
    nprocs: u32,
    replicas: u32,
) -> Result<u64, Error> {
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
        "SELECT coalesce(sum(budget_bytes), 0), count(*) FILTER (WHERE budget_bytes = 0), count(*) \
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

/// Places one job: a golden index per process, its peers by two-level
/// DHHT lookup in `table` (one cluster, if the job fits one; the flat DHHT
/// when no clusters are known), placements stored, the job active,
/// `StartJob` queued for each of its peers. Returns false if no peer could
/// take it. With redundancy the job's *slots* (every copy of every pid)
/// are placed like the processes of an ordinary job, then the twin rule
/// is repaired ([`twins::repair`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn place_job(
    tx: &Transaction<'_>,
    place: &mut Place,
    table: &placement::TwoLevel,
    inner: &Inner,
    fx: &mut Effects,
    online: &HashMap<PeerId, (String, u32)>,
    room: &mut HashMap<PeerId, Room>,
    job: JobId,
    copies: Copies,
    now: i64,
) -> Result<Placing, Error> {
    let nprocs = copies.slots();
    let indices: Vec<u64> = (0..nprocs).map(|_| place.process_indices.alloc()).collect();
    let xs: Vec<placement::Position> = indices.iter().map(|&k| golden_position(k)).collect();
    let placed = table
        .place_job(job_position(job), &xs)
        .filter(|p| p.owners.iter().all(|o| online.contains_key(o)));
    let Some(placed) = placed else {
        for k in indices {
            place.process_indices.free(k);
        }
        tracing::warn!(job, "the placement table has no usable peer; the job waits");
        return Ok(Placing::NoPeer);
    };
    debug_assert_eq!(placed.owners.len(), nprocs as usize);
    // The twin rule: copies of a pid on peers of different volunteers,
    // chosen among the peers that take work (those in the DHHT), by power.
    let candidates: Vec<(PeerId, f64)> = place
        .dhht
        .peers()
        .filter(|p| online.contains_key(&p.id))
        .map(|p| (p.id, p.weight))
        .collect();
    let vol = if copies.redundancy > 1 {
        Volunteers::load(tx, candidates.iter().map(|&(p, _)| p))?
    } else {
        Volunteers::default()
    };
    let mut first_owners = placed.owners.clone();
    if let Err(too_few) = twins::repair(job, copies, &mut first_owners, &candidates, &vol) {
        for k in indices {
            place.process_indices.free(k);
        }
        if place.volunteer_waits.insert(job) {
            let text = format!(
                "waiting for volunteers: with redundancy {r}, {too_few}; it starts once peers of \
                 {r} volunteers are online (volunteers enroll peers with `bspweb token create`), \
                 or kill it and submit it with redundancy 1",
                r = copies.redundancy
            );
            tracing::info!(job, "{text}");
            db::insert_event(tx, job, None, None, &JobEventKind::Status { text }, now)?;
            fx.jobs.insert(job);
        }
        return Ok(Placing::NoVolunteers);
    }
    place.volunteer_waits.remove(&job);
    // Every peer must have the memory for its share (issue 20, finding 1).
    let proc_bytes: i64 =
        tx.query_row("SELECT proc_bytes FROM jobs WHERE id = ?1", [job], |r| {
            r.get(0)
        })?;
    let proc_bytes = u64::try_from(proc_bytes).unwrap_or(0);
    // The peer of `owners` that lacks the memory for its share, if any.
    let short_of = |owners: &[PeerId]| {
        let mut shares: BTreeMap<PeerId, u64> = BTreeMap::new();
        for &peer in owners {
            *shares.entry(peer).or_default() += 1;
        }
        shares.into_iter().find_map(|(peer, n)| {
            let need = n.saturating_mul(proc_bytes);
            room.get(&peer)
                .filter(|r| need > r.free)
                .map(|r| (peer, n, need, *r))
        })
    };
    let first_short = short_of(&first_owners);
    // A job placed in one cluster whose peers lack the memory now may go
    // to the next cluster it fits, in the top ring's order.
    let mut owners = first_owners;
    let mut elsewhere = None;
    let mut never = first_short.is_some_and(|(_, _, need, r)| need > r.budget);
    if first_short.is_some() && placed.blocks.len() == 1 {
        let fits = table.fitting_clusters(job_position(job), xs.len());
        for cluster in fits.into_iter().skip(1) {
            let other: Option<Vec<PeerId>> = xs
                .iter()
                .map(|&x| {
                    table
                        .lookup_within(cluster, job_position(job), x)
                        .filter(|p| online.contains_key(p))
                })
                .collect();
            let Some(mut other) = other else { continue };
            if twins::repair(job, copies, &mut other, &candidates, &vol).is_err() {
                continue;
            }
            match short_of(&other) {
                None => {
                    owners = other;
                    elsewhere = Some(cluster.map(str::to_string));
                    break;
                }
                Some((_, _, need, r)) => never &= need > r.budget,
            }
        }
    }
    let short = if elsewhere.is_some() {
        None
    } else {
        first_short
    };
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
        if need > r.budget && never {
            // It would not fit on that peer even with nothing else running
            // (nor in any other cluster it fits).
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
    for peer in &owners {
        if let Some(r) = room.get_mut(peer) {
            r.free = r.free.saturating_sub(proc_bytes);
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
    // Replica-only peers keep every process's checkpoints: peers with the
    // memory for a process's worth first (a peer without a budget has it),
    // the others only if those are too few.
    let roomy: std::collections::BTreeSet<PeerId> = online
        .keys()
        .copied()
        .filter(|p| room.get(p).is_none_or(|r| r.free >= proc_bytes))
        .collect();
    epoch::top_up_replicas(job, &mut peers, replicas, &roomy);
    let candidates = online.keys().copied().collect();
    epoch::top_up_replicas(job, &mut peers, replicas, &candidates);
    epoch::set_job_peers(tx, job, &peers)?;
    {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO placements (job, pid, peer_id, position) VALUES (?1, ?2, ?3, ?4)",
        )?;
        // One row per slot: `pid` holds `copy * nprocs + pid`.
        for (slot, (&peer, &k)) in owners.iter().zip(&indices).enumerate() {
            stmt.execute(params![job, slot as i64, peer, u64_to_sql(k)])?;
        }
    }
    let job_token = hex::encode(rand::random::<[u8; 32]>());
    tx.execute(
        "UPDATE jobs SET state = 'active', started_at = ?2, job_token = ?3, epoch = 0 WHERE id = ?1",
        params![job, now, job_token],
    )?;
    list_changed(tx, fx, job)?;
    let mut text = if copies.redundancy > 1 {
        let n = copies.nprocs;
        format!(
            "placed {n} process{} × {} copies on {hosts} peers of {} volunteers",
            if n == 1 { "" } else { "es" },
            copies.redundancy,
            vol.count(peers[..hosts].iter().copied()),
        )
    } else {
        format!(
            "placed {nprocs} process{} on {hosts} peer{}",
            if nprocs == 1 { "" } else { "es" },
            if hosts == 1 { "" } else { "s" }
        )
    };
    match &elsewhere {
        Some(cluster) => text.push_str(&format!(
            " in cluster {} (the first choice lacked the memory)",
            cluster.as_deref().unwrap_or("of peers without one")
        )),
        None => text.push_str(&blocks_phrase(&placed.blocks)),
    }
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

/// " in cluster a" or " across clusters a (pids 0–7), b (pids 8–11)": where
/// two-level placement put a job, for its status line (empty without
/// clusters).
fn blocks_phrase(blocks: &[placement::Block]) -> String {
    let named: Vec<(&str, &std::ops::Range<usize>)> = blocks
        .iter()
        .filter_map(|b| Some((b.cluster.as_deref()?, &b.pids)))
        .collect();
    match named.as_slice() {
        [] => String::new(),
        [(c, _)] if blocks.len() == 1 => format!(" in cluster {c}"),
        _ => {
            let parts: Vec<String> = blocks
                .iter()
                .map(|b| {
                    let pids = if b.pids.len() == 1 {
                        format!("pid {}", b.pids.start)
                    } else {
                        format!("pids {}–{}", b.pids.start, b.pids.end - 1)
                    };
                    format!("{} ({pids})", b.cluster.as_deref().unwrap_or("no cluster"))
                })
                .collect();
            format!(" across clusters {}", parts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_say_where_the_blocks_went() {
        let block = |c: Option<&str>, pids| placement::Block {
            cluster: c.map(String::from),
            pids,
        };
        assert_eq!(blocks_phrase(&[]), "");
        assert_eq!(blocks_phrase(&[block(None, 0..4)]), "");
        assert_eq!(blocks_phrase(&[block(Some("a"), 0..4)]), " in cluster a");
        assert_eq!(
            blocks_phrase(&[block(Some("a"), 0..8), block(None, 8..9)]),
            " across clusters a (pids 0–7), no cluster (pid 8)"
        );
    }
}
