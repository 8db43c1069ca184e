use super::*;
use proptest::prelude::*;

const DAY: u64 = 86_400;
const TWO_WEEKS: u64 = 14 * DAY;

fn avail(steps: &[(u64, f64)]) -> Availability {
    Availability::from_steps(steps.to_vec()).unwrap()
}

/// Reference integral: second by second.
fn brute_integral(a: &Availability, from: u64, to: u64) -> f64 {
    (from..to).map(|t| a.at(t)).sum()
}

/// Reference Gini: mean absolute difference over all ordered pairs / (2 · mean).
fn brute_gini(x: &[f64]) -> Option<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    if mean <= 0.0 {
        return None;
    }
    let diff: f64 = x
        .iter()
        .flat_map(|a| x.iter().map(move |b| (a - b).abs()))
        .sum();
    Some(diff / (n * n) / (2.0 * mean))
}

fn trace_strategy() -> impl Strategy<Value = Availability> {
    prop::collection::vec((1u64..5_000, 0.0f64..=1.0), 0..20).prop_map(|deltas| {
        let mut t = 0;
        let mut steps = vec![(0, 0.5)];
        for (d, v) in deltas {
            t += d;
            steps.push((t, v));
        }
        Availability::from_steps(steps).unwrap()
    })
}

// ---------------------------------------------------------------- Availability

#[test]
fn full_is_always_one() {
    let a = Availability::full();
    assert_eq!(a.steps(), &[(0, 1.0)]);
    assert_eq!(a.at(0), 1.0);
    assert_eq!(a.at(u64::MAX), 1.0);
    assert_eq!(a.mean(TWO_WEEKS), 1.0);
    assert_eq!(a.integral(10, 70), 60.0);
}

#[test]
fn at_switches_exactly_at_step_times() {
    let a = avail(&[(0, 0.0), (30, 0.5), (90, 1.0)]);
    assert_eq!(a.at(0), 0.0);
    assert_eq!(a.at(29), 0.0);
    assert_eq!(a.at(30), 0.5);
    assert_eq!(a.at(89), 0.5);
    assert_eq!(a.at(90), 1.0);
    assert_eq!(a.at(1_000_000), 1.0);
}

#[test]
fn mean_and_integral_of_a_known_trace() {
    let a = avail(&[(0, 0.0), (30, 0.5), (90, 1.0)]);
    assert_eq!(a.integral(0, 120), 0.5 * 60.0 + 30.0);
    assert_eq!(a.mean(120), 0.5);
    assert_eq!(a.integral(60, 100), 0.5 * 30.0 + 10.0);
    assert_eq!(a.integral(100, 100), 0.0);
    assert_eq!(a.integral(100, 50), 0.0);
    assert_eq!(a.mean(0), 0.0, "duration 0 gives the value at 0");
}

#[test]
fn from_steps_merges_equal_neighbours() {
    let a = avail(&[(0, 0.5), (30, 0.5), (60, 0.7), (90, 0.7), (120, 0.5)]);
    assert_eq!(a.steps(), &[(0, 0.5), (60, 0.7), (120, 0.5)]);
    assert_eq!(a, avail(&[(0, 0.5), (60, 0.7), (120, 0.5)]));
}

#[test]
fn from_steps_rejects_invalid_traces() {
    assert_eq!(Availability::from_steps(vec![]), Err(TraceError::NoSteps));
    assert_eq!(
        Availability::from_steps(vec![(5, 1.0)]),
        Err(TraceError::FirstStepNotAtZero { start: 5 })
    );
    assert_eq!(
        Availability::from_steps(vec![(0, 1.0), (60, 0.5), (60, 0.2)]),
        Err(TraceError::StepsNotIncreasing {
            index: 2,
            time: 60,
            previous: 60
        })
    );
    assert!(matches!(
        Availability::from_steps(vec![(0, 1.0), (60, 0.5), (30, 0.2)]),
        Err(TraceError::StepsNotIncreasing { index: 2, .. })
    ));
    for bad in [-0.01, 1.01, f64::NAN, f64::INFINITY] {
        let err = Availability::from_steps(vec![(0, 1.0), (30, bad)]).unwrap_err();
        assert!(
            matches!(err, TraceError::StepValueOutOfRange { index: 1, .. }),
            "{bad}: {err}"
        );
    }
}

