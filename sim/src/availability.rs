//! Availability of volunteer hosts over time (dissertation §4.3.1): the fraction of a host's CPU
//! left over by its owner, `0` while the host is switched off.
//!
//! - [`Availability`]: one host's piecewise-constant trace.
//! - [`generate`]: synthetic profile groups ([`Profile`]) that reproduce Table 4.1 and the numbers
//!   of §4.3.1, reproducible from a seed.
//! - [`from_csv`] / [`to_csv`]: import recorded traces and export synthetic ones.
//! - [`stats`]: the summary statistics ([`ProfileStats`]) used to check a group against §4.3.1.
//! - [`aggregate_curve`]: the group's average availability over time (the "cumulative pattern").
//!
//! # Time
//!
//! Times are whole seconds from the start of the trace. For the daytime and weekend statistics,
//! time 0 is **Monday 00:00 local time**; [`generate`] follows this convention and imported traces
//! should be shifted to it. The dissertation's traces sample the CPU idle time every 30 seconds
//! ([`SAMPLE_SECS`]); synthetic traces change value only at multiples of 30 s.
//!
//! # The synthetic model
//!
//! Each host is simulated in 30-second ticks by two nested Markov chains whose rates depend on the
//! time of day and the day of the week:
//!
//! 1. **On/off.** The host has a daily *working window* (start hour ~ N(`start_hour`,
//!    `start_sd`), length ~ N(`length_hours`, `length_sd`), may wrap past midnight) and a *target
//!    on-probability* `p(t)`: `day` inside the window on workdays, `night` outside it; on weekends
//!    `night·weekend_night` outside and `night·weekend_night + (day − night·weekend_night)·weekend_day`
//!    inside the window. The host switches on with rate `p/τ` and off with rate `(1 − p)/τ`: a
//!    two-state chain whose stationary on-probability is `p` and whose relaxation time is `τ`
//!    (so `τ` sets how long sessions and breaks last, i.e. the uniformity).
//! 2. **In use.** While on, the host is *idle* (level ~ U[`idle_lo`, 1]) or *busy* (level ~
//!    U[`busy_lo`, `busy_hi`]); busy periods last `busy_hours` on average and take a fraction
//!    `busy_day` (inside the window) or `busy_night` (outside) of the on-time. While busy, the
//!    level is redrawn every `redraw_hours` on average (a user switching tasks). Levels are
//!    rounded to 1/1000.
//!
//! Per-host parameters are drawn around the group's: `day ~ Beta(mean day_on, concentration
//! day_conc)`, `night = day · r` with `r ~ Beta(mean night_ratio, concentration night_conc)`, `τ`
//! and the busy fractions scaled by log-normal factors (σ = [`HOST_LOG_SD`]), and a share `dormant`
//! of hosts that are hardly ever used (their `p` is multiplied by [`DORMANT_FACTOR`]) — the near
//! zero minima of Table 4.4. A small `night_conc` makes `r` U-shaped: some hosts are left on
//! overnight, others are switched off every evening, as in a real office.
//!
//! ## Parameters
//!
//! | parameter            | office | pool  | notebook |
//! |----------------------|-------:|------:|---------:|
//! | `day_on` (conc.)     | 0.96 (25) | 0.51 (8) | 0.73 (3) |
//! | `night_ratio` (conc.)| 0.86 (1)  | 0.97 (30) | 0.30 (3) |
//! | `weekend_day`        | 0.10   | 1     | 0.35     |
//! | `weekend_night`      | 0.72   | 1     | 0.80     |
//! | `dormant`            | 3 %    | 0     | 3 %      |
//! | window start ± sd    | 8.0 ± 0.75 h | 9 ± 1 h | 8.5 ± 1.5 h |
//! | window length ± sd   | 9.5 ± 1 h | 10 ± 1.5 h | 10 ± 2 h |
//! | `τ`                  | 1.5 h  | 2 h   | 1 h      |
//! | `busy_day` / `busy_night` | 0.12 / 0.08 | 0.095 / 0.085 | 0.22 / 0.22 |
//! | `busy_hours`, `redraw_hours` | 3 h, 6 h | 0.75 h, 0.5 h | 0.3 h, 0.15 h |
//! | idle level           | [0.92, 1] | [0.92, 1] | [0.85, 1] |
//! | busy level           | [0.05, 0.9] | [0.05, 0.9] | [0.05, 0.8] |
//!
//! ## Calibration
//!
//! First, the in-use chain fixes the availability while on: office and pool PCs are busy (below
//! 90 %) about 10 % of their on-time, notebooks are below 80 % about 25 % of theirs (§4.3.1: above
//! 90 % with probability ≈ 90 %; above 80 % with probability ≈ 75 %; the log-normal per-host
//! factor raises the busy shares by ≈ 8 %). With the level ranges this gives a mean when on of
//! ≈ 0.91 (office, pool) and ≈ 0.80 (notebooks), so the average availabilities of §4.3.1 (70 %,
//! 45 %, 30 %) need on-fractions of ≈ 0.77, 0.49 and 0.37; `day_on` and `night_ratio` were set
//! for that and then tuned on the mean of [`stats`] over seeds 1–8 (100 hosts × 14 days each).
//!
//! Second, the qualitative columns of Table 4.1. Office PCs: a shared schedule, per-host daytime
//! on-probabilities close to 1 (few on/off flips by day) and long busy periods give high
//! uniformity; most hosts on most of the time gives low diversity; fewer hosts on at night and
//! far fewer at weekends give the daytime and weekend patterns. Pool PCs: almost the same
//! on-probability day and night and no weekend effect (weak daytime, no weekend pattern), and
//! short sessions and busy periods (low uniformity). Notebooks: on mostly in widely varying
//! working windows on workdays, short sessions and frequent task switches (high diversity, low
//! uniformity, clear daytime and weekend patterns). §4.3.1 gives no rates of change; they were
//! set from the migration counts of Tables 4.5–4.7 (office: a migration every 8–18 h per process,
//! pool every 3–12 h, notebooks about one per hour), giving ≈ 0.2, 0.4 and 1.4 changes of more
//! than 0.1 per host and hour.
//!
//! Measured (100 hosts, 14 days, mean over seeds 1–8; see the tests for the checked tolerances):
//!
//! | statistic                | office | pool  | notebook | §4.3.1 / Table 4.1          |
//! |--------------------------|-------:|------:|---------:|-----------------------------|
//! | mean availability        | 0.70   | 0.45  | 0.30     | ≈ 0.70 / 0.45 / 0.30        |
//! | on-fraction              | 0.77   | 0.50  | 0.38     |                             |
//! | P(> 0.9 \| on)           | 0.90   | 0.90  | 0.50     | ≈ 0.9 (office, pool)        |
//! | P(> 0.8 \| on)           | 0.91   | 0.91  | 0.75     | ≈ 0.75 (notebooks)          |
//! | changes per host-hour    | 0.22   | 0.45  | 1.37     | uniformity high / low / low |
//! | diversity (Gini)         | 0.28   | 0.53  | 0.67     | low / medium / high         |
//! | daytime contrast         | 0.16   | 0.01  | 1.09     | significant / weak / sign.  |
//! | weekend contrast         | 0.34   | 0.01  | 0.46     | significant / no / sign.    |
//!
//! Seed to seed (8 seeds), the mean availability of 100 hosts varies by about ±0.03.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// Sampling period of the dissertation's traces and resolution of [`generate`], in seconds.
pub const SAMPLE_SECS: u64 = 30;

