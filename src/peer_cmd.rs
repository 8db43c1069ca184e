//! `bspweb peer`: run a peer (flags, or a `peer.toml`), install it as a
//! systemd service, and talk to the running one (status, pause, resume).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use bspweb_peer::daemon::{self, PeerStatus, Request};
use clap::{Args, Subcommand};

use crate::cli_client::{coded, exit, home, usage};

pub const PEER_ABOUT: &str = "Run a peer that donates this machine's idle time to a supernode.

Without a subcommand, runs the peer in the foreground with the flags below, \
read from a TOML file (--config, else ~/.config/bspweb/peer.toml when it \
exists) for any flag not given. The subcommands install it as a systemd \
service that starts with the machine (`bspweb peer install --user \
--supernode URL`) and talk to the running peer through its control socket: \
`status`, `pause` (its processes move to other peers, then it takes no \
work until `resume`), `resume`.

It reports the CPU time it may use as its idle fraction: from /proc/stat, \
the share of idle, iowait and niced time over the last lease period (bspweb \
runs niced, so its own work does not count against it); under 5 % it takes \
no processes and its processes move away. See docs/volunteer.md.";

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct PeerArgs {
    #[command(subcommand)]
    command: Option<PeerCommand>,
    #[command(flatten)]
    run: PeerRunArgs,
}

#[derive(Subcommand)]
enum PeerCommand {
    /// Install the peer as a systemd service (user or system) that starts
    /// with the machine, restarts on failure and runs at idle priority
    Install(Box<InstallArgs>),
    /// Stop and remove the service `install` set up (its peer.toml stays)
    Uninstall(ServiceArgs),
    /// What the running peer does: state, jobs, slots, memory, windows
    Status(SocketArgs),
    /// Stop taking work: the supernode moves this peer's processes away
    /// (the jobs go on elsewhere), then gives it none until `resume`
    Pause(SocketArgs),
    /// Take work again
    Resume(SocketArgs),
}

#[derive(Args)]
struct SocketArgs {
    /// The running peer's control socket [default: the one `bspweb peer`
    /// opens by default; with --system, the system service's]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The system service's peer (/run/bspweb/peer.sock)
    #[arg(long, conflicts_with = "socket")]
    system: bool,
    /// Print the status as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ServiceArgs {
    /// A system service (as root: /etc/systemd/system, runs as its own
    /// unprivileged user) instead of one of the current user
    #[arg(long)]
    system: bool,
    /// Where the unit file goes [default: ~/.config/systemd/user, or
    /// /etc/systemd/system with --system]
    #[arg(long, value_name = "DIR")]
    unit_dir: Option<PathBuf>,
    /// Write the files only: do not call systemctl
    #[arg(long)]
    no_start: bool,
}

