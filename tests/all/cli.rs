//! The `bspweb` CLI as a user runs it.

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use bsp_api::rest::{JobEvent, JobEventKind, JobInfo, PeerInfo, ProgramInfo};

use crate::harness::{ADMIN, ADMIN_PASSWORD, bspweb, shared};

/// `bspweb ARGS` as the admin of the shared cluster, with its own config dir.
fn as_admin(args: &[&str], config: &std::path::Path) -> Command {
    let mut cmd = bspweb();
    cmd.args(args)
        .env("BSPWEB_URL", &shared().url)
        .env("BSPWEB_USER", ADMIN)
        .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
        .env("BSPWEB_CONFIG_DIR", config)
        .stdin(Stdio::null());
    cmd
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The exit codes `bspweb --help` documents: code → description.
fn documented_codes() -> BTreeMap<u8, String> {
    let help = bspweb().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    let table = help
        .split("Exit status:")
        .nth(1)
        .unwrap_or_else(|| panic!("--help documents no exit status:\n{help}"));
    table
        .lines()
        .filter_map(|l| {
            let (code, what) = l.trim().split_once("  ")?;
            Some((code.parse().ok()?, what.trim().to_string()))
        })
        .collect()
}

/// The one documented code whose description contains `what`.
#[track_caller]
fn documented_code(what: &str) -> i32 {
    let codes = documented_codes();
    let hits: Vec<u8> = codes
        .iter()
        .filter(|(_, d)| d.contains(what))
        .map(|(c, _)| *c)
        .collect();
    assert_eq!(hits.len(), 1, "{what:?} in {codes:#?}");
    i32::from(hits[0])
}

#[test]
fn submit_follow_prints_every_process_and_exits_zero() {
    let c = shared();
    let config = tempfile::tempdir().unwrap();
    let out = bspweb()
        .args(["submit", "ring", "-n", "8", "--follow"])
        .env("BSPWEB_URL", &c.url)
        .env("BSPWEB_USER", ADMIN)
        .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
        .env("BSPWEB_CONFIG_DIR", config.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        out.status
    );
    for pid in 0..8 {
        assert!(
            stdout.contains(&format!("[{pid}] got in total 2 messages")),
            "pid {pid} missing:\n{stdout}"
        );
    }
    assert!(stderr.contains("exited"), "{stderr}");
}

#[test]
fn a_failing_job_makes_submit_follow_exit_non_zero() {
    let c = shared();
    let config = tempfile::tempdir().unwrap();
    let wasm = bspweb_programs::get("misbehave").unwrap().wasm;
    let path = config.path().join("misbehave.wasm");
    std::fs::write(&path, wasm).unwrap();
    let out = bspweb()
        .arg("submit")
        .arg(&path)
        .args(["-n", "2", "--args", r#"{"mode": "abort"}"#, "--follow"])
        .env("BSPWEB_URL", &c.url)
        .env("BSPWEB_USER", ADMIN)
        .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
        .env("BSPWEB_CONFIG_DIR", config.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(documented_code("aborted")),
        "{stderr}"
    );
    assert!(stderr.contains("deliberate abort"), "{stderr}");
    // A job from a file is shown by the file's name (issue 19), there and
    // as its description in job lists.
    assert!(stderr.contains("submitted: misbehave.wasm ("), "{stderr}");
    let list = as_admin(&["jobs", "--json"], config.path())
        .output()
        .unwrap();
    let jobs: Vec<JobInfo> = serde_json::from_slice(&list.stdout).unwrap();
    assert!(
        jobs.iter()
            .any(|j| j.description.as_deref() == Some("misbehave.wasm")),
        "{jobs:?}"
    );
}

#[test]
fn cli_errors_say_what_to_do() {
    let c = shared();
    let config = tempfile::tempdir().unwrap();
    let out = bspweb()
        .args(["jobs"])
        .env_remove("BSPWEB_USER")
        .env_remove("BSPWEB_PASSWORD")
        .env("BSPWEB_URL", &c.url)
        .env("BSPWEB_CONFIG_DIR", config.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bspweb login"), "{stderr}");
    let out = bspweb()
        .args(["submit", "ring", "-n", "2", "--args", "{not json"])
        .env("BSPWEB_URL", &c.url)
        .env("BSPWEB_USER", ADMIN)
        .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
        .env("BSPWEB_CONFIG_DIR", config.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid JSON"));
    let out = bspweb()
        .args(["submit", "no-such-program", "-n", "2"])
        .env("BSPWEB_URL", &c.url)
        .env("BSPWEB_USER", ADMIN)
        .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
        .env("BSPWEB_CONFIG_DIR", config.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-program"));
}

#[test]
fn submit_sets_replicas_and_checkpoint_interval_and_documents_them() {
    let help = bspweb().args(["submit", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--replicas <N>"), "{help}");
    assert!(help.contains("--checkpoint-every <K>"), "{help}");

    let c = shared();
    let config = tempfile::tempdir().unwrap();
    let submit = |extra: &[&str]| {
        bspweb()
            .args(["submit", "ring", "-n", "2"])
            .args(extra)
            .env("BSPWEB_URL", &c.url)
            .env("BSPWEB_USER", ADMIN)
            .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
            .env("BSPWEB_CONFIG_DIR", config.path())
            .output()
            .unwrap()
    };
    let out = submit(&[
        "--replicas",
        "1",
        "--checkpoint-every",
        "3",
        "--output-mib",
        "5",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let id: i64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("submit prints the job id");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limits = rt.block_on(async {
        let client = c.admin().await;
        let info = client.job(id).await.unwrap();
        crate::harness::collect(&client, id).await.assert_exited();
        info.limits
    });
    assert_eq!(
        (limits.replicas, limits.checkpoint_every, limits.output_mib),
        (1, 3, 5)
    );

    let out = submit(&["--checkpoint-every", "0"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--checkpoint-every must be at least 1"),
        "{stderr}"
    );
    let out = submit(&["--output-mib", "2000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("between 1 and 1024"), "{stderr}");
}

/// `bspweb sim` writes a report folder whose README names the command that
/// reproduces it, and the same command gives the same bytes.
#[test]
fn sim_writes_a_reproducible_report_and_rejects_bad_options() {
    let dir = tempfile::tempdir().unwrap();
    let run = |out: &std::path::Path| {
        bspweb()
            .args([
                "sim",
                "--experiment",
                "b",
                "--profile",
                "hpc2n",
                "--overload",
                "4",
                "--balancer",
                "dd,ws-head",
                "--days",
                "1",
                "--peers",
                "20",
                "--out",
            ])
            .arg(out)
            .output()
            .unwrap()
    };
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for out in [&a, &b] {
        let o = run(out);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // Progress goes to stderr, one line per run.
        assert!(String::from_utf8_lossy(&o.stderr).contains("[2/2]"));
    }
    let readme = std::fs::read_to_string(a.join("README.md")).unwrap();
    assert!(
        readme.contains("DHHT (D/D)") && readme.contains("WS"),
        "{readme}"
    );
    assert!(
        readme.contains("bspweb sim"),
        "the report names its command:\n{readme}"
    );
    for file in ["README.md", "results.csv"] {
        let x = std::fs::read(a.join(file)).unwrap();
        let y = std::fs::read(b.join(file)).unwrap();
        // The folder name is part of the command line printed in README.
        let x = String::from_utf8(x).unwrap().replace("/a", "/X");
        let y = String::from_utf8(y).unwrap().replace("/b", "/X");
        assert_eq!(x, y, "{file} differs between two runs of the same spec");
    }

    for (args, says) in [
        (&["sim", "--balancer", "fastest"][..], "fastest"),
        (&["sim", "--experiment", "z"][..], "z"),
        (&["sim", "--threads", "0"][..], "--threads"),
    ] {
        let o = bspweb()
            .args(args)
            .arg("--out")
            .arg(dir.path().join("bad"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    assert!(
        !dir.path().join("bad").exists(),
        "a rejected run writes nothing"
    );
}

/// `bspweb cluster-sim` (issue 15): DiDiC against Debian's `mcl` on the
/// same generated graphs; the report is a function of the options, and bad
/// options are refused before anything is written.
#[test]
fn cluster_sim_compares_didic_with_mcl_reproducibly() {
    let dir = tempfile::tempdir().unwrap();
    // A short run on `sizes` with `extra` options, its report in `out`.
    let sim = |sizes: &str, extra: &[&str], out: &std::path::Path| {
        bspweb()
            .args([
                "cluster-sim",
                "--sizes",
                sizes,
                "--steps",
                "40",
                "--mcl-every",
                "10",
                "--k",
                "8",
            ])
            .args(extra)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap()
    };
    let run = |out: &std::path::Path| sim("120,200", &[], out);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for out in [&a, &b] {
        let o = run(out);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stderr).contains("time step 40/40"));
    }
    let readme = std::fs::read_to_string(a.join("README.md")).unwrap();
    assert!(
        readme.contains("bspweb cluster-sim --sizes 120,200"),
        "{readme}"
    );
    for n in [120, 200] {
        // A row in each table: DiDiC as Listing 5.1 leaves it, and refined.
        let rows: Vec<&str> = readme
            .lines()
            .filter(|l| l.starts_with(&format!("| {n} |")))
            .collect();
        assert_eq!(rows.len(), 2, "{n} vertices:\n{readme}");
        let quality = |row: &str| -> (f64, f64) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            (cells[2].parse().unwrap(), cells[3].parse().unwrap())
        };
        let ((didic, mcl), (refined, mcl_again)) = (quality(rows[0]), quality(rows[1]));
        assert!(
            (-0.5..=1.0).contains(&didic) && (-0.5..=1.0).contains(&mcl),
            "{rows:?}"
        );
        assert_eq!(mcl, mcl_again);
        // Splitting into connected parts and merging only raise modularity.
        assert!(refined >= didic - 1e-4, "{rows:?}");
        assert!(a.join(format!("quality-{n}.svg")).is_file());
    }
    let csv = std::fs::read_to_string(a.join("results.csv")).unwrap();
    // 40 DiDiC rows, 40 refined and 4 MCL rows per graph, and the header.
    assert_eq!(csv.lines().count(), 1 + 2 * (2 * 40 + 4), "{csv}");
    assert_eq!(
        csv,
        std::fs::read_to_string(b.join("results.csv")).unwrap(),
        "the same options give the same results"
    );
    // Several graphs per size: the first is the single run's graph, and the
    // report gives mean ± sd and how many are within 0.01 of MCL.
    let c = dir.path().join("c");
    let o = sim("120", &["--repeats", "2"], &c);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = |csv: &str, n: &str, graph: Option<&str>| -> Vec<String> {
        csv.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (f[0] == n && graph.is_none_or(|g| f[1] == g))
                    .then(|| [&f[..1], &f[2..]].concat().join(","))
            })
            .collect()
    };
    let repeated = std::fs::read_to_string(c.join("results.csv")).unwrap();
    assert_eq!(
        rows(&repeated, "120", Some("1")),
        rows(&csv, "120", None),
        "graph 1 of a repeated run is the single run's graph"
    );
    assert_eq!(rows(&repeated, "120", Some("2")).len(), 2 * 40 + 4);
    assert_ne!(
        rows(&repeated, "120", Some("2")),
        rows(&repeated, "120", Some("1"))
    );
    let readme = std::fs::read_to_string(c.join("README.md")).unwrap();
    let row = readme.lines().find(|l| l.starts_with("| 120 |")).unwrap();
    assert!(row.contains(" ± ") && row.contains(" of 2 |"), "{row}");
    for (args, says) in [
        (&["cluster-sim", "--repeats", "0"][..], "--repeats"),
        (&["cluster-sim", "--benefit", "0.5"][..], "--benefit"),
        (&["cluster-sim", "--sizes", "3"][..], "--sizes"),
        (&["cluster-sim", "--dynamics", "80"][..], "--dynamics"),
        (&["cluster-sim", "--inflation", "1"][..], "--inflation"),
    ] {
        let o = bspweb()
            .args(args)
            .arg("--out")
            .arg(dir.path().join("bad"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    assert!(
        !dir.path().join("bad").exists(),
        "a rejected run writes nothing"
    );
}

/// Output to a pipe whose reader is gone (`bspweb programs | head -1`)
/// ends a command quietly, as it ends Unix tools: killed by SIGPIPE, with
/// no panic on stderr.
#[cfg(unix)]
#[test]
fn output_to_a_closed_pipe_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let config = tempfile::tempdir().unwrap();
    for args in [&["programs"][..], &["peers"], &["programs", "--json"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = as_admin(args, config.path())
            .stdout(writer)
            .output()
            .unwrap();
        let (_, stderr) = text(&out);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {:?}, {stderr}",
            out.status
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// Every `--json` output parses: arrays for lists, an object for a
/// submitted job, one `JobEvent` per line for `submit --follow` and `logs`.
#[test]
fn json_output_parses_as_json() {
    let config = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = as_admin(args, config.path()).output().unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{args:?}: {stderr}");
        stdout
    };
    let programs: Vec<ProgramInfo> = serde_json::from_str(&run(&["programs", "--json"])).unwrap();
    assert!(programs.iter().any(|p| p.name.as_deref() == Some("ring")));
    let peers: Vec<PeerInfo> = serde_json::from_str(&run(&["peers", "--json"])).unwrap();
    assert!(peers.len() >= 3, "{peers:?}");
    let job: JobInfo =
        serde_json::from_str(&run(&["submit", "ring", "-n", "2", "--json"])).unwrap();
    assert_eq!((job.program.as_str(), job.nprocs), ("ring", 2));
    let jobs: Vec<JobInfo> = serde_json::from_str(&run(&["jobs", "--json"])).unwrap();
    assert!(jobs.iter().any(|j| j.id == job.id));

    let lines = |stdout: &str| -> Vec<JobEvent> {
        stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    };
    let followed = lines(&run(&["submit", "ring", "-n", "3", "--follow", "--json"]));
    assert_eq!(
        followed.last().map(|e| &e.kind),
        Some(&JobEventKind::JobExited)
    );
    let exits = followed
        .iter()
        .filter(|e| matches!(e.kind, JobEventKind::ProcessExited { .. }))
        .count();
    assert_eq!(exits, 3, "{followed:?}");
    assert!(
        followed.iter().any(|e| matches!(&e.kind, JobEventKind::Stdout { text } if text == "got in total 2 messages")),
        "{followed:?}"
    );
    let id = followed[0].job.to_string();
    let logged = lines(&run(&["logs", &id, "--json"]));
    assert_eq!(
        logged, followed,
        "logs --json of a finished job replays every event"
    );
    let logged = lines(&run(&["logs", &job.id.to_string(), "--follow", "--json"]));
    assert!(logged.last().is_some_and(|e| e.kind.is_terminal()));

    // upload, kill and dispose: the program, the killed job, a confirmation.
    let wasm = config.path().join("ticker.wasm");
    std::fs::write(&wasm, crate::consumer::ticker_wasm(1_000_000, 20_000)).unwrap();
    let program: ProgramInfo =
        serde_json::from_str(&run(&["upload", wasm.to_str().unwrap(), "--json"])).unwrap();
    assert_eq!(program.size, std::fs::metadata(&wasm).unwrap().len());
    let long: JobInfo =
        serde_json::from_str(&run(&["submit", &program.hash, "-n", "1", "--json"])).unwrap();
    // `logs` without --follow on the running job: what is stored, then exit.
    let id = long.id.to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let stored = loop {
        let (mut child, rx) = follow_job(as_admin(&["logs", &id, "--json"], config.path()));
        assert_eq!(exit_status(&mut child), Some(0), "logs {id} --json");
        // The reader ends with the output.
        let stored = lines(&rx.iter().map(Result::unwrap).collect::<Vec<_>>().join("\n"));
        if stored
            .iter()
            .any(|e| matches!(&e.kind, JobEventKind::Stdout { text } if text == "tick"))
        {
            break stored;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no tick stored in time"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(!stored.iter().any(|e| e.kind.is_terminal()), "{stored:?}");
    let killed: JobInfo =
        serde_json::from_str(&run(&["kill", &long.id.to_string(), "--json"])).unwrap();
    assert_eq!(
        (killed.id, killed.outcome),
        (long.id, Some(bsp_api::rest::JobOutcome::Killed))
    );
    let disposed: serde_json::Value =
        serde_json::from_str(&run(&["dispose", &long.id.to_string(), "--json"])).unwrap();
    assert_eq!(
        disposed,
        serde_json::json!({"id": long.id, "disposed": true})
    );
}

/// Piped, `--follow` shows progress as plain lines: no carriage returns,
/// no escape sequences, on either stream.
#[test]
fn piped_follow_shows_plain_progress_lines_without_control_characters() {
    let config = tempfile::tempdir().unwrap();
    let wasm = config.path().join("ticker.wasm");
    // A few seconds of supersteps: the progress poll (every second) sees it run.
    std::fs::write(&wasm, crate::consumer::ticker_wasm(60, 40_000_000)).unwrap();
    let out = as_admin(&["submit"], config.path())
        .arg(&wasm)
        .args(["-n", "2", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.lines().filter(|l| *l == "[1] tick").count(), 61);
    let progress: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("== progress: "))
        .collect();
    assert!(!progress.is_empty(), "no progress line:\n{stderr}");
    assert!(
        progress
            .iter()
            .any(|l| l.contains("running") && l.contains("exited of 2")),
        "{progress:?}"
    );
    for (name, s) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(
            !s.contains('\r') && !s.contains('\x1b'),
            "control characters on piped {name}: {s:?}"
        );
    }
}

/// The exit status of each outcome is the one `--help` documents, and the
/// README lists the same table.
#[test]
fn exit_codes_are_the_documented_ones() {
    let codes = documented_codes();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for (code, what) in &codes {
        let line = format!("{code:>5}  {what}");
        assert!(readme.contains(&line), "README lacks {line:?}");
    }
    // Each client command's own --help has the table too.
    for cmd in [
        "submit", "logs", "jobs", "kill", "dispose", "upload", "login",
    ] {
        let help = bspweb().args([cmd, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout).to_string();
        assert!(
            help.contains("Exit status:") && help.contains("130  interrupted"),
            "bspweb {cmd} --help lacks the exit codes:\n{help}"
        );
    }
    let c = shared();
    let config = tempfile::tempdir().unwrap();
    let status = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        (out.status.code(), text(&out).1)
    };
    let check = |what: &str, cmd: &mut Command| {
        let (code, stderr) = status(cmd);
        assert_eq!(code, Some(documented_code(what)), "{what}: {stderr}");
    };
    let admin = |args: &[&str]| as_admin(args, config.path());
    let misbehave = config.path().join("misbehave.wasm");
    std::fs::write(&misbehave, bspweb_programs::get("misbehave").unwrap().wasm).unwrap();
    let misbehave = misbehave.to_str().unwrap();

    assert_eq!(
        status(&mut admin(&["submit", "ring", "-n", "2", "--follow"])).0,
        Some(0)
    );
    check(
        "runtime ended the job",
        &mut admin(&[
            "submit",
            misbehave,
            "-n",
            "2",
            "--args",
            r#"{"mode":"trap"}"#,
            "--follow",
        ]),
    );
    check("usage", &mut admin(&["submit", "ring", "-n", "0"]));
    check(
        "usage",
        &mut admin(&["submit", "ring", "-n", "2", "--args", "{bad"]),
    );
    check("usage", &mut admin(&["submit", "ring"]));
    check("not found", &mut admin(&["logs", "999999999"]));
    check(
        "not found",
        &mut admin(&["submit", "no-such-program", "-n", "2"]),
    );
    check(
        "not found",
        &mut admin(&["submit", "/no/such/file.wasm", "-n", "2"]),
    );
    check(
        "--min-peers",
        &mut admin(&["submit", "ring", "-n", "2", "--min-peers", "1000"]),
    );
    check(
        "unauthorized",
        admin(&["jobs"]).env("BSPWEB_PASSWORD", "wrong"),
    );
    check(
        "unauthorized",
        admin(&["jobs"])
            .env_remove("BSPWEB_USER")
            .env_remove("BSPWEB_PASSWORD"),
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    check("cannot connect", admin(&["jobs"]).env("BSPWEB_URL", &dead));
    let bad = config.path().join("not-wasm.wasm");
    std::fs::write(&bad, b"#!/bin/sh\necho hello\n").unwrap();
    check(
        "any other error",
        &mut admin(&["submit", bad.to_str().unwrap(), "-n", "2"]),
    );

    // Killed while followed.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(c.admin());
    let spec = bsp_api::client::JobSpec::new(
        bsp_api::client::Program::Wasm(crate::consumer::ticker_wasm(100_000, 20_000)),
        2,
    );
    let job = rt.block_on(client.start_job(spec)).unwrap().id;
    // Interrupted (SIGINT, as Ctrl-C sends) while following: the follower
    // stops, the job keeps running.
    let (mut follower, lines) = follow_job(admin(&["logs", &job.to_string(), "--follow"]));
    let first = lines.recv_timeout(Duration::from_secs(120));
    assert!(
        matches!(&first, Ok(Ok(l)) if l.ends_with("tick")),
        "{first:?}"
    );
    let sigint = Command::new("kill")
        .args(["-INT", &follower.id().to_string()])
        .status()
        .unwrap();
    assert!(sigint.success());
    assert_eq!(
        exit_status(&mut follower),
        Some(documented_code("interrupted"))
    );
    let info = rt.block_on(client.job(job)).unwrap();
    assert_eq!(info.state, bsp_api::rest::JobState::Active, "{info:?}");

    // Killed while followed.
    let (mut follower, lines) = follow_job(admin(&["logs", &job.to_string(), "--follow"]));
    let first = lines.recv_timeout(Duration::from_secs(120));
    assert!(
        matches!(&first, Ok(Ok(l)) if l.ends_with("tick")),
        "{first:?}"
    );
    rt.block_on(client.kill(job)).unwrap();
    assert_eq!(exit_status(&mut follower), Some(documented_code("killed")));
}

/// Start `cmd` with its standard output read line by line on a thread.
fn follow_job(
    mut cmd: Command,
) -> (
    std::process::Child,
    std::sync::mpsc::Receiver<std::io::Result<String>>,
) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// The exit code of `child`, which must end within a minute.
fn exit_status(child: &mut std::process::Child) -> Option<i32> {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = tx.send(child.wait().unwrap().code());
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(code) => code,
            Err(_) => {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                panic!("bspweb did not end within a minute");
            }
        }
    })
}

/// Issue 19: `--raw-dir` used to concatenate records, so records of
/// different sizes could not be told apart. With `--raw-framing length`
/// each record comes with its length; `sample-sort` writes its sorted keys
/// as records of at most 1 MiB, the last one of each process shorter.
#[test]
fn raw_framing_length_keeps_variable_size_records_apart() {
    let config = tempfile::tempdir().unwrap();
    let dir = config.path().join("out");
    let n = 300_000u64;
    let out = as_admin(
        &[
            "submit",
            "sample-sort",
            "-n",
            "2",
            "--args",
            &format!(r#"{{"n": {n}, "emit": true}}"#),
            "--follow",
            "--raw-dir",
            dir.to_str().unwrap(),
            "--raw-framing",
            "length",
        ],
        config.path(),
    )
    .output()
    .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let mut keys = Vec::new();
    let mut sizes = Vec::new();
    for pid in 0..2 {
        let bytes = std::fs::read(dir.join(format!("pid-{pid}.bin"))).unwrap();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let (len, tail) = rest.split_at(4);
            let len = u32::from_le_bytes(len.try_into().unwrap()) as usize;
            assert!(
                len <= 1 << 20 && len.is_multiple_of(8) && len <= tail.len(),
                "{len}"
            );
            let (record, tail) = tail.split_at(len);
            sizes.push(len);
            keys.extend(
                record
                    .chunks_exact(8)
                    .map(|k| u64::from_le_bytes(k.try_into().unwrap())),
            );
            rest = tail;
        }
    }
    assert_eq!(keys.len() as u64, n, "{sizes:?}");
    assert!(
        keys.is_sorted(),
        "the framed records are not the sorted keys"
    );
    assert!(
        sizes.iter().any(|&s| s != sizes[0]),
        "expected records of different sizes: {sizes:?}"
    );

    // Saving raw output needs --follow; without it the flag would be ignored.
    let out = as_admin(
        &["submit", "ring", "-n", "1", "--raw-dir", "x"],
        config.path(),
    )
    .output()
    .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(documented_code("usage")),
        "{stderr}"
    );
    assert!(stderr.contains("add --follow"), "{stderr}");
}

/// `bspweb CMD` as `user` with `password`, feeding `stdin`.
fn run_as(user: &str, password: &str, args: &[&str], stdin: &str) -> Output {
    use std::io::Write as _;
    let config = tempfile::tempdir().unwrap();
    let mut child = bspweb()
        .args(args)
        .env("BSPWEB_URL", &shared().url)
        .env("BSPWEB_USER", user)
        .env("BSPWEB_PASSWORD", password)
        .env("BSPWEB_CONFIG_DIR", config.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Issue 19: administrators manage accounts from the CLI; everyone changes
/// their own password.
#[test]
fn accounts_are_managed_from_the_cli() {
    let admin = |args: &[&str], stdin: &str| run_as(ADMIN, ADMIN_PASSWORD, args, stdin);
    let out = admin(
        &[
            "user",
            "add",
            "cli-carol",
            "--role",
            "volunteer",
            "--password-stdin",
        ],
        "carol-password\n",
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("created the volunteer account `cli-carol`"),
        "{stdout}"
    );
    assert!(
        !stderr.contains("password:"),
        "no generated password: {stderr}"
    );

    let out = admin(&["user", "list", "--json"], "");
    let users: Vec<bsp_api::rest::UserInfo> = serde_json::from_slice(&out.stdout).unwrap();
    let carol = users.iter().find(|u| u.name == "cli-carol").unwrap();
    assert_eq!(carol.role, bsp_api::rest::Role::Volunteer);
    let out = admin(&["user", "list"], "");
    let (stdout, _) = text(&out);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("cli-carol") && l.contains("volunteer")),
        "{stdout}"
    );

    // A volunteer runs no jobs, and is told why; users manage no accounts.
    let carol =
        |args: &[&str], password: &str, stdin: &str| run_as("cli-carol", password, args, stdin);
    let out = carol(&["submit", "ring", "-n", "1"], "carol-password", "");
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("volunteer account"), "{stderr}");
    let out = carol(&["user", "list"], "carol-password", "");
    let (_, stderr) = text(&out);
    assert!(stderr.contains("only administrators"), "{stderr}");

    // Role and quotas; an empty change is a usage error.
    let out = admin(
        &[
            "user",
            "set",
            "cli-carol",
            "--role",
            "user",
            "--max-processes",
            "4",
        ],
        "",
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("0/4"), "{stdout}");
    let out = admin(&["user", "set", "cli-carol"], "");
    assert_eq!(out.status.code(), Some(documented_code("usage")));

    // Disabled: the CLI says so with the unauthorized status.
    assert!(
        admin(&["user", "disable", "cli-carol"], "")
            .status
            .success()
    );
    let out = carol(&["jobs"], "carol-password", "");
    let (_, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(documented_code("unauthorized")),
        "{stderr}"
    );
    assert!(stderr.contains("disabled"), "{stderr}");
    assert!(admin(&["user", "enable", "cli-carol"], "").status.success());
    assert!(carol(&["jobs"], "carol-password", "").status.success());

    // Her own password: a wrong current one changes nothing.
    let out = carol(
        &["passwd", "--stdin"],
        "carol-password",
        "wrong-one\nnew-carol-pw\n",
    );
    let (_, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(documented_code("unauthorized")),
        "{stderr}"
    );
    let out = carol(
        &["passwd"],
        "carol-password",
        "carol-password\nnew-carol-pw\n",
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("changed the password"), "{stdout}");
    assert!(!carol(&["jobs"], "carol-password", "").status.success());
    assert!(carol(&["jobs"], "new-carol-pw", "").status.success());

    // An administrator's reset prints a generated password that works.
    let out = admin(&["user", "passwd", "cli-carol"], "");
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let generated = stderr
        .lines()
        .find_map(|l| l.strip_prefix("the new password: "))
        .unwrap_or_else(|| panic!("{stderr}"))
        .to_string();
    assert!(!carol(&["jobs"], "new-carol-pw", "").status.success());
    assert!(carol(&["jobs"], &generated, "").status.success());
}

/// Issue 19: logs written to files carry no ANSI colour codes (colours only
/// on a terminal), and a one-process job is "1 process".
#[test]
fn logs_in_files_are_plain_text_and_one_process_is_singular() {
    let c = crate::harness::Cluster::start(crate::harness::Options {
        peers: 1,
        log_files: true,
        ..Default::default()
    });
    let config = tempfile::tempdir().unwrap();
    let out = bspweb()
        .args(["submit", "ring", "-n", "1", "--follow"])
        .env("BSPWEB_URL", &c.url)
        .env("BSPWEB_USER", ADMIN)
        .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
        .env("BSPWEB_CONFIG_DIR", config.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("with 1 process\n"), "{stderr}");
    let mut logs = 0;
    for entry in std::fs::read_dir(c.data_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.is_empty(), "{} is empty", path.display());
            assert!(
                !text.contains('\x1b'),
                "{} has escape codes:\n{text}",
                path.display()
            );
            logs += 1;
        }
    }
    assert!(logs >= 2, "the supernode's and the peer's logs");
}

/// Issue 19: `bspweb up --help` says what `up` does with users, sessions
/// and peers; `peers --online` leaves the gone peers out; a job that fails
/// with no single pid to blame says so without a "pid -".
#[test]
fn up_help_online_peers_and_a_failure_without_a_pid() {
    let help = bspweb().args(["up", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for word in [
        "BSPWEB_USER",
        "BSPWEB_PASSWORD",
        "BSPWEB_CONFIG_DIR",
        "restarted",
    ] {
        assert!(help.contains(word), "{word} in\n{help}");
    }

    let mut c = crate::harness::Cluster::start(crate::harness::Options {
        peers: 2,
        lease_ttl_secs: 2,
        ..Default::default()
    });
    let config = tempfile::tempdir().unwrap();
    let url = c.url.clone();
    let cli = |args: &[&str]| {
        bspweb()
            .args(args)
            .env("BSPWEB_URL", &url)
            .env("BSPWEB_USER", ADMIN)
            .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
            .env("BSPWEB_CONFIG_DIR", config.path())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = cli(&[
        "submit",
        "supersteps",
        "-n",
        "2",
        "--args",
        r#"{"k": 10000000}"#,
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let job = stdout.trim().to_string();
    // Both peers die: nobody is left to restore the job's processes.
    c.kill_peer(0);
    c.kill_peer(1);
    let start = std::time::Instant::now();
    let failed = loop {
        let out = cli(&["logs", &job]);
        let (_, stderr) = text(&out);
        if stderr.contains("failed") {
            break stderr;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the job did not fail: {stderr}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        failed.contains(&format!("== job {job} failed: ")),
        "{failed}"
    );
    assert!(!failed.contains("pid -"), "{failed}");

    let all: Vec<PeerInfo> = serde_json::from_slice(&cli(&["peers", "--json"]).stdout).unwrap();
    assert_eq!(all.len(), 2);
    assert!(all.iter().all(|p| p.state == "gone"), "{all:?}");
    let online: Vec<PeerInfo> =
        serde_json::from_slice(&cli(&["peers", "--online", "--json"]).stdout).unwrap();
    assert!(online.is_empty(), "{online:?}");
}
