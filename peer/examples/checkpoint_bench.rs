//! Checkpointing cost end to end (docs/benchmarks.md, "Checkpointing: overhead
//! per superstep, bytes sent, replication throughput"): a process with
//! 64 MiB of state that rewrites 10% of its pages per superstep, run by the
//! real job driver on three in-process peers over loopback with
//! checkpointing on and off; the bytes a checkpoint puts on the wire against
//! the state size and the dirty pages; and replication throughput against
//! plain loopback TCP, all in one run.
//!
//! `cargo run --release -p bspweb-peer --example checkpoint_bench`; with
//! `-- --quick`, one short superstep length and one repetition of each
//! timing (a few seconds: `scripts/test` runs it so that the example keeps
//! working; its figures mean nothing).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bsp_api::control::{JobAssignment, JobPeer, PeerEvent, Stream};
use bsp_api::rest::JobLimits;
use bsp_api::wire::Frame;
use bsp_api::{JobId, PeerId};
use bspweb_peer::checkpoint::{
    Assembled, Assembler, PAGE_SIZE, PageTracker, Plan, ReplicaStore, Snapshot, to_frames,
};
use bspweb_peer::job::{Fetched, JobEnv, Jobs};
use bspweb_peer::net::{self, Registry};
use bspweb_peer::report::Reporter;
use bspweb_peer::runtime::{JobInfo, Outcome, Runtime, module_hash};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::{CancellationToken, DropGuard};

/// The process's state: 1024 wasm pages.
const MEMORY: usize = 64 << 20;
const PAGES: usize = MEMORY / PAGE_SIZE;
/// Memory limit of the job and cap of the peers, MiB: 64 MiB plus headroom.
const MEMORY_LIMIT_MIB: u32 = 128;
/// Superstep lengths (seconds of compute) of part 1, with the last
/// superstep of each job (supersteps `0..=last`) and the runs per mode.
const LENGTHS: [(f64, u32, usize); 4] = [(2.0, 6, 1), (1.0, 8, 2), (0.25, 12, 2), (0.1, 16, 2)];
/// `--quick`: part 1's one length.
const QUICK_LENGTHS: [(f64, u32, usize); 1] = [(0.02, 4, 1)];
/// `--quick` was given.
static QUICK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn quick() -> bool {
    QUICK.load(std::sync::atomic::Ordering::Relaxed)
}

/// Repetitions of a timing of part 3 (`full` without `--quick`, else 1).
fn reps(full: usize) -> usize {
    if quick() { 1 } else { full }
}
/// Raw loopback TCP transfer of part 3.
const TCP_BYTES: usize = 256 << 20;
const TCP_CHUNK: usize = 1 << 20;
const TCP_ROUNDS: usize = 5;
/// Repetitions of the timings of part 3 (best of).
const ROUNDS: usize = 3;
/// The replica id the plans of parts 2 and 3 are made for.
const REPLICA: PeerId = 101;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn median(v: &mut [f64]) -> f64 {
    assert!(!v.is_empty());
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

// ---- the guest ----------------------------------------------------------------

/// `iterations` steps of a 64-bit LCG, seeded with `$s`: the compute of a
/// superstep (a dependent multiply-add chain the compiler cannot shorten).
fn compute_func(iterations: u64) -> String {
    format!(
        r#"(func $compute (param $s i32) (result i64)
        (local $x i64) (local $k i64)
        (local.set $x (i64.extend_i32_u (local.get $s)))
        (local.set $k (i64.const {iterations}))
        (block $b (loop $l
          (br_if $b (i64.eqz (local.get $k)))
          (local.set $x (i64.add (i64.mul (local.get $x) (i64.const 6364136223846793005))
                                 (i64.const 1442695040888963407)))
          (local.set $k (i64.sub (local.get $k) (i64.const 1)))
          (br $l)))
        (local.get $x))"#
    )
}

