//! The wire form of a checkpoint: frames of at most [`FRAME_BOUND_BYTES`],
//! pages referenced rather than copied where they can be.

use super::*;

/// The frames that carry `snapshot` to a replica: [`Frame::CheckpointPart`]s
/// then the final [`Frame::Checkpoint`], with the pages `pages` (ascending;
/// from [`PageTracker::plan`]) and `base` (`None`: whole). Each frame encodes
/// to at most [`FRAME_BOUND_BYTES`]. Page indices beyond the memory are
/// skipped.
pub fn to_frames(snapshot: &Snapshot, pages: &[u32], base: Option<u32>) -> Vec<Frame> {
    let (mut frames, last) = split(snapshot, pages, base, |i| {
        (i, Bytes::copy_from_slice(snapshot.page(i as usize)))
    });
    frames.push(Frame::Checkpoint(Box::new(last)));
    frames
}

/// [`to_frames`] whose pages are slices of `snapshot`'s memory, not copies
/// (they keep the snapshot alive until the frames are written). With
/// `base_memory`, the memory of the delta's base (the snapshot of superstep
/// `base` as the replica holds it), a page that differs from the base's in
/// few words travels as a [`patch`](super::patch) of it. `leaves` (from
/// [`Plan::leaves`], parallel to `pages`; empty for all leaves) tells which
/// leaves of each page may differ from the base's: only those are compared.
pub fn to_frames_shared(
    snapshot: &Arc<Snapshot>,
    pages: &[u32],
    leaves: &[u16],
    base: Option<u32>,
    base_memory: Option<&[u8]>,
) -> Vec<Frame> {
    let memory = Bytes::from_owner(SharedMemory(snapshot.clone()));
    let base_memory = base_memory.filter(|_| base.is_some());
    let (mut frames, last) = split(snapshot, pages, base, |i| {
        let start = (i as usize * PAGE_SIZE).min(memory.len());
        let page = memory.slice(start..(start + PAGE_SIZE).min(memory.len()));
        let old = base_memory.and_then(|b| b.get(start..start + PAGE_SIZE));
        match old.filter(|_| page.len() == PAGE_SIZE).and_then(|old| {
            let mask = pages
                .binary_search(&i)
                .ok()
                .and_then(|k| leaves.get(k).copied())
                .unwrap_or(patch::ALL_LEAVES);
            patch::diff_leaves(old, &page, mask)
        }) {
            Some(p) => (i | patch::PAGE_PATCH, Bytes::from(p)),
            None => (i, page),
        }
    });
    frames.push(Frame::Checkpoint(Box::new(last)));
    frames
}

/// A snapshot's memory as the owner of a [`Bytes`].
pub(super) struct SharedMemory(Arc<Snapshot>);

impl AsRef<[u8]> for SharedMemory {
    fn as_ref(&self) -> &[u8] {
        &self.0.memory
    }
}

/// The frames that answer [`Frame::FetchCheckpoint`] with `snapshot`:
/// [`Frame::CheckpointPart`]s then [`Frame::Snapshot`] with the whole
/// checkpoint (the pages that are not all zeros).
pub fn to_snapshot_frames(snapshot: &Snapshot) -> Vec<Frame> {
    let (mut frames, last) = split(snapshot, &snapshot.nonzero_pages(), None, |i| {
        (i, Bytes::copy_from_slice(snapshot.page(i as usize)))
    });
    frames.push(Frame::Snapshot {
        pid: snapshot.pid,
        snapshot: Some(Box::new(last)),
    });
    frames
}

