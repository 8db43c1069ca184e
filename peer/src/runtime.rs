//! The wasmtime sandbox: one [`Runtime`] (engine, linker, module cache, epoch
//! ticker) per peer, one [`Process`] (store + instance) per BSP process.
//!
//! **Architecture Invariant:** a guest reaches the host only through the
//! `bspweb_v1` imports defined here; every pointer it passes is bounds-checked,
//! every buffer the host keeps for it (outbox, output) has a cap, and every
//! limit ends the process with a readable reason instead of harming the peer.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bsp_api::control::{PeerEvent, Stream};
use bsp_api::wire::WireMessage;

use crate::budget::MemoryBudget;
use bsp_api::{JobId, Pid};
use bspweb_abi::{
    ASYNCIFY_STATE_EXPORT, ERR_BAD_PID, ERR_BAD_RANGE, ERR_NOT_FOUND, ERR_TOO_LARGE, HOST_MODULE,
    MAX_MESSAGE_BYTES, MEMORY_EXPORT, RESUME_EXPORT, STATUS_DONE, STATUS_SYNC, STATUS_YIELD,
    STREAM_STDERR, STREAM_STDOUT,
};
use bytes::Bytes;
use sha2::{Digest, Sha256};
use wasmtime::{
    Caller, Config, Engine, Extern, Global, Instance, Linker, Memory, Module, Mutability,
    ResourceLimiter, Store, StoreContextMut, Strategy, Trap, TypedFunc, UpdateDeadline, Val,
    ValType, WasmBacktrace,
};

use crate::checkpoint::{PAGE_SIZE, PageTracker, Snapshot};
use crate::report::Reporter;

/// How often the epoch ticker advances the engine's epoch.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Largest single output record (one `print` line or one `write_raw` record).
/// Larger records get [`ERR_TOO_LARGE`].
pub const MAX_OUTPUT_RECORD: usize = 1 << 20;

/// How long the guest's `flush` waits for the uploader at most.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

/// Host-side cost counted per queued message on top of its payload, so that
/// floods of empty messages hit the outbox cap and the peer's memory budget
/// too: a message's metadata lives in several host copies (the outbox and
/// the checkpoint, replicas on other peers, the receiver's inbox), about
/// 400 bytes in all for an empty one (issue 20, finding 1).
pub const MESSAGE_OVERHEAD: usize = 256;

/// Longest abort reason kept.
const MAX_ABORT_REASON: usize = 64 << 10;

/// Table elements a process may grow its tables to.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// Compiled modules kept in the cache.
const MODULE_CACHE: usize = 32;

const MIB: u64 = 1 << 20;

/// Errors of compiling a module.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("the program's bytes hash to {actual}, not to the expected {expected}")]
    HashMismatch { expected: String, actual: String },
    #[error("the program is not a valid bspweb module: {0}")]
    Invalid(#[from] bspweb_abi::InvalidModule),
    #[error("the program could not be compiled: {0}")]
    Compile(String),
}

/// Hex SHA-256 of a module's bytes: its content address.
pub fn module_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The peer's wasm engine: configured once, shared by every job.
pub struct Runtime {
    engine: Engine,
    linker: Linker<ProcState>,
    /// `(hash, compiled, bytes)`: the bytes so the peer can pass the
    /// program on to other peers of a job.
    modules: Mutex<Vec<(String, Module, Bytes)>>,
    /// One lock per program being compiled: a second compile of the same
    /// program waits for the first and takes its result from the cache.
    compiling: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Programs compiled so far (cache misses).
    compiled: std::sync::atomic::AtomicU64,
    stop_ticker: Arc<AtomicBool>,
    ticker: Mutex<Option<JoinHandle<()>>>,
    /// The peer's memory budget, which every process asks before it holds
    /// more ([`crate::budget`]).
    budget: Arc<MemoryBudget>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

impl Runtime {
    /// Build the engine (Cranelift, no relaxed SIMD, no threads, epoch
    /// interruption), the `bspweb_v1` linker, and start the epoch ticker
    /// thread, which stops when the runtime is dropped. NaNs are made
    /// deterministic by [`bspweb_abi::canonicalize_nans`], which
    /// [`Runtime::compile`] applies to every module, not by Cranelift (whose
    /// canonicalization after every floating-point instruction cost a
    /// floating-point loop 5× its native time).
    pub fn new() -> Result<Arc<Runtime>, wasmtime::Error> {
        let mut config = Config::new();
        config
            .strategy(Strategy::Cranelift)
            .cranelift_nan_canonicalization(false)
            .epoch_interruption(true)
            // The feature set of `bspweb_abi::features()`. Threads are off
            // because the `threads` crate feature of wasmtime is not enabled;
            // reference types (without GC) are on by default.
            .wasm_relaxed_simd(false)
            .wasm_simd(true)
            .wasm_bulk_memory(true)
            .wasm_multi_value(true)
            .wasm_extended_const(true)
            .wasm_multi_memory(false)
            .wasm_memory64(false)
            .wasm_tail_call(false)
            .wasm_custom_page_sizes(false)
            .wasm_wide_arithmetic(false)
            .wasm_backtrace_max_frames(NonZeroUsize::new(16));
        if std::env::var_os("BSPWEB_PERF_MAP").is_some() {
            // For profiling guests: `perf report` names their functions from
            // /tmp/perf-PID.map (docs/benchmarks.md, "Profiling").
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config)?;
        let linker = build_linker(&engine)?;
        let stop_ticker = Arc::new(AtomicBool::new(false));
        let budget = Arc::new(MemoryBudget::new(0));
        let ticker = {
            let engine = engine.clone();
            let stop = stop_ticker.clone();
            let budget = budget.clone();
            std::thread::Builder::new()
                .name("bspweb-epoch".into())
                .spawn(move || {
                    let mut tick = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                        tick = tick.wrapping_add(1);
                        if tick.is_multiple_of(crate::budget::REFRESH_TICKS) {
                            budget.refresh();
                        }
                    }
                })
                .map_err(|e| wasmtime::Error::msg(format!("cannot start the epoch ticker: {e}")))?
        };
        Ok(Arc::new(Runtime {
            engine,
            linker,
            modules: Mutex::new(Vec::new()),
            compiling: Mutex::new(HashMap::new()),
            compiled: std::sync::atomic::AtomicU64::new(0),
            stop_ticker,
            ticker: Mutex::new(Some(ticker)),
            budget,
        }))
    }

