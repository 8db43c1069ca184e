//! `broadcast`: the two broadcast forms of the API, and large broadcasts.
//!
//! Without arguments (`null`): pid 0 sends `"range hello"` to every pid with
//! `send_range(0..n)` and `"list hello"` to the even pids with `send_list`;
//! every pid sends `"from {pid}"` to the list `[0, n - 1]` (twice to pid 0
//! when `n == 1`). After the sync each process prints, for each message in
//! delivery order, `pid {me} got {text} from {src}`, then
//! `pid {me} got {k} messages`.
//!
//! With `{"bytes": N}`: a large broadcast. In each of `rounds` supersteps
//! (default 1) pid `round % n` sends `N` pseudo-random bytes (from the job
//! seed and the round) to every pid with `send_range`, in messages of at
//! most 8 MiB. It prints `round {r}: pid {me} sent {N} bytes fnv {h}` and
//! every receiver, after the sync,
//! `round {r}: pid {me} got {N} bytes fnv {h}` with the FNV-1a hash of what
//! it got (`"check": false` skips the hash, for benchmarks, and prints
//! `fnv -`; `"alone": true` has the sender send to itself only, the
//! baseline a benchmark subtracts).

use bspweb::{Bsp, Result};
use serde::Deserialize;

/// The largest message the ABI takes.
const CHUNK: usize = 8 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Large {
    bytes: usize,
    #[serde(default = "one")]
    rounds: u32,
    #[serde(default = "yes")]
    check: bool,
    /// The sender sends only to itself: a baseline for benchmarks (what a
    /// round costs without the broadcast).
    #[serde(default)]
    alone: bool,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

#[bspweb::main]
async fn main(bsp: &mut Bsp, args: Option<Large>) -> Result<()> {
    match args {
        None => hello(bsp).await,
        Some(large) => big(bsp, large).await,
    }
}

async fn hello(bsp: &mut Bsp) -> Result<()> {
    let (pid, n) = (bsp.pid(), bsp.nprocs());
    if pid == 0 {
        bsp.send_range(0..n, "range hello")?;
        let evens: Vec<u32> = (0..n).step_by(2).collect();
        bsp.send_list(&evens, "list hello")?;
    }
    bsp.send_list(&[0, n - 1], &format!("from {pid}"))?;
    bsp.sync().await;

    for m in bsp.messages() {
        let text: String = m.decode()?;
        bsp.println(format!("pid {pid} got {text} from {}", m.source()));
    }
    bsp.println(format!("pid {pid} got {} messages", bsp.message_count()));
    Ok(())
}

/// FNV-1a, 64 bits, continued from `h`.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

fn show(check: bool, h: u64) -> String {
    if check {
        format!("{h:016x}")
    } else {
        "-".into()
    }
}

async fn big(bsp: &mut Bsp, a: Large) -> Result<()> {
    let (pid, n) = (bsp.pid(), bsp.nprocs());
    for round in 0..a.rounds {
        let root = round % n;
        if pid == root {
            // xorshift64* from the seed and the round: the same bytes on every run.
            let mut x = bsp.seed() ^ (u64::from(round) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut data = vec![0u8; a.bytes];
            for chunk in data.chunks_mut(8) {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
                chunk.copy_from_slice(&v[..chunk.len()]);
            }
            let h = if a.check { fnv(FNV_START, &data) } else { 0 };
            let to = if a.alone { root..root + 1 } else { 0..n };
            for part in data.chunks(CHUNK) {
                bsp.send_range_bytes(to.clone(), part)?;
            }
            bsp.println(format!(
                "round {round}: pid {pid} sent {} bytes fnv {}",
                a.bytes,
                show(a.check, h)
            ));
        }
        bsp.sync().await;
        let mut got = 0usize;
        let mut h = FNV_START;
        for m in bsp.find_messages(root) {
            got += m.len();
            if a.check {
                h = fnv(h, m.bytes());
            }
        }
        bsp.println(format!(
            "round {round}: pid {pid} got {got} bytes fnv {}",
            show(a.check, h)
        ));
    }
    Ok(())
}
