//! A small deterministic pseudo-random number generator.

use core::ops::Range;

/// A deterministic PRNG: **xoshiro256\*\*** seeded with **SplitMix64**.
///
/// It is pure Rust and works natively too, so tests can recompute what a
/// program drew. The algorithm is fixed (changing it would change every
/// program's results); other languages can reproduce it exactly from this
/// description. All arithmetic is on `u64`, wrapping.
///
/// - `mix64(z)` (the SplitMix64 finalizer):
///   `z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB; z ^ (z >> 31)`.
/// - [`Rng::from_seed`]`(s)`: SplitMix64 with state `x = s`; each of the four
///   state words `s0..s3` in turn is `x += 0x9E3779B97F4A7C15; mix64(x)`.
/// - [`Rng::for_process`]`(seed, pid)` is
///   `from_seed(seed ^ mix64(pid as u64 ^ 0x6273707765620000))`
///   (the constant spells `"bspweb\0\0"`); [`Bsp::rng`](crate::Bsp::rng)
///   returns `for_process(bsp.seed(), bsp.pid())`.
/// - [`Rng::next_u64`] is xoshiro256\*\*: `result = rotl(s1 * 5, 7) * 9;
///   t = s1 << 17; s2 ^= s0; s3 ^= s1; s1 ^= s2; s0 ^= s3; s2 ^= t;
///   s3 = rotl(s3, 45)`.
/// - [`Rng::next_u32`] is the upper half of `next_u64`; [`Rng::next_f64`] is
///   `(next_u64 >> 11) * 2^-53`, in `[0, 1)`.
/// - [`Rng::gen_range`]`(lo..hi)` draws `x = next_u64()` and computes the
///   128-bit product `m = x * (hi - lo)`; if the low 64 bits of `m` are below
///   `(2^64 - (hi - lo)) % (hi - lo)` it draws again (Lemire's unbiased
///   method); the result is `lo + (m >> 64)`.
/// - [`Rng::shuffle`] is Fisher–Yates from the back: for `i` from `len - 1`
///   down to 1, swap element `i` with element `gen_range(0..i + 1)`.
///
/// ```rust,no_run
/// use bspweb::Rng;
/// let mut a = Rng::for_process(42, 3);
/// let mut b = Rng::for_process(42, 3);
/// assert_eq!(a.next_u64(), b.next_u64()); // same seed and pid, same stream
/// let die = a.gen_range(1..7);
/// assert!((1..7).contains(&die));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
const PROCESS_TAG: u64 = 0x6273_7077_6562_0000;