    /// The peer's memory budget (none until set).
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// How many programs this runtime compiled (each once while cached).
    pub fn compiled_count(&self) -> u64 {
        self.compiled.load(Ordering::Relaxed)
    }

    /// A compiled module from the cache.
    pub fn cached(&self, hash: &str) -> Option<Module> {
        self.cached_program(hash).map(|(m, _)| m)
    }

    /// A compiled module from the cache, with its bytes.
    pub fn cached_program(&self, hash: &str) -> Option<(Module, Bytes)> {
        let mut cache = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        let i = cache
            .iter()
            .position(|(h, _, _)| h.eq_ignore_ascii_case(hash))?;
        // Move to the back: the cache evicts from the front.
        let entry = cache.remove(i);
        let found = (entry.1.clone(), entry.2.clone());
        cache.push(entry);
        Some(found)
    }

    /// Check that `bytes` hash to `hash`, validate them against the
    /// `bspweb_v1` contract, compile them and cache the result. CPU-heavy:
    /// call it from a blocking thread. Compiles of the same program are
    /// done once: a caller that finds one under way waits for it (jobs
    /// that start while the last one's compile still runs, and a peer's
    /// download racing its copy from other peers, used to compile the same
    /// program two to four times at once, on the cores the job computes on).
    pub fn compile(&self, hash: &str, bytes: &[u8]) -> Result<Module, CompileError> {
        if let Some(m) = self.cached(hash) {
            return Ok(m);
        }
        let key = hash.to_ascii_lowercase();
        let lock = {
            let mut compiling = self.compiling.lock().unwrap_or_else(|p| p.into_inner());
            compiling.entry(key.clone()).or_default().clone()
        };
        let result = {
            let _only = lock.lock().unwrap_or_else(|p| p.into_inner());
            match self.cached(hash) {
                Some(m) => Ok(m),
                None => self.compile_uncached(hash, bytes),
            }
        };
        let mut compiling = self.compiling.lock().unwrap_or_else(|p| p.into_inner());
        // Nobody else holds it (the map's and ours): forget it.
        if Arc::strong_count(&lock) == 2 {
            compiling.remove(&key);
        }
        result
    }

    fn compile_uncached(&self, hash: &str, bytes: &[u8]) -> Result<Module, CompileError> {
        let actual = module_hash(bytes);
        if !actual.eq_ignore_ascii_case(hash) {
            return Err(CompileError::HashMismatch {
                expected: hash.to_string(),
                actual,
            });
        }
        let started = Instant::now();
        let summary = bspweb_abi::validate(bytes)?;
        // Every mutable global exported under a reserved name, so that
        // checkpoints can record and restore it (`bspweb_abi` module docs).
        let checkpointable = bspweb_abi::checkpointable(bytes, &summary)?;
        // The same NaN bits on every peer, whatever its processor.
        let deterministic = bspweb_abi::canonicalize_nans(&checkpointable)?;
        let module = Module::new(&self.engine, &deterministic)
            .map_err(|e| CompileError::Compile(format!("{e:#}")))?;
        self.compiled.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            program = hash,
            kib = bytes.len() >> 10,
            ms = started.elapsed().as_millis() as u64,
            "compiled the program"
        );
        let mut cache = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if !cache.iter().any(|(h, _, _)| h.eq_ignore_ascii_case(hash)) {
            if cache.len() >= MODULE_CACHE {
                cache.remove(0);
            }
            cache.push((actual, module.clone(), Bytes::copy_from_slice(bytes)));
        }
        Ok(module)
    }

    /// Create process `pid` of a job: a fresh store with the job's limits and
    /// an instance of `module`. The error is a readable reason.
    pub fn instantiate(
        &self,
        module: &Module,
        job: Arc<JobInfo>,
        pid: Pid,
    ) -> Result<Process, String> {
        let state = ProcState::new(job, pid, self.budget.clone());
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| s);
        store.epoch_deadline_callback(on_epoch);
        store.set_epoch_deadline(1);
        let instance = match self.linker.instantiate(&mut store, module) {
            Ok(i) => i,
            Err(e) => {
                return Err(match store.data_mut().stop.take() {
                    Some(stop) => stop.to_string(),
                    None => format!("the process could not be started: {e:#}"),
                });
            }
        };
        let memory = instance
            .get_memory(&mut store, MEMORY_EXPORT)
            .ok_or_else(|| {
                format!("the module does not export a memory named `{MEMORY_EXPORT}`")
            })?;
        let resume = instance
            .get_typed_func::<(), i32>(&mut store, RESUME_EXPORT)
            .map_err(|e| format!("the module's `{RESUME_EXPORT}` export is unusable: {e:#}"))?;
        let asyncify_state = match instance.get_export(&mut store, ASYNCIFY_STATE_EXPORT) {
            None => None,
            Some(_) => Some(
                instance
                    .get_typed_func::<(), i32>(&mut store, ASYNCIFY_STATE_EXPORT)
                    .map_err(|e| {
                        format!("the module's `{ASYNCIFY_STATE_EXPORT}` export is unusable: {e:#}")
                    })?,
            ),
        };
        store.data_mut().memory = Some(memory);
        let globals = checkpointed_globals(&instance, &mut store);
        Ok(Process {
            store,
            resume,
            asyncify_state,
            globals,
            ended: false,
            writes: None,
            writes_tried: false,
        })
    }

    /// Re-create a process from `snapshot` (docs/fault-tolerance.md,
    /// "Failure and restore"): a fresh instance of `module` whose memory,
    /// mutable globals and host state (superstep, output counters) are the
    /// snapshot's. Then `begin_superstep(snapshot.superstep + 1, inbox)` and
    /// `resume` go on exactly as the original would have. A snapshot of an
    /// exited process gives a process that has ended.
    ///
    /// Memory and mutable globals are the whole state of an instance between
    /// two resumes: the validator refuses anything that changes tables or
    /// segments (`bspweb_abi` module docs).
    pub fn restore(
        &self,
        module: &Module,
        job: Arc<JobInfo>,
        snapshot: &Snapshot,
    ) -> Result<Process, String> {
        let (pid, step) = (snapshot.pid, snapshot.superstep);
        let what = || format!("cannot restore pid {pid} from its checkpoint of superstep {step}");
        if pid >= job.nprocs {
            return Err(format!(
                "{}: the job has only {} processes",
                what(),
                job.nprocs
            ));
        }
        let limit = job.memory_limit;
        if snapshot.memory.len() > limit {
            return Err(format!(
                "{}: its memory is {} MiB, more than the job's memory limit of {} MiB on this peer",
                what(),
                (snapshot.memory.len() as u64).div_ceil(MIB),
                limit as u64 / MIB
            ));
        }
        if !snapshot.memory.len().is_multiple_of(PAGE_SIZE) {
            return Err(format!(
                "{}: its memory of {} bytes is not a whole number of 64 KiB pages",
                what(),
                snapshot.memory.len()
            ));
        }
        let mut process = self
            .instantiate(module, job, pid)
            .map_err(|e| format!("{}: {e}", what()))?;
        let st = &mut process.store;
        if snapshot.exited {
            process.ended = true;
        } else {
            let memory = st.data().memory.ok_or_else(what)?;
            let have = memory.data_size(&*st);
            let want = snapshot.memory.len();
            if want < have {
                return Err(format!(
                    "{}: its memory of {want} bytes is smaller than the program's initial memory of {have} bytes; is it a checkpoint of another program?",
                    what()
                ));
            }
            if want > have {
                let pages = ((want - have) / PAGE_SIZE) as u64;
                if let Err(e) = memory.grow(&mut *st, pages) {
                    let reason = match st.data_mut().stop.take() {
                        Some(stop) => stop.to_string(),
                        None => format!("{e:#}"),
                    };
                    return Err(format!("{}: {reason}", what()));
                }
            }
            memory.data_mut(&mut *st).copy_from_slice(&snapshot.memory);
            if snapshot.globals.len() != process.globals.len() {
                return Err(format!(
                    "{}: it has {} globals, the program has {} mutable globals; is it a checkpoint of another program?",
                    what(),
                    snapshot.globals.len(),
                    process.globals.len()
                ));
            }
            for (g, &bits) in process.globals.iter().zip(&snapshot.globals) {
                let ty = g.ty(&*st);
                let val = val_from_bits(ty.content(), bits)
                    .ok_or_else(|| format!("{}: a global has an unsupported type", what()))?;
                g.set(&mut *st, val)
                    .map_err(|e| format!("{}: cannot set a global: {e:#}", what()))?;
            }
        }
        let s = st.data_mut();
        s.host.superstep = step;
        s.host.output_seq = snapshot.output_seq;
        s.host.output_bytes = snapshot.output_bytes;
        Ok(process)
    }
}

