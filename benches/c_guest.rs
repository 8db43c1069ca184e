//! C guests on bspweb against the same C compiled natively (issue 16).
//!
//! Two programs of `guest-c/examples/`, each built twice from one source:
//! natively with the host's C compiler (`$CC`, else `clang`, else `cc`;
//! `-O2`) against `guest-c/native/bsp_native.c`, the one-process BSPlib,
//! and as a bspweb module with `bspweb cc` (clang for wasm32, Asyncify at
//! every `bsp_sync`):
//!
//! - `inner_product.c`: the inner product of two 4 000 000-vectors,
//!   repeated `reps` times, a superstep each (the vectors are generated
//!   once), at p = 1 and 2 with the default checkpoint at every sync, and at
//!   p = 1 with checkpoints off;
//! - `pagerank.c`: the PageRank kernel of the Rust guest (200 000 vertices,
//!   1 000 000 edges), at p = 1 with the default checkpoint at every sync,
//!   p = 1 with checkpoints off, p = 2 with checkpoints, and the Rust guest
//!   `pagerank` at p = 1 with and without checkpoints beside them (what
//!   Asyncify, BSPlib's framing and clang's code cost against the Rust SDK
//!   and rustc's). The native C output must equal the Rust kernel's
//!   (`kernel::reference`), byte for byte.
//!
//! Every bspweb output must equal the native one. Times are wall clock, the
//! minimum over the runs: native from spawning the program to its exit,
//! bspweb from submission until the job's event stream ends, on a local
//! cluster of 4 peers (separate OS processes on loopback, started by the
//! end-to-end tests' harness, guest threads at nice 0). Both include the
//! program's set-up (vector or graph generation); bspweb's also include the
//! job's start-up, shown on its own as the time of a 1-iteration job. The
//! per-iteration cost is `(T(iters) − T(1)) / (iters − 1)` on both sides.
//!
//! Run: `cargo bench --bench c_guest` (200 repetitions of the inner
//! product, 100 PageRank iterations, 3 runs each; about a minute),
//! `-- --quick` (20 and 20, 1 run), or choose with
//! `-- --reps N --iters N --runs N`; `-- --only N` runs only the N-th bspweb
//! configuration (1–3 inner product, 4–8 PageRank, in the order above), for
//! a profiler. Needs a C compiler and the `bspweb cc` toolchain (clang,
//! lld, binaryen, wasi-libc; the error says what to install).

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

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bsp_api::client::Client;
use bsp_api::rest::{JobEventKind, JobLimits};
use serde_json::json;

/// Inner product: vector length (64 MB of vectors per process at p = 1).
const IP_N: u64 = 4_000_000;
/// PageRank: the Rust bench's graph.
const PR_N: u64 = 200_000;
const PR_M: u64 = 1_000_000;
const PR_SEED: u64 = 1;

/// Issue 16's goal: a C guest at p = 1 within this factor of native,
/// Asyncify included.
const P1_MAX_SLOWDOWN: f64 = 1.5;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    InnerProduct,
    PageRank,
}

impl Kernel {
    /// The C example's file stem in `guest-c/examples/`.
    fn stem(self) -> &'static str {
        match self {
            Kernel::InnerProduct => "inner_product",
            Kernel::PageRank => "pagerank",
        }
    }

    /// argv[1..] for `iters` iterations (repetitions).
    fn argv(self, iters: u32) -> Vec<String> {
        match self {
            Kernel::InnerProduct => vec![IP_N.to_string(), iters.to_string()],
            Kernel::PageRank => vec![
                PR_N.to_string(),
                PR_M.to_string(),
                iters.to_string(),
                PR_SEED.to_string(),
            ],
        }
    }
}

/// Which module a configuration runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Guest {
    /// The C example built by `bspweb cc`.
    C,
    /// The Rust `pagerank` guest registered with the supernode.
    RustPagerank,
}

struct Config {
    kernel: Kernel,
    label: &'static str,
    guest: Guest,
    p: u32,
    checkpoints: bool,
}

