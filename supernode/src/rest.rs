//! Handlers of the user-facing REST API ([`bsp_api::rest`]).

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use bsp_api::JobId;
use bsp_api::rest::{
    CreateUserRequest, Health, JobInfo, JobState, LoginRequest, LoginResponse, PeerInfo,
    ProgramInfo, SubmitJob, UserInfo,
};
use serde::Deserialize;

use crate::auth::AuthUser;
use crate::http::{ApiBytes, ApiJson, ApiPath, ApiQuery, no_content};
use crate::{Error, Supernode, lease, now_ms, state};

pub(crate) async fn login(
    State(sn): State<Supernode>,
    ApiJson(req): ApiJson<LoginRequest>,
) -> Result<Json<LoginResponse>, Error> {
    let Some(user) = sn.check_password(&req.name, &req.password).await? else {
        tracing::info!(user = %req.name.chars().take(64).collect::<String>(), "failed login");
        return Err(Error::unauthorized("wrong user name or password"));
    };
    let (token, expires_at) = sn.inner.keys.user_token(user.id, &user.name)?;
    tracing::debug!(user = %user.name, "user logged in");
    Ok(Json(LoginResponse {
        token,
        expires_at,
        user,
    }))
}

async fn current_user(sn: &Supernode, auth: &AuthUser) -> Result<UserInfo, Error> {
    let id = auth.id;
    sn.with_core(move |core, _, _| core.user(id))
        .await?
        .ok_or_else(|| Error::unauthorized("your user account no longer exists"))
}

pub(crate) async fn create_user(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiJson(req): ApiJson<CreateUserRequest>,
) -> Result<Json<UserInfo>, Error> {
    let me = current_user(&sn, &auth).await?;
    if !me.admin {
        return Err(Error::Forbidden(
            "only administrators can create users".into(),
        ));
    }
    let user = sn.create_user(&req.name, &req.password, req.admin).await?;
    Ok(Json(user))
}

pub(crate) async fn me(
    State(sn): State<Supernode>,
    auth: AuthUser,
) -> Result<Json<UserInfo>, Error> {
    Ok(Json(current_user(&sn, &auth).await?))
}

#[derive(Deserialize)]
pub(crate) struct UploadQuery {
    name: Option<String>,
    description: Option<String>,
}

pub(crate) async fn upload_program(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiQuery(q): ApiQuery<UploadQuery>,
    ApiBytes(wasm): ApiBytes,
) -> Result<Json<ProgramInfo>, Error> {
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
        .with_core(move |core, _, _| {
            core.store_program(
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

pub(crate) async fn submit(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiJson(job): ApiJson<SubmitJob>,
) -> Result<Json<JobInfo>, Error> {
    let job = tokio::task::spawn_blocking(move || state::validate_submit(job)).await??;
    let owner = auth.id;
    Ok(Json(
        sn.with_core(move |core, _, fx| core.submit(owner, job, fx))
            .await?,
    ))
}

#[derive(Deserialize)]
pub(crate) struct JobsQuery {
    state: Option<String>,
}

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

pub(crate) async fn kill(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiPath(id): ApiPath<JobId>,
) -> Result<Json<JobInfo>, Error> {
    let owner = auth.id;
    let info = sn
        .with_core(move |core, inner, fx| core.kill(inner, fx, owner, id))
        .await?;
    tracing::info!(job = id, user = %auth.name, "job killed");
    Ok(Json(info))
}

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

pub(crate) async fn peers(
    State(sn): State<Supernode>,
    _auth: AuthUser,
) -> Result<Json<Vec<PeerInfo>>, Error> {
    Ok(Json(sn.with_core(|core, _, _| core.peers()).await?))
}

pub(crate) async fn health(State(sn): State<Supernode>) -> Json<Health> {
    let now = now_ms();
    let online = sn
        .inner
        .live()
        .peers
        .values()
        .filter(|p| lease::is_valid(now, p.expires_at))
        .count();
    Json(Health {
        version: env!("CARGO_PKG_VERSION").to_string(),
        api_version: bsp_api::API_VERSION,
        peers_online: online as u32,
    })
}
