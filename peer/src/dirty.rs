//! Which 4 KiB leaves of a process's linear memory were written since its
//! last checkpoint, from the kernel, so a capture need not hash the leaves that
//! stay the same superstep after superstep (a program's input, its code's
//! data, a graph it built once).
//!
//! Linux 6.7 and later: the memory is registered with a `userfaultfd` in
//! asynchronous write-protect mode (`UFFD_FEATURE_WP_ASYNC`, with
//! `UFFD_FEATURE_WP_UNPOPULATED` so never-touched pages count too). A
//! write-protected page that is written takes one minor fault, which the
//! kernel resolves on its own (no thread of ours is involved), and the page
//! is then *written*; `PAGEMAP_SCAN` on `/proc/self/pagemap` lists the
//! written pages of a range and protects them again in the same call.
//!
//! A fault costs about as much as hashing a few pages (0.7 µs per 4 KiB
//! page measured here, where XXH3 hashes 4 KiB in 0.12 µs), so only *cold*
//! pages are protected: 4 KiB leaves (the kernel's pages; a checkpoint's
//! 64 KiB page has sixteen) that were the same at [`COLD_AFTER`] captures
//! in a row. Leaves written at every superstep stay unprotected and are
//! hashed at each capture, as without tracking; the quiet leaves of the
//! same 64 KiB page are not (a page holding a stack or a counter used to
//! be hashed whole). A cold leaf that changes becomes hot again.
//!
//! Anything unexpected (another OS, an older kernel, a sandbox that forbids
//! `userfaultfd`, a failed call) turns tracking off for the process: every
//! page is then hashed at every capture, which is always correct. The
//! environment variable `BSPWEB_NO_WRITE_TRACKING` (any value) turns it off
//! for a whole peer.

use std::ops::Range;

use crate::checkpoint::LEAF_SIZE;

/// The unit of tracking: a 4 KiB leaf of a checkpoint page
/// ([`crate::checkpoint::LEAF_SIZE`]), the kernel's page.
const UNIT: usize = LEAF_SIZE;
// Protection and `PAGEMAP_SCAN` work in whole kernel pages (`page_size`).
const _: () = assert!(UNIT.is_multiple_of(4096));

/// Leaves the same at this many captures in a row are write-protected
/// (doubled each time a protected page turns out to be written, up to 32
/// times: a page written every superstep with the same bytes, such as a
/// buffer zeroed before each sync, soon stops taking faults).
pub const COLD_AFTER: u8 = 3;

/// The write tracking of one process's memory, between two captures.
#[derive(Debug)]
pub struct Tracking {
    uffd: sys::Uffd,
    /// The memory's address and the bytes registered from it.
    base: usize,
    registered: usize,
    /// Per 4 KiB leaf: protected (cold); captures in a row unchanged;
    /// times it was found written while protected; written while protected
    /// since the last capture.
    cold: Vec<bool>,
    quiet: Vec<u8>,
    strikes: Vec<u8>,
    reported: Vec<bool>,
    /// The capture (superstep, hash) this record starts at.
    since: Option<(u32, [u8; 32])>,
}

impl Tracking {
    /// Tracking for a memory, if this system offers it (see the module
    /// comment); `None` means every page is hashed at every capture.
    pub fn new() -> Option<Tracking> {
        if std::env::var_os("BSPWEB_NO_WRITE_TRACKING").is_some() {
            return None;
        }
        Some(Tracking {
            uffd: sys::Uffd::new()?,
            base: 0,
            registered: 0,
            cold: Vec::new(),
            quiet: Vec::new(),
            strikes: Vec::new(),
            reported: Vec::new(),
            since: None,
        })
    }

