//! Issue 20's red-team findings, replayed against real clusters: each test
//! attacks a running supernode or peer the way the finding did, bounded in
//! time and traffic and on loopback only, and asserts the invariant that
//! keeps everybody else safe (memory as numbers, not timings). The
//! full-disk test mounts a small tmpfs, so it needs root (as the testbed
//! does).

use std::time::{Duration, Instant};

use bsp_api::rest::{JobEventKind, JobLimits, JobState};
use serde_json::json;

use crate::examples::misbehave_hash;
use crate::harness::{Cluster, Options, job, run};

/// Finding 2: connections to a peer's data port that claim a 16 MiB first
/// frame and send it make the peer buffer nothing (before: 40 of them added
/// ≈ 640 MB to the peer).
#[tokio::test(flavor = "multi_thread")]
async fn finding_2_strangers_cannot_make_a_peer_buffer_frames() {
    use tokio::io::AsyncWriteExt;
    let cluster = Cluster::start(Options {
        peers: 1,
        ..Options::default()
    });
    let client = cluster.admin().await;
    let addr = client.peers().await.unwrap()[0].addr.clone();
    let before = cluster.peer_rss(0).expect("the peer runs");
    let mut attackers = Vec::new();
    for _ in 0..24 {
        let addr = addr.clone();
        attackers.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let len = ((16u32 << 20) - 1).to_be_bytes();
            let body = vec![0xA5u8; (16 << 20) - 1];
            let sent = async {
                s.write_all(&len).await?;
                s.write_all(&body).await
            };
            let sent = tokio::time::timeout(Duration::from_secs(30), sent).await;
            // Keep the connection open while the peer's memory is read.
            (sent.map(|r| r.is_ok()).unwrap_or(false), s)
        }));
    }
    let mut held = Vec::new();
    for a in attackers {
        let (accepted, s) = a.await.unwrap();
        assert!(!accepted, "the peer read a 16 MiB frame from a stranger");
        held.push(s);
    }
    let after = cluster.peer_rss(0).expect("the peer survived");
    let grew = after.saturating_sub(before);
    assert!(
        grew < 64 << 20,
        "the peer grew by {} MiB under 24 strangers' frames",
        grew >> 20
    );
    // It still works.
    run(&client, job("ring", 2, json!(null)))
        .await
        .assert_exited();
    drop(held);
}

/// Finding 3 (slowloris): 300 requests from one address whose headers
/// never finish. The supernode holds at most 256 of them, closes them once
/// their headers are late, answers others meanwhile, and jobs run.
#[tokio::test(flavor = "multi_thread")]
async fn finding_3_slow_requests_do_not_starve_the_supernode() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cluster = Cluster::start(Options {
        peers: 1,
        supernode_args: vec!["--header-timeout-secs".into(), "3".into()],
        ..Options::default()
    });
    let client = cluster.admin().await;
    let addr: std::net::SocketAddr = cluster.url.trim_start_matches("http://").parse().unwrap();
    let mut slow = Vec::new();
    for _ in 0..300 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.66:0".parse().unwrap()).unwrap();
        let mut s = socket.connect(addr).await.unwrap();
        // Writes fail once the supernode closed a connection over the cap.
        let _ = s
            .write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await;
        slow.push(s);
    }
    // The 44 beyond the cap are closed at once; the 256 it holds stay open
    // until their header timeout (3 s).
    let reads = slow.iter_mut().map(|s| async move {
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(Duration::from_millis(1500), s.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    });
    let closed_at_once = futures_util::future::join_all(reads)
        .await
        .into_iter()
        .filter(|&c| c)
        .count();
    assert_eq!(
        closed_at_once,
        300 - 256,
        "connections over the per-address cap"
    );
    // Others are served, and jobs run.
    client.health().await.expect("the supernode answers");
    run(&client, job("ring", 2, json!(null)))
        .await
        .assert_exited();
    // Every slow request ends: at once beyond the cap, else at its
    // header timeout.
    let mut closed = 0;
    for s in &mut slow {
        let mut buf = Vec::new();
        if tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut buf))
            .await
            .is_ok()
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 300, "slow requests are still open");
}

