//! The barrier against reference runs (property tests) and by example.

use super::*;
use proptest::prelude::*;

fn msg(src: Pid, dst: Pid, superstep: u32, seq: u32, payload: &[u8]) -> WireMessage {
    WireMessage {
        src,
        dst,
        superstep,
        seq,
        tag: 0,
        payload: Bytes::copy_from_slice(payload),
    }
}

fn done(pid: Pid, exited: bool, counts: &[(Pid, u32)]) -> ProcDone {
    ProcDone {
        pid,
        exited,
        counts: counts.to_vec(),
        digest: None,
    }
}

#[test]
fn a_process_passes_once_every_done_and_every_counted_message_is_here() {
    let mut b = Barrier::new(3, 1 << 20);
    b.on_done(0, done(1, false, &[(0, 2)])).unwrap();
    b.on_done(0, done(2, false, &[])).unwrap();
    assert!(!b.ready(0, 0), "no Done from pid 0 itself yet");
    b.on_done(0, done(0, false, &[])).unwrap();
    assert!(!b.ready(0, 0), "pid 1's two messages are missing");
    assert!(b.on_message(msg(1, 0, 0, 1, b"b")).unwrap());
    assert!(!b.ready(0, 0));
    assert!(b.on_message(msg(1, 0, 0, 0, b"a")).unwrap());
    assert!(b.ready(0, 0));
    assert!(b.complete(0));
    assert_eq!(
        b.take(0, 0),
        vec![
            (1, 0, Bytes::from_static(b"a")),
            (1, 0, Bytes::from_static(b"b"))
        ]
    );
    assert!(
        !b.on_message(msg(1, 0, 0, 0, b"a")).unwrap(),
        "a repeat after the barrier is dropped"
    );
}

#[test]
fn exited_processes_count_as_present_at_later_barriers() {
    let mut b = Barrier::new(2, 1 << 20);
    b.on_done(3, done(1, true, &[(0, 1)])).unwrap();
    b.on_done(3, done(0, false, &[])).unwrap();
    assert!(!b.ready(0, 3), "its last message is counted");
    b.on_message(msg(1, 0, 3, 0, b"x")).unwrap();
    assert!(b.ready(0, 3));
    b.take(0, 3);
    b.on_done(4, done(0, false, &[])).unwrap();
    assert!(b.ready(0, 4));
    assert_eq!(b.exited(1), Some(3));
    assert_eq!(
        b.on_done(5, done(1, false, &[])),
        Err(BarrierError::AfterExit {
            pid: 1,
            superstep: 5,
            exited: 3
        })
    );
}

#[test]
fn contradictions_and_foreign_pids_are_errors() {
    let mut b = Barrier::new(2, 4);
    b.on_done(0, done(1, false, &[(0, 1)])).unwrap();
    assert!(matches!(
        b.on_done(0, done(1, false, &[(0, 2)])),
        Err(BarrierError::ConflictingDone { .. })
    ));
    b.on_message(msg(1, 0, 0, 0, b"ab")).unwrap();
    assert!(matches!(
        b.on_message(msg(1, 0, 0, 0, b"xy")),
        Err(BarrierError::ConflictingMessage { .. })
    ));
    assert!(matches!(
        b.on_message(msg(1, 0, 0, 1, b"abc")),
        Err(BarrierError::TooMuchData { .. })
    ));
    assert!(matches!(
        b.on_message(msg(2, 0, 0, 0, b"")),
        Err(BarrierError::NoSuchPid { .. })
    ));
    assert!(matches!(
        b.on_done(0, done(0, false, &[(9, 1)])),
        Err(BarrierError::NoSuchPid { .. })
    ));
}

fn done_d(pid: Pid, counts: &[(Pid, u32)], digest: u8) -> ProcDone {
    ProcDone {
        digest: Some([digest; 32]),
        ..done(pid, false, counts)
    }
}

