//! The consumer API (`bsp_api::client`, dissertation §2.3.4, Listing 2.2)
//! against a real supernode and peers: every event of the listener in a
//! scenario that causes it, the typed errors for their causes, transparent
//! reconnection and retries, and the `quickstart` and `mandelbrot_png`
//! example applications.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bsp_api::client::{Client, ClientError, ConsumerEvent, JobSpec, Program};
use bsp_api::rest::{JobLimits, JobOutcome, JobState};
use bsp_api::{JobId, PeerId, Pid};
use serde_json::json;

use crate::examples::misbehave_hash;
use crate::harness::{ADMIN, ADMIN_PASSWORD, Cluster, Options, shared};

#[allow(dead_code)]
#[path = "../../bsp-api/examples/mandelbrot_png.rs"]
mod mandelbrot_png;

#[allow(dead_code)]
#[path = "../../bsp-api/examples/quickstart.rs"]
mod quickstart;

/// How long a job of these tests may take.
const JOB_LIMIT: Duration = Duration::from_secs(180);

/// A guest that runs `steps + 1` supersteps of `work` busy-loop rounds
/// each; in every one it prints `tick` to stdout, `tock` to stderr and
/// writes the 8-byte raw record `pid, superstep` (little endian).
pub fn ticker_wasm(steps: u32, work: u32) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
  (import "bspweb_v1" "pid" (func $pid (result i32)))
  (import "bspweb_v1" "superstep" (func $superstep (result i32)))
  (import "bspweb_v1" "print" (func $print (param i32 i32 i32) (result i32)))
  (import "bspweb_v1" "write_raw" (func $write_raw (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "tick")
  (data (i32.const 96) "tock")
  (func (export "bspweb_resume") (result i32)
    (local $i i32) (local $x i64)
    (local.set $x (i64.load (i32.const 16)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (i32.const {work})))
        (local.set $x (i64.add (i64.mul (local.get $x) (i64.const 6364136223846793005)) (i64.const 1442695040888963407)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i64.store (i32.const 16) (local.get $x))
    (drop (call $print (i32.const 1) (i32.const 64) (i32.const 4)))
    (drop (call $print (i32.const 2) (i32.const 96) (i32.const 4)))
    (i32.store (i32.const 0) (call $pid))
    (i32.store (i32.const 4) (call $superstep))
    (drop (call $write_raw (i32.const 0) (i32.const 8)))
    (if (result i32) (i32.ge_u (call $superstep) (i32.const {steps}))
      (then (i32.const 1))
      (else (i32.const 0)))))"#
    ))
    .expect("the ticker assembles")
}

