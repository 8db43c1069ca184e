//! Tests named after the claims of den Burger and Kielmann, "Collective
//! receiver-initiated multicast for grid applications" (`robber_…`,
//! `mob_…`), checked by running every algorithm on real bytes in random
//! delivery orders.

use std::collections::{BTreeMap, VecDeque};

use proptest::prelude::*;
use proptest::sample::Index;

use super::PeerNode as Node;
use crate::rng::SplitMix64;
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

/// Starts every node and delivers up to `steps` messages in a seeded random
/// order (FIFO per connection), for a node state in the middle of a run.
/// Every message of a correct node must be accepted.
fn advance(m: &mut Multicast, seed: u64, steps: usize) {
    let mut rng = SplitMix64::new(seed);
    let mut queues: BTreeMap<(usize, usize), VecDeque<MulticastMsg>> = BTreeMap::new();
    let ids: Vec<usize> = m.nodes.keys().copied().collect();
    for id in ids {
        for (to, msg) in m.nodes.get_mut(&id).expect("node").start() {
            queues.entry((id, to)).or_default().push_back(msg);
        }
    }
    for _ in 0..steps {
        let ready: Vec<(usize, usize)> = queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(&k, _)| k)
            .collect();
        if ready.is_empty() {
            return;
        }
        let (from, to) = ready[rng.below(ready.len())];
        let msg = queues
            .get_mut(&(from, to))
            .and_then(VecDeque::pop_front)
            .expect("ready");
        let out = m
            .nodes
            .get_mut(&to)
            .expect("node")
            .handle(from, msg)
            .expect("a correct peer's message is accepted");
        for (next, msg) in out {
            queues.entry((to, next)).or_default().push_back(msg);
        }
    }
}

/// Raw material for an arbitrary message, shaped once `P` is known: most
/// are near-valid (indices around `P`, lists of `P ± 1`, pieces of about
/// the right length), some wildly out of range.
#[derive(Debug, Clone)]
struct RawMsg {
    kind: u8,
    index: usize,
    wild: bool,
    len_delta: i8,
    bits: Vec<bool>,
}

fn arb_raw() -> impl Strategy<Value = RawMsg> {
    (
        0u8..10,
        any::<usize>(),
        prop::bool::weighted(0.1),
        -1i8..=1,
        prop::collection::vec(any::<bool>(), 40),
    )
        .prop_map(|(kind, index, wild, len_delta, bits)| RawMsg {
            kind,
            index,
            wild,
            len_delta,
            bits,
        })
}

impl RawMsg {
    fn shape(&self, pieces: usize, len: usize, piece_size: usize) -> MulticastMsg {
        let index = if self.wild {
            self.index
        } else {
            self.index % (pieces + 2)
        };
        let n = (pieces as isize + self.len_delta as isize).max(0) as usize;
        let bits: Vec<bool> = (0..n).map(|i| self.bits[i % self.bits.len()]).collect();
        let piece_len = if index < pieces {
            piece_size.min(len - index * piece_size)
        } else {
            piece_size
        };
        let data_len = (piece_len as isize + self.len_delta as isize).max(0) as usize;
        match self.kind {
            0 => MulticastMsg::Desire(bits),
            1 => MulticastMsg::Bitfield(bits),
            2 => MulticastMsg::Work(bits),
            3 => MulticastMsg::Have(index),
            4 => MulticastMsg::Request(index),
            5 => MulticastMsg::Piece {
                index,
                data: vec![0xab; data_len],
            },
            6 => MulticastMsg::Steal,
            7 => MulticastMsg::FoundWork,
            8 => MulticastMsg::Done,
            _ => MulticastMsg::Stop,
        }
    }
}

