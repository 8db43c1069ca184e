//! Compiled programs kept on disk, so that a peer that restarts (a laptop
//! that was rebooted, a service that was stopped) does not compile again
//! every program it ran before: reading one back takes a few milliseconds,
//! compiling it takes Cranelift from a tenth of a second to seconds,
//! on the cores the job computes on.
//!
//! Layout: `ROOT/BUILD/HASH.cwasm`. `HASH` is the program's content address
//! ([`super::module_hash`] of the bytes the job names); `BUILD` names the
//! bspweb executable that compiled it and its engine's settings
//! ([`build_id`]), so an artifact is only ever read back by the build that
//! wrote it. A file is `MAGIC`, the BLAKE3 hash of the rest, and the rest:
//! wasmtime's serialized module.
//!
//! Reading native code from disk is what [`Module::deserialize`] is unsafe
//! for: the bytes must be an artifact wasmtime wrote. These checks stand
//! behind each load ([`CompileCache::load`]):
//! - the root and build directories are the peer user's own and nobody else
//!   may write them (checked when the cache is opened), and so is the file
//!   (checked on the open file): anyone who could write it already runs code
//!   as that user;
//! - the file's hash matches its contents, so a torn or bit-rotten file is
//!   rejected, not run;
//! - wasmtime itself checks that the artifact's header matches this engine's
//!   version and settings.
//!
//! A file that fails the last two is removed, one that fails the first is
//! left for a person to look at; either way the program is compiled again,
//! so nothing about the cache can fail a job. The whole root is kept under a
//! size limit by removing the least recently used files (a load marks a
//! file used), across builds, so artifacts of old builds age out. Only
//! names the cache writes are ever removed (build directories of 16 hex
//! digits, files of a content address), whatever else the root holds.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use wasmtime::{Engine, Module};

/// The first bytes of every cache file (format version 1).
const MAGIC: &[u8; 8] = b"BSPWEBC1";

/// Extension of cache files.
const EXTENSION: &str = "cwasm";

/// A temporary file older than this was left by a writer that died.
const STALE_TEMPORARY: std::time::Duration = std::time::Duration::from_secs(600);

/// Where a peer keeps compiled programs unless told otherwise: under
/// systemd's `CacheDirectory` (`$CACHE_DIRECTORY`, the first of them), else
/// `$XDG_CACHE_HOME/bspweb`, else `~/.cache/bspweb`, in `compiled/`;
/// `None` without any of these.
pub fn default_root() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let systemd = var("CACHE_DIRECTORY").and_then(|dirs| {
        let first = dirs.to_string_lossy().split(':').next()?.to_string();
        (!first.is_empty()).then(|| PathBuf::from(first))
    });
    let base = if let Some(dir) = systemd {
        dir
    } else if let Some(xdg) = var("XDG_CACHE_HOME") {
        PathBuf::from(xdg).join("bspweb")
    } else {
        PathBuf::from(var("HOME")?).join(".cache/bspweb")
    };
    Some(base.join("compiled"))
}

/// Temporary files this process wrote: with its pid, a unique name.
static TEMPORARIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Why a compile cache could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CacheDirError {
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Inspect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("a compile cache needs Unix file permissions to be kept safe")]
    Unsupported,
    #[error(
        "cannot look at this executable (was it replaced while it runs?), so no compiled program can be known to be its own"
    )]
    UnknownBuild,
    #[error(
        "{path} belongs to user {owner}, not to this peer's user {me}: compiled code is read only from a directory of its own"
    )]
    NotOwned { path: PathBuf, owner: u32, me: u32 },
    #[error(
        "others may write {path} (mode {mode:o}): compiled code is read only from a directory nobody else can write (chmod go-w it, or choose another)"
    )]
    NotPrivate { path: PathBuf, mode: u32 },
}

/// Why a cache file was not loaded (it is then removed).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("it is {0} bytes, too short for a cache file")]
    Short(usize),
    #[error("it does not start with the cache file's magic bytes")]
    Magic,
    #[error("its contents do not match their hash (a torn or damaged file)")]
    Checksum,
}