#[test]
fn with_redundancy_a_result_counts_once_two_peers_sent_the_same() {
    let mut b = Barrier::with_quorum(2, 1 << 20, 2);
    // Pid 1 runs on peers 10 and 11; pid 0 on 20 and 21.
    b.set_hosts(1, &[10, 11]).unwrap();
    b.set_hosts(0, &[20, 21]).unwrap();
    b.on_done_from(0, done_d(1, &[(0, 1)], 7), 10).unwrap();
    b.on_done_from(0, done_d(0, &[], 9), 20).unwrap();
    b.on_done_from(0, done_d(0, &[], 9), 20).unwrap();
    assert!(!b.complete(0), "one copy of each Done is not enough");
    b.on_done_from(0, done_d(0, &[], 9), 21).unwrap();
    b.on_done_from(0, done_d(1, &[(0, 1)], 7), 11).unwrap();
    assert!(b.complete(0));
    assert_eq!(b.agreed_digest(1, 0), Some([7; 32]));
    assert!(!b.on_message_from(msg(1, 0, 0, 0, b"x"), 10).unwrap());
    assert!(!b.ready(0, 0), "one copy of the message is not enough");
    assert!(!b.on_message_from(msg(1, 0, 0, 0, b"x"), 10).unwrap());
    assert!(
        !b.ready(0, 0),
        "a repeat from the same peer is no second copy"
    );
    assert!(b.on_message_from(msg(1, 0, 0, 0, b"x"), 11).unwrap());
    assert!(b.ready(0, 0));
    assert_eq!(b.take(0, 0), vec![(1, 0, Bytes::from_static(b"x"))]);
    assert!(b.take_disputes().is_empty());
}

#[test]
fn copies_that_differ_are_disputed_and_a_third_decides() {
    let mut b = Barrier::with_quorum(2, 1 << 20, 2);
    for (pid, peers) in [(0, [20, 21]), (1, [10, 11])] {
        b.set_hosts(pid, &peers).unwrap();
        for p in peers {
            b.on_done_from(0, done(pid, false, &[(0, 1)]), p).unwrap();
        }
    }
    // Peer 11 flipped a byte of pid 1's message.
    b.on_message_from(msg(1, 0, 0, 0, b"good"), 10).unwrap();
    b.on_message_from(msg(1, 0, 0, 0, b"bad!"), 11).unwrap();
    let d = b.take_disputes();
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].pid, d[0].superstep), (1, 0));
    assert_eq!(d[0].groups.len(), 2);
    assert!(d[0].groups.iter().all(|g| g.len() == 1));
    assert!(d[0].what.contains("message 0 to pid 0"), "{}", d[0].what);
    assert!(!b.ready(0, 0), "neither version is taken");
    // Pid 0's own message (from its two copies) is fine.
    b.on_message_from(msg(0, 0, 0, 0, b"self"), 20).unwrap();
    b.on_message_from(msg(0, 0, 0, 0, b"self"), 21).unwrap();
    assert!(!b.ready(0, 0));
    // A third run: copy 1 moves from peer 11 to 12, which agrees with 10.
    b.set_hosts(1, &[10, 12]).unwrap();
    assert!(b.on_message_from(msg(1, 0, 0, 0, b"good"), 12).unwrap());
    let d = b.take_disputes();
    assert_eq!(d.len(), 1);
    assert_eq!(
        d[0].groups,
        vec![vec![10, 12], vec![11]],
        "peer 11 was outvoted"
    );
    assert!(b.ready(0, 0));
    assert_eq!(
        b.take(0, 0),
        vec![
            (0, 0, Bytes::from_static(b"self")),
            (1, 0, Bytes::from_static(b"good"))
        ]
    );
    // A state digest that differs is disputed too, and not agreed.
    b.on_done_from(1, done_d(1, &[], 1), 10).unwrap();
    b.on_done_from(1, done_d(1, &[], 2), 12).unwrap();
    assert_eq!(b.agreed_digest(1, 1), None);
    let d = b.take_disputes();
    assert_eq!(d.len(), 1);
    assert!(d[0].what.contains("state"), "{}", d[0].what);
    assert!(
        b.done_rec(1, 1).is_some(),
        "the Done itself (what was sent) agreed"
    );
}