/// The rejection rule of [`PeerNode::handle`], stated independently.
fn violates_protocol(node: &Node, from: usize, msg: &MulticastMsg, piece_len: usize) -> bool {
    let (local, global) = node.peers();
    if !local.contains(&from) && !global.contains(&from) {
        return true;
    }
    let pieces = node.piece_count();
    match msg {
        MulticastMsg::Desire(b) | MulticastMsg::Bitfield(b) | MulticastMsg::Work(b) => {
            b.len() != pieces
        }
        MulticastMsg::Have(i) => *i >= pieces,
        MulticastMsg::Request(i) => *i >= pieces || node.pieces[*i].is_none(),
        MulticastMsg::Piece { index, data } => *index >= pieces || data.len() != piece_len,
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A distributed run: each node computes the plan on its own from the
    /// data's length, keeps its part, and the root alone seeds the data.
    /// The nodes are exactly those of `Multicast::new`, and they run the
    /// same multicast (same messages, same wide-area traffic, same bytes).
    #[test]
    fn robber_nodes_planned_one_by_one_equal_the_central_multicast(
        sizes in prop::collection::vec(1usize..=6, 1..=4),
        root in any::<Index>(),
        len in 0usize..1500,
        piece_size in 1usize..300,
        seed in any::<u64>(),
    ) {
        let clusters = layout(&sizes);
        let total: usize = sizes.iter().sum();
        let root = root.index(total);
        let data = bytes(len, seed);
        let config = MulticastConfig { clusters, root, piece_size };
        for algorithm in ALL {
            let central = Multicast::new(algorithm, config.clone(), &data, seed).unwrap();
            let mut distributed = Multicast::plan(algorithm, config.clone(), len, seed).unwrap();
            prop_assert!(distributed.nodes.values().all(|n| n.piece_count() == central.piece_count));
            prop_assert!(distributed.nodes.values().all(|n| n.has_all() == (len == 0)));
            for id in 0..total {
                let plan = Multicast::plan(algorithm, config.clone(), len, seed).unwrap();
                let mut node = plan.into_node(id).expect("every member has a node");
                if id == root {
                    let before = node.clone();
                    let wrong = bytes(len + 1, seed);
                    prop_assert!(node.seed_data(&wrong).is_err());
                    prop_assert_eq!(&node, &before);
                    node.seed_data(&data).unwrap();
                }
                distributed.nodes.insert(id, node);
            }
            prop_assert!(distributed == central, "{:?}: nodes differ", algorithm);
            let a = simulate(distributed, seed ^ 1, None).unwrap();
            let b = simulate(central, seed ^ 1, None).unwrap();
            prop_assert_eq!((a.messages, a.wide_bytes, a.stops), (b.messages, b.wide_bytes, b.stops));
            for (id, node) in a.multicast.nodes {
                let got = node.into_data();
                prop_assert_eq!(got.as_deref(), Some(&data[..]), "node {}", id);
            }
        }
    }

    /// Messages from untrusted peers: in the middle of a run, a node fed
    /// arbitrary messages from arbitrary ids never panics, rejects exactly
    /// the protocol violations (unknown sender, piece index ≥ P, bit list
    /// of another length than P, request of a piece it lacks, piece of the
    /// wrong length), and a rejected message leaves it unchanged.
    #[test]
    fn robber_handle_rejects_violations_without_changing_state(
        sizes in prop::collection::vec(1usize..=5, 1..=3),
        root in any::<Index>(),
        len in 0usize..600,
        piece_size in 1usize..100,
        seed in any::<u64>(),
        steps in 0usize..400,
        target in any::<Index>(),
        msgs in prop::collection::vec((any::<Index>(), arb_raw()), 1..40),
    ) {
        let clusters = layout(&sizes);
        let total: usize = sizes.iter().sum();
        let config = MulticastConfig { clusters, root: root.index(total), piece_size };
        for algorithm in ALL {
            let mut m = Multicast::new(algorithm, config.clone(), &bytes(len, seed), seed).unwrap();
            advance(&mut m, seed, steps);
            let pieces = m.piece_count;
            let mut node = m.into_node(target.index(total)).expect("node");
            for (from, raw) in &msgs {
                // Ids of peers, non-peers and non-nodes alike.
                let from = from.index(total + 2);
                let msg = raw.shape(pieces, len, piece_size);
                let piece_len = match &msg {
                    MulticastMsg::Piece { index, .. } if *index < pieces => {
                        piece_size.min(len - index * piece_size)
                    }
                    _ => 0,
                };
                let bad = violates_protocol(&node, from, &msg, piece_len);
                let before = node.clone();
                match node.handle(from, msg.clone()) {
                    Ok(_) => prop_assert!(!bad, "{:?} from {} accepted", msg, from),
                    Err(e) => {
                        prop_assert!(bad, "{:?} from {} rejected: {}", msg, from, e);
                        prop_assert_eq!(&node, &before);
                    }
                }
            }
        }
    }
}

/// Each protocol violation has its own error, naming the offending value.
#[test]
fn robber_handle_names_each_protocol_violation() {
    // 10 bytes in pieces of 4: P = 3, the last piece 2 bytes.
    let config = MulticastConfig {
        clusters: layout(&[2, 2]),
        root: 0,
        piece_size: 4,
    };
    let m = Multicast::new(Algorithm::Robber, config, &bytes(10, 1), 3).unwrap();
    let mut node = m.into_node(2).expect("node 2");
    let peer = node.peers().0[0];
    let before = node.clone();
    let cases = [
        (
            9,
            MulticastMsg::Steal,
            CollectiveError::UnknownPeer { node: 2, from: 9 },
        ),
        (
            peer,
            MulticastMsg::Have(3),
            CollectiveError::PieceOutOfRange {
                index: 3,
                pieces: 3,
            },
        ),
        (
            peer,
            MulticastMsg::Desire(vec![true; 2]),
            CollectiveError::BitListLength {
                kind: "desire",
                got: 2,
                pieces: 3,
            },
        ),
        (
            peer,
            MulticastMsg::Work(vec![true; 4]),
            CollectiveError::BitListLength {
                kind: "work",
                got: 4,
                pieces: 3,
            },
        ),
        (
            peer,
            MulticastMsg::Request(0),
            CollectiveError::PieceNotHeld { node: 2, index: 0 },
        ),
        (
            peer,
            MulticastMsg::Piece {
                index: 2,
                data: vec![0; 4],
            },
            CollectiveError::PieceLength {
                index: 2,
                expected: 2,
                got: 4,
            },
        ),
    ];
    for (from, msg, want) in cases {
        assert_eq!(node.handle(from, msg), Err(want));
        assert_eq!(node, before);
    }
    assert!(
        node.handle(
            peer,
            MulticastMsg::Piece {
                index: 2,
                data: vec![0; 2]
            }
        )
        .is_ok()
    );
}

#[test]
fn multicast_plan_holds_no_data_and_seeds_only_the_planned_length() {
    let config = MulticastConfig {
        clusters: layout(&[2, 3]),
        root: 1,
        piece_size: 7,
    };
    let m = Multicast::plan(Algorithm::Mob, config, 50, 4).unwrap();
    assert_eq!(m.piece_count, 8);
    assert!(m.nodes.values().all(|n| !n.has_all() && n.data().is_none()));
    assert!(m.clone().into_node(5).is_none());
    let mut root = m.into_node(1).expect("root");
    assert_eq!(
        root.seed_data(&[0; 49]),
        Err(CollectiveError::DataLength {
            expected: 50,
            got: 49
        })
    );
    let data = bytes(50, 8);
    root.seed_data(&data).unwrap();
    assert!(root.has_all() && root.is_retired());
    assert_eq!(root.into_data(), Some(data));
}
