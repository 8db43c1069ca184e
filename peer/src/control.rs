//! The supernode client of the control plane (see [`bsp_api::control`]):
//! login and lease renewal, the command long poll, the ordered report
//! uploader, module downloads, and the drain request.
//!
//! **Fencing.** A 401 on any call means the lease is gone: the supernode
//! declared this peer lost and restored its processes elsewhere. The client
//! then runs the *fenced* hook (the peer kills all its jobs), forgets its
//! peer id and logs in as a new peer, so nothing it still sends can be
//! mistaken for the old peer's (docs/fault-tolerance.md, "Failure and
//! restore" 5).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use bsp_api::control::{Commands, Lease, PeerEvent, PeerLogin, PeerRenew, PeerReport};
use bsp_api::{JobId, PeerId};
use reqwest::{RequestBuilder, Response, StatusCode};
use tokio_util::sync::CancellationToken;

/// Largest module the peer downloads.
pub const MAX_MODULE_BYTES: usize = 256 << 20;

/// How long the supernode may hold a command long poll.
pub const COMMAND_WAIT: Duration = Duration::from_secs(20);

/// Errors talking to the supernode.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("the supernode is unreachable: {}", unreachable_reason(.0))]
    Unreachable(#[source] reqwest::Error),
    #[error("the supernode refused the lease (401): log in again")]
    Unauthorized,
    #[error("the supernode answered {status} to {what}: {body}")]
    Status {
        what: &'static str,
        status: StatusCode,
        body: String,
    },
    #[error("the supernode's answer to {what} is invalid: {error}")]
    Invalid { what: &'static str, error: String },
    #[error("the program is larger than {} MiB", MAX_MODULE_BYTES >> 20)]
    ModuleTooLarge,
    /// The supernode refuses this peer for good: no enrollment token, a bad
    /// or revoked one, or the peer was disabled ([`REFUSAL_CODES`]).
    #[error("the supernode refuses this peer: {message}")]
    Refused { code: String, message: String },
}

/// The codes of a login refusal that retrying cannot change.
pub use bsp_api::control::refusal::CODES as REFUSAL_CODES;

impl ControlError {
    /// Whether retrying the same request later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            ControlError::Unreachable(_) | ControlError::Unauthorized => true,
            ControlError::Status { status, .. } => {
                status.is_server_error()
                    || *status == StatusCode::REQUEST_TIMEOUT
                    || *status == StatusCode::TOO_MANY_REQUESTS
            }
            ControlError::Invalid { .. }
            | ControlError::ModuleTooLarge
            | ControlError::Refused { .. } => false,
        }
    }
}

/// Why a request failed to reach the supernode: what TLS refused and what
/// to do (a wrong pin, say), else the transport error.
fn unreachable_reason(e: &reqwest::Error) -> String {
    bsp_api::client::tls::tls_failure(e).unwrap_or_else(|| e.to_string())
}

/// What the peer does when its lease turns out to be gone.
pub type FencedHook = Box<dyn Fn() + Send + Sync>;

