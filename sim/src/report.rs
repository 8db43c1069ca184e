//! Reports: markdown tables in the layout of Tables 4.4–4.15 and SVG plots
//! like Figs. 4.2–4.9. Pure: returns file names and contents; the caller
//! writes them.

use std::fmt::Write as _;

use crate::availability::Profile;
use crate::dissertation;
use crate::experiment::AvailabilitySource;
use crate::experiment::{ExperimentKind, ExperimentSpec, Group};
use crate::metrics::RunMetrics;
use crate::svg::{Series, bar_chart, line_plot};

/// The metrics of one run with what identifies it.
#[derive(Clone, Debug, PartialEq)]
pub struct RunResult {
    /// Its group (peers, availability, jobs).
    pub group: Group,
    /// Its overload factor (`f64::INFINITY` for type A).
    pub overload: f64,
    /// Its metrics.
    pub metrics: RunMetrics,
}

/// One file of a report: a path relative to the report folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportFile {
    /// Relative path, e.g. `README.md`.
    pub path: String,
    /// Contents.
    pub contents: String,
}

fn overload_text(o: f64) -> String {
    if o.is_infinite() {
        "none".into()
    } else {
        format!("{o}")
    }
}

fn availability_text(a: AvailabilitySource) -> String {
    match a {
        AvailabilitySource::Profile(Profile::Full) => "100 % availability".into(),
        AvailabilitySource::Profile(p) => format!("{} (synthetic)", p.label()),
        AvailabilitySource::Imported => "imported trace".into(),
    }
}

fn f3(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "–".into()
    }
}

/// Renders the report of an experiment: `README.md` (parameters and
/// tables), `results.csv` (one line per run) and the SVG figures.
/// `command` is the command line that reproduces it, printed verbatim.
pub fn render(spec: &ExperimentSpec, results: &[RunResult], command: &str) -> Vec<ReportFile> {
    let mut files = Vec::new();
    let mut md = String::new();
    let k = spec.kind;
    let _ = writeln!(md, "# Load-balancing simulation: experiment type {k}\n");
    let _ = writeln!(
        md,
        "Dissertation §4.4 ({}). Reproduce with:\n\n```\n{command}\n```\n",
        match k {
            ExperimentKind::A => "§4.4.1, Tables 4.4–4.7",
            ExperimentKind::B => "§4.4.2, Tables 4.8–4.9, Figs. 4.2–4.9",
            ExperimentKind::C => "§4.4.3, Tables 4.10–4.15",
        }
    );
    parameters(&mut md, spec);
    if spec.availability.iter().any(|a| !a.is_full()) {
        available_table(&mut md, spec, results);
    }
    match k {
        ExperimentKind::A => type_a(&mut md, &mut files, spec, results),
        ExperimentKind::B | ExperimentKind::C => type_bc(&mut md, &mut files, spec, results),
    }
    files.push(ReportFile {
        path: "results.csv".into(),
        contents: csv(results),
    });
    files.insert(
        0,
        ReportFile {
            path: "README.md".into(),
            contents: md,
        },
    );
    files
}