/// Every typed event of a job, until its terminal one (with a deadline).
async fn all_events(client: &Client, job: JobId) -> Vec<ConsumerEvent> {
    let mut stream = client.job_events(job);
    let mut events = vec![];
    let ended = tokio::time::timeout(JOB_LIMIT, async {
        while let Some(e) = stream.next().await.expect("the job's event stream") {
            events.push(e);
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "job {job} did not end within {JOB_LIMIT:?}; last events: {:?}",
        &events[events.len().saturating_sub(10)..]
    );
    events
}

/// A job's typed events, collected by a background task as they arrive.
struct Collector {
    job: JobId,
    events: Arc<Mutex<Vec<ConsumerEvent>>>,
    task: tokio::task::JoinHandle<Result<(), ClientError>>,
}

impl Collector {
    fn start(client: &Client, job: JobId) -> Collector {
        let events = Arc::new(Mutex::new(vec![]));
        let (sink, mut stream) = (events.clone(), client.job_events(job));
        let task = tokio::spawn(async move {
            while let Some(e) = stream.next().await? {
                sink.lock().unwrap().push(e);
            }
            Ok(())
        });
        Collector { job, events, task }
    }

    /// Poll until `pred` holds for the events so far; panics once `limit`
    /// passes or the stream ends first.
    async fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&[ConsumerEvent]) -> bool,
    ) -> Vec<ConsumerEvent> {
        let deadline = Instant::now() + limit;
        loop {
            let events = self.events.lock().unwrap().clone();
            if pred(&events) {
                return events;
            }
            let tail = &events[events.len().saturating_sub(8)..];
            assert!(
                !self.task.is_finished(),
                "the event stream of job {} ended before {what}: {tail:?}",
                self.job
            );
            assert!(
                Instant::now() < deadline,
                "job {} did not reach {what} within {limit:?}: {tail:?}",
                self.job
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The largest superstep in a raw record of the ticker.
fn ticker_step(events: &[ConsumerEvent]) -> Option<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            ConsumerEvent::RawData { data, .. } => {
                Some(u32::from_le_bytes(data[4..8].try_into().ok()?))
            }
            _ => None,
        })
        .max()
}

/// `printToStdOut`, `printToStdErr`, `writeRawData`, `printStatusLine`,
/// `processExited` and `jobExited` of Listing 2.2, typed, from a job whose
/// program is given as bytes (uploaded, then submitted by hash) with
/// arguments of a user type.
#[tokio::test(flavor = "multi_thread")]
async fn a_normal_job_yields_every_output_event_typed() {
    #[derive(serde::Serialize)]
    struct TickerArgs {
        unused: Vec<u32>,
    }
    let client = shared().admin().await;
    let (steps, nprocs) = (3, 3);
    let spec = JobSpec::new(Program::Wasm(ticker_wasm(steps, 1000)), nprocs)
        .args(&TickerArgs { unused: vec![1, 2] })
        .unwrap()
        .description("consumer: every output event")
        .seed(7);
    let job = client.start_job(spec).await.expect("start the job");
    assert_eq!(job.args, json!({"unused": [1, 2]}));
    assert_eq!(
        job.description.as_deref(),
        Some("consumer: every output event")
    );
    let events = all_events(&client, job.id).await;
    assert!(events.iter().all(|e| e.job() == job.id));
    assert_eq!(
        events.last(),
        Some(&ConsumerEvent::JobExited { job: job.id })
    );
    assert_eq!(events.iter().filter(|e| e.is_terminal()).count(), 1);
    assert!(
        events.iter().any(|e| matches!(e,
            ConsumerEvent::StatusLine { line, .. } if line.contains("placed 3 processes"))),
        "no placement status line: {events:?}"
    );
    for pid in 0..nprocs {
        let stdout: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                ConsumerEvent::Stdout { pid: p, line, .. } if *p == pid => Some(line.as_str()),
                _ => None,
            })
            .collect();
        let stderr: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                ConsumerEvent::Stderr { pid: p, line, .. } if *p == pid => Some(line.as_str()),
                _ => None,
            })
            .collect();
        let raw: Vec<Vec<u8>> = events
            .iter()
            .filter_map(|e| match e {
                ConsumerEvent::RawData { pid: p, data, .. } if *p == pid => Some(data.clone()),
                _ => None,
            })
            .collect();
        let want_raw: Vec<Vec<u8>> = (0..=steps)
            .map(|s| [pid.to_le_bytes(), s.to_le_bytes()].concat())
            .collect();
        assert_eq!(stdout, vec!["tick"; steps as usize + 1], "pid {pid}");
        assert_eq!(stderr, vec!["tock"; steps as usize + 1], "pid {pid}");
        assert_eq!(raw, want_raw, "pid {pid}: raw records, decoded");
        let exits: Vec<u32> = events
            .iter()
            .filter_map(|e| match e {
                ConsumerEvent::ProcessExited {
                    pid: p, superstep, ..
                } if *p == pid => Some(*superstep),
                _ => None,
            })
            .collect();
        assert_eq!(exits, vec![steps], "pid {pid}: one process_exited");
    }
}

/// `jobDiedOnError` and `jobAborted` carry the pid and the cause.
#[tokio::test(flavor = "multi_thread")]
async fn a_trap_is_job_failed_and_an_abort_is_job_aborted_with_pid_and_cause() {
    let client = shared().admin().await;
    let hash = misbehave_hash(&client).await;
    let start = |mode: &str| {
        let spec = JobSpec::new(Program::Hash(hash.clone()), 3)
            .args(&json!({"mode": mode, "pid": 1}))
            .unwrap();
        client.start_job(spec)
    };
    let (trap, abort) = (start("trap").await.unwrap(), start("abort").await.unwrap());
    let trap_events = all_events(&client, trap.id).await;
    match trap_events.last() {
        Some(ConsumerEvent::JobFailed { job, pid, cause }) => {
            assert_eq!((*job, *pid), (trap.id, Some(1)));
            assert!(cause.contains("unreachable"), "{cause}");
        }
        other => panic!("a trap must end the job with job_failed, not {other:?}"),
    }
    match all_events(&client, abort.id).await.last() {
        Some(ConsumerEvent::JobAborted { job, pid, cause }) => {
            assert_eq!((*job, *pid), (abort.id, Some(1)));
            assert!(cause.contains("deliberate abort"), "{cause}");
        }
        other => panic!("an abort must end the job with job_aborted, not {other:?}"),
    }
}

