//! The replica's side: reassembly of a checkpoint's frames and its check
//! against the content hash ([`Assembler`]), and why one is refused
//! ([`CheckpointError`]).

use super::*;

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
        "checkpoint of pid {pid} at superstep {superstep}: the patch of page {index} is malformed: {why}"
    )]
    BadPatch {
        pid: Pid,
        superstep: u32,
        index: u32,
        why: patch::PatchError,
    },
    #[error(
        "checkpoint of pid {pid} at superstep {superstep}: the payload of outbox message {index} is a bad patch: {why}"
    )]
    MessagePatch {
        pid: Pid,
        superstep: u32,
        index: u32,
        why: patch::PatchError,
    },
    #[error(
        "checkpoint of pid {pid} at superstep {superstep} names outbox message {index} as patched, but its frame has no such message (indices ascend within a frame)"
    )]
    PatchedIndex {
        pid: Pid,
        superstep: u32,
        index: u32,
    },
    #[error(
        "checkpoint of pid {pid} at superstep {superstep} patches page {index} but is not a delta; a whole checkpoint carries whole pages"
    )]
    PatchWithoutBase {
        pid: Pid,
        superstep: u32,
        index: u32,
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
            | BadPatch { pid, superstep, .. }
            | MessagePatch { pid, superstep, .. }
            | PatchedIndex { pid, superstep, .. }
            | PatchWithoutBase { pid, superstep, .. }
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
pub(super) struct Pending {
    superstep: u32,
    pages: Vec<(u32, Bytes)>,
    outbox: Vec<WireMessage>,
    /// Indices into `outbox` of the messages whose payload is a patch.
    patched: Vec<usize>,
    bytes: u64,
}

/// `patched` (indices into a frame's `outbox` of `len` messages) checked:
/// ascending and in range.
fn patched_indices(
    pid: Pid,
    superstep: u32,
    patched: &[u32],
    len: usize,
) -> Result<(), CheckpointError> {
    let mut next = 0usize;
    for &i in patched {
        if (i as usize) < next || i as usize >= len {
            return Err(CheckpointError::PatchedIndex {
                pid,
                superstep,
                index: i,
            });
        }
        next = i as usize + 1;
    }
    Ok(())
}

/// The hashes of a snapshot's memory, kept for a delta against it.
#[derive(Debug)]
struct KnownHashes {
    /// The snapshot's content hash.
    hash: [u8; 32],
    /// Per page, its hash.
    pages: Vec<PageHash>,
    /// Per page, its leaves' hashes.
    leaves: Vec<LeafHashes>,
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
    /// Per pid, the hash, page hashes and leaf hashes of the last snapshot
    /// assembled here: a delta against it rehashes only the pages it
    /// carries, and of a patched page only the leaves the patch touches.
    page_hashes: HashMap<Pid, KnownHashes>,
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
        patched: Vec<u32>,
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
        if let Err(e) = patched_indices(pid, superstep, &patched, outbox.len()) {
            self.pending.remove(&pid);
            return Err(e);
        }
        let p = self.pending.entry(pid).or_insert_with(|| Pending {
            superstep,
            pages: Vec::new(),
            outbox: Vec::new(),
            patched: Vec::new(),
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
        let offset = p.outbox.len();
        p.patched
            .extend(patched.iter().map(|&i| offset + i as usize));
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
            patched,
            hash,
        } = checkpoint;
        let pending = self.pending.remove(&pid);
        let (mut all_pages, mut all_outbox, mut all_patched, held) = match pending {
            Some(p) if p.superstep != superstep => {
                fail!(CheckpointError::Interleaved {
                    pid,
                    superstep: p.superstep,
                    next: superstep,
                });
            }
            Some(p) => (p.pages, p.outbox, p.patched, p.bytes),
            None => (Vec::new(), Vec::new(), Vec::new(), 0),
        };
        if let Err(e) = patched_indices(pid, superstep, &patched, outbox.len()) {
            fail!(e);
        }
        all_pages.extend(pages);
        let offset = all_outbox.len();
        all_patched.extend(patched.iter().map(|&i| offset + i as usize));
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
        for (entry, bytes) in &all_pages {
            let (index, patched) = (entry & !patch::PAGE_PATCH, entry & patch::PAGE_PATCH != 0);
            if u64::from(index) >= npages {
                fail!(CheckpointError::PageIndex {
                    pid,
                    superstep,
                    index,
                    pages: npages,
                });
            }
            if patched && base_step.is_none() {
                fail!(CheckpointError::PatchWithoutBase {
                    pid,
                    superstep,
                    index,
                });
            }
            if patched && let Err(why) = patch::check(bytes) {
                fail!(CheckpointError::BadPatch {
                    pid,
                    superstep,
                    index,
                    why,
                });
            }
            if !patched && bytes.len() != PAGE_SIZE {
                fail!(CheckpointError::PageSize {
                    pid,
                    superstep,
                    index,
                    len: bytes.len(),
                });
            }
            if let Some(prev) = previous
                && index <= prev
            {
                fail!(CheckpointError::PageOrder {
                    pid,
                    superstep,
                    index,
                    previous: prev,
                });
            }
            previous = Some(index);
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
        if base_step.is_none()
            && let Some(&i) = all_patched.first()
        {
            fail!(CheckpointError::MessagePatch {
                pid,
                superstep,
                index: i as u32,
                why: patch::PatchError::NoReference,
            });
        }
        // A delta's outbox: the base's messages still retained, then the new
        // ones, a patched payload rebuilt from its reference among the former.
        if let (Some(b), Some(held)) = (base_step, base.as_ref().map(BaseSnap::get)) {
            let mut outbox: Vec<WireMessage> = held
                .outbox
                .iter()
                .filter(|m| (outbox_from..=b).contains(&m.superstep))
                .cloned()
                .collect();
            let references = super::frames::references(&outbox);
            for &i in &all_patched {
                let m = &mut all_outbox[i];
                let rebuilt = match references.get(&(m.dst, m.seq)) {
                    Some(&r) if patch::payload_unchanged(r.len(), &m.payload) => Ok(r.clone()),
                    Some(r) => patch::apply_payload(r, &m.payload).map(Bytes::from),
                    None => Err(patch::PatchError::NoReference),
                };
                match rebuilt {
                    Ok(p) => m.payload = p,
                    Err(why) => fail!(CheckpointError::MessagePatch {
                        pid,
                        superstep,
                        index: i as u32,
                        why,
                    }),
                }
            }
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
        let cached = self.page_hashes.remove(&pid);
        let (mut hashes, mut leaves) = match (base.as_ref().map(BaseSnap::get), cached) {
            // A base whose hashes are known, and whole pages only.
            (
                Some(b),
                Some(KnownHashes {
                    hash: h,
                    pages: mut v,
                    leaves: mut l,
                }),
            ) if h == b.hash
                && v.len() == b.page_count()
                && l.len() == v.len()
                && b.memory.len().is_multiple_of(PAGE_SIZE) =>
            {
                v.resize(npages, zero_page_hash());
                l.resize(npages, zero_leaves());
                (v, l)
            }
            (b, _) => {
                let mut v = vec![zero_page_hash(); npages];
                let mut l = vec![zero_leaves(); npages];
                for (i, page) in b
                    .map_or(&[][..], |b| &b.memory[..])
                    .chunks(PAGE_SIZE)
                    .enumerate()
                    .take(npages)
                {
                    // A partial last page of the base is padded with zeros.
                    let mut padded = [0u8; PAGE_SIZE];
                    padded[..page.len()].copy_from_slice(page);
                    l[i] = leaf_hashes(&padded);
                    v[i] = combine(&l[i]);
                }
                (v, l)
            }
        };
        // The memory, patched: the base's own buffer when we may consume it
        // (and the result is not shorter), else a copy. Each patch is
        // applied once, in place, and its page hashed there while it is in
        // the cache; a consumed base gets its old words back (an undo log)
        // if a patch or the hash fails. Whole pages are copied in once the
        // hash holds.
        let (mut memory, mut back, taken) = match base {
            Some(BaseSnap::Owned(mut b)) if b.memory.len() <= len => {
                let taken = b.memory.len();
                let m = resized(std::mem::take(&mut b.memory), len);
                (m, Some(Box::new(b)), Some(taken))
            }
            Some(b) => {
                let old = &b.get().memory;
                let n = old.len().min(len);
                let mut copy = crate::sysinfo::zeroed_buffer(len);
                copy[..n].copy_from_slice(&old[..n]);
                (copy, b.into_owned(), None)
            }
            None => (
                crate::sysinfo::zeroed_buffer(len),
                unused.and_then(BaseSnap::into_owned),
                None,
            ),
        };
        let mut undo = Vec::new();
        let mut failed = None;
        let mut upto = all_pages.len();
        for (k, (entry, bytes)) in all_pages.iter().enumerate() {
            let index = (entry & !patch::PAGE_PATCH) as usize;
            if entry & patch::PAGE_PATCH == 0 {
                // Checked: a whole page is exactly a page.
                if let Ok(page) = <&[u8; PAGE_SIZE]>::try_from(&bytes[..]) {
                    leaves[index] = leaf_hashes(page);
                    hashes[index] = combine(&leaves[index]);
                }
                continue;
            }
            let page = &mut memory[index * PAGE_SIZE..(index + 1) * PAGE_SIZE];
            let applied = match taken {
                Some(_) => patch::apply_undoable(page, bytes, &mut undo),
                None => patch::apply(page, bytes),
            };
            if let Err(why) = applied {
                failed = Some(CheckpointError::BadPatch {
                    pid,
                    superstep,
                    index: index as u32,
                    why,
                });
                upto = k;
                break;
            }
            // Checked: the patch is well formed, so these are the only
            // leaves it changed.
            let touched = patch::touched_leaves(bytes);
            for (j, (h, leaf)) in leaves[index]
                .iter_mut()
                .zip(page.chunks(LEAF_SIZE))
                .enumerate()
            {
                if touched & (1 << j) != 0 {
                    *h = xxh3(leaf);
                }
            }
            hashes[index] = combine(&leaves[index]);
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
        if failed.is_none() {
            let actual = canonical_hash_cached(
                &snapshot,
                memory_len,
                hashes.iter().copied(),
                self.payloads.entry(pid).or_default(),
                None,
            );
            if actual != hash {
                failed = Some(CheckpointError::HashMismatch {
                    pid,
                    superstep,
                    expected: hex::encode(hash),
                    actual: hex::encode(actual),
                });
            }
        }
        if let Some(error) = failed {
            // A consumed base is put back as it was.
            if let (Some(taken), Some(b)) = (taken, back.as_mut()) {
                for (entry, bytes) in all_pages[..upto].iter().rev() {
                    if entry & patch::PAGE_PATCH != 0 {
                        let i = (entry & !patch::PAGE_PATCH) as usize;
                        let page = &mut memory[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
                        patch::revert(page, bytes, &mut undo);
                    }
                }
                memory.truncate(taken);
                b.memory = memory;
            }
            return Err((error, back));
        }
        for (entry, bytes) in &all_pages {
            if entry & patch::PAGE_PATCH == 0 {
                let i = *entry as usize;
                memory[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].copy_from_slice(bytes);
            }
        }
        snapshot.memory = memory;
        self.page_hashes.insert(
            pid,
            KnownHashes {
                hash,
                pages: hashes,
                leaves,
            },
        );
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
                patched,
            } => self
                .part(pid, superstep, pages, outbox, patched)
                .map(|()| None),
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
pub(super) enum BaseSnap<'a> {
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
