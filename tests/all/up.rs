//! `bspweb up`, the README's first command, as a user runs it: it serves,
//! and its local peers never outlive it (issue 20, finding 8).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::bspweb;

/// `bspweb up` with two peers on a free port and its own data and config
/// directories, once it says it is up: the child and the URL.
fn up(data: &std::path::Path, config: &std::path::Path) -> (Child, String) {
    let mut child = bspweb()
        .args(["up", "--peers", "2", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .env("BSPWEB_CONFIG_DIR", config)
        .env_remove("BSPWEB_URL")
        .env_remove("BSPWEB_USER")
        .env_remove("BSPWEB_PASSWORD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start bspweb up");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = lines
        .next()
        .expect("bspweb up prints that it is up")
        .unwrap();
    assert!(
        first.starts_with("bspweb is up: supernode at http://")
            && first.ends_with("with 2 of 2 local peers online"),
        "{first}"
    );
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_string();
    // Keep reading what it prints so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, url)
}

/// The processes `pid` started that still run.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = task.unwrap().path().join("children");
        if let Ok(list) = std::fs::read_to_string(path) {
            out.extend(list.split_whitespace().map(|p| p.parse::<u32>().unwrap()));
        }
    }
    out
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Wait (polling, at most `limit`) until every process of `pids` ended.
fn wait_ended(pids: &[u32], limit: Duration) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|p| !ended(*p)).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill(1)");
    assert!(status.success());
}

#[test]
fn up_serves_and_its_peers_stop_with_it_on_sigterm_or_sigkill() {
    let data = tempfile::tempdir().unwrap();
    let config = tempfile::tempdir().unwrap();

    // SIGTERM, as a service manager stops it: up ends, and so do its peers.
    let (mut child, url) = up(data.path(), config.path());
    assert_eq!(get_status(&format!("{url}/api/v1/health")), 200);
    // It registered the examples, the C ones too (compiled with `bspweb cc`
    // into the data directory), and logged the CLI in.
    let listed = bspweb()
        .arg("programs")
        .env("BSPWEB_CONFIG_DIR", config.path())
        .env_remove("BSPWEB_URL")
        .output()
        .expect("run bspweb programs");
    let listed = String::from_utf8_lossy(&listed.stdout);
    for name in [
        "ring",
        "pagerank",
        "c-inner-product",
        "c-prefix-sum",
        "c-pagerank",
    ] {
        assert!(
            listed.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} is not among the programs bspweb up registered:\n{listed}"
        );
    }
    let peers = children(child.id());
    assert_eq!(peers.len(), 2, "two local peers: {peers:?}");
    // The peers share half the machine's memory as their budgets: each
    // taking half would let them run the machine out together.
    let half_mib = bspweb_peer::budget::default_limit() >> 20;
    assert!(half_mib > 0, "/proc/meminfo gives the machine's memory");
    let share = format!("of a {} MiB budget", half_mib / 2);
    for i in 0..2 {
        let status = bspweb()
            .args(["peer", "status", "--socket"])
            .arg(data.path().join(format!("peer-local-{i}.sock")))
            .output()
            .expect("run bspweb peer status");
        let status = String::from_utf8_lossy(&status.stdout);
        assert!(status.contains(&share), "peer {i}: {status}");
    }
    signal(child.id(), "-TERM");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(
        wait_ended(&peers, Duration::from_secs(30)),
        Vec::<u32>::new()
    );

    // SIGKILL, which up cannot catch: its peers see their stdin close.
    let (mut child, _) = up(data.path(), config.path());
    let peers = children(child.id());
    assert_eq!(peers.len(), 2, "two local peers: {peers:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        wait_ended(&peers, Duration::from_secs(30)),
        Vec::<u32>::new(),
        "the peers of a killed bspweb up still run"
    );
}

/// The status of a GET, from a plain TCP request.
fn get_status(url: &str) -> u16 {
    use std::io::{Read, Write};
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(
        s,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}
