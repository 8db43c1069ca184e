//! Large multicasts relayed among the destination peers (the broadcasts of
//! the seed papers in the data plane).
//!
//! A `send_range` or `send_list` queues one message per destination, all
//! sharing one payload. At the sync the driver looks at each such group:
//!
//! - **Direct** (the default for small payloads): the payload goes to every
//!   peer hosting a destination, once per peer however many destinations it
//!   hosts (the wire encodes a group's payload once, `bsp_api::wire`).
//! - **Relayed**: the sending peer picks a broadcast schedule
//!   (`collectives`) whose nodes are itself (the root) and the destination
//!   peers, and sends [`Frame::Relay`] frames with its transfers. Every peer
//!   forwards the byte ranges the schedule gives it as soon as it holds
//!   them ([`collectives::Relay`], data-driven rather than step by step)
//!   and, once it holds the whole payload, delivers the messages to the
//!   pids it hosts.
//!
//! [`choose`] is the rule, documented in `docs/broadcast.md`. Relaying
//! pays where it spreads the sender's load over other links: never for
//! payloads under [`BroadcastPolicy::min_bytes`] (a relay adds a hop of
//! latency), never for fewer than two destination peers, never when every
//! destination peer runs on the sender's own host (the copies share the
//! same cores and memory whoever makes them, and pieces only add copies:
//! `benches/loopback_broadcast.rs` measures direct sending cheapest there).
//! Otherwise: Juhász's symmetric broadcast inside one cluster (the sender
//! moves `n` bytes in total instead of `n` per peer), and a pipelined chain
//! ordered cluster by cluster across clusters (each narrow gateway link
//! carries the data once, the depth-first pipeline of Takahashi et al.).
//!
//! **Faults.** Messages keep their identity `(src, superstep, seq)`, so
//! receivers drop whatever arrives twice, and the barrier's counts make a
//! destination wait until its copy is there. A relay that loses its
//! connection to a peer of the schedule sends that peer the whole payload
//! directly once it holds it; when a peer of the schedule leaves the job,
//! the sender sends every other destination peer the payload directly.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;

use bsp_api::wire::{Frame, MAX_MESSAGE_BYTES, RelayAlgorithm, RelayHead};
use bsp_api::{PeerId, Pid};
use bytes::Bytes;
use collectives::{Schedule, SymmetricConfig, Transfer};

/// Payload bytes this peer put on the data plane, for logs, tests and
/// benchmarks.
#[derive(Debug, Default)]
pub struct DataStats {
    /// In [`Frame::Data`] (a group's shared payload counted once).
    pub direct: std::sync::atomic::AtomicU64,
    /// In [`Frame::Relay`].
    pub relayed: std::sync::atomic::AtomicU64,
    /// Bytes the jobs hold for fault tolerance (retained messages, replica
    /// checkpoints): [`bsp_api::control::PeerMemory::held_bytes`].
    pub held: std::sync::atomic::AtomicU64,
    /// Checkpoints of this peer's processes taken.
    pub checkpoints: std::sync::atomic::AtomicU64,
    /// Checkpoint bytes (whole pages and deltas) written to replicas (by
    /// the connections' writers, which make a checkpoint's frames).
    pub checkpoint_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Supersteps that ran on a job driver's thread, not a blocking one
    /// ([`crate::runtime::ShortRuns`]).
    pub inline_supersteps: std::sync::atomic::AtomicU64,
    /// How the other peers of the jobs kept up ([`crate::observe`]).
    pub observed: crate::observe::Ledger,
}

impl DataStats {
    /// The running totals a renewal reports.
    pub fn counters(&self) -> bsp_api::control::PeerCounters {
        use std::sync::atomic::Ordering::Relaxed;
        bsp_api::control::PeerCounters {
            checkpoints: self.checkpoints.load(Relaxed),
            checkpoint_bytes: self.checkpoint_bytes.load(Relaxed),
            message_bytes: self.direct.load(Relaxed),
            relayed_bytes: self.relayed.load(Relaxed),
        }
    }

