//! Bad input gets a clear error and harms nothing else.

use bsp_api::rest::{JobLimits, JobOutcome};
use serde_json::json;

use crate::examples::misbehave_hash;
use crate::harness::{job, run, shared};

async fn upload_err(wasm: Vec<u8>) -> (u16, String) {
    let client = shared().admin().await;
    match client.upload_program(wasm, Some("bad")).await {
        Ok(info) => panic!("upload was accepted: {info:?}"),
        Err(e) => (e.status().unwrap_or(0), e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_non_wasm_upload_is_refused_with_a_clear_error() {
    let (status, msg) = upload_err(b"#!/bin/sh\necho this is not wasm\n".to_vec()).await;
    assert_eq!(status, 422);
    assert!(msg.contains("not a WebAssembly module"), "{msg}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_module_importing_wasi_is_refused_naming_the_import() {
    let wasm = wat::parse_str(
        r#"(module
          (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
          (memory (export "memory") 1)
          (func (export "bspweb_resume") (result i32) i32.const 1))"#,
    )
    .unwrap();
    let (status, msg) = upload_err(wasm).await;
    assert_eq!(status, 422);
    assert!(msg.contains("wasi_snapshot_preview1.fd_write"), "{msg}");
    let wasm = wat::parse_str(
        r#"(module
          (import "env" "clock" (func (result i64)))
          (memory (export "memory") 1)
          (func (export "bspweb_resume") (result i32) i32.const 1))"#,
    )
    .unwrap();
    let (status, msg) = upload_err(wasm).await;
    assert_eq!(status, 422);
    assert!(msg.contains("env.clock"), "{msg}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_module_with_state_a_checkpoint_cannot_record_is_refused() {
    let wasm = wat::parse_str(
        r#"(module
          (memory (export "memory") 1)
          (global $__stack_pointer (mut i32) (i32.const 65536))
          (global $hidden_lanes (mut v128) (v128.const i64x2 0 0))
          (func (export "bspweb_resume") (result i32) i32.const 1))"#,
    )
    .unwrap();
    let (status, msg) = upload_err(wasm).await;
    assert_eq!(status, 422);
    assert!(msg.contains("mutable global of type v128"), "{msg}");
    assert!(msg.contains("hidden_lanes"), "{msg}");
    let wasm = wat::parse_str(
        r#"(module
          (memory (export "memory") 1)
          (data $d "abc")
          (func $forget (data.drop $d))
          (func (export "bspweb_resume") (result i32) i32.const 1))"#,
    )
    .unwrap();
    let (status, msg) = upload_err(wasm).await;
    assert_eq!(status, 422);
    assert!(
        msg.contains("`data.drop` in function 0 (`forget`)"),
        "{msg}"
    );
}

/// Run the misbehaving program in `mode` on 3 processes (only pid 1
/// misbehaves) next to a well-behaved ring job that must not notice.
async fn misbehave(mode: &str, limits: Option<JobLimits>) -> (crate::harness::Run, String) {
    let client = shared().admin().await;
    let hash = misbehave_hash(&client).await;
    let mut spec = job(&hash, 3, json!({"mode": mode, "pid": 1}));
    spec.limits = limits;
    let bystander = client.submit(&job("ring", 4, json!(null))).await.unwrap();
    let r = run(&client, spec).await;
    let ring = crate::harness::collect(&client, bystander.id).await;
    ring.assert_exited();
    let failure = r.failure();
    (r, failure)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_that_traps_fails_the_job_with_the_trap() {
    let (r, why) = misbehave("trap", None).await;
    assert_eq!(r.info.outcome, Some(JobOutcome::Failed), "{why}");
    assert_eq!(r.info.error_pid, Some(1));
    assert!(why.contains("unreachable"), "{why}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_panic_aborts_with_message_and_location() {
    let (r, why) = misbehave("panic", None).await;
    assert_eq!(r.info.outcome, Some(JobOutcome::Aborted), "{why}");
    assert!(why.contains("deliberate panic"), "{why}");
    assert!(why.contains("misbehave.rs:"), "location missing: {why}");
}

#[tokio::test(flavor = "multi_thread")]
async fn abort_and_an_error_from_main_end_the_job_with_the_reason() {
    let (r, why) = misbehave("abort", None).await;
    assert_eq!(r.info.outcome, Some(JobOutcome::Aborted));
    assert!(why.contains("deliberate abort"), "{why}");
    let (r, why) = misbehave("error", None).await;
    assert_eq!(r.info.outcome, Some(JobOutcome::Aborted));
    assert!(why.contains("deliberate error"), "{why}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_that_loops_forever_hits_the_time_limit() {
    let limits = JobLimits {
        superstep_ms: 1500,
        ..JobLimits::default()
    };
    let (r, why) = misbehave("loop", Some(limits)).await;
    assert_eq!(r.info.outcome, Some(JobOutcome::Failed), "{why}");
    assert!(why.contains("time limit"), "{why}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_that_grows_memory_past_the_cap_hits_the_memory_limit() {
    let limits = JobLimits {
        memory_mib: 48,
        ..JobLimits::default()
    };
    let (r, why) = misbehave("grow", Some(limits)).await;
    assert_eq!(r.info.outcome, Some(JobOutcome::Failed), "{why}");
    assert!(why.contains("memory limit"), "{why}");
    assert!(why.contains("48 MiB"), "{why}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_to_a_pid_that_does_not_exist_aborts_with_that_message() {
    let (r, why) = misbehave("bad-pid", None).await;
    assert_eq!(r.info.outcome, Some(JobOutcome::Aborted), "{why}");
    assert!(why.contains("cannot send to pid 8"), "{why}");
    assert!(why.contains("3 processes"), "{why}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_flood_hits_the_output_limit() {
    let limits = JobLimits {
        output_mib: 1,
        ..JobLimits::default()
    };
    let (r, why) = misbehave("flood", Some(limits)).await;
    assert_eq!(r.info.outcome, Some(JobOutcome::Failed), "{why}");
    assert!(why.contains("output limit"), "{why}");
}
