//! The experiments of §4.4: what to run, with which inputs.
//!
//! - **Type A** (§4.4.1): `x`, `2x`, `4x` never-ending processes (`x` =
//!   peers) released at time 0, availability from a profile group, no ready
//!   queue; hash-based balancers only.
//! - **Type B** (§4.4.2): 100 % availability, the job streams of Table 4.3,
//!   overload factors 1 and 4; all balancers.
//! - **Type C** (§4.4.3): the job streams of type B under the availability
//!   profiles of type A.
//!
//! An experiment is a list of [`Group`]s (same peers, availability and jobs)
//! and, inside each group, one run per overload factor and balancer. All
//! balancers of a group see exactly the same inputs, and everything follows
//! from the seed and the parameters.

use std::fmt;
use std::str::FromStr;

use crate::availability::{self, Availability, Profile};
use crate::engine::{BalancerSpec, RunConfig, simulate};
use crate::error::SimError;
use crate::hardware;
use crate::jobs::{Job, JobProfile, job_stream};
use crate::metrics::metrics;
use crate::report::RunResult;
use crate::rng::{derive_seed, tag};

/// The experiment types of §4.4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExperimentKind {
    /// Fixed process counts under changing availability (§4.4.1).
    A,
    /// Job streams at 100 % availability (§4.4.2).
    B,
    /// Job streams under changing availability (§4.4.3).
    C,
}

impl ExperimentKind {
    /// `"A"`, `"B"` or `"C"`.
    pub fn letter(self) -> &'static str {
        match self {
            ExperimentKind::A => "A",
            ExperimentKind::B => "B",
            ExperimentKind::C => "C",
        }
    }
}

impl fmt::Display for ExperimentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.letter())
    }
}

impl FromStr for ExperimentKind {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        match s.to_ascii_lowercase().as_str() {
            "a" => Ok(ExperimentKind::A),
            "b" => Ok(ExperimentKind::B),
            "c" => Ok(ExperimentKind::C),
            _ => Err(SimError::UnknownName {
                what: "experiment type",
                given: s.to_string(),
                valid: "a, b, c, clusters".to_string(),
            }),
        }
    }
}

/// Parameters of an experiment; printed in its report.
#[derive(Clone, Debug, PartialEq)]
pub struct ExperimentSpec {
    /// Type A, B or C.
    pub kind: ExperimentKind,
    /// Job-stream profiles (types B and C).
    pub job_profiles: Vec<JobProfile>,
    /// Availability sources (types A and C; type B uses [`Profile::Full`]).
    pub availability: Vec<AvailabilitySource>,
    /// Processes per peer (type A).
    pub multiplicities: Vec<u32>,
    /// Overload factors (types B and C).
    pub overloads: Vec<f64>,
    /// The balancers to compare.
    pub balancers: Vec<BalancerSpec>,
    /// The one seed everything is drawn from.
    pub seed: u64,
    /// Number of peers (the job counts of Table 4.3 scale with peers / 100).
    pub peers: usize,
    /// Simulated duration and release window, days.
    pub days: f64,
    /// Jobs released earlier than this are simulated but not measured.
    pub warmup_secs: f64,
    /// Relative power change the balancer ignores (0 = none).
    pub hysteresis: f64,
    /// Bulk migration window, seconds.
    pub bulk_window_secs: f64,
    /// Run until every job is done instead of stopping after `days`.
    pub drain: bool,
    /// Id of the first peer (ids are consecutive); selects the instance of
    /// the random ring and per-peer hashes (see [`RunConfig::peer_id_base`]).
    pub peer_id_base: i64,
    /// Imported traces, used by [`AvailabilitySource::Imported`] groups.
    pub imported: Option<ImportedTraces>,
}

/// Where the peers' availability comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AvailabilitySource {
    /// A synthetic profile group (or [`Profile::Full`]).
    Profile(Profile),
    /// The traces in [`ExperimentSpec::imported`], one host per peer.
    Imported,
}

impl AvailabilitySource {
    /// File-name part: the profile's slug or `trace`.
    pub fn slug(self) -> &'static str {
        match self {
            AvailabilitySource::Profile(p) => p.slug(),
            AvailabilitySource::Imported => "trace",
        }
    }

    /// Whether every peer is always 100 % available.
    pub fn is_full(self) -> bool {
        self == AvailabilitySource::Profile(Profile::Full)
    }
}

