use super::*;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use proptest::prelude::*;
use tokio::io::{AsyncWriteExt, DuplexStream, duplex};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

const JOB: JobId = 42;
const VERSION: u32 = 7;

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(32 << 20)
        .new_codec()
}

/// A full handshake: the dialer under `dialer`'s key, the listener under
/// `listener`'s, the listener told `job_heard`.
fn handshake(
    dialer: &JobKey,
    listener: &JobKey,
    job_heard: JobId,
) -> Result<(Transport, Transport), NoiseError> {
    let (i, m1) = Initiator::start(dialer, VERSION, JOB, b"hello payload")?;
    let (r, p) = Responder::accept(listener, VERSION, job_heard, &m1)?;
    assert_eq!(p, b"hello payload");
    let (rt, m2) = r.answer(b"welcome")?;
    let (it, p) = i.finish(&m2)?;
    assert_eq!(p, b"welcome");
    Ok((it, rt))
}

fn keys() -> (Transport, Transport) {
    let k = JobKey::derive("token");
    handshake(&k, &k, JOB).unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn bytes_of(n: usize, seed: usize) -> Bytes {
    Bytes::from(
        (0..n)
            .map(|i| (i.wrapping_mul(131) ^ seed.wrapping_mul(7)) as u8)
            .collect::<Vec<u8>>(),
    )
}

#[test]
fn the_handshake_needs_the_same_job_key_and_job() {
    let k = JobKey::derive("token of job 42");
    assert!(handshake(&k, &k, JOB).is_ok());
    // Another job's key (another token): message 1 does not decrypt.
    let other = JobKey::derive("token of job 43");
    assert!(matches!(
        handshake(&k, &other, JOB),
        Err(NoiseError::Handshake)
    ));
    // The job id is in the prologue: a Hello made for job 42 does not pass
    // as one for job 43 even where both had the same key.
    assert!(matches!(
        handshake(&k, &k, JOB + 1),
        Err(NoiseError::Handshake)
    ));
    // A truncated or altered message 1 fails too.
    let (_, m1) = Initiator::start(&k, VERSION, JOB, b"x").unwrap();
    assert!(Responder::accept(&k, VERSION, JOB, &m1[..m1.len() - 1]).is_err());
    let mut bad = m1.clone();
    bad[40] ^= 1;
    assert!(Responder::accept(&k, VERSION, JOB, &bad).is_err());
    assert!(Responder::accept(&k, VERSION, JOB, &[]).is_err());
    // The key is derived, not the token.
    assert_ne!(JobKey::derive("a").0, JobKey::derive("b").0);
    assert_eq!(format!("{:?}", JobKey::derive("a")), "JobKey(..)");
}

/// Send `frames` through `conn`: every other one through the codec's
/// buffer, the others as vectored writes of the length prefix and the body
/// cut in three (what `net::write_segments` does).
async fn send_all<S: AsyncWrite + Unpin>(
    conn: &mut Framed<S, LengthDelimitedCodec>,
    frames: &[Bytes],
) {
    for (n, f) in frames.iter().enumerate() {
        if n % 2 == 0 {
            conn.feed(f.clone()).await.unwrap();
        } else {
            SinkExt::<Bytes>::flush(conn).await.unwrap();
            let prefix = (f.len() as u32).to_be_bytes();
            let (a, b) = (f.len() / 3, 2 * f.len() / 3);
            let mut parts: Vec<&[u8]> = vec![&prefix, &f[..a], &f[a..b], &f[b..]];
            while !parts.is_empty() {
                let slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
                let mut written = conn.get_mut().write_vectored(&slices).await.unwrap();
                assert!(written > 0);
                while written > 0 {
                    let k = written.min(parts[0].len());
                    parts[0] = &parts[0][k..];
                    written -= k;
                    if parts[0].is_empty() {
                        parts.remove(0);
                    }
                }
                parts.retain(|p| !p.is_empty());
            }
        }
    }
    SinkExt::<Bytes>::close(conn).await.unwrap();
}

/// `frames` through a pipe, plain or encrypted; what arrived.
async fn through(frames: Vec<Bytes>, secure: bool) -> Vec<Bytes> {
    let (a, b) = duplex(64 << 10);
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        if secure {
            let (_, r) = keys_for_reader();
            let mut conn = Framed::new(SecureStream::new(b, r, BytesMut::new()), codec());
            while let Some(f) = conn.next().await {
                got.push(f.unwrap().freeze());
            }
        } else {
            let mut conn = Framed::new(b, codec());
            while let Some(f) = conn.next().await {
                got.push(f.unwrap().freeze());
            }
        }
        got
    });
    if secure {
        let (w, _) = keys_for_reader();
        let mut s = SecureStream::new(a, w, BytesMut::new());
        s.queue_confirmation().unwrap();
        send_all(&mut Framed::new(s, codec()), &frames).await;
    } else {
        send_all(&mut Framed::new(a, codec()), &frames).await;
    }
    reader.await.unwrap()
}

