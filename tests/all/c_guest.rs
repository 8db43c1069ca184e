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

/// The message a test expects its abort to carry: the string literals of
/// `abort("…" "…")` in its `TEST(…)` line, concatenated.
fn expected_abort(source: &str) -> Option<String> {
    let test = &source[source.find("TEST(")?..];
    let mut rest = &test[test.find("abort(")? + "abort(".len()..];
    let mut message = String::new();
    loop {
        rest = rest.trim_start();
        let Some(body) = rest.strip_prefix('"') else {
            break;
        };
        let end = body.find('"')?;
        message.push_str(&body[..end]);
        rest = &body[end + 1..];
    }
    Some(message)
}

/// Whether an abort `reason` is the one `expected`: the same function
/// (BSPonMPI's messages start with it, "bsp_sync/bsp_pop_reg: …"; the
/// wording after it may differ) or, for `bsp_abort`'s own text, the text.
fn same_abort(reason: &str, expected: &str) -> bool {
    match expected.split_once(": ") {
        Some((function, _)) if function.starts_with("bsp_") => {
            reason.contains(&format!("{function}: "))
        }
        _ => reason.contains(expected.trim_end()),
    }
}

#[test]
fn expected_aborts_are_read_from_the_test_source() {
    let src = r#"TEST( sync_2, abort("bsp_sync/bsp_end: Some processes have called bsp_sync, "
            "while others have called bsp_end instead") )"#;
    let want = "bsp_sync/bsp_end: Some processes have called bsp_sync, while others have called bsp_end instead";
    assert_eq!(expected_abort(src).as_deref(), Some(want));
    assert!(same_abort(
        "process 1 aborted in superstep 1: bsp_sync/bsp_end: differently worded",
        want
    ));
    assert!(!same_abort(
        "process 1 aborted: bsp_sync: malformed header from process 0",
        want
    ));
    assert!(same_abort("aborted: Twee = 2", "Twee = 2"));
    assert_eq!(expected_abort("TEST( x, success() )"), None);
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
    type Compiled = (usize, Result<Vec<u8>, String>);
    let modules: Mutex<Vec<Compiled>> = Mutex::new(vec![]);
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

/// Compile C `source` with `bspweb cc` and upload it; its hash.
async fn upload_c(client: &bsp_api::client::Client, name: &str, source: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let wasm = compile(&src, &dir.path().join(format!("{name}.wasm"))).expect("compile");
    client.upload_program(wasm, None).await.unwrap().hash
}

/// `bspweb cc` refuses what it cannot do with a message that says what to
/// do, shows the compiler's own diagnostics, and names the packages when a
/// tool is missing.
#[test]
fn bspweb_cc_errors_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let cc = |args: &[&str]| {
        let o = bspweb()
            .current_dir(dir.path())
            .arg("cc")
            .args(args)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let (ok, err) = cc(&["missing.c"]);
    assert!(!ok && err.contains("missing.c: no such file"), "{err}");

    std::fs::write(
        dir.path().join("broken.c"),
        "int main(void) { return undefined_name; }\n",
    )
    .unwrap();
    let (ok, err) = cc(&["broken.c"]);
    assert!(
        !ok && err.contains("broken.c:1:") && err.contains("undefined_name"),
        "{err}"
    );

    std::fs::write(dir.path().join("good.c"), "int main(void) { return 0; }\n").unwrap();
    let (ok, err) = cc(&["good.c", "-lpthread"]);
    assert!(
        !ok && err.contains("-lpthread") && err.contains("C sources"),
        "{err}"
    );
    let (ok, err) = cc(&["good.c", "-O9"]);
    assert!(!ok && err.contains("-O9"), "{err}");
    // -lm is accepted, and the output defaults to the source's name.
    let (ok, err) = cc(&["good.c", "-lm"]);
    assert!(ok, "{err}");
    assert!(dir.path().join("good.wasm").is_file());

    let o = bspweb()
        .current_dir(dir.path())
        .args(["cc", "good.c"])
        .env("PATH", dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("clang") && err.contains("apt-get install"),
        "{err}"
    );
}

