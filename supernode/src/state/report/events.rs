//! A report's events, one function each (`Core::report` applies them in
//! order, in one transaction).

use super::*;

/// One report being applied: what its events share.
pub(super) struct Reporting<'a> {
    pub(super) tx: &'a Connection,
    pub(super) place: &'a mut Place,
    pub(super) inner: &'a Inner,
    pub(super) fx: &'a mut Effects,
    /// The reporting peer.
    pub(super) peer: PeerId,
    pub(super) now: i64,
    /// Whether a process was handed over (drains may settle).
    pub(super) handed_over: bool,
    /// Peers others lost their links to.
    pub(super) suspects: Vec<Suspect>,
    /// Disagreements reported or found, judged once every event applied.
    pub(super) verdicts: Vec<Verdict>,
    /// Output bytes each owner's jobs store, once a record needed it.
    pub(super) owner_stored: HashMap<i64, i64>,
    /// Each owner's output quota in MiB (0: none), once needed.
    pub(super) owner_quota: HashMap<i64, u64>,
}

impl Reporting<'_> {
    /// Ends `job` as `ending` says; its later events are ignored.
    fn end(&mut self, ctx: &mut ReportJob, job: JobId, ending: Ending) -> Result<(), Error> {
        finish_job(
            self.tx, self.place, self.inner, self.fx, job, ending, self.now,
        )?;
        ctx.active = false;
        Ok(())
    }

    /// Applies `event` about `job` (described by `ctx`, active).
    pub(super) fn apply(
        &mut self,
        ctx: &mut ReportJob,
        job: JobId,
        event: PeerEvent,
    ) -> Result<(), Error> {
        match event {
            PeerEvent::Output {
                pid,
                seq,
                stream,
                data,
                ..
            } => self.output(ctx, job, pid, seq, stream, data),
            PeerEvent::Progress { pid, superstep, .. } => self.progress(ctx, job, pid, superstep),
            PeerEvent::PeerUnreachable { peer: suspect, .. } => self.unreachable(ctx, job, suspect),
            PeerEvent::Status { pid, text, .. } => self.status(ctx, job, pid, text),
            PeerEvent::ProcessRestored {
                pid,
                superstep,
                epoch: at,
                from_start,
                ..
            } => self.restored(ctx, job, pid, superstep, at, from_start),
            PeerEvent::ProcessHandedOver { pid, epoch: at, .. } => {
                self.handed_over(ctx, job, pid, at)
            }
            PeerEvent::ProcessExited { pid, superstep, .. } => {
                self.exited(ctx, job, pid, superstep)
            }
            PeerEvent::Disagreement {
                pid,
                superstep,
                groups,
                what,
                ..
            } => self.disagreement(ctx, job, pid, superstep, groups, what),
            PeerEvent::ProcessAborted {
                pid,
                superstep,
                reason,
                ..
            } => self.aborted(ctx, job, pid, superstep, reason),
            PeerEvent::ProcessFailed {
                pid,
                superstep,
                reason,
                ..
            } => self.failed(ctx, job, pid, superstep, reason),
        }
    }

    /// An output record of a process this peer runs: stored once (with redundancy, once copies of two volunteers agree), within the owner's storage quota.
    fn output(
        &mut self,
        ctx: &mut ReportJob,
        job: JobId,
        pid: Pid,
        seq: u64,
        stream: Stream,
        data: String,
    ) -> Result<(), Error> {
        let (tx, peer, now, inner) = (self.tx, self.peer, self.now, self.inner);
        if ctx.slot_run_by(pid, peer).is_none() {
            tracing::warn!(
                peer,
                job,
                pid,
                "ignoring output of a process not placed on this peer"
            );
            return Ok(());
        }
        let Ok(seq) = i64::try_from(seq) else {
            tracing::warn!(
                peer,
                job,
                pid,
                seq,
                "ignoring output with an impossible sequence number"
            );
            return Ok(());
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
                    return Ok(());
                }
                JobEventKind::Raw { data }
            }
        };
        // A record stored before (a retried report) is not
        // stored or counted again.
        let known = tx
            .prepare_cached("SELECT 1 FROM events WHERE job = ?1 AND pid = ?2 AND seq = ?3")?
            .exists(params![job, pid, seq])?;
        if known {
            return Ok(());
        }
        let bytes = db::output_bytes(&kind).map_or(0, |b| b.len() as i64);
        // With redundancy, only what copies of two volunteers
        // agree on reaches the user.
        if ctx.redundancy > 1 {
            let limit = i64::from(ctx.output_mib).saturating_mul(1 << 20);
            let offer = redundancy::offer_copy(
                tx,
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
            let publish = settle_offer(offer, &mut self.verdicts, |groups| {
                Ok(Verdict {
                    job,
                    pid,
                    superstep: pid_superstep(tx, job, ctx.copies(), pid)?,
                    groups,
                    what: format!("output record {seq}"),
                    reporter: None,
                })
            })?;
            if !publish {
                return Ok(());
            }
        }
        // The owner's storage quota (issue 20, finding 4; 0: none).
        let stored = match self.owner_stored.get(&ctx.owner) {
            Some(&s) => s,
            None => tx.query_row(
                "SELECT coalesce(sum(output_bytes), 0) FROM jobs WHERE owner = ?1",
                [ctx.owner],
                |r| r.get(0),
            )?,
        };
        let quota_mib = match self.owner_quota.get(&ctx.owner) {
            Some(&q) => q,
            None => {
                let q = users::quotas_of(tx, &inner.config, ctx.owner)?.max_output_mib;
                self.owner_quota.insert(ctx.owner, q);
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
            let ending = Ending::failed(reason, None, "the job's owner is out of storage");
            self.end(ctx, job, ending)?;
            return Ok(());
        }
        if db::insert_event(tx, job, Some(pid), Some(seq), &kind, now)?.is_some() {
            self.fx.jobs.insert(job);
            self.fx
                .counts
                .add(Counter::OutputBytes, bytes.max(0) as u64);
            tx.prepare_cached("UPDATE jobs SET output_bytes = output_bytes + ?2 WHERE id = ?1")?
                .execute(params![job, bytes])?;
            self.owner_stored.insert(ctx.owner, stored + bytes);
        } else {
            self.owner_stored.insert(ctx.owner, stored);
        }
        Ok(())
    }

    /// A process passed `superstep` on its current host.
    fn progress(
        &mut self,
        ctx: &mut ReportJob,
        job: JobId,
        pid: Pid,
        superstep: u32,
    ) -> Result<(), Error> {
        let (tx, peer) = (self.tx, self.peer);
        // Only the process's current host speaks for it: a
        // migrating process's old host may still report.
        let Some(slot) = ctx.slot_hosted_by(pid, peer) else {
            return Ok(());
        };
        let before: Option<u32> = tx
            .prepare_cached(
                "SELECT superstep FROM placements \
                 WHERE job = ?1 AND pid = ?2 AND peer_id = ?3",
            )?
            .query_row(params![job, slot, peer], |r| r.get(0))
            .optional()?;
        let Some(before) = before else {
            return Ok(());
        };
        tx.prepare_cached(
            "UPDATE placements SET superstep = ?3 \
             WHERE job = ?1 AND pid = ?2 AND peer_id = ?4",
        )?
        .execute(params![job, slot, superstep, peer])?;
        // Supersteps re-executed after a restore count again:
        // they were computed again.
        self.fx.counts.add(
            Counter::Supersteps,
            u64::from(superstep.saturating_sub(before)),
        );
        Ok(())
    }

    /// This peer lost its link to `suspect`: the supernode checks it (`crate::suspect`).
    fn unreachable(
        &mut self,
        _ctx: &mut ReportJob,
        job: JobId,
        suspect: PeerId,
    ) -> Result<(), Error> {
        let (tx, peer) = (self.tx, self.peer);
        if suspect == peer || self.suspects.iter().any(|s: &Suspect| s.peer == suspect) {
            return Ok(());
        }
        if !epoch::job_peers(tx, job)?.contains(&suspect) {
            tracing::debug!(
                peer,
                job,
                suspect,
                "ignoring a suspicion of a peer not in the job"
            );
            return Ok(());
        }
        let addr: Option<String> = tx
            .query_row(
                "SELECT addr FROM peers WHERE id = ?1 AND state = 'online'",
                [suspect],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(addr) = addr {
            self.suspects.push(Suspect {
                peer: suspect,
                addr,
                why: SuspectWhy::LinkLost { job, by: peer },
            });
        }
        Ok(())
    }

    /// A status line for the job's events.
    fn status(
        &mut self,
        ctx: &mut ReportJob,
        job: JobId,
        pid: Option<Pid>,
        text: String,
    ) -> Result<(), Error> {
        let (tx, now) = (self.tx, self.now);
        if pid.is_some_and(|p| p >= ctx.nprocs) {
            return Ok(());
        }
        let kind = JobEventKind::Status {
            text: truncate(&text, MAX_REASON_CHARS),
        };
        db::insert_event(tx, job, pid, None, &kind, now)?;
        self.fx.jobs.insert(job);
        Ok(())
    }

    /// A moved process was restored (or migrated) on this peer: one event per move.
    fn restored(
        &mut self,
        ctx: &mut ReportJob,
        job: JobId,
        pid: Pid,
        superstep: u32,
        at: u64,
        from_start: bool,
    ) -> Result<(), Error> {
        let (tx, peer, now) = (self.tx, self.peer, self.now);
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
            return Ok(());
        };
        let (Some(moved), Some(kind)) = (p.moved_epoch, p.moved_kind) else {
            tracing::warn!(
                peer,
                job,
                pid,
                "ignoring the restore of a process that never moved"
            );
            return Ok(());
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
            return Ok(());
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
        if db::insert_event(tx, job, Some(pid), Some(seq), &kind, now)?.is_some() {
            self.fx.jobs.insert(job);
            self.fx.counts.add(counter, 1);
        }
        Ok(())
    }

    /// This peer handed a migrating process over to its new host.
    fn handed_over(
        &mut self,
        ctx: &mut ReportJob,
        job: JobId,
        pid: Pid,
        at: u64,
    ) -> Result<(), Error> {
        let (tx, peer) = (self.tx, self.peer);
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
            return Ok(());
        };
        let Some(p) = ctx.placement.get_mut(slot as usize) else {
            return Ok(());
        };
        tx.execute(
            "UPDATE placements SET handed_over = 1 WHERE job = ?1 AND pid = ?2",
            params![job, slot],
        )?;
        p.handed_over = true;
        self.handed_over = true;
        self.fx.jobs.insert(job);
        Ok(())
    }

    /// A process returned from `main`: the job exits when all have (with redundancy, once copies of two volunteers exited alike).
    fn exited(
        &mut self,
        ctx: &mut ReportJob,
        job: JobId,
        pid: Pid,
        superstep: u32,
    ) -> Result<(), Error> {
        let (tx, peer, now) = (self.tx, self.peer, self.now);
        let Some(slot) = ctx.slot_run_by(pid, peer) else {
            tracing::warn!(
                peer,
                job,
                pid,
                "ignoring the exit of a process not placed on this peer"
            );
            return Ok(());
        };
        tx.prepare_cached("UPDATE placements SET superstep = ?3 WHERE job = ?1 AND pid = ?2")?
            .execute(params![job, slot, superstep])?;
        let kind = JobEventKind::ProcessExited { superstep };
        // With redundancy, a process exits once copies of two
        // volunteers exited alike.
        if ctx.redundancy > 1 {
            let known = tx
                .prepare_cached("SELECT 1 FROM events WHERE job = ?1 AND pid = ?2 AND seq = -1")?
                .exists(params![job, pid])?;
            if known {
                return Ok(());
            }
            let offer = redundancy::offer_copy(
                tx,
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
            let publish = settle_offer(offer, &mut self.verdicts, |groups| {
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
                return Ok(());
            }
        }
        // seq -1: a process exits once, however often it is
        // reported (a restored process re-executes and exits again).
        if db::insert_event(tx, job, Some(pid), Some(-1), &kind, now)?.is_none() {
            return Ok(());
        }
        self.fx.jobs.insert(job);
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
                redundancy::unmatched_output(tx, job)?
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
                    Ending::failed(reason, Some(pid), "the job failed")
                }
            };
            self.end(ctx, job, ending)?;
        }
        Ok(())
    }

    /// Copies of a process disagreed: judged once the report is applied.
    fn disagreement(
        &mut self,
        _ctx: &mut ReportJob,
        job: JobId,
        pid: Pid,
        superstep: u32,
        groups: Vec<Vec<PeerId>>,
        what: String,
    ) -> Result<(), Error> {
        let peer = self.peer;
        // Checked and judged once the report is applied.
        if self.verdicts.len() < MAX_VERDICTS_PER_REPORT {
            self.verdicts.push(Verdict {
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
        Ok(())
    }

    /// A process aborted: the job ends.
    fn aborted(
        &mut self,
        ctx: &mut ReportJob,
        job: JobId,
        pid: Pid,
        superstep: u32,
        reason: String,
    ) -> Result<(), Error> {
        let peer = self.peer;
        if ctx.slot_run_by(pid, peer).is_none() {
            tracing::warn!(
                peer,
                job,
                pid,
                "ignoring the abort of a process not placed on this peer"
            );
            return Ok(());
        }
        let reason = format!(
            "process {pid} aborted in superstep {superstep}: {}",
            truncate(&reason, MAX_REASON_CHARS)
        );
        let ending = Ending::aborted(reason, Some(pid), "another process of the job aborted");
        self.end(ctx, job, ending)?;
        Ok(())
    }

    /// A process (or the peer) failed the job: the job ends.
    fn failed(
        &mut self,
        ctx: &mut ReportJob,
        job: JobId,
        pid: Option<Pid>,
        superstep: u32,
        reason: String,
    ) -> Result<(), Error> {
        let peer = self.peer;
        if pid.is_some_and(|p| ctx.slot_run_by(p, peer).is_none()) {
            tracing::warn!(
                peer,
                job,
                ?pid,
                "ignoring the failure of a process not placed on this peer"
            );
            return Ok(());
        }
        let reason = truncate(&reason, MAX_REASON_CHARS);
        let reason = match pid {
            Some(pid) => {
                format!("process {pid} failed in superstep {superstep}: {reason}")
            }
            None => format!("peer #{peer} failed the job in superstep {superstep}: {reason}"),
        };
        let ending = Ending::failed(reason, pid, "another process of the job failed");
        self.end(ctx, job, ending)?;
        Ok(())
    }
}