#[test]
fn only_the_hosts_of_a_process_vote_on_it_and_a_done_needs_copy_0() {
    let mut b = Barrier::with_quorum(2, 1 << 20, 2);
    b.set_hosts(0, &[20, 21]).unwrap();
    b.set_hosts(1, &[10, 11]).unwrap();
    // Two peers that host no copy of pid 1 forge its message to pid 0.
    b.on_message_from(msg(1, 0, 0, 0, b"fake"), 30).unwrap();
    assert!(!b.on_message_from(msg(1, 0, 0, 0, b"fake"), 31).unwrap());
    assert!(b.take_disputes().is_empty(), "forgers are not voters");
    // The hosts' copies decide; the forgery never counted.
    b.on_message_from(msg(1, 0, 0, 0, b"real"), 10).unwrap();
    assert!(b.on_message_from(msg(1, 0, 0, 0, b"real"), 11).unwrap());
    for (pid, peers) in [(0, [20, 21]), (1, [10, 11])] {
        for p in peers {
            b.on_done_from(0, done(pid, false, &[(0, 1)]), p).unwrap();
        }
    }
    // A peer changes its vote: ignored.
    b.on_message_from(msg(0, 0, 0, 0, b"a"), 20).unwrap();
    b.on_message_from(msg(0, 0, 0, 0, b"b"), 20).unwrap();
    assert!(b.on_message_from(msg(0, 0, 0, 0, b"a"), 21).unwrap());
    assert_eq!(
        b.take(0, 0),
        vec![
            (0, 0, Bytes::from_static(b"a")),
            (1, 0, Bytes::from_static(b"real"))
        ]
    );
    // Copy 1 of pid 1 moved from 11 to 12: 11's and 12's Done agree, but
    // without copy 0's (10) it is not taken; 10's arrives, and it is.
    b.set_hosts(1, &[10, 12]).unwrap();
    b.on_done_from(1, done(1, false, &[]), 11).unwrap();
    b.on_done_from(1, done(1, false, &[]), 12).unwrap();
    b.on_done_from(1, done(0, false, &[]), 20).unwrap();
    b.on_done_from(1, done(0, false, &[]), 21).unwrap();
    assert!(!b.complete(1), "copy 0's Done is missing");
    b.on_done_from(1, done(1, false, &[]), 10).unwrap();
    assert!(b.complete(1));
    // A copy that arrived before its sender was known to host the pid
    // counts once it is.
    b.on_done_from(2, done(1, false, &[]), 10).unwrap();
    b.on_done_from(2, done(1, false, &[]), 13).unwrap();
    b.on_done_from(2, done(0, false, &[]), 20).unwrap();
    b.on_done_from(2, done(0, false, &[]), 21).unwrap();
    assert!(!b.complete(2));
    b.set_hosts(1, &[10, 13]).unwrap();
    assert!(b.complete(2));
}