/// The benchmark program. In every superstep `s` it writes a raw record
/// `(s, 0)`, then in superstep 0 grows its memory to 64 MiB and fills every
/// page with nonzero data, and in superstep `s > 0` rewrites every word of
/// the pages `p ≡ s (mod 10)` (10% of them, different pages in consecutive
/// supersteps; page 0 also changes every superstep, it holds the records);
/// then it runs the compute loop, writes a record `(s, 1)` and syncs, or
/// returns in superstep `last`.
fn bench_guest(iterations: u64, last: u32) -> Vec<u8> {
    let compute = compute_func(iterations);
    let grow = PAGES - 1;
    let text = format!(
        r#"(module
      (import "bspweb_v1" "superstep" (func $superstep (result i32)))
      (import "bspweb_v1" "write_raw" (func $write_raw (param i32 i32) (result i32)))
      (memory (export "memory") 1)
      (func $mark (param $s i32) (param $kind i32)
        (i32.store (i32.const 0) (local.get $s))
        (i32.store (i32.const 4) (local.get $kind))
        (drop (call $write_raw (i32.const 0) (i32.const 8))))
      ;; Every word of pages first, first + step, ... below {PAGES}: a value
      ;; of its address and s, never zero and different for every s.
      (func $write_pages (param $first i32) (param $step i32) (param $s i32)
        (local $p i32) (local $a i32) (local $end i32) (local $add i64)
        (local.set $add (i64.extend_i32_u (i32.add (local.get $s) (i32.const 1))))
        (local.set $p (local.get $first))
        (block $done (loop $pages
          (br_if $done (i32.ge_u (local.get $p) (i32.const {PAGES})))
          (local.set $a (i32.shl (local.get $p) (i32.const 16)))
          (local.set $end (i32.add (local.get $a) (i32.const {PAGE_SIZE})))
          (block $page (loop $words
            (br_if $page (i32.ge_u (local.get $a) (local.get $end)))
            (i64.store (local.get $a)
              (i64.add (i64.mul (i64.extend_i32_u (local.get $a)) (i64.const 0x9E3779B97F4A7C15))
                       (local.get $add)))
            (local.set $a (i32.add (local.get $a) (i32.const 8)))
            (br $words)))
          (local.set $p (i32.add (local.get $p) (local.get $step)))
          (br $pages))))
      {compute}
      (func (export "bspweb_resume") (result i32)
        (local $s i32)
        (local.set $s (call $superstep))
        (call $mark (local.get $s) (i32.const 0))
        (if (i32.eqz (local.get $s))
          (then
            (if (i32.lt_s (memory.grow (i32.const {grow})) (i32.const 0)) (then unreachable))
            (call $write_pages (i32.const 0) (i32.const 1) (local.get $s)))
          (else
            (call $write_pages (i32.rem_u (local.get $s) (i32.const 10)) (i32.const 10) (local.get $s))))
        (i64.store (i32.const 16) (call $compute (local.get $s)))
        (call $mark (local.get $s) (i32.const 1))
        (i32.ge_u (local.get $s) (i32.const {last}))))"#
    );
    wat::parse_str(&text).expect("the benchmark guest parses")
}

/// The compute loop alone, returning at once: to calibrate iterations per second.
fn calibration_guest(iterations: u64) -> Vec<u8> {
    let compute = compute_func(iterations);
    let text = format!(
        r#"(module
      (memory (export "memory") 1)
      {compute}
      (func (export "bspweb_resume") (result i32)
        (i64.store (i32.const 16) (call $compute (i32.const 1)))
        (i32.const 1)))"#
    );
    wat::parse_str(&text).expect("the calibration guest parses")
}

/// Nanoseconds per compute-loop iteration (best of 3), run directly on the
/// runtime like a process's resume.
fn calibrate(runtime: &Runtime) -> f64 {
    const N: u64 = 50_000_000;
    let wasm = calibration_guest(N);
    let module = runtime.compile(&module_hash(&wasm), &wasm).unwrap();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let info = Arc::new(JobInfo {
            job: 0,
            nprocs: 1,
            seed: 0,
            args: b"null".to_vec(),
            resources: Default::default(),
            memory_limit: 1 << 20,
            superstep_budget: Duration::from_secs(60),
            output_limit: 1 << 20,
            outbox_limit: 1 << 20,
            kill: Arc::new(AtomicBool::new(false)),
            reporter: Reporter::new(),
        });
        let mut p = runtime.instantiate(&module, info, 0).unwrap();
        let t = Instant::now();
        let outcome = p.resume();
        let el = t.elapsed();
        assert!(matches!(outcome, Outcome::Done), "{outcome:?}");
        best = best.min(el.as_nanos() as f64 / N as f64);
    }
    best
}

