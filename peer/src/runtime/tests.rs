//! The sandbox against hand-written guests that follow the `bspweb_v1` ABI.

use std::sync::OnceLock;

use super::*;

/// Every host import, so test guests can call any of them.
const IMPORTS: &str = r#"
  (import "bspweb_v1" "pid" (func $pid (result i32)))
  (import "bspweb_v1" "nprocs" (func $nprocs (result i32)))
  (import "bspweb_v1" "superstep" (func $superstep (result i32)))
  (import "bspweb_v1" "seed" (func $seed (result i64)))
  (import "bspweb_v1" "args_len" (func $args_len (result i32)))
  (import "bspweb_v1" "args_read" (func $args_read (param i32)))
  (import "bspweb_v1" "send" (func $send (param i32 i32 i32) (result i32)))
  (import "bspweb_v1" "send_range" (func $send_range (param i32 i32 i32 i32) (result i32)))
  (import "bspweb_v1" "send_list" (func $send_list (param i32 i32 i32 i32) (result i32)))
  (import "bspweb_v1" "msg_count" (func $msg_count (result i32)))
  (import "bspweb_v1" "msg_info" (func $msg_info (param i32 i32) (result i32)))
  (import "bspweb_v1" "msg_read" (func $msg_read (param i32 i32) (result i32)))
  (import "bspweb_v1" "print" (func $print (param i32 i32 i32) (result i32)))
  (import "bspweb_v1" "write_raw" (func $write_raw (param i32 i32) (result i32)))
  (import "bspweb_v1" "flush" (func $flush (result i32)))
  (import "bspweb_v1" "abort" (func $abort (param i32 i32)))
  (import "bspweb_v1" "resource_len" (func $resource_len (param i32 i32) (result i64)))
  (import "bspweb_v1" "resource_read" (func $resource_read (param i32 i32 i32) (result i32)))
"#;

/// A guest: the imports, one page of memory (more if `pages` says so), data
/// segments and a `bspweb_resume` body.
fn guest(pages: u32, data: &str, body: &str) -> Vec<u8> {
    let text = format!(
        r#"(module {IMPORTS}
          (memory (export "memory") {pages})
          {data}
          (func (export "bspweb_resume") (result i32) {body}))"#
    );
    wat::parse_str(&text).expect("test guest parses")
}

fn runtime() -> Arc<Runtime> {
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    RT.get_or_init(|| Runtime::new().expect("engine")).clone()
}

struct Limits {
    memory_mib: usize,
    budget: Duration,
    output: u64,
    outbox: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_mib: 16,
            budget: Duration::from_secs(30),
            output: 1 << 20,
            outbox: 1 << 20,
        }
    }
}

fn job_with(limits: Limits) -> Arc<JobInfo> {
    Arc::new(JobInfo {
        job: 42,
        nprocs: 4,
        seed: 0x1234_5678_9abc,
        args: br#"{"n":3}"#.to_vec(),
        resources: HashMap::from([("input".to_string(), b"RESOURCE".to_vec())]),
        memory_limit: limits.memory_mib << 20,
        superstep_budget: limits.budget,
        output_limit: limits.output,
        outbox_limit: limits.outbox,
        kill: Arc::new(AtomicBool::new(false)),
        reporter: Reporter::new(),
    })
}

fn start(wasm: &[u8], job: Arc<JobInfo>, pid: Pid) -> Process {
    let rt = runtime();
    let module = rt
        .compile(&module_hash(wasm), wasm)
        .expect("module compiles");
    rt.instantiate(&module, job, pid).expect("process starts")
}

fn raw_outputs(events: &[PeerEvent]) -> Vec<(u64, Vec<u8>)> {
    events
        .iter()
        .filter_map(|e| match e {
            PeerEvent::Output {
                seq,
                stream: Stream::Raw,
                data,
                ..
            } => Some((
                *seq,
                base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap(),
            )),
            _ => None,
        })
        .collect()
}

