//! The supernode's decisions about a job's epochs, as pure functions
//! (`docs/fault-tolerance.md`, "Failure and restore", "Migration and
//! drain"): which processes of lost peers are restored where, which move
//! for a load change or a drain, which peers the next epoch has, and what
//! its assignment tells the peers to restore and migrate.
//!
//! The supernode loads a job's placements and peers from its database,
//! decides here, and writes the result back in one transaction; the peer's
//! whole-job simulator drives the same functions with its virtual peers. No
//! function reads a clock, a database or a random number generator: where
//! a decision needs the DHHT or the twin rule of redundancy, the caller
//! passes it in as a function.

use std::collections::BTreeSet;

use crate::PeerId;

/// A process slot: `copy * nprocs + pid` with redundancy, the pid itself
/// without.
pub type Slot = u32;

/// Why a process left its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveKind {
    /// The host was lost; the process is restored from its newest
    /// replicated checkpoint.
    Lost,
    /// The host is alive and hands the process over at its next sync.
    Migrate,
}

impl MoveKind {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveKind::Lost => "lost",
            MoveKind::Migrate => "migrate",
        }
    }

    /// The kind named `s`, as [`MoveKind::as_str`] writes it.
    pub fn parse(s: &str) -> Option<MoveKind> {
        match s {
            "lost" => Some(MoveKind::Lost),
            "migrate" => Some(MoveKind::Migrate),
            _ => None,
        }
    }
}

/// Where one process slot of a job runs, and how it got there.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    /// The slot.
    pub pid: Slot,
    /// The current host.
    pub peer: PeerId,
    /// Golden index of the process's DHHT position.
    pub position: u64,
    /// The epoch of its last move, if it moved.
    pub moved_epoch: Option<u64>,
    /// The host before its last move.
    pub moved_from: Option<PeerId>,
    /// Why it last moved.
    pub moved_kind: Option<MoveKind>,
    /// Whether the old host of its migration reported the handover.
    pub handed_over: bool,
}

impl Placed {
    /// The old host that still runs this migrating process until it
    /// reports the handover.
    pub fn handing_over_from(&self) -> Option<PeerId> {
        if self.moved_kind == Some(MoveKind::Migrate) && !self.handed_over {
            self.moved_from
        } else {
            None
        }
    }

    /// Whether `peer` may report about this process: its host, or the old
    /// host of a migration that is not handed over yet.
    pub fn is_run_by(&self, peer: PeerId) -> bool {
        self.peer == peer || self.handing_over_from() == Some(peer)
    }
}

/// A change of a job's assignment: one new epoch.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Change {
    /// Processes that move: `(slot, new host)`.
    pub moves: Vec<(Slot, PeerId)>,
    /// Whether the moves migrate (old host alive) or restore lost
    /// processes.
    pub migrate: bool,
    /// Slots restored where they are: their migration's old host was lost
    /// before it handed them over.
    pub restore_in_place: Vec<Slot>,
    /// Peers that leave the job (lost ones; live ones are told to stop).
    pub leave: Vec<PeerId>,
}

/// The index in `rows` (ordered by slot) of `slot`'s row.
pub fn row_index(rows: &[Placed], slot: Slot) -> Option<usize> {
    rows.binary_search_by_key(&slot, |r| r.pid).ok()
}

/// The host of slot `q` among `rows` (ordered by slot).
pub fn peer_of_slot(rows: &[Placed], q: Slot) -> Option<PeerId> {
    row_index(rows, q).map(|i| rows[i].peer)
}

/// For each row of `rows`, the peers that run its slot now: its host and,
/// until the handover, a migration's old host; `gone` peers run nothing.
pub fn runners(rows: &[Placed], gone: &[PeerId]) -> Vec<Vec<PeerId>> {
    rows.iter()
        .map(|r| {
            [Some(r.peer), r.handing_over_from()]
                .into_iter()
                .flatten()
                .filter(|p| !gone.contains(p))
                .collect()
        })
        .collect()
}

/// Where a lost process goes without redundancy: its DHHT host if it can
/// take work, else the first live peer of the job, else any peer that can
/// take work, else any live one.
pub fn fallback_host(
    dhht: Option<PeerId>,
    job_live: &[PeerId],
    usable: &BTreeSet<PeerId>,
    live: &BTreeSet<PeerId>,
) -> Option<PeerId> {
    dhht.or_else(|| job_live.first().copied())
        .or_else(|| usable.first().copied())
        .or_else(|| live.first().copied())
}

/// What to do about a job's lost peers.
#[derive(Debug, Clone, PartialEq)]
pub struct Restore {
    /// The next epoch: the lost peers' slots placed again, slots whose
    /// migration's old host was lost restored in place, the lost peers
    /// leaving.
    pub change: Change,
    /// Slots no peer can take: the job fails.
    pub homeless: Vec<Slot>,
}

