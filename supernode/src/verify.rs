//! Checking what peers claim against what they deliver (issue 18). Pure:
//! no IO, no clock; the renewal handler feeds it and asks.
//!
//! **Speed.** Placement believes a peer's claimed power (speed × idle
//! fraction) only as far as it has been shown:
//! - a peer nobody has measured yet is on *probation*: its power is at
//!   most [`PROBATION`] times the median power of the other online peers,
//!   so a peer that lies cannot take a whole job (whose other peers then
//!   could not observe it) the moment it joins;
//! - once measured, at most [`SLACK`] times the power it delivered. Peers
//!   of a job report, for each other peer, the time from each barrier to
//!   the arrival of that peer's last `Done` for the next superstep
//!   ([`PeerObservation`]): its processes' superstep time, which it
//!   cannot make look shorter. Its throughput ρ = process-supersteps per
//!   second, divided by its power, is about the same for every honest
//!   peer of the job; the median of that ratio over the job's peers (the
//!   largest, with two) converts a peer's throughput into the power it
//!   delivered. A peer that claims 100× its speed gets many processes,
//!   runs them no faster, and is capped near its real power after a few
//!   supersteps; an honest fast peer earns its claim in steps of
//!   [`SLACK`]. A peer's throughput in a job is the median of its recent
//!   observations, so one slow stretch does not decide it, and peers
//!   measure nothing across a change of the job's hosts; an estimate
//!   older than ten minutes is forgotten (probation again), so a peer
//!   measured at a bad moment is not held down for good.
//!
//! **Progress.** Peers report barriers that wait long and for which
//! processes ([`BarrierWait`]). A peer whose processes a strict majority of
//! the job's other peers have waited for longer than twice the job's
//! superstep limit plus [`STALL_GRACE_MS`] (and which reports no such wait
//! of its own, i.e. is not itself held up by someone else) makes no
//! progress while it renews its lease: its processes are restored
//! elsewhere. An honest peer ends a process that runs past the superstep
//! limit itself; the limit counts running time only, so twice it leaves a
//! busy honest peer's processes room to wait for a slot as long as they
//! run.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bsp_api::control::{BarrierWait, PeerObservation};
use bsp_api::{JobId, PeerId};

/// Placement believes at most this multiple of the power a peer delivered.
pub(crate) const SLACK: f64 = 1.25;
/// An unmeasured peer's power is at most this multiple of the median of
/// the other online peers'.
pub(crate) const PROBATION: f64 = 2.0;
/// A measurement needs this much observed time of the peer in one job.
const MIN_BUSY_MS: f64 = 1_000.0;
/// And this many supersteps.
const MIN_SUPERSTEPS: f64 = 5.0;
/// A job's sums are halved once they hold this much observed time, so the
/// estimate follows what peers do now.
const WINDOW_MS: f64 = 20_000.0;
/// A job nobody reported on for this long is forgotten.
const JOB_TTL_MS: i64 = 10 * 60_000;
/// Beyond twice the job's superstep limit, a barrier may wait this long
/// for a peer before the peer counts as making no progress.
pub(crate) const STALL_GRACE_MS: u64 = 10_000;
/// Twice the superstep limit, but at least this: a new host of a
/// process (after a restore) downloads and compiles the program first.
const MIN_STALL_MS: u64 = 60_000;
/// A wait report counts this long after it arrived.
const WAIT_TTL_MS: i64 = 30_000;

#[derive(Debug, Clone, Default)]
struct Sum {
    /// Per reporter, the throughput per core in use (process-supersteps
    /// per ms, divided by the processes it runs at once) of its recent
    /// observations, newest last. The estimate is the median across
    /// reporters of each one's median: one slow stretch (a handover, a
    /// burst of load) does not decide it, nor does one reporter.
    rates: BTreeMap<PeerId, std::collections::VecDeque<f64>>,
    supersteps: f64,
    busy_ms: f64,
}

impl Sum {
    fn observations(&self) -> usize {
        self.rates.values().map(|r| r.len()).sum()
    }

    fn rate(&self) -> Option<f64> {
        let per_reporter: Vec<f64> = self
            .rates
            .values()
            .filter_map(|r| median(r.iter().copied().collect()))
            .collect();
        median(per_reporter)
    }
}

