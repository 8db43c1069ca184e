//! Run time of the type-B experiment (100 % availability, §4.4).
//!
//! Run with `cargo bench -p sim --bench type_b`. Times, single-threaded,
//! one type-B experiment per job profile and overload factor (every
//! balancer, 100 peers, 14 days, the default seed), then the whole type-B
//! set as `bspweb sim --experiment b` runs it, each next to the 10 s goal.
//! Only this bench reads the clock; the crate itself is pure.

use std::time::Instant;

use sim::experiment::run_experiment;
use sim::{ExperimentKind, ExperimentSpec, JobProfile};

const GOAL_SECS: f64 = 10.0;

fn time(spec: &ExperimentSpec) -> (f64, usize) {
    let start = Instant::now();
    let results = run_experiment(spec, 1, &mut |_| {}).expect("the default spec is valid");
    (start.elapsed().as_secs_f64(), results.len())
}

fn main() {
    println!("type B, one thread; goal: one experiment under {GOAL_SECS} s");
    println!(
        "{:>14}{:>10}{:>7}{:>10}{:>12}",
        "profile", "overload", "runs", "secs", "÷ goal"
    );
    let mut total = 0.0;
    for profile in JobProfile::ALL {
        for overload in [1.0, 4.0] {
            let mut spec = ExperimentSpec::defaults(ExperimentKind::B);
            spec.job_profiles = vec![profile];
            spec.overloads = vec![overload];
            let (secs, runs) = time(&spec);
            total += secs;
            println!(
                "{:>14}{:>10}{:>7}{:>10.2}{:>12.2}",
                profile.to_string(),
                overload,
                runs,
                secs,
                secs / GOAL_SECS
            );
        }
    }
    let spec = ExperimentSpec::defaults(ExperimentKind::B);
    let (secs, runs) = time(&spec);
    println!(
        "{:>14}{:>10}{:>7}{:>10.2}{:>12.2}   (sum of the rows: {total:.2} s)",
        "all",
        "1,4",
        runs,
        secs,
        secs / GOAL_SECS
    );
}
