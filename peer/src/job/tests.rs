//! In-process runs of jobs on several peers over loopback TCP (real
//! listeners, real wasm), checking DESIGN.md's Execution 3–4 end to end.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use bsp_api::control::{JobPeer, Stream};
use bsp_api::rest::JobLimits;
use tokio::net::TcpListener;

use super::*;
use crate::net;
use crate::relay::BroadcastPolicy;
use crate::relay::Site;
use crate::runtime::module_hash;
use base64::Engine as _;
use bsp_api::Pid;
use bsp_api::wire::{Frame, WireMessage};

fn runtime() -> Arc<Runtime> {
    // `RUST_LOG=bspweb_peer=trace` shows the drivers' decisions.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    RT.get_or_init(|| Runtime::new().expect("engine")).clone()
}

struct TestPeer {
    id: PeerId,
    addr: String,
    jobs: Arc<Jobs>,
    reporter: Reporter,
    stats: Arc<DataStats>,
    _stop: tokio_util::sync::DropGuard,
}

/// A download that cannot be had (the supernode answers 404).
fn unavailable() -> FetchError {
    FetchError::Download {
        hash: "ab12".to_string(),
        error: crate::control::ControlError::Status {
            what: "the program",
            status: reqwest::StatusCode::NOT_FOUND,
            body: "no such program".to_string(),
        },
    }
}

async fn start_peers(n: usize) -> Vec<TestPeer> {
    start_peers_with(n, BroadcastPolicy::default()).await
}

async fn start_peers_with(n: usize, broadcast: BroadcastPolicy) -> Vec<TestPeer> {
    start_peers_on(n, broadcast, |_| runtime()).await
}

/// Generous, so that whether the short ring's supersteps count as short
/// does not depend on this machine's load.
const GENEROUS_INLINE_MAX: Duration = Duration::from_secs(1);

/// Peers with a runtime (engine and module cache) each, as separate
/// machines would have.
async fn start_peers_on(
    n: usize,
    broadcast: BroadcastPolicy,
    runtime_of: impl Fn(usize) -> Arc<Runtime>,
) -> Vec<TestPeer> {
    start_peers_full(n, broadcast, runtime_of, GENEROUS_INLINE_MAX).await
}

/// [`start_peers_on`] where supersteps count as short up to `inline_max`
/// ([`crate::runtime::ShortRuns`]).
async fn start_peers_full(
    n: usize,
    broadcast: BroadcastPolicy,
    runtime_of: impl Fn(usize) -> Arc<Runtime>,
    inline_max: Duration,
) -> Vec<TestPeer> {
    let mut peers = Vec::new();
    for i in 0..n {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let registry = Arc::new(Registry::new());
        let stop = CancellationToken::new();
        tokio::spawn(net::serve(listener, registry.clone(), stop.clone()));
        let reporter = Reporter::new();
        let stats = Arc::new(DataStats::default());
        let jobs = Jobs::new(JobEnv {
            runtime: runtime_of(i),
            registry,
            reporter: reporter.clone(),
            slots: crate::slots::Slots::new(2),
            max_memory_mib: 64,
            max_superstep_ms: 60_000,
            connect_timeout: Duration::from_secs(5),
            broadcast,
            stats: stats.clone(),
            inline_max,
        });
        peers.push(TestPeer {
            id: 100 + i as PeerId,
            addr,
            jobs,
            reporter,
            stats,
            _stop: stop.drop_guard(),
        });
    }
    peers
}

fn assignment(job: JobId, wasm: &[u8], peers: &[TestPeer], placement: Vec<u32>) -> JobAssignment {
    JobAssignment {
        job,
        program_hash: module_hash(wasm),
        nprocs: placement.len() as u32,
        args: "null".into(),
        seed: 7,
        limits: JobLimits {
            superstep_ms: 30_000,
            memory_mib: 16,
            output_mib: 16,
            checkpoint_every: 1,
            replicas: 2,
            redundancy: 1,
        },
        job_token: format!("token-{job}-{}", "0".repeat(32)),
        placement,
        peers: peers
            .iter()
            .map(|p| JobPeer {
                id: p.id,
                addr: p.addr.clone(),
                cluster: None,
            })
            .collect(),
        resources: vec![],
        epoch: 0,
        restore: vec![],
        migrate: vec![],
        program_bytes: 0,
        resources_hash: String::new(),
        resources_bytes: 0,
    }
}

fn start_everywhere(peers: &[TestPeer], a: &JobAssignment, wasm: &[u8]) -> Vec<JoinHandle<()>> {
    let module = runtime().compile(&module_hash(wasm), wasm).unwrap();
    peers
        .iter()
        .map(|p| {
            let m = module.clone();
            p.jobs
                .start(p.id, a.clone(), async move {
                    Ok(Fetched {
                        module: Some(m),
                        bytes: bytes::Bytes::new(),
                        resources: bytes::Bytes::new(),
                    })
                })
                .expect("job starts")
        })
        .collect()
}

/// A ring: in every superstep each process reports the messages it got
/// (as raw records `pid, superstep, src, sent_in, len, payload`, while the
/// superstep is below `report_below`), then sends `pid*100 + superstep` to
/// both neighbours. Process `pid` returns in superstep `rounds`. If `trap` is
/// `(pid, s)`, that process traps in superstep `s`.
fn ring_guest(rounds: &str, report_below: u32, trap: Option<(u32, u32)>) -> Vec<u8> {
    let trap = match trap {
        Some((p, s)) => format!(
            "(if (i32.and (i32.eq (local.get $pid) (i32.const {p})) (i32.eq (local.get $s) (i32.const {s}))) (then unreachable))"
        ),
        None => String::new(),
    };
    let text = format!(
        r#"(module
      (import "bspweb_v1" "pid" (func $pid (result i32)))
      (import "bspweb_v1" "nprocs" (func $nprocs (result i32)))
      (import "bspweb_v1" "superstep" (func $superstep (result i32)))
      (import "bspweb_v1" "send" (func $send (param i32 i32 i32) (result i32)))
      (import "bspweb_v1" "msg_count" (func $msg_count (result i32)))
      (import "bspweb_v1" "msg_info" (func $msg_info (param i32 i32) (result i32)))
      (import "bspweb_v1" "msg_read" (func $msg_read (param i32 i32) (result i32)))
      (import "bspweb_v1" "write_raw" (func $write_raw (param i32 i32) (result i32)))
      (memory (export "memory") 1)
      (func (export "bspweb_resume") (result i32)
        (local $s i32) (local $i i32) (local $n i32) (local $pid i32) (local $np i32)
        (local.set $s (call $superstep))
        (local.set $pid (call $pid))
        (local.set $np (call $nprocs))
        {trap}
        (local.set $n (call $msg_count))
        (block $done
          (loop $l
            (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
            (if (i32.lt_u (local.get $s) (i32.const {report_below})) (then
              (i32.store (i32.const 64) (local.get $pid))
              (i32.store (i32.const 68) (local.get $s))
              (drop (call $msg_info (local.get $i) (i32.const 72)))
              (drop (call $msg_read (local.get $i) (i32.const 84)))
              (drop (call $write_raw (i32.const 64) (i32.const 24)))))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $l)))
        (if (i32.ge_u (local.get $s) {rounds}) (then (return (i32.const 1))))
        (i32.store (i32.const 32)
          (i32.add (i32.mul (local.get $pid) (i32.const 100)) (local.get $s)))
        (drop (call $send
          (i32.rem_u (i32.add (local.get $pid) (i32.const 1)) (local.get $np))
          (i32.const 32) (i32.const 4)))
        (drop (call $send
          (i32.rem_u (i32.add (local.get $pid) (i32.sub (local.get $np) (i32.const 1))) (local.get $np))
          (i32.const 32) (i32.const 4)))
        (i32.const 0)))"#
    );
    wat::parse_str(&text).expect("ring guest parses")
}