/// Availability traces read from a file (e.g. with
/// [`availability::from_csv`]): the first `peers` hosts are the peers.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportedTraces {
    /// Where they came from, for the report.
    pub name: String,
    /// One trace per host, in the order they are assigned to peers.
    pub hosts: Vec<Availability>,
}

/// Default seed of every experiment.
pub const DEFAULT_SEED: u64 = 20_090_101;

impl ExperimentSpec {
    /// The dissertation's setup for `kind`: 100 peers, two weeks, seed
    /// [`DEFAULT_SEED`], one-hour warm-up, 30 s bulk window, no hysteresis,
    /// and every profile, overload factor and balancer the type uses.
    pub fn defaults(kind: ExperimentKind) -> ExperimentSpec {
        let groups: Vec<AvailabilitySource> = [Profile::Office, Profile::Pool, Profile::Notebook]
            .map(AvailabilitySource::Profile)
            .to_vec();
        let (job_profiles, availability, multiplicities, overloads, balancers) = match kind {
            ExperimentKind::A => (
                vec![],
                groups,
                vec![1, 2, 4],
                vec![],
                BalancerSpec::hash_only(),
            ),
            ExperimentKind::B => (
                JobProfile::ALL.to_vec(),
                vec![AvailabilitySource::Profile(Profile::Full)],
                vec![],
                vec![1.0, 4.0],
                BalancerSpec::all(),
            ),
            ExperimentKind::C => (
                JobProfile::ALL.to_vec(),
                groups,
                vec![],
                vec![1.0, 4.0],
                BalancerSpec::all(),
            ),
        };
        ExperimentSpec {
            kind,
            job_profiles,
            availability,
            multiplicities,
            overloads,
            balancers,
            seed: DEFAULT_SEED,
            peers: 100,
            days: 14.0,
            warmup_secs: if kind == ExperimentKind::A {
                0.0
            } else {
                3600.0
            },
            hysteresis: 0.0,
            bulk_window_secs: 30.0,
            drain: false,
            peer_id_base: 0,
            imported: None,
        }
    }

