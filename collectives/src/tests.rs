//! Tests named after the paper claims they check: Juhász (`juhasz_…`,
//! "Broadcasting Algorithm of Constant Complexity for Fully-Switched
//! Clusters") and Takahashi et al. (`takahashi_…`, "A Stable Broadcast
//! Algorithm"). Delivery is checked by running every schedule on real bytes
//! with shuffled steps; the stable broadcast's bandwidths are checked
//! against an independent max-flow (Edmonds–Karp) on the same links.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use proptest::prelude::*;
use proptest::sample::Index;

use crate::*;

// ------------------------------------------------------------------ helpers

/// `len` pseudo-random bytes from `seed` (xorshift), the test data of
/// every delivery check in this crate.
pub(crate) fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Every destination reassembles `data`, receiving each byte exactly once.
fn assert_delivers_exactly_once(schedule: &Schedule, data: &[u8], order_seed: u64) -> Delivery {
    let delivery = execute(schedule, data, order_seed).expect("schedule runs");
    for d in &schedule.destinations {
        let got = &delivery.nodes[d];
        assert_eq!(got.data().as_deref(), Some(data), "destination {d}");
        assert!(
            got.times.iter().all(|&t| t == 1),
            "destination {d} received a byte twice: {:?}",
            got.times
        );
    }
    delivery
}

fn ceil_log2(p: usize) -> usize {
    (usize::BITS - (p - 1).leading_zeros()) as usize * usize::from(p > 1)
}

/// A random tree topology, with its link list kept apart so the reference
/// max-flow does not use the crate's path code.
#[derive(Debug, Clone)]
struct Net {
    topology: Topology,
    /// (a, b, capacity) of every link.
    links: Vec<(usize, usize, u64)>,
    source: NodeId,
    /// All hosts except the source.
    others: Vec<NodeId>,
    /// A non-empty subset of `others`.
    destinations: Vec<NodeId>,
    switches: Vec<NodeId>,
}

/// Switches form a random tree; hosts hang off random switches (hosts are
/// the leaves, as in the paper's §3.2). Capacities are small integers so
/// that ties between destinations (eq. 6's `A_k` with several members) are
/// common.
fn arb_net() -> impl Strategy<Value = Net> {
    (
        1usize..5,
        2usize..10,
        prop::collection::vec(any::<u32>(), 16),
        prop::collection::vec(1u64..=12, 16),
        prop::collection::vec(any::<bool>(), 10),
        any::<Index>(),
    )
        .prop_map(|(n_switches, n_hosts, picks, caps, mask, src)| {
            let mut topology = Topology::new();
            let mut links = Vec::new();
            let switches: Vec<NodeId> = (0..n_switches).map(|_| topology.add_switch()).collect();
            let mut cap = caps.iter().cycle();
            let mut pick = picks.iter().cycle();
            for i in 1..n_switches {
                let parent = switches[*pick.next().unwrap() as usize % i];
                let c = *cap.next().unwrap();
                topology.connect(parent, switches[i], c).unwrap();
                links.push((parent.0, switches[i].0, c));
            }
            let hosts: Vec<NodeId> = (0..n_hosts).map(|_| topology.add_host()).collect();
            for &h in &hosts {
                let sw = switches[*pick.next().unwrap() as usize % n_switches];
                let c = *cap.next().unwrap();
                topology.connect(sw, h, c).unwrap();
                links.push((sw.0, h.0, c));
            }
            let source = hosts[src.index(n_hosts)];
            let others: Vec<NodeId> = hosts.iter().copied().filter(|&h| h != source).collect();
            let mut destinations: Vec<NodeId> = others
                .iter()
                .zip(&mask)
                .filter(|(_, keep)| **keep)
                .map(|(&h, _)| h)
                .collect();
            if destinations.is_empty() {
                destinations = others.clone();
            }
            Net {
                topology,
                links,
                source,
                others,
                destinations,
                switches,
            }
        })
}