/// `jobListChanged` on submit, finish and dispose, through a subscription
/// that discovers the job on its own and also delivers its events; `kill`
/// ends it with `job_killed`; the waiting / active / finished lists agree.
#[tokio::test(flavor = "multi_thread")]
async fn the_job_list_changes_on_submit_finish_and_dispose_and_a_killed_job_says_so() {
    let client = shared().user("consumer-lists").await;
    let mut sub = client.subscribe().await.expect("subscribe");
    // Long enough to be killed while it runs.
    let spec = JobSpec::new(Program::Wasm(ticker_wasm(3000, 20_000)), 2);
    let job = client.start_job(spec).await.unwrap().id;
    let mut seen: Vec<ConsumerEvent> = vec![];
    let next = async |sub: &mut bsp_api::client::Subscription, seen: &mut Vec<ConsumerEvent>| {
        let e = tokio::time::timeout(JOB_LIMIT, sub.next())
            .await
            .unwrap_or_else(|_| panic!("no event within {JOB_LIMIT:?}; so far: {seen:?}"))
            .expect("subscription");
        seen.push(e.clone());
        e
    };
    // Submitted: the list says so while the job waits or runs, and the
    // subscription follows it (a first line of output arrives).
    let (mut listed, mut output) = (false, false);
    while !(listed && output) {
        match next(&mut sub, &mut seen).await {
            ConsumerEvent::JobListChanged { job: j, state } if j == job => {
                assert!(
                    matches!(state, Some(JobState::Waiting | JobState::Active)),
                    "{state:?}"
                );
                listed = true;
            }
            ConsumerEvent::Stdout { job: j, .. } if j == job => output = true,
            _ => {}
        }
    }
    // (waiting, active, finished)
    let in_lists = async || {
        let ids = |v: Vec<bsp_api::rest::JobInfo>| v.iter().any(|j| j.id == job);
        (
            ids(client.waiting_jobs().await.unwrap()),
            ids(client.active_jobs().await.unwrap()),
            ids(client.finished_jobs().await.unwrap()),
        )
    };
    // It printed, so it runs: active, not waiting.
    assert_eq!(in_lists().await, (false, true, false));
    let killed = client.kill(job).await.unwrap();
    assert_eq!(killed.outcome, Some(JobOutcome::Killed));
    // Finished: `job_killed` ends its events and the list says finished.
    let (mut ended, mut finished) = (false, false);
    while !(ended && finished) {
        match next(&mut sub, &mut seen).await {
            ConsumerEvent::JobKilled { job: j } if j == job => ended = true,
            ConsumerEvent::JobListChanged {
                job: j,
                state: Some(JobState::Finished),
            } if j == job => finished = true,
            e => assert!(!e.is_terminal(), "{e:?}"),
        }
    }
    assert_eq!(in_lists().await, (false, false, true));
    // Disposed: the list says the job is gone.
    client.dispose(job).await.unwrap();
    loop {
        if let ConsumerEvent::JobListChanged { job: j, state } = next(&mut sub, &mut seen).await
            && j == job
            && state.is_none()
        {
            break;
        }
    }
    assert_eq!(in_lists().await, (false, false, false));
    assert!(sub.followed().any(|j| j == job));
}

/// Each error of Listing 2.2 comes back typed for its cause.
#[tokio::test(flavor = "multi_thread")]
async fn each_cause_gets_its_typed_error() {
    let c = shared();
    // Not connected: a port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let e = Client::login(&dead, ADMIN, ADMIN_PASSWORD)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::NotConnected { .. }), "{e:?}");
    assert!(e.is_not_connected() && e.status().is_none());
    // Unauthorized: a wrong password, a forged token.
    let e = Client::login(&c.url, ADMIN, "wrong").await.unwrap_err();
    assert!(matches!(e, ClientError::Unauthorized { .. }), "{e:?}");
    assert_eq!(e.status(), Some(401));
    let forged = Client::with_token(&c.url, "not.a.token");
    let e = forged.jobs(None).await.unwrap_err();
    assert!(matches!(e, ClientError::Unauthorized { .. }), "{e:?}");
    // A well-formed token that says it expired long ago, signed by no one:
    // refused for its signature, on calls and streams alike, at once.
    let b64 = |s: &str| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
    };
    let jwt = format!(
        "{}.{}.{}",
        b64(r#"{"alg":"HS256","typ":"JWT"}"#),
        b64(r#"{"iss":"bspweb","aud":"user","sub":"1","iat":1,"exp":2,"name":"admin"}"#),
        b64("not the signature")
    );
    let forged = Client::with_token(&c.url, &jwt);
    let e = forged.me().await.unwrap_err();
    assert!(matches!(e, ClientError::Unauthorized { .. }), "{e:?}");
    assert_eq!(e.code(), Some("unauthorized"));
    let e = tokio::time::timeout(Duration::from_secs(10), forged.job_events(1).next())
        .await
        .expect("a 401 is not retried")
        .unwrap_err();
    assert!(matches!(e, ClientError::Unauthorized { .. }), "{e:?}");
    let e = forged.subscribe().await.unwrap_err();
    assert!(matches!(e, ClientError::Unauthorized { .. }), "{e:?}");
    // An invalid URL: no scheme.
    let url = c.url.trim_start_matches("http://").to_string();
    let e = Client::login(&url, ADMIN, ADMIN_PASSWORD)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::InvalidUrl { .. }), "{url}: {e:?}");
    assert!(!e.is_transient(), "{e:?}");
    // https to a supernode serving plain HTTP (on loopback): the TLS
    // handshake fails, saying so.
    let url = c.url.replace("http://", "https://");
    let e = Client::login(&url, ADMIN, ADMIN_PASSWORD)
        .await
        .unwrap_err();
    let ClientError::Tls { reason, .. } = &e else {
        panic!("{url}: {e:?}");
    };
    assert!(reason.contains("plain HTTP"), "{reason}");
    assert!(!e.is_transient(), "{e:?}");

    let client = c.admin().await;
    // Program not found, by name and by hash.
    for program in [
        Program::Name("no-such-program".into()),
        Program::Hash("0".repeat(64)),
    ] {
        let e = client
            .start_job(JobSpec::new(program.clone(), 2))
            .await
            .unwrap_err();
        assert!(
            matches!(e, ClientError::ProgramNotFound { .. }),
            "{program:?}: {e:?}"
        );
        assert_eq!(e.status(), Some(404));
    }
    // Invalid program: garbage bytes, refused at upload.
    let garbage = Program::Wasm(b"#!/bin/sh\necho not wasm\n".to_vec());
    let e = client
        .start_job(JobSpec::new(garbage, 2))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::InvalidProgram { .. }), "{e:?}");
    assert!(e.to_string().contains("not a WebAssembly module"), "{e}");
    // Invalid program: valid WebAssembly that imports WASI, which guests may not.
    let wasi = wat::parse_str(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "bspweb_resume") (result i32) (i32.const 1)))"#,
    )
    .unwrap();
    let e = client
        .start_job(JobSpec::new(Program::Wasm(wasi), 2))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::InvalidProgram { .. }), "{e:?}");
    assert_eq!((e.status(), e.code()), (Some(422), Some("invalid_module")));
    let message = e.to_string();
    assert!(
        message.contains("wasi_snapshot_preview1.fd_write") && message.contains("bspweb_v1"),
        "{message}"
    );
    // Not enough peers: more than are online; as many as are online is fine.
    let online = client.health().await.unwrap().peers_online;
    assert!(online >= 1);
    let e = client
        .start_job(JobSpec::new("ring", 2).min_peers(online + 1))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::NotEnoughPeers { .. }), "{e:?}");
    assert_eq!(e.status(), Some(409));
    let ok = client
        .start_job(JobSpec::new("ring", 2).min_peers(1))
        .await
        .expect("min_peers 1 with peers online");
    assert_eq!(
        all_events(&client, ok.id).await.last(),
        Some(&ConsumerEvent::JobExited { job: ok.id })
    );
    // Anything else keeps its status and code.
    let e = client.job(i64::MAX).await.unwrap_err();
    assert!(matches!(e, ClientError::Api { status: 404, .. }), "{e:?}");
}

