//! `bspweb up`, `bspweb supernode` and `bspweb peer`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use bsp_api::client::Client;
use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::cli_client::{Session, home, save_session, write_private};
use crate::peer_cmd::PeerRunArgs;
use crate::{SupernodeArgs, UpArgs};

pub(crate) fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(d).join("bspweb");
    }
    home().join(".local").join("share").join("bspweb")
}

/// Credentials `bspweb up` generated, kept so a restart can print them again.
#[derive(Serialize, Deserialize)]
struct SavedCredentials {
    user: String,
    password: String,
}

async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            anyhow::anyhow!(
                "cannot listen on {addr}: the address is in use; is another bspweb supernode running? choose another with --listen"
            )
        } else {
            anyhow::anyhow!("cannot listen on {addr}: {e}")
        }
    })
}

fn open_supernode(
    data: &Path,
    lease_ttl_secs: u64,
    overload_factor: f64,
    public_url: String,
    adjust: impl FnOnce(&mut bspweb_supernode::Config),
) -> anyhow::Result<bspweb_supernode::Supernode> {
    if lease_ttl_secs == 0 {
        bail!("--lease-ttl-secs must be at least 1");
    }
    let mut config = bspweb_supernode::Config {
        data_dir: data.to_path_buf(),
        lease_ttl: Duration::from_secs(lease_ttl_secs),
        overload_factor,
        public_url: Some(public_url),
        ..bspweb_supernode::Config::default()
    };
    adjust(&mut config);
    let place = match &config.database {
        Some(_) => "its PostgreSQL database".to_string(),
        None => data.display().to_string(),
    };
    bspweb_supernode::Supernode::open(config)
        .with_context(|| format!("cannot open the supernode's state in {place}"))
}

async fn register_examples(
    node: &bspweb_supernode::Supernode,
    data: &Path,
) -> anyhow::Result<usize> {
    let mut n = 0;
    for p in bspweb_programs::builtin() {
        node.register_builtin(p.name, p.description, p.wasm)
            .await
            .with_context(|| format!("cannot register the example program {}", p.name))?;
        n += 1;
    }
    // The C examples need the C toolchain (`bspweb cc`); compiled once,
    // then kept in the user's cache (or the data directory).
    let cache = crate::cc::example_cache_dirs(data);
    let compiled = tokio::task::spawn_blocking(move || {
        crate::cc::EXAMPLES
            .iter()
            .map(|(name, description, source)| {
                (
                    *name,
                    *description,
                    crate::cc::cached_example(&cache, name, source),
                )
            })
            .collect::<Vec<_>>()
    })
    .await?;
    for (name, description, wasm) in compiled {
        match wasm {
            Ok(wasm) => {
                node.register_builtin(name, description, &wasm)
                    .await
                    .with_context(|| format!("cannot register the example program {name}"))?;
                n += 1;
            }
            Err(e) => {
                eprintln!("note: the C example {name} is not registered: {e:#}");
                break;
            }
        }
    }
    Ok(n)
}

/// Make sure the first user exists; returns its name and password.
async fn ensure_user(
    node: &bspweb_supernode::Supernode,
    data: &Path,
) -> anyhow::Result<(String, String)> {
    let user = std::env::var("BSPWEB_USER").unwrap_or_else(|_| "bspweb".to_string());
    let saved_path = data.join("credentials.json");
    let password = match std::env::var("BSPWEB_PASSWORD") {
        Ok(p) => p,
        Err(_) => {
            let saved: Option<SavedCredentials> = std::fs::read(&saved_path)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            match saved {
                Some(s) if s.user == user => s.password,
                _ => {
                    let mut bytes = [0u8; 18];
                    rand::rng().fill_bytes(&mut bytes);
                    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
                }
            }
        }
    };
    if node.check_password(&user, &password).await?.is_some() {
        return Ok((user, password));
    }
    match node
        .create_user(&user, &password, bsp_api::rest::Role::Admin)
        .await
    {
        Ok(_) => {}
        Err(e) => bail!(
            "user {user} exists with a different password ({e}); set BSPWEB_PASSWORD to its password, or choose another BSPWEB_USER"
        ),
    }
    if std::env::var("BSPWEB_PASSWORD").is_err() {
        let creds = SavedCredentials {
            user: user.clone(),
            password: password.clone(),
        };
        write_private(&saved_path, &serde_json::to_vec_pretty(&creds)?)?;
    }
    Ok((user, password))
}