/// In [`from_csv`], a host whose next sample is more than this many seconds after the previous one
/// was switched off in between (the loggers record only while a computer is on): the previous
/// value holds for [`SAMPLE_SECS`], then the host is off until the next sample. [`to_csv`] repeats
/// unchanged values at least this often.
pub const MAX_GAP_SECS: u64 = 300;

/// A change of availability between two consecutive samples larger than this counts as a change
/// in [`ProfileStats::changes_per_hour`].
pub const CHANGE_THRESHOLD: f64 = 0.1;

/// Share of a dormant host's on-probability that remains (see the module docs).
pub const DORMANT_FACTOR: f64 = 0.02;

/// Standard deviation of the log-normal per-host factors on `τ` and on the busy fractions.
pub const HOST_LOG_SD: f64 = 0.4;

const WEEK_SECS: u64 = 7 * 86_400;

/// Why a trace was rejected.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum TraceError {
    /// [`Availability::from_steps`] got no steps.
    #[error(
        "an availability trace needs at least one step (give [(0, value)] for a constant trace)"
    )]
    NoSteps,
    /// The first step does not start at time 0.
    #[error("the first step starts at second {start}, but a trace must start at 0")]
    FirstStepNotAtZero {
        /// The first step's time.
        start: u64,
    },
    /// Step times are not strictly increasing.
    #[error(
        "step {index} at second {time} is not after the previous step at second {previous}; sort the steps and merge duplicates"
    )]
    StepsNotIncreasing {
        /// Index of the offending step.
        index: usize,
        /// Its time.
        time: u64,
        /// The previous step's time.
        previous: u64,
    },
    /// A step value is NaN or outside [0, 1].
    #[error("step {index} has availability {value}, which is not in [0, 1]")]
    StepValueOutOfRange {
        /// Index of the offending step.
        index: usize,
        /// The value.
        value: f64,
    },
    /// The CSV text has no header line.
    #[error(
        "the CSV is empty; expected a header `timestamp,host,idle` (or `timestamp,host,idle_percent`) and one row per sample"
    )]
    MissingHeader,
    /// The CSV header is not one of the accepted ones.
    #[error(
        "line 1: header is {found:?}, expected `timestamp,host,idle` (idle as a fraction in [0, 1]) or `timestamp,host,idle_percent` (idle in percent, 0 to 100)"
    )]
    BadHeader {
        /// The header as found.
        found: String,
    },
    /// The CSV has a header but no rows.
    #[error("the CSV has a header but no samples")]
    NoRows,
    /// A row has the wrong number of fields.
    #[error("line {line}: expected 3 fields (timestamp,host,idle), found {found}")]
    FieldCount {
        /// 1-based line number.
        line: usize,
        /// Number of fields found.
        found: usize,
    },
    /// A quoted field is not closed.
    #[error(
        "line {line}: a quoted field is not closed (a `\"` inside a quoted field is written `\"\"`)"
    )]
    UnclosedQuote {
        /// 1-based line number where the field starts.
        line: usize,
    },
    /// The timestamp is not a non-negative integer.
    #[error("line {line}: timestamp {found:?} is not a whole number of seconds >= 0")]
    BadTimestamp {
        /// 1-based line number.
        line: usize,
        /// The field as found.
        found: String,
    },
    /// The host field is empty.
    #[error("line {line}: the host name is empty")]
    EmptyHost {
        /// 1-based line number.
        line: usize,
    },
    /// The idle field is not a number.
    #[error("line {line}: idle value {found:?} is not a number")]
    BadValue {
        /// 1-based line number.
        line: usize,
        /// The field as found.
        found: String,
    },
    /// The idle value is outside the range of the column.
    #[error("line {line}: idle value {value} is outside [0, {max}]{hint}")]
    ValueOutOfRange {
        /// 1-based line number.
        line: usize,
        /// The value.
        value: f64,
        /// 1 for `idle`, 100 for `idle_percent`.
        max: f64,
        /// Extra advice (empty or starting with `; `).
        hint: &'static str,
    },
    /// A host's timestamps are not strictly increasing.
    #[error(
        "line {line}: host {host:?} has timestamp {time} after {previous}; each host's samples must be sorted by time without duplicates"
    )]
    Unsorted {
        /// 1-based line number.
        line: usize,
        /// The host.
        host: String,
        /// This row's timestamp.
        time: u64,
        /// The host's previous timestamp.
        previous: u64,
    },
}