#[derive(Args)]
struct InstallArgs {
    /// A service of the current user (the default)
    #[arg(long, conflicts_with = "system")]
    user: bool,
    #[command(flatten)]
    service: ServiceArgs,
    /// Base URL of the supernode, e.g. https://supernode.example:7878 (or
    /// several, separated by commas, of supernodes sharing one database)
    #[arg(long, env = "BSPWEB_SUPERNODE")]
    supernode: String,
    /// The supernode certificate's SHA-256 fingerprint to pin (`sha256:…`,
    /// as the supernode prints it), for a self-signed certificate
    #[arg(long, env = "BSPWEB_SUPERNODE_FINGERPRINT", value_name = "sha256:HEX")]
    supernode_fingerprint: Option<bsp_api::tls::Fingerprint>,
    /// A CA certificate file (PEM) to trust for the supernode besides
    /// Mozilla's roots; the settings name it by its absolute path
    #[arg(long, env = "BSPWEB_CA_CERT", value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// Name shown in peer lists [default: host name]
    #[arg(long)]
    name: Option<String>,
    /// Use at most this percentage of the machine's cores
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=100))]
    cpu_percent: Option<u8>,
    /// Take work only between these local times (repeatable)
    #[arg(long, value_name = "HH:MM-HH:MM")]
    run_between: Vec<bspweb_peer::availability::Window>,
    /// The most memory the peer may use, MiB [default: half the machine's];
    /// also the service's MemoryMax (plus a quarter for the runtime)
    #[arg(long, value_name = "MIB")]
    memory_budget_mib: Option<u64>,
    /// The network cluster this peer is in
    #[arg(long)]
    cluster: Option<String>,
    /// The file holding the enrollment token (from `bspweb token create`);
    /// it is copied next to the settings, readable by its owner only
    /// (a system service gets it as a systemd credential)
    #[arg(long, value_name = "FILE", required_unless_present = "token")]
    token_file: Option<PathBuf>,
    /// The enrollment token itself (prefer --token-file: a flag shows in
    /// the process list)
    #[arg(
        long,
        env = "BSPWEB_PEER_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: Option<String>,
    /// Address of the peer-to-peer listener, e.g. 0.0.0.0:7900
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// host:port other peers dial
    #[arg(long)]
    advertise: Option<String>,
    /// Where the settings go [default: ~/.config/bspweb/peer.toml, or
    /// /etc/bspweb/peer.toml with --system]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Replace an existing peer.toml
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
pub struct PeerRunArgs {
    /// Base URL of the supernode, e.g. http://127.0.0.1:7878; or several,
    /// separated by commas, of supernodes sharing one database: the peer
    /// fails over to the next when one does not answer
    // Required to run a peer; an `Option` only so that the subcommands
    // need none.
    #[arg(long, env = "BSPWEB_SUPERNODE", required = true)]
    pub(crate) supernode: Option<String>,
    /// Accept exactly the supernode certificate with this SHA-256
    /// fingerprint (`sha256:…`, as the supernode prints it at start) and no
    /// other; without it, an https:// supernode's certificate must be
    /// signed by a CA of Mozilla's list
    #[arg(long, env = "BSPWEB_SUPERNODE_FINGERPRINT", value_name = "sha256:HEX")]
    pub(crate) supernode_fingerprint: Option<bsp_api::tls::Fingerprint>,
    /// Also trust the CA certificate(s) in this PEM file for an https://
    /// supernode (besides Mozilla's roots): a deployment's private CA
    #[arg(long, env = "BSPWEB_CA_CERT", value_name = "FILE")]
    pub(crate) ca_cert: Option<PathBuf>,
    /// Address of the peer-to-peer listener
    #[arg(long, default_value = "0.0.0.0:0")]
    pub(crate) listen: SocketAddr,
    /// host:port other peers should dial (default: the listen address)
    #[arg(long)]
    pub(crate) advertise: Option<String>,
    /// Name shown in peer lists (default: host name)
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Memory cap per process, in MiB
    #[arg(long, default_value_t = 1024)]
    pub(crate) max_memory_mib: u32,
    /// The most memory this peer may use for bspweb, all jobs together, in
    /// MiB; a job that would take it further fails, saying so, instead of
    /// the machine running out [default: half the machine's memory; 0: no
    /// budget]
    #[arg(long)]
    pub(crate) memory_budget_mib: Option<u64>,
    /// Cap of the wall-clock limit of one superstep, in seconds
    #[arg(long, default_value_t = 3600)]
    pub(crate) max_superstep_secs: u64,
    /// Processes run at once (default: number of cores)
    #[arg(long)]
    pub(crate) slots: Option<usize>,
    /// OS niceness (0 = normal, 19 = lowest priority)
    #[arg(long, default_value_t = 10)]
    pub(crate) nice: i32,
    /// Threads for the peer's networking, encryption and protocol work
    /// (processes run on threads of their own, `--slots`). One thread
    /// hands nothing to another at each superstep; one core seals records
    /// at about 40 GB/s, faster than a NIC carries them, so more help only
    /// a peer whose many links are busy at once
    #[arg(long, env = "BSPWEB_IO_THREADS", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) io_threads: u16,
    /// Override the benchmarked speed weight (1.0 = reference machine)
    #[arg(long)]
    pub(crate) speed: Option<f64>,
    /// On Ctrl-C or SIGTERM, wait this long for the supernode to move this
    /// peer's processes away before stopping them (a second Ctrl-C stops at once)
    #[arg(long, default_value_t = 60)]
    pub(crate) drain_timeout_secs: u64,
    /// Report the idle fraction read from this file (a number in [0, 1]) instead
    /// of measuring the CPU; unreadable or invalid content falls back to the measurement
    #[arg(long)]
    pub(crate) idle_file: Option<PathBuf>,
    /// The network cluster this peer is in (letters, digits, `.`, `_`, `-`):
    /// peers of one cluster share fast links. Placement, broadcasts and
    /// program downloads use it (docs/broadcast.md); unset, the supernode
    /// finds the peer's cluster from the links peers measure
    /// (docs/clustering.md)
    #[arg(long, env = "BSPWEB_CLUSTER")]
    pub(crate) cluster: Option<String>,
    /// How large send_range/send_list payloads travel: auto (the rule in
    /// docs/broadcast.md), direct, symmetric, binomial or chain
    #[arg(long, default_value = "auto")]
    pub(crate) broadcast: bspweb_peer::relay::BroadcastAlgorithm,
    /// Under --broadcast auto, payloads smaller than this many KiB go direct
    #[arg(long, default_value_t = 256)]
    pub(crate) broadcast_min_kib: usize,
    /// The local control socket that `bspweb peer status|pause|resume`
    /// use [default: $XDG_RUNTIME_DIR/bspweb-peer.sock, else
    /// /run/bspweb-peer.sock for root, else ~/.local/state/bspweb/peer.sock]
    #[arg(long, value_name = "PATH")]
    pub(crate) control_socket: Option<PathBuf>,
    /// Open no control socket
    #[arg(long, conflicts_with = "control_socket")]
    pub(crate) no_control_socket: bool,
    /// Take work only between these local times, e.g. 22:00-07:00 (repeat
    /// for several windows); outside them the peer drains, as when paused
    #[arg(long, value_name = "HH:MM-HH:MM")]
    pub(crate) run_between: Vec<bspweb_peer::availability::Window>,
    /// Use at most this percentage of the machine's cores (fewer processes
    /// at once; the supernode is told fewer cores)
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub(crate) cpu_percent: Option<u8>,
    /// Cap on the traffic of link measurements (probes this peer sends and
    /// answers, about 272 KiB each), in MiB per hour; 0 turns them off. The
    /// supernode clusters peers by what they measure (docs/clustering.md)
    #[arg(long, value_name = "MIB", default_value_t = bspweb_peer::links::DEFAULT_MIB_PER_HOUR)]
    pub(crate) probe_mib_per_hour: u64,
    /// Keep the programs this peer compiles in this directory, so that it
    /// need not compile them again after a restart; it must be this user's
    /// and nobody else may write it [default: $CACHE_DIRECTORY/compiled
    /// under systemd, else $XDG_CACHE_HOME/bspweb/compiled, else
    /// ~/.cache/bspweb/compiled]
    #[arg(long, value_name = "DIR")]
    pub(crate) compile_cache: Option<PathBuf>,
    /// Most disk space the compile cache may take, in MiB (the least
    /// recently used programs go first); 0 keeps none
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    pub(crate) compile_cache_mib: u64,
    /// The enrollment token to log in with (from `bspweb token create` or
    /// the web UI's Peers page); the supernode admits no peer without one.
    /// A flag shows in the process list: prefer --token-file or the
    /// environment variable
    #[arg(
        long,
        env = "BSPWEB_PEER_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub(crate) token: Option<String>,
    /// Read the enrollment token from this file (wins over --token)
    #[arg(long, value_name = "FILE")]
    pub(crate) token_file: Option<PathBuf>,
    /// Read settings from this TOML file (keys are these flags' names, e.g.
    /// `supernode = "http://…"`, `cpu-percent = 50`, `run-between =
    /// ["22:00-07:00"]`); flags given here win [default:
    /// ~/.config/bspweb/peer.toml when it exists]
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Stop when standard input closes (for supervisors and tests)
    #[arg(long, hide = true)]
    pub(crate) exit_on_stdin_eof: bool,
}
impl PeerArgs {
    /// Whether this runs a peer (not a subcommand).
    pub fn runs(&self) -> bool {
        self.command.is_none()
    }

