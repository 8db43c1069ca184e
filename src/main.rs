//! `bspweb`: the one user-facing binary.
//!
//! `bspweb up` runs a supernode with local peers; `bspweb supernode` and
//! `bspweb peer` run one of each; the other subcommands are the client.

mod accounts;
mod cc;
mod cli_client;
mod cluster_sim_cmd;
mod local;
mod peer_cmd;
mod sim_cmd;
mod token_cmd;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "bspweb",
    version,
    about = "Run bulk-synchronous parallel programs on donated computers",
    long_about = "Run bulk-synchronous parallel (BSP) programs, compiled to WebAssembly, \
on computers that volunteers donate.\n\nQuick start: `bspweb up` in one terminal, then \
`bspweb submit ring -n 8 --follow` in another.",
    after_long_help = cli_client::EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a supernode and N local peers in one command (embedded defaults)
    #[command(long_about = UP_ABOUT)]
    Up(UpArgs),
    /// Run a supernode
    #[command(long_about = SUPERNODE_ABOUT)]
    Supernode(SupernodeArgs),
    /// Run a peer that donates this machine's idle time to a supernode; or
    /// install it as a service, or show, pause or resume the running one
    #[command(long_about = peer_cmd::PEER_ABOUT)]
    Peer(Box<peer_cmd::PeerArgs>),
    /// Log in and remember the session for later commands
    #[command(after_long_help = cli_client::EXIT_CODES)]
    Login(LoginArgs),
    /// Submit a job: a registered program name or a `.wasm` file
    #[command(after_long_help = cli_client::EXIT_CODES)]
    Submit(cli_client::SubmitArgs),
    /// List your jobs
    #[command(after_long_help = cli_client::EXIT_CODES)]
    Jobs(cli_client::JobsArgs),
    /// Show a job's output and events
    #[command(after_long_help = cli_client::EXIT_CODES)]
    Logs(cli_client::LogsArgs),
    /// Kill a waiting or running job
    #[command(after_long_help = cli_client::EXIT_CODES)]
    Kill(cli_client::JobRef),
    /// Delete a finished job and its output
    #[command(after_long_help = cli_client::EXIT_CODES)]
    Dispose(cli_client::JobRef),
    /// Upload a `.wasm` program, optionally under a name
    #[command(after_long_help = cli_client::EXIT_CODES)]
    Upload(cli_client::UploadArgs),
    /// List the programs you can run
    #[command(after_long_help = cli_client::EXIT_CODES)]
    Programs(cli_client::ListArgs),
    /// List the peers of the supernode
    #[command(after_long_help = cli_client::EXIT_CODES)]
    Peers(cli_client::PeersArgs),
    /// Enrollment tokens for the peers you donate: create, list, revoke
    #[command(subcommand, after_long_help = cli_client::EXIT_CODES)]
    Token(token_cmd::TokenCommand),
    /// Manage accounts (administrators): add, list, passwd, disable, enable, set
    #[command(subcommand, after_long_help = cli_client::EXIT_CODES)]
    User(accounts::UserCommand),
    /// Change your own password (your other logins end; this CLI stays logged in)
    #[command(after_long_help = cli_client::EXIT_CODES)]
    Passwd(accounts::OwnPasswdArgs),
    /// Simulate the load balancers of dissertation ch. 4 and write a report
    Sim(sim_cmd::SimArgs),
    /// Compile C (BSPlib) programs to a bspweb module: `bspweb cc prog.c -o prog.wasm`
    Cc(cc::CcArgs),
    /// Run the clustering DiDiC (dissertation ch. 5) against MCL on
    /// generated peer networks and write a report
    ClusterSim(cluster_sim_cmd::ClusterSimArgs),
}

const UP_ABOUT: &str = "Start a supernode and N local peers in one command (embedded defaults).

It serves the REST API and the web UI on --listen, registers the example \
programs, and creates a first user: BSPWEB_USER (default `bspweb`) with the \
password BSPWEB_PASSWORD, or one generated once and kept in the data \
directory, printed at every start. It then logs the CLI in as that user, \
replacing the saved CLI session (in $BSPWEB_CONFIG_DIR, else \
$XDG_CONFIG_HOME/bspweb, else ~/.config/bspweb). Peers log to files in the \
data directory; a local peer that stops is restarted within a second. \
Ctrl-C stops everything; the database keeps users, programs and finished \
jobs for the next start.";