fn words(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

mod generated;

fn failure(outcome: Outcome) -> String {
    match outcome {
        Outcome::Failed(reason) => reason,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn host_functions_report_identity_and_exchange_messages() {
    let wasm = guest(
        1,
        r#"(data (i32.const 16) "hello")"#,
        r#"
        (if (i32.eqz (call $superstep)) (then
          (i32.store (i32.const 100) (call $pid))
          (i32.store (i32.const 104) (call $nprocs))
          (i32.store (i32.const 108) (call $send (i32.const 1) (i32.const 16) (i32.const 5)))
          (i32.store (i32.const 112) (call $send (i32.const 4) (i32.const 16) (i32.const 5)))
          (i32.store (i32.const 116) (call $send (i32.const -1) (i32.const 16) (i32.const 5)))
          (drop (call $write_raw (i32.const 100) (i32.const 20)))
          (drop (call $print (i32.const 1) (i32.const 16) (i32.const 5)))
          (drop (call $print (i32.const 2) (i32.const 16) (i32.const 4)))
          (return (i32.const 0))))
        (i32.store (i32.const 200) (call $superstep))
        (i32.store (i32.const 204) (call $msg_count))
        (i32.store (i32.const 208) (call $msg_info (i32.const 1) (i32.const 212)))
        (i32.store (i32.const 224) (call $msg_read (i32.const 1) (i32.const 228)))
        (i32.store (i32.const 232) (call $msg_info (i32.const 2) (i32.const 300)))
        (i32.store (i32.const 236) (call $msg_read (i32.const -1) (i32.const 300)))
        (drop (call $write_raw (i32.const 200) (i32.const 40)))
        (i32.const 1)"#,
    );
    let job = job_with(Limits::default());
    let mut p = start(&wasm, job.clone(), 3);
    assert_eq!(p.resume(), Outcome::Sync);
    let out = p.take_outbox();
    assert_eq!(
        out,
        vec![Outgoing {
            dst: 1,
            seq: 0,
            tag: 0,
            payload: Bytes::from_static(b"hello"),
        }]
    );
    let inbox = vec![
        Message {
            src: 0,
            superstep: 0,
            tag: 0,
            payload: Bytes::from_static(b"a"),
        },
        Message {
            src: 2,
            superstep: 0,
            tag: 0,
            payload: Bytes::from_static(b"wxyz"),
        },
    ];
    p.begin_superstep(1, inbox);
    assert_eq!(p.resume(), Outcome::Done);

    let events = job.reporter.drain();
    let raw = raw_outputs(&events);
    assert_eq!(raw.len(), 2);
    assert_eq!(raw[0].0, 0, "output records are numbered from 0");
    assert_eq!(words(&raw[0].1), vec![3, 4, 0, ERR_BAD_PID, ERR_BAD_PID]);
    assert_eq!(raw[1].0, 3);
    let w = words(&raw[1].1);
    // superstep, count, info status, src, sent-in superstep, len, read status, payload
    assert_eq!(&w[..7], &[1, 2, 0, 2, 0, 4, 0]);
    assert_eq!(&raw[1].1[28..32], b"wxyz");
    assert_eq!(&w[8..10], &[ERR_NOT_FOUND, ERR_NOT_FOUND]);
    let texts: Vec<(u64, Stream, &str)> = events
        .iter()
        .filter_map(|e| match e {
            PeerEvent::Output {
                seq, stream, data, ..
            } if *stream != Stream::Raw => Some((*seq, *stream, data.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        texts,
        vec![(1, Stream::Stdout, "hello"), (2, Stream::Stderr, "hell")]
    );
    assert!(events.iter().all(|e| matches!(
        e,
        PeerEvent::Output {
            job: 42,
            pid: 3,
            ..
        }
    )));
    assert_eq!(p.host_state().output_seq, 4);
}

#[test]
fn seed_args_and_resources_are_readable() {
    let wasm = guest(
        1,
        r#"(data (i32.const 16) "input") (data (i32.const 32) "nothing")"#,
        r#"
        (i64.store (i32.const 100) (call $seed))
        (i32.store (i32.const 108) (call $args_len))
        (call $args_read (i32.const 112))
        (i64.store (i32.const 120) (call $resource_len (i32.const 16) (i32.const 5)))
        (i64.store (i32.const 128) (call $resource_len (i32.const 32) (i32.const 7)))
        (i32.store (i32.const 136) (call $resource_read (i32.const 16) (i32.const 5) (i32.const 140)))
        (i32.store (i32.const 148) (call $resource_read (i32.const 32) (i32.const 7) (i32.const 140)))
        (drop (call $write_raw (i32.const 100) (i32.const 52)))
        (i32.const 1)"#,
    );
    let job = job_with(Limits::default());
    let mut p = start(&wasm, job.clone(), 0);
    assert_eq!(p.resume(), Outcome::Done);
    let raw = raw_outputs(&job.reporter.drain());
    let b = &raw[0].1;
    assert_eq!(
        u64::from_le_bytes(b[0..8].try_into().unwrap()),
        0x1234_5678_9abc
    );
    assert_eq!(words(&b[8..12]), vec![7]);
    assert_eq!(&b[12..19], br#"{"n":3}"#);
    assert_eq!(i64::from_le_bytes(b[20..28].try_into().unwrap()), 8);
    assert_eq!(i64::from_le_bytes(b[28..36].try_into().unwrap()), -1);
    assert_eq!(words(&b[36..40]), vec![0]);
    assert_eq!(&b[40..48], b"RESOURCE");
    assert_eq!(words(&b[48..52]), vec![ERR_NOT_FOUND]);
}

#[test]
fn broadcasts_check_their_ranges_and_lists() {
    let wasm = guest(
        1,
        r#"(data (i32.const 16) "m")
           (data (i32.const 32) "\02\00\00\00\00\00\00\00")
           (data (i32.const 48) "\01\00\00\00\09\00\00\00")"#,
        r#"
        (i32.store (i32.const 100) (call $send_range (i32.const 1) (i32.const 4) (i32.const 16) (i32.const 1)))
        (i32.store (i32.const 104) (call $send_range (i32.const 2) (i32.const 2) (i32.const 16) (i32.const 1)))
        (i32.store (i32.const 108) (call $send_range (i32.const 0) (i32.const 5) (i32.const 16) (i32.const 1)))
        (i32.store (i32.const 112) (call $send_range (i32.const -1) (i32.const 2) (i32.const 16) (i32.const 1)))
        (i32.store (i32.const 116) (call $send_list (i32.const 32) (i32.const 2) (i32.const 16) (i32.const 1)))
        (i32.store (i32.const 120) (call $send_list (i32.const 48) (i32.const 2) (i32.const 16) (i32.const 1)))
        (i32.store (i32.const 124) (call $send (i32.const 0) (i32.const 0) (i32.const 0x800001)))
        (drop (call $write_raw (i32.const 100) (i32.const 28)))
        (i32.const 0)"#,
    );
    let job = job_with(Limits::default());
    let mut p = start(&wasm, job.clone(), 0);
    assert_eq!(p.resume(), Outcome::Sync);
    let raw = raw_outputs(&job.reporter.drain());
    assert_eq!(
        words(&raw[0].1),
        vec![
            0,
            ERR_BAD_RANGE,
            ERR_BAD_RANGE,
            ERR_BAD_RANGE,
            0,
            ERR_BAD_PID,
            ERR_TOO_LARGE
        ]
    );
    let sent: Vec<(Pid, u32)> = p.take_outbox().iter().map(|m| (m.dst, m.seq)).collect();
    assert_eq!(sent, vec![(1, 0), (2, 1), (3, 2), (2, 3), (0, 4)]);
}

#[test]
fn a_trap_fails_the_process_with_a_readable_reason() {
    let wasm = guest(1, "", "unreachable");
    let mut p = start(&wasm, job_with(Limits::default()), 0);
    let reason = failure(p.resume());
    assert!(
        reason.starts_with("the process trapped: wasm `unreachable` instruction executed"),
        "{reason}"
    );
    assert_eq!(
        p.resume(),
        Outcome::Failed("the process has already ended".into())
    );
}

#[test]
fn an_infinite_loop_hits_the_superstep_time_limit() {
    let wasm = guest(1, "", "(loop $l (br $l)) (i32.const 0)");
    let budget = Duration::from_millis(200);
    let mut p = start(
        &wasm,
        job_with(Limits {
            budget,
            ..Limits::default()
        }),
        0,
    );
    let started = Instant::now();
    let reason = failure(p.resume());
    let took = started.elapsed();
    assert_eq!(
        reason,
        "time limit exceeded: superstep 0 ran longer than 0.2 s; sync more often, or submit with a larger --superstep-secs (peers allow up to their --max-superstep-secs, 3600 s by default)"
    );
    assert!(took >= budget, "stopped early: {took:?}");
    assert!(
        took < budget + Duration::from_secs(5),
        "stopped late: {took:?}"
    );
}

/// Runs a guest whose `bspweb_resume` body never ends and checks that the
/// superstep time limit stops it.
fn stops_at_the_time_limit(body: &str) {
    let wasm = guest(1, "", body);
    let budget = Duration::from_millis(100);
    let mut p = start(
        &wasm,
        job_with(Limits {
            budget,
            ..Limits::default()
        }),
        0,
    );
    // On its own thread, so that a loop the epoch checks miss fails the
    // test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let outcome = p.resume();
        let _ = tx.send(outcome);
    });
    let outcome = rx
        .recv_timeout(budget + Duration::from_secs(10))
        .expect("the loop was not stopped within 10 s of its time limit");
    let reason = failure(outcome);
    assert!(
        reason.starts_with("time limit exceeded: superstep 0"),
        "{reason}"
    );
}

// Loop headers check the epoch only once the static size of the loop
// bodies run since the last check adds up to a budget (the vendored
// Cranelift's `epoch_check`, vendor/wasmtime-internal-cranelift/PATCHED.md).
// These loops exercise the accounting: every one must still be stopped.

#[test]
fn a_loop_with_a_body_larger_than_the_check_budget_is_stopped() {
    // 40 000 operators per iteration, more than the 16 384 of the budget.
    let step = "(local.set $i (i32.add (local.get $i) (i32.const 1)))";
    stops_at_the_time_limit(&format!(
        "(local $i i32) (loop $l {} (br $l)) (i32.const 0)",
        step.repeat(10_000)
    ));
}

#[test]
fn nested_loops_and_dead_loops_are_stopped() {
    // An outer loop whose body holds blocks, an `if`, an inner loop run once
    // per iteration, a loop after `br` (dead code: it gets no header, but
    // still opens and closes a frame) and one in an arm never taken.
    stops_at_the_time_limit(
        r#"(local $i i32)
        (loop $outer
          (block $b
            (loop $inner
              (local.set $i (i32.add (local.get $i) (i32.const 1)))
              (br_if $inner (i32.and (local.get $i) (i32.const 0))))
            (br $b)
            (loop $dead (br $dead)))
          (if (i32.eqz (local.get $i))
            (then (loop $never (br $never)))
            (else (nop)))
          (br $outer))
        (i32.const 0)"#,
    );
}

#[test]
fn a_loop_reached_through_br_table_is_stopped() {
    stops_at_the_time_limit(
        r#"(local $i i32)
        (loop $l
          (block $a
            (block $b
              (br_table $a $b $l (i32.and (local.get $i) (i32.const 3)))))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $l))
        (i32.const 0)"#,
    );
}

#[test]
fn the_time_budget_spans_the_yields_of_one_superstep() {
    // Spins ~forever, but yields on every call: the budget is the sum.
    let wasm = guest(
        1,
        "",
        r#"(local $i i32)
        (loop $l
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $l (i32.lt_u (local.get $i) (i32.const 20000000))))
        (i32.const 2)"#,
    );
    let budget = Duration::from_millis(300);
    let mut p = start(
        &wasm,
        job_with(Limits {
            budget,
            ..Limits::default()
        }),
        0,
    );
    let started = Instant::now();
    let outcome = loop {
        match p.resume() {
            Outcome::Yield => continue,
            other => break other,
        }
    };
    assert!(failure(outcome).starts_with("time limit exceeded: superstep 0"));
    assert!(started.elapsed() < budget + Duration::from_secs(5));
}

#[test]
fn growing_memory_past_the_cap_fails_the_process() {
    let wasm = guest(1, "", "(drop (memory.grow (i32.const 100))) (i32.const 1)");
    let mut p = start(
        &wasm,
        job_with(Limits {
            memory_mib: 2,
            ..Limits::default()
        }),
        0,
    );
    assert_eq!(
        failure(p.resume()),
        "memory limit exceeded: the process tried to grow its memory to 7 MiB; the limit is 2 MiB"
    );
}

#[test]
fn a_module_whose_initial_memory_exceeds_the_cap_does_not_start() {
    let wasm = guest(64, "", "(i32.const 1)"); // 4 MiB
    let rt = runtime();
    let module = rt.compile(&module_hash(&wasm), &wasm).unwrap();
    let job = job_with(Limits {
        memory_mib: 2,
        ..Limits::default()
    });
    let err = rt.instantiate(&module, job, 0).unwrap_err();
    assert!(matches!(err, StartError::Stopped(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "memory limit exceeded: the process tried to grow its memory to 4 MiB; the limit is 2 MiB"
    );
}

#[test]
fn an_out_of_bounds_pointer_is_a_bad_host_call() {
    let wasm = guest(
        1,
        "",
        "(drop (call $send (i32.const 0) (i32.const 0xffff0000) (i32.const 100))) (i32.const 1)",
    );
    let mut p = start(&wasm, job_with(Limits::default()), 0);
    assert_eq!(
        failure(p.resume()),
        "bad host call: `send` read 100 bytes at address 0xffff0000, outside the process's 65536-byte memory"
    );

    // Writing past the end is refused too, even when the start is inside.
    let wasm = guest(1, "", "(call $args_read (i32.const 65530)) (i32.const 1)");
    let mut p = start(&wasm, job_with(Limits::default()), 0);
    let reason = failure(p.resume());
    assert!(
        reason.starts_with("bad host call: `args_read` wrote 7 bytes at address 0xfffa"),
        "{reason}"
    );
}

#[test]
fn print_to_an_unknown_stream_is_a_bad_host_call() {
    let wasm = guest(
        1,
        "",
        "(drop (call $print (i32.const 7) (i32.const 0) (i32.const 1))) (i32.const 1)",
    );
    let mut p = start(&wasm, job_with(Limits::default()), 0);
    assert!(failure(p.resume()).starts_with("bad host call: `print` to stream 7"));
}

#[test]
fn abort_ends_the_process_as_an_abort_with_its_reason() {
    let wasm = guest(
        1,
        r#"(data (i32.const 16) "gave up: no input")"#,
        "(call $abort (i32.const 16) (i32.const 17)) (i32.const 1)",
    );
    let mut p = start(&wasm, job_with(Limits::default()), 0);
    assert_eq!(p.resume(), Outcome::Aborted("gave up: no input".into()));
}

#[test]
fn output_beyond_the_limit_fails_the_process() {
    let wasm = guest(
        1,
        "",
        r#"(loop $l
             (drop (call $print (i32.const 1) (i32.const 0) (i32.const 100)))
             (br $l))
           (i32.const 1)"#,
    );
    let job = job_with(Limits {
        output: 1 << 20,
        ..Limits::default()
    });
    let mut p = start(&wasm, job.clone(), 0);
    let reason = failure(p.resume());
    assert!(
        reason.starts_with("output limit exceeded: the process wrote more than 1 MiB"),
        "{reason}"
    );
    let events = job.reporter.drain();
    assert_eq!(
        events.len(),
        (1 << 20) / 100,
        "every record within the limit is kept"
    );
}

#[test]
fn messages_beyond_the_outbox_limit_fail_the_process() {
    let wasm = guest(
        1,
        "",
        r#"(loop $l
             (drop (call $send_range (i32.const 0) (i32.const 4) (i32.const 0) (i32.const 1000)))
             (br $l))
           (i32.const 1)"#,
    );
    let mut p = start(
        &wasm,
        job_with(Limits {
            outbox: 1 << 20,
            ..Limits::default()
        }),
        0,
    );
    let reason = failure(p.resume());
    assert!(
        reason.starts_with(
            "message limit exceeded: the process queued more than 1 MiB of messages in superstep 0"
        ),
        "{reason}"
    );
}

#[test]
fn the_kill_flag_stops_a_running_process() {
    let wasm = guest(1, "", "(loop $l (br $l)) (i32.const 0)");
    let job = job_with(Limits::default());
    let mut p = start(&wasm, job.clone(), 0);
    let running = std::thread::spawn(move || {
        let started = Instant::now();
        (p.resume(), started.elapsed())
    });
    job.kill.store(true, Ordering::Relaxed);
    let (outcome, took) = running.join().unwrap();
    assert_eq!(outcome, Outcome::Failed("killed".into()));
    assert!(took < Duration::from_secs(5));
}

#[test]
fn yield_and_unknown_statuses() {
    // Memory word 0 counts the calls: yield, then done.
    let wasm = guest(
        1,
        "",
        r#"(i32.store (i32.const 0) (i32.add (i32.load (i32.const 0)) (i32.const 1)))
           (if (result i32) (i32.eq (i32.load (i32.const 0)) (i32.const 1))
             (then (i32.const 2)) (else (i32.const 1)))"#,
    );
    let mut p = start(&wasm, job_with(Limits::default()), 0);
    assert_eq!(p.resume(), Outcome::Yield);
    assert_eq!(p.resume(), Outcome::Done);

    let wasm = guest(1, "", "(i32.const 7)");
    let mut p = start(&wasm, job_with(Limits::default()), 0);
    assert!(failure(p.resume()).contains("unknown status 7"));
}

/// A C guest's Asyncify state (`asyncify_get_state`) must be at rest after
/// every resume: a module that returns mid-unwind fails instead of being
/// checkpointed with a half-saved stack.
#[test]
fn asyncify_must_be_at_rest_when_resume_returns() {
    let module = |state: i32| {
        wat::parse_str(format!(
            r#"(module {IMPORTS}
              (memory (export "memory") 1)
              (func (export "asyncify_get_state") (result i32) (i32.const {state}))
              (func (export "bspweb_resume") (result i32) (i32.const 0)))"#
        ))
        .expect("test guest parses")
    };
    let mut p = start(&module(0), job_with(Limits::default()), 0);
    assert_eq!(p.resume(), Outcome::Sync);
    let mut p = start(&module(1), job_with(Limits::default()), 0);
    let why = failure(p.resume());
    assert!(why.contains("while Asyncify was unwinding"), "{why}");
    let mut p = start(&module(2), job_with(Limits::default()), 0);
    assert!(failure(p.resume()).contains("rewinding"));
}

/// Captures read only the pages written since the last one (the kernel's
/// write tracking, `dirty.rs`): every capture still equals the memory,
/// while pages go cold, are written (by the guest, with new bytes or the
/// same), come back hot and go cold again.
#[test]
fn captures_with_write_tracking_equal_the_memory_at_every_superstep() {
    // Word 0 counts the calls, c. Each call writes c / 2 into page
    // 3c mod 8 and 1 (the same bytes each time) into page 5c mod 8.
    let wasm = guest(
        8,
        "",
        r#"(local $c i32)
           (local.set $c (i32.add (i32.load (i32.const 0)) (i32.const 1)))
           (i32.store (i32.const 0) (local.get $c))
           (i32.store
             (i32.add (i32.mul (i32.rem_u (i32.mul (local.get $c) (i32.const 3)) (i32.const 8))
                               (i32.const 65536)) (i32.const 100))
             (i32.div_u (local.get $c) (i32.const 2)))
           (i32.store8
             (i32.add (i32.mul (i32.rem_u (i32.mul (local.get $c) (i32.const 5)) (i32.const 8))
                               (i32.const 65536)) (i32.const 200))
             (i32.const 1))
           (i32.const 0)"#,
    );
    let mut p = start(&wasm, job_with(Limits::default()), 0);
    let mut tracker = PageTracker::new();
    let mut previous: Option<Snapshot> = None;
    let mut most_cold = 0;
    for s in 0..60u32 {
        assert_eq!(p.resume(), Outcome::Sync);
        // Every other capture recycles the buffer of the one before.
        let snap = match previous.take().filter(|_| s % 2 == 0) {
            Some(prev) => p.checkpoint_reusing(&mut tracker, vec![], false, prev),
            None => p.checkpoint(&mut tracker, vec![], false),
        };
        assert_eq!(snap.memory, p.memory_bytes(), "superstep {s}");
        assert!(snap.verify());
        let cold = p.cold_pages().expect("write tracking is on (see dirty.rs)");
        most_cold = most_cold.max(cold);
        previous = Some(snap);
        p.begin_superstep(s + 1, vec![]);
    }
    assert!(most_cold >= 3, "pages went cold: at most {most_cold}");
}

#[test]
fn flush_waits_until_the_output_is_delivered() {
    let wasm = guest(
        1,
        r#"(data (i32.const 16) "line")"#,
        r#"(drop (call $print (i32.const 1) (i32.const 16) (i32.const 4)))
           (i32.store (i32.const 100) (call $flush))
           (drop (call $write_raw (i32.const 100) (i32.const 4)))
           (i32.const 1)"#,
    );
    let job = job_with(Limits::default());
    let mut p = start(&wasm, job.clone(), 0);
    let running = std::thread::spawn(move || p.resume());
    // Act as the uploader: take the line once it is queued.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while seen.is_empty() && Instant::now() < deadline {
        seen = job.reporter.drain();
        std::thread::yield_now();
    }
    assert!(matches!(
        &seen[..],
        [PeerEvent::Output {
            stream: Stream::Stdout,
            ..
        }]
    ));
    assert_eq!(running.join().unwrap(), Outcome::Done);
    let raw = raw_outputs(&job.reporter.drain());
    assert_eq!(words(&raw[0].1), vec![0]);
}

#[test]
fn compile_checks_the_hash_and_the_abi() {
    let rt = runtime();
    let wasm = guest(1, "", "(i32.const 1)");
    assert!(matches!(
        rt.compile(&"00".repeat(32), &wasm),
        Err(CompileError::HashMismatch { .. })
    ));
    assert!(check_hash(&module_hash(&wasm).to_uppercase(), &wasm).is_ok());
    assert!(matches!(
        check_hash(&module_hash(&wasm), &wasm[1..]),
        Err(CompileError::HashMismatch { .. })
    ));
    let wasi = wat::parse_str(
        r#"(module
          (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
          (memory (export "memory") 1)
          (func (export "bspweb_resume") (result i32) i32.const 1))"#,
    )
    .unwrap();
    let err = rt.compile(&module_hash(&wasi), &wasi).unwrap_err();
    assert!(
        err.to_string().contains("wasi_snapshot_preview1.fd_write"),
        "{err}"
    );
    // Compiled once, then served from the cache.
    let hash = module_hash(&wasm);
    assert!(rt.compile(&hash, &wasm).is_ok());
    assert!(rt.cached(&hash).is_some());
}

/// Jobs that start together, or a download racing the copy from other
/// peers, ask for the same program at once: it is compiled once.
#[test]
fn concurrent_compiles_of_one_program_compile_it_once() {
    let rt = Runtime::new().expect("engine");
    let wasm = guest(1, "", "(i32.const 2)");
    let hash = module_hash(&wasm);
    let barrier = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                barrier.wait();
                rt.compile(&hash, &wasm).expect("compiles");
            });
        }
    });
    assert_eq!(rt.compiled_count(), 1);
    assert!(
        rt.compiling.lock().unwrap().is_empty(),
        "no lock is left behind"
    );
    // A bad program fails every caller, and leaves nothing behind either.
    let bad = b"\0asm\x01\0\0\0garbage".to_vec();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| assert!(rt.compile(&module_hash(&bad), &bad).is_err()));
        }
    });
    assert!(rt.compiling.lock().unwrap().is_empty());
}

