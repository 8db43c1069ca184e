//! What this peer sees of the other peers of a job (issue 18), reported to
//! the supernode with each renewal ([`PeerObservation`]):
//!
//! - how long after a barrier each other peer's `Done` for the next
//!   superstep arrived: its processes' superstep time as seen from here,
//!   which that peer cannot make look shorter than it is. The supernode
//!   compares these across a job's peers to cap the speed a peer claims by
//!   the speed it delivers.
//! - which processes the barrier waits for, and since when: a peer that
//!   holds processes and renews its lease but makes no progress is found
//!   by the others, not by itself.
//!
//! [`Observer`] is the pure part, one per job; [`Ledger`] collects what the
//! jobs' drivers publish until the next renewal.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bsp_api::control::{BarrierWait, PeerObservation};
use bsp_api::{JobId, PeerId, Pid};

/// Superstep times of one observed peer, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Acc {
    /// Supersteps measured.
    pub supersteps: u32,
    /// Their times summed: from the barrier before each to the arrival of
    /// the peer's last `Done` for it, in milliseconds.
    pub busy_ms: u64,
}

/// One job's observations on this peer, with times in milliseconds from
/// any fixed origin. **Architecture Invariant:** no IO, no clock.
#[derive(Debug, Clone)]
pub struct Observer {
    /// The newest barrier complete here and when; before the first, the
    /// job's start as barrier "-1".
    last: (Option<u32>, u64),
    /// Superstep → peer → when its newest `Done` for it arrived.
    arrivals: BTreeMap<u32, BTreeMap<PeerId, u64>>,
    acc: BTreeMap<PeerId, Acc>,
    /// Measure nothing at the next completed barrier ([`Observer::interrupt`]).
    skip: bool,
}

/// Arrivals this many supersteps ahead of the barrier are not kept (a
/// peer cannot be further ahead; more would only be a flood).
const AHEAD: u32 = 4;

impl Observer {
    /// An observer of a job that starts (or is restored here) at `now`.
    pub fn new(now: u64) -> Observer {
        Observer {
            last: (None, now),
            arrivals: BTreeMap::new(),
            acc: BTreeMap::new(),
            skip: false,
        }
    }

    /// The superstep whose barrier this peer waits for next.
    pub fn next(&self) -> u32 {
        self.last.0.map_or(0, |s| s + 1)
    }

    /// Since when (the last barrier, or the start) it waits.
    pub fn waiting_since(&self) -> u64 {
        self.last.1
    }

    /// A `Done` for superstep `s` came from peer `from`.
    pub fn on_done(&mut self, from: PeerId, s: u32, now: u64) {
        let next = self.next();
        if s >= next && s <= next.saturating_add(AHEAD) {
            self.arrivals.entry(s).or_default().insert(from, now);
        }
    }

    /// The barrier of superstep `s` completed here (called in order; a
    /// barrier not reported is skipped and measures nothing).
    pub fn on_complete(&mut self, s: u32, now: u64) {
        if self.last.0.is_some_and(|l| s <= l) {
            return;
        }
        let base = (s == self.next() && !std::mem::take(&mut self.skip)).then_some(self.last.1);
        let rest = self.arrivals.split_off(&(s + 1));
        let arrived = std::mem::replace(&mut self.arrivals, rest);
        if let (Some(base), Some(at)) = (base, arrived.get(&s)) {
            for (&peer, &t) in at {
                let a = self.acc.entry(peer).or_default();
                a.supersteps = a.supersteps.saturating_add(1);
                a.busy_ms = a.busy_ms.saturating_add(t.saturating_sub(base));
            }
        }
        self.last = (Some(s), now);
    }

    /// The job's hosts changed: forget what was measured and not taken
    /// yet, and measure nothing until the next barrier completes (the
    /// supersteps around a restore or handover time the change, not the
    /// peers).
    pub fn interrupt(&mut self, now: u64) {
        self.acc.clear();
        self.arrivals.clear();
        self.skip = true;
        // A new host of a process starts its wait afresh (it fetches the
        // program, restores): waits are counted from the change.
        self.last.1 = now;
    }

    /// The sums since the last call.
    pub fn take(&mut self) -> BTreeMap<PeerId, Acc> {
        std::mem::take(&mut self.acc)
    }
}

/// A barrier waited this long is reported with the processes it waits for.
pub const REPORT_WAIT_AFTER: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct JobEntry {
    /// Per observed peer: its processes in the job, and the sums.
    acc: BTreeMap<PeerId, (u32, Acc)>,
    waiting_since: Instant,
    waiting_for: Vec<Pid>,
}

/// What the jobs' drivers observed, until the next renewal takes it.
#[derive(Debug, Default)]
pub struct Ledger {
    jobs: Mutex<BTreeMap<JobId, JobEntry>>,
}

