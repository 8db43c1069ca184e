//! A small seeded pseudo-random generator (SplitMix64) and 64-bit mixers.
//!
//! The crate never touches a global random number generator: every random
//! choice comes from a [`SplitMix64`] seeded by the caller, so a run is a
//! pure function of its seed.

/// SplitMix64 (Steele, Lea, Flood 2014): a 64-bit state advanced by the
/// golden-ratio increment and finalized by [`mix64`]. Small, fast, and good
/// enough for simulation choices; not for cryptography.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose output is determined by `seed` alone.
    pub(crate) fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(crate::GOLDEN_STEP);
        mix64(self.state)
    }

    /// A uniform `f64` in `[0, 1)` (53 random bits).
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }

    /// A uniform index in `0..n`; `n` must be at least 1.
    ///
    /// Lemire's multiply-shift with rejection, so it is exactly uniform.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        debug_assert!(n > 0);
        let n = n as u64;
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as usize;
            }
        }
    }
}

/// The SplitMix64 / MurmurHash3 64-bit finalizer: a bijection of `u64`
/// whose output bits each depend on every input bit.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
