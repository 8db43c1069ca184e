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
use crate::{Error, Supernode, state, suspect};

/// The longest a command poll waits.
const MAX_WAIT: Duration = Duration::from_secs(30);

#[utoipa::path(
    post,
    path = "/peer/login",
    tag = "peer control plane",
    summary = "A peer joins and gets a lease",
    request_body = PeerLogin,
    responses(
        (status = 200, description = "The lease", body = Lease),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "Not admitted: no enrollment token (`enrollment_required`), a wrong one (`bad_enrollment_token`), a revoked one (`enrollment_revoked`), one whose account is disabled (`enrollment_owner_disabled`), or the peer is disabled (`peer_disabled`)", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`, `invalid_module`, ...)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn login(
    State(sn): State<Supernode>,
    ApiJson(login): ApiJson<PeerLogin>,
) -> Result<Json<Lease>, Error> {
    state::validate_login(&login)?;
    Ok(Json(
        sn.with_core(move |core, inner, fx| core.peer_login(inner, fx, &login, crate::now_ms()))
            .await?,
    ))
}

#[utoipa::path(
    post,
    path = "/peer/renew",
    tag = "peer control plane",
    summary = "Renew the lease and report availability",
    request_body = PeerRenew,
    security(("peer" = [])),
    responses(
        (status = 200, description = "The renewed lease", body = Lease),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No lease token, a bad one, or an expired lease (`unauthorized`, `lease_expired`): log in again", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`, `invalid_module`, ...)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn renew(
    State(sn): State<Supernode>,
    peer: AuthPeer,
    ApiJson(renew): ApiJson<PeerRenew>,
) -> Result<Json<Lease>, Error> {
    state::validate_renew(&renew)?;
    let renew = std::sync::Arc::new(renew);
    // With a shared database, most renewals need not wait for the
    // exclusive lock (`state/plain_renewal.rs`).
    if sn.instance() != 0 {
        let plain = state::Plain {
            peer: peer.id,
            token_lease: peer.lease.clone(),
            renew: renew.clone(),
        };
        if let Some(lease) = crate::renew_batch::renew(&sn, plain).await? {
            return Ok(Json(lease));
        }
    }
    Ok(Json(
        sn.with_core(move |core, inner, fx| {
            core.peer_renew(inner, fx, peer.id, &peer.lease, &renew, crate::now_ms())
        })
        .await?,
    ))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
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
#[utoipa::path(
    get,
    path = "/peer/commands",
    tag = "peer control plane",
    summary = "Long poll for commands",
    params(CommandsQuery),
    security(("peer" = [])),
    responses(
        (status = 200, description = "Commands after `after`, possibly none", body = Commands),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No lease token, a bad one, or an expired lease (`unauthorized`, `lease_expired`): log in again", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
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

#[utoipa::path(
    post,
    path = "/peer/report",
    tag = "peer control plane",
    summary = "Report output and process events, in order",
    request_body = PeerReport,
    security(("peer" = [])),
    responses(
        (status = 204, description = "Stored"),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No lease token, a bad one, or an expired lease (`unauthorized`, `lease_expired`): log in again", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`, `invalid_module`, ...)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn report(
    State(sn): State<Supernode>,
    peer: AuthPeer,
    ApiJson(report): ApiJson<PeerReport>,
) -> Result<Response, Error> {
    if report.events.is_empty() {
        return Ok(no_content());
    }
    let suspects = sn
        .with_core(move |core, inner, fx| {
            core.report(inner, fx, peer.id, report.events, crate::now_ms())
        })
        .await?;
    suspect::check(&sn, suspects);
    Ok(no_content())
}

/// `POST /api/v1/peer/drain`: the peer gets no new processes and its
/// processes migrate away; it leaves each job once it hosts nothing there.
#[utoipa::path(
    post,
    path = "/peer/drain",
    tag = "peer control plane",
    summary = "Move every process away, then release the peer",
    security(("peer" = [])),
    responses(
        (status = 204, description = "Draining"),
        (status = 401, description = "No lease token, a bad one, or an expired lease (`unauthorized`, `lease_expired`): log in again", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn drain(State(sn): State<Supernode>, peer: AuthPeer) -> Result<Response, Error> {
    sn.with_core(move |core, inner, fx| core.drain(inner, fx, peer.id, crate::now_ms()))
        .await?;
    Ok(no_content())
}

/// `POST /api/v1/peer/resume`: ends the drain the peer asked for; it takes
/// processes again.
#[utoipa::path(
    post,
    path = "/peer/resume",
    tag = "peer control plane",
    summary = "End a drain: take processes again (after `bspweb peer pause`)",
    security(("peer" = [])),
    responses(
        (status = 204, description = "Taking processes again (also when it was not draining)"),
        (status = 401, description = "No lease token, a bad one, or an expired lease (`unauthorized`, `lease_expired`): log in again", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn resume(State(sn): State<Supernode>, peer: AuthPeer) -> Result<Response, Error> {
    sn.with_core(move |core, inner, fx| core.resume(inner, fx, peer.id, crate::now_ms()))
        .await?;
    Ok(no_content())
}

#[utoipa::path(
    get,
    path = "/peer/modules/{hash}",
    tag = "peer control plane",
    summary = "A module a job of this peer runs",
    params(("hash" = String, Path, description = "Hex SHA-256 of the module")),
    security(("peer" = [])),
    responses(
        (status = 200, description = "The module's bytes", content_type = "application/wasm", body = Vec<u8>),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No lease token, a bad one, or an expired lease (`unauthorized`, `lease_expired`): log in again", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such thing visible to the caller (`not_found`)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
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

#[utoipa::path(
    get,
    path = "/peer/jobs/{job}/resources",
    tag = "peer control plane",
    summary = "The resources of a job of this peer",
    description = "All of the job's named resources as one byte string (`bsp_api::control::encode_resources`: sorted by name; per resource the name's length as u32 LE, the name, the data's length as u64 LE, the data). Its SHA-256 is the assignment's `resources_hash`.",
    params(("job" = i64, Path, description = "The job's id")),
    security(("peer" = [])),
    responses(
        (status = 200, description = "The encoded resources", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No lease token, a bad one, or an expired lease (`unauthorized`, `lease_expired`): log in again", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such thing visible to the caller (`not_found`)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn resources(
    State(sn): State<Supernode>,
    peer: AuthPeer,
    ApiPath(job): ApiPath<i64>,
) -> Result<Response, Error> {
    let bytes = sn
        .with_core(move |core, _, _| core.resources_for_peer(peer.id, job))
        .await?;
    Ok(([(CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}
