//! Result validation by redundancy (issue 18, SECURITY.md "Result
//! validation"): with `redundancy: 2` every process runs on two peers of
//! different volunteers, nothing a copy produced counts before the other
//! copy produced the same, and a peer that computes wrongly is outvoted by
//! a third run and quarantined, while the job's output stays exactly the
//! failure-free one. The faulty peer is the test-only one of
//! `peer/src/fault.rs` (feature `fault-injection`, which `scripts/test`
//! turns on).

use bsp_api::rest::{JobEventKind, JobLimits, SubmitJob};

use crate::harness::{Cluster, Options, Run, job, run};

/// PageRank: every process sends to every other one in every superstep,
/// and pid 0 prints the ranks' checksum at the end.
fn pagerank(nprocs: u32, redundancy: u32) -> SubmitJob {
    let mut spec = job(
        "pagerank",
        nprocs,
        serde_json::json!({"n": 20_000, "m": 100_000, "iters": 12}),
    );
    spec.limits = Some(JobLimits {
        redundancy,
        ..JobLimits::default()
    });
    spec
}

/// Everything each pid printed.
fn outputs(r: &Run, nprocs: u32) -> Vec<Vec<String>> {
    (0..nprocs).map(|p| r.stdout(p)).collect()
}

/// A cluster of three volunteers' peers: two of the administrator's, one
/// of `vera`'s, one of `walt`'s.
async fn three_volunteers() -> Cluster {
    let mut cluster = Cluster::start(Options {
        peers: 2,
        ..Options::default()
    });
    cluster.add_volunteer_peer("vera", "vera-1", &[]).await;
    cluster.add_volunteer_peer("walt", "walt-1", &[]).await;
    cluster.wait_for_peers(4);
    cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_on_different_volunteers_give_exactly_the_output_of_one() {
    let cluster = three_volunteers().await;
    let admin = cluster.admin().await;
    let one = run(&admin, pagerank(4, 1)).await;
    one.assert_exited();
    let two = run(&admin, pagerank(4, 2)).await;
    two.assert_exited();
    assert_eq!(outputs(&two, 4), outputs(&one, 4));
    assert!(
        !outputs(&one, 4)[0].is_empty(),
        "pagerank prints its checksum"
    );
    // Each record once, though both copies printed it.
    let lines: usize = outputs(&two, 4).iter().map(Vec::len).sum();
    let one_lines: usize = outputs(&one, 4).iter().map(Vec::len).sum();
    assert_eq!(lines, one_lines);
    assert!(
        !two.events.iter().any(|e| matches!(
            e.kind,
            JobEventKind::CopiesDisagree { .. } | JobEventKind::PeerQuarantined { .. }
        )),
        "honest copies never disagree: {:?}",
        two.events
    );
}

/// A peer hosting copies is SIGKILLed mid-job: the lost copies are
/// restored on peers of other volunteers than their twins' from the
/// checkpoints the copies agreed on, and the output is still exactly the
/// failure-free one, each record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_copy_is_restored_and_the_output_is_unchanged() {
    let mut cluster = three_volunteers().await;
    cluster.add_volunteer_peer("vera", "vera-2", &[]).await;
    cluster.wait_for_peers(5);
    let admin = cluster.admin().await;
    let spec = |redundancy| {
        let mut s = pagerank(6, redundancy);
        s.args = serde_json::json!({"n": 20_000, "m": 100_000, "iters": 400});
        s
    };
    let reference = run(&admin, spec(1)).await;
    reference.assert_exited();
    let info = admin.submit(&spec(2)).await.expect("submit");
    // Once the job is well under way, kill the host of copy 1 of pid 0.
    let victim = crate::harness::until(
        "the job at superstep 20",
        std::time::Duration::from_secs(120),
        async || {
            let j = admin.job(info.id).await.ok()?;
            (j.supersteps.iter().all(|&s| s >= 20) && !j.copies.is_empty()).then(|| j.copies[0][0])
        },
    )
    .await;
    let index = cluster
        .peer_index(&admin, victim)
        .await
        .expect("the victim is a peer of the cluster");
    cluster.kill_peer(index);
    let r = crate::harness::collect(&admin, info.id).await;
    r.assert_exited();
    assert_eq!(outputs(&r, 6), outputs(&reference, 6));
    assert!(
        r.events
            .iter()
            .any(|e| matches!(e.kind, JobEventKind::ProcessRolledBack { .. })),
        "a copy of the killed peer was restored: {:?}",
        r.events
    );
    assert!(
        !r.events.iter().any(|e| matches!(
            e.kind,
            JobEventKind::CopiesDisagree { .. } | JobEventKind::PeerQuarantined { .. }
        )),
        "a lost copy is no disagreement"
    );
}