impl Ledger {
    /// Job `job`'s driver publishes what it observed since it last did
    /// (`processes` tells how many of the job's processes a peer hosts),
    /// since when its barrier waits, and for which processes (empty while
    /// the wait is short).
    pub fn publish(
        &self,
        job: JobId,
        taken: BTreeMap<PeerId, Acc>,
        processes: impl Fn(PeerId) -> u32,
        waiting_since: Instant,
        waiting_for: Vec<Pid>,
    ) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let e = jobs.entry(job).or_insert_with(|| JobEntry {
            acc: BTreeMap::new(),
            waiting_since,
            waiting_for: Vec::new(),
        });
        for (peer, a) in taken {
            let (n, sum) = e.acc.entry(peer).or_default();
            *n = processes(peer);
            sum.supersteps = sum.supersteps.saturating_add(a.supersteps);
            sum.busy_ms = sum.busy_ms.saturating_add(a.busy_ms);
        }
        e.waiting_since = waiting_since;
        e.waiting_for = waiting_for;
    }

    /// The job ended here.
    pub fn forget(&self, job: JobId) {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&job);
    }

    /// What a renewal reports: the sums since the last one, and the waits.
    pub fn drain(&self) -> Vec<PeerObservation> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for (&job, e) in jobs.iter_mut() {
            for (peer, (processes, a)) in std::mem::take(&mut e.acc) {
                out.push(PeerObservation {
                    job,
                    peer,
                    processes,
                    supersteps: a.supersteps,
                    busy_ms: a.busy_ms,
                });
            }
        }
        drop(jobs);
        out.retain(|o| o.supersteps > 0);
        out
    }

    /// Every job whose barrier waits longer than [`REPORT_WAIT_AFTER`],
    /// with the processes it waits for.
    pub fn waits(&self, now: Instant) -> Vec<BarrierWait> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.iter()
            .filter(|(_, e)| !e.waiting_for.is_empty())
            .map(|(&job, e)| BarrierWait {
                job,
                waited_ms: u64::try_from(
                    now.saturating_duration_since(e.waiting_since).as_millis(),
                )
                .unwrap_or(u64::MAX),
                pids: e.waiting_for.clone(),
            })
            .filter(|w| w.waited_ms >= REPORT_WAIT_AFTER.as_millis() as u64)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_timed_from_the_barrier_before_to_its_done() {
        let mut o = Observer::new(1000);
        assert_eq!(o.next(), 0);
        // Superstep 0: peer 2 done after 30 ms, peer 3 after 90 ms.
        o.on_done(2, 0, 1030);
        o.on_done(3, 0, 1090);
        o.on_complete(0, 1091);
        // Superstep 1: peer 2 sends two Dones (two processes), the later counts.
        o.on_done(2, 1, 1100);
        o.on_done(2, 1, 1131);
        o.on_done(3, 1, 1150);
        o.on_complete(1, 1150);
        let acc = o.take();
        assert_eq!(
            acc[&2],
            Acc {
                supersteps: 2,
                busy_ms: 30 + 40
            }
        );
        assert_eq!(
            acc[&3],
            Acc {
                supersteps: 2,
                busy_ms: 90 + 59
            }
        );
        assert!(o.take().is_empty());
        assert_eq!((o.next(), o.waiting_since()), (2, 1150));
    }

    #[test]
    fn early_late_and_skipped_barriers_measure_sensibly() {
        let mut o = Observer::new(0);
        // A Done that arrives before the barrier before it completes here
        // (the peer was ahead): time 0, not negative.
        o.on_done(2, 1, 5);
        o.on_done(2, 0, 4);
        o.on_complete(0, 10);
        o.on_complete(1, 12);
        assert_eq!(
            o.take()[&2],
            Acc {
                supersteps: 2,
                busy_ms: 4
            }
        );
        // A Done for a superstep long past, or far ahead, is not kept.
        o.on_done(2, 1, 20);
        o.on_done(2, 100, 20);
        // Barriers 2 and 3 complete together: 3 has no barrier time before
        // it and measures nothing.
        o.on_done(2, 2, 30);
        o.on_done(2, 3, 31);
        o.on_complete(3, 40);
        assert!(o.take().is_empty());
        // A repeated or older completion changes nothing.
        o.on_complete(2, 50);
        assert_eq!((o.next(), o.waiting_since()), (4, 40));
    }

    #[test]
    fn an_interruption_measures_nothing_until_the_next_barrier() {
        let mut o = Observer::new(0);
        o.on_done(2, 0, 10);
        o.on_complete(0, 10);
        o.on_done(2, 1, 15);
        // A new epoch: pid moved; its handover makes superstep 2 slow.
        o.interrupt(17);
        assert_eq!(o.waiting_since(), 17);
        assert!(o.take().is_empty());
        o.on_done(2, 1, 16);
        o.on_complete(1, 5_000);
        o.on_done(2, 2, 5_020);
        o.on_complete(2, 5_020);
        assert_eq!(
            o.take()[&2],
            Acc {
                supersteps: 1,
                busy_ms: 20
            }
        );
    }

    #[test]
    fn the_ledger_sums_until_a_renewal_takes_it_and_reports_long_waits() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        let acc = |supersteps, busy_ms| Acc {
            supersteps,
            busy_ms,
        };
        ledger.publish(7, BTreeMap::from([(2, acc(3, 30))]), |_| 4, t0, vec![]);
        ledger.publish(7, BTreeMap::from([(2, acc(1, 10))]), |_| 4, t0, vec![5]);
        let got = ledger.drain();
        assert_eq!(
            got,
            vec![PeerObservation {
                job: 7,
                peer: 2,
                processes: 4,
                supersteps: 4,
                busy_ms: 40,
            }]
        );
        assert!(ledger.drain().is_empty());
        // Waits are reported once long enough, with the processes waited for.
        assert!(ledger.waits(t0 + Duration::from_secs(1)).is_empty());
        assert_eq!(
            ledger.waits(t0 + Duration::from_secs(3)),
            vec![BarrierWait {
                job: 7,
                waited_ms: 3000,
                pids: vec![5]
            }]
        );
        ledger.forget(7);
        assert!(ledger.waits(t0 + Duration::from_secs(3)).is_empty());
    }
}
