//! Tests named after the dissertation section they check; the DHHT and the
//! allocator are compared against simple reference models.

use std::collections::BTreeSet;

use proptest::prelude::*;

use crate::*;

// ---------------------------------------------------------------- positions

#[test]
fn s4_2_4_phi_constants_match_their_definitions() {
    let sqrt5 = 5f64.sqrt();
    assert!((PHI_INV - (sqrt5 - 1.0) / 2.0).abs() < 1e-16);
    let phi = (1.0 + sqrt5) / 2.0;
    assert!((PHI_SQUARED - phi * phi).abs() < 1e-15);
    assert!((PHI_SQUARED - (phi + 1.0)).abs() < 1e-15);
    // GOLDEN_STEP is ⌊Φ · 2⁶⁴⌋: check against Φ to ~2⁻⁵³.
    assert!((Position(GOLDEN_STEP).to_f64() - PHI_INV).abs() < 1e-16);
}

/// `{kΦ}` in fixed point equals an exact-enough high-precision evaluation,
/// including for huge k where `k as f64 * PHI_INV` has lost every digit.
#[test]
fn s4_2_4_golden_position_is_frac_k_phi() {
    // Φ·2¹²⁸ to 128 bits, from the integer sequence ⌊Φ·2^128⌋.
    const PHI_128: u128 = 0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C834;
    for k in [1u64, 2, 3, 10, 1000, 123_456_789, 1 << 40, u64::MAX / 3] {
        // {kΦ}·2⁶⁴ = high 64 bits of (k·Φ·2¹²⁸ mod 2¹²⁸).
        let exact = ((k as u128).wrapping_mul(PHI_128) >> 64) as u64;
        let got = golden_position(k).0;
        // The fixed-point step drops Φ's bits below 2⁻⁶⁴: error < k·2⁻⁶⁴.
        let error = exact.wrapping_sub(got);
        assert!(error <= k, "k = {k}: error {error}");
    }
    for k in 1..=1000u64 {
        let float = (k as f64 * PHI_INV).fract();
        assert!(
            (golden_position(k).to_f64() - float).abs() < 1e-12,
            "k = {k}"
        );
    }
    assert_eq!(golden_position(0), Position::ZERO);
}

/// §4.2.4 / the three-distance theorem [Swi58]: the points `{Φ}, …, {nΦ}`
/// split the ring into at most three gap lengths, and the longest gap is at
/// most φ² times the shortest, for every n.
#[test]
fn s4_2_4_golden_points_have_smoothness_at_most_phi_squared() {
    let mut sorted: Vec<u64> = Vec::new();
    let mut worst: f64 = 1.0;
    for n in 1..=2000u64 {
        let p = golden_position(n).0;
        let at = sorted.partition_point(|&q| q < p);
        sorted.insert(at, p);
        if n == 1 {
            continue; // one point: one gap, the whole ring
        }
        let mut gaps: Vec<u64> = sorted.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.push(sorted[0].wrapping_sub(sorted[sorted.len() - 1]));
        let longest = *gaps.iter().max().unwrap();
        let shortest = *gaps.iter().min().unwrap();
        assert!(shortest > 0, "n = {n}: two points coincide");
        let distinct: BTreeSet<u64> = gaps.iter().copied().collect();
        // Fixed-point rounding can split one length into two neighbours
        // (differing by a few units of 2⁻⁶⁴); group lengths 1e-12 apart.
        let mut lengths: Vec<u64> = Vec::new();
        for g in distinct {
            if lengths
                .last()
                .is_none_or(|&l| (g - l) as f64 > 1e-12 * g as f64)
            {
                lengths.push(g);
            }
        }
        assert!(lengths.len() <= 3, "n = {n}: {} gap lengths", lengths.len());
        let ratio = longest as f64 / shortest as f64;
        assert!(ratio <= PHI_SQUARED + 1e-9, "n = {n}: smoothness {ratio}");
        worst = worst.max(ratio);
    }
    // The bound is attained (three lengths a, b, a + b with a/b = φ).
    assert!(worst > PHI_SQUARED - 1e-6, "worst smoothness {worst}");
}

/// §4.2.2: random positions are the first 8 bytes of SHA-1, big-endian.
#[test]
fn s4_2_2_hashed_position_is_sha1_prefix() {
    // SHA-1("abc") = a9993e364706816aba3e25717850c26c9cd0d89d (FIPS 180).
    assert_eq!(hashed_position(b"abc"), Position(0xa999_3e36_4706_816a));
    // SHA-1("") = da39a3ee5e6b4b0d3255bfef95601890afd80709.
    assert_eq!(hashed_position(b""), Position(0xda39_a3ee_5e6b_4b0d));
}

#[test]
fn s4_2_2_canonical_keys_have_a_fixed_layout() {
    assert_eq!(&peer_key(1), b"peer:\0\0\0\0\0\0\0\x01");
    assert_eq!(&peer_key(-1)[5..], &[0xff; 8]);
    assert_eq!(
        &process_key(2, 0x0102_0304),
        b"proc:\0\0\0\0\0\0\0\x02\x01\x02\x03\x04"
    );
    // Peers and processes never share a key, so never a position by design.
    assert_ne!(&peer_key(7)[..5], &process_key(7, 0)[..5]);
    assert_ne!(
        hashed_position(&process_key(1, 0)),
        hashed_position(&process_key(1, 1))
    );
}

#[test]
fn s4_2_4_position_schemes() {
    assert_eq!(PositionScheme::default(), PositionScheme::Golden);
    let g = PositionScheme::Golden;
    assert!(g.needs_index());
    assert_eq!(g.peer_position(99, 5), golden_position(5));
    assert_eq!(g.process_position(1, 2, 7), golden_position(7));
    let r = PositionScheme::Random;
    assert!(!r.needs_index());
    assert_eq!(r.peer_position(99, 5), hashed_position(&peer_key(99)));
    assert_eq!(r.peer_position(99, 5), r.peer_position(99, 6));
    assert_eq!(
        r.process_position(1, 2, 7),
        hashed_position(&process_key(1, 2))
    );
    for s in [PositionScheme::Random, PositionScheme::Golden] {
        assert_eq!(s.to_string().parse::<PositionScheme>(), Ok(s));
    }
    assert_eq!("GOLDEN".parse(), Ok(PositionScheme::Golden));
    let err = "multi".parse::<PositionScheme>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown position scheme `multi`; use `random` or `golden`"
    );
}

#[test]
fn ccw_distance_wraps() {
    let x = Position(10);
    assert_eq!(x.ccw_distance_to(Position(3)), Position(7));
    assert_eq!(x.ccw_distance_to(x), Position::ZERO);
    assert_eq!(x.ccw_distance_to(Position(11)), Position(u64::MAX));
    assert_eq!(Position(1 << 63).to_f64(), 0.5);
    assert_eq!(Position::ZERO.to_f64(), 0.0);
}

// ------------------------------------------------------------ the allocator

#[test]
fn s4_2_4_freed_indices_are_reused_smallest_first() {
    let mut ix = IndexAllocator::new();
    assert!(ix.is_empty());
    for k in 1..=6 {
        assert_eq!(ix.alloc(), k);
    }
    assert!(ix.free(5));
    assert!(ix.free(2));
    assert!(!ix.free(2), "double free is a no-op");
    assert!(!ix.free(0));
    assert!(!ix.free(7));
    assert_eq!(ix.allocated().collect::<Vec<_>>(), [1, 3, 4, 6]);
    assert_eq!(ix.alloc(), 2);
    assert_eq!(ix.alloc(), 5);
    assert_eq!(ix.alloc(), 7);
    // Freeing from the top shrinks the range back.
    for k in (1..=7).rev() {
        assert!(ix.free(k));
    }
    assert!(ix.is_empty());
    assert_eq!(ix, IndexAllocator::new());
}