/// Reference model: the maximum flow from `s` to `t` (Edmonds–Karp) on the
/// links as an undirected capacitated graph, each link full duplex. It
/// knows nothing about trees, so it also checks that on a tree the answer
/// is the narrowest link of the path.
fn max_flow(n: usize, links: &[(usize, usize, u64)], s: usize, t: usize) -> u64 {
    let mut residual = vec![vec![0u64; n]; n];
    for &(a, b, c) in links {
        residual[a][b] += c;
        residual[b][a] += c;
    }
    let mut flow = 0;
    loop {
        let mut prev = vec![usize::MAX; n];
        prev[s] = s;
        let mut queue = VecDeque::from([s]);
        while let Some(x) = queue.pop_front() {
            for y in 0..n {
                if prev[y] == usize::MAX && residual[x][y] > 0 {
                    prev[y] = x;
                    queue.push_back(y);
                }
            }
        }
        if prev[t] == usize::MAX {
            return flow;
        }
        let mut push = u64::MAX;
        let mut y = t;
        while y != s {
            push = push.min(residual[prev[y]][y]);
            y = prev[y];
        }
        let mut y = t;
        while y != s {
            residual[prev[y]][y] -= push;
            residual[y][prev[y]] += push;
            y = prev[y];
        }
        flow += push;
    }
}

fn reference_bandwidth(net: &Net, d: NodeId) -> u64 {
    max_flow(net.topology.node_count(), &net.links, net.source.0, d.0)
}

/// Every plan the crate can make for a net.
fn all_plans(net: &Net, seed: u64) -> Vec<(&'static str, TreePlan)> {
    let (t, s, d) = (&net.topology, net.source, &net.destinations[..]);
    vec![
        ("stable", stable_trees(t, s, d).unwrap()),
        ("fpfr", fpfr_depth_first(t, s, d).unwrap()),
        ("depth-first", depth_first_pipeline(t, s, d).unwrap()),
        ("flat", flat_tree_plan(t, s, d).unwrap()),
        ("random", random_pipeline(t, s, d, 10, seed).unwrap()),
        ("dijkstra", dijkstra_tree(t, s, d).unwrap()),
    ]
}

const EPS: f64 = 1e-6;

// ------------------------------------------------- rank-based broadcasts

