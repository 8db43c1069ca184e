//! A throw-away PostgreSQL server for tests (issue 14): Debian's
//! `postgresql` binaries, `initdb` into a temporary directory, the server on
//! a free loopback port, a fresh database per supernode. The server is
//! stopped and its directory removed when the test process exits (and
//! killed with it should it die first).
//!
//! Shared by `supernode/tests/api.rs` and `tests/all` (`#[path]`).

#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// Set to `postgres` to run every supernode the tests start on PostgreSQL.
pub const SELECT_ENV: &str = "BSPWEB_TEST_DATABASE";

/// Whether the tests run their supernodes on PostgreSQL.
pub fn selected() -> bool {
    match std::env::var(SELECT_ENV) {
        Ok(v) if v == "postgres" => true,
        Ok(v) if v.is_empty() || v == "sqlite" => false,
        Ok(v) => panic!("{SELECT_ENV}={v}: expected `postgres` or `sqlite`"),
        Err(_) => false,
    }
}

/// A database URL for one more supernode: a fresh database on the shared
/// throw-away server, or `None` with SQLite.
pub fn database_for_test() -> Option<String> {
    selected().then(|| server().create_database())
}

/// The database of the supernode whose data directory is `dir`: `None`
/// (SQLite, in it), or with `BSPWEB_TEST_DATABASE=postgres` a database on
/// the throw-away server whose URL the directory remembers, so a restarted
/// supernode finds its state.
pub fn database_of(dir: &Path) -> Option<String> {
    let file = dir.join("test-database-url");
    match std::fs::read_to_string(&file) {
        Ok(url) => Some(url),
        Err(_) => {
            let url = database_for_test()?;
            std::fs::create_dir_all(dir).expect("the data directory can be made");
            std::fs::write(&file, &url).expect("the data directory takes a file");
            Some(url)
        }
    }
}

/// The test process's server, started on first use.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        // Started from a thread that never ends: the server is killed when
        // the thread that started it exits (`PR_SET_PDEATHSIG`), which must
        // be the test process's end, not the first test's.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(Server::start());
            loop {
                std::thread::park();
            }
        });
        rx.recv()
            .expect("the server's thread answers")
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

/// A running PostgreSQL server.
pub struct Server {
    pub port: u16,
    bin: PathBuf,
    dir: PathBuf,
    next: AtomicU32,
}

/// What to stop at exit.
static RUNNING: Mutex<Option<(Child, PathBuf)>> = Mutex::new(None);

extern "C" fn stop_at_exit() {
    if let Ok(mut running) = RUNNING.lock()
        && let Some((mut child, dir)) = running.take()
    {
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The directory of Debian's PostgreSQL binaries (the newest version).
fn bin_dir() -> Result<PathBuf, String> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| {
            "PostgreSQL is not installed: `apt-get install postgresql` (the tests run their own \
             throw-away server with its initdb and postgres)"
                .to_string()
        })?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| "no /usr/lib/postgresql/*/bin/initdb: `apt-get install postgresql`".into())
}

/// The uid and gid to run the server as: ours, or `postgres`'s when we are
/// root (the server refuses to run as root).
fn server_user() -> Result<Option<(u32, u32)>, String> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return Ok(None);
    }
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: getpwnam reads a static buffer we copy from at once; the
    // tests call it from one thread (under `OnceLock`).
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(
            "running as root, and there is no `postgres` user to run the \
                    throw-away PostgreSQL server as (it refuses root)"
                .into(),
        );
    }
    // SAFETY: `pw` is non-null and points at getpwnam's record.
    Ok(Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) }))
}

fn as_user(cmd: &mut Command, user: Option<(u32, u32)>, die_with_parent: bool) {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some((uid, gid)) = user
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            if die_with_parent {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            }
            Ok(())
        });
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Server {
    /// Starts a server in a new temporary directory.
    pub fn start() -> Result<Server, String> {
        let bin = bin_dir()?;
        let user = server_user()?;
        let dir = std::env::temp_dir().join(format!("bspweb-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", dir.display()))?;
        }
        let data = dir.join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args([
                "--auth=trust",
                "--username=bspweb",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_user(&mut initdb, user, false);
        let out = initdb.output().map_err(|e| format!("initdb: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut postgres = Command::new(bin.join("postgres"));
            postgres
                .arg("-D")
                .arg(&data)
                .args(["-p", &port.to_string(), "-k"])
                .arg(&dir)
                .args([
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=300",
                    // `wait_ready` reads the log in English.
                    "-c",
                    "lc_messages=C",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            as_user(&mut postgres, user, true);
            let mut child = postgres.spawn().map_err(|e| format!("postgres: {e}"))?;
            if wait_ready(&mut child, dir.join("server.log")) {
                *RUNNING.lock().unwrap_or_else(|p| p.into_inner()) = Some((child, dir.clone()));
                // SAFETY: registering a plain extern "C" function.
                unsafe { libc::atexit(stop_at_exit) };
                return Ok(Server {
                    port,
                    bin,
                    dir,
                    next: AtomicU32::new(0),
                });
            }
            let _ = child.kill();
            let _ = child.wait();
            last = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
        }
        let _ = std::fs::remove_dir_all(&dir);
        Err(format!(
            "the throw-away PostgreSQL server did not start:\n{last}"
        ))
    }

    /// A new, empty database; its URL.
    pub fn create_database(&self) -> String {
        let name = format!(
            "t{}_{}",
            std::process::id(),
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let out = Command::new(self.bin.join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "bspweb",
                &name,
            ])
            .output()
            .expect("createdb runs");
        assert!(
            out.status.success(),
            "createdb {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.url(&name)
    }

    /// The URL of database `name`.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://bspweb@127.0.0.1:{}/{name}", self.port)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Reads the server's log until it says it accepts connections (`true`)
/// or ends (`false`: it exited), then copies the rest to `log` in a thread.
fn wait_ready(child: &mut Child, log: PathBuf) -> bool {
    use std::io::{BufRead, BufReader, Write};
    let Some(stderr) = child.stderr.take() else {
        return false;
    };
    let mut lines = BufReader::new(stderr);
    let mut file = match std::fs::File::create(&log) {
        Ok(f) => f,
        Err(_) => return false,
    };
    let mut line = String::new();
    loop {
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) => {
                let _ = file.write_all(line.as_bytes());
                if line.contains("ready to accept connections") {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut lines, &mut file);
                    });
                    return true;
                }
            }
        }
    }
}