// ---- part 1: the real driver ----------------------------------------------------

struct Peer {
    id: PeerId,
    addr: String,
    jobs: Arc<Jobs>,
    reporter: Reporter,
    _stop: DropGuard,
}

/// `n` peers on loopback, as `start_peers` in the job driver's tests, with
/// room for a 64 MiB process.
async fn start_peers(runtime: &Arc<Runtime>, n: usize) -> Vec<Peer> {
    let mut peers = Vec::new();
    for i in 0..n {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let registry = Arc::new(Registry::new());
        let stop = CancellationToken::new();
        tokio::spawn(net::serve(listener, registry.clone(), stop.clone()));
        let reporter = Reporter::new();
        let jobs = Jobs::new(JobEnv {
            runtime: runtime.clone(),
            registry,
            reporter: reporter.clone(),
            slots: bspweb_peer::slots::Slots::new(2),
            max_memory_mib: MEMORY_LIMIT_MIB,
            max_superstep_ms: 60_000,
            connect_timeout: Duration::from_secs(5),
            broadcast: Default::default(),
            stats: Default::default(),
            inline_max: bspweb_peer::runtime::INLINE_MAX,
        });
        peers.push(Peer {
            id: 100 + i as PeerId,
            addr,
            jobs,
            reporter,
            _stop: stop.drop_guard(),
        });
    }
    peers
}

/// When the records of one run arrived: `(superstep, 0)` at the start of a
/// superstep, `(superstep, 1)` at the end of its compute, just before sync.
struct Run {
    marks: BTreeMap<(u32, u32), Instant>,
}

impl Run {
    fn at(&self, s: u32, kind: u32) -> Instant {
        self.marks[&(s, kind)]
    }
}

/// Take peer 0's events on a thread of its own, stamping each batch as it
/// is emitted, until the process exited (or failed).
fn watch(reporter: Reporter) -> std::thread::JoinHandle<Result<Vec<(Instant, PeerEvent)>, String>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut got = Vec::new();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
            loop {
                let batch =
                    tokio::time::timeout_at(deadline, reporter.next_batch(usize::MAX, usize::MAX))
                        .await
                        .map_err(|_| format!("timed out; events so far: {got:?}"))?;
                let now = Instant::now();
                reporter.delivered(batch.len());
                let mut end = false;
                for e in batch {
                    match &e {
                        PeerEvent::ProcessExited { .. } => end = true,
                        PeerEvent::ProcessFailed { .. } | PeerEvent::ProcessAborted { .. } => {
                            return Err(format!("the process failed: {e:?}"));
                        }
                        _ => {}
                    }
                    got.push((now, e));
                }
                if end {
                    return Ok(got);
                }
            }
        })
    })
}

