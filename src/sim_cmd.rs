//! `bspweb sim`: runs the load-balancing experiments of dissertation
//! chapter 4 with the pure `sim` crate and writes the report (the IO half).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use sim::availability::Profile;
use sim::experiment::{
    AvailabilitySource, ExperimentKind, ExperimentSpec, ImportedTraces, Progress, run_experiment,
};
use sim::report::render;
use sim::{BalancerSpec, JobProfile};

#[derive(Args)]
pub struct SimArgs {
    /// Experiment type: a (fixed processes, availability profiles, hash
    /// balancers), b (job streams at 100 % availability), c (job streams
    /// under availability profiles) or clusters (flat against two-level
    /// placement of communicating jobs on a clustered network)
    #[arg(long, default_value = "b")]
    experiment: String,
    /// Networks of the clusters experiment, comma-separated: testbed,
    /// hetero [default: both]
    #[arg(long, value_delimiter = ',')]
    topology: Vec<String>,
    /// Offered compute loads of the clusters experiment (fraction of all
    /// cores), comma-separated [default: 0.3,0.7]
    #[arg(long, value_delimiter = ',')]
    load: Vec<f64>,
    /// Jobs per run of the clusters experiment
    #[arg(long, default_value_t = 400)]
    jobs: usize,
    /// Job-stream profiles, comma-separated: hpc2n, atlas, thunder, blue,
    /// datastar [default: all]
    #[arg(long, value_delimiter = ',')]
    profile: Vec<String>,
    /// Availability profiles, comma-separated: office, pool, notebook, full
    /// [default: office,pool,notebook for a and c; full for b]
    #[arg(long, value_delimiter = ',')]
    availability: Vec<String>,
    /// Overload factors, comma-separated (types b, c) [default: 1,4]
    #[arg(long, value_delimiter = ',')]
    overload: Vec<f64>,
    /// Balancers, comma-separated: rr, rd, dr, dd, multi, rendezvous,
    /// ws-head, ws-tail [default: all; the hash-based ones for a]
    #[arg(long, value_delimiter = ',')]
    balancer: Vec<String>,
    /// Processes per peer, comma-separated (type a) [default: 1,2,4]
    #[arg(long, value_delimiter = ',')]
    multiplicity: Vec<u32>,
    /// Seed of everything random (CPU factors, jobs, availability, stealing)
    #[arg(long, default_value_t = sim::experiment::DEFAULT_SEED)]
    seed: u64,
    /// Number of peers (job counts scale with peers / 100) [default: 100,
    /// or every host of --trace]
    #[arg(long)]
    peers: Option<usize>,
    /// Availability traces to import (CSV `timestamp,host,idle` or
    /// `timestamp,host,idle_percent`, times in seconds from Monday 00:00);
    /// adds them to the availability sources, one host per peer
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Simulated days (releases are uniform over them)
    #[arg(long, default_value_t = 14.0)]
    days: f64,
    /// Jobs released in the first seconds are simulated but not measured
    /// [default: 3600 for b and c, 0 for a]
    #[arg(long)]
    warmup_secs: Option<f64>,
    /// Relative power change a hash balancer is not told about (0 = every change)
    #[arg(long, default_value_t = 0.0)]
    hysteresis: f64,
    /// Migrations of a process within this many seconds count as one bulk migration
    #[arg(long, default_value_t = 30.0)]
    bulk_window_secs: f64,
    /// Run until every job is done instead of stopping after --days
    #[arg(long)]
    drain: bool,
    /// Id of the first peer; the ids select the instance of the random
    /// ring and per-peer hashes of the Rnd./Multi/rendezvous balancers
    #[arg(long, default_value_t = 0)]
    peer_id_base: i64,
    /// Runs at the same time (threads)
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Folder for the report (README.md, results.csv, SVG figures)
    #[arg(long, default_value = "sim-report")]
    out: PathBuf,
}

fn parse_all<T: std::str::FromStr>(names: &[String]) -> anyhow::Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    names
        .iter()
        .map(|n| n.trim().parse::<T>().map_err(|e| anyhow::anyhow!("{e}")))
        .collect()
}

