//! The user-facing REST API under `/api/v1` (JSON bodies).
//!
//! | method | path | body → answer |
//! |---|---|---|
//! | POST | `/api/v1/login` | [`LoginRequest`] → [`LoginResponse`] |
//! | POST | `/api/v1/users` | [`CreateUserRequest`] → [`UserInfo`] (admin only) |
//! | GET | `/api/v1/me` | → [`UserInfo`] |
//! | POST | `/api/v1/programs?name=NAME` | raw `.wasm` bytes → [`ProgramInfo`] |
//! | GET | `/api/v1/programs` | → `Vec<ProgramInfo>` |
//! | DELETE | `/api/v1/programs/{program}` | forget one of your programs (name or hash) → 204 |
//! | POST | `/api/v1/jobs` | [`SubmitJob`] → [`JobInfo`] |
//! | GET | `/api/v1/jobs?state=waiting\|active\|finished` | → `Vec<JobInfo>` |
//! | GET | `/api/v1/jobs/{id}` | → [`JobInfo`] |
//! | POST | `/api/v1/jobs/{id}/kill` | → [`JobInfo`] |
//! | DELETE | `/api/v1/jobs/{id}` | dispose a finished job → 204 |
//! | GET | `/api/v1/jobs/{id}/events` | Server-Sent Events of [`JobEvent`], resumable with `Last-Event-ID` |
//! | GET | `/api/v1/events` | Server-Sent Events of [`JobListChanged`] for the caller's jobs |
//! | GET | `/api/v1/peers` | → `Vec<PeerInfo>` |
//! | GET | `/api/v1/ring` | → [`RingInfo`] |
//! | GET | `/api/v1/health` | → [`Health`] |
//! | GET | `/api/v1/openapi.json` | this table as an OpenAPI 3.1 document (rendered at `/api/docs`) |
//!
//! Every error answer is an [`ApiError`] body with a matching HTTP status.
//! With feature `openapi`, every type here derives `utoipa::ToSchema`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{JobId, PeerId, Pid};

/// The body of every non-2xx answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiError {
    /// A short machine-readable code, e.g. `unauthorized`, `invalid_module`, `not_found`.
    pub code: String,
    /// What was wrong and what to do, in words for a person.
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LoginRequest {
    pub name: String,
    pub password: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LoginResponse {
    /// A JWT to send as `Authorization: Bearer <token>`.
    pub token: String,
    /// Unix seconds at which the token stops being accepted.
    pub expires_at: i64,
    pub user: UserInfo,
}

/// `POST /api/v1/users` (administrators): a new account.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateUserRequest {
    pub name: String,
    pub password: String,
    /// The account's role [default: `user`, or `admin` when `admin` is true].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// Older form of `role: admin`; contradicting `role` is an error.
    #[serde(default)]
    pub admin: bool,
    /// Quotas differing from the supernode's defaults.
    #[serde(default)]
    pub quotas: QuotaChange,
}

/// What an account may do.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything a user may, and managing accounts.
    Admin,
    /// Uploads programs and runs jobs.
    #[default]
    User,
    /// Donates computers: runs peers, sees the peers, runs no jobs.
    Volunteer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
            Role::Volunteer => "volunteer",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "user" => Some(Role::User),
            "volunteer" => Some(Role::Volunteer),
            _ => None,
        }
    }
}

impl std::fmt::Display for Role {
    /// The role's name; honours width and alignment (`{:<9}`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// An account's limits in force (its own, or the supernode's defaults);
/// 0 means no limit.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Quotas {
    /// Processes of the account's active jobs at once; a job that would go
    /// beyond waits until enough of them end (one larger than this fails).
    pub max_processes: u32,
    /// Programs stored (uploads, not counting the shared examples).
    pub max_programs: u32,
    /// Output of all its jobs stored, in MiB (finished jobs count until
    /// disposed of); a job that would go beyond fails.
    pub max_output_mib: u64,
}

/// Quotas to set; an absent one stays as it is (0: no limit).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaChange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_processes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_programs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_mib: Option<u64>,
}

/// What an account uses now, against its [`Quotas`].
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Usage {
    /// Processes of its active jobs.
    pub processes: u32,
    /// Programs it stores.
    pub programs: u32,
    /// Output of its jobs stored, in bytes.
    pub output_bytes: u64,
}

