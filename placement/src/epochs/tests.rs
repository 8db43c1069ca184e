use super::*;
use proptest::prelude::*;

fn row(pid: Slot, peer: PeerId) -> Placed {
    Placed {
        pid,
        peer,
        position: u64::from(pid),
        moved_epoch: None,
        moved_from: None,
        moved_kind: None,
        handed_over: false,
    }
}

/// A job of `hosts.len()` slots on peers 1..=6, some of them migrating
/// from `from[i]` (not handed over yet) in epoch 1.
fn job(hosts: &[PeerId], from: &[Option<PeerId>]) -> Vec<Placed> {
    hosts
        .iter()
        .enumerate()
        .map(|(i, &peer)| {
            let mut r = row(i as Slot, peer);
            if let Some(Some(old)) = from.get(i).filter(|o| o.is_some_and(|o| o != peer)) {
                r.moved_from = Some(*old);
                r.moved_epoch = Some(1);
                r.moved_kind = Some(MoveKind::Migrate);
            }
            r
        })
        .collect()
}

fn arb_job() -> impl Strategy<Value = (Vec<Placed>, Vec<PeerId>)> {
    (1usize..7).prop_flat_map(|n| {
        (
            prop::collection::vec(1i64..7, n),
            prop::collection::vec(prop::option::of(1i64..7), n),
            prop::collection::vec(1i64..7, 0..4),
        )
            .prop_map(|(hosts, from, extra)| {
                let rows = job(&hosts, &from);
                let mut peers: Vec<PeerId> = Vec::new();
                for p in rows
                    .iter()
                    .flat_map(|r| [Some(r.peer), r.handing_over_from()])
                    .flatten()
                    .chain(extra)
                {
                    if !peers.contains(&p) {
                        peers.push(p);
                    }
                }
                (rows, peers)
            })
    })
}

#[test]
fn a_lost_peer_s_processes_move_and_it_leaves() {
    let rows = job(&[1, 2, 1], &[]);
    let plan = plan_restore(&rows, &[1], |_, _| Some(3));
    assert_eq!(plan.homeless, Vec::<Slot>::new());
    assert_eq!(plan.change.moves, vec![(0, 3), (2, 3)]);
    assert_eq!(plan.change.leave, vec![1]);
    let mut after = rows.clone();
    apply(&mut after, &plan.change, 4);
    assert_eq!(after[0].peer, 3);
    assert_eq!(after[0].moved_from, Some(1));
    assert_eq!(after[0].moved_kind, Some(MoveKind::Lost));
    assert_eq!(after[1], rows[1]);
    let next = next_peers(&[1, 2], &after, &plan.change, &BTreeSet::new(), &[4, 5], 2);
    assert_eq!(next.peers, vec![2, 3, 4]);
    assert_eq!(restore_and_migrate(&plan.change, 3), (vec![0, 2], vec![]));
    assert_eq!(placement_indices(&after, &next.peers, 3), Ok(vec![1, 0, 1]));
}

#[test]
fn a_migration_whose_old_host_is_lost_is_restored_in_place() {
    let rows = job(&[2, 2], &[Some(1), None]);
    let plan = plan_restore(&rows, &[1], |_, _| None);
    assert_eq!(plan.change.moves, vec![]);
    assert_eq!(plan.change.restore_in_place, vec![0]);
    assert_eq!(restore_and_migrate(&plan.change, 2), (vec![0], vec![]));
    let mut after = rows;
    apply(&mut after, &plan.change, 5);
    assert_eq!(after[0].handing_over_from(), None);
    assert_eq!(after[0].moved_epoch, Some(5));
}

#[test]
fn handovers_name_the_migrating_copy_and_refuse_stale_reports() {
    // Two copies of two pids: slot 3 (copy 1 of pid 1) migrates from 4.
    let rows = job(&[1, 2, 3, 5], &[None, None, None, Some(4)]);
    assert_eq!(handover_slot(&rows, 2, 4, 1, 1), Some(3));
    assert_eq!(handover_slot(&rows, 2, 4, 1, 0), None, "older epoch");
    assert_eq!(handover_slot(&rows, 2, 5, 1, 1), None, "the new host");
    assert_eq!(handover_slot(&rows, 2, 4, 0, 1), None, "another pid");
    assert_eq!(handover_slot(&rows, 2, 4, 7, 1), None, "no such pid");
}

