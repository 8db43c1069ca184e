//! Peer enrollment (issue 18): a supernode admits only peers with a valid
//! enrollment token; peers are their volunteer's; revoking a token or
//! disabling a peer fences it at once and its processes are restored
//! elsewhere, with the job's output unchanged.

use std::process::Stdio;
use std::time::Duration;

use bsp_api::client::Client;
use bsp_api::rest::{ApiError, CreateUserRequest, JobEventKind, Role};

use crate::harness::{ADMIN, Cluster, Options, bspweb, collect, job, until};

const LIMIT: Duration = Duration::from_secs(60);

/// A raw peer login without a token, and one with a well-formed token
/// whose secret is wrong: both refused with a code and a message that says
/// what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_a_valid_token_is_refused() {
    let cluster = Cluster::start(Options {
        peers: 1,
        ..Options::default()
    });
    let http = reqwest::Client::new();
    let login = serde_json::json!({
        "name": "intruder", "addr": "127.0.0.1:9", "speed": 1e9, "idle": 1.0,
        "cores": 64, "version": bsp_api::API_VERSION,
    });
    let resp = http
        .post(format!("{}/api/v1/peer/login", cluster.url))
        .json(&login)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let e: ApiError = resp.json().await.unwrap();
    assert_eq!(e.code, "enrollment_required");
    assert!(e.message.contains("bspweb token create"), "{}", e.message);

    // The right id, a wrong secret.
    let id = cluster
        .peer_token
        .strip_prefix("bwpeer-")
        .and_then(|r| r.split('-').next())
        .unwrap()
        .to_string();
    let forged = format!("bwpeer-{id}-{}", "0".repeat(64));
    let mut with_token = login.clone();
    with_token["token"] = forged.clone().into();
    let resp = http
        .post(format!("{}/api/v1/peer/login", cluster.url))
        .json(&with_token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let e: ApiError = resp.json().await.unwrap();
    assert_eq!(e.code, "bad_enrollment_token");

    // A real peer with that token stops at once, saying why; it never
    // shows up among the peers.
    let mut child = bspweb()
        .args([
            "peer",
            "--supernode",
            &cluster.url,
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--name", "forger", "--speed", "1", "--no-control-socket"])
        .arg("--compile-cache")
        .arg(cluster.data_dir().join("compiled-forger"))
        .env("BSPWEB_PEER_TOKEN", &forged)
        .env("BSPWEB_CONFIG_DIR", cluster.data_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = until("the peer with a forged token to stop", LIMIT, async || {
        child.try_wait().unwrap()
    })
    .await;
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("refuses this peer") && stderr.contains("not valid"),
        "{stderr}"
    );
    // A malformed token is caught before anything is sent.
    let out = bspweb()
        .args(["peer", "--supernode", &cluster.url, "--token", "letmein"])
        .env("BSPWEB_CONFIG_DIR", cluster.data_dir())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("malformed"));
    let admin = cluster.admin().await;
    let peers = admin.peers().await.unwrap();
    assert_eq!(peers.len(), 1, "{peers:?}");
    assert_eq!(peers[0].owner.as_deref(), Some(ADMIN));
}

/// A volunteer's peer is theirs: listed with them as owner, changed only
/// by them or an administrator. Revoking its token fences it: the job
/// running on it finishes with the output of an undisturbed run, and the
/// peer stops for good. Disabling a peer does the same, and enabling it
/// lets it in again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_token_or_disabling_a_peer_fences_it_and_its_job_goes_on() {
    let mut cluster = Cluster::start(Options {
        peers: 1,
        lease_ttl_secs: 60,
        ..Options::default()
    });
    let admin = cluster.admin().await;
    for (name, role) in [("vera", Role::Volunteer), ("bob", Role::User)] {
        admin
            .create_user(&CreateUserRequest {
                name: name.into(),
                password: format!("pw-of-{name}"),
                role: Some(role),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let vera = Client::login(&cluster.url, "vera", "pw-of-vera")
        .await
        .unwrap();
    let bob = Client::login(&cluster.url, "bob", "pw-of-bob")
        .await
        .unwrap();
    let token = vera.create_enrollment("vera's laptop").await.unwrap();
    assert_eq!(token.enrollment.owner, "vera");
    let index = cluster.add_peer("vera-laptop", &["--token".into(), token.token.0.clone()]);
    let mine = until("vera's peer to come online", LIMIT, async || {
        let peers = vera.peers().await.ok()?;
        peers
            .into_iter()
            .find(|p| p.name == "vera-laptop" && p.state == "online")
    })
    .await;
    assert_eq!(mine.owner.as_deref(), Some("vera"));
    assert_eq!(mine.enrollment, Some(token.enrollment.id));

    // Only her and an administrator may touch it; others see no such thing.
    let e = bob.set_peer_disabled(mine.id, true).await.unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
    let e = bob
        .revoke_enrollment(token.enrollment.id)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
    // Her token and one that does not exist read alike to him.
    let missing = token.enrollment.id + 1000;
    let none = bob.revoke_enrollment(missing).await.unwrap_err();
    assert_eq!(
        e.to_string()
            .replace(&format!("#{}", token.enrollment.id), "#N"),
        none.to_string().replace(&format!("#{missing}"), "#N")
    );
    assert!(bob.enrollments().await.unwrap().is_empty());
    let listed = vera.enrollments().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].peers_online, 1);
    assert!(admin.enrollments().await.unwrap().len() >= 2);

    // A job with processes on both peers; vera revokes her token mid-job.
    let spec = job("supersteps", 4, serde_json::json!({"k": 400_000, "h": 64}));
    let long = admin.submit(&spec).await.unwrap();
    until("the job to run on vera's peer", LIMIT, async || {
        let info = admin.job(long.id).await.ok()?;
        info.placement.contains(&mine.id).then_some(())
    })
    .await;
    vera.revoke_enrollment(token.enrollment.id).await.unwrap();
    let info = admin.job(long.id).await.unwrap();
    assert!(
        !info.placement.contains(&mine.id),
        "the revoked peer still holds processes: {:?}",
        info.placement
    );
    let gone = admin.peers().await.unwrap();
    let gone = gone.iter().find(|p| p.id == mine.id).unwrap();
    assert_eq!(gone.state, "gone");
    // The peer is refused when it logs in again, and stops.
    let status = cluster
        .wait_peer_exit(index, LIMIT)
        .await
        .expect("the revoked peer to stop");
    assert!(!status.success());
    admin.kill(long.id).await.unwrap();

    // The same with a short job that must finish: its output is that of a
    // run nobody disturbed.
    let spec = job("supersteps", 4, serde_json::json!({"k": 3000, "h": 256}));
    let second = vera.create_enrollment("vera's desktop").await.unwrap();
    let index = cluster.add_peer("vera-desktop", &["--token".into(), second.token.0.clone()]);
    let desktop = until("vera's second peer to come online", LIMIT, async || {
        let peers = vera.peers().await.ok()?;
        peers
            .into_iter()
            .find(|p| p.name == "vera-desktop" && p.state == "online")
    })
    .await;
    let undisturbed = collect(&admin, admin.submit(&spec).await.unwrap().id).await;
    undisturbed.assert_exited();
    let run = admin.submit(&spec).await.unwrap();
    // Placed (it may wait for the scheduler's next pass first: "not
    // active" is not "over"), or already over.
    until("the job to run on vera's desktop", LIMIT, async || {
        let info = admin.job(run.id).await.ok()?;
        (info.placement.contains(&desktop.id) || info.state == bsp_api::rest::JobState::Finished)
            .then_some(())
    })
    .await;
    let disabled = vera.set_peer_disabled(desktop.id, true).await.unwrap();
    assert!(disabled.disabled);
    assert_eq!(disabled.state, "gone");
    let disturbed = collect(&admin, run.id).await;
    disturbed.assert_exited();
    for pid in 0..4 {
        assert_eq!(disturbed.stdout(pid), undisturbed.stdout(pid), "pid {pid}");
    }
    assert!(
        disturbed.events.iter().any(|e| matches!(&e.kind,
            JobEventKind::Status { text } if text.contains("was disabled"))),
        "no event says the peer was disabled: {:?}",
        disturbed.events
    );
    cluster
        .wait_peer_exit(index, LIMIT)
        .await
        .expect("the disabled peer to stop");

    // Refused while disabled; admitted again once enabled.
    let retry = cluster.add_peer("vera-desktop", &["--token".into(), second.token.0.clone()]);
    let status = cluster
        .wait_peer_exit(retry, LIMIT)
        .await
        .expect("the disabled peer to be refused");
    assert!(!status.success());
    let enabled = vera.set_peer_disabled(desktop.id, false).await.unwrap();
    assert!(!enabled.disabled);
    cluster.add_peer("vera-desktop", &["--token".into(), second.token.0.clone()]);
    until("the enabled peer to come online", LIMIT, async || {
        let peers = vera.peers().await.ok()?;
        peers
            .iter()
            .any(|p| p.name == "vera-desktop" && p.state == "online")
            .then_some(())
    })
    .await;

    // Disabling her account fences her peers too.
    admin
        .update_user(
            "vera",
            &bsp_api::rest::UpdateUserRequest {
                disabled: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let peers = admin.peers().await.unwrap();
    assert!(
        peers
            .iter()
            .filter(|p| p.owner.as_deref() == Some("vera"))
            .all(|p| p.state == "gone"),
        "{peers:?}"
    );
}
