use proptest::prelude::*;

use super::*;

/// Peers `1..=n`, peer `p` of volunteer `p % volunteers`, power from `p`.
fn network(n: PeerId, volunteers: i64) -> (Vec<(PeerId, f64)>, Volunteers) {
    let candidates = (1..=n).map(|p| (p, 0.5 + (p % 4) as f64)).collect();
    let vol = Volunteers::from_map(
        (1..=n)
            .map(|p| (p, Party::Volunteer(p % volunteers)))
            .collect(),
    );
    (candidates, vol)
}

#[test]
fn slots_map_to_pids_and_copies() {
    let c = Copies {
        nprocs: 4,
        redundancy: 2,
    };
    assert_eq!(c.slots(), 8);
    assert_eq!((c.pid(6), c.copy(6)), (2, 1));
    assert_eq!(c.slot(1, 2), 6);
    assert_eq!(c.slots_of(3).collect::<Vec<_>>(), vec![3, 7]);
    assert_eq!(c.siblings(7).collect::<Vec<_>>(), vec![3]);
    assert_eq!(c.slot_list(&[6]), "pid 2 (copy 1)");
    assert_eq!(c.slot_list(&[1, 6]), "pids 1 (copy 0), 2 (copy 1)");
    let one = Copies {
        nprocs: 4,
        redundancy: 1,
    };
    assert_eq!(one.siblings(2).count(), 0);
    assert_eq!(one.slot_list(&[2]), "pid 2");
}

#[test]
fn a_peer_never_runs_two_copies_nor_twins_share_a_volunteer() {
    let vol = Volunteers::from_map(
        [
            (1, Party::Volunteer(10)),
            (2, Party::Volunteer(10)),
            (3, Party::Volunteer(11)),
        ]
        .into_iter()
        .collect(),
    );
    assert!(!allowed(&vol, 1, &[1]));
    assert!(!allowed(&vol, 2, &[1]), "same volunteer");
    assert!(allowed(&vol, 3, &[1]));
    // A peer without an enrollment is a volunteer of its own.
    assert!(allowed(&vol, 4, &[5]));
    assert!(!allowed(&vol, 4, &[4]));
    // `settle` keeps an allowed DHHT target, else an allowed current host,
    // else picks.
    let cands = [(1, 1.0), (2, 1.0), (3, 1.0)];
    assert_eq!(settle(1, 0, Some(3), None, &cands, &vol, &[1]), Some(3));
    assert_eq!(settle(1, 0, Some(2), Some(3), &cands, &vol, &[1]), Some(3));
    assert_eq!(settle(1, 0, Some(2), None, &cands, &vol, &[1]), Some(3));
    assert_eq!(settle(1, 0, Some(2), None, &cands[..2], &vol, &[1]), None);
}

#[test]
fn too_few_volunteers_are_refused_with_how_many_there_are() {
    let (cands, vol) = network(6, 1);
    let copies = Copies {
        nprocs: 3,
        redundancy: 2,
    };
    let mut owners = vec![1, 2, 3, 4, 5, 6];
    let e = repair(9, copies, &mut owners, &cands, &vol).unwrap_err();
    assert_eq!(e, TooFewVolunteers { needed: 2, have: 1 });
    assert!(e.to_string().contains("belong to 1"), "{e}");
    // Redundancy 1 needs nothing.
    let mut owners = vec![1, 1, 1];
    let one = Copies {
        nprocs: 3,
        redundancy: 1,
    };
    assert!(repair(9, one, &mut owners, &cands, &vol).is_ok());
    assert_eq!(owners, vec![1, 1, 1]);
}

#[test]
fn picks_follow_power() {
    // Peer 2 has 3x the power of peer 1: it wins about 3 in 4 slots.
    let vol = Volunteers::default();
    let cands = [(1, 1.0), (2, 3.0)];
    let wins = (0..4000)
        .filter(|&s| pick(5, s, &cands, &vol, &[]) == Some(2))
        .count();
    assert!((2800..3200).contains(&wins), "{wins}");
}

proptest! {
    /// Whatever the DHHT chose, a repaired placement places every slot on
    /// a candidate, keeps copy 0 where it was, and never gives two copies
    /// of a pid to peers of one volunteer; the repair is deterministic.
    #[test]
    fn repaired_copies_never_share_a_volunteer(
        n in 2u32..24,
        volunteers in 2i64..6,
        nprocs in 1u32..40,
        job in 1i64..1000,
        picks in proptest::collection::vec(0u32..1000, 80),
    ) {
        let (cands, vol) = network(PeerId::from(n), volunteers);
        let copies = Copies { nprocs, redundancy: 2 };
        let dhht: Vec<PeerId> = (0..copies.slots())
            .map(|s| PeerId::from(1 + picks[s as usize % picks.len()].wrapping_add(s) % n))
            .collect();
        let have = vol.count(cands.iter().map(|&(p, _)| p));
        let mut owners = dhht.clone();
        let result = repair(job, copies, &mut owners, &cands, &vol);
        if have < 2 {
            prop_assert!(result.is_err());
            return Ok(());
        }
        prop_assert!(result.is_ok());
        prop_assert_eq!(owners.len(), copies.slots() as usize);
        for pid in 0..nprocs {
            let a = owners[copies.slot(0, pid) as usize];
            let b = owners[copies.slot(1, pid) as usize];
            prop_assert_eq!(a, dhht[pid as usize], "copy 0 stays");
            prop_assert!(a != b);
            prop_assert!(vol.of(a) != vol.of(b), "pid {} on {} and {}", pid, a, b);
            prop_assert!(cands.iter().any(|&(p, _)| p == b));
        }
        let mut again = dhht.clone();
        repair(job, copies, &mut again, &cands, &vol).unwrap();
        prop_assert_eq!(owners, again);
    }
}
