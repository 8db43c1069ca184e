//! The client subcommands: login, submit, jobs, logs, kill, dispose, upload.
//!
//! Credentials come from `BSPWEB_URL` / `BSPWEB_USER` / `BSPWEB_PASSWORD`
//! when set, otherwise from the session `bspweb login` (or `bspweb up`) saved.
//! An `https://` supernode's certificate is verified as the session says
//! (the pin or CA `login` was given), or as `BSPWEB_SUPERNODE_FINGERPRINT` /
//! `BSPWEB_CA_CERT` say, which win.
//! The exit status tells scripts what happened: see [`EXIT_CODES`].

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine;
use bsp_api::PeerId;
use bsp_api::client::{Client, ClientError, ClientOptions, EventStream, TlsOptions};
use bsp_api::rest::{JobEventKind, JobInfo, JobLimits, JobOutcome, JobState, PeerInfo, SubmitJob};
use bsp_api::tls::Fingerprint;
use clap::Args;
use serde::{Deserialize, Serialize};

pub const DEFAULT_URL: &str = "http://127.0.0.1:7878";

/// The exit status of every client command.
pub mod exit {
    // 0: success; with `--follow`, the job exited normally.
    /// Any other error, e.g. a program the supernode refused as invalid.
    pub const ERROR: u8 = 1;
    /// Bad command-line arguments.
    pub const USAGE: u8 = 2;
    /// With `--follow`: the program aborted the job.
    pub const ABORTED: u8 = 3;
    /// With `--follow`: the runtime ended the job (trap, limit, lost peers).
    pub const FAILED: u8 = 4;
    /// With `--follow`: the job was killed.
    pub const KILLED: u8 = 5;
    /// No such job, program or file.
    pub const NOT_FOUND: u8 = 6;
    /// Not logged in, wrong password, or the session expired.
    pub const UNAUTHORIZED: u8 = 7;
    /// The supernode cannot be reached.
    pub const NOT_CONNECTED: u8 = 8;
    /// `--min-peers`: fewer peers are online.
    pub const NOT_ENOUGH_PEERS: u8 = 9;
    /// Interrupted (Ctrl-C) while following; the job keeps running.
    pub const INTERRUPTED: u8 = 130;
}

/// The exit codes as `--help` and the README list them (one per line).
pub const EXIT_CODES: &str = "\
Exit status:
    0  success; with --follow, the job exited normally
    1  any other error (e.g. the supernode refused the program as invalid)
    2  usage error: bad command-line arguments
    3  with --follow: the program aborted the job (abort, error from main, panic)
    4  with --follow: the runtime ended the job (trap, time or memory limit, lost peers)
    5  with --follow: the job was killed
    6  not found: no such job, program or file
    7  unauthorized: not logged in, wrong user name or password, session expired
    8  cannot connect to the supernode (or its TLS certificate is refused)
    9  --min-peers: fewer peers are online than the job asks for
  130  interrupted while following (the job keeps running)";

/// An error that carries its exit status.
#[derive(Debug)]
pub struct Coded {
    pub code: u8,
    pub message: String,
}

impl std::fmt::Display for Coded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Coded {}

pub(crate) fn coded(code: u8, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Coded {
        code,
        message: message.into(),
    })
}

/// A usage error (exit status 2).
pub(crate) fn usage(message: impl Into<String>) -> anyhow::Error {
    coded(exit::USAGE, message)
}

/// The exit status of a client error.
fn client_code(e: &ClientError) -> u8 {
    match e {
        ClientError::NotConnected { .. } | ClientError::Tls { .. } => exit::NOT_CONNECTED,
        ClientError::Unauthorized { .. } => exit::UNAUTHORIZED,
        ClientError::NotEnoughPeers { .. } => exit::NOT_ENOUGH_PEERS,
        ClientError::ProgramNotFound { .. } => exit::NOT_FOUND,
        e if e.status() == Some(404) => exit::NOT_FOUND,
        _ => exit::ERROR,
    }
}

/// The exit status for an error a command returned.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<Coded>() {
            return c.code;
        }
        if let Some(c) = cause.downcast_ref::<ClientError>() {
            return client_code(c);
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::NotFound
        {
            return exit::NOT_FOUND;
        }
    }
    exit::ERROR
}

/// A saved login: what `bspweb login` writes and the other commands read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Session {
    pub url: String,
    pub user: String,
    pub token: String,
    pub expires_at: i64,
    /// How an `https://` supernode's certificate is verified.
    #[serde(flatten)]
    pub tls: SessionTls,
}

/// The certificate check `bspweb login` was told to use, saved with the
/// session so that later commands use it too.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionTls {
    /// The pinned fingerprint of the supernode's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supernode_fingerprint: Option<Fingerprint>,
    /// A CA certificate file (PEM) trusted besides Mozilla's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<PathBuf>,
}

