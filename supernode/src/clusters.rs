//! Continuous clustering (issue 15, dissertation §5.1 and §6.1): DiDiC
//! runs on the links peers measure, one time step every
//! [`Config::cluster_step`](crate::Config::cluster_step), as peers come and
//! go. A peer's *found* cluster is DiDiC's for it, once the peer has taken
//! part in enough time steps for its cluster to mean something
//! ([`WARM_UP_STEPS`]); its *effective* cluster, the one placement,
//! broadcast schedules and Robber use, is the volunteer's `--cluster` if
//! given, else the found one.
//!
//! [`Finder`] is the pure part (no clock, no IO: the task hands it the
//! links and asks for a step); [`cluster_task`] drives it.

use std::collections::{BTreeMap, HashMap};

use bsp_api::PeerId;

use crate::Supernode;

/// Time steps a peer takes part in before its found cluster is shown and
/// used: DiDiC starts from random clusters and needs a few dozen time
/// steps to refine them (§5.3, "not designed to deliver good clusterings
/// from early time steps on"); until then a peer has no found cluster.
pub(crate) const WARM_UP_STEPS: u64 = 30;

/// The cluster placement and broadcasts use for a peer: the one its
/// volunteer named (`bspweb peer --cluster`), else the one DiDiC found
/// (in `found`, a snapshot of [`crate::Inner::found_clusters`]).
pub(crate) fn effective(
    peer: PeerId,
    named: Option<String>,
    found: &BTreeMap<PeerId, String>,
) -> Option<String> {
    named.or_else(|| found.get(&peer).cloned())
}

/// The fastest bandwidth a probe tells apart, bytes per second (1 Gbit/s):
/// its 256 KiB block crosses a faster link in under 2 ms, where thread
/// wake-ups and scheduling decide the time more than the link does (on
/// loopback the same link measures anywhere from 350 MB/s to 1.1 GB/s).
/// Faster measurements count as this fast, so peers on one fast network
/// are one cluster, not one split by noise; the price is that clusters on
/// 10 Gbit/s networks joined by 1 Gbit/s links are not told apart.
pub(crate) const PROBE_RESOLUTION_BPS: f64 = 125e6;

/// DiDiC on the measured network, and which peers' clusters are ready.
#[derive(Debug)]
pub(crate) struct Finder {
    net: clustering::MeasuredNetwork,
    /// Time steps done.
    steps: u64,
    /// The step at which each peer of the graph joined it.
    joined: HashMap<PeerId, u64>,
    /// Each peer's cluster name at the last step ([`stable_names`]).
    names: BTreeMap<PeerId, u64>,
    /// The next fresh name.
    next_name: u64,
}

/// Names for the clusters of `clusters` (a cluster number per peer) that
/// change as little as the clusters do: each cluster, largest first (ties:
/// the one with the smallest peer id), takes the name most of its peers
/// had in `previous` and no larger cluster took (ties: the smaller name),
/// else a fresh one from `next`. So DiDiC renumbering a cluster renames
/// nothing; a cluster that splits keeps its name for its larger part; a
/// peer that joins a cluster takes its name.
pub(crate) fn stable_names(
    previous: &BTreeMap<PeerId, u64>,
    clusters: &BTreeMap<PeerId, u32>,
    next: &mut u64,
) -> BTreeMap<PeerId, u64> {
    let mut groups: BTreeMap<u32, Vec<PeerId>> = BTreeMap::new();
    for (&p, &c) in clusters {
        groups.entry(c).or_default().push(p);
    }
    let mut groups: Vec<Vec<PeerId>> = groups.into_values().collect();
    // Members are in id order: the first is the smallest.
    groups.sort_by_key(|g| (std::cmp::Reverse(g.len()), g[0]));
    let mut taken = std::collections::BTreeSet::new();
    let mut out = BTreeMap::new();
    for g in groups {
        let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
        for p in &g {
            if let Some(&n) = previous.get(p)
                && !taken.contains(&n)
            {
                *votes.entry(n).or_default() += 1;
            }
        }
        let name = votes
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(&n, _)| n)
            .unwrap_or_else(|| {
                *next += 1;
                *next
            });
        taken.insert(name);
        for p in g {
            out.insert(p, name);
        }
    }
    out
}

/// A found cluster's name, as shown and as sites are named (a valid
/// `--cluster` name; volunteers may not use the `found-` prefix).
pub(crate) fn found_name(n: u64) -> String {
    format!("found-{n}")
}

impl Finder {
    pub(crate) fn new(seed: u64) -> Finder {
        Finder {
            net: clustering::MeasuredNetwork::new(clustering::DidicParams::measured(), seed),
            steps: 0,
            joined: HashMap::new(),
            names: BTreeMap::new(),
            next_name: 0,
        }
    }

    /// One time step on the graph of `links` (`(from, to, bytes per
    /// second)`, each peer's newest measurement of each link, counted at
    /// most [`PROBE_RESOLUTION_BPS`]; links that are not a positive number
    /// are left out); returns the found cluster of every peer that is
    /// ready.
    pub(crate) fn step(
        &mut self,
        links: impl IntoIterator<Item = (PeerId, PeerId, f64)>,
    ) -> BTreeMap<PeerId, String> {
        self.net.update(
            links
                .into_iter()
                .filter(|&(_, _, bps)| bps.is_finite() && bps > 0.0)
                .map(|(a, b, bps)| (a, b, bps.min(PROBE_RESOLUTION_BPS))),
        );
        self.net.step();
        self.steps += 1;
        let clusters = self.net.clusters();
        let steps = self.steps;
        self.joined.retain(|p, _| clusters.contains_key(p));
        for &p in clusters.keys() {
            self.joined.entry(p).or_insert(steps);
        }
        self.names = stable_names(&self.names, &clusters, &mut self.next_name);
        self.names
            .iter()
            .filter(|(p, _)| steps - self.joined[p] >= WARM_UP_STEPS)
            .map(|(&p, &n)| (p, found_name(n)))
            .collect()
    }
}

