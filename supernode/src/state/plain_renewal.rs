//! A renewal that changes nothing but the peer's own row, without the
//! exclusive lock of a shared database (issue 14, docs/deployment.md).
//!
//! Most renewals of a large network change only the lease: the peer's
//! power moved less than the hysteresis, it starts no drain, it reports no
//! observation or wait to judge and runs no job it should not. With several
//! supernodes on one PostgreSQL database such a renewal holds the
//! database's lock in *shared* mode — renewals of all supernodes run in
//! parallel, and none runs while a state transition holds the lock
//! exclusively — and writes one row; the other supernodes need not read
//! anything again. Any other renewal goes the usual way
//! ([`Core::peer_renew`], exclusive).
//!
//! Plain renewals go to the database in batches (`crate::renew_batch`):
//! whatever arrived while the last batch ran takes the shared lock once,
//! reads its peers' rows in one query and writes them in one statement,
//! so a batch costs the database about what one renewal did (issue 14's
//! control-plane benchmark).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bsp_api::control::{Lease, PeerRenew};
use bsp_api::{JobId, PeerId};

use super::peers::{finish_renewal, lease_expired};
use super::{Core, MIN_AVAILABILITY, allowed_weight, power_moved};
use crate::metrics::Counter;
use crate::sql::{WRITE_LOCK, params};
use crate::{Effects, Error, Inner, lease};

/// A renewal that may be plain, waiting for its batch.
pub(crate) struct Plain {
    pub(crate) peer: PeerId,
    /// The lease its token names.
    pub(crate) token_lease: String,
    pub(crate) renew: Arc<PeerRenew>,
}

/// What became of one renewal of a batch: renewed, refused, or `Ok(None)`:
/// it does more than renew, renew it with [`Core::peer_renew`].
pub(crate) type PlainOutcome = Result<Option<Lease>, Error>;

/// What a peer's row says, for a plain renewal.
struct Stored {
    lease_id: String,
    expires_at: i64,
    draining: bool,
    power: f64,
}

/// `ids` as the text `string_to_array` splits: one parameter, so one
/// prepared statement whatever the batch's size. The statements join
/// with `unnest` of it, evaluated once (as `id = ANY(…)` in a filter it
/// was split again for every row of the table).
fn id_list(ids: impl Iterator<Item = i64>) -> String {
    ids.map(|id| id.to_string()).collect::<Vec<_>>().join(",")
}

