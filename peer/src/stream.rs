//! Copies with stores that bypass the caches (x86-64's streaming stores),
//! for data that is not read again soon by the thread that writes it: a
//! capture's pages, read next by the writer that makes the frames, and a
//! large message copied out of guest memory, read next by the writer that
//! sends it. A cached copy would only evict the guest's working set, which
//! the guest reads again as soon as it resumes; a streamed one also skips
//! reading the destination's cache lines before writing them. Elsewhere
//! (other targets) these are plain copies.

/// `dst.copy_from_slice(src)`, streamed.
pub(crate) fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "stream::copy: lengths differ");
    // SAFETY: both slices are `src.len()` bytes long, `dst` is borrowed
    // mutably (so it does not overlap `src`) and is valid for writes.
    unsafe { copy_raw(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
}

/// `src.to_vec()`, streamed.
pub(crate) fn to_vec(src: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(src.len());
    // SAFETY: the new vector's buffer holds at least `src.len()` bytes, is
    // its own allocation (no overlap), and `copy_raw` writes every one of
    // them before `set_len` makes them part of the vector.
    unsafe {
        copy_raw(v.as_mut_ptr(), src.as_ptr(), src.len());
        v.set_len(src.len());
    }
    v
}

/// Copies `len` bytes from `s` to `d`.
///
/// # Safety
///
/// `s` must be valid for reads and `d` for writes of `len` bytes, and the
/// two regions must not overlap.
unsafe fn copy_raw(d: *mut u8, s: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86-64. The head (up to the first 16-byte
    // aligned byte of `d`), every 64-byte chunk after it and the tail lie
    // within the `len` bytes the caller vouches for: `head <= len`,
    // `head + 64 chunks <= len`. Loads are unaligned; each streaming store
    // goes to `d + head + 64 k + 16 j`, 16-byte aligned by the choice of
    // `head`. The fence orders the streaming stores before any later store
    // (such as the one handing the buffer to another thread), so whoever
    // gets the buffer sees them.
    unsafe {
        use std::arch::x86_64::*;
        let head = d.align_offset(16).min(len);
        std::ptr::copy_nonoverlapping(s, d, head);
        let chunks = (len - head) / 64;
        for k in 0..chunks {
            for j in 0..4 {
                let at = head + 64 * k + 16 * j;
                let v = _mm_loadu_si128(s.add(at).cast());
                _mm_stream_si128(d.add(at).cast(), v);
            }
        }
        _mm_sfence();
        let done = head + 64 * chunks;
        std::ptr::copy_nonoverlapping(s.add(done), d.add(done), len - done);
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as the caller vouches.
    unsafe {
        std::ptr::copy_nonoverlapping(s, d, len);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    proptest! {
        /// A streamed copy copies exactly, whatever the alignment of either
        /// side and whatever the length, and writes nothing outside the
        /// destination.
        #[test]
        fn copy_copies_exactly(
            len in 0usize..1200,
            src_at in 0usize..32,
            dst_at in 0usize..32,
            seed in any::<u8>(),
        ) {
            let src = bytes(len + src_at, seed);
            let mut dst = vec![0xa5u8; len + dst_at + 16];
            super::copy(&mut dst[dst_at..dst_at + len], &src[src_at..]);
            prop_assert_eq!(&dst[dst_at..dst_at + len], &src[src_at..]);
            prop_assert!(dst[..dst_at].iter().all(|&b| b == 0xa5));
            prop_assert!(dst[dst_at + len..].iter().all(|&b| b == 0xa5));
        }

        /// A streamed `to_vec` is `to_vec`, from any alignment.
        #[test]
        fn to_vec_is_to_vec(
            len in 0usize..(1 << 17),
            src_at in 0usize..32,
            seed in any::<u8>(),
        ) {
            let src = bytes(len + src_at, seed);
            prop_assert_eq!(super::to_vec(&src[src_at..]), src[src_at..].to_vec());
        }
    }
}
