//! The peer ↔ supernode control plane: JSON over HTTP under `/api/v1/peer`.
//!
//! A peer logs in and gets a lease (a JWT with audience `bspweb-peer`); every
//! other call carries it as `Authorization: Bearer <lease token>`.
//!
//! | method | path | body → answer |
//! |---|---|---|
//! | POST | `/api/v1/peer/login` | [`PeerLogin`] → [`Lease`] |
//! | POST | `/api/v1/peer/renew` | [`PeerRenew`] → [`Lease`] (401 once the lease has expired: log in again) |
//! | GET | `/api/v1/peer/commands?after=SEQ&wait_ms=MS` | long poll → [`Commands`] |
//! | POST | `/api/v1/peer/report` | [`PeerReport`] → 204 |
//! | GET | `/api/v1/peer/modules/{hash}` | → the module's bytes |
//! | POST | `/api/v1/peer/drain` | → 204: move every process away, then release the peer |
//!
//! The supernode is not on the data path: processes exchange messages directly
//! between peers ([`crate::wire`]). It is consulted to start and stop jobs, to
//! collect output, and when something fails.

use serde::{Deserialize, Serialize};

use crate::rest::JobLimits;
use crate::{JobId, PeerId, Pid};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PeerLogin {
    /// A name for people (host name by default).
    pub name: String,
    /// Where other peers reach this peer's data-plane listener, `host:port`.
    pub addr: String,
    /// Benchmarked speed weight (1.0 = the reference machine).
    pub speed: f64,
    /// Idle-CPU fraction in `[0, 1]`.
    pub idle: f64,
    pub cores: u32,
    /// The peer's protocol version, [`crate::API_VERSION`].
    pub version: u32,
    /// The id this peer had before, to keep it across restarts.
    #[serde(default)]
    pub previous_id: Option<PeerId>,
    /// The network cluster the peer is in (`--cluster`): peers of one
    /// cluster share fast links, clusters are joined by slower ones. Used to
    /// pick broadcast schedules and Robber's collectives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The enrollment token a volunteer created for their peers
    /// (`bspweb token create`). The supernode refuses a login without a
    /// valid one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<EnrollmentToken>,
}

/// A secret that enrolls peers: `bwpeer-<id>-<64 hex digits>`. Its `Debug`
/// shows the id only, so it never reaches a log.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(value_type = String, example = "bwpeer-1-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"))]
#[serde(transparent)]
pub struct EnrollmentToken(pub String);

/// The prefix of every [`EnrollmentToken`].
pub const ENROLLMENT_TOKEN_PREFIX: &str = "bwpeer-";

impl EnrollmentToken {
    /// The token of enrollment `id` with `secret`.
    pub fn new(id: i64, secret: &[u8; 32]) -> EnrollmentToken {
        EnrollmentToken(format!(
            "{ENROLLMENT_TOKEN_PREFIX}{id}-{}",
            hex::encode(secret)
        ))
    }

    /// The enrollment id and the secret, when the token is well-formed
    /// (surrounding white space, as from a file, is ignored).
    pub fn parse(&self) -> Option<(i64, [u8; 32])> {
        let rest = self.0.trim().strip_prefix(ENROLLMENT_TOKEN_PREFIX)?;
        let (id, secret) = rest.split_once('-')?;
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) || id.len() > 18 {
            return None;
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(secret, &mut out).ok()?;
        Some((id.parse().ok()?, out))
    }
}

impl std::fmt::Debug for EnrollmentToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.parse() {
            Some((id, _)) => write!(f, "EnrollmentToken(#{id}, secret hidden)"),
            None => f.write_str("EnrollmentToken(malformed, hidden)"),
        }
    }
}

