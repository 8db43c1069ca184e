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
use std::sync::Arc;

use bsp_api::PeerId;

use crate::Supernode;

/// Time steps a peer takes part in before its found cluster is shown and
/// used: DiDiC starts from random clusters and needs a few dozen time
/// steps to refine them (§5.3, "not designed to deliver good clusterings
/// from early time steps on"); until then a peer has no found cluster.
pub(crate) const WARM_UP_STEPS: u64 = 30;

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
}

/// The name of DiDiC's cluster number `c`, as shown and as sites are
/// named (a valid `--cluster` name, so the two kinds mix).
pub(crate) fn found_name(c: u32) -> String {
    format!("found-{c}")
}

impl Finder {
    pub(crate) fn new(seed: u64) -> Finder {
        Finder {
            net: clustering::MeasuredNetwork::new(clustering::DidicParams::measured(), seed),
            steps: 0,
            joined: HashMap::new(),
        }
    }

    /// One time step on the graph of `links` (`(from, to, bytes per
    /// second)`, each peer's newest measurement of each link, counted at
    /// most [`PROBE_RESOLUTION_BPS`]); returns the found cluster of every
    /// peer that is ready.
    pub(crate) fn step(
        &mut self,
        links: impl IntoIterator<Item = (PeerId, PeerId, f64)>,
    ) -> BTreeMap<PeerId, String> {
        self.net.update(
            links
                .into_iter()
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
        clusters
            .into_iter()
            .filter(|(p, _)| steps - self.joined[p] >= WARM_UP_STEPS)
            .map(|(p, c)| (p, found_name(c)))
            .collect()
    }
}

/// Steps DiDiC and publishes the found clusters, until the supernode stops.
pub(crate) async fn cluster_task(sn: Supernode) {
    let seed: u64 = rand::random();
    let finder = Arc::new(std::sync::Mutex::new(Finder::new(seed)));
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
        let finder = finder.clone();
        // A step costs O(k·ψ·ρ·edges): off the async workers.
        let found = tokio::task::spawn_blocking(move || {
            finder.lock().unwrap_or_else(|e| e.into_inner()).step(links)
        })
        .await;
        match found {
            Ok(found) => sn.inner.set_found_clusters(found),
            Err(e) => tracing::error!(error = %e, "a clustering step failed"),
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
    /// between 350 MB/s and 1.1 GB/s) are one cluster, whatever the noise
    /// (without the resolution, 3 to 5 of 200 such networks split).
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
                            links.push((a, b, 350e6 + 750e6 * noise.unit()));
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
