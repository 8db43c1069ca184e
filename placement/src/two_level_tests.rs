//! Tests of the two-level balancer (dissertation ch. 6, Fig. 6.1) against a
//! reference model that recomputes everything by brute force: clusters from
//! the peer list, the top-level argmin by a linear scan, the spanning set by
//! enumerating every subset of clusters, each process by `lookup_naive` of a
//! fresh flat `Dhht` over its cluster's peers.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use crate::*;

// ------------------------------------------------------------ the model

/// A cluster as the model sees it: rebuilt from the peers every time.
struct MCluster {
    key: Option<String>,
    index: u64,
    power: f64,
    slots: u64,
    flat: Dhht,
}

impl MCluster {
    fn value(&self, job: Position) -> f64 {
        envelope_value(job, golden_position(self.index), self.power)
    }
}

fn model_clusters(peers: &BTreeMap<i64, ClusterPeer>) -> Vec<MCluster> {
    let mut by_key: BTreeMap<Option<String>, Vec<&ClusterPeer>> = BTreeMap::new();
    for p in peers.values() {
        by_key.entry(p.cluster.clone()).or_default().push(p);
    }
    by_key
        .into_iter()
        .enumerate()
        .map(|(rank, (key, ps))| {
            let mut flat = Dhht::new();
            for p in &ps {
                flat.insert(Peer {
                    id: p.id,
                    position: p.position,
                    weight: p.weight,
                })
                .unwrap();
            }
            MCluster {
                key,
                index: rank as u64 + 1,
                // `ps` is in id order, as the table sums.
                power: ps.iter().map(|p| p.weight).sum(),
                slots: ps.iter().map(|p| u64::from(p.slots)).sum(),
                flat,
            }
        })
        .collect()
}

/// The top-level argmin among `cs` at `job` (ties: smaller index).
fn model_top<'a>(job: Position, cs: impl Iterator<Item = &'a MCluster>) -> Option<&'a MCluster> {
    cs.min_by(|a, b| {
        a.value(job)
            .total_cmp(&b.value(job))
            .then(a.index.cmp(&b.index))
    })
}

/// A placement's blocks as (cluster key, size), in pid order.
type Blocks = Vec<(Option<String>, usize)>;

/// The reference placement: blocks and owners.
fn model_place(
    peers: &BTreeMap<i64, ClusterPeer>,
    job: Position,
    xs: &[Position],
) -> Option<(Blocks, Vec<i64>)> {
    let cs = model_clusters(peers);
    if cs.is_empty() {
        return None;
    }
    let n = xs.len();
    let mut blocks: Vec<(&MCluster, usize)> = Vec::new();
    let total: u64 = cs.iter().map(|c| c.slots).sum();
    if n == 0 {
    } else if let Some(c) = model_top(job, cs.iter().filter(|c| c.slots >= n as u64)) {
        blocks.push((c, n));
    } else if total < n as u64 {
        // Every cluster, proportional to slots, largest remainder.
        let mut order: Vec<&MCluster> = cs.iter().collect();
        order.sort_by(|a, b| b.slots.cmp(&a.slots).then(a.index.cmp(&b.index)));
        let mut parts: Vec<(usize, u128)> = order
            .iter()
            .map(|c| {
                let e = n as u128 * u128::from(c.slots);
                ((e / u128::from(total)) as usize, e % u128::from(total))
            })
            .collect();
        let mut left = n - parts.iter().map(|p| p.0).sum::<usize>();
        let mut rank: Vec<usize> = (0..parts.len()).collect();
        rank.sort_by(|&a, &b| parts[b].1.cmp(&parts[a].1).then(a.cmp(&b)));
        for i in rank.into_iter().take(left) {
            parts[i].0 += 1;
            left -= 1;
        }
        assert_eq!(left, 0);
        blocks = order
            .into_iter()
            .zip(parts)
            .map(|(c, p)| (c, p.0))
            .collect();
    } else {
        // Every subset: the fewest clusters covering n; among those, the
        // lexicographically smallest list of envelope ranks.
        let mut env: Vec<&MCluster> = cs.iter().collect();
        env.sort_by(|a, b| {
            a.value(job)
                .total_cmp(&b.value(job))
                .then(a.index.cmp(&b.index))
        });
        let m = env.len();
        let mut best: Option<Vec<usize>> = None;
        for mask in 1u32..(1 << m) {
            let set: Vec<usize> = (0..m).filter(|i| mask & (1 << i) != 0).collect();
            if set.iter().map(|&i| env[i].slots).sum::<u64>() < n as u64 {
                continue;
            }
            let better = match &best {
                None => true,
                Some(b) => set.len() < b.len() || (set.len() == b.len() && set < *b),
            };
            if better {
                best = Some(set);
            }
        }
        let mut chosen: Vec<&MCluster> = best.unwrap().into_iter().map(|i| env[i]).collect();
        chosen.sort_by(|a, b| b.slots.cmp(&a.slots).then(a.index.cmp(&b.index)));
        let mut left = n;
        for c in chosen {
            let size = (c.slots as usize).min(left);
            left -= size;
            blocks.push((c, size));
        }
    }
    let mut owners = Vec::new();
    for (c, size) in &blocks {
        for _ in 0..*size {
            owners.push(c.flat.lookup_naive(xs[owners.len()]).unwrap());
        }
    }
    let blocks = blocks
        .into_iter()
        .filter(|b| b.1 > 0)
        .map(|(c, size)| (c.key.clone(), size))
        .collect();
    Some((blocks, owners))
}

