//! Checkpoints against a reference model: a replica that applies what the
//! owner sends ends up with the owner's snapshot, byte for byte
//! (docs/fault-tolerance.md, "Replicas").

use proptest::prelude::*;

use super::*;

const P: usize = PAGE_SIZE;

/// A page whose bytes are derived from `seed` (cheap to generate, distinct).
fn page_of(seed: u8) -> Vec<u8> {
    if seed == 0 {
        return vec![0; P];
    }
    (0..P)
        .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
        .collect()
}

/// A snapshot's header; its outbox is what the process sent in `superstep`
/// (the messages are stamped with it).
fn head(pid: Pid, superstep: u32, mut outbox: Vec<WireMessage>) -> Snapshot {
    for m in &mut outbox {
        m.superstep = superstep;
    }
    head_retaining(pid, superstep, outbox)
}

/// A snapshot's header with `outbox` as given: every message its host still
/// retains, of the supersteps from the safe point on.
fn head_retaining(pid: Pid, superstep: u32, outbox: Vec<WireMessage>) -> Snapshot {
    Snapshot {
        globals: vec![1 << 20],
        output_seq: u64::from(superstep) * 3,
        output_bytes: u64::from(superstep) * 100,
        outbox,
        ..Snapshot::head(pid, superstep)
    }
}

fn msg(src: Pid, dst: Pid, seq: u32, len: usize) -> WireMessage {
    WireMessage {
        src,
        dst,
        superstep: 0,
        seq,
        tag: 0,
        payload: (0..len).map(|i| (i as u8) ^ (seq as u8)).collect(),
    }
}

/// Deliver `frames` to a replica's assembler and store.
fn deliver(
    asm: &mut Assembler,
    store: &mut ReplicaStore,
    frames: Vec<Frame>,
) -> Result<Snapshot, CheckpointError> {
    let mut out = None;
    for f in frames {
        if let Some(a) = asm.push(f, store)? {
            out = Some(a);
        }
    }
    match out {
        Some(Assembled::Checkpoint(s))
        | Some(Assembled::Fetched {
            snapshot: Some(s), ..
        }) => {
            store.insert(s.clone());
            Ok(s)
        }
        other => panic!("the frames did not end in a checkpoint: {other:?}"),
    }
}

/// A replica (assembler and store) that holds `s`, received whole.
fn replica_holding(s: &Snapshot) -> (Assembler, ReplicaStore) {
    let mut asm = Assembler::new(1 << 30);
    let mut store = ReplicaStore::new();
    deliver(&mut asm, &mut store, to_frames(s, &s.nonzero_pages(), None)).unwrap();
    (asm, store)
}

/// The final [`Frame::Checkpoint`] of a checkpoint's frames.
fn last_checkpoint(frames: &mut [Frame]) -> &mut Checkpoint {
    match frames.last_mut() {
        Some(Frame::Checkpoint(c)) => c,
        _ => panic!("the last frame is the checkpoint"),
    }
}

fn frame_len(f: &Frame) -> usize {
    postcard::to_stdvec(f).expect("frame encodes").len()
}

#[derive(Debug, Clone)]
enum Step {
    /// Write `byte` at `offset` of page `page` (modulo the current size).
    Write {
        page: usize,
        offset: usize,
        byte: u8,
    },
    /// Replace a page with a patterned page.
    Fill { page: usize, seed: u8 },
    /// Grow memory by this many pages (zeros).
    Grow(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..64usize, 0..P, any::<u8>()).prop_map(|(page, offset, byte)| Step::Write { page, offset, byte }),
        2 => (0..64usize, any::<u8>()).prop_map(|(page, seed)| Step::Fill { page, seed }),
        1 => (0..3usize).prop_map(Step::Grow),
    ]
}

#[derive(Debug, Clone, Copy)]
enum ReplicaEvent {
    /// Receives and acknowledges normally.
    Normal,
    /// Loses its store before this checkpoint arrives.
    Forgets,
    /// Misses this checkpoint (not sent).
    Skipped,
}

