//! Measure the BSP machine parameters of a local bspweb cluster.
//!
//! For p = 4, 8 and 16 processes on 4 peers (separate OS processes on
//! loopback), time supersteps that each carry an h-relation (every process
//! sends h bytes and receives h bytes), for a range of h, and fit
//! T(h) = g·h + l by least squares. The time of one superstep is the
//! difference between jobs of k₂ and k₁ supersteps divided by k₂ − k₁, so job
//! start-up (placement, module compilation, connections) cancels out.
//!
//! For scale, the same run measures the loopback TCP round trip and
//! single-stream bandwidth: the physical limits of this machine.
//!
//! Run: `cargo bench --bench bsp_params` (add `-- --quick` for fewer points).

#[path = "../tests/all/harness.rs"]
#[allow(dead_code)]
mod harness;

#[path = "common/loopback.rs"]
mod loopback;

use std::time::{Duration, Instant};

use loopback::{loopback_bandwidth, loopback_rtt};

use serde_json::json;

async fn job_time(client: &bsp_api::client::Client, p: u32, k: u32, h: u64) -> Duration {
    let t = Instant::now();
    let r = harness::run(
        client,
        harness::job("supersteps", p, json!({"k": k, "h": h})),
    )
    .await;
    let elapsed = t.elapsed();
    r.assert_exited();
    elapsed
}

/// Least-squares fit of y = g·x + l.
fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let sx: f64 = points.iter().map(|p| p.0).sum();
    let sy: f64 = points.iter().map(|p| p.1).sum();
    let sxx: f64 = points.iter().map(|p| p.0 * p.0).sum();
    let sxy: f64 = points.iter().map(|p| p.0 * p.1).sum();
    let g = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    let l = (sy - g * sx) / n;
    (g, l)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rtt = loopback_rtt();
    let bw = loopback_bandwidth();
    println!(
        "loopback TCP: round trip {:.1} µs, single-stream bandwidth {:.2} GB/s",
        rtt.as_secs_f64() * 1e6,
        bw / 1e9
    );
    println!("(a byte at loopback bandwidth costs {:.3} ns)", 1e9 / bw);

    let cluster = harness::Cluster::start(harness::Options {
        peers: 4,
        ..Default::default()
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = cluster.admin().await;
        let hs: &[u64] = if quick {
            &[0, 65_536, 262_144]
        } else {
            &[0, 4_096, 65_536, 262_144, 1_048_576]
        };
        let (k1, k2) = if quick { (2u32, 12u32) } else { (5u32, 45u32) };
        println!();
        println!("{:>4} {:>10} {:>14}", "p", "h (bytes)", "T(h) (µs)");
        let mut summary = vec![];
        for p in [4u32, 8, 16] {
            // Warm the module cache of every peer for this program.
            job_time(&client, p, 1, 0).await;
            let mut pts = vec![];
            for &h in hs {
                // Enough supersteps that their time dominates the job's
                // start-up noise; the minimum of each job length over
                // repetitions, then the difference.
                let k2 = if h <= 65_536 { k2 * 5 } else { k2 };
                let (mut a, mut b) = (f64::INFINITY, f64::INFINITY);
                for _ in 0..if quick { 1 } else { 3 } {
                    a = a.min(job_time(&client, p, k1, h).await.as_secs_f64());
                    b = b.min(job_time(&client, p, k2, h).await.as_secs_f64());
                }
                let best = (b - a) / f64::from(k2 - k1);
                println!("{p:>4} {h:>10} {:>14.1}", best * 1e6);
                pts.push((h as f64, best));
            }
            let (g, l) = fit(&pts);
            summary.push((p, g, l));
        }
        println!();
        println!(
            "{:>4} {:>10} {:>12} {:>26}",
            "p", "l (µs)", "g (ns/byte)", "g / loopback byte time"
        );
        for (p, g, l) in summary {
            println!(
                "{p:>4} {:>10.1} {:>12.3} {:>26.1}",
                l * 1e6,
                g * 1e9,
                g / (1.0 / bw)
            );
        }
        println!();
        println!(
            "l in units of the loopback round trip: see l (µs) / {:.1} µs",
            rtt.as_secs_f64() * 1e6
        );
    });
}