fn parameters(md: &mut String, spec: &ExperimentSpec) {
    let list = |v: Vec<String>| {
        if v.is_empty() {
            "–".to_string()
        } else {
            v.join(", ")
        }
    };
    let _ = writeln!(md, "## Parameters\n\n| parameter | value |\n|---|---|");
    let rows: Vec<(&str, String)> = vec![
        ("seed", spec.seed.to_string()),
        (
            "peers",
            format!(
                "{} (CPU factors drawn from Table 4.2 with this seed)",
                spec.peers
            ),
        ),
        (
            "duration",
            format!("{} days (releases uniform over it)", spec.days),
        ),
        (
            "warm-up",
            format!(
                "{} s (jobs released earlier are not measured)",
                spec.warmup_secs
            ),
        ),
        (
            "run until",
            if spec.drain {
                "every job is done".into()
            } else {
                "the end of the duration".into()
            },
        ),
        (
            "job profiles",
            list(
                spec.job_profiles
                    .iter()
                    .map(|p| format!("{} ({:.1} processes/job)", p.label(), p.mean_parallelism()))
                    .collect(),
            ),
        ),
        (
            "availability",
            list(
                spec.availability
                    .iter()
                    .map(|a| availability_text(*a))
                    .collect(),
            ),
        ),
        (
            "processes per peer",
            list(
                spec.multiplicities
                    .iter()
                    .map(|m| format!("{m}x"))
                    .collect(),
            ),
        ),
        (
            "overload factors",
            list(spec.overloads.iter().map(|o| overload_text(*o)).collect()),
        ),
        (
            "balancers",
            list(
                spec.balancers
                    .iter()
                    .map(|b| format!("{} (`{}`)", b.label(), b.slug()))
                    .collect(),
            ),
        ),
        (
            "hysteresis",
            format!(
                "{} (relative power change the balancer ignores)",
                spec.hysteresis
            ),
        ),
        ("bulk window", format!("{} s", spec.bulk_window_secs)),
        (
            "peer ids",
            format!(
                "{} … {} (select the random ring instance)",
                spec.peer_id_base,
                spec.peer_id_base + spec.peers as i64 - 1
            ),
        ),
    ];
    let mut rows = rows;
    if let Some(t) = &spec.imported {
        rows.push((
            "imported trace",
            format!(
                "{} ({} hosts; the first {} are the peers)",
                t.name,
                t.hosts.len(),
                spec.peers
            ),
        ));
    }
    for (name, value) in rows {
        let _ = writeln!(md, "| {name} | {value} |");
    }
    let _ = writeln!(
        md,
        "\nModel and definitions: `docs/simulation.md`. Stretch factors are means over finished \
         processes / jobs of (finish − admission) ÷ length; jobs unfinished at the end are not in \
         them (column \"finished\"). Migrations are free and instantaneous.\n"
    );
}

fn first_of_each_availability<'a>(
    spec: &ExperimentSpec,
    results: &'a [RunResult],
) -> Vec<(AvailabilitySource, &'a RunMetrics)> {
    spec.availability
        .iter()
        .filter_map(|a| {
            results
                .iter()
                .find(|r| r.group.availability == *a)
                .map(|r| (*a, &r.metrics))
        })
        .collect()
}

fn available_table(md: &mut String, spec: &ExperimentSpec, results: &[RunResult]) {
    let _ = writeln!(
        md,
        "## Available CPU time per peer (cf. Table 4.4)\n\n{}-day CPU time [s] at factor 1 \
         (factor × availability, integrated).\n\n| Profile Group | min | avg | max |\n|---|---:|---:|---:|",
        spec.days
    );
    for (a, m) in first_of_each_availability(spec, results) {
        let s = m.available_per_peer;
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.0} | {:.0} |",
            availability_text(a),
            s.min,
            s.avg,
            s.max
        );
    }
    md.push('\n');
}