/// The median of `v` (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Observations of one peer by one reporter in one job the median is
/// taken over.
const RATES: usize = 7;
/// Jobs whose observations are kept at once (a bound on memory whatever
/// peers report).
const MAX_JOBS: usize = 10_000;
/// The estimate needs this many of them.
const MIN_RATES: usize = 3;
/// A delivered power measured this long ago is forgotten: the peer is on
/// probation again and measured anew.
const DELIVERED_TTL_MS: i64 = 10 * 60_000;

#[derive(Debug, Default)]
struct JobSums {
    peers: BTreeMap<PeerId, Sum>,
    updated: i64,
}

#[derive(Debug, Clone)]
struct Wait {
    waited_ms: u64,
    /// The peers hosting the processes waited for.
    hosts: BTreeSet<PeerId>,
    at: i64,
}

/// Who answers for a peer, for counting votes: its volunteer (the account
/// that enrolled it), or the peer itself when it has no enrollment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Party {
    Volunteer(i64),
    Peer(PeerId),
}

/// What the supernode has learned of its peers' delivered speed and
/// progress.
#[derive(Debug, Default)]
pub(crate) struct Verifier {
    jobs: HashMap<JobId, JobSums>,
    /// A peer's delivered power, as last measured, and when.
    delivered: HashMap<PeerId, (f64, i64)>,
    /// `(job, reporter)` → its newest long wait.
    waits: HashMap<(JobId, PeerId), Wait>,
}

impl Verifier {
    /// `reporter`'s observations of the other peers of its jobs, with the
    /// power placement used for each peer (`power`; `None`: offline or
    /// unknown).
    pub(crate) fn observe(
        &mut self,
        reporter: PeerId,
        observed: &[PeerObservation],
        power: impl Fn(PeerId) -> Option<f64>,
        cores: impl Fn(JobId, PeerId) -> u32,
        now: i64,
    ) {
        let mut touched = BTreeSet::new();
        for o in observed {
            if o.peer == reporter || o.supersteps == 0 || o.processes == 0 {
                continue;
            }
            if !self.jobs.contains_key(&o.job) && self.jobs.len() >= MAX_JOBS {
                continue;
            }
            let job = self.jobs.entry(o.job).or_default();
            job.updated = now;
            let s = job.peers.entry(o.peer).or_default();
            // Power is a core's speed: throughput per core in use (a peer
            // with more cores than processes is not slower for it, one
            // with more processes than cores runs them in turns).
            let in_use = o.processes.min(cores(o.job, o.peer).max(1));
            let work = f64::from(o.processes) / f64::from(in_use) * f64::from(o.supersteps);
            let rates = s.rates.entry(reporter).or_default();
            rates.push_back(work / (o.busy_ms as f64).max(1.0));
            if rates.len() > RATES {
                rates.pop_front();
            }
            s.supersteps += f64::from(o.supersteps);
            s.busy_ms += o.busy_ms as f64;
            touched.insert(o.job);
        }
        for job in touched {
            self.estimate(job, &power, now);
        }
        self.jobs.retain(|_, j| now - j.updated < JOB_TTL_MS);
    }

    fn estimate(&mut self, job: JobId, power: &impl Fn(PeerId) -> Option<f64>, now: i64) {
        let Some(sums) = self.jobs.get_mut(&job) else {
            return;
        };
        let rates: Vec<(PeerId, f64, f64)> = sums
            .peers
            .iter()
            .filter(|(_, s)| {
                s.busy_ms >= MIN_BUSY_MS
                    && s.supersteps >= MIN_SUPERSTEPS
                    && s.observations() >= MIN_RATES
            })
            .filter_map(|(&peer, s)| {
                let p = power(peer).filter(|p| *p > 0.0)?;
                Some((peer, s.rate()?, p))
            })
            .collect();
        if rates.len() < 2 {
            return;
        }
        let ratios: Vec<f64> = rates.iter().map(|(_, rho, p)| rho / p).collect();
        let reference = if ratios.len() == 2 {
            ratios.iter().copied().fold(f64::MIN, f64::max)
        } else {
            median(ratios).unwrap_or(0.0)
        };
        if !(reference.is_finite() && reference > 0.0) {
            return;
        }
        for (peer, rho, _) in rates {
            self.delivered.insert(peer, (rho / reference, now));
        }
        if sums.peers.values().any(|s| s.busy_ms > WINDOW_MS) {
            for s in sums.peers.values_mut() {
                s.supersteps /= 2.0;
                s.busy_ms /= 2.0;
            }
        }
    }