/// The codes of a peer login the supernode refuses for good (401): no
/// enrollment token, a bad or revoked one, a disabled account or peer.
/// Retrying with the same token cannot help, so a peer stops on them.
pub mod refusal {
    pub const ENROLLMENT_REQUIRED: &str = "enrollment_required";
    pub const BAD_ENROLLMENT_TOKEN: &str = "bad_enrollment_token";
    pub const ENROLLMENT_REVOKED: &str = "enrollment_revoked";
    pub const ENROLLMENT_OWNER_DISABLED: &str = "enrollment_owner_disabled";
    pub const PEER_DISABLED: &str = "peer_disabled";
    /// All of them.
    pub const CODES: &[&str] = &[
        ENROLLMENT_REQUIRED,
        BAD_ENROLLMENT_TOKEN,
        ENROLLMENT_REVOKED,
        ENROLLMENT_OWNER_DISABLED,
        PEER_DISABLED,
    ];
    /// How to get an enrollment token, for the messages that need one.
    pub const HOW_TO_ENROLL: &str = "create an enrollment token with `bspweb token create` (as \
         the account that donates the computer) or on the web UI's Peers page, and start the \
         peer with `--token-file FILE` (or the BSPWEB_PEER_TOKEN environment variable)";
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PeerRenew {
    pub speed: f64,
    pub idle: f64,
    /// Jobs the peer is currently running processes of.
    pub jobs: Vec<JobId>,
    /// The peer is draining: it wants no new processes and its processes to
    /// move away (set once `POST /api/v1/peer/drain` was accepted).
    #[serde(default)]
    pub draining: bool,
    /// What the peer's memory holds now.
    #[serde(default)]
    pub memory: PeerMemory,
    /// Running totals since the peer started, for the supernode's `/metrics`.
    #[serde(default)]
    pub counters: PeerCounters,
    /// Links it measured since its last renewal ([`Lease::probe`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkMeasurement>,
    /// How the other peers of its jobs kept up since its last renewal: the
    /// supernode caps a peer's claimed speed by what it delivers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observed: Vec<PeerObservation>,
    /// Barriers of its jobs that wait long for some processes: the
    /// supernode restores processes whose peer makes no progress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<BarrierWait>,
}

impl PeerRenew {
    /// The renewal of an idle peer of speed `speed` that runs no job and has
    /// nothing to report; set the other fields with `..PeerRenew::idle(s)`.
    pub fn idle(speed: f64) -> PeerRenew {
        PeerRenew {
            speed,
            idle: 1.0,
            jobs: Vec::new(),
            draining: false,
            memory: PeerMemory::default(),
            counters: PeerCounters::default(),
            links: Vec::new(),
            observed: Vec::new(),
            waits: Vec::new(),
        }
    }
}

/// How one peer's processes of a job kept up, seen from another peer of
/// the job: the time from each barrier to the arrival of the peer's last
/// `Done` for the next superstep, summed over `supersteps` barriers.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PeerObservation {
    pub job: JobId,
    /// The peer observed.
    pub peer: PeerId,
    /// Its processes in the job, as the observer knows the placement.
    pub processes: u32,
    pub supersteps: u32,
    pub busy_ms: u64,
}

/// A job's barrier on the reporting peer has waited `waited_ms` for the
/// `Done`s of `pids`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BarrierWait {
    pub job: JobId,
    pub waited_ms: u64,
    pub pids: Vec<Pid>,
}

/// A link a peer measured to another ([`crate::probe`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LinkMeasurement {
    /// The other peer.
    pub peer: PeerId,
    /// The shortest round trip of a small frame, in microseconds.
    pub rtt_us: u64,
    /// Payload bytes per second of one bulk transfer, less a round trip.
    pub bandwidth_bps: u64,
}

/// A peer to measure the link to ([`crate::probe`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProbeTarget {
    pub peer: PeerId,
    /// Its data-plane listener, `host:port`.
    pub addr: String,
    /// The ticket's expiry, Unix milliseconds.
    pub expires_ms: i64,
    /// What the target checks ([`crate::probe::ticket`]), hex.
    pub ticket: String,
}

/// What a peer did since it started, reported with each renewal; the
/// supernode adds the increase since the previous renewal to its
/// `/metrics` counters.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PeerCounters {
    /// Checkpoints of its processes it took.
    pub checkpoints: u64,
    /// Checkpoint bytes it sent to replicas (whole pages and deltas).
    pub checkpoint_bytes: u64,
    /// BSP message payload bytes it sent directly to other peers.
    pub message_bytes: u64,
    /// Payload bytes it relayed for broadcasts.
    pub relayed_bytes: u64,
}

