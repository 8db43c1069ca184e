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
//! long ones inline rarely. Twice as many short supersteps as required,
//! counted since the requirement last changed (in a row or not), halve it
//! again, down to [`INLINE_AFTER`]: on a busy machine a short superstep is
//! now and then preempted past the limit, and without a way back a few such
//! runs kept a process off the driver's thread for the rest of its job (at
//! p = 4 with a checkpoint at every sync the requirement reached its cap
//! within a few thousand supersteps, and streaks that long were rare). The
//! price: a program whose every fifth superstep is long runs one superstep
//! in twenty long inline (each hands the worker over after 1 ms, below);
//! two long inline runs are always at least `2 · INLINE_AFTER` short ones
//! apart. The driver adds its own conditions
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
    /// Short supersteps since `needed` last changed, in a row or not.
    calm: u32,
}

impl Default for ShortRuns {
    fn default() -> Self {
        ShortRuns {
            streak: 0,
            needed: INLINE_AFTER,
            calm: 0,
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
            self.calm = self.calm.saturating_add(1);
            if self.needed > INLINE_AFTER && self.calm >= self.needed.saturating_mul(2) {
                self.needed /= 2;
                self.calm = 0;
            }
        } else {
            self.streak = 0;
            if inline {
                self.needed = self.needed.saturating_mul(2).min(INLINE_AFTER_MAX);
                self.calm = 0;
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

    #[test]
    fn a_process_kept_off_by_preemptions_comes_back_to_the_drivers_thread() {
        // As many short ones as required, then a long one inline, until
        // the requirement reaches its cap (eight doublings).
        let mut r = ShortRuns::default();
        while r.needed() < INLINE_AFTER_MAX {
            while !r.predicts_short() {
                r.note(SHORT, false);
            }
            r.note(LONG, true);
        }
        // Then a machine that preempts one superstep in 200 past the
        // limit, at random: most supersteps run inline again (almost none
        // would if the requirement stayed at the cap).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut inline = 0;
        for i in 0..30_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let predicted = r.predicts_short();
            if i >= 20_000 && predicted {
                inline += 1;
            }
            r.note(!x.is_multiple_of(200), predicted);
        }
        assert!(inline > 9_000, "{inline} of the last 10 000 inline");
    }

    proptest! {
        /// Against a reference model: the driver runs a superstep inline
        /// exactly when the model's streak of short ones reached the
        /// model's requirement, and long inline supersteps stay rare: each
        /// comes right after at least `INLINE_AFTER` short ones in a row,
        /// and after the first, at least `2 · INLINE_AFTER` short ones
        /// since the one before.
        #[test]
        fn inline_decisions_follow_the_model_and_long_inline_runs_are_rare(
            runs in proptest::collection::vec(proptest::bool::weighted(0.9), 0..3000)
        ) {
            let mut r = ShortRuns::default();
            let (mut streak, mut needed, mut calm) = (0u32, INLINE_AFTER, 0u32);
            let mut shorts_since_long_inline: Option<u32> = None;
            for short in runs {
                let inline = streak >= needed;
                prop_assert_eq!(r.predicts_short(), inline);
                r.note(short, inline);
                if short {
                    streak += 1;
                    calm += 1;
                    if let Some(n) = shorts_since_long_inline.as_mut() {
                        *n += 1;
                    }
                    if needed > INLINE_AFTER && calm >= 2 * needed {
                        needed /= 2;
                        calm = 0;
                    }
                } else {
                    if inline {
                        prop_assert!(streak >= INLINE_AFTER);
                        if let Some(n) = shorts_since_long_inline {
                            prop_assert!(n >= 2 * INLINE_AFTER, "long inline runs {} short ones apart", n);
                        }
                        shorts_since_long_inline = Some(0);
                        needed = (needed * 2).min(INLINE_AFTER_MAX);
                        calm = 0;
                    }
                    streak = 0;
                }
                prop_assert_eq!(r.needed(), needed);
            }
        }
    }
}
