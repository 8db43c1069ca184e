//! `sample-sort`: sorts random `u64` keys with regular sampling (PSRS).
//!
//! Arguments (JSON, optional): `{"n": 1000000, "oversample": 64, "emit": false}`.
//!
//! With `P` processes, process `p`:
//!
//! 1. draws the keys of its block `[p n / P, (p + 1) n / P)`
//!    ([`bspweb::dist::block`]) with `bsp.rng().next_u64()`, one per key in
//!    order; its *original checksum* is their wrapping sum;
//! 2. sorts them and picks `oversample` regular samples: with `L` local keys
//!    (if `L > 0`), sample `j` is `keys[j * L / oversample]` for `j` in
//!    `0..oversample`; sends them (a `Vec<u64>`) to every process; sync;
//! 3. sorts all `M` samples (concatenated in pid order) and takes the `P - 1`
//!    splitters `all[j * M / P]` for `j` in `1..P` (none if `M == 0`); key `k`
//!    goes to bucket `j`, the first `j` with `k < splitter[j]`, else to
//!    bucket `P - 1`; sends bucket `j` to pid `j` as little-endian `u64`
//!    bytes in messages of at most 1 MiB; sync;
//! 4. sorts the keys it received, prints `pid {p} holds {count} keys`, and,
//!    if `emit`, writes them as raw records of little-endian `u64`s of at most
//!    1 MiB each;
//! 5. sends `(count, min, max, checksum of held keys, original checksum,
//!    locally sorted)` to pid 0 (`min = max = 0` when it holds none); sync.
//!
//! Pid 0 then checks that the counts add up to `n`, that the held checksums
//! add up (wrapping) to the original ones, that every non-empty process's
//! minimum is at least the previous non-empty process's maximum, and that
//! all are sorted. On success it prints `sorted {n} keys on {P} processes: ok`
//! and `checksum {x:016x}` (the wrapping sum of all keys); otherwise it aborts
//! the job saying what failed.

use bspweb::{Bsp, Error, Result, dist};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Args {
    n: u64,
    oversample: u32,
    emit: bool,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            n: 1_000_000,
            oversample: 64,
            emit: false,
        }
    }
}

/// Keys per message or raw record: 1 MiB of payload.
const CHUNK_KEYS: usize = (1 << 20) / 8;

/// What each process reports to pid 0 for the verification.
#[derive(Serialize, Deserialize)]
struct Report {
    count: u64,
    min: u64,
    max: u64,
    checksum: u64,
    original_checksum: u64,
    sorted: bool,
}

fn checksum(keys: &[u64]) -> u64 {
    keys.iter().fold(0u64, |a, &k| a.wrapping_add(k))
}

fn le_bytes(keys: &[u64]) -> Vec<u8> {
    keys.iter().flat_map(|k| k.to_le_bytes()).collect()
}

#[bspweb::main]
async fn main(bsp: &mut Bsp, args: Args) -> Result<()> {
    if args.oversample == 0 {
        return Err(Error::msg("oversample must be at least 1"));
    }
    let (pid, nprocs) = (bsp.pid(), bsp.nprocs());

    // 1. Generate the local keys.
    let block = dist::block(args.n, nprocs, pid);
    let rng = bsp.rng();
    let mut keys: Vec<u64> = block.map(|_| rng.next_u64()).collect();
    let original_checksum = checksum(&keys);
    keys.sort_unstable();

    // 2. Regular samples to everyone.
    let samples: Vec<u64> = if keys.is_empty() {
        Vec::new()
    } else {
        let (len, s) = (keys.len() as u64, u64::from(args.oversample));
        (0..s).map(|j| keys[(j * len / s) as usize]).collect()
    };
    bsp.send_range(.., &samples)?;
    bsp.sync().await;

    // 3. Splitters, then the buckets to their owners.
    let mut all = Vec::new();
    for m in bsp.messages() {
        all.extend(m.decode::<Vec<u64>>()?);
    }
    all.sort_unstable();
    let m = all.len() as u64;
    let splitters: Vec<u64> = if all.is_empty() {
        Vec::new()
    } else {
        (1..u64::from(nprocs))
            .map(|j| all[(j * m / u64::from(nprocs)) as usize])
            .collect()
    };
    let mut start = 0;
    for dst in 0..nprocs {
        let end = match splitters.get(dst as usize) {
            Some(&s) => start + keys[start..].partition_point(|&k| k < s),
            None if dst + 1 == nprocs => keys.len(),
            None => start, // no splitters: everything goes to the last bucket
        };
        for chunk in keys[start..end].chunks(CHUNK_KEYS) {
            bsp.send_bytes(dst, &le_bytes(chunk))?;
        }
        start = end;
    }
    drop(keys);
    bsp.sync().await;

    // 4. Sort what arrived.
    let mut held = Vec::new();
    for m in bsp.messages() {
        if m.len() % 8 != 0 {
            return Err(Error::msg(format!(
                "a bucket message from pid {} has {} bytes, not a multiple of 8",
                m.source(),
                m.len()
            )));
        }
        held.extend(
            m.bytes()
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("chunks of 8 bytes"))),
        );
    }
    held.sort_unstable();
    bsp.println(format!("pid {pid} holds {} keys", held.len()));
    if args.emit {
        for chunk in held.chunks(CHUNK_KEYS) {
            bsp.write_raw(&le_bytes(chunk))?;
        }
    }

    // 5. Verify at pid 0.
    let report = Report {
        count: held.len() as u64,
        min: held.first().copied().unwrap_or(0),
        max: held.last().copied().unwrap_or(0),
        checksum: checksum(&held),
        original_checksum,
        sorted: held.windows(2).all(|w| w[0] <= w[1]),
    };
    bsp.send(0, &report)?;
    bsp.sync().await;

    if pid == 0 {
        let mut total = 0u64;
        let (mut held_sum, mut original_sum) = (0u64, 0u64);
        let mut previous_max: Option<(u32, u64)> = None;
        for p in 0..nprocs {
            let r: Report = bsp
                .find_message(p, 0)
                .ok_or_else(|| Error::msg(format!("no verification report from pid {p}")))?
                .decode()?;
            total += r.count;
            held_sum = held_sum.wrapping_add(r.checksum);
            original_sum = original_sum.wrapping_add(r.original_checksum);
            if !r.sorted {
                bsp.abort(format!("sample sort failed: pid {p}'s keys are not sorted"));
            }
            if r.count > 0 {
                if let Some((q, max)) = previous_max
                    && r.min < max
                {
                    bsp.abort(format!(
                        "sample sort failed: pid {p}'s smallest key {} is below pid {q}'s largest key {max}",
                        r.min
                    ));
                }
                previous_max = Some((p, r.max));
            }
        }
        if total != args.n {
            bsp.abort(format!(
                "sample sort failed: the processes hold {total} keys, not {}",
                args.n
            ));
        }
        if held_sum != original_sum {
            bsp.abort(format!(
                "sample sort failed: the held keys' checksum {held_sum:016x} differs from the generated keys' {original_sum:016x}"
            ));
        }
        bsp.println(format!("sorted {} keys on {nprocs} processes: ok", args.n));
        bsp.println(format!("checksum {original_sum:016x}"));
    }
    Ok(())
}
