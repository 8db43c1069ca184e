//! Event streams: one job's events ([`EventStream`], [`JobEvents`]), the
//! user's job-list changes ([`JobListEvents`]), and both merged for every
//! job of the user ([`Subscription`]), the listener of dissertation §2.3.4.
//!
//! How they reconnect and retry: see the [client module](super)
//! documentation.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::time::Duration;

use base64::Engine;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Client, ClientError, api_error};
use crate::rest::{JobEvent, JobEventKind, JobInfo, JobListChanged, JobState};
use crate::{JobId, PeerId, Pid};

/// How long a stream of its own ([`EventStream`], [`JobEvents`],
/// [`JobListEvents`]) retries transient failures in a row before it returns
/// the last one. A [`Subscription`] never gives up.
pub const STREAM_RETRY_FOR: Duration = Duration::from_secs(5 * 60);
/// The header of a `follow=false` event stream: the id of its last event.
const LAST_STORED_EVENT: &str = "bspweb-last-event-id";
/// The delay after the first failure; it doubles with each one after.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest delay between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A connection that stayed up this long was healthy, even without events.
const HEALTHY: Duration = Duration::from_secs(30);
/// The shortest time between two re-listings of a [`Subscription`]'s jobs.
const MIN_RELIST_INTERVAL: Duration = Duration::from_secs(1);
/// Items a [`Subscription`]'s streams may read ahead of its caller.
const READ_AHEAD: usize = 64;

/// The kinds of [`JobEventKind`], by name: an event of another kind comes
/// from a newer supernode and is skipped.
const KNOWN_KINDS: [&str; 13] = [
    "stdout",
    "stderr",
    "raw",
    "status",
    "process_exited",
    "process_rolled_back",
    "process_migrated",
    "copies_disagree",
    "peer_quarantined",
    "job_exited",
    "job_aborted",
    "job_failed",
    "job_killed",
];

/// One event of the dissertation's `ConsumerEventListener` (§2.3.4), typed.
///
/// Process events carry the pid; the job's terminal event is one of
/// [`JobExited`](ConsumerEvent::JobExited),
/// [`JobAborted`](ConsumerEvent::JobAborted),
/// [`JobFailed`](ConsumerEvent::JobFailed) and
/// [`JobKilled`](ConsumerEvent::JobKilled).
///
/// Later versions may add kinds of events: match with a wildcard arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumerEvent {
    /// A line the process printed to standard output (`printToStdOut`).
    Stdout { job: JobId, pid: Pid, line: String },
    /// A line the process printed to standard error (`printToStdErr`).
    Stderr { job: JobId, pid: Pid, line: String },
    /// A record the process wrote with `write_raw`, decoded (`writeRawData`).
    RawData { job: JobId, pid: Pid, data: Vec<u8> },
    /// A status line of the system about the job or one process, for people
    /// (`printStatusLine`).
    StatusLine {
        job: JobId,
        pid: Option<Pid>,
        line: String,
    },
    /// The process returned from `main` after `superstep` syncs (`processExited`).
    ProcessExited {
        job: JobId,
        pid: Pid,
        superstep: u32,
    },
    /// The process was lost with its peer and restored from its checkpoint
    /// of `superstep`; it re-executes from there and its repeated output is
    /// not sent again (`processRolledBack`).
    ProcessRolledBack {
        job: JobId,
        pid: Pid,
        superstep: u32,
        /// No checkpoint of it survived: it re-runs from the start.
        from_start: bool,
    },
    /// The process moved from peer `from` to peer `to` at the end of `superstep`.
    ProcessMigrated {
        job: JobId,
        pid: Pid,
        from: PeerId,
        to: PeerId,
        superstep: u32,
    },
    /// With redundancy: the copies of the process on `peers` computed
    /// different results in `superstep` (`what`); a third run decides.
    CopiesDisagree {
        job: JobId,
        pid: Pid,
        superstep: u32,
        peers: Vec<PeerId>,
        what: String,
    },
    /// With redundancy: `peer` was outvoted about the process's result in
    /// `superstep` and gets no more work.
    PeerQuarantined {
        job: JobId,
        pid: Pid,
        peer: PeerId,
        superstep: u32,
        reason: String,
    },
    /// Every process exited normally (`jobExited`).
    JobExited { job: JobId },
    /// The program ended the job: `abort`, an error returned from `main`, a
    /// panic (`jobAborted`). `pid` is the process that did it.
    JobAborted {
        job: JobId,
        pid: Option<Pid>,
        cause: String,
    },
    /// The runtime ended the job: a trap, a time or memory limit, a bad
    /// message, peers lost beyond the replicas (`jobDiedOnError`). `pid` is
    /// the process it came from, when one did.
    JobFailed {
        job: JobId,
        pid: Option<Pid>,
        cause: String,
    },
    /// The owner killed the job.
    JobKilled { job: JobId },
    /// One of the user's jobs was submitted, started, finished or disposed
    /// (`jobListChanged`); `state` is `None` once it was disposed.
    JobListChanged { job: JobId, state: Option<JobState> },
}

impl ConsumerEvent {
    /// The job the event is about.
    pub fn job(&self) -> JobId {
        match self {
            ConsumerEvent::Stdout { job, .. }
            | ConsumerEvent::Stderr { job, .. }
            | ConsumerEvent::RawData { job, .. }
            | ConsumerEvent::StatusLine { job, .. }
            | ConsumerEvent::ProcessExited { job, .. }
            | ConsumerEvent::ProcessRolledBack { job, .. }
            | ConsumerEvent::ProcessMigrated { job, .. }
            | ConsumerEvent::CopiesDisagree { job, .. }
            | ConsumerEvent::PeerQuarantined { job, .. }
            | ConsumerEvent::JobExited { job }
            | ConsumerEvent::JobAborted { job, .. }
            | ConsumerEvent::JobFailed { job, .. }
            | ConsumerEvent::JobKilled { job }
            | ConsumerEvent::JobListChanged { job, .. } => *job,
        }
    }

    /// True for the last event of a job's stream.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            ConsumerEvent::JobExited { .. }
                | ConsumerEvent::JobAborted { .. }
                | ConsumerEvent::JobFailed { .. }
                | ConsumerEvent::JobKilled { .. }
        )
    }
}

impl TryFrom<JobEvent> for ConsumerEvent {
    type Error = ClientError;

