//! The OS priority of the threads that run guest code (DESIGN.md: a
//! volunteer's machine comes first).

use super::*;

thread_local! {
    static NICED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static NICE_ENOUGH: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

pub(super) static NICENESS: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
pub(super) static NICE_WARNED: AtomicBool = AtomicBool::new(false);

/// Set the niceness that threads running guest code take (see
/// [`set_thread_niceness`]). 0 leaves threads alone.
pub fn set_guest_niceness(nice: i32) {
    NICENESS.store(nice, Ordering::Relaxed);
}

/// The niceness set with [`set_guest_niceness`].
pub fn guest_niceness() -> i32 {
    NICENESS.load(Ordering::Relaxed)
}

pub(super) fn set_thread_niceness_once() {
    let nice = NICENESS.load(Ordering::Relaxed);
    if nice == 0 || NICED.with(|n| n.get()) {
        return;
    }
    NICED.with(|n| n.set(true));
    if let Err(e) = nice_thread_at_least(nice)
        && !NICE_WARNED.swap(true, Ordering::Relaxed)
    {
        tracing::warn!("could not lower the priority of the threads running programs: {e}");
    }
}

/// Whether guest code may run on the calling thread as it is: the guest
/// niceness is 0 (threads are left alone), or the thread's own niceness is
/// already at least the guests', so running a guest here never gives it a
/// higher priority than `--nice` allows. Threads of the async runtime run
/// short supersteps this way ([`ShortRuns`]). The answer is kept per
/// thread; a thread that qualifies is then never reniced.
pub fn thread_may_run_guests() -> bool {
    if let Some(ok) = NICE_ENOUGH.with(|n| n.get()) {
        return ok;
    }
    let ok = may_run_guests(NICENESS.load(Ordering::Relaxed), thread_niceness);
    if ok {
        NICED.with(|n| n.set(true));
    }
    NICE_ENOUGH.with(|n| n.set(Some(ok)));
    ok
}

/// Whether a thread of niceness `own()` may run guests of niceness `guests`
/// (`own` is asked only when it matters).
fn may_run_guests(guests: i32, own: impl FnOnce() -> Option<i32>) -> bool {
    guests == 0 || own().is_some_and(|own| own >= guests)
}

/// The calling thread's OS niceness, where it can be read (`None` also for
/// a niceness of -1, which `getpriority` cannot tell from an error).
#[cfg(unix)]
pub(super) fn thread_niceness() -> Option<i32> {
    // SAFETY: getpriority only reads its integer arguments; `who = 0` names
    // the calling thread. It has no memory-safety preconditions.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS as _, 0) };
    (n != -1).then_some(n)
}

#[cfg(not(unix))]
pub(super) fn thread_niceness() -> Option<i32> {
    None
}

/// Give the calling thread OS niceness `nice` unless it is niced more
/// already (the whole `bspweb peer` at `--nice`, or the service's `Nice=19`):
/// raising its priority would fail without privileges, and is not wanted
/// anyway.
pub fn nice_thread_at_least(nice: i32) -> std::io::Result<()> {
    if thread_niceness().is_some_and(|own| own >= nice) {
        return Ok(());
    }
    set_thread_niceness(nice)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guests_run_only_on_threads_niced_at_least_as_much() {
        assert!(may_run_guests(0, || panic!(
            "not asked when guests run at 0"
        )));
        assert!(may_run_guests(10, || Some(10)));
        assert!(may_run_guests(10, || Some(19)));
        assert!(!may_run_guests(10, || Some(0)));
        assert!(!may_run_guests(10, || None), "unknown niceness");
        assert!(!may_run_guests(5, || Some(-5)));
    }

    #[cfg(unix)]
    #[test]
    fn a_threads_niceness_is_read_back() {
        let (set, read) = std::thread::spawn(|| {
            // Lowering the priority needs no privilege.
            let set = thread_niceness().map_or(7, |n| (n + 1).clamp(1, 19));
            set_thread_niceness(set).unwrap();
            (set, thread_niceness())
        })
        .join()
        .unwrap();
        assert_eq!(read, Some(set));
    }

    #[cfg(unix)]
    #[test]
    fn a_thread_niced_more_already_is_left_as_it_is() {
        let (before, after) = std::thread::spawn(|| {
            let more = thread_niceness().map_or(12, |n| (n + 2).clamp(2, 19));
            set_thread_niceness(more).unwrap();
            nice_thread_at_least(more - 1).unwrap();
            (more, thread_niceness())
        })
        .join()
        .unwrap();
        assert_eq!(after, Some(before));
    }
}
