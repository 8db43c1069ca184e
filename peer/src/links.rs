//! Link measurement (issue 15, dissertation ch. 5): this peer measures the
//! round trip and bandwidth to the few peers the supernode names in its
//! lease ([`bsp_api::control::Lease::probe`]) and answers their probes,
//! within the volunteer's cap on probe traffic per hour
//! (`--probe-mib-per-hour`). Results go to the supernode with the next
//! renewal. The protocol and its tickets are [`bsp_api::probe`].

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bsp_api::PeerId;
use bsp_api::control::{LinkMeasurement, ProbeTarget};
use bsp_api::wire::{Frame, ProbeFrame, RejectReason, WIRE_VERSION};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};
use tokio_util::codec::Framed;

use crate::net::{FramedConn, codec, decode, encode};

/// Bytes of one probe's bulk transfer: long enough to time on a LAN, a
/// tenth of a second at 20 Mbit/s.
pub const BULK_BYTES: usize = 256 << 10;

/// Round trips timed per probe (the shortest counts).
pub const PINGS: u32 = 4;

/// What one probe costs the budget of each side: its bulk and a margin for
/// the small frames and TCP's overhead.
pub const PROBE_COST: u64 = BULK_BYTES as u64 + (16 << 10);

/// The longest a probe may take, either side.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The default cap on probe traffic, MiB per hour (`--probe-mib-per-hour`):
/// about 120 probes sent or answered per hour.
pub const DEFAULT_MIB_PER_HOUR: u64 = 32;

/// A token bucket of bytes: refills at `per_hour` bytes per hour, holds at
/// most a tenth of an hour's worth (pure: the caller passes the time).
#[derive(Debug, Clone)]
pub struct Budget {
    per_hour: u64,
    available: f64,
    at: Option<Instant>,
}

impl Budget {
    /// A full bucket for `per_hour` bytes per hour (0: probes off).
    pub fn new(per_hour: u64) -> Budget {
        Budget {
            per_hour,
            available: Self::capacity(per_hour),
            at: None,
        }
    }

    fn capacity(per_hour: u64) -> f64 {
        per_hour as f64 / 10.0
    }

    /// Whether probes are allowed at all.
    pub fn enabled(&self) -> bool {
        self.per_hour > 0
    }

    fn refill(&mut self, now: Instant) {
        if let Some(at) = self.at {
            let hours = now.saturating_duration_since(at).as_secs_f64() / 3600.0;
            self.available =
                (self.available + hours * self.per_hour as f64).min(Self::capacity(self.per_hour));
        }
        self.at = Some(now);
    }

    /// Whether the bucket holds `bytes` at `now`.
    pub fn has(&mut self, bytes: u64, now: Instant) -> bool {
        self.refill(now);
        self.per_hour > 0 && self.available >= bytes as f64
    }

    /// Take `bytes` if the bucket holds them at `now`.
    pub fn try_take(&mut self, bytes: u64, now: Instant) -> bool {
        if !self.has(bytes, now) {
            return false;
        }
        self.available -= bytes as f64;
        true
    }
}

#[derive(Debug)]
struct State {
    /// This peer's id and probe key, once a lease gave them.
    identity: Option<(PeerId, [u8; 32])>,
    budget: Budget,
    /// A probe of ours is running (one at a time).
    measuring: bool,
    /// A probe of another peer is being answered (one at a time).
    answering: bool,
    results: Vec<LinkMeasurement>,
}

/// This peer's side of link measurement, shared by the renewal loop (which
/// starts probes and reports results) and the data-plane listener (which
/// answers probes).
#[derive(Debug)]
pub struct Links {
    state: Mutex<State>,
}

impl Default for Links {
    fn default() -> Self {
        Links::new(DEFAULT_MIB_PER_HOUR << 20)
    }
}

