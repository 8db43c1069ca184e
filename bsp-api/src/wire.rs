//! The peer ↔ peer data plane.
//!
//! Each peer has one TCP listener. For each job, a peer opens one connection
//! to every other peer of the job and sends [`Frame`]s on it, each encoded with
//! postcard inside a 4-byte big-endian length prefix (tokio-util's
//! `LengthDelimitedCodec`), at most [`MAX_FRAME_BYTES`] long.
//!
//! The first frame on a connection is [`Frame::Hello`]; the listener answers
//! [`Frame::Welcome`] if the token matches the one the supernode gave it for
//! that job and the sender is one of the job's peers, and [`Frame::Reject`]
//! (then closes) otherwise. A peer that has not yet received the job's
//! assignment rejects with [`RejectReason::UnknownJob`]; the sender retries
//! with backoff until its connect deadline.
//!
//! **Barrier with counts** (DESIGN.md, Execution 4): when all local processes
//! of a job reached sync `s`, a peer sends every other peer of the job its
//! [`Frame::Data`] frames of superstep `s`, then `Marker { superstep: s,
//! frames: k }` where `k` counts those data frames. A peer passes barrier `s`
//! once it holds a marker for `s` from every other peer and all the frames
//! counted. [`Frame::Finished`] is a marker that also says "all my processes
//! of this job have returned; count me as present at every later barrier".

use serde::{Deserialize, Serialize};

use crate::{JobId, PeerId, Pid};

/// Version of the data-plane protocol carried in [`Frame::Hello`].
pub const WIRE_VERSION: u32 = 1;

/// Largest frame either side accepts.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// Largest single message payload a process may send.
pub const MAX_MESSAGE_BYTES: usize = 8 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Frame {
    Hello {
        version: u32,
        job: JobId,
        from: PeerId,
        token: String,
    },
    Welcome,
    Reject {
        reason: RejectReason,
        message: String,
    },
    /// Messages sent during `superstep`, to be read in `superstep + 1`.
    Data {
        superstep: u32,
        messages: Vec<WireMessage>,
    },
    Marker {
        superstep: u32,
        frames: u32,
    },
    Finished {
        superstep: u32,
        frames: u32,
    },
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum RejectReason {
    /// The listener has no assignment for this job (yet); retry.
    UnknownJob,
    /// The token does not match, or the sender is not a peer of the job.
    NotAuthorized,
    /// The protocol version is not supported.
    Version,
    /// The first frame was not a `Hello`.
    Protocol,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WireMessage {
    pub src: Pid,
    pub dst: Pid,
    /// Position of the message among everything `src` sent in this superstep.
    pub seq: u32,
    pub payload: Vec<u8>,
}
