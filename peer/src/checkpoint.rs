//! Checkpoints of processes (docs/fault-tolerance.md): the whole state of a
//! process at the end of a superstep ([`Snapshot`]), its content hash, change
//! detection on the owner ([`PageTracker`]), the wire form ([`to_frames`],
//! [`to_snapshot_frames`]), reassembly and verification on a replica
//! ([`Assembler`]) and the replica's store ([`ReplicaStore`]).
//!
//! Pure: no IO, no clock, no randomness: hashes, page lists and frames
//! depend only on the snapshots.
//!
//! # Content hash
//!
//! [`Snapshot::compute_hash`] is the BLAKE3 hash of this canonical encoding
//! (integers little-endian), the same on every run and machine:
//!
//! ```text
//! "bspweb-checkpoint-v5\n"
//! pid: u32, superstep: u32, exited: u8 (0 or 1),
//! output_seq: u64, output_bytes: u64, memory_len: u64,
//! XXH3-128 of each 64 KiB page of memory, in page order (16 bytes each),
//! number of globals: u64, each global: u64,
//! number of outbox messages: u64,
//! each message: src: u32, dst: u32, superstep: u32, seq: u32, tag: u32,
//!   payload length: u64, XXH3-128 of the payload
//! ```
//!
//! The hash checks that a replica rebuilt exactly the owner's state (no
//! corruption, no delta applied to the wrong base) and that a run is
//! deterministic; it is not a commitment against adversaries: the pages and
//! payloads are hashed with XXH3-128 ([`PageHash`]; v3 used BLAKE3, v2
//! SHA-256), because every changed page is hashed by the owner and by each
//! replica at every checkpoint, and XXH3 does that about ten times faster.
//! Validating results computed by untrusted peers needs a cryptographic
//! digest of its own.
//!
//! (A payload consecutive messages share — one `send_range` — is hashed once.)
//!
//! Hashing pages first (Merkle style) lets the owner cache the hash of every
//! page and rehash only the pages that changed since its last capture.

use std::collections::HashMap;

use bytes::Bytes;
use std::sync::{Arc, OnceLock};

use bsp_api::wire::{Checkpoint, Frame, MAX_FRAME_BYTES, WireMessage, message_groups};
use bsp_api::{PeerId, Pid};

/// Size of a wasm page, the unit of change detection and transfer.
pub const PAGE_SIZE: usize = 64 << 10;

/// Frames from [`to_frames`] are filled up to about this many bytes; an item
/// larger than this (an outbox message of up to 8 MiB) travels alone.
pub const PART_TARGET_BYTES: usize = 4 << 20;

/// Every frame from [`to_frames`] encodes to at most this many bytes, as
/// long as every outbox payload is at most
/// [`MAX_MESSAGE_BYTES`](bsp_api::wire::MAX_MESSAGE_BYTES).
pub const FRAME_BOUND_BYTES: usize = MAX_FRAME_BYTES - (1 << 20);

/// Domain tag at the start of the canonical encoding.
const HASH_TAG: &[u8] = b"bspweb-checkpoint-v5\n";

/// Bytes counted per outbox message on top of its payload.
const MESSAGE_COST: u64 = 32;

/// How many of its latest snapshots a process keeps to recycle as the
/// buffer of its next capture (`job.rs`). A snapshot stays held until both
/// replicas acknowledged it; with supersteps of a few milliseconds on busy
/// cores that can take three supersteps, and a capture that finds no free
/// buffer copies the whole memory (64 MiB: about 10 ms with its page
/// faults, where recycling copied two pages).
pub const RECYCLE_DEPTH: usize = 3;

/// How many of its latest captures a tracker can bring a recycled buffer
/// forward from: any capture since it (re)started would do (the pages
/// changed after it are marked), this bounds the record.
const RECYCLABLE: usize = 64;

/// Upper bound of the postcard encoding of one page entry beyond its bytes.
const PAGE_OVERHEAD: usize = 16;

/// A process's whole state at the end of a superstep
/// (docs/fault-tolerance.md, "Checkpoint `K_s(P)`").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The process.
    pub pid: Pid,
    /// The superstep at whose end it was taken.
    pub superstep: u32,
    /// Linear memory (a multiple of [`PAGE_SIZE`]); empty when `exited`.
    pub memory: Vec<u8>,
    /// Values of all the module's mutable globals, in index order, as raw
    /// bits (see
    /// [`Process::checkpoint`](crate::runtime::Process::checkpoint)).
    pub globals: Vec<u64>,
    /// Sequence number of the process's next output record.
    pub output_seq: u64,
    /// Output bytes written so far.
    pub output_bytes: u64,
    /// The process returned from `main` in this superstep.
    pub exited: bool,
    /// The messages the process sent in the supersteps its host still
    /// retained, this one included, by superstep and send order (see
    /// [`Checkpoint::outbox`]).
    pub outbox: Vec<WireMessage>,
    /// BLAKE3 of the canonical encoding (see the module docs). Set by
    /// [`PageTracker::capture`], [`Snapshot::seal`] and [`Assembler`].
    pub hash: [u8; 32],
}

impl Snapshot {
    /// Number of pages of memory.
    pub fn page_count(&self) -> usize {
        self.memory.len().div_ceil(PAGE_SIZE)
    }

    /// The bytes of page `index` (empty if out of range).
    pub fn page(&self, index: usize) -> &[u8] {
        let start = (index.saturating_mul(PAGE_SIZE)).min(self.memory.len());
        let end = (start + PAGE_SIZE).min(self.memory.len());
        &self.memory[start..end]
    }