#[test]
fn guest_threads_can_be_niced() {
    let nice = std::thread::spawn(|| {
        set_thread_niceness(5).unwrap();
        // SAFETY: getpriority only reads its integer arguments.
        unsafe { libc::getpriority(libc::PRIO_PROCESS as _, 0) }
    })
    .join()
    .unwrap();
    assert!(nice >= 5, "niceness {nice}");
}

#[test]
fn backtrace_symbols_are_demangled() {
    assert_eq!(
        demangle("_ZN6bspweb2rt6resume28_$u7b$$u7b$closure$u7d$$u7d$17hf1c1253e90b080acE"),
        "bspweb::rt::resume::{{closure}}"
    );
    assert_eq!(
        demangle(
            "_ZN4core3ptr85drop_in_place$LT$std..rt..lang_start$LT$$LP$$RP$$GT$..$u7b$$u7b$closure$u7d$$u7d$$GT$17h0123456789abcdefE"
        ),
        "core::ptr::drop_in_place<std::rt::lang_start<()>::{{closure}}>"
    );
    assert_eq!(demangle("bspweb_resume"), "bspweb_resume");
    assert_eq!(demangle("_ZN99short"), "_ZN99short");
    assert_eq!(demangle("_ZN99shortE"), "_ZN99shortE");
}

