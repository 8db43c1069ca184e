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
//! program's whole state is its linear memory plus the single mutable global
//! `__stack_pointer`, which is back at its initial value. That is what makes a
//! copy of linear memory a complete checkpoint. The validator therefore refuses
//! modules with any other mutable global.
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
        "module has {count} mutable globals ({names}); bspweb allows only `__stack_pointer`, because a process's state must live in linear memory to be checkpointed; do not use thread-locals or `static mut` globals compiled to wasm globals"
    )]
    MutableGlobals { count: usize, names: String },
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
    /// Index of the one mutable global (the stack pointer), if any.
    pub stack_pointer_global: Option<u32>,
}

/// The wasm features a guest may use. Threads, relaxed SIMD, GC, exceptions,
/// memory64 and multiple memories are off: they break determinism or the
/// checkpoint model.
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
    let mut mutable_globals: Vec<u32> = Vec::new();
    let mut global_index = 0u32;
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
                        mutable_globals.push(global_index);
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
            Payload::CustomSection(reader) => {
                if let wasmparser::KnownCustom::Name(names) = reader.as_known() {
                    for n in names.into_iter().flatten() {
                        if let wasmparser::Name::Global(map) = n {
                            for naming in map.into_iter().flatten() {
                                global_names.push((naming.index, naming.name.to_string()));
                            }
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
    match export(RESUME_EXPORT) {
        None => return Err(InvalidModule::MissingExport(RESUME_EXPORT)),
        Some((_, ExternalKind::Func, idx)) => {
            let ok = func_types
                .get(*idx as usize)
                .and_then(|t| types.get(*t as usize))
                .and_then(|t| t.as_ref())
                .is_some_and(|ft| ft.params().is_empty() && ft.results() == [ValType::I32]);
            if !ok {
                return Err(InvalidModule::WrongExport {
                    name: RESUME_EXPORT,
                    expected: "a function () -> i32",
                });
            }
        }
        Some(_) => {
            return Err(InvalidModule::WrongExport {
                name: RESUME_EXPORT,
                expected: "a function () -> i32",
            });
        }
    }

    // The one mutable global allowed is the stack pointer: an i32 that is
    // global 0 in every module rustc/LLVM emits. When the name section is
    // present, it must also be called `__stack_pointer`.
    let name_of = |idx: u32| {
        global_names
            .iter()
            .find(|(i, _)| *i == idx)
            .map(|(_, n)| n.clone())
    };
    let stack_pointer_global = match mutable_globals.as_slice() {
        [] => None,
        [one] if name_of(*one).is_none_or(|n| n == "__stack_pointer") => Some(*one),
        many => {
            let names = many
                .iter()
                .map(|i| name_of(*i).unwrap_or_else(|| format!("global {i}")))
                .collect::<Vec<_>>()
                .join(", ");
            let count = many.len();
            return Err(InvalidModule::MutableGlobals { count, names });
        }
    };

    Ok(ModuleSummary {
        imports,
        initial_pages,
        stack_pointer_global,
    })
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
        assert_eq!(s.stack_pointer_global, Some(0));
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

    #[test]
    fn refuses_an_extra_mutable_global() {
        let m = module(
            r#"(module
            (memory (export "memory") 1)
            (global $sp (mut i32) (i32.const 1024))
            (global $tls (mut i32) (i32.const 0))
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        let err = validate(&m).unwrap_err();
        assert!(
            matches!(err, InvalidModule::MutableGlobals { count: 2, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("$tls") || err.to_string().contains("tls"),
            "{err}"
        );
    }

    #[test]
    fn refuses_a_lone_mutable_global_that_is_not_the_stack_pointer() {
        let m = module(
            r#"(module
            (memory (export "memory") 1)
            (global $counter (mut i32) (i32.const 0))
            (func (export "bspweb_resume") (result i32) i32.const 1))"#,
        );
        assert!(matches!(
            validate(&m),
            Err(InvalidModule::MutableGlobals { count: 1, .. })
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
