//! `pagerank`: PageRank of a generated graph, block-distributed.
//!
//! Arguments (JSON, all optional):
//! `{"n": 200000, "m": 1000000, "iters": 100, "seed": 1}`.
//!
//! The graph (`n` vertices, `m` edges, from `seed`; not the job's seed, so
//! the graph is the same for every job), the fixed-point arithmetic and the
//! argument why the result is the same for every number of processes are in
//! `pagerank/kernel.rs`, which the native reference (the end-to-end test and
//! `benches/pagerank.rs`) compiles from the same source.
//!
//! Process `p` of `P` owns the vertices `[p n / P, (p + 1) n / P)`
//! ([`bspweb::dist::block`]) and generates their out-lists. Each of the
//! `iters` supersteps:
//!
//! 1. scatter: push each owned vertex's share along its out-edges into an
//!    accumulator with an entry per vertex of the graph; sum the owned
//!    dangling vertices' ranks;
//! 2. send every other process `q` one dense block of little-endian `u64`s
//!    ([`Bsp::send_numbers`], straight from the accumulator): this
//!    process's dangling sum (a message of its own), then the accumulator
//!    entries of `q`'s vertices, split into messages of at most 1 MiB (they
//!    arrive in sending order); zero the entries sent (they are dead until
//!    the next scatter, and zeroed before the sync their pages are the same
//!    as at the last checkpoint, so no checkpoint carries them); sync;
//! 3. add the blocks received into the owned entries and the dangling sums
//!    into the total, then update the owned ranks.
//!
//! Then every process sends pid 0 the summary of its block (sum of ranks,
//! top 5, checksum; a raw message), and after a sync pid 0 prints:
//!
//! ```text
//! pagerank of {n} vertices ({dangling} dangling), {m} edges, seed {seed}, damping 0.85, {iters} iterations
//! sum of ranks 0.999999999…
//! change in the last iteration (L1) 0.000000…
//! top 1: vertex {v} rank 0.00…          (5 lines, or n if fewer)
//! checksum {16 hex digits}
//! ```
//!
//! The buffers (accumulator, ranks) are allocated once.

#[path = "pagerank/kernel.rs"]
#[allow(dead_code)] // the native reference is for the test and the benchmark
mod kernel;

use std::ops::Range;

use bspweb::{Bsp, Error, Result, dist};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Args {
    n: u64,
    m: u64,
    iters: u32,
    seed: u64,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            n: 200_000,
            m: 1_000_000,
            iters: 100,
            seed: 1,
        }
    }
}

/// Words (`u64`s) per message: 1 MiB.
const CHUNK_WORDS: usize = (1 << 20) / 8;

/// The vertices of pid `q`.
fn block(n: u32, nprocs: u32, q: u32) -> Range<u32> {
    let b = dist::block(u64::from(n), nprocs, q);
    // Within 0..n, and n is a u32.
    b.start as u32..b.end as u32
}

#[bspweb::main]
async fn main(bsp: &mut Bsp, args: Args) -> Result<()> {
    let params = kernel::Params::new(args.n, args.m, args.iters, args.seed).map_err(Error::msg)?;
    let (pid, nprocs) = (bsp.pid(), bsp.nprocs());
    let blocks: Vec<Range<u32>> = (0..nprocs).map(|q| block(params.n, nprocs, q)).collect();
    let owned = blocks[pid as usize].clone();
    let owned_len = owned.len();

    let graph = kernel::Graph::generate(&params, owned);
    let mut pr = kernel::PageRank::new(&params, &graph);

    for _ in 0..params.iters {
        let own_dangling = pr.scatter(&graph);
        for q in (0..nprocs).filter(|&q| q != pid) {
            // The stream to q: word 0 is the dangling sum, word 1 + i the
            // entry of q's vertex i.
            bsp.send_numbers(q, &[own_dangling])?;
            for chunk in pr.outgoing(blocks[q as usize].clone()).chunks(CHUNK_WORDS) {
                bsp.send_numbers(q, chunk)?;
            }
        }
        // Sent (copied out): dead until the next scatter, and unchanged
        // since the last checkpoint once zeroed again.
        pr.clear_outgoing();
        bsp.sync().await;

        // Messages arrive by source pid, then in sending order: walk each
        // source's stream.
        let mut dangling = own_dangling;
        let mut current: Option<(u32, usize)> = None; // (source, words read)
        let mut sources = 0;
        for m in bsp.messages() {
            let bytes = m.bytes();
            let mut pos = match current {
                Some((src, pos)) if src == m.source() => pos,
                _ => {
                    finished(current, owned_len)?;
                    sources += 1;
                    0
                }
            };
            let mut rest = bytes;
            if pos == 0 {
                let Some((head, tail)) = bytes.split_first_chunk::<8>() else {
                    return Err(Error::msg(format!(
                        "a contribution block from pid {} has {} bytes, fewer than its 8-byte header",
                        m.source(),
                        bytes.len()
                    )));
                };
                dangling = dangling.wrapping_add(u64::from_le_bytes(*head));
                rest = tail;
                pos = 1;
            }
            pr.absorb(pos - 1, rest)
                .map_err(|e| Error::msg(format!("from pid {}: {e}", m.source())))?;
            current = Some((m.source(), pos + rest.len() / 8));
        }
        finished(current, owned_len)?;
        if sources + 1 != nprocs {
            return Err(Error::msg(format!(
                "contribution blocks arrived from {sources} processes, not {}",
                nprocs - 1
            )));
        }
        pr.update(dangling);
    }

    let summary = pr.summary(&graph);
    if pid != 0 {
        bsp.send_bytes(0, &summary.to_bytes())?;
    }
    bsp.sync().await;
    if pid == 0 {
        let mut total = summary;
        for m in bsp.messages() {
            let part = kernel::Summary::from_bytes(m.bytes())
                .map_err(|e| Error::msg(format!("from pid {}: {e}", m.source())))?;
            total.merge(&part);
        }
        for line in total.lines(&params) {
            bsp.println(line);
        }
    }
    Ok(())
}

/// Checks that the stream just read (if any) held the header and one entry
/// per owned vertex.
fn finished(stream: Option<(u32, usize)>, owned: usize) -> Result<()> {
    match stream {
        Some((src, words)) if words != 1 + owned => Err(Error::msg(format!(
            "pid {src} sent {words} words of contributions, not {} (a header and one per owned vertex)",
            1 + owned
        ))),
        _ => Ok(()),
    }
}