/// What a peer's memory holds, reported with each renewal and shown in
/// `GET /api/v1/peers`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PeerMemory {
    /// Resident memory of the peer process in bytes (0: unknown).
    pub rss_bytes: u64,
    /// Bytes its jobs hold for fault tolerance: the messages its processes
    /// sent since the job's safe point (kept to re-send after a restore)
    /// and the checkpoints it keeps of other peers' processes. Bounded by a
    /// few supersteps' worth while jobs run, 0 when none does.
    pub held_bytes: u64,
    /// The most memory the peer may use for bspweb (its
    /// `--memory-budget-mib`), in bytes; 0: no budget.
    #[serde(default)]
    pub budget_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Lease {
    pub peer_id: PeerId,
    /// Bearer token for the control plane.
    pub token: String,
    /// The lease ends this many milliseconds after it was granted unless renewed.
    pub ttl_ms: u64,
    /// How often the peer should renew, in milliseconds (a fraction of the TTL).
    pub renew_every_ms: u64,
    /// The key probes addressed to this peer are checked with
    /// ([`crate::probe`]), hex; empty from a supernode that measures no links.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub probe_key: String,
    /// Peers to measure the link to now (at most a few per renewal).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probe: Vec<ProbeTarget>,
}

/// Answer of the long poll: commands with sequence numbers greater than `after`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Commands {
    pub commands: Vec<SeqCommand>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SeqCommand {
    /// Strictly increasing per peer; pass the largest seen as `after`.
    pub seq: u64,
    pub command: Command,
}

// Commands are few and short-lived; boxing the assignment would only change
// every constructor and match.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    /// Run the processes of this job that are placed on you. Sent again,
    /// with a higher `epoch`, whenever the job's peers or placement change
    /// (a peer was lost, a process migrates): a peer already running the job
    /// switches to the new assignment; a peer not in `peers` any more drops
    /// the job. See `docs/fault-tolerance.md`.
    StartJob(JobAssignment),
    /// Stop every process of this job now and forget it.
    KillJob { job: JobId, reason: String },
}

/// Everything a peer needs to run its share of a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobAssignment {
    pub job: JobId,
    /// Hex SHA-256 of the module; fetch it from `/api/v1/peer/modules/{hash}`.
    pub program_hash: String,
    pub nprocs: u32,
    /// The program's arguments as JSON text.
    pub args: String,
    pub seed: u64,
    pub limits: JobLimits,
    /// The job's secret: the key of its data-plane connections is derived
    /// from it (Noise with a pre-shared key, `peer/src/noise.rs`); it never
    /// travels on the data plane itself.
    pub job_token: String,
    /// `placement[c * nprocs + pid]` is the index into `peers` of the peer
    /// that runs copy `c` of `pid`, for `c < limits.redundancy` (one copy
    /// unless the job asked for redundancy). Copies of one pid are on
    /// different peers (of different volunteers).
    pub placement: Vec<u32>,
    /// The peers of the job.
    pub peers: Vec<JobPeer>,
    /// Named resources, base64.
    pub resources: Vec<(String, String)>,
    /// Configuration epoch, from 0; increases with every change of `peers`
    /// or `placement`. Older assignments than the one held are ignored, and
    /// data-plane connections carry it in their encrypted `Hello`.
    #[serde(default)]
    pub epoch: u64,
    /// Pids whose host changed in this epoch (lost with a peer, or
    /// migrating). Their new host restores them from their newest checkpoint;
    /// every other peer re-sends them what it retained.
    #[serde(default)]
    pub restore: Vec<Pid>,
    /// Pids that migrate (a subset of `restore`): their old host is alive and
    /// hands the process over at its next sync.
    #[serde(default)]
    pub migrate: Vec<Pid>,
    /// The program's size in bytes (0: unknown), so the peers can cut it
    /// into the same pieces when they pass it on among themselves.
    #[serde(default)]
    pub program_bytes: u64,
    /// Hex SHA-256 of the job's resources in [`encode_resources`] form,
    /// when they travel apart from the assignment (then `resources` is
    /// empty): fetch them from `/api/v1/peer/jobs/{job}/resources`, or from
    /// the job's other peers together with the program. Empty: none.
    #[serde(default)]
    pub resources_hash: String,
    /// Their size in that form.
    #[serde(default)]
    pub resources_bytes: u64,
}

