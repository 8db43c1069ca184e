//! Cost of capturing a checkpoint of a 64 MiB process (docs/benchmarks.md):
//! the first capture (every page hashed) against later captures with 1% or
//! 10% of the pages changed, and what the replica side costs.
//!
//! `cargo run --release -p bspweb-peer --example checkpoint_capture`

use std::time::{Duration, Instant};

use bspweb_peer::checkpoint::{
    Assembled, Assembler, PAGE_SIZE, PageTracker, ReplicaStore, Snapshot, to_frames,
};

const MEMORY: usize = 64 << 20;
const ROUNDS: u32 = 5;

fn head(superstep: u32) -> Snapshot {
    Snapshot {
        pid: 0,
        superstep,
        memory: Vec::new(),
        globals: Vec::new(),
        output_seq: 0,
        output_bytes: 0,
        exited: false,
        outbox: Vec::new(),
        hash: [0; 32],
    }
}

/// Change `pages` pages spread over memory (one byte each is enough).
fn touch(memory: &mut [u8], pages: usize, round: u32) {
    let n = memory.len() / PAGE_SIZE;
    for k in 0..pages {
        let p = (k * n / pages + round as usize) % n;
        memory[p * PAGE_SIZE + 17] ^= 0x5a;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    // Non-trivial contents: a byte pattern, so no page is zero.
    let mut memory: Vec<u8> = (0..MEMORY).map(|i| (i * 31 % 251) as u8 + 1).collect();
    let pages = MEMORY / PAGE_SIZE;
    println!(
        "checkpoint of {} MiB ({pages} pages of 64 KiB), best of {ROUNDS} rounds",
        MEMORY >> 20
    );
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>10} {:>9}",
        "case", "capture", "reusing", "to_frames", "replica", "sent MiB"
    );

    let start = Instant::now();
    let _ = Snapshot {
        memory: memory.clone(),
        ..head(0)
    }
    .compute_hash();
    let hash_from_scratch = start.elapsed();
    println!(
        "{:<24} {:>8.1}ms",
        "SHA-256 from scratch",
        ms(hash_from_scratch)
    );

    for (label, changed) in [
        ("first capture (whole)", pages),
        ("1% of pages changed", pages / 100),
        ("10% of pages changed", pages / 10),
    ] {
        let mut best = [Duration::MAX; 4];
        let mut sent = 0usize;
        for round in 0..ROUNDS {
            let mut tracker = PageTracker::new();
            let mut store = ReplicaStore::new();
            let mut asm = Assembler::new(1 << 30);
            // The replica holds superstep 0.
            let s0 = tracker.capture(head(0), &memory);
            let frames = to_frames(&s0, &s0.nonzero_pages(), None);
            for f in frames {
                if let Some(Assembled::Checkpoint(s)) = asm.push(f, &mut store).unwrap() {
                    store.insert(s);
                }
            }
            tracker.acked(1, 0, true);
            let (snap, capture, reusing) = if changed == pages {
                let mut fresh = PageTracker::new();
                let t = Instant::now();
                let s = fresh.capture(head(1), &memory);
                (s, t.elapsed(), Duration::ZERO)
            } else {
                touch(&mut memory, changed, round);
                // The same capture twice: with a fresh copy, then recycling
                // the buffer of superstep 0 (on a clone of the tracker state).
                let mut again = PageTracker::new();
                let base = again.capture(head(0), &s0.memory);
                let t = Instant::now();
                let s = tracker.capture(head(1), &memory);
                let capture = t.elapsed();
                let t = Instant::now();
                let r = again.capture_reusing(head(1), &memory, base);
                let reusing = t.elapsed();
                assert_eq!(r, s);
                (s, capture, reusing)
            };
            let t = Instant::now();
            let plan = tracker.plan(1, &snap);
            let frames = to_frames(&snap, &plan.pages, plan.base);
            let framing = t.elapsed();
            sent = plan.pages.len() * PAGE_SIZE;
            let t = Instant::now();
            let mut got = None;
            for f in frames {
                if let Some(Assembled::Checkpoint(s)) = asm.push(f, &mut store).unwrap() {
                    got = Some(s);
                }
            }
            let replica = t.elapsed();
            assert_eq!(got.map(|s| s.hash), Some(snap.hash));
            for (b, d) in best.iter_mut().zip([capture, reusing, framing, replica]) {
                *b = (*b).min(d);
            }
        }
        println!(
            "{:<24} {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>9.1}",
            label,
            ms(best[0]),
            ms(best[1]),
            ms(best[2]),
            ms(best[3]),
            sent as f64 / (1 << 20) as f64
        );
    }
}