impl SessionTls {
    /// From `--supernode-fingerprint` / `--ca-cert` (or their environment
    /// variables); a relative CA path is made absolute, so later commands
    /// find it from anywhere.
    pub fn new(fingerprint: Option<Fingerprint>, ca_cert: Option<&Path>) -> SessionTls {
        let ca_cert = ca_cert.map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()));
        SessionTls {
            supernode_fingerprint: fingerprint,
            ca_cert,
        }
    }

    /// These settings overridden by `BSPWEB_SUPERNODE_FINGERPRINT` and
    /// `BSPWEB_CA_CERT` where set.
    fn with_env(mut self) -> anyhow::Result<SessionTls> {
        if let Some(fp) = std::env::var(bsp_api::client::tls::FINGERPRINT_ENV)
            .ok()
            .filter(|s| !s.trim().is_empty())
        {
            let fp = fp
                .parse::<Fingerprint>()
                .map_err(|e| usage(format!("{}: {e}", bsp_api::client::tls::FINGERPRINT_ENV)))?;
            self.supernode_fingerprint = Some(fp);
        }
        if let Some(ca) =
            std::env::var_os(bsp_api::client::tls::CA_CERT_ENV).filter(|s| !s.is_empty())
        {
            self.ca_cert = Some(PathBuf::from(ca));
        }
        Ok(self)
    }

    /// The client options these settings stand for.
    pub fn options(&self) -> anyhow::Result<ClientOptions> {
        let mut tls = TlsOptions::new();
        tls.fingerprint = self.supernode_fingerprint;
        if let Some(ca) = &self.ca_cert {
            tls = tls
                .with_ca_file(ca)
                .map_err(|e| coded(exit::NOT_FOUND, e.to_string()))?;
        }
        Ok(ClientOptions::new().tls(tls))
    }
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

/// Write a file readable only by its owner (mode 0600), creating its
/// directory.
pub fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    bspweb_supernode::write_private(path, contents)
        .with_context(|| format!("cannot write {}", path.display()))
}

pub fn save_session(session: &Session) -> anyhow::Result<PathBuf> {
    let path = session_path();
    write_private(&path, &serde_json::to_vec_pretty(session)?)?;
    Ok(path)
}

pub(crate) fn load_session() -> Option<Session> {
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
        let saved = load_session();
        let url = env_url
            .clone()
            .or_else(|| saved.as_ref().map(|s| s.url.clone()))
            .unwrap_or_else(|| DEFAULT_URL.to_string());
        // The saved pin or CA only for the supernode it was saved for.
        let tls = saved
            .filter(|s| s.url == url)
            .map(|s| s.tls)
            .unwrap_or_default()
            .with_env()?;
        return tls
            .options()?
            .login(&url, user, password)
            .await
            .map_err(|e| login_error(&url, e));
    }
    match load_session() {
        Some(s) if env_url.as_deref().is_none_or(|u| u == s.url) => {
            if s.expires_at <= now_secs() {
                return Err(coded(
                    exit::UNAUTHORIZED,
                    format!(
                        "your session for {} has expired; run `bspweb login --user {}` again",
                        s.url, s.user
                    ),
                ));
            }
            Ok(s.tls
                .clone()
                .with_env()?
                .options()?
                .with_token(&s.url, &s.token))
        }
        _ => Err(coded(
            exit::UNAUTHORIZED,
            "not logged in: run `bspweb login --user NAME` (or `bspweb up`), or set BSPWEB_URL, BSPWEB_USER and BSPWEB_PASSWORD",
        )),
    }
}

fn login_error(url: &str, e: ClientError) -> anyhow::Error {
    let message = match &e {
        ClientError::Unauthorized { code, message } if code != "unauthorized" => {
            format!("login to {url} failed: {message}")
        }
        ClientError::Unauthorized { .. } => {
            format!("login to {url} failed: wrong user name or password")
        }
        e => format!("login to {url} failed: {e}"),
    };
    coded(client_code(&e), message)
}

