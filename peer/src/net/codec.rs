//! Frames on the wire: the length-delimited codec, encoding (with large
//! pages and payloads referenced as [`Segments`], written with vectored
//! writes) and decoding.

use super::*;

/// The data plane's framing: 4-byte big-endian length, at most [`MAX_FRAME_BYTES`].
pub fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec()
}

/// Encode a frame with postcard, into a buffer sized for it up front (a
/// growing buffer would copy a large frame several times).
pub fn encode(frame: &Frame) -> Result<Bytes, postcard::Error> {
    postcard::to_extend(frame, Vec::with_capacity(size_hint(frame))).map(Bytes::from)
}

/// About the encoded size of `frame` (at least its bulk bytes).
pub(super) fn size_hint(frame: &Frame) -> usize {
    let outbox = |o: &[bsp_api::wire::WireMessage]| -> usize {
        bsp_api::wire::message_groups::runs(o)
            .map(|r| r[0].payload.len() + 24 * r.len())
            .sum()
    };
    let pages = |p: &[(u32, Bytes)]| -> usize { p.iter().map(|(_, b)| b.len() + 8).sum() };
    64 + match frame {
        Frame::Data { messages } => outbox(messages),
        Frame::Relay { bytes, head, .. } => bytes.len() + 16 * head.dsts.len(),
        Frame::CheckpointPart {
            pages: p,
            outbox: o,
            ..
        } => pages(p) + outbox(o),
        Frame::Checkpoint(c) => pages(&c.pages) + outbox(&c.outbox) + 8 * c.globals.len(),
        Frame::Snapshot {
            snapshot: Some(c), ..
        } => pages(&c.pages) + outbox(&c.outbox) + 8 * c.globals.len(),
        _ => 0,
    }
}

/// Frames at least this large skip the codec's write buffer (a copy): they
/// go to the socket in one vectored write of their segments.
pub(super) const DIRECT_WRITE_BYTES: usize = 64 << 10;

/// Byte strings (pages, payloads) at least this large are not copied into
/// an encoded frame: its [`Segments`] refer to them.
pub(super) const SEGMENT_MIN_BYTES: usize = 4 << 10;

/// Most buffers handed to one `writev`.
pub(super) const MAX_IOVECS: usize = 64;

/// A frame's postcard encoding as a list of buffers, to be written one after
/// another: the small fields encoded, and the frame's large byte strings
/// (checkpoint pages, message payloads, relayed bytes) as the buffers the
/// frame already holds, not copies. The bytes on the wire are exactly
/// [`encode`]'s.
#[derive(Debug, Clone, Default)]
pub struct Segments {
    pub(super) parts: Vec<Bytes>,
    pub(super) len: usize,
}

impl Segments {
    /// The encoded frame's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The encoding in one buffer (a copy unless it is one segment).
    pub fn to_bytes(&self) -> Bytes {
        match self.parts.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            parts => {
                let mut v = Vec::with_capacity(self.len);
                for p in parts {
                    v.extend_from_slice(p);
                }
                Bytes::from(v)
            }
        }
    }
}

/// A postcard output that refers to the frame's large byte strings instead
/// of copying them (`bulk`: those byte strings, by address and length).
pub(super) struct SegmentFlavor<'a> {
    pub(super) bulk: &'a HashMap<(usize, usize), Bytes>,
    pub(super) parts: Vec<Bytes>,
    pub(super) current: Vec<u8>,
    pub(super) len: usize,
}

impl postcard::ser_flavors::Flavor for SegmentFlavor<'_> {
    type Output = Segments;

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.current.push(data);
        self.len += 1;
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.len += data.len();
        let whole = (data.len() >= SEGMENT_MIN_BYTES)
            .then(|| self.bulk.get(&(data.as_ptr() as usize, data.len())))
            .flatten();
        match whole {
            Some(b) => {
                if !self.current.is_empty() {
                    self.parts
                        .push(Bytes::from(std::mem::take(&mut self.current)));
                }
                self.parts.push(b.clone());
            }
            None => self.current.extend_from_slice(data),
        }
        Ok(())
    }

    fn finalize(mut self) -> postcard::Result<Segments> {
        if !self.current.is_empty() {
            self.parts.push(Bytes::from(self.current));
        }
        Ok(Segments {
            parts: self.parts,
            len: self.len,
        })
    }
}

