//! The `bspweb_v1` host ABI between a guest module and the peer, and the
//! validator every module passes before it is stored or run.
//!
//! # The contract
//!
//! A guest is a `wasm32-unknown-unknown` module. It imports functions only from
//! the module [`HOST_MODULE`] (`bspweb_v1`), with exactly the signatures of
//! [`IMPORTS`], and exports:
//!
//! - `memory`: its linear memory;
//! - `bspweb_resume: () -> i32`: runs the program until its next suspension
//!   point and returns a status: [`STATUS_SYNC`] (reached `sync`, the superstep
//!   is over), [`STATUS_DONE`] (`main` returned normally) or [`STATUS_YIELD`]
//!   (a `may_migrate` point inside a superstep; call `bspweb_resume` again to go
//!   on). The first call starts `main`. An error returned from `main`, an
//!   `abort` or a panic ends in the host function `abort`, which never returns.
//!
//! When `bspweb_resume` has returned, no WebAssembly frame is live: the
//! program's whole state is its linear memory plus its mutable globals (the
//! stack pointer of Rust guests, Asyncify's state of C guests). A checkpoint
//! captures exactly that: the host exports every mutable global under a
//! reserved name ([`checkpointable`], [`GLOBAL_EXPORT_PREFIX`]) before it
//! compiles a module, and records their values with memory. Everything else
//! an instance holds must not change after instantiation, so the validator
//! refuses what would change it: mutable globals of a type a checkpoint cannot
//! record (`v128`, references) and the instructions that write tables or drop
//! segments (`table.set`, `table.grow`, `table.fill`, `table.copy`,
//! `table.init`, `elem.drop`, `data.drop`).
//!
//! Pointers are `i32` offsets into the guest's memory; a pointer range outside
//! memory makes the host trap the process with a clear error. Host functions
//! that can fail return a negative [`error code`](ERR_BAD_PID).
//!
//! | import | signature | meaning |
//! |---|---|---|
//! | `pid` | `() -> i32` | this process's id, `0..nprocs` |
//! | `nprocs` | `() -> i32` | number of processes of the job |
//! | `superstep` | `() -> i32` | current superstep, from 0 |
//! | `seed` | `() -> i64` | the job's seed (same for every pid) |
//! | `args_len` | `() -> i32` | length of the job's arguments (JSON text) |
//! | `args_read` | `(dst) -> ()` | copy the arguments to `dst` |
//! | `send` | `(pid, ptr, len) -> i32` | send `len` bytes to `pid` |
//! | `send_range` | `(lo, hi, ptr, len) -> i32` | send to every pid in `lo..hi` (half open) |
//! | `send_list` | `(pids_ptr, npids, ptr, len) -> i32` | send to each pid of a little-endian `u32` array |
//! | `msg_count` | `() -> i32` | number of messages delivered this superstep |
//! | `msg_info` | `(index, out) -> i32` | write `source, superstep, len` as three LE `u32` at `out` |
//! | `msg_read` | `(index, dst) -> i32` | copy message `index`'s payload to `dst` |
//! | `set_tag` | `(tag) -> ()` | the messages sent from now on carry this `u32` tag (until the next `set_tag`; 0 again at every superstep) |
//! | `msg_tag` | `(index) -> i64` | the tag of message `index` (0: none), [`ERR_NOT_FOUND`] past the end |
//! | `print` | `(stream, ptr, len) -> i32` | one line of UTF-8 to [`STREAM_STDOUT`] or [`STREAM_STDERR`] |
//! | `write_raw` | `(ptr, len) -> i32` | one record of raw bytes for the user |
//! | `flush` | `() -> i32` | block until the output so far has reached the supernode |
//! | `abort` | `(ptr, len) -> !` | end the job with this UTF-8 reason; traps, never returns |
//! | `resource_len` | `(name_ptr, name_len) -> i64` | size of a named job resource, `-1` if there is none |
//! | `resource_read` | `(name_ptr, name_len, dst) -> i32` | copy the resource to `dst` |
//!
//! Messages are delivered in a deterministic order: by source pid, then in the
//! order the source sent them. There is no clock and no entropy: the same
//! module, arguments, seed and messages always produce the same result.

use std::fmt;

mod nan;
pub use nan::{canonicalize_nans, perturb_nans};

use wasmparser::{
    CompositeInnerType, ExternalKind, FuncType, Parser, Payload, TypeRef, ValType, Validator,
    WasmFeatures,
};

/// The import module name; the version is part of the name.
pub const HOST_MODULE: &str = "bspweb_v1";

/// The resume export.
pub const RESUME_EXPORT: &str = "bspweb_resume";

