//! `GET /metrics`: what the supernode and its peers do, in the Prometheus
//! text exposition format (version 0.0.4).
//!
//! Counters ([`Counter`]) count since the supernode started; state changes
//! add to them through [`Effects`](crate::Effects) only once their
//! transaction committed, so a rolled-back change counts nothing. Gauges
//! ([`Gauges`]) are read from the database at each scrape. Only aggregates
//! are exposed: no user, program or peer names.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// A counter: its metric family, its label (if any) and its help text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    /// Supersteps completed by processes (one per process and superstep).
    Supersteps,
    /// Lost processes restored from a checkpoint.
    RestoresFromCheckpoint,
    /// Lost processes re-run from the start (no checkpoint survived).
    RestoresFromStart,
    /// Processes migrated to another peer (faster peer, drain).
    Migrations,
    /// Peers declared gone (lease lapsed or found unreachable).
    PeersLost,
    /// Jobs accepted.
    JobsSubmitted,
    JobsExited,
    JobsAborted,
    JobsFailed,
    JobsKilled,
    /// Output bytes stored (stdout, stderr and raw records).
    OutputBytes,
    /// Peer logins.
    PeerLogins,
    /// Lease renewals.
    LeaseRenewals,
    /// Checkpoints peers took, as they report with their renewals.
    Checkpoints,
    /// Bytes of checkpoints peers sent to replicas.
    CheckpointBytes,
    /// Message bytes peers sent to each other directly.
    MessageBytes,
    /// Message bytes peers relayed for broadcasts.
    RelayedBytes,
    /// Renewals that changed only the lease, in batches (shared database).
    PlainRenewals,
    /// Batches of plain renewals.
    RenewalBatches,
}

impl Counter {
    pub(crate) const ALL: [Counter; 19] = [
        Counter::Supersteps,
        Counter::RestoresFromCheckpoint,
        Counter::RestoresFromStart,
        Counter::Migrations,
        Counter::PeersLost,
        Counter::JobsSubmitted,
        Counter::JobsExited,
        Counter::JobsAborted,
        Counter::JobsFailed,
        Counter::JobsKilled,
        Counter::OutputBytes,
        Counter::PeerLogins,
        Counter::LeaseRenewals,
        Counter::Checkpoints,
        Counter::CheckpointBytes,
        Counter::MessageBytes,
        Counter::RelayedBytes,
        Counter::PlainRenewals,
        Counter::RenewalBatches,
    ];

    /// `(family, label, help)`; counters of one family are adjacent in
    /// [`Counter::ALL`].
    fn describe(
        self,
    ) -> (
        &'static str,
        Option<(&'static str, &'static str)>,
        &'static str,
    ) {
        use Counter::*;
        const RESTORES: &str =
            "Lost processes restored on another peer, by what they resumed from.";
        const JOBS: &str = "Jobs that ended, by outcome.";
        match self {
            Supersteps => (
                "bspweb_process_supersteps_total",
                None,
                "Supersteps completed, summed over processes (rate: supersteps per second).",
            ),
            RestoresFromCheckpoint => (
                "bspweb_restores_total",
                Some(("from", "checkpoint")),
                RESTORES,
            ),
            RestoresFromStart => ("bspweb_restores_total", Some(("from", "start")), RESTORES),
            Migrations => (
                "bspweb_migrations_total",
                None,
                "Processes migrated to another peer (a faster peer, or a drain).",
            ),
            PeersLost => (
                "bspweb_peers_lost_total",
                None,
                "Peers declared gone: lease lapsed, or found unreachable.",
            ),
            JobsSubmitted => ("bspweb_jobs_submitted_total", None, "Jobs accepted."),
            JobsExited => ("bspweb_jobs_ended_total", Some(("outcome", "exited")), JOBS),
            JobsAborted => (
                "bspweb_jobs_ended_total",
                Some(("outcome", "aborted")),
                JOBS,
            ),
            JobsFailed => ("bspweb_jobs_ended_total", Some(("outcome", "failed")), JOBS),
            JobsKilled => ("bspweb_jobs_ended_total", Some(("outcome", "killed")), JOBS),
            OutputBytes => (
                "bspweb_output_bytes_total",
                None,
                "Output stored: stdout, stderr and raw records, in bytes.",
            ),
            PeerLogins => ("bspweb_peer_logins_total", None, "Peer logins."),
            LeaseRenewals => ("bspweb_lease_renewals_total", None, "Lease renewals."),
            Checkpoints => (
                "bspweb_checkpoints_total",
                None,
                "Checkpoints taken by peers (reported with their renewals).",
            ),
            CheckpointBytes => (
                "bspweb_checkpoint_bytes_total",
                None,
                "Checkpoint bytes peers sent to the replicas of their processes.",
            ),
            MessageBytes => (
                "bspweb_message_bytes_total",
                None,
                "BSP message payload bytes peers sent directly to each other.",
            ),
            RelayedBytes => (
                "bspweb_relayed_bytes_total",
                None,
                "Payload bytes peers relayed for broadcasts.",
            ),
            PlainRenewals => (
                "bspweb_plain_renewals_total",
                None,
                "Lease renewals that changed only the lease, written in batches (shared database).",
            ),
            RenewalBatches => (
                "bspweb_renewal_batches_total",
                None,
                "Batches of plain renewals written to a shared database.",
            ),
        }
    }
}

