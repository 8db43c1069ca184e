//! Peers' claims against what they deliver (issue 18): a peer that claims
//! a hundred times its speed gets no more than about its real share once
//! its job's other peers have timed it, and a peer that renews its lease
//! but runs nothing has its processes restored elsewhere.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::time::Duration;

use bsp_api::control::{Lease, PeerLogin, PeerRenew};
use bsp_api::rest::{JobEventKind, JobLimits, PeerInfo};

use crate::harness::{Cluster, Options, collect, job, until};

const LIMIT: Duration = Duration::from_secs(180);

/// A CPU cgroup (v1 `cpu` controller or v2 `cpu.max`) that lets its
/// processes use `percent` of one core; removed on drop.
struct CpuCap(std::path::PathBuf);

impl CpuCap {
    fn new(percent: u32) -> CpuCap {
        let name = format!("bspweb-test-{}", std::process::id());
        let v1 = std::path::Path::new("/sys/fs/cgroup/cpu").join(&name);
        if std::fs::create_dir_all(&v1).is_ok()
            && std::fs::write(v1.join("cpu.cfs_period_us"), "100000").is_ok()
            && std::fs::write(v1.join("cpu.cfs_quota_us"), (percent * 1000).to_string()).is_ok()
        {
            return CpuCap(v1);
        }
        let v2 = std::path::Path::new("/sys/fs/cgroup").join(&name);
        std::fs::create_dir_all(&v2)
            .and_then(|()| std::fs::write(v2.join("cpu.max"), format!("{} 100000", percent * 1000)))
            .unwrap_or_else(|e| {
                panic!(
                    "this test caps a peer's CPU with a cgroup (v1 /sys/fs/cgroup/cpu or v2 \
                     cpu.max) and needs root for it: {e}"
                )
            });
        CpuCap(v2)
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string())
            .expect("move a process into the cgroup");
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        // Its processes are gone by now (the peer was killed first).
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn hosted(placement: &[i64], peer: i64) -> usize {
    placement.iter().filter(|&&p| p == peer).count()
}

/// The placement of job `id`, once the scheduler placed it.
async fn placed(client: &bsp_api::client::Client, id: bsp_api::JobId) -> Vec<i64> {
    until("the job to be placed", LIMIT, async || {
        let info = client.job(id).await.ok()?;
        (!info.placement.is_empty()).then_some(info.placement)
    })
    .await
}

/// Three honest peers and one that claims speed 100 but may use a quarter
/// of a core: on probation it gets at most twice the median power at once;
/// once its jobs' other peers timed it, placement gives it about what it
/// delivers, and a new job of 16 processes puts no more on it than
/// twice its real share would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_claims_a_hundred_times_its_speed_gets_about_its_real_share() {
    let mut cluster = Cluster::start(Options {
        peers: 3,
        lease_ttl_secs: 6,
        ..Options::default()
    });
    let admin = cluster.admin().await;
    // A tenth of a core: far below an honest peer's share even when other
    // tests load the machine and slow the honest peers too.
    let cap = CpuCap::new(10);
    let index = cluster.add_peer("liar", &["--speed".into(), "100".into()]);
    cap.add(cluster.peer_pid(index));
    let liar: PeerInfo = until("the liar to come online", LIMIT, async || {
        let peers = admin.peers().await.ok()?;
        peers
            .into_iter()
            .find(|p| p.name == "liar" && p.state == "online")
    })
    .await;
    assert_eq!(liar.speed, 100.0);
    let power = liar.power.expect("an online peer has a power");
    assert!(
        power <= 2.0 + 1e-9,
        "on probation the liar should get at most twice the others' power, not {power}"
    );

