//! A peer's report: output, progress, exits, aborts, failures, handovers
//! and suspected peers, applied in order in one transaction.

use super::redundancy::{self, Offer, Verdict};
use super::*;
use crate::twins::Copies;

/// Disagreements one report may carry that are judged; more are ignored
/// (a peer reports each once, and few at a time).
const MAX_VERDICTS_PER_REPORT: usize = 64;

/// What becomes of an offered copy of an output record or exit: a verdict
/// (made by `verdict`) when its versions differ, queued with the report's
/// others; whether the copy is to be published now.
fn settle_offer(
    offer: Offer,
    verdicts: &mut Vec<Verdict>,
    verdict: impl FnOnce(Vec<Vec<PeerId>>) -> Result<Verdict, Error>,
) -> Result<bool, Error> {
    let (groups, publish) = match offer {
        Offer::Held | Offer::Dropped => return Ok(false),
        Offer::Agreed { groups } => (groups, true),
        Offer::Disagree { groups } => (groups, false),
    };
    if groups.len() > 1 && verdicts.len() < MAX_VERDICTS_PER_REPORT {
        verdicts.push(verdict(groups)?);
    }
    Ok(publish)
}

/// What a report handler knows about a job the reporting peer may touch.
pub(super) struct ReportJob {
    active: bool,
    owner: i64,
    nprocs: u32,
    /// Copies of each process (1: no validation).
    redundancy: u32,
    /// The job's output limit per process, in MiB.
    output_mib: u32,
    /// The job's current epoch.
    epoch: u64,
    /// The processes, indexed by slot (`copy * nprocs + pid`).
    placement: Vec<epoch::Placed>,
}

impl ReportJob {
    fn copies(&self) -> Copies {
        Copies {
            nprocs: self.nprocs,
            redundancy: self.redundancy,
        }
    }

    /// The slot of `pid` whose row satisfies `f`. Peers speak of pids;
    /// a peer never runs two copies of one pid ([`crate::twins`]), so its
    /// pid names one slot.
    fn slot_where(&self, pid: Pid, f: impl Fn(&epoch::Placed) -> bool) -> Option<u32> {
        if pid >= self.nprocs {
            return None;
        }
        self.copies()
            .slots_of(pid)
            .find(|&s| self.placement.get(s as usize).is_some_and(&f))
    }

    /// The slot of `pid` that `peer` hosts, or else still hands over.
    fn slot_run_by(&self, pid: Pid, peer: PeerId) -> Option<u32> {
        self.slot_where(pid, |p| p.peer == peer)
            .or_else(|| self.slot_where(pid, |p| p.is_run_by(peer)))
    }

    /// The slot of `pid` that `peer` hosts now.
    fn slot_hosted_by(&self, pid: Pid, peer: PeerId) -> Option<u32> {
        self.slot_where(pid, |p| p.peer == peer)
    }
}