/// A client of the supernodes (one, or several sharing a database), holding
/// the current lease. It talks to one at a time and fails over to the next
/// when that one cannot be reached or answers that it is unavailable; the
/// callers' retries then go there.
pub struct Client {
    http: reqwest::Client,
    bases: Vec<String>,
    /// Index into `bases` of the supernode in use.
    current: std::sync::atomic::AtomicUsize,
    login: RwLock<PeerLogin>,
    lease: RwLock<Option<Lease>>,
    relogin: tokio::sync::Mutex<()>,
    on_fenced: RwLock<Option<FencedHook>>,
    /// Set once the supernode refuses this peer for good.
    refusal: RwLock<Option<String>>,
    refused: CancellationToken,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base_url())
            .field("peer_id", &self.peer_id())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for the supernode at `base` (e.g. `https://bsp.example.org:7878`,
    /// or `http://127.0.0.1:7878` on loopback), or for several separated by
    /// commas (supernodes sharing one database), that logs in with `login`
    /// and verifies an `https://` supernode's certificate as `tls` says.
    pub fn new(
        base: &str,
        login: PeerLogin,
        tls: &bsp_api::client::TlsOptions,
    ) -> Result<Arc<Client>, String> {
        let bases = base
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .map(check_base)
            .collect::<Result<Vec<_>, _>>()?;
        if bases.is_empty() {
            return Err("no supernode URL given".into());
        }
        // Idle connections are let go before the supernode closes them
        // (after 20 s without a request).
        let http = bsp_api::client::tls::http_builder(tls, Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Arc::new(Client {
            http,
            bases,
            current: std::sync::atomic::AtomicUsize::new(0),
            login: RwLock::new(login),
            lease: RwLock::new(None),
            relogin: tokio::sync::Mutex::new(()),
            on_fenced: RwLock::new(None),
            refusal: RwLock::new(None),
            refused: CancellationToken::new(),
        }))
    }

    /// The base URL of the supernode in use.
    pub fn base_url(&self) -> &str {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        &self.bases[i % self.bases.len()]
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v1/peer/{path}", self.base_url())
    }

    /// The supernode at `url` did not answer, or said it cannot serve: use
    /// the next one (unless another request moved on already).
    fn fail_over(&self, url: &str) {
        if self.bases.len() < 2 || !url.starts_with(&format!("{}/", self.base_url())) {
            return;
        }
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        let next = (i + 1) % self.bases.len();
        if self
            .current
            .compare_exchange(
                i,
                next,
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
        {
            tracing::warn!(
                from = %self.bases[i],
                to = %self.bases[next],
                "the supernode does not answer: failing over to the next one"
            );
        }
    }

    /// Sends `req` to the supernode in use; fails over when it cannot be
    /// reached or answers 502, 503 or 504 (a proxy without it, or a
    /// supernode whose database is gone).
    async fn send(&self, req: RequestBuilder) -> Result<Response, ControlError> {
        let url = req
            .try_clone()
            .and_then(|r| r.build().ok())
            .map(|r| r.url().to_string())
            .unwrap_or_default();
        match req.send().await {
            Ok(resp) => {
                if matches!(resp.status().as_u16(), 502..=504) {
                    self.fail_over(&url);
                }
                Ok(resp)
            }
            Err(e) => {
                self.fail_over(&url);
                Err(ControlError::Unreachable(e))
            }
        }
    }

    /// The current lease token ("" before the first login).
    pub fn token(&self) -> String {
        self.lease
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|l| l.token.clone())
            .unwrap_or_default()
    }

    /// This peer's id, once logged in.
    pub fn peer_id(&self) -> Option<PeerId> {
        self.lease
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|l| l.peer_id)
    }

    /// The current lease.
    pub fn lease(&self) -> Option<Lease> {
        self.lease.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_lease(&self, lease: Lease) {
        *self.lease.write().unwrap_or_else(|p| p.into_inner()) = Some(lease);
    }

    /// Update what the next login reports.
    pub fn update_login(&self, speed: f64, idle: f64) {
        let mut l = self.login.write().unwrap_or_else(|p| p.into_inner());
        l.speed = speed;
        l.idle = idle;
    }

    /// Set what to do when the lease turns out to be gone (before logging
    /// in again as a new peer): the peer kills all its jobs.
    pub fn set_on_fenced(&self, hook: FencedHook) {
        *self.on_fenced.write().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    /// Resolves once the supernode refused this peer for good
    /// ([`ControlError::Refused`]); [`Client::refusal`] then says why.
    pub fn refused(&self) -> CancellationToken {
        self.refused.clone()
    }

    /// Why the supernode refused this peer for good, if it did.
    pub fn refusal(&self) -> Option<String> {
        self.refusal
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Log in and store the lease. The first login and every login after a
    /// fence are fresh (a new peer id); `previous_id` is only sent for a
    /// login while a lease is held.
    pub async fn login(&self) -> Result<Lease, ControlError> {
        let mut body = self.login.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(id) = self.peer_id() {
            body.previous_id = Some(id);
        }
        let resp = self
            .send(
                self.http
                    .post(self.url("login"))
                    .timeout(Duration::from_secs(30))
                    .json(&body),
            )
            .await?;
        let status = resp.status();
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            let body = resp.bytes().await.map_err(ControlError::Unreachable)?;
            let error = serde_json::from_slice::<bsp_api::rest::ApiError>(&body)
                .ok()
                .filter(|e| REFUSAL_CODES.contains(&e.code.as_str()));
            return Err(match error {
                Some(e) => {
                    *self.refusal.write().unwrap_or_else(|p| p.into_inner()) =
                        Some(e.message.clone());
                    self.refused.cancel();
                    ControlError::Refused {
                        code: e.code,
                        message: e.message,
                    }
                }
                None => ControlError::Status {
                    what: "login",
                    status,
                    body: String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned(),
                },
            });
        }
        let lease: Lease = json(check("login", resp).await?, "login").await?;
        self.set_lease(lease.clone());
        Ok(lease)
    }

    /// Log in, retrying with backoff until it works or `cancel` fires.
    pub async fn login_until_ok(&self, cancel: &CancellationToken) -> Option<Lease> {
        let mut backoff = Duration::from_millis(250);
        loop {
            match self.login().await {
                Ok(lease) => return Some(lease),
                Err(e @ ControlError::Refused { .. }) => {
                    tracing::error!("{e}");
                    return None;
                }
                Err(e) => tracing::warn!(
                    "cannot log in to the supernode at {}: {e}; retrying in {:?}",
                    self.base_url(),
                    backoff
                ),
            }
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    }

    /// The lease whose token was `stale` is gone: unless another task
    /// already handled it, run the fenced hook (kill every job), forget the
    /// peer id and log in as a new peer.
    async fn relogin(&self, stale: &str) -> Result<(), ControlError> {
        let _guard = self.relogin.lock().await;
        if self.token() != stale {
            return Ok(());
        }
        if self.peer_id().is_some() {
            tracing::warn!(
                peer = self.peer_id(),
                "the supernode refused the lease: this peer was declared gone; \
                 stopping its jobs and logging in again as a new peer"
            );
            if let Some(hook) = &*self.on_fenced.read().unwrap_or_else(|p| p.into_inner()) {
                hook();
            }
            *self.lease.write().unwrap_or_else(|p| p.into_inner()) = None;
        }
        self.login().await.map(|_| ())
    }

    /// Send an authorized request; on 401 log in again (see the module
    /// docs) and, if `retry`, send it once more with the new lease.
    async fn authorized(
        &self,
        what: &'static str,
        retry: bool,
        build: impl Fn(&str) -> RequestBuilder,
    ) -> Result<Response, ControlError> {
        for attempt in 0..2 {
            let token = self.token();
            let resp = self.send(build(&token).bearer_auth(&token)).await?;
            match check(what, resp).await {
                Err(ControlError::Unauthorized) if attempt == 0 => {
                    self.relogin(&token).await?;
                    if !retry {
                        return Err(ControlError::Unauthorized);
                    }
                }
                other => return other,
            }
        }
        Err(ControlError::Unauthorized)
    }

    /// Renew the lease, reporting speed, idle fraction and running jobs.
    pub async fn renew(&self, body: &PeerRenew) -> Result<Lease, ControlError> {
        let resp = self
            .authorized("renew", true, |_| {
                self.http
                    .post(self.url("renew"))
                    .timeout(Duration::from_secs(30))
                    .json(body)
            })
            .await?;
        let lease: Lease = json(resp, "renew").await?;
        self.set_lease(lease.clone());
        Ok(lease)
    }

    /// Long-poll for commands with sequence numbers greater than `after`.
    /// After a fence it answers [`ControlError::Unauthorized`] without
    /// retrying: the new peer's commands are numbered from 0 again, so the
    /// caller starts over with `after = 0` (see [`Client::peer_id`]).
    pub async fn commands(&self, after: u64, wait: Duration) -> Result<Commands, ControlError> {
        let url = format!(
            "{}?after={after}&wait_ms={}",
            self.url("commands"),
            wait.as_millis()
        );
        let resp = self
            .authorized("commands", false, |_| {
                self.http.get(&url).timeout(wait + Duration::from_secs(15))
            })
            .await?;
        json(resp, "commands").await
    }

    /// Deliver one batch of events.
    pub async fn report(&self, events: &[PeerEvent]) -> Result<(), ControlError> {
        let body = PeerReport {
            events: events.to_vec(),
        };
        self.authorized("report", true, |_| {
            self.http
                .post(self.url("report"))
                .timeout(Duration::from_secs(60))
                .json(&body)
        })
        .await
        .map(|_| ())
    }

    /// Ask the supernode to drain this peer: no new processes, and its
    /// processes migrate away (`POST /api/v1/peer/drain`).
    pub async fn drain(&self) -> Result<(), ControlError> {
        self.authorized("drain", false, |_| {
            self.http
                .post(self.url("drain"))
                .timeout(Duration::from_secs(30))
        })
        .await
        .map(|_| ())
    }

    /// End a drain this peer asked for: it takes processes again.
    pub async fn resume(&self) -> Result<(), ControlError> {
        self.authorized("resume", false, |_| {
            self.http
                .post(self.url("resume"))
                .timeout(Duration::from_secs(30))
        })
        .await
        .map(|_| ())
    }

    /// Download a module by hash.
    pub async fn module(&self, hash: &str) -> Result<Vec<u8>, ControlError> {
        if !hash.chars().all(|c| c.is_ascii_hexdigit()) || hash.is_empty() {
            return Err(ControlError::Invalid {
                what: "module",
                error: format!("`{hash}` is not a hex hash"),
            });
        }
        let url = self.url(&format!("modules/{hash}"));
        let mut resp = self
            .authorized("module", true, |_| {
                self.http.get(&url).timeout(Duration::from_secs(300))
            })
            .await?;
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_MODULE_BYTES as u64)
        {
            return Err(ControlError::ModuleTooLarge);
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(ControlError::Unreachable)? {
            if bytes.len() + chunk.len() > MAX_MODULE_BYTES {
                return Err(ControlError::ModuleTooLarge);
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }

    /// Download a job's resources (`bsp_api::control::encode_resources`
    /// form), at most `limit` bytes.
    pub async fn job_resources(&self, job: JobId, limit: u64) -> Result<Vec<u8>, ControlError> {
        let url = self.url(&format!("jobs/{job}/resources"));
        let mut resp = self
            .authorized("resources", true, |_| {
                self.http.get(&url).timeout(Duration::from_secs(300))
            })
            .await?;
        let too_large = || ControlError::Invalid {
            what: "resources",
            error: format!("more than the {limit} bytes the assignment announced"),
        };
        if resp.content_length().is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(ControlError::Unreachable)? {
            if (bytes.len() + chunk.len()) as u64 > limit {
                return Err(too_large());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }
}

/// `base` if it is a supernode URL a peer may use, without a trailing `/`.
fn check_base(base: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(base)
        .map_err(|e| format!("the supernode URL `{base}` is invalid: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "the supernode URL `{base}` must start with http:// or https://"
        ));
    }
    if url.scheme() == "http" && !bsp_api::client::is_loopback(&url) {
        return Err(format!(
            "the supernode URL `{base}` is plain http:// to another machine: the enrollment \
             token and leases would cross the network in the clear; a supernode elsewhere \
             serves https://, so use https://"
        ));
    }
    Ok(base.trim_end_matches('/').to_string())
}

async fn check(what: &'static str, resp: Response) -> Result<Response, ControlError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    if status == StatusCode::UNAUTHORIZED {
        return Err(ControlError::Unauthorized);
    }
    let mut body = resp.text().await.unwrap_or_default();
    if body.len() > 500 {
        let mut cut = 500;
        while !body.is_char_boundary(cut) {
            cut -= 1;
        }
        body.truncate(cut);
    }
    Err(ControlError::Status { what, status, body })
}

async fn json<T: serde::de::DeserializeOwned>(
    resp: Response,
    what: &'static str,
) -> Result<T, ControlError> {
    let bytes = resp.bytes().await.map_err(ControlError::Unreachable)?;
    serde_json::from_slice(&bytes).map_err(|e| ControlError::Invalid {
        what,
        error: e.to_string(),
    })
}
