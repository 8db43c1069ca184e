//! Data-driven execution of a [`Schedule`] by one node: instead of waiting
//! for a step to end, a node sends a transfer as soon as it holds the
//! transfer's whole byte range.
//!
//! A [`Relay`] is one node's pure state machine: it is told which bytes
//! arrived ([`Relay::on_bytes`], in any order, overlapping or cut into
//! frames) and answers with the transfers that became sendable, each exactly
//! once over its life. Because a schedule's transfers only forward bytes
//! their sender held when their step began, every transfer of a schedule
//! that [`execute`](crate::execute) accepts is released this way once the
//! node's incoming transfers have arrived; steps overlap instead of running
//! one after the other (a pipelined chain's chunks flow as they come, a
//! symmetric destination forwards its piece while the root is still
//! scattering).

use std::collections::BTreeMap;
use std::ops::Range;

use crate::error::CollectiveError;
use crate::schedule::{Schedule, Transfer};

/// Outgoing transfers waiting for their bytes, keyed by `(range.start,
/// range.end)`, each with its position in the schedule (steps in order).
type Waiting = BTreeMap<(usize, usize), Vec<(usize, Transfer)>>;

/// One node's part of a [`Schedule`], run data-driven: its outgoing
/// transfers are released as soon as it holds their bytes.
///
/// Held bytes are a set of disjoint, non-adjacent ranges (merged on
/// insert); outgoing transfers are indexed by their range, so an arrival
/// only looks at transfers starting inside the held range it grew.
///
/// ```
/// use collectives::{Relay, pipelined_chain};
///
/// // 0 → 1 → 2 in chunks of 4 bytes; node 1 forwards each chunk when whole.
/// let schedule = pipelined_chain(3, 0, 10, 4)?;
/// let mut relay = Relay::new(&schedule, 1)?;
/// assert!(relay.start().is_empty());
/// assert!(relay.on_bytes(2..4)?.is_empty());
/// let ready = relay.on_bytes(0..2)?; // bytes 0..4 are now held
/// assert_eq!(ready.len(), 1);
/// assert_eq!((ready[0].to, ready[0].range.clone()), (2, 0..4));
/// relay.on_bytes(4..10)?;
/// assert!(relay.complete() && relay.pending() == 0);
/// # Ok::<(), collectives::CollectiveError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relay {
    me: usize,
    len: usize,
    /// Held bytes: disjoint, non-adjacent ranges `start → end`.
    held: BTreeMap<usize, usize>,
    /// The number of bytes in `held`.
    held_bytes: usize,
    /// Outgoing transfers not yet released.
    waiting: Waiting,
    /// The number of transfers in `waiting`.
    waiting_count: usize,
}

impl Relay {
    /// Node `me`'s part of `schedule`: its outgoing transfers and, if it is
    /// the root, all `schedule.len` bytes.
    ///
    /// Errors if `me` is neither the root nor a destination nor an end of
    /// any transfer, or if one of its outgoing transfers lies outside the
    /// data.
    pub fn new(schedule: &Schedule, me: usize) -> Result<Self, CollectiveError> {
        let mut takes_part = me == schedule.root || schedule.destinations.contains(&me);
        let mut waiting = Waiting::new();
        let mut waiting_count = 0;
        for (position, (step, t)) in schedule.transfers().enumerate() {
            if t.to == me {
                takes_part = true;
            }
            if t.from != me {
                continue;
            }
            takes_part = true;
            let Range { start, end } = t.range;
            if start > end || end > schedule.len {
                return Err(CollectiveError::RangeOutOfBounds {
                    step,
                    from: t.from,
                    to: t.to,
                    start,
                    end,
                });
            }
            waiting
                .entry((start, end))
                .or_default()
                .push((position, t.clone()));
            waiting_count += 1;
        }
        if !takes_part {
            return Err(CollectiveError::NotInSchedule(me));
        }
        let mut held = BTreeMap::new();
        let mut held_bytes = 0;
        if me == schedule.root && schedule.len > 0 {
            held.insert(0, schedule.len);
            held_bytes = schedule.len;
        }
        Ok(Self {
            me,
            len: schedule.len,
            held,
            held_bytes,
            waiting,
            waiting_count,
        })
    }

    /// This node.
    pub fn me(&self) -> usize {
        self.me
    }