proptest! {
    /// Delivery, for every rank-based algorithm: each destination ends with
    /// exactly the data, each byte received once, whatever the order of the
    /// transfers within a step.
    #[test]
    fn every_rank_algorithm_delivers_every_byte_exactly_once_in_any_send_order(
        nodes in 1usize..24,
        root in any::<Index>(),
        len in 0usize..700,
        chunk in 1usize..64,
        cutoff in 0usize..100,
        data_seed in any::<u64>(),
        order_seed in any::<u64>(),
    ) {
        let root = root.index(nodes);
        let data = bytes(len, data_seed);
        let single = SymmetricConfig { small_message_max: cutoff, small: SmallMessage::SingleStep };
        let binomial = SymmetricConfig { small_message_max: cutoff, small: SmallMessage::Binomial };
        for schedule in [
            flat_tree(nodes, root, len).unwrap(),
            binomial_tree(nodes, root, len).unwrap(),
            pipelined_chain(nodes, root, len, chunk).unwrap(),
            symmetric(nodes, root, len, single).unwrap(),
            symmetric(nodes, root, len, binomial).unwrap(),
            symmetric(nodes, root, len, SymmetricConfig::default()).unwrap(),
        ] {
            prop_assert_eq!(schedule.destinations.len(), nodes - 1);
            prop_assert!(!schedule.destinations.contains(&root));
            let delivery = assert_delivers_exactly_once(&schedule, &data, order_seed);
            // Only the broadcast's own ranks take part.
            prop_assert!(delivery.nodes.keys().all(|n| *n < nodes && *n != root));
        }
    }

    /// Juhász §2: the binomial tree takes ⌈log₂ p⌉ steps, the holders
    /// doubling each step, and each node sends at most one message per step.
    #[test]
    fn juhasz_s2_binomial_tree_finishes_in_ceil_log2_p_steps(
        nodes in 1usize..200,
        root in any::<Index>(),
        len in 1usize..64,
    ) {
        let root = root.index(nodes);
        let schedule = binomial_tree(nodes, root, len).unwrap();
        prop_assert_eq!(schedule.step_count(), ceil_log2(nodes));
        for step in &schedule.steps {
            let senders: BTreeSet<_> = step.iter().map(|t| t.from).collect();
            prop_assert_eq!(senders.len(), step.len());
        }
        prop_assert_eq!(schedule.message_count(), nodes - 1);
        let delivery = assert_delivers_exactly_once(&schedule, &bytes(len, 1), 0);
        for got in delivery.nodes.values() {
            prop_assert!(got.hops.iter().all(|&h| h as usize <= ceil_log2(nodes)));
        }
    }

    /// Juhász §2 eq. 2: the linear (flat) broadcast costs `p·(t_0 + n·t_d)`
    /// for `p` destinations; the binomial tree `⌈log₂ p⌉·(t_0 + n·t_d)`.
    #[test]
    fn juhasz_s2_eq2_linear_broadcast_costs_p_messages(
        nodes in 1usize..64,
        len in 1usize..5000,
        t0 in 0.0f64..100.0,
        td in 0.0f64..1.0,
    ) {
        let one = t0 + len as f64 * td;
        let flat = flat_tree(nodes, 0, len).unwrap();
        prop_assert!((flat.linear_cost(t0, td) - (nodes - 1) as f64 * one).abs() < 1e-6 * (1.0 + one * nodes as f64));
        let tree = binomial_tree(nodes, 0, len).unwrap();
        prop_assert!((tree.linear_cost(t0, td) - ceil_log2(nodes) as f64 * one).abs() < 1e-6 * (1.0 + one * nodes as f64));
    }

    /// The pipelined chain: `k = ⌈n/c⌉` chunks through `p − 1` links take
    /// `k + p − 2` steps, and every byte travels one hop per chain link.
    #[test]
    fn chain_pipeline_takes_chunks_plus_links_minus_one_steps(
        nodes in 2usize..30,
        root in any::<Index>(),
        len in 1usize..500,
        chunk in 1usize..100,
    ) {
        let root = root.index(nodes);
        let schedule = pipelined_chain(nodes, root, len, chunk).unwrap();
        let k = len.div_ceil(chunk);
        prop_assert_eq!(schedule.step_count(), k + nodes - 2);
        let delivery = assert_delivers_exactly_once(&schedule, &bytes(len, 3), 9);
        for (position, d) in schedule.destinations.iter().enumerate() {
            prop_assert!(delivery.nodes[d].hops.iter().all(|&h| h as usize == position + 1));
        }
    }

    /// Juhász §3 eq. 3: the pieces are consecutive, cover the message, and
    /// their lengths differ by at most one byte.
    #[test]
    fn juhasz_s3_eq3_pieces_cover_the_message_evenly(len in 0usize..100_000, parts in 1usize..100) {
        let pieces = even_pieces(len, parts);
        prop_assert_eq!(pieces.len(), parts);
        prop_assert_eq!(pieces[0].start, 0);
        prop_assert_eq!(pieces[parts - 1].end, len);
        for (i, w) in pieces.windows(2).enumerate() {
            prop_assert_eq!(w[0].end, w[1].start, "gap after piece {}", i);
        }
        for (i, p) in pieces.iter().enumerate() {
            let i = i + 1;
            prop_assert_eq!(p.start, (i - 1) * len / parts);
            prop_assert_eq!(p.end, i * len / parts);
            prop_assert!(p.len() == len / parts || p.len() == len / parts + 1);
        }
    }

    /// Juhász §3: the source sends every byte once (one piece to each
    /// destination), each destination forwards exactly its own piece to the
    /// other `p − 1`, so every byte reaches every destination in at most two
    /// hops, and `p·n` bytes cross the network in all.
    #[test]
    fn juhasz_s3_every_byte_crosses_the_network_at_most_twice(
        nodes in 2usize..40,
        root in any::<Index>(),
        len in 0usize..3000,
        order_seed in any::<u64>(),
    ) {
        let root = root.index(nodes);
        let p = nodes - 1;
        let config = SymmetricConfig { small_message_max: 0, small: SmallMessage::SingleStep };
        let schedule = symmetric(nodes, root, len, config).unwrap();
        let sent = schedule.bytes_sent_by();
        prop_assert_eq!(sent.get(&root).copied().unwrap_or(0), len as u64);
        let pieces = even_pieces(len, p);
        for (d, piece) in schedule.destinations.iter().zip(&pieces) {
            prop_assert_eq!(sent.get(d).copied().unwrap_or(0), ((p - 1) * piece.len()) as u64);
        }
        prop_assert_eq!(schedule.bytes_on_network(), (p * len) as u64);
        prop_assert!(schedule.step_count() <= 2);
        let delivery = assert_delivers_exactly_once(&schedule, &bytes(len, 5), order_seed);
        for d in &schedule.destinations {
            prop_assert!(delivery.nodes[d].hops.iter().all(|&h| h <= 2));
        }
    }

    /// Juhász §3 eq. 5: in the linear model the symmetric broadcast costs
    /// `2·t_0 + n·t_d·(2 − 1/p)` when `p` divides `n` — two message times,
    /// whatever `p` — and `t_0 + n·t_d + t_0 + (p − 1)·⌈n/p⌉·t_d` in general.
    #[test]
    fn juhasz_s3_eq5_time_is_two_transfers_independent_of_p(
        p in 1usize..40,
        per_piece in 1usize..200,
        extra in 0usize..40,
        t0 in 0.0f64..100.0,
        td in 0.001f64..1.0,
    ) {
        let config = SymmetricConfig { small_message_max: 0, small: SmallMessage::SingleStep };
        let n = p * per_piece;
        let cost = symmetric(p + 1, 0, n, config).unwrap().linear_cost(t0, td);
        let eq5 = 2.0 * t0 + n as f64 * td * (2.0 - 1.0 / p as f64);
        let eq5 = if p == 1 { t0 + n as f64 * td } else { eq5 };
        prop_assert!((cost - eq5).abs() < 1e-6 * (1.0 + eq5), "cost {} eq5 {}", cost, eq5);
        prop_assert!(cost <= 2.0 * (t0 + n as f64 * td) + 1e-6 * (1.0 + eq5));

        let n = n + extra % p.max(1);
        let cost = symmetric(p + 1, 0, n, config).unwrap().linear_cost(t0, td);
        let general = if p == 1 {
            t0 + n as f64 * td
        } else {
            2.0 * t0 + n as f64 * td + ((p - 1) * n.div_ceil(p)) as f64 * td
        };
        prop_assert!((cost - general).abs() < 1e-6 * (1.0 + general));
    }
}