// ---- checkpoint and restore (docs/fault-tolerance.md) -------------------------

fn job_for(nprocs: u32, args: &str, memory_mib: usize) -> Arc<JobInfo> {
    Arc::new(JobInfo {
        job: 7,
        nprocs,
        seed: 0x5eed,
        args: args.as_bytes().to_vec(),
        resources: HashMap::new(),
        memory_limit: memory_mib << 20,
        superstep_budget: Duration::from_secs(60),
        output_limit: 64 << 20,
        outbox_limit: 64 << 20,
        kill: Arc::new(AtomicBool::new(false)),
        reporter: Reporter::new(),
    })
}

fn program(name: &str) -> Module {
    let wasm = bspweb_programs::get(name)
        .unwrap_or_else(|| panic!("program {name} is built in"))
        .wasm;
    runtime()
        .compile(&module_hash(wasm), wasm)
        .expect("the example compiles")
}

/// All processes of a job run in lockstep on one thread, checkpointed at
/// the end of every superstep, with messages routed by (source, send order).
struct World {
    job: Arc<JobInfo>,
    procs: Vec<Process>,
    trackers: Vec<PageTracker>,
    exited: Vec<bool>,
    /// Recycle the previous snapshot's buffer ([`Process::checkpoint_reusing`]).
    reuse: Option<Vec<Option<Snapshot>>>,
}