/// Run the benchmark guest as one process on peer 0 with replicas on peers
/// 1 and 2, checkpointing every `every` supersteps.
async fn run_driver(
    runtime: &Arc<Runtime>,
    peers: &[Peer],
    job: JobId,
    wasm: &[u8],
    every: u32,
) -> Run {
    let hash = module_hash(wasm);
    let module = runtime.compile(&hash, wasm).unwrap();
    let a = JobAssignment {
        job,
        program_hash: hash,
        nprocs: 1,
        args: "null".into(),
        seed: 7,
        limits: JobLimits {
            superstep_ms: 60_000,
            memory_mib: MEMORY_LIMIT_MIB,
            output_mib: 16,
            checkpoint_every: every,
            replicas: 2,
            redundancy: 1,
        },
        job_token: format!("token-{job}-{}", "0".repeat(32)),
        placement: vec![0],
        peers: peers
            .iter()
            .map(|p| JobPeer {
                id: p.id,
                addr: p.addr.clone(),
                cluster: None,
            })
            .collect(),
        resources: vec![],
        epoch: 0,
        restore: vec![],
        migrate: vec![],
        program_bytes: 0,
        resources_hash: String::new(),
        resources_bytes: 0,
    };
    let watcher = watch(peers[0].reporter.clone());
    let handles: Vec<_> = peers
        .iter()
        .map(|p| {
            let m = module.clone();
            p.jobs
                .start(p.id, a.clone(), async move {
                    Ok(Fetched {
                        module: Some(m),
                        bytes: bytes::Bytes::new(),
                        resources: bytes::Bytes::new(),
                    })
                })
                .expect("the job starts")
        })
        .collect();
    let events = tokio::task::spawn_blocking(move || watcher.join().unwrap())
        .await
        .unwrap();
    let others: Vec<PeerEvent> = peers[1..].iter().flat_map(|p| p.reporter.drain()).collect();
    for p in peers {
        p.jobs.kill(job);
    }
    for h in handles {
        tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .expect("the job ends in time")
            .expect("the job task does not panic");
    }
    let events = events.unwrap_or_else(|e| panic!("job {job}: {e}"));
    if let Some(bad) = others.iter().find(|e| {
        matches!(
            e,
            PeerEvent::ProcessFailed { .. } | PeerEvent::ProcessAborted { .. }
        )
    }) {
        panic!("job {job}: a replica failed: {bad:?}");
    }
    let mut marks = BTreeMap::new();
    for (t, e) in events {
        if let PeerEvent::Output {
            stream: Stream::Raw,
            data,
            ..
        } = e
        {
            let b = base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap();
            let w = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            marks.insert((w(0), w(4)), t);
        }
    }
    Run { marks }
}

