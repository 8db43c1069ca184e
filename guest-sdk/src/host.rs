//! Safe wrappers around the `bspweb_v1` host functions.
//!
//! On `wasm32` they call the imports; on every other target they panic,
//! because a bspweb program runs only inside a peer. The crate still builds
//! natively so that its pure parts ([`crate::Rng`], [`crate::dist`]) can be
//! used and tested there.

/// Constants of the `bspweb_v1` ABI, copied from `bspweb-abi` (which the
/// guest does not link, to keep `wasmparser` out of guest builds). The
/// `bspweb-programs` tests check that both copies agree.
#[doc(hidden)]
pub mod abi {
    /// The import module name.
    pub const HOST_MODULE: &str = "bspweb_v1";
    /// `bspweb_resume` status: the process reached `sync`.
    pub const STATUS_SYNC: i32 = 0;
    /// `bspweb_resume` status: `main` returned normally.
    pub const STATUS_DONE: i32 = 1;
    /// `bspweb_resume` status: a `may_migrate` point.
    pub const STATUS_YIELD: i32 = 2;
    /// `print` stream: standard output.
    pub const STREAM_STDOUT: i32 = 1;
    /// `print` stream: standard error.
    pub const STREAM_STDERR: i32 = 2;
    /// Error code: a destination pid is not a process of this job.
    pub const ERR_BAD_PID: i32 = -1;
    /// Error code: an empty or out-of-range pid range.
    pub const ERR_BAD_RANGE: i32 = -2;
    /// Error code: a message larger than [`MAX_MESSAGE_BYTES`].
    pub const ERR_TOO_LARGE: i32 = -3;
    /// Error code: no message or resource with that index or name.
    pub const ERR_NOT_FOUND: i32 = -4;
    /// Largest single message payload.
    pub const MAX_MESSAGE_BYTES: usize = 8 << 20;
}

#[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
compile_error!(
    "bspweb guests are single-threaded: build for `wasm32-unknown-unknown` without the `atomics` target feature"
);

#[cfg(target_arch = "wasm32")]
mod imp {
    #[link(wasm_import_module = "bspweb_v1")]
    unsafe extern "C" {
        fn pid() -> i32;
        fn nprocs() -> i32;
        fn superstep() -> i32;
        fn seed() -> i64;
        fn args_len() -> i32;
        fn args_read(dst: *mut u8);
        fn send(pid: i32, ptr: *const u8, len: usize) -> i32;
        fn send_range(lo: i32, hi: i32, ptr: *const u8, len: usize) -> i32;
        fn send_list(pids: *const u32, npids: usize, ptr: *const u8, len: usize) -> i32;
        fn msg_count() -> i32;
        fn msg_info(index: i32, out: *mut u32) -> i32;
        fn msg_read(index: i32, dst: *mut u8) -> i32;
        fn set_tag(tag: i32);
        fn msg_tag(index: i32) -> i64;
        fn print(stream: i32, ptr: *const u8, len: usize) -> i32;
        fn write_raw(ptr: *const u8, len: usize) -> i32;
        fn flush() -> i32;
        fn abort(ptr: *const u8, len: usize);
        fn resource_len(name: *const u8, name_len: usize) -> i64;
        fn resource_read(name: *const u8, name_len: usize, dst: *mut u8) -> i32;
    }

    // SAFETY (for every wrapper below): the host reads or writes only the
    // ranges described by the pointer/length pairs we pass, which come from
    // live Rust slices of exactly that length; functions without pointers
    // have no preconditions.

