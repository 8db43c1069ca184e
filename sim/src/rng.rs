//! The simulator's one pseudo-random number generator: xoshiro256** seeded
//! with SplitMix64 (the same algorithm as `guest-sdk`'s `Rng`, copied so the
//! pure crate depends on nothing).
//!
//! Every random choice of a run comes from a [`SimRng`] derived from the run
//! seed and a fixed stream tag ([`SimRng::stream`]), so changing how one part
//! draws (say, the job stream) never shifts the numbers another part sees
//! (say, the CPU factors).

/// The SplitMix64 output function.
pub(crate) const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// Stream tags: one independent stream per consumer of randomness.
pub(crate) mod tag {
    /// CPU factors of the peers (Table 4.2).
    pub const HARDWARE: u64 = 0x6877_0000_0000_0001;
    /// The job stream (Table 4.3).
    pub const JOBS: u64 = 0x6A6F_6273_0000_0002;
    /// The work-stealing balancer's own PRNG seed.
    pub const STEALING: u64 = 0x7773_0000_0000_0003;
    /// Synthetic availability traces.
    pub const AVAILABILITY: u64 = 0x6176_6169_6C00_0004;
}

/// xoshiro256** seeded with SplitMix64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimRng {
    s: [u64; 4],
}

impl SimRng {
    /// A generator whose four state words are the first four SplitMix64
    /// outputs for `seed`.
    pub fn from_seed(seed: u64) -> SimRng {
        let mut x = seed;
        let mut s = [0u64; 4];
        for word in &mut s {
            x = x.wrapping_add(GOLDEN_GAMMA);
            *word = mix64(x);
        }
        SimRng { s }
    }

    /// The independent stream `tag` of the run seed `seed`.
    pub fn stream(seed: u64, tag: u64) -> SimRng {
        SimRng::from_seed(derive_seed(seed, tag))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform `f64` in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `0..n` without bias (Lemire); `0` when `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }

    /// An index drawn with probability proportional to `weights[i]`
    /// (non-negative, finite, not all zero; otherwise index 0).
    pub fn weighted_index(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        if !(total > 0.0 && total.is_finite()) {
            return 0;
        }
        let mut r = self.next_f64() * total;
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return i;
            }
            r -= w;
        }
        // Rounding left r at (or just above) the last positive weight.
        weights.iter().rposition(|w| *w > 0.0).unwrap_or(0)
    }
}

/// The seed of stream `tag` of run seed `seed`.
pub fn derive_seed(seed: u64, tag: u64) -> u64 {
    mix64(seed ^ mix64(tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_and_xoshiro_match_the_reference_outputs() {
        // Reference values of Vigna's splitmix64.c for seed 1234567.
        let mut x: u64 = 1_234_567;
        let expect = [6_457_827_717_110_365_317u64, 3_203_168_211_198_807_973];
        for e in expect {
            x = x.wrapping_add(GOLDEN_GAMMA);
            assert_eq!(mix64(x), e);
        }
        // xoshiro256** (Vigna's xoshiro256starstar.c) from state [1, 2, 3, 4].
        let mut r = SimRng { s: [1, 2, 3, 4] };
        assert_eq!(r.next_u64(), 11_520);
        assert_eq!(r.next_u64(), 0);
        assert_eq!(r.next_u64(), 1_509_978_240);
        assert_eq!(r.next_u64(), 1_215_971_899_390_074_240);
    }

    #[test]
    fn below_stays_in_range_and_streams_differ() {
        let mut r = SimRng::stream(7, tag::JOBS);
        for n in 1..50 {
            assert!(r.below(n) < n);
        }
        assert_ne!(
            SimRng::stream(7, tag::JOBS).next_u64(),
            SimRng::stream(7, tag::HARDWARE).next_u64()
        );
    }

    #[test]
    fn weighted_index_never_picks_a_zero_weight() {
        let mut r = SimRng::from_seed(3);
        for _ in 0..1000 {
            let i = r.weighted_index(&[0.0, 2.0, 0.0, 1.0, 0.0]);
            assert!(i == 1 || i == 3);
        }
    }
}