    /// The power placement may give `peer`, which claims `claimed`, while
    /// the median power of the other online peers is `median_others`
    /// (`None`: there are none).
    pub(crate) fn allowed(
        &self,
        peer: PeerId,
        claimed: f64,
        median_others: Option<f64>,
        now: i64,
    ) -> f64 {
        let cap = match self.delivered(peer, now) {
            Some(d) => d * SLACK,
            None => match median_others.filter(|m| *m > 0.0) {
                Some(m) => m * PROBATION,
                None => return claimed,
            },
        };
        claimed.min(cap)
    }

    /// The power `peer` delivered when last measured, unless that is too
    /// long ago.
    pub(crate) fn delivered(&self, peer: PeerId, now: i64) -> Option<f64> {
        self.delivered
            .get(&peer)
            .filter(|(_, at)| now - at < DELIVERED_TTL_MS)
            .map(|(d, _)| *d)
    }

    /// `reporter`'s long waits; `hosts(job, pids)` names the peers hosting
    /// those processes now.
    pub(crate) fn waits(
        &mut self,
        reporter: PeerId,
        waits: &[BarrierWait],
        hosts: impl Fn(JobId, &[bsp_api::Pid]) -> BTreeSet<PeerId>,
        now: i64,
    ) {
        self.waits
            .retain(|&(_, r), w| r != reporter && now - w.at < WAIT_TTL_MS);
        for w in waits {
            let mut hosts = hosts(w.job, &w.pids);
            hosts.remove(&reporter);
            self.waits.insert(
                (w.job, reporter),
                Wait {
                    waited_ms: w.waited_ms,
                    hosts,
                    at: now,
                },
            );
        }
    }

    /// The peers of `job` (whose peers hosting processes are `job_peers`
    /// and whose superstep limit is `limit_ms`) that make no progress.
    /// `party(peer)` names who answers for a peer: its volunteer's
    /// account, or for a peer without an enrollment the peer itself. A
    /// volunteer counts once however many of her peers blame someone, so
    /// one with many peers in a job cannot outvote the others; her own
    /// peers do not judge each other unless she is the job's only
    /// volunteer.
    pub(crate) fn stalled(
        &self,
        job: JobId,
        job_peers: &BTreeSet<PeerId>,
        party: impl Fn(PeerId) -> Party,
        limit_ms: u64,
        now: i64,
    ) -> Vec<PeerId> {
        let bound = limit_ms
            .saturating_mul(2)
            .max(MIN_STALL_MS)
            .saturating_add(STALL_GRACE_MS);
        let current = |r: PeerId| {
            self.waits
                .get(&(job, r))
                .filter(|w| now - w.at < WAIT_TTL_MS)
        };
        job_peers
            .iter()
            .copied()
            .filter(|&x| {
                // Held up itself by a peer that does not wait for it in
                // turn: that one is to blame, not x. (A wait that names
                // only peers waiting for x, or nobody, excuses nothing.)
                let held_up = current(x).is_some_and(|w| {
                    w.waited_ms >= bound
                        && w.hosts
                            .iter()
                            .any(|&z| z != x && !current(z).is_some_and(|wz| wz.hosts.contains(&x)))
                });
                if held_up {
                    return false;
                }
                let blames = |r: PeerId| {
                    current(r).is_some_and(|w| w.waited_ms >= bound && w.hosts.contains(&x))
                };
                let mine = party(x);
                let judges: Vec<PeerId> = job_peers.iter().copied().filter(|&r| r != x).collect();
                let strangers: Vec<PeerId> = judges
                    .iter()
                    .copied()
                    .filter(|&r| party(r) != mine)
                    .collect();
                if strangers.is_empty() {
                    // One volunteer's job: her peers, one vote each.
                    let blaming = judges.iter().filter(|&&r| blames(r)).count();
                    return !judges.is_empty() && 2 * blaming > judges.len();
                }
                let parties: BTreeSet<Party> = strangers.iter().map(|&r| party(r)).collect();
                let blaming: BTreeSet<Party> = strangers
                    .iter()
                    .filter(|&&r| blames(r))
                    .map(|&r| party(r))
                    .collect();
                2 * blaming.len() > parties.len()
            })
            .collect()
    }

