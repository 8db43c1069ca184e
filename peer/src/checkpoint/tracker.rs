//! The owner's side: change detection ([`PageTracker`]) and what to send
//! each replica ([`Plan`]).

use super::*;

/// What to send one replica: a delta against `base` or (`base == None`) the
/// whole snapshot, with the pages to include.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The superstep of the replica's snapshot the delta applies to.
    pub base: Option<u32>,
    /// Page indices to send, ascending.
    pub pages: Vec<u32>,
    /// For a delta, per page of `pages`, which of its 4 KiB leaves changed
    /// since the base (bit `j` for leaf `j`): the others equal the base's,
    /// so a patch need not compare them. Empty for a whole snapshot.
    pub leaves: Vec<u16>,
}

/// Change detection for one process on its host.
///
/// Keeps, per page, its [`PageHash`] and its leaves' (the content hash's,
/// so a changed page is hashed once) and, per 4 KiB leaf, the superstep of
/// the last capture at which the leaf changed. A capture costs one XXH3
/// pass over the pages that may have changed (at memory speed) and a copy
/// of the changed leaves. A guest that crafted a colliding page to hide
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
    /// Per page, the hashes of its leaves.
    leaves: Vec<LeafHashes>,
    /// Per leaf (page `i`'s leaf `j` at `i * LEAVES + j`), 0: never changed
    /// from zeros; `s + 1`: changed at the capture of `s`.
    changed: Vec<u64>,
    /// Per page, the largest of its leaves' `changed`.
    page_changed: Vec<u64>,
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
    pub(super) payloads: PayloadHashes,
    /// [`Snapshot::state_digest`] of the last capture, when `digests`.
    state_digest: [u8; 32],
    /// Compute the state digest at each capture (a job with redundancy),
    /// with a checkpoint every this many supersteps.
    digests: Option<u32>,
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
            leaves: Vec::new(),
            changed: Vec::new(),
            page_changed: Vec::new(),
            len_pages: 0,
            origin: None,
            last: None,
            recent: std::collections::VecDeque::new(),
            replicas: HashMap::new(),
            payloads: PayloadHashes::default(),
            state_digest: [0; 32],
            digests: None,
        }
    }

    /// A tracker that also computes [`Snapshot::state_digest`] at each
    /// capture (a job with redundancy compares it between copies), with a
    /// checkpoint every `every` supersteps.
    pub fn with_state_digests(mut self, every: u32) -> Self {
        self.digests = Some(every);
        self
    }

    /// [`Snapshot::state_digest`] of the last capture, computed with its
    /// hash (zeros before the first, or without
    /// [`PageTracker::with_state_digests`]).
    pub fn last_state_digest(&self) -> [u8; 32] {
        self.state_digest
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
    /// `previous` is `None`) that reads only the 4 KiB leaves that may have
    /// changed since the tracker's last capture: `may_have_changed[k]` for
    /// leaf `k` (page `k / LEAVES`'s leaf `k % LEAVES`; leaves it does not
    /// cover, and every leaf when the tracker starts over, are read). The
    /// caller vouches that a leaf it calls unchanged was not written since
    /// the last capture (the peer knows it from the kernel's write
    /// tracking, whose unit is the 4 KiB OS page; see `peer/src/dirty.rs`).
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

    /// Whether the capture of `superstep` with `hash` is one of the last
    /// few this tracker took since it last started over.
    pub fn is_recent_capture(&self, superstep: u32, hash: [u8; 32]) -> bool {
        self.recent
            .iter()
            .any(|&(s, h, _)| (s, h) == (superstep, hash))
    }

    /// Whether leaf `k` (page `k / LEAVES`'s leaf `k % LEAVES`) changed at
    /// the last capture.
    pub fn leaf_changed_at_last_capture(&self, k: usize) -> bool {
        match (self.last, self.changed.get(k)) {
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
        // Leaf `k` (page `k / LEAVES`) unchanged since the last capture.
        let unwritten = |k: usize| {
            k / LEAVES < known && may_have_changed.is_some_and(|m| m.get(k) == Some(&false))
        };
        let mem: &[u8] = if snapshot.exited { &[] } else { memory };
        let n = mem.len().div_ceil(PAGE_SIZE);
        let tag = u64::from(snapshot.superstep) + 1;
        if self.page_hashes.len() < n {
            self.page_hashes.resize(n, zero_page_hash());
            self.leaves.resize(n, zero_leaves());
            self.changed.resize(n * LEAVES, 0);
            self.page_changed.resize(n, 0);
        }
        // With a reused buffer (an earlier capture `b`, pages beyond it
        // zeros), the leaves unchanged since `b` are already in place.
        let (mut copy, since) = match reuse {
            Some(p) => {
                let m = resized(p.memory, mem.len());
                (m, Some(u64::from(p.superstep) + 1))
            }
            // A fresh buffer is zeros already: zero leaves are not copied
            // (nor faulted in).
            None => (crate::sysinfo::zeroed_buffer(mem.len()), None),
        };
        for (i, page) in mem.chunks(PAGE_SIZE).enumerate() {
            let read = (0..LEAVES)
                .filter(|&j| !unwritten(i * LEAVES + j))
                .fold(0u16, |m, j| m | 1 << j);
            if read != 0 {
                self.rehash(i, page, tag, read);
            }
            let start = i * PAGE_SIZE;
            let tags = &self.changed[i * LEAVES..(i + 1) * LEAVES];
            match since {
                None => {
                    for (j, leaf) in page.chunks(LEAF_SIZE).enumerate() {
                        if !is_zero(leaf) {
                            let at = start + j * LEAF_SIZE;
                            crate::stream::copy(&mut copy[at..at + leaf.len()], leaf);
                        }
                    }
                }
                // Changed at a capture after `b` (this one included).
                Some(b) if self.page_changed[i] > b => {
                    for (j, leaf) in page.chunks(LEAF_SIZE).enumerate() {
                        if tags[j] > b {
                            let at = start + j * LEAF_SIZE;
                            crate::stream::copy(&mut copy[at..at + leaf.len()], leaf);
                        }
                    }
                }
                Some(_) => {}
            }
        }
        // Pages beyond this memory count as zeros.
        for i in n..self.page_hashes.len() {
            if self.page_hashes[i] != zero_page_hash() {
                self.page_hashes[i] = zero_page_hash();
                for (j, h) in self.leaves[i].iter_mut().enumerate() {
                    if *h != zero_leaf_hash() {
                        *h = zero_leaf_hash();
                        self.changed[i * LEAVES + j] = tag;
                    }
                }
                self.page_changed[i] = tag;
            }
        }
        self.len_pages = n;
        snapshot.memory = copy;
        snapshot.hash = canonical_hash_cached(
            &snapshot,
            snapshot.memory.len() as u64,
            self.page_hashes[..n].iter().copied(),
            &mut self.payloads,
            self.digests.map(|every| {
                (
                    &mut self.state_digest,
                    super::digest_from(snapshot.superstep, every),
                )
            }),
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

    /// Hash the leaves in `read` (bit `j` for leaf `j`; the others are
    /// known unchanged) of page `i` (`page`, its bytes in memory) and mark
    /// the leaves that changed with `tag`. A page shorter than
    /// [`PAGE_SIZE`] (never in a wasm memory) counts as changed in every
    /// leaf.
    fn rehash(&mut self, i: usize, page: &[u8], tag: u64, read: u16) {
        let tags = &mut self.changed[i * LEAVES..(i + 1) * LEAVES];
        match <&[u8; PAGE_SIZE]>::try_from(page) {
            Ok(page) => {
                let mut new = self.leaves[i];
                for (j, h) in new.iter_mut().enumerate() {
                    if read & (1 << j) != 0 {
                        *h = xxh3(&page[j * LEAF_SIZE..(j + 1) * LEAF_SIZE]);
                    }
                }
                let old = &mut self.leaves[i];
                let mut any = false;
                for ((t, o), n) in tags.iter_mut().zip(old.iter()).zip(&new) {
                    if o != n {
                        *t = tag;
                        any = true;
                    }
                }
                if any {
                    *old = new;
                    self.page_hashes[i] = combine(&new);
                    self.page_changed[i] = tag;
                }
            }
            Err(_) => {
                // Leaves no real content hashes to, so that the page counts
                // as changed again once it is whole.
                self.leaves[i] = [[0xff; 16]; LEAVES];
                self.page_hashes[i] = page_hash(page);
                tags.fill(tag);
                self.page_changed[i] = tag;
            }
        }
    }

    /// A tracker whose first capture is `snapshot` (a process restored from
    /// it): replicas known to hold exactly this snapshot (tell it with
    /// [`PageTracker::acked`]) can get deltas against it.
    pub fn seeded(snapshot: &Snapshot, digests: Option<u32>) -> Self {
        let mut t = PageTracker::new();
        t.digests = digests;
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
                let pages: Vec<u32> = (0..self.len_pages)
                    .filter(|&i| self.page_changed[i] > after)
                    .map(|i| i as u32)
                    .collect();
                let leaves = pages
                    .iter()
                    .map(|&i| {
                        let tags = &self.changed[i as usize * LEAVES..(i as usize + 1) * LEAVES];
                        tags.iter()
                            .enumerate()
                            .filter(|&(_, &t)| t > after)
                            .fold(0u16, |m, (j, _)| m | 1 << j)
                    })
                    .collect();
                Plan {
                    base: Some(b),
                    pages,
                    leaves,
                }
            }
            None => Plan {
                base: None,
                pages: snapshot.nonzero_pages(),
                leaves: Vec::new(),
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
        self.leaves.clear();
        self.changed.clear();
        self.page_changed.clear();
        self.len_pages = 0;
        self.origin = None;
        self.last = None;
        self.recent.clear();
        self.replicas.clear();
    }
}

// ---- wire form ------------------------------------------------------------------