    /// Count the payload bytes of `frame`.
    pub fn count(&self, frame: &Frame) {
        use std::sync::atomic::Ordering::Relaxed;
        match frame {
            Frame::Data { messages } => {
                let n: usize = bsp_api::wire::message_groups::runs(messages)
                    .map(|r| r[0].payload.len())
                    .sum();
                self.direct.fetch_add(n as u64, Relaxed);
            }
            Frame::Relay { bytes, .. } => {
                self.relayed.fetch_add(bytes.len() as u64, Relaxed);
            }
            _ => {}
        }
    }
}

/// Largest payload slice in one [`Frame::Relay`].
pub const RELAY_FRAME_BYTES: usize = 1 << 20;

/// Which broadcast `send_range`/`send_list` use (`bspweb peer --broadcast`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BroadcastAlgorithm {
    /// [`choose`]'s rule.
    #[default]
    Auto,
    /// Always straight to every destination peer.
    Direct,
    /// Always Juhász's symmetric broadcast when relaying is possible.
    Symmetric,
    /// Always a binomial tree.
    Binomial,
    /// Always a pipelined chain (ordered by cluster).
    Chain,
}

impl std::str::FromStr for BroadcastAlgorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => Self::Auto,
            "direct" => Self::Direct,
            "symmetric" => Self::Symmetric,
            "binomial" => Self::Binomial,
            "chain" => Self::Chain,
            _ => {
                return Err(format!(
                    "unknown broadcast algorithm `{s}`; use auto, direct, symmetric, binomial or chain"
                ));
            }
        })
    }
}

/// How this peer sends large multicasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BroadcastPolicy {
    pub algorithm: BroadcastAlgorithm,
    /// Payloads smaller than this go direct under [`BroadcastAlgorithm::Auto`].
    pub min_bytes: usize,
    /// Chunk size of the pipelined chain.
    pub chunk: usize,
}

impl Default for BroadcastPolicy {
    fn default() -> Self {
        BroadcastPolicy {
            algorithm: BroadcastAlgorithm::Auto,
            min_bytes: 256 << 10,
            chunk: 256 << 10,
        }
    }
}

/// What the rule knows about a peer: where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub id: PeerId,
    /// The host part of its data-plane address.
    pub host: String,
    pub cluster: Option<String>,
}

impl Site {
    pub fn new(id: PeerId, addr: &str, cluster: Option<String>) -> Site {
        let host = match addr.rsplit_once(':') {
            Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
            None => addr,
        };
        Site {
            id,
            host: host.to_string(),
            cluster,
        }
    }
}

/// The rule: how a payload of `len` bytes from `me` reaches `dests` (the
/// other peers hosting destinations). `None`: direct. Otherwise the
/// algorithm and the schedule's peer order (`me` first).
pub fn choose(
    policy: &BroadcastPolicy,
    len: usize,
    me: &Site,
    dests: &[Site],
) -> Option<(RelayAlgorithm, Vec<PeerId>)> {
    if dests.len() < 2 || len == 0 {
        return None;
    }
    let chain = |policy: &BroadcastPolicy| RelayAlgorithm::Chain {
        chunk: policy.chunk.clamp(MIN_CHUNK, RELAY_FRAME_BYTES) as u32,
    };
    let by_cluster = || {
        let mut order: Vec<&Site> = dests.iter().collect();
        // The sender's cluster first, then the others by name; peers by id.
        order.sort_by(|a, b| {
            let key = |s: &Site| (s.cluster != me.cluster, s.cluster.clone(), s.id);
            key(a).cmp(&key(b))
        });
        std::iter::once(me.id)
            .chain(order.into_iter().map(|s| s.id))
            .collect::<Vec<_>>()
    };
    let algorithm = match policy.algorithm {
        BroadcastAlgorithm::Direct => return None,
        BroadcastAlgorithm::Symmetric => RelayAlgorithm::Symmetric,
        BroadcastAlgorithm::Binomial => RelayAlgorithm::Binomial,
        BroadcastAlgorithm::Chain => chain(policy),
        BroadcastAlgorithm::Auto => {
            if len < policy.min_bytes || dests.iter().all(|d| d.host == me.host) {
                return None;
            }
            let one_cluster = dests.iter().all(|d| d.cluster == me.cluster);
            if one_cluster {
                RelayAlgorithm::Symmetric
            } else {
                chain(policy)
            }
        }
    };
    Some((algorithm, by_cluster()))
}