    /// The typed form of a stored event (decodes raw data; the pid of a
    /// terminal event is the event's, which the supernode may leave out:
    /// [`JobEvents`] fills it in from the job's `error_pid`).
    fn try_from(e: JobEvent) -> Result<ConsumerEvent, ClientError> {
        let job = e.job;
        let pid = || {
            e.pid.ok_or_else(|| {
                ClientError::Protocol(format!(
                    "a `{}` event of job {job} names no process",
                    e.kind.name()
                ))
            })
        };
        Ok(match &e.kind {
            JobEventKind::Stdout { text } => ConsumerEvent::Stdout {
                job,
                pid: pid()?,
                line: text.clone(),
            },
            JobEventKind::Stderr { text } => ConsumerEvent::Stderr {
                job,
                pid: pid()?,
                line: text.clone(),
            },
            JobEventKind::Raw { data } => ConsumerEvent::RawData {
                job,
                pid: pid()?,
                data: base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|err| {
                        ClientError::Protocol(format!("raw data of job {job} is not base64: {err}"))
                    })?,
            },
            JobEventKind::Status { text } => ConsumerEvent::StatusLine {
                job,
                pid: e.pid,
                line: text.clone(),
            },
            JobEventKind::ProcessExited { superstep } => ConsumerEvent::ProcessExited {
                job,
                pid: pid()?,
                superstep: *superstep,
            },
            JobEventKind::ProcessRolledBack {
                superstep,
                from_start,
            } => ConsumerEvent::ProcessRolledBack {
                job,
                pid: pid()?,
                superstep: *superstep,
                from_start: *from_start,
            },
            JobEventKind::ProcessMigrated {
                from,
                to,
                superstep,
            } => ConsumerEvent::ProcessMigrated {
                job,
                pid: pid()?,
                from: *from,
                to: *to,
                superstep: *superstep,
            },
            JobEventKind::CopiesDisagree {
                superstep,
                peers,
                what,
            } => ConsumerEvent::CopiesDisagree {
                job,
                pid: pid()?,
                superstep: *superstep,
                peers: peers.clone(),
                what: what.clone(),
            },
            JobEventKind::PeerQuarantined {
                peer,
                superstep,
                reason,
            } => ConsumerEvent::PeerQuarantined {
                job,
                pid: pid()?,
                peer: *peer,
                superstep: *superstep,
                reason: reason.clone(),
            },
            JobEventKind::JobExited => ConsumerEvent::JobExited { job },
            JobEventKind::JobAborted { reason } => ConsumerEvent::JobAborted {
                job,
                pid: e.pid,
                cause: reason.clone(),
            },
            JobEventKind::JobFailed { reason } => ConsumerEvent::JobFailed {
                job,
                pid: e.pid,
                cause: reason.clone(),
            },
            JobEventKind::JobKilled => ConsumerEvent::JobKilled { job },
        })
    }
}

/// The delay before the attempt after `failures` failures in a row:
/// exponential, capped, with jitter (half to all of it), so that clients
/// that lost the same supernode do not all come back at once.
fn backoff(failures: u32) -> Duration {
    let full = FIRST_BACKOFF
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX_BACKOFF);
    let half = full / 2;
    let spread = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX).max(1);
    let random = std::collections::hash_map::RandomState::new().hash_one(failures);
    half + Duration::from_nanos(random % spread)
}

/// The retry state of one stream: failures in a row, since when, and when
/// the next attempt may start.
struct Retry {
    /// How long to keep retrying transient failures; `None`: for ever.
    patience: Option<Duration>,
    failures: u32,
    failing_since: Option<Instant>,
    up_since: Option<Instant>,
    next_attempt: Option<Instant>,
}

impl Retry {
    fn new(patience: Option<Duration>) -> Retry {
        Retry {
            patience,
            failures: 0,
            failing_since: None,
            up_since: None,
            next_attempt: None,
        }
    }

    /// Wait until the next attempt may start. Cancel-safe: the deadline
    /// stays until it is reached.
    async fn wait(&mut self) {
        if let Some(at) = self.next_attempt {
            tokio::time::sleep_until(at).await;
            self.next_attempt = None;
        }
    }

    fn connected(&mut self) {
        self.up_since = Some(Instant::now());
    }

    fn succeeded(&mut self) {
        self.failures = 0;
        self.failing_since = None;
    }

    /// Count a failure and put off the next attempt. False once failures
    /// went on for longer than the patience; the count of time starts over
    /// then.
    fn failed(&mut self) -> bool {
        let now = Instant::now();
        if self
            .up_since
            .take()
            .is_some_and(|t| now.duration_since(t) >= HEALTHY)
        {
            self.succeeded();
        }
        self.failures = self.failures.saturating_add(1);
        self.next_attempt = Some(now + backoff(self.failures));
        let since = *self.failing_since.get_or_insert(now);
        let keep_trying = self.patience.is_none_or(|p| now.duration_since(since) < p);
        if !keep_trying {
            self.failing_since = None;
        }
        keep_trying
    }
}

/// What one step of a [`Resumable`] gives.
enum Sse {
    /// An event with data.
    Event(eventsource_stream::Event),
    /// A new connection replaced a dropped one (events sent while none was
    /// up are resent only if the stream has ids).
    Reconnected,
    /// The supernode ended the connection cleanly; the next call reconnects
    /// (at once, unless the caller calls [`Resumable::pause`]).
    Ended,
}

/// One Server-Sent-Events resource, reconnected with `Last-Event-ID`.
struct Resumable {
    client: Client,
    path: String,
    last_id: Option<String>,
    inner: Option<BoxStream<'static, Result<eventsource_stream::Event, ClientError>>>,
    connected_once: bool,
    retry: Retry,
    /// With `follow=false`: the id of the last event the supernode said the
    /// current connection would send.
    last_stored: Option<i64>,
}

impl Resumable {
    fn new(
        client: Client,
        path: String,
        last_id: Option<String>,
        patience: Option<Duration>,
    ) -> Resumable {
        Resumable {
            client,
            path,
            last_id,
            inner: None,
            connected_once: false,
            retry: Retry::new(patience),
            last_stored: None,
        }
    }