async fn part1(runtime: &Arc<Runtime>) {
    println!(
        "== 1. Real driver: one process with 64 MiB of state, 10% of pages rewritten per superstep =="
    );
    println!(
        "   3 peers in this process on loopback, the process on peer 0, replicas = 2 (peers 1, 2)"
    );
    println!(
        "   checkpoint on: checkpoint_every = 1; off: checkpoint_every = 1000000 (only the exit)"
    );
    println!("   goal: checkpoint time under 5% of superstep time");
    let ns = calibrate(runtime);
    println!("   compute loop: {ns:.3} ns per iteration (best of 3)");
    let peers = start_peers(runtime, 3).await;
    let mut job: JobId = 1;
    let mut rows = Vec::new();
    let lengths: &[(f64, u32, usize)] = if quick() { &QUICK_LENGTHS } else { &LENGTHS };
    for &(secs, last, runs) in lengths {
        let iterations = (secs * 1e9 / ns) as u64;
        let wasm = bench_guest(iterations, last);
        // period: start of s to start of s + 1; compute: start to end of s;
        // gap: end of s to start of s + 1 (sync: checkpoint, replication,
        // barrier, resume). Supersteps 1 ..= last − 1 (10% changed).
        let mut stats: [[Vec<f64>; 3]; 2] = Default::default();
        // Superstep 0's sync gap (its checkpoint is the first, whole one).
        let mut first: [Vec<f64>; 2] = Default::default();
        for _ in 0..runs {
            for (mode, every) in [(0, 1_000_000), (1, 1)] {
                let run = run_driver(runtime, &peers, job, &wasm, every).await;
                job += 1;
                assert_eq!(
                    run.marks.len() as u32,
                    2 * (last + 1),
                    "every record arrived"
                );
                first[mode].push(ms(run.at(1, 0) - run.at(0, 1)));
                for s in 1..last {
                    let period = run.at(s + 1, 0) - run.at(s, 0);
                    let compute = run.at(s, 1) - run.at(s, 0);
                    let gap = run.at(s + 1, 0) - run.at(s, 1);
                    for (v, d) in stats[mode].iter_mut().zip([period, compute, gap]) {
                        v.push(ms(d));
                    }
                }
            }
        }
        let samples = stats[0][0].len();
        let mut both: Vec<f64> = stats[0][1].iter().chain(&stats[1][1]).copied().collect();
        let compute = median(&mut both);
        let m: Vec<[f64; 3]> = stats
            .iter_mut()
            .map(|s| [median(&mut s[0]), median(&mut s[1]), median(&mut s[2])])
            .collect();
        let f: Vec<f64> = first.iter_mut().map(|v| median(v)).collect();
        rows.push((secs, compute, samples, runs, m, f));
    }
    println!();
    println!(
        "   medians over supersteps 1 ..= last − 1 (10% changed) of all runs; runs alternate off, on"
    );
    println!("   period: start of s to start of s + 1; compute: the guest's work in s;");
    println!(
        "   sync gap: end of s's compute to start of s + 1 (capture, barrier; replication overlaps)"
    );
    println!(
        "   {:>9} {:>5} {:>12} {:>10} {:>11} {:>12}",
        "superstep", "mode", "samples", "period ms", "compute ms", "sync gap ms"
    );
    for (secs, _, samples, runs, m, _) in &rows {
        for (mode, name) in [(0, "off"), (1, "on")] {
            println!(
                "   {:>8.2}s {:>5} {:>12} {:>10.1} {:>11.1} {:>12.1}",
                secs,
                name,
                format!("{runs} × {}", samples / runs),
                m[mode][0],
                m[mode][1],
                m[mode][2]
            );
        }
    }
    println!();
    println!(
        "   checkpoint time = sync gap on − sync gap off (the compute is the same in both modes;"
    );
    println!(
        "   the capture is in the gap, and Done(s + 1) waits for the replicas' acknowledgement of"
    );
    println!(
        "   the checkpoint of s − 1, so replication shows in the gap only if it is slower than"
    );
    println!("   two supersteps);");
    println!("   superstep time = median compute of all runs + sync gap of the mode");
    println!(
        "   {:>9} {:>10} {:>10} {:>12} {:>12} {:>15} {:>9} {:>16}",
        "superstep",
        "compute ms",
        "ckpt ms",
        "off ms",
        "on ms",
        "(on − off)/on",
        "goal <5%",
        "periods: (on−off)/on"
    );
    for (secs, compute, _, _, m, _) in &rows {
        let ckpt = m[1][2] - m[0][2];
        let off = compute + m[0][2];
        let on = compute + m[1][2];
        let frac = (on - off) / on * 100.0;
        let by_period = (m[1][0] - m[0][0]) / m[1][0] * 100.0;
        println!(
            "   {:>8.2}s {:>10.1} {:>10.1} {:>12.1} {:>12.1} {:>14.1}% {:>9} {:>19.1}%",
            secs,
            compute,
            ckpt,
            off,
            on,
            frac,
            if frac < 5.0 { "met" } else { "not met" },
            by_period
        );
    }
    println!();
    println!(
        "   superstep 0 (grows to 64 MiB and fills every page): sync gap, median of the runs;"
    );
    println!("   with checkpointing on it carries the first checkpoint, which is whole");
    for (secs, _, _, _, _, f) in &rows {
        println!(
            "   {:>8.2}s  off {:>8.1} ms   on {:>8.1} ms   whole checkpoint {:>7.1} ms",
            secs,
            f[0],
            f[1],
            f[1] - f[0]
        );
    }
}

// ---- part 2: bytes on the wire -----------------------------------------------------

fn head(superstep: u32) -> Snapshot {
    Snapshot::head(0, superstep)
}

/// Nonzero contents everywhere.
fn state() -> Vec<u8> {
    (0..MEMORY).map(|i| (i * 31 % 251) as u8 + 1).collect()
}

/// Change `pages` pages spread over memory (one word each: a dirty page is
/// sent whole however much of it changed).
fn touch(memory: &mut [u8], pages: usize) {
    for k in 0..pages {
        let p = k * PAGES / pages;
        memory[p * PAGE_SIZE + 17] ^= 0x5a;
    }
}