    /// How many async worker threads the peer's runtime gets when it runs
    /// (`--io-threads`).
    pub fn io_threads(&self) -> Option<usize> {
        self.runs().then_some(usize::from(self.run.io_threads))
    }

    /// The OS niceness the whole peer runs at when it runs (`--nice`): its
    /// own work (checkpoints, replicas, the network) as well as programs.
    pub fn niceness(&self) -> Option<i32> {
        self.runs().then_some(self.run.nice)
    }
}

/// The unit's name.
pub const UNIT: &str = "bspweb-peer.service";
/// The system service's control socket (its `RuntimeDirectory`).
const SYSTEM_SOCKET: &str = "/run/bspweb/peer.sock";

/// Runs `bspweb peer …`.
pub async fn peer(a: PeerArgs) -> anyhow::Result<ExitCode> {
    match a.command {
        None => crate::local::peer(a.run).await,
        Some(PeerCommand::Install(i)) => install(*i),
        Some(PeerCommand::Uninstall(s)) => uninstall(&s),
        Some(PeerCommand::Status(s)) => control(&s, Request::Status).await,
        Some(PeerCommand::Pause(s)) => control(&s, Request::Pause).await,
        Some(PeerCommand::Resume(s)) => control(&s, Request::Resume).await,
    }
}

/// Whether `bspweb ARGS` runs a peer (not a `peer` subcommand).
fn runs_a_peer(args: &[std::ffi::OsString]) -> bool {
    let subcommands = ["install", "uninstall", "status", "pause", "resume", "help"];
    args.get(1).is_some_and(|a| a == "peer")
        && !args
            .get(2)
            .and_then(|a| a.to_str())
            .is_some_and(|a| subcommands.contains(&a))
}

/// How to get an enrollment token, for error messages.
pub use bsp_api::control::refusal::HOW_TO_ENROLL;