/// How often `bspweb up` tries again to start a local peer the supernode
/// refused (one disabled from the web UI, say).
const REFUSED_RETRY: Duration = Duration::from_secs(30);

/// The enrollment token of `bspweb up`'s local peers: the one kept in the
/// data directory while the supernode still admits it, else a new one of
/// `user`'s.
async fn local_enrollment(
    node: &bspweb_supernode::Supernode,
    data: &Path,
    user: &str,
) -> anyhow::Result<bsp_api::control::EnrollmentToken> {
    let path = data.join("local-peers.token");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let token = bsp_api::control::EnrollmentToken(text.trim().to_string());
        if node.admits(&token).await? {
            return Ok(token);
        }
    }
    let created = node
        .create_enrollment(user, "local peers of bspweb up")
        .await
        .context("cannot enroll the local peers")?;
    crate::cli_client::write_private(&path, format!("{}\n", created.token.0).as_bytes())?;
    Ok(created.token)
}

/// What every local peer of `bspweb up` is started with.
struct LocalPeers {
    exe: PathBuf,
    url: String,
    idle_file: Option<PathBuf>,
    data: PathBuf,
    token: bsp_api::control::EnrollmentToken,
    budget_mib: u64,
}

impl LocalPeers {
    /// The command that starts local peer `i`. Its stdin is a pipe that
    /// `up` holds and never writes: when `up` ends in any way (even
    /// SIGKILL), the pipe closes and the peer stops (`--exit-on-stdin-eof`;
    /// its drain request fails at once without a supernode).
    fn command(&self, i: usize) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.args(["peer", "--supernode", &self.url, "--listen", "127.0.0.1:0"])
            // In the environment, not the process list.
            .env("BSPWEB_PEER_TOKEN", &self.token.0)
            .args(["--name", &format!("local-{i}")])
            // Each its own control socket: `bspweb peer status --socket DATA/peer-local-I.sock`.
            .arg("--control-socket")
            .arg(self.data.join(format!("peer-local-{i}.sock")))
            .arg("--exit-on-stdin-eof")
            // Its share of the machine: every local peer budgeting half of it
            // would let them together run the machine out of memory.
            .args(["--memory-budget-mib", &self.budget_mib.to_string()])
            // One compile cache for the machine's peers, kept with the data: a
            // program compiled once is read back by the others and after `up`
            // restarts.
            .arg("--compile-cache")
            .arg(self.data.join("compiled"))
            .stdin(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(f) = &self.idle_file {
            cmd.arg("--idle-file").arg(f);
        }
        cmd
    }
}

/// Each local peer's memory budget in MiB: an equal share of `total` (by
/// default half the machine's memory), at least 1 MiB; 0 (no budget) stays
/// 0.
fn peer_budget_mib(total: Option<u64>, peers: usize) -> u64 {
    let total = total.unwrap_or_else(|| bspweb_peer::budget::default_limit() >> 20);
    if total == 0 {
        return 0;
    }
    (total / peers.max(1) as u64).max(1)
}