/// One host's available fraction of CPU over time: piecewise constant, values in [0, 1],
/// 0 = switched off.
///
/// Invariants: at least one step, the first at time 0, times strictly increasing, consecutive
/// values different (equal neighbours are merged). Each value holds until the next step's time;
/// the last one holds forever.
#[derive(Clone, Debug, PartialEq)]
pub struct Availability {
    steps: Vec<(u64, f64)>,
}

impl Availability {
    /// Always 1.0 (a dedicated host).
    pub fn full() -> Self {
        Self {
            steps: vec![(0, 1.0)],
        }
    }

    /// A trace from `(second, value)` steps; merges consecutive equal values.
    ///
    /// # Errors
    ///
    /// [`TraceError`] if `steps` is empty, does not start at 0, is not strictly increasing in time,
    /// or has a value that is NaN or outside [0, 1].
    pub fn from_steps(steps: Vec<(u64, f64)>) -> Result<Self, TraceError> {
        let Some(&(start, _)) = steps.first() else {
            return Err(TraceError::NoSteps);
        };
        if start != 0 {
            return Err(TraceError::FirstStepNotAtZero { start });
        }
        let mut out: Vec<(u64, f64)> = Vec::with_capacity(steps.len());
        for (index, &(time, value)) in steps.iter().enumerate() {
            if !(0.0..=1.0).contains(&value) {
                return Err(TraceError::StepValueOutOfRange { index, value });
            }
            if index > 0 {
                let previous = steps[index - 1].0;
                if time <= previous {
                    return Err(TraceError::StepsNotIncreasing {
                        index,
                        time,
                        previous,
                    });
                }
            }
            if out.last().is_none_or(|&(_, v)| v != value) {
                out.push((time, value));
            }
        }
        Ok(Self { steps: out })
    }

    /// Builds from steps known to satisfy the invariants except merging (internal use).
    fn from_sorted(steps: Vec<(u64, f64)>) -> Self {
        let mut out: Vec<(u64, f64)> = Vec::with_capacity(steps.len());
        for (t, v) in steps {
            match out.last_mut() {
                Some(last) if last.0 == t => last.1 = v,
                Some(last) if last.1 == v => {}
                _ => out.push((t, v)),
            }
        }
        // Setting a step to its predecessor's value may leave equal neighbours; merge again.
        out.dedup_by(|b, a| a.1 == b.1);
        Self { steps: out }
    }

    /// The availability at second `t`.
    pub fn at(&self, t: u64) -> f64 {
        let i = self.steps.partition_point(|&(s, _)| s <= t);
        // The first step is at 0, so i >= 1.
        self.steps[i.saturating_sub(1)].1
    }

    /// The steps `(second, value)`, sorted, the first at 0.
    pub fn steps(&self) -> &[(u64, f64)] {
        &self.steps
    }

    /// The integral of the availability over `[from, to)`, in seconds (CPU seconds at factor 1);
    /// 0 if `to <= from`.
    pub fn integral(&self, from: u64, to: u64) -> f64 {
        if to <= from {
            return 0.0;
        }
        let first = self
            .steps
            .partition_point(|&(s, _)| s <= from)
            .saturating_sub(1);
        let mut sum = 0.0;
        for (i, &(s, v)) in self.steps.iter().enumerate().skip(first) {
            if s >= to {
                break;
            }
            let end = self.steps.get(i + 1).map_or(to, |&(n, _)| n.min(to));
            sum += v * (end - s.max(from)) as f64;
        }
        sum
    }

    /// The mean availability over `[0, duration)`; the value at 0 if `duration` is 0.
    pub fn mean(&self, duration: u64) -> f64 {
        if duration == 0 {
            return self.at(0);
        }
        self.integral(0, duration) / duration as f64
    }
}

/// A profile group of §4.3.1 (plus `Full`, hosts always 100 % available as in experiments of
/// type B).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Profile {
    /// Always 100 % available.
    Full,
    /// Office PCs: high availability, low diversity, high uniformity, daytime and weekend pattern.
    Office,
    /// Computer-pool PCs: medium availability and diversity, low uniformity, weak daytime pattern,
    /// no weekend pattern.
    Pool,
    /// Employees' notebooks: low availability, high diversity, low uniformity, daytime and weekend
    /// pattern.
    Notebook,
}

impl Profile {
    /// All profiles, in the order `full, office, pool, notebook`.
    pub const ALL: [Profile; 4] = [
        Profile::Full,
        Profile::Office,
        Profile::Pool,
        Profile::Notebook,
    ];

    /// The CLI name: `full`, `office`, `pool` or `notebook`.
    pub fn slug(self) -> &'static str {
        match self {
            Profile::Full => "full",
            Profile::Office => "office",
            Profile::Pool => "pool",
            Profile::Notebook => "notebook",
        }
    }

    /// The name as in the dissertation's tables: "100 %", "Office PCs", "Pool PCs", "Notebooks".
    pub fn label(self) -> &'static str {
        match self {
            Profile::Full => "100 %",
            Profile::Office => "Office PCs",
            Profile::Pool => "Pool PCs",
            Profile::Notebook => "Notebooks",
        }
    }

    fn params(self) -> Option<&'static GroupParams> {
        match self {
            Profile::Full => None,
            Profile::Office => Some(&OFFICE),
            Profile::Pool => Some(&POOL),
            Profile::Notebook => Some(&NOTEBOOK),
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.slug())
    }
}

/// An unknown profile name was given to [`Profile::from_str`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown availability profile {0:?}; expected one of: full, office, pool, notebook")]
pub struct UnknownProfile(pub String);

impl FromStr for Profile {
    type Err = UnknownProfile;

    /// Accepts the slugs `full`, `office`, `pool`, `notebook` (case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Profile::ALL
            .into_iter()
            .find(|p| p.slug().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownProfile(s.chars().take(64).collect()))
    }
}

