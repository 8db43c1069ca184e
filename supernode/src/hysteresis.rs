//! Hysteresis of migrations: a process does not move back and forth when
//! peers' availability swings (issue 20, finding 9).
//!
//! Moves for a *load change* (the DHHT host of a process changed because a
//! peer's power changed, or a peer joined) are limited per process:
//!
//! - **Back-off.** After a load-change move, the process stays at least
//!   `interval · 2^streak` where `streak` counts its load-change moves that
//!   came soon (within twice the stay then required) after the one before:
//!   5 s, 10 s, 20 s … up to 64 × the interval (5 min 20 s by default).
//!   A process that stayed put long enough starts over at the interval.
//! - **No return.** It does not move back to the peer its last load-change
//!   move took it from within [`return_window`] of that move.
//!
//! Forced moves (a draining peer, a lost peer) are not limited and not
//! counted. Pure: the caller passes `now`.

use std::collections::HashMap;

use bsp_api::{JobId, PeerId, Pid};

/// The largest back-off exponent: a stay of at most 64 intervals.
const MAX_STREAK: u32 = 6;

/// How long, in ms, a process does not return to the peer it left:
/// ten intervals, at least a minute.
pub(crate) fn return_window(interval: i64) -> i64 {
    interval.saturating_mul(10).max(60_000)
}

/// The stay required after a move with back-off `streak`, in ms.
fn stay(interval: i64, streak: u32) -> i64 {
    interval.saturating_mul(1 << streak.min(MAX_STREAK))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Moved {
    at: i64,
    from: PeerId,
    streak: u32,
}

/// The last load-change move of each process of the active jobs.
#[derive(Debug, Default)]
pub(crate) struct Moves {
    last: HashMap<(JobId, Pid), Moved>,
}

impl Moves {
    /// Whether process `pid` of `job` may move from its host to `to` for a
    /// load change at `now` (ms), with the job's migration `interval` (ms).
    pub(crate) fn allows(&self, job: JobId, pid: Pid, to: PeerId, now: i64, interval: i64) -> bool {
        let Some(m) = self.last.get(&(job, pid)) else {
            return true;
        };
        let since = now.saturating_sub(m.at);
        since >= stay(interval, m.streak) && !(to == m.from && since < return_window(interval))
    }

    /// Remember that `pid` of `job` moved away from `from` for a load change.
    pub(crate) fn record(&mut self, job: JobId, pid: Pid, from: PeerId, now: i64, interval: i64) {
        let streak = match self.last.get(&(job, pid)) {
            Some(m) if now.saturating_sub(m.at) < 2 * stay(interval, m.streak) => {
                (m.streak + 1).min(MAX_STREAK)
            }
            _ => 0,
        };
        self.last.insert(
            (job, pid),
            Moved {
                at: now,
                from,
                streak,
            },
        );
    }

    /// Forget the jobs for which `active` is false.
    pub(crate) fn retain_jobs(&mut self, active: impl Fn(JobId) -> bool) {
        self.last.retain(|(job, _), _| active(*job));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.last.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const I: i64 = 5_000;

    #[test]
    fn a_first_move_is_free_and_later_ones_back_off() {
        let mut m = Moves::default();
        assert!(m.allows(1, 0, 2, 0, I));
        m.record(1, 0, 1, 0, I);
        // It stays the interval, and does not go back to peer 1 soon.
        assert!(!m.allows(1, 0, 3, I - 1, I));
        assert!(m.allows(1, 0, 3, I, I));
        assert!(!m.allows(1, 0, 1, I, I));
        assert!(m.allows(1, 0, 1, return_window(I), I));
        // A move soon after the last one doubles the next stay.
        m.record(1, 0, 2, I, I);
        assert!(!m.allows(1, 0, 3, I + 2 * I - 1, I));
        assert!(m.allows(1, 0, 3, I + 2 * I, I));
        // Other processes and jobs are not affected.
        assert!(m.allows(1, 1, 1, I, I));
        assert!(m.allows(2, 0, 1, I, I));
        m.retain_jobs(|j| j != 1);
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn a_process_that_stayed_long_starts_over() {
        let mut m = Moves::default();
        m.record(1, 0, 1, 0, I);
        m.record(1, 0, 2, I, I); // streak 1: stay 2I
        m.record(1, 0, 3, 100 * I, I); // long after: streak 0 again
        assert!(m.allows(1, 0, 4, 101 * I, I));
    }

    proptest! {
        /// Whatever the DHHT asks for and whenever, a process moves at
        /// most about log2(window / interval) + 2 times in any window, and
        /// never straight back to the peer it left within the return
        /// window.
        #[test]
        fn moves_are_bounded_and_never_straight_back(
            asks in proptest::collection::vec((0i64..2_000, 1i64..5), 1..400),
        ) {
            let mut m = Moves::default();
            let (mut now, mut host) = (0i64, 0i64);
            let mut moved: Vec<(i64, i64, i64)> = Vec::new(); // (at, from, to)
            for (dt, to) in asks {
                now += dt;
                if to != host && m.allows(7, 3, to, now, I) {
                    m.record(7, 3, host, now, I);
                    moved.push((now, host, to));
                    host = to;
                }
            }
            // Within any hour: the back-off allows at most the moves of a
            // doubling series up to 64 intervals, then one per 64 intervals.
            let hour = 3_600_000;
            for (i, &(start, _, _)) in moved.iter().enumerate() {
                let n = moved[i..].iter().take_while(|(at, _, _)| *at < start + hour).count() as i64;
                let bound = (MAX_STREAK as i64 + 1) + hour / stay(I, MAX_STREAK) + 1;
                prop_assert!(n <= bound, "{n} moves in an hour (bound {bound}): {moved:?}");
            }
            for w in moved.windows(2) {
                let ((at0, from0, _), (at1, _, to1)) = (w[0], w[1]);
                prop_assert!(!(to1 == from0 && at1 - at0 < return_window(I)), "straight back: {w:?}");
                prop_assert!(at1 - at0 >= I);
            }
        }
    }
}
