//! Start real supernodes and peers (the `bspweb` binary) on loopback, and
//! break them on purpose: SIGKILL or SIGTERM a peer, add one mid-job, SIGKILL
//! the supernode and restart it on the same address and data directory, lower
//! a peer's reported availability through its idle file.
//!
//! Every child is started with `--exit-on-stdin-eof` and a piped stdin, so it
//! ends when the test process ends, whatever way that happens.

use crate::throwaway_pg;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use bsp_api::PeerId;
use bsp_api::client::{Client, ClientOptions};
use bsp_api::rest::{JobEvent, JobEventKind, JobInfo, SubmitJob};

pub const ADMIN: &str = "admin";
pub const ADMIN_PASSWORD: &str = "correct horse battery staple";

/// The `bspweb` binary the children run: this build's, or `BSPWEB_BIN`
/// (a benchmark compares two builds with it).
pub fn bspweb() -> Command {
    let mut cmd = match std::env::var_os("BSPWEB_BIN") {
        Some(bin) => Command::new(bin),
        None => Command::new(env!("CARGO_BIN_EXE_bspweb")),
    };
    // Compiled C examples: one cache for every supernode the tests start
    // (each would otherwise compile them into its fresh data directory,
    // seconds of clang and wasm-opt), and none in the user's home.
    cmd.env(
        "BSPWEB_CACHE_DIR",
        concat!(env!("CARGO_TARGET_TMPDIR"), "/bspweb-cache"),
    );
    cmd
}