/// Parameters of one profile group's generative model (see the module docs).
#[derive(Debug)]
struct GroupParams {
    /// Mean per-host on-probability inside the working window on workdays.
    day_on: f64,
    /// Beta concentration (α + β) of the per-host `day`.
    day_conc: f64,
    /// Mean of `r = night / day`.
    night_ratio: f64,
    /// Beta concentration of `r`; below 2 the distribution is U-shaped.
    night_conc: f64,
    /// Weekends: share of the working-window bump that remains (0 = like the night).
    weekend_day: f64,
    /// Weekends: factor on the off-window on-probability.
    weekend_night: f64,
    /// Share of dormant hosts.
    dormant: f64,
    /// Mean and standard deviation of the window's start hour.
    start_hour: f64,
    start_sd: f64,
    /// Mean and standard deviation of the window's length in hours.
    length_hours: f64,
    length_sd: f64,
    /// Relaxation time of the on/off chain in hours.
    tau_hours: f64,
    /// Busy share of the on-time inside and outside the working window.
    busy_day: f64,
    busy_night: f64,
    /// Mean length of a busy period in hours.
    busy_hours: f64,
    /// Mean time between level changes within a busy period in hours.
    redraw_hours: f64,
    /// Idle level range [idle_lo, 1].
    idle_lo: f64,
    /// Busy level range [busy_lo, busy_hi].
    busy_lo: f64,
    busy_hi: f64,
}

/// Office PCs: on-fraction ≈ 0.77, mostly left on over night, fewer over the weekend.
const OFFICE: GroupParams = GroupParams {
    day_on: 0.96,
    day_conc: 25.0,
    night_ratio: 0.86,
    night_conc: 1.0,
    weekend_day: 0.1,
    weekend_night: 0.72,
    dormant: 0.03,
    start_hour: 8.0,
    start_sd: 0.75,
    length_hours: 9.5,
    length_sd: 1.0,
    tau_hours: 1.5,
    busy_day: 0.12,
    busy_night: 0.08,
    busy_hours: 3.0,
    redraw_hours: 6.0,
    idle_lo: 0.92,
    busy_lo: 0.05,
    busy_hi: 0.9,
};

/// Pool PCs: on-fraction ≈ 0.49, nearly flat over the day and the week, short sessions.
const POOL: GroupParams = GroupParams {
    day_on: 0.51,
    day_conc: 8.0,
    night_ratio: 0.97,
    night_conc: 30.0,
    weekend_day: 1.0,
    weekend_night: 1.0,
    dormant: 0.0,
    start_hour: 9.0,
    start_sd: 1.0,
    length_hours: 10.0,
    length_sd: 1.5,
    tau_hours: 2.0,
    busy_day: 0.095,
    busy_night: 0.085,
    busy_hours: 0.75,
    redraw_hours: 0.5,
    idle_lo: 0.92,
    busy_lo: 0.05,
    busy_hi: 0.9,
};

/// Notebooks: on-fraction ≈ 0.37, mostly in the working window on workdays, frequent changes.
const NOTEBOOK: GroupParams = GroupParams {
    day_on: 0.73,
    day_conc: 3.0,
    night_ratio: 0.3,
    night_conc: 3.0,
    weekend_day: 0.35,
    weekend_night: 0.8,
    dormant: 0.03,
    start_hour: 8.5,
    start_sd: 1.5,
    length_hours: 10.0,
    length_sd: 2.0,
    tau_hours: 1.0,
    busy_day: 0.22,
    busy_night: 0.22,
    busy_hours: 0.3,
    redraw_hours: 0.15,
    idle_lo: 0.85,
    busy_lo: 0.05,
    busy_hi: 0.8,
};

/// xoshiro256** seeded through SplitMix64: small, fast, and a pure function of its seed.
#[derive(Debug, Clone)]
struct Rng {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    fn new(seed: u64) -> Self {
        let mut state = seed;
        Self {
            s: std::array::from_fn(|_| splitmix64(&mut state)),
        }
    }

    fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // (0, 1]
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Gamma(shape, 1) by Marsaglia–Tsang, with the `U^(1/shape)` boost for shape < 1.
    fn gamma(&mut self, shape: f64) -> f64 {
        if shape < 1.0 {
            let u = 1.0 - self.unit();
            return self.gamma(shape + 1.0) * u.powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = 1.0 - self.unit();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }

    /// Beta with the given mean in (0, 1) and concentration α + β.
    fn beta(&mut self, mean: f64, concentration: f64) -> f64 {
        let a = self.gamma(mean * concentration);
        let b = self.gamma((1.0 - mean) * concentration);
        if a + b > 0.0 { a / (a + b) } else { mean }
    }

    /// Log-normal factor with median 1.
    fn log_normal(&mut self, sd: f64) -> f64 {
        (sd * self.normal()).exp()
    }
}

/// One synthetic host's parameters, drawn from its group's.
#[derive(Debug)]
struct HostParams {
    /// Working window [start, start + length) in hours, may wrap past midnight.
    start: f64,
    length: f64,
    /// P(switch on) / P(switch off) per tick for (weekend, in window) = index `2·weekend + window`.
    p_on: [f64; 4],
    p_off: [f64; 4],
    /// P(start busy) per tick and busy share, by `window`.
    p_busy: [f64; 2],
    busy_share: [f64; 2],
    p_unbusy: f64,
    p_redraw: f64,
}

/// Probability that an exponential clock of `rate_per_hour` rings within one tick.
fn per_tick(rate_per_hour: f64) -> f64 {
    let dt_hours = SAMPLE_SECS as f64 / 3600.0;
    1.0 - (-rate_per_hour.max(0.0) * dt_hours).exp()
}

impl HostParams {
    fn draw(g: &GroupParams, rng: &mut Rng) -> Self {
        let dormant = rng.chance(g.dormant);
        let mut day = rng.beta(g.day_on, g.day_conc);
        let mut night = day * rng.beta(g.night_ratio, g.night_conc);
        if dormant {
            day *= DORMANT_FACTOR;
            night *= DORMANT_FACTOR;
        }
        let start = (g.start_hour + g.start_sd * rng.normal()).rem_euclid(24.0);
        let length = (g.length_hours + g.length_sd * rng.normal()).clamp(2.0, 20.0);
        let tau = g.tau_hours * rng.log_normal(HOST_LOG_SD);
        let busy_factor = rng.log_normal(HOST_LOG_SD);
        let weekend_off = night * g.weekend_night;
        let weekend_in = weekend_off + (day - weekend_off) * g.weekend_day;
        let target = [night, day, weekend_off, weekend_in];
        let busy_share = [
            (g.busy_night * busy_factor).min(0.8),
            (g.busy_day * busy_factor).min(0.8),
        ];
        let busy_rate = |share: f64| share / (1.0 - share) / g.busy_hours;
        Self {
            start,
            length,
            p_on: target.map(|p| per_tick(p / tau)),
            p_off: target.map(|p| per_tick((1.0 - p) / tau)),
            p_busy: busy_share.map(|s| per_tick(busy_rate(s))),
            busy_share,
            p_unbusy: per_tick(1.0 / g.busy_hours),
            p_redraw: per_tick(1.0 / g.redraw_hours),
        }
    }