pub async fn up(args: UpArgs) -> anyhow::Result<ExitCode> {
    let UpArgs {
        peers,
        listen,
        data,
        lease_ttl_secs,
        idle_file,
        cluster_step_ms,
        memory_budget_mib,
    } = args;
    let budget_mib = peer_budget_mib(memory_budget_mib, peers);
    // From the start: a SIGTERM while it starts stops it like one later
    // (the default action would end it at once, its peers without a word).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let data = data.unwrap_or_else(default_data_dir);
    std::fs::create_dir_all(&data)
        .with_context(|| format!("cannot create the data directory {}", data.display()))?;
    let listener = bind(listen).await?;
    let addr = listener.local_addr()?;
    let url = format!("http://{addr}");
    let node = open_supernode(&data, lease_ttl_secs, 4.0, url.clone(), |c| {
        c.cluster_step = Duration::from_millis(cluster_step_ms);
    })?;
    let examples = register_examples(&node, &data).await?;
    let (user, password) = ensure_user(&node, &data).await?;
    let token = local_enrollment(&node, &data, &user).await?;

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(node.clone().serve(listener, async move {
        let _ = stop_rx.await;
    }));

    // The peers are separate OS processes, as a volunteer's would be.
    let local = LocalPeers {
        exe: std::env::current_exe().context("cannot find the bspweb executable")?,
        url: url.clone(),
        idle_file,
        data: data.clone(),
        token,
        budget_mib,
    };
    let logs = data.join("logs");
    std::fs::create_dir_all(&logs)?;
    let mut children = Vec::new();
    // Local peers the supernode refused, and when to try each again.
    let mut held_back: std::collections::HashMap<usize, Instant> = Default::default();
    for i in 0..peers {
        let log_path = logs.join(format!("peer-{i}.log"));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let child = local
            .command(i)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start a local peer")?;
        children.push((i, child, log_path));
    }

    let client = Client::login(&url, &user, &password).await?;
    let me = Client::login_full(&url, &user, &password).await?.1;
    let session = Session {
        url: url.clone(),
        user: user.clone(),
        token: me.token,
        expires_at: me.expires_at,
        // `up` serves plain HTTP on loopback: nothing to verify.
        tls: Default::default(),
    };
    let session_path = save_session(&session)?;

    // Show progress until the peers are online.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut online = 0;
    let mut stopped = false;
    while Instant::now() < deadline {
        online = client
            .peers()
            .await
            .map(|ps| ps.iter().filter(|p| p.state == "online").count())
            .unwrap_or(0);
        if online >= peers {
            break;
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => { stopped = true; break }
            _ = term.recv() => { stopped = true; break }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    if !stopped {
        println!("bspweb is up: supernode at {url} with {online} of {peers} local peers online");
        println!("  web UI and API:  {url}  (API under {url}/api/v1)");
        println!("  user:            {user}");
        println!("  password:        {password}");
        println!("  data directory:  {}", data.display());
        println!("  peer logs:       {}", logs.display());
        if peers > 0 {
            println!(
                "  peer status:     bspweb peer status --socket {}",
                data.join("peer-local-0.sock").display()
            );
        }
        println!(
            "  {examples} example programs registered; session saved in {}",
            session_path.display()
        );
        println!();
        println!("Try, in another terminal:");
        println!("  bspweb submit ring -n 8 --follow");
        println!("  bspweb submit sample-sort -n 8 --args '{{\"n\": 1000000}}' --follow");
        println!("Stop with Ctrl-C.");
        if online < peers {
            eprintln!(
                "warning: only {online} of {peers} peers came online; see the peer logs in {}",
                logs.display()
            );
        }
    }

    let mut server = server;
    if !stopped {
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                r = &mut server => {
                    match r {
                        Ok(Ok(())) => bail!("the supernode stopped unexpectedly"),
                        Ok(Err(e)) => return Err(e.context("the supernode failed")),
                        Err(e) => bail!("the supernode crashed: {e}"),
                    }
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    for (i, child, log) in children.iter_mut() {
                        if let Ok(Some(status)) = child.try_wait() {
                            // Refused by the supernode (disabled, say):
                            // restarting at once would only be refused again.
                            let refused = status.code() == Some(i32::from(crate::cli_client::exit::UNAUTHORIZED));
                            let now = Instant::now();
                            match (refused, held_back.get(i)) {
                                (true, None) => {
                                    eprintln!(
                                        "warning: the supernode refuses local peer {i} (disabled? `bspweb peers enable ID`); \
                                         trying again every {} s; see {}",
                                        REFUSED_RETRY.as_secs(),
                                        log.display()
                                    );
                                    held_back.insert(*i, now + REFUSED_RETRY);
                                    continue;
                                }
                                (true, Some(&at)) if now < at => continue,
                                (true, Some(_)) => {
                                    held_back.insert(*i, now + REFUSED_RETRY);
                                }
                                (false, _) => {
                                    held_back.remove(i);
                                    eprintln!("warning: local peer {i} stopped ({status}); see {}", log.display());
                                }
                            }
                            *child = local.command(*i)
                                .stdout(std::fs::File::options().append(true).open(&*log)?)
                                .stderr(std::fs::File::options().append(true).open(&*log)?)
                                .spawn()
                                .context("cannot restart a local peer")?;
                        }
                    }
                }
            }
        }
    }
    eprintln!("stopping…");
    for (_, child, _) in children.iter_mut() {
        let _ = child.start_kill();
    }
    for (_, child, _) in children.iter_mut() {
        let _ = child.wait().await;
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    Ok(ExitCode::SUCCESS)
}

pub async fn supernode(a: SupernodeArgs) -> anyhow::Result<ExitCode> {
    let data = a.data.clone().unwrap_or_else(default_data_dir);
    std::fs::create_dir_all(&data)
        .with_context(|| format!("cannot create the data directory {}", data.display()))?;
    let listener = bind(a.listen).await?;
    let addr = listener.local_addr()?;
    let tls = supernode_tls(&a, &data, addr)?;
    let url = format!("{}://{addr}", if tls.is_some() { "https" } else { "http" });
    let start_text = start_text(&url, tls.as_ref());
    let node = open_supernode(
        &data,
        a.lease_ttl_secs,
        a.overload_factor,
        url.clone(),
        |c| {
            c.power_hysteresis = a.power_hysteresis;
            c.migration_interval = Duration::from_millis(a.migration_interval_ms);
            c.cluster_step = Duration::from_millis(a.cluster_step_ms);
            c.http.max_connections = a.max_connections.max(1);
            c.http.max_connections_per_address = a.max_connections_per_address.max(1);
            c.http.header_timeout = Duration::from_secs(a.header_timeout_secs.max(1));
            c.user_storage_mib = a.user_storage_mib;
            c.metrics = !a.no_metrics;
            c.user_max_processes = a.user_max_processes;
            c.user_max_programs = a.user_max_programs;
            c.tls = tls;
            c.database = a.database.clone();
        },
    )?;
    if !a.no_examples {
        register_examples(&node, &data).await?;
    }
    if std::env::var("BSPWEB_USER").is_ok() {
        let (user, _) = ensure_user(&node, &data).await?;
        tracing::info!(%user, "user ready");
    }
    tracing::info!(%url, "supernode listening");
    // Supervisors and tests read the URL from the first line of stdout, and
    // the fingerprint from the next ones. One write, and no panic if
    // nobody reads (a supervisor may close the pipe after the first line).
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(start_text.as_bytes());
        let _ = out.flush();
    }
    node.serve(listener, shutdown_signal(a.exit_on_stdin_eof))
        .await?;
    Ok(ExitCode::SUCCESS)
}