    /// The leaves of `memory` that may have changed since the capture
    /// `last` (the page tracker's last capture): all of them unless this
    /// record started there, with the same memory. `None`: tracking failed
    /// and is off.
    pub fn may_have_changed(
        &mut self,
        memory: &[u8],
        last: Option<(u32, [u8; 32])>,
    ) -> Option<Vec<bool>> {
        let n = memory.len().div_ceil(UNIT);
        let mut out = vec![true; n];
        self.reported.clear();
        self.reported.resize(self.cold.len(), false);
        if last.is_none() || last != self.since || memory.as_ptr() as usize != self.base {
            return Some(out);
        }
        // Hot pages are read anyway; the cold ones were written if the
        // kernel says so (and are protected again by the same call).
        let mut i = 0;
        let cold_pages = self.cold.len().min(n);
        while i < cold_pages {
            if !self.cold[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < cold_pages && self.cold[i] {
                out[i] = false;
                i += 1;
            }
            let range = self.base + start * UNIT..self.base + i * UNIT;
            for w in self.uffd.written(range).ok()? {
                let first = (w.start - self.base) / UNIT;
                let last = (w.end - 1 - self.base) / UNIT;
                let pages = first..=last.min(n - 1);
                for flag in &mut out[pages.clone()] {
                    *flag = true;
                }
                for flag in &mut self.reported[pages] {
                    *flag = true;
                }
            }
        }
        Some(out)
    }

    /// After a capture `at` of `memory` (`changed(k)`: leaf `k` changed at
    /// it): protect the leaves that have been the same long enough, release
    /// the cold ones that were written, and register memory that grew.
    /// `false`: tracking failed and is off.
    pub fn after_capture(
        &mut self,
        memory: &[u8],
        at: Option<(u32, [u8; 32])>,
        changed: impl Fn(usize) -> bool,
    ) -> bool {
        let n = memory.len().div_ceil(UNIT);
        let base = memory.as_ptr() as usize;
        let restart = at.is_none() || base != self.base || self.since.is_none();
        if restart {
            // A new record: everything hot. (A moved memory was unmapped,
            // and its registration with it.)
            self.base = base;
            self.registered = 0;
            self.cold.clear();
            self.quiet.clear();
            self.strikes.clear();
            self.reported.clear();
        }
        self.since = None;
        let Some(at) = at else { return true };
        if memory.is_empty() || !base.is_multiple_of(page_size()) {
            self.since = Some(at);
            return true;
        }
        if self.registered < memory.len() {
            let from = self.base + self.registered;
            if self.uffd.register(from..self.base + memory.len()).is_err() {
                return false;
            }
            self.registered = memory.len();
        }
        self.cold.resize(n, false);
        self.quiet.resize(n, 0);
        self.strikes.resize(n, 0);
        self.reported.resize(n, false);
        // Page runs to release and to protect, merged (one call per run).
        let (mut release, mut protect): (Vec<Range<usize>>, Vec<Range<usize>>) = (vec![], vec![]);
        let add = |runs: &mut Vec<Range<usize>>, i: usize| match runs.last_mut() {
            Some(r) if r.end == i => r.end = i + 1,
            _ => runs.push(i..i + 1),
        };
        for i in 0..n {
            if self.cold[i] {
                if self.reported[i] || changed(i) {
                    self.cold[i] = false;
                    self.quiet[i] = 0;
                    self.strikes[i] = self.strikes[i].saturating_add(1);
                    add(&mut release, i);
                }
            } else if changed(i) {
                self.quiet[i] = 0;
            } else {
                self.quiet[i] = self.quiet[i].saturating_add(1);
                let needed = COLD_AFTER.saturating_mul(1 << self.strikes[i].min(5));
                if self.quiet[i] >= needed {
                    self.cold[i] = true;
                    self.quiet[i] = 0;
                    add(&mut protect, i);
                }
            }
        }
        let pages = |r: &Range<usize>| self.base + r.start * UNIT..self.base + r.end * UNIT;
        for r in &release {
            if self.uffd.protect(pages(r), false).is_err() {
                return false;
            }
        }
        for r in &protect {
            if self.uffd.protect(pages(r), true).is_err() {
                return false;
            }
        }
        self.since = Some(at);
        true
    }

    /// 4 KiB leaves protected now.
    pub fn cold_pages(&self) -> usize {
        self.cold.iter().filter(|&&c| c).count()
    }

    #[cfg(test)]
    fn is_cold(&self, page: usize) -> bool {
        self.cold.get(page) == Some(&true)
    }
}

fn page_size() -> usize {
    4096
}

#[cfg(not(target_os = "linux"))]
mod sys {
    //! No write tracking off Linux: [`Uffd::new`] says so.

    use std::io;
    use std::ops::Range;

    #[derive(Debug)]
    pub struct Uffd;

    impl Uffd {
        pub fn new() -> Option<Uffd> {
            None
        }

        pub fn register(&self, _: Range<usize>) -> io::Result<()> {
            Err(io::ErrorKind::Unsupported.into())
        }

        pub fn protect(&self, _: Range<usize>, _: bool) -> io::Result<()> {
            Err(io::ErrorKind::Unsupported.into())
        }