/// The job's resources as one byte string, sorted by name: for each, the
/// name's length (u32, little-endian), the name (UTF-8), the data's length
/// (u64, little-endian), the data.
pub fn encode_resources(resources: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut sorted: Vec<&(String, Vec<u8>)> = resources.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (name, data) in sorted {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

/// The inverse of [`encode_resources`]; the error says what is malformed.
pub fn decode_resources(mut bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], String> {
        if bytes.len() < n {
            return Err(format!("the resources end inside {what}"));
        }
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        Ok(head)
    }
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let n = u32::from_le_bytes(
            take(&mut bytes, 4, "a name's length")?
                .try_into()
                .unwrap_or_default(),
        );
        let name = std::str::from_utf8(take(&mut bytes, n as usize, "a name")?)
            .map_err(|_| "a resource name is not UTF-8".to_string())?
            .to_string();
        let len = u64::from_le_bytes(
            take(&mut bytes, 8, "a length")?
                .try_into()
                .unwrap_or_default(),
        );
        let len = usize::try_from(len).map_err(|_| "a resource is too large".to_string())?;
        let data = take(&mut bytes, len, "a resource's data")?.to_vec();
        out.push((name, data));
    }
    Ok(out)
}

#[cfg(test)]
mod resource_tests {
    use super::*;

    #[test]
    fn resources_round_trip_sorted_and_malformed_input_is_an_error() {
        let r = vec![
            ("b.txt".to_string(), b"second".to_vec()),
            ("a.bin".to_string(), vec![0, 1, 2]),
            ("empty".to_string(), vec![]),
        ];
        let enc = encode_resources(&r);
        let mut sorted = r.clone();
        sorted.sort();
        assert_eq!(decode_resources(&enc).unwrap(), sorted);
        assert_eq!(decode_resources(&[]).unwrap(), vec![]);
        for cut in 1..enc.len() {
            if let Ok(d) = decode_resources(&enc[..cut]) {
                // Only a cut between two whole resources decodes.
                assert!(d.len() < 3, "cut at {cut}");
            }
        }
        assert!(decode_resources(&enc[..enc.len() - 1]).is_err());
        let mut huge = 5u32.to_le_bytes().to_vec();
        huge.extend_from_slice(b"abcde");
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_resources(&huge).is_err());
    }
}

/// Whether `name` is a valid [`PeerLogin::cluster`]: 1 to 64 ASCII letters,
/// digits, `.`, `_` or `-`.
pub fn valid_cluster_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The prefix of the names the supernode gives the clusters it finds from
/// measured links; a volunteer's `--cluster` may not use it.
pub const FOUND_CLUSTER_PREFIX: &str = "found-";

/// Whether `name` may be a volunteer's [`PeerLogin::cluster`]: a
/// [`valid_cluster_name`] that does not start with
/// [`FOUND_CLUSTER_PREFIX`].
pub fn valid_named_cluster(name: &str) -> bool {
    valid_cluster_name(name) && !name.starts_with(FOUND_CLUSTER_PREFIX)
}