    /// Indices of the pages that are not all zeros: what a whole checkpoint
    /// carries.
    pub fn nonzero_pages(&self) -> Vec<u32> {
        self.memory
            .chunks(PAGE_SIZE)
            .enumerate()
            .filter(|(_, p)| !is_zero(p))
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// Bytes the snapshot occupies: memory plus outbox payloads (with a
    /// small per-message cost).
    pub fn size_bytes(&self) -> u64 {
        self.memory.len() as u64 + outbox_bytes(&self.outbox)
    }

    /// The content hash computed from scratch (BLAKE3 of every page).
    pub fn compute_hash(&self) -> [u8; 32] {
        let pages = self.memory.chunks(PAGE_SIZE).map(page_hash);
        canonical_hash(self, self.memory.len() as u64, pages)
    }

    /// Set [`Snapshot::hash`] to [`Snapshot::compute_hash`].
    pub fn seal(mut self) -> Self {
        self.hash = self.compute_hash();
        self
    }

    /// Whether [`Snapshot::hash`] matches the content.
    pub fn verify(&self) -> bool {
        self.compute_hash() == self.hash
    }

    /// Hex form of the hash, for logs and the determinism check.
    pub fn hash_hex(&self) -> String {
        hex::encode(self.hash)
    }
}

/// A page's (or a message payload's) hash in the content hash: XXH3-128.
/// The content hash finds corruption and protocol mistakes (a delta
/// applied to the wrong base), not adversaries: the peers of a job trust
/// each other, and a guest that crafted colliding pages would only spoil
/// the restore of its own job. XXH3 hashes a page about ten times faster
/// than BLAKE3, and every changed page is hashed by the owner and by each
/// replica at every checkpoint.
pub type PageHash = [u8; 16];

/// The [`PageHash`] of one page.
pub fn page_hash(page: &[u8]) -> PageHash {
    xxhash_rust::xxh3::xxh3_128(page).to_le_bytes()
}

fn zero_page_hash() -> PageHash {
    static H: OnceLock<PageHash> = OnceLock::new();
    *H.get_or_init(|| page_hash(&[0u8; PAGE_SIZE]))
}

/// `memory` grown with zeros (or cut) to `len` bytes. Growing past its
/// capacity moves it into a fresh [`zeroed_buffer`](crate::sysinfo::zeroed_buffer)
/// rather than `Vec::resize`'s reallocation and `memset`: a process whose
/// memory grew from a few pages to 64 MiB in one superstep (the inner
/// product's vectors) had its next capture, and each replica's copy of it,
/// spend 20–30 ms zeroing pages that are overwritten right after.
fn resized(mut memory: Vec<u8>, len: usize) -> Vec<u8> {
    if len <= memory.capacity() {
        memory.resize(len, 0);
        return memory;
    }
    let mut grown = crate::sysinfo::zeroed_buffer(len);
    grown[..memory.len()].copy_from_slice(&memory);
    grown
}

/// Whether every byte is zero: 256-byte blocks OR-folded (vectorized),
/// stopping at the first block that is not.
fn is_zero(bytes: &[u8]) -> bool {
    let mut blocks = bytes.chunks_exact(256);
    blocks.all(|b| b.iter().fold(0u8, |a, &x| a | x) == 0)
        && blocks.remainder().iter().all(|&b| b == 0)
}

/// Bytes an outbox occupies: a payload shared by consecutive messages (one
/// `send_range` or `send_list`) counts once.
pub fn outbox_bytes(outbox: &[WireMessage]) -> u64 {
    message_groups::runs(outbox)
        .map(|run| run[0].payload.len() as u64 + MESSAGE_COST * run.len() as u64)
        .sum()
}

/// The hashes of message payloads hashed before, by buffer. A retained
/// message is in every checkpoint until its superstep is no longer
/// retained (two or three in a row), and its payload is the same shared
/// buffer each time: it is hashed once. The cache holds the buffers it
/// names, so an address cannot be reused for other bytes while it is
/// cached; each hash keeps only the payloads it used.
#[derive(Debug, Default)]
pub struct PayloadHashes {
    known: HashMap<(usize, usize), (Bytes, PageHash)>,
}

impl PayloadHashes {
    /// The hash of `payload`, from `self` or computed, kept in `next`.
    fn hash(
        &self,
        next: &mut HashMap<(usize, usize), (Bytes, PageHash)>,
        payload: &Bytes,
    ) -> PageHash {
        let key = (payload.as_ptr() as usize, payload.len());
        if let Some((_, h)) = next.get(&key) {
            return *h;
        }
        let h = match self.known.get(&key) {
            Some((_, h)) => *h,
            None => page_hash(payload),
        };
        // Empty payloads may share an address; caching them saves nothing.
        if !payload.is_empty() {
            next.insert(key, (payload.clone(), h));
        }
        h
    }
}

/// The canonical hash of `s` with the given page hashes (in page order).
/// (`memory_len` is given, not read from `s`: a replica checks the hash
/// before it builds the memory.)
fn canonical_hash(
    s: &Snapshot,
    memory_len: u64,
    page_hashes: impl Iterator<Item = PageHash>,
) -> [u8; 32] {
    canonical_hash_cached(s, memory_len, page_hashes, &mut PayloadHashes::default())
}

/// [`canonical_hash`] that takes the payload hashes it can from `cache`
/// and leaves in it those of `s`'s outbox.
fn canonical_hash_cached(
    s: &Snapshot,
    memory_len: u64,
    page_hashes: impl Iterator<Item = PageHash>,
    cache: &mut PayloadHashes,
) -> [u8; 32] {
    let mut next = HashMap::new();
    let mut h = blake3::Hasher::new();
    h.update(HASH_TAG);
    h.update(&s.pid.to_le_bytes());
    h.update(&s.superstep.to_le_bytes());
    h.update(&[u8::from(s.exited)]);
    h.update(&s.output_seq.to_le_bytes());
    h.update(&s.output_bytes.to_le_bytes());
    h.update(&memory_len.to_le_bytes());
    for p in page_hashes {
        h.update(&p);
    }
    h.update(&(s.globals.len() as u64).to_le_bytes());
    for g in &s.globals {
        h.update(&g.to_le_bytes());
    }
    h.update(&(s.outbox.len() as u64).to_le_bytes());
    // Each message contributes the hash of its payload, computed once for a
    // payload that consecutive messages share (a broadcast's).
    for run in message_groups::runs(&s.outbox) {
        let payload = cache.hash(&mut next, &run[0].payload);
        for m in run {
            h.update(&m.src.to_le_bytes());
            h.update(&m.dst.to_le_bytes());
            h.update(&m.superstep.to_le_bytes());
            h.update(&m.seq.to_le_bytes());
            h.update(&m.tag.to_le_bytes());
            h.update(&(m.payload.len() as u64).to_le_bytes());
            h.update(&payload);
        }
    }
    cache.known = next;
    h.finalize().into()
}

// ---- owner side: change detection --------------------------------------------

/// What to send one replica: a delta against `base` or (`base == None`) the
/// whole snapshot, with the pages to include.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The superstep of the replica's snapshot the delta applies to.
    pub base: Option<u32>,
    /// Page indices to send, ascending.
    pub pages: Vec<u32>,
}