/// A cache file's bytes for the serialized module `artifact`.
pub fn encode(artifact: &[u8]) -> Vec<u8> {
    let mut file = Vec::with_capacity(MAGIC.len() + 32 + artifact.len());
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(blake3::hash(artifact).as_bytes());
    file.extend_from_slice(artifact);
    file
}

/// The serialized module in a cache file's bytes, if they are whole.
pub fn decode(file: &[u8]) -> Result<&[u8], EntryError> {
    let head = MAGIC.len() + 32;
    if file.len() < head {
        return Err(EntryError::Short(file.len()));
    }
    if &file[..MAGIC.len()] != MAGIC {
        return Err(EntryError::Magic);
    }
    let artifact = &file[head..];
    if blake3::hash(artifact).as_bytes()[..] != file[MAGIC.len()..head] {
        return Err(EntryError::Checksum);
    }
    Ok(artifact)
}

/// One file of the cache, for [`to_evict`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub size: u64,
    /// Last written or loaded.
    pub used: SystemTime,
}

/// Which of `entries` to remove so that the rest take at most `limit`
/// bytes: the least recently used first (ties: the larger first), and no
/// more than needed.
pub fn to_evict(entries: &[Entry], limit: u64) -> Vec<usize> {
    let mut total: u64 = entries.iter().map(|e| e.size).sum();
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&entries[a], &entries[b]);
        a.used.cmp(&b.used).then(b.size.cmp(&a.size))
    });
    let mut out = Vec::new();
    for i in order {
        if total <= limit {
            break;
        }
        total -= entries[i].size;
        out.push(i);
    }
    out
}

/// Whether `hash` can name a cache file: a content address is 64 hex
/// digits, so nothing a job names can reach outside the cache directory.
fn valid_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `name` is one [`build_id`] gives: 16 lowercase hex digits.
fn build_dir_name(name: &str) -> bool {
    name.len() == 16 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// What the cache keeps in a build directory.
#[derive(Debug, PartialEq, Eq)]
enum FileKind {
    /// `HASH.cwasm`.
    Program,
    /// `.HASH.PID.N.tmp`, being written (or left by a writer that died).
    Temporary,
}

/// Which of the cache's files `name` is, if any.
fn file_kind(name: &str) -> Option<FileKind> {
    if let Some(hash) = name.strip_suffix(&format!(".{EXTENSION}")) {
        return valid_hash(hash).then_some(FileKind::Program);
    }
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let hash = rest.split('.').next()?;
    valid_hash(hash).then_some(FileKind::Temporary)
}

/// The name of this build's directory: the bspweb version, the executable's
/// size and modification time (a rebuilt or upgraded binary gets a new
/// directory, as ccache tells compilers apart), and the engine's
/// compatibility settings. `None` when the executable cannot be looked at
/// (say, it was replaced while it runs): then no artifact is trusted to be
/// this build's.
pub fn build_id(engine: &Engine) -> Option<String> {
    use std::hash::{Hash, Hasher};
    let meta = std::fs::metadata(std::env::current_exe().ok()?).ok()?;
    let modified = meta
        .modified()
        .ok()?
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    let mut h = blake3::Hasher::new();
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    h.update(&meta.len().to_le_bytes());
    h.update(&modified.to_le_bytes());
    let mut settings = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut settings);
    h.update(&settings.finish().to_le_bytes());
    Some(h.finalize().to_hex()[..16].to_string())
}

/// Mode bits that let the group or others write.
#[cfg(unix)]
const OTHERS_WRITE: u32 = 0o022;

/// The user this peer runs as (its effective uid).
#[cfg(unix)]
fn my_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Not on this OS: nothing checks who may write the directory.
#[cfg(not(unix))]
fn private_dir(_: &Path) -> Result<(), CacheDirError> {
    Err(CacheDirError::Unsupported)
}