    pub fn get_pid() -> i32 {
        // SAFETY: see above.
        unsafe { pid() }
    }
    pub fn get_nprocs() -> i32 {
        // SAFETY: see above.
        unsafe { nprocs() }
    }
    pub fn get_superstep() -> i32 {
        // SAFETY: see above.
        unsafe { superstep() }
    }
    pub fn get_seed() -> i64 {
        // SAFETY: see above.
        unsafe { seed() }
    }
    pub fn args() -> Vec<u8> {
        // SAFETY: see above.
        let len = usize::try_from(unsafe { args_len() }).unwrap_or(0);
        let mut buf = vec![0u8; len];
        if len > 0 {
            // SAFETY: `buf` has exactly `args_len()` writable bytes.
            unsafe { args_read(buf.as_mut_ptr()) };
        }
        buf
    }
    pub fn send_to(pid: u32, data: &[u8]) -> i32 {
        // SAFETY: see above.
        unsafe { send(pid as i32, data.as_ptr(), data.len()) }
    }
    pub fn send_to_range(lo: u32, hi: u32, data: &[u8]) -> i32 {
        // SAFETY: see above.
        unsafe { send_range(lo as i32, hi as i32, data.as_ptr(), data.len()) }
    }
    pub fn send_to_list(pids: &[u32], data: &[u8]) -> i32 {
        // SAFETY: see above; `u32` is little-endian on wasm32, as the ABI
        // requires for the pid array.
        unsafe { send_list(pids.as_ptr(), pids.len(), data.as_ptr(), data.len()) }
    }
    pub fn message_count() -> i32 {
        // SAFETY: see above.
        unsafe { msg_count() }
    }
    pub fn message_info(index: u32) -> Result<[u32; 3], i32> {
        let mut out = [0u32; 3];
        // SAFETY: `out` has 12 writable bytes, as `msg_info` writes.
        let rc = unsafe { msg_info(index as i32, out.as_mut_ptr()) };
        if rc < 0 { Err(rc) } else { Ok(out) }
    }
    pub fn message_read(index: u32, dst: &mut [u8]) -> i32 {
        // SAFETY: the caller sized `dst` with the length `msg_info` reported.
        unsafe { msg_read(index as i32, dst.as_mut_ptr()) }
    }
    pub fn send_tag(tag: u32) {
        // SAFETY: see above.
        unsafe { set_tag(tag as i32) }
    }
    pub fn message_tag(index: u32) -> i64 {
        // SAFETY: see above.
        unsafe { msg_tag(index as i32) }
    }
    pub fn print_line(stream: i32, line: &[u8]) -> i32 {
        // SAFETY: see above.
        unsafe { print(stream, line.as_ptr(), line.len()) }
    }
    pub fn raw(data: &[u8]) -> i32 {
        // SAFETY: see above.
        unsafe { write_raw(data.as_ptr(), data.len()) }
    }
    pub fn flush_output() -> i32 {
        // SAFETY: see above.
        unsafe { flush() }
    }
    pub fn abort_with(reason: &str) -> ! {
        // SAFETY: see above.
        unsafe { abort(reason.as_ptr(), reason.len()) };
        // The host's `abort` traps and never returns.
        core::arch::wasm32::unreachable()
    }
    pub fn resource_size(name: &str) -> i64 {
        // SAFETY: see above.
        unsafe { resource_len(name.as_ptr(), name.len()) }
    }
    pub fn resource_copy(name: &str, dst: &mut [u8]) -> i32 {
        // SAFETY: the caller sized `dst` with the length `resource_len`
        // reported for this name.
        unsafe { resource_read(name.as_ptr(), name.len(), dst.as_mut_ptr()) }
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    //! Native stand-ins: every call panics with the same message.

    const NATIVE: &str = "bspweb programs run only inside a bspweb peer (wasm32)";

    pub fn unsupported() -> ! {
        panic!("{NATIVE}")
    }
    pub fn get_pid() -> i32 {
        unsupported()
    }
    pub fn get_nprocs() -> i32 {
        unsupported()
    }
    pub fn get_superstep() -> i32 {
        unsupported()
    }
    pub fn get_seed() -> i64 {
        unsupported()
    }
    pub fn args() -> Vec<u8> {
        unsupported()
    }
    pub fn send_to(_pid: u32, _data: &[u8]) -> i32 {
        unsupported()
    }
    pub fn send_to_range(_lo: u32, _hi: u32, _data: &[u8]) -> i32 {
        unsupported()
    }
    pub fn send_to_list(_pids: &[u32], _data: &[u8]) -> i32 {
        unsupported()
    }
    pub fn message_count() -> i32 {
        unsupported()
    }
    pub fn message_info(_index: u32) -> Result<[u32; 3], i32> {
        unsupported()
    }
    pub fn message_read(_index: u32, _dst: &mut [u8]) -> i32 {
        unsupported()
    }
    pub fn send_tag(_tag: u32) {
        unsupported()
    }
    pub fn message_tag(_index: u32) -> i64 {
        unsupported()
    }
    pub fn print_line(_stream: i32, _line: &[u8]) -> i32 {
        unsupported()
    }
    pub fn raw(_data: &[u8]) -> i32 {
        unsupported()
    }
    pub fn flush_output() -> i32 {
        unsupported()
    }
    pub fn abort_with(_reason: &str) -> ! {
        unsupported()
    }
    pub fn resource_size(_name: &str) -> i64 {
        unsupported()
    }
    pub fn resource_copy(_name: &str, _dst: &mut [u8]) -> i32 {
        unsupported()
    }
}

pub(crate) use imp::*;