/// A handshake with fixed ephemeral keys, so every call gives the same
/// transport keys: the finished handshake states of both ends.
fn fixed_handshake() -> (HandshakeState, HandshakeState) {
    let k = JobKey::derive("token");
    let p = prologue(VERSION, JOB);
    let params: snow::params::NoiseParams = PATTERN.parse().unwrap();
    let mut i = snow::Builder::new(params.clone())
        .psk(0, &k.0)
        .unwrap()
        .prologue(&p)
        .unwrap()
        .fixed_ephemeral_key_for_testing_only(&[1; 32])
        .build_initiator()
        .unwrap();
    let mut r = snow::Builder::new(params)
        .psk(0, &k.0)
        .unwrap()
        .prologue(&p)
        .unwrap()
        .fixed_ephemeral_key_for_testing_only(&[2; 32])
        .build_responder()
        .unwrap();
    let mut m = [0u8; 256];
    let mut out = [0u8; 256];
    let n = i.write_message(&[], &mut m).unwrap();
    r.read_message(&m[..n], &mut out).unwrap();
    let n = r.write_message(&[], &mut m).unwrap();
    i.read_message(&m[..n], &mut out).unwrap();
    (i, r)
}

/// Both ends' transport keys, the same in every call (the writer and the
/// reader of a test each make theirs).
fn keys_for_reader() -> (Transport, Transport) {
    let (mut i, mut r) = fixed_handshake();
    (
        Transport::split(&mut i).unwrap(),
        Transport::split(&mut r).unwrap(),
    )
}

/// The records are AEGIS-256X4 under the keys of Noise's split (the
/// initiator sends with the first), the nonce the record's number
/// little-endian: an independent computation with those keys gives the
/// same bytes, record after record, in both directions.
#[test]
fn records_are_aegis_256x4_under_the_split_keys() {
    let (mut ours_i, mut ours_r) = keys_for_reader();
    let (mut i, _r) = fixed_handshake();
    let (i_to_r, r_to_i) = i.dangerously_get_raw_split();
    let expected = |key: &[u8; 32], number: u64, text: &[u8]| {
        let mut nonce = [0u8; 32];
        nonce[..8].copy_from_slice(&number.to_le_bytes());
        let (mut c, tag) = aegis::aegis256x4::Aegis256X4::<16>::new(key, &nonce).encrypt(text, &[]);
        c.extend_from_slice(&tag);
        c
    };
    for round in 0..3u8 {
        let text = vec![round; 100 + usize::from(round)];
        for initiator_sends in [true, false] {
            let (send, recv, key) = if initiator_sends {
                (&mut ours_i.send, &mut ours_r.recv, &i_to_r)
            } else {
                (&mut ours_r.send, &mut ours_i.recv, &r_to_i)
            };
            let mut record = text.clone();
            record.resize(text.len() + TAG_BYTES, 0);
            send.seal(&mut record).unwrap();
            assert_eq!(record, expected(key, u64::from(round), &text));
            assert_eq!(recv.open(&mut record).unwrap(), text.len());
            assert_eq!(record[..text.len()], text[..]);
        }
    }
    // A record opened out of order (its nonce is not the next one) does
    // not decrypt, nor one shorter than its tag.
    let mut first = vec![7u8; 10 + TAG_BYTES];
    ours_i.send.seal(&mut first).unwrap();
    let mut second = vec![8u8; 10 + TAG_BYTES];
    ours_i.send.seal(&mut second).unwrap();
    assert!(ours_r.recv.open(&mut second).is_err());
    assert!(ours_r.recv.open(&mut [0u8; 5]).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10))]

    /// Frames of any size, written through the codec's buffer and with
    /// vectored writes, arrive through the encrypted stream exactly as
    /// through a plain one (the reference model).
    #[test]
    fn frames_of_any_size_round_trip_like_the_plain_codec(
        sizes in prop::collection::vec(
            prop_oneof![0usize..64, 0usize..200_000, 0usize..(5 << 20)],
            1..8,
        )
    ) {
        let frames: Vec<Bytes> = sizes.iter().enumerate().map(|(i, &n)| bytes_of(n, i)).collect();
        let rt = rt();
        let plain = rt.block_on(through(frames.clone(), false));
        let secure = rt.block_on(through(frames.clone(), true));
        prop_assert_eq!(&plain, &frames);
        prop_assert_eq!(secure, plain);
    }
}