/// Change detection for one process on its host.
///
/// Keeps, per page, its [`PageHash`] (the content hash's, so a changed page
/// is hashed once) and the superstep of the last capture at which the page
/// changed. A capture costs one XXH3 pass over memory (at memory speed) and
/// a copy of the changed pages. A guest that crafted a colliding page to hide
/// a change would only spoil the restore of its own job, as for the content
/// hash. Pages
/// beyond the memory of a capture count as zeros, so growth needs no special
/// case.
///
/// It also remembers which snapshot each replica holds ([`PageTracker::acked`]),
/// so [`PageTracker::plan`] can send a replica just the pages changed since
/// *its* base: those whose last change is after the base.
#[derive(Debug)]
pub struct PageTracker {
    page_hashes: Vec<PageHash>,
    /// 0: never changed from zeros; `s + 1`: changed at the capture of `s`.
    changed: Vec<u64>,
    /// Pages of the last capture.
    len_pages: usize,
    /// Superstep of the first capture since the tracker (re)started: deltas
    /// need a base at or after it.
    origin: Option<u32>,
    /// Superstep and hash of the last capture.
    last: Option<(u32, [u8; 32])>,
    /// Superstep, hash and page count of the last few captures (newest
    /// last): their buffers can be recycled by [`PageTracker::capture_reusing`].
    recent: std::collections::VecDeque<(u32, [u8; 32], usize)>,
    replicas: HashMap<PeerId, u32>,
    /// The retained messages' payload hashes.
    payloads: PayloadHashes,
}

impl Default for PageTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl PageTracker {
    /// A tracker that has seen nothing: the first capture's plans are whole.
    pub fn new() -> Self {
        PageTracker {
            page_hashes: Vec::new(),
            changed: Vec::new(),
            len_pages: 0,
            origin: None,
            last: None,
            recent: std::collections::VecDeque::new(),
            replicas: HashMap::new(),
            payloads: PayloadHashes::default(),
        }
    }

    /// Capture `memory` into `snapshot` (whose other fields are set; its
    /// `memory` and `hash` are overwritten): copies memory (nothing when
    /// `exited`), updates the page state in the same pass and sets the hash.
    ///
    /// Captures must come with increasing supersteps; one at or before the
    /// previous capture starts the tracker over (every replica then gets a
    /// whole snapshot).
    pub fn capture(&mut self, snapshot: Snapshot, memory: &[u8]) -> Snapshot {
        self.capture_into(snapshot, memory, None)
    }

    /// [`PageTracker::capture`] that reuses the memory buffer of `previous`,
    /// one of the tracker's last 64 captures (as returned,
    /// unmodified), copying only the pages that changed since it: far
    /// cheaper than a fresh copy of a large memory. (Replication overlaps
    /// the next superstep, so the last capture is usually still in flight
    /// and the one before it is the buffer to recycle.) Any other
    /// `previous` is just dropped (a full copy is made).
    pub fn capture_reusing(
        &mut self,
        snapshot: Snapshot,
        memory: &[u8],
        previous: Snapshot,
    ) -> Snapshot {
        self.capture_into(snapshot, memory, Some(previous))
    }

    /// [`PageTracker::capture_reusing`] (or [`PageTracker::capture`] when
    /// `previous` is `None`) that reads only the pages that may have changed
    /// since the tracker's last capture: `may_have_changed[i]` for page `i`
    /// (pages it does not cover, and every page when the tracker starts
    /// over, are read). The caller vouches that a page it calls unchanged
    /// was not written since the last capture (the peer knows it from the
    /// kernel's write tracking; see `peer/src/dirty.rs`).
    pub fn capture_tracked(
        &mut self,
        snapshot: Snapshot,
        memory: &[u8],
        previous: Option<Snapshot>,
        may_have_changed: &[bool],
    ) -> Snapshot {
        self.capture_inner(snapshot, memory, previous, Some(may_have_changed))
    }

    /// The superstep and hash of the last capture, if any: a caller that
    /// tracks writes knows whether its record started at that capture.
    pub fn last_capture(&self) -> Option<(u32, [u8; 32])> {
        self.last
    }

    /// Whether page `i` changed at the last capture.
    pub fn changed_at_last_capture(&self, i: usize) -> bool {
        match (self.last, self.changed.get(i)) {
            (Some((s, _)), Some(&tag)) => tag == u64::from(s) + 1,
            _ => false,
        }
    }

    fn capture_into(
        &mut self,
        snapshot: Snapshot,
        memory: &[u8],
        previous: Option<Snapshot>,
    ) -> Snapshot {
        self.capture_inner(snapshot, memory, previous, None)
    }

