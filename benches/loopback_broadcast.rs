//! A 16 MiB broadcast to 16 processes on 4 peers over plain loopback,
//! against the bound `(p − 1)·n / B` (issue 6): the time the sender's link
//! would need to push the data to the 15 other processes one after another
//! at `B`, the single-stream loopback TCP bandwidth measured in this run.
//!
//! The `broadcast` example's large mode (`{"bytes": n, "rounds": k,
//! "check": false}`) has process `r mod 16` send `n` bytes to all 16 with
//! `send_range` in superstep `r`. A round's time is the difference between
//! jobs of `k₂` and `k₁` rounds divided by `k₂ − k₁` (the minimum of each
//! over repetitions), so start-up cancels out; it includes the sender
//! making the bytes, the copies in and out of wasm memory, the data plane
//! and the barrier. The same with `"alone": true` (the sender sends to
//! itself only) is the round without the broadcast; the difference is
//! what the broadcast costs. Both ratios to the bound are printed
//! (`b/round`, `b/bcast`).
//!
//! Configurations, one after the other on one machine, all with
//! checkpoints every 1000 supersteps: direct sending forced and the default
//! rule (which is direct on one host: one copy per peer, not per process;
//! the two rows show the run-to-run noise), and the chain and the binomial
//! tree forced; and the default rule with a checkpoint at every sync (what
//! a job gets by default: every receiver's 16 MiB of new memory goes to two
//! replicas).
//!
//! Run: `cargo bench --bench loopback_broadcast` (`-- --quick` for fewer
//! repetitions). Results: `docs/benchmarks.md`.

#[path = "../tests/all/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "../supernode/tests/support/throwaway_pg.rs"]
mod throwaway_pg;

#[path = "common/loopback.rs"]
mod loopback;

use std::time::Instant;

use bsp_api::rest::JobLimits;
use serde_json::json;

const BYTES: u64 = 16 << 20;
const PROCS: u32 = 16;

async fn job_secs(
    client: &bsp_api::client::Client,
    rounds: u32,
    checkpoint_every: u32,
    alone: bool,
) -> f64 {
    let mut spec = harness::job(
        "broadcast",
        PROCS,
        json!({"bytes": BYTES, "rounds": rounds, "check": false, "alone": alone}),
    );
    spec.limits = Some(JobLimits {
        checkpoint_every,
        ..JobLimits::default()
    });
    let t = Instant::now();
    let r = harness::run(client, spec).await;
    let secs = t.elapsed().as_secs_f64();
    r.assert_exited();
    let peers: std::collections::BTreeSet<_> = r.info.placement.iter().collect();
    assert_eq!(peers.len(), 4, "the processes ran on {} peers", peers.len());
    for pid in if alone { 0..1 } else { 0..PROCS } {
        let want = format!("round 0: pid {pid} got {BYTES} bytes fnv -");
        assert!(
            r.stdout(pid).contains(&want),
            "pid {pid}: {:?}",
            r.stdout(pid)
        );
    }
    secs
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let bw = loopback::loopback_bandwidth();
    let n = BYTES as f64;
    let bound = f64::from(PROCS - 1) * n / bw;
    println!(
        "loopback TCP single-stream bandwidth B = {:.2} GB/s; n = 16 MiB, p = {PROCS} processes on 4 peers",
        bw / 1e9
    );
    println!("bound (p − 1)·n / B = {:.1} ms per broadcast", bound * 1e3);
    println!();
    println!(
        "{:<44} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "configuration", "per round", "alone", "broadcast", "b/round", "b/bcast"
    );
    let configs: [(&str, &[&str], u32); 5] = [
        (
            "direct forced, checkpoint/1000",
            &["--broadcast", "direct"],
            1000,
        ),
        ("auto (direct on one host), checkpoint/1000", &[], 1000),
        ("auto, checkpoint at every sync", &[], 1),
        (
            "chain forced, checkpoint/1000",
            &["--broadcast", "chain"],
            1000,
        ),
        (
            "binomial forced, checkpoint/1000",
            &["--broadcast", "binomial"],
            1000,
        ),
    ];
    let (k1, k2) = if quick { (1u32, 4u32) } else { (2, 10) };
    let reps = if quick { 1 } else { 5 };
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (label, args, every) in configs {
        let cluster = harness::Cluster::start(harness::Options {
            peers: 4,
            peer_args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        });
        let (per_round, baseline) = rt.block_on(async {
            let client = cluster.admin().await;
            job_secs(&client, 1, every, false).await; // warm the peers' module caches
            let mut out = [0.0; 2];
            for (i, alone) in [false, true].into_iter().enumerate() {
                let (mut a, mut b) = (f64::INFINITY, f64::INFINITY);
                for _ in 0..reps {
                    a = a.min(job_secs(&client, k1, every, alone).await);
                    b = b.min(job_secs(&client, k2, every, alone).await);
                }
                out[i] = (b - a) / f64::from(k2 - k1);
            }
            (out[0], out[1])
        });
        let broadcast = per_round - baseline;
        println!(
            "{label:<44} {:>9.1} ms {:>9.1} ms {:>9.1} ms {:>9.0}% {:>9.0}%",
            per_round * 1e3,
            baseline * 1e3,
            broadcast * 1e3,
            100.0 * bound / per_round,
            100.0 * bound / broadcast
        );
        drop(cluster);
    }
}