/// Frames and bytes on the wire: the postcard encoding plus the codec's
/// 4-byte length prefix per frame.
fn wire_bytes(frames: &[Frame]) -> (usize, usize) {
    let bytes = frames
        .iter()
        .map(|f| net::encode(f).unwrap().len() + 4)
        .sum();
    (frames.len(), bytes)
}

/// The tracker after capturing `base` as superstep 0, acknowledged by
/// `REPLICA`, and the snapshot of superstep 1 with `changed` pages dirty.
fn delta(base: &[u8], changed: usize) -> (PageTracker, Snapshot, Snapshot) {
    let mut tracker = PageTracker::new();
    let s0 = tracker.capture(head(0), base);
    tracker.acked(REPLICA, 0, true);
    let mut memory = base.to_vec();
    touch(&mut memory, changed);
    let s1 = tracker.capture(head(1), &memory);
    (tracker, s0, s1)
}

fn part2(base: &[u8]) {
    println!();
    println!(
        "== 2. Bytes per checkpoint vs state size (PageTracker::plan → to_frames → net::encode) =="
    );
    println!(
        "   bytes sent = encoded frames + 4-byte length prefix each; a delta goes to a replica holding superstep 0"
    );
    println!("   goal: bytes sent proportional to dirty pages (sent / dirty ≈ 1)");
    println!(
        "   {:<24} {:>9} {:>11} {:>9} {:>6} {:>10} {:>10} {:>10}",
        "case",
        "state MiB",
        "dirty pages",
        "dirty MiB",
        "frames",
        "sent MiB",
        "sent/dirty",
        "sent/state"
    );
    let mut rows: Vec<(String, usize, Plan, Vec<Frame>)> = Vec::new();
    let mut whole_tracker = PageTracker::new();
    let s0 = whole_tracker.capture(head(0), base);
    let plan = whole_tracker.plan(REPLICA, &s0);
    assert_eq!(plan.base, None);
    let frames = to_frames(&s0, &plan.pages, plan.base);
    rows.push(("first checkpoint (whole)".into(), PAGES, plan, frames));
    for (pct, changed) in [(1, PAGES / 100), (10, PAGES / 10), (50, PAGES / 2)] {
        let (tracker, _, s1) = delta(base, changed);
        let plan = tracker.plan(REPLICA, &s1);
        assert_eq!(plan.base, Some(0));
        assert_eq!(plan.pages.len(), changed);
        let frames = to_frames(&s1, &plan.pages, plan.base);
        rows.push((format!("{pct}% changed (delta)"), changed, plan, frames));
    }
    for (label, dirty, plan, frames) in &rows {
        let (n, sent) = wire_bytes(frames);
        let dirty_bytes = dirty * PAGE_SIZE;
        assert_eq!(plan.pages.len(), *dirty);
        println!(
            "   {:<24} {:>9.1} {:>11} {:>9.2} {:>6} {:>10.3} {:>10.4} {:>10.4}",
            label,
            mib(MEMORY),
            dirty,
            mib(dirty_bytes),
            n,
            mib(sent),
            sent as f64 / dirty_bytes as f64,
            sent as f64 / MEMORY as f64
        );
    }
}

// ---- part 3: replication throughput ---------------------------------------------

/// Raw loopback TCP: `TCP_BYTES` in `TCP_CHUNK` writes, read and discarded.
async fn raw_tcp() -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut client = TcpStream::connect(addr).await.unwrap();
    let (mut server, _) = listener.accept().await.unwrap();
    client.set_nodelay(true).unwrap();
    server.set_nodelay(true).unwrap();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; TCP_CHUNK];
        let mut total = 0;
        while total < TCP_BYTES {
            let n = server.read(&mut buf).await.unwrap();
            assert!(n > 0, "the stream ended early");
            total += n;
        }
        Instant::now()
    });
    let chunk = vec![0x5au8; TCP_CHUNK];
    let t0 = Instant::now();
    for _ in 0..TCP_BYTES / TCP_CHUNK {
        client.write_all(&chunk).await.unwrap();
    }
    client.flush().await.unwrap();
    reader.await.unwrap() - t0
}

