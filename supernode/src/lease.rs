//! Lease arithmetic (dissertation §2.3: logins are granted on a lease basis and
//! must be renewed at regular intervals).
//!
//! **Architecture Invariant:** these are pure functions of the current time and
//! the peer table; the supernode's expiry task and the login/renew handlers
//! drive them with the wall clock, the tests with plain numbers.

use std::time::Duration;

use bsp_api::PeerId;

/// What the lease logic needs to know about one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLease {
    /// The peer.
    pub id: PeerId,
    /// Whether the peer is `online` (holds a lease) or `gone`.
    pub online: bool,
    /// Unix milliseconds at which its lease ends.
    pub expires_at: i64,
}

/// Whether a lease ending at `expires_at` is still valid at `now` (both Unix ms).
/// A lease is valid up to and including its last millisecond.
pub fn is_valid(now: i64, expires_at: i64) -> bool {
    now <= expires_at
}

/// When a lease granted or renewed at `now` ends.
pub fn expiry(now: i64, ttl: Duration) -> i64 {
    now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
}

/// How often a peer should renew: a third of the TTL, so two renewals may be
/// lost before the lease ends (at least 1 ms).
pub fn renew_every(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

/// How often the supernode looks for expired leases: a quarter of the TTL
/// (at least 10 ms), so a dead peer is declared gone at most 1.25 TTL after
/// its last renewal.
pub fn sweep_every(ttl: Duration) -> Duration {
    (ttl / 4).max(Duration::from_millis(10))
}

/// The online peers whose lease has ended at `now`, in id order.
pub fn expired(now: i64, peers: impl IntoIterator<Item = PeerLease>) -> Vec<PeerId> {
    let mut ids: Vec<PeerId> = peers
        .into_iter()
        .filter(|p| p.online && !is_valid(now, p.expires_at))
        .map(|p| p.id)
        .collect();
    ids.sort_unstable();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: PeerId, online: bool, expires_at: i64) -> PeerLease {
        PeerLease {
            id,
            online,
            expires_at,
        }
    }

    #[test]
    fn a_lease_is_valid_until_its_last_millisecond() {
        let ttl = Duration::from_secs(15);
        let end = expiry(1_000, ttl);
        assert_eq!(end, 16_000);
        assert!(is_valid(16_000, end));
        assert!(!is_valid(16_001, end));
    }

    #[test]
    fn peers_renew_three_times_per_ttl_and_the_sweep_runs_four_times() {
        let ttl = Duration::from_secs(15);
        assert_eq!(renew_every(ttl), Duration::from_secs(5));
        assert_eq!(sweep_every(ttl), Duration::from_millis(3_750));
        assert_eq!(renew_every(Duration::ZERO), Duration::from_millis(1));
        assert_eq!(sweep_every(Duration::ZERO), Duration::from_millis(10));
    }

    #[test]
    fn only_online_peers_past_their_lease_expire() {
        let table = [
            peer(3, true, 999),   // expired
            peer(1, true, 1_000), // last valid millisecond
            peer(2, false, 10),   // already gone
            peer(7, true, 5_000), // valid
            peer(5, true, -1),    // expired long ago
        ];
        assert_eq!(expired(1_000, table), vec![3, 5]);
        assert_eq!(expired(1_001, table), vec![1, 3, 5]);
        assert!(expired(0, [peer(1, true, 0)]).is_empty());
    }

    #[test]
    fn a_renewal_moves_the_expiry_forward() {
        let ttl = Duration::from_millis(300);
        let mut p = peer(1, true, expiry(0, ttl));
        // Renewing every ttl/3 keeps the lease valid at every instant.
        let step = i64::try_from(renew_every(ttl).as_millis()).unwrap();
        for now in (0..10_000).step_by(usize::try_from(step).unwrap()) {
            assert!(expired(now, [p]).is_empty(), "expired at {now}");
            p.expires_at = expiry(now, ttl);
        }
        // The peer stops renewing: gone once the TTL has passed.
        let last = p.expires_at;
        assert!(expired(last, [p]).is_empty());
        assert_eq!(expired(last + 1, [p]), vec![1]);
    }
}