const CONFIGS: &[Config] = &[
    Config {
        kernel: Kernel::InnerProduct,
        label: "bspweb p = 1, checkpoint every sync",
        guest: Guest::C,
        p: 1,
        checkpoints: true,
    },
    Config {
        kernel: Kernel::InnerProduct,
        label: "bspweb p = 2, checkpoint every sync",
        guest: Guest::C,
        p: 2,
        checkpoints: true,
    },
    Config {
        kernel: Kernel::InnerProduct,
        label: "bspweb p = 1, checkpoints off",
        guest: Guest::C,
        p: 1,
        checkpoints: false,
    },
    Config {
        kernel: Kernel::PageRank,
        label: "bspweb p = 1, checkpoint every sync",
        guest: Guest::C,
        p: 1,
        checkpoints: true,
    },
    Config {
        kernel: Kernel::PageRank,
        label: "bspweb p = 1, checkpoints off",
        guest: Guest::C,
        p: 1,
        checkpoints: false,
    },
    Config {
        kernel: Kernel::PageRank,
        label: "bspweb p = 2, checkpoint every sync",
        guest: Guest::C,
        p: 2,
        checkpoints: true,
    },
    Config {
        kernel: Kernel::PageRank,
        label: "Rust guest p = 1, checkpoint every sync",
        guest: Guest::RustPagerank,
        p: 1,
        checkpoints: true,
    },
    Config {
        kernel: Kernel::PageRank,
        label: "Rust guest p = 1, checkpoints off",
        guest: Guest::RustPagerank,
        p: 1,
        checkpoints: false,
    },
];

/// One row of a table.
struct Row {
    label: String,
    total: Duration,
    one_iteration: Duration,
}