/// The mutable globals of an instance of a module made
/// [`bspweb_abi::checkpointable`], in index order (the order of their
/// reserved exports): what a checkpoint records besides memory. The
/// validator let through only types that fit in 64 bits.
fn checkpointed_globals(instance: &Instance, store: &mut Store<ProcState>) -> Vec<Global> {
    let exports: Vec<(bool, Extern)> = instance
        .exports(&mut *store)
        .map(|e| {
            let reserved = e.name().starts_with(bspweb_abi::GLOBAL_EXPORT_PREFIX);
            (reserved, e.into_extern())
        })
        .collect();
    exports
        .into_iter()
        .filter(|(reserved, _)| *reserved)
        .filter_map(|(_, e)| e.into_global())
        .filter(|g| g.ty(&*store).mutability() == Mutability::Var)
        .collect()
}

/// The raw bits of a numeric value.
fn val_bits(v: &Val) -> u64 {
    match *v {
        Val::I32(x) => x as u32 as u64,
        Val::I64(x) => x as u64,
        Val::F32(x) => u64::from(x),
        Val::F64(x) => x,
        _ => 0,
    }
}

/// A value of type `ty` from raw bits.
fn val_from_bits(ty: &ValType, bits: u64) -> Option<Val> {
    Some(match ty {
        ValType::I32 => Val::I32(bits as u32 as i32),
        ValType::I64 => Val::I64(bits as i64),
        ValType::F32 => Val::F32(bits as u32),
        ValType::F64 => Val::F64(bits),
        _ => return None,
    })
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::Relaxed);
        let handle = self.ticker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// What every process of one job on this peer shares.
#[derive(Debug)]
pub struct JobInfo {
    /// The job's id.
    pub job: JobId,
    /// Number of processes of the whole job.
    pub nprocs: u32,
    /// The job's seed.
    pub seed: u64,
    /// The arguments as JSON text.
    pub args: Vec<u8>,
    /// Named resources, decoded.
    pub resources: HashMap<String, Vec<u8>>,
    /// Linear-memory cap per process, bytes.
    pub memory_limit: usize,
    /// Running time one process may spend in one superstep.
    pub superstep_budget: Duration,
    /// Total output per process, bytes.
    pub output_limit: u64,
    /// Bytes of messages one process may queue per superstep.
    pub outbox_limit: usize,
    /// Set to stop every process of the job at its next epoch check.
    pub kill: Arc<AtomicBool>,
    /// Where output records go.
    pub reporter: Reporter,
}

/// One message delivered to a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The sender.
    pub src: Pid,
    /// The superstep in which it was sent.
    pub superstep: u32,
    /// The tag it was sent with (0: none).
    pub tag: u32,
    /// The bytes sent.
    pub payload: Bytes,
}

/// One message a process sent this superstep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The destination.
    pub dst: Pid,
    /// Position among everything the process sent this superstep.
    pub seq: u32,
    /// The tag it was sent with (0: none).
    pub tag: u32,
    /// The bytes sent.
    pub payload: Bytes,
}

/// The host-side state of a process that belongs with its memory in a
/// checkpoint: restore this plus linear memory and the process goes on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostState {
    /// The process's id.
    pub pid: Pid,
    /// The current superstep.
    pub superstep: u32,
    /// Messages readable in this superstep, sorted by (source, send order).
    pub inbox: Vec<Message>,
    /// Sequence number of the next output record.
    pub output_seq: u64,
    /// Output bytes written so far.
    pub output_bytes: u64,
}

/// Why the host stopped a process.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Stop {
    #[error("killed")]
    Killed,
    #[error(
        "time limit exceeded: superstep {superstep} ran longer than {secs} s; sync more often, or submit with a larger --superstep-secs (peers allow up to their --max-superstep-secs, 3600 s by default)"
    )]
    TimeLimit { superstep: u32, secs: f64 },
    #[error(
        "memory limit exceeded: the process tried to grow its memory to {wanted_mib} MiB; the limit is {limit_mib} MiB"
    )]
    MemoryLimit { wanted_mib: u64, limit_mib: u64 },
    #[error(
        "table limit exceeded: the process tried to grow a table to {wanted} elements; the limit is {limit}"
    )]
    TableLimit { wanted: usize, limit: usize },
    #[error(
        "output limit exceeded: the process wrote more than {limit_mib} MiB of output (stdout, stderr and raw data); raise the job's `output_mib` limit or write less"
    )]
    OutputLimit { limit_mib: u64 },
    #[error(
        "message limit exceeded: the process queued more than {limit_mib} MiB of messages in superstep {superstep}; send less per superstep"
    )]
    OutboxLimit { superstep: u32, limit_mib: u64 },
    #[error("bad host call: {0}")]
    BadHostCall(String),
    /// The peer's memory budget would be exceeded ([`MemoryBudget::refusal`]).
    #[error("{0}")]
    PeerMemory(String),
    /// The program ended itself.
    #[error("{0}")]
    Abort(String),
}

