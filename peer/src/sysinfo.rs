//! What the peer tells the supernode about its machine: the idle-CPU fraction
//! (from `/proc/stat` deltas, or a file for tests) and a benchmarked speed
//! weight.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Cumulative CPU time of all cores, in `/proc/stat` ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    /// Time available to bspweb: idle, iowait and niced time (bspweb's own
    /// processes run niced, so they do not make the machine look busy).
    pub available: u64,
    /// All time.
    pub total: u64,
}

/// Parse the aggregate `cpu` line of `/proc/stat`.
///
/// Columns: user nice system idle iowait irq softirq steal guest guest_nice.
/// Guest time is already included in user/nice and is not added again.
pub fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|l| {
        let mut w = l.split_whitespace();
        w.next() == Some("cpu")
    })?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse::<u64>())
        .collect::<Result<_, _>>()
        .ok()?;
    if fields.len() < 4 {
        return None;
    }
    let get = |i: usize| fields.get(i).copied().unwrap_or(0);
    let total = (0..8).map(get).fold(0u64, u64::saturating_add);
    let available = get(1).saturating_add(get(3)).saturating_add(get(4));
    Some(CpuTimes { available, total })
}

/// Fraction of CPU time available between two samples, in `[0, 1]`; 1 when
/// no time passed.
pub fn idle_fraction(before: CpuTimes, after: CpuTimes) -> f64 {
    let total = after.total.saturating_sub(before.total);
    if total == 0 {
        return 1.0;
    }
    let available = after.available.saturating_sub(before.available);
    (available as f64 / total as f64).clamp(0.0, 1.0)
}

/// Samples `/proc/stat`; each call reports the idle fraction since the last.
#[derive(Debug, Default)]
pub struct IdleMonitor {
    last: Option<CpuTimes>,
}

impl IdleMonitor {
    /// A monitor that takes its first sample now.
    pub fn new() -> Self {
        IdleMonitor { last: read() }
    }

    /// Idle fraction since the previous sample; 1.0 where `/proc/stat` is
    /// unavailable (non-Linux).
    pub fn sample(&mut self) -> f64 {
        let Some(now) = read() else {
            return 1.0;
        };
        let f = match self.last {
            Some(before) => idle_fraction(before, now),
            None => 1.0,
        };
        self.last = Some(now);
        f
    }
}

/// Parses the contents of an idle file: one number in `[0, 1]`, surrounding
/// white space allowed.
pub fn parse_idle(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let v: f64 = t.parse().map_err(|_| {
        format!(
            "`{}` is not a number",
            t.chars().take(40).collect::<String>()
        )
    })?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not a fraction between 0 and 1"))
    }
}

/// Where the idle fraction reported at each renewal comes from:
/// `/proc/stat`, or a file (`bspweb peer --idle-file`, a test hook to
/// script availability).
#[derive(Debug)]
pub struct IdleSource {
    monitor: IdleMonitor,
    file: Option<PathBuf>,
}

impl IdleSource {
    /// Measure `/proc/stat`, or read `file` when given.
    pub fn new(file: Option<PathBuf>) -> Self {
        IdleSource {
            monitor: IdleMonitor::new(),
            file,
        }
    }

    /// The idle fraction now. With a file, its number; if the file cannot
    /// be read or holds no fraction in `[0, 1]`, a warning is logged and the
    /// measured value is used, so a typo never makes a busy machine look idle.
    pub fn sample(&mut self) -> f64 {
        let measured = self.monitor.sample();
        let Some(path) = &self.file else {
            return measured;
        };
        let read = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| parse_idle(&t));
        match read {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(
                    "cannot use the idle file {}: {e}; reporting the measured idle fraction {measured:.2}",
                    path.display()
                );
                measured
            }
        }
    }
}

fn read() -> Option<CpuTimes> {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| parse_proc_stat(&t))
}

/// Iterations of [`workload`] in one benchmark round.
const ROUND_ITERATIONS: u64 = 14_000_000;

/// How long one round takes on the reference machine, which defines speed
/// 1.0: one core of a 2020s AMD EPYC server (the development machine, about
/// 25 ms per round).
const REFERENCE_ROUND: Duration = Duration::from_millis(25);