/// Juhász §3 ("in case of small message sizes it is better to distribute
/// the whole information in a single step during phase 1") and §4 (the tree
/// is better up to 2 kB): at or below the cut-off the fallback is used.
#[test]
fn juhasz_s3_s4_small_messages_fall_back() {
    let config = SymmetricConfig::default();
    assert_eq!(config.small_message_max, 2048);
    assert_eq!(
        symmetric(9, 2, 2048, config).unwrap(),
        binomial_tree(9, 2, 2048).unwrap()
    );
    let single = SymmetricConfig {
        small: SmallMessage::SingleStep,
        ..config
    };
    let schedule = symmetric(9, 2, 100, single).unwrap();
    assert_eq!(schedule.step_count(), 1);
    assert_eq!(schedule.message_count(), 8);
    assert!(
        schedule.steps[0]
            .iter()
            .all(|t| t.from == 2 && t.range == (0..100))
    );
    // Above the cut-off: the two phases, ~p² messages.
    let big = symmetric(9, 2, 2049, config).unwrap();
    assert_eq!(big.step_count(), 2);
    assert_eq!(big.message_count(), 8 + 8 * 7);
}

/// Juhász §4: "for a single destination node the two algorithms are
/// equivalent, as both have to send all the data in one piece".
#[test]
fn juhasz_s4_one_destination_gets_one_whole_message() {
    let config = SymmetricConfig {
        small_message_max: 0,
        small: SmallMessage::SingleStep,
    };
    let schedule = symmetric(2, 1, 5000, config).unwrap();
    assert_eq!(
        schedule.steps,
        vec![vec![Transfer {
            from: 1,
            to: 0,
            range: 0..5000
        }]]
    );
    assert_eq!(schedule.steps, binomial_tree(2, 1, 5000).unwrap().steps);
}

/// Juhász §3, Fig. 1 with 4 destinations and n = 10: pieces of 2, 3, 2, 3
/// bytes by eq. 3, then each destination forwards its own to the other 3.
#[test]
fn juhasz_s3_fig1_four_destinations() {
    let config = SymmetricConfig {
        small_message_max: 0,
        small: SmallMessage::SingleStep,
    };
    let s = symmetric(5, 0, 10, config).unwrap();
    let phase1: Vec<_> = s.steps[0].iter().map(|t| (t.to, t.range.clone())).collect();
    assert_eq!(phase1, vec![(1, 0..2), (2, 2..5), (3, 5..7), (4, 7..10)]);
    assert_eq!(s.steps[1].len(), 12);
    for t in &s.steps[1] {
        assert_eq!(t.range, phase1[t.from - 1].1);
        assert_ne!(t.from, t.to);
    }
}

