//! Which supersteps are short enough to run on the job driver's own thread.
//!
//! A superstep normally runs on a blocking thread: the job's driver (a task
//! on the async runtime) hands the process over, and the thread hands the
//! result back. Each handover is a thread wake-up, and on a busy machine a
//! woken thread waits for a core; for a superstep that computes for a few
//! microseconds (latency-bound programs, the `l` of `bsp_params`) the two
//! hand-overs cost more than the superstep. So a process whose recent
//! supersteps were all short runs its next one right on the driver's thread
//! ("inline"), with no hand-over at all.
//!
//! [`ShortRuns`] is the prediction, pure and deterministic: a process runs
//! inline after [`INLINE_AFTER`] supersteps in a row (each with its
//! capture) took at most [`INLINE_MAX`]. An inline superstep that turns out
//! long (it blocked the driver while it ran) starts the count again and
//! doubles the number of short ones required, up to [`INLINE_AFTER_MAX`],
//! so a program whose supersteps alternate between short and long runs its
//! long ones inline rarely. The driver adds its own conditions
//! (`job/io.rs`): a runtime with more than one worker thread, a free slot,
//! a thread whose OS priority is no higher than the guests', and no more
//! than [`INLINE_MAX`] spent on the supersteps it ran inline and has not
//! taken back yet (the processes of one barrier run one after another
//! there only while that is short; the others go to blocking threads, in
//! parallel). A prediction can be wrong; an inline superstep therefore
//! never waits on the worker and hands the worker over once it has run for
//! a millisecond (`runtime/process.rs`, `off_async_worker` and
//! `hand_off_long_inline_run`).

use std::time::Duration;

/// Supersteps (with their capture, if checkpointed) of at most this much
/// host time count as short.
pub const INLINE_MAX: Duration = Duration::from_micros(200);

/// Short supersteps in a row before a process first runs inline.
pub const INLINE_AFTER: u32 = 4;

/// The most short supersteps in a row ever required.
pub const INLINE_AFTER_MAX: u32 = 1024;

/// The recent lengths of a process's supersteps, as far as the inline
/// decision needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortRuns {
    /// Short supersteps in a row, the newest last.
    streak: u32,
    /// How many in a row make the next one inline.
    needed: u32,
}

impl Default for ShortRuns {
    fn default() -> Self {
        ShortRuns {
            streak: 0,
            needed: INLINE_AFTER,
        }
    }
}

impl ShortRuns {
    /// Whether the next superstep is expected to be short.
    pub fn predicts_short(&self) -> bool {
        self.streak >= self.needed
    }

    /// Record a superstep: `short`, it took at most the limit (normally
    /// [`INLINE_MAX`], with its capture); `inline`, it ran on the driver's
    /// thread.
    pub fn note(&mut self, short: bool, inline: bool) {
        if short {
            self.streak = self.streak.saturating_add(1);
        } else {
            self.streak = 0;
            if inline {
                self.needed = self.needed.saturating_mul(2).min(INLINE_AFTER_MAX);
            }
        }
    }

    /// Short supersteps in a row required now.
    pub fn needed(&self) -> u32 {
        self.needed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SHORT: bool = true;
    const LONG: bool = false;

    #[test]
    fn a_process_runs_inline_after_enough_short_supersteps() {
        let mut r = ShortRuns::default();
        for _ in 0..INLINE_AFTER {
            assert!(!r.predicts_short());
            r.note(SHORT, false);
        }
        assert!(r.predicts_short());
        r.note(SHORT, true);
        assert!(r.predicts_short());
        // A long superstep on a blocking thread only restarts the count.
        r.note(LONG, false);
        assert!(!r.predicts_short());
        assert_eq!(r.needed(), INLINE_AFTER);
    }

    #[test]
    fn a_long_inline_superstep_doubles_the_streak_required_up_to_a_cap() {
        let mut r = ShortRuns::default();
        let mut needed = INLINE_AFTER;
        for _ in 0..20 {
            for _ in 0..needed {
                assert!(!r.predicts_short());
                r.note(SHORT, false);
            }
            assert!(r.predicts_short());
            r.note(LONG, true);
            needed = (needed * 2).min(INLINE_AFTER_MAX);
            assert_eq!(r.needed(), needed);
        }
        assert_eq!(r.needed(), INLINE_AFTER_MAX);
    }

    proptest! {
        /// Against a reference model: the driver runs a superstep inline
        /// exactly when the model's streak of short ones reached the
        /// model's requirement, and long inline supersteps stay rare: the
        /// k-th needs `INLINE_AFTER · 2^(k-1)` (capped) short ones before it.
        #[test]
        fn inline_decisions_follow_the_model_and_long_inline_runs_are_rare(
            runs in proptest::collection::vec(proptest::bool::weighted(0.9), 0..3000)
        ) {
            let mut r = ShortRuns::default();
            let (mut streak, mut needed) = (0u32, INLINE_AFTER);
            let mut short_before_long_inline = Vec::new();
            let mut shorts = 0u64;
            for short in runs {
                let inline = streak >= needed;
                prop_assert_eq!(r.predicts_short(), inline);
                r.note(short, inline);
                if short {
                    streak += 1;
                    shorts += 1;
                } else {
                    streak = 0;
                    if inline {
                        short_before_long_inline.push(shorts);
                        needed = (needed * 2).min(INLINE_AFTER_MAX);
                    }
                }
            }
            let mut required = 0u64;
            let mut n = u64::from(INLINE_AFTER);
            for (k, shorts) in short_before_long_inline.into_iter().enumerate() {
                required += n;
                prop_assert!(shorts >= required, "long inline run {} after {} short ones", k + 1, shorts);
                n = (n * 2).min(u64::from(INLINE_AFTER_MAX));
            }
        }
    }
}