/// Steps DiDiC and publishes the found clusters, until the supernode stops.
pub(crate) async fn cluster_task(sn: Supernode) {
    let seed: u64 = rand::random();
    let mut finder = Finder::new(seed);
    let mut tick = tokio::time::interval(sn.inner.config.cluster_step);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let links: Vec<(PeerId, PeerId, f64)> = {
            let live = sn.inner.live();
            live.links
                .iter()
                .map(|(&(from, to), l)| (from, to, l.bandwidth_bps as f64))
                .collect()
        };
        // A step costs O(k·ψ·ρ·edges): off the async workers.
        let stepped = tokio::task::spawn_blocking(move || {
            let found = finder.step(links);
            (finder, found)
        })
        .await;
        match stepped {
            Ok((back, found)) => {
                finder = back;
                sn.inner.set_found_clusters(found);
            }
            Err(e) => {
                // A panic in a step: start afresh rather than stop.
                tracing::error!(error = %e, "a clustering step failed; clustering starts again");
                finder = Finder::new(rand::random());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sites of four peers, fast inside and one slow link between.
    fn two_sites() -> Vec<(PeerId, PeerId, f64)> {
        let mut links = Vec::new();
        for site in [[1, 2, 3, 4], [5, 6, 7, 8]] {
            for &a in &site {
                for &b in &site {
                    if a != b {
                        links.push((a, b, 100e6));
                    }
                }
            }
        }
        links.push((4, 5, 2e6));
        links
    }

    /// Peers on one fast network (loopback: every link measured anywhere
    /// between 350 MB/s and 1.1 GB/s; here from 90 MB/s, below the
    /// resolution, to 1.1 GB/s) are one cluster, whatever the noise
    /// (without the resolution, 3 to 5 of 200 loopback-like networks
    /// split).
    #[test]
    fn a_fast_network_is_one_cluster_despite_noisy_probes() {
        for n in [4, 8] {
            for seed in 0..100u64 {
                let mut f = Finder::new(seed);
                let mut noise = clustering::Rng::new(7 + seed);
                let mut links = Vec::new();
                for a in 1..=n {
                    for b in 1..=n {
                        if a != b {
                            links.push((a, b, 90e6 + 1010e6 * noise.unit()));
                        }
                    }
                }
                let mut found = BTreeMap::new();
                for _ in 0..=WARM_UP_STEPS + 10 {
                    found = f.step(links.clone());
                }
                assert_eq!(found.len(), n as usize);
                let clusters: std::collections::BTreeSet<&String> = found.values().collect();
                assert_eq!(clusters.len(), 1, "{n} peers, seed {seed}: {found:?}");
            }
        }
    }

    /// Names follow the groups, not DiDiC's numbers.
    #[test]
    fn cluster_names_change_only_when_the_clusters_do() {
        let of = |pairs: &[(PeerId, u32)]| pairs.iter().copied().collect::<BTreeMap<_, _>>();
        let mut next = 0;
        let first = stable_names(
            &BTreeMap::new(),
            &of(&[(1, 7), (2, 7), (3, 7), (4, 2), (5, 2)]),
            &mut next,
        );
        assert_eq!(first[&1], first[&3]);
        assert_ne!(first[&1], first[&4]);
        // Renumbered, the same groups: the same names.
        let renumbered = stable_names(
            &first,
            &of(&[(1, 30), (2, 30), (3, 30), (4, 9), (5, 9)]),
            &mut next,
        );
        assert_eq!(renumbered, first);
        // 6 joins the first group; 3 splits off alone: the larger part
        // keeps the name, the new one gets a fresh one.
        let split = stable_names(
            &renumbered,
            &of(&[(1, 1), (2, 1), (6, 1), (3, 4), (4, 9), (5, 9)]),
            &mut next,
        );
        assert_eq!(split[&6], first[&1]);
        assert_eq!(split[&2], first[&1]);
        assert_eq!(split[&4], first[&4]);
        assert!(split[&3] != first[&1] && split[&3] != first[&4]);
        // Both groups merge: the larger's name.
        let merged = stable_names(
            &first,
            &of(&[(1, 0), (2, 0), (3, 0), (4, 0), (5, 0)]),
            &mut next,
        );
        assert!(merged.values().all(|&n| n == first[&1]));
    }

    /// Nobody's cluster is shown before it has taken part in the warm-up;
    /// a peer that joins later waits its own warm-up; a peer that leaves
    /// the graph loses its cluster at once.
    #[test]
    fn clusters_are_shown_after_the_warm_up_and_follow_the_graph() {
        let mut f = Finder::new(3);
        for _ in 0..WARM_UP_STEPS {
            assert!(f.step(two_sites()).is_empty());
        }
        let found = f.step(two_sites());
        assert_eq!(
            found.keys().copied().collect::<Vec<_>>(),
            (1..=8).collect::<Vec<_>>()
        );
        assert!(
            found
                .values()
                .all(|n| bsp_api::control::valid_cluster_name(n))
        );
        let mut with_nine = two_sites();
        with_nine.push((9, 8, 100e6));
        let found = f.step(with_nine.clone());
        assert!(!found.contains_key(&9));
        for _ in 0..WARM_UP_STEPS {
            f.step(with_nine.clone());
        }
        assert!(f.step(with_nine).contains_key(&9));
        let found = f.step(two_sites());
        assert!(!found.contains_key(&9));
        assert_eq!(found.len(), 8);
    }
}