proptest! {
    #[test]
    fn integral_matches_second_by_second_sum(a in trace_strategy(), from in 0u64..30_000, len in 0u64..30_000) {
        let exact = a.integral(from, from + len);
        let brute = brute_integral(&a, from, from + len);
        prop_assert!((exact - brute).abs() < 1e-6 * brute.max(1.0), "{exact} vs {brute}");
    }

    #[test]
    fn at_matches_linear_scan(a in trace_strategy(), t in 0u64..120_000) {
        let expected = a.steps().iter().rev().find(|&&(s, _)| s <= t).unwrap().1;
        prop_assert_eq!(a.at(t), expected);
    }
}

// ---------------------------------------------------------------- Profile

#[test]
fn profile_names_round_trip() {
    for p in Profile::ALL {
        assert_eq!(p.slug().parse::<Profile>(), Ok(p));
        assert_eq!(p.to_string(), p.slug());
    }
    assert_eq!(" Office ".parse::<Profile>(), Ok(Profile::Office));
    let err = "notebooks".parse::<Profile>().unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("\"notebooks\"") && msg.contains("full, office, pool, notebook"),
        "{msg}"
    );
}

// ---------------------------------------------------------------- generate

/// Checks the [`Availability`] invariants plus the 30 s resolution of synthetic traces.
fn assert_well_formed(a: &Availability) {
    let steps = a.steps();
    assert_eq!(steps[0].0, 0);
    for w in steps.windows(2) {
        assert!(w[0].0 < w[1].0, "sorted");
        assert_ne!(w[0].1, w[1].1, "merged");
    }
    for &(t, v) in steps {
        assert_eq!(t % SAMPLE_SECS, 0, "30 s resolution");
        assert!((0.0..=1.0).contains(&v), "{v} in [0, 1]");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn generate_is_deterministic_well_formed_and_prefix_stable(
        profile in prop::sample::select(Profile::ALL.to_vec()),
        hosts in 1usize..5,
        days in 1u64..4,
        seed in any::<u64>(),
    ) {
        let duration = days * DAY;
        let a = generate(profile, hosts, duration, seed);
        prop_assert_eq!(a.len(), hosts);
        prop_assert_eq!(&a, &generate(profile, hosts, duration, seed));
        for h in &a {
            assert_well_formed(h);
            prop_assert!(h.steps().last().unwrap().0 < duration);
        }
        // Host i does not depend on the group size.
        let more = generate(profile, hosts + 2, duration, seed);
        prop_assert_eq!(&more[..hosts], &a[..]);
        // A shorter duration gives a prefix.
        let short = generate(profile, hosts, duration / 2, seed);
        for (s, l) in short.iter().zip(&a) {
            let prefix: Vec<_> = l.steps().iter().copied().filter(|&(t, _)| t < duration / 2).collect();
            prop_assert_eq!(s.steps(), &prefix[..]);
        }
    }
}

#[test]
fn different_seeds_give_different_hosts() {
    let a = generate(Profile::Notebook, 3, 2 * DAY, 1);
    let b = generate(Profile::Notebook, 3, 2 * DAY, 2);
    assert_ne!(a, b);
    assert_ne!(a[0], a[1], "hosts of one group differ");
}

#[test]
fn full_profile_is_always_available() {
    let hosts = generate(Profile::Full, 4, TWO_WEEKS, 9);
    assert!(hosts.iter().all(|h| *h == Availability::full()));
    let s = stats(&hosts, TWO_WEEKS);
    assert_eq!(
        (s.mean_availability, s.on_fraction, s.changes_per_hour),
        (1.0, 1.0, 0.0)
    );
}

/// Seeds used for the profile-group checks: the statistics of 100 hosts vary from seed to seed,
/// so the §4.3.1 numbers are checked for several.
const SEEDS: [u64; 3] = [1, 2, 2008];

fn group(profile: Profile, seed: u64) -> ProfileStats {
    stats(&generate(profile, 100, TWO_WEEKS, seed), TWO_WEEKS)
}

fn assert_near(what: &str, value: f64, target: f64, tolerance: f64) {
    assert!(
        (value - target).abs() <= tolerance,
        "{what}: {value:.3} is not within {target} ± {tolerance}"
    );
}

#[test]
fn section_4_3_1_office_pcs() {
    for seed in SEEDS {
        let s = group(Profile::Office, seed);
        assert_near("office mean availability", s.mean_availability, 0.70, 0.05);
        assert_near("office P(>0.9 | on)", s.p_above_90_when_on, 0.90, 0.05);
        // Table 4.4: from hardly ever on to nearly always available.
        assert!(s.host_mean_min < 0.25 && s.host_mean_max > 0.8, "{s:?}");
    }
}

#[test]
fn section_4_3_1_pool_pcs() {
    for seed in SEEDS {
        let s = group(Profile::Pool, seed);
        assert_near("pool mean availability", s.mean_availability, 0.45, 0.05);
        assert_near("pool P(>0.9 | on)", s.p_above_90_when_on, 0.90, 0.05);
        // Table 4.4: the pool's least available host still has a sizeable share.
        assert!(s.host_mean_min > 0.02 && s.host_mean_max > 0.7, "{s:?}");
    }
}

#[test]
fn section_4_3_1_notebooks() {
    for seed in SEEDS {
        let s = group(Profile::Notebook, seed);
        assert_near(
            "notebook mean availability",
            s.mean_availability,
            0.30,
            0.05,
        );
        assert_near("notebook P(>0.8 | on)", s.p_above_80_when_on, 0.75, 0.05);
        // Table 4.4: from almost never on to on most of the time.
        assert!(s.host_mean_min < 0.05 && s.host_mean_max > 0.55, "{s:?}");
    }
}

#[test]
fn table_4_1_orderings() {
    for seed in SEEDS {
        let office = group(Profile::Office, seed);
        let pool = group(Profile::Pool, seed);
        let notebook = group(Profile::Notebook, seed);
        let all = format!("office {office:?}\npool {pool:?}\nnotebook {notebook:?}");

        // Availability: high / medium / low.
        assert!(office.mean_availability > pool.mean_availability, "{all}");
        assert!(pool.mean_availability > notebook.mean_availability, "{all}");
        // Diversity: low / medium / high.
        assert!(notebook.diversity > pool.diversity + 0.05, "{all}");
        assert!(pool.diversity > office.diversity + 0.1, "{all}");
        // Uniformity: high / low / low (fewer changes = more uniform).
        assert!(
            pool.changes_per_hour > 1.5 * office.changes_per_hour,
            "{all}"
        );
        assert!(
            notebook.changes_per_hour > 1.5 * office.changes_per_hour,
            "{all}"
        );
        // Daytime pattern: significant / weak / significant.
        assert!(office.daytime_contrast > 0.1, "{all}");
        assert!(notebook.daytime_contrast > 0.5, "{all}");
        assert!(pool.daytime_contrast.abs() < 0.1, "{all}");
        assert!(
            office.daytime_contrast > pool.daytime_contrast.abs() + 0.05,
            "{all}"
        );
        // Weekend pattern: significant / no / significant.
        assert!(office.weekend_contrast > 0.2, "{all}");
        assert!(notebook.weekend_contrast > 0.2, "{all}");
        assert!(pool.weekend_contrast.abs() < 0.05, "{all}");
    }
}

// ---------------------------------------------------------------- stats

#[test]
fn stats_of_known_traces() {
    // Host a: off for an hour, then 0.95 for an hour. Host b: 0.85 for an hour, 0.8 (a change of
    // only 0.05, not counted) for an hour.
    let a = avail(&[(0, 0.0), (3600, 0.95)]);
    let b = avail(&[(0, 0.85), (3600, 0.8)]);
    let s = stats(&[a, b], 7200);
    assert_eq!(s.hosts, 2);
    assert!((s.mean_availability - (0.95 + 0.85 + 0.8) / 4.0).abs() < 1e-12);
    assert_eq!(s.on_fraction, 0.75);
    assert!((s.mean_when_on - (0.95 + 0.85 + 0.8) / 3.0).abs() < 1e-12);
    assert!((s.p_above_90_when_on - 1.0 / 3.0).abs() < 1e-12);
    assert!(
        (s.p_above_80_when_on - 2.0 / 3.0).abs() < 1e-12,
        "0.8 is not above 0.8"
    );
    assert_eq!(
        s.changes_per_hour,
        1.0 / 4.0,
        "one change in four host-hours"
    );
    assert!((s.host_mean_min - 0.475).abs() < 1e-12);
    assert!((s.host_mean_max - 0.825).abs() < 1e-12);
    // First hour: [0, 0.85] has Gini 0.5; second hour: [0.95, 0.8] has Gini 0.15 / 3.5.
    let expected = (0.5 + 0.15 / (4.0 * 0.875)) / 2.0;
    assert!(
        (s.diversity - expected).abs() < 1e-12,
        "{} vs {expected}",
        s.diversity
    );
    // Both hosts change exactly once at the same time, in opposite directions.
    assert!(
        (s.mean_correlation + 1.0).abs() < 1e-9,
        "{}",
        s.mean_correlation
    );
    assert!(
        s.daytime_contrast.is_nan() && s.weekend_contrast.is_nan(),
        "two hours only"
    );
}

#[test]
fn stats_ignores_steps_after_the_duration() {
    let a = avail(&[(0, 1.0), (3600, 0.0)]);
    let s = stats(std::slice::from_ref(&a), 3600);
    assert_eq!((s.mean_availability, s.changes_per_hour), (1.0, 0.0));
}

#[test]
fn identical_hosts_have_no_diversity_and_full_correlation() {
    let h = generate(Profile::Notebook, 1, 3 * DAY, 4).remove(0);
    let s = stats(&[h.clone(), h.clone(), h], 3 * DAY);
    assert_eq!(s.diversity, 0.0);
    assert!((s.mean_correlation - 1.0).abs() < 1e-9);
}

#[test]
fn constant_hosts_have_undefined_correlation() {
    let s = stats(&[Availability::full(), Availability::full()], DAY);
    assert!(s.mean_correlation.is_nan());
    assert_eq!(s.diversity, 0.0);
}

#[test]
fn stats_of_nothing_is_nan() {
    let s = stats(&[], TWO_WEEKS);
    assert_eq!(s.hosts, 0);
    assert!(s.mean_availability.is_nan() && s.diversity.is_nan());
    let s = stats(&[Availability::full()], 0);
    assert!(s.mean_availability.is_nan());
}

#[test]
fn weekend_and_daytime_contrast_detect_a_workday_office_schedule() {
    // On 09:00–17:00 Monday to Friday, off otherwise.
    let mut steps = vec![(0, 0.0)];
    for day in 0..5 {
        steps.push((day * DAY + 9 * 3600, 1.0));
        steps.push((day * DAY + 17 * 3600, 0.0));
    }
    let s = stats(&[avail(&steps)], 7 * DAY);
    let mean = 40.0 / 168.0;
    assert!((s.mean_availability - mean).abs() < 1e-12);
    assert!(
        (s.daytime_contrast - 1.0 / mean).abs() < 1e-9,
        "{}",
        s.daytime_contrast
    );
    assert!(
        (s.weekend_contrast - (8.0 / 24.0) / mean).abs() < 1e-9,
        "{}",
        s.weekend_contrast
    );
}

#[test]
fn bucket_size_grows_for_long_traces() {
    assert_eq!(stats_bucket_secs(0), 300);
    assert_eq!(stats_bucket_secs(TWO_WEEKS), 300);
    assert_eq!(stats_bucket_secs(28 * DAY), 300);
    assert_eq!(stats_bucket_secs(28 * DAY + 1), 600);
    assert_eq!(stats_bucket_secs(365 * DAY), 300 * 14);
}

proptest! {
    #[test]
    fn gini_matches_pairwise_definition(x in prop::collection::vec(0.0f64..=1.0, 1..30)) {
        let expected = brute_gini(&x);
        let got = gini(&mut x.clone());
        match (got, expected) {
            (Some(g), Some(e)) => prop_assert!((g - e).abs() < 1e-9, "{g} vs {e}"),
            (g, e) => prop_assert_eq!(g, e),
        }
    }

    #[test]
    fn stats_mean_matches_host_means(hosts in prop::collection::vec(trace_strategy(), 1..5), duration in 1u64..60_000) {
        let s = stats(&hosts, duration);
        let expected = hosts.iter().map(|h| h.mean(duration)).sum::<f64>() / hosts.len() as f64;
        prop_assert!((s.mean_availability - expected).abs() < 1e-9);
        prop_assert!(s.on_fraction >= s.mean_availability - 1e-12);
        prop_assert!(s.host_mean_min <= s.mean_availability + 1e-12);
        prop_assert!(s.host_mean_max >= s.mean_availability - 1e-12);
        prop_assert!(s.diversity.is_nan() || (0.0..1.0).contains(&s.diversity));
        // The aggregate curve integrates to the same mean.
        let curve = aggregate_curve(&hosts, duration, 700);
        let area: f64 = curve.iter().map(|&(t, v)| v * ((t + 700).min(duration) - t) as f64).sum();
        prop_assert!((area / duration as f64 - expected).abs() < 1e-9);
    }
}

#[test]
fn aggregate_curve_of_known_traces() {
    let a = avail(&[(0, 0.0), (3600, 1.0)]);
    let b = avail(&[(0, 1.0)]);
    assert_eq!(
        aggregate_curve(&[a.clone(), b], 3 * 3600 + 1800, 3600),
        vec![(0, 0.5), (3600, 1.0), (7200, 1.0), (10800, 1.0)]
    );
    assert!(aggregate_curve(&[], 3600, 60).is_empty());
    assert!(aggregate_curve(&[a], 3600, 0).is_empty());
}

// ---------------------------------------------------------------- CSV

fn named(hosts: Vec<Availability>) -> Vec<(String, Availability)> {
    hosts
        .into_iter()
        .enumerate()
        .map(|(i, a)| (format!("host{i:03}"), a))
        .collect()
}

#[test]
fn csv_round_trips_synthetic_profiles() {
    for profile in Profile::ALL {
        let hosts = named(generate(profile, 6, 3 * DAY, 77));
        let text = to_csv(&hosts);
        assert!(text.starts_with("timestamp,host,idle\n"));
        assert_eq!(from_csv(&text).unwrap(), hosts, "{profile}");
    }
}

#[test]
fn csv_round_trips_odd_host_names() {
    let hosts = vec![
        (
            " padded ".to_owned(),
            avail(&[(0, 0.25), (900, 0.0), (2000, 1.0)]),
        ),
        ("a,b".to_owned(), avail(&[(0, 0.0), (30, 0.5)])),
        ("line\nbreak".to_owned(), Availability::full()),
        ("say \"hi\"".to_owned(), avail(&[(0, 1.0), (60, 0.0)])),
    ];
    let mut sorted = hosts.clone();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(from_csv(&to_csv(&hosts)).unwrap(), sorted);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn csv_round_trips_arbitrary_traces(traces in prop::collection::vec(trace_strategy(), 1..4)) {
        let hosts = named(traces);
        prop_assert_eq!(from_csv(&to_csv(&hosts)).unwrap(), hosts);
    }
}

#[test]
fn csv_gap_rule_switches_hosts_off() {
    let text = "timestamp,host,idle\n\
                0,a,0.9\n30,a,0.9\n60,a,0.5\n\
                1000,a,0.7\n\
                5000,b,1\n";
    let hosts = from_csv(text).unwrap();
    let a = &hosts[0].1;
    let b = &hosts[1].1;
    // a: 0.9 until 60, 0.5 for one sample period, off until 1000, then 0.7 for one sample
    // period and off (its last sample is more than MAX_GAP_SECS before the trace's end at 5000).
    assert_eq!(
        a.steps(),
        &[(0, 0.9), (60, 0.5), (90, 0.0), (1000, 0.7), (1030, 0.0)]
    );
    // b: off before its first sample; its last sample is the trace's end, so it holds.
    assert_eq!(b.steps(), &[(0, 0.0), (5000, 1.0)]);
}

#[test]
fn csv_last_sample_near_the_end_holds() {
    let text = "timestamp,host,idle\n0,a,0.5\n100,b,0.25\n300,b,0.25\n";
    let hosts = from_csv(text).unwrap();
    assert_eq!(
        hosts[0].1.steps(),
        &[(0, 0.5)],
        "within MAX_GAP_SECS of the end"
    );
}

#[test]
fn csv_accepts_percent_crlf_blank_lines_bom_and_interleaving() {
    let text = "\u{feff}timestamp, host, idle_percent\r\n\r\n0,b,100\r\n0,a,50\r\n30,b,12.5\r\n30,a,50\r\n";
    let hosts = from_csv(text).unwrap();
    assert_eq!(hosts[0].0, "a");
    assert_eq!(hosts[0].1.steps(), &[(0, 0.5)]);
    assert_eq!(hosts[1].0, "b");
    assert_eq!(hosts[1].1.steps(), &[(0, 1.0), (30, 0.125)]);
}

/// Parses `header` + `rows` and returns the error.
fn csv_error(text: &str) -> TraceError {
    from_csv(text).expect_err("should be rejected")
}

#[test]
fn csv_errors_name_the_line() {
    const H: &str = "timestamp,host,idle\n";
    assert_eq!(csv_error(""), TraceError::MissingHeader);
    assert_eq!(csv_error("\n\n"), TraceError::MissingHeader);
    assert!(matches!(
        csv_error("time,host,idle\n0,a,1\n"),
        TraceError::BadHeader { .. }
    ));
    assert_eq!(csv_error(H), TraceError::NoRows);
    assert_eq!(
        csv_error(&format!("{H}0,a,1\n30,a\n")),
        TraceError::FieldCount { line: 3, found: 2 }
    );
    assert_eq!(
        csv_error(&format!("{H}0,a,1,2\n")),
        TraceError::FieldCount { line: 2, found: 4 }
    );
    for bad in ["-5", "1.5", "abc", ""] {
        assert_eq!(
            csv_error(&format!("{H}0,a,1\n{bad},a,1\n")),
            TraceError::BadTimestamp {
                line: 3,
                found: bad.to_owned()
            }
        );
    }
    assert_eq!(
        csv_error(&format!("{H}0,,1\n")),
        TraceError::EmptyHost { line: 2 }
    );
    assert_eq!(
        csv_error(&format!("{H}0,a,x\n")),
        TraceError::BadValue {
            line: 2,
            found: "x".to_owned()
        }
    );
    // Out of range: above 1 in a fraction column (with the hint), negative, NaN, above 100 %.
    let e = csv_error(&format!("{H}0,a,1\n30,a,95\n"));
    assert!(
        matches!(
            e,
            TraceError::ValueOutOfRange {
                line: 3,
                max: 1.0,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("idle_percent"), "{e}");
    let e = csv_error(&format!("{H}0,a,-0.1\n"));
    assert!(
        matches!(e, TraceError::ValueOutOfRange { line: 2, .. })
            && !e.to_string().contains("idle_percent")
    );
    assert!(matches!(
        csv_error(&format!("{H}0,a,NaN\n")),
        TraceError::ValueOutOfRange { line: 2, .. }
    ));
    assert!(matches!(
        csv_error("timestamp,host,idle_percent\n0,a,100.5\n"),
        TraceError::ValueOutOfRange {
            line: 2,
            max: 100.0,
            ..
        }
    ));
    // Unsorted and duplicate timestamps of one host (other hosts may interleave).
    assert_eq!(
        csv_error(&format!("{H}60,a,1\n0,b,1\n30,a,1\n")),
        TraceError::Unsorted {
            line: 4,
            host: "a".to_owned(),
            time: 30,
            previous: 60
        }
    );
    assert_eq!(
        csv_error(&format!("{H}60,a,1\n60,a,0.5\n")),
        TraceError::Unsorted {
            line: 3,
            host: "a".to_owned(),
            time: 60,
            previous: 60
        }
    );
    assert_eq!(
        csv_error(&format!("{H}0,\"a,1\n30,a,1\n")),
        TraceError::UnclosedQuote { line: 2 }
    );
}

#[test]
fn csv_line_numbers_count_quoted_line_breaks() {
    let text = "timestamp,host,idle\n0,\"two\nlines\",1\n30,x,2\n";
    assert!(matches!(
        csv_error(text),
        TraceError::ValueOutOfRange { line: 4, .. }
    ));
}

#[test]
fn csv_error_messages_say_what_to_do() {
    let msg = csv_error("a,b\n").to_string();
    assert!(
        msg.contains("timestamp,host,idle") && msg.contains("idle_percent"),
        "{msg}"
    );
    let msg = csv_error("timestamp,host,idle\n30,a,1\n0,a,1\n").to_string();
    assert!(
        msg.starts_with("line 3:") && msg.contains("sorted"),
        "{msg}"
    );
}