/// `PATCH /api/v1/users/{user}` (administrators): what to change; absent
/// fields stay as they are.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpdateUserRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// A disabled account cannot log in, its tokens stop working at once,
    /// and its waiting jobs wait; its running jobs go on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    #[serde(default)]
    pub quotas: QuotaChange,
}

/// `POST /api/v1/users/{user}/password` (administrators): a new password.
/// The account's tokens stop working.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SetPasswordRequest {
    pub password: String,
}

/// `POST /api/v1/me/password`: change one's own password. Every other
/// token of the account stops working; the answer is a fresh login.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChangePasswordRequest {
    pub current_password: String,
    pub new_password: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserInfo {
    pub id: i64,
    pub name: String,
    /// `role == admin` (kept for older clients).
    pub admin: bool,
    #[serde(default)]
    pub role: Role,
    #[serde(default)]
    pub disabled: bool,
    /// Limits in force (0: none).
    #[serde(default)]
    pub quotas: Quotas,
    /// What it uses now (in `GET /me` and `GET /users`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Unix milliseconds.
    #[serde(default)]
    pub created_at: i64,
}

/// A stored program: a validated module, addressed by the SHA-256 of its bytes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProgramInfo {
    /// The name it is registered under for this user (examples are shared by everyone).
    pub name: Option<String>,
    /// Hex SHA-256 of the module bytes.
    pub hash: String,
    pub size: u64,
    /// True for the bundled example programs every user can run.
    pub builtin: bool,
    pub description: Option<String>,
}

/// Per-job limits a user may ask for; the peers cap them with their own maxima.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobLimits {
    /// Wall-clock limit for one superstep of one process, in milliseconds.
    pub superstep_ms: u64,
    /// Linear-memory cap per process, in MiB.
    pub memory_mib: u32,
    /// Total stdout + stderr + raw output per process, in MiB.
    pub output_mib: u32,
    /// Checkpoint every this many supersteps (1 = at every sync). Larger
    /// values suit programs with huge state and tiny supersteps; a restore
    /// then re-executes up to this many supersteps, and each peer keeps the
    /// messages its processes sent in that many supersteps in memory
    /// (counted against its memory budget).
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: u32,
    /// Peers that hold a copy of each checkpoint (r). The job survives the
    /// loss of up to this many peers at once.
    #[serde(default = "default_replicas")]
    pub replicas: u32,
    /// Copies of each process, each on a peer of a different volunteer
    /// (1 or 2). With 2, every message, every checkpoint's state and every
    /// output record of a process must be the same from both copies before
    /// it reaches another process or the user; where they differ, a third
    /// run decides and the peer that computed wrongly is quarantined
    /// (SECURITY.md, "Result validation"). Costs twice the computing.
    #[serde(default = "default_redundancy")]
    pub redundancy: u32,
}

fn default_redundancy() -> u32 {
    1
}

fn default_checkpoint_every() -> u32 {
    1
}

fn default_replicas() -> u32 {
    2
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            // Two minutes: enough for any sensible superstep, short enough
            // that a runaway process ends soon. Peers share their slots
            // between jobs meanwhile, so a long superstep starves nobody.
            superstep_ms: 2 * 60 * 1000,
            memory_mib: 512,
            output_mib: 64,
            checkpoint_every: default_checkpoint_every(),
            replicas: default_replicas(),
            redundancy: default_redundancy(),
        }
    }
}

