//! Page patches: the words of a 64 KiB page that differ from the same page
//! of the replica's base, instead of the whole page (the *diffs* of
//! TreadMarks-style distributed shared memory, applied to checkpoint
//! deltas).
//!
//! Change detection works on whole pages, so a page in which one word
//! changed travels whole. Iterative programs often change a few words of
//! many pages: PageRank's ranks, once most have converged, differ from the
//! last superstep's in a few hundred of 400 000 words, spread over every
//! page of the ranks. A patch carries just those words.
//!
//! # Wire form
//!
//! A page entry of a checkpoint frame whose index has [`PAGE_PATCH`] set is
//! a patch of page `index & !PAGE_PATCH` of the delta's base: runs of
//! 8-byte words, each a 4-byte header, the first word (`u16`, little
//! endian, below 8 192) and the number of words (`u16`, at least 1), then
//! the words. Runs are in ascending order, do not overlap and stay inside
//! the page. A page with no difference has an empty patch.
//!
//! A page that changed in most of its words but in few bytes of each
//! (PageRank's ranks and sums before they converge: the high bytes of each
//! 8-byte word stay, the low ones move) travels *XOR-packed* instead: the
//! marker `0xff 0xff`, then one width (`0..=8`) per block of 16 words (the
//! last block of a payload's chunk may be shorter), then for each word of a
//! block of width `n`, the `n` low bytes (little endian) of the word XOR
//! the base's: the bytes above them are equal in every word of the block.
//! [`diff`] sizes both forms in one pass and sends the smaller one that is
//! small enough. Both are cheap to make: a block is compared, XORed and
//! measured in SSE2 registers, and packing stores each XOR whole at an
//! offset that advances by the width (about 9 µs per 64 KiB page on this
//! machine, a 2 µs copy; applying a packed page takes about 5 µs).
//!
//! A retained message's payload in a checkpoint's outbox can be a patch of
//! the same send's payload in an earlier superstep, which the replica
//! keeps ([`diff_payload`]): the patches of its 64 KiB chunks, each after
//! its length. Once PageRank has converged its contributions repeat byte
//! for byte.

use std::cell::RefCell;

use super::PAGE_SIZE;
pub use bsp_api::wire::PAGE_PATCH;

/// 8-byte words per page.
const WORDS: usize = PAGE_SIZE / 8;
/// Bytes of a run's header.
const HEADER: usize = 4;
/// A patch is abandoned (the page goes whole) once both of its forms are
/// larger than their limits for the part of the page scanned so far,
/// checked every [`CHECK_EVERY`] bytes: a page of new, unrelated bytes is
/// given up after its first KiB.
const CHECK_EVERY: usize = 1 << 10;
/// The largest useful patch of runs: half a page (a larger one saves too
/// little to be worth the replica's extra work).
pub const MAX_PATCH: usize = PAGE_SIZE / 2;
/// The largest useful XOR-packed patch of a whole page: three quarters of
/// it ([`packed_limit`]).
pub const MAX_PACKED: usize = PAGE_SIZE / 4 * 3;
/// The first two bytes of an XOR-packed patch: no run starts at word 65 535.
const PACKED: [u8; 2] = [0xff, 0xff];
/// Words per block of an XOR-packed patch, which share one width.
const BLOCK_WORDS: usize = 16;
/// Bytes per block of an XOR-packed patch.
const BLOCK_BYTES: usize = BLOCK_WORDS * 8;
/// Blocks per page.
const BLOCKS: usize = WORDS / BLOCK_WORDS;

/// Why a received patch is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    #[error("a run header is cut off at byte {at}")]
    Truncated { at: usize },
    #[error("a run of {words} words at word {start} does not fit the page's 8192 words")]
    OutOfPage { start: usize, words: usize },
    #[error("a run of 0 words at word {start}")]
    EmptyRun { start: usize },
    #[error(
        "the run at word {start} overlaps or precedes the previous one, which ends at word {end}"
    )]
    Order { start: usize, end: usize },
    #[error("{bytes} bytes follow the last chunk's patch")]
    Trailing { bytes: usize },
    #[error("the payload patched has {len} bytes, not whole 8-byte words")]
    Length { len: usize },
    #[error("no message the replica keeps has this message's destination and sequence number")]
    NoReference,
    #[error("block {block} of an XOR-packed patch has width {width}: at most 8")]
    Width { block: usize, width: u8 },
    #[error("an XOR-packed patch's widths add up to {expected} bytes, but {actual} follow them")]
    PackedLength { expected: usize, actual: usize },
}

/// The patch that turns `base` into `new` (two whole pages, or two chunks
/// of a payload of equal length, at most a page), in the smaller of its
/// two forms that is small enough: runs of changed words, at most
/// [`MAX_PATCH`] and half of `new`; XOR-packed, at most three quarters of
/// `new` ([`MAX_PACKED`] for a page). `None` when neither is (also as soon
/// as neither is for the part scanned so far, see [`CHECK_EVERY`]): then
/// send the page whole.
pub fn diff(base: &[u8], new: &[u8]) -> Option<Vec<u8>> {
    if base.len() != new.len() || base.len() > PAGE_SIZE || !base.len().is_multiple_of(8) {
        return None;
    }
    diff_in_body(base, new, ALL_LEAVES)
}

/// Every leaf of a page, as a mask of [`diff_leaves`].
pub const ALL_LEAVES: u16 = u16::MAX;

