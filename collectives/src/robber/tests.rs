//! Tests named after the claims of den Burger and Kielmann, "Collective
//! receiver-initiated multicast for grid applications" (`robber_…`,
//! `mob_…`), checked by running every algorithm on real bytes in random
//! delivery orders.

use proptest::prelude::*;
use proptest::sample::Index;

use crate::tests::bytes;
use crate::*;

/// Clusters of the given sizes with ids 0.. in order.
fn layout(sizes: &[usize]) -> Vec<Vec<usize>> {
    let mut next = 0;
    sizes
        .iter()
        .map(|&s| {
            let c: Vec<usize> = (next..next + s).collect();
            next += s;
            c
        })
        .collect()
}

fn run(
    algorithm: Algorithm,
    clusters: &[Vec<usize>],
    root: usize,
    data: &[u8],
    piece_size: usize,
    seed: u64,
    network: Option<LinkModel>,
) -> Outcome {
    let config = MulticastConfig {
        clusters: clusters.to_vec(),
        root,
        piece_size,
    };
    let m = Multicast::new(algorithm, config, data, seed).expect("valid config");
    simulate(m, seed ^ 0x5eed, network).expect("multicast finishes")
}

const ALL: [Algorithm; 3] = [Algorithm::Robber, Algorithm::Mob, Algorithm::BitTorrent];

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// §3.3 Theorem 2 (and its MOB/BitTorrent counterparts): with a root
    /// collective, every node ends with every byte, whatever the delivery
    /// order; `simulate` also checks every node finished phase 4 with no
    /// message left and none sent after 'stop'.
    #[test]
    fn robber_mob_bittorrent_deliver_every_byte_in_any_order(
        sizes in prop::collection::vec(1usize..=8, 2..=4),
        root in any::<Index>(),
        len in 0usize..2000,
        piece_size in 1usize..300,
        data_seed in any::<u64>(),
        seed in any::<u64>(),
        timed in any::<bool>(),
    ) {
        let clusters = layout(&sizes);
        let total: usize = sizes.iter().sum();
        let root = root.index(total);
        let data = bytes(len, data_seed);
        let network = timed.then_some(LinkModel { local_rate: 100, wide_rate: 10, wide_latency: 5 });
        for algorithm in ALL {
            let out = run(algorithm, &clusters, root, &data, piece_size, seed, network);
            for (id, node) in &out.multicast.nodes {
                let got = node.data();
                prop_assert_eq!(got.as_deref(), Some(&data[..]), "{:?} node {}", algorithm, id);
            }
        }
    }

    /// §3.1 phase 4: Robber terminates — every node is retired, done and
    /// has exchanged 'stop' with every peer ('stop' is the last message on
    /// each connection direction: `simulate` rejects anything after it),
    /// and exactly one 'stop' crosses each connection each way.
    #[test]
    fn robber_terminates_with_stop_last_on_every_connection(
        sizes in prop::collection::vec(1usize..=8, 2..=4),
        root in any::<Index>(),
        len in 0usize..2000,
        piece_size in 1usize..300,
        seed in any::<u64>(),
    ) {
        let clusters = layout(&sizes);
        let root = root.index(sizes.iter().sum());
        let data = bytes(len, seed);
        let out = run(Algorithm::Robber, &clusters, root, &data, piece_size, seed, None);
        prop_assert_eq!(out.stops, 2 * out.multicast.connection_count());
        for node in out.multicast.nodes.values() {
            prop_assert!(node.is_finished() && node.has_all() && node.is_retired());
            prop_assert!(node.work().is_empty());
        }
    }

    /// §3.1 phase 3 / §3.2: "Robber transfers each piece to each cluster
    /// exactly once" — every piece enters every non-root cluster over the
    /// wide area exactly once, and the root's cluster never. The same holds
    /// for MOB (§2.6), by the same one-responsible-node argument.
    #[test]
    fn robber_and_mob_move_each_piece_into_each_remote_cluster_exactly_once(
        sizes in prop::collection::vec(1usize..=8, 2..=4),
        root in any::<Index>(),
        len in 1usize..2000,
        piece_size in 1usize..300,
        seed in any::<u64>(),
        timed in any::<bool>(),
    ) {
        let clusters = layout(&sizes);
        let root = root.index(sizes.iter().sum());
        let root_cluster = clusters.iter().position(|c| c.contains(&root)).unwrap();
        let data = bytes(len, seed);
        let network = timed.then_some(LinkModel { local_rate: 50, wide_rate: 3, wide_latency: 20 });
        for algorithm in [Algorithm::Robber, Algorithm::Mob] {
            let out = run(algorithm, &clusters, root, &data, piece_size, seed, network);
            for (c, arrivals) in out.wide_pieces.iter().enumerate() {
                let want = u32::from(c != root_cluster);
                prop_assert!(arrivals.iter().all(|&a| a == want), "{:?} cluster {}: {:?}", algorithm, c, arrivals);
            }
        }
    }

    /// §3.1 phases 1 and 2: every node has up to `N` chosen local peers (so
    /// at least `min(|C| − 1, N)`), the local graph of each collective is
    /// connected (Lemma 1), and with at most `N + 1` clusters every node
    /// has a global peer in every other cluster.
    #[test]
    fn robber_peer_selection_follows_phases_1_and_2(
        sizes in prop::collection::vec(1usize..=8, 2..=4),
        seed in any::<u64>(),
    ) {
        let clusters = layout(&sizes);
        let config = MulticastConfig { clusters: clusters.clone(), root: 0, piece_size: 1 };
        let m = Multicast::new(Algorithm::Robber, config, &[1, 2, 3], seed).unwrap();
        for (c, members) in clusters.iter().enumerate() {
            for &id in members {
                let (local, global) = m.nodes[&id].peers();
                prop_assert!(local.len() >= (members.len() - 1).min(PEERS));
                prop_assert!(local.iter().all(|p| m.cluster_of[p] == c));
                for other in (0..clusters.len()).filter(|&o| o != c) {
                    prop_assert!(global.iter().any(|p| m.cluster_of[p] == other));
                }
            }
        }
    }
}