impl World {
    fn start(module: &Module, job: Arc<JobInfo>) -> World {
        World::start_on(&runtime(), module, job)
    }

    /// [`World::start`] on `rt`, whose engine `module` is for.
    fn start_on(rt: &Runtime, module: &Module, job: Arc<JobInfo>) -> World {
        let procs = (0..job.nprocs)
            .map(|pid| rt.instantiate(module, job.clone(), pid).unwrap())
            .collect();
        World {
            trackers: (0..job.nprocs).map(|_| PageTracker::new()).collect(),
            exited: vec![false; job.nprocs as usize],
            job,
            procs,
            reuse: None,
        }
    }

    /// Restore every process from `snapshots` (of one superstep) into a new
    /// job; the messages of that superstep come from the snapshots' outboxes.
    fn restore(module: &Module, job: Arc<JobInfo>, snapshots: &[Snapshot]) -> World {
        let procs = snapshots
            .iter()
            .map(|s| runtime().restore(module, job.clone(), s).unwrap())
            .collect();
        let mut w = World {
            trackers: snapshots
                .iter()
                .map(|s| PageTracker::seeded(s, None))
                .collect(),
            exited: snapshots.iter().map(|s| s.exited).collect(),
            job,
            procs,
            reuse: None,
        };
        w.deliver(snapshots);
        w
    }

