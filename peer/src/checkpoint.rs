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
//! "bspweb-checkpoint-v6\n"
//! pid: u32, superstep: u32, exited: u8 (0 or 1),
//! output_seq: u64, output_bytes: u64, memory_len: u64,
//! the hash of each 64 KiB page of memory, in page order (16 bytes each):
//!   XXH3-128 of the XXH3-128s of its 4 KiB leaves, in order,
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
//! page and rehash only the pages that changed since its last capture. A
//! page's hash is itself one over its sixteen 4 KiB leaves (v6; v5 hashed
//! the page's bytes): the owner learns which leaves of a changed page
//! changed, so it copies and diffs only those, and a replica that patches
//! a page rehashes only the leaves the patch touched. A superstep that
//! changes a few words of a page (its stack, a counter) made each replica
//! rehash the whole 64 KiB page.

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
const HASH_TAG: &[u8] = b"bspweb-checkpoint-v6\n";

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
    /// The header of `pid`'s snapshot at the end of `superstep`, before its
    /// memory is captured ([`PageTracker::capture`]): no globals, output,
    /// outbox or hash yet.
    pub fn head(pid: Pid, superstep: u32) -> Snapshot {
        Snapshot {
            pid,
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

    /// The digest of the process's state and of what it sent since the
    /// previous checkpoint (with a checkpoint every `every` supersteps: in
    /// supersteps `superstep − every + 1 ..= superstep`): the BLAKE3 hash
    /// of the canonical encoding up to the outbox, then of the outbox's
    /// messages of those supersteps only (in the same encoding, without
    /// the count). The whole outbox depends on how long its host retained
    /// messages, this does not: copies of a process on different peers
    /// (redundancy) compare it, and a replica holds a checkpoint only once
    /// they agreed, so a restore re-sends only messages the copies agreed
    /// on (the older ones it carries were covered by earlier checkpoints'
    /// digests).
    /// [`PageTracker::capture`] gives it without rehashing
    /// ([`PageTracker::last_state_digest`]).
    pub fn state_digest(&self, every: u32) -> [u8; 32] {
        let mut state = [0; 32];
        let from = digest_from(self.superstep, every);
        let pages = self.memory.chunks(PAGE_SIZE).map(page_hash);
        canonical_hash_cached(
            self,
            self.memory.len() as u64,
            pages,
            &mut PayloadHashes::default(),
            Some((&mut state, from)),
        );
        state
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

/// A page's (or a message payload's) hash in the content hash: 128 bits of
/// XXH3. The content hash finds corruption and protocol mistakes (a delta
/// applied to the wrong base), not adversaries: the peers of a job trust
/// each other, and a guest that crafted colliding pages would only spoil
/// the restore of its own job. XXH3 hashes a page about ten times faster
/// than BLAKE3, and every changed page is hashed by the owner and by each
/// replica at every checkpoint. `twox-hash` picks its AVX2 code at run time
/// where the CPU has it (1.45 µs per page here, against 2.8 µs for the SSE2
/// code a crate chooses at compile time for baseline x86-64); the result is
/// the same on every CPU (the XXH3 specification's).
pub type PageHash = [u8; 16];

/// Bytes of a leaf, the unit of a page's hash ([`page_hash`]).
pub const LEAF_SIZE: usize = 4 << 10;

/// Leaves per page.
pub const LEAVES: usize = PAGE_SIZE / LEAF_SIZE;

/// The hashes of a whole page's leaves, in order.
pub type LeafHashes = [PageHash; LEAVES];

/// XXH3-128 of `bytes`: a leaf's hash, and a message payload's.
pub fn xxh3(bytes: &[u8]) -> PageHash {
    twox_hash::XxHash3_128::oneshot(bytes).to_le_bytes()
}

/// The [`PageHash`] of one page (at most [`PAGE_SIZE`] bytes): XXH3-128 of
/// the XXH3-128s of its [`LEAF_SIZE`] leaves in order (the last one
/// shorter if the page is).
pub fn page_hash(page: &[u8]) -> PageHash {
    let mut leaves = [[0u8; 16]; LEAVES];
    let n = page.len().div_ceil(LEAF_SIZE).min(LEAVES);
    for (h, leaf) in leaves.iter_mut().zip(page.chunks(LEAF_SIZE)) {
        *h = xxh3(leaf);
    }
    combine(&leaves[..n])
}

/// The hashes of a whole page's leaves.
pub fn leaf_hashes(page: &[u8; PAGE_SIZE]) -> LeafHashes {
    std::array::from_fn(|j| xxh3(&page[j * LEAF_SIZE..(j + 1) * LEAF_SIZE]))
}

/// A page's hash from its leaves' ([`page_hash`]).
pub fn combine(leaves: &[PageHash]) -> PageHash {
    xxh3(leaves.as_flattened())
}

fn zero_page_hash() -> PageHash {
    static H: OnceLock<PageHash> = OnceLock::new();
    *H.get_or_init(|| page_hash(&[0u8; PAGE_SIZE]))
}

/// The hash of a leaf of zeros.
fn zero_leaf_hash() -> PageHash {
    static H: OnceLock<PageHash> = OnceLock::new();
    *H.get_or_init(|| xxh3(&[0u8; LEAF_SIZE]))
}

/// The leaf hashes of a page of zeros.
fn zero_leaves() -> LeafHashes {
    [zero_leaf_hash(); LEAVES]
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
            None => xxh3(payload),
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
    canonical_hash_cached(
        s,
        memory_len,
        page_hashes,
        &mut PayloadHashes::default(),
        None,
    )
}

/// [`canonical_hash`] that takes the payload hashes it can from `cache`
/// and leaves in it those of `s`'s outbox.
/// The first superstep whose messages [`Snapshot::state_digest`] of
/// `superstep` covers, with a checkpoint every `every` supersteps.
pub(crate) fn digest_from(superstep: u32, every: u32) -> u32 {
    superstep.saturating_sub(every.max(1) - 1)
}

/// When `state` is given (with the first superstep whose messages it
/// covers), it gets [`Snapshot::state_digest`].
fn canonical_hash_cached(
    s: &Snapshot,
    memory_len: u64,
    page_hashes: impl Iterator<Item = PageHash>,
    cache: &mut PayloadHashes,
    state: Option<(&mut [u8; 32], u32)>,
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
    // The state digest: the same up to here, then the messages of this
    // superstep alone (older ones are in the outbox only while the host
    // retains them).
    let from = state.as_ref().map_or(0, |(_, f)| *f);
    let mut digest = state.is_some().then(|| h.clone());
    h.update(&(s.outbox.len() as u64).to_le_bytes());
    // Each message contributes the hash of its payload, computed once for a
    // payload that consecutive messages share (a broadcast's).
    for run in message_groups::runs(&s.outbox) {
        let payload = cache.hash(&mut next, &run[0].payload);
        for m in run {
            let mut fields = [0u8; 28];
            fields[0..4].copy_from_slice(&m.src.to_le_bytes());
            fields[4..8].copy_from_slice(&m.dst.to_le_bytes());
            fields[8..12].copy_from_slice(&m.superstep.to_le_bytes());
            fields[12..16].copy_from_slice(&m.seq.to_le_bytes());
            fields[16..20].copy_from_slice(&m.tag.to_le_bytes());
            fields[20..28].copy_from_slice(&(m.payload.len() as u64).to_le_bytes());
            h.update(&fields);
            h.update(&payload);
            if let Some(d) = digest
                .as_mut()
                .filter(|_| (from..=s.superstep).contains(&m.superstep))
            {
                d.update(&fields);
                d.update(&payload);
            }
        }
    }
    cache.known = next;
    if let (Some((state, _)), Some(d)) = (state, digest) {
        *state = d.finalize().into();
    }
    h.finalize().into()
}

mod assembler;
mod frames;
pub mod patch;
mod store;
mod tracker;

pub use assembler::*;
pub use frames::*;
pub use store::*;
pub use tracker::*;

#[cfg(test)]
mod tests;