/// The result of one [`Process::resume`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Reached `sync`: the superstep is over for this process.
    Sync,
    /// `main` returned.
    Done,
    /// A `may_migrate` point: resume again to go on.
    Yield,
    /// The program aborted itself with this reason.
    Aborted(String),
    /// The runtime ended the process for this reason.
    Failed(String),
}

/// The store data of a process.
pub struct ProcState {
    host: HostState,
    job: Arc<JobInfo>,
    memory: Option<Memory>,
    outbox: Vec<Outgoing>,
    outbox_bytes: usize,
    send_seq: u32,
    /// The tag of the messages sent from now on (`set_tag`); 0 at the
    /// start of every superstep.
    send_tag: u32,
    /// Running time spent in the current superstep.
    used: Duration,
    /// The peer's memory budget.
    budget: Arc<MemoryBudget>,
    /// The peer slot this process runs in during a `resume`, shared with
    /// other jobs' processes at epoch ticks ([`crate::slots`]).
    slot: Option<crate::slots::Slot>,
    /// Time spent parked, waiting for the slot, in the current `resume`.
    parked: Duration,
    /// When the current `resume` must stop.
    deadline: Instant,
    /// Why the host is trapping the process, if it is.
    stop: Option<Stop>,
    /// The [`Reporter`] mark of the last output record this process emitted
    /// (0: none): a checkpoint taken now is safe to replicate once the
    /// reporter has delivered up to it (docs/fault-tolerance.md, "Output
    /// first"). Not part of the checkpointed state.
    output_mark: u64,
}

impl ProcState {
    fn new(job: Arc<JobInfo>, pid: Pid, budget: Arc<MemoryBudget>) -> Self {
        // Instantiation may run wasm (constant expressions of globals and
        // segments) and so meet an epoch check: it gets a superstep's budget
        // too, not a deadline already past.
        let deadline = Instant::now() + job.superstep_budget;
        ProcState {
            host: HostState {
                pid,
                ..HostState::default()
            },
            job,
            memory: None,
            outbox: Vec::new(),
            outbox_bytes: 0,
            send_seq: 0,
            send_tag: 0,
            used: Duration::ZERO,
            budget,
            slot: None,
            parked: Duration::ZERO,
            deadline,
            stop: None,
            output_mark: 0,
        }
    }

    /// Remember why the process stops and build the trap error.
    fn stop_with(&mut self, stop: Stop) -> wasmtime::Error {
        self.stop = Some(stop.clone());
        wasmtime::Error::new(stop)
    }
}

impl ResourceLimiter for ProcState {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.job.memory_limit {
            return Err(self.stop_with(Stop::MemoryLimit {
                wanted_mib: (desired as u64).div_ceil(MIB),
                limit_mib: self.job.memory_limit as u64 / MIB,
            }));
        }
        let more = desired.saturating_sub(current) as u64;
        if !self.budget.fits(more) {
            let why = self.budget.refusal("this process asked for", more);
            return Err(self.stop_with(Stop::PeerMemory(why)));
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        // The OS refused memory below the cap: end the process rather than
        // let `memory.grow` return -1 on one peer and succeed on another.
        Err(self.stop_with(Stop::BadHostCall(format!(
            "the peer could not provide more memory: {error}"
        ))))
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Err(self.stop_with(Stop::TableLimit {
                wanted: desired,
                limit: MAX_TABLE_ELEMENTS,
            }));
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        4
    }

    fn memories(&self) -> usize {
        1
    }
}

/// A running BSP process: its store and instance.
pub struct Process {
    store: Store<ProcState>,
    resume: TypedFunc<(), i32>,
    /// Asyncify's state (C guests): checked to be at rest (0) after every
    /// resume, so a checkpoint never records a half-unwound stack.
    asyncify_state: Option<TypedFunc<(), i32>>,
    /// Mutable globals, checkpointed with memory.
    globals: Vec<Global>,
    ended: bool,
    /// The kernel's record of the pages written since the last capture
    /// (`dirty`), where the system offers it; set up at the first capture
    /// (a descriptor per process that checkpoints, none for others).
    writes: Option<crate::dirty::Tracking>,
    writes_tried: bool,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("pid", &self.store.data().host.pid)
            .field("superstep", &self.store.data().host.superstep)
            .field("ended", &self.ended)
            .finish()
    }
}

impl Process {
    /// This process's id.
    pub fn pid(&self) -> Pid {
        self.store.data().host.pid
    }

    /// The current superstep.
    pub fn superstep(&self) -> u32 {
        self.store.data().host.superstep
    }

    /// The reporter mark of the last output record this process emitted
    /// (0: none since it was instantiated or restored).
    pub fn output_mark(&self) -> u64 {
        self.store.data().output_mark
    }

    /// The checkpointable host state.
    pub fn host_state(&self) -> &HostState {
        &self.store.data().host
    }

    /// Snapshot this process at the end of superstep [`Process::superstep`]
    /// through `tracker`: memory (copied once, in the same pass as change
    /// detection; nothing when `exited`), mutable globals, output
    /// counters, `exited` and `outbox` (the messages sent in the superstep,
    /// from [`Process::take_outbox`]). The snapshot's hash is set.
    ///
    /// Call it only after [`Process::resume`] returned [`Outcome::Sync`] or
    /// [`Outcome::Done`] (no wasm frame is live then, so the stack pointer
    /// is at its initial value and memory plus globals is the whole state),
    /// and before [`Process::begin_superstep`] of the next superstep.
    pub fn checkpoint(
        &mut self,
        tracker: &mut PageTracker,
        outbox: Vec<WireMessage>,
        exited: bool,
    ) -> Snapshot {
        self.checkpoint_into(tracker, outbox, exited, None)
    }

