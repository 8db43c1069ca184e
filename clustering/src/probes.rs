//! Which links a peer measures: the supernode's choice of probe targets
//! (the measured graph DiDiC will cluster, dissertation §5.1: every vertex
//! keeps at most `maxNeigh` neighbours).
//!
//! Each peer's neighbours are the `max_neigh` other peers with the smallest
//! *affinity* hash of the pair: a fixed, well-spread choice that needs no
//! coordination, and that changes little when peers come and go (a
//! rendezvous hash). Among them, at each renewal, the ones due (never
//! tried first, then the longest due), at most `per_round` of them; when a
//! link is due again (a measurement to refresh, a failed one to retry) is
//! the caller's policy.

/// What to decide a peer's probes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbePolicy {
    /// Neighbours per peer (the dissertation's `maxNeigh`).
    pub max_neigh: usize,
    /// Targets per renewal at most.
    pub per_round: usize,
}

impl Default for ProbePolicy {
    fn default() -> Self {
        ProbePolicy {
            max_neigh: 8,
            per_round: 2,
        }
    }
}

/// The rendezvous weight of the pair `(a, b)`, the same for `(b, a)`: a
/// 64-bit mix (SplitMix64's finaliser) of both ids.
fn affinity(a: i64, b: i64) -> u64 {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let mut z = (lo as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add((hi as u64).rotate_left(29) ^ 0xd1b5_4a32_d192_ed03);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The neighbours of `me` among `peers` (itself excluded), closest first.
pub fn neighbours(me: i64, peers: &[i64], max_neigh: usize) -> Vec<i64> {
    let mut others: Vec<i64> = peers.iter().copied().filter(|&p| p != me).collect();
    others.sort_unstable_by_key(|&p| (affinity(me, p), p));
    others.dedup();
    others.truncate(max_neigh);
    others
}

/// The peers `me` should measure now: `due_at(p)` is when the link to `p`
/// is due to be measured (again), Unix ms; `None` if it was never tried.
pub fn probe_targets(
    me: i64,
    peers: &[i64],
    due_at: impl Fn(i64) -> Option<i64>,
    now_ms: i64,
    policy: ProbePolicy,
) -> Vec<i64> {
    let mut due: Vec<(Option<i64>, usize, i64)> = neighbours(me, peers, policy.max_neigh)
        .into_iter()
        .enumerate()
        .map(|(rank, p)| (due_at(p), rank, p))
        .filter(|(at, _, _)| at.is_none_or(|t| t <= now_ms))
        .collect();
    // Never tried (None) sorts first, then the longest due; ties closest first.
    due.sort_unstable();
    due.into_iter()
        .take(policy.per_round)
        .map(|(_, _, p)| p)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// At most `max_neigh` distinct others, symmetric weights, and the
        /// choice of a peer does not depend on the order peers are listed in.
        #[test]
        fn neighbours_are_bounded_and_stable(
            me in 0i64..50,
            peers in proptest::collection::vec(0i64..50, 0..40),
            max in 0usize..12,
        ) {
            let n = neighbours(me, &peers, max);
            prop_assert!(n.len() <= max);
            prop_assert!(!n.contains(&me));
            let mut sorted = n.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), n.len());
            let mut reversed = peers.clone();
            reversed.reverse();
            prop_assert_eq!(neighbours(me, &reversed, max), n.clone());
            for &p in &n {
                prop_assert_eq!(affinity(me, p), affinity(p, me));
            }
            // A peer that is not among them is farther than every one that is.
            for &p in peers.iter().filter(|&&p| p != me && !n.contains(&p)) {
                prop_assert!(n.len() == max);
                prop_assert!(n.iter().all(|&q| (affinity(me, q), q) < (affinity(me, p), p)));
            }
        }
    }

    #[test]
    fn unmeasured_neighbours_come_first_then_the_oldest() {
        let policy = ProbePolicy {
            max_neigh: 4,
            per_round: 2,
        };
        let peers: Vec<i64> = (0..10).collect();
        let n = neighbours(0, &peers, 4);
        // Nothing tried: the first two neighbours.
        assert_eq!(probe_targets(0, &peers, |_| None, 1_000, policy), n[..2]);
        // Nothing due yet: nothing to do.
        assert!(probe_targets(0, &peers, |_| Some(1_001), 1_000, policy).is_empty());
        // One never tried, two due: the untried one, then the longest due.
        let at = |p: i64| match p {
            p if p == n[3] => None,
            p if p == n[1] => Some(500),
            p if p == n[2] => Some(800),
            _ => Some(2_000),
        };
        assert_eq!(
            probe_targets(0, &peers, at, 1_000, policy),
            vec![n[3], n[1]]
        );
        // Only neighbours are ever targets.
        let all = probe_targets(
            0,
            &peers,
            |_| None,
            0,
            ProbePolicy {
                max_neigh: 4,
                per_round: 9,
            },
        );
        assert_eq!(all, n);
        // Alone: nobody to measure.
        assert!(probe_targets(0, &[0], |_| None, 0, policy).is_empty());
    }
}