/// Counts a state change adds once it is committed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Counts([u64; Counter::ALL.len()]);

impl Counts {
    pub(crate) fn add(&mut self, c: Counter, n: u64) {
        let slot = &mut self.0[c as usize];
        *slot = slot.saturating_add(n);
    }

    pub(crate) fn merge(&mut self, other: &Counts) {
        for c in Counter::ALL {
            self.add(c, other.0[c as usize]);
        }
    }
}

/// The supernode's counters since it started.
#[derive(Debug, Default)]
pub(crate) struct Metrics([AtomicU64; Counter::ALL.len()]);

impl Metrics {
    pub(crate) fn add(&self, counts: &Counts) {
        for (slot, n) in self.0.iter().zip(counts.0) {
            if n > 0 {
                // Saturating: a counter never wraps back (peers report some
                // of the counts, and a peer can claim anything).
                let _ = slot.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_add(n))
                });
            }
        }
    }

    pub(crate) fn snapshot(&self) -> Counts {
        let mut c = Counts::default();
        for (out, slot) in c.0.iter_mut().zip(&self.0) {
            *out = slot.load(Ordering::Relaxed);
        }
        c
    }
}

/// What the database says at a scrape.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Gauges {
    pub(crate) jobs_waiting: u64,
    pub(crate) jobs_active: u64,
    pub(crate) jobs_finished: u64,
    pub(crate) peers_online: u64,
    pub(crate) peers_draining: u64,
    pub(crate) peers_gone: u64,
    /// Cores of the online peers.
    pub(crate) cores_online: u64,
    /// Processes of active jobs.
    pub(crate) processes: u64,
    /// Summed over online peers.
    pub(crate) rss_bytes: u64,
    pub(crate) held_bytes: u64,
    pub(crate) users: u64,
    pub(crate) programs: u64,
    /// Output bytes stored for all jobs.
    pub(crate) stored_output_bytes: u64,
    /// 1 while the database's disk takes writes, 0 while it does not.
    pub(crate) storage_ok: bool,
}