    /// Start the next superstep of every live process with the messages of
    /// `snapshots`' outboxes.
    fn deliver(&mut self, snapshots: &[Snapshot]) {
        let step = snapshots[0].superstep;
        for (pid, p) in self.procs.iter_mut().enumerate() {
            if self.exited[pid] {
                continue;
            }
            let mut inbox = Vec::new();
            for s in snapshots {
                let sent = s.outbox.iter().filter(|m| m.superstep == step);
                for m in sent.filter(|m| m.dst == pid as Pid) {
                    inbox.push(Message {
                        src: m.src,
                        superstep: m.superstep,
                        tag: m.tag,
                        payload: m.payload.clone(),
                    });
                }
            }
            p.begin_superstep(step + 1, inbox);
        }
    }

    /// Run one superstep: every live process to its sync or return, then
    /// checkpoint all (exited ones again, unchanged) and deliver.
    fn step(&mut self) -> Vec<Snapshot> {
        let mut snaps = Vec::new();
        for (pid, p) in self.procs.iter_mut().enumerate() {
            let mut exited = self.exited[pid];
            if !exited {
                match p.resume() {
                    Outcome::Sync => {}
                    Outcome::Done => exited = true,
                    other => panic!("pid {pid}: {other:?}"),
                }
            }
            let outbox = p
                .take_outbox()
                .into_iter()
                .map(|o| WireMessage {
                    src: pid as Pid,
                    dst: o.dst,
                    superstep: p.superstep(),
                    seq: o.seq,
                    tag: 0,
                    payload: o.payload.clone(),
                })
                .collect();
            let tracker = &mut self.trackers[pid];
            let previous = self.reuse.as_mut().and_then(|r| r.get_mut(pid)?.take());
            let snap = match previous {
                Some(previous) => p.checkpoint_reusing(tracker, outbox, exited, previous),
                None => p.checkpoint(tracker, outbox, exited),
            };
            snaps.push(snap);
            self.exited[pid] = exited;
        }
        self.deliver(&snaps);
        if let Some(prev) = self.reuse.as_mut() {
            *prev = snaps.iter().cloned().map(Some).collect();
        }
        snaps
    }

    fn finished(&self) -> bool {
        self.exited.iter().all(|&e| e)
    }

    /// Run to the end; the snapshots of every superstep.
    fn run(&mut self) -> Vec<Vec<Snapshot>> {
        let mut all = Vec::new();
        while !self.finished() {
            assert!(all.len() < 100, "the program does not end");
            all.push(self.step());
        }
        all
    }

    /// Output records as (pid, seq, stream, data).
    fn output(&self) -> Vec<(Pid, u64, Stream, String)> {
        let mut out: Vec<_> = self
            .job
            .reporter
            .drain()
            .into_iter()
            .filter_map(|e| match e {
                PeerEvent::Output {
                    pid,
                    seq,
                    stream,
                    data,
                    ..
                } => Some((pid, seq, stream, data)),
                _ => None,
            })
            .collect();
        out.sort_by_key(|o| (o.0, o.1));
        out
    }
}

const SORT_ARGS: &str = r#"{"n": 3000, "oversample": 16, "emit": true}"#;

/// A restarted peer reads the programs it compiled before back from its
/// compile cache instead of compiling them, and they run exactly like the
/// compiled ones: the same output and the same checkpoints.
#[test]
fn a_program_read_back_from_the_compile_cache_runs_like_the_compiled_one() {
    let root = tempfile::tempdir().expect("tempdir");
    let wasm = bspweb_programs::get("sample-sort").expect("built in").wasm;
    let hash = module_hash(wasm);
    let run = |rt: &Runtime| {
        let module = rt.compile(&hash, wasm).expect("compiles");
        let mut w = World::start_on(rt, &module, job_for(3, SORT_ARGS, 64));
        let hashes: Vec<Vec<[u8; 32]>> = w
            .run()
            .iter()
            .map(|step| step.iter().map(|s| s.hash).collect())
            .collect();
        (w.output(), hashes)
    };
    let first = Runtime::new().expect("engine");
    let dir = first
        .use_compile_cache(root.path(), 1 << 30)
        .expect("a private directory");
    let compiled = run(&first);
    assert_eq!((first.compiled_count(), first.loaded_count()), (1, 0));
    assert_eq!(std::fs::read_dir(&dir).expect("list").count(), 1, "kept");
    drop(first);

    // The peer restarted: a new engine, the same directory.
    let second = Runtime::new().expect("engine");
    second
        .use_compile_cache(root.path(), 1 << 30)
        .expect("a private directory");
    let loaded = run(&second);
    assert_eq!((second.compiled_count(), second.loaded_count()), (0, 1));
    assert!(!compiled.0.is_empty());
    assert_eq!(loaded, compiled);
    // Bytes that are not the program are refused before the cache is read.
    let third = Runtime::new().expect("engine");
    third
        .use_compile_cache(root.path(), 1 << 30)
        .expect("a private directory");
    let mut other = wasm.to_vec();
    other.push(0);
    assert!(matches!(
        third.compile(&hash, &other),
        Err(CompileError::HashMismatch { .. })
    ));
    assert_eq!(third.loaded_count(), 0);
}

