//! Lookup and incremental-update cost of every `HashTable` variant.
//!
//! Run with `cargo bench -p placement --bench lookup`. Prints, for 10³, 10⁴
//! and 10⁵ peers with powers uniform in [1, 8], the mean cost of one lookup
//! per variant (best of three runs) next to a linear scan of the lower
//! envelope (the same D/D table, every peer examined); then, with 10³, 10⁴ and (DHHT only)
//! 10⁵ peers and 10⁴ processes, the mean cost of one `set_peer` power
//! change (new power uniform in [1, 8]), of a join + leave pair, and the
//! moves they report, next to the cost of placing all 10⁴ processes from
//! scratch. Only this bench reads the clock; the crate itself is pure.

use std::hint::black_box;
use std::time::Instant;

use placement::{HashTable, HashVariant, Hashing, Position, ProcessKey};

/// SplitMix64, so the workload is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn power(&mut self) -> f64 {
        1.0 + 7.0 * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

fn table(variant: HashVariant, peers: usize, rng: &mut Rng) -> HashTable {
    let mut t = HashTable::new(variant);
    for id in 0..peers as i64 {
        t.set_peer(id, rng.power()).expect("power in range");
    }
    t
}

/// Mean ns of `lookup` over `lookups` random positions, best of three runs
/// (the machine is shared).
fn mean_ns(lookups: usize, rng: &mut Rng, lookup: impl Fn(Position) -> Option<i64>) -> f64 {
    let xs: Vec<Position> = (0..lookups).map(|_| Position(rng.next())).collect();
    let mut ns = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        let mut sink = 0i64;
        for &x in &xs {
            sink = sink.wrapping_add(lookup(black_box(x)).unwrap_or(0));
        }
        ns = ns.min(start.elapsed().as_nanos() as f64 / lookups as f64);
        black_box(sink);
    }
    ns
}

fn main() {
    println!("lookup: mean ns per lookup (powers uniform in [1, 8])");
    print!("{:>14}", "peers");
    for v in HashVariant::ALL {
        print!("{:>14}", v.label());
    }
    println!("{:>14}", "linear scan");
    for n in [1_000usize, 10_000, 100_000] {
        print!("{n:>14}");
        for v in HashVariant::ALL {
            let mut rng = Rng(n as u64);
            let t = table(v, n, &mut rng);
            // About 2·10⁸ peer evaluations for the O(n) variants.
            let lookups = match v {
                HashVariant::Dhht { .. } => 200_000,
                _ => (200_000_000 / n).max(100),
            };
            let ns = mean_ns(lookups, &mut rng, |x| t.lookup(x));
            print!("{ns:>14.0}");
        }
        // The baseline: the lower envelope found by scanning every peer
        // (what a lookup costs without the pruned walk).
        let mut rng = Rng(n as u64);
        let dd = HashVariant::Dhht {
            peers: Hashing::Det,
            processes: Hashing::Det,
        };
        let t = table(dd, n, &mut rng);
        let lookups = (200_000_000 / n).max(100);
        let ns = mean_ns(lookups, &mut rng, |x| t.lookup_scan(x));
        println!("{ns:>14.0}");
    }

    let m = 10_000u32;
    println!();
    println!("updates: {m} processes, means per call; place all = adding the {m} processes");
    println!(
        "{:>8}{:>14}{:>16}{:>10}{:>18}{:>10}{:>16}",
        "peers", "variant", "set_peer (ns)", "moves", "join+leave (ns)", "moves", "place all (ms)"
    );
    for n in [1_000usize, 10_000, 100_000] {
        for v in HashVariant::ALL {
            if n > 10_000 && !matches!(v, HashVariant::Dhht { .. }) {
                // O(n) lookups: placing the processes alone takes n·m hash
                // evaluations (tens of seconds); skipped.
                continue;
            }
            let mut rng = Rng(42);
            let mut t = table(v, n, &mut rng);
            let start = Instant::now();
            for pid in 0..m {
                t.add_process(ProcessKey { job: 1, pid });
            }
            let place_all = start.elapsed().as_nanos();

            let changes = 2_000;
            let mut moved = 0usize;
            let start = Instant::now();
            for _ in 0..changes {
                let id = (rng.next() % n as u64) as i64;
                let w = rng.power();
                moved += t.set_peer(id, w).expect("power in range").len();
            }
            let set_ns = start.elapsed().as_nanos() as f64 / changes as f64;

            let pairs = 500;
            let mut churned = 0usize;
            let start = Instant::now();
            for k in 0..pairs {
                let id = 1_000_000 + k;
                churned += t.set_peer(id, rng.power()).expect("power in range").len();
                churned += t.remove_peer(id).len();
            }
            let pair_ns = start.elapsed().as_nanos() as f64 / pairs as f64;
            println!(
                "{:>8}{:>14}{:>16.0}{:>10.2}{:>18.0}{:>10.2}{:>16.1}",
                n,
                v.label(),
                set_ns,
                moved as f64 / changes as f64,
                pair_ns,
                churned as f64 / pairs as f64,
                place_all as f64 / 1e6
            );
        }
    }
}