    async fn connect(&mut self) -> Result<(), ClientError> {
        use eventsource_stream::{EventStreamError, Eventsource};
        self.client.check()?;
        let url = self.client.url(&self.path);
        let mut req = self
            .client
            .sse
            .get(&url)
            .bearer_auth(&self.client.token)
            .header("accept", "text/event-stream");
        if let Some(id) = &self.last_id {
            req = req.header("last-event-id", id.as_str());
        }
        let resp = req.send().await.map_err(|source| {
            self.client.fail_over(&url);
            ClientError::transport(&url, source)
        })?;
        let status = resp.status();
        self.client.fail_over_on(&url, status);
        if !status.is_success() {
            let body = resp.bytes().await.unwrap_or_default();
            return Err(api_error(status.as_u16(), &body));
        }
        self.last_stored = match resp.headers().get(LAST_STORED_EVENT) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| {
                        ClientError::Protocol(format!("{url}: a bad {LAST_STORED_EVENT} header"))
                    })?,
            ),
        };
        let client = self.client.clone();
        let stream = resp.bytes_stream().eventsource().map(move |r| {
            r.map_err(|e| match e {
                // The supernode went away mid-stream: resume at the next.
                EventStreamError::Transport(source) => {
                    client.fail_over(&url);
                    ClientError::transport(&url, source)
                }
                e => ClientError::Protocol(format!("{url}: {e}")),
            })
        });
        self.inner = Some(stream.boxed());
        self.retry.connected();
        Ok(())
    }

    /// Put off the next connection attempt, as after a failure.
    fn pause(&mut self) {
        self.retry.failed();
    }

    /// The next event. Cancel-safe: dropping the future loses no event, and
    /// a reconnection it was waiting for keeps its deadline.
    async fn next(&mut self) -> Result<Sse, ClientError> {
        loop {
            let Some(inner) = self.inner.as_mut() else {
                self.retry.wait().await;
                match self.connect().await {
                    Ok(()) => {
                        if std::mem::replace(&mut self.connected_once, true) {
                            return Ok(Sse::Reconnected);
                        }
                    }
                    // Transient: again, while there is patience left. Any
                    // other error is the caller's; a call straight after
                    // waits first.
                    Err(e) => {
                        if !self.retry.failed() || !e.is_transient() {
                            return Err(e);
                        }
                    }
                }
                continue;
            };
            match inner.next().await {
                Some(Ok(ev)) => {
                    if !ev.id.is_empty() {
                        self.last_id = Some(ev.id.clone());
                    }
                    if ev.data.is_empty() {
                        continue;
                    }
                    self.retry.succeeded();
                    return Ok(Sse::Event(ev));
                }
                Some(Err(e)) => {
                    self.inner = None;
                    if !self.retry.failed() {
                        return Err(e);
                    }
                }
                None => {
                    self.inner = None;
                    return Ok(Sse::Ended);
                }
            }
        }
    }
}

/// A stored event, parsed.
enum Parsed {
    Known(JobEvent),
    /// An event of a kind this client does not know, to skip.
    Unknown {
        id: i64,
    },
}

fn parse_event(data: &str) -> Result<Parsed, ClientError> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        id: i64,
        kind: String,
    }
    match serde_json::from_str::<JobEvent>(data) {
        Ok(event) => Ok(Parsed::Known(event)),
        Err(err) => match serde_json::from_str::<Envelope>(data) {
            Ok(e) if !KNOWN_KINDS.contains(&e.kind.as_str()) => Ok(Parsed::Unknown { id: e.id }),
            _ => Err(ClientError::Protocol(format!(
                "bad event from the supernode: {err}"
            ))),
        },
    }
}

/// A resumable stream of one job's events as the supernode stores them;
/// see [`Client::events`]. [`JobEvents`] is the typed form.
///
/// It retries transient failures for [`STREAM_RETRY_FOR`] (see the
/// [client module](super) documentation). An event it cannot read is an error, and
/// the next call goes on after it.
pub struct EventStream {
    sse: Resumable,
    job: JobId,
    last_id: Option<i64>,
    done: bool,
    /// The job is over but its terminal event was not seen: read what comes
    /// after `last_id` to the end of the stream, then stop.
    finishing: bool,
    /// An event came since the last clean end of the stream.
    read_since_end: bool,
    /// Only the events stored when the stream connected (`follow=false`):
    /// the first clean end is the end.
    stored_only: bool,
}

impl EventStream {
    pub(crate) fn new(
        client: Client,
        job: JobId,
        after: Option<i64>,
        patience: Option<Duration>,
    ) -> EventStream {
        EventStream {
            sse: Resumable::new(
                client,
                format!("/jobs/{job}/events"),
                after.map(|a| a.to_string()),
                patience,
            ),
            job,
            last_id: after,
            done: false,
            finishing: false,
            read_since_end: false,
            stored_only: false,
        }
    }

    /// The events stored so far, then the end, whether or not the job is
    /// over; see [`Client::stored_events`].
    pub(crate) fn stored(client: Client, job: JobId, after: Option<i64>) -> EventStream {
        let mut stream = EventStream::new(client, job, after, Some(STREAM_RETRY_FOR));
        stream.sse.path = format!("/jobs/{job}/events?follow=false");
        stream.stored_only = true;
        stream
    }

    /// The id of the last event returned.
    pub fn last_id(&self) -> Option<i64> {
        self.last_id
    }

    /// The job followed.
    pub fn job(&self) -> JobId {
        self.job
    }

    /// The next event, or `None` once the job's terminal event was returned
    /// (or the stream was started after it). Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<JobEvent>, ClientError> {
        loop {
            if self.done {
                return Ok(None);
            }
            match self.sse.next().await? {
                Sse::Event(ev) => {
                    self.read_since_end = true;
                    match parse_event(&ev.data) {
                        Ok(Parsed::Known(event)) => {
                            self.last_id = Some(event.id);
                            if event.kind.is_terminal() {
                                self.done = true;
                            }
                            return Ok(Some(event));
                        }
                        Ok(Parsed::Unknown { id }) => self.last_id = Some(id),
                        Err(e) => {
                            if let Ok(id) = ev.id.parse() {
                                self.last_id = Some(id);
                            }
                            return Err(e);
                        }
                    }
                }
                Sse::Reconnected => {}
                Sse::Ended => self.ended().await?,
            }
        }
    }

    /// The supernode ended the stream cleanly before the job's terminal
    /// event: it does when it stops, when the job is disposed of, and, once
    /// the job is over, when nothing comes after `last_id`.
    async fn ended(&mut self) -> Result<(), ClientError> {
        let read = std::mem::replace(&mut self.read_since_end, false);
        if self.stored_only {
            match self.sse.last_stored {
                // Cut short (the supernode stopping, say): read on from
                // `last_id`, after a pause, while there is patience left.
                Some(last) if self.last_id.unwrap_or(0) < last => {
                    if !self.sse.retry.failed() {
                        return Err(ClientError::Protocol(format!(
                            "the supernode ended job {}'s stored events before event {last}",
                            self.job
                        )));
                    }
                }
                _ => self.done = true,
            }
            return Ok(());
        }
        if self.finishing {
            // A whole pass over what follows `last_id` of a finished job
            // brought nothing: the terminal event came before `last_id`.
            self.done = !read;
            return Ok(());
        }
        match self.sse.client.job(self.job).await {
            // Read the rest (a supernode may have cut the stream short).
            Ok(info) if info.state == JobState::Finished => self.finishing = true,
            // The supernode is stopping: reconnect later.
            Ok(_) => self.sse.pause(),
            Err(e) if e.is_transient() => {
                if !self.sse.retry.failed() {
                    return Err(e);
                }
            }
            // The next call reconnects after a pause, not at once.
            Err(e) => {
                self.sse.pause();
                return Err(e);
            }
        }
        Ok(())
    }
}