/// The parts and the final checkpoint (with the tail of pages and messages).
pub(super) fn split(
    snapshot: &Snapshot,
    pages: &[u32],
    base: Option<u32>,
    mut page: impl FnMut(u32) -> (u32, Bytes),
) -> (Vec<Frame>, Checkpoint) {
    let mut frames = Vec::new();
    let mut cur_pages: Vec<(u32, Bytes)> = Vec::new();
    let mut cur_outbox: Vec<WireMessage> = Vec::new();
    let mut cur_patched: Vec<u32> = Vec::new();
    let mut cur = 0usize;
    let (pid, superstep) = (snapshot.pid, snapshot.superstep);
    let mut flush = |p: &mut Vec<(u32, Bytes)>, o: &mut Vec<WireMessage>, x: &mut Vec<u32>| {
        frames.push(Frame::CheckpointPart {
            pid,
            superstep,
            pages: std::mem::take(p),
            outbox: std::mem::take(o),
            patched: std::mem::take(x),
        });
    };
    let mut sorted: Vec<u32> = pages
        .iter()
        .copied()
        .filter(|&i| (i as usize) < snapshot.page_count())
        .collect();
    sorted.sort_unstable();
    sorted.dedup();
    for i in sorted {
        let (entry, bytes) = page(i);
        let cost = bytes.len() + PAGE_OVERHEAD;
        if cur > 0 && cur + cost > PART_TARGET_BYTES {
            flush(&mut cur_pages, &mut cur_outbox, &mut cur_patched);
            cur = 0;
        }
        cur_pages.push((entry, bytes));
        cur += cost;
    }
    // A delta carries the messages sent after its base; the replica has
    // the older ones still retained (from `outbox_from` on).
    let (outbox_from, kept, outbox) = match base {
        Some(b) => {
            let new = snapshot.outbox.partition_point(|m| m.superstep <= b);
            let from = snapshot
                .outbox
                .first()
                .map_or(b + 1, |m| m.superstep.min(b + 1));
            (from, &snapshot.outbox[..new], &snapshot.outbox[new..])
        }
        None => (0, &[][..], &snapshot.outbox[..]),
    };
    // What the replica keeps is what a new message's payload may be a
    // patch of: the same send in an earlier superstep.
    let references = references(kept);
    for m in outbox {
        let patch = (m.payload.len() >= PATCH_MIN_PAYLOAD)
            .then(|| references.get(&(m.dst, m.seq)))
            .flatten()
            .and_then(|r| patch::diff_payload(r, &m.payload));
        // A payload the previous message of this part shares costs nothing more.
        let shared = patch.is_none()
            && cur_outbox
                .last()
                .is_some_and(|p: &WireMessage| message_groups::same_buffer(&p.payload, &m.payload));
        let cost = match &patch {
            Some(p) => p.len() + 32,
            None if shared => 32,
            None => m.payload.len() + 32,
        };
        if cur > 0 && cur + cost > PART_TARGET_BYTES {
            flush(&mut cur_pages, &mut cur_outbox, &mut cur_patched);
            cur = 0;
        }
        let mut m = m.clone();
        if let Some(p) = patch {
            cur_patched.push(cur_outbox.len() as u32);
            m.payload = Bytes::from(p);
        }
        cur_outbox.push(m);
        cur += cost;
    }
    let last = Checkpoint {
        pid,
        superstep,
        base,
        memory_len: snapshot.memory.len() as u64,
        pages: cur_pages,
        globals: snapshot.globals.clone(),
        output_seq: snapshot.output_seq,
        output_bytes: snapshot.output_bytes,
        exited: snapshot.exited,
        outbox: cur_outbox,
        outbox_from,
        patched: cur_patched,
        hash: snapshot.hash,
    };
    (frames, last)
}

/// Payloads shorter than this travel whole: a patch would save little.
const PATCH_MIN_PAYLOAD: usize = 4 << 10;

/// The reference payloads among `kept` (a replica's kept outbox, by
/// superstep and send order): per destination and sequence number, the
/// payload of the newest superstep.
pub(super) fn references(kept: &[WireMessage]) -> HashMap<(Pid, u32), &Bytes> {
    kept.iter().map(|m| ((m.dst, m.seq), &m.payload)).collect()
}