/// Assert that a finished command succeeded, showing its stderr if not.
#[track_caller]
pub fn assert_success(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `cmd` without the client's settings from the environment
/// (`BSPWEB_URL`, `BSPWEB_USER`, `BSPWEB_PASSWORD`,
/// `BSPWEB_SUPERNODE_FINGERPRINT`), so a test's flags and config
/// directory are all it reads.
pub fn without_client_env(cmd: &mut Command) -> &mut Command {
    cmd.env_remove("BSPWEB_PASSWORD")
        .env_remove("BSPWEB_URL")
        .env_remove("BSPWEB_USER")
        .env_remove("BSPWEB_SUPERNODE_FINGERPRINT")
}

/// The children's log filter: `BSPWEB_TEST_LOG`, else `info` when logs go
/// to files (kept for a failed fault test), `warn` when they go to the
/// test's stderr.
fn log_filter(to_files: bool) -> String {
    std::env::var("BSPWEB_TEST_LOG")
        .unwrap_or_else(|_| if to_files { "info" } else { "warn" }.to_string())
}

/// One peer process of a [`Cluster`].
pub struct Peer {
    /// Its `--name`, unique in the cluster.
    pub name: String,
    child: Child,
    /// The file it reads its idle fraction from, when started with one.
    idle_file: Option<PathBuf>,
    /// The test stopped it on purpose (killed, or waited for its exit).
    stopped: bool,
}

/// A supernode and its peers, each a separate OS process.
pub struct Cluster {
    pub url: String,
    /// With [`Options::tls`]: the supernode's certificate fingerprint, which
    /// its peers and [`client_options`] pin.
    pub fingerprint: Option<String>,
    /// The enrollment token its peers log in with (the administrator's).
    pub peer_token: String,
    /// `host:port` the supernode listens on; a restart binds it again.
    listen: String,
    supernode: Child,
    /// With [`Options::supernodes`] > 1: the others, and their URLs
    /// (`None` once killed).
    others: Vec<(Option<Child>, String)>,
    pub peers: Vec<Peer>,
    opts: Options,
    data_path: PathBuf,
    data: Option<tempfile::TempDir>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in self.peers.iter_mut() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        let _ = self.supernode.kill();
        let _ = self.supernode.wait();
        for (child, _) in self.others.iter_mut() {
            if let Some(mut c) = child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

#[derive(Clone)]
pub struct Options {
    pub peers: usize,
    pub lease_ttl_secs: u64,
    pub peer_args: Vec<String>,
    /// Extra arguments of `bspweb supernode` (also when it restarts).
    pub supernode_args: Vec<String>,
    /// The supernode's `--data` directory, when not the cluster's own.
    pub supernode_data: Option<PathBuf>,
    /// Start every peer with `--idle-file`, reporting an idle fraction of 1
    /// until [`Cluster::set_idle`] changes it (the default: no availability
    /// noise from the machine the tests run on, whose cores the tests keep
    /// busy; `false` measures `/proc/stat`).
    pub idle_files: bool,
    /// Write each child's log to a file in the data directory (see
    /// [`Cluster::keep_logs`]) instead of the test's stderr.
    pub log_files: bool,
    /// Serve HTTPS (`--tls`: a self-signed certificate) and pin it in the
    /// peers and the harness's clients.
    pub tls: bool,
    /// Run this many supernodes on one fresh database of the throw-away
    /// PostgreSQL server (issue 14); the peers know them all. 1: one
    /// supernode, on whatever `BSPWEB_TEST_DATABASE` says.
    pub supernodes: usize,
    /// Keep the supernode on SQLite even with
    /// `BSPWEB_TEST_DATABASE=postgres`: the test is about SQLite's own
    /// file (its disk filling up, say).
    pub sqlite: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            peers: 3,
            lease_ttl_secs: 15,
            peer_args: vec![],
            supernode_args: vec![],
            supernode_data: None,
            idle_files: true,
            log_files: false,
            tls: false,
            supernodes: 1,
            sqlite: false,
        }
    }
}

impl Cluster {
    pub fn start(opts: Options) -> Cluster {
        let data = tempfile::tempdir().expect("temp dir");
        let data_path = data.path().to_path_buf();
        let shared = (opts.supernodes > 1).then(|| throwaway_pg::server().create_database());
        if let Some(db) = &shared {
            std::fs::write(data_path.join("test-database-url"), db).expect("write");
        }
        let (supernode, url, fingerprint) =
            spawn_supernode("127.0.0.1:0", &data_path, &opts).expect("start the supernode");
        let mut others = Vec::new();
        for i in 1..opts.supernodes.max(1) {
            let dir = data_path.join(format!("supernode-{i}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            if let Some(db) = &shared {
                std::fs::write(dir.join("test-database-url"), db).expect("write");
            }
            let (child, url, _) = spawn_supernode("127.0.0.1:0", &dir, &opts)
                .unwrap_or_else(|e| panic!("start supernode {i}: {e}"));
            others.push((Some(child), url));
        }
        let listen = url
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .to_string();
        let peer_token = enroll(&url, "test peers");
        let mut cluster = Cluster {
            url,
            fingerprint,
            peer_token,
            listen,
            supernode,
            others,
            peers: vec![],
            opts: opts.clone(),
            data_path,
            data: Some(data),
        };
        for i in 0..opts.peers {
            cluster.add_peer(&format!("test-peer-{i}"), &opts.peer_args);
        }
        cluster.wait_for_peers(opts.peers);
        cluster
    }

    /// Start one more peer (also while jobs run); returns its index in
    /// [`Cluster::peers`].
    pub fn add_peer(&mut self, name: &str, extra: &[String]) -> usize {
        self.add_peer_with_env(name, extra, &[])
    }

    /// [`Cluster::add_peer`] with more environment variables (a test-only
    /// fault, say).
    pub fn add_peer_with_env(
        &mut self,
        name: &str,
        extra: &[String],
        env: &[(&str, &str)],
    ) -> usize {
        // `flag value` unless the test passes `flag` itself.
        let default = |flag: &'static str, value: &'static str| {
            (!extra.iter().any(|a| a == flag))
                .then_some([flag, value])
                .into_iter()
                .flatten()
        };
        let mut cmd = bspweb();
        cmd.envs(env.iter().copied());
        cmd.args([
            "peer",
            "--supernode",
            &self.urls(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--name", name, "--slots", "2"])
        // Not niced (the machine is the tests'), speed 1, unless the test
        // says otherwise.
        .args(default("--nice", "0"))
        .args(default("--speed", "1.0"))
        // Each peer its own compile cache, as on its own machine; a peer
        // started again with the same name finds its programs there.
        .args(
            (!extra.iter().any(|a| a == "--compile-cache"))
                .then(|| {
                    [
                        "--compile-cache".into(),
                        self.compile_cache(name).into_os_string(),
                    ]
                })
                .into_iter()
                .flatten(),
        )
        .arg("--exit-on-stdin-eof")
        .arg("--control-socket")
        .arg(self.control_socket(name))
        // No peer.toml of the machine's user is read.
        .env("BSPWEB_CONFIG_DIR", &self.data_path)
        .env("BSPWEB_PEER_TOKEN", &self.peer_token)
        .args(
            self.fingerprint
                .iter()
                .flat_map(|f| ["--supernode-fingerprint", f.as_str()]),
        )
        .args(extra)
        .env("BSPWEB_LOG", log_filter(self.opts.log_files))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(self.log_sink(&format!("peer-{name}.log")));
        let idle_file = self.opts.idle_files.then(|| {
            let path = self.data_path.join(format!("idle-{name}"));
            write_atomically(&path, "1.0");
            cmd.arg("--idle-file").arg(&path);
            path
        });
        let child = cmd.spawn().expect("start a peer");
        self.peers.push(Peer {
            name: name.to_string(),
            child,
            idle_file,
            stopped: false,
        });
        self.peers.len() - 1
    }

    fn log_sink(&self, file: &str) -> Stdio {
        log_sink(&self.data_path, file, self.opts.log_files)
    }

    /// The compile cache of the peer named `name`.
    pub fn compile_cache(&self, name: &str) -> PathBuf {
        self.data_path.join(format!("compiled-{name}"))
    }

    /// The control socket of the peer named `name` (`bspweb peer status
    /// --socket …`).
    pub fn control_socket(&self, name: &str) -> PathBuf {
        self.data_path.join(format!("peer-{name}.sock"))
    }

    /// The data directory: the database and, with `log_files`, the logs.
    pub fn data_dir(&self) -> &Path {
        &self.data_path
    }

    /// The peers' lease TTL the supernode was started with.
    pub fn lease_ttl_secs(&self) -> u64 {
        self.opts.lease_ttl_secs
    }

    /// Keep the data directory (database and, with `log_files`, every
    /// child's log) after the cluster is dropped; returns its path.
    pub fn keep_logs(&mut self) -> PathBuf {
        if let Some(d) = self.data.take() {
            let _ = d.keep();
        }
        self.data_path.clone()
    }

    /// The index of the peer the supernode knows as `id`.
    pub async fn peer_index(&self, client: &Client, id: PeerId) -> Option<usize> {
        let infos = client.peers().await.ok()?;
        let name = &infos.iter().find(|p| p.id == id)?.name;
        self.peers.iter().position(|p| &p.name == name)
    }

    /// Resident memory of the peer process at `index` in bytes (`VmRSS`),
    /// `None` once it is gone.
    pub fn peer_rss(&self, index: usize) -> Option<u64> {
        let pid = self.peers[index].child.id();
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    }

    /// SIGKILL the peer at `index` (no goodbye, like a machine switched off)
    /// and reap it.
    pub fn kill_peer(&mut self, index: usize) {
        let peer = &mut self.peers[index];
        peer.stopped = true;
        // `Child::kill` sends SIGKILL on unix.
        peer.child.kill().expect("SIGKILL a peer");
        peer.child.wait().expect("reap a killed peer");
    }

    /// Send SIGTERM to the peer at `index` (it drains, then exits).
    pub fn terminate_peer(&self, index: usize) {
        let pid = self.peers[index].child.id();
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill(1) to send SIGTERM");
        assert!(status.success(), "kill -TERM {pid} failed: {status}");
    }

    /// Send SIGTERM to the peer at `index` and wait (at most a minute) for
    /// it to drain and exit.
    pub fn stop_peer(&mut self, index: usize) -> std::process::ExitStatus {
        self.terminate_peer(index);
        let peer = &mut self.peers[index];
        peer.stopped = true;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = peer.child.try_wait().expect("wait for a peer") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "peer {} did not exit within a minute of SIGTERM",
                peer.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The OS process id of the peer at `index`.
    pub fn peer_pid(&self, index: usize) -> u32 {
        self.peers[index].child.id()
    }

    /// CPU time (user and system, all threads) the cluster's processes —
    /// supernodes and peers still running — have used so far, in seconds
    /// (Linux `/proc/PID/stat`, in clock ticks; 0 elsewhere).
    #[allow(dead_code)] // the benchmarks' (`benches/`), which include this file
    pub fn cpu_seconds(&self) -> f64 {
        let pids = std::iter::once(self.supernode.id())
            .chain(
                self.others
                    .iter()
                    .filter_map(|(c, _)| c.as_ref().map(Child::id)),
            )
            .chain(
                self.peers
                    .iter()
                    .filter(|p| !p.stopped)
                    .map(|p| p.child.id()),
            );
        // SAFETY: sysconf only reads its integer argument.
        let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let tick = if tick > 0 { tick as f64 } else { 100.0 };
        pids.filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The fields after the command name (which may hold spaces):
            // state is the first, utime and stime the 12th and 13th.
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) as f64 / tick)
        })
        .sum()
    }

    /// Wait (polling, at most `limit`) for the peer at `index` to exit.
    pub async fn wait_peer_exit(&mut self, index: usize, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            let peer = &mut self.peers[index];
            if let Some(status) = peer.child.try_wait().expect("poll a peer") {
                peer.stopped = true;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Set the idle fraction the peer at `index` reports at its next
    /// renewals (the cluster must have been started with `idle_files`).
    pub fn set_idle(&self, index: usize, idle: f64) {
        let path = self.peers[index]
            .idle_file
            .as_ref()
            .expect("the cluster was started with idle files");
        write_atomically(path, &format!("{idle}"));
    }

    /// Every supernode's URL, separated by commas (the first is
    /// [`Cluster::url`]), as peers and clients take them.
    pub fn urls(&self) -> String {
        std::iter::once(self.url.as_str())
            .chain(self.others.iter().map(|(_, u)| u.as_str()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// SIGKILL supernode `i` of [`Options::supernodes`] (0 is
    /// [`Cluster::url`]'s) and reap it.
    pub fn kill_supernode_at(&mut self, i: usize) {
        if i == 0 {
            return self.kill_supernode();
        }
        if let Some(mut child) = self.others[i - 1].0.take() {
            child.kill().expect("SIGKILL a supernode");
            child.wait().expect("reap it");
        }
    }

    /// SIGKILL the supernode and reap it.
    pub fn kill_supernode(&mut self) {
        self.supernode.kill().expect("SIGKILL the supernode");
        self.supernode.wait().expect("reap the supernode");
    }

    /// Start the supernode again on the same address and data directory
    /// (after [`Cluster::kill_supernode`]); retries while the address is
    /// not free yet, for at most 30 s.
    pub fn restart_supernode(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match spawn_supernode(&self.listen, &self.data_path, &self.opts) {
                Ok((child, url, _)) => {
                    assert_eq!(url, self.url, "the restarted supernode moved");
                    self.supernode = child;
                    return;
                }
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "the supernode did not restart on {}: {e}",
                        self.listen
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Wait until `n` peers are online (at most 60 s); fails at once if a
    /// peer process exits.
    pub fn wait_for_peers(&mut self, n: usize) {
        let logs = self.opts.log_files.then_some(self.data_path.as_path());
        let (url, peers) = (&self.url, &mut self.peers);
        // On a thread of its own: callers may be inside a tokio runtime.
        std::thread::scope(|s| {
            s.spawn(|| wait_for_peers_blocking(url, peers, n, logs))
                .join()
                .expect("waiting for peers");
        });
    }

    pub async fn admin(&self) -> Client {
        client_options(&self.url)
            .login(&self.url, ADMIN, ADMIN_PASSWORD)
            .await
            .expect("admin login")
    }

    /// A peer of the volunteer `user` (an account of that name, created
    /// unless it exists, which enrolls the peer), started with `env` set;
    /// returns its index. Peers of different volunteers are what
    /// redundancy needs.
    pub async fn add_volunteer_peer(
        &mut self,
        user: &str,
        peer: &str,
        env: &[(&str, &str)],
    ) -> usize {
        let admin = self.admin().await;
        let exists = admin
            .users()
            .await
            .is_ok_and(|users| users.iter().any(|u| u.name == user));
        let client = if exists {
            client_options(&self.url)
                .login(&self.url, user, &format!("pw-of-{user}"))
                .await
                .unwrap()
        } else {
            self.user(user).await
        };
        let token = client
            .create_enrollment(peer)
            .await
            .unwrap_or_else(|e| panic!("{user} enrolls {peer}: {e}"));
        self.add_peer_with_env(peer, &["--token".into(), token.token.0.clone()], env)
    }

    /// Create a user and log in as it.
    pub async fn user(&self, name: &str) -> Client {
        let admin = self.admin().await;
        admin
            .create_user(&bsp_api::rest::CreateUserRequest {
                name: name.to_string(),
                password: format!("pw-of-{name}"),
                role: None,
                admin: false,
                quotas: Default::default(),
            })
            .await
            .unwrap_or_else(|e| panic!("create user {name}: {e}"));
        client_options(&self.url)
            .login(&self.url, name, &format!("pw-of-{name}"))
            .await
            .unwrap()
    }
}

/// Polls `check` every 50 ms until it gives a value; panics after `limit`
/// naming `what`.
pub async fn until<T>(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One cluster shared by the tests that only run well-behaved jobs. It
/// logs to files: it outlives the tests (a static is never dropped), and
/// what its peers say when its supernode goes at exit would otherwise
/// follow the test binary's summary of failures.
pub fn shared() -> &'static Cluster {
    static SHARED: OnceLock<Cluster> = OnceLock::new();
    SHARED.get_or_init(|| {
        Cluster::start(Options {
            log_files: true,
            ..Options::default()
        })
    })
}

pub fn job(program: &str, nprocs: u32, args: serde_json::Value) -> SubmitJob {
    SubmitJob {
        program: program.to_string(),
        nprocs,
        args,
        description: Some(format!("test {program}")),
        resources: Default::default(),
        seed: Some(42),
        limits: None,
        min_peers: None,
    }
}

/// Runs `program` once with two processes per peer of a cluster of
/// `peers`, so that every peer has downloaded and compiled it before a
/// benchmark measures anything: a peer compiles a program the first time
/// it hosts a process or a replica of one, for 100–400 ms on the cores the
/// measured job runs on.
#[allow(dead_code)] // the benchmarks' (`benches/`), which include this file
pub async fn warm_up(client: &Client, peers: usize, program: &str, args: serde_json::Value) {
    let r = run(client, job(program, 2 * peers as u32, args)).await;
    r.assert_exited();
}

/// The stdout lines of `pid` among `events`, in order.
pub fn stdout_of(events: &[JobEvent], pid: u32) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.pid == Some(pid))
        .filter_map(|e| match &e.kind {
            JobEventKind::Stdout { text } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// Everything a job printed, and how it ended.
#[derive(Debug)]
pub struct Run {
    pub info: JobInfo,
    pub events: Vec<JobEvent>,
}

impl Run {
    /// Stdout lines of one pid, in order.
    pub fn stdout(&self, pid: u32) -> Vec<String> {
        stdout_of(&self.events, pid)
    }

    /// Raw records of one pid, decoded.
    pub fn raw(&self, pid: u32) -> Vec<Vec<u8>> {
        use base64::Engine;
        self.events
            .iter()
            .filter(|e| e.pid == Some(pid))
            .filter_map(|e| match &e.kind {
                JobEventKind::Raw { data } => Some(
                    base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .unwrap(),
                ),
                _ => None,
            })
            .collect()
    }

    pub fn terminal(&self) -> &JobEventKind {
        &self.events.last().expect("events").kind
    }

    #[track_caller]
    pub fn assert_exited(&self) {
        assert_eq!(
            self.terminal(),
            &JobEventKind::JobExited,
            "job {} did not exit normally: {:?}",
            self.info.id,
            self.info.error
        );
    }

    /// The reason of an abort or failure.
    pub fn failure(&self) -> String {
        match self.terminal() {
            JobEventKind::JobAborted { reason } => format!("aborted: {reason}"),
            JobEventKind::JobFailed { reason } => format!("failed: {reason}"),
            other => format!("{other:?}"),
        }
    }
}

/// Submit a job and collect its events until it ends (with a deadline).
pub async fn run(client: &Client, spec: SubmitJob) -> Run {
    let info = client.submit(&spec).await.expect("submit");
    collect(client, info.id).await
}

pub async fn collect(client: &Client, id: i64) -> Run {
    let mut stream = client.events(id, None);
    let mut events = vec![];
    let deadline = Duration::from_secs(180);
    let result = tokio::time::timeout(deadline, async {
        while let Some(e) = stream.next().await.expect("event stream") {
            events.push(e);
        }
    })
    .await;
    assert!(
        result.is_ok(),
        "job {id} did not end within {deadline:?}; {} events so far, the last ones: {:?}",
        events.len(),
        &events[events.len().saturating_sub(20)..]
    );
    let info = client.job(id).await.expect("job info");
    Run { info, events }
}

#[allow(dead_code)]
pub fn target_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target")
}

/// Where a child's stderr goes: a file in `dir` (appending, so a restarted
/// supernode keeps its earlier log) or the test's stderr.
fn log_sink(dir: &Path, file: &str, to_file: bool) -> Stdio {
    if !to_file {
        return Stdio::inherit();
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(file))
        .expect("create a log file");
    Stdio::from(f)
}

/// The certificate fingerprints of the TLS supernodes started here, by URL.
static PINS: Mutex<Vec<(String, bsp_api::tls::Fingerprint)>> = Mutex::new(Vec::new());

/// How the harness's clients reach the supernode at `url`: pinning its
/// certificate if it serves HTTPS.
pub fn client_options(url: &str) -> ClientOptions {
    let pins = PINS.lock().unwrap_or_else(|p| p.into_inner());
    match pins.iter().find(|(u, _)| u == url) {
        Some((_, fp)) => ClientOptions::new().fingerprint(*fp),
        None => ClientOptions::new(),
    }
}

/// Start a supernode listening on `listen` with its state in `data`;
/// returns it, the URL it printed and, with TLS, its certificate's
/// fingerprint, or why it did not start.
pub fn spawn_supernode(
    listen: &str,
    data: &Path,
    opts: &Options,
) -> Result<(Child, String, Option<String>), String> {
    // The tests' own plain `reqwest` clients need a process-wide rustls
    // provider (bspweb's clients pass theirs).
    bsp_api::client::tls::install_default_provider();
    let data_dir = opts.supernode_data.as_deref().unwrap_or(data);
    let database = if opts.sqlite {
        None
    } else {
        throwaway_pg::database_of(data_dir)
    };
    let mut supernode = bspweb()
        .args(["supernode", "--listen", listen, "--exit-on-stdin-eof"])
        .args(opts.tls.then_some("--tls"))
        .arg("--data")
        .arg(data_dir)
        .args(database.iter().flat_map(|url| ["--database", url]))
        .args(["--lease-ttl-secs", &opts.lease_ttl_secs.to_string()])
        .args(&opts.supernode_args)
        .env("BSPWEB_USER", ADMIN)
        .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
        .env("BSPWEB_LOG", log_filter(opts.log_files))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_sink(data, "supernode.log", opts.log_files))
        .spawn()
        .map_err(|e| format!("cannot run bspweb: {e}"))?;
    let stdout = supernode.stdout.take().expect("stdout");
    match read_start(stdout) {
        Ok((url, fingerprint)) => Ok((supernode, url, fingerprint)),
        Err(printed) => {
            let status = supernode.wait().ok();
            Err(format!("{printed} and exited with {status:?}"))
        }
    }
}

/// What `bspweb supernode` printed at start on `stdout`: the URL of its
/// first line and, with TLS, the certificate fingerprint of a later one,
/// which [`client_options`] then pins; or what it printed instead.
pub fn read_start(stdout: impl std::io::Read) -> Result<(String, Option<String>), String> {
    let mut stdout = BufReader::new(stdout);
    let mut line = String::new();
    let read = stdout.read_line(&mut line);
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://") || w.starts_with("https://"));
    let Some(url) = url else {
        return Err(format!("the supernode printed {line:?} ({read:?})"));
    };
    if url.starts_with("http://") {
        return Ok((url.to_string(), None));
    }
    let mut fingerprint = None;
    for _ in 0..10 {
        let mut next = String::new();
        if stdout.read_line(&mut next).unwrap_or(0) == 0 {
            break;
        }
        fingerprint = next
            .split_whitespace()
            .find(|w| w.starts_with("sha256:"))
            .map(str::to_string);
        if fingerprint.is_some() {
            break;
        }
    }
    let Some(fp) = fingerprint else {
        return Err(format!("the supernode at {url} printed no fingerprint"));
    };
    let pin = fp.parse().map_err(|e| format!("{e}"))?;
    // A supernode started later at the same address (the testbed's) has a
    // new certificate: its pin replaces the old one.
    let mut pins = PINS.lock().unwrap_or_else(|p| p.into_inner());
    pins.retain(|(u, _)| u != url);
    pins.push((url.to_string(), pin));
    drop(pins);
    Ok((url.to_string(), Some(fp)))
}

/// A new enrollment token of the administrator's on the supernode at `url`
/// (on a thread of its own: callers may be inside a tokio runtime).
pub fn enroll(url: &str, name: &str) -> String {
    enroll_with(client_options(url), url, name)
}

/// [`enroll`], reaching the supernode as `options` say.
pub fn enroll_with(options: ClientOptions, url: &str, name: &str) -> String {
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let admin = options
                        .login(url, ADMIN, ADMIN_PASSWORD)
                        .await
                        .expect("admin login");
                    admin
                        .create_enrollment(name)
                        .await
                        .expect("create an enrollment token")
                        .token
                        .0
                })
        })
        .join()
        .expect("enrolling")
    })
}

/// Replace `path`'s contents in one step, so a reader never sees half.
fn write_atomically(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).expect("write a temp file");
    std::fs::rename(&tmp, path).expect("rename a temp file");
}

fn wait_for_peers_blocking(url: &str, peers: &mut [Peer], n: usize, logs: Option<&Path>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = client_options(url)
            .login(url, ADMIN, ADMIN_PASSWORD)
            .await
            .expect("admin login");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let online = client
                .peers()
                .await
                .map(|ps| ps.iter().filter(|p| p.state == "online").count())
                .unwrap_or(0);
            if online >= n {
                return;
            }
            for p in peers.iter_mut().filter(|p| !p.stopped) {
                if let Ok(Some(status)) = p.child.try_wait() {
                    let log = logs
                        .and_then(|d| {
                            std::fs::read_to_string(d.join(format!("peer-{}.log", p.name))).ok()
                        })
                        .map(|l| format!("; its log ends with:\n{}", tail_lines(&l, 20)))
                        .unwrap_or_default();
                    panic!("peer {} exited while starting: {status}{log}", p.name);
                }
            }
            assert!(
                Instant::now() < deadline,
                "only {online} of {n} peers came online"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