/// A TCP proxy to `upstream` that cuts a connection a few hundred bytes
/// into the answer to an event-stream request (`GET …/events`); other
/// requests, also on the same connection, pass whole. Returns its URL and the number of
/// cuts.
async fn cutting_proxy(upstream: String) -> (String, Arc<AtomicUsize>) {
    use std::sync::atomic::AtomicBool;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let cuts = Arc::new(AtomicUsize::new(0));
    let counter = cuts.clone();
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            let (upstream, counter) = (upstream.clone(), counter.clone());
            tokio::spawn(async move {
                let Ok(up) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let ((mut dr, mut dw), (mut ur, mut uw)) = (down.into_split(), up.into_split());
                let streaming = AtomicBool::new(false);
                let requests = async {
                    let mut buf = vec![0u8; 8192];
                    while let Ok(n @ 1..) = dr.read(&mut buf).await {
                        // Requests on a connection come one at a time: this
                        // one decides what happens to the answers that follow.
                        let events = String::from_utf8_lossy(&buf[..n]).contains("/events ");
                        streaming.store(events, Ordering::SeqCst);
                        if uw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                let answers = async {
                    // Cut at a different place each time.
                    let k = counter.load(Ordering::SeqCst);
                    let mut budget = 600 + 250 * (k % 5);
                    let mut buf = vec![0u8; 256];
                    while let Ok(n @ 1..) = ur.read(&mut buf).await {
                        let mut n = n;
                        if streaming.load(Ordering::SeqCst) {
                            n = n.min(budget);
                            budget -= n;
                        }
                        if dw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                        if budget == 0 {
                            counter.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                };
                // Whichever direction ends first closes the connection.
                tokio::select! {
                    _ = requests => {}
                    _ = answers => {}
                }
            });
        }
    });
    (url, cuts)
}

/// A job's typed stream whose connection drops every few events resumes
/// with `Last-Event-ID`: every event exactly once, in order, as read
/// directly.
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_connection_loses_and_repeats_no_event() {
    let c = shared();
    let direct = c.admin().await;
    let (proxy, cuts) = cutting_proxy(c.url.trim_start_matches("http://").to_string()).await;
    let through = Client::with_token(&proxy, direct.token());
    let spec = JobSpec::new(Program::Wasm(ticker_wasm(5, 1000)), 3);
    let job = through.start_job(spec).await.unwrap().id;
    let mut stream = through.job_events(job);
    let mut got = vec![];
    tokio::time::timeout(JOB_LIMIT, async {
        while let Some(e) = stream.next().await.expect("the stream resumes") {
            got.push(e);
        }
    })
    .await
    .expect("the job ends");
    let want = all_events(&direct, job).await;
    assert_eq!(got, want);
    assert!(
        cuts.load(Ordering::SeqCst) >= 3,
        "the proxy cut the stream only {} times: the test tested nothing",
        cuts.load(Ordering::SeqCst)
    );
    // The subscription's per-job streams resume the same way.
    let mut sub = through.subscribe().await.unwrap();
    sub.follow(job);
    let mut again = vec![];
    while again
        .last()
        .is_none_or(|e: &ConsumerEvent| !e.is_terminal())
    {
        let e = tokio::time::timeout(JOB_LIMIT, sub.next())
            .await
            .expect("an event")
            .unwrap();
        if e.job() == job && !matches!(e, ConsumerEvent::JobListChanged { .. }) {
            again.push(e);
        }
    }
    assert_eq!(again, want);
}

/// A TCP proxy to `upstream` whose event streams can be taken down: a
/// request for the job-list stream while `list_down` is closed unanswered,
/// one for a job's stream while `jobs_down` is answered 503, and
/// [`Switch::cut`] closes every connection that carried an event stream.
/// Other requests pass.
#[derive(Default)]
struct Switch {
    list_down: std::sync::atomic::AtomicBool,
    jobs_down: std::sync::atomic::AtomicBool,
    /// Job-list stream requests passed and refused.
    list_passed: AtomicUsize,
    list_refused: AtomicUsize,
    /// Job stream requests refused.
    jobs_refused: AtomicUsize,
    cuts: Mutex<Option<tokio::sync::watch::Sender<u64>>>,
}

impl Switch {
    fn cut(&self) {
        if let Some(cuts) = &*self.cuts.lock().unwrap() {
            cuts.send_modify(|n| *n += 1);
        }
    }

    fn count(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }
}

async fn switch_proxy(upstream: String) -> (String, Arc<Switch>) {
    use std::sync::atomic::AtomicBool;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let switch = Arc::new(Switch::default());
    let (cuts, _) = tokio::sync::watch::channel(0u64);
    *switch.cuts.lock().unwrap() = Some(cuts.clone());
    let sw = switch.clone();
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            let (upstream, sw, mut cut) = (upstream.clone(), sw.clone(), cuts.subscribe());
            tokio::spawn(async move {
                let Ok(up) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let ((mut dr, mut dw), (mut ur, mut uw)) = (down.into_split(), up.into_split());
                let streamed = AtomicBool::new(false);
                // Requests on a connection come one at a time.
                let requests = async {
                    let mut buf = vec![0u8; 8192];
                    while let Ok(n @ 1..) = dr.read(&mut buf).await {
                        let head = String::from_utf8_lossy(&buf[..n]);
                        let line = head.lines().next().unwrap_or_default();
                        if line.starts_with("GET /api/v1/events ") {
                            if sw.list_down.load(Ordering::SeqCst) {
                                sw.list_refused.fetch_add(1, Ordering::SeqCst);
                                return false;
                            }
                            sw.list_passed.fetch_add(1, Ordering::SeqCst);
                            streamed.store(true, Ordering::SeqCst);
                        } else if line.starts_with("GET /api/v1/jobs/") && line.contains("/events")
                        {
                            if sw.jobs_down.load(Ordering::SeqCst) {
                                sw.jobs_refused.fetch_add(1, Ordering::SeqCst);
                                return true;
                            }
                            streamed.store(true, Ordering::SeqCst);
                        }
                        if uw.write_all(&buf[..n]).await.is_err() {
                            return false;
                        }
                    }
                    false
                };
                let answers = async {
                    let _ = tokio::io::copy(&mut ur, &mut dw).await;
                    false
                };
                let cut = async {
                    while cut.changed().await.is_ok() {
                        if streamed.load(Ordering::SeqCst) {
                            return false;
                        }
                    }
                    std::future::pending().await
                };
                let unavailable = tokio::select! {
                    r = requests => r,
                    r = answers => r,
                    r = cut => r,
                };
                if unavailable {
                    let body = r#"{"code":"unavailable","message":"the proxy is down"}"#;
                    let answer = format!(
                        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = dw.write_all(answer.as_bytes()).await;
                }
            });
        }
    });
    (url, switch)
}

