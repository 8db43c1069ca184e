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

use crate::noise::{Initiator, JobKey, NoiseError, Responder, SecureStream};

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

mod codec;
mod dialer;
mod listener;
mod registry;

pub use codec::*;
pub use dialer::*;
pub use listener::*;
pub use registry::*;

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
            .map_err(|e| e.to_string())
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
            acks: Vec::new(),
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
                digest: None,
            }],
            acks: vec![(2, 7)],
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
            patched: vec![1],
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
                patched: vec![0, 3],
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
        assert!(
            matches!(&err, DialError::Rejected { reason: RejectReason::NotAuthorized, message } if message.contains("not one of the other peers")),
            "{err}"
        );

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
        assert!(
            matches!(
                err,
                DialError::Refused {
                    reason: RejectReason::NotAuthorized,
                    ..
                }
            ),
            "{err}"
        );

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
        assert!(matches!(err, DialError::UnknownJob(_)), "{err}");
        assert!(err.to_string().contains("does not know the job"), "{err}");
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
        let writer = spawn_writer(dial, frames_rx, events_tx, Default::default());
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
