//! An async client for the REST API (feature `client`): the consumer API of
//! dissertation §2.3.4 (Listing 2.2) in Rust.
//!
//! - connect: [`Client::login`];
//! - start a job: [`Client::start_job`] with a [`JobSpec`] (a program by
//!   name, hash or bytes, the number of processes, any `Serialize` value as
//!   arguments), or [`Client::submit`] with a [`SubmitJob`];
//! - receive its output and status: [`Client::job_events`] for one job, or
//!   [`Client::subscribe`] for every job of the user and the changes of the
//!   job lists, as [`ConsumerEvent`]s;
//! - keep track of jobs: [`Client::waiting_jobs`], [`Client::active_jobs`],
//!   [`Client::finished_jobs`], [`Client::kill`], [`Client::dispose`];
//! - errors are typed by cause: [`ClientError::NotConnected`],
//!   [`ClientError::Unauthorized`], [`ClientError::ProgramNotFound`],
//!   [`ClientError::InvalidProgram`], [`ClientError::NotEnoughPeers`].
//!
//! ```no_run
//! use bsp_api::client::{Client, ClientError, ConsumerEvent, JobSpec};
//!
//! #[tokio::main]
//! async fn main() {
//!     if let Err(e) = run().await {
//!         match e {
//!             ClientError::NotConnected { .. } => eprintln!("no supernode connection: {e}"),
//!             ClientError::Unauthorized { .. } => eprintln!("authentication failed: {e}"),
//!             ClientError::ProgramNotFound { .. } => eprintln!("BSP program not found: {e}"),
//!             ClientError::NotEnoughPeers { .. } => eprintln!("not enough peers: {e}"),
//!             e => eprintln!("operation failed: {e}"),
//!         }
//!     }
//! }
//!
//! async fn run() -> Result<(), ClientError> {
//!     let client = Client::login("http://127.0.0.1:7878", "alice", "secret").await?;
//!     let spec = JobSpec::new("ring", 16).description("Example").min_peers(2);
//!     let job = client.start_job(spec).await?;
//!     let mut events = client.job_events(job.id);
//!     while let Some(event) = events.next().await? {
//!         match event {
//!             ConsumerEvent::Stdout { job, pid, line } => println!("{job}[{pid}]: {line}"),
//!             ConsumerEvent::Stderr { job, pid, line } => eprintln!("{job}[{pid}]: {line}"),
//!             ConsumerEvent::RawData { job, pid, data } => {
//!                 println!("{job}[{pid}]: data: {} bytes", data.len())
//!             }
//!             ConsumerEvent::JobFailed { job, pid, cause }
//!             | ConsumerEvent::JobAborted { job, pid, cause } => {
//!                 eprintln!("{job} ended at pid {pid:?}: {cause}")
//!             }
//!             other => eprintln!("{other:?}"),
//!         }
//!     }
//!     Ok(())
//! }
//! ```

mod error;
mod events;
mod spec;

use std::time::Duration;

use serde::de::DeserializeOwned;

pub use self::error::ClientError;
use self::error::api_error;
pub use self::events::{ConsumerEvent, EventStream, JobEvents, JobListEvents, Subscription};
pub use self::spec::{JobSpec, Program};
use crate::JobId;
use crate::rest::{
    Health, JobInfo, JobState, LoginRequest, LoginResponse, PeerInfo, ProgramInfo, SubmitJob,
    UserInfo,
};

/// A logged-in connection to one supernode.
#[derive(Clone)]
pub struct Client {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default()
}

/// Percent-encode everything but unreserved characters (RFC 3986).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn normalize(base: &str) -> String {
    base.trim_end_matches('/').to_string()
}

async fn decode<T: DeserializeOwned>(url: &str, resp: reqwest::Response) -> Result<T, ClientError> {
    let status = resp.status();
    let bytes = resp
        .bytes()
        .await
        .map_err(|source| ClientError::transport(url, source))?;
    if status.is_success() {
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(format!("{url}: {e}")))
    } else {
        Err(api_error(status.as_u16(), &bytes))
    }
}

impl Client {
    /// A client that uses an existing token (from an earlier [`Client::login`]).
    pub fn with_token(base: &str, token: &str) -> Client {
        Client {
            base: normalize(base),
            token: token.to_string(),
            http: http(),
        }
    }

    /// Log in with a user name and password.
    pub async fn login(base: &str, name: &str, password: &str) -> Result<Client, ClientError> {
        let (client, _) = Client::login_full(base, name, password).await?;
        Ok(client)
    }

    /// Log in and also return the token's details.
    pub async fn login_full(
        base: &str,
        name: &str,
        password: &str,
    ) -> Result<(Client, LoginResponse), ClientError> {
        let base = normalize(base);
        let http = http();
        let url = format!("{base}/api/v1/login");
        let resp = http
            .post(&url)
            .json(&LoginRequest {
                name: name.to_string(),
                password: password.to_string(),
            })
            .send()
            .await
            .map_err(|source| ClientError::transport(&url, source))?;
        let login: LoginResponse = decode(&url, resp).await?;
        Ok((
            Client {
                base,
                token: login.token.clone(),
                http,
            },
            login,
        ))
    }