    fn capture_inner(
        &mut self,
        mut snapshot: Snapshot,
        memory: &[u8],
        previous: Option<Snapshot>,
        may_have_changed: Option<&[bool]>,
    ) -> Snapshot {
        // A capture at or before the last starts over; after that no earlier
        // buffer may be recycled (the change marks it relies on are gone).
        if self.last.is_some_and(|(s, _)| snapshot.superstep <= s) {
            self.restart();
        }
        let reuse = previous.filter(|p| {
            self.recent.iter().any(|&(s, h, n)| {
                (s, h) == (p.superstep, p.hash) && p.memory.len() == n * PAGE_SIZE
            }) && snapshot.superstep > p.superstep
        });
        // Pages the last capture saw, whose hashes are current unless written.
        let known = if self.last.is_some() {
            self.len_pages
        } else {
            0
        };
        let skip =
            |i: usize| i < known && may_have_changed.is_some_and(|m| m.get(i) == Some(&false));
        let mem: &[u8] = if snapshot.exited { &[] } else { memory };
        let n = mem.len().div_ceil(PAGE_SIZE);
        let tag = u64::from(snapshot.superstep) + 1;
        if self.page_hashes.len() < n {
            self.page_hashes.resize(n, zero_page_hash());
            self.changed.resize(n, 0);
        }
        // With a reused buffer (an earlier capture `b`, pages beyond it
        // zeros), the pages unchanged since `b` are already in place.
        let (mut copy, since) = match reuse {
            Some(p) => {
                let m = resized(p.memory, mem.len());
                (m, Some(u64::from(p.superstep) + 1))
            }
            // A fresh buffer is zeros already: zero pages are not copied
            // (nor faulted in).
            None => (crate::sysinfo::zeroed_buffer(mem.len()), None),
        };
        for (i, page) in mem.chunks(PAGE_SIZE).enumerate() {
            let changed = !skip(i) && {
                let h = page_hash(page);
                let changed = h != self.page_hashes[i] || page.len() != PAGE_SIZE;
                if changed {
                    self.page_hashes[i] = h;
                }
                changed
            };
            if changed {
                self.changed[i] = tag;
            }
            match since {
                None => {
                    if !is_zero(page) {
                        let start = i * PAGE_SIZE;
                        copy[start..start + page.len()].copy_from_slice(page);
                    }
                }
                // Changed at a capture after `b` (this one included).
                Some(b) if self.changed[i] > b => {
                    let start = i * PAGE_SIZE;
                    copy[start..start + page.len()].copy_from_slice(page);
                }
                Some(_) => {}
            }
        }
        // Pages beyond this memory count as zeros.
        for i in n..self.page_hashes.len() {
            if self.page_hashes[i] != zero_page_hash() {
                self.page_hashes[i] = zero_page_hash();
                self.changed[i] = tag;
            }
        }
        self.len_pages = n;
        snapshot.memory = copy;
        snapshot.hash = canonical_hash_cached(
            &snapshot,
            snapshot.memory.len() as u64,
            self.page_hashes[..n].iter().copied(),
            &mut self.payloads,
        );
        self.origin.get_or_insert(snapshot.superstep);
        self.last = Some((snapshot.superstep, snapshot.hash));
        if self.recent.len() == RECYCLABLE {
            self.recent.pop_front();
        }
        self.recent
            .push_back((snapshot.superstep, snapshot.hash, n));
        snapshot
    }

    /// A tracker whose first capture is `snapshot` (a process restored from
    /// it): replicas known to hold exactly this snapshot (tell it with
    /// [`PageTracker::acked`]) can get deltas against it.
    pub fn seeded(snapshot: &Snapshot) -> Self {
        let mut t = PageTracker::new();
        let head = Snapshot {
            memory: Vec::new(),
            globals: snapshot.globals.clone(),
            outbox: snapshot.outbox.clone(),
            ..*snapshot
        };
        t.capture(head, &snapshot.memory);
        t
    }

    /// What to send `replica` for `snapshot`, the last capture: the pages
    /// changed since the replica's base, or the whole snapshot if it has no
    /// usable base (or `snapshot` is not the last capture).
    pub fn plan(&self, replica: PeerId, snapshot: &Snapshot) -> Plan {
        let is_last = self.last == Some((snapshot.superstep, snapshot.hash))
            && snapshot.page_count() == self.len_pages;
        let base =
            self.replicas.get(&replica).copied().filter(|&b| {
                is_last && self.origin.is_some_and(|o| o <= b) && b <= snapshot.superstep
            });
        match base {
            Some(b) => {
                let after = u64::from(b) + 1;
                let pages = (0..self.len_pages)
                    .filter(|&i| self.changed[i] > after)
                    .map(|i| i as u32)
                    .collect();
                Plan {
                    base: Some(b),
                    pages,
                }
            }
            None => Plan {
                base: None,
                pages: snapshot.nonzero_pages(),
            },
        }
    }

    /// Record `replica`'s [`Frame::CheckpointAck`] for `superstep`: with
    /// `ok` it now holds that snapshot as its base; without, it needs a whole
    /// snapshot next time.
    pub fn acked(&mut self, replica: PeerId, superstep: u32, ok: bool) {
        if !ok {
            self.replicas.remove(&replica);
            return;
        }
        let known = self
            .last
            .is_some_and(|(s, _)| self.origin.is_some_and(|o| o <= superstep) && superstep <= s);
        if known {
            let e = self.replicas.entry(replica).or_insert(superstep);
            *e = (*e).max(superstep);
        } else {
            self.replicas.remove(&replica);
        }
    }

    /// Record that the frames of the capture of `superstep` went to
    /// `replica` (in order after everything sent to it before): the next
    /// plan is a delta against it without waiting for its acknowledgement.
    /// A refusal ([`PageTracker::acked`] with `ok = false`) undoes this.
    pub fn sent(&mut self, replica: PeerId, superstep: u32) {
        self.acked(replica, superstep, true);
    }

    /// Forget `replica` (it left the job or is no longer a replica).
    pub fn forget(&mut self, replica: PeerId) {
        self.replicas.remove(&replica);
    }

