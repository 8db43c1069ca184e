//! Golden-ratio index allocation with reuse of freed indices (§4.2.4).

use std::collections::BTreeMap;

/// Hands out golden-ratio indices `1, 2, 3, …` and reuses freed ones,
/// smallest first.
///
/// §4.2.4: the golden points `{Φ}, …, {nΦ}` are only evenly spread while all
/// of `1..=n` are present, so when a peer leaves or a process ends its index
/// is freed and the next join or start takes the smallest free index
/// ("suffering short periods of slight imbalance, but saving a lot of
/// migration overhead"). Freeing the highest index shrinks the range, so a
/// table that empties returns to its initial state.
///
/// The allocator is deterministic: the same sequence of calls yields the
/// same indices. To survive a supernode restart, persist each holder's
/// index and call [`restore`](IndexAllocator::restore) for each on reload;
/// the indices in between become free, exactly as they were.
///
/// Free indices are kept as disjoint ranges, so memory is proportional to
/// the number of holes, not to the largest index (a stray
/// `restore(u64::MAX)` costs one range, not 2⁶⁴ entries).
///
/// ```
/// let mut ix = placement::IndexAllocator::new();
/// assert_eq!((ix.alloc(), ix.alloc(), ix.alloc()), (1, 2, 3));
/// assert!(ix.free(2));
/// assert_eq!(ix.alloc(), 2); // the smallest free index is reused
/// assert_eq!(ix.alloc(), 4);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexAllocator {
    /// The largest allocated index; 0 when none is allocated.
    high: u64,
    /// Free indices below `high`, as disjoint, non-adjacent ranges
    /// `start → end` (inclusive). Invariant: every `end < high`.
    free: BTreeMap<u64, u64>,
    /// Number of indices in `free`.
    free_count: u64,
}

impl IndexAllocator {
    /// An allocator with no index allocated.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allocates the smallest index ≥ 1 that is not allocated.
    ///
    /// # Panics
    ///
    /// Only when all 2⁶⁴ − 1 indices are allocated, which takes 2⁶⁴ calls.
    pub fn alloc(&mut self) -> u64 {
        if let Some((start, end)) = self.free.pop_first() {
            if start < end {
                self.free.insert(start + 1, end);
            }
            self.free_count -= 1;
            return start;
        }
        self.high = self
            .high
            .checked_add(1)
            .expect("all 2^64 - 1 golden indices are allocated");
        self.high
    }

    /// Frees index `k` so that a later [`alloc`](Self::alloc) can reuse it.
    ///
    /// Returns `false`, changing nothing, when `k` is not allocated
    /// (including `k = 0` and indices freed already).
    pub fn free(&mut self, k: u64) -> bool {
        if !self.is_allocated(k) {
            return false;
        }
        // Merge with the neighbouring free ranges, if adjacent.
        let mut start = k;
        let mut end = k;
        if let Some((&s, &e)) = self.free.range(..k).next_back()
            && e + 1 == k
        {
            self.free.remove(&s);
            start = s;
        }
        // (`k` may be the largest index: nothing lies above it.)
        if let Some(e) = k.checked_add(1).and_then(|n| self.free.remove(&n)) {
            end = e;
        }
        self.free_count += 1;
        if end == self.high {
            // The range reaches the top: drop it and lower `high`.
            self.free_count -= end - start + 1;
            self.high = start - 1;
        } else {
            self.free.insert(start, end);
        }
        true
    }

    /// Marks `k` as allocated, e.g. when reloading persisted indices after a
    /// supernode restart. Indices between the previous largest index and `k`
    /// become free.
    ///
    /// Returns `true` if `k` was newly marked, `false` (changing nothing) if
    /// `k` was already allocated or is 0, which is never a valid index.
    pub fn restore(&mut self, k: u64) -> bool {
        if k == 0 {
            return false;
        }
        if k > self.high {
            if k > self.high + 1 {
                // `free` never reaches `high`, so this range touches no other.
                self.free.insert(self.high + 1, k - 1);
                self.free_count += k - 1 - self.high;
            }
            self.high = k;
            return true;
        }
        let Some((start, end)) = self.free_range_containing(k) else {
            return false;
        };
        self.free.remove(&start);
        if start < k {
            self.free.insert(start, k - 1);
        }
        if k < end {
            self.free.insert(k + 1, end);
        }
        self.free_count -= 1;
        true
    }

    /// Whether `k` is currently allocated.
    pub fn is_allocated(&self, k: u64) -> bool {
        k >= 1 && k <= self.high && self.free_range_containing(k).is_none()
    }

    /// The allocated indices, ascending.
    pub fn allocated(&self) -> impl Iterator<Item = u64> + '_ {
        let tail_start = self.free.last_key_value().map_or(1, |(_, &end)| end + 1);
        let mut next = 1;
        self.free
            .iter()
            .map(move |(&start, &end)| {
                let run = next..=start - 1;
                next = end + 1;
                run
            })
            .chain(std::iter::once(tail_start..=self.high))
            .flatten()
    }

    /// The number of allocated indices.
    pub fn len(&self) -> u64 {
        self.high - self.free_count
    }

    /// Whether no index is allocated.
    pub fn is_empty(&self) -> bool {
        self.high == 0
    }

    /// The largest allocated index, if any.
    pub fn highest(&self) -> Option<u64> {
        (self.high > 0).then_some(self.high)
    }

    fn free_range_containing(&self, k: u64) -> Option<(u64, u64)> {
        self.free
            .range(..=k)
            .next_back()
            .filter(|&(_, &end)| end >= k)
            .map(|(&start, &end)| (start, end))
    }
}