    /// The length of the data in bytes.
    pub fn data_len(&self) -> usize {
        self.len
    }

    /// The transfers this node can send right away, in schedule order (the
    /// root holds everything: all its transfers). Call it once, before
    /// [`Relay::on_bytes`]; a later call returns only what neither call
    /// released yet.
    pub fn start(&mut self) -> Vec<Transfer> {
        let mut ready = Vec::new();
        // An empty range is held by anyone.
        let empty: Vec<(usize, usize)> = self
            .waiting
            .keys()
            .filter(|(s, e)| s == e)
            .copied()
            .collect();
        for key in empty {
            self.take(key, &mut ready);
        }
        let intervals: Vec<(usize, usize)> = self.held.iter().map(|(&s, &e)| (s, e)).collect();
        for (a, b) in intervals {
            self.release(a..b, b, &mut ready);
        }
        in_schedule_order(ready)
    }

    /// Bytes `range` arrived (from anyone, possibly overlapping earlier
    /// arrivals, possibly a part of a transfer cut into frames). Returns,
    /// in schedule order, the transfers that became sendable; each
    /// transfer is returned exactly once over the relay's life.
    ///
    /// Errors, leaving the relay unchanged, if `range` is empty or reaches
    /// beyond the data.
    pub fn on_bytes(&mut self, range: Range<usize>) -> Result<Vec<Transfer>, CollectiveError> {
        let Range { start: s, end: e } = range;
        if s >= e {
            return Err(CollectiveError::EmptyByteRange { start: s, end: e });
        }
        if e > self.len {
            return Err(CollectiveError::BytesOutOfRange {
                start: s,
                end: e,
                len: self.len,
            });
        }
        // The held range that starts at or before `s`, if it touches `s`.
        let before = self
            .held
            .range(..=s)
            .next_back()
            .map(|(&ps, &pe)| (ps, pe))
            .filter(|&(_, pe)| pe >= s);
        if before.is_some_and(|(_, pe)| pe >= e) {
            return Ok(Vec::new()); // nothing new
        }
        let (mut a, mut b, mut merged) = (s, e, 0);
        if let Some((ps, pe)) = before {
            self.held.remove(&ps);
            (a, merged) = (ps, pe - ps);
        }
        let after: Vec<(usize, usize)> = self.held.range(s..=e).map(|(&x, &y)| (x, y)).collect();
        for (x, y) in after {
            self.held.remove(&x);
            merged += y - x;
            b = b.max(y);
        }
        self.held.insert(a, b);
        self.held_bytes += (b - a) - merged;
        // A transfer that became sendable lies in a..b and overlaps the new
        // bytes, which all lie in s..e: it starts in a..e. One that starts
        // at or after `e` lay inside an old held range and left already.
        let mut ready = Vec::new();
        self.release(a..e, b, &mut ready);
        Ok(in_schedule_order(ready))
    }

    /// Whether this node holds all the data.
    pub fn complete(&self) -> bool {
        self.held_bytes == self.len
    }

    /// Bytes held, as disjoint, non-adjacent, sorted ranges.
    pub fn held(&self) -> Vec<Range<usize>> {
        self.held.iter().map(|(&s, &e)| s..e).collect()
    }

    /// The number of outgoing transfers not released yet.
    pub fn pending(&self) -> usize {
        self.waiting_count
    }

    /// Moves the waiting transfers whose range starts in `starts` and ends
    /// by `end` to `ready`.
    fn release(&mut self, starts: Range<usize>, end: usize, ready: &mut Vec<(usize, Transfer)>) {
        if starts.start >= starts.end {
            return;
        }
        let keys: Vec<(usize, usize)> = self
            .waiting
            .range((starts.start, 0)..(starts.end, 0))
            .map(|(&k, _)| k)
            .filter(|&(_, e)| e <= end)
            .collect();
        for key in keys {
            self.take(key, ready);
        }
    }

    fn take(&mut self, key: (usize, usize), ready: &mut Vec<(usize, Transfer)>) {
        if let Some(transfers) = self.waiting.remove(&key) {
            self.waiting_count -= transfers.len();
            ready.extend(transfers);
        }
    }
}

fn in_schedule_order(mut ready: Vec<(usize, Transfer)>) -> Vec<Transfer> {
    ready.sort_unstable_by_key(|&(position, _)| position);
    ready.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests;