fn table_of(peers: &BTreeMap<i64, ClusterPeer>) -> TwoLevel {
    let mut t = TwoLevel::new();
    for p in peers.values() {
        t.insert(p.clone()).unwrap();
    }
    t
}

fn sizes(p: &JobPlacement) -> Blocks {
    p.blocks
        .iter()
        .map(|b| (b.cluster.clone(), b.pids.len()))
        .collect()
}

// ------------------------------------------------------------ strategies

fn cluster_name() -> impl Strategy<Value = Option<String>> {
    prop_oneof![Just(None), (0u8..5).prop_map(|c| Some(format!("c{c}"))),]
}

fn weight() -> impl Strategy<Value = f64> {
    prop_oneof![(1u32..=100).prop_map(f64::from), (0.01f64..1.0), Just(1.0),]
}

fn cluster_peer(id: i64) -> impl Strategy<Value = ClusterPeer> {
    (cluster_name(), 1u64..64, weight(), 1u32..=4).prop_map(move |(cluster, k, weight, slots)| {
        ClusterPeer {
            id,
            cluster,
            position: golden_position(k),
            weight,
            slots,
        }
    })
}

fn peers() -> impl Strategy<Value = BTreeMap<i64, ClusterPeer>> {
    prop::collection::btree_set(-20i64..20, 1..24).prop_flat_map(|ids| {
        ids.into_iter()
            .map(cluster_peer)
            .collect::<Vec<_>>()
            .prop_map(|v| v.into_iter().map(|p| (p.id, p)).collect())
    })
}

