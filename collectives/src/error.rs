//! The error type of the collectives crate.

use crate::topology::NodeId;

/// Why a schedule, a plan or a simulation could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// A broadcast among zero nodes.
    #[error("a broadcast needs at least one node (the root); got 0 nodes")]
    NoNodes,
    /// The root rank is not one of the `nodes` ranks.
    #[error("root {root} is not a rank of a {nodes}-node broadcast; use a root in 0..{nodes}")]
    RootOutOfRange {
        /// The rejected root.
        root: usize,
        /// The number of nodes.
        nodes: usize,
    },
    /// A chunk size of zero for a pipelined schedule.
    #[error("chunk size 0 would never finish; use a chunk size of at least 1 byte")]
    ZeroChunk,
    /// A node id that is not in the topology.
    #[error("node {0:?} is not in the topology; add it with add_host or add_switch first")]
    UnknownNode(NodeId),
    /// A link whose capacity is zero.
    #[error("link {a:?}–{b:?} has capacity 0; leave the link out instead")]
    ZeroCapacity {
        /// One end.
        a: NodeId,
        /// The other end.
        b: NodeId,
    },
    /// A link that would close a cycle (or connect a node to itself).
    #[error(
        "link {a:?}–{b:?} would close a cycle; the topology must be a tree (merge a loop of fast links into one switch)"
    )]
    Cycle {
        /// One end.
        a: NodeId,
        /// The other end.
        b: NodeId,
    },
    /// The source or a destination is a switch.
    #[error("node {0:?} is a switch; only hosts can be a broadcast's source or destination")]
    NotAHost(NodeId),
    /// A destination listed twice, or the source listed as a destination.
    #[error("node {0:?} is listed twice (or is the source); list each destination once")]
    DuplicateDestination(NodeId),
    /// A destination that no link path connects to the source.
    #[error("destination {0:?} is not connected to the source; connect it or drop it")]
    Unreachable(NodeId),
    /// A transfer tree edge whose sender has not been reached in that tree.
    #[error(
        "tree {tree}: {from:?} sends before it receives; list a tree's edges parent before child"
    )]
    MalformedTree {
        /// Index of the tree in the plan.
        tree: usize,
        /// The sender of the bad edge.
        from: NodeId,
    },
    /// Algorithm 2 needs nested destination sets `N(t_n) ⊂ … ⊂ N(t_1)`.
    #[error(
        "tree {tree} reaches a destination that tree {} does not; staged sending (Algorithm 2) needs nested trees",
        tree - 1
    )]
    NotNested {
        /// The first tree that is not a subset of its predecessor.
        tree: usize,
    },
    /// The data given to the simulator has another length than the schedule.
    #[error("the schedule broadcasts {expected} bytes but the data has {got}; pass the same data")]
    LengthMismatch {
        /// `Schedule::len`.
        expected: usize,
        /// `data.len()`.
        got: usize,
    },
    /// A transfer outside the data.
    #[error("step {step}: transfer {from} → {to} of bytes {start}..{end} lies outside the data")]
    RangeOutOfBounds {
        /// The step.
        step: usize,
        /// Sender.
        from: usize,
        /// Receiver.
        to: usize,
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
    },
    /// A transfer whose sender did not hold the bytes at the start of the step.
    #[error(
        "step {step}: {from} sends byte {byte} to {to} before holding it; a step's transfers may only forward data held when the step begins"
    )]
    SendsUnheldData {
        /// The step.
        step: usize,
        /// Sender.
        from: usize,
        /// Receiver.
        to: usize,
        /// The first byte the sender lacked.
        byte: usize,
    },
    /// A multicast cluster with no nodes.
    #[error("cluster {0} is empty; every cluster needs at least one node")]
    EmptyCluster(usize),
    /// A node id listed twice in a multicast's clusters.
    #[error("node {0} is listed twice in the clusters; list each node in exactly one cluster")]
    DuplicateMember(usize),
    /// The multicast root is not a member of any cluster.
    #[error("root {0} is not in any cluster; add it to the cluster it belongs to")]
    RootNotMember(usize),
    /// A simulated multicast stopped making progress, or exceeded its
    /// message budget, before every node finished.
    #[error("the multicast stalled after {messages} messages with {unfinished} node(s) unfinished")]
    MulticastStalled {
        /// Messages delivered before the simulator gave up.
        messages: usize,
        /// Nodes that had not finished.
        unfinished: usize,
    },
    /// A node sent a message to a peer after sending it 'stop' (§3.1
    /// phase 4: 'stop' is the last message on a connection).
    #[error("node {from} sent a message to {to} after 'stop'")]
    MessageAfterStop {
        /// Sender.
        from: usize,
        /// Receiver.
        to: usize,
    },
    /// A multicast message from a node that is not one of the receiver's
    /// peers.
    #[error("node {node} got a message from {from}, which is not one of its peers")]
    UnknownPeer {
        /// The receiver.
        node: usize,
        /// The claimed sender.
        from: usize,
    },
    /// A multicast message naming a piece index outside `0..P`.
    #[error("piece index {index} is out of range; the data has {pieces} pieces")]
    PieceOutOfRange {
        /// The rejected index.
        index: usize,
        /// `P`.
        pieces: usize,
    },
    /// A 'desire', 'bitfield' or 'work' bit list whose length is not `P`.
    #[error("a '{kind}' bit list has {got} entries; it needs one per piece ({pieces})")]
    BitListLength {
        /// The message kind.
        kind: &'static str,
        /// The list's length.
        got: usize,
        /// `P`.
        pieces: usize,
    },
    /// A 'request' for a piece the receiver does not hold.
    #[error("node {node} was asked for piece {index}, which it does not hold")]
    PieceNotHeld {
        /// The receiver.
        node: usize,
        /// The requested piece.
        index: usize,
    },
    /// A 'piece' whose data has another length than the piece.
    #[error("piece {index} carries {got} bytes but the piece has {expected}")]
    PieceLength {
        /// The piece index.
        index: usize,
        /// The piece's length (`piece_size`, the last one possibly shorter).
        expected: usize,
        /// The bytes received.
        got: usize,
    },
    /// Data seeded into a multicast node with another length than planned.
    #[error(
        "the multicast was planned for {expected} bytes but the data has {got}; plan with the data's length"
    )]
    DataLength {
        /// The planned length.
        expected: usize,
        /// `data.len()`.
        got: usize,
    },
    /// A relay for a node that neither is the schedule's root or a
    /// destination nor sends or receives any of its transfers.
    #[error(
        "node {0} takes no part in the schedule; relay only the root, destinations and transfer ends"
    )]
    NotInSchedule(usize),
    /// An empty byte range reported to a relay.
    #[error("byte range {start}..{end} is empty; report at least one byte")]
    EmptyByteRange {
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
    },
    /// A byte range reported to a relay that lies outside the data.
    #[error("byte range {start}..{end} lies outside the {len}-byte data")]
    BytesOutOfRange {
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
        /// The data's length.
        len: usize,
    },
}
