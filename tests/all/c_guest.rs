//! C guests (issue 16): BSPonMPI's BSPlib API tests, unchanged, compiled
//! with `bspweb cc` against `guest-c/conformance/test.h` and run on a real
//! cluster with their process counts. `success`: the job exits normally and
//! prints no `TEST FAILED`; `abort`: the job ends aborted with a message
//! (never a trap, a failure or a time-out).
//!
//! The suite is `guest-c/conformance/bsponmpi` (vendored from the
//! workplace's `shared/bsplib-conformance`); `BSPWEB_CONFORMANCE_DIR=DIR`
//! runs another copy with the same layout (`DIR/tests.txt`, `DIR/tests/*.c`).
//! The fault-injection and migration tests of a C guest are in `faults.rs`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bsp_api::rest::{JobEventKind, SubmitJob};

use crate::harness::{bspweb, run, shared};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Success,
    Abort,
}

struct Case {
    name: String,
    nprocs: u32,
    expect: Expect,
}

fn suite_dir() -> PathBuf {
    std::env::var_os("BSPWEB_CONFORMANCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("guest-c/conformance/bsponmpi")
        })
}

fn cases(dir: &Path) -> Vec<Case> {
    let list = std::fs::read_to_string(dir.join("tests.txt"))
        .unwrap_or_else(|e| panic!("read {}/tests.txt: {e}", dir.display()));
    list.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(
                f.len(),
                3,
                "a tests.txt line is `name nprocs expected`: {l:?}"
            );
            Case {
                name: f[0].to_string(),
                nprocs: f[1].parse().expect("a process count"),
                expect: match f[2] {
                    "success" => Expect::Success,
                    "abort" => Expect::Abort,
                    other => panic!("unknown expected result {other:?} in {l:?}"),
                },
            }
        })
        .collect()
}

/// Compile `src` with `bspweb cc -I guest-c/conformance`.
fn compile(src: &Path, out: &Path) -> Result<Vec<u8>, String> {
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest-c/conformance");
    let o = bspweb()
        .arg("cc")
        .arg("-I")
        .arg(&include)
        .arg(src)
        .arg("-o")
        .arg(out)
        .output()
        .map_err(|e| format!("run bspweb cc: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "bspweb cc failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    std::fs::read(out).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bsponmpi_api_tests_pass() {
    let dir = suite_dir();
    let cases = cases(&dir);
    let work = tempfile::tempdir().expect("a temporary directory");
    // Compile on two threads while nothing else needs the cores.
    let modules: Mutex<Vec<(usize, Result<Vec<u8>, String>)>> = Mutex::new(vec![]);
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(c) = cases.get(i) else { break };
                    let src = dir.join("tests").join(format!("{}.c", c.name));
                    let out = work.path().join(format!("{}.wasm", c.name));
                    let r = compile(&src, &out);
                    modules.lock().unwrap().push((i, r));
                }
            });
        }
    });
    let mut modules = modules.into_inner().unwrap();
    modules.sort_by_key(|(i, _)| *i);

    let client = shared().admin().await;
    let mut failures = vec![];
    for (case, (_, module)) in cases.iter().zip(modules) {
        let wasm = match module {
            Ok(w) => w,
            Err(e) => {
                failures.push(format!("{}: {e}", case.name));
                continue;
            }
        };
        let hash = client
            .upload_program(wasm, None)
            .await
            .expect("upload a conformance test")
            .hash;
        let r = run(
            &client,
            SubmitJob {
                program: hash,
                nprocs: case.nprocs,
                args: serde_json::Value::Null,
                description: Some(format!("BSPlib conformance {}", case.name)),
                resources: Default::default(),
                seed: Some(1),
                limits: None,
                min_peers: None,
            },
        )
        .await;
        let printed_failure = r.events.iter().find_map(|e| match &e.kind {
            JobEventKind::Stdout { text } | JobEventKind::Stderr { text }
                if text.contains("TEST FAILED") =>
            {
                Some(text.clone())
            }
            _ => None,
        });
        let verdict = match (case.expect, r.terminal(), printed_failure) {
            (_, _, Some(line)) => Err(format!("printed {line:?}")),
            (Expect::Success, JobEventKind::JobExited, None) => Ok(String::new()),
            (Expect::Abort, JobEventKind::JobAborted { reason }, None)
                if !reason.trim().is_empty() =>
            {
                Ok(format!(": {reason}"))
            }
            (_, _, None) => Err(format!(
                "expected {:?}, the job ended {}",
                case.expect,
                r.failure()
            )),
        };
        match verdict {
            Ok(how) => eprintln!(
                "  {} ({} procs): {:?} as expected{how}",
                case.name, case.nprocs, case.expect
            ),
            Err(why) => failures.push(format!("{} ({} procs): {why}", case.name, case.nprocs)),
        }
    }
    let passed = cases.len() - failures.len();
    eprintln!(
        "BSPlib conformance ({}): {passed} of {} tests pass",
        dir.display(),
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{passed} of {} BSPlib conformance tests pass; failing:\n  {}",
        cases.len(),
        failures.join("\n  ")
    );
}

/// The C examples of the README give the output their comments promise, the
/// same for every process count; the C PageRank prints exactly what the
/// Rust `pagerank` example prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_examples_print_what_they_promise() {
    let work = tempfile::tempdir().expect("a temporary directory");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest-c/examples");
    let client = shared().admin().await;
    let upload = async |name: &str| {
        let out = work.path().join(format!("{name}.wasm"));
        let o = bspweb()
            .arg("cc")
            .arg(examples.join(format!("{name}.c")))
            .arg("-o")
            .arg(&out)
            .output()
            .expect("run bspweb cc");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        client
            .upload_program(std::fs::read(&out).unwrap(), None)
            .await
            .expect("upload")
            .hash
    };
    let inner = upload("inner_product").await;
    let prefix = upload("prefix_sum").await;
    let pagerank = upload("pagerank").await;
    for p in [1, 3, 8] {
        let r = run(
            &client,
            crate::harness::job(&inner, p, serde_json::json!(["100000"])),
        )
        .await;
        r.assert_exited();
        assert_eq!(
            r.stdout(0),
            ["inner product of 100000-vectors: 449997.500000 (closed form 449997.500000: ok)"],
            "p = {p}"
        );
        let r = run(
            &client,
            crate::harness::job(&prefix, p, serde_json::json!(["100000"])),
        )
        .await;
        r.assert_exited();
        assert_eq!(
            r.stdout(0),
            [
                "prefix sums of 100000 integers: total 5050000, 100000 of 100000 prefixes match the closed form: ok"
            ],
            "p = {p}"
        );
    }
    let rust = run(
        &client,
        crate::harness::job(
            "pagerank",
            3,
            serde_json::json!({"n": 20000, "m": 100000, "iters": 15}),
        ),
    )
    .await;
    rust.assert_exited();
    for p in [1, 3, 4] {
        let c = run(
            &client,
            crate::harness::job(&pagerank, p, serde_json::json!(["20000", "100000", "15"])),
        )
        .await;
        c.assert_exited();
        assert_eq!(
            c.stdout(0),
            rust.stdout(0),
            "C PageRank at p = {p} vs the Rust guest at p = 3"
        );
    }
}