    /// Index into `p_on`/`p_off` and the window flag at second `t`.
    fn slot(&self, t: u64) -> (usize, usize) {
        let in_week = t % WEEK_SECS;
        let weekend = usize::from(in_week / 86_400 >= 5);
        let hour = (in_week % 86_400) as f64 / 3600.0;
        let window = usize::from((hour - self.start).rem_euclid(24.0) < self.length);
        (2 * weekend + window, window)
    }
}

/// A level drawn uniformly from `[lo, hi]`, rounded to 1/1000 (compact CSV, exact round trips).
fn level(rng: &mut Rng, lo: f64, hi: f64) -> f64 {
    (rng.uniform(lo, hi) * 1000.0).round() / 1000.0
}

fn generate_host(g: &GroupParams, duration_secs: u64, seed: u64) -> Availability {
    let mut rng = Rng::new(seed);
    let host = HostParams::draw(g, &mut rng);
    let idle = |rng: &mut Rng| level(rng, g.idle_lo, 1.0);
    let busy = |rng: &mut Rng| level(rng, g.busy_lo, g.busy_hi);

    let (slot, window) = host.slot(0);
    let target = host.p_on[slot] / (host.p_on[slot] + host.p_off[slot]);
    let mut on = rng.chance(target);
    let mut is_busy = rng.chance(host.busy_share[window]);
    let mut value = if is_busy {
        busy(&mut rng)
    } else {
        idle(&mut rng)
    };
    let mut steps = vec![(0, if on { value } else { 0.0 })];

    let ticks = duration_secs.div_ceil(SAMPLE_SECS);
    for tick in 1..ticks {
        let t = tick * SAMPLE_SECS;
        let (slot, window) = host.slot(t);
        if on {
            if rng.chance(host.p_off[slot]) {
                on = false;
            } else if is_busy {
                if rng.chance(host.p_unbusy) {
                    is_busy = false;
                    value = idle(&mut rng);
                } else if rng.chance(host.p_redraw) {
                    value = busy(&mut rng);
                }
            } else if rng.chance(host.p_busy[window]) {
                is_busy = true;
                value = busy(&mut rng);
            }
        } else if rng.chance(host.p_on[slot]) {
            on = true;
            is_busy = rng.chance(host.busy_share[window]);
            value = if is_busy {
                busy(&mut rng)
            } else {
                idle(&mut rng)
            };
        }
        let now = if on { value } else { 0.0 };
        if steps.last().is_some_and(|&(_, v)| v != now) {
            steps.push((t, now));
        }
    }
    Availability { steps }
}

/// Synthetic hosts of a profile group matching Table 4.1 and §4.3.1, reproducible from the seed.
///
/// Time 0 is Monday 00:00 local time; values change only at multiples of [`SAMPLE_SECS`] like the
/// dissertation's traces. Host `i` depends only on `(profile, seed, i)`, so a larger group extends
/// a smaller one and a longer duration extends a shorter one (the shorter trace is a prefix).
/// [`Profile::Full`] gives [`Availability::full`] hosts. See the module docs for the model.
pub fn generate(
    profile: Profile,
    hosts: usize,
    duration_secs: u64,
    seed: u64,
) -> Vec<Availability> {
    let Some(g) = profile.params() else {
        return vec![Availability::full(); hosts];
    };
    let tag = match profile {
        Profile::Office => 0x0FF1_CE00,
        Profile::Pool => 0x0B00_1000,
        _ => 0x0B00_C000,
    };
    let mut base = seed ^ tag;
    let base = splitmix64(&mut base);
    (0..hosts)
        .map(|i| {
            let mut s = base ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
            generate_host(g, duration_secs, splitmix64(&mut s))
        })
        .collect()
}

/// One CSV record: its 1-based starting line and its fields.
type Record = (usize, Vec<String>);

/// Splits CSV text into records (RFC 4180 quoting: `"a,b"`, `""` inside quotes; CRLF accepted).
/// Unquoted fields are trimmed; quoted fields are kept verbatim. Blank lines are skipped.
fn csv_records(text: &str) -> Result<Vec<Record>, TraceError> {
    fn finish(field: &mut String, quoted: bool) -> String {
        let f = std::mem::take(field);
        if quoted { f } else { f.trim().to_owned() }
    }
    let mut records = Vec::new();
    let mut fields: Vec<String> = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut line = 1;
    let mut record_line = 1;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if !quoted && field.trim().is_empty() => {
                field.clear();
                quoted = true;
                let quote_line = line;
                loop {
                    match chars.next() {
                        None => return Err(TraceError::UnclosedQuote { line: quote_line }),
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            field.push('"');
                        }
                        Some('"') => break,
                        Some(ch) => {
                            if ch == '\n' {
                                line += 1;
                            }
                            field.push(ch);
                        }
                    }
                }
            }
            ',' => {
                fields.push(finish(&mut field, quoted));
                quoted = false;
            }
            '\n' | '\r' => {
                if c == '\r' && chars.peek() == Some(&'\n') {
                    chars.next();
                }
                fields.push(finish(&mut field, quoted));
                quoted = false;
                let blank = fields.len() == 1 && fields[0].is_empty();
                if !blank {
                    records.push((record_line, std::mem::take(&mut fields)));
                }
                fields.clear();
                line += 1;
                record_line = line;
            }
            // Text after a closing quote is kept (lenient), whitespace there is dropped.
            _ if quoted && c.is_whitespace() => {}
            _ => field.push(c),
        }
    }
    if !field.is_empty() || !fields.is_empty() || quoted {
        fields.push(finish(&mut field, quoted));
        records.push((record_line, fields));
    }
    Ok(records)
}

