//! The replica's store: the newest verified snapshot per process.

use super::*;

/// A replica's snapshots: the newest verified one per process.
#[derive(Debug, Default)]
pub struct ReplicaStore {
    snapshots: HashMap<Pid, Snapshot>,
    bytes: u64,
}

impl ReplicaStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep `snapshot` (verified, e.g. from [`Assembler`]) if it is newer
    /// than the one held for its pid (or the same superstep: replaces it).
    /// Returns whether it was kept.
    pub fn insert(&mut self, snapshot: Snapshot) -> bool {
        if let Some(old) = self.snapshots.get(&snapshot.pid) {
            if old.superstep > snapshot.superstep {
                return false;
            }
            self.bytes -= old.size_bytes();
        }
        self.bytes += snapshot.size_bytes();
        self.snapshots.insert(snapshot.pid, snapshot);
        true
    }

    /// The snapshot of `pid` at `superstep`, if that is the one held.
    pub fn get(&self, pid: Pid, superstep: u32) -> Option<&Snapshot> {
        self.snapshots
            .get(&pid)
            .filter(|s| s.superstep == superstep)
    }

    /// The newest snapshot held of `pid`.
    pub fn newest(&self, pid: Pid) -> Option<&Snapshot> {
        self.snapshots.get(&pid)
    }

    /// Drop the snapshot of `pid`.
    pub fn remove_pid(&mut self, pid: Pid) -> Option<Snapshot> {
        let s = self.snapshots.remove(&pid)?;
        self.bytes -= s.size_bytes();
        Some(s)
    }

    /// Pids with a snapshot, ascending.
    pub fn pids(&self) -> Vec<Pid> {
        let mut v: Vec<Pid> = self.snapshots.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Bytes held ([`Snapshot::size_bytes`] summed).
    pub fn total_bytes(&self) -> u64 {
        self.bytes
    }
}