    /// The superstep of the snapshot `replica` holds as base, if known.
    pub fn replica_base(&self, replica: PeerId) -> Option<u32> {
        self.replicas.get(&replica).copied()
    }

    fn restart(&mut self) {
        self.page_hashes.clear();
        self.changed.clear();
        self.len_pages = 0;
        self.origin = None;
        self.last = None;
        self.recent.clear();
        self.replicas.clear();
    }
}

// ---- wire form ------------------------------------------------------------------

/// The frames that carry `snapshot` to a replica: [`Frame::CheckpointPart`]s
/// then the final [`Frame::Checkpoint`], with the pages `pages` (ascending;
/// from [`PageTracker::plan`]) and `base` (`None`: whole). Each frame encodes
/// to at most [`FRAME_BOUND_BYTES`]. Page indices beyond the memory are
/// skipped.
pub fn to_frames(snapshot: &Snapshot, pages: &[u32], base: Option<u32>) -> Vec<Frame> {
    let (mut frames, last) = split(snapshot, pages, base, |i| {
        Bytes::copy_from_slice(snapshot.page(i))
    });
    frames.push(Frame::Checkpoint(Box::new(last)));
    frames
}

/// [`to_frames`] whose pages are slices of `snapshot`'s memory, not copies
/// (they keep the snapshot alive until the frames are written).
pub fn to_frames_shared(snapshot: &Arc<Snapshot>, pages: &[u32], base: Option<u32>) -> Vec<Frame> {
    let memory = Bytes::from_owner(SharedMemory(snapshot.clone()));
    let (mut frames, last) = split(snapshot, pages, base, |i| {
        let start = (i * PAGE_SIZE).min(memory.len());
        memory.slice(start..(start + PAGE_SIZE).min(memory.len()))
    });
    frames.push(Frame::Checkpoint(Box::new(last)));
    frames
}

/// A snapshot's memory as the owner of a [`Bytes`].
struct SharedMemory(Arc<Snapshot>);

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
        Bytes::copy_from_slice(snapshot.page(i))
    });
    frames.push(Frame::Snapshot {
        pid: snapshot.pid,
        snapshot: Some(Box::new(last)),
    });
    frames
}

/// The parts and the final checkpoint (with the tail of pages and messages).
fn split(
    snapshot: &Snapshot,
    pages: &[u32],
    base: Option<u32>,
    page: impl Fn(usize) -> Bytes,
) -> (Vec<Frame>, Checkpoint) {
    let mut frames = Vec::new();
    let mut cur_pages: Vec<(u32, Bytes)> = Vec::new();
    let mut cur_outbox: Vec<WireMessage> = Vec::new();
    let mut cur = 0usize;
    let (pid, superstep) = (snapshot.pid, snapshot.superstep);
    let mut flush = |p: &mut Vec<(u32, Bytes)>, o: &mut Vec<WireMessage>| {
        frames.push(Frame::CheckpointPart {
            pid,
            superstep,
            pages: std::mem::take(p),
            outbox: std::mem::take(o),
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
        let bytes = page(i as usize);
        let cost = bytes.len() + PAGE_OVERHEAD;
        if cur > 0 && cur + cost > PART_TARGET_BYTES {
            flush(&mut cur_pages, &mut cur_outbox);
            cur = 0;
        }
        cur_pages.push((i, bytes));
        cur += cost;
    }
    // A delta carries the messages sent after its base; the replica has
    // the older ones still retained (from `outbox_from` on).
    let (outbox_from, outbox) = match base {
        Some(b) => {
            let new = snapshot.outbox.partition_point(|m| m.superstep <= b);
            let from = snapshot
                .outbox
                .first()
                .map_or(b + 1, |m| m.superstep.min(b + 1));
            (from, &snapshot.outbox[new..])
        }
        None => (0, &snapshot.outbox[..]),
    };
    for m in outbox {
        // A payload the previous message of this part shares costs nothing more.
        let shared = cur_outbox
            .last()
            .is_some_and(|p: &WireMessage| message_groups::same_buffer(&p.payload, &m.payload));
        let cost = if shared { 32 } else { m.payload.len() + 32 };
        if cur > 0 && cur + cost > PART_TARGET_BYTES {
            flush(&mut cur_pages, &mut cur_outbox);
            cur = 0;
        }
        cur_outbox.push(m.clone());
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
        hash: snapshot.hash,
    };
    (frames, last)
}

// ---- replica side -----------------------------------------------------------------

/// Why a received checkpoint was refused. Every variant names the process
/// and superstep, so the receiver can answer `CheckpointAck { ok: false }`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "checkpoint of pid {pid} at superstep {superstep}: memory of {memory_len} bytes is not a multiple of the 64 KiB wasm page"
    )]
    MemoryLen {
        pid: Pid,
        superstep: u32,
        memory_len: u64,
    },
    #[error(
        "checkpoint of pid {pid} at superstep {superstep}: {bytes} bytes exceed this peer's limit of {cap} bytes per checkpoint"
    )]
    TooLarge {
        pid: Pid,
        superstep: u32,
        bytes: u64,
        cap: u64,
    },
    #[error(
        "checkpoint of pid {pid} at superstep {superstep}: page {index} is outside its memory of {pages} pages"
    )]
    PageIndex {
        pid: Pid,
        superstep: u32,
        index: u32,
        pages: u64,
    },
    #[error(
        "checkpoint of pid {pid} at superstep {superstep}: page {index} has {len} bytes, not 65536"
    )]
    PageSize {
        pid: Pid,
        superstep: u32,
        index: u32,
        len: usize,
    },
    #[error(
        "checkpoint of pid {pid} at superstep {superstep}: page {index} comes after page {previous}; pages must be sent in ascending order, each once"
    )]
    PageOrder {
        pid: Pid,
        superstep: u32,
        index: u32,
        previous: u32,
    },
    #[error(
        "checkpoint of pid {pid} at superstep {superstep} was abandoned: a part of the checkpoint of superstep {next} arrived before its end"
    )]
    Interleaved { pid: Pid, superstep: u32, next: u32 },
    #[error(
        "checkpoint of pid {pid} at superstep {superstep} is a delta against superstep {base}, but this peer holds {held}; send it whole"
    )]
    MissingBase {
        pid: Pid,
        superstep: u32,
        base: u32,
        held: String,
    },
    #[error(
        "checkpoint of pid {pid} at superstep {superstep} does not match its hash: the rebuilt state hashes to {actual}, the sender said {expected}"
    )]
    HashMismatch {
        pid: Pid,
        superstep: u32,
        expected: String,
        actual: String,
    },
    #[error(
        "snapshot answer for pid {pid} carries the checkpoint of pid {inner}; the sender is confused"
    )]
    WrongPid { pid: Pid, inner: Pid },
    #[error("not a checkpoint frame: {0}")]
    NotCheckpoint(&'static str),
}