/// What the writer puts on the wire for `frames`, after the confirmation.
async fn wire_bytes(frames: &[Bytes]) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let (a, mut b) = duplex(64 << 20);
    let (w, _) = keys_for_reader();
    let mut s = SecureStream::new(a, w, BytesMut::new());
    s.queue_confirmation().unwrap();
    send_all(&mut Framed::new(s, codec()), frames).await;
    let mut raw = Vec::new();
    b.read_to_end(&mut raw).await.unwrap();
    raw
}

/// Read frames from `raw` as the listener would.
async fn read_back(raw: Vec<u8>) -> Vec<Result<Bytes, std::io::Error>> {
    let (mut a, b): (DuplexStream, DuplexStream) = duplex(64 << 20);
    a.write_all(&raw).await.unwrap();
    drop(a);
    let (_, r) = keys_for_reader();
    let mut conn = Framed::new(SecureStream::new(b, r, BytesMut::new()), codec());
    let mut got = Vec::new();
    while let Some(f) = conn.next().await {
        let end = f.is_err();
        got.push(f.map(|b| b.freeze()));
        if end {
            break;
        }
    }
    got
}

#[test]
fn what_crosses_the_wire_is_not_the_plaintext() {
    let marker = Bytes::from_static(b"bspweb-secret-marker-1234567890");
    let frames = vec![marker.clone(), bytes_of(300_000, 1), marker.clone()];
    let raw = rt().block_on(wire_bytes(&frames));
    assert!(!raw.windows(marker.len()).any(|w| w == &marker[..]));
    let back = rt().block_on(read_back(raw));
    let back: Vec<Bytes> = back.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(back, frames);
}

#[test]
fn a_flipped_repeated_or_missing_byte_ends_the_stream_with_an_error() {
    let frames = vec![bytes_of(100, 1), bytes_of(200_000, 2), bytes_of(10, 3)];
    let raw = rt().block_on(wire_bytes(&frames));
    let first_data = 2 + TAG_BYTES; // after the confirmation record
    // A flipped bit anywhere in a record's ciphertext or tag, or in its
    // length: the stream fails there.
    for at in [first_data + 2, first_data + 10, raw.len() - 1, first_data] {
        let mut bad = raw.clone();
        bad[at] ^= 0x40;
        let got = rt().block_on(read_back(bad));
        assert!(
            got.iter().any(|r| r.is_err()),
            "flipping byte {at} went unnoticed"
        );
        assert!(got.len() <= frames.len());
    }
    // The confirmation record repeated (a replayed record): refused.
    let mut replayed = raw[..first_data].to_vec();
    replayed.extend_from_slice(&raw);
    let got = rt().block_on(read_back(replayed));
    assert!(matches!(got.as_slice(), [Err(e)] if e.kind() == io::ErrorKind::InvalidData));
    // Cut in the middle of a record: an error, not a short frame.
    let got = rt().block_on(read_back(raw[..raw.len() - 5].to_vec()));
    assert!(got.iter().any(|r| r.is_err()));
    assert!(got.iter().filter(|r| r.is_ok()).count() < frames.len());
}

#[test]
fn the_listener_reads_exactly_the_key_confirmation() {
    let rt = rt();
    rt.block_on(async {
        // A real confirmation, followed by a frame: the frame stays unread.
        let frames = vec![bytes_of(1000, 9)];
        let raw = wire_bytes(&frames).await;
        let (mut a, b) = duplex(1 << 20);
        a.write_all(&raw).await.unwrap();
        drop(a);
        let (_, r) = keys_for_reader();
        let mut s = SecureStream::new(b, r, BytesMut::new());
        s.read_confirmation().await.unwrap();
        let mut conn = Framed::new(s, codec());
        assert_eq!(conn.next().await.unwrap().unwrap().freeze(), frames[0]);

        // A data record where the confirmation belongs: refused.
        let raw = wire_bytes(&frames).await;
        let (mut a, b) = duplex(1 << 20);
        a.write_all(&raw[2 + TAG_BYTES..]).await.unwrap();
        drop(a);
        let (_, r) = keys_for_reader();
        let mut s = SecureStream::new(b, r, BytesMut::new());
        assert!(matches!(
            s.read_confirmation().await,
            Err(NoiseError::NoConfirmation)
        ));

        // Under another key (keys() makes fresh ephemerals): refused.
        let raw = wire_bytes(&frames).await;
        let (mut a, b) = duplex(1 << 20);
        a.write_all(&raw).await.unwrap();
        drop(a);
        let (_, r) = keys();
        let mut s = SecureStream::new(b, r, BytesMut::new());
        assert!(matches!(
            s.read_confirmation().await,
            Err(NoiseError::Record)
        ));
    });
}
