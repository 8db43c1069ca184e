//! The `bspweb` CLI as a user runs it.

use crate::harness::{ADMIN, ADMIN_PASSWORD, bspweb, shared};

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
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("deliberate abort"), "{stderr}");
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
    let out = submit(&["--replicas", "1", "--checkpoint-every", "3"]);
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
    assert_eq!((limits.replicas, limits.checkpoint_every), (1, 3));

    let out = submit(&["--checkpoint-every", "0"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--checkpoint-every must be at least 1"),
        "{stderr}"
    );
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