/// The scrape: `counters` and `gauges` in the text exposition format.
pub(crate) fn render(counters: &Counts, gauges: &Gauges, version: &str) -> String {
    let mut out = String::with_capacity(4096);
    let mut family = "";
    for c in Counter::ALL {
        let (name, label, help) = c.describe();
        if name != family {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            family = name;
        }
        let n = counters.0[c as usize];
        match label {
            Some((k, v)) => {
                let _ = writeln!(out, "{name}{{{k}=\"{v}\"}} {n}");
            }
            None => {
                let _ = writeln!(out, "{name} {n}");
            }
        }
    }
    let mut gauge = |name: &str, help: &str, rows: &[(Option<(&str, &str)>, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (label, v) in rows {
            match label {
                Some((k, l)) => {
                    let _ = writeln!(out, "{name}{{{k}=\"{l}\"}} {v}");
                }
                None => {
                    let _ = writeln!(out, "{name} {v}");
                }
            }
        }
    };
    let g = gauges;
    gauge(
        "bspweb_jobs",
        "Jobs stored, by state.",
        &[
            (Some(("state", "waiting")), g.jobs_waiting),
            (Some(("state", "active")), g.jobs_active),
            (Some(("state", "finished")), g.jobs_finished),
        ],
    );
    gauge(
        "bspweb_peers",
        "Peers known, by state (draining peers are online but moving their processes away).",
        &[
            (Some(("state", "online")), g.peers_online),
            (Some(("state", "draining")), g.peers_draining),
            (Some(("state", "gone")), g.peers_gone),
        ],
    );
    gauge(
        "bspweb_cores_online",
        "CPU cores of the online peers.",
        &[(None, g.cores_online)],
    );
    gauge(
        "bspweb_processes",
        "Processes of active jobs.",
        &[(None, g.processes)],
    );
    gauge(
        "bspweb_peer_memory_bytes",
        "Memory of the online peers, summed: resident, and held for fault tolerance.",
        &[
            (Some(("kind", "rss")), g.rss_bytes),
            (Some(("kind", "held")), g.held_bytes),
        ],
    );
    gauge("bspweb_users", "User accounts.", &[(None, g.users)]);
    gauge("bspweb_programs", "Programs stored.", &[(None, g.programs)]);
    gauge(
        "bspweb_stored_output_bytes",
        "Output bytes stored for all jobs.",
        &[(None, g.stored_output_bytes)],
    );
    gauge(
        "bspweb_storage_ok",
        "1 while the database's disk takes writes, 0 while it does not.",
        &[(None, u64::from(g.storage_ok))],
    );
    let _ = writeln!(
        out,
        "# HELP bspweb_build_info The supernode's version.\n# TYPE bspweb_build_info gauge\nbspweb_build_info{{version=\"{}\"}} 1",
        escape_label(version)
    );
    out
}

/// A label value with `\`, `"` and newlines escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_is_rendered_once_under_one_header_per_family() {
        let mut counts = Counts::default();
        counts.add(Counter::Supersteps, 7);
        counts.add(Counter::JobsKilled, 2);
        let text = render(&counts, &Gauges::default(), "1.2.3");
        assert!(
            text.contains("bspweb_process_supersteps_total 7\n"),
            "{text}"
        );
        assert!(text.contains("bspweb_jobs_ended_total{outcome=\"killed\"} 2\n"));
        assert!(text.contains("bspweb_build_info{version=\"1.2.3\"} 1\n"));
        for (name, _, _) in Counter::ALL.map(Counter::describe) {
            let header = format!("# TYPE {name} counter\n");
            assert_eq!(text.matches(&header).count(), 1, "{name}");
        }
        // Families are contiguous, so every label of one follows its header.
        let families: Vec<&str> = Counter::ALL.map(|c| c.describe().0).to_vec();
        let mut seen = Vec::new();
        for f in families {
            if seen.last() != Some(&f) {
                assert!(!seen.contains(&f), "{f} is split");
                seen.push(f);
            }
        }
    }

    #[test]
    fn counts_merge_and_saturate() {
        let mut a = Counts::default();
        a.add(Counter::OutputBytes, u64::MAX - 1);
        let mut b = Counts::default();
        b.add(Counter::OutputBytes, 5);
        a.merge(&b);
        assert_eq!(a.0[Counter::OutputBytes as usize], u64::MAX);
        let m = Metrics::default();
        m.add(&b);
        m.add(&b);
        assert_eq!(m.snapshot().0[Counter::OutputBytes as usize], 10);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}

#[cfg(test)]
mod dashboard {
    use super::*;

    /// Every metric the Grafana dashboard in `docs/` queries is one we export.
    #[test]
    fn the_dashboard_queries_only_exported_metrics() {
        let text = render(&Counts::default(), &Gauges::default(), "0");
        let exported: std::collections::BTreeSet<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../docs/grafana-dashboard.json")).unwrap();
        let mut queried = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                let names: Vec<&str> = expr
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("bspweb_"))
                    .collect();
                assert!(!names.is_empty(), "{expr}");
                for name in names {
                    assert!(exported.contains(name), "{name} in {expr}");
                    queried += 1;
                }
            }
        }
        assert!(queried >= 10);
    }
}
