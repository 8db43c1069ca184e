//! Ring positions: 64-bit fixed point, golden-ratio points and SHA-1 points.

use std::fmt;
use std::str::FromStr;

use crate::PlacementError;

/// Φ = φ⁻¹ = (√5 − 1) / 2 ≈ 0.618, the inverse of the golden ratio (§4.2.4).
///
/// Only for display and analysis: positions are computed with the exact
/// fixed-point constant [`GOLDEN_STEP`].
pub const PHI_INV: f64 = 0.618_033_988_749_894_9;

/// φ² = φ + 1 ≈ 2.618, the bound on the ratio of the longest to the shortest
/// gap between the golden points `{Φ}, …, {nΦ}`, for every `n` (§4.2.4).
pub const PHI_SQUARED: f64 = 2.618_033_988_749_895;

/// Φ as a 64-bit fixed-point fraction: ⌊Φ · 2⁶⁴⌋ = `0x9E3779B97F4A7C15`.
///
/// `k · GOLDEN_STEP mod 2⁶⁴` (a `wrapping_mul`) is the fixed-point value of
/// `{k·Φ}`, off by less than `k · 2⁻⁶⁴` — far below anything that matters for
/// any `k` that can be allocated, and computed identically on every machine.
pub const GOLDEN_STEP: u64 = 0x9E37_79B9_7F4A_7C15;

/// A point of the unit ring `[0, 1)`, stored as the fraction × 2⁶⁴.
///
/// The fixed-point form gives positions a total order and exact arithmetic:
/// the counter-clockwise distance `(x − p) mod 1` is a `wrapping_sub`
/// ([`Position::ccw_distance_to`]). Use [`Position::to_f64`] only to compute
/// the envelope value or to show a position to people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position(pub u64);

impl Position {
    /// The point 0 of the ring.
    pub const ZERO: Position = Position(0);

    /// The fraction this position stands for, in `[0, 1]`.
    ///
    /// The result is `self.0 / 2⁶⁴` rounded to the nearest `f64`; positions
    /// within 2⁻⁵⁴ of 1 round up to `1.0`. The conversion is monotone:
    /// `a <= b` implies `a.to_f64() <= b.to_f64()`.
    pub fn to_f64(self) -> f64 {
        // `u64 as f64` rounds to nearest; multiplying by a power of two is exact.
        self.0 as f64 * (1.0 / 18_446_744_073_709_551_616.0)
    }

    /// The distance from `self` counter-clockwise (towards smaller positions,
    /// wrapping past 0) to `peer`: `(self − peer) mod 1`, exact.
    ///
    /// This is the argument of a peer's linear function in the DHHT lower
    /// envelope (§4.2.2): a process at `x` is measured against each peer `p`
    /// by `x.ccw_distance_to(p)`. It is zero when the two positions coincide.
    pub fn ccw_distance_to(self, peer: Position) -> Position {
        Position(self.0.wrapping_sub(peer.0))
    }
}

/// The `k`-th golden-ratio point `{k·Φ}` (§4.2.4), in fixed point.
///
/// Indices start at 1 and come from an [`IndexAllocator`](crate::IndexAllocator);
/// `k = 0` gives the point 0. For every `n`, the points of `1..=n` split the
/// ring into gaps of at most three lengths whose longest-to-shortest ratio is
/// at most φ² ≈ 2.618 (the three-distance theorem).
///
/// ```
/// let p = placement::golden_position(1);
/// assert!((p.to_f64() - placement::PHI_INV).abs() < 1e-15);
/// ```
pub fn golden_position(k: u64) -> Position {
    Position(k.wrapping_mul(GOLDEN_STEP))
}

/// A pseudo-random position: the first 8 bytes, big-endian, of the SHA-1 of
/// `bytes` (§4.2.2 uses SHA-1 as its uniform hash).
///
/// Use [`peer_key`] and [`process_key`] to build `bytes`, so that every
/// supernode computes the same position for the same peer or process.
pub fn hashed_position(bytes: &[u8]) -> Position {
    let digest = sha1_smol::Sha1::from(bytes).digest().bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    Position(u64::from_be_bytes(first))
}

