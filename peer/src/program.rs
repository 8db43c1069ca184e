//! A job's program reaching its peers by Robber (den Burger and Kielmann,
//! "Collective receiver-initiated multicast for grid applications").
//!
//! What travels is the job's *bundle*: the program's bytes followed by the
//! job's resources (`bsp_api::control::encode_resources`), whose sizes and
//! hashes the assignment gives. When a job starts (its first assignment,
//! epoch 0) and the supernode told the program's size, the peers of the
//! assignment form one multicast: the
//! clusters are the peers' `--cluster` names (no name: one cluster of its
//! own kind), node `i` is `peers[i]`, the root is `peers[0]`. The root
//! downloads the program from the supernode (or has it cached); every
//! other peer steals pieces from the peers the protocol picked, local ones
//! first, and the collective of each cluster shares out the work of
//! fetching across the gateway (`collectives::Multicast`). A peer that
//! already has the program cached (and the job has no resources) joins as
//! a second source.
//!
//! Whatever goes wrong falls back to the direct download: a peer of the
//! multicast leaving the job, no new piece for [`STALL`], a peer breaking
//! the protocol, or bytes that do not hash to the program's (or the
//! resources') hash the supernode gave (a peer cannot slip in other code or
//! data). Peers that join a job later download directly.

use std::time::Duration;

use bsp_api::PeerId;
use bsp_api::control::JobAssignment;
use bsp_api::wire::{Frame, ProgramMsg};
use bytes::Bytes;
use collectives::{Algorithm, CollectiveError, Multicast, MulticastConfig, MulticastMsg, PeerNode};

/// Why a program distribution cannot go on; the peer then downloads the
/// program from the supernode itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    #[error("this peer is not in the job's peer list")]
    NotAPeer,
    #[error("the program and resources are too large")]
    TooLarge,
    #[error("cannot plan the program's distribution: {0}")]
    Plan(CollectiveError),
    #[error("this peer has no node in the program's distribution")]
    NoNode,
    #[error("the program does not match its announced size: {0}")]
    WrongSize(CollectiveError),
    #[error("too many program messages while downloading the program")]
    TooManyQueued,
    #[error("peer #{0} is not part of the program's distribution")]
    Stranger(PeerId),
    #[error("peer #{from} broke the program's distribution: {error}")]
    Broken {
        from: PeerId,
        error: CollectiveError,
    },
}

/// Bytes per piece.
pub const PIECE_BYTES: usize = 32 << 10;

/// No new piece for this long: download the program directly.
pub const STALL: Duration = Duration::from_secs(10);

/// Messages, and bytes of them, a root keeps while it waits for its own
/// download.
const MAX_QUEUED: usize = 1 << 14;
const MAX_QUEUED_BYTES: usize = 64 << 20;

/// This peer's part of distributing a job's program.
pub struct Distribution {
    pub epoch: u64,
    ids: Vec<PeerId>,
    node: PeerNode,
    seeded: bool,
    /// Messages that arrived before the root had the program.
    queue: Vec<(PeerId, ProgramMsg)>,
    queued_bytes: usize,
    /// Pieces received from other peers.
    pub received: usize,
    /// The peers pieces came from.
    pub sources: std::collections::BTreeSet<PeerId>,
}

/// Frames to send, with their destination.
pub type Out = Vec<(PeerId, Frame)>;

impl Distribution {
    /// Whether the job's program travels by Robber for this assignment.
    pub fn applies(a: &JobAssignment) -> bool {
        a.epoch == 0 && a.peers.len() >= 2 && a.program_bytes > 0
    }

    /// This peer's node, before any message.
    pub fn new(a: &JobAssignment, me: PeerId) -> Result<Distribution, ProgramError> {
        let ids: Vec<PeerId> = a.peers.iter().map(|p| p.id).collect();
        let me_index = ids
            .iter()
            .position(|&p| p == me)
            .ok_or(ProgramError::NotAPeer)?;
        let mut names: Vec<Option<&str>> = Vec::new();
        let mut clusters: Vec<Vec<usize>> = Vec::new();
        for (i, p) in a.peers.iter().enumerate() {
            let name = p.cluster.as_deref();
            match names.iter().position(|n| *n == name) {
                Some(c) => clusters[c].push(i),
                None => {
                    names.push(name);
                    clusters.push(vec![i]);
                }
            }
        }
        let len = a
            .program_bytes
            .checked_add(a.resources_bytes)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or(ProgramError::TooLarge)?;
        let config = MulticastConfig {
            clusters,
            root: 0,
            piece_size: PIECE_BYTES,
        };
        let node = Multicast::plan(Algorithm::Robber, config, len, a.seed)
            .map_err(ProgramError::Plan)?
            .into_node(me_index)
            .ok_or(ProgramError::NoNode)?;
        Ok(Distribution {
            epoch: a.epoch,
            ids,
            node,
            seeded: false,
            queue: Vec::new(),
            queued_bytes: 0,
            received: 0,
            sources: Default::default(),
        })
    }

