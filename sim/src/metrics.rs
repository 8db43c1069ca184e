//! The dissertation's metrics, computed from a [`RunOutcome`] (§4.4).
//!
//! - **CPU time** of a process: the work it received — its running time
//!   weighted by the factor and availability of the peers it ran on and
//!   divided by the number of processes sharing them (§4.4.1); seconds at
//!   factor 1. **Utilization**: utilized ÷ available CPU time of all peers.
//! - **Process stretch factor**: the mean over finished processes of
//!   (finish − admission) ÷ length; **job stretch factor**: the same over
//!   finished jobs, a job finishing with its slowest process (§4.4.2). Time
//!   spent in the ready queue is not part of it (it is the *pending time*,
//!   Figs. 4.5/4.9); time waiting in a work-stealing queue is.
//! - **Migrations per hour**: all migrations of the measured processes ÷
//!   their total lifetime in hours (admission to finish, or to the end of the
//!   run), i.e. per process and hour, in default and bulk mode.
//!
//! Jobs released before the warm-up time are simulated but not measured.

use crate::engine::{BalancerSpec, RunOutcome};
use crate::jobs::LENGTHS_MIN;

/// Minimum, mean and maximum of a sample.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct MinAvgMax {
    /// Smallest value (0 for an empty sample).
    pub min: f64,
    /// Mean (0 for an empty sample).
    pub avg: f64,
    /// Largest value (0 for an empty sample).
    pub max: f64,
}

impl MinAvgMax {
    /// Of the values (0, 0, 0 when there are none).
    pub fn of(values: impl IntoIterator<Item = f64>) -> MinAvgMax {
        let (mut n, mut sum, mut min, mut max) = (0usize, 0.0, f64::INFINITY, f64::NEG_INFINITY);
        for v in values {
            n += 1;
            sum += v;
            min = min.min(v);
            max = max.max(v);
        }
        if n == 0 {
            return MinAvgMax::default();
        }
        MinAvgMax {
            min,
            avg: sum / n as f64,
            max,
        }
    }
}

/// Durations of one job length class (for Figs. 4.2–4.4 and 4.6–4.8).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LengthRow {
    /// The length in minutes.
    pub length_min: u32,
    /// Finished processes of this length.
    pub processes: usize,
    /// Mean actual duration of those processes, minutes.
    pub avg_process_min: f64,
    /// Longest actual duration, minutes.
    pub max_process_min: f64,
    /// Finished jobs of this length.
    pub jobs: usize,
    /// Mean actual duration of those jobs, minutes.
    pub avg_job_min: f64,
}

/// Everything the report shows about one run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunMetrics {
    /// The balancer.
    pub balancer: BalancerSpec,
    /// Jobs released during the run (measured or not).
    pub jobs_released: usize,
    /// Jobs released at or after the warm-up.
    pub jobs_measured: usize,
    /// Measured jobs that finished.
    pub jobs_finished: usize,
    /// Processes of measured jobs that finished.
    pub processes_finished: usize,
    /// Process stretch factor.
    pub process_stretch: f64,
    /// Job stretch factor.
    pub job_stretch: f64,
    /// Pending time (ready queue) of admitted measured jobs, seconds.
    pub pending: MinAvgMax,
    /// Default-mode migrations of measured processes.
    pub migrations: u64,
    /// Bulk-mode migrations of measured processes.
    pub bulk_migrations: u64,
    /// Lifetime of measured processes, hours.
    pub process_hours: f64,
    /// Default migrations per process and hour.
    pub migrations_per_hour: f64,
    /// Bulk migrations per process and hour.
    pub bulk_per_hour: f64,
    /// Default migrations per process.
    pub migrations_per_process: MinAvgMax,
    /// Bulk migrations per process.
    pub bulk_per_process: MinAvgMax,
    /// CPU time per process, seconds at factor 1.
    pub cpu_per_process: MinAvgMax,
    /// Utilized CPU time of all peers, seconds at factor 1.
    pub utilized: f64,
    /// Available CPU time of all peers, seconds at factor 1.
    pub available: f64,
    /// Available CPU time per peer (Table 4.4).
    pub available_per_peer: MinAvgMax,
    /// Durations by length class.
    pub by_length: Vec<LengthRow>,
    /// Pending time by release time: (hour of release, mean pending minutes)
    /// for each hour in which measured jobs were admitted.
    pub pending_curve: Vec<(f64, f64)>,
    /// Events the engine handled.
    pub events: u64,
}