/// What a volunteer's cluster name must be, for error messages.
pub const NAMED_CLUSTER_RULE: &str = "1 to 64 letters, digits, `.`, `_` or `-`, not starting with `found-` (the names of the clusters the supernode finds)";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobPeer {
    pub id: PeerId,
    /// Data-plane address `host:port`.
    pub addr: String,
    /// The peer's cluster for this epoch: the one its volunteer named
    /// ([`PeerLogin::cluster`]), else the one the supernode found from
    /// measured links (`found-N`). Broadcast schedules and Robber group
    /// peers by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

/// `POST /api/v1/peer/report`: what happened on the peer, in order.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PeerReport {
    pub events: Vec<PeerEvent>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
    Raw,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PeerEvent {
    /// One output record. `seq` counts a process's output records from 0;
    /// the supernode stores each `(job, pid, seq)` once, so repeats are dropped.
    Output {
        job: JobId,
        pid: Pid,
        seq: u64,
        stream: Stream,
        /// Text for stdout and stderr, base64 for raw.
        data: String,
    },
    /// The process returned from `main` after `superstep` syncs. Every output
    /// record of the process precedes this event.
    ProcessExited {
        job: JobId,
        pid: Pid,
        superstep: u32,
    },
    /// The program ended itself: `abort`, an error returned from `main`, or a panic.
    ProcessAborted {
        job: JobId,
        pid: Pid,
        superstep: u32,
        reason: String,
    },
    /// The runtime ended the process: trap, time or memory limit, bad host call,
    /// or a failure of the peer's messaging for this job.
    ProcessFailed {
        job: JobId,
        pid: Option<Pid>,
        superstep: u32,
        reason: String,
    },
    /// The process now runs on this peer, resumed from its checkpoint of
    /// `superstep` (after a loss or a migration, in assignment `epoch`).
    ProcessRestored {
        job: JobId,
        pid: Pid,
        superstep: u32,
        epoch: u64,
        /// No checkpoint survived: it was started again from the beginning.
        #[serde(default)]
        from_start: bool,
    },
    /// The process left this peer for another one at the end of `superstep`
    /// (migration or drain, in assignment `epoch`).
    ProcessHandedOver {
        job: JobId,
        pid: Pid,
        superstep: u32,
        epoch: u64,
    },
    /// The process has completed `superstep` syncs. Peers send it at most a
    /// few times a second per process (the newest value wins); it only feeds
    /// progress displays.
    Progress {
        job: JobId,
        pid: Pid,
        superstep: u32,
    },
    /// A status line for people (e.g. "superstep 10 done").
    Status {
        job: JobId,
        pid: Option<Pid>,
        text: String,
    },
    /// This peer's data-plane connection to `peer`, another peer of `job`,
    /// broke without the notice a peer gives when the job ends there: that
    /// peer may have died. The supernode checks for itself (it dials the
    /// peer's data-plane address, and only a refused connection counts) and
    /// if so declares it gone at once instead of waiting out its lease
    /// (docs/fault-tolerance.md, "Failure and restore").
    PeerUnreachable { job: JobId, peer: PeerId },
    /// With redundancy: copies of `pid`'s result for `superstep` from
    /// different peers differ. `groups` lists the peers that sent each
    /// version (one group per version, largest first). A group of at least
    /// the job's redundancy is the result that was taken: the others were
    /// outvoted. Otherwise nothing was taken yet, and a third run must
    /// decide. `what` says which result, for people.
    Disagreement {
        job: JobId,
        pid: Pid,
        superstep: u32,
        groups: Vec<Vec<PeerId>>,
        what: String,
    },
}

#[cfg(test)]
mod enrollment_token_tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_malformed_ones_are_refused() {
        for (id, byte) in [(1, 0u8), (42, 0xab), (i64::from(u32::MAX), 0xff)] {
            let secret = [byte; 32];
            let token = EnrollmentToken::new(id, &secret);
            assert_eq!(token.parse(), Some((id, secret)));
            // White space around it, as read from a file, is fine.
            let padded = EnrollmentToken(format!("  {}\n", token.0));
            assert_eq!(padded.parse(), Some((id, secret)));
            // The secret never shows in Debug.
            let shown = format!("{token:?}");
            assert!(!shown.contains(&hex::encode(secret)), "{shown}");
            assert!(shown.contains(&format!("#{id}")), "{shown}");
        }
        let hex64 = "0".repeat(64);
        for bad in [
            String::new(),
            "letmein".into(),
            format!("bwpeer--{hex64}"),
            format!("bwpeer-x-{hex64}"),
            format!("bwpeer-+1-{hex64}"),
            format!("bwpeer-1-{}", "0".repeat(63)),
            format!("bwpeer-1-{}", "0".repeat(66)),
            format!("bwpeer-1-{}g", "0".repeat(63)),
            format!("bwpeer-99999999999999999999-{hex64}"),
            format!("BWPEER-1-{hex64}"),
        ] {
            let token = EnrollmentToken(bad.clone());
            assert_eq!(token.parse(), None, "{bad}");
            assert!(!format!("{token:?}").contains(&hex64));
        }
    }
}