/// [`diff`] of two whole pages that the caller knows to be equal outside
/// the 4 KiB leaves in `leaves` (bit `j` for leaf `j`, as the owner's
/// tracker knows from the leaves' hashes): only those leaves are read,
/// and the patch is the same as [`diff`]'s.
pub fn diff_leaves(base: &[u8], new: &[u8], leaves: u16) -> Option<Vec<u8>> {
    if base.len() != PAGE_SIZE || new.len() != PAGE_SIZE {
        return None;
    }
    diff_in_body(base, new, leaves)
}

/// [`diff_into`] with this thread's body buffer.
fn diff_in_body(base: &[u8], new: &[u8], leaves: u16) -> Option<Vec<u8>> {
    thread_local! {
        /// The packed form's body as it is built: a page and the 8 bytes
        /// the last word's store may write past it.
        static BODY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    BODY.with_borrow_mut(|body| {
        body.resize(PAGE_SIZE + 8, 0);
        diff_into(base, new, leaves, body)
    })
}

/// Blocks of [`BLOCK_BYTES`] per 4 KiB leaf.
const LEAF_BLOCKS: usize = super::LEAF_SIZE / BLOCK_BYTES;

/// The 4 KiB leaves of a page that applying `patch` (a well-formed page
/// patch: [`check`] passed) may change, bit `j` for leaf `j`: those its
/// runs overlap, or those with a block of non-zero width when it is
/// XOR-packed.
pub fn touched_leaves(patch: &[u8]) -> u16 {
    const LEAF_WORDS: usize = super::LEAF_SIZE / 8;
    let mut mask = 0u16;
    if let Some(packed) = patch.strip_prefix(&PACKED) {
        for (k, &w) in packed.iter().take(BLOCKS).enumerate() {
            if w != 0 {
                mask |= 1 << (k / LEAF_BLOCKS);
            }
        }
        return mask;
    }
    for (start, words) in runs(patch).map_while(Result::ok) {
        let end = start + words.len() / 8;
        for leaf in start / LEAF_WORDS..end.div_ceil(LEAF_WORDS) {
            mask |= 1 << leaf;
        }
    }
    mask
}

/// [`diff`] once its arguments are checked, packing into `body`; blocks
/// outside `leaves` count as equal without being read.
fn diff_into(base: &[u8], new: &[u8], leaves: u16, body: &mut [u8]) -> Option<Vec<u8>> {
    let blocks = new.len().div_ceil(BLOCK_BYTES);
    let mut widths = [0u8; BLOCKS];
    let mut masks = [0u16; BLOCKS];
    let mut xors = [0u64; BLOCK_WORDS];
    // The length of the runs form, of the packed form's body, and whether
    // the last word of the previous block changed (a run goes on).
    let (mut runs, mut packed, mut previous) = (0usize, 0usize, 0u32);
    for k in 0..blocks {
        let (from, to) = (k * BLOCK_BYTES, ((k + 1) * BLOCK_BYTES).min(new.len()));
        let words = (to - from) / 8;
        let (or, changed) = match (
            <&[u8; BLOCK_BYTES]>::try_from(&base[from..to]),
            <&[u8; BLOCK_BYTES]>::try_from(&new[from..to]),
        ) {
            _ if leaves & (1 << (k / LEAF_BLOCKS)) == 0 => (0, 0),
            (Ok(b), Ok(n)) => xor_block(b, n, &mut xors),
            _ => xor_words(&base[from..to], &new[from..to], &mut xors),
        };
        if or != 0 {
            let w = width(or);
            widths[k] = w as u8;
            masks[k] = changed as u16;
            let starts = changed & !((changed << 1) | previous);
            previous = (changed >> (words - 1)) & 1;
            runs += changed.count_ones() as usize * 8 + starts.count_ones() as usize * HEADER;
            // Each word's XOR is stored whole; the bytes above its width
            // are overwritten by the next one's.
            let out = &mut body[packed..packed + (words - 1) * w + 8];
            if words == BLOCK_WORDS {
                match w {
                    1 => pack::<1>(&xors, out),
                    2 => pack::<2>(&xors, out),
                    3 => pack::<3>(&xors, out),
                    4 => pack::<4>(&xors, out),
                    5 => pack::<5>(&xors, out),
                    6 => pack::<6>(&xors, out),
                    7 => pack::<7>(&xors, out),
                    _ => pack::<8>(&xors, out),
                }
            } else {
                for (i, x) in xors[..words].iter().enumerate() {
                    out[i * w..i * w + 8].copy_from_slice(&x.to_le_bytes());
                }
            }
            packed += words * w;
        } else {
            previous = 0;
        }
        if to.is_multiple_of(CHECK_EVERY)
            && runs > to / 2
            && PACKED.len() + k + 1 + packed > packed_limit(to)
        {
            return None;
        }
    }
    let packed_len = PACKED.len() + blocks + packed;
    let runs_ok = runs <= MAX_PATCH && runs <= new.len() / 2;
    let packed_ok = packed_len <= packed_limit(new.len());
    if runs_ok && (!packed_ok || runs <= packed_len) {
        Some(encode_runs(new, &masks[..blocks], runs))
    } else if packed_ok {
        let mut out = Vec::with_capacity(packed_len);
        out.extend_from_slice(&PACKED);
        out.extend_from_slice(&widths[..blocks]);
        out.extend_from_slice(&body[..packed]);
        Some(out)
    } else {
        None
    }
}

/// The largest useful XOR-packed patch of `len` bytes.
fn packed_limit(len: usize) -> usize {
    len / 4 * 3
}

/// An 8-byte word.
#[inline(always)]
fn word(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
}

/// The bytes of `x` up to its highest non-zero one: 0 for `x = 0`.
#[inline(always)]
fn width(x: u64) -> usize {
    (71 - x.leading_zeros() as usize) >> 3
}

/// The XORs of a block's words with the base's into `xors`, their OR, and
/// the mask of the words that differ (bit `i` for word `i`). A block equal
/// to the base's (most of a page whose few words changed, such as a stack's)
/// returns `(0, 0)` after its loads and XORs alone, leaving `xors` as it was.
#[inline(always)]
fn xor_block(
    base: &[u8; BLOCK_BYTES],
    new: &[u8; BLOCK_BYTES],
    xors: &mut [u64; BLOCK_WORDS],
) -> (u64, u32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86-64, so every intrinsic here is available.
    // The 16 bytes read from each block start at 16 j < 128 = BLOCK_BYTES,
    // as do the 16 bytes written at word 2 j of the 16 of `xors`; unaligned
    // loads and stores take any address.
    unsafe {
        use std::arch::x86_64::*;
        let zero = _mm_setzero_si128();
        let mut x = [zero; BLOCK_WORDS / 2];
        let mut or = zero;
        for (j, x) in x.iter_mut().enumerate() {
            let b = _mm_loadu_si128(base.as_ptr().add(16 * j).cast());
            let n = _mm_loadu_si128(new.as_ptr().add(16 * j).cast());
            *x = _mm_xor_si128(b, n);
            or = _mm_or_si128(or, *x);
        }
        let or = _mm_or_si128(or, _mm_unpackhi_epi64(or, or));
        let or = _mm_cvtsi128_si64(or) as u64;
        if or == 0 {
            return (0, 0);
        }
        let mut equal = 0u32;
        for (j, &x) in x.iter().enumerate() {
            _mm_storeu_si128(xors.as_mut_ptr().add(2 * j).cast(), x);
            // A word is equal where both of its 4-byte halves are zero.
            let e = _mm_cmpeq_epi32(x, zero);
            let e = _mm_and_si128(e, _mm_shuffle_epi32::<0xb1>(e));
            equal |= (_mm_movemask_pd(_mm_castsi128_pd(e)) as u32) << (2 * j);
        }
        (or, !equal & 0xffff)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        xor_words(base, new, xors)
    }
}

/// [`xor_block`] for a block of up to [`BLOCK_WORDS`] words (the last of a
/// payload's chunk may be short).
fn xor_words(base: &[u8], new: &[u8], xors: &mut [u64; BLOCK_WORDS]) -> (u64, u32) {
    let (mut or, mut changed) = (0, 0);
    let pairs = base.chunks_exact(8).zip(new.chunks_exact(8));
    for (i, ((b, n), x)) in pairs.zip(xors.iter_mut()).enumerate() {
        *x = word(b) ^ word(n);
        or |= *x;
        changed |= u32::from(*x != 0) << i;
    }
    (or, changed)
}

/// The runs form (`len` bytes) of the changed words `masks` marks, one
/// mask per block, with the words of `new`.
fn encode_runs(new: &[u8], masks: &[u16], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    // The header of the run that ends at the last word so far.
    let mut open: Option<usize> = None;
    for (k, &m) in masks.iter().enumerate() {
        let (mut m, mut at) = (u32::from(m), 0);
        while m != 0 {
            let skip = m.trailing_zeros();
            if skip > 0 {
                open = None;
            }
            m >>= skip;
            at += skip as usize;
            let n = m.trailing_ones() as usize;
            let first = k * BLOCK_WORDS + at;
            match open {
                Some(h) => {
                    let words = u16::from_le_bytes([out[h + 2], out[h + 3]]) + n as u16;
                    out[h + 2..h + 4].copy_from_slice(&words.to_le_bytes());
                }
                None => {
                    open = Some(out.len());
                    out.extend_from_slice(&(first as u16).to_le_bytes());
                    out.extend_from_slice(&(n as u16).to_le_bytes());
                }
            }
            out.extend_from_slice(&new[first * 8..(first + n) * 8]);
            m >>= n;
            at += n;
        }
        if at != BLOCK_WORDS {
            open = None;
        }
    }
    debug_assert_eq!(out.len(), len);
    out
}

/// The masks of a word's `n` low bytes, `n` in `0..=8`.
const LOW_BYTES: [u64; 9] = {
    let mut m = [0; 9];
    let mut n = 1;
    while n < 8 {
        m[n] = u64::MAX >> (64 - 8 * n);
        n += 1;
    }
    m[8] = u64::MAX;
    m
};

/// Checks an XOR-packed patch (`patch` without its marker) for `words`
/// words: a width of at most 8 per block, and exactly the bytes the
/// widths add up to.
fn check_packed(patch: &[u8], words: usize) -> Result<(), PatchError> {
    let blocks = words.div_ceil(BLOCK_WORDS);
    let Some((widths, body)) = patch.split_at_checked(blocks) else {
        return Err(PatchError::Truncated { at: PACKED.len() });
    };
    let mut expected = 0;
    for (k, &w) in widths.iter().enumerate() {
        if w > 8 {
            return Err(PatchError::Width { block: k, width: w });
        }
        expected += usize::from(w) * (words - k * BLOCK_WORDS).min(BLOCK_WORDS);
    }
    if expected != body.len() {
        return Err(PatchError::PackedLength {
            expected,
            actual: body.len(),
        });
    }
    Ok(())
}

/// Applies an XOR-packed patch (without its marker) that [`check_packed`]
/// accepted to `page`.
fn apply_packed(page: &mut [u8], patch: &[u8]) {
    let (widths, body) = patch.split_at((page.len() / 8).div_ceil(BLOCK_WORDS));
    let mut pos = 0;
    for (block, &w) in page.chunks_mut(BLOCK_BYTES).zip(widths) {
        let w = usize::from(w);
        let words = block.len() / 8;
        if w == 0 {
            continue;
        }
        // A whole block whose every 8-byte read stays in the body.
        if let (Ok(block), Some(packed)) = (
            <&mut [u8; BLOCK_BYTES]>::try_from(&mut *block),
            body.get(pos..pos + (BLOCK_WORDS - 1) * w + 8),
        ) {
            match w {
                1 => unpack::<1>(block, packed),
                2 => unpack::<2>(block, packed),
                3 => unpack::<3>(block, packed),
                4 => unpack::<4>(block, packed),
                5 => unpack::<5>(block, packed),
                6 => unpack::<6>(block, packed),
                7 => unpack::<7>(block, packed),
                _ => unpack::<8>(block, packed),
            }
        } else {
            for (i, c) in block.chunks_exact_mut(8).enumerate() {
                let mut x = [0u8; 8];
                x[..w].copy_from_slice(&body[pos + i * w..pos + (i + 1) * w]);
                c.copy_from_slice(&(word(c) ^ u64::from_le_bytes(x)).to_le_bytes());
            }
        }
        pos += words * w;
    }
}

/// Stores a whole block's XORs at width `W` (each whole, at `W` bytes
/// apart: `out` holds the `15 W + 8` bytes the stores reach), unrolled
/// with the bounds checked once.
#[inline(always)]
fn pack<const W: usize>(xors: &[u64; BLOCK_WORDS], out: &mut [u8]) {
    let out = &mut out[..(BLOCK_WORDS - 1) * W + 8];
    for (i, x) in xors.iter().enumerate() {
        out[i * W..i * W + 8].copy_from_slice(&x.to_le_bytes());
    }
}

/// XORs a whole block with its packed words of width `W` (`packed` holds
/// them and at least 8 − `W` bytes more).
#[inline(always)]
fn unpack<const W: usize>(block: &mut [u8; BLOCK_BYTES], packed: &[u8]) {
    let packed = &packed[..(BLOCK_WORDS - 1) * W + 8];
    for i in 0..BLOCK_WORDS {
        let x = word(&packed[i * W..i * W + 8]) & LOW_BYTES[W];
        let c = &mut block[i * 8..i * 8 + 8];
        c.copy_from_slice(&(word(c) ^ x).to_le_bytes());
    }
}

/// Checks `patch` against the wire form; `Ok` means [`apply`] cannot fail.
pub fn check(patch: &[u8]) -> Result<(), PatchError> {
    check_within(patch, WORDS)
}

/// Checks `patch` for a page or chunk of `words` words.
fn check_within(patch: &[u8], words: usize) -> Result<(), PatchError> {
    if let Some(packed) = patch.strip_prefix(&PACKED) {
        return check_packed(packed, words);
    }
    runs(patch).try_for_each(|r| {
        let (start, bytes) = r?;
        let n = bytes.len() / 8;
        if start + n > words {
            return Err(PatchError::OutOfPage { start, words: n });
        }
        Ok(())
    })
}

/// A message payload that differs from the payload of its reference (the
/// same send one superstep before, see [`Checkpoint::patched`]) in few
/// words: for each 64 KiB chunk of the payload in order, the chunk's
/// patch's length (`u32`, little endian) and the patch. `None` when the
/// payloads differ in length, are not whole words, or a chunk has no
/// patch ([`diff`]), or the patch would be larger than three quarters of
/// the payload: then the payload travels whole.
///
/// [`Checkpoint::patched`]: bsp_api::wire::Checkpoint::patched
pub fn diff_payload(reference: &[u8], new: &[u8]) -> Option<Vec<u8>> {
    if reference.len() != new.len() || !new.len().is_multiple_of(8) {
        return None;
    }
    let mut out = Vec::new();
    for (a, b) in reference.chunks(PAGE_SIZE).zip(new.chunks(PAGE_SIZE)) {
        let p = diff(a, b)?;
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(&p);
        if out.len() > packed_limit(new.len()) {
            return None;
        }
    }
    Some(out)
}

/// Whether `patch`, in [`diff_payload`]'s form, changes nothing in a
/// payload of `len` bytes (whole words): every chunk's patch is empty, so
/// [`apply_payload`] would give the reference back byte for byte. The
/// replica then shares the reference's buffer, and its cached hash,
/// instead of copying it: a converged PageRank's contributions repeat.
pub fn payload_unchanged(len: usize, patch: &[u8]) -> bool {
    len.is_multiple_of(8)
        && patch.len() == 4 * len.div_ceil(PAGE_SIZE)
        && patch.iter().all(|&b| b == 0)
}

/// The payload [`diff_payload`] described: `reference` with `patch` applied.
pub fn apply_payload(reference: &[u8], patch: &[u8]) -> Result<Vec<u8>, PatchError> {
    if !reference.len().is_multiple_of(8) {
        return Err(PatchError::Length {
            len: reference.len(),
        });
    }
    let mut out = reference.to_vec();
    let mut rest = patch;
    for chunk in out.chunks_mut(PAGE_SIZE) {
        let at = patch.len() - rest.len();
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(PatchError::Truncated { at });
        };
        let len = u32::from_le_bytes(*len) as usize;
        let Some((p, tail)) = tail.split_at_checked(len) else {
            return Err(PatchError::Truncated { at });
        };
        apply(chunk, p)?;
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(PatchError::Trailing { bytes: rest.len() });
    }
    Ok(out)
}