/// The memory export.
pub const MEMORY_EXPORT: &str = "memory";

/// Exports whose names start with this are the host's: [`checkpointable`]
/// adds `bspweb:global:N` for mutable global `N`; a guest may not use the
/// prefix.
pub const GLOBAL_EXPORT_PREFIX: &str = "bspweb:global:";

/// The prefix of every export name reserved for the host.
pub const RESERVED_EXPORT_PREFIX: &str = "bspweb:";

/// The export Binaryen's Asyncify adds (C guests, `bspweb cc`): `() -> i32`,
/// the unwinding state, which must be 0 (normal) whenever `bspweb_resume`
/// has returned. The host checks it after every resume.
pub const ASYNCIFY_STATE_EXPORT: &str = "asyncify_get_state";

/// `bspweb_resume` status: the process reached `sync`.
pub const STATUS_SYNC: i32 = 0;
/// `bspweb_resume` status: `main` returned normally.
pub const STATUS_DONE: i32 = 1;
/// `bspweb_resume` status: a `may_migrate` point; resume again to continue.
pub const STATUS_YIELD: i32 = 2;

/// `print` stream: standard output.
pub const STREAM_STDOUT: i32 = 1;
/// `print` stream: standard error.
pub const STREAM_STDERR: i32 = 2;

/// Error code: a destination pid is not a process of this job.
pub const ERR_BAD_PID: i32 = -1;
/// Error code: an empty or out-of-range pid range.
pub const ERR_BAD_RANGE: i32 = -2;
/// Error code: a message larger than [`MAX_MESSAGE_BYTES`](crate::MAX_MESSAGE_BYTES).
pub const ERR_TOO_LARGE: i32 = -3;
/// Error code: no message or resource with that index or name.
pub const ERR_NOT_FOUND: i32 = -4;

/// Largest single message payload (matches the data plane's limit).
pub const MAX_MESSAGE_BYTES: usize = 8 << 20;

/// A value type of the ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    I32,
    I64,
}

impl Ty {
    fn matches(self, v: &ValType) -> bool {
        matches!((self, v), (Ty::I32, ValType::I32) | (Ty::I64, ValType::I64))
    }

    fn name(self) -> &'static str {
        match self {
            Ty::I32 => "i32",
            Ty::I64 => "i64",
        }
    }
}

/// One host function: name, parameter types, result types.
#[derive(Debug, Clone, Copy)]
pub struct Import {
    pub name: &'static str,
    pub params: &'static [Ty],
    pub results: &'static [Ty],
}

use Ty::{I32, I64};

/// Every function of `bspweb_v1` with its signature.
pub const IMPORTS: &[Import] = &[
    Import {
        name: "pid",
        params: &[],
        results: &[I32],
    },
    Import {
        name: "nprocs",
        params: &[],
        results: &[I32],
    },
    Import {
        name: "superstep",
        params: &[],
        results: &[I32],
    },
    Import {
        name: "seed",
        params: &[],
        results: &[I64],
    },
    Import {
        name: "args_len",
        params: &[],
        results: &[I32],
    },
    Import {
        name: "args_read",
        params: &[I32],
        results: &[],
    },
    Import {
        name: "send",
        params: &[I32, I32, I32],
        results: &[I32],
    },
    Import {
        name: "send_range",
        params: &[I32, I32, I32, I32],
        results: &[I32],
    },
    Import {
        name: "send_list",
        params: &[I32, I32, I32, I32],
        results: &[I32],
    },
    Import {
        name: "msg_count",
        params: &[],
        results: &[I32],
    },
    Import {
        name: "msg_info",
        params: &[I32, I32],
        results: &[I32],
    },
    Import {
        name: "msg_read",
        params: &[I32, I32],
        results: &[I32],
    },
    Import {
        name: "set_tag",
        params: &[I32],
        results: &[],
    },
    Import {
        name: "msg_tag",
        params: &[I32],
        results: &[I64],
    },
    Import {
        name: "print",
        params: &[I32, I32, I32],
        results: &[I32],
    },
    Import {
        name: "write_raw",
        params: &[I32, I32],
        results: &[I32],
    },
    Import {
        name: "flush",
        params: &[],
        results: &[I32],
    },
    Import {
        name: "abort",
        params: &[I32, I32],
        results: &[],
    },
    Import {
        name: "resource_len",
        params: &[I32, I32],
        results: &[I64],
    },
    Import {
        name: "resource_read",
        params: &[I32, I32, I32],
        results: &[I32],
    },
];

/// Look up a host function by name.
pub fn import(name: &str) -> Option<&'static Import> {
    IMPORTS.iter().find(|i| i.name == name)
}

