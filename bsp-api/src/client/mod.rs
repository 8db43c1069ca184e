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
//!   [`ClientError::InvalidProgram`], [`ClientError::NotEnoughPeers`],
//!   [`ClientError::InvalidUrl`], [`ClientError::Tls`].
//!
//! # TLS
//!
//! `https://` URLs are verified by CA (Mozilla's roots, and any CA of one's
//! own) or by the certificate's pinned fingerprint, as the supernode prints
//! it at start; [`ClientOptions`] says which ([`tls`]). A plain `http://`
//! URL is for a supernode on loopback, the only place it serves plain HTTP.
//!
//! # Timeouts, reconnection and retries
//!
//! Ordinary calls give up after [`DEFAULT_REQUEST_TIMEOUT`] without a whole
//! answer ([`Client::with_request_timeout`] changes it). Event streams have
//! no total timeout.
//!
//! Every event stream reconnects by itself when its connection drops. A
//! job's stream sends `Last-Event-ID`, so the supernode resumes after the
//! last event returned: no event is lost and none is returned twice. The
//! job-list stream ([`JobListEvents`]) is a notification without replay:
//! changes made while it was disconnected are lost. A [`Subscription`]
//! re-reads the job lists after each reconnect, so it misses no job. A
//! connection that
//! receives nothing, not even the supernode's keep-alive (sent every 15 s),
//! for [`DEFAULT_STREAM_IDLE_TIMEOUT`] counts as dropped
//! ([`Client::with_stream_idle_timeout`] changes it).
//!
//! Transient failures ([`ClientError::is_transient`]: the supernode cannot
//! be reached, or answers 408, 429 or 5xx, as while it restarts or behind a
//! proxy that lost it) are retried with exponential backoff, from about
//! 100 ms up to 5 s between attempts. A stream of its own ([`EventStream`],
//! [`JobEvents`], [`JobListEvents`]) retries for [`STREAM_RETRY_FOR`] of
//! failures in a row, then returns the last error (calling `next` again
//! starts over); a [`Subscription`] retries for as long as it lives. Other
//! errors are returned at once: 401 (log in again), 404 (the job is not, or
//! no longer, the user's).
//!
//! An event whose kind this client does not know (from a newer supernode)
//! is skipped.
//!
//! The program below is `examples/quickstart.rs` (`cargo run -p bsp-api
//! --features client --example quickstart` with `BSPWEB_URL`, `BSPWEB_USER`
//! and `BSPWEB_PASSWORD` set); the end-to-end tests run its `run` against a
//! real supernode and peers.
//!
//! ```no_run
#![doc = include_str!("../../examples/quickstart.rs")]
//! ```

mod error;
mod events;
mod spec;
pub mod tls;

use std::time::Duration;

use serde::de::DeserializeOwned;

pub use self::error::ClientError;
use self::error::api_error;
pub use self::events::{
    ConsumerEvent, EventStream, JobEvents, JobListEvents, STREAM_RETRY_FOR, Subscription,
};
pub use self::spec::{JobSpec, Program};
pub use self::tls::TlsOptions;
use crate::JobId;
use crate::rest::{
    ChangePasswordRequest, CreateUserRequest, Health, JobInfo, JobState, LoginRequest,
    LoginResponse, PeerInfo, ProgramInfo, RingInfo, SetPasswordRequest, SubmitJob,
    UpdateUserRequest, UserInfo,
};

/// How long an ordinary call (not an event stream) waits for its whole
/// answer before it fails with [`ClientError::NotConnected`], unless
/// [`Client::with_request_timeout`] says otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an event stream may stay silent before it is taken for dead and
/// reconnected, unless [`Client::with_stream_idle_timeout`] says otherwise:
/// three times the supernode's keep-alive interval (15 s).
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(45);