    /// The supernode's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The bearer token in use.
    pub fn token(&self) -> &str {
        &self.token
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v1{}", self.base, path)
    }

    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<T, ClientError> {
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|source| ClientError::transport(url, source))?;
        decode(url, resp).await
    }

    /// Send a request whose success answer has no body (204).
    async fn send_empty(&self, req: reqwest::RequestBuilder, url: &str) -> Result<(), ClientError> {
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|source| ClientError::transport(url, source))?;
        let status = resp.status();
        if status.is_success() {
            Ok(())
        } else {
            let body = resp.bytes().await.unwrap_or_default();
            Err(api_error(status.as_u16(), &body))
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let url = self.url(path);
        self.send(self.http.get(&url), &url).await
    }

    /// `GET /health` (no login needed, but harmless with one).
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.get("/health").await
    }

    /// The logged-in user.
    pub async fn me(&self) -> Result<UserInfo, ClientError> {
        self.get("/me").await
    }

    /// Upload a module, optionally registering it under `name`.
    /// [`ClientError::InvalidProgram`] says why bytes were refused.
    pub async fn upload_program(
        &self,
        wasm: Vec<u8>,
        name: Option<&str>,
    ) -> Result<ProgramInfo, ClientError> {
        let url = match name {
            Some(name) => self.url(&format!("/programs?name={}", percent_encode(name))),
            None => self.url("/programs"),
        };
        let req = self
            .http
            .post(&url)
            .header("content-type", "application/wasm")
            .body(wasm);
        self.send(req, &url).await
    }

    /// Programs the user can run.
    pub async fn programs(&self) -> Result<Vec<ProgramInfo>, ClientError> {
        self.get("/programs").await
    }

    /// Forget one of the user's programs, by name or hash.
    pub async fn delete_program(&self, program: &str) -> Result<(), ClientError> {
        let url = self.url(&format!("/programs/{}", percent_encode(program)));
        self.send_empty(self.http.delete(&url), &url).await
    }

    /// Submit a job.
    pub async fn submit(&self, job: &SubmitJob) -> Result<JobInfo, ClientError> {
        let url = self.url("/jobs");
        self.send(self.http.post(&url).json(job), &url).await
    }

    /// Start a job (the dissertation's `newJob`): module bytes are uploaded
    /// first, then the job is submitted by their hash.
    pub async fn start_job(&self, spec: JobSpec) -> Result<JobInfo, ClientError> {
        let JobSpec { program, mut job } = spec;
        job.program = match program {
            Program::Name(p) | Program::Hash(p) => p,
            Program::Wasm(bytes) => self.upload_program(bytes, None).await?.hash,
        };
        self.submit(&job).await
    }

    /// The user's jobs, optionally only those in one state.
    pub async fn jobs(&self, state: Option<JobState>) -> Result<Vec<JobInfo>, ClientError> {
        match state {
            Some(s) => self.get(&format!("/jobs?state={}", s.as_str())).await,
            None => self.get("/jobs").await,
        }
    }

    /// Jobs waiting for peers.
    pub async fn waiting_jobs(&self) -> Result<Vec<JobInfo>, ClientError> {
        self.jobs(Some(JobState::Waiting)).await
    }

    /// Jobs running now.
    pub async fn active_jobs(&self) -> Result<Vec<JobInfo>, ClientError> {
        self.jobs(Some(JobState::Active)).await
    }

    /// Jobs that are over and not disposed yet.
    pub async fn finished_jobs(&self) -> Result<Vec<JobInfo>, ClientError> {
        self.jobs(Some(JobState::Finished)).await
    }

    /// One job.
    pub async fn job(&self, id: JobId) -> Result<JobInfo, ClientError> {
        self.get(&format!("/jobs/{id}")).await
    }

    /// Kill a waiting or active job.
    pub async fn kill(&self, id: JobId) -> Result<JobInfo, ClientError> {
        let url = self.url(&format!("/jobs/{id}/kill"));
        self.send(self.http.post(&url), &url).await
    }

    /// Dispose of a finished job and its output.
    pub async fn dispose(&self, id: JobId) -> Result<(), ClientError> {
        let url = self.url(&format!("/jobs/{id}"));
        self.send_empty(self.http.delete(&url), &url).await
    }

    /// The peers the supernode knows.
    pub async fn peers(&self) -> Result<Vec<PeerInfo>, ClientError> {
        self.get("/peers").await
    }

    /// Follow a job's events from after `after` (an event id), reconnecting
    /// with `Last-Event-ID` when the connection breaks. The stream ends after
    /// the job's terminal event.
    pub fn events(&self, job: JobId, after: Option<i64>) -> EventStream {
        EventStream::new(self.clone(), job, after)
    }

    /// Follow a job's events, typed, from its first one; the stream ends
    /// after its terminal event and survives dropped connections.
    pub fn job_events(&self, job: JobId) -> JobEvents {
        self.job_events_after(job, None)
    }

    /// Follow a job's events, typed, from after the event `after` (see
    /// [`JobEvents::last_id`]).
    pub fn job_events_after(&self, job: JobId, after: Option<i64>) -> JobEvents {
        JobEvents::new(self.events(job, after))
    }

    /// The changes of the user's job lists (`jobListChanged`), as they come.
    pub fn job_list_events(&self) -> JobListEvents {
        JobListEvents::new(self.clone())
    }

    /// Every event of the user's jobs and every change of the job lists, as
    /// one stream (the dissertation's consumer event listener); see
    /// [`Subscription`]. Connects before it returns.
    pub async fn subscribe(&self) -> Result<Subscription, ClientError> {
        Subscription::new(self.clone()).await
    }
}
