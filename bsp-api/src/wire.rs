//! The peer ↔ peer data plane.
//!
//! Each peer has one TCP listener. For each job, a peer opens one connection
//! to every other peer of the job and sends [`Frame`]s on it, each encoded with
//! postcard inside a 4-byte big-endian length prefix (tokio-util's
//! `LengthDelimitedCodec`), at most [`MAX_FRAME_BYTES`] long.
//!
//! The first frame on a connection is [`Frame::Hello`]: the job id in the
//! clear and the first message of a Noise handshake under the job's key
//! (derived from the token the supernode issues per job; the token itself
//! never travels here), whose encrypted payload is a [`HelloPayload`]. The
//! listener answers [`Frame::Answer`], the second handshake message, whose
//! payload is [`Frame::Welcome`] if the sender is one of the job's peers and
//! [`Frame::Reject`] otherwise. A listener that cannot try the handshake
//! answers a plain [`Frame::Reject`] and closes: a peer that has not yet
//! received the job's assignment with [`RejectReason::UnknownJob`] (the
//! sender retries with backoff until its connect deadline), a handshake that
//! does not decrypt under the job's key with [`RejectReason::NotAuthorized`].
//! From then on the connection carries encrypted records, and the frames
//! below travel inside them (`peer/src/noise.rs`, SECURITY.md).
//!
//! **Process-level barrier** (docs/fault-tolerance.md): after superstep `s`,
//! every process `Q` is announced to every peer of the job with
//! [`Frame::Done`], which counts the messages `Q` sent in `s` to each pid the
//! receiving peer hosts, after those [`Frame::Data`] frames on the same
//! connection. A process passes barrier `s` on its host once the host holds
//! `Done(Q, s)` from every process of the job and all the messages to it they
//! count. Messages are identified by `(src, superstep, seq)`; receivers drop
//! repeats, so a restored process that re-executes, or a peer that re-sends
//! what it retained, is harmless.
//!
//! **One payload, many destinations.** A `send_range` or `send_list` queues
//! one message per destination that all share one payload ([`bytes::Bytes`]).
//! Every list of messages on the wire ([`Frame::Data`], a checkpoint's
//! outbox) is encoded as groups: consecutive messages from one source and
//! superstep whose payloads are the same buffer travel as one payload with
//! their `(dst, seq)` pairs, so a peer hosting four destinations receives a
//! broadcast once, not four times. Large multicasts to several peers are
//! relayed instead ([`Frame::Relay`]): the sending peer picks a broadcast
//! schedule among the destination peers and every peer forwards the byte
//! ranges the schedule gives it as soon as it holds them.
//!
//! **The program** of a job reaches its peers by Robber ([`Frame::Program`]):
//! the first peer of the job's first assignment downloads it from the
//! supernode, the others steal its pieces from each other, cluster by
//! cluster; a peer that makes no progress downloads it directly.
//!
//! **Checkpoints** travel on the same connections: [`Frame::Checkpoint`] from
//! a process's host to its replicas, answered by [`Frame::CheckpointAck`] or
//! in the `acks` of the replica's next [`Frame::Done`] to the host;
//! [`Frame::FetchCheckpoint`] from a process's new host, answered by
//! [`Frame::Snapshot`].

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{JobId, PeerId, Pid};

/// Version of the data-plane protocol carried in [`Frame::Hello`]. 5:
/// checkpoints carry every mutable global in index order (was: the
/// exported ones in export order). 7: the Noise handshake and encrypted
/// records (was: a clear `Hello` showing the job token). 8: `ProcDone`'s
/// state digest (redundancy). 9: `FetchCheckpoint` names the asker's epoch.
/// 10: checkpoint deltas carry page and payload patches ([`PAGE_PATCH`],
/// [`Checkpoint::patched`]). 11: a patch may be XOR-packed (marker
/// `0xff 0xff`: a byte width per 16 words, then each word's changed low
/// bytes). 12: [`Frame::Done`] carries the sender's acknowledgements of
/// checkpoints (`acks`), and a `Done` waits only for the checkpoints two
/// supersteps back. 13: a page's hash in a checkpoint's content hash is
/// over its 4 KiB leaves' hashes (`bspweb-checkpoint-v6`).
pub const WIRE_VERSION: u32 = 13;