proptest! {
    /// With two copies of every process, each sending everything (in
    /// any order, with repeats): every process reads exactly what the
    /// plan sent, and never before both copies of everything it needs
    /// are here; no dispute arises.
    #[test]
    fn two_copies_deliver_exactly_once_whatever_the_order(
        nprocs in 1u32..4,
        steps in 1usize..3,
        seed in any::<u64>(),
    ) {
        let mut x = seed | 1;
        let mut next = move || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
        let plan: Plan = (0..steps).map(|_| {
            (0..nprocs).map(|_| {
                (0..(next() % 4)).map(|_| {
                    let dst = (next() % nprocs as u64) as Pid;
                    (dst, vec![next() as u8; (next() % 3) as usize])
                }).collect()
            }).collect()
        }).collect();
        // Each event from each copy's peer (pid q's copies: 100 + q, 200 + q).
        type Event = (WireMessage, Option<(u32, ProcDone)>);
        let mut events: Vec<(PeerId, Event)> =
            deliveries(nprocs, &plan)
                .into_iter()
                .flat_map(|e| {
                    let q = e.0.src as PeerId;
                    [(100 + q, e.clone()), (200 + q, e)]
                })
                .collect();
        for i in (1..events.len()).rev() {
            let j = (next() % (i as u64 + 1)) as usize;
            events.swap(i, j);
        }
        let repeats: Vec<_> = events.iter().filter(|_| next() % 4 == 0).cloned().collect();
        events.extend(repeats);
        // The event after which each (src, superstep) item has both copies.
        let mut b = Barrier::with_quorum(nprocs, 1 << 20, 2);
        for q in 0..nprocs {
            b.set_hosts(q, &[100 + q as PeerId, 200 + q as PeerId]).unwrap();
        }
        let mut at = vec![0u32; nprocs as usize];
        type Read = Vec<Vec<Vec<(Pid, u32, Bytes)>>>;
        let mut read: Read = vec![Vec::new(); nprocs as usize];
        let mut seen: HashMap<String, BTreeSet<PeerId>> = HashMap::new();
        for (from, (m, d)) in events {
            let key = match &d {
                Some((s, d)) => format!("done {s} {}", d.pid),
                None => format!("msg {} {} {}", m.dst, m.superstep, m.seq),
            };
            let key = format!("{key} from {}", m.src);
            seen.entry(key).or_default().insert(from);
            match d {
                Some((s, d)) => b.on_done_from(s, d, from).unwrap(),
                None => { b.on_message_from(m, from).unwrap(); }
            }
            for p in 0..nprocs {
                while (at[p as usize] as usize) < steps && b.ready(p, at[p as usize]) {
                    let s = at[p as usize];
                    // Everything p reads at s came from both copies.
                    for q in 0..nprocs {
                        let k = format!("done {s} {q} from {q}");
                        prop_assert_eq!(seen.get(&k).map_or(0, |v| v.len()), 2, "{}", k);
                    }
                    read[p as usize].push(b.take(p, s));
                    at[p as usize] += 1;
                }
            }
        }
        prop_assert!(b.take_disputes().is_empty());
        for p in 0..nprocs {
            prop_assert_eq!(at[p as usize] as usize, steps, "pid {} is stuck", p);
            for s in 0..steps {
                let want: Vec<(Pid, u32, Bytes)> = (0..nprocs).flat_map(|q| {
                    plan[s][q as usize].iter()
                        .filter(|(dst, _)| *dst == p)
                        .map(move |(_, pl)| (q, 0, Bytes::from(pl.clone())))
                }).collect();
                prop_assert_eq!(&read[p as usize][s], &want);
            }
        }
    }
}

/// What every process sends in every superstep: `plan[s][q]` lists the
/// (dst, payload) that `q` sends in superstep `s`.
type Plan = Vec<Vec<Vec<(Pid, Vec<u8>)>>>;

/// A reference run of `plan`; every process runs every superstep.
fn deliveries(nprocs: u32, plan: &Plan) -> Vec<(WireMessage, Option<(u32, ProcDone)>)> {
    let mut out = Vec::new();
    for (s, per) in plan.iter().enumerate() {
        for q in 0..nprocs {
            let sends = &per[q as usize];
            let mut counts: BTreeMap<Pid, u32> = BTreeMap::new();
            for (seq, (dst, payload)) in sends.iter().enumerate() {
                *counts.entry(*dst).or_default() += 1;
                out.push((msg(q, *dst, s as u32, seq as u32, payload), None));
            }
            let d = done(q, false, &counts.into_iter().collect::<Vec<_>>());
            out.push((msg(q, q, u32::MAX, 0, &[]), Some((s as u32, d))));
        }
    }
    out
}