/// `POST /api/v1/jobs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmitJob {
    /// A registered program name (yours or a bundled example) or a hex SHA-256 hash.
    #[cfg_attr(feature = "openapi", schema(example = "ring"))]
    pub program: String,
    /// Number of BSP processes, at least 1.
    #[cfg_attr(feature = "openapi", schema(example = 4))]
    pub nprocs: u32,
    /// Arguments handed to the program's `main`, any JSON value (default `null`).
    #[serde(default)]
    pub args: serde_json::Value,
    #[serde(default)]
    pub description: Option<String>,
    /// Named resources the program reads with `Bsp::resource(name)`; base64 bytes.
    #[serde(default)]
    pub resources: BTreeMap<String, String>,
    /// Seed of the deterministic per-process RNGs; random when absent.
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub limits: Option<JobLimits>,
    /// Refuse the job with `409 not_enough_peers` instead of queueing it when
    /// fewer than this many peers are online at submission. Absent: always
    /// queue (a volunteer network's peers come and go).
    #[serde(default)]
    pub min_peers: Option<u32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Accepted, waiting for peers (the ready queue of §4.4).
    Waiting,
    /// Placed on peers and running.
    Active,
    /// Over, see [`JobOutcome`].
    Finished,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Waiting => "waiting",
            JobState::Active => "active",
            JobState::Finished => "finished",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        match s {
            "waiting" => Some(JobState::Waiting),
            "active" => Some(JobState::Active),
            "finished" => Some(JobState::Finished),
            _ => None,
        }
    }
}

/// How a finished job ended.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobOutcome {
    /// Every process returned from `main` normally.
    Exited,
    /// A process called `abort` (or `main` returned an error, or panicked).
    Aborted,
    /// The runtime ended it: trap, time limit, memory limit, lost peer, bad message.
    Failed,
    /// The owner killed it.
    Killed,
}

