//! Behaviour tests of the simulator, named after the rule they check.

use placement::{HashVariant, Move, PeerId, ProcessKey, StealFrom};
use proptest::prelude::*;

use crate::availability::{Availability, Profile};
use crate::engine::{Balancer, BalancerSpec, RunConfig, RunOutcome, simulate, simulate_with};
use crate::error::SimError;
use crate::experiment::{AvailabilitySource, ExperimentKind, ExperimentSpec, ImportedTraces};
use crate::jobs::{Job, JobProfile};
use crate::metrics::metrics;
use crate::report::{RunResult, render};

const DD: BalancerSpec = BalancerSpec::Hash(HashVariant::Dhht {
    peers: placement::Hashing::Det,
    processes: placement::Hashing::Det,
});
const WS_HEAD: BalancerSpec = BalancerSpec::Stealing(StealFrom::Head);

/// A scripted balancer for hand-computed scenarios: process `pid` of job
/// `job` goes to `place(job, pid)`; hosted processes share the peer.
struct Pinned(fn(i64, u32) -> PeerId);

impl Balancer for Pinned {
    fn shares_power(&self) -> bool {
        true
    }
    fn set_peer(&mut self, _: PeerId, _: f64, _: bool) -> Result<Vec<Move>, SimError> {
        Ok(Vec::new())
    }
    fn remove_peer(&mut self, _: PeerId) -> Vec<Move> {
        Vec::new()
    }
    fn release(&mut self, processes: &[ProcessKey]) -> Vec<Move> {
        processes
            .iter()
            .map(|&process| Move {
                process,
                from: None,
                to: Some((self.0)(process.job, process.pid)),
            })
            .collect()
    }
    fn finish(&mut self, _: ProcessKey) {}
    fn rebalance(&mut self) -> Vec<Move> {
        Vec::new()
    }
    fn running_on(&self, _: PeerId) -> Option<ProcessKey> {
        None
    }
}

fn job(id: i64, release: f64, parallelism: u32, length: f64) -> Job {
    Job {
        id,
        release,
        parallelism,
        length,
    }
}

