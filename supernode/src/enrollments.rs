//! Handlers of peer enrollment (issue 18): enrollment tokens, and disabling
//! or enabling a peer. The decisions are in `state::enroll`.

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use bsp_api::PeerId;
use bsp_api::rest::{CreateEnrollment, EnrollmentInfo, NewEnrollment, PeerInfo, Role, UpdatePeer};

use crate::auth::AuthUser;
use crate::http::{ApiJson, ApiPath, no_content};
use crate::state::Caller;
use crate::{Error, Supernode, now_ms};

#[utoipa::path(
    post,
    path = "/enrollments",
    tag = "peers",
    summary = "Create an enrollment token for your peers; its secret is shown this once",
    request_body = CreateEnrollment,
    security(("user" = [])),
    responses(
        (status = 200, description = "The token (`token`) and what is listed of it", body = NewEnrollment),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 409, description = "The account holds the most enrollment tokens it may (`quota_exceeded`): revoke one", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn create(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiJson(req): ApiJson<CreateEnrollment>,
) -> Result<Json<NewEnrollment>, Error> {
    let owner = auth.id;
    Ok(Json(
        sn.with_core(move |core, _, _| core.create_enrollment(owner, &req.name, now_ms()))
            .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/enrollments",
    tag = "peers",
    summary = "Your enrollment tokens (an administrator's: everyone's), newest first; no secrets",
    security(("user" = [])),
    responses(
        (status = 200, description = "The tokens", body = Vec<EnrollmentInfo>),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn list(
    State(sn): State<Supernode>,
    auth: AuthUser,
) -> Result<Json<Vec<EnrollmentInfo>>, Error> {
    let caller = Caller {
        id: auth.id,
        admin: auth.role == Role::Admin,
    };
    Ok(Json(
        sn.with_core(move |core, _, _| core.enrollments(caller))
            .await?,
    ))
}

#[utoipa::path(
    delete,
    path = "/enrollments/{id}",
    tag = "peers",
    summary = "Revoke an enrollment token: its peers are fenced and may not log in again",
    params(("id" = i64, Path, description = "The token's id")),
    security(("user" = [])),
    responses(
        (status = 204, description = "Revoked (or it was already)"),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such token of yours (`not_found`)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn revoke(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiPath(id): ApiPath<i64>,
) -> Result<Response, Error> {
    let caller = Caller {
        id: auth.id,
        admin: auth.role == Role::Admin,
    };
    sn.with_core(move |core, inner, fx| core.revoke_enrollment(inner, fx, caller, id, now_ms()))
        .await?;
    Ok(no_content())
}

#[utoipa::path(
    patch,
    path = "/peers/{id}",
    tag = "peers",
    summary = "Disable a peer (it is fenced, its processes restored elsewhere, its logins refused) or enable it",
    params(("id" = PeerId, Path, description = "The peer's id")),
    request_body = UpdatePeer,
    security(("user" = [])),
    responses(
        (status = 200, description = "The peer as changed", body = PeerInfo),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such peer of yours (`not_found`)", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn update_peer(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiPath(id): ApiPath<PeerId>,
    ApiJson(change): ApiJson<UpdatePeer>,
) -> Result<Json<PeerInfo>, Error> {
    let caller = Caller {
        id: auth.id,
        admin: auth.role == Role::Admin,
    };
    let mut peer = sn
        .with_core(move |core, inner, fx| {
            core.set_peer_disabled(inner, fx, caller, id, change.disabled, now_ms())
        })
        .await?;
    crate::rest::with_measurements(&sn, std::slice::from_mut(&mut peer));
    Ok(Json(peer))
}
