//! The client subcommands: login, submit, jobs, logs, kill, dispose, upload.
//!
//! Credentials come from `BSPWEB_URL` / `BSPWEB_USER` / `BSPWEB_PASSWORD`
//! when set, otherwise from the session `bspweb login` (or `bspweb up`) saved.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use base64::Engine;
use bsp_api::PeerId;
use bsp_api::client::{Client, ClientError};
use bsp_api::rest::{JobEventKind, JobInfo, JobLimits, JobOutcome, JobState, SubmitJob};
use clap::Args;
use serde::{Deserialize, Serialize};

pub const DEFAULT_URL: &str = "http://127.0.0.1:7878";

/// A saved login: what `bspweb login` writes and the other commands read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Session {
    pub url: String,
    pub user: String,
    pub token: String,
    pub expires_at: i64,
}

/// `$BSPWEB_CONFIG_DIR`, else `$XDG_CONFIG_HOME/bspweb`, else `~/.config/bspweb`.
pub fn config_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("BSPWEB_CONFIG_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CONFIG_HOME") {
        return PathBuf::from(d).join("bspweb");
    }
    home().join(".config").join("bspweb")
}

pub fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn session_path() -> PathBuf {
    config_dir().join("session.json")
}

/// Write a file readable only by its owner.
pub fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(contents)?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

pub fn save_session(session: &Session) -> anyhow::Result<PathBuf> {
    let path = session_path();
    write_private(&path, &serde_json::to_vec_pretty(session)?)?;
    Ok(path)
}