proptest! {
    /// After a restore every slot runs on a peer of the next epoch, no
    /// lost peer hosts or hands over anything or stays, and the
    /// assignment restores exactly the lost peers' pids and those whose
    /// migration's old host was lost.
    #[test]
    fn restores_leave_nothing_on_lost_peers(
        (rows, before) in arb_job(),
        gone in prop::collection::btree_set(1i64..7, 1..3),
        target in 1i64..7,
        replicas in 0u32..4,
    ) {
        let gone: Vec<PeerId> = gone.into_iter().collect();
        prop_assume!(!gone.contains(&target));
        let plan = plan_restore(&rows, &gone, |_, _| Some(target));
        prop_assert!(plan.homeless.is_empty());
        let mut after = rows.clone();
        apply(&mut after, &plan.change, 9);
        let ranked: Vec<PeerId> = (1..7).filter(|p| !gone.contains(p)).collect();
        let next = next_peers(&before, &after, &plan.change, &BTreeSet::new(), &ranked, replicas);
        prop_assert!(placement_indices(&after, &next.peers, rows.len() as u32).is_ok());
        for p in &gone {
            prop_assert!(!next.peers.contains(p));
            prop_assert!(!after.iter().any(|r| r.is_run_by(*p)));
        }
        let want = (replicas as usize + 1).min(ranked.len());
        prop_assert!(next.peers.len() >= want);
        let nprocs = rows.len() as u32;
        let (restore, migrate) = restore_and_migrate(&plan.change, nprocs);
        let expect: Vec<u32> = rows
            .iter()
            .filter(|r| {
                gone.contains(&r.peer) || r.handing_over_from().is_some_and(|p| gone.contains(&p))
            })
            .map(|r| r.pid)
            .collect();
        prop_assert_eq!(restore, expect);
        prop_assert!(migrate.is_empty());
        for (a, b) in rows.iter().zip(&after) {
            if !plan.change.moves.iter().any(|m| m.0 == a.pid)
                && !plan.change.restore_in_place.contains(&a.pid)
            {
                prop_assert_eq!(a, b);
            }
        }
    }

    /// A rebalance moves exactly the slots whose target differs from
    /// their host, are not being handed over, and either leave a draining
    /// or busy peer or are allowed by the hysteresis; the moves migrate.
    #[test]
    fn rebalances_move_what_they_may(
        (rows, before) in arb_job(),
        targets in prop::collection::vec(prop::option::of(1i64..7), 6),
        draining in prop::collection::btree_set(1i64..7, 0..2),
        busy in prop::collection::btree_set(1i64..7, 0..2),
        refused in prop::collection::btree_set(0u32..6, 0..3),
    ) {
        let plan = plan_rebalance(
            &rows,
            &draining,
            &busy,
            |r, _| targets[r.pid as usize],
            |slot, _| !refused.contains(&slot),
        );
        let mut expect = Vec::new();
        let mut pending = false;
        for r in &rows {
            match targets[r.pid as usize] {
                Some(t) if t != r.peer => {
                    if r.handing_over_from().is_some() {
                        pending = true;
                    } else if draining.contains(&r.peer)
                        || busy.contains(&r.peer)
                        || !refused.contains(&r.pid)
                    {
                        expect.push((r.pid, t));
                    } else {
                        pending = true;
                    }
                }
                _ => {}
            }
        }
        prop_assert_eq!(&plan.moves, &expect);
        prop_assert_eq!(plan.pending, pending);
        prop_assert_eq!(
            plan.forced,
            plan.moves.iter().any(|&(s, _)| draining.contains(&rows[s as usize].peer))
        );
        // Every move but a drain's is remembered by the hysteresis (a busy
        // peer's too: its processes do not come straight back).
        let load: Vec<_> = plan
            .moves
            .iter()
            .map(|&(s, _)| (s, rows[s as usize].peer))
            .filter(|(_, from)| !draining.contains(from))
            .collect();
        prop_assert_eq!(&plan.load_moves, &load);
        let change = Change { moves: plan.moves.clone(), migrate: true, ..Change::default() };
        let mut after = rows.clone();
        apply(&mut after, &change, 3);
        for &(slot, to) in &plan.moves {
            let r = &after[slot as usize];
            prop_assert_eq!(r.peer, to);
            prop_assert_eq!(r.handing_over_from(), Some(rows[slot as usize].peer));
        }
        let next = next_peers(&before, &after, &change, &draining, &[], 0);
        // A peer that hands a process over stays until it is done.
        for r in &after {
            if let Some(old) = r.handing_over_from() {
                prop_assert!(next.peers.contains(&old));
            }
        }
        prop_assert!(placement_indices(&after, &next.peers, rows.len() as u32).is_ok());
        let (restore, migrate) = restore_and_migrate(&change, rows.len() as u32);
        prop_assert_eq!(&restore, &migrate);
    }
}