    /// Whether this peer is the root (it downloads the program itself).
    pub fn is_root(&self) -> bool {
        self.node.id() == 0
    }

    /// Start without the program (not the root).
    pub fn start(&mut self) -> Out {
        let out = self.node.start();
        self.frames(out)
    }

    /// This peer has the program: serve it. A root starts only now, and
    /// handles what it was sent meanwhile.
    pub fn seed(&mut self, bytes: &[u8]) -> Result<Out, ProgramError> {
        if self.seeded {
            return Ok(Vec::new());
        }
        let was_started = !self.is_root();
        self.node
            .seed_data(bytes)
            .map_err(ProgramError::WrongSize)?;
        self.seeded = true;
        let mut out = Vec::new();
        if !was_started {
            out.extend(self.node.start());
        }
        let mut frames = self.frames(out);
        self.queued_bytes = 0;
        for (from, msg) in std::mem::take(&mut self.queue) {
            frames.extend(self.on_msg(from, msg)?);
        }
        Ok(frames)
    }

    /// A message from `from`. An error means the distribution is void.
    pub fn on_msg(&mut self, from: PeerId, msg: ProgramMsg) -> Result<Out, ProgramError> {
        if self.is_root() && !self.seeded {
            let size = match &msg {
                ProgramMsg::Desire(b) | ProgramMsg::Bitfield(b) | ProgramMsg::Work(b) => b.len(),
                ProgramMsg::Piece { data, .. } => data.len(),
                _ => 0,
            } + 16;
            if self.queue.len() >= MAX_QUEUED || self.queued_bytes + size > MAX_QUEUED_BYTES {
                return Err(ProgramError::TooManyQueued);
            }
            self.queued_bytes += size;
            self.queue.push((from, msg));
            return Ok(Vec::new());
        }
        let index = self
            .ids
            .iter()
            .position(|&p| p == from)
            .ok_or(ProgramError::Stranger(from))?;
        let is_piece = matches!(msg, ProgramMsg::Piece { .. });
        let had = self.node.has_all();
        let out = self
            .node
            .handle(index, from_wire(msg))
            .map_err(|error| ProgramError::Broken { from, error })?;
        if is_piece && !had {
            self.received += 1;
            self.sources.insert(from);
        }
        Ok(self.frames(out))
    }

    /// Whether this peer holds every piece.
    pub fn has_all(&self) -> bool {
        self.node.has_all()
    }

    /// The bundle, once every piece is here.
    pub fn data(&self) -> Option<Vec<u8>> {
        self.node.data()
    }

    /// Whether `peer` takes part.
    pub fn involves(&self, peer: PeerId) -> bool {
        self.ids.contains(&peer)
    }

    fn frames(&self, out: collectives::Outgoing) -> Out {
        out.into_iter()
            .filter_map(|(to, msg)| {
                let peer = *self.ids.get(to)?;
                Some((
                    peer,
                    Frame::Program {
                        epoch: self.epoch,
                        msg: to_wire(msg),
                    },
                ))
            })
            .collect()
    }
}

fn to_wire(m: MulticastMsg) -> ProgramMsg {
    match m {
        MulticastMsg::Desire(b) => ProgramMsg::Desire(b),
        MulticastMsg::Bitfield(b) => ProgramMsg::Bitfield(b),
        MulticastMsg::Have(i) => ProgramMsg::Have(i as u32),
        MulticastMsg::Request(i) => ProgramMsg::Request(i as u32),
        MulticastMsg::Piece { index, data } => ProgramMsg::Piece {
            index: index as u32,
            data: Bytes::from(data),
        },
        MulticastMsg::Steal => ProgramMsg::Steal,
        MulticastMsg::Work(b) => ProgramMsg::Work(b),
        MulticastMsg::FoundWork => ProgramMsg::FoundWork,
        MulticastMsg::Done => ProgramMsg::Done,
        MulticastMsg::Stop => ProgramMsg::Stop,
    }
}