/// The canonical bytes hashed for a peer: `b"peer:"` followed by the id as
/// 8 bytes big-endian (two's complement).
///
/// This layout is part of the placement contract: changing it moves every
/// randomly placed peer.
pub fn peer_key(peer_id: i64) -> [u8; 13] {
    let mut key = [0u8; 13];
    key[..5].copy_from_slice(b"peer:");
    key[5..].copy_from_slice(&peer_id.to_be_bytes());
    key
}

/// The canonical bytes hashed for process `pid` of job `job`: `b"proc:"`,
/// the job id as 8 bytes big-endian (two's complement), then the pid as
/// 4 bytes big-endian.
///
/// This layout is part of the placement contract: changing it moves every
/// randomly placed process.
pub fn process_key(job: i64, pid: u32) -> [u8; 17] {
    let mut key = [0u8; 17];
    key[..5].copy_from_slice(b"proc:");
    key[5..13].copy_from_slice(&job.to_be_bytes());
    key[13..].copy_from_slice(&pid.to_be_bytes());
    key
}

/// The canonical bytes hashed for job `job` on the top-level ring of a
/// [`TwoLevel`](crate::TwoLevel) table when the caller keeps no per-job
/// golden index: `b"job:"` followed by the id as 8 bytes big-endian (two's
/// complement).
///
/// This layout is part of the placement contract, like [`peer_key`]'s.
pub fn job_key(job: i64) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..4].copy_from_slice(b"job:");
    key[4..].copy_from_slice(&job.to_be_bytes());
    key
}

/// How peers or processes get their ring positions (§4.2.2, §4.2.4).
///
/// The dissertation names the DHHT variants after the scheme of the peers and
/// of the processes: "DHHT (Rnd., Rnd.)", "(Det., Rnd.)", "(Rnd., Det.)" and
/// "(Det., Det.)". Det/Det performed best in its experiments, so
/// [`PositionScheme::Golden`] is the default, used for both peers and
/// processes. With `Golden`, the caller keeps one [`IndexAllocator`](crate::IndexAllocator)
/// for peers and one for running processes, allocates an index when a peer
/// joins or a process starts, frees it when the peer leaves or the process
/// ends (freed indices are reused, smallest first), and persists it so that a
/// restarted supernode can [`restore`](crate::IndexAllocator::restore) it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PositionScheme {
    /// "Rnd.": SHA-1 of the canonical key ([`peer_key`] / [`process_key`]).
    /// Needs no shared state, but gaps are uneven: smoothness Θ(n log n).
    Random,
    /// "Det.": the golden-ratio point `{k·Φ}` of an allocated index `k`.
    /// Smoothness at most φ² while all indices `1..=n` are in use.
    #[default]
    Golden,
}

impl PositionScheme {
    /// Whether positions under this scheme come from an allocated index
    /// (`Golden`) rather than from the identity alone (`Random`).
    pub fn needs_index(self) -> bool {
        matches!(self, PositionScheme::Golden)
    }

    /// The position of peer `peer_id`; `index` is its allocated golden index
    /// (≥ 1) and is ignored by `Random`.
    pub fn peer_position(self, peer_id: i64, index: u64) -> Position {
        match self {
            PositionScheme::Random => hashed_position(&peer_key(peer_id)),
            PositionScheme::Golden => golden_position(index),
        }
    }

    /// The position of process `pid` of job `job`; `index` is its allocated
    /// golden index (≥ 1) and is ignored by `Random`.
    pub fn process_position(self, job: i64, pid: u32, index: u64) -> Position {
        match self {
            PositionScheme::Random => hashed_position(&process_key(job, pid)),
            PositionScheme::Golden => golden_position(index),
        }
    }

    /// The configuration name: `"random"` or `"golden"`.
    pub fn as_str(self) -> &'static str {
        match self {
            PositionScheme::Random => "random",
            PositionScheme::Golden => "golden",
        }
    }
}

impl fmt::Display for PositionScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PositionScheme {
    type Err = PlacementError;

    /// Parses `"random"` or `"golden"` (case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "random" => Ok(PositionScheme::Random),
            "golden" => Ok(PositionScheme::Golden),
            _ => Err(PlacementError::UnknownScheme {
                given: s.chars().take(64).collect(),
            }),
        }
    }
}