pub async fn login(url: &str, user: &str, tls: SessionTls) -> anyhow::Result<ExitCode> {
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
    let (client, resp) = tls
        .options()?
        .login_full(url, user, &password)
        .await
        .map_err(|e| login_error(url, e))?;
    let path = save_session(&Session {
        url: client.base_url().to_string(),
        user: user.to_string(),
        token: resp.token,
        expires_at: resp.expires_at,
        tls,
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
    /// Wall-clock limit of one superstep, in seconds [default: 120]
    #[arg(long)]
    superstep_secs: Option<f64>,
    /// Memory cap per process, in MiB
    #[arg(long)]
    memory_mib: Option<u32>,
    /// Output cap per process (stdout, stderr and raw records together), in
    /// MiB, from 1 to 1024 [default: 64]; a process that writes more ends the job
    #[arg(long, value_name = "MIB")]
    output_mib: Option<u32>,
    /// Peers that keep a copy of each checkpoint [default: 2]; the job
    /// survives losing up to this many peers at once
    #[arg(long, value_name = "N")]
    replicas: Option<u32>,
    /// Checkpoint every K supersteps [default: 1]; larger values suit huge
    /// state and short supersteps, but a lost process re-executes up to K
    /// supersteps, and every peer keeps the messages its processes sent in
    /// the last K supersteps in memory (a job that sends much with a large
    /// K can fill a peer's memory budget and fail)
    #[arg(long, value_name = "K")]
    checkpoint_every: Option<u32>,
    /// Run each process on this many peers of different volunteers, 1 or 2
    /// [default: 1]. With 2, a result counts only once both copies computed
    /// the same, and a peer that computes wrongly is outvoted by a third
    /// run and quarantined; it costs twice the computing (SECURITY.md)
    #[arg(long, value_name = "N")]
    redundancy: Option<u32>,
    /// Stream the job's output until it ends; exit non-zero if it did not exit normally
    #[arg(long, short = 'f')]
    follow: bool,
    #[command(flatten)]
    raw: RawArgs,
    /// Refuse the job (exit status 9) instead of queueing it when fewer
    /// than N peers are online
    #[arg(long, value_name = "N")]
    min_peers: Option<u32>,
    /// Print the submitted job as JSON; with --follow, its events as JSON
    /// lines instead of text
    #[arg(long)]
    json: bool,
}

pub async fn submit(a: SubmitArgs) -> anyhow::Result<ExitCode> {
    let args = match &a.args {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| usage(format!("--args is not valid JSON: {text} ({e})")))?,
        None => serde_json::Value::Null,
    };
    if a.nprocs == 0 {
        return Err(usage("-n must be at least 1"));
    }
    if a.raw.raw_dir.is_some() && !a.follow {
        return Err(usage(
            "--raw-dir saves raw output while following the job: add --follow (or run `bspweb logs JOB --raw-dir DIR` later)",
        ));
    }
    let mut resources = BTreeMap::new();
    for r in &a.resources {
        let Some((name, path)) = r.split_once('=') else {
            return Err(usage(format!("--resource {r}: expected NAME=PATH")));
        };
        let bytes = std::fs::read(path).with_context(|| format!("cannot read resource {path}"))?;
        resources.insert(
            name.to_string(),
            base64::engine::general_purpose::STANDARD.encode(bytes),
        );
    }
    let limits = limits(&a)?;
    let client = connect().await?;
    let from_file = a.program.ends_with(".wasm") || Path::new(&a.program).is_file();
    let program = if from_file {
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
    // A job from a file is known by its hash; the file's name says more to
    // people, so it is the description unless one is given.
    let file_name = from_file.then(|| {
        Path::new(&a.program)
            .file_name()
            .map_or_else(|| a.program.clone(), |n| n.to_string_lossy().into_owned())
    });
    let description = a.description.clone().or_else(|| file_name.clone());
    let shown = match &file_name {
        Some(f) => format!("{f} ({})", &program[..program.len().min(12)]),
        None => program.clone(),
    };
    let job = client
        .submit(&SubmitJob {
            program,
            nprocs: a.nprocs,
            args,
            description,
            resources,
            seed: a.seed,
            limits,
            min_peers: a.min_peers,
        })
        .await
        .context("submitting the job failed")?;
    if a.json && !a.follow {
        println!("{}", serde_json::to_string(&job)?);
        return Ok(ExitCode::SUCCESS);
    }
    let out = Output::new(a.json);
    if !a.follow {
        println!("{}", job.id);
        eprintln!(
            "submitted job {} ({} × {}); follow it with `bspweb logs {} --follow`",
            job.id, shown, job.nprocs, job.id
        );
        return Ok(ExitCode::SUCCESS);
    }
    if !a.json {
        eprintln!(
            "== job {} submitted: {} with {} process{}",
            job.id,
            shown,
            job.nprocs,
            if job.nprocs == 1 { "" } else { "es" }
        );
    }
    follow(&client, client.events(job.id, None), &a.raw, out, true).await
}

/// The job limits the flags ask for, or `None` to take the supernode's defaults.
fn limits(a: &SubmitArgs) -> anyhow::Result<Option<JobLimits>> {
    if a.superstep_secs.is_none()
        && a.memory_mib.is_none()
        && a.output_mib.is_none()
        && a.replicas.is_none()
        && a.checkpoint_every.is_none()
        && a.redundancy.is_none()
    {
        return Ok(None);
    }
    let mut l = JobLimits::default();
    if let Some(s) = a.superstep_secs {
        if !(s.is_finite() && s > 0.0) {
            return Err(usage("--superstep-secs must be a positive number"));
        }
        l.superstep_ms = (s * 1000.0).round() as u64;
    }
    if let Some(m) = a.memory_mib {
        l.memory_mib = m;
    }
    if let Some(m) = a.output_mib {
        if !(1..=1024).contains(&m) {
            return Err(usage("--output-mib must be between 1 and 1024"));
        }
        l.output_mib = m;
    }
    if let Some(r) = a.replicas {
        l.replicas = r;
    }
    if let Some(r) = a.redundancy {
        if !(1..=2).contains(&r) {
            return Err(usage(
                "--redundancy must be 1 (each process once) or 2 (twice, on peers of different volunteers)",
            ));
        }
        l.redundancy = r;
    }
    if let Some(k) = a.checkpoint_every {
        if k == 0 {
            return Err(usage(
                "--checkpoint-every must be at least 1 (1 = checkpoint at every superstep)",
            ));
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

/// How `follow` writes: text for people, or JSON lines.
#[derive(Clone, Copy)]
struct Output {
    json: bool,
}

impl Output {
    fn new(json: bool) -> Output {
        Output { json }
    }
}

/// The live progress line of `--follow`: redrawn in place on a terminal,
/// plain `== progress:` lines (when it changes) otherwise, nothing with `--json`.
struct Progress<W: Write> {
    mode: ProgressMode,
    /// Where it goes: standard error.
    out: W,
    /// What the line says now.
    text: Option<String>,
    /// The terminal shows it.
    shown: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ProgressMode {
    Off,
    Terminal,
    Plain,
}

impl<W: Write> Progress<W> {
    fn new(mode: ProgressMode, out: W) -> Progress<W> {
        Progress {
            mode,
            out,
            text: None,
            shown: false,
        }
    }

    /// Remove the line from the terminal before other output.
    fn clear(&mut self) {
        if self.shown {
            let _ = write!(self.out, "\r\x1b[2K");
            let _ = self.out.flush();
            self.shown = false;
        }
    }

    /// Show the line again after other output. Line wrapping is off while
    /// it is drawn, so a terminal narrower than the line cuts it instead of
    /// wrapping it onto a second line the next redraw would not clear.
    fn restore(&mut self) {
        if self.mode == ProgressMode::Terminal
            && !self.shown
            && let Some(t) = &self.text
        {
            let _ = write!(self.out, "\x1b[?7l{t}\x1b[?7h");
            let _ = self.out.flush();
            self.shown = true;
        }
    }

    fn set(&mut self, text: String) {
        match self.mode {
            ProgressMode::Off => {}
            ProgressMode::Terminal => {
                self.clear();
                self.text = Some(text);
                self.restore();
            }
            ProgressMode::Plain => {
                if self.text.as_ref() != Some(&text) {
                    let _ = writeln!(self.out, "== progress: {text}");
                    self.text = Some(text);
                }
            }
        }
    }

    /// The job is over: no line any more.
    fn finish(&mut self) {
        self.clear();
        self.mode = ProgressMode::Off;
    }
}

/// `superstep 12, 6 running, 2 exited of 8` for an active job.
pub fn progress_text(info: &JobInfo) -> Option<String> {
    match info.state {
        JobState::Waiting => Some(format!("job {} is waiting for peers", info.id)),
        JobState::Active => {
            let lo = info.supersteps.iter().min().copied().unwrap_or(0);
            let hi = info.supersteps.iter().max().copied().unwrap_or(0);
            let steps = if lo == hi {
                format!("superstep {hi}")
            } else {
                format!("supersteps {lo}-{hi}")
            };
            let running = info.nprocs.saturating_sub(info.exited);
            Some(format!(
                "job {}: {steps}, {running} running, {} exited of {}",
                info.id, info.exited, info.nprocs
            ))
        }
        JobState::Finished => None,
    }
}

/// Print a job's events until `events` ends (after the terminal event when
/// following); the exit code tells how the job ended. `live`: show the
/// progress line.
async fn follow(
    client: &Client,
    mut events: EventStream,
    raw: &RawArgs,
    out: Output,
    live: bool,
) -> anyhow::Result<ExitCode> {
    let job = events.job();
    let stdout = std::io::stdout();
    let mut raw = RawSink::new(raw)?;
    let mut code = ExitCode::SUCCESS;
    let mut peer_names = PeerNames {
        names: BTreeMap::new(),
    };
    let mode = match (live, out.json) {
        (false, _) | (_, true) => ProgressMode::Off,
        _ if std::io::stderr().is_terminal() => ProgressMode::Terminal,
        _ => ProgressMode::Plain,
    };
    let mut progress = Progress::new(mode, std::io::stderr());
    let started = Instant::now();
    let mut poll = tokio::time::interval(Duration::from_secs(1));
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One signal listener for the whole loop: a Ctrl-C that comes while an
    // event is printed or the progress is fetched is not lost.
    let mut interrupted = std::pin::pin!(tokio::signal::ctrl_c());
    let stopped = |progress: &mut Progress<std::io::Stderr>| {
        progress.finish();
        eprintln!("\n== stopped following; job {job} keeps running (`bspweb kill {job}` stops it)");
        Ok(ExitCode::from(exit::INTERRUPTED))
    };
    loop {
        let event = tokio::select! {
            e = events.next() => e.context("lost the job's event stream")?,
            _ = poll.tick(), if progress.mode != ProgressMode::Off => {
                let info = tokio::select! {
                    info = client.job(job) => info,
                    _ = &mut interrupted => return stopped(&mut progress),
                };
                if let Ok(info) = info
                    && let Some(mut text) = progress_text(&info)
                {
                    if progress.mode == ProgressMode::Terminal {
                        text.push_str(&format!(" ({}s)", started.elapsed().as_secs()));
                    }
                    progress.set(text);
                }
                continue;
            }
            _ = &mut interrupted => return stopped(&mut progress),
        };
        let Some(event) = event else { break };
        if event.kind.is_terminal() {
            progress.finish();
        }
        progress.clear();
        code = match &event.kind {
            JobEventKind::JobAborted { .. } => ExitCode::from(exit::ABORTED),
            JobEventKind::JobFailed { .. } => ExitCode::from(exit::FAILED),
            JobEventKind::JobKilled => ExitCode::from(exit::KILLED),
            _ => code,
        };
        if out.json {
            if let (Some(sink), JobEventKind::Raw { data }, Some(p)) =
                (raw.as_mut(), &event.kind, event.pid)
            {
                sink.write(p, &decode_raw(data)?)?;
            }
            let mut o = stdout.lock();
            writeln!(o, "{}", serde_json::to_string(&event)?)?;
            o.flush()?;
            continue;
        }
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
                let _ = out.flush();
            }
            JobEventKind::Stderr { text } => {
                for line in text.split('\n') {
                    eprintln!("[{pid}] {line}");
                }
            }
            JobEventKind::Raw { data } => {
                let bytes = decode_raw(&data)?;
                match (raw.as_mut(), event.pid) {
                    (Some(sink), Some(p)) => sink.write(p, &bytes)?,
                    // Standard output carries only the program's standard output.
                    _ => eprintln!(
                        "[{pid}] <raw data: {} bytes; --raw-dir DIR saves it>",
                        bytes.len()
                    ),
                }
            }
            JobEventKind::Status { text } => eprintln!("== {text}"),
            JobEventKind::ProcessExited { .. } => {}
            JobEventKind::ProcessRolledBack {
                from_start: true, ..
            } => eprintln!(
                "== process {pid} was lost with its peer and no checkpoint of it survived; it re-runs from the start (its repeated output is not shown again)"
            ),
            JobEventKind::ProcessRolledBack { superstep, .. } => eprintln!(
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
            JobEventKind::CopiesDisagree {
                superstep,
                peers,
                what,
            } => {
                let mut names = Vec::new();
                for p in peers {
                    names.push(peer_names.describe(client, p).await);
                }
                eprintln!(
                    "== the copies of process {pid} on {} computed different results in superstep {superstep} ({what}); a third run decides (none of it was used)",
                    names.join(" and ")
                );
            }
            JobEventKind::PeerQuarantined { peer, reason, .. } => {
                let peer = peer_names.describe(client, peer).await;
                eprintln!("== {peer} was quarantined: {reason}");
            }
            JobEventKind::JobExited => eprintln!("== job {job} exited"),
            JobEventKind::JobAborted { reason } => match event.pid {
                Some(pid) => eprintln!("== job {job} aborted by pid {pid}: {reason}"),
                None => eprintln!("== job {job} aborted: {reason}"),
            },
            JobEventKind::JobFailed { reason } => match event.pid {
                Some(pid) => eprintln!("== job {job} failed at pid {pid}: {reason}"),
                None => eprintln!("== job {job} failed: {reason}"),
            },
            JobEventKind::JobKilled => {
                eprintln!("== job {job} was killed");
            }
        }
        progress.restore();
    }
    progress.finish();
    let _ = stdout.lock().flush();
    Ok(code)
}

/// Where `--follow` saves raw output records.
#[derive(Args, Debug, Clone)]
pub struct RawArgs {
    /// Write raw output of each process to DIR/pid-N.bin (only with --follow
    /// for `submit`)
    #[arg(long, value_name = "DIR")]
    raw_dir: Option<PathBuf>,
    /// How records follow each other in DIR/pid-N.bin: `none` concatenates
    /// them (right for fixed-size records); `length` puts each record's
    /// length before it as a 4-byte little-endian unsigned integer, so
    /// records of any size can be told apart. A record is at most 1 MiB.
    #[arg(long, value_enum, default_value_t = RawFraming::None, requires = "raw_dir")]
    raw_framing: RawFraming,
}

/// How raw records are laid out in a process's file (`--raw-framing`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawFraming {
    /// Records back to back, as the guest wrote them.
    None,
    /// Each record as its length (u32, little-endian) and then its bytes.
    Length,
}

/// The raw bytes of a `raw` event; a malformed one is an error, never lost
/// silently.
fn decode_raw(data: &str) -> anyhow::Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(data.as_bytes())
        .context(
            "the supernode sent a raw record that is not valid base64; nothing was written for it",
        )
}

/// The per-process files of `--raw-dir`, each created at its process's first
/// record.
struct RawSink {
    dir: PathBuf,
    framing: RawFraming,
    files: BTreeMap<u32, std::io::BufWriter<std::fs::File>>,
}

impl RawSink {
    /// `None` without `--raw-dir`; otherwise creates the directory.
    fn new(args: &RawArgs) -> anyhow::Result<Option<Self>> {
        let Some(dir) = &args.raw_dir else {
            return Ok(None);
        };
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Some(RawSink {
            dir: dir.clone(),
            framing: args.raw_framing,
            files: BTreeMap::new(),
        }))
    }

    /// Appends one record of process `pid`, framed as asked, and flushes it,
    /// so the files are complete whenever the command stops.
    fn write(&mut self, pid: u32, record: &[u8]) -> anyhow::Result<()> {
        let file = match self.files.entry(pid) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                let path = self.dir.join(format!("pid-{pid}.bin"));
                v.insert(std::io::BufWriter::new(
                    std::fs::File::create(&path)
                        .with_context(|| format!("cannot create {}", path.display()))?,
                ))
            }
        };
        let path = || self.dir.join(format!("pid-{pid}.bin"));
        if self.framing == RawFraming::Length {
            let len = u32::try_from(record.len())
                .context("a raw record longer than 4 GiB cannot be framed")?;
            file.write_all(&len.to_le_bytes())
                .with_context(|| format!("cannot write {}", path().display()))?;
        }
        file.write_all(record)
            .and_then(|()| file.flush())
            .with_context(|| format!("cannot write {}", path().display()))
    }
}

