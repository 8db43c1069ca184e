//! What an assignment says: its checks, the job's limits, the replicas of a
//! process, the sites of its peers, and the resources that come with the
//! program.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use base64::Engine as _;
use bsp_api::control::JobAssignment;
use bsp_api::{JobId, PeerId, Pid};

use super::JobEnv;
use super::errors::{FetchError, Source};
use super::hosts::Hosts;
use super::machine::Resources;
use crate::relay::Site;
use crate::runtime::JobInfo;

/// The shortest job secret a peer accepts: the data plane's key is derived
/// from it, so it must hold at least 128 bits of hex.
pub(crate) const MIN_JOB_TOKEN: usize = 32;

/// What is wrong with an assignment from the supernode: the job fails on
/// this peer with it ("invalid job assignment: …").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentError {
    #[error("the job has no processes")]
    NoProcesses,
    #[error(
        "the job's placement lists {listed} processes for {nprocs} processes with \
         {copies} cop{} each", if *copies == 1 { "y" } else { "ies" }
    )]
    PlacementLength {
        listed: usize,
        nprocs: u32,
        copies: u32,
    },
    #[error("the job asks for {0} copies of each process; this peer runs 1 to {MAX_COPIES}")]
    Redundancy(u32),
    #[error("the job's placement puts two copies of pid {pid} on peer #{peer}")]
    CopiesTogether { pid: Pid, peer: PeerId },
    #[error("the job's placement names peer index {index}, but the job has {peers} peers")]
    NoSuchPeerIndex { index: u32, peers: usize },
    #[error("the job's assignment restores pid {pid}, but the job has {nprocs} processes")]
    NoSuchPid { pid: Pid, nprocs: u32 },
    #[error("the job lists peer #{0} twice")]
    DuplicatePeer(PeerId),
    #[error("this peer (#{0}) is not one of the job's peers")]
    NotAMember(PeerId),
    #[error(
        "the job's secret is {0} characters long, fewer than the {MIN_JOB_TOKEN} its data-plane \
         key needs (the supernode issues 64); this peer will not run it in the clear"
    )]
    ShortSecret(usize),
    #[error("resource `{name}` is not valid base64: {error}")]
    Resource { name: String, error: String },
}

/// Most copies of a process (redundancy) a peer takes part in.
pub(crate) const MAX_COPIES: u32 = 3;

/// Check an assignment and return who hosts each pid.
pub(crate) fn check_assignment(me: PeerId, a: &JobAssignment) -> Result<Hosts, AssignmentError> {
    if a.nprocs == 0 {
        return Err(AssignmentError::NoProcesses);
    }
    let copies = a.limits.redundancy;
    if !(1..=MAX_COPIES).contains(&copies) {
        return Err(AssignmentError::Redundancy(copies));
    }
    if a.placement.len() != a.nprocs as usize * copies as usize {
        return Err(AssignmentError::PlacementLength {
            listed: a.placement.len(),
            nprocs: a.nprocs,
            copies,
        });
    }
    if let Some(&bad) = a.placement.iter().find(|&&i| i as usize >= a.peers.len()) {
        return Err(AssignmentError::NoSuchPeerIndex {
            index: bad,
            peers: a.peers.len(),
        });
    }
    if let Some(&bad) = a.restore.iter().find(|&&p| p >= a.nprocs) {
        return Err(AssignmentError::NoSuchPid {
            pid: bad,
            nprocs: a.nprocs,
        });
    }
    let mut seen = HashSet::new();
    if let Some(dup) = a.peers.iter().find(|p| !seen.insert(p.id)) {
        return Err(AssignmentError::DuplicatePeer(dup.id));
    }
    if !a.peers.iter().any(|p| p.id == me) {
        return Err(AssignmentError::NotAMember(me));
    }
    if a.job_token.len() < MIN_JOB_TOKEN {
        return Err(AssignmentError::ShortSecret(a.job_token.len()));
    }
    let slots: Vec<PeerId> = a
        .placement
        .iter()
        .map(|&i| a.peers[i as usize].id)
        .collect();
    let hosts = Hosts::new(a.nprocs, &slots);
    for pid in 0..a.nprocs {
        let of = hosts.of(pid);
        let twice = (1..of.len()).find(|&i| of[..i].contains(&of[i]));
        if let Some(i) = twice {
            return Err(AssignmentError::CopiesTogether { pid, peer: of[i] });
        }
    }
    Ok(hosts)
}

