//! Authentication, isolation between users, and the peers' data plane.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bsp_api::client::Client;
use bsp_api::wire::{Frame, RejectReason, WIRE_VERSION};
use serde_json::json;

use crate::harness::{ADMIN, job, run, shared};

#[tokio::test(flavor = "multi_thread")]
async fn wrong_credentials_get_401() {
    let c = shared();
    let err = Client::login(&c.url, ADMIN, "wrong password")
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(401));
    assert!(
        err.to_string().contains("wrong user name or password"),
        "{err}"
    );
    let err = Client::login(&c.url, "nobody", "x").await.unwrap_err();
    assert_eq!(err.status(), Some(401));
    let forged = Client::with_token(&c.url, "not.a.token");
    assert_eq!(forged.jobs(None).await.unwrap_err().status(), Some(401));
    let resp = reqwest::get(format!("{}/api/v1/jobs", c.url))
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_users_job_is_invisible_and_cannot_be_killed() {
    let c = shared();
    let alice = c.user("alice").await;
    let bob = c.user("bob").await;
    let mut spec = job("supersteps", 2, json!({"k": 1_000_000, "h": 0}));
    spec.description = Some("alice's long job".into());
    let a = alice.submit(&spec).await.unwrap();
    assert!(bob.jobs(None).await.unwrap().iter().all(|j| j.id != a.id));
    assert_eq!(bob.job(a.id).await.unwrap_err().status(), Some(404));
    assert_eq!(bob.kill(a.id).await.unwrap_err().status(), Some(404));
    assert_eq!(bob.dispose(a.id).await.unwrap_err().status(), Some(404));
    let mut events = bob.events(a.id, None);
    assert_eq!(events.next().await.unwrap_err().status(), Some(404));
    // Alice can still see and kill it.
    assert!(alice.jobs(None).await.unwrap().iter().any(|j| j.id == a.id));
    alice.kill(a.id).await.unwrap();
    let r = crate::harness::collect(&alice, a.id).await;
    assert_eq!(r.terminal(), &bsp_api::rest::JobEventKind::JobKilled);
}

fn write_frame(s: &mut TcpStream, f: &Frame) {
    let body = postcard::to_allocvec(f).unwrap();
    s.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
    s.write_all(&body).unwrap();
}

fn read_frame(s: &mut TcpStream) -> Option<Frame> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    postcard::from_bytes(&body).ok()
}

/// A Noise handshake for `job` under the key of `token` (not the job's):
/// the listener cannot decrypt it.
fn forged_handshake(token: &str, job: i64) -> Vec<u8> {
    use bspweb_peer::noise::{Initiator, JobKey};
    let (_, first) = Initiator::start(&JobKey::derive(token), WIRE_VERSION, job, b"forged")
        .expect("a handshake message");
    first
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_frame_for_a_job_the_peer_is_not_part_of_is_rejected() {
    let c = shared();
    let client = c.admin().await;
    let peers = client.peers().await.unwrap();
    let addr = peers
        .iter()
        .find(|p| p.state == "online")
        .unwrap()
        .addr
        .clone();
    let connect = || {
        let s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    };

    // A job that does not exist on that peer.
    let mut s = connect();
    write_frame(
        &mut s,
        &Frame::Hello {
            version: WIRE_VERSION,
            job: 987_654_321,
            handshake: forged_handshake("guess", 987_654_321).into(),
        },
    );
    match read_frame(&mut s) {
        Some(Frame::Reject { reason, .. }) => assert_eq!(reason, RejectReason::UnknownJob),
        other => panic!("expected a rejection, got {other:?}"),
    }

    // Data before any Hello.
    let mut s = connect();
    write_frame(&mut s, &Frame::Data { messages: vec![] });
    match read_frame(&mut s) {
        Some(Frame::Reject { reason, .. }) => assert_eq!(reason, RejectReason::Protocol),
        other => panic!("expected a rejection, got {other:?}"),
    }

    // Garbage that is not a frame at all: the connection is closed.
    let mut s = connect();
    s.write_all(&[0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0xff])
        .unwrap();
    assert!(!matches!(read_frame(&mut s), Some(Frame::Welcome)));

    // A running job of this peer, with the wrong token.
    let long = client
        .submit(&job("supersteps", 6, json!({"k": 1_000_000, "h": 0})))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let info = loop {
        let info = client.job(long.id).await.unwrap();
        if !info.placement.is_empty() {
            break info;
        }
        assert!(std::time::Instant::now() < deadline, "job never placed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let host = info.placement[0];
    let host_addr = peers.iter().find(|p| p.id == host).unwrap().addr.clone();
    let mut rejected = false;
    for _ in 0..200 {
        let mut s = TcpStream::connect(&host_addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write_frame(
            &mut s,
            &Frame::Hello {
                version: WIRE_VERSION,
                job: long.id,
                handshake: forged_handshake("forged", long.id).into(),
            },
        );
        match read_frame(&mut s) {
            Some(Frame::Reject {
                reason: RejectReason::NotAuthorized,
                ..
            }) => {
                rejected = true;
                break;
            }
            // The peer may not have received its assignment yet.
            Some(Frame::Reject {
                reason: RejectReason::UnknownJob,
                ..
            }) => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("expected NotAuthorized, got {other:?}"),
        }
    }
    assert!(
        rejected,
        "the forged hello was never answered with NotAuthorized"
    );
    client.kill(long.id).await.unwrap();

    // The peers are unharmed: a job still runs everywhere.
    let r = run(&client, job("ring", 6, json!(null))).await;
    r.assert_exited();
}