/// Why a module was refused. The messages name the problem and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidModule {
    #[error(
        "not a WebAssembly module: the file does not start with the wasm magic bytes; build your program with `cargo build --release --target wasm32-unknown-unknown` and upload the `.wasm` file"
    )]
    NotWasm,
    #[error("the module is not valid WebAssembly: {0}")]
    Malformed(String),
    #[error(
        "function {function} has {locals} locals; the peer adds up to three to make floating point deterministic and WebAssembly allows 50000: split the function"
    )]
    TooManyLocals { function: u32, locals: u64 },
    #[error(
        "module imports `{module}.{name}`; bspweb guests may import only functions from `{HOST_MODULE}` (no WASI, no other host modules): build for `wasm32-unknown-unknown` with the bspweb SDK"
    )]
    ForeignImport { module: String, name: String },
    #[error(
        "module imports `{HOST_MODULE}.{name}`, which this host does not provide; is the SDK newer than the peer?"
    )]
    UnknownHostFunction { name: String },
    #[error(
        "module imports `{HOST_MODULE}.{name}` with signature {found}; the host provides {expected}"
    )]
    WrongSignature {
        name: String,
        found: String,
        expected: String,
    },
    #[error("module imports a {kind} `{module}.{name}`; bspweb guests may import only functions")]
    NonFunctionImport {
        module: String,
        name: String,
        kind: &'static str,
    },
    #[error(
        "module does not export `{0}`; bspweb programs are built with the bspweb SDK and its `#[bspweb::main]` attribute"
    )]
    MissingExport(&'static str),
    #[error("module exports `{name}` with the wrong type: {expected}")]
    WrongExport {
        name: &'static str,
        expected: &'static str,
    },
    #[error(
        "module has a mutable global of type {ty} ({name}); a checkpoint records mutable globals of type i32, i64, f32 and f64 only, so keep such state in linear memory"
    )]
    UncheckpointableGlobal { name: String, ty: String },
    #[error(
        "module uses `{op}` in {function}; it changes {what}, which lives outside linear memory and globals and so would not survive a checkpoint; bspweb programs must leave tables and segments as instantiated"
    )]
    StateOutsideMemory {
        op: &'static str,
        what: &'static str,
        function: String,
    },
    #[error(
        "module exports `{0}`; export names starting with `{RESERVED_EXPORT_PREFIX}` are reserved for the host"
    )]
    ReservedExport(String),
    #[error("module has a start function; bspweb programs must not run code at instantiation")]
    StartFunction,
    #[error("module declares {0} memories; exactly one is supported")]
    Memories(usize),
}

/// What the validator learned about an accepted module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleSummary {
    /// Host functions the module imports.
    pub imports: Vec<String>,
    /// Initial memory size in 64 KiB pages.
    pub initial_pages: u64,
    /// Indices of the mutable globals (all of type i32, i64, f32 or f64), in
    /// index order: what a checkpoint records besides memory.
    pub mutable_globals: Vec<u32>,
}

/// The wasm features a guest may use. Threads, relaxed SIMD, GC, exceptions,
/// memory64 and multiple memories are off: they break determinism or the
/// checkpoint model. SIMD is on: [`canonicalize_nans`] covers vector
/// arithmetic as well as scalar, so it is deterministic.
pub fn features() -> WasmFeatures {
    let mut f = WasmFeatures::empty();
    for feat in [
        WasmFeatures::MUTABLE_GLOBAL,
        WasmFeatures::SATURATING_FLOAT_TO_INT,
        WasmFeatures::SIGN_EXTENSION,
        WasmFeatures::MULTI_VALUE,
        WasmFeatures::BULK_MEMORY,
        WasmFeatures::REFERENCE_TYPES,
        WasmFeatures::SIMD,
        WasmFeatures::FLOATS,
        WasmFeatures::EXTENDED_CONST,
        WasmFeatures::CALL_INDIRECT_OVERLONG,
        WasmFeatures::BULK_MEMORY_OPT,
    ] {
        f |= feat;
    }
    f
}

