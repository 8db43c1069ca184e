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