/// Import a CSV trace; hosts sorted by name.
///
/// # Format
///
/// A header `timestamp,host,idle` or `timestamp,host,idle_percent`, then one row per sample:
///
/// - `timestamp`: whole seconds from the trace's time 0 (Monday 00:00 for the daytime and weekend
///   statistics — shift Unix times before importing).
/// - `host`: any non-empty name (quote it if it contains `,` or `"`).
/// - `idle`: the idle fraction of the CPU in [0, 1] — or, with the header `idle_percent`, in
///   percent in [0, 100]. The column name decides, never the values: a value above 1 in an `idle`
///   column is an error that points to `idle_percent`.
///
/// Rows of different hosts may interleave; each host's timestamps must be strictly increasing.
///
/// # Semantics
///
/// A sample holds until the host's next sample if that comes within [`MAX_GAP_SECS`]; after a
/// longer gap the host was switched off: the value holds for [`SAMPLE_SECS`], then 0 until the
/// next sample. A host is off (0) before its first sample. After its last sample a host stays at
/// that value if the sample is within [`MAX_GAP_SECS`] of the last timestamp of the whole file
/// (the trace's end), and is off after [`SAMPLE_SECS`] otherwise. A sample with value 0 means no
/// available CPU, the same as off.
///
/// # Errors
///
/// [`TraceError`] naming the line for a bad header, wrong field count, non-integer or negative
/// timestamp, empty host, non-numeric or out-of-range value, or unsorted or duplicate timestamps of
/// a host; [`TraceError::NoRows`] if there is no sample.
pub fn from_csv(text: &str) -> Result<Vec<(String, Availability)>, TraceError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut records = csv_records(text)?.into_iter();
    let (_, header) = records.next().ok_or(TraceError::MissingHeader)?;
    let names: Vec<&str> = header.iter().map(|h| h.trim()).collect();
    let percent = match names.as_slice() {
        ["timestamp", "host", "idle"] => false,
        ["timestamp", "host", "idle_percent"] => true,
        _ => {
            return Err(TraceError::BadHeader {
                found: header.join(",").chars().take(200).collect(),
            });
        }
    };
    let max = if percent { 100.0 } else { 1.0 };
    let mut samples: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    let mut end = 0;
    for (line, fields) in records {
        if fields.len() != 3 {
            return Err(TraceError::FieldCount {
                line,
                found: fields.len(),
            });
        }
        let ts = fields[0].trim();
        let time: u64 = ts.parse().map_err(|_| TraceError::BadTimestamp {
            line,
            found: ts.chars().take(64).collect(),
        })?;
        let host = fields[1].as_str();
        if host.is_empty() {
            return Err(TraceError::EmptyHost { line });
        }
        let raw = fields[2].trim();
        let value: f64 = raw.parse().map_err(|_| TraceError::BadValue {
            line,
            found: raw.chars().take(64).collect(),
        })?;
        if !(0.0..=max).contains(&value) {
            let hint = if !percent && value > 1.0 && value <= 100.0 {
                "; for idle percentages name the column `idle_percent`"
            } else {
                ""
            };
            return Err(TraceError::ValueOutOfRange {
                line,
                value,
                max,
                hint,
            });
        }
        let value = if percent { value / 100.0 } else { value };
        let rows = samples.entry(host.to_owned()).or_default();
        if let Some(&(previous, _)) = rows.last()
            && time <= previous
        {
            return Err(TraceError::Unsorted {
                line,
                host: host.chars().take(64).collect(),
                time,
                previous,
            });
        }
        rows.push((time, value));
        end = end.max(time);
    }
    if samples.is_empty() {
        return Err(TraceError::NoRows);
    }
    Ok(samples
        .into_iter()
        .map(|(host, rows)| (host, trace_from_samples(&rows, end)))
        .collect())
}

/// Applies the gap rule of [`from_csv`] to one host's sorted samples.
fn trace_from_samples(rows: &[(u64, f64)], end: u64) -> Availability {
    let mut steps = Vec::with_capacity(rows.len() + 2);
    if rows[0].0 > 0 {
        steps.push((0, 0.0));
    }
    for (i, &(t, v)) in rows.iter().enumerate() {
        steps.push((t, v));
        let next = rows.get(i + 1).map_or(end, |&(n, _)| n);
        if next - t > MAX_GAP_SECS && v > 0.0 {
            steps.push((t + SAMPLE_SECS, 0.0));
        }
    }
    Availability::from_sorted(steps)
}