/// Poll until `cond` holds; panics once `limit` passes.
async fn poll_until(what: &str, limit: Duration, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A subscription read by a background task: its events and its errors.
struct SubCollector {
    events: Arc<Mutex<Vec<ConsumerEvent>>>,
    errors: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SubCollector {
    fn start(mut sub: bsp_api::client::Subscription) -> SubCollector {
        let (events, errors) = (Arc::new(Mutex::new(vec![])), Arc::new(Mutex::new(vec![])));
        let (e, r) = (events.clone(), errors.clone());
        let task = tokio::spawn(async move {
            loop {
                match sub.next().await {
                    Ok(event) => e.lock().unwrap().push(event),
                    Err(err) => r.lock().unwrap().push(err.to_string()),
                }
            }
        });
        SubCollector {
            events,
            errors,
            task,
        }
    }

    /// The events of `job`, but for the job-list changes.
    fn of(&self, job: JobId) -> Vec<ConsumerEvent> {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .filter(|e| e.job() == job && !matches!(e, ConsumerEvent::JobListChanged { .. }))
            .cloned()
            .collect()
    }

    fn ended(&self, job: JobId) -> bool {
        self.of(job).last().is_some_and(ConsumerEvent::is_terminal)
    }
}

impl Drop for SubCollector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A job that starts and ends while the job-list stream is down (longer
/// than the few seconds the stream used to retry) is not announced; the
/// subscription reads the job lists again once the stream is back, and
/// delivers every event of that job, once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_subscription_relists_the_jobs_after_its_job_list_stream_comes_back() {
    let c = shared();
    let direct = c.user("consumer-relist").await;
    let (proxy, switch) = switch_proxy(c.url.trim_start_matches("http://").to_string()).await;
    let through = Client::with_token(&proxy, direct.token());
    let sub = SubCollector::start(through.subscribe().await.expect("subscribe"));
    assert_eq!(Switch::count(&switch.list_passed), 1);
    // Down.
    switch.list_down.store(true, Ordering::SeqCst);
    switch.cut();
    let down = Instant::now();
    poll_until("the subscription retrying", JOB_LIMIT, || {
        Switch::count(&switch.list_refused) >= 1
    })
    .await;
    let job = direct
        .start_job(JobSpec::new("ring", 2).description("started while unheard of"))
        .await
        .unwrap()
        .id;
    let want = all_events(&direct, job).await;
    poll_until("a long outage", JOB_LIMIT, || {
        down.elapsed() >= Duration::from_secs(7) && Switch::count(&switch.list_refused) >= 4
    })
    .await;
    assert!(sub.of(job).is_empty(), "heard of job {job} while deaf");
    // Up again.
    switch.list_down.store(false, Ordering::SeqCst);
    poll_until(
        &format!("job {job}'s events after the outage"),
        JOB_LIMIT,
        || sub.ended(job),
    )
    .await;
    assert_eq!(sub.of(job), want);
    assert!(Switch::count(&switch.list_passed) >= 2);
    let errors = sub.errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "transient failures surfaced: {errors:?}");
}

/// A job's stream in a subscription answered 503 for several seconds (as
/// while a supernode behind a proxy restarts) resumes where it stopped: no
/// error comes out, and every event of the job comes once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_subscription_outlasts_a_long_run_of_unavailable_answers() {
    let c = shared();
    let direct = c.user("consumer-unavailable").await;
    let (proxy, switch) = switch_proxy(c.url.trim_start_matches("http://").to_string()).await;
    let through = Client::with_token(&proxy, direct.token());
    let sub = SubCollector::start(through.subscribe().await.expect("subscribe"));
    // Runs until killed.
    let spec = JobSpec::new(Program::Wasm(ticker_wasm(1_000_000, 20_000)), 2);
    let job = through.start_job(spec).await.unwrap().id;
    poll_until("the job's first output", JOB_LIMIT, || {
        sub.of(job)
            .iter()
            .any(|e| matches!(e, ConsumerEvent::Stdout { .. }))
    })
    .await;
    switch.jobs_down.store(true, Ordering::SeqCst);
    switch.cut();
    let down = Instant::now();
    poll_until("a long run of 503s", JOB_LIMIT, || {
        down.elapsed() >= Duration::from_secs(7) && Switch::count(&switch.jobs_refused) >= 4
    })
    .await;
    direct.kill(job).await.unwrap();
    switch.jobs_down.store(false, Ordering::SeqCst);
    poll_until("job_killed after the outage", JOB_LIMIT, || sub.ended(job)).await;
    let want = all_events(&direct, job).await;
    assert_eq!(want.last(), Some(&ConsumerEvent::JobKilled { job }));
    assert_eq!(sub.of(job), want);
    let errors = sub.errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "transient failures surfaced: {errors:?}");
}