/// Raw records `(pid, superstep, src, sent_in, len, payload)` in emission order.
fn records(events: &[PeerEvent]) -> Vec<[u32; 6]> {
    events
        .iter()
        .filter_map(|e| match e {
            PeerEvent::Output {
                stream: Stream::Raw,
                data,
                ..
            } => {
                let b = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap();
                let w: Vec<u32> = b
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                Some([w[0], w[1], w[2], w[3], w[4], w[5]])
            }
            _ => None,
        })
        .collect()
}

/// Collect events until every one of `nprocs` processes exited, then end the
/// job on every peer as the supernode does (`KillJob`) and wait for it.
async fn run_to_end(
    peers: &[TestPeer],
    job: JobId,
    nprocs: u32,
    handles: Vec<JoinHandle<()>>,
) -> Vec<PeerEvent> {
    let refs: Vec<&TestPeer> = peers.iter().collect();
    let events = collect_until(&refs, |all| {
        exited_pids(all).len() as u32 == nprocs
            || all.iter().any(|e| {
                matches!(
                    e,
                    PeerEvent::ProcessFailed { .. } | PeerEvent::ProcessAborted { .. }
                )
            })
    })
    .await;
    for p in peers {
        p.jobs.kill(job);
    }
    wait_all(handles).await;
    events
}

fn exited_pids(events: &[PeerEvent]) -> BTreeSet<Pid> {
    events
        .iter()
        .filter_map(|e| match e {
            PeerEvent::ProcessExited { pid, .. } => Some(*pid),
            _ => None,
        })
        .collect()
}

/// Output records as the supernode keeps them: once per (pid, seq). A
/// repeat (a restored process re-executing) must be identical.
fn dedup_output(events: &[PeerEvent]) -> Vec<PeerEvent> {
    let mut seen: std::collections::HashMap<(Pid, u64), String> = Default::default();
    let mut out = Vec::new();
    for e in events {
        match e {
            PeerEvent::Output { pid, seq, data, .. } => {
                if let Some(old) = seen.get(&(*pid, *seq)) {
                    assert_eq!(old, data, "a repeated output record of pid {pid} differs");
                    continue;
                }
                seen.insert((*pid, *seq), data.clone());
                out.push(e.clone());
            }
            _ => out.push(e.clone()),
        }
    }
    out
}

async fn wait_all(handles: Vec<JoinHandle<()>>) {
    for h in handles {
        tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .expect("the job ends in time")
            .expect("the job task does not panic");
    }
}

/// Drain `peers`' reporters until `done` holds for what was collected, or fail
/// after a deadline.
async fn collect_until(
    peers: &[&TestPeer],
    mut done: impl FnMut(&[PeerEvent]) -> bool,
) -> Vec<PeerEvent> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut all = Vec::new();
    loop {
        for p in peers {
            all.extend(p.reporter.drain());
        }
        if done(&all) {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "timed out; events so far: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_peers_run_a_ring_and_deliver_every_message_in_order() {
    let peers = start_peers(3).await;
    let wasm = ring_guest("(i32.add (i32.const 3) (local.get $pid))", 1000, None);
    // Five processes on three peers; pid p returns in superstep 3 + p, so
    // peers finish at different supersteps and messages to returned
    // processes are dropped.
    let placement = vec![0, 1, 2, 0, 1];
    let a = assignment(1, &wasm, &peers, placement.clone());
    let handles = start_everywhere(&peers, &a, &wasm);
    let events = run_to_end(&peers, 1, 5, handles).await;
    for p in &peers {
        assert!(p.jobs.running().is_empty());
    }
    let n = 5u32;
    let rounds = |p: u32| 3 + p;
    let mut expected = Vec::new();
    for pid in 0..n {
        for s in 1..=rounds(pid) {
            let mut srcs = [(pid + n - 1) % n, (pid + 1) % n];
            srcs.sort();
            for src in srcs {
                // `src` sent in superstep s-1 if it had not returned yet.
                if s - 1 < rounds(src) {
                    expected.push([pid, s, src, s - 1, 4, src * 100 + s - 1]);
                }
            }
        }
    }
    let mut got = records(&events);
    // Per process the order is the delivery order; across processes it is
    // interleaved, so compare per pid.
    got.sort_by_key(|r| (r[0], r[1]));
    assert_eq!(got, expected);

    let exits: BTreeSet<(Pid, u32)> = events
        .iter()
        .filter_map(|e| match e {
            PeerEvent::ProcessExited {
                job: 1,
                pid,
                superstep,
            } => Some((*pid, *superstep)),
            _ => None,
        })
        .collect();
    assert_eq!(exits, (0..n).map(|p| (p, rounds(p))).collect());
    assert!(
        !events.iter().any(|e| matches!(
            e,
            PeerEvent::ProcessFailed { .. } | PeerEvent::ProcessAborted { .. }
        )),
        "{events:?}"
    );
    // Every process's output comes before its exit, numbered from 0.
    for pid in 0..n {
        let seqs: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                PeerEvent::Output { pid: p, seq, .. } if *p == pid => Some(*seq),
                _ => None,
            })
            .collect();
        assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
        let exit = events
            .iter()
            .position(|e| matches!(e, PeerEvent::ProcessExited { pid: p, .. } if *p == pid))
            .unwrap();
        let last_output = events
            .iter()
            .rposition(|e| matches!(e, PeerEvent::Output { pid: p, .. } if *p == pid))
            .unwrap();
        assert!(last_output < exit);
    }
}

/// A ring of short supersteps on two peers: after a few supersteps the
/// processes run on the job drivers' threads (`runtime::ShortRuns`), and
/// every message still arrives once, in order, checkpoints included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_supersteps_run_on_the_drivers_thread_and_lose_nothing() {
    let (got, inline) = short_ring(2).await;
    assert_eq!(got, short_ring_records());
    for (peer, inline) in inline.iter().enumerate() {
        assert!(*inline > 0, "peer {peer} ran no superstep inline");
    }
}

/// With one thread for everything (a single-threaded runtime), a
/// superstep never runs on it: nothing else could run meanwhile.
#[tokio::test]
async fn a_single_threaded_runtime_never_runs_supersteps_inline() {
    let (got, inline) = short_ring(2).await;
    assert_eq!(got, short_ring_records());
    assert_eq!(inline, vec![0, 0]);
}

/// A job's only process runs on its driver's thread however long its
/// supersteps (`Machine::runs_alone`; here none counts as short, so the
/// short-superstep path never takes them), its checkpoints going out to
/// their replicas as before; two processes of a job on one peer do not,
/// they run in parallel on blocking threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_only_process_runs_on_the_drivers_thread() {
    const ROUNDS: u32 = 30;
    let peers =
        start_peers_full(3, BroadcastPolicy::default(), |_| runtime(), Duration::ZERO).await;
    let wasm = ring_guest(&format!("(i32.const {ROUNDS})"), 0, None);
    let a = assignment(1, &wasm, &peers, vec![0]);
    let handles = start_everywhere(&peers, &a, &wasm);
    let events = run_to_end(&peers, 1, 1, handles).await;
    assert_eq!(exited_pids(&events), BTreeSet::from([0]), "{events:?}");
    let on_driver = |p: &TestPeer| {
        p.stats
            .inline_supersteps
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    // Every superstep after the first (which instantiates the process),
    // checkpointed at every sync.
    assert_eq!(on_driver(&peers[0]), u64::from(ROUNDS), "{events:?}");
    let checkpoints = peers[0]
        .stats
        .checkpoints
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(checkpoints > u64::from(ROUNDS), "{checkpoints} checkpoints");

    let wasm = ring_guest(&format!("(i32.const {ROUNDS})"), 0, None);
    let a = assignment(2, &wasm, &peers, vec![1, 1]);
    let handles = start_everywhere(&peers, &a, &wasm);
    let events = run_to_end(&peers, 2, 2, handles).await;
    assert_eq!(exited_pids(&events), BTreeSet::from([0, 1]), "{events:?}");
    assert_eq!(on_driver(&peers[1]), 0);
}

