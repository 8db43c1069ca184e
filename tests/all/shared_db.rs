//! Several supernodes on one PostgreSQL database (issue 14): real supernode
//! and peer processes, the database a throw-away server the test starts.

use std::time::Duration;

use bsp_api::rest::{JobEvent, JobEventKind, JobState};

use crate::harness::{Cluster, Options, client_options, collect, job, until};

/// A PageRank long enough to be killed under.
fn pagerank() -> bsp_api::rest::SubmitJob {
    job(
        "pagerank",
        3,
        serde_json::json!({"n": 20_000, "m": 100_000, "iters": 1500, "seed": 3}),
    )
}

/// The supernode that the job's peers and the user's event stream use is
/// SIGKILLed mid-job: the peers fail over to another, the job completes
/// with the output of a run without the kill, the user's stream resumes on
/// another supernode with no event missed or doubled, and new jobs can be
/// submitted throughout. Then a second supernode is killed, leaving one:
/// nothing is lost.
#[tokio::test(flavor = "multi_thread")]
async fn killing_supernodes_one_after_another_loses_nothing() {
    let mut cluster = Cluster::start(Options {
        peers: 3,
        supernodes: 3,
        ..Default::default()
    });
    let urls = cluster.urls();
    // The user knows all three; the first is the one the peers use too.
    let admin = cluster.admin().await;
    let user = client_options(&urls)
        .login(&urls, crate::harness::ADMIN, crate::harness::ADMIN_PASSWORD)
        .await
        .expect("login");
    assert_eq!(user.base_url(), cluster.url);
    let reference = collect(&admin, admin.submit(&pagerank()).await.unwrap().id).await;
    reference.assert_exited();

    let id = user.submit(&pagerank()).await.expect("submit").id;
    let mut stream = user.events(id, None);
    let mut streamed: Vec<JobEvent> = Vec::new();
    // Some progress first, so the kill falls mid-job.
    let at_kill = until(
        "the job to be under way",
        Duration::from_secs(120),
        async || {
            let info = user.job(id).await.ok()?;
            (info.supersteps.iter().copied().min().unwrap_or(0) >= 20).then_some(info)
        },
    )
    .await;
    cluster.kill_supernode_at(0);
    eprintln!(
        "killed the first supernode at supersteps {:?}",
        at_kill.supersteps
    );
    assert_eq!(at_kill.state, JobState::Active, "the kill falls mid-job");
    // Submitting goes on: the first call may meet the dead supernode, the
    // next goes to another.
    let during = until(
        "a submission during the outage",
        Duration::from_secs(30),
        async || user.submit(&pagerank()).await.ok(),
    )
    .await;
    assert_ne!(user.base_url(), cluster.url, "the client failed over");
    // The stream retries a lost connection by itself, after the last
    // event it delivered, at the supernode the client fails over to.
    let done = tokio::time::timeout(Duration::from_secs(300), async {
        while let Some(e) = stream.next().await.expect("the event stream") {
            streamed.push(e);
        }
    })
    .await;
    assert!(done.is_ok(), "the job did not end: {:?}", streamed.last());
    let info = user.job(id).await.unwrap();
    assert_eq!(info.state, JobState::Finished);
    let run = crate::harness::Run {
        info,
        events: streamed.clone(),
    };
    run.assert_exited();
    for pid in 0..3 {
        assert_eq!(run.stdout(pid), reference.stdout(pid), "pid {pid}'s output");
    }
    // The stream had every event once: the same as the job's whole stream
    // read afresh from the supernode now in use.
    let fresh = collect(&user, id).await;
    assert_eq!(streamed, fresh.events, "events missed or doubled");
    let ids: Vec<i64> = streamed.iter().map(|e| e.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));

    // Kill a second one: the last supernode finishes the job submitted
    // during the outage and takes new ones.
    let now = user.base_url().to_string();
    let second = (1..3).find(|&i| cluster.urls().split(',').nth(i) == Some(now.as_str()));
    cluster.kill_supernode_at(second.expect("the client uses a known supernode"));
    let last = until(
        "a submission to the last supernode",
        Duration::from_secs(30),
        async || user.submit(&pagerank()).await.ok(),
    )
    .await;
    for job in [during.id, last.id] {
        let run = collect(&user, job).await;
        run.assert_exited();
        for pid in 0..3 {
            assert_eq!(
                run.stdout(pid),
                reference.stdout(pid),
                "job {job}, pid {pid}"
            );
        }
        assert!(
            !run.events
                .iter()
                .any(|e| matches!(e.kind, JobEventKind::JobFailed { .. })),
        );
    }
}
