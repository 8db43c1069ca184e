//! Issue 18: the peer data plane is encrypted. What crosses the loopback
//! interface between a job's peers, captured with `tcpdump`, never shows
//! the messages' text in the clear.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::harness::{job, run, shared, until};

/// `tcpdump` writing to `file` every packet to or from `ports` on `lo`,
/// once it says it is listening.
struct Capture {
    child: std::process::Child,
}

impl Capture {
    fn start(file: &std::path::Path, ports: &[u16]) -> Capture {
        let filter = ports
            .iter()
            .map(|p| format!("port {p}"))
            .collect::<Vec<_>>()
            .join(" or ");
        let mut child = Command::new("tcpdump")
            .args(["-i", "lo", "-U", "-s", "0", "-w"])
            .arg(file)
            .arg(format!("tcp and ({filter})"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump runs (apt-get install tcpdump; .ci/run installs it)");
        let stderr = child.stderr.take().expect("piped");
        let mut lines = BufReader::new(stderr).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.contains("listening on") => break,
                Some(Ok(_)) => {}
                other => panic!("tcpdump did not start: {other:?}"),
            }
        }
        // Keep draining its stderr so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Capture { child }
    }

    /// Stop it (SIGINT: it writes out what it holds) and wait.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_between_peers_never_cross_the_wire_in_the_clear() {
    let c = shared();
    let client = c.admin().await;
    // The data-plane ports of the cluster's peers (the supernode's HTTP
    // port stays out: plain HTTP on loopback carries the job's output).
    let ports: Vec<u16> = until(
        "the peers' data-plane addresses",
        Duration::from_secs(30),
        async || {
            let peers = client.peers().await.ok()?;
            let ports: Vec<u16> = peers
                .iter()
                .filter(|p| p.state == "online")
                .filter_map(|p| p.addr.rsplit(':').next()?.parse().ok())
                .collect();
            (ports.len() >= 2).then_some(ports)
        },
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lo.pcap");
    let capture = Capture::start(&file, &ports);

    // `broadcast` without arguments: pid 0 sends "range hello" to every
    // process and "list hello" to the even ones, every process sends
    // "from {pid}" to pids 0 and n - 1; 8 processes span the peers.
    let n = 8u32;
    let r = run(&client, job("broadcast", n, json!(null))).await;
    r.assert_exited();
    assert!(
        r.stdout(n - 1)
            .contains(&format!("pid {} got range hello from 0", n - 1)),
        "{:?}",
        r.stdout(n - 1)
    );
    capture.stop();

    let captured = std::fs::read(&file).unwrap();
    assert!(
        captured.len() > 4096,
        "the capture holds the job's traffic ({} bytes)",
        captured.len()
    );
    for marker in [&b"range hello"[..], b"list hello", b"from 7"] {
        assert!(
            !captured.windows(marker.len()).any(|w| w == marker),
            "{:?} crossed the data plane in the clear",
            String::from_utf8_lossy(marker)
        );
    }
}
