//! Start real supernodes and peers (the `bspweb` binary) on loopback.
//!
//! Every child is started with `--exit-on-stdin-eof` and a piped stdin, so it
//! ends when the test process ends, whatever way that happens.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bsp_api::client::Client;
use bsp_api::rest::{JobEvent, JobEventKind, JobInfo, SubmitJob};

pub const ADMIN: &str = "admin";
pub const ADMIN_PASSWORD: &str = "correct horse battery staple";

pub fn bspweb() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bspweb"))
}

/// A supernode and its peers, each a separate OS process.
pub struct Cluster {
    pub url: String,
    supernode: Child,
    peers: Vec<Child>,
    _data: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in self.peers.iter_mut() {
            let _ = p.kill();
            let _ = p.wait();
        }
        let _ = self.supernode.kill();
        let _ = self.supernode.wait();
    }
}

pub struct Options {
    pub peers: usize,
    pub lease_ttl_secs: u64,
    pub peer_args: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            peers: 3,
            lease_ttl_secs: 15,
            peer_args: vec![],
        }
    }
}

impl Cluster {
    pub fn start(opts: Options) -> Cluster {
        let data = tempfile::tempdir().expect("temp dir");
        let mut supernode = bspweb()
            .args([
                "supernode",
                "--listen",
                "127.0.0.1:0",
                "--exit-on-stdin-eof",
            ])
            .arg("--data")
            .arg(data.path())
            .args(["--lease-ttl-secs", &opts.lease_ttl_secs.to_string()])
            .env("BSPWEB_USER", ADMIN)
            .env("BSPWEB_PASSWORD", ADMIN_PASSWORD)
            .env("BSPWEB_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the supernode");
        // The first line on stdout names the URL it listens on.
        let stdout = supernode.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the supernode's URL");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("supernode did not print its URL: {line:?}"))
            .to_string();
        let mut cluster = Cluster {
            url,
            supernode,
            peers: vec![],
            _data: data,
        };
        for i in 0..opts.peers {
            cluster.add_peer(&format!("test-peer-{i}"), &opts.peer_args);
        }
        cluster.wait_for_peers(opts.peers);
        cluster
    }

    pub fn add_peer(&mut self, name: &str, extra: &[String]) {
        let child = bspweb()
            .args(["peer", "--supernode", &self.url, "--listen", "127.0.0.1:0"])
            .args([
                "--name", name, "--nice", "0", "--speed", "1.0", "--slots", "2",
            ])
            .arg("--exit-on-stdin-eof")
            .args(extra)
            .env("BSPWEB_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a peer");
        self.peers.push(child);
    }

    pub fn wait_for_peers(&self, n: usize) {
        // On a thread of its own: callers may be inside a tokio runtime.
        std::thread::scope(|s| {
            s.spawn(|| self.wait_for_peers_blocking(n))
                .join()
                .expect("waiting for peers");
        });
    }

    fn wait_for_peers_blocking(&self, n: usize) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let client = self.admin().await;
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
                assert!(
                    Instant::now() < deadline,
                    "only {online} of {n} peers came online"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }

    pub async fn admin(&self) -> Client {
        Client::login(&self.url, ADMIN, ADMIN_PASSWORD)
            .await
            .expect("admin login")
    }

    /// Create a user and log in as it.
    pub async fn user(&self, name: &str) -> Client {
        let admin = self.admin().await;
        let http = reqwest::Client::new();
        let resp = http
            .post(format!("{}/api/v1/users", self.url))
            .bearer_auth(admin.token())
            .json(&serde_json::json!({"name": name, "password": "pw-of-" .to_string() + name}))
            .send()
            .await
            .unwrap();
        assert!(
            resp.status().is_success(),
            "create user {name}: {}",
            resp.status()
        );
        Client::login(&self.url, name, &format!("pw-of-{name}"))
            .await
            .unwrap()
    }
}

/// One cluster shared by the tests that only run well-behaved jobs.
pub fn shared() -> &'static Cluster {
    static SHARED: OnceLock<Cluster> = OnceLock::new();
    SHARED.get_or_init(|| Cluster::start(Options::default()))
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
    }
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
        self.events
            .iter()
            .filter(|e| e.pid == Some(pid))
            .filter_map(|e| match &e.kind {
                JobEventKind::Stdout { text } => Some(text.clone()),
                _ => None,
            })
            .collect()
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
        "job {id} did not end within {deadline:?}; events so far: {events:?}"
    );
    let info = client.job(id).await.expect("job info");
    Run { info, events }
}

#[allow(dead_code)]
pub fn target_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target")
}
