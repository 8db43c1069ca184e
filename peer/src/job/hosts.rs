//! Who runs each process of the job: one peer per copy. Without
//! redundancy a process has one copy; with redundancy `r` it has `r`, on
//! peers of different volunteers, and every result of the process (its
//! messages, its `Done`s with the digest of its state, its output) counts
//! only once `r` peers sent the same ([`crate::barrier`]). Copy 0 alone
//! replicates checkpoints: the copies' states are the same.

use bsp_api::{PeerId, Pid};

/// The hosts of every pid, from an assignment's `placement`
/// (`placement[c * nprocs + pid]` runs copy `c` of `pid`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hosts {
    copies: usize,
    /// Pid-major: the hosts of `pid` are `table[pid * copies..][..copies]`,
    /// copy 0 first.
    table: Vec<PeerId>,
}

impl Hosts {
    /// `slots` in assignment order (copy-major). `slots.len()` must be a
    /// multiple of `nprocs` ([`super::check_assignment`] checks it).
    pub(crate) fn new(nprocs: u32, slots: &[PeerId]) -> Hosts {
        let n = nprocs.max(1) as usize;
        let copies = (slots.len() / n).max(1);
        let mut table = Vec::with_capacity(slots.len());
        for pid in 0..n {
            for c in 0..copies {
                table.push(slots[c * n + pid]);
            }
        }
        Hosts { copies, table }
    }

    /// Copies of each process (the job's redundancy).
    pub(crate) fn copies(&self) -> usize {
        self.copies
    }

    /// The peers that run `pid`, copy 0 first.
    pub(crate) fn of(&self, pid: Pid) -> &[PeerId] {
        let at = pid as usize * self.copies;
        self.table.get(at..at + self.copies).unwrap_or(&[])
    }

    /// Whether `peer` runs a copy of `pid`.
    pub(crate) fn runs(&self, pid: Pid, peer: PeerId) -> bool {
        self.of(pid).contains(&peer)
    }

    /// Whether `peer` runs copy 0 of `pid`, the one that replicates its
    /// checkpoints.
    pub(crate) fn is_primary(&self, pid: Pid, peer: PeerId) -> bool {
        self.of(pid).first() == Some(&peer)
    }

    /// How many processes `peer` runs (copies counted).
    pub(crate) fn count_on(&self, peer: PeerId) -> u32 {
        self.table.iter().filter(|&&p| p == peer).count() as u32
    }

    /// The pids `peer` runs a copy of, ascending.
    pub(crate) fn pids_on(&self, peer: PeerId) -> Vec<Pid> {
        (0..(self.table.len() / self.copies) as Pid)
            .filter(|&pid| self.runs(pid, peer))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_read_from_the_copy_major_placement() {
        // 3 pids, 2 copies: copy 0 on 10, 11, 12; copy 1 on 20, 21, 10.
        let h = Hosts::new(3, &[10, 11, 12, 20, 21, 10]);
        assert_eq!(h.copies(), 2);
        assert_eq!(h.of(0), &[10, 20]);
        assert_eq!(h.of(2), &[12, 10]);
        assert_eq!(h.of(3), &[] as &[PeerId]);
        assert!(h.is_primary(2, 12) && !h.is_primary(2, 10));
        assert!(h.runs(2, 10));
        assert_eq!(h.count_on(10), 2);
        assert_eq!(h.pids_on(10), vec![0, 2]);
        let one = Hosts::new(2, &[5, 6]);
        assert_eq!(one.copies(), 1);
        assert_eq!(one.of(1), &[6]);
    }
}