/// How long establishing a TCP connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A logged-in connection to a supernode, or to several sharing one
/// database (a base URL of several, separated by commas): calls go to one
/// at a time, and the next call after one could not reach it (or was
/// answered 502, 503 or 504) goes to the next. Event streams resume there
/// after the last event they delivered.
#[derive(Clone)]
pub struct Client {
    bases: std::sync::Arc<Vec<String>>,
    /// Index into `bases` of the supernode in use (shared by clones).
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Why a base URL is unusable, if one is: every call fails with
    /// [`ClientError::InvalidUrl`].
    bad_base: Option<(String, String)>,
    token: String,
    /// For ordinary calls, each with a total timeout.
    http: reqwest::Client,
    /// For event streams: no total timeout, a read (idle) timeout.
    sse: reqwest::Client,
    request_timeout: Duration,
    stream_idle_timeout: Duration,
    /// How `sse` is rebuilt with another idle timeout.
    tls: TlsOptions,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base_url())
            .field("request_timeout", &self.request_timeout)
            .field("stream_idle_timeout", &self.stream_idle_timeout)
            .finish_non_exhaustive()
    }
}

fn http(read_timeout: Option<Duration>, tls: &TlsOptions) -> reqwest::Client {
    // Idle connections are let go before the supernode closes them (after
    // 20 s without a request), so a request never meets one closing.
    let builder = tls::http_builder(tls, CONNECT_TIMEOUT);
    match read_timeout {
        Some(t) => builder.read_timeout(t),
        None => builder,
    }
    .build()
    .or_else(|_| {
        reqwest::Client::builder()
            .use_preconfigured_tls(tls::client_config(tls))
            .build()
    })
    // Building fails only for settings this client does not use (system
    // proxies, a TLS backend without a configuration).
    .unwrap_or_else(|e| unreachable!("cannot build an HTTP client: {e}"))
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

/// Whether `url` names this machine: `localhost` or a loopback address
/// (the only place plain `http://` is used).
pub fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let ip = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || ip
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
}

/// The base URL without trailing slashes, and why this client cannot use
/// it, if it cannot.
fn check_base(base: &str) -> (String, Option<String>) {
    let given = base.trim();
    let base = given.trim_end_matches('/').to_string();
    let why = if given.is_empty() {
        Some("it is empty; give the supernode's address, such as http://127.0.0.1:7878".to_string())
    } else if !given.contains("://") {
        Some(format!("it has no scheme; write http://{base}"))
    } else {
        match reqwest::Url::parse(given) {
            Err(e) => Some(format!("{e}; write it as http://HOST:PORT")),
            Ok(url) if !matches!(url.scheme(), "http" | "https") => Some(format!(
                "the scheme must be https or http, not {}; write it as https://HOST:PORT",
                url.scheme()
            )),
            Ok(url) if url.host_str().is_none_or(str::is_empty) => {
                Some("it names no host; write it as http://HOST:PORT".to_string())
            }
            Ok(url) if url.query().is_some() || url.fragment().is_some() => Some(
                "it must not have a query or a fragment (`?`, `#`); write it as http://HOST:PORT"
                    .to_string(),
            ),
            Ok(url) if url.scheme() == "http" && !is_loopback(&url) => Some(format!(
                "plain http:// is for a supernode on this machine (loopback) only: passwords and \
                 tokens would cross the network in the clear; a supernode elsewhere serves \
                 https://, so write https://{}",
                base.trim_start_matches("http://")
            )),
            Ok(_) => None,
        }
    };
    (base, why)
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

/// How a [`Client`] connects: for now, how it verifies the supernode's
/// TLS certificate. `ClientOptions::default()` is what [`Client::login`]
/// and [`Client::with_token`] use (CA verification by Mozilla's roots).
///
/// ```no_run
/// # async fn f() -> Result<(), bsp_api::client::ClientError> {
/// use bsp_api::client::ClientOptions;
/// let pin = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
/// let client = ClientOptions::new()
///     .fingerprint(pin.parse().expect("a fingerprint"))
///     .login("https://bsp.example.org:7878", "alice", "secret")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    tls: TlsOptions,
}

