//! The peer ↔ peer data plane: one TCP listener per peer, one outbound
//! connection per (job, remote peer), postcard [`Frame`]s in length-delimited
//! framing (see [`bsp_api::wire`]).
//!
//! Every data-plane connection is encrypted and authenticated under its
//! job's key ([`crate::noise`]): the listener admits a connection only after
//! a `Hello` that names a job this peer holds an assignment for, whose Noise
//! handshake decrypts under that job's key, that comes from one of the job's
//! other peers and whose key confirmation arrived. It then forwards the
//! connection's frames to the job as [`Inbound`] events. A malformed frame
//! or a record that does not decrypt closes that one connection and tells
//! its job; other connections and jobs are unaffected.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bsp_api::wire::{Frame, HelloPayload, MAX_FRAME_BYTES, RejectReason, WIRE_VERSION};
use bsp_api::{JobId, PeerId};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;

use crate::noise::{Initiator, JobKey, Responder, SecureStream};

/// How long a new connection may take to send its `Hello`, and a dialer to
/// get its answer.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest first frame a connection may send: its `Hello` (a version,
/// a job id and a Noise message of about 100 bytes). Nothing larger is
/// buffered from a connection that has not been admitted.
pub const MAX_HELLO_BYTES: usize = 1024;

/// How long a new connection may take to send its `Hello` and its key
/// confirmation. Dialers send them right after connecting and after the
/// answer.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections not admitted yet, at most: from everywhere, and from one
/// address. Further ones are closed at once (dialers retry with backoff).
pub const MAX_PENDING: usize = 256;
pub const MAX_PENDING_PER_ADDRESS: usize = 16;

/// Frames queued from the listener to a job before the connection is paused.
const INBOUND_QUEUE: usize = 256;

/// A framed connection in the clear: a data-plane connection before its
/// handshake, and link probes.
pub type FramedConn = Framed<TcpStream, LengthDelimitedCodec>;