/// Killing a job whose only process is in an endless superstep on its
/// driver's thread stops it at once, not at the superstep time limit
/// (these peers' cap of a minute): the kill reaches the process without
/// the driver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_stops_a_superstep_that_holds_the_driver() {
    let peers =
        start_peers_full(3, BroadcastPolicy::default(), |_| runtime(), Duration::ZERO).await;
    // Superstep 0 syncs; superstep 1 never ends.
    let wasm = wat::parse_str(
        r#"(module
          (import "bspweb_v1" "superstep" (func $superstep (result i32)))
          (memory (export "memory") 1)
          (func (export "bspweb_resume") (result i32)
            (if (i32.eqz (call $superstep)) (then (return (i32.const 0))))
            (loop $forever (br $forever))
            (i32.const 1)))"#,
    )
    .expect("the guest parses");
    let mut a = assignment(1, &wasm, &peers, vec![0]);
    a.limits.superstep_ms = 600_000;
    let handles = start_everywhere(&peers, &a, &wasm);
    // The process reports superstep 1 as it passes barrier 0, just
    // before it runs it.
    let refs: Vec<&TestPeer> = peers.iter().collect();
    collect_until(&refs, |all| {
        all.iter()
            .any(|e| matches!(e, PeerEvent::Progress { superstep: 1, .. }))
    })
    .await;
    for p in &peers {
        p.jobs.kill(1);
    }
    for h in handles {
        tokio::time::timeout(Duration::from_secs(30), h)
            .await
            .expect("the kill stops the superstep long before its time limit")
            .expect("the job task does not panic");
    }
}

/// A job's only process that writes output at every superstep: its
/// checkpoints wait for that output to reach the supernode, so some of
/// its supersteps run on blocking threads, some on the driver's; what it
/// wrote arrives whole and in order either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_only_process_that_prints_loses_nothing() {
    const ROUNDS: u32 = 30;
    let peers =
        start_peers_full(3, BroadcastPolicy::default(), |_| runtime(), Duration::ZERO).await;
    let wasm = ring_guest(&format!("(i32.const {ROUNDS})"), ROUNDS + 1, None);
    let a = assignment(1, &wasm, &peers, vec![0]);
    let handles = start_everywhere(&peers, &a, &wasm);
    let events = run_to_end(&peers, 1, 1, handles).await;
    assert_eq!(exited_pids(&events), BTreeSet::from([0]), "{events:?}");
    // Its two messages to itself, sent in superstep s − 1, read in s.
    let expected: Vec<[u32; 6]> = (1..=ROUNDS)
        .flat_map(|s| [[0, s, 0, s - 1, 4, s - 1]; 2])
        .collect();
    assert_eq!(records(&dedup_output(&events)), expected);
}

const SHORT_RING_PROCS: u32 = 4;
const SHORT_RING_ROUNDS: u32 = 40;