impl Row {
    fn per_iteration(&self, iters: u32) -> f64 {
        (secs(self.total) - secs(self.one_iteration)) / f64::from(iters - 1)
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}

/// The host's C compiler: `$CC`, else `clang` (the compiler `bspweb cc`
/// uses, so both sides get the same optimiser), else `cc`.
fn host_cc() -> String {
    if let Some(cc) = std::env::var_os("CC") {
        return cc.to_string_lossy().into_owned();
    }
    for cc in ["clang", "cc"] {
        if Command::new(cc).arg("--version").output().is_ok() {
            return cc.to_string();
        }
    }
    fail(
        "no C compiler found (`clang` or `cc` on PATH, or $CC): install one with `sudo apt-get install clang`",
    )
}

/// Builds `guest-c/examples/{stem}.c` natively and as a module into `out`;
/// returns (native binary, module bytes).
fn build(cc: &str, stem: &str, out: &Path) -> (PathBuf, Vec<u8>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = root.join(format!("guest-c/examples/{stem}.c"));
    let binary = out.join(stem);
    let native = Command::new(cc)
        .arg("-O2")
        .arg("-I")
        .arg(root.join("guest-c/include"))
        .arg(&source)
        .arg(root.join("guest-c/native/bsp_native.c"))
        .arg("-lm")
        .arg("-o")
        .arg(&binary)
        .output()
        .unwrap_or_else(|e| fail(format!("could not run {cc}: {e}")));
    if !native.status.success() {
        fail(format!(
            "{cc} could not build {}:\n{}",
            source.display(),
            String::from_utf8_lossy(&native.stderr)
        ));
    }
    let module = out.join(format!("{stem}.wasm"));
    let wasm = harness::bspweb()
        .arg("cc")
        .arg(&source)
        .arg("-o")
        .arg(&module)
        .output()
        .unwrap_or_else(|e| fail(format!("could not run bspweb cc: {e}")));
    if !wasm.status.success() {
        // Its message names the package to install when a tool is missing.
        fail(format!(
            "`bspweb cc {}` failed:\n{}",
            source.display(),
            String::from_utf8_lossy(&wasm.stderr).trim_end()
        ));
    }
    let bytes = std::fs::read(&module)
        .unwrap_or_else(|e| fail(format!("cannot read {}: {e}", module.display())));
    (binary, bytes)
}

/// Runs the native program once; its time and stdout lines.
fn native(binary: &Path, argv: &[String]) -> (Duration, Vec<String>) {
    let t = Instant::now();
    let out = Command::new(binary)
        .args(argv)
        .output()
        .unwrap_or_else(|e| fail(format!("could not run {}: {e}", binary.display())));
    let elapsed = t.elapsed();
    if !out.status.success() {
        fail(format!(
            "{} {} failed ({}): {}",
            binary.display(),
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    (elapsed, lines)
}

/// Runs one bspweb job to its end; its time and pid 0's output.
async fn bspweb(client: &Client, c: &Config, program: &str, iters: u32) -> (Duration, Vec<String>) {
    let args = match c.guest {
        Guest::C => json!(c.kernel.argv(iters)),
        Guest::RustPagerank => json!({"n": PR_N, "m": PR_M, "iters": iters, "seed": PR_SEED}),
    };
    let mut spec = harness::job(program, c.p, args);
    if !c.checkpoints {
        spec.limits = Some(JobLimits {
            checkpoint_every: 1_000_000,
            ..JobLimits::default()
        });
    }
    let t = Instant::now();
    let r = harness::run(client, spec).await;
    let elapsed = t.elapsed();
    if r.terminal() != &JobEventKind::JobExited {
        fail(format!(
            "{}: the job did not exit normally: {}",
            c.label,
            r.failure()
        ));
    }
    (elapsed, r.stdout(0))
}

fn check(label: &str, got: &[String], expected: &[String], reference: &str) {
    if got != expected {
        fail(format!(
            "{label} printed\n  {}\nbut {reference} printed\n  {}",
            got.join("\n  "),
            expected.join("\n  ")
        ));
    }
}

/// The native program's rows and outputs: (total, one iteration) times and
/// the outputs of the full and the 1-iteration runs.
struct Native {
    row: Row,
    expected: Vec<String>,
    expected_one: Vec<String>,
}

fn measure_native(binary: &Path, kernel: Kernel, iters: u32, runs: u32, cc: &str) -> Native {
    let (mut total, mut one) = (Duration::MAX, Duration::MAX);
    let (mut expected, mut expected_one) = (vec![], vec![]);
    for _ in 0..runs {
        let (t, lines) = native(binary, &kernel.argv(1));
        one = one.min(t);
        expected_one = lines;
        let (t, lines) = native(binary, &kernel.argv(iters));
        total = total.min(t);
        expected = lines;
    }
    Native {
        row: Row {
            label: format!("native, 1 thread ({cc} -O2)"),
            total,
            one_iteration: one,
        },
        expected,
        expected_one,
    }
}

fn print_table(title: &str, rows: &[Row], iters: u32) {
    let native = &rows[0];
    println!();
    println!("{title}");
    println!(
        "{:<40} {:>9} {:>9} {:>11} {:>14} {:>11}",
        "run", "time (s)", "× native", "1 iter (s)", "per iter (ms)", "× native/it"
    );
    for r in rows {
        println!(
            "{:<40} {:>9.3} {:>9.2} {:>11.3} {:>14.3} {:>11.2}",
            r.label,
            secs(r.total),
            secs(r.total) / secs(native.total),
            secs(r.one_iteration),
            r.per_iteration(iters) * 1e3,
            r.per_iteration(iters) / native.per_iteration(iters)
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let reps = flag_value(&args, "--reps").unwrap_or(if quick { 20 } else { 200 });
    let iters = flag_value(&args, "--iters").unwrap_or(if quick { 20 } else { 100 });
    let runs = flag_value(&args, "--runs").unwrap_or(if quick { 1 } else { 3 });
    let only = flag_value(&args, "--only").map(|n| {
        if n == 0 || n as usize > CONFIGS.len() {
            eprintln!("error: --only takes 1 to {}", CONFIGS.len());
            std::process::exit(2)
        }
        n as usize - 1
    });
    if reps < 2 || iters < 2 || runs < 1 {
        eprintln!("error: --reps and --iters must be at least 2, --runs at least 1");
        std::process::exit(2);
    }
    let iterations = |k: Kernel| match k {
        Kernel::InnerProduct => reps,
        Kernel::PageRank => iters,
    };

    let cc = host_cc();
    let out = harness::target_dir().join("c-guest-bench");
    std::fs::create_dir_all(&out)
        .unwrap_or_else(|e| fail(format!("cannot create {}: {e}", out.display())));
    let kernels = [Kernel::InnerProduct, Kernel::PageRank];
    let built: Vec<(PathBuf, Vec<u8>)> =
        kernels.iter().map(|k| build(&cc, k.stem(), &out)).collect();

    println!(
        "C guests (bspweb cc) against the same C built natively ({cc} -O2, guest-c/native/bsp_native.c); min of {runs} run(s); {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "inner product: n = {IP_N}, {reps} repetitions; pagerank: n = {PR_N}, m = {PR_M}, {iters} iterations, seed {PR_SEED}"
    );
    println!(
        "times include set-up (vectors, graph) on both sides and job start-up on bspweb's, shown on"
    );
    println!(
        "its own as the time of a 1-iteration job; per iter = (T(iters) − T(1)) / (iters − 1)."
    );

    // Native first, on a quiet machine.
    let natives: Vec<Native> = kernels
        .iter()
        .zip(&built)
        .map(|(&k, (binary, _))| measure_native(binary, k, iterations(k), runs, &cc))
        .collect();
    // The C port of PageRank prints what the Rust kernel prints.
    let pr = &natives[1];
    for (n, lines) in [(iters, &pr.expected), (1, &pr.expected_one)] {
        let params = kernel::Params::new(PR_N, PR_M, n, PR_SEED).expect("valid parameters");
        check(
            "the native C pagerank",
            lines,
            &kernel::reference(&params),
            "the Rust kernel",
        );
    }
    let ip = &natives[0].expected;
    if ip.len() != 1 || !ip[0].ends_with(": ok)") {
        fail(format!(
            "the native inner product printed {ip:?}, not one line ending in \": ok)\""
        ));
    }

    let cluster = harness::Cluster::start(harness::Options {
        peers: 4,
        ..Default::default()
    });
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let measured: Vec<(usize, Row)> = rt.block_on(async {
        let client = cluster.admin().await;
        let mut hashes = vec![];
        for (k, (_, bytes)) in kernels.iter().zip(&built) {
            let info = client
                .upload_program(bytes.clone(), None)
                .await
                .unwrap_or_else(|e| fail(format!("uploading {}.wasm: {e}", k.stem())));
            hashes.push(info.hash);
        }
        let peers = cluster.peers.len();
        for (k, hash) in kernels.iter().zip(&hashes) {
            harness::warm_up(&client, peers, hash, json!(k.argv(1))).await;
        }
        let rust = json!({"n": PR_N, "m": PR_M, "iters": 1, "seed": PR_SEED});
        harness::warm_up(&client, peers, "pagerank", rust).await;
        let mut measured = vec![];
        for (i, c) in CONFIGS.iter().enumerate() {
            if only.is_some_and(|o| o != i) {
                continue;
            }
            let k = kernels
                .iter()
                .position(|&k| k == c.kernel)
                .expect("a kernel");
            let program = match c.guest {
                Guest::C => hashes[k].as_str(),
                Guest::RustPagerank => "pagerank",
            };
            let n = iterations(c.kernel);
            let label = format!("{} {}", c.kernel.stem(), c.label);
            // Warm up this configuration (connections, allocator).
            bspweb(&client, c, program, 1).await;
            let (mut total, mut one_iteration) = (Duration::MAX, Duration::MAX);
            for _ in 0..runs {
                let (t, out) = bspweb(&client, c, program, 1).await;
                check(&label, &out, &natives[k].expected_one, "the native program");
                one_iteration = one_iteration.min(t);
                let (t, out) = bspweb(&client, c, program, n).await;
                check(&label, &out, &natives[k].expected, "the native program");
                total = total.min(t);
            }
            eprintln!("  {label}: {:.3} s", secs(total));
            measured.push((
                i,
                Row {
                    label: c.label.to_string(),
                    total,
                    one_iteration,
                },
            ));
        }
        measured
    });

    let mut tables = vec![];
    for (k, native) in kernels.iter().zip(natives) {
        let mut rows = vec![native.row];
        rows.extend(
            measured
                .iter()
                .filter(|(i, _)| CONFIGS[*i].kernel == *k)
                .map(|(_, r)| Row {
                    label: r.label.clone(),
                    total: r.total,
                    one_iteration: r.one_iteration,
                }),
        );
        let title = match k {
            Kernel::InnerProduct => format!("inner_product.c, n = {IP_N}, {reps} repetitions:"),
            Kernel::PageRank => format!("pagerank.c, n = {PR_N}, m = {PR_M}, {iters} iterations:"),
        };
        print_table(&title, &rows, iterations(*k));
        println!("every bspweb output equals the native one:");
        for line in &native.expected {
            println!("  {line}");
        }
        tables.push(rows);
    }
    println!(
        "(× native = time / native time; × native/it = per-iteration time / native per-iteration time)"
    );
    if only.is_some() {
        return;
    }

    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!();
    println!(
        "goal (issue 16): a C guest at p = 1 within {P1_MAX_SLOWDOWN}× native, Asyncify included:"
    );
    for (rows, k) in tables.iter().zip(kernels) {
        let native = &rows[0];
        for r in rows[1..]
            .iter()
            .filter(|r| r.label.starts_with("bspweb p = 1"))
        {
            let total = secs(r.total) / secs(native.total);
            let per = r.per_iteration(iterations(k)) / native.per_iteration(iterations(k));
            println!(
                "  {} {}: {total:.2}× in total time, {per:.2}× per iteration — {}",
                k.stem(),
                r.label.trim_start_matches("bspweb "),
                verdict(total <= P1_MAX_SLOWDOWN)
            );
        }
    }
}