/// The supernode's TLS: from `--tls-cert`/`--tls-key`; else self-signed in
/// `DATA/tls` when asked (`--tls`) or needed (a non-loopback address);
/// else none (plain HTTP on loopback).
fn supernode_tls(
    a: &SupernodeArgs,
    data: &Path,
    addr: SocketAddr,
) -> anyhow::Result<Option<bspweb_supernode::ServerTls>> {
    use bspweb_supernode::ServerTls;
    if let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) {
        return Ok(Some(ServerTls::from_pem_files(cert, key)?));
    }
    if !a.tls && addr.ip().is_loopback() {
        if !a.tls_name.is_empty() {
            bail!("--tls-name names the self-signed certificate: give --tls too");
        }
        return Ok(None);
    }
    let mut names = Vec::new();
    if !addr.ip().is_unspecified() && !addr.ip().is_loopback() {
        names.push(addr.ip().to_string());
    } else if addr.ip().is_unspecified() {
        // Any address of this machine: its host name at least.
        let host = bspweb_peer::host_name();
        if host != "peer" {
            names.push(host);
        }
    }
    names.extend(a.tls_name.iter().cloned());
    let dir = data.join("tls");
    ServerTls::self_signed(&dir, &names)
        .with_context(|| format!("cannot set up TLS in {}", dir.display()))
        .map(Some)
}

/// What `bspweb supernode` prints at start: its URL on the first line,
/// then how clients verify it.
fn start_text(url: &str, tls: Option<&bspweb_supernode::ServerTls>) -> String {
    use bspweb_supernode::CertificateSource;
    let mut text = format!("bspweb supernode listening on {url}\n");
    match tls {
        None => text.push_str(
            "plain HTTP on loopback only; use --tls (a self-signed certificate) or --tls-cert/--tls-key to serve HTTPS\n",
        ),
        Some(tls) => {
            let fp = tls.fingerprint();
            let what = match tls.source() {
                CertificateSource::Files => "certificate",
                CertificateSource::Generated => "self-signed certificate (made now)",
                CertificateSource::Reused => "self-signed certificate",
            };
            text.push_str(&format!(
                "TLS {what} {}\ncertificate fingerprint {fp}\n",
                tls.cert_path().display()
            ));
            text.push_str(&format!(
                "pin it: bspweb login --url {url} --supernode-fingerprint {fp}\n       bspweb peer --supernode {url} --supernode-fingerprint {fp}\n       (or BSPWEB_SUPERNODE_FINGERPRINT={fp}); a CA-signed certificate needs no pin\n"
            ));
        }
    }
    text
}

