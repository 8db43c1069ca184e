//! The peer's memory budget (issue 20, finding 1): the most memory the
//! volunteer lets bspweb use on their machine (`--memory-budget-mib`),
//! checked against what the peer process really holds, its resident size.
//!
//! A message lives in several host copies (the sender's outbox and
//! checkpoint, the replicas other peers keep, the receiver's inbox), so
//! limits per process alone let a job drive a peer into the kernel's OOM
//! killer. Instead, every place where a job makes the peer hold more asks
//! the budget first:
//!
//! - a guest growing its linear memory (the store's resource limiter);
//! - a guest queueing messages (the `send` host functions);
//! - a job at each barrier: when the peer is over its budget, the job that
//!   holds the most bytes for fault tolerance here (retained messages,
//!   replicas) fails, saying why, instead of the whole peer going down.
//!
//! The resident size is read from `/proc/self/statm` by the runtime's epoch
//! thread every [`REFRESH_TICKS`] ticks, so a check costs two atomic loads.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bsp_api::JobId;

/// Epoch ticks (10 ms) between two readings of the resident size.
pub const REFRESH_TICKS: u32 = 5;

const MIB: u64 = 1 << 20;

/// The budget and what the peer holds.
#[derive(Debug, Default)]
pub struct MemoryBudget {
    /// Bytes the peer may hold; 0: no budget.
    limit: AtomicU64,
    /// The peer process's resident size at the last reading.
    resident: AtomicU64,
    /// Bytes each job holds for fault tolerance on this peer.
    held: Mutex<HashMap<JobId, u64>>,
}

impl MemoryBudget {
    /// A budget of `limit` bytes (0: none).
    pub fn new(limit: u64) -> MemoryBudget {
        let b = MemoryBudget {
            limit: AtomicU64::new(limit),
            ..MemoryBudget::default()
        };
        b.refresh();
        b
    }

    /// Set the budget (0: none).
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// The budget in bytes (0: none).
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// The resident size at the last reading.
    pub fn resident(&self) -> u64 {
        self.resident.load(Ordering::Relaxed)
    }

    /// Read the resident size now.
    pub fn refresh(&self) {
        if let Some(rss) = crate::sysinfo::rss_bytes() {
            self.resident.store(rss, Ordering::Relaxed);
        }
    }

    /// Record what a resident size reading said (tests).
    #[cfg(test)]
    pub fn set_resident(&self, bytes: u64) {
        self.resident.store(bytes, Ordering::Relaxed);
    }

    /// Whether the peer may hold `more` bytes on top of what it holds.
    pub fn fits(&self, more: u64) -> bool {
        let limit = self.limit();
        limit == 0 || self.resident().saturating_add(more) <= limit
    }

    /// Whether the peer holds more than its budget.
    pub fn exceeded(&self) -> bool {
        !self.fits(0)
    }

    /// Record the bytes `job` holds for fault tolerance (0 forgets it).
    pub fn set_held(&self, job: JobId, bytes: u64) {
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if bytes == 0 {
            h.remove(&job);
        } else {
            h.insert(job, bytes);
        }
    }

    /// The job that holds the most bytes, if any holds some.
    pub fn largest_holder(&self) -> Option<JobId> {
        let h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        h.iter()
            .max_by_key(|&(job, bytes)| (*bytes, std::cmp::Reverse(*job)))
            .map(|(job, _)| *job)
    }

    /// Why a request for `more` bytes is refused, for the person who runs
    /// the job.
    pub fn refusal(&self, what: &str, more: u64) -> String {
        let held: u64 = {
            let h = self.held.lock().unwrap_or_else(|p| p.into_inner());
            h.values().sum()
        };
        // Mostly messages kept for a restore: say how to keep fewer.
        let retained = if held >= self.resident() / 2 && held > 0 {
            format!(
                "; {} MiB of it are messages and checkpoints kept for fault tolerance (senders keep every message since the last checkpoint): checkpoint more often if the job checkpoints rarely,",
                held / MIB
            )
        } else {
            ";".to_string()
        };
        format!(
            "{}, and {what} {} MiB more{retained} use fewer or smaller processes per peer, or send less per superstep",
            self.state(),
            more.div_ceil(MIB)
        )
    }

    /// What the peer holds against its budget, as words.
    pub fn state(&self) -> String {
        format!(
            "the peer is out of memory for bspweb: it holds {} MiB of the {} MiB its volunteer allows (--memory-budget-mib)",
            self.resident() / MIB,
            self.limit() / MIB
        )
    }
}

/// The default budget: half the machine's memory (`MemTotal` of
/// `/proc/meminfo`), or none if it cannot be read.
pub fn default_limit() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024 / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_fit_within_the_budget_only() {
        let b = MemoryBudget::new(0);
        b.set_resident(5 * MIB);
        assert!(b.fits(u64::MAX / 2), "no budget, no limit");
        b.set_limit(10 * MIB);
        assert!(b.fits(5 * MIB));
        assert!(!b.fits(5 * MIB + 1));
        assert!(!b.exceeded());
        b.set_resident(11 * MIB);
        assert!(b.exceeded());
        let why = b.refusal("this process asked for", 3 * MIB);
        assert!(why.contains("it holds 11 MiB of the 10 MiB"), "{why}");
        assert!(why.contains("asked for 3 MiB more"), "{why}");
        assert!(!why.contains("checkpoint more often"), "{why}");
        // Mostly messages kept for a restore: the advice says how to keep
        // fewer.
        b.set_held(7, 6 * MIB);
        let why = b.refusal("this process asked for", 3 * MIB);
        assert!(
            why.contains("6 MiB of it are messages and checkpoints kept for fault tolerance")
                && why.contains("checkpoint more often"),
            "{why}"
        );
    }

    #[test]
    fn the_largest_holder_is_the_job_holding_the_most() {
        let b = MemoryBudget::new(0);
        assert_eq!(b.largest_holder(), None);
        b.set_held(1, 10);
        b.set_held(2, 30);
        b.set_held(3, 20);
        assert_eq!(b.largest_holder(), Some(2));
        b.set_held(2, 0);
        assert_eq!(b.largest_holder(), Some(3));
    }

    #[test]
    fn the_resident_size_and_the_default_are_read() {
        let b = MemoryBudget::new(0);
        assert!(b.resident() > 0);
        assert!(default_limit() > 0);
    }
}
