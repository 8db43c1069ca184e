//! `supersteps`: `k` supersteps, each with an `h`-relation, checked.
//!
//! Arguments (JSON, optional): `{"k": 10, "h": 0}`.
//!
//! In each superstep every process sends `h` bytes in total, split as evenly
//! as possible over the other `n - 1` processes: pid `(pid + j) % n` gets
//! [`bspweb::dist::share`]`(h, n - 1, j - 1)` bytes for `j` in `1..n` (nothing
//! when `n == 1` or `h == 0`), as raw messages of at most 1 MiB. Byte `i` of
//! what `src` sends to `dst` in superstep `s` is
//! `(31 src + 17 dst + 7 s + i) mod 256`. After the sync each process checks
//! that it received exactly that (else it aborts the job). After `k`
//! supersteps each process prints `pid {p} ok` and pid 0 prints
//! `done {k} supersteps h={h}`. Useful to measure the BSP parameters `g` and
//! `L`.

use bspweb::{Bsp, Error, Result, dist};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Args {
    k: u32,
    h: u64,
}

impl Default for Args {
    fn default() -> Self {
        Args { k: 10, h: 0 }
    }
}

const CHUNK: u64 = 1 << 20;

fn pattern_byte(src: u32, dst: u32, step: u32, i: u64) -> u8 {
    (31 * u64::from(src) + 17 * u64::from(dst) + 7 * u64::from(step)).wrapping_add(i) as u8
}

/// `RAMP[k] = k mod 256`: bytes `i..i + len` of a pattern that starts at
/// byte value `b` are `RAMP[(b + i) % 256..]`, repeated every 256 bytes. The
/// pattern is written and checked eight bytes at a time from it (a byte at a
/// time, the guest's own loops would dominate what `g` measures; the Open
/// MPI reference runs the same pattern as native code).
const RAMP: [u8; 256 + 8] = {
    let mut r = [0u8; 256 + 8];
    let mut k = 0;
    while k < r.len() {
        r[k] = k as u8;
        k += 1;
    }
    r
};

/// The 8 pattern bytes from byte value `b`, as a little-endian word.
fn ramp_word(b: u8) -> u64 {
    let b = usize::from(b);
    u64::from_le_bytes(RAMP[b..b + 8].try_into().expect("8 bytes"))
}

/// Appends bytes `i..i + len` of the stream `src` sends `dst` in `step`.
fn fill_pattern(buf: &mut Vec<u8>, src: u32, dst: u32, step: u32, i: u64, len: u64) {
    let mut b = pattern_byte(src, dst, step, i);
    let mut left = len as usize;
    while left >= 256 {
        let start = usize::from(b);
        buf.extend_from_slice(&RAMP[start..256]);
        buf.extend_from_slice(&RAMP[..start]);
        left -= 256;
    }
    for _ in 0..left {
        buf.push(b);
        b = b.wrapping_add(1);
    }
}

/// Whether `bytes` are bytes `i..` of the stream `src` sends `dst` in `step`.
fn is_pattern(bytes: &[u8], src: u32, dst: u32, step: u32, i: u64) -> bool {
    let mut b = pattern_byte(src, dst, step, i);
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        if u64::from_le_bytes(w.try_into().expect("8 bytes")) != ramp_word(b) {
            return false;
        }
        b = b.wrapping_add(8);
    }
    words.remainder().iter().all(|&x| {
        let ok = x == b;
        b = b.wrapping_add(1);
        ok
    })
}

/// How many bytes `src` sends `dst` per superstep.
fn amount(h: u64, n: u32, src: u32, dst: u32) -> u64 {
    if n < 2 || src == dst {
        return 0;
    }
    let j = (dst + n - src) % n; // dst = (src + j) % n, j in 1..n
    dist::share(h, n - 1, j - 1)
}

#[bspweb::main]
async fn main(bsp: &mut Bsp, args: Args) -> Result<()> {
    let (pid, n) = (bsp.pid(), bsp.nprocs());
    if n > 1 && args.h / u64::from(n - 1) > 1 << 30 {
        return Err(Error::msg("h is too large: at most 1 GiB per destination"));
    }
    let mut buf = Vec::new();
    for step in 0..args.k {
        for j in 1..n {
            let dst = (pid + j) % n;
            let total = amount(args.h, n, pid, dst);
            let mut sent = 0;
            while sent < total {
                let len = CHUNK.min(total - sent);
                buf.clear();
                fill_pattern(&mut buf, pid, dst, step, sent, len);
                bsp.send_bytes(dst, &buf)?;
                sent += len;
            }
        }
        bsp.sync().await;

        let mut got = vec![0u64; n as usize];
        for m in bsp.messages() {
            let src = m.source();
            if src == pid || m.superstep() != step {
                bsp.abort(format!(
                    "pid {pid} in superstep {}: unexpected message from pid {src} sent in superstep {}",
                    step + 1,
                    m.superstep()
                ));
            }
            let offset = got[src as usize];
            let ok = is_pattern(m.bytes(), src, pid, step, offset);
            if !ok {
                bsp.abort(format!(
                    "pid {pid} in superstep {}: the bytes from pid {src} are corrupted",
                    step + 1
                ));
            }
            got[src as usize] += m.len() as u64;
        }
        for src in 0..n {
            let expected = amount(args.h, n, src, pid);
            if got[src as usize] != expected {
                bsp.abort(format!(
                    "pid {pid} in superstep {}: received {} bytes from pid {src}, expected {expected}",
                    step + 1,
                    got[src as usize]
                ));
            }
        }
    }
    bsp.println(format!("pid {pid} ok"));
    if pid == 0 {
        bsp.println(format!("done {} supersteps h={}", args.k, args.h));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_wise_pattern_is_the_byte_wise_one() {
        for (src, dst, step) in [(0, 1, 0), (3, 2, 7), (1, 0, 255), (15, 9, 1000)] {
            for (i, len) in [
                (0, 0),
                (0, 1),
                (5, 7),
                (3, 256),
                (250, 1000),
                (1 << 20, 4099),
            ] {
                let mut buf = Vec::new();
                fill_pattern(&mut buf, src, dst, step, i, len);
                let expected: Vec<u8> = (i..i + len)
                    .map(|k| pattern_byte(src, dst, step, k))
                    .collect();
                assert_eq!(
                    buf, expected,
                    "src {src} dst {dst} step {step} from {i}, {len} bytes"
                );
                assert!(is_pattern(&buf, src, dst, step, i));
                for flip in [0, len / 2, len.saturating_sub(1)] {
                    if len == 0 {
                        continue;
                    }
                    let mut bad = buf.clone();
                    bad[flip as usize] ^= 1;
                    assert!(!is_pattern(&bad, src, dst, step, i), "byte {flip} flipped");
                }
                assert!(len == 0 || !is_pattern(&buf, src, dst, step, i + 1));
            }
        }
    }
}