/// Make `dir` (and its parents) if missing, readable and writable by this
/// user only, and check that it is this user's and nobody else may write it.
#[cfg(unix)]
fn private_dir(dir: &Path) -> Result<(), CacheDirError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| CacheDirError::Create {
            path: dir.to_path_buf(),
            source,
        })?;
    let meta = std::fs::metadata(dir).map_err(|source| CacheDirError::Inspect {
        path: dir.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(CacheDirError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    let me = my_uid();
    if meta.uid() != me {
        return Err(CacheDirError::NotOwned {
            path: dir.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    if meta.mode() & OTHERS_WRITE != 0 {
        return Err(CacheDirError::NotPrivate {
            path: dir.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

/// The bytes of `path` if this user owns the file and nobody else may write
/// it, checked on the open file (so a file swapped in after a check is
/// never read); `PermissionDenied` if not.
#[cfg(unix)]
fn read_own(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let mut f = std::fs::File::open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() || meta.uid() != my_uid() || meta.mode() & OTHERS_WRITE != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "it is not a file of this user's that nobody else may write (owner {}, mode {:o})",
                meta.uid(),
                meta.mode() & 0o7777
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Write `bytes` to a new file `path` that only this user may read or
/// write, whatever the umask (a group-writable file would not be loaded).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::File::options();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(path)?;
    f.write_all(bytes)
}

#[cfg(not(unix))]
fn read_own(_: &Path) -> std::io::Result<Vec<u8>> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Compiled programs on disk for one engine (see the module comment).
#[derive(Debug)]
pub struct CompileCache {
    root: PathBuf,
    dir: PathBuf,
    limit: u64,
}

impl CompileCache {
    /// The cache under `root` for `engine`'s build, holding at most `limit`
    /// bytes in all: creates the directories (mode 0700) and refuses a root
    /// or build directory that is not this user's own.
    pub fn open(root: &Path, limit: u64, engine: &Engine) -> Result<CompileCache, CacheDirError> {
        private_dir(root)?;
        let dir = root.join(build_id(engine).ok_or(CacheDirError::UnknownBuild)?);
        private_dir(&dir)?;
        Ok(CompileCache {
            root: root.to_path_buf(),
            dir,
            limit,
        })
    }

    /// The directory this build's files go to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, hash: &str) -> Option<PathBuf> {
        valid_hash(hash).then(|| {
            self.dir
                .join(format!("{}.{EXTENSION}", hash.to_ascii_lowercase()))
        })
    }

    /// The program `hash` as this build compiled it before, if the cache
    /// has it whole. A file that is damaged or that wasmtime refuses is
    /// removed (and the caller compiles).
    pub fn load(&self, engine: &Engine, hash: &str) -> Option<Module> {
        let path = self.path(hash)?;
        let file = match read_own(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!("not loading the compiled program {}: {e}", path.display());
                return None;
            }
        };
        let loaded = decode(&file)
            .map_err(|e| e.to_string())
            .and_then(|artifact| {
                // SAFETY: `artifact` is the contents of a file that this user
                // owns and nobody else may write (checked on the open file by
                // `read_own`), found in this build's directory (also this
                // user's own, checked at `open`), whose hash matched: the
                // `Module::serialize` output of this executable's engine with
                // the same settings, whole. `deserialize` also checks the
                // artifact's header against this engine and errs on a mismatch.
                unsafe { Module::deserialize(engine, artifact) }.map_err(|e| format!("{e:#}"))
            });
        match loaded {
            Ok(module) => {
                // Used now: eviction removes the least recently used.
                if let Ok(f) = std::fs::File::options().write(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Some(module)
            }
            Err(e) => {
                tracing::warn!(
                    "removing the compiled program {}, which cannot be used: {e}",
                    path.display()
                );
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Keep `module`, compiled from program `hash`, for later loads, then
    /// trim the cache to its limit. Failures are logged, not returned: the
    /// program runs either way.
    pub fn store(&self, hash: &str, module: &Module) {
        let Some(path) = self.path(hash) else {
            return;
        };
        let file = match module.serialize() {
            Ok(artifact) => encode(&artifact),
            Err(e) => {
                tracing::warn!("cannot serialize a compiled program: {e:#}");
                return;
            }
        };
        if file.len() as u64 > self.limit {
            tracing::debug!(
                bytes = file.len(),
                "the compiled program is larger than the whole compile cache; not kept"
            );
            return;
        }
        // Written whole under another name, then renamed: a reader sees the
        // old file, the new one or none, never a part.
        let tmp = self.dir.join(format!(
            ".{}.{}.{:x}.tmp",
            hash.to_ascii_lowercase(),
            std::process::id(),
            TEMPORARIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let mut written = write_private(&tmp, &file);
        if written
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        {
            // Another build's peer trimmed this directory away while it
            // was empty: make it again.
            written = private_dir(&self.dir)
                .map_err(std::io::Error::other)
                .and_then(|()| write_private(&tmp, &file));
        }
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &path)) {
            tracing::warn!(
                "cannot keep the compiled program in {}: {e}",
                path.display()
            );
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        self.trim();
    }

    /// Remove the least recently used files of every build until the root
    /// holds at most the limit, temporary files that writers left behind,
    /// and other builds' directories once empty.
    fn trim(&self) {
        let now = SystemTime::now();
        let mut files = Vec::new();
        let mut entries = Vec::new();
        let Ok(builds) = std::fs::read_dir(&self.root) else {
            return;
        };
        for build in builds.flatten() {
            let build_dir = build.path();
            if !build_dir_name(&build.file_name().to_string_lossy()) {
                continue;
            }
            let Ok(list) = std::fs::read_dir(&build_dir) else {
                continue;
            };
            let mut empty = true;
            for f in list.flatten() {
                empty = false;
                let path = f.path();
                let Ok(meta) = f.metadata() else { continue };
                if !meta.is_file() {
                    continue;
                }
                let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                match file_kind(&f.file_name().to_string_lossy()) {
                    Some(FileKind::Temporary) => {
                        if now.duration_since(used).unwrap_or_default() > STALE_TEMPORARY {
                            let _ = std::fs::remove_file(&path);
                        }
                        continue;
                    }
                    Some(FileKind::Program) => {}
                    None => continue,
                }
                entries.push(Entry {
                    size: meta.len(),
                    used,
                });
                files.push(path);
            }
            if empty && build_dir != self.dir {
                let _ = std::fs::remove_dir(&build_dir);
            }
        }
        for i in to_evict(&entries, self.limit) {
            tracing::debug!(file = %files[i].display(), "compile cache full: removing the least recently used program");
            let _ = std::fs::remove_file(&files[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_file_decodes_to_what_was_encoded_and_a_damaged_one_does_not() {
        let artifact = b"\x7fELF and then some code".to_vec();
        let file = encode(&artifact);
        assert_eq!(decode(&file), Ok(&artifact[..]));
        for i in 0..file.len() {
            let mut bad = file.clone();
            bad[i] ^= 0x10;
            let want = if i < MAGIC.len() {
                EntryError::Magic
            } else {
                EntryError::Checksum
            };
            assert_eq!(decode(&bad), Err(want), "byte {i} flipped");
        }
        for n in 0..MAGIC.len() + 32 {
            assert_eq!(decode(&file[..n]), Err(EntryError::Short(n)));
        }
        assert_eq!(
            decode(&file[..file.len() - 1]),
            Err(EntryError::Checksum),
            "a torn file"
        );
    }

    #[test]
    fn trimming_touches_only_the_names_the_cache_writes() {
        let h = "ab".repeat(32);
        assert_eq!(file_kind(&format!("{h}.cwasm")), Some(FileKind::Program));
        assert_eq!(
            file_kind(&format!(".{h}.123.7.tmp")),
            Some(FileKind::Temporary)
        );
        for other in [
            "notes.txt",
            "x.cwasm",
            ".x.tmp",
            "cwasm",
            &format!("{h}.wasm"),
        ] {
            assert_eq!(file_kind(other), None, "{other}");
        }
        assert!(build_dir_name("0123456789abcdef"));
        for other in [
            "0123456789ABCDEF",
            "0123456789abcde",
            "fontconfig",
            "0123456789abcdefg",
        ] {
            assert!(!build_dir_name(other), "{other}");
        }
        // A root shared with other things: only the cache's files go.
        let engine = engine();
        let root = tempfile::tempdir().expect("tempdir");
        let theirs = root.path().join("fontconfig");
        std::fs::create_dir(&theirs).expect("mkdir");
        std::fs::write(theirs.join(format!("{h}.cwasm")), b"not ours").expect("write");
        let empty_theirs = root.path().join("empty");
        std::fs::create_dir(&empty_theirs).expect("mkdir");
        let cache = CompileCache::open(root.path(), 0, &engine).expect("open");
        let m = Module::new(&engine, tiny_wasm()).expect("compile");
        let old = root.path().join("00000000000000aa");
        std::fs::create_dir(&old).expect("mkdir");
        cache.store(&h, &m);
        cache.trim();
        assert!(theirs.join(format!("{h}.cwasm")).exists());
        assert!(empty_theirs.exists());
        assert!(!old.exists(), "another build's empty directory goes");
        assert!(cache.dir().exists());
        // Its own, trimmed away by a peer of another build while empty,
        // comes back at the next store.
        let roomy = CompileCache::open(root.path(), 1 << 30, &engine).expect("open");
        std::fs::remove_dir_all(roomy.dir()).expect("rm");
        roomy.store(&h, &m);
        assert!(roomy.load(&engine, &h).is_some());
    }

    #[test]
    fn only_content_addresses_name_files() {
        assert!(valid_hash(&"ab".repeat(32)));
        assert!(valid_hash(&"AB".repeat(32)));
        for bad in [
            "",
            "../../etc/passwd",
            &"a".repeat(63),
            &"a".repeat(65),
            &format!("{}/", "a".repeat(63)),
            &format!("{}g", "a".repeat(63)),
        ] {
            assert!(!valid_hash(bad), "{bad}");
        }
    }

    fn entries() -> impl Strategy<Value = Vec<Entry>> {
        proptest::collection::vec((0u64..1000, 0u64..50), 0..20).prop_map(|v| {
            v.into_iter()
                .map(|(size, t)| Entry {
                    size,
                    used: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(t),
                })
                .collect()
        })
    }

    proptest! {
        /// Against a reference model: remove the oldest (then largest)
        /// entry while over the limit.
        #[test]
        fn eviction_removes_the_least_recently_used_until_under_the_limit(
            es in entries(),
            limit in 0u64..5000,
        ) {
            let got = to_evict(&es, limit);
            let mut model: Vec<usize> = (0..es.len()).collect();
            let mut removed = Vec::new();
            while model.iter().map(|&i| es[i].size).sum::<u64>() > limit {
                let (k, _) = model
                    .iter()
                    .enumerate()
                    .min_by(|&(_, &a), &(_, &b)| {
                        es[a].used.cmp(&es[b].used).then(es[b].size.cmp(&es[a].size))
                    })
                    .expect("over the limit, so not empty");
                removed.push(model.remove(k));
            }
            let sizes = |v: &[usize]| v.iter().map(|&i| (es[i].used, es[i].size)).collect::<Vec<_>>();
            // Equal (used, size) pairs are interchangeable.
            prop_assert_eq!(sizes(&got), sizes(&removed));
            let kept: u64 = (0..es.len()).filter(|i| !got.contains(i)).map(|i| es[i].size).sum();
            prop_assert!(kept <= limit);
        }
    }

    fn engine() -> Engine {
        Engine::default()
    }

    fn tiny_wasm() -> Vec<u8> {
        wat::parse_str(r#"(module (func (export "f") (result i32) i32.const 42))"#).expect("wat")
    }

    fn call_f(engine: &Engine, m: &Module) -> i32 {
        let mut store = wasmtime::Store::new(engine, ());
        let instance = wasmtime::Instance::new(&mut store, m, &[]).expect("instantiate");
        let f = instance
            .get_typed_func::<(), i32>(&mut store, "f")
            .expect("f");
        f.call(&mut store, ()).expect("call")
    }

    #[test]
    fn a_stored_module_loads_and_runs_and_a_damaged_file_is_removed() {
        let engine = engine();
        let root = tempfile::tempdir().expect("tempdir");
        let cache = CompileCache::open(root.path(), 1 << 30, &engine).expect("open");
        let hash = "c".repeat(64);
        assert!(cache.load(&engine, &hash).is_none(), "empty");
        let m = Module::new(&engine, tiny_wasm()).expect("compile");
        cache.store(&hash, &m);
        // Private whatever the umask: a file others may write is not loaded.
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(cache.path(&hash).expect("path"))
                .expect("stored")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let loaded = cache.load(&engine, &hash).expect("stored");
        assert_eq!(call_f(&engine, &loaded), 42);

        // One byte of the code flipped: rejected, removed, not run.
        let path = cache.path(&hash).expect("path");
        let mut bytes = std::fs::read(&path).expect("read");
        let n = bytes.len();
        bytes[n - 100] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        assert!(cache.load(&engine, &hash).is_none());
        assert!(!path.exists(), "the damaged file is removed");

        // A file of another engine's settings, hash intact: wasmtime refuses it.
        let other = {
            let mut c = wasmtime::Config::new();
            c.epoch_interruption(true);
            Engine::new(&c).expect("engine")
        };
        let foreign = Module::new(&other, tiny_wasm()).expect("compile");
        std::fs::write(&path, encode(&foreign.serialize().expect("serialize"))).expect("write");
        assert!(cache.load(&engine, &hash).is_none());
        assert!(!path.exists());

        // A file others may write is not read (nor removed: who else wrote
        // it is for a person to look into).
        use std::os::unix::fs::PermissionsExt;
        cache.store(&hash, &m);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert!(cache.load(&engine, &hash).is_none());
        assert!(path.exists());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(
            cache.load(&engine, &hash).is_some(),
            "and is once it is private"
        );
        std::fs::remove_file(&path).expect("rm");

        // Names that are not content addresses are neither read nor written.
        cache.store("../escape", &m);
        assert!(cache.load(&engine, "../escape").is_none());
        assert_eq!(
            std::fs::read_dir(cache.dir()).expect("list").count(),
            0,
            "nothing written"
        );
    }

    #[test]
    fn the_cache_stays_under_its_limit_dropping_the_least_recently_used() {
        let engine = engine();
        let root = tempfile::tempdir().expect("tempdir");
        let m = Module::new(&engine, tiny_wasm()).expect("compile");
        let size = encode(&m.serialize().expect("serialize")).len() as u64;
        // Room for two files.
        let cache = CompileCache::open(root.path(), 2 * size + size / 2, &engine).expect("open");
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        cache.store(&a, &m);
        cache.store(&b, &m);
        // `a` used after `b` was written: `b` is the least recently used.
        let old = SystemTime::now() - std::time::Duration::from_secs(60);
        let set = |h: &str, t: SystemTime| {
            std::fs::File::options()
                .write(true)
                .open(cache.path(h).expect("path"))
                .expect("open")
                .set_modified(t)
                .expect("set mtime");
        };
        set(&a, old);
        set(&b, old + std::time::Duration::from_secs(1));
        assert!(cache.load(&engine, &a).is_some());
        cache.store(&c, &m);
        assert!(cache.load(&engine, &a).is_some(), "recently used: kept");
        assert!(cache.load(&engine, &c).is_some(), "just written: kept");
        assert!(
            cache.load(&engine, &b).is_none(),
            "least recently used: removed"
        );
    }

    #[test]
    fn a_directory_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let engine = engine();
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("cache");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = CompileCache::open(&dir, 1 << 20, &engine).expect_err("world-writable");
        assert!(
            matches!(e, CacheDirError::NotPrivate { mode: 0o777, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("chmod go-w"), "{e}");
        // A file where the directory should be.
        let file = root.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        let e = CompileCache::open(&file, 1 << 20, &engine).expect_err("a file");
        assert!(matches!(e, CacheDirError::Create { .. }), "{e}");
    }
}