/// §3.1 phase 3's example: `P = 6`, three nodes → {0,1}, {2,3}, {4,5}.
#[test]
fn robber_initial_work_matches_the_papers_example() {
    assert_eq!(initial_work(0, 3, 6), 0..2);
    assert_eq!(initial_work(1, 3, 6), 2..4);
    assert_eq!(initial_work(2, 3, 6), 4..6);
    // Shares partition 0..P for any sizes.
    for size in 1..10 {
        for p in 0..40 {
            let all: Vec<usize> = (0..size).flat_map(|r| initial_work(r, size, p)).collect();
            assert_eq!(all, (0..p).collect::<Vec<_>>());
        }
    }
}

/// §3.1 phase 2 / Fig. 3: equal sizes pair equal ranks; a node always has a
/// non-empty, in-range set of candidate ranks.
#[test]
fn robber_global_peer_ranks_follow_fig_3() {
    assert_eq!(global_peer_ranks(2, 4, 4), 2..3);
    assert_eq!(global_peer_ranks(1, 2, 4), 2..4);
    for x in 1..10 {
        for y in 1..10 {
            for r in 0..x {
                let ranks = global_peer_ranks(r, x, y);
                assert!(!ranks.is_empty() && ranks.end <= y, "{r} {x} {y}");
            }
        }
    }
}

/// Same seeds, same run: nothing depends on a clock or a global generator.
#[test]
fn robber_simulation_is_deterministic() {
    let clusters = layout(&[3, 5, 2]);
    let data = bytes(1500, 9);
    let a = run(Algorithm::Robber, &clusters, 4, &data, 50, 7, None);
    let b = run(Algorithm::Robber, &clusters, 4, &data, 50, 7, None);
    assert_eq!(a.messages, b.messages);
    assert_eq!(a.wide_bytes, b.wide_bytes);
}

/// §3.2 and §4: BitTorrent ignores clusters, so pieces may cross the wide
/// area many times; Robber's wide-area piece count is the minimum, one per
/// piece per remote cluster.
#[test]
fn bittorrent_moves_at_least_as_many_pieces_over_the_wide_area_as_robber() {
    let clusters = layout(&[8, 8, 8]);
    let data = bytes(4000, 3);
    let count = |o: &Outcome| -> u32 { o.wide_pieces.iter().flatten().sum() };
    let robber = run(Algorithm::Robber, &clusters, 0, &data, 100, 1, None);
    let bt = run(Algorithm::BitTorrent, &clusters, 0, &data, 100, 1, None);
    assert_eq!(count(&robber), 2 * 40);
    assert!(count(&bt) >= count(&robber));
}

#[test]
fn multicast_rejects_bad_configs() {
    let cfg = |clusters: Vec<Vec<usize>>, root, piece_size| MulticastConfig {
        clusters,
        root,
        piece_size,
    };
    let new = |c| Multicast::new(Algorithm::Robber, c, &[1], 0).map(|_| ());
    assert_eq!(
        new(cfg(vec![vec![0]], 0, 0)),
        Err(CollectiveError::ZeroChunk)
    );
    assert_eq!(
        new(cfg(vec![vec![0], vec![]], 0, 1)),
        Err(CollectiveError::EmptyCluster(1))
    );
    assert_eq!(
        new(cfg(vec![vec![0, 1], vec![1]], 0, 1)),
        Err(CollectiveError::DuplicateMember(1))
    );
    assert_eq!(
        new(cfg(vec![vec![0]], 5, 1)),
        Err(CollectiveError::RootNotMember(5))
    );
}