fn config<'a>(
    balancer: BalancerSpec,
    factors: &'a [f64],
    availability: &'a [Availability],
    jobs: &'a [Job],
) -> RunConfig<'a> {
    RunConfig {
        balancer,
        factors,
        availability,
        jobs,
        overload: f64::INFINITY,
        horizon: f64::INFINITY,
        hysteresis: 0.0,
        bulk_window: 30.0,
        seed: 1,
        peer_id_base: 0,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// A small type-B-like stream: HPC2N scaled to `peers`, over `days`.
fn small_stream(peers: usize, days: f64, seed: u64) -> Vec<Job> {
    crate::jobs::job_stream(JobProfile::SdscBlue, peers, days * 86_400.0, seed)
}

#[test]
fn section_4_1_two_peers_three_processes_have_hand_computed_stretch_factors() {
    // Peer 0: factor 1, hosts job 0's processes 0 and 1 (each gets 0.5).
    // Peer 1: factor 2, hosts job 0's process 2 and later job 1.
    // Limit = 2 peers × overload 1: job 1 (released at 10) waits until
    // job 0's last processes finish at 120, then takes 30 / 2 = 15 s.
    let factors = [1.0, 2.0];
    let jobs = [job(0, 0.0, 3, 60.0), job(1, 10.0, 1, 30.0)];
    let mut cfg = config(DD, &factors, &[], &jobs);
    cfg.overload = 1.0;
    let place = |job: i64, pid: u32| if job == 0 && pid < 2 { 0 } else { 1 };
    let out = simulate_with(&cfg, Box::new(Pinned(place))).unwrap();
    let fin: Vec<f64> = out.processes.iter().map(|p| p.finished.unwrap()).collect();
    assert_eq!(fin, vec![120.0, 120.0, 30.0, 135.0]);
    assert_eq!(out.jobs[0].finished, Some(120.0));
    assert_eq!(out.jobs[1].admitted, Some(120.0));
    let m = metrics(&out, 0.0);
    // Processes: (120/60 + 120/60 + 30/60 + 15/30) / 4; jobs: (120/60 + 15/30) / 2.
    assert!(close(m.process_stretch, 1.25), "{}", m.process_stretch);
    assert!(close(m.job_stretch, 1.25), "{}", m.job_stretch);
    assert!(close(m.pending.avg, 55.0), "{:?}", m.pending);
    // Peer 0 busy for 120 s at power 1; peer 1 for 30 s + 15 s at power 2.
    assert!(close(out.peers[0].utilized, 120.0) && close(out.peers[1].utilized, 90.0));
    assert!(close(m.utilized, 3.0 * 60.0 + 30.0));
    // The warm-up hides job 0 (released before 5 s) from the measurement.
    let late = metrics(&out, 5.0);
    assert_eq!((late.jobs_measured, late.processes_finished), (1, 1));
    assert!(close(late.job_stretch, 0.5));
}

#[test]
fn section_4_2_1_work_stealing_runs_one_process_per_peer_at_a_time() {
    // 2 equal peers, 3 processes of 60 s: a round of releases goes to two
    // distinct peers, the third queues behind one of them and nobody can
    // steal it (it is the only waiting one only after the head finishes).
    // One at a time: finishes at 60, 60, 120 — sharing would give 120 / 60.
    let factors = [1.0, 1.0];
    let jobs = [job(0, 0.0, 3, 60.0)];
    for seed in 0..20 {
        let mut cfg = config(WS_HEAD, &factors, &[], &jobs);
        cfg.seed = seed;
        let out = simulate(&cfg).unwrap();
        let mut fin: Vec<f64> = out.processes.iter().map(|p| p.finished.unwrap()).collect();
        fin.sort_by(f64::total_cmp);
        assert_eq!(fin, vec![60.0, 60.0, 120.0], "seed {seed}");
        let m = metrics(&out, 0.0);
        assert!(close(m.process_stretch, 4.0 / 3.0) && close(m.job_stretch, 2.0));
    }
    // The same on a bigger run: no peer ever ran two processes at once,
    // while the sharing balancers do.
    let factors = crate::hardware::draw_factors(10, 3);
    let jobs = small_stream(10, 1.0, 3);
    for b in [WS_HEAD, BalancerSpec::Stealing(StealFrom::Tail), DD] {
        let mut cfg = config(b, &factors, &[], &jobs);
        cfg.overload = 4.0;
        let out = simulate(&cfg).unwrap();
        let most = out.peers.iter().map(|p| p.max_running).max().unwrap();
        if b.is_stealing() {
            assert_eq!(most, 1, "{b}");
        } else {
            assert!(most > 1, "{b}");
        }
    }
}

fn conservation_holds(out: &RunOutcome, jobs: &[Job]) {
    let work: f64 = out.processes.iter().map(|p| p.work).sum();
    let utilized: f64 = out.peers.iter().map(|p| p.utilized).sum();
    for p in &out.peers {
        assert!(p.utilized <= p.available * (1.0 + 1e-9) + 1e-6, "{p:?}");
    }
    // Every utilized CPU second went to some process.
    assert!(
        (work - utilized).abs() <= 1e-6 * utilized.max(1.0),
        "work {work} utilized {utilized}"
    );
    // A finished process received exactly its length.
    for p in out.processes.iter().filter(|p| p.finished.is_some()) {
        assert!(close(p.work, p.length), "{p:?}");
    }
    let total: f64 = jobs
        .iter()
        .map(|j| f64::from(j.parallelism) * j.length)
        .sum();
    if out.jobs.iter().all(|j| j.finished.is_some()) {
        assert!(
            (work - total).abs() <= 1e-6 * total,
            "work {work} total {total}"
        );
    }
}

#[test]
fn section_4_4_1_utilized_cpu_time_is_conserved_for_every_balancer() {
    let factors = crate::hardware::draw_factors(12, 9);
    let jobs = small_stream(12, 1.0, 9);
    let traces = crate::availability::generate(Profile::Notebook, 12, 86_400 * 3, 9);
    for b in BalancerSpec::all() {
        for availability in [&[][..], &traces[..]] {
            let mut cfg = config(b, &factors, availability, &jobs);
            cfg.overload = 2.0;
            let out = simulate(&cfg).unwrap();
            conservation_holds(&out, &jobs);
            if availability.is_empty() {
                let m = metrics(&out, 0.0);
                assert!(close(
                    m.utilized,
                    jobs.iter()
                        .map(|j| f64::from(j.parallelism) * j.length)
                        .sum()
                ));
            }
        }
    }
}

#[test]
fn section_4_4_2_every_released_job_finishes_in_type_b_given_enough_time() {
    let factors = crate::hardware::draw_factors(16, 4);
    let jobs = crate::jobs::job_stream(JobProfile::LlnlAtlas, 16, 2.0 * 86_400.0, 4);
    assert!(
        jobs.iter().any(|j| j.parallelism > 16),
        "some job is wider than the system"
    );
    for b in BalancerSpec::all() {
        for overload in [1.0, 4.0] {
            let mut cfg = config(b, &factors, &[], &jobs);
            cfg.overload = overload;
            let out = simulate(&cfg).unwrap();
            assert!(
                out.jobs.iter().all(|j| j.finished.is_some()),
                "{b} overload {overload}"
            );
            assert!(
                out.processes.len() == jobs.iter().map(|j| j.parallelism as usize).sum::<usize>()
            );
            conservation_holds(&out, &jobs);
        }
    }
}

#[test]
fn section_4_4_ready_queue_admits_nothing_while_running_processes_reach_the_limit() {
    let factors = crate::hardware::draw_factors(20, 5);
    let jobs = small_stream(20, 2.0, 5);
    for b in [DD, WS_HEAD] {
        for overload in [1.0, 4.0] {
            let mut cfg = config(b, &factors, &[], &jobs);
            cfg.overload = overload;
            let out = simulate(&cfg).unwrap();
            let limit = 20.0 * overload;
            assert!(
                out.admissions
                    .iter()
                    .all(|a| (a.running_before as f64) < limit && a.limit == limit)
            );
            // Not vacuous: the queue was used.
            assert!(
                out.jobs.iter().any(|j| j.admitted.unwrap() > j.job.release),
                "{b} {overload}"
            );
            // Replay the running count: it exceeds the limit only by the last
            // admitted job, which had been admitted below it.
            let mut events: Vec<(f64, i64)> = out
                .admissions
                .iter()
                .map(|a| (a.time, i64::from(a.size)))
                .collect();
            events.extend(out.processes.iter().map(|p| (p.finished.unwrap(), -1)));
            events.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
            let widest = jobs.iter().map(|j| j.parallelism).max().unwrap();
            let mut running = 0i64;
            for (_, d) in events {
                running += d;
                assert!((running as f64) < limit + f64::from(widest));
            }
        }
    }
}

#[test]
fn same_seed_and_parameters_give_an_identical_report() {
    let mut spec = ExperimentSpec::defaults(ExperimentKind::C);
    spec.peers = 10;
    spec.days = 1.0;
    spec.job_profiles = vec![JobProfile::Hpc2n];
    spec.availability = vec![AvailabilitySource::Profile(Profile::Pool)];
    let report = |spec: &ExperimentSpec| {
        let mut results = Vec::new();
        for group in spec.groups() {
            let inputs = spec.inputs(&group);
            for (overload, b) in spec.runs() {
                let out = simulate(&spec.config(&inputs, overload, b)).unwrap();
                results.push(RunResult {
                    group,
                    overload,
                    metrics: metrics(&out, spec.warmup_secs),
                });
            }
        }
        render(spec, &results, "test")
    };
    let a = report(&spec);
    assert_eq!(a, report(&spec));
    assert!(
        a.iter()
            .any(|f| f.path == "README.md" && f.contents.contains("| seed | 20090101 |"))
    );
    assert!(a.iter().any(|f| f.path.ends_with("-pending.svg")));
    spec.seed += 1;
    let b = report(&spec);
    assert_ne!(a[0].contents, b[0].contents);
}

#[test]
fn section_4_4_1_bulk_mode_merges_a_quick_back_and_forth_into_nothing() {
    // Peer 1 is off for 10 s (inside the 30 s window) or 100 s (outside):
    // its processes go to peer 0 and come back.
    let factors = [1.0, 1.0];
    let jobs = [job(0, 0.0, 16, f64::INFINITY)];
    for (off, bulk_expected) in [(10u64, false), (100, true)] {
        let traces = [
            Availability::full(),
            Availability::from_steps(vec![(0, 1.0), (1000, 0.0), (1000 + off, 1.0)]).unwrap(),
        ];
        let mut cfg = config(DD, &factors, &traces, &jobs);
        cfg.horizon = 5000.0;
        let out = simulate(&cfg).unwrap();
        let moved: Vec<_> = out.processes.iter().filter(|p| p.migrations > 0).collect();
        assert!(!moved.is_empty());
        for p in &moved {
            assert_eq!(p.migrations, 2);
            assert_eq!(p.bulk_migrations, if bulk_expected { 2 } else { 0 });
        }
        conservation_holds(&out, &jobs);
    }
}

#[test]
fn hysteresis_hides_small_power_changes_from_the_balancer() {
    // Peer 0: 1 → 0.6 (−40 %) → 1 → 0.2 (−80 %). Multiple hashing moves
    // some of 100 processes on any power change.
    let factors = [1.0; 5];
    let jobs = [job(0, 0.0, 100, f64::INFINITY)];
    let mut traces =
        vec![Availability::from_steps(vec![(0, 1.0), (100, 0.6), (200, 1.0), (300, 0.2)]).unwrap()];
    traces.resize(5, Availability::full());
    let migrations = |h: f64| {
        let mut cfg = config(
            BalancerSpec::Hash(HashVariant::Multi),
            &factors,
            &traces,
            &jobs,
        );
        cfg.horizon = 1000.0;
        cfg.hysteresis = h;
        let out = simulate(&cfg).unwrap();
        conservation_holds(&out, &jobs);
        out.processes.iter().map(|p| p.migrations).sum::<u32>()
    };
    let all = migrations(0.0);
    let large_only = migrations(0.5);
    assert!(all > large_only, "{all} vs {large_only}");
    assert!(large_only > 0, "the drop by 80 % exceeds 50 % and is told");
    assert_eq!(migrations(0.9), 0);
}

#[test]
fn invalid_parameters_are_typed_errors_that_say_what_to_do() {
    let factors = [1.0];
    let jobs = [job(0, 0.0, 1, f64::INFINITY)];
    let cfg = config(DD, &factors, &[], &jobs);
    let e = simulate(&cfg).unwrap_err();
    assert!(
        matches!(
            e,
            SimError::InvalidParameter {
                name: "horizon",
                ..
            }
        ),
        "{e}"
    );
    let mut cfg = config(DD, &[], &[], &[]);
    cfg.horizon = 1.0;
    assert!(simulate(&cfg).is_err());
    let traces = [Availability::full(), Availability::full()];
    let mut cfg = config(DD, &factors, &traces, &jobs);
    cfg.horizon = 1.0;
    assert_eq!(
        simulate(&cfg).unwrap_err(),
        SimError::TraceCount {
            peers: 1,
            traces: 2
        }
    );
    let mut spec = ExperimentSpec::defaults(ExperimentKind::A);
    spec.balancers.push(WS_HEAD);
    assert!(
        spec.validate()
            .unwrap_err()
            .to_string()
            .contains("hash-based")
    );
    let e = "ws-middle".parse::<BalancerSpec>().unwrap_err().to_string();
    assert!(e.contains("ws-head") && e.contains("dd"), "{e}");
}

/// Reference model: one peer of power `w`, processor sharing, stepped from
/// event to event with plain remaining-work arrays.
fn processor_sharing(w: f64, jobs: &[Job]) -> Vec<f64> {
    let mut rem: Vec<(f64, f64, usize)> = Vec::new(); // (release, remaining, index)
    let mut finish = vec![f64::NAN; jobs.iter().map(|j| j.parallelism as usize).sum()];
    let mut pending: Vec<(f64, f64, usize)> = Vec::new();
    let mut i = 0;
    for j in jobs {
        for _ in 0..j.parallelism {
            pending.push((j.release, j.length, i));
            i += 1;
        }
    }
    let mut t = 0.0;
    let mut next = 0;
    while next < pending.len() || !rem.is_empty() {
        let arrival = pending.get(next).map_or(f64::INFINITY, |p| p.0);
        let n = rem.len() as f64;
        let first_done = rem.iter().map(|r| r.1).fold(f64::INFINITY, f64::min) * n / w;
        let dt = (arrival - t).min(first_done);
        for r in &mut rem {
            r.1 -= dt * w / n;
        }
        t += dt;
        rem.retain(|r| {
            let done = r.1 <= 1e-9;
            if done {
                finish[r.2] = t;
            }
            !done
        });
        while next < pending.len() && pending[next].0 <= t {
            rem.push(pending[next]);
            next += 1;
        }
    }
    finish
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn one_peer_matches_a_processor_sharing_reference(
        factor in 0.5f64..6.0,
        raw in prop::collection::vec((0.0f64..500.0, 1u32..4, 1.0f64..400.0), 1..8),
    ) {
        let mut raw = raw;
        raw.sort_by(|a, b| a.0.total_cmp(&b.0));
        let jobs: Vec<Job> = raw.iter().enumerate().map(|(i, &(r, k, l))| job(i as i64, r, k, l)).collect();
        let factors = [factor];
        let out = simulate(&config(DD, &factors, &[], &jobs)).unwrap();
        let expected = processor_sharing(factor, &jobs);
        for (p, e) in out.processes.iter().zip(&expected) {
            let f = p.finished.unwrap();
            prop_assert!((f - e).abs() <= 1e-6 * e.max(1.0), "{f} vs {e}");
        }
    }

    #[test]
    fn random_small_runs_conserve_cpu_time_and_finish_every_job(
        seed in 0u64..1000,
        peers in 1usize..6,
        b in 0usize..8,
        overload in prop::sample::select(vec![1.0, 4.0]),
        steps in prop::collection::vec((1u64..20_000, 0.0f64..1.0), 0..12),
    ) {
        let factors = crate::hardware::draw_factors(peers, seed);
        let mut jobs = crate::jobs::job_stream(JobProfile::Hpc2n, 100, 20_000.0, seed);
        jobs.truncate(12);
        let mut steps = steps;
        steps.sort_by_key(|s| s.0);
        steps.dedup_by_key(|s| s.0);
        let mut first = vec![(0u64, 1.0)];
        first.extend(steps);
        // Peer 0 varies (and is switched on again at the end); the others are full.
        first.push((30_000, 1.0));
        let mut traces = vec![Availability::from_steps(first).unwrap()];
        traces.resize(peers, Availability::full());
        let mut cfg = config(BalancerSpec::all()[b], &factors, &traces, &jobs);
        cfg.overload = overload;
        cfg.seed = seed;
        let out = simulate(&cfg).unwrap();
        prop_assert!(out.jobs.iter().all(|j| j.finished.is_some()));
        conservation_holds(&out, &jobs);
        prop_assert_eq!(out.clone(), simulate(&cfg).unwrap());
    }
}

#[test]
fn section_4_2_4_peer_ids_select_the_random_ring_but_not_the_golden_one() {
    let factors = crate::hardware::draw_factors(12, 2);
    let jobs = small_stream(12, 1.0, 2);
    let run = |b: BalancerSpec, base: i64| {
        let mut cfg = config(b, &factors, &[], &jobs);
        cfg.overload = 2.0;
        cfg.horizon = 86_400.0;
        cfg.peer_id_base = base;
        let out = simulate(&cfg).unwrap();
        out.processes.iter().map(|p| p.finished).collect::<Vec<_>>()
    };
    // Det./Det.: positions come from join order, not from the ids.
    assert_eq!(run(DD, 0), run(DD, 1000));
    let rr = BalancerSpec::Hash(HashVariant::Dhht {
        peers: placement::Hashing::Rnd,
        processes: placement::Hashing::Rnd,
    });
    assert_ne!(run(rr, 0), run(rr, 1000));
}

#[test]
fn imported_csv_traces_drive_a_type_c_run_and_are_named_in_the_report() {
    // Three hosts for a day: one always on, one off at night, one half busy.
    let mut csv = String::from("timestamp,host,idle_percent\n");
    for t in (0..86_400).step_by(300) {
        let night = !(28_800..64_800).contains(&t);
        csv += &format!(
            "{t},a,100\n{t},b,{}\n{t},c,50\n",
            if night { 0 } else { 90 }
        );
    }
    let hosts = crate::availability::from_csv(&csv).unwrap();
    let mut spec = ExperimentSpec::defaults(ExperimentKind::C);
    spec.peers = 3;
    spec.days = 1.0;
    spec.job_profiles = vec![JobProfile::Hpc2n];
    spec.overloads = vec![4.0];
    spec.balancers = vec![DD, WS_HEAD];
    spec.availability = vec![AvailabilitySource::Imported];
    assert!(spec.validate().is_err(), "no traces imported yet");
    spec.imported = Some(ImportedTraces {
        name: "test.csv".into(),
        hosts: hosts.into_iter().map(|(_, a)| a).collect(),
    });
    spec.validate().unwrap();
    let results = crate::experiment::run_experiment(&spec, 2, &mut |_| {}).unwrap();
    assert_eq!(results.len(), 2);
    for r in &results {
        // Peer b is off at night and c is half available: less than 3 peers' worth.
        assert!(r.metrics.available < 3.0 * 86_400.0 * 6.2);
        assert!(r.metrics.utilized <= r.metrics.available * (1.0 + 1e-9));
    }
    let files = render(&spec, &results, "test");
    assert!(files[0].contents.contains("test.csv (3 hosts"));
    assert!(
        files
            .iter()
            .any(|f| f.path == "c-trace-hpc2n-o4-pending.svg")
    );
    spec.peers = 4;
    assert!(
        spec.validate()
            .unwrap_err()
            .to_string()
            .contains("at most as many peers")
    );
}
