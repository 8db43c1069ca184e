//! The links peers measure for the clustering (chapter 5): recording a
//! renewal's measurements and choosing the peers it should probe next.

use super::*;

/// How long a probe ticket is valid: a probe starts within seconds of the
/// renewal that asked for it.
pub(super) const PROBE_TICKET_MS: i64 = 60_000;

/// A measurement is recorded only if the link was asked for this recently
/// (the probe starts within the ticket's minute; its result comes with a
/// renewal after it ends).
pub(super) const PROBE_REPORT_MS: i64 = 2 * PROBE_TICKET_MS + 60_000;

/// A link to one of a peer's neighbours (its fastest measured links) is
/// measured again this long after its last measurement.
pub(super) const PROBE_REFRESH_MS: i64 = 10 * 60_000;

/// A link to a candidate that is not a neighbour is measured again this
/// long after its last measurement (a faster path may have appeared).
/// With 8 neighbours every 10 minutes and 24 other candidates every 3
/// hours a peer sends about 56 probes an hour and answers as many: about
/// 30 MiB, within the default `--probe-mib-per-hour` of 32.
pub(super) const PROBE_REVISIT_MS: i64 = 3 * 60 * 60_000;

/// A link asked for and not measured (the target refused, or was busy) is
/// asked for again after this long.
pub(super) const PROBE_RETRY_MS: i64 = 30_000;

/// A peer's probe candidates are chosen again among all online peers this
/// long after they were chosen, so peers that joined since get their turn.
/// Choosing them looks at every online peer; doing it at every renewal
/// made a renewal cost O(peers) (issue 14).
pub(super) const CANDIDATES_REFRESH_MS: i64 = 5 * 60_000;

/// Online peers looked at per second, at most, to choose probe candidates
/// (about 1 % of a core). Choosing a peer's candidates looks at every
/// online peer, so after a supernode starts, the first renewals of 10⁵
/// peers would each cost O(10⁵) at once; with this budget each second
/// chooses for as many peers as it allows (20 a second among 10⁵ peers,
/// every peer within the second in networks of up to ~1 400), and the
/// others probe their old candidates, or nothing, meanwhile. Measuring
/// links is not urgent: a link is measured again after minutes to hours.
pub(super) const CANDIDATE_WORK_PER_SEC: u64 = 2_000_000;

/// `peer`'s probe candidates (`clustering::neighbours` among the online
/// peers), as chosen at most [`CANDIDATES_REFRESH_MS`] ago, or chosen
/// again: when one of them is no longer online, or when they are fewer
/// than the policy wants and peers came or went since (a small network
/// growing) — within [`CANDIDATE_WORK_PER_SEC`]; over it, the old ones
/// still online (none if it had none).
fn candidates(
    live: &mut crate::Live,
    peer: PeerId,
    now: i64,
    policy: clustering::ProbePolicy,
) -> Vec<PeerId> {
    let want = policy.candidates.max(policy.max_neigh);
    let online = |live: &crate::Live, p: &PeerId| {
        live.peers
            .get(p)
            .is_some_and(|lp| lease::is_valid(now, lp.expires_at))
    };
    if let Some(c) = live.candidates.get(&peer)
        && now.saturating_sub(c.chosen_at) < CANDIDATES_REFRESH_MS
        && (c.peers.len() >= want || c.known == live.peers.len())
        && c.peers.iter().all(|p| online(live, p))
    {
        return c.peers.clone();
    }
    let cost = live.peers.len() as u64;
    let second = now.div_euclid(1000);
    if live.candidate_work.0 != second {
        live.candidate_work = (second, 0);
    }
    let used = live.candidate_work.1;
    // At least one choice a second, however large the network.
    if used > 0 && used.saturating_add(cost) > CANDIDATE_WORK_PER_SEC {
        return live.candidates.get(&peer).map_or_else(Vec::new, |c| {
            c.peers
                .iter()
                .copied()
                .filter(|p| online(live, p))
                .collect()
        });
    }
    live.candidate_work.1 = used.saturating_add(cost);
    let all: Vec<PeerId> = live
        .peers
        .iter()
        .filter(|(_, p)| lease::is_valid(now, p.expires_at))
        .map(|(&id, _)| id)
        .collect();
    let peers = clustering::neighbours(peer, &all, want);
    live.candidates.insert(
        peer,
        crate::Candidates {
            peers: peers.clone(),
            chosen_at: now,
            known: live.peers.len(),
        },
    );
    peers
}