fn spec_from(a: &SimArgs) -> anyhow::Result<ExperimentSpec> {
    let kind: ExperimentKind = a.experiment.parse()?;
    let mut spec = ExperimentSpec::defaults(kind);
    if !a.profile.is_empty() {
        spec.job_profiles = parse_all::<JobProfile>(&a.profile)?;
    }
    if !a.availability.is_empty() || a.trace.is_some() {
        spec.availability = a
            .availability
            .iter()
            .map(|n| {
                n.trim().parse::<Profile>().map(AvailabilitySource::Profile).map_err(|_| {
                    anyhow::anyhow!("unknown availability profile {n:?}; valid names are: full, office, pool, notebook")
                })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    if !a.overload.is_empty() {
        spec.overloads = a.overload.clone();
    }
    if !a.balancer.is_empty() {
        spec.balancers = parse_all::<BalancerSpec>(&a.balancer)?;
    }
    if !a.multiplicity.is_empty() {
        spec.multiplicities = a.multiplicity.clone();
    }
    spec.seed = a.seed;
    if let Some(path) = &a.trace {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the trace file {}", path.display()))?;
        let hosts = sim::availability::from_csv(&text)
            .with_context(|| format!("{} is not a valid trace", path.display()))?;
        spec.peers = hosts.len();
        spec.imported = Some(ImportedTraces {
            name: path.display().to_string(),
            hosts: hosts.into_iter().map(|(_, h)| h).collect(),
        });
        spec.availability.push(AvailabilitySource::Imported);
    }
    if let Some(peers) = a.peers {
        spec.peers = peers;
    }
    spec.days = a.days;
    if let Some(w) = a.warmup_secs {
        spec.warmup_secs = w;
    }
    spec.hysteresis = a.hysteresis;
    spec.bulk_window_secs = a.bulk_window_secs;
    spec.drain = a.drain;
    spec.peer_id_base = a.peer_id_base;
    spec.validate()?;
    Ok(spec)
}

/// `--experiment clusters`: flat against two-level placement (issue 15).
fn run_clusters(a: &SimArgs) -> anyhow::Result<ExitCode> {
    use sim::clusters::{ClusterSpec, render_clusters, run_clusters};
    let mut spec = ClusterSpec::defaults(a.seed);
    if !a.topology.is_empty() {
        spec.topologies = parse_all(&a.topology)?;
    }
    if !a.load.is_empty() {
        spec.loads = a.load.clone();
    }
    if !a.overload.is_empty() {
        spec.overloads = a.overload.clone();
    }
    spec.jobs = a.jobs;
    let started = Instant::now();
    let runs = run_clusters(&spec)?;
    let files = render_clusters(
        &spec,
        &runs,
        &spec.command_line(&a.out.display().to_string()),
    );
    write_report(&a.out, &files, runs.len(), started)
}

/// Writes a report's files into `out` and says where it is.
fn write_report(
    out: &std::path::Path,
    files: &[sim::report::ReportFile],
    runs: usize,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("cannot create the report folder {}", out.display()))?;
    for f in files {
        let path = out.join(&f.path);
        std::fs::write(&path, &f.contents)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    eprintln!(
        "{runs} runs in {:.1?}; report: {}",
        started.elapsed(),
        out.join("README.md").display()
    );
    Ok(ExitCode::SUCCESS)
}

pub fn run(a: SimArgs) -> anyhow::Result<ExitCode> {
    if a.experiment.eq_ignore_ascii_case("clusters") {
        return run_clusters(&a);
    }
    let spec = spec_from(&a)?;
    if a.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let started = Instant::now();
    let results = run_experiment(&spec, a.threads, &mut |p: Progress<'_>| {
        let (r, m) = (p.result, &p.result.metrics);
        let overload = if r.overload.is_finite() {
            format!(" overload {}", r.overload)
        } else {
            String::new()
        };
        let what = if spec.kind == ExperimentKind::A {
            let c = m.cpu_per_process;
            format!(
                "util {:.1} %, CPU time max/min {:.1}, {:.3} migs/h ({:.3} bulk)",
                100.0 * m.utilization(),
                c.max / c.min,
                m.migrations_per_hour,
                m.bulk_per_hour
            )
        } else {
            format!(
                "stretch procs {:.3} jobs {:.3}, {:.3} migs/h, {}/{} jobs finished",
                m.process_stretch,
                m.job_stretch,
                m.migrations_per_hour,
                m.jobs_finished,
                m.jobs_measured
            )
        };
        eprintln!(
            "[{}/{}] {:.0?} type {} {}{overload} {}: {what}",
            p.done,
            p.total,
            started.elapsed(),
            spec.kind,
            r.group.slug(),
            m.balancer.label(),
        );
    })?;
    let files = render(
        &spec,
        &results,
        &spec.command_line(&a.out.display().to_string()),
    );
    write_report(&a.out, &files, results.len(), started)
}
