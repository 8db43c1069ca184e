//! The supernode's REST API and peer control plane, driven over real HTTP on
//! 127.0.0.1 with a fake peer.

use std::future::Future;
use std::time::Duration;

use bsp_api::control::{
    Command, JobAssignment, Lease, PeerEvent, PeerLogin, PeerMemory, PeerRenew, PeerReport,
    SeqCommand, Stream,
};
use bsp_api::rest::{
    ApiError, JobEvent, JobEventKind, JobInfo, JobOutcome, JobState, LoginResponse, PeerInfo,
    ProgramInfo, Role, UserInfo,
};
use bspweb_supernode::{Config, Supernode};
use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Digest;

#[path = "support/throwaway_pg.rs"]
mod throwaway_pg;

/// Runs `sql` on the stored state of a stopped supernode.
fn execute_stored(dir: &std::path::Path, sql: &str) {
    match throwaway_pg::database_of(dir) {
        None => {
            let db = rusqlite::Connection::open(dir.join("bspweb.sqlite3")).unwrap();
            db.execute_batch(sql).unwrap();
        }
        Some(url) => {
            // The blocking client cannot run on the test's runtime thread.
            let sql = sql.to_string();
            std::thread::spawn(move || {
                let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                db.batch_execute(&sql).unwrap();
            })
            .join()
            .unwrap();
        }
    }
}

const GUEST: &str = r#"(module
    (import "bspweb_v1" "pid" (func (result i32)))
    (memory (export "memory") 1)
    (global $__stack_pointer (mut i32) (i32.const 1024))
    (func (export "bspweb_resume") (result i32) i32.const 1))"#;

const OTHER_GUEST: &str = r#"(module
    (memory (export "memory") 2)
    (func (export "bspweb_resume") (result i32) i32.const 1))"#;

const WASI_GUEST: &str = r#"(module
    (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
    (memory (export "memory") 1)
    (func (export "bspweb_resume") (result i32) i32.const 1))"#;

fn wasm(wat: &str) -> Vec<u8> {
    wat::parse_str(wat).expect("test module parses")
}

struct Harness {
    base: String,
    http: reqwest::Client,
    sn: Supernode,
    dir: tempfile::TempDir,
    /// What fake peers log in with.
    peer_token: bsp_api::control::EnrollmentToken,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Harness {
    async fn start() -> Harness {
        Harness::start_with(|_| {}).await
    }

    /// A supernode with the builtin program `ring` and user alice logged in
    /// (her token returned).
    async fn with_ring() -> (Harness, String) {
        let h = Harness::start().await;
        let alice = h.login("alice", "alice-password").await;
        h.sn.register_builtin("ring", "", &wasm(GUEST))
            .await
            .unwrap();
        (h, alice)
    }

    async fn start_with(adjust: impl FnOnce(&mut Config)) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        Harness::start_in(dir, adjust, true).await
    }

    async fn start_in(
        dir: tempfile::TempDir,
        adjust: impl FnOnce(&mut Config),
        create_users: bool,
    ) -> Harness {
        Harness::start_in_after(dir, adjust, create_users, Duration::ZERO).await
    }

