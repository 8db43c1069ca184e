//! A peer's report: output, progress, exits, aborts, failures, handovers
//! and suspected peers, applied in order in one transaction.

use super::redundancy::{self, Offer, Verdict};
use super::*;
use crate::twins::Copies;

mod events;

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
    /// Each kind of event has its own function (`report/events.rs`).
    pub(crate) fn report(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        peer: PeerId,
        events: Vec<PeerEvent>,
        now: i64,
    ) -> Result<Vec<Suspect>, Error> {
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
        let mut r = events::Reporting {
            tx: &tx,
            place: &mut self.place,
            inner,
            fx: &mut *fx,
            peer,
            now,
            handed_over: false,
            suspects: Vec::new(),
            verdicts: Vec::new(),
            owner_stored: HashMap::new(),
            owner_quota: HashMap::new(),
        };
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
            r.apply(ctx, job, event)?;
        }
        let events::Reporting {
            handed_over,
            suspects,
            verdicts,
            ..
        } = r;
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
