//! `GET /api/v1/jobs/{id}/events`: a job's events as Server-Sent Events,
//! resumable with `Last-Event-ID` (or `?after=N`); and `GET /api/v1/events`,
//! the caller's `job_list_changed` notifications.
//!
//! The stream first sends the stored events after the given id, then waits
//! for new ones. Waiting is on a per-job [`watch`] channel subscribed
//! *before* the first query, and every wake-up re-queries by id, so no event
//! is lost between the query and the wait and none is sent twice. The
//! stream ends after the job's terminal event.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::IntoResponse;
use axum::response::sse::{Event, KeepAlive, Sse};
use bsp_api::JobId;
use bsp_api::rest::{JobEvent, JobListChanged};
use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::broadcast;
use tokio::sync::watch;

use crate::auth::AuthUser;
use crate::http::{ApiPath, ApiQuery};
use crate::{Error, Supernode};

/// Events read from SQLite per query.
const BATCH: u32 = 500;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Start after this event id (`Last-Event-ID` wins when both are given).
    after: Option<i64>,
    /// `false`: end the stream once every event stored so far was sent,
    /// instead of waiting for new ones (default `true`).
    follow: Option<bool>,
}

struct Follow {
    sn: Supernode,
    owner: i64,
    job: JobId,
    last: i64,
    buffered: VecDeque<JobEvent>,
    changed: watch::Receiver<()>,
    stop: watch::Receiver<bool>,
    done: bool,
    /// Not following: the newest event stored when the request came; the
    /// stream ends once it is sent.
    until: Option<i64>,
}

fn to_sse(event: &JobEvent) -> Event {
    let data = serde_json::to_string(event).unwrap_or_else(|_| "{}".into());
    Event::default()
        .id(event.id.to_string())
        .event(event.kind.name())
        .data(data)
}

#[utoipa::path(
    get,
    path = "/jobs/{id}/events",
    tag = "jobs",
    summary = "A job's events as Server-Sent Events, resumable with `Last-Event-ID`",
    params(("id" = i64, Path, description = "The job id"), EventsQuery, ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this event id")),
    security(("user" = [])),
    responses(
        (status = 200, description = "`text/event-stream`: `id:` the event id, `event:` the kind, `data:` a JobEvent as JSON; ends after the terminal event, or with `follow=false` after the events stored when the request came, whose last id the `bspweb-last-event-id` header gives", content_type = "text/event-stream", body = JobEvent,
            headers(("bspweb-last-event-id" = i64, description = "With `follow=false` only: the id of the last event this stream sends (0: none)"))),
        (status = 400, description = "Malformed request: bad JSON (`bad_json`) or a bad query or path parameter (`bad_request`)", body = bsp_api::rest::ApiError),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError),
        (status = 404, description = "No such thing visible to the caller (`not_found`)", body = bsp_api::rest::ApiError),
        (status = 500, description = "Internal error; the supernode log has the details (`internal`)", body = bsp_api::rest::ApiError),
        (status = 503, description = "The supernode cannot write to its disk (full, or failing) (`storage_unavailable`): try again later; running jobs go on", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn events(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiPath(job): ApiPath<JobId>,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, Error> {
    let after = match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .ok_or_else(|| {
                Error::bad_request("`Last-Event-ID` must be the id (an integer) of an event")
            })?,
        None => q.after.unwrap_or(0),
    };
    let owner = auth.id;
    let until = match q.follow {
        Some(false) => {
            let last = sn
                .with_core(move |core, _, _| core.last_event_id(owner, job))
                .await?;
            Some(last.ok_or_else(|| Error::NotFound(format!("no job {job} among your jobs")))?)
        }
        _ => None,
    };
    // Subscribe before the first query, so nothing stored after it is missed.
    let changed = sn.inner.watch_job(job);
    // The first batch also checks that the job is the caller's (404 if not).
    let first = sn
        .with_core(move |core, _, _| core.events(owner, job, after, BATCH))
        .await?;
    let Some((events, finished)) = first else {
        return Err(Error::NotFound(format!("no job {job} among your jobs")));
    };
    let mut follow = Follow {
        stop: sn.inner.shutdown_signal(),
        sn,
        owner,
        job,
        last: after,
        buffered: VecDeque::new(),
        changed,
        done: false,
        until,
    };
    if (events.is_empty() && finished) || until.is_some_and(|u| u <= after) {
        follow.done = true;
    }
    if let Some(e) = events.last() {
        follow.last = e.id;
    }
    follow.buffered.extend(events);
    let stream = futures_util::stream::unfold(follow, |mut f| async move {
        next(&mut f)
            .await
            .map(|event| (Ok::<_, Infallible>(to_sse(&event)), f))
    });
    let sse = Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)));
    // Not following: the client checks that it read up to this id.
    let last = until.map(|u| [(LAST_STORED_EVENT, HeaderValue::from(u))]);
    Ok((last, sse))
}