/// One job's events, typed; see [`Client::job_events`]. Ends after the
/// job's terminal event. Retries like [`EventStream`].
pub struct JobEvents {
    inner: EventStream,
    /// An event read but not returned yet (its pid being looked up).
    pending: Option<ConsumerEvent>,
}

impl JobEvents {
    pub(crate) fn new(inner: EventStream) -> JobEvents {
        JobEvents {
            inner,
            pending: None,
        }
    }

    /// The id of the last event returned; [`Client::job_events_after`]
    /// resumes after it.
    pub fn last_id(&self) -> Option<i64> {
        self.inner.last_id
    }

    /// The job followed.
    pub fn job(&self) -> JobId {
        self.inner.job
    }

    /// The next event, or `None` after the job's terminal event. An event
    /// that cannot be read is an error, and the next call goes on after it.
    /// Cancel-safe: dropping the future loses no event.
    pub async fn next(&mut self) -> Result<Option<ConsumerEvent>, ClientError> {
        if self.pending.is_none() {
            let Some(event) = self.inner.next().await? else {
                return Ok(None);
            };
            self.pending = Some(ConsumerEvent::try_from(event)?);
        }
        // The supernode stores a job's end without its pid; the job has it.
        if let Some(
            ConsumerEvent::JobAborted { job, pid, .. } | ConsumerEvent::JobFailed { job, pid, .. },
        ) = &mut self.pending
            && pid.is_none()
            && let Ok(info) = self.inner.sse.client.job(*job).await
        {
            *pid = info.error_pid;
        }
        Ok(self.pending.take())
    }

    /// As a [`Stream`]; it ends after the terminal event or an error.
    pub fn into_stream(self) -> impl Stream<Item = Result<ConsumerEvent, ClientError>> + Send {
        futures_util::stream::unfold(Some(self), |state| async move {
            let mut events = state?;
            match events.next().await {
                Ok(Some(e)) => Some((Ok(e), Some(events))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        })
    }
}

/// What the job-list stream gives.
enum ListItem {
    Changed(JobListChanged),
    Reconnected,
}

/// The user's job-list changes (`GET /api/v1/events`); see
/// [`Client::job_list_events`]. It does not end; it retries like
/// [`EventStream`].
pub struct JobListEvents {
    sse: Resumable,
}

impl JobListEvents {
    pub(crate) fn new(client: Client, patience: Option<Duration>) -> JobListEvents {
        JobListEvents {
            sse: Resumable::new(client, "/events".to_string(), None, patience),
        }
    }

    /// The next change of the user's job lists. Cancel-safe.
    ///
    /// The stream has no replay: changes made while a dropped connection
    /// was down are lost. A [`Subscription`] re-reads the job lists after
    /// each reconnect, so it misses no job.
    pub async fn next(&mut self) -> Result<JobListChanged, ClientError> {
        loop {
            if let ListItem::Changed(c) = self.next_item().await? {
                return Ok(c);
            }
        }
    }

    async fn next_item(&mut self) -> Result<ListItem, ClientError> {
        loop {
            match self.sse.next().await? {
                Sse::Event(ev) => {
                    if !ev.event.is_empty() && ev.event != "job_list_changed" {
                        continue;
                    }
                    let change = serde_json::from_str(&ev.data).map_err(|e| {
                        ClientError::Protocol(format!("bad job-list event from the supernode: {e}"))
                    })?;
                    return Ok(ListItem::Changed(change));
                }
                Sse::Reconnected => return Ok(ListItem::Reconnected),
                // The supernode is stopping: reconnect later.
                Sse::Ended => self.sse.pause(),
            }
        }
    }
}

/// What a [`Subscription`]'s tasks tell it.
enum Msg {
    /// An event of a followed job, or an error of its stream.
    Job(Result<ConsumerEvent, ClientError>),
    /// A followed job's stream ended.
    JobEnded { job: JobId, end: End },
    /// A change of the job lists, or an error of their stream.
    List(Result<JobListChanged, ClientError>),
    /// The user's jobs, read again after the job-list stream reconnected;
    /// `asked` is when the request went out.
    Listed { jobs: Vec<JobInfo>, asked: Instant },
}

/// How a job's stream in a [`Subscription`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// After the terminal event.
    Done,
    /// The job is gone (404): disposed of.
    Gone,
    /// An error that retrying does not cure (such as 401); the stream
    /// resumes after `after` once a re-listing shows the job.
    Broken { after: Option<i64> },
}

/// Where a [`Subscription`] is with one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Followed {
    Live,
    Ended(End),
}

