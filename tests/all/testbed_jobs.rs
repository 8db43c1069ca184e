//! Jobs on the network testbed (`testbed.rs`): a supernode and peers
//! started inside its hosts, driven through the REST client from inside the
//! supernode's namespace.

use std::fs::File;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::testbed::{Leftovers, Testbed, Topology};

/// A supernode and peers started on testbed hosts.
struct Deployment {
    url: String,
    /// The supernode's certificate fingerprint: every testbed's supernode
    /// has the same address, so clients pin this one, not the harness's
    /// pin by URL (tests run at once).
    fingerprint: String,
    /// The supernode's data and the peers' logs and idle files.
    data: tempfile::TempDir,
    /// `(host, child index)` of each peer.
    peers: Vec<(String, usize)>,
}

impl Deployment {
    /// The log file of the peer on `host` (when started with `logs`).
    fn log(&self, host: &str) -> String {
        std::fs::read_to_string(self.data.path().join(format!("peer-{host}.log")))
            .unwrap_or_default()
    }
}

/// Start a supernode on `supernode_host` and a peer on each of `peers`
/// (`(host, cluster)`), the peers logging `peer_log` to files.
fn deploy(
    tb: &mut Testbed,
    supernode_host: &str,
    peers: &[(&str, Option<&str>)],
    lease_ttl_secs: u64,
    peer_log: &str,
) -> Deployment {
    deploy_with(
        tb,
        supernode_host,
        peers,
        lease_ttl_secs,
        peer_log,
        &[],
        &[],
    )
}