fn type_a(
    md: &mut String,
    files: &mut Vec<ReportFile>,
    spec: &ExperimentSpec,
    results: &[RunResult],
) {
    for &a in &spec.availability {
        let _ = writeln!(
            md,
            "## Type A on {} (cf. Tables 4.5–4.7)\n\n\
             | Load Balancer | # Procs. | CPU avg [s] | avg [%] | min [s] | max [s] | max / min | \
             Migs. (Def.) avg | min | max | Migs. (Bulk) avg | [% Def.] | min | max | Migs./h |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            availability_text(a)
        );
        for &b in &spec.balancers {
            for &x in &spec.multiplicities {
                let Some(r) = results.iter().find(|r| {
                    r.group.availability == a
                        && r.group.multiplicity == Some(x)
                        && r.metrics.balancer == b
                }) else {
                    continue;
                };
                let m = &r.metrics;
                let c = m.cpu_per_process;
                let (d, bu) = (m.migrations_per_process, m.bulk_per_process);
                let pct = if m.migrations > 0 {
                    100.0 * m.bulk_migrations as f64 / m.migrations as f64
                } else {
                    100.0
                };
                let _ = writeln!(
                    md,
                    "| {} | {}x | {:.0} | {:.0} | {:.0} | {:.0} | {} | {:.1} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.3} |",
                    b.label(),
                    x,
                    c.avg,
                    100.0 * m.utilization(),
                    c.min,
                    c.max,
                    if c.min > 0.0 {
                        format!("{:.1}", c.max / c.min)
                    } else {
                        "∞".into()
                    },
                    d.avg,
                    d.min,
                    d.max,
                    bu.avg,
                    pct,
                    bu.min,
                    bu.max,
                    m.migrations_per_hour,
                );
            }
        }
        let groups: Vec<String> = spec
            .balancers
            .iter()
            .map(|b| b.label().to_string())
            .collect();
        let series = |f: &dyn Fn(&RunMetrics) -> f64| -> Vec<(String, Vec<f64>)> {
            spec.multiplicities
                .iter()
                .map(|&x| {
                    let v = spec
                        .balancers
                        .iter()
                        .map(|&b| {
                            results
                                .iter()
                                .find(|r| {
                                    r.group.availability == a
                                        && r.group.multiplicity == Some(x)
                                        && r.metrics.balancer == b
                                })
                                .map_or(f64::NAN, |r| f(&r.metrics))
                        })
                        .collect();
                    (format!("{x}x processes"), v)
                })
                .collect()
        };
        let util = format!("a-{}-utilization.svg", a.slug());
        files.push(ReportFile {
            path: util.clone(),
            contents: bar_chart(
                &format!("Utilization, type A, {}", availability_text(a)),
                "utilized / available CPU time [%]",
                &groups,
                &series(&|m| 100.0 * m.utilization()),
            ),
        });
        let ratio = format!("a-{}-max-min.svg", a.slug());
        files.push(ReportFile {
            path: ratio.clone(),
            contents: bar_chart(
                &format!(
                    "Max / min CPU time per process, type A, {}",
                    availability_text(a)
                ),
                "max / min CPU time",
                &groups,
                &series(&|m| {
                    if m.cpu_per_process.min > 0.0 {
                        m.cpu_per_process.max / m.cpu_per_process.min
                    } else {
                        f64::NAN
                    }
                }),
            ),
        });
        let _ = writeln!(md, "\n![utilization]({util}) ![max/min]({ratio})\n");
    }
}