/// Writes `patch` into `page` (a whole page, or a chunk of a payload). A
/// malformed patch is an error and leaves the page as it was.
pub fn apply(page: &mut [u8], patch: &[u8]) -> Result<(), PatchError> {
    apply_keeping(page, patch, |_| {})
}

/// [`apply`], keeping in `undo` what it overwrites so that [`revert`] can
/// put it back: the old words of a patch's runs, appended (an XOR-packed
/// patch is its own inverse and keeps nothing). A malformed patch is an
/// error and leaves the page and `undo` as they were.
pub fn apply_undoable(page: &mut [u8], patch: &[u8], undo: &mut Vec<u8>) -> Result<(), PatchError> {
    apply_keeping(page, patch, |old| undo.extend_from_slice(old))
}

/// [`apply`], showing `keep` the bytes of each run before it overwrites
/// them.
fn apply_keeping(
    page: &mut [u8],
    patch: &[u8],
    mut keep: impl FnMut(&[u8]),
) -> Result<(), PatchError> {
    check_within(patch, page.len() / 8)?;
    if let Some(packed) = patch.strip_prefix(&PACKED) {
        apply_packed(page, packed);
        return Ok(());
    }
    // Checked: every run is well formed.
    for (start, words) in runs(patch).map_while(Result::ok) {
        let at = &mut page[start * 8..start * 8 + words.len()];
        keep(at);
        at.copy_from_slice(words);
    }
    Ok(())
}