/// Restores the slots of the `gone` peers of a job placed as `rows`:
/// `host(row, running)` says where the lost `row` goes, given who runs
/// each row now (`running[i]` for `rows[i]`, updated with the moves decided
/// before it), or `None` if nobody can take it.
pub fn plan_restore(
    rows: &[Placed],
    gone: &[PeerId],
    mut host: impl FnMut(&Placed, &[Vec<PeerId>]) -> Option<PeerId>,
) -> Restore {
    let mut running = runners(rows, gone);
    let restore_in_place = rows
        .iter()
        .filter(|r| {
            !gone.contains(&r.peer) && r.handing_over_from().is_some_and(|p| gone.contains(&p))
        })
        .map(|r| r.pid)
        .collect();
    let mut moves = Vec::new();
    let mut homeless = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        if !gone.contains(&row.peer) {
            continue;
        }
        match host(row, &running) {
            Some(t) => {
                moves.push((row.pid, t));
                running[i] = vec![t];
            }
            None => homeless.push(row.pid),
        }
    }
    Restore {
        change: Change {
            moves,
            migrate: false,
            restore_in_place,
            leave: gone.to_vec(),
        },
        homeless,
    }
}

/// The migrations a job's placement calls for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rebalance {
    /// `(slot, new host)` to migrate now.
    pub moves: Vec<(Slot, PeerId)>,
    /// `(slot, old host)` of the moves made for a load change (not a
    /// drain), for the hysteresis to remember.
    pub load_moves: Vec<(Slot, PeerId)>,
    /// Whether some move leaves a draining peer: it goes now even if the
    /// job migrated recently.
    pub forced: bool,
    /// Whether some move waits for later (a handover under way, the
    /// hysteresis).
    pub pending: bool,
}

/// The migrations of a job placed as `rows`: `target(row, running)` is
/// where `row` should run now (its DHHT host, perhaps adjusted by the twin
/// rule; `running` as in [`plan_restore`]); a slot that is still being
/// handed over does not move again; one that leaves a `draining` peer must
/// move; one that leaves a `busy` peer (no power: its volunteer uses the
/// machine) moves whatever the hysteresis says, as a load move; any other
/// moves only where `allows(slot, to)` (the hysteresis).
pub fn plan_rebalance(
    rows: &[Placed],
    draining: &BTreeSet<PeerId>,
    busy: &BTreeSet<PeerId>,
    mut target: impl FnMut(&Placed, &[Vec<PeerId>]) -> Option<PeerId>,
    mut allows: impl FnMut(Slot, PeerId) -> bool,
) -> Rebalance {
    let mut running = runners(rows, &[]);
    let mut plan = Rebalance::default();
    for (i, row) in rows.iter().enumerate() {
        let Some(to) = target(row, &running).filter(|p| *p != row.peer) else {
            continue;
        };
        if row.handing_over_from().is_some() {
            plan.pending = true;
            continue;
        }
        if draining.contains(&row.peer) {
            plan.forced = true;
        } else if busy.contains(&row.peer) || allows(row.pid, to) {
            plan.load_moves.push((row.pid, row.peer));
        } else {
            plan.pending = true;
            continue;
        }
        plan.moves.push((row.pid, to));
        // The old host runs it until the handover.
        running[i].push(to);
    }
    plan
}

/// Applies `change` to `rows` as epoch `epoch`: moved slots get their new
/// host and remember the old one; slots restored in place are marked lost
/// in this epoch.
pub fn apply(rows: &mut [Placed], change: &Change, epoch: u64) {
    let kind = if change.migrate {
        MoveKind::Migrate
    } else {
        MoveKind::Lost
    };
    for &(slot, to) in &change.moves {
        if let Some(i) = row_index(rows, slot) {
            let r = &mut rows[i];
            r.moved_from = Some(r.peer);
            r.peer = to;
            r.moved_epoch = Some(epoch);
            r.moved_kind = Some(kind);
            r.handed_over = false;
        }
    }
    for &slot in &change.restore_in_place {
        if let Some(i) = row_index(rows, slot) {
            let r = &mut rows[i];
            r.moved_epoch = Some(epoch);
            r.moved_kind = Some(MoveKind::Lost);
            r.handed_over = false;
        }
    }
}

/// The peers of the next epoch and those that leave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Peers {
    /// The job's peers, in order: the ones it had that stay, new hosts,
    /// then replica-only peers.
    pub peers: Vec<PeerId>,
    /// Draining peers that leave because they host and hand over nothing.
    pub drained: Vec<PeerId>,
}