/// The enrollment token of `--token-file` (first) or `--token`, checked
/// for its form; `None` when neither is given.
pub fn read_token(
    file: Option<&Path>,
    token: Option<&str>,
) -> anyhow::Result<Option<bsp_api::control::EnrollmentToken>> {
    use bsp_api::control::EnrollmentToken;
    let (token, from) = match (file, token) {
        (Some(f), _) => {
            let text = std::fs::read_to_string(f).with_context(|| {
                format!("cannot read the enrollment token file {}", f.display())
            })?;
            (
                text.trim().to_string(),
                format!("the token file {}", f.display()),
            )
        }
        (None, Some(t)) => (
            t.trim().to_string(),
            "--token (or BSPWEB_PEER_TOKEN)".to_string(),
        ),
        (None, None) => return Ok(None),
    };
    let token = EnrollmentToken(token);
    if token.parse().is_none() {
        return Err(usage(format!(
            "the enrollment token in {from} is malformed: a token reads `bwpeer-<id>-<64 hex \
             digits>`, as `bspweb token create` prints it"
        )));
    }
    Ok(Some(token))
}

/// The default settings file of a peer: `peer.toml` in the CLI's config
/// directory.
pub fn default_config() -> PathBuf {
    crate::cli_client::config_dir().join("peer.toml")
}

/// `bspweb peer` with the settings of its TOML file (`--config`, else the
/// default one if it exists) inserted before the flags of the command line,
/// for every flag the command line does not give itself.
pub fn with_config_file(args: Vec<std::ffi::OsString>) -> anyhow::Result<Vec<std::ffi::OsString>> {
    if !runs_a_peer(&args) {
        return Ok(args);
    }
    let mut given = Vec::new();
    let mut config = None;
    let mut it = args.iter().skip(2);
    while let Some(a) = it.next() {
        let Some(a) = a.to_str() else { continue };
        if let Some(flag) = a.strip_prefix("--") {
            let (flag, inline) = match flag.split_once('=') {
                Some((f, v)) => (f, Some(v)),
                None => (flag, None),
            };
            if flag == "config" {
                config = match inline {
                    Some(v) => Some(PathBuf::from(v)),
                    None => it.next().map(PathBuf::from),
                };
            }
            given.push(flag.to_string());
        }
    }
    let (path, required) = match config {
        Some(p) => (p, true),
        None => (default_config(), false),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Ok(args),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot read the peer settings {}", path.display()));
        }
    };
    let from_file =
        config_args(&text, &given).map_err(|e| usage(format!("{}: {e}", path.display())))?;
    let mut out = args[..2].to_vec();
    out.extend(from_file.into_iter().map(Into::into));
    out.extend(args[2..].iter().cloned());
    Ok(out)
}

/// The flags a `peer.toml` stands for, leaving out those in `given`.
fn config_args(text: &str, given: &[String]) -> Result<Vec<String>, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| format!("not valid TOML: {e}"))?;
    let cmd = <PeerRunArgs as Args>::augment_args(clap::Command::new("peer"));
    let known: Vec<String> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long().map(str::to_string))
        .filter(|l| l != "config")
        .collect();
    let mut out = Vec::new();
    for (key, value) in table {
        if !known.contains(&key) {
            return Err(format!(
                "unknown setting `{key}`; the settings are the flags of `bspweb peer --help`: {}",
                known.join(", ")
            ));
        }
        if given.contains(&key) {
            continue;
        }
        let flag = format!("--{key}");
        let scalar = |v: &toml::Value| -> Result<String, String> {
            match v {
                toml::Value::String(s) => Ok(s.clone()),
                toml::Value::Integer(i) => Ok(i.to_string()),
                toml::Value::Float(f) => Ok(f.to_string()),
                other => Err(format!(
                    "`{key}` must be a string or a number, not {}",
                    other.type_str()
                )),
            }
        };
        match &value {
            toml::Value::Boolean(true) => out.push(flag),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                for item in items {
                    out.push(flag.clone());
                    out.push(scalar(item)?);
                }
            }
            v => {
                out.push(flag);
                out.push(scalar(v)?);
            }
        }
    }
    Ok(out)
}