#[test]
fn a_restored_process_goes_on_exactly_like_the_original() {
    let module = program("sample-sort");
    let mut original = World::start(&module, job_for(3, SORT_ARGS, 64));
    let reference = original.run();
    let reference_output = original.output();
    assert!(reference.len() >= 3, "{} supersteps", reference.len());
    assert!(
        reference_output
            .iter()
            .any(|o| o.3.starts_with("sorted 3000 keys on 3 processes: ok")),
        "{reference_output:?}"
    );

    // Restore every process from the checkpoint of each superstep in turn.
    for c in 0..reference.len() - 1 {
        let mut first = World::start(&module, job_for(3, SORT_ARGS, 64));
        first.reuse = Some(Vec::new());
        let mut taken = Vec::new();
        for _ in 0..=c {
            taken = first.step();
        }
        assert_eq!(taken, reference[c], "run from scratch, superstep {c}");
        let mut restored = World::restore(&module, job_for(3, SORT_ARGS, 64), &taken);
        let rest = restored.run();
        assert_eq!(&rest[..], &reference[c + 1..], "restored at superstep {c}");
        let expected: Vec<_> = reference_output
            .iter()
            .filter(|o| o.1 >= taken[o.0 as usize].output_seq)
            .cloned()
            .collect();
        assert_eq!(restored.output(), expected, "restored at superstep {c}");
    }
}

/// The issue's determinism check at unit level: the same job run twice
/// gives identical checkpoint hashes at every superstep.
#[test]
fn the_same_job_run_twice_has_identical_checkpoint_hashes() {
    let module = program("supersteps");
    let args = r#"{"k": 5, "h": 5000}"#;
    let hashes = |world: &mut World| -> Vec<Vec<String>> {
        world
            .run()
            .iter()
            .map(|step| step.iter().map(Snapshot::hash_hex).collect())
            .collect()
    };
    let a = hashes(&mut World::start(&module, job_for(3, args, 64)));
    let b = hashes(&mut World::start(&module, job_for(3, args, 64)));
    assert_eq!(a.len(), 6);
    assert_eq!(a, b);
    // Distinct processes and supersteps have distinct states.
    let mut all: Vec<&String> = a.iter().flatten().collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 18);
}

#[test]
fn exported_mutable_globals_are_checkpointed_and_restored() {
    // The guest keeps a counter in an exported mutable global (allowed by
    // the validator when named `__stack_pointer`) and reports it each step.
    let wasm = wat::parse_str(format!(
        r#"(module {IMPORTS}
          (memory (export "memory") 1)
          (global $__stack_pointer (export "__stack_pointer") (mut i32) (i32.const 1000))
          (func (export "bspweb_resume") (result i32)
            (global.set $__stack_pointer (i32.add (global.get $__stack_pointer) (i32.const 1)))
            (i32.store (i32.const 0) (global.get $__stack_pointer))
            (drop (call $write_raw (i32.const 0) (i32.const 4)))
            (i32.const 0)))"#
    ))
    .unwrap();
    let rt = runtime();
    let module = rt.compile(&module_hash(&wasm), &wasm).unwrap();
    let job = job_for(1, "{}", 1);
    let mut p = rt.instantiate(&module, job.clone(), 0).unwrap();
    let mut tracker = PageTracker::new();
    assert_eq!(p.resume(), Outcome::Sync);
    p.begin_superstep(1, vec![]);
    assert_eq!(p.resume(), Outcome::Sync);
    let snap = p.checkpoint(&mut tracker, vec![], false);
    assert_eq!(snap.globals, vec![1002]);
    assert_eq!(snap.output_seq, 2);

    let job2 = job_for(1, "{}", 1);
    let mut q = rt.restore(&module, job2.clone(), &snap).unwrap();
    assert_eq!(q.superstep(), 1);
    assert_eq!(q.host_state().output_seq, 2);
    q.begin_superstep(2, vec![]);
    assert_eq!(q.resume(), Outcome::Sync);
    let raw = raw_outputs(&job2.reporter.drain());
    assert_eq!(raw.len(), 1);
    assert_eq!(raw[0].0, 2, "output numbering goes on");
    assert_eq!(words(&raw[0].1), vec![1003]);
}