/// Finding 5: a job whose processes compute for their whole superstep does
/// not hold up another job on the same peer. One peer with two slots; both
/// of a `loop` job's processes spin (with a 60 s superstep limit) when a
/// `ring` job arrives. The ring job ends while the spinning job still runs:
/// the peer shares its slots between the jobs (before, the ring waited for
/// the spinners to hit their limit).
#[tokio::test(flavor = "multi_thread")]
async fn finding_5_a_spinning_job_does_not_hold_up_another_job() {
    let cluster = Cluster::start(Options {
        peers: 1,
        ..Options::default()
    });
    let client = cluster.admin().await;
    let hash = misbehave_hash(&client).await;
    let mut spin = job(&hash, 2, json!({"mode": "loop"}));
    spin.limits = Some(JobLimits {
        superstep_ms: 60_000,
        ..JobLimits::default()
    });
    let spin = client.submit(&spin).await.unwrap();
    // Both processes are past superstep 0, spinning in superstep 1.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let info = client.job(spin.id).await.unwrap();
        if info.supersteps.len() == 2 && info.supersteps.iter().all(|&s| s >= 1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the spinning job did not start: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ring = run(&client, job("ring", 2, json!(null))).await;
    ring.assert_exited();
    let spinning = client.job(spin.id).await.unwrap();
    assert_eq!(
        spinning.state,
        JobState::Active,
        "the ring job ended only after the spinning job: {spinning:?}"
    );
    client.kill(spin.id).await.unwrap();
}

/// A guest whose state lives in an unexported mutable i64 global that is
/// not the stack pointer: each superstep it folds the superstep into it and
/// writes it as a raw record, for `steps` supersteps.
fn hidden_state_guest(steps: u32) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
          (import "bspweb_v1" "pid" (func $pid (result i32)))
          (import "bspweb_v1" "superstep" (func $superstep (result i32)))
          (import "bspweb_v1" "write_raw" (func $write_raw (param i32 i32) (result i32)))
          (memory (export "memory") 1)
          (global $hidden (mut i64) (i64.const 7))
          (func (export "bspweb_resume") (result i32)
            (local $s i32) (local $i i32)
            (local.set $s (call $superstep))
            (global.set $hidden
              (i64.add
                (i64.mul (global.get $hidden) (i64.const 6364136223846793005))
                (i64.extend_i32_u
                  (i32.mul (i32.add (local.get $s) (i32.const 1))
                           (i32.add (call $pid) (i32.const 1))))))
            ;; A little work, so that the job runs long enough to be hit.
            (loop $busy
              (local.set $i (i32.add (local.get $i) (i32.const 1)))
              (br_if $busy (i32.lt_u (local.get $i) (i32.const 200000))))
            (i64.store (i32.const 0) (global.get $hidden))
            (drop (call $write_raw (i32.const 0) (i32.const 8)))
            (select (i32.const 1) (i32.const 0)
              (i32.ge_u (local.get $s) (i32.const {last})))))"#,
        last = steps - 1
    ))
    .expect("the guest parses")
}

/// What [`hidden_state_guest`] writes for `pid`, computed natively.
fn hidden_state_reference(pid: u32, steps: u32) -> Vec<Vec<u8>> {
    let mut h: u64 = 7;
    (0..steps)
        .map(|s| {
            h = h
                .wrapping_mul(6364136223846793005)
                .wrapping_add(u64::from((s + 1) * (pid + 1)));
            h.to_le_bytes().to_vec()
        })
        .collect()
}

/// Finding 6: a module whose state is in a mutable global the old
/// validator let through and checkpoints did not record. A peer hosting
/// two of its processes is SIGKILLed mid-run; the output of every process
/// equals the failure-free one (before: 267 of 401 records differed).
#[tokio::test(flavor = "multi_thread")]
async fn finding_6_state_in_a_global_survives_a_peer_kill() {
    let steps = 400;
    let mut cluster = Cluster::start(Options {
        peers: 3,
        ..Options::default()
    });
    let client = cluster.admin().await;
    let hash = client
        .upload_program(hidden_state_guest(steps), Some("hidden-state"))
        .await
        .expect("the validator accepts numeric globals")
        .hash;
    let id = client.submit(&job(&hash, 6, json!(null))).await.unwrap().id;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let info = client.job(id).await.unwrap();
        assert!(
            info.state != JobState::Finished,
            "the job ended before the kill: {:?}",
            info.outcome
        );
        if info.supersteps.len() == 6 && info.supersteps.iter().all(|&s| s >= 50) {
            let victim = *info
                .placement
                .iter()
                .find(|p| **p != info.placement[0])
                .expect("6 processes on 3 peers use more than one peer");
            let index = cluster.peer_index(&client, victim).await.unwrap();
            cluster.kill_peer(index);
            break;
        }
        assert!(Instant::now() < deadline, "the job made no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = crate::harness::collect(&client, id).await;
    r.assert_exited();
    assert!(
        r.events
            .iter()
            .any(|e| matches!(e.kind, JobEventKind::ProcessRolledBack { .. })),
        "nothing was restored"
    );
    for pid in 0..6 {
        let (got, want) = (r.raw(pid), hidden_state_reference(pid, steps));
        assert_eq!(got.len(), want.len(), "pid {pid}: records");
        let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ, 0,
            "{differ} of pid {pid}'s {steps} records differ from the failure-free run"
        );
    }
}