fn replica_event() -> impl Strategy<Value = ReplicaEvent> {
    prop_oneof![
        6 => Just(ReplicaEvent::Normal),
        1 => Just(ReplicaEvent::Forgets),
        1 => Just(ReplicaEvent::Skipped),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A tracker told which 4 KiB leaves may have changed (every leaf
    /// written, even with the same bytes, plus arbitrary others; never a
    /// leaf that changed) takes exactly the snapshots of one that reads every page,
    /// whatever buffers it recycles, and plans the same deltas.
    #[test]
    fn captures_of_the_written_pages_only_equal_full_captures(
        initial in proptest::collection::vec(0u8..4, 1..5),
        supersteps in proptest::collection::vec(
            (proptest::collection::vec(step(), 0..6),
             proptest::collection::vec(any::<bool>(), 8),
             0usize..6,
             any::<bool>()),
            1..8),
    ) {
        let mut memory: Vec<u8> = initial.iter().flat_map(|&s| page_of(s)).collect();
        let (mut full, mut tracked) = (PageTracker::new(), PageTracker::new());
        let mut previous: Vec<Snapshot> = Vec::new();
        for (s, (steps, extra, reuse, restart)) in supersteps.into_iter().enumerate() {
            // A capture at an earlier superstep starts both trackers over.
            let s = if restart && s > 0 { s as u32 - 1 } else { s as u32 + 1 };
            // Per 4 KiB leaf, as the kernel reports writes.
            let mut written = vec![false; memory.len() / LEAF_SIZE];
            for st in steps {
                let pages = memory.len() / P;
                match st {
                    Step::Write { page, offset, byte } => {
                        let at = (page % pages) * P + offset;
                        memory[at] = byte;
                        written[at / LEAF_SIZE] = true;
                    }
                    Step::Fill { page, seed } => {
                        let at = (page % pages) * P;
                        memory[at..at + P].copy_from_slice(&page_of(seed));
                        written[at / LEAF_SIZE..(at + P) / LEAF_SIZE].fill(true);
                    }
                    // New pages are beyond what the trackers saw.
                    Step::Grow(k) => {
                        memory.resize(memory.len() + k * P, 0);
                        written.resize(memory.len() / LEAF_SIZE, false);
                    }
                }
            }
            let may: Vec<bool> = written
                .iter()
                .enumerate()
                .map(|(i, &w)| w || extra[i % extra.len()] && i % 3 == 0)
                .collect();
            let recycled = (reuse > 0 && reuse <= previous.len())
                .then(|| previous[previous.len() - reuse].clone());
            let want = match recycled.clone() {
                Some(p) => full.capture_reusing(head(7, s, vec![]), &memory, p),
                None => full.capture(head(7, s, vec![]), &memory),
            };
            let got = tracked.capture_tracked(head(7, s, vec![]), &memory, recycled, &may);
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(&got.memory, &memory);
            prop_assert_eq!(tracked.plan(1, &got), full.plan(1, &want));
            for k in 0..memory.len() / LEAF_SIZE {
                prop_assert_eq!(
                    tracked.leaf_changed_at_last_capture(k),
                    full.leaf_changed_at_last_capture(k)
                );
            }
            previous.push(want);
            if previous.len() > 5 {
                previous.remove(0);
            }
        }
    }

    /// Delta-applied-on-replica == owner's snapshot, for every replica and
    /// superstep, whatever the replica missed or lost.
    #[test]
    fn replicas_rebuild_the_owners_snapshot_byte_for_byte(
        initial in proptest::collection::vec(0u8..4, 1..5),
        supersteps in proptest::collection::vec(
            (proptest::collection::vec(step(), 0..6),
             proptest::collection::vec(replica_event(), 2),
             0usize..3,
             0usize..3,
             0u32..3),
            1..7),
    ) {
        let mut memory: Vec<u8> = initial.iter().flat_map(|&s| page_of(s)).collect();
        let mut tracker = PageTracker::new();
        let mut replicas: Vec<(Assembler, ReplicaStore)> =
            (0..2).map(|_| (Assembler::new(64 << 20), ReplicaStore::new())).collect();
        // The last two captures: a capture may recycle either buffer
        // (`reuse` 1: the last, 2: the one before; 0: none).
        let mut previous: Vec<Snapshot> = Vec::new();
        // Everything sent, and the safe point: the outbox of a checkpoint is
        // what was sent from the safe point on (it advances by `advance`).
        let (mut sent, mut safe): (Vec<WireMessage>, u32) = (Vec::new(), 0);
        for (s, (steps, events, nmsgs, reuse, advance)) in supersteps.into_iter().enumerate() {
            let s = s as u32;
            for st in steps {
                let pages = memory.len() / P;
                match st {
                    Step::Write { page, offset, byte } => memory[(page % pages) * P + offset] = byte,
                    Step::Fill { page, seed } => {
                        let at = (page % pages) * P;
                        memory[at..at + P].copy_from_slice(&page_of(seed));
                    }
                    Step::Grow(k) => memory.resize(memory.len() + k * P, 0),
                }
            }
            sent.extend((0..nmsgs as u32).map(|i| WireMessage {
                superstep: s,
                ..msg(7, i, i, 10 * i as usize + s as usize)
            }));
            safe = (safe + advance).min(s);
            let outbox: Vec<WireMessage> =
                sent.iter().filter(|m| m.superstep >= safe).cloned().collect();
            let recycled = (reuse > 0 && reuse <= previous.len())
                .then(|| previous.remove(previous.len() - reuse));
            let snap = match recycled {
                Some(p) => tracker.capture_reusing(head_retaining(7, s, outbox), &memory, p),
                None => tracker.capture(head_retaining(7, s, outbox), &memory),
            };
            previous.push(snap.clone());
            if previous.len() > 2 {
                previous.remove(0);
            }
            prop_assert_eq!(&snap.memory, &memory);
            prop_assert_eq!(snap.hash, snap.compute_hash());
            for (peer, event) in events.into_iter().enumerate() {
                let (asm, store) = &mut replicas[peer];
                let peer = peer as PeerId;
                match event {
                    ReplicaEvent::Skipped => continue,
                    ReplicaEvent::Forgets => { store.remove_pid(7); }
                    ReplicaEvent::Normal => {}
                }
                let plan = tracker.plan(peer, &snap);
                // Patches against the base where the owner still holds it.
                let base = previous
                    .iter()
                    .find(|b| Some(b.superstep) == plan.base)
                    .map(|b| b.memory.as_slice());
                let frames = to_frames_shared(
                    &Arc::new(snap.clone()),
                    &plan.pages,
                    &plan.leaves,
                    plan.base,
                    base,
                );
                let got = match deliver(asm, store, frames) {
                    Ok(got) => got,
                    Err(e) => {
                        // Only a replica that lost its base may refuse; then
                        // it gets the whole snapshot.
                        prop_assert!(matches!(e, CheckpointError::MissingBase { .. }), "{}", e);
                        tracker.acked(peer, s, false);
                        let plan = tracker.plan(peer, &snap);
                        prop_assert_eq!(plan.base, None);
                        deliver(asm, store, to_frames(&snap, &plan.pages, None)).unwrap()
                    }
                };
                prop_assert_eq!(&got, &snap);
                tracker.acked(peer, s, true);
            }
        }
    }

    /// The content hash does not depend on how the snapshot travelled:
    /// whole, as a delta or as a `Snapshot` answer; and it is the hash from
    /// scratch.
    #[test]
    fn the_hash_is_independent_of_transport(
        a in proptest::collection::vec(0u8..5, 1..6),
        b in proptest::collection::vec(0u8..5, 1..8),
    ) {
        let mem_a: Vec<u8> = a.iter().flat_map(|&s| page_of(s)).collect();
        let mut mem_b: Vec<u8> = b.iter().flat_map(|&s| page_of(s)).collect();
        if mem_b.len() < mem_a.len() {
            mem_b.resize(mem_a.len(), 0);
        }
        let mut t = PageTracker::new();
        let sa = t.capture(head(1, 0, vec![]), &mem_a);
        let sb = t.capture(head(1, 1, vec![msg(1, 0, 0, 5)]), &mem_b);
        let mut fresh = PageTracker::new();
        let direct = fresh.capture(head(1, 1, vec![msg(1, 0, 0, 5)]), &mem_b);
        prop_assert_eq!(direct.hash, sb.hash);
        prop_assert_eq!(sb.compute_hash(), sb.hash);

        let mut store = ReplicaStore::new();
        let mut asm = Assembler::new(1 << 30);
        deliver(&mut asm, &mut store, to_frames(&sa, &sa.nonzero_pages(), None)).unwrap();
        t.acked(9, 0, true);
        let plan = t.plan(9, &sb);
        prop_assert_eq!(plan.base, Some(0));
        let via_delta = deliver(&mut asm, &mut store, to_frames(&sb, &plan.pages, plan.base)).unwrap();
        let via_whole = deliver(&mut asm, &mut ReplicaStore::new(), to_frames(&sb, &sb.nonzero_pages(), None)).unwrap();
        let via_fetch = deliver(&mut asm, &mut ReplicaStore::new(), to_snapshot_frames(&sb)).unwrap();
        prop_assert_eq!(via_delta.hash, sb.hash);
        prop_assert_eq!(&via_delta, &via_whole);
        prop_assert_eq!(&via_whole, &via_fetch);
    }

    /// Frames stay under the bound for any mix of pages and messages.
    #[test]
    fn frames_respect_the_size_bound(
        pages in 0usize..200,
        sizes in proptest::collection::vec(0usize..(3 << 20), 0..6),
    ) {
        let memory: Vec<u8> = (0..pages).flat_map(|i| page_of((i % 7) as u8 + 1)).collect();
        let outbox = sizes.iter().enumerate().map(|(i, &n)| msg(0, 1, i as u32, n)).collect();
        let snap = PageTracker::new().capture(head(0, 3, outbox), &memory);
        let frames = to_frames(&snap, &snap.nonzero_pages(), None);
        for f in &frames {
            prop_assert!(frame_len(f) <= FRAME_BOUND_BYTES);
        }
        let got = deliver(&mut Assembler::new(1 << 30), &mut ReplicaStore::new(), frames).unwrap();
        prop_assert_eq!(got, snap);
    }

    /// Arbitrary frame sequences never panic the assembler; whatever it
    /// accepts matches its hash.
    #[test]
    fn the_assembler_never_panics_on_arbitrary_frames(frames in proptest::collection::vec(any_frame(), 0..12)) {
        let mut asm = Assembler::new(300_000);
        let mut store = ReplicaStore::new();
        for f in frames {
            if let Ok(Some(Assembled::Checkpoint(s))) = asm.push(f, &mut store) {
                prop_assert!(s.verify());
                store.insert(s);
            }
            prop_assert!(asm.pending_bytes() <= 300_000 * 4);
        }
    }
}

/// Flip the low bit of byte `at` of a page.
fn flip(page: &mut Bytes, at: usize) {
    let mut v = page.to_vec();
    v[at] ^= 1;
    *page = v.into();
}

fn any_page() -> impl Strategy<Value = (u32, Bytes)> {
    (
        0u32..6,
        prop_oneof![Just(P), Just(0usize), Just(P + 1), 0usize..100],
    )
        .prop_map(|(i, n)| (i, vec![i as u8; n].into()))
}

fn any_frame() -> impl Strategy<Value = Frame> {
    let pages = proptest::collection::vec(any_page(), 0..4).boxed();
    let outbox = proptest::collection::vec((0u32..3, 0usize..2000), 0..3)
        .prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (d, n))| msg(0, d, i as u32, n))
                .collect::<Vec<_>>()
        })
        .boxed();
    let memory_len = prop_oneof![
        (0u64..6).prop_map(|n| n * P as u64),
        any::<u64>(),
        Just(u64::MAX - 7),
        Just(1u64 << 40),
    ];
    let checkpoint = (
        0u32..3,
        0u32..3,
        proptest::option::of(0u32..3),
        memory_len,
        pages.clone(),
        outbox.clone(),
        any::<bool>(),
        any::<[u8; 32]>(),
        proptest::collection::vec(0u32..4, 0..3),
    )
        .prop_map(
            |(pid, superstep, base, memory_len, pages, outbox, exited, hash, patched)| Checkpoint {
                pid,
                superstep,
                base,
                memory_len,
                pages,
                globals: vec![],
                output_seq: 0,
                output_bytes: 0,
                exited,
                outbox,
                outbox_from: superstep.saturating_sub(1),
                patched,
                hash,
            },
        );
    prop_oneof![
        (
            0u32..3,
            0u32..3,
            pages,
            outbox,
            proptest::collection::vec(0u32..4, 0..3)
        )
            .prop_map(|(pid, superstep, pages, outbox, patched)| {
                Frame::CheckpointPart {
                    pid,
                    superstep,
                    pages,
                    outbox,
                    patched,
                }
            }),
        checkpoint
            .clone()
            .prop_map(|c| Frame::Checkpoint(Box::new(c))),
        (0u32..3, proptest::option::of(checkpoint)).prop_map(|(pid, c)| Frame::Snapshot {
            pid,
            snapshot: c.map(Box::new)
        }),
        Just(Frame::Welcome),
        (0u32..3, 0u64..3).prop_map(|(pid, epoch)| Frame::FetchCheckpoint { pid, epoch }),
    ]
}

