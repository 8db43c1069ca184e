//! `GET /api/v1/jobs/{id}/events`: a job's events as Server-Sent Events,
//! resumable with `Last-Event-ID` (or `?after=N`).
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
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use bsp_api::JobId;
use bsp_api::rest::JobEvent;
use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::watch;

use crate::auth::AuthUser;
use crate::http::{ApiPath, ApiQuery};
use crate::{Error, Supernode};

/// Events read from SQLite per query.
const BATCH: u32 = 500;

#[derive(Deserialize)]
pub(crate) struct EventsQuery {
    after: Option<i64>,
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
}

fn to_sse(event: &JobEvent) -> Event {
    let data = serde_json::to_string(event).unwrap_or_else(|_| "{}".into());
    Event::default()
        .id(event.id.to_string())
        .event(event.kind.name())
        .data(data)
}

pub(crate) async fn events(
    State(sn): State<Supernode>,
    auth: AuthUser,
    ApiPath(job): ApiPath<JobId>,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Error> {
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
    };
    if events.is_empty() && finished {
        follow.done = true;
    }
    if let Some(e) = events.last() {
        follow.last = e.id;
    }
    follow.buffered.extend(events);
    let stream = futures_util::stream::unfold(follow, |mut f| async move {
        next(&mut f).await.map(|event| (Ok(to_sse(&event)), f))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The next event to send, or `None` to end the stream.
async fn next(f: &mut Follow) -> Option<JobEvent> {
    loop {
        if let Some(event) = f.buffered.pop_front() {
            if event.kind.is_terminal() {
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
                if finished {
                    // The terminal event is at or before `last`: already sent.
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