/// A job: its top-level position and `n` process positions (consecutive
/// golden points from some base, as a process allocator hands them out).
fn job(max_n: usize) -> impl Strategy<Value = (Position, Vec<Position>)> {
    (any::<u64>(), 0u64..1000, 0..=max_n).prop_map(|(y, base, n)| {
        (
            Position(y),
            (0..n as u64)
                .map(|i| golden_position(base + i + 1))
                .collect(),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Fig. 6.1, top level then lower level: every placement equals the
    /// brute-force model — the argmin of the cluster envelope among the
    /// clusters that fit, else the fewest covering clusters (found by
    /// enumerating subsets) in contiguous blocks, and inside each cluster
    /// the flat lower envelope over that cluster's peers.
    #[test]
    fn ch6_placement_equals_the_brute_force_model(peers in peers(), (y, xs) in job(100)) {
        let t = table_of(&peers);
        let got = t.place_job(y, &xs).unwrap();
        let (blocks, owners) = model_place(&peers, y, &xs).unwrap();
        prop_assert_eq!(sizes(&got), blocks);
        prop_assert_eq!(&got.owners, &owners);
        // Built at once (`insert_all`, each cluster's power summed once):
        // the same table, the same placement.
        let mut bulk = TwoLevel::new();
        prop_assert!(bulk.insert_all(peers.values().cloned()).is_empty());
        prop_assert_eq!(bulk.clusters().collect::<Vec<_>>(), t.clusters().collect::<Vec<_>>());
        prop_assert_eq!(bulk.place_job(y, &xs).unwrap().owners, owners);
        // The fitting clusters, best first: the first is where a fitting
        // job goes, each fits, and each fitting cluster is listed once.
        let fit = t.fitting_clusters(y, xs.len());
        prop_assert_eq!(fit.first().copied(), t.fitting_cluster(y, xs.len()));
        let fitting: Vec<Option<&str>> = t
            .clusters()
            .filter(|c| c.slots >= xs.len() as u64)
            .map(|c| c.key)
            .collect();
        let mut sorted = fit.clone();
        sorted.sort();
        let mut want = fitting.clone();
        want.sort();
        prop_assert_eq!(sorted, want);
    }

    /// A job that fits lands in exactly one cluster, which is the argmin of
    /// the top-level envelope among the fitting clusters, and inside it
    /// every process sits where a flat DHHT over that cluster's peers puts
    /// it.
    #[test]
    fn ch6_a_fitting_job_lands_in_one_cluster_the_envelope_argmin(
        peers in peers(), (y, xs) in job(12),
    ) {
        let t = table_of(&peers);
        let cs = model_clusters(&peers);
        let n = xs.len() as u64;
        let Some(want) = model_top(y, cs.iter().filter(|c| c.slots >= n)) else {
            return Ok(());
        };
        let got = t.place_job(y, &xs).unwrap();
        if n == 0 {
            prop_assert!(got.blocks.is_empty() && got.owners.is_empty());
            return Ok(());
        }
        prop_assert_eq!(got.blocks.len(), 1);
        prop_assert_eq!(&got.blocks[0].cluster, &want.key);
        prop_assert_eq!(t.fitting_cluster(y, xs.len()), Some(want.key.as_deref()));
        for (pid, x) in xs.iter().enumerate() {
            let owner = got.owners[pid];
            prop_assert_eq!(Some(owner), want.flat.lookup_naive(*x));
            prop_assert_eq!(&peers[&owner].cluster, &want.key);
        }
    }

    /// With one cluster (here: every peer in the same one, or none naming
    /// one) the two-level placement is exactly the flat DHHT, for every job
    /// size, and so is `lookup_within`.
    #[test]
    fn ch6_one_cluster_is_exactly_the_flat_dhht(
        mut peers in peers(), (y, xs) in job(120), named in any::<bool>(),
    ) {
        let mut flat = Dhht::new();
        for p in peers.values_mut() {
            p.cluster = named.then(|| "only".to_string());
            flat.insert(Peer { id: p.id, position: p.position, weight: p.weight }).unwrap();
        }
        let t = table_of(&peers);
        let got = t.place_job(y, &xs).unwrap();
        let want: Vec<i64> = place(&flat, &xs).into_iter().map(Option::unwrap).collect();
        prop_assert_eq!(&got.owners, &want);
        prop_assert!(got.blocks.len() <= 1);
        let key = named.then_some("only");
        for (x, w) in xs.iter().zip(&want) {
            prop_assert_eq!(t.lookup_within(key, y, *x), Some(*w));
        }
    }

    /// A job larger than every cluster spans the minimum number of clusters
    /// that can hold it (checked by enumeration), in contiguous pid blocks
    /// that cover 0..n in order, none empty, none beyond its cluster's
    /// slots, each process on a peer of its block's cluster.
    #[test]
    fn ch6_a_spanning_job_uses_the_fewest_clusters_in_contiguous_blocks(
        peers in peers(), (y, xs) in job(100),
    ) {
        let cs = model_clusters(&peers);
        let n = xs.len() as u64;
        let total: u64 = cs.iter().map(|c| c.slots).sum();
        if cs.iter().any(|c| c.slots >= n) || n > total {
            return Ok(());
        }
        let t = table_of(&peers);
        let got = t.place_job(y, &xs).unwrap();
        let m = cs.len();
        let fewest = (1u32..(1 << m))
            .filter(|mask| (0..m).filter(|i| mask & (1 << i) != 0).map(|i| cs[i].slots).sum::<u64>() >= n)
            .map(u32::count_ones)
            .min()
            .unwrap();
        prop_assert_eq!(got.blocks.len(), fewest as usize);
        let mut next = 0;
        let mut seen = BTreeSet::new();
        for b in &got.blocks {
            prop_assert_eq!(b.pids.start, next);
            prop_assert!(!b.pids.is_empty());
            next = b.pids.end;
            prop_assert!(seen.insert(b.cluster.clone()), "a cluster twice");
            let c = cs.iter().find(|c| c.key == b.cluster).unwrap();
            prop_assert!(b.pids.len() as u64 <= c.slots);
            for pid in b.pids.clone() {
                prop_assert_eq!(&peers[&got.owners[pid]].cluster, &b.cluster);
            }
        }
        prop_assert_eq!(next, xs.len());
    }

    /// When a peer leaves, `lookup_within` (asked with the cluster each
    /// process was placed in) moves only that peer's processes, and keeps
    /// them inside their cluster while it has peers left; a block whose
    /// cluster emptied moves as a whole to one cluster.
    #[test]
    fn ch6_a_peer_leaving_moves_only_its_own_processes(
        peers in peers(), (y, xs) in job(60), pick in any::<prop::sample::Index>(),
    ) {
        let mut t = table_of(&peers);
        let placed = t.place_job(y, &xs).unwrap();
        let ids: Vec<i64> = peers.keys().copied().collect();
        let gone = ids[pick.index(ids.len())];
        t.remove(gone);
        let mut block_targets: BTreeMap<Option<String>, BTreeSet<Option<String>>> = BTreeMap::new();
        for b in &placed.blocks {
            for pid in b.pids.clone() {
                let before = placed.owners[pid];
                let now = t.lookup_within(b.cluster.as_deref(), y, xs[pid]);
                if t.is_empty() {
                    prop_assert_eq!(now, None);
                    continue;
                }
                let now = now.unwrap();
                if before != gone {
                    prop_assert_eq!(now, before);
                } else if t.cluster_dhht(b.cluster.as_deref()).is_some() {
                    prop_assert_eq!(&t.get(now).unwrap().cluster, &b.cluster);
                }
                block_targets.entry(b.cluster.clone()).or_default().insert(t.get(now).unwrap().cluster);
            }
        }
        for (from, to) in block_targets {
            prop_assert!(to.len() == 1 || t.cluster_dhht(from.as_deref()).is_some());
        }
    }

    /// The table is a function of its set of peers: inserting them in the
    /// opposite order, or through updates from other states, gives the same
    /// clusters and the same placements (so every supernode, and a
    /// restarted one, agrees).
    #[test]
    fn ch6_placement_does_not_depend_on_the_order_of_changes(
        peers in peers(), (y, xs) in job(60), detour in cluster_name(),
    ) {
        let a = table_of(&peers);
        let mut b = TwoLevel::new();
        for p in peers.values().rev() {
            // Arrive elsewhere with other numbers, then move.
            let mut q = p.clone();
            q.cluster = detour.clone();
            q.weight = p.weight * 3.0;
            q.slots = 7;
            b.insert(q).unwrap();
        }
        for p in peers.values() {
            b.update(p.clone()).unwrap();
        }
        let ca: Vec<_> = a.clusters().map(|c| (c.key.map(str::to_owned), c.index, c.power, c.slots, c.peers)).collect();
        let cb: Vec<_> = b.clusters().map(|c| (c.key.map(str::to_owned), c.index, c.power, c.slots, c.peers)).collect();
        prop_assert_eq!(ca, cb);
        prop_assert_eq!(a.place_job(y, &xs), b.place_job(y, &xs));
    }

    /// Inserts, updates (including moves between clusters) and removals,
    /// checked against the model after every step; failed calls change
    /// nothing.
    #[test]
    fn ch6_table_matches_the_model_under_churn(
        ops in prop::collection::vec((-6i64..6, cluster_name(), 1u64..20, prop_oneof![weight(), Just(0.0), Just(f64::NAN)], 0u32..=3, 0u8..3), 1..40),
        (y, xs) in job(24),
    ) {
        let mut t = TwoLevel::new();
        let mut model: BTreeMap<i64, ClusterPeer> = BTreeMap::new();
        for (id, cluster, k, weight, slots, kind) in ops {
            let p = ClusterPeer { id, cluster, position: golden_position(k), weight, slots };
            let valid = is_eligible_weight(weight) && slots > 0;
            match kind {
                0 => {
                    let ok = valid && !model.contains_key(&id);
                    prop_assert_eq!(t.insert(p.clone()).is_ok(), ok);
                    if ok {
                        model.insert(id, p);
                    }
                }
                1 => {
                    let got = t.update(p.clone());
                    if valid && let Some(old) = model.get_mut(&id) {
                        prop_assert_eq!(got.ok(), Some(std::mem::replace(old, p)));
                    } else {
                        prop_assert!(got.is_err());
                    }
                }
                _ => prop_assert_eq!(t.remove(id), model.remove(&id)),
            }
            prop_assert_eq!(t.len(), model.len());
            let cs = model_clusters(&model);
            let info: Vec<_> = t.clusters().map(|c| (c.key.map(str::to_owned), c.power, c.slots)).collect();
            let want: Vec<_> = cs.iter().map(|c| (c.key.clone(), c.power, c.slots)).collect();
            prop_assert_eq!(info, want);
            let got = t.place_job(y, &xs).map(|p| (sizes(&p), p.owners));
            prop_assert_eq!(got, model_place(&model, y, &xs));
        }
    }
}

/// Fig. 6.1's top level is a DHHT over clusters: over many jobs at golden
/// positions, each cluster's share of the jobs follows its power — roughly.
/// For 2 to 10 clusters with powers 1 to 8 (every job fits everywhere),
/// each cluster's job count is asserted within [1/4, 4] × its power share.
/// A single lower envelope over few points is only roughly proportional
/// (§4.2.3 cites multiple hashing as the improvement; see also
/// `s4_2_2_weighted_share_follows_weight`), and with few clusters nothing
/// averages out: observed 0.31–2.45 × the power share here, so the bound
/// is a regression guard, not a fairness promise (docs/simulation.md).
#[test]
fn ch6_job_share_per_cluster_tracks_cluster_power() {
    let (mut lo, mut hi) = (f64::INFINITY, 0f64);
    for m in 2..=10u64 {
        for seed in 0..10u64 {
            let mut t = TwoLevel::new();
            let mut powers = Vec::new();
            for c in 0..m {
                let power = 1.0 + ((seed * 7 + c * 13) % 8) as f64;
                powers.push(power);
                t.insert(ClusterPeer {
                    id: c as i64,
                    cluster: Some(format!("c{c}")),
                    position: golden_position(c + 1),
                    weight: power,
                    slots: 4,
                })
                .unwrap();
            }
            let total: f64 = powers.iter().sum();
            let jobs = 5_000u64;
            let mut count = vec![0u64; m as usize];
            for j in 1..=jobs {
                let p = t.place_job(golden_position(j), &[Position(0)]).unwrap();
                assert_eq!(p.blocks.len(), 1);
                count[p.owners[0] as usize] += 1;
            }
            for (c, (&got, power)) in count.iter().zip(&powers).enumerate() {
                let ratio = got as f64 / (jobs as f64 * power / total);
                assert!(
                    (0.25..=4.0).contains(&ratio),
                    "m = {m}, seed {seed}: cluster {c} of power {power} got {got} jobs, \
                     {ratio:.3} of its power share"
                );
                lo = lo.min(ratio);
                hi = hi.max(ratio);
            }
        }
    }
    // The shares do follow power on the whole: neither bound is slack.
    assert!(lo > 0.25 && hi < 4.0, "{lo} .. {hi}");
}

/// Jobs that fit only some clusters choose among those: a job of 5
/// processes never lands in a cluster of 4 slots, however strong.
#[test]
fn ch6_a_job_goes_only_to_clusters_it_fits() {
    let mut t = TwoLevel::new();
    let peers = [(1, "big", 1.0, 8), (2, "strong", 100.0, 4)];
    for (id, c, weight, slots) in peers {
        t.insert(ClusterPeer {
            id,
            cluster: Some(c.into()),
            position: golden_position(id as u64),
            weight,
            slots,
        })
        .unwrap();
    }
    for j in 1..200 {
        let xs: Vec<_> = (1..=5).map(golden_position).collect();
        let p = t.place_job(golden_position(j), &xs).unwrap();
        assert_eq!(p.blocks[0].cluster.as_deref(), Some("big"));
        assert!(p.owners.iter().all(|&o| o == 1));
    }
    // Four fit both; the strong cluster wins nearly all of the ring.
    let xs: Vec<_> = (1..=4).map(golden_position).collect();
    let strong = (1..200)
        .filter(|&j| t.place_job(golden_position(j), &xs).unwrap().owners[0] == 2)
        .count();
    assert!(strong > 190, "{strong}");
}

/// Spanning: 3 clusters of 8, 6 and 4 slots; a job of 12 needs two (8 + 6
/// or 8 + 4), fills the larger first in contiguous blocks; a job of 20
/// beyond all 18 slots goes everywhere in proportion (9, 7, 4).
#[test]
fn ch6_spanning_and_overflow_blocks_by_hand() {
    let mut t = TwoLevel::new();
    let mut id = 0;
    for (c, n, slots) in [("a", 4, 2), ("b", 3, 2), ("c", 2, 2)] {
        for _ in 0..n {
            id += 1;
            t.insert(ClusterPeer {
                id,
                cluster: Some(c.to_string()),
                position: golden_position(id as u64),
                weight: 1.0,
                slots,
            })
            .unwrap();
        }
    }
    let xs: Vec<_> = (1..=12).map(golden_position).collect();
    for j in 1..50 {
        let p = t.place_job(golden_position(j), &xs).unwrap();
        assert_eq!(p.blocks.len(), 2);
        assert_eq!(p.blocks[0].cluster.as_deref(), Some("a"));
        assert_eq!(p.blocks[0].pids, 0..8);
        assert_eq!(p.blocks[1].pids.start, 8);
    }
    let xs: Vec<_> = (1..=20).map(golden_position).collect();
    let p = t.place_job(golden_position(1), &xs).unwrap();
    assert_eq!(
        sizes(&p),
        vec![
            (Some("a".into()), 9),
            (Some("b".into()), 7),
            (Some("c".into()), 4)
        ]
    );
}

/// Bad input returns typed errors and changes nothing; an empty table
/// places nothing; a job without processes has no blocks.
#[test]
fn ch6_bad_input_is_rejected_and_changes_nothing() {
    let mut t = TwoLevel::new();
    let xs = [golden_position(1)];
    assert_eq!(t.place_job(golden_position(1), &xs), None);
    assert_eq!(t.lookup_within(None, golden_position(1), xs[0]), None);
    let good = ClusterPeer {
        id: 1,
        cluster: Some("a".into()),
        position: golden_position(1),
        weight: 2.0,
        slots: 2,
    };
    for weight in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let bad = ClusterPeer {
            weight,
            ..good.clone()
        };
        assert!(matches!(
            t.insert(bad),
            Err(PlacementError::InvalidWeight { peer: 1, .. })
        ));
    }
    let no_slots = ClusterPeer {
        slots: 0,
        ..good.clone()
    };
    assert_eq!(
        t.insert(no_slots.clone()),
        Err(PlacementError::InvalidSlots { peer: 1 })
    );
    assert!(
        PlacementError::InvalidSlots { peer: 1 }
            .to_string()
            .contains("core")
    );
    assert!(t.is_empty() && t.clusters().len() == 0);
    assert_eq!(
        t.update(good.clone()),
        Err(PlacementError::UnknownPeer { peer: 1 })
    );
    t.insert(good.clone()).unwrap();
    assert_eq!(
        t.insert(good.clone()),
        Err(PlacementError::DuplicatePeer { peer: 1 })
    );
    assert_eq!(
        t.update(no_slots),
        Err(PlacementError::InvalidSlots { peer: 1 })
    );
    assert_eq!(t.get(1), Some(good.clone()));
    let empty = t.place_job(golden_position(3), &[]).unwrap();
    assert!(empty.owners.is_empty() && empty.blocks.is_empty());
    assert_eq!(t.remove(1), Some(good));
    assert_eq!(t.remove(1), None);
    assert!(t.clusters().len() == 0);
}

#[test]
fn ch6_job_key_layout() {
    assert_eq!(&job_key(1), b"job:\0\0\0\0\0\0\0\x01");
    assert_ne!(&job_key(1)[..4], &peer_key(1)[..4]);
}