/// A replica that holds `base` (if any), received through its assembler as
/// the driver does, so its page hashes are cached.
fn replica_holding(base: Option<&Snapshot>) -> (Assembler, ReplicaStore) {
    let mut asm = Assembler::new(1 << 30);
    let mut store = ReplicaStore::new();
    if let Some(b) = base {
        for f in to_frames(b, &b.nonzero_pages(), None) {
            if let Some(Assembled::Checkpoint(s)) = asm.push(f, &mut store).unwrap() {
                store.insert(s);
            }
        }
        assert!(store.get(b.pid, b.superstep).is_some());
    }
    (asm, store)
}

/// Replicate `snap` per `plan` through one loopback connection with the data
/// plane's codec: `to_frames` + `net::encode` + send on one side, receive +
/// `net::decode` + `Assembler` (rebuild and verify) + `ReplicaStore` on the
/// other. Returns the time from the first `to_frames` to the verified
/// snapshot in the store.
async fn replicate(base: Option<&Snapshot>, snap: &Snapshot, plan: &Plan) -> Duration {
    let (mut asm, mut store) = replica_holding(base);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = TcpStream::connect(addr).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    client.set_nodelay(true).unwrap();
    server.set_nodelay(true).unwrap();
    let expected = snap.hash;
    let receiver = tokio::spawn(async move {
        let mut read = FramedRead::new(server, net::codec());
        while let Some(bytes) = read.next().await {
            let frame = net::decode(bytes.unwrap()).unwrap();
            if let Some(Assembled::Checkpoint(s)) = asm.push(frame, &mut store).unwrap() {
                assert_eq!(s.hash, expected);
                store.insert(s);
                return Instant::now();
            }
        }
        panic!("the connection ended before the checkpoint was complete");
    });
    let mut write = FramedWrite::new(client, net::codec());
    let t0 = Instant::now();
    for f in to_frames(snap, &plan.pages, plan.base) {
        write.feed(net::encode(&f).unwrap()).await.unwrap();
    }
    SinkExt::<bytes::Bytes>::flush(&mut write).await.unwrap();
    receiver.await.unwrap() - t0
}

/// Best-of-`ROUNDS` single-thread times of each stage, ms: capture,
/// to_frames, encode, decode, assemble (+ verify).
fn stages(base: &[u8], changed: Option<usize>) -> [f64; 5] {
    let mut best = [f64::MAX; 5];
    for _ in 0..reps(ROUNDS) {
        let mut t = [Duration::ZERO; 5];
        let (snap, plan, replica_base) = match changed {
            None => {
                let mut tracker = PageTracker::new();
                let c = Instant::now();
                let s = tracker.capture(head(0), base);
                t[0] = c.elapsed();
                let plan = tracker.plan(REPLICA, &s);
                (s, plan, None)
            }
            Some(n) => {
                // As the driver does: recycle the last snapshot's buffer.
                let mut tracker = PageTracker::new();
                let s0 = tracker.capture(head(0), base);
                tracker.acked(REPLICA, 0, true);
                let mut memory = base.to_vec();
                touch(&mut memory, n);
                let previous = s0.clone();
                let c = Instant::now();
                let s1 = tracker.capture_reusing(head(1), &memory, previous);
                t[0] = c.elapsed();
                let plan = tracker.plan(REPLICA, &s1);
                (s1, plan, Some(s0))
            }
        };
        let (mut asm, mut store) = replica_holding(replica_base.as_ref());
        let c = Instant::now();
        let frames = to_frames(&snap, &plan.pages, plan.base);
        t[1] = c.elapsed();
        let c = Instant::now();
        let encoded: Vec<_> = frames.iter().map(|f| net::encode(f).unwrap()).collect();
        t[2] = c.elapsed();
        drop(frames);
        let c = Instant::now();
        let decoded: Vec<Frame> = encoded
            .iter()
            .map(|b| net::decode(b.clone()).unwrap())
            .collect();
        t[3] = c.elapsed();
        let c = Instant::now();
        let mut got = None;
        for f in decoded {
            if let Some(Assembled::Checkpoint(s)) = asm.push(f, &mut store).unwrap() {
                got = Some(s);
            }
        }
        t[4] = c.elapsed();
        assert_eq!(got.map(|s| s.hash), Some(snap.hash));
        for (b, d) in best.iter_mut().zip(t) {
            *b = b.min(ms(d));
        }
    }
    best
}