        pub fn written(&self, _: Range<usize>) -> io::Result<Vec<Range<usize>>> {
            Err(io::ErrorKind::Unsupported.into())
        }
    }
}

#[cfg(target_os = "linux")]
mod sys {
    //! The system calls, each a thin checked wrapper.

    use std::fs::File;
    use std::io;
    use std::ops::Range;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::OnceLock;

    const UFFD_API: u64 = 0xAA;
    const UFFD_USER_MODE_ONLY: libc::c_int = 1;
    const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
    const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
    const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
    const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
    const PAGE_IS_WRITTEN: u64 = 1 << 1;
    const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
    const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

    /// `_IOWR(type, nr, size)` on x86-64, aarch64 and riscv64 (the generic
    /// ioctl encoding; other architectures turn tracking off).
    const fn iowr(kind: u64, nr: u64, size: usize) -> u64 {
        (3 << 30) | ((size as u64) << 16) | (kind << 8) | nr
    }

    #[repr(C)]
    struct UffdioApi {
        api: u64,
        features: u64,
        ioctls: u64,
    }

    #[repr(C)]
    struct UffdioRange {
        start: u64,
        len: u64,
    }

    #[repr(C)]
    struct UffdioRegister {
        range: UffdioRange,
        mode: u64,
        ioctls: u64,
    }

    #[repr(C)]
    struct UffdioWriteprotect {
        range: UffdioRange,
        mode: u64,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct PageRegion {
        start: u64,
        end: u64,
        categories: u64,
    }

    #[repr(C)]
    struct PmScanArg {
        size: u64,
        flags: u64,
        start: u64,
        end: u64,
        walk_end: u64,
        vec: u64,
        vec_len: u64,
        max_pages: u64,
        category_inverted: u64,
        category_mask: u64,
        category_anyof_mask: u64,
        return_mask: u64,
    }

    const UFFDIO_API: u64 = iowr(0xAA, 0x3F, std::mem::size_of::<UffdioApi>());
    const UFFDIO_REGISTER: u64 = iowr(0xAA, 0x00, std::mem::size_of::<UffdioRegister>());
    const UFFDIO_WRITEPROTECT: u64 = iowr(0xAA, 0x06, std::mem::size_of::<UffdioWriteprotect>());
    const PAGEMAP_SCAN: u64 = iowr(b'f' as u64, 16, std::mem::size_of::<PmScanArg>());

    /// A userfaultfd in asynchronous write-protect mode and the pagemap to
    /// scan.
    #[derive(Debug)]
    pub struct Uffd {
        fd: OwnedFd,
    }

    /// `/proc/self/pagemap`, opened once for the whole peer (one descriptor
    /// however many processes it runs).
    fn pagemap() -> Option<&'static File> {
        static PAGEMAP: OnceLock<Option<File>> = OnceLock::new();
        PAGEMAP
            .get_or_init(|| File::open("/proc/self/pagemap").ok())
            .as_ref()
    }

    /// A fresh private anonymous read-write mapping of `len` bytes (the
    /// caller unmaps it), as wasm memories are.
    pub fn map_anonymous(len: usize) -> Option<*mut u8> {
        // SAFETY: a new mapping chosen by the kernel; it aliases nothing.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (ptr != libc::MAP_FAILED).then_some(ptr as *mut u8)
    }