/// A restarted supernode restores the persisted indices and then allocates
/// exactly as the original would have.
#[test]
fn s4_2_4_restored_allocator_continues_like_the_original() {
    let mut original = IndexAllocator::new();
    for _ in 0..10 {
        original.alloc();
    }
    for k in [2, 3, 7] {
        original.free(k);
    }
    let mut restored = IndexAllocator::new();
    // Order of reload does not matter.
    for k in [10, 1, 5, 4, 9, 6, 8] {
        assert!(restored.restore(k));
    }
    assert!(!restored.restore(5), "already allocated");
    assert!(!restored.restore(0), "0 is never an index");
    assert_eq!(restored, original);
    for _ in 0..5 {
        assert_eq!(restored.alloc(), original.alloc());
    }
}

#[test]
fn huge_restored_index_costs_one_range() {
    let mut ix = IndexAllocator::new();
    assert!(ix.restore(u64::MAX));
    assert_eq!(ix.len(), 1);
    assert_eq!(ix.highest(), Some(u64::MAX));
    assert_eq!(ix.alloc(), 1);
    assert_eq!(ix.alloc(), 2);
    assert!(ix.free(u64::MAX));
    assert_eq!(ix.allocated().collect::<Vec<_>>(), [1, 2]);
    assert_eq!(ix.alloc(), 3);
}

#[derive(Debug, Clone)]
enum IndexOp {
    Alloc,
    Free(u64),
    Restore(u64),
}

fn index_op() -> impl Strategy<Value = IndexOp> {
    prop_oneof![
        4 => Just(IndexOp::Alloc),
        3 => (0u64..40).prop_map(IndexOp::Free),
        1 => (0u64..48).prop_map(IndexOp::Restore),
    ]
}