#[test]
fn rank_schedules_reject_bad_arguments() {
    assert_eq!(flat_tree(0, 0, 1), Err(CollectiveError::NoNodes));
    assert_eq!(
        binomial_tree(3, 3, 1),
        Err(CollectiveError::RootOutOfRange { root: 3, nodes: 3 })
    );
    assert_eq!(pipelined_chain(3, 0, 1, 0), Err(CollectiveError::ZeroChunk));
}

/// The simulator enforces a step's contract: forwarding bytes received in
/// the same step is an error, whatever the order.
#[test]
fn simulator_rejects_forwarding_within_a_step() {
    let schedule = Schedule {
        root: 0,
        destinations: vec![1, 2],
        len: 4,
        steps: vec![vec![
            Transfer {
                from: 0,
                to: 1,
                range: 0..4,
            },
            Transfer {
                from: 1,
                to: 2,
                range: 0..4,
            },
        ]],
    };
    for seed in 0..8 {
        assert!(matches!(
            execute(&schedule, &[1, 2, 3, 4], seed),
            Err(CollectiveError::SendsUnheldData { from: 1, .. })
        ));
    }
    assert!(matches!(
        execute(&schedule, &[1, 2, 3], 0),
        Err(CollectiveError::LengthMismatch { .. })
    ));
}

// -------------------------------------------------------- stable broadcast