/// Largest frame either side accepts.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// Largest single message payload a process may send.
pub const MAX_MESSAGE_BYTES: usize = 8 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Frame {
    /// The first frame of a data-plane connection, in the clear.
    Hello {
        version: u32,
        /// The job whose key the handshake is under (bound into the Noise
        /// prologue, so it cannot be changed on the way).
        job: JobId,
        /// Noise message 1 (`psk, e`); its payload is a [`HelloPayload`].
        #[serde(with = "shared_bytes")]
        handshake: Bytes,
    },
    /// The payload of the listener's [`Frame::Answer`] when it admits the
    /// sender.
    Welcome,
    Reject {
        reason: RejectReason,
        message: String,
    },
    /// Messages, each to be read in the superstep after the one it was sent
    /// in. Receivers drop repeats by `(src, superstep, seq)`.
    Data {
        #[serde(with = "message_groups")]
        messages: Vec<WireMessage>,
    },
    /// These processes are through `superstep`, and every message they sent
    /// in it to pids on the receiving peer precedes this frame.
    Done {
        superstep: u32,
        procs: Vec<ProcDone>,
        /// `(pid, superstep)`: the sender holds `pid`'s checkpoint of
        /// `superstep`, as a [`Frame::CheckpointAck`] with `ok` would say
        /// (a replica's acknowledgements ride with its next `Done` to the
        /// checkpoint's owner instead of taking a write of their own).
        acks: Vec<(Pid, u32)>,
    },
    /// Part of the [`Frame::Checkpoint`] or [`Frame::Snapshot`] for the same
    /// `(pid, superstep)` that follows on this connection: more pages and
    /// outbox messages, so a checkpoint of any size fits in frames of at most
    /// [`MAX_FRAME_BYTES`].
    CheckpointPart {
        pid: Pid,
        superstep: u32,
        #[serde(with = "byte_pages")]
        pages: Vec<(u32, Bytes)>,
        #[serde(with = "message_groups")]
        outbox: Vec<WireMessage>,
        /// Indices into this frame's `outbox` of the messages whose payload
        /// is a patch, as in [`Checkpoint::patched`].
        patched: Vec<u32>,
    },
    /// A process's checkpoint, from its host to one of its replicas (the
    /// last frame of it; earlier parts come as [`Frame::CheckpointPart`]).
    Checkpoint(Box<Checkpoint>),
    /// A replica's answer to [`Frame::Checkpoint`]. `ok = false`: the replica
    /// lacks the base or the result did not match the hash; send it whole.
    CheckpointAck { pid: Pid, superstep: u32, ok: bool },
    /// The sender now hosts `pid` in its `epoch`: send it your newest
    /// whole snapshot.
    FetchCheckpoint { pid: Pid, epoch: u64 },
    /// Answer to [`Frame::FetchCheckpoint`]; `None` if the sender holds none.
    Snapshot {
        pid: Pid,
        snapshot: Option<Box<Checkpoint>>,
    },
    /// Bytes `offset..offset + bytes.len()` of the payload of a relayed
    /// multicast. Each peer of `head.peers` forwards what the schedule of
    /// `head.algorithm` gives it as soon as it holds those bytes, and once
    /// it holds the whole payload delivers the messages to the pids it
    /// hosts.
    Relay {
        head: Box<RelayHead>,
        offset: u32,
        #[serde(with = "shared_bytes")]
        bytes: Bytes,
    },
    /// Robber (den Burger and Kielmann) spreading the job's program among
    /// the peers of its first assignment (`epoch`), so that only one of them
    /// downloads it from the supernode.
    Program { epoch: u64, msg: ProgramMsg },
    /// A link measurement ([`crate::probe`]): a connection of its own,
    /// opened with [`ProbeFrame::Hello`] instead of [`Frame::Hello`].
    Probe(ProbeFrame),
    /// The listener's answer to [`Frame::Hello`], in the clear: Noise
    /// message 2 (`e, ee`), whose payload is the encoded [`Frame::Welcome`]
    /// or [`Frame::Reject`].
    Answer {
        #[serde(with = "shared_bytes")]
        handshake: Bytes,
    },
}

/// What [`Frame::Hello`]'s handshake carries, encrypted under the job's key.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HelloPayload {
    pub from: PeerId,
    /// The sender's assignment epoch for the job. A listener that holds a
    /// newer epoch in which the sender is no longer a peer refuses it.
    pub epoch: u64,
}

