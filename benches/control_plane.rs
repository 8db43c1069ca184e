//! The control plane under load (issue 14): simulated peers log in and then
//! renew their leases over HTTP on loopback as fast as `--workers`
//! concurrent requests allow, for `--secs` seconds, against one SQLite
//! supernode and against one, two and three supernodes sharing one
//! PostgreSQL database (a throw-away server this benchmark starts). Prints
//! renewals per second and their latency (median, p99) for each, side by
//! side, and how many peers that rate serves at the default renewal
//! interval (a third of the 15 s lease).
//!
//! Every supernode is a `bspweb supernode` process; the simulated peers run
//! in this process, spread over the supernodes round robin (a peer renews
//! at any supernode of a shared database). Bounded: `--peers` peers,
//! `--secs` seconds per setup, loopback only.
//!
//! Run: `cargo bench --bench control_plane` (about two minutes),
//! `-- --peers N --workers N --secs N --only sqlite|postgres`.

#[path = "../tests/all/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "../supernode/tests/support/throwaway_pg.rs"]
mod throwaway_pg;

#[path = "common/args.rs"]
mod args;
use args::flag_value;

use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bsp_api::control::{EnrollmentToken, Lease, PeerLogin, PeerRenew};

/// The default lease: peers renew every third of it.
const DEFAULT_TTL_SECS: f64 = 15.0;

/// The network issue 14 sizes the control plane for.
const GOAL_PEERS: f64 = 100_000.0;