/// Message tags are part of the state: they travel in checkpoint frames,
/// come back on the replica, and a changed tag changes the hash.
#[test]
fn message_tags_survive_a_checkpoint_and_count_in_the_hash() {
    let memory: Vec<u8> = [1u8, 2].iter().flat_map(|&s| page_of(s)).collect();
    let tagged = |tags: [u32; 3]| {
        let outbox: Vec<WireMessage> = tags
            .iter()
            .enumerate()
            .map(|(i, &tag)| WireMessage {
                tag,
                ..msg(2, i as Pid, i as u32, 10)
            })
            .collect();
        PageTracker::new().capture(head(2, 4, outbox), &memory)
    };
    let snap = tagged([7, 0, u32::MAX]);
    let got = deliver(
        &mut Assembler::new(1 << 30),
        &mut ReplicaStore::new(),
        to_frames(&snap, &snap.nonzero_pages(), None),
    )
    .unwrap();
    let tags: Vec<u32> = got.outbox.iter().map(|m| m.tag).collect();
    assert_eq!(tags, [7, 0, u32::MAX]);
    assert_eq!(got.hash, snap.hash);
    assert_ne!(tagged([7, 1, u32::MAX]).hash, snap.hash);
}

#[test]
fn a_corrupted_page_is_detected_by_the_hash() {
    let memory: Vec<u8> = [1u8, 2, 0, 3].iter().flat_map(|&s| page_of(s)).collect();
    let snap = PageTracker::new().capture(head(2, 4, vec![msg(2, 0, 0, 3)]), &memory);
    let mut frames = to_frames(&snap, &snap.nonzero_pages(), None);
    let Some(Frame::Checkpoint(c)) = frames.last_mut() else {
        panic!("the last frame is the checkpoint")
    };
    flip(&mut c.pages[1].1, 100);
    let err = deliver(
        &mut Assembler::new(1 << 30),
        &mut ReplicaStore::new(),
        frames,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::HashMismatch {
                pid: 2,
                superstep: 4,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.subject(), Some((2, 4)));
}

#[test]
fn a_delta_on_a_wrong_base_is_detected_by_the_hash() {
    let m0: Vec<u8> = [1u8, 2].iter().flat_map(|&s| page_of(s)).collect();
    let mut m1 = m0.clone();
    m1[5] = 99;
    let mut t = PageTracker::new();
    let s0 = t.capture(head(0, 0, vec![]), &m0);
    let s1 = t.capture(head(0, 1, vec![]), &m1);
    t.acked(5, 0, true);
    let plan = t.plan(5, &s1);
    assert_eq!(
        plan,
        Plan {
            base: Some(0),
            pages: vec![0],
            leaves: vec![1],
        }
    );
    // The replica assembled s0 but then holds a different snapshot under
    // the same superstep (its page hash cache must not hide that).
    let mut asm = Assembler::new(1 << 30);
    let mut store = ReplicaStore::new();
    deliver(&mut asm, &mut store, to_frames(&s0, &[0, 1], None)).unwrap();
    let mut wrong = s0.clone();
    wrong.memory[P + 1] ^= 0xff;
    store.remove_pid(0);
    store.insert(wrong.seal());
    let err = deliver(&mut asm, &mut store, to_frames(&s1, &plan.pages, plan.base)).unwrap_err();
    assert!(matches!(err, CheckpointError::HashMismatch { .. }), "{err}");
    // Without any base the replica says so.
    let err = deliver(
        &mut Assembler::new(1 << 30),
        &mut ReplicaStore::new(),
        to_frames(&s1, &plan.pages, plan.base),
    )
    .unwrap_err();
    assert!(err.to_string().contains("send it whole"), "{err}");
}

/// A delta is applied to the replica's base in place; when it does not
/// verify, the base is back in the store byte for byte, and the next good
/// delta still applies to it.
#[test]
fn a_rejected_delta_leaves_the_base_in_the_store_unchanged() {
    let m0: Vec<u8> = [1u8, 2, 3].iter().flat_map(|&s| page_of(s)).collect();
    let mut m1 = m0.clone();
    m1[P + 7] ^= 0x55;
    // The process grew by one page in superstep 1.
    m1.extend(page_of(9));
    let mut t = PageTracker::new();
    let s0 = t.capture(head(1, 0, vec![]), &m0);
    let s1 = t.capture(head(1, 1, vec![msg(1, 0, 0, 10)]), &m1);
    t.acked(5, 0, true);
    let plan = t.plan(5, &s1);
    assert_eq!(plan.base, Some(0));
    assert_eq!(plan.pages, vec![1, 3]);

    let (mut asm, mut store) = replica_holding(&s0);
    let mut bad = to_frames(&s1, &plan.pages, plan.base);
    flip(&mut last_checkpoint(&mut bad).pages[0].1, 3);
    let err = deliver(&mut asm, &mut store, bad).unwrap_err();
    assert!(matches!(err, CheckpointError::HashMismatch { .. }), "{err}");
    let kept = store.newest(1).expect("the base is back");
    assert_eq!(kept, &s0);
    assert!(kept.verify());

    let got = deliver(&mut asm, &mut store, to_frames(&s1, &plan.pages, plan.base)).unwrap();
    assert_eq!(got, s1);
    // `deliver` stores what it assembled, as a replica does: only s1 is left.
    assert_eq!(store.newest(1), Some(&s1));
    assert_eq!(store.pids(), vec![1]);
}

/// The replica patches its base in place, each page once: when the result
/// does not hash right (here a whole page corrupted after two patched
/// ones, one XOR-packed and one of runs, while the memory grew), the
/// patches are undone and the base is back byte for byte.
#[test]
fn a_rejected_delta_of_both_patch_forms_is_undone() {
    let m0: Vec<u8> = [1u8, 2, 3].iter().flat_map(|&s| page_of(s)).collect();
    let mut m1 = m0.clone();
    // Page 0: the low byte of every word moves (packed); page 1: one run.
    for w in m1[..P].chunks_exact_mut(8) {
        w[0] = w[0].wrapping_add(1);
    }
    m1[P + 80..P + 96].copy_from_slice(&[0xcd; 16]);
    m1[2 * P..].copy_from_slice(&page_of(8));
    m1.extend(page_of(9));
    let mut t = PageTracker::new();
    let s0 = Arc::new(t.capture(head(1, 0, vec![]), &m0));
    let s1 = Arc::new(t.capture(head(1, 1, vec![]), &m1));
    t.acked(5, 0, true);
    let plan = t.plan(5, &s1);
    assert_eq!(plan.pages, vec![0, 1, 2, 3]);
    let frames = || to_frames_shared(&s1, &plan.pages, &plan.leaves, plan.base, Some(&s0.memory));
    let kinds: Vec<(u32, bool)> = last_checkpoint(&mut frames())
        .pages
        .iter()
        .map(|(i, b)| (*i, b.starts_with(&[0xff, 0xff])))
        .collect();
    let patched = |i: u32| i | patch::PAGE_PATCH;
    assert_eq!(
        kinds,
        vec![
            (patched(0), true),
            (patched(1), false),
            (2, false),
            (3, false)
        ]
    );

    let (mut asm, mut store) = replica_holding(&s0);
    let mut bad = frames();
    flip(&mut last_checkpoint(&mut bad).pages[3].1, 5);
    let err = deliver(&mut asm, &mut store, bad).unwrap_err();
    assert!(matches!(err, CheckpointError::HashMismatch { .. }), "{err}");
    assert_eq!(store.newest(1), Some(&*s0));
    assert!(store.newest(1).is_some_and(Snapshot::verify));

    let got = deliver(&mut asm, &mut store, frames()).unwrap();
    assert_eq!(got, *s1);
}

/// A page that changed in a few words travels as a patch of the base's
/// page; a corrupted or malformed patch is refused and leaves the base in
/// the store as it was.
#[test]
fn sparse_changes_travel_as_patches_and_bad_patches_are_refused() {
    let m0: Vec<u8> = [1u8, 2, 3].iter().flat_map(|&s| page_of(s)).collect();
    let mut m1 = m0.clone();
    m1[P + 8..P + 24].copy_from_slice(&[0xab; 16]);
    m1[2 * P + 800] ^= 1;
    // A densely changed page goes whole.
    m1[..P].copy_from_slice(&page_of(7));
    let mut t = PageTracker::new();
    let s0 = Arc::new(t.capture(head(1, 0, vec![]), &m0));
    let s1 = Arc::new(t.capture(head(1, 1, vec![]), &m1));
    t.acked(5, 0, true);
    let plan = t.plan(5, &s1);
    assert_eq!(plan.pages, vec![0, 1, 2]);
    let frames = || to_frames_shared(&s1, &plan.pages, &plan.leaves, plan.base, Some(&s0.memory));
    let Some(Frame::Checkpoint(c)) = frames().pop() else {
        panic!("the last frame is the checkpoint")
    };
    let entries: Vec<(u32, usize)> = c.pages.iter().map(|(i, b)| (*i, b.len())).collect();
    assert_eq!(
        entries,
        vec![
            (0, P),
            (1 | patch::PAGE_PATCH, 4 + 16),
            (2 | patch::PAGE_PATCH, 4 + 8)
        ]
    );

    let (mut asm, mut store) = replica_holding(&s0);
    let tamper = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut bad = frames();
        let c = last_checkpoint(&mut bad);
        let mut p = c.pages[1].1.to_vec();
        f(&mut p);
        c.pages[1].1 = Bytes::from(p);
        bad
    };
    // A patch word changed in transit: the rebuilt state does not hash right.
    let err = deliver(&mut asm, &mut store, tamper(&|p| p[6] ^= 1)).unwrap_err();
    assert!(matches!(err, CheckpointError::HashMismatch { .. }), "{err}");
    assert_eq!(store.newest(1), Some(&*s0));
    // A run that leaves the page.
    let err = deliver(&mut asm, &mut store, tamper(&|p| p[1] = 0x20)).unwrap_err();
    assert!(
        err.to_string().contains("the patch of page 1 is malformed"),
        "{err}"
    );
    assert_eq!(store.newest(1), Some(&*s0));
    // A patch in a whole checkpoint.
    let mut whole = to_frames(&s1, &s1.nonzero_pages(), None);
    last_checkpoint(&mut whole).pages[1] = (
        1 | patch::PAGE_PATCH,
        Bytes::from_static(&[0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    );
    let err = deliver(&mut asm, &mut ReplicaStore::new(), whole).unwrap_err();
    assert!(
        matches!(err, CheckpointError::PatchWithoutBase { index: 1, .. }),
        "{err}"
    );

    let got = deliver(&mut asm, &mut store, frames()).unwrap();
    assert_eq!(got, *s1);
}

/// A retained message that repeats the same send of the superstep before
/// with a few words changed travels as a patch of it; a bad patch, a patch
/// without a reference and a patched index out of range are refused with
/// the base left in the store.
#[test]
fn repeated_sends_travel_as_payload_patches() {
    let send = |superstep, fill: u8, word: u64| {
        let mut payload = vec![fill; 100_000];
        payload[800..808].copy_from_slice(&word.to_le_bytes());
        WireMessage {
            src: 1,
            dst: 0,
            superstep,
            seq: 0,
            tag: 0,
            payload: payload.into(),
        }
    };
    let m: Vec<u8> = page_of(1);
    let mut t = PageTracker::new();
    let s0 = t.capture(head_retaining(1, 0, vec![send(0, 5, 1)]), &m);
    let s1 = t.capture(head_retaining(1, 1, vec![send(0, 5, 1), send(1, 5, 2)]), &m);
    t.acked(5, 0, true);
    let plan = t.plan(5, &s1);
    let frames = || to_frames(&s1, &plan.pages, plan.base);
    let Some(Frame::Checkpoint(c)) = frames().pop() else {
        panic!("the last frame is the checkpoint")
    };
    assert_eq!(c.patched, vec![0]);
    // Two chunks (64 KiB and the rest): one word changed in the first.
    assert_eq!(c.outbox[0].payload.len(), 4 + (4 + 8) + 4);

    let (mut asm, mut store) = replica_holding(&s0);
    let tamper = |f: &dyn Fn(&mut Checkpoint)| {
        let mut bad = frames();
        f(last_checkpoint(&mut bad));
        bad
    };
    let err = deliver(
        &mut asm,
        &mut store,
        tamper(&|c| {
            let mut p = c.outbox[0].payload.to_vec();
            p[12] ^= 1;
            c.outbox[0].payload = p.into();
        }),
    )
    .unwrap_err();
    assert!(matches!(err, CheckpointError::HashMismatch { .. }), "{err}");
    assert_eq!(store.newest(1), Some(&s0));
    let err = deliver(&mut asm, &mut store, tamper(&|c| c.outbox[0].seq = 9)).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::MessagePatch {
                why: patch::PatchError::NoReference,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(store.newest(1), Some(&s0));
    let err = deliver(&mut asm, &mut store, tamper(&|c| c.patched = vec![1])).unwrap_err();
    assert!(
        matches!(err, CheckpointError::PatchedIndex { index: 1, .. }),
        "{err}"
    );
    assert_eq!(store.newest(1), Some(&s0));
    let err = deliver(
        &mut asm,
        &mut store,
        tamper(&|c| {
            c.outbox[0].payload = Bytes::from_static(&[1, 2, 3]);
        }),
    )
    .unwrap_err();
    assert!(matches!(err, CheckpointError::MessagePatch { .. }), "{err}");
    assert_eq!(store.newest(1), Some(&s0));

    assert_eq!(deliver(&mut asm, &mut store, frames()).unwrap(), s1);
}

/// A send that repeats the same send of the superstep before byte for byte
/// (a converged PageRank's contributions) costs the replica no copy: the
/// message it rebuilds shares the base's buffer.
#[test]
fn a_repeated_payload_shares_the_replicas_buffer() {
    let send = |superstep| WireMessage {
        src: 1,
        dst: 0,
        superstep,
        seq: 0,
        tag: 0,
        payload: vec![5u8; 200_000].into(),
    };
    let m: Vec<u8> = page_of(1);
    let mut t = PageTracker::new();
    let s0 = t.capture(head_retaining(1, 0, vec![send(0)]), &m);
    let s1 = t.capture(head_retaining(1, 1, vec![send(0), send(1)]), &m);
    t.acked(5, 0, true);
    let plan = t.plan(5, &s1);
    let mut frames = to_frames(&s1, &plan.pages, plan.base);
    assert_eq!(last_checkpoint(&mut frames).patched, vec![0]);
    let (mut asm, mut store) = replica_holding(&s0);
    let got = deliver(&mut asm, &mut store, frames).unwrap();
    assert_eq!(got, s1);
    let held = store.newest(1).expect("stored");
    assert_eq!(
        held.outbox[1].payload.as_ptr(),
        held.outbox[0].payload.as_ptr()
    );
}

#[test]
fn deltas_against_an_older_base_include_every_page_changed_since() {
    let mut m: Vec<u8> = [1u8, 2, 3, 4].iter().flat_map(|&s| page_of(s)).collect();
    let mut t = PageTracker::new();
    t.capture(head(0, 0, vec![]), &m);
    t.acked(1, 0, true);
    m[P] = 0; // page 1 changes in superstep 1
    let s1 = t.capture(head(0, 1, vec![]), &m);
    t.acked(2, 1, true);
    m[3 * P] = 0; // page 3 changes in superstep 2
    m.resize(6 * P, 0); // two zero pages appear
    m[5 * P] = 1; // page 5 is not zero
    let s2 = t.capture(head(0, 2, vec![]), &m);
    assert_eq!(t.plan(1, &s2).pages, vec![1, 3, 5]);
    assert_eq!(t.plan(2, &s2).pages, vec![3, 5]);
    // A replica that failed needs everything that is not zeros.
    t.acked(2, 2, false);
    assert_eq!(
        t.plan(2, &s2),
        Plan {
            base: None,
            pages: vec![0, 1, 2, 3, 5],
            leaves: vec![],
        }
    );
    // A plan for a snapshot that is not the last capture is whole.
    assert_eq!(t.plan(1, &s1).base, None);
    // A capture that goes back in time starts over.
    let again = t.capture(head(0, 1, vec![]), &m);
    assert_eq!(t.plan(1, &again).base, None);
    assert_eq!(t.replica_base(1), None);
}

#[test]
fn an_exited_snapshot_has_no_memory_and_travels_as_a_delta() {
    let m: Vec<u8> = page_of(3);
    let mut t = PageTracker::new();
    let s0 = t.capture(head(4, 0, vec![]), &m);
    let mut store = ReplicaStore::new();
    let mut asm = Assembler::new(1 << 20);
    deliver(
        &mut asm,
        &mut store,
        to_frames(&s0, &s0.nonzero_pages(), None),
    )
    .unwrap();
    t.acked(1, 0, true);
    let mut h = head(4, 1, vec![msg(4, 0, 0, 10)]);
    h.exited = true;
    let s1 = t.capture(h, &m);
    assert!(s1.memory.is_empty());
    let plan = t.plan(1, &s1);
    assert_eq!(
        plan,
        Plan {
            base: Some(0),
            pages: vec![],
            leaves: vec![],
        }
    );
    let got = deliver(&mut asm, &mut store, to_frames(&s1, &plan.pages, plan.base)).unwrap();
    assert_eq!(got, s1);
    assert_eq!(store.newest(4).map(|s| s.superstep), Some(1));
}

#[test]
fn a_seeded_tracker_sends_deltas_against_the_restored_snapshot() {
    let mut m: Vec<u8> = [1u8, 2, 3].iter().flat_map(|&s| page_of(s)).collect();
    let restored = PageTracker::new().capture(head(0, 5, vec![]), &m);
    let mut store = ReplicaStore::new();
    store.insert(restored.clone());
    let mut t = PageTracker::seeded(&restored, None);
    t.acked(8, 5, true);
    m[2 * P + 7] ^= 1;
    let s6 = t.capture(head(0, 6, vec![]), &m);
    let plan = t.plan(8, &s6);
    assert_eq!(
        plan,
        Plan {
            base: Some(5),
            pages: vec![2],
            leaves: vec![1],
        }
    );
    let got = deliver(
        &mut Assembler::new(1 << 20),
        &mut store,
        to_frames(&s6, &plan.pages, plan.base),
    )
    .unwrap();
    assert_eq!(got, s6);
    // A base before the tracker's history cannot be trusted.
    t.acked(9, 4, true);
    assert_eq!(t.replica_base(9), None);
}

#[test]
fn large_messages_travel_in_their_own_frames_within_the_bound() {
    let memory: Vec<u8> = (0..100).flat_map(|i| page_of(i as u8 + 1)).collect();
    let max = bsp_api::wire::MAX_MESSAGE_BYTES;
    let outbox = vec![
        msg(0, 1, 0, max),
        msg(0, 1, 1, 10),
        msg(0, 2, 2, max),
        msg(0, 3, 3, 3 << 20),
    ];
    let snap = PageTracker::new().capture(head(0, 0, outbox), &memory);
    let frames = to_frames(&snap, &snap.nonzero_pages(), None);
    assert!(frames.len() >= 4, "{} frames", frames.len());
    for f in &frames {
        assert!(frame_len(f) <= FRAME_BOUND_BYTES, "{}", frame_len(f));
    }
    let got = deliver(
        &mut Assembler::new(1 << 30),
        &mut ReplicaStore::new(),
        frames,
    )
    .unwrap();
    assert_eq!(got, snap);
}

#[test]
fn the_assembler_refuses_hostile_checkpoints_with_readable_errors() {
    let snap = PageTracker::new().capture(head(0, 0, vec![]), &page_of(1));
    let good = match to_frames(&snap, &[0], None).pop() {
        Some(Frame::Checkpoint(c)) => *c,
        other => panic!("{other:?}"),
    };
    let mut asm = Assembler::new(4 * P as u64);
    let check = |asm: &mut Assembler, c: Checkpoint| asm.finish(c, None).unwrap_err();

    let mut c = good.clone();
    c.memory_len = P as u64 + 1;
    assert!(matches!(
        check(&mut asm, c),
        CheckpointError::MemoryLen { .. }
    ));
    let mut c = good.clone();
    c.memory_len = 1 << 40;
    let e = check(&mut asm, c);
    assert!(matches!(e, CheckpointError::TooLarge { .. }), "{e}");
    let mut c = good.clone();
    c.pages[0].0 = 1;
    assert!(matches!(
        check(&mut asm, c),
        CheckpointError::PageIndex { index: 1, .. }
    ));
    let mut c = good.clone();
    c.pages[0].1.truncate(P - 1);
    assert!(matches!(
        check(&mut asm, c),
        CheckpointError::PageSize { .. }
    ));
    let mut c = good.clone();
    c.memory_len = 2 * P as u64;
    c.pages.push((0, vec![0; P].into()));
    assert!(matches!(
        check(&mut asm, c),
        CheckpointError::PageOrder { .. }
    ));

    // Parts beyond the cap are dropped.
    let pages: Vec<(u32, Bytes)> = (0..5).map(|i| (i, vec![0; P].into())).collect();
    let e = asm.part(0, 0, pages, vec![], vec![]).unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");
    assert_eq!(asm.pending_bytes(), 0);

    // A part of another superstep abandons the unfinished checkpoint.
    asm.part(0, 0, vec![(0, vec![0; P].into())], vec![], vec![])
        .unwrap();
    let e = asm.part(0, 1, vec![], vec![], vec![]).unwrap_err();
    assert!(matches!(
        e,
        CheckpointError::Interleaved {
            superstep: 0,
            next: 1,
            ..
        }
    ));
    let e = asm.finish(good.clone(), None).unwrap_err();
    assert!(matches!(
        e,
        CheckpointError::Interleaved {
            superstep: 1,
            next: 0,
            ..
        }
    ));
    // And with nothing pending the good one goes through.
    assert_eq!(asm.finish(good, None).unwrap(), snap);
    assert!(matches!(
        asm.push(Frame::Welcome, &mut ReplicaStore::new()),
        Err(CheckpointError::NotCheckpoint("Welcome"))
    ));
}

#[test]
fn the_replica_store_keeps_the_newest_snapshot_per_pid() {
    let mut store = ReplicaStore::new();
    let a = PageTracker::new().capture(head(1, 3, vec![]), &page_of(1));
    let b = PageTracker::new().capture(head(1, 4, vec![msg(1, 0, 0, 8)]), &page_of(2));
    let c = PageTracker::new().capture(head(2, 0, vec![]), &[]);
    assert!(store.insert(a.clone()));
    assert!(store.insert(b.clone()));
    assert!(!store.insert(a.clone()), "older snapshots are not kept");
    assert!(store.insert(c.clone()));
    assert_eq!(store.newest(1), Some(&b));
    assert_eq!(store.get(1, 3), None);
    assert_eq!(store.get(1, 4), Some(&b));
    assert_eq!(store.pids(), vec![1, 2]);
    assert_eq!(store.total_bytes(), b.size_bytes() + c.size_bytes());
    assert_eq!(store.remove_pid(1), Some(b));
    assert_eq!(store.total_bytes(), c.size_bytes());
}

#[test]
fn the_hash_covers_every_field() {
    let base = PageTracker::new().capture(head(1, 2, vec![msg(1, 0, 0, 4)]), &page_of(5));
    let variants: Vec<fn(&mut Snapshot)> = vec![
        |s| s.pid += 1,
        |s| s.superstep += 1,
        |s| s.exited = true,
        |s| s.output_seq += 1,
        |s| s.output_bytes += 1,
        |s| s.memory.extend_from_slice(&[0; P]),
        |s| s.memory[P - 1] ^= 1,
        |s| s.globals[0] += 1,
        |s| s.globals.push(0),
        |s| s.outbox[0].dst += 1,
        |s| s.outbox[0].seq += 1,
        |s| s.outbox[0].superstep += 1,
        |s| s.outbox[0].src += 1,
        |s| s.outbox[0].payload = [&s.outbox[0].payload[..], &[0]].concat().into(),
        |s| s.outbox.clear(),
    ];
    for (i, f) in variants.iter().enumerate() {
        let mut s = base.clone();
        f(&mut s);
        assert_ne!(s.compute_hash(), base.hash, "variant {i}");
    }
}

#[test]
fn reusing_a_buffer_that_is_not_the_last_capture_copies_everything() {
    let m0: Vec<u8> = [1u8, 2].iter().flat_map(|&s| page_of(s)).collect();
    let mut m1 = m0.clone();
    m1[3] = 9;
    let mut t = PageTracker::new();
    let s0 = t.capture(head(0, 0, vec![]), &m0);
    let mut stale = s0.clone();
    stale.memory[P + 5] ^= 1; // not what the tracker captured (hash unchanged)
    stale.superstep = 9;
    let s1 = t.capture_reusing(head(0, 1, vec![]), &m1, stale);
    assert_eq!(s1.memory, m1);
    let mut m2 = m1.clone();
    m2.resize(3 * P, 4);
    let s2 = t.capture_reusing(head(0, 2, vec![]), &m2, s1);
    assert_eq!(s2.memory, m2);
    assert_eq!(s2.hash, s2.compute_hash());
}

/// A delta carries only the messages sent after its base; the replica keeps
/// the base's messages that are still retained and rebuilds the whole outbox.
#[test]
fn a_delta_carries_only_the_new_messages_of_the_outbox() {
    let at = |superstep: u32, seq: u32| WireMessage {
        superstep,
        ..msg(3, 0, seq, 100 + seq as usize)
    };
    let memory = page_of(1);
    let mut t = PageTracker::new();
    let mut store = ReplicaStore::new();
    let mut asm = Assembler::new(1 << 30);
    let outbox_of = |frames: &[Frame]| -> Vec<WireMessage> {
        frames
            .iter()
            .flat_map(|f| match f {
                Frame::CheckpointPart { outbox, .. } => outbox.clone(),
                Frame::Checkpoint(c) => c.outbox.clone(),
                _ => vec![],
            })
            .collect()
    };
    let s0 = t.capture(head_retaining(3, 0, vec![at(0, 0)]), &memory);
    deliver(
        &mut asm,
        &mut store,
        to_frames(&s0, &s0.nonzero_pages(), None),
    )
    .unwrap();
    t.acked(1, 0, true);
    // Superstep 1: nothing left the retention window yet.
    let s1 = t.capture(
        head_retaining(3, 1, vec![at(0, 0), at(1, 0), at(1, 1)]),
        &memory,
    );
    let plan = t.plan(1, &s1);
    let frames = to_frames(&s1, &plan.pages, plan.base);
    assert_eq!(outbox_of(&frames), vec![at(1, 0), at(1, 1)]);
    assert_eq!(deliver(&mut asm, &mut store, frames).unwrap(), s1);
    t.acked(1, 1, true);
    // Superstep 2: the safe point moved to 1, and nothing was sent in 2.
    let s2 = t.capture(head_retaining(3, 2, vec![at(1, 0), at(1, 1)]), &memory);
    let plan = t.plan(1, &s2);
    let frames = to_frames(&s2, &plan.pages, plan.base);
    assert_eq!(outbox_of(&frames), vec![]);
    assert_eq!(deliver(&mut asm, &mut store, frames).unwrap(), s2);
    t.acked(1, 2, true);
    // Superstep 3: everything older left the window.
    let s3 = t.capture(head_retaining(3, 3, vec![at(3, 0)]), &memory);
    let plan = t.plan(1, &s3);
    let frames = to_frames(&s3, &plan.pages, plan.base);
    assert_eq!(outbox_of(&frames), vec![at(3, 0)]);
    assert_eq!(deliver(&mut asm, &mut store, frames).unwrap(), s3);
}

/// Retained messages are hashed once: later captures (and replicas) take
/// their payload hashes from the cache, which keeps only the payloads of
/// the last snapshot, and every hash equals the one computed afresh.
#[test]
fn retained_payloads_are_hashed_once_and_the_hash_is_unchanged() {
    let at = |superstep: u32, seq: u32| WireMessage {
        superstep,
        ..msg(3, 0, seq, 5000 + seq as usize)
    };
    let (a, b, c) = (at(0, 0), at(0, 1), at(1, 0));
    // Same bytes as `a`, another buffer: its own entry.
    let a2 = WireMessage {
        seq: 2,
        payload: Bytes::copy_from_slice(&a.payload),
        ..a.clone()
    };
    let memory = page_of(1);
    let mut t = PageTracker::new();
    let mut store = ReplicaStore::new();
    let mut asm = Assembler::new(1 << 30);
    let outboxes = [
        vec![a.clone(), b.clone(), a2.clone()],
        vec![a.clone(), b.clone(), a2.clone(), c.clone()],
        vec![c.clone()],
    ];
    for (s, outbox) in outboxes.into_iter().enumerate() {
        let snap = t.capture(head_retaining(3, s as u32, outbox.clone()), &memory);
        assert_eq!(snap.hash, snap.compute_hash(), "superstep {s}");
        let cached: std::collections::HashSet<(usize, usize)> =
            t.payloads.known.keys().copied().collect();
        let expected: std::collections::HashSet<(usize, usize)> = outbox
            .iter()
            .map(|m| (m.payload.as_ptr() as usize, m.payload.len()))
            .collect();
        assert_eq!(
            cached, expected,
            "superstep {s}: the cache keeps this outbox only"
        );
        let plan = t.plan(1, &snap);
        let got = deliver(
            &mut asm,
            &mut store,
            to_frames(&snap, &plan.pages, plan.base),
        )
        .unwrap();
        assert_eq!(got, snap);
        assert!(got.verify());
        t.acked(1, s as u32, true);
    }
}

/// A capture again at the same superstep (a leaving process captured for
/// its new host) starts the tracker over; a buffer recycled from before
/// must then be copied whole, also where the memory went back to zeros.
#[test]
fn a_capture_that_starts_over_does_not_keep_a_recycled_buffers_pages() {
    let a: Vec<u8> = [page_of(5), page_of(6)].concat();
    let b: Vec<u8> = [page_of(0), page_of(6)].concat();
    let mut t = PageTracker::new();
    let s1 = t.capture(head(1, 1, vec![]), &a);
    let s2 = t.capture(head(1, 2, vec![]), &b);
    let again = t.capture_reusing(head(1, 2, vec![]), &b, s1);
    assert_eq!(again.memory, b);
    assert_eq!(again, s2);
}

/// The state digest copies of a process compare (redundancy): the same
/// whatever older messages the host still retains, different when the
/// memory or a message sent since the previous checkpoint differs, and
/// what the tracker gives without rehashing.
#[test]
fn the_state_digest_covers_the_state_and_the_messages_since_the_last_checkpoint() {
    let memory: Vec<u8> = [page_of(3), page_of(0), page_of(9)].concat();
    let sent = |seq: u32, superstep: u32| {
        let mut m = msg(0, 1, seq, 40);
        m.superstep = superstep;
        m
    };
    let (older, before, now) = (sent(0, 3), sent(1, 4), sent(2, 5));
    for every in [1, 2] {
        let mut t = PageTracker::new().with_state_digests(every);
        let snap = t.capture(
            head_retaining(0, 5, vec![older.clone(), before.clone(), now.clone()]),
            &memory,
        );
        assert_eq!(t.last_state_digest(), snap.state_digest(every));
        let mut seeded = PageTracker::seeded(&snap, Some(every));
        assert_eq!(seeded.last_state_digest(), snap.state_digest(every));
        // Another host retained less (back to the previous checkpoint):
        // same digest, other content hash.
        let kept = if every == 1 {
            vec![now.clone()]
        } else {
            vec![before.clone(), now.clone()]
        };
        let again = seeded.capture(head_retaining(0, 5, kept.clone()), &memory);
        assert_eq!(seeded.last_state_digest(), again.state_digest(every));
        assert_eq!(again.state_digest(every), snap.state_digest(every));
        assert_ne!(again.hash, snap.hash);
        // A bit of memory differs.
        let mut flipped = memory.clone();
        flipped[P + 17] ^= 1;
        let other = PageTracker::new().capture(head_retaining(0, 5, kept.clone()), &flipped);
        assert_ne!(other.state_digest(every), snap.state_digest(every));
        // A message since the previous checkpoint differs: with a
        // checkpoint every 2 supersteps, one of superstep 4 counts too.
        let mut bad = kept.clone();
        bad[0].payload = bytes::Bytes::from(vec![7u8; 40]);
        let other = PageTracker::new().capture(head_retaining(0, 5, bad), &memory);
        assert_ne!(other.state_digest(every), snap.state_digest(every));
    }
}

/// Page hashes are part of every content hash that peers compare, so they
/// must not depend on the CPU, the build or the hashing crate: leaves and
/// payloads are hashed with XXH3-128 (reference values from the
/// `xxhash-rust` crate, which this peer used before; an AVX2 and an SSE2
/// CPU must agree with them), and a page's hash is XXH3-128 of its leaves'
/// hashes in order.
#[test]
fn page_hashes_are_xxh3_128_of_leaf_hashes_on_every_cpu() {
    let hex = |h: PageHash| format!("{:032x}", u128::from_le_bytes(h));
    let pattern: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 251) as u8).collect();
    assert_eq!(hex(xxh3(&[])), "99aa06d3014798d86001c324468d497f");
    assert_eq!(
        hex(xxh3(&[0; PAGE_SIZE])),
        "fd5ee061c8433a0f33b202d302b65caa"
    );
    assert_eq!(hex(xxh3(&pattern)), "f5e7bc5d3d8675bfaaae63800707a868");
    let reference = |page: &[u8]| {
        let leaves: Vec<u8> = page.chunks(LEAF_SIZE).flat_map(xxh3).collect();
        xxh3(&leaves)
    };
    assert_eq!(page_hash(&[]), xxh3(&[]));
    for page in [
        &pattern[..],
        &[0; PAGE_SIZE],
        &pattern[..5000],
        &pattern[..4096],
    ] {
        assert_eq!(page_hash(page), reference(page));
    }
    let whole: &[u8; PAGE_SIZE] = pattern[..].try_into().unwrap();
    assert_eq!(combine(&leaf_hashes(whole)), page_hash(&pattern));
}