proptest! {
    /// The allocator against a `BTreeSet` of allocated indices.
    #[test]
    fn s4_2_4_index_allocator_matches_set_model(ops in prop::collection::vec(index_op(), 0..200)) {
        let mut ix = IndexAllocator::new();
        let mut model: BTreeSet<u64> = BTreeSet::new();
        for op in ops {
            match op {
                IndexOp::Alloc => {
                    let expected = (1..).find(|k| !model.contains(k)).unwrap();
                    prop_assert_eq!(ix.alloc(), expected);
                    model.insert(expected);
                }
                IndexOp::Free(k) => prop_assert_eq!(ix.free(k), model.remove(&k)),
                IndexOp::Restore(k) => prop_assert_eq!(ix.restore(k), k != 0 && model.insert(k)),
            }
            prop_assert_eq!(ix.allocated().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(ix.len(), model.len() as u64);
            prop_assert_eq!(ix.is_empty(), model.is_empty());
            prop_assert_eq!(ix.highest(), model.last().copied());
            for k in 0..50 {
                prop_assert_eq!(ix.is_allocated(k), model.contains(&k));
            }
        }
    }
}

// ----------------------------------------------------------------- the DHHT

fn peer(id: i64, position: u64, weight: f64) -> Peer {
    Peer {
        id,
        position: Position(position),
        weight,
    }
}

/// §4.2.2, Fig. 4.1: with equal weights a process goes to the nearest peer
/// counter-clockwise; a heavier peer reaches further.
#[test]
fn s4_2_2_lower_envelope_by_hand() {
    let quarter = 1u64 << 62;
    let mut d = Dhht::new();
    assert_eq!(d.lookup(Position(5)), None);
    d.insert(peer(1, 0, 1.0)).unwrap();
    d.insert(peer(2, 2 * quarter, 1.0)).unwrap();
    assert_eq!(d.lookup(Position(quarter)), Some(1));
    assert_eq!(d.lookup(Position(3 * quarter)), Some(2));
    assert_eq!(d.lookup(Position(2 * quarter)), Some(2), "x on a peer");
    assert_eq!(d.lookup(Position(2 * quarter - 1)), Some(1));
    assert_eq!(d.lookup(Position::ZERO), Some(1));
    // Peer 1 at weight 3: at 3/4, its value (3/4)/3 = 1/4 equals peer 2's
    // (1/4)/1; the tie goes to the smaller id, 1. Just before, peer 2 wins.
    d.update(peer(1, 0, 3.0)).unwrap();
    assert_eq!(d.lookup(Position(3 * quarter)), Some(1));
    assert_eq!(d.lookup(Position(2 * quarter + (1 << 40))), Some(2));
    assert_eq!(d.lookup(Position(3 * quarter + (1 << 40))), Some(1));
}

#[test]
fn s4_2_2_ineligible_peers_are_rejected_and_nothing_changes() {
    let mut d = Dhht::new();
    d.insert(peer(1, 100, 1.0)).unwrap();
    for w in [0.0, -0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let err = d.insert(peer(2, 5, w)).unwrap_err();
        assert!(matches!(err, PlacementError::InvalidWeight { peer: 2, .. }));
        assert!(err.to_string().starts_with("peer 2 has weight"));
        let err = d.update(peer(1, 5, w)).unwrap_err();
        assert!(matches!(err, PlacementError::InvalidWeight { peer: 1, .. }));
    }
    assert_eq!(
        d.insert(peer(1, 7, 2.0)),
        Err(PlacementError::DuplicatePeer { peer: 1 })
    );
    assert_eq!(
        d.update(peer(3, 7, 2.0)),
        Err(PlacementError::UnknownPeer { peer: 3 })
    );
    assert_eq!(d.len(), 1);
    assert_eq!(d.get(1), Some(peer(1, 100, 1.0)));
    assert_eq!(d.max_weight(), Some(1.0));
    assert_eq!(d.remove(3), None);
    assert_eq!(d.remove(1), Some(peer(1, 100, 1.0)));
    assert!(d.is_empty());
    assert_eq!(d.max_weight(), None);
}

#[test]
fn max_weight_follows_removals_and_updates() {
    let mut d = Dhht::new();
    d.insert(peer(1, 1, 2.0)).unwrap();
    d.insert(peer(2, 2, 5.0)).unwrap();
    d.insert(peer(3, 3, 5.0)).unwrap();
    assert_eq!(d.max_weight(), Some(5.0));
    d.remove(2);
    assert_eq!(d.max_weight(), Some(5.0));
    assert_eq!(d.update(peer(3, 9, 1.0)), Ok(peer(3, 3, 5.0)));
    assert_eq!(d.max_weight(), Some(2.0));
    assert_eq!(d.total_weight(), 3.0);
    let ring: Vec<i64> = d.peers().map(|p| p.id).collect();
    assert_eq!(ring, [1, 3]);
}

/// With equal weights and distinct positions, the pruned walk examines two
/// peers: the winner and the one that proves nothing further can win.
#[test]
fn s4_2_2_lookup_does_not_scan_all_peers() {
    let mut d = Dhht::new();
    for k in 1..=1000u64 {
        d.insert(Peer {
            id: k as i64,
            position: golden_position(k),
            weight: 1.0,
        })
        .unwrap();
    }
    for k in 1..=500u64 {
        let x = golden_position(k * 7 + 100_000);
        let (owner, examined) = d.walk(x);
        assert_eq!(owner, d.lookup_naive(x));
        assert!(examined <= 2, "examined {examined} of 1000 peers");
    }
    // Weight ratio 10: still a short walk (the envelope bound ~ ratio × gap).
    for k in (1..=1000u64).step_by(10) {
        d.update(Peer {
            id: k as i64,
            position: golden_position(k),
            weight: 10.0,
        })
        .unwrap();
    }
    let most = (1..=500u64)
        .map(|k| d.walk(golden_position(k * 7 + 100_000)).1)
        .max()
        .unwrap();
    assert!(most <= 40, "examined up to {most} of 1000 peers");
}

fn weight() -> impl Strategy<Value = f64> {
    // Ratios up to 1000, plus a few exact repeats for ties.
    prop_oneof![
        (1u32..=1000).prop_map(f64::from),
        (0.001f64..1.0),
        Just(1.0),
        Just(2.0),
    ]
}

fn peer_set() -> impl Strategy<Value = Vec<Peer>> {
    // Positions from a small pool (duplicates) or anywhere (incl. extremes).
    let position = prop_oneof![
        (0u64..8).prop_map(|k| k << 61),
        any::<u64>(),
        Just(0u64),
        Just(u64::MAX),
    ];
    prop::collection::btree_map(-50i64..50, (position, weight()), 1..40).prop_map(|m| {
        m.into_iter()
            .map(|(id, (p, w))| peer(id, p, w))
            .collect::<Vec<_>>()
    })
}

proptest! {
    /// §4.2.2: the pruned lookup equals the linear scan of the lower
    /// envelope — for random peer sets with weight ratios up to 1000,
    /// duplicate positions, single peers, x on a peer, and x = 0.
    #[test]
    fn s4_2_2_lookup_matches_naive_lower_envelope(
        peers in peer_set(),
        xs in prop::collection::vec(any::<u64>(), 1..30),
    ) {
        let mut d = Dhht::new();
        for p in &peers {
            d.insert(*p).unwrap();
        }
        let on_peers = peers.iter().flat_map(|p| {
            [p.position.0, p.position.0.wrapping_add(1), p.position.0.wrapping_sub(1)]
        });
        let special = [0u64, 1, u64::MAX, 1 << 63];
        for x in xs.into_iter().chain(on_peers).chain(special) {
            let x = Position(x);
            let fast = d.lookup(x);
            prop_assert_eq!(fast, d.lookup_naive(x), "x = {:?}", x);
            prop_assert!(fast.is_some());
        }
    }

    /// The same after a random sequence of inserts, updates and removals,
    /// with the table's bookkeeping (ring order, max weight) checked too.
    #[test]
    fn s4_2_2_lookup_stays_exact_under_churn(
        ops in prop::collection::vec((0i64..12, any::<u64>(), weight(), 0u8..3), 1..80),
        xs in prop::collection::vec(any::<u64>(), 8),
    ) {
        let mut d = Dhht::new();
        let mut model: std::collections::BTreeMap<i64, Peer> = Default::default();
        for (id, pos, w, kind) in ops {
            let p = peer(id, pos % 16 * (1 << 60), w);
            match kind {
                0 => {
                    let fresh = !model.contains_key(&id);
                    prop_assert_eq!(d.insert(p).is_ok(), fresh);
                    if fresh {
                        model.insert(id, p);
                    }
                }
                1 => prop_assert_eq!(d.update(p).ok(), model.get_mut(&id).map(|old| std::mem::replace(old, p))),
                _ => prop_assert_eq!(d.remove(id), model.remove(&id)),
            }
            prop_assert_eq!(d.len(), model.len());
            let max = model.values().map(|p| p.weight).fold(None, |m: Option<f64>, w| Some(m.map_or(w, |m| m.max(w))));
            prop_assert_eq!(d.max_weight(), max);
            // Built at once from the same peers: the same table.
            let (bulk, rejected) = Dhht::from_peers(model.values().copied());
            prop_assert!(rejected.is_empty());
            prop_assert_eq!(bulk.peers().collect::<Vec<_>>(), d.peers().collect::<Vec<_>>());
            prop_assert_eq!(bulk.max_weight(), d.max_weight());
            for &x in &xs {
                prop_assert_eq!(bulk.lookup(Position(x)), d.lookup(Position(x)));
            }
            // The median of the others: sort them, take index len / 2.
            for id in model.keys().copied().chain([-1]) {
                let mut others: Vec<f64> = model
                    .values()
                    .filter(|p| p.id != id)
                    .map(|p| p.weight)
                    .collect();
                others.sort_by(f64::total_cmp);
                prop_assert_eq!(d.median_weight_of_others(id), others.get(others.len() / 2).copied());
            }
            let ring: Vec<(Position, i64)> = d.peers().map(|p| (p.position, p.id)).collect();
            prop_assert!(ring.windows(2).all(|w| w[0] < w[1]));
            for &x in &xs {
                let x = Position(x);
                prop_assert_eq!(d.lookup(x), d.lookup_naive(x));
            }
        }
    }
}

/// §4.2.4, Det/Det: peers and processes both at golden points, equal
/// weights. A process goes to the nearest peer counter-clockwise, so each
/// peer's share of the ring is the gap after it; by the three-distance
/// theorem every gap lies within a factor φ² ≈ 2.618 of the fair 1/n (the
/// shortest is ≤ 1/n ≤ the longest ≤ φ² × the shortest). The processes, also
/// golden points, fill each gap with a count error of O(log m) (low
/// discrepancy), small against ≥ 64 processes per peer. So every peer's
/// process count is asserted to lie within [1/3, 3] × m/n — φ² plus slack for
/// the counting error. (Observed for n ≤ 200: 0.45 to 1.88.)
#[test]
fn s4_2_4_det_det_gives_every_peer_a_fair_share_within_phi_squared() {
    for n in 1..=80u64 {
        let mut d = Dhht::new();
        for k in 1..=n {
            d.insert(Peer {
                id: k as i64,
                position: golden_position(k),
                weight: 1.0,
            })
            .unwrap();
        }
        for per_peer in [64u64, 100, 257] {
            let m = per_peer * n;
            let mut counts = vec![0u64; n as usize + 1];
            for k in 1..=m {
                let owner = d.lookup(golden_position(k)).unwrap();
                counts[owner as usize] += 1;
            }
            let fair = per_peer as f64;
            for (id, &c) in counts.iter().enumerate().skip(1) {
                let share = c as f64 / fair;
                assert!(
                    (1.0 / 3.0..=3.0).contains(&share),
                    "n = {n}, m = {m}: peer {id} got {c} (share {share:.3} of fair)"
                );
            }
        }
    }
}

/// §4.2.2: heavier peers receive more. With Det/Det positions and every
/// fourth peer four times as strong, the strong peers together receive
/// between half and twice their weight's share of the processes.
/// (A single lower envelope is only roughly proportional — §4.2.3 cites
/// the multiple-hashing bounds as the improvement — and the observed ratios
/// here are 0.69–0.95.)
#[test]
fn s4_2_2_weighted_share_follows_weight() {
    for n in [16u64, 64, 256] {
        let mut d = Dhht::new();
        for k in 1..=n {
            let weight = if k % 4 == 0 { 4.0 } else { 1.0 };
            d.insert(Peer {
                id: k as i64,
                position: golden_position(k),
                weight,
            })
            .unwrap();
        }
        let m = 100 * n;
        let strong = (1..=m)
            .filter(|&k| d.lookup(golden_position(k)).unwrap() % 4 == 0)
            .count() as f64;
        let strong_weight = (n / 4) as f64 * 4.0;
        let expected = m as f64 * strong_weight / d.total_weight();
        let ratio = strong / expected;
        assert!(
            (0.5..=2.0).contains(&ratio),
            "n = {n}: strong peers got {ratio:.3} of their share"
        );
    }
}

// ------------------------------------------------------- the hash table

/// The reference model of a [`HashTable`]: peers and processes with their
/// positions, every assignment recomputed from scratch by a linear scan.
/// Independent of the table's code except for the shared hash functions.
#[derive(Default)]
struct Model {
    /// Peer → (position or seed, weight).
    peers: std::collections::BTreeMap<PeerId, (Position, f64)>,
    peer_det: std::collections::BTreeMap<PeerId, u64>,
    /// Process → position.
    processes: std::collections::BTreeMap<ProcessKey, Position>,
    process_det: std::collections::BTreeMap<ProcessKey, u64>,
}

fn smallest_free(used: impl Iterator<Item = u64>) -> u64 {
    let used: BTreeSet<u64> = used.collect();
    (1..).find(|k| !used.contains(k)).unwrap()
}

impl Model {
    fn set_peer(&mut self, v: HashVariant, id: PeerId, w: f64) {
        if let Some(p) = self.peers.get_mut(&id) {
            p.1 = w;
            return;
        }
        let pos = match v {
            HashVariant::Dhht {
                peers: Hashing::Det,
                ..
            } => {
                let k = smallest_free(self.peer_det.values().copied());
                self.peer_det.insert(id, k);
                golden_position(k)
            }
            _ => hashed_position(&peer_key(id)),
        };
        self.peers.insert(id, (pos, w));
    }

    fn remove_peer(&mut self, id: PeerId) {
        self.peers.remove(&id);
        self.peer_det.remove(&id);
    }

    fn add_process(&mut self, v: HashVariant, p: ProcessKey) {
        if self.processes.contains_key(&p) {
            return;
        }
        let pos = match v {
            HashVariant::Dhht {
                processes: Hashing::Det,
                ..
            } => {
                let k = smallest_free(self.process_det.values().copied());
                self.process_det.insert(p, k);
                golden_position(k)
            }
            _ => hashed_position(&process_key(p.job, p.pid)),
        };
        self.processes.insert(p, pos);
    }

    fn remove_process(&mut self, p: ProcessKey) {
        self.processes.remove(&p);
        self.process_det.remove(&p);
    }

    fn value(
        v: HashVariant,
        peer: PeerId,
        (pos, w): (Position, f64),
        p: ProcessKey,
        x: Position,
    ) -> f64 {
        match v {
            HashVariant::Dhht { .. } => envelope_value(x, pos, w),
            HashVariant::Multi => peer_hash(peer, p) / w,
            HashVariant::Rendezvous => -peer_hash(peer, p).ln() / w,
        }
    }

    fn owner(&self, v: HashVariant, p: ProcessKey) -> Option<PeerId> {
        let x = self.processes[&p];
        let mut best: Option<(f64, PeerId)> = None;
        for (&id, &peer) in &self.peers {
            let value = Self::value(v, id, peer, p, x);
            // Ties go to the smaller id: peers are scanned ascending.
            if best.is_none_or(|(b, _)| value < b) {
                best = Some((value, id));
            }
        }
        best.map(|(_, id)| id)
    }

    fn assignment(&self, v: HashVariant) -> std::collections::BTreeMap<ProcessKey, Option<PeerId>> {
        self.processes
            .keys()
            .map(|&p| (p, self.owner(v, p)))
            .collect()
    }
}

fn diff(
    before: &std::collections::BTreeMap<ProcessKey, Option<PeerId>>,
    after: &std::collections::BTreeMap<ProcessKey, Option<PeerId>>,
) -> Vec<Move> {
    after
        .iter()
        .filter_map(|(&process, &to)| {
            let from = before.get(&process).copied().flatten();
            (from != to).then_some(Move { process, from, to })
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Event {
    SetPeer(PeerId, f64),
    RemovePeer(PeerId),
    AddProcess(ProcessKey),
    RemoveProcess(ProcessKey),
}

fn event() -> impl Strategy<Value = Event> {
    let power = prop_oneof![
        3 => (1u32..=8).prop_map(f64::from),
        2 => 0.01f64..100.0,
        1 => Just(1e-100),
        1 => Just(1e100),
    ];
    let key = (0i64..4, 0u32..25).prop_map(|(job, pid)| ProcessKey { job, pid });
    prop_oneof![
        4 => (0i64..10, power).prop_map(|(id, w)| Event::SetPeer(id, w)),
        1 => (0i64..10).prop_map(Event::RemovePeer),
        4 => key.clone().prop_map(Event::AddProcess),
        2 => key.prop_map(Event::RemoveProcess),
    ]
}

/// Checks the table's bookkeeping against a full assignment.
fn check_table(
    t: &HashTable,
    expected: &std::collections::BTreeMap<ProcessKey, Option<PeerId>>,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(t.process_count(), expected.len());
    for (&p, &owner) in expected {
        prop_assert_eq!(t.peer_of(p), owner, "process {:?}", p);
    }
    for (peer, _) in t.peers() {
        let on: Vec<ProcessKey> = t.processes_on(peer).collect();
        let want: Vec<ProcessKey> = expected
            .iter()
            .filter(|&(_, &o)| o == Some(peer))
            .map(|(&p, _)| p)
            .collect();
        prop_assert_eq!(on, want, "processes on peer {}", peer);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// §4.2.2–4.2.4, for every variant: the incremental move lists of
    /// `set_peer` / `remove_peer` equal the diff of the naive recomputation
    /// of every assignment before and after, for random sequences of joins,
    /// leaves, power changes and process arrivals/departures (powers up to
    /// the table's bounds, with repeats for ties). Also: a power increase or
    /// a join only moves processes *to* the peer, a decrease or a leave only
    /// *away* from it, and `add_process` / `remove_process` report the naive
    /// peer.
    #[test]
    fn s4_2_incremental_moves_equal_naive_recomputation_diff(
        events in prop::collection::vec(event(), 1..120),
    ) {
        for v in HashVariant::ALL {
            let mut t = HashTable::new(v);
            let mut m = Model::default();
            let mut before = m.assignment(v);
            for e in &events {
                match *e {
                    Event::SetPeer(id, w) => {
                        let old = m.peers.get(&id).map(|p| p.1);
                        m.set_peer(v, id, w);
                        let after = m.assignment(v);
                        let moves = t.set_peer(id, w).unwrap();
                        prop_assert_eq!(&moves, &diff(&before, &after), "{} {:?}", v, e);
                        for mv in &moves {
                            if old.is_none_or(|o| w > o) {
                                prop_assert_eq!(mv.to, Some(id), "join/increase pulls only");
                            } else {
                                prop_assert_eq!(mv.from, Some(id), "decrease pushes only");
                            }
                        }
                        before = after;
                    }
                    Event::RemovePeer(id) => {
                        m.remove_peer(id);
                        let after = m.assignment(v);
                        let moves = t.remove_peer(id);
                        prop_assert_eq!(&moves, &diff(&before, &after), "{} {:?}", v, e);
                        prop_assert!(moves.iter().all(|mv| mv.from == Some(id)));
                        before = after;
                    }
                    Event::AddProcess(p) => {
                        m.add_process(v, p);
                        let after = m.assignment(v);
                        prop_assert_eq!(t.add_process(p), after[&p], "{} {:?}", v, e);
                        prop_assert!(diff(&before, &after).iter().all(|mv| mv.process == p));
                        before = after;
                    }
                    Event::RemoveProcess(p) => {
                        m.remove_process(p);
                        prop_assert_eq!(t.remove_process(p), before.get(&p).copied().flatten());
                        before = m.assignment(v);
                    }
                }
                check_table(&t, &before)?;
                prop_assert_eq!(t.naive_assignment(), before.clone());
            }
        }
    }

    /// §4.2.2: "the assignment of a process to a peer does not depend on the
    /// presence or assignment of other processes … schedules can be easily
    /// reconstructed by any supernode": two independent instances fed the
    /// same events produce the same schedule and the same moves.
    #[test]
    fn s4_2_2_two_instances_fed_the_same_events_agree(
        events in prop::collection::vec(event(), 1..80),
    ) {
        for v in HashVariant::ALL {
            let mut a = HashTable::new(v);
            let mut b = HashTable::new(v);
            for e in &events {
                match *e {
                    Event::SetPeer(id, w) => prop_assert_eq!(a.set_peer(id, w), b.set_peer(id, w)),
                    Event::RemovePeer(id) => prop_assert_eq!(a.remove_peer(id), b.remove_peer(id)),
                    Event::AddProcess(p) => prop_assert_eq!(a.add_process(p), b.add_process(p)),
                    Event::RemoveProcess(p) => prop_assert_eq!(a.remove_process(p), b.remove_process(p)),
                }
            }
            prop_assert_eq!(a.naive_assignment(), b.naive_assignment());
            prop_assert_eq!(a.peers().collect::<Vec<_>>(), b.peers().collect::<Vec<_>>());
        }
    }

    /// The arcs a peer can win, used for incremental joins and increases,
    /// cover every point it wins — with duplicate positions, extreme
    /// positions and weight ratios up to 1000 (ties included).
    #[test]
    fn s4_2_2_pull_arcs_cover_every_point_the_peer_wins(
        peers in peer_set(),
        pick in any::<prop::sample::Index>(),
        xs in prop::collection::vec(any::<u64>(), 1..40),
    ) {
        let mut d = Dhht::new();
        for p in &peers {
            d.insert(*p).unwrap();
        }
        let me = peers[pick.index(peers.len())];
        let arcs = d.pull_arcs(me.id, me.position, me.weight);
        prop_assert!(arcs.windows(2).all(|w| w[0].1 < w[1].0), "disjoint, ascending");
        let near = peers.iter().flat_map(|p| {
            [p.position.0, p.position.0.wrapping_add(1), p.position.0.wrapping_sub(1)]
        });
        for x in xs.into_iter().chain(near).chain([0, u64::MAX]) {
            let x = Position(x);
            if d.lookup_naive(x) == Some(me.id) {
                let t = x.ccw_distance_to(me.position).0;
                prop_assert!(
                    arcs.iter().any(|&(a, b)| a <= t && t <= b),
                    "x = {:?} won at distance {} outside {:?}", x, t, arcs
                );
            }
        }
    }
}

#[test]
fn hash_variant_names_round_trip() {
    let labels: Vec<&str> = HashVariant::ALL.iter().map(|v| v.label()).collect();
    assert_eq!(
        labels,
        [
            "DHHT (R/R)",
            "DHHT (R/D)",
            "DHHT (D/R)",
            "DHHT (D/D)",
            "DHHT (Multi)",
            "Rendezvous"
        ]
    );
    for v in HashVariant::ALL {
        assert_eq!(v.slug().parse::<HashVariant>(), Ok(v));
        assert_eq!(v.slug().to_uppercase().parse::<HashVariant>(), Ok(v));
        assert_eq!(v.to_string(), v.label());
    }
    let err = "ws".parse::<HashVariant>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown placement variant `ws`; use one of rr, rd, dr, dd, multi, rendezvous"
    );
}

#[test]
fn hash_table_rejects_bad_powers_and_changes_nothing() {
    for v in HashVariant::ALL {
        let mut t = HashTable::new(v);
        t.set_peer(1, 2.0).unwrap();
        t.add_process(ProcessKey { job: 1, pid: 0 });
        for w in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = t.set_peer(1, w).unwrap_err();
            assert!(matches!(err, PlacementError::InvalidWeight { peer: 1, .. }));
        }
        for w in [1e-101, 1e101] {
            let err = t.set_peer(2, w).unwrap_err();
            assert!(matches!(
                err,
                PlacementError::PowerOutOfRange { peer: 2, .. }
            ));
            assert!(err.to_string().contains("scale the benchmark speeds"));
        }
        assert_eq!(t.peers().collect::<Vec<_>>(), [(1, 2.0)]);
        assert_eq!(t.peer_of(ProcessKey { job: 1, pid: 0 }), Some(1));
        assert_eq!(t.set_peer(1, 2.0), Ok(vec![]), "same power: no moves");
        assert_eq!(t.remove_peer(9), vec![], "unknown peer");
    }
}

/// No peer: processes wait unplaced and are placed by the first join.
#[test]
fn hash_table_places_waiting_processes_when_a_peer_joins() {
    for v in HashVariant::ALL {
        let mut t = HashTable::new(v);
        let keys: Vec<ProcessKey> = (0..5).map(|pid| ProcessKey { job: 7, pid }).collect();
        for &k in &keys {
            assert_eq!(t.add_process(k), None);
        }
        let moves = t.set_peer(3, 1.0).unwrap();
        let want: Vec<Move> = keys
            .iter()
            .map(|&process| Move {
                process,
                from: None,
                to: Some(3),
            })
            .collect();
        assert_eq!(moves, want, "{v}");
        let moves = t.remove_peer(3);
        assert!(moves.iter().all(|m| m.to.is_none()) && moves.len() == 5);
        assert_eq!(t.process_count(), 5);
    }
}

/// §4.2.4: Det processes take the smallest free golden index, so a process
/// added after another finished reuses its position (no migration).
#[test]
fn s4_2_4_det_processes_reuse_freed_positions() {
    let v = HashVariant::Dhht {
        peers: Hashing::Det,
        processes: Hashing::Det,
    };
    let mut t = HashTable::new(v);
    t.set_peer(10, 1.0).unwrap();
    t.set_peer(11, 1.0).unwrap();
    assert_eq!(t.peer_position(10), Some(golden_position(1)));
    assert_eq!(t.peer_position(11), Some(golden_position(2)));
    let k = |pid| ProcessKey { job: 1, pid };
    for pid in 0..4 {
        t.add_process(k(pid));
    }
    assert_eq!(t.process_position(k(2)), Some(golden_position(3)));
    t.remove_process(k(2));
    t.add_process(k(9));
    assert_eq!(t.process_position(k(9)), Some(golden_position(3)));
    t.remove_peer(10);
    t.set_peer(12, 1.0).unwrap();
    assert_eq!(t.peer_position(12), Some(golden_position(1)));
}

// ------------------------------------------------- shares of the variants

/// Twelve peers with powers in [1, 8] (ratio ρ = 8), repeats avoided.
const SHARE_WEIGHTS: [f64; 12] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 1.5, 2.5, 5.5, 7.5];

/// Peer `i`'s exact probability of winning under multiple hashing:
/// `P_i = w_i ∫₀^{1/w_i} Π_{j≠i} max(0, 1 − w_j·v) dv` (the `r_{j,x}/w_j`
/// are independent, uniform on `[0, 1/w_j)`), by the midpoint rule.
fn multi_probability(weights: &[f64], i: usize) -> f64 {
    let steps = 100_000;
    let h = 1.0 / weights[i] / steps as f64;
    let mut sum = 0.0;
    for k in 0..steps {
        let v = (k as f64 + 0.5) * h;
        let mut product = 1.0;
        for (j, &w) in weights.iter().enumerate() {
            if j != i {
                product *= (1.0 - w * v).max(0.0);
            }
        }
        sum += product;
    }
    weights[i] * sum * h
}

/// Places processes `(job, 0..m)` on peers `base + i` with `weights[i]`
/// and counts them per peer.
fn counts(v: HashVariant, weights: &[f64], base: i64, job: i64, m: u32) -> Vec<u32> {
    let mut t = HashTable::new(v);
    for (i, &w) in weights.iter().enumerate() {
        t.set_peer(base + i as i64, w).unwrap();
    }
    let mut c = vec![0u32; weights.len()];
    for pid in 0..m {
        let owner = t.add_process(ProcessKey { job, pid }).unwrap();
        c[(owner - base) as usize] += 1;
    }
    c
}

/// Weighted rendezvous hashing: `−ln(r_{i,x})/w_i` is exponential with
/// rate `w_i`, and the minimum of independent exponentials is peer `i`'s
/// with probability exactly `w_i/W`. Each of 30 000 processes is a
/// Bernoulli trial, so every count lies within 5 standard deviations of
/// `m·w_i/W`.
#[test]
fn rendezvous_share_is_exactly_proportional_to_power() {
    let m = 30_000;
    let total: f64 = SHARE_WEIGHTS.iter().sum();
    let c = counts(HashVariant::Rendezvous, &SHARE_WEIGHTS, 0, 1, m);
    for (i, &w) in SHARE_WEIGHTS.iter().enumerate() {
        let p = w / total;
        let sd = (m as f64 * p * (1.0 - p)).sqrt();
        let dev = (c[i] as f64 - m as f64 * p).abs() / sd;
        assert!(
            dev <= 5.0,
            "peer {i} (w = {w}): {} processes, {dev:.1} sd off",
            c[i]
        );
    }
}

/// §4.2.3, [SS05]: with multiple hashing, peer `i` wins with probability
/// `(1 − √ε)·w_i/W ≤ p_i ≤ (1 + ε)·w_i/W`, here with ε = w_max/W (the
/// largest relative power). The exact `p_i` (numerical integral) is checked
/// against that interval, and the counts of 30 000 processes against `p_i`
/// within 5 standard deviations.
#[test]
fn s4_2_3_multi_share_lies_within_the_ss05_bounds() {
    let m = 30_000;
    let total: f64 = SHARE_WEIGHTS.iter().sum();
    let eps = 8.0 / total;
    let c = counts(HashVariant::Multi, &SHARE_WEIGHTS, 0, 1, m);
    let mut sum = 0.0;
    for (i, &w) in SHARE_WEIGHTS.iter().enumerate() {
        let p = multi_probability(&SHARE_WEIGHTS, i);
        sum += p;
        let ratio = p / (w / total);
        assert!(
            (1.0 - eps.sqrt()..=1.0 + eps).contains(&ratio),
            "peer {i}: p = {p:.4} is {ratio:.3} of w/W"
        );
        let sd = (m as f64 * p * (1.0 - p)).sqrt();
        let dev = (c[i] as f64 - m as f64 * p).abs() / sd;
        assert!(
            dev <= 5.0,
            "peer {i} (w = {w}): {} processes, {dev:.1} sd off",
            c[i]
        );
    }
    assert!((sum - 1.0).abs() < 1e-6, "the p_i sum to {sum}");
}

/// §4.2.2, Rnd peers: for a fixed process position `x`, iid uniform peer
/// positions make every `(x − p_i) mod 1` iid uniform, so over the random
/// peer positions each peer's *expected* share equals multiple hashing's
/// `p_i` exactly — whatever the processes' scheme. A single table is far
/// from it (its shares vary with the random gaps: a standard deviation of
/// about 0.8 × `p_i` measured here), so the test averages 200 tables with
/// different peer ids; the mean's standard deviation is then ≈ 0.057 × `p_i`
/// and every mean must lie within ±25 % of `p_i` (over 4 sd).
#[test]
fn s4_2_2_random_peers_share_in_expectation_equals_multiple_hashing() {
    let tables = 200;
    let m = 2_000;
    let p: Vec<f64> = (0..SHARE_WEIGHTS.len())
        .map(|i| multi_probability(&SHARE_WEIGHTS, i))
        .collect();
    for processes in [Hashing::Rnd, Hashing::Det] {
        let v = HashVariant::Dhht {
            peers: Hashing::Rnd,
            processes,
        };
        let mut mean = vec![0.0; SHARE_WEIGHTS.len()];
        for k in 0..tables {
            let c = counts(v, &SHARE_WEIGHTS, 100 * k, k, m);
            for (i, &ci) in c.iter().enumerate() {
                mean[i] += ci as f64 / m as f64 / tables as f64;
            }
        }
        for (i, (&got, &want)) in mean.iter().zip(&p).enumerate() {
            let ratio = got / want;
            assert!(
                (0.75..=1.25).contains(&ratio),
                "{v}: peer {i} averages {ratio:.3} of p_i"
            );
        }
    }
}

/// §4.2.4, Det peers with weights: with golden peer positions every gap
/// lies in `[g, φ²·g]` (three-distance theorem), hence `g ≥ 1/(φ²n)`.
/// A peer wins at least the first `g·w_i/w_max` of its own gap (every
/// other peer is at least `g` further away and has at most `w_max`), and
/// nothing beyond distance `w_i·φ²g/w_min` (the nearest peer behind any
/// point is within `φ²g` and has at least `w_min`). So every peer's share
/// is within `[1/(φ²ρ), φ²ρ] × w_i/W`, ρ = w_max/w_min, for every n.
/// Measured with Det processes (low discrepancy: counts are the arc lengths
/// up to a few processes). Random peers break the lower bound: their
/// shortest gap is Θ(1/n²).
#[test]
fn s4_2_4_det_peers_keep_every_share_within_phi_squared_times_weight_ratio() {
    let rho = 8.0;
    let (low, high) = (1.0 / (PHI_SQUARED * rho), PHI_SQUARED * rho);
    let dd = HashVariant::Dhht {
        peers: Hashing::Det,
        processes: Hashing::Det,
    };
    let rd = HashVariant::Dhht {
        peers: Hashing::Rnd,
        processes: Hashing::Det,
    };
    let mut rnd_worst = f64::INFINITY;
    for n in [12usize, 50, 200] {
        let weights: Vec<f64> = (0..n).map(|i| SHARE_WEIGHTS[i % 12]).collect();
        let total: f64 = weights.iter().sum();
        let m = 1_000 * n as u32;
        let ratios = |v| {
            counts(v, &weights, 0, 1, m)
                .iter()
                .zip(&weights)
                .map(|(&c, &w)| c as f64 / m as f64 / (w / total))
                .collect::<Vec<f64>>()
        };
        for (i, r) in ratios(dd).into_iter().enumerate() {
            assert!(
                (low..=high).contains(&r),
                "n = {n}, peer {i}: share {r:.3} of w/W"
            );
        }
        rnd_worst = ratios(rd).into_iter().fold(rnd_worst, f64::min);
    }
    assert!(
        rnd_worst < low,
        "random peers' smallest share {rnd_worst:.4}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// §4.2.2/§4.2.3: a process's value for peer `j` depends only on `j`
    /// and the process, so a change of peer `i`'s power moves only
    /// processes to `i` (increase) or away from `i` (decrease), checked on
    /// the full recomputed assignment of 2 000 processes.
    #[test]
    fn s4_2_weight_change_moves_only_processes_to_or_from_the_changed_peer(
        powers in prop::collection::vec(1.0f64..8.0, 2..30),
        pick in any::<prop::sample::Index>(),
        new_power in 1.0f64..8.0,
    ) {
        let i = pick.index(powers.len()) as i64;
        for v in HashVariant::ALL {
            let mut t = HashTable::new(v);
            for (id, &w) in powers.iter().enumerate() {
                t.set_peer(id as i64, w).unwrap();
            }
            for pid in 0..2_000 {
                t.add_process(ProcessKey { job: 3, pid });
            }
            let before = t.naive_assignment();
            t.set_peer(i, new_power).unwrap();
            let after = t.naive_assignment();
            let increase = new_power > powers[i as usize];
            for mv in diff(&before, &after) {
                if increase {
                    prop_assert_eq!(mv.to, Some(i), "{}", v);
                } else {
                    prop_assert_eq!(mv.from, Some(i), "{}", v);
                }
            }
        }
    }
}

// ---------------------------------------------------------- work stealing

#[derive(Debug, Clone)]
enum WsOp {
    AddPeer(PeerId),
    RemovePeer(PeerId),
    Release(u32),
    Finish(usize),
    Steal,
}

fn ws_op() -> impl Strategy<Value = WsOp> {
    prop_oneof![
        2 => (0i64..8).prop_map(WsOp::AddPeer),
        1 => (0i64..8).prop_map(WsOp::RemovePeer),
        2 => (1u32..12).prop_map(WsOp::Release),
        3 => any::<usize>().prop_map(WsOp::Finish),
        3 => Just(WsOp::Steal),
    ]
}

fn ws_queues(ws: &WorkStealing) -> std::collections::BTreeMap<PeerId, Vec<ProcessKey>> {
    ws.peers().map(|p| (p, ws.queue(p).collect())).collect()
}

proptest! {
    /// §4.2.1 invariants over random sequences of joins, leaves, releases,
    /// finishes and steal rounds, for both variants:
    /// every released, unfinished process is in exactly one queue (or
    /// pending while there is no peer); a peer runs the head of its queue;
    /// the moves replayed on the previous queues give the new ones; a
    /// release of k ≤ n processes uses k distinct peers; a thief's queue was
    /// empty, it takes a *waiting* process (never the victim's running one),
    /// from the head of the waiting ones (`Head`) or the tail (`Tail`).
    #[test]
    fn s4_2_1_work_stealing_invariants(
        ops in prop::collection::vec(ws_op(), 1..120),
        seed in any::<u64>(),
    ) {
        for steal in [StealFrom::Head, StealFrom::Tail] {
            let mut ws = WorkStealing::new(steal, seed);
            let mut live: Vec<ProcessKey> = Vec::new();
            let mut job = 0;
            for op in &ops {
                let before = ws_queues(&ws);
                let mut pending: Vec<ProcessKey> = ws.pending().collect();
                let moves = match *op {
                    WsOp::AddPeer(p) => {
                        ws.add_peer(p);
                        vec![]
                    }
                    WsOp::RemovePeer(p) => {
                        let moves = ws.remove_peer(p);
                        let gone = before.get(&p).cloned().unwrap_or_default();
                        prop_assert_eq!(moves.iter().map(|m| m.process).collect::<Vec<_>>(), gone);
                        prop_assert!(moves.iter().all(|m| m.from == Some(p)));
                        moves
                    }
                    WsOp::Release(k) => {
                        job += 1;
                        let keys: Vec<ProcessKey> = (0..k).map(|pid| ProcessKey { job, pid }).collect();
                        live.extend(&keys);
                        let moves = ws.release(&keys);
                        prop_assert_eq!(moves.iter().map(|m| m.process).collect::<Vec<_>>(), keys);
                        prop_assert!(moves.iter().all(|m| m.from.is_none()));
                        let targets: BTreeSet<Option<PeerId>> = moves.iter().map(|m| m.to).collect();
                        if !before.is_empty() {
                            prop_assert_eq!(targets.len(), moves.len().min(before.len()), "distinct peers");
                        }
                        moves
                    }
                    WsOp::Finish(i) => {
                        if !live.is_empty() {
                            let p = live.swap_remove(i % live.len());
                            let was = before.iter().find(|(_, q)| q.contains(&p)).map(|(&id, _)| id);
                            prop_assert_eq!(ws.finish(p), was);
                            prop_assert_eq!(ws.finish(p), None, "finished twice");
                            pending.retain(|&q| q != p);
                            let mut want = before.clone();
                            if let Some(id) = was {
                                want.get_mut(&id).unwrap().retain(|&x| x != p);
                            }
                            prop_assert_eq!(ws_queues(&ws), want, "only the finished one leaves");
                        }
                        vec![]
                    }
                    WsOp::Steal => ws.steal_for_idle(),
                };
                // Replay the moves on the previous queues.
                let mut model = before.clone();
                if let WsOp::AddPeer(p) = *op {
                    model.entry(p).or_default();
                }
                if let WsOp::RemovePeer(p) = *op {
                    model.remove(&p);
                }
                if let WsOp::Finish(_) = *op {
                    model = ws_queues(&ws); // checked above
                }
                let mut stealing = false;
                for m in &moves {
                    match (m.from, matches!(op, WsOp::Steal)) {
                        (Some(victim), true) => {
                            stealing = true;
                            let thief = m.to.unwrap();
                            prop_assert!(model[&thief].is_empty(), "thief {} was busy", thief);
                            let q = model.get_mut(&victim).unwrap();
                            prop_assert!(q.len() >= 2, "stole a running process");
                            let at = match steal {
                                StealFrom::Head => 1,
                                StealFrom::Tail => q.len() - 1,
                            };
                            prop_assert_eq!(q.remove(at), m.process);
                            model.get_mut(&thief).unwrap().push(m.process);
                        }
                        (None, true) => {
                            prop_assert!(!stealing, "pending placed before steals");
                            prop_assert!(pending.contains(&m.process));
                            pending.retain(|&q| q != m.process);
                            model.get_mut(&m.to.unwrap()).unwrap().push(m.process);
                        }
                        _ => match m.to {
                            Some(to) => model.get_mut(&to).unwrap().push(m.process),
                            None => pending.push(m.process),
                        },
                    }
                }
                prop_assert_eq!(&ws_queues(&ws), &model, "{:?}", op);
                prop_assert_eq!(ws.pending().collect::<Vec<_>>(), pending.clone());
                // Exactly one place for every live process.
                for &p in &live {
                    let places = model.values().filter(|q| q.contains(&p)).count()
                        + pending.iter().filter(|&&q| q == p).count();
                    prop_assert_eq!(places, 1, "process {:?}", p);
                    let peer = model.iter().find(|(_, q)| q.contains(&p)).map(|(&id, _)| id);
                    prop_assert_eq!(ws.peer_of(p), peer);
                }
                let queued: usize = model.values().map(Vec::len).sum();
                prop_assert_eq!(queued + pending.len(), live.len());
                prop_assert_eq!(ws.process_count(), live.len());
                prop_assert!(pending.is_empty() || model.is_empty() || !matches!(op, WsOp::Steal));
                for (&id, q) in &model {
                    prop_assert_eq!(ws.running_on(id), q.first().copied());
                }
                // After a steal round no peer is idle while another has a
                // waiting process.
                if matches!(op, WsOp::Steal) {
                    let idle = model.values().any(Vec::is_empty);
                    let waiting = model.values().any(|q| q.len() >= 2);
                    prop_assert!(!(idle && waiting), "idle peer left next to waiting work");
                }
            }
        }
    }

    /// §4.2.1 with a seed: two instances with the same seed fed the same
    /// calls make the same choices.
    #[test]
    fn s4_2_1_work_stealing_is_deterministic_for_a_seed(
        ops in prop::collection::vec(ws_op(), 1..60),
        seed in any::<u64>(),
    ) {
        let mut a = WorkStealing::new(StealFrom::Tail, seed);
        let mut b = WorkStealing::new(StealFrom::Tail, seed);
        let mut job = 0;
        for op in &ops {
            match *op {
                WsOp::AddPeer(p) => {
                    a.add_peer(p);
                    b.add_peer(p);
                }
                WsOp::RemovePeer(p) => prop_assert_eq!(a.remove_peer(p), b.remove_peer(p)),
                WsOp::Release(k) => {
                    job += 1;
                    let keys: Vec<ProcessKey> = (0..k).map(|pid| ProcessKey { job, pid }).collect();
                    prop_assert_eq!(a.release(&keys), b.release(&keys));
                }
                WsOp::Finish(i) => {
                    let p = ProcessKey { job: (i % 4) as i64, pid: (i / 4 % 12) as u32 };
                    prop_assert_eq!(a.finish(p), b.finish(p));
                }
                WsOp::Steal => prop_assert_eq!(a.steal_for_idle(), b.steal_for_idle()),
            }
        }
        prop_assert_eq!(ws_queues(&a), ws_queues(&b));
    }
}

/// §4.2.1: a released process goes to a peer with probability
/// inverse-proportional to (queue length + 1). Peer 1 holds two processes,
/// peer 2 none: peer 2 must get the next one with probability
/// 1/(1/3 + 1) = 3/4. Over 4 000 seeds the frequency lies within 5 standard
/// deviations (5 × 0.0068).
#[test]
fn s4_2_1_release_prefers_short_queues_inverse_proportionally() {
    let seeds = 4_000;
    let mut to_empty = 0;
    for seed in 0..seeds {
        let mut ws = WorkStealing::new(StealFrom::Head, seed);
        ws.add_peer(1);
        ws.add_peer(2);
        let first: Vec<ProcessKey> = (0..4).map(|pid| ProcessKey { job: 1, pid }).collect();
        ws.release(&first);
        for &p in &first {
            if ws.peer_of(p) == Some(2) {
                ws.finish(p);
            }
        }
        assert_eq!(ws.queue(1).count(), 2, "two rounds of distinct peers");
        let moves = ws.release(&[ProcessKey { job: 2, pid: 0 }]);
        if moves[0].to == Some(2) {
            to_empty += 1;
        }
    }
    let freq = to_empty as f64 / seeds as f64;
    assert!((freq - 0.75).abs() <= 5.0 * 0.0069, "frequency {freq}");
}

#[test]
fn s4_2_1_labels_and_empty_balancer() {
    let mut ws = WorkStealing::new(StealFrom::Head, 1);
    assert_eq!(ws.label(), "WS (Head)");
    assert_eq!(WorkStealing::new(StealFrom::Tail, 1).label(), "WS (Tail)");
    let k = ProcessKey { job: 1, pid: 0 };
    let moves = ws.release(&[k]);
    assert_eq!(
        moves,
        [Move {
            process: k,
            from: None,
            to: None
        }]
    );
    assert_eq!(ws.pending().collect::<Vec<_>>(), [k]);
    ws.add_peer(5);
    assert_eq!(
        ws.steal_for_idle(),
        [Move {
            process: k,
            from: None,
            to: Some(5)
        }]
    );
    assert_eq!(ws.running_on(5), Some(k));
    assert_eq!(ws.finish(k), Some(5));
    assert_eq!(ws.running_on(5), None);
    assert_eq!(ws.remove_peer(5), []);
    assert_eq!(ws.remove_peer(5), [], "unknown peer");
}

/// §4.2.4, D/D: peers and processes share the sequence `{kΦ}`, so process
/// index k lies exactly on peer index k (envelope value 0) and stays there
/// whatever the powers — the first n processes are pinned one per peer.
#[test]
fn s4_2_4_dd_process_k_sits_on_peer_k() {
    let dd = HashVariant::Dhht {
        peers: Hashing::Det,
        processes: Hashing::Det,
    };
    let mut t = HashTable::new(dd);
    for (id, w) in [(10, 1.0), (11, 8.0), (12, 0.5), (13, 100.0)] {
        t.set_peer(id, w).unwrap();
    }
    let k = |pid| ProcessKey { job: 1, pid };
    let owners: Vec<Option<PeerId>> = (0..4).map(|pid| t.add_process(k(pid))).collect();
    assert_eq!(owners, [Some(10), Some(11), Some(12), Some(13)]);
    assert_eq!(
        t.set_peer(13, 1e6).unwrap(),
        vec![],
        "pinned: nothing moves"
    );
    // Without the coincidence (R/D), the strong peer takes most of them.
    let mut rd = HashTable::new(HashVariant::Dhht {
        peers: Hashing::Rnd,
        processes: Hashing::Det,
    });
    for (id, w) in [(10, 1.0), (11, 8.0), (12, 0.5), (13, 1e6)] {
        rd.set_peer(id, w).unwrap();
    }
    let strong = (0..4)
        .filter(|&pid| rd.add_process(k(pid)) == Some(13))
        .count();
    assert!(strong >= 3, "the strong peer got {strong} of 4");
}

/// The median of the others leaves out one copy of the peer's own weight,
/// however many peers share it.
#[test]
fn median_weight_of_others_leaves_out_the_peer() {
    let mut d = Dhht::new();
    assert_eq!(d.median_weight_of_others(1), None);
    for (id, w) in [(1, 1.0), (2, 2.0), (3, 2.0), (4, 2.0), (5, 9.0)] {
        d.insert(peer(id, id as u64, w)).unwrap();
    }
    // Others of 5: [1, 2, 2, 2] → index 2.
    assert_eq!(d.median_weight_of_others(5), Some(2.0));
    // Others of 1: [2, 2, 2, 9] → index 2.
    assert_eq!(d.median_weight_of_others(1), Some(2.0));
    // Others of 2: [1, 2, 2, 9] → index 2.
    assert_eq!(d.median_weight_of_others(2), Some(2.0));
    // Not in the table: all five, index 2.
    assert_eq!(d.median_weight_of_others(99), Some(2.0));
    d.remove(2);
    d.remove(3);
    // Others of 4: [1, 9] → index 1.
    assert_eq!(d.median_weight_of_others(4), Some(9.0));
    d.remove(1);
    d.remove(5);
    assert_eq!(d.median_weight_of_others(4), None);
}

/// A table built at once rejects what one-by-one inserts would.
#[test]
fn from_peers_rejects_what_insert_rejects() {
    let (d, rejected) = Dhht::from_peers([
        peer(1, 10, 1.0),
        peer(2, 20, f64::NAN),
        peer(1, 30, 2.0),
        peer(3, 5, 0.0),
    ]);
    assert_eq!(d.len(), 1);
    assert_eq!(d.get(1), Some(peer(1, 10, 1.0)));
    let ids: Vec<i64> = rejected.iter().map(|(p, _)| p.id).collect();
    assert_eq!(ids, [2, 1, 3]);
    assert!(matches!(
        rejected[1].1,
        PlacementError::DuplicatePeer { peer: 1 }
    ));
}
