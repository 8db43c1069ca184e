//! The CPU a checkpoint delta costs on both ends, beside a plain copy of
//! the same pages (docs/benchmarks.md, "PageRank against one native
//! core", session 35): a process of 8 MiB whose first 48 pages (3 MiB,
//! PageRank's ranks and sums at p = 1) change at every superstep, either
//! in the low bytes of every word (before PageRank converges: XOR-packed
//! patches) or in one word of 97 (after: runs of words). For a chain of 40
//! deltas it times making each one's frames (`to_frames_shared`, the page
//! patches against the previous capture) and assembling them on a replica
//! (`Assembler::push`, which patches its base in place and checks the
//! hash), best of 15 rounds each.
//!
//! `cargo run --release -p bspweb-peer --example delta_bench`

use std::sync::Arc;
use std::time::Instant;

use bsp_api::wire::Frame;
use bspweb_peer::checkpoint::{
    Assembled, Assembler, PAGE_SIZE, PageTracker, ReplicaStore, Snapshot, to_frames,
    to_frames_shared,
};

const PAGES: usize = 128;
const HOT: usize = 48;
const DELTAS: u32 = 40;
const ROUNDS: usize = 15;
const REPLICA: bsp_api::PeerId = 5;

fn head(superstep: u32) -> Snapshot {
    Snapshot::head(1, superstep)
}

/// The captures of a chain of deltas and each delta's frames (against the
/// capture before it, which the replica holds).
fn chain(dense: bool) -> (Vec<Arc<Snapshot>>, Vec<Vec<Frame>>) {
    let mut memory: Vec<u8> = (0..PAGES * PAGE_SIZE)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let mut tracker = PageTracker::new();
    let mut snaps = vec![Arc::new(tracker.capture(head(0), &memory))];
    tracker.sent(REPLICA, 0);
    tracker.acked(REPLICA, 0, true);
    let mut frames = Vec::new();
    for s in 1..=DELTAS {
        for (k, w) in memory[..HOT * PAGE_SIZE].chunks_exact_mut(8).enumerate() {
            if dense {
                w[0] = w[0].wrapping_add((k as u8) | 1);
                w[1] ^= s as u8;
            } else if k % 97 == s as usize % 97 {
                w[3] ^= 0x5a;
            }
        }
        let snap = Arc::new(tracker.capture(head(s), &memory));
        let plan = tracker.plan(REPLICA, &snap);
        assert_eq!(plan.base, Some(s - 1), "a delta against the last capture");
        let base = snaps.last().map(|b| b.memory.as_slice());
        frames.push(to_frames_shared(
            &snap,
            &plan.pages,
            &plan.leaves,
            plan.base,
            base,
        ));
        tracker.sent(REPLICA, s);
        tracker.acked(REPLICA, s, true);
        snaps.push(snap);
    }
    (snaps, frames)
}

/// The least of `ROUNDS` timings of `f`, in ms per delta.
fn best(mut f: impl FnMut() -> f64) -> f64 {
    (0..ROUNDS).map(|_| f()).fold(f64::MAX, f64::min)
}

fn main() {
    println!(
        "checkpoint deltas: {PAGES} pages of {} KiB, the first {HOT} changed at each of {DELTAS} supersteps; best of {ROUNDS}",
        PAGE_SIZE / 1024
    );
    println!(
        "{:<32} {:>10} {:>12} {:>12} {:>14} {:>14}",
        "change", "bytes", "frames (ms)", "replica (ms)", "frames/memcpy", "replica/memcpy"
    );
    let hot = vec![7u8; HOT * PAGE_SIZE];
    let mut copy = vec![0u8; HOT * PAGE_SIZE];
    let memcpy = best(|| {
        let start = Instant::now();
        for _ in 0..DELTAS {
            copy.copy_from_slice(std::hint::black_box(&hot));
            std::hint::black_box(&mut copy);
        }
        start.elapsed().as_secs_f64() * 1e3 / f64::from(DELTAS)
    });
    for (dense, label) in [
        (true, "low bytes of every word (packed)"),
        (false, "one word in 97 (runs)"),
    ] {
        let (snaps, frames) = chain(dense);
        let bytes: usize = frames[DELTAS as usize / 2]
            .iter()
            .map(|f| postcard::to_stdvec(f).map_or(0, |v| v.len()))
            .sum();
        let making = best(|| {
            let start = Instant::now();
            for s in 1..snaps.len() {
                let pages: Vec<u32> = (0..HOT as u32).collect();
                let base = Some(snaps[s - 1].memory.as_slice());
                std::hint::black_box(to_frames_shared(
                    &snaps[s],
                    &pages,
                    &[],
                    Some(s as u32 - 1),
                    base,
                ));
            }
            start.elapsed().as_secs_f64() * 1e3 / f64::from(DELTAS)
        });
        let assembling = best(|| {
            let mut asm = Assembler::new(1 << 30);
            let mut store = ReplicaStore::new();
            for f in to_frames(&snaps[0], &snaps[0].nonzero_pages(), None) {
                if let Ok(Some(Assembled::Checkpoint(s))) = asm.push(f, &mut store) {
                    store.insert(s);
                }
            }
            let todo = frames.clone();
            let start = Instant::now();
            for delta in todo {
                for f in delta {
                    match asm.push(f, &mut store) {
                        Ok(Some(Assembled::Checkpoint(s))) => {
                            store.insert(s);
                        }
                        Ok(_) => {}
                        Err(e) => panic!("the replica refused a delta: {e}"),
                    }
                }
            }
            let ms = start.elapsed().as_secs_f64() * 1e3 / f64::from(DELTAS);
            assert!(
                store.newest(1) == Some(&*snaps[DELTAS as usize]),
                "the replica holds the last capture"
            );
            ms
        });
        println!(
            "{label:<32} {bytes:>10} {making:>12.3} {assembling:>12.3} {:>14.1} {:>14.1}",
            making / memcpy,
            assembling / memcpy
        );
    }
    println!("memcpy of the {HOT} pages: {memcpy:.3} ms");
}