/// Every event of every job of the user, and the changes of the user's job
/// lists: the dissertation's `ConsumerEventListener` as one stream; see
/// [`Client::subscribe`].
///
/// It follows, from its first event, each job that had not finished when
/// [`Client::subscribe`] was called (unless it was disposed of meanwhile),
/// and each job created later, by this client or any other of the user's.
/// Jobs that had finished before are not followed unless asked for with
/// [`Subscription::follow`]. Events of one job come in order, each once;
/// events of different jobs, and [`ConsumerEvent::JobListChanged`],
/// interleave as they arrive. It does not end.
///
/// Each stream underneath (the job-list stream and one per followed job) is
/// read by a task of its own, so none can hold up another; they read at
/// most a few dozen items ahead of the caller. Dropping the subscription
/// stops them.
///
/// Failures: transient ones ([`ClientError::is_transient`]) are retried
/// with backoff for as long as the subscription lives, and never returned.
/// A job whose events are gone (404) was disposed of: its stream ends
/// quietly (the job list says so). Any other error of a job's stream (such
/// as 401) is returned, that stream stops, and it resumes where it stopped
/// when the user's jobs are next listed (at once, at most once a second);
/// an error of the job-list stream or of the listing is returned and they
/// are retried. An event that cannot be read is returned as an error and
/// skipped.
pub struct Subscription {
    client: Client,
    runtime: tokio::runtime::Handle,
    tx: mpsc::Sender<Msg>,
    rx: mpsc::Receiver<Msg>,
    relist: mpsc::UnboundedSender<()>,
    tasks: JoinSet<()>,
    followed: HashMap<JobId, Followed>,
    /// Jobs that had finished when the subscription started: not followed
    /// unless asked for with [`Subscription::follow`].
    finished_before: HashSet<JobId>,
    /// When the streams that broke were told to have broken.
    broken_at: HashMap<JobId, Instant>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("client", &self.client)
            .field("followed", &self.followed)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("job", &self.job)
            .field("last_id", &self.last_id)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for JobEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobEvents")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for JobListEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobListEvents")
            .field("client", &self.sse.client)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    pub(crate) async fn new(client: Client) -> Result<Subscription, ClientError> {
        // The moment of subscribing: jobs over by now are not followed.
        let finished_before = client
            .jobs(Some(JobState::Finished))
            .await?
            .into_iter()
            .map(|j| j.id)
            .collect();
        let mut list = JobListEvents::new(client.clone(), None);
        // Listen before listing: a job created in between is in one or the
        // other; one that finished in between is in the list, and followed.
        list.sse.connect().await?;
        list.sse.connected_once = true;
        let jobs = client.jobs(None).await?;
        let (tx, rx) = mpsc::channel(READ_AHEAD);
        let (relist, relist_rx) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Handle::current();
        let mut tasks = JoinSet::new();
        tasks.spawn_on(
            follow_list(client.clone(), list, tx.clone(), relist_rx),
            &runtime,
        );
        let mut sub = Subscription {
            client,
            runtime,
            tx,
            rx,
            relist,
            tasks,
            followed: HashMap::new(),
            finished_before,
            broken_at: HashMap::new(),
        };
        for job in jobs {
            sub.discovered(job.id);
        }
        Ok(sub)
    }

    /// Follow `job` too (from its first event), e.g. one that had finished
    /// before the subscription started. Following a job twice does nothing;
    /// following one whose stream stopped on an error resumes it.
    pub fn follow(&mut self, job: JobId) {
        let after = match self.followed.get(&job) {
            None => None,
            Some(Followed::Ended(End::Broken { after })) => *after,
            Some(_) => return,
        };
        self.followed.insert(job, Followed::Live);
        let stream = EventStream::new(self.client.clone(), job, after, None);
        self.tasks.spawn_on(
            follow_job(JobEvents::new(stream), self.tx.clone()),
            &self.runtime,
        );
    }

    /// The jobs followed so far.
    pub fn followed(&self) -> impl Iterator<Item = JobId> + '_ {
        self.followed.keys().copied()
    }

    fn discovered(&mut self, job: JobId) {
        if self.followed.contains_key(&job) || !self.finished_before.contains(&job) {
            self.follow(job);
        }
    }

    fn listed(&mut self, jobs: Vec<JobInfo>, asked: Instant) {
        for job in jobs {
            // Resumes the broken streams of the jobs listed, too.
            self.discovered(job.id);
        }
        // A stream that broke before the listing was asked for, of a job
        // the listing lacks: the job was disposed of. (One that broke
        // later may be of a job newer than the listing: kept for the next.)
        for (job, state) in self.followed.iter_mut() {
            if matches!(state, Followed::Ended(End::Broken { .. }))
                && self.broken_at.get(job).is_some_and(|at| *at < asked)
            {
                *state = Followed::Ended(End::Gone);
            }
        }
        self.broken_at.retain(|job, _| {
            matches!(
                self.followed.get(job),
                Some(Followed::Ended(End::Broken { .. }))
            )
        });
    }

    /// The next event. Cancel-safe. See [`Subscription`] for the errors.
    pub async fn next(&mut self) -> Result<ConsumerEvent, ClientError> {
        loop {
            // Forget the tasks that are done.
            while self.tasks.try_join_next().is_some() {}
            let Some(msg) = self.rx.recv().await else {
                // Not while `self.tx` lives.
                return Err(ClientError::Protocol("the subscription stopped".into()));
            };
            match msg {
                Msg::Job(item) => return item,
                Msg::JobEnded { job, end } => {
                    if matches!(end, End::Broken { .. }) {
                        // Resume it once a listing shows it is still there.
                        self.broken_at.insert(job, Instant::now());
                        let _ = self.relist.send(());
                    }
                    self.followed.insert(job, Followed::Ended(end));
                }
                Msg::List(Ok(c)) => {
                    if c.state.is_some() {
                        self.discovered(c.job);
                    }
                    return Ok(ConsumerEvent::JobListChanged {
                        job: c.job,
                        state: c.state,
                    });
                }
                Msg::List(Err(e)) => return Err(e),
                Msg::Listed { jobs, asked } => self.listed(jobs, asked),
            }
        }
    }

    /// As a [`Stream`] that does not end (errors are items).
    pub fn into_stream(self) -> impl Stream<Item = Result<ConsumerEvent, ClientError>> + Send {
        futures_util::stream::unfold(self, |mut sub| async move {
            let item = sub.next().await;
            Some((item, sub))
        })
    }
}

/// A [`Subscription`]'s task for one job: its events, then how it ended.
async fn follow_job(mut events: JobEvents, tx: mpsc::Sender<Msg>) {
    let job = events.job();
    loop {
        let (msg, end) = match events.next().await {
            Ok(Some(e)) => (Some(Msg::Job(Ok(e))), None),
            Ok(None) => (None, Some(End::Done)),
            Err(e) if e.status() == Some(404) => (None, Some(End::Gone)),
            // An event that cannot be read: skipped, the stream goes on.
            Err(e @ ClientError::Protocol(_)) => (Some(Msg::Job(Err(e))), None),
            Err(e) => (
                Some(Msg::Job(Err(e))),
                Some(End::Broken {
                    after: events.last_id(),
                }),
            ),
        };
        if let Some(msg) = msg
            && tx.send(msg).await.is_err()
        {
            return;
        }
        if let Some(end) = end {
            let _ = tx.send(Msg::JobEnded { job, end }).await;
            return;
        }
    }
}

