//! PageRank on bspweb against the same Rust code run natively (issue 13).
//!
//! The `pagerank` guest's kernel (`guest-sdk/examples/pagerank/kernel.rs`)
//! is compiled into this benchmark as the native reference and run on one
//! thread; the guest runs on a local cluster of 4 peers (separate OS
//! processes on loopback, started by the end-to-end tests' harness) at
//! p = 1, 2 and 4 with the default checkpoint at every sync, and at p = 2
//! and p = 1 with checkpoints off (`checkpoint_every` 1 000 000; p = 1
//! without checkpoints is the guest's compiled code and the runtime, the
//! floor of any checkpointed run), and p = 2 with one replica per
//! checkpoint instead of two (what the replication volume costs), and p = 2
//! with redundancy 2 (issue 18: every process on two peers of different
//! volunteers, results compared; the cluster's peers belong to two
//! volunteers). Every bspweb output must equal the native one, byte for
//! byte.
//!
//! Times are wall clock, the minimum over the runs. Native: graph generation
//! plus the iterations. bspweb: from submission until the job's event stream
//! ends, which includes graph generation (in every process) and the job's
//! start-up (placement, program download and compilation, connections,
//! output upload); the start-up is shown on its own as the time of a
//! 1-iteration job, and the per-iteration cost as
//! `(T(iters) − T(1)) / (iters − 1)` on both sides. Beside it, the CPU
//! time the whole cluster (supernode and peers, every thread) used per
//! iteration, the same way, and the cores that kept busy: on a machine
//! with `c` cores no configuration can take less than CPU/iter ÷ `c` per
//! iteration, which bounds what overlap and scheduling can ever win.
//!
//! Run: `cargo bench --bench pagerank` (100 iterations, 3 runs each; a few
//! minutes), `-- --quick` (20 iterations, 1 run), or choose with
//! `-- --iters N --runs N`; `-- --only N` runs only the N-th bspweb
//! configuration (1: p = 1, 2: p = 2, 3: p = 4, 4: p = 2 without
//! checkpoints, 5: p = 1 without, 6: p = 2 with one replica, 7: p = 2 with
//! redundancy 2), for a profiler.
//!
//! Beside native's one thread, the same kernel on two threads of this
//! process that share memory (no sandbox, sockets or checkpoints, one copy
//! of each contribution block): what this machine's two cores give the
//! workload at best, the ceiling for p = 2's speed-up.
//!
//! First it prints two facts about the machine that move every ratio
//! (see [`machine`]): the work two busy cores do against one, and the
//! cost of the first write to a fresh page.
//!
//! After the table (not with `--only`): the start-up of a 4-process job
//! whose program no peer has seen (the `pagerank` module with a custom
//! section of its own, uploaded afresh), against the same job once the
//! peers have it compiled, the same job after every peer restarted (each
//! reads the program back from its compile cache on disk), and compiling
//! the module once here.

#[path = "../tests/all/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "../supernode/tests/support/throwaway_pg.rs"]
mod throwaway_pg;

#[path = "../guest-sdk/examples/pagerank/kernel.rs"]
#[allow(dead_code)]
mod kernel;

#[path = "common/args.rs"]
mod args;
use args::flag_value;

use std::ops::Range;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use bsp_api::client::Client;
use bsp_api::rest::JobLimits;
use serde_json::json;

const N: u64 = 200_000;
const M: u64 = 1_000_000;
const SEED: u64 = 1;
/// Peers of the bench's cluster: two of the administrator's, two of a
/// second volunteer's.
const PEERS: usize = 4;

/// Issue 13's goals.
const P1_MAX_SLOWDOWN: f64 = 1.4;
const P2_MIN_SPEEDUP: f64 = 1.2;
/// Issue 18's: redundancy 2 against 1 (p = 2, checkpoints), on a machine
/// with spare cores.
const REDUNDANCY_MAX_COST: f64 = 2.2;

struct Config {
    label: &'static str,
    p: u32,
    checkpoints: bool,
    /// Replicas of each checkpoint (the job default, 2, when `None`).
    replicas: Option<u32>,
    /// Copies of each process (issue 18's result validation).
    redundancy: u32,
}