/// The lowest superstep the copies of `pid` have reported reaching.
fn pid_superstep(tx: &Connection, job: JobId, copies: Copies, pid: Pid) -> Result<u32, Error> {
    let mut stmt =
        tx.prepare_cached("SELECT superstep FROM placements WHERE job = ?1 AND pid = ?2")?;
    let mut low: Option<u32> = None;
    for slot in copies.slots_of(pid) {
        let s: Option<u32> = stmt
            .query_row(params![job, slot], |r| r.get(0))
            .optional()?;
        low = match (low, s) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(low.unwrap_or(0))
}

/// The JSON of an event, as held copies are compared.
fn event_json(kind: &JobEventKind) -> Result<String, Error> {
    serde_json::to_string(kind).map_err(|e| Error::Internal(format!("event payload: {e}")))
}

impl Core {
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
        // Disagreements reported or found, judged once every event applied.
        let mut verdicts: Vec<Verdict> = Vec::new();
        // Output bytes each owner's jobs store, once a record needed it.
        let mut owner_stored: HashMap<i64, i64> = HashMap::new();
        // Each owner's output quota in MiB (0: none), once needed.
        let mut owner_quota: HashMap<i64, u64> = HashMap::new();
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
                | PeerEvent::PeerUnreachable { job, .. }
                | PeerEvent::Disagreement { job, .. } => *job,
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
            // The host of a copy of `pid`, or its old host while it hands
            // it over.
            let own = |pid: Pid| ctx.slot_run_by(pid, peer).is_some();
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
                    let bytes = db::output_bytes(&kind).map_or(0, |b| b.len() as i64);
                    // With redundancy, only what copies of two volunteers
                    // agree on reaches the user.
                    if ctx.redundancy > 1 {
                        let limit = i64::from(ctx.output_mib).saturating_mul(1 << 20);
                        let offer = redundancy::offer_copy(
                            &tx,
                            job,
                            pid,
                            seq,
                            peer,
                            &event_json(&kind)?,
                            bytes,
                            limit,
                            ctx.redundancy,
                            now,
                        )?;
                        let publish = settle_offer(offer, &mut verdicts, |groups| {
                            Ok(Verdict {
                                job,
                                pid,
                                superstep: pid_superstep(&tx, job, ctx.copies(), pid)?,
                                groups,
                                what: format!("output record {seq}"),
                                reporter: None,
                            })
                        })?;
                        if !publish {
                            continue;
                        }
                    }
                    // The owner's storage quota (issue 20, finding 4; 0: none).
                    let stored = match owner_stored.get(&ctx.owner) {
                        Some(&s) => s,
                        None => tx.query_row(
                            "SELECT coalesce(sum(output_bytes), 0) FROM jobs WHERE owner = ?1",
                            [ctx.owner],
                            |r| r.get(0),
                        )?,
                    };
                    let quota_mib = match owner_quota.get(&ctx.owner) {
                        Some(&q) => q,
                        None => {
                            let q = users::quotas_of(&tx, &inner.config, ctx.owner)?.max_output_mib;
                            owner_quota.insert(ctx.owner, q);
                            q
                        }
                    };
                    let quota = match quota_mib {
                        0 => i64::MAX,
                        mib => i64::try_from(mib)
                            .unwrap_or(i64::MAX)
                            .saturating_mul(1 << 20),
                    };
                    if stored.saturating_add(bytes) > quota {
                        let reason = format!(
                            "out of storage: the output of your jobs takes {:.1} MiB and your quota is {} MiB; dispose of finished jobs you no longer need (`bspweb dispose JOB`, or in the web UI) and run this one again, or ask an administrator for a larger quota",
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
                        fx.counts.add(Counter::OutputBytes, bytes.max(0) as u64);
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
                    let Some(slot) = ctx.slot_hosted_by(pid, peer) else {
                        continue;
                    };
                    let before: Option<u32> = tx
                        .prepare_cached(
                            "SELECT superstep FROM placements \
                             WHERE job = ?1 AND pid = ?2 AND peer_id = ?3",
                        )?
                        .query_row(params![job, slot, peer], |r| r.get(0))
                        .optional()?;
                    let Some(before) = before else { continue };
                    tx.prepare_cached(
                        "UPDATE placements SET superstep = ?3 \
                         WHERE job = ?1 AND pid = ?2 AND peer_id = ?4",
                    )?
                    .execute(params![job, slot, superstep, peer])?;
                    // Supersteps re-executed after a restore count again:
                    // they were computed again.
                    fx.counts.add(
                        Counter::Supersteps,
                        u64::from(superstep.saturating_sub(before)),
                    );
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
                    from_start,
                    ..
                } => {
                    let Some(p) = ctx
                        .slot_hosted_by(pid, peer)
                        .and_then(|s| ctx.placement.get(s as usize))
                    else {
                        tracing::info!(
                            peer,
                            job,
                            pid,
                            "ignoring the restore report of a process this peer does not host"
                        );
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
                    let counter = match (kind, from_start) {
                        (epoch::MoveKind::Lost, true) => Counter::RestoresFromStart,
                        (epoch::MoveKind::Lost, false) => Counter::RestoresFromCheckpoint,
                        (epoch::MoveKind::Migrate, _) => Counter::Migrations,
                    };
                    let kind = match kind {
                        epoch::MoveKind::Lost => JobEventKind::ProcessRolledBack {
                            superstep,
                            from_start,
                        },
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
                        fx.counts.add(counter, 1);
                    }
                }
                PeerEvent::ProcessHandedOver { pid, epoch: at, .. } => {
                    let Some(slot) =
                        placement::epochs::handover_slot(&ctx.placement, ctx.nprocs, peer, pid, at)
                    else {
                        tracing::info!(
                            peer,
                            job,
                            pid,
                            epoch = at,
                            "ignoring a handover report of a stale epoch or host"
                        );
                        continue;
                    };
                    let Some(p) = ctx.placement.get_mut(slot as usize) else {
                        continue;
                    };
                    tx.execute(
                        "UPDATE placements SET handed_over = 1 WHERE job = ?1 AND pid = ?2",
                        params![job, slot],
                    )?;
                    p.handed_over = true;
                    handed_over = true;
                    fx.jobs.insert(job);
                }
                PeerEvent::ProcessExited { pid, superstep, .. } => {
                    let Some(slot) = ctx.slot_run_by(pid, peer) else {
                        tracing::warn!(
                            peer,
                            job,
                            pid,
                            "ignoring the exit of a process not placed on this peer"
                        );
                        continue;
                    };
                    tx.prepare_cached(
                        "UPDATE placements SET superstep = ?3 WHERE job = ?1 AND pid = ?2",
                    )?
                    .execute(params![job, slot, superstep])?;
                    let kind = JobEventKind::ProcessExited { superstep };
                    // With redundancy, a process exits once copies of two
                    // volunteers exited alike.
                    if ctx.redundancy > 1 {
                        let known = tx
                            .prepare_cached(
                                "SELECT 1 FROM events WHERE job = ?1 AND pid = ?2 AND seq = -1",
                            )?
                            .exists(params![job, pid])?;
                        if known {
                            continue;
                        }
                        let offer = redundancy::offer_copy(
                            &tx,
                            job,
                            pid,
                            -1,
                            peer,
                            &event_json(&kind)?,
                            0,
                            i64::MAX,
                            ctx.redundancy,
                            now,
                        )?;
                        let publish = settle_offer(offer, &mut verdicts, |groups| {
                            Ok(Verdict {
                                job,
                                pid,
                                superstep,
                                groups,
                                what: "its exit".into(),
                                reporter: None,
                            })
                        })?;
                        if !publish {
                            continue;
                        }
                    }
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
                        // With redundancy, an output record only one copy
                        // delivered (or that the copies disagree on, and no
                        // third run could decide: a copy restored from a
                        // checkpoint does not print again what came before
                        // it) was never published: the job's output is
                        // incomplete, and says so instead of exiting.
                        let unmatched = if ctx.redundancy > 1 {
                            redundancy::unmatched_output(&tx, job)?
                        } else {
                            None
                        };
                        let ending = match unmatched {
                            None => Ending {
                                outcome: JobOutcome::Exited,
                                error: None,
                                error_pid: None,
                                event: JobEventKind::JobExited,
                                // Peers keep checkpoint replicas until the job ends.
                                kill: Some("the job finished".into()),
                                skip_peer: None,
                            },
                            Some((pid, seq)) => {
                                let reason = format!(
                                    "the copies of pid {pid} never agreed on its output record {seq}, so it \
                                     was not published and the output is incomplete; run the job again"
                                );
                                Ending {
                                    outcome: JobOutcome::Failed,
                                    error: Some(reason.clone()),
                                    error_pid: Some(pid),
                                    event: JobEventKind::JobFailed { reason },
                                    kill: Some("the job failed".into()),
                                    skip_peer: None,
                                }
                            }
                        };
                        finish_job(&tx, &mut self.place, inner, fx, job, ending, now)?;
                        ctx.active = false;
                    }
                }
                PeerEvent::Disagreement {
                    pid,
                    superstep,
                    groups,
                    what,
                    ..
                } => {
                    // Checked and judged once the report is applied.
                    if verdicts.len() < MAX_VERDICTS_PER_REPORT {
                        verdicts.push(Verdict {
                            job,
                            pid,
                            superstep,
                            groups,
                            what,
                            reporter: Some(peer),
                        });
                    } else {
                        tracing::debug!(
                            peer,
                            job,
                            pid,
                            "ignoring a disagreement: too many in one report"
                        );
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
        // Quarantines and third runs change epochs (of other jobs too), so
        // they come after the events that were about the epochs as
        // reported.
        for v in &verdicts {
            redundancy::judge(&tx, &mut self.place, inner, fx, v, now)?;
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
}

pub(super) fn load_report_job(
    tx: &Connection,
    job: JobId,
    peer: PeerId,
) -> Result<Option<ReportJob>, Error> {
    #[allow(clippy::type_complexity)]
    let row: Option<(String, u32, i64, i64, u32, u32)> = tx
        .query_row(
            "SELECT state, nprocs, epoch, owner, redundancy, output_mib FROM jobs WHERE id = ?1",
            [job],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            },
        )
        .optional()?;
    let Some((state, nprocs, epoch, owner, redundancy, output_mib)) = row else {
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
        redundancy: redundancy.max(1),
        output_mib,
        epoch: u64_from_sql(epoch),
        placement,
    }))
}