impl Links {
    /// Probing within `bytes_per_hour` (0: neither measure nor answer).
    pub fn new(bytes_per_hour: u64) -> Links {
        Links {
            state: Mutex::new(State {
                identity: None,
                budget: Budget::new(bytes_per_hour),
                measuring: false,
                answering: false,
                results: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease's identity: probes to this peer are checked with `key`.
    pub fn set_identity(&self, me: PeerId, key_hex: &str) {
        let key = bsp_api::probe::hex_decode(key_hex).and_then(|k| <[u8; 32]>::try_from(k).ok());
        self.lock().identity = key.map(|k| (me, k));
    }

    /// The measurements since the last call, for a renewal.
    pub fn take_results(&self) -> Vec<LinkMeasurement> {
        std::mem::take(&mut self.lock().results)
    }

    /// Measure the links to `targets`, one after another, as far as the
    /// budget allows; results wait for [`Links::take_results`]. Does
    /// nothing while an earlier call is still measuring.
    pub async fn measure_all(&self, targets: Vec<ProbeTarget>) {
        let me = {
            let mut s = self.lock();
            let Some((me, _)) = s.identity else { return };
            if s.measuring || !s.budget.enabled() || targets.is_empty() {
                return;
            }
            s.measuring = true;
            me
        };
        for t in targets {
            if t.peer == me || !self.lock().budget.has(PROBE_COST, Instant::now()) {
                continue;
            }
            // Paid for once the target accepted (a refusal costs a few
            // bytes); probes run one at a time, so the check above holds.
            let accepted = match timeout(PROBE_TIMEOUT, measure(&t, me)).await {
                Ok(Ok(m)) => {
                    self.lock().results.push(m);
                    true
                }
                Ok(Err(e)) => {
                    tracing::debug!("cannot measure the link to peer {}: {e}", t.peer);
                    e.accepted
                }
                Err(_) => {
                    tracing::debug!("measuring the link to peer {} timed out", t.peer);
                    true
                }
            };
            if accepted {
                self.lock().budget.try_take(PROBE_COST, Instant::now());
            }
        }
        self.lock().measuring = false;
    }

    /// Answer a probe that opened `conn` with `hello` (the listener's
    /// first frame). Refuses it (and says why) if its ticket is not the
    /// supernode's, or if this peer does not probe, is answering another
    /// probe or has spent its budget.
    pub async fn answer(&self, mut conn: FramedConn, hello: ProbeFrame) {
        let ProbeFrame::Hello {
            version,
            from,
            to,
            expires_ms,
            ticket,
        } = hello
        else {
            return refuse(
                conn,
                RejectReason::Protocol,
                "a probe starts with Hello".into(),
            )
            .await;
        };
        if version != WIRE_VERSION {
            let msg = format!(
                "data-plane protocol version {version} is not supported; this peer speaks version {WIRE_VERSION}"
            );
            return refuse(conn, RejectReason::Version, msg).await;
        }
        let admitted = {
            let mut s = self.lock();
            match s.identity {
                None => Err((RejectReason::Busy, "this peer has no lease yet".to_string())),
                Some((me, key)) => {
                    match bsp_api::probe::verify(&key, me, from, to, expires_ms, &ticket, now_ms())
                    {
                        Err(e) => Err((RejectReason::NotAuthorized, e.to_string())),
                        Ok(()) if !s.budget.enabled() => Err((
                            RejectReason::Busy,
                            "this peer's volunteer turned link probes off".to_string(),
                        )),
                        Ok(()) if s.answering => Err((
                            RejectReason::Busy,
                            "this peer is answering another probe".to_string(),
                        )),
                        Ok(()) if !s.budget.try_take(PROBE_COST, Instant::now()) => Err((
                            RejectReason::Busy,
                            "this peer's probe traffic for the hour is spent".to_string(),
                        )),
                        Ok(()) => {
                            s.answering = true;
                            Ok(())
                        }
                    }
                }
            }
        };
        if let Err((reason, msg)) = admitted {
            return refuse(conn, reason, msg).await;
        }
        let _ = timeout(PROBE_TIMEOUT, echo(&mut conn)).await;
        self.lock().answering = false;
    }
}

/// The target's side after `Ready`: `Pong` every `Ping`, `Received` the
/// bulk, then close.
async fn echo(conn: &mut FramedConn) -> Result<(), ProbeFailure> {
    conn.codec_mut().set_max_frame_length(BULK_BYTES + 64);
    send(conn, ProbeFrame::Ready).await?;
    let mut pings = 0;
    while let Some(item) = conn.next().await {
        let bytes = item.map_err(ProbeFailure::Io)?;
        match decode(bytes.freeze()) {
            Ok(Frame::Probe(ProbeFrame::Ping(i))) if pings < 2 * PINGS => {
                pings += 1;
                send(conn, ProbeFrame::Pong(i)).await?;
            }
            Ok(Frame::Probe(ProbeFrame::Bulk(b))) => {
                send(conn, ProbeFrame::Received(b.len() as u32)).await?;
                break;
            }
            _ => return Err(ProbeFailure::NotAProbe),
        }
    }
    let _ = SinkExt::<Bytes>::close(conn).await;
    Ok(())
}

async fn send(conn: &mut FramedConn, frame: ProbeFrame) -> Result<(), ProbeFailure> {
    let bytes = encode(&Frame::Probe(frame)).map_err(ProbeFailure::Encode)?;
    conn.send(bytes).await.map_err(ProbeFailure::Io)
}

async fn refuse(mut conn: FramedConn, reason: RejectReason, message: String) {
    tracing::debug!("refusing a link probe ({reason:?}): {message}");
    if let Ok(bytes) = encode(&Frame::Reject { reason, message }) {
        let _ = timeout(Duration::from_secs(2), async {
            let _ = conn.send(bytes).await;
            let _ = SinkExt::<Bytes>::close(&mut conn).await;
        })
        .await;
    }
}

/// The next probe frame from `conn`; a `Reject` is an error with its reason.
async fn next(conn: &mut FramedConn) -> Result<ProbeFrame, ProbeFailure> {
    let bytes = conn
        .next()
        .await
        .ok_or(ProbeFailure::Closed)?
        .map_err(ProbeFailure::Io)?;
    match decode(bytes.freeze()) {
        Ok(Frame::Probe(f)) => Ok(f),
        Ok(Frame::Reject { reason, message }) => Err(ProbeFailure::Refused { reason, message }),
        Ok(_) => Err(ProbeFailure::NotAProbe),
        Err(e) => Err(ProbeFailure::Malformed(e)),
    }
}

/// What went wrong in a link probe.
#[derive(Debug, thiserror::Error)]
pub enum ProbeFailure {
    #[error("cannot connect to {addr}: {error}")]
    Connect { addr: String, error: std::io::Error },
    #[error("{0}")]
    Io(std::io::Error),
    #[error("cannot encode a probe frame: {0}")]
    Encode(postcard::Error),
    #[error("the peer closed the connection")]
    Closed,
    #[error("refused ({reason:?}): {message}")]
    Refused {
        reason: RejectReason,
        message: String,
    },
    #[error("not a probe frame")]
    NotAProbe,
    #[error("a malformed frame: {0}")]
    Malformed(postcard::Error),
    #[error("expected {expected}, got {got}")]
    Unexpected { expected: String, got: String },
}

/// Why a measurement failed, and whether the target had accepted it (its
/// traffic counts against the budget).
#[derive(Debug, thiserror::Error)]
#[error("{failure}")]
pub struct ProbeError {
    pub accepted: bool,
    pub failure: ProbeFailure,
}

/// Measure the link to `target` as peer `me`: the shortest of [`PINGS`]
/// round trips, then the bandwidth of [`BULK_BYTES`] less one round trip.
pub async fn measure(target: &ProbeTarget, me: PeerId) -> Result<LinkMeasurement, ProbeError> {
    let refused = |failure| ProbeError {
        accepted: false,
        failure,
    };
    let mut conn = open(target, me).await.map_err(refused)?;
    exchange(&mut conn, target.peer)
        .await
        .map_err(|failure| ProbeError {
            accepted: true,
            failure,
        })
}

/// Connect and say `Hello` until `Ready`.
async fn open(target: &ProbeTarget, me: PeerId) -> Result<FramedConn, ProbeFailure> {
    let stream = TcpStream::connect(&target.addr)
        .await
        .map_err(|error| ProbeFailure::Connect {
            addr: target.addr.clone(),
            error,
        })?;
    let _ = stream.set_nodelay(true);
    let mut conn = Framed::new(stream, codec());
    send(
        &mut conn,
        ProbeFrame::Hello {
            version: WIRE_VERSION,
            from: me,
            to: target.peer,
            expires_ms: target.expires_ms,
            ticket: target.ticket.clone(),
        },
    )
    .await?;
    match next(&mut conn).await? {
        ProbeFrame::Ready => Ok(conn),
        other => Err(ProbeFailure::Unexpected {
            expected: "Ready".into(),
            got: format!("{other:?}"),
        }),
    }
}

/// The round trips and the bulk, after `Ready`.
async fn exchange(conn: &mut FramedConn, peer: PeerId) -> Result<LinkMeasurement, ProbeFailure> {
    let mut rtt = Duration::MAX;
    for i in 0..PINGS {
        let start = Instant::now();
        send(conn, ProbeFrame::Ping(i)).await?;
        match next(conn).await? {
            ProbeFrame::Pong(j) if j == i => rtt = rtt.min(start.elapsed()),
            other => {
                return Err(ProbeFailure::Unexpected {
                    expected: format!("Pong({i})"),
                    got: format!("{other:?}"),
                });
            }
        }
    }
    let bulk = Bytes::from(vec![0u8; BULK_BYTES]);
    let start = Instant::now();
    send(conn, ProbeFrame::Bulk(bulk)).await?;
    match next(conn).await? {
        ProbeFrame::Received(n) if n as usize == BULK_BYTES => {}
        other => {
            return Err(ProbeFailure::Unexpected {
                expected: format!("Received({BULK_BYTES})"),
                got: format!("{other:?}"),
            });
        }
    }
    let transfer = start
        .elapsed()
        .saturating_sub(rtt)
        .max(Duration::from_micros(1));
    Ok(LinkMeasurement {
        peer,
        rtt_us: u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX).max(1),
        bandwidth_bps: (BULK_BYTES as f64 / transfer.as_secs_f64()) as u64,
    })
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refills_at_its_rate_up_to_a_tenth_of_an_hour() {
        let t0 = Instant::now();
        let mut b = Budget::new(3600);
        // Starts full: 360 bytes.
        assert!(b.try_take(300, t0));
        assert!(!b.try_take(100, t0));
        // One byte per second.
        assert!(b.try_take(100, t0 + Duration::from_secs(40)));
        assert!(!b.try_take(1, t0 + Duration::from_secs(40)));
        // Never more than 360 however long it waits.
        assert!(!b.try_take(361, t0 + Duration::from_secs(100_000)));
        assert!(b.try_take(360, t0 + Duration::from_secs(100_000)));
        let mut off = Budget::new(0);
        assert!(!off.enabled());
        assert!(!off.try_take(0, t0));
    }

    /// Answers probes on a loopback listener with `links`.
    async fn serve(links: std::sync::Arc<Links>) -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let mut conn = Framed::new(stream, codec());
                if let Some(Ok(first)) = conn.next().await
                    && let Ok(Frame::Probe(hello)) = decode(first.freeze())
                {
                    links.answer(conn, hello).await;
                }
            }
        });
        (addr, server)
    }

    fn identity(links: &Links, secret: &[u8], me: PeerId) {
        let key = bsp_api::probe::probe_key(secret, me);
        links.set_identity(me, &bsp_api::probe::hex_encode(&key));
    }

    /// A probe between two peers on loopback: measured with the
    /// supernode's ticket, refused with any other, and refused by a target
    /// whose volunteer turned probes off.
    #[tokio::test]
    async fn a_ticket_opens_a_measurement_and_nothing_else_does() {
        let secret = b"supernode secret";
        let target = std::sync::Arc::new(Links::default());
        identity(&target, secret, 2);
        let (addr, server) = serve(target).await;
        let key = bsp_api::probe::probe_key(secret, 2);
        let expires_ms = now_ms() + 60_000;
        let good = ProbeTarget {
            peer: 2,
            addr,
            expires_ms,
            ticket: bsp_api::probe::ticket(&key, 1, 2, expires_ms),
        };
        let m = measure(&good, 1).await.expect("measured");
        assert_eq!(m.peer, 2);
        assert!(m.rtt_us > 0 && m.bandwidth_bps > 0, "{m:?}");
        // Peer 3 with peer 1's ticket; a ticket under another key; expired.
        let err = measure(&good, 3).await.expect_err("refused").to_string();
        assert!(err.contains("NotAuthorized"), "{err}");
        let forged = ProbeTarget {
            ticket: bsp_api::probe::ticket(&[7; 32], 1, 2, expires_ms),
            ..good.clone()
        };
        let err = measure(&forged, 1).await.expect_err("refused").to_string();
        assert!(err.contains("not the supernode's"), "{err}");
        let expired = ProbeTarget {
            expires_ms: 1,
            ticket: bsp_api::probe::ticket(&key, 1, 2, 1),
            ..good.clone()
        };
        let err = measure(&expired, 1).await.expect_err("refused").to_string();
        assert!(err.contains("expired"), "{err}");
        // The prober's results wait for the renewal, once.
        let prober = Links::default();
        identity(&prober, secret, 1);
        prober.measure_all(vec![good.clone()]).await;
        assert_eq!(prober.take_results().len(), 1);
        assert!(prober.take_results().is_empty());
        // A prober whose volunteer turned probes off measures nothing.
        let off = Links::new(0);
        identity(&off, secret, 1);
        off.measure_all(vec![good.clone()]).await;
        assert!(off.take_results().is_empty());
        server.abort();

        // A target whose volunteer turned probes off refuses.
        let target = std::sync::Arc::new(Links::new(0));
        identity(&target, secret, 2);
        let (addr, server) = serve(target).await;
        let err = measure(
            &ProbeTarget {
                addr: addr.clone(),
                ..forged
            },
            1,
        )
        .await
        .expect_err("refused")
        .to_string();
        assert!(
            err.contains("not the supernode's"),
            "a bad ticket is refused first: {err}"
        );
        let err = measure(&ProbeTarget { addr, ..good }, 1)
            .await
            .expect_err("refused")
            .to_string();
        assert!(err.contains("turned link probes off"), "{err}");
        server.abort();
    }
}
