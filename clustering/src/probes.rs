//! Which links a peer measures: the supernode's choice of probe targets
//! (the measured graph DiDiC clusters; dissertation §5.1: every vertex
//! keeps at most `maxNeigh` neighbours, and §5.4 links each vertex to its
//! `maxNeigh` *nearest*, i.e. fastest, others).
//!
//! Each peer's *candidates* are the `candidates` other peers with the
//! smallest *affinity* hash of the pair: a fixed, well-spread sample that
//! needs no coordination and changes little when peers come and go (a
//! rendezvous hash). A peer measures its candidates over a few renewals
//! and keeps the `max_neigh` fastest of them as its *neighbours*
//! ([`fastest`]); the others are measured again now and then (the network
//! changes), the neighbours more often. At each renewal the ones due
//! (never tried first, then the longest due), at most `per_round` of them;
//! when a link is due again is the caller's policy, told whether the link
//! is one of the neighbours.

/// What to decide a peer's probes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbePolicy {
    /// Neighbours per peer (the dissertation's `maxNeigh`).
    pub max_neigh: usize,
    /// Peers a peer measures to find its neighbours among (at least
    /// `max_neigh`).
    pub candidates: usize,
    /// Targets per renewal at most.
    pub per_round: usize,
}

impl Default for ProbePolicy {
    fn default() -> Self {
        ProbePolicy {
            max_neigh: 8,
            candidates: 32,
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

/// The `max` peers of `peers` closest to `me` by affinity (itself
/// excluded), closest first: `me`'s probe candidates. Linear in
/// `peers.len()` (a bounded heap of the `max` best so far), as a supernode
/// of a large network chooses them among every online peer.
pub fn neighbours(me: i64, peers: &[i64], max: usize) -> Vec<i64> {
    if max == 0 {
        return Vec::new();
    }
    // A max-heap of the best `(affinity, peer)` so far: its top is the
    // worst of them, the one a closer peer replaces.
    let mut best: std::collections::BinaryHeap<(u64, i64)> =
        std::collections::BinaryHeap::with_capacity(max + 1);
    for &p in peers {
        if p == me {
            continue;
        }
        let key = (affinity(me, p), p);
        let closer = best.len() < max || best.peek().is_some_and(|&worst| key < worst);
        // A peer listed twice counts once.
        if closer && !best.iter().any(|&b| b == key) {
            best.push(key);
            if best.len() > max {
                best.pop();
            }
        }
    }
    best.into_sorted_vec().into_iter().map(|(_, p)| p).collect()
}

/// The `max_neigh` fastest of `measured` (`(peer, bandwidth)`), fastest
/// first; ties go to the smaller id. Bandwidths that are not positive
/// numbers do not count.
pub fn fastest(measured: impl IntoIterator<Item = (i64, f64)>, max_neigh: usize) -> Vec<i64> {
    let mut links: Vec<(i64, f64)> = measured
        .into_iter()
        .filter(|(_, b)| b.is_finite() && *b > 0.0)
        .collect();
    links.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    links.dedup_by_key(|l| l.0);
    links.truncate(max_neigh);
    links.into_iter().map(|(p, _)| p).collect()
}

/// The peers `me` should measure now. `bandwidth(p)` is the last measured
/// bandwidth of the link to `p` (`None`: never measured);
/// `due_at(p, neighbour)` is when that link is due to be measured (again),
/// Unix ms, `None` if it was never tried; `neighbour` says whether `p` is
/// among the `max_neigh` fastest measured candidates.
pub fn probe_targets(
    me: i64,
    peers: &[i64],
    bandwidth: impl Fn(i64) -> Option<f64>,
    due_at: impl Fn(i64, bool) -> Option<i64>,
    now_ms: i64,
    policy: ProbePolicy,
) -> Vec<i64> {
    let candidates = neighbours(me, peers, policy.candidates.max(policy.max_neigh));
    let kept = fastest(
        candidates.iter().filter_map(|&p| Some((p, bandwidth(p)?))),
        policy.max_neigh,
    );
    let mut due: Vec<(Option<i64>, usize, i64)> = candidates
        .into_iter()
        .enumerate()
        .map(|(rank, p)| (due_at(p, kept.contains(&p)), rank, p))
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

    /// The definition [`neighbours`] computes in one pass: sort everyone
    /// by affinity, keep the first `max`.
    fn neighbours_by_sorting(me: i64, peers: &[i64], max: usize) -> Vec<i64> {
        let mut others: Vec<i64> = peers.iter().copied().filter(|&p| p != me).collect();
        others.sort_unstable_by_key(|&p| (affinity(me, p), p));
        others.dedup();
        others.truncate(max);
        others
    }

    proptest! {
        #[test]
        fn neighbours_are_the_closest_by_sorting(
            me in 0i64..300,
            peers in proptest::collection::vec(0i64..300, 0..400),
            max in 0usize..40,
        ) {
            prop_assert_eq!(neighbours(me, &peers, max), neighbours_by_sorting(me, &peers, max));
        }

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
    fn unmeasured_candidates_come_first_then_the_oldest() {
        let policy = ProbePolicy {
            max_neigh: 2,
            candidates: 4,
            per_round: 2,
        };
        let peers: Vec<i64> = (0..10).collect();
        let n = neighbours(0, &peers, 4);
        let never = |_| None;
        // Nothing tried: the first two candidates.
        assert_eq!(
            probe_targets(0, &peers, never, |_, _| None, 1_000, policy),
            n[..2]
        );
        // Nothing due yet: nothing to do.
        assert!(probe_targets(0, &peers, never, |_, _| Some(1_001), 1_000, policy).is_empty());
        // One never tried, two due: the untried one, then the longest due.
        let at = |p: i64, _| match p {
            p if p == n[3] => None,
            p if p == n[1] => Some(500),
            p if p == n[2] => Some(800),
            _ => Some(2_000),
        };
        assert_eq!(
            probe_targets(0, &peers, never, at, 1_000, policy),
            vec![n[3], n[1]]
        );
        // Only candidates are ever targets.
        let all = probe_targets(
            0,
            &peers,
            never,
            |_, _| None,
            0,
            ProbePolicy {
                per_round: 9,
                ..policy
            },
        );
        assert_eq!(all, n);
        // Alone: nobody to measure.
        assert!(probe_targets(0, &[0], never, |_, _| None, 0, policy).is_empty());
    }

    /// The fastest measured candidates are the neighbours: the caller is
    /// told which, and can keep them fresher than the rest.
    #[test]
    fn the_fastest_candidates_are_the_neighbours() {
        let policy = ProbePolicy {
            max_neigh: 2,
            candidates: 5,
            per_round: 5,
        };
        let peers: Vec<i64> = (0..10).collect();
        let n = neighbours(0, &peers, 5);
        // n[4] and n[2] are the fastest; n[0] was never measured.
        let bw = |p: i64| match p {
            p if p == n[4] => Some(90.0),
            p if p == n[2] => Some(80.0),
            p if p == n[0] => None,
            _ => Some(10.0),
        };
        let kept = std::cell::RefCell::new(Vec::new());
        let due = |p: i64, neighbour: bool| {
            if neighbour {
                kept.borrow_mut().push(p);
            }
            Some(if neighbour { 100 } else { 1_000 })
        };
        assert!(probe_targets(0, &peers, bw, due, 50, policy).is_empty());
        let mut k = kept.borrow().clone();
        k.sort_unstable();
        let mut want = vec![n[4], n[2]];
        want.sort_unstable();
        assert_eq!(k, want);
        // At 500 only the neighbours are due; at 2 000 everything measured.
        assert_eq!(probe_targets(0, &peers, bw, due, 500, policy).len(), 2);
        assert_eq!(probe_targets(0, &peers, bw, due, 2_000, policy).len(), 5);
        assert_eq!(
            fastest([(3, 1.0), (4, f64::NAN), (5, 2.0), (6, 2.0), (7, -1.0)], 2),
            vec![5, 6]
        );
    }
}
