//! `bspweb cc`: C (BSPlib) to a bspweb guest module in one command.
//!
//! The toolchain is Debian's: `clang` compiles for `wasm32-wasi` against
//! `wasi-libc`, `wasm-ld` links with the bundled runtime (`guest-c/`,
//! embedded in this binary), and Binaryen's `wasm-opt --asyncify` lets every
//! `bsp_sync` return to the host, so the whole process state is linear
//! memory plus globals, as for Rust guests. The result is checked by the same
//! validator the supernode runs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;

/// The bundled runtime: (path under the work directory, contents).
const RUNTIME: &[(&str, &str)] = &[
    ("include/bsp.h", include_str!("../guest-c/include/bsp.h")),
    (
        "include/bspweb.h",
        include_str!("../guest-c/include/bspweb.h"),
    ),
    ("src/host.h", include_str!("../guest-c/src/host.h")),
    ("src/crt.c", include_str!("../guest-c/src/crt.c")),
    ("src/bsp.c", include_str!("../guest-c/src/bsp.c")),
];

/// The C examples `bspweb up` registers: (name, description, source).
pub const EXAMPLES: &[(&str, &str, &str)] = &[
    (
        "c-inner-product",
        "C with BSPlib (guest-c/examples/inner_product.c): inner product of two n-vectors, partial sums exchanged with bsp_put; args [n, reps]",
        include_str!("../guest-c/examples/inner_product.c"),
    ),
    (
        "c-prefix-sum",
        "C with BSPlib (guest-c/examples/prefix_sum.c): parallel prefix sum of n integers with bsp_send and bsp_get, checked against the closed form; args [n]",
        include_str!("../guest-c/examples/prefix_sum.c"),
    ),
    (
        "c-pagerank",
        "C with BSPlib (guest-c/examples/pagerank.c): the pagerank example's kernel and output, contributions exchanged with bsp_put; args [n, m, iters, seed]",
        include_str!("../guest-c/examples/pagerank.c"),
    ),
];

/// The runtime's translation units.
const RUNTIME_SOURCES: &[&str] = &["src/crt.c", "src/bsp.c"];

/// Code generation for every translation unit: bulk memory (`memcpy` and
/// `memset` become one instruction), saturating float-to-int conversions,
/// sign extension. With bulk memory on, clang 14 keeps thread-locals (libc's
/// `errno`) and accepts only the local-exec model for them; there is one
/// thread, so that model is exact. No loop unrolling: the unrolled body and
/// its remainder loop cost more in wasmtime's code than they save (PageRank's
/// scatter, a loop over about five edges per vertex, ran 13 % slower per
/// iteration unrolled; the inner product the same either way).
const CODEGEN_FLAGS: &[&str] = &[
    "-mbulk-memory",
    "-mnontrapping-fptoint",
    "-msign-ext",
    "-mmutable-globals",
    "-ftls-model=local-exec",
    "-fno-unroll-loops",
];

/// `wasm-opt`'s passes before the optimisation level: Asyncify, where only
/// `bsp_sync` and `exit` unwind (no host function does: the import list
/// names none of them) and `bspweb_resume` drives it uninstrumented; names
/// kept for readable traps.
const WASM_OPT_FLAGS: &[&str] = &[
    "--enable-bulk-memory",
    "--enable-nontrapping-float-to-int",
    "--enable-sign-ext",
    "--enable-mutable-globals",
    "--debuginfo",
    "--asyncify",
    "--pass-arg=asyncify-imports@bspweb_v1.none",
    "--pass-arg=asyncify-removelist@bspweb_resume",
];

/// The C stack of a guest (wasm-ld's default is 64 KiB).
const STACK_BYTES: u32 = 1 << 20;

/// Debian packages that provide the toolchain.
const INSTALL_HINT: &str = "install the C toolchain: `sudo apt-get install clang lld binaryen wasi-libc libclang-rt-14-dev-wasm32` (Debian 12; other systems: clang and lld with the wasm32 target, wasi-libc, binaryen)";