impl CheckpointError {
    /// The process and superstep of the refused checkpoint, if the error
    /// is about one.
    pub fn subject(&self) -> Option<(Pid, u32)> {
        use CheckpointError::*;
        match *self {
            MemoryLen { pid, superstep, .. }
            | TooLarge { pid, superstep, .. }
            | PageIndex { pid, superstep, .. }
            | PageSize { pid, superstep, .. }
            | PageOrder { pid, superstep, .. }
            | Interleaved { pid, superstep, .. }
            | MissingBase { pid, superstep, .. }
            | HashMismatch { pid, superstep, .. } => Some((pid, superstep)),
            WrongPid { .. } | NotCheckpoint(_) => None,
        }
    }
}

/// A checkpoint frame sequence completed by [`Assembler::push`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assembled {
    /// A verified [`Frame::Checkpoint`] (store it, answer `ok = true`).
    Checkpoint(Snapshot),
    /// A [`Frame::Snapshot`] answer: the verified snapshot, or `None` if the
    /// sender holds none of `pid`.
    Fetched {
        /// The process asked about.
        pid: Pid,
        /// Its snapshot.
        snapshot: Option<Snapshot>,
    },
}

#[derive(Debug)]
struct Pending {
    superstep: u32,
    pages: Vec<(u32, Bytes)>,
    outbox: Vec<WireMessage>,
    bytes: u64,
}

/// Rebuilds checkpoints from the frames of one connection: collects
/// [`Frame::CheckpointPart`]s per pid and, on the final frame, applies the
/// pages to the base (for a delta) or to zeros, and verifies the hash.
/// Hostile input gives errors, never panics, and never more than the cap
/// of bytes per checkpoint.
#[derive(Debug)]
pub struct Assembler {
    cap: u64,
    pending: HashMap<Pid, Pending>,
    /// Per pid, the hash and page hashes of the last snapshot assembled
    /// here: a delta against it rehashes only the pages it carries.
    page_hashes: HashMap<Pid, ([u8; 32], Vec<PageHash>)>,
    /// Per pid, the payload hashes of the last snapshot assembled here (a
    /// delta repeats the base's retained messages as the same buffers).
    payloads: HashMap<Pid, PayloadHashes>,
}

impl Assembler {
    /// An assembler that accepts checkpoints of at most `max_bytes` (memory
    /// plus outbox; use the job's memory limit plus its outbox limit).
    pub fn new(max_bytes: u64) -> Self {
        Assembler {
            cap: max_bytes,
            pending: HashMap::new(),
            page_hashes: HashMap::new(),
            payloads: HashMap::new(),
        }
    }

    /// Bytes of parts held for unfinished checkpoints.
    pub fn pending_bytes(&self) -> u64 {
        self.pending.values().map(|p| p.bytes).sum()
    }

    /// Drop the unfinished checkpoint of `pid`, if any.
    pub fn discard(&mut self, pid: Pid) {
        self.pending.remove(&pid);
    }

    /// Take one [`Frame::CheckpointPart`]. A part for another superstep of
    /// the same pid abandons the unfinished one (reported as
    /// [`CheckpointError::Interleaved`]) and starts the new one.
    pub fn part(
        &mut self,
        pid: Pid,
        superstep: u32,
        pages: Vec<(u32, Bytes)>,
        outbox: Vec<WireMessage>,
    ) -> Result<(), CheckpointError> {
        let mut result = Ok(());
        if let Some(p) = self.pending.get(&pid)
            && p.superstep != superstep
        {
            result = Err(CheckpointError::Interleaved {
                pid,
                superstep: p.superstep,
                next: superstep,
            });
            self.pending.remove(&pid);
        }
        let p = self.pending.entry(pid).or_insert_with(|| Pending {
            superstep,
            pages: Vec::new(),
            outbox: Vec::new(),
            bytes: 0,
        });
        let add = pages
            .iter()
            .map(|(_, b)| b.len() as u64)
            .sum::<u64>()
            .saturating_add(outbox_bytes(&outbox));
        let bytes = p.bytes.saturating_add(add);
        if bytes > self.cap {
            self.pending.remove(&pid);
            return Err(CheckpointError::TooLarge {
                pid,
                superstep,
                bytes,
                cap: self.cap,
            });
        }
        p.bytes = bytes;
        p.pages.extend(pages);
        p.outbox.extend(outbox);
        result
    }

    /// Take the final frame of a checkpoint: with the preceding parts,
    /// rebuild the snapshot on `base` (required when `checkpoint.base` is
    /// set: the snapshot of that superstep of the same pid) and verify it.
    pub fn finish(
        &mut self,
        checkpoint: Checkpoint,
        base: Option<&Snapshot>,
    ) -> Result<Snapshot, CheckpointError> {
        self.finish_inner(checkpoint, base.map(BaseSnap::Borrowed))
            .map_err(|(e, _)| e)
    }