impl ClientOptions {
    /// CA verification by Mozilla's roots.
    pub fn new() -> ClientOptions {
        ClientOptions::default()
    }

    /// Verify the supernode's certificate as `tls` says.
    pub fn tls(mut self, tls: TlsOptions) -> ClientOptions {
        self.tls = tls;
        self
    }

    /// Accept exactly the supernode certificate with this fingerprint.
    pub fn fingerprint(mut self, fingerprint: crate::tls::Fingerprint) -> ClientOptions {
        self.tls.fingerprint = Some(fingerprint);
        self
    }

    /// The TLS options.
    pub fn tls_options(&self) -> &TlsOptions {
        &self.tls
    }

    /// A client that uses an existing token; see [`Client::with_token`].
    pub fn with_token(&self, base: &str, token: &str) -> Client {
        Client::new(base, token.to_string(), self.tls.clone())
    }

    /// Log in with a user name and password; see [`Client::login`].
    pub async fn login(
        &self,
        base: &str,
        name: &str,
        password: &str,
    ) -> Result<Client, ClientError> {
        let (client, _) = self.login_full(base, name, password).await?;
        Ok(client)
    }

    /// Log in and also return the token's details.
    pub async fn login_full(
        &self,
        base: &str,
        name: &str,
        password: &str,
    ) -> Result<(Client, LoginResponse), ClientError> {
        let mut client = Client::new(base, String::new(), self.tls.clone());
        client.check()?;
        // A login is safe to repeat: one that cannot reach a supernode (or
        // is answered 502–504) tries the next, once each.
        let mut tries = client.bases.len();
        let login: LoginResponse = loop {
            tries -= 1;
            let url = client.url("/login");
            let sent = client
                .http
                .post(&url)
                .timeout(client.request_timeout)
                .json(&LoginRequest {
                    name: name.to_string(),
                    password: password.to_string(),
                })
                .send()
                .await;
            let resp = match sent {
                Ok(resp) => resp,
                Err(source) => {
                    client.fail_over(&url);
                    if tries > 0 {
                        continue;
                    }
                    return Err(ClientError::transport(&url, source));
                }
            };
            if matches!(resp.status().as_u16(), 502..=504) && tries > 0 {
                client.fail_over(&url);
                continue;
            }
            break decode(&url, resp).await?;
        };
        client.token.clone_from(&login.token);
        Ok((client, login))
    }
}

impl Client {
    fn new(base: &str, token: String, tls: TlsOptions) -> Client {
        let mut bases = Vec::new();
        let mut bad_base = None;
        for given in base.split(',') {
            let (base, why) = check_base(given);
            if let Some(why) = why {
                bad_base.get_or_insert((base.clone(), why));
            }
            bases.push(base);
        }
        Client {
            bases: std::sync::Arc::new(bases),
            current: Default::default(),
            bad_base,
            token,
            http: http(None, &tls),
            sse: http(Some(DEFAULT_STREAM_IDLE_TIMEOUT), &tls),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            stream_idle_timeout: DEFAULT_STREAM_IDLE_TIMEOUT,
            tls,
        }
    }

    /// A client that uses an existing token (from an earlier [`Client::login`]).
    /// If `base` is not a URL this client can use, every call fails with
    /// [`ClientError::InvalidUrl`].
    ///
    /// An `https://` supernode's certificate is verified by Mozilla's
    /// roots; [`ClientOptions::with_token`] verifies otherwise (a pinned
    /// fingerprint, a CA of one's own).
    pub fn with_token(base: &str, token: &str) -> Client {
        ClientOptions::default().with_token(base, token)
    }

