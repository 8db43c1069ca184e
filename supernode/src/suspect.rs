//! Fast loss detection (docs/fault-tolerance.md, "Failure and restore").
//!
//! The same check runs for every peer recorded online when the supernode
//! starts ([`check_at_start`]).
//!
//! A peer whose data-plane connection to another peer of a job breaks
//! without the notice a peer gives when the job ends there reports
//! [`PeerUnreachable`](bsp_api::control::PeerEvent::PeerUnreachable). The
//! supernode does not take its word for it: it dials the suspect's
//! data-plane address itself. Only a *refused* connection — nothing listens
//! on the port the peer serves for as long as it runs, so its process is
//! gone — declares the peer gone, at once, and restores its processes as an
//! expired lease would. A peer that accepts the connection is alive (maybe
//! slow, maybe stopped); one that does not answer at all may be partitioned
//! from us or from the reporter: both are left to their lease, and fencing
//! (401 on the next renewal) stays the safety net for any peer declared
//! gone while it still ran.

use std::io::ErrorKind;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::state::Suspect;
use crate::{Supernode, now_ms};

/// How long a dial of a suspect may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// When to dial a suspect, after the report: a peer being killed closes
/// its connections a moment before its listening socket, so the first dial
/// may still be accepted or reset by the dying listener.
const DIAL_AFTER: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_millis(100),
    Duration::from_millis(300),
    Duration::from_millis(700),
];

/// A peer is checked at most once in this many milliseconds, however many
/// peers report it.
const MIN_PROBE_INTERVAL_MS: i64 = 2_000;

/// What dialing a peer's data-plane address showed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Dialed {
    /// Refused: no process listens there.
    Refused,
    /// Something accepted the connection.
    Listening,
    /// Neither (timeout, unreachable network, bad address): we cannot tell.
    Unknown(String),
}

/// Dials `addr` once.
pub(crate) async fn dial(addr: &str) -> Dialed {
    match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Dialed::Listening,
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionRefused => Dialed::Refused,
        Ok(Err(e)) => Dialed::Unknown(e.to_string()),
        Err(_) => Dialed::Unknown(format!("no answer within {DIAL_TIMEOUT:?}")),
    }
}

/// Checks every peer recorded online when the supernode starts: one that
/// died while it was down (say, with the `bspweb up` that started both) is
/// declared gone at once, instead of a lease later and after new jobs were
/// placed on it.
pub(crate) async fn check_at_start(sn: &Supernode) {
    match sn.with_core(|core, _, _| core.online_peers()).await {
        Ok(peers) => check(sn, peers),
        Err(e) => tracing::error!(error = %e, "cannot list the peers to check at start"),
    }
}

/// Checks each suspect in a task of its own: dials it a few times in about
/// a second ([`DIAL_AFTER`]) and declares it gone at the first refusal (at
/// most one check per peer per [`MIN_PROBE_INTERVAL_MS`]).
pub(crate) fn check(sn: &Supernode, suspects: Vec<Suspect>) {
    let now = now_ms();
    for suspect in suspects {
        let lease_id = {
            let mut live = sn.inner.live();
            let Some(p) = live.peers.get_mut(&suspect.peer) else {
                continue;
            };
            if p.probed_at
                .is_some_and(|t| now.saturating_sub(t) < MIN_PROBE_INTERVAL_MS)
            {
                continue;
            }
            p.probed_at = Some(now);
            p.lease_id.clone()
        };
        let sn = sn.clone();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let mut dialed = Dialed::Unknown("not dialed".into());
            for after in DIAL_AFTER {
                tokio::time::sleep_until(start + after).await;
                dialed = dial(&suspect.addr).await;
                if dialed == Dialed::Refused {
                    break;
                }
            }
            match dialed {
                Dialed::Refused => {
                    let result = sn
                        .with_core(move |core, inner, fx| {
                            core.declare_unreachable(inner, fx, &suspect, &lease_id, now_ms())
                        })
                        .await;
                    if let Err(e) = result {
                        tracing::error!(error = %e, "cannot declare an unreachable peer gone");
                    }
                }
                Dialed::Listening => tracing::info!(
                    peer = suspect.peer,
                    "peer #{} is suspected ({}), but its data port still accepts connections: \
                     leaving it to its lease",
                    suspect.peer,
                    suspect.why
                ),
                Dialed::Unknown(e) => tracing::info!(
                    peer = suspect.peer,
                    "peer #{} is suspected ({}), but its data port at {} neither accepts nor \
                     refuses connections ({e}): leaving it to its lease",
                    suspect.peer,
                    suspect.why,
                    suspect.addr
                ),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_port_is_refused_and_an_open_one_listens() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        assert_eq!(dial(&addr).await, Dialed::Listening);
        drop(listener);
        assert_eq!(dial(&addr).await, Dialed::Refused);
        assert!(matches!(dial("not an address").await, Dialed::Unknown(_)));
    }
}