/// `bspweb peer status|pause|resume`.
async fn control(a: &SocketArgs, request: Request) -> anyhow::Result<ExitCode> {
    let path = match (&a.socket, a.system) {
        (Some(p), _) => p.clone(),
        (None, true) => PathBuf::from(SYSTEM_SOCKET),
        (None, false) => daemon::default_socket(),
    };
    let status = daemon::call(&path, request).await.map_err(|e| match e {
        daemon::DaemonError::NotRunning { .. } => {
            let mut message = e.to_string();
            if a.socket.is_none() && !a.system {
                let local = crate::local::default_data_dir();
                message.push_str(&other_sockets(&local, Path::new(SYSTEM_SOCKET)));
            }
            coded(exit::NOT_CONNECTED, message)
        }
        e => anyhow::Error::new(e),
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(ExitCode::SUCCESS);
    }
    match request {
        Request::Pause if status.state == "draining" => println!(
            "paused: the supernode moves this peer's processes away (`bspweb peer status` shows when it is done)"
        ),
        Request::Pause => println!("paused: this peer takes no work until `bspweb peer resume`"),
        Request::Resume if !status.in_window => println!(
            "resumed; outside its time windows ({}) it still takes no work",
            status.windows.join(", ")
        ),
        Request::Resume => println!("resumed: this peer takes work again"),
        Request::Status => {}
    }
    print!("{}", status_text(&status));
    Ok(ExitCode::SUCCESS)
}

/// Where else peers answer, for the error when the default socket has
/// none: the local peers of `bspweb up` (their sockets in its data
/// directory `data`) and the system service (`system`). Empty when there is
/// no other socket.
fn other_sockets(data: &Path, system: &Path) -> String {
    let mut found: Vec<PathBuf> = std::fs::read_dir(data)
        .map(|dir| {
            dir.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("peer-local-") && n.ends_with(".sock"))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    let mut hint = String::new();
    if let Some(first) = found.first() {
        hint.push_str(&format!(
            "\nthe local peers of `bspweb up` have their own sockets in {}: `bspweb peer status --socket {}`",
            data.display(),
            first.display()
        ));
        if found.len() > 1 {
            hint.push_str(&format!(" (and {} more)", found.len() - 1));
        }
    }
    if system.exists() {
        hint.push_str("\nthe system service's peer answers with `bspweb peer status --system`");
    }
    hint
}

/// `bspweb peer status` for people.
fn status_text(s: &PeerStatus) -> String {
    let mib = |b: u64| format!("{} MiB", b >> 20);
    let id = s
        .peer_id
        .map_or_else(|| "not logged in yet".to_string(), |i| format!("peer {i}"));
    let mut out = format!("{}: {} ({id} at {})\n", s.name, s.state, s.supernode);
    out.push_str(&format!(
        "  jobs:    {}\n",
        if s.jobs.is_empty() {
            "none".to_string()
        } else {
            s.jobs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        }
    ));
    out.push_str(&format!(
        "  slots:   {}{}; speed {:.2}; idle {:.0} %\n",
        s.slots,
        s.cpu_percent
            .map_or_else(String::new, |p| format!(" (capped at {p} % of the CPU)")),
        s.speed,
        s.idle * 100.0
    ));
    out.push_str(&format!(
        "  memory:  {}{}\n",
        mib(s.rss_bytes),
        if s.budget_bytes > 0 {
            format!(" of a {} budget", mib(s.budget_bytes))
        } else {
            String::new()
        }
    ));
    out.push_str(&match &s.compile_cache {
        Some(dir) => format!(
            "  programs: {} compiled, {} read back from the compile cache in {dir}\n",
            s.compiled, s.loaded
        ),
        None => format!(
            "  programs: {} compiled, kept in memory only (no compile cache)\n",
            s.compiled
        ),
    });
    out.push_str(&format!(
        "  windows: {}\n",
        if s.windows.is_empty() {
            "always".to_string()
        } else {
            format!(
                "{} ({})",
                s.windows.join(", "),
                if s.in_window {
                    "inside now"
                } else {
                    "outside now"
                }
            )
        }
    ));
    out
}

/// The unit file of the peer service.
fn unit_text(exe: &Path, config: &Path, token: &Path, system: bool, memory_max: &str) -> String {
    let (socket, user_lines, wanted_by, token_arg) = if system {
        (
            SYSTEM_SOCKET.to_string(),
            // The token file stays root's; the service's own user reads it
            // as a credential.
            format!(
                "DynamicUser=yes\nRuntimeDirectory=bspweb\nStateDirectory=bspweb\nLoadCredential=peer-token:{}\n",
                systemd_quote(&token.display().to_string())
            ),
            "multi-user.target",
            " --token-file ${CREDENTIALS_DIRECTORY}/peer-token",
        )
    } else {
        (
            "%t/bspweb-peer.sock".to_string(),
            String::new(),
            "default.target",
            "",
        )
    };
    format!(
        "# Written by `bspweb peer install`; `bspweb peer uninstall` removes it.\n\
[Unit]\n\
Description=bspweb peer: donates this computer's idle time to BSP jobs\n\
After=network-online.target\n\
Wants=network-online.target\n\
\n\
[Service]\n\
Type=simple\n\
ExecStart={exe} peer --config {config} --control-socket {socket}{token_arg}\n\
{user_lines}\
# Compiled programs, kept across restarts ($CACHE_DIRECTORY).\n\
CacheDirectory=bspweb\n\
Environment=BSPWEB_LOG=info\n\
Restart=on-failure\n\
RestartSec=10s\n\
# 7: the supernode refuses this peer (its token was revoked, or the peer\n\
# disabled); restarting would not change that.\n\
RestartPreventExitStatus=7\n\
# Only idle time: the lowest CPU and I/O priority, a memory ceiling.\n\
Nice=19\n\
CPUWeight=1\n\
IOSchedulingClass=idle\n\
MemoryMax={memory_max}\n\
# SIGTERM drains: the supernode moves the processes away first.\n\
KillSignal=SIGTERM\n\
TimeoutStopSec=90s\n\
\n\
[Install]\n\
WantedBy={wanted_by}\n",
        exe = systemd_quote(&exe.display().to_string()),
        config = systemd_quote(&config.display().to_string()),
    )
}

/// A path as one word of an `ExecStart=` line.
fn systemd_quote(s: &str) -> String {
    if s.chars()
        .any(|c| c.is_whitespace() || c == '"' || c == '\\' || c == '%')
    {
        format!(
            "\"{}\"",
            s.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('%', "%%")
        )
    } else {
        s.to_string()
    }
}

fn is_root() -> bool {
    bspweb_peer::daemon::is_root()
}

fn unit_dir(s: &ServiceArgs) -> PathBuf {
    match (&s.unit_dir, s.system) {
        (Some(d), _) => d.clone(),
        (None, true) => PathBuf::from("/etc/systemd/system"),
        (None, false) => std::env::var_os("XDG_CONFIG_HOME")
            .filter(|d| !d.is_empty())
            .map_or_else(|| home().join(".config"), PathBuf::from)
            .join("systemd/user"),
    }
}

/// `systemctl [--user] ARGS`, failing with what to do.
fn systemctl(system: bool, args: &[&str]) -> anyhow::Result<()> {
    let mut cmd = std::process::Command::new("systemctl");
    if !system {
        cmd.arg("--user");
    }
    let shown = format!(
        "systemctl {}{}",
        if system { "" } else { "--user " },
        args.join(" ")
    );
    let status = cmd.args(args).status().map_err(|e| {
        anyhow::anyhow!(
            "cannot run `{shown}` ({e}): is systemd installed? Without it, run `bspweb peer --config FILE` from your own supervisor (install --no-start writes the files only)"
        )
    })?;
    if !status.success() {
        bail!(
            "`{shown}` failed ({status}); the unit file is in place, fix the cause and run it again"
        );
    }
    Ok(())
}

fn install(a: InstallArgs) -> anyhow::Result<ExitCode> {
    let system = a.service.system;
    if system && !is_root() && !a.service.no_start {
        return Err(usage(
            "--system installs for the whole machine: run it as root (sudo), or install for your user with --user",
        ));
    }
    if let Some(c) = &a.cluster
        && !bsp_api::control::valid_named_cluster(c)
    {
        return Err(usage(format!(
            "--cluster must be {}, not `{c}`",
            bsp_api::control::NAMED_CLUSTER_RULE
        )));
    }
    let config = a.config.clone().unwrap_or_else(|| {
        if system {
            PathBuf::from("/etc/bspweb/peer.toml")
        } else {
            default_config()
        }
    });
    if config.exists() && !a.force {
        return Err(coded(
            exit::ERROR,
            format!(
                "{} exists already; edit it, or give --force to replace it",
                config.display()
            ),
        ));
    }
    let exe = std::env::current_exe().context("cannot tell where the bspweb binary is")?;
    let exe = exe.canonicalize().unwrap_or(exe);
    let config = if config.is_absolute() {
        config
    } else {
        std::env::current_dir()?.join(config)
    };
    let token = read_token(a.token_file.as_deref(), a.token.as_deref())?
        .ok_or_else(|| usage(format!("an enrollment token is needed: {HOW_TO_ENROLL}")))?;
    let token_path = config.with_file_name("peer.token");
    let mut settings = toml::Table::new();
    settings.insert("supernode".into(), a.supernode.clone().into());
    if let Some(fp) = a.supernode_fingerprint {
        settings.insert("supernode-fingerprint".into(), fp.to_string().into());
    }
    if let Some(ca) = &a.ca_cert {
        // Checked now, so a bad file fails the install, not the service.
        bsp_api::client::TlsOptions::new()
            .with_ca_file(ca)
            .map_err(|e| usage(format!("--ca-cert: {e}")))?;
        let ca = std::path::absolute(ca)?;
        settings.insert("ca-cert".into(), ca.display().to_string().into());
    }
    if !system {
        // A system service reads it as a credential (see `unit_text`).
        settings.insert("token-file".into(), token_path.display().to_string().into());
    }
    if let Some(n) = &a.name {
        settings.insert("name".into(), n.clone().into());
    }
    if let Some(p) = a.cpu_percent {
        settings.insert("cpu-percent".into(), i64::from(p).into());
    }
    if !a.run_between.is_empty() {
        let windows: Vec<toml::Value> =
            a.run_between.iter().map(|w| w.to_string().into()).collect();
        settings.insert("run-between".into(), windows.into());
    }
    if let Some(m) = a.memory_budget_mib {
        settings.insert(
            "memory-budget-mib".into(),
            i64::try_from(m).unwrap_or(i64::MAX).into(),
        );
    }
    if let Some(c) = &a.cluster {
        settings.insert("cluster".into(), c.clone().into());
    }
    if let Some(l) = a.listen {
        settings.insert("listen".into(), l.to_string().into());
    }
    if let Some(ad) = &a.advertise {
        settings.insert("advertise".into(), ad.clone().into());
    }
    let body = format!(
        "# Settings of `bspweb peer` (keys: the flags of `bspweb peer --help`).\n# Written by `bspweb peer install`; restart the service after editing:\n#   systemctl {}restart {UNIT}\n{}",
        if system { "" } else { "--user " },
        toml::to_string(&settings).context("cannot write the settings")?
    );
    if let Some(dir) = config.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&config, body).with_context(|| format!("cannot write {}", config.display()))?;
    crate::cli_client::write_private(&token_path, format!("{}\n", token.0).as_bytes())
        .with_context(|| format!("cannot write {}", token_path.display()))?;
    let memory_max = match a.memory_budget_mib {
        Some(m) if m > 0 => format!("{}M", m + m / 4),
        _ => "60%".to_string(),
    };
    let dir = unit_dir(&a.service);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let unit = dir.join(UNIT);
    std::fs::write(
        &unit,
        unit_text(&exe, &config, &token_path, system, &memory_max),
    )
    .with_context(|| format!("cannot write {}", unit.display()))?;
    println!(
        "wrote {}, {} and {}",
        config.display(),
        token_path.display(),
        unit.display()
    );
    let user = if system { "" } else { "--user " };
    if a.service.no_start {
        println!(
            "start it with: systemctl {user}daemon-reload && systemctl {user}enable --now {UNIT}"
        );
        return Ok(ExitCode::SUCCESS);
    }
    systemctl(system, &["daemon-reload"])?;
    systemctl(system, &["enable", "--now", UNIT])?;
    println!("the peer runs now and starts with the machine");
    if !system {
        println!(
            "(to keep it running while you are logged out: loginctl enable-linger {})",
            std::env::var("USER").unwrap_or_else(|_| "$USER".into())
        );
    }
    let sys = if system { " --system" } else { "" };
    println!("see it with `bspweb peer status{sys}`; pause it with `bspweb peer pause{sys}`");
    Ok(ExitCode::SUCCESS)
}

fn uninstall(s: &ServiceArgs) -> anyhow::Result<ExitCode> {
    if s.system && !is_root() && !s.no_start {
        return Err(usage("--system: run it as root (sudo)"));
    }
    let unit = unit_dir(s).join(UNIT);
    if !s.no_start {
        // Stops it (SIGTERM: it drains first); a unit that is not loaded is fine.
        let _ = systemctl(s.system, &["disable", "--now", UNIT]);
    }
    match std::fs::remove_file(&unit) {
        Ok(()) => println!("removed {}", unit.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(coded(
                exit::NOT_FOUND,
                format!("{} is not there: nothing to uninstall", unit.display()),
            ));
        }
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", unit.display())),
    }
    if !s.no_start {
        systemctl(s.system, &["daemon-reload"])?;
    }
    println!(
        "its settings stay in {}; delete them by hand if you like",
        default_config().display()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_without_a_peer_points_at_the_sockets_that_have_one() {
        let dir = tempfile::tempdir().unwrap();
        let none = dir.path().join("no-system.sock");
        assert_eq!(other_sockets(dir.path(), &none), "");
        assert_eq!(other_sockets(&dir.path().join("missing"), &none), "");
        for name in [
            "peer-local-1.sock",
            "peer-local-0.sock",
            "bspweb.sqlite3",
            "peer-local-x.log",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let hint = other_sockets(dir.path(), &none);
        let zero = dir.path().join("peer-local-0.sock");
        assert!(
            hint.contains(&format!("bspweb peer status --socket {}", zero.display()))
                && hint.contains("(and 1 more)")
                && !hint.contains("--system"),
            "{hint}"
        );
        let system = dir.path().join("bspweb.sqlite3");
        assert!(other_sockets(dir.path(), &system).ends_with("`bspweb peer status --system`"));
    }

    #[test]
    fn a_settings_file_becomes_flags_the_command_line_overrides() {
        let text = r#"
            supernode = "http://sn:7878"
            cpu-percent = 50
            run-between = ["22:00-07:00", "12:00-13:00"]
            no-control-socket = true
            speed = 1.5
        "#;
        let mut args = config_args(text, &["speed".to_string()]).unwrap();
        args.sort();
        let mut want: Vec<String> = [
            "--supernode",
            "http://sn:7878",
            "--cpu-percent",
            "50",
            "--run-between",
            "22:00-07:00",
            "--run-between",
            "12:00-13:00",
            "--no-control-socket",
        ]
        .map(String::from)
        .to_vec();
        want.sort();
        assert_eq!(args, want);
        let e = config_args("supernod = \"x\"", &[]).unwrap_err();
        assert!(
            e.contains("unknown setting `supernod`") && e.contains("supernode"),
            "{e}"
        );
        assert!(config_args("config = \"x\"", &[]).is_err());
        assert!(
            config_args("name = { a = 1 }", &[])
                .unwrap_err()
                .contains("must be a string")
        );
        assert!(
            config_args("supernode = ", &[])
                .unwrap_err()
                .contains("not valid TOML")
        );
    }

    #[test]
    fn a_running_peer_gets_one_io_thread_unless_told_otherwise() {
        #[derive(clap::Parser)]
        struct Bspweb {
            #[command(flatten)]
            peer: PeerArgs,
        }
        use clap::Parser;
        let parse = |a: &[&str]| Bspweb::try_parse_from(a).map(|b| b.peer);
        let peer = parse(&["peer", "--supernode", "http://sn:7878"]).unwrap();
        assert_eq!(peer.io_threads(), Some(1));
        let peer = parse(&["peer", "--supernode", "x", "--io-threads", "3"]).unwrap();
        assert_eq!(peer.io_threads(), Some(3));
        assert_eq!(parse(&["peer", "status"]).unwrap().io_threads(), None);
        for bad in ["0", "257", "two"] {
            let e = parse(&["peer", "--supernode", "x", "--io-threads", bad])
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("--io-threads"), "{bad}: {e}");
        }
        let args = config_args("io-threads = 2", &[]).unwrap();
        assert_eq!(args, ["--io-threads", "2"]);
    }

    #[test]
    fn only_running_a_peer_reads_the_settings_file() {
        let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert!(runs_a_peer(&args(&["bspweb", "peer", "--supernode", "x"])));
        assert!(runs_a_peer(&args(&["bspweb", "peer"])));
        for sub in ["status", "pause", "resume", "install", "uninstall", "help"] {
            assert!(!runs_a_peer(&args(&["bspweb", "peer", sub])), "{sub}");
        }
        assert!(!runs_a_peer(&args(&["bspweb", "jobs"])));
        // A file given with --config must exist.
        let e = with_config_file(args(&[
            "bspweb",
            "peer",
            "--config",
            "/nonexistent/peer.toml",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/peer.toml"), "{e}");
    }

    #[test]
    fn the_unit_runs_at_idle_priority_and_drains_on_stop() {
        let unit = unit_text(
            Path::new("/opt/my apps/bspweb"),
            Path::new("/home/v/.config/bspweb/peer.toml"),
            Path::new("/home/v/.config/bspweb/peer.token"),
            false,
            "60%",
        );
        assert!(unit.contains("ExecStart=\"/opt/my apps/bspweb\" peer --config /home/v/.config/bspweb/peer.toml --control-socket %t/bspweb-peer.sock\n"), "{unit}");
        for line in [
            "Nice=19",
            "CPUWeight=1",
            "IOSchedulingClass=idle",
            "MemoryMax=60%",
            "Restart=on-failure",
            "RestartPreventExitStatus=7",
            "KillSignal=SIGTERM",
            "WantedBy=default.target",
        ] {
            assert!(unit.lines().any(|l| l == line), "{line} in\n{unit}");
        }
        let system = unit_text(
            Path::new("/usr/bin/bspweb"),
            Path::new("/etc/bspweb/peer.toml"),
            Path::new("/etc/bspweb/peer.token"),
            true,
            "2560M",
        );
        assert!(
            system.contains("DynamicUser=yes")
                && system.contains(SYSTEM_SOCKET)
                && system.contains("WantedBy=multi-user.target")
                && system.contains("LoadCredential=peer-token:/etc/bspweb/peer.token\n")
                && system.contains("--token-file ${CREDENTIALS_DIRECTORY}/peer-token\n"),
            "{system}"
        );
    }
}
