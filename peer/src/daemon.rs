//! The running peer's local control socket: `bspweb peer status`, `pause`
//! and `resume` talk to it.
//!
//! A Unix socket, mode 0600 (only the account that runs the peer may use
//! it). One request per connection: a JSON line `{"command": "status"}`
//! (or `pause`, `resume`), answered by one JSON line [`Answer`]. Requests
//! are at most [`MAX_REQUEST`] bytes and must arrive within
//! [`REQUEST_TIMEOUT`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
#[cfg(unix)]
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
#[cfg(unix)]
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Longest request line.
pub const MAX_REQUEST: usize = 1024;
/// How long a client may take to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What a client asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "lowercase")]
pub enum Request {
    /// What the peer is doing.
    Status,
    /// Stop taking work: drain (the supernode moves the processes away).
    Pause,
    /// Take work again (within the time windows).
    Resume,
}

/// The answer: the peer's status after the request, or why it failed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PeerStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What `bspweb peer status` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerStatus {
    pub name: String,
    pub supernode: String,
    /// Its id at the supernode; `None` while it logs in.
    pub peer_id: Option<i64>,
    /// `logging in`, `running`, `idle`, `paused`, `draining` (paused, or
    /// outside its windows, while processes still move away) or `outside
    /// its time windows`.
    pub state: String,
    /// Paused by `bspweb peer pause`.
    pub paused: bool,
    /// Inside its time windows (always, without windows).
    pub in_window: bool,
    /// `--run-between` windows, local time.
    pub windows: Vec<String>,
    /// Jobs it runs processes of.
    pub jobs: Vec<i64>,
    pub slots: usize,
    pub cpu_percent: Option<u8>,
    pub speed: f64,
    /// Idle fraction at the last renewal.
    pub idle: f64,
    pub rss_bytes: u64,
    /// 0: no budget.
    pub budget_bytes: u64,
    /// Programs compiled since the peer started.
    #[serde(default)]
    pub compiled: u64,
    /// Programs read back from the compile cache instead.
    #[serde(default)]
    pub loaded: u64,
    /// Where compiled programs are kept across restarts; `None`: in memory
    /// only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_cache: Option<String>,
}

/// The peer's standing, shared by the socket, the availability loop and
/// the renewals.
#[derive(Debug, Default)]
pub struct Standing {
    /// Paused by the volunteer.
    pub paused: AtomicBool,
    /// Outside every `--run-between` window.
    pub outside_windows: AtomicBool,
    /// The peer stops: the availability loop leaves draining to the
    /// shutdown.
    pub stopping: AtomicBool,
    /// The idle fraction of the last renewal (f64 bits).
    pub idle_bits: AtomicU64,
    /// Wakes the availability loop.
    pub changed: Notify,
    /// Held while a renewal is built and sent, and while the draining flag
    /// changes with its drain or resume call, so the supernode sees them in
    /// the order they happened.
    pub order: tokio::sync::Mutex<()>,
}

impl Standing {
    /// Whether the peer should take no work now.
    pub fn wants_drain(&self) -> bool {
        self.paused.load(Ordering::SeqCst) || self.outside_windows.load(Ordering::SeqCst)
    }
}

/// The default socket: `$XDG_RUNTIME_DIR/bspweb-peer.sock`, else
/// `/run/bspweb-peer.sock` for root, else `~/.local/state/bspweb/peer.sock`.
pub fn default_socket() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("bspweb-peer.sock");
    }
    if is_root() {
        return PathBuf::from("/run/bspweb-peer.sock");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".local/state/bspweb/peer.sock")
}

/// Whether this process runs as root (off Unix: never).
pub fn is_root() -> bool {
    #[cfg(unix)]
    // SAFETY: geteuid has no preconditions and cannot fail.
    return unsafe { libc::geteuid() == 0 };
    #[cfg(not(unix))]
    false
}

/// Why the socket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(
        "another peer is running with the control socket {0}; give this one --control-socket PATH"
    )]
    InUse(PathBuf),
    #[error("cannot open the control socket {path}: {error}")]
    Open {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "no peer is running with the control socket {path} ({error}); start one with `bspweb peer`, or give the socket of the running one with --socket"
    )]
    NotRunning {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("the peer at {path} did not answer properly: {detail}")]
    Protocol { path: PathBuf, detail: String },
    #[error("{0}")]
    Refused(String),
    #[error(
        "the control socket is a Unix socket; this platform has none (`bspweb peer status|pause|resume` work on Unix systems)"
    )]
    Unsupported,
}

/// Off Unix there is no control socket.
#[cfg(not(unix))]
pub struct UnixListener;

#[cfg(not(unix))]
pub async fn bind(_path: &Path) -> Result<UnixListener, DaemonError> {
    Err(DaemonError::Unsupported)
}