/// A fixed integer workload: xorshift, rotates and additions with a data
/// dependency on every step, so it can neither be vectorized nor elided.
pub fn workload(iterations: u64) -> u64 {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut acc: u64 = 0;
    for i in 0..black_box(iterations) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        acc = acc.wrapping_add(x.rotate_left((i & 63) as u32) ^ i);
    }
    black_box(acc)
}

/// Benchmark this machine (about 100 ms): the speed weight relative to the
/// reference machine, the best of four rounds.
pub fn benchmark() -> f64 {
    let best = (0..4)
        .map(|_| {
            let t = Instant::now();
            workload(ROUND_ITERATIONS);
            t.elapsed()
        })
        .min()
        .unwrap_or(REFERENCE_ROUND);
    let best = best.max(Duration::from_micros(1));
    REFERENCE_ROUND.as_secs_f64() / best.as_secs_f64()
}

/// Give the memory the allocator holds but no longer uses back to the
/// operating system (glibc keeps freed heap memory for reuse, so a peer that
/// ran a big job would otherwise stay at that job's high-water mark while it
/// idles on a volunteer's machine). Called when a job ends on this peer;
/// takes a few milliseconds, so call it off the async threads.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heap bookkeeping under its
    // locks; it has no preconditions on the caller and frees nothing in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Whether the kernel may back this process's memory with transparent huge
/// pages: on while jobs run, off while the peer idles.
///
/// [`zeroed_buffer`] asks for huge pages, and that advice stays on the
/// address range after the buffer is freed: glibc hands buffers of up to
/// 32 MiB out of its heap once it has freed a few, and [`release_free_memory`]
/// gives their pages back but not the advice. The kernel's `khugepaged`
/// then fills every such 2 MiB range that still holds a page of something
/// else with a huge page of zeros, so an idle peer grew by megabytes in the
/// seconds after a job (by the size of the snapshots it held, for big
/// jobs). `PR_SET_THP_DISABLE` stops that for the whole process while it
/// is set. Where the system has no such switch this does nothing.
pub fn allow_huge_pages(allowed: bool) {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl(PR_SET_THP_DISABLE) takes integer arguments only and
    // changes how the kernel may back this process's memory, never its
    // contents; its failure (an old kernel) changes nothing.
    unsafe {
        libc::prctl(
            libc::PR_SET_THP_DISABLE,
            libc::c_ulong::from(!allowed),
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        );
    }
    #[cfg(not(target_os = "linux"))]
    let _ = allowed;
}

