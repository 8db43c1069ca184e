//! Measure the BSP machine parameters g and l of a local bspweb cluster,
//! with checkpoints off and at every sync, beside Open MPI in the same run.
//!
//! For p = 4, 8 and 16 processes on 4 peers (separate OS processes on
//! loopback), time supersteps that each carry an h-relation (the
//! `supersteps` example: every process sends h bytes split evenly over the
//! others, receives h bytes, and checks every byte) for a range of h, twice:
//! with checkpoints off (job limit `checkpoint_every: 1_000_000`, only the
//! exit) and with a checkpoint at every sync (the default). Right before
//! each p, the same h-relation runs as a C program over Open MPI
//! (`benches/mpi/hrelation.c`: the same byte pattern written and checked,
//! `MPI_Alltoallv` + `MPI_Barrier` per superstep), built with `mpicc -O2`
//! into `target/mpi/` and run with `mpirun --oversubscribe --mca btl
//! tcp,self` (TCP on `lo` only, `mpi_yield_when_idle 1`). When `mpicc` or
//! `mpirun` is missing, the bench installs Debian's `openmpi-bin` and
//! `libopenmpi-dev` with `apt-get` if it runs as root, and otherwise prints
//! the command and leaves the MPI column empty.
//!
//! The parameters, the same way for both systems:
//! - **T(h)**, the time of one superstep, is the difference between runs of
//!   k₂ and k₁ supersteps divided by k₂ − k₁, with the minimum of each run
//!   length over repetitions (start-up noise only ever adds time), so
//!   everything outside the supersteps cancels: for bspweb, placement,
//!   module compilation, connections and the end-of-job reports of a whole
//!   job timed from the client; for MPI, the barrier and reduction around
//!   each timed loop.
//! - **l = T(0)**, the superstep of an empty h-relation (issue 13's
//!   definition); **g** is the least-squares slope of T(h) − l through the
//!   origin, Σ h·(T(h) − l) / Σ h², which the large h dominate.
//!
//! Why k₂ is sized per point: a bspweb job of k₁ = 2 supersteps takes
//! 50–100 ms from the client and its start-up varies by about ±20 ms on
//! two shared cores. The earlier fixed k₂ (45, or 225 for small h) spread
//! that over too few supersteps for l (±20 ms / 200 = ±100 µs, as much as l
//! itself). Now pilot jobs of 20, 160, 1280, … supersteps run until their
//! difference from the k₁ job is an eighth of the target, and k₂ is sized
//! from it so that the k₂ − k₁ supersteps take about 1.5 s (0.4 s with
//! `--quick`; at most 20 000 supersteps). Each repetition (3; 2 with
//! `--quick`) runs k₂, (k₁ + k₂) / 2 and k₁ supersteps. Two columns judge
//! the result: `noise`, how far apart the repetitions were per superstep
//! ((range of the k₁ jobs + range of the k₂ jobs) / (k₂ − k₁)), and
//! `grow`, T of the second half of the k₂ − k₁ supersteps over T of the
//! first half: 1 when a superstep costs the same all along a job, above 1
//! when per-superstep work grows with the superstep count (as it did with
//! checkpoints off in `ff5765e`, whose peer rescanned every barrier since
//! the last checkpoint at each step: 1 000 supersteps at p = 4, h = 0 took
//! 2.1 s, 4 000 took 26 s). MPI times its supersteps inside one program
//! (k₁ = 10, the same target, at least 3 repetitions), so one warm-up run
//! of k₁ supersteps is its pilot. `-- --verbose` prints every bspweb job's
//! time on stderr.
//!
//! For scale, the same run measures the loopback TCP round trip and
//! single-stream bandwidth: the physical limits of this machine.
//!
//! Goals (issue 13), printed with "met" or "not met": g ≤ 2× MPI with
//! checkpoints off and ≤ 4× with a checkpoint at every sync; l ≤ 1.5× MPI
//! at p ≥ 4 (shown for both checkpoint settings).
//!
//! Run: `cargo bench --bench bsp_params` (about 5 minutes on 2 cores; add
//! `-- --quick` for fewer points and repetitions, about 1 minute, where
//! `grow` is too noisy to read). To compare builds or profile one point:
//! `-- --p N` runs only that process count, `-- --l` only h = 0 (l, no g).
//! Results: `docs/benchmarks.md`.

