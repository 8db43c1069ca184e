//! The physical limits of loopback TCP on this machine, measured in the run
//! that compares against them (`bsp_params`, `loopback_broadcast`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// One-byte ping-pong round trip with Nagle off.
#[allow(dead_code)]
pub fn loopback_rtt() -> Duration {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut b = [0u8; 1];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut b = [7u8; 1];
    for _ in 0..1000 {
        s.write_all(&b).unwrap();
        s.read_exact(&mut b).unwrap();
    }
    let n = 20_000;
    let t = Instant::now();
    for _ in 0..n {
        s.write_all(&b).unwrap();
        s.read_exact(&mut b).unwrap();
    }
    let rtt = t.elapsed() / n;
    drop(s);
    echo.join().unwrap();
    rtt
}

/// Single-stream bandwidth in bytes per second (2 GiB in 1 MiB writes).
pub fn loopback_bandwidth() -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let total: usize = 2 << 30;
    let sink = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < total {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        s.write_all(&[1]).unwrap();
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let mut sent = 0;
    while sent < total {
        s.write_all(&buf).unwrap();
        sent += buf.len();
    }
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).unwrap();
    let secs = t.elapsed().as_secs_f64();
    sink.join().unwrap();
    total as f64 / secs
}

/// The data plane's record layer against plain TCP on loopback, measured
/// the same way in one run: bspweb peers talk through `peer::noise`'s
/// `SecureStream` (a Noise handshake, then AEGIS-256X4 records of up to
/// 64 KiB), and there is no plain data plane to run a job over any more, so
/// the comparison is of the two streams themselves.
#[allow(dead_code)]
pub struct RecordLayer {
    /// Single-stream bandwidth in bytes per second, 1 MiB writes.
    pub plain_bw: f64,
    pub sealed_bw: f64,
    /// One-byte ping-pong round trip.
    pub plain_rtt: Duration,
    pub sealed_rtt: Duration,
}

#[allow(dead_code)]
pub fn record_layer() -> RecordLayer {
    use bspweb_peer::noise::{Initiator, JobKey, Responder, SecureStream};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        async fn connected() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let (a, b) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
            let (a, b) = (a.unwrap(), b.unwrap().0);
            a.set_nodelay(true).unwrap();
            b.set_nodelay(true).unwrap();
            (a, b)
        }
        let sealed = || async {
            let (a, b) = connected().await;
            let key = JobKey::derive(&"0123456789abcdef".repeat(4));
            let (init, hello) = Initiator::start(&key, 1, 1, b"").unwrap();
            let (resp, _) = Responder::accept(&key, 1, 1, &hello).unwrap();
            let (to_dialer, answer) = resp.answer(b"").unwrap();
            let (to_listener, _) = init.finish(&answer).unwrap();
            (
                SecureStream::new(a, to_listener, bytes::BytesMut::new()),
                SecureStream::new(b, to_dialer, bytes::BytesMut::new()),
            )
        };
        // Alternately, the best of three each: the order of two runs alone
        // moved either by 20 % (the cores' clocks, the allocator's state).
        let (mut plain_bw, mut sealed_bw) = (0f64, 0f64);
        let (mut plain_rtt, mut sealed_rtt) = (Duration::MAX, Duration::MAX);
        for _ in 0..3 {
            let (a, b) = connected().await;
            plain_bw = plain_bw.max(stream_bandwidth(a, b).await);
            let (a, b) = sealed().await;
            sealed_bw = sealed_bw.max(stream_bandwidth(a, b).await);
            let (a, b) = connected().await;
            plain_rtt = plain_rtt.min(stream_rtt(a, b).await);
            let (a, b) = sealed().await;
            sealed_rtt = sealed_rtt.min(stream_rtt(a, b).await);
        }
        RecordLayer {
            plain_bw,
            sealed_bw,
            plain_rtt,
            sealed_rtt,
        }
    })
}

/// Bytes per second from `tx` to `rx` (512 MiB in 1 MiB writes, after a
/// warm-up), the receiver on another task.
async fn stream_bandwidth<S>(mut tx: S, mut rx: S) -> f64
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let total: usize = 512 << 20;
    let warm: usize = 64 << 20;
    let sink = tokio::spawn(async move {
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < warm + total {
            match rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        rx.write_all(&[1]).await.unwrap();
        rx.flush().await.unwrap();
    });
    let buf = vec![0x5au8; 1 << 20];
    let mut sent = 0;
    while sent < warm {
        tx.write_all(&buf).await.unwrap();
        sent += buf.len();
    }
    let t = Instant::now();
    let mut sent = 0;
    while sent < total {
        tx.write_all(&buf).await.unwrap();
        sent += buf.len();
    }
    tx.flush().await.unwrap();
    let mut ack = [0u8; 1];
    tx.read_exact(&mut ack).await.unwrap();
    let secs = t.elapsed().as_secs_f64();
    sink.await.unwrap();
    total as f64 / secs
}

/// One-byte ping-pong round trip between `a` and an echo on `b`.
async fn stream_rtt<S>(mut a: S, mut b: S) -> Duration
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = tokio::spawn(async move {
        let mut x = [0u8; 1];
        while b.read_exact(&mut x).await.is_ok() {
            if b.write_all(&x).await.is_err() || b.flush().await.is_err() {
                break;
            }
        }
    });
    let mut x = [7u8; 1];
    let mut once = async |a: &mut S| {
        a.write_all(&x).await.unwrap();
        a.flush().await.unwrap();
        a.read_exact(&mut x).await.unwrap();
    };
    for _ in 0..1000 {
        once(&mut a).await;
    }
    let n = 10_000;
    let t = Instant::now();
    for _ in 0..n {
        once(&mut a).await;
    }
    let rtt = t.elapsed() / n;
    drop(a);
    let _ = echo.await;
    rtt
}