/// Run the ring of [`SHORT_RING_ROUNDS`] supersteps on `n` peers: its
/// records (ordered by process and superstep, in delivery order within
/// one) and each peer's count of inline supersteps.
async fn short_ring(n: usize) -> (Vec<[u32; 6]>, Vec<u64>) {
    let peers = start_peers(n).await;
    let wasm = ring_guest(&format!("(i32.const {SHORT_RING_ROUNDS})"), 1000, None);
    let placement = (0..SHORT_RING_PROCS).map(|p| p % n as u32).collect();
    let a = assignment(1, &wasm, &peers, placement);
    let handles = start_everywhere(&peers, &a, &wasm);
    let events = run_to_end(&peers, 1, SHORT_RING_PROCS, handles).await;
    assert!(
        !events.iter().any(|e| matches!(
            e,
            PeerEvent::ProcessFailed { .. } | PeerEvent::ProcessAborted { .. }
        )),
        "{events:?}"
    );
    let mut got = records(&events);
    got.sort_by_key(|r| (r[0], r[1]));
    let inline = peers
        .iter()
        .map(|p| {
            p.stats
                .inline_supersteps
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .collect();
    (got, inline)
}

/// What [`short_ring`]'s processes read: from both neighbours, in every
/// superstep after the first, the value they sent one superstep before.
fn short_ring_records() -> Vec<[u32; 6]> {
    let n = SHORT_RING_PROCS;
    let mut expected = Vec::new();
    for pid in 0..n {
        for s in 1..=SHORT_RING_ROUNDS {
            let mut srcs = [(pid + n - 1) % n, (pid + 1) % n];
            srcs.sort();
            for src in srcs {
                expected.push([pid, s, src, s - 1, 4, src * 100 + s - 1]);
            }
        }
    }
    expected
}

/// Redundancy 2: three processes, each on two of four peers, returning at
/// different supersteps (a process's copy 0 must announce its exit although
/// its exit checkpoint waits for the copies to agree): every copy exits,
/// and what the processes read is what one copy each reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_of_each_process_with_staggered_exits_run_to_the_end() {
    let peers = start_peers(4).await;
    let wasm = ring_guest("(i32.add (i32.const 2) (local.get $pid))", 1000, None);
    // A checkpoint at every sync, and one every third (digests then cover
    // the messages of three supersteps).
    for (job, every) in [(11, 1), (12, 3)] {
        two_copies_run(&peers, &wasm, job, every).await;
    }
}

async fn two_copies_run(peers: &[TestPeer], wasm: &[u8], job: JobId, every: u32) {
    let n = 3u32;
    let mut a = assignment(job, wasm, peers, vec![0, 1, 2]);
    // Copy 0 of pid p on peer p, copy 1 on peer p + 1.
    a.placement = vec![0, 1, 2, 1, 2, 3];
    a.limits.redundancy = 2;
    a.limits.checkpoint_every = every;
    let handles = start_everywhere(peers, &a, wasm);
    let refs: Vec<&TestPeer> = peers.iter().collect();
    let events = collect_until(&refs, |all| {
        let exits = all
            .iter()
            .filter(|e| matches!(e, PeerEvent::ProcessExited { .. }))
            .count();
        exits == 2 * n as usize
            || all.iter().any(|e| {
                matches!(
                    e,
                    PeerEvent::ProcessFailed { .. }
                        | PeerEvent::ProcessAborted { .. }
                        | PeerEvent::Disagreement { .. }
                )
            })
    })
    .await;
    for p in peers {
        p.jobs.kill(job);
    }
    wait_all(handles).await;
    assert!(
        !events.iter().any(|e| matches!(
            e,
            PeerEvent::ProcessFailed { .. }
                | PeerEvent::ProcessAborted { .. }
                | PeerEvent::Disagreement { .. }
        )),
        "checkpoint every {every}: {events:?}"
    );
    let rounds = |p: u32| 2 + p;
    let mut expected = Vec::new();
    for pid in 0..n {
        for s in 1..=rounds(pid) {
            let mut srcs = [(pid + n - 1) % n, (pid + 1) % n];
            srcs.sort();
            for src in srcs {
                if s - 1 < rounds(src) {
                    expected.push([pid, s, src, s - 1, 4, src * 100 + s - 1]);
                }
            }
        }
    }
    // Both copies print the same: each record twice.
    let mut got = records(&events);
    got.sort_by_key(|r| (r[0], r[1], r[2]));
    let mut twice: Vec<[u32; 6]> = expected.iter().flat_map(|r| [*r, *r]).collect();
    twice.sort_by_key(|r| (r[0], r[1], r[2]));
    assert_eq!(got, twice, "checkpoint every {every}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_one_peer_needs_no_network() {
    let peers = start_peers(1).await;
    let wasm = ring_guest("(i32.const 4)", 1000, None);
    let a = assignment(2, &wasm, &peers, vec![0, 0, 0]);
    let handles = start_everywhere(&peers, &a, &wasm);
    let events = run_to_end(&peers, 2, 3, handles).await;
    assert_eq!(records(&events).len(), 3 * 4 * 2);
    let exited = events
        .iter()
        .filter(|e| matches!(e, PeerEvent::ProcessExited { superstep: 4, .. }))
        .count();
    assert_eq!(exited, 3);
}

/// A fenced peer (declared gone, logging in under a new id) stops its jobs
/// and may be given the same job again under its new identity at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_fence_the_same_job_starts_again_under_the_new_identity() {
    let mut peers = start_peers(1).await;
    let wasm = ring_guest("(i32.const 200000)", 0, None);
    let a = assignment(3, &wasm, &peers, vec![0, 0]);
    let old = start_everywhere(&peers, &a, &wasm);
    assert_eq!(peers[0].jobs.running(), vec![3]);
    peers[0].jobs.fence();
    assert!(
        peers[0].jobs.running().is_empty(),
        "fenced jobs are forgotten at once"
    );
    // Under the new identity it runs, while the old driver winds down.
    peers[0].id = 900;
    let wasm = ring_guest("(i32.const 4)", 1000, None);
    let b = assignment(3, &wasm, &peers, vec![0, 0]);
    let handles = start_everywhere(&peers, &b, &wasm);
    let events = run_to_end(&peers, 3, 2, handles).await;
    assert_eq!(exited_pids(&events), BTreeSet::from([0, 1]));
    wait_all(old).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_is_reported_and_the_job_waits_for_kill_job() {
    let peers = start_peers(2).await;
    let wasm = ring_guest("(i32.const 1000000)", 0, Some((1, 2)));
    let a = assignment(3, &wasm, &peers, vec![0, 1, 0, 1]);
    let handles = start_everywhere(&peers, &a, &wasm);
    let events = collect_until(&[&peers[0], &peers[1]], |all| {
        all.iter()
            .any(|e| matches!(e, PeerEvent::ProcessFailed { .. }))
    })
    .await;
    let failed: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            PeerEvent::ProcessFailed {
                job,
                pid,
                superstep,
                reason,
            } => Some((*job, *pid, *superstep, reason.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (job, pid, superstep, reason) = &failed[0];
    assert_eq!((*job, *pid, *superstep), (3, Some(1), 2));
    assert!(
        reason.starts_with("the process trapped: wasm `unreachable` instruction executed"),
        "{reason}"
    );
    // Both peers keep the job until the supernode kills it.
    assert_eq!(peers[0].jobs.running(), vec![3]);
    assert_eq!(peers[1].jobs.running(), vec![3]);
    for p in &peers {
        assert!(p.jobs.kill(3));
    }
    wait_all(handles).await;
    for p in &peers {
        assert!(p.jobs.running().is_empty());
        // A repeated StartJob for an ended job is ignored.
        assert!(
            p.jobs
                .start(p.id, a.clone(), async { Err(unavailable()) })
                .is_none()
        );
    }
}

/// The ring's raw records, as the supernode keeps them, sorted per pid.
fn ring_records(events: &[PeerEvent]) -> Vec<[u32; 6]> {
    let mut got = records(&dedup_output(events));
    got.sort_by_key(|r| (r[0], r[1], r[2]));
    got
}

/// docs/fault-tolerance.md "Failure and restore": a peer vanishes mid-job;
/// the new assignment moves its process to another peer, which restores it
/// from the newest snapshot a replica holds; the output equals a run
/// without failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_process_is_restored_elsewhere_and_the_output_is_unchanged() {
    lose_a_peer(40, false).await;
}

/// The lost peer's last output never reached the supernode (its queue dies
/// with it): no replica may hold a checkpoint past that output, so the
/// restored processes emit it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_that_died_with_its_peer_is_emitted_again_by_the_restore() {
    lose_a_peer(43, true).await;
}

/// Peer #102 vanishes mid-job; with `drop_queued`, the events it had not
/// delivered vanish with it.
async fn lose_a_peer(job: JobId, drop_queued: bool) {
    let peers = start_peers(3).await;
    let wasm = ring_guest("(i32.const 12)", 1000, None);
    let placement = vec![0, 1, 2, 0, 1, 2];

    // The failure-free reference.
    let a = assignment(4, &wasm, &peers, placement.clone());
    let reference = run_to_end(&peers, 4, 6, start_everywhere(&peers, &a, &wasm)).await;

    let a = assignment(job, &wasm, &peers, placement);
    let mut handles = start_everywhere(&peers, &a, &wasm);
    // Let it get going, then peer #102 vanishes.
    let mut early = collect_until(&[&peers[0], &peers[1], &peers[2]], |all| {
        records(all).iter().any(|r| r[1] == 4)
    })
    .await;
    if drop_queued {
        // #102's uploads stall: its processes still produce output.
        early.extend(
            collect_until(&[&peers[0], &peers[1]], |_| peers[2].reporter.pending() > 0).await,
        );
    }
    assert!(peers[2].jobs.kill(job));
    wait_all(vec![handles.pop().unwrap()]).await;
    let queued = peers[2].reporter.drain();
    if !drop_queued {
        early.extend(queued);
    }
    // The supernode's new assignment: pids 2 and 5 go to #100 and #101.
    let mut b = a.clone();
    b.epoch = 1;
    b.peers.truncate(2);
    b.placement = vec![0, 1, 0, 0, 1, 1];
    b.restore = vec![2, 5];
    for p in &peers[..2] {
        assert!(
            p.jobs
                .start(p.id, b.clone(), async { Err(unavailable()) })
                .is_none()
        );
    }
    let mut events = early;
    events.extend(run_to_end(&peers[..2], job, 6, handles).await);
    let restored: BTreeSet<Pid> = events
        .iter()
        .filter_map(|e| match e {
            PeerEvent::ProcessRestored {
                job: j,
                pid,
                epoch: 1,
                ..
            } if *j == job => Some(*pid),
            _ => None,
        })
        .collect();
    assert_eq!(restored, BTreeSet::from([2, 5]), "{events:?}");
    assert!(
        !events.iter().any(|e| matches!(
            e,
            PeerEvent::ProcessFailed { .. } | PeerEvent::ProcessAborted { .. }
        )),
        "{events:?}"
    );
    assert_eq!(ring_records(&events), ring_records(&reference));
    assert_eq!(exited_pids(&events).len(), 6);
}

/// docs/fault-tolerance.md "Migration": a process moves between two live
/// peers at its next sync; the old host hands it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_migrates_between_live_peers() {
    let peers = start_peers(3).await;
    let wasm = ring_guest("(i32.const 10)", 1000, None);
    let placement = vec![0, 1, 2, 0];
    let a = assignment(41, &wasm, &peers, placement.clone());
    let reference = run_to_end(&peers, 41, 4, start_everywhere(&peers, &a, &wasm)).await;

    let a = assignment(42, &wasm, &peers, placement);
    let handles = start_everywhere(&peers, &a, &wasm);
    let early = collect_until(&[&peers[0], &peers[1], &peers[2]], |all| {
        records(all).iter().any(|r| r[1] == 3)
    })
    .await;
    let mut b = a.clone();
    b.epoch = 1;
    b.placement = vec![0, 1, 2, 1];
    b.restore = vec![3];
    b.migrate = vec![3];
    for p in &peers {
        assert!(
            p.jobs
                .start(p.id, b.clone(), async { Err(unavailable()) })
                .is_none()
        );
    }
    let mut events = early;
    events.extend(run_to_end(&peers, 42, 4, handles).await);
    assert!(
        events.iter().any(|e| matches!(
            e,
            PeerEvent::ProcessHandedOver {
                job: 42,
                pid: 3,
                ..
            }
        )),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| matches!(
            e,
            PeerEvent::ProcessRestored {
                job: 42,
                pid: 3,
                ..
            }
        )),
        "{events:?}"
    );
    assert_eq!(ring_records(&events), ring_records(&reference));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_module_or_a_bad_assignment_is_reported() {
    let peers = start_peers(1).await;
    let wasm = ring_guest("(i32.const 1)", 0, None);
    let a = assignment(5, &wasm, &peers, vec![0]);
    let h = peers[0]
        .jobs
        .start(peers[0].id, a, async { Err(unavailable()) })
        .unwrap();
    let events = collect_until(&[&peers[0]], |all| !all.is_empty()).await;
    assert!(matches!(
        &events[..],
        [PeerEvent::ProcessFailed { job: 5, pid: None, reason, .. }] if *reason == unavailable().to_string()
    ));
    peers[0].jobs.kill(5);
    wait_all(vec![h]).await;

    // Invalid assignments fail the job on the peer, saying why: a placement
    // naming a peer the job does not have; no proper secret (the data plane
    // would run under a guessable key).
    let bad_placement = AssignmentError::NoSuchPeerIndex { index: 3, peers: 1 };
    let cases = [
        (6, vec![0, 3], "t".to_string(), bad_placement),
        (
            7,
            vec![0, 0],
            String::new(),
            AssignmentError::ShortSecret(0),
        ),
    ];
    for (job, placement, token, error) in cases {
        let mut a = assignment(job, &wasm, &peers, placement);
        a.job_token = token;
        let handles = start_everywhere(&peers, &a, &wasm);
        let events = collect_until(&[&peers[0]], |all| !all.is_empty()).await;
        let want = format!("invalid job assignment: {error}");
        assert!(
            matches!(
                &events[..],
                [PeerEvent::ProcessFailed { job: j, pid: None, reason, .. }]
                    if *j == job && *reason == want
            ),
            "{events:?}"
        );
        peers[0].jobs.kill(job);
        wait_all(handles).await;
    }
}

// ---- the real example programs (built by `bspweb-programs`) -----------------

fn program(name: &str) -> &'static [u8] {
    bspweb_programs::get(name)
        .unwrap_or_else(|| panic!("program {name} is built in"))
        .wasm
}