    /// [`Process::checkpoint`] that recycles `previous`, a recent snapshot
    /// `tracker` took (unmodified), copying only the pages that changed
    /// ([`PageTracker::capture_reusing`]). Use it when the previous snapshot
    /// is no longer needed (its replicas acknowledged it).
    pub fn checkpoint_reusing(
        &mut self,
        tracker: &mut PageTracker,
        outbox: Vec<WireMessage>,
        exited: bool,
        previous: Snapshot,
    ) -> Snapshot {
        self.checkpoint_into(tracker, outbox, exited, Some(previous))
    }

    fn checkpoint_into(
        &mut self,
        tracker: &mut PageTracker,
        outbox: Vec<WireMessage>,
        exited: bool,
        previous: Option<Snapshot>,
    ) -> Snapshot {
        let globals: Vec<u64> = self
            .globals
            .iter()
            .map(|g| val_bits(&g.get(&mut self.store)))
            .collect();
        let host = &self.store.data().host;
        let head = Snapshot {
            pid: host.pid,
            superstep: host.superstep,
            memory: Vec::new(),
            globals,
            output_seq: host.output_seq,
            output_bytes: host.output_bytes,
            exited,
            outbox,
            hash: [0; 32],
        };
        let memory: &[u8] = match self.store.data().memory {
            Some(m) => m.data(&self.store),
            None => &[],
        };
        if !self.writes_tried {
            self.writes_tried = true;
            self.writes = crate::dirty::Tracking::new();
        }
        // The pages the kernel saw written since the last capture (hot pages
        // always); with no answer, every page is read.
        let may = match self.writes.as_mut() {
            Some(w) if !exited => {
                let may = w.may_have_changed(memory, tracker.last_capture());
                if may.is_none() {
                    self.writes = None;
                }
                may
            }
            _ => None,
        };
        let snapshot =
            tracker.capture_tracked(head, memory, previous, may.as_deref().unwrap_or(&[]));
        if let Some(w) = self.writes.as_mut().filter(|_| may.is_some()) {
            let at = tracker.last_capture();
            if !w.after_capture(memory, at, |i| tracker.changed_at_last_capture(i)) {
                tracing::debug!("write tracking failed; every page is hashed from now on");
                self.writes = None;
            }
        }
        snapshot
    }

    /// A copy of linear memory (tests compare captures with it).
    #[cfg(test)]
    pub(crate) fn memory_bytes(&self) -> Vec<u8> {
        match self.store.data().memory {
            Some(m) => m.data(&self.store).to_vec(),
            None => Vec::new(),
        }
    }

    /// 64 KiB pages of memory write-protected as cold; `None`: no tracking.
    #[cfg(test)]
    pub(crate) fn cold_pages(&self) -> Option<usize> {
        self.writes.as_ref().map(crate::dirty::Tracking::cold_pages)
    }

    /// Take the messages sent since the last call.
    pub fn take_outbox(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.store.data_mut().outbox)
    }

    /// Enter superstep `superstep` with these messages (already sorted by
    /// source and send order): resets the superstep's time and message budget.
    pub fn begin_superstep(&mut self, superstep: u32, inbox: Vec<Message>) {
        let s = self.store.data_mut();
        s.host.superstep = superstep;
        s.host.inbox = inbox;
        s.outbox.clear();
        s.outbox_bytes = 0;
        s.send_seq = 0;
        s.send_tag = 0;
        s.used = Duration::ZERO;
    }

    /// [`Process::resume`] in `slot`, which it shares with other jobs'
    /// processes while it runs ([`crate::slots`]) and gives back at the end.
    pub fn resume_in(&mut self, slot: crate::slots::Slot) -> Outcome {
        self.store.data_mut().slot = Some(slot);
        let outcome = self.resume();
        self.store.data_mut().slot = None;
        outcome
    }

    /// Run the program until it syncs, returns, yields or is stopped.
    /// Blocks the calling thread: call it from a blocking thread.
    pub fn resume(&mut self) -> Outcome {
        if self.ended {
            return Outcome::Failed("the process has already ended".into());
        }
        set_thread_niceness_once();
        let job = self.store.data().job.clone();
        if job.kill.load(Ordering::Relaxed) {
            self.ended = true;
            return Outcome::Failed(Stop::Killed.to_string());
        }
        let start = Instant::now();
        {
            let s = self.store.data_mut();
            s.deadline = start + job.superstep_budget.saturating_sub(s.used);
            s.stop = None;
            s.parked = Duration::ZERO;
        }
        self.store.set_epoch_deadline(1);
        let result = self.resume.call(&mut self.store, ());
        let s = self.store.data_mut();
        s.used += start.elapsed().saturating_sub(s.parked);
        let outcome = match result {
            Ok(STATUS_SYNC) => Outcome::Sync,
            Ok(STATUS_DONE) => Outcome::Done,
            Ok(STATUS_YIELD) => Outcome::Yield,
            Ok(other) => Outcome::Failed(format!(
                "`{RESUME_EXPORT}` returned the unknown status {other}; expected {STATUS_SYNC} (sync), {STATUS_DONE} (done) or {STATUS_YIELD} (yield)"
            )),
            Err(e) => classify(self.store.data_mut().stop.take(), &e),
        };
        let outcome = match (&outcome, &self.asyncify_state) {
            (Outcome::Sync | Outcome::Yield | Outcome::Done, Some(state)) => {
                match state.call(&mut self.store, ()) {
                    Ok(0) => outcome,
                    Ok(n) => Outcome::Failed(format!(
                        "`{RESUME_EXPORT}` returned while Asyncify was {} (state {n}); the C runtime must stop unwinding before it returns to the host",
                        if n == 1 { "unwinding" } else { "rewinding" }
                    )),
                    Err(e) => Outcome::Failed(format!(
                        "`{ASYNCIFY_STATE_EXPORT}` failed after a resume: {e}"
                    )),
                }
            }
            _ => outcome,
        };
        if !matches!(outcome, Outcome::Sync | Outcome::Yield) {
            self.ended = true;
        }
        outcome
    }
}

/// Turn a failed call into an outcome with a readable reason.
fn classify(stop: Option<Stop>, e: &wasmtime::Error) -> Outcome {
    let stop = stop.or_else(|| e.downcast_ref::<Stop>().cloned());
    match stop {
        Some(Stop::Abort(reason)) => Outcome::Aborted(reason),
        Some(stop) => Outcome::Failed(stop.to_string()),
        None => {
            let frames = e
                .downcast_ref::<WasmBacktrace>()
                .map(describe_backtrace)
                .unwrap_or_default();
            match e.downcast_ref::<Trap>() {
                Some(trap) => {
                    let text = trap.to_string();
                    let text = text.strip_prefix("wasm trap: ").unwrap_or(&text);
                    Outcome::Failed(format!("the process trapped: {text}{frames}"))
                }
                None => Outcome::Failed(format!("the process failed: {e}{frames}")),
            }
        }
    }
}