    /// Checks the parameters; the error says which one is wrong.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |name, value: String, expected| {
            Err(SimError::InvalidParameter {
                name,
                value,
                expected,
            })
        };
        if self.peers == 0 {
            return bad("peers", "0".into(), "at least 1");
        }
        if !(self.days > 0.0 && self.days.is_finite()) {
            return bad("days", self.days.to_string(), "a positive number of days");
        }
        if self.balancers.is_empty() {
            return bad("balancers", "none".into(), "at least one balancer");
        }
        match self.kind {
            ExperimentKind::A => {
                if self.multiplicities.is_empty() || self.multiplicities.contains(&0) {
                    return bad(
                        "multiplicities",
                        format!("{:?}", self.multiplicities),
                        "e.g. 1,2,4",
                    );
                }
                if let Some(b) = self.balancers.iter().find(|b| b.is_stealing()) {
                    return bad(
                        "balancer",
                        b.slug().into(),
                        "type A runs never-ending processes, which work stealing cannot share (§4.4.1); use a hash-based balancer",
                    );
                }
                if self.drain {
                    return bad(
                        "drain",
                        "true".into(),
                        "type A processes never end; drain only for types B and C",
                    );
                }
            }
            ExperimentKind::B | ExperimentKind::C => {
                if self.job_profiles.is_empty() {
                    return bad("job profiles", "none".into(), "at least one job profile");
                }
                if let Some(o) = self.overloads.iter().find(|o| o.is_nan() || **o <= 0.0) {
                    return bad("overload", o.to_string(), "overload factors must be > 0");
                }
                if self.overloads.is_empty() {
                    return bad("overload", "none".into(), "e.g. 1 or 4");
                }
            }
        }
        if self.peer_id_base.checked_add(self.peers as i64).is_none() || self.peer_id_base < 0 {
            return bad(
                "peer id base",
                self.peer_id_base.to_string(),
                "≥ 0 and small enough that base + peers fits in i64",
            );
        }
        if self.availability.contains(&AvailabilitySource::Imported) {
            match &self.imported {
                None => {
                    return bad(
                        "availability",
                        "trace".into(),
                        "import traces (--trace FILE) to use them",
                    );
                }
                Some(t) if t.hosts.len() < self.peers => {
                    return bad(
                        "peers",
                        self.peers.to_string(),
                        "at most as many peers as the imported trace has hosts (--peers N)",
                    );
                }
                Some(_) => {}
            }
        }
        if self.availability.is_empty() {
            return bad(
                "availability",
                "none".into(),
                "at least one availability profile",
            );
        }
        if !(self.hysteresis >= 0.0 && self.hysteresis.is_finite()) {
            return bad(
                "hysteresis",
                self.hysteresis.to_string(),
                "a fraction ≥ 0, e.g. 0.1",
            );
        }
        if !(self.bulk_window_secs >= 0.0 && self.bulk_window_secs.is_finite()) {
            return bad(
                "bulk window",
                self.bulk_window_secs.to_string(),
                "seconds ≥ 0",
            );
        }
        if !(self.warmup_secs >= 0.0 && self.warmup_secs < self.days * 86_400.0) {
            return bad(
                "warm-up",
                self.warmup_secs.to_string(),
                "seconds ≥ 0 and shorter than the run",
            );
        }
        Ok(())
    }

    /// The groups of runs, in report order.
    pub fn groups(&self) -> Vec<Group> {
        let mut out = Vec::new();
        for &availability in &self.availability {
            match self.kind {
                ExperimentKind::A => {
                    for &m in &self.multiplicities {
                        out.push(Group {
                            availability,
                            job_profile: None,
                            multiplicity: Some(m),
                        });
                    }
                }
                ExperimentKind::B | ExperimentKind::C => {
                    for &p in &self.job_profiles {
                        out.push(Group {
                            availability,
                            job_profile: Some(p),
                            multiplicity: None,
                        });
                    }
                }
            }
        }
        out
    }

    /// The runs of a group: (overload, balancer) in report order.
    pub fn runs(&self) -> Vec<(f64, BalancerSpec)> {
        let overloads = if self.kind == ExperimentKind::A {
            vec![f64::INFINITY]
        } else {
            self.overloads.clone()
        };
        overloads
            .into_iter()
            .flat_map(|o| self.balancers.iter().map(move |&b| (o, b)))
            .collect()
    }

    /// The `bspweb sim` command line that reproduces this experiment, every
    /// parameter explicit, writing to `out`.
    pub fn command_line(&self, out: &str) -> String {
        let join = |v: Vec<String>| v.join(",");
        let mut c = format!(
            "bspweb sim --experiment {} --seed {} --peers {} --days {} --warmup-secs {} --hysteresis {} --bulk-window-secs {}",
            self.kind.letter().to_lowercase(),
            self.seed,
            self.peers,
            self.days,
            self.warmup_secs,
            self.hysteresis,
            self.bulk_window_secs
        );
        match self.kind {
            ExperimentKind::A => {
                c += &format!(
                    " --multiplicity {}",
                    join(self.multiplicities.iter().map(u32::to_string).collect())
                );
            }
            ExperimentKind::B | ExperimentKind::C => {
                c += &format!(
                    " --profile {} --overload {}",
                    join(
                        self.job_profiles
                            .iter()
                            .map(|p| p.slug().to_string())
                            .collect()
                    ),
                    join(self.overloads.iter().map(f64::to_string).collect())
                );
            }
        }
        let profiles: Vec<String> = self
            .availability
            .iter()
            .filter(|a| **a != AvailabilitySource::Imported)
            .map(|p| p.slug().to_string())
            .collect();
        if !profiles.is_empty() {
            c += &format!(" --availability {}", join(profiles));
        }
        if let (true, Some(t)) = (
            self.availability.contains(&AvailabilitySource::Imported),
            &self.imported,
        ) {
            c += &format!(" --trace {}", t.name);
        }
        c += &format!(
            " --balancer {}",
            join(
                self.balancers
                    .iter()
                    .map(|b| b.slug().to_string())
                    .collect()
            )
        );
        if self.drain {
            c += " --drain";
        }
        if self.peer_id_base != 0 {
            c += &format!(" --peer-id-base {}", self.peer_id_base);
        }
        c + &format!(" --out {out}")
    }

    /// Duration in seconds.
    pub fn duration_secs(&self) -> f64 {
        self.days * 86_400.0
    }

    /// The inputs of a group: CPU factors, availability traces and jobs.
    pub fn inputs(&self, group: &Group) -> Inputs {
        let factors = hardware::draw_factors(self.peers, self.seed);
        let availability = match group.availability {
            AvailabilitySource::Imported => self
                .imported
                .as_ref()
                .map(|t| t.hosts.iter().take(self.peers).cloned().collect())
                .unwrap_or_default(),
            AvailabilitySource::Profile(Profile::Full) => Vec::new(),
            AvailabilitySource::Profile(p) => availability::generate(
                p,
                self.peers,
                self.duration_secs().ceil() as u64,
                derive_seed(self.seed, tag::AVAILABILITY),
            ),
        };
        let jobs = match (group.job_profile, group.multiplicity) {
            (Some(p), _) => job_stream(p, self.peers, self.duration_secs(), self.seed),
            (None, m) => vec![Job {
                id: 0,
                release: 0.0,
                parallelism: (self.peers as u32).saturating_mul(m.unwrap_or(1)),
                length: f64::INFINITY,
            }],
        };
        Inputs {
            factors,
            availability,
            jobs,
        }
    }

    /// The configuration of one run on `inputs`.
    pub fn config<'a>(
        &self,
        inputs: &'a Inputs,
        overload: f64,
        balancer: BalancerSpec,
    ) -> RunConfig<'a> {
        RunConfig {
            balancer,
            factors: &inputs.factors,
            availability: &inputs.availability,
            jobs: &inputs.jobs,
            overload,
            horizon: if self.drain {
                f64::INFINITY
            } else {
                self.duration_secs()
            },
            hysteresis: self.hysteresis,
            bulk_window: self.bulk_window_secs,
            seed: derive_seed(self.seed, tag::STEALING),
            peer_id_base: self.peer_id_base,
        }
    }
}