#[derive(Args, Debug, Clone)]
#[command(after_long_help = CC_AFTER)]
pub struct CcArgs {
    /// C source files (BSPlib programs: `#include <bsp.h>`)
    #[arg(required = true, value_name = "FILE.c")]
    pub files: Vec<PathBuf>,
    /// Output module [default: the first file's name with `.wasm`]
    #[arg(short = 'o', value_name = "OUT.wasm")]
    pub output: Option<PathBuf>,
    /// Add a directory to the include path
    #[arg(short = 'I', value_name = "DIR")]
    pub include: Vec<PathBuf>,
    /// Define a macro (NAME or NAME=VALUE)
    #[arg(short = 'D', value_name = "NAME[=VALUE]")]
    pub define: Vec<String>,
    /// Optimisation level: 0, 1, 2, 3, s or z
    #[arg(short = 'O', default_value = "2", value_name = "LEVEL")]
    pub opt: String,
    /// Libraries to link: `-lm` is accepted (the math library is part of the C library); others are refused
    #[arg(short = 'l', value_name = "LIB")]
    pub libs: Vec<String>,
    /// Print the commands that run
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

const CC_AFTER: &str = "The module imports only bspweb_v1 and runs on any peer: \
`bspweb submit OUT.wasm -n 4 --follow`. It has the BSPlib API (bsp.h), a C library \
(wasi-libc: printf to the job's output, malloc, string and math functions) and no \
file system; clocks and rand are deterministic. A JSON array given with \
`--args` becomes argv[1..]. See docs/c-guests.md.";

/// The located tools.
struct Tools {
    clang: PathBuf,
    wasm_opt: PathBuf,
}

fn find_tool(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for name in names {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

fn tools() -> anyhow::Result<Tools> {
    let clang = find_tool(&[
        "clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14",
    ])
    .with_context(|| format!("`clang` was not found on PATH; {INSTALL_HINT}"))?;
    if find_tool(&[
        "wasm-ld",
        "wasm-ld-19",
        "wasm-ld-18",
        "wasm-ld-17",
        "wasm-ld-16",
        "wasm-ld-15",
        "wasm-ld-14",
    ])
    .is_none()
    {
        bail!("`wasm-ld` (lld) was not found on PATH; {INSTALL_HINT}");
    }
    let wasm_opt = find_tool(&["wasm-opt"])
        .with_context(|| format!("`wasm-opt` (binaryen) was not found on PATH; {INSTALL_HINT}"))?;
    Ok(Tools { clang, wasm_opt })
}

fn run(cmd: &mut Command, what: &str, verbose: bool) -> anyhow::Result<()> {
    if verbose {
        eprintln!("+ {cmd:?}");
    }
    let out = cmd
        .output()
        .with_context(|| format!("could not run {what}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let mut msg = format!("{what} failed ({})", out.status);
        if !stderr.trim().is_empty() {
            let _ = write!(msg, ":\n{}", stderr.trim_end());
        }
        if stderr.contains("wasi-libc")
            || stderr.contains("wasm-ld\" doesn't exist")
            || stderr.contains("stdio.h' file not found")
            || stderr.contains("unable to find library -lc")
            || stderr.contains("libclang_rt.builtins-wasm32.a")
        {
            let _ = write!(msg, "\n{INSTALL_HINT}");
        }
        bail!(msg);
    }
    if verbose && !out.stderr.is_empty() {
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Compiles `args.files` into a validated bspweb module; returns its bytes.
pub fn compile(args: &CcArgs) -> anyhow::Result<Vec<u8>> {
    let opt = args.opt.as_str();
    if !matches!(opt, "0" | "1" | "2" | "3" | "s" | "z") {
        bail!("-O{opt}: the optimisation level is one of 0, 1, 2, 3, s, z");
    }
    for lib in &args.libs {
        if lib != "m" && lib != "c" {
            bail!(
                "-l{lib}: only the C library (with its math functions, -lm) can be linked; add the library's C sources to the command instead"
            );
        }
    }
    for f in &args.files {
        if !f.is_file() {
            bail!("{}: no such file", f.display());
        }
    }
    let tools = tools()?;
    let work = tempfile::Builder::new()
        .prefix("bspweb-cc-")
        .tempdir()
        .context("could not create a temporary directory")?;
    let dir = work.path();
    for (rel, text) in RUNTIME {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().expect("runtime paths have a parent"))?;
        std::fs::write(&p, text)?;
    }

    let common = |cmd: &mut Command| {
        cmd.arg("--target=wasm32-wasi")
            .arg(format!("-O{opt}"))
            .args(CODEGEN_FLAGS);
    };

    // Compile: the user's files with their flags, the runtime with its own.
    let mut objects = Vec::new();
    for (i, file) in args.files.iter().enumerate() {
        let obj = dir.join(format!("u{i}.o"));
        let mut cmd = Command::new(&tools.clang);
        common(&mut cmd);
        cmd.arg("-isystem").arg(dir.join("include"));
        for inc in &args.include {
            cmd.arg("-I").arg(inc);
        }
        for d in &args.define {
            cmd.arg(format!("-D{d}"));
        }
        cmd.arg("-c").arg(file).arg("-o").arg(&obj);
        run(
            &mut cmd,
            &format!("clang ({})", file.display()),
            args.verbose,
        )?;
        objects.push(obj);
    }
    for (i, src) in RUNTIME_SOURCES.iter().enumerate() {
        let obj = dir.join(format!("rt{i}.o"));
        let mut cmd = Command::new(&tools.clang);
        cmd.arg("--target=wasm32-wasi")
            .arg("-O2")
            .args(CODEGEN_FLAGS);
        cmd.arg("-c").arg(dir.join(src)).arg("-o").arg(&obj);
        run(
            &mut cmd,
            &format!("clang (bundled runtime {src})"),
            args.verbose,
        )?;
        objects.push(obj);
    }

    // Link: no start files (crt.c is the entry), the reactor model (exports
    // are not wrapped in constructor calls), a 1 MiB C stack first.
    let linked = dir.join("linked.wasm");
    let mut cmd = Command::new(&tools.clang);
    cmd.arg("--target=wasm32-wasi")
        .arg("-mexec-model=reactor")
        .arg("-nostartfiles")
        .arg("-Wl,--no-entry")
        .arg(format!("-Wl,-z,stack-size={STACK_BYTES}"))
        // The stack below the data: an overflow traps (an access below
        // address 0) instead of overwriting static data.
        .arg("-Wl,--stack-first")
        .args(&objects)
        .arg("-o")
        .arg(&linked);
    run(&mut cmd, "wasm-ld (through clang)", args.verbose)?;

    // Asyncify: only the paths to bsp_sync and exit are instrumented (the
    // host functions never unwind); bspweb_resume drives the unwinding.
    let out = dir.join("out.wasm");
    let mut cmd = Command::new(&tools.wasm_opt);
    cmd.arg(&linked)
        .args(WASM_OPT_FLAGS)
        .arg(if opt == "0" {
            "-O0".to_string()
        } else {
            format!("-O{opt}")
        })
        .arg("-o")
        .arg(&out);
    run(&mut cmd, "wasm-opt --asyncify", args.verbose)?;

    let bytes = std::fs::read(&out)?;
    bspweb_abi::validate(&bytes)
        .map_err(|e| anyhow::anyhow!("the linked module is not a valid bspweb guest: {e}"))?;
    Ok(bytes)
}

/// Compile one C source held in memory (an example) with the default
/// options; `name` names it in messages.
pub fn compile_source(name: &str, source: &str) -> anyhow::Result<Vec<u8>> {
    let dir = tempfile::Builder::new()
        .prefix("bspweb-cc-src-")
        .tempdir()
        .context("could not create a temporary directory")?;
    let file = dir.path().join(format!("{name}.c"));
    std::fs::write(&file, source)?;
    compile(&CcArgs {
        files: vec![file],
        output: None,
        include: vec![],
        define: vec![],
        opt: "2".into(),
        libs: vec![],
        verbose: false,
    })
}

/// A digest of everything a compiled example depends on besides the tools:
/// its source and the bundled runtime (cache key of [`cached_example`]).
fn example_key(source: &str) -> String {
    // FNV-1a, 64 bits: stable across builds, enough to tell versions apart.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    feed(source.as_bytes());
    for (rel, text) in RUNTIME {
        feed(rel.as_bytes());
        feed(text.as_bytes());
    }
    for flag in CODEGEN_FLAGS.iter().chain(WASM_OPT_FLAGS) {
        feed(flag.as_bytes());
    }
    feed(&STACK_BYTES.to_le_bytes());
    // The compiler too: a new clang or binaryen makes another module.
    static TOOLS: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    feed(TOOLS.get_or_init(|| {
        ["clang", "wasm-opt"]
            .iter()
            .filter_map(|tool| Command::new(tool).arg("--version").output().ok())
            .flat_map(|out| out.stdout)
            .collect()
    }));
    format!("{h:016x}")
}

/// Where compiled C examples are kept, best first: `$BSPWEB_CACHE_DIR`,
/// else `$XDG_CACHE_HOME/bspweb`, else `~/.cache/bspweb` (shared by every
/// supernode of the user, so a fresh `--data` directory does not compile
/// them again), then the supernode's own `data` directory (for a service
/// user without a home).
pub fn example_cache_dirs(data: &Path) -> Vec<PathBuf> {
    cache_dirs(
        std::env::var_os("BSPWEB_CACHE_DIR"),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
        data,
    )
}

fn cache_dirs(
    bspweb_cache_dir: Option<std::ffi::OsString>,
    xdg_cache_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
    data: &Path,
) -> Vec<PathBuf> {
    // As the XDG spec asks, an empty or relative path is ignored.
    let set = |v: Option<std::ffi::OsString>| v.filter(|v| Path::new(v).is_absolute());
    let shared = match (set(bspweb_cache_dir), set(xdg_cache_home), set(home)) {
        (Some(d), _, _) => Some(PathBuf::from(d)),
        (None, Some(x), _) => Some(PathBuf::from(x).join("bspweb")),
        (None, None, Some(h)) => Some(PathBuf::from(h).join(".cache").join("bspweb")),
        (None, None, None) => None,
    };
    shared
        .into_iter()
        .chain([data.to_path_buf()])
        .map(|d| d.join("c-examples"))
        .collect()
}

/// The module of an example, compiled once and kept in the first of
/// `cache_dirs` that can be written (found in any of them). A cache that
/// cannot be written only costs a compilation at the next start: the module
/// is returned all the same.
pub fn cached_example(cache_dirs: &[PathBuf], name: &str, source: &str) -> anyhow::Result<Vec<u8>> {
    let file = format!("{name}-{}.wasm", example_key(source));
    for dir in cache_dirs {
        if let Ok(bytes) = std::fs::read(dir.join(&file))
            && bspweb_abi::validate(&bytes).is_ok()
        {
            return Ok(bytes);
        }
    }
    let bytes = compile_source(name, source)?;
    let mut failures = Vec::new();
    for dir in cache_dirs {
        let stored = std::fs::create_dir_all(dir)
            .with_context(|| format!("could not create {}", dir.display()))
            .and_then(|()| write_atomically(&dir.join(&file), &bytes));
        match stored {
            Ok(()) => return Ok(bytes),
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    eprintln!(
        "note: the compiled C example {name} is not cached ({}); it is compiled again at the next start",
        failures.join("; ")
    );
    Ok(bytes)
}

/// The output path: `-o`, else the first file with `.wasm`.
fn output_path(args: &CcArgs) -> PathBuf {
    args.output
        .clone()
        .unwrap_or_else(|| args.files[0].with_extension("wasm"))
}

pub fn main(args: CcArgs) -> anyhow::Result<()> {
    let bytes = compile(&args)?;
    let out = output_path(&args);
    write_atomically(&out, &bytes)?;
    eprintln!(
        "wrote {} ({} KiB); run it with `bspweb submit {} -n 4 --follow`",
        out.display(),
        bytes.len().div_ceil(1024),
        out.display()
    );
    Ok(())
}

fn write_atomically(out: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("could not write in {}", dir.display()))?;
    tmp.write_all(bytes)
        .with_context(|| format!("could not write {}", out.display()))?;
    let file = tmp
        .persist(out)
        .with_context(|| format!("could not write {}", out.display()))?;
    // A temporary file is private (0600); a compiler's output is not.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    #[cfg(not(unix))]
    drop(file);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_cache_is_the_users_then_the_data_directory() {
        let data = Path::new("/srv/bspweb");
        let dirs = |c: Option<&str>, x: Option<&str>, h: Option<&str>| {
            cache_dirs(
                c.map(Into::into),
                x.map(Into::into),
                h.map(Into::into),
                data,
            )
        };
        let local = PathBuf::from("/srv/bspweb/c-examples");
        assert_eq!(
            dirs(Some("/c"), Some("/x"), Some("/h")),
            [PathBuf::from("/c/c-examples"), local.clone()]
        );
        assert_eq!(
            dirs(None, Some("/x"), Some("/h")),
            [PathBuf::from("/x/bspweb/c-examples"), local.clone()]
        );
        assert_eq!(
            dirs(None, None, Some("/h")),
            [PathBuf::from("/h/.cache/bspweb/c-examples"), local.clone()]
        );
        assert_eq!(dirs(None, None, None), std::slice::from_ref(&local));
        // Empty or relative values count as unset.
        assert_eq!(
            dirs(Some(""), Some("cache"), Some("/h")),
            [PathBuf::from("/h/.cache/bspweb/c-examples"), local]
        );
    }
}