/// Undoes [`apply_undoable`] of `patch` on `page`, taking the bytes it
/// kept off the end of `undo`: patches applied one after another are
/// reverted in the reverse order.
pub fn revert(page: &mut [u8], patch: &[u8], undo: &mut Vec<u8>) {
    if let Some(packed) = patch.strip_prefix(&PACKED) {
        apply_packed(page, packed);
        return;
    }
    let kept: usize = runs(patch)
        .map_while(Result::ok)
        .map(|(_, w)| w.len())
        .sum();
    let from = undo.len().saturating_sub(kept);
    let mut old = &undo[from..];
    for (start, words) in runs(patch).map_while(Result::ok) {
        let (run, rest) = old.split_at(words.len().min(old.len()));
        page[start * 8..start * 8 + run.len()].copy_from_slice(run);
        old = rest;
    }
    undo.truncate(from);
}

/// The runs of a patch as (first word, the words' bytes), checked.
fn runs(patch: &[u8]) -> impl Iterator<Item = Result<(usize, &[u8]), PatchError>> {
    let mut pos = 0;
    let mut end = 0;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || pos == patch.len() {
            return None;
        }
        let next = (|| {
            let Some(h) = patch.get(pos..pos + HEADER) else {
                return Err(PatchError::Truncated { at: pos });
            };
            let start = u16::from_le_bytes([h[0], h[1]]) as usize;
            let words = u16::from_le_bytes([h[2], h[3]]) as usize;
            if words == 0 {
                return Err(PatchError::EmptyRun { start });
            }
            if start + words > WORDS {
                return Err(PatchError::OutOfPage { start, words });
            }
            if start < end {
                return Err(PatchError::Order { start, end });
            }
            let body = pos + HEADER;
            let Some(bytes) = patch.get(body..body + words * 8) else {
                return Err(PatchError::Truncated { at: pos });
            };
            pos = body + words * 8;
            end = start + words;
            Ok((start, bytes))
        })();
        failed = next.is_err();
        Some(next)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn page_with(changes: &[(usize, u64)], seed: u8) -> (Vec<u8>, Vec<u8>) {
        let base: Vec<u8> = (0..PAGE_SIZE)
            .map(|i| (i as u8).wrapping_mul(seed | 1))
            .collect();
        let mut new = base.clone();
        for &(word, v) in changes {
            let w = word % WORDS;
            new[w * 8..w * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        (base, new)
    }

    /// The words a patch may change: those of its runs, or of the blocks
    /// of non-zero width of a packed one.
    fn covered(patch: &[u8]) -> Vec<bool> {
        let mut covered = vec![false; WORDS];
        if let Some(packed) = patch.strip_prefix(&PACKED) {
            for (k, &w) in packed[..BLOCKS].iter().enumerate() {
                covered[k * BLOCK_WORDS..(k + 1) * BLOCK_WORDS].fill(w > 0);
            }
            return covered;
        }
        for r in runs(patch) {
            let (start, words) = r.unwrap();
            covered[start..start + words.len() / 8].fill(true);
        }
        covered
    }

    /// The length of the complete packed patch, block by block.
    fn reference_packed_len(base: &[u8], new: &[u8]) -> usize {
        let body: usize = base
            .chunks(BLOCK_BYTES)
            .zip(new.chunks(BLOCK_BYTES))
            .map(|(a, b)| {
                let widest = a
                    .chunks_exact(8)
                    .zip(b.chunks_exact(8))
                    .map(|(x, y)| 8 - (word(x) ^ word(y)).leading_zeros() as usize / 8)
                    .max()
                    .unwrap_or(0);
                widest * a.len() / 8
            })
            .sum();
        PACKED.len() + base.len().div_ceil(BLOCK_BYTES) + body
    }

    /// The length of the complete patch, run by run.
    fn reference_len(base: &[u8], new: &[u8]) -> usize {
        let differ: Vec<bool> = base
            .chunks_exact(8)
            .zip(new.chunks_exact(8))
            .map(|(a, b)| a != b)
            .collect();
        let starts = (0..WORDS)
            .filter(|&w| differ[w] && (w == 0 || !differ[w - 1]))
            .count();
        starts * HEADER + differ.iter().filter(|&&d| d).count() * 8
    }

    proptest! {
        /// A patch, when there is one, rebuilds the new page from the base.
        #[test]
        fn diff_then_apply_rebuilds_the_page(
            changes in proptest::collection::vec((0usize..WORDS, any::<u64>()), 0..600),
            seed in any::<u8>(),
        ) {
            let (base, new) = page_with(&changes, seed);
            if let Some(patch) = diff(&base, &new) {
                prop_assert!(patch.len() <= MAX_PACKED);
                prop_assert!(check(&patch).is_ok());
                let mut page = base.clone();
                apply(&mut page, &patch).unwrap();
                prop_assert!(page == new);
            } else {
                // Only a patch that would be large is refused: one of at
                // most half of the first check's bytes never is.
                prop_assert!(reference_len(&base, &new) > CHECK_EVERY / 2);
            }
        }

        /// Told which leaves may differ (every leaf that does, and some
        /// that do not), `diff_leaves` makes the same patch as `diff`; and
        /// the leaves a patch touches cover every leaf it changes.
        #[test]
        fn leaf_diffs_equal_whole_diffs_and_touch_what_they_change(
            changes in proptest::collection::vec((0usize..WORDS, any::<u64>()), 0..600),
            extra in any::<u16>(),
            seed in any::<u8>(),
        ) {
            let (base, new) = page_with(&changes, seed);
            const LEAF: usize = super::super::LEAF_SIZE;
            let differ = base
                .chunks(LEAF)
                .zip(new.chunks(LEAF))
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .fold(0u16, |m, (j, _)| m | 1 << j);
            let patch = diff(&base, &new);
            prop_assert_eq!(&diff_leaves(&base, &new, differ | extra), &patch);
            if let Some(patch) = patch {
                let touched = touched_leaves(&patch);
                prop_assert_eq!(touched & differ, differ);
                let mut page = base.clone();
                apply(&mut page, &patch).unwrap();
                for (j, (a, b)) in page.chunks(LEAF).zip(base.chunks(LEAF)).enumerate() {
                    if touched & (1 << j) == 0 {
                        prop_assert!(a == b, "leaf {} changed but was not touched", j);
                    }
                }
            }
        }

        /// Patches of both forms (and hostile bytes among them) applied one
        /// after another with an undo log, then reverted in reverse order:
        /// each step is what `apply` does, and the page and the log end
        /// as they started.
        #[test]
        fn reverting_undoable_patches_restores_the_page(
            steps in proptest::collection::vec(
                (
                    proptest::collection::vec((0usize..WORDS, any::<u64>()), 0..300),
                    any::<Option<u16>>(),
                    proptest::collection::vec(any::<u8>(), 0..40),
                ),
                1..6,
            ),
            seed in any::<u8>(),
        ) {
            let (start, _) = page_with(&[], seed);
            let mut page = start.clone();
            let mut undo = vec![seed];
            let mut applied = Vec::new();
            for (changes, dense, hostile) in &steps {
                let mut new = page.clone();
                for &(w, v) in changes {
                    new[w * 8..w * 8 + 8].copy_from_slice(&v.to_le_bytes());
                }
                if let Some(d) = dense {
                    // Every word's low bytes move: the packed form.
                    for (i, c) in new.chunks_exact_mut(8).enumerate() {
                        let x = word(c) ^ (u64::from(*d).wrapping_mul(i as u64 + 1) & 0xffff);
                        c.copy_from_slice(&x.to_le_bytes());
                    }
                }
                for patch in [diff(&page, &new), Some(hostile.clone())].into_iter().flatten() {
                    let mut expected = page.clone();
                    let before = undo.len();
                    match apply_undoable(&mut page, &patch, &mut undo) {
                        Ok(()) => {
                            prop_assert!(apply(&mut expected, &patch).is_ok());
                            applied.push(patch);
                        }
                        Err(_) => prop_assert_eq!(undo.len(), before),
                    }
                    prop_assert!(page == expected);
                }
            }
            for patch in applied.iter().rev() {
                revert(&mut page, patch, &mut undo);
            }
            prop_assert!(page == start);
            prop_assert_eq!(undo, vec![seed]);
        }

        /// Any bytes as a patch: an error that leaves the page as it was,
        /// or a change confined to the patch's runs; never a panic.
        #[test]
        fn hostile_patches_fail_cleanly(patch in proptest::collection::vec(any::<u8>(), 0..200)) {
            let (base, _) = page_with(&[], 7);
            let mut page = base.clone();
            match apply(&mut page, &patch) {
                Err(_) => {
                    prop_assert!(check(&patch).is_err());
                    prop_assert!(page == base);
                }
                Ok(()) => {
                    let covered = covered(&patch);
                    for (w, (a, b)) in page.chunks_exact(8).zip(base.chunks_exact(8)).enumerate() {
                        prop_assert!(covered[w] || a == b);
                    }
                }
            }
        }

        /// A packed patch with hostile widths and bytes: an error that
        /// leaves the page as it was, or a change confined to the low
        /// bytes of the blocks' widths.
        #[test]
        fn hostile_packed_patches_fail_cleanly(
            mut widths in proptest::collection::vec(0u8..=8, BLOCKS),
            seed in any::<u64>(),
            flaw in 0usize..5,
            at in 0usize..BLOCKS,
        ) {
            let mut len: usize = widths.iter().map(|&w| usize::from(w) * BLOCK_WORDS).sum();
            match flaw {
                0 => widths[at] = 9 + (seed % 247) as u8,
                1 => len += 1 + (seed % 20) as usize,
                2 => len = len.saturating_sub(1 + (seed % 20) as usize),
                3 => widths.truncate(at),
                _ => {}
            }
            let (base, _) = page_with(&[], 5);
            let mut patch = PACKED.to_vec();
            patch.extend(&widths);
            patch.extend((0..len as u64).map(|i| (i.wrapping_mul(seed) >> 7) as u8));
            let mut page = base.clone();
            match apply(&mut page, &patch) {
                Err(_) => {
                    prop_assert!(flaw != 4, "a well-formed patch was refused");
                    prop_assert!(check(&patch).is_err());
                    prop_assert!(page == base);
                }
                Ok(()) => {
                    // A cut-off list of widths may take body bytes for widths.
                    prop_assert!(flaw == 3 || flaw == 4);
                    let widths = &patch[2..2 + BLOCKS];
                    for (w, (a, b)) in page.chunks_exact(8).zip(base.chunks_exact(8)).enumerate() {
                        let n = usize::from(widths[w / BLOCK_WORDS]);
                        prop_assert!((word(a) ^ word(b)) & !LOW_BYTES[n] == 0);
                    }
                }
            }
        }

        /// Changes of a few low bytes in many words: the patch is the
        /// smaller of the two forms that fits (as a reference model sizes
        /// them), and rebuilds the page.
        #[test]
        fn dense_small_changes_pack_and_rebuild_the_page(
            regions in proptest::collection::vec((0usize..WORDS, 1usize..3000, 0usize..9), 0..6),
            seed in any::<u64>(),
        ) {
            let (base, _) = page_with(&[], seed as u8);
            let mut new = base.clone();
            let mut state = seed | 1;
            for (start, len, bytes) in regions {
                for w in start..(start + len).min(WORDS) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let x = state & LOW_BYTES[bytes];
                    let c = &mut new[w * 8..w * 8 + 8];
                    c.copy_from_slice(&(word(c) ^ x).to_le_bytes());
                }
            }
            let runs = reference_len(&base, &new);
            let packed = reference_packed_len(&base, &new);
            let runs_ok = runs <= MAX_PATCH;
            let packed_ok = packed <= MAX_PACKED;
            match diff(&base, &new) {
                Some(patch) => {
                    let want = if runs_ok && (!packed_ok || runs <= packed) { runs } else { packed };
                    prop_assert_eq!(patch.len(), want);
                    let packs = !(runs_ok && (!packed_ok || runs <= packed));
                    prop_assert_eq!(patch.starts_with(&PACKED), packs);
                    let mut page = base.clone();
                    apply(&mut page, &patch).unwrap();
                    prop_assert!(page == new);
                }
                None => prop_assert!(runs > CHECK_EVERY / 2 && packed > CHECK_EVERY * 3 / 4),
            }
        }
    }

    proptest! {
        /// A payload patch rebuilds the payload, whatever its length (one
        /// chunk or several, the last one short).
        #[test]
        fn payload_patches_rebuild_the_payload(
            words in 1usize..30_000,
            changes in proptest::collection::vec((any::<usize>(), any::<u64>()), 0..40),
        ) {
            let reference: Vec<u8> = (0..words * 8).map(|i| (i % 253) as u8).collect();
            let mut new = reference.clone();
            for (w, v) in changes {
                let w = w % words;
                new[w * 8..w * 8 + 8].copy_from_slice(&v.to_le_bytes());
            }
            if let Some(p) = diff_payload(&reference, &new) {
                prop_assert!(p.len() <= new.len() / 4 * 3);
                prop_assert_eq!(payload_unchanged(reference.len(), &p), new == reference);
                prop_assert_eq!(apply_payload(&reference, &p).unwrap(), new);
            }
        }

        /// A patch said to change nothing is one that `apply_payload`
        /// accepts and that gives the reference back, for any bytes and
        /// any length.
        #[test]
        fn an_unchanged_payload_is_what_applying_gives(
            len in 0usize..200_000,
            patch in proptest::collection::vec(0u8..2, 0..20),
        ) {
            let reference: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            if payload_unchanged(len, &patch) {
                prop_assert_eq!(apply_payload(&reference, &patch), Ok(reference.clone()));
            }
            let empty = vec![0; 4 * len.div_ceil(PAGE_SIZE)];
            prop_assert_eq!(
                payload_unchanged(len, &empty),
                apply_payload(&reference, &empty).is_ok()
            );
        }

        /// Any bytes as a payload patch: an error or a payload of the
        /// reference's length; never a panic.
        #[test]
        fn hostile_payload_patches_fail_cleanly(patch in proptest::collection::vec(any::<u8>(), 0..64)) {
            let reference = vec![9u8; 70_000 / 8 * 8];
            if let Ok(p) = apply_payload(&reference, &patch) {
                prop_assert_eq!(p.len(), reference.len());
            }
        }
    }

    #[test]
    fn identical_payloads_patch_to_a_length_per_chunk() {
        let payload: Vec<u8> = (0..800_000).map(|i| (i % 7) as u8).collect();
        let p = diff_payload(&payload, &payload).unwrap();
        // 13 chunks of 64 KiB (the last one short), each an empty patch.
        assert_eq!(p, vec![0; 4 * 13]);
        assert_eq!(apply_payload(&payload, &p).unwrap(), payload);
        assert_eq!(diff_payload(&payload[..7], &payload[..7]), None);
        assert_eq!(
            apply_payload(&payload, &p[..8]),
            Err(PatchError::Truncated { at: 8 })
        );
        let mut long = p.clone();
        long.push(0);
        assert_eq!(
            apply_payload(&payload, &long),
            Err(PatchError::Trailing { bytes: 1 })
        );
    }

    #[test]
    fn unchanged_page_gives_an_empty_patch() {
        let (base, new) = page_with(&[], 3);
        assert_eq!(diff(&base, &new), Some(Vec::new()));
    }

    #[test]
    fn adjacent_words_share_a_run() {
        let (base, new) = page_with(&[(10, 1), (11, 2), (12, 3), (100, 4)], 3);
        let patch = diff(&base, &new).unwrap();
        // Two runs: 3 words and 1 word.
        assert_eq!(patch.len(), 2 * HEADER + 4 * 8);
        assert_eq!(&patch[..4], &[10, 0, 3, 0]);
    }

    #[test]
    fn a_dense_change_is_refused_early() {
        let base = vec![0u8; PAGE_SIZE];
        let new = vec![1u8; PAGE_SIZE];
        assert_eq!(diff(&base, &new), None);
    }

    #[test]
    fn low_byte_changes_everywhere_travel_packed() {
        let (base, _) = page_with(&[], 9);
        let mut new = base.clone();
        for (i, c) in new.chunks_exact_mut(8).enumerate() {
            let x = (i as u64 * 0x9e37) & 0xffff | 1;
            c.copy_from_slice(&(word(c) ^ x).to_le_bytes());
        }
        let patch = diff(&base, &new).unwrap();
        // The marker, a width of 2 for each of the 512 blocks, 2 bytes a word.
        assert_eq!(patch.len(), 2 + BLOCKS + WORDS * 2);
        assert_eq!(&patch[..2], &PACKED);
        assert!(patch[2..2 + BLOCKS].iter().all(|&w| w == 2));
        let mut page = base.clone();
        apply(&mut page, &patch).unwrap();
        assert!(page == new);
    }

    #[test]
    fn a_payload_of_small_changes_packs_in_short_blocks() {
        // 100 words: blocks of 16 and a last one of 4.
        let reference: Vec<u8> = (0..800).map(|i| (i * 7 % 251) as u8).collect();
        let mut new = reference.clone();
        for c in new.chunks_exact_mut(8) {
            c[0] ^= 0x5a;
        }
        let p = diff_payload(&reference, &new).unwrap();
        // The chunk's length, the marker, 7 widths and a byte per word.
        assert_eq!(p.len(), 4 + 2 + 7 + 100);
        assert_eq!(apply_payload(&reference, &p).unwrap(), new);
    }

    #[test]
    fn malformed_packed_patches_say_what_is_wrong() {
        let mut patch = PACKED.to_vec();
        assert_eq!(check(&patch), Err(PatchError::Truncated { at: 2 }));
        patch.extend([0; BLOCKS]);
        assert_eq!(check(&patch), Ok(()));
        patch[2 + 3] = 9;
        assert_eq!(check(&patch), Err(PatchError::Width { block: 3, width: 9 }));
        patch[2 + 3] = 1;
        assert_eq!(
            check(&patch),
            Err(PatchError::PackedLength {
                expected: 16,
                actual: 0
            })
        );
        patch.extend([0xab; 16]);
        let (base, _) = page_with(&[], 1);
        let mut page = base.clone();
        apply(&mut page, &patch).unwrap();
        for (w, (a, b)) in page.chunks_exact(8).zip(base.chunks_exact(8)).enumerate() {
            let x = if (48..64).contains(&w) { 0xab } else { 0 };
            assert_eq!(word(a) ^ word(b), x, "word {w}");
        }
    }

    #[test]
    fn malformed_patches_say_what_is_wrong() {
        assert_eq!(check(&[1, 0]), Err(PatchError::Truncated { at: 0 }));
        assert_eq!(check(&[1, 0, 0, 0]), Err(PatchError::EmptyRun { start: 1 }));
        assert_eq!(
            check(&[0xff, 0x1f, 2, 0]),
            Err(PatchError::OutOfPage {
                start: 8191,
                words: 2
            })
        );
        let mut two = vec![5, 0, 1, 0];
        two.extend([0; 8]);
        two.extend([4, 0, 1, 0]);
        two.extend([0; 8]);
        assert_eq!(check(&two), Err(PatchError::Order { start: 4, end: 6 }));
        assert_eq!(
            check(&[0, 0, 1, 0, 9]),
            Err(PatchError::Truncated { at: 0 })
        );
    }
}