/// Runs that share peers, availability and jobs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Group {
    /// Availability ([`Profile::Full`] for type B).
    pub availability: AvailabilitySource,
    /// Job-stream profile (types B, C).
    pub job_profile: Option<JobProfile>,
    /// Processes per peer (type A).
    pub multiplicity: Option<u32>,
}

impl Group {
    /// A short name for files and progress lines, e.g. `full-hpc2n`,
    /// `office-x2`.
    pub fn slug(&self) -> String {
        match (self.job_profile, self.multiplicity) {
            (Some(p), _) => format!("{}-{}", self.availability.slug(), p.slug()),
            (None, m) => format!("{}-x{}", self.availability.slug(), m.unwrap_or(1)),
        }
    }
}

/// The inputs of a group.
#[derive(Clone, Debug, PartialEq)]
pub struct Inputs {
    /// CPU factor per peer.
    pub factors: Vec<f64>,
    /// Availability per peer; empty = 100 %.
    pub availability: Vec<Availability>,
    /// The jobs.
    pub jobs: Vec<Job>,
}

/// Progress of [`run_experiment`], reported after each run.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// Runs finished so far, this one included.
    pub done: usize,
    /// Runs in the experiment.
    pub total: usize,
    /// The run that just finished.
    pub result: &'a RunResult,
}

/// Runs every run of `spec`, `threads` at a time (runs of one group share
/// its inputs), calling `progress` after each; returns the results in
/// report order — the same whatever `threads` is.
///
/// # Errors
///
/// The spec's validation error, or the first run's error.
pub fn run_experiment(
    spec: &ExperimentSpec,
    threads: usize,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Vec<RunResult>, SimError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    spec.validate()?;
    let threads = threads.max(1);
    let groups = spec.groups();
    let runs = spec.runs();
    let total = groups.len() * runs.len();
    let mut results = Vec::with_capacity(total);
    let mut done = 0;
    for group in groups {
        let inputs = spec.inputs(&group);
        let mut slots: Vec<Option<RunResult>> = vec![None; runs.len()];
        let next = AtomicUsize::new(0);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut failure = None;
        std::thread::scope(|s| {
            for _ in 0..threads.min(runs.len()) {
                let tx = tx.clone();
                let (inputs, runs, next) = (&inputs, &runs, &next);
                s.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(overload, balancer)) = runs.get(i) else {
                            break;
                        };
                        let r = simulate(&spec.config(inputs, overload, balancer)).map(|out| {
                            RunResult {
                                group,
                                overload,
                                metrics: metrics(&out, spec.warmup_secs),
                            }
                        });
                        let failed = r.is_err();
                        if tx.send((i, r)).is_err() || failed {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            for (i, r) in rx {
                match r {
                    Ok(r) => {
                        done += 1;
                        progress(Progress {
                            done,
                            total,
                            result: &r,
                        });
                        slots[i] = Some(r);
                    }
                    Err(e) => {
                        // Let the other threads run out; report the first error.
                        next.store(usize::MAX / 2, Ordering::Relaxed);
                        failure.get_or_insert(e);
                    }
                }
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        results.extend(slots.into_iter().flatten());
    }
    Ok(results)
}
