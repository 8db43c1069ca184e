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
                buf.extend((sent..sent + len).map(|i| pattern_byte(pid, dst, step, i)));
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
            let ok = m
                .bytes()
                .iter()
                .zip(offset..)
                .all(|(&b, i)| b == pattern_byte(src, pid, step, i));
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