/// A framed data-plane connection after its handshake: the same frames,
/// inside encrypted records.
pub type SecureConn = Framed<SecureStream<TcpStream>, LengthDelimitedCodec>;

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
fn size_hint(frame: &Frame) -> usize {
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
const DIRECT_WRITE_BYTES: usize = 64 << 10;

/// Byte strings (pages, payloads) at least this large are not copied into
/// an encoded frame: its [`Segments`] refer to them.
const SEGMENT_MIN_BYTES: usize = 4 << 10;

/// Most buffers handed to one `writev`.
const MAX_IOVECS: usize = 64;

/// A frame's postcard encoding as a list of buffers, to be written one after
/// another: the small fields encoded, and the frame's large byte strings
/// (checkpoint pages, message payloads, relayed bytes) as the buffers the
/// frame already holds, not copies. The bytes on the wire are exactly
/// [`encode`]'s.
#[derive(Debug, Clone, Default)]
pub struct Segments {
    parts: Vec<Bytes>,
    len: usize,
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
struct SegmentFlavor<'a> {
    bulk: &'a HashMap<(usize, usize), Bytes>,
    parts: Vec<Bytes>,
    current: Vec<u8>,
    len: usize,
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
fn bulk_of(frame: &Frame) -> HashMap<(usize, usize), Bytes> {
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
async fn write_segments(conn: &mut SecureConn, frame: Segments) -> std::io::Result<()> {
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

/// What a job's driver queues for a connection: a frame, or one it encoded
/// already (a checkpoint encoded once for all the replicas it goes to).
#[derive(Debug, Clone)]
pub enum Outgoing {
    Frame(Frame),
    Encoded(Segments),
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

/// What the data plane tells a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// Peer `from` opened its connection to us and was welcomed.
    Connected { from: PeerId },
    /// A frame from peer `from`, in the order it was sent.
    Frame { from: PeerId, frame: Frame },
    /// The connection from `from` ended: `None` for a clean close, else why.
    Closed { from: PeerId, error: Option<String> },
    /// Our connection to `to` could not be opened or broke.
    SendFailed { to: PeerId, error: String },
    /// The job ended on peer `to` (it said so before closing our
    /// connection): do not reconnect or re-send.
    PeerEnded { to: PeerId },
}

struct Entry {
    key: JobKey,
    me: PeerId,
    peers: HashSet<PeerId>,
    /// The live connection from each peer; a newer one replaces it (the
    /// peer reconnected after its connection broke).
    connected: HashMap<PeerId, CancellationToken>,
    tx: mpsc::Sender<Inbound>,
}

/// The jobs this peer's listener admits connections for, and the link
/// probes it answers.
#[derive(Default)]
pub struct Registry {
    jobs: Mutex<HashMap<JobId, Entry>>,
    links: Arc<crate::links::Links>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry that answers link probes with `links`.
    pub fn with_links(links: Arc<crate::links::Links>) -> Self {
        Registry {
            jobs: Mutex::default(),
            links,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, Entry>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admit connections for `job` from `peers` (other than `me`) under the
    /// key of the job's `token`. Returns the job's event channel: a sender (for the job's own
    /// outbound writers) and the receiver. Replaces an earlier registration.
    pub fn register(
        &self,
        job: JobId,
        token: &str,
        me: PeerId,
        peers: impl IntoIterator<Item = PeerId>,
    ) -> (mpsc::Sender<Inbound>, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(INBOUND_QUEUE);
        let entry = Entry {
            key: JobKey::derive(token),
            me,
            peers: peers.into_iter().filter(|p| *p != me).collect(),
            connected: HashMap::new(),
            tx: tx.clone(),
        };
        if let Some(old) = self.lock().insert(job, entry) {
            for c in old.connected.values() {
                c.cancel();
            }
        }
        (tx, rx)
    }

    /// Stop admitting connections for the run of `job` that
    /// [`Registry::register`] gave `tx` (a later registration of the same
    /// job, under a newer identity or for a run that took over, stays).
    pub fn unregister(&self, job: JobId, tx: &mpsc::Sender<Inbound>) {
        let mut jobs = self.lock();
        if jobs.get(&job).is_some_and(|e| e.tx.same_channel(tx))
            && let Some(e) = jobs.remove(&job)
        {
            for c in e.connected.values() {
                c.cancel();
            }
        }
    }

    /// The job's peers changed (a new assignment epoch): admit only `peers`
    /// from now on, and close the connections of peers that are no longer
    /// part of the job (fencing).
    pub fn update_peers(&self, job: JobId, me: PeerId, peers: impl IntoIterator<Item = PeerId>) {
        let mut jobs = self.lock();
        let Some(e) = jobs.get_mut(&job) else { return };
        e.peers = peers.into_iter().filter(|p| *p != me).collect();
        let peers = &e.peers;
        e.connected.retain(|p, c| {
            let keep = peers.contains(p);
            if !keep {
                c.cancel();
            }
            keep
        });
    }

    /// Close the connection `from` has to us for `job`, as a network fault
    /// would (it reconnects). Returns whether there was one.
    #[cfg(test)]
    pub fn cut(&self, job: JobId, from: PeerId) -> bool {
        let jobs = self.lock();
        match jobs.get(&job).and_then(|e| e.connected.get(&from)) {
            Some(c) => {
                c.cancel();
                true
            }
            None => false,
        }
    }

    fn disconnected(&self, job: JobId, from: PeerId) {
        let mut jobs = self.lock();
        if let Some(e) = jobs.get_mut(&job)
            && e.connected.get(&from).is_some_and(|c| c.is_cancelled())
        {
            e.connected.remove(&from);
        }
    }

    /// The key of `job`'s connections.
    fn key(&self, job: JobId) -> Result<JobKey, (RejectReason, String)> {
        match self.lock().get(&job) {
            Some(e) => Ok(e.key.clone()),
            None => Err(unknown_job(job)),
        }
    }

    /// Whether `from` may connect for `job`.
    fn check(&self, job: JobId, from: PeerId) -> Result<(), (RejectReason, String)> {
        let jobs = self.lock();
        let e = jobs.get(&job).ok_or_else(|| unknown_job(job))?;
        Self::member(e, job, from)
    }

    fn member(e: &Entry, job: JobId, from: PeerId) -> Result<(), (RejectReason, String)> {
        if from == e.me || !e.peers.contains(&from) {
            return Err((
                RejectReason::NotAuthorized,
                format!("peer #{from} is not one of the other peers of job {job}"),
            ));
        }
        Ok(())
    }

    /// Admit `from`'s connection for `job`, whose handshake and key
    /// confirmation succeeded.
    fn admit(
        &self,
        job: JobId,
        from: PeerId,
    ) -> Result<(mpsc::Sender<Inbound>, CancellationToken), (RejectReason, String)> {
        let mut jobs = self.lock();
        let e = jobs.get_mut(&job).ok_or_else(|| unknown_job(job))?;
        Self::member(e, job, from)?;
        // A peer reconnects when its connection broke; the old one, if it is
        // still half open, is closed.
        let conn = CancellationToken::new();
        if let Some(old) = e.connected.insert(from, conn.clone()) {
            old.cancel();
        }
        Ok((e.tx.clone(), conn))
    }
}

fn unknown_job(job: JobId) -> (RejectReason, String) {
    (
        RejectReason::UnknownJob,
        format!("this peer has no assignment for job {job} (yet); retry later"),
    )
}

/// Connections accepted but not admitted yet, counted from everywhere and
/// per remote address (issue 20, finding 2).
#[derive(Debug, Default)]
struct Pending {
    counts: Mutex<(usize, HashMap<std::net::IpAddr, usize>)>,
}

/// One pending connection; counted until dropped.
struct PendingSlot {
    pending: Arc<Pending>,
    ip: std::net::IpAddr,
}

impl Pending {
    fn enter(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<PendingSlot> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let here = c.1.get(&ip).copied().unwrap_or(0);
        if c.0 >= MAX_PENDING || here >= MAX_PENDING_PER_ADDRESS {
            return None;
        }
        c.0 += 1;
        c.1.insert(ip, here + 1);
        Some(PendingSlot {
            pending: self.clone(),
            ip,
        })
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        let mut c = self
            .pending
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        c.0 = c.0.saturating_sub(1);
        if let Some(n) = c.1.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.1.remove(&self.ip);
            }
        }
    }
}

/// Accept data-plane connections until `shutdown` is cancelled.
/// At most one warning per [`WARN_EVERY`] about connections that fail
/// their handshake: strangers can open as many as they like, and each
/// would otherwise write a line to the volunteer's log. The next warning
/// says how many were left out.
struct WarnThrottle {
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

const WARN_EVERY: Duration = Duration::from_secs(10);

static HANDSHAKE_WARNINGS: WarnThrottle = WarnThrottle {
    state: std::sync::Mutex::new((None, 0)),
};

impl WarnThrottle {
    /// `Some(n)` when a warning may be written now (`n` were left out
    /// since the last one); `None` when this one is left out.
    fn admit(&self) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        match st.0 {
            Some(last) if now.duration_since(last) < WARN_EVERY => {
                st.1 += 1;
                None
            }
            _ => {
                st.0 = Some(now);
                Some(std::mem::take(&mut st.1))
            }
        }
    }
}

/// Warn about a connection that failed its handshake, throttled.
fn warn_handshake(what: std::fmt::Arguments<'_>) {
    match HANDSHAKE_WARNINGS.admit() {
        Some(0) => tracing::warn!("{what}"),
        Some(n) => tracing::warn!("{what} ({n} more such connections since the last warning)"),
        None => tracing::debug!("{what}"),
    }
}

pub async fn serve(listener: TcpListener, registry: Arc<Registry>, shutdown: CancellationToken) {
    let pending = Arc::new(Pending::default());
    let mut refused_logged = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, addr)) => {
                    let Some(slot) = pending.enter(bsp_api::connection_key(addr.ip())) else {
                        // Dropping the stream closes it before anything is read.
                        if !refused_logged {
                            tracing::warn!(
                                "data-plane listener: too many connections that have not said hello (from {addr} and others); closing new ones until they do"
                            );
                            refused_logged = true;
                        }
                        continue;
                    };
                    refused_logged = false;
                    let registry = registry.clone();
                    let shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        handle_connection(stream, addr, slot, registry, shutdown).await;
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly.
                    tracing::warn!("data-plane listener: cannot accept a connection: {e}");
                    sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

async fn reject(mut conn: FramedConn, reason: RejectReason, message: String) {
    tracing::debug!("data plane: rejecting a connection ({reason:?}): {message}");
    if let Ok(bytes) = encode(&Frame::Reject { reason, message }) {
        let _ = timeout(HANDSHAKE_TIMEOUT, async {
            let _ = conn.send(bytes).await;
            let _ = SinkExt::<Bytes>::close(&mut conn).await;
        })
        .await;
    }
}

async fn handle_connection(
    stream: TcpStream,
    addr: SocketAddr,
    slot: PendingSlot,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let deadline = Instant::now() + HELLO_TIMEOUT;
    // Until the Hello is admitted, frames are at most MAX_HELLO_BYTES: a
    // longer length prefix ends the connection before its body is read.
    let mut conn = Framed::new(
        stream,
        LengthDelimitedCodec::builder()
            .max_frame_length(MAX_HELLO_BYTES)
            .new_codec(),
    );
    let first = match tokio::time::timeout_at(deadline, conn.next()).await {
        Ok(Some(Ok(bytes))) => decode(bytes),
        Ok(Some(Err(e))) => {
            tracing::debug!("data plane: connection from {addr} sent a bad first frame: {e}");
            return;
        }
        Ok(None) | Err(_) => return,
    };
    let (version, job, handshake) = match first {
        Ok(Frame::Hello {
            version,
            job,
            handshake,
        }) => (version, job, handshake),
        Ok(Frame::Probe(hello)) => {
            drop(slot);
            return registry.links.answer(conn, hello).await;
        }
        Ok(_) | Err(_) => {
            let msg = "the first frame on a data-plane connection must be Hello".to_string();
            return reject(conn, RejectReason::Protocol, msg).await;
        }
    };
    if version != WIRE_VERSION {
        let msg = format!(
            "data-plane protocol version {version} is not supported; this peer speaks version {WIRE_VERSION}"
        );
        return reject(conn, RejectReason::Version, msg).await;
    }
    let key = match registry.key(job) {
        Ok(k) => k,
        Err((reason, msg)) => return reject(conn, reason, msg).await,
    };
    let (responder, payload) = match Responder::accept(&key, version, job, &handshake) {
        Ok(x) => x,
        Err(e) => {
            warn_handshake(format_args!(
                "data plane: a connection from {addr} for job {job} failed the handshake ({e}); closing it"
            ));
            let msg = format!("the handshake did not decrypt under job {job}'s key");
            return reject(conn, RejectReason::NotAuthorized, msg).await;
        }
    };
    let Ok(HelloPayload { from, epoch: _ }) = postcard::from_bytes(&payload) else {
        let msg = "the hello's payload is malformed".to_string();
        return reject(conn, RejectReason::Protocol, msg).await;
    };
    // The answer, Welcome or Reject, is authenticated under the job's key.
    let verdict = registry.check(job, from);
    let answer = match &verdict {
        Ok(()) => Frame::Welcome,
        Err((reason, message)) => Frame::Reject {
            reason: *reason,
            message: message.clone(),
        },
    };
    let answered = encode(&answer)
        .map_err(|e| e.to_string())
        .and_then(|a| responder.answer(&a).map_err(|e| e.to_string()));
    let (transport, handshake) = match answered {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!("data plane: cannot answer {addr}'s hello for job {job}: {e}");
            return;
        }
    };
    let sent = tokio::time::timeout_at(deadline, async {
        let answer = encode(&Frame::Answer {
            handshake: handshake.into(),
        })
        .map_err(std::io::Error::other)?;
        conn.send(answer).await?;
        if verdict.is_err() {
            SinkExt::<Bytes>::close(&mut conn).await?;
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if let Err((reason, message)) = verdict {
        tracing::debug!("data plane: rejecting a connection ({reason:?}): {message}");
        return;
    }
    if !matches!(sent, Ok(Ok(()))) {
        return;
    }
    // Admit only once the dialer proves it holds the handshake's keys: a
    // replayed Hello gets this far, but can never replace a live connection.
    let parts = conn.into_parts();
    let mut secure = SecureStream::new(parts.io, transport, parts.read_buf);
    match tokio::time::timeout_at(deadline, secure.read_confirmation()).await {
        Ok(Ok(())) => {}
        // The dialer went away (its job ended, or it timed out) before it
        // confirmed: nothing wrong with the connection's bytes.
        Ok(Err(crate::noise::NoiseError::Truncated)) => {
            tracing::debug!(
                "data plane: peer #{from}'s connection from {addr} for job {job} closed before its key confirmation"
            );
            return;
        }
        Ok(Err(e)) => {
            warn_handshake(format_args!(
                "data plane: peer #{from}'s connection from {addr} for job {job} sent no valid key confirmation ({e}); closing it"
            ));
            return;
        }
        Err(_) => {
            warn_handshake(format_args!(
                "data plane: peer #{from}'s connection from {addr} for job {job} sent no key confirmation within {HELLO_TIMEOUT:?}; closing it"
            ));
            return;
        }
    }
    let mut conn = Framed::new(secure, codec());
    let (tx, this_conn) = match registry.admit(job, from) {
        Ok(x) => x,
        // Fenced out or unregistered while it confirmed.
        Err((reason, message)) => {
            if let Ok(b) = encode(&Frame::Reject { reason, message }) {
                let _ = timeout(HANDSHAKE_TIMEOUT, conn.send(b)).await;
            }
            return;
        }
    };
    drop(slot);
    if tx.send(Inbound::Connected { from }).await.is_err() {
        return;
    }
    let _forget = Forget {
        registry: &registry,
        job,
        from,
        conn: this_conn.clone(),
    };
    loop {
        let item = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tx.closed() => return say_job_ended(conn, job).await,
            _ = this_conn.cancelled() => {
                // Unregistered because the job's driver ended (it drops its
                // receiver first), or fenced out by a newer assignment.
                if tx.is_closed() {
                    say_job_ended(conn, job).await;
                }
                return;
            }
            item = conn.next() => item,
        };
        let event = match item {
            None => Inbound::Closed { from, error: None },
            Some(Err(e)) => Inbound::Closed {
                from,
                error: Some(e.to_string()),
            },
            Some(Ok(bytes)) => match decode(bytes) {
                Ok(frame) => Inbound::Frame { from, frame },
                Err(e) => Inbound::Closed {
                    from,
                    error: Some(format!("it sent a malformed frame ({e})")),
                },
            },
        };
        let closing = matches!(event, Inbound::Closed { .. });
        if tx.send(event).await.is_err() {
            if !closing {
                say_job_ended(conn, job).await;
            }
            return;
        }
        if closing {
            return;
        }
    }
}

/// Tell the sender on `conn` that `job` ended on this peer, so it does not
/// reconnect and re-send what nobody will read; then read (and drop) what
/// is still coming until it closes, because closing with unread bytes would
/// reset the connection and lose the notice.
async fn say_job_ended(mut conn: SecureConn, job: JobId) {
    let ended = Frame::Reject {
        reason: RejectReason::JobEnded,
        message: format!("job {job} has ended on this peer"),
    };
    let Ok(bytes) = encode(&ended) else { return };
    let _ = timeout(HANDSHAKE_TIMEOUT, async {
        conn.send(bytes).await?;
        while conn.next().await.transpose()?.is_some() {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// Removes a connection from the registry when its reader ends.
struct Forget<'a> {
    registry: &'a Registry,
    job: JobId,
    from: PeerId,
    conn: CancellationToken,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.conn.cancel();
        self.registry.disconnected(self.job, self.from);
    }
}

/// First wait before asking a peer again that did not know the job yet
/// (doubled at each try, up to 1 s).
pub const UNKNOWN_JOB_RETRY: Duration = Duration::from_millis(2);

/// Whether and how soon a failed handshake is tried again.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// A rejection other than "unknown job": fail.
    Never,
    /// The peer does not know the job yet: it will within milliseconds.
    Soon,
    /// Refused, broken or timed out: back off from 50 ms.
    Later,
}

/// Open a data-plane connection to `addr` for `job` and get it welcomed.
/// Retries refused connections, `Reject{UnknownJob}` and handshakes that
/// fail (a plain reject is not authenticated: anyone on the path could
/// forge it) with backoff until `deadline`; a version mismatch and a
/// rejection inside the authenticated answer fail at once. A peer that
/// does not know the job yet usually gets its assignment within
/// milliseconds (all peers of a job hear of it at once), so that retry
/// starts at [`UNKNOWN_JOB_RETRY`], not at the 50 ms of a refused
/// connection: the first checkpoint of a job waits for this connection.
pub async fn connect(
    addr: &str,
    job: JobId,
    from: PeerId,
    token: &str,
    epoch: u64,
    deadline: Instant,
) -> Result<SecureConn, String> {
    let key = JobKey::derive(token);
    let mut later = Duration::from_millis(50);
    let mut soon = UNKNOWN_JOB_RETRY;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = timeout(left.min(HANDSHAKE_TIMEOUT), async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|e| (Retry::Later, format!("cannot connect: {e}")))?;
            let _ = stream.set_nodelay(true);
            handshake(stream, job, from, &key, epoch).await
        })
        .await;
        let (retry, error) = match attempt {
            Ok(Ok(conn)) => return Ok(conn),
            Ok(Err(e)) => e,
            Err(_) => (Retry::Later, "the handshake timed out".to_string()),
        };
        let backoff = match retry {
            Retry::Never => return Err(error),
            Retry::Soon => &mut soon,
            Retry::Later => &mut later,
        };
        let wait = *backoff;
        tracing::trace!(target: "bspweb::timeline", job, to = addr, "dialing again: {error}");
        *backoff = (wait * 2).min(Duration::from_secs(1));
        if Instant::now() + wait >= deadline {
            return Err(error);
        }
        sleep(wait).await;
    }
}

/// The dialer's side of the handshake on a new connection (see
/// [`crate::noise`]): Hello, the answer, then the key confirmation.
async fn handshake(
    stream: TcpStream,
    job: JobId,
    from: PeerId,
    key: &JobKey,
    epoch: u64,
) -> Result<SecureConn, (Retry, String)> {
    let payload = postcard::to_allocvec(&HelloPayload { from, epoch })
        .map_err(|e| (Retry::Never, format!("cannot encode hello: {e}")))?;
    let (initiator, first) = Initiator::start(key, WIRE_VERSION, job, &payload)
        .map_err(|e| (Retry::Never, format!("cannot start the handshake: {e}")))?;
    let hello = encode(&Frame::Hello {
        version: WIRE_VERSION,
        job,
        handshake: first.into(),
    })
    .map_err(|e| (Retry::Never, format!("cannot encode hello: {e}")))?;
    let mut conn = Framed::new(
        stream,
        LengthDelimitedCodec::builder()
            .max_frame_length(MAX_HELLO_BYTES)
            .new_codec(),
    );
    conn.send(hello)
        .await
        .map_err(|e| (Retry::Later, format!("cannot send hello: {e}")))?;
    let answer = match conn.next().await {
        Some(Ok(bytes)) => decode(bytes),
        Some(Err(e)) => return Err((Retry::Later, format!("the handshake failed: {e}"))),
        None => {
            return Err((
                Retry::Later,
                "it closed the connection during the handshake".into(),
            ));
        }
    };
    let handshake = match answer {
        Ok(Frame::Answer { handshake }) => handshake,
        Ok(Frame::Reject {
            reason: RejectReason::UnknownJob,
            message,
        }) => {
            return Err((
                Retry::Soon,
                format!("it does not know the job yet: {message}"),
            ));
        }
        Ok(Frame::Reject {
            reason: reason @ (RejectReason::Version | RejectReason::Protocol),
            message,
        }) => {
            return Err((
                Retry::Never,
                format!("it rejected us ({reason:?}): {message}"),
            ));
        }
        Ok(Frame::Reject { reason, message }) => {
            return Err((
                Retry::Later,
                format!("it refused the handshake ({reason:?}): {message}"),
            ));
        }
        Ok(other) => return Err((Retry::Never, format!("it answered hello with {other:?}"))),
        Err(e) => return Err((Retry::Never, format!("it sent a malformed answer: {e}"))),
    };
    let (transport, payload) = initiator.finish(&handshake).map_err(|e| {
        tracing::warn!("data plane: job {job}: a listener's answer failed the handshake ({e})");
        (
            Retry::Later,
            format!("its answer failed the handshake: {e}"),
        )
    })?;
    match decode(payload) {
        Ok(Frame::Welcome) => {}
        Ok(Frame::Reject { reason, message }) => {
            return Err((
                Retry::Never,
                format!("it rejected us ({reason:?}): {message}"),
            ));
        }
        Ok(other) => return Err((Retry::Never, format!("it answered hello with {other:?}"))),
        Err(e) => return Err((Retry::Never, format!("it sent a malformed answer: {e}"))),
    }
    let parts = conn.into_parts();
    let mut secure = SecureStream::new(parts.io, transport, parts.read_buf);
    secure
        .queue_confirmation()
        .map_err(|e| (Retry::Never, format!("cannot confirm the handshake: {e}")))?;
    let mut conn = Framed::new(secure, codec());
    SinkExt::<Bytes>::flush(&mut conn)
        .await
        .map_err(|e| (Retry::Later, format!("cannot confirm the handshake: {e}")))?;
    Ok(conn)
}

/// What a job needs to dial one remote peer.
#[derive(Debug, Clone)]
pub struct Dial {
    /// The remote peer's data-plane address, `host:port`.
    pub addr: String,
    /// The job the connection is for.
    pub job: JobId,
    /// This peer's id.
    pub from: PeerId,
    /// The remote peer's id.
    pub to: PeerId,
    /// The job's token, shown in `Hello`.
    pub token: String,
    /// This peer's assignment epoch for the job, shown in `Hello`.
    pub epoch: u64,
    /// When to give up dialing.
    pub deadline: Instant,
}

/// Spawn the writer of one outbound connection: it connects, then sends the
/// frames queued on `frames` in order until the queue is closed (then it
/// flushes and closes the connection). A failure is reported on `events` as
/// [`Inbound::SendFailed`].
pub fn spawn_writer(
    dial: Dial,
    mut frames: mpsc::UnboundedReceiver<Outgoing>,
    events: mpsc::Sender<Inbound>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let result: Result<(), String> = async {
            let mut conn = connect(
                &dial.addr,
                dial.job,
                dial.from,
                &dial.token,
                dial.epoch,
                dial.deadline,
            )
            .await
            .map_err(|e| format!("could not connect: {e}"))?;
            loop {
                // The listener sends nothing after its Welcome: anything
                // else on the connection means it closed (or broke) it, and
                // whatever was still in flight is lost, so report it at once
                // rather than at the next write (which may never come).
                let frame = tokio::select! {
                    f = frames.recv() => match f {
                        Some(f) => f,
                        None => break,
                    },
                    got = conn.next() => {
                        let ended = matches!(
                            got.map(|b| b.map(decode)),
                            Some(Ok(Ok(Frame::Reject { reason: RejectReason::JobEnded, .. })))
                        );
                        if ended {
                            let _ = events.send(Inbound::PeerEnded { to: dial.to }).await;
                            return Ok(());
                        }
                        return Err("the peer closed the connection".to_string());
                    }
                };
                let mut next = Some(frame);
                // Feed everything queued, then flush once.
                while let Some(f) = next {
                    let segments = match f {
                        Outgoing::Frame(f) => encode_segments(&f)
                            .map_err(|e| format!("cannot encode a frame: {e}"))?,
                        Outgoing::Encoded(s) => s,
                    };
                    if segments.len() >= DIRECT_WRITE_BYTES {
                        let bytes = segments.len();
                        tracing::trace!(target: "bspweb::timeline", to = dial.to, bytes, "writing");
                        write_segments(&mut conn, segments)
                            .await
                            .map_err(|e| e.to_string())?;
                        tracing::trace!(target: "bspweb::timeline", to = dial.to, bytes, "written");
                    } else {
                        conn.feed(segments.to_bytes())
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    next = frames.try_recv().ok();
                }
                SinkExt::<Bytes>::flush(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            let _ = SinkExt::<Bytes>::close(&mut conn).await;
            Ok(())
        }
        .await;
        if let Err(error) = result {
            let _ = events
                .send(Inbound::SendFailed { to: dial.to, error })
                .await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn listener() -> (SocketAddr, Arc<Registry>, CancellationToken) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let reg = Arc::new(Registry::new());
        let stop = CancellationToken::new();
        tokio::spawn(serve(l, reg.clone(), stop.clone()));
        (addr, reg, stop)
    }

    async fn raw(addr: SocketAddr) -> FramedConn {
        Framed::new(TcpStream::connect(addr).await.unwrap(), codec())
    }

    async fn answer<S: tokio::io::AsyncRead + Unpin>(
        conn: &mut Framed<S, LengthDelimitedCodec>,
    ) -> Option<Frame> {
        match timeout(Duration::from_secs(10), conn.next()).await.unwrap() {
            Some(Ok(b)) => Some(decode(b).unwrap()),
            _ => None,
        }
    }

    /// A dialer's handshake on a connection opened earlier.
    async fn say_hello(
        stream: TcpStream,
        job: JobId,
        from: PeerId,
        token: &str,
    ) -> Result<SecureConn, String> {
        handshake(stream, job, from, &JobKey::derive(token), 0)
            .await
            .map_err(|(_, e)| e)
    }

    /// A Hello as a dialer under `token` would send it for `job`, naming
    /// `named` in the clear.
    fn hello_for(job: JobId, named: JobId, from: PeerId, token: &str) -> Bytes {
        let payload = postcard::to_allocvec(&HelloPayload { from, epoch: 0 }).unwrap();
        let (_, first) =
            Initiator::start(&JobKey::derive(token), WIRE_VERSION, job, &payload).unwrap();
        encode(&Frame::Hello {
            version: WIRE_VERSION,
            job: named,
            handshake: first.into(),
        })
        .unwrap()
    }

    fn hello(job: JobId, from: PeerId, token: &str) -> Bytes {
        hello_for(job, job, from, token)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    /// Connect to job 7 as peer 2 under "secret", send a `Done` of
    /// `superstep`, and check the job hears of the connection and the frame.
    async fn connect_and_send(
        addr: SocketAddr,
        rx: &mut mpsc::Receiver<Inbound>,
        superstep: u32,
    ) -> SecureConn {
        let mut c = connect(&addr.to_string(), 7, 2, "secret", 0, soon())
            .await
            .unwrap();
        let data = Frame::Done {
            superstep,
            procs: Vec::new(),
        };
        c.send(encode(&data).unwrap()).await.unwrap();
        assert_eq!(rx.recv().await, Some(Inbound::Connected { from: 2 }));
        assert_eq!(
            rx.recv().await,
            Some(Inbound::Frame {
                from: 2,
                frame: data
            })
        );
        c
    }

    #[test]
    fn frames_round_trip_and_trailing_bytes_are_refused() {
        let f = Frame::Done {
            superstep: 3,
            procs: vec![bsp_api::wire::ProcDone {
                pid: 1,
                exited: false,
                counts: vec![(0, 9)],
            }],
        };
        let mut b = encode(&f).unwrap().to_vec();
        assert_eq!(decode(b.clone()).unwrap(), f);
        b.push(0);
        assert!(decode(b.clone()).is_err());
        assert!(decode(Bytes::from_static(&[0xff, 0xff, 0xff])).is_err());
    }

    /// Frames with large byte strings of every kind, shared payloads among
    /// them, and small ones that are copied.
    fn bulky_frames() -> Vec<Frame> {
        use bsp_api::wire::{Checkpoint, WireMessage};
        let big = |n: usize, seed: u8| -> Bytes {
            Bytes::from(
                (0..n)
                    .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                    .collect::<Vec<u8>>(),
            )
        };
        let shared = big(70_000, 9);
        let msg = |seq: u32, payload: Bytes| WireMessage {
            src: 1,
            dst: 2 + seq % 3,
            superstep: 4,
            seq,
            tag: seq % 2,
            payload,
        };
        let outbox = vec![
            msg(0, big(10, 1)),
            msg(1, shared.clone()),
            msg(2, shared.clone()),
            msg(3, big(SEGMENT_MIN_BYTES, 2)),
            msg(4, big(SEGMENT_MIN_BYTES - 1, 3)),
            msg(5, Bytes::new()),
        ];
        let pages = vec![(0, big(65_536, 4)), (7, big(65_536, 5))];
        let checkpoint = Checkpoint {
            pid: 1,
            superstep: 4,
            base: Some(3),
            memory_len: 8 * 65_536,
            pages: pages.clone(),
            globals: vec![1, 2],
            output_seq: 5,
            output_bytes: 6,
            exited: false,
            outbox: outbox.clone(),
            outbox_from: 2,
            hash: [7; 32],
        };
        vec![
            Frame::Data {
                messages: outbox.clone(),
            },
            Frame::CheckpointPart {
                pid: 1,
                superstep: 4,
                pages,
                outbox: outbox.clone(),
            },
            Frame::Checkpoint(Box::new(checkpoint.clone())),
            Frame::Snapshot {
                pid: 1,
                snapshot: Some(Box::new(checkpoint)),
            },
            Frame::Welcome,
            Frame::Data { messages: vec![] },
        ]
    }

    #[test]
    fn segments_are_the_encoding_without_copies_of_large_byte_strings() {
        for f in bulky_frames() {
            let segments = encode_segments(&f).unwrap();
            let whole = encode(&f).unwrap();
            assert_eq!(segments.to_bytes(), whole, "{f:?}");
            assert_eq!(segments.len(), whole.len());
            assert_eq!(decode(segments.to_bytes()).unwrap(), f);
            // Every large byte string of the frame is one of its parts, not
            // a copy (a payload shared by a run of messages is encoded once).
            let bulk = bulk_of(&f);
            let referenced: HashSet<(usize, usize)> = segments
                .parts
                .iter()
                .map(|p| (p.as_ptr() as usize, p.len()))
                .filter(|k| bulk.contains_key(k))
                .collect();
            let large: HashSet<(usize, usize)> = bulk.keys().copied().collect();
            assert_eq!(referenced, large, "a large byte string was copied: {f:?}");
        }
    }

    /// Segments written with vectored writes arrive as the frames they
    /// encode, in order, between frames the codec buffered.
    #[tokio::test]
    async fn segmented_frames_arrive_whole_over_a_socket() {
        let (addr, reg, _stop) = listener().await;
        let (_tx, mut rx) = reg.register(7, "secret", 1, [1, 2]);
        let frames = bulky_frames();
        let expected = frames.clone();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(event) = rx.recv().await {
                match event {
                    Inbound::Connected { .. } => {}
                    Inbound::Frame { frame, .. } => got.push(frame),
                    Inbound::Closed { error: None, .. } => break,
                    other => panic!("{other:?}"),
                }
            }
            got
        });
        let mut conn = connect(&addr.to_string(), 7, 2, "secret", 0, soon())
            .await
            .unwrap();
        for f in &frames {
            // Small ones through the codec's buffer, large ones direct.
            conn.feed(encode(&Frame::Welcome).unwrap()).await.unwrap();
            write_segments(&mut conn, encode_segments(f).unwrap())
                .await
                .unwrap();
        }
        SinkExt::<Bytes>::close(&mut conn).await.unwrap();
        let got = reader.await.unwrap();
        let interleaved: Vec<Frame> = expected
            .into_iter()
            .flat_map(|f| [Frame::Welcome, f])
            .collect();
        assert_eq!(got, interleaved);
    }

    /// Issue 20, finding 2: a stranger cannot make the listener hold a
    /// large frame. The first frame's length prefix is checked against
    /// MAX_HELLO_BYTES and the connection ends before its body is read, so
    /// writing a 16 MiB body fails (before, the listener read all of it).
    #[tokio::test]
    async fn a_stranger_cannot_make_the_listener_buffer_a_large_first_frame() {
        use tokio::io::AsyncWriteExt;
        let (addr, reg, _stop) = listener().await;
        let (_tx, mut rx) = reg.register(7, "secret", 1, [1, 2]);
        let mut s = TcpStream::connect(addr).await.unwrap();
        let len = (MAX_FRAME_BYTES - 1) as u32;
        let body = vec![0x55u8; MAX_FRAME_BYTES - 1];
        let sent = async {
            s.write_all(&len.to_be_bytes()).await?;
            s.write_all(&body).await
        };
        let sent = timeout(Duration::from_secs(30), sent).await.unwrap();
        assert!(
            sent.is_err(),
            "the listener read a 16 MiB frame from a connection that never said hello"
        );
        // A Hello that is just too long is refused the same way.
        let mut c = raw(addr).await;
        let long = encode(&Frame::Hello {
            version: WIRE_VERSION,
            job: 7,
            handshake: vec![0u8; MAX_HELLO_BYTES].into(),
        })
        .unwrap();
        c.send(long).await.unwrap();
        assert_eq!(answer(&mut c).await, None);
        // The listener still serves the real peer, whose frames after the
        // hello may be large.
        let mut c = connect(&addr.to_string(), 7, 2, "secret", 0, soon())
            .await
            .unwrap();
        let big = Frame::Data {
            messages: vec![bsp_api::wire::WireMessage {
                src: 1,
                dst: 1,
                superstep: 0,
                seq: 0,
                tag: 0,
                payload: Bytes::from(vec![7u8; 4 << 20]),
            }],
        };
        c.send(encode(&big).unwrap()).await.unwrap();
        assert_eq!(rx.recv().await, Some(Inbound::Connected { from: 2 }));
        assert_eq!(
            rx.recv().await,
            Some(Inbound::Frame {
                from: 2,
                frame: big
            })
        );
    }

    /// Issue 20, finding 2: connections that have not said hello are
    /// capped per address. The one over the cap is closed at once, while
    /// the earlier silent ones are still waiting and are admitted when they
    /// do say hello.
    #[tokio::test]
    async fn silent_connections_are_capped_per_address() {
        let (addr, reg, _stop) = listener().await;
        let (_tx, _rx) = reg.register(7, "secret", 1, [1, 2]);
        let mut silent = Vec::new();
        for _ in 0..MAX_PENDING_PER_ADDRESS {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut extra = raw(addr).await;
        assert_eq!(answer(&mut extra).await, None, "closed at once");
        let first = silent.remove(0);
        say_hello(first, 7, 2, "secret").await.unwrap();
        // An admitted connection no longer counts: one more may wait. (The
        // listener admits after the key confirmation, which the dialer
        // sends without waiting: give it a moment.)
        let mut admitted = false;
        for _ in 0..100 {
            let another = TcpStream::connect(addr).await.unwrap();
            if say_hello(another, 7, 2, "secret").await.is_ok() {
                admitted = true;
                break;
            }
            sleep(Duration::from_millis(20)).await;
        }
        assert!(admitted);
    }

    #[tokio::test]
    async fn the_listener_rejects_bad_hellos_and_keeps_serving_others() {
        let (addr, reg, _stop) = listener().await;
        let (_tx, mut rx) = reg.register(7, "secret", 1, [1, 2]);

        // Wrong token (so another key): the handshake does not decrypt.
        let mut c = raw(addr).await;
        c.send(hello(7, 2, "guess")).await.unwrap();
        assert!(matches!(
            answer(&mut c).await,
            Some(Frame::Reject {
                reason: RejectReason::NotAuthorized,
                ..
            })
        ));
        assert_eq!(
            answer(&mut c).await,
            None,
            "the connection is closed after a reject"
        );

        // Unknown job.
        let mut c = raw(addr).await;
        c.send(hello(8, 2, "secret")).await.unwrap();
        assert!(matches!(
            answer(&mut c).await,
            Some(Frame::Reject {
                reason: RejectReason::UnknownJob,
                ..
            })
        ));

        // A Hello for another job: made under job 9's key (which the
        // listener also holds) but naming job 7 in the clear, and one made
        // for job 9 under job 7's key. Neither decrypts: the job id is
        // bound into the handshake.
        let (_tx9, _rx9) = reg.register(9, "secret", 1, [1, 2]);
        for h in [hello_for(9, 7, 2, "secret"), hello_for(7, 9, 2, "secret")] {
            let mut c = raw(addr).await;
            c.send(h).await.unwrap();
            assert!(matches!(
                answer(&mut c).await,
                Some(Frame::Reject {
                    reason: RejectReason::NotAuthorized,
                    ..
                })
            ));
        }

        // A sender that is not a peer of the job: refused inside the
        // authenticated answer, and the dialer does not retry.
        let stream = TcpStream::connect(addr).await.unwrap();
        let err = say_hello(stream, 7, 99, "secret").await.unwrap_err();
        assert!(err.contains("not one of the other peers"), "{err}");
        let err = connect(&addr.to_string(), 7, 99, "secret", 0, soon())
            .await
            .unwrap_err();
        assert!(err.contains("not one of the other peers"), "{err}");

        // A dialer under the wrong key retries until its deadline, then
        // gives up; the job hears of nothing.
        let err = connect(
            &addr.to_string(),
            7,
            2,
            "guess",
            0,
            Instant::now() + Duration::from_millis(300),
        )
        .await
        .unwrap_err();
        assert!(err.contains("NotAuthorized"), "{err}");

        // A replayed Hello: the listener answers, but the replayer cannot
        // confirm, so it is never admitted (and so never replaces the real
        // peer's connection, below).
        let replayed = hello(7, 2, "secret");
        let mut c = raw(addr).await;
        c.send(replayed).await.unwrap();
        assert!(matches!(answer(&mut c).await, Some(Frame::Answer { .. })));
        c.send(Bytes::from_static(&[0; 18])).await.unwrap();
        assert_eq!(answer(&mut c).await, None, "closed without admission");

        // A first frame that is not Hello.
        let mut c = raw(addr).await;
        c.send(encode(&Frame::Welcome).unwrap()).await.unwrap();
        assert!(matches!(
            answer(&mut c).await,
            Some(Frame::Reject {
                reason: RejectReason::Protocol,
                ..
            })
        ));

        // Garbage as a first frame.
        let mut c = raw(addr).await;
        c.send(Bytes::from_static(b"\xff\xff\xff\xff"))
            .await
            .unwrap();
        assert!(matches!(
            answer(&mut c).await,
            Some(Frame::Reject {
                reason: RejectReason::Protocol,
                ..
            })
        ));

        // The listener still serves the real peer.
        let mut c = connect_and_send(addr, &mut rx, 0).await;

        // A second connection for the same peer and job replaces the first
        // (the peer reconnected after its connection broke).
        let mut c2 = connect(&addr.to_string(), 7, 2, "secret", 0, soon())
            .await
            .unwrap();
        assert_eq!(rx.recv().await, Some(Inbound::Connected { from: 2 }));
        assert_eq!(
            answer(&mut c).await,
            None,
            "the replaced connection is closed"
        );

        // A malformed frame closes that connection and tells the job.
        c2.send(Bytes::from_static(b"\x09")).await.unwrap();
        assert!(matches!(
            rx.recv().await,
            Some(Inbound::Closed { from: 2, error: Some(e) }) if e.contains("malformed")
        ));

        // A record altered on the way closes the connection and tells the
        // job; the job's other connections go on.
        let mut c3 = connect(&addr.to_string(), 7, 2, "secret", 0, soon())
            .await
            .unwrap();
        assert_eq!(rx.recv().await, Some(Inbound::Connected { from: 2 }));
        {
            use tokio::io::AsyncWriteExt;
            // A record of 100 bytes that was not encrypted under the key.
            let mut forged = vec![0u8, 100];
            forged.extend_from_slice(&[0x5a; 100]);
            c3.get_mut().raw_mut().write_all(&forged).await.unwrap();
        }
        assert!(matches!(
            rx.recv().await,
            Some(Inbound::Closed { from: 2, error: Some(e) }) if e.contains("did not decrypt")
        ));
        connect_and_send(addr, &mut rx, 1).await;
    }

    #[tokio::test]
    async fn a_dialer_retries_until_the_job_is_known() {
        let (addr, reg, _stop) = listener().await;
        let dial = tokio::spawn(async move {
            connect(&addr.to_string(), 5, 3, "t", 0, soon())
                .await
                .map(|_| ())
        });
        // Let the dialer be refused at least once, then register the job.
        sleep(Duration::from_millis(120)).await;
        let (_tx, mut rx) = reg.register(5, "t", 4, [3, 4]);
        dial.await.unwrap().unwrap();
        assert_eq!(rx.recv().await, Some(Inbound::Connected { from: 3 }));
    }

    #[tokio::test]
    async fn a_dialer_gives_up_at_its_deadline() {
        let (addr, _reg, _stop) = listener().await;
        let deadline = Instant::now() + Duration::from_millis(300);
        let err = connect(&addr.to_string(), 5, 3, "t", 0, deadline)
            .await
            .unwrap_err();
        assert!(err.contains("does not know the job"), "{err}");
    }

    /// When the job ends on the listening peer, the dialer hears so and
    /// stops (no reconnect, no re-send); a connection that merely breaks
    /// is a failure to recover from.
    #[tokio::test]
    async fn a_dialer_hears_that_the_job_ended_and_stops() {
        let (addr, reg, _stop) = listener().await;
        let (_tx, mut rx) = reg.register(5, "t", 4, [3, 4]);
        let (events_tx, mut events) = mpsc::channel(8);
        let (frames, frames_rx) = mpsc::unbounded_channel();
        let dial = Dial {
            addr: addr.to_string(),
            job: 5,
            from: 3,
            to: 4,
            token: "t".into(),
            epoch: 0,
            deadline: soon(),
        };
        let writer = spawn_writer(dial, frames_rx, events_tx);
        frames.send(Frame::Welcome.into()).unwrap();
        assert_eq!(rx.recv().await, Some(Inbound::Connected { from: 3 }));
        assert!(matches!(
            rx.recv().await,
            Some(Inbound::Frame { from: 3, .. })
        ));
        drop(rx); // the job's driver on peer 4 ended
        let heard = timeout(Duration::from_secs(10), events.recv())
            .await
            .unwrap();
        assert_eq!(heard, Some(Inbound::PeerEnded { to: 4 }));
        timeout(Duration::from_secs(10), writer)
            .await
            .unwrap()
            .unwrap();
    }
}