/// The tests with a faulty peer: it exists only with the test-only
/// feature `fault-injection` (`scripts/test` builds with it).
#[cfg(feature = "fault-injection")]
mod faulty {
    use std::time::Duration;

    use bsp_api::PeerId;

    use super::*;
    use crate::harness::{collect, until};

    const LIMIT: Duration = Duration::from_secs(120);

    /// The id the supernode gave the peer named `name`, once it is online.
    async fn peer_id(cluster: &Cluster, name: &str) -> PeerId {
        let admin = cluster.admin().await;
        until(&format!("peer {name} online"), LIMIT, async || {
            let peers = admin.peers().await.ok()?;
            peers
                .into_iter()
                .find(|p| p.name == name && p.state == "online")
                .map(|p| p.id)
        })
        .await
    }

    /// With `fault` on one peer (a bit of a message, or of a process's
    /// memory, flipped once): the job's output is still exactly the one
    /// without redundancy; the stream says which copies disagreed and which
    /// peer was quarantined; that peer gets no processes afterwards.
    async fn a_faulty_peer_is_outvoted(fault: &str) {
        let mut cluster = three_volunteers().await;
        let admin = cluster.admin().await;
        let reference = run(&admin, pagerank(6, 1)).await;
        reference.assert_exited();
        // Only now the faulty peer (of a fourth volunteer): the reference run
        // must not meet it. The fault fires once, in superstep 2.
        cluster
            .add_volunteer_peer("mallory", "faulty", &[("BSPWEB_TEST_FAULT", fault)])
            .await;
        cluster.wait_for_peers(5);
        let faulty = peer_id(&cluster, "faulty").await;
        // The job must give the faulty peer a copy: placement is by hashing,
        // so another job (another position) is tried when it did not.
        let mut id = None;
        for _ in 0..8 {
            let info = admin.submit(&pagerank(6, 2)).await.expect("submit");
            let placed = until("the job placed", LIMIT, async || {
                let j = admin.job(info.id).await.ok()?;
                (!j.placement.is_empty()).then_some(j.placement)
            })
            .await;
            if placed.contains(&faulty) {
                id = Some(info.id);
                break;
            }
            admin.kill(info.id).await.expect("kill");
        }
        let id = id.expect("in eight jobs, the faulty peer got a copy of a process");
        let r = collect(&admin, id).await;
        r.assert_exited();
        assert_eq!(
            outputs(&r, 6),
            outputs(&reference, 6),
            "the output is exactly the failure-free one"
        );
        let disagreed = r.events.iter().find_map(|e| match &e.kind {
            JobEventKind::CopiesDisagree { peers, what, .. } => Some((peers.clone(), what.clone())),
            _ => None,
        });
        let (peers, what) = disagreed.unwrap_or_else(|| {
            panic!(
                "no copies_disagree event with fault {fault}: {:?}",
                r.events
            )
        });
        assert!(
            peers.contains(&faulty),
            "the disagreement ({what}) names the faulty peer #{faulty}: {peers:?}"
        );
        let quarantined: Vec<PeerId> = r
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                JobEventKind::PeerQuarantined { peer, .. } => Some(*peer),
                _ => None,
            })
            .collect();
        assert_eq!(
            quarantined,
            vec![faulty],
            "exactly the faulty peer is quarantined, once"
        );
        // It gets nothing any more.
        for _ in 0..3 {
            let next = admin.submit(&pagerank(6, 2)).await.expect("submit");
            let done = collect(&admin, next.id).await;
            done.assert_exited();
            assert!(
                !done.info.placement.contains(&faulty),
                "job {} placed a process on the quarantined peer #{faulty}",
                next.id
            );
            assert_eq!(outputs(&done, 6), outputs(&reference, 6));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_that_flips_a_bit_of_a_message_is_outvoted_and_the_output_is_unchanged() {
        a_faulty_peer_is_outvoted("message:2").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_that_flips_a_bit_of_its_memory_is_outvoted_and_the_output_is_unchanged() {
        a_faulty_peer_is_outvoted("memory:2").await;
    }
}