/// One setup's supernodes: their processes (killed on drop) and URLs.
struct Setup {
    children: Vec<Child>,
    urls: Vec<String>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `n` supernodes: on SQLite (`database` `None`, `n` must be 1) or on one
/// database of the throw-away PostgreSQL server.
fn start(n: usize, database: Option<String>) -> Setup {
    let opts = harness::Options {
        // Long leases: a peer renews only when its turn comes.
        lease_ttl_secs: 3600,
        supernode_args: [
            "--max-connections",
            "4096",
            "--max-connections-per-address",
            "4096",
            "--no-examples",
        ]
        .map(String::from)
        .to_vec(),
        ..Default::default()
    };
    let mut setup = Setup {
        children: vec![],
        urls: vec![],
        _dirs: vec![],
    };
    for _ in 0..n {
        let dir = tempfile::tempdir().expect("temp dir");
        if let Some(url) = &database {
            std::fs::write(dir.path().join("test-database-url"), url).expect("write");
        }
        let (child, url, _) =
            harness::spawn_supernode("127.0.0.1:0", dir.path(), &opts).expect("a supernode");
        setup.children.push(child);
        setup.urls.push(url);
        setup._dirs.push(dir);
    }
    setup
}

/// What one setup measured.
struct Measured {
    renewals: usize,
    secs: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
    /// CPU seconds the supernodes, the database server and the load
    /// generator (this process) used while renewing.
    cpu_supernodes: f64,
    cpu_database: f64,
    cpu_load: f64,
    /// Plain renewals and their batches, summed over the supernodes
    /// (`/metrics`).
    plain: f64,
    batches: f64,
}

/// The value of counter `name` in the `/metrics` text of `url`.
async fn counter(http: &reqwest::Client, url: &str, name: &str) -> f64 {
    let text = match http.get(format!("{url}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// CPU time (user + system) the processes `pids` have used so far, in
/// seconds (`/proc/PID/stat`; a process that is gone counts 0).
fn cpu_secs(pids: &[u32]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // Fields after the command (which may hold spaces) in parens.
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split(' ').collect();
            // utime and stime are fields 14 and 15 of the line, 12 and 13
            // after the state.
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .sum::<f64>()
        / hz
}

/// The throw-away PostgreSQL server's processes: the postmaster and its
/// children (one backend per connection).
fn postgres_pids(server: &throwaway_pg::Server) -> Vec<u32> {
    let Some(master) = std::fs::read_to_string(server.dir().join("data/postmaster.pid"))
        .ok()
        .and_then(|s| s.lines().next()?.trim().parse::<u32>().ok())
    else {
        return vec![];
    };
    let mut pids = vec![master];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s[s.rfind(')')? + 2..]
                    .split(' ')
                    .nth(1)?
                    .parse::<u32>()
                    .ok()
            });
        if parent == Some(master) {
            pids.push(pid);
        }
    }
    pids
}

async fn measure(
    setup: &Setup,
    pg: Option<&throwaway_pg::Server>,
    peers: usize,
    workers: usize,
    secs: u64,
) -> Measured {
    let token = EnrollmentToken(harness::enroll(&setup.urls[0], "load"));
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(workers)
        .build()
        .expect("http client");
    // Log in at the first supernode; renew round robin over all.
    let mut leases: Vec<(String, String)> = Vec::with_capacity(peers);
    for i in 0..peers {
        let login = PeerLogin {
            name: format!("sim-{i}"),
            addr: "127.0.0.1:9".into(),
            speed: 1.0,
            idle: 1.0,
            cores: 1,
            version: bsp_api::API_VERSION,
            previous_id: None,
            cluster: None,
            token: Some(token.clone()),
        };
        let lease: Lease = http
            .post(format!("{}/api/v1/peer/login", setup.urls[0]))
            .json(&login)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .expect("login")
            .json()
            .await
            .expect("a lease");
        let url = &setup.urls[i % setup.urls.len()];
        leases.push((format!("{url}/api/v1/peer/renew"), lease.token));
    }
    let leases = Arc::new(leases);
    let next = Arc::new(AtomicUsize::new(0));
    let supernodes: Vec<u32> = setup.children.iter().map(Child::id).collect();
    let database = pg.map(postgres_pids).unwrap_or_default();
    let me = [std::process::id()];
    let cpu_before = (cpu_secs(&supernodes), cpu_secs(&database), cpu_secs(&me));
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (http, leases, next) = (http.clone(), leases.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0;
            let body = PeerRenew::idle(1.0);
            while Instant::now() < end {
                let (url, token) = &leases[next.fetch_add(1, Ordering::Relaxed) % leases.len()];
                let t = Instant::now();
                let ok = http
                    .post(url)
                    .bearer_auth(token)
                    .json(&body)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if ok {
                    latencies.push(t.elapsed());
                } else {
                    errors += 1;
                }
            }
            (latencies, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.expect("a worker");
        all.extend(l);
        errors += e;
    }
    let secs = start.elapsed().as_secs_f64();
    let (cpu_supernodes, cpu_database, cpu_load) = (
        cpu_secs(&supernodes) - cpu_before.0,
        cpu_secs(&database) - cpu_before.1,
        cpu_secs(&me) - cpu_before.2,
    );
    let (mut plain, mut batches) = (0.0, 0.0);
    for url in &setup.urls {
        plain += counter(&http, url, "bspweb_plain_renewals_total").await;
        batches += counter(&http, url, "bspweb_renewal_batches_total").await;
    }
    all.sort_unstable();
    let at = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    };
    Measured {
        renewals: all.len(),
        secs,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        errors,
        cpu_supernodes,
        cpu_database,
        cpu_load,
        plain,
        batches,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let peers = flag_value(&args, "--peers").unwrap_or(2000) as usize;
    let workers = flag_value(&args, "--workers").unwrap_or(64) as usize;
    let secs = u64::from(flag_value(&args, "--secs").unwrap_or(10));
    bsp_api::client::tls::install_default_provider();
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    println!(
        "control plane: {peers} simulated peers, {workers} concurrent renewals, {secs} s per setup"
    );
    println!(
        "{:<28} {:>12} {:>10} {:>10} {:>8} {:>16}",
        "setup", "renewals/s", "p50 (ms)", "p99 (ms)", "errors", "peers served*"
    );
    let setups: [(&str, usize, bool); 4] = [
        ("1 supernode, SQLite", 1, false),
        ("1 supernode, PostgreSQL", 1, true),
        ("2 supernodes, PostgreSQL", 2, true),
        ("3 supernodes, PostgreSQL", 3, true),
    ];
    // `--only sqlite` or `--only postgres`: those setups alone.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    let mut sqlite_rate = f64::NAN;
    let mut costs = Vec::new();
    for (name, n, pg) in setups {
        if only.is_some_and(|o| (o == "postgres") != pg) {
            continue;
        }
        let server = pg.then(throwaway_pg::server);
        let setup = start(n, server.map(|s| s.create_database()));
        let m = rt.block_on(measure(&setup, server, peers, workers, secs));
        drop(setup);
        let rate = m.renewals as f64 / m.secs;
        if !pg {
            sqlite_rate = rate;
        }
        // Beside SQLite's rate, when measured in this run.
        let ratio = if sqlite_rate.is_nan() {
            String::new()
        } else {
            format!("   ({:.2}× SQLite)", rate / sqlite_rate)
        };
        println!(
            "{:<28} {:>12.0} {:>10.1} {:>10.1} {:>8} {:>16.0}{ratio}",
            name,
            rate,
            m.p50_ms,
            m.p99_ms,
            m.errors,
            rate * DEFAULT_TTL_SECS / 3.0,
        );
        costs.push((name, m));
    }
    // What a renewal costs in CPU, so what 10⁵ peers need on any machine.
    let goal = GOAL_PEERS / (DEFAULT_TTL_SECS / 3.0);
    println!();
    println!(
        "CPU per renewal (µs) and cores for {GOAL_PEERS:.0} peers ({goal:.0} renewals/s) at that cost:"
    );
    println!(
        "{:<28} {:>12} {:>12} {:>12} {:>16} {:>16} {:>12}",
        "setup",
        "supernodes",
        "database",
        "load gen.",
        "supernode cores",
        "database cores",
        "batch size"
    );
    for (name, m) in &costs {
        let per = |cpu: f64| cpu / m.renewals.max(1) as f64 * 1e6;
        let (sn, db) = (per(m.cpu_supernodes), per(m.cpu_database));
        // Plain renewals per batch (none with SQLite, which needs no
        // batches).
        let batch = if m.batches > 0.0 {
            format!("{:.1}", m.plain / m.batches)
        } else {
            "-".into()
        };
        println!(
            "{:<28} {:>12.1} {:>12.1} {:>12.1} {:>16.2} {:>16.2} {:>12}",
            name,
            sn,
            db,
            per(m.cpu_load),
            goal * sn / 1e6,
            goal * db / 1e6,
            batch
        );
    }
    println!(
        "* peers whose renewals that rate takes at the default interval ({} s): rate × {}",
        DEFAULT_TTL_SECS / 3.0,
        DEFAULT_TTL_SECS / 3.0
    );
}