fn stdout_of(events: &[PeerEvent], pid: Pid) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            PeerEvent::Output {
                pid: p,
                stream: Stream::Stdout,
                data,
                ..
            } if *p == pid => Some(data.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ring_example_runs_on_two_peers() {
    let peers = start_peers(2).await;
    let wasm = program("ring");
    let a = assignment(10, wasm, &peers, vec![0, 1, 1, 0]);
    let handles = start_everywhere(&peers, &a, wasm);
    let events = run_to_end(&peers, 10, 4, handles).await;
    let n = 4;
    for pid in 0..n {
        let (left, right) = ((pid + n - 1) % n, (pid + 1) % n);
        // Delivery order is by source pid: `right` sent 1, `left` sent 2.
        let mut got = [(right, 1), (left, 2)];
        got.sort();
        let lines = stdout_of(&events, pid);
        let expected_first: Vec<String> = got
            .iter()
            .map(|(src, v)| format!("got {v} from pid {src} in superstep 0"))
            .collect();
        assert_eq!(&lines[..2], &expected_first[..], "pid {pid}: {lines:?}");
        assert_eq!(lines[2], "got in total 2 messages");
    }
    let exits = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                PeerEvent::ProcessExited {
                    job: 10,
                    superstep: 1,
                    ..
                }
            )
        })
        .count();
    assert_eq!(exits, 4);
}