pub(crate) fn job_info(
    env: &JobEnv,
    a: &JobAssignment,
    kill: Arc<AtomicBool>,
) -> Result<JobInfo, AssignmentError> {
    let mut resources = HashMap::new();
    for (name, b64) in &a.resources {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| AssignmentError::Resource {
                name: name.clone(),
                error: e.to_string(),
            })?;
        resources.insert(name.clone(), bytes);
    }
    let memory_mib = a.limits.memory_mib.min(env.max_memory_mib) as usize;
    let memory_limit = memory_mib << 20;
    let budget_ms = a.limits.superstep_ms.min(env.max_superstep_ms);
    Ok(JobInfo {
        job: a.job,
        nprocs: a.nprocs,
        seed: a.seed,
        args: a.args.clone().into_bytes(),
        resources,
        memory_limit,
        superstep_budget: Duration::from_millis(budget_ms),
        output_limit: (a.limits.output_mib as u64) << 20,
        outbox_limit: memory_limit.saturating_mul(2).max(1 << 20),
        kill,
        reporter: env.reporter.clone(),
    })
}

/// The `count` replicas of `pid`'s checkpoints among `peers` (not `host`):
/// rendezvous hashing of `(job, pid, peer)`, so anyone who knows the peer
/// list finds them.
pub fn replicas_of(
    job: JobId,
    pid: Pid,
    host: PeerId,
    peers: &[PeerId],
    count: usize,
) -> Vec<PeerId> {
    let mut scored: Vec<(u64, PeerId)> = peers
        .iter()
        .filter(|&&p| p != host)
        .map(|&p| (mix(job as u64, pid as u64, p as u64), p))
        .collect();
    scored.sort_unstable();
    scored.into_iter().take(count).map(|(_, p)| p).collect()
}

/// A fixed 64-bit mix (SplitMix64 finalizer over the three keys).
pub(crate) fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(b.rotate_left(21))
        .wrapping_add(c.rotate_left(42) ^ 0xD6E8_FEB8_6659_FD93);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The job's resources in `encode_resources` form (from the supernode or
/// from other peers, `whence`), checked against `hash` and decoded; none
/// when `hash` is empty (the job has none apart from its assignment).
pub(crate) fn unpack_resources(
    hash: &str,
    bytes: &[u8],
    whence: Source,
) -> Result<Resources, FetchError> {
    use sha2::Digest as _;
    if hash.is_empty() {
        return Ok(None);
    }
    if !hex::encode(sha2::Sha256::digest(bytes)).eq_ignore_ascii_case(hash) {
        return Err(FetchError::ResourcesHash(whence));
    }
    bsp_api::control::decode_resources(bytes)
        .map(Some)
        .map_err(|error| FetchError::ResourcesMalformed { whence, error })
}

/// "; the job's 5 peers are in clusters a (2), b (3)": the clusters of
/// the job's peers (the sites broadcasts and Robber use), for status lines;
/// empty when no peer has one.
pub(crate) fn clusters_phrase<'a>(sites: impl Iterator<Item = &'a Site>) -> String {
    let mut count: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    let (mut unnamed, mut all) = (0, 0);
    for s in sites {
        all += 1;
        match &s.cluster {
            Some(c) => *count.entry(c.as_str()).or_default() += 1,
            None => unnamed += 1,
        }
    }
    if count.is_empty() {
        return String::new();
    }
    let mut parts: Vec<String> = count.iter().map(|(c, n)| format!("{c} ({n})")).collect();
    if unnamed > 0 {
        parts.push(format!("no cluster ({unnamed})"));
    }
    let s = if parts.len() == 1 { "" } else { "s" };
    let are = if all == 1 { "peer is" } else { "peers are" };
    format!("; the job's {all} {are} in cluster{s} {}", parts.join(", "))
}

pub(crate) fn sites_of(a: &JobAssignment) -> BTreeMap<PeerId, Site> {
    a.peers
        .iter()
        .map(|p| (p.id, Site::new(p.id, &p.addr, p.cluster.clone())))
        .collect()
}