pub async fn peer(a: PeerRunArgs) -> anyhow::Result<ExitCode> {
    if let Some(c) = &a.cluster
        && !bsp_api::control::valid_named_cluster(c)
    {
        anyhow::bail!(
            "--cluster must be {}, not `{c}`",
            bsp_api::control::NAMED_CLUSTER_RULE
        );
    }
    let name = a.name.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "peer".to_string())
    });
    let Some(supernode) = a.supernode else {
        anyhow::bail!("--supernode URL is needed to run a peer");
    };
    let mut supernode_tls = bsp_api::client::TlsOptions {
        fingerprint: a.supernode_fingerprint,
        ca_certs: Vec::new(),
    };
    if let Some(ca) = &a.ca_cert {
        supernode_tls = supernode_tls
            .with_ca_file(ca)
            .map_err(|e| crate::cli_client::usage(format!("--ca-cert: {e}")))?;
    }
    let config = bspweb_peer::PeerConfig {
        supernode_tls,
        supernode,
        listen: a.listen,
        advertise: a.advertise,
        name,
        max_memory_mib: a.max_memory_mib,
        memory_budget_mib: a.memory_budget_mib,
        max_superstep_ms: a.max_superstep_secs.saturating_mul(1000),
        slots: a.slots.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        }),
        nice: a.nice,
        speed: a.speed,
        drain_timeout: Duration::from_secs(a.drain_timeout_secs),
        idle_file: a.idle_file,
        cluster: a.cluster,
        broadcast: bspweb_peer::relay::BroadcastPolicy {
            algorithm: a.broadcast,
            min_bytes: a.broadcast_min_kib.saturating_mul(1024),
            ..Default::default()
        },
        control_socket: if a.no_control_socket {
            None
        } else {
            Some(
                a.control_socket
                    .unwrap_or_else(bspweb_peer::daemon::default_socket),
            )
        },
        windows: a.run_between,
        cpu_percent: a.cpu_percent,
        probe_mib_per_hour: a.probe_mib_per_hour,
        compile_cache: a
            .compile_cache
            .or_else(bspweb_peer::runtime::compile_cache::default_root),
        compile_cache_mib: a.compile_cache_mib,
        token: Some(
            crate::peer_cmd::read_token(a.token_file.as_deref(), a.token.as_deref())?.ok_or_else(
                || {
                    crate::cli_client::usage(format!(
                        "no enrollment token: the supernode admits only enrolled peers; {}",
                        crate::peer_cmd::HOW_TO_ENROLL
                    ))
                },
            )?,
        ),
    };
    // The first Ctrl-C or SIGTERM drains the peer, a second one stops it at once.
    let stops = stop_requests(a.exit_on_stdin_eof);
    let (mut first, mut second) = (stops.clone(), stops);
    bspweb_peer::run(
        config,
        async move {
            let _ = first.wait_for(|n| *n >= 1).await;
        },
        async move {
            let _ = second.wait_for(|n| *n >= 2).await;
        },
    )
    .await
    .map_err(|e| match e.downcast::<bspweb_peer::Refused>() {
        // Its own exit status: a service does not restart it in vain.
        Ok(refused) => {
            crate::cli_client::coded(crate::cli_client::exit::UNAUTHORIZED, refused.to_string())
        }
        Err(e) => e,
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Counts stop requests: every Ctrl-C and SIGTERM, and (when asked) stdin
/// closing.
fn stop_requests(exit_on_stdin_eof: bool) -> tokio::sync::watch::Receiver<u32> {
    let (tx, rx) = tokio::sync::watch::channel(0u32);
    tokio::spawn(async move {
        let mut stdin_closed = Box::pin(shutdown_signal_stdin(exit_on_stdin_eof));
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        loop {
            let term_recv = async {
                match term.as_mut() {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                r = tokio::signal::ctrl_c() => {
                    if r.is_err() {
                        return;
                    }
                }
                () = term_recv => {}
                () = &mut stdin_closed => {
                    stdin_closed = Box::pin(shutdown_signal_stdin(false));
                }
            }
            tx.send_modify(|n| *n += 1);
        }
    });
    rx
}

/// Resolves when stdin closes, if `enabled`; never otherwise.
async fn shutdown_signal_stdin(enabled: bool) {
    if !enabled {
        return std::future::pending::<()>().await;
    }
    // A plain thread: tokio's stdin needs a feature the rest does not.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 256];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = tx.send(());
    });
    let _ = rx.await;
}

/// Resolves on Ctrl-C, on SIGTERM, and (when asked) when stdin closes.
async fn shutdown_signal(exit_on_stdin_eof: bool) {
    let stdin_eof = shutdown_signal_stdin(exit_on_stdin_eof);
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
        _ = stdin_eof => {}
    }
}