/// What is wrong with a relayed multicast another peer sent: a protocol
/// violation by that peer (or, for the schedules, a head no peer could
/// have built honestly).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    #[error("a relayed multicast from pid {0} which does not exist")]
    NoSuchSource(Pid),
    #[error("a relayed multicast of {0} bytes")]
    BadLength(u32),
    #[error("a relayed multicast to {0} pids")]
    BadDestinations(usize),
    #[error("a relayed multicast to pid {0} which does not exist")]
    NoSuchDestination(Pid),
    #[error("a relayed multicast whose peer list has repeats or under two peers")]
    BadPeerList,
    #[error(
        "a relayed multicast whose peer list leaves out this peer or the sender, or starts with this peer"
    )]
    NotOnPeerList,
    #[error("a relayed multicast in chunks of {0} bytes")]
    BadChunk(u32),
    #[error("this peer is not in the multicast's peer list")]
    NotANode,
    #[error("no schedule for the relayed multicast: {0}")]
    NoSchedule(collectives::CollectiveError),
    #[error("no relay state for the multicast: {0}")]
    NoRelayState(collectives::CollectiveError),
    #[error("relayed bytes {start}..{end} outside the {len}-byte payload")]
    OutOfRange {
        start: usize,
        end: usize,
        len: usize,
    },
    #[error("relayed bytes rejected: {0}")]
    Rejected(collectives::CollectiveError),
    #[error("a multicast relayed with more than {0} heads")]
    TooManyHeads(usize),
    #[error("relayed multicasts hold more than {0} MiB on this peer")]
    TooMuchHeld(u64),
}

/// The schedule of a relayed multicast: node `i` is `head.peers[i]`.
pub fn schedule(head: &RelayHead) -> Result<Schedule, RelayError> {
    let (nodes, len) = (head.peers.len(), head.len as usize);
    let s = match head.algorithm {
        RelayAlgorithm::Symmetric => {
            collectives::symmetric(nodes, 0, len, SymmetricConfig::default())
        }
        RelayAlgorithm::Binomial => collectives::binomial_tree(nodes, 0, len),
        RelayAlgorithm::Chain { chunk } => {
            collectives::pipelined_chain(nodes, 0, len, chunk as usize)
        }
    };
    s.map_err(RelayError::NoSchedule)
}

/// Smallest chunk of a relayed chain (a smaller one would make schedules of
/// millions of transfers).
pub const MIN_CHUNK: usize = 64 << 10;

/// Checks a received head against the job (`nprocs`) and this peer, which
/// must not be the schedule's root (nobody sends to the root). Whether its
/// peers are still the job's is [`current`]'s question.
pub fn check_head(
    head: &RelayHead,
    nprocs: u32,
    me: PeerId,
    from: PeerId,
) -> Result<(), RelayError> {
    if head.src >= nprocs {
        return Err(RelayError::NoSuchSource(head.src));
    }
    if head.len == 0 || head.len as usize > MAX_MESSAGE_BYTES {
        return Err(RelayError::BadLength(head.len));
    }
    if head.dsts.is_empty() || head.dsts.len() > nprocs as usize {
        return Err(RelayError::BadDestinations(head.dsts.len()));
    }
    if let Some((dst, _)) = head.dsts.iter().find(|(d, _)| *d >= nprocs) {
        return Err(RelayError::NoSuchDestination(*dst));
    }
    let distinct: BTreeSet<PeerId> = head.peers.iter().copied().collect();
    if distinct.len() != head.peers.len() || head.peers.len() < 2 {
        return Err(RelayError::BadPeerList);
    }
    if !distinct.contains(&me) || !distinct.contains(&from) || head.peers[0] == me {
        return Err(RelayError::NotOnPeerList);
    }
    if let RelayAlgorithm::Chain { chunk } = head.algorithm
        && ((chunk as usize) < MIN_CHUNK || chunk as usize > RELAY_FRAME_BYTES)
    {
        return Err(RelayError::BadChunk(chunk));
    }
    Ok(())
}