    // PageRank: equal work per process and superstep. Far more iterations
    // than the test waits for (the job is killed once the liar is
    // measured): it must still run when the liar is timed, however slowly
    // a loaded machine gets there (with 400 iterations a CI run once
    // finished the job before the liar was measured, and waited in vain).
    // Checkpoints off: what is timed is the liar's compute; at a tenth of
    // a core, checkpointing its processes' 3 MiB accumulators (and keeping
    // replicas for the others) would make each of its supersteps take
    // seconds, and its measurement wait for them.
    let args = serde_json::json!({"n": 400_000, "m": 2_000_000, "iters": 1_000_000});
    let spec = {
        let mut s = job("pagerank", 16, args);
        s.limits = Some(JobLimits {
            checkpoint_every: 1_000_000,
            ..JobLimits::default()
        });
        s
    };
    let first = admin.submit(&spec).await.unwrap();
    let on_liar = hosted(&placed(&admin, first.id).await, liar.id);
    // Each change of what the supernode says of the liar (state, power,
    // delivered power) is printed: the output of a failed run shows why it
    // was not capped.
    let mut seen = None;
    let waiting = format!(
        "the liar to be measured and capped (it hosts {on_liar} of the job's 16 processes)"
    );
    let measured = until(&waiting, LIMIT, async || {
        let peers = admin.peers().await.ok()?;
        let p = peers.into_iter().find(|p| p.id == liar.id)?;
        if seen.as_ref() != Some(&(p.state.clone(), p.power, p.delivered_power)) {
            seen = Some((p.state.clone(), p.power, p.delivered_power));
            eprintln!("liar: {seen:?}");
        }
        let (power, delivered) = (p.power?, p.delivered_power?);
        // A tenth of a core against the others' share of two cores: a
        // fifth of an honest peer's power or less on a quiet machine, but
        // load slows the honest peers and not the capped liar (measured
        // 0.23 beside three busy loops, so a power of 0.28); a CI run that
        // waited in vain for 0.4 most likely met more load than that.
        // Half an honest peer's power (1.0) still tells a capped liar
        // from one believed (2.0 on probation, 100 claimed).
        (power < 0.6).then_some((power, delivered))
    })
    .await;
    eprintln!(
        "liar: claimed 100, probation {power:.2} ({on_liar} of 16 processes), \
         measured {:.2}, placement power now {:.2}",
        measured.1, measured.0
    );
    // The measurement outlives the job (ten minutes); the new job is
    // placed once the first one no longer holds the peers' slots.
    admin.kill(first.id).await.unwrap();
    let second = admin.submit(&spec).await.unwrap();
    let second_placement = placed(&admin, second.id).await;
    let share = hosted(&second_placement, liar.id);
    // Its real share is about 5 % (0.8 of 16 processes); the DHHT spreads
    // 16 processes widely (one of three equal peers got 6 in a run), so
    // the bound is an honest peer's even share, not the 15 it would get
    // for its claim or the 6 of probation.
    assert!(
        share <= 4,
        "the liar (measured {:.2}, power {:.2}) hosts {share} of 16 processes of a new job \
         (placement {second_placement:?})",
        measured.1,
        measured.0
    );
    admin.kill(second.id).await.unwrap();
    cluster.kill_peer(index);
}

/// A peer that logs in claiming a huge speed and renews its lease but runs
/// nothing: the job's other peers wait for its processes past the
/// superstep limit, say so, and the supernode restores them elsewhere; the
/// job ends with the output of an undisturbed run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_renews_but_runs_nothing_loses_its_processes() {
    let cluster = Cluster::start(Options {
        peers: 3,
        ..Options::default()
    });
    let admin = cluster.admin().await;
    let spec = {
        let mut s = job("ring", 8, serde_json::json!(null));
        s.limits = Some(JobLimits {
            superstep_ms: 2_000,
            ..JobLimits::default()
        });
        s
    };
    let undisturbed = collect(&admin, admin.submit(&spec).await.unwrap().id).await;
    undisturbed.assert_exited();

    // The fake peer: a data port that never answers, a lease it renews.
    let port = TcpListener::bind("127.0.0.1:0").unwrap();
    let http = reqwest::Client::new();
    let login = PeerLogin {
        name: "sloth".into(),
        addr: port.local_addr().unwrap().to_string(),
        speed: 1e9,
        idle: 1.0,
        cores: 64,
        version: bsp_api::API_VERSION,
        previous_id: None,
        cluster: None,
        token: Some(bsp_api::control::EnrollmentToken(
            cluster.peer_token.clone(),
        )),
    };
    let lease: Lease = http
        .post(format!("{}/api/v1/peer/login", cluster.url))
        .json(&login)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sloth = lease.peer_id;
    let renewer = {
        let (http, url, token) = (http.clone(), cluster.url.clone(), lease.token.clone());
        tokio::spawn(async move {
            let mut token = token;
            loop {
                let body = PeerRenew::idle(1e9);
                let Ok(resp) = http
                    .post(format!("{url}/api/v1/peer/renew"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await
                else {
                    return;
                };
                match resp.json::<Lease>().await {
                    Ok(l) => token = l.token,
                    // Fenced: the lease is gone.
                    Err(_) => return,
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };

    let run = admin.submit(&spec).await.unwrap();
    let placement = placed(&admin, run.id).await;
    assert!(
        hosted(&placement, sloth) > 0,
        "the fake peer got no process: {placement:?}"
    );
    let disturbed = collect(&admin, run.id).await;
    disturbed.assert_exited();
    for pid in 0..8 {
        assert_eq!(disturbed.stdout(pid), undisturbed.stdout(pid), "pid {pid}");
    }
    let said: BTreeMap<_, _> = disturbed
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            JobEventKind::Status { text } if text.contains("made no progress") => {
                Some((e.id, text.clone()))
            }
            _ => None,
        })
        .collect();
    assert!(
        !said.is_empty(),
        "no event says the fake peer made no progress: {:?}",
        disturbed.events
    );
    let peers = admin.peers().await.unwrap();
    let fake = peers.iter().find(|p| p.id == sloth).unwrap();
    assert_eq!(fake.state, "gone", "{fake:?}");
    renewer.abort();
}
