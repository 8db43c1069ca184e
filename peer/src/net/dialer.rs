//! The dialing side ([`connect`], [`spawn_writer`]): the handshake with
//! retries while the other peer does not know the job yet, and the writer
//! task of each connection.

use super::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// First wait before asking a peer again that did not know the job yet
/// (doubled at each try, up to 1 s).
pub const UNKNOWN_JOB_RETRY: Duration = Duration::from_millis(2);

/// Whether and how soon a failed handshake is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    /// A rejection other than "unknown job": fail.
    Never,
    /// The peer does not know the job yet: it will within milliseconds.
    Soon,
    /// Refused, broken or timed out: back off from 50 ms.
    Later,
}

/// Why an outbound connection's writer stopped (reported, as text for the
/// log, in [`Inbound::SendFailed`]).
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("could not connect: {0}")]
    Connect(DialError),
    #[error("the peer closed the connection")]
    Closed,
    #[error("cannot encode a frame: {0}")]
    Encode(postcard::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Why a data-plane connection could not be opened and welcomed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("the handshake timed out")]
    TimedOut,
    #[error("cannot encode hello: {0}")]
    Encode(postcard::Error),
    #[error("cannot start the handshake: {0}")]
    Start(NoiseError),
    #[error("cannot send hello: {0}")]
    Send(std::io::Error),
    #[error("the handshake failed: {0}")]
    Read(std::io::Error),
    #[error("it closed the connection during the handshake")]
    Closed,
    #[error("it does not know the job yet: {0}")]
    UnknownJob(String),
    /// A reject inside the authenticated answer, or a version or protocol
    /// mismatch: retrying cannot help.
    #[error("it rejected us ({reason:?}): {message}")]
    Rejected {
        reason: RejectReason,
        message: String,
    },
    /// A plain (unauthenticated) reject: anyone on the path could forge it.
    #[error("it refused the handshake ({reason:?}): {message}")]
    Refused {
        reason: RejectReason,
        message: String,
    },
    #[error("it answered hello with {0}")]
    Unexpected(String),
    #[error("it sent a malformed answer: {0}")]
    Malformed(postcard::Error),
    #[error("its answer failed the handshake: {0}")]
    Answer(NoiseError),
    #[error("cannot confirm the handshake: {0}")]
    Confirm(NoiseError),
    #[error("cannot confirm the handshake: {0}")]
    Flush(std::io::Error),
}