/// The frames of a link measurement, in order: `Hello` → `Ready` (or
/// [`Frame::Reject`]); `Ping(i)` → `Pong(i)`, a few times; `Bulk` →
/// `Received`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum ProbeFrame {
    Hello {
        version: u32,
        from: PeerId,
        to: PeerId,
        expires_ms: i64,
        ticket: String,
    },
    Ready,
    Ping(u32),
    Pong(u32),
    Bulk(#[serde(with = "shared_bytes")] Bytes),
    /// The bulk's length, once all of it arrived.
    Received(u32),
}

/// The messages of Robber's Table 1 (`collectives::MulticastMsg`); bit
/// lists have one entry per piece of the program.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum ProgramMsg {
    Desire(Vec<bool>),
    Bitfield(Vec<bool>),
    Have(u32),
    Request(u32),
    Piece {
        index: u32,
        #[serde(with = "shared_bytes")]
        data: Bytes,
    },
    Steal,
    Work(Vec<bool>),
    FoundWork,
    Done,
    Stop,
}

/// What identifies a relayed multicast and how it travels; the same in
/// every frame of it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RelayHead {
    pub src: Pid,
    /// The superstep in which `src` sent the messages.
    pub superstep: u32,
    /// The messages' tag ([`WireMessage::tag`]).
    pub tag: u32,
    /// The payload's length in bytes.
    pub len: u32,
    pub algorithm: RelayAlgorithm,
    /// The peers taking part, as the schedule's nodes: `peers[0]` is the
    /// sender's host (the schedule's root), the others host destinations.
    pub peers: Vec<PeerId>,
    /// `(dst, seq)` of every message of the multicast, in send order. The
    /// multicast is named by `(src, superstep, dsts[0].1)`.
    pub dsts: Vec<(Pid, u32)>,
}

/// The broadcast schedule of a relayed multicast (`collectives`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub enum RelayAlgorithm {
    /// Juhász's symmetric broadcast: scatter one piece to every peer, each
    /// forwards its piece to all others.
    Symmetric,
    /// A binomial tree.
    Binomial,
    /// A pipelined chain in `peers` order, in chunks of `chunk` bytes.
    Chain { chunk: u32 },
}

/// One process in a [`Frame::Done`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcDone {
    pub pid: Pid,
    /// The process returned from `main` in this superstep: count it as done
    /// at every later barrier.
    pub exited: bool,
    /// `(dst, n)`: `pid` sent `n` messages to `dst` in the superstep, for
    /// every destination (not only the receiver's pids: placement may change
    /// before they are read). Destinations with no message are left out.
    pub counts: Vec<(Pid, u32)>,
    /// With redundancy, at a checkpointed superstep: the BLAKE3 digest of
    /// the process's state at its end (the checkpoint's content without
    /// the outbox, which differs between hosts), so copies on different
    /// peers can be compared. `None` otherwise.
    pub digest: Option<[u8; 32]>,
}

/// A page entry of a checkpoint whose index has this bit set is a *patch* of
/// page `index & !PAGE_PATCH` of the delta's base, not the page: runs of
/// 8-byte words, each a 4-byte header (first word and number of words, two
/// little-endian `u16`s; at least one word, inside the page's 8 192) and the
/// words, in ascending order without overlap; or XOR-packed, after the
/// marker `0xff 0xff` (`peer/src/checkpoint/patch.rs`). Only a delta
/// carries patches.
pub const PAGE_PATCH: u32 = 1 << 31;