/// Validate a guest module against the `bspweb_v1` contract.
pub fn validate(bytes: &[u8]) -> Result<ModuleSummary, InvalidModule> {
    if bytes.len() < 8 || &bytes[0..4] != b"\0asm" {
        return Err(InvalidModule::NotWasm);
    }
    let mut validator = Validator::new_with_features(features());
    validator
        .validate_all(bytes)
        .map_err(|e| InvalidModule::Malformed(e.to_string()))?;

    let mut types: Vec<Option<FuncType>> = Vec::new();
    let mut func_types: Vec<u32> = Vec::new(); // type index of every function (imports first)
    let mut imports = Vec::new();
    let mut memories = 0usize;
    let mut initial_pages = 0u64;
    let mut mutable_globals: Vec<(u32, ValType)> = Vec::new();
    let mut global_index = 0u32;
    let mut imported_funcs = 0u32;
    let mut local_funcs = 0u32;
    // The first instruction that changes state outside memory and globals.
    let mut outside: Option<(&'static str, &'static str, u32)> = None;
    let mut func_names: Vec<(u32, String)> = Vec::new();
    let mut exports: Vec<(String, ExternalKind, u32)> = Vec::new();
    let mut global_names: Vec<(u32, String)> = Vec::new();

    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| InvalidModule::Malformed(e.to_string()))?;
        match payload {
            Payload::TypeSection(reader) => {
                for group in reader.into_iter_err_on_gc_types() {
                    let ft = group.map_err(|e| InvalidModule::Malformed(e.to_string()))?;
                    types.push(Some(ft));
                }
            }
            Payload::ImportSection(reader) => {
                for imp in reader {
                    let imp = imp.map_err(|e| InvalidModule::Malformed(e.to_string()))?;
                    let kind = match imp.ty {
                        TypeRef::Func(t) => {
                            if imp.module != HOST_MODULE {
                                return Err(InvalidModule::ForeignImport {
                                    module: imp.module.to_string(),
                                    name: imp.name.to_string(),
                                });
                            }
                            let Some(spec) = import(imp.name) else {
                                return Err(InvalidModule::UnknownHostFunction {
                                    name: imp.name.to_string(),
                                });
                            };
                            let ft = types
                                .get(t as usize)
                                .and_then(|t| t.as_ref())
                                .ok_or_else(|| InvalidModule::Malformed("bad type index".into()))?;
                            if !signature_matches(spec, ft) {
                                return Err(InvalidModule::WrongSignature {
                                    name: imp.name.to_string(),
                                    found: describe_found(ft),
                                    expected: describe_expected(spec),
                                });
                            }
                            imports.push(imp.name.to_string());
                            func_types.push(t);
                            imported_funcs += 1;
                            continue;
                        }
                        TypeRef::Memory(_) => "memory",
                        TypeRef::Table(_) => "table",
                        TypeRef::Global(_) => "global",
                        TypeRef::Tag(_) => "tag",
                        #[allow(unreachable_patterns)]
                        _ => "import",
                    };
                    if imp.module != HOST_MODULE {
                        return Err(InvalidModule::ForeignImport {
                            module: imp.module.to_string(),
                            name: imp.name.to_string(),
                        });
                    }
                    return Err(InvalidModule::NonFunctionImport {
                        module: imp.module.to_string(),
                        name: imp.name.to_string(),
                        kind,
                    });
                }
            }
            Payload::FunctionSection(reader) => {
                for f in reader {
                    func_types.push(f.map_err(|e| InvalidModule::Malformed(e.to_string()))?);
                }
            }
            Payload::MemorySection(reader) => {
                for m in reader {
                    let m = m.map_err(|e| InvalidModule::Malformed(e.to_string()))?;
                    memories += 1;
                    initial_pages = m.initial;
                }
            }
            Payload::GlobalSection(reader) => {
                for g in reader {
                    let g = g.map_err(|e| InvalidModule::Malformed(e.to_string()))?;
                    if g.ty.mutable {
                        mutable_globals.push((global_index, g.ty.content_type));
                    }
                    global_index += 1;
                }
            }
            Payload::ExportSection(reader) => {
                for e in reader {
                    let e = e.map_err(|e| InvalidModule::Malformed(e.to_string()))?;
                    exports.push((e.name.to_string(), e.kind, e.index));
                }
            }
            Payload::StartSection { .. } => return Err(InvalidModule::StartFunction),
            Payload::CodeSectionEntry(body) => {
                let func = imported_funcs + local_funcs;
                local_funcs += 1;
                if outside.is_some() {
                    continue;
                }
                let mut ops = body
                    .get_operators_reader()
                    .map_err(|e| InvalidModule::Malformed(e.to_string()))?;
                while !ops.eof() {
                    let op = ops
                        .read()
                        .map_err(|e| InvalidModule::Malformed(e.to_string()))?;
                    if let Some((name, what)) = changes_state_outside_memory(&op) {
                        outside = Some((name, what, func));
                        break;
                    }
                }
            }
            Payload::CustomSection(reader) => {
                if let wasmparser::KnownCustom::Name(names) = reader.as_known() {
                    for n in names.into_iter().flatten() {
                        match n {
                            wasmparser::Name::Global(map) => {
                                for naming in map.into_iter().flatten() {
                                    global_names.push((naming.index, naming.name.to_string()));
                                }
                            }
                            wasmparser::Name::Function(map) => {
                                for naming in map.into_iter().flatten() {
                                    func_names.push((naming.index, naming.name.to_string()));
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
            _ => {}
        }
    }

    if memories != 1 {
        return Err(InvalidModule::Memories(memories));
    }
    let export = |name: &'static str| exports.iter().find(|(n, _, _)| n == name);
    match export(MEMORY_EXPORT) {
        None => return Err(InvalidModule::MissingExport(MEMORY_EXPORT)),
        Some((_, ExternalKind::Memory, _)) => {}
        Some(_) => {
            return Err(InvalidModule::WrongExport {
                name: MEMORY_EXPORT,
                expected: "a memory",
            });
        }
    }
    // Whether an export is a function `() -> i32`.
    let unit_to_i32 = |kind: &ExternalKind, idx: u32| {
        *kind == ExternalKind::Func
            && func_types
                .get(idx as usize)
                .and_then(|t| types.get(*t as usize))
                .and_then(|t| t.as_ref())
                .is_some_and(|ft| ft.params().is_empty() && ft.results() == [ValType::I32])
    };
    match export(RESUME_EXPORT) {
        None => return Err(InvalidModule::MissingExport(RESUME_EXPORT)),
        Some((_, kind, idx)) if unit_to_i32(kind, *idx) => {}
        Some(_) => {
            return Err(InvalidModule::WrongExport {
                name: RESUME_EXPORT,
                expected: "a function () -> i32",
            });
        }
    }

    if let Some((_, kind, idx)) = export(ASYNCIFY_STATE_EXPORT)
        && !unit_to_i32(kind, *idx)
    {
        return Err(InvalidModule::WrongExport {
            name: ASYNCIFY_STATE_EXPORT,
            expected: "a function () -> i32 (Asyncify's state)",
        });
    }

    if let Some((name, _, _)) = exports
        .iter()
        .find(|(n, _, _)| n.starts_with(RESERVED_EXPORT_PREFIX))
    {
        return Err(InvalidModule::ReservedExport(name.clone()));
    }
    if let Some((op, what, func)) = outside {
        let function = match func_names.iter().find(|(i, _)| *i == func) {
            Some((_, name)) => format!("function {func} (`{name}`)"),
            None => format!("function {func}"),
        };
        return Err(InvalidModule::StateOutsideMemory { op, what, function });
    }
    let name_of = |idx: u32| {
        global_names
            .iter()
            .find(|(i, _)| *i == idx)
            .map_or_else(|| format!("global {idx}"), |(_, n)| format!("`{n}`"))
    };
    if let Some((idx, ty)) = mutable_globals.iter().find(|(_, ty)| {
        !matches!(
            ty,
            ValType::I32 | ValType::I64 | ValType::F32 | ValType::F64
        )
    }) {
        return Err(InvalidModule::UncheckpointableGlobal {
            name: name_of(*idx),
            ty: ty.to_string(),
        });
    }

    Ok(ModuleSummary {
        imports,
        initial_pages,
        mutable_globals: mutable_globals.into_iter().map(|(i, _)| i).collect(),
    })
}

/// The instructions that change an instance's state outside linear memory
/// and globals, with what they change.
fn changes_state_outside_memory(
    op: &wasmparser::Operator<'_>,
) -> Option<(&'static str, &'static str)> {
    use wasmparser::Operator as O;
    Some(match op {
        O::TableSet { .. } => ("table.set", "a table"),
        O::TableGrow { .. } => ("table.grow", "a table"),
        O::TableFill { .. } => ("table.fill", "a table"),
        O::TableCopy { .. } => ("table.copy", "a table"),
        O::TableInit { .. } => ("table.init", "a table"),
        O::ElemDrop { .. } => ("elem.drop", "an element segment"),
        O::DataDrop { .. } => ("data.drop", "a data segment"),
        _ => return None,
    })
}

/// The name under which [`checkpointable`] exports mutable global `index`.
pub fn global_export_name(index: u32) -> String {
    format!("{GLOBAL_EXPORT_PREFIX}{index}")
}

/// `bytes`, a module [`validate`] accepted with `summary`, with every mutable
/// global exported as [`global_export_name`]`(index)`, appended to the
/// export section in index order, so the host can read and set them: what a
/// checkpoint records besides memory. Nothing else changes, so the module
/// behaves exactly as `bytes` does. Returns `bytes` unchanged when there is
/// no mutable global.
pub fn checkpointable(bytes: &[u8], summary: &ModuleSummary) -> Result<Vec<u8>, InvalidModule> {
    if summary.mutable_globals.is_empty() {
        return Ok(bytes.to_vec());
    }
    let bad =
        || InvalidModule::Malformed("cannot re-read the sections of a validated module".into());
    let mut found = false;
    let out = rewrite_sections(bytes, |id, content| {
        if id != EXPORT_SECTION {
            return Ok(SectionEdit::Keep);
        }
        found = true;
        let (count, m) = read_leb_u32(content).ok_or_else(bad)?;
        let added = u32::try_from(summary.mutable_globals.len()).map_err(|_| bad())?;
        let mut section = Vec::with_capacity(content.len() + 24 * added as usize);
        write_leb(
            &mut section,
            u64::from(count.checked_add(added).ok_or_else(bad)?),
        );
        section.extend_from_slice(&content[m..]);
        for &g in &summary.mutable_globals {
            let name = global_export_name(g);
            write_leb(&mut section, name.len() as u64);
            section.extend_from_slice(name.as_bytes());
            section.push(EXTERNAL_GLOBAL);
            write_leb(&mut section, u64::from(g));
        }
        Ok(SectionEdit::Replace(section))
    })?;
    if !found {
        return Err(bad());
    }
    Ok(out)
}

/// What [`rewrite_sections`] does with a section.
pub(crate) enum SectionEdit {
    Keep,
    Replace(Vec<u8>),
    Drop,
}

/// `bytes`, a valid module, rebuilt section by section: `edit` sees each
/// section's id and contents and says what to do with it.
pub(crate) fn rewrite_sections(
    bytes: &[u8],
    mut edit: impl FnMut(u8, &[u8]) -> Result<SectionEdit, InvalidModule>,
) -> Result<Vec<u8>, InvalidModule> {
    let bad =
        || InvalidModule::Malformed("cannot re-read the sections of a validated module".into());
    let mut out = Vec::with_capacity(bytes.len() + bytes.len() / 8);
    out.extend_from_slice(bytes.get(..8).ok_or_else(bad)?);
    let mut pos = 8;
    while pos < bytes.len() {
        let id = bytes[pos];
        let (size, n) = read_leb_u32(bytes.get(pos + 1..).ok_or_else(bad)?).ok_or_else(bad)?;
        let start = pos + 1 + n;
        let end = start.checked_add(size as usize).ok_or_else(bad)?;
        let content = bytes.get(start..end).ok_or_else(bad)?;
        match edit(id, content)? {
            SectionEdit::Keep => out.extend_from_slice(&bytes[pos..end]),
            SectionEdit::Replace(section) => {
                out.push(id);
                write_leb(&mut out, section.len() as u64);
                out.extend_from_slice(&section);
            }
            SectionEdit::Drop => {}
        }
        pos = end;
    }
    Ok(out)
}

/// The export section's id and a global export's kind in the binary format.
const EXPORT_SECTION: u8 = 7;
const EXTERNAL_GLOBAL: u8 = 3;

/// An unsigned LEB128 `u32` at the start of `bytes`, with its length.
pub(crate) fn read_leb_u32(bytes: &[u8]) -> Option<(u32, usize)> {
    let mut value = 0u32;
    for (i, &b) in bytes.iter().take(5).enumerate() {
        value |= u32::from(b & 0x7f).checked_shl(7 * i as u32)?;
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Append `value` as unsigned LEB128.
pub(crate) fn write_leb(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn signature_matches(spec: &Import, ft: &FuncType) -> bool {
    ft.params().len() == spec.params.len()
        && ft.results().len() == spec.results.len()
        && spec
            .params
            .iter()
            .zip(ft.params())
            .all(|(a, b)| a.matches(b))
        && spec
            .results
            .iter()
            .zip(ft.results())
            .all(|(a, b)| a.matches(b))
}

fn describe_expected(spec: &Import) -> String {
    let p: Vec<_> = spec.params.iter().map(|t| t.name()).collect();
    let r: Vec<_> = spec.results.iter().map(|t| t.name()).collect();
    format!("({}) -> ({})", p.join(", "), r.join(", "))
}

fn describe_found(ft: &FuncType) -> String {
    let p: Vec<_> = ft.params().iter().map(|t| t.to_string()).collect();
    let r: Vec<_> = ft.results().iter().map(|t| t.to_string()).collect();
    format!("({}) -> ({})", p.join(", "), r.join(", "))
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// Keep `CompositeInnerType` referenced for readers of wasmparser's type model:
// GC types are refused by `into_iter_err_on_gc_types` above.
#[allow(dead_code)]
fn _is_func(t: &CompositeInnerType) -> bool {
    matches!(t, CompositeInnerType::Func(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(body: &str) -> Vec<u8> {
        wat::parse_str(body).expect("test wat parses")
    }

    const OK: &str = r#"(module
        (import "bspweb_v1" "pid" (func (result i32)))
        (import "bspweb_v1" "send" (func (param i32 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (global $__stack_pointer (mut i32) (i32.const 1024))
        (func (export "bspweb_resume") (result i32) i32.const 1))"#;

    #[test]
    fn accepts_a_minimal_guest() {
        let s = validate(&module(OK)).unwrap();
        assert_eq!(s.imports, vec!["pid", "send"]);
        assert_eq!(s.mutable_globals, vec![0]);
        assert_eq!(s.initial_pages, 1);
    }

    #[test]
    fn refuses_non_wasm() {
        assert_eq!(
            validate(b"hello world, not wasm"),
            Err(InvalidModule::NotWasm)
        );
        assert_eq!(validate(b""), Err(InvalidModule::NotWasm));
    }

    #[test]
    fn refuses_truncated_wasm() {
        let mut m = module(OK);
        m.truncate(m.len() - 3);
        assert!(matches!(validate(&m), Err(InvalidModule::Malformed(_))));
    }

    #[test]
    fn refuses_wasi_imports_naming_them() {
        let m = module(
            r#"(module
            (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
            (memory (export "memory") 1)
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        let err = validate(&m).unwrap_err();
        assert!(
            err.to_string().contains("wasi_snapshot_preview1.fd_write"),
            "{err}"
        );
        assert!(err.to_string().contains("bspweb_v1"), "{err}");
    }

    #[test]
    fn refuses_unknown_host_functions_and_wrong_signatures() {
        let m = module(
            r#"(module (import "bspweb_v1" "clock" (func (result i64)))
            (memory (export "memory") 1)
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        assert!(matches!(
            validate(&m),
            Err(InvalidModule::UnknownHostFunction { .. })
        ));
        let m = module(
            r#"(module (import "bspweb_v1" "pid" (func (result i64)))
            (memory (export "memory") 1)
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        let err = validate(&m).unwrap_err();
        assert!(matches!(err, InvalidModule::WrongSignature { .. }));
        assert!(err.to_string().contains("() -> (i32)"), "{err}");
    }

    #[test]
    fn refuses_imported_memory_and_globals() {
        let m = module(
            r#"(module (import "bspweb_v1" "mem" (memory 1))
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        assert!(matches!(
            validate(&m),
            Err(InvalidModule::NonFunctionImport { .. })
        ));
    }

    /// The exports of a module, as (name, kind, index).
    fn exports(bytes: &[u8]) -> Vec<(String, ExternalKind, u32)> {
        let mut out = Vec::new();
        for payload in Parser::new(0).parse_all(bytes) {
            if let Payload::ExportSection(reader) = payload.unwrap() {
                for e in reader {
                    let e = e.unwrap();
                    out.push((e.name.to_string(), e.kind, e.index));
                }
            }
        }
        out
    }

    #[test]
    fn accepts_numeric_mutable_globals_and_exports_them_for_checkpoints() {
        let m = module(
            r#"(module
            (memory (export "memory") 1)
            (global $sp (mut i32) (i32.const 1024))
            (global $fixed i64 (i64.const 7))
            (global $tls (mut i64) (i64.const 0))
            (global $x (export "x") (mut f64) (f64.const 0.5))
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        let s = validate(&m).unwrap();
        assert_eq!(s.mutable_globals, vec![0, 2, 3]);
        let c = checkpointable(&m, &s).unwrap();
        Validator::new_with_features(features())
            .validate_all(&c)
            .expect("the instrumented module is valid");
        let names: Vec<(String, u32)> = exports(&c)
            .into_iter()
            .filter(|(_, k, _)| *k == ExternalKind::Global)
            .map(|(n, _, i)| (n, i))
            .collect();
        assert_eq!(
            names,
            vec![
                ("x".to_string(), 3),
                ("bspweb:global:0".to_string(), 0),
                ("bspweb:global:2".to_string(), 2),
                ("bspweb:global:3".to_string(), 3),
            ]
        );
        // Only the export section changed.
        assert!(c.len() > m.len() && c.len() < m.len() + 64);
        // No mutable global: the module as it is.
        let none = module(OK.replace("(mut i32)", "i32").as_str());
        let s = validate(&none).unwrap();
        assert!(s.mutable_globals.is_empty());
        assert_eq!(checkpointable(&none, &s).unwrap(), none);
    }

    #[test]
    fn refuses_mutable_globals_a_checkpoint_cannot_record() {
        let m = module(
            r#"(module
            (memory (export "memory") 1)
            (global $lanes (mut v128) (v128.const i64x2 0 0))
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        let err = validate(&m).unwrap_err();
        assert!(
            matches!(err, InvalidModule::UncheckpointableGlobal { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("v128") && err.to_string().contains("lanes"));
    }

    #[test]
    fn refuses_instructions_that_change_tables_or_segments() {
        for (op, body) in [
            ("table.set", "(table.set $t (i32.const 0) (ref.null func))"),
            (
                "table.grow",
                "(drop (table.grow $t (ref.null func) (i32.const 1)))",
            ),
            (
                "table.fill",
                "(table.fill $t (i32.const 0) (ref.null func) (i32.const 1))",
            ),
            (
                "table.copy",
                "(table.copy $t $t (i32.const 0) (i32.const 1) (i32.const 1))",
            ),
            (
                "table.init",
                "(table.init $t $e (i32.const 0) (i32.const 0) (i32.const 1))",
            ),
            ("elem.drop", "(elem.drop $e)"),
            ("data.drop", "(data.drop $d)"),
        ] {
            let m = module(&format!(
                r#"(module
                (memory (export "memory") 1)
                (table $t 2 funcref)
                (elem $e func $f)
                (data $d "xyz")
                (func $f)
                (func $g (export "bspweb_resume") (result i32) {body} i32.const 1))"#
            ));
            let err = validate(&m).unwrap_err();
            assert!(
                matches!(&err, InvalidModule::StateOutsideMemory { op: o, .. } if *o == op),
                "{op}: {err}"
            );
            assert!(err.to_string().contains("function 1 (`g`)"), "{err}");
        }
        // Reading them is fine: memory.init copies into memory.
        let m = module(
            r#"(module
            (memory (export "memory") 1)
            (table $t 2 funcref)
            (data $d "xyz")
            (func (export "bspweb_resume") (result i32)
              (memory.init $d (i32.const 0) (i32.const 0) (i32.const 3))
              (drop (table.get $t (i32.const 0)))
              (drop (table.size $t))
              i32.const 1))"#,
        );
        validate(&m).unwrap();
    }

    #[test]
    fn refuses_the_hosts_export_names() {
        let m = module(
            r#"(module
            (memory (export "memory") 1)
            (global $g (export "bspweb:global:0") (mut i32) (i32.const 0))
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        assert_eq!(
            validate(&m),
            Err(InvalidModule::ReservedExport("bspweb:global:0".into()))
        );
    }

    #[test]
    fn accepts_simd() {
        let m = module(
            r#"(module
            (memory (export "memory") 1)
            (func (export "bspweb_resume") (result i32)
              (v128.store (i32.const 0)
                (f32x4.add (v128.load (i32.const 16)) (f32x4.splat (f32.const 1.5))))
              i32.const 1))"#,
        );
        validate(&m).unwrap();
    }

    #[test]
    fn leb128_round_trips() {
        for v in [0, 1, 127, 128, 300, 16_383, 16_384, u32::MAX / 3, u32::MAX] {
            let mut b = Vec::new();
            write_leb(&mut b, u64::from(v));
            assert_eq!(read_leb_u32(&b), Some((v, b.len())));
        }
        assert_eq!(read_leb_u32(&[0x80, 0x80]), None);
    }

    #[test]
    fn checks_the_type_of_asyncify_state() {
        let m = module(
            r#"(module (memory (export "memory") 1)
            (func (export "asyncify_get_state") (result i32) i32.const 0)
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        validate(&m).unwrap();
        let m = module(
            r#"(module (memory (export "memory") 1)
            (func (export "asyncify_get_state") (param i32) (result i32) i32.const 0)
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        assert!(matches!(
            validate(&m),
            Err(InvalidModule::WrongExport {
                name: ASYNCIFY_STATE_EXPORT,
                ..
            })
        ));
    }

    #[test]
    fn refuses_missing_or_mistyped_exports() {
        let m = module(r#"(module (memory (export "memory") 1))"#);
        assert_eq!(
            validate(&m),
            Err(InvalidModule::MissingExport(RESUME_EXPORT))
        );
        let m = module(
            r#"(module (memory 1) (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        assert_eq!(
            validate(&m),
            Err(InvalidModule::MissingExport(MEMORY_EXPORT))
        );
        let m = module(r#"(module (memory (export "memory") 1) (func (export "bspweb_resume")))"#);
        assert!(matches!(
            validate(&m),
            Err(InvalidModule::WrongExport { .. })
        ));
    }

    #[test]
    fn refuses_start_functions() {
        let m = module(
            r#"(module (memory (export "memory") 1)
            (func $s) (start $s)
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        assert_eq!(validate(&m), Err(InvalidModule::StartFunction));
    }
}