/// [`deploy`] with more arguments for the supernode and for every peer.
fn deploy_with(
    tb: &mut Testbed,
    supernode_host: &str,
    peers: &[(&str, Option<&str>)],
    lease_ttl_secs: u64,
    peer_log: &str,
    supernode_args: &[&str],
    peer_args: &[&str],
) -> Deployment {
    use crate::harness::{ADMIN, ADMIN_PASSWORD, bspweb};
    let data = tempfile::tempdir().unwrap();
    let mut sn = bspweb();
    sn.args(["supernode", "--listen"])
        .arg(format!("{}:7878", tb.addr(supernode_host)))
        .arg("--exit-on-stdin-eof")
        .arg("--data")
        .arg(data.path().join("supernode"))
        .args(["--lease-ttl-secs", &lease_ttl_secs.to_string()])
        .args(supernode_args)
        .env("BSPWEB_USER", ADMIN)
        .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
        .env("BSPWEB_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let i = tb.spawn(supernode_host, sn).unwrap();
    // Not on loopback: it serves HTTPS with a self-signed certificate,
    // which the peers and the harness's clients pin.
    let (url, fingerprint) = crate::harness::read_start(tb.child(i).stdout.take().unwrap())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(url.starts_with("https://"), "{url}");
    let fingerprint = fingerprint.expect("the certificate's fingerprint");
    // From inside the supernode's host: the root namespace has no route
    // into the testbed.
    let token = {
        let (url, options) = (url.clone(), pinned(&fingerprint));
        tb.thread_in(supernode_host, move || {
            crate::harness::enroll_with(options, &url, "testbed peers")
        })
        .unwrap()
        .join()
        .expect("enrolling the testbed's peers")
    };
    let mut started = Vec::new();
    for &(host, cluster) in peers {
        let idle = data.path().join(format!("idle-{host}"));
        std::fs::write(&idle, "1.0").unwrap();
        let log = File::create(data.path().join(format!("peer-{host}.log"))).unwrap();
        let mut peer = bspweb();
        peer.args(["peer", "--supernode", &url, "--listen", "0.0.0.0:7900"])
            .arg("--advertise")
            .arg(format!("{}:7900", tb.addr(host)))
            .args(["--name", &format!("tb-{host}"), "--nice", "0"])
            // Each host its own compile cache, as a machine of its own.
            .arg("--compile-cache")
            .arg(data.path().join(format!("compiled-{host}")))
            .args(["--speed", "1.0", "--slots", "2", "--exit-on-stdin-eof"])
            .arg("--idle-file")
            .arg(&idle)
            .args(peer_args)
            .args(["--supernode-fingerprint", &fingerprint])
            .env("BSPWEB_LOG", peer_log)
            .env("BSPWEB_PEER_TOKEN", &token)
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        if let Some(c) = cluster {
            peer.args(["--cluster", c]);
        }
        let k = tb.spawn(host, peer).unwrap();
        started.push((host.to_string(), k));
    }
    Deployment {
        url,
        fingerprint,
        data,
        peers: started,
    }
}

/// Clients that accept exactly the certificate with `fingerprint`.
fn pinned(fingerprint: &str) -> bsp_api::client::ClientOptions {
    bsp_api::client::ClientOptions::new()
        .fingerprint(fingerprint.parse().expect("the printed fingerprint parses"))
}

/// Log in from inside the current namespace and wait for `n` online peers.
async fn online_client(url: &str, fingerprint: &str, n: usize) -> bsp_api::client::Client {
    use crate::harness::{ADMIN, ADMIN_PASSWORD};
    let client = pinned(fingerprint)
        .login(url, ADMIN, ADMIN_PASSWORD)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let online = client
            .peers()
            .await
            .map(|ps| ps.iter().filter(|p| p.state == "online").count())
            .unwrap_or(0);
        if online == n {
            return client;
        }
        assert!(
            Instant::now() < deadline,
            "only {online} of {n} peers came online"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Run `f` with a client in `host`'s namespace; clean up the testbed (and
/// check nothing is left) whatever happens, then return `f`'s result.
fn with_client<T: Send + 'static, F>(
    tb: Testbed,
    mut left: Leftovers,
    host: &str,
    f: impl FnOnce() -> F + Send + 'static,
) -> T
where
    F: std::future::Future<Output = T>,
{
    let thread = tb
        .thread_in(host, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(f())
        })
        .unwrap();
    let result = thread.join();
    left.pids = tb.child_pids();
    drop(tb);
    left.assert_none();
    match result {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// A supernode in cluster a, a peer in each cluster: a ring job of 6
/// processes runs across the 20 Mbit/s gateways.
#[test]
fn a_ring_job_runs_across_clusters() {
    use crate::harness::{job, run as run_job};

    let mut tb = Testbed::create(&Topology::load("clusters").unwrap()).unwrap();
    let left = Leftovers::of(&tb);
    let d = deploy(
        &mut tb,
        "a0",
        &[("a1", None), ("b0", None), ("c0", None)],
        15,
        "warn",
    );
    let (url, fingerprint) = (d.url.clone(), d.fingerprint.clone());
    let ring = with_client(tb, left, "a0", move || async move {
        let client = online_client(&url, &fingerprint, 3).await;
        run_job(&client, job("ring", 6, serde_json::Value::Null)).await
    });

    ring.assert_exited();
    assert_eq!(ring.info.exited, 6);
    for pid in 0..6 {
        let out = ring.stdout(pid);
        assert!(
            out.iter().any(|l| l == "got in total 2 messages"),
            "pid {pid} printed {out:?}"
        );
    }
    let mut peers = ring.info.placement.clone();
    peers.sort();
    peers.dedup();
    assert!(
        peers.len() >= 2,
        "all processes ran on one peer: {:?}",
        ring.info.placement
    );
}

/// Status lines of a run.
fn statuses(run: &crate::harness::Run) -> Vec<String> {
    run.events
        .iter()
        .filter_map(|e| match &e.kind {
            bsp_api::rest::JobEventKind::Status { text } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// Every pid of `run` printed, for each round, that it got `bytes` bytes
/// with the hash the round's sender printed.
fn assert_broadcasts_arrived(run: &crate::harness::Run, nprocs: u32, rounds: u32, bytes: u64) {
    for round in 0..rounds {
        let root = round % nprocs;
        let prefix = format!("round {round}: pid {root} sent {bytes} bytes fnv ");
        let hash = run
            .stdout(root)
            .iter()
            .find_map(|l| l.strip_prefix(&prefix).map(String::from))
            .unwrap_or_else(|| {
                panic!(
                    "pid {root} did not send round {round}: {:?}",
                    run.stdout(root)
                )
            });
        for pid in 0..nprocs {
            let want = format!("round {round}: pid {pid} got {bytes} bytes fnv {hash}");
            assert!(
                run.stdout(pid).contains(&want),
                "pid {pid} lacks `{want}`: {:?}",
                run.stdout(pid)
            );
        }
    }
}

const TB_PEERS: [(&str, Option<&str>); 6] = [
    ("a1", Some("a")),
    ("a2", Some("a")),
    ("b0", Some("b")),
    ("b1", Some("b")),
    ("c0", Some("c")),
    ("c1", Some("c")),
];

/// Six peers in three clusters behind 20 Mbit/s gateways: the job's program
/// reaches them by Robber (one download from the supernode, the other peers
/// the job is placed on from each other), and `broadcast`'s large rounds
/// are relayed along a chain ordered cluster by cluster, each receiver
/// getting the sender's bytes (hash checked).
#[test]
fn a_broadcast_job_gets_its_program_by_robber_and_relays_across_clusters() {
    use crate::harness::{job, run as run_job};
    const BYTES: u64 = 1_500_000;
    const ROUNDS: u32 = 3;

    let mut tb = Testbed::create(&Topology::load("clusters").unwrap()).unwrap();
    let left = Leftovers::of(&tb);
    let d = deploy(&mut tb, "a0", &TB_PEERS, 15, "warn,bspweb_peer::job=debug");
    let (url, fingerprint) = (d.url.clone(), d.fingerprint.clone());
    let run = with_client(tb, left, "a0", move || async move {
        let client = online_client(&url, &fingerprint, 6).await;
        let args = serde_json::json!({"bytes": BYTES, "rounds": ROUNDS});
        run_job(&client, job("broadcast", 12, args)).await
    });
    run.assert_exited();
    assert_broadcasts_arrived(&run, 12, ROUNDS, BYTES);
    let st = statuses(&run);
    let downloaded: Vec<&String> = st
        .iter()
        .filter(|t| t.contains("downloaded the program"))
        .collect();
    assert_eq!(downloaded.len(), 1, "{st:?}");
    // Placement weighs peers by measured power, and under load a peer may
    // be measured too weak to get one of the 12 processes: every *other*
    // peer the job was placed on gets the program by Robber.
    let others: usize = downloaded[0]
        .split("passes it on to ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peer count in {:?}", downloaded[0]));
    assert!(
        (2..=5).contains(&others),
        "the job should span at least 3 of the 6 peers: {st:?}"
    );
    assert_eq!(
        st.iter()
            .filter(|t| t.contains("got the program by Robber"))
            .count(),
        others,
        "{st:?}"
    );
    assert!(!st.iter().any(|t| t.contains("directly")), "{st:?}");
    let relayed: usize = TB_PEERS
        .iter()
        .map(|(h, _)| {
            d.log(h)
                .lines()
                .filter(|l| l.contains("relaying a multicast") && l.contains("Chain"))
                .count()
        })
        .sum();
    // Each round's 1.5 MB message goes along a chain.
    assert!(
        relayed >= ROUNDS as usize,
        "{relayed} relayed multicasts logged"
    );
}

/// The same across clusters, and a peer is killed (SIGKILL) while the
/// rounds go on: its processes are restored elsewhere and every process,
/// restored ones included, still gets every round's bytes.
#[test]
fn killing_a_peer_during_broadcasts_still_delivers_everywhere() {
    use crate::harness::{collect, job};
    const BYTES: u64 = 1_000_000;
    const ROUNDS: u32 = 8;

    let mut tb = Testbed::create(&Topology::load("clusters").unwrap()).unwrap();
    let left = Leftovers::of(&tb);
    let d = deploy(&mut tb, "a0", &TB_PEERS, 3, "warn");
    let (url, fingerprint) = (d.url.clone(), d.fingerprint.clone());
    // b0: a relay in the middle of the chains (cluster b sits between a and c).
    let victim = tb.child(d.peers[2].1).id();
    let run = with_client(tb, left, "a0", move || async move {
        let client = online_client(&url, &fingerprint, 6).await;
        let args = serde_json::json!({"bytes": BYTES, "rounds": ROUNDS});
        let info = client.submit(&job("broadcast", 12, args)).await.unwrap();
        // Kill the peer once round 1 is under way.
        let mut stream = client.events(info.id, None);
        let deadline = Instant::now() + Duration::from_secs(120);
        while let Some(e) = stream.next().await.unwrap() {
            if let bsp_api::rest::JobEventKind::Stdout { text } = &e.kind
                && text.starts_with("round 1:")
            {
                break;
            }
            assert!(Instant::now() < deadline, "round 1 never started");
        }
        let killed = Command::new("kill")
            .args(["-9", &victim.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        collect(&client, info.id).await
    });
    run.assert_exited();
    assert_broadcasts_arrived(&run, 12, ROUNDS, BYTES);
    let restored = run
        .events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                bsp_api::rest::JobEventKind::ProcessRolledBack { .. }
            )
        })
        .count();
    assert!(
        restored > 0,
        "no process was restored: {:?}",
        statuses(&run)
    );
}

/// The testbed's twelve `clusters` hosts, by cluster.
const CLUSTER_HOSTS: [[&str; 4]; 3] = [
    ["a0", "a1", "a2", "a3"],
    ["b0", "b1", "b2", "b3"],
    ["c0", "c1", "c2", "c3"],
];

/// The online peers' names by the cluster the supernode found for them
/// (names sorted), and how many online peers have none yet.
fn found_groups(
    peers: &[bsp_api::rest::PeerInfo],
) -> (std::collections::BTreeMap<String, Vec<String>>, usize) {
    let mut groups: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut without = 0;
    for p in peers.iter().filter(|p| p.state == "online") {
        match &p.found_cluster {
            Some(c) => groups.entry(c.clone()).or_default().push(p.name.clone()),
            None => without += 1,
        }
    }
    for g in groups.values_mut() {
        g.sort();
    }
    (groups, without)
}

/// Twelve peers behind three 20 Mbit/s gateways, started without
/// `--cluster` (issue 15): they measure their links, the supernode
/// clusters them with DiDiC, and within a bounded time every pair behind
/// the same gateway shares a cluster and no cluster spans a gateway. Then
/// jobs use those clusters: a 4-process job lands inside one cluster
/// (two-level placement, Fig. 6.1), and a broadcast job too large for one
/// cluster gets the found clusters as its sites (its Robber status line
/// names them).
#[test]
fn peers_find_their_clusters_and_jobs_use_them() {
    use crate::harness::{job, run as run_job};
    const FIND_WITHIN: Duration = Duration::from_secs(240);

    let mut tb = Testbed::create(&Topology::load("clusters").unwrap()).unwrap();
    let left = Leftovers::of(&tb);
    let peers: Vec<(&str, Option<&str>)> =
        CLUSTER_HOSTS.iter().flatten().map(|&h| (h, None)).collect();
    let d = deploy_with(
        &mut tb,
        "a0",
        &peers,
        3,
        "warn",
        &["--cluster-step-ms", "100"],
        // Every link within a few renewals (the default budget spreads
        // them over minutes).
        &["--probe-mib-per-hour", "4000"],
    );
    let (url, fingerprint) = (d.url.clone(), d.fingerprint.clone());
    let (groups, took, infos, ring, broadcast) = with_client(tb, left, "a0", move || async move {
        let client = online_client(&url, &fingerprint, 12).await;
        let start = Instant::now();
        let mut want: Vec<Vec<String>> = CLUSTER_HOSTS
            .iter()
            .map(|hosts| hosts.iter().map(|h| format!("tb-{h}")).collect())
            .collect();
        want.sort();
        // Right on five polls in a row (half a second apart): settled.
        let mut right = 0;
        let (groups, took) = loop {
            let (groups, without) = found_groups(&client.peers().await.unwrap());
            let mut got: Vec<Vec<String>> = groups.values().cloned().collect();
            got.sort();
            if without == 0 && got == want {
                right += 1;
                if right == 5 {
                    break (groups, start.elapsed());
                }
            } else {
                right = 0;
            }
            assert!(
                start.elapsed() < FIND_WITHIN,
                "after {:?}: {without} peers without a cluster, found {groups:?}",
                start.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let ring = run_job(&client, job("ring", 4, serde_json::Value::Null)).await;
        let args = serde_json::json!({"bytes": 200_000, "rounds": 2});
        let broadcast = run_job(&client, job("broadcast", 12, args)).await;
        let infos = client.peers().await.unwrap();
        (groups, took, infos, ring, broadcast)
    });
    eprintln!("the peers found their clusters {took:?} after all were online: {groups:?}");

    // Two-level placement: the ring's four processes in one found cluster.
    ring.assert_exited();
    let cluster_of = |id: i64| {
        infos
            .iter()
            .find(|p| p.id == id)
            .and_then(|p| p.found_cluster.clone())
    };
    let ring_clusters: std::collections::BTreeSet<Option<String>> =
        ring.info.placement.iter().map(|&p| cluster_of(p)).collect();
    assert_eq!(
        ring_clusters.len(),
        1,
        "the 4-process job spans clusters: {ring_clusters:?}"
    );
    let home = ring_clusters.into_iter().next().flatten().unwrap();
    let st = statuses(&ring);
    assert!(
        st.iter()
            .any(|t| t.starts_with("placed 4 processes")
                && t.contains(&format!(" in cluster {home}"))),
        "{st:?}"
    );

    // The broadcast job: its sites are the found clusters.
    broadcast.assert_exited();
    assert_broadcasts_arrived(&broadcast, 12, 2, 200_000);
    let st = statuses(&broadcast);
    let robber = st
        .iter()
        .find(|t| t.contains("by Robber; the job's"))
        .unwrap_or_else(|| panic!("no Robber line names the clusters: {st:?}"));
    let named: Vec<&str> = robber
        .rsplit_once(" in clusters ")
        .unwrap_or_else(|| panic!("{robber}"))
        .1
        .split(", ")
        .map(|c| c.split_once(" (").map_or(c, |(name, _)| name))
        .collect();
    assert!(named.len() >= 2, "{robber}");
    assert!(
        named.iter().all(|c| groups.contains_key(*c)),
        "{robber} names clusters other than the found {groups:?}"
    );
}
