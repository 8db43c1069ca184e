//! Data distribution helpers, pure and usable natively.
//!
//! ```rust,no_run
//! use bspweb::dist;
//! // 10 items over 3 processes: [0, 3), [3, 6), [6, 10).
//! assert_eq!(dist::block(10, 3, 2), 6..10);
//! // ... and who owns item 5: process 1.
//! assert_eq!(dist::owner(10, 3, 5), 1);
//! // 10 bytes over 4 parts: 3, 3, 2, 2.
//! assert_eq!((0..4).map(|i| dist::share(10, 4, i)).collect::<Vec<_>>(), [3, 3, 2, 2]);
//! ```

use core::ops::Range;

/// The block of `0..n` that process `pid` of `nprocs` owns:
/// `[pid * n / nprocs, (pid + 1) * n / nprocs)`, computed without overflow.
///
/// The blocks of all pids partition `0..n` in pid order, and their sizes
/// differ by at most one.
///
/// # Panics
///
/// If `nprocs` is 0 or `pid >= nprocs`.
pub fn block(n: u64, nprocs: u32, pid: u32) -> Range<u64> {
    assert!(
        pid < nprocs,
        "dist::block: pid {pid} is not below nprocs {nprocs}"
    );
    let bound = |p: u32| (u128::from(p) * u128::from(n) / u128::from(nprocs)) as u64;
    bound(pid)..bound(pid + 1)
}

/// The process whose [`block`] of `0..n` holds `index`: the inverse of
/// [`block`], for sending an item to its owner. Constant time.
///
/// # Panics
///
/// If `nprocs` is 0 or `index >= n`.
pub fn owner(n: u64, nprocs: u32, index: u64) -> u32 {
    assert!(index < n, "dist::owner: index {index} is not below n {n}");
    assert!(nprocs > 0, "dist::owner: nprocs is 0");
    // The largest p with p * n / nprocs <= index, that is
    // ceil((index + 1) * nprocs / n) - 1.
    let (i, p, n) = (u128::from(index), u128::from(nprocs), u128::from(n));
    ((i + 1) * p).div_ceil(n) as u32 - 1
}

/// Part `index` of `total` split as evenly as possible into `parts` parts:
/// `total / parts`, plus one for the first `total % parts` parts.
///
/// # Panics
///
/// If `parts` is 0 or `index >= parts`.
pub fn share(total: u64, parts: u32, index: u32) -> u64 {
    assert!(
        index < parts,
        "dist::share: index {index} is not below parts {parts}"
    );
    let parts = u64::from(parts);
    total / parts + u64::from(u64::from(index) < total % parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_partition_the_range_in_order() {
        for n in [0u64, 1, 7, 10, 1_000_000, u64::MAX] {
            for p in 1..=9u32 {
                let mut next = 0;
                for pid in 0..p {
                    let b = block(n, p, pid);
                    assert_eq!(b.start, next, "n={n} p={p} pid={pid}");
                    let size = b.end - b.start;
                    assert!(size == n / u64::from(p) || size == n / u64::from(p) + 1);
                    next = b.end;
                }
                assert_eq!(next, n);
            }
        }
        assert_eq!(block(10, 3, 0), 0..3);
        assert_eq!(block(10, 3, 1), 3..6);
        assert_eq!(block(10, 3, 2), 6..10);
    }

    #[test]
    fn shares_add_up_and_differ_by_at_most_one() {
        for total in [0u64, 1, 5, 10, 1_000_003] {
            for parts in 1..=8u32 {
                let s: Vec<u64> = (0..parts).map(|i| share(total, parts, i)).collect();
                assert_eq!(s.iter().sum::<u64>(), total);
                assert!(
                    s.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1),
                    "{s:?}"
                );
            }
        }
        assert_eq!(share(10, 4, 0), 3);
        assert_eq!(share(10, 4, 3), 2);
    }

    #[test]
    fn the_owner_of_an_index_is_the_process_whose_block_holds_it() {
        // Every index of every small split, against the blocks themselves.
        for n in 1..=120u64 {
            for p in 1..=17u32 {
                for pid in 0..p {
                    for i in block(n, p, pid) {
                        assert_eq!(owner(n, p, i), pid, "n={n} p={p} i={i}");
                    }
                }
            }
        }
        // Large ranges: the ends of every block.
        for n in [1_000_000_007u64, u64::MAX] {
            for p in [1u32, 3, 4096, u32::MAX] {
                for pid in [0, 1, p / 2, p - 1].into_iter().filter(|&q| q < p) {
                    let b = block(n, p, pid);
                    if !b.is_empty() {
                        assert_eq!(owner(n, p, b.start), pid, "n={n} p={p}");
                        assert_eq!(owner(n, p, b.end - 1), pid, "n={n} p={p}");
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "index 10 is not below n 10")]
    fn owner_refuses_an_index_outside_the_range() {
        owner(10, 3, 10);
    }

    #[test]
    #[should_panic(expected = "pid 3 is not below nprocs 3")]
    fn block_refuses_a_bad_pid() {
        block(10, 3, 3);
    }
}