#[path = "../tests/all/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "../supernode/tests/support/throwaway_pg.rs"]
mod throwaway_pg;

#[path = "common/loopback.rs"]
mod loopback;

#[path = "common/args.rs"]
mod args;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use bsp_api::client::Client;
use bsp_api::rest::JobLimits;
use loopback::{loopback_bandwidth, loopback_rtt, record_layer};
use serde_json::json;

/// Checkpoints effectively off: only the exit is a checkpoint.
const OFF: u32 = 1_000_000;
/// A checkpoint at every sync (the default).
const EVERY_SYNC: u32 = 1;
/// The short run, which holds the start-up of a bspweb job.
const K1: u32 = 2;
/// Supersteps of the first pilot run that sizes k₂ (and the fewest in k₂ − k₁).
const PILOT: u32 = 20;
/// At most this many supersteps in one measured bspweb job.
const K_MAX: u32 = 20_000;

#[derive(Clone, Copy)]
struct Settings {
    hs: &'static [u64],
    reps: usize,
    /// Seconds the k₂ − k₁ supersteps should take.
    target: f64,
}

/// One point T(h), in seconds per superstep.
#[derive(Clone, Copy)]
struct Point {
    h: u64,
    k2: u32,
    t: f64,
    /// How far apart the repetitions were, per superstep (bspweb only).
    noise: f64,
    /// T of the second half of the k₂ − k₁ supersteps over T of the first
    /// half (bspweb only): 1 when a superstep costs the same all along.
    growth: f64,
}

async fn job_secs(client: &Client, p: u32, k: u32, h: u64, checkpoint_every: u32) -> f64 {
    let mut spec = harness::job("supersteps", p, json!({"k": k, "h": h}));
    spec.limits = Some(JobLimits {
        checkpoint_every,
        ..JobLimits::default()
    });
    let t = Instant::now();
    let r = harness::run(client, spec).await;
    let secs = t.elapsed().as_secs_f64();
    r.assert_exited();
    if std::env::args().any(|a| a == "--verbose") {
        eprintln!("  job p={p} k={k} h={h} checkpoint_every={checkpoint_every}: {secs:.4} s");
    }
    secs
}

/// T(h) of bspweb: see the module comment.
async fn bspweb_point(client: &Client, p: u32, h: u64, every: u32, s: &Settings) -> Point {
    // Pilot: K1 supersteps, then K1 + PILOT, growing eightfold until the
    // difference is clearly above the start-up noise (or K_MAX).
    let a = job_secs(client, p, K1, h, every).await;
    let mut steps = PILOT;
    let guess = loop {
        let d = job_secs(client, p, K1 + steps, h, every).await - a;
        if d >= s.target / 8.0 || K1 + steps >= K_MAX {
            break (d / f64::from(steps)).max(1e-6);
        }
        steps = (steps * 8).min(K_MAX - K1);
    };
    // An even k₂ − k₁, so that the middle length splits it in halves.
    let k2 = K1 + ((s.target / guess) as u32).clamp(PILOT, K_MAX - K1) / 2 * 2;
    let km = (K1 + k2) / 2;
    let (mut t1, mut tm, mut t2) = (vec![a], vec![], vec![]);
    for _ in 0..s.reps {
        t2.push(job_secs(client, p, k2, h, every).await);
        tm.push(job_secs(client, p, km, h, every).await);
        t1.push(job_secs(client, p, K1, h, every).await);
    }
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let steps = f64::from(k2 - K1);
    let half = steps / 2.0;
    Point {
        h,
        k2,
        t: (min(&t2) - min(&t1)) / steps,
        noise: (max(&t1) - min(&t1) + max(&t2) - min(&t2)) / steps,
        growth: ((min(&t2) - min(&tm)) / half) / ((min(&tm) - min(&t1)) / half),
    }
}