#[test]
fn restoring_into_a_smaller_memory_limit_fails_readably() {
    // Grows to 40 pages (2.5 MiB) in superstep 0.
    let wasm = guest(
        1,
        "",
        r#"(drop (memory.grow (i32.const 39)))
           (i32.store (i32.const 2555000) (i32.const 7))
           (i32.const 0)"#,
    );
    let rt = runtime();
    let module = rt.compile(&module_hash(&wasm), &wasm).unwrap();
    let mut p = rt.instantiate(&module, job_for(1, "{}", 4), 0).unwrap();
    assert_eq!(p.resume(), Outcome::Sync);
    let snap = p.checkpoint(&mut PageTracker::new(), vec![], false);
    assert_eq!(snap.memory.len(), 40 << 16);

    let err = rt.restore(&module, job_for(1, "{}", 2), &snap).unwrap_err();
    assert_eq!(
        err.problem,
        RestoreProblem::TooLarge {
            mib: 3,
            limit_mib: 2
        }
    );
    let err = err.to_string();
    assert!(
        err.starts_with("cannot restore pid 0 from its checkpoint of superstep 0")
            && err.contains("3 MiB, more than the job's memory limit of 2 MiB"),
        "{err}"
    );
    let restored = rt.restore(&module, job_for(1, "{}", 3), &snap).unwrap();
    let mut again = restored;
    let snap2 = again.checkpoint(&mut PageTracker::new(), vec![], false);
    assert_eq!(snap2, snap);

    // A snapshot of another program does not fit.
    let other = guest(2, "", "(i32.const 0)");
    let other = rt.compile(&module_hash(&other), &other).unwrap();
    let mut small = snap.clone();
    small.memory.truncate(1 << 16);
    let err = rt.restore(&other, job_for(1, "{}", 4), &small).unwrap_err();
    assert!(
        matches!(err.problem, RestoreProblem::Smaller { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("smaller than the program's initial memory"),
        "{err}"
    );
    let err = rt
        .restore(&module, job_for(1, "{}", 4), &Snapshot { pid: 3, ..snap })
        .unwrap_err();
    assert_eq!(err.problem, RestoreProblem::NoSuchPid(1));
    assert!(
        err.to_string().contains("the job has only 1 processes"),
        "{err}"
    );
}

#[test]
fn an_exited_snapshot_restores_an_ended_process() {
    let wasm = guest(1, "", "(i32.const 1)");
    let rt = runtime();
    let module = rt.compile(&module_hash(&wasm), &wasm).unwrap();
    let mut p = rt.instantiate(&module, job_for(1, "{}", 4), 0).unwrap();
    assert_eq!(p.resume(), Outcome::Done);
    let snap = p.checkpoint(&mut PageTracker::new(), vec![], true);
    assert!(snap.exited && snap.memory.is_empty());
    let mut q = rt.restore(&module, job_for(1, "{}", 4), &snap).unwrap();
    assert!(matches!(q.resume(), Outcome::Failed(r) if r.contains("already ended")));
}

/// Issue 20, finding 5: a process that computes for its whole superstep
/// shares its slot. With one slot, a spinning process of job 42 parks after
/// a quantum while job 7's process runs to its sync.
#[test]
fn a_spinning_process_shares_its_slot_with_another_job() {
    let slots = crate::slots::Slots::new(1);
    let block_on = |f| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    };
    let spin = guest(1, "", "(loop $l (br $l)) (i32.const 0)");
    let spinner_job = job_with(Limits {
        budget: Duration::from_secs(60),
        ..Limits::default()
    });
    let kill = spinner_job.kill.clone();
    let mut spinner = start(&spin, spinner_job, 0);
    let slot = block_on(slots.acquire(42)).unwrap();
    let spinning = std::thread::spawn(move || spinner.resume_in(slot));

    // Job 7's process gets the only slot while the spinner has it.
    let quick = guest(1, "", "(i32.const 0)");
    let mut other = start(&quick, job_for(1, "{}", 1), 0);
    let slot = block_on(slots.acquire(7)).unwrap();
    assert_eq!(other.resume_in(slot), Outcome::Sync);
    // (Had the spinner kept the slot, `acquire` above would not return
    // before its 60 s limit.)
    assert!(!spinning.is_finished(), "the spinner is still running");

    kill.store(true, Ordering::Relaxed);
    let outcome = spinning.join().unwrap();
    assert!(
        matches!(&outcome, Outcome::Failed(r) if r == "killed"),
        "{outcome:?}"
    );
    assert_eq!(slots.load(), (1, 0), "the slot came back");
}

/// Issue 20, finding 1: the peer's memory budget bounds what a guest makes
/// the peer hold, both memory it grows and messages it queues; the process
/// ends with a message that says why, and the peer is fine.
#[test]
fn the_peers_memory_budget_stops_growth_and_floods() {
    // A runtime of its own: the budget is the runtime's.
    let rt = Runtime::new().expect("engine");
    let budget = rt.budget().clone();
    budget.refresh();
    budget.set_limit(budget.resident() + (8 << 20));
    let run = |body: &str| {
        let wasm = guest(1, "", body);
        let module = rt.compile(&module_hash(&wasm), &wasm).unwrap();
        let mut p = rt.instantiate(&module, job_for(4, "{}", 256), 0).unwrap();
        p.resume()
    };
    // 64 MiB of memory: within the job's 256 MiB, beyond the budget.
    let grow = run("(drop (memory.grow (i32.const 1024))) (i32.const 0)");
    let why = failure(grow);
    assert!(
        why.starts_with("the peer is out of memory for bspweb")
            && why.contains("this process asked for 64 MiB more"),
        "{why}"
    );
    // 64 Ki messages of 256 bytes each: 32 MiB counted with their
    // overhead, within the job's outbox cap, beyond the budget.
    let flood = run(r#"(local $i i32)
           (loop $l
             (drop (call $send (i32.const 1) (i32.const 0) (i32.const 256)))
             (local.set $i (i32.add (local.get $i) (i32.const 1)))
             (br_if $l (i32.lt_u (local.get $i) (i32.const 65536))))
           (i32.const 0)"#);
    let why = failure(flood);
    assert!(
        why.starts_with("the peer is out of memory for bspweb")
            && why.contains("this process's messages of this superstep take"),
        "{why}"
    );
    // Without a budget both run.
    budget.set_limit(0);
    assert_eq!(
        run("(drop (memory.grow (i32.const 1024))) (i32.const 0)"),
        Outcome::Sync
    );
}

/// Run `superstep` as a task on a multi-threaded runtime of one worker,
/// with a slot as an inline superstep holds it.
fn on_the_only_worker(superstep: impl FnOnce(Option<crate::slots::Slot>) + Send + 'static) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let slots = crate::slots::Slots::new(1);
    rt.block_on(async move {
        tokio::spawn(async move { superstep(Some(slots.try_acquire(1).unwrap().never_park())) })
            .await
            .unwrap();
    });
}

/// A superstep that runs on an async worker thread and must wait (for the
/// upload of its output, say) waits off the worker: tasks queued on that
/// worker run meanwhile. One worker, so otherwise nothing else could run.
#[test]
fn an_inline_superstep_waits_off_the_async_worker() {
    on_the_only_worker(|slot| {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        tokio::spawn(async move { done_tx.send(()).unwrap() });
        off_async_worker(&slot, || done_rx.recv_timeout(Duration::from_secs(10)))
            .expect("the worker's other task ran while this one waited");
    });
}

/// A superstep on an async worker gives the worker up at an epoch tick
/// once it ran [`INLINE_HAND_OFF_AFTER`] (and only then); its slot may
/// then park.
#[test]
fn a_long_inline_superstep_hands_the_worker_off() {
    on_the_only_worker(|mut slot| {
        hand_off_long_inline_run(&mut slot);
        assert!(slot.as_ref().unwrap().pinned(), "too early");
        std::thread::sleep(INLINE_HAND_OFF_AFTER);
        hand_off_long_inline_run(&mut slot);
        assert!(!slot.as_ref().unwrap().pinned(), "handed off");
    });
}
