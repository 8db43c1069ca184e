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
    let online: Vec<PeerId> = live
        .peers
        .iter()
        .filter(|(_, p)| lease::is_valid(now, p.expires_at))
        .map(|(&id, _)| id)
        .collect();
    let targets = clustering::probe_targets(
        peer,
        &online,
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
        clustering::ProbePolicy::default(),
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