/// l = T(0) and g = the least-squares slope of T(h) − l through the origin.
fn params(points: &[Point]) -> (f64, f64) {
    let l = points
        .iter()
        .find(|pt| pt.h == 0)
        .expect("every series measures h = 0")
        .t;
    let (mut shy, mut shh) = (0.0, 0.0);
    for pt in points {
        let h = pt.h as f64;
        shy += h * (pt.t - l);
        shh += h * h;
    }
    (shy / shh, l)
}

/// Where `mpirun` runs the MPI program from, and how.
#[derive(Clone)]
struct Mpi {
    exe: PathBuf,
    root: bool,
}

fn runs(cmd: &str, arg: &str) -> bool {
    Command::new(cmd)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

const APT_PACKAGES: [&str; 2] = ["openmpi-bin", "libopenmpi-dev"];

/// Find (or, as root, install) Open MPI and build the MPI program into
/// `target/mpi/`; `Err` says why the MPI column stays empty.
fn prepare_mpi() -> Result<Mpi, String> {
    let root = is_root();
    let have = || runs("mpicc", "--version") && runs("mpirun", "--version");
    if !have() {
        let install = format!("apt-get install -y {}", APT_PACKAGES.join(" "));
        if !root {
            return Err(format!(
                "mpicc/mpirun not found; install Open MPI with `sudo apt-get update && sudo {install}` and run again"
            ));
        }
        println!("mpicc/mpirun not found: installing Open MPI (apt-get update && {install})");
        let apt = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let ok = apt(&["update", "-q"])
            && apt(&[&["install", "-y", "-q"][..], &APT_PACKAGES[..]].concat());
        if !ok || !have() {
            return Err(format!(
                "installing Open MPI failed; run `apt-get update && {install}` and run again"
            ));
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/mpi/hrelation.c");
    let dir = harness::target_dir().join("mpi");
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let exe = dir.join("hrelation");
    let out = Command::new("mpicc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run mpicc: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mpicc -O2 {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(Mpi { exe, root })
}

/// T(h) of the MPI program with `p` processes, one `mpirun`.
fn mpi_points(mpi: &Mpi, p: u32, s: &Settings) -> Result<Vec<Point>, String> {
    let mut cmd = Command::new("mpirun");
    if mpi.root {
        cmd.arg("--allow-run-as-root")
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    }
    cmd.args(["--oversubscribe", "--mca", "btl", "tcp,self"])
        .args(["--mca", "btl_tcp_if_include", "lo"])
        .args(["--mca", "oob_tcp_if_include", "lo"])
        .args(["--mca", "mpi_yield_when_idle", "1"])
        .args(["-np", &p.to_string()])
        .arg(&mpi.exe)
        .args(["-k", "10", "-t", &s.target.to_string()])
        .args(["-r", &s.reps.max(3).to_string()])
        .args(s.hs.iter().map(u64::to_string))
        .stdin(Stdio::null());
    let out = cmd.output().map_err(|e| format!("run mpirun: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "mpirun -np {p} failed ({}):\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let points: Vec<Point> = stdout
        .lines()
        .filter(|line| line.starts_with("h="))
        .filter_map(|line| {
            let field = |key: &str| {
                line.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            };
            Some(Point {
                h: field("h")?.parse().ok()?,
                k2: field("k2")?.parse().ok()?,
                t: field("us_per_superstep")?.parse::<f64>().ok()? * 1e-6,
                noise: f64::NAN,
                growth: f64::NAN,
            })
        })
        .collect();
    if points.len() != s.hs.len() {
        return Err(format!("mpirun -np {p} printed:\n{stdout}"));
    }
    Ok(points)
}

/// What one p measured.
struct Row {
    p: u32,
    mpi: Option<(f64, f64)>,
    off: (f64, f64),
    sync: (f64, f64),
}

fn ratio(x: f64, mpi: Option<f64>, goal: f64) -> String {
    match mpi {
        Some(m) => {
            let r = x / m;
            let verdict = if r <= goal { "met" } else { "not met" };
            format!("{r:>7.1}× {verdict:<7}")
        }
        None => format!("{:>8} {:<7}", "—", "no MPI"),
    }
}

/// The 1, 5 and 15 minute load averages, to judge how busy the machine was.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or("unknown".to_string(), |l| {
        l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    })
}

fn num(x: Option<f64>, scale: f64, digits: usize) -> String {
    x.map_or("—".to_string(), |x| format!("{:.digits$}", x * scale))
}

/// One of the g and l tables.
struct Table<'a> {
    title: &'a str,
    /// g (`.0`) or l (`.1`) of a series' parameters.
    pick: fn((f64, f64)) -> f64,
    /// Display unit and decimals.
    scale: f64,
    digits: usize,
    /// The machine's own figure for scale: its column heading and value
    /// (already in the display unit).
    physical: (&'a str, f64),
    /// Issue 13's goals, off / MPI and sync / MPI.
    goals: (f64, f64),
}

fn print_table(rows: &[Row], t: &Table) {
    let (goal_off, goal_sync) = t.goals;
    let d = t.digits;
    println!();
    println!("{}", t.title);
    println!(
        "{:>3} {:>9} {:>10} {:>10} {:>10} | {:<18} | {:<18}",
        "p",
        "MPI",
        "off",
        "sync",
        t.physical.0,
        format!("off / MPI (≤ {goal_off}×)"),
        format!("sync / MPI (≤ {goal_sync}×)")
    );
    for r in rows {
        let m = r.mpi.map(t.pick);
        let (off, sync) = ((t.pick)(r.off), (t.pick)(r.sync));
        println!(
            "{:>3} {:>9} {:>10.d$} {:>10.d$} {:>10.d$} | {:<18} | {:<18}",
            r.p,
            num(m, t.scale, d),
            off * t.scale,
            sync * t.scale,
            t.physical.1,
            ratio(off, m, goal_off),
            ratio(sync, m, goal_sync)
        );
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let quick = argv.iter().any(|a| a == "--quick");
    // `--l`: only h = 0 (l); `--p N`: only N processes.
    let l_only = argv.iter().any(|a| a == "--l");
    let ps: Vec<u32> = match args::flag_value(&argv, "--p") {
        Some(p) if (2..=64).contains(&p) => vec![p],
        Some(p) => {
            eprintln!("error: --p {p}: the cluster runs 2 to 64 processes");
            std::process::exit(2)
        }
        None => vec![4, 8, 16],
    };
    let mut settings = if quick {
        Settings {
            hs: &[0, 65_536, 1_048_576],
            reps: 2,
            target: 0.4,
        }
    } else {
        Settings {
            hs: &[0, 4_096, 65_536, 262_144, 1_048_576],
            reps: 3,
            target: 1.5,
        }
    };
    if l_only {
        settings.hs = &[0];
    }
    println!("load average at the start: {}", load_average());
    let rtt = loopback_rtt();
    let bw = loopback_bandwidth();
    println!(
        "loopback TCP: round trip {:.1} µs, single-stream bandwidth {:.2} GB/s",
        rtt.as_secs_f64() * 1e6,
        bw / 1e9
    );
    println!("(a byte at loopback bandwidth costs {:.3} ns)", 1e9 / bw);
    // Issue 18: what the data plane's encryption costs, in the same run.
    let rec = record_layer();
    let per_byte = 1e9 / rec.sealed_bw - 1e9 / rec.plain_bw;
    let per_trip = rec.sealed_rtt.as_secs_f64() - rec.plain_rtt.as_secs_f64();
    println!(
        "data-plane records (Noise handshake, AEGIS-256X4) against plain TCP, same streams: \
         {:.2} against {:.2} GB/s ({:+.3} ns per byte), round trip {:.1} against {:.1} µs",
        rec.sealed_bw / 1e9,
        rec.plain_bw / 1e9,
        per_byte,
        rec.sealed_rtt.as_secs_f64() * 1e6,
        rec.plain_rtt.as_secs_f64() * 1e6
    );
    let mpi = prepare_mpi();
    match &mpi {
        Ok(m) => println!("MPI: {} (Open MPI, TCP on lo)", m.exe.display()),
        Err(why) => println!("MPI column skipped: {why}"),
    }

    let cluster = harness::Cluster::start(harness::Options {
        peers: 4,
        ..Default::default()
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let s = &settings;
    let rows = rt.block_on(async {
        let client = cluster.admin().await;
        println!();
        println!("T(h): µs per superstep; k₂: supersteps of the long run (k₁ = {K1} for bspweb, 10 for MPI)");
        println!("noise: spread of the repetitions, µs per superstep");
        println!("grow: T of the second half of the k₂ − k₁ supersteps / T of the first half");
        println!(
            "{:>3} {:>8} | {:>9} {:>6} | {:>9} {:>6} {:>7} {:>5} | {:>9} {:>6} {:>7} {:>5}",
            "p", "h", "MPI", "k₂", "off", "k₂", "noise", "grow", "sync", "k₂", "noise", "grow"
        );
        let mut rows = vec![];
        for &p in &ps {
            let mpi_pts = match &mpi {
                Ok(m) => {
                    let (m, s) = (m.clone(), *s);
                    match tokio::task::spawn_blocking(move || mpi_points(&m, p, &s))
                        .await
                        .unwrap()
                    {
                        Ok(pts) => Some(pts),
                        Err(why) => {
                            println!("p = {p}: MPI column skipped: {why}");
                            None
                        }
                    }
                }
                Err(_) => None,
            };
            // Warm the module cache of every peer for this program.
            job_secs(&client, p, 1, 0, OFF).await;
            let (mut off, mut sync) = (vec![], vec![]);
            for (i, &h) in s.hs.iter().enumerate() {
                let o = bspweb_point(&client, p, h, OFF, s).await;
                let c = bspweb_point(&client, p, h, EVERY_SYNC, s).await;
                let (m, mk) = match &mpi_pts {
                    Some(v) => (format!("{:.1}", v[i].t * 1e6), v[i].k2.to_string()),
                    None => ("—".to_string(), "—".to_string()),
                };
                println!(
                    "{p:>3} {h:>8} | {m:>9} {mk:>6} | {:>9.1} {:>6} {:>7.1} {:>5.2} | {:>9.1} {:>6} {:>7.1} {:>5.2}",
                    o.t * 1e6,
                    o.k2,
                    o.noise * 1e6,
                    o.growth,
                    c.t * 1e6,
                    c.k2,
                    c.noise * 1e6,
                    c.growth
                );
                off.push(o);
                sync.push(c);
            }
            rows.push(Row {
                p,
                mpi: mpi_pts.as_deref().map(params),
                off: params(&off),
                sync: params(&sync),
            });
        }
        rows
    });

    if !l_only {
        print_table(
            &rows,
            &Table {
                title: "g: ns per byte a process sends (least-squares slope of T(h) − l)",
                pick: |x| x.0,
                scale: 1e9,
                digits: 3,
                physical: ("loopback", 1e9 / bw),
                goals: (2.0, 4.0),
            },
        );
    }
    print_table(
        &rows,
        &Table {
            title: "l: µs per superstep, T(0)",
            pick: |x| x.1,
            scale: 1e6,
            digits: 1,
            physical: ("RTT", rtt.as_secs_f64() * 1e6),
            goals: (1.5, 1.5),
        },
    );
    if l_only {
        println!("load average at the end: {}", load_average());
        return;
    }
    println!();
    println!(
        "encryption's share (issue 18: encrypted ≤ 1.2× plain for 1 MiB h-relations): g and l \
         without checkpoints against the same with the records' extra cost per byte \
         ({per_byte:+.3} ns) and per round trip ({:+.1} µs) taken out",
        per_trip * 1e6
    );
    println!(
        "{:>3} {:>12} {:>12} {:>8} | {:>12} {:>12} {:>8}",
        "p", "g (ns/B)", "g plain", "ratio", "l (µs)", "l plain", "ratio"
    );
    for r in &rows {
        let (g, l) = (r.off.0 * 1e9, r.off.1 * 1e6);
        let (gp, lp) = (g - per_byte.max(0.0), l - (per_trip * 1e6).max(0.0));
        println!(
            "{:>3} {:>12.3} {:>12.3} {:>7.2}× | {:>12.1} {:>12.1} {:>7.2}×",
            r.p,
            g,
            gp,
            g / gp,
            l,
            lp,
            l / lp
        );
    }
    println!();
    println!(
        "off: checkpoint_every = {OFF} (only the exit); sync: a checkpoint at every sync (the default)"
    );
    println!("load average at the end: {}", load_average());
}
