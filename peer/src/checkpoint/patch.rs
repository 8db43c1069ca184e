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
//! A retained message's payload in a checkpoint's outbox can be a patch of
//! the same send's payload in an earlier superstep, which the replica
//! keeps ([`diff_payload`]): the patches of its 64 KiB chunks, each after
//! its length. Once PageRank has converged its contributions repeat byte
//! for byte.

use super::PAGE_SIZE;
pub use bsp_api::wire::PAGE_PATCH;

/// 8-byte words per page.
const WORDS: usize = PAGE_SIZE / 8;
/// Bytes of a run's header.
const HEADER: usize = 4;
/// Bytes compared at once before looking at single words: most blocks of a
/// sparsely changed page are equal, and comparing a block is one `memcmp`.
const BLOCK: usize = 256;
/// A patch is abandoned (the page goes whole) once it is larger than this
/// fraction of the part of the page scanned so far, checked every
/// [`CHECK_EVERY`] bytes, or than [`MAX_PATCH`] in all: a page that changed
/// densely is given up after its first KiB (a dense page costs 0.7 µs, not
/// the 2.2 µs of a 4 KiB check: at the dense start of an iterative program
/// every changed page is one).
const CHECK_EVERY: usize = 1 << 10;
/// The largest useful patch: half a page (a larger one saves too little to
/// be worth the replica's extra work).
pub const MAX_PATCH: usize = PAGE_SIZE / 2;

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
}

/// The patch that turns `base` into `new` (two whole pages), or `None` if
/// it would be larger than [`MAX_PATCH`] or than half of the part of the
/// page scanned so far (see [`CHECK_EVERY`]): then send the page whole.
pub fn diff(base: &[u8], new: &[u8]) -> Option<Vec<u8>> {
    if base.len() != new.len() || base.len() > PAGE_SIZE || !base.len().is_multiple_of(8) {
        return None;
    }
    let mut out = Vec::new();
    // The run being built: (index in `out` of its header, first word, words).
    let mut run: Option<(usize, usize, usize)> = None;
    for (b, (old, cur)) in base.chunks(BLOCK).zip(new.chunks(BLOCK)).enumerate() {
        let at = b * BLOCK;
        if old != cur {
            for (w, (o, c)) in old.chunks_exact(8).zip(cur.chunks_exact(8)).enumerate() {
                if o == c {
                    continue;
                }
                let word = at / 8 + w;
                match &mut run {
                    Some((header, start, words)) if *start + *words == word => {
                        *words += 1;
                        let n = *words as u16;
                        out[*header + 2..*header + 4].copy_from_slice(&n.to_le_bytes());
                    }
                    _ => {
                        let header = out.len();
                        out.extend_from_slice(&(word as u16).to_le_bytes());
                        out.extend_from_slice(&1u16.to_le_bytes());
                        run = Some((header, word, 1));
                    }
                }
                out.extend_from_slice(c);
            }
        }
        let scanned = at + old.len();
        if out.len() > MAX_PATCH
            || out.len() > base.len() / 2
            || (scanned.is_multiple_of(CHECK_EVERY) && out.len() > scanned / 2)
        {
            return None;
        }
    }
    Some(out)
}

/// Checks `patch` against the wire form; `Ok` means [`apply`] cannot fail.
pub fn check(patch: &[u8]) -> Result<(), PatchError> {
    check_within(patch, WORDS)
}

/// Checks `patch` for a page or chunk of `words` words.
fn check_within(patch: &[u8], words: usize) -> Result<(), PatchError> {
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
/// payloads differ in length, are not whole words, or differ in more than
/// a quarter of their bytes: then the payload travels whole.
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
        if out.len() > new.len() / 4 {
            return None;
        }
    }
    Some(out)
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
    check_within(patch, page.len() / 8)?;
    for r in runs(patch) {
        let (start, words) = r?;
        page[start * 8..start * 8 + words.len()].copy_from_slice(words);
    }
    Ok(())
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
                prop_assert!(patch.len() <= MAX_PATCH);
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
                    let mut covered = vec![false; WORDS];
                    for r in runs(&patch) {
                        let (start, words) = r.unwrap();
                        covered[start..start + words.len() / 8].fill(true);
                    }
                    for (w, (a, b)) in page.chunks_exact(8).zip(base.chunks_exact(8)).enumerate() {
                        prop_assert!(covered[w] || a == b);
                    }
                }
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
                prop_assert!(p.len() <= new.len() / 4);
                prop_assert_eq!(apply_payload(&reference, &p).unwrap(), new);
            }
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
