use super::*;

#[test]
fn replica_only_peers_fill_the_job_up_to_r_plus_one_deterministically() {
    let candidates: BTreeSet<PeerId> = (1..=10).collect();
    let mut a = vec![3];
    top_up_replicas(7, &mut a, 2, &candidates);
    assert_eq!(a.len(), 3);
    assert_eq!(a[0], 3);
    assert!(a[1] != 3 && a[2] != 3 && a[1] != a[2]);
    let mut b = vec![3];
    top_up_replicas(7, &mut b, 2, &candidates);
    assert_eq!(a, b, "the same job picks the same peers");
    // Enough peers already: nothing added; too few candidates: all added.
    let mut full = vec![1, 2, 3];
    top_up_replicas(7, &mut full, 2, &candidates);
    assert_eq!(full, vec![1, 2, 3]);
    let mut few = vec![1];
    top_up_replicas(7, &mut few, 5, &[1, 2].into_iter().collect());
    assert_eq!(few, vec![1, 2]);
    // Different jobs spread over different peers.
    let picks: BTreeSet<Vec<PeerId>> = (0..20)
        .map(|job| {
            let mut p = vec![];
            top_up_replicas(job, &mut p, 0, &candidates);
            p
        })
        .collect();
    assert!(picks.len() > 3, "{picks:?}");
}

#[test]
fn peer_lists_read_like_prose() {
    assert_eq!(peer_list(&[7]), "peer #7");
    assert_eq!(peer_list(&[2, 5]), "peers #2, #5");
    assert_eq!(distinct([2, 5, 2, 3]), vec![2, 5, 3]);
}

#[test]
fn a_migrating_process_is_run_by_both_hosts_until_the_handover() {
    let mut p = Placed {
        pid: 0,
        peer: 2,
        position: 1,
        moved_epoch: Some(1),
        moved_from: Some(1),
        moved_kind: Some(MoveKind::Migrate),
        handed_over: false,
    };
    assert!(p.is_run_by(1) && p.is_run_by(2) && !p.is_run_by(3));
    p.handed_over = true;
    assert!(!p.is_run_by(1) && p.is_run_by(2));
    p.handed_over = false;
    p.moved_kind = Some(MoveKind::Lost);
    assert!(!p.is_run_by(1));
}
