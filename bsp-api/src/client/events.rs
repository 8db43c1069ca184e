//! Event streams: one job's events ([`EventStream`], [`JobEvents`]), the
//! user's job-list changes ([`JobListEvents`]), and both merged for every
//! job of the user ([`Subscription`]), the listener of dissertation §2.3.4.
//!
//! Every stream reconnects by itself when its connection drops, sending
//! `Last-Event-ID`, so the supernode resumes after the last event returned:
//! no event is lost and none is returned twice.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::stream::{BoxStream, SelectAll};
use futures_util::{Stream, StreamExt};

use super::{Client, ClientError, api_error};
use crate::rest::{JobEvent, JobEventKind, JobListChanged, JobState};
use crate::{JobId, PeerId, Pid};

/// Reconnections in a row (without an event in between) before a stream
/// gives up and returns the error.
const MAX_FAILURES: u32 = 10;
/// A connection that stayed up this long was healthy, even without events.
const HEALTHY: Duration = Duration::from_secs(30);

/// One event of the dissertation's `ConsumerEventListener` (§2.3.4), typed.
///
/// Process events carry the pid; the job's terminal event is one of
/// [`JobExited`](ConsumerEvent::JobExited),
/// [`JobAborted`](ConsumerEvent::JobAborted),
/// [`JobFailed`](ConsumerEvent::JobFailed) and
/// [`JobKilled`](ConsumerEvent::JobKilled).
#[derive(Debug, Clone, PartialEq, Eq)]
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
    },
    /// The process moved from peer `from` to peer `to` at the end of `superstep`.
    ProcessMigrated {
        job: JobId,
        pid: Pid,
        from: PeerId,
        to: PeerId,
        superstep: u32,
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
            JobEventKind::ProcessRolledBack { superstep } => ConsumerEvent::ProcessRolledBack {
                job,
                pid: pid()?,
                superstep: *superstep,
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

/// What one step of a [`Resumable`] gives.
enum Sse {
    /// An event with data.
    Event(eventsource_stream::Event),
    /// A new connection replaced a dropped one (events sent while none was
    /// up are resent only if the stream has ids).
    Reconnected,
    /// The supernode ended the connection cleanly; the next call reconnects.
    Ended,
}

/// One Server-Sent-Events resource, reconnected with `Last-Event-ID`.
struct Resumable {
    client: Client,
    path: String,
    last_id: Option<String>,
    inner: Option<BoxStream<'static, Result<eventsource_stream::Event, String>>>,
    connected_at: Instant,
    connected_once: bool,
    failures: u32,
    backoff: Option<Duration>,
}

impl Resumable {
    fn new(client: Client, path: String, last_id: Option<String>) -> Resumable {
        Resumable {
            client,
            path,
            last_id,
            inner: None,
            connected_at: Instant::now(),
            connected_once: false,
            failures: 0,
            backoff: None,
        }
    }

    async fn connect(&mut self) -> Result<(), ClientError> {
        use eventsource_stream::Eventsource;
        let url = self.client.url(&self.path);
        let mut req = self
            .client
            .http
            .get(&url)
            .bearer_auth(&self.client.token)
            .header("accept", "text/event-stream");
        if let Some(id) = &self.last_id {
            req = req.header("last-event-id", id.as_str());
        }
        let resp = req
            .send()
            .await
            .map_err(|source| ClientError::transport(&url, source))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.bytes().await.unwrap_or_default();
            return Err(api_error(status.as_u16(), &body));
        }
        let stream = resp
            .bytes_stream()
            .eventsource()
            .map(|r| r.map_err(|e| e.to_string()));
        self.inner = Some(stream.boxed());
        self.connected_at = Instant::now();
        Ok(())
    }

    /// Count a failure; the error to give up with after too many in a row.
    fn failed(&mut self) -> bool {
        if self.connected_at.elapsed() >= HEALTHY {
            self.failures = 0;
        }
        self.failures += 1;
        self.backoff = Some(Duration::from_millis(100 * u64::from(self.failures)));
        self.failures > MAX_FAILURES
    }

    /// The next event. Cancel-safe: dropping the future loses no event.
    async fn next(&mut self) -> Result<Sse, ClientError> {
        loop {
            if self.inner.is_none() {
                if let Some(wait) = self.backoff.take() {
                    tokio::time::sleep(wait).await;
                }
                match self.connect().await {
                    Ok(()) if self.connected_once => return Ok(Sse::Reconnected),
                    Ok(()) => self.connected_once = true,
                    Err(e) if !e.is_not_connected() => return Err(e),
                    Err(e) => {
                        if self.failed() {
                            return Err(e);
                        }
                        continue;
                    }
                }
            }
            let Some(inner) = self.inner.as_mut() else {
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
                    self.failures = 0;
                    return Ok(Sse::Event(ev));
                }
                end => {
                    self.inner = None;
                    if self.failed() {
                        return Err(ClientError::Protocol(format!(
                            "the event stream {} kept breaking; gave up after {MAX_FAILURES} reconnects",
                            self.path
                        )));
                    }
                    if end.is_none() {
                        return Ok(Sse::Ended);
                    }
                }
            }
        }
    }
}

/// A resumable stream of one job's events as the supernode stores them;
/// see [`Client::events`]. [`JobEvents`] is the typed form.
pub struct EventStream {
    sse: Resumable,
    job: JobId,
    last_id: Option<i64>,
    done: bool,
}

