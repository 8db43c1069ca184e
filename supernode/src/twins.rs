//! The twin rule of result validation by redundancy (issue 18): the copies
//! of one process run on peers of *different volunteers*, so one volunteer
//! (one account, however many machines it enrolled) can neither compute
//! both copies of a result nor outvote another volunteer alone.
//!
//! A job of `nprocs` processes with `redundancy` copies has `nprocs *
//! redundancy` *slots*: slot `c * nprocs + pid` is copy `c` of `pid`, as in
//! `JobAssignment::placement`. Placement treats the slots as an ordinary
//! job's processes (DHHT) and then repairs the twin rule here, the same way
//! at first placement, restore, migration and drain: a slot whose DHHT peer
//! shares a volunteer with another copy of its pid goes to the best allowed
//! peer by weighted rendezvous hashing of `(job, slot, peer)`, so every
//! supernode would choose the same, and a job's repaired copies spread over
//! the network by power.
//!
//! Who a peer's volunteer is: the account that owns the enrollment it logged
//! in with. Every login needs one now; a peer without (rows of older
//! versions, tests that write rows directly) is a volunteer of its own, as
//! [`crate::verify`] counts it.

use std::collections::{BTreeMap, BTreeSet};

use crate::sql::Connection;
use bsp_api::{JobId, PeerId, Pid};
use sha2::{Digest, Sha256};

use crate::Error;
pub(crate) use crate::verify::Party;

/// How the slots of a job map to its processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Copies {
    pub(crate) nprocs: u32,
    pub(crate) redundancy: u32,
}

impl Copies {
    /// Reads `job`'s process count and redundancy.
    pub(crate) fn of_job(tx: &Connection, job: JobId) -> Result<Copies, Error> {
        let (nprocs, redundancy): (u32, u32) = tx.query_row(
            "SELECT nprocs, redundancy FROM jobs WHERE id = ?1",
            [job],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(Copies {
            nprocs,
            redundancy: redundancy.max(1),
        })
    }

    /// Slots of the job: one per copy of each process.
    pub(crate) fn slots(self) -> u32 {
        self.nprocs.saturating_mul(self.redundancy)
    }

    /// The pid slot `slot` runs.
    pub(crate) fn pid(self, slot: u32) -> Pid {
        slot % self.nprocs.max(1)
    }

    /// Which copy of its pid slot `slot` is.
    pub(crate) fn copy(self, slot: u32) -> u32 {
        slot / self.nprocs.max(1)
    }

    /// The slot of copy `copy` of `pid`.
    pub(crate) fn slot(self, copy: u32, pid: Pid) -> u32 {
        copy * self.nprocs + pid
    }

    /// The slots of `pid`, copy 0 first.
    pub(crate) fn slots_of(self, pid: Pid) -> impl Iterator<Item = u32> {
        (0..self.redundancy).map(move |c| c * self.nprocs + pid)
    }

    /// The other slots that run `slot`'s pid.
    pub(crate) fn siblings(self, slot: u32) -> impl Iterator<Item = u32> {
        self.slots_of(self.pid(slot)).filter(move |&s| s != slot)
    }

    /// "pid 3" or "pids 1, 4" with one copy; "pid 3 (copy 1)" or "pids 1
    /// (copy 0), 4 (copy 1)" with more: slots as people read them.
    pub(crate) fn slot_list(self, slots: &[u32]) -> String {
        if self.redundancy <= 1 {
            return crate::jobs::pid_list(slots);
        }
        const SHOWN: usize = 20;
        let mut text = slots
            .iter()
            .take(SHOWN)
            .map(|&s| format!("{} (copy {})", self.pid(s), self.copy(s)))
            .collect::<Vec<_>>()
            .join(", ");
        if slots.len() > SHOWN {
            text.push_str(&format!(" and {} more", slots.len() - SHOWN));
        }
        if slots.len() == 1 {
            format!("pid {text}")
        } else {
            format!("pids {text}")
        }
    }
}

/// Each peer's volunteer, for the peers asked about.
#[derive(Debug, Clone, Default)]
pub(crate) struct Volunteers(BTreeMap<PeerId, Party>);

impl Volunteers {
    /// Reads the volunteers of `peers` (unknown peers answer for
    /// themselves).
    pub(crate) fn load(
        tx: &Connection,
        peers: impl IntoIterator<Item = PeerId>,
    ) -> Result<Volunteers, Error> {
        let mut stmt = tx.prepare_cached(
            "SELECT e.owner FROM peers p JOIN enrollments e ON e.id = p.enrollment \
             WHERE p.id = ?1",
        )?;
        let mut map = BTreeMap::new();
        for peer in peers {
            if map.contains_key(&peer) {
                continue;
            }
            let owner: Option<i64> = crate::sql::OptionalExtension::optional(
                stmt.query_row([peer], |r| r.get::<_, i64>(0)),
            )?;
            map.insert(peer, owner.map_or(Party::Peer(peer), Party::Volunteer));
        }
        Ok(Volunteers(map))
    }