/// A process's state at the end of a superstep (docs/fault-tolerance.md).
///
/// Whole (`base == None`): `pages` holds every page of linear memory that is
/// not all zeros. Delta (`base == Some(b)`): `pages` holds the pages that
/// differ from the snapshot of superstep `b` the replica holds, each whole
/// or as a patch of the base's page ([`PAGE_PATCH`]). Either way
/// `hash` is the SHA-256 of the whole state's canonical encoding, so the
/// receiver can check what it rebuilt.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Checkpoint {
    pub pid: Pid,
    pub superstep: u32,
    pub base: Option<u32>,
    /// Size of linear memory in bytes (a multiple of the 64 KiB wasm page).
    pub memory_len: u64,
    /// `(index, bytes)` of 64 KiB pages, ascending by index (together with
    /// the pages of the preceding [`Frame::CheckpointPart`]s).
    #[serde(with = "byte_pages")]
    pub pages: Vec<(u32, Bytes)>,
    /// Values of the module's mutable globals, in index order, as raw bits.
    pub globals: Vec<u64>,
    /// Sequence number of the process's next output record.
    pub output_seq: u64,
    /// Output bytes the process wrote so far.
    pub output_bytes: u64,
    /// The process returned from `main` in this superstep.
    pub exited: bool,
    /// The messages the process sent in the supersteps its host still
    /// retained when it took the checkpoint, this one included (after those
    /// of the preceding [`Frame::CheckpointPart`]s), by superstep and send
    /// order. A new host re-sends them after a restore. In a delta, only
    /// those sent after superstep `base`: the rest the replica has already.
    #[serde(with = "message_groups")]
    pub outbox: Vec<WireMessage>,
    /// In a delta: the replica keeps its base's outbox messages of
    /// supersteps `outbox_from..=base` (older ones left the retention
    /// window) and appends `outbox`. 0 in a whole checkpoint.
    pub outbox_from: u32,
    /// In a delta: indices into this frame's `outbox`, ascending, of the
    /// messages whose payload is a *patch* of their reference's payload
    /// (`peer/src/checkpoint/patch.rs`, `diff_payload`). The reference of a
    /// message is the message the replica keeps (of supersteps
    /// `outbox_from..=base`) with the same destination and sequence number,
    /// of the newest such superstep: the same send in an earlier superstep.
    /// The patched payload has the reference's length. Empty in a whole
    /// checkpoint.
    pub patched: Vec<u32>,
    pub hash: [u8; 32],
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum RejectReason {
    /// The listener has no assignment for this job (yet); retry.
    UnknownJob,
    /// The handshake did not decrypt under the job's key (a plain reject),
    /// or the sender is not a peer of the job (inside [`Frame::Answer`]).
    NotAuthorized,
    /// The protocol version is not supported.
    Version,
    /// The first frame was not a `Hello`.
    Protocol,
    /// Sent on a welcomed connection just before the listener closes it
    /// because the job ended on its peer (finished or killed): nothing sent
    /// to it any more matters, so the sender does not reconnect.
    JobEnded,
    /// A probe the listener will not take now (its volunteer's cap on probe
    /// traffic is spent, or it is measuring another link); try later.
    Busy,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WireMessage {
    pub src: Pid,
    pub dst: Pid,
    /// The superstep in which `src` sent it; `dst` reads it in the next one.
    pub superstep: u32,
    /// Position of the message among everything `src` sent in this superstep.
    pub seq: u32,
    /// What kind of message it is, as the guest said (`set_tag`); 0: none.
    pub tag: u32,
    #[serde(with = "shared_bytes")]
    pub payload: Bytes,
}

/// Decoding a serde byte string into a `Vec<u8>`, also from a sequence of
/// `u8` (what a self-describing format such as JSON writes): the fallback
/// of [`shared_bytes`]. Postcard writes a byte string exactly as it writes
/// a sequence of `u8` (a varint length, then the bytes), but in one piece.
mod byte_string {
    use serde::Deserializer;
    use serde::de::{Error, SeqAccess, Visitor};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        d.deserialize_byte_buf(ByteBuf)
    }

    struct ByteBuf;

    impl<'de> Visitor<'de> for ByteBuf {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a byte string")
        }

        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }

        fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }

        // Self-describing formats (JSON) hand over a sequence of numbers.
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
            while let Some(b) = seq.next_element()? {
                v.push(b);
            }
            Ok(v)
        }
    }
}

thread_local! {
    /// The buffer being decoded by [`decode_sharing`] on this thread.
    static SOURCE: std::cell::RefCell<Option<Bytes>> = const { std::cell::RefCell::new(None) };
}

/// Run `decode` (a deserializer over `source`'s bytes) so that every
/// [`Bytes`] payload it decodes is a slice of `source` rather than a copy:
/// a received 8 MiB message is not copied again on its way to the inbox.
/// (The payloads keep `source` alive as long as any of them lives.)
pub fn decode_sharing<R>(source: &Bytes, decode: impl FnOnce(&[u8]) -> R) -> R {
    let previous = SOURCE.with(|s| s.replace(Some(source.clone())));
    let result = decode(source);
    SOURCE.with(|s| *s.borrow_mut() = previous);
    result
}

/// [`Bytes`] as a serde byte string, like [`byte_string`]. Decoding
/// borrows from the buffer [`decode_sharing`] decodes, or takes over the
/// decoded buffer, and copies only when neither is possible.
mod shared_bytes {
    use bytes::Bytes;
    use serde::de::{Error, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        d.deserialize_bytes(Shared)
    }