    /// Log in with a user name and password; `base` is the supernode's
    /// `https://` or `http://` URL ([`ClientError::InvalidUrl`] if it is not
    /// one). An `https://` supernode's certificate is verified by Mozilla's
    /// roots; [`ClientOptions::login`] verifies otherwise (a pinned
    /// fingerprint, a CA of one's own).
    pub async fn login(base: &str, name: &str, password: &str) -> Result<Client, ClientError> {
        ClientOptions::default().login(base, name, password).await
    }

    /// Log in and also return the token's details.
    pub async fn login_full(
        base: &str,
        name: &str,
        password: &str,
    ) -> Result<(Client, LoginResponse), ClientError> {
        ClientOptions::default()
            .login_full(base, name, password)
            .await
    }

    /// The same client with another timeout for ordinary calls (default
    /// [`DEFAULT_REQUEST_TIMEOUT`]): the time to send the request and read
    /// the whole answer, after which the call fails with
    /// [`ClientError::NotConnected`]. Raise it to upload large modules over
    /// a slow link. Event streams are not affected.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Client {
        self.request_timeout = timeout;
        self
    }

    /// The same client with another idle timeout for event streams (default
    /// [`DEFAULT_STREAM_IDLE_TIMEOUT`]): a stream that receives nothing, not
    /// even the supernode's keep-alive, for this long is reconnected.
    pub fn with_stream_idle_timeout(mut self, timeout: Duration) -> Client {
        self.stream_idle_timeout = timeout;
        self.sse = http(Some(timeout), &self.tls);
        self
    }

    /// The timeout of ordinary calls.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The idle timeout of event streams.
    pub fn stream_idle_timeout(&self) -> Duration {
        self.stream_idle_timeout
    }

    /// [`ClientError::InvalidUrl`] if the base URL is unusable.
    fn check(&self) -> Result<(), ClientError> {
        match &self.bad_base {
            Some((url, reason)) => Err(ClientError::InvalidUrl {
                url: url.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The base URL of the supernode in use.
    pub fn base_url(&self) -> &str {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        &self.bases[i % self.bases.len()]
    }

    /// `url` (of the supernode in use) could not be reached or said it
    /// cannot serve: the next call goes to the next supernode, if there is
    /// another (unless another call moved on already).
    pub(crate) fn fail_over(&self, url: &str) {
        if self.bases.len() < 2 || !url.starts_with(&format!("{}/", self.base_url())) {
            return;
        }
        use std::sync::atomic::Ordering::Relaxed;
        let i = self.current.load(Relaxed);
        let _ = self
            .current
            .compare_exchange(i, (i + 1) % self.bases.len(), Relaxed, Relaxed);
    }

    /// [`Client::fail_over`] on an answer that says the supernode cannot
    /// serve now (a proxy without a backend, a database that is gone).
    pub(crate) fn fail_over_on(&self, url: &str, status: reqwest::StatusCode) {
        if matches!(status.as_u16(), 502..=504) {
            self.fail_over(url);
        }
    }

    /// The bearer token in use.
    pub fn token(&self) -> &str {
        &self.token
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v1{}", self.base_url(), path)
    }

    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<T, ClientError> {
        self.check()?;
        let resp = req
            .bearer_auth(&self.token)
            .timeout(self.request_timeout)
            .send()
            .await
            .map_err(|source| {
                self.fail_over(url);
                ClientError::transport(url, source)
            })?;
        self.fail_over_on(url, resp.status());
        decode(url, resp).await
    }

    /// Send a request whose success answer has no body (204).
    async fn send_empty(&self, req: reqwest::RequestBuilder, url: &str) -> Result<(), ClientError> {
        self.check()?;
        let resp = req
            .bearer_auth(&self.token)
            .timeout(self.request_timeout)
            .send()
            .await
            .map_err(|source| {
                self.fail_over(url);
                ClientError::transport(url, source)
            })?;
        self.fail_over_on(url, resp.status());
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

    /// Change the logged-in user's password. Every other login of the
    /// account ends; this client switches to the fresh token.
    pub async fn change_password(
        &mut self,
        current_password: &str,
        new_password: &str,
    ) -> Result<LoginResponse, ClientError> {
        let url = self.url("/me/password");
        let body = ChangePasswordRequest {
            current_password: current_password.to_string(),
            new_password: new_password.to_string(),
        };
        let resp: LoginResponse = self.send(self.http.post(&url).json(&body), &url).await?;
        self.token = resp.token.clone();
        Ok(resp)
    }

    /// The DHHT ring: the peers that take processes, their shares, and
    /// where the caller's processes land.
    pub async fn ring(&self) -> Result<RingInfo, ClientError> {
        self.get("/ring").await
    }

    /// Every account (administrators only).
    pub async fn users(&self) -> Result<Vec<UserInfo>, ClientError> {
        self.get("/users").await
    }

    /// Create an account (administrators only).
    pub async fn create_user(&self, req: &CreateUserRequest) -> Result<UserInfo, ClientError> {
        let url = self.url("/users");
        self.send(self.http.post(&url).json(req), &url).await
    }

    /// Change an account's role, standing or quotas (administrators only).
    pub async fn update_user(
        &self,
        name: &str,
        change: &UpdateUserRequest,
    ) -> Result<UserInfo, ClientError> {
        let url = self.url(&format!("/users/{}", percent_encode(name)));
        self.send(self.http.patch(&url).json(change), &url).await
    }

    /// Set an account's password (administrators only); its logins end.
    pub async fn set_password(&self, name: &str, password: &str) -> Result<UserInfo, ClientError> {
        let url = self.url(&format!("/users/{}/password", percent_encode(name)));
        let body = SetPasswordRequest {
            password: password.to_string(),
        };
        self.send(self.http.post(&url).json(&body), &url).await
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

    /// Disable a peer of yours (an administrator: any): it is fenced, its
    /// processes restored elsewhere, and its logins refused; or enable it.
    pub async fn set_peer_disabled(
        &self,
        peer: crate::PeerId,
        disabled: bool,
    ) -> Result<PeerInfo, ClientError> {
        let url = self.url(&format!("/peers/{peer}"));
        let body = crate::rest::UpdatePeer { disabled };
        self.send(self.http.patch(&url).json(&body), &url).await
    }

    /// Create an enrollment token for your peers; the answer holds its
    /// secret, which the supernode cannot show again.
    pub async fn create_enrollment(
        &self,
        name: &str,
    ) -> Result<crate::rest::NewEnrollment, ClientError> {
        let url = self.url("/enrollments");
        let body = crate::rest::CreateEnrollment {
            name: name.to_string(),
        };
        self.send(self.http.post(&url).json(&body), &url).await
    }

    /// Your enrollment tokens (an administrator's: everyone's), newest first.
    pub async fn enrollments(&self) -> Result<Vec<crate::rest::EnrollmentInfo>, ClientError> {
        self.get("/enrollments").await
    }

    /// Revoke an enrollment token: its peers are fenced and refused.
    pub async fn revoke_enrollment(&self, id: i64) -> Result<(), ClientError> {
        let url = self.url(&format!("/enrollments/{id}"));
        self.send_empty(self.http.delete(&url), &url).await
    }

    /// Follow a job's events from after `after` (an event id), reconnecting
    /// with `Last-Event-ID` when the connection breaks and retrying
    /// transient failures for [`STREAM_RETRY_FOR`]. The stream ends after
    /// the job's terminal event.
    pub fn events(&self, job: JobId, after: Option<i64>) -> EventStream {
        EventStream::new(self.clone(), job, after, Some(STREAM_RETRY_FOR))
    }

    /// A job's events stored so far, from after `after`: the stream ends
    /// once they are read, even while the job runs (what `bspweb logs`
    /// prints without `--follow`).
    pub fn stored_events(&self, job: JobId, after: Option<i64>) -> EventStream {
        EventStream::stored(self.clone(), job, after)
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
        JobListEvents::new(self.clone(), Some(STREAM_RETRY_FOR))
    }

    /// Every event of the user's jobs and every change of the job lists, as
    /// one stream (the dissertation's consumer event listener); see
    /// [`Subscription`]. Connects before it returns; its streams are read
    /// by tasks on the current Tokio runtime.
    pub async fn subscribe(&self) -> Result<Subscription, ClientError> {
        Subscription::new(self.clone()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port nothing listens on (connections are refused).
    fn dead() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    }

    #[tokio::test]
    async fn a_call_that_cannot_reach_a_supernode_moves_the_next_to_another() {
        let (a, b) = (dead(), dead());
        let client = Client::with_token(&format!("{a}, {b}/"), "t");
        assert_eq!(client.base_url(), a);
        assert!(client.jobs(None).await.is_err());
        assert_eq!(client.base_url(), b, "failed over");
        // Clones share where they are; after the last comes the first.
        let clone = client.clone();
        assert!(clone.jobs(None).await.is_err());
        assert_eq!(client.base_url(), a);
        // A login tries each once before it gives up.
        let err = ClientOptions::new()
            .login(&format!("{a},{b}"), "u", "p")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("127.0.0.1"), "{err}");
        // One URL: nothing to fail over to.
        let one = Client::with_token(&a, "t");
        assert!(one.jobs(None).await.is_err());
        assert_eq!(one.base_url(), a);
    }

    #[test]
    fn a_base_url_must_be_http_or_https_with_a_host() {
        for (base, hint) in [
            ("127.0.0.1:7878", "write http://127.0.0.1:7878"),
            ("localhost:7878", "write http://localhost:7878"),
            (
                "ftp://bsp.example.org",
                "the scheme must be https or http, not ftp",
            ),
            ("http://", "http://HOST:PORT"),
            ("http://h:7878/?x=1", "must not have a query"),
            ("", "it is empty"),
            ("http://[::1", "http://HOST:PORT"),
            (
                "http://bsp.example.org:7878",
                "write https://bsp.example.org:7878",
            ),
            ("http://192.0.2.7", "loopback"),
        ] {
            let (_, why) = check_base(base);
            let why = why.unwrap_or_else(|| panic!("{base:?} was accepted"));
            assert!(why.contains(hint), "{base:?}: {why}");
        }
        for (base, normal) in [
            ("http://127.0.0.1:7878", "http://127.0.0.1:7878"),
            ("http://localhost/", "http://localhost"),
            ("http://127.8.0.1:1", "http://127.8.0.1:1"),
            (
                "https://bsp.example.org:7878/",
                "https://bsp.example.org:7878",
            ),
            (" http://[::1]:7878/bsp// ", "http://[::1]:7878/bsp"),
        ] {
            assert_eq!(check_base(base), (normal.to_string(), None), "{base:?}");
        }
    }

    #[tokio::test]
    async fn an_unusable_base_url_is_an_invalid_url_error_before_any_request() {
        let e = Client::login("localhost:7878", "u", "p").await.unwrap_err();
        match &e {
            ClientError::InvalidUrl { url, reason } => {
                assert_eq!(url, "localhost:7878");
                assert!(reason.contains("http://localhost:7878"), "{reason}");
            }
            e => panic!("{e:?}"),
        }
        assert!(!e.is_transient() && !e.is_not_connected());
        assert!(
            e.to_string()
                .starts_with("invalid supernode URL `localhost:7878`: "),
            "{e}"
        );
        let client = Client::with_token("ftp://example.org", "t");
        let e = client.jobs(None).await.unwrap_err();
        assert!(matches!(e, ClientError::InvalidUrl { .. }), "{e:?}");
        let e = client.job_events(1).next().await.unwrap_err();
        assert!(matches!(e, ClientError::InvalidUrl { .. }), "{e:?}");
        let e = client.subscribe().await.unwrap_err();
        assert!(matches!(e, ClientError::InvalidUrl { .. }), "{e:?}");
    }
}