fn describe_backtrace(bt: &WasmBacktrace) -> String {
    let frames: Vec<String> = bt
        .frames()
        .iter()
        .take(8)
        .map(|f| match f.func_name() {
            Some(name) => demangle(name),
            None => format!("function #{}", f.func_index()),
        })
        .collect();
    if frames.is_empty() {
        String::new()
    } else {
        format!(" (in {})", frames.join(" <- "))
    }
}

/// Readable form of a Rust (legacy-mangled) symbol such as
/// `_ZN6bspweb2rt6resume17h0123456789abcdefE` → `bspweb::rt::resume`; other
/// names are returned unchanged.
fn demangle(name: &str) -> String {
    let Some(mut rest) = name.strip_prefix("_ZN").and_then(|r| r.strip_suffix('E')) else {
        return name.to_string();
    };
    let mut parts = Vec::new();
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let Ok(len) = rest[..digits].parse::<usize>() else {
            return name.to_string();
        };
        let Some(part) = rest.get(digits..digits + len) else {
            return name.to_string();
        };
        // A segment that starts with `$` is mangled with a leading `_`.
        parts.push(part.strip_prefix("_$").map_or(part, |_| &part[1..]));
        rest = &rest[digits + len..];
    }
    if let Some(last) = parts.last()
        && last.len() == 17
        && last.starts_with('h')
        && last[1..].bytes().all(|b| b.is_ascii_hexdigit())
    {
        parts.pop();
    }
    let mut out = parts.join("::");
    for (from, to) in [
        ("$LT$", "<"),
        ("$GT$", ">"),
        ("$RF$", "&"),
        ("$BP$", "*"),
        ("$C$", ","),
        ("$LP$", "("),
        ("$RP$", ")"),
        ("$SP$", "@"),
        ("$u20$", " "),
        ("$u27$", "'"),
        ("$u5b$", "["),
        ("$u5d$", "]"),
        ("$u7b$", "{"),
        ("$u7d$", "}"),
        ("$u7e$", "~"),
        ("..", "::"),
    ] {
        out = out.replace(from, to);
    }
    out
}

fn on_epoch(mut ctx: StoreContextMut<'_, ProcState>) -> wasmtime::Result<UpdateDeadline> {
    let s = ctx.data_mut();
    if s.job.kill.load(Ordering::Relaxed) {
        return Err(s.stop_with(Stop::Killed));
    }
    if let Some(slot) = s.slot.as_mut() {
        // Time parked while other jobs ran is not this superstep's time.
        let parked = slot.share();
        if !parked.is_zero() {
            s.deadline += parked;
            s.parked += parked;
            if s.job.kill.load(Ordering::Relaxed) {
                return Err(s.stop_with(Stop::Killed));
            }
        }
    }
    if Instant::now() >= s.deadline {
        let stop = Stop::TimeLimit {
            superstep: s.host.superstep,
            secs: s.job.superstep_budget.as_secs_f64(),
        };
        return Err(s.stop_with(stop));
    }
    Ok(UpdateDeadline::Continue(1))
}

// ---- niceness -------------------------------------------------------------

thread_local! {
    static NICED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

static NICENESS: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
static NICE_WARNED: AtomicBool = AtomicBool::new(false);

/// Set the niceness that threads running guest code take (see
/// [`set_thread_niceness`]). 0 leaves threads alone.
pub fn set_guest_niceness(nice: i32) {
    NICENESS.store(nice, Ordering::Relaxed);
}

/// The niceness set with [`set_guest_niceness`].
pub fn guest_niceness() -> i32 {
    NICENESS.load(Ordering::Relaxed)
}

fn set_thread_niceness_once() {
    let nice = NICENESS.load(Ordering::Relaxed);
    if nice == 0 || NICED.with(|n| n.get()) {
        return;
    }
    NICED.with(|n| n.set(true));
    if let Err(e) = set_thread_niceness(nice)
        && !NICE_WARNED.swap(true, Ordering::Relaxed)
    {
        tracing::warn!("could not lower the priority of the threads running programs: {e}");
    }
}

/// Give the calling thread OS niceness `nice` (Linux: niceness is per thread,
/// and threads it creates inherit it).
#[cfg(unix)]
pub fn set_thread_niceness(nice: i32) -> std::io::Result<()> {
    // SAFETY: setpriority only reads its integer arguments; `who = 0` names the
    // calling thread. It has no memory-safety preconditions.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS as _, 0, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Off Unix, niceness is not supported: the caller warns once.
#[cfg(not(unix))]
pub fn set_thread_niceness(_nice: i32) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "thread priorities are set on Unix systems only",
    ))
}

// ---- host functions ---------------------------------------------------------

