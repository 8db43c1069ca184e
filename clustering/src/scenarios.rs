//! The small measured networks of the tests and the experiments
//! (`examples/small_networks.rs`): the testbed's shapes, every link
//! measured with ±20 % noise, and what "right" means for them.

use std::collections::{BTreeMap, BTreeSet};

use crate::{DidicParams, EdgeRule, MeasuredNetwork, Rng, neighbours};

/// Directed measurements `(from, to, bandwidth)`: every ordered pair of
/// `peers` that `measures(a, b)`, at `bandwidth(a, b)` ± 20 %.
pub fn measure(
    peers: &[i64],
    measures: impl Fn(i64, i64) -> bool,
    bandwidth: impl Fn(i64, i64) -> f64,
    rng: &mut Rng,
) -> Vec<(i64, i64, f64)> {
    let mut links = vec![];
    for &a in peers {
        for &b in peers {
            if a != b && measures(a, b) {
                links.push((a, b, bandwidth(a, b) * (0.8 + 0.4 * rng.unit())));
            }
        }
    }
    links
}

/// `n_sites` sites of `per_site` peers (ids from 1, site by site): 100
/// inside a site, `between` across. `wide`: every pair is measured (as the
/// supernode's 32 candidates cover a small network); else only each peer's
/// 8 rendezvous neighbours.
pub fn sites(
    n_sites: i64,
    per_site: i64,
    between: f64,
    wide: bool,
    rng: &mut Rng,
) -> Vec<(i64, i64, f64)> {
    let peers: Vec<i64> = (1..=n_sites * per_site).collect();
    let site = |p: i64| (p - 1) / per_site;
    let nb: BTreeMap<i64, Vec<i64>> = peers
        .iter()
        .map(|&p| (p, neighbours(p, &peers, 8)))
        .collect();
    measure(
        &peers,
        |a, b| wide || nb[&a].contains(&b),
        |a, b| if site(a) == site(b) { 100.0 } else { between },
        rng,
    )
}

/// Two sites of four peers, 100 inside, joined by one link (peers 1 and 5)
/// at 2.
pub fn two_sites_one_link(rng: &mut Rng) -> Vec<(i64, i64, f64)> {
    let peers: Vec<i64> = (1..=8).collect();
    let site = |p: i64| (p - 1) / 4;
    measure(
        &peers,
        |a, b| site(a) == site(b) || (a.min(b), a.max(b)) == (1, 5),
        |a, b| if site(a) == site(b) { 100.0 } else { 2.0 },
        rng,
    )
}

/// The partition of `clusters` as sets of peers.
pub fn partition(clusters: &BTreeMap<i64, u32>) -> BTreeSet<BTreeSet<i64>> {
    let mut by: BTreeMap<u32, BTreeSet<i64>> = BTreeMap::new();
    for (&p, &c) in clusters {
        by.entry(c).or_default().insert(p);
    }
    by.into_values().collect()
}

/// The right clusters of [`sites`]: each site, as a set of peers.
pub fn want(n_sites: i64, per_site: i64) -> BTreeSet<BTreeSet<i64>> {
    (0..n_sites)
        .map(|s| (s * per_site + 1..=(s + 1) * per_site).collect())
        .collect()
}

/// From `seed`: the first step (≤ `within`) from which the clusters are
/// `want` and keep their numbers for `hold` more steps, if any.
pub fn settles(
    params: DidicParams,
    rule: EdgeRule,
    seed: u64,
    links: &[(i64, i64, f64)],
    want: &BTreeSet<BTreeSet<i64>>,
    within: u32,
    hold: u32,
) -> Option<u32> {
    let mut net = MeasuredNetwork::with_edge_rule(params, rule, seed);
    net.update(links.iter().copied());
    let mut first: Option<(u32, BTreeMap<i64, u32>)> = None;
    for t in 1..=within + hold {
        net.step();
        let clusters = net.clusters();
        match &first {
            Some((at, settled)) if t <= at + hold && clusters != *settled => return None,
            Some((at, _)) if t <= at + hold => {}
            Some(_) => break,
            None if partition(&clusters) == *want => first = Some((t, clusters)),
            None if t >= within => return None,
            None => {}
        }
    }
    first.map(|(t, _)| t)
}