const CONFIGS: &[Config] = &[
    Config {
        label: "bspweb p = 1, checkpoint every sync",
        p: 1,
        checkpoints: true,
        replicas: None,
        redundancy: 1,
    },
    Config {
        label: "bspweb p = 2, checkpoint every sync",
        p: 2,
        checkpoints: true,
        replicas: None,
        redundancy: 1,
    },
    Config {
        label: "bspweb p = 4, checkpoint every sync",
        p: 4,
        checkpoints: true,
        replicas: None,
        redundancy: 1,
    },
    Config {
        label: "bspweb p = 2, checkpoints off",
        p: 2,
        checkpoints: false,
        replicas: None,
        redundancy: 1,
    },
    Config {
        label: "bspweb p = 1, checkpoints off",
        p: 1,
        checkpoints: false,
        replicas: None,
        redundancy: 1,
    },
    Config {
        label: "bspweb p = 2, checkpoints, 1 replica",
        p: 2,
        checkpoints: true,
        replicas: Some(1),
        redundancy: 1,
    },
    Config {
        label: "bspweb p = 2, checkpoints, redundancy 2",
        p: 2,
        checkpoints: true,
        replicas: None,
        redundancy: 2,
    },
];

/// One row of the table.
struct Row {
    label: String,
    total: Duration,
    one_iteration: Duration,
    /// CPU time per iteration of every process of the cluster (supernode
    /// and peers, all threads), in seconds; native: its wall time.
    cpu_per_iter: f64,
}

/// The native reference: its time and output.
fn native(params: &kernel::Params) -> (Duration, Vec<String>) {
    let t = Instant::now();
    let lines = kernel::reference(params);
    (t.elapsed(), lines)
}