/// Quotes a CSV field if needed.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) || s.trim() != s {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Export traces as CSV (header `timestamp,host,idle`, idle as a fraction) that [`from_csv`] reads
/// back to equal traces.
///
/// Each step gives a row; a non-zero value is repeated every [`MAX_GAP_SECS`] while it lasts (so
/// the importer does not take the gap for a switch-off), and hosts still on at the end are
/// repeated up to the latest step time of all hosts. Rows are grouped by host, in the given
/// order; names are quoted when they contain `,`, `"`, line breaks or outer spaces. Host names
/// should be unique and non-empty (duplicates would be rejected on import).
pub fn to_csv(hosts: &[(String, Availability)]) -> String {
    use std::fmt::Write;
    let end = hosts
        .iter()
        .filter_map(|(_, a)| a.steps.last().map(|&(t, _)| t))
        .max()
        .unwrap_or(0);
    let mut out = String::from("timestamp,host,idle\n");
    for (name, avail) in hosts {
        let name = csv_field(name);
        for (i, &(t, v)) in avail.steps.iter().enumerate() {
            let _ = writeln!(out, "{t},{name},{v}");
            if v > 0.0 {
                let next = avail.steps.get(i + 1).map_or(end, |&(n, _)| n);
                let mut r = t + MAX_GAP_SECS;
                while r < next {
                    let _ = writeln!(out, "{r},{name},{v}");
                    r += MAX_GAP_SECS;
                }
                if i + 1 == avail.steps.len() && next > t {
                    let _ = writeln!(out, "{next},{name},{v}");
                }
            }
        }
    }
    out
}

/// Summary statistics of a group of hosts over `[0, duration)`, to compare with §4.3.1 and
/// Table 4.1. Time-weighted over all hosts unless said otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileStats {
    /// Number of hosts.
    pub hosts: usize,
    /// Length of the analysed interval in seconds.
    pub duration_secs: u64,
    /// Mean availability including off time (§4.3.1: ≈ 0.70 office, 0.45 pool, 0.30 notebooks).
    pub mean_availability: f64,
    /// Fraction of time the hosts are on (availability > 0).
    pub on_fraction: f64,
    /// Mean availability while on.
    pub mean_when_on: f64,
    /// P(availability > 0.9 | on) (§4.3.1: ≈ 0.9 for office and pool PCs).
    pub p_above_90_when_on: f64,
    /// P(availability > 0.8 | on) (§4.3.1: ≈ 0.75 for notebooks).
    pub p_above_80_when_on: f64,
    /// Smallest per-host mean availability (the spread of Table 4.4).
    pub host_mean_min: f64,
    /// Largest per-host mean availability.
    pub host_mean_max: f64,
    /// Uniformity, inverted: changes of more than [`CHANGE_THRESHOLD`] between consecutive
    /// samples, per host and hour (low = high uniformity).
    pub changes_per_hour: f64,
    /// Diversity: the Gini coefficient of the hosts' availabilities at the same time, averaged over
    /// time (buckets of [`stats_bucket_secs`] seconds; buckets where every host is off are
    /// skipped). 0 = all hosts equally available at every moment, which would make load balancing
    /// trivial; towards 1 = the power is concentrated on a few hosts that keep changing.
    pub diversity: f64,
    /// Mean Pearson correlation of the hosts' bucket means over all pairs of non-constant hosts
    /// (NaN if there is no such pair). Shared schedules raise it.
    pub mean_correlation: f64,
    /// Daytime pattern: mean availability on workdays 09:00–17:00 minus 00:00–06:00, relative to
    /// `mean_availability` (NaN if the interval lacks either window).
    pub daytime_contrast: f64,
    /// Weekend pattern: mean availability Monday–Friday minus Saturday–Sunday, relative to
    /// `mean_availability` (NaN if the interval lacks workdays or weekend days).
    pub weekend_contrast: f64,
}

/// The bucket length [`stats`] uses for diversity, correlation and the patterns: 300 s, or longer
/// (a multiple of 300 s) to keep at most 8064 buckets (four weeks at 300 s).
pub fn stats_bucket_secs(duration_secs: u64) -> u64 {
    const BASE: u64 = 300;
    const MAX_BUCKETS: u64 = 8064;
    let buckets = duration_secs.div_ceil(BASE).max(1);
    BASE * buckets.div_ceil(MAX_BUCKETS).max(1)
}

/// Walks one trace forward through time.
struct Cursor<'a> {
    steps: &'a [(u64, f64)],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn new(a: &'a Availability) -> Self {
        Self {
            steps: &a.steps,
            i: 0,
        }
    }

    /// Mean over [from, to); calls must have non-decreasing `from`.
    fn mean(&mut self, from: u64, to: u64) -> f64 {
        while self.i + 1 < self.steps.len() && self.steps[self.i + 1].0 <= from {
            self.i += 1;
        }
        let mut sum = 0.0;
        let mut j = self.i;
        while j < self.steps.len() && self.steps[j].0 < to {
            let start = self.steps[j].0.max(from);
            let stop = self.steps.get(j + 1).map_or(to, |&(n, _)| n.min(to));
            sum += self.steps[j].1 * (stop - start) as f64;
            j += 1;
        }
        sum / (to - from) as f64
    }
}