/// Whether every peer of `head` is among `job_peers`. A head from before a
/// peer left is stale, not wrong: its sender sends around the gap
/// directly, so its frames are dropped. (It also keeps a head naming made-up
/// peers from building a huge schedule.)
pub fn current(head: &RelayHead, job_peers: &[PeerId]) -> bool {
    head.peers.iter().all(|p| job_peers.contains(p))
}

/// Names a multicast: `(src, superstep, seq of its first message)`.
pub type RelayKey = (Pid, u32, u32);

pub fn key_of(head: &RelayHead) -> RelayKey {
    (head.src, head.superstep, head.dsts[0].1)
}

/// One multicast this peer sends or relays.
pub struct Inflight {
    pub head: Box<RelayHead>,
    /// This peer's node index in the schedule.
    pub node: usize,
    relay: collectives::Relay,
    /// The payload: filled in as frames arrive (a relay) or whole (the sender).
    buf: Vec<u8>,
    whole: Option<Bytes>,
    /// Peers to send the whole payload directly once it is here.
    pub direct: BTreeSet<PeerId>,
    /// The transfers this peer released (sent), to send again over a
    /// connection that broke.
    released: Vec<Transfer>,
}

impl Inflight {
    /// The sender's side: it holds `payload` already.
    pub fn sending(
        head: RelayHead,
        me: PeerId,
        payload: Bytes,
    ) -> Result<(Inflight, Vec<Transfer>), RelayError> {
        let mut f = Inflight::new(head, me)?;
        f.whole = Some(payload);
        let start = f.relay.start();
        f.released.extend(start.iter().cloned());
        Ok((f, start))
    }

    /// A relay's side, before any bytes.
    pub fn new(head: RelayHead, me: PeerId) -> Result<Inflight, RelayError> {
        let node = head
            .peers
            .iter()
            .position(|&p| p == me)
            .ok_or(RelayError::NotANode)?;
        let relay =
            collectives::Relay::new(&schedule(&head)?, node).map_err(RelayError::NoRelayState)?;
        Ok(Inflight {
            head: Box::new(head),
            node,
            relay,
            buf: Vec::new(),
            whole: None,
            direct: BTreeSet::new(),
            released: Vec::new(),
        })
    }

    /// The whole payload, once it is here.
    pub fn payload(&self) -> Option<&Bytes> {
        self.whole.as_ref()
    }

    /// Bytes at `offset` arrived. Returns the transfers now due, and whether
    /// this completed the payload.
    pub fn receive(
        &mut self,
        offset: u32,
        bytes: &[u8],
    ) -> Result<(Vec<Transfer>, bool), RelayError> {
        if self.whole.is_some() {
            return Ok((Vec::new(), false));
        }
        let len = self.head.len as usize;
        let start = offset as usize;
        let end = start
            .checked_add(bytes.len())
            .filter(|&e| e <= len && e > start);
        let Some(end) = end else {
            return Err(RelayError::OutOfRange {
                start,
                end: start.saturating_add(bytes.len()),
                len,
            });
        };
        if self.buf.is_empty() {
            self.buf = vec![0; len];
        }
        self.buf[start..end].copy_from_slice(bytes);
        let due = self
            .relay
            .on_bytes(start..end)
            .map_err(RelayError::Rejected)?;
        self.released.extend(due.iter().cloned());
        let done = self.relay.complete();
        if done {
            self.whole = Some(Bytes::from(std::mem::take(&mut self.buf)));
        }
        Ok((due, done))
    }

    /// The frames of every transfer this peer already sent to `peer`.
    pub fn resend_to(&self, peer: PeerId) -> Vec<Frame> {
        self.released
            .iter()
            .filter(|t| self.head.peers.get(t.to) == Some(&peer))
            .filter_map(|t| self.frames(t))
            .flat_map(|(_, frames)| frames)
            .collect()
    }

