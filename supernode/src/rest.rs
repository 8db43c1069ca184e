//! Handlers of the user-facing REST API ([`bsp_api::rest`]).

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bsp_api::JobId;
use bsp_api::rest::{
    ChangePasswordRequest, CreateUserRequest, Health, JobInfo, JobState, LoginRequest,
    LoginResponse, PeerInfo, ProgramInfo, RingInfo, Role, SetPasswordRequest, SubmitJob,
    UpdateUserRequest, UserInfo,
};
use serde::Deserialize;

use crate::auth::AuthUser;
use crate::http::{ApiBytes, ApiJson, ApiPath, ApiQuery, no_content};
use crate::{Error, Supernode, lease, now_ms, state};

#[utoipa::path(
    post,
    path = "/login",
    tag = "users",
    summary = "Log in; returns a token",
    request_body = LoginRequest,
    responses(
        (status = 200, description = "Logged in", body = LoginResponse),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`, `invalid_module`, ...)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn login(
    State(sn): State<Supernode>,
    ApiJson(req): ApiJson<LoginRequest>,
) -> Result<Json<LoginResponse>, Error> {
    let Some((user, generation)) = sn.check_login(&req.name, &req.password).await? else {
        tracing::info!(user = %req.name.chars().take(64).collect::<String>(), "failed login");
        return Err(Error::unauthorized("wrong user name or password"));
    };
    if user.disabled {
        return Err(Error::Unauthorized {
            code: "account_disabled",
            message: format!(
                "the account `{}` is disabled; ask an administrator to enable it",
                user.name
            ),
        });
    }
    let (token, expires_at) = sn.inner.keys.user_token(user.id, &user.name, generation)?;
    tracing::debug!(user = %user.name, "user logged in");
    Ok(Json(LoginResponse {
        token,
        expires_at,
        user,
    }))
}

async fn current_user(sn: &Supernode, auth: &AuthUser) -> Result<UserInfo, Error> {
    let id = auth.id;
    sn.with_core(move |core, inner, _| core.user(inner, id))
        .await?
        .ok_or_else(|| Error::unauthorized("your user account no longer exists"))
}

#[utoipa::path(
    post,
    path = "/users",
    tag = "users",
    summary = "Create an account (administrators only)",
    request_body = CreateUserRequest,
    security(("user" = [])),
    responses(
        (status = 200, description = "The new account", body = UserInfo),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, or an expired one (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 403, description = "Authenticated but not allowed (`forbidden`)", body = bsp_api::rest::ApiError),
        (status = 409, description = "The thing is in the wrong state or exists already (`conflict`)", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`, `invalid_module`, ...)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn create_user(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiJson(req): ApiJson<CreateUserRequest>,
) -> Result<Json<UserInfo>, Error> {
    auth.require_admin("create accounts")?;
    let role = match (req.role, req.admin) {
        (Some(role), true) if role != Role::Admin => {
            return Err(Error::bad_request(format!(
                "`admin: true` contradicts `role: {role}`; give only `role`"
            )));
        }
        (Some(role), _) => role,
        (None, true) => Role::Admin,
        (None, false) => Role::User,
    };
    let user = sn
        .create_user_with(&req.name, &req.password, role, req.quotas)
        .await?;
    tracing::info!(by = %auth.name, user = %user.name, %role, "account created");
    Ok(Json(user))
}

