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

/// Everything on `lo` of a TLS supernode and its peers while a volunteer
/// enrolls a peer, a user logs in and runs a job: no password, enrollment
/// token, login token, program bytes or message text in the clear (issue
/// 18's capture test; with `tls: false` it finds the password).
#[tokio::test(flavor = "multi_thread")]
async fn nothing_secret_crosses_loopback_in_the_clear_with_tls() {
    use crate::harness::{ADMIN, ADMIN_PASSWORD, Cluster, Options};
    let mut c = Cluster::start(Options {
        peers: 2,
        tls: true,
        ..Options::default()
    });
    let supernode_port: u16 = c.url.rsplit(':').next().unwrap().parse().unwrap();
    let admin = c.admin().await;
    let mut ports: Vec<u16> = admin
        .peers()
        .await
        .unwrap()
        .iter()
        .filter_map(|p| p.addr.rsplit(':').next()?.parse().ok())
        .collect();
    ports.push(supernode_port);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lo.pcap");
    // The supernode's port and the peers' data ports; a third peer's data
    // port is new, but its login and downloads go to the supernode's.
    let capture = Capture::start(&file, &ports);

    // A login with the password, a new enrollment token, a peer logging in
    // with it.
    let client = crate::harness::client_options(&c.url)
        .login(&c.url, ADMIN, ADMIN_PASSWORD)
        .await
        .unwrap();
    let enrollment = client.create_enrollment("captured").await.unwrap();
    c.add_peer("third", &["--token".into(), enrollment.token.0.clone()]);
    until(
        "the third peer online",
        Duration::from_secs(60),
        async || {
            let peers = client.peers().await.ok()?;
            peers
                .iter()
                .any(|p| p.name == "third" && p.state == "online")
                .then_some(())
        },
    )
    .await;
    let n = 6u32;
    let r = run(&client, job("broadcast", n, json!(null))).await;
    r.assert_exited();
    capture.stop();

    let captured = std::fs::read(&file).unwrap();
    assert!(captured.len() > 4096, "{} bytes captured", captured.len());
    let wasm = bspweb_programs::get("broadcast").unwrap().wasm;
    let program = &wasm[wasm.len() / 2..wasm.len() / 2 + 48];
    let output = format!("pid {} got range hello", n - 1);
    let secrets: [(&str, &[u8]); 7] = [
        ("the password", ADMIN_PASSWORD.as_bytes()),
        ("the enrollment token", enrollment.token.0.as_bytes()),
        ("the cluster's enrollment token", c.peer_token.as_bytes()),
        ("the login token", client.token().as_bytes()),
        ("program bytes", program),
        ("a message", b"range hello"),
        ("output", output.as_bytes()),
    ];
    for (what, secret) in secrets {
        assert!(
            !captured.windows(secret.len()).any(|w| w == secret),
            "{what} crossed loopback in the clear"
        );
    }
}
