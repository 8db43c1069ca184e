//! Runs an experiment and writes its report like `bspweb sim`, without
//! building the whole `bspweb` binary (which links wasmtime):
//!
//! ```text
//! cargo run --release -p sim --example run -- <a|b|c> [profiles|-] [availability|-] \
//!     [overloads|-] [balancers|-] [out-dir] [hysteresis] [threads] [seed] [peer-id-base]
//! ```
//!
//! `-` keeps the experiment's default. The report's command line is the
//! equivalent `bspweb sim` invocation (same spec ⇒ same report).
//!
//! Flat against two-level placement (`bspweb sim --experiment clusters`):
//!
//! ```text
//! cargo run --release -p sim --example run -- clusters [topologies|-] [loads|-] \
//!     [overloads|-] [jobs|-] [out-dir] [seed]
//! ```

use std::time::Instant;

use sim::availability::Profile;
use sim::experiment::{
    AvailabilitySource, ExperimentKind, ExperimentSpec, Progress, run_experiment,
};
use sim::report::render;
use sim::{BalancerSpec, JobProfile};

fn list<T: std::str::FromStr>(arg: Option<&String>) -> Result<Option<Vec<T>>, String>
where
    T::Err: std::fmt::Display,
{
    match arg.map(String::as_str) {
        None | Some("-") => Ok(None),
        Some(s) => s
            .split(',')
            .map(|x| x.parse::<T>().map_err(|e| format!("{x}: {e}")))
            .collect::<Result<_, _>>()
            .map(Some),
    }
}

fn clusters(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    use sim::clusters::{ClusterSpec, render_clusters, run_clusters};
    let seed = args
        .get(6)
        .map_or(Ok(sim::experiment::DEFAULT_SEED), |s| s.parse())?;
    let mut spec = ClusterSpec::defaults(seed);
    if let Some(v) = list(args.get(1))? {
        spec.topologies = v;
    }
    if let Some(v) = list(args.get(2))? {
        spec.loads = v;
    }
    if let Some(v) = list(args.get(3))? {
        spec.overloads = v;
    }
    if let Some(n) = args.get(4).filter(|a| *a != "-") {
        spec.jobs = n.parse()?;
    }
    let out = args.get(5).cloned().unwrap_or_else(|| "sim-report".into());
    let started = Instant::now();
    let runs = run_clusters(&spec)?;
    for r in &runs {
        eprintln!(
            "{} load {} o{} {:<10} stretch {:.3} fit {:.3} span {:.3} clusters/job {:.2} gateway {:.1} %",
            r.topology,
            r.load,
            r.overload,
            r.placer.label(),
            r.stretch(),
            r.stretch_by_fit(true),
            r.stretch_by_fit(false),
            r.clusters_per_job(),
            100.0 * r.gateway_share()
        );
    }
    std::fs::create_dir_all(&out)?;
    for f in render_clusters(&spec, &runs, &spec.command_line(&out)) {
        std::fs::write(std::path::Path::new(&out).join(&f.path), &f.contents)?;
    }
    eprintln!("{:.1?}: report in {out}/README.md", started.elapsed());
    Ok(())
}

/// The usage, from the module docs.
const USAGE: &str = "usage: run <a|b|c> [profiles|-] [availability|-] [overloads|-] [balancers|-] \
[out-dir] [hysteresis] [threads] [seed] [peer-id-base]
       run clusters [topologies|-] [loads|-] [overloads|-] [jobs|-] [out-dir] [seed]
(`-` keeps the experiment's default; `bspweb sim --help` explains each)";

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return std::process::ExitCode::SUCCESS;
    }
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    if args.first().map(String::as_str) == Some("clusters") {
        return clusters(args);
    }
    let kind: ExperimentKind = args.first().map_or("b", String::as_str).parse()?;
    let mut spec = ExperimentSpec::defaults(kind);
    if let Some(v) = list::<JobProfile>(args.get(1))? {
        spec.job_profiles = v;
    }
    if let Some(v) = list::<Profile>(args.get(2))? {
        spec.availability = v.into_iter().map(AvailabilitySource::Profile).collect();
    }
    if let Some(v) = list::<f64>(args.get(3))? {
        if kind == ExperimentKind::A {
            spec.multiplicities = v.iter().map(|x| *x as u32).collect();
        } else {
            spec.overloads = v;
        }
    }
    if let Some(v) = list::<BalancerSpec>(args.get(4))? {
        spec.balancers = v;
    }
    let out = args.get(5).cloned().unwrap_or_else(|| "sim-report".into());
    if let Some(h) = args.get(6) {
        spec.hysteresis = h.parse()?;
    }
    let threads: usize = args.get(7).map_or(Ok(1), |t| t.parse())?;
    if let Some(seed) = args.get(8) {
        spec.seed = seed.parse()?;
    }
    if let Some(base) = args.get(9) {
        spec.peer_id_base = base.parse()?;
    }
    let started = Instant::now();
    let results = run_experiment(&spec, threads, &mut |p: Progress<'_>| {
        let m = &p.result.metrics;
        eprintln!(
            "[{}/{}] {:.1?} {} o{} {:<13} procs {:.3} jobs {:.3} | util {:.1}% | migs/h {:.3} bulk {:.3} | fin {}/{}",
            p.done,
            p.total,
            started.elapsed(),
            p.result.group.slug(),
            p.result.overload,
            m.balancer.label(),
            m.process_stretch,
            m.job_stretch,
            100.0 * m.utilization(),
            m.migrations_per_hour,
            m.bulk_per_hour,
            m.jobs_finished,
            m.jobs_measured
        );
    })?;
    std::fs::create_dir_all(&out)?;
    for f in render(&spec, &results, &spec.command_line(&out)) {
        std::fs::write(std::path::Path::new(&out).join(&f.path), f.contents)?;
    }
    eprintln!(
        "{} runs in {:.1?}; report: {out}/README.md",
        results.len(),
        started.elapsed()
    );
    Ok(())
}