/// Run `misbehave` with `mode` for pid 1 of two processes on one peer and
/// return the first failure or abort, or `None` if both processes exited.
async fn misbehave(
    mode: &str,
    limits: JobLimits,
    job: JobId,
) -> (Option<PeerEvent>, Vec<PeerEvent>) {
    let peers = start_peers(1).await;
    let wasm = program("misbehave");
    let mut a = assignment(job, wasm, &peers, vec![0, 0]);
    a.args = format!(r#"{{"mode":"{mode}","pid":1}}"#);
    a.limits = limits;
    a.resources = vec![(
        "input.txt".into(),
        base64::engine::general_purpose::STANDARD.encode("from a file\n"),
    )];
    let handles = start_everywhere(&peers, &a, wasm);
    let events = collect_until(&[&peers[0]], |all| {
        all.iter().any(|e| {
            matches!(
                e,
                PeerEvent::ProcessFailed { .. } | PeerEvent::ProcessAborted { .. }
            )
        }) || all
            .iter()
            .filter(|e| matches!(e, PeerEvent::ProcessExited { .. }))
            .count()
            == 2
    })
    .await;
    peers[0].jobs.kill(job);
    wait_all(handles).await;
    let end = events
        .iter()
        .find(|e| {
            matches!(
                e,
                PeerEvent::ProcessFailed { .. } | PeerEvent::ProcessAborted { .. }
            )
        })
        .cloned();
    (end, events)
}

fn small_limits() -> JobLimits {
    JobLimits {
        superstep_ms: 500,
        memory_mib: 16,
        output_mib: 1,
        checkpoint_every: 1,
        replicas: 2,
        redundancy: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_programs_end_with_clear_reasons() {
    let failed = |e: Option<PeerEvent>| match e {
        Some(PeerEvent::ProcessFailed {
            pid: Some(1),
            superstep: 1,
            reason,
            ..
        }) => reason,
        other => panic!("expected pid 1 to fail in superstep 1, got {other:?}"),
    };
    let aborted = |e: Option<PeerEvent>| match e {
        Some(PeerEvent::ProcessAborted {
            pid: 1,
            superstep: 1,
            reason,
            ..
        }) => reason,
        other => panic!("expected pid 1 to abort in superstep 1, got {other:?}"),
    };

    let r = failed(misbehave("trap", small_limits(), 20).await.0);
    assert!(
        r.starts_with("the process trapped: wasm `unreachable` instruction executed"),
        "{r}"
    );
    let r = failed(misbehave("loop", small_limits(), 21).await.0);
    assert!(
        r.starts_with("time limit exceeded: superstep 1 ran longer than 0.5 s; sync more often"),
        "{r}"
    );
    let r = failed(misbehave("grow", small_limits(), 22).await.0);
    assert!(
        r.starts_with("memory limit exceeded: the process tried to grow its memory to"),
        "{r}"
    );
    assert!(r.ends_with("the limit is 16 MiB"), "{r}");
    let r = failed(misbehave("flood", small_limits(), 23).await.0);
    assert!(r.starts_with("output limit exceeded"), "{r}");

    let r = aborted(misbehave("panic", small_limits(), 24).await.0);
    assert!(r.contains("deliberate panic"), "{r}");
    let r = aborted(misbehave("abort", small_limits(), 25).await.0);
    assert!(r.contains("deliberate abort"), "{r}");
    let r = aborted(misbehave("error", small_limits(), 26).await.0);
    assert!(r.contains("deliberate error"), "{r}");
    let r = aborted(misbehave("bad-pid", small_limits(), 27).await.0);
    assert!(!r.is_empty());

    let (end, events) = misbehave("resource", small_limits(), 28).await;
    assert!(end.is_none(), "{end:?}");
    assert_eq!(stdout_of(&events, 1), vec!["from a file".to_string()]);
}

/// A peer that only speaks the data plane: it admits the real peer's
/// connection, so a test can dial the real peer and send it anything. Keep
/// the returned receiver alive while the test runs.
async fn fake_peer(
    job: JobId,
    token: &str,
    id: PeerId,
    real: PeerId,
) -> (String, mpsc::Receiver<Inbound>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let registry = Arc::new(Registry::new());
    let (_, rx) = registry.register(job, token, id, [id, real]);
    tokio::spawn(net::serve(listener, registry, CancellationToken::new()));
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_breaks_the_protocol_fails_the_job() {
    use futures_util::SinkExt;
    let peers = start_peers(1).await;
    let wasm = ring_guest("(i32.const 5)", 0, None);
    for (job, bad) in [(30, "placement"), (31, "malformed")] {
        let mut a = assignment(job, &wasm, &peers, vec![0, 1]);
        let (fake_addr, _fake_inbox) = fake_peer(job, &a.job_token, 999, peers[0].id).await;
        a.peers.push(JobPeer {
            id: 999,
            addr: fake_addr.clone(),
            cluster: None,
        });
        let handles = start_everywhere(&peers, &a, &wasm);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut conn = net::connect(&peers[0].addr, job, 999, &a.job_token, 0, deadline)
            .await
            .unwrap();
        let expected = match bad {
            "placement" => {
                let frame = Frame::Data {
                    messages: vec![WireMessage {
                        src: 7,
                        dst: 0,
                        superstep: 0,
                        seq: 0,
                        tag: 0,
                        payload: vec![1, 2, 3, 4].into(),
                    }],
                };
                conn.send(net::encode(&frame).unwrap()).await.unwrap();
                "peer #999 broke the data-plane protocol: pid 7 does not exist in a job of 2 processes".to_string()
            }
            _ => {
                let frame = Frame::Done {
                    superstep: 0,
                    procs: vec![bsp_api::wire::ProcDone {
                        pid: 1,
                        exited: false,
                        counts: vec![(0, 1)],
                        digest: None,
                    }],
                    acks: Vec::new(),
                };
                conn.send(net::encode(&frame).unwrap()).await.unwrap();
                let frame = Frame::Done {
                    superstep: 0,
                    procs: vec![bsp_api::wire::ProcDone {
                        pid: 1,
                        exited: false,
                        counts: vec![(0, 2)],
                        digest: None,
                    }],
                    acks: Vec::new(),
                };
                conn.send(net::encode(&frame).unwrap()).await.unwrap();
                "peer #999 broke the data-plane protocol: two different reports that pid 1 finished superstep 0".to_string()
            }
        };
        let events = collect_until(&[&peers[0]], |all| {
            all.iter()
                .any(|e| matches!(e, PeerEvent::ProcessFailed { .. }))
        })
        .await;
        let reason = events
            .iter()
            .find_map(|e| match e {
                PeerEvent::ProcessFailed {
                    pid: None, reason, ..
                } => Some(reason.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no messaging failure in {events:?}"));
        assert!(reason.starts_with(&expected), "{reason}");
        peers[0].jobs.kill(job);
        wait_all(handles).await;
    }
}

/// Every pid printed, for each round of the `broadcast` example's large
/// mode, that it got `n` bytes with the hash the round's sender printed.
#[track_caller]
fn assert_rounds(events: &[PeerEvent], nprocs: u32, rounds: u32, n: u64, label: &str) {
    for round in 0..rounds {
        let root = round % nprocs;
        let sent = stdout_of(events, root)
            .into_iter()
            .find(|l| l.starts_with(&format!("round {round}: pid {root} sent")))
            .unwrap_or_else(|| panic!("{label}: pid {root} sent nothing in round {round}"));
        let hash = sent.rsplit(' ').next().unwrap().to_string();
        for pid in 0..nprocs {
            let want = format!("round {round}: pid {pid} got {n} bytes fnv {hash}");
            assert!(
                stdout_of(events, pid).contains(&want),
                "{label}: pid {pid} lacks `{want}`: {:?}",
                stdout_of(events, pid)
            );
        }
    }
}

/// The `broadcast` example's large mode: every receiver's hash matches the
/// sender's, under every broadcast algorithm; relayed schedules really
/// relay, and direct sending puts each payload on a connection once per
/// peer, not once per destination.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_broadcasts_arrive_whole_under_every_algorithm() {
    use crate::relay::BroadcastAlgorithm as A;
    use std::sync::atomic::Ordering::Relaxed;
    const N: u64 = 1_500_001;
    const ROUNDS: u32 = 2;
    let wasm = program("broadcast");
    for (k, algorithm) in [A::Direct, A::Symmetric, A::Binomial, A::Chain, A::Auto]
        .into_iter()
        .enumerate()
    {
        let policy = BroadcastPolicy {
            algorithm,
            chunk: 200_000,
            ..BroadcastPolicy::default()
        };
        let peers = start_peers_with(4, policy).await;
        let job = 40 + k as JobId;
        let placement = vec![0, 1, 2, 3, 0, 1, 2, 3, 1, 2];
        let nprocs = placement.len() as u32;
        let mut a = assignment(job, wasm, &peers, placement);
        a.args = format!(r#"{{"bytes": {N}, "rounds": {ROUNDS}}}"#);
        a.limits.memory_mib = 32;
        let handles = start_everywhere(&peers, &a, wasm);
        let events = dedup_output(&run_to_end(&peers, job, nprocs, handles).await);
        assert_eq!(
            exited_pids(&events).len() as u32,
            nprocs,
            "{algorithm:?}: {events:?}"
        );
        assert_rounds(&events, nprocs, ROUNDS, N, &format!("{algorithm:?}"));
        let direct: u64 = peers.iter().map(|p| p.stats.direct.load(Relaxed)).sum();
        let relayed: u64 = peers.iter().map(|p| p.stats.relayed.load(Relaxed)).sum();
        match algorithm {
            // Loopback: the rule sends directly. Each round the sender's
            // peer sends the payload to the 3 other peers once each (not to
            // each of their 7 or so destination pids).
            A::Direct | A::Auto => {
                assert_eq!(relayed, 0, "{algorithm:?}");
                let once_per_peer = u64::from(ROUNDS) * 3 * N;
                assert!(
                    (once_per_peer..once_per_peer + N / 2).contains(&direct),
                    "{algorithm:?}: {direct} payload bytes sent, {once_per_peer} expected"
                );
            }
            _ => {
                assert!(
                    relayed >= u64::from(ROUNDS) * 3 * N,
                    "{algorithm:?}: {relayed} relayed"
                );
                assert!(
                    direct < N / 2,
                    "{algorithm:?}: {direct} bytes went directly"
                );
            }
        }
    }
}

/// Run `a` on 6 peers with their own runtimes in three clusters, where
/// only the first peer may download the program (and `resources`, in
/// `encode_resources` form); returns the events.
async fn run_with_robber(mut a: JobAssignment, wasm: &[u8], resources: Vec<u8>) -> Vec<PeerEvent> {
    let _ = runtime(); // the log subscriber
    let peers = start_peers_on(6, BroadcastPolicy::default(), |_| {
        Runtime::new().expect("engine")
    })
    .await;
    a.program_bytes = wasm.len() as u64;
    if !resources.is_empty() {
        use sha2::Digest as _;
        a.resources_hash = hex::encode(sha2::Sha256::digest(&resources));
        a.resources_bytes = resources.len() as u64;
    }
    a.peers = peers
        .iter()
        .enumerate()
        .map(|(i, p)| JobPeer {
            id: p.id,
            addr: p.addr.clone(),
            cluster: Some(["x", "y", "z"][i % 3].to_string()),
        })
        .collect();
    let handles: Vec<JoinHandle<()>> = peers
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let root = i == 0;
            let bytes = wasm.to_vec();
            let resources = bytes::Bytes::from(resources.clone());
            p.jobs
                .start(p.id, a.clone(), async move {
                    if !root {
                        return Err(unavailable());
                    }
                    // As from the supernode: the job compiles it.
                    Ok(Fetched {
                        module: None,
                        bytes: bytes.into(),
                        resources,
                    })
                })
                .expect("job starts")
        })
        .collect();
    let events = run_to_end(&peers, a.job, a.nprocs, handles).await;
    assert_eq!(exited_pids(&events).len() as u32, a.nprocs, "{events:?}");
    let statuses: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            PeerEvent::Status { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        statuses
            .iter()
            .any(|t| t.contains("downloaded the program") && t.contains("Robber")),
        "{statuses:?}"
    );
    let by_robber = statuses
        .iter()
        .filter(|t| t.contains("got the program by Robber"))
        .count();
    assert_eq!(by_robber, 5, "{statuses:?}");
    assert!(
        !statuses.iter().any(|t| t.contains("directly")),
        "{statuses:?}"
    );
    events
}

/// Robber: only the first peer downloads the program (the others' downloads
/// fail), the rest get it from each other across three clusters, and the
/// job runs; each peer says how it got the program.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_program_reaches_the_peers_by_robber() {
    let wasm = program("broadcast");
    let a = assignment(70, wasm, &[], vec![0, 1, 2, 3, 4, 5, 0, 1]);
    let events = run_with_robber(a, wasm, vec![]).await;
    // The program ran: pid 0's hello reached everyone.
    for pid in 0..8 {
        assert!(
            stdout_of(&events, pid).contains(&format!("pid {pid} got range hello from 0")),
            "pid {pid}: {:?}",
            stdout_of(&events, pid)
        );
    }
}

/// The job's resources travel with the program: a process on a peer that
/// never talked to the supernode reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_travel_with_the_program() {
    let wasm = program("misbehave");
    let mut a = assignment(71, wasm, &[], vec![3, 0, 1, 2, 4, 5]);
    a.args = r#"{"mode":"resource","pid":0}"#.into();
    let text = "from-the-bundle;".repeat(5000); // 80 kB: several pieces
    let resources = bsp_api::control::encode_resources(&[
        ("input.txt".into(), text.clone().into_bytes()),
        ("other".into(), vec![7; 10]),
    ]);
    let events = run_with_robber(a, wasm, resources).await;
    assert_eq!(stdout_of(&events, 0), vec![text]);
}

/// Connections between the peers of relay schedules break again and again
/// while large broadcasts go on (chain and symmetric): every peer still
/// gets every round whole, because an upstream peer sends again what it
/// had sent on a connection that broke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_connections_during_relays_lose_nothing() {
    use crate::relay::BroadcastAlgorithm as A;
    const N: u64 = 3_000_000;
    const ROUNDS: u32 = 12;
    let wasm = program("broadcast");
    for (k, algorithm) in [A::Direct, A::Chain, A::Symmetric].into_iter().enumerate() {
        let policy = BroadcastPolicy {
            algorithm,
            chunk: 64 << 10,
            ..BroadcastPolicy::default()
        };
        let peers = start_peers_with(4, policy).await;
        let job = 80 + k as JobId;
        let placement = vec![0, 1, 2, 3, 1, 2];
        let nprocs = placement.len() as u32;
        let mut a = assignment(job, wasm, &peers, placement);
        a.args = format!(r#"{{"bytes": {N}, "rounds": {ROUNDS}}}"#);
        a.limits.memory_mib = 32;
        let handles = start_everywhere(&peers, &a, wasm);
        // Cut connections, round-robin over all pairs, until the job ends.
        let registries: Vec<(PeerId, Arc<Registry>)> = peers
            .iter()
            .map(|p| (p.id, p.jobs.env.registry.clone()))
            .collect();
        let stop = CancellationToken::new();
        let chaos = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut cuts = 0u32;
                let mut i = 0usize;
                // Twelve cuts, a new one every 100 ms: each connection
                // recovers before the next fault.
                while !stop.is_cancelled() && cuts < 12 {
                    let (_, reg) = &registries[i % 4];
                    let (from, _) = registries[(i + 1 + i / 4 % 3) % 4];
                    if reg.cut(job, from) {
                        cuts += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    i += 1;
                    tokio::task::yield_now().await;
                }
                cuts
            }
        });
        let events = dedup_output(&run_to_end(&peers, job, nprocs, handles).await);
        stop.cancel();
        let cuts = chaos.await.unwrap();
        assert!(cuts > 0, "no connection was cut");
        assert_eq!(
            exited_pids(&events).len() as u32,
            nprocs,
            "{algorithm:?}: {events:?}"
        );
        assert_rounds(
            &events,
            nprocs,
            ROUNDS,
            N,
            &format!("{algorithm:?} with {cuts} cuts"),
        );
    }
}

/// A `send_list` naming pids more often than the job has pids goes
/// directly, not through a relay whose receivers would refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_pids_in_a_large_send_list_go_directly() {
    use crate::relay::BroadcastAlgorithm as A;
    let policy = BroadcastPolicy {
        algorithm: A::Symmetric,
        ..BroadcastPolicy::default()
    };
    let peers = start_peers_with(3, policy).await;
    let mut payload = vec![0u8; 300_000];
    payload[0] = 0xab;
    let list: Vec<u32> = vec![1, 2, 1, 2];
    let wat = format!(
        r#"(module
      (import "bspweb_v1" "pid" (func $pid (result i32)))
      (import "bspweb_v1" "superstep" (func $superstep (result i32)))
      (import "bspweb_v1" "send_list" (func $send_list (param i32 i32 i32 i32) (result i32)))
      (import "bspweb_v1" "msg_count" (func $msg_count (result i32)))
      (import "bspweb_v1" "write_raw" (func $write_raw (param i32 i32) (result i32)))
      (memory (export "memory") 8)
      (data (i32.const 0) "{list}")
      (func (export "bspweb_resume") (result i32)
        (if (i32.eqz (call $superstep)) (then
          (if (i32.eqz (call $pid)) (then
            (drop (call $send_list (i32.const 0) (i32.const 4) (i32.const 64) (i32.const {len})))))
          (return (i32.const 0))))
        (i32.store (i32.const 32) (call $msg_count))
        (drop (call $write_raw (i32.const 32) (i32.const 4)))
        (i32.const 1)))"#,
        list = list
            .iter()
            .flat_map(|p| p.to_le_bytes())
            .map(|b| format!("\\{b:02x}"))
            .collect::<String>(),
        len = payload.len(),
    );
    let wasm = wat::parse_str(&wat).unwrap();
    let a = assignment(90, &wasm, &peers, vec![0, 1, 2]);
    let handles = start_everywhere(&peers, &a, &wasm);
    let events = run_to_end(&peers, 90, 3, handles).await;
    assert_eq!(exited_pids(&events).len(), 3, "{events:?}");
    let counts: BTreeMap<Pid, u32> = events
        .iter()
        .filter_map(|e| match e {
            PeerEvent::Output {
                pid,
                stream: Stream::Raw,
                data,
                ..
            } => {
                let b = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .ok()?;
                Some((*pid, u32::from_le_bytes(b[..4].try_into().ok()?)))
            }
            _ => None,
        })
        .collect();
    assert_eq!(counts, BTreeMap::from([(0, 0), (1, 2), (2, 2)]));
}