impl RunMetrics {
    /// Utilized ÷ available CPU time (1 = 100 %).
    pub fn utilization(&self) -> f64 {
        if self.available > 0.0 {
            self.utilized / self.available
        } else {
            0.0
        }
    }
}

/// The metrics of `outcome`, measuring jobs released at or after `warmup`
/// seconds.
pub fn metrics(outcome: &RunOutcome, warmup: f64) -> RunMetrics {
    let measured = |job: u32| outcome.jobs[job as usize].job.release >= warmup;
    let procs: Vec<_> = outcome
        .processes
        .iter()
        .filter(|p| measured(p.job))
        .collect();
    let finished: Vec<_> = procs
        .iter()
        .filter_map(|p| p.finished.map(|f| (p, f - p.admitted)))
        .collect();
    let jobs: Vec<_> = outcome
        .jobs
        .iter()
        .filter(|j| j.job.release >= warmup)
        .collect();
    let jobs_done: Vec<_> = jobs
        .iter()
        .filter_map(|j| Some((j, j.finished? - j.admitted?)))
        .collect();
    let mean = |v: &mut dyn Iterator<Item = f64>| {
        let (n, s) = v.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
        if n == 0 { f64::NAN } else { s / n as f64 }
    };
    let process_stretch = mean(&mut finished.iter().map(|(p, d)| d / p.length));
    let job_stretch = mean(&mut jobs_done.iter().map(|(j, d)| d / j.job.length));
    let pending = MinAvgMax::of(
        jobs.iter()
            .filter_map(|j| Some(j.admitted? - j.job.release)),
    );

    let migrations: u64 = procs.iter().map(|p| u64::from(p.migrations)).sum();
    let bulk_migrations: u64 = procs.iter().map(|p| u64::from(p.bulk_migrations)).sum();
    let process_hours: f64 = procs
        .iter()
        .map(|p| (p.finished.unwrap_or(outcome.end) - p.admitted).max(0.0))
        .sum::<f64>()
        / 3600.0;
    let per_hour = |n: u64| {
        if process_hours > 0.0 {
            n as f64 / process_hours
        } else {
            0.0
        }
    };

    let by_length = LENGTHS_MIN
        .iter()
        .filter_map(|&m| {
            let len = f64::from(m) * 60.0;
            let ds: Vec<f64> = finished
                .iter()
                .filter(|(p, _)| p.length == len)
                .map(|(_, d)| d / 60.0)
                .collect();
            let js: Vec<f64> = jobs_done
                .iter()
                .filter(|(j, _)| j.job.length == len)
                .map(|(_, d)| d / 60.0)
                .collect();
            if ds.is_empty() && js.is_empty() {
                return None;
            }
            let p = MinAvgMax::of(ds.iter().copied());
            Some(LengthRow {
                length_min: m,
                processes: ds.len(),
                avg_process_min: p.avg,
                max_process_min: p.max,
                jobs: js.len(),
                avg_job_min: MinAvgMax::of(js.iter().copied()).avg,
            })
        })
        .collect();

    let mut bins: std::collections::BTreeMap<u64, (usize, f64)> = std::collections::BTreeMap::new();
    for j in &jobs {
        if let Some(a) = j.admitted {
            let e = bins.entry((j.job.release / 3600.0) as u64).or_default();
            e.0 += 1;
            e.1 += (a - j.job.release) / 60.0;
        }
    }
    let pending_curve = bins
        .into_iter()
        .map(|(h, (n, s))| (h as f64, s / n as f64))
        .collect();

    RunMetrics {
        balancer: outcome.balancer,
        jobs_released: outcome
            .jobs
            .iter()
            .filter(|j| j.job.release <= outcome.end)
            .count(),
        jobs_measured: jobs.len(),
        jobs_finished: jobs_done.len(),
        processes_finished: finished.len(),
        process_stretch,
        job_stretch,
        pending,
        migrations,
        bulk_migrations,
        process_hours,
        migrations_per_hour: per_hour(migrations),
        bulk_per_hour: per_hour(bulk_migrations),
        migrations_per_process: MinAvgMax::of(procs.iter().map(|p| f64::from(p.migrations))),
        bulk_per_process: MinAvgMax::of(procs.iter().map(|p| f64::from(p.bulk_migrations))),
        cpu_per_process: MinAvgMax::of(procs.iter().map(|p| p.work)),
        utilized: outcome.peers.iter().map(|p| p.utilized).sum(),
        available: outcome.peers.iter().map(|p| p.available).sum(),
        available_per_peer: MinAvgMax::of(outcome.peers.iter().map(|p| p.available)),
        by_length,
        pending_curve,
        events: outcome.events,
    }
}