impl EventStream {
    pub(crate) fn new(client: Client, job: JobId, after: Option<i64>) -> EventStream {
        EventStream {
            sse: Resumable::new(
                client,
                format!("/jobs/{job}/events"),
                after.map(|a| a.to_string()),
            ),
            job,
            last_id: after,
            done: false,
        }
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
    /// (or the stream was started after it).
    pub async fn next(&mut self) -> Result<Option<JobEvent>, ClientError> {
        loop {
            if self.done {
                return Ok(None);
            }
            match self.sse.next().await? {
                Sse::Event(ev) => {
                    let event: JobEvent = serde_json::from_str(&ev.data).map_err(|e| {
                        ClientError::Protocol(format!("bad event from the supernode: {e}"))
                    })?;
                    self.last_id = Some(event.id);
                    if event.kind.is_terminal() {
                        self.done = true;
                    }
                    return Ok(Some(event));
                }
                Sse::Reconnected => {}
                Sse::Ended => {
                    // The supernode ends a job's stream after its terminal
                    // event, when it stops, and when the job is disposed.
                    // Ended without our seeing the terminal event: it came
                    // before `last_id`, if the job is over.
                    match self.sse.client.job(self.job).await {
                        Ok(info) if info.state == JobState::Finished => {
                            self.done = true;
                        }
                        Ok(_) => {}
                        Err(e) if e.is_not_connected() => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }
}

/// One job's events, typed; see [`Client::job_events`]. Ends after the
/// job's terminal event.
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

    /// The next event, or `None` after the job's terminal event.
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
/// [`Client::job_list_events`]. It does not end.
pub struct JobListEvents {
    sse: Resumable,
}

impl JobListEvents {
    pub(crate) fn new(client: Client) -> JobListEvents {
        JobListEvents {
            sse: Resumable::new(client, "/events".to_string(), None),
        }
    }

    /// The next change of the user's job lists.
    ///
    /// After a dropped connection, changes made while it was down come
    /// again only if the supernode numbers them (`id:`); a [`Subscription`]
    /// re-reads the job lists then, so it misses no job either way.
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
                Sse::Ended => {}
            }
        }
    }
}

/// Every event of every job of the user, and the changes of the user's job
/// lists: the dissertation's `ConsumerEventListener` as one stream; see
/// [`Client::subscribe`].
///
/// It follows each job that was waiting or active when it was created, and
/// each job created later (by this client or any other of the user's), from
/// the job's first event. Events of one job come in order; events of
/// different jobs, and [`ConsumerEvent::JobListChanged`], interleave as
/// they arrive. It does not end.
pub struct Subscription {
    client: Client,
    list: JobListEvents,
    jobs: SelectAll<BoxStream<'static, Result<ConsumerEvent, ClientError>>>,
    followed: HashSet<JobId>,
    /// Jobs that had finished when the subscription started: not followed
    /// unless asked for with [`Subscription::follow`].
    finished_before: HashSet<JobId>,
    relist: bool,
}

impl Subscription {
    pub(crate) async fn new(client: Client) -> Result<Subscription, ClientError> {
        let mut list = JobListEvents::new(client.clone());
        // Listen before listing: a job created in between is in one or the other.
        list.sse.connect().await?;
        list.sse.connected_once = true;
        let mut sub = Subscription {
            client,
            list,
            jobs: SelectAll::new(),
            followed: HashSet::new(),
            finished_before: HashSet::new(),
            relist: false,
        };
        for job in sub.client.jobs(None).await? {
            if job.state == JobState::Finished {
                sub.finished_before.insert(job.id);
            } else {
                sub.follow(job.id);
            }
        }
        Ok(sub)
    }

    /// Follow `job` too (from its first event), e.g. one that had finished
    /// before the subscription started. Following a job twice does nothing.
    pub fn follow(&mut self, job: JobId) {
        if !self.followed.insert(job) {
            return;
        }
        let events = JobEvents::new(EventStream::new(self.client.clone(), job, None));
        let stream = futures_util::stream::unfold(Some(events), |state| async move {
            let mut events = state?;
            match events.next().await {
                Ok(Some(e)) => Some((Ok(e), Some(events))),
                Ok(None) => None,
                // Disposed before or while followed: the job list says so.
                Err(e) if e.status() == Some(404) => None,
                Err(e) => Some((Err(e), None)),
            }
        });
        self.jobs.push(stream.boxed());
    }

    /// The jobs followed so far.
    pub fn followed(&self) -> impl Iterator<Item = JobId> + '_ {
        self.followed.iter().copied()
    }

    fn discovered(&mut self, job: JobId) {
        if !self.finished_before.contains(&job) {
            self.follow(job);
        }
    }

    /// The next event. An error of one job's stream ends that job's stream
    /// only; an error of the job-list stream is returned and the next call
    /// reconnects it. Cancel-safe.
    pub async fn next(&mut self) -> Result<ConsumerEvent, ClientError> {
        loop {
            if self.relist {
                // The job-list stream was down: catch up on jobs created meanwhile.
                for job in self.client.jobs(None).await? {
                    self.discovered(job.id);
                }
                self.relist = false;
            }
            tokio::select! {
                biased;
                Some(item) = self.jobs.next(), if !self.jobs.is_empty() => return item,
                item = self.list.next_item() => match item? {
                    ListItem::Changed(c) => {
                        if c.state.is_some() {
                            self.discovered(c.job);
                        }
                        return Ok(ConsumerEvent::JobListChanged {
                            job: c.job,
                            state: c.state,
                        });
                    }
                    ListItem::Reconnected => self.relist = true,
                },
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