/// The safe point's arithmetic agrees with `checkpointed` (and costs O(1)
/// when checkpoints are off: `every` is a million).
#[test]
fn newest_checkpointed_before_matches_a_scan() {
    for every in [0u32, 1, 2, 3, 7, 1_000_000] {
        for c in 0..40u32 {
            let scan = (0..c).rev().find(|&s| checkpointed(s, every));
            assert_eq!(
                newest_checkpointed_before(c, every),
                scan,
                "c={c} every={every}"
            );
        }
    }
}

/// The head of a snapshot of pid 3 at `superstep` (memory to be captured).
pub(crate) fn head(superstep: u32) -> crate::checkpoint::Snapshot {
    crate::checkpoint::Snapshot::head(3, superstep)
}

/// A replica whose base the owner still holds gets the pages that changed
/// in a few words as patches; one whose base the owner no longer holds
/// gets them whole. Either way it rebuilds the snapshot.
#[test]
fn checkpoints_patch_sparse_pages_against_a_base_the_owner_holds() {
    use crate::checkpoint::{Assembler, PAGE_SIZE, PageTracker, ReplicaStore, patch};
    let m0: Vec<u8> = (0..3 * PAGE_SIZE).map(|i| (i % 251) as u8).collect();
    let mut m1 = m0.clone();
    for w in [5, 700, 8000] {
        m1[PAGE_SIZE + 8 * w] ^= 0xff;
    }
    let mut t = PageTracker::new();
    let s0 = Arc::new(t.capture(head(0), &m0));
    let s1 = Arc::new(t.capture(head(1), &m1));
    t.sent(7, 0);
    t.sent(8, 0);
    let entries = |out: &net::Outgoing| -> Vec<(u32, Frame)> {
        let net::Outgoing::Deferred(d) = out else {
            panic!("a checkpoint's frames are made by the writer")
        };
        d.segments()
            .expect("encodes")
            .iter()
            .map(|s| net::decode(s.to_bytes()).expect("decodes"))
            .map(|f| match &f {
                Frame::Checkpoint(c) => (c.pages.iter().map(|(i, _)| *i).sum(), f),
                _ => (0, f),
            })
            .collect()
    };
    let held: std::collections::VecDeque<_> = [s0.clone()].into();
    let planned = plan_frames(&mut t, &s1, &[7], &held);
    let frames = entries(&planned[0].1);
    assert_eq!(frames.last().unwrap().0, 1 | patch::PAGE_PATCH);
    let planned = plan_frames(&mut t, &s1, &[8], &Default::default());
    assert_eq!(entries(&planned[0].1).last().unwrap().0, 1);

    for (_, frame) in frames.into_iter().chain(entries(&planned[0].1)) {
        let mut asm = Assembler::new(1 << 30);
        let mut store = ReplicaStore::new();
        store.insert((*s0).clone());
        let Some(crate::checkpoint::Assembled::Checkpoint(got)) =
            asm.push(frame, &mut store).unwrap()
        else {
            panic!("a checkpoint")
        };
        assert_eq!(got, *s1);
    }
}