    struct Shared;

    impl<'de> Visitor<'de> for Shared {
        type Value = Bytes;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a byte string")
        }

        fn visit_borrowed_bytes<E: Error>(self, v: &'de [u8]) -> Result<Bytes, E> {
            let sliced = super::SOURCE.with(|s| {
                let s = s.borrow();
                let src = s.as_ref()?;
                let (lo, hi) = (src.as_ptr() as usize, src.as_ptr() as usize + src.len());
                let (a, b) = (v.as_ptr() as usize, v.as_ptr() as usize + v.len());
                (lo <= a && b <= hi).then(|| src.slice_ref(v))
            });
            Ok(sliced.unwrap_or_else(|| Bytes::copy_from_slice(v)))
        }

        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Bytes, E> {
            Ok(Bytes::copy_from_slice(v))
        }

        fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
            Ok(Bytes::from(v))
        }

        // Self-describing formats (JSON) hand over a sequence of numbers.
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Bytes, A::Error> {
            super::byte_string::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                .map(Bytes::from)
        }
    }
}

/// `Vec<WireMessage>` as groups of messages that share one payload: runs of
/// consecutive messages with the same source and superstep whose payloads
/// are the same buffer (as `send_range` and `send_list` make them) are
/// written as the payload once and their `(dst, seq)` pairs. Decoding gives
/// the messages back, each group's sharing one buffer.
pub mod message_groups {
    use bytes::Bytes;
    use serde::de::{Error as _, SeqAccess, Visitor};
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::WireMessage;

    /// Most messages one decoded list may expand to (a group names its
    /// payload once, so a small frame could otherwise claim millions).
    pub const MAX_MESSAGES: usize = 1 << 20;
    use crate::Pid;

    #[derive(Serialize)]
    struct GroupRef<'a> {
        src: Pid,
        superstep: u32,
        tag: u32,
        #[serde(with = "super::shared_bytes")]
        payload: &'a Bytes,
        dsts: Vec<(Pid, u32)>,
    }

    #[derive(Deserialize)]
    struct Group {
        src: Pid,
        superstep: u32,
        tag: u32,
        #[serde(with = "super::shared_bytes")]
        payload: Bytes,
        dsts: Vec<(Pid, u32)>,
    }

    /// Whether `a` and `b` are one buffer (not merely equal bytes).
    pub fn same_buffer(a: &Bytes, b: &Bytes) -> bool {
        a.len() == b.len() && a.as_ptr() == b.as_ptr()
    }

    /// The runs of `messages` that travel as one group.
    pub fn runs(messages: &[WireMessage]) -> impl Iterator<Item = &[WireMessage]> {
        messages.chunk_by(|a, b| {
            a.src == b.src
                && a.superstep == b.superstep
                && a.tag == b.tag
                && same_buffer(&a.payload, &b.payload)
        })
    }

    pub fn serialize<S: Serializer>(messages: &[WireMessage], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(runs(messages).count()))?;
        for run in runs(messages) {
            seq.serialize_element(&GroupRef {
                src: run[0].src,
                superstep: run[0].superstep,
                tag: run[0].tag,
                payload: &run[0].payload,
                dsts: run.iter().map(|m| (m.dst, m.seq)).collect(),
            })?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<WireMessage>, D::Error> {
        struct Groups;
        impl<'de> Visitor<'de> for Groups {
            type Value = Vec<WireMessage>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a sequence of message groups")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // The size hint comes from the peer: cap what it can make us reserve.
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(g) = seq.next_element::<Group>()? {
                    if v.len() + g.dsts.len() > MAX_MESSAGES {
                        return Err(A::Error::custom(format_args!(
                            "more than {MAX_MESSAGES} messages in one list"
                        )));
                    }
                    for (dst, seq) in g.dsts {
                        v.push(WireMessage {
                            src: g.src,
                            dst,
                            superstep: g.superstep,
                            seq,
                            tag: g.tag,
                            payload: g.payload.clone(),
                        });
                    }
                }
                Ok(v)
            }
        }
        d.deserialize_seq(Groups)
    }
}

/// `Vec<(u32, Vec<u8>)>` (checkpoint pages) with each page a byte string
/// (see [`byte_string`]).
mod byte_pages {
    use serde::de::{SeqAccess, Visitor};
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use bytes::Bytes;

