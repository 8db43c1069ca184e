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

/// Whether `bytes` are the module `hash` names.
pub fn check_hash(hash: &str, bytes: &[u8]) -> Result<(), CompileError> {
    let actual = module_hash(bytes);
    if actual.eq_ignore_ascii_case(hash) {
        Ok(())
    } else {
        Err(CompileError::HashMismatch {
            expected: hash.to_string(),
            actual,
        })
    }
}

/// Why a process could not be started.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StartError {
    /// A limit stopped it while it started (its memory, say).
    #[error("{0}")]
    Stopped(Stop),
    #[error("the process could not be started: {0}")]
    Instantiate(String),
    #[error("the module does not export a memory named `{MEMORY_EXPORT}`")]
    NoMemory,
    #[error("the module's `{RESUME_EXPORT}` export is unusable: {0}")]
    Resume(String),
    #[error("the module's `{ASYNCIFY_STATE_EXPORT}` export is unusable: {0}")]
    AsyncifyState(String),
}

/// Why a process could not be restored from a checkpoint.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("cannot restore pid {pid} from its checkpoint of superstep {superstep}: {problem}")]
pub struct RestoreError {
    pub pid: Pid,
    pub superstep: u32,
    pub problem: RestoreProblem,
}

/// What is wrong with a checkpoint for this program and job.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RestoreProblem {
    #[error("the job has only {0} processes")]
    NoSuchPid(u32),
    #[error(
        "its memory is {mib} MiB, more than the job's memory limit of {limit_mib} MiB on this peer"
    )]
    TooLarge { mib: u64, limit_mib: u64 },
    #[error("its memory of {0} bytes is not a whole number of 64 KiB pages")]
    NotPages(usize),
    #[error("{0}")]
    Start(StartError),
    #[error(
        "its memory of {want} bytes is smaller than the program's initial memory of {have} bytes; is it a checkpoint of another program?"
    )]
    Smaller { want: usize, have: usize },
    #[error("{0}")]
    Grow(String),
    #[error(
        "it has {snapshot} globals, the program has {program} mutable globals; is it a checkpoint of another program?"
    )]
    Globals { snapshot: usize, program: usize },
    #[error("a global has an unsupported type")]
    GlobalType,
    #[error("cannot set a global: {0}")]
    SetGlobal(String),
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
    /// Compiled programs on disk ([`Runtime::use_compile_cache`]).
    disk: std::sync::OnceLock<compile_cache::CompileCache>,
    /// Programs read back from `disk` so far.
    loaded: std::sync::atomic::AtomicU64,
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
            disk: std::sync::OnceLock::new(),
            loaded: std::sync::atomic::AtomicU64::new(0),
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

    /// How many programs this runtime read back from its compile cache
    /// instead of compiling them.
    pub fn loaded_count(&self) -> u64 {
        self.loaded.load(Ordering::Relaxed)
    }

    /// Keep compiled programs under `root` (at most `limit` bytes in all)
    /// and read them back instead of compiling them again, also after a
    /// restart ([`compile_cache`]). Returns the directory this build uses;
    /// a second call changes nothing.
    pub fn use_compile_cache(
        &self,
        root: &std::path::Path,
        limit: u64,
    ) -> Result<std::path::PathBuf, compile_cache::CacheDirError> {
        if let Some(c) = self.disk.get() {
            return Ok(c.dir().to_path_buf());
        }
        let cache = compile_cache::CompileCache::open(root, limit, &self.engine)?;
        let dir = cache.dir().to_path_buf();
        let _ = self.disk.set(cache);
        Ok(dir)
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
        check_hash(hash, bytes)?;
        let started = Instant::now();
        let disk = self.disk.get();
        let (module, read_back) = match disk.and_then(|d| d.load(&self.engine, hash)) {
            Some(module) => (module, true),
            None => (self.compile_checked(bytes)?, false),
        };
        let (count, what) = if read_back {
            (
                &self.loaded,
                "read the compiled program from the compile cache",
            )
        } else {
            (&self.compiled, "compiled the program")
        };
        count.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            program = hash,
            kib = bytes.len() >> 10,
            ms = started.elapsed().as_millis() as u64,
            "{what}"
        );
        if let Some(d) = disk.filter(|_| !read_back) {
            let stored = Instant::now();
            d.store(hash, &module);
            tracing::debug!(
                program = hash,
                ms = %format_args!("{:.1}", stored.elapsed().as_secs_f64() * 1e3),
                "kept the compiled program in the compile cache"
            );
        }
        let mut cache = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if !cache.iter().any(|(h, _, _)| h.eq_ignore_ascii_case(hash)) {
            if cache.len() >= MODULE_CACHE {
                cache.remove(0);
            }
            cache.push((
                hash.to_ascii_lowercase(),
                module.clone(),
                Bytes::copy_from_slice(bytes),
            ));
        }
        Ok(module)
    }

    /// Validate `bytes` against the `bspweb_v1` contract, rewrite them for
    /// checkpoints and determinism, and compile them.
    fn compile_checked(&self, bytes: &[u8]) -> Result<Module, CompileError> {
        let summary = bspweb_abi::validate(bytes)?;
        // Every mutable global exported under a reserved name, so that
        // checkpoints can record and restore it (`bspweb_abi` module docs).
        let checkpointable = bspweb_abi::checkpointable(bytes, &summary)?;
        // The same NaN bits on every peer, whatever its processor.
        let deterministic = bspweb_abi::canonicalize_nans(&checkpointable)?;
        Module::new(&self.engine, &deterministic)
            .map_err(|e| CompileError::Compile(format!("{e:#}")))
    }

    /// Create process `pid` of a job: a fresh store with the job's limits and
    /// an instance of `module`.
    pub fn instantiate(
        &self,
        module: &Module,
        job: Arc<JobInfo>,
        pid: Pid,
    ) -> Result<Process, StartError> {
        let state = ProcState::new(job, pid, self.budget.clone());
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| s);
        store.epoch_deadline_callback(on_epoch);
        store.set_epoch_deadline(1);
        let instance = match self.linker.instantiate(&mut store, module) {
            Ok(i) => i,
            Err(e) => {
                return Err(match store.data_mut().stop.take() {
                    Some(stop) => StartError::Stopped(stop),
                    None => StartError::Instantiate(format!("{e:#}")),
                });
            }
        };
        let memory = instance
            .get_memory(&mut store, MEMORY_EXPORT)
            .ok_or(StartError::NoMemory)?;
        let resume = instance
            .get_typed_func::<(), i32>(&mut store, RESUME_EXPORT)
            .map_err(|e| StartError::Resume(format!("{e:#}")))?;
        let asyncify_state = match instance.get_export(&mut store, ASYNCIFY_STATE_EXPORT) {
            None => None,
            Some(_) => Some(
                instance
                    .get_typed_func::<(), i32>(&mut store, ASYNCIFY_STATE_EXPORT)
                    .map_err(|e| StartError::AsyncifyState(format!("{e:#}")))?,
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
            runs: ShortRuns::default(),
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
    ) -> Result<Process, RestoreError> {
        let (pid, step) = (snapshot.pid, snapshot.superstep);
        let fail = |problem| RestoreError {
            pid,
            superstep: step,
            problem,
        };
        if pid >= job.nprocs {
            return Err(fail(RestoreProblem::NoSuchPid(job.nprocs)));
        }
        let limit = job.memory_limit;
        if snapshot.memory.len() > limit {
            return Err(fail(RestoreProblem::TooLarge {
                mib: (snapshot.memory.len() as u64).div_ceil(MIB),
                limit_mib: limit as u64 / MIB,
            }));
        }
        if !snapshot.memory.len().is_multiple_of(PAGE_SIZE) {
            return Err(fail(RestoreProblem::NotPages(snapshot.memory.len())));
        }
        let mut process = self
            .instantiate(module, job, pid)
            .map_err(|e| fail(RestoreProblem::Start(e)))?;
        let st = &mut process.store;
        if snapshot.exited {
            process.ended = true;
        } else {
            let memory = st
                .data()
                .memory
                .ok_or(fail(RestoreProblem::Start(StartError::NoMemory)))?;
            let have = memory.data_size(&*st);
            let want = snapshot.memory.len();
            if want < have {
                return Err(fail(RestoreProblem::Smaller { want, have }));
            }
            if want > have {
                let pages = ((want - have) / PAGE_SIZE) as u64;
                if let Err(e) = memory.grow(&mut *st, pages) {
                    let reason = match st.data_mut().stop.take() {
                        Some(stop) => stop.to_string(),
                        None => format!("{e:#}"),
                    };
                    return Err(fail(RestoreProblem::Grow(reason)));
                }
            }
            memory.data_mut(&mut *st).copy_from_slice(&snapshot.memory);
            if snapshot.globals.len() != process.globals.len() {
                return Err(fail(RestoreProblem::Globals {
                    snapshot: snapshot.globals.len(),
                    program: process.globals.len(),
                }));
            }
            for (g, &bits) in process.globals.iter().zip(&snapshot.globals) {
                let ty = g.ty(&*st);
                let val =
                    val_from_bits(ty.content(), bits).ok_or(fail(RestoreProblem::GlobalType))?;
                g.set(&mut *st, val)
                    .map_err(|e| fail(RestoreProblem::SetGlobal(format!("{e:#}"))))?;
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

pub mod compile_cache;
mod host;
mod inline;
mod niceness;
mod process;

use host::*;
pub use inline::*;
pub use niceness::*;
pub use process::*;

#[cfg(test)]
mod tests;