/// A [`Subscription`]'s task for the job lists: their changes, and the
/// user's jobs read again after the stream reconnected or when asked.
async fn follow_list(
    client: Client,
    mut list: JobListEvents,
    tx: mpsc::Sender<Msg>,
    mut relist: mpsc::UnboundedReceiver<()>,
) {
    let mut want_listing = false;
    let mut listed_at: Option<Instant> = None;
    let mut retry = Retry::new(None);
    loop {
        let msg = if want_listing {
            if let Some(at) = listed_at {
                tokio::time::sleep_until(at + MIN_RELIST_INTERVAL).await;
            }
            retry.wait().await;
            while relist.try_recv().is_ok() {}
            let asked = Instant::now();
            match client.jobs(None).await {
                Ok(jobs) => {
                    want_listing = false;
                    listed_at = Some(Instant::now());
                    retry.succeeded();
                    Msg::Listed { jobs, asked }
                }
                Err(e) => {
                    retry.failed();
                    if e.is_transient() {
                        continue;
                    }
                    Msg::List(Err(e))
                }
            }
        } else {
            let item = tokio::select! {
                item = list.next_item() => item,
                Some(()) = relist.recv() => {
                    want_listing = true;
                    continue;
                }
            };
            match item {
                Ok(ListItem::Changed(c)) => Msg::List(Ok(c)),
                Ok(ListItem::Reconnected) => {
                    want_listing = true;
                    continue;
                }
                Err(e) => Msg::List(Err(e)),
            }
        };
        if tx.send(msg).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::rest::{ApiError, JobLimits};

    fn stored(id: i64, job: JobId, pid: Option<Pid>, kind: JobEventKind) -> JobEvent {
        JobEvent {
            id,
            job,
            pid,
            at: 0,
            kind,
        }
    }

    fn stdout(id: i64, text: &str) -> JobEvent {
        let text = text.to_string();
        stored(id, 7, Some(0), JobEventKind::Stdout { text })
    }

    fn every_kind() -> Vec<JobEventKind> {
        let all = vec![
            JobEventKind::Stdout { text: "o".into() },
            JobEventKind::Stderr { text: "e".into() },
            JobEventKind::Raw {
                data: "AAE=".into(),
            },
            JobEventKind::Status { text: "s".into() },
            JobEventKind::ProcessExited { superstep: 1 },
            JobEventKind::ProcessRolledBack {
                superstep: 1,
                from_start: false,
            },
            JobEventKind::ProcessMigrated {
                from: 1,
                to: 2,
                superstep: 1,
            },
            JobEventKind::CopiesDisagree {
                superstep: 2,
                peers: vec![1, 2],
                what: "its state".into(),
            },
            JobEventKind::PeerQuarantined {
                peer: 2,
                superstep: 2,
                reason: "outvoted".into(),
            },
            JobEventKind::JobExited,
            JobEventKind::JobAborted { reason: "a".into() },
            JobEventKind::JobFailed { reason: "f".into() },
            JobEventKind::JobKilled,
        ];
        for kind in &all {
            // A new kind does not compile here: add it above too.
            match kind {
                JobEventKind::Stdout { .. }
                | JobEventKind::Stderr { .. }
                | JobEventKind::Raw { .. }
                | JobEventKind::Status { .. }
                | JobEventKind::ProcessExited { .. }
                | JobEventKind::ProcessRolledBack { .. }
                | JobEventKind::ProcessMigrated { .. }
                | JobEventKind::CopiesDisagree { .. }
                | JobEventKind::PeerQuarantined { .. }
                | JobEventKind::JobExited
                | JobEventKind::JobAborted { .. }
                | JobEventKind::JobFailed { .. }
                | JobEventKind::JobKilled => {}
            }
        }
        all
    }

    #[test]
    fn every_kind_this_client_has_is_known_and_converts() {
        let kinds = every_kind();
        let names: Vec<&str> = kinds.iter().map(JobEventKind::name).collect();
        assert_eq!(names, KNOWN_KINDS);
        for (i, kind) in (1..).zip(kinds) {
            let event = stored(i, 7, Some(1), kind);
            let json = serde_json::to_string(&event).unwrap();
            match parse_event(&json) {
                Ok(Parsed::Known(e)) => assert_eq!(e, event),
                _ => panic!("{json} did not parse"),
            }
            let typed = ConsumerEvent::try_from(event.clone()).unwrap();
            assert_eq!(typed.job(), 7);
            assert_eq!(typed.is_terminal(), event.kind.is_terminal(), "{typed:?}");
        }
    }

    #[test]
    fn a_process_event_without_a_pid_or_with_bad_base64_is_a_protocol_error() {
        for kind in [
            JobEventKind::Stdout { text: "o".into() },
            JobEventKind::Stderr { text: "e".into() },
            JobEventKind::Raw {
                data: "AAE=".into(),
            },
            JobEventKind::ProcessExited { superstep: 1 },
            JobEventKind::ProcessRolledBack {
                superstep: 1,
                from_start: false,
            },
            JobEventKind::ProcessMigrated {
                from: 1,
                to: 2,
                superstep: 1,
            },
        ] {
            let name = kind.name();
            match ConsumerEvent::try_from(stored(1, 7, None, kind)) {
                Err(ClientError::Protocol(m)) => {
                    assert!(m.contains(name) && m.contains("names no process"), "{m}")
                }
                other => panic!("{name} without a pid: {other:?}"),
            }
        }
        for data in ["not base64!", "AAE", "€"] {
            let raw = JobEventKind::Raw { data: data.into() };
            match ConsumerEvent::try_from(stored(1, 7, Some(0), raw)) {
                Err(ClientError::Protocol(m)) => assert!(m.contains("not base64"), "{m}"),
                other => panic!("raw {data:?}: {other:?}"),
            }
        }
        // A status line, a job's end: about the job, no pid needed.
        let status = JobEventKind::Status { text: "s".into() };
        assert_eq!(
            ConsumerEvent::try_from(stored(1, 7, None, status)).unwrap(),
            ConsumerEvent::StatusLine {
                job: 7,
                pid: None,
                line: "s".into()
            }
        );
        let failed = JobEventKind::JobFailed { reason: "r".into() };
        assert!(ConsumerEvent::try_from(stored(1, 7, None, failed)).is_ok());
    }

    #[test]
    fn an_event_of_an_unknown_kind_is_skipped_and_a_malformed_one_is_an_error() {
        let future = r#"{"id":9,"job":7,"pid":0,"at":0,"kind":"quantum_leap","to":3}"#;
        assert!(matches!(parse_event(future), Ok(Parsed::Unknown { id: 9 })));
        for bad in [
            r#"{"id":9,"job":7,"pid":0,"at":0,"kind":"stdout"}"#,
            r#"{"id":9,"job":7,"kind":"stdout","text":"x"}"#,
            r#"{"job":7,"kind":"quantum_leap"}"#,
            "[1, 2]",
            "",
        ] {
            assert!(
                matches!(parse_event(bad), Err(ClientError::Protocol(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_backoff_doubles_from_100_ms_up_to_5_s_with_jitter() {
        for failures in 0..100 {
            let d = backoff(failures);
            let full = FIRST_BACKOFF
                .saturating_mul(1 << failures.saturating_sub(1).min(16))
                .min(MAX_BACKOFF);
            assert!(d >= full / 2 && d <= full, "{failures}: {d:?} of {full:?}");
        }
        assert_eq!(backoff(40).max(MAX_BACKOFF), MAX_BACKOFF);
    }

    #[tokio::test]
    async fn retries_stop_after_the_patience_and_not_before() {
        let patience = Duration::from_millis(500);
        let mut retry = Retry::new(Some(patience));
        let started = Instant::now();
        while retry.failed() {
            retry.wait().await;
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "no end in sight"
            );
        }
        assert!(started.elapsed() >= patience, "{:?}", started.elapsed());
        // Then it starts over, with patience again.
        assert!(retry.failed());
        let mut forever = Retry::new(None);
        assert!((0..1000).all(|_| forever.failed()));
        assert_eq!(forever.failures, 1000);
    }

    /// What a fake supernode was asked.
    #[derive(Debug, Clone)]
    struct Request {
        /// Method and path, such as `GET /api/v1/jobs/7/events`.
        line: String,
        last_event_id: Option<String>,
    }

    enum Reply {
        Json(u16, String),
        /// Server-sent events (data lines), then a clean end, a cut, or
        /// silence.
        Sse(Vec<String>, SseEnd),
        /// No answer at all.
        Silent,
    }

    enum SseEnd {
        Clean,
        Cut,
        Hang,
    }

    fn sse(events: &[JobEvent], end: SseEnd) -> Reply {
        let blocks = events
            .iter()
            .map(|e| {
                format!(
                    "id: {}\nevent: {}\ndata: {}\n\n",
                    e.id,
                    e.kind.name(),
                    serde_json::to_string(e).unwrap()
                )
            })
            .collect();
        Reply::Sse(blocks, end)
    }

    fn status(code: u16, api_code: &str) -> Reply {
        let body = serde_json::to_string(&ApiError {
            code: api_code.into(),
            message: format!("answered {code}"),
        })
        .unwrap();
        Reply::Json(code, body)
    }

    fn job_info(id: JobId, state: JobState) -> JobInfo {
        JobInfo {
            id,
            owner: "u".into(),
            program: "p".into(),
            program_hash: "h".into(),
            nprocs: 1,
            args: serde_json::Value::Null,
            description: None,
            state,
            outcome: None,
            error: None,
            error_pid: None,
            seed: 0,
            limits: JobLimits::default(),
            submitted_at: 0,
            started_at: None,
            finished_at: None,
            placement: vec![],
            copies: Vec::new(),
            exited: 0,
            supersteps: vec![],
        }
    }

    fn json<T: serde::Serialize>(value: &T) -> Reply {
        Reply::Json(200, serde_json::to_string(value).unwrap())
    }

    type Log = Arc<Mutex<Vec<Request>>>;

    /// A fake supernode on loopback: one request per connection, answered
    /// by `reply`. Its URL and the requests so far.
    async fn serve(
        reply: impl Fn(&Request, &[Request]) -> Reply + Send + 'static,
    ) -> (String, Log) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log: Log = Arc::default();
        let seen = log.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut head = vec![];
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(n @ 1..) => head.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let mut lines = head.lines();
                let first = lines.next().unwrap_or_default();
                let line = first.rsplit_once(' ').map_or(first, |(l, _)| l).to_string();
                let last_event_id = lines
                    .filter_map(|l| l.split_once(':'))
                    .find(|(k, _)| k.eq_ignore_ascii_case("last-event-id"))
                    .map(|(_, v)| v.trim().to_string());
                let request = Request {
                    line,
                    last_event_id,
                };
                let answer = {
                    let mut log = seen.lock().unwrap();
                    let answer = reply(&request, &log);
                    log.push(request);
                    answer
                };
                tokio::spawn(async move {
                    let (status, kind, body, end) = match answer {
                        Reply::Json(status, body) => (status, "application/json", body, None),
                        Reply::Sse(blocks, end) => {
                            (200, "text/event-stream", blocks.concat(), Some(end))
                        }
                        Reply::Silent => {
                            std::future::pending::<()>().await;
                            return;
                        }
                    };
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\nconnection: close\r\n"
                    );
                    let _ = match end {
                        None => {
                            let msg = format!("{head}content-length: {}\r\n\r\n{body}", body.len());
                            conn.write_all(msg.as_bytes()).await
                        }
                        Some(end) => {
                            let mut msg = format!("{head}transfer-encoding: chunked\r\n\r\n");
                            if !body.is_empty() {
                                msg += &format!("{:x}\r\n{body}\r\n", body.len());
                            }
                            if matches!(end, SseEnd::Clean) {
                                msg += "0\r\n\r\n";
                            }
                            let sent = conn.write_all(msg.as_bytes()).await;
                            if matches!(end, SseEnd::Hang) {
                                std::future::pending::<()>().await;
                            }
                            sent
                        }
                    };
                });
            }
        });
        (url, log)
    }

    fn count(log: &Log, prefix: &str) -> usize {
        log.lock()
            .unwrap()
            .iter()
            .filter(|r| r.line.starts_with(prefix))
            .count()
    }

    /// Every event of a job's typed stream, with a deadline.
    async fn drain(mut events: JobEvents) -> Vec<ConsumerEvent> {
        let mut all = vec![];
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(e) = events.next().await.expect("the stream goes on") {
                all.push(e);
            }
        })
        .await
        .expect("the stream ends");
        all
    }

    fn exited(id: i64) -> JobEvent {
        stored(id, 7, None, JobEventKind::JobExited)
    }

    fn typed(events: &[JobEvent]) -> Vec<ConsumerEvent> {
        events
            .iter()
            .map(|e| ConsumerEvent::try_from(e.clone()).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn a_stream_cut_short_cleanly_reads_the_rest_of_a_finished_job() {
        let (url, log) = serve(|r, _| match (r.line.as_str(), r.last_event_id.as_deref()) {
            ("GET /api/v1/jobs/7/events", None) => {
                sse(&[stdout(1, "a"), stdout(2, "b")], SseEnd::Clean)
            }
            ("GET /api/v1/jobs/7/events", Some("2")) => sse(&[exited(3)], SseEnd::Clean),
            ("GET /api/v1/jobs/7/events", Some("3")) => sse(&[], SseEnd::Clean),
            ("GET /api/v1/jobs/7", _) => json(&job_info(7, JobState::Finished)),
            _ => status(404, "not_found"),
        })
        .await;
        let client = Client::with_token(&url, "t");
        let got = drain(client.job_events(7)).await;
        assert_eq!(got, typed(&[stdout(1, "a"), stdout(2, "b"), exited(3)]));

        // Started after the end: one pass finds nothing more, and it stops.
        let before = count(&log, "GET /api/v1/jobs/7/events");
        let got = drain(client.job_events_after(7, Some(3))).await;
        assert!(got.is_empty(), "{got:?}");
        assert!(count(&log, "GET /api/v1/jobs/7/events") - before <= 3);
    }

    #[tokio::test]
    async fn a_job_stream_outlasts_unavailable_answers_and_a_silent_connection() {
        // Event 1, then a cut; 503 and 502 for a while; then silence after
        // event 2 (no keep-alive); then the rest.
        let (url, log) = serve(|r, log| {
            let tries = log.iter().filter(|q| q.line == r.line).count();
            match (r.line.as_str(), r.last_event_id.as_deref()) {
                ("GET /api/v1/jobs/7/events", None) => sse(&[stdout(1, "a")], SseEnd::Cut),
                ("GET /api/v1/jobs/7/events", Some("1")) if tries < 4 => status(503, "unavailable"),
                ("GET /api/v1/jobs/7/events", Some("1")) if tries < 7 => {
                    Reply::Json(502, "<html>bad gateway</html>".into())
                }
                ("GET /api/v1/jobs/7/events", Some("1")) => sse(&[stdout(2, "b")], SseEnd::Hang),
                ("GET /api/v1/jobs/7/events", Some("2")) => sse(&[exited(3)], SseEnd::Clean),
                _ => status(404, "not_found"),
            }
        })
        .await;
        let client =
            Client::with_token(&url, "t").with_stream_idle_timeout(Duration::from_millis(300));
        let got = drain(client.job_events(7)).await;
        assert_eq!(got, typed(&[stdout(1, "a"), stdout(2, "b"), exited(3)]));
        assert_eq!(count(&log, "GET /api/v1/jobs/7/events"), 9);
    }

    #[tokio::test]
    async fn an_ordinary_call_without_an_answer_times_out_but_a_quiet_stream_does_not() {
        let (url, _) = serve(|r, _| match r.line.as_str() {
            "GET /api/v1/jobs/7/events" => sse(&[stdout(1, "a")], SseEnd::Hang),
            _ => Reply::Silent,
        })
        .await;
        let client = Client::with_token(&url, "t").with_request_timeout(Duration::from_millis(300));
        assert_eq!(client.request_timeout(), Duration::from_millis(300));
        let started = std::time::Instant::now();
        let e = client.health().await.unwrap_err();
        match &e {
            ClientError::NotConnected { source, .. } => assert!(source.is_timeout(), "{e:?}"),
            e => panic!("{e:?}"),
        }
        assert!(e.is_transient());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        // A stream that outlives the request timeout goes on.
        let mut events = client.job_events(7);
        assert!(events.next().await.unwrap().is_some());
        let quiet = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
        assert!(quiet.is_err(), "the stream ended: {quiet:?}");
    }

    #[tokio::test]
    async fn a_job_that_is_not_there_or_a_bad_token_is_an_error_at_once() {
        let (url, _) = serve(|r, _| match r.line.as_str() {
            "GET /api/v1/jobs/7/events" => status(401, "token_expired"),
            _ => status(404, "not_found"),
        })
        .await;
        let client = Client::with_token(&url, "t");
        let started = std::time::Instant::now();
        let e = client.job_events(7).next().await.unwrap_err();
        assert!(matches!(e, ClientError::Unauthorized { .. }), "{e:?}");
        let e = client.job_events(8).next().await.unwrap_err();
        assert_eq!(e.status(), Some(404), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn an_unknown_kind_is_skipped_and_an_unreadable_event_is_an_error_then_skipped() {
        let future = "id: 2\nevent: quantum_leap\ndata: {\"id\":2,\"job\":7,\"pid\":0,\"at\":0,\"kind\":\"quantum_leap\"}\n\n";
        let bad = stored(3, 7, Some(0), JobEventKind::Raw { data: "!!".into() });
        let (url, _) = serve(move |r, _| match r.line.as_str() {
            "GET /api/v1/jobs/7/events" => {
                let Reply::Sse(mut blocks, end) =
                    sse(&[stdout(1, "a"), bad.clone(), exited(4)], SseEnd::Clean)
                else {
                    unreachable!()
                };
                blocks.insert(1, future.to_string());
                Reply::Sse(blocks, end)
            }
            _ => status(404, "not_found"),
        })
        .await;
        let client = Client::with_token(&url, "t");
        let mut events = client.job_events(7);
        assert_eq!(
            events.next().await.unwrap(),
            Some(typed(&[stdout(1, "a")])[0].clone())
        );
        let e = events.next().await.unwrap_err();
        assert!(
            matches!(&e, ClientError::Protocol(m) if m.contains("base64")),
            "{e:?}"
        );
        assert_eq!(
            events.next().await.unwrap(),
            Some(ConsumerEvent::JobExited { job: 7 })
        );
        assert_eq!(events.last_id(), Some(4));
        assert_eq!(events.next().await.unwrap(), None);
    }

    /// The subscription's pieces on a fake supernode: jobs `finished` at the
    /// start of the subscription, jobs listed on the next listings, and
    /// each job's stream.
    #[tokio::test]
    async fn a_subscription_follows_jobs_that_finish_while_it_starts_and_resumes_broken_ones() {
        // Job 4 was over before; job 5 finished between the two listings;
        // job 6's stream says 401 once; job 8 is gone (404).
        let (url, log) = serve(|r, log| {
            let tries = log.iter().filter(|q| q.line == r.line).count();
            let ev = |job: JobId, id: i64, kind: JobEventKind| stored(id, job, Some(0), kind);
            let out = |job, id| {
                ev(
                    job,
                    id,
                    JobEventKind::Stdout {
                        text: format!("{job}"),
                    },
                )
            };
            let end = |job, id| ev(job, id, JobEventKind::JobExited);
            match r.line.as_str() {
                "GET /api/v1/jobs?state=finished" => json(&[job_info(4, JobState::Finished)]),
                "GET /api/v1/jobs" => json(&[
                    job_info(4, JobState::Finished),
                    job_info(5, JobState::Finished),
                    job_info(6, JobState::Active),
                    job_info(8, JobState::Active),
                ]),
                "GET /api/v1/events" => Reply::Sse(vec![], SseEnd::Hang),
                "GET /api/v1/jobs/5/events" => sse(&[out(5, 1), end(5, 2)], SseEnd::Clean),
                "GET /api/v1/jobs/6/events" if tries == 0 => sse(&[out(6, 3)], SseEnd::Cut),
                "GET /api/v1/jobs/6/events" if tries == 1 => status(401, "unauthorized"),
                "GET /api/v1/jobs/6/events" => match r.last_event_id.as_deref() {
                    Some("3") => sse(&[end(6, 4)], SseEnd::Clean),
                    _ => status(400, "bad_request"),
                },
                _ => status(404, "not_found"),
            }
        })
        .await;
        let client = Client::with_token(&url, "t");
        let mut sub = client.subscribe().await.unwrap();
        let mut got = vec![];
        let mut errors = vec![];
        tokio::time::timeout(Duration::from_secs(30), async {
            while got
                .iter()
                .filter(|e: &&ConsumerEvent| e.is_terminal())
                .count()
                < 2
            {
                match sub.next().await {
                    Ok(e) => got.push(e),
                    Err(e) => errors.push(e),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("not every event came: {got:?}, errors {errors:?}"));
        let of = |job| -> Vec<&ConsumerEvent> { got.iter().filter(|e| e.job() == job).collect() };
        assert_eq!(of(5).len(), 2, "{got:?}");
        assert_eq!(of(6).len(), 2, "{got:?}");
        assert!(of(4).is_empty() && of(8).is_empty(), "{got:?}");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            matches!(errors[0], ClientError::Unauthorized { .. }),
            "{errors:?}"
        );
        assert_eq!(count(&log, "GET /api/v1/jobs/4/events"), 0);
        let mut followed: Vec<JobId> = sub.followed().collect();
        followed.sort();
        assert_eq!(followed, [5, 6, 8]);
    }
}