/// The peers of a job's next epoch, after `change` was [`apply`]ed to
/// `rows`: the old ones (`before`) except those that leave, every host,
/// without draining peers that host and hand over nothing, topped up from
/// `ranked` (peers that can take work, best first) to `replicas + 1`
/// peers.
pub fn next_peers(
    before: &[PeerId],
    rows: &[Placed],
    change: &Change,
    draining: &BTreeSet<PeerId>,
    ranked: &[PeerId],
    replicas: u32,
) -> Peers {
    let mut peers: Vec<PeerId> = before
        .iter()
        .copied()
        .filter(|p| !change.leave.contains(p))
        .collect();
    for row in rows {
        if !peers.contains(&row.peer) {
            peers.push(row.peer);
        }
    }
    let drained: Vec<PeerId> = peers
        .iter()
        .copied()
        .filter(|&p| draining.contains(&p) && !rows.iter().any(|r| r.is_run_by(p)))
        .collect();
    peers.retain(|p| !drained.contains(p));
    top_up(
        &mut peers,
        replicas,
        ranked
            .iter()
            .copied()
            .filter(|p| !change.leave.contains(p) && !drained.contains(p)),
    );
    Peers { peers, drained }
}

/// Adds peers from `ranked` (best first) that are not among `peers` yet
/// until there are `replicas + 1`, if there are enough.
pub fn top_up(peers: &mut Vec<PeerId>, replicas: u32, ranked: impl IntoIterator<Item = PeerId>) {
    let want = replicas as usize + 1;
    for p in ranked {
        if peers.len() >= want {
            break;
        }
        if !peers.contains(&p) {
            peers.push(p);
        }
    }
}

/// Whether `peers` include a draining peer that hosts and hands over
/// nothing of a job placed as `rows`: it may leave (a new epoch without
/// changes lets it go).
pub fn has_idle_drainer(peers: &[PeerId], rows: &[Placed], draining: &BTreeSet<PeerId>) -> bool {
    peers
        .iter()
        .any(|&p| draining.contains(&p) && !rows.iter().any(|r| r.is_run_by(p)))
}

/// The pids an assignment of `change` names in `restore` and in
/// `migrate`: moves name slots, peers act on pids (every copy of a pid
/// runs as that pid).
pub fn restore_and_migrate(change: &Change, nprocs: u32) -> (Vec<u32>, Vec<u32>) {
    let pid_of = |slot: Slot| slot % nprocs.max(1);
    let mut restore: Vec<u32> = change
        .moves
        .iter()
        .map(|&(slot, _)| slot)
        .chain(change.restore_in_place.iter().copied())
        .map(pid_of)
        .collect();
    restore.sort_unstable();
    restore.dedup();
    let mut migrate: Vec<u32> = if change.migrate {
        change.moves.iter().map(|&(slot, _)| pid_of(slot)).collect()
    } else {
        Vec::new()
    };
    migrate.sort_unstable();
    migrate.dedup();
    (restore, migrate)
}

/// Why a job's placements make no assignment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EpochError {
    /// A slot between 0 and the last has no row.
    #[error("slot {slot} has no placement (found slot {found} there)")]
    MissingSlot {
        /// The slot expected.
        slot: Slot,
        /// The slot found in its place.
        found: Slot,
    },
    /// A slot's host is not among the job's peers.
    #[error("slot {slot} is placed on peer #{peer} which is not among the job's peers")]
    HostNotAPeer {
        /// The slot.
        slot: Slot,
        /// Its host.
        peer: PeerId,
    },
    /// Fewer or more rows than slots.
    #[error("{rows} placements for {slots} slots")]
    WrongCount {
        /// Rows found.
        rows: usize,
        /// Slots the job has.
        slots: u32,
    },
}

/// The assignment's `placement`: for each of `slots` slots, the index of
/// its host in `peers`.
pub fn placement_indices(
    rows: &[Placed],
    peers: &[PeerId],
    slots: u32,
) -> Result<Vec<u32>, EpochError> {
    let mut placement = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        if row.pid as usize != i {
            return Err(EpochError::MissingSlot {
                slot: i as Slot,
                found: row.pid,
            });
        }
        let at = peers
            .iter()
            .position(|&p| p == row.peer)
            .ok_or(EpochError::HostNotAPeer {
                slot: row.pid,
                peer: row.peer,
            })?;
        placement.push(at as u32);
    }
    if placement.len() != slots as usize {
        return Err(EpochError::WrongCount {
            rows: placement.len(),
            slots,
        });
    }
    Ok(placement)
}

/// The slot of a job of `nprocs` pids placed as `rows` that `peer`
/// reports handing over when it names `pid` and `epoch`: the copy of `pid`
/// it still hands over, if that migration is of `epoch` or older; `None`
/// for a stale report (another host, a newer move). A peer never runs two
/// copies of one pid, so its pid names one slot.
pub fn handover_slot(
    rows: &[Placed],
    nprocs: u32,
    peer: PeerId,
    pid: u32,
    epoch: u64,
) -> Option<Slot> {
    if pid >= nprocs {
        return None;
    }
    (pid..)
        .step_by(nprocs as usize)
        .map_while(|slot| rows.get(slot as usize))
        .find(|r| r.handing_over_from() == Some(peer))
        .filter(|r| r.moved_epoch.is_some_and(|m| epoch >= m))
        .map(|r| r.pid)
}

#[cfg(test)]
mod tests;