proptest! {
    /// Takahashi §3.4.3, eq. 10 (optimality): on a tree topology with
    /// symmetric links every destination receives `v₁(s, d)`, the maximum
    /// flow from the source to it — computed here independently — all at
    /// the same time, and the bandwidth model agrees with the plan.
    #[test]
    fn takahashi_s3_4_optimality_each_destination_gets_its_max_flow(net in arb_net()) {
        let plan = stable_trees(&net.topology, net.source, &net.destinations).unwrap();
        let planned = plan.planned_bandwidth();
        let model = model_bandwidth(&net.topology, &plan).unwrap();
        for &d in &net.destinations {
            let best = reference_bandwidth(&net, d);
            prop_assert_eq!(planned[&d], best, "destination {:?}", d);
            prop_assert!((model.destination[&d] - best as f64).abs() < EPS);
        }
    }

    /// Takahashi §3.1 (feasibility): "the total throughput used on each link
    /// is within its capacity", in each direction, for the planned rates and
    /// for the model's rates of every algorithm.
    #[test]
    fn takahashi_s3_1_every_plan_is_feasible(net in arb_net(), seed in any::<u64>()) {
        let planned = stable_trees(&net.topology, net.source, &net.destinations)
            .unwrap()
            .planned_arc_load(&net.topology);
        for (arc, &load) in planned.iter().enumerate() {
            prop_assert!(load <= net.topology.arc_capacity(arc));
        }
        for (name, plan) in all_plans(&net, seed) {
            let model = model_bandwidth(&net.topology, &plan).unwrap();
            for (arc, &load) in model.arc_load.iter().enumerate() {
                let cap = net.topology.arc_capacity(arc) as f64;
                prop_assert!(load <= cap + EPS, "{}: arc {} load {} > {}", name, arc, load, cap);
            }
        }
    }

    /// Takahashi §3.1 (stability): for destination sets `D ⊂ E` and every
    /// `n ∈ D`, the bandwidth to `n` with `E` is never smaller than with `D`
    /// — on a tree it does not depend on the other destinations at all
    /// (§3.4.3, "the receiving bandwidth does not depend on other
    /// destinations").
    #[test]
    fn takahashi_s3_1_stability_adding_destinations_never_lowers_bandwidth(net in arb_net()) {
        let small = stable_trees(&net.topology, net.source, &net.destinations).unwrap();
        let large = stable_trees(&net.topology, net.source, &net.others).unwrap();
        let (w_d, w_e) = (small.planned_bandwidth(), large.planned_bandwidth());
        let (m_d, m_e) = (
            model_bandwidth(&net.topology, &small).unwrap(),
            model_bandwidth(&net.topology, &large).unwrap(),
        );
        for d in &net.destinations {
            prop_assert_eq!(w_d[d], w_e[d]);
            prop_assert!(m_e.destination[d] >= m_d.destination[d] - EPS);
        }
    }

    /// Takahashi §4.2 (Fig. 7d): a node with a small bandwidth joins the
    /// broadcast; the stable broadcast does not lower any older node's
    /// bandwidth in the model.
    #[test]
    fn takahashi_s4_2_stability_adding_a_slow_node(
        net in arb_net(),
        at in any::<Index>(),
        slow in 1u64..=3,
    ) {
        let before = model_bandwidth(
            &net.topology,
            &stable_trees(&net.topology, net.source, &net.destinations).unwrap(),
        )
        .unwrap();
        let mut grown = net.topology.clone();
        let newcomer = grown.add_host();
        grown.connect(net.switches[at.index(net.switches.len())], newcomer, slow).unwrap();
        let mut with = net.destinations.clone();
        with.push(newcomer);
        let after = model_bandwidth(&grown, &stable_trees(&grown, net.source, &with).unwrap()).unwrap();
        for d in &net.destinations {
            prop_assert!(after.destination[d] >= before.destination[d] - EPS);
        }
        prop_assert!(after.destination[&newcomer] > 0.0);
    }

    /// Takahashi §3.4.3, eqs. 5, 6 and 9: the trees' destination sets are
    /// nested, tree `k` loses exactly the destinations with the smallest
    /// remaining `v_k`, `u_k` is the step between consecutive distinct
    /// values of `v₁(s, d)` — so there are as many trees as distinct values —
    /// and (§3.4.1) a depth-first pipeline crosses each arc at most once.
    #[test]
    fn takahashi_s3_4_trees_peel_off_destinations_by_max_flow(net in arb_net()) {
        let plan = stable_trees(&net.topology, net.source, &net.destinations).unwrap();
        let v1: BTreeMap<NodeId, u64> = net
            .destinations
            .iter()
            .map(|&d| (d, reference_bandwidth(&net, d)))
            .collect();
        let levels: BTreeSet<u64> = v1.values().copied().collect();
        prop_assert_eq!(plan.trees.len(), levels.len());
        let mut below = 0;
        for (tree, &level) in plan.trees.iter().zip(&levels) {
            prop_assert_eq!(tree.throughput, Some(level - below));
            let reached: BTreeSet<NodeId> = tree.destinations().into_iter().collect();
            let expected: BTreeSet<NodeId> =
                v1.iter().filter(|(_, v)| **v > below).map(|(&d, _)| d).collect();
            prop_assert_eq!(reached, expected);
            prop_assert!(tree.arc_multiplicity(&net.topology).values().all(|&m| m == 1));
            below = level;
        }
    }

    /// Takahashi §3.3 (Algorithm 2) and every §4 baseline sent as a
    /// pipelined tree: each destination gets all data, each byte exactly
    /// once, whatever the order of the transfers within a step.
    #[test]
    fn takahashi_s3_3_staged_sending_delivers_everything_exactly_once(
        net in arb_net(),
        len in 0usize..1500,
        chunk in 1usize..200,
        seed in any::<u64>(),
    ) {
        let data = bytes(len, seed);
        for (name, plan) in all_plans(&net, seed) {
            let schedule = staged_schedule(&plan, len, chunk).unwrap();
            let mut expected: Vec<usize> = net.destinations.iter().map(|d| d.0).collect();
            let mut got = schedule.destinations.clone();
            expected.sort_unstable();
            got.sort_unstable();
            prop_assert_eq!(got, expected, "{}", name);
            assert_delivers_exactly_once(&schedule, &data, seed.rotate_left(7));
        }
    }

    /// Takahashi §3.4.3 ("this is the maximum amount of data d can
    /// receive") and §3.5/§4 (the partial trees only add bandwidth): no
    /// algorithm gives a destination more than its max-flow, and the stable
    /// broadcast's aggregate bandwidth is at least every baseline's.
    #[test]
    fn takahashi_s4_stable_has_the_largest_aggregate_bandwidth(net in arb_net(), seed in any::<u64>()) {
        let plans = all_plans(&net, seed);
        let ours = model_bandwidth(&net.topology, &plans[0].1).unwrap().aggregate();
        for (name, plan) in &plans {
            let model = model_bandwidth(&net.topology, plan).unwrap();
            for &d in &net.destinations {
                prop_assert!(model.destination[&d] <= reference_bandwidth(&net, d) as f64 + EPS, "{}", name);
                prop_assert!(model.destination[&d] > 0.0, "{} starves {:?}", name, d);
            }
            prop_assert!(ours >= model.aggregate() - EPS, "{} beats stable", name);
        }
    }

    /// Random Pipeline is a function of its seed.
    #[test]
    fn random_pipeline_is_a_function_of_its_seed(net in arb_net(), seed in any::<u64>()) {
        let a = random_pipeline(&net.topology, net.source, &net.destinations, 20, seed).unwrap();
        let b = random_pipeline(&net.topology, net.source, &net.destinations, 20, seed).unwrap();
        prop_assert_eq!(a, b);
    }
}