#[derive(Args)]
pub struct JobsArgs {
    /// Only jobs in this state: waiting, active or finished
    #[arg(long)]
    state: Option<String>,
    /// Print a JSON array of jobs instead of a table
    #[arg(long)]
    json: bool,
}

pub async fn jobs(a: JobsArgs) -> anyhow::Result<ExitCode> {
    let state = match a.state.as_deref() {
        None => None,
        Some(s) => Some(JobState::parse(s).ok_or_else(|| {
            usage(format!(
                "unknown state {s:?}: use waiting, active or finished"
            ))
        })?),
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
    #[command(flatten)]
    raw: RawArgs,
    /// Print the events as JSON lines (one `JobEvent` object per line)
    #[arg(long)]
    json: bool,
}

pub async fn logs(a: LogsArgs) -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    let job = client.job(a.job).await?;
    let out = Output::new(a.json);
    if a.follow || job.state == JobState::Finished {
        let events = client.events(a.job, None);
        return follow(&client, events, &a.raw, out, a.follow).await;
    }
    // Not following a job that has not ended: print what is stored, then stop.
    let events = client.stored_events(a.job, None);
    let code = follow(&client, events, &a.raw, out, false).await?;
    let now = client
        .job(a.job)
        .await
        .map(|j| j.state)
        .unwrap_or(job.state);
    if !a.json && now != JobState::Finished {
        eprintln!(
            "== job {} is {}; `bspweb logs {} --follow` streams until it ends",
            job.id,
            now.as_str(),
            job.id
        );
    }
    Ok(code)
}