    /// The frames of `transfer` (cut to [`RELAY_FRAME_BYTES`]), with the peer
    /// they go to.
    pub fn frames(&self, t: &Transfer) -> Option<(PeerId, Vec<Frame>)> {
        let to = *self.head.peers.get(t.to)?;
        let mut frames = Vec::new();
        let mut at = t.range.start;
        while at < t.range.end {
            let end = (at + RELAY_FRAME_BYTES).min(t.range.end);
            frames.push(Frame::Relay {
                head: self.head.clone(),
                offset: at as u32,
                bytes: self.slice(at..end),
            });
            at = end;
        }
        Some((to, frames))
    }

    fn slice(&self, r: Range<usize>) -> Bytes {
        match &self.whole {
            Some(w) => w.slice(r),
            None => Bytes::copy_from_slice(&self.buf[r]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(id: PeerId, host: &str, cluster: Option<&str>) -> Site {
        Site::new(id, &format!("{host}:7000"), cluster.map(String::from))
    }

    #[test]
    fn the_rule() {
        let p = BroadcastPolicy::default();
        let me = site(1, "10.0.0.1", None);
        let lan: Vec<Site> = (2..6)
            .map(|i| site(i, &format!("10.0.0.{i}"), None))
            .collect();
        // Small payloads and single destination peers go direct.
        assert_eq!(choose(&p, 1000, &me, &lan), None);
        assert_eq!(choose(&p, 1 << 20, &me, &lan[..1]), None);
        // One cluster: symmetric.
        let (a, order) = choose(&p, 1 << 20, &me, &lan).unwrap();
        assert_eq!(a, RelayAlgorithm::Symmetric);
        assert_eq!(order, vec![1, 2, 3, 4, 5]);
        // Everyone on the sender's host: direct.
        let local: Vec<Site> = (2..6).map(|i| site(i, "127.0.0.1", None)).collect();
        let me_local = site(1, "127.0.0.1", None);
        assert_eq!(choose(&p, 16 << 20, &me_local, &local), None);
        // One other host among them: relayed.
        let mut mixed_hosts = local.clone();
        mixed_hosts[0] = site(2, "10.0.0.2", None);
        assert!(choose(&p, 16 << 20, &me_local, &mixed_hosts).is_some());
        // Across clusters: a chain, the sender's cluster first, clusters grouped.
        let me = site(9, "10.1.0.1", Some("b"));
        let mixed = vec![
            site(1, "10.0.0.1", Some("a")),
            site(2, "10.1.0.2", Some("b")),
            site(3, "10.2.0.1", Some("c")),
            site(4, "10.0.0.2", Some("a")),
        ];
        let (a, order) = choose(&p, 1 << 20, &me, &mixed).unwrap();
        assert!(matches!(a, RelayAlgorithm::Chain { .. }));
        assert_eq!(order, vec![9, 2, 1, 4, 3]);
        // Forced choices apply whatever the size; direct never relays.
        let forced = BroadcastPolicy {
            algorithm: BroadcastAlgorithm::Binomial,
            ..p
        };
        assert_eq!(
            choose(&forced, 10, &me, &mixed).unwrap().0,
            RelayAlgorithm::Binomial
        );
        let direct = BroadcastPolicy {
            algorithm: BroadcastAlgorithm::Direct,
            ..p
        };
        assert_eq!(choose(&direct, 16 << 20, &me, &mixed), None);
    }

    #[test]
    fn sites_parse_hosts() {
        assert_eq!(Site::new(1, "10.0.0.1:7000", None).host, "10.0.0.1");
        assert_eq!(Site::new(1, "[::1]:7000", None).host, "::1");
        assert_eq!(Site::new(1, "name", None).host, "name");
    }

    #[test]
    fn algorithms_parse() {
        assert_eq!(
            "chain".parse::<BroadcastAlgorithm>(),
            Ok(BroadcastAlgorithm::Chain)
        );
        assert!(
            "tree"
                .parse::<BroadcastAlgorithm>()
                .unwrap_err()
                .contains("auto")
        );
    }

    fn head(algorithm: RelayAlgorithm, peers: Vec<PeerId>, len: u32) -> RelayHead {
        RelayHead {
            src: 0,
            superstep: 1,
            tag: 0,
            len,
            algorithm,
            peers,
            dsts: vec![(1, 0), (2, 1), (3, 2)],
        }
    }

    #[test]
    fn heads_are_checked() {
        let ok = head(RelayAlgorithm::Symmetric, vec![1, 2, 3], 100);
        assert_eq!(check_head(&ok, 4, 2, 1), Ok(()));
        let mut bad = ok.clone();
        bad.src = 4;
        assert!(check_head(&bad, 4, 2, 1).is_err());
        let mut bad = ok.clone();
        bad.peers = vec![1, 2, 2];
        assert!(check_head(&bad, 4, 2, 1).is_err());
        assert!(check_head(&ok, 4, 7, 1).is_err(), "not in the list");
        let mut bad = ok.clone();
        bad.len = 0;
        assert!(check_head(&bad, 4, 2, 1).is_err());
        let mut bad = ok.clone();
        bad.dsts.push((9, 3));
        assert!(check_head(&bad, 4, 2, 1).is_err());
        let bad = head(RelayAlgorithm::Chain { chunk: 0 }, vec![1, 2, 3], 100);
        assert!(check_head(&bad, 4, 2, 1).is_err());
        let bad = head(RelayAlgorithm::Chain { chunk: 1000 }, vec![1, 2, 3], 100);
        assert!(check_head(&bad, 4, 2, 1).is_err(), "tiny chunks");
        assert!(current(&ok, &[1, 2, 3, 4]));
        assert!(!current(&ok, &[1, 2]), "peer 3 left the job");
        assert!(check_head(&ok, 4, 1, 2).is_err(), "this peer is the root");
    }

    /// Every algorithm delivers the payload to every peer when frames are
    /// handed around in an arbitrary order, and out-of-range bytes are errors.
    #[test]
    fn relays_deliver_the_payload() {
        let payload: Vec<u8> = (0..3_000_001u32).map(|i| (i * 31 % 251) as u8).collect();
        for algorithm in [
            RelayAlgorithm::Symmetric,
            RelayAlgorithm::Binomial,
            RelayAlgorithm::Chain { chunk: 100_000 },
        ] {
            let peers: Vec<PeerId> = vec![10, 11, 12, 13, 14];
            let h = head(algorithm, peers.clone(), payload.len() as u32);
            let (root, start) =
                Inflight::sending(h.clone(), 10, Bytes::from(payload.clone())).unwrap();
            let mut nodes: Vec<Inflight> = peers[1..]
                .iter()
                .map(|&p| Inflight::new(h.clone(), p).unwrap())
                .collect();
            let mut queue: Vec<(PeerId, Frame)> = Vec::new();
            for t in &start {
                let (to, frames) = root.frames(t).unwrap();
                queue.extend(frames.into_iter().map(|f| (to, f)));
            }
            let mut completed = 0;
            let mut k = 7usize;
            while !queue.is_empty() {
                k = (k * 1_103_515_245 + 12_345) % (1 << 31);
                let (to, f) = queue.swap_remove(k % queue.len());
                let Frame::Relay { offset, bytes, .. } = f else {
                    unreachable!()
                };
                let n = nodes
                    .iter_mut()
                    .find(|n| n.head.peers[n.node] == to)
                    .unwrap();
                let (due, done) = n.receive(offset, &bytes).unwrap();
                completed += usize::from(done);
                for t in &due {
                    let (to, frames) = n.frames(t).unwrap();
                    queue.extend(frames.into_iter().map(|f| (to, f)));
                }
            }
            assert_eq!(completed, 4, "{algorithm:?}");
            for n in &nodes {
                assert_eq!(n.payload().unwrap()[..], payload[..], "{algorithm:?}");
            }
        }
        let h = head(RelayAlgorithm::Symmetric, vec![1, 2, 3], 100);
        let mut n = Inflight::new(h, 2).unwrap();
        assert!(n.receive(90, &[0; 20]).is_err());
        assert!(n.receive(0, &[]).is_err());
        assert!(n.receive(u32::MAX, &[0; 2]).is_err());
    }
}