/// A zeroed buffer of `len` bytes for a snapshot's memory, cheap to fill:
/// the allocator hands large zeroed blocks over as fresh mappings (no
/// `memset`, and pages never written are never faulted in), and the kernel
/// is asked to back it with transparent huge pages where it can, so
/// filling 10 MiB takes 5 faults instead of 2 560 (a fresh capture of
/// PageRank's 10 MiB: about 3.5 ms of faults measured here, 1 ms with
/// huge pages). Where huge pages are off, or on other systems, it is a
/// plain zeroed buffer.
pub fn zeroed_buffer(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    advise_huge_pages(&mut v);
    v
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(v: &mut [u8]) {
    const HUGE: usize = 2 << 20;
    let start = v.as_mut_ptr() as usize;
    let first = start.next_multiple_of(HUGE);
    let end = (start + v.len()) & !(HUGE - 1);
    if end > first {
        // SAFETY: [first, end) lies inside `v`'s allocation, which this
        // function borrows mutably; MADV_HUGEPAGE only changes how the
        // kernel backs those pages, never their contents (zeros stay
        // zeros), and its failure (huge pages disabled) changes nothing.
        unsafe {
            libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_: &mut [u8]) {}

/// Make the whole process allocate from one glibc arena. By default glibc
/// gives threads up to 8 × cores arenas, and each keeps the memory of the
/// biggest job the peer ever ran (measured with `cargo bench --bench
/// restore`: 20–30 MiB idle, 60–100 MiB after one PageRank job even after
/// [`release_free_memory`]); with one arena the peer returns to its idle
/// size after every job, at no measurable cost to superstep times. Call it
/// first thing in a peer process, before any thread allocates.
pub fn use_one_allocator_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets one of glibc's tuning parameters from its
    // integer arguments; M_ARENA_MAX has no preconditions.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Resident memory of this process in bytes (`/proc/self/statm`), where the
/// system says.
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    #[cfg(unix)]
    // SAFETY: sysconf only reads its integer argument.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    #[cfg(not(unix))]
    let page = 4096i64;
    Some(pages * u64::try_from(page).ok().filter(|&p| p > 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "cpu  4705 356 584 3699 23 0 12 5 0 0\n\
cpu0 1393280 32966 572056 13343292 6130 0 17875 0 0 0\n\
intr 114930548 113199788 3 0 5 263 0 4 [... lots more numbers ...]\n\
ctxt 1990473\n";

    #[test]
    fn parses_the_aggregate_cpu_line() {
        let t = parse_proc_stat(SAMPLE).unwrap();
        assert_eq!(t.total, 4705 + 356 + 584 + 3699 + 23 + 12 + 5);
        assert_eq!(t.available, 356 + 3699 + 23);
    }

    #[test]
    fn refuses_text_without_a_cpu_line() {
        assert_eq!(parse_proc_stat("cpu0 1 2 3 4\nintr 5"), None);
        assert_eq!(parse_proc_stat("cpu 1 2"), None);
        assert_eq!(parse_proc_stat("cpu a b c d"), None);
        assert_eq!(parse_proc_stat(""), None);
    }

    #[test]
    fn idle_fraction_is_the_available_share_of_the_delta() {
        let a = CpuTimes {
            available: 100,
            total: 200,
        };
        let b = CpuTimes {
            available: 175,
            total: 300,
        };
        assert!((idle_fraction(a, b) - 0.75).abs() < 1e-9);
        assert_eq!(idle_fraction(a, a), 1.0);
        // A counter that went backwards (e.g. a CPU went offline) stays in range.
        assert!((0.0..=1.0).contains(&idle_fraction(b, a)));
    }

    #[test]
    fn idle_files_hold_one_fraction() {
        assert_eq!(parse_idle("0.25\n"), Ok(0.25));
        assert_eq!(parse_idle(" 1 "), Ok(1.0));
        assert_eq!(parse_idle("0"), Ok(0.0));
        assert!(parse_idle("1.5").unwrap_err().contains("between 0 and 1"));
        assert!(parse_idle("-0.1").is_err());
        assert!(parse_idle("NaN").is_err());
        assert!(parse_idle("half").unwrap_err().contains("not a number"));
        assert!(parse_idle("").is_err());
    }

    #[test]
    fn the_idle_file_overrides_the_measurement_and_bad_content_falls_back() {
        let dir = std::env::temp_dir().join(format!("bspweb-idle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("idle");
        std::fs::write(&path, "0.125").unwrap();
        let mut source = IdleSource::new(Some(path.clone()));
        assert_eq!(source.sample(), 0.125);
        std::fs::write(&path, "2").unwrap();
        let fallback = source.sample();
        assert!((0.0..=1.0).contains(&fallback));
        std::fs::remove_file(&path).unwrap();
        assert!((0.0..=1.0).contains(&source.sample()));
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn the_monitor_reports_a_fraction() {
        let mut m = IdleMonitor::new();
        let f = m.sample();
        assert!((0.0..=1.0).contains(&f));
    }

    #[test]
    fn the_benchmark_is_positive_and_the_workload_deterministic() {
        assert_eq!(workload(1000), workload(1000));
        assert!(benchmark() > 0.0);
    }

    #[test]
    fn the_resident_size_is_read_and_grows_with_touched_memory() {
        let before = rss_bytes().expect("Linux has /proc/self/statm");
        assert!(before > 1 << 20, "{before}");
        // (Other tests run in this process too: compare with what this one
        // holds, not with the size before.)
        let touched = vec![1u8; 64 << 20];
        let during = rss_bytes().unwrap();
        assert!(
            during >= 64 << 20,
            "{during} bytes resident while holding 64 MiB"
        );
        drop(std::hint::black_box(touched));
        release_free_memory();
    }
}
