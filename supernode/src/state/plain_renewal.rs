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

use bsp_api::PeerId;
use bsp_api::control::{Lease, PeerRenew};

use super::peers::{finish_renewal, lease_expired, stale_jobs, store_renewal};
use super::{Core, MIN_AVAILABILITY, allowed_weight, power_moved};
use crate::sql::{OptionalExtension, WRITE_LOCK, params};
use crate::{Effects, Error, Inner, lease, now_ms};

fn holds_lock(core: &Core, held: bool) {
    if let Some(c) = core.conn.postgres_conn() {
        c.set_holds_lock(held);
    }
}

impl Core {
    /// Renews `peer`'s lease as a plain renewal if that is all it does
    /// (see the module docs); `Ok(None)`: it does more, renew it with
    /// [`Core::peer_renew`]. Only with a shared database.
    pub(crate) fn renew_plain(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        peer: PeerId,
        token_lease: &str,
        renew: &PeerRenew,
    ) -> Result<Option<Lease>, Error> {
        if self.shared.is_none()
            || !renew.observed.is_empty()
            || !renew.waits.is_empty()
            || !self.place.memory_waits.is_empty()
            || inner.storage_trouble().is_some()
        {
            return Ok(None);
        }
        self.conn
            .query_row("SELECT pg_advisory_lock_shared(?1)", [WRITE_LOCK], |_| {
                Ok(())
            })?;
        // Not reconnected (without the lock) half way.
        holds_lock(self, true);
        // Released even if the renewal panics.
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.renew_plain_locked(inner, fx, peer, token_lease, renew)
        }));
        holds_lock(self, false);
        if let Err(e) =
            self.conn
                .query_row("SELECT pg_advisory_unlock_shared(?1)", [WRITE_LOCK], |_| {
                    Ok(())
                })
        {
            tracing::warn!(error = %e, "cannot release the shared lock");
        }
        out.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    fn renew_plain_locked(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        peer: PeerId,
        token_lease: &str,
        renew: &PeerRenew,
    ) -> Result<Option<Lease>, Error> {
        let now = now_ms();
        let stored: Option<(String, i64, bool, f64)> = self
            .conn
            .query_row(
                "SELECT lease_id, lease_expires_at, draining = 1, \
                     coalesce(power, CASE WHEN idle < ?2 THEN 0.0 ELSE speed * idle END) \
                 FROM peers WHERE id = ?1 AND state = 'online'",
                params![peer, MIN_AVAILABILITY],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        // Only the lease the token names is renewed (not one the peer
        // got since, at another supernode).
        let Some((lease_id, stored_expiry, draining, power)) =
            stored.filter(|(l, ..)| l == token_lease)
        else {
            return Err(lease_expired(peer));
        };
        // The lease the token names, still valid as stored or as this
        // supernode holds it.
        let held = inner
            .live()
            .peers
            .get(&peer)
            .filter(|p| p.lease_id == lease_id)
            .map_or(stored_expiry, |p| p.expires_at.max(stored_expiry));
        if !lease::is_valid(now, held) {
            return Err(lease_expired(peer));
        }
        if renew.draining && !draining {
            return Ok(None);
        }
        if !draining {
            let w = allowed_weight(&self.place, inner, peer, renew.speed, renew.idle);
            if power_moved(power, w, inner.config.power_hysteresis) {
                return Ok(None);
            }
        }
        if !stale_jobs(&self.conn, peer, &renew.jobs)?.is_empty() {
            // It runs a job it should not: told so the usual way.
            return Ok(None);
        }
        let expires_at = lease::expiry(now, inner.config.lease_ttl);
        if store_renewal(&self.conn, peer, &lease_id, renew, now, expires_at)?.is_none() {
            return Err(lease_expired(peer));
        }
        if !inner.live().peers.contains_key(&peer) {
            self.refresh_lease(inner, peer)?;
        }
        finish_renewal(inner, fx, peer, renew, &lease_id, now, expires_at).map(Some)
    }
}