/// Takahashi Fig. 2 / Fig. 3, reconstructed from the numbers the text
/// gives (the figure itself is not in the text): S and D0…D4 on one switch.
/// `t1` reaches D0…D4 at 3, limited by D0's link; `t2` reaches D1…D4 at 2;
/// four trees in all; D1 receives 3 from D0 (t1) and 4 from S (t2, t3), the
/// combined 7 being the most it can receive.
#[test]
fn takahashi_fig2_fig3_four_trees_and_d1_receives_seven() {
    let mut t = Topology::new();
    let sw = t.add_switch();
    let s = t.add_host();
    t.connect(sw, s, 100).unwrap();
    let caps = [3, 7, 5, 8, 8];
    let d: Vec<NodeId> = caps
        .iter()
        .map(|&c| {
            let h = t.add_host();
            t.connect(sw, h, c).unwrap();
            h
        })
        .collect();
    let plan = stable_trees(&t, s, &d).unwrap();
    let summary: Vec<(Vec<NodeId>, Option<u64>)> = plan
        .trees
        .iter()
        .map(|tree| (tree.destinations(), tree.throughput))
        .collect();
    assert_eq!(
        summary,
        vec![
            (d.clone(), Some(3)),
            (d[1..].to_vec(), Some(2)),
            (vec![d[1], d[3], d[4]], Some(2)),
            (vec![d[3], d[4]], Some(1)),
        ]
    );
    // Fig. 3: D1's incoming flows.
    let mut from: BTreeMap<NodeId, u64> = BTreeMap::new();
    for tree in &plan.trees {
        for &(a, b) in &tree.edges {
            if b == d[1] {
                *from.entry(a).or_insert(0) += tree.throughput.unwrap();
            }
        }
    }
    assert_eq!(from, BTreeMap::from([(d[0], 3), (s, 4)]));
    assert_eq!(plan.planned_bandwidth()[&d[1]], 7);
    let model = model_bandwidth(&t, &plan).unwrap();
    assert!((model.destination[&d[1]] - 7.0).abs() < EPS);
}

/// Takahashi Fig. 1, reconstructed from its numbers: D0, D1, D2 get an
/// aggregate 15 from a depth-first pipeline; when D3 with a narrow link
/// joins (first in depth-first order), the pipeline drops them to 6, while
/// multiple streams give them 16 with or without D3.
#[test]
fn takahashi_fig1_depth_first_pipeline_is_not_stable_but_multistream_is() {
    let mut t = Topology::new();
    let sw = t.add_switch();
    let s = t.add_host();
    t.connect(sw, s, 100).unwrap();
    let d3 = t.add_host();
    t.connect(sw, d3, 2).unwrap();
    let old: Vec<NodeId> = [5, 5, 6]
        .iter()
        .map(|&c| {
            let h = t.add_host();
            t.connect(sw, h, c).unwrap();
            h
        })
        .collect();
    let mut all = old.clone();
    all.push(d3);
    let aggregate_of_old = |plan: &TreePlan| -> f64 {
        let m = model_bandwidth(&t, plan).unwrap();
        old.iter().map(|d| m.destination[d]).sum()
    };
    let df_before = aggregate_of_old(&depth_first_pipeline(&t, s, &old).unwrap());
    let df_after = aggregate_of_old(&depth_first_pipeline(&t, s, &all).unwrap());
    assert!((df_before - 15.0).abs() < EPS, "{df_before}");
    assert!((df_after - 6.0).abs() < EPS, "{df_after}");
    let ours_before = aggregate_of_old(&stable_trees(&t, s, &old).unwrap());
    let ours_after = aggregate_of_old(&stable_trees(&t, s, &all).unwrap());
    assert!((ours_before - 16.0).abs() < EPS);
    assert!((ours_after - 16.0).abs() < EPS);
}