fn build_linker(engine: &Engine) -> wasmtime::Result<Linker<ProcState>> {
    let mut l = Linker::new(engine);
    let m = HOST_MODULE;
    l.func_wrap(m, "pid", |c: Caller<'_, ProcState>| {
        c.data().host.pid as i32
    })?;
    l.func_wrap(m, "nprocs", |c: Caller<'_, ProcState>| {
        c.data().job.nprocs as i32
    })?;
    l.func_wrap(m, "superstep", |c: Caller<'_, ProcState>| {
        c.data().host.superstep as i32
    })?;
    l.func_wrap(m, "seed", |c: Caller<'_, ProcState>| {
        c.data().job.seed as i64
    })?;
    l.func_wrap(m, "args_len", |c: Caller<'_, ProcState>| {
        c.data().job.args.len() as i32
    })?;
    l.func_wrap(m, "args_read", host_args_read)?;
    l.func_wrap(m, "send", host_send)?;
    l.func_wrap(m, "send_range", host_send_range)?;
    l.func_wrap(m, "send_list", host_send_list)?;
    l.func_wrap(m, "msg_count", |c: Caller<'_, ProcState>| {
        c.data().host.inbox.len() as i32
    })?;
    l.func_wrap(m, "msg_info", host_msg_info)?;
    l.func_wrap(m, "msg_read", host_msg_read)?;
    l.func_wrap(m, "set_tag", |mut c: Caller<'_, ProcState>, tag: i32| {
        c.data_mut().send_tag = tag as u32;
    })?;
    l.func_wrap(
        m,
        "msg_tag",
        |c: Caller<'_, ProcState>, index: i32| -> i64 {
            let inbox = &c.data().host.inbox;
            match usize::try_from(index).ok().and_then(|i| inbox.get(i)) {
                Some(m) => i64::from(m.tag),
                None => i64::from(ERR_NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(m, "print", host_print)?;
    l.func_wrap(m, "write_raw", host_write_raw)?;
    l.func_wrap(m, "flush", host_flush)?;
    l.func_wrap(m, "abort", host_abort)?;
    l.func_wrap(m, "resource_len", host_resource_len)?;
    l.func_wrap(m, "resource_read", host_resource_read)?;
    Ok(l)
}

type HostResult<T> = wasmtime::Result<T>;

fn bad_call(c: &mut Caller<'_, ProcState>, msg: String) -> wasmtime::Error {
    c.data_mut().stop_with(Stop::BadHostCall(msg))
}

fn guest_memory(c: &mut Caller<'_, ProcState>, call: &str) -> HostResult<Memory> {
    match c.data().memory {
        Some(m) => Ok(m),
        None => Err(bad_call(
            c,
            format!("`{call}` was called before the module's memory was available"),
        )),
    }
}

/// The byte range `ptr..ptr+len` if it lies inside a memory of `mem_len` bytes.
fn guest_range(mem_len: usize, ptr: i32, len: usize) -> Option<Range<usize>> {
    let start = ptr as u32 as usize;
    let end = start.checked_add(len)?;
    (end <= mem_len).then_some(start..end)
}

fn out_of_bounds(call: &str, what: &str, ptr: i32, len: usize, mem_len: usize) -> String {
    format!(
        "`{call}` {what} {len} bytes at address {:#x}, outside the process's {mem_len}-byte memory",
        ptr as u32
    )
}

/// Copy `len` bytes out of guest memory, trapping on an out-of-range pointer.
fn read_guest(
    c: &mut Caller<'_, ProcState>,
    call: &str,
    ptr: i32,
    len: usize,
) -> HostResult<Vec<u8>> {
    let mem = guest_memory(c, call)?;
    let data = mem.data(&*c);
    match guest_range(data.len(), ptr, len) {
        Some(r) => Ok(data[r].to_vec()),
        None => {
            let msg = out_of_bounds(call, "read", ptr, len, data.len());
            Err(bad_call(c, msg))
        }
    }
}

/// Copy `bytes` into guest memory at `ptr`, trapping on an out-of-range pointer.
fn write_guest(
    c: &mut Caller<'_, ProcState>,
    call: &str,
    ptr: i32,
    bytes: &[u8],
) -> HostResult<()> {
    let mem = guest_memory(c, call)?;
    let data = mem.data_mut(&mut *c);
    match guest_range(data.len(), ptr, bytes.len()) {
        Some(r) => {
            data[r].copy_from_slice(bytes);
            Ok(())
        }
        None => {
            let msg = out_of_bounds(call, "wrote", ptr, bytes.len(), data.len());
            Err(bad_call(c, msg))
        }
    }
}

fn host_args_read(mut c: Caller<'_, ProcState>, dst: i32) -> HostResult<()> {
    let job = c.data().job.clone();
    write_guest(&mut c, "args_read", dst, &job.args)
}

/// Queue `payload` for every pid of `dsts` (already validated).
fn queue_messages(
    c: &mut Caller<'_, ProcState>,
    dsts: impl ExactSizeIterator<Item = Pid>,
    payload: Bytes,
) -> HostResult<()> {
    let s = c.data_mut();
    // The destinations share one copy of the payload (here, on the wire and
    // in checkpoints), so it counts once.
    let cost = dsts
        .len()
        .saturating_mul(MESSAGE_OVERHEAD)
        .saturating_add(payload.len());
    if s.outbox_bytes.saturating_add(cost) > s.job.outbox_limit {
        let stop = Stop::OutboxLimit {
            superstep: s.host.superstep,
            limit_mib: s.job.outbox_limit as u64 / MIB,
        };
        return Err(s.stop_with(stop));
    }
    // The resident size is read every few ticks: count what this process
    // queued in this superstep on top of it.
    let queued = s.outbox_bytes.saturating_add(cost) as u64;
    if !s.budget.fits(queued) {
        let why = s
            .budget
            .refusal("this process's messages of this superstep take", queued);
        return Err(s.stop_with(Stop::PeerMemory(why)));
    }
    s.outbox_bytes += cost;
    for dst in dsts {
        let seq = s.send_seq;
        s.send_seq = s.send_seq.wrapping_add(1);
        s.outbox.push(Outgoing {
            dst,
            seq,
            tag: s.send_tag,
            payload: payload.clone(),
        });
    }
    Ok(())
}

fn host_send(mut c: Caller<'_, ProcState>, pid: i32, ptr: i32, len: i32) -> HostResult<i32> {
    let len = len as u32 as usize;
    if len > MAX_MESSAGE_BYTES {
        return Ok(ERR_TOO_LARGE);
    }
    let payload = read_guest(&mut c, "send", ptr, len)?;
    if pid < 0 || pid as u32 >= c.data().job.nprocs {
        return Ok(ERR_BAD_PID);
    }
    queue_messages(&mut c, std::iter::once(pid as u32), Bytes::from(payload))?;
    Ok(0)
}

fn host_send_range(
    mut c: Caller<'_, ProcState>,
    lo: i32,
    hi: i32,
    ptr: i32,
    len: i32,
) -> HostResult<i32> {
    let len = len as u32 as usize;
    if len > MAX_MESSAGE_BYTES {
        return Ok(ERR_TOO_LARGE);
    }
    let payload = read_guest(&mut c, "send_range", ptr, len)?;
    let nprocs = c.data().job.nprocs as i64;
    let (lo, hi) = (lo as i64, hi as i64);
    if lo < 0 || hi > nprocs || lo >= hi {
        return Ok(ERR_BAD_RANGE);
    }
    queue_messages(&mut c, (lo as u32)..(hi as u32), Bytes::from(payload))?;
    Ok(0)
}

fn host_send_list(
    mut c: Caller<'_, ProcState>,
    pids_ptr: i32,
    npids: i32,
    ptr: i32,
    len: i32,
) -> HostResult<i32> {
    let len = len as u32 as usize;
    if len > MAX_MESSAGE_BYTES {
        return Ok(ERR_TOO_LARGE);
    }
    let npids = npids as u32 as usize;
    let list_bytes = match npids.checked_mul(4) {
        Some(n) => n,
        None => {
            let msg = format!("`send_list` got an impossible pid count {npids}");
            return Err(bad_call(&mut c, msg));
        }
    };
    let raw = read_guest(&mut c, "send_list", pids_ptr, list_bytes)?;
    let payload = read_guest(&mut c, "send_list", ptr, len)?;
    let nprocs = c.data().job.nprocs;
    let pids: Vec<Pid> = raw
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if pids.iter().any(|&p| p >= nprocs) {
        return Ok(ERR_BAD_PID);
    }
    queue_messages(&mut c, pids.into_iter(), Bytes::from(payload))?;
    Ok(0)
}

fn host_msg_info(mut c: Caller<'_, ProcState>, index: i32, out: i32) -> HostResult<i32> {
    let info = {
        let inbox = &c.data().host.inbox;
        match usize::try_from(index).ok().and_then(|i| inbox.get(i)) {
            Some(m) => {
                let mut b = [0u8; 12];
                b[0..4].copy_from_slice(&m.src.to_le_bytes());
                b[4..8].copy_from_slice(&m.superstep.to_le_bytes());
                b[8..12].copy_from_slice(&(m.payload.len() as u32).to_le_bytes());
                b
            }
            None => return Ok(ERR_NOT_FOUND),
        }
    };
    write_guest(&mut c, "msg_info", out, &info)?;
    Ok(0)
}

fn host_msg_read(mut c: Caller<'_, ProcState>, index: i32, dst: i32) -> HostResult<i32> {
    let payload = {
        let inbox = &c.data().host.inbox;
        match usize::try_from(index).ok().and_then(|i| inbox.get(i)) {
            Some(m) => m.payload.clone(),
            None => return Ok(ERR_NOT_FOUND),
        }
    };
    write_guest(&mut c, "msg_read", dst, &payload)?;
    Ok(0)
}

/// Count `len` output bytes against the cap and return the record's sequence number.
fn account_output(c: &mut Caller<'_, ProcState>, len: usize) -> HostResult<u64> {
    let s = c.data_mut();
    let total = s.host.output_bytes.saturating_add(len as u64);
    if total > s.job.output_limit {
        let stop = Stop::OutputLimit {
            limit_mib: s.job.output_limit / MIB,
        };
        return Err(s.stop_with(stop));
    }
    s.host.output_bytes = total;
    let seq = s.host.output_seq;
    s.host.output_seq += 1;
    Ok(seq)
}

fn emit_output(
    c: &mut Caller<'_, ProcState>,
    stream: Stream,
    data: String,
    len: usize,
) -> HostResult<()> {
    let seq = account_output(c, len)?;
    let s = c.data_mut();
    // Back-pressure: wait while the peer has too much undelivered output.
    if !s.job.reporter.wait_for_room(s.deadline, &s.job.kill) {
        let stop = if s.job.kill.load(Ordering::Relaxed) {
            Stop::Killed
        } else {
            Stop::TimeLimit {
                superstep: s.host.superstep,
                secs: s.job.superstep_budget.as_secs_f64(),
            }
        };
        return Err(s.stop_with(stop));
    }
    s.output_mark = s.job.reporter.emit_marked(PeerEvent::Output {
        job: s.job.job,
        pid: s.host.pid,
        seq,
        stream,
        data,
    });
    Ok(())
}

fn host_print(mut c: Caller<'_, ProcState>, stream: i32, ptr: i32, len: i32) -> HostResult<i32> {
    let stream = match stream {
        STREAM_STDOUT => Stream::Stdout,
        STREAM_STDERR => Stream::Stderr,
        other => {
            let msg = format!(
                "`print` to stream {other}; use {STREAM_STDOUT} (stdout) or {STREAM_STDERR} (stderr)"
            );
            return Err(bad_call(&mut c, msg));
        }
    };
    let len = len as u32 as usize;
    if len > MAX_OUTPUT_RECORD {
        return Ok(ERR_TOO_LARGE);
    }
    let bytes = read_guest(&mut c, "print", ptr, len)?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    emit_output(&mut c, stream, text, len)?;
    Ok(0)
}

fn host_write_raw(mut c: Caller<'_, ProcState>, ptr: i32, len: i32) -> HostResult<i32> {
    let len = len as u32 as usize;
    if len > MAX_OUTPUT_RECORD {
        return Ok(ERR_TOO_LARGE);
    }
    let bytes = read_guest(&mut c, "write_raw", ptr, len)?;
    let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
    emit_output(&mut c, Stream::Raw, data, len)?;
    Ok(0)
}

fn host_flush(mut c: Caller<'_, ProcState>) -> HostResult<i32> {
    let job = c.data().job.clone();
    job.reporter.flush_blocking(FLUSH_TIMEOUT, &job.kill);
    if job.kill.load(Ordering::Relaxed) {
        return Err(c.data_mut().stop_with(Stop::Killed));
    }
    Ok(0)
}

fn host_abort(mut c: Caller<'_, ProcState>, ptr: i32, len: i32) -> HostResult<()> {
    let len = (len as u32 as usize).min(MAX_ABORT_REASON);
    let bytes = read_guest(&mut c, "abort", ptr, len)?;
    let reason = String::from_utf8_lossy(&bytes).into_owned();
    Err(c.data_mut().stop_with(Stop::Abort(reason)))
}

fn resource_name(
    c: &mut Caller<'_, ProcState>,
    call: &str,
    ptr: i32,
    len: i32,
) -> HostResult<String> {
    let bytes = read_guest(c, call, ptr, len as u32 as usize)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn host_resource_len(
    mut c: Caller<'_, ProcState>,
    name_ptr: i32,
    name_len: i32,
) -> HostResult<i64> {
    let name = resource_name(&mut c, "resource_len", name_ptr, name_len)?;
    Ok(match c.data().job.resources.get(&name) {
        Some(r) => r.len() as i64,
        None => -1,
    })
}

fn host_resource_read(
    mut c: Caller<'_, ProcState>,
    name_ptr: i32,
    name_len: i32,
    dst: i32,
) -> HostResult<i32> {
    let name = resource_name(&mut c, "resource_read", name_ptr, name_len)?;
    let job = c.data().job.clone();
    match job.resources.get(&name) {
        Some(r) => {
            write_guest(&mut c, "resource_read", dst, r)?;
            Ok(0)
        }
        None => Ok(ERR_NOT_FOUND),
    }
}

#[cfg(test)]
mod tests;