    /// `ioctl(fd, request, arg)`, its error as an `io::Error`.
    ///
    /// # Safety
    ///
    /// `arg` must be the structure `request` takes, valid for reads and
    /// writes for the call.
    unsafe fn ioctl<T>(fd: &impl AsRawFd, request: u64, arg: &mut T) -> io::Result<libc::c_int> {
        // SAFETY: the caller passes the structure the request takes; the
        // kernel reads and writes only within it.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg as *mut T) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    impl Uffd {
        /// The descriptor, if the kernel offers asynchronous write
        /// protection of never-touched pages and `PAGEMAP_SCAN`, checked on
        /// a scratch mapping of our own.
        pub fn new() -> Option<Uffd> {
            if !cfg!(any(
                target_arch = "x86_64",
                target_arch = "aarch64",
                target_arch = "riscv64"
            )) {
                return None;
            }
            let flags = libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY;
            // SAFETY: userfaultfd takes only flags and returns a new
            // descriptor or -1.
            let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
            if fd < 0 {
                return None;
            }
            // SAFETY: a descriptor the call just created and nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
            let wanted = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED;
            let mut api = UffdioApi {
                api: UFFD_API,
                features: wanted,
                ioctls: 0,
            };
            // SAFETY: UFFDIO_API takes a `struct uffdio_api`.
            unsafe { ioctl(&fd, UFFDIO_API, &mut api) }.ok()?;
            if api.features & wanted != wanted {
                return None;
            }
            pagemap()?;
            let uffd = Uffd { fd };
            uffd.self_test().then_some(uffd)
        }

        /// Protect three scratch pages, write the second: the scan must
        /// name exactly it (an untouched page included, so never-touched
        /// pages are seen to be protected too).
        fn self_test(&self) -> bool {
            let page = super::page_size();
            let len = 3 * page;
            let Some(ptr) = map_anonymous(len) else {
                return false;
            };
            let base = ptr as usize;
            let ok = (|| -> io::Result<bool> {
                // SAFETY: `base` is the start of the `len` bytes mapped above.
                unsafe { std::ptr::write_volatile(ptr, 1) };
                self.register(base..base + len)?;
                self.protect(base..base + len, true)?;
                let before = self.written(base..base + len)?;
                // SAFETY: the second page of our mapping; the kernel resolves
                // the write-protect fault itself (asynchronous mode).
                unsafe { std::ptr::write_volatile((base + page) as *mut u8, 7) };
                let after = self.written(base..base + len)?;
                let again = self.written(base..base + len)?;
                let second = base + page..base + 2 * page;
                Ok(before.is_empty() && after.len() == 1 && after[0] == second && again.is_empty())
            })();
            // SAFETY: the mapping made above, not used after this.
            unsafe { libc::munmap(ptr as *mut libc::c_void, len) };
            matches!(ok, Ok(true))
        }

        /// Register `range` (page-aligned, mapped) for write protection.
        pub fn register(&self, range: Range<usize>) -> io::Result<()> {
            let mut reg = UffdioRegister {
                range: UffdioRange {
                    start: range.start as u64,
                    len: (range.end - range.start) as u64,
                },
                mode: UFFDIO_REGISTER_MODE_WP,
                ioctls: 0,
            };
            // SAFETY: UFFDIO_REGISTER takes a `struct uffdio_register`.
            // Registering changes no memory and no mapping's contents.
            unsafe { ioctl(&self.fd, UFFDIO_REGISTER, &mut reg) }.map(drop)
        }

        /// Write-protect `range` (or lift the protection). Contents are
        /// untouched; a write to a protected page only takes a fault that
        /// the kernel resolves itself (asynchronous mode).
        pub fn protect(&self, range: Range<usize>, on: bool) -> io::Result<()> {
            let mut wp = UffdioWriteprotect {
                range: UffdioRange {
                    start: range.start as u64,
                    len: (range.end - range.start) as u64,
                },
                mode: if on { UFFDIO_WRITEPROTECT_MODE_WP } else { 0 },
            };
            // SAFETY: UFFDIO_WRITEPROTECT takes a `struct uffdio_writeprotect`.
            unsafe { ioctl(&self.fd, UFFDIO_WRITEPROTECT, &mut wp) }.map(drop)
        }

        /// The written parts of `range` (a registered range), protected again.
        pub fn written(&self, range: Range<usize>) -> io::Result<Vec<Range<usize>>> {
            let pagemap = pagemap().ok_or_else(|| io::Error::other("no /proc/self/pagemap"))?;
            let mut out = Vec::new();
            let mut regions = [PageRegion::default(); 64];
            let mut start = range.start as u64;
            while start < range.end as u64 {
                let mut arg = PmScanArg {
                    size: std::mem::size_of::<PmScanArg>() as u64,
                    flags: PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
                    start,
                    end: range.end as u64,
                    walk_end: 0,
                    vec: regions.as_mut_ptr() as u64,
                    vec_len: regions.len() as u64,
                    max_pages: 0,
                    category_inverted: 0,
                    category_mask: PAGE_IS_WRITTEN,
                    category_anyof_mask: 0,
                    return_mask: PAGE_IS_WRITTEN,
                };
                // SAFETY: PAGEMAP_SCAN takes a `struct pm_scan_arg` whose
                // `vec` points to `vec_len` page regions we own.
                let found = unsafe { ioctl(pagemap, PAGEMAP_SCAN, &mut arg) }?;
                let found = usize::try_from(found).unwrap_or(0).min(regions.len());
                out.extend(
                    regions[..found]
                        .iter()
                        .map(|r| r.start as usize..r.end as usize),
                );
                if arg.walk_end <= start {
                    return Err(io::Error::other("PAGEMAP_SCAN made no progress"));
                }
                start = arg.walk_end;
            }
            Ok(out)
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A page-aligned anonymous mapping, like a wasm memory.
    struct Mapping {
        ptr: *mut u8,
        len: usize,
    }

    impl Mapping {
        fn new(pages: usize) -> Mapping {
            let len = pages * UNIT;
            let ptr = sys::map_anonymous(len).expect("a scratch mapping");
            Mapping { ptr, len }
        }

        fn bytes(&self) -> &[u8] {
            // SAFETY: `len` mapped bytes, alive as long as `self`.
            unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
        }

        fn write(&self, at: usize, value: u8) {
            assert!(at < self.len);
            // SAFETY: within the mapping.
            unsafe { std::ptr::write_volatile(self.ptr.add(at), value) };
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`.
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        }
    }

    /// Pages written after they went cold are reported; hot pages are
    /// always candidates; a new record (another capture) reads everything.
    #[test]
    fn cold_pages_are_reported_when_written_and_hot_ones_always() {
        let mut t = Tracking::new().expect(
            "write tracking is unavailable: Linux 6.7 or later with userfaultfd \
             (UFFD_USER_MODE_ONLY, WP_ASYNC, WP_UNPOPULATED) and PAGEMAP_SCAN is needed",
        );
        let m = Mapping::new(8);
        let at = |s: u32| Some((s, [s as u8; 32]));
        // Page 0 changes at every capture; the others never.
        let changed = |i: usize| i == 0;
        let mut last = None;
        for s in 0..u32::from(COLD_AFTER) + 1 {
            let may = t.may_have_changed(m.bytes(), last).unwrap();
            if s == 0 {
                assert!(may.iter().all(|&c| c), "a first capture reads everything");
            }
            m.write(0, s as u8);
            assert!(t.after_capture(m.bytes(), at(s), changed));
            last = at(s);
        }
        assert_eq!(t.cold_pages(), 7);
        let may = t.may_have_changed(m.bytes(), last).unwrap();
        assert_eq!(may, [true, false, false, false, false, false, false, false]);
        // A write to a cold page (never touched before) and to the last
        // byte of another.
        m.write(3 * UNIT + 5, 9);
        m.write(6 * UNIT + UNIT - 1, 9);
        let may = t.may_have_changed(m.bytes(), last).unwrap();
        assert_eq!(may, [true, false, false, true, false, false, true, false]);
        // Reported once: the scan protected them again.
        let may = t.may_have_changed(m.bytes(), last).unwrap();
        assert_eq!(may, [true, false, false, false, false, false, false, false]);
        // Another capture than the one the record started at: everything.
        let may = t.may_have_changed(m.bytes(), at(99)).unwrap();
        assert!(may.iter().all(|&c| c));
        // Page 3 changed: hot again, so its writes need no fault to be seen.
        let s = u32::from(COLD_AFTER) + 1;
        assert!(t.after_capture(m.bytes(), at(s), |i| i == 0 || i == 3));
        assert_eq!(t.cold_pages(), 6);
        m.write(3 * UNIT, 1);
        let may = t.may_have_changed(m.bytes(), at(s)).unwrap();
        assert_eq!(may, [true, false, false, true, false, false, false, false]);
    }

    /// A page written at every superstep with the same bytes (a buffer
    /// zeroed before each sync) is never seen to change, but it is not
    /// protected again and again: each time it is found written it must
    /// stay the same twice as long before it is. Never-written pages stay
    /// protected throughout.
    #[test]
    fn a_page_written_with_the_same_bytes_is_protected_less_and_less() {
        let mut t = Tracking::new().expect("write tracking on this system (see the test above)");
        let m = Mapping::new(4);
        let at = |s: u32| Some((s, [s as u8; 32]));
        let (mut last, mut faulted) = (None, 0);
        for s in 0..200u32 {
            let may = t.may_have_changed(m.bytes(), last).unwrap();
            if may[2] && t.is_cold(2) {
                faulted += 1;
            }
            assert!(
                !may[3] || s < u32::from(COLD_AFTER) + 1,
                "page 3 is never written"
            );
            m.write(2 * UNIT, 0);
            assert!(t.after_capture(m.bytes(), at(s), |_| false));
            last = at(s);
        }
        assert!(t.is_cold(3));
        // Protected after 3, 6, 12, 24, 48, 96 quiet captures: 5 times
        // found written within 200 captures, not 50.
        assert!(
            (3..=6).contains(&faulted),
            "page 2 was found written {faulted} times"
        );
    }
}