fn load_session() -> Option<Session> {
    let bytes = std::fs::read(session_path()).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A client from the environment or the saved session.
pub async fn connect() -> anyhow::Result<Client> {
    let env_url = std::env::var("BSPWEB_URL").ok();
    let user = std::env::var("BSPWEB_USER").ok();
    let password = std::env::var("BSPWEB_PASSWORD").ok();
    if let (Some(user), Some(password)) = (&user, &password) {
        let url = env_url.unwrap_or_else(|| {
            load_session()
                .map(|s| s.url)
                .unwrap_or_else(|| DEFAULT_URL.to_string())
        });
        return Client::login(&url, user, password)
            .await
            .map_err(|e| login_error(&url, e));
    }
    match load_session() {
        Some(s) if env_url.as_deref().is_none_or(|u| u == s.url) => {
            if s.expires_at <= now_secs() {
                bail!(
                    "your session for {} has expired; run `bspweb login --user {}` again",
                    s.url,
                    s.user
                );
            }
            Ok(Client::with_token(&s.url, &s.token))
        }
        _ => bail!(
            "not logged in: run `bspweb login --user NAME` (or `bspweb up`), or set BSPWEB_URL, BSPWEB_USER and BSPWEB_PASSWORD"
        ),
    }
}

fn login_error(url: &str, e: ClientError) -> anyhow::Error {
    match e.status() {
        Some(401) => anyhow::anyhow!("login to {url} failed: wrong user name or password"),
        _ => anyhow::anyhow!("login to {url} failed: {e}"),
    }
}

pub async fn login(url: &str, user: &str) -> anyhow::Result<ExitCode> {
    let password = match std::env::var("BSPWEB_PASSWORD") {
        Ok(p) => p,
        Err(_) => {
            if std::io::stdin().is_terminal() {
                eprint!("password for {user} at {url}: ");
                let _ = std::io::stderr().flush();
            }
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("cannot read the password from standard input")?;
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    };
    let (client, resp) = Client::login_full(url, user, &password)
        .await
        .map_err(|e| login_error(url, e))?;
    let path = save_session(&Session {
        url: client.base_url().to_string(),
        user: user.to_string(),
        token: resp.token,
        expires_at: resp.expires_at,
    })?;
    println!(
        "logged in to {url} as {user}; session saved in {}",
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct SubmitArgs {
    /// A registered program name (see `bspweb programs`) or a path to a `.wasm` file
    program: String,
    /// Number of BSP processes
    #[arg(short = 'n', long = "nprocs")]
    nprocs: u32,
    /// Arguments for the program's main, as JSON
    #[arg(long)]
    args: Option<String>,
    /// A description shown in job lists
    #[arg(long)]
    description: Option<String>,
    /// A resource the program reads with `bsp.resource(NAME)`, as NAME=PATH (repeatable)
    #[arg(long = "resource", value_name = "NAME=PATH")]
    resources: Vec<String>,
    /// Seed of the processes' deterministic random number generators
    #[arg(long)]
    seed: Option<u64>,
    /// Wall-clock limit of one superstep, in seconds
    #[arg(long)]
    superstep_secs: Option<f64>,
    /// Memory cap per process, in MiB
    #[arg(long)]
    memory_mib: Option<u32>,
    /// Peers that keep a copy of each checkpoint [default: 2]; the job
    /// survives losing up to this many peers at once
    #[arg(long, value_name = "N")]
    replicas: Option<u32>,
    /// Checkpoint every K supersteps [default: 1]; larger values suit huge
    /// state and short supersteps, but a lost process re-executes up to K
    /// supersteps
    #[arg(long, value_name = "K")]
    checkpoint_every: Option<u32>,
    /// Stream the job's output until it ends; exit non-zero if it did not exit normally
    #[arg(long, short = 'f')]
    follow: bool,
    /// With --follow: write raw output of each process to DIR/pid-N.bin
    #[arg(long, value_name = "DIR")]
    raw_dir: Option<PathBuf>,
}

pub async fn submit(a: SubmitArgs) -> anyhow::Result<ExitCode> {
    let args = match &a.args {
        Some(text) => serde_json::from_str(text)
            .with_context(|| format!("--args is not valid JSON: {text}"))?,
        None => serde_json::Value::Null,
    };
    if a.nprocs == 0 {
        bail!("-n must be at least 1");
    }
    let mut resources = BTreeMap::new();
    for r in &a.resources {
        let Some((name, path)) = r.split_once('=') else {
            bail!("--resource {r}: expected NAME=PATH");
        };
        let bytes = std::fs::read(path).with_context(|| format!("cannot read resource {path}"))?;
        resources.insert(
            name.to_string(),
            base64::engine::general_purpose::STANDARD.encode(bytes),
        );
    }
    let limits = limits(&a)?;
    let client = connect().await?;
    let program = if a.program.ends_with(".wasm") || Path::new(&a.program).is_file() {
        let bytes = std::fs::read(&a.program)
            .with_context(|| format!("cannot read program {}", a.program))?;
        let info = client
            .upload_program(bytes, None)
            .await
            .with_context(|| format!("uploading {} failed", a.program))?;
        info.hash
    } else {
        a.program.clone()
    };
    let job = client
        .submit(&SubmitJob {
            program,
            nprocs: a.nprocs,
            args,
            description: a.description.clone(),
            resources,
            seed: a.seed,
            limits,
            min_peers: None,
        })
        .await
        .context("submitting the job failed")?;
    if !a.follow {
        println!("{}", job.id);
        eprintln!(
            "submitted job {} ({} × {}); follow it with `bspweb logs {} --follow`",
            job.id, job.program, job.nprocs, job.id
        );
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "== job {} submitted: {} with {} processes",
        job.id, job.program, job.nprocs
    );
    follow(&client, job.id, a.raw_dir.as_deref()).await
}

/// The job limits the flags ask for, or `None` to take the supernode's defaults.
fn limits(a: &SubmitArgs) -> anyhow::Result<Option<JobLimits>> {
    if a.superstep_secs.is_none()
        && a.memory_mib.is_none()
        && a.replicas.is_none()
        && a.checkpoint_every.is_none()
    {
        return Ok(None);
    }
    let mut l = JobLimits::default();
    if let Some(s) = a.superstep_secs {
        if !(s.is_finite() && s > 0.0) {
            bail!("--superstep-secs must be a positive number");
        }
        l.superstep_ms = (s * 1000.0).round() as u64;
    }
    if let Some(m) = a.memory_mib {
        l.memory_mib = m;
    }
    if let Some(r) = a.replicas {
        l.replicas = r;
    }
    if let Some(k) = a.checkpoint_every {
        if k == 0 {
            bail!("--checkpoint-every must be at least 1 (1 = checkpoint at every superstep)");
        }
        l.checkpoint_every = k;
    }
    Ok(Some(l))
}

/// Names of peers by id, fetched when an event names a peer not seen yet.
struct PeerNames {
    names: BTreeMap<PeerId, String>,
}

impl PeerNames {
    /// `peer 3 (alice-laptop)`, or `peer 3` when its name cannot be fetched.
    async fn describe(&mut self, client: &Client, id: PeerId) -> String {
        if !self.names.contains_key(&id)
            && let Ok(peers) = client.peers().await
        {
            self.names.extend(peers.into_iter().map(|p| (p.id, p.name)));
        }
        match self.names.get(&id) {
            Some(name) => format!("peer {id} ({name})"),
            None => format!("peer {id}"),
        }
    }
}

/// Print a job's events until its terminal event; the exit code tells how it ended.
async fn follow(client: &Client, job: i64, raw_dir: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut events = client.events(job, None);
    let stdout = std::io::stdout();
    let mut raw_files: BTreeMap<u32, std::fs::File> = BTreeMap::new();
    if let Some(dir) = raw_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut code = ExitCode::SUCCESS;
    let mut peer_names = PeerNames {
        names: BTreeMap::new(),
    };
    loop {
        let event = tokio::select! {
            e = events.next() => e.context("lost the job's event stream")?,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("\n== stopped following; job {job} keeps running (`bspweb kill {job}` stops it)");
                return Ok(ExitCode::from(130));
            }
        };
        let Some(event) = event else { break };
        let pid = event
            .pid
            .map(|p| p.to_string())
            .unwrap_or_else(|| "-".into());
        match event.kind {
            JobEventKind::Stdout { text } => {
                let mut out = stdout.lock();
                for line in text.split('\n') {
                    let _ = writeln!(out, "[{pid}] {line}");
                }
            }
            JobEventKind::Stderr { text } => {
                for line in text.split('\n') {
                    eprintln!("[{pid}] {line}");
                }
            }
            JobEventKind::Raw { data } => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data.as_bytes())
                    .unwrap_or_default();
                match (raw_dir, event.pid) {
                    (Some(dir), Some(p)) => {
                        let f =
                            match raw_files.entry(p) {
                                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                                std::collections::btree_map::Entry::Vacant(v) => {
                                    let path = dir.join(format!("pid-{p}.bin"));
                                    v.insert(std::fs::File::create(&path).with_context(|| {
                                        format!("cannot create {}", path.display())
                                    })?)
                                }
                            };
                        f.write_all(&bytes)?;
                    }
                    // Standard output carries only the program's standard output.
                    _ => eprintln!(
                        "[{pid}] <raw data: {} bytes; --raw-dir DIR saves it>",
                        bytes.len()
                    ),
                }
            }
            JobEventKind::Status { text } => eprintln!("== {text}"),
            JobEventKind::ProcessExited { .. } => {}
            JobEventKind::ProcessRolledBack { superstep } => eprintln!(
                "== process {pid} was lost with its peer; restored from its checkpoint of superstep {superstep}, it re-executes from there (its repeated output is not shown again)"
            ),
            JobEventKind::ProcessMigrated {
                from,
                to,
                superstep,
            } => {
                let from = peer_names.describe(client, from).await;
                let to = peer_names.describe(client, to).await;
                eprintln!(
                    "== process {pid} migrated from {from} to {to} after superstep {superstep}"
                );
            }
            JobEventKind::JobExited => eprintln!("== job {job} exited"),
            JobEventKind::JobAborted { reason } => {
                eprintln!("== job {job} aborted by pid {pid}: {reason}");
                code = ExitCode::FAILURE;
            }
            JobEventKind::JobFailed { reason } => {
                eprintln!("== job {job} failed at pid {pid}: {reason}");
                code = ExitCode::FAILURE;
            }
            JobEventKind::JobKilled => {
                eprintln!("== job {job} was killed");
                code = ExitCode::FAILURE;
            }
        }
    }
    let _ = stdout.lock().flush();
    Ok(code)
}

#[derive(Args)]
pub struct JobsArgs {
    /// Only jobs in this state: waiting, active or finished
    #[arg(long)]
    state: Option<String>,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

pub async fn jobs(a: JobsArgs) -> anyhow::Result<ExitCode> {
    let state = match a.state.as_deref() {
        None => None,
        Some(s) => Some(
            JobState::parse(s)
                .with_context(|| format!("unknown state {s:?}: use waiting, active or finished"))?,
        ),
    };
    let client = connect().await?;
    let jobs = client.jobs(state).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&jobs)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>6}  {:<9} {:<8} {:>6}  {:<20} DESCRIPTION",
        "ID", "STATE", "OUTCOME", "PROCS", "PROGRAM"
    );
    for j in &jobs {
        println!(
            "{:>6}  {:<9} {:<8} {:>6}  {:<20} {}",
            j.id,
            j.state.as_str(),
            j.outcome.map(JobOutcome::as_str).unwrap_or("-"),
            j.nprocs,
            truncate(&j.program, 20),
            j.description.as_deref().unwrap_or("")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

#[derive(Args)]
pub struct LogsArgs {
    /// Job id
    job: i64,
    /// Keep streaming until the job ends (otherwise print what is there now)
    #[arg(long, short = 'f')]
    follow: bool,
    /// Write raw output of each process to DIR/pid-N.bin
    #[arg(long, value_name = "DIR")]
    raw_dir: Option<PathBuf>,
}

pub async fn logs(a: LogsArgs) -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    let job = client.job(a.job).await?;
    if a.follow || job.state == JobState::Finished {
        let code = follow(&client, a.job, a.raw_dir.as_deref()).await?;
        return Ok(code);
    }
    // Not following a job that has not ended: print what exists, then stop.
    let snapshot = tokio::time::timeout(
        std::time::Duration::from_millis(500),
        follow(&client, a.job, a.raw_dir.as_deref()),
    )
    .await;
    match snapshot {
        Ok(r) => r,
        Err(_) => {
            eprintln!(
                "== job {} is {}; `bspweb logs {} --follow` streams until it ends",
                job.id,
                job.state.as_str(),
                job.id
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[derive(Args)]
pub struct JobRef {
    /// Job id
    job: i64,
}

pub async fn kill(a: JobRef) -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    let job = client.kill(a.job).await?;
    print_job_line(&job);
    Ok(ExitCode::SUCCESS)
}

pub async fn dispose(a: JobRef) -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    client.dispose(a.job).await?;
    println!("job {} disposed", a.job);
    Ok(ExitCode::SUCCESS)
}

fn print_job_line(job: &JobInfo) {
    println!(
        "job {}: {}{}",
        job.id,
        job.state.as_str(),
        job.outcome
            .map(|o| format!(" ({})", o.as_str()))
            .unwrap_or_default()
    );
}

#[derive(Args)]
pub struct UploadArgs {
    /// Path to a `.wasm` file built for wasm32-unknown-unknown with the bspweb SDK
    path: PathBuf,
    /// Register it under this name
    #[arg(long)]
    name: Option<String>,
}

pub async fn upload(a: UploadArgs) -> anyhow::Result<ExitCode> {
    let bytes =
        std::fs::read(&a.path).with_context(|| format!("cannot read {}", a.path.display()))?;
    let client = connect().await?;
    let info = client.upload_program(bytes, a.name.as_deref()).await?;
    println!(
        "{} {} ({} bytes)",
        info.hash,
        info.name.as_deref().unwrap_or("(unnamed)"),
        info.size
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn programs() -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    for p in client.programs().await? {
        println!(
            "{:<16} {}  {:>8} bytes  {}{}",
            p.name.as_deref().unwrap_or("-"),
            &p.hash[..12.min(p.hash.len())],
            p.size,
            if p.builtin { "[example] " } else { "" },
            p.description.as_deref().unwrap_or("")
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn peers() -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    println!(
        "{:>4}  {:<20} {:<22} {:>6} {:>5} {:>5} {:>6}  STATE",
        "ID", "NAME", "ADDRESS", "SPEED", "IDLE", "CORES", "PROCS"
    );
    for p in client.peers().await? {
        println!(
            "{:>4}  {:<20} {:<22} {:>6.2} {:>5.2} {:>5} {:>6}  {}",
            p.id,
            truncate(&p.name, 20),
            p.addr,
            p.speed,
            p.idle,
            p.cores,
            p.processes,
            p.state
        );
    }
    Ok(ExitCode::SUCCESS)
}