/// Gini coefficient of non-negative values (0 for fewer than two values or an all-zero sum).
fn gini(values: &mut [f64]) -> Option<f64> {
    let n = values.len();
    let total: f64 = values.iter().sum();
    if total <= 0.0 {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let weighted: f64 = values
        .iter()
        .enumerate()
        .map(|(i, &x)| (2.0 * (i + 1) as f64 - n as f64 - 1.0) * x)
        .sum();
    Some(weighted / (n as f64 * total))
}

/// Summary statistics used to check the profiles against §4.3.1 (see [`ProfileStats`]).
///
/// Exact over the steps for the means, probabilities and changes; diversity, correlation and the
/// patterns use bucket means (see [`stats_bucket_secs`]). With no hosts or a zero duration every
/// field is NaN except the counts.
pub fn stats(hosts: &[Availability], duration_secs: u64) -> ProfileStats {
    let mut s = ProfileStats {
        hosts: hosts.len(),
        duration_secs,
        mean_availability: f64::NAN,
        on_fraction: f64::NAN,
        mean_when_on: f64::NAN,
        p_above_90_when_on: f64::NAN,
        p_above_80_when_on: f64::NAN,
        host_mean_min: f64::NAN,
        host_mean_max: f64::NAN,
        changes_per_hour: f64::NAN,
        diversity: f64::NAN,
        mean_correlation: f64::NAN,
        daytime_contrast: f64::NAN,
        weekend_contrast: f64::NAN,
    };
    if hosts.is_empty() || duration_secs == 0 {
        return s;
    }

    // Exact time-weighted sums over the steps.
    let (mut area, mut on, mut above90, mut above80, mut changes) = (0.0, 0.0, 0.0, 0.0, 0u64);
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    for a in hosts {
        let mut host_area = 0.0;
        for (i, &(t, v)) in a.steps.iter().enumerate() {
            if t >= duration_secs {
                break;
            }
            let end = a
                .steps
                .get(i + 1)
                .map_or(duration_secs, |&(n, _)| n.min(duration_secs));
            let len = (end - t) as f64;
            host_area += v * len;
            if v > 0.0 {
                on += len;
            }
            if v > 0.9 {
                above90 += len;
            }
            if v > 0.8 {
                above80 += len;
            }
            if i > 0 && (v - a.steps[i - 1].1).abs() > CHANGE_THRESHOLD {
                changes += 1;
            }
        }
        area += host_area;
        let host_mean = host_area / duration_secs as f64;
        min = min.min(host_mean);
        max = max.max(host_mean);
    }
    let total = duration_secs as f64 * hosts.len() as f64;
    s.mean_availability = area / total;
    s.on_fraction = on / total;
    if on > 0.0 {
        s.mean_when_on = area / on;
        s.p_above_90_when_on = above90 / on;
        s.p_above_80_when_on = above80 / on;
    }
    s.host_mean_min = min;
    s.host_mean_max = max;
    s.changes_per_hour = changes as f64 / (total / 3600.0);

    // Bucket means, bucket by bucket across hosts.
    let bucket = stats_bucket_secs(duration_secs);
    let n = hosts.len();
    let mut cursors: Vec<Cursor<'_>> = hosts.iter().map(Cursor::new).collect();
    let mut column = vec![0.0; n];
    let mut sum = vec![0.0; n];
    let mut sum_sq = vec![0.0; n];
    let mut cross = vec![0.0; n * (n - 1) / 2];
    let (mut gini_sum, mut gini_weight) = (0.0, 0.0);
    // [workday day, workday night, workday all, weekend all]: (weighted sum, weight)
    let mut windows = [(0.0, 0.0); 4];
    let mut buckets = 0usize;
    let mut from = 0;
    while from < duration_secs {
        let to = (from + bucket).min(duration_secs);
        let weight = (to - from) as f64;
        for (c, x) in cursors.iter_mut().zip(column.iter_mut()) {
            *x = c.mean(from, to);
        }
        let mean = column.iter().sum::<f64>() / n as f64;
        let mut k = 0;
        for i in 0..n {
            sum[i] += column[i];
            sum_sq[i] += column[i] * column[i];
            for j in i + 1..n {
                cross[k] += column[i] * column[j];
                k += 1;
            }
        }
        buckets += 1;
        let mut sorted = column.clone();
        if let Some(g) = gini(&mut sorted) {
            gini_sum += g * weight;
            gini_weight += weight;
        }
        let mid = (from + to) / 2 % WEEK_SECS;
        let weekend = mid / 86_400 >= 5;
        let hour = mid % 86_400 / 3600;
        let mut add = |w: usize| {
            windows[w].0 += mean * weight;
            windows[w].1 += weight;
        };
        if weekend {
            add(3);
        } else {
            add(2);
            if (9..17).contains(&hour) {
                add(0);
            } else if hour < 6 {
                add(1);
            }
        }
        from = to;
    }
    if gini_weight > 0.0 {
        s.diversity = gini_sum / gini_weight;
    }
    let m = buckets as f64;
    let sd: Vec<f64> = (0..n)
        .map(|i| (sum_sq[i] / m - (sum[i] / m).powi(2)).max(0.0).sqrt())
        .collect();
    let (mut corr_sum, mut pairs, mut k) = (0.0, 0usize, 0);
    for i in 0..n {
        for j in i + 1..n {
            if sd[i] > 1e-9 && sd[j] > 1e-9 {
                let cov = cross[k] / m - sum[i] / m * sum[j] / m;
                corr_sum += (cov / (sd[i] * sd[j])).clamp(-1.0, 1.0);
                pairs += 1;
            }
            k += 1;
        }
    }
    if pairs > 0 {
        s.mean_correlation = corr_sum / pairs as f64;
    }
    let avg = |w: usize| windows[w].0 / windows[w].1;
    if s.mean_availability > 0.0 {
        if windows[0].1 > 0.0 && windows[1].1 > 0.0 {
            s.daytime_contrast = (avg(0) - avg(1)) / s.mean_availability;
        }
        if windows[2].1 > 0.0 && windows[3].1 > 0.0 {
            s.weekend_contrast = (avg(2) - avg(3)) / s.mean_availability;
        }
    }
    s
}

/// The group's mean availability in consecutive buckets of `bucket_secs` over `[0, duration)`:
/// `(bucket start in seconds, mean over hosts and bucket)`, the last bucket possibly shorter.
/// Empty if there are no hosts, the duration is 0 or `bucket_secs` is 0.
pub fn aggregate_curve(
    hosts: &[Availability],
    duration_secs: u64,
    bucket_secs: u64,
) -> Vec<(u64, f64)> {
    if hosts.is_empty() || bucket_secs == 0 {
        return Vec::new();
    }
    let mut cursors: Vec<Cursor<'_>> = hosts.iter().map(Cursor::new).collect();
    let mut out = Vec::new();
    let mut from = 0;
    while from < duration_secs {
        let to = from.saturating_add(bucket_secs).min(duration_secs);
        let total: f64 = cursors.iter_mut().map(|c| c.mean(from, to)).sum();
        out.push((from, total / hosts.len() as f64));
        from = to;
    }
    out
}

#[cfg(test)]
mod tests;