    #[derive(Serialize)]
    struct PageRef<'a>(u32, #[serde(with = "super::shared_bytes")] &'a Bytes);

    /// A page decoded under [`super::decode_sharing`] is a slice of the
    /// frame's buffer, not a copy.
    #[derive(Deserialize)]
    struct Page(u32, #[serde(with = "super::shared_bytes")] Bytes);

    pub fn serialize<S: Serializer>(pages: &[(u32, Bytes)], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(pages.len()))?;
        for (i, bytes) in pages {
            seq.serialize_element(&PageRef(*i, bytes))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(u32, Bytes)>, D::Error> {
        struct Pages;
        impl<'de> Visitor<'de> for Pages {
            type Value = Vec<(u32, Bytes)>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a sequence of (index, page bytes)")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // The size hint comes from the peer: cap what it can make us reserve.
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(Page(i, bytes)) = seq.next_element()? {
                    v.push((i, bytes));
                }
                Ok(v)
            }
        }
        d.deserialize_seq(Pages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message with a plain `Vec<u8>` payload, as WIRE_VERSION 2 first
    /// encoded it.
    #[derive(Serialize)]
    struct PlainMessage {
        src: Pid,
        dst: Pid,
        superstep: u32,
        seq: u32,
        tag: u32,
        payload: Vec<u8>,
    }

    #[test]
    fn byte_strings_encode_exactly_like_sequences_of_bytes() {
        let payload: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        let m = WireMessage {
            src: 1,
            dst: 2,
            superstep: 3,
            seq: 4,
            tag: 0,
            payload: Bytes::from(payload.clone()),
        };
        let plain = PlainMessage {
            src: 1,
            dst: 2,
            superstep: 3,
            seq: 4,
            tag: 0,
            payload,
        };
        let ours = postcard::to_allocvec(&m).unwrap();
        assert_eq!(ours, postcard::to_allocvec(&plain).unwrap());
        assert_eq!(postcard::from_bytes::<WireMessage>(&ours).unwrap(), m);
        // JSON (self-describing) round-trips too.
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<WireMessage>(&json).unwrap(), m);
    }

    fn message(src: Pid, dst: Pid, seq: u32, payload: &Bytes) -> WireMessage {
        WireMessage {
            src,
            dst,
            superstep: 7,
            seq,
            tag: 0,
            payload: payload.clone(),
        }
    }

    #[test]
    fn messages_sharing_a_payload_travel_once_and_come_back_shared() {
        let big = Bytes::from(vec![9u8; 100_000]);
        let other = Bytes::from(vec![9u8; 100_000]); // equal bytes, another buffer
        let small = Bytes::from_static(b"hi");
        let messages = vec![
            message(0, 1, 0, &big),
            message(0, 2, 1, &big),
            message(0, 3, 2, &big),
            message(0, 4, 3, &other),
            message(1, 5, 0, &other), // another source: another group
            message(0, 6, 4, &small),
        ];
        let frame = Frame::Data {
            messages: messages.clone(),
        };
        let bytes = postcard::to_allocvec(&frame).unwrap();
        // `big` once, `other` twice (two groups), plus a little.
        assert!(bytes.len() < 3 * 100_000 + 200, "{} bytes", bytes.len());
        let Frame::Data { messages: back } = postcard::from_bytes::<Frame>(&bytes).unwrap() else {
            panic!("not a data frame");
        };
        assert_eq!(back, messages);
        assert!(message_groups::same_buffer(
            &back[0].payload,
            &back[2].payload
        ));
        assert!(!message_groups::same_buffer(
            &back[2].payload,
            &back[3].payload
        ));
        // Re-encoding what was decoded groups the same way.
        let again = postcard::to_allocvec(&Frame::Data { messages: back }).unwrap();
        assert_eq!(again, bytes);
    }

    #[test]
    fn a_group_claiming_too_many_messages_is_refused() {
        #[derive(Serialize)]
        struct Group {
            src: Pid,
            superstep: u32,
            tag: u32,
            payload: Vec<u8>,
            dsts: Vec<(Pid, u32)>,
        }
        #[derive(Serialize)]
        enum Fake {
            _Hello,
            _Welcome,
            _Reject,
            Data { messages: Vec<Group> },
        }
        let n = message_groups::MAX_MESSAGES + 1;
        let fake = Fake::Data {
            messages: vec![Group {
                src: 0,
                superstep: 0,
                tag: 0,
                payload: vec![1; 10],
                dsts: (0..n as u32).map(|i| (0, i)).collect(),
            }],
        };
        let bytes = postcard::to_allocvec(&fake).unwrap();
        assert!(postcard::from_bytes::<Frame>(&bytes).is_err());
        // One message fewer decodes.
        let ok = Fake::Data {
            messages: vec![Group {
                src: 0,
                superstep: 0,
                tag: 0,
                payload: vec![1; 10],
                dsts: (0..n as u32 - 1).map(|i| (0, i)).collect(),
            }],
        };
        let bytes = postcard::to_allocvec(&ok).unwrap();
        assert!(postcard::from_bytes::<Frame>(&bytes).is_ok());
    }

    #[test]
    fn payloads_decoded_with_sharing_are_slices_of_the_frame() {
        let big = Bytes::from(vec![5u8; 200_000]);
        let frame = Frame::Data {
            messages: vec![message(0, 1, 0, &big), message(0, 2, 1, &big)],
        };
        let encoded = Bytes::from(postcard::to_allocvec(&frame).unwrap());
        let decoded: Frame = decode_sharing(&encoded, |b| postcard::from_bytes(b).unwrap());
        assert_eq!(decoded, frame);
        let Frame::Data { messages } = decoded else {
            unreachable!()
        };
        let (lo, hi) = (
            encoded.as_ptr() as usize,
            encoded.as_ptr() as usize + encoded.len(),
        );
        let p = messages[0].payload.as_ptr() as usize;
        assert!(lo <= p && p < hi, "the payload was copied");
        // Without a source: a copy, equal bytes.
        let copied: Frame = postcard::from_bytes(&encoded).unwrap();
        assert_eq!(copied, frame);
        let Frame::Data { messages } = copied else {
            unreachable!()
        };
        let p = messages[0].payload.as_ptr() as usize;
        assert!(!(lo <= p && p < hi));
    }

    #[test]
    fn relay_frames_round_trip() {
        let f = Frame::Relay {
            head: Box::new(RelayHead {
                src: 3,
                superstep: 2,
                tag: 9,
                len: 1000,
                algorithm: RelayAlgorithm::Chain { chunk: 256 },
                peers: vec![4, 1, 2],
                dsts: vec![(0, 5), (1, 6)],
            }),
            offset: 256,
            bytes: Bytes::from(vec![1u8; 256]),
        };
        let bytes = postcard::to_allocvec(&f).unwrap();
        assert_eq!(postcard::from_bytes::<Frame>(&bytes).unwrap(), f);
    }

    #[test]
    fn checkpoint_pages_round_trip_and_match_the_plain_encoding() {
        let pages = vec![(0u32, vec![7u8; 65_536]), (5, vec![1, 2, 3])];
        let frame = Frame::CheckpointPart {
            pid: 1,
            superstep: 2,
            pages: pages
                .iter()
                .map(|(i, p)| (*i, Bytes::from(p.clone())))
                .collect(),
            outbox: vec![],
            patched: vec![],
        };
        let bytes = postcard::to_allocvec(&frame).unwrap();
        assert_eq!(postcard::from_bytes::<Frame>(&bytes).unwrap(), frame);
        // Decoded from a shared buffer, the pages are slices of it, not copies.
        let shared = Bytes::from(bytes.clone());
        let back = decode_sharing(&shared, |b| postcard::from_bytes::<Frame>(b)).unwrap();
        let Frame::CheckpointPart { pages: back, .. } = back else {
            panic!("not a checkpoint part");
        };
        let within = |p: &Bytes| {
            let (lo, hi) = (
                shared.as_ptr() as usize,
                shared.as_ptr() as usize + shared.len(),
            );
            lo <= p.as_ptr() as usize && p.as_ptr() as usize + p.len() <= hi
        };
        assert!(back.iter().all(|(_, p)| within(p)));
        let plain = postcard::to_allocvec(&pages).unwrap();
        assert!(
            bytes.windows(plain.len()).any(|w| w == plain.as_slice()),
            "the pages are encoded as a plain Vec<(u32, Vec<u8>)> would be"
        );
        // A truncated frame fails cleanly.
        let mut bad = bytes.clone();
        bad.truncate(bytes.len() / 2);
        assert!(postcard::from_bytes::<Frame>(&bad).is_err());
    }
}
