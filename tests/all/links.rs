//! Issue 15: peers measure the links between them (round trip and
//! bandwidth), as the supernode asks, within their volunteers' caps, and
//! the supernode shows what they measured; two-level placement over the
//! peers' clusters.

use std::time::Duration;

use crate::harness::{ADMIN, ADMIN_PASSWORD, Cluster, Options, bspweb, until};

/// Three peers measure each other within a bounded time; a fourth whose
/// volunteer turned probes off measures nothing and answers no probe, so
/// no link to it is ever reported.
#[tokio::test]
async fn peers_measure_their_links_within_their_volunteers_caps() {
    let mut cluster = Cluster::start(Options {
        peers: 3,
        // Renewals every second: targets come with renewals.
        lease_ttl_secs: 3,
        ..Options::default()
    });
    cluster.add_peer(
        "no-probes",
        &["--probe-mib-per-hour".to_string(), "0".to_string()],
    );
    cluster.wait_for_peers(4);
    let admin = cluster.admin().await;
    let peers = until(
        "every probing peer to measure the other two",
        Duration::from_secs(60),
        async || {
            let peers = admin.peers().await.ok()?;
            let probing: Vec<_> = peers
                .iter()
                .filter(|p| p.state == "online" && p.name != "no-probes")
                .collect();
            let done = probing.len() == 3
                && probing.iter().all(|p| {
                    probing
                        .iter()
                        .filter(|q| q.id != p.id)
                        .all(|q| p.links.iter().any(|l| l.peer == q.id))
                });
            done.then_some(peers)
        },
    )
    .await;
    let quiet = peers
        .iter()
        .find(|p| p.name == "no-probes")
        .expect("listed");
    assert!(quiet.links.is_empty(), "{:?}", quiet.links);
    for p in &peers {
        assert!(
            p.links.iter().all(|l| l.peer != quiet.id && l.peer != p.id),
            "peer {} reports a link to itself or to the peer that answers no probe: {:?}",
            p.id,
            p.links
        );
        for l in &p.links {
            // Loopback: well under a second, well over a megabyte a second.
            assert!(l.rtt_us > 0 && l.rtt_us < 1_000_000, "{l:?}");
            assert!(l.bandwidth_bps > 1_000_000, "{l:?}");
        }
    }
    // `bspweb peers --links`: a line per link, at least the six above.
    let config = tempfile::tempdir().unwrap();
    let out = bspweb()
        .args(["peers", "--links"])
        .env("BSPWEB_URL", &cluster.url)
        .env("BSPWEB_USER", ADMIN)
        .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
        .env("BSPWEB_CONFIG_DIR", config.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("FROM"), "{stdout}");
    assert!(
        stdout.lines().filter(|l| l.contains("MB/s")).count() >= 6,
        "{stdout}"
    );
}

/// Two-level placement (Fig. 6.1) with clusters `a` and `b` of two peers
/// each, `a`'s peers with a memory budget below what a process needs
/// (16 MiB, less than their own resident memory). Every 4-process job
/// fits either cluster's cores; jobs whose first choice on the top ring
/// is `a` (jobs 1 and 3 of a fresh supernode) go to `b`, saying why,
/// instead of waiting for memory `a` will never have; none spans both.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_whose_cluster_lacks_memory_goes_to_the_next_one() {
    use crate::harness::{job, run};

    let mut cluster = Cluster::start(Options {
        peers: 0,
        lease_ttl_secs: 3,
        ..Options::default()
    });
    for (name, c, budget) in [
        ("a-0", "a", "16"),
        ("a-1", "a", "16"),
        ("b-0", "b", "2048"),
        ("b-1", "b", "2048"),
    ] {
        cluster.add_peer(
            name,
            &[
                "--cluster".to_string(),
                c.to_string(),
                "--memory-budget-mib".to_string(),
                budget.to_string(),
            ],
        );
    }
    cluster.wait_for_peers(4);
    let admin = cluster.admin().await;
    // Every peer has reported its budget and memory.
    let peers = until(
        "every peer to report its memory",
        Duration::from_secs(30),
        async || {
            let peers = admin.peers().await.ok()?;
            let online: Vec<_> = peers.into_iter().filter(|p| p.state == "online").collect();
            (online.len() == 4
                && online
                    .iter()
                    .all(|p| p.memory.budget_bytes > 0 && p.memory.rss_bytes > 0))
            .then_some(online)
        },
    )
    .await;
    let in_b: Vec<i64> = peers
        .iter()
        .filter(|p| p.cluster.as_deref() == Some("b"))
        .map(|p| p.id)
        .collect();
    assert_eq!(in_b.len(), 2, "{peers:?}");
    let mut moved = 0;
    for _ in 0..4 {
        // One replica: b's two peers hold each other's checkpoints (two
        // would need a third peer, from a, whose memory is full).
        let spec = bsp_api::rest::SubmitJob {
            limits: Some(bsp_api::rest::JobLimits {
                replicas: 1,
                ..Default::default()
            }),
            ..job("ring", 4, serde_json::Value::Null)
        };
        let r = run(&admin, spec).await;
        r.assert_exited();
        assert!(
            r.info.placement.iter().all(|p| in_b.contains(p)),
            "job {} ran on {:?}, not only on b's peers {in_b:?}",
            r.info.id,
            r.info.placement
        );
        let placed: Vec<String> = r
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                bsp_api::rest::JobEventKind::Status { text } if text.starts_with("placed ") => {
                    Some(text.clone())
                }
                _ => None,
            })
            .collect();
        assert_eq!(placed.len(), 1, "{placed:?}");
        assert!(placed[0].contains(" in cluster b"), "{placed:?}");
        if placed[0].contains("the first choice lacked the memory") {
            moved += 1;
        }
    }
    assert_eq!(moved, 2, "jobs 1 and 3 chose a first");
}
