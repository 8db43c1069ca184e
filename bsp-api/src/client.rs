//! An async client for the REST API (feature `client`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), bsp_api::client::ClientError> {
//! use bsp_api::client::Client;
//! use bsp_api::rest::SubmitJob;
//! let client = Client::login("http://127.0.0.1:7878", "alice", "secret").await?;
//! let job = client
//!     .submit(&SubmitJob {
//!         program: "ring".into(),
//!         nprocs: 8,
//!         args: serde_json::Value::Null,
//!         description: None,
//!         resources: Default::default(),
//!         seed: None,
//!         limits: None,
//!         min_peers: None,
//!     })
//!     .await?;
//! let mut events = client.events(job.id, None);
//! while let Some(event) = events.next().await? {
//!     println!("{:?}", event);
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use serde::de::DeserializeOwned;

use crate::JobId;
use crate::rest::{
    ApiError, Health, JobEvent, JobInfo, JobState, LoginRequest, LoginResponse, PeerInfo,
    ProgramInfo, SubmitJob, UserInfo,
};

/// What went wrong talking to a supernode.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The supernode answered with an error.
    #[error("{message} ({status} {code})")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// The supernode could not be reached or the connection broke.
    #[error("cannot reach the supernode at {url}: {source}")]
    Transport {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The answer was not what the API promises.
    #[error("unexpected answer from the supernode: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

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
        .map_err(|source| ClientError::Transport {
            url: url.to_string(),
            source,
        })?;
    if status.is_success() {
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(format!("{url}: {e}")))
    } else {
        Err(api_error(status.as_u16(), &bytes))
    }
}

fn api_error(status: u16, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ApiError>(body) {
        Ok(e) => ClientError::Api {
            status,
            code: e.code,
            message: e.message,
        },
        Err(_) => ClientError::Api {
            status,
            code: "http".into(),
            message: String::from_utf8_lossy(body).chars().take(500).collect(),
        },
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
            .map_err(|source| ClientError::Transport {
                url: url.clone(),
                source,
            })?;
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
            .map_err(|source| ClientError::Transport {
                url: url.to_string(),
                source,
            })?;
        decode(url, resp).await
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

    /// Submit a job.
    pub async fn submit(&self, job: &SubmitJob) -> Result<JobInfo, ClientError> {
        let url = self.url("/jobs");
        self.send(self.http.post(&url).json(job), &url).await
    }

    /// The user's jobs, optionally only those in one state.
    pub async fn jobs(&self, state: Option<JobState>) -> Result<Vec<JobInfo>, ClientError> {
        match state {
            Some(s) => self.get(&format!("/jobs?state={}", s.as_str())).await,
            None => self.get("/jobs").await,
        }
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
        let resp = self
            .http
            .delete(&url)
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|source| ClientError::Transport {
                url: url.clone(),
                source,
            })?;
        let status = resp.status();
        if status.is_success() {
            Ok(())
        } else {
            let body = resp.bytes().await.unwrap_or_default();
            Err(api_error(status.as_u16(), &body))
        }
    }

    /// The peers the supernode knows.
    pub async fn peers(&self) -> Result<Vec<PeerInfo>, ClientError> {
        self.get("/peers").await
    }

    /// Follow a job's events from after `after` (an event id), reconnecting
    /// with `Last-Event-ID` when the connection breaks. The stream ends after
    /// the job's terminal event.
    pub fn events(&self, job: JobId, after: Option<i64>) -> EventStream {
        EventStream {
            client: self.clone(),
            job,
            last_id: after,
            inner: None,
            done: false,
            failures: 0,
        }
    }
}

/// A resumable stream of one job's events; see [`Client::events`].
pub struct EventStream {
    client: Client,
    job: JobId,
    last_id: Option<i64>,
    inner: Option<BoxStream<'static, Result<eventsource_stream::Event, String>>>,
    done: bool,
    failures: u32,
}

impl EventStream {
    /// The id of the last event returned.
    pub fn last_id(&self) -> Option<i64> {
        self.last_id
    }

    async fn connect(&mut self) -> Result<(), ClientError> {
        use eventsource_stream::Eventsource;
        let url = self.client.url(&format!("/jobs/{}/events", self.job));
        let mut req = self
            .client
            .http
            .get(&url)
            .bearer_auth(&self.client.token)
            .header("accept", "text/event-stream");
        if let Some(id) = self.last_id {
            req = req.header("last-event-id", id.to_string());
        }
        let resp = req.send().await.map_err(|source| ClientError::Transport {
            url: url.clone(),
            source,
        })?;
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
        Ok(())
    }

    /// The next event, or `None` once the job's terminal event was returned.
    pub async fn next(&mut self) -> Result<Option<JobEvent>, ClientError> {
        loop {
            if self.done {
                return Ok(None);
            }
            if self.inner.is_none() {
                match self.connect().await {
                    Ok(()) => {}
                    Err(e @ ClientError::Api { .. }) => return Err(e),
                    Err(e) => {
                        self.failures += 1;
                        if self.failures > 10 {
                            return Err(e);
                        }
                        tokio::time::sleep(Duration::from_millis(200 * u64::from(self.failures)))
                            .await;
                        continue;
                    }
                }
            }
            let item = match self.inner.as_mut() {
                Some(s) => s.next().await,
                None => continue,
            };
            match item {
                Some(Ok(ev)) => {
                    if ev.data.is_empty() {
                        continue;
                    }
                    let event: JobEvent = serde_json::from_str(&ev.data).map_err(|e| {
                        ClientError::Protocol(format!("bad event from the supernode: {e}"))
                    })?;
                    self.failures = 0;
                    self.last_id = Some(event.id);
                    if event.kind.is_terminal() {
                        self.done = true;
                    }
                    return Ok(Some(event));
                }
                Some(Err(_)) | None => {
                    // The connection ended before the terminal event: resume.
                    self.inner = None;
                    self.failures += 1;
                    if self.failures > 10 {
                        return Err(ClientError::Protocol(
                            "the event stream kept breaking; giving up after 10 reconnects".into(),
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(self.failures))).await;
                }
            }
        }
    }
}