/// A tmpfs of `mib` MiB mounted at a fresh directory, unmounted on drop:
/// a disk that really fills up.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(mib: u32) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount(8)");
        assert!(
            status.success(),
            "cannot mount a tmpfs (the full-disk test needs root, like the testbed): {status}"
        );
        SmallDisk { dir }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Write a file of zeros until the disk is full.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 64 << 10];
        while f.write_all(&block).is_ok() {}
        let _ = f.flush();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Finding 4: the supernode's disk fills up while a job runs. Leases live
/// on in memory, so no peer is declared gone and no job fails; `/health`
/// and writes say what is wrong (503 `storage_unavailable`); once space
/// returns, the job ends with its correct output (before: every renewal
/// failed, the supernode declared its peers gone and failed the job).
#[tokio::test(flavor = "multi_thread")]
async fn finding_4_a_full_disk_fails_no_job() {
    use crate::examples::pagerank_kernel as kernel;
    let disk = SmallDisk::mount(48);
    let cluster = Cluster::start(Options {
        peers: 3,
        lease_ttl_secs: 3,
        supernode_data: Some(disk.path().join("supernode")),
        // The supernode's own SQLite file is what fills the disk.
        sqlite: true,
        ..Options::default()
    });
    let client = cluster.admin().await;
    let (n, m, iters) = (20_000u64, 100_000u64, 300u32);
    let args = json!({"n": n, "m": m, "iters": iters, "seed": 5});
    let id = client.submit(&job("pagerank", 3, args)).await.unwrap().id;
    let deadline = Instant::now() + Duration::from_secs(120);
    while client
        .job(id)
        .await
        .unwrap()
        .supersteps
        .iter()
        .all(|&s| s < 2)
    {
        assert!(Instant::now() < deadline, "the job did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let filler = disk.fill();
    let full_at = Instant::now();
    // The supernode notices at the next write (a renewal, within a second).
    let problem = loop {
        let health = client.health().await.expect("reads work on a full disk");
        if let Some(p) = health.storage_problem {
            break p;
        }
        assert!(
            full_at.elapsed() < Duration::from_secs(30),
            "no storage problem reported"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(problem.contains("write to its disk"), "{problem}");
    // Writes say so.
    let err = client
        .submit(&job("ring", 2, json!(null)))
        .await
        .expect_err("nothing new is stored");
    assert_eq!(err.status(), Some(503), "{err}");
    assert!(
        err.to_string().contains("cannot write to its disk"),
        "{err}"
    );
    // Three lease lifetimes on a full disk: every peer still online, the
    // job not failed.
    while full_at.elapsed() < Duration::from_secs(9) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let peers = client.peers().await.unwrap();
    assert_eq!(
        peers.iter().filter(|p| p.state == "online").count(),
        3,
        "{peers:?}"
    );
    assert_eq!(client.job(id).await.unwrap().outcome, None);

    // Space returns: the supernode writes again and the job ends well.
    std::fs::remove_file(filler).unwrap();
    let r = crate::harness::collect(&client, id).await;
    r.assert_exited();
    let params = kernel::Params::new(n, m, iters, 5).expect("valid parameters");
    assert_eq!(r.stdout(0), kernel::reference(&params));
    assert_eq!(client.health().await.unwrap().storage_problem, None);
}

/// A guest whose pid 0 sends `count` messages of `size` bytes to pid 1 in
/// superstep 0 (from its own memory, grown to hold one message).
fn flood_guest(count: u32, size: u32) -> Vec<u8> {
    let pages = size.div_ceil(65536) + 1;
    wat::parse_str(format!(
        r#"(module
          (import "bspweb_v1" "pid" (func $pid (result i32)))
          (import "bspweb_v1" "send" (func $send (param i32 i32 i32) (result i32)))
          (memory (export "memory") {pages})
          (func (export "bspweb_resume") (result i32)
            (local $i i32)
            (if (i32.eqz (call $pid))
              (then
                (loop $l
                  (drop (call $send (i32.const 1) (i32.const 0) (i32.const {size})))
                  (local.set $i (i32.add (local.get $i) (i32.const 1)))
                  (br_if $l (i32.lt_u (local.get $i) (i32.const {count}))))))
            (i32.const 1)))"#
    ))
    .expect("the guest parses")
}

/// Finding 1 (memory amplification): peers with a 400 MiB budget each.
/// `ring -n 4096` is refused at submission instead of driving the peers
/// out of memory; a guest sending 120 messages of 8 MiB, and one sending
/// 4 Mi empty messages, fail with a message that says why, while every
/// peer stays online and within its budget, and other jobs run.
#[tokio::test(flavor = "multi_thread")]
async fn finding_1_a_job_cannot_make_peers_run_out_of_memory() {
    let budget_mib = 400u64;
    let cluster = Cluster::start(Options {
        peers: 3,
        lease_ttl_secs: 3,
        peer_args: vec!["--memory-budget-mib".into(), budget_mib.to_string()],
        ..Options::default()
    });
    let client = cluster.admin().await;
    // Every peer has reported its budget.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !client
        .peers()
        .await
        .unwrap()
        .iter()
        .filter(|p| p.state == "online")
        .all(|p| p.memory.budget_bytes == budget_mib << 20)
    {
        assert!(
            Instant::now() < deadline,
            "the peers did not report their budgets"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let baseline: Vec<u64> = (0..3).map(|i| cluster.peer_rss(i).unwrap()).collect();
    let err = client
        .submit(&job("ring", 4096, json!(null)))
        .await
        .expect_err("4096 processes do not fit in 1200 MiB");
    assert_eq!(err.status(), Some(409), "{err}");
    assert!(
        err.to_string()
            .contains("the 3 online peers may use 1200 MiB together"),
        "{err}"
    );

    for (what, count, size) in [
        ("8 MiB messages", 120, 8 << 20),
        ("empty messages", 4 << 20, 0),
    ] {
        let hash = client
            .upload_program(flood_guest(count, size), Some("flood"))
            .await
            .unwrap()
            .hash;
        let r = run(&client, job(&hash, 2, json!(null))).await;
        let failure = r.failure();
        assert!(
            failure.contains("the peer is out of memory for bspweb")
                && failure.contains(&format!("of the {budget_mib} MiB its volunteer allows")),
            "{what}: {failure}"
        );
        let peers = client.peers().await.unwrap();
        assert_eq!(
            peers.iter().filter(|p| p.state == "online").count(),
            3,
            "{what}: {peers:?}"
        );
        for i in 0..3 {
            let rss = cluster.peer_rss(i).expect("the peer runs");
            assert!(
                rss < (budget_mib + 64) << 20,
                "{what}: peer {i} holds {} MiB",
                rss >> 20
            );
        }
    }
    // Checkpoints off and 4 MiB sent per superstep: the senders keep every
    // message since the start, and the job fails once they fill a budget,
    // saying to checkpoint more often.
    let mut piling = job("supersteps", 2, json!({"k": 100_000, "h": 4 << 20}));
    piling.limits = Some(bsp_api::rest::JobLimits {
        checkpoint_every: 1_000_000,
        ..Default::default()
    });
    let failure = run(&client, piling).await.failure();
    assert!(
        failure.contains("the peer is out of memory for bspweb")
            && failure.contains("checkpoint more often"),
        "{failure}"
    );
    run(&client, job("ring", 6, json!(null)))
        .await
        .assert_exited();
    // Memory returns to about where it was once the jobs are over (peers
    // trim their heap when a job ends, which follows its end shortly).
    let deadline = Instant::now() + Duration::from_secs(30);
    for (i, base) in baseline.iter().enumerate() {
        loop {
            let rss = cluster.peer_rss(i).unwrap();
            if rss < base + (64 << 20) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "peer {i} holds {} MiB after the jobs, {} MiB before",
                rss >> 20,
                base >> 20
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