/// The stderr lines of a job, in order.
fn stderr_of(r: &crate::harness::Run) -> Vec<&str> {
    r.events
        .iter()
        .filter_map(|e| match &e.kind {
            JobEventKind::Stderr { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// What the C library does on bspweb: argv from a JSON array of the job's
/// arguments, stdout and stderr line by line, `errno`, a deterministic clock
/// and `rand`, and exit, abort and assert ending the job with their reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_library_behaves_as_documented() {
    let client = shared().admin().await;
    let hash = upload_c(
        &client,
        "libc",
        r#"
#include <assert.h>
#include <bspweb.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
int main(int argc, char **argv) {
    char json[256];
    bspweb_args(json, sizeof json);
    printf("argc %d json %s\n", argc, json);
    for (int i = 1; i < argc; i++) printf("argv[%d] = <%s>\n", i, argv[i]);
    fprintf(stderr, "to stderr, ");
    fprintf(stderr, "one line\n");
    printf("time %lld rand %d\n", (long long)time(NULL), rand() % 1000);
    errno = 0;
    strtol("99999999999999999999", NULL, 10);
    printf("errno %s\n", errno == ERANGE ? "ERANGE" : "wrong");
    if (argc > 1 && strcmp(argv[1], "exit") == 0) exit(3);
    if (argc > 1 && strcmp(argv[1], "abort") == 0) abort();
    if (argc > 1 && strcmp(argv[1], "assert") == 0) assert(argc == 99);
    printf("no newline at the end");
    return 0;
}
"#,
    )
    .await;
    let job = |args| crate::harness::job(&hash, 1, args);

    let r = run(&client, job(serde_json::json!(["a b", 3, "\u{e9}\\n"]))).await;
    r.assert_exited();
    let first = r.stdout(0);
    assert_eq!(first[0], r#"argc 4 json ["a b",3,"é\\n"]"#);
    assert_eq!(
        &first[1..4],
        ["argv[1] = <a b>", "argv[2] = <3>", "argv[3] = <é\\n>"]
    );
    assert_eq!(first[5], "errno ERANGE");
    assert_eq!(first[6], "no newline at the end");
    assert_eq!(stderr_of(&r), ["to stderr, one line"]);
    // The same again: nothing depends on a clock or entropy.
    let again = run(&client, job(serde_json::json!(["a b", 3, "\u{e9}\\n"]))).await;
    assert_eq!(again.stdout(0), first);

    let r = run(&client, job(serde_json::json!({"n": 1}))).await;
    r.assert_exited();
    assert_eq!(r.stdout(0)[0], r#"argc 1 json {"n":1}"#);

    for (arg, reason) in [
        ("exit", "the program exited with status 3"),
        ("abort", "the program called abort()"),
        ("assert", "the program called abort()"),
    ] {
        let r = run(&client, job(serde_json::json!([arg]))).await;
        assert!(
            matches!(r.terminal(), JobEventKind::JobAborted { reason: why } if why.contains(reason)),
            "{arg}: {}",
            r.failure()
        );
        if arg == "assert" {
            let text = stderr_of(&r).concat();
            assert!(
                text.contains("argc == 99"),
                "the failed assertion is printed: {text}"
            );
        }
    }
}

/// Puts and gets larger than one host message (8 MiB) are split and arrive
/// whole; a get reads the remote memory before that superstep's puts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_puts_and_gets_are_split_into_messages() {
    let client = shared().admin().await;
    let hash = upload_c(
        &client,
        "large",
        r#"
#include <bsp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
static uint32_t value(size_t i, int s) { return (uint32_t)(i * 2654435761u) + (uint32_t)s; }
int main(void) {
    bsp_begin(bsp_nprocs());
    int p = bsp_nprocs(), s = bsp_pid();
    size_t n = 3u << 20; /* 12 MiB of uint32_t */
    uint32_t *a = malloc(n * 4), *b = calloc(n, 4), *c = calloc(n, 4);
    if (!a || !b || !c) bsp_abort("out of memory");
    for (size_t i = 0; i < n; i++) a[i] = value(i, s);
    bsp_push_reg(a, (int)(n * 4));
    bsp_push_reg(b, (int)(n * 4));
    bsp_sync();
    int right = (s + 1) % p, left = (s + p - 1) % p;
    bsp_put(right, a, b, 0, (int)(n * 4));
    bsp_get(right, a, 4, c, (int)((n - 1) * 4));
    bsp_put(right, a, a, 4, 4); /* over bytes the get reads: it sees them as before */
    bsp_sync();
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (b[i] != value(i, left)) bad++;
        if (i + 1 < n && c[i] != value(i + 1, right)) bad++;
    }
    printf("process %d: %zu wrong\n", s, bad);
    bsp_end();
    return 0;
}
"#,
    )
    .await;
    let r = run(
        &client,
        crate::harness::job(&hash, 3, serde_json::Value::Null),
    )
    .await;
    r.assert_exited();
    for pid in 0..3 {
        assert_eq!(r.stdout(pid), [format!("process {pid}: 0 wrong")]);
    }
}

/// BSPlib as BSPonMPI has it where the standard is loose: `bsp_begin`
/// takes process 0's count (BSPedupack sets it only there, after
/// `bsp_init`), a pop then a push of the same address re-registers it in
/// call order, and a zero-byte put checks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bsplib_follows_bsponmpi_where_the_standard_is_loose() {
    let client = shared().admin().await;
    let hash = upload_c(
        &client,
        "loose",
        r#"
#include <bsp.h>
#include <stdio.h>
static int P; /* set on process 0 only, as BSPedupack's programs do */
static void spmd(void) {
    bsp_begin(P);
    int s = bsp_pid(), p = bsp_nprocs();
    int buf[4] = {0, 0, 0, 0}, mine = s;
    bsp_push_reg(buf, sizeof(int)); /* first only its first int */
    bsp_sync();
    bsp_pop_reg(buf);
    bsp_push_reg(buf, sizeof buf); /* then all of it: pop, then push, in call order */
    bsp_put(0, &mine, NULL, 0, 0); /* zero bytes: nothing to check */
    bsp_sync();
    bsp_put((s + 1) % p, &mine, buf, 3 * sizeof(int), sizeof(int)); /* needs the new size */
    bsp_sync();
    printf("process %d of %d: %d\n", s, p, buf[3]);
    bsp_pop_reg(buf);
    bsp_end();
}
int main(int argc, char **argv) {
    bsp_init(spmd, argc, argv);
    P = 3;
    spmd();
    return 0;
}
"#,
    )
    .await;
    let r = run(
        &client,
        crate::harness::job(&hash, 5, serde_json::Value::Null),
    )
    .await;
    r.assert_exited();
    for pid in 0..3 {
        assert_eq!(
            r.stdout(pid),
            [format!("process {pid} of 3: {}", (pid + 2) % 3)]
        );
    }
    for pid in 3..5 {
        assert!(r.stdout(pid).is_empty());
    }
}