/// The large byte strings of `frame`, by address and length.
pub(super) fn bulk_of(frame: &Frame) -> HashMap<(usize, usize), Bytes> {
    use bsp_api::wire::{ProgramMsg, WireMessage};
    let mut bulk = HashMap::new();
    let mut add = |b: &Bytes| {
        if b.len() >= SEGMENT_MIN_BYTES {
            bulk.insert((b.as_ptr() as usize, b.len()), b.clone());
        }
    };
    let mut pages_and_outbox = |pages: &[(u32, Bytes)], outbox: &[WireMessage]| {
        pages.iter().for_each(|(_, b)| add(b));
        outbox.iter().for_each(|m| add(&m.payload));
    };
    match frame {
        Frame::Data { messages } => pages_and_outbox(&[], messages),
        Frame::CheckpointPart { pages, outbox, .. } => pages_and_outbox(pages, outbox),
        Frame::Checkpoint(c)
        | Frame::Snapshot {
            snapshot: Some(c), ..
        } => pages_and_outbox(&c.pages, &c.outbox),
        Frame::Relay { bytes, .. } => add(bytes),
        Frame::Program {
            msg: ProgramMsg::Piece { data, .. },
            ..
        } => add(data),
        _ => {}
    }
    bulk
}

/// Encode a frame as [`Segments`]: its large byte strings are not copied.
pub fn encode_segments(frame: &Frame) -> Result<Segments, postcard::Error> {
    let bulk = bulk_of(frame);
    if bulk.is_empty() {
        let bytes = encode(frame)?;
        let len = bytes.len();
        return Ok(Segments {
            parts: vec![bytes],
            len,
        });
    }
    let flavor = SegmentFlavor {
        bulk: &bulk,
        parts: Vec::new(),
        current: Vec::with_capacity(256),
        len: 0,
    };
    postcard::serialize_with_flavor(frame, flavor)
}

/// Write one frame straight to the socket, after what the codec buffered:
/// its length prefix and segments in vectored writes (no copy into a
/// buffer).
pub(super) async fn write_segments(conn: &mut SecureConn, frame: Segments) -> std::io::Result<()> {
    use bytes::Buf;
    use std::collections::VecDeque;
    use std::io::IoSlice;
    use tokio::io::AsyncWriteExt;
    let len = u32::try_from(frame.len)
        .ok()
        .filter(|&n| n as usize <= MAX_FRAME_BYTES)
        .ok_or_else(|| std::io::Error::other("a frame is larger than the protocol allows"))?;
    SinkExt::<Bytes>::flush(conn).await?;
    let mut parts: VecDeque<Bytes> = std::iter::once(Bytes::copy_from_slice(&len.to_be_bytes()))
        .chain(frame.parts)
        .filter(|b| !b.is_empty())
        .collect();
    let stream = conn.get_mut();
    while !parts.is_empty() {
        let slices: Vec<IoSlice<'_>> = parts
            .iter()
            .take(MAX_IOVECS)
            .map(|b| IoSlice::new(b))
            .collect();
        let mut written = stream.write_vectored(&slices).await?;
        drop(slices);
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let Some(front) = parts.front_mut() else {
                break;
            };
            if written >= front.len() {
                written -= front.len();
                parts.pop_front();
            } else {
                front.advance(written);
                written = 0;
            }
        }
    }
    Ok(())
}

/// What a job's driver queues for a connection: a frame, or frames the
/// connection's writer makes when it gets to them (a checkpoint's: made
/// once for all the replicas it goes to, while its process computes its
/// next superstep).
#[derive(Debug, Clone)]
pub enum Outgoing {
    Frame(Frame),
    Deferred(Arc<dyn Deferred>),
}

/// Frames made when first written rather than when queued, and shared by
/// every connection they are queued on.
pub trait Deferred: std::fmt::Debug + Send + Sync {
    /// The frames, in order: the first call makes them (on the caller's
    /// thread; a concurrent call waits for it), later calls share them.
    fn segments(&self) -> Result<&[Segments], postcard::Error>;
    /// Whether [`segments`](Deferred::segments) is still to make them and
    /// may take long: the writer then makes them on a blocking thread, not
    /// on its async worker.
    fn slow(&self) -> bool;
}

impl From<Frame> for Outgoing {
    fn from(f: Frame) -> Self {
        Outgoing::Frame(f)
    }
}

/// Decode a frame; trailing bytes are an error. Message payloads are slices
/// of `bytes`, not copies (`bsp_api::wire::decode_sharing`).
pub fn decode(bytes: impl Into<Bytes>) -> Result<Frame, postcard::Error> {
    let bytes: Bytes = bytes.into();
    bsp_api::wire::decode_sharing(&bytes, |b| {
        let (frame, rest) = postcard::take_from_bytes::<Frame>(b)?;
        if rest.is_empty() {
            Ok(frame)
        } else {
            Err(postcard::Error::DeserializeBadEncoding)
        }
    })
}
