//! A user's jobs: submission, queries, kill, disposal, events, the ring.

use super::*;

impl Core {
    // ------------------------------------------------------------ jobs

    /// The DHHT ring as placement sees it, with the processes of `owner`'s
    /// active jobs. Shares are measured by looking up [`RING_SAMPLES`]
    /// evenly spaced points (error below 1/RING_SAMPLES).
    pub(crate) fn ring(&self, owner: i64) -> Result<RingInfo, Error> {
        let dhht = &self.place.dhht;
        let mut wins: HashMap<PeerId, u32> = HashMap::new();
        for i in 0..RING_SAMPLES {
            let x = placement::Position(((i as u64) << 50) | (1 << 49));
            if let Some(peer) = dhht.lookup(x) {
                *wins.entry(peer).or_default() += 1;
            }
        }
        let mut names: HashMap<PeerId, String> = HashMap::new();
        {
            let mut stmt = self
                .conn
                .prepare("SELECT id, name FROM peers WHERE state = 'online'")?;
            for row in stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))? {
                let (id, name) = row?;
                names.insert(id, name);
            }
        }
        let mut peers: Vec<RingPeer> = dhht
            .peers()
            .map(|p| RingPeer {
                id: p.id,
                name: names.get(&p.id).cloned().unwrap_or_default(),
                position: p.position.to_f64(),
                weight: p.weight,
                share: f64::from(wins.get(&p.id).copied().unwrap_or(0)) / f64::from(RING_SAMPLES),
            })
            .collect();
        peers.sort_by(|a, b| a.position.total_cmp(&b.position));
        let mut stmt = self.conn.prepare(
            "SELECT p.job, p.pid % j.nprocs, p.position, p.peer_id FROM placements p \
             JOIN jobs j ON j.id = p.job \
             WHERE j.state = 'active' AND j.owner = ?1 ORDER BY p.job, p.pid",
        )?;
        let processes = stmt
            .query_map([owner], |r| {
                Ok(RingProcess {
                    job: r.get(0)?,
                    pid: r.get(1)?,
                    position: golden_position(u64_from_sql(r.get(2)?)).to_f64(),
                    peer: r.get(3)?,
                })
            })?
            .collect::<crate::sql::Result<_>>()?;
        Ok(RingInfo { peers, processes })
    }

    pub(crate) fn submit(
        &mut self,
        inner: &Inner,
        owner: i64,
        job: NewJob,
        fx: &mut Effects,
        now: i64,
    ) -> Result<JobInfo, Error> {
        let tx = self.conn.transaction()?;
        let quota = users::quotas_of(&tx, &inner.config, owner)?.max_processes;
        // Every copy of a process runs, takes memory and counts.
        let redundancy = job.limits.redundancy.max(1);
        let copies = job.nprocs.saturating_mul(redundancy);
        if quota > 0 && copies > quota {
            let what = if redundancy > 1 {
                format!("{} processes × {redundancy} copies", job.nprocs)
            } else {
                format!("{} processes", job.nprocs)
            };
            return Err(Error::QuotaExceeded(format!(
                "the job has {what} and your quota allows {quota} processes at once; run it with fewer, or ask an administrator for a larger quota"
            )));
        }
        let hash = Self::resolve_program(&tx, owner, &job.program)?;
        let proc_bytes = admit_memory(&tx, &hash, copies, job.limits.replicas)?;
        let id: i64 = tx.query_row(
            "INSERT INTO jobs (owner, program, program_hash, nprocs, args, description, seed, \
                 superstep_ms, memory_mib, output_mib, state, submitted_at, checkpoint_every, replicas, \
                 proc_bytes, redundancy) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'waiting', ?11, ?12, ?13, ?14, ?15) RETURNING id",
            params![
                owner,
                job.program,
                hash,
                job.nprocs,
                job.args,
                job.description,
                u64_to_sql(job.seed),
                u64_to_sql(job.limits.superstep_ms),
                job.limits.memory_mib,
                job.limits.output_mib,
                now,
                job.limits.checkpoint_every,
                job.limits.replicas,
                u64_to_sql(proc_bytes),
                redundancy
            ],
            |r| r.get(0),
        )?;
        {
            let mut stmt =
                tx.prepare("INSERT INTO job_resources (job, name, data) VALUES (?1, ?2, ?3)")?;
            for (name, data) in &job.resources {
                stmt.execute(params![id, name, data])?;
            }
        }
        let info = db::job_info(&tx, id, None)?
            .ok_or_else(|| Error::Internal("a job vanished while it was submitted".into()))?;
        tx.commit()?;
        tracing::info!(job = id, owner, program = %job.program, nprocs = job.nprocs, "job submitted");
        fx.wake_scheduler = true;
        fx.job_list.push((owner, id));
        fx.counts.add(Counter::JobsSubmitted, 1);
        Ok(info)
    }

    /// The state of `owner`'s job `id`; `None` when there is no such job.
    pub(crate) fn job_state(&self, owner: i64, id: JobId) -> Result<Option<JobState>, Error> {
        job_state(&self.conn, owner, id)
    }

    /// The ids of `owner`'s jobs.
    pub(crate) fn job_ids(&self, owner: i64) -> Result<Vec<JobId>, Error> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id FROM jobs WHERE owner = ?1 ORDER BY id")?;
        let ids = stmt
            .query_map([owner], |r| r.get(0))?
            .collect::<crate::sql::Result<_>>()?;
        Ok(ids)
    }

    pub(crate) fn job(&self, owner: i64, id: JobId) -> Result<JobInfo, Error> {
        db::job_info(&self.conn, id, Some(owner))?.ok_or_else(|| no_job(id))
    }

    pub(crate) fn jobs(
        &self,
        owner: i64,
        state: Option<bsp_api::rest::JobState>,
    ) -> Result<Vec<JobInfo>, Error> {
        db::jobs_of(&self.conn, owner, state)
    }

    pub(crate) fn kill(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        owner: i64,
        id: JobId,
        now: i64,
    ) -> Result<JobInfo, Error> {
        let tx = self.conn.transaction()?;
        let state: Option<(String, Option<String>)> = tx
            .query_row(
                "SELECT state, outcome FROM jobs WHERE id = ?1 AND owner = ?2",
                params![id, owner],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        match state {
            None => return Err(no_job(id)),
            Some((state, outcome)) if state == "finished" => {
                return Err(Error::Conflict(format!(
                    "job {id} is already finished ({}); there is nothing to kill",
                    outcome.unwrap_or_default()
                )));
            }
            Some(_) => {}
        }
        let ending = Ending {
            outcome: JobOutcome::Killed,
            error: Some("killed by its owner".into()),
            error_pid: None,
            event: JobEventKind::JobKilled,
            kill: Some("the job was killed by its owner".into()),
            skip_peer: None,
        };
        finish_job(&tx, &mut self.place, inner, fx, id, ending, now)?;
        let info = db::job_info(&tx, id, None)?.ok_or_else(|| no_job(id))?;
        tx.commit()?;
        Ok(info)
    }

    pub(crate) fn dispose(&mut self, fx: &mut Effects, owner: i64, id: JobId) -> Result<(), Error> {
        let tx = self.conn.transaction()?;
        let state: Option<String> = tx
            .query_row(
                "SELECT state FROM jobs WHERE id = ?1 AND owner = ?2",
                params![id, owner],
                |r| r.get(0),
            )
            .optional()?;
        match state.as_deref() {
            None => return Err(no_job(id)),
            Some("finished") => {}
            Some(state) => {
                return Err(Error::Conflict(format!(
                    "job {id} is {state}; kill it first, then dispose of it"
                )));
            }
        }
        tx.execute("DELETE FROM events WHERE job = ?1", [id])?;
        tx.execute("DELETE FROM jobs WHERE id = ?1", [id])?;
        tx.commit()?;
        tracing::info!(job = id, "job disposed");
        fx.jobs.insert(id);
        fx.job_list.push((owner, id));
        Ok(())
    }

    /// Up to `limit` events of `owner`'s job `id` after event `after`, and
    /// whether the job is finished; `None` if the job is not (or no longer)
    /// theirs.
    pub(crate) fn events(
        &self,
        owner: i64,
        id: JobId,
        after: i64,
        limit: u32,
    ) -> Result<Option<(Vec<bsp_api::rest::JobEvent>, bool)>, Error> {
        let state: Option<String> = self
            .conn
            .query_row(
                "SELECT state FROM jobs WHERE id = ?1 AND owner = ?2",
                params![id, owner],
                |r| r.get(0),
            )
            .optional()?;
        let Some(state) = state else {
            return Ok(None);
        };
        let events = db::events_after(&self.conn, id, after, limit)?;
        Ok(Some((events, state == "finished")))
    }

    /// The id of the newest stored event of the owner's job `id` (0 when it
    /// has none), or `None` when the owner has no such job.
    pub(crate) fn last_event_id(&self, owner: i64, id: JobId) -> Result<Option<i64>, Error> {
        let mine: Option<i64> = self
            .conn
            .query_row(
                "SELECT id FROM jobs WHERE id = ?1 AND owner = ?2",
                params![id, owner],
                |r| r.get(0),
            )
            .optional()?;
        match mine {
            Some(_) => Ok(Some(db::last_event_id(&self.conn, id)?)),
            None => Ok(None),
        }
    }
}
