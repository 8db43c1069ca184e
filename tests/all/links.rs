//! Issue 15: peers measure the links between them (round trip and
//! bandwidth), as the supernode asks, within their volunteers' caps, and
//! the supernode shows what they measured.

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