impl Core {
    /// Renews each of `batch` as a plain renewal if that is all it does
    /// (see the module docs), one outcome per renewal, in order. Only with
    /// a shared database; otherwise, or when the database fails, every
    /// outcome is `Ok(None)` (each renewal then goes the usual way, which
    /// reports its own error).
    pub(crate) fn renew_plain(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        batch: &[Plain],
        now: i64,
    ) -> Vec<PlainOutcome> {
        let mut out: Vec<PlainOutcome> = batch.iter().map(|_| Ok(None)).collect();
        if self.shared.is_none()
            || !self.place.memory_waits.is_empty()
            || inner.storage_trouble().is_some()
        {
            return out;
        }
        let simple: Vec<usize> = (0..batch.len())
            .filter(|&i| batch[i].renew.observed.is_empty() && batch[i].renew.waits.is_empty())
            .collect();
        if simple.is_empty() {
            return out;
        }
        if let Err(e) =
            self.conn
                .query_row("SELECT pg_advisory_lock_shared(?1)", [WRITE_LOCK], |_| {
                    Ok(())
                })
        {
            tracing::warn!(error = %e, "cannot take the shared lock for plain renewals");
            return out;
        }
        // Not reconnected (without the lock) half way.
        crate::shared::set_holds_lock(&self.conn, true);
        // Released even if a renewal panics.
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.renew_plain_locked(inner, fx, batch, &simple, now)
        }));
        crate::shared::set_holds_lock(&self.conn, false);
        if let Err(e) =
            self.conn
                .query_row("SELECT pg_advisory_unlock_shared(?1)", [WRITE_LOCK], |_| {
                    Ok(())
                })
        {
            tracing::warn!(error = %e, "cannot release the shared lock");
        }
        match done.unwrap_or_else(|panic| std::panic::resume_unwind(panic)) {
            Ok(outcomes) => {
                for (i, outcome) in outcomes {
                    out[i] = outcome;
                }
            }
            Err(e) => tracing::warn!(error = %e, "plain renewals failed; renewing them one by one"),
        }
        out
    }

    /// The outcomes of `batch[i]` for `i` in `simple`, under the shared
    /// lock: two reads and one write for all of them.
    fn renew_plain_locked(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        batch: &[Plain],
        simple: &[usize],
        now: i64,
    ) -> Result<Vec<(usize, PlainOutcome)>, Error> {
        let peers = id_list(simple.iter().map(|&i| batch[i].peer));
        let mut stored: HashMap<PeerId, Stored> = HashMap::new();
        {
            let mut stmt = self.conn.prepare_cached(
                "SELECT p.id, p.lease_id, p.lease_expires_at, p.draining = 1, \
                     coalesce(p.power, CASE WHEN p.idle < ?2 THEN 0.0 ELSE p.speed * p.idle END) \
                 FROM unnest(CAST(string_to_array(?1, ',') AS BIGINT[])) AS want(id) \
                 JOIN peers p ON p.id = want.id \
                 WHERE p.state = 'online'",
            )?;
            let rows = stmt.query_map(params![peers, MIN_AVAILABILITY], |r| {
                Ok((
                    r.get::<_, PeerId>(0)?,
                    Stored {
                        lease_id: r.get(1)?,
                        expires_at: r.get(2)?,
                        draining: r.get(3)?,
                        power: r.get(4)?,
                    },
                ))
            })?;
            for row in rows {
                let (id, s) = row?;
                stored.insert(id, s);
            }
        }
        // The jobs each peer is still part of, for those that report jobs.
        let mut active: HashSet<(PeerId, JobId)> = HashSet::new();
        let with_jobs: Vec<PeerId> = simple
            .iter()
            .map(|&i| &batch[i])
            .filter(|p| !p.renew.jobs.is_empty())
            .map(|p| p.peer)
            .collect();
        if !with_jobs.is_empty() {
            let mut stmt = self.conn.prepare_cached(
                "SELECT p.peer_id, p.job \
                 FROM unnest(CAST(string_to_array(?1, ',') AS BIGINT[])) AS want(id) \
                 JOIN job_peers p ON p.peer_id = want.id \
                 JOIN jobs j ON j.id = p.job \
                 WHERE j.state = 'active'",
            )?;
            let rows = stmt.query_map(params![id_list(with_jobs.into_iter())], |r| {
                Ok((r.get::<_, PeerId>(0)?, r.get::<_, JobId>(1)?))
            })?;
            for row in rows {
                active.insert(row?);
            }
        }
        let mut outcomes: Vec<(usize, PlainOutcome)> = Vec::with_capacity(simple.len());
        let mut plain: Vec<(usize, &str)> = Vec::new();
        {
            for &i in simple {
                let Plain {
                    peer,
                    token_lease,
                    renew,
                } = &batch[i];
                // Only the lease the token names is renewed (not one the
                // peer got since, at another supernode).
                let Some(row) = stored.get(peer).filter(|s| s.lease_id == *token_lease) else {
                    outcomes.push((i, Err(lease_expired(*peer))));
                    continue;
                };
                // The lease the token names, still valid as stored or as
                // this supernode holds it.
                let held = inner
                    .live()
                    .peers
                    .get(peer)
                    .filter(|p| p.lease_id == row.lease_id)
                    .map_or(row.expires_at, |p| p.expires_at.max(row.expires_at));
                if !lease::is_valid(now, held) {
                    outcomes.push((i, Err(lease_expired(*peer))));
                    continue;
                }
                let drain_starts = renew.draining && !row.draining;
                let power_changes = !row.draining && {
                    let w = allowed_weight(&self.place, inner, *peer, renew.speed, renew.idle, now);
                    power_moved(row.power, w, inner.config.power_hysteresis)
                };
                // It runs a job it should not: told so the usual way.
                let stale = renew.jobs.iter().any(|&j| !active.contains(&(*peer, j)));
                if drain_starts || power_changes || stale {
                    outcomes.push((i, Ok(None)));
                } else {
                    plain.push((i, &row.lease_id));
                }
            }
        }
        if plain.is_empty() {
            return Ok(outcomes);
        }
        fx.counts.add(Counter::RenewalBatches, 1);
        let expires_at = lease::expiry(now, inner.config.lease_ttl);
        let values: Vec<serde_json::Value> = plain
            .iter()
            .map(|&(i, lease)| {
                let r = &batch[i].renew;
                serde_json::json!({
                    "id": batch[i].peer,
                    "lease": lease,
                    "speed": r.speed,
                    "idle": r.idle,
                    "rss": r.memory.rss_bytes as i64,
                    "held": r.memory.held_bytes as i64,
                    "budget": i64::try_from(r.memory.budget_bytes).unwrap_or(i64::MAX),
                })
            })
            .collect();
        let mut renewed: HashSet<PeerId> = HashSet::new();
        {
            let mut stmt = self.conn.prepare_cached(
                "UPDATE peers SET speed = v.speed, idle = v.idle, lease_expires_at = ?1, \
                     last_seen = ?2, rss_bytes = v.rss, held_bytes = v.held, \
                     budget_bytes = v.budget \
                 FROM json_to_recordset(CAST(?3 AS JSON)) AS v(id BIGINT, lease TEXT, \
                     speed DOUBLE PRECISION, idle DOUBLE PRECISION, rss BIGINT, held BIGINT, \
                     budget BIGINT) \
                 WHERE peers.id = v.id AND peers.lease_id = v.lease AND peers.state = 'online' \
                 RETURNING peers.id",
            )?;
            let rows = stmt.query_map(
                params![
                    expires_at,
                    now,
                    serde_json::Value::Array(values).to_string()
                ],
                |r| r.get::<_, PeerId>(0),
            )?;
            for row in rows {
                renewed.insert(row?);
            }
        }
        for (i, _) in plain {
            let Plain { peer, renew, .. } = &batch[i];
            if !renewed.contains(peer) {
                outcomes.push((i, Err(lease_expired(*peer))));
                continue;
            }
            let known = inner.live().peers.contains_key(peer);
            if !known && let Err(e) = self.refresh_lease(inner, *peer) {
                outcomes.push((i, Err(e)));
                continue;
            }
            fx.counts.add(Counter::PlainRenewals, 1);
            let lease_id = &batch[i].token_lease;
            outcomes.push((
                i,
                finish_renewal(inner, fx, *peer, renew, lease_id, now, expires_at).map(Some),
            ));
        }
        Ok(outcomes)
    }
}