async fn part3(base: &[u8]) {
    println!();
    println!("== 3. Replication throughput vs loopback TCP (same run) ==");
    println!("   goal: replication close to what loopback TCP carries");
    let mut best = Duration::MAX;
    for _ in 0..reps(TCP_ROUNDS) {
        best = best.min(raw_tcp().await);
    }
    let tcp = mib(TCP_BYTES) / best.as_secs_f64();
    println!(
        "   raw loopback TCP, {} MiB in {} KiB writes (best of {}): {:>7.1} ms  {:>6.0} MiB/s",
        TCP_BYTES >> 20,
        TCP_CHUNK >> 10,
        reps(TCP_ROUNDS),
        ms(best),
        tcp
    );

    let mut tracker = PageTracker::new();
    let s0 = tracker.capture(head(0), base);
    let whole_plan = tracker.plan(REPLICA, &s0);
    let (dtracker, d0, d1) = delta(base, PAGES / 10);
    let delta_plan = dtracker.plan(REPLICA, &d1);
    println!(
        "   replication = to_frames + encode + send | receive + decode + Assembler (rebuild, verify) + store"
    );
    println!(
        "   {:<34} {:>9} {:>9} {:>10} {:>9} {:>14}",
        format!("(best of {})", reps(ROUNDS)),
        "sent MiB",
        "time ms",
        "MiB/s sent",
        "÷ TCP",
        "state MiB/s"
    );
    for (label, snap, plan, b) in [
        ("whole 64 MiB snapshot", &s0, &whole_plan, None),
        (
            "10% delta (base held by replica)",
            &d1,
            &delta_plan,
            Some(&d0),
        ),
    ] {
        let mut best = Duration::MAX;
        for _ in 0..reps(ROUNDS) {
            best = best.min(replicate(b, snap, plan).await);
        }
        let sent = plan.pages.len() * PAGE_SIZE;
        let rate = mib(sent) / best.as_secs_f64();
        println!(
            "   {:<34} {:>9.1} {:>9.1} {:>10.0} {:>9.3} {:>14.0}",
            label,
            mib(sent),
            ms(best),
            rate,
            rate / tcp,
            mib(MEMORY) / best.as_secs_f64()
        );
    }
    println!();
    println!(
        "   the same stages on one thread, no socket (ms, best of {}):",
        reps(ROUNDS)
    );
    println!(
        "   {:<34} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "", "capture", "to_frames", "encode", "decode", "assemble"
    );
    for (label, changed) in [
        ("whole 64 MiB snapshot", None),
        ("10% delta (capture_reusing)", Some(PAGES / 10)),
    ] {
        let t = stages(base, changed);
        println!(
            "   {:<34} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            label, t[0], t[1], t[2], t[3], t[4]
        );
    }
    // For scale: a replica applies a delta to a copy of its base.
    let mut best = Duration::MAX;
    for _ in 0..reps(ROUNDS) {
        let t = Instant::now();
        let copy = std::hint::black_box(base.to_vec());
        best = best.min(t.elapsed());
        drop(copy);
    }
    println!(
        "   for scale: copying 64 MiB into a fresh buffer (as a replica copies its base) {:.1} ms",
        ms(best)
    );
}

fn main() {
    let started = Instant::now();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => QUICK.store(true, std::sync::atomic::Ordering::Relaxed),
            other => {
                eprintln!("error: unknown argument {other}; the only one is --quick");
                std::process::exit(2);
            }
        }
    }
    println!(
        "checkpoint benchmark: 64 MiB of state, load average at start {}",
        load_average()
    );
    let runtime = Runtime::new().expect("engine");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(part1(&runtime));
    let base = state();
    part2(&base);
    rt.block_on(part3(&base));
    println!();
    println!(
        "total {:.0} s, load average at end {}",
        started.elapsed().as_secs_f64(),
        load_average()
    );
}