/// Takahashi §2.2: "if a node has N children, these children can only
/// receive 1/N bandwidth each" — the flat tree splits the source's link.
#[test]
fn takahashi_s2_2_flat_tree_children_share_the_source_link() {
    let mut t = Topology::new();
    let sw = t.add_switch();
    let s = t.add_host();
    t.connect(sw, s, 12).unwrap();
    let d: Vec<NodeId> = (0..4)
        .map(|_| {
            let h = t.add_host();
            t.connect(sw, h, 100).unwrap();
            h
        })
        .collect();
    let m = model_bandwidth(&t, &flat_tree_plan(&t, s, &d).unwrap()).unwrap();
    assert!(d.iter().all(|x| (m.destination[x] - 3.0).abs() < EPS));
    // A slow destination takes only what it can use; the rest is shared.
    let slow = t.add_host();
    t.connect(sw, slow, 2).unwrap();
    let mut with = d.clone();
    with.push(slow);
    let m = model_bandwidth(&t, &flat_tree_plan(&t, s, &with).unwrap()).unwrap();
    assert!((m.destination[&slow] - 2.0).abs() < EPS);
    assert!(d.iter().all(|x| (m.destination[x] - 2.5).abs() < EPS));
}

/// Takahashi §2.2, Dijkstra: fast nodes are attached first, from the widest
/// path out of the already-reached set.
#[test]
fn takahashi_s2_2_dijkstra_attaches_the_widest_path_first() {
    let mut t = Topology::new();
    let core = t.add_switch();
    let (a, b) = (t.add_switch(), t.add_switch());
    t.connect(core, a, 10).unwrap();
    t.connect(core, b, 3).unwrap();
    let s = t.add_host();
    t.connect(a, s, 10).unwrap();
    let near = t.add_host();
    t.connect(a, near, 8).unwrap();
    let far1 = t.add_host();
    t.connect(b, far1, 9).unwrap();
    let far2 = t.add_host();
    t.connect(b, far2, 9).unwrap();
    let plan = dijkstra_tree(&t, s, &[far1, far2, near]).unwrap();
    // near (8 from s), then far1 (3 from s or near), then far2 (9 from far1).
    assert_eq!(
        plan.trees[0].edges,
        vec![(s, near), (s, far1), (far1, far2)]
    );
}

#[test]
fn topology_is_a_tree_of_positive_links() {
    let mut t = Topology::new();
    let sw = t.add_switch();
    let (h1, h2) = (t.add_host(), t.add_host());
    t.connect(sw, h1, 5).unwrap();
    t.connect(sw, h2, 5).unwrap();
    assert_eq!(
        t.connect(h1, h2, 5),
        Err(CollectiveError::Cycle { a: h1, b: h2 })
    );
    assert_eq!(
        t.connect(h1, h1, 5),
        Err(CollectiveError::Cycle { a: h1, b: h1 })
    );
    let h3 = t.add_host();
    assert_eq!(
        t.connect(sw, h3, 0),
        Err(CollectiveError::ZeroCapacity { a: sw, b: h3 })
    );
    assert_eq!(
        stable_trees(&t, sw, &[h1]),
        Err(CollectiveError::NotAHost(sw))
    );
    assert_eq!(
        stable_trees(&t, h1, &[h3]),
        Err(CollectiveError::Unreachable(h3))
    );
    assert_eq!(
        stable_trees(&t, h1, &[h2, h2]),
        Err(CollectiveError::DuplicateDestination(h2))
    );
    assert_eq!(
        stable_trees(&t, h1, &[NodeId(99)]),
        Err(CollectiveError::UnknownNode(NodeId(99)))
    );
    assert_eq!(t.path_bandwidth(h1, h2), Some(5));
}

/// Algorithm 2 needs the nested destination sets Algorithm 1 produces.
#[test]
fn takahashi_s3_3_staged_sending_rejects_unnested_trees() {
    let mut t = Topology::new();
    let sw = t.add_switch();
    let s = t.add_host();
    let (a, b) = (t.add_host(), t.add_host());
    for h in [s, a, b] {
        t.connect(sw, h, 5).unwrap();
    }
    let plan = TreePlan {
        source: s,
        destinations: vec![a, b],
        trees: vec![
            TransferTree::pipeline(s, &[a], Some(1)),
            TransferTree::pipeline(s, &[b], Some(1)),
        ],
    };
    assert_eq!(
        staged_schedule(&plan, 10, 4),
        Err(CollectiveError::NotNested { tree: 1 })
    );
}