    /// Forget peers that are gone.
    pub(crate) fn forget(&mut self, gone: &[PeerId]) {
        for p in gone {
            self.delivered.remove(p);
        }
        self.waits.retain(|(_, r), _| !gone.contains(r));
        for j in self.jobs.values_mut() {
            j.peers.retain(|p, _| !gone.contains(p));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(
        job: JobId,
        peer: PeerId,
        processes: u32,
        supersteps: u32,
        busy_ms: u64,
    ) -> PeerObservation {
        PeerObservation {
            job,
            peer,
            processes,
            supersteps,
            busy_ms,
        }
    }

    /// Three honest peers of power 1 and a liar claiming 100 on the same
    /// kind of machine, holding 12 of 16 processes: its superstep takes
    /// six times as long as theirs (two processes each on two cores).
    #[test]
    fn a_liar_is_capped_near_its_delivered_power_and_honest_peers_are_not() {
        let mut v = Verifier::default();
        let claimed = |p: PeerId| Some(if p == 4 { 100.0 } else { 1.0 });
        // Unmeasured: probation at twice the others' median.
        assert_eq!(v.allowed(4, 100.0, Some(1.0), 0), 2.0);
        assert_eq!(v.allowed(4, 1.5, Some(1.0), 0), 1.5);
        // Alone, a peer is believed.
        assert_eq!(v.allowed(4, 100.0, None, 0), 100.0);
        // Honest peers hold 1–2 processes (2 ms a superstep each), the
        // liar 12 (12 ms: six rounds of two on its two cores).
        for reporter in 1..=4 {
            let mut o = Vec::new();
            for peer in 1..=4 {
                let (n, ms) = if peer == 4 {
                    (12, 12)
                } else {
                    (if peer == 1 { 2 } else { 1 }, 2)
                };
                o.push(obs(9, peer, n, 1000, 1000 * ms));
            }
            v.observe(reporter, &o, claimed, |_, _| 2, 0);
        }
        let liar = v.delivered(4, 0).unwrap();
        assert!((0.5..=2.0).contains(&liar), "the liar delivered {liar}");
        assert!(v.allowed(4, 100.0, Some(1.0), 0) <= 2.0 * SLACK);
        for honest in 1..=3 {
            assert_eq!(v.allowed(honest, 1.0, Some(100.0), 0), 1.0);
        }
        // Its own reports about itself count for nothing.
        let mut w = Verifier::default();
        w.observe(4, &[obs(9, 4, 12, 100, 1)], claimed, |_, _| 2, 0);
        assert_eq!(w.delivered(4, 0), None);
    }

    /// One slow stretch of an honest peer (a handover, a burst of load)
    /// among normal ones does not cap it; an estimate expires.
    #[test]
    fn one_slow_observation_does_not_cap_an_honest_peer_and_estimates_expire() {
        let mut v = Verifier::default();
        let power = |_: PeerId| Some(1.0);
        for round in 0..6 {
            for reporter in 1..=3 {
                let o: Vec<PeerObservation> = (1..=3)
                    .map(|peer| {
                        // Peer 3's first observation took 100 times as long.
                        let ms = if peer == 3 && round == 0 { 20_000 } else { 200 };
                        obs(9, peer, 1, 100, ms)
                    })
                    .collect();
                v.observe(reporter, &o, power, |_, _| 2, round);
            }
        }
        let d = v.delivered(3, 6).unwrap();
        assert!((0.9..=1.1).contains(&d), "peer 3 delivered {d}");
        assert_eq!(v.allowed(3, 1.0, Some(1.0), 6), 1.0);
        // Ten minutes on, nothing is known: probation again.
        assert_eq!(v.delivered(3, 6 + DELIVERED_TTL_MS), None);
        assert_eq!(v.allowed(3, 100.0, Some(1.0), 6 + DELIVERED_TTL_MS), 2.0);
    }

    #[test]
    fn a_peer_blamed_by_most_others_past_the_limit_is_stalled() {
        let mut v = Verifier::default();
        let peers = BTreeSet::from([1, 2, 3, 4]);
        // Peer 4 hosts pid 7; peers 1 and 2 wait for it beyond the bound.
        let hosts = |_: JobId, pids: &[bsp_api::Pid]| {
            pids.iter()
                .map(|&p| match p {
                    7 => 4,
                    8 => 3,
                    _ => 1,
                })
                .collect()
        };
        let long = |ms| {
            vec![BarrierWait {
                job: 9,
                waited_ms: ms,
                pids: vec![7],
            }]
        };
        v.waits(1, &long(70_001), hosts, 0);
        // One of three is not a majority.
        assert!(v.stalled(9, &peers, Party::Peer, 30_000, 0).is_empty());
        v.waits(2, &long(70_000), hosts, 0);
        assert_eq!(v.stalled(9, &peers, Party::Peer, 30_000, 0), vec![4]);
        // Not past the limit plus the grace: not stalled.
        assert!(v.stalled(9, &peers, Party::Peer, 30_001, 0).is_empty());
        // Reports go stale.
        assert!(
            v.stalled(9, &peers, Party::Peer, 30_000, WAIT_TTL_MS)
                .is_empty()
        );
        // An excuse naming a peer that waits for it in turn, or a short
        // wait, excuses nothing.
        let waits_for = |pid, ms| {
            vec![BarrierWait {
                job: 9,
                waited_ms: ms,
                pids: vec![pid],
            }]
        };
        v.waits(4, &waits_for(1, 70_000), hosts, 0);
        assert_eq!(v.stalled(9, &peers, Party::Peer, 30_000, 0), vec![4]);
        v.waits(4, &waits_for(8, 1_000), hosts, 0);
        assert_eq!(v.stalled(9, &peers, Party::Peer, 30_000, 0), vec![4]);
        // A peer held up past the bound by one that does not wait for it
        // (peer 3, hosting pid 8) is not to blame.
        v.waits(4, &waits_for(8, 70_000), hosts, 0);
        assert!(v.stalled(9, &peers, Party::Peer, 30_000, 0).is_empty());
        // A new report of a reporter replaces its old one; no wait: none.
        v.waits(4, &[], hosts, 1);
        v.waits(1, &[], hosts, 1);
        assert!(v.stalled(9, &peers, Party::Peer, 30_000, 1).is_empty());
        v.forget(&[2]);
        assert!(v.stalled(9, &peers, Party::Peer, 30_000, 1).is_empty());
    }

    #[test]
    fn a_volunteer_with_many_peers_blames_once() {
        let mut v = Verifier::default();
        // Peers 1, 2 and 3 are Mallory's, 4 is Alice's (hosting pid 7),
        // 5 and 6 are Bob's and Carol's.
        let peers = BTreeSet::from([1, 2, 3, 4, 5, 6]);
        let party = |p: PeerId| {
            Party::Volunteer(match p {
                1..=3 => 10,
                4 => 11,
                5 => 12,
                _ => 13,
            })
        };
        let hosts = |_: JobId, pids: &[bsp_api::Pid]| {
            pids.iter().map(|&p| if p == 7 { 4 } else { 1 }).collect()
        };
        let long = vec![BarrierWait {
            job: 9,
            waited_ms: 70_000,
            pids: vec![7],
        }];
        for r in [1, 2, 3] {
            v.waits(r, &long, hosts, 0);
        }
        // Three of five peers, but one of three volunteers: no majority.
        assert!(v.stalled(9, &peers, party, 30_000, 0).is_empty());
        // Counted per peer, Mallory would have had her way.
        assert_eq!(v.stalled(9, &peers, Party::Peer, 30_000, 0), vec![4]);
        // Bob agrees: two of three volunteers.
        v.waits(5, &long, hosts, 0);
        assert_eq!(v.stalled(9, &peers, party, 30_000, 0), vec![4]);
        // A job of one volunteer's peers: they judge each other.
        let alone = |_: PeerId| Party::Volunteer(10);
        let mut w = Verifier::default();
        w.waits(1, &long, hosts, 0);
        let mine = BTreeSet::from([1, 2, 4]);
        assert!(w.stalled(9, &mine, alone, 30_000, 0).is_empty());
        w.waits(2, &long, hosts, 0);
        assert_eq!(w.stalled(9, &mine, alone, 30_000, 0), vec![4]);
    }
}