/// Two facts about this machine that move every ratio below, measured
/// here so that runs on different machines can be compared: the work two
/// busy cores do against one (a virtual machine whose two CPUs share a
/// physical core, or compete with other guests, does well under 2×: every
/// replica's or peer's thread that runs beside a guest slows it), and what
/// the first write to a fresh 4 KiB page costs (memory the process has
/// not touched yet: a snapshot's copy, a retained message; a fraction of
/// a µs on bare metal, several µs in some virtual machines).
fn machine() {
    const SPIN: u64 = 500_000_000;
    let spin = || {
        let t = Instant::now();
        let mut x = 0u64;
        for i in 0..SPIN {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        std::hint::black_box(x);
        t.elapsed()
    };
    // Best of three each: a moment's disturbance should not decide it.
    let one = (0..3).map(|_| spin()).min().expect("three runs");
    let two = (0..3)
        .map(|_| {
            std::thread::scope(|s| {
                let other = s.spawn(spin);
                let mine = spin();
                mine.max(other.join().expect("the spin thread does not panic"))
            })
        })
        .min()
        .expect("three runs");
    const LEN: usize = 64 << 20;
    let page = vec![1u8; 4096];
    let fill = |buffer: &mut [u8]| {
        let t = Instant::now();
        for chunk in buffer.chunks_mut(4096) {
            chunk.copy_from_slice(&page);
        }
        std::hint::black_box(&buffer[..]);
        t.elapsed()
    };
    // A zeroed allocation this large is a fresh mapping: its pages fault in
    // as they are first written; the second fill writes the same pages.
    let mut buffer = vec![0u8; LEN];
    let fresh = fill(&mut buffer);
    let warm = fill(&mut buffer);
    let pages = (LEN / 4096) as f64;
    println!(
        "this machine: two busy cores do {:.2}× the work of one; the first write to a fresh 4 KiB page costs {:.2} µs (a warm page {:.2} µs)",
        2.0 * secs(one) / secs(two),
        secs(fresh.saturating_sub(warm)) * 1e6 / pages,
        secs(warm) * 1e6 / pages,
    );
}

/// The same kernel on `threads` threads of this process, the way the guest
/// runs it on `threads` processes but through shared memory: each thread
/// owns a block of vertices (`bspweb::dist::block`, as in the guest), and each
/// iteration it scatters, copies each other block's accumulator entries
/// (with its dangling sum) into a slot for their owner, waits at a barrier,
/// adds what the others left for it and updates its ranks. No checkpoints,
/// no sockets, no sandbox: what two cores of this machine give this
/// workload at best, the ceiling for bspweb's speed-up.
fn native_threads(params: &kernel::Params, threads: u32) -> (Duration, Vec<String>) {
    let t = Instant::now();
    // The guest's blocks (`bspweb::dist::block`); they fit u32 as `n` does.
    let blocks: Vec<Range<u32>> = (0..threads)
        .map(|q| {
            let b = bspweb::dist::block(u64::from(params.n), threads, q);
            b.start as u32..b.end as u32
        })
        .collect();
    // slots[from * threads + to]: what `from` sends `to` this iteration.
    let slots: Vec<Mutex<Vec<u8>>> = (0..threads * threads).map(|_| Mutex::default()).collect();
    let barrier = Barrier::new(threads as usize);
    let summaries: Vec<kernel::Summary> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|pid| {
                let (blocks, slots, barrier) = (&blocks, &slots, &barrier);
                s.spawn(move || {
                    let graph = kernel::Graph::generate(params, blocks[pid as usize].clone());
                    let mut pr = kernel::PageRank::new(params, &graph);
                    for _ in 0..params.iters {
                        let own_dangling = pr.scatter(&graph);
                        for q in (0..threads).filter(|&q| q != pid) {
                            let mut slot = slots[(pid * threads + q) as usize]
                                .lock()
                                .expect("no worker panicked");
                            slot.clear();
                            kernel::encode_words(&mut slot, &[own_dangling]);
                            kernel::encode_words(
                                &mut slot,
                                pr.outgoing(blocks[q as usize].clone()),
                            );
                        }
                        pr.clear_outgoing();
                        barrier.wait();
                        let mut dangling = own_dangling;
                        for q in (0..threads).filter(|&q| q != pid) {
                            let slot = slots[(q * threads + pid) as usize]
                                .lock()
                                .expect("no worker panicked");
                            let (head, rest) = slot.split_at(8);
                            dangling = dangling.wrapping_add(u64::from_le_bytes(
                                head.try_into().expect("8 bytes"),
                            ));
                            pr.absorb(0, rest).expect("a whole block");
                        }
                        // Nobody refills a slot before its owner has read it.
                        barrier.wait();
                        pr.update(dangling);
                    }
                    pr.summary(&graph)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker thread"))
            .collect()
    });
    let mut total = kernel::Summary::default();
    for s in &summaries {
        total.merge(s);
    }
    (t.elapsed(), total.lines(params))
}

/// Runs one bspweb job to its end; its time and pid 0's output.
async fn bspweb(client: &Client, c: &Config, iters: u32) -> (Duration, Vec<String>) {
    let mut spec = harness::job(
        "pagerank",
        c.p,
        json!({"n": N, "m": M, "iters": iters, "seed": SEED}),
    );
    if !c.checkpoints || c.replicas.is_some() || c.redundancy != 1 {
        let default = JobLimits::default();
        spec.limits = Some(JobLimits {
            checkpoint_every: if c.checkpoints {
                default.checkpoint_every
            } else {
                1_000_000
            },
            replicas: c.replicas.unwrap_or(default.replicas),
            redundancy: c.redundancy,
            ..default
        });
    }
    let t = Instant::now();
    let r = harness::run(client, spec).await;
    let elapsed = t.elapsed();
    r.assert_exited();
    (elapsed, r.stdout(0))
}

/// What starting a job costs when its program is new to every peer.
struct StartUp {
    /// A 4-process job of a tiny PageRank whose program no peer has seen.
    new: Duration,
    /// The same job again: every peer has it compiled.
    cached: Duration,
    /// The same job after every peer restarted: each downloads the program
    /// again and reads its compiled code back from its compile cache.
    restarted: Duration,
    /// Compiling the program once, on this thread, as a peer does.
    compile: Duration,
}

impl StartUp {
    fn print(&self) {
        let ms = |d: Duration| secs(d) * 1e3;
        let extra = ms(self.new) - ms(self.cached);
        println!();
        println!(
            "start-up of a 4-process job whose program is new to every peer (a tiny PageRank):"
        );
        println!(
            "  program new: {:.0} ms; cached: {:.0} ms; compiling it once alone: {:.0} ms",
            ms(self.new),
            ms(self.cached),
            ms(self.compile)
        );
        println!(
            "  a new program costs {extra:.0} ms = {:.2} compiles (each peer of the job compiles it, \
             all at once: with a core per peer, 1 at best)",
            extra / ms(self.compile),
        );
        println!(
            "  after every peer restarted: {:.0} ms = {:.2} compiles more than cached \
             (the program downloaded again, its compiled code read from the compile cache)",
            ms(self.restarted),
            (ms(self.restarted) - ms(self.cached)) / ms(self.compile),
        );
    }
}

/// Times jobs of programs no peer has seen: the `pagerank` module with a
/// custom section of its own (a new hash, the same code), each uploaded
/// and run once, then run again from the peers' caches, then once more
/// after every peer of `cluster` restarted; and one compile of such a
/// module here (the best of `runs` of each).
async fn start_up(cluster: &mut harness::Cluster, client: &Client, runs: u32) -> StartUp {
    let wasm = bspweb_programs::get("pagerank")
        .expect("pagerank is built in")
        .wasm;
    let variant = |nonce: &str| {
        let mut body = vec![5u8];
        body.extend_from_slice(b"nonce");
        body.extend_from_slice(nonce.as_bytes());
        let mut v = wasm.to_vec();
        // A custom section; a size below 128 is its own one-byte LEB128.
        assert!(
            body.len() < 128,
            "a nonce of {} bytes is too long",
            body.len()
        );
        v.push(0);
        v.push(body.len() as u8);
        v.extend_from_slice(&body);
        v
    };
    let tiny = json!({"n": 1000, "m": 5000, "iters": 1, "seed": SEED});
    let (mut new, mut cached, mut compile) = (Duration::MAX, Duration::MAX, Duration::MAX);
    let mut restarted = Duration::MAX;
    let runtime = bspweb_peer::runtime::Runtime::new().expect("a wasmtime engine");
    let unique = std::process::id();
    for run in 0..runs {
        let name = format!("pagerank-new-{unique}-{run}");
        client
            .upload_program(variant(&name), Some(&name))
            .await
            .expect("the variant uploads");
        for slot in [&mut new, &mut cached] {
            let t = Instant::now();
            harness::run(client, harness::job(&name, 4, tiny.clone()))
                .await
                .assert_exited();
            *slot = (*slot).min(t.elapsed());
        }
        restart_peers(cluster).await;
        let t = Instant::now();
        harness::run(client, harness::job(&name, 4, tiny.clone()))
            .await
            .assert_exited();
        restarted = restarted.min(t.elapsed());
        let bytes = variant(&format!("compile-{unique}-{run}"));
        let hash = bspweb_peer::runtime::module_hash(&bytes);
        let t = Instant::now();
        runtime
            .compile(&hash, &bytes)
            .expect("the variant compiles");
        compile = compile.min(t.elapsed());
    }
    StartUp {
        new,
        cached,
        restarted,
        compile,
    }
}

/// Stop the running peers of `cluster`, the last `PEERS` started (SIGTERM:
/// each drains and exits), and start each again with its name, enrollment
/// and compile cache, as after a reboot; returns once all are online again.
async fn restart_peers(cluster: &mut harness::Cluster) {
    let n = cluster.peers.len();
    let running: Vec<(usize, String)> = (n - PEERS..n)
        .map(|i| (i, cluster.peers[i].name.clone()))
        .collect();
    for (i, _) in &running {
        assert!(cluster.stop_peer(*i).success());
    }
    for (_, name) in &running {
        if name.starts_with("vera-") {
            cluster.add_volunteer_peer("vera", name, &[]).await;
        } else {
            cluster.add_peer(name, &[]);
        }
    }
    cluster.wait_for_peers(running.len());
}

fn check(label: &str, got: &[String], expected: &[String]) {
    if got != expected {
        eprintln!("error: {label} printed\n  {}", got.join("\n  "));
        eprintln!(
            "but the native reference printed\n  {}",
            expected.join("\n  ")
        );
        std::process::exit(1);
    }
}

/// The label of the two-thread native run.
const NATIVE_2: &str = "native, 2 threads, shared memory";

/// The CPU time this process has used (every thread), in seconds.
fn own_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes only into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let iters = flag_value(&args, "--iters").unwrap_or(if quick { 20 } else { 100 });
    let runs = flag_value(&args, "--runs").unwrap_or(if quick { 1 } else { 3 });
    // `--only N`: run only the N-th bspweb configuration, to profile it.
    let only = flag_value(&args, "--only").map(|n| {
        CONFIGS
            .get((n as usize).wrapping_sub(1))
            .unwrap_or_else(|| {
                eprintln!("error: --only takes 1 to {}", CONFIGS.len());
                std::process::exit(2)
            })
            .label
    });
    if iters < 2 || runs < 1 {
        eprintln!("error: --iters must be at least 2 and --runs at least 1");
        std::process::exit(2);
    }
    let params = kernel::Params::new(N, M, iters, SEED).expect("valid parameters");
    let one = kernel::Params::new(N, M, 1, SEED).expect("valid parameters");

    println!(
        "pagerank: n = {N}, m = {M}, {iters} iterations, seed {SEED}; min of {runs} run(s); {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "native and bspweb times both include graph generation; bspweb's also include job start-up"
    );
    println!("(submission to end of output), shown on its own as the time of a 1-iteration job.");
    machine();

    // Native first, on a quiet machine.
    let (mut native_total, mut native_one) = (Duration::MAX, Duration::MAX);
    let mut expected = vec![];
    let mut expected_one = vec![];
    for _ in 0..runs {
        let (t, lines) = native(&one);
        native_one = native_one.min(t);
        expected_one = lines;
        let (t, lines) = native(&params);
        native_total = native_total.min(t);
        expected = lines;
    }
    let mut rows = vec![Row {
        label: "native, 1 thread".into(),
        total: native_total,
        one_iteration: native_one,
        cpu_per_iter: (secs(native_total) - secs(native_one)) / f64::from(iters - 1),
    }];
    // The same kernel on two threads sharing memory: this machine's ceiling.
    let (mut total, mut one_iteration) = (Duration::MAX, Duration::MAX);
    let (mut cpu_one, mut cpu_all) = (f64::MAX, f64::MAX);
    for _ in 0..runs {
        let before = own_cpu_seconds();
        let (t, lines) = native_threads(&one, 2);
        let between = own_cpu_seconds();
        check(NATIVE_2, &lines, &expected_one);
        one_iteration = one_iteration.min(t);
        let (t, lines) = native_threads(&params, 2);
        cpu_one = cpu_one.min(between - before);
        cpu_all = cpu_all.min(own_cpu_seconds() - between);
        check(NATIVE_2, &lines, &expected);
        total = total.min(t);
    }
    rows.push(Row {
        label: NATIVE_2.into(),
        total,
        one_iteration,
        cpu_per_iter: (cpu_all - cpu_one).max(0.0) / f64::from(iters - 1),
    });

    // Two peers of the administrator's and two of a second volunteer's:
    // redundancy puts a process's copies on different volunteers.
    let mut cluster = harness::Cluster::start(harness::Options {
        peers: 2,
        ..Default::default()
    });
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    rt.block_on(async {
        for name in ["vera-1", "vera-2"] {
            cluster.add_volunteer_peer("vera", name, &[]).await;
        }
    });
    cluster.wait_for_peers(PEERS);
    let mut startup = None;
    rt.block_on(async {
        let client = cluster.admin().await;
        let warm = json!({"n": N, "m": M, "iters": 1, "seed": SEED});
        harness::warm_up(&client, cluster.peers.len(), "pagerank", warm).await;
        for c in CONFIGS.iter().filter(|c| only.is_none_or(|o| c.label == o)) {
            // Warm up this configuration (connections, allocator).
            bspweb(&client, c, 1).await;
            let (mut total, mut one_iteration) = (Duration::MAX, Duration::MAX);
            // CPU of the cluster during the runs of each length (the least
            // of each: background work only adds).
            let (mut cpu_one, mut cpu_all) = (f64::MAX, f64::MAX);
            for _ in 0..runs {
                let before = cluster.cpu_seconds();
                let (t, out) = bspweb(&client, c, 1).await;
                let between = cluster.cpu_seconds();
                check(c.label, &out, &expected_one);
                one_iteration = one_iteration.min(t);
                let (t, out) = bspweb(&client, c, iters).await;
                cpu_one = cpu_one.min(between - before);
                cpu_all = cpu_all.min(cluster.cpu_seconds() - between);
                check(c.label, &out, &expected);
                total = total.min(t);
            }
            eprintln!("  {}: {:.3} s", c.label, secs(total));
            rows.push(Row {
                label: c.label.into(),
                total,
                one_iteration,
                cpu_per_iter: (cpu_all - cpu_one).max(0.0) / f64::from(iters - 1),
            });
        }
        if only.is_none() {
            startup = Some(start_up(&mut cluster, &client, runs).await);
        }
    });

    println!();
    println!(
        "{:<38} {:>9} {:>9} {:>9} {:>11} {:>14} {:>12} {:>6}",
        "run",
        "time (s)",
        "× native",
        "speed-up",
        "1 iter (s)",
        "per iter (ms)",
        "CPU/iter ms",
        "cores"
    );
    for r in &rows {
        let per_iter = (secs(r.total) - secs(r.one_iteration)) / f64::from(iters - 1);
        println!(
            "{:<38} {:>9.3} {:>9.2} {:>9.2} {:>11.3} {:>14.2} {:>12.2} {:>6.2}",
            r.label,
            secs(r.total),
            secs(r.total) / secs(native_total),
            secs(native_total) / secs(r.total),
            secs(r.one_iteration),
            per_iter * 1e3,
            r.cpu_per_iter * 1e3,
            r.cpu_per_iter / per_iter
        );
    }
    println!("(× native = time / native time; speed-up = native time / time;");
    println!(" CPU/iter: CPU time of the whole cluster per iteration, all processes and threads,");
    println!(" in clock ticks of 10 ms; cores: CPU/iter over per iter, the cores it kept busy)");
    println!("every bspweb output equals the native reference's:");
    for line in &expected {
        println!("  {line}");
    }

    if let Some(s) = startup {
        s.print();
    }

    let time = |label: &str| {
        rows.iter()
            .find(|r| r.label == label)
            .map(|r| secs(r.total))
            .expect("a measured row")
    };
    if only.is_some() {
        return;
    }
    let p1 = time(CONFIGS[0].label) / secs(native_total);
    let p2 = secs(native_total) / time(CONFIGS[1].label);
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!();
    println!("goals (issue 13):");
    println!(
        "  bspweb p = 1 (checkpoints) within {P1_MAX_SLOWDOWN}× native: {p1:.2}× — {}",
        verdict(p1 <= P1_MAX_SLOWDOWN)
    );
    println!(
        "  bspweb p = 2 (checkpoints) at least {P2_MIN_SPEEDUP}× faster than native: {p2:.2}× — {}",
        verdict(p2 >= P2_MIN_SPEEDUP)
    );
    println!(
        "    (the same kernel on 2 threads sharing memory, no checkpoints: {:.2}× faster than native)",
        secs(native_total) / time(NATIVE_2)
    );
    let cost = time(CONFIGS[6].label) / time(CONFIGS[1].label);
    println!("goal (issue 18):");
    println!(
        "  bspweb p = 2 with redundancy 2 within {REDUNDANCY_MAX_COST}× of redundancy 1: {cost:.2}× — {} ({} cores here; the goal is for a machine with spare cores)",
        verdict(cost <= REDUNDANCY_MAX_COST),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}