/// The response header of `follow=false`: the id of the last event the
/// stream will send (0: none).
pub(crate) const LAST_STORED_EVENT: &str = "bspweb-last-event-id";

/// The next event to send, or `None` to end the stream.
async fn next(f: &mut Follow) -> Option<JobEvent> {
    loop {
        if let Some(event) = f.buffered.pop_front() {
            if f.until.is_some_and(|u| event.id > u) {
                // Stored after the request: not part of the snapshot.
                f.done = true;
                f.buffered.clear();
                return None;
            }
            if event.kind.is_terminal() || f.until.is_some_and(|u| event.id >= u) {
                f.done = true;
                f.buffered.clear();
            }
            return Some(event);
        }
        if f.done || *f.stop.borrow() {
            return None;
        }
        let (owner, job, after) = (f.owner, f.job, f.last);
        let batch =
            f.sn.with_core(move |core, _, _| core.events(owner, job, after, BATCH))
                .await;
        match batch {
            Ok(Some((events, finished))) => {
                if let Some(e) = events.last() {
                    f.last = e.id;
                    f.buffered.extend(events);
                    continue;
                }
                if finished || f.until.is_some() {
                    // Finished: the terminal event is at or before `last`,
                    // already sent. Not following: the snapshot is sent.
                    return None;
                }
            }
            // The job was disposed of while followed.
            Ok(None) => return None,
            Err(e) => {
                tracing::error!(job, error = %e, "event stream query failed");
                return None;
            }
        }
        tokio::select! {
            changed = f.changed.changed() => {
                if changed.is_err() {
                    return None;
                }
            }
            _ = f.stop.wait_for(|s| *s) => return None,
        }
    }
}

struct ListFollow {
    sn: Supernode,
    owner: i64,
    changes: broadcast::Receiver<(i64, JobId)>,
    stop: watch::Receiver<bool>,
    pending: VecDeque<JobId>,
}

/// The owner of a job-list change that stands for "any job of any owner".
pub(crate) const EVERY_OWNER: i64 = -1;

/// `GET /api/v1/events`: one `job_list_changed` event each time one of the
/// caller's jobs is submitted, starts, finishes or is disposed of. The stream
/// is a notification, not a log: it has no ids and no replay, so a client
/// re-reads the job lists when it (re)connects. A reader that falls more
/// than [`crate::JOB_LIST_CAPACITY`] changes behind gets one event per job.
#[utoipa::path(
    get,
    path = "/events",
    tag = "jobs",
    summary = "The caller's job list changes as Server-Sent Events",
    security(("user" = [])),
    responses(
        (status = 200, description = "`text/event-stream` of `event: job_list_changed` with a JobListChanged as JSON; no ids, no replay: re-read the lists on (re)connect", content_type = "text/event-stream", body = JobListChanged),
        (status = 401, description = "No token, a bad one, an expired one or one that ended with a password change (`unauthorized`, `token_expired`), or a disabled account (`account_disabled`): log in again", body = bsp_api::rest::ApiError)
    )
)]
pub(crate) async fn job_list_events(
    State(sn): State<Supernode>,
    auth: AuthUser,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let follow = ListFollow {
        changes: sn.inner.watch_job_list(),
        stop: sn.inner.shutdown_signal(),
        sn,
        owner: auth.id,
        pending: VecDeque::new(),
    };
    let stream = futures_util::stream::unfold(follow, |mut f| async move {
        let change = next_list_change(&mut f).await?;
        let data = serde_json::to_string(&change).unwrap_or_else(|_| "{}".into());
        Some((Ok(Event::default().event("job_list_changed").data(data)), f))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

async fn next_list_change(f: &mut ListFollow) -> Option<JobListChanged> {
    loop {
        if let Some(job) = f.pending.pop_front() {
            let owner = f.owner;
            match f
                .sn
                .with_core(move |core, _, _| core.job_state(owner, job))
                .await
            {
                Ok(state) => return Some(JobListChanged { job, state }),
                Err(e) => {
                    tracing::error!(error = %e, "job list stream query failed");
                    return None;
                }
            }
        }
        if *f.stop.borrow() {
            return None;
        }
        let change = tokio::select! {
            change = f.changes.recv() => change,
            _ = f.stop.wait_for(|s| *s) => return None,
        };
        match change {
            Ok((owner, job)) if owner != EVERY_OWNER => {
                if owner == f.owner {
                    f.pending.push_back(job);
                }
            }
            // Missed changes, or any job of anybody's may have changed
            // (another supernode said so): tell every job's state again.
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                let owner = f.owner;
                match f.sn.with_core(move |core, _, _| core.job_ids(owner)).await {
                    Ok(ids) => f.pending.extend(ids),
                    Err(e) => {
                        tracing::error!(error = %e, "job list stream query failed");
                        return None;
                    }
                }
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}
