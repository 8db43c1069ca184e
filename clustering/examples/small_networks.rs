//! DiDiC on the small measured networks of issue 15: the experiments
//! behind docs/clustering.md's "Small networks" figures.
//!
//! ```sh
//! cargo run -p clustering --release --example small_networks -- rates    # success rates, ~1 min
//! cargo run -p clustering --release --example small_networks -- loads    # Listing 5.1's loads, step by step
//! cargo run -p clustering --release --example small_networks -- shared   # one system winning two sites
//! ```

use std::collections::BTreeSet;

use clustering::scenarios::{partition, settles, sites, two_sites_one_link, want};
use clustering::{DidicParams, Drain, EdgeRule, MeasuredNetwork, Rng};

const ALL: EdgeRule = EdgeRule::ALL;

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("rates") => rates(),
        Some("loads") => loads(),
        Some("shared") => shared(),
        _ => {
            eprintln!("usage: small_networks rates|loads|shared");
            std::process::exit(2);
        }
    }
}

/// Success rates of DiDiC variants on the small networks (40 seeds each).
fn rates() {
    let d = DidicParams::measured();
    let constant = DidicParams {
        initial_spread: 0.0,
        ..d
    };
    let variants: Vec<(&str, DidicParams, EdgeRule)> = vec![
        ("before: all links, 100", constant, ALL),
        ("edge rule, 100", constant, EdgeRule::default()),
        (
            "edge rule, 100, B=100",
            DidicParams {
                benefit: 100.0,
                ..constant
            },
            EdgeRule::default(),
        ),
        ("all links, 100-400", d, ALL),
        ("now: edge rule, 100-400", d, EdgeRule::default()),
        (
            "edge rule, 100-200",
            DidicParams {
                initial_spread: 1.0,
                ..d
            },
            EdgeRule::default(),
        ),
        (
            "edge rule, 100-200, B=100",
            DidicParams {
                benefit: 100.0,
                ..d
            },
            EdgeRule::default(),
        ),
    ];
    type Scenario = (
        &'static str,
        fn(&mut Rng) -> Vec<(i64, i64, f64)>,
        BTreeSet<BTreeSet<i64>>,
    );
    let scenarios: Vec<Scenario> = vec![
        (
            "testbed 3x4, rendezvous 8",
            |r| sites(3, 4, 20.0, false, r),
            want(3, 4),
        ),
        (
            "testbed 3x4, all measured",
            |r| sites(3, 4, 20.0, true, r),
            want(3, 4),
        ),
        ("two sites, one 2 link", two_sites_one_link, want(2, 4)),
        (
            "two sites, all measured at 2",
            |r| sites(2, 4, 2.0, true, r),
            want(2, 4),
        ),
        (
            "flat 12, all measured",
            |r| sites(1, 12, 100.0, true, r),
            want(1, 12),
        ),
        (
            "flat 12, rendezvous 8",
            |r| sites(1, 12, 100.0, false, r),
            want(1, 12),
        ),
        (
            "3x4, 40 between, all measured",
            |r| sites(3, 4, 40.0, true, r),
            want(3, 4),
        ),
    ];
    for (vname, params, rule) in &variants {
        for (sname, make, want) in &scenarios {
            let mut ok = 0;
            let mut steps = vec![];
            for seed in 0..40u64 {
                let links = make(&mut Rng::new(1000 + seed));
                if let Some(t) = settles(*params, *rule, seed, &links, want, 30, 100) {
                    ok += 1;
                    steps.push(t);
                }
            }
            println!("{vname:26} {sname:30} {ok:2}/40, median step {:?}", {
                steps.sort();
                steps.get(steps.len() / 2).copied()
            });
        }
    }
}

/// Listing 5.1's loads (its own drain, constant initial loads) on a small
/// network, step by step: per colour its
/// members, secondary total L, primary total W, and how far FOS/B is from
/// its fixed point (max/min of l/b over the vertices).
fn loads() {
    type Case = (&'static str, Vec<(i64, i64, f64)>, u64);
    let cases: Vec<Case> = vec![
        ("flat 12", sites(1, 12, 100.0, true, &mut Rng::new(1000)), 0),
        ("flat 12", sites(1, 12, 100.0, true, &mut Rng::new(1001)), 1),
        ("flat 12", sites(1, 12, 100.0, true, &mut Rng::new(1002)), 2),
        (
            "two sites one link",
            two_sites_one_link(&mut Rng::new(1000)),
            0,
        ),
        (
            "two sites one link",
            two_sites_one_link(&mut Rng::new(1001)),
            1,
        ),
        (
            "testbed all",
            sites(3, 4, 20.0, true, &mut Rng::new(1000)),
            0,
        ),
    ];
    for (name, links, seed) in cases {
        let p = DidicParams {
            drain: Drain::Listing,
            ..DidicParams::default()
        };
        let mut net = MeasuredNetwork::new(p, seed);
        net.update(links.iter().copied());
        println!("== {name} seed {seed}");
        for t in 1..=60 {
            net.step();
            if ![1, 2, 3, 5, 10, 20, 40, 60].contains(&t) {
                continue;
            }
            let d = net.didic();
            let clusters = net.clusters();
            let g = net.graph();
            let mut line = format!("t {t:2} {:?}\n", partition(&clusters));
            for c in 0..p.k {
                let members = d.clustering().values().filter(|&&x| x == c).count();
                let (w, l) = d.totals(c);
                if l.abs() < 1e-9 {
                    continue;
                }
                let ratios: Vec<f64> = g
                    .vertices()
                    .map(|v| {
                        let b = if d.cluster_of(v) == Some(c) {
                            p.benefit
                        } else {
                            1.0
                        };
                        d.loads(v).unwrap().1[c as usize] / b
                    })
                    .collect();
                let (lo, hi) = ratios
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
                let ws: Vec<f64> = g
                    .vertices()
                    .map(|v| d.loads(v).unwrap().0[c as usize])
                    .collect();
                let (wlo, whi) = ws
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
                line += &format!(
                    "   c{c:2} m {members:2} L {l:7.1} W {w:10.0} l/b {lo:7.2}..{hi:7.2} w {wlo:9.0}..{whi:9.0}\n"
                );
            }
            print!("{line}");
        }
    }
}

/// How often one of DiDiC's systems wins two sites of the testbed (their
/// cluster numbers then differ only by the part numbering).
fn shared() {
    let mut shared = 0;
    for seed in 0..40u64 {
        let links = sites(3, 4, 20.0, true, &mut Rng::new(1000 + seed));
        let mut net = MeasuredNetwork::new(DidicParams::measured(), seed);
        net.update(links.iter().copied());
        for _ in 0..30 {
            net.step();
        }
        let raw = net.didic().clustering();
        let firsts: BTreeSet<u32> = raw.values().copied().collect();
        if partition(&net.clusters()) == want(3, 4) && firsts.len() < 3 {
            shared += 1;
        }
    }
    println!("a system won two sites in {shared} of 40 runs");
}