impl DialError {
    /// Whether and how soon to try again.
    pub(super) fn retry(&self) -> Retry {
        match self {
            DialError::Connect(_)
            | DialError::TimedOut
            | DialError::Send(_)
            | DialError::Read(_)
            | DialError::Closed
            | DialError::Refused { .. }
            | DialError::Answer(_)
            | DialError::Flush(_) => Retry::Later,
            DialError::UnknownJob(_) => Retry::Soon,
            DialError::Encode(_)
            | DialError::Start(_)
            | DialError::Rejected { .. }
            | DialError::Unexpected(_)
            | DialError::Malformed(_)
            | DialError::Confirm(_) => Retry::Never,
        }
    }
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
) -> Result<SecureConn, DialError> {
    let key = JobKey::derive(token);
    let mut later = Duration::from_millis(50);
    let mut soon = UNKNOWN_JOB_RETRY;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = timeout(left.min(HANDSHAKE_TIMEOUT), async {
            let stream = TcpStream::connect(addr).await.map_err(DialError::Connect)?;
            let _ = stream.set_nodelay(true);
            handshake(stream, job, from, &key, epoch).await
        })
        .await;
        let error = match attempt {
            Ok(Ok(conn)) => return Ok(conn),
            Ok(Err(e)) => e,
            Err(_) => DialError::TimedOut,
        };
        let backoff = match error.retry() {
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
pub(super) async fn handshake(
    stream: TcpStream,
    job: JobId,
    from: PeerId,
    key: &JobKey,
    epoch: u64,
) -> Result<SecureConn, DialError> {
    let payload =
        postcard::to_allocvec(&HelloPayload { from, epoch }).map_err(DialError::Encode)?;
    let (initiator, first) =
        Initiator::start(key, WIRE_VERSION, job, &payload).map_err(DialError::Start)?;
    let hello = encode(&Frame::Hello {
        version: WIRE_VERSION,
        job,
        handshake: first.into(),
    })
    .map_err(DialError::Encode)?;
    let mut conn = Framed::new(
        stream,
        LengthDelimitedCodec::builder()
            .max_frame_length(MAX_HELLO_BYTES)
            .new_codec(),
    );
    conn.send(hello).await.map_err(DialError::Send)?;
    let answer = match conn.next().await {
        Some(Ok(bytes)) => decode(bytes),
        Some(Err(e)) => return Err(DialError::Read(e)),
        None => return Err(DialError::Closed),
    };
    let handshake = match answer {
        Ok(Frame::Answer { handshake }) => handshake,
        Ok(Frame::Reject {
            reason: RejectReason::UnknownJob,
            message,
        }) => return Err(DialError::UnknownJob(message)),
        Ok(Frame::Reject {
            reason: reason @ (RejectReason::Version | RejectReason::Protocol),
            message,
        }) => return Err(DialError::Rejected { reason, message }),
        Ok(Frame::Reject { reason, message }) => {
            return Err(DialError::Refused { reason, message });
        }
        Ok(other) => return Err(DialError::Unexpected(format!("{other:?}"))),
        Err(e) => return Err(DialError::Malformed(e)),
    };
    let (transport, payload) = initiator.finish(&handshake).map_err(|e| {
        tracing::warn!("data plane: job {job}: a listener's answer failed the handshake ({e})");
        DialError::Answer(e)
    })?;
    match decode(payload) {
        Ok(Frame::Welcome) => {}
        Ok(Frame::Reject { reason, message }) => {
            return Err(DialError::Rejected { reason, message });
        }
        Ok(other) => return Err(DialError::Unexpected(format!("{other:?}"))),
        Err(e) => return Err(DialError::Malformed(e)),
    }
    let parts = conn.into_parts();
    let mut secure = SecureStream::new(parts.io, transport, parts.read_buf);
    secure.queue_confirmation().map_err(DialError::Confirm)?;
    let mut conn = Framed::new(secure, codec());
    SinkExt::<Bytes>::flush(&mut conn)
        .await
        .map_err(DialError::Flush)?;
    Ok(conn)
}

/// Write one frame: a large one straight to the socket, a small one into
/// the codec's buffer (flushed once the queue is empty).
async fn write(conn: &mut SecureConn, segments: Segments, to: PeerId) -> Result<(), SendError> {
    if segments.len() >= DIRECT_WRITE_BYTES {
        let bytes = segments.len();
        tracing::trace!(target: "bspweb::timeline", to, bytes, "writing");
        write_segments(conn, segments).await?;
        tracing::trace!(target: "bspweb::timeline", to, bytes, "written");
    } else {
        conn.feed(segments.to_bytes()).await?;
    }
    Ok(())
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
/// [`Inbound::SendFailed`]. The bytes of [`Outgoing::Deferred`] frames it
/// writes (checkpoints) are added to `written`.
pub fn spawn_writer(
    dial: Dial,
    mut frames: mpsc::UnboundedReceiver<Outgoing>,
    events: mpsc::Sender<Inbound>,
    written: Arc<AtomicU64>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let result: Result<(), SendError> = async {
            let mut conn = connect(
                &dial.addr,
                dial.job,
                dial.from,
                &dial.token,
                dial.epoch,
                dial.deadline,
            )
            .await
            .map_err(SendError::Connect)?;
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
                        return Err(SendError::Closed);
                    }
                };
                let mut next = Some(frame);
                // Feed everything queued, then flush once.
                while let Some(f) = next {
                    match f {
                        Outgoing::Frame(f) => {
                            let segments = encode_segments(&f).map_err(SendError::Encode)?;
                            write(&mut conn, segments, dial.to).await?;
                        }
                        Outgoing::Deferred(d) => {
                            tracing::trace!(target: "bspweb::timeline", to = dial.to, "making frames");
                            if d.slow() {
                                // Many page patches would hold up this
                                // worker's other tasks (a panic there
                                // leaves them unmade: made below).
                                let making = d.clone();
                                let _ = tokio::task::spawn_blocking(move || {
                                    let _ = making.segments();
                                })
                                .await;
                            }
                            let made = d.segments().map_err(SendError::Encode)?;
                            let bytes: usize = made.iter().map(Segments::len).sum();
                            written.fetch_add(bytes as u64, Ordering::Relaxed);
                            for s in made {
                                write(&mut conn, s.clone(), dial.to).await?;
                            }
                        }
                    }
                    next = frames.try_recv().ok();
                }
                SinkExt::<Bytes>::flush(&mut conn).await?;
            }
            let _ = SinkExt::<Bytes>::close(&mut conn).await;
            Ok(())
        }
        .await;
        if let Err(error) = result {
            let _ = events
                .send(Inbound::SendFailed {
                    to: dial.to,
                    error: error.to_string(),
                })
                .await;
        }
    })
}
