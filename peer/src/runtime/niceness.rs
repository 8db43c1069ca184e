//! The OS priority of the threads that run guest code (DESIGN.md: a
//! volunteer's machine comes first).

use super::*;

thread_local! {
    static NICED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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