/// Record the links `peer` measured (to online peers other than itself;
/// the rest is ignored) and choose the peers it should measure next
/// (`clustering::probe_targets`), with their tickets.
pub(super) fn record_links_and_choose_probes(
    inner: &crate::Inner,
    peer: PeerId,
    measured: &[bsp_api::control::LinkMeasurement],
    now: i64,
) -> Vec<bsp_api::control::ProbeTarget> {
    let mut live = inner.live();
    let live = &mut *live;
    for m in measured {
        // Only links this supernode asked `peer` to measure, lately: a
        // peer cannot add links of its own choosing to the graph.
        let asked = live
            .probes_asked
            .get(&(peer, m.peer))
            .is_some_and(|&at| now.saturating_sub(at) <= PROBE_REPORT_MS);
        if m.peer != peer && asked && live.peers.contains_key(&m.peer) {
            live.links.insert(
                (peer, m.peer),
                bsp_api::rest::PeerLink {
                    peer: m.peer,
                    rtt_us: m.rtt_us,
                    bandwidth_bps: m.bandwidth_bps,
                    measured_at: now,
                },
            );
        }
    }
    let policy = clustering::ProbePolicy::default();
    let candidates = candidates(live, peer, now, policy);
    let targets = clustering::probe_targets(
        peer,
        &candidates,
        |other| {
            live.links
                .get(&(peer, other))
                .map(|l| l.bandwidth_bps as f64)
        },
        |other, neighbour| {
            let again = if neighbour {
                PROBE_REFRESH_MS
            } else {
                PROBE_REVISIT_MS
            };
            let measured = live
                .links
                .get(&(peer, other))
                .map(|l| l.measured_at + again);
            let asked = live
                .probes_asked
                .get(&(peer, other))
                .map(|&at| at + PROBE_RETRY_MS);
            measured.max(asked)
        },
        now,
        policy,
    );
    for &t in &targets {
        live.probes_asked.insert((peer, t), now);
    }
    let expires_ms = now + PROBE_TICKET_MS;
    targets
        .into_iter()
        .filter_map(|t| {
            let addr = live.peers.get(&t)?.addr.clone();
            Some(bsp_api::control::ProbeTarget {
                peer: t,
                addr,
                expires_ms,
                ticket: bsp_api::probe::ticket(&inner.keys.probe_key(t), peer, t, expires_ms),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn online(live: &mut crate::Live, id: PeerId, expires_at: i64) {
        live.peers.insert(
            id,
            crate::LivePeer {
                lease_id: format!("lease-{id}"),
                expires_at,
                last_seq: 0,
                queue: Default::default(),
                acked: 0,
                pruned: 0,
                notify: Default::default(),
                probed_at: None,
                counters: None,
                addr: format!("10.0.0.{id}:7000"),
            },
        );
    }

    /// A renewal reuses its peer's candidates instead of looking at every
    /// online peer again, and chooses them again when one went offline,
    /// when a small network grew, or after the refresh interval.
    #[test]
    fn candidates_are_kept_until_the_network_changes_them() {
        let policy = clustering::ProbePolicy::default();
        let want = policy.candidates.max(policy.max_neigh);
        let until = 1_000_000;
        let mut live = crate::Live::default();
        for id in 1..=100 {
            online(&mut live, id, until);
        }
        let all: Vec<PeerId> = (1..=100).collect();
        let first = candidates(&mut live, 1, 0, policy);
        assert_eq!(first, clustering::neighbours(1, &all, want));
        assert_eq!(first.len(), want);

        // A peer that joins later is not looked at until the refresh...
        let newcomer = (101..10_000)
            .find(|&p| {
                let mut with: Vec<PeerId> = all.clone();
                with.push(p);
                clustering::neighbours(1, &with, want).contains(&p)
            })
            .expect("some id is close to peer 1");
        online(&mut live, newcomer, until);
        assert_eq!(candidates(&mut live, 1, 1_000, policy), first);
        // ... and is then.
        let later = candidates(&mut live, 1, CANDIDATES_REFRESH_MS, policy);
        assert!(later.contains(&newcomer));

        // A candidate whose lease ran out is replaced at once.
        let gone = later[0];
        live.peers.get_mut(&gone).expect("online").expires_at = 0;
        let after = candidates(&mut live, 1, CANDIDATES_REFRESH_MS + 1, policy);
        assert!(!after.contains(&gone));
        assert_eq!(after.len(), want);

        // In a network smaller than the policy wants, a peer that joins
        // becomes a candidate at the next renewal.
        let mut small = crate::Live::default();
        online(&mut small, 1, until);
        online(&mut small, 2, until);
        assert_eq!(candidates(&mut small, 1, 0, policy), vec![2]);
        online(&mut small, 3, until);
        let grown = candidates(&mut small, 1, 1, policy);
        assert_eq!(grown.len(), 2);
        assert!(grown.contains(&3));
    }

    /// Choosing candidates stays within its budget of work per second:
    /// over it, a peer keeps its old candidates (those still online) or
    /// gets none, and chooses in a later second.
    #[test]
    fn choosing_candidates_keeps_to_its_budget() {
        let policy = clustering::ProbePolicy::default();
        let until = 10_000_000;
        let mut live = crate::Live::default();
        let n = 100_000u64;
        for id in 1..=n as PeerId {
            online(&mut live, id, until);
        }
        let per_second = (CANDIDATE_WORK_PER_SEC / n).max(1) as PeerId;
        // Within one second: that many peers choose, the next gets none.
        for id in 1..=per_second {
            assert_eq!(
                candidates(&mut live, id, 5_000, policy).len(),
                32,
                "peer {id}"
            );
        }
        assert!(candidates(&mut live, per_second + 1, 5_500, policy).is_empty());
        assert_eq!(live.candidate_work, (5, per_second as u64 * n));
        // The next second it chooses.
        assert_eq!(
            candidates(&mut live, per_second + 1, 6_000, policy).len(),
            32
        );
        // A peer due to choose again keeps its old candidates meanwhile.
        let old = live.candidates[&1].peers.clone();
        live.candidate_work = (6 + CANDIDATES_REFRESH_MS / 1000, CANDIDATE_WORK_PER_SEC);
        let later = 6_000 + CANDIDATES_REFRESH_MS;
        assert_eq!(candidates(&mut live, 1, later, policy), old);
    }
}