#[cfg(not(unix))]
pub async fn serve(
    _listener: UnixListener,
    _path: PathBuf,
    _handle: Arc<dyn Fn(Request) -> Answer + Send + Sync>,
    _cancel: CancellationToken,
) {
}

#[cfg(not(unix))]
pub async fn call(_path: &Path, _request: Request) -> Result<PeerStatus, DaemonError> {
    Err(DaemonError::Unsupported)
}

/// Binds the control socket at `path` (mode 0600), replacing a stale one
/// that no peer answers on.
#[cfg(unix)]
pub async fn bind(path: &Path) -> Result<UnixListener, DaemonError> {
    if UnixStream::connect(path).await.is_ok() {
        return Err(DaemonError::InUse(path.to_path_buf()));
    }
    let open = |error| DaemonError::Open {
        path: path.to_path_buf(),
        error,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(open)?;
    }
    // Replace only a stale socket, never another kind of file.
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(open)?,
        Ok(_) => {
            return Err(open(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way; give another --control-socket path",
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(open(e)),
    }
    let listener = UnixListener::bind(path).map_err(open)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(open)?;
    Ok(listener)
}

/// Serves `listener` until `cancel`: each request applies `handle` and
/// answers with the status it returns. Removes the socket file at the end.
#[cfg(unix)]
pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    handle: Arc<dyn Fn(Request) -> Answer + Send + Sync>,
    cancel: CancellationToken,
) {
    loop {
        let conn = tokio::select! {
            () = cancel.cancelled() => break,
            c = listener.accept() => c,
        };
        let Ok((stream, _)) = conn else { continue };
        let handle = handle.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = Vec::new();
            let mut reader = BufReader::new(read).take(MAX_REQUEST as u64 + 1);
            let answer = match tokio::time::timeout(
                REQUEST_TIMEOUT,
                reader.read_until(b'\n', &mut line),
            )
            .await
            {
                Ok(Ok(_)) if line.len() > MAX_REQUEST => refuse("the request is longer than 1 KiB"),
                Ok(Ok(_)) => match serde_json::from_slice::<Request>(&line) {
                    Ok(req) => handle(req),
                    Err(e) => refuse(&format!(
                        "not a request ({e}); send {{\"command\": \"status\"}}, \"pause\" or \"resume\""
                    )),
                },
                Ok(Err(_)) => return,
                Err(_) => refuse("no request within 5 s"),
            };
            if let Ok(mut text) = serde_json::to_vec(&answer) {
                text.push(b'\n');
                let _ = write.write_all(&text).await;
            }
        });
    }
    let _ = std::fs::remove_file(&path);
}

#[cfg(unix)]
fn refuse(why: &str) -> Answer {
    Answer {
        status: None,
        error: Some(why.to_string()),
    }
}

/// Sends `request` to the peer at `path`; its status afterwards.
#[cfg(unix)]
pub async fn call(path: &Path, request: Request) -> Result<PeerStatus, DaemonError> {
    let stream = UnixStream::connect(path)
        .await
        .map_err(|error| DaemonError::NotRunning {
            path: path.to_path_buf(),
            error,
        })?;
    let protocol = |detail: String| DaemonError::Protocol {
        path: path.to_path_buf(),
        detail,
    };
    let (read, mut write) = stream.into_split();
    let mut text = serde_json::to_vec(&request).map_err(|e| protocol(e.to_string()))?;
    text.push(b'\n');
    write
        .write_all(&text)
        .await
        .map_err(|e| protocol(e.to_string()))?;
    let mut line = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        BufReader::new(read)
            .take(1 << 20)
            .read_until(b'\n', &mut line),
    )
    .await
    .map_err(|_| protocol("no answer within 30 s".into()))?
    .map_err(|e| protocol(e.to_string()))?;
    let answer: Answer = serde_json::from_slice(&line).map_err(|e| protocol(e.to_string()))?;
    match (answer.status, answer.error) {
        (_, Some(e)) => Err(DaemonError::Refused(e)),
        (Some(s), None) => Ok(s),
        (None, None) => Err(protocol("an empty answer".into())),
    }
}

/// What the control socket answers with, and how it applies requests.
pub(crate) struct StatusView {
    pub(crate) name: String,
    pub(crate) supernode: String,
    pub(crate) client: std::sync::Arc<crate::control::Client>,
    pub(crate) jobs: std::sync::Arc<crate::job::Jobs>,
    pub(crate) standing: std::sync::Arc<Standing>,
    pub(crate) windows: Vec<String>,
    pub(crate) slots: usize,
    pub(crate) cpu_percent: Option<u8>,
    pub(crate) speed: f64,
    pub(crate) runtime: std::sync::Arc<crate::runtime::Runtime>,
    pub(crate) compile_cache: Option<std::path::PathBuf>,
}