impl JobOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            JobOutcome::Exited => "exited",
            JobOutcome::Aborted => "aborted",
            JobOutcome::Failed => "failed",
            JobOutcome::Killed => "killed",
        }
    }

    pub fn parse(s: &str) -> Option<JobOutcome> {
        match s {
            "exited" => Some(JobOutcome::Exited),
            "aborted" => Some(JobOutcome::Aborted),
            "failed" => Some(JobOutcome::Failed),
            "killed" => Some(JobOutcome::Killed),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobInfo {
    pub id: JobId,
    pub owner: String,
    pub program: String,
    pub program_hash: String,
    pub nprocs: u32,
    pub args: serde_json::Value,
    pub description: Option<String>,
    pub state: JobState,
    pub outcome: Option<JobOutcome>,
    /// Why the job did not exit normally, in words.
    pub error: Option<String>,
    /// The pid the error came from, when one did.
    pub error_pid: Option<Pid>,
    pub seed: u64,
    pub limits: JobLimits,
    /// Unix milliseconds.
    pub submitted_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// For active and finished jobs: the peer each pid ran on, indexed by pid
    /// (its first copy's, with redundancy).
    pub placement: Vec<PeerId>,
    /// With redundancy: the peers of the other copies, `copies[c - 1][pid]`
    /// for copy `c ≥ 1`. Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<Vec<PeerId>>,
    /// Number of processes that have exited normally.
    pub exited: u32,
    /// For active and finished jobs: the number of supersteps each pid has
    /// completed (its syncs), indexed by pid, as last reported by its peer.
    /// Peers report progress at most a few times a second, so this lags.
    #[serde(default)]
    pub supersteps: Vec<u32>,
}

/// One event of a job's stream, as sent in the `data:` line of the SSE stream.
/// The SSE `id:` is [`JobEvent::id`], the SSE `event:` is the kind's name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobEvent {
    /// Strictly increasing per supernode; resume with `Last-Event-ID`.
    pub id: i64,
    pub job: JobId,
    pub pid: Option<Pid>,
    /// Unix milliseconds at which the supernode stored the event.
    pub at: i64,
    #[serde(flatten)]
    pub kind: JobEventKind,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JobEventKind {
    /// A line the process printed with `println`.
    Stdout { text: String },
    /// A line the process printed with `eprintln`.
    Stderr { text: String },
    /// Bytes the process wrote with `write_raw`, base64-encoded.
    Raw { data: String },
    /// A status line from the system (placement, progress), meant for people.
    Status { text: String },
    /// The process returned from `main`.
    ProcessExited { superstep: u32 },
    /// The process was lost with its peer and restored from its checkpoint
    /// of `superstep`; it re-executes from there (repeated output is dropped).
    ProcessRolledBack {
        superstep: u32,
        /// No checkpoint of the process survived: it re-runs from the start
        /// (`superstep` is 0).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        from_start: bool,
    },
    /// The process moved from one peer to another at the end of `superstep`.
    ProcessMigrated {
        from: PeerId,
        to: PeerId,
        superstep: u32,
    },
    /// With redundancy: the copies of the process on these peers produced
    /// different results in `superstep` (`what` says which: a message, its
    /// state, an output record). Nothing of it went further; a third run
    /// decides.
    CopiesDisagree {
        superstep: u32,
        peers: Vec<PeerId>,
        what: String,
    },
    /// With redundancy: `peer`'s result for the process in `superstep` was
    /// outvoted by two other peers. It gets no more processes; its share of
    /// the job is restored elsewhere from the last agreed checkpoints.
    PeerQuarantined {
        peer: PeerId,
        superstep: u32,
        reason: String,
    },
    /// Every process exited normally; the last event of the stream.
    JobExited,
    /// The program aborted (abort, error from `main`, panic); the last event.
    JobAborted { reason: String },
    /// The runtime ended the job; the last event.
    JobFailed { reason: String },
    /// The owner killed the job; the last event.
    JobKilled,
}

impl JobEventKind {
    /// The SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            JobEventKind::Stdout { .. } => "stdout",
            JobEventKind::Stderr { .. } => "stderr",
            JobEventKind::Raw { .. } => "raw",
            JobEventKind::Status { .. } => "status",
            JobEventKind::ProcessExited { .. } => "process_exited",
            JobEventKind::ProcessRolledBack { .. } => "process_rolled_back",
            JobEventKind::ProcessMigrated { .. } => "process_migrated",
            JobEventKind::CopiesDisagree { .. } => "copies_disagree",
            JobEventKind::PeerQuarantined { .. } => "peer_quarantined",
            JobEventKind::JobExited => "job_exited",
            JobEventKind::JobAborted { .. } => "job_aborted",
            JobEventKind::JobFailed { .. } => "job_failed",
            JobEventKind::JobKilled => "job_killed",
        }
    }

    /// True for the event that ends a job's stream.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            JobEventKind::JobExited
                | JobEventKind::JobAborted { .. }
                | JobEventKind::JobFailed { .. }
                | JobEventKind::JobKilled
        )
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PeerInfo {
    pub id: PeerId,
    pub name: String,
    /// Address other peers reach its data-plane listener at.
    pub addr: String,
    /// Benchmarked speed weight (1.0 = the reference machine).
    pub speed: f64,
    /// Idle-CPU fraction in `[0, 1]` at the last renewal.
    pub idle: f64,
    pub cores: u32,
    /// `online` while its lease is valid, `draining` while it is online but
    /// moving its processes away, `gone` after its lease expired.
    pub state: String,
    /// Unix milliseconds at which the current lease expires.
    pub lease_expires_at: i64,
    /// Number of processes currently placed on it, or migrating away from it
    /// and not handed over yet.
    pub processes: u32,
    /// The network cluster placement and broadcast schedules put it in:
    /// the one its volunteer named (`bspweb peer --cluster`), else the one
    /// the supernode found from the links peers measure
    /// ([`PeerInfo::found_cluster`]); none until either is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The cluster the supernode found for it by clustering the measured
    /// links (DiDiC, `found-N`), once it has taken part long enough; shown
    /// even when its volunteer named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found_cluster: Option<String>,
    /// Its memory at its last renewal; all zero once it is `gone`.
    #[serde(default)]
    pub memory: crate::control::PeerMemory,
    /// The links it measured to other peers, newest measurement of each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<PeerLink>,
    /// The account whose enrollment token it logged in with (its volunteer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The enrollment token it logged in with ([`EnrollmentInfo::id`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrollment: Option<i64>,
    /// Disabled by its volunteer or an administrator: fenced, and refused
    /// when it logs in again under this name with this token.
    #[serde(default)]
    pub disabled: bool,
    /// Why it was quarantined, if it was: a job with redundancy found it
    /// computing wrongly (outvoted by two other peers). It is disabled
    /// too; only an administrator may enable it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<String>,
    /// The power placement gives it while online: speed × idle fraction,
    /// believed only as far as it has been shown (a new peer is on
    /// probation; a measured one gets at most a little more than it
    /// delivered, see `SECURITY.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<f64>,
    /// The power it delivered in its jobs, as the other peers of the jobs
    /// measured it; none until measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_power: Option<f64>,
}