fn type_bc(
    md: &mut String,
    files: &mut Vec<ReportFile>,
    spec: &ExperimentSpec,
    results: &[RunResult],
) {
    let b_kind = spec.kind == ExperimentKind::B;
    for &a in &spec.availability {
        for &o in &spec.overloads {
            let reference = match (b_kind, o) {
                (true, 1.0) => " — cf. Table 4.8",
                (true, 4.0) => " — cf. Table 4.9",
                (false, 1.0) => " — cf. Tables 4.10–4.12",
                (false, 4.0) => " — cf. Tables 4.13–4.15",
                _ => "",
            };
            let _ = writeln!(
                md,
                "## Type {} on {}, overload factor {}{reference}\n\n\
                 | Exp. | Input Profile | Load Balancer | Procs. | Jobs | Diss. Procs. | Diss. Jobs | \
                 Migs./h (Def.) | (Bulk) | [% Def.] | finished | pending avg [h] |\n\
                 |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                spec.kind,
                availability_text(a),
                overload_text(o)
            );
            for &p in &spec.job_profiles {
                let exp = if b_kind && (o == 1.0 || o == 4.0) {
                    (p.experiment_number() + if o == 4.0 { 5 } else { 0 }).to_string()
                } else {
                    String::new()
                };
                for (i, &b) in spec.balancers.iter().enumerate() {
                    let Some(r) = results.iter().find(|r| {
                        r.group.availability == a
                            && r.group.job_profile == Some(p)
                            && r.overload == o
                            && r.metrics.balancer == b
                    }) else {
                        continue;
                    };
                    let m = &r.metrics;
                    let diss = if b_kind {
                        dissertation::type_b_stretch(p, o, b.slug())
                    } else {
                        None
                    };
                    let pct = if m.migrations > 0 {
                        format!(
                            "{:.0}",
                            100.0 * m.bulk_migrations as f64 / m.migrations as f64
                        )
                    } else {
                        "–".into()
                    };
                    let _ = writeln!(
                        md,
                        "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.3} | {} | {}/{} | {:.1} |",
                        if i == 0 { exp.as_str() } else { "" },
                        if i == 0 { p.label() } else { "" },
                        b.label(),
                        f3(m.process_stretch),
                        f3(m.job_stretch),
                        diss.map_or("–".into(), |d| f3(d.0)),
                        diss.map_or("–".into(), |d| f3(d.1)),
                        m.migrations_per_hour,
                        m.bulk_per_hour,
                        pct,
                        m.jobs_finished,
                        m.jobs_measured,
                        m.pending.avg / 3600.0,
                    );
                }
            }
            md.push('\n');
            let _ = writeln!(md, "### Figures (cf. Figs. 4.2–4.5 / 4.6–4.9)\n");
            for &p in &spec.job_profiles {
                let runs: Vec<&RunResult> = results
                    .iter()
                    .filter(|r| {
                        r.group.availability == a
                            && r.group.job_profile == Some(p)
                            && r.overload == o
                    })
                    .collect();
                if runs.is_empty() {
                    continue;
                }
                let stem = format!(
                    "{}-{}-{}-o{}",
                    spec.kind.letter().to_lowercase(),
                    a.slug(),
                    p.slug(),
                    overload_text(o)
                );
                let context = format!(
                    "{}, {}, overload {}",
                    p.label(),
                    availability_text(a),
                    overload_text(o)
                );
                let by_len = |f: &dyn Fn(&crate::metrics::LengthRow) -> f64| -> Vec<Series> {
                    runs.iter()
                        .map(|r| Series {
                            label: r.metrics.balancer.label().to_string(),
                            points: r
                                .metrics
                                .by_length
                                .iter()
                                .map(|l| (f64::from(l.length_min), f(l)))
                                .collect(),
                        })
                        .collect()
                };
                let plots = [
                    (
                        "proc-avg",
                        "Actual average duration of processes",
                        by_len(&|l| l.avg_process_min),
                        "process length [min]",
                        "duration [min]",
                    ),
                    (
                        "proc-max",
                        "Actual maximum duration of processes",
                        by_len(&|l| l.max_process_min),
                        "process length [min]",
                        "duration [min]",
                    ),
                    (
                        "job-avg",
                        "Actual average duration of jobs",
                        by_len(&|l| l.avg_job_min),
                        "job length [min]",
                        "duration [min]",
                    ),
                    (
                        "pending",
                        "Pending time of jobs",
                        runs.iter()
                            .map(|r| Series {
                                label: r.metrics.balancer.label().to_string(),
                                points: r
                                    .metrics
                                    .pending_curve
                                    .iter()
                                    .map(|&(h, min)| (h, min / 60.0))
                                    .collect(),
                            })
                            .collect(),
                        "release time [h]",
                        "pending time [h]",
                    ),
                ];
                let _ = write!(md, "{}:", p.label());
                for (suffix, title, series, xl, yl) in plots {
                    let path = format!("{stem}-{suffix}.svg");
                    let _ = write!(md, " [{suffix}]({path})");
                    files.push(ReportFile {
                        path,
                        contents: line_plot(&format!("{title} — {context}"), xl, yl, &series),
                    });
                }
                md.push_str("\n\n");
            }
        }
    }
}

fn csv(results: &[RunResult]) -> String {
    let mut out = String::from(
        "availability,job_profile,multiplicity,overload,balancer,process_stretch,job_stretch,\
         jobs_finished,jobs_measured,pending_avg_s,migrations,bulk_migrations,migrations_per_hour,\
         bulk_per_hour,cpu_min_s,cpu_avg_s,cpu_max_s,utilization,events\n",
    );
    for r in results {
        let m = &r.metrics;
        let _ = writeln!(
            out,
            "{},{},{},{},{},{:.6},{:.6},{},{},{:.1},{},{},{:.6},{:.6},{:.1},{:.1},{:.1},{:.6},{}",
            r.group.availability.slug(),
            r.group.job_profile.map_or("", |p| p.slug()),
            r.group
                .multiplicity
                .map_or(String::new(), |x| x.to_string()),
            overload_text(r.overload),
            m.balancer.slug(),
            m.process_stretch,
            m.job_stretch,
            m.jobs_finished,
            m.jobs_measured,
            m.pending.avg,
            m.migrations,
            m.bulk_migrations,
            m.migrations_per_hour,
            m.bulk_per_hour,
            m.cpu_per_process.min,
            m.cpu_per_process.avg,
            m.cpu_per_process.max,
            m.utilization(),
            m.events,
        );
    }
    out
}