#[derive(Args)]
pub struct UpArgs {
    /// Number of local peers to start
    #[arg(long, default_value_t = 4)]
    peers: usize,
    /// Address of the supernode's HTTP listener (API and web UI)
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: SocketAddr,
    /// Directory for the database, logs and secrets [default: ~/.local/share/bspweb]
    #[arg(long)]
    data: Option<PathBuf>,
    /// Lease time-to-live of peers, in seconds
    #[arg(long, default_value_t = 15)]
    lease_ttl_secs: u64,
    /// Make every local peer report the idle fraction read from this file
    /// (a number in [0, 1], re-read at each renewal) instead of measuring
    /// the CPU: for demos and tests on a busy machine
    #[arg(long)]
    idle_file: Option<PathBuf>,
    /// Time between two steps of the clustering of the peers' measured
    /// links, in milliseconds (as for `bspweb supernode`)
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    cluster_step_ms: u64,
    /// The most memory the local peers together may use for bspweb, in
    /// MiB, shared equally among them (each peer's `--memory-budget-mib`):
    /// a job that would take a peer past its share fails, saying so,
    /// instead of the machine running out [default: half the machine's
    /// memory; 0: no budget]
    #[arg(long)]
    memory_budget_mib: Option<u64>,
}

const SUPERNODE_ABOUT: &str =
    "Run a supernode: the REST API, the web UI and the peers' control plane on one listener.

On a loopback address (the default, 127.0.0.1:7878) it serves plain HTTP \
unless --tls or --tls-cert is given. On any other address it always serves \
HTTPS: with --tls-cert/--tls-key, or with a self-signed certificate it makes \
at first start and keeps in DATA/tls/ (cert.pem, key.pem). At every start it \
prints the certificate's SHA-256 fingerprint; clients and peers pin it \
(--supernode-fingerprint sha256:…, or BSPWEB_SUPERNODE_FINGERPRINT), or \
verify a CA-signed certificate by its CA.";

#[derive(Args)]
pub struct SupernodeArgs {
    /// Address of the listener (API and web UI); a non-loopback address is
    /// always served over HTTPS
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: SocketAddr,
    /// Serve HTTPS also on a loopback address (with --tls-cert/--tls-key,
    /// or a self-signed certificate kept in DATA/tls/)
    #[arg(long)]
    tls: bool,
    /// The TLS certificate chain (PEM, leaf first) to serve instead of a
    /// self-signed one; needs --tls-key
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The TLS certificate's private key (PEM); needs --tls-cert
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A DNS name (or IP address) the self-signed certificate is also made
    /// for, besides the listen address, localhost, 127.0.0.1 and ::1
    /// (repeatable; a new name makes a new certificate)
    #[arg(long, value_name = "NAME")]
    tls_name: Vec<String>,
    /// Directory for the database and secrets [default: ~/.local/share/bspweb]
    #[arg(long)]
    data: Option<PathBuf>,
    /// Keep the state in this PostgreSQL database instead of SQLite in
    /// DATA: postgres://USER:PASSWORD@HOST:PORT/DATABASE. Several
    /// supernodes may share one (docs/deployment.md)
    #[arg(
        long,
        value_name = "URL",
        env = "BSPWEB_DATABASE",
        hide_env_values = true
    )]
    database: Option<String>,
    /// Lease time-to-live of peers, in seconds
    #[arg(long, default_value_t = 15)]
    lease_ttl_secs: u64,
    /// Processes per online core before new jobs wait in the ready queue
    #[arg(long, default_value_t = 4.0)]
    overload_factor: f64,
    /// Do not register the bundled example programs
    #[arg(long)]
    no_examples: bool,
    /// Relative change of a peer's power (speed × idle) that re-weights it
    /// in the placement table and migrates processes (0.25 = 25 %)
    #[arg(long, default_value_t = 0.25)]
    power_hysteresis: f64,
    /// Shortest time between two migrations of one job, in milliseconds
    #[arg(long, default_value_t = 5000)]
    migration_interval_ms: u64,
    /// Time between two steps of the clustering of the peers' measured
    /// links (DiDiC), in milliseconds; a peer's found cluster is shown
    /// after 30 steps
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    cluster_step_ms: u64,
    /// Open HTTP connections at most; at the limit, new clients wait to be
    /// accepted
    #[arg(long, default_value_t = 2048)]
    max_connections: usize,
    /// Open HTTP connections from one IP address at most; more are closed
    #[arg(long, default_value_t = 256)]
    max_connections_per_address: usize,
    /// Seconds for a request's headers to arrive (and for an idle
    /// keep-alive connection to send its next request)
    #[arg(long, default_value_t = 20)]
    header_timeout_secs: u64,
    /// Output the jobs of one user may store, in MiB (finished jobs count
    /// until they are disposed of; 0: no quota); a job that would exceed it
    /// fails
    #[arg(long, default_value_t = 4096)]
    user_storage_mib: u64,
    /// Processes one user's active jobs may run at once, for accounts
    /// without a quota of their own (0: no limit); a job that would exceed
    /// it waits
    #[arg(long, default_value_t = 0)]
    user_max_processes: u32,
    /// Programs one user may store, for accounts without a quota of their
    /// own (0: no limit)
    #[arg(long, default_value_t = 1000)]
    user_max_programs: u32,
    /// Do not serve GET /metrics (Prometheus text format: job, peer,
    /// superstep, checkpoint, restore and migration counts, no names; open
    /// like /api/v1/health)
    #[arg(long)]
    no_metrics: bool,
    /// Stop when standard input closes (for supervisors and tests)
    #[arg(long, hide = true)]
    exit_on_stdin_eof: bool,
}