    /// [`Harness::start_in`], `pause` passing between opening the state
    /// and serving (a slow start).
    async fn start_in_after(
        dir: tempfile::TempDir,
        adjust: impl FnOnce(&mut Config),
        create_users: bool,
        pause: Duration,
    ) -> Harness {
        // RUST_LOG=… shows the supernode's log with a test's output.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let mut config = Config {
            data_dir: dir.path().to_path_buf(),
            database: throwaway_pg::database_of(dir.path()),
            ..Config::default()
        };
        adjust(&mut config);
        let sn = Supernode::open(config).unwrap();
        if create_users {
            sn.create_user("admin", "admin-password", Role::Admin)
                .await
                .unwrap();
            sn.create_user("alice", "alice-password", Role::User)
                .await
                .unwrap();
            sn.create_user("bob", "bob-password", Role::User)
                .await
                .unwrap();
        }
        // Fake peers log in with an enrollment token of the administrator's.
        let peer_token = sn
            .create_enrollment("admin", "fake peers of the API tests")
            .await
            .unwrap()
            .token;
        tokio::time::sleep(pause).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(sn.clone().serve(listener, async move {
            let _ = stopped.await;
        }));
        // In a workspace build reqwest has rustls (bsp-api's client turns
        // it on) and needs a process-wide provider for plain clients.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Harness {
            base,
            http: reqwest::Client::new(),
            sn,
            dir,
            peer_token,
            stop: Some(stop),
            server: Some(server),
        }
    }

    /// Stops the server and waits for it to finish; returns the data directory.
    async fn stop(mut self) -> tempfile::TempDir {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            tokio::time::timeout(Duration::from_secs(10), server)
                .await
                .expect("the server stops promptly")
                .unwrap()
                .unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v1{}", self.base, path)
    }

    async fn login(&self, name: &str, password: &str) -> String {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                "/login",
                None,
                Some(json!({"name": name, "password": password})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let login: LoginResponse = serde_json::from_value(body).unwrap();
        login.token
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let bytes = resp.bytes().await.unwrap();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!(
                    "{path}: not JSON ({e}): {}",
                    String::from_utf8_lossy(&bytes)
                )
            })
        };
        (status, value)
    }

    async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::GET, path, Some(token), None)
            .await
    }

    async fn post(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(reqwest::Method::POST, path, Some(token), Some(body))
            .await
    }

    async fn upload(&self, token: &str, name: Option<&str>, bytes: Vec<u8>) -> (StatusCode, Value) {
        let url = match name {
            Some(n) => self.url(&format!("/programs?name={n}")),
            None => self.url("/programs"),
        };
        let resp = self
            .http
            .post(url)
            .bearer_auth(token)
            .header("content-type", "application/wasm")
            .body(bytes)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap())
    }

    async fn submit(&self, token: &str, program: &str, nprocs: u32) -> JobInfo {
        let (status, body) = self
            .post(
                "/jobs",
                token,
                json!({"program": program, "nprocs": nprocs, "args": {"n": 5}}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_value(body).unwrap()
    }

    async fn job(&self, token: &str, id: i64) -> JobInfo {
        let (status, body) = self.get(&format!("/jobs/{id}"), token).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_value(body).unwrap()
    }

    /// Polls job `id` until `done` holds, failing after 10 s.
    async fn wait_job(
        &self,
        token: &str,
        id: i64,
        what: &str,
        done: impl Fn(&JobInfo) -> bool,
    ) -> JobInfo {
        poll(what, || async {
            let job = self.job(token, id).await;
            done(&job).then_some(job)
        })
        .await
    }

    /// Reads job `id`'s event stream (of a job that may still run) until
    /// an event satisfies `found`; fails after 10 s.
    async fn wait_event(
        &self,
        token: &str,
        id: i64,
        found: impl Fn(&JobEvent) -> bool,
    ) -> JobEvent {
        let mut resp = self
            .http
            .get(self.url(&format!("/jobs/{id}/events")))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut text = String::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some((_, _, e)) = parse_sse(&text).into_iter().find(|(_, _, e)| found(e)) {
                return e;
            }
            let chunk = tokio::time::timeout_at(deadline, resp.chunk())
                .await
                .unwrap_or_else(|_| panic!("no such event of job {id}: {text}"))
                .unwrap()
                .unwrap_or_else(|| panic!("the stream of job {id} ended: {text}"));
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The whole event stream of a finished job after `after`, read until the
    /// server ends it.
    async fn events(
        &self,
        token: &str,
        id: i64,
        last_event_id: Option<i64>,
    ) -> Vec<(String, String, JobEvent)> {
        let mut req = self
            .http
            .get(self.url(&format!("/jobs/{id}/events")))
            .bearer_auth(token);
        if let Some(last) = last_event_id {
            req = req.header("Last-Event-ID", last.to_string());
        }
        let resp = tokio::time::timeout(Duration::from_secs(10), req.send())
            .await
            .expect("events answer")
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        let text = tokio::time::timeout(Duration::from_secs(10), resp.text())
            .await
            .expect("the stream of a finished job ends")
            .unwrap();
        parse_sse(&text)
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Parses complete SSE messages into (id, event name, decoded data).
fn parse_sse(text: &str) -> Vec<(String, String, JobEvent)> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let (mut id, mut name, mut data) = (None, None, String::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id:") {
                id = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("event:") {
                name = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if let (Some(id), Some(name)) = (id, name) {
            let event: JobEvent = serde_json::from_str(&data).unwrap();
            out.push((id, name, event));
        }
    }
    out
}

/// Polls `check` every 20 ms until it yields a value, failing after 10 s.
async fn poll<T, F, Fut>(what: &str, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn api_error(body: &Value) -> ApiError {
    serde_json::from_value(body.clone()).unwrap_or_else(|e| panic!("not an ApiError ({e}): {body}"))
}

// ------------------------------------------------------------------ fake peer

struct FakePeer {
    id: i64,
    token: String,
    seen: u64,
}

/// A port that accepts (and drops) connections for the whole test run: the
/// fake peers' data-plane address, so that the supernode, which dials
/// suspected peers and every peer recorded online when it starts, finds
/// them alive.
fn live_addr() -> String {
    static PORT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PORT.get_or_init(|| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                drop(conn);
            }
        });
        addr
    })
    .clone()
}

/// An address where nothing listens: a dead peer's.
fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn login_body(name: &str, cores: u32, previous_id: Option<i64>) -> PeerLogin {
    PeerLogin {
        name: name.into(),
        addr: live_addr(),
        speed: 1.0,
        idle: 1.0,
        cores,
        version: bsp_api::API_VERSION,
        previous_id,
        cluster: None,
        token: None,
    }
}

impl Harness {
    async fn peer_login(&self, mut login: PeerLogin) -> FakePeer {
        login.token.get_or_insert_with(|| self.peer_token.clone());
        let resp = self
            .http
            .post(self.url("/peer/login"))
            .json(&login)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let lease: Lease = resp.json().await.unwrap();
        assert!(lease.renew_every_ms > 0 && lease.renew_every_ms < lease.ttl_ms);
        FakePeer {
            id: lease.peer_id,
            token: lease.token,
            seen: 0,
        }
    }

    /// Long-polls until at least one command arrives.
    async fn commands(&self, peer: &mut FakePeer) -> Vec<SeqCommand> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let resp = self
                .http
                .get(self.url(&format!("/peer/commands?after={}&wait_ms=2000", peer.seen)))
                .bearer_auth(&peer.token)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            let cmds: bsp_api::control::Commands = resp.json().await.unwrap();
            if let Some(last) = cmds.commands.last() {
                assert!(cmds.commands.iter().all(|c| c.seq > peer.seen));
                peer.seen = last.seq;
                return cmds.commands;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no command for peer {}",
                peer.id
            );
        }
    }

    async fn report(&self, peer: &FakePeer, events: Vec<PeerEvent>) -> StatusCode {
        self.http
            .post(self.url("/peer/report"))
            .bearer_auth(&peer.token)
            .json(&PeerReport { events })
            .send()
            .await
            .unwrap()
            .status()
    }

    /// Sends `renew` as `peer`'s lease renewal.
    async fn send_renew(&self, peer: &FakePeer, renew: &PeerRenew) -> StatusCode {
        self.http
            .post(self.url("/peer/renew"))
            .bearer_auth(&peer.token)
            .json(renew)
            .send()
            .await
            .unwrap()
            .status()
    }

    /// Renews with availability `idle`, maybe asking to drain.
    async fn renew_with(&self, peer: &FakePeer, idle: f64, draining: bool) -> StatusCode {
        let renew = PeerRenew {
            idle,
            draining,
            ..PeerRenew::idle(1.0)
        };
        self.send_renew(peer, &renew).await
    }

    /// Renews `peer`'s lease reporting `rss` resident bytes and a memory
    /// budget of `budget` bytes.
    async fn renew_memory(&self, peer: &FakePeer, rss: u64, budget: u64) -> StatusCode {
        let renew = PeerRenew {
            memory: bsp_api::control::PeerMemory {
                rss_bytes: rss,
                held_bytes: 0,
                budget_bytes: budget,
            },
            ..PeerRenew::idle(1.0)
        };
        self.send_renew(peer, &renew).await
    }

    /// Renews `peer`'s lease every 100 ms in the background (abort to stop).
    fn keep_alive(&self, peer: &FakePeer) -> tokio::task::JoinHandle<()> {
        let (http, url, token) = (
            self.http.clone(),
            self.url("/peer/renew"),
            peer.token.clone(),
        );
        tokio::spawn(async move {
            loop {
                let renew = PeerRenew::idle(1.0);
                match http
                    .post(&url)
                    .bearer_auth(&token)
                    .json(&renew)
                    .send()
                    .await
                {
                    Ok(resp) if resp.status() == StatusCode::OK => {}
                    _ => return,
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    }

    /// Reads `peer`'s commands until a `StartJob` of `job` with at least
    /// `epoch` arrives; returns the newest such assignment.
    async fn assignment_at(&self, peer: &mut FakePeer, job: i64, epoch: u64) -> JobAssignment {
        loop {
            let found = self
                .commands(peer)
                .await
                .into_iter()
                .rev()
                .find_map(|c| match c.command {
                    Command::StartJob(a) if a.job == job && a.epoch >= epoch => Some(a),
                    _ => None,
                });
            if let Some(a) = found {
                return a;
            }
        }
    }

    async fn peer_list(&self, token: &str) -> Vec<PeerInfo> {
        let (status, body) = self.get("/peers", token).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_value(body).unwrap()
    }

    async fn renew(&self, peer: &FakePeer) -> (StatusCode, Value) {
        let renew = PeerRenew::idle(1.0);
        let resp = self
            .http
            .post(self.url("/peer/renew"))
            .bearer_auth(&peer.token)
            .json(&renew)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap())
    }
}

/// The pids `a` places on `peer`, in order.
fn hosts(a: &JobAssignment, peer: i64) -> Vec<u32> {
    (0..a.nprocs)
        .filter(|&pid| host_of(a, pid) == peer)
        .collect()
}

/// The peer `a` places `pid` on.
fn host_of(a: &JobAssignment, pid: u32) -> i64 {
    a.peers[a.placement[pid as usize] as usize].id
}

/// The peer of each pid, as `JobInfo::placement` lists them.
fn hosts_by_pid(a: &JobAssignment) -> Vec<i64> {
    (0..a.nprocs).map(|pid| host_of(a, pid)).collect()
}

fn start_job(cmds: &[SeqCommand]) -> JobAssignment {
    cmds.iter()
        .find_map(|c| match &c.command {
            Command::StartJob(a) => Some(a.clone()),
            _ => None,
        })
        .expect("a StartJob command")
}

fn out(job: i64, pid: u32, seq: u64, text: &str) -> PeerEvent {
    PeerEvent::Output {
        job,
        pid,
        seq,
        stream: Stream::Stdout,
        data: text.into(),
    }
}

fn exited(job: i64, pid: u32) -> PeerEvent {
    PeerEvent::ProcessExited {
        job,
        pid,
        superstep: 2,
    }
}

// ------------------------------------------------------------------ tests

#[tokio::test]
async fn login_with_good_and_bad_passwords() {
    let h = Harness::start().await;
    let (status, body) = h
        .call(
            reqwest::Method::POST,
            "/login",
            None,
            Some(json!({"name": "alice", "password": "alice-password"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let login: LoginResponse = serde_json::from_value(body).unwrap();
    assert_eq!(login.user.name, "alice");
    assert!(!login.user.admin);
    assert!(login.expires_at > 0);

    let (status, me) = h.get("/me", &login.token).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me["name"], "alice");

    for (name, password) in [("alice", "wrong-password"), ("nobody", "alice-password")] {
        let (status, body) = h
            .call(
                reqwest::Method::POST,
                "/login",
                None,
                Some(json!({"name": name, "password": password})),
            )
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(api_error(&body).message, "wrong user name or password");
    }
}

#[tokio::test]
async fn user_and_peer_tokens_are_kept_apart() {
    let h = Harness::start().await;
    let user = h.login("alice", "alice-password").await;
    let peer = h.peer_login(login_body("p1", 2, None)).await;

    // A peer token is no user token.
    let (status, body) = h.get("/me", &peer.token).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(api_error(&body).code, "unauthorized");
    // A user token is no lease.
    let (status, body) = h
        .post(
            "/peer/renew",
            &user,
            json!({"speed": 1.0, "idle": 1.0, "jobs": []}),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        api_error(&body).message.contains("not a peer lease token"),
        "{body}"
    );
    // No token, a garbage token.
    let (status, body) = h.call(reqwest::Method::GET, "/jobs", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(api_error(&body).message.contains("Authorization"));
    let (status, _) = h.get("/jobs", "not.a.token").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Each works where it belongs.
    assert_eq!(h.get("/jobs", &user).await.0, StatusCode::OK);
    assert_eq!(h.renew(&peer).await.0, StatusCode::OK);
}

#[tokio::test]
async fn only_admins_create_users() {
    let h = Harness::start().await;
    let alice = h.login("alice", "alice-password").await;
    let admin = h.login("admin", "admin-password").await;
    let carol = json!({"name": "carol", "password": "carol-password"});
    let (status, body) = h.post("/users", &alice, carol.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = h.post("/users", &admin, carol.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["name"], "carol");
    assert_eq!(body["admin"], false);
    let (status, _) = h.post("/users", &admin, carol).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _) = h
        .post(
            "/users",
            &admin,
            json!({"name": "bad name", "password": "long-enough"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    h.login("carol", "carol-password").await;
}

#[tokio::test]
async fn programs_are_validated_stored_by_hash_and_private() {
    let h = Harness::start().await;
    let alice = h.login("alice", "alice-password").await;
    let bob = h.login("bob", "bob-password").await;
    let builtin =
        h.sn.register_builtin("ring", "messages around a ring", &wasm(GUEST))
            .await
            .unwrap();
    // Registering again is harmless.
    assert_eq!(
        h.sn.register_builtin("ring", "messages around a ring", &wasm(GUEST))
            .await
            .unwrap(),
        builtin
    );
    assert!(h.sn.register_builtin("junk", "", b"junk").await.is_err());

    let module = wasm(OTHER_GUEST);
    let (status, body) = h.upload(&alice, Some("mine"), module.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let info: ProgramInfo = serde_json::from_value(body).unwrap();
    assert_eq!(info.hash, hex::encode(sha2::Sha256::digest(&module)));
    assert_eq!(info.size, module.len() as u64);
    assert_eq!(info.name.as_deref(), Some("mine"));
    assert!(!info.builtin);

    let (status, body) = h.upload(&alice, None, b"hello, not wasm".to_vec()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let e = api_error(&body);
    assert_eq!(e.code, "invalid_module");
    assert!(
        e.message.contains("not a WebAssembly module"),
        "{}",
        e.message
    );

    let (status, body) = h.upload(&alice, Some("wasi"), wasm(WASI_GUEST)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        api_error(&body)
            .message
            .contains("wasi_snapshot_preview1.fd_write"),
        "{body}"
    );

    let (status, _) = h.upload(&alice, Some("../evil"), module.clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Alice sees the builtin and her program; Bob only the builtin.
    let (_, list) = h.get("/programs", &alice).await;
    let list: Vec<ProgramInfo> = serde_json::from_value(list).unwrap();
    let names: Vec<_> = list
        .iter()
        .map(|p| (p.name.clone().unwrap(), p.builtin))
        .collect();
    assert_eq!(
        names,
        vec![("ring".to_string(), true), ("mine".to_string(), false)]
    );
    let (_, list) = h.get("/programs", &bob).await;
    let list: Vec<ProgramInfo> = serde_json::from_value(list).unwrap();
    assert_eq!(list, vec![builtin.clone()]);

    // Bob can run neither Alice's name nor her hash; both can run the builtin by hash.
    let (status, body) = h
        .post("/jobs", &bob, json!({"program": "mine", "nprocs": 1}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(api_error(&body).message.contains("no program `mine`"));
    let (status, _) = h
        .post("/jobs", &bob, json!({"program": info.hash, "nprocs": 1}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let job = h.submit(&bob, &builtin.hash, 1).await;
    assert_eq!(job.program_hash, builtin.hash);
    let job = h.submit(&alice, &info.hash.to_uppercase(), 1).await;
    assert_eq!(job.program_hash, info.hash);

    // A user's own name shadows a builtin of the same name.
    let (status, _) = h.upload(&alice, Some("ring"), module.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h.submit(&alice, "ring", 1).await.program_hash, info.hash);
    assert_eq!(h.submit(&bob, "ring", 1).await.program_hash, builtin.hash);
    let (_, list) = h.get("/programs", &alice).await;
    let list: Vec<ProgramInfo> = serde_json::from_value(list).unwrap();
    assert!(
        list.iter().all(|p| !p.builtin),
        "the shadowed builtin is not listed: {list:?}"
    );
}

#[tokio::test]
async fn jobs_are_submitted_listed_killed_and_disposed() {
    let (h, alice) = Harness::with_ring().await;

    let (status, body) = h
        .post(
            "/jobs",
            &alice,
            json!({"program": "ring", "nprocs": 4, "args": [1, 2], "description": "first",
                   "seed": 42, "limits": {"superstep_ms": 1, "memory_mib": 100000, "output_mib": 8}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let job: JobInfo = serde_json::from_value(body).unwrap();
    assert_eq!(job.state, JobState::Waiting);
    assert_eq!((job.nprocs, job.seed, job.owner.as_str()), (4, 42, "alice"));
    assert_eq!(job.args, json!([1, 2]));
    assert_eq!(job.description.as_deref(), Some("first"));
    assert_eq!(
        (
            job.limits.superstep_ms,
            job.limits.memory_mib,
            job.limits.output_mib
        ),
        (100, 4096, 8)
    );
    assert!(job.placement.is_empty());

    let (_, list) = h.get("/jobs?state=waiting", &alice).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    let (_, list) = h.get("/jobs?state=finished", &alice).await;
    assert!(list.as_array().unwrap().is_empty());
    let (status, body) = h.get("/jobs?state=sleeping", &alice).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(api_error(&body).message.contains("sleeping"));

    // Only finished jobs can be disposed of.
    let (status, _) = h
        .call(
            reqwest::Method::DELETE,
            &format!("/jobs/{}", job.id),
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);

    let (status, body) = h
        .post(&format!("/jobs/{}/kill", job.id), &alice, Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let killed: JobInfo = serde_json::from_value(body).unwrap();
    assert_eq!(
        (killed.state, killed.outcome),
        (JobState::Finished, Some(JobOutcome::Killed))
    );
    assert!(killed.finished_at.is_some());
    let (status, _) = h
        .post(&format!("/jobs/{}/kill", job.id), &alice, Value::Null)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);

    let events = h.events(&alice, job.id, None).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].1, "job_killed");
    assert_eq!(events[0].2.kind, JobEventKind::JobKilled);

    let (status, body) = h
        .call(
            reqwest::Method::DELETE,
            &format!("/jobs/{}", job.id),
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, body) = h.get(&format!("/jobs/{}", job.id), &alice).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(api_error(&body).code, "not_found");

    // Bad submissions.
    for (body, status, needle) in [
        (
            json!({"program": "ring", "nprocs": 0}),
            StatusCode::BAD_REQUEST,
            "nprocs",
        ),
        (
            json!({"program": "ring", "nprocs": 5000}),
            StatusCode::BAD_REQUEST,
            "nprocs",
        ),
        (
            json!({"program": "nope", "nprocs": 1}),
            StatusCode::NOT_FOUND,
            "no program `nope`",
        ),
        (
            json!({"program": "ring", "nprocs": 1, "resources": {"input.txt": "%%%"}}),
            StatusCode::BAD_REQUEST,
            "resource `input.txt`",
        ),
        (
            json!({"program": "ring"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "nprocs",
        ),
    ] {
        let (got, answer) = h.post("/jobs", &alice, body.clone()).await;
        assert_eq!(got, status, "{body} → {answer}");
        assert!(api_error(&answer).message.contains(needle), "{answer}");
    }
}

#[tokio::test]
async fn another_users_jobs_are_invisible() {
    let h = Harness::start().await;
    let alice = h.login("alice", "alice-password").await;
    let bob = h.login("bob", "bob-password").await;
    h.sn.register_builtin("ring", "", &wasm(GUEST))
        .await
        .unwrap();
    let job = h.submit(&alice, "ring", 2).await;

    let (status, _) = h.get(&format!("/jobs/{}", job.id), &bob).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = h
        .post(&format!("/jobs/{}/kill", job.id), &bob, Value::Null)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = h
        .call(
            reqwest::Method::DELETE,
            &format!("/jobs/{}", job.id),
            Some(&bob),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = h.get(&format!("/jobs/{}/events", job.id), &bob).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, list) = h.get("/jobs", &bob).await;
    assert!(list.as_array().unwrap().is_empty());
    // Still alive and well for Alice.
    assert_eq!(h.job(&alice, job.id).await.state, JobState::Waiting);
}

/// What the peers need to pass the program and resources on among
/// themselves: each peer's cluster, the program's size, and the resources
/// apart from the assignment (hash and size), fetched only by the job's peers.
#[tokio::test]
async fn assignments_carry_clusters_sizes_and_resources_apart() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let h = Harness::start().await;
    let alice = h.login("alice", "alice-password").await;
    h.sn.register_builtin("ring", "", &wasm(GUEST))
        .await
        .unwrap();
    let mut peer = h
        .peer_login(PeerLogin {
            cluster: Some("lab-1".into()),
            ..login_body("p1", 4, None)
        })
        .await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let (status, body) = h
        .post(
            "/jobs",
            &alice,
            json!({"program": "ring", "nprocs": 2, "args": null,
                   "resources": {"b.txt": b64.encode("bee"), "a.bin": b64.encode([0u8, 1, 2])}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let a = start_job(&h.commands(&mut peer).await);
    assert_eq!(a.peers[0].cluster.as_deref(), Some("lab-1"));
    assert_eq!(a.program_bytes, wasm(GUEST).len() as u64);
    assert!(a.resources.is_empty(), "resources travel apart");
    let expected = bsp_api::control::encode_resources(&[
        ("a.bin".into(), vec![0, 1, 2]),
        ("b.txt".into(), b"bee".to_vec()),
    ]);
    assert_eq!(a.resources_bytes, expected.len() as u64);
    assert_eq!(
        a.resources_hash,
        hex::encode(sha2::Sha256::digest(&expected))
    );
    let url = h.url(&format!("/peer/jobs/{}/resources", a.job));
    let resp = h
        .http
        .get(&url)
        .bearer_auth(&peer.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.bytes().await.unwrap().to_vec(), expected);
    // Another peer, a user and nobody get nothing.
    let other = h.peer_login(login_body("p2", 1, None)).await;
    let resp = h
        .http
        .get(&url)
        .bearer_auth(&other.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = h.http.get(&url).bearer_auth(&alice).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    // The peers list shows the cluster.
    let (_, peers) = h.get("/peers", &alice).await;
    let peers: Vec<PeerInfo> = serde_json::from_value(peers).unwrap();
    let p1 = peers.iter().find(|p| p.name == "p1").unwrap();
    assert_eq!(p1.cluster.as_deref(), Some("lab-1"));
    assert_eq!(peers.iter().find(|p| p.name == "p2").unwrap().cluster, None);
}

#[tokio::test]
async fn a_waiting_job_is_placed_when_a_peer_logs_in_and_runs_to_its_end() {
    let h = Harness::start().await;
    let alice = h.login("alice", "alice-password").await;
    let builtin =
        h.sn.register_builtin("ring", "", &wasm(GUEST))
            .await
            .unwrap();
    let job = h.submit(&alice, "ring", 3).await;
    // No peer: the job waits (the scheduler ran on submit and found none).
    let (_, health) = h.call(reqwest::Method::GET, "/health", None, None).await;
    assert_eq!(health["peers_online"], 0);
    assert_eq!(h.job(&alice, job.id).await.state, JobState::Waiting);

    let mut peer = h.peer_login(login_body("p1", 4, None)).await;
    let cmds = h.commands(&mut peer).await;
    let a = start_job(&cmds);
    assert_eq!(a.job, job.id);
    assert_eq!(a.nprocs, 3);
    assert_eq!(a.program_hash, builtin.hash);
    assert_eq!(a.peers.len(), 1);
    assert_eq!(a.peers[0].id, peer.id);
    assert_eq!(a.peers[0].addr, live_addr());
    assert_eq!(a.placement, vec![0, 0, 0]);
    assert_eq!(a.job_token.len(), 64);
    assert_eq!(
        serde_json::from_str::<Value>(&a.args).unwrap(),
        json!({"n": 5})
    );

    let active = h.job(&alice, job.id).await;
    assert_eq!(active.state, JobState::Active);
    assert_eq!(active.placement, vec![peer.id; 3]);
    assert!(active.started_at.is_some());
    let (_, peers) = h.get("/peers", &alice).await;
    let peers: Vec<PeerInfo> = serde_json::from_value(peers).unwrap();
    assert_eq!(
        (peers.len(), peers[0].processes, peers[0].state.as_str()),
        (1, 3, "online")
    );

    // The peer fetches the module of its job, and nothing else.
    let resp = h
        .http
        .get(h.url(&format!("/peer/modules/{}", a.program_hash)))
        .bearer_auth(&peer.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.bytes().await.unwrap().to_vec(), wasm(GUEST));
    let other = h.peer_login(login_body("p2", 1, None)).await;
    let resp = h
        .http
        .get(h.url(&format!("/peer/modules/{}", a.program_hash)))
        .bearer_auth(&other.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);

    // Output, with repeats; a report from a peer not on the job is ignored.
    let status = h
        .report(
            &peer,
            vec![
                out(job.id, 0, 0, "hello from 0"),
                out(job.id, 1, 0, "hello from 1"),
                out(job.id, 0, 0, "hello from 0"),
                PeerEvent::Status {
                    job: job.id,
                    pid: None,
                    text: "superstep 1 done".into(),
                },
                out(job.id, 0, 1, "bye from 0"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        h.report(&other, vec![out(job.id, 2, 0, "intruder")]).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        h.report(
            &peer,
            vec![
                out(job.id, 1, 0, "hello from 1"),
                exited(job.id, 0),
                exited(job.id, 1),
                exited(job.id, 0)
            ]
        )
        .await,
        StatusCode::NO_CONTENT
    );
    let running = h.job(&alice, job.id).await;
    assert_eq!((running.state, running.exited), (JobState::Active, 2));
    assert_eq!(
        h.report(
            &peer,
            vec![
                PeerEvent::Output {
                    job: job.id,
                    pid: 2,
                    seq: 0,
                    stream: Stream::Raw,
                    data: "AAEC".into()
                },
                exited(job.id, 2)
            ]
        )
        .await,
        StatusCode::NO_CONTENT
    );
    let done = h.job(&alice, job.id).await;
    assert_eq!(
        (done.state, done.outcome, done.exited),
        (JobState::Finished, Some(JobOutcome::Exited), 3)
    );
    // Output arriving after the end is dropped.
    h.report(&peer, vec![out(job.id, 2, 1, "too late")]).await;

    let events = h.events(&alice, job.id, None).await;
    let kinds: Vec<&str> = events.iter().map(|(_, name, _)| name.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "status",
            "status",
            "stdout",
            "stdout",
            "status",
            "stdout",
            "process_exited",
            "process_exited",
            "raw",
            "process_exited",
            "job_exited"
        ]
    );
    assert_eq!(
        events[0].2.kind,
        JobEventKind::Status {
            text: "placed 3 processes on 1 peer".into()
        }
    );
    // Alone in the network, the peer has nowhere to keep checkpoints: said at start.
    match &events[1].2.kind {
        JobEventKind::Status { text } => assert!(text.contains("job is lost"), "{text}"),
        other => panic!("expected a status line, got {other:?}"),
    }
    let texts: Vec<_> = events
        .iter()
        .filter_map(|(_, _, e)| match &e.kind {
            JobEventKind::Stdout { text } => Some((e.pid, text.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        texts,
        [
            (Some(0), "hello from 0"),
            (Some(1), "hello from 1"),
            (Some(0), "bye from 0")
        ]
    );
    for (id, _, e) in &events {
        assert_eq!(id, &e.id.to_string());
        assert_eq!(e.job, job.id);
    }
    assert!(events.windows(2).all(|w| w[0].2.id < w[1].2.id));

    // The peers drop the finished job (and its checkpoint replicas).
    let cmds = h.commands(&mut peer).await;
    assert!(
        matches!(&cmds[..], [SeqCommand { command: Command::KillJob { job: j, .. }, .. }] if *j == job.id),
        "{cmds:?}"
    );
    // Commands are acknowledged by `after`: nothing new for the peer now.
    let resp = h
        .http
        .get(h.url(&format!("/peer/commands?after={}&wait_ms=50", peer.seen)))
        .bearer_auth(&peer.token)
        .send()
        .await
        .unwrap();
    let cmds: bsp_api::control::Commands = resp.json().await.unwrap();
    assert!(cmds.commands.is_empty());
}

#[tokio::test]
async fn an_abort_ends_the_job_and_kills_it_on_every_peer() {
    let (h, alice) = Harness::with_ring().await;
    let mut p1 = h.peer_login(login_body("p1", 4, None)).await;
    let mut p2 = h.peer_login(login_body("p2", 4, None)).await;
    let job = h.submit(&alice, "ring", 8).await;
    let a1 = start_job(&h.commands(&mut p1).await);
    let a2 = start_job(&h.commands(&mut p2).await);
    assert_eq!(a1.placement, a2.placement);
    assert_eq!(
        a1.peers.len(),
        2,
        "equal peers share eight processes: {:?}",
        a1.placement
    );
    let pid_on_p2 = a2
        .placement
        .iter()
        .position(|&i| a2.peers[i as usize].id == p2.id)
        .unwrap() as u32;

    let reason = "input file is empty";
    h.report(
        &p2,
        vec![PeerEvent::ProcessAborted {
            job: job.id,
            pid: pid_on_p2,
            superstep: 3,
            reason: reason.into(),
        }],
    )
    .await;
    let done = h.job(&alice, job.id).await;
    assert_eq!(done.outcome, Some(JobOutcome::Aborted));
    assert_eq!(done.error_pid, Some(pid_on_p2));
    assert!(done.error.as_deref().unwrap().contains(reason));
    for peer in [&mut p1, &mut p2] {
        let cmds = h.commands(peer).await;
        assert!(
            cmds.iter()
                .any(|c| matches!(&c.command, Command::KillJob { job: j, .. } if *j == job.id)),
            "{cmds:?}"
        );
    }
    let events = h.events(&alice, job.id, None).await;
    match &events.last().unwrap().2.kind {
        JobEventKind::JobAborted { reason: r } => assert!(r.contains(reason)),
        other => panic!("expected job_aborted, got {other:?}"),
    }
}

#[tokio::test]
async fn event_streams_resume_after_last_event_id_and_follow_live_output() {
    let (h, alice) = Harness::with_ring().await;
    let mut peer = h.peer_login(login_body("p1", 4, None)).await;
    let job = h.submit(&alice, "ring", 1).await;
    start_job(&h.commands(&mut peer).await);

    // Follow live: open the stream, then produce output.
    let resp = h
        .http
        .get(h.url(&format!("/jobs/{}/events", job.id)))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    let mut next_events = async |n: usize| {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let events = parse_sse(&text);
                if events.len() >= n {
                    return events;
                }
                let chunk = body.next().await.expect("stream open").unwrap();
                text.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        })
        .await
        .expect("live events arrive")
    };
    // "placed …" and "no other peer to keep checkpoints on".
    assert_eq!(next_events(2).await[1].1, "status");
    for i in 0..5u64 {
        h.report(&peer, vec![out(job.id, 0, i, &format!("line {i}"))])
            .await;
        let events = next_events(3 + i as usize).await;
        assert_eq!(
            events.last().unwrap().2.kind,
            JobEventKind::Stdout {
                text: format!("line {i}")
            }
        );
    }
    // `follow=false` on the active job: what is stored so far, then the end.
    let resp = h
        .http
        .get(h.url(&format!("/jobs/{}/events?follow=false", job.id)))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    let last: i64 = resp.headers()["bspweb-last-event-id"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // Output stored after the request is not part of it.
    h.report(&peer, vec![out(job.id, 0, 5, "line 5")]).await;
    let text = tokio::time::timeout(Duration::from_secs(10), resp.text())
        .await
        .expect("a stream with follow=false ends although the job is active")
        .unwrap();
    let stored = parse_sse(&text);
    assert_eq!(stored.len(), 7, "{text}");
    assert_eq!(stored.last().unwrap().2.id, last);
    assert_eq!(
        stored.last().unwrap().2.kind,
        JobEventKind::Stdout {
            text: "line 4".into()
        }
    );
    h.report(&peer, vec![exited(job.id, 0)]).await;
    let live = next_events(10).await;
    assert_eq!(live.last().unwrap().1, "job_exited");

    // Resuming from every point gives exactly the rest, with no duplicates.
    let all = h.events(&alice, job.id, None).await;
    assert_eq!(all.len(), 10);
    assert_eq!(
        all.iter().map(|e| e.2.clone()).collect::<Vec<_>>(),
        live.iter().map(|e| e.2.clone()).collect::<Vec<_>>()
    );
    for (i, (_, _, e)) in all.iter().enumerate() {
        let rest = h.events(&alice, job.id, Some(e.id)).await;
        assert_eq!(
            rest.iter().map(|r| r.2.id).collect::<Vec<_>>(),
            all[i + 1..].iter().map(|r| r.2.id).collect::<Vec<_>>()
        );
    }
    // `?after=` does the same for clients that cannot set headers.
    let resp = h
        .http
        .get(h.url(&format!("/jobs/{}/events?after={}", job.id, all[6].2.id)))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    let rest = parse_sse(&resp.text().await.unwrap());
    assert_eq!(rest.len(), 3);
    // A malformed Last-Event-ID is refused.
    let resp = h
        .http
        .get(h.url(&format!("/jobs/{}/events", job.id)))
        .bearer_auth(&alice)
        .header("Last-Event-ID", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

/// "pid 3" or "pids 1, 4", as the supernode's status lines say it.
fn pids_text(pids: &[u32]) -> String {
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    if pids.len() == 1 {
        format!("pid {}", list[0])
    } else {
        format!("pids {}", list.join(", "))
    }
}

/// docs/fault-tolerance.md, "Failure and restore" 1 and 5: a peer whose lease
/// expires is gone; its processes are re-placed on the remaining peers in a
/// new epoch sent to every live peer of the job with `restore`, and the job
/// goes on. The gone peer is fenced; the restore becomes a rolled-back event.
#[tokio::test]
async fn a_lost_peer_s_processes_are_restored_on_the_others_in_a_new_epoch() {
    let h = Harness::start_with(|c| c.lease_ttl = Duration::from_millis(1_500)).await;
    let alice = h.login("alice", "alice-password").await;
    h.sn.register_builtin("ring", "", &wasm(GUEST))
        .await
        .unwrap();
    let mut dying = h.peer_login(login_body("dying", 4, None)).await;
    let mut a = h.peer_login(login_body("a", 4, None)).await;
    let mut b = h.peer_login(login_body("b", 4, None)).await;
    let keep = [h.keep_alive(&a), h.keep_alive(&b)];
    let job = h.submit(&alice, "ring", 12).await;
    let first = start_job(&h.commands(&mut dying).await);
    assert_eq!((first.epoch, first.limits.replicas), (0, 2));
    assert!(first.restore.is_empty() && first.migrate.is_empty());
    start_job(&h.commands(&mut a).await);
    start_job(&h.commands(&mut b).await);
    let lost = hosts(&first, dying.id);
    assert!(!lost.is_empty() && lost.len() < 12, "{:?}", first.placement);

    // `dying` stops renewing: both others get epoch 1 with the lost pids in `restore`.
    let next = h.assignment_at(&mut a, job.id, 1).await;
    let next_b = h.assignment_at(&mut b, job.id, 1).await;
    assert_eq!(next.epoch, 1);
    assert_eq!(
        (&next.placement, &next.peers, &next.restore),
        (&next_b.placement, &next_b.peers, &next_b.restore)
    );
    assert_eq!(next.restore, lost);
    assert!(next.migrate.is_empty());
    assert_eq!(next.job_token, first.job_token);
    assert!(next.peers.iter().all(|p| p.id != dying.id));
    for pid in 0..12 {
        let before = host_of(&first, pid);
        let after = host_of(&next, pid);
        if lost.contains(&pid) {
            assert!(after == a.id || after == b.id, "pid {pid} went to {after}");
        } else {
            assert_eq!(before, after, "pid {pid} moved though its peer lives");
        }
    }
    let info = h.job(&alice, job.id).await;
    assert_eq!(info.state, JobState::Active);
    assert!(!info.placement.contains(&dying.id));

    // The zombie is fenced: no renewal, no commands, no report.
    let (status, body) = h.renew(&dying).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(api_error(&body).code, "lease_expired");
    let resp = h
        .http
        .get(h.url("/peer/commands?after=0&wait_ms=10"))
        .bearer_auth(&dying.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        h.report(&dying, vec![out(job.id, lost[0], 0, "zombie")])
            .await,
        StatusCode::UNAUTHORIZED
    );

    // The new host reports the restore: one rolled-back event; a stale epoch
    // or another peer's claim changes nothing.
    let pid = lost[0];
    let (host, other) = if host_of(&next, pid) == a.id {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let restored = |superstep, epoch| PeerEvent::ProcessRestored {
        job: job.id,
        pid,
        superstep,
        epoch,
        from_start: false,
    };
    assert_eq!(
        h.report(other, vec![restored(7, 1)]).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        h.report(host, vec![restored(9, 0), restored(3, 1), restored(3, 1)])
            .await,
        StatusCode::NO_CONTENT
    );

    // Every process exits; restored ones may report their exit twice.
    for peer in [&a, &b] {
        let mut events: Vec<PeerEvent> = hosts(&next, peer.id)
            .into_iter()
            .map(|pid| exited(job.id, pid))
            .collect();
        events.extend(events.clone());
        assert_eq!(h.report(peer, events).await, StatusCode::NO_CONTENT);
    }
    let done = h.job(&alice, job.id).await;
    assert_eq!((done.outcome, done.exited), (Some(JobOutcome::Exited), 12));
    let events = h.events(&alice, job.id, None).await;
    let lost_line = format!(
        "peer #{} lost: it stopped renewing its lease; restoring {} on ",
        dying.id,
        pids_text(&lost)
    );
    assert!(
        events.iter().any(|(_, _, e)| matches!(&e.kind,
            JobEventKind::Status { text } if text.starts_with(&lost_line) && text.ends_with("(epoch 1)"))),
        "no status line `{lost_line}…`: {events:?}"
    );
    let rolled: Vec<(Option<u32>, &JobEventKind)> = events
        .iter()
        .filter(|e| e.1 == "process_rolled_back")
        .map(|(_, _, e)| (e.pid, &e.kind))
        .collect();
    assert_eq!(
        rolled,
        vec![(
            Some(pid),
            &JobEventKind::ProcessRolledBack {
                superstep: 3,
                from_start: false
            }
        )]
    );
    assert_eq!(
        events.iter().filter(|e| e.1 == "process_exited").count(),
        12
    );
    assert!(events.iter().all(|e| e.1 != "stdout"), "the zombie wrote");

    // Logging in again keeps the peer's id; an online peer's id is not handed out twice.
    let back = h.peer_login(login_body("dying", 2, Some(dying.id))).await;
    assert_eq!(back.id, dying.id);
    let twin = h.peer_login(login_body("twin", 2, Some(a.id))).await;
    assert_ne!(twin.id, a.id);
    for k in keep {
        k.abort();
    }
}

/// docs/fault-tolerance.md, "Replicas": with a single peer in the network a
/// loss of that peer loses the job, and the reason says why.
#[tokio::test]
async fn a_job_fails_only_when_no_live_peer_is_left() {
    let h = Harness::start_with(|c| c.lease_ttl = Duration::from_millis(1_000)).await;
    let alice = h.login("alice", "alice-password").await;
    h.sn.register_builtin("ring", "", &wasm(GUEST))
        .await
        .unwrap();
    let mut lonely = h.peer_login(login_body("lonely", 2, None)).await;
    let job = h.submit(&alice, "ring", 2).await;
    start_job(&h.commands(&mut lonely).await);
    let failed = h
        .wait_job(&alice, job.id, "the job to fail", |j| {
            j.state == JobState::Finished
        })
        .await;
    assert_eq!(failed.outcome, Some(JobOutcome::Failed));
    let error = failed.error.unwrap();
    assert_eq!(
        error,
        format!(
            "peer lonely (#{}) stopped renewing its lease and no live peer is left to restore pids 0, 1",
            lonely.id
        )
    );
    let events = h.events(&alice, job.id, None).await;
    assert_eq!(events.last().unwrap().1, "job_failed");
}

/// Issue 19: a gone peer used to keep showing the memory of its last
/// renewal, as if it still held it.
#[tokio::test]
async fn a_gone_peer_shows_no_stale_memory() {
    let h = Harness::start_with(|c| c.lease_ttl = Duration::from_millis(500)).await;
    let admin = h.login("admin", "admin-password").await;
    let p = h.peer_login(login_body("forgetful", 2, None)).await;
    assert_eq!(h.renew_memory(&p, 300 << 20, 1 << 30).await, StatusCode::OK);
    let listed = h.peer_list(&admin).await;
    let me = listed.iter().find(|x| x.id == p.id).unwrap();
    assert_eq!(
        (me.state.as_str(), me.memory.rss_bytes),
        ("online", 300 << 20)
    );
    let gone = poll("the peer's lease to lapse", || async {
        let peers = h.peer_list(&admin).await;
        peers
            .into_iter()
            .find(|x| x.id == p.id && x.state == "gone")
    })
    .await;
    assert_eq!(gone.memory, bsp_api::control::PeerMemory::default());
}

/// A supernode with `migration_interval`, alice's `ring` of 16 processes
/// started on two fake peers of 8 cores: the harness, alice's token, the
/// peers, the job and p1's assignment.
async fn ring16_on_two_peers(
    migration_interval: Duration,
) -> (Harness, String, FakePeer, FakePeer, JobInfo, JobAssignment) {
    let h = Harness::start_with(|c| c.migration_interval = migration_interval).await;
    let alice = h.login("alice", "alice-password").await;
    h.sn.register_builtin("ring", "", &wasm(GUEST))
        .await
        .unwrap();
    let mut p1 = h.peer_login(login_body("p1", 8, None)).await;
    let mut p2 = h.peer_login(login_body("p2", 8, None)).await;
    let job = h.submit(&alice, "ring", 16).await;
    let first = start_job(&h.commands(&mut p1).await);
    start_job(&h.commands(&mut p2).await);
    (h, alice, p1, p2, job, first)
}

/// docs/fault-tolerance.md, "Migration and drain": availability changes
/// within the hysteresis move nothing; a big drop migrates the peer's
/// processes whose DHHT host changed (epoch + 1, `migrate` = `restore`); the
/// old host's output counts until its handover; the new host's restore
/// becomes a migrated event; a second migration waits for the interval.
#[tokio::test]
async fn a_big_availability_drop_migrates_processes_and_small_ones_do_not() {
    let (h, alice, mut p1, mut p2, job, first) =
        ring16_on_two_peers(Duration::from_secs(3600)).await;
    let on_p1 = hosts(&first, p1.id);
    assert!(
        !on_p1.is_empty() && on_p1.len() < 16,
        "{:?}",
        first.placement
    );
    let placed = h.job(&alice, job.id).await.placement;

    // Changes of at most 25 % leave everything where it is.
    for idle in [0.9, 0.8, 0.95, 0.76, 1.0] {
        assert_eq!(h.renew_with(&p1, idle, false).await, StatusCode::OK);
        assert_eq!(h.job(&alice, job.id).await.placement, placed, "idle {idle}");
    }
    // A big drop moves processes from p1 to p2 in the next epoch (the first since placement).
    assert_eq!(h.renew_with(&p1, 0.1, false).await, StatusCode::OK);
    let next = h.assignment_at(&mut p2, job.id, 1).await;
    assert_eq!(next.epoch, 1, "small changes made no epoch");
    assert_eq!(
        h.assignment_at(&mut p1, job.id, 1).await.migrate,
        next.migrate
    );
    let moved = next.migrate.clone();
    assert!(!moved.is_empty());
    assert_eq!(next.restore, moved);
    for pid in 0..16 {
        if moved.contains(&pid) {
            assert_eq!((host_of(&first, pid), host_of(&next, pid)), (p1.id, p2.id));
        } else {
            assert_eq!(host_of(&first, pid), host_of(&next, pid));
        }
    }
    // p1 still hosts what it has not handed over yet.
    let count =
        |peers: &[PeerInfo], id: i64| peers.iter().find(|p| p.id == id).unwrap().processes as usize;
    assert_eq!(count(&h.peer_list(&alice).await, p1.id), on_p1.len());

    // The old host's output counts until its handover, and not after it.
    let m = moved[0];
    let handed = PeerEvent::ProcessHandedOver {
        job: job.id,
        pid: m,
        superstep: 4,
        epoch: 1,
    };
    h.report(
        &p1,
        vec![
            out(job.id, m, 0, "before the handover"),
            handed,
            out(job.id, m, 1, "after the handover"),
        ],
    )
    .await;
    assert_eq!(count(&h.peer_list(&alice).await, p1.id), on_p1.len() - 1);
    h.report(
        &p2,
        vec![PeerEvent::ProcessRestored {
            job: job.id,
            pid: m,
            superstep: 4,
            epoch: 1,
            from_start: false,
        }],
    )
    .await;

    // Back to idle: a big change, but the job migrated less than the interval ago.
    assert_eq!(h.renew_with(&p1, 1.0, false).await, StatusCode::OK);
    assert_eq!(h.job(&alice, job.id).await.placement, hosts_by_pid(&next));

    for (peer, a) in [(&p1, &next), (&p2, &next)] {
        let events = hosts(a, peer.id)
            .into_iter()
            .map(|pid| exited(job.id, pid))
            .collect();
        h.report(peer, events).await;
    }
    assert_eq!(
        h.job(&alice, job.id).await.outcome,
        Some(JobOutcome::Exited)
    );
    let events = h.events(&alice, job.id, None).await;
    let migrated: Vec<(Option<u32>, &JobEventKind)> = events
        .iter()
        .filter(|e| e.1 == "process_migrated")
        .map(|(_, _, e)| (e.pid, &e.kind))
        .collect();
    assert_eq!(
        migrated,
        vec![(
            Some(m),
            &JobEventKind::ProcessMigrated {
                from: p1.id,
                to: p2.id,
                superstep: 4
            }
        )]
    );
    let texts: Vec<&str> = events
        .iter()
        .filter_map(|(_, _, e)| match &e.kind {
            JobEventKind::Stdout { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["before the handover"]);
    let line = format!(
        "migrating {} from peer #{} to peer #{} (load change, epoch 1)",
        pids_text(&moved),
        p1.id,
        p2.id
    );
    assert!(
        events
            .iter()
            .any(|(_, _, e)| e.kind == JobEventKind::Status { text: line.clone() }),
        "no status line `{line}`"
    );
}

/// docs/fault-tolerance.md, "Migration and drain": a draining peer gets no
/// new processes, its processes migrate away at once, and once it handed
/// them over it leaves the job.
#[tokio::test]
async fn a_drained_peer_hands_everything_over_and_gets_no_new_work() {
    let (h, alice) = Harness::with_ring().await;
    let mut p1 = h.peer_login(login_body("p1", 4, None)).await;
    let mut p2 = h.peer_login(login_body("p2", 4, None)).await;
    let job = h.submit(&alice, "ring", 8).await;
    let first = start_job(&h.commands(&mut p1).await);
    start_job(&h.commands(&mut p2).await);
    let on_p1 = hosts(&first, p1.id);
    assert!(!on_p1.is_empty(), "{:?}", first.placement);

    let resp = h
        .http
        .post(h.url("/peer/drain"))
        .bearer_auth(&p1.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let next = h.assignment_at(&mut p2, job.id, 1).await;
    assert_eq!(
        (next.migrate.clone(), next.restore.clone()),
        (on_p1.clone(), on_p1.clone())
    );
    assert_eq!(hosts(&next, p2.id).len(), 8);
    assert_eq!(h.assignment_at(&mut p1, job.id, 1).await.migrate, on_p1);
    let p1_id = p1.id;
    let me = |peers: Vec<PeerInfo>| peers.into_iter().find(|p| p.id == p1_id).unwrap();
    let info = me(h.peer_list(&alice).await);
    assert_eq!(
        (info.state.as_str(), info.processes as usize),
        ("draining", on_p1.len())
    );

    // A new job goes to p2 only.
    let second = h.submit(&alice, "ring", 4).await;
    let a = h.assignment_at(&mut p2, second.id, 0).await;
    assert_eq!(
        a.peers.iter().map(|p| p.id).collect::<Vec<_>>(),
        vec![p2.id]
    );

    // p1 hands everything over, then leaves the job (a KillJob for it, epoch 2 for p2).
    let handovers = on_p1
        .iter()
        .map(|&pid| PeerEvent::ProcessHandedOver {
            job: job.id,
            pid,
            superstep: 1,
            epoch: 1,
        })
        .collect();
    assert_eq!(h.report(&p1, handovers).await, StatusCode::NO_CONTENT);
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|c: &SeqCommand| matches!(&c.command, Command::KillJob { job: j, .. } if *j == job.id))
    {
        seen.extend(h.commands(&mut p1).await);
    }
    assert!(
        seen.iter()
            .all(|c| !matches!(&c.command, Command::StartJob(a) if a.job == second.id)),
        "{seen:?}"
    );
    let last = h.assignment_at(&mut p2, job.id, 2).await;
    assert_eq!(
        last.peers.iter().map(|p| p.id).collect::<Vec<_>>(),
        vec![p2.id]
    );
    assert!(last.restore.is_empty());
    let info = me(h.peer_list(&alice).await);
    assert_eq!((info.state.as_str(), info.processes), ("draining", 0));

    // `draining` in a renewal drains too.
    let p3 = h.peer_login(login_body("p3", 4, None)).await;
    assert_eq!(h.renew_with(&p3, 1.0, true).await, StatusCode::OK);
    let peers = h.peer_list(&alice).await;
    assert_eq!(
        peers.iter().find(|p| p.id == p3.id).unwrap().state,
        "draining"
    );
}

/// The commands after `seen`, as (seq, job, epoch of a `StartJob`), without
/// acknowledging any.
async fn pending_starts(h: &Harness, token: &str, seen: u64) -> Vec<(u64, i64, Option<u64>)> {
    let resp = h
        .http
        .get(h.url(&format!("/peer/commands?after={seen}&wait_ms=2000")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let cmds: bsp_api::control::Commands = resp.json().await.unwrap();
    cmds.commands
        .into_iter()
        .map(|c| match c.command {
            Command::StartJob(a) => (c.seq, a.job, Some(a.epoch)),
            Command::KillJob { job, .. } => (c.seq, job, None),
        })
        .collect()
}

/// docs/fault-tolerance.md, "Supernode restart": unfetched commands keep
/// their sequence numbers, leases get a fresh TTL instead of expiring, and
/// event ids keep increasing (even past the events of a disposed job).
#[tokio::test]
async fn commands_leases_and_event_ids_survive_a_restart() {
    let (h, alice) = Harness::with_ring().await;
    let mut peer = h.peer_login(login_body("p1", 4, None)).await;
    let kept = h.submit(&alice, "ring", 2).await;
    let gone = h.submit(&alice, "ring", 1).await;
    // Look without acknowledging (after=0), then acknowledge the first command.
    let token = peer.token.clone();
    let all = poll("both start commands", || async {
        let p = pending_starts(&h, &token, 0).await;
        (p.len() == 2).then_some(p)
    })
    .await;
    assert_eq!(
        all.iter().map(|c| c.1).collect::<Vec<_>>(),
        vec![kept.id, gone.id]
    );
    assert_eq!(pending_starts(&h, &token, all[0].0).await, all[1..]);
    peer.seen = all[0].0;
    // The second job ends and is disposed of: its events held the highest ids.
    h.report(&peer, vec![out(gone.id, 0, 0, "bye"), exited(gone.id, 0)])
        .await;
    let highest = h.events(&alice, gone.id, None).await.last().unwrap().2.id;
    let (status, _) = h
        .call(
            reqwest::Method::DELETE,
            &format!("/jobs/{}", gone.id),
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let unfetched = pending_starts(&h, &token, peer.seen).await;
    assert_eq!(
        unfetched.len(),
        2,
        "StartJob and KillJob of the second job: {unfetched:?}"
    );
    assert_eq!(unfetched[0], all[1]);
    let dir = h.stop().await;

    // The stored lease ran out long ago: the restart grants a fresh TTL anyway.
    execute_stored(dir.path(), "UPDATE peers SET lease_expires_at = 0");
    let h = Harness::start_in(dir, |_| {}, false).await;
    assert_eq!(pending_starts(&h, &token, peer.seen).await, unfetched);
    assert_eq!(h.renew(&peer).await.0, StatusCode::OK);
    h.report(&peer, vec![out(kept.id, 0, 0, "after the restart")])
        .await;
    h.report(&peer, vec![exited(kept.id, 0), exited(kept.id, 1)])
        .await;
    let events = h.events(&alice, kept.id, None).await;
    let after: Vec<i64> = events
        .iter()
        .filter(|e| e.1 != "status")
        .map(|e| e.2.id)
        .collect();
    assert_eq!(after.len(), 4, "{events:?}");
    assert!(
        after.iter().all(|&id| id > highest),
        "{after:?} vs {highest}"
    );
}

/// A supernode that takes longer than a lease to start serving (examples
/// to register, a loaded machine) declares no peer gone for it: peers
/// cannot renew before it serves, so their leases run from then.
#[tokio::test]
async fn a_slow_start_costs_no_peer_its_lease() {
    let ttl = Duration::from_millis(500);
    let h = Harness::start_with(|c| c.lease_ttl = ttl).await;
    let peer = h.peer_login(login_body("p1", 4, None)).await;
    let dir = h.stop().await;
    let h = Harness::start_in_after(dir, |c| c.lease_ttl = ttl, false, 2 * ttl).await;
    assert_eq!(h.renew(&peer).await.0, StatusCode::OK);
}

#[tokio::test]
async fn jobs_wait_in_the_ready_queue_under_overload() {
    let h = Harness::start_with(|c| c.overload_factor = 1.0).await;
    let alice = h.login("alice", "alice-password").await;
    h.sn.register_builtin("ring", "", &wasm(GUEST))
        .await
        .unwrap();
    let mut peer = h.peer_login(login_body("p1", 2, None)).await;
    // Capacity 2 processes: the first job (3 > 2) still runs since nothing
    // else does; the second waits for it, and the third waits behind it (FIFO).
    let first = h.submit(&alice, "ring", 3).await;
    assert_eq!(start_job(&h.commands(&mut peer).await).job, first.id);
    let second = h.submit(&alice, "ring", 1).await;
    let third = h.submit(&alice, "ring", 1).await;
    // Submitting woke the scheduler; an explicit kick proves nothing changes.
    h.renew(&peer).await;
    assert_eq!(h.job(&alice, second.id).await.state, JobState::Waiting);
    assert_eq!(h.job(&alice, third.id).await.state, JobState::Waiting);

    h.report(
        &peer,
        vec![
            exited(first.id, 0),
            exited(first.id, 1),
            exited(first.id, 2),
        ],
    )
    .await;
    let placed: Vec<i64> = {
        let mut jobs = Vec::new();
        while jobs.len() < 2 {
            for c in h.commands(&mut peer).await {
                if let Command::StartJob(a) = c.command {
                    jobs.push(a.job);
                }
            }
        }
        jobs
    };
    assert_eq!(placed, vec![second.id, third.id]);
}

#[tokio::test]
async fn malformed_requests_get_api_errors() {
    let h = Harness::start().await;
    let alice = h.login("alice", "alice-password").await;
    let resp = h
        .http
        .post(h.url("/jobs"))
        .bearer_auth(&alice)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let e: ApiError = resp.json().await.unwrap();
    assert_eq!(e.code, "bad_json");

    let resp = h
        .http
        .post(h.url("/login"))
        .body(vec![b' '; 2 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let e: ApiError = resp.json().await.unwrap();
    assert_eq!(e.code, "too_large");

    let (status, body) = h.get("/jobs/abc", &alice).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    api_error(&body);
    let (status, body) = h.get("/no/such/thing", &alice).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    api_error(&body);
    let (status, body) = h
        .call(reqwest::Method::PUT, "/jobs", Some(&alice), None)
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    api_error(&body);

    // Peer logins are checked field by field.
    for (login, needle) in [
        (
            PeerLogin {
                addr: "nowhere".into(),
                ..login_body("p", 1, None)
            },
            "addr",
        ),
        (
            PeerLogin {
                speed: f64::from(0u8),
                ..login_body("p", 1, None)
            },
            "speed",
        ),
        (
            PeerLogin {
                idle: 1.5,
                ..login_body("p", 1, None)
            },
            "idle",
        ),
        (
            PeerLogin {
                cores: 0,
                ..login_body("p", 1, None)
            },
            "cores",
        ),
        (
            PeerLogin {
                cluster: Some("a b".into()),
                ..login_body("p", 1, None)
            },
            "cluster",
        ),
        (
            PeerLogin {
                version: 999,
                ..login_body("p", 1, None)
            },
            "version",
        ),
    ] {
        let resp = h
            .http
            .post(h.url("/peer/login"))
            .json(&login)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let e: ApiError = resp.json().await.unwrap();
        assert!(e.message.contains(needle), "{}", e.message);
    }

    // The web UI is served at the root.
    let resp = h.http.get(format!("{}/", h.base)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.text().await.unwrap().contains("bspweb"));
}

#[tokio::test]
async fn state_survives_a_restart() {
    let (h, alice) = Harness::with_ring().await;
    let mut peer = h.peer_login(login_body("p1", 4, None)).await;
    // A peer that dies while the supernode is down.
    let dead = h
        .peer_login(PeerLogin {
            addr: dead_addr(),
            ..login_body("dies", 1, None)
        })
        .await;
    let job = h.submit(&alice, "ring", 2).await;
    start_job(&h.commands(&mut peer).await);
    h.report(&peer, vec![out(job.id, 0, 0, "before the restart")])
        .await;
    let dir = h.stop().await;

    let h = Harness::start_in(dir, |_| {}, false).await;
    // Old tokens stay valid: the secret is persisted.
    assert_eq!(h.job(&alice, job.id).await.state, JobState::Active);
    let (status, _) = h.renew(&peer).await;
    assert_eq!(status, StatusCode::OK);
    // The supernode dials every peer recorded online at start: the dead
    // one's port refuses, so it is gone at once (no lease ran out here).
    poll("the dead peer declared gone", || async {
        (h.renew(&dead).await.0 == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    assert_eq!(h.renew(&peer).await.0, StatusCode::OK);
    h.report(
        &peer,
        vec![
            out(job.id, 0, 0, "before the restart"),
            exited(job.id, 0),
            exited(job.id, 1),
        ],
    )
    .await;
    let done = h.job(&alice, job.id).await;
    assert_eq!(done.outcome, Some(JobOutcome::Exited));
    let events = h.events(&alice, job.id, None).await;
    assert_eq!(events.iter().filter(|e| e.1 == "stdout").count(), 1);
    // A new job goes to the re-attached peer, with command numbers that keep rising.
    let seen = peer.seen;
    let second = h.submit(&alice, "ring", 1).await;
    let mut cmds = Vec::new();
    while !cmds
        .iter()
        .any(|c: &SeqCommand| matches!(&c.command, Command::StartJob(a) if a.job == second.id))
    {
        cmds.extend(h.commands(&mut peer).await);
    }
    assert!(cmds[0].seq > seen);
}

#[tokio::test]
async fn killing_an_active_job_stops_it_on_its_peer_and_stale_jobs_are_stopped_on_renewal() {
    let (h, alice) = Harness::with_ring().await;
    let mut peer = h.peer_login(login_body("p1", 4, None)).await;
    let job = h.submit(&alice, "ring", 2).await;
    start_job(&h.commands(&mut peer).await);

    let (status, body) = h
        .post(&format!("/jobs/{}/kill", job.id), &alice, Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let cmds = h.commands(&mut peer).await;
    assert!(
        matches!(&cmds[..], [SeqCommand { command: Command::KillJob { job: j, .. }, .. }] if *j == job.id),
        "{cmds:?}"
    );
    // Reports about the killed job are ignored.
    h.report(
        &peer,
        vec![out(job.id, 0, 0, "after the kill"), exited(job.id, 0)],
    )
    .await;
    let killed = h.job(&alice, job.id).await;
    assert_eq!(
        (killed.outcome, killed.exited),
        (Some(JobOutcome::Killed), 0)
    );
    let events = h.events(&alice, job.id, None).await;
    assert_eq!(events.last().unwrap().1, "job_killed");
    assert!(events.iter().all(|e| e.1 != "stdout"));

    // A peer that says it runs a job the supernode does not know there is told to stop it.
    let resp = h
        .http
        .post(h.url("/peer/renew"))
        .bearer_auth(&peer.token)
        .json(&PeerRenew {
            idle: 0.5,
            jobs: vec![job.id, 12345],
            memory: PeerMemory {
                rss_bytes: 30 << 20,
                held_bytes: 1234,
                budget_bytes: 0,
            },
            ..PeerRenew::idle(2.0)
        })
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let cmds = h.commands(&mut peer).await;
    let stopped: Vec<i64> = cmds
        .iter()
        .filter_map(|c| match &c.command {
            Command::KillJob { job, .. } => Some(*job),
            _ => None,
        })
        .collect();
    assert_eq!(stopped, vec![job.id, 12345]);
    let (_, peers) = h.get("/peers", &alice).await;
    let peers: Vec<PeerInfo> = serde_json::from_value(peers).unwrap();
    assert_eq!((peers[0].speed, peers[0].idle), (2.0, 0.5));
    assert_eq!(
        peers[0].memory,
        PeerMemory {
            rss_bytes: 30 << 20,
            held_bytes: 1234,
            budget_bytes: 0
        }
    );
    // Sizes SQLite cannot hold are refused, and change nothing.
    let resp = h
        .http
        .post(h.url("/peer/renew"))
        .bearer_auth(&peer.token)
        .json(&PeerRenew {
            idle: 0.5,
            memory: PeerMemory {
                rss_bytes: u64::MAX,
                held_bytes: 0,
                budget_bytes: 0,
            },
            ..PeerRenew::idle(2.0)
        })
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let (_, peers) = h.get("/peers", &alice).await;
    let peers: Vec<PeerInfo> = serde_json::from_value(peers).unwrap();
    assert_eq!(peers[0].memory.held_bytes, 1234);
}

/// §4.2.2: a peer's share of the ring grows with its power (speed × idle).
#[tokio::test]
async fn faster_peers_get_more_processes() {
    let (h, alice) = Harness::with_ring().await;
    let slow = h.peer_login(login_body("slow", 64, None)).await;
    let mut fast = h
        .peer_login(PeerLogin {
            speed: 4.0,
            ..login_body("fast", 64, None)
        })
        .await;
    let job = h.submit(&alice, "ring", 200).await;
    let a = start_job(&h.commands(&mut fast).await);
    assert_eq!(a.job, job.id);
    let count = |id: i64| {
        a.placement
            .iter()
            .filter(|&&i| a.peers[i as usize].id == id)
            .count()
    };
    let (on_slow, on_fast) = (count(slow.id), count(fast.id));
    assert_eq!(on_slow + on_fast, 200);
    // The fast peer is new and unmeasured: on probation it gets at most
    // twice the other's power (2 of its claimed 4), so about 2:1.
    assert!(
        on_fast > on_slow * 3 / 2 && on_slow > 0,
        "slow {on_slow}, fast {on_fast}"
    );
    let (_, peers) = h.get("/peers", &alice).await;
    let peers: Vec<PeerInfo> = serde_json::from_value(peers).unwrap();
    let processes: Vec<(i64, u32)> = peers.iter().map(|p| (p.id, p.processes)).collect();
    assert_eq!(
        processes,
        vec![(slow.id, on_slow as u32), (fast.id, on_fast as u32)]
    );
}

/// Reads `job_list_changed` events from an open `GET /api/v1/events`
/// response until `n` have arrived (10 s limit).
async fn list_changes(resp: &mut reqwest::Response, buf: &mut String, n: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut out = Vec::new();
        // Only messages terminated by a blank line are complete.
        let complete = &buf[..buf.rfind("\n\n").map_or(0, |i| i + 2)];
        for block in complete.split("\n\n").filter(|b| b.contains("data:")) {
            assert!(block.contains("event: job_list_changed"), "{block}");
            let data = block
                .lines()
                .find_map(|l| l.strip_prefix("data:"))
                .unwrap()
                .trim();
            out.push(serde_json::from_str(data).unwrap());
        }
        if out.len() >= n {
            return out;
        }
        let chunk = tokio::time::timeout_at(deadline, resp.chunk())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {n} list changes, got {out:?}"))
            .unwrap()
            .expect("the stream stays open");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test]
async fn the_job_list_stream_tells_the_owner_of_every_state_change_and_nobody_else() {
    let (h, alice) = Harness::with_ring().await;
    let bob = h.login("bob", "bob-password").await;
    let open = |token: &str| {
        h.http
            .get(h.url("/events"))
            .bearer_auth(token.to_string())
            .send()
    };
    let mut alice_stream = open(&alice).await.unwrap();
    assert_eq!(alice_stream.status(), StatusCode::OK);
    assert!(
        alice_stream.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut bob_stream = open(&bob).await.unwrap();
    let mut buf = String::new();

    let job = h.submit(&alice, "ring", 2).await;
    let got = list_changes(&mut alice_stream, &mut buf, 1).await;
    assert_eq!(got[0], json!({"job": job.id, "state": "waiting"}));

    let mut peer = h.peer_login(login_body("p1", 4, None)).await;
    h.commands(&mut peer).await;
    let got = list_changes(&mut alice_stream, &mut buf, 2).await;
    assert_eq!(got[1], json!({"job": job.id, "state": "active"}));

    let (status, _) = h
        .post(&format!("/jobs/{}/kill", job.id), &alice, json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let got = list_changes(&mut alice_stream, &mut buf, 3).await;
    assert_eq!(got[2], json!({"job": job.id, "state": "finished"}));

    let (status, _) = h
        .call(
            reqwest::Method::DELETE,
            &format!("/jobs/{}", job.id),
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let got = list_changes(&mut alice_stream, &mut buf, 4).await;
    assert_eq!(got[3], json!({"job": job.id, "state": null}));

    // Bob saw none of it: his next event is about his own job.
    let mine = h.submit(&bob, "ring", 1).await;
    let mut bob_buf = String::new();
    let got = list_changes(&mut bob_stream, &mut bob_buf, 1).await;
    assert_eq!(got[0]["job"], mine.id);
}

#[tokio::test]
async fn progress_reports_show_up_per_pid_and_only_from_the_host() {
    let (h, alice) = Harness::with_ring().await;
    let job = h.submit(&alice, "ring", 2).await;
    let mut peer = h.peer_login(login_body("p1", 4, None)).await;
    let a = start_job(&h.commands(&mut peer).await);
    assert_eq!(a.job, job.id);
    assert_eq!(h.job(&alice, job.id).await.supersteps, vec![0, 0]);
    let progress = |pid, superstep| PeerEvent::Progress {
        job: job.id,
        pid,
        superstep,
    };
    assert_eq!(
        h.report(&peer, vec![progress(0, 3), progress(1, 2), progress(0, 4)])
            .await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(h.job(&alice, job.id).await.supersteps, vec![4, 2]);
    // A peer that does not host the process does not move its progress.
    let other = h.peer_login(login_body("p2", 1, None)).await;
    h.report(&other, vec![progress(1, 99)]).await;
    assert_eq!(h.job(&alice, job.id).await.supersteps, vec![4, 2]);
    // The exit's superstep is final.
    h.report(
        &peer,
        vec![PeerEvent::ProcessExited {
            job: job.id,
            pid: 1,
            superstep: 7,
        }],
    )
    .await;
    assert_eq!(h.job(&alice, job.id).await.supersteps, vec![4, 7]);
}

#[tokio::test]
async fn min_peers_refuses_a_job_the_network_cannot_start_now() {
    let (h, alice) = Harness::with_ring().await;
    let (status, body) = h
        .post(
            "/jobs",
            &alice,
            json!({"program": "ring", "nprocs": 2, "min_peers": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let e = api_error(&body);
    assert_eq!(e.code, "not_enough_peers");
    assert!(e.message.contains("0 peers are online"), "{}", e.message);
    let _peer = h.peer_login(login_body("p1", 4, None)).await;
    let (status, body) = h
        .post(
            "/jobs",
            &alice,
            json!({"program": "ring", "nprocs": 2, "min_peers": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // An unknown program has its own code.
    let (status, body) = h
        .post("/jobs", &alice, json!({"program": "nope", "nprocs": 2}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(api_error(&body).code, "program_not_found");
}

#[tokio::test]
async fn programs_are_deleted_by_name_or_hash_but_builtins_stay() {
    let (h, alice) = Harness::with_ring().await;
    let bob = h.login("bob", "bob-password").await;
    let (status, body) = h.upload(&alice, Some("mine"), wasm(OTHER_GUEST)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let hash = body["hash"].as_str().unwrap().to_string();
    let (status, _) = h.upload(&bob, Some("his"), wasm(OTHER_GUEST)).await;
    assert_eq!(status, StatusCode::OK);
    let h = &h;
    let delete = |token: String, what: String| async move {
        h.call(
            reqwest::Method::DELETE,
            &format!("/programs/{what}"),
            Some(&token),
            None,
        )
        .await
    };
    let names = |token: String| async move {
        let (_, list) = h.get("/programs", &token).await;
        let list: Vec<ProgramInfo> = serde_json::from_value(list).unwrap();
        list.into_iter()
            .map(|p| p.name.unwrap_or(p.hash))
            .collect::<Vec<_>>()
    };
    let (status, body) = delete(alice.clone(), "ring".into()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = delete(alice.clone(), "nothing".into()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(api_error(&body).code, "program_not_found");
    let (status, _) = delete(alice.clone(), "mine".into()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(names(alice.clone()).await, vec!["ring".to_string()]);
    // Bob's name for the same module is untouched; he deletes by hash.
    assert!(names(bob.clone()).await.contains(&"his".to_string()));
    let (status, _) = delete(bob.clone(), hash.clone()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(names(bob.clone()).await, vec!["ring".to_string()]);
    // Nobody refers to the module any more: running it by hash fails.
    let (status, body) = h
        .post("/jobs", &bob, json!({"program": hash, "nprocs": 1}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn the_ring_shows_peer_shares_and_the_callers_processes() {
    let (h, alice) = Harness::with_ring().await;
    let bob = h.login("bob", "bob-password").await;
    let mut p1 = h.peer_login(login_body("p1", 4, None)).await;
    let mut p2 = h.peer_login(login_body("p2", 4, None)).await;
    let job = h.submit(&alice, "ring", 5).await;
    h.commands(&mut p1).await;
    h.commands(&mut p2).await;
    let (status, ring) = h.get("/ring", &alice).await;
    assert_eq!(status, StatusCode::OK, "{ring}");
    let ring: bsp_api::rest::RingInfo = serde_json::from_value(ring).unwrap();
    assert_eq!(ring.peers.len(), 2);
    let total: f64 = ring.peers.iter().map(|p| p.share).sum();
    assert!((total - 1.0).abs() < 1e-9, "shares sum to {total}");
    for p in &ring.peers {
        assert!((0.0..1.0).contains(&p.position));
        assert!(p.share > 0.0 && p.weight > 0.0, "{p:?}");
    }
    let placed = h.job(&alice, job.id).await.placement;
    assert_eq!(ring.processes.len(), 5);
    for p in &ring.processes {
        assert_eq!(p.job, job.id);
        assert_eq!(p.peer, placed[p.pid as usize]);
        assert!((0.0..1.0).contains(&p.position));
    }
    // Bob sees the peers, not Alice's processes.
    let (_, ring) = h.get("/ring", &bob).await;
    assert_eq!(ring["peers"].as_array().unwrap().len(), 2);
    assert!(ring["processes"].as_array().unwrap().is_empty());
}

/// docs/fault-tolerance.md, "Failure and restore" 0: a peer reported
/// unreachable by another peer of its job is declared gone at once only if
/// the supernode, dialing its data-plane address itself, is refused. A peer
/// whose port accepts connections stays (the report alone counts for
/// nothing), and so do reports about peers outside the job or about the
/// reporter itself. Leases are long here, so only the report can act.
#[tokio::test]
async fn a_peer_reported_unreachable_is_gone_at_once_only_if_its_port_refuses() {
    let h = Harness::start_with(|c| c.lease_ttl = Duration::from_secs(120)).await;
    let alice = h.login("alice", "alice-password").await;
    h.sn.register_builtin("ring", "", &wasm(GUEST))
        .await
        .unwrap();
    let alive_port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut reporter = h.peer_login(login_body("reporter", 4, None)).await;
    let alive = h
        .peer_login(PeerLogin {
            addr: alive_port.local_addr().unwrap().to_string(),
            ..login_body("alive", 4, None)
        })
        .await;
    let dead = h
        .peer_login(PeerLogin {
            addr: dead_addr(),
            ..login_body("dead", 4, None)
        })
        .await;
    let _keep = [
        h.keep_alive(&reporter),
        h.keep_alive(&alive),
        h.keep_alive(&dead),
    ];
    let job = h.submit(&alice, "ring", 12).await;
    let first = start_job(&h.commands(&mut reporter).await);
    let ids: Vec<i64> = first.peers.iter().map(|p| p.id).collect();
    assert!(
        ids.contains(&alive.id) && ids.contains(&dead.id),
        "{:?}",
        first.peers
    );
    let unreachable = |peer| PeerEvent::PeerUnreachable { job: job.id, peer };

    // Not on the report's word: the alive peer's port is dialed (every dial
    // of the check is accepted here) and nothing changes.
    assert_eq!(
        h.report(
            &reporter,
            vec![
                unreachable(alive.id),
                unreachable(reporter.id),
                unreachable(987_654)
            ]
        )
        .await,
        StatusCode::NO_CONTENT
    );
    for _ in 0..4 {
        tokio::time::timeout(Duration::from_secs(10), alive_port.accept())
            .await
            .expect("the supernode dials the suspect")
            .unwrap();
    }
    // The check is over once its last dial was accepted and answered.
    let info = h.job(&alice, job.id).await;
    assert_eq!(info.state, JobState::Active);
    assert_eq!(info.placement, hosts_by_pid(&first));

    // The dead peer's port refuses: it is gone now, its processes restored.
    let lost = hosts(&first, dead.id);
    assert_eq!(
        h.report(&reporter, vec![unreachable(dead.id)]).await,
        StatusCode::NO_CONTENT
    );
    let next = h.assignment_at(&mut reporter, job.id, 1).await;
    assert_eq!(next.restore, lost);
    let ids: Vec<i64> = next.peers.iter().map(|p| p.id).collect();
    assert!(
        !ids.contains(&dead.id) && ids.contains(&alive.id),
        "{ids:?}"
    );
    let (status, body) = h.renew(&dead).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(api_error(&body).code, "lease_expired");
    let (status, _) = h.renew(&alive).await;
    assert_eq!(status, StatusCode::OK);
}

/// A raw connection from `ip` (any 127.x address is loopback on Linux).
async fn raw_from(ip: &str, base: &str) -> tokio::net::TcpStream {
    let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// What the server sends on `s` until it closes, within `limit`; `None` if
/// it keeps the connection open that long.
async fn read_to_close(s: &mut tokio::net::TcpStream, limit: Duration) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    match tokio::time::timeout(limit, s.read_to_end(&mut got)).await {
        Ok(_) => Some(String::from_utf8_lossy(&got).into_owned()),
        Err(_) => None,
    }
}

/// One GET on a fresh connection from `ip`: the status line.
async fn get_from(ip: &str, base: &str, path: &str) -> String {
    use tokio::io::AsyncWriteExt;
    let mut s = raw_from(ip, base).await;
    let req = format!("GET /api/v1{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let answer = read_to_close(&mut s, Duration::from_secs(10))
        .await
        .expect("answered");
    answer.lines().next().unwrap_or_default().to_string()
}

/// Issue 20, finding 3 (slowloris): requests whose headers never finish are
/// closed after the header timeout, and one address cannot hold more than
/// its share of connections, so others are still served.
#[tokio::test(flavor = "multi_thread")]
async fn slow_headers_are_cut_off_and_one_address_cannot_take_every_connection() {
    use tokio::io::AsyncWriteExt;
    let h = Harness::start_with(|c| {
        c.http.header_timeout = Duration::from_secs(1);
        c.http.max_connections_per_address = 8;
    })
    .await;
    let mut slow = Vec::new();
    for _ in 0..8 {
        let mut s = raw_from("127.0.0.3", &h.base).await;
        s.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    // The ninth from that address is closed at once, unanswered.
    let mut ninth = raw_from("127.0.0.3", &h.base).await;
    assert_eq!(
        read_to_close(&mut ninth, Duration::from_secs(10)).await,
        Some(String::new())
    );
    // Another address is served meanwhile.
    assert_eq!(
        get_from("127.0.0.4", &h.base, "/health").await,
        "HTTP/1.1 200 OK"
    );
    // The slow ones are closed once their headers are late...
    for s in &mut slow {
        assert!(
            read_to_close(s, Duration::from_secs(30)).await.is_some(),
            "a request whose headers never finish is still open"
        );
    }
    // ... and no longer count against their address.
    assert_eq!(
        get_from("127.0.0.3", &h.base, "/health").await,
        "HTTP/1.1 200 OK"
    );
    h.stop().await;
}

/// At the connection limit the supernode stops accepting: a new client
/// waits (in the kernel's backlog) and is served as soon as a connection
/// closes, instead of the supernode running out of file descriptors.
#[tokio::test(flavor = "multi_thread")]
async fn at_the_connection_limit_new_clients_wait_for_a_free_slot() {
    use tokio::io::AsyncWriteExt;
    let h = Harness::start_with(|c| c.http.max_connections = 4).await;
    let mut idle = Vec::new();
    for i in 0..4 {
        idle.push(raw_from(&format!("127.0.1.{i}"), &h.base).await);
    }
    let base = h.base.clone();
    let waiting = tokio::spawn(async move { get_from("127.0.2.1", &base, "/health").await });
    let mut waiting = std::pin::pin!(waiting);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), waiting.as_mut())
            .await
            .is_err(),
        "served beyond the connection limit"
    );
    idle.pop().unwrap().shutdown().await.unwrap();
    drop(idle.pop());
    let status = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once a slot is free")
        .unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK");
    drop(idle);
    h.stop().await;
}

/// `p1` of [`ring16_on_two_peers`] reports `idle`: some of its processes
/// move to `p2` in epoch 1 and are handed over; that assignment.
async fn first_load_move(
    h: &Harness,
    job: i64,
    (p1, p2): (&FakePeer, &mut FakePeer),
    first: &JobAssignment,
    idle: f64,
) -> JobAssignment {
    assert_eq!(h.renew_with(p1, idle, false).await, StatusCode::OK);
    let next = h.assignment_at(p2, job, 1).await;
    assert!(!next.migrate.is_empty());
    for &pid in &next.migrate {
        assert_eq!((host_of(first, pid), host_of(&next, pid)), (p1.id, p2.id));
        let handed = PeerEvent::ProcessHandedOver {
            job,
            pid,
            superstep: 3,
            epoch: 1,
        };
        h.report(p1, vec![handed]).await;
        let restored = PeerEvent::ProcessRestored {
            job,
            pid,
            superstep: 3,
            epoch: 1,
            from_start: false,
        };
        h.report(p2, vec![restored]).await;
    }
    next
}

/// Issue 20, finding 9: a process that moved for a load change does not
/// move straight back when the load swings back, even when the job's
/// migration interval has long passed (1 ms here).
#[tokio::test]
async fn a_process_does_not_move_back_and_forth_when_the_load_swings() {
    let (h, alice, p1, mut p2, job, first) = ring16_on_two_peers(Duration::from_millis(1)).await;

    // p1 gets busy: some of its processes move to p2, and are handed over.
    let next = first_load_move(&h, job.id, (&p1, &mut p2), &first, 0.1).await;
    let placed = h.job(&alice, job.id).await.placement;
    assert_eq!(placed, hosts_by_pid(&next));

    // p1 is idle again, and busy, and idle: nothing moves back.
    for idle in [1.0, 0.1, 1.0] {
        assert_eq!(h.renew_with(&p1, idle, false).await, StatusCode::OK);
        assert_eq!(
            h.job(&alice, job.id).await.placement,
            placed,
            "moved again at idle {idle}"
        );
    }
    for peer in [&p1, &p2] {
        let events = hosts(&next, peer.id)
            .into_iter()
            .map(|pid| exited(job.id, pid))
            .collect();
        h.report(peer, events).await;
    }
    let events = h.events(&alice, job.id, None).await;
    let migrations = events
        .iter()
        .filter(|(_, _, e)| {
            matches!(&e.kind, JobEventKind::Status { text } if text.starts_with("migrating"))
        })
        .count();
    assert_eq!(migrations, 1);
}

/// The hysteresis never keeps a process on a busy peer: processes that
/// just came to `p2` from `p1` leave it for `p1` when `p2`'s volunteer takes
/// the machine back (idle 0), although they would not return to `p1` for a
/// mere load change yet.
#[tokio::test]
async fn a_busy_peer_s_processes_leave_it_whatever_their_history() {
    let (h, alice, mut p1, mut p2, job, first) =
        ring16_on_two_peers(Duration::from_millis(1)).await;
    let next = first_load_move(&h, job.id, (&p1, &mut p2), &first, 0.1).await;
    let came = next.migrate.clone();
    // p1 is idle again: the newcomers stay on p2 (no return yet).
    assert_eq!(h.renew_with(&p1, 1.0, false).await, StatusCode::OK);
    assert_eq!(h.job(&alice, job.id).await.placement, hosts_by_pid(&next));

    // p2 gets busy: every process goes to p1, the newcomers too.
    assert_eq!(h.renew_with(&p2, 0.0, false).await, StatusCode::OK);
    let last = h.assignment_at(&mut p1, job.id, 2).await;
    assert_eq!(
        hosts_by_pid(&last),
        vec![p1.id; 16],
        "the processes that came from p1 ({came:?}) stayed on the busy p2"
    );
    assert!(came.iter().all(|pid| last.migrate.contains(pid)));
}

/// The next `StartJob` command for `peer` (after any others).
async fn next_start(h: &Harness, peer: &mut FakePeer) -> JobAssignment {
    loop {
        let cmds = h.commands(peer).await;
        if cmds
            .iter()
            .any(|c| matches!(c.command, Command::StartJob(_)))
        {
            return start_job(&cmds);
        }
    }
}

/// Issue 20, finding 4: one user cannot fill the supernode's disk. Output
/// counts against a per-user quota (1 MiB here); the job whose output
/// would exceed it fails, saying what to do; other users are unaffected,
/// and disposing of a finished job frees its share.
#[tokio::test]
async fn a_user_over_the_storage_quota_fails_only_their_job() {
    let h = Harness::start_with(|c| c.user_storage_mib = 1).await;
    let alice = h.login("alice", "alice-password").await;
    let bob = h.login("bob", "bob-password").await;
    h.sn.register_builtin("ring", "", &wasm(GUEST))
        .await
        .unwrap();
    let mut p1 = h.peer_login(login_body("p1", 8, None)).await;
    let big = "x".repeat(400 << 10);

    // Alice's first job stores 800 KiB and exits.
    let first = h.submit(&alice, "ring", 1).await;
    next_start(&h, &mut p1).await;
    h.report(
        &p1,
        vec![
            out(first.id, 0, 0, &big),
            out(first.id, 0, 1, &big),
            exited(first.id, 0),
        ],
    )
    .await;
    assert_eq!(
        h.job(&alice, first.id).await.outcome,
        Some(JobOutcome::Exited)
    );

    // Her second job's first 400 KiB would pass 1 MiB: it fails.
    let second = h.submit(&alice, "ring", 1).await;
    next_start(&h, &mut p1).await;
    h.report(&p1, vec![out(second.id, 0, 0, &big)]).await;
    let failed = h.job(&alice, second.id).await;
    assert_eq!(failed.outcome, Some(JobOutcome::Failed));
    let error = failed.error.unwrap();
    assert!(
        error.starts_with(
            "out of storage: the output of your jobs takes 0.8 MiB and your quota is 1 MiB"
        ),
        "{error}"
    );
    assert!(error.contains("bspweb dispose"), "{error}");

    // Bob is not affected.
    let bobs = h.submit(&bob, "ring", 1).await;
    next_start(&h, &mut p1).await;
    h.report(&p1, vec![out(bobs.id, 0, 0, &big), exited(bobs.id, 0)])
        .await;
    assert_eq!(h.job(&bob, bobs.id).await.outcome, Some(JobOutcome::Exited));

    // Disposing of her first job frees its share.
    let (status, _) = h
        .call(
            reqwest::Method::DELETE,
            &format!("/jobs/{}", first.id),
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let third = h.submit(&alice, "ring", 1).await;
    next_start(&h, &mut p1).await;
    h.report(&p1, vec![out(third.id, 0, 0, &big), exited(third.id, 0)])
        .await;
    assert_eq!(
        h.job(&alice, third.id).await.outcome,
        Some(JobOutcome::Exited)
    );
}

/// Issue 20, finding 1: admission respects the peers' memory. Each process
/// of `ring` (one page of memory, two replicas) is estimated at 1.25 MiB;
/// two peers may use 10 MiB each. A job that cannot fit in 20 MiB is
/// refused at once; one that fits in total but not in what the peers have
/// left waits, saying so, and is placed once they report room.
#[tokio::test]
async fn admission_respects_the_peers_memory_budgets() {
    let (h, alice) = Harness::with_ring().await;
    let mut p1 = h.peer_login(login_body("p1", 4, None)).await;
    let p2 = h.peer_login(login_body("p2", 4, None)).await;
    for p in [&p1, &p2] {
        assert_eq!(
            h.renew_memory(p, (9 * 1024 + 512) << 10, 10 << 20).await,
            StatusCode::OK
        );
    }

    // 20 processes need 25 MiB: more than both peers may use.
    let (status, body) = h
        .post(
            "/jobs",
            &alice,
            json!({"program": "ring", "nprocs": 20, "args": null}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(api_error(&body).code, "not_enough_memory");
    assert!(
        api_error(&body).message.starts_with(
            "the job needs about 25 MiB (20 processes of about 1.2 MiB each, with their checkpoints and 2 replicas), but the 2 online peers may use 20 MiB together"
        ),
        "{body}"
    );

    // 8 need 10 MiB: they fit in total, but each peer has 0.5 MiB left.
    let job = h.submit(&alice, "ring", 8).await;
    // The scheduler ran: the job says why it waits.
    let said = h
        .wait_event(&alice, job.id, |e| {
            matches!(&e.kind, JobEventKind::Status { text } if text.starts_with("waiting for memory"))
        })
        .await;
    let JobEventKind::Status { text } = said.kind else {
        unreachable!()
    };
    assert!(
        text.starts_with("waiting for memory: peer #")
            && text.contains("MiB in all, and has 0 MiB left of the memory its volunteer allows"),
        "{text}"
    );
    assert_eq!(h.job(&alice, job.id).await.state, JobState::Waiting);

    // The peers report room: it is placed.
    for p in [&p1, &p2] {
        assert_eq!(h.renew_memory(p, 100 << 10, 10 << 20).await, StatusCode::OK);
    }
    let placed = start_job(&h.commands(&mut p1).await);
    assert_eq!(placed.job, job.id);
}

/// A job whose share on some peer would exceed that peer's whole budget
/// cannot wait for room that will never come: it fails, saying so.
#[tokio::test]
async fn a_job_too_big_for_a_peers_budget_fails_at_once() {
    let (h, alice) = Harness::with_ring().await;
    let p1 = h.peer_login(login_body("p1", 4, None)).await;
    let p2 = h.peer_login(login_body("p2", 4, None)).await;
    for (p, budget) in [(&p1, 64u64 << 20), (&p2, 1 << 20)] {
        assert_eq!(h.renew_memory(p, 0, budget).await, StatusCode::OK);
    }
    // 8 processes of 1.25 MiB fit in 65 MiB, but p2's share does not fit
    // in its 1 MiB.
    let big = h.submit(&alice, "ring", 8).await;
    let failed = h
        .wait_job(&alice, big.id, "the big job's end", |j| j.outcome.is_some())
        .await;
    assert_eq!(failed.outcome, Some(JobOutcome::Failed));
    let error = failed.error.unwrap();
    assert!(
        error.starts_with(&format!("not enough memory: peer #{} (", p2.id))
            && error.contains("and may use only 1 MiB for bspweb"),
        "{error}"
    );
}

/// `/metrics` is served unless turned off; it names no user, program or peer.
#[tokio::test]
async fn metrics_are_served_unless_turned_off_and_name_nobody() {
    let h = Harness::start().await;
    let alice = h.login("alice", "alice-password").await;
    h.upload(&alice, Some("secret-program-name"), wasm(GUEST))
        .await;
    let p = h.peer_login(login_body("secret-peer-name", 2, None)).await;
    assert_eq!(h.renew_memory(&p, 1 << 20, 0).await, StatusCode::OK);
    let resp = h
        .http
        .get(format!("{}/metrics", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("bspweb_peers{state=\"online\"} 1\n"),
        "{text}"
    );
    assert!(text.contains("bspweb_peer_logins_total 1\n"), "{text}");
    assert!(text.contains("bspweb_lease_renewals_total 1\n"), "{text}");
    for secret in ["alice", "secret-program-name", "secret-peer-name"] {
        assert!(!text.contains(secret), "{secret} in\n{text}");
    }
    h.stop().await;

    let h = Harness::start_with(|c| c.metrics = false).await;
    let resp = h
        .http
        .get(format!("{}/metrics", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

// ------------------------------------------------------------------ accounts (issue 19)

impl Harness {
    async fn patch(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(reqwest::Method::PATCH, path, Some(token), Some(body))
            .await
    }

    /// Logs in, returning the status and error code or token.
    async fn try_login(&self, name: &str, password: &str) -> Result<String, (StatusCode, String)> {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                "/login",
                None,
                Some(json!({"name": name, "password": password})),
            )
            .await;
        if status == StatusCode::OK {
            Ok(body["token"].as_str().unwrap().to_string())
        } else {
            Err((status, api_error(&body).code))
        }
    }
}

#[tokio::test]
async fn admins_list_change_disable_and_enable_accounts() {
    let h = Harness::start().await;
    let admin = h.login("admin", "admin-password").await;
    let alice = h.login("alice", "alice-password").await;

    // Only administrators list and change accounts.
    let (status, body) = h.get("/users", &alice).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(api_error(&body).message.contains("only administrators"));
    let (status, body) = h
        .patch("/users/bob", &alice, json!({"disabled": true}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = h.get("/users", &admin).await;
    assert_eq!(status, StatusCode::OK);
    let users: Vec<UserInfo> = serde_json::from_value(body).unwrap();
    let names: Vec<&str> = users.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["admin", "alice", "bob"]);
    assert_eq!(users[0].role, Role::Admin);
    assert!(users[0].admin);
    assert_eq!(users[1].role, Role::User);
    assert_eq!(users[1].usage, Some(Default::default()));
    assert_eq!(
        users[1].quotas.max_output_mib, 4096,
        "the supernode's default"
    );

    // Disabling ends alice's login at once and refuses new ones.
    let (status, body) = h
        .patch("/users/alice", &admin, json!({"disabled": true}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["disabled"], true);
    let (status, body) = h.get("/jobs", &alice).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(api_error(&body).code, "account_disabled");
    assert_eq!(
        h.try_login("alice", "alice-password").await,
        Err((StatusCode::UNAUTHORIZED, "account_disabled".to_string()))
    );
    // A wrong password still says only that.
    assert_eq!(
        h.try_login("alice", "wrong-password").await,
        Err((StatusCode::UNAUTHORIZED, "unauthorized".to_string()))
    );
    // Enabled again, she logs in; the token of before stays dead.
    let (status, _) = h
        .patch("/users/alice", &admin, json!({"disabled": false}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let fresh = h.try_login("alice", "alice-password").await.unwrap();
    assert_eq!(h.get("/jobs", &fresh).await.0, StatusCode::OK);
    let (status, body) = h.get("/jobs", &alice).await;
    assert_eq!(
        (status, api_error(&body).code.as_str()),
        (StatusCode::UNAUTHORIZED, "token_expired")
    );

    // Administrators cannot lock themselves out, and unknown names are 404s.
    for change in [json!({"disabled": true}), json!({"role": "user"})] {
        let (status, body) = h.patch("/users/admin", &admin, change).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(api_error(&body).message.contains("another administrator"));
    }
    let (status, body) = h
        .patch("/users/nobody", &admin, json!({"role": "user"}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(api_error(&body).message.contains("bspweb user list"));
    let (status, _) = h.patch("/users/bob", &admin, json!({"role": "boss"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    // Found by schemathesis: a quota beyond what SQLite holds was a 500.
    let (status, body) = h
        .patch(
            "/users/bob",
            &admin,
            json!({"quotas": {"max_output_mib": 9223372036854775808u64}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(api_error(&body).message.contains("at most"), "{body}");
    // `admin: true` and another role contradict each other.
    let (status, _) = h
        .post(
            "/users",
            &admin,
            json!({"name": "x", "password": "long-enough", "admin": true, "role": "user"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // A promoted user can manage accounts.
    let (status, _) = h
        .patch("/users/bob", &admin, json!({"role": "admin"}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let bob = h.login("bob", "bob-password").await;
    assert_eq!(h.get("/users", &bob).await.0, StatusCode::OK);
}

#[tokio::test]
async fn volunteers_donate_and_run_nothing() {
    let h = Harness::start().await;
    let admin = h.login("admin", "admin-password").await;
    let (status, body) = h
        .post(
            "/users",
            &admin,
            json!({"name": "vera", "password": "vera-password", "role": "volunteer"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["role"], "volunteer");
    let vera = h.login("vera", "vera-password").await;
    assert_eq!(h.get("/peers", &vera).await.0, StatusCode::OK);
    assert_eq!(h.get("/me", &vera).await.1["role"], "volunteer");
    let (status, body) = h.upload(&vera, None, wasm(GUEST)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(api_error(&body).message.contains("volunteer account"));
    let (status, body) = h
        .post("/jobs", &vera, json!({"program": "ring", "nprocs": 1}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    // The user role lets her run jobs.
    h.patch("/users/vera", &admin, json!({"role": "user"}))
        .await;
    let (status, body) = h.upload(&vera, None, wasm(GUEST)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn password_changes_end_every_other_login() {
    let h = Harness::start().await;
    let admin = h.login("admin", "admin-password").await;
    let alice = h.login("alice", "alice-password").await;
    let alice2 = h.login("alice", "alice-password").await;

    let change =
        |current: &str, new: &str| json!({"current_password": current, "new_password": new});
    let (status, body) = h
        .post(
            "/me/password",
            &alice,
            change("wrong-password", "new-password"),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(api_error(&body).code, "wrong_password");
    let (status, body) = h
        .post("/me/password", &alice, change("alice-password", "short"))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // Nothing changed so far.
    assert_eq!(h.get("/jobs", &alice2).await.0, StatusCode::OK);

    let (status, body) = h
        .post(
            "/me/password",
            &alice,
            change("alice-password", "new-password"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let login: LoginResponse = serde_json::from_value(body).unwrap();
    assert_eq!(h.get("/jobs", &login.token).await.0, StatusCode::OK);
    for old in [&alice, &alice2] {
        let (status, body) = h.get("/jobs", old).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(api_error(&body).code, "token_expired");
    }
    assert!(h.try_login("alice", "alice-password").await.is_err());
    h.login("alice", "new-password").await;

    // An administrator resets bob's password; users cannot.
    let bob = h.login("bob", "bob-password").await;
    let (status, _) = h
        .post(
            "/users/bob/password",
            &login.token,
            json!({"password": "x-password"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = h
        .post(
            "/users/bob/password",
            &admin,
            json!({"password": "reset-password"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(h.get("/jobs", &bob).await.0, StatusCode::UNAUTHORIZED);
    h.login("bob", "reset-password").await;
    // Accounts survive a restart with their standing and generations.
    let dir = h.stop().await;
    let h = Harness::start_in(dir, |_| {}, false).await;
    assert_eq!(h.get("/jobs", &bob).await.0, StatusCode::UNAUTHORIZED);
    h.login("bob", "reset-password").await;
}

#[tokio::test]
async fn quotas_hold_programs_and_processes() {
    let h = Harness::start().await;
    let admin = h.login("admin", "admin-password").await;
    let alice = h.login("alice", "alice-password").await;
    h.sn.register_builtin("ring", "", &wasm(GUEST))
        .await
        .unwrap();
    let (status, body) = h
        .patch(
            "/users/alice",
            &admin,
            json!({"quotas": {"max_programs": 1, "max_processes": 2}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["quotas"]["max_programs"], 1);
    assert_eq!(body["quotas"]["max_output_mib"], 4096, "unchanged");

    // Programs: the same module again is fine, another one is not.
    assert_eq!(h.upload(&alice, None, wasm(GUEST)).await.0, StatusCode::OK);
    assert_eq!(
        h.upload(&alice, Some("again"), wasm(GUEST)).await.0,
        StatusCode::OK
    );
    let other = wasm(OTHER_GUEST);
    let (status, body) = h.upload(&alice, None, other).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(api_error(&body).code, "quota_exceeded");
    assert!(api_error(&body).message.contains("delete programs"));

    // Processes: a job larger than the quota is refused; one that would go
    // beyond it with the running ones waits until they end.
    let (status, body) = h
        .post("/jobs", &alice, json!({"program": "ring", "nprocs": 3}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(api_error(&body).code, "quota_exceeded");
    let mut p1 = h.peer_login(login_body("p1", 8, None)).await;
    let first = h.submit(&alice, "ring", 2).await;
    next_start(&h, &mut p1).await;
    let second = h.submit(&alice, "ring", 1).await;
    let waiting = h
        .wait_event(
            &alice,
            second.id,
            |e| matches!(&e.kind, JobEventKind::Status { text } if text.contains("quota allows 2")),
        )
        .await;
    assert!(matches!(waiting.kind, JobEventKind::Status { .. }));
    assert_eq!(h.job(&alice, second.id).await.state, JobState::Waiting);
    let (_, me) = h.get("/me", &alice).await;
    assert_eq!(me["usage"]["processes"], 2);
    assert_eq!(me["usage"]["programs"], 1);
    // Bob's jobs do not wait for alice's quota.
    let bob = h.login("bob", "bob-password").await;
    let bobs = h.submit(&bob, "ring", 1).await;
    h.wait_job(&bob, bobs.id, "bob's job to start", |j| {
        j.state == JobState::Active
    })
    .await;
    h.report(&p1, vec![exited(first.id, 0), exited(first.id, 1)])
        .await;
    h.wait_job(&alice, second.id, "the waiting job to start", |j| {
        j.state == JobState::Active
    })
    .await;
    // A waiting job that a lowered quota can never admit says so.
    let third = h.submit(&alice, "ring", 2).await;
    h.wait_event(
        &alice,
        third.id,
        |e| matches!(&e.kind, JobEventKind::Status { text } if text.contains("enough of them end")),
    )
    .await;
    let (status, _) = h
        .patch(
            "/users/alice",
            &admin,
            json!({"quotas": {"max_processes": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    h.wait_event(&alice, third.id, |e| {
        matches!(&e.kind, JobEventKind::Status { text } if text.contains("cannot start unless an administrator raises the quota"))
    })
    .await;
}

// ----------------------------------------- several supernodes, one database

/// The peer of each process of an assignment.
fn hosts_of(a: &JobAssignment) -> Vec<bsp_api::PeerId> {
    a.placement
        .iter()
        .map(|&i| a.peers[i as usize].id)
        .collect()
}

/// Three supernodes on one fresh database of the throw-away PostgreSQL
/// server (started by the tests themselves, whatever `BSPWEB_TEST_DATABASE`
/// says); the first made the users.
async fn three_on_one_database(adjust: fn(&mut Config)) -> [Harness; 3] {
    let url = throwaway_pg::server().create_database();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("test-database-url"), &url).unwrap();
        nodes.push(Harness::start_in(dir, adjust, i == 0).await);
    }
    nodes.try_into().unwrap_or_else(|_| unreachable!())
}

/// Issue 14: any supernode of a shared database serves any user, peer and
/// job. A user logs in at one and is known at the others; a peer logs in
/// at one, renews at another and long-polls a third; a job submitted at one
/// is placed and its commands reach the peer's poll elsewhere; output
/// reported at one streams live from another with the same event ids; and
/// with the supernode that placed the job stopped, the others go on.
#[tokio::test]
async fn any_supernode_of_a_shared_database_serves_any_user_peer_and_job() {
    let [a, b, c] = three_on_one_database(|_| {}).await;
    // Registering at two supernodes is idempotent.
    for h in [&a, &b] {
        h.sn.register_builtin("ring", "", &wasm(GUEST))
            .await
            .unwrap();
    }

    // A token from b is good at c: one secret, one set of accounts.
    let alice = b.login("alice", "alice-password").await;
    assert_eq!(c.get("/jobs", &alice).await.0, StatusCode::OK);
    // A user made at c can log in at a at once.
    let admin = c.login("admin", "admin-password").await;
    let (status, body) = c
        .post(
            "/users",
            &admin,
            json!({"name": "carol", "password": "carol-password"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let carol = a.login("carol", "carol-password").await;
    assert_eq!(b.get("/jobs", &carol).await.0, StatusCode::OK);

    // The peer logs in at a, renews at b, polls at c.
    let mut peer = a.peer_login(login_body("shared", 2, None)).await;
    assert_eq!(b.renew(&peer).await.0, StatusCode::OK);
    let job = b.submit(&alice, "ring", 2).await;
    let assignment = start_job(&c.commands(&mut peer).await);
    assert_eq!(assignment.job, job.id);
    assert_eq!(hosts_of(&assignment), vec![peer.id, peer.id]);

    // Output reported at a streams live at c: c's stream is open (its
    // answer has begun) before a stores the output.
    let mut live = c
        .http
        .get(c.url(&format!("/jobs/{}/events", job.id)))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), StatusCode::OK);
    let status = a
        .report(
            &peer,
            vec![
                out(job.id, 0, 0, "hello from pid 0"),
                out(job.id, 1, 0, "hello from pid 1"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let mut text = String::new();
    let seen = loop {
        let found = parse_sse(&text).into_iter().find(|(_, _, e)| {
            matches!(&e.kind, JobEventKind::Stdout { text } if text == "hello from pid 1")
        });
        if let Some((_, _, e)) = found {
            break e;
        }
        // Well under the scheduler's 5 s pass: the NOTIFY woke the stream.
        let chunk = tokio::time::timeout(Duration::from_secs(3), live.chunk())
            .await
            .unwrap_or_else(|_| panic!("c's stream did not follow a's output: {text}"))
            .unwrap()
            .expect("the stream goes on");
        text.push_str(&String::from_utf8_lossy(&chunk));
    };

    // The job ends at c; every supernode tells the same story with the
    // same event ids.
    assert_eq!(
        c.report(&peer, vec![exited(job.id, 0), exited(job.id, 1)])
            .await,
        StatusCode::NO_CONTENT
    );
    let done = a
        .wait_job(&alice, job.id, "the job's end, seen at a", |j| {
            j.state == JobState::Finished
        })
        .await;
    assert_eq!(done.outcome, Some(JobOutcome::Exited));
    let stream_a = a.events(&alice, job.id, None).await;
    let stream_b = b.events(&alice, job.id, None).await;
    assert_eq!(stream_a, stream_b);
    assert!(stream_a.iter().any(|(_, _, e)| e.id == seen.id));

    // b, which placed the first job, stops: c places the next one and the
    // peer's poll at a gets it.
    drop(b.stop().await);
    let second = c.submit(&alice, "ring", 2).await;
    let assignment = a.assignment_at(&mut peer, second.id, 0).await;
    assert_eq!(hosts_of(&assignment), vec![peer.id, peer.id]);
}

/// Issue 14: a peer that renews at one supernode only is not declared gone
/// by the lease sweeps of the others, and one that stops renewing is
/// declared gone once, whichever supernode's sweep sees it first.
#[tokio::test]
async fn leases_renewed_at_one_supernode_hold_at_all_and_a_silent_peer_is_lost_once() {
    let [a, b, c] = three_on_one_database(|c| {
        // Short enough for a loss within the test, long enough that the
        // steady peer's renewals every 100 ms keep it under a loaded CI.
        c.lease_ttl = Duration::from_millis(1500);
    })
    .await;
    a.sn.register_builtin("ring", "", &wasm(GUEST))
        .await
        .unwrap();
    let alice = a.login("alice", "alice-password").await;
    let mut steady = b.peer_login(login_body("steady", 1, None)).await;
    let mut silent = b.peer_login(login_body("silent", 1, None)).await;
    let keep = b.keep_alive(&steady);
    let job = a.submit(&alice, "ring", 2).await;
    let mut hosts = vec![];
    for peer in [&mut steady, &mut silent] {
        let assignment = start_job(&c.commands(peer).await);
        hosts = hosts_of(&assignment);
    }
    assert!(hosts.contains(&steady.id) && hosts.contains(&silent.id));
    // The silent peer's processes are restored on the steady one, in one
    // new epoch: one loss, not one per supernode.
    let restored = c.assignment_at(&mut steady, job.id, 1).await;
    assert_eq!(hosts_of(&restored), vec![steady.id, steady.id]);
    // Three sweep periods later the steady peer is still online everywhere.
    tokio::time::sleep(Duration::from_millis(3 * 1500)).await;
    for h in [&a, &b, &c] {
        let peers = h.peer_list(&alice).await;
        let s = peers.iter().find(|p| p.id == steady.id).unwrap();
        assert_eq!(s.state, "online", "{peers:?}");
    }
    // One loss, one new epoch: not one per supernode's sweep.
    let url = throwaway_pg::database_of(a.dir.path()).unwrap();
    let epoch = std::thread::spawn(move || {
        let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        db.query_one("SELECT epoch FROM jobs WHERE id = $1", &[&job.id])
            .unwrap()
            .get::<_, i64>(0)
    })
    .join()
    .unwrap();
    assert_eq!(epoch, 1);
    keep.abort();
}

/// Issue 14: plain renewals at a supernode of a shared database go to the
/// database in batches, and each renewal of a batch still gets its own
/// answer: renewals of many peers at once all hold, a token of a lease
/// the peer replaced since is refused, and a renewal that starts a drain
/// is renewed the usual way (the drain starts).
#[tokio::test]
async fn batched_renewals_each_get_their_own_answer() {
    let [a, b, _c] = three_on_one_database(|_| {}).await;
    let alice = a.login("alice", "alice-password").await;
    let mut peers = Vec::new();
    for i in 0..24 {
        peers.push(a.peer_login(login_body(&format!("p{i}"), 1, None)).await);
    }
    let replaced = a.peer_login(login_body("replaced", 1, None)).await;
    let again = a.peer_login(login_body("again", 1, None)).await;
    // As if `replaced` had logged in again elsewhere: its row names another
    // lease than its token.
    let url = throwaway_pg::database_of(a.dir.path()).unwrap();
    let id = replaced.id;
    std::thread::spawn(move || {
        let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        db.execute(
            "UPDATE peers SET lease_id = 'elsewhere' WHERE id = $1",
            &[&id],
        )
        .unwrap();
    })
    .join()
    .unwrap();
    let drainer = a.peer_login(login_body("drainer", 1, None)).await;

    let renew_with = |peer: &FakePeer, draining: bool| {
        let mut body = PeerRenew::idle(1.0);
        body.draining = draining;
        b.http
            .post(b.url("/peer/renew"))
            .bearer_auth(&peer.token)
            .json(&body)
            .send()
    };
    // All at once, so that they share batches.
    let plain = futures_util::future::join_all(
        peers
            .iter()
            .flat_map(|p| std::iter::repeat_n(p, 4))
            .map(|p| renew_with(p, false)),
    );
    let (plain, stale, drain, fresh) = tokio::join!(
        plain,
        renew_with(&replaced, false),
        renew_with(&drainer, true),
        renew_with(&again, false)
    );
    for resp in plain {
        assert_eq!(resp.unwrap().status(), StatusCode::OK);
    }
    let stale = stale.unwrap();
    assert_eq!(stale.status(), StatusCode::UNAUTHORIZED);
    let body: Value = stale.json().await.unwrap();
    assert_eq!(api_error(&body).code, "lease_expired", "{body}");
    assert_eq!(drain.unwrap().status(), StatusCode::OK);
    assert_eq!(fresh.unwrap().status(), StatusCode::OK);

    // Every supernode sees the drain, and the others online.
    for h in [&a, &b] {
        let list = h.peer_list(&alice).await;
        let state = |id: i64| list.iter().find(|p| p.id == id).unwrap().state.clone();
        assert_eq!(state(drainer.id), "draining", "{list:?}");
        assert_eq!(state(again.id), "online");
        assert!(peers.iter().all(|p| state(p.id) == "online"), "{list:?}");
    }
    // The renewals that only renewed went in batches.
    let metrics = b
        .http
        .get(format!("{}/metrics", b.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    };
    let (renewed, batches) = (
        count("bspweb_plain_renewals_total"),
        count("bspweb_renewal_batches_total"),
    );
    assert!(renewed >= 96.0, "{metrics}");
    assert!((1.0..=renewed).contains(&batches), "{metrics}");
}