/// `processRolledBack` after a host is SIGKILLed mid-job, and
/// `ProcessMigrated` after a host's availability drops to 0, on a cluster
/// of its own.
#[test]
fn a_lost_peer_rolls_back_and_a_busy_peer_migrates_its_processes() {
    let mut cluster = Cluster::start(Options {
        peers: 4,
        lease_ttl_secs: 3,
        supernode_args: vec!["--migration-interval-ms".into(), "500".into()],
        ..Options::default()
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = cluster.admin().await;
        let limits = JobLimits {
            checkpoint_every: 1,
            replicas: 2,
            ..JobLimits::default()
        };
        // Runs until killed: about 10 supersteps a second.
        let spec =
            JobSpec::new(Program::Wasm(ticker_wasm(1_000_000, 30_000_000)), 4).limits(limits);
        let job = client.start_job(spec).await.unwrap().id;
        let events = Collector::start(&client, job);
        events
            .wait_for("superstep 2", JOB_LIMIT, |e| ticker_step(e) >= Some(2))
            .await;
        let host = |placement: &[PeerId], not: Option<PeerId>| -> (PeerId, Vec<Pid>) {
            let peer = *placement.iter().find(|p| Some(**p) != not).expect("a host");
            let pids = (0..)
                .zip(placement)
                .filter(|(_, p)| **p == peer)
                .map(|(i, _)| i);
            (peer, pids.collect())
        };

        // A busy peer: its processes migrate away.
        let (busy, busy_pids) = host(&client.job(job).await.unwrap().placement, None);
        let index = cluster.peer_index(&client, busy).await.unwrap();
        cluster.set_idle(index, 0.0);
        let migrated = |e: &[ConsumerEvent]| -> Vec<Pid> {
            e.iter()
                .filter_map(|e| match e {
                    ConsumerEvent::ProcessMigrated { pid, from, to, .. } if *from == busy => {
                        assert_ne!(from, to);
                        Some(*pid)
                    }
                    _ => None,
                })
                .collect()
        };
        events
            .wait_for(
                &format!("pids {busy_pids:?} migrating off peer {busy}"),
                JOB_LIMIT,
                |e| busy_pids.iter().all(|p| migrated(e).contains(p)),
            )
            .await;

        // A lost peer: its processes roll back to their checkpoints.
        let (lost, lost_pids) = host(&client.job(job).await.unwrap().placement, Some(busy));
        let index = cluster.peer_index(&client, lost).await.unwrap();
        cluster.kill_peer(index);
        let rolled = |e: &[ConsumerEvent]| -> Vec<(Pid, u32)> {
            e.iter()
                .filter_map(|e| match e {
                    ConsumerEvent::ProcessRolledBack { pid, superstep, .. } => {
                        Some((*pid, *superstep))
                    }
                    _ => None,
                })
                .collect()
        };
        let seen = events
            .wait_for(
                &format!("pids {lost_pids:?} rolling back"),
                JOB_LIMIT,
                |e| {
                    lost_pids
                        .iter()
                        .all(|p| rolled(e).iter().any(|(q, _)| q == p))
                },
            )
            .await;
        for (i, e) in seen.iter().enumerate() {
            if let ConsumerEvent::ProcessRolledBack { pid, superstep, .. } = e {
                assert!(
                    lost_pids.contains(pid),
                    "pid {pid} was not on the lost peer"
                );
                // Output reaches the supernode before the checkpoint after it
                // leaves the peer: the stream showed the superstep before.
                let shown = ticker_step(&seen[..i]).unwrap();
                assert!(
                    *superstep <= shown + 1,
                    "pid {pid} rolled back to {superstep} after {shown}"
                );
            }
        }
        // The job goes on after both, until it is killed.
        let after = seen.len();
        events
            .wait_for("output after the rollback", JOB_LIMIT, |e| {
                e[after..]
                    .iter()
                    .any(|e| matches!(e, ConsumerEvent::RawData { .. }))
            })
            .await;
        client.kill(job).await.unwrap();
        events
            .wait_for("job_killed", JOB_LIMIT, |e| {
                e.last() == Some(&ConsumerEvent::JobKilled { job })
            })
            .await;
    });
}