/// `POST /api/v1/enrollments`: a new enrollment token for the caller's peers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateEnrollment {
    /// What the token is for, for people ("lab machines"); 1 to 64
    /// printable characters.
    pub name: String,
}

/// An enrollment token as listed: everything but its secret.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnrollmentInfo {
    pub id: i64,
    pub name: String,
    /// The account that created it; its peers are that account's.
    pub owner: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds of the last peer login with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<i64>,
    /// Unix milliseconds at which it was revoked; a revoked token enrolls
    /// nothing and its peers were fenced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<i64>,
    /// Peers online with it now.
    pub peers_online: u32,
}

/// `POST /api/v1/enrollments`' answer: the token, shown this once.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NewEnrollment {
    pub enrollment: EnrollmentInfo,
    /// The secret to give `bspweb peer --token-file` (or `--token`,
    /// `BSPWEB_PEER_TOKEN`). The supernode keeps only its hash: it cannot
    /// show it again.
    pub token: crate::control::EnrollmentToken,
}

/// `PATCH /api/v1/peers/{id}` (its volunteer or an administrator).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpdatePeer {
    /// Disable (fence it, restore its processes elsewhere, refuse its
    /// logins) or enable it again.
    pub disabled: bool,
}

/// A measured link from a peer to another ([`PeerInfo::links`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PeerLink {
    pub peer: PeerId,
    /// The shortest round trip of a small frame, in microseconds.
    pub rtt_us: u64,
    /// Bytes per second of a bulk transfer.
    pub bandwidth_bps: u64,
    /// When it was measured, Unix milliseconds.
    pub measured_at: i64,
}

/// `GET /api/v1/ring`: the DHHT ring the supernode places processes with
/// (dissertation §4.2). Positions are fractions of the unit ring, `[0, 1)`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RingInfo {
    /// The online peers with a weight above 0 (peers under 5 % idle, and
    /// draining peers, are out of the ring).
    pub peers: Vec<RingPeer>,
    /// The processes of active jobs the caller may see (admins see all).
    pub processes: Vec<RingProcess>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RingPeer {
    pub id: PeerId,
    pub name: String,
    /// The peer's golden-ratio position `{kΦ}` on the ring.
    pub position: f64,
    /// Its weight: speed × idle fraction.
    pub weight: f64,
    /// The fraction of the ring it wins (the length of the arcs where its
    /// value `((x − position) mod 1) / weight` is the lowest).
    pub share: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RingProcess {
    pub job: JobId,
    pub pid: Pid,
    /// The process's ring position.
    pub position: f64,
    /// The peer it is placed on.
    pub peer: PeerId,
}

/// One event of `GET /api/v1/events`, the caller's own stream (SSE `event:
/// job_list_changed`): one of the caller's jobs was submitted, started,
/// finished or disposed. Re-read the job lists when it arrives.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobListChanged {
    pub job: JobId,
    /// The job's state now; `None` once it was disposed.
    pub state: Option<JobState>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    pub version: String,
    pub api_version: u32,
    pub peers_online: u32,
    /// Absent while the supernode can write to its disk; else what is
    /// wrong (the disk is full or failing) and what it means. Running jobs
    /// go on meanwhile; nothing new is stored until space returns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_problem: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process re-run from the start says so; a rollback to a checkpoint
    /// reads as it always did (`from_start` absent means false).
    #[test]
    fn a_rollback_says_whether_it_restarts_from_the_start() {
        let back = JobEventKind::ProcessRolledBack {
            superstep: 4,
            from_start: false,
        };
        let json = serde_json::to_string(&back).unwrap();
        assert!(!json.contains("from_start"), "{json}");
        assert_eq!(json, r#"{"kind":"process_rolled_back","superstep":4}"#);
        let old: JobEventKind = serde_json::from_str(&json).unwrap();
        assert_eq!(old, back);
        let fresh = JobEventKind::ProcessRolledBack {
            superstep: 0,
            from_start: true,
        };
        let json = serde_json::to_string(&fresh).unwrap();
        assert!(json.contains(r#""from_start":true"#), "{json}");
        assert_eq!(serde_json::from_str::<JobEventKind>(&json).unwrap(), fresh);
    }
}