#[derive(Args)]
pub struct JobRef {
    /// Job id
    job: i64,
    /// Print the result as JSON (`kill`: the job; `dispose`: `{"id": N, "disposed": true}`)
    #[arg(long)]
    json: bool,
}

pub async fn kill(a: JobRef) -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    let job = client.kill(a.job).await?;
    if a.json {
        println!("{}", serde_json::to_string(&job)?);
    } else {
        print_job_line(&job);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn dispose(a: JobRef) -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    client.dispose(a.job).await?;
    if a.json {
        println!("{}", serde_json::json!({"id": a.job, "disposed": true}));
    } else {
        println!("job {} disposed", a.job);
    }
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
    /// Print the registered program as JSON
    #[arg(long)]
    json: bool,
}

pub async fn upload(a: UploadArgs) -> anyhow::Result<ExitCode> {
    let bytes =
        std::fs::read(&a.path).with_context(|| format!("cannot read {}", a.path.display()))?;
    let client = connect().await?;
    let info = client.upload_program(bytes, a.name.as_deref()).await?;
    if a.json {
        println!("{}", serde_json::to_string(&info)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} {} ({} bytes)",
        info.hash,
        info.name.as_deref().unwrap_or("(unnamed)"),
        info.size
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct ListArgs {
    /// Print a JSON array instead of a table
    #[arg(long)]
    json: bool,
}

pub async fn programs(a: ListArgs) -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    let programs = client.programs().await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&programs)?);
        return Ok(ExitCode::SUCCESS);
    }
    for p in programs {
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

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct PeersArgs {
    #[command(subcommand)]
    command: Option<PeersCommand>,
    /// Print a JSON array instead of a table
    #[arg(long)]
    json: bool,
    /// Only the peers that are online now (not the gone ones)
    #[arg(long)]
    online: bool,
    /// List the links peers measured to each other (round trip,
    /// bandwidth) instead of the peers
    #[arg(long)]
    links: bool,
}

#[derive(clap::Subcommand)]
enum PeersCommand {
    /// Disable a peer of yours (administrators: any): it is fenced at once,
    /// its processes restored elsewhere, and its logins under its name with
    /// its token refused until it is enabled
    Disable(PeerRef),
    /// Let a disabled peer log in again
    Enable(PeerRef),
}

#[derive(clap::Args)]
struct PeerRef {
    /// The peer's id (`bspweb peers`)
    id: bsp_api::PeerId,
}

pub async fn peers(a: PeersArgs) -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    if let Some(command) = a.command {
        let (id, disabled) = match command {
            PeersCommand::Disable(p) => (p.id, true),
            PeersCommand::Enable(p) => (p.id, false),
        };
        let peer = client.set_peer_disabled(id, disabled).await?;
        if disabled {
            println!(
                "peer {} `{}` is disabled: fenced, and its logins are refused until \
                 `bspweb peers enable {}`",
                peer.id, peer.name, peer.id
            );
        } else {
            println!(
                "peer {} `{}` is enabled: it may log in again",
                peer.id, peer.name
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut peers = client.peers().await?;
    if a.online {
        peers.retain(|p| p.state == "online");
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&peers)?);
        return Ok(ExitCode::SUCCESS);
    }
    if a.links {
        print_links(&peers);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>4}  {:<20} {:<12} {:<22} {:>6} {:>5} {:>6} {:>5} {:>6} {:>8} {:>8} {:>5}  {:<9} CLUSTER",
        "ID",
        "NAME",
        "OWNER",
        "ADDRESS",
        "SPEED",
        "IDLE",
        "POWER",
        "CORES",
        "PROCS",
        "RSS",
        "HELD",
        "LINKS",
        "STATE"
    );
    // A gone peer's memory is unknown: `-`, not a stale figure.
    let mib = |p: &PeerInfo, b: u64| {
        if p.state == "gone" {
            "-".to_string()
        } else {
            format!("{:.0}M", b as f64 / (1 << 20) as f64)
        }
    };
    for p in peers {
        println!(
            "{:>4}  {:<20} {:<12} {:<22} {:>6.2} {:>5.2} {:>6} {:>5} {:>6} {:>8} {:>8} {:>5}  {:<9} {}",
            p.id,
            truncate(&p.name, 20),
            truncate(p.owner.as_deref().unwrap_or("-"), 12),
            p.addr,
            p.speed,
            p.idle,
            p.power.map_or("-".to_string(), |w| format!("{w:.2}")),
            p.cores,
            p.processes,
            // A running process is never 0 bytes: not reported yet.
            if p.memory.rss_bytes == 0 {
                "-".to_string()
            } else {
                mib(&p, p.memory.rss_bytes)
            },
            mib(&p, p.memory.held_bytes),
            p.links.len(),
            if p.quarantined.is_some() && p.state == "gone" {
                "quarantined"
            } else if p.disabled && p.state == "gone" {
                "disabled"
            } else {
                &p.state
            },
            cluster_column(&p)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A peer's cluster as `bspweb peers` shows it: the one placement uses;
/// when its volunteer named one and the measured links say otherwise,
/// what they say too.
fn cluster_column(p: &PeerInfo) -> String {
    match (&p.cluster, &p.found_cluster) {
        (None, _) => "-".to_string(),
        (Some(c), Some(f)) if c != f => format!("{c} (links: {f})"),
        (Some(c), _) => c.clone(),
    }
}

/// `bspweb peers --links`: one line per measured link.
fn print_links(peers: &[PeerInfo]) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let links: Vec<(&PeerInfo, &bsp_api::rest::PeerLink)> = peers
        .iter()
        .flat_map(|p| p.links.iter().map(move |l| (p, l)))
        .collect();
    if links.is_empty() {
        println!(
            "no links measured yet: peers measure a few each renewal (--probe-mib-per-hour caps it; 0 turns it off)"
        );
        return;
    }
    println!(
        "{:>4} {:>4}  {:>10} {:>12} {:>8}",
        "FROM", "TO", "RTT", "BANDWIDTH", "AGE"
    );
    for (p, l) in links {
        println!(
            "{:>4} {:>4}  {:>8.3}ms {:>8.1}MB/s {:>7}s",
            p.id,
            l.peer,
            l.rtt_us as f64 / 1000.0,
            l.bandwidth_bps as f64 / 1e6,
            (now - l.measured_at).max(0) / 1000
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(state: JobState, supersteps: Vec<u32>, exited: u32) -> JobInfo {
        JobInfo {
            id: 7,
            owner: "u".into(),
            program: "p".into(),
            program_hash: "h".into(),
            nprocs: supersteps.len().max(1) as u32,
            args: serde_json::Value::Null,
            description: None,
            state,
            outcome: None,
            error: None,
            error_pid: None,
            seed: 0,
            limits: JobLimits::default(),
            submitted_at: 0,
            started_at: None,
            finished_at: None,
            placement: vec![],
            copies: Vec::new(),
            exited,
            supersteps,
        }
    }

    #[test]
    fn the_progress_line_names_supersteps_and_processes() {
        let text = |i: &JobInfo| progress_text(i);
        assert_eq!(
            text(&info(JobState::Active, vec![4, 4, 4], 1)).as_deref(),
            Some("job 7: superstep 4, 2 running, 1 exited of 3")
        );
        assert_eq!(
            text(&info(JobState::Active, vec![3, 5], 0)).as_deref(),
            Some("job 7: supersteps 3-5, 2 running, 0 exited of 2")
        );
        assert_eq!(
            text(&info(JobState::Waiting, vec![], 0)).as_deref(),
            Some("job 7 is waiting for peers")
        );
        assert_eq!(text(&info(JobState::Finished, vec![1], 1)), None);
    }

    #[test]
    fn a_terminal_redraws_the_line_in_place_and_a_pipe_gets_plain_lines() {
        let mut tty = Progress::new(ProgressMode::Terminal, Vec::new());
        tty.set("a".into());
        tty.clear();
        tty.restore();
        tty.set("b".into());
        tty.finish();
        tty.set("c".into());
        let shown = String::from_utf8(tty.out).unwrap();
        // Each drawing turns wrapping off (ESC[?7l) and on again (ESC[?7h).
        let draw = |t: &str| format!("\x1b[?7l{t}\x1b[?7h");
        let clear = "\r\x1b[2K";
        assert_eq!(
            shown,
            format!(
                "{}{clear}{}{clear}{}{clear}",
                draw("a"),
                draw("a"),
                draw("b")
            )
        );

        let mut pipe = Progress::new(ProgressMode::Plain, Vec::new());
        for t in ["a", "a", "b"] {
            pipe.clear();
            pipe.set(t.into());
            pipe.restore();
        }
        pipe.finish();
        let shown = String::from_utf8(pipe.out).unwrap();
        assert_eq!(shown, "== progress: a\n== progress: b\n");
    }

    #[test]
    fn client_errors_map_to_their_documented_exit_status() {
        let documented = |code: u8| {
            EXIT_CODES
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{code} ")))
        };
        let cases = [
            (
                ClientError::Unauthorized {
                    code: "unauthorized".into(),
                    message: String::new(),
                },
                exit::UNAUTHORIZED,
            ),
            (
                ClientError::NotEnoughPeers {
                    message: String::new(),
                },
                exit::NOT_ENOUGH_PEERS,
            ),
            (
                ClientError::ProgramNotFound {
                    message: String::new(),
                },
                exit::NOT_FOUND,
            ),
            (
                ClientError::Api {
                    status: 404,
                    code: "not_found".into(),
                    message: String::new(),
                },
                exit::NOT_FOUND,
            ),
            (
                ClientError::InvalidProgram {
                    message: String::new(),
                },
                exit::ERROR,
            ),
        ];
        for (e, code) in cases {
            let wrapped = anyhow::Error::new(e).context("while doing something");
            assert_eq!(exit_code(&wrapped), code, "{wrapped:#}");
            assert!(documented(code), "{code} is not in EXIT_CODES");
        }
        assert_eq!(exit_code(&usage("bad")), exit::USAGE);
        assert_eq!(exit_code(&anyhow::anyhow!("other")), exit::ERROR);
        for code in [
            exit::ABORTED,
            exit::FAILED,
            exit::KILLED,
            exit::NOT_CONNECTED,
            exit::INTERRUPTED,
        ] {
            assert!(documented(code), "{code} is not in EXIT_CODES");
        }
    }
}