/// The quickstart example (the client module's documentation) logs in,
/// runs `ring` and prints every line of it; a wrong password or URL comes
/// back typed.
#[tokio::test(flavor = "multi_thread")]
async fn the_quickstart_example_runs_ring_to_its_end() {
    let c = shared();
    let name = "consumer-quickstart";
    c.user(name).await;
    let password = format!("pw-of-{name}");
    let nprocs = 3;
    let outcome = quickstart::run(&c.url, name, &password, nprocs)
        .await
        .expect("the quickstart runs");
    let lines = &outcome.lines;
    assert!(outcome.exited, "{lines:?}");
    assert!(lines[0].ends_with("started on 3 processes"), "{lines:?}");
    assert!(lines.last().unwrap().ends_with(" exited"), "{lines:?}");
    let has = |l: &str| lines.iter().any(|x| x == l);
    for pid in 0..nprocs {
        assert!(
            has(&format!("[{pid}] got in total 2 messages")),
            "pid {pid}: {lines:?}"
        );
    }
    // pid 0's neighbours hear from it, pid 0 does not.
    assert!(has("[0] got 0 messages from pid 0"), "{lines:?}");
    assert!(has("[1] got 1 messages from pid 0"), "{lines:?}");
    assert!(has("[2] got 1 messages from pid 0"), "{lines:?}");

    let e = quickstart::run(&c.url, name, "wrong", nprocs)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Unauthorized { .. }), "{e:?}");
    let no_scheme = c.url.trim_start_matches("http://");
    let e = quickstart::run(no_scheme, name, &password, nprocs)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::InvalidUrl { .. }), "{e:?}");
}

/// The mandelbrot example refuses a picture without pixels or too large
/// to hold before it starts a job.
#[tokio::test(flavor = "multi_thread")]
async fn the_mandelbrot_png_example_refuses_bad_dimensions_before_starting_a_job() {
    let client = shared().user("consumer-mandelbrot-sizes").await;
    let max = mandelbrot_png::MAX_SIDE;
    for (width, height, max_iter, why) in [
        (0, 30, 64, "at least 1"),
        (40, 0, 64, "at least 1"),
        (max + 1, 30, 64, "at most 16384"),
        (40, u32::MAX, 64, "at most 16384"),
        (u32::MAX, u32::MAX, 64, "at most 16384"),
        (40, 30, 0, "--max-iter must be at least 1"),
    ] {
        let picture = mandelbrot_png::Picture {
            width,
            height,
            max_iter,
        };
        let e = mandelbrot_png::render(&client, picture, 2, |_| {})
            .await
            .unwrap_err();
        assert!(e.to_string().contains(why), "{picture:?}: {e}");
    }
    assert!(
        mandelbrot_png::Picture {
            width: max,
            height: max,
            max_iter: 1
        }
        .check()
        .is_ok()
    );
    let jobs = client.jobs(None).await.unwrap();
    assert!(jobs.is_empty(), "jobs started: {jobs:?}");
}

