//! The volunteer's everyday (issue 19): `bspweb peer status|pause|resume`
//! against real peers, and `bspweb peer install` producing a unit that
//! systemd accepts.

use std::process::Output;
use std::time::Duration;

use bspweb_peer::daemon::PeerStatus;

use crate::harness::{Cluster, Options, assert_success, bspweb, job, until};

fn run(args: &[&std::ffi::OsStr]) -> Output {
    bspweb().args(args).output().unwrap()
}

/// `bspweb peer CMD --socket SOCKET --json`: the peer's status.
#[track_caller]
fn peer_cmd(cmd: &str, socket: &std::path::Path) -> PeerStatus {
    let out = bspweb()
        .args(["peer", cmd, "--json", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bspweb peer {cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A peer keeps the programs it compiles on disk: started again, it reads
/// them back instead of compiling them again, and `bspweb peer status`
/// says which it did and where they are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_reads_the_programs_it_compiled_back_from_disk() {
    let mut cluster = Cluster::start(Options {
        peers: 1,
        ..Options::default()
    });
    let client = cluster.admin().await;
    let name = cluster.peers[0].name.clone();
    let socket = cluster.control_socket(&name);
    let spec = || job("ring", 1, serde_json::json!({}));
    let first = crate::harness::run(&client, spec()).await;
    first.assert_exited();
    let status = peer_cmd("status", &socket);
    assert_eq!((status.compiled, status.loaded), (1, 0), "{status:?}");
    let dir = std::path::PathBuf::from(status.compile_cache.expect("a compile cache"));
    assert!(
        dir.starts_with(cluster.compile_cache(&name)),
        "{} is not under the peer's --compile-cache",
        dir.display()
    );
    let kept = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(kept, 1, "one compiled program in {}", dir.display());
    let before = status.peer_id;

    // The peer stops and starts again, as after a reboot.
    assert!(cluster.stop_peer(0).success());
    cluster.add_peer(&name, &[]);
    let status = until(
        "the peer to log in again",
        Duration::from_secs(60),
        async || {
            let out = bspweb()
                .args(["peer", "status", "--json", "--socket"])
                .arg(&socket)
                .output()
                .ok()?;
            let s: PeerStatus = serde_json::from_slice(&out.stdout).ok()?;
            (s.peer_id.is_some() && s.peer_id != before && s.state == "idle").then_some(s)
        },
    )
    .await;
    assert_eq!((status.compiled, status.loaded), (0, 0));
    let again = crate::harness::run(&client, spec()).await;
    again.assert_exited();
    assert_eq!(again.stdout(0), first.stdout(0));
    let status = peer_cmd("status", &socket);
    assert_eq!((status.compiled, status.loaded), (0, 1), "{status:?}");

    // People read it too.
    let out = run(&[
        "peer".as_ref(),
        "status".as_ref(),
        "--socket".as_ref(),
        socket.as_os_str(),
    ]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("programs: 0 compiled, 1 read back from the compile cache in "),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_moves_the_processes_away_and_resume_takes_work_again() {
    let cluster = Cluster::start(Options {
        peers: 2,
        ..Options::default()
    });
    let client = cluster.admin().await;
    let name = &cluster.peers[1].name;
    let socket = cluster.control_socket(name);
    let limit = Duration::from_secs(60);
    let status = peer_cmd("status", &socket);
    assert_eq!(&status.name, name);
    assert_eq!(status.state, "idle");
    let me = status.peer_id.expect("logged in");

    // A long job with processes on both peers.
    let long = client
        .submit(&job("supersteps", 16, serde_json::json!({"k": 10_000_000})))
        .await
        .unwrap();
    until(
        "the job to run on the volunteer's peer",
        limit,
        async || {
            let info = client.job(long.id).await.ok()?;
            info.placement.contains(&me).then_some(())
        },
    )
    .await;
    assert_eq!(peer_cmd("status", &socket).state, "running");

    // Paused: its processes move to the other peer, the job goes on.
    let paused = peer_cmd("pause", &socket);
    assert!(paused.paused);
    let moved = until("the processes to move away", limit, async || {
        let info = client.job(long.id).await.ok()?;
        (!info.placement.contains(&me)).then_some(info)
    })
    .await;
    let status = until("the peer to be drained", limit, async || {
        let s = peer_cmd("status", &socket);
        (s.state == "paused").then_some(s)
    })
    .await;
    assert!(status.jobs.is_empty(), "{status:?}");
    let steps = |i: &bsp_api::rest::JobInfo| i.supersteps.iter().copied().min().unwrap_or(0);
    let before = steps(&moved);
    until("the job to go on elsewhere", limit, async || {
        let info = client.job(long.id).await.ok()?;
        (info.state == bsp_api::rest::JobState::Active && steps(&info) > before).then_some(())
    })
    .await;
    // A paused peer is out of the ring: a new job gets none of it.
    let ring = client.ring().await.unwrap();
    assert!(ring.peers.iter().all(|p| p.id != me), "{ring:?}");

    // Resumed: back in the ring, and given work again.
    let resumed = peer_cmd("resume", &socket);
    assert!(!resumed.paused);
    until("the peer to be back in the ring", limit, async || {
        let ring = client.ring().await.ok()?;
        ring.peers.iter().any(|p| p.id == me).then_some(())
    })
    .await;
    // The job's processes whose DHHT host it is come back.
    until("the job to use the resumed peer again", limit, async || {
        let info = client.job(long.id).await.ok()?;
        info.placement.contains(&me).then_some(())
    })
    .await;
    until("the resumed peer to run them", limit, async || {
        (peer_cmd("status", &socket).state == "running").then_some(())
    })
    .await;
    client.kill(long.id).await.unwrap();

    // Text for people; a socket nobody listens on is "cannot connect".
    let out = run(&[
        "peer".as_ref(),
        "status".as_ref(),
        "--socket".as_ref(),
        socket.as_os_str(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&format!("{name}: ")), "{text}");
    assert!(text.contains("windows: always"), "{text}");
    let nobody = cluster.control_socket("nobody");
    let out = run(&[
        "peer".as_ref(),
        "pause".as_ref(),
        "--socket".as_ref(),
        nobody.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(8), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no peer is running"));
}

/// The OS niceness of every thread of process `pid` (Linux: niceness is
/// per thread), by thread name.
fn thread_niceness(pid: u32) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(stat) = std::fs::read_to_string(t.unwrap().path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        // `pid (comm) state ppid …`: the comm may hold spaces and
        // parentheses, the fields after its last `)` do not; niceness is
        // the 19th field, the 17th after the comm.
        let (head, rest) = stat.rsplit_once(')').unwrap();
        let name = head.split_once('(').unwrap().1.to_string();
        let nice = rest.split_whitespace().nth(16).unwrap().parse().unwrap();
        out.push((name, nice));
    }
    out
}

/// A peer started by hand with `--nice N` runs all of its threads at N, not
/// only the ones running programs: its checkpoint, replica and network work
/// yields to the volunteer's programs too (and counts as niced time in the
/// idle estimate, `docs/volunteer.md`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_runs_every_thread_at_its_niceness() {
    let nice = 7;
    let cluster = two_peers_after_a_job(vec!["--nice".into(), nice.to_string()]).await;
    for i in 0..2 {
        let threads = thread_niceness(cluster.peer_pid(i));
        assert!(threads.len() > 2, "peer {i}: {threads:?}");
        let low: Vec<_> = threads.iter().filter(|(_, n)| *n < nice).collect();
        assert!(
            low.is_empty(),
            "peer {i}: threads below niceness {nice}: {low:?} (all: {threads:?})"
        );
    }
}

/// Two peers started with `peer_args`, after a job with processes,
/// checkpoints and replicas on both: their blocking and network threads
/// have all been started, and the job has ended.
async fn two_peers_after_a_job(peer_args: Vec<String>) -> Cluster {
    let cluster = Cluster::start(Options {
        peers: 2,
        peer_args,
        ..Options::default()
    });
    let client = cluster.admin().await;
    crate::harness::run(
        &client,
        job("supersteps", 4, serde_json::json!({"k": 30, "h": 4096})),
    )
    .await
    .assert_exited();
    cluster
}

/// Whether the kernel may give process `pid` transparent huge pages
/// (`THP_enabled` in `/proc/<pid>/status`, Linux 5.0 and later).
fn huge_pages_enabled(pid: u32) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(|v| v.trim() == "1")
}

/// A peer that ran a job turns huge pages off once it idles, so the kernel
/// does not fill the ranges its snapshots left in the heap with huge pages
/// of zeros (`sysinfo::allow_huge_pages`): before, an idle peer grew by
/// megabytes in the seconds after a job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_idles_without_huge_pages() {
    let cluster = two_peers_after_a_job(Vec::new()).await;
    for i in 0..2 {
        let pid = cluster.peer_pid(i);
        if huge_pages_enabled(pid).is_none() {
            // A kernel without the field: nothing to check.
            return;
        }
        until(
            &format!("peer {i} to turn huge pages off after the job"),
            Duration::from_secs(20),
            async || (huge_pages_enabled(pid) == Some(false)).then_some(()),
        )
        .await;
    }
}

/// `bspweb peer install --user` writes a settings file and a unit that
/// `systemd-analyze verify` accepts without a warning; `uninstall` removes
/// the unit. (Starting it needs a running systemd, which a CI container
/// lacks: `--no-start`.)
#[test]
fn install_writes_a_unit_systemd_accepts_and_settings_the_peer_reads() {
    let home = tempfile::tempdir().unwrap();
    let units = home.path().join("units");
    let config = home.path().join("peer.toml");
    let given_token = home.path().join("given.token");
    let token = format!("bwpeer-7-{}", "ab".repeat(32));
    std::fs::write(&given_token, format!("{token}\n")).unwrap();
    let install = |extra: &[&str]| {
        bspweb()
            .args(["peer", "install", "--user", "--no-start", "--unit-dir"])
            .arg(&units)
            .arg("--config")
            .arg(&config)
            .arg("--token-file")
            .arg(&given_token)
            .args(["--supernode", "http://127.0.0.1:9", "--cpu-percent", "50"])
            .args([
                "--run-between",
                "22:00-07:00",
                "--memory-budget-mib",
                "2048",
            ])
            .args(extra)
            .env("HOME", home.path())
            .output()
            .unwrap()
    };
    let out = install(&[]);
    assert_success(&out);
    let unit = units.join("bspweb-peer.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(text.contains("MemoryMax=2560M"), "{text}");
    assert!(
        text.contains(&format!("--config {}", config.display())),
        "{text}"
    );
    let verify = |unit: &std::path::Path| {
        let verify = std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(unit)
            .output()
            .expect("systemd-analyze (Debian's `systemd` package; .ci/run installs it)");
        let complaints = String::from_utf8_lossy(&verify.stderr);
        assert!(
            verify.status.success() && complaints.trim().is_empty(),
            "systemd-analyze verify: {complaints}"
        );
    };
    verify(&unit);
    // The token is copied next to the settings, for its owner's eyes only,
    // and the settings name it.
    let copied = home.path().join("peer.token");
    assert_eq!(std::fs::read_to_string(&copied).unwrap().trim(), token);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&copied).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o077,
        0,
        "peer.token is readable by others: {mode:o}"
    );
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains(&format!("token-file = \"{}\"", copied.display())),
        "{}",
        std::fs::read_to_string(&config).unwrap()
    );
    // A system service runs as a user of its own, which gets the token as a
    // systemd credential.
    let system_units = home.path().join("system-units");
    let out = bspweb()
        .args(["peer", "install", "--system", "--no-start", "--unit-dir"])
        .arg(&system_units)
        .arg("--config")
        .arg(home.path().join("system/peer.toml"))
        .arg("--token-file")
        .arg(&given_token)
        .args(["--supernode", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    assert_success(&out);
    let system_unit = system_units.join("bspweb-peer.service");
    let text = std::fs::read_to_string(&system_unit).unwrap();
    assert!(
        text.contains(&format!(
            "LoadCredential=peer-token:{}",
            home.path().join("system/peer.token").display()
        )) && text.contains("--token-file ${CREDENTIALS_DIRECTORY}/peer-token"),
        "{text}"
    );
    verify(&system_unit);
    // Without a token there is nothing to install.
    let out = bspweb()
        .args(["peer", "install", "--user", "--no-start", "--unit-dir"])
        .arg(&units)
        .args(["--supernode", "http://127.0.0.1:9"])
        .env("HOME", home.path())
        .env_remove("BSPWEB_PEER_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--token"),
        "{out:?}"
    );

    // A second install keeps the settings unless told to replace them.
    let out = install(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert!(install(&["--force"]).status.success());

    // The peer reads the file: a bad value in it is named like a flag.
    let settings = std::fs::read_to_string(&config).unwrap();
    assert!(
        settings.contains("run-between = [\"22:00-07:00\"]"),
        "{settings}"
    );
    std::fs::write(
        &config,
        settings.replace("cpu-percent = 50", "cpu-percent = 500"),
    )
    .unwrap();
    let out = bspweb()
        .args(["peer", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--cpu-percent") && stderr.contains("500"),
        "{stderr}"
    );
    std::fs::write(&config, "supernod = \"http://x\"\n").unwrap();
    let out = bspweb()
        .args(["peer", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown setting `supernod`"));

    let out = bspweb()
        .args(["peer", "uninstall", "--no-start", "--unit-dir"])
        .arg(&units)
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert_success(&out);
    assert!(!unit.exists());
}