    /// [`Assembler::finish`] on a base it may consume: a delta is applied to
    /// the base's memory in place (saving the pages it replaces) instead of
    /// to a copy, which for a large process is most of a replica's work. On
    /// error the base comes back unchanged.
    fn finish_owned(
        &mut self,
        checkpoint: Checkpoint,
        base: Option<Snapshot>,
    ) -> Result<Snapshot, (CheckpointError, Option<Box<Snapshot>>)> {
        self.finish_inner(checkpoint, base.map(BaseSnap::Owned))
    }

    fn finish_inner(
        &mut self,
        checkpoint: Checkpoint,
        base: Option<BaseSnap<'_>>,
    ) -> Result<Snapshot, (CheckpointError, Option<Box<Snapshot>>)> {
        // An error hands an owned base back untouched.
        macro_rules! fail {
            ($e:expr) => {
                return Err(($e, base.and_then(BaseSnap::into_owned)))
            };
        }
        let Checkpoint {
            pid,
            superstep,
            base: base_step,
            memory_len,
            pages,
            globals,
            output_seq,
            output_bytes,
            exited,
            outbox,
            outbox_from,
            hash,
        } = checkpoint;
        let pending = self.pending.remove(&pid);
        let (mut all_pages, mut all_outbox, held) = match pending {
            Some(p) if p.superstep != superstep => {
                fail!(CheckpointError::Interleaved {
                    pid,
                    superstep: p.superstep,
                    next: superstep,
                });
            }
            Some(p) => (p.pages, p.outbox, p.bytes),
            None => (Vec::new(), Vec::new(), 0),
        };
        all_pages.extend(pages);
        all_outbox.extend(outbox);
        if !memory_len.is_multiple_of(PAGE_SIZE as u64) {
            fail!(CheckpointError::MemoryLen {
                pid,
                superstep,
                memory_len,
            });
        }
        let total = memory_len
            .saturating_add(outbox_bytes(&all_outbox))
            .max(held);
        if total > self.cap || usize::try_from(memory_len).is_err() {
            fail!(CheckpointError::TooLarge {
                pid,
                superstep,
                bytes: total,
                cap: self.cap,
            });
        }
        let npages = memory_len / PAGE_SIZE as u64;
        let mut previous: Option<u32> = None;
        for (index, bytes) in &all_pages {
            if u64::from(*index) >= npages {
                fail!(CheckpointError::PageIndex {
                    pid,
                    superstep,
                    index: *index,
                    pages: npages,
                });
            }
            if bytes.len() != PAGE_SIZE {
                fail!(CheckpointError::PageSize {
                    pid,
                    superstep,
                    index: *index,
                    len: bytes.len(),
                });
            }
            if let Some(prev) = previous
                && *index <= prev
            {
                fail!(CheckpointError::PageOrder {
                    pid,
                    superstep,
                    index: *index,
                    previous: prev,
                });
            }
            previous = Some(*index);
        }
        // Whether the base is the one the delta needs (a whole snapshot needs none).
        if let Some(b) = base_step {
            let held = base.as_ref().map(BaseSnap::get);
            if !held.is_some_and(|s| s.pid == pid && s.superstep == b) {
                let held = match held {
                    Some(s) if s.pid == pid => format!("superstep {}", s.superstep),
                    _ => "no snapshot of it".to_string(),
                };
                fail!(CheckpointError::MissingBase {
                    pid,
                    superstep,
                    base: b,
                    held,
                });
            }
        }
        // A delta's outbox: the base's messages still retained, then the new ones.
        if let (Some(b), Some(held)) = (base_step, base.as_ref().map(BaseSnap::get)) {
            let mut outbox: Vec<WireMessage> = held
                .outbox
                .iter()
                .filter(|m| (outbox_from..=b).contains(&m.superstep))
                .cloned()
                .collect();
            outbox.append(&mut all_outbox);
            all_outbox = outbox;
            let total = memory_len.saturating_add(outbox_bytes(&all_outbox));
            if total > self.cap {
                fail!(CheckpointError::TooLarge {
                    pid,
                    superstep,
                    bytes: total,
                    cap: self.cap,
                });
            }
        }
        let (base, unused) = match base_step {
            Some(_) => (base, None),
            None => (None, base),
        };
        // Page hashes: those of the base (cached if it was assembled here) or
        // of zeros, replaced by those of the pages received. The result is
        // checked against the hash before the base is touched.
        let npages = npages as usize;
        let len = memory_len as usize;
        let mut hashes: Vec<PageHash> = vec![zero_page_hash(); npages];
        if let Some(b) = base.as_ref().map(BaseSnap::get) {
            let known = self
                .page_hashes
                .get(&pid)
                .filter(|(h, v)| *h == b.hash && v.len() == b.page_count());
            for (i, page) in b.memory.chunks(PAGE_SIZE).enumerate().take(npages) {
                hashes[i] = match known {
                    Some((_, v)) if page.len() == PAGE_SIZE => v[i],
                    // A partial last page of the base is padded with zeros.
                    _ if page.len() < PAGE_SIZE => {
                        let mut padded = vec![0; PAGE_SIZE];
                        padded[..page.len()].copy_from_slice(page);
                        page_hash(&padded)
                    }
                    _ => page_hash(page),
                };
            }
        }
        for (index, bytes) in &all_pages {
            hashes[*index as usize] = page_hash(bytes);
        }
        let mut snapshot = Snapshot {
            pid,
            superstep,
            memory: Vec::new(),
            globals,
            output_seq,
            output_bytes,
            exited,
            outbox: all_outbox,
            hash,
        };
        let actual = canonical_hash_cached(
            &snapshot,
            memory_len,
            hashes.iter().copied(),
            self.payloads.entry(pid).or_default(),
        );
        if actual != hash {
            let error = CheckpointError::HashMismatch {
                pid,
                superstep,
                expected: hex::encode(hash),
                actual: hex::encode(actual),
            };
            return Err((error, base.or(unused).and_then(BaseSnap::into_owned)));
        }
        // The memory: the base's own buffer when we may consume it, else a copy.
        let memory = match base {
            Some(BaseSnap::Owned(mut b)) => std::mem::take(&mut b.memory),
            Some(b) => b.get().memory.clone(),
            None => crate::sysinfo::zeroed_buffer(len),
        };
        let mut memory = resized(memory, len);
        for (index, bytes) in &all_pages {
            let i = *index as usize;
            memory[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].copy_from_slice(bytes);
        }
        snapshot.memory = memory;
        self.page_hashes.insert(pid, (hash, hashes));
        Ok(snapshot)
    }

