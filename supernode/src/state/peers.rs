//! Peers: login, lease renewal and expiry, drains, loss by an unreachable
//! data port (what peers fetch and the peer list: `peer_views`).

use super::enroll;
use super::links::record_links_and_choose_probes;
use super::progress::job_members;
use super::*;

impl Core {
    // ------------------------------------------------------------ peers

    /// A peer logs in and gets a lease.
    pub(crate) fn peer_login(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        login: &PeerLogin,
        now: i64,
    ) -> Result<Lease, Error> {
        let ttl = inner.config.lease_ttl;
        let tx = self.conn.transaction()?;
        // The token first, before anything changes: a refused login changes
        // nothing.
        let enrollment = enroll::check_login(&tx, login.token.as_ref(), &login.name)
            .inspect_err(|refusal| {
                tracing::info!(name = %login.name, addr = %login.addr, "peer login refused: {refusal}");
            })?;
        // Settle overdue leases next, so a returning peer whose lease ran
        // out is seen as gone (and its lost jobs are failed) before it is back.
        let expired = expire_overdue(&tx, &mut self.place, inner, fx, now)?;
        tx.execute(
            "UPDATE enrollments SET last_used_at = ?2 WHERE id = ?1",
            params![enrollment, now],
        )?;
        // The old id is kept only for the same peer: gone, and enrolled
        // with the same token.
        let reuse = match login.previous_id {
            Some(id) => tx
                .query_row(
                    "SELECT state, enrollment FROM peers WHERE id = ?1 AND disabled = 0",
                    [id],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?)),
                )
                .optional()?
                .filter(|(state, e)| state == "gone" && *e == Some(enrollment))
                .map(|_| id),
            None => None,
        };
        let lease_id = hex::encode(rand::random::<[u8; 16]>());
        let expires_at = lease::expiry(now, ttl);
        let k = self.place.peer_indices.alloc();
        // A new id is unmeasured: on probation (crate::verify).
        let power = allowed_weight(
            &self.place,
            inner,
            reuse.unwrap_or(-1),
            login.speed,
            login.idle,
            now,
        );
        let id = match reuse {
            Some(id) => {
                tx.execute(
                    "UPDATE peers SET name = ?2, addr = ?3, speed = ?4, idle = ?5, cores = ?6, golden = ?7, \
                         lease_id = ?8, lease_expires_at = ?9, state = 'online', last_seen = ?10, \
                         draining = 0, power = ?11, cluster = ?12, enrollment = ?13 WHERE id = ?1",
                    params![id, login.name, login.addr, login.speed, login.idle, login.cores,
                        u64_to_sql(k), lease_id, expires_at, now, power,
                        login.cluster, enrollment],
                )?;
                id
            }
            None => {
                tx.query_row(
                    "INSERT INTO peers (name, addr, speed, idle, cores, golden, lease_id, lease_expires_at, \
                         state, first_seen, last_seen, power, cluster, enrollment) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'online', ?9, ?9, ?10, ?11, ?12) RETURNING id",
                    params![login.name, login.addr, login.speed, login.idle, login.cores,
                        u64_to_sql(k), lease_id, expires_at, now, power,
                        login.cluster, enrollment],
                    |r| r.get(0),
                )?
            }
        };
        let seq: i64 = tx.query_row("SELECT cmd_seq FROM peers WHERE id = ?1", [id], |r| {
            r.get(0)
        })?;
        tx.commit()?;
        insert_peer(&mut self.place.dhht, id, k, power);
        {
            let mut live = inner.live();
            live.forget(&expired);
            live.peers.insert(
                id,
                LivePeer {
                    lease_id: lease_id.clone(),
                    expires_at,
                    last_seq: u64_from_sql(seq),
                    queue: VecDeque::new(),
                    acked: u64_from_sql(seq),
                    pruned: u64_from_sql(seq),
                    notify: Arc::new(Notify::new()),
                    probed_at: None,
                    counters: None,
                    addr: login.addr.clone(),
                },
            );
        }
        tracing::info!(peer = id, name = %login.name, addr = %login.addr, speed = login.speed,
            idle = login.idle, cores = login.cores, reused = reuse.is_some(), "peer logged in");
        fx.wake_scheduler = true;
        fx.counts.add(Counter::PeerLogins, 1);
        Ok(Lease {
            peer_id: id,
            token: inner.keys.peer_token(id, &lease_id, expires_at)?,
            ttl_ms: ttl.as_millis() as u64,
            renew_every_ms: lease::renew_every(ttl).as_millis() as u64,
            probe_key: inner.keys.probe_key_hex(id),
            probe: Vec::new(),
        })
    }

    /// A peer renews its lease and reports its availability.
    pub(crate) fn peer_renew(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        peer: PeerId,
        token_lease: &str,
        renew: &PeerRenew,
        now: i64,
    ) -> Result<Lease, Error> {
        let ttl = inner.config.lease_ttl;
        // Only the lease the token names is renewed (not one the peer got
        // since, at another supernode of a shared database).
        let held = |inner: &Inner| {
            let live = inner.live();
            live.peers
                .get(&peer)
                .filter(|p| lease::is_valid(now, p.expires_at) && p.lease_id == token_lease)
                .map(|p| p.lease_id.clone())
        };
        // With a shared database the last renewal may have gone to another
        // supernode.
        let mut lease_id = held(inner);
        if lease_id.is_none() && self.shared.is_some() {
            self.refresh_lease(inner, peer)?;
            lease_id = held(inner);
        }
        let lease_id = {
            match lease_id {
                Some(id) => id,
                None => {
                    return Err(Error::Unauthorized {
                        code: "lease_expired",
                        message: format!("the lease of peer {peer} has expired; log in again"),
                    });
                }
            }
        };
        let expires_at = lease::expiry(now, ttl);
        // A job waiting for a peer's memory may fit now.
        if !self.place.memory_waits.is_empty() {
            fx.wake_scheduler = true;
        }
        // The renewal's own effects (commands, events) apply only if its
        // transaction committed.
        let mut own = Effects::default();
        match self.renew_in_db(inner, &mut own, peer, &lease_id, renew, now) {
            Ok(()) => {
                fx.merge(own);
                if inner.storage_trouble().is_some() {
                    self.store_live_leases(inner, now)?;
                }
                inner.storage_ok();
            }
            // The disk takes no writes: the lease goes on in memory (the
            // sweeper honours it), so a full disk does not make every peer
            // look gone; what else the renewal would have recorded waits
            // for the next one.
            Err(Error::Database(e)) if crate::error::is_storage_error(&e) => {
                inner.storage_failed(&e);
                if let Err(e) = self.rebuild_placement() {
                    tracing::error!(error = %e, "cannot rebuild the placement tables");
                }
            }
            Err(e) => return Err(e),
        }
        finish_renewal(inner, fx, peer, renew, &lease_id, now, expires_at)
    }

    /// After the disk took no writes: record the leases that were renewed
    /// in memory only, so every query of who is online sees them again
    /// (only the sweeper reads the in-memory ones), and note that the disk
    /// takes writes (a probe row when no peer is online).
    pub(crate) fn store_live_leases(&mut self, inner: &Inner, now: i64) -> Result<(), Error> {
        let leases: Vec<(PeerId, i64)> = inner
            .live()
            .peers
            .iter()
            .map(|(&id, p)| (id, p.expires_at))
            .collect();
        let tx = self.conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "UPDATE peers SET lease_expires_at = CASE WHEN lease_expires_at > ?2 THEN lease_expires_at ELSE ?2 END \
                 WHERE id = ?1 AND state = 'online'",
            )?;
            for (id, at) in leases {
                stmt.execute(params![id, at])?;
            }
        }
        tx.execute(
            "INSERT INTO storage_probe (id, at) VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET at = excluded.at",
            [now],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// What a renewal records: the peer's speed, idle fraction, memory and
    /// lease expiry; jobs it should not run are killed; a power change
    /// beyond the hysteresis re-weights it in the DHHT.
    pub(super) fn renew_in_db(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        peer: PeerId,
        lease_id: &str,
        renew: &PeerRenew,
        now: i64,
    ) -> Result<(), Error> {
        // The same expiry as the caller's (a function of `now`).
        let expires_at = lease::expiry(now, inner.config.lease_ttl);
        let tx = self.conn.transaction()?;
        let Some(draining) = store_renewal(&tx, peer, lease_id, renew, now, expires_at)? else {
            return Err(lease_expired(peer));
        };
        // What it saw of the other peers of its jobs (crate::verify): only
        // about active jobs it is a peer of, and their peers, once each.
        let members = job_members(
            &tx,
            peer,
            renew
                .observed
                .iter()
                .map(|o| o.job)
                .chain(renew.waits.iter().map(|w| w.job)),
        )?;
        if !renew.observed.is_empty() {
            let mut seen = HashSet::new();
            let observed: Vec<_> = renew
                .observed
                .iter()
                .filter(|o| members.get(&o.job).is_some_and(|m| m.contains_key(&o.peer)))
                .filter(|o| seen.insert((o.job, o.peer)))
                .copied()
                .collect();
            let dhht = &self.place.dhht;
            inner.live().verify.observe(
                peer,
                &observed,
                |p| dhht.get(p).map(|x| x.weight),
                |job, p| {
                    members
                        .get(&job)
                        .and_then(|m| m.get(&p))
                        .copied()
                        .unwrap_or(1)
                },
                now,
            );
        }
        let waits: Vec<_> = renew
            .waits
            .iter()
            .filter(|w| members.contains_key(&w.job))
            .cloned()
            .collect();
        let stalled = Self::check_waits(&tx, inner, peer, &waits, now)?;
        let fenced = enroll::fence(
            &tx,
            &mut self.place,
            inner,
            fx,
            &stalled,
            enroll::FenceCause::Stalled,
            now,
        )?;
        if !fenced.is_empty() {
            // Their lease tokens stop working with the commit below.
            fx.forget_peers.extend(fenced);
        }
        for job in stale_jobs(&tx, peer, &renew.jobs)? {
            tracing::info!(
                peer,
                job,
                "peer runs a job that is not active there; telling it to stop"
            );
            queue(
                &tx,
                inner,
                fx,
                peer,
                Command::KillJob {
                    job,
                    reason: "the job is not running on this peer any more".into(),
                },
                now,
            )?;
        }
        if renew.draining && !draining {
            drain_in(&tx, &mut self.place, inner, fx, peer, now)?;
        } else if !draining {
            let w = allowed_weight(&self.place, inner, peer, renew.speed, renew.idle, now);
            // Out of the DHHT (and not draining): busy, power 0.
            let old = self.place.dhht.get(peer).map_or(0.0, |p| p.weight);
            if power_moved(old, w, inner.config.power_hysteresis) {
                let golden: Option<i64> =
                    tx.query_row("SELECT golden FROM peers WHERE id = ?1", [peer], |r| {
                        r.get(0)
                    })?;
                if let Some(k) = golden {
                    insert_peer(&mut self.place.dhht, peer, u64_from_sql(k), w);
                    tx.execute(
                        "UPDATE peers SET power = ?2 WHERE id = ?1",
                        params![peer, w],
                    )?;
                    if w <= 0.0 {
                        tracing::info!(
                            peer,
                            "peer is busy (its owner uses it): moving its processes away"
                        );
                    } else {
                        tracing::info!(
                            peer,
                            from = old,
                            to = w,
                            "peer's power changed beyond the hysteresis"
                        );
                    }
                    self.place.rebalance_pending =
                        epoch::rebalance(&tx, &mut self.place, inner, fx, now)?;
                    epoch::settle_drains(&tx, inner, fx, now)?;
                    fx.wake_scheduler = true;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The lease sweep: declares the peers whose lease ended by `now` gone
    /// and restores their processes elsewhere, retries migrations that were
    /// waiting, and deletes acknowledged commands from SQLite.
    pub(crate) fn sweep(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        now: i64,
    ) -> Result<Vec<PeerId>, Error> {
        let tx = self.conn.transaction()?;
        let expired = expire_overdue(&tx, &mut self.place, inner, fx, now)?;
        if self.place.rebalance_pending {
            self.place.rebalance_pending = epoch::rebalance(&tx, &mut self.place, inner, fx, now)?;
            epoch::settle_drains(&tx, inner, fx, now)?;
        }
        let acked: Vec<(PeerId, u64)> = inner
            .live()
            .peers
            .iter()
            .filter(|(_, p)| p.acked > p.pruned)
            .map(|(&id, p)| (id, p.acked))
            .collect();
        for &(peer, upto) in &acked {
            tx.execute(
                "DELETE FROM commands WHERE peer_id = ?1 AND seq <= ?2",
                params![peer, u64_to_sql(upto)],
            )?;
        }
        tx.commit()?;
        let mut live = inner.live();
        for (peer, upto) in acked {
            if let Some(p) = live.peers.get_mut(&peer) {
                p.pruned = p.pruned.max(upto);
            }
        }
        live.forget(&expired);
        Ok(expired)
    }

    /// `POST /api/v1/peer/drain`: the peer takes no new processes and its
    /// processes migrate away at once; it leaves each job once it hosts
    /// nothing there.
    pub(crate) fn drain(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        peer: PeerId,
        now: i64,
    ) -> Result<(), Error> {
        let tx = self.conn.transaction()?;
        let draining: Option<bool> = tx
            .query_row(
                "SELECT draining FROM peers WHERE id = ?1 AND state = 'online'",
                [peer],
                |r| r.get(0),
            )
            .optional()?;
        if draining == Some(false) {
            drain_in(&tx, &mut self.place, inner, fx, peer, now)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Ends a drain the peer asked for (`bspweb peer resume`): it takes
    /// processes again, at its position on the ring with its last power.
    pub(crate) fn resume(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        peer: PeerId,
        now: i64,
    ) -> Result<(), Error> {
        let tx = self.conn.transaction()?;
        let row: Option<(bool, f64, f64, Option<i64>)> = tx
            .query_row(
                "SELECT draining, speed, idle, golden FROM peers WHERE id = ?1 AND state = 'online'",
                [peer],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        let Some((true, speed, idle, golden)) = row else {
            return Ok(());
        };
        let w = allowed_weight(&self.place, inner, peer, speed, idle, now);
        tx.execute(
            "UPDATE peers SET draining = 0, power = ?2 WHERE id = ?1",
            params![peer, w],
        )?;
        if let Some(k) = golden {
            insert_peer(&mut self.place.dhht, peer, u64_from_sql(k), w);
        }
        tracing::info!(peer, power = w, "peer resumed: it takes processes again");
        self.place.rebalance_pending = epoch::rebalance(&tx, &mut self.place, inner, fx, now)?;
        fx.wake_scheduler = true;
        tx.commit()?;
        Ok(())
    }

    /// Declares `suspect.peer` gone now, because its data-plane address
    /// refused a connection (see [`SuspectWhy`] for why it was dialed), and
    /// restores its processes like an expired lease would. Does
    /// nothing if the peer is no longer online or holds a different lease
    /// than when it was suspected (it logged in again meanwhile).
    pub(crate) fn declare_unreachable(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        suspect: &Suspect,
        lease_id: &str,
        now: i64,
    ) -> Result<bool, Error> {
        let same_lease = inner
            .live()
            .peers
            .get(&suspect.peer)
            .is_some_and(|p| p.lease_id == lease_id);
        if !same_lease {
            return Ok(false);
        }
        let tx = self.conn.transaction()?;
        let online: bool = tx
            .query_row(
                "SELECT state = 'online' FROM peers WHERE id = ?1",
                [suspect.peer],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(false);
        if !online {
            return Ok(false);
        }
        let name = mark_gone(&tx, &mut self.place, suspect.peer)?;
        fx.counts.add(Counter::PeersLost, 1);
        tracing::warn!(
            peer = suspect.peer,
            name = %name,
            addr = %suspect.addr,
            "peer #{} is gone: {} and its data port refuses connections",
            suspect.peer,
            suspect.why
        );
        let lost = BTreeMap::from([(suspect.peer, name)]);
        epoch::restore_lost(
            &tx,
            &mut self.place,
            inner,
            fx,
            &lost,
            LossCause::Unreachable,
            now,
        )?;
        fx.wake_scheduler = true;
        tx.commit()?;
        inner.live().forget(&[suspect.peer]);
        Ok(true)
    }
}

/// Marks the online peers whose lease ended by `now` as gone: frees their
/// golden index, removes them from the DHHT, drops their queued commands,
/// and restores their processes on the remaining peers of each job
/// ([`epoch::restore_lost`]). Returns their ids; the caller removes them
/// from [`Live`] after the commit.
pub(super) fn expire_overdue(
    tx: &Transaction<'_>,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    now: i64,
) -> Result<Vec<PeerId>, Error> {
    // Only leases over as stored can be over (memory only extends them),
    // and the database finds those: a login reads no row of every online
    // peer (a mass login of n peers would be O(n²)).
    let mut table: Vec<lease::PeerLease> = {
        let mut stmt = tx.prepare_cached(
            "SELECT id, lease_expires_at FROM peers WHERE state = 'online' AND lease_expires_at < ?1",
        )?;
        stmt.query_map([now], |r| {
            Ok(lease::PeerLease {
                id: r.get(0)?,
                online: true,
                expires_at: r.get(1)?,
            })
        })?
        .collect::<crate::sql::Result<_>>()?
    };
    // A renewal whose write failed (the disk took none) extended the lease
    // in memory only: the later expiry counts.
    {
        let live = inner.live();
        for l in &mut table {
            if let Some(p) = live.peers.get(&l.id) {
                l.expires_at = l.expires_at.max(p.expires_at);
            }
        }
    }
    let expired = lease::expired(now, table);
    let mut lost = BTreeMap::new();
    for &peer in &expired {
        let name = mark_gone(tx, place, peer)?;
        fx.counts.add(Counter::PeersLost, 1);
        tracing::warn!(peer, name = %name, "peer stopped renewing its lease; it is gone");
        lost.insert(peer, name);
    }
    if !lost.is_empty() {
        epoch::restore_lost(tx, place, inner, fx, &lost, LossCause::LeaseExpired, now)?;
        fx.wake_scheduler = true;
    }
    Ok(expired)
}

/// Marks `peer` gone: frees its golden index, removes it from the DHHT and
/// drops its queued commands. Returns its name.
pub(super) fn mark_gone(tx: &Connection, place: &mut Place, peer: PeerId) -> Result<String, Error> {
    let (name, golden): (String, Option<i64>) = tx.query_row(
        "SELECT name, golden FROM peers WHERE id = ?1",
        [peer],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    tx.execute(
        "UPDATE peers SET state = 'gone', golden = NULL, draining = 0, power = NULL WHERE id = ?1",
        [peer],
    )?;
    tx.execute("DELETE FROM commands WHERE peer_id = ?1", [peer])?;
    if let Some(k) = golden {
        place.peer_indices.free(u64_from_sql(k));
    }
    place.dhht.remove(peer);
    Ok(name)
}

/// Marks `peer` draining: out of the DHHT (power 0 for placement), its
/// processes migrate away at once, and it leaves the jobs where it hosts
/// nothing.
pub(super) fn drain_in(
    tx: &Connection,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    peer: PeerId,
    now: i64,
) -> Result<(), Error> {
    tx.execute("UPDATE peers SET draining = 1 WHERE id = ?1", [peer])?;
    place.dhht.remove(peer);
    tracing::info!(peer, "peer is draining: moving its processes away");
    place.rebalance_pending = epoch::rebalance(tx, place, inner, fx, now)?;
    epoch::settle_drains(tx, inner, fx, now)?;
    fx.wake_scheduler = true;
    Ok(())
}

/// What every renewal does once its lease is stored: count it and the
/// peer's running totals, note the links it measured, and answer the lease.
pub(super) fn finish_renewal(
    inner: &Inner,
    fx: &mut Effects,
    peer: PeerId,
    renew: &PeerRenew,
    lease_id: &str,
    now: i64,
    expires_at: i64,
) -> Result<Lease, Error> {
    let ttl = inner.config.lease_ttl;
    fx.counts.add(Counter::LeaseRenewals, 1);
    if let Some(p) = inner.live().peers.get_mut(&peer) {
        p.expires_at = expires_at;
        let now = renew.counters;
        if let Some(before) = p.counters.replace(now) {
            for (counter, now, before) in [
                (Counter::Checkpoints, now.checkpoints, before.checkpoints),
                (
                    Counter::CheckpointBytes,
                    now.checkpoint_bytes,
                    before.checkpoint_bytes,
                ),
                (
                    Counter::MessageBytes,
                    now.message_bytes,
                    before.message_bytes,
                ),
                (
                    Counter::RelayedBytes,
                    now.relayed_bytes,
                    before.relayed_bytes,
                ),
            ] {
                fx.counts.add(counter, now.saturating_sub(before));
            }
        }
    }
    let probe = record_links_and_choose_probes(inner, peer, &renew.links, now);
    Ok(Lease {
        peer_id: peer,
        token: inner.keys.peer_token(peer, lease_id, expires_at)?,
        ttl_ms: ttl.as_millis() as u64,
        renew_every_ms: lease::renew_every(ttl).as_millis() as u64,
        probe_key: inner.keys.probe_key_hex(peer),
        probe,
    })
}

/// The jobs among `jobs` (what `peer` says it runs) that it should not run:
/// finished, unknown, or not among its peers; each once.
pub(super) fn stale_jobs(
    conn: &Connection,
    peer: PeerId,
    jobs: &[bsp_api::JobId],
) -> Result<Vec<bsp_api::JobId>, Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM job_peers p JOIN jobs j ON j.id = p.job \
         WHERE p.job = ?1 AND p.peer_id = ?2 AND j.state = 'active')",
    )?;
    let mut seen = HashSet::new();
    let mut stale = Vec::new();
    for &job in jobs {
        if seen.insert(job) && !stmt.query_row(params![job, peer], |r| r.get::<_, bool>(0))? {
            stale.push(job);
        }
    }
    Ok(stale)
}

/// The answer to a request under a lease that is over.
pub(super) fn lease_expired(peer: PeerId) -> Error {
    Error::Unauthorized {
        code: "lease_expired",
        message: format!("the lease of peer {peer} has expired; log in again"),
    }
}

/// Stores what a renewal reports in `peer`'s row if the peer is online
/// under `lease` (the one its token names): whether it is draining, or
/// `None` when it is not online under that lease.
pub(super) fn store_renewal(
    conn: &Connection,
    peer: PeerId,
    lease: &str,
    renew: &PeerRenew,
    now: i64,
    expires_at: i64,
) -> Result<Option<bool>, Error> {
    Ok(conn
        .query_row(
            "UPDATE peers SET speed = ?3, idle = ?4, lease_expires_at = ?5, last_seen = ?6, \
                 rss_bytes = ?7, held_bytes = ?8, budget_bytes = ?9 \
             WHERE id = ?1 AND lease_id = ?2 AND state = 'online' RETURNING draining = 1",
            params![
                peer,
                lease,
                renew.speed,
                renew.idle,
                expires_at,
                now,
                renew.memory.rss_bytes as i64,
                renew.memory.held_bytes as i64,
                i64::try_from(renew.memory.budget_bytes).unwrap_or(i64::MAX)
            ],
            |r| r.get(0),
        )
        .optional()?)
}