fn from_wire(m: ProgramMsg) -> MulticastMsg {
    match m {
        ProgramMsg::Desire(b) => MulticastMsg::Desire(b),
        ProgramMsg::Bitfield(b) => MulticastMsg::Bitfield(b),
        ProgramMsg::Have(i) => MulticastMsg::Have(i as usize),
        ProgramMsg::Request(i) => MulticastMsg::Request(i as usize),
        ProgramMsg::Piece { index, data } => MulticastMsg::Piece {
            index: index as usize,
            data: data.to_vec(),
        },
        ProgramMsg::Steal => MulticastMsg::Steal,
        ProgramMsg::Work(b) => MulticastMsg::Work(b),
        ProgramMsg::FoundWork => MulticastMsg::FoundWork,
        ProgramMsg::Done => MulticastMsg::Done,
        ProgramMsg::Stop => MulticastMsg::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bsp_api::control::JobPeer;
    use bsp_api::rest::JobLimits;

    fn assignment(clusters: &[&str], len: usize) -> JobAssignment {
        JobAssignment {
            job: 1,
            program_hash: String::new(),
            nprocs: 1,
            args: "null".into(),
            seed: 3,
            limits: JobLimits::default(),
            job_token: String::new(),
            placement: vec![0],
            peers: clusters
                .iter()
                .enumerate()
                .map(|(i, c)| JobPeer {
                    id: 50 + i as PeerId,
                    addr: format!("10.0.0.{i}:1"),
                    cluster: Some(c.to_string()),
                })
                .collect(),
            resources: vec![],
            epoch: 0,
            restore: vec![],
            migrate: vec![],
            program_bytes: len as u64,
            resources_hash: String::new(),
            resources_bytes: 0,
        }
    }

    /// Every peer ends with the program, whatever order frames arrive in,
    /// with the root answering late (its download) and a peer that had it
    /// cached; through the wire encoding.
    #[test]
    fn every_peer_gets_the_program() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        let a = assignment(&["a", "a", "b", "b", "b", "c", "c", "a"], data.len());
        let mut nodes: Vec<Distribution> = a
            .peers
            .iter()
            .map(|p| Distribution::new(&a, p.id).unwrap())
            .collect();
        assert!(nodes[0].is_root() && !nodes[1].is_root());
        let mut queue: Vec<(PeerId, PeerId, Frame)> = Vec::new();
        for n in nodes.iter_mut().skip(1) {
            let me = n.ids[n.node.id()];
            if me == 56 {
                // Cached: a second source.
                queue.extend(
                    n.seed(&data)
                        .unwrap()
                        .into_iter()
                        .map(|(to, f)| (me, to, f)),
                );
            } else {
                queue.extend(n.start().into_iter().map(|(to, f)| (me, to, f)));
            }
        }
        let mut k = 11usize;
        let mut steps = 0;
        while !queue.is_empty() {
            steps += 1;
            if steps == 40 {
                // The root's download finishes.
                let out = nodes[0].seed(&data).unwrap();
                queue.extend(out.into_iter().map(|(to, f)| (50, to, f)));
            }
            k = (k * 1_103_515_245 + 12_345) % (1 << 31);
            let (from, to, f) = queue.swap_remove(k % queue.len());
            let bytes = postcard::to_allocvec(&f).unwrap();
            let Frame::Program { msg, .. } = postcard::from_bytes(&bytes).unwrap() else {
                panic!("not a program frame")
            };
            let n = nodes.iter_mut().find(|n| n.ids[n.node.id()] == to).unwrap();
            queue.extend(
                n.on_msg(from, msg)
                    .unwrap()
                    .into_iter()
                    .map(|(t, f)| (to, t, f)),
            );
        }
        for n in &nodes {
            assert_eq!(n.data().as_deref(), Some(&data[..]), "node {}", n.node.id());
        }
        let received: usize = nodes.iter().map(|n| n.received).sum();
        assert!(received >= 6 * data.len().div_ceil(PIECE_BYTES));
    }

    #[test]
    fn strangers_and_bad_messages_void_the_distribution() {
        let a = assignment(&["a", "b"], 100_000);
        let mut n = Distribution::new(&a, 51).unwrap();
        let _ = n.start();
        assert_eq!(
            n.on_msg(99, ProgramMsg::Done).unwrap_err(),
            ProgramError::Stranger(99)
        );
        assert!(matches!(
            n.on_msg(50, ProgramMsg::Request(1)),
            Err(ProgramError::Broken { from: 50, .. })
        ));
        assert!(n.on_msg(50, ProgramMsg::Desire(vec![true])).is_err());
        assert!(matches!(
            Distribution::new(&a, 7),
            Err(ProgramError::NotAPeer)
        ));
        let mut root = Distribution::new(&a, 50).unwrap();
        assert!(root.seed(&[0; 10]).is_err(), "wrong size");
        let mut late = assignment(&["a", "b"], 100_000);
        late.epoch = 3;
        assert!(!Distribution::applies(&late));
        assert!(Distribution::applies(&a));
    }
}