    /// Take any checkpoint frame: parts give `Ok(None)`; a final
    /// [`Frame::Checkpoint`] (a delta takes its base out of `store` and
    /// patches it in place — store the result; on error the base is put
    /// back) or
    /// [`Frame::Snapshot`] gives the verified result. Other frames are an
    /// error.
    pub fn push(
        &mut self,
        frame: Frame,
        store: &mut ReplicaStore,
    ) -> Result<Option<Assembled>, CheckpointError> {
        match frame {
            Frame::CheckpointPart {
                pid,
                superstep,
                pages,
                outbox,
            } => self.part(pid, superstep, pages, outbox).map(|()| None),
            Frame::Checkpoint(c) => {
                // The base is consumed (patched in place); the caller stores
                // the result, which replaces it anyway. On error it goes back.
                let base = match c.base {
                    Some(b) if store.get(c.pid, b).is_some() => store.remove_pid(c.pid),
                    _ => None,
                };
                match self.finish_owned(*c, base) {
                    Ok(s) => Ok(Some(Assembled::Checkpoint(s))),
                    Err((e, back)) => {
                        if let Some(b) = back {
                            store.insert(*b);
                        }
                        Err(e)
                    }
                }
            }
            Frame::Snapshot {
                pid,
                snapshot: None,
            } => {
                self.pending.remove(&pid);
                Ok(Some(Assembled::Fetched {
                    pid,
                    snapshot: None,
                }))
            }
            Frame::Snapshot {
                pid,
                snapshot: Some(c),
            } => {
                if c.pid != pid {
                    self.pending.remove(&c.pid);
                    return Err(CheckpointError::WrongPid { pid, inner: c.pid });
                }
                let base = c.base.and_then(|b| store.get(c.pid, b));
                let s = self.finish(*c, base)?;
                Ok(Some(Assembled::Fetched {
                    pid,
                    snapshot: Some(s),
                }))
            }
            Frame::Hello { .. } => Err(CheckpointError::NotCheckpoint("Hello")),
            Frame::Answer { .. } => Err(CheckpointError::NotCheckpoint("Answer")),
            Frame::Welcome => Err(CheckpointError::NotCheckpoint("Welcome")),
            Frame::Reject { .. } => Err(CheckpointError::NotCheckpoint("Reject")),
            Frame::Data { .. } => Err(CheckpointError::NotCheckpoint("Data")),
            Frame::Done { .. } => Err(CheckpointError::NotCheckpoint("Done")),
            Frame::CheckpointAck { .. } => Err(CheckpointError::NotCheckpoint("CheckpointAck")),
            Frame::FetchCheckpoint { .. } => Err(CheckpointError::NotCheckpoint("FetchCheckpoint")),
            Frame::Relay { .. } => Err(CheckpointError::NotCheckpoint("Relay")),
            Frame::Program { .. } => Err(CheckpointError::NotCheckpoint("Program")),
            Frame::Probe(_) => Err(CheckpointError::NotCheckpoint("Probe")),
        }
    }
}

/// The base a delta is applied to: borrowed (copied) or owned (patched in
/// place).
enum BaseSnap<'a> {
    Borrowed(&'a Snapshot),
    Owned(Snapshot),
}

impl BaseSnap<'_> {
    fn get(&self) -> &Snapshot {
        match self {
            BaseSnap::Borrowed(s) => s,
            BaseSnap::Owned(s) => s,
        }
    }

    fn into_owned(self) -> Option<Box<Snapshot>> {
        match self {
            BaseSnap::Borrowed(_) => None,
            BaseSnap::Owned(s) => Some(Box::new(s)),
        }
    }
}

/// A replica's snapshots: the newest verified one per process.
#[derive(Debug, Default)]
pub struct ReplicaStore {
    snapshots: HashMap<Pid, Snapshot>,
    bytes: u64,
}

impl ReplicaStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep `snapshot` (verified, e.g. from [`Assembler`]) if it is newer
    /// than the one held for its pid (or the same superstep: replaces it).
    /// Returns whether it was kept.
    pub fn insert(&mut self, snapshot: Snapshot) -> bool {
        if let Some(old) = self.snapshots.get(&snapshot.pid) {
            if old.superstep > snapshot.superstep {
                return false;
            }
            self.bytes -= old.size_bytes();
        }
        self.bytes += snapshot.size_bytes();
        self.snapshots.insert(snapshot.pid, snapshot);
        true
    }

    /// The snapshot of `pid` at `superstep`, if that is the one held.
    pub fn get(&self, pid: Pid, superstep: u32) -> Option<&Snapshot> {
        self.snapshots
            .get(&pid)
            .filter(|s| s.superstep == superstep)
    }

    /// The newest snapshot held of `pid`.
    pub fn newest(&self, pid: Pid) -> Option<&Snapshot> {
        self.snapshots.get(&pid)
    }

    /// Drop the snapshot of `pid`.
    pub fn remove_pid(&mut self, pid: Pid) -> Option<Snapshot> {
        let s = self.snapshots.remove(&pid)?;
        self.bytes -= s.size_bytes();
        Some(s)
    }

    /// Pids with a snapshot, ascending.
    pub fn pids(&self) -> Vec<Pid> {
        let mut v: Vec<Pid> = self.snapshots.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Bytes held ([`Snapshot::size_bytes`] summed).
    pub fn total_bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests;