#[utoipa::path(
    get,
    path = "/users",
    tag = "users",
    summary = "Every account, with its quotas and usage (administrators only)",
    security(("user" = [])),
    responses(
        (status = 200, description = "The accounts, by name", body = Vec<UserInfo>),
        (status = 401, description = "No token, a bad one, or an expired one (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 403, description = "Authenticated but not allowed (`forbidden`)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn users(
    State(sn): State<Supernode>,
    auth: AuthUser,
) -> Result<Json<Vec<UserInfo>>, Error> {
    auth.require_admin("list accounts")?;
    Ok(Json(
        sn.with_core(|core, inner, _| core.users(inner)).await?,
    ))
}

#[utoipa::path(
    patch,
    path = "/users/{user}",
    tag = "users",
    summary = "Change an account's role, standing or quotas (administrators only)",
    params(("user" = String, Path, description = "The account's name")),
    request_body = UpdateUserRequest,
    security(("user" = [])),
    responses(
        (status = 200, description = "The account as changed", body = UserInfo),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, or an expired one (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 403, description = "Authenticated but not allowed (`forbidden`)", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such user (`not_found`)", body = bsp_api::rest::ApiError),
        (status = 409, description = "Administrators cannot change their own role or disable themselves (`conflict`)", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`, `invalid_module`, ...)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn update_user(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiPath(name): ApiPath<String>,
    ApiJson(change): ApiJson<UpdateUserRequest>,
) -> Result<Json<UserInfo>, Error> {
    auth.require_admin("change accounts")?;
    state::check_quotas(&change.quotas)?;
    let actor = auth.id;
    Ok(Json(
        sn.with_core(move |core, inner, fx| core.update_user(inner, fx, actor, &name, &change))
            .await?,
    ))
}

#[utoipa::path(
    post,
    path = "/users/{user}/password",
    tag = "users",
    summary = "Set an account's password (administrators only); its logins end",
    params(("user" = String, Path, description = "The account's name")),
    request_body = SetPasswordRequest,
    security(("user" = [])),
    responses(
        (status = 200, description = "The account", body = UserInfo),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, or an expired one (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 403, description = "Authenticated but not allowed (`forbidden`)", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such user (`not_found`)", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`, `invalid_module`, ...)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn set_password(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<SetPasswordRequest>,
) -> Result<Json<UserInfo>, Error> {
    auth.require_admin("set other accounts' passwords")?;
    let user = sn.set_password(&name, &req.password).await?;
    tracing::info!(by = %auth.name, user = %user.name, "password set by an administrator");
    Ok(Json(user))
}

#[utoipa::path(
    post,
    path = "/me/password",
    tag = "users",
    summary = "Change your own password; your other logins end, this answer is a new one",
    request_body = ChangePasswordRequest,
    security(("user" = [])),
    responses(
        (status = 200, description = "A fresh login with the new password", body = LoginResponse),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, or an expired one (`unauthorized`, `token_expired`), a disabled account (`account_disabled`), or a wrong current password (`wrong_password`)", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`, `invalid_module`, ...)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn change_password(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiJson(req): ApiJson<ChangePasswordRequest>,
) -> Result<Json<LoginResponse>, Error> {
    if sn
        .check_password(&auth.name, &req.current_password)
        .await?
        .is_none_or(|u| u.id != auth.id)
    {
        return Err(Error::Unauthorized {
            code: "wrong_password",
            message: "the current password is wrong; nothing was changed".into(),
        });
    }
    let (user, generation) = sn
        .set_password_generation(&auth.name, &req.new_password)
        .await?;
    let (token, expires_at) = sn.inner.keys.user_token(user.id, &user.name, generation)?;
    Ok(Json(LoginResponse {
        token,
        expires_at,
        user,
    }))
}

#[utoipa::path(
    get,
    path = "/me",
    tag = "users",
    summary = "The logged-in account, with its quotas and usage",
    security(("user" = [])),
    responses(
        (status = 200, description = "The caller", body = UserInfo),
        (status = 401, description = "No token, a bad one, or an expired one (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn me(
    State(sn): State<Supernode>,
    auth: AuthUser,
) -> Result<Json<UserInfo>, Error> {
    Ok(Json(current_user(&sn, &auth).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct UploadQuery {
    name: Option<String>,
    description: Option<String>,
}

#[utoipa::path(
    post,
    path = "/programs",
    tag = "programs",
    summary = "Upload and validate a WebAssembly module",
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The module bytes (any content type is accepted)"),
    params(UploadQuery),
    security(("user" = [])),
    responses(
        (status = 200, description = "The stored program", body = ProgramInfo),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 403, description = "Volunteer accounts upload no programs (`forbidden`)", body = bsp_api::rest::ApiError),
        (status = 409, description = "The caller stores as many programs as their quota allows (`quota_exceeded`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`, `invalid_module`, ...)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn upload_program(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiQuery(q): ApiQuery<UploadQuery>,
    ApiBytes(wasm): ApiBytes,
) -> Result<Json<ProgramInfo>, Error> {
    auth.require_runner("upload programs")?;
    let name = q.name.filter(|n| !n.is_empty());
    if let Some(name) = &name {
        state::check_program_name(name)?;
    }
    if let Some(d) = &q.description
        && d.chars().count() > 4096
    {
        return Err(Error::bad_request(
            "`description` is longer than 4096 characters",
        ));
    }
    let (hash, wasm) =
        tokio::task::spawn_blocking(move || state::validate_module(&wasm).map(|hash| (hash, wasm)))
            .await??;
    let owner = auth.id;
    let info = sn
        .with_core(move |core, inner, _| {
            core.store_program(
                &inner.config,
                Some(owner),
                name.as_deref(),
                q.description.as_deref(),
                &hash,
                &wasm,
            )
        })
        .await?;
    tracing::info!(user = %auth.name, hash = %info.hash, name = info.name.as_deref().unwrap_or(""), "program uploaded");
    Ok(Json(info))
}

#[utoipa::path(
    get,
    path = "/programs",
    tag = "programs",
    summary = "The programs the caller can run",
    security(("user" = [])),
    responses(
        (status = 200, description = "Own programs and the bundled examples", body = Vec<ProgramInfo>),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn programs(
    State(sn): State<Supernode>,
    auth: AuthUser,
) -> Result<Json<Vec<ProgramInfo>>, Error> {
    let owner = auth.id;
    Ok(Json(
        sn.with_core(move |core, _, _| core.programs_of(owner))
            .await?,
    ))
}

#[utoipa::path(
    post,
    path = "/jobs",
    tag = "jobs",
    summary = "Submit a job",
    request_body = SubmitJob,
    security(("user" = [])),
    responses(
        (status = 200, description = "The job, waiting for peers or already placed", body = JobInfo),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such program for the caller (`program_not_found`)", body = bsp_api::rest::ApiError),
        (status = 413, description = "The request body is larger than the endpoint accepts (`too_large`)", body = bsp_api::rest::ApiError),
        (status = 422, description = "Well-formed but refused content (`invalid_body`, `invalid_module`, ...)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError),
        (status = 403, description = "Volunteer accounts run no jobs (`forbidden`)", body = bsp_api::rest::ApiError),
        (status = 409, description = "Fewer peers online than `min_peers` (`not_enough_peers`), the job needs more memory than the online peers may use together (`not_enough_memory`), or it has more processes than the caller's quota allows at once (`quota_exceeded`)", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn submit(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiJson(job): ApiJson<SubmitJob>,
) -> Result<Json<JobInfo>, Error> {
    auth.require_runner("run jobs")?;
    if let Some(min) = job.min_peers {
        let online = peers_online(&sn);
        if online < min {
            return Err(Error::NotEnoughPeers(format!(
                "{online} peer{} online, fewer than the {min} this job asks for (`min_peers`); \
                     try again later, or submit without `min_peers` to queue the job until peers come",
                if online == 1 { " is" } else { "s are" }
            )));
        }
    }
    let job = tokio::task::spawn_blocking(move || state::validate_submit(job)).await??;
    let owner = auth.id;
    Ok(Json(
        sn.with_core(move |core, inner, fx| core.submit(inner, owner, job, fx, crate::now_ms()))
            .await?,
    ))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct JobsQuery {
    state: Option<String>,
}

#[utoipa::path(
    get,
    path = "/jobs",
    tag = "jobs",
    summary = "The caller's jobs",
    params(JobsQuery),
    security(("user" = [])),
    responses(
        (status = 200, description = "Oldest first", body = Vec<JobInfo>),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn jobs(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiQuery(q): ApiQuery<JobsQuery>,
) -> Result<Json<Vec<JobInfo>>, Error> {
    let state = match q.state.as_deref() {
        None | Some("") => None,
        Some(s) => Some(JobState::parse(s).ok_or_else(|| {
            Error::bad_request(format!(
                "unknown job state `{}`; use waiting, active or finished",
                s.chars().take(40).collect::<String>()
            ))
        })?),
    };
    let owner = auth.id;
    Ok(Json(
        sn.with_core(move |core, _, _| core.jobs(owner, state))
            .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/jobs/{id}",
    tag = "jobs",
    summary = "One job",
    params(("id" = i64, Path, description = "The job id")),
    security(("user" = [])),
    responses(
        (status = 200, description = "The job", body = JobInfo),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such thing visible to the caller (`not_found`)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn job(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiPath(id): ApiPath<JobId>,
) -> Result<Json<JobInfo>, Error> {
    let owner = auth.id;
    Ok(Json(
        sn.with_core(move |core, _, _| core.job(owner, id)).await?,
    ))
}

#[utoipa::path(
    post,
    path = "/jobs/{id}/kill",
    tag = "jobs",
    summary = "Kill a waiting or running job",
    params(("id" = i64, Path, description = "The job id")),
    security(("user" = [])),
    responses(
        (status = 200, description = "The job, now finished", body = JobInfo),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such thing visible to the caller (`not_found`)", body = bsp_api::rest::ApiError),
        (status = 409, description = "The thing is in the wrong state or exists already (`conflict`)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn kill(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiPath(id): ApiPath<JobId>,
) -> Result<Json<JobInfo>, Error> {
    let owner = auth.id;
    let info = sn
        .with_core(move |core, inner, fx| core.kill(inner, fx, owner, id, crate::now_ms()))
        .await?;
    tracing::info!(job = id, user = %auth.name, "job killed");
    Ok(Json(info))
}

#[utoipa::path(
    delete,
    path = "/jobs/{id}",
    tag = "jobs",
    summary = "Delete a finished job and its output",
    params(("id" = i64, Path, description = "The job id")),
    security(("user" = [])),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such thing visible to the caller (`not_found`)", body = bsp_api::rest::ApiError),
        (status = 409, description = "The thing is in the wrong state or exists already (`conflict`)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn dispose(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiPath(id): ApiPath<JobId>,
) -> Result<Response, Error> {
    let owner = auth.id;
    sn.with_core(move |core, _, fx| core.dispose(fx, owner, id))
        .await?;
    Ok(no_content())
}

#[utoipa::path(
    get,
    path = "/peers",
    tag = "peers",
    summary = "The peers the supernode knows",
    security(("user" = [])),
    responses(
        (status = 200, description = "Online peers first", body = Vec<PeerInfo>),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn peers(
    State(sn): State<Supernode>,
    _auth: AuthUser,
) -> Result<Json<Vec<PeerInfo>>, Error> {
    let mut peers = sn.with_core(|core, _, _| core.peers()).await?;
    with_measurements(&sn, &mut peers);
    Ok(Json(peers))
}

/// Adds to `peers` what the supernode holds in memory only: the links each
/// measured to peers that are still online, and the clusters it found.
pub(crate) fn with_measurements(sn: &Supernode, peers: &mut [PeerInfo]) {
    let live = sn.inner.live();
    for p in peers.iter_mut() {
        let mut links: Vec<bsp_api::rest::PeerLink> = live
            .links
            .iter()
            .filter(|((from, to), _)| *from == p.id && live.peers.contains_key(to))
            .map(|(_, l)| *l)
            .collect();
        links.sort_unstable_by_key(|l| l.peer);
        p.links = links;
        if p.state != "gone" {
            p.delivered_power = live.verify.delivered(p.id, now_ms());
        }
    }
    drop(live);
    let found = sn.inner.found_clusters();
    for p in peers.iter_mut() {
        if p.state != "gone" {
            p.found_cluster = found.get(&p.id).cloned();
            p.cluster = crate::clusters::effective(p.id, p.cluster.take(), &found);
        }
    }
}

/// Peers holding a valid lease now.
fn peers_online(sn: &Supernode) -> u32 {
    let now = now_ms();
    let online = sn
        .inner
        .live()
        .peers
        .values()
        .filter(|p| lease::is_valid(now, p.expires_at))
        .count();
    u32::try_from(online).unwrap_or(u32::MAX)
}

#[utoipa::path(
    get,
    path = "/health",
    tag = "meta",
    summary = "Liveness and version",
    responses(
        (status = 200, description = "Up", body = Health)
    )
)]
pub(crate) async fn health(State(sn): State<Supernode>) -> Json<Health> {
    Json(Health {
        version: env!("CARGO_PKG_VERSION").to_string(),
        api_version: bsp_api::API_VERSION,
        peers_online: peers_online(&sn),
        storage_problem: sn.inner.storage_trouble().map(|(since, detail)| {
            let secs = crate::now_ms().saturating_sub(since) / 1000;
            format!(
                "for {secs} s the supernode has not been able to write to its disk ({detail}); running jobs go on and their output waits on the peers, but nothing new is stored until space returns"
            )
        }),
    })
}

/// `GET /metrics` (outside `/api/v1`, where Prometheus looks by default):
/// the counters and gauges of [`crate::metrics`] in the Prometheus text
/// format. Open like `/api/v1/health`: aggregates only, no names.
pub(crate) async fn metrics(State(sn): State<Supernode>) -> Result<Response, Error> {
    let gauges = sn.with_core(|core, _, _| core.metrics_gauges()).await;
    let mut gauges = gauges?;
    gauges.storage_ok = sn.inner.storage_trouble().is_none();
    let text = crate::metrics::render(
        &sn.inner.metrics.snapshot(),
        &gauges,
        env!("CARGO_PKG_VERSION"),
    );
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

#[utoipa::path(
    get,
    path = "/ring",
    tag = "peers",
    summary = "The DHHT ring: peer positions and shares, and where the caller's processes land",
    security(("user" = [])),
    responses(
        (status = 200, description = "The ring", body = RingInfo),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn ring(
    State(sn): State<Supernode>,
    auth: AuthUser,
) -> Result<Json<RingInfo>, Error> {
    let owner = auth.id;
    Ok(Json(
        sn.with_core(move |core, _, _| core.ring(owner)).await?,
    ))
}

#[utoipa::path(
    delete,
    path = "/programs/{program}",
    tag = "programs",
    summary = "Forget one of your programs",
    params(("program" = String, Path, description = "A program name of yours, or the hash of a module you uploaded")),
    security(("user" = [])),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 403, description = "Authenticated but not allowed (`forbidden`)", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such program for the caller (`program_not_found`)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn delete_program(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiPath(program): ApiPath<String>,
) -> Result<Response, Error> {
    let owner = auth.id;
    sn.with_core(move |core, _, _| core.delete_program(owner, &program))
        .await?;
    Ok(no_content())
}