proptest! {
    /// Delivery guarantee (DESIGN.md, Execution 4) at process level:
    /// whatever the order of arrival, and with any events repeated
    /// (re-sends after a restore), every process passes each barrier
    /// exactly when everything for it arrived, and reads exactly what
    /// was sent to it, in (source, send order).
    #[test]
    fn every_process_reads_exactly_what_was_sent_whatever_the_order(
        nprocs in 1u32..5,
        steps in 1usize..4,
        seed in any::<u64>(),
        repeat in proptest::collection::vec(any::<bool>(), 64),
    ) {
        // Build a plan from the seed.
        let mut x = seed | 1;
        let mut next = move || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
        let plan: Plan = (0..steps).map(|_| {
            (0..nprocs).map(|_| {
                (0..(next() % 4)).map(|_| {
                    let dst = (next() % nprocs as u64) as Pid;
                    let len = (next() % 4) as usize;
                    (dst, (0..len).map(|_| next() as u8).collect())
                }).collect()
            }).collect()
        }).collect();
        let mut events = deliveries(nprocs, &plan);
        // Shuffle, then repeat some events.
        for i in (1..events.len()).rev() {
            let j = (next() % (i as u64 + 1)) as usize;
            events.swap(i, j);
        }
        let extra: Vec<_> = events.iter().zip(repeat.iter().cycle())
            .filter(|(_, r)| **r).map(|(e, _)| e.clone()).collect();
        events.extend(extra);

        let mut b = Barrier::new(nprocs, 1 << 20);
        let mut at = vec![0u32; nprocs as usize];
        // Per pid, per superstep: what it read.
        type Read = Vec<Vec<Vec<(Pid, u32, Bytes)>>>;
        let mut read: Read = vec![Vec::new(); nprocs as usize];
        let pump = |b: &mut Barrier, at: &mut Vec<u32>, read: &mut Read| {
            for p in 0..nprocs {
                while (at[p as usize] as usize) < steps && b.ready(p, at[p as usize]) {
                    let s = at[p as usize];
                    read[p as usize].push(b.take(p, s));
                    at[p as usize] += 1;
                }
            }
        };
        for (m, d) in events {
            match d {
                Some((s, d)) => b.on_done(s, d).unwrap(),
                None => { b.on_message(m).unwrap(); }
            }
            pump(&mut b, &mut at, &mut read);
        }
        for p in 0..nprocs {
            prop_assert_eq!(at[p as usize] as usize, steps, "pid {} is stuck", p);
            for s in 0..steps {
                let want: Vec<(Pid, u32, Bytes)> = (0..nprocs).flat_map(|q| {
                    plan[s][q as usize].iter()
                        .filter(|(dst, _)| *dst == p)
                        .map(move |(_, pl)| (q, 0, Bytes::from(pl.clone())))
                }).collect();
                prop_assert_eq!(&read[p as usize][s], &want);
            }
        }
    }

    /// A process never passes a barrier early: with any one message or
    /// Done withheld, the processes it concerns stay at that barrier.
    #[test]
    fn a_missing_message_or_done_holds_the_barrier(
        nprocs in 1u32..4,
        seed in any::<u64>(),
        pick in any::<prop::sample::Index>(),
    ) {
        let mut x = seed | 1;
        let mut next = move || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
        let plan: Plan = vec![(0..nprocs).map(|_| {
            (0..(next() % 3)).map(|_| ((next() % nprocs as u64) as Pid, vec![1])).collect()
        }).collect()];
        let events = deliveries(nprocs, &plan);
        let skip = pick.index(events.len());
        let mut b = Barrier::new(nprocs, 1 << 20);
        for (i, (m, d)) in events.iter().cloned().enumerate() {
            if i == skip { continue; }
            match d {
                Some((s, d)) => b.on_done(s, d).unwrap(),
                None => { b.on_message(m).unwrap(); }
            }
        }
        let (m, d) = &events[skip];
        match d {
            Some(_) => for p in 0..nprocs { prop_assert!(!b.ready(p, 0)); },
            None => prop_assert!(!b.ready(m.dst, 0)),
        }
    }
}