#[derive(Args)]
struct LoginArgs {
    /// Supernode URL (or several, separated by commas, of supernodes
    /// sharing one database: the next is used when one does not answer)
    #[arg(long, env = "BSPWEB_URL", default_value = cli_client::DEFAULT_URL)]
    url: String,
    /// User name
    #[arg(long, env = "BSPWEB_USER")]
    user: String,
    /// Accept exactly the supernode certificate with this SHA-256
    /// fingerprint (`sha256:…`, as the supernode prints it at start) and no
    /// other; saved with the session for later commands
    #[arg(long, env = "BSPWEB_SUPERNODE_FINGERPRINT", value_name = "sha256:HEX")]
    supernode_fingerprint: Option<bsp_api::tls::Fingerprint>,
    /// Also trust the CA certificate(s) in this PEM file for an https://
    /// supernode (besides Mozilla's roots); saved with the session
    #[arg(long, env = "BSPWEB_CA_CERT", value_name = "FILE")]
    ca_cert: Option<PathBuf>,
}

fn init_tracing(default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("BSPWEB_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only on a terminal: a log redirected to a file stays plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}

/// A client command whose output goes to a pipe that closed (`bspweb jobs
/// | head -3`) ends quietly, killed by SIGPIPE as Unix tools are, instead of
/// panicking at its next `println!` (Rust ignores SIGPIPE). Its TCP
/// connections are unaffected (std writes to them with `MSG_NOSIGNAL`).
/// Daemons keep ignoring it, and so does `bspweb peer` with its
/// subcommands, which talk to the running peer over a Unix socket (plain
/// `write`): a closed socket must be an error message, not a silent death.
#[cfg(unix)]
fn die_quietly_on_a_closed_pipe() {
    // SAFETY: called at the start of `main`, before any other thread exists;
    // SIG_DFL installs no handler, so no Rust code runs in a signal context.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn die_quietly_on_a_closed_pipe() {}

fn main() -> ExitCode {
    // `bspweb peer` reads its settings file into flags first.
    let args = match peer_cmd::with_config_file(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(cli_client::exit_code(&e));
        }
    };
    let cli = Cli::parse_from(args);
    if !matches!(
        &cli.command,
        Command::Up(_) | Command::Supernode(_) | Command::Peer(_)
    ) {
        die_quietly_on_a_closed_pipe();
    }
    if let Command::Peer(a) = &cli.command
        && let Some(nice) = a.niceness()
    {
        // Before the async runtime starts its threads.
        bspweb_peer::sysinfo::use_one_allocator_arena();
        // Every thread of the peer inherits this thread's niceness: its
        // checkpoint, replica and network work yields to the volunteer's
        // programs as its guests do (and its time counts as niced, which
        // the idle estimate does not count as busy). Threads niced at
        // least as much as guests may run short supersteps themselves.
        if let Err(e) = bspweb_peer::runtime::nice_thread_at_least(nice) {
            eprintln!("warning: could not lower the peer's priority to niceness {nice}: {e}");
        }
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Command::Peer(a) = &cli.command
        && let Some(n) = a.io_threads()
    {
        // A peer's async work is latency-bound message passing: on one
        // worker, a superstep's frames and wake-ups stay on one thread
        // instead of being stolen across threads (docs/benchmarks.md).
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Daemons log at info; client commands only warn.
    init_tracing(match cli.command {
        Command::Up(_) => "warn,bspweb_supernode=info",
        Command::Supernode(_) | Command::Peer(_) => "info",
        _ => "warn",
    });
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Up(a) => local::up(a).await,
            Command::Supernode(a) => local::supernode(a).await,
            Command::Peer(a) => peer_cmd::peer(*a).await,
            Command::Login(a) => {
                let tls =
                    cli_client::SessionTls::new(a.supernode_fingerprint, a.ca_cert.as_deref());
                cli_client::login(&a.url, &a.user, tls).await
            }
            Command::Submit(a) => cli_client::submit(a).await,
            Command::Jobs(a) => cli_client::jobs(a).await,
            Command::Logs(a) => cli_client::logs(a).await,
            Command::Kill(a) => cli_client::kill(a).await,
            Command::Dispose(a) => cli_client::dispose(a).await,
            Command::Upload(a) => cli_client::upload(a).await,
            Command::Programs(a) => cli_client::programs(a).await,
            Command::Peers(a) => cli_client::peers(a).await,
            Command::User(c) => accounts::user(c).await,
            Command::Token(c) => token_cmd::token(c).await,
            Command::Passwd(a) => accounts::passwd(a).await,
            Command::Sim(a) => sim_cmd::run(a),
            Command::Cc(a) => cc::main(a).map(|()| ExitCode::SUCCESS),
            Command::ClusterSim(a) => cluster_sim_cmd::run(a),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(cli_client::exit_code(&e))
        }
    }
}
