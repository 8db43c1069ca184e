//! Handlers of the peer control plane ([`bsp_api::control`]).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use bsp_api::control::{Commands, Lease, PeerLogin, PeerRenew, PeerReport};
use serde::Deserialize;

use crate::auth::AuthPeer;
use crate::http::{ApiJson, ApiPath, ApiQuery, no_content};
use crate::{Error, Supernode, state};

/// The longest a command poll waits.
const MAX_WAIT: Duration = Duration::from_secs(30);

pub(crate) async fn login(
    State(sn): State<Supernode>,
    ApiJson(login): ApiJson<PeerLogin>,
) -> Result<Json<Lease>, Error> {
    state::validate_login(&login)?;
    Ok(Json(
        sn.with_core(move |core, inner, fx| core.peer_login(inner, fx, &login))
            .await?,
    ))
}

pub(crate) async fn renew(
    State(sn): State<Supernode>,
    peer: AuthPeer,
    ApiJson(renew): ApiJson<PeerRenew>,
) -> Result<Json<Lease>, Error> {
    state::validate_renew(&renew)?;
    Ok(Json(
        sn.with_core(move |core, inner, fx| core.peer_renew(inner, fx, peer.id, &renew))
            .await?,
    ))
}

#[derive(Deserialize)]
pub(crate) struct CommandsQuery {
    after: Option<u64>,
    wait_ms: Option<u64>,
}

fn lease_gone(peer: bsp_api::PeerId) -> Error {
    Error::Unauthorized {
        code: "lease_expired",
        message: format!("the lease of peer {peer} has expired; log in again"),
    }
}

/// The long poll: answers at once with the commands after `after`, or waits
/// up to `wait_ms` (at most 30 s) for one.
pub(crate) async fn commands(
    State(sn): State<Supernode>,
    peer: AuthPeer,
    ApiQuery(q): ApiQuery<CommandsQuery>,
) -> Result<Json<Commands>, Error> {
    let after = q.after.unwrap_or(0);
    let wait = Duration::from_millis(q.wait_ms.unwrap_or(25_000)).min(MAX_WAIT);
    let deadline = tokio::time::Instant::now() + wait;
    let mut stop = sn.inner.shutdown_signal();
    // Drops acknowledged commands; returns the pending ones, if any.
    let pending = |sn: &Supernode| -> Result<Option<Commands>, Error> {
        let mut live = sn.inner.live();
        let p = live
            .peers
            .get_mut(&peer.id)
            .ok_or_else(|| lease_gone(peer.id))?;
        while p.queue.front().is_some_and(|c| c.seq <= after) {
            p.queue.pop_front();
        }
        // The lease sweeper deletes acknowledged commands from SQLite.
        p.acked = p.acked.max(after.min(p.last_seq));
        Ok((!p.queue.is_empty()).then(|| Commands {
            commands: p.queue.iter().cloned().collect(),
        }))
    };
    loop {
        if let Some(cmds) = pending(&sn)? {
            return Ok(Json(cmds));
        }
        let notify = {
            let live = sn.inner.live();
            live.peers
                .get(&peer.id)
                .ok_or_else(|| lease_gone(peer.id))?
                .notify
                .clone()
        };
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // A command queued between the check above and `enable` is seen here.
        if let Some(cmds) = pending(&sn)? {
            return Ok(Json(cmds));
        }
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep_until(deadline) => return Ok(Json(Commands::default())),
            _ = stop.wait_for(|s| *s) => return Ok(Json(Commands::default())),
        }
    }
}

pub(crate) async fn report(
    State(sn): State<Supernode>,
    peer: AuthPeer,
    ApiJson(report): ApiJson<PeerReport>,
) -> Result<Response, Error> {
    if report.events.is_empty() {
        return Ok(no_content());
    }
    sn.with_core(move |core, inner, fx| core.report(inner, fx, peer.id, report.events))
        .await?;
    Ok(no_content())
}

/// `POST /api/v1/peer/drain`: the peer gets no new processes and its
/// processes migrate away; it leaves each job once it hosts nothing there.
pub(crate) async fn drain(State(sn): State<Supernode>, peer: AuthPeer) -> Result<Response, Error> {
    sn.with_core(move |core, inner, fx| core.drain(inner, fx, peer.id))
        .await?;
    Ok(no_content())
}

pub(crate) async fn module(
    State(sn): State<Supernode>,
    peer: AuthPeer,
    ApiPath(hash): ApiPath<String>,
) -> Result<Response, Error> {
    let bytes = sn
        .with_core(move |core, _, _| core.module_for_peer(peer.id, &hash))
        .await?;
    Ok(([(CONTENT_TYPE, "application/wasm")], bytes).into_response())
}