impl StatusView {
    pub(crate) fn handle(&self, request: Request) -> Answer {
        let s = &self.standing;
        match request {
            Request::Pause => {
                if !s.paused.swap(true, Ordering::SeqCst) {
                    tracing::info!("paused by the volunteer");
                }
                s.changed.notify_one();
            }
            Request::Resume => {
                if s.paused.swap(false, Ordering::SeqCst) {
                    tracing::info!("resumed by the volunteer");
                }
                s.changed.notify_one();
            }
            Request::Status => {}
        }
        let paused = s.paused.load(Ordering::SeqCst);
        let in_window = !s.outside_windows.load(Ordering::SeqCst);
        let jobs = self.jobs.running();
        let peer_id = self.client.peer_id();
        let state = if peer_id.is_none() {
            "logging in"
        } else if paused || !in_window {
            if !jobs.is_empty() {
                "draining"
            } else if paused {
                "paused"
            } else {
                "outside its time windows"
            }
        } else if jobs.is_empty() {
            "idle"
        } else {
            "running"
        };
        Answer {
            status: Some(PeerStatus {
                name: self.name.clone(),
                supernode: self.supernode.clone(),
                peer_id,
                state: state.to_string(),
                paused,
                in_window,
                windows: self.windows.clone(),
                jobs,
                slots: self.slots,
                cpu_percent: self.cpu_percent,
                speed: self.speed,
                idle: f64::from_bits(s.idle_bits.load(Ordering::Relaxed)),
                rss_bytes: crate::sysinfo::rss_bytes().unwrap_or(0),
                budget_bytes: self.runtime.budget().limit(),
                compiled: self.runtime.compiled_count(),
                loaded: self.runtime.loaded_count(),
                compile_cache: self.compile_cache.as_ref().map(|d| d.display().to_string()),
            }),
            error: None,
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn status() -> PeerStatus {
        PeerStatus {
            name: "p".into(),
            supernode: "http://x".into(),
            peer_id: Some(3),
            state: "idle".into(),
            paused: false,
            in_window: true,
            windows: vec![],
            jobs: vec![],
            slots: 2,
            cpu_percent: None,
            speed: 1.0,
            idle: 1.0,
            rss_bytes: 0,
            budget_bytes: 0,
            compiled: 0,
            loaded: 0,
            compile_cache: None,
        }
    }

    #[tokio::test]
    async fn requests_are_answered_and_garbage_is_refused_without_harm() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peer.sock");
        let listener = bind(&path).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.mode() & 0o777, 0o600);
        let paused = Arc::new(AtomicBool::new(false));
        let handle: Arc<dyn Fn(Request) -> Answer + Send + Sync> = {
            let paused = paused.clone();
            Arc::new(move |r| {
                match r {
                    Request::Pause => paused.store(true, Ordering::SeqCst),
                    Request::Resume => paused.store(false, Ordering::SeqCst),
                    Request::Status => {}
                }
                Answer {
                    status: Some(PeerStatus {
                        paused: paused.load(Ordering::SeqCst),
                        ..status()
                    }),
                    error: None,
                }
            })
        };
        let cancel = CancellationToken::new();
        let server = tokio::spawn(serve(listener, path.clone(), handle, cancel.clone()));
        // A second peer cannot take the socket.
        assert!(matches!(bind(&path).await, Err(DaemonError::InUse(_))));
        assert!(call(&path, Request::Pause).await.unwrap().paused);
        assert!(call(&path, Request::Status).await.unwrap().paused);
        assert!(!call(&path, Request::Resume).await.unwrap().paused);
        // Garbage and over-long lines get an error; the server goes on.
        for junk in [b"hello\n".to_vec(), vec![b'x'; 5000]] {
            let mut s = UnixStream::connect(&path).await.unwrap();
            s.write_all(&junk).await.unwrap();
            let _ = s.shutdown().await;
            let mut answer = String::new();
            BufReader::new(s).read_line(&mut answer).await.unwrap();
            let a: Answer = serde_json::from_str(&answer).unwrap();
            assert!(a.error.is_some() && a.status.is_none(), "{answer}");
        }
        assert!(!call(&path, Request::Status).await.unwrap().paused);
        cancel.cancel();
        server.await.unwrap();
        assert!(!path.exists(), "the socket file is removed at the end");
        assert!(matches!(
            call(&path, Request::Status).await,
            Err(DaemonError::NotRunning { .. })
        ));
        // A stale socket file (no peer behind it) is replaced; any other
        // file is left alone.
        std::os::unix::net::UnixListener::bind(&path).unwrap();
        bind(&path).await.unwrap();
        let precious = dir.path().join("peer.toml");
        std::fs::write(&precious, "supernode = \"x\"").unwrap();
        assert!(matches!(
            bind(&precious).await,
            Err(DaemonError::Open { .. })
        ));
        assert!(precious.exists());
    }
}