    /// Volunteers given directly (tests, and callers that know them).
    #[cfg(test)]
    pub(crate) fn from_map(map: BTreeMap<PeerId, Party>) -> Volunteers {
        Volunteers(map)
    }

    /// `peer`'s volunteer.
    pub(crate) fn of(&self, peer: PeerId) -> Party {
        self.0.get(&peer).copied().unwrap_or(Party::Peer(peer))
    }

    /// How many different volunteers `peers` belong to.
    pub(crate) fn count(&self, peers: impl IntoIterator<Item = PeerId>) -> usize {
        peers
            .into_iter()
            .map(|p| self.of(p))
            .collect::<BTreeSet<_>>()
            .len()
    }
}

/// Whether `peer` may run a copy of a pid whose other copies run on
/// `others`: neither one of them nor a peer of the same volunteer.
pub(crate) fn allowed(vol: &Volunteers, peer: PeerId, others: &[PeerId]) -> bool {
    let mine = vol.of(peer);
    others.iter().all(|&o| o != peer && vol.of(o) != mine)
}

/// Weighted rendezvous rank of `peer` for `slot` of `job` (lower wins):
/// `-ln(u) / weight` with `u` uniform in (0, 1) from SHA-256 of the three,
/// so a peer of twice the power wins twice as often.
fn rank(job: JobId, slot: u32, peer: PeerId, weight: f64) -> f64 {
    let mut h = Sha256::new();
    h.update(b"bspweb twin of a process\0");
    h.update(job.to_le_bytes());
    h.update(slot.to_le_bytes());
    h.update(peer.to_le_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let u = ((u64::from_le_bytes(first) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -u.ln() / weight
}

/// The best peer of `candidates` (`(peer, power)`, power > 0) for `slot` of
/// `job` that [`allowed`] lets run it beside `others`, by weighted
/// rendezvous hashing; `None` if no candidate is allowed.
pub(crate) fn pick(
    job: JobId,
    slot: u32,
    candidates: &[(PeerId, f64)],
    vol: &Volunteers,
    others: &[PeerId],
) -> Option<PeerId> {
    candidates
        .iter()
        .filter(|&&(p, w)| w > 0.0 && w.is_finite() && allowed(vol, p, others))
        .map(|&(p, w)| (rank(job, slot, p, w), p))
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
        .map(|(_, p)| p)
}

/// Where `slot` should run: the DHHT's `target` if the twin rule allows it,
/// else `keep` (its current host, when it may stay) if allowed, else the
/// [`pick`] of `candidates`.
pub(crate) fn settle(
    job: JobId,
    slot: u32,
    target: Option<PeerId>,
    keep: Option<PeerId>,
    candidates: &[(PeerId, f64)],
    vol: &Volunteers,
    others: &[PeerId],
) -> Option<PeerId> {
    target
        .filter(|&t| allowed(vol, t, others))
        .or_else(|| keep.filter(|&k| allowed(vol, k, others)))
        .or_else(|| pick(job, slot, candidates, vol, others))
}

/// Why a job's slots cannot all be placed under the twin rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "each process needs peers of {needed} different volunteers, and the peers that can take work belong to {have}"
)]
pub(crate) struct TooFewVolunteers {
    pub(crate) needed: u32,
    pub(crate) have: usize,
}

/// Repairs a placement of all of a job's slots (`owners[slot]`, as the DHHT
/// chose) so that the copies of each pid run on peers of different
/// volunteers: copy 0 stays where the DHHT put it, and each further copy
/// that shares a volunteer with an earlier one moves to the [`pick`] of
/// `candidates`.
pub(crate) fn repair(
    job: JobId,
    copies: Copies,
    owners: &mut [PeerId],
    candidates: &[(PeerId, f64)],
    vol: &Volunteers,
) -> Result<(), TooFewVolunteers> {
    if copies.redundancy <= 1 {
        return Ok(());
    }
    let have = vol.count(candidates.iter().filter(|(_, w)| *w > 0.0).map(|&(p, _)| p));
    let too_few = TooFewVolunteers {
        needed: copies.redundancy,
        have,
    };
    if have < copies.redundancy as usize || owners.len() != copies.slots() as usize {
        return Err(too_few);
    }
    for pid in 0..copies.nprocs {
        for c in 1..copies.redundancy {
            let slot = copies.slot(c, pid);
            let earlier: Vec<PeerId> = (0..c)
                .map(|e| owners[copies.slot(e, pid) as usize])
                .collect();
            let here = owners[slot as usize];
            if allowed(vol, here, &earlier) {
                continue;
            }
            owners[slot as usize] = pick(job, slot, candidates, vol, &earlier).ok_or(too_few)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