/// The SplitMix64 output function.
const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator whose four state words are the first four SplitMix64
    /// outputs for `seed`.
    pub fn from_seed(seed: u64) -> Rng {
        let mut x = seed;
        let mut s = [0u64; 4];
        for word in &mut s {
            x = x.wrapping_add(GOLDEN_GAMMA);
            *word = mix64(x);
        }
        Rng { s }
    }

    /// The generator of process `pid` in a job with seed `seed`: the stream
    /// [`Bsp::rng`](crate::Bsp::rng) returns.
    pub fn for_process(seed: u64, pid: u32) -> Rng {
        Rng::from_seed(seed ^ mix64(u64::from(pid) ^ PROCESS_TAG))
    }

    /// A generator with this exact xoshiro256\*\* state. An all-zero state
    /// would only produce zeros, so it is replaced by `from_seed(0)`'s.
    pub fn from_state(s: [u64; 4]) -> Rng {
        if s == [0; 4] {
            Rng::from_seed(0)
        } else {
            Rng { s }
        }
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

    /// The next 32 random bits (the upper half of [`Rng::next_u64`]).
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A uniform `f64` in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `range` (half open), without bias.
    ///
    /// # Panics
    ///
    /// If the range is empty.
    pub fn gen_range(&mut self, range: Range<u64>) -> u64 {
        assert!(
            range.start < range.end,
            "Rng::gen_range: the range {}..{} is empty",
            range.start,
            range.end
        );
        let span = range.end - range.start;
        let mut m = u128::from(self.next_u64()) * u128::from(span);
        if (m as u64) < span {
            let threshold = span.wrapping_neg() % span;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(span);
            }
        }
        range.start + (m >> 64) as u64
    }

    /// Shuffles `items` uniformly (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.gen_range(0..i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_outputs() {
        // Reference: SplitMix64 with seed 1234567 (Vigna's splitmix64.c).
        let mut x = 1_234_567u64;
        let mut next = || {
            x = x.wrapping_add(GOLDEN_GAMMA);
            mix64(x)
        };
        assert_eq!(next(), 6_457_827_717_110_365_317);
        assert_eq!(next(), 3_203_168_211_198_807_973);
        assert_eq!(next(), 9_817_491_932_198_370_423);
        let r = Rng::from_seed(1_234_567);
        assert_eq!(r.s[0], 6_457_827_717_110_365_317);
        assert_eq!(r.s[1], 3_203_168_211_198_807_973);
    }

    #[test]
    fn xoshiro256_star_star_matches_the_reference_outputs() {
        // Reference: xoshiro256** (Vigna's xoshiro256starstar.c) from state [1, 2, 3, 4].
        let mut r = Rng::from_state([1, 2, 3, 4]);
        assert_eq!(r.next_u64(), 11_520);
        assert_eq!(r.next_u64(), 0);
        assert_eq!(r.next_u64(), 1_509_978_240);
        assert_eq!(r.next_u64(), 1_215_971_899_390_074_240);
    }

    #[test]
    fn for_process_is_deterministic_and_differs_by_pid_and_seed() {
        let draw = |seed, pid| {
            let mut r = Rng::for_process(seed, pid);
            (0..4).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7, 0), draw(7, 0));
        assert_ne!(draw(7, 0), draw(7, 1));
        assert_ne!(draw(7, 0), draw(8, 0));
        // No pid's stream is another's shifted by one draw.
        let a = draw(0, 0);
        let b = draw(0, 1);
        assert!(!a[1..].iter().zip(&b).all(|(x, y)| x == y));
        // Pinned value: changing the algorithm changes every program's output.
        assert_eq!(Rng::for_process(0, 0), Rng::from_seed(mix64(PROCESS_TAG)));
    }

    #[test]
    fn all_zero_state_is_replaced() {
        let mut r = Rng::from_state([0; 4]);
        assert_ne!((r.next_u64(), r.next_u64()), (0, 0));
    }

    #[test]
    fn narrow_outputs() {
        let mut a = Rng::from_seed(5);
        let mut b = a.clone();
        assert_eq!(a.next_u32(), (b.next_u64() >> 32) as u32);
        for _ in 0..10_000 {
            let f = a.next_f64();
            assert!((0.0..1.0).contains(&f), "{f}");
        }
    }

    #[test]
    fn gen_range_stays_in_range_and_hits_every_value() {
        let mut r = Rng::from_seed(99);
        let mut seen = [0u32; 6];
        for _ in 0..6_000 {
            let v = r.gen_range(10..16);
            assert!((10..16).contains(&v));
            seen[(v - 10) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
        assert_eq!(r.gen_range(5..6), 5);
        let big = r.gen_range(0..u64::MAX);
        assert!(big < u64::MAX);
    }

    #[test]
    #[should_panic(expected = "the range 3..3 is empty")]
    fn gen_range_refuses_an_empty_range() {
        Rng::from_seed(1).gen_range(3..3);
    }

    #[test]
    fn gen_range_follows_the_documented_formula() {
        let mut a = Rng::from_seed(11);
        let mut b = a.clone();
        for span in [1u64, 2, 3, 1000, 1 << 40, u64::MAX / 3 * 2] {
            let got = a.gen_range(0..span);
            let expected = loop {
                let m = u128::from(b.next_u64()) * u128::from(span);
                if (m as u64) >= span.wrapping_neg() % span {
                    break (m >> 64) as u64;
                }
            };
            assert_eq!(got, expected, "span {span}");
        }
    }

    #[test]
    fn shuffle_is_a_deterministic_permutation() {
        let mut v: Vec<u32> = (0..100).collect();
        Rng::from_seed(3).shuffle(&mut v);
        let mut w: Vec<u32> = (0..100).collect();
        Rng::from_seed(3).shuffle(&mut w);
        assert_eq!(v, w);
        assert_ne!(v, (0..100).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..100).collect::<Vec<_>>());
        let mut empty: [u8; 0] = [];
        Rng::from_seed(3).shuffle(&mut empty);
    }
}