/// The example application renders the picture the `mandelbrot` program
/// defines, pixel for pixel, and writes it as a valid PNG.
#[tokio::test(flavor = "multi_thread")]
async fn the_mandelbrot_png_example_renders_the_set_into_a_valid_png() {
    let client = shared().admin().await;
    let picture = mandelbrot_png::Picture {
        width: 40,
        height: 30,
        max_iter: 64,
    };
    let mut log = vec![];
    let grey = mandelbrot_png::render(&client, picture, 3, |l| log.push(l.to_string()))
        .await
        .expect("render");
    assert!(
        log.iter().any(|l| l.contains("mandelbrot 40x30 done")),
        "{log:?}"
    );
    // The reference: guest-sdk/examples/mandelbrot.rs's pixel, natively.
    let (x0, y0, x1, y1) = (-2.0f64, -1.25f64, 0.5f64, 1.25f64);
    let pixel = |px: u32, row: u32| -> u8 {
        let cx = x0 + (f64::from(px) + 0.5) * (x1 - x0) / f64::from(picture.width);
        let cy = y0 + (f64::from(row) + 0.5) * (y1 - y0) / f64::from(picture.height);
        let (mut zx, mut zy, mut it) = (0.0f64, 0.0f64, 0u32);
        while it < picture.max_iter && zx * zx + zy * zy <= 4.0 {
            let t = zx * zx - zy * zy + cx;
            zy = 2.0 * zx * zy + cy;
            zx = t;
            it += 1;
        }
        (u64::from(it) * 255 / u64::from(picture.max_iter)) as u8
    };
    let want: Vec<u8> = (0..picture.height)
        .flat_map(|r| (0..picture.width).map(move |px| (px, r)))
        .map(|(px, r)| pixel(px, r))
        .collect();
    assert_eq!(grey, want);
    assert!(want.contains(&255) && want.iter().any(|&p| p < 10));

    // The checksums against published values.
    assert_eq!(mandelbrot_png::adler32(b"Wikipedia"), 0x11E6_0398);
    assert_eq!(mandelbrot_png::crc32(&[b"IEND"]), 0xAE42_6082);
    assert_eq!(mandelbrot_png::crc32(&[b"123456789"]), 0xCBF4_3926);
    // The file: signature, IHDR, IDAT with stored blocks holding the rows.
    let png = mandelbrot_png::png(picture.width, picture.height, &grey);
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let mut at = 8;
    let mut chunks = vec![];
    while at < png.len() {
        let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
        let kind = &png[at + 4..at + 8];
        let data = &png[at + 8..at + 8 + len];
        let crc = u32::from_be_bytes(png[at + 8 + len..at + 12 + len].try_into().unwrap());
        assert_eq!(crc, mandelbrot_png::crc32(&[kind, data]));
        chunks.push((String::from_utf8_lossy(kind).to_string(), data.to_vec()));
        at += 12 + len;
    }
    let kinds: Vec<&str> = chunks.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["IHDR", "IDAT", "IEND"]);
    let ihdr = &chunks[0].1;
    assert_eq!(
        &ihdr[..8],
        [&40u32.to_be_bytes()[..], &30u32.to_be_bytes()[..]].concat()
    );
    assert_eq!(&ihdr[8..], [8, 0, 0, 0, 0]);
    let z = &chunks[1].1;
    assert_eq!(z[0] & 0x0f, 8, "deflate");
    assert_eq!(
        (u16::from(z[0]) << 8 | u16::from(z[1])) % 31,
        0,
        "zlib header check"
    );
    let (mut raw, mut at, mut last) = (vec![], 2, false);
    while !last {
        last = z[at] & 1 == 1;
        assert_eq!(z[at] >> 1, 0, "a stored block");
        let len = u16::from_le_bytes([z[at + 1], z[at + 2]]);
        let nlen = u16::from_le_bytes([z[at + 3], z[at + 4]]);
        assert_eq!(len, !nlen);
        raw.extend_from_slice(&z[at + 5..at + 5 + usize::from(len)]);
        at += 5 + usize::from(len);
    }
    assert_eq!(&z[at..], mandelbrot_png::adler32(&raw).to_be_bytes());
    let rows: Vec<u8> = raw
        .chunks(1 + picture.width as usize)
        .flat_map(|r| {
            assert_eq!(r[0], 0, "filter type none");
            r[1..].to_vec()
        })
        .collect();
    assert_eq!(rows, grey);
}