/// A capture only plans its checkpoint's frames: the first writer makes
/// them (off the process's critical path; on a blocking thread when there
/// are many patches to make), once for every replica of the same plan, and
/// they rebuild the snapshot, low-byte changes XOR-packed.
#[test]
fn a_checkpoints_frames_are_made_once_by_the_first_writer() {
    use crate::checkpoint::{Assembler, PAGE_SIZE, PageTracker, ReplicaStore, patch};
    let pages = 20;
    let m0: Vec<u8> = (0..pages * PAGE_SIZE).map(|i| (i % 251) as u8).collect();
    // Every word of every page changes in its low byte.
    let m1: Vec<u8> = m0
        .iter()
        .enumerate()
        .map(|(i, b)| if i % 8 == 0 { b ^ 0x3c } else { *b })
        .collect();
    let mut t = PageTracker::new();
    let s0 = Arc::new(t.capture(head(0), &m0));
    let s1 = Arc::new(t.capture(head(1), &m1));
    t.sent(7, 0);
    t.sent(8, 0);
    let held: std::collections::VecDeque<_> = [s0.clone()].into();
    let planned = plan_frames(&mut t, &s1, &[7, 8], &held);
    let made: Vec<_> = planned
        .iter()
        .map(|(_, o)| match o {
            net::Outgoing::Deferred(d) => d.clone(),
            other => panic!("the capture encoded {other:?}"),
        })
        .collect();
    assert!(
        Arc::ptr_eq(&made[0], &made[1]),
        "one plan, one set of frames"
    );
    assert!(made[0].slow(), "20 patches are left to a blocking thread");
    let first = made[0].segments().unwrap();
    assert!(!made[1].slow(), "made once");
    assert!(std::ptr::eq(first, made[1].segments().unwrap()));
    let bytes: usize = first.iter().map(net::Segments::len).sum();
    // Each page: its block widths and a byte per word, not 64 KiB.
    assert!(
        bytes < pages * (PAGE_SIZE / 8 + PAGE_SIZE / 128 + 64),
        "{bytes} bytes"
    );
    let frames: Vec<Frame> = first
        .iter()
        .map(|s| net::decode(s.to_bytes()).unwrap())
        .collect();
    let Some(Frame::Checkpoint(last)) = frames.last() else {
        panic!("ends with the checkpoint")
    };
    assert!(last.pages.iter().all(|(i, _)| i & patch::PAGE_PATCH != 0));
    let mut asm = Assembler::new(1 << 30);
    let mut store = ReplicaStore::new();
    store.insert((*s0).clone());
    let mut got = None;
    for f in frames {
        got = asm.push(f, &mut store).unwrap();
    }
    let Some(crate::checkpoint::Assembled::Checkpoint(got)) = got else {
        panic!("a checkpoint")
    };
    assert_eq!(got, *s1);
}

/// Status lines name the clusters the job's peers are in, as the
/// assignment's sites have them (issue 15).
#[test]
fn status_lines_name_the_clusters_of_the_jobs_peers() {
    let site = |id, c: Option<&str>| Site::new(id, "127.0.0.1:1", c.map(String::from));
    assert_eq!(clusters_phrase([site(1, None), site(2, None)].iter()), "");
    assert_eq!(
        clusters_phrase([site(1, Some("b")), site(2, Some("a")), site(3, Some("b"))].iter()),
        "; the job's 3 peers are in clusters a (1), b (2)"
    );
    assert_eq!(
        clusters_phrase([site(1, Some("found-3")), site(2, None)].iter()),
        "; the job's 2 peers are in clusters found-3 (1), no cluster (1)"
    );
    assert_eq!(
        clusters_phrase([site(1, Some("a"))].iter()),
        "; the job's 1 peer is in cluster a (1)"
    );
}
